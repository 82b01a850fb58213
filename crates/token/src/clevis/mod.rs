//! `clevis` tokens: the keyslot's passphrase is the plaintext of a JWE whose protected header
//! says how to get its key back (the "pin"). As `clevis luks bind` writes it:
//!
//! ```json
//! {"type": "clevis", "keyslots": ["1"],
//!  "jwe": {"protected": "...", "encrypted_key": "", "iv": "...", "ciphertext": "...", "tag": "..."}}
//! ```
//!
//! Pins: `tang` (a network key server, [`tang`]): ECDH-ES with A256GCM, the header carrying the
//! server's URL and signed advertisement (`clevis.tang.url`, `clevis.tang.adv`), the exchange
//! key's thumbprint (`kid`) and the ephemeral key (`epk`); `tpm2`: A256GCM under a key (a JWK)
//! that a TPM sealed, the sealed object in the header (`clevis.tpm2.jwk_pub`, `jwk_priv`), with
//! the PCRs it is bound to. The `sss` pin (Shamir sharing over other pins) is reported as not
//! used here.

pub(crate) mod http;
pub(crate) mod jose;
pub(crate) mod tang;

use rand::RngCore;
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::{Pbkdf, PbkdfKind};
use sectorcrypt_secret::SecretBytes;
use serde_json::{json, Value};

use self::http::Url;
use self::jose::{b64, concat_kdf, generate, multiply, EcKey, Jwe};
use self::tang::Advertisement;
use crate::{Enrolment, Error};

/// The token type.
pub const TYPE: &str = "clevis";

/// The pin and the JWE of a clevis token, checked.
pub(crate) fn parse(token: &Value) -> Result<Jwe, Error> {
    let jwe = token
        .get("jwe")
        .ok_or_else(|| Error::BadToken("it has no \"jwe\"".into()))?;
    Jwe::parse(jwe)
}

/// The passphrase a clevis token releases (the `tpm2` pin's TPM: `tpm2_device`).
pub(crate) fn release(token: &Value, tpm2_device: &str) -> Result<SecretBytes, Error> {
    let jwe = parse(token)?;
    let pin = jwe
        .header
        .pointer("/clevis/pin")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::BadToken("its JWE header names no clevis pin".into()))?;
    match pin {
        "tang" => release_tang(&jwe),
        "tpm2" => release_tpm2(&jwe, tpm2_device),
        other => Err(Error::Unavailable(format!(
            "sectorcrypt does not use clevis' {other:?} pin (it uses tang and tpm2)"
        ))),
    }
}

fn release_tang(jwe: &Jwe) -> Result<SecretBytes, Error> {
    let h = &jwe.header;
    if h.get("alg").and_then(Value::as_str) != Some("ECDH-ES") {
        return Err(Error::BadToken("its tang JWE is not ECDH-ES".into()));
    }
    let text = |path: &str| {
        h.pointer(path)
            .and_then(Value::as_str)
            .ok_or_else(|| Error::BadToken(format!("its JWE header has no {path}")))
    };
    let url = Url::parse(text("/clevis/tang/url")?)?;
    let kid = text("/kid")?;
    let adv = Advertisement {
        keys: h
            .pointer("/clevis/tang/adv")
            .cloned()
            .ok_or_else(|| Error::BadToken("its JWE header has no tang advertisement".into()))?,
    };
    let server = adv.exchange_key(kid)?;
    let epk = EcKey::from_jwk(h.get("epk").unwrap_or(&Value::Null))?;
    let party = |name: &str| match h.get(name).and_then(Value::as_str) {
        Some(v) => b64(v, name, 1024),
        None => Ok(Vec::new()),
    };
    let (apu, apv) = (party("apu")?, party("apv")?);
    let z = tang::recover(&url, kid, &server, &epk)?;
    let cek = concat_kdf(&z.shared_secret()?, &apu, &apv);
    jwe.decrypt(&cek)
}

/// The `tpm2` pin: the JWE is encrypted directly (`dir`) with a JWK that the TPM sealed, under
/// the primary key tpm2-tools derives for `key`, with PolicyPCR over `pcr_ids` if given.
fn release_tpm2(jwe: &Jwe, device: &str) -> Result<SecretBytes, Error> {
    let h = &jwe.header;
    if h.get("alg").and_then(Value::as_str) != Some("dir") {
        return Err(Error::BadToken("its tpm2 JWE is not \"dir\"".into()));
    }
    let field = |name: &str| {
        h.pointer(&format!("/clevis/tpm2/{name}"))
            .and_then(Value::as_str)
    };
    let need = |name: &str| {
        field(name)
            .ok_or_else(|| Error::BadToken(format!("its JWE header has no clevis.tpm2.{name}")))
    };
    if field("hash").unwrap_or("sha256") != "sha256" {
        return Err(Error::Unavailable(format!(
            "its clevis tpm2 binding hashes with {} (sectorcrypt: sha256)",
            field("hash").unwrap_or_default()
        )));
    }
    let public = b64(need("jwk_pub")?, "jwk_pub", 4096)?;
    let private = b64(need("jwk_priv")?, "jwk_priv", 4096)?;
    let pcrs = match field("pcr_ids") {
        None | Some("") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|p| p.trim().parse::<u32>().ok().filter(|&p| p < 24))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| Error::BadToken(format!("its pcr_ids {list:?} are not PCRs")))?,
    };
    let jwk = crate::tpm2::unseal_clevis(
        device,
        field("key").unwrap_or("ecc"),
        &public,
        &private,
        field("pcr_bank"),
        &pcrs,
    )?;
    let jwk: Value = serde_json::from_slice(&jwk)
        .map_err(|_| Error::Failed("the TPM unsealed something that is not a JWK".into()))?;
    let k = zeroize::Zeroizing::new(b64(
        jwk.get("k").and_then(Value::as_str).unwrap_or(""),
        "k",
        32,
    )?);
    let cek: [u8; 32] = k[..]
        .try_into()
        .map_err(|_| Error::Failed("the unsealed JWK is not an AES-256 key".into()))?;
    let cek = zeroize::Zeroizing::new(cek);
    jwe.decrypt(&cek)
}

/// How enrolment trusts a tang server's signing keys (clevis asks, or takes `-y`).
pub enum Trust<'a> {
    /// One of the signing keys must have this thumbprint.
    Thumbprint(&'a str),
    /// Whatever the server advertises (trust on first use).
    Any,
    /// Ask: given the thumbprints, say whether to trust them.
    Ask(&'a mut dyn FnMut(&[String]) -> bool),
}

/// A random passphrase encrypted to the tang server at `url_text` (its advertisement fetched
/// and checked first), and the clevis token that releases it: what `clevis luks bind tang`
/// makes.
pub fn enroll_tang(url_text: &str, trust: Trust<'_>) -> Result<Enrolment, Error> {
    let url = Url::parse(url_text)?;
    let adv = Advertisement::fetch(&url)?;
    let thumbprints = adv
        .keys_for("verify")?
        .iter()
        .map(EcKey::thumbprint)
        .collect::<Result<Vec<_>, _>>()?;
    let trusted = match trust {
        Trust::Thumbprint(t) => thumbprints.iter().any(|p| p == t),
        Trust::Any => true,
        Trust::Ask(ask) => ask(&thumbprints),
    };
    if !trusted {
        return Err(Error::Rejected(format!(
            "the tang server's signing keys are not trusted (thumbprints: {})",
            thumbprints.join(", ")
        )));
    }
    let server = adv
        .keys_for("deriveKey")?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Failed("the tang server advertises no exchange key".into()))?;
    let (epk_d, epk) = generate(server.curve)?;
    let z = EcKey {
        curve: server.curve,
        point: multiply(server.curve, &server.point, &epk_d)?,
    };
    let cek = concat_kdf(&z.shared_secret()?, b"", b"");
    let header = json!({
        "alg": "ECDH-ES",
        "clevis": {"pin": "tang", "tang": {"adv": adv.keys, "url": url_text}},
        "enc": jose::ENC,
        "epk": epk.to_jwk(&[])?,
        "kid": server.thumbprint()?,
    });
    // 32 random bytes in base64url: a passphrase of 256 bits, printable as clevis' are.
    let mut key = SecretBytes::zeroed(32);
    rand::rngs::OsRng.fill_bytes(&mut key);
    let mut passphrase = SecretBytes::zeroed(43);
    let n = base64::Engine::encode_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        &key[..],
        &mut passphrase,
    )
    .expect("43 bytes hold 32 in base64url");
    passphrase.truncate(n);
    let jwe = Jwe::encrypt(&header, &cek, &passphrase)?;
    Ok(Enrolment {
        passphrase,
        token: json!({"type": TYPE, "keyslots": [], "jwe": jwe}),
        // As clevis luks bind: the passphrase is random, so PBKDF2 at its minimum.
        pbkdf: Pbkdf {
            kind: PbkdfKind::Pbkdf2 { hash: Hash::Sha256 },
            forced_iterations: Some(1000),
            ..Pbkdf::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_tokens_are_refused_without_a_network() {
        let protected = |h: Value| jose::b64_encode(h.to_string().as_bytes());
        let jwe = |p: String| {
            json!({"type": TYPE, "keyslots": ["1"], "jwe": {"protected": p, "encrypted_key": "",
                   "iv": "AAAAAAAAAAAAAAAA", "ciphertext": "AAAA", "tag": "AAAAAAAAAAAAAAAAAAAAAA"}})
        };
        let cases = [
            json!({"type": TYPE, "keyslots": ["1"]}),
            jwe("!!".into()),
            jwe(protected(json!({"enc": "A128GCM"}))),
            jwe(protected(json!({"enc": "A256GCM"}))),
            jwe(protected(
                json!({"enc": "A256GCM", "clevis": {"pin": "tang"}, "alg": "dir"}),
            )),
            jwe(protected(json!({"enc": "A256GCM", "alg": "ECDH-ES",
                "clevis": {"pin": "tang", "tang": {"url": "http://127.0.0.1:9", "adv": {"keys": []}}},
                "kid": "x"}))),
            jwe(protected(
                json!({"enc": "A256GCM", "clevis": {"pin": "sss"}}),
            )),
        ];
        for t in cases {
            let e = release(&t, "/nonexistent/tpm").expect_err("refused");
            assert!(
                matches!(e, Error::BadToken(_) | Error::Unavailable(_)),
                "{t}: {e:?}"
            );
        }
    }
}
