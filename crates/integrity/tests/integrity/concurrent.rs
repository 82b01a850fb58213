//! Writers and readers on one journalled device at once: commits run while other writes queue
//! and reads go on, and no read ever sees a block that fails its tag or is not one of the
//! versions written to it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use sectorcrypt_integrity::{format, IntegrityDevice, Mode};
use sectorcrypt_storage::{MemStorage, Storage};
use sectorcrypt_testkit::pattern;

const BLOCK: usize = 4096;
const WRITERS: usize = 4;
const VERSIONS: u64 = 6;

/// Version `v` of block `b` (version 0 is what the device holds at the start).
fn version(b: usize, v: u64) -> Vec<u8> {
    pattern(BLOCK, (b as u64) << 8 | v)
}

#[test]
fn reads_see_whole_versions_while_writers_commit() {
    let mode = || Mode::new("aes-gcm-random", "aead", &pattern(32, 3), BLOCK).unwrap();
    // 24 MiB: a journal of one section at the default size, so commits come often and each
    // overwrites the last one's section.
    let mem = Arc::new(MemStorage::new(vec![0; 24 << 20]));
    let sb = format::plan(24 << 20, 0, mode().tag_size() as u16, BLOCK, false).unwrap();
    format::format(&*mem, 0, &sb).unwrap();
    let dev = Arc::new(
        IntegrityDevice::open(Arc::clone(&mem) as Arc<dyn Storage>, 0, mode(), false).unwrap(),
    );
    let blocks = dev.size() as usize / BLOCK;
    let start: Vec<u8> = (0..blocks).flat_map(|b| version(b, 0)).collect();
    dev.write(0, &start).unwrap();
    dev.flush().unwrap();

    let per_writer = blocks / WRITERS;
    let written = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let dev = Arc::clone(&dev);
            thread::spawn(move || {
                // Requests of 16 blocks over this writer's share, version after version.
                for v in 1..=VERSIONS {
                    for first in (w * per_writer..(w + 1) * per_writer).step_by(16) {
                        let n = 16.min((w + 1) * per_writer - first);
                        let data: Vec<u8> =
                            (first..first + n).flat_map(|b| version(b, v)).collect();
                        dev.write(first as u64, &data).unwrap();
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let dev = Arc::clone(&dev);
            let written = Arc::clone(&written);
            thread::spawn(move || {
                let mut buf = vec![0u8; 8 * BLOCK];
                // Until the writers are done, and at least 20 passes.
                let mut pass = 0;
                while pass < 20 || !written.load(Ordering::Acquire) {
                    pass += 1;
                    let first = (pass * 56 + r * 28) % (blocks - 8);
                    dev.read(first as u64, &mut buf).unwrap();
                    for (i, block) in buf.chunks(BLOCK).enumerate() {
                        let b = first + i;
                        assert!(
                            (0..=VERSIONS).any(|v| block == version(b, v)),
                            "block {b} read as none of its versions"
                        );
                    }
                }
            })
        })
        .collect();
    for t in writers {
        t.join().unwrap();
    }
    written.store(true, Ordering::Release);
    for t in readers {
        t.join().unwrap();
    }
    dev.flush().unwrap();
    drop(dev);

    // What the storage holds after the last flush: every written block at its last version.
    let again = IntegrityDevice::open(mem as Arc<dyn Storage>, 0, mode(), true).unwrap();
    let mut all = vec![0u8; blocks * BLOCK];
    again.read(0, &mut all).unwrap();
    for (b, block) in all.chunks(BLOCK).enumerate() {
        let want = if b < WRITERS * per_writer {
            VERSIONS
        } else {
            0
        };
        assert!(
            block == version(b, want),
            "block {b} is not at version {want}"
        );
    }
}

/// A device in memory that notes the thread of each write past the cache (the journal's and
/// the copies in place: only commits make them).
struct Watched {
    inner: MemStorage,
    threads: Mutex<Vec<Option<String>>>,
}

impl Storage for Watched {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn write_uncached(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let name = thread::current().name().map(str::to_string);
        self.threads.lock().unwrap().push(name);
        self.inner.write_uncached(bufs, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn name(&self) -> String {
        "watched memory".into()
    }
}

#[test]
fn full_batches_are_committed_by_the_committers_and_a_flush_by_its_caller() {
    let mode = || Mode::new("aes-gcm-random", "aead", &pattern(32, 4), BLOCK).unwrap();
    let mem = MemStorage::new(vec![0; 24 << 20]);
    let sb = format::plan(24 << 20, 0, mode().tag_size() as u16, BLOCK, false).unwrap();
    format::format(&mem, 0, &sb).unwrap();
    let watched = Arc::new(Watched {
        inner: mem,
        threads: Mutex::new(Vec::new()),
    });
    let dev =
        IntegrityDevice::open(Arc::clone(&watched) as Arc<dyn Storage>, 0, mode(), false).unwrap();
    // Several batches (of one journal section here) in one request, then a few blocks more.
    let data = pattern(300 * BLOCK, 5);
    dev.write(0, &data).unwrap();
    dev.flush().unwrap();
    let after_flush = watched.threads.lock().unwrap().len();
    dev.write(400, &data[..3 * BLOCK]).unwrap();
    dev.flush().unwrap();
    let threads = watched.threads.lock().unwrap().clone();
    let committers = threads
        .iter()
        .filter(|t| t.as_deref() == Some("integrity-commit"))
        .count();
    assert!(committers > 0, "no commit on a committer: {threads:?}");
    // Three blocks fill no batch: the flush commits them itself (a journal write and a copy).
    assert_eq!(threads.len(), after_flush + 2, "{threads:?}");
    let me = thread::current().name().map(str::to_string);
    assert!(
        threads[after_flush..].iter().all(|t| *t == me),
        "{threads:?}"
    );
    let mut back = vec![0u8; 300 * BLOCK];
    dev.read(0, &mut back).unwrap();
    assert!(back == data);
    drop(dev);
    let again = IntegrityDevice::open(watched as Arc<dyn Storage>, 0, mode(), true).unwrap();
    let (mut first, mut last) = (vec![0u8; 300 * BLOCK], vec![0u8; 3 * BLOCK]);
    again.read(0, &mut first).unwrap();
    again.read(400, &mut last).unwrap();
    assert!(first == data && last == data[..3 * BLOCK]);
}
