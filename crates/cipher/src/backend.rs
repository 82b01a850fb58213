//! Which implementation of a block cipher runs, chosen once at key set-up.
//!
//! Detection uses the CPU feature flags (`std::is_x86_feature_detected!`, cached by std). A
//! [`BackendChoice`] lets callers force one backend: tests use it to cover every backend this
//! machine can run, and users use it (`--backend`, or `SECTORCRYPT_BACKEND` in the CLI) to compare
//! the portable code with the SIMD kernels or to work around a suspected CPU problem.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// A 128-bit block cipher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// AES (FIPS 197), 128/192/256-bit keys.
    Aes,
    /// LEA (KS X 3246, ISO/IEC 29192-2), 128/192/256-bit keys.
    Lea,
    /// Serpent, 128/192/256-bit keys (portable, AVX2 and AVX-512).
    Serpent,
    /// Twofish, 128/192/256-bit keys (constant time: portable bitsliced, AVX2, AVX-512BW).
    Twofish,
    /// Camellia (RFC 3713), 128/192/256-bit keys (portable only).
    Camellia,
    /// ARIA (RFC 5794), 128/192/256-bit keys (portable only).
    Aria,
    /// SM4 (GB/T 32907), 128-bit keys only (portable only).
    Sm4,
    /// CAST6 (CAST-256, RFC 2612), 128/192/256-bit keys (portable only).
    Cast6,
}

impl Algorithm {
    /// dm-crypt's name of the cipher.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Aes => "aes",
            Algorithm::Lea => "lea",
            Algorithm::Serpent => "serpent",
            Algorithm::Twofish => "twofish",
            Algorithm::Camellia => "camellia",
            Algorithm::Aria => "aria",
            Algorithm::Sm4 => "sm4",
            Algorithm::Cast6 => "cast6",
        }
    }

    /// Every block cipher, in the order of dm-crypt's usual listing.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::Aes,
        Algorithm::Serpent,
        Algorithm::Twofish,
        Algorithm::Camellia,
        Algorithm::Aria,
        Algorithm::Sm4,
        Algorithm::Cast6,
        Algorithm::Lea,
    ];

    /// The cipher of a dm-crypt name (`aes`, `serpent`, ...).
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The key lengths in bytes a volume key (or one XTS half) may have: 16, 24 and 32, SM4 only 16.
    pub fn key_lens(self) -> &'static [usize] {
        match self {
            Algorithm::Sm4 => &[16],
            _ => &[16, 24, 32],
        }
    }

    /// Whether the cipher can be keyed with `len` bytes. Wider than [`Self::key_lens`] for
    /// Serpent (any length up to 32 bytes, as the kernel's) and CAST6 (16 to 32 in steps of 4):
    /// an ESSIV salt is the digest of the hash named, e.g. 20 bytes for `essiv:sha1`.
    pub fn accepts_key_len(self, len: usize) -> bool {
        match self {
            Algorithm::Serpent => (1..=32).contains(&len),
            Algorithm::Cast6 => (16..=32).contains(&len) && len.is_multiple_of(4),
            _ => self.key_lens().contains(&len),
        }
    }

    /// Backends for this algorithm, fastest first (not all may run on this CPU).
    pub fn backends(self) -> &'static [Backend] {
        match self {
            Algorithm::Aes => &[
                Backend::Vaes512,
                Backend::Vaes256,
                Backend::AesNi,
                Backend::Portable,
            ],
            Algorithm::Lea | Algorithm::Serpent | Algorithm::Twofish => {
                &[Backend::Avx512, Backend::Avx2, Backend::Portable]
            }
            _ => &[Backend::Portable],
        }
    }

    /// Backends for this algorithm that this CPU can run, fastest first.
    pub fn available_backends(self) -> Vec<Backend> {
        self.backends()
            .iter()
            .copied()
            .filter(|b| b.is_available())
            .collect()
    }
}

/// An implementation of a block cipher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Portable Rust (constant-time bitsliced AES, Serpent and Twofish, plain ARX LEA,
    /// RustCrypto's implementations of the other ciphers). Runs everywhere.
    Portable,
    /// AES-NI, 128-bit registers, eight blocks in flight.
    AesNi,
    /// VAES + AVX-512 (+ VPCLMULQDQ for tweaks), four blocks per 512-bit register.
    Vaes512,
    /// VAES + AVX2 (+ VPCLMULQDQ for tweaks), two blocks per 256-bit register: CPUs with VAES
    /// but no AVX-512.
    Vaes256,
    /// AVX2, eight LEA, Serpent or Twofish blocks per 256-bit register set.
    Avx2,
    /// AVX-512F, sixteen LEA, Serpent or Twofish blocks per 512-bit register set (Twofish also
    /// needs AVX-512BW; without it, on Xeon Phi, its AVX2 kernels run).
    Avx512,
    /// No cipher at all (`cipher_null`): used to measure everything but the cipher.
    Null,
}

impl Backend {
    /// Short name used in benchmark output and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Portable => "portable",
            Backend::AesNi => "aesni",
            Backend::Vaes512 => "vaes512",
            Backend::Vaes256 => "vaes256",
            Backend::Avx2 => "avx2",
            Backend::Avx512 => "avx512",
            Backend::Null => "null",
        }
    }

    /// Whether this CPU can run the backend.
    pub fn is_available(self) -> bool {
        match self {
            Backend::Portable | Backend::Null => true,
            #[cfg(target_arch = "x86_64")]
            Backend::AesNi => {
                std::is_x86_feature_detected!("aes") && std::is_x86_feature_detected!("sse4.1")
            }
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes512 => {
                std::is_x86_feature_detected!("vaes")
                    && std::is_x86_feature_detected!("vpclmulqdq")
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("aes")
            }
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes256 => {
                std::is_x86_feature_detected!("vaes")
                    && std::is_x86_feature_detected!("vpclmulqdq")
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("aes")
                    && std::is_x86_feature_detected!("sse4.1")
            }
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => std::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "portable" => Backend::Portable,
            "aesni" => Backend::AesNi,
            "vaes512" => Backend::Vaes512,
            "vaes256" => Backend::Vaes256,
            "avx2" => Backend::Avx2,
            "avx512" => Backend::Avx512,
            _ => return Err(Error::UnknownBackend(s.to_string())),
        })
    }
}

/// How to choose the backend at key set-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The fastest backend this CPU runs.
    #[default]
    Auto,
    /// The portable code, whatever the CPU (for AES, LEA and Serpent alike).
    Portable,
    /// Exactly this backend; an error if the CPU cannot run it or it does not implement the
    /// algorithm.
    Exact(Backend),
}

impl BackendChoice {
    /// The variable that forces a backend when no argument does (tests and benchmarks use it to
    /// run the portable code on any CPU; it holds no secret).
    pub const ENV: &'static str = "SECTORCRYPT_BACKEND";

    /// `arg` (a `--backend` value) if given, else `$SECTORCRYPT_BACKEND`, else [`Self::Auto`].
    pub fn from_arg_or_env(arg: Option<&str>) -> Result<Self, Error> {
        let from_env = std::env::var(Self::ENV).ok();
        match arg.or(from_env.as_deref()) {
            None => Ok(BackendChoice::Auto),
            Some(s) => BackendChoice::parse(s),
        }
    }

    /// Parse `auto`, `portable` or a backend name.
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "portable" => Ok(BackendChoice::Portable),
            other => other.parse().map(BackendChoice::Exact),
        }
    }

    /// The backend to run `alg` with.
    pub fn resolve(self, alg: Algorithm) -> Result<Backend, Error> {
        match self {
            BackendChoice::Auto => Ok(alg
                .available_backends()
                .first()
                .copied()
                .unwrap_or(Backend::Portable)),
            BackendChoice::Portable => Ok(Backend::Portable),
            BackendChoice::Exact(b) => {
                if !alg.backends().contains(&b) {
                    Err(Error::BackendUnsupported {
                        backend: b,
                        algorithm: alg,
                    })
                } else if !b.is_available() {
                    Err(Error::BackendUnavailable(b))
                } else {
                    Ok(b)
                }
            }
        }
    }
}
