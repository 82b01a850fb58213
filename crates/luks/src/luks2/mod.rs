//! LUKS2, byte compatible with cryptsetup 2.6 (`lib/luks2/`): reading the header and opening
//! keyslots.
//!
//! A LUKS2 device starts with two copies of the header, each a 4096-byte binary header
//! ([`binary`]) followed by a JSON area holding the metadata ([`metadata`]): keyslots, segments,
//! digests, tokens and config. The primary copy is at offset 0 and the secondary right after it
//! at offset `hdr_size`; after both comes the keyslots area, then (usually) the data.
//!
//! Reading follows `LUKS2_disk_hdr_read`: each copy must pass the binary checks, its checksum and
//! the JSON validation ([`validate`]); when both pass, the higher sequence number wins. A damaged
//! primary copy gives no trustworthy `hdr_size`, so the secondary is then searched for at every
//! header size cryptsetup allows. [`Header::health`] tells which copies were usable, for a later
//! repair; reading never writes (cryptsetup repairs a damaged copy as it reads, sectorcrypt
//! leaves that to an explicit repair).

mod backup;
pub mod binary;
mod dump;
mod format;
pub mod limits;
pub mod metadata;
mod pbkdf;
pub mod reencrypt;
mod token;
mod unlock;
pub mod validate;
pub(crate) mod write;

pub use backup::RestorePlan;
pub use format::{format, FormatParams};
pub use limits::KEYSLOTS_MAX;
pub use pbkdf::{Pbkdf, PbkdfKind};
pub use token::TOKENS_MAX;
pub use write::{keyslot_area_size, random_bytes};

use sectorcrypt_storage::Storage;
use serde_json::{json, Value};

use crate::error::Error;
use crate::Unlocked;
use binary::{BinaryHeader, HeaderCopy, BIN_LEN, HDR_SIZES, HDR_SIZE_MAX, HDR_SIZE_MIN, VERSION};
use metadata::{Metadata, SegmentEntry};

/// What was found of one header copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyState {
    /// A valid copy with this sequence number (the lower of two valid copies is a leftover of an
    /// interrupted update).
    Valid {
        /// The copy's sequence number.
        seqid: u64,
    },
    /// A LUKS2 header copy that cannot be used; the text says why.
    Damaged(String),
    /// No LUKS2 header copy where one was looked for.
    Missing,
}

impl CopyState {
    /// Whether the copy is usable.
    pub fn is_valid(&self) -> bool {
        matches!(self, CopyState::Valid { .. })
    }
}

/// The state of both header copies as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderHealth {
    /// The copy at offset 0.
    pub primary: CopyState,
    /// The secondary copy.
    pub secondary: CopyState,
    /// Where the secondary copy was found or expected: `hdr_size` of a primary copy whose
    /// checksum is right, else the offset where the search found one (`None` if it found none).
    pub secondary_offset: Option<u64>,
    /// The copy the header was taken from.
    pub in_use: HeaderCopy,
}

impl HeaderHealth {
    /// Whether a copy is unusable or out of date, so that a repair would rewrite it.
    pub fn needs_repair(&self) -> bool {
        match (&self.primary, &self.secondary) {
            (CopyState::Valid { seqid: a }, CopyState::Valid { seqid: b }) => a != b,
            _ => true,
        }
    }
}

/// The data segment: where the encrypted data is and how it is encrypted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Byte offset of the data on the device.
    pub offset: u64,
    /// Bytes of data, `None` for "dynamic" (to the end of the device).
    pub size: Option<u64>,
    /// The dm-crypt cipher specification (`aes-xts-plain64`, ...).
    pub cipher: String,
    /// The encryption sector size in bytes (512 to 4096).
    pub sector_size: u32,
    /// Added to every IV, in 512-byte sectors (dm-crypt's `iv_offset`).
    pub iv_tweak: u64,
}

/// The data segment of a volume with authenticated encryption (`cryptsetup --integrity`): a
/// dm-integrity device at `offset` under the cipher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntegritySegment {
    /// Byte offset of the dm-integrity superblock on the device.
    pub offset: u64,
    /// The cipher (`aes-xts-plain64`, `aes-gcm-random`, `chacha20-random`, ...).
    pub cipher: String,
    /// The integrity type (`hmac(sha256)`, `aead`, `poly1305`, ...).
    pub integrity: String,
    /// The encryption sector size in bytes (the dm-integrity block size).
    pub sector_size: u32,
}

/// A LUKS2 header read from a device: the binary fields of the copy in use, the metadata, and
/// the state of both copies.
#[derive(Clone, Debug)]
pub struct Header {
    binary: BinaryHeader,
    /// The salt of the other copy, when it was readable (a rewrite keeps each copy's salt).
    other_salt: Option<[u8; binary::SALT_LEN]>,
    metadata: Metadata,
    health: HeaderHealth,
    uuid: String,
    label: String,
    subsystem: String,
}

/// A copy whose binary header and checksum are right.
struct Checksummed {
    bin: BinaryHeader,
    json_area: Vec<u8>,
}

/// The result of looking at one copy's location.
enum Probe {
    /// No LUKS2 magic (or no room for one).
    Missing,
    /// A LUKS2 magic, but the copy is unusable. `luks2` says whether it has version 2, which is
    /// what makes a device LUKS2 rather than something else.
    Damaged {
        reason: String,
        luks2: bool,
    },
    Checksummed(Box<Checksummed>),
}

/// A fully valid copy.
struct ValidCopy {
    bin: BinaryHeader,
    metadata: Metadata,
}

fn io_error(dev: &dyn Storage, source: std::io::Error) -> Error {
    Error::Io {
        device: dev.name(),
        source,
    }
}

/// Look at the copy expected at `offset` (`hdr_read_disk` with its sanity checks).
fn probe(dev: &dyn Storage, dev_len: u64, offset: u64, copy: HeaderCopy) -> Result<Probe, Error> {
    let available = dev_len.saturating_sub(offset).min(BIN_LEN as u64) as usize;
    let mut raw = [0u8; BIN_LEN];
    if available > 0 {
        dev.read_at(&mut raw[..available], offset)
            .map_err(|e| io_error(dev, e))?;
    }
    let has_magic = available >= 6 && BinaryHeader::magic_copy(&raw) == Some(copy);
    if !has_magic {
        return Ok(Probe::Missing);
    }
    let version = (available >= 8).then(|| u16::from_be_bytes([raw[6], raw[7]]));
    let damaged = |reason: String| {
        Ok(Probe::Damaged {
            reason,
            // Too short to show a version: a damaged LUKS2 header as far as anyone can tell.
            luks2: version.is_none_or(|v| v == VERSION),
        })
    };
    if available < BIN_LEN {
        return damaged(format!(
            "the device ends inside the binary header (at byte {})",
            offset + available as u64
        ));
    }
    let Some(bin) = BinaryHeader::parse(&raw) else {
        return Ok(Probe::Missing);
    };
    if bin.version != VERSION {
        return damaged(format!("it has version {} instead of 2", bin.version));
    }
    if bin.hdr_offset != offset {
        return damaged(format!(
            "it records the offset {} but lies at {offset}",
            bin.hdr_offset
        ));
    }
    if !(HDR_SIZE_MIN..=HDR_SIZE_MAX).contains(&bin.hdr_size) {
        return damaged(format!(
            "its size {} is outside 16 KiB to 4 MiB",
            bin.hdr_size
        ));
    }
    if copy == HeaderCopy::Secondary && bin.hdr_size != offset {
        return damaged(format!(
            "its size {} does not match its offset {offset}",
            bin.hdr_size
        ));
    }
    let end = offset + bin.hdr_size;
    if end > dev_len {
        return damaged(format!(
            "the device ({dev_len} bytes) ends inside its JSON area (which ends at {end})"
        ));
    }
    let mut json_area = vec![0u8; (bin.hdr_size - BIN_LEN as u64) as usize];
    dev.read_at(&mut json_area, offset + BIN_LEN as u64)
        .map_err(|e| io_error(dev, e))?;
    let hash = match bin.checksum_hash() {
        Ok(h) => h,
        Err(_) => {
            return damaged(format!(
                "its checksum algorithm '{}' is not supported",
                bin.checksum_alg_name()
            ))
        }
    };
    if !binary::checksum_matches(hash, &raw, &json_area) {
        return damaged("its checksum does not match".into());
    }
    Ok(Probe::Checksummed(Box::new(Checksummed { bin, json_area })))
}

/// The sequence id of the copy at `offset` if the reader would accept it (magic, binary header,
/// checksum and JSON all valid), else `None`.
pub(crate) fn valid_seqid(
    dev: &dyn Storage,
    offset: u64,
    copy: HeaderCopy,
) -> Result<Option<u64>, Error> {
    let dev_len = dev.len().map_err(|e| io_error(dev, e))?;
    Ok(match probe(dev, dev_len, offset, copy)? {
        Probe::Checksummed(c) => parse_metadata(&c).ok().map(|_| c.bin.seqid),
        _ => None,
    })
}

/// Parse, repair and validate a copy's JSON area into the metadata model.
fn parse_metadata(c: &Checksummed) -> Result<Metadata, String> {
    let mut value = validate::parse_json_area(&c.json_area)?;
    validate::repair(&mut value);
    validate::validate(&value, c.bin.hdr_size - BIN_LEN as u64)?;
    Metadata::from_json(value)
}

/// Turn a probe into the copy's state, the copy itself when valid, and whether it is a LUKS2
/// header at all (magic and version 2), valid or not.
fn assess(p: Probe) -> (CopyState, Option<ValidCopy>, bool) {
    match p {
        Probe::Missing => (CopyState::Missing, None, false),
        Probe::Damaged { reason, luks2 } => (CopyState::Damaged(reason), None, luks2),
        Probe::Checksummed(c) => match parse_metadata(&c) {
            Ok(metadata) => (
                CopyState::Valid { seqid: c.bin.seqid },
                Some(ValidCopy {
                    bin: c.bin,
                    metadata,
                }),
                true,
            ),
            Err(why) => (
                CopyState::Damaged(format!("its JSON metadata is invalid: {why}")),
                None,
                true,
            ),
        },
    }
}

fn describe(copy: HeaderCopy, state: &CopyState) -> String {
    match state {
        CopyState::Valid { seqid } => format!("the {} copy is valid (seqid {seqid})", copy.name()),
        CopyState::Damaged(why) => format!("the {} copy is unusable: {why}", copy.name()),
        CopyState::Missing => format!("there is no {} copy", copy.name()),
    }
}

impl Header {
    /// Read the LUKS2 header of `dev`.
    ///
    /// Errors: [`Error::NotLuks`] if neither copy has a LUKS2 magic with version 2;
    /// [`Error::Corrupt`] naming what is wrong with each copy if neither is usable, or if the
    /// device is shorter than the header copies and keyslots area;
    /// [`Error::AmbiguousSignatures`] if a copy is damaged or stale and the device holds a
    /// foreign signature ([`crate::signatures`]); [`Error::Io`] if reading fails.
    pub fn read(dev: &dyn Storage) -> Result<Header, Error> {
        Self::read_probing(dev, true)
    }

    /// [`Header::read`] without the foreign-signature probe: for an explicit repair, which the
    /// user asked for knowing the device (cryptsetup's `repair` reads so too).
    pub fn read_for_repair(dev: &dyn Storage) -> Result<Header, Error> {
        Self::read_probing(dev, false)
    }

    fn read_probing(dev: &dyn Storage, probe_signatures: bool) -> Result<Header, Error> {
        let dev_len = dev.len().map_err(|e| io_error(dev, e))?;
        let primary_probe = probe(dev, dev_len, 0, HeaderCopy::Primary)?;
        // A primary copy with a right checksum tells where the secondary is; otherwise every
        // allowed header size is tried, and the first copy with a right checksum is taken.
        let (secondary_probe, secondary_offset) = match &primary_probe {
            Probe::Checksummed(c) => {
                let at = c.bin.hdr_size;
                (probe(dev, dev_len, at, HeaderCopy::Secondary)?, Some(at))
            }
            _ => {
                let mut found = (Probe::Missing, None);
                for at in HDR_SIZES {
                    match probe(dev, dev_len, at, HeaderCopy::Secondary)? {
                        p @ Probe::Checksummed(_) => {
                            found = (p, Some(at));
                            break;
                        }
                        // Keep the first damaged candidate to say why nothing was found.
                        p @ Probe::Damaged { .. } if matches!(found.0, Probe::Missing) => {
                            found = (p, None)
                        }
                        _ => {}
                    }
                }
                found
            }
        };
        let (primary, valid1, primary_is_luks2) = assess(primary_probe);
        let (secondary, valid2, secondary_is_luks2) = assess(secondary_probe);
        let (chosen, other, in_use) = match (valid1, valid2) {
            (Some(a), Some(b)) if b.bin.seqid > a.bin.seqid => (b, Some(a), HeaderCopy::Secondary),
            (Some(a), b) => (a, b, HeaderCopy::Primary),
            (None, Some(b)) => (b, None, HeaderCopy::Secondary),
            (None, None) => {
                if !primary_is_luks2 && !secondary_is_luks2 {
                    return Err(Error::NotLuks { device: dev.name() });
                }
                return Err(Error::Corrupt(format!(
                    "{}; {}",
                    describe(HeaderCopy::Primary, &primary),
                    describe(HeaderCopy::Secondary, &secondary)
                )));
            }
        };
        let health = HeaderHealth {
            primary,
            secondary,
            secondary_offset,
            in_use,
        };
        let header = Header {
            uuid: binary::field_text(&chosen.bin.uuid),
            label: binary::field_text(&chosen.bin.label),
            subsystem: binary::field_text(&chosen.bin.subsystem),
            other_salt: other.map(|o| o.bin.salt),
            binary: chosen.bin,
            metadata: chosen.metadata,
            health,
        };
        // As cryptsetup (`LUKS2_disk_hdr_read`): a copy that would need recovery is recovered
        // only if the device holds no other signature, so that a LUKS header is never trusted
        // over an LVM volume or file system made on the device since.
        if probe_signatures && header.health.needs_repair() {
            if let Some(sig) = crate::signatures::probe(dev)? {
                return Err(Error::AmbiguousSignatures {
                    kind: sig.kind.to_string(),
                    offset: sig.offset,
                });
            }
        }
        // As cryptsetup (device_check_size): the device must hold both copies and the keyslots.
        let needed = header.hdr_and_areas_size();
        if needed > dev_len {
            return Err(Error::Corrupt(format!(
                "the device has {dev_len} bytes but its header copies and keyslots area need \
                 {needed}"
            )));
        }
        Ok(header)
    }

    /// The format version (2).
    pub fn version(&self) -> u16 {
        self.binary.version
    }

    /// The sequence number of the copy in use ("Epoch" in luksDump).
    pub fn seqid(&self) -> u64 {
        self.binary.seqid
    }

    /// The UUID.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// The label (empty if none).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The subsystem (empty if none).
    pub fn subsystem(&self) -> &str {
        &self.subsystem
    }

    /// The binary header of the copy in use.
    pub fn binary(&self) -> &BinaryHeader {
        &self.binary
    }

    /// The salt of the other copy, if it was valid.
    pub fn other_salt(&self) -> Option<&[u8; binary::SALT_LEN]> {
        self.other_salt.as_ref()
    }

    /// The JSON metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Which header copies were usable.
    pub fn health(&self) -> &HeaderHealth {
        &self.health
    }

    /// Bytes of one header copy (binary header plus JSON area).
    pub fn metadata_size(&self) -> u64 {
        self.metadata.config.json_size + BIN_LEN as u64
    }

    /// Bytes of the keyslots area.
    pub fn keyslots_size(&self) -> u64 {
        self.metadata.config.keyslots_size
    }

    /// Bytes from the device start to the end of the keyslots area.
    pub fn hdr_and_areas_size(&self) -> u64 {
        2 * self.metadata_size() + self.keyslots_size()
    }

    /// The segment keyslots are opened for: the one flagged `backup-final` during a
    /// reencryption, else segment 0 (`LUKS2_get_default_segment`).
    fn default_segment(&self) -> u32 {
        self.metadata
            .segments
            .iter()
            .find(|(_, s)| s.has_flag("backup-final"))
            .map_or(0, |(n, _)| n)
    }

    /// Open a keyslot with `passphrase`: `slot` if given (whatever its priority), else every
    /// keyslot in cryptsetup's order (preferred, then normal; never those with priority
    /// "ignore"). Only keyslots bound to the data segment count; keyslots of types other than
    /// `luks2` are skipped. `dev` is the device holding the header.
    ///
    /// Errors: [`Error::WrongPassphrase`] if the tried keyslots reject the passphrase;
    /// [`Error::Unsupported`] if no keyslot can be tried (none in use, `slot` not in use or not a
    /// passphrase keyslot) or one uses a hash, KDF or cipher sectorcrypt does not implement;
    /// [`Error::Corrupt`] for unusable keyslot parameters; [`Error::Io`].
    pub fn unlock(
        &self,
        dev: &dyn Storage,
        passphrase: &[u8],
        slot: Option<usize>,
    ) -> Result<Unlocked, Error> {
        self.unlock_in(dev, passphrase, slot, false)
    }

    /// [`Header::unlock`], or, when `unbound`, accepting keyslots bound to no segment too
    /// (cryptsetup's `CRYPT_ANY_SEGMENT`: the keyslots `cryptsetup luksAddKey --unbound` makes;
    /// their key is not the volume key).
    pub fn unlock_in(
        &self,
        dev: &dyn Storage,
        passphrase: &[u8],
        slot: Option<usize>,
        unbound: bool,
    ) -> Result<Unlocked, Error> {
        let segment = (!unbound).then(|| self.default_segment());
        unlock::unlock(&self.metadata, dev, passphrase, slot, segment)
    }

    /// Open the volume as `cryptsetup open` checks it before activating, and as
    /// `open --test-passphrase` answers: during an in-place conversion the old and new keys and
    /// the reencryption digest (CVE-2021-4122) too. See [`reencrypt::unlock_checked`].
    pub fn unlock_checked(
        &self,
        dev: &dyn Storage,
        passphrase: &[u8],
        slot: Option<usize>,
        unbound: bool,
    ) -> Result<Unlocked, Error> {
        reencrypt::unlock_checked(self, dev, passphrase, slot, unbound)
    }

    /// The volume key's length in bytes: the `key_size` of the keyslots whose digest covers the
    /// data segment (cryptsetup's `crypt_get_volume_key_size`).
    pub fn volume_key_len(&self) -> Result<usize, Error> {
        let md = &self.metadata;
        md.digest_of_segment(self.default_segment())
            .and_then(|(_, d)| {
                d.keyslots()
                    .iter()
                    .find_map(|s| match md.keyslots.get(s.parse().ok()?) {
                        Some(metadata::Keyslot::Luks2(k)) => Some(k.key_size as usize),
                        _ => None,
                    })
            })
            .ok_or_else(|| {
                Error::NoUsableKeyslot("no passphrase keyslot holds the volume key".into())
            })
    }

    /// The data segment (segment 0, which must be a `crypt` segment).
    ///
    /// Errors: [`Error::Unsupported`] while the header has mandatory requirements (an
    /// unfinished reencryption, or a feature of a newer cryptsetup), for another segment type,
    /// or for dm-integrity.
    pub fn data_segment(&self) -> Result<Segment, Error> {
        let reqs = self.metadata.mandatory_requirements();
        if !reqs.is_empty() {
            return Err(Error::Unsupported(format!(
                "the volume's mandatory requirements ({}), such as an unfinished reencryption",
                reqs.join(", ")
            )));
        }
        match self.metadata.segments.get(0) {
            Some(SegmentEntry::Crypt(c)) if c.integrity.is_some() => Err(Error::Unsupported(
                "this on a volume with integrity (authenticated encryption): conversions and \
                 resizing of such volumes are refused, as in cryptsetup"
                    .into(),
            )),
            Some(SegmentEntry::Crypt(c)) => Ok(Segment {
                offset: c.offset,
                size: c.size,
                cipher: c.encryption.clone(),
                sector_size: c.sector_size,
                iv_tweak: c.iv_tweak,
            }),
            Some(other) => Err(Error::Unsupported(format!(
                "a data segment of type '{}'",
                other.kind()
            ))),
            // Validation guarantees segment 0 whenever there is a regular segment.
            None => Err(Error::Corrupt("there is no segment 0".into())),
        }
    }

    /// Whether the data segment has authenticated encryption (`cryptsetup --integrity`): open
    /// it with [`Header::integrity_segment`], not [`Header::data_segment`].
    pub fn has_integrity(&self) -> bool {
        matches!(self.metadata.segments.get(0), Some(SegmentEntry::Crypt(c)) if c.integrity.is_some())
    }

    /// The data segment of a volume with authenticated encryption.
    ///
    /// Errors: [`Error::Unsupported`] while the header has mandatory requirements, for a segment
    /// without integrity (see [`Header::data_segment`]), or for an encrypted or authenticated
    /// dm-integrity journal (cryptsetup activates neither); [`Error::Corrupt`] without segment 0.
    pub fn integrity_segment(&self) -> Result<IntegritySegment, Error> {
        let reqs = self.metadata.mandatory_requirements();
        if !reqs.is_empty() {
            return Err(Error::Unsupported(format!(
                "the volume's mandatory requirements ({})",
                reqs.join(", ")
            )));
        }
        let Some(SegmentEntry::Crypt(c)) = self.metadata.segments.get(0) else {
            return Err(Error::Corrupt("there is no crypt segment 0".into()));
        };
        let Some(integrity) = &c.integrity else {
            return Err(Error::Unsupported(
                "a data segment without integrity as one with it".into(),
            ));
        };
        let field = |name: &str| integrity.get(name).and_then(|v| v.as_str()).unwrap_or("");
        for journal in ["journal_encryption", "journal_integrity"] {
            if field(journal) != "none" {
                return Err(Error::Unsupported(format!(
                    "a dm-integrity {journal} of '{}' (cryptsetup activates only none)",
                    field(journal)
                )));
            }
        }
        Ok(IntegritySegment {
            offset: c.offset,
            cipher: c.encryption.clone(),
            integrity: field("type").to_string(),
            sector_size: c.sector_size,
        })
    }

    /// The text `cryptsetup luksDump` prints for this header, byte for byte (tokens of external
    /// types show only their type and keyslots: cryptsetup's plugins print more).
    pub fn dump_text(&self) -> String {
        dump::dump_text(
            &dump::BinaryFields {
                version: self.binary.version,
                seqid: self.binary.seqid,
                uuid: &self.uuid,
                label: &self.label,
                subsystem: &self.subsystem,
            },
            &self.metadata.to_json(),
            &dump::Order {
                digests: self.metadata.digests.iter().map(|(n, _)| n).collect(),
            },
        )
    }

    /// The JSON metadata (as `cryptsetup luksDump --dump-json-metadata` shows it) with the
    /// binary-header fields of the copy in use added at the top level: `version`, `seqid`,
    /// `hdr_size`, `hdr_offset`, `label`, `subsystem`, `uuid`, `checksum_alg`, `salt` (hex) and
    /// `checksum` (hex, the digest's length).
    pub fn dump_json(&self) -> Value {
        let mut v = self.metadata.to_json();
        let bin = &self.binary;
        let digest_len = bin
            .checksum_hash()
            .map_or(binary::CHECKSUM_LEN, |h| h.digest_len());
        let fields = json!({
            "version": bin.version,
            "seqid": bin.seqid,
            "hdr_size": bin.hdr_size,
            "hdr_offset": bin.hdr_offset,
            "label": self.label,
            "subsystem": self.subsystem,
            "uuid": self.uuid,
            "checksum_alg": bin.checksum_alg_name(),
            "salt": hex(&bin.salt),
            "checksum": hex(&bin.checksum[..digest_len]),
        });
        if let (Some(obj), Value::Object(add)) = (v.as_object_mut(), fields) {
            obj.extend(add);
        }
        v
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
