//! The `reencrypt` keyslot (cryptsetup's `luks2_keyslot_reenc.c`): it holds no key, only what an
//! in-place conversion is doing (mode, direction) and where its resilience data lives (the area,
//! whose type says how a step survives a crash). Typed here like the `luks2` keyslot, dispatched
//! by its `type`, and written back in the field order cryptsetup creates (`reenc_keyslot_alloc`,
//! then the priority), with fields this model does not know kept.

use serde::ser::Serializer;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{AreaPlace, Fields};
use crate::error::Error;
use crate::luks2::validate::{as_u32, str_to_u64};

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

    pub(crate) fn parse(s: &str) -> Option<Mode> {
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

    pub(crate) fn parse(s: &str) -> Option<Direction> {
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
    /// The raw `priority` field (cryptsetup writes 0: never tried for a passphrase).
    pub priority: Option<Value>,
    /// Keyslot fields this model does not know.
    pub extra: Fields,
    /// Area fields this model does not know.
    pub area_extra: Fields,
}

fn optional_decimal<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(n) => s.collect_str(n),
        None => s.serialize_none(),
    }
}

#[derive(Serialize)]
struct AreaBody<'a> {
    #[serde(flatten)]
    place: AreaPlace,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    hash: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sector_size: Option<u32>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "optional_decimal"
    )]
    shift_size: Option<u64>,
    #[serde(flatten)]
    extra: &'a Fields,
}

#[derive(Serialize)]
struct KeyslotBody<'a> {
    area: AreaBody<'a>,
    #[serde(rename = "type")]
    kind: &'static str,
    key_size: u32,
    mode: &'static str,
    direction: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<&'a Value>,
    #[serde(flatten)]
    extra: &'a Fields,
}

impl Serialize for ReencryptKeyslot {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (hash, sector_size) = match &self.resilience {
            Resilience::Checksum { hash, sector_size }
            | Resilience::DatashiftChecksum {
                hash, sector_size, ..
            } => (Some(hash.as_str()), Some(*sector_size)),
            _ => (None, None),
        };
        KeyslotBody {
            area: AreaBody {
                place: AreaPlace {
                    offset: self.area_offset,
                    size: self.area_size,
                },
                kind: self.resilience.area_type(),
                hash,
                sector_size,
                shift_size: self.resilience.shift_size(),
                extra: &self.area_extra,
            },
            kind: "reencrypt",
            // The keyslot stores no key; cryptsetup requires exactly 1.
            key_size: 1,
            mode: self.mode.as_str(),
            direction: self.direction.as_str(),
            priority: self.priority.as_ref(),
            extra: &self.extra,
        }
        .serialize(s)
    }
}

impl ReencryptKeyslot {
    /// A new keyslot as `cryptsetup reencrypt --init-only` creates it (priority 0).
    pub fn new(
        slot: u32,
        mode: Mode,
        direction: Direction,
        area: (u64, u64),
        resilience: Resilience,
    ) -> ReencryptKeyslot {
        ReencryptKeyslot {
            slot,
            mode,
            direction,
            area_offset: area.0,
            area_size: area.1,
            resilience,
            priority: Some(Value::from(0)),
            extra: Map::new(),
            area_extra: Map::new(),
        }
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
        let mut area_known = vec!["offset", "size", "type"];
        if matches!(
            resilience,
            Resilience::Checksum { .. } | Resilience::DatashiftChecksum { .. }
        ) {
            area_known.extend(["hash", "sector_size"]);
        }
        if resilience.shift_size().is_some() {
            area_known.push("shift_size");
        }
        let unknown = |obj: &Value, known: &[&str]| -> Fields {
            obj.as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| !known.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        Ok(ReencryptKeyslot {
            slot,
            mode,
            direction,
            area_offset: number(area, "offset")?,
            area_size: number(area, "size")?,
            resilience,
            priority: v.get("priority").cloned(),
            extra: unknown(
                v,
                &["area", "type", "key_size", "mode", "direction", "priority"],
            ),
            area_extra: unknown(area, &area_known),
        })
    }
}
