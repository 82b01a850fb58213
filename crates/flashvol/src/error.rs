//! What can go wrong with an encrypted flash.

use std::fmt;

/// A failed operation on an encrypted flash.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The chip has no encrypted-flash header (the text says what it has instead).
    NotEncrypted(String),
    /// The header was made for another chip, or the chip is too small.
    Geometry(String),
    /// An option an encrypted flash cannot take.
    Unsupported(String),
    /// The LUKS2 header refused (wrong passphrase, bad options...).
    Luks(sectorcrypt_luks::Error),
    /// The flash failed.
    Flash(sectorcrypt_flash::Error),
    /// UBI failed or refused.
    Ubi(sectorcrypt_ubi::Error),
    /// The cipher refused the header's spec.
    Cipher(sectorcrypt_cipher::Error),
    /// The header area failed.
    Storage(std::io::Error),
    /// An in-place conversion is in progress: the flash is usable again once it ends.
    Converting(crate::convert::Stage),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotEncrypted(s) => write!(f, "not an encrypted flash: {s}"),
            Error::Geometry(s) | Error::Unsupported(s) => f.write_str(s),
            Error::Luks(e) => write!(f, "{e}"),
            Error::Flash(e) => write!(f, "{e}"),
            Error::Ubi(e) => write!(f, "UBI: {e}"),
            Error::Cipher(e) => write!(f, "{e}"),
            Error::Storage(e) => write!(f, "header area: {e}"),
            Error::Converting(stage) => write!(
                f,
                "an in-place conversion of this flash is in progress ({}): run '{}' again to \
                 finish it",
                stage.name(),
                stage.resume_command()
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Luks(e) => Some(e),
            Error::Flash(e) => Some(e),
            Error::Ubi(e) => Some(e),
            Error::Cipher(e) => Some(e),
            Error::Storage(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sectorcrypt_luks::Error> for Error {
    fn from(e: sectorcrypt_luks::Error) -> Self {
        Error::Luks(e)
    }
}

impl From<sectorcrypt_flash::Error> for Error {
    fn from(e: sectorcrypt_flash::Error) -> Self {
        Error::Flash(e)
    }
}

impl From<sectorcrypt_ubi::Error> for Error {
    fn from(e: sectorcrypt_ubi::Error) -> Self {
        Error::Ubi(e)
    }
}

impl From<sectorcrypt_cipher::Error> for Error {
    fn from(e: sectorcrypt_cipher::Error) -> Self {
        Error::Cipher(e)
    }
}
