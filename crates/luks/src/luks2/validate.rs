//! The JSON area and what cryptsetup requires of the metadata in it before it uses a header copy
//! (`parse_and_validate_json` and `LUKS2_hdr_validate` in `lib/luks2/`): the same checks in the
//! same order, so that sectorcrypt accepts exactly the headers cryptsetup accepts. Each failure
//! is one sentence naming the object and field.
//!
//! The checks run on the parsed [`Value`] rather than on typed structs because cryptsetup checks
//! only what it needs and keeps everything else: unknown keyslot, segment and digest types and
//! unknown fields are valid, so the typed model (`metadata`) is built after this has passed.

use super::limits::KEYSLOTS_SIZE_MAX;
use serde_json::{Map, Value};

use super::binary::{BIN_LEN, HDR_SIZES};

/// Extract the JSON metadata from a copy's JSON area: it must start with `{`, be one JSON object,
/// and be followed only by NUL bytes up to the end of the area, at least one of them
/// (`validate_json_area`).
pub fn parse_json_area(area: &[u8]) -> Result<Value, String> {
    if area.first() != Some(&b'{') {
        return Err("the JSON area does not start with '{'".into());
    }
    let mut stream = serde_json::Deserializer::from_slice(area).into_iter::<Value>();
    let value = match stream.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Err(format!("the JSON metadata does not parse: {e}")),
        None => return Err("the JSON area holds no JSON".into()),
    };
    let end = stream.byte_offset();
    if end >= area.len() {
        return Err(
            "the JSON metadata fills the whole JSON area, leaving no terminating NUL".into(),
        );
    }
    if let Some(pos) = area[end..].iter().position(|&b| b != 0) {
        return Err(format!(
            "the JSON area has the non-NUL byte {:#04x} after the JSON metadata (at offset {})",
            area[end + pos],
            end + pos
        ));
    }
    Ok(value)
}

/// The whole-string decimal conversion cryptsetup applies to numbers stored as strings
/// (`json_str_to_uint64`: `strtoull(s, &end, 10)` with nothing left over and no overflow).
/// strtoull's leading white space and sign are honoured, a minus sign wrapping as in C.
pub fn str_to_u64(s: &str) -> Option<u64> {
    let t = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() {
        // strtoull converts nothing and leaves the end pointer at the start: only the empty
        // string is then "entirely" converted (to 0).
        return s.is_empty().then_some(0);
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: u64 = digits.parse().ok()?;
    Some(if negative { v.wrapping_neg() } else { v })
}

/// Only decimal digits (cryptsetup's `numbered`; the empty string passes, as there).
pub fn numbered(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

/// A JSON integer (json-c's `json_type_int`: no fraction, no exponent).
fn is_int(v: &Value) -> bool {
    v.as_i64().is_some() || v.as_u64().is_some()
}

/// An integer in 0..=u32::MAX (`validate_json_uint32`).
pub fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn describe(section: &str, name: &str) -> String {
    if name.is_empty() {
        section.to_string()
    } else {
        format!("{section} {name}")
    }
}

/// `obj[key]` if it is an object (`json_contains(..., json_type_object)`).
fn get_object<'a>(
    obj: &'a Value,
    key: &str,
    section: &str,
    name: &str,
) -> Result<&'a Map<String, Value>, String> {
    obj.get(key)
        .and_then(Value::as_object)
        .ok_or_else(|| format!("{} has no \"{key}\" object", describe(section, name)))
}

fn get_array<'a>(
    obj: &'a Value,
    key: &str,
    section: &str,
    name: &str,
) -> Result<&'a Vec<Value>, String> {
    obj.get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{} has no \"{key}\" array", describe(section, name)))
}

fn get_int<'a>(obj: &'a Value, key: &str, section: &str, name: &str) -> Result<&'a Value, String> {
    obj.get(key)
        .filter(|v| is_int(v))
        .ok_or_else(|| format!("{} has no integer \"{key}\"", describe(section, name)))
}

/// `obj[key]` if it is a non-empty string (`json_contains_string`).
fn get_string<'a>(obj: &'a Value, key: &str, section: &str, name: &str) -> Result<&'a str, String> {
    obj.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            format!(
                "{} has no non-empty string \"{key}\"",
                describe(section, name)
            )
        })
}

/// Every member of `arr` is a string naming an object in `section` (`validate_keyslots_array`,
/// `validate_segments_array`).
fn references(
    arr: &[Value],
    section: Option<&Value>,
    what: &str,
    owner: &str,
) -> Result<(), String> {
    for (i, v) in arr.iter().enumerate() {
        let Some(name) = v.as_str() else {
            return Err(format!(
                "{owner}: entry {i} of its {what}s list is not a string"
            ));
        };
        if !section
            .and_then(|s| s.get(name))
            .is_some_and(Value::is_object)
        {
            return Err(format!(
                "{owner} refers to {what} \"{name}\", which does not exist"
            ));
        }
    }
    Ok(())
}

/// Whether a string list contains `name` (`LUKS2_array_jobj`).
pub fn list_contains(list: Option<&Value>, name: &str) -> bool {
    list.and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(name)))
}

fn segment_flags(seg: &Value) -> impl Iterator<Item = &str> {
    seg.get("flags")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// A backup segment of an interrupted reencryption (a flag starting with `backup-`).
pub fn segment_is_backup(seg: &Value) -> bool {
    segment_flags(seg).any(|f| f.starts_with("backup-"))
}

fn segment_has_flag(seg: &Value, flag: &str) -> bool {
    segment_flags(seg).any(|f| f == flag)
}

/// The online-reencryption requirement names (`reencrypt_candidate_flag`).
fn reencrypt_candidate_flag(flag: &str) -> bool {
    flag == "online-reencrypt"
        || flag
            .strip_prefix("online-reencrypt-v")
            .is_some_and(|v| !v.is_empty() && numbered(v))
}

/// What the mandatory requirements amount to (`LUKS2_config_get_requirements`).
#[derive(Default)]
struct Requirements {
    online_reencrypt: bool,
    candidate: bool,
}

fn requirements_of(hdr: &Value) -> Requirements {
    let mut r = Requirements::default();
    let mandatory = hdr
        .pointer("/config/requirements/mandatory")
        .and_then(Value::as_array);
    for name in mandatory.into_iter().flatten().filter_map(Value::as_str) {
        if matches!(
            name,
            "online-reencrypt" | "online-reencrypt-v2" | "online-reencrypt-v3"
        ) {
            r.online_reencrypt = true;
        }
        if reencrypt_candidate_flag(name) {
            r.candidate = true;
        }
    }
    r
}

/// Run every check cryptsetup runs, in its order. `json_area_len` is the JSON area's size from
/// the binary header (`hdr_size - 4096`).
pub fn validate(hdr: &Value, json_area_len: u64) -> Result<(), String> {
    if !hdr.is_object() {
        return Err("the JSON metadata is not an object".into());
    }
    check_requirements(hdr)?;
    check_tokens(hdr)?;
    check_digests(hdr)?;
    check_segments(hdr)?;
    check_keyslots(hdr)?;
    check_config(hdr)?;
    check_areas(hdr)?;
    check_json_size(hdr, json_area_len)?;
    check_keyslot_types(hdr)
}

/// Remove KDF parameters left behind by cryptsetup releases before 2.0.3 (`LUKS2_hdr_repair`):
/// cryptsetup does this in memory whenever validation fails and validates again, which comes to
/// the same as always doing it first, since a header with such leftovers never validates.
pub fn repair(hdr: &mut Value) {
    let Some(keyslots) = hdr.get_mut("keyslots").and_then(Value::as_object_mut) else {
        return;
    };
    for slot in keyslots.values_mut() {
        if slot.get("type").and_then(Value::as_str) != Some("luks2") {
            continue;
        }
        let Some(kdf) = slot.get_mut("kdf").and_then(Value::as_object_mut) else {
            continue;
        };
        let keep: &[&str] = match kdf.get("type").and_then(Value::as_str) {
            Some("pbkdf2") => &["type", "salt", "hash", "iterations"],
            Some("argon2i" | "argon2id") => &["type", "salt", "time", "memory", "cpus"],
            _ => continue,
        };
        kdf.retain(|k, _| keep.contains(&k.as_str()));
    }
}

fn check_requirements(hdr: &Value) -> Result<(), String> {
    let config = get_object(hdr, "config", "the JSON metadata", "")?;
    let Some(req) = config.get("requirements") else {
        return Ok(());
    };
    if !req.is_object() {
        return Err("config.requirements is not an object".into());
    }
    let Some(mandatory) = req.get("mandatory") else {
        return Ok(());
    };
    let Some(list) = mandatory.as_array() else {
        return Err("config.requirements.mandatory is not an array".into());
    };
    let mut online = 0;
    for v in list {
        let Some(s) = v.as_str() else {
            return Err("config.requirements.mandatory holds a value that is not a string".into());
        };
        if reencrypt_candidate_flag(s) {
            online += 1;
        }
    }
    if online > 1 {
        return Err("config.requirements.mandatory names more than one online reencryption".into());
    }
    Ok(())
}

fn check_tokens(hdr: &Value) -> Result<(), String> {
    let tokens = get_object(hdr, "tokens", "the JSON metadata", "")?;
    let keyslots = hdr.get("keyslots");
    for (name, token) in tokens {
        if !numbered(name) {
            return Err(format!("token name \"{name}\" is not a number"));
        }
        if keyslots.is_none() {
            return Err("the JSON metadata has no \"keyslots\" object".into());
        }
        get_string(token, "type", "token", name)?;
        let list = get_array(token, "keyslots", "token", name)?;
        references(list, keyslots, "keyslot", &format!("token {name}"))?;
    }
    Ok(())
}

fn check_digests(hdr: &Value) -> Result<(), String> {
    let digests = get_object(hdr, "digests", "the JSON metadata", "")?;
    get_object(hdr, "keyslots", "the JSON metadata", "")?;
    get_object(hdr, "segments", "the JSON metadata", "")?;
    for (name, digest) in digests {
        if !numbered(name) {
            return Err(format!("digest name \"{name}\" is not a number"));
        }
        get_string(digest, "type", "digest", name)?;
        let keyslots = get_array(digest, "keyslots", "digest", name)?;
        let segments = get_array(digest, "segments", "digest", name)?;
        let owner = format!("digest {name}");
        references(keyslots, hdr.get("keyslots"), "keyslot", &owner)?;
        references(segments, hdr.get("segments"), "segment", &owner)?;
    }
    Ok(())
}

/// A segment's byte range; `len` is `u64::MAX` for a "dynamic" one (to the end of the device).
#[derive(Clone, Copy)]
struct Interval {
    offset: u64,
    len: u64,
}

fn check_segments(hdr: &Value) -> Result<(), String> {
    let segments = get_object(hdr, "segments", "the JSON metadata", "")?;
    if segments.is_empty() {
        return Err("the segments section is empty".into());
    }
    let digests = hdr.get("digests");
    let count = segments.len() as u64;
    let mut first_backup: Option<u64> = None;
    for (name, seg) in segments {
        if !numbered(name) {
            return Err(format!("segment name \"{name}\" is not a number"));
        }
        let kind = get_string(seg, "type", "segment", name)?;
        let offset_text = get_string(seg, "offset", "segment", name)?;
        let size_text = get_string(seg, "size", "segment", name)?;
        let offset = numbered(offset_text)
            .then(|| str_to_u64(offset_text))
            .flatten()
            .ok_or_else(|| format!("segment {name} has the invalid offset \"{offset_text}\""))?;
        let size = if size_text == "dynamic" {
            0
        } else {
            numbered(size_text)
                .then(|| str_to_u64(size_text))
                .flatten()
                .filter(|&s| s != 0)
                .ok_or_else(|| format!("segment {name} has the invalid size \"{size_text}\""))?
        };
        if !offset.is_multiple_of(512) {
            return Err(format!(
                "segment {name}'s offset {offset} is not a multiple of 512 bytes"
            ));
        }
        if !size.is_multiple_of(512) {
            return Err(format!(
                "segment {name}'s size {size} is not a multiple of 512 bytes"
            ));
        }
        if seg.get("flags").is_some() {
            let flags = get_array(seg, "flags", "segment", name)?;
            if !flags.iter().all(Value::is_string) {
                return Err(format!("segment {name} has a flag that is not a string"));
            }
        }
        // cryptsetup uses atoi(); names are digits, so only an absurdly long one differs.
        let index: u64 = name
            .parse()
            .map_err(|_| format!("segment name \"{name}\" is too large"))?;
        if segment_is_backup(seg) {
            if first_backup.is_none_or(|b| index < b) {
                first_backup = Some(index);
            }
        } else if let Some(b) = first_backup.filter(|&b| index >= b) {
            return Err(format!(
                "regular segment {index} comes after backup segment {b}"
            ));
        }
        if kind == "crypt" {
            check_crypt_segment(seg, name, digests, size)?;
        }
    }
    if first_backup == Some(0) {
        return Err("there is no regular segment, only backup segments".into());
    }
    if let Some(b) = first_backup.filter(|&b| b >= count) {
        return Err(format!(
            "segment numbers skip from the regular segments to backup segment {b}"
        ));
    }
    let first_backup = first_backup.unwrap_or(count);
    let mut intervals = Vec::new();
    for i in 0..first_backup {
        let seg = segments
            .get(&i.to_string())
            .ok_or_else(|| format!("segment {i} is missing between other segments"))?;
        let field = |k| seg.get(k).and_then(Value::as_str).and_then(str_to_u64);
        intervals.push(Interval {
            offset: field("offset").unwrap_or(0),
            len: field("size").filter(|&s| s != 0).unwrap_or(u64::MAX),
        });
    }
    check_segment_intervals(&intervals)?;
    for i in first_backup..count {
        if !segments.contains_key(&i.to_string()) {
            return Err(format!("segment {i} is missing between other segments"));
        }
    }
    check_reencrypt_segments(hdr, segments, first_backup, count)
}

fn check_crypt_segment(
    seg: &Value,
    name: &str,
    digests: Option<&Value>,
    size: u64,
) -> Result<(), String> {
    let iv_tweak = get_string(seg, "iv_tweak", "segment", name)?;
    get_string(seg, "encryption", "segment", name)?;
    let sector_size = get_int(seg, "sector_size", "segment", name)?;
    if let Some(integrity) = seg.get("integrity") {
        if !integrity.is_object() {
            return Err(format!("segment {name}'s integrity is not an object"));
        }
        for key in ["type", "journal_encryption", "journal_integrity"] {
            get_string(integrity, key, "the integrity of segment", name)?;
        }
    }
    let sector_size = as_u32(sector_size)
        .ok_or_else(|| format!("segment {name} has the invalid sector size {sector_size}"))?;
    if sector_size == 0 || !sector_size.is_multiple_of(512) {
        return Err(format!(
            "segment {name} has the invalid sector size {sector_size} (not a multiple of 512)"
        ));
    }
    if !numbered(iv_tweak) || str_to_u64(iv_tweak).is_none() {
        return Err(format!(
            "segment {name} has the invalid iv_tweak \"{iv_tweak}\""
        ));
    }
    if !size.is_multiple_of(u64::from(sector_size)) {
        return Err(format!(
            "segment {name}'s size {size} is not a multiple of its sector size {sector_size}"
        ));
    }
    let has_digest = digests
        .and_then(Value::as_object)
        .is_some_and(|d| d.values().any(|v| list_contains(v.get("segments"), name)));
    if !has_digest {
        return Err(format!("crypt segment {name} has no key digest"));
    }
    Ok(())
}

fn check_segment_intervals(ix: &[Interval]) -> Result<(), String> {
    for (i, a) in ix.iter().enumerate() {
        if a.len == u64::MAX && i != ix.len() - 1 {
            return Err(format!(
                "segment {i} has a dynamic size but is not the last regular segment"
            ));
        }
        for (j, b) in ix.iter().enumerate() {
            if i == j {
                continue;
            }
            if b.len != u64::MAX && b.offset > u64::MAX - b.len {
                return Err(format!("segment {j}'s offset plus size overflows"));
            }
            if a.offset >= b.offset && (b.len == u64::MAX || a.offset < b.offset + b.len) {
                return Err(format!("segments {i} and {j} overlap"));
            }
        }
    }
    Ok(())
}

/// `json_segment_cmp`: same type and, for crypt segments, the same sector size and cipher.
fn segments_match(a: &Value, b: &Value) -> bool {
    let kind = |s: &Value| s.get("type").and_then(Value::as_str).map(str::to_owned);
    match (kind(a), kind(b)) {
        (Some(x), Some(y)) if x == y => {
            if x != "crypt" {
                return true;
            }
            let sector = |s: &Value| {
                s.get("sector_size")
                    .and_then(Value::as_i64)
                    .filter(|&n| n >= 0)
                    .unwrap_or(512)
            };
            let cipher = |s: &Value| {
                s.get("encryption")
                    .and_then(Value::as_str)
                    .unwrap_or("null")
                    .to_owned()
            };
            sector(a) == sector(b) && cipher(a) == cipher(b)
        }
        _ => false,
    }
}

fn check_reencrypt_segments(
    hdr: &Value,
    segments: &Map<String, Value>,
    first_backup: u64,
    count: u64,
) -> Result<(), String> {
    if !requirements_of(hdr).online_reencrypt {
        return Ok(());
    }
    let (mut final_seg, mut previous) = (None, None);
    for i in first_backup..count {
        let seg = segments
            .get(&i.to_string())
            .ok_or_else(|| format!("segment {i} is missing"))?;
        if segment_has_flag(seg, "backup-final") {
            final_seg = Some(seg);
        } else if segment_has_flag(seg, "backup-previous") {
            previous = Some(seg);
        }
    }
    let (Some(final_seg), Some(previous)) = (final_seg, previous) else {
        return Err("a reencryption backup segment is missing".into());
    };
    for i in 0..first_backup {
        let seg = segments
            .get(&i.to_string())
            .ok_or_else(|| format!("segment {i} is missing"))?;
        if segment_has_flag(seg, "in-reencryption") {
            if !segments_match(seg, final_seg) {
                return Err(format!(
                    "segment {i} in reencryption does not match the backup-final segment"
                ));
            }
        } else if !segments_match(seg, final_seg) && !segments_match(seg, previous) {
            return Err(format!(
                "segment {i} matches neither the backup-final nor the backup-previous segment"
            ));
        }
    }
    Ok(())
}

fn check_keyslots(hdr: &Value) -> Result<(), String> {
    let keyslots = get_object(hdr, "keyslots", "the JSON metadata", "")?;
    for (name, slot) in keyslots {
        if !numbered(name) {
            return Err(format!("keyslot name \"{name}\" is not a number"));
        }
        get_string(slot, "type", "keyslot", name)?;
        let key_size = get_int(slot, "key_size", "keyslot", name)?;
        if as_u32(key_size).is_none() {
            return Err(format!(
                "keyslot {name} has the invalid key_size {key_size}"
            ));
        }
    }
    Ok(())
}

/// `config.json_size` plus the binary header: the size of one header copy (cryptsetup's
/// "metadata size").
fn metadata_size(hdr: &Value) -> Option<u64> {
    hdr.pointer("/config/json_size")
        .and_then(Value::as_str)
        .and_then(str_to_u64)
        .and_then(|n| n.checked_add(BIN_LEN as u64))
}

fn keyslots_size(hdr: &Value) -> Option<u64> {
    hdr.pointer("/config/keyslots_size")
        .and_then(Value::as_str)
        .and_then(str_to_u64)
}

/// Where the keyslots area ends: both header copies plus `config.keyslots_size`
/// (`LUKS2_hdr_and_areas_size`).
pub fn hdr_and_areas_size(hdr: &Value) -> Option<u64> {
    metadata_size(hdr)?
        .checked_mul(2)?
        .checked_add(keyslots_size(hdr)?)
}

/// The lowest offset of a regular segment, 0 if one starts at 0 (a detached header), `u64::MAX`
/// if there is none (`json_segments_get_minimal_offset`).
fn minimal_segment_offset(hdr: &Value) -> u64 {
    let mut min = u64::MAX;
    let segments = hdr.get("segments").and_then(Value::as_object);
    for seg in segments.into_iter().flat_map(|s| s.values()) {
        if segment_is_backup(seg) {
            continue;
        }
        let offset = seg
            .get("offset")
            .and_then(Value::as_str)
            .and_then(str_to_u64)
            .unwrap_or(0);
        if offset == 0 {
            return 0;
        }
        min = min.min(offset);
    }
    min
}

fn check_config(hdr: &Value) -> Result<(), String> {
    get_object(hdr, "config", "the JSON metadata", "")?;
    let config = &hdr["config"];
    let json_size = get_string(config, "json_size", "config", "")?;
    let json_size = str_to_u64(json_size)
        .ok_or_else(|| format!("config has the invalid json_size \"{json_size}\""))?;
    let keyslots = get_string(config, "keyslots_size", "config", "")?;
    let keyslots = str_to_u64(keyslots)
        .ok_or_else(|| format!("config has the invalid keyslots_size \"{keyslots}\""))?;
    let metadata = json_size.wrapping_add(BIN_LEN as u64);
    if !HDR_SIZES.contains(&metadata) {
        return Err(format!(
            "config.json_size {json_size} gives a header size of {metadata} bytes, which is not \
             one of 16 KiB, 32 KiB, ... 4 MiB"
        ));
    }
    if !keyslots.is_multiple_of(4096) || keyslots > KEYSLOTS_SIZE_MAX {
        return Err(format!(
            "config.keyslots_size {keyslots} is not a multiple of 4096 bytes up to 128 MiB"
        ));
    }
    let data = minimal_segment_offset(hdr);
    if data != 0 && (data < keyslots || data - keyslots < 2 * metadata) {
        return Err(format!(
            "the keyslots area ({keyslots} bytes after two {metadata}-byte header copies) runs \
             past the data offset {data}"
        ));
    }
    if let Some(flags) = config.get("flags") {
        let Some(list) = flags.as_array() else {
            return Err("config.flags is not an array".into());
        };
        if !list.iter().all(Value::is_string) {
            return Err("config.flags holds a value that is not a string".into());
        }
    }
    Ok(())
}

fn check_areas(hdr: &Value) -> Result<(), String> {
    let keyslots = get_object(hdr, "keyslots", "the JSON metadata", "")?;
    get_object(hdr, "segments", "the JSON metadata", "")?;
    // config was checked just before, so both sizes exist.
    let metadata = metadata_size(hdr).unwrap_or(0);
    let end = hdr_and_areas_size(hdr).unwrap_or(0);
    let mut areas = Vec::with_capacity(keyslots.len());
    for (name, slot) in keyslots {
        let area = slot
            .get("area")
            .filter(|a| a.is_object())
            .ok_or_else(|| format!("keyslot {name} has no \"area\" object"))?;
        get_string(area, "type", "the area of keyslot", name)?;
        let offset = get_string(area, "offset", "the area of keyslot", name)?;
        let size = get_string(area, "size", "the area of keyslot", name)?;
        let parse = |text: &str, what: &str| {
            numbered(text)
                .then(|| str_to_u64(text))
                .flatten()
                .ok_or_else(|| format!("keyslot {name}'s area has the invalid {what} \"{text}\""))
        };
        areas.push((name, parse(offset, "offset")?, parse(size, "size")?));
    }
    for &(name, offset, len) in &areas {
        if offset < 2 * metadata {
            return Err(format!(
                "keyslot {name}'s area at offset {offset} lies inside the header copies (which end at {})",
                2 * metadata
            ));
        }
        if len == 0 {
            return Err(format!("keyslot {name}'s area has a size of 0"));
        }
        let Some(area_end) = offset.checked_add(len) else {
            return Err(format!("keyslot {name}'s area offset plus size overflows"));
        };
        if area_end > end {
            return Err(format!(
                "keyslot {name}'s area (bytes {offset} to {area_end}) runs past the end of the \
                 keyslots area at {end}"
            ));
        }
        for &(other, o_offset, o_len) in &areas {
            if other == name {
                continue;
            }
            let Some(o_end) = o_offset.checked_add(o_len) else {
                return Err(format!("keyslot {other}'s area offset plus size overflows"));
            };
            if offset >= o_offset && offset < o_end {
                return Err(format!("the areas of keyslots {name} and {other} overlap"));
            }
        }
    }
    Ok(())
}

fn check_json_size(hdr: &Value, json_area_len: u64) -> Result<(), String> {
    let json_size = hdr
        .pointer("/config/json_size")
        .and_then(Value::as_str)
        .and_then(str_to_u64)
        .unwrap_or(0);
    if json_size != json_area_len {
        return Err(format!(
            "config.json_size {json_size} does not match the binary header's JSON area of \
             {json_area_len} bytes"
        ));
    }
    // cryptsetup measures the compact form it would write back.
    let text_len = serde_json::to_string(hdr).map_or(u64::MAX, |s| s.len() as u64);
    if text_len > json_area_len {
        return Err(format!(
            "the JSON metadata ({text_len} bytes) does not fit its {json_area_len}-byte area"
        ));
    }
    Ok(())
}

fn check_keyslot_types(hdr: &Value) -> Result<(), String> {
    let keyslots = get_object(hdr, "keyslots", "the JSON metadata", "")?;
    let reqs = requirements_of(hdr);
    let mut reencrypt = 0;
    for (name, slot) in keyslots {
        match slot.get("type").and_then(Value::as_str) {
            Some("luks2") => {
                check_luks2_keyslot(slot, name)?;
                let digests = hdr
                    .get("digests")
                    .and_then(Value::as_object)
                    .map_or(0, |d| {
                        d.values()
                            .filter(|v| list_contains(v.get("keyslots"), name))
                            .count()
                    });
                if digests != 1 {
                    return Err(format!(
                        "keyslot {name} belongs to {digests} digests instead of exactly one"
                    ));
                }
            }
            Some("reencrypt") => {
                check_reencrypt_keyslot(slot, name)?;
                reencrypt += 1;
            }
            // Other types are kept and ignored, as cryptsetup does.
            _ => {}
        }
    }
    if reqs.online_reencrypt && reencrypt == 0 {
        return Err("the online reencryption requirement has no reencrypt keyslot".into());
    }
    if reencrypt > 0 && !reqs.candidate {
        return Err("a reencrypt keyslot exists without the reencryption requirement".into());
    }
    if reencrypt > 1 {
        return Err("there is more than one reencrypt keyslot".into());
    }
    Ok(())
}

/// `luks2_keyslot_validate`.
fn check_luks2_keyslot(slot: &Value, name: &str) -> Result<(), String> {
    let section = "keyslot";
    get_object(slot, "kdf", section, name)?;
    get_object(slot, "af", section, name)?;
    get_object(slot, "area", section, name)?;
    let kdf = &slot["kdf"];
    let kdf_section = format!("the kdf of keyslot {name}");
    let kind = get_string(kdf, "type", &kdf_section, "")?;
    let count = kdf.as_object().map_or(0, Map::len);
    match kind {
        "pbkdf2" => {
            if count != 4 {
                return Err(format!(
                    "{kdf_section} has other fields than type, hash, iterations and salt"
                ));
            }
            get_string(kdf, "hash", &kdf_section, "")?;
            get_int(kdf, "iterations", &kdf_section, "")?;
            get_string(kdf, "salt", &kdf_section, "")?;
        }
        "argon2i" | "argon2id" => {
            if count != 5 {
                return Err(format!(
                    "{kdf_section} has other fields than type, time, memory, cpus and salt"
                ));
            }
            for key in ["time", "memory", "cpus"] {
                get_int(kdf, key, &kdf_section, "")?;
            }
            get_string(kdf, "salt", &kdf_section, "")?;
        }
        // cryptsetup does not check other KDF types here; opening such a slot fails.
        _ => {}
    }
    let af = &slot["af"];
    let af_section = format!("the af of keyslot {name}");
    let af_type = get_string(af, "type", &af_section, "")?;
    if af_type != "luks1" {
        return Err(format!(
            "keyslot {name} has the unknown af type \"{af_type}\""
        ));
    }
    get_string(af, "hash", &af_section, "")?;
    get_int(af, "stripes", &af_section, "")?;
    let area = &slot["area"];
    let area_section = format!("the area of keyslot {name}");
    let area_type = get_string(area, "type", &area_section, "")?;
    if area_type != "raw" {
        return Err(format!(
            "keyslot {name} has the unknown area type \"{area_type}\""
        ));
    }
    get_string(area, "encryption", &area_section, "")?;
    get_int(area, "key_size", &area_section, "")?;
    get_string(area, "offset", &area_section, "")?;
    get_string(area, "size", &area_section, "")?;
    Ok(())
}

/// `reenc_keyslot_validate`.
fn check_reencrypt_keyslot(slot: &Value, name: &str) -> Result<(), String> {
    let area = slot.get("area").unwrap_or(&Value::Null);
    let area_type = area.get("type").and_then(Value::as_str).unwrap_or("");
    let key_size = get_int(slot, "key_size", "reencrypt keyslot", name)?;
    let mode = get_string(slot, "mode", "reencrypt keyslot", name)?;
    let direction = get_string(slot, "direction", "reencrypt keyslot", name)?;
    if as_u32(key_size) != Some(1) {
        return Err(format!(
            "reencrypt keyslot {name} has a key_size other than 1"
        ));
    }
    if !matches!(mode, "reencrypt" | "encrypt" | "decrypt") {
        return Err(format!(
            "reencrypt keyslot {name} has the unknown mode \"{mode}\""
        ));
    }
    if !matches!(direction, "forward" | "backward") {
        return Err(format!(
            "reencrypt keyslot {name} has the unknown direction \"{direction}\""
        ));
    }
    let area_section = format!("the area of reencrypt keyslot {name}");
    if matches!(area_type, "checksum" | "datashift-checksum") {
        get_string(area, "hash", &area_section, "")?;
        let sector = get_int(area, "sector_size", &area_section, "")?;
        let sector = as_u32(sector).unwrap_or(0);
        if sector < 512 || !sector.is_power_of_two() {
            return Err(format!(
                "{area_section} has the invalid sector size {sector}"
            ));
        }
    } else if matches!(area_type, "datashift" | "datashift-journal") {
        let shift = get_string(area, "shift_size", &area_section, "")?;
        let shift = str_to_u64(shift).unwrap_or(0);
        if shift == 0 || !shift.is_multiple_of(512) {
            return Err(format!("{area_section} has the invalid shift size {shift}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strtoull_semantics() {
        assert_eq!(str_to_u64("12288"), Some(12288));
        assert_eq!(str_to_u64(""), Some(0));
        assert_eq!(str_to_u64(" 7"), Some(7));
        assert_eq!(str_to_u64("+7"), Some(7));
        assert_eq!(str_to_u64("-1"), Some(u64::MAX));
        assert_eq!(str_to_u64("7 "), None);
        assert_eq!(str_to_u64("0x10"), None);
        assert_eq!(str_to_u64("18446744073709551615"), Some(u64::MAX));
        assert_eq!(str_to_u64("18446744073709551616"), None);
        assert_eq!(str_to_u64("-"), None);
    }

    #[test]
    fn json_area_must_be_one_object_then_nuls() {
        let mut area = b"{\"a\":1}".to_vec();
        area.resize(16, 0);
        assert!(parse_json_area(&area).is_ok());
        assert!(parse_json_area(b"{\"a\":1}")
            .unwrap_err()
            .contains("no terminating NUL"));
        assert!(parse_json_area(b" {}\0")
            .unwrap_err()
            .contains("start with"));
        assert!(parse_json_area(b"{}\n\0").unwrap_err().contains("0x0a"));
        assert!(parse_json_area(b"{}\0\0x\0")
            .unwrap_err()
            .contains("offset 4"));
        assert!(parse_json_area(b"{\"a\":\0\0")
            .unwrap_err()
            .contains("does not parse"));
    }
}
