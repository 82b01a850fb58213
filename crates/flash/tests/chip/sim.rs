//! The simulated chip keeps NAND's rules, its ground truth and its faults.

use sectorcrypt_flash::sim::{Faults, SimNand};
use sectorcrypt_flash::{Error, Flash, Geometry};
use sectorcrypt_storage::{FileStorage, MemStorage};
use sectorcrypt_testkit::{pattern, scratch};

use crate::small;

fn chip(g: Geometry, bad: &[u32]) -> SimNand {
    let mem = MemStorage::new(vec![0; SimNand::image_len(&g) as usize]);
    SimNand::create(mem, g, bad).unwrap()
}

fn read(f: &dyn Flash, peb: u32, offset: u32, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    f.read(peb, offset, &mut buf).unwrap();
    buf
}

#[test]
fn a_new_chip_is_erased_and_programs_only_clear_bits() {
    let f = chip(small(), &[]);
    assert!(read(&f, 3, 0, 16 * 1024).iter().all(|&b| b == 0xFF));
    f.program(3, 0, &[0x0F; 512]).unwrap();
    f.program(3, 0, &[0xF3; 512]).unwrap();
    assert_eq!(read(&f, 3, 0, 512), vec![0x03; 512]);
    assert_eq!(read(&f, 3, 512, 512), vec![0xFF; 512]);
    assert_eq!(f.program_counts(3).unwrap()[0], 2);
    f.erase(3).unwrap();
    assert!(read(&f, 3, 0, 2048).iter().all(|&b| b == 0xFF));
    assert_eq!(f.erase_counts()[3], 1);
    assert_eq!(f.program_counts(3).unwrap()[0], 0);
}

#[test]
fn nand_rules_are_enforced_and_leave_the_chip_unchanged() {
    let g = Geometry {
        sub_page_size: 2048,
        nop: 1,
        ..small()
    };
    let f = chip(g, &[]);
    let data = pattern(4096, 1);
    f.program(0, 2048, &data[..2048]).unwrap();
    // NOP 1: a second program of the page is refused.
    assert!(matches!(
        f.program(0, 2048, &data[..2048]),
        Err(Error::ProgramRule(_))
    ));
    // Ascending order: page 0 after page 1 is refused.
    assert!(matches!(
        f.program(0, 0, &data[..2048]),
        Err(Error::ProgramRule(_))
    ));
    // Sub-page alignment.
    assert!(matches!(
        f.program(0, 4096 + 512, &data[..512]),
        Err(Error::Unaligned(_))
    ));
    assert!(matches!(
        f.program(16, 0, &data[..2048]),
        Err(Error::OutOfRange(_))
    ));
    assert_eq!(read(&f, 0, 2048, 2048), data[..2048]);
    assert!(read(&f, 0, 0, 2048).iter().all(|&b| b == 0xFF));
    assert_eq!(f.operations(), 1);
}

#[test]
fn sub_pages_count_against_nop() {
    let f = chip(small(), &[]);
    for i in 0..4 {
        f.program(1, i * 512, &[i as u8; 512]).unwrap();
    }
    assert!(matches!(
        f.program(1, 0, &[0; 512]),
        Err(Error::ProgramRule(_))
    ));
    // The next page is still free.
    f.program(1, 2048, &[9; 2048]).unwrap();
    assert_eq!(read(&f, 1, 1024, 512), vec![2; 512]);
}

#[test]
fn the_image_persists_across_opens() {
    let dir = scratch("flash-sim-persists");
    let path = dir.join("nand.img");
    let g = small();
    std::fs::write(&path, vec![0; SimNand::image_len(&g) as usize]).unwrap();
    let data = pattern(8192, 7);
    {
        let f = SimNand::create(FileStorage::open(&path).unwrap(), g, &[5]).unwrap();
        f.erase(2).unwrap();
        f.erase(2).unwrap();
        f.program(2, 0, &data).unwrap();
        f.mark_bad(7).unwrap();
        f.sync().unwrap();
    }
    let f = SimNand::open(FileStorage::open(&path).unwrap()).unwrap();
    assert_eq!(f.geometry(), g);
    assert_eq!(read(&f, 2, 0, 8192), data);
    assert_eq!(f.erase_counts()[2], 2);
    assert_eq!(&f.program_counts(2).unwrap()[..5], &[1, 1, 1, 1, 0]);
    assert!(f.is_bad(5).unwrap() && f.is_bad(7).unwrap() && !f.is_bad(6).unwrap());
    // Linux's bad-block marker: the first spare byte of the first page.
    let mut oob = [0xAA; 64];
    f.read_oob(5, 0, &mut oob).unwrap();
    assert_eq!(oob[0], 0);
    f.read_oob(6, 0, &mut oob).unwrap();
    assert!(oob.iter().all(|&b| b == 0xFF));
    assert!(matches!(f.erase(5), Err(Error::BadBlock(5))));
    assert!(matches!(
        f.program(7, 0, &data[..512]),
        Err(Error::BadBlock(7))
    ));
    std::fs::write(dir.join("junk"), vec![1; 8192]).unwrap();
    let junk = SimNand::open(FileStorage::open(&dir.join("junk")).unwrap());
    assert!(matches!(junk, Err(Error::Format(_))));
}

#[test]
fn weak_blocks_weak_pages_and_grave_pages_fail_as_nandsim_makes_them() {
    let f = chip(small(), &[]);
    f.set_faults(Faults {
        weak_blocks: vec![(4, 2)],
        weak_pages: vec![(6, 1, 2)],
        grave_pages: vec![(8, 0, 1)],
        ..Faults::default()
    });
    f.erase(4).unwrap();
    assert!(matches!(f.erase(4), Err(Error::EraseFailed(4))));
    f.program(6, 2048, &[0; 512]).unwrap();
    assert!(matches!(
        f.program(6, 2560, &[0; 512]),
        Err(Error::ProgramFailed { peb: 6, page: 1 })
    ));
    f.program(8, 0, &[0x11; 2048]).unwrap();
    assert_eq!(read(&f, 8, 0, 2048), vec![0x11; 2048]);
    let mut buf = vec![0; 2048];
    assert!(matches!(
        f.read(8, 0, &mut buf),
        Err(Error::Uncorrectable { peb: 8, page: 0 })
    ));
    assert_ne!(buf, vec![0x11; 2048]);
}

#[test]
fn bit_flips_are_corrected_or_reported() {
    let f = chip(small(), &[]);
    f.program(0, 0, &[0x5A; 2048]).unwrap();
    f.set_faults(Faults {
        bitflips: 4,
        ecc_strength: 2,
        seed: 11,
        ..Faults::default()
    });
    let (mut corrected, mut failed) = (0, 0);
    for _ in 0..20_000 {
        let mut buf = vec![0; 2048];
        match f.read(0, 0, &mut buf) {
            Ok(s) if s.corrected > 0 => {
                assert_eq!(buf, vec![0x5A; 2048], "corrected data is right");
                corrected += 1;
            }
            Ok(_) => assert_eq!(buf, vec![0x5A; 2048]),
            Err(Error::Uncorrectable { .. }) => {
                assert_ne!(buf, vec![0x5A; 2048], "uncorrectable data is damaged");
                failed += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // About 1 read in 1024 flips 1 to 4 bits: half corrected, half not.
    assert!((3..=40).contains(&corrected), "{corrected}");
    assert!((3..=40).contains(&failed), "{failed}");
}

#[test]
fn a_power_cut_damages_only_the_operation_in_flight() {
    let g = small();
    let data = pattern(4096, 3);
    let dir = scratch("flash-sim-power-cut");
    for n in 1..=3u64 {
        let path = dir.join(format!("cut{n}.img"));
        std::fs::write(&path, vec![0; SimNand::image_len(&g) as usize]).unwrap();
        let f = SimNand::create(FileStorage::open(&path).unwrap(), g, &[]).unwrap();
        f.program(0, 0, &data).unwrap();
        f.cut_power_at(Some(n));
        // Operation 1: a program of block 1; 2: an erase of block 0; 3: a program of block 2.
        let r1 = f.program(1, 0, &data);
        let r2 = f.erase(0);
        let r3 = f.program(2, 0, &data);
        let results = [r1.is_ok(), r2.is_ok(), r3.is_ok()];
        assert_eq!(
            results.iter().filter(|ok| **ok).count() as u64,
            n - 1,
            "operations before the cut succeed, the rest fail"
        );
        assert!(f.is_off());
        assert!(matches!(f.read(3, 0, &mut [0; 16]), Err(Error::PowerCut)));
        let after = SimNand::open(FileStorage::open(&path).unwrap()).unwrap();
        let block = |peb| read(&after, peb, 0, 4096);
        match n {
            1 => {
                assert_eq!(block(0), data, "untouched");
                assert_ne!(block(1), data, "the cut program did not complete");
                assert!(after.program_counts(1).unwrap()[0] > 0);
            }
            2 => {
                assert_eq!(block(1), data);
                assert_eq!(
                    after.erase_counts()[0],
                    1,
                    "a cut erase still wore the block"
                );
                assert!(
                    after.program(0, 0, &data[..512]).is_err(),
                    "a half-erased block must be erased again before use"
                );
            }
            _ => {
                assert!(block(0).iter().all(|&b| b == 0xFF));
                assert_ne!(block(2), data);
            }
        }
    }
}
