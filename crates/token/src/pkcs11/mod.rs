//! `systemd-pkcs11` tokens: a random key, encrypted (RSA, PKCS#1 v1.5 padding) to the public
//! key of a certificate on a PKCS#11 token (smart card, HSM, SoftHSM), decrypted on the token
//! at unlock. The keyslot's passphrase is that key in base64. The token object, as
//! systemd-cryptenroll writes it:
//!
//! ```json
//! {"type": "systemd-pkcs11", "keyslots": ["1"],
//!  "pkcs11-uri": "pkcs11:token=...;id=%01", "pkcs11-key": "<base64 of the RSA ciphertext>"}
//! ```
//!
//! Modules: the URI's `module-path`, else p11-kit's proxy, which offers every module registered
//! with p11-kit (`/usr/share/p11-kit/modules/`), as systemd loads them. The URI names the
//! certificate or the private key; at unlock the private key with the same id and label is
//! used whatever the URI's `type` (systemd 252's plugin refuses a `type=cert` URI, so enrolment
//! stores the URI without its `type`).

mod uri;

use std::path::PathBuf;

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as P11Error, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::{Slot, TokenInfo};
use cryptoki::types::RawAuthPin;
use openssl::pkey::Id;
use openssl::rsa::Padding;
use openssl::x509::X509;
use rand::RngCore;
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::{Pbkdf, PbkdfKind};
use sectorcrypt_secret::SecretBytes;
use serde_json::{json, Value};
use zeroize::Zeroizing;

pub use uri::Pkcs11Uri;

use crate::{base64_field, base64_passphrase, string_field, Enrolment, Error, Pins};

/// The token type.
pub const TYPE: &str = "systemd-pkcs11";

/// The largest `pkcs11-key` taken: an RSA ciphertext of a 16384-bit key.
const MAX_ENCRYPTED_KEY: usize = 2048;

/// Where p11-kit's proxy module is found (Debian, then other layouts, then the loader's path).
const PROXY_MODULES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/p11-kit-proxy.so",
    "/usr/lib/aarch64-linux-gnu/p11-kit-proxy.so",
    "/usr/lib64/p11-kit-proxy.so",
    "/usr/lib/p11-kit-proxy.so",
    "p11-kit-proxy.so",
];

/// The passphrase a `systemd-pkcs11` token releases: its key, decrypted by the private key the
/// URI names, in base64.
pub(crate) fn release(token: &Value, pins: &mut dyn Pins) -> Result<SecretBytes, Error> {
    let (uri, encrypted) = parse(token)?;
    let module = Module::load(&uri)?;
    let (session, info) = module.session_with(&uri, ObjectClass::PRIVATE_KEY, pins)?;
    let key = find_one(&session, &uri, ObjectClass::PRIVATE_KEY, &info)?;
    let decrypted = Zeroizing::new(
        session
            .decrypt(&Mechanism::RsaPkcs, key, &encrypted)
            .map_err(|e| {
                Error::Failed(format!(
                    "security token '{}' cannot decrypt the key: {e}",
                    info.label()
                ))
            })?,
    );
    Ok(base64_passphrase(&decrypted))
}

/// The token's URI and encrypted key, checked.
pub(crate) fn parse(token: &Value) -> Result<(Pkcs11Uri, Vec<u8>), Error> {
    let uri = Pkcs11Uri::parse(string_field(token, "pkcs11-uri")?)?;
    let encrypted = base64_field(token, "pkcs11-key", MAX_ENCRYPTED_KEY)?;
    if encrypted.is_empty() {
        return Err(Error::BadToken("its \"pkcs11-key\" is empty".into()));
    }
    Ok((uri, encrypted))
}

/// A new key encrypted to the certificate `uri` names, and the token that releases it: what
/// `systemd-cryptenroll --pkcs11-token-uri` makes. `uri` may be `auto`: the one certificate on
/// the tokens present.
pub fn enroll(uri_text: &str, pins: &mut dyn Pins) -> Result<Enrolment, Error> {
    let (uri, stored) = if uri_text == "auto" {
        let found = auto_uri()?;
        (Pkcs11Uri::parse(&found)?, found)
    } else {
        (Pkcs11Uri::parse(uri_text)?, without_type(uri_text))
    };
    let module = Module::load(&uri)?;
    let (session, info) = module.session_with(&uri, ObjectClass::CERTIFICATE, pins)?;
    let cert = find_one(&session, &uri, ObjectClass::CERTIFICATE, &info)?;
    let der = session
        .get_attributes(cert, &[AttributeType::Value])
        .map_err(|e| Error::Failed(format!("cannot read the certificate: {e}")))?
        .into_iter()
        .find_map(|a| match a {
            Attribute::Value(v) => Some(v),
            _ => None,
        })
        .ok_or_else(|| Error::Failed("the certificate has no value".into()))?;
    let public = X509::from_der(&der)
        .and_then(|c| c.public_key())
        .map_err(|e| Error::Failed(format!("cannot read the certificate's public key: {e}")))?;
    if public.id() != Id::RSA {
        return Err(Error::Unavailable(
            "the certificate's key is not RSA (systemd-pkcs11 tokens need RSA)".into(),
        ));
    }
    let rsa = public
        .rsa()
        .map_err(|e| Error::Failed(format!("cannot read the RSA key: {e}")))?;
    // As systemd: a key half the modulus long, leaving room for PKCS#1 padding.
    let key_len = rsa.size() as usize / 2;
    if key_len < 32 {
        return Err(Error::Unavailable(format!(
            "the certificate's RSA key has only {} bits",
            rsa.size() * 8
        )));
    }
    let mut key = SecretBytes::zeroed(key_len);
    rand::rngs::OsRng.fill_bytes(&mut key);
    let mut encrypted = vec![0u8; rsa.size() as usize];
    let n = rsa
        .public_encrypt(&key, &mut encrypted, Padding::PKCS1)
        .map_err(|e| Error::Failed(format!("cannot encrypt to the certificate: {e}")))?;
    encrypted.truncate(n);
    use base64::Engine;
    Ok(Enrolment {
        passphrase: base64_passphrase(&key),
        token: json!({
            "type": TYPE,
            "keyslots": [],
            "pkcs11-uri": stored,
            "pkcs11-key": base64::engine::general_purpose::STANDARD.encode(&encrypted),
        }),
        // As systemd-cryptenroll: PBKDF2-SHA512 at 1,000 iterations.
        pbkdf: Pbkdf {
            kind: PbkdfKind::Pbkdf2 { hash: Hash::Sha512 },
            forced_iterations: Some(1000),
            ..Pbkdf::default()
        },
    })
}

/// `text` without its `type=` attribute: the private key and the certificate share id and
/// label, and systemd 252's plugin refuses a URI that says `type=cert`.
fn without_type(text: &str) -> String {
    let (path, query) = match text.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (text, None),
    };
    let path = path
        .strip_prefix("pkcs11:")
        .unwrap_or(path)
        .split(';')
        .filter(|a| !a.starts_with("type="))
        .collect::<Vec<_>>()
        .join(";");
    match query {
        Some(q) => format!("pkcs11:{path}?{q}"),
        None => format!("pkcs11:{path}"),
    }
}

/// The URI of the one certificate on the tokens present (`--pkcs11-token-uri auto`).
fn auto_uri() -> Result<String, Error> {
    let module = Module::load(&Pkcs11Uri::default())?;
    let mut found = Vec::new();
    for slot in module.slots()? {
        let Ok(info) = module.context.get_token_info(slot) else {
            continue;
        };
        // p11-kit's "System Trust" token holds the CA certificates: trust anchors, not keys.
        if info.model() == "p11-kit-trust" {
            continue;
        }
        let Ok(session) = module.context.open_ro_session(slot) else {
            continue;
        };
        let Ok(certs) = session.find_objects(&[Attribute::Class(ObjectClass::CERTIFICATE)]) else {
            continue;
        };
        for cert in certs {
            let attrs = session
                .get_attributes(cert, &[AttributeType::Id, AttributeType::Label])
                .unwrap_or_default();
            let id = attrs.iter().find_map(|a| match a {
                Attribute::Id(v) => Some(v.clone()),
                _ => None,
            });
            found.push(Pkcs11Uri::for_object(
                info.label(),
                info.manufacturer_id(),
                info.serial_number(),
                info.model(),
                id.as_deref(),
                None,
            ));
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::Unavailable(
            "no security token with a certificate is present".into(),
        )),
        n => Err(Error::Unavailable(format!(
            "{n} certificates are present; name one with --pkcs11-token-uri: {}",
            found.join(" ")
        ))),
    }
}

/// A loaded and initialized PKCS#11 module.
struct Module {
    context: Pkcs11,
    path: PathBuf,
}

impl Module {
    fn load(uri: &Pkcs11Uri) -> Result<Module, Error> {
        let candidates: Vec<PathBuf> = match &uri.module_path {
            Some(p) => vec![p.clone()],
            None => PROXY_MODULES.iter().map(PathBuf::from).collect(),
        };
        let mut last = String::new();
        for path in candidates {
            if path.is_absolute() && !path.exists() {
                continue;
            }
            match Pkcs11::new(&path) {
                Ok(context) => {
                    context
                        .initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK))
                        .map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
                    return Ok(Module { context, path });
                }
                Err(e) => last = format!(" ({}: {e})", path.display()),
            }
        }
        Err(Error::Unavailable(match &uri.module_path {
            Some(p) => format!("cannot load the PKCS#11 module {}{last}", p.display()),
            None => {
                format!("p11-kit's proxy module is not installed (Debian: p11-kit-modules){last}")
            }
        }))
    }

    fn slots(&self) -> Result<Vec<Slot>, Error> {
        self.context
            .get_slots_with_token()
            .map_err(|e| Error::Failed(format!("{}: cannot list slots: {e}", self.path.display())))
    }

    /// A session on the first token `uri` matches that holds an object of `class`, logged in
    /// when the token asks for it (with a PIN from `pins`, unless the token has its own PIN pad).
    fn session_with(
        &self,
        uri: &Pkcs11Uri,
        class: ObjectClass,
        pins: &mut dyn Pins,
    ) -> Result<(Session, TokenInfo), Error> {
        let tokens: Vec<(Slot, TokenInfo)> = self
            .slots()?
            .into_iter()
            .filter_map(|s| self.context.get_token_info(s).ok().map(|i| (s, i)))
            .filter(|(_, i)| {
                uri.matches_token(i.label(), i.manufacturer_id(), i.serial_number(), i.model())
            })
            .collect();
        let Some((slot, info)) = tokens.into_iter().next() else {
            return Err(Error::Unavailable(
                "no security token that matches its URI is present".into(),
            ));
        };
        let session = self
            .context
            .open_ro_session(slot)
            .map_err(|e| Error::Failed(format!("cannot open a session: {e}")))?;
        // Certificates are usually public: no PIN is asked for when one is found without it.
        let public = class == ObjectClass::CERTIFICATE
            && !session
                .find_objects(&template(uri, class))
                .unwrap_or_default()
                .is_empty();
        if info.login_required() && !public {
            login(&session, &info, pins)?;
        }
        Ok((session, info))
    }
}

fn login(session: &Session, info: &TokenInfo, pins: &mut dyn Pins) -> Result<(), Error> {
    let label = info.label().to_string();
    let result = if info.protected_authentication_path() {
        session.login(UserType::User, None)
    } else {
        let pin = pins
            .pin(&format!("Enter PIN for security token '{label}': "))
            .ok_or_else(|| Error::NeedsPin(format!("security token '{label}' needs a PIN")))?;
        session.login_with_raw(UserType::User, &RawAuthPin::new(Box::new(pin.to_vec())))
    };
    match result {
        Ok(()) | Err(P11Error::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => Ok(()),
        Err(P11Error::Pkcs11(RvError::PinIncorrect, _)) => Err(Error::WrongPin(format!(
            "security token '{label}' refused the PIN"
        ))),
        Err(P11Error::Pkcs11(RvError::PinLocked, _)) => Err(Error::Failed(format!(
            "the PIN of security token '{label}' is locked"
        ))),
        Err(e) => Err(Error::Failed(format!(
            "cannot log into security token '{label}': {e}"
        ))),
    }
}

/// The search template for objects of `class` with the URI's id and label.
fn template(uri: &Pkcs11Uri, class: ObjectClass) -> Vec<Attribute> {
    let mut t = vec![Attribute::Class(class)];
    if let Some(id) = &uri.id {
        t.push(Attribute::Id(id.clone()));
    }
    if let Some(label) = &uri.object {
        t.push(Attribute::Label(label.as_bytes().to_vec()));
    }
    t
}

/// The one object of `class` the URI names on the token.
fn find_one(
    session: &Session,
    uri: &Pkcs11Uri,
    class: ObjectClass,
    info: &TokenInfo,
) -> Result<ObjectHandle, Error> {
    let what = if class == ObjectClass::CERTIFICATE {
        "certificate"
    } else {
        "private key"
    };
    let found = session
        .find_objects(&template(uri, class))
        .map_err(|e| Error::Failed(format!("cannot search security token: {e}")))?;
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(Error::Unavailable(format!(
            "security token '{}' holds no {what} that matches its URI",
            info.label()
        ))),
        many => Err(Error::BadToken(format!(
            "its URI matches {} objects of security token '{}', not one {what}",
            many.len(),
            info.label()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_attribute_is_left_out_of_a_stored_uri() {
        assert_eq!(
            without_type("pkcs11:token=a;type=cert;id=%01?module-path=/x.so"),
            "pkcs11:token=a;id=%01?module-path=/x.so"
        );
        assert_eq!(without_type("pkcs11:token=a"), "pkcs11:token=a");
    }

    struct NoPins;
    impl Pins for NoPins {
        fn pin(&mut self, _: &str) -> Option<SecretBytes> {
            None
        }
    }

    #[test]
    fn malformed_tokens_are_refused_before_any_module_is_loaded() {
        for bad in [
            json!({"type": TYPE, "keyslots": ["1"]}),
            json!({"type": TYPE, "keyslots": ["1"], "pkcs11-uri": 5, "pkcs11-key": "AA=="}),
            json!({"type": TYPE, "keyslots": ["1"], "pkcs11-uri": "pkcs11:", "pkcs11-key": "%%"}),
            json!({"type": TYPE, "keyslots": ["1"], "pkcs11-uri": "http://x", "pkcs11-key": "AA=="}),
            json!({"type": TYPE, "keyslots": ["1"], "pkcs11-uri": "pkcs11:",
                   "pkcs11-key": "A".repeat(4000)}),
            json!({"type": TYPE, "keyslots": ["1"],
                   "pkcs11-uri": "pkcs11:?module-path=/nonexistent/module.so", "pkcs11-key": "AA=="}),
        ] {
            let e = release(&bad, &mut NoPins).expect_err("refused");
            assert!(
                matches!(e, Error::BadToken(_) | Error::Unavailable(_)),
                "{bad}: {e:?}"
            );
        }
    }
}
