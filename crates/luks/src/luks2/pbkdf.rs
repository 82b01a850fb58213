//! How a new LUKS2 keyslot's passphrase KDF and its cost are chosen, as cryptsetup's `--pbkdf*`
//! options say: PBKDF2 or Argon2, a forced cost or one benchmarked on this machine.

use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::{self, Argon2Variant, Kdf};

/// Which passphrase KDF a keyslot gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PbkdfKind {
    /// PBKDF2-HMAC with this hash.
    Pbkdf2 {
        /// The HMAC hash.
        hash: Hash,
    },
    /// Argon2i or Argon2id.
    Argon2 {
        /// Which one.
        variant: Argon2Variant,
    },
}

/// How a new keyslot's KDF cost is chosen, as cryptsetup's `--pbkdf*` options say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pbkdf {
    /// The function.
    pub kind: PbkdfKind,
    /// A fixed cost instead of a benchmark (`--pbkdf-force-iterations`): PBKDF2 iterations or
    /// Argon2 time.
    pub forced_iterations: Option<u32>,
    /// Argon2 memory ceiling (`--pbkdf-memory`), KiB; capped at half of the available memory.
    pub memory_kib: u32,
    /// Argon2 threads (`--pbkdf-parallel`); 0 means cryptsetup's default, capped at the CPUs.
    pub parallel: u32,
    /// Benchmark target (`--iter-time`), milliseconds.
    pub iter_time_ms: u32,
}

impl Default for Pbkdf {
    /// cryptsetup's LUKS2 default: argon2id, 2 s, up to 1 GiB, up to 4 threads.
    fn default() -> Self {
        Pbkdf {
            kind: PbkdfKind::Argon2 {
                variant: Argon2Variant::Argon2id,
            },
            forced_iterations: None,
            memory_kib: kdf::ARGON2_DEFAULT_MAX_MEMORY_KIB,
            parallel: 0,
            iter_time_ms: 2000,
        }
    }
}

impl Pbkdf {
    /// PBKDF2 with a fixed iteration count (no benchmark).
    pub fn pbkdf2_forced(hash: Hash, iterations: u32) -> Self {
        Pbkdf {
            kind: PbkdfKind::Pbkdf2 { hash },
            forced_iterations: Some(iterations),
            ..Pbkdf::default()
        }
    }

    /// Argon2 with a fixed cost (no benchmark).
    pub fn argon2_forced(
        variant: Argon2Variant,
        time: u32,
        memory_kib: u32,
        parallel: u32,
    ) -> Self {
        Pbkdf {
            kind: PbkdfKind::Argon2 { variant },
            forced_iterations: Some(time),
            memory_kib,
            parallel,
            iter_time_ms: 2000,
        }
    }

    /// The KDF with its cost for a `key_len`-byte area key: forced, or benchmarked here.
    pub fn resolve(&self, key_len: usize) -> Result<Kdf, Error> {
        match self.kind {
            PbkdfKind::Pbkdf2 { hash } => {
                let iterations = match self.forced_iterations {
                    Some(n) if n < kdf::PBKDF2_MIN_ITERATIONS => {
                        return Err(Error::Unsupported(format!(
                            "{n} PBKDF2 iterations (cryptsetup's minimum is {})",
                            kdf::PBKDF2_MIN_ITERATIONS
                        )))
                    }
                    Some(n) => n,
                    None => kdf::calibrate_pbkdf2(hash, key_len, self.iter_time_ms)?,
                };
                Ok(Kdf::Pbkdf2 { hash, iterations })
            }
            PbkdfKind::Argon2 { variant } => {
                // As cryptsetup: never more threads than CPUs, never more than half the memory.
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
                let parallel = match self.parallel {
                    0 => kdf::default_argon2_parallel(),
                    p => p.min(cpus),
                };
                let (time, memory_kib) = match self.forced_iterations {
                    Some(t) if t < kdf::ARGON2_MIN_TIME => {
                        return Err(Error::Unsupported(format!(
                            "an Argon2 time cost of {t} (cryptsetup's minimum is {})",
                            kdf::ARGON2_MIN_TIME
                        )))
                    }
                    Some(t) => {
                        let mut m = u64::from(self.memory_kib);
                        if let Some(half) = kdf::half_available_memory_kib() {
                            m = m.min(half);
                        }
                        let min =
                            u64::from(kdf::ARGON2_MIN_MEMORY_KIB).max(8 * u64::from(parallel));
                        (t, m.max(min) as u32)
                    }
                    None => kdf::calibrate_argon2(
                        variant,
                        self.iter_time_ms,
                        self.memory_kib,
                        parallel,
                    )?,
                };
                Ok(Kdf::Argon2 {
                    variant,
                    time,
                    memory_kib,
                    parallel,
                })
            }
        }
    }
}
