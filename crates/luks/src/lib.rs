//! LUKS2 and LUKS1 on-disk formats, byte compatible with cryptsetup: reading either header
//! version, opening keyslots with a passphrase and checking the volume key against the header's
//! digest.
//!
//! Modules follow cryptsetup's `lib/luks2/` split: [`luks2`] (binary header with its two copies,
//! JSON metadata), [`luks1`], [`keyslot`] (area encryption shared by both), [`af`] (the
//! anti-forensic splitter), [`kdf`] (PBKDF2, Argon2) and [`hash`].

#![forbid(unsafe_code)]

pub mod af;
pub mod error;
pub mod hash;
pub mod kdf;
pub mod keyslot;
pub mod luks1;
pub mod luks2;

pub use error::Error;

use sectorcrypt_storage::Storage;
use zeroize::Zeroizing;

/// A keyslot opened with a passphrase: which slot, and the volume key it holds (already checked
/// against the header's digest).
pub struct Unlocked {
    /// The keyslot number.
    pub slot: usize,
    /// The volume (master) key, zeroized on drop.
    pub volume_key: Zeroizing<Vec<u8>>,
}

/// A LUKS header of either version.
pub enum Header {
    /// LUKS1.
    Luks1(Box<luks1::Header>),
    /// LUKS2.
    Luks2(Box<luks2::Header>),
}

impl Header {
    /// Read the header of `dev`, whichever version it is. A damaged primary LUKS2 header is
    /// read from its secondary copy.
    pub fn read(dev: &dyn Storage) -> Result<Self, Error> {
        let mut start = [0u8; 8];
        let len = dev.len().map_err(|source| Error::Io {
            device: dev.name(),
            source,
        })?;
        if len >= start.len() as u64 {
            dev.read_at(&mut start, 0).map_err(|source| Error::Io {
                device: dev.name(),
                source,
            })?;
        }
        // Only a primary LUKS1 header says version 1; everything else (a LUKS2 primary, or a
        // wiped primary whose secondary survives) is for the LUKS2 reader to judge.
        if start[..6] == luks1::MAGIC && start[6..8] == [0, 1] {
            return luks1::Header::read(dev).map(|h| Header::Luks1(Box::new(h)));
        }
        luks2::Header::read(dev).map(|h| Header::Luks2(Box::new(h)))
    }

    /// 1 or 2.
    pub fn version(&self) -> u8 {
        match self {
            Header::Luks1(_) => 1,
            Header::Luks2(_) => 2,
        }
    }

    /// The volume UUID.
    pub fn uuid(&self) -> &str {
        match self {
            Header::Luks1(h) => h.uuid(),
            Header::Luks2(h) => h.uuid(),
        }
    }

    /// Open a keyslot (`slot`, or any) with `passphrase`.
    pub fn unlock(
        &self,
        dev: &dyn Storage,
        passphrase: &[u8],
        slot: Option<usize>,
    ) -> Result<Unlocked, Error> {
        match self {
            Header::Luks1(h) => h.unlock(dev, passphrase, slot),
            Header::Luks2(h) => h.unlock(dev, passphrase, slot),
        }
    }

    /// The header as `cryptsetup luksDump DEVICE` prints it, headline included (LUKS1 names the
    /// device there, LUKS2 does not).
    pub fn dump_text(&self, device: &str) -> String {
        match self {
            Header::Luks1(h) => {
                format!("LUKS header information for {device}\n\n{}", h.dump_text())
            }
            Header::Luks2(h) => h.dump_text(),
        }
    }

    /// The header as JSON (LUKS2: the metadata plus the binary-header fields).
    pub fn dump_json(&self) -> serde_json::Value {
        match self {
            Header::Luks1(h) => h.dump_json(),
            Header::Luks2(h) => h.dump_json(),
        }
    }
}
