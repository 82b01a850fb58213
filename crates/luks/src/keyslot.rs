//! What LUKS1 and LUKS2 `luks2` keyslots share: the keyslot area holds the AF-split volume key,
//! encrypted in 512-byte sectors (IVs counted from the start of the area) with a key derived from
//! the passphrase; a digest of the volume key tells a right passphrase from a wrong one.

use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_cipher::{SectorCipher, SectorOptions};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;
use subtle::ConstantTimeEq;

use crate::af;
use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::Kdf;

/// Where and how a keyslot's material is stored.
#[derive(Clone, Debug)]
pub struct KeyslotArea {
    /// Byte offset of the area on the device.
    pub offset: u64,
    /// The cipher specification of the area (`aes-xts-plain64`, ...).
    pub cipher: String,
    /// Bytes of the area key (the key derived from the passphrase).
    pub key_size: usize,
    /// Bytes of the volume key stored in the area.
    pub volume_key_size: usize,
    /// AF stripes (4000 for everything cryptsetup writes).
    pub stripes: usize,
    /// AF diffusion hash.
    pub af_hash: Hash,
}

impl KeyslotArea {
    /// Bytes of AF material (before rounding up to whole sectors).
    pub fn material_len(&self) -> Result<usize, Error> {
        self.volume_key_size
            .checked_mul(self.stripes)
            .filter(|&n| n > 0 && n <= 64 << 20)
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "keyslot material of {} x {} bytes",
                    self.volume_key_size, self.stripes
                ))
            })
    }

    /// Bytes the area occupies on disk: the material rounded up to 512-byte sectors.
    pub fn disk_len(&self) -> Result<usize, Error> {
        Ok(self.material_len()?.div_ceil(512) * 512)
    }

    /// The area cipher keyed with `area_key`.
    fn cipher(&self, area_key: &[u8]) -> Result<SectorCipher, Error> {
        let spec = CipherSpec::parse(&self.cipher)?;
        Ok(SectorCipher::new(
            spec,
            area_key,
            &SectorOptions::default(),
        )?)
    }

    /// Derive the area key from `passphrase`, decrypt the area and merge the AF stripes: a
    /// candidate volume key (right only if the digest agrees).
    pub fn open(
        &self,
        dev: &dyn Storage,
        kdf: &Kdf,
        salt: &[u8],
        passphrase: &[u8],
    ) -> Result<SecretBytes, Error> {
        let area_key = kdf.derive(passphrase, salt, self.key_size)?;
        let mut material = SecretBytes::zeroed(self.disk_len()?);
        dev.read_at(&mut material, self.offset)
            .map_err(|source| Error::Io {
                device: dev.name(),
                source,
            })?;
        self.cipher(&area_key)?.decrypt(&mut material, 0)?;
        Ok(af::merge(
            &material[..self.material_len()?],
            self.volume_key_size,
            self.stripes,
            self.af_hash,
        ))
    }

    /// The on-disk bytes of a new keyslot holding `volume_key`, encrypted with the key derived from
    /// `passphrase` (the caller writes them at `offset`).
    pub fn seal(
        &self,
        kdf: &Kdf,
        salt: &[u8],
        passphrase: &[u8],
        volume_key: &[u8],
    ) -> Result<SecretBytes, Error> {
        let area_key = kdf.derive(passphrase, salt, self.key_size)?;
        let split = af::split(volume_key, self.stripes, self.af_hash);
        let mut material = SecretBytes::zeroed(self.disk_len()?);
        material[..split.len()].copy_from_slice(&split);
        self.cipher(&area_key)?.encrypt(&mut material, 0)?;
        Ok(material)
    }
}

/// `PBKDF2(candidate, salt, iterations)` compared in constant time with `expected`.
pub fn digest_matches(
    candidate: &[u8],
    hash: Hash,
    iterations: u32,
    salt: &[u8],
    expected: &[u8],
) -> Result<bool, Error> {
    let got = Kdf::Pbkdf2 { hash, iterations }.derive(candidate, salt, expected.len())?;
    Ok(bool::from(got[..].ct_eq(expected)))
}
