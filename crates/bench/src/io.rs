//! Timed I/O on an unlocked volume against the same I/O on its storage, as `rbd bench` times an
//! image: reads or writes of one size, sequential or random, with a number of requests in flight
//! (one thread each), until a total is moved. The same offsets, in the same order, go through
//! the encryption and straight to the ciphertext, so the ratio between the two is what the
//! encryption costs on that device (a local disk, an RBD image across the network).
//!
//! Writes are zeros: afterwards every block the benchmark wrote reads back as zeros through the
//! volume (the volume's timed pass runs last and reaches every block the others did).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use sectorcrypt_volume::{Error as VolumeError, Volume};
use serde::Serialize;

/// Reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoType {
    /// Reads.
    Read,
    /// Writes (of zeros).
    Write,
}

/// Where the requests go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// From the volume's start, one after the other (wrapping at its end).
    Seq,
    /// At random (seeded) offsets, aligned to the request size.
    Rand,
}

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct IoCase {
    /// Reads or writes.
    pub io_type: IoType,
    /// Sequential or random.
    pub pattern: Pattern,
    /// Bytes per request: a multiple of the volume's sector size.
    pub io_size: usize,
    /// Requests in flight (threads).
    pub threads: usize,
    /// Bytes to move.
    pub total: u64,
}

/// One measured pass.
#[derive(Clone, Debug, Serialize)]
pub struct IoResult {
    /// `volume` (through the encryption) or `raw` (the ciphertext on the storage).
    pub path: &'static str,
    /// Reads or writes.
    pub io_type: IoType,
    /// Sequential or random.
    pub pattern: Pattern,
    /// Bytes per request.
    pub io_size: usize,
    /// Requests in flight.
    pub threads: usize,
    /// Requests made.
    pub ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// Requests per second.
    pub ops_per_sec: f64,
    /// Bytes per second.
    pub bytes_per_sec: f64,
}

/// Why a case cannot run.
pub fn check(case: &IoCase, volume: &Volume) -> Result<(), String> {
    let ss = volume.sector_size();
    if case.io_size == 0 || !case.io_size.is_multiple_of(ss) || case.io_size > 64 << 20 {
        return Err(format!(
            "the I/O size must be a multiple of the {ss}-byte sector size, at most 64 MiB, not {}",
            case.io_size
        ));
    }
    if case.io_size as u64 > volume.size() {
        return Err(format!(
            "the I/O size {} exceeds the volume ({} bytes)",
            case.io_size,
            volume.size()
        ));
    }
    if case.threads == 0 || case.threads > 256 {
        return Err("the requests in flight must be between 1 and 256".into());
    }
    if case.total < case.io_size as u64 {
        return Err(format!(
            "the total {} is less than one request of {} bytes",
            case.total, case.io_size
        ));
    }
    if case.io_type == IoType::Write && volume.is_read_only() {
        return Err("a write benchmark needs the volume opened for writing".into());
    }
    Ok(())
}

/// The byte offset (in the volume) of request `i`.
fn offset_of(case: &IoCase, slots: u64, seed_offsets: &[u64], i: u64) -> u64 {
    match case.pattern {
        Pattern::Seq => (i % slots) * case.io_size as u64,
        Pattern::Rand => seed_offsets[i as usize],
    }
}

/// Run `case` on the raw storage, then through the volume (after an untimed warm-up of each):
/// two results, raw first.
/// `progress` gets the bytes done so far in the current pass and the pass's name.
pub fn measure(
    case: &IoCase,
    volume: &Volume,
    progress: &(dyn Fn(&'static str, u64) + Sync),
) -> Result<[IoResult; 2], VolumeError> {
    check(case, volume).map_err(VolumeError::Refused)?;
    let ops = case.total / case.io_size as u64;
    let slots = volume.size() / case.io_size as u64;
    // Random offsets drawn once, so both passes make the very same requests.
    let offsets: Vec<u64> = match case.pattern {
        Pattern::Seq => Vec::new(),
        Pattern::Rand => {
            let mut rng = rand::rngs::StdRng::seed_from_u64(16);
            (0..ops)
                .map(|_| rng.gen_range(0..slots) * case.io_size as u64)
                .collect()
        }
    };
    let layout = volume.layout();
    let storage = volume.storage();
    let on_raw = |buf: &mut [u8], i| {
        let at = layout.offset + offset_of(case, slots, &offsets, i);
        match case.io_type {
            IoType::Read => storage.read_at(buf, at)?,
            IoType::Write => storage.write_at(buf, at)?,
        }
        Ok(())
    };
    let through_volume = |buf: &mut [u8], i| {
        let at = offset_of(case, slots, &offsets, i);
        match case.io_type {
            IoType::Read => volume.read(buf, at),
            IoType::Write => volume.write_in_place(buf, at),
        }
    };
    // Both paths warm up (threads, buffers, caches, clocks) on the first eighth of the
    // requests, untimed, so the first timed pass is not the one that pays for it.
    let warm = (ops / 8).max(case.threads as u64).min(ops);
    pass(case, warm, "warm", &|_, _| {}, &on_raw)?;
    pass(case, warm, "warm", &|_, _| {}, &through_volume)?;
    let raw = pass(case, ops, "raw", progress, &on_raw)?;
    let through = pass(case, ops, "volume", progress, &through_volume)?;
    if case.io_type == IoType::Write {
        volume.flush()?;
    }
    Ok([raw, through])
}

/// Request `i` made on a buffer of the request size.
type Request<'a> = dyn Fn(&mut [u8], u64) -> Result<(), VolumeError> + Sync + 'a;

/// `ops` requests of `case.io_size` bytes over `case.threads` threads, request `i` made by
/// `request(buf, i)`; the buffer holds zeros before each write.
fn pass(
    case: &IoCase,
    ops: u64,
    path: &'static str,
    progress: &(dyn Fn(&'static str, u64) + Sync),
    request: &Request<'_>,
) -> Result<IoResult, VolumeError> {
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let start = Instant::now();
    let errors: Vec<VolumeError> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..case.threads)
            .map(|_| {
                s.spawn(|| -> Result<(), VolumeError> {
                    let mut buf = vec![0u8; case.io_size];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= ops || failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        if case.io_type == IoType::Write {
                            // An in-place write leaves ciphertext behind.
                            buf.fill(0);
                        }
                        if let Err(e) = request(&mut buf, i) {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        let bytes = done.fetch_add(case.io_size as u64, Ordering::Relaxed)
                            + case.io_size as u64;
                        progress(path, bytes);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| w.join().expect("a benchmark thread panicked").err())
            .collect()
    });
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    let bytes = ops * case.io_size as u64;
    Ok(IoResult {
        path,
        io_type: case.io_type,
        pattern: case.pattern,
        io_size: case.io_size,
        threads: case.threads,
        ops,
        bytes,
        seconds,
        ops_per_sec: ops as f64 / seconds,
        bytes_per_sec: bytes as f64 / seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sectorcrypt_storage::{MemStorage, Storage};
    use std::sync::Arc;

    fn volume(read_only: bool) -> (Arc<MemStorage>, Volume) {
        let storage = Arc::new(MemStorage::new(vec![0; 4096 + (1 << 20)]));
        storage.write_at(&[0x5a; 1 << 20], 4096).unwrap();
        let layout = sectorcrypt_volume::Layout {
            offset: 4096,
            size: 1 << 20,
            cipher: "aes-xts-plain64".into(),
            sector_size: 512,
            iv_offset: 0,
        };
        let options = sectorcrypt_volume::VolumeOptions {
            read_only,
            ..Default::default()
        };
        let v = Volume::with_layout(storage.clone(), layout, &[7; 64], &options).unwrap();
        (storage, v)
    }

    #[test]
    fn writes_leave_zeros_where_they_went_and_reads_change_nothing() {
        let (storage, v) = volume(false);
        let case = IoCase {
            io_type: IoType::Write,
            pattern: Pattern::Rand,
            io_size: 4096,
            threads: 3,
            total: 64 * 4096,
        };
        let [raw, through] = measure(&case, &v, &|_, _| {}).unwrap();
        assert_eq!((raw.path, through.path), ("raw", "volume"));
        assert_eq!((raw.ops, through.ops, through.bytes), (64, 64, 64 * 4096));
        // The same seeded offsets: each is zeros through the volume now, the rest untouched.
        let mut rng = rand::rngs::StdRng::seed_from_u64(16);
        let written: Vec<u64> = (0..64).map(|_| rng.gen_range(0..256u64) * 4096).collect();
        for slot in 0..256u64 {
            let mut buf = vec![0u8; 4096];
            v.read(&mut buf, slot * 4096).unwrap();
            if written.contains(&(slot * 4096)) {
                assert!(buf.iter().all(|&b| b == 0), "slot {slot} was written");
            } else {
                let mut raw = vec![0u8; 4096];
                storage.read_at(&mut raw, 4096 + slot * 4096).unwrap();
                assert!(raw.iter().all(|&b| b == 0x5a), "slot {slot} untouched");
            }
        }

        let before = storage.contents();
        let case = IoCase {
            io_type: IoType::Read,
            pattern: Pattern::Seq,
            io_size: 8192,
            threads: 2,
            total: 3 << 20,
        };
        let seen = std::sync::Mutex::new(Vec::new());
        let [raw, through] = measure(&case, &v, &|path, n| {
            seen.lock().unwrap().push((path, n));
        })
        .unwrap();
        // Wraps around the 1 MiB volume: 384 requests each way.
        assert_eq!((raw.ops, through.ops), (384, 384));
        assert_eq!(storage.contents(), before, "a read benchmark wrote");
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 768, "one progress call per request");
        assert!(seen.contains(&("raw", 3 << 20)) && seen.contains(&("volume", 3 << 20)));
    }

    #[test]
    fn cases_that_cannot_run_are_refused() {
        let (_, v) = volume(true);
        let ok = IoCase {
            io_type: IoType::Read,
            pattern: Pattern::Seq,
            io_size: 4096,
            threads: 1,
            total: 4096,
        };
        assert!(check(&ok, &v).is_ok());
        for bad in [
            IoCase {
                io_size: 1000,
                ..ok
            },
            IoCase { io_size: 0, ..ok },
            IoCase {
                io_size: 2 << 20,
                total: 2 << 20,
                ..ok
            },
            IoCase { threads: 0, ..ok },
            IoCase { total: 100, ..ok },
            IoCase {
                io_type: IoType::Write,
                ..ok
            },
        ] {
            assert!(check(&bad, &v).is_err(), "{bad:?}");
            assert!(measure(&bad, &v, &|_, _| {}).is_err());
        }
    }
}
