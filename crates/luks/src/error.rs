//! Errors of the LUKS layer, each one sentence and mapped by the CLI to cryptsetup's exit codes.

use std::fmt;

/// What went wrong reading or changing a LUKS header.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing the device failed.
    Io {
        /// The device's name.
        device: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The device has no LUKS header (wrong magic, or too small to hold one).
    NotLuks {
        /// The device's name.
        device: String,
    },
    /// The header is LUKS but damaged or inconsistent; the text says what.
    Corrupt(String),
    /// A valid header uses something sectorcrypt does not implement; the text says what.
    Unsupported(String),
    /// No keyslot opens with the given passphrase.
    WrongPassphrase,
    /// No keyslot could even be tried (none in use, all ignored or unbound, or of unknown
    /// types): cryptsetup's "No usable keyslot is available."; the text says why.
    NoUsableKeyslot(String),
    /// The cipher layer refused a keyslot or segment parameter.
    Cipher(sectorcrypt_cipher::Error),
    /// A digest over metadata does not verify with the right keys: the metadata was changed by
    /// someone without them (the reencryption digest of CVE-2021-4122). The text says which.
    DigestMismatch(String),
    /// A LUKS2 header copy needs recovery but the device also holds another signature (an LVM
    /// physical volume, a file system, a partition table): cryptsetup's "ambiguous signatures,
    /// cannot auto-recover LUKS2". Which one is current only the user can tell.
    AmbiguousSignatures {
        /// libblkid's name of the other signature.
        kind: String,
        /// The byte offset of its magic.
        offset: u64,
    },
    /// The header has mandatory requirements this implementation does not know (a newer
    /// cryptsetup's feature): it may be read, but nothing may write it or its data (cryptsetup's
    /// "Unmet LUKS2 requirements detected.").
    UnmetRequirements(Vec<String>),
    /// A conversion between LUKS1 and LUKS2 refused before writing anything; the text is
    /// cryptsetup's reason.
    CannotConvert(String),
    /// A conversion between LUKS1 and LUKS2 was interrupted: the device is in neither format
    /// until `crate::convert::convert` to the same version finishes it.
    ConversionInterrupted {
        /// The version it was converting to.
        to: u8,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { device, source } => write!(f, "I/O error on {device}: {source}"),
            Error::NotLuks { device } => write!(f, "{device} is not a LUKS device"),
            Error::Corrupt(what) => write!(f, "the LUKS header is damaged: {what}"),
            Error::Unsupported(what) => write!(f, "not supported: {what}"),
            Error::WrongPassphrase => f.write_str("no key available with this passphrase"),
            Error::NoUsableKeyslot(why) => write!(f, "no usable keyslot is available ({why})"),
            Error::Cipher(e) => write!(f, "{e}"),
            Error::AmbiguousSignatures { kind, offset } => write!(
                f,
                "the device contains ambiguous signatures: a {kind} signature (at byte {offset}) \
                 besides a LUKS2 header with a damaged or stale copy, so the header cannot be \
                 trusted or auto-recovered"
            ),
            Error::UnmetRequirements(names) => write!(
                f,
                "Unmet LUKS2 requirements detected ({}): the header may be read, not written.",
                names.join(", ")
            ),
            Error::CannotConvert(why) => f.write_str(why),
            Error::ConversionInterrupted { to } => write!(
                f,
                "a conversion to LUKS{to} was interrupted and the device is in neither format \
                 until it finishes (convert --type luks{to} finishes it)"
            ),
            Error::DigestMismatch(what) => write!(
                f,
                "{what} does not verify: the metadata was changed without the keys"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Cipher(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sectorcrypt_cipher::Error> for Error {
    fn from(e: sectorcrypt_cipher::Error) -> Self {
        Error::Cipher(e)
    }
}
