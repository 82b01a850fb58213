//! OpenSSL (through Python's `cryptography`) as the independent implementation that decrypts
//! what sectorcrypt encrypted, by the documented IV rules.

use std::path::Path;
use std::process::Command;

use crate::{ok, p, python};

/// Decrypt the whole file `file` as units of `unit` bytes, the first being unit number `first`,
/// with `spec` (`aes-xts-plain64`, or `aes-cbc-essiv:sha256`) under `key`: `plain64` IV = unit
/// number (little-endian, 16 bytes; ESSIV encrypts it with SHA-256 of the key).
pub fn decrypt_units(file: &Path, spec: &str, key: &[u8], unit: usize, first: u64) -> Vec<u8> {
    const SCRIPT: &str = r#"
import hashlib, sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
path, spec, key, unit, first = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
data = open(path, "rb").read()
out = bytearray()
for i in range(len(data) // unit):
    iv = (first + i).to_bytes(16, "little")
    if spec == "aes-xts-plain64":
        c = Cipher(algorithms.AES(key), modes.XTS(iv))
    elif spec == "aes-cbc-essiv:sha256":
        salt = hashlib.sha256(key).digest()
        e = Cipher(algorithms.AES(salt), modes.ECB()).encryptor()
        c = Cipher(algorithms.AES(key), modes.CBC(e.update(iv) + e.finalize()))
    else:
        sys.exit("unknown spec " + spec)
    d = c.decryptor()
    out += d.update(data[i * unit:(i + 1) * unit]) + d.finalize()
open(path + ".plain", "wb").write(out)
"#;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let out = Command::new(python())
        .args(["-c", SCRIPT, p(file), spec, &hex])
        .arg(unit.to_string())
        .arg(first.to_string())
        .output()
        .expect("python3 runs");
    ok(out, "python3 cryptography");
    std::fs::read(format!("{}.plain", p(file))).unwrap()
}
