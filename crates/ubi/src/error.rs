//! What UBI can answer besides success.

use std::fmt;

/// A failed UBI operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The flash below failed in a way UBI could not work around.
    Flash(sectorcrypt_flash::Error),
    /// Attaching was refused: the flash holds something UBI must not touch (another format,
    /// too many corrupted PEBs, headers of another geometry or image); the text says what.
    Refused(String),
    /// Not enough free PEBs for what was asked.
    NoSpace(String),
    /// No such volume, a name or ID taken, impossible volume parameters; the text says what.
    Volume(String),
    /// A LEB, offset or length outside the volume, or not aligned to the minimum I/O unit.
    OutOfRange(String),
    /// A static volume's data fails its CRC, or a volume is marked as being updated.
    Corrupt(String),
    /// UBI went read-only (no PEB left to replace a bad one, or no sequence number left).
    ReadOnly,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Flash(e) => write!(f, "{e}"),
            Error::Refused(s) | Error::NoSpace(s) | Error::Volume(s) | Error::OutOfRange(s) => {
                f.write_str(s)
            }
            Error::Corrupt(s) => write!(f, "corrupted: {s}"),
            Error::ReadOnly => {
                f.write_str("UBI is read-only: no reserved PEB is left to replace a bad one")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Flash(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sectorcrypt_flash::Error> for Error {
    fn from(e: sectorcrypt_flash::Error) -> Self {
        Error::Flash(e)
    }
}
