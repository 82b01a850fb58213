//! The one parser of the test-vector files (`crates/cipher/tests/vectors/README.md`): records of
//! `Key:`/`IV:`/`Plaintext:`/`Ciphertext:` hex fields, a trailing `\` continuing a value, `Name:`
//! setting the algorithm for what follows, `Test: Encrypt` closing a record.

use std::path::Path;

/// One `Test: Encrypt` record.
#[derive(Debug, Clone)]
pub struct Record {
    /// The `Name:` in force (e.g. `AES/XTS`, `LEA-128/CBC`).
    pub name: String,
    /// The record's `Comment:`, if any.
    pub comment: String,
    /// The key (for XTS, both halves).
    pub key: Vec<u8>,
    /// The IV or tweak (empty for ECB).
    pub iv: Vec<u8>,
    /// The plaintext.
    pub plaintext: Vec<u8>,
    /// The ciphertext.
    pub ciphertext: Vec<u8>,
}

/// Every record of the vector file at `path`. A missing or malformed file is a test failure.
pub fn load(path: &Path) -> Vec<Record> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read test vectors {}: {e}", path.display()));
    let file = path.display();
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
                    let digits: String = get(k).split_whitespace().collect();
                    (0..digits.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16))
                        .collect::<Result<Vec<u8>, _>>()
                        .unwrap_or_else(|e| panic!("bad hex in {k} in {file}: {e}"))
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
    assert!(!records.is_empty(), "no records in {file}");
    records
}
