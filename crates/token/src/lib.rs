//! Unlocking LUKS2 volumes without typing a passphrase: the tokens `systemd-cryptenroll` writes
//! into a LUKS2 header, read and written byte for byte as systemd does, so that a volume enrolled
//! by either tool unlocks with the other.
//!
//! A token is a JSON object in the header naming keyslots and saying where their passphrase
//! comes from. Each token type is a module that turns its object into that passphrase (and, at
//! enrolment, makes a new passphrase and the object that releases it); [`unlock`] tries the
//! tokens in cryptsetup's order and hands each released passphrase to the caller's keyslot
//! check, so the keyslot code stays the one in `sectorcrypt-luks`. Types:
//!
//! - `systemd-pkcs11` ([`pkcs11`]): a random key encrypted to an RSA key on a smart card or HSM,
//!   decrypted there; the passphrase is that key in base64.
//! - `systemd-tpm2` ([`tpm2`]): random bytes sealed by a TPM 2.0 to PCR values and a PIN; the
//!   passphrase is their base64.
//! - `systemd-fido2` ([`fido2`]): the hmac-secret a FIDO2 security key derives from a credential
//!   and a salt; the passphrase is its base64.
//! - `clevis` ([`clevis`]): the passphrase is a JWE's plaintext; with the `tang` pin its key is
//!   recovered from a tang server without the server learning it.
//!
//! A token that cannot be used here and now (no such device, a PIN refused, a type this crate
//! does not know) is one [`Reason`] among the others; the caller decides whether to fall back to
//! a passphrase, as cryptsetup does unless `--token-only`.
//!
//! Secrets: a released passphrase and a PIN are [`SecretBytes`] (locked, not dumped, zeroized);
//! what a PKCS#11 module returns is copied there at once and its buffer zeroized.

pub mod clevis;
pub mod fido2;
#[doc(hidden)]
pub mod fuzzing;
pub mod pkcs11;
pub mod tpm2;

use std::fmt;

use base64::Engine;
use sectorcrypt_luks::luks2::{self, Pbkdf};
use sectorcrypt_luks::Error as LuksError;
use sectorcrypt_secret::SecretBytes;
use serde_json::Value;

/// Why a token did not unlock the volume.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The token's JSON (or a URI in it) is malformed.
    BadToken(String),
    /// What the token needs is not here: no such device or module, no matching key.
    Unavailable(String),
    /// The token needs a PIN and there is no way to ask for one.
    NeedsPin(String),
    /// The device refused the PIN.
    WrongPin(String),
    /// The token's device or library failed.
    Failed(String),
    /// The token released a passphrase that none of its keyslots takes.
    Rejected(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadToken(s)
            | Error::Unavailable(s)
            | Error::NeedsPin(s)
            | Error::WrongPin(s)
            | Error::Failed(s)
            | Error::Rejected(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for Error {}

/// Where a token asks for a PIN: a terminal prompt, a file, or nowhere (`None`).
pub trait Pins {
    /// The PIN, asked with `prompt`; `None` if there is no way to ask.
    fn pin(&mut self, prompt: &str) -> Option<SecretBytes>;

    /// Tell the user something they must do (touch a security key).
    fn notice(&mut self, _message: &str) {}
}

/// Which tokens to try (cryptsetup's `--token-id`, `--token-type`) and for which keyslot
/// (`--key-slot`).
#[derive(Clone, Debug, Default)]
pub struct Choice {
    /// Only this token.
    pub id: Option<u32>,
    /// Only tokens of this type.
    pub kind: Option<String>,
    /// Only tokens that release this keyslot's passphrase.
    pub keyslot: Option<usize>,
    /// The TPM for `systemd-tpm2` tokens (default [`tpm2::DEFAULT_DEVICE`]).
    pub tpm2_device: Option<String>,
    /// The FIDO2 key for `systemd-fido2` tokens (default: every one plugged in).
    pub fido2_device: Option<String>,
    /// The signature of a signed TPM2 PCR policy (default [`tpm2::DEFAULT_SIGNATURE`]).
    pub tpm2_signature: Option<std::path::PathBuf>,
}

/// A token that unlocked the volume.
pub struct Unlocked<T> {
    /// What the caller's check returned.
    pub value: T,
    /// The passphrase the token released.
    pub passphrase: SecretBytes,
    /// The token's number.
    pub token: u32,
    /// The keyslot it opened.
    pub keyslot: usize,
}

/// A token tried without success, and why.
#[derive(Debug)]
pub struct Reason {
    /// The token's number.
    pub token: u32,
    /// Its type.
    pub kind: String,
    /// What went wrong.
    pub error: Error,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "token {} ({}): {}", self.token, self.kind, self.error)
    }
}

/// What [`unlock`] came to.
pub enum Outcome<T> {
    /// A token released a passphrase that opened a keyslot.
    Unlocked(Unlocked<T>),
    /// None did; why each chosen token failed (empty if none was chosen).
    NotUnlocked(Vec<Reason>),
}

/// The token types this crate can use.
pub const KNOWN_TYPES: &[&str] = &[pkcs11::TYPE, tpm2::TYPE, fido2::TYPE, clevis::TYPE];

/// Try the tokens of `header` that `choice` allows, in number order (as cryptsetup does). Each
/// released passphrase goes to `attempt` with each keyslot the token names; the first that
/// `attempt` opens ends the search. `attempt`'s [`LuksError::WrongPassphrase`] moves on to the
/// next keyslot or token; any other error of it ends the search and is returned.
pub fn unlock<T>(
    header: &luks2::Header,
    choice: &Choice,
    pins: &mut dyn Pins,
    mut attempt: impl FnMut(&[u8], usize) -> Result<T, LuksError>,
) -> Result<Outcome<T>, LuksError> {
    let mut reasons = Vec::new();
    for (number, token) in header.metadata().tokens.iter() {
        let kind = token.get("type").and_then(Value::as_str).unwrap_or("");
        if choice.id.is_some_and(|id| id != number)
            || choice.kind.as_deref().is_some_and(|k| k != kind)
        {
            continue;
        }
        let mut fail = |error: Error| {
            reasons.push(Reason {
                token: number,
                kind: kind.to_string(),
                error,
            })
        };
        let slots = match keyslots(token) {
            Ok(slots) => slots,
            Err(e) => {
                fail(e);
                continue;
            }
        };
        let slots: Vec<usize> = slots
            .into_iter()
            .filter(|s| choice.keyslot.is_none_or(|k| k == *s))
            .collect();
        // A token naming no keyslot (or not the one asked for) releases nothing here: passed
        // over without a word, as cryptsetup passes it over.
        if slots.is_empty() {
            continue;
        }
        let released = match kind {
            pkcs11::TYPE => pkcs11::release(token, pins),
            clevis::TYPE => clevis::release(
                token,
                choice
                    .tpm2_device
                    .as_deref()
                    .unwrap_or(tpm2::DEFAULT_DEVICE),
            ),
            fido2::TYPE => fido2::release(token, choice.fido2_device.as_deref(), pins),
            tpm2::TYPE => tpm2::release(
                token,
                choice
                    .tpm2_device
                    .as_deref()
                    .unwrap_or(tpm2::DEFAULT_DEVICE),
                choice
                    .tpm2_signature
                    .as_deref()
                    .unwrap_or(std::path::Path::new(tpm2::DEFAULT_SIGNATURE)),
                pins,
            ),
            _ => Err(Error::Unavailable(format!(
                "sectorcrypt does not use tokens of this type (it uses {})",
                KNOWN_TYPES.join(", ")
            ))),
        };
        let passphrase = match released {
            Ok(p) => p,
            Err(e) => {
                fail(e);
                continue;
            }
        };
        for &slot in &slots {
            match attempt(&passphrase, slot) {
                Ok(value) => {
                    return Ok(Outcome::Unlocked(Unlocked {
                        value,
                        passphrase,
                        token: number,
                        keyslot: slot,
                    }))
                }
                Err(LuksError::WrongPassphrase) => {}
                Err(e) => return Err(e),
            }
        }
        fail(Error::Rejected(format!(
            "the passphrase it released opens none of its keyslots ({})",
            slots
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(Outcome::NotUnlocked(reasons))
}

/// Check a token of a type this crate uses, as cryptsetup's token plugins do when a token is
/// imported: its keyslot list and its own fields, their types and sizes. Tokens of other types
/// pass: they are not this crate's to judge.
pub fn validate(token: &Value) -> Result<(), Error> {
    match token.get("type").and_then(Value::as_str) {
        Some(pkcs11::TYPE) => {
            keyslots(token)?;
            pkcs11::parse(token).map(drop)
        }
        Some(clevis::TYPE) => {
            keyslots(token)?;
            clevis::parse(token).map(drop)
        }
        Some(tpm2::TYPE) => {
            keyslots(token)?;
            tpm2::Sealed::parse(token).map(drop)
        }
        Some(fido2::TYPE) => {
            keyslots(token)?;
            fido2::Fido2Token::parse(token).map(drop)
        }
        _ => Ok(()),
    }
}

/// The keyslot numbers a token names (`"keyslots": ["1", ...]`).
fn keyslots(token: &Value) -> Result<Vec<usize>, Error> {
    let bad = || Error::BadToken("its \"keyslots\" is not a list of keyslot numbers".into());
    token
        .get("keyslots")
        .and_then(Value::as_array)
        .ok_or_else(bad)?
        .iter()
        .map(|v| v.as_str().and_then(|s| s.parse().ok()).ok_or_else(bad))
        .collect()
}

/// A string field of a token object.
fn string_field<'a>(token: &'a Value, name: &str) -> Result<&'a str, Error> {
    token
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| Error::BadToken(format!("it has no string \"{name}\"")))
}

/// A base64 field of a token object, at most `limit` bytes once decoded.
fn base64_field(token: &Value, name: &str, limit: usize) -> Result<Vec<u8>, Error> {
    let text = string_field(token, name)?;
    if text.len() > limit.div_ceil(3) * 4 {
        return Err(Error::BadToken(format!(
            "its \"{name}\" is longer than {limit} bytes"
        )));
    }
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| Error::BadToken(format!("its \"{name}\" is not base64")))
}

/// `key` in standard base64, in secret memory: the passphrase systemd makes of a released key.
fn base64_passphrase(key: &[u8]) -> SecretBytes {
    let mut out = SecretBytes::zeroed(key.len().div_ceil(3) * 4);
    let n = base64::engine::general_purpose::STANDARD
        .encode_slice(key, &mut out)
        .expect("the buffer fits the encoding");
    out.truncate(n);
    out
}

/// What enrolment makes: the new keyslot's passphrase, the token that releases it (its
/// `keyslots` still empty), and the KDF the other tool gives such a keyslot (its passphrase is
/// random, so the cheapest: an expensive KDF would only slow every unlock down).
pub struct Enrolment {
    /// The passphrase for the new keyslot.
    pub passphrase: SecretBytes,
    /// The token object to store with it.
    pub token: Value,
    /// The new keyslot's KDF.
    pub pbkdf: Pbkdf,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keyslot_lists_are_checked() {
        assert_eq!(
            keyslots(&json!({"keyslots": ["1", "3"]})).unwrap(),
            vec![1, 3]
        );
        for bad in [
            json!({}),
            json!({"keyslots": [1]}),
            json!({"keyslots": ["x"]}),
        ] {
            assert!(matches!(keyslots(&bad), Err(Error::BadToken(_))), "{bad}");
        }
    }

    #[test]
    fn base64_fields_are_bounded_and_decoded() {
        let t = json!({"k": "AAEC", "long": "A".repeat(2000), "bad": "!!", "n": 5});
        assert_eq!(base64_field(&t, "k", 16).unwrap(), vec![0, 1, 2]);
        assert!(base64_field(&t, "long", 1024).is_err());
        assert!(base64_field(&t, "bad", 16).is_err());
        assert!(base64_field(&t, "n", 16).is_err());
        assert!(base64_field(&t, "missing", 16).is_err());
    }

    #[test]
    fn a_released_key_becomes_its_base64() {
        assert_eq!(&base64_passphrase(&[0xff, 0, 1, 2])[..], b"/wABAg==");
        assert_eq!(&base64_passphrase(&[])[..], b"");
    }
}
