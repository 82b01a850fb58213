//! What a flash operation can answer besides success, in MTD's terms.

use std::fmt;
use std::io;

/// A failed flash operation. The chip's own failures map to the results MTD gives UBI:
/// [`Error::Uncorrectable`] is `-EBADMSG` (the buffer still holds what was read),
/// [`Error::ProgramFailed`] and [`Error::EraseFailed`] are `-EIO` (UBI then tortures or marks the
/// block bad). Corrected bit-flips are not an error: see [`crate::ReadStatus`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An address or length outside the chip.
    OutOfRange(String),
    /// An offset or length not aligned to what the operation needs (sub-page for programs).
    Unaligned(String),
    /// A program that breaks a NAND rule: a page programmed more than NOP times, or a page below
    /// one already programmed in the same block.
    ProgramRule(String),
    /// The operation touched a block marked bad.
    BadBlock(u32),
    /// Too many bit-flips for the ECC (`-EBADMSG`).
    Uncorrectable {
        /// The eraseblock.
        peb: u32,
        /// The page within it.
        page: u32,
    },
    /// The chip reported a failed program (`-EIO`).
    ProgramFailed {
        /// The eraseblock.
        peb: u32,
        /// The page within it.
        page: u32,
    },
    /// The chip reported a failed erase (`-EIO`).
    EraseFailed(u32),
    /// The power was cut: this and every later operation fails until the device is reopened.
    PowerCut,
    /// Impossible geometry.
    Geometry(String),
    /// A file that is not what it should be (image header, dump size).
    Format(String),
    /// The storage under a simulated chip, a dump or an MTD device failed.
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfRange(s) | Error::Unaligned(s) | Error::ProgramRule(s) => f.write_str(s),
            Error::BadBlock(peb) => write!(f, "eraseblock {peb} is marked bad"),
            Error::Uncorrectable { peb, page } => write!(
                f,
                "uncorrectable bit-flips in page {page} of eraseblock {peb}"
            ),
            Error::ProgramFailed { peb, page } => {
                write!(f, "programming page {page} of eraseblock {peb} failed")
            }
            Error::EraseFailed(peb) => write!(f, "erasing eraseblock {peb} failed"),
            Error::PowerCut => f.write_str("the power was cut"),
            Error::Geometry(s) => write!(f, "invalid flash geometry: {s}"),
            Error::Format(s) => f.write_str(s),
            Error::Io(e) => write!(f, "flash storage: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}
