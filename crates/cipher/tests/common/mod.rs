//! Shared test support: the vector-file parser and helpers to reach the peer implementations.
#![allow(dead_code)]

use std::path::PathBuf;

/// One `Test: Encrypt` record of a Crypto++-style vector file.
#[derive(Debug, Clone)]
pub struct Record {
    /// The `Name:` in force (e.g. `AES/XTS`, `LEA-128/CBC`).
    pub name: String,
    pub comment: String,
    pub key: Vec<u8>,
    pub iv: Vec<u8>,
    pub plaintext: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

/// The project's shared vector folder: `../shared/vectors` beside the repository, or
/// `$SECTORCRYPT_VECTORS`.
pub fn vectors_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SECTORCRYPT_VECTORS") {
        return dir.into();
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors")
}

/// Parse a vector file (see `shared/vectors/README.md`): `Key:`/`IV:`/`Plaintext:`/`Ciphertext:`
/// hex fields, a trailing `\` continues a value, `Name:` sets the algorithm for what follows,
/// `Test: Encrypt` closes a record.
pub fn load(file: &str) -> Vec<Record> {
    let path = vectors_dir().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read test vectors {}: {e}", path.display()));
    let mut records = Vec::new();
    let mut name = String::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let line = line.trim_end();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((field, value)) = line.split_once(':') else {
            panic!("malformed line {line:?} in {file}")
        };
        let mut value = value.trim().to_string();
        while value.ends_with('\\') {
            value.pop();
            value.push_str(lines.next().expect("continuation line").trim());
        }
        match field {
            "Name" => name = value,
            "Test" => {
                assert_eq!(value, "Encrypt", "unsupported test kind in {file}");
                let get = |k: &str| {
                    fields
                        .iter()
                        .rev()
                        .find(|(f, _)| f == k)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                let hex = |k: &str| {
                    hex::decode(get(k).replace(' ', ""))
                        .unwrap_or_else(|e| panic!("bad hex in {k}: {e}"))
                };
                records.push(Record {
                    name: name.clone(),
                    comment: get("Comment"),
                    key: hex("Key"),
                    iv: hex("IV"),
                    plaintext: hex("Plaintext"),
                    ciphertext: hex("Ciphertext"),
                });
                fields.clear();
            }
            _ => fields.push((field.to_string(), value)),
        }
    }
    records
}

/// Where test peers (the Crypto++ helper) are built.
pub fn scratch_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The Python interpreter that has `cryptography` (the test set-up installs it).
pub fn python() -> String {
    std::env::var("SECTORCRYPT_PYTHON").unwrap_or_else(|_| "python3".to_string())
}
