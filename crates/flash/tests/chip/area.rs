//! The header area: a run of good eraseblocks as a rewritable storage whose block rewrites
//! survive power cuts.

use std::sync::Arc;

use sectorcrypt_flash::area::BlockArea;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::Flash;
use sectorcrypt_storage::{FileStorage, Storage};
use sectorcrypt_testkit::{pattern, scratch};

use crate::small;

const BLOCK: usize = 16 * 1024;

#[test]
fn bad_blocks_are_skipped_and_bytes_map_in_order() {
    let dir = scratch("flash-area-map");
    let path = dir.join("nand.img");
    std::fs::write(&path, vec![0; SimNand::image_len(&small()) as usize]).unwrap();
    let chip: Arc<dyn Flash> =
        Arc::new(SimNand::create(FileStorage::open(&path).unwrap(), small(), &[1, 4]).unwrap());
    let area = BlockArea::open(chip.clone(), 0, 3).unwrap();
    assert_eq!(area.blocks(), &[3, 5, 6], "the journal in blocks 0 and 2");
    assert_eq!(area.end(), 7);
    assert_eq!(area.len().unwrap(), 3 * BLOCK as u64);
    let data = pattern(3 * BLOCK, 5);
    area.write_at(&data[100..40_000], 100).unwrap();
    let mut back = vec![0; 39_900];
    area.read_at(&mut back, 100).unwrap();
    assert_eq!(back, data[100..40_000]);
    let mut raw = vec![0; BLOCK];
    chip.read(5, 0, &mut raw).unwrap();
    assert_eq!(
        raw,
        data[BLOCK..2 * BLOCK],
        "logical block 1 is physical block 5"
    );
    assert!(area.write_at(&[0; 2], 3 * BLOCK as u64 - 1).is_err());
    // Nothing is pending after a completed write.
    assert!(!area.recover().unwrap());
}

/// Writes over a filled area are cut at every erase and program; after reopening, every block
/// holds its old or its new contents.
#[test]
fn every_block_is_old_or_new_after_a_power_cut_at_any_operation() {
    let g = small();
    let dir = scratch("flash-area-cuts");
    let template = dir.join("template.img");
    std::fs::write(&template, vec![0; SimNand::image_len(&g) as usize]).unwrap();
    let old = pattern(3 * BLOCK, 1);
    {
        let chip: Arc<dyn Flash> =
            Arc::new(SimNand::create(FileStorage::open(&template).unwrap(), g, &[2]).unwrap());
        let area = BlockArea::open(chip, 0, 3).unwrap();
        area.write_at(&old, 0).unwrap();
    }
    // Two writes: one inside block 0, one across blocks 1 and 2.
    let writes: [(u64, Vec<u8>); 2] = [
        (4096, pattern(512, 2)),
        (BLOCK as u64 + 9000, pattern(BLOCK, 3)),
    ];
    let mut new = old.clone();
    for (at, w) in &writes {
        new[*at as usize..*at as usize + w.len()].copy_from_slice(w);
    }
    let (mut cuts, mut recovered) = (0, 0);
    for n in 1.. {
        let path = dir.join("cut.img");
        std::fs::copy(&template, &path).unwrap();
        let sim = SimNand::open(FileStorage::open(&path).unwrap()).unwrap();
        sim.cut_power_at(Some(n));
        let chip: Arc<dyn Flash> = Arc::new(sim);
        let area = BlockArea::open(chip, 0, 3).unwrap();
        let completed = writes.iter().all(|(at, w)| area.write_at(w, *at).is_ok());
        drop(area);
        let chip: Arc<dyn Flash> =
            Arc::new(SimNand::open(FileStorage::open(&path).unwrap()).unwrap());
        let area = BlockArea::open(chip, 0, 3).unwrap();
        let mut now = vec![0; 3 * BLOCK];
        area.read_at(&mut now, 0).unwrap();
        for b in 0..3 {
            let range = b * BLOCK..(b + 1) * BLOCK;
            assert!(
                now[range.clone()] == old[range.clone()] || now[range.clone()] == new[range],
                "cut at operation {n}: block {b} is neither old nor new"
            );
        }
        if completed {
            assert_eq!(now, new);
            break;
        }
        cuts += 1;
        recovered += usize::from(area.was_recovered());
    }
    // Three blocks rewritten, each with four erases and three programs.
    assert!(cuts >= 20, "{cuts} cut points");
    // Cuts in the record's program or the target's erase or program leave a record to finish.
    assert!(
        recovered >= 6,
        "{recovered} of {cuts} cuts needed the journal"
    );
}
