//! The reencryption's model as cryptsetup stores it: requirement versions, the reencrypt
//! keyslot (mode, direction, resilience), segments by flag, the state, and parsing it all from a
//! header's metadata.

use super::*;

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

/// The longest string the digest serialiser accepts (`MAX_STR`).
pub(super) const MAX_STR: usize = 64;
/// The area cryptsetup reserves for plain `datashift` (a 1-byte "key" AF-split, rounded to 4K).
pub(super) const DATASHIFT_AREA: u64 = 4096;

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

pub(super) fn entry_flags(entry: &SegmentEntry) -> Vec<String> {
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

pub(super) fn entry_has_flag(entry: &SegmentEntry, flag: &str) -> bool {
    entry_flags(entry).iter().any(|f| f == flag)
}

pub(super) fn is_backup(entry: &SegmentEntry) -> bool {
    entry_flags(entry).iter().any(|f| f.starts_with("backup-"))
}

/// The first segment carrying `flag` (`LUKS2_get_segment_by_flag`), with its number.
pub(super) fn segment_by_flag<'a>(md: &'a Metadata, flag: &str) -> Option<(u32, &'a SegmentEntry)> {
    md.segments.iter().find(|(_, s)| entry_has_flag(s, flag))
}

/// The first keyslot of type `reencrypt` (`LUKS2_find_keyslot`).
pub(super) fn reencrypt_keyslot(md: &Metadata) -> Option<(u32, &Value)> {
    md.keyslots.iter().find_map(|(n, k)| match k {
        Keyslot::Other(v) if k.kind() == "reencrypt" => Some((n, v)),
        _ => None,
    })
}

/// The digest listing segment `flag`'s segment (`LUKS2_reencrypt_digest_old/new`).
pub(super) fn digest_of_flag(md: &Metadata, flag: &str) -> Option<u32> {
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
