//! What the tags catch and what they cannot: a sector moved to another place fails its check in
//! every mode (the sector number is authenticated); an old sector with its old tag copied back
//! over its own place, with the journal as it was then (else the journal's newer copy is replayed
//! over it), reads as the old data in every mode (nothing authenticates a sector's age:
//! cryptsetup's release notes say so, and so does the guide).

use std::sync::Arc;

use sectorcrypt_integrity::{format, Error, IntegrityDevice, Mode};
use sectorcrypt_storage::{MemStorage, Storage};
use sectorcrypt_testkit::pattern;

use crate::MODES;

#[test]
fn a_moved_sector_is_refused_and_a_replayed_one_is_not_in_any_mode() {
    for (cipher, integrity, key_len) in MODES {
        for block_size in [512usize, 4096] {
            let key = pattern(key_len, 3);
            let mode = || Mode::new(cipher, integrity, &key, block_size).unwrap();
            let mem = Arc::new(MemStorage::new(vec![0; 4 << 20]));
            let sb = format::plan(4 << 20, 0, mode().tag_size() as u16, block_size, false).unwrap();
            let layout = format::format(&*mem, 0, &sb).unwrap();
            let open = || {
                IntegrityDevice::open(Arc::clone(&mem) as Arc<dyn Storage>, 0, mode(), false)
                    .unwrap()
            };
            let (old, new) = (pattern(block_size, 4), pattern(block_size, 5));
            let dev = open();
            dev.wipe(&mut |_, _| {}).unwrap();
            let mut zeros = vec![1u8; block_size];
            dev.read(12, &mut zeros).unwrap();
            assert!(zeros.iter().all(|&b| b == 0), "block 12, wiped");
            dev.write(5, &old).unwrap();
            dev.write(9, &new).unwrap();
            dev.flush().unwrap();
            drop(dev);
            let tag = layout.tag_size as usize;
            let (data5, tag5) = (layout.data_offset(5), layout.tag_offset(5));
            let journal = 4096..layout.initial_sectors * 512;
            let mut saved = (vec![0u8; block_size], vec![0u8; tag]);
            mem.read_at(&mut saved.0, data5).unwrap();
            mem.read_at(&mut saved.1, tag5).unwrap();
            let old_journal = mem.contents()[journal.start as usize..journal.end as usize].to_vec();
            let dev = open();
            dev.write(5, &new).unwrap();
            dev.flush().unwrap();
            drop(dev);
            // Block 5's old data and tag, back in its place with the journal of then: accepted,
            // as the old data.
            mem.write_at(&saved.0, data5).unwrap();
            mem.write_at(&saved.1, tag5).unwrap();
            mem.write_at(&old_journal, journal.start).unwrap();
            // And over the place of block 12 (never written, so no journal entry puts it back):
            // refused.
            mem.write_at(&saved.0, layout.data_offset(12)).unwrap();
            mem.write_at(&saved.1, layout.tag_offset(12)).unwrap();
            let dev = open();
            let mut buf = vec![0u8; block_size];
            dev.read(5, &mut buf).unwrap();
            assert!(
                buf == old,
                "{integrity} {block_size}: the replayed sector reads old"
            );
            assert!(
                matches!(dev.read(12, &mut buf), Err(Error::Integrity { block: 12 })),
                "{integrity} {block_size}: a sector moved to another place verifies"
            );
        }
    }
}

/// A request's blocks sealed in one call are what sealing each alone gives, each opens at its own
/// sector, and opened in one call a bad block is refused alone, in every mode and block size.
#[test]
fn a_request_sealed_or_opened_at_once_is_each_block_alone() {
    for (cipher, integrity, key_len) in MODES {
        for block_size in [512usize, 4096] {
            let mode = Mode::new(cipher, integrity, &pattern(key_len, 6), block_size).unwrap();
            let (n, ts, is) = (5, mode.tag_size(), mode.random_iv_size());
            let step = (block_size / 512) as u64;
            let plain = pattern(n * block_size, 7);
            let ivs = pattern(n * is, 8);
            let (mut data, mut tuples) = (plain.clone(), vec![0u8; n * ts]);
            mode.seal_blocks(40, &mut data, &mut tuples, &ivs).unwrap();
            for k in 0..n {
                let mut one = plain[k * block_size..(k + 1) * block_size].to_vec();
                let mut tuple = vec![0u8; ts];
                let sector = 40 + k as u64 * step;
                mode.seal(sector, &mut one, &mut tuple, &ivs[k * is..(k + 1) * is])
                    .unwrap();
                let at = |v: &[u8], size: usize| v[k * size..(k + 1) * size].to_vec();
                // Plain64 modes are deterministic; random-IV ones are too, given the IVs.
                assert_eq!(one, at(&data, block_size), "{cipher} {integrity} block {k}");
                assert_eq!(tuple, at(&tuples, ts), "{cipher} {integrity} tuple {k}");
                assert!(mode.open(sector, &mut one, &tuple).is_ok());
                assert_eq!(one, at(&plain, block_size));
            }
            let mut short = vec![0u8; n * ts - 1];
            assert!(mode.seal_blocks(40, &mut data, &mut short, &ivs).is_err());
            // Opened at once: all of them; with block 2's tuple and block 4's data altered,
            // those two are refused and zeroed (2 named first), the others decrypted.
            let mut opened = data.clone();
            assert_eq!(mode.open_blocks(40, &mut opened, &tuples), Ok(()));
            assert_eq!(opened, plain, "{cipher} {integrity} opened at once");
            let mut bad_tuples = tuples.clone();
            bad_tuples[2 * ts] ^= 1;
            let mut opened = data.clone();
            opened[4 * block_size + 7] ^= 1;
            assert_eq!(mode.open_blocks(40, &mut opened, &bad_tuples), Err(2));
            for k in 0..n {
                let got = &opened[k * block_size..(k + 1) * block_size];
                if k == 2 || k == 4 {
                    assert!(
                        got.iter().all(|&b| b == 0),
                        "{cipher} {integrity} block {k}"
                    );
                } else {
                    assert_eq!(got, &plain[k * block_size..(k + 1) * block_size]);
                }
            }
            // The sectors are part of what is authenticated: opened one sector on, all fail.
            let mut shifted = data.clone();
            assert_eq!(mode.open_blocks(40 + step, &mut shifted, &tuples), Err(0));
        }
    }
}

/// A write that encrypts the caller's buffer in place (what the servers use) reads back, before
/// and after reopening, with and without the journal; without it, the caller's buffer is left
/// holding the ciphertext that went to the device.
#[test]
fn a_write_in_place_reads_back_with_and_without_the_journal() {
    let mode = || Mode::new("aes-gcm-random", "aead", &pattern(32, 9), 4096).unwrap();
    for journal in [true, false] {
        let mem = Arc::new(MemStorage::new(vec![0; 4 << 20]));
        let sb = format::plan(4 << 20, 0, mode().tag_size() as u16, 4096, false).unwrap();
        let layout = format::format(&*mem, 0, &sb).unwrap();
        let open = || {
            let storage = Arc::clone(&mem) as Arc<dyn Storage>;
            IntegrityDevice::open_with(storage, 0, mode(), false, journal).unwrap()
        };
        let plain = pattern(3 * 4096, 10);
        let dev = open();
        let mut buf = plain.clone();
        dev.write_in_place(7, &mut buf).unwrap();
        dev.flush().unwrap();
        if !journal {
            let mut stored = vec![0u8; buf.len()];
            mem.read_at(&mut stored, layout.data_offset(7)).unwrap();
            assert_eq!(
                buf, stored,
                "the caller's buffer is what went to the device"
            );
            assert_ne!(buf, plain);
        }
        let mut back = vec![0u8; plain.len()];
        dev.read(7, &mut back).unwrap();
        assert_eq!(back, plain, "journal {journal}");
        drop(dev);
        let mut back = vec![0u8; plain.len()];
        open().read(7, &mut back).unwrap();
        assert_eq!(back, plain, "journal {journal}, reopened");
    }
}
