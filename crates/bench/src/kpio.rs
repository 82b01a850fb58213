//! What choosing the key per request costs: requests at random offsets of a store, each under a
//! key tag drawn at random from a table of N keys, against the same requests under one key, in
//! the same run.
//!
//! The whole request path is measured (tag lookup, the volume's head/body/tail cut, the store's
//! lend of its pages, the cipher), not only the cipher, because what a table of many keys adds
//! is cache misses on its round keys and lookup structures, which only show among the rest of
//! the request's work, and which that work can hide. So the store is a file, served as `kpio
//! serve` serves one (pages lent from the page cache), but one in memory (`memfd`), so that no
//! disk's writeback runs underneath. It is larger than the last-level cache, as a real store
//! would be.
//! Rounds alternate between the key counts, so a slow moment of the machine hits them all alike;
//! a round during which the hypervisor stole the CPU is taken again ([`crate::steal`]), and the
//! median round is reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};
use sectorcrypt_cipher::BackendChoice;
use sectorcrypt_storage::{FileStorage, Storage};
use sectorcrypt_volume::kpio::KeyTable;
use sectorcrypt_volume::{Error, Layout, VolumeOptions};
use serde::Serialize;

/// The store the requests land in.
const STORE: usize = 256 << 20;

/// Tables smaller than this do not report their memory per key.
pub const PER_KEY_MIN: usize = 1024;

/// Rounds per key count; the median is reported.
const ROUNDS: usize = 5;

/// What to measure.
#[derive(Clone, Debug)]
pub struct KpioCase {
    /// dm-crypt cipher spec, e.g. `aes-xts-plain64`.
    pub cipher: String,
    /// Whole key size in bits.
    pub key_bits: usize,
    /// Encryption sector size.
    pub sector_size: usize,
    /// Bytes per request (a multiple of the sector size).
    pub request_size: usize,
    /// Key counts to compare; the first is the baseline (normally 1).
    pub keys: Vec<usize>,
    /// Seconds per key count and direction, over all rounds.
    pub seconds: f64,
    /// Block-cipher implementation.
    pub backend: BackendChoice,
}

/// One key count in one direction.
#[derive(Clone, Debug, Serialize)]
pub struct KpioSample {
    /// The cipher specification.
    pub cipher: String,
    /// Whole key size in bits.
    pub key_bits: usize,
    /// Keys loaded; each request names one of them at random.
    pub keys: usize,
    /// `write` (encrypt) or `read` (decrypt).
    pub op: &'static str,
    /// Bytes per request.
    pub request_size: usize,
    /// Median requests per second.
    pub requests_per_sec: f64,
    /// Slowest and fastest round.
    pub requests_per_sec_range: [f64; 2],
    /// Median bytes per second.
    pub bytes_per_sec: f64,
    /// Throughput against the first key count of the run (normally one key).
    pub vs_baseline: f64,
    /// Resident memory the table took per key (from /proc), for tables large enough that the
    /// allocator's own steps do not swamp it (at least [`PER_KEY_MIN`] keys).
    pub table_bytes_per_key: Option<f64>,
    /// Seconds to load all the keys.
    pub load_seconds: f64,
    /// The largest share of the machine's CPU time the hypervisor stole during a counted round
    /// (rounds above [`crate::steal::MAX_STEAL`] were taken again, up to
    /// [`crate::steal::ATTEMPTS`] times); `None` where /proc/stat cannot be read.
    pub steal_max: Option<f64>,
}

/// Resident bytes of this process, if the system says.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

struct Loaded {
    table: KeyTable,
    keys: usize,
    per_key: Option<f64>,
    load_seconds: f64,
}

/// Run `case`: for each key count, writes then reads.
pub fn measure(case: &KpioCase) -> Result<Vec<KpioSample>, Error> {
    if case.request_size == 0 || !case.request_size.is_multiple_of(case.sector_size) {
        return Err(Error::Refused(format!(
            "a request size of {} bytes is not a positive multiple of the {}-byte sector",
            case.request_size, case.sector_size
        )));
    }
    if case.keys.is_empty() || case.keys.contains(&0) {
        return Err(Error::Refused("key counts must be at least 1".into()));
    }
    let mut rng = rand::rngs::StdRng::from_entropy();
    let storage: Arc<dyn Storage> =
        Arc::new(FileStorage::in_memory("kpio-benchmark", STORE as u64)?);
    let mut chunk = vec![0u8; 1 << 20];
    for at in (0..STORE).step_by(chunk.len()) {
        rng.fill_bytes(&mut chunk);
        storage.write_at(&chunk, at as u64)?;
    }
    let layout = Layout {
        offset: 0,
        size: STORE as u64,
        cipher: case.cipher.clone(),
        sector_size: case.sector_size,
        iv_offset: 0,
    };
    let options = VolumeOptions {
        backend: case.backend,
        ..VolumeOptions::default()
    };
    let mut tables = Vec::new();
    for &keys in &case.keys {
        let before = resident_bytes();
        let table = KeyTable::new(Arc::clone(&storage), layout.clone(), &options, keys)?;
        let mut key = zeroize::Zeroizing::new(vec![0u8; case.key_bits / 8]);
        let start = Instant::now();
        // As `kpio serve` loads a key table file (`KeyTable::reload`): one stack scrub for all.
        sectorcrypt_secret::scrubbing_once(|| {
            (0..keys).try_for_each(|tag| {
                rng.fill_bytes(&mut key);
                table.load(tag as u32, &key)
            })
        })?;
        let load_seconds = start.elapsed().as_secs_f64();
        let per_key = match (before, resident_bytes()) {
            (Some(b), Some(a)) if keys >= PER_KEY_MIN => {
                Some(a.saturating_sub(b) as f64 / keys as f64)
            }
            _ => None,
        };
        tables.push(Loaded {
            table,
            keys,
            per_key,
            load_seconds,
        });
    }
    let slice = Duration::from_secs_f64((case.seconds / ROUNDS as f64).max(0.01));
    let mut samples = Vec::new();
    for (op, write) in [("write", true), ("read", false)] {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); tables.len()];
        let mut steal_max: Option<f64> = None;
        // A warm-up round, not counted, then rounds that alternate between the tables; a round
        // taken while the host stole the CPU is taken again.
        for round in 0..=ROUNDS {
            let mut one_round = || {
                tables
                    .iter()
                    .map(|t| run_for(&t.table, t.keys, case.request_size, write, slice, &mut rng))
                    .collect::<Result<Vec<f64>, Error>>()
            };
            if round == 0 {
                one_round()?;
                continue;
            }
            let (round_rates, steal) = crate::steal::least_stolen(one_round)?;
            for (r, rate) in rates.iter_mut().zip(round_rates) {
                r.push(rate);
            }
            steal_max = steal.map(|s| steal_max.map_or(s, |m| m.max(s)));
        }
        let medians: Vec<f64> = rates.iter().map(|r| crate::median(r.clone())).collect();
        for ((t, r), median) in tables.iter().zip(&rates).zip(&medians) {
            let low = r.iter().copied().fold(f64::INFINITY, f64::min);
            let high = r.iter().copied().fold(0.0, f64::max);
            samples.push(KpioSample {
                cipher: case.cipher.clone(),
                key_bits: case.key_bits,
                keys: t.keys,
                op,
                request_size: case.request_size,
                requests_per_sec: *median,
                requests_per_sec_range: [low, high],
                bytes_per_sec: median * case.request_size as f64,
                vs_baseline: median / medians[0],
                table_bytes_per_key: t.per_key,
                load_seconds: t.load_seconds,
                steal_max,
            });
        }
    }
    Ok(samples)
}

/// Requests per second for about `slice`: each at a random aligned offset under a random tag.
fn run_for(
    table: &KeyTable,
    keys: usize,
    request: usize,
    write: bool,
    slice: Duration,
    rng: &mut impl Rng,
) -> Result<f64, Error> {
    let mut buf = crate::random_buffer(request);
    let slots = table.size() / request as u64;
    let start = Instant::now();
    let mut done = 0u64;
    loop {
        // A batch between clock reads, so that reading the clock costs nothing measurable.
        for _ in 0..64 {
            let tag = rng.gen_range(0..keys) as u32;
            let at = rng.gen_range(0..slots) * request as u64;
            if write {
                table.write_in_place(tag, &mut buf, at)?;
            } else {
                table.read(tag, &mut buf, at)?;
            }
        }
        done += 64;
        let elapsed = start.elapsed();
        if elapsed >= slice {
            return Ok(done as f64 / elapsed.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_count_is_measured_in_both_directions() {
        let case = KpioCase {
            cipher: "aes-xts-plain64".into(),
            key_bits: 512,
            sector_size: 512,
            request_size: 4096,
            keys: vec![1, 64],
            seconds: 0.05,
            backend: BackendChoice::Auto,
        };
        let samples = measure(&case).unwrap();
        assert_eq!(samples.len(), 4);
        for s in &samples {
            assert!(s.requests_per_sec > 0.0 && s.bytes_per_sec > 0.0, "{s:?}");
            assert!(s.requests_per_sec_range[0] <= s.requests_per_sec);
            assert!(s.requests_per_sec <= s.requests_per_sec_range[1]);
        }
        assert_eq!(samples[0].vs_baseline, 1.0);
        assert_eq!((samples[1].keys, samples[1].op), (64, "write"));
        assert_eq!((samples[3].keys, samples[3].op), (64, "read"));
        let bad = KpioCase {
            request_size: 1000,
            ..case.clone()
        };
        assert!(matches!(measure(&bad), Err(Error::Refused(_))));
        let none = KpioCase {
            keys: vec![],
            ..case
        };
        assert!(matches!(measure(&none), Err(Error::Refused(_))));
    }
}
