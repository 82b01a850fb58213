//! Formatting a device as LUKS2 (`cryptsetup luksFormat --type luks2`): the layout planned and
//! every parameter checked before anything is written, then the areas wiped, the keyslot
//! written and synced, and both header copies written (`write.rs` orders those writes).

use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;
use serde_json::Map;

use super::binary::{BIN_LEN, HDR_SIZES};
use super::limits::{
    DATA_ALIGNMENT, DEFAULT_HDR_AND_AREAS, DIGEST_ITER_TIME_MS, KDF_SALT_LEN, KEYSLOTS_MAX,
    KEYSLOTS_SIZE_MAX,
};
use super::metadata::{
    Config, CryptSegment, Digest, Keyslot, Luks2Keyslot, Metadata, Numbered, Pbkdf2Digest,
    SegmentEntry,
};
use super::pbkdf::Pbkdf;
use super::write::{
    check_cipher, erase_old_headers, io, keyslot_area_size, make_keyslot, random_bytes,
    random_salt, text_field, wipe, write_metadata, BinaryFields,
};
use super::Header;
use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::{self, Kdf};
use crate::Unlocked;

/// The keyslot areas' cipher on a volume with integrity (cryptsetup's default keyslot cipher).
pub(crate) const INTEGRITY_KEYSLOT_CIPHER: &str = "aes-xts-plain64";
/// Its key length in bytes.
pub(crate) const INTEGRITY_KEYSLOT_KEY_LEN: usize = 64;

/// What `cryptsetup luksFormat --type luks2` is told.
#[derive(Clone, Debug)]
pub struct FormatParams {
    /// The data cipher (`aes-xts-plain64`); keyslot areas use it too, as cryptsetup's do.
    pub cipher: String,
    /// Volume key size in bits (512 for AES-256-XTS).
    pub key_bits: usize,
    /// Encryption sector size; `None` is cryptsetup's choice for files: 4096 when the data area
    /// is a multiple of 4096 bytes, else 512.
    pub sector_size: Option<u32>,
    /// The new keyslot's KDF.
    pub pbkdf: Pbkdf,
    /// Hash of the volume-key digest and the AF splitter.
    pub hash: Hash,
    /// Label (at most 47 bytes).
    pub label: Option<String>,
    /// Subsystem (at most 47 bytes).
    pub subsystem: Option<String>,
    /// UUID; random if `None`.
    pub uuid: Option<String>,
    /// Keyslot number for the passphrase (default the first, 0).
    pub keyslot: Option<usize>,
    /// The volume key; random if `None`.
    pub volume_key: Option<SecretBytes>,
    /// Bytes of one header copy (`--luks2-metadata-size`, 16 KiB to 4 MiB); default 16 KiB.
    pub metadata_size: Option<u64>,
    /// Bytes of the keyslots area (`--luks2-keyslots-size`); default fills 16 MiB.
    pub keyslots_size: Option<u64>,
    /// The header lives on its own device (`--header`): the data starts at offset 0 of the data
    /// device, which is not `dev`.
    pub detached_header: bool,
    /// Bytes of the data device, if it is not `dev` itself or not yet the size it will be (a
    /// header built in memory for a device): the data area is this minus the data offset.
    pub data_device_size: Option<u64>,
    /// Where the data starts (`--offset`, bytes, a multiple of 4096) instead of after the
    /// header, aligned to 1 MiB; the default keyslots area shrinks to fit before it.
    pub data_offset: Option<u64>,
    /// Authenticated encryption (`--integrity`): the segment's integrity type as cryptsetup
    /// stores it (`hmac(sha256)`, `hmac(sha512)`, `aead`, `poly1305`). The volume key is then the
    /// cipher's key followed by the MAC key (`key_bits` counts both), the cipher is not checked
    /// here (the caller checks the pair), and keyslot areas use `aes-xts-plain64` with a 512-bit
    /// key, as cryptsetup's keyslots cannot use an authenticated cipher.
    pub integrity: Option<String>,
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            cipher: "aes-xts-plain64".into(),
            key_bits: 512,
            sector_size: None,
            pbkdf: Pbkdf::default(),
            hash: Hash::Sha256,
            label: None,
            subsystem: None,
            uuid: None,
            keyslot: None,
            volume_key: None,
            metadata_size: None,
            keyslots_size: None,
            detached_header: false,
            data_device_size: None,
            data_offset: None,
            integrity: None,
        }
    }
}

/// Where a new header puts everything, from the parameters and the device's length.
struct Geometry {
    /// One header copy (binary header and JSON area).
    hdr_size: u64,
    /// Both copies: where the keyslots area starts.
    min_offset: u64,
    keyslots_size: u64,
    data_offset: u64,
    sector_size: u32,
}

impl Geometry {
    /// cryptsetup's layout rules (`LUKS2_generate_hdr`), each refusal with its reason.
    fn plan(params: &FormatParams, dev_len: u64) -> Result<Geometry, Error> {
        let hdr_size = params.metadata_size.unwrap_or(HDR_SIZES[0]);
        if !HDR_SIZES.contains(&hdr_size) {
            return Err(Error::Unsupported(format!(
                "a metadata size of {hdr_size} bytes (a power of two from 16 KiB to 4 MiB)"
            )));
        }
        let min_offset = 2 * hdr_size;
        if let Some(off) = params.data_offset {
            if !off.is_multiple_of(4096) || (!params.detached_header && off < min_offset + 4096) {
                return Err(Error::Unsupported(format!(
                    "a data offset of {off} bytes (a multiple of 4 KiB past the {min_offset}-byte \
                     metadata and a keyslots area)"
                )));
            }
        }
        let keyslots_size = Self::keyslots_size(params, dev_len, min_offset)?;
        let data_offset = match params.data_offset {
            Some(off) if !params.detached_header && off < min_offset + keyslots_size => {
                return Err(Error::Unsupported(format!(
                    "a data offset of {off} bytes inside the {}-byte header",
                    min_offset + keyslots_size
                )))
            }
            Some(off) => off,
            None if params.detached_header => 0,
            None => (min_offset + keyslots_size).div_ceil(DATA_ALIGNMENT) * DATA_ALIGNMENT,
        };
        let header_len = min_offset + keyslots_size;
        let data_size = match params.data_device_size {
            Some(d) => d.checked_sub(data_offset),
            None if params.detached_header => None,
            None => dev_len.checked_sub(data_offset),
        };
        let needed = if params.detached_header {
            header_len
        } else {
            data_offset + 512
        };
        if dev_len < header_len || (!params.detached_header && data_size.is_none_or(|d| d < 512)) {
            return Err(Error::Corrupt(format!(
                "the device has {} bytes but the LUKS2 header needs at least {needed}",
                params.data_device_size.unwrap_or(dev_len)
            )));
        }
        Ok(Geometry {
            hdr_size,
            min_offset,
            keyslots_size,
            data_offset,
            sector_size: Self::sector_size(params.sector_size, data_size)?,
        })
    }

    /// The keyslots area: as asked, else cryptsetup's default, less on a small detached header
    /// file or before a requested data offset.
    fn keyslots_size(params: &FormatParams, dev_len: u64, min_offset: u64) -> Result<u64, Error> {
        match params.keyslots_size {
            Some(k) if !k.is_multiple_of(4096) || k == 0 || k > KEYSLOTS_SIZE_MAX => {
                Err(Error::Unsupported(format!(
                    "a keyslots area of {k} bytes (a multiple of 4 KiB up to 128 MiB)"
                )))
            }
            Some(k) => Ok(k),
            None => {
                let mut k = DEFAULT_HDR_AND_AREAS - min_offset;
                // A detached header file smaller than the default gets what fits (cryptsetup
                // would first try to grow the file).
                if params.detached_header && dev_len < DEFAULT_HDR_AND_AREAS && dev_len > min_offset
                {
                    k = (dev_len - min_offset) / 4096 * 4096;
                }
                // ... and a requested data offset the area must end before.
                Ok(match params.data_offset {
                    Some(off) if !params.detached_header => k.min(off - min_offset),
                    _ => k,
                })
            }
        }
    }

    /// The encryption sector: as asked (a power of two from 512 to 4096 dividing the data), else
    /// 4096 where the data is a multiple of it, 512 otherwise.
    fn sector_size(asked: Option<u32>, data_size: Option<u64>) -> Result<u32, Error> {
        match asked {
            Some(s) if !(512..=4096).contains(&s) || !s.is_power_of_two() => {
                Err(Error::Unsupported(format!(
                    "a sector size of {s} (a power of two from 512 to 4096)"
                )))
            }
            Some(s) if data_size.is_some_and(|d| !d.is_multiple_of(u64::from(s))) => {
                Err(Error::Unsupported(format!(
                    "a sector size of {s} for a data area that is not a multiple of it"
                )))
            }
            Some(s) => Ok(s),
            None if data_size.is_some_and(|d| d.is_multiple_of(4096)) => Ok(4096),
            None => Ok(512),
        }
    }
}

/// The volume key: the one given (of the size asked for) or a random one.
fn volume_key(params: &FormatParams) -> Result<SecretBytes, Error> {
    if params.key_bits == 0 || !params.key_bits.is_multiple_of(8) || params.key_bits > 1024 * 8 {
        return Err(Error::Unsupported(format!(
            "a volume key of {} bits",
            params.key_bits
        )));
    }
    match &params.volume_key {
        Some(k) if k.len() * 8 != params.key_bits => Err(Error::Unsupported(format!(
            "a volume key of {} bits where {} were asked for",
            k.len() * 8,
            params.key_bits
        ))),
        Some(k) => Ok(SecretBytes::from_slice(k)),
        None => Ok(random_bytes(params.key_bits / 8)),
    }
}

/// The binary header's fields of the first metadata version.
fn first_fields(params: &FormatParams, hdr_size: u64) -> Result<BinaryFields, Error> {
    let uuid = match &params.uuid {
        Some(u) => crate::uuid::normalize(u)?,
        None => crate::uuid::random(),
    };
    let mut uuid_field = [0u8; super::binary::UUID_LEN];
    uuid_field[..uuid.len()].copy_from_slice(uuid.as_bytes());
    let mut checksum_alg = [0u8; super::binary::CHECKSUM_ALG_LEN];
    checksum_alg[..6].copy_from_slice(b"sha256");
    Ok(BinaryFields {
        hdr_size,
        seqid: 1,
        label: text_field(params.label.as_deref().unwrap_or(""), "label")?,
        subsystem: text_field(params.subsystem.as_deref().unwrap_or(""), "subsystem")?,
        uuid: uuid_field,
        checksum_alg,
        salts: [random_salt(), random_salt()],
    })
}

/// The volume key's digest (`PBKDF2_digest_store`) for `slot`: benchmarked unless the keyslot
/// cost is forced.
fn volume_key_digest(
    params: &FormatParams,
    volume_key: &[u8],
    slot: usize,
) -> Result<Pbkdf2Digest, Error> {
    let iterations = if params.pbkdf.forced_iterations.is_some() {
        kdf::PBKDF2_MIN_ITERATIONS
    } else {
        kdf::calibrate_pbkdf2(params.hash, params.hash.digest_len(), DIGEST_ITER_TIME_MS)?
    };
    let salt = random_bytes(KDF_SALT_LEN);
    let digest = Kdf::Pbkdf2 {
        hash: params.hash,
        iterations,
    }
    .derive(volume_key, &salt, params.hash.digest_len())?;
    Ok(Pbkdf2Digest {
        keyslots: vec![slot.to_string()],
        segments: vec!["0".into()],
        hash: params.hash.name().into(),
        iterations,
        salt: salt.to_vec(),
        digest: digest.to_vec(),
        extra: Map::new(),
    })
}

/// The first metadata: one keyslot, one segment, one digest.
fn first_metadata(
    params: &FormatParams,
    g: &Geometry,
    slot: usize,
    keyslot: Luks2Keyslot,
    digest: Pbkdf2Digest,
) -> Metadata {
    Metadata {
        keyslots: Numbered(vec![(slot as u32, Keyslot::Luks2(Box::new(keyslot)))]),
        tokens: Numbered(Vec::new()),
        segments: Numbered(vec![(
            0,
            SegmentEntry::Crypt(CryptSegment {
                offset: g.data_offset,
                size: None,
                iv_tweak: 0,
                encryption: params.cipher.clone(),
                sector_size: g.sector_size,
                integrity: params.integrity.as_ref().map(|kind| {
                    serde_json::json!({
                        "type": kind,
                        "journal_encryption": "none",
                        "journal_integrity": "none",
                    })
                }),
                flags: None,
                extra: Map::new(),
            }),
        )]),
        digests: Numbered(vec![(0, Digest::Pbkdf2(digest))]),
        config: Config {
            json_size: g.hdr_size - BIN_LEN as u64,
            keyslots_size: g.keyslots_size,
            flags: None,
            requirements: None,
            extra: Map::new(),
        },
        extra: Map::new(),
    }
}

/// Format `dev` as LUKS2 with one keyslot for `passphrase`, as `cryptsetup luksFormat --type
/// luks2` does: wipe the header area with zeros and the keyslots area with random bytes, write
/// the keyslot, then both header copies. `dev` is the header device (the data device too unless
/// `params.detached_header`). Returns the header as read back and the opened keyslot.
///
/// Errors: [`Error::Unsupported`] for parameters cryptsetup refuses (sizes, UUID, label,
/// cipher and key size); [`Error::Corrupt`] if the device is too small; [`Error::Io`].
pub fn format(
    dev: &dyn Storage,
    params: &FormatParams,
    passphrase: &[u8],
) -> Result<(Header, Unlocked), Error> {
    let dev_len = dev.len().map_err(|e| io(dev, e))?;
    let g = Geometry::plan(params, dev_len)?;
    let volume_key = volume_key(params)?;
    if params.integrity.is_none() {
        check_cipher(&params.cipher, &volume_key)?;
    }
    let slot = params.keyslot.unwrap_or(0);
    if slot >= KEYSLOTS_MAX {
        return Err(Error::Unsupported(format!(
            "keyslot {slot} (LUKS2 has 0 to {})",
            KEYSLOTS_MAX - 1
        )));
    }
    let fields = first_fields(params, g.hdr_size)?;
    let digest = volume_key_digest(params, &volume_key, slot)?;
    let area_size = keyslot_area_size(volume_key.len());
    if area_size > g.keyslots_size {
        return Err(Error::Unsupported(format!(
            "a keyslots area of {} bytes, too small for one {area_size}-byte keyslot",
            g.keyslots_size
        )));
    }
    let (area_cipher, area_key_len) = match params.integrity {
        Some(_) => (INTEGRITY_KEYSLOT_CIPHER, INTEGRITY_KEYSLOT_KEY_LEN),
        None => (params.cipher.as_str(), volume_key.len()),
    };
    let ks = make_keyslot(
        area_cipher,
        area_key_len,
        params.hash,
        &volume_key,
        passphrase,
        &params.pbkdf,
        g.min_offset,
    )?;
    let metadata = first_metadata(params, &g, slot, ks.json, digest);

    // `LUKS2_wipe_header_areas`: zeros up to the data (on a detached header, over both copies:
    // an old secondary copy left there would still be found and opened), then random bytes over
    // the keyslots area; the old headers go first (see `erase_old_headers`).
    let zero_len = if params.detached_header {
        g.min_offset
    } else {
        g.data_offset
    };
    erase_old_headers(dev, zero_len)?;
    wipe(dev, 0, zero_len, false)?;
    wipe(dev, g.min_offset, g.keyslots_size, true)?;
    dev.write_at(&ks.material, g.min_offset)
        .map_err(|e| io(dev, e))?;
    dev.sync().map_err(|e| io(dev, e))?;
    write_metadata(dev, &fields, &metadata)?;

    let header = Header::read(dev)?;
    let unlocked = Unlocked { slot, volume_key };
    Ok((header, unlocked))
}
