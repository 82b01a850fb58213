//! `systemd-fido2` tokens: the keyslot's passphrase is the base64 of the `hmac-secret` a FIDO2
//! security key derives from a credential it made and a salt (CTAP 2.1's hmac-secret
//! extension), as systemd-cryptenroll writes them:
//!
//! ```json
//! {"type": "systemd-fido2", "keyslots": ["1"], "fido2-credential": "<base64 id>",
//!  "fido2-salt": "<base64, 32 bytes>", "fido2-rp": "io.systemd.cryptsetup",
//!  "fido2-clientPin-required": true, "fido2-up-required": true, "fido2-uv-required": false}
//! ```
//!
//! The key is spoken to directly (CTAPHID over `/dev/hidraw*`, [`hid`]; CTAP2 and its PIN/UV
//! protocols, [`ctap`]): no libfido2. Without a key plugged in, a token is one more reason.

pub(crate) mod cbor;
pub(crate) mod ctap;
pub(crate) mod hid;

use std::path::PathBuf;

use rand::RngCore;
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::{Pbkdf, PbkdfKind};
use sectorcrypt_secret::SecretBytes;
use serde_json::{json, Value};

use self::ctap::Authenticator;
use crate::{base64_field, base64_passphrase, string_field, Enrolment, Error, Pins};

/// The token type.
pub const TYPE: &str = "systemd-fido2";

/// systemd's relying party for LUKS credentials.
const RELYING_PARTY: &str = "io.systemd.cryptsetup";

/// A `systemd-fido2` token, checked.
pub(crate) struct Fido2Token {
    credential: Vec<u8>,
    salt: Vec<u8>,
    rp: String,
    pin: bool,
    up: bool,
    uv: bool,
}

impl Fido2Token {
    pub(crate) fn parse(token: &Value) -> Result<Fido2Token, Error> {
        let credential = base64_field(token, "fido2-credential", 1024)?;
        let salt = base64_field(token, "fido2-salt", 64)?;
        if credential.is_empty() || salt.len() != 32 {
            return Err(Error::BadToken(
                "its fido2-credential is empty or its fido2-salt is not 32 bytes".into(),
            ));
        }
        let rp = match token.get("fido2-rp") {
            None => RELYING_PARTY.to_string(),
            Some(_) => string_field(token, "fido2-rp")?.to_string(),
        };
        let flag = |name: &str, default: bool| match token.get(name) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| Error::BadToken(format!("its {name} is not a boolean"))),
        };
        Ok(Fido2Token {
            credential,
            salt,
            rp,
            // systemd 248's tokens had no flags: a PIN and a touch, as it asked then.
            pin: flag("fido2-clientPin-required", true)?,
            up: flag("fido2-up-required", true)?,
            uv: flag("fido2-uv-required", false)?,
        })
    }
}

/// The keys to try: `device`, or every FIDO key plugged in.
fn keys(device: Option<&str>) -> Result<Vec<PathBuf>, Error> {
    let found = match device {
        Some(d) if d != "auto" => vec![PathBuf::from(d)],
        _ => hid::devices(),
    };
    if found.is_empty() {
        return Err(Error::Unavailable(
            "no FIDO2 security key is plugged in".into(),
        ));
    }
    Ok(found)
}

/// The passphrase a `systemd-fido2` token releases: the hmac-secret of its credential and salt
/// from the first key plugged in that holds the credential.
pub(crate) fn release(
    token: &Value,
    device: Option<&str>,
    pins: &mut dyn Pins,
) -> Result<SecretBytes, Error> {
    let t = Fido2Token::parse(token)?;
    let mut last = None;
    for path in keys(device)? {
        let mut key = match Authenticator::open(&path) {
            Ok(k) => k,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        // A key without the credential (or the extension) is passed over for the next one.
        match secret_from(&mut key, &t, pins) {
            Ok(s) => return Ok(s),
            Err(e @ Error::Unavailable(_)) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::Unavailable("no FIDO2 security key is plugged in".into())))
}

fn secret_from(
    key: &mut Authenticator,
    t: &Fido2Token,
    pins: &mut dyn Pins,
) -> Result<SecretBytes, Error> {
    let info = key.info()?;
    if !info.hmac_secret {
        return Err(Error::Unavailable(format!(
            "the FIDO2 key {} has no hmac-secret extension",
            key.name()
        )));
    }
    let pin = if t.pin {
        let pin = pins
            .pin(&format!(
                "Please enter security token PIN for {}: ",
                key.name()
            ))
            .ok_or_else(|| Error::NeedsPin(format!("the FIDO2 key {} needs a PIN", key.name())))?;
        Some(key.pin_token(info.protocol, &pin)?)
    } else {
        None
    };
    if t.up {
        pins.notice(&format!(
            "Please touch the FIDO2 key {} to unlock.",
            key.name()
        ));
    }
    let secret = key.hmac_secret(
        info.protocol,
        &t.rp,
        &t.credential,
        &t.salt,
        t.up,
        t.uv,
        pin.as_ref().map(|(s, tok)| (s, &tok[..])),
    )?;
    Ok(base64_passphrase(&secret))
}

/// A credential made on the FIDO2 key `device` (`auto`: the one plugged in) with hmac-secret, a
/// random salt, and the passphrase the key derives from both: what `systemd-cryptenroll
/// --fido2-device` makes. The key is touched twice (making the credential, then deriving).
pub fn enroll(
    device: &str,
    with_pin: bool,
    up: bool,
    uv: bool,
    pins: &mut dyn Pins,
) -> Result<Enrolment, Error> {
    let found = keys(Some(device))?;
    if found.len() > 1 {
        return Err(Error::Unavailable(format!(
            "{} FIDO2 keys are plugged in; name one with --fido2-device: {}",
            found.len(),
            found
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        )));
    }
    let mut key = Authenticator::open(&found[0])?;
    let info = key.info()?;
    if !info.hmac_secret {
        return Err(Error::Unavailable(format!(
            "the FIDO2 key {} has no hmac-secret extension",
            key.name()
        )));
    }
    if uv && !info.uv {
        return Err(Error::Unavailable(format!(
            "the FIDO2 key {} cannot verify its user (no built-in UV)",
            key.name()
        )));
    }
    let pin = match (with_pin, info.client_pin) {
        (true, Some(true)) => {
            let pin = pins
                .pin(&format!(
                    "Please enter security token PIN for {}: ",
                    key.name()
                ))
                .ok_or_else(|| {
                    Error::NeedsPin(format!("the FIDO2 key {} needs a PIN", key.name()))
                })?;
            Some(key.pin_token(info.protocol, &pin)?)
        }
        (true, _) => {
            return Err(Error::Unavailable(format!(
                "the FIDO2 key {} has no PIN set (set one with fido2-token -S, or enroll without)",
                key.name()
            )))
        }
        (false, _) => None,
    };
    let mut user_id = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut user_id);
    pins.notice(&format!(
        "Please touch the FIDO2 key {} to make the credential.",
        key.name()
    ));
    let pin_ref = pin.as_ref().map(|(s, tok)| (s, &tok[..]));
    let credential = key.make_credential(RELYING_PARTY, &user_id, "sectorcrypt", uv, pin_ref)?;
    let mut salt = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    let t = Fido2Token {
        credential,
        salt: salt.to_vec(),
        rp: RELYING_PARTY.into(),
        pin: with_pin,
        up,
        uv,
    };
    pins.notice(&format!("Please touch the FIDO2 key {} again.", key.name()));
    let secret = key.hmac_secret(
        info.protocol,
        &t.rp,
        &t.credential,
        &t.salt,
        up,
        uv,
        pin_ref,
    )?;
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    Ok(Enrolment {
        passphrase: base64_passphrase(&secret),
        token: json!({
            "type": TYPE,
            "keyslots": [],
            "fido2-credential": b64(&t.credential),
            "fido2-salt": b64(&t.salt),
            "fido2-rp": RELYING_PARTY,
            "fido2-clientPin-required": with_pin,
            "fido2-up-required": up,
            "fido2-uv-required": uv,
        }),
        // As systemd-cryptenroll: PBKDF2-SHA512 at 1,000 iterations.
        pbkdf: Pbkdf {
            kind: PbkdfKind::Pbkdf2 { hash: Hash::Sha512 },
            forced_iterations: Some(1000),
            ..Pbkdf::default()
        },
    })
}

/// `python3 -c SCRIPT` (python-fido2 installed) fed `input`: its standard output, after it
/// succeeded (the independent implementation the CBOR and PIN/UV protocols are checked against).
#[cfg(test)]
pub(crate) fn python_fido2(script: &str, input: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(sectorcrypt_testkit::python())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with python-fido2 (scripts/install-test-deps.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python-fido2 disagreed (its error is above)"
    );
    String::from_utf8(out.stdout).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape systemd-cryptenroll 252 writes (`cryptenroll-fido2.c`), with a credential id
    /// and salt of the sizes a YubiKey 5 gives (64 and 32 bytes).
    #[test]
    fn systemd_tokens_parse_and_bad_ones_are_refused() {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let good = json!({"type": TYPE, "keyslots": ["1"], "fido2-credential": b64(&[7; 64]),
            "fido2-salt": b64(&[9; 32]), "fido2-rp": RELYING_PARTY,
            "fido2-clientPin-required": true, "fido2-up-required": true, "fido2-uv-required": false});
        let t = Fido2Token::parse(&good).unwrap();
        assert_eq!(
            (t.credential.len(), t.salt.len(), t.rp.as_str()),
            (64, 32, RELYING_PARTY)
        );
        assert_eq!((t.pin, t.up, t.uv), (true, true, false));
        for (field, value) in [
            ("fido2-credential", json!("")),
            ("fido2-credential", json!(5)),
            ("fido2-salt", json!(b64(&[1; 16]))),
            ("fido2-salt", json!("%%")),
            ("fido2-rp", json!(1)),
            ("fido2-up-required", json!("yes")),
        ] {
            let mut t = good.clone();
            t[field] = value;
            assert!(Fido2Token::parse(&t).is_err(), "{field}");
        }
        let mut old = good.clone();
        for f in [
            "fido2-rp",
            "fido2-clientPin-required",
            "fido2-up-required",
            "fido2-uv-required",
        ] {
            old.as_object_mut().unwrap().remove(f);
        }
        let t = Fido2Token::parse(&old).unwrap();
        assert_eq!(
            (t.rp.as_str(), t.pin, t.up, t.uv),
            (RELYING_PARTY, true, true, false)
        );
    }

    #[test]
    fn a_named_key_that_is_not_there_is_a_reason() {
        struct NoPins;
        impl Pins for NoPins {
            fn pin(&mut self, _: &str) -> Option<SecretBytes> {
                None
            }
        }
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let token = json!({"type": TYPE, "keyslots": ["1"], "fido2-credential": b64(&[7; 64]),
            "fido2-salt": b64(&[9; 32])});
        let e = release(&token, Some("/nonexistent/hidraw9"), &mut NoPins).expect_err("no key");
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    }
}
