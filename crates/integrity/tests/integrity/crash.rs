//! Power cuts at every write and sync of the journalled write path (the storage model loses or
//! tears what was not synced): after reopening, which replays the journal, every block is old or
//! new and verifies; a read-only opening, which writes nothing, reads the same.

use std::sync::Arc;

use sectorcrypt_integrity::{format, Error, IntegrityDevice, Mode, Superblock};
use sectorcrypt_storage::{MemStorage, Power, Storage};
use sectorcrypt_testkit::{pattern, sweep};

const OFFSET: u64 = 8192;
const BLOCK: usize = 4096;

/// The modes swept: one without and one with a random IV.
fn modes() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    vec![
        ("aes-xts-plain64", "hmac(sha256)", pattern(96, 1)),
        ("aes-gcm-random", "aead", pattern(32, 2)),
    ]
}

fn mode(m: &(&str, &str, Vec<u8>)) -> Mode {
    Mode::new(m.0, m.1, &m.2, BLOCK).unwrap()
}

/// The device at [`OFFSET`] of `storage`, in mode `m`.
fn open(
    storage: Arc<dyn Storage>,
    m: &(&str, &str, Vec<u8>),
    read_only: bool,
) -> Result<IntegrityDevice, Error> {
    IntegrityDevice::open(storage, OFFSET, mode(m), read_only)
}

/// A formatted, wiped 2 MiB device whose first `old_blocks` blocks hold `old`.
fn image(m: &(&str, &str, Vec<u8>), old: &[u8]) -> Vec<u8> {
    let mem = Arc::new(MemStorage::new(vec![0; 2 << 20]));
    let sb = format::plan(2 << 20, OFFSET, mode(m).tag_size() as u16, BLOCK, false).unwrap();
    format::format(&*mem, OFFSET, &sb).unwrap();
    let dev = open(Arc::clone(&mem) as Arc<dyn Storage>, m, false).unwrap();
    dev.wipe(&mut |_, _| {}).unwrap();
    dev.write(0, old).unwrap();
    drop(dev);
    mem.contents()
}

/// Every block of `dev`, or why one does not verify.
fn contents(dev: &IntegrityDevice) -> Result<Vec<u8>, String> {
    let mut all = vec![0u8; dev.size() as usize];
    dev.read(0, &mut all).map_err(|e| e.to_string())?;
    Ok(all)
}

#[test]
fn every_block_is_old_or_new_after_a_cut_anywhere_in_journalled_writes() {
    for m in modes() {
        let blocks = (2u64 << 20) / BLOCK as u64; // more than the device holds: clamped below
        let probe = image(&m, &[]);
        let size = open(
            Arc::new(MemStorage::new(probe)) as Arc<dyn Storage>,
            &m,
            true,
        )
        .unwrap()
        .size() as usize;
        assert!(size < blocks as usize * BLOCK);
        let old = pattern(size, 10);
        let start = image(&m, &old);
        // Two requests: 40 blocks (two journal sections here: the ring wraps and its sequence
        // changes), then 3 blocks over part of them.
        let first = pattern(40 * BLOCK, 11);
        let second = pattern(3 * BLOCK, 12);
        let mut new = old.clone();
        new[5 * BLOCK..45 * BLOCK].copy_from_slice(&first);
        new[20 * BLOCK..23 * BLOCK].copy_from_slice(&second);
        // Where the first flush returns: a survivor cut after it keeps the first request whole.
        let first_flushed = {
            let power = Power::new(None);
            let dev = Arc::new(power.device(start.clone())) as Arc<dyn Storage>;
            let d = open(dev, &m, false).unwrap();
            d.write(5, &first).unwrap();
            d.flush().unwrap();
            power.operations()
        };
        let report = sweep::sweep(
            &[start],
            |devs| {
                let dev = open(Arc::clone(&devs[0]) as Arc<dyn Storage>, &m, false)?;
                dev.write(5, &first)?;
                dev.flush()?;
                dev.write(20, &second)?;
                dev.flush()
            },
            |survivor| {
                let device = || Arc::clone(&survivor.devices[0]) as Arc<dyn Storage>;
                let read_only = open(device(), &m, true).map_err(|e| e.to_string())?;
                let seen = contents(&read_only)?;
                let writable = open(device(), &m, false).map_err(|e| e.to_string())?;
                let got = contents(&writable)?;
                if got != seen {
                    return Err("the read-only opening reads other than the replayed one".into());
                }
                let flushed = survivor.cut >= first_flushed;
                for b in 0..size / BLOCK {
                    let r = b * BLOCK..(b + 1) * BLOCK;
                    let block = &got[r.clone()];
                    let first_data = (5..45)
                        .contains(&b)
                        .then(|| &first[(b - 5) * BLOCK..(b - 4) * BLOCK]);
                    let ok = if survivor.complete {
                        block == &new[r.clone()]
                    } else if (20..23).contains(&b) {
                        block == &second[(b - 20) * BLOCK..(b - 19) * BLOCK]
                            || Some(block) == first_data
                            || (!flushed && block == &old[r.clone()])
                    } else if let Some(first_data) = first_data {
                        block == first_data || (!flushed && block == &old[r.clone()])
                    } else {
                        block == &old[r.clone()]
                    };
                    if !ok {
                        return Err(format!(
                            "block {b} is none of what was written (cut after {} operations, the \
                             first flush after {first_flushed})",
                            survivor.cut
                        ));
                    }
                }
                Ok(())
            },
        );
        report.assert_no_loss(&format!("{} {}", m.0, m.1));
        assert!(report.operations > 10, "{} operations", report.operations);
    }
}

/// A formatted, wiped 4 MiB device with a journal of four sections (the default would have
/// one), every block holding `old`.
fn four_section_image(m: &(&str, &str, Vec<u8>)) -> (Vec<u8>, usize) {
    let mem = Arc::new(MemStorage::new(vec![0; 4 << 20]));
    let mut sb: Superblock =
        format::plan(4 << 20, OFFSET, mode(m).tag_size() as u16, BLOCK, false).unwrap();
    sb.journal_sections = 4;
    sb.provided_data_sectors = 3 << 11; // 3 MiB: the layout still fits
    format::format(&*mem, OFFSET, &sb).unwrap();
    let dev = open(Arc::clone(&mem) as Arc<dyn Storage>, m, false).unwrap();
    assert_eq!(dev.layout().journal_sections, 4);
    dev.wipe(&mut |_, _| {}).unwrap();
    let size = dev.size() as usize;
    dev.write(0, &pattern(size, 20)).unwrap();
    drop(dev);
    (mem.contents(), size)
}

/// A commit of several sections that reaches the ring's end goes on at its start: a journal of
/// twelve sections, commits of three, the ring moved on by one by a flush, so that the fourth
/// commit takes sections 10, 11 and 0 (written in two pieces). Every block reads back, before
/// and after reopening, and after a read-only opening that overlays what the journal holds.
#[test]
fn a_commit_across_the_rings_end_is_written_at_both_ends() {
    let m = &modes()[1];
    let mem = Arc::new(MemStorage::new(vec![0; 8 << 20]));
    let mut sb: Superblock =
        format::plan(8 << 20, OFFSET, mode(m).tag_size() as u16, BLOCK, false).unwrap();
    sb.journal_sections = 12;
    sb.provided_data_sectors = 5 << 11;
    format::format(&*mem, OFFSET, &sb).unwrap();
    let dev = open(Arc::clone(&mem) as Arc<dyn Storage>, m, false).unwrap();
    assert_eq!(dev.layout().journal_sections, 12);
    dev.wipe(&mut |_, _| {}).unwrap();
    let per_commit = 3 * dev.layout().journal_section_entries as usize;
    let size = dev.size() as usize;
    let mut want = vec![0u8; size];
    let mut put = |dev: &IntegrityDevice, first: usize, data: Vec<u8>| {
        dev.write(first as u64, &data).unwrap();
        want[first * BLOCK..first * BLOCK + data.len()].copy_from_slice(&data);
    };
    put(&dev, 0, pattern(BLOCK, 40));
    dev.flush().unwrap();
    // Four full commits from section 1, and part of a fifth.
    let blocks = 4 * per_commit + 5;
    assert!(blocks < size / BLOCK);
    put(&dev, 1, pattern(blocks * BLOCK, 41));
    dev.flush().unwrap();
    assert!(contents(&dev).unwrap() == want);
    drop(dev);
    let read_only = open(Arc::clone(&mem) as Arc<dyn Storage>, m, true).unwrap();
    assert!(read_only.journalled_blocks() > 0);
    assert!(
        contents(&read_only).unwrap() == want,
        "through the journal's overlay"
    );
    drop(read_only);
    let again = open(mem as Arc<dyn Storage>, m, false).unwrap();
    assert!(contents(&again).unwrap() == want, "after the replay");
}

/// Commits follow each other without a flush between (each takes a quarter of the journal and
/// syncs once: the sync that makes it durable also makes earlier commits' copies in place
/// durable, before the ring comes back to their sections). After a cut anywhere, every block is
/// old or one of the versions written to it, and after the flush, the newest.
#[test]
fn every_block_is_one_of_its_versions_after_a_cut_in_commits_without_flushes() {
    for m in modes() {
        let (start, size) = four_section_image(&m);
        let blocks = size / BLOCK;
        let old = pattern(size, 20);
        // Requests of 70 blocks, each overlapping the last: about ten commits of one section
        // (32 or 40 blocks here), the ring wrapping twice.
        let requests: Vec<(usize, Vec<u8>)> = (0..5)
            .map(|k| (k * 50 % (blocks - 70), pattern(70 * BLOCK, 30 + k as u64)))
            .collect();
        let mut versions: Vec<Vec<&[u8]>> = (0..blocks)
            .map(|b| vec![&old[b * BLOCK..(b + 1) * BLOCK]])
            .collect();
        for (first, data) in &requests {
            for (i, block) in data.chunks(BLOCK).enumerate() {
                versions[first + i].push(block);
            }
        }
        let report = sweep::sweep(
            &[start],
            |devs| {
                let dev = open(Arc::clone(&devs[0]) as Arc<dyn Storage>, &m, false)?;
                for (first, data) in &requests {
                    dev.write(*first as u64, data)?;
                }
                dev.flush()
            },
            |survivor| {
                let device = || Arc::clone(&survivor.devices[0]) as Arc<dyn Storage>;
                let got = contents(&open(device(), &m, false).map_err(|e| e.to_string())?)?;
                for (b, versions) in versions.iter().enumerate() {
                    let block = &got[b * BLOCK..(b + 1) * BLOCK];
                    let ok = if survivor.complete {
                        Some(&block) == versions.last()
                    } else {
                        versions.contains(&block)
                    };
                    if !ok {
                        return Err(format!(
                            "block {b} is none of its versions (cut after {} operations)",
                            survivor.cut
                        ));
                    }
                }
                Ok(())
            },
        );
        report.assert_no_loss(&format!("{} {}", m.0, m.1));
        assert!(report.operations > 20, "{} operations", report.operations);
    }
}
