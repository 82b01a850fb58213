//! The JOSE pieces clevis' tang pin uses, and only those: EC public keys as JWKs on P-256,
//! P-384 and P-521, their RFC 7638 thumbprints, the Concat KDF of ECDH-ES (RFC 7518 4.6), and
//! A256GCM content encryption of a flattened JWE. The elliptic-curve arithmetic and AES-GCM are
//! OpenSSL's.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use openssl::bn::{BigNum, BigNumContext};
use openssl::ec::{EcGroup, EcPoint, PointConversionForm};
use openssl::nid::Nid;
use openssl::symm::{Cipher, Crypter, Mode};
use sectorcrypt_secret::SecretBytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::Error;

/// The content encryption clevis uses.
pub(crate) const ENC: &str = "A256GCM";
/// A256GCM's IV and tag lengths.
const IV_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// The longest plaintext (a passphrase) taken from a JWE.
pub(crate) const MAX_PLAINTEXT: usize = 8192;

fn bad(why: impl Into<String>) -> Error {
    Error::BadToken(why.into())
}

fn ssl(what: &str) -> impl Fn(openssl::error::ErrorStack) -> Error + '_ {
    move |e| Error::Failed(format!("{what}: {e}"))
}

/// base64url without padding, decoded, at most `limit` bytes.
pub(crate) fn b64(text: &str, what: &str, limit: usize) -> Result<Vec<u8>, Error> {
    if text.len() > limit.div_ceil(3) * 4 {
        return Err(bad(format!("{what} is longer than {limit} bytes")));
    }
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| bad(format!("{what} is not base64url")))
}

pub(crate) fn b64_encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A named curve of JWK's `crv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Curve {
    P256,
    P384,
    P521,
}

impl Curve {
    fn parse(name: &str) -> Result<Curve, Error> {
        match name {
            "P-256" => Ok(Curve::P256),
            "P-384" => Ok(Curve::P384),
            "P-521" => Ok(Curve::P521),
            other => Err(bad(format!("unknown curve {other:?}"))),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Curve::P256 => "P-256",
            Curve::P384 => "P-384",
            Curve::P521 => "P-521",
        }
    }

    /// Bytes of a coordinate.
    pub(crate) fn len(self) -> usize {
        match self {
            Curve::P256 => 32,
            Curve::P384 => 48,
            Curve::P521 => 66,
        }
    }

    pub(crate) fn group(self) -> Result<EcGroup, Error> {
        let nid = match self {
            Curve::P256 => Nid::X9_62_PRIME256V1,
            Curve::P384 => Nid::SECP384R1,
            Curve::P521 => Nid::SECP521R1,
        };
        EcGroup::from_curve_name(nid).map_err(ssl("the curve"))
    }
}

/// An EC public key (a JWK with `kty` "EC"), on its curve.
pub(crate) struct EcKey {
    pub(crate) curve: Curve,
    pub(crate) point: EcPoint,
}

impl EcKey {
    /// Read a JWK: `kty` "EC", a known `crv`, and `x`, `y` of the curve's length naming a point
    /// on the curve.
    pub(crate) fn from_jwk(jwk: &Value) -> Result<EcKey, Error> {
        if jwk.get("kty").and_then(Value::as_str) != Some("EC") {
            return Err(bad("a key is not an EC JWK"));
        }
        let curve = Curve::parse(jwk.get("crv").and_then(Value::as_str).unwrap_or(""))?;
        let coord = |name: &str| -> Result<Vec<u8>, Error> {
            let text = jwk
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("an EC JWK has no \"{name}\"")))?;
            let v = b64(text, name, curve.len())?;
            if v.len() != curve.len() {
                return Err(bad(format!(
                    "an EC JWK's \"{name}\" is not {} bytes",
                    curve.len()
                )));
            }
            Ok(v)
        };
        let mut encoded = vec![4u8];
        encoded.extend(coord("x")?);
        encoded.extend(coord("y")?);
        let group = curve.group()?;
        let mut ctx = BigNumContext::new().map_err(ssl("a context"))?;
        let point = EcPoint::from_bytes(&group, &encoded, &mut ctx)
            .map_err(|_| bad("an EC JWK's point is not on its curve"))?;
        Ok(EcKey { curve, point })
    }

    /// The point's x and y, each the curve's length.
    fn coordinates(&self) -> Result<(Vec<u8>, Vec<u8>), Error> {
        let group = self.curve.group()?;
        let mut ctx = BigNumContext::new().map_err(ssl("a context"))?;
        let bytes = self
            .point
            .to_bytes(&group, PointConversionForm::UNCOMPRESSED, &mut ctx)
            .map_err(ssl("a point"))?;
        let n = self.curve.len();
        if bytes.len() != 1 + 2 * n {
            return Err(Error::Failed("a point at infinity".into()));
        }
        Ok((bytes[1..1 + n].to_vec(), bytes[1 + n..].to_vec()))
    }

    /// The public JWK, with `extra` members (such as `alg`).
    pub(crate) fn to_jwk(&self, extra: &[(&str, &str)]) -> Result<Value, Error> {
        let (x, y) = self.coordinates()?;
        let mut v = json!({"crv": self.curve.name(), "kty": "EC", "x": b64_encode(&x), "y": b64_encode(&y)});
        for (k, val) in extra {
            v[*k] = Value::from(*val);
        }
        Ok(v)
    }

    /// The RFC 7638 thumbprint: SHA-256 of the required members in order, base64url.
    pub(crate) fn thumbprint(&self) -> Result<String, Error> {
        let (x, y) = self.coordinates()?;
        let text = format!(
            r#"{{"crv":"{}","kty":"EC","x":"{}","y":"{}"}}"#,
            self.curve.name(),
            b64_encode(&x),
            b64_encode(&y)
        );
        Ok(b64_encode(&Sha256::digest(text.as_bytes())))
    }

    /// The x coordinate of the point: ECDH's shared secret `Z`.
    pub(crate) fn shared_secret(&self) -> Result<Zeroizing<Vec<u8>>, Error> {
        Ok(Zeroizing::new(self.coordinates()?.0))
    }
}

/// `a + b`, or `a - b` with `subtract`.
pub(crate) fn add(
    curve: Curve,
    a: &EcPoint,
    b: &EcPoint,
    subtract: bool,
) -> Result<EcPoint, Error> {
    let group = curve.group()?;
    let mut ctx = BigNumContext::new().map_err(ssl("a context"))?;
    let mut b = openssl::ec::EcPointRef::to_owned(b, &group).map_err(ssl("a point"))?;
    if subtract {
        b.invert2(&group, &mut ctx).map_err(ssl("a point"))?;
    }
    let mut sum = EcPoint::new(&group).map_err(ssl("a point"))?;
    sum.add(&group, a, &b, &mut ctx)
        .map_err(ssl("a point sum"))?;
    Ok(sum)
}

/// `k · p`.
pub(crate) fn multiply(curve: Curve, p: &EcPoint, k: &BigNum) -> Result<EcPoint, Error> {
    let group = curve.group()?;
    let mut ctx = BigNumContext::new().map_err(ssl("a context"))?;
    let mut out = EcPoint::new(&group).map_err(ssl("a point"))?;
    out.mul2(&group, p, k, &mut ctx)
        .map_err(ssl("a point product"))?;
    Ok(out)
}

/// A new key pair on `curve`: the private scalar and the public key.
pub(crate) fn generate(curve: Curve) -> Result<(BigNum, EcKey), Error> {
    let group = curve.group()?;
    let key = openssl::ec::EcKey::generate(&group).map_err(ssl("a key pair"))?;
    let d = key.private_key().to_owned().map_err(ssl("a key pair"))?;
    let point = key
        .public_key()
        .to_owned(&group)
        .map_err(ssl("a key pair"))?;
    Ok((d, EcKey { curve, point }))
}

/// The Concat KDF of ECDH-ES in direct key agreement (RFC 7518 4.6.2): a 256-bit A256GCM key
/// from the shared secret `z`, with `apu` and `apv` (empty when the header has none).
pub(crate) fn concat_kdf(z: &[u8], apu: &[u8], apv: &[u8]) -> Zeroizing<[u8; 32]> {
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(&concat_kdf_round(z, ENC, 256, apu, apv));
    out
}

/// The Concat KDF's first (and for keys up to 256 bits only) round: SHA-256 of the counter, `z`
/// and OtherInfo (the algorithm, `apu`, `apv`, the key length in bits).
fn concat_kdf_round(z: &[u8], alg: &str, bits: u32, apu: &[u8], apv: &[u8]) -> Zeroizing<Vec<u8>> {
    let field = |b: &[u8]| [&(b.len() as u32).to_be_bytes()[..], b].concat();
    let mut h = Sha256::new();
    h.update(1u32.to_be_bytes());
    h.update(z);
    h.update(field(alg.as_bytes()));
    h.update(field(apu));
    h.update(field(apv));
    h.update(bits.to_be_bytes());
    Zeroizing::new(h.finalize().to_vec())
}

/// A flattened JWE as clevis stores it in a LUKS2 token: base64url fields.
pub(crate) struct Jwe {
    /// The protected header as sent (its base64url text is the AEAD's additional data).
    pub(crate) protected_b64: String,
    pub(crate) header: Value,
    iv: Vec<u8>,
    ciphertext: Vec<u8>,
    tag: Vec<u8>,
}

impl Jwe {
    /// Read the flattened JSON form (`protected`, `iv`, `ciphertext`, `tag`; `encrypted_key`
    /// empty, as direct key agreement has none).
    pub(crate) fn parse(jwe: &Value) -> Result<Jwe, Error> {
        let field = |name: &str| -> Result<&str, Error> {
            jwe.get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("its JWE has no string \"{name}\"")))
        };
        if jwe
            .get("encrypted_key")
            .and_then(Value::as_str)
            .is_some_and(|k| !k.is_empty())
        {
            return Err(bad(
                "its JWE has an encrypted key (clevis' tang pin has none)",
            ));
        }
        let protected_b64 = field("protected")?.to_string();
        let header: Value = serde_json::from_slice(&b64(&protected_b64, "protected", 64 << 10)?)
            .map_err(|_| bad("its JWE's protected header is not JSON"))?;
        if !header.is_object() {
            return Err(bad("its JWE's protected header is not an object"));
        }
        let iv = b64(field("iv")?, "iv", IV_LEN)?;
        let tag = b64(field("tag")?, "tag", TAG_LEN)?;
        if iv.len() != IV_LEN || tag.len() != TAG_LEN {
            return Err(bad("its JWE's iv or tag has the wrong length for A256GCM"));
        }
        let ciphertext = b64(field("ciphertext")?, "ciphertext", MAX_PLAINTEXT)?;
        if header.get("enc").and_then(Value::as_str) != Some(ENC) {
            return Err(bad(format!("its JWE is not encrypted with {ENC}")));
        }
        Ok(Jwe {
            protected_b64,
            header,
            iv,
            ciphertext,
            tag,
        })
    }

    /// The plaintext, under the content key `cek`, into secret memory.
    pub(crate) fn decrypt(&self, cek: &[u8; 32]) -> Result<SecretBytes, Error> {
        let refused = || Error::Rejected("the JWE does not decrypt with the key recovered".into());
        let mut c = Crypter::new(Cipher::aes_256_gcm(), Mode::Decrypt, cek, Some(&self.iv))
            .map_err(ssl("AES-GCM"))?;
        c.aad_update(self.protected_b64.as_bytes())
            .map_err(ssl("AES-GCM"))?;
        let mut out = SecretBytes::zeroed(self.ciphertext.len() + 16);
        let n = c
            .update(&self.ciphertext, &mut out)
            .map_err(|_| refused())?;
        c.set_tag(&self.tag).map_err(ssl("AES-GCM"))?;
        let m = c.finalize(&mut out[n..]).map_err(|_| refused())?;
        out.truncate(n + m);
        Ok(out)
    }

    /// Encrypt `plaintext` under `cek` with the protected `header`: the flattened JSON form.
    pub(crate) fn encrypt(
        header: &Value,
        cek: &[u8; 32],
        plaintext: &[u8],
    ) -> Result<Value, Error> {
        let protected_b64 = b64_encode(header.to_string().as_bytes());
        let mut iv = [0u8; IV_LEN];
        openssl::rand::rand_bytes(&mut iv).map_err(ssl("random bytes"))?;
        let mut c = Crypter::new(Cipher::aes_256_gcm(), Mode::Encrypt, cek, Some(&iv))
            .map_err(ssl("AES-GCM"))?;
        c.aad_update(protected_b64.as_bytes())
            .map_err(ssl("AES-GCM"))?;
        let mut ct = vec![0u8; plaintext.len() + 16];
        let n = c.update(plaintext, &mut ct).map_err(ssl("AES-GCM"))?;
        let m = c.finalize(&mut ct[n..]).map_err(ssl("AES-GCM"))?;
        ct.truncate(n + m);
        let mut tag = [0u8; TAG_LEN];
        c.get_tag(&mut tag).map_err(ssl("AES-GCM"))?;
        Ok(json!({
            "ciphertext": b64_encode(&ct),
            "encrypted_key": "",
            "iv": b64_encode(&iv),
            "protected": protected_b64,
            "tag": b64_encode(&tag),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7518 Appendix C: ECDH-ES key agreement for A128GCM, apu "Alice", apv "Bob": the
    /// derived key is the first 16 bytes of the round.
    #[test]
    fn the_concat_kdf_gives_rfc_7518_appendix_c() {
        let z: [u8; 32] = [
            158, 86, 217, 29, 129, 113, 53, 211, 114, 131, 66, 131, 191, 132, 38, 156, 251, 49,
            110, 163, 218, 128, 106, 72, 246, 218, 167, 121, 140, 254, 144, 196,
        ];
        let round = concat_kdf_round(&z, "A128GCM", 128, b"Alice", b"Bob");
        assert_eq!(b64_encode(&round[..16]), "VqqN6vgjbSBcIijNcacQGg");
        assert_eq!(
            &concat_kdf(&z, b"Alice", b"Bob")[..],
            &concat_kdf_round(&z, "A256GCM", 256, b"Alice", b"Bob")[..]
        );
    }

    /// RFC 7638 section 3.1's example is an RSA key; for EC the same rule (required members,
    /// lexicographic, no spaces) is checked against a thumbprint computed by `jose jwk thp`
    /// for the key below (P-521, from a tang advertisement).
    #[test]
    fn thumbprints_follow_rfc_7638() {
        let jwk = json!({
            "alg": "ECMR", "crv": "P-521", "key_ops": ["deriveKey"], "kty": "EC",
            "x": "Ae0c2BrzL7q6AH-l5loqSZk4D1G8uiCBW6oD3CsrZ1J9tuxz0p_DJ79WfiHVVOawRBppFlJY0xf8rteuQl93bWAj",
            "y": "AVIiQDSUOARpA6xpC-ANzKTjJHw34NCv7JVEdHYK3TVpvKpOUYwXiRx-HwI0Yh6Mq6fXU290HdK1Yvj4pgkrxVYt"
        });
        let key = EcKey::from_jwk(&jwk).unwrap();
        assert_eq!(
            key.thumbprint().unwrap(),
            "zDhydpJNergZ5KtVfv5cBZ2hezRYyfcq2Zbgt_B6p7Q"
        );
        assert_eq!(key.to_jwk(&[]).unwrap()["x"], jwk["x"]);
    }

    #[test]
    fn bad_keys_are_refused() {
        let good = "Ae0c2BrzL7q6AH-l5loqSZk4D1G8uiCBW6oD3CsrZ1J9tuxz0p_DJ79WfiHVVOawRBppFlJY0xf8rteuQl93bWAj";
        for jwk in [
            json!({"kty": "RSA"}),
            json!({"kty": "EC", "crv": "P-999", "x": good, "y": good}),
            json!({"kty": "EC", "crv": "P-521", "x": good}),
            json!({"kty": "EC", "crv": "P-521", "x": good, "y": good}),
            json!({"kty": "EC", "crv": "P-256", "x": good, "y": good}),
            json!({"kty": "EC", "crv": "P-521", "x": "!!", "y": good}),
        ] {
            assert!(EcKey::from_jwk(&jwk).is_err(), "{jwk}");
        }
    }

    /// ECMR's algebra as tang and clevis use it: (Y - e·S) = s·epk, the ECDH secret that
    /// encryption computed as epk_d·S; and a JWE made with it decrypts, a flipped tag does not.
    #[test]
    fn the_mcallum_relyea_exchange_recovers_the_ecdh_secret() {
        let curve = Curve::P521;
        let (s, server) = generate(curve).unwrap();
        let (epk_d, epk) = generate(curve).unwrap();
        let z_enc = EcKey {
            curve,
            point: multiply(curve, &server.point, &epk_d).unwrap(),
        };
        let (e, eph) = generate(curve).unwrap();
        let x = add(curve, &epk.point, &eph.point, false).unwrap();
        let y = multiply(curve, &x, &s).unwrap();
        let es = multiply(curve, &server.point, &e).unwrap();
        let z_rec = EcKey {
            curve,
            point: add(curve, &y, &es, true).unwrap(),
        };
        assert_eq!(
            z_enc.shared_secret().unwrap(),
            z_rec.shared_secret().unwrap()
        );

        let cek = concat_kdf(&z_enc.shared_secret().unwrap(), b"", b"");
        let header = json!({"alg": "ECDH-ES", "enc": ENC});
        let mut jwe = Jwe::encrypt(&header, &cek, b"the passphrase").unwrap();
        let parsed = Jwe::parse(&jwe).unwrap();
        assert_eq!(&parsed.decrypt(&cek).unwrap()[..], b"the passphrase");
        jwe["tag"] = Value::from(b64_encode(&[0u8; 16]));
        assert!(Jwe::parse(&jwe).unwrap().decrypt(&cek).is_err());
    }
}
