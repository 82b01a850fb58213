//! LUKS2 reencryption metadata as cryptsetup 2.6 stores it (`lib/luks2/luks2_reencrypt.c`,
//! `luks2_keyslot_reenc.c`, `luks2_reencrypt_digest.c`, `luks2_segment.c`): reading it from a
//! header, checking its digest, and building the metadata `cryptsetup reencrypt --init-only`
//! writes, for an in-place encrypt / decrypt / reencrypt engine to drive.
//!
//! # The format
//!
//! An in-place (re)encryption converts the data device chunk by chunk (the "hotzone") and must
//! survive a crash at any moment, so all its state lives in the LUKS2 JSON:
//!
//! - `config.requirements.mandatory` holds `online-reencrypt-v2` (or `-v3` for decryption with a
//!   moved first segment; the legacy `online-reencrypt` is v1). Older tools refuse the volume.
//! - One keyslot of type `reencrypt` (priority 0, `key_size` 1) records the `mode` (encrypt,
//!   decrypt, reencrypt), the `direction` (forward, backward) and an `area` in the keyslots area
//!   holding the resilience data: hashes of the hotzone's old blocks (`checksum`), a copy of the
//!   old hotzone (`journal`), nothing (`none`), or nothing because data moves by a fixed shift so
//!   that source and destination never overlap (`datashift`, `datashift-checksum`,
//!   `datashift-journal`).
//! - The regular segments `0..n` describe the current mixed layout (done / not done); a step in
//!   progress flags one of them `in-reencryption`. After them come backup segments, found by
//!   **flag, never by number** (cryptsetup renumbers them): `backup-previous` (the old layout),
//!   `backup-final` (the target layout), and, with a moved first segment, `backup-moved-segment`.
//!   A `linear` segment is plaintext; the volume key of a `crypt` segment is the one whose digest
//!   lists the segment.
//! - The state follows from the JSON alone ([`state`]): no requirement is [`State::None`], the
//!   requirement without an `in-reencryption` segment is [`State::Clean`] (safe to resume), with
//!   one it is [`State::Crash`] (the hotzone must be recovered first).
//!
//! # The reencryption digest
//!
//! Since cryptsetup 2.4.3 (CVE-2021-4122) the keyslot fields and backup segments are
//! authenticated: whoever can write the header but does not know the volume keys must not be
//! able to make cryptsetup "resume" an operation that would decrypt the data in place. A
//! `pbkdf2` digest, listing only the reencrypt keyslot, holds `PBKDF2(blob, salt)` where the blob
//! ([`reencrypt_digest_blob`]) is the version, the old and new volume keys, the keyslot fields
//! and the backup segments, serialised in binary. The regular segments (progress) are not
//! covered, so steps do not need the keys again. cryptsetup refuses to resume, recover or
//! activate when the digest is missing or wrong.
//!
//! # What this module does not do
//!
//! It moves no data and writes no resilience area: that is the engine's job, in cryptsetup's
//! order for each step (resilience data, the header with the "hot" segments, the data and a
//! sync, the header with the "post" segments; for the datashift modes the first chunk is moved
//! before the first header names it). [`write_metadata`] only hands a built [`Metadata`] to the
//! crate's header writer (validated, both copies, seqid + 1).

use rand::RngCore;
use sectorcrypt_storage::Storage;
use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use super::metadata::{
    CryptSegment, Digest, Keyslot, Metadata, Pbkdf2Digest, Priority, Requirements, SegmentEntry,
};
use super::unlock::{open_slot, SlotFailure};
use super::validate::{as_u32, str_to_u64};
use super::Header;
use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::{self, Kdf};
use crate::keyslot::digest_matches;
use crate::Unlocked;

/// The legacy requirement (cryptsetup before 2.2 wrote it; 2.6 asks for `repair` first).
pub const REQUIREMENT_V1: &str = "online-reencrypt";
/// The requirement of every mode but decryption with a moved segment.
pub const REQUIREMENT_V2: &str = "online-reencrypt-v2";
/// The requirement of decryption with a moved first segment (cryptsetup 2.5+).
pub const REQUIREMENT_V3: &str = "online-reencrypt-v3";
/// The flag of the segment being converted right now.
pub const FLAG_IN_REENCRYPTION: &str = "in-reencryption";
/// The flag of the segment describing the layout before the operation.
pub const FLAG_BACKUP_PREVIOUS: &str = "backup-previous";
/// The flag of the segment describing the layout after the operation.
pub const FLAG_BACKUP_FINAL: &str = "backup-final";
/// The flag of the segment recording where the first chunk was moved (datashift modes).
pub const FLAG_BACKUP_MOVED: &str = "backup-moved-segment";

/// Bytes of the reencryption digest's salt (`LUKS_SALTSIZE`).
const DIGEST_SALT_LEN: usize = 32;
/// PBKDF2 time cryptsetup spends on a digest when not told the cost (`LUKS_MKD_ITERATIONS_MS`).
const DIGEST_ITER_TIME_MS: u32 = 125;
/// The longest string the digest serialiser accepts (`MAX_STR`).
const MAX_STR: usize = 64;
/// Keyslot numbers LUKS2 allows.
const KEYSLOTS_MAX: u32 = 32;
/// Digest numbers cryptsetup allocates (`LUKS2_DIGEST_MAX`).
const DIGESTS_MAX: u32 = 8;
/// The area cryptsetup reserves for plain `datashift` (a 1-byte "key" AF-split, rounded to 4K).
const DATASHIFT_AREA: u64 = 4096;

/// What the operation does to the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Plaintext to ciphertext.
    Encrypt,
    /// Ciphertext to plaintext.
    Decrypt,
    /// Old key (and cipher) to new key.
    Reencrypt,
}

impl Mode {
    /// The JSON word.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Encrypt => "encrypt",
            Mode::Decrypt => "decrypt",
            Mode::Reencrypt => "reencrypt",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        match s {
            "encrypt" => Some(Mode::Encrypt),
            "decrypt" => Some(Mode::Decrypt),
            "reencrypt" => Some(Mode::Reencrypt),
            _ => None,
        }
    }
}

/// Which end of the device the operation starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From offset 0 up.
    Forward,
    /// From the end down.
    Backward,
}

impl Direction {
    /// The JSON word.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        }
    }

    fn parse(s: &str) -> Option<Direction> {
        match s {
            "forward" => Some(Direction::Forward),
            "backward" => Some(Direction::Backward),
            _ => None,
        }
    }
}

/// How a step survives a crash: the reencrypt keyslot's area type with its parameters
/// (cryptsetup 2.6.1's six types).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resilience {
    /// No protection: a crash mid-step loses the hotzone.
    None,
    /// Hashes of the hotzone's old blocks; recovery redoes the blocks that still match.
    Checksum {
        /// The hash name as stored (`sha256`, ...).
        hash: String,
        /// The checksummed block size (bytes, a power of two ≥ 512).
        sector_size: u32,
    },
    /// A copy of the old hotzone; recovery redoes all of it.
    Journal,
    /// Data moves by `shift_size` bytes, so the source of a step is never overwritten by it.
    Datashift {
        /// Bytes of the shift.
        shift_size: u64,
    },
    /// Datashift, with the moved first segment (decrypted in place) protected by checksums.
    DatashiftChecksum {
        /// The hash name.
        hash: String,
        /// The checksummed block size.
        sector_size: u32,
        /// Bytes of the shift.
        shift_size: u64,
    },
    /// Datashift, with the moved first segment protected by a journal.
    DatashiftJournal {
        /// Bytes of the shift.
        shift_size: u64,
    },
}

impl Resilience {
    /// The area `type` word.
    pub fn area_type(&self) -> &'static str {
        match self {
            Resilience::None => "none",
            Resilience::Checksum { .. } => "checksum",
            Resilience::Journal => "journal",
            Resilience::Datashift { .. } => "datashift",
            Resilience::DatashiftChecksum { .. } => "datashift-checksum",
            Resilience::DatashiftJournal { .. } => "datashift-journal",
        }
    }

    /// The data shift, for the datashift types.
    pub fn shift_size(&self) -> Option<u64> {
        match self {
            Resilience::Datashift { shift_size }
            | Resilience::DatashiftChecksum { shift_size, .. }
            | Resilience::DatashiftJournal { shift_size } => Some(*shift_size),
            _ => None,
        }
    }
}

/// The `reencrypt` keyslot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReencryptKeyslot {
    /// Its keyslot number.
    pub slot: u32,
    /// What the operation does.
    pub mode: Mode,
    /// Which way it goes.
    pub direction: Direction,
    /// Byte offset of the resilience area on the metadata device.
    pub area_offset: u64,
    /// Bytes of the resilience area.
    pub area_size: u64,
    /// The area type and its parameters.
    pub resilience: Resilience,
}

impl ReencryptKeyslot {
    /// The keyslot object with cryptsetup's field order (`reenc_keyslot_alloc`, then
    /// `LUKS2_keyslot_priority_set`).
    pub fn to_json(&self) -> Value {
        let mut area = Map::new();
        area.insert("offset".into(), Value::String(self.area_offset.to_string()));
        area.insert("size".into(), Value::String(self.area_size.to_string()));
        area.insert("type".into(), json!(self.resilience.area_type()));
        match &self.resilience {
            Resilience::Checksum { hash, sector_size }
            | Resilience::DatashiftChecksum {
                hash, sector_size, ..
            } => {
                area.insert("hash".into(), json!(hash));
                area.insert("sector_size".into(), json!(sector_size));
            }
            _ => {}
        }
        if let Some(shift) = self.resilience.shift_size() {
            area.insert("shift_size".into(), Value::String(shift.to_string()));
        }
        json!({
            "area": area,
            "type": "reencrypt",
            "key_size": 1,
            "mode": self.mode.as_str(),
            "direction": self.direction.as_str(),
            "priority": 0,
        })
    }

    /// Parse keyslot `slot` (a `reencrypt` keyslot as stored).
    ///
    /// Errors: [`Error::Corrupt`] for missing or mistyped fields, [`Error::Unsupported`] for an
    /// area type cryptsetup 2.6 does not know.
    pub fn from_json(slot: u32, v: &Value) -> Result<ReencryptKeyslot, Error> {
        let bad = |what: String| Error::Corrupt(format!("reencrypt keyslot {slot}: {what}"));
        if v.get("type").and_then(Value::as_str) != Some("reencrypt") {
            return Err(bad("it is not of type \"reencrypt\"".into()));
        }
        let text = |obj: &Value, key: &str| -> Result<String, Error> {
            obj.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| bad(format!("\"{key}\" is missing or not a string")))
        };
        let number = |obj: &Value, key: &str| -> Result<u64, Error> {
            let s = text(obj, key)?;
            str_to_u64(&s).ok_or_else(|| bad(format!("\"{key}\" is \"{s}\", not a number")))
        };
        let mode = text(v, "mode")?;
        let mode = Mode::parse(&mode).ok_or_else(|| bad(format!("unknown mode \"{mode}\"")))?;
        let direction = text(v, "direction")?;
        let direction = Direction::parse(&direction)
            .ok_or_else(|| bad(format!("unknown direction \"{direction}\"")))?;
        let area = v
            .get("area")
            .filter(|a| a.is_object())
            .ok_or_else(|| bad("it has no area object".into()))?;
        let sector = || -> Result<u32, Error> {
            area.get("sector_size")
                .and_then(as_u32)
                .filter(|s| *s >= 512 && s.is_power_of_two())
                .ok_or_else(|| bad("the area's sector_size is missing or invalid".into()))
        };
        let shift = || -> Result<u64, Error> {
            let s = number(area, "shift_size")?;
            if s == 0 || s % 512 != 0 {
                return Err(bad(format!("the area's shift_size {s} is invalid")));
            }
            Ok(s)
        };
        let area_type = text(area, "type")?;
        let resilience = match area_type.as_str() {
            "none" => Resilience::None,
            "checksum" => Resilience::Checksum {
                hash: text(area, "hash")?,
                sector_size: sector()?,
            },
            "journal" => Resilience::Journal,
            "datashift" => Resilience::Datashift {
                shift_size: shift()?,
            },
            "datashift-checksum" => Resilience::DatashiftChecksum {
                hash: text(area, "hash")?,
                sector_size: sector()?,
                shift_size: shift()?,
            },
            "datashift-journal" => Resilience::DatashiftJournal {
                shift_size: shift()?,
            },
            other => {
                return Err(Error::Unsupported(format!(
                    "the reencryption resilience type \"{other}\""
                )))
            }
        };
        Ok(ReencryptKeyslot {
            slot,
            mode,
            direction,
            area_offset: number(area, "offset")?,
            area_size: number(area, "size")?,
            resilience,
        })
    }
}

/// Where a reencryption stands, from the JSON alone (`LUKS2_reencrypt_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum State {
    /// No reencryption requirement: an ordinary volume.
    None,
    /// A reencryption is in progress and no step was cut short: it can be resumed.
    Clean,
    /// A step was cut short (a segment is flagged `in-reencryption`): recover it first.
    Crash,
}

/// The reencryption requirement's version (1, 2 or 3), if one of the names cryptsetup 2.6 knows
/// is set (`LUKS2_config_get_reencrypt_version`).
pub fn requirement_version(metadata: &Metadata) -> Option<u8> {
    metadata
        .mandatory_requirements()
        .iter()
        .find_map(|r| match r.as_str() {
            REQUIREMENT_V1 => Some(1),
            REQUIREMENT_V2 => Some(2),
            REQUIREMENT_V3 => Some(3),
            _ => None,
        })
}

/// Where a reencryption stands (`LUKS2_reencrypt_status`).
pub fn state(metadata: &Metadata) -> State {
    if requirement_version(metadata).is_none() {
        State::None
    } else if metadata
        .segments
        .iter()
        .any(|(_, s)| entry_has_flag(s, FLAG_IN_REENCRYPTION))
    {
        State::Crash
    } else {
        State::Clean
    }
}

/// What a segment holds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentKind {
    /// Plaintext.
    Linear,
    /// Ciphertext.
    Crypt {
        /// IV of the first sector, in 512-byte units.
        iv_tweak: u64,
        /// The cipher specification.
        encryption: String,
        /// The encryption sector size.
        sector_size: u32,
    },
}

/// A segment of a volume under reencryption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReencryptSegment {
    /// Its number in the header (not stable across steps).
    pub id: u32,
    /// Byte offset on the data device.
    pub offset: u64,
    /// Bytes, `None` for "dynamic" (to the end of the device).
    pub size: Option<u64>,
    /// Linear or crypt.
    pub kind: SegmentKind,
    /// Its flags.
    pub flags: Vec<String>,
}

impl ReencryptSegment {
    /// Whether it carries `flag`.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn from_entry(id: u32, entry: &SegmentEntry) -> Result<ReencryptSegment, Error> {
        match entry {
            SegmentEntry::Crypt(c) => Ok(ReencryptSegment {
                id,
                offset: c.offset,
                size: c.size,
                kind: SegmentKind::Crypt {
                    iv_tweak: c.iv_tweak,
                    encryption: c.encryption.clone(),
                    sector_size: c.sector_size,
                },
                flags: c.flags.clone().unwrap_or_default(),
            }),
            SegmentEntry::Other(v) if entry.kind() == "linear" => {
                let bad = |what: &str| Error::Corrupt(format!("segment {id}: {what}"));
                let number = |key: &str| v.get(key).and_then(Value::as_str);
                let offset = number("offset")
                    .and_then(str_to_u64)
                    .ok_or_else(|| bad("its offset is missing or not a number"))?;
                let size = match number("size") {
                    Some("dynamic") => None,
                    Some(s) => Some(str_to_u64(s).ok_or_else(|| bad("its size is not a number"))?),
                    None => return Err(bad("it has no size")),
                };
                Ok(ReencryptSegment {
                    id,
                    offset,
                    size,
                    kind: SegmentKind::Linear,
                    flags: entry_flags(entry),
                })
            }
            other => Err(Error::Unsupported(format!(
                "a segment of type '{}' during a reencryption",
                other.kind()
            ))),
        }
    }

    /// A piece of this layout: the bytes from logical offset `at` (relative to the layout's
    /// start) stored at `offset`, `size` of them (`None`: to the end), flagged `in-reencryption`
    /// if `hot`. A crypt layout's IV moves with `at`.
    pub fn piece(&self, at: u64, offset: u64, size: Option<u64>, hot: bool) -> ReencryptSegment {
        let mut seg = self.clone();
        seg.offset = offset;
        seg.size = size;
        seg.flags = if hot {
            vec![FLAG_IN_REENCRYPTION.into()]
        } else {
            Vec::new()
        };
        if let SegmentKind::Crypt { iv_tweak, .. } = &mut seg.kind {
            *iv_tweak += at / 512;
        }
        seg
    }

    /// The segment as the header stores it, with cryptsetup's field order
    /// (`json_segment_create_linear` / `_crypt`, flags last).
    pub fn to_entry(&self) -> SegmentEntry {
        let flags = (!self.flags.is_empty()).then(|| self.flags.clone());
        let size = self
            .size
            .map_or_else(|| "dynamic".to_string(), |s| s.to_string());
        match &self.kind {
            SegmentKind::Linear => {
                let mut v = json!({
                    "type": "linear",
                    "offset": self.offset.to_string(),
                    "size": size,
                });
                if let (Some(f), Some(obj)) = (flags, v.as_object_mut()) {
                    obj.insert("flags".into(), json!(f));
                }
                SegmentEntry::Other(v)
            }
            SegmentKind::Crypt {
                iv_tweak,
                encryption,
                sector_size,
            } => SegmentEntry::Crypt(CryptSegment {
                offset: self.offset,
                size: self.size,
                iv_tweak: *iv_tweak,
                encryption: encryption.clone(),
                sector_size: *sector_size,
                integrity: None,
                flags,
                extra: Map::new(),
            }),
        }
    }
}

/// An in-progress reencryption as read from the metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reencryption {
    /// The requirement version (1, 2 or 3): the first byte after "v" in the digest blob.
    pub version: u8,
    /// The reencrypt keyslot.
    pub keyslot: ReencryptKeyslot,
    /// The regular segments, in order: the current layout.
    pub segments: Vec<ReencryptSegment>,
    /// The layout before the operation.
    pub backup_previous: ReencryptSegment,
    /// The layout after the operation.
    pub backup_final: ReencryptSegment,
    /// Where the first chunk was moved, in the datashift modes that move it.
    pub backup_moved: Option<ReencryptSegment>,
    /// The digest of the old volume key (`None` when `backup_previous` is linear).
    pub digest_old: Option<u32>,
    /// The digest of the new volume key (`None` when `backup_final` is linear).
    pub digest_new: Option<u32>,
    /// The reencryption digest (the one listing the reencrypt keyslot); `None` means cryptsetup
    /// wants a `repair`.
    pub digest: Option<u32>,
}

impl Reencryption {
    /// Clean or crashed.
    pub fn state(&self) -> State {
        if self.in_reencryption().is_some() {
            State::Crash
        } else {
            State::Clean
        }
    }

    /// The segment of the step that was cut short, if any.
    pub fn in_reencryption(&self) -> Option<&ReencryptSegment> {
        self.segments
            .iter()
            .find(|s| s.has_flag(FLAG_IN_REENCRYPTION))
    }
}

fn entry_flags(entry: &SegmentEntry) -> Vec<String> {
    match entry {
        SegmentEntry::Crypt(c) => c.flags.clone().unwrap_or_default(),
        SegmentEntry::Other(v) => v
            .get("flags")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str().map(str::to_owned))
            .collect(),
    }
}

fn entry_has_flag(entry: &SegmentEntry, flag: &str) -> bool {
    entry_flags(entry).iter().any(|f| f == flag)
}

fn is_backup(entry: &SegmentEntry) -> bool {
    entry_flags(entry).iter().any(|f| f.starts_with("backup-"))
}

/// The first segment carrying `flag` (`LUKS2_get_segment_by_flag`), with its number.
fn segment_by_flag<'a>(md: &'a Metadata, flag: &str) -> Option<(u32, &'a SegmentEntry)> {
    md.segments.iter().find(|(_, s)| entry_has_flag(s, flag))
}

/// The first keyslot of type `reencrypt` (`LUKS2_find_keyslot`).
fn reencrypt_keyslot(md: &Metadata) -> Option<(u32, &Value)> {
    md.keyslots.iter().find_map(|(n, k)| match k {
        Keyslot::Other(v) if k.kind() == "reencrypt" => Some((n, v)),
        _ => None,
    })
}

/// The digest listing segment `flag`'s segment (`LUKS2_reencrypt_digest_old/new`).
fn digest_of_flag(md: &Metadata, flag: &str) -> Option<u32> {
    let (id, _) = segment_by_flag(md, flag)?;
    md.digest_of_segment(id).map(|(n, _)| n)
}

/// Read the reencryption from `metadata`: `None` when there is none ([`State::None`]).
///
/// Errors: [`Error::Corrupt`] if the requirement is set but the reencrypt keyslot or a backup
/// segment is missing or malformed; [`Error::Unsupported`] for segment or resilience types
/// cryptsetup 2.6 does not write.
pub fn parse(metadata: &Metadata) -> Result<Option<Reencryption>, Error> {
    let Some(version) = requirement_version(metadata) else {
        return Ok(None);
    };
    let (slot, ks) = reencrypt_keyslot(metadata).ok_or_else(|| {
        Error::Corrupt(
            "the reencryption requirement is set but there is no reencrypt keyslot".into(),
        )
    })?;
    let keyslot = ReencryptKeyslot::from_json(slot, ks)?;
    let backup = |flag: &str| -> Result<Option<ReencryptSegment>, Error> {
        segment_by_flag(metadata, flag)
            .map(|(id, s)| ReencryptSegment::from_entry(id, s))
            .transpose()
    };
    let missing = |flag: &str| Error::Corrupt(format!("there is no {flag} segment"));
    let backup_previous =
        backup(FLAG_BACKUP_PREVIOUS)?.ok_or_else(|| missing("backup-previous"))?;
    let backup_final = backup(FLAG_BACKUP_FINAL)?.ok_or_else(|| missing("backup-final"))?;
    let backup_moved = backup(FLAG_BACKUP_MOVED)?;
    let segments = metadata
        .segments
        .iter()
        .filter(|(_, s)| !is_backup(s))
        .map(|(id, s)| ReencryptSegment::from_entry(id, s))
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Some(Reencryption {
        version,
        keyslot,
        segments,
        digest_old: digest_of_flag(metadata, FLAG_BACKUP_PREVIOUS),
        digest_new: digest_of_flag(metadata, FLAG_BACKUP_FINAL),
        digest: metadata.digest_of_keyslot(slot).map(|(n, _)| n),
        backup_previous,
        backup_final,
        backup_moved,
    }))
}

// ---- The reencryption digest (`luks2_reencrypt_digest.c`) ----

/// Appends JSON fields to the blob with the typing rules of cryptsetup's `sr()`: a missing or
/// mistyped field makes the whole blob invalid.
struct Serializer<'a> {
    out: &'a mut Vec<u8>,
}

impl Serializer<'_> {
    fn field<'v>(obj: &'v Value, key: &str) -> Result<&'v Value, String> {
        obj.get(key).ok_or_else(|| format!("\"{key}\" is missing"))
    }

    /// A string: its bytes, 1 to 64 of them.
    fn str(&mut self, obj: &Value, key: &str) -> Result<(), String> {
        let s = Self::field(obj, key)?
            .as_str()
            .ok_or_else(|| format!("\"{key}\" is not a string"))?;
        if s.is_empty() || s.len() > MAX_STR {
            return Err(format!("\"{key}\" has {} bytes (1 to {MAX_STR})", s.len()));
        }
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn decimal(obj: &Value, key: &str) -> Result<u64, String> {
        let s = Self::field(obj, key)?
            .as_str()
            .ok_or_else(|| format!("\"{key}\" is not a string"))?;
        str_to_u64(s).ok_or_else(|| format!("\"{key}\" is \"{s}\", not a number"))
    }

    /// A u64 stored as a decimal string: 8 bytes big-endian.
    fn u64(&mut self, obj: &Value, key: &str) -> Result<(), String> {
        let n = Self::decimal(obj, key)?;
        self.out.extend_from_slice(&n.to_be_bytes());
        Ok(())
    }

    /// A segment size: the 7 bytes "dynamic", or a u64.
    fn size(&mut self, obj: &Value, key: &str) -> Result<(), String> {
        if Self::field(obj, key)?.as_str() == Some("dynamic") {
            self.out.extend_from_slice(b"dynamic");
            Ok(())
        } else {
            self.u64(obj, key)
        }
    }

    /// A u32 stored as a JSON integer: 4 bytes big-endian.
    fn u32(&mut self, obj: &Value, key: &str) -> Result<(), String> {
        let v = Self::field(obj, key)?;
        let n = as_u32(v).ok_or_else(|| format!("\"{key}\" is {v}, not a 32-bit integer"))?;
        self.out.extend_from_slice(&n.to_be_bytes());
        Ok(())
    }

    /// `reenc_keyslot_serialize`.
    fn keyslot(&mut self, ks: &Value) -> Result<(), String> {
        let area = Self::field(ks, "area")?;
        let area_type = Self::field(area, "type")?.as_str().unwrap_or("");
        self.str(ks, "mode")?;
        self.str(ks, "direction")?;
        self.str(area, "type")?;
        self.u64(area, "offset")?;
        self.u64(area, "size")?;
        if matches!(area_type, "checksum" | "datashift-checksum") {
            self.str(area, "hash")?;
            self.u32(area, "sector_size")?;
        }
        if matches!(
            area_type,
            "datashift" | "datashift-journal" | "datashift-checksum"
        ) {
            self.u64(area, "shift_size")?;
        }
        Ok(())
    }

    /// `segment_serialize`.
    fn segment(&mut self, seg: &Value) -> Result<(), String> {
        let kind = Self::field(seg, "type")?.as_str().unwrap_or("");
        if !matches!(kind, "crypt" | "linear") {
            return Err(format!("a segment of type \"{kind}\""));
        }
        self.str(seg, "type")?;
        self.u64(seg, "offset")?;
        self.size(seg, "size")?;
        if kind == "crypt" {
            self.u64(seg, "iv_tweak")?;
            self.str(seg, "encryption")?;
            self.u32(seg, "sector_size")?;
        }
        Ok(())
    }
}

fn segment_json(md: &Metadata, flag: &str) -> Option<Value> {
    segment_by_flag(md, flag).and_then(|(_, s)| serde_json::to_value(s).ok())
}

/// The bytes cryptsetup hashes into the reencryption digest
/// (`reencrypt_assembly_verification_data`):
///
/// ```text
/// 'v' '0'+version ‖ old VK (if backup-previous has a digest)
///                 ‖ new VK (if backup-final has another digest)
/// ‖ mode ‖ direction ‖ area.type ‖ u64 area.offset ‖ u64 area.size
///   [‖ area.hash ‖ u32 area.sector_size]   (checksum, datashift-checksum)
///   [‖ u64 area.shift_size]                (datashift*)
/// ‖ seg(backup-previous) ‖ seg(backup-final) [‖ seg(backup-moved-segment)]
/// seg = type ‖ u64 offset ‖ ("dynamic" | u64 size) [‖ u64 iv_tweak ‖ encryption ‖ u32 sector_size]
/// ```
///
/// Strings are their bytes without terminator, integers big-endian. The keys are taken as given
/// (check them against their digests first, as [`verify_reencrypt_digest`] does).
///
/// Errors: [`Error::Unsupported`] if a key the blob needs is not given; [`Error::Corrupt`] if the
/// metadata has no reencryption or a field cryptsetup's serialiser would refuse.
pub fn reencrypt_digest_blob(
    metadata: &Metadata,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
) -> Result<Zeroizing<Vec<u8>>, Error> {
    let version = requirement_version(metadata).ok_or_else(|| {
        Error::Corrupt("there is no reencryption requirement to build a digest for".into())
    })?;
    let digest_old = digest_of_flag(metadata, FLAG_BACKUP_PREVIOUS);
    let digest_new = digest_of_flag(metadata, FLAG_BACKUP_FINAL);
    // Room for everything up front, so that no reallocation leaves a copy of a key behind:
    // strings are at most 64 bytes, so the fields take well under 1 KiB.
    let keys_len = old_vk.map_or(0, <[u8]>::len) + new_vk.map_or(0, <[u8]>::len);
    let mut out = Zeroizing::new(Vec::with_capacity(2 + keys_len + 1024));
    out.extend_from_slice(&[b'v', b'0' + version]);
    let missing = |which: &str, digest: u32| {
        Error::Unsupported(format!(
            "checking the reencryption digest without the {which} volume key (digest {digest})"
        ))
    };
    if let Some(d) = digest_old {
        out.extend_from_slice(old_vk.ok_or_else(|| missing("old", d))?);
    }
    if let Some(d) = digest_new.filter(|d| Some(*d) != digest_old) {
        out.extend_from_slice(new_vk.ok_or_else(|| missing("new", d))?);
    }
    if out.len() == 2 {
        return Err(Error::Corrupt(
            "neither backup segment has a volume key digest".into(),
        ));
    }
    let (_, ks) = reencrypt_keyslot(metadata)
        .ok_or_else(|| Error::Corrupt("there is no reencrypt keyslot".into()))?;
    let bad = |why: String| Error::Corrupt(format!("the reencryption metadata: {why}"));
    let mut s = Serializer { out: &mut out };
    s.keyslot(ks)
        .map_err(|e| bad(format!("reencrypt keyslot: {e}")))?;
    for (flag, required) in [
        (FLAG_BACKUP_PREVIOUS, true),
        (FLAG_BACKUP_FINAL, true),
        (FLAG_BACKUP_MOVED, false),
    ] {
        match segment_json(metadata, flag) {
            Some(seg) => s
                .segment(&seg)
                .map_err(|e| bad(format!("{flag} segment: {e}")))?,
            None if required => return Err(bad(format!("there is no {flag} segment"))),
            None => {}
        }
    }
    Ok(out)
}

/// Check `vk` against digest `n` of `metadata`: [`Error::WrongPassphrase`] if it is not that
/// digest's key.
fn check_key(metadata: &Metadata, n: u32, vk: &[u8]) -> Result<(), Error> {
    let Some(Digest::Pbkdf2(d)) = metadata.digests.get(n) else {
        return Err(Error::Unsupported(format!(
            "digest {n}, which is not a pbkdf2 digest"
        )));
    };
    if digest_matches(vk, Hash::parse(&d.hash)?, d.iterations, &d.salt, &d.digest)? {
        Ok(())
    } else {
        Err(Error::WrongPassphrase)
    }
}

/// Whether the reencryption digest of `header` matches its keyslot and backup segments, for the
/// given volume keys (`LUKS2_reencrypt_digest_verify`). Pass the old key when `backup-previous`
/// is a crypt segment (decrypt, reencrypt) and the new key when `backup-final` is (encrypt,
/// reencrypt); a key that is not needed is ignored.
///
/// `Ok(false)` means the metadata was changed by someone without the keys (or by a tool that did
/// not refresh the digest): cryptsetup says "Reencryption metadata is invalid." and refuses it.
///
/// Errors: [`Error::WrongPassphrase`] if a given key does not match its own digest;
/// [`Error::Corrupt`] if there is no reencryption, no reencryption digest (cryptsetup asks for a
/// `repair`), or a field the serialiser refuses; [`Error::Unsupported`] if a needed key is
/// missing or a digest is not pbkdf2.
pub fn verify_reencrypt_digest(
    header: &Header,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
) -> Result<bool, Error> {
    verify_metadata_digest(header.metadata(), old_vk, new_vk)
}

/// [`verify_reencrypt_digest`] on metadata that is not (yet) a header.
pub fn verify_metadata_digest(
    metadata: &Metadata,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
) -> Result<bool, Error> {
    let (slot, _) = reencrypt_keyslot(metadata)
        .ok_or_else(|| Error::Corrupt("there is no reencrypt keyslot".into()))?;
    let Some((n, digest)) = metadata.digest_of_keyslot(slot) else {
        return Err(Error::Corrupt(
            "the reencrypt keyslot has no digest (cryptsetup repair adds one)".into(),
        ));
    };
    let Digest::Pbkdf2(d) = digest else {
        return Err(Error::Unsupported(format!(
            "reencryption digest {n} of type '{}'",
            digest.kind()
        )));
    };
    let digest_old = digest_of_flag(metadata, FLAG_BACKUP_PREVIOUS);
    let digest_new = digest_of_flag(metadata, FLAG_BACKUP_FINAL);
    if let (Some(d), Some(k)) = (digest_old, old_vk) {
        check_key(metadata, d, k)?;
    }
    if let (Some(d), Some(k)) = (digest_new, new_vk) {
        check_key(metadata, d, k)?;
    }
    let blob = reencrypt_digest_blob(metadata, old_vk, new_vk)?;
    if d.salt.len() != DIGEST_SALT_LEN || d.digest.is_empty() {
        return Ok(false);
    }
    digest_matches(
        &blob,
        Hash::parse(&d.hash)?,
        d.iterations,
        &d.salt,
        &d.digest,
    )
}

/// A new reencryption digest for `blob` (`PBKDF2_digest_store`): a random 32-byte salt and
/// `PBKDF2-HMAC-hash(blob, salt, iterations)` of the hash's length, listing keyslot
/// `reencrypt_slot` and no segment.
pub fn make_reencrypt_digest(
    blob: &[u8],
    hash: Hash,
    iterations: u32,
    reencrypt_slot: u32,
) -> Result<Pbkdf2Digest, Error> {
    let mut salt = vec![0u8; DIGEST_SALT_LEN];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    let digest = Kdf::Pbkdf2 { hash, iterations }.derive(blob, &salt, hash.digest_len())?;
    Ok(Pbkdf2Digest {
        keyslots: vec![reencrypt_slot.to_string()],
        segments: Vec::new(),
        hash: hash.name().into(),
        iterations,
        salt,
        digest: digest.to_vec(),
        extra: Map::new(),
    })
}

/// Compute and install the reencryption digest of `metadata`, as
/// `LUKS2_keyslot_reencrypt_digest_create` and the next header write do: the new digest takes the
/// first free number, the reencrypt keyslot is taken off every other digest, and digests left
/// with neither keyslots nor segments are dropped (`LUKS2_digests_erase_unused`). Call it after
/// every change to the reencrypt keyslot or a backup segment. Returns the digest's number.
///
/// `iterations` `None` benchmarks PBKDF2 for 125 ms, as cryptsetup does unless told the cost;
/// a count below cryptsetup's minimum (1000) is raised to it.
pub fn set_reencrypt_digest(
    metadata: &mut Metadata,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
    hash: Hash,
    iterations: Option<u32>,
) -> Result<u32, Error> {
    let (slot, _) = reencrypt_keyslot(metadata)
        .ok_or_else(|| Error::Corrupt("there is no reencrypt keyslot".into()))?;
    let blob = reencrypt_digest_blob(metadata, old_vk, new_vk)?;
    let iterations = match iterations {
        Some(n) => n.max(kdf::PBKDF2_MIN_ITERATIONS),
        None => kdf::calibrate_pbkdf2(hash, hash.digest_len(), DIGEST_ITER_TIME_MS)?,
    };
    let id = (0..DIGESTS_MAX)
        .find(|n| metadata.digests.get(*n).is_none())
        .ok_or_else(|| Error::Unsupported("all 8 digests are in use".into()))?;
    let digest = make_reencrypt_digest(&blob, hash, iterations, slot)?;
    let name = slot.to_string();
    for (_, d) in metadata.digests.0.iter_mut() {
        match d {
            Digest::Pbkdf2(d) => d.keyslots.retain(|k| *k != name),
            Digest::Other(v) => {
                if let Some(Value::Array(a)) = v.get_mut("keyslots") {
                    a.retain(|k| k.as_str() != Some(&name));
                }
            }
        }
    }
    metadata.digests.0.push((id, Digest::Pbkdf2(digest)));
    metadata.digests.0.retain(|(_, d)| {
        let lists_empty = |key: &str| match d {
            Digest::Pbkdf2(p) => {
                if key == "keyslots" {
                    p.keyslots.is_empty()
                } else {
                    p.segments.is_empty()
                }
            }
            Digest::Other(v) => v
                .get(key)
                .and_then(Value::as_array)
                .is_some_and(|a| a.is_empty()),
        };
        !(lists_empty("segments") && lists_empty("keyslots"))
    });
    Ok(id)
}

// ---- Opening the keys ----

/// The volume keys of a reencryption.
pub struct VolumeKeys {
    /// The old key (`None` for encryption).
    pub old: Option<Unlocked>,
    /// The new key (`None` for decryption; the same slot as `old` when both share a digest).
    pub new: Option<Unlocked>,
}

/// Open the old and the new volume key with one passphrase (`LUKS2_keyslot_open_all_segments`):
/// for each side whose backup segment has a digest, the keyslots of that digest are tried in
/// cryptsetup's priority order.
///
/// Errors: [`Error::Corrupt`] if there is no reencryption; otherwise those of
/// [`Header::unlock`] for the side that does not open.
pub fn unlock_volume_keys(
    header: &Header,
    dev: &dyn Storage,
    passphrase: &[u8],
) -> Result<VolumeKeys, Error> {
    let md = header.metadata();
    let r =
        parse(md)?.ok_or_else(|| Error::Corrupt("there is no reencryption in progress".into()))?;
    let open = |digest: Option<u32>, segment: u32| -> Result<Option<Unlocked>, Error> {
        let Some(d) = digest else { return Ok(None) };
        let slots: Vec<u32> = md
            .digests
            .get(d)
            .map(|d| d.keyslots().iter().filter_map(|s| s.parse().ok()).collect())
            .unwrap_or_default();
        let mut wrong = false;
        let mut hard = None;
        for p in [Priority::Prefer, Priority::Normal] {
            for &s in &slots {
                if md.keyslots.get(s).map(Keyslot::priority) != Some(p) {
                    continue;
                }
                match open_slot(md, dev, s, segment, passphrase) {
                    Ok(u) => return Ok(Some(u)),
                    Err(SlotFailure::WrongPassphrase) => wrong = true,
                    Err(SlotFailure::Failed(e)) => {
                        hard.get_or_insert(e);
                    }
                    Err(SlotFailure::Unusable(_)) => {}
                }
            }
        }
        Err(hard.unwrap_or(if wrong {
            Error::WrongPassphrase
        } else {
            Error::NoUsableKeyslot(format!("no keyslot of digest {d} may be tried"))
        }))
    };
    let old = open(r.digest_old, r.backup_previous.id)?;
    let new = if r.digest_new.is_some() && r.digest_new == r.digest_old {
        open(r.digest_new, r.backup_previous.id)?
    } else {
        open(r.digest_new, r.backup_final.id)?
    };
    Ok(VolumeKeys { old, new })
}

// ---- Building the initial metadata (`reencrypt_init`) ----

/// The resilience of a step that does not shift data (`--resilience`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResilienceKind {
    /// `none`.
    None,
    /// `checksum` with this hash (`--resilience-hash`, default sha256).
    Checksum(Hash),
    /// `journal`.
    Journal,
}

/// Choices shared by the builders, as `cryptsetup reencrypt` options give them.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// The resilience (not used by [`init_encrypt_datashift`], which is always `datashift`).
    pub resilience: ResilienceKind,
    /// The data device's logical block size; the checksum block is the largest of it and both
    /// sector sizes (`reencrypt_get_alignment`). cryptsetup sees 4096 for files on most file
    /// systems and `BLKSSZGET` for block devices.
    pub block_size: u32,
    /// The reencryption digest's hash (cryptsetup's PBKDF hash, sha256 by default).
    pub digest_hash: Hash,
    /// The reencryption digest's iterations; `None` benchmarks 125 ms. cryptsetup uses 1000
    /// when given `--pbkdf-force-iterations`.
    pub digest_iterations: Option<u32>,
}

impl Default for InitOptions {
    /// cryptsetup's defaults: checksum/sha256, a 4096-byte block, a sha256 digest benchmarked.
    fn default() -> Self {
        InitOptions {
            resilience: ResilienceKind::Checksum(Hash::Sha256),
            block_size: 4096,
            digest_hash: Hash::Sha256,
            digest_iterations: None,
        }
    }
}

/// The target of a reencryption: the new cipher and sector size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The new cipher specification (`aes-xts-plain64`).
    pub cipher: String,
    /// The new encryption sector size.
    pub sector_size: u32,
}

/// The data segment of a header that is not under reencryption, with its digest.
fn plain_data_segment(header: &Header) -> Result<(CryptSegment, u32), Error> {
    let md = header.metadata();
    let reqs = md.mandatory_requirements();
    if !reqs.is_empty() {
        return Err(Error::Unsupported(format!(
            "starting a reencryption on a volume with mandatory requirements ({})",
            reqs.join(", ")
        )));
    }
    match md.segments.get(0) {
        Some(SegmentEntry::Crypt(c)) if md.segments.len() == 1 && c.integrity.is_none() => {
            let (d, _) = md
                .digest_of_segment(0)
                .ok_or_else(|| Error::Corrupt("segment 0 has no digest".into()))?;
            Ok((c.clone(), d))
        }
        _ => Err(Error::Unsupported(
            "starting a reencryption on anything but one crypt segment without integrity".into(),
        )),
    }
}

/// Keyslot areas as (offset, size), whatever the keyslot type (`LUKS2_keyslot_area`).
fn keyslot_areas(md: &Metadata) -> Vec<(u64, u64)> {
    keyslot_areas_by_slot(md)
        .into_iter()
        .map(|(_, area)| area)
        .collect()
}

fn keyslot_areas_by_slot(md: &Metadata) -> Vec<(u32, (u64, u64))> {
    md.keyslots
        .iter()
        .filter_map(|(n, k)| match k {
            Keyslot::Luks2(k) => Some((n, (k.area.offset, k.area.size))),
            Keyslot::Other(v) => {
                let get = |key: &str| v.get("area")?.get(key)?.as_str().and_then(str_to_u64);
                Some((n, (get("offset")?, get("size")?)))
            }
        })
        .collect()
}

/// The keyslot areas (offset, size) of the keyslots in `before` that `after` no longer has: what
/// to wipe once `after` is written.
pub fn removed_keyslot_areas(before: &Metadata, after: &Metadata) -> Vec<(u64, u64)> {
    let kept: Vec<u32> = after.keyslots.iter().map(|(n, _)| n).collect();
    keyslot_areas_by_slot(before)
        .into_iter()
        .filter(|(n, _)| !kept.contains(n))
        .map(|(_, area)| area)
        .collect()
}

/// The largest free gap of the keyslots area (`LUKS2_find_area_max_gap`, same tie rule: the
/// first of equal gaps).
fn find_area_max_gap(md: &Metadata, hdr_size: u64) -> Option<(u64, u64)> {
    let max_offset = 2 * hdr_size + md.config.keyslots_size;
    let mut areas: Vec<(u64, u64)> = keyslot_areas(md)
        .into_iter()
        .filter(|(o, l)| *o != 0 && *l != 0)
        .collect();
    areas.sort_by_key(|a| a.0);
    areas.push((max_offset, 1));
    let (mut offset, mut best, mut best_len) = (2 * hdr_size, 0, 0);
    for (o, l) in areas {
        if offset < o && o - offset > best_len {
            best_len = o - offset;
            best = offset;
        }
        offset = o.saturating_add(l);
    }
    (best_len > 0).then_some((best, best_len))
}

/// Add the reencrypt keyslot, the requirement and the digest to `md` (the end of
/// `reencrypt_init`).
#[allow(clippy::too_many_arguments)]
fn finish_init(
    mut md: Metadata,
    hdr_size: u64,
    mode: Mode,
    direction: Direction,
    resilience: Resilience,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
    opts: &InitOptions,
) -> Result<Metadata, Error> {
    let slot = (0..KEYSLOTS_MAX)
        .find(|n| md.keyslots.get(*n).is_none())
        .ok_or_else(|| Error::Unsupported("all 32 keyslots are in use".into()))?;
    let no_room = || Error::Unsupported("no free space in the keyslots area".into());
    let (area_offset, area_size) = if matches!(resilience, Resilience::Datashift { .. }) {
        let o = md
            .find_area_gap(hdr_size, DATASHIFT_AREA, &[])
            .ok_or_else(no_room)?;
        (o, DATASHIFT_AREA)
    } else {
        find_area_max_gap(&md, hdr_size).ok_or_else(no_room)?
    };
    // Only a decryption that moves its first segment needs v3 (`reencrypt_init`).
    let requirement = match (&mode, &resilience) {
        (
            Mode::Decrypt,
            Resilience::DatashiftChecksum { .. } | Resilience::DatashiftJournal { .. },
        ) => REQUIREMENT_V3,
        _ => REQUIREMENT_V2,
    };
    let ks = ReencryptKeyslot {
        slot,
        mode,
        direction,
        area_offset,
        area_size,
        resilience,
    };
    md.keyslots.0.push((slot, Keyslot::Other(ks.to_json())));
    md.config.requirements = Some(Requirements {
        mandatory: Some(vec![requirement.into()]),
        extra: md
            .config
            .requirements
            .take()
            .map(|r| r.extra)
            .unwrap_or_default(),
    });
    set_reencrypt_digest(
        &mut md,
        old_vk,
        new_vk,
        opts.digest_hash,
        opts.digest_iterations,
    )?;
    Ok(md)
}

/// The non-shift resilience with its checksum block size.
fn resilience_for(opts: &InitOptions, sector_sizes: &[u32]) -> Result<Resilience, Error> {
    if opts.block_size < 512 || !opts.block_size.is_power_of_two() {
        return Err(Error::Unsupported(format!(
            "a block size of {} bytes",
            opts.block_size
        )));
    }
    let alignment = sector_sizes.iter().copied().fold(opts.block_size, u32::max);
    Ok(match opts.resilience {
        ResilienceKind::None => Resilience::None,
        ResilienceKind::Journal => Resilience::Journal,
        ResilienceKind::Checksum(h) => Resilience::Checksum {
            hash: h.name().into(),
            sector_size: alignment,
        },
    })
}

/// Take every segment off every digest (`LUKS2_digest_segment_assign(ANY, ANY, 0)`).
fn clear_segment_digests(md: &mut Metadata) {
    for (_, d) in md.digests.0.iter_mut() {
        match d {
            Digest::Pbkdf2(d) => d.segments.clear(),
            Digest::Other(v) => {
                if let Some(Value::Array(a)) = v.get_mut("segments") {
                    a.clear();
                }
            }
        }
    }
}

/// List segment `segment` in digest `digest` (`LUKS2_digest_segment_assign(.., 1, ..)`).
fn assign_segment(md: &mut Metadata, digest: u32, segment: u32) -> Result<(), Error> {
    let name = segment.to_string();
    match md.digests.0.iter_mut().find(|(n, _)| *n == digest) {
        Some((_, Digest::Pbkdf2(d))) => {
            if !d.segments.contains(&name) {
                d.segments.push(name);
            }
            Ok(())
        }
        _ => Err(Error::Unsupported(format!(
            "digest {digest}, which is not a pbkdf2 digest"
        ))),
    }
}

/// `entry` with `flag` added (`LUKS2_segment_set_flag`).
fn with_flag(entry: &SegmentEntry, flag: &str) -> SegmentEntry {
    let mut e = entry.clone();
    match &mut e {
        SegmentEntry::Crypt(c) => c.flags.get_or_insert_with(Vec::new).push(flag.into()),
        SegmentEntry::Other(v) => {
            if let Some(obj) = v.as_object_mut() {
                match obj.get_mut("flags") {
                    Some(Value::Array(a)) => a.push(json!(flag)),
                    _ => {
                        obj.insert("flags".into(), json!([flag]));
                    }
                }
            }
        }
    }
    e
}

fn linear(offset: u64, size: Option<u64>, flag: Option<&str>) -> SegmentEntry {
    ReencryptSegment {
        id: 0,
        offset,
        size,
        kind: SegmentKind::Linear,
        flags: flag.map(|f| vec![f.to_string()]).unwrap_or_default(),
    }
    .to_entry()
}

fn crypt(offset: u64, iv_tweak: u64, cipher: &str, sector_size: u32, flag: &str) -> SegmentEntry {
    ReencryptSegment {
        id: 0,
        offset,
        size: None,
        kind: SegmentKind::Crypt {
            iv_tweak,
            encryption: cipher.into(),
            sector_size,
        },
        flags: vec![flag.into()],
    }
    .to_entry()
}

/// The metadata `cryptsetup reencrypt --encrypt --header HDR --init-only DATA` writes, from the
/// freshly formatted detached header (data offset 0, one crypt segment whose keyslots hold
/// `new_vk`): segment 0 becomes plaintext (`linear`, dynamic), `backup-previous` is that linear
/// layout, `backup-final` the formatted crypt segment; direction forward; resilience from
/// `opts`.
///
/// Nothing moves on the device: the data is encrypted in place, chunk by chunk, by the engine.
///
/// Errors: [`Error::WrongPassphrase`] if `new_vk` is not the header's key; [`Error::Unsupported`]
/// for a header with requirements, several segments, or no room for the keyslot.
pub fn init_encrypt(header: &Header, new_vk: &[u8], opts: &InitOptions) -> Result<Metadata, Error> {
    let (seg, digest) = plain_data_segment(header)?;
    check_key(header.metadata(), digest, new_vk)?;
    let mut md = header.metadata().clone();
    clear_segment_digests(&mut md);
    md.segments.0 = vec![
        (0, linear(seg.offset, None, None)),
        (1, linear(seg.offset, None, Some(FLAG_BACKUP_PREVIOUS))),
        (
            2,
            crypt(
                seg.offset,
                seg.iv_tweak,
                &seg.encryption,
                seg.sector_size,
                FLAG_BACKUP_FINAL,
            ),
        ),
    ];
    assign_segment(&mut md, digest, 2)?;
    let resilience = resilience_for(opts, &[seg.sector_size])?;
    finish_init(
        md,
        header.binary().hdr_size,
        Mode::Encrypt,
        Direction::Forward,
        resilience,
        None,
        Some(new_vk),
        opts,
    )
}

/// The metadata of a forward encryption in place (detached header, no data shift) with `done`
/// bytes encrypted from the start of the data and, if `hot` is given, the next `hot` bytes being
/// written (flagged `in-reencryption`): the "hot" and "post" segment sets of cryptsetup's
/// `reencrypt_make_hot_segments` / `_post_segments` for this mode. Regular segments: `crypt(0,
/// done)`, `crypt(done, hot, in-reencryption)`, `linear(rest, dynamic)`; then the backup segments
/// unchanged; the new volume key's digest lists `backup-final` and every regular crypt segment.
///
/// Errors: [`Error::Unsupported`] unless `r` is a forward encryption without a data shift.
pub fn encrypt_forward_progress(
    md: &Metadata,
    r: &Reencryption,
    done: u64,
    hot: Option<u64>,
) -> Result<Metadata, Error> {
    in_place_layout(r, Mode::Encrypt, Direction::Forward)?;
    let digest = crypt_layout_digest(&r.backup_final, r.digest_new, FLAG_BACKUP_FINAL)?;
    let base = r.backup_final.offset;
    let crypt_at =
        |at: u64, size: u64, hot: bool| r.backup_final.piece(at, base + at, Some(size), hot);
    let mut regular = Vec::new();
    if done > 0 {
        regular.push(crypt_at(0, done, false));
    }
    if let Some(len) = hot {
        regular.push(crypt_at(done, len, true));
    }
    let rest = done + hot.unwrap_or(0);
    regular.push(linear_at(base + rest, None, false));
    with_regular_segments(md, regular, digest, FLAG_BACKUP_FINAL)
}

/// The metadata of a backward decryption in place (detached header, no data shift) with the
/// first `remaining` bytes still encrypted and, if `hot` is given, the next `hot` bytes being
/// written as plaintext (flagged `in-reencryption`); `total` is the size of the data. Regular
/// segments: `crypt(0, remaining)`, `linear(remaining, hot, in-reencryption)`, `linear(rest,
/// dynamic)` (as cryptsetup's decrypt states in `docs/LUKS2-REENCRYPT.md` §6.C); the old volume
/// key's digest lists `backup-previous` and the regular crypt segment.
///
/// Errors: [`Error::Unsupported`] unless `r` is a backward decryption without a data shift.
pub fn decrypt_backward_progress(
    md: &Metadata,
    r: &Reencryption,
    remaining: u64,
    hot: Option<u64>,
    total: u64,
) -> Result<Metadata, Error> {
    in_place_layout(r, Mode::Decrypt, Direction::Backward)?;
    let digest = crypt_layout_digest(&r.backup_previous, r.digest_old, FLAG_BACKUP_PREVIOUS)?;
    let base = r.backup_previous.offset;
    let mut regular = Vec::new();
    if remaining > 0 {
        regular.push(r.backup_previous.piece(0, base, Some(remaining), false));
    }
    let mut end = remaining;
    if let Some(len) = hot {
        regular.push(linear_at(base + remaining, Some(len), true));
        end += len;
    }
    if end < total {
        regular.push(linear_at(base + end, None, false));
    }
    with_regular_segments(md, regular, digest, FLAG_BACKUP_PREVIOUS)
}

/// The metadata of a forward reencryption in place (new volume key, optionally a new sector
/// size; no data shift) with `done` bytes under the new key and, if `hot` is given, the next
/// `hot` bytes being rewritten (flagged `in-reencryption`, listed by both keys' digests, as
/// cryptsetup does); `total` is the size of the data. Regular segments: new `crypt(0, done)`,
/// `crypt(done, hot)`, old `crypt(rest, dynamic)`; once everything is done, one new dynamic
/// segment (`docs/LUKS2-REENCRYPT.md` §6.E).
///
/// Errors: [`Error::Unsupported`] unless `r` is a forward reencryption without a data shift.
pub fn reencrypt_forward_progress(
    md: &Metadata,
    r: &Reencryption,
    done: u64,
    hot: Option<u64>,
    total: u64,
) -> Result<Metadata, Error> {
    in_place_layout(r, Mode::Reencrypt, Direction::Forward)?;
    let (Some(old_digest), Some(new_digest)) = (r.digest_old, r.digest_new) else {
        return Err(Error::Corrupt("a reencryption without two digests".into()));
    };
    let base = r.backup_final.offset;
    let piece = |template: &ReencryptSegment, at: u64, size: Option<u64>, hot: bool| {
        template.piece(at, base + at, size, hot)
    };
    // (segment, listed by the new key's digest, listed by the old key's digest)
    let mut regular: Vec<(ReencryptSegment, bool, bool)> = Vec::new();
    let end = done + hot.unwrap_or(0);
    if end >= total && hot.is_none() {
        regular.push((piece(&r.backup_final, 0, None, false), true, false));
    } else {
        if done > 0 {
            regular.push((piece(&r.backup_final, 0, Some(done), false), true, false));
        }
        if let Some(len) = hot {
            regular.push((piece(&r.backup_final, done, Some(len), true), true, true));
        }
        if end < total {
            regular.push((piece(&r.backup_previous, end, None, false), false, true));
        }
    }
    let mut out = with_regular_segments(
        md,
        regular.iter().map(|(s, _, _)| s.clone()).collect(),
        new_digest,
        FLAG_BACKUP_FINAL,
    )?;
    // `with_regular_segments` listed every crypt segment under the new digest: put each where it
    // belongs, and the backup-previous under the old digest.
    clear_segment_digests(&mut out);
    let final_id = segment_by_flag(&out, FLAG_BACKUP_FINAL).map(|(id, _)| id);
    let previous_id = segment_by_flag(&out, FLAG_BACKUP_PREVIOUS).map(|(id, _)| id);
    let (Some(final_id), Some(previous_id)) = (final_id, previous_id) else {
        return Err(Error::Corrupt("backup segments are missing".into()));
    };
    assign_segment(&mut out, new_digest, final_id)?;
    assign_segment(&mut out, old_digest, previous_id)?;
    for (i, (_, new, old)) in regular.iter().enumerate() {
        if *new {
            assign_segment(&mut out, new_digest, i as u32)?;
        }
        if *old {
            assign_segment(&mut out, old_digest, i as u32)?;
        }
    }
    Ok(out)
}

fn linear_at(offset: u64, size: Option<u64>, hot: bool) -> ReencryptSegment {
    ReencryptSegment {
        id: 0,
        offset,
        size,
        kind: SegmentKind::Linear,
        flags: if hot {
            vec![FLAG_IN_REENCRYPTION.into()]
        } else {
            Vec::new()
        },
    }
}

/// `md` with `regular` as its regular segments (numbered from 0), the backup segments after them
/// unchanged, and `digest` listing the backup segment flagged `backup` and every regular crypt
/// segment.
fn with_regular_segments(
    md: &Metadata,
    regular: Vec<ReencryptSegment>,
    digest: u32,
    backup: &str,
) -> Result<Metadata, Error> {
    let crypt_ids: Vec<u32> = (0..regular.len() as u32)
        .filter(|&i| matches!(regular[i as usize].kind, SegmentKind::Crypt { .. }))
        .collect();
    let mut out = md.clone();
    let backups: Vec<SegmentEntry> = md
        .segments
        .0
        .iter()
        .filter(|(_, e)| is_backup(e))
        .map(|(_, e)| e.clone())
        .collect();
    let n = regular.len() as u32;
    out.segments.0 = regular
        .iter()
        .enumerate()
        .map(|(i, seg)| (i as u32, seg.to_entry()))
        .chain(
            backups
                .into_iter()
                .enumerate()
                .map(|(i, e)| (n + i as u32, e)),
        )
        .collect();
    clear_segment_digests(&mut out);
    let backup_id = segment_by_flag(&out, backup)
        .map(|(id, _)| id)
        .ok_or_else(|| Error::Corrupt(format!("there is no {backup} segment")))?;
    assign_segment(&mut out, digest, backup_id)?;
    for id in crypt_ids {
        assign_segment(&mut out, digest, id)?;
    }
    Ok(out)
}

/// The metadata once a reencryption has converted everything (`reencrypt_teardown_ok`): the
/// `backup-final` layout as the only segment, no reencrypt keyslot, no reencryption digest, no
/// reencryption requirement, the new volume key's digest listing segment 0, and the old key's
/// keyslots and digest removed. The caller wipes the removed keyslots' areas.
pub fn finished(md: &Metadata, r: &Reencryption) -> Result<Metadata, Error> {
    let mut out = md.clone();
    let mut last = r.backup_final.clone();
    last.flags.clear();
    out.segments.0 = vec![(0, last.to_entry())];
    out.keyslots.0.retain(|(n, _)| *n != r.keyslot.slot);
    if let Some(d) = r.digest {
        out.digests.0.retain(|(n, _)| *n != d);
    }
    clear_segment_digests(&mut out);
    if let (Some(d), SegmentKind::Crypt { .. }) = (r.digest_new, &r.backup_final.kind) {
        assign_segment(&mut out, d, 0)?;
    }
    // The old key protects nothing any more: its keyslots and digest go (a decryption ends
    // with no keyslots at all, as cryptsetup's does).
    if let Some(old) = r.digest_old.filter(|d| Some(*d) != r.digest_new) {
        let slots: Vec<String> = out
            .digests
            .get(old)
            .map(|d| d.keyslots().iter().map(|s| s.to_string()).collect())
            .unwrap_or_default();
        out.keyslots
            .0
            .retain(|(n, _)| !slots.contains(&n.to_string()));
        out.digests.0.retain(|(n, _)| *n != old);
    }
    if let Some(req) = out.config.requirements.as_mut() {
        if let Some(m) = req.mandatory.as_mut() {
            m.retain(|x| !x.starts_with("online-reencrypt"));
            if m.is_empty() {
                req.mandatory = None;
            }
        }
        if req.mandatory.is_none() && req.extra.is_empty() {
            out.config.requirements = None;
        }
    }
    Ok(out)
}

/// The metadata `cryptsetup reencrypt --encrypt --reduce-device-size 2*S --init-only DEV`
/// writes (header attached, `CRYPT_REENCRYPT_MOVE_FIRST_SEGMENT`), from a freshly formatted
/// header whose data offset is the shift S, for a device of `device_size` bytes.
///
/// With D = `device_size` − S and L = D − S (the size of the plaintext that will be encrypted):
/// segment 0 is `linear(D, min(S, L))` — where the engine must have **copied the device's first
/// bytes before writing this metadata** —, segment 1 (if L > S) `linear(S, L − S)` (the rest,
/// in place); `backup-moved-segment` copies segment 0, `backup-previous` is `linear(0, L)`,
/// `backup-final` the crypt segment at S; direction backward, resilience `datashift` by S in a
/// 4 KiB area. The header itself then goes over the first S bytes, which are safe at D.
///
/// Errors: those of [`init_encrypt`], and [`Error::Unsupported`] if the device is smaller than
/// twice the shift or not a multiple of the sector size past the header.
pub fn init_encrypt_datashift(
    header: &Header,
    new_vk: &[u8],
    device_size: u64,
    opts: &InitOptions,
) -> Result<Metadata, Error> {
    let (seg, digest) = plain_data_segment(header)?;
    check_key(header.metadata(), digest, new_vk)?;
    let shift = seg.offset;
    if shift == 0 || shift % 512 != 0 {
        return Err(Error::Unsupported(format!(
            "a data shift of {shift} bytes (the header's data offset must be the shift)"
        )));
    }
    let data_size = device_size.saturating_sub(shift);
    if data_size < shift {
        return Err(Error::Unsupported(format!(
            "a device of {device_size} bytes for a shift of {shift} bytes"
        )));
    }
    if data_size % u64::from(seg.sector_size.max(512)) != 0 {
        return Err(Error::Unsupported(format!(
            "a data area of {data_size} bytes, not a multiple of the sector size {}",
            seg.sector_size
        )));
    }
    // `reencrypt_set_encrypt_segments` with move_first_segment.
    let remaining = data_size - shift;
    if remaining == 0 {
        return Err(Error::Unsupported(format!(
            "a device of {device_size} bytes for a shift of {shift} bytes"
        )));
    }
    let first = linear(data_size, Some(remaining.min(shift)), None);
    let mut segments = vec![(0, first.clone())];
    if remaining > shift {
        segments.push((1, linear(shift, Some(remaining - shift), None)));
    }
    let n = segments.len() as u32;
    let mut md = header.metadata().clone();
    clear_segment_digests(&mut md);
    segments.push((n, with_flag(&first, FLAG_BACKUP_MOVED)));
    segments.push((
        n + 1,
        linear(0, Some(remaining), Some(FLAG_BACKUP_PREVIOUS)),
    ));
    segments.push((
        n + 2,
        crypt(
            shift,
            seg.iv_tweak,
            &seg.encryption,
            seg.sector_size,
            FLAG_BACKUP_FINAL,
        ),
    ));
    md.segments.0 = segments;
    assign_segment(&mut md, digest, n + 2)?;
    finish_init(
        md,
        header.binary().hdr_size,
        Mode::Encrypt,
        Direction::Backward,
        Resilience::Datashift { shift_size: shift },
        None,
        Some(new_vk),
        opts,
    )
}

/// The digest `vk` matches, preferring `first` (`LUKS2_digest_by_keyslot` of the new keyslot).
fn digest_of_key(md: &Metadata, vk: &[u8], first: u32) -> Result<u32, Error> {
    let mut order: Vec<u32> = vec![first];
    order.extend(md.digests.iter().map(|(n, _)| n).filter(|n| *n != first));
    for n in order {
        if matches!(md.digests.get(n), Some(Digest::Pbkdf2(_))) && check_key(md, n, vk).is_ok() {
            return Ok(n);
        }
    }
    Err(Error::Unsupported(
        "a new volume key that no keyslot holds (add a keyslot for it first)".into(),
    ))
}

/// The metadata `cryptsetup reencrypt --init-only DEV` writes once the keyslots for the new key
/// exist (the CLI first adds them, bound to a digest of their own and to no segment): segment 0
/// stays, `backup-previous` is a copy of it, `backup-final` a crypt segment at the same offset
/// with `target`'s cipher and sector size; direction forward; resilience from `opts`.
///
/// Errors: [`Error::WrongPassphrase`] if `old_vk` is not the data segment's key;
/// [`Error::Unsupported`] if no keyslot holds `new_vk`, and as [`init_encrypt`].
pub fn init_reencrypt(
    header: &Header,
    old_vk: &[u8],
    new_vk: &[u8],
    target: &Target,
    opts: &InitOptions,
) -> Result<Metadata, Error> {
    let (seg, digest_old) = plain_data_segment(header)?;
    let md0 = header.metadata();
    check_key(md0, digest_old, old_vk)?;
    // Prefer a digest other than the old one: the same key is a cipher change with --keep-key.
    let first_other = md0
        .digests
        .iter()
        .map(|(n, _)| n)
        .find(|n| *n != digest_old)
        .unwrap_or(digest_old);
    let digest_new = digest_of_key(md0, new_vk, first_other)?;
    if !(512..=4096).contains(&target.sector_size) || !target.sector_size.is_power_of_two() {
        return Err(Error::Unsupported(format!(
            "a sector size of {}",
            target.sector_size
        )));
    }
    let mut md = md0.clone();
    let entry0 = SegmentEntry::Crypt(seg.clone());
    md.segments.0 = vec![
        (0, entry0.clone()),
        (1, with_flag(&entry0, FLAG_BACKUP_PREVIOUS)),
        (
            2,
            crypt(
                seg.offset,
                seg.iv_tweak,
                &target.cipher,
                target.sector_size,
                FLAG_BACKUP_FINAL,
            ),
        ),
    ];
    assign_segment(&mut md, digest_old, 1)?;
    assign_segment(&mut md, digest_new, 2)?;
    let resilience = resilience_for(opts, &[seg.sector_size, target.sector_size])?;
    finish_init(
        md,
        header.binary().hdr_size,
        Mode::Reencrypt,
        Direction::Forward,
        resilience,
        Some(old_vk),
        Some(new_vk),
        opts,
    )
}

/// The metadata `cryptsetup reencrypt --decrypt --header HDR --init-only DATA` writes for a
/// detached header (data offset 0): segment 0 stays, `backup-previous` is a copy of it,
/// `backup-final` is `linear` at the same offset, dynamic; direction backward; resilience from
/// `opts`.
///
/// Errors: [`Error::WrongPassphrase`] if `old_vk` is not the volume's key, and as
/// [`init_encrypt`].
pub fn init_decrypt(header: &Header, old_vk: &[u8], opts: &InitOptions) -> Result<Metadata, Error> {
    let (seg, digest) = plain_data_segment(header)?;
    check_key(header.metadata(), digest, old_vk)?;
    let mut md = header.metadata().clone();
    let entry0 = SegmentEntry::Crypt(seg.clone());
    md.segments.0 = vec![
        (0, entry0.clone()),
        (1, with_flag(&entry0, FLAG_BACKUP_PREVIOUS)),
        (2, linear(seg.offset, None, Some(FLAG_BACKUP_FINAL))),
    ];
    assign_segment(&mut md, digest, 1)?;
    let resilience = resilience_for(opts, &[seg.sector_size])?;
    finish_init(
        md,
        header.binary().hdr_size,
        Mode::Decrypt,
        Direction::Backward,
        resilience,
        Some(old_vk),
        None,
        opts,
    )
}

/// The metadata `cryptsetup reencrypt --decrypt --header NEWFILE --init-only DEV` writes to
/// NEWFILE for a volume whose header is on DEV (data offset S, `device_size` bytes): the first
/// `moved` bytes of ciphertext (clipped to S and to the data) are copied from S to 0 over the old
/// header **before this metadata is written**, the rest is decrypted forward, each chunk of S
/// bytes written S bytes before where it was read, and the moved chunk last, in place under
/// checksums (`docs/LUKS2-REENCRYPT.md` §5.2). Regular segments `crypt(0, M)`, `crypt(S + M,
/// dynamic)`; backups `backup-moved-segment` (the first), `backup-previous` `crypt(S,
/// dynamic)`, `backup-final` `linear(0, dynamic)`; resilience `datashift-checksum`; requirement
/// `online-reencrypt-v3`.
///
/// Errors: as [`init_decrypt`], and [`Error::Unsupported`] for a header without a data offset,
/// a moved size that is not a multiple of the checksum block, or too large for the area.
pub fn init_decrypt_datashift(
    header: &Header,
    old_vk: &[u8],
    device_size: u64,
    moved: u64,
    opts: &InitOptions,
) -> Result<Metadata, Error> {
    let (seg, digest) = plain_data_segment(header)?;
    check_key(header.metadata(), digest, old_vk)?;
    let shift = seg.offset;
    let data_size = device_size.checked_sub(shift).filter(|d| *d > 0);
    let (Some(data_size), true) = (data_size, shift > 0) else {
        return Err(Error::Unsupported(format!(
            "moving the data of a {device_size}-byte device whose data starts at {shift}"
        )));
    };
    let Resilience::Checksum { hash, sector_size } = resilience_for(opts, &[seg.sector_size])?
    else {
        return Err(Error::Unsupported(
            "decrypting a moved first segment without checksums".into(),
        ));
    };
    let moved = moved.min(shift).min(data_size);
    if moved == 0 || !moved.is_multiple_of(u64::from(sector_size)) {
        return Err(Error::Unsupported(format!(
            "a moved first segment of {moved} bytes (a non-zero multiple of {sector_size})"
        )));
    }
    let previous = ReencryptSegment {
        id: 0,
        offset: shift,
        size: None,
        kind: SegmentKind::Crypt {
            iv_tweak: seg.iv_tweak,
            encryption: seg.encryption.clone(),
            sector_size: seg.sector_size,
        },
        flags: Vec::new(),
    };
    let first = previous.piece(0, 0, Some(moved), false);
    let mut segments = vec![first.to_entry()];
    if moved < data_size {
        segments.push(previous.piece(moved, shift + moved, None, false).to_entry());
    }
    segments.push(with_flag(&first.to_entry(), FLAG_BACKUP_MOVED));
    segments.push(with_flag(&previous.to_entry(), FLAG_BACKUP_PREVIOUS));
    segments.push(linear(0, None, Some(FLAG_BACKUP_FINAL)));
    let mut md = header.metadata().clone();
    clear_segment_digests(&mut md);
    md.segments.0 = segments
        .into_iter()
        .enumerate()
        .map(|(i, e)| (i as u32, e))
        .collect();
    let n = md.segments.0.len() as u32;
    for id in 0..n - 1 {
        assign_segment(&mut md, digest, id)?;
    }
    let hdr_size = header.binary().hdr_size;
    let hash_len = Hash::parse(&hash)?.digest_len() as u64;
    let md = finish_init(
        md,
        hdr_size,
        Mode::Decrypt,
        Direction::Forward,
        Resilience::DatashiftChecksum {
            hash,
            sector_size,
            shift_size: shift,
        },
        Some(old_vk),
        None,
        opts,
    )?;
    let r = parse(&md)?.ok_or_else(|| Error::Corrupt("the reencryption vanished".into()))?;
    if moved / u64::from(sector_size) * hash_len > r.keyslot.area_size {
        return Err(Error::Unsupported(format!(
            "a moved first segment of {moved} bytes: the keyslots area has room for the \
             checksums of {} bytes",
            r.keyslot.area_size / hash_len * u64::from(sector_size)
        )));
    }
    Ok(md)
}

/// The datashift layout of `r` (shift, moved segment), checked to be `mode` with `direction`.
fn shift_layout(
    r: &Reencryption,
    mode: Mode,
    direction: Direction,
) -> Result<(u64, &ReencryptSegment), Error> {
    match (r.keyslot.resilience.shift_size(), &r.backup_moved) {
        (Some(shift), Some(moved))
            if r.keyslot.mode == mode && r.keyslot.direction == direction =>
        {
            Ok((shift, moved))
        }
        _ => Err(wrong_layout(mode, direction, "with a moved first segment")),
    }
}

/// `r` must be `mode` in `direction` without a data shift.
fn in_place_layout(r: &Reencryption, mode: Mode, direction: Direction) -> Result<(), Error> {
    match r.backup_moved {
        None if r.keyslot.mode == mode && r.keyslot.direction == direction => Ok(()),
        _ => Err(wrong_layout(mode, direction, "without a data shift")),
    }
}

/// The volume-key digest of the crypt backup layout `layout` (flagged `flag`).
fn crypt_layout_digest(
    layout: &ReencryptSegment,
    digest: Option<u32>,
    flag: &str,
) -> Result<u32, Error> {
    if !matches!(layout.kind, SegmentKind::Crypt { .. }) {
        return Err(Error::Corrupt(format!(
            "the {flag} segment is not a crypt segment"
        )));
    }
    digest.ok_or_else(|| Error::Corrupt(format!("no digest lists the {flag} segment")))
}

fn wrong_layout(mode: Mode, direction: Direction, how: &str) -> Error {
    Error::Unsupported(format!(
        "progress of anything but a {} {} {how}",
        direction.as_str(),
        mode.as_str()
    ))
}

/// The metadata of the attached-header decryption of [`init_decrypt_datashift`] when the
/// logical range `[at, at + len)` of the `total` data bytes is being written (`hot`) or has
/// just been written. For `at > 0` that is a datashift chunk: regular segments `crypt(0, M)`
/// (the moved copy), `linear(M, ...)` (decrypted), the hotzone, `crypt(S + at + len, dynamic)`
/// (still to do); once the last chunk is done the plaintext is `linear(M, dynamic)`. `at == 0`
/// is the final step, the moved segment decrypted in place: `linear(0, M, in-reencryption)`,
/// `linear(M, dynamic)`, then just `linear(0, dynamic)` (`docs/LUKS2-REENCRYPT.md` §6.D).
///
/// Errors: [`Error::Unsupported`] unless `r` is a forward decryption with a moved segment.
pub fn decrypt_datashift_progress(
    md: &Metadata,
    r: &Reencryption,
    at: u64,
    len: u64,
    hot: bool,
    total: u64,
) -> Result<Metadata, Error> {
    let (shift, moved) = shift_layout(r, Mode::Decrypt, Direction::Forward)?;
    let digest = crypt_layout_digest(&r.backup_previous, r.digest_old, FLAG_BACKUP_PREVIOUS)?;
    let m = moved.size.unwrap_or(0);
    let end = at + len;
    let mut regular = Vec::new();
    if at == 0 {
        if hot {
            regular.push(linear_at(0, Some(len), true));
            regular.push(linear_at(len, None, false));
        } else {
            regular.push(linear_at(0, None, false));
        }
    } else {
        regular.push(moved.piece(0, moved.offset, moved.size, false));
        if hot {
            if at > m {
                regular.push(linear_at(m, Some(at - m), false));
            }
            regular.push(linear_at(at, Some(len), true));
        } else {
            regular.push(linear_at(m, (end < total).then(|| end - m), false));
        }
        if end < total {
            regular.push(r.backup_previous.piece(end, shift + end, None, false));
        }
    }
    let mut out = with_regular_segments(md, regular, digest, FLAG_BACKUP_PREVIOUS)?;
    let moved_id = segment_by_flag(&out, FLAG_BACKUP_MOVED)
        .map(|(id, _)| id)
        .ok_or_else(|| Error::Corrupt("there is no backup-moved-segment".into()))?;
    assign_segment(&mut out, digest, moved_id)?;
    Ok(out)
}

/// The metadata of the attached-header encryption of [`init_encrypt_datashift`] (backward, shift
/// S) when the logical range `[at, at + len)` of the `total` plaintext bytes is being written
/// (`hot`: `crypt(S + at, len, in-reencryption)`) or has just been written. The plaintext still
/// to do, `[0, at)`, is `linear(moved, min(S, at))` (its first S bytes, copied to the moved
/// segment) and `linear(S, at - S)` (the rest, in place); the ciphertext after the hotzone is
/// `crypt(S + at + len, total - at - len)`, and when `at` reaches 0, `crypt(S, dynamic)`
/// (`docs/LUKS2-REENCRYPT.md` §6.A).
///
/// Errors: [`Error::Unsupported`] unless `r` is a backward encryption with a moved segment.
pub fn encrypt_datashift_progress(
    md: &Metadata,
    r: &Reencryption,
    at: u64,
    len: u64,
    hot: bool,
    total: u64,
) -> Result<Metadata, Error> {
    let (shift, moved) = shift_layout(r, Mode::Encrypt, Direction::Backward)?;
    let digest = crypt_layout_digest(&r.backup_final, r.digest_new, FLAG_BACKUP_FINAL)?;
    let mut regular = Vec::new();
    if at > 0 {
        regular.push(linear_at(moved.offset, Some(at.min(shift)), false));
    }
    if at > shift {
        regular.push(linear_at(shift, Some(at - shift), false));
    }
    let final_ = &r.backup_final;
    if hot {
        regular.push(final_.piece(at, shift + at, Some(len), true));
        if at + len < total {
            let rest = at + len;
            regular.push(final_.piece(rest, shift + rest, Some(total - rest), false));
        }
    } else {
        let size = (at > 0).then(|| total - at);
        regular.push(final_.piece(at, shift + at, size, false));
    }
    with_regular_segments(md, regular, digest, FLAG_BACKUP_FINAL)
}

/// Write `metadata` as the next version of `header` on `dev` with the crate's header writer
/// (validated first, both copies, seqid + 1) and read the header back.
pub fn write_metadata(
    dev: &dyn Storage,
    header: &Header,
    metadata: &Metadata,
) -> Result<Header, Error> {
    super::write::write_metadata(dev, &header.next_fields(), metadata)?;
    Header::read(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The §6.A example of the research note: encrypt + datashift init, 205-byte blob.
    #[test]
    fn blob_layout_matches_cryptsetup_serialiser() {
        let text = r#"{"keyslots":{"1":{"area":{"offset":"290816","size":"4096","type":"datashift","shift_size":"16777216"},"type":"reencrypt","key_size":1,"mode":"encrypt","direction":"backward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"50331648","size":"16777216"},"1":{"type":"linear","offset":"16777216","size":"16777216"},"2":{"type":"linear","offset":"50331648","size":"16777216","flags":["backup-moved-segment"]},"3":{"type":"linear","offset":"0","size":"33554432","flags":["backup-previous"]},"4":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":[],"segments":["4"],"hash":"sha256","iterations":1000,"salt":"AAAA","digest":"AAAA"}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#;
        let md = Metadata::from_json(serde_json::from_str(text).unwrap()).unwrap();
        let vk = [0x11u8; 64];
        let blob = reencrypt_digest_blob(&md, None, Some(&vk)).unwrap();
        assert_eq!(blob.len(), 205);
        let mut want = b"v2".to_vec();
        want.extend_from_slice(&vk);
        want.extend_from_slice(b"encryptbackwarddatashift");
        want.extend_from_slice(&290816u64.to_be_bytes());
        want.extend_from_slice(&4096u64.to_be_bytes());
        want.extend_from_slice(&16777216u64.to_be_bytes());
        want.extend_from_slice(b"linear");
        want.extend_from_slice(&0u64.to_be_bytes());
        want.extend_from_slice(&33554432u64.to_be_bytes());
        want.extend_from_slice(b"crypt");
        want.extend_from_slice(&16777216u64.to_be_bytes());
        want.extend_from_slice(b"dynamic");
        want.extend_from_slice(&0u64.to_be_bytes());
        want.extend_from_slice(b"aes-xts-plain64");
        want.extend_from_slice(&512u32.to_be_bytes());
        want.extend_from_slice(b"linear");
        want.extend_from_slice(&50331648u64.to_be_bytes());
        want.extend_from_slice(&16777216u64.to_be_bytes());
        assert_eq!(&blob[..], &want[..]);
        // The new key is needed; an old one is not asked for.
        assert!(matches!(
            reencrypt_digest_blob(&md, Some(&vk), None),
            Err(Error::Unsupported(_))
        ));
        let r = parse(&md).unwrap().unwrap();
        assert_eq!(r.state(), State::Clean);
        assert_eq!(state(&md), State::Clean);
        assert_eq!(r.backup_moved.as_ref().unwrap().id, 2);
        assert_eq!(r.segments.len(), 2);
        assert_eq!(
            r.keyslot.resilience,
            Resilience::Datashift {
                shift_size: 16 << 20
            }
        );
        assert_eq!(r.digest_new, Some(0));
        assert_eq!(r.digest_old, None);
        assert_eq!(r.digest, None);
        // The keyslot JSON round-trips in cryptsetup's order.
        let (_, ks) = reencrypt_keyslot(&md).unwrap();
        assert_eq!(
            serde_json::to_string(&r.keyslot.to_json()).unwrap(),
            serde_json::to_string(ks).unwrap()
        );
    }

    #[test]
    fn mistyped_fields_are_refused_not_panicked_on() {
        let base: Value = serde_json::from_str(r#"{"keyslots":{"1":{"area":{"offset":"290816","size":"16486400","type":"checksum","hash":"sha256","sector_size":4096},"type":"reencrypt","key_size":1,"mode":"encrypt","direction":"forward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"0","size":"dynamic"},"1":{"type":"linear","offset":"0","size":"dynamic","flags":["backup-previous"]},"2":{"type":"crypt","offset":"0","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":[],"segments":["2"],"hash":"sha256","iterations":1000,"salt":"AAAA","digest":"AAAA"}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#).unwrap();
        let vk = [7u8; 64];
        let ok = Metadata::from_json(base.clone()).unwrap();
        assert!(reencrypt_digest_blob(&ok, None, Some(&vk)).is_ok());
        for (ptr, bad) in [
            ("/keyslots/1/area/sector_size", json!("4096")),
            ("/keyslots/1/area/offset", json!(290816)),
            ("/keyslots/1/mode", json!("")),
            ("/keyslots/1/area/hash", json!("x".repeat(65))),
            ("/segments/1/size", json!(5)),
        ] {
            let mut v = base.clone();
            *v.pointer_mut(ptr).unwrap() = bad;
            let md = Metadata::from_json(v).unwrap();
            assert!(
                matches!(
                    reencrypt_digest_blob(&md, None, Some(&vk)),
                    Err(Error::Corrupt(_))
                ),
                "{ptr}"
            );
        }
        let mut v = base.clone();
        v["segments"]["0"]["flags"] = json!(["in-reencryption"]);
        assert_eq!(state(&Metadata::from_json(v).unwrap()), State::Crash);
        let mut v = base;
        v["config"].as_object_mut().unwrap().remove("requirements");
        let md = Metadata::from_json(v).unwrap();
        assert_eq!(state(&md), State::None);
        assert!(parse(&md).unwrap().is_none());
    }
}
