//! Passphrase-based key derivation as LUKS stores it: PBKDF2 (LUKS1 keyslots and digests, LUKS2
//! `pbkdf2` keyslots and digests) and Argon2i / Argon2id (LUKS2 keyslots). The cost is always the
//! one recorded in the header, never more.

use std::time::{Duration, Instant};

use sectorcrypt_secret::SecretBytes;

use crate::error::Error;
use crate::hash::Hash;

/// A key-derivation function with its recorded cost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kdf {
    /// PBKDF2-HMAC.
    Pbkdf2 {
        /// The HMAC hash.
        hash: Hash,
        /// The iteration count.
        iterations: u32,
    },
    /// Argon2 (`argon2i` or `argon2id`), version 0x13.
    Argon2 {
        /// Argon2i or Argon2id.
        variant: Argon2Variant,
        /// The time cost (passes).
        time: u32,
        /// The memory cost in KiB.
        memory_kib: u32,
        /// The lanes (threads).
        parallel: u32,
    },
}

/// Which Argon2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Argon2Variant {
    /// Data-independent addressing.
    Argon2i,
    /// Hybrid (cryptsetup's default).
    Argon2id,
}

impl Kdf {
    /// LUKS2's name of the function (`pbkdf2`, `argon2i`, `argon2id`).
    pub fn name(&self) -> &'static str {
        match self {
            Kdf::Pbkdf2 { .. } => "pbkdf2",
            Kdf::Argon2 {
                variant: Argon2Variant::Argon2i,
                ..
            } => "argon2i",
            Kdf::Argon2 {
                variant: Argon2Variant::Argon2id,
                ..
            } => "argon2id",
        }
    }

    /// Derive `len` bytes from `passphrase` and `salt`.
    pub fn derive(&self, passphrase: &[u8], salt: &[u8], len: usize) -> Result<SecretBytes, Error> {
        let mut out = SecretBytes::zeroed(len);
        match *self {
            Kdf::Pbkdf2 { hash, iterations } => {
                if iterations == 0 {
                    return Err(Error::Corrupt("a PBKDF2 iteration count of 0".into()));
                }
                hash.pbkdf2(passphrase, salt, iterations, &mut out);
            }
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => {
                let params = argon2::Params::new(memory_kib, time, parallel, Some(len))
                    .map_err(|e| Error::Corrupt(format!("Argon2 parameters: {e}")))?;
                let algorithm = match variant {
                    Argon2Variant::Argon2i => argon2::Algorithm::Argon2i,
                    Argon2Variant::Argon2id => argon2::Algorithm::Argon2id,
                };
                argon2::Argon2::new(algorithm, argon2::Version::V0x13, params)
                    .hash_password_into(passphrase, salt, &mut out)
                    .map_err(|e| match e {
                        argon2::Error::MemoryTooLittle | argon2::Error::MemoryTooMuch => {
                            Error::Corrupt(format!("Argon2 memory cost: {e}"))
                        }
                        other => Error::Corrupt(format!("Argon2: {other}")),
                    })?;
            }
        }
        Ok(out)
    }
}

/// cryptsetup's floor for PBKDF2 iterations (`MIN_PBKDF2_ITERATIONS`).
pub const PBKDF2_MIN_ITERATIONS: u32 = 1000;
/// cryptsetup's floor for the Argon2 time cost.
pub const ARGON2_MIN_TIME: u32 = 4;
/// cryptsetup's floor for the Argon2 memory cost, in KiB.
pub const ARGON2_MIN_MEMORY_KIB: u32 = 32;
/// cryptsetup's default Argon2 memory ceiling (1 GiB), in KiB.
pub const ARGON2_DEFAULT_MAX_MEMORY_KIB: u32 = 1024 * 1024;
/// cryptsetup's default Argon2 parallelism ceiling.
pub const ARGON2_DEFAULT_MAX_PARALLEL: u32 = 4;

/// Salt used only while benchmarking; the result is discarded.
const BENCH_SALT: &[u8; 32] = &[0x55; 32];
/// A measurement shorter than this is too noisy to extrapolate from.
const BENCH_MIN: Duration = Duration::from_millis(20);

/// cryptsetup's default Argon2 parallelism: `min(4, online CPUs)`.
pub fn default_argon2_parallel() -> u32 {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (cpus.min(ARGON2_DEFAULT_MAX_PARALLEL as usize) as u32).max(1)
}

/// Half of the memory the kernel reports as available (`MemAvailable`, else `MemTotal`), in KiB;
/// `None` when `/proc/meminfo` cannot be read. cryptsetup never lets Argon2 take more, so that
/// unlocking does not push the machine into swap or the OOM killer.
pub fn half_available_memory_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.trim_start().strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    field("MemAvailable")
        .or_else(|| field("MemTotal"))
        .map(|kib| kib / 2)
}

fn elapsed_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// PBKDF2 iterations that take about `iter_time_ms` on this machine for a `key_len`-byte output
/// (cryptsetup's minimum 1000).
pub fn calibrate_pbkdf2(hash: Hash, key_len: usize, iter_time_ms: u32) -> Result<u32, Error> {
    if key_len == 0 {
        return Err(Error::Unsupported("a PBKDF2 output of 0 bytes".into()));
    }
    // Double the trial count until one run is long enough to measure, then extrapolate linearly:
    // PBKDF2's cost is exactly proportional to the iteration count.
    let mut trial: u32 = PBKDF2_MIN_ITERATIONS;
    loop {
        let kdf = Kdf::Pbkdf2 {
            hash,
            iterations: trial,
        };
        let start = Instant::now();
        kdf.derive(b"sectorcrypt benchmark", BENCH_SALT, key_len)?;
        let took = start.elapsed();
        if took >= BENCH_MIN || trial >= u32::MAX / 2 {
            let per_ms = f64::from(trial) / elapsed_ms(took).max(0.001);
            let wanted = per_ms * f64::from(iter_time_ms);
            let wanted = wanted.min(f64::from(u32::MAX)) as u32;
            return Ok(wanted.max(PBKDF2_MIN_ITERATIONS));
        }
        trial = trial.saturating_mul(2);
    }
}

/// Argon2 (time, memory_kib) as cryptsetup chooses them: memory up to `max_memory_kib` (default
/// 1 GiB) but never more than half of MemAvailable, parallel = given (default min(4, cpus); 0
/// here means the default), time >= 4, tuned to take about `iter_time_ms`.
///
/// Like cryptsetup's `crypt_argon2_check`, the search grows memory first (more memory is the
/// stronger defence against parallel attackers) and only then time, and shrinks time first.
pub fn calibrate_argon2(
    variant: Argon2Variant,
    iter_time_ms: u32,
    max_memory_kib: u32,
    parallel: u32,
) -> Result<(u32, u32), Error> {
    let parallel = if parallel == 0 {
        default_argon2_parallel()
    } else {
        parallel
    };
    let mut max_m = u64::from(max_memory_kib);
    if let Some(half) = half_available_memory_kib() {
        max_m = max_m.min(half);
    }
    // Argon2 itself needs 8 KiB per lane.
    let min_m = u64::from(ARGON2_MIN_MEMORY_KIB).max(8 * u64::from(parallel));
    let max_m = max_m.max(min_m);
    let target = f64::from(iter_time_ms.max(1));

    let measure = |t: u32, m: u64| -> Result<f64, Error> {
        let kdf = Kdf::Argon2 {
            variant,
            time: t,
            memory_kib: m as u32,
            parallel,
        };
        let start = Instant::now();
        kdf.derive(b"sectorcrypt benchmark", BENCH_SALT, 32)?;
        Ok(elapsed_ms(start.elapsed()).max(0.01))
    };

    let mut t = ARGON2_MIN_TIME;
    let mut m = min_m;
    // Phase 1: cheap parameters that are still long enough to measure.
    let mut ms = measure(t, m)?;
    while ms < elapsed_ms(BENCH_MIN) && ms < target {
        if m < max_m {
            m = (m * 4).min(max_m);
        } else {
            t = t.saturating_mul(2);
        }
        ms = measure(t, m)?;
    }
    // Phase 2: extrapolate (cost is about proportional to time * memory) and re-measure until
    // within 5 % or the estimate stops changing.
    for _ in 0..8 {
        if (ms - target).abs() <= target * 0.05 {
            break;
        }
        let scale = target / ms;
        let (old_t, old_m) = (t, m);
        if scale < 1.0 {
            let new_t = (f64::from(t) * scale) as u32;
            if new_t >= ARGON2_MIN_TIME {
                t = new_t;
            } else {
                let work = f64::from(t) * m as f64 * scale;
                t = ARGON2_MIN_TIME;
                m = ((work / f64::from(t)) as u64).max(min_m);
            }
        } else {
            let new_m = (m as f64 * scale) as u64;
            if new_m > max_m {
                let work = f64::from(t) * m as f64 * scale;
                m = max_m;
                t = ((work / m as f64) as u32).max(ARGON2_MIN_TIME);
            } else {
                m = new_m.max(min_m);
            }
        }
        if (t, m) == (old_t, old_m) {
            break;
        }
        ms = measure(t, m)?;
    }
    Ok((t, m as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6070 (PBKDF2-HMAC-SHA1) and the widely published SHA-256 equivalent.
    #[test]
    fn pbkdf2_known_answers() {
        let k = Kdf::Pbkdf2 {
            hash: Hash::Sha1,
            iterations: 4096,
        };
        assert_eq!(
            hex::encode(&k.derive(b"password", b"salt", 20).unwrap()[..]),
            "4b007901b765489abead49d926f721d065a429c1"
        );
        let k = Kdf::Pbkdf2 {
            hash: Hash::Sha256,
            iterations: 1,
        };
        assert_eq!(
            hex::encode(&k.derive(b"password", b"salt", 32).unwrap()[..]),
            "120fb6cffcf8b32c43e7225256c4f837a86548c92ccc35480805987cb70be17b"
        );
    }

    /// Argon2 itself is the `argon2` crate's (tested upstream against RFC 9106); what is checked
    /// here is that every parameter reaches it. Interop tests against cryptsetup check the rest.
    #[test]
    fn argon2id_runs_and_depends_on_every_input() {
        let k = Kdf::Argon2 {
            variant: Argon2Variant::Argon2id,
            time: 1,
            memory_kib: 64,
            parallel: 1,
        };
        let a = k.derive(b"pass", b"saltsaltsaltsalt", 32).unwrap();
        assert_ne!(
            &a[..],
            &k.derive(b"pasS", b"saltsaltsaltsalt", 32).unwrap()[..]
        );
        assert_ne!(
            &a[..],
            &k.derive(b"pass", b"saltsaltsaltsalT", 32).unwrap()[..]
        );
        let i = Kdf::Argon2 {
            variant: Argon2Variant::Argon2i,
            time: 1,
            memory_kib: 64,
            parallel: 1,
        };
        assert_ne!(
            &a[..],
            &i.derive(b"pass", b"saltsaltsaltsalt", 32).unwrap()[..]
        );
        let bad = Kdf::Argon2 {
            variant: Argon2Variant::Argon2id,
            time: 1,
            memory_kib: 1,
            parallel: 4,
        };
        assert!(bad.derive(b"p", b"saltsaltsaltsalt", 32).is_err());
    }
}
