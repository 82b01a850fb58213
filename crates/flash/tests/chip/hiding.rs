//! The hiding policies: free space erased while attached and filler at rest, one journalled
//! rewrite per block per fill, and power cuts anywhere in a rewrite or a fill that keep every
//! acknowledged unit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sectorcrypt_flash::crypt::{CryptFlash, Policy};
use sectorcrypt_flash::sim::{MemChip, SimNand};
use sectorcrypt_flash::{Error, Flash, Geometry, ReadStatus};
use sectorcrypt_testkit::{openssl, pattern, scratch};

use crate::crypt::{chip, layer, layer_on, raw_chip, read, JOURNAL_BLOCKS};
use crate::small;

const HIDING: [Policy; 2] = [Policy::AtRest, Policy::Synced];
const SPEC: &str = "aes-xts-plain64";

/// What UBI leaves in a block: an EC header in sub-page 0, and in `used` blocks a VID header in
/// sub-page 1 and `pages` pages of data from page 1 on.
fn ubi_like(f: &dyn Flash, peb: u32, used: bool, pages: u32, seed: u64) {
    let mut ec = vec![0xFF; 512];
    ec[..4].copy_from_slice(b"UBI#");
    f.erase(peb).unwrap();
    f.program(peb, 0, &ec).unwrap();
    if used {
        let mut vid = vec![0xFF; 512];
        vid[..4].copy_from_slice(b"UBI!");
        f.program(peb, 512, &vid).unwrap();
        for p in 1..=pages {
            f.program(peb, p * 2048, &pattern(2048, seed + u64::from(p)))
                .unwrap();
        }
    }
}

/// Chi-square of `bytes`' histogram against uniform (255 degrees of freedom: mean 255, standard
/// deviation 22.6).
fn chi_square(bytes: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let expected = bytes.len() as f64 / 256.0;
    counts
        .iter()
        .map(|&n| (n as f64 - expected).powi(2) / expected)
        .sum()
}

fn longest_ff(bytes: &[u8]) -> usize {
    bytes.split(|&b| b != 0xFF).map(<[u8]>::len).max().unwrap()
}

#[test]
fn at_rest_the_chip_shows_no_free_space_and_free_blocks_look_like_used_ones() {
    let key = pattern(64, 11);
    let g = Geometry {
        peb_count: 64 + JOURNAL_BLOCKS,
        ..small()
    };
    for policy in HIDING {
        let c = chip(g);
        let f = layer(&c, SPEC, &key, policy).unwrap();
        // Half the blocks used (partly written), half free (an EC header only), as UBI leaves
        // them; a rewrite or two so that the journal holds records.
        for peb in 0..64 {
            ubi_like(&f, peb, peb % 2 == 0, peb % 7, 100 * u64::from(peb));
        }
        f.hide_free_space().unwrap();
        f.program(2, 2048 * 4, &pattern(2048, 9)).unwrap();
        f.program(4, 2048 * 5, &pattern(2048, 10)).unwrap();
        assert_eq!(f.stats().rewrites, 2, "{policy:?}");
        // While attached, free space may show; detached (filled), none may.
        f.hide_free_space().unwrap();
        let raw = raw_chip(&c);
        assert!(
            longest_ff(&raw) < 8,
            "{policy:?}: a run of {} bytes of 0xFF on the detached chip",
            longest_ff(&raw)
        );
        for needle in [&b"UBI#"[..], b"UBI!"] {
            assert!(
                !raw.windows(4).any(|w| w == needle),
                "{needle:?} on the chip"
            );
        }
        // Free and used blocks: both uniform, and alike.
        let block = g.peb_size as usize;
        let (mut free, mut used) = (Vec::new(), Vec::new());
        for peb in 0..64 {
            let bytes = &raw[peb * block..(peb + 1) * block];
            if peb % 2 == 0 { &mut used } else { &mut free }.extend_from_slice(bytes);
        }
        let (cf, cu) = (chi_square(&free), chi_square(&used));
        assert!(
            cf < 400.0 && cu < 400.0,
            "{policy:?}: chi-square {cf:.1} / {cu:.1}"
        );
        let mean = |b: &[u8]| b.iter().map(|&x| f64::from(x)).sum::<f64>() / b.len() as f64;
        assert!(
            (mean(&free) - mean(&used)).abs() < 1.0,
            "{policy:?}: mean byte {} free vs {} used",
            mean(&free),
            mean(&used)
        );
        // Above the layer nothing changed.
        assert_eq!(&read(&f, 1, 0, 4), b"UBI#");
        assert_eq!(read(&f, 1, 512, 16384 - 512), vec![0xFF; 16384 - 512]);
        assert_eq!(read(&f, 2, 2048 * 4, 2048), pattern(2048, 9));
        assert_eq!(read(&f, 2, 2048 * 2, 2048), pattern(2048, 202));
        assert_eq!(read(&f, 4, 2048 * 6, 2048), vec![0xFF; 2048]);
    }
}

#[test]
fn a_fill_costs_one_rewrite_per_block_written_after_it_not_one_per_write() {
    let key = pattern(64, 12);
    for policy in HIDING {
        let c = chip(small());
        let f = layer(&c, SPEC, &key, policy).unwrap();
        ubi_like(&f, 3, true, 1, 0);
        let erases = c.erase_counts()[3];
        // Appends into erased space: programs only.
        f.program(3, 2 * 2048, &pattern(2048, 1)).unwrap();
        assert_eq!((c.erase_counts()[3], f.stats().rewrites), (erases, 0));
        f.hide_free_space().unwrap();
        // The first append after the fill rewrites the block and leaves its tail erased; the
        // next ones are programs again.
        for page in 3..8 {
            f.program(3, page * 2048, &pattern(2048, u64::from(page)))
                .unwrap();
        }
        assert_eq!(c.erase_counts()[3], erases + 1, "{policy:?}");
        assert_eq!(f.stats().rewrites, 1, "{policy:?}");
        assert!(f.stats().journal_bytes > 0);
        for page in 1..8 {
            let want = match page {
                1 => pattern(2048, 1),
                2 => pattern(2048, 1),
                p => pattern(2048, u64::from(p)),
            };
            assert_eq!(
                read(&f, 3, page * 2048, 2048),
                want,
                "{policy:?} page {page}"
            );
        }
        // Only the synced policy fills at a sync.
        f.erase(5).unwrap();
        f.sync().unwrap();
        let erased = read(c.as_ref(), 5, 0, 16384) == vec![0xFF; 16384];
        assert_eq!(erased, policy == Policy::AtRest, "{policy:?}");
    }
}

#[test]
fn the_journal_and_filler_decrypt_with_openssl_and_small_page_chips_work() {
    // 256-byte sub-pages (small-page NAND) are units too.
    let g = Geometry {
        peb_size: 16 * 1024,
        page_size: 512,
        sub_page_size: 256,
        oob_size: 16,
        peb_count: 16,
        nop: 4,
    };
    let key = pattern(64, 13);
    let c = chip(g);
    let f = layer(&c, SPEC, &key, Policy::AtRest).unwrap();
    f.erase(2).unwrap();
    let data = pattern(1024, 14);
    f.program(2, 512, &data).unwrap();
    f.hide_free_space().unwrap();
    let dir = scratch("flash-hiding-openssl");
    let file = dir.join("block2.bin");
    std::fs::write(&file, read(c.as_ref(), 2, 0, 16384)).unwrap();
    let plain = openssl::decrypt_units(&file, SPEC, &key, 256, f.unit_number(2, 0));
    let mut want = vec![0xFF; 16384];
    want[512..1536].copy_from_slice(&data);
    assert_eq!(plain, want, "data and filler under the documented IV rule");
    assert_eq!(read(&f, 2, 512, 1024), data);
}

/// A chip opened read-only (as `flash read` opens one): changes fail, and are counted.
struct ReadOnly {
    chip: Arc<SimNand>,
    changes: AtomicU64,
}

impl ReadOnly {
    fn refuse(&self) -> Result<(), Error> {
        self.changes.fetch_add(1, Ordering::Relaxed);
        Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::ReadOnlyFilesystem,
            "opened read-only",
        )))
    }
}

impl Flash for ReadOnly {
    fn geometry(&self) -> Geometry {
        self.chip.geometry()
    }
    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, Error> {
        self.chip.read(peb, offset, buf)
    }
    fn program(&self, _: u32, _: u32, _: &[u8]) -> Result<(), Error> {
        self.refuse()
    }
    fn erase(&self, _: u32) -> Result<(), Error> {
        self.refuse()
    }
    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), Error> {
        self.chip.read_oob(peb, page, buf)
    }
    fn is_bad(&self, peb: u32) -> Result<bool, Error> {
        self.chip.is_bad(peb)
    }
    fn mark_bad(&self, _: u32) -> Result<(), Error> {
        self.refuse()
    }
    fn sync(&self) -> Result<(), Error> {
        Ok(())
    }
    fn is_read_only(&self) -> bool {
        true
    }
}

/// Every data block of `f`, decrypted.
fn contents(f: &CryptFlash) -> Vec<Vec<u8>> {
    let g = f.geometry();
    (0..g.peb_count)
        .map(|peb| read(f, peb, 0, g.peb_size as usize))
        .collect()
}

/// Prepare a chip with `prepare`, then for n = 1, 2, ... cut the power at the n-th chip
/// operation of `op` on a copy, reopen the layer and `verify` it (told whether `op` had
/// returned), until `op` completes. Returns the cut points. Before each reopening, the layer is
/// opened read-only: it must write nothing and read what the writable opening reads once it has
/// repaired what the cut left.
fn sweep(
    policy: Policy,
    prepare: impl Fn(&CryptFlash),
    op: impl Fn(&CryptFlash) -> Result<(), sectorcrypt_flash::Error>,
    verify: impl Fn(&CryptFlash, u64),
) -> u64 {
    let key = pattern(64, 15);
    let (base, sim) = MemChip::create(small(), &[]).unwrap();
    prepare(&layer(&sim, SPEC, &key, policy).unwrap());
    drop(sim);
    for n in 1.. {
        let run = base.copy();
        let sim = run.power_on().unwrap();
        let f = layer(&sim, SPEC, &key, policy).unwrap();
        sim.cut_power_at(Some(sim.operations() + n));
        let result = op(&f);
        if !sim.is_off() {
            result.unwrap();
            return n - 1;
        }
        drop(f);
        let read_only = Arc::new(ReadOnly {
            chip: run.power_on().unwrap(),
            changes: AtomicU64::new(0),
        });
        let seen = layer_on(Arc::clone(&read_only) as Arc<dyn Flash>, SPEC, &key, policy)
            .map(|f| contents(&f))
            .unwrap_or_else(|e| panic!("cut {n}: the layer does not open read-only: {e}"));
        assert_eq!(read_only.changes.load(Ordering::Relaxed), 0, "cut {n}");
        let f = layer(&run.power_on().unwrap(), SPEC, &key, policy)
            .unwrap_or_else(|e| panic!("cut {n}: the layer does not reopen: {e}"));
        assert!(
            seen == contents(&f),
            "cut {n}: read-only, the layer reads other than after its repair"
        );
        verify(&f, n);
    }
    unreachable!()
}

#[test]
fn a_cut_anywhere_in_a_rewrite_or_a_fill_keeps_every_acknowledged_unit() {
    let old = |p: u32| pattern(2048, 40 + u64::from(p));
    let new = pattern(2048, 99);
    let check_old = |f: &CryptFlash, n: u64| {
        assert_eq!(&read(f, 3, 0, 4), b"UBI#", "cut {n}: EC header");
        assert_eq!(&read(f, 3, 512, 4), b"UBI!", "cut {n}: VID header");
        for p in 1..=3 {
            assert_eq!(read(f, 3, p * 2048, 2048), old(p), "cut {n}: page {p}");
        }
    };
    for policy in HIDING {
        let prepare = |f: &CryptFlash| {
            ubi_like(f, 3, true, 0, 0);
            for p in 1..=3 {
                f.program(3, p * 2048, &old(p)).unwrap();
            }
            f.hide_free_space().unwrap();
        };
        // The append into the filled tail: a journalled rewrite. After any cut the block holds
        // its old units, and the new page is there or reads erased (and can be programmed).
        let rewrite = sweep(
            policy,
            prepare,
            |f| f.program(3, 4 * 2048, &new),
            |f, n| {
                check_old(f, n);
                let got = read(f, 3, 4 * 2048, 2048);
                if got != new {
                    assert_eq!(got, vec![0xFF; 2048], "cut {n}: neither old nor new");
                    f.program(3, 4 * 2048, &new).unwrap();
                    assert_eq!(read(f, 3, 4 * 2048, 2048), new, "cut {n}: program after");
                }
                check_old(f, n);
            },
        );
        // A fill cut anywhere: nothing lost, and the next fill finishes it.
        let fill = sweep(
            policy,
            |f| {
                prepare(f);
                f.program(3, 4 * 2048, &new).unwrap();
                f.erase(6).unwrap();
            },
            |f| f.hide_free_space().map(drop),
            |f, n| {
                // Free space reads erased after any cut: a unit the cut tore is found and its
                // block rewritten without it when the layer opens.
                let free = |f: &CryptFlash| {
                    read(f, 3, 5 * 2048, 3 * 2048) == vec![0xFF; 3 * 2048]
                        && read(f, 6, 0, 16384) == vec![0xFF; 16384]
                };
                check_old(f, n);
                assert_eq!(read(f, 3, 4 * 2048, 2048), new, "cut {n}");
                assert!(free(f), "cut {n}: free space reads as garbage");
                f.hide_free_space().unwrap();
                check_old(f, n);
                assert!(free(f), "cut {n}: after the next fill");
                f.program(3, 5 * 2048, &new).unwrap();
                assert_eq!(read(f, 3, 5 * 2048, 2048), new, "cut {n}: a program after");
            },
        );
        // After a finished rewrite the block is erased and written anew: a cut in the new
        // program (the last operation) must not bring the old data back over the erased block
        // when the layer reopens (the journal's record of that block was voided).
        let seen = std::cell::RefCell::new(Vec::new());
        let reuse = sweep(
            policy,
            |f| {
                prepare(f);
                f.program(3, 4 * 2048, &new).unwrap();
            },
            |f| {
                f.erase(3)?;
                f.program(3, 0, &pattern(512, 7))
            },
            |f, n| {
                seen.borrow_mut()
                    .push((n, read(f, 3, 2048, 2048) == old(1)))
            },
        );
        let last = seen.borrow().last().copied();
        assert_eq!(last, Some((reuse, false)), "{policy:?}: old data came back");
        assert!(
            rewrite >= 3 && fill >= 2 && reuse >= 2,
            "{policy:?}: {rewrite}, {fill} and {reuse} cut points"
        );
    }
}
