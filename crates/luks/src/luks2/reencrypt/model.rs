//! The reencryption's model as cryptsetup stores it: requirement versions, segments by flag, the
//! state, and parsing it all (with the typed reencrypt keyslot, [`ReencryptKeyslot`]) from a
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
        .any(|(_, s)| s.has_flag(FLAG_IN_REENCRYPTION))
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
            SegmentEntry::Linear(l) => Ok(ReencryptSegment {
                id,
                offset: l.offset,
                size: l.size,
                kind: SegmentKind::Linear,
                flags: l.flags.clone().unwrap_or_default(),
            }),
            other @ SegmentEntry::Other(_) => Err(Error::Unsupported(format!(
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
        match &self.kind {
            SegmentKind::Linear => SegmentEntry::Linear(LinearSegment {
                offset: self.offset,
                size: self.size,
                flags,
                extra: Map::new(),
            }),
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

/// Whether only the end of the conversion is left: no step in flight, the old and new keys
/// differ, and every regular segment already has the final layout (plaintext after a
/// decryption; the new key's digest, cipher and sector size otherwise). The end needs no old
/// key, and may have to do without one: cryptsetup's end destroys the old key's keyslots one
/// header write at a time (the area wiped first) before it drops the requirement, so a crash
/// there leaves this state with an old key that no longer opens, which cryptsetup itself then
/// cannot open, resume or repair.
pub fn all_converted(md: &Metadata, r: &Reencryption) -> bool {
    let final_layout = |s: &ReencryptSegment| match (&s.kind, &r.backup_final.kind, r.digest_new) {
        (SegmentKind::Linear, SegmentKind::Linear, None) => true,
        (
            SegmentKind::Crypt {
                encryption,
                sector_size,
                ..
            },
            SegmentKind::Crypt {
                encryption: final_encryption,
                sector_size: final_sector_size,
                ..
            },
            Some(new),
        ) => {
            encryption == final_encryption
                && sector_size == final_sector_size
                && md.digest_of_segment(s.id).map(|(n, _)| n) == Some(new)
        }
        _ => false,
    };
    r.state() == State::Clean
        && r.digest_old != r.digest_new
        && !r.segments.is_empty()
        && r.segments.iter().all(final_layout)
}

pub(super) fn is_backup(entry: &SegmentEntry) -> bool {
    entry.flags().iter().any(|f| f.starts_with("backup-"))
}

/// The first segment carrying `flag` (`LUKS2_get_segment_by_flag`), with its number.
pub(super) fn segment_by_flag<'a>(md: &'a Metadata, flag: &str) -> Option<(u32, &'a SegmentEntry)> {
    md.segments.iter().find(|(_, s)| s.has_flag(flag))
}

/// The first keyslot of type `reencrypt` (`LUKS2_find_keyslot`), typed or, if this model could
/// not read it, as stored.
pub(super) fn reencrypt_keyslot(md: &Metadata) -> Option<(u32, &Keyslot)> {
    md.keyslots.iter().find(|(_, k)| k.kind() == "reencrypt")
}

/// The digest listing segment `flag`'s segment (`LUKS2_reencrypt_digest_old/new`).
pub(super) fn digest_of_flag(md: &Metadata, flag: &str) -> Option<u32> {
    let (id, _) = segment_by_flag(md, flag)?;
    md.digest_of_segment(id).map(|(n, _)| n)
}

/// Read the reencryption from `metadata`: `None` when there is none ([`State::None`]).
///
/// Reading is allowed beside a requirement this implementation does not know (a passphrase test
/// opens the keys through it, as cryptsetup's does); continuing the conversion is not, which
/// [`Metadata::check_requirements_known`] refuses where it runs.
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
    let keyslot = match ks {
        Keyslot::Reencrypt(k) => (**k).clone(),
        // Not readable as a reencrypt keyslot: parsing it again says why.
        Keyslot::Other(v) => ReencryptKeyslot::from_json(slot, v)?,
        Keyslot::Luks2(_) => {
            return Err(Error::Corrupt(format!(
                "keyslot {slot} is not a reencrypt keyslot"
            )))
        }
    };
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
