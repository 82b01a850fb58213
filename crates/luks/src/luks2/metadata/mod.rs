//! The LUKS2 JSON metadata as types. Built from JSON that has passed [`super::validate`], and
//! serialisable back to the compact text cryptsetup writes: fields are declared in the order
//! cryptsetup creates them, numbers cryptsetup stores as decimal strings are written as such,
//! binary values as standard base64, and whatever this model does not know (unknown fields,
//! tokens, keyslots, segments and digests of other types) is kept as raw JSON. Objects are
//! dispatched by their `type`, as cryptsetup dispatches keyslot and segment handlers: keyslots
//! `luks2` and `reencrypt`, segments `crypt` and `linear`, digests `pbkdf2`.
//!
//! What the model checks beyond cryptsetup's validation (all of it would make the field unusable
//! anyway): names are plain decimal numbers, base64 fields decode, and integers fit their type.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};

use super::validate::{as_u32, str_to_u64};
use crate::kdf::Argon2Variant;

mod reencrypt_keyslot;
pub use reencrypt_keyslot::{Direction, Mode, ReencryptKeyslot, Resilience};

/// A JSON object keyed by keyslot, segment, digest or token number, in the order the header
/// lists them (serialised back in that order).
#[derive(Clone, Debug, PartialEq)]
pub struct Numbered<T>(pub Vec<(u32, T)>);

impl<T> Numbered<T> {
    /// The entry numbered `n`.
    pub fn get(&self, n: u32) -> Option<&T> {
        self.0.iter().find(|(k, _)| *k == n).map(|(_, v)| v)
    }

    /// Entries in header order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.0.iter().map(|(k, v)| (*k, v))
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: Serialize> Serialize for Numbered<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(&k.to_string(), v)?;
        }
        map.end()
    }
}

/// The whole metadata object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metadata {
    /// Keyslots by number.
    pub keyslots: Numbered<Keyslot>,
    /// Tokens by number, kept as they are (sectorcrypt does not use them).
    pub tokens: Numbered<Value>,
    /// Segments by number.
    pub segments: Numbered<SegmentEntry>,
    /// Digests by number.
    pub digests: Numbered<Digest>,
    /// The config section.
    pub config: Config,
    /// Top-level fields this model does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Serialises `"type": kind` followed by the fields of `body`, the layout of every typed LUKS2
/// object.
#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(flatten)]
    body: &'a T,
}

fn decimal<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn base64<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&BASE64.encode(v))
}

/// A keyslot.
#[derive(Clone, Debug, PartialEq)]
pub enum Keyslot {
    /// A `luks2` keyslot with a KDF sectorcrypt knows.
    Luks2(Box<Luks2Keyslot>),
    /// The `reencrypt` keyslot of an in-place conversion.
    Reencrypt(Box<ReencryptKeyslot>),
    /// Any other keyslot (another type, a `luks2` keyslot with an unknown KDF, or a `reencrypt`
    /// keyslot this model cannot read, which [`ReencryptKeyslot::from_json`] explains), as
    /// stored.
    Other(Value),
}

impl Serialize for Keyslot {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Keyslot::Luks2(k) => Tagged {
                kind: "luks2",
                body: k,
            }
            .serialize(s),
            Keyslot::Reencrypt(k) => k.serialize(s),
            Keyslot::Other(v) => v.serialize(s),
        }
    }
}

impl Keyslot {
    /// The `type` field.
    pub fn kind(&self) -> &str {
        match self {
            Keyslot::Luks2(_) => "luks2",
            Keyslot::Reencrypt(_) => "reencrypt",
            Keyslot::Other(v) => v.get("type").and_then(Value::as_str).unwrap_or(""),
        }
    }

    /// The `priority` field as cryptsetup reads it (absent = normal).
    pub fn priority(&self) -> Priority {
        let raw = match self {
            Keyslot::Luks2(k) => k.priority.as_ref(),
            Keyslot::Reencrypt(k) => k.priority.as_ref(),
            Keyslot::Other(v) => v.get("priority"),
        };
        Priority::from_json(raw)
    }

    /// The (offset, size) of its area in the keyslots area, whatever its type
    /// (`LUKS2_keyslot_area`); `None` if an unknown keyslot names none.
    pub fn area(&self) -> Option<(u64, u64)> {
        match self {
            Keyslot::Luks2(k) => Some((k.area.offset, k.area.size)),
            Keyslot::Reencrypt(k) => Some((k.area_offset, k.area_size)),
            Keyslot::Other(v) => {
                let get = |key: &str| v.get("area")?.get(key)?.as_str().and_then(str_to_u64);
                Some((get("offset")?, get("size")?))
            }
        }
    }
}

/// A keyslot's priority (cryptsetup's `crypt_keyslot_priority`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// 0: never tried unless asked for by number.
    Ignore,
    /// 1 (or absent): tried after the preferred ones.
    Normal,
    /// 2: tried first.
    Prefer,
    /// Anything else: cryptsetup shows it as "invalid" and never tries it unasked.
    Invalid,
}

impl Priority {
    fn from_json(v: Option<&Value>) -> Priority {
        match v.map(Value::as_i64) {
            None => Priority::Normal,
            Some(Some(0)) => Priority::Ignore,
            Some(Some(1)) => Priority::Normal,
            Some(Some(2)) => Priority::Prefer,
            Some(_) => Priority::Invalid,
        }
    }

    /// The word `cryptsetup luksDump` prints.
    pub fn description(self) -> &'static str {
        match self {
            Priority::Ignore => "ignored",
            Priority::Normal => "normal",
            Priority::Prefer => "preferred",
            Priority::Invalid => "invalid",
        }
    }
}

/// A `luks2` keyslot: the volume key, AF-split and encrypted in an area of the keyslots area
/// with a key derived from a passphrase.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Luks2Keyslot {
    /// Bytes of the volume key stored.
    pub key_size: u32,
    /// The anti-forensic splitter.
    pub af: Af,
    /// Where the material is and how it is encrypted.
    pub area: Area,
    /// How the area key is derived from the passphrase.
    pub kdf: KeyslotKdf,
    /// The raw `priority` field (see [`Keyslot::priority`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<Value>,
    /// Fields this model does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The `af` object of a `luks2` keyslot (type `luks1`, the only one cryptsetup knows).
#[derive(Clone, Debug, PartialEq)]
pub struct Af {
    /// Number of stripes (4000).
    pub stripes: u32,
    /// The diffusion hash.
    pub hash: String,
    /// Fields this model does not know.
    pub extra: Map<String, Value>,
}

#[derive(Serialize)]
struct AfBody<'a> {
    stripes: u32,
    hash: &'a str,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

impl Serialize for Af {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Tagged {
            kind: "luks1",
            body: &AfBody {
                stripes: self.stripes,
                hash: &self.hash,
                extra: &self.extra,
            },
        }
        .serialize(s)
    }
}

/// The `area` object of a `luks2` keyslot (type `raw`).
#[derive(Clone, Debug, PartialEq)]
pub struct Area {
    /// Byte offset on the device.
    pub offset: u64,
    /// Bytes reserved.
    pub size: u64,
    /// The cipher specification of the area.
    pub encryption: String,
    /// Bytes of the area key.
    pub key_size: u32,
    /// Fields this model does not know.
    pub extra: Map<String, Value>,
}

/// The `offset` and `size` of an `area` object, of a `luks2` or a `reencrypt` keyslot alike.
#[derive(Serialize)]
struct AreaPlace {
    #[serde(serialize_with = "decimal")]
    offset: u64,
    #[serde(serialize_with = "decimal")]
    size: u64,
}

#[derive(Serialize)]
struct AreaBody<'a> {
    #[serde(flatten)]
    place: AreaPlace,
    encryption: &'a str,
    key_size: u32,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

impl Serialize for Area {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Tagged {
            kind: "raw",
            body: &AreaBody {
                place: AreaPlace {
                    offset: self.offset,
                    size: self.size,
                },
                encryption: &self.encryption,
                key_size: self.key_size,
                extra: &self.extra,
            },
        }
        .serialize(s)
    }
}

/// The `kdf` object of a `luks2` keyslot. Has no unknown fields: cryptsetup removes them.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyslotKdf {
    /// PBKDF2-HMAC.
    Pbkdf2 {
        /// The hash name.
        hash: String,
        /// Iterations.
        iterations: u32,
        /// The salt (32 bytes in anything cryptsetup opens).
        salt: Vec<u8>,
    },
    /// Argon2i or Argon2id.
    Argon2 {
        /// Which one.
        variant: Argon2Variant,
        /// Iterations (`time`).
        time: u32,
        /// Memory cost in KiB.
        memory: u32,
        /// Parallelism (`cpus`).
        cpus: u32,
        /// The salt.
        salt: Vec<u8>,
    },
}

#[derive(Serialize)]
struct Pbkdf2Body<'a> {
    hash: &'a str,
    iterations: u32,
    #[serde(serialize_with = "base64")]
    salt: &'a [u8],
}

#[derive(Serialize)]
struct Argon2Body<'a> {
    time: u32,
    memory: u32,
    cpus: u32,
    #[serde(serialize_with = "base64")]
    salt: &'a [u8],
}

impl KeyslotKdf {
    /// The LUKS2 name (`pbkdf2`, `argon2i`, `argon2id`).
    pub fn name(&self) -> &'static str {
        match self {
            KeyslotKdf::Pbkdf2 { .. } => "pbkdf2",
            KeyslotKdf::Argon2 {
                variant: Argon2Variant::Argon2i,
                ..
            } => "argon2i",
            KeyslotKdf::Argon2 {
                variant: Argon2Variant::Argon2id,
                ..
            } => "argon2id",
        }
    }

    /// The salt.
    pub fn salt(&self) -> &[u8] {
        match self {
            KeyslotKdf::Pbkdf2 { salt, .. } | KeyslotKdf::Argon2 { salt, .. } => salt,
        }
    }
}

impl Serialize for KeyslotKdf {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KeyslotKdf::Pbkdf2 {
                hash,
                iterations,
                salt,
            } => Tagged {
                kind: self.name(),
                body: &Pbkdf2Body {
                    hash,
                    iterations: *iterations,
                    salt,
                },
            }
            .serialize(s),
            KeyslotKdf::Argon2 {
                time,
                memory,
                cpus,
                salt,
                ..
            } => Tagged {
                kind: self.name(),
                body: &Argon2Body {
                    time: *time,
                    memory: *memory,
                    cpus: *cpus,
                    salt,
                },
            }
            .serialize(s),
        }
    }
}

/// A segment.
#[derive(Clone, Debug, PartialEq)]
pub enum SegmentEntry {
    /// A `crypt` segment: encrypted data.
    Crypt(CryptSegment),
    /// A `linear` segment: plaintext (during an in-place conversion).
    Linear(LinearSegment),
    /// Any other type, as stored.
    Other(Value),
}

impl Serialize for SegmentEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SegmentEntry::Crypt(c) => Tagged {
                kind: "crypt",
                body: c,
            }
            .serialize(s),
            SegmentEntry::Linear(l) => Tagged {
                kind: "linear",
                body: l,
            }
            .serialize(s),
            SegmentEntry::Other(v) => v.serialize(s),
        }
    }
}

impl SegmentEntry {
    /// The `type` field.
    pub fn kind(&self) -> &str {
        match self {
            SegmentEntry::Crypt(_) => "crypt",
            SegmentEntry::Linear(_) => "linear",
            SegmentEntry::Other(v) => v.get("type").and_then(Value::as_str).unwrap_or(""),
        }
    }

    /// Its flags (`backup-final`, `in-reencryption`, ...), whatever its type.
    pub fn flags(&self) -> Vec<&str> {
        match self {
            SegmentEntry::Crypt(CryptSegment { flags, .. })
            | SegmentEntry::Linear(LinearSegment { flags, .. }) => {
                flags.iter().flatten().map(String::as_str).collect()
            }
            SegmentEntry::Other(v) => v
                .get("flags")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect(),
        }
    }

    /// Whether it carries `flag`.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags().contains(&flag)
    }

    /// Add `flag` after its flags (`LUKS2_segment_set_flag`).
    pub fn add_flag(&mut self, flag: &str) {
        match self {
            SegmentEntry::Crypt(CryptSegment { flags, .. })
            | SegmentEntry::Linear(LinearSegment { flags, .. }) => {
                flags.get_or_insert_with(Vec::new).push(flag.into())
            }
            SegmentEntry::Other(v) => {
                if let Some(obj) = v.as_object_mut() {
                    match obj.get_mut("flags") {
                        Some(Value::Array(a)) => a.push(Value::from(flag)),
                        _ => {
                            obj.insert("flags".into(), Value::from(vec![flag]));
                        }
                    }
                }
            }
        }
    }
}

fn size_or_dynamic<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(n) => s.collect_str(n),
        None => s.serialize_str("dynamic"),
    }
}

/// A `crypt` segment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CryptSegment {
    /// Byte offset of the encrypted data on the device.
    #[serde(serialize_with = "decimal")]
    pub offset: u64,
    /// Bytes of data, or `None` for "dynamic" (to the end of the device).
    #[serde(serialize_with = "size_or_dynamic")]
    pub size: Option<u64>,
    /// Added to every IV, in 512-byte sectors (dm-crypt's `iv_offset`).
    #[serde(serialize_with = "decimal")]
    pub iv_tweak: u64,
    /// The cipher specification.
    pub encryption: String,
    /// The encryption sector size in bytes.
    pub sector_size: u32,
    /// dm-integrity parameters, as stored (sectorcrypt does not implement integrity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub integrity: Option<Value>,
    /// Segment flags (`in-reencryption`, `backup-final`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<String>>,
    /// Fields this model does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A `linear` segment: plaintext stored as is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinearSegment {
    /// Byte offset of the data on the device.
    #[serde(serialize_with = "decimal")]
    pub offset: u64,
    /// Bytes of data, or `None` for "dynamic" (to the end of the device).
    #[serde(serialize_with = "size_or_dynamic")]
    pub size: Option<u64>,
    /// Segment flags.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<String>>,
    /// Fields this model does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A digest: what tells the right volume key from a wrong one.
#[derive(Clone, Debug, PartialEq)]
pub enum Digest {
    /// A `pbkdf2` digest.
    Pbkdf2(Pbkdf2Digest),
    /// Any other type, as stored.
    Other(Value),
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Digest::Pbkdf2(d) => Tagged {
                kind: "pbkdf2",
                body: d,
            }
            .serialize(s),
            Digest::Other(v) => v.serialize(s),
        }
    }
}

impl Digest {
    /// The `type` field.
    pub fn kind(&self) -> &str {
        match self {
            Digest::Pbkdf2(_) => "pbkdf2",
            Digest::Other(v) => v.get("type").and_then(Value::as_str).unwrap_or(""),
        }
    }

    fn list(&self, key: &str) -> Vec<&str> {
        match self {
            Digest::Pbkdf2(d) => {
                let list = if key == "keyslots" {
                    &d.keyslots
                } else {
                    &d.segments
                };
                list.iter().map(String::as_str).collect()
            }
            Digest::Other(v) => v
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect(),
        }
    }

    /// The keyslot names it covers, as stored.
    pub fn keyslots(&self) -> Vec<&str> {
        self.list("keyslots")
    }

    /// The segment names it covers, as stored.
    pub fn segments(&self) -> Vec<&str> {
        self.list("segments")
    }
}

/// A `pbkdf2` digest: `PBKDF2(volume key, salt, iterations)` truncated to the digest's length.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Pbkdf2Digest {
    /// Keyslot names, as stored.
    pub keyslots: Vec<String>,
    /// Segment names, as stored.
    pub segments: Vec<String>,
    /// The hash name.
    pub hash: String,
    /// Iterations.
    pub iterations: u32,
    /// The salt.
    #[serde(serialize_with = "base64")]
    pub salt: Vec<u8>,
    /// The expected PBKDF2 output.
    #[serde(serialize_with = "base64")]
    pub digest: Vec<u8>,
    /// Fields this model does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The `config` object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    /// Bytes of the JSON area (header size minus the 4096-byte binary header).
    #[serde(serialize_with = "decimal")]
    pub json_size: u64,
    /// Bytes of the keyslots area, which follows the two header copies.
    #[serde(serialize_with = "decimal")]
    pub keyslots_size: u64,
    /// Persistent activation flags (`allow-discards`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<String>>,
    /// Requirements a program must meet to use the volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requirements: Option<Requirements>,
    /// Fields this model does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The `config.requirements` object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Requirements {
    /// Requirements without which the volume must not be used (e.g. `online-reencrypt-v2`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mandatory: Option<Vec<String>>,
    /// Fields this model does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Metadata {
    /// The mandatory requirements (empty if none).
    pub fn mandatory_requirements(&self) -> &[String] {
        self.config
            .requirements
            .as_ref()
            .and_then(|r| r.mandatory.as_deref())
            .unwrap_or(&[])
    }

    /// The mandatory requirements this implementation does not know: all but the reencryption
    /// ones (`online-reencrypt`, `-v2`, `-v3`). A header with any may be read, never written.
    pub fn unknown_requirements(&self) -> Vec<String> {
        const KNOWN: [&str; 3] = [
            "online-reencrypt",
            "online-reencrypt-v2",
            "online-reencrypt-v3",
        ];
        self.mandatory_requirements()
            .iter()
            .filter(|r| !KNOWN.contains(&r.as_str()))
            .cloned()
            .collect()
    }

    /// Refused ([`Error::UnmetRequirements`]) if the header has a mandatory requirement this
    /// implementation does not know: every write of a header, every conversion of its data and
    /// every activation (a volume served or mounted, a flash attached) asks this first, as
    /// cryptsetup does; reading the header and testing a passphrase do not.
    pub fn check_requirements_known(&self) -> Result<(), crate::error::Error> {
        let unknown = self.unknown_requirements();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(crate::error::Error::UnmetRequirements(unknown))
        }
    }

    /// The digest covering keyslot `slot`, with its number.
    pub fn digest_of_keyslot(&self, slot: u32) -> Option<(u32, &Digest)> {
        let name = slot.to_string();
        self.digests
            .iter()
            .find(|(_, d)| d.keyslots().contains(&name.as_str()))
    }

    /// The digest covering segment `segment`, with its number.
    pub fn digest_of_segment(&self, segment: u32) -> Option<(u32, &Digest)> {
        let name = segment.to_string();
        self.digests
            .iter()
            .find(|(_, d)| d.segments().contains(&name.as_str()))
    }
}

// ---- Building the model from validated JSON ----

type Fields = Map<String, Value>;

/// Take `key` out of `obj`.
///
/// Every field is taken with `shift_remove`: `remove` (a swap-remove, with the order-keeping
/// map) moves the last field into the hole, so the unknown fields kept in `extra` would be
/// written back in another order, and in yet another at the next rewrite (found by fuzzing).
fn take(obj: &mut Fields, key: &str, what: &str) -> Result<Value, String> {
    obj.shift_remove(key)
        .ok_or_else(|| format!("{what} has no \"{key}\""))
}

fn take_object(obj: &mut Fields, key: &str, what: &str) -> Result<Fields, String> {
    match take(obj, key, what)? {
        Value::Object(m) => Ok(m),
        _ => Err(format!("{what}: \"{key}\" is not an object")),
    }
}

fn take_string(obj: &mut Fields, key: &str, what: &str) -> Result<String, String> {
    match take(obj, key, what)? {
        Value::String(s) => Ok(s),
        _ => Err(format!("{what}: \"{key}\" is not a string")),
    }
}

fn take_u32(obj: &mut Fields, key: &str, what: &str) -> Result<u32, String> {
    let v = take(obj, key, what)?;
    as_u32(&v).ok_or_else(|| format!("{what}: \"{key}\" is {v}, not an integer from 0 to 2^32-1"))
}

fn take_decimal(obj: &mut Fields, key: &str, what: &str) -> Result<u64, String> {
    let s = take_string(obj, key, what)?;
    str_to_u64(&s).ok_or_else(|| format!("{what}: \"{key}\" is \"{s}\", not a decimal number"))
}

fn take_base64(obj: &mut Fields, key: &str, what: &str) -> Result<Vec<u8>, String> {
    let s = take_string(obj, key, what)?;
    BASE64
        .decode(s.as_bytes())
        .map_err(|e| format!("{what}: \"{key}\" is not valid base64 ({e})"))
}

fn take_string_list(obj: &mut Fields, key: &str, what: &str) -> Result<Vec<String>, String> {
    match take(obj, key, what)? {
        Value::Array(a) => a
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(format!(
                    "{what}: \"{key}\" holds a value that is not a string"
                )),
            })
            .collect(),
        _ => Err(format!("{what}: \"{key}\" is not an array")),
    }
}

fn take_optional_list(
    obj: &mut Fields,
    key: &str,
    what: &str,
) -> Result<Option<Vec<String>>, String> {
    if obj.contains_key(key) {
        take_string_list(obj, key, what).map(Some)
    } else {
        Ok(None)
    }
}

/// A section's entries with their numbers. The numbers must be written the way cryptsetup
/// writes them (`"%u"`): cryptsetup looks entries up by that form, so an entry named "01" is
/// one it can never find.
fn numbered<T>(
    section: Fields,
    what: &str,
    mut convert: impl FnMut(u32, Value) -> Result<T, String>,
) -> Result<Numbered<T>, String> {
    let mut out = Vec::with_capacity(section.len());
    for (name, value) in section {
        let n: u32 = name
            .parse()
            .ok()
            .filter(|n: &u32| n.to_string() == name)
            .ok_or_else(|| format!("{what} name \"{name}\" is not a plain decimal number"))?;
        out.push((n, convert(n, value)?));
    }
    Ok(Numbered(out))
}

fn into_object(v: Value, what: &str) -> Result<Fields, String> {
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(format!("{what} is not an object")),
    }
}

fn keyslot(n: u32, v: Value) -> Result<Keyslot, String> {
    if v.get("type").and_then(Value::as_str) == Some("reencrypt") {
        // Kept as stored when unreadable: the volume stays usable for what does not need the
        // conversion's state (a dump, a backup), and resuming reports why.
        return Ok(match ReencryptKeyslot::from_json(n, &v) {
            Ok(k) => Keyslot::Reencrypt(Box::new(k)),
            Err(_) => Keyslot::Other(v),
        });
    }
    let known_kdf = v
        .pointer("/kdf/type")
        .and_then(Value::as_str)
        .is_some_and(|t| matches!(t, "pbkdf2" | "argon2i" | "argon2id"));
    if v.get("type").and_then(Value::as_str) != Some("luks2") || !known_kdf {
        return Ok(Keyslot::Other(v));
    }
    let what = format!("keyslot {n}");
    let mut obj = into_object(v, &what)?;
    obj.shift_remove("type");
    let key_size = take_u32(&mut obj, "key_size", &what)?;

    let af_what = format!("the af of keyslot {n}");
    let mut af = take_object(&mut obj, "af", &what)?;
    af.shift_remove("type");
    let af = Af {
        stripes: take_u32(&mut af, "stripes", &af_what)?,
        hash: take_string(&mut af, "hash", &af_what)?,
        extra: af,
    };

    let area_what = format!("the area of keyslot {n}");
    let mut area = take_object(&mut obj, "area", &what)?;
    area.shift_remove("type");
    let area = Area {
        offset: take_decimal(&mut area, "offset", &area_what)?,
        size: take_decimal(&mut area, "size", &area_what)?,
        encryption: take_string(&mut area, "encryption", &area_what)?,
        key_size: take_u32(&mut area, "key_size", &area_what)?,
        extra: area,
    };

    let kdf_what = format!("the kdf of keyslot {n}");
    let mut kdf = take_object(&mut obj, "kdf", &what)?;
    let kdf = match take_string(&mut kdf, "type", &kdf_what)?.as_str() {
        "pbkdf2" => KeyslotKdf::Pbkdf2 {
            hash: take_string(&mut kdf, "hash", &kdf_what)?,
            iterations: take_u32(&mut kdf, "iterations", &kdf_what)?,
            salt: take_base64(&mut kdf, "salt", &kdf_what)?,
        },
        other => KeyslotKdf::Argon2 {
            variant: if other == "argon2i" {
                Argon2Variant::Argon2i
            } else {
                Argon2Variant::Argon2id
            },
            time: take_u32(&mut kdf, "time", &kdf_what)?,
            memory: take_u32(&mut kdf, "memory", &kdf_what)?,
            cpus: take_u32(&mut kdf, "cpus", &kdf_what)?,
            salt: take_base64(&mut kdf, "salt", &kdf_what)?,
        },
    };
    let priority = obj.shift_remove("priority");
    Ok(Keyslot::Luks2(Box::new(Luks2Keyslot {
        key_size,
        af,
        area,
        kdf,
        priority,
        extra: obj,
    })))
}

fn segment(n: u32, v: Value) -> Result<SegmentEntry, String> {
    let kind = v.get("type").and_then(Value::as_str);
    if !matches!(kind, Some("crypt" | "linear")) {
        return Ok(SegmentEntry::Other(v));
    }
    let linear = kind == Some("linear");
    let what = format!("segment {n}");
    let mut obj = into_object(v, &what)?;
    obj.shift_remove("type");
    let offset = take_decimal(&mut obj, "offset", &what)?;
    let size = match take_string(&mut obj, "size", &what)?.as_str() {
        "dynamic" => None,
        s => Some(str_to_u64(s).ok_or_else(|| format!("{what}: \"size\" is \"{s}\""))?),
    };
    if linear {
        return Ok(SegmentEntry::Linear(LinearSegment {
            offset,
            size,
            flags: take_optional_list(&mut obj, "flags", &what)?,
            extra: obj,
        }));
    }
    Ok(SegmentEntry::Crypt(CryptSegment {
        offset,
        size,
        iv_tweak: take_decimal(&mut obj, "iv_tweak", &what)?,
        encryption: take_string(&mut obj, "encryption", &what)?,
        sector_size: take_u32(&mut obj, "sector_size", &what)?,
        integrity: obj.shift_remove("integrity"),
        flags: take_optional_list(&mut obj, "flags", &what)?,
        extra: obj,
    }))
}

fn digest(n: u32, v: Value) -> Result<Digest, String> {
    if v.get("type").and_then(Value::as_str) != Some("pbkdf2") {
        return Ok(Digest::Other(v));
    }
    let what = format!("digest {n}");
    let mut obj = into_object(v, &what)?;
    obj.shift_remove("type");
    Ok(Digest::Pbkdf2(Pbkdf2Digest {
        keyslots: take_string_list(&mut obj, "keyslots", &what)?,
        segments: take_string_list(&mut obj, "segments", &what)?,
        hash: take_string(&mut obj, "hash", &what)?,
        iterations: take_u32(&mut obj, "iterations", &what)?,
        salt: take_base64(&mut obj, "salt", &what)?,
        digest: take_base64(&mut obj, "digest", &what)?,
        extra: obj,
    }))
}

fn config(mut obj: Fields) -> Result<Config, String> {
    let what = "config";
    let json_size = take_decimal(&mut obj, "json_size", what)?;
    let keyslots_size = take_decimal(&mut obj, "keyslots_size", what)?;
    let flags = take_optional_list(&mut obj, "flags", what)?;
    let requirements = match obj.shift_remove("requirements") {
        None => None,
        Some(v) => {
            let mut req = into_object(v, "config.requirements")?;
            Some(Requirements {
                mandatory: take_optional_list(&mut req, "mandatory", "config.requirements")?,
                extra: req,
            })
        }
    };
    Ok(Config {
        json_size,
        keyslots_size,
        flags,
        requirements,
        extra: obj,
    })
}

impl Metadata {
    /// Build the model from metadata that passed [`super::validate::validate`].
    pub fn from_json(v: Value) -> Result<Metadata, String> {
        let mut top = into_object(v, "the JSON metadata")?;
        let what = "the JSON metadata";
        let keyslots = numbered(take_object(&mut top, "keyslots", what)?, "keyslot", keyslot)?;
        let tokens = numbered(take_object(&mut top, "tokens", what)?, "token", |_, v| {
            Ok(v)
        })?;
        let segments = numbered(take_object(&mut top, "segments", what)?, "segment", segment)?;
        let digests = numbered(take_object(&mut top, "digests", what)?, "digest", digest)?;
        let config = config(take_object(&mut top, "config", what)?)?;
        Ok(Metadata {
            keyslots,
            tokens,
            segments,
            digests,
            config,
            extra: top,
        })
    }

    /// The compact JSON text cryptsetup would write for this metadata.
    pub fn to_json_text(&self) -> String {
        // Serialising plain data (strings, numbers, maps with string keys) cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The metadata as a JSON value.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metadata cryptsetup 2.6 wrote for a volume with an Argon2id keyslot 0, a PBKDF2
    /// keyslot 7 with priority, a keyring token and a label: serialising the model gives back the
    /// same bytes.
    #[test]
    fn cryptsetup_json_round_trips_byte_for_byte() {
        let text = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"DHHL7CvJCUIE/Gor9+LNhTmKJFndLioJ7GPfPWQFDAA="}},"7":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"290816","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"argon2id","time":4,"memory":32,"cpus":2,"salt":"VOAFiIBNQR+hz/hl4mj32jzNtDsBUyExSW7gpQb3Yks="},"priority":2}},"tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},"digests":{"0":{"type":"pbkdf2","keyslots":["0","7"],"segments":["0"],"hash":"sha256","iterations":1000,"salt":"rww4rraT5p9N8meGTcEDQYXjOTPBLDcOwRNgZ5S8CYg=","digest":"U5Ah9ueuQztDyc2CD4INplKXnnFpJF8AWGT49H5sFLk="}},"config":{"json_size":"12288","keyslots_size":"16744448"}}"#;
        let m = Metadata::from_json(serde_json::from_str(text).unwrap()).unwrap();
        assert_eq!(m.to_json_text(), text);
        let Keyslot::Luks2(k7) = m.keyslots.get(7).unwrap() else {
            panic!("keyslot 7 is luks2")
        };
        assert_eq!(m.keyslots.get(7).unwrap().priority(), Priority::Prefer);
        assert_eq!(k7.kdf.name(), "argon2id");
        assert_eq!(k7.area.offset, 290816);
        assert_eq!(m.digest_of_keyslot(7).unwrap().0, 0);
        assert!(m.digest_of_keyslot(1).is_none());
    }

    /// Fields this model does not know are written back where they were, between and after the
    /// known ones (a swap-remove used to move the last one forward at every rewrite).
    #[test]
    fn unknown_fields_keep_their_order() {
        let text = r#"{"keyslots":{},"tokens":{},"segments":{"0":{"type":"crypt","offset":"0","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","x_first":1,"x_second":2,"sector_size":512,"x_last":3}},"digests":{},"config":{"json_size":"12288","keyslots_size":"16384","x_config":true}}"#;
        let m = Metadata::from_json(serde_json::from_str(text).unwrap()).unwrap();
        let written = m.to_json_text();
        let again = Metadata::from_json(serde_json::from_str(&written).unwrap()).unwrap();
        assert_eq!(again.to_json_text(), written);
        let order: Vec<usize> = ["x_first", "x_second", "x_last"]
            .iter()
            .map(|k| written.find(k).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{written}");
    }

    /// Reencryption metadata as cryptsetup 2.6 wrote it (`reencrypt --encrypt --init-only`, with
    /// a data shift; and with checksums): typed keyslot and segments, the same bytes back.
    #[test]
    fn reencryption_json_is_typed_and_round_trips() {
        for text in [
            r#"{"keyslots":{"1":{"area":{"offset":"290816","size":"4096","type":"datashift","shift_size":"16777216"},"type":"reencrypt","key_size":1,"mode":"encrypt","direction":"backward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"50331648","size":"16777216"},"1":{"type":"linear","offset":"16777216","size":"16777216"},"2":{"type":"linear","offset":"50331648","size":"16777216","flags":["backup-moved-segment"]},"3":{"type":"linear","offset":"0","size":"33554432","flags":["backup-previous"]},"4":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":[],"segments":["4"],"hash":"sha256","iterations":1000,"salt":"AAAA","digest":"AAAA"}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#,
            r#"{"keyslots":{"1":{"area":{"offset":"290816","size":"16486400","type":"checksum","hash":"sha256","sector_size":4096},"type":"reencrypt","key_size":1,"mode":"encrypt","direction":"forward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"0","size":"dynamic"},"1":{"type":"linear","offset":"0","size":"dynamic","flags":["backup-previous"]},"2":{"type":"crypt","offset":"0","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":[],"segments":["2"],"hash":"sha256","iterations":1000,"salt":"AAAA","digest":"AAAA"}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#,
        ] {
            let m = Metadata::from_json(serde_json::from_str(text).unwrap()).unwrap();
            assert_eq!(m.to_json_text(), text);
            let Some(Keyslot::Reencrypt(k)) = m.keyslots.get(1) else {
                panic!("keyslot 1 is a typed reencrypt keyslot")
            };
            assert_eq!(k.mode, Mode::Encrypt);
            assert_eq!(k.area_offset, 290816);
            assert_eq!(
                m.keyslots.get(1).unwrap().area(),
                Some((290816, k.area_size))
            );
            assert_eq!(m.keyslots.get(1).unwrap().priority(), Priority::Ignore);
            let Some(SegmentEntry::Linear(l)) = m.segments.get(1) else {
                panic!("segment 1 is linear")
            };
            assert_eq!(l.offset, 16777216 * u64::from(text.contains("datashift")));
            assert!(m
                .segments
                .iter()
                .any(|(_, s)| s.has_flag("backup-previous")));
        }
    }

    /// Fields the typed reencrypt keyslot does not know stay, and a reencrypt keyslot it cannot
    /// read (an unknown resilience type) is kept as stored.
    #[test]
    fn reencrypt_keyslot_keeps_what_it_does_not_know() {
        let mk = |area_type: &str| {
            format!(
                r#"{{"keyslots":{{"1":{{"area":{{"offset":"32768","size":"4096","type":"{area_type}","later":[1]}},"type":"reencrypt","key_size":1,"mode":"decrypt","direction":"forward","priority":0,"note":"x"}}}},"tokens":{{}},"segments":{{}},"digests":{{}},"config":{{"json_size":"12288","keyslots_size":"4096"}}}}"#
            )
        };
        let typed = Metadata::from_json(serde_json::from_str(&mk("none")).unwrap()).unwrap();
        assert!(matches!(typed.keyslots.get(1), Some(Keyslot::Reencrypt(_))));
        assert_eq!(typed.to_json_text(), mk("none"));
        let kept = Metadata::from_json(serde_json::from_str(&mk("future")).unwrap()).unwrap();
        assert!(matches!(kept.keyslots.get(1), Some(Keyslot::Other(_))));
        assert_eq!(kept.keyslots.get(1).unwrap().kind(), "reencrypt");
        assert_eq!(kept.to_json_text(), mk("future"));
    }

    #[test]
    fn unknown_things_are_kept() {
        let text = r#"{"keyslots":{"1":{"type":"future","key_size":32,"area":{"type":"raw","offset":"32768","size":"4096"},"zzz":[1]}},"tokens":{"0":{"type":"x","keyslots":[],"b":1,"a":2}},"segments":{"0":{"type":"crypt","offset":"0","size":"4096","iv_tweak":"8","encryption":"aes-cbc-essiv:sha256","sector_size":512,"flags":["f"],"new":true}},"digests":{"0":{"type":"other","keyslots":[],"segments":["0"]}},"config":{"json_size":"12288","keyslots_size":"4096","flags":["allow-discards"],"requirements":{"mandatory":["x"],"opt":1},"more":null},"top":"level"}"#;
        let v: Value = serde_json::from_str(text).unwrap();
        let m = Metadata::from_json(v.clone()).unwrap();
        assert!(matches!(m.keyslots.get(1), Some(Keyslot::Other(_))));
        assert_eq!(m.keyslots.get(1).unwrap().kind(), "future");
        assert_eq!(m.mandatory_requirements(), ["x".to_string()]);
        // The same JSON value (key order inside raw objects is serde_json's).
        assert_eq!(m.to_json(), v);
    }

    #[test]
    fn bad_base64_and_names_are_reported() {
        let mk = |salt: &str, name: &str| {
            format!(
                r#"{{"keyslots":{{}},"tokens":{{}},"segments":{{"{name}":{{"type":"linear","offset":"0","size":"dynamic"}}}},"digests":{{"0":{{"type":"pbkdf2","keyslots":[],"segments":[],"hash":"sha256","iterations":1000,"salt":"{salt}","digest":"AAAA"}}}},"config":{{"json_size":"12288","keyslots_size":"4096"}}}}"#
            )
        };
        let ok = Metadata::from_json(serde_json::from_str(&mk("AAAA", "0")).unwrap());
        assert!(ok.is_ok());
        let e = Metadata::from_json(serde_json::from_str(&mk("A*AA", "0")).unwrap()).unwrap_err();
        assert!(e.contains("digest 0") && e.contains("base64"), "{e}");
        let e = Metadata::from_json(serde_json::from_str(&mk("AAAA", "00")).unwrap()).unwrap_err();
        assert!(e.contains("\"00\""), "{e}");
    }
}
