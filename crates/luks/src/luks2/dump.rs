//! `cryptsetup luksDump` for LUKS2 (`LUKS2_hdr_dump` and the keyslot, token and digest dump
//! handlers), byte for byte. It works on the metadata as JSON, reading fields the way cryptsetup
//! reads them with json-c, so that keyslots, segments and digests this crate has no type for
//! print exactly as cryptsetup prints them.

use std::fmt::Write;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::Value;

use super::limits::{DIGESTS_MAX, KEYSLOTS_MAX};
use super::validate::str_to_u64;

/// The binary-header values the dump shows.
pub(super) struct BinaryFields<'a> {
    pub version: u16,
    pub seqid: u64,
    pub uuid: &'a str,
    pub label: &'a str,
    pub subsystem: &'a str,
}

/// `json_object_get_string`: a string's text, any other value's JSON text, "(null)" for a
/// missing value (what glibc's printf shows for the NULL pointer cryptsetup passes).
fn text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "(null)".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// `json_object_get_int64`.
fn int64(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|_| i64::MAX))
            .or_else(|| n.as_f64().map(|f| f as i64))
            .unwrap_or(0),
        Some(Value::Bool(b)) => i64::from(*b),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
        _ => 0,
    }
}

/// `json_object_get_int`: the 64-bit value clamped to 32 bits.
fn int(v: Option<&Value>) -> i32 {
    int64(v).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// `crypt_jobj_get_uint32`.
fn uint32(v: Option<&Value>) -> u32 {
    int64(v) as u32
}

/// `crypt_jobj_get_uint64`: the decimal text (of a string, or of a number's JSON text), 0 if it
/// does not convert.
fn uint64(v: Option<&Value>) -> u64 {
    match v {
        None | Some(Value::Null) => 0,
        Some(v) => str_to_u64(&text(Some(v))).unwrap_or(0),
    }
}

/// `hexprint_base64`: the decoded bytes as "xx " groups, 16 to a line, continuation lines
/// indented with `line_sep`; nothing at all if the text is not base64.
fn hexprint_base64(out: &mut String, v: Option<&Value>, line_sep: &str) {
    let Ok(bytes) = BASE64.decode(text(v).as_bytes()) else {
        if v.is_none() {
            out.push('\n');
        }
        return;
    };
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 && i.is_multiple_of(16) {
            let _ = write!(out, "\n\t{line_sep}");
        }
        let _ = write!(out, "{b:02x} ");
    }
    out.push('\n');
}

fn array(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn contains(list: Option<&Value>, name: &str) -> bool {
    array(list).iter().any(|v| text(Some(v)) == name)
}

/// The digests object's entries in header order.
fn entries(v: Option<&Value>) -> Vec<(&String, &Value)> {
    v.and_then(Value::as_object)
        .map(|m| m.iter().collect())
        .unwrap_or_default()
}

/// The dump. `meta` is the metadata as JSON; `order` gives the header order of what cryptsetup
/// walks in header order rather than by number.
pub(super) fn dump_text(bin: &BinaryFields, meta: &Value, order: &Order) -> String {
    let mut s = String::new();
    let json_size = uint64(meta.pointer("/config/json_size"));
    let keyslots_size = uint64(meta.pointer("/config/keyslots_size"));
    let or = |v: &str, none: &str| {
        if v.is_empty() {
            none.to_string()
        } else {
            v.to_string()
        }
    };
    s += "LUKS header information\n";
    let _ = writeln!(s, "Version:       \t{}", bin.version);
    let _ = writeln!(s, "Epoch:         \t{}", bin.seqid);
    let _ = writeln!(
        s,
        "Metadata area: \t{} [bytes]",
        json_size.wrapping_add(4096)
    );
    let _ = writeln!(s, "Keyslots area: \t{keyslots_size} [bytes]");
    let _ = writeln!(s, "UUID:          \t{}", or(bin.uuid, "(no UUID)"));
    let _ = writeln!(s, "Label:         \t{}", or(bin.label, "(no label)"));
    let _ = writeln!(
        s,
        "Subsystem:     \t{}",
        or(bin.subsystem, "(no subsystem)")
    );
    dump_config(&mut s, meta);
    dump_segments(&mut s, meta);
    dump_keyslots(&mut s, meta, order);
    dump_tokens(&mut s, meta);
    dump_digests(&mut s, meta);
    s
}

/// Header order of the numbered sections, which a `serde_json::Value` does not keep.
pub(super) struct Order {
    /// Digest numbers in header order.
    pub digests: Vec<u32>,
}

fn dump_config(s: &mut String, meta: &Value) {
    s.push_str("Flags:       \t");
    let flags = array(meta.pointer("/config/flags"));
    let reqs = array(meta.pointer("/config/requirements/mandatory"));
    for f in flags {
        let _ = write!(s, "{} ", text(Some(f)));
    }
    let _ = write!(
        s,
        "{}\n{}",
        if flags.is_empty() { "(no flags)" } else { "" },
        if reqs.is_empty() { "\n" } else { "" }
    );
    if !reqs.is_empty() {
        s.push_str("Requirements:\t");
        for r in reqs {
            let _ = write!(s, "{} ", text(Some(r)));
        }
        s.push_str("\n\n");
    }
}

fn dump_segments(s: &mut String, meta: &Value) {
    s.push_str("Data segments:\n");
    let segments = meta.get("segments");
    for i in 0..KEYSLOTS_MAX as u32 {
        let Some(seg) = segments.and_then(|v| v.get(i.to_string())) else {
            continue;
        };
        let _ = writeln!(s, "  {i}: {}", text(seg.get("type")));
        let _ = writeln!(s, "\toffset: {} [bytes]", uint64(seg.get("offset")));
        if text(seg.get("size")) == "dynamic" {
            s.push_str("\tlength: (whole device)\n");
        } else {
            let _ = writeln!(s, "\tlength: {} [bytes]", uint64(seg.get("size")));
        }
        if let Some(enc) = seg.get("encryption") {
            let _ = writeln!(s, "\tcipher: {}", text(Some(enc)));
        }
        if let Some(sector) = seg.get("sector_size") {
            let _ = writeln!(s, "\tsector: {} [bytes]", uint32(Some(sector)));
        }
        if let Some(kind) = seg.get("integrity").and_then(|i| i.get("type")) {
            let _ = writeln!(s, "\tintegrity: {}", text(Some(kind)));
        }
        let flags = array(seg.get("flags"));
        if let Some((first, rest)) = flags.split_first() {
            let _ = write!(s, "\tflags : {}", text(Some(first)));
            for f in rest {
                let _ = write!(s, ", {}", text(Some(f)));
            }
            s.push('\n');
        }
        s.push('\n');
    }
}

/// The first digest (in header order) listing `name` in `list` ("keyslots" or "segments").
fn digest_by(meta: &Value, order: &Order, list: &str, name: &str) -> Option<u32> {
    let digests = meta.get("digests")?;
    order
        .digests
        .iter()
        .copied()
        .find(|d| contains(digests.get(d.to_string()).and_then(|v| v.get(list)), name))
}

/// cryptsetup's "(unbound)": the keyslot's digest covers no regular segment.
fn unbound(meta: &Value, order: &Order, slot: u32) -> bool {
    let Some(digest) = digest_by(meta, order, "keyslots", &slot.to_string()) else {
        return true;
    };
    let regular = entries(meta.get("segments"))
        .iter()
        .filter(|(_, seg)| !super::validate::segment_is_backup(seg))
        .count() as u32;
    !(0..regular).any(|seg| digest_by(meta, order, "segments", &seg.to_string()) == Some(digest))
}

fn priority(slot: &Value) -> &'static str {
    match slot.get("priority") {
        None => "normal",
        Some(p) => match int(Some(p)) {
            0 => "ignored",
            1 => "normal",
            2 => "preferred",
            _ => "invalid",
        },
    }
}

fn dump_keyslots(s: &mut String, meta: &Value, order: &Order) {
    s.push_str("Keyslots:\n");
    let keyslots = meta.get("keyslots");
    for j in 0..KEYSLOTS_MAX as u32 {
        let Some(slot) = keyslots.and_then(|v| v.get(j.to_string())) else {
            continue;
        };
        let kind = text(slot.get("type"));
        let _ = writeln!(
            s,
            "  {j}: {kind}{}",
            if unbound(meta, order, j) {
                " (unbound)"
            } else {
                ""
            }
        );
        if let Some(size) = slot.get("key_size") {
            let _ = writeln!(
                s,
                "\tKey:        {} bits",
                uint32(Some(size)).wrapping_mul(8)
            );
        }
        let _ = writeln!(s, "\tPriority:   {}", priority(slot));
        match kind.as_str() {
            "luks2" => dump_luks2_keyslot(s, slot),
            "reencrypt" => dump_reencrypt_keyslot(s, slot),
            _ => {}
        }
        let name = j.to_string();
        for d in &order.digests {
            let digest = meta.get("digests").and_then(|v| v.get(d.to_string()));
            if contains(digest.and_then(|v| v.get("keyslots")), &name) {
                let _ = writeln!(s, "\tDigest ID:  {d}");
            }
        }
    }
}

fn dump_luks2_keyslot(s: &mut String, slot: &Value) {
    let (Some(kdf), Some(af), Some(area)) = (slot.get("kdf"), slot.get("af"), slot.get("area"))
    else {
        return;
    };
    let _ = writeln!(s, "\tCipher:     {}", text(area.get("encryption")));
    let _ = writeln!(
        s,
        "\tCipher key: {} bits",
        uint32(area.get("key_size")).wrapping_mul(8)
    );
    let kind = text(kdf.get("type"));
    let _ = writeln!(s, "\tPBKDF:      {kind}");
    if kind == "pbkdf2" {
        let _ = writeln!(s, "\tHash:       {}", text(kdf.get("hash")));
        let _ = writeln!(s, "\tIterations: {}", uint64(kdf.get("iterations")));
    } else {
        // cryptsetup prints these int64 values with PRIu64.
        let _ = writeln!(s, "\tTime cost:  {}", int64(kdf.get("time")) as u64);
        let _ = writeln!(s, "\tMemory:     {}", int64(kdf.get("memory")) as u64);
        let _ = writeln!(s, "\tThreads:    {}", int64(kdf.get("cpus")) as u64);
    }
    s.push_str("\tSalt:       ");
    hexprint_base64(s, kdf.get("salt"), "            ");
    let _ = writeln!(s, "\tAF stripes: {}", int(af.get("stripes")));
    let _ = writeln!(s, "\tAF hash:    {}", text(af.get("hash")));
    let _ = writeln!(s, "\tArea offset:{} [bytes]", uint64(area.get("offset")));
    let _ = writeln!(s, "\tArea length:{} [bytes]", uint64(area.get("size")));
}

fn dump_reencrypt_keyslot(s: &mut String, slot: &Value) {
    let (Some(direction), Some(mode), Some(area)) =
        (slot.get("direction"), slot.get("mode"), slot.get("area"))
    else {
        return;
    };
    let Some(resilience) = area.get("type") else {
        return;
    };
    let _ = writeln!(s, "\t{:<12}{}", "Mode:", text(Some(mode)));
    let _ = writeln!(s, "\t{:<12}{}", "Direction:", text(Some(direction)));
    let resilience = text(Some(resilience));
    let _ = writeln!(s, "\t{:<12}{}", "Resilience:", resilience);
    if resilience == "checksum" {
        let _ = writeln!(s, "\t{:<12}{}", "Hash:", text(area.get("hash")));
        let _ = writeln!(
            s,
            "\t{:<12}{} [bytes]",
            "Hash data:",
            int(area.get("sector_size"))
        );
    } else if resilience == "datashift" {
        let _ = writeln!(
            s,
            "\t{:<12}{}[bytes]",
            "Shift size:",
            uint64(area.get("shift_size"))
        );
    }
    let _ = writeln!(s, "\tArea offset:{} [bytes]", uint64(area.get("offset")));
    let _ = writeln!(s, "\tArea length:{} [bytes]", uint64(area.get("size")));
}

fn dump_tokens(s: &mut String, meta: &Value) {
    s.push_str("Tokens:\n");
    let tokens = meta.get("tokens");
    for j in 0..KEYSLOTS_MAX as u32 {
        let Some(token) = tokens.and_then(|v| v.get(j.to_string())) else {
            continue;
        };
        let kind = text(token.get("type"));
        let _ = writeln!(s, "  {j}: {kind}");
        // The one token handler built into cryptsetup; external ones (systemd-tpm2, ...) print
        // their own lines through plugins, which sectorcrypt does not load.
        if kind == "luks2-keyring" {
            if let Some(desc) = token.get("key_description") {
                let _ = writeln!(s, "\tKey description: {}", text(Some(desc)));
            }
        }
        for k in array(token.get("keyslots")) {
            let _ = writeln!(s, "\tKeyslot:    {}", text(Some(k)));
        }
    }
}

fn dump_digests(s: &mut String, meta: &Value) {
    s.push_str("Digests:\n");
    let digests = meta.get("digests");
    for i in 0..DIGESTS_MAX {
        let Some(digest) = digests.and_then(|v| v.get(i.to_string())) else {
            continue;
        };
        let kind = text(digest.get("type"));
        let _ = writeln!(s, "  {i}: {kind}");
        if kind == "pbkdf2" {
            let _ = writeln!(s, "\tHash:       {}", text(digest.get("hash")));
            let _ = writeln!(
                s,
                "\tIterations: {}",
                int64(digest.get("iterations")) as u64
            );
            s.push_str("\tSalt:       ");
            hexprint_base64(s, digest.get("salt"), "            ");
            s.push_str("\tDigest:     ");
            hexprint_base64(s, digest.get("digest"), "            ");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_c_conversions() {
        assert_eq!(text(None), "(null)");
        assert_eq!(text(Some(&Value::from(12))), "12");
        assert_eq!(uint64(Some(&Value::from("33"))), 33);
        assert_eq!(uint64(Some(&Value::from(44))), 44);
        assert_eq!(uint64(Some(&Value::from("x"))), 0);
        assert_eq!(int(Some(&Value::from(1u64 << 40))), i32::MAX);
        assert_eq!(uint32(Some(&Value::from(-1))), u32::MAX);
    }

    #[test]
    fn hex_lines_of_sixteen() {
        let mut s = String::new();
        let v = Value::from(BASE64.encode((0u8..18).collect::<Vec<_>>()));
        hexprint_base64(&mut s, Some(&v), "  ");
        assert_eq!(
            s,
            "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f \n\t  10 11 \n"
        );
    }
}
