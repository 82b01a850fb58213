//! The per-block authenticated encryption dm-crypt runs over dm-integrity
//! (`crypt_convert_block_aead`), for the modes cryptsetup's `--integrity` formats.
//!
//! Each block is one AEAD message. Its associated data is the block's 512-byte sector number
//! (little-endian, 8 bytes: LUKS2 counts IVs in 512-byte units whatever the sector size) followed
//! by its IV; the tuple stored in the tag area is the authentication tag, then the IV for the
//! `-random` modes (which draw a new one at every write):
//!
//! | LUKS2 encryption + integrity | kernel cipher | key | tuple |
//! |---|---|---|---|
//! | `aes-xts-plain64` + `hmac(sha256)` | `authenc(hmac(sha256),xts(aes))` | XTS key, then 32-byte MAC key | HMAC (32) |
//! | `aes-xts-plain64` + `hmac(sha512)` | `authenc(hmac(sha512),xts(aes))` | XTS key, then 64-byte MAC key | HMAC (64) |
//! | `aes-xts-plain64` + `hmac(sha1)` | `authenc(hmac(sha1),xts(aes))` | XTS key, then 20-byte MAC key | HMAC (20) |
//! | `aes-gcm-random` + `aead` | `gcm(aes)` | 16 or 32 bytes | tag (16), IV (12) |
//! | `chacha20-random` + `poly1305` | `rfc7539(chacha20,poly1305)` | 32 bytes | tag (16), IV (12) |
//! | `aegis128-random` + `aead` | `aegis128` ([`crate::aegis`]) | 16 bytes | tag (16), IV (16) |
//!
//! For `authenc` the IV is plain64 (the sector number, 16 bytes), the block is encrypted with
//! XTS and the HMAC covers the associated data and the ciphertext (encrypt-then-MAC). A tag is
//! checked in constant time before anything is decrypted; a block that fails is never handed out.

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes128Gcm, Aes256Gcm, Nonce, Tag};
use chacha20poly1305::ChaCha20Poly1305;
use hmac::{Hmac, Mac};
use sectorcrypt_cipher::gcm::AesGcm;
use sectorcrypt_cipher::{BackendChoice, CipherSpec, SectorCipher, SectorOptions};
use sectorcrypt_secret::{SecretBox, SecretBytes};
use sha1::Sha1;
use sha2::{Sha256, Sha512};
use subtle::ConstantTimeEq;

use crate::Error;

/// A block's tag did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch;

enum Kind {
    HmacXts {
        xts: SectorCipher,
        mac_key: SecretBytes,
        hash: HmacHash,
    },
    /// This project's GCM (VAES or AES-NI, and an eight-way GHASH), where the CPU has a
    /// carry-less multiply.
    AesGcm(AesGcm),
    /// RustCrypto's portable, constant-time GCM elsewhere.
    AesGcm128(SecretBox<Aes128Gcm>),
    AesGcm256(SecretBox<Aes256Gcm>),
    ChaCha20Poly1305(SecretBox<ChaCha20Poly1305>),
    Aegis128(SecretBox<[u8; 16]>),
}

/// The hash of an HMAC.
#[derive(Clone, Copy)]
enum HmacHash {
    Sha1,
    Sha256,
    Sha512,
}

impl HmacHash {
    /// Bytes of its digest: the tag, and the MAC key cryptsetup gives it.
    fn bytes(self) -> usize {
        match self {
            HmacHash::Sha1 => 20,
            HmacHash::Sha256 => 32,
            HmacHash::Sha512 => 64,
        }
    }
}

/// One volume's authenticated encryption, keyed.
pub struct Mode {
    kind: Kind,
    block_size: usize,
}

impl std::fmt::Debug for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mode")
            .field("name", &self.name())
            .field("block_size", &self.block_size)
            .finish_non_exhaustive()
    }
}

/// Bytes of an AEAD's authentication tag.
const AEAD_TAG: usize = 16;
/// Bytes of the random IV of GCM and ChaCha20-Poly1305.
const AEAD_IV: usize = 12;
/// Bytes of AEGIS-128's random IV.
const AEGIS_IV: usize = 16;

impl Mode {
    /// The mode of a LUKS2 segment whose `encryption` is `encryption` and whose integrity type
    /// is `integrity`, under the volume key `key`, for blocks of `block_size` bytes.
    ///
    /// Errors: [`Error::Unsupported`] for other combinations; [`Error::Key`] for a key of the
    /// wrong size.
    pub fn new(
        encryption: &str,
        integrity: &str,
        key: &[u8],
        block_size: usize,
    ) -> Result<Mode, Error> {
        // Key schedules are built on the stack and in the vector registers.
        sectorcrypt_cipher::wiping(|| Mode::make(encryption, integrity, key, block_size))
    }

    fn make(
        encryption: &str,
        integrity: &str,
        key: &[u8],
        block_size: usize,
    ) -> Result<Mode, Error> {
        let key_error = |want: &str| {
            Error::Key(format!(
                "{encryption} with {integrity} takes {want}, not a {}-byte key",
                key.len()
            ))
        };
        let kind = match (encryption, integrity) {
            ("aes-xts-plain64", "hmac(sha1)" | "hmac(sha256)" | "hmac(sha512)") => {
                let hash = match integrity {
                    "hmac(sha1)" => HmacHash::Sha1,
                    "hmac(sha256)" => HmacHash::Sha256,
                    _ => HmacHash::Sha512,
                };
                let mac_len = hash.bytes();
                if !matches!(key.len().checked_sub(mac_len), Some(32 | 64)) {
                    return Err(key_error(&format!(
                        "an XTS key of 32 or 64 bytes and a {mac_len}-byte MAC key"
                    )));
                }
                let (xts_key, mac_key) = key.split_at(key.len() - mac_len);
                let options = SectorOptions {
                    sector_size: block_size,
                    iv_large_sectors: false,
                    ..SectorOptions::default()
                };
                let spec = CipherSpec::parse(encryption).map_err(|e| Error::Key(e.to_string()))?;
                Kind::HmacXts {
                    xts: SectorCipher::new(spec, xts_key, &options)
                        .map_err(|e| Error::Key(e.to_string()))?,
                    mac_key: SecretBytes::from_slice(mac_key),
                    hash,
                }
            }
            ("aes-gcm-random", "aead") => match key.len() {
                16 | 32 if AesGcm::available() => Kind::AesGcm(
                    AesGcm::new(key, BackendChoice::Auto)
                        .ok_or_else(|| key_error("16 or 32 bytes"))?,
                ),
                16 => Kind::AesGcm128(
                    SecretBox::try_init(|| Aes128Gcm::new_from_slice(key).ok())
                        .ok_or_else(|| key_error("16 or 32 bytes"))?,
                ),
                32 => Kind::AesGcm256(
                    SecretBox::try_init(|| Aes256Gcm::new_from_slice(key).ok())
                        .ok_or_else(|| key_error("16 or 32 bytes"))?,
                ),
                _ => return Err(key_error("16 or 32 bytes")),
            },
            // Built where `try_init` wipes: a ChaCha20-Poly1305 holds the key itself.
            ("chacha20-random", "poly1305") => Kind::ChaCha20Poly1305(
                SecretBox::try_init(|| ChaCha20Poly1305::new_from_slice(key).ok())
                    .ok_or_else(|| key_error("32 bytes"))?,
            ),
            ("aegis128-random", "aead") => Kind::Aegis128(
                SecretBox::try_init(|| <[u8; 16]>::try_from(key).ok())
                    .ok_or_else(|| key_error("16 bytes (--key-size 128)"))?,
            ),
            _ => {
                return Err(Error::Unsupported(format!(
                    "{encryption} with integrity {integrity} (supported: aes-xts-plain64 with \
                     hmac(sha1), hmac(sha256) or hmac(sha512), aes-gcm-random or aegis128-random with aead, \
                     chacha20-random with poly1305)"
                )))
            }
        };
        Ok(Mode { kind, block_size })
    }

    /// cryptsetup's name of the mode's integrity part.
    pub fn name(&self) -> &'static str {
        match &self.kind {
            Kind::HmacXts { hash, .. } => match hash {
                HmacHash::Sha1 => "aes-xts-plain64 hmac(sha1)",
                HmacHash::Sha256 => "aes-xts-plain64 hmac(sha256)",
                HmacHash::Sha512 => "aes-xts-plain64 hmac(sha512)",
            },
            Kind::AesGcm(_) | Kind::AesGcm128(_) | Kind::AesGcm256(_) => "aes-gcm-random aead",
            Kind::ChaCha20Poly1305(_) => "chacha20-random poly1305",
            Kind::Aegis128(_) => "aegis128-random aead",
        }
    }

    /// Bytes of the tuple stored per block (the superblock's tag size).
    pub fn tag_size(&self) -> usize {
        match &self.kind {
            Kind::HmacXts { hash, .. } => hash.bytes(),
            Kind::Aegis128(_) => AEAD_TAG + AEGIS_IV,
            _ => AEAD_TAG + AEAD_IV,
        }
    }

    /// Bytes of IV a write draws at random (0: the IV is the sector number).
    pub fn random_iv_size(&self) -> usize {
        match &self.kind {
            Kind::HmacXts { .. } => 0,
            Kind::Aegis128(_) => AEGIS_IV,
            _ => AEAD_IV,
        }
    }

    /// Bytes per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Check block `data` (ciphertext) at 512-byte sector `sector` against its stored `tuple`
    /// and decrypt it in place. On a mismatch `data` is zeroed.
    pub fn open(&self, sector: u64, data: &mut [u8], tuple: &[u8]) -> Result<(), Mismatch> {
        debug_assert_eq!(data.len(), self.block_size);
        let result = sectorcrypt_cipher::wiping(|| self.open_inner(sector, data, tuple));
        if result.is_err() {
            data.fill(0);
        }
        result
    }

    fn open_inner(&self, sector: u64, data: &mut [u8], tuple: &[u8]) -> Result<(), Mismatch> {
        if tuple.len() != self.tag_size() {
            return Err(Mismatch);
        }
        match &self.kind {
            Kind::HmacXts { xts, mac_key, hash } => {
                let want = hmac_tag(mac_key, *hash, sector, data);
                if !bool::from(want.as_slice().ct_eq(tuple)) {
                    return Err(Mismatch);
                }
                xts.decrypt(data, sector >> self.log2_sectors_per_block())
                    .map_err(|_| Mismatch)
            }
            Kind::AesGcm(gcm) => {
                let (tag, iv) = tuple.split_at(AEAD_TAG);
                let nonce: &[u8; AEAD_IV] = iv.try_into().map_err(|_| Mismatch)?;
                let tag: &[u8; AEAD_TAG] = tag.try_into().map_err(|_| Mismatch)?;
                let aad = associated_data::<{ 8 + AEAD_IV }>(sector, nonce);
                gcm.open(nonce, &aad, data, tag)
                    .then_some(())
                    .ok_or(Mismatch)
            }
            Kind::AesGcm128(c) => aead_open(&**c, sector, data, tuple),
            Kind::AesGcm256(c) => aead_open(&**c, sector, data, tuple),
            Kind::ChaCha20Poly1305(c) => aead_open(&**c, sector, data, tuple),
            Kind::Aegis128(key) => {
                let (tag, iv) = tuple.split_at(AEAD_TAG);
                let nonce: &[u8; AEGIS_IV] = iv.try_into().map_err(|_| Mismatch)?;
                crate::aegis::open(
                    key,
                    nonce,
                    &associated_data::<{ 8 + AEGIS_IV }>(sector, nonce),
                    data,
                    tag,
                )
                .then_some(())
                .ok_or(Mismatch)
            }
        }
    }

    /// [`Mode::open`] for consecutive blocks: `data` holds whole blocks from 512-byte sector
    /// `sector` and `tuples` their stored tuples, one after another. Every block that verifies
    /// is decrypted and every other one zeroed; the first that did not, by its position.
    pub fn open_blocks(&self, sector: u64, data: &mut [u8], tuples: &[u8]) -> Result<(), usize> {
        // One wipe for the request: the calls for its blocks share it.
        sectorcrypt_cipher::wiping(|| self.open_each(sector, data, tuples))
    }

    fn open_each(&self, sector: u64, data: &mut [u8], tuples: &[u8]) -> Result<(), usize> {
        let (bs, ts) = (self.block_size, self.tag_size());
        let step = (bs / 512) as u64;
        let n = data.len() / bs;
        debug_assert!(data.len().is_multiple_of(bs) && tuples.len() == n * ts);
        let mut refused = Vec::new();
        match &self.kind {
            Kind::AesGcm(gcm) => {
                let blocks = data.chunks_mut(bs).zip(tuples.chunks(ts)).enumerate();
                gcm.open_each(
                    blocks.map(|(k, (block, tuple))| {
                        let (tag, iv) = tuple.split_at(AEAD_TAG);
                        let nonce: &[u8; AEAD_IV] = iv.try_into().expect("a tuple's IV");
                        let aad =
                            associated_data::<{ 8 + AEAD_IV }>(sector + k as u64 * step, nonce);
                        (nonce, aad, block, tag.try_into().expect("a tuple's tag"))
                    }),
                    |k| refused.push(k),
                );
                for &k in &refused {
                    data[k * bs..(k + 1) * bs].fill(0);
                }
            }
            _ => {
                for (k, (block, tuple)) in data.chunks_mut(bs).zip(tuples.chunks(ts)).enumerate() {
                    if self.open(sector + k as u64 * step, block, tuple).is_err() {
                        refused.push(k);
                    }
                }
            }
        }
        refused.first().map_or(Ok(()), |&k| Err(k))
    }

    /// [`Mode::seal`] for consecutive blocks: `data` holds whole blocks from 512-byte sector
    /// `sector`, `tuples` gets their tuples and `ivs` holds their random IVs, one after another.
    /// With this crate's AES-GCM, the request is one call (one clearing of what the kernels
    /// leave behind).
    ///
    /// Errors: [`Error::Key`] if the sizes do not match.
    pub fn seal_blocks(
        &self,
        sector: u64,
        data: &mut [u8],
        tuples: &mut [u8],
        ivs: &[u8],
    ) -> Result<(), Error> {
        let (bs, ts, is) = (self.block_size, self.tag_size(), self.random_iv_size());
        let n = data.len() / bs;
        if !data.len().is_multiple_of(bs) || tuples.len() != n * ts || ivs.len() != n * is {
            return Err(Error::Key(format!(
                "{} bytes of blocks, {} of tuples and {} of IVs for {}",
                data.len(),
                tuples.len(),
                ivs.len(),
                self.name()
            )));
        }
        let step = (bs / 512) as u64;
        // One wipe for the request: the calls for its blocks share it.
        sectorcrypt_cipher::wiping(|| {
            // Not `chunks(is)`: plain64 modes have no IV bytes.
            let ivs = (0..n).map(|k| &ivs[k * is..(k + 1) * is]);
            let blocks = data.chunks_mut(bs).zip(tuples.chunks_mut(ts)).zip(ivs);
            if let Kind::AesGcm(gcm) = &self.kind {
                gcm.seal_each(blocks.enumerate().map(|(k, ((block, tuple), iv))| {
                    let nonce: &[u8; AEAD_IV] = iv.try_into().expect("checked above");
                    let (tag, rest) = tuple.split_at_mut(AEAD_TAG);
                    rest.copy_from_slice(iv);
                    let aad = associated_data::<{ 8 + AEAD_IV }>(sector + k as u64 * step, nonce);
                    (nonce, aad, block, tag.try_into().expect("a tag's bytes"))
                }));
                return Ok(());
            }
            for (k, ((block, tuple), iv)) in blocks.enumerate() {
                self.seal(sector + k as u64 * step, block, tuple, iv)?;
            }
            Ok(())
        })
    }

    /// Encrypt block `data` in place for 512-byte sector `sector` and write its tuple into
    /// `tuple`; `iv` is the random IV ([`Mode::random_iv_size`] bytes, empty for plain64).
    ///
    /// Errors: [`Error::Key`] if `iv` or `tuple` has the wrong size.
    pub fn seal(
        &self,
        sector: u64,
        data: &mut [u8],
        tuple: &mut [u8],
        iv: &[u8],
    ) -> Result<(), Error> {
        if tuple.len() != self.tag_size() || iv.len() != self.random_iv_size() {
            return Err(Error::Key(format!(
                "a tuple of {} bytes and an IV of {} for {}",
                self.tag_size(),
                self.random_iv_size(),
                self.name()
            )));
        }
        sectorcrypt_cipher::wiping(|| match &self.kind {
            Kind::HmacXts { xts, mac_key, hash } => {
                xts.encrypt(data, sector >> self.log2_sectors_per_block())
                    .map_err(|e| Error::Key(e.to_string()))?;
                tuple.copy_from_slice(&hmac_tag(mac_key, *hash, sector, data));
                Ok(())
            }
            Kind::AesGcm(gcm) => {
                let nonce: &[u8; AEAD_IV] = iv.try_into().expect("checked above");
                let aad = associated_data::<{ 8 + AEAD_IV }>(sector, nonce);
                tuple[..AEAD_TAG].copy_from_slice(&gcm.seal(nonce, &aad, data));
                tuple[AEAD_TAG..].copy_from_slice(iv);
                Ok(())
            }
            Kind::AesGcm128(c) => aead_seal(&**c, sector, data, tuple, iv),
            Kind::AesGcm256(c) => aead_seal(&**c, sector, data, tuple, iv),
            Kind::ChaCha20Poly1305(c) => aead_seal(&**c, sector, data, tuple, iv),
            Kind::Aegis128(key) => {
                let nonce: &[u8; AEGIS_IV] = iv.try_into().expect("checked above");
                let tag = crate::aegis::seal(
                    key,
                    nonce,
                    &associated_data::<{ 8 + AEGIS_IV }>(sector, nonce),
                    data,
                );
                tuple[..AEAD_TAG].copy_from_slice(&tag);
                tuple[AEAD_TAG..].copy_from_slice(iv);
                Ok(())
            }
        })
    }

    fn log2_sectors_per_block(&self) -> u32 {
        (self.block_size / 512).trailing_zeros()
    }
}

/// `authenc`'s tag: HMAC over the associated data (sector, plain64 IV) and the ciphertext.
fn hmac_tag(key: &[u8], hash: HmacHash, sector: u64, ciphertext: &[u8]) -> Vec<u8> {
    let mut iv = [0u8; 16];
    iv[..8].copy_from_slice(&sector.to_le_bytes());
    let sector = sector.to_le_bytes();
    macro_rules! hmac {
        ($key:expr, $hash:ty) => {{
            let mut mac = <Hmac<$hash> as Mac>::new_from_slice($key).expect("HMAC takes any key");
            mac.update(&sector);
            mac.update(&iv);
            mac.update(ciphertext);
            mac.finalize().into_bytes().to_vec()
        }};
    }
    match hash {
        HmacHash::Sha1 => hmac!(key, Sha1),
        HmacHash::Sha256 => hmac!(key, Sha256),
        HmacHash::Sha512 => hmac!(key, Sha512),
    }
}

/// The associated data of a random-IV block: the sector, then the IV (`N` is 8 plus its size).
fn associated_data<const N: usize>(sector: u64, iv: &[u8]) -> [u8; N] {
    let mut aad = [0u8; N];
    aad[..8].copy_from_slice(&sector.to_le_bytes());
    aad[8..].copy_from_slice(iv);
    aad
}

fn aead_open<A: AeadInPlace>(
    cipher: &A,
    sector: u64,
    data: &mut [u8],
    tuple: &[u8],
) -> Result<(), Mismatch> {
    let (tag, iv) = tuple.split_at(AEAD_TAG);
    cipher
        .decrypt_in_place_detached(
            Nonce::from_slice(iv),
            &associated_data::<{ 8 + AEAD_IV }>(sector, iv),
            data,
            Tag::from_slice(tag),
        )
        .map_err(|_| Mismatch)
}

fn aead_seal<A: AeadInPlace>(
    cipher: &A,
    sector: u64,
    data: &mut [u8],
    tuple: &mut [u8],
    iv: &[u8],
) -> Result<(), Error> {
    let tag = cipher
        .encrypt_in_place_detached(
            Nonce::from_slice(iv),
            &associated_data::<{ 8 + AEAD_IV }>(sector, iv),
            data,
        )
        .map_err(|_| Error::Key("the AEAD refused a block".into()))?;
    tuple[..AEAD_TAG].copy_from_slice(&tag);
    tuple[AEAD_TAG..].copy_from_slice(iv);
    Ok(())
}
