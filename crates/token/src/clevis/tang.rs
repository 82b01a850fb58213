//! Tang: a server that helps recover a key without ever learning it (the McCallum-Relyea
//! exchange). Its advertisement (`GET /adv`) is a JWS over a set of keys, signed by its signing
//! keys (`ES512`); its exchange keys (`ECMR`) blind a client's request (`POST /rec/KID`).
//!
//! Binding: ECDH-ES between a fresh key `epk` and the exchange key `S` gives the JWE's secret
//! `Z = epk_d·S = s·epk`. Recovery: the client adds a fresh `E` to `epk` and sends `X = epk + E`;
//! tang answers `Y = s·X`; the client takes off `e·S` and has `Z = Y - e·S`. Tang sees only `X`,
//! which `E` makes random; an eavesdropper sees `X` and `Y` and learns nothing without `e`.

use openssl::bn::BigNum;
use openssl::ecdsa::EcdsaSig;
use openssl::hash::MessageDigest;
use serde_json::Value;

use super::http::Url;
use super::jose::{add, b64, generate, multiply, Curve, EcKey};
use crate::Error;

/// The advertisement of a tang server: its keys, checked against their own signatures.
pub(crate) struct Advertisement {
    /// The signed key set, as clevis stores it in the token (`clevis.tang.adv`).
    pub(crate) keys: Value,
}

impl Advertisement {
    /// `GET URL/adv`, and its signatures checked.
    pub(crate) fn fetch(url: &Url) -> Result<Advertisement, Error> {
        let body = url.request("GET", "adv", None, &[])?;
        let jws: Value = serde_json::from_slice(&body)
            .map_err(|_| Error::Failed("the tang advertisement is not JSON".into()))?;
        Advertisement::verify(&jws)
    }

    /// A JWS (general or flattened JSON form) over a key set: every signing key in the set
    /// (`key_ops` "verify") must have signed it, as clevis checks (`jose jws ver -a`).
    pub(crate) fn verify(jws: &Value) -> Result<Advertisement, Error> {
        let bad = |why: &str| Error::Failed(format!("the tang advertisement {why}"));
        let payload_b64 = jws
            .get("payload")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("has no payload"))?;
        let keys: Value = serde_json::from_slice(&b64(payload_b64, "payload", 256 << 10)?)
            .map_err(|_| bad("payload is not JSON"))?;
        let signatures: Vec<&Value> = match jws.get("signatures").and_then(Value::as_array) {
            Some(list) => list.iter().collect(),
            None => vec![jws],
        };
        let adv = Advertisement { keys };
        let signers = adv.keys_for("verify")?;
        if signers.is_empty() {
            return Err(bad("has no signing key"));
        }
        for key in &signers {
            let signed = signatures
                .iter()
                .any(|s| verify_one(s, payload_b64, key).unwrap_or(false));
            if !signed {
                return Err(bad("is not signed by every signing key in it"));
            }
        }
        Ok(adv)
    }

    /// The keys in the set with `op` among their `key_ops`.
    pub(crate) fn keys_for(&self, op: &str) -> Result<Vec<EcKey>, Error> {
        let list = self
            .keys
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::BadToken("the tang advertisement has no key list".into()))?;
        list.iter()
            .filter(|k| {
                k.get("key_ops")
                    .and_then(Value::as_array)
                    .is_some_and(|ops| ops.iter().any(|o| o.as_str() == Some(op)))
            })
            .map(EcKey::from_jwk)
            .collect()
    }

    /// The exchange key whose thumbprint is `kid`.
    pub(crate) fn exchange_key(&self, kid: &str) -> Result<EcKey, Error> {
        for key in self.keys_for("deriveKey")? {
            if key.thumbprint()? == kid {
                return Ok(key);
            }
        }
        Err(Error::BadToken(format!(
            "its tang advertisement has no exchange key with thumbprint {kid}"
        )))
    }
}

/// Whether one JWS signature (`protected`, `signature`) over `payload` verifies with `key`.
fn verify_one(sig: &Value, payload: &str, key: &EcKey) -> Result<bool, Error> {
    let protected = sig.get("protected").and_then(Value::as_str).unwrap_or("");
    let header: Value = serde_json::from_slice(&b64(protected, "protected", 4096)?)
        .map_err(|_| Error::BadToken("a signature header is not JSON".into()))?;
    let (alg, digest) = match key.curve {
        Curve::P256 => ("ES256", MessageDigest::sha256()),
        Curve::P384 => ("ES384", MessageDigest::sha384()),
        Curve::P521 => ("ES512", MessageDigest::sha512()),
    };
    if header.get("alg").and_then(Value::as_str) != Some(alg) {
        return Ok(false);
    }
    let raw = b64(
        sig.get("signature").and_then(Value::as_str).unwrap_or(""),
        "signature",
        132,
    )?;
    let n = key.curve.len();
    if raw.len() != 2 * n {
        return Ok(false);
    }
    let ssl = |e: openssl::error::ErrorStack| Error::Failed(format!("ECDSA: {e}"));
    let r = BigNum::from_slice(&raw[..n]).map_err(ssl)?;
    let s = BigNum::from_slice(&raw[n..]).map_err(ssl)?;
    let sig = EcdsaSig::from_private_components(r, s).map_err(ssl)?;
    let group = key.curve.group()?;
    let public = openssl::ec::EcKey::from_public_key(&group, &key.point).map_err(ssl)?;
    let hash =
        openssl::hash::hash(digest, format!("{protected}.{payload}").as_bytes()).map_err(ssl)?;
    Ok(sig.verify(&hash, &public).unwrap_or(false))
}

/// Recover the ECDH secret of a JWE bound to the exchange key `server` (thumbprint `kid`) with
/// the ephemeral public key `epk`: one `POST URL/rec/KID`.
pub(crate) fn recover(url: &Url, kid: &str, server: &EcKey, epk: &EcKey) -> Result<EcKey, Error> {
    let curve = epk.curve;
    if server.curve != curve {
        return Err(Error::BadToken(
            "its epk and the exchange key are on different curves".into(),
        ));
    }
    let (e, eph) = generate(curve)?;
    let x = EcKey {
        curve,
        point: add(curve, &epk.point, &eph.point, false)?,
    };
    let request = x.to_jwk(&[("alg", "ECMR")])?.to_string();
    let reply = url.request(
        "POST",
        &format!("rec/{kid}"),
        Some("application/jwk+json"),
        request.as_bytes(),
    )?;
    let reply: Value = serde_json::from_slice(&reply)
        .map_err(|_| Error::Failed("the tang server's reply is not JSON".into()))?;
    let y = EcKey::from_jwk(&reply)
        .map_err(|e| Error::Failed(format!("the tang server's reply: {e}")))?;
    if y.curve != curve {
        return Err(Error::Failed(
            "the tang server answered on another curve".into(),
        ));
    }
    let es = multiply(curve, &server.point, &e)?;
    Ok(EcKey {
        curve,
        point: add(curve, &y.point, &es, true)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An advertisement tang 11 served (`tangd-keygen` keys; one signing key, so the flattened
    /// JWS form), taken with curl: its signature verifies; a changed payload or signature does
    /// not.
    #[test]
    fn a_real_advertisement_verifies_and_a_changed_one_does_not() {
        let text = include_str!("../../tests/data/tang-adv.json");
        let jws: Value = serde_json::from_str(text).unwrap();
        let adv = Advertisement::verify(&jws).unwrap();
        assert_eq!(adv.keys_for("verify").unwrap().len(), 1);
        let kid = adv.keys_for("deriveKey").unwrap()[0].thumbprint().unwrap();
        assert!(adv.exchange_key(&kid).is_ok());
        assert!(adv.exchange_key("nope").is_err());

        let mut forged = jws.clone();
        let sig = forged["signature"].as_str().unwrap().to_string();
        let mut flipped = sig.into_bytes();
        flipped[10] = if flipped[10] == b'A' { b'B' } else { b'A' };
        forged["signature"] = Value::from(String::from_utf8(flipped).unwrap());
        assert!(Advertisement::verify(&forged).is_err());

        let mut forged = jws;
        let payload = forged["payload"].as_str().unwrap();
        forged["payload"] = Value::from(format!("{}A", &payload[..payload.len() - 1]));
        assert!(Advertisement::verify(&forged).is_err());
    }
}
