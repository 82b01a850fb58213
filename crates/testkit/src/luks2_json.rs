//! Editing LUKS2 header bytes the way a damaged disk, a hand-made header or an attacker would:
//! the JSON metadata of both copies changed and resealed with a checksum computed here with
//! SHA-256 directly (not with the crate's code), so the tests do not trust what they test.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// `hdr_size` of the primary binary header.
pub fn hdr_size(bytes: &[u8]) -> usize {
    u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize
}

/// Recompute the SHA-256 checksum of the copy at `offset`: the binary header with its checksum
/// field zeroed, then the JSON area.
pub fn reseal(bytes: &mut [u8], offset: usize) {
    let size = u64::from_be_bytes(bytes[offset + 8..offset + 16].try_into().unwrap()) as usize;
    bytes[offset + 448..offset + 512].fill(0);
    let sum = Sha256::digest(&bytes[offset..offset + size]);
    bytes[offset + 448..offset + 448 + 32].copy_from_slice(&sum);
}

/// The JSON metadata of the copy at `offset`.
pub fn json_at(bytes: &[u8], offset: usize) -> Value {
    let size = hdr_size(&bytes[offset..]);
    let area = &bytes[offset + 4096..offset + size];
    let end = area.iter().position(|&b| b == 0).unwrap();
    serde_json::from_slice(&area[..end]).unwrap()
}

/// Store raw JSON text in the copy at `offset` (zero-filling the rest of the area, which must
/// have room) and reseal it.
pub fn put_json_text(bytes: &mut [u8], offset: usize, text: &[u8]) {
    let size = hdr_size(&bytes[offset..]);
    let area = &mut bytes[offset + 4096..offset + size];
    area.fill(0);
    area[..text.len()].copy_from_slice(text);
    reseal(bytes, offset);
}

/// Apply `edit` to the JSON metadata of both copies, store it back compactly and reseal both.
pub fn edit_json(bytes: &mut [u8], edit: impl Fn(&mut Value)) {
    let size = hdr_size(bytes);
    for offset in [0, size] {
        let mut v = json_at(bytes, offset);
        edit(&mut v);
        let text = serde_json::to_vec(&v).unwrap();
        put_json_text(bytes, offset, &text);
    }
}

/// Add `name` to the mandatory requirements of both copies (after any already there): a
/// header from a newer tool, which every write, conversion and activation must refuse.
pub fn require_unknown(bytes: &mut [u8], name: &str) {
    edit_json(bytes, |v| {
        let mut reqs: Vec<Value> = v["config"]["requirements"]["mandatory"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        reqs.push(Value::from(name));
        v["config"]["requirements"] = serde_json::json!({ "mandatory": reqs });
    });
}

/// The id of the reencrypt keyslot in JSON metadata `v` (it must have one).
pub fn reencrypt_keyslot(v: &Value) -> String {
    v["keyslots"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, k)| k["type"] == "reencrypt")
        .map(|(n, _)| n.clone())
        .expect("a reencrypt keyslot")
}
