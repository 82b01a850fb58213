//! LUKS2 authenticated encryption (`cryptsetup luksFormat --integrity`) in user space: the
//! dm-integrity format the kernel keeps below dm-crypt, and dm-crypt's per-block AEAD on top.
//!
//! A LUKS2 volume with integrity stores, from its data segment's offset on, a dm-integrity
//! device: a superblock ([`superblock`]), a journal ([`journal`]), then areas of packed tags and
//! data ([`layout`]). dm-crypt encrypts and authenticates each block with the sector number as
//! associated data and keeps the tag (and a random IV where the mode has one) in the block's tag
//! slot ([`mode`]). [`IntegrityDevice`] is the two together: reads hand out only blocks whose tag
//! verifies, writes go through the journal as the kernel's journal mode writes them, and a
//! journal left by a crash is replayed on opening exactly as the kernel replays it.
//!
//! What this protects: a block's data, its place (the sector number is authenticated) and, for
//! the random-IV modes, nothing more. An old block and its tag copied back to the same place
//! verify in every mode (cryptsetup's release notes say so: "Integrity protection of this type
//! cannot prevent a replay attack"); a block moved elsewhere or altered does not.

mod aegis;
mod batch;
mod device;
pub mod format;
mod journal;
pub mod layout;
pub mod mode;
pub mod superblock;

pub use device::IntegrityDevice;
pub use layout::Layout;
pub use mode::Mode;
pub use superblock::Superblock;

/// What can go wrong with an integrity device.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The device below failed.
    Io(std::io::Error),
    /// No integrity superblock where one should be.
    NotIntegrity,
    /// A superblock or layout the kernel would refuse.
    Format(String),
    /// A valid format this implementation does not handle (named).
    Unsupported(String),
    /// A key or cipher that does not fit the mode.
    Key(String),
    /// A block whose tag does not verify (the kernel's EILSEQ).
    Integrity {
        /// The block (in the volume's sectors).
        block: u64,
    },
    /// A request outside the device or not in whole blocks.
    Range(String),
    /// A write to a device opened read-only.
    ReadOnly,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "integrity device: {e}"),
            Error::NotIntegrity => write!(f, "no dm-integrity superblock at the data offset"),
            Error::Format(m) => write!(f, "integrity format: {m}"),
            Error::Unsupported(m) => write!(f, "unsupported: {m}"),
            Error::Key(m) => write!(f, "integrity key: {m}"),
            Error::Integrity { block } => {
                write!(f, "sector {block} fails its integrity check")
            }
            Error::Range(m) => write!(f, "integrity device: {m}"),
            Error::ReadOnly => write!(f, "the integrity device was opened read-only"),
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

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}
