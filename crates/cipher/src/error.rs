//! Errors of the cipher layer. Every bad input (spec, key, sector size, buffer length) is reported
//! here instead of panicking, so the layers above can turn it into a one-line message.

use std::fmt;

use crate::backend::{Algorithm, Backend};

/// What went wrong in the cipher layer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The cipher specification is not of the form `CIPHER-MODE-IV` or names something unknown.
    BadSpec {
        /// The specification given.
        spec: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The key length does not fit the cipher and mode.
    KeySize {
        /// The cipher specification.
        spec: String,
        /// The key size given, in bits.
        bits: usize,
        /// The sizes it takes.
        allowed: &'static str,
    },
    /// Sector sizes are 512, 1024, 2048 or 4096 bytes.
    SectorSize(usize),
    /// The IV generator works on one sector size only (`lmk`: 512 bytes).
    IvSectorSize {
        /// The cipher specification.
        spec: String,
        /// The sector size asked for.
        sector_size: usize,
        /// The one it takes.
        required: usize,
    },
    /// A buffer handed to a sector operation is not a whole number of sectors.
    NotWholeSectors {
        /// The buffer's length.
        len: usize,
        /// The sector size.
        sector_size: usize,
    },
    /// A source and destination buffer of different lengths.
    LengthMismatch {
        /// The source's length.
        src: usize,
        /// The destination's length.
        dst: usize,
    },
    /// A data unit shorter than one block (XTS) or not a whole number of blocks (CBC, ECB, CTR).
    DataUnitLength {
        /// The data unit's length.
        len: usize,
        /// The mode.
        mode: &'static str,
    },
    /// The sector number overflows the IV arithmetic.
    SectorOverflow,
    /// A backend name that does not exist.
    UnknownBackend(String),
    /// The backend exists but this CPU cannot run it.
    BackendUnavailable(Backend),
    /// The backend exists but does not implement this algorithm.
    BackendUnsupported {
        /// The backend asked for.
        backend: Backend,
        /// The algorithm it does not implement.
        algorithm: Algorithm,
    },
    /// The worker threads could not be started.
    ThreadPool,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadSpec { spec, reason } => {
                write!(f, "cipher specification '{spec}' is invalid: {reason}")
            }
            Error::KeySize {
                spec,
                bits,
                allowed,
            } => {
                write!(
                    f,
                    "a {bits}-bit key does not fit cipher '{spec}' (allowed: {allowed})"
                )
            }
            Error::SectorSize(s) => write!(
                f,
                "sector size {s} is not supported (use 512, 1024, 2048 or 4096)"
            ),
            Error::IvSectorSize {
                spec,
                sector_size,
                required,
            } => write!(
                f,
                "cipher '{spec}' works on {required}-byte sectors only, not {sector_size}"
            ),
            Error::LengthMismatch { src, dst } => {
                write!(f, "a source of {src} bytes for a destination of {dst} bytes")
            }
            Error::NotWholeSectors { len, sector_size } => {
                write!(
                    f,
                    "a buffer of {len} bytes is not a whole number of {sector_size}-byte sectors"
                )
            }
            Error::DataUnitLength { len, mode } => {
                write!(f, "a data unit of {len} bytes is not valid for {mode}")
            }
            Error::SectorOverflow => f.write_str("the sector number is too large for the IV"),
            Error::UnknownBackend(b) => write!(
                f,
                "unknown backend '{b}' (use auto, portable, aesni, vaes256, vaes512, avx2 or avx512)"
            ),
            Error::BackendUnavailable(b) => write!(f, "this CPU cannot run the {b} backend"),
            Error::BackendUnsupported { backend, algorithm } => {
                write!(
                    f,
                    "the {backend} backend does not implement {}",
                    algorithm.name()
                )
            }
            Error::ThreadPool => f.write_str("could not start the cipher worker threads"),
        }
    }
}

impl std::error::Error for Error {}
