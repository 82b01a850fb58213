//! The CTAP2 commands a `systemd-fido2` token needs (CTAP 2.1): getInfo, clientPIN (key agreement
//! and a PIN token), makeCredential and getAssertion with the `hmac-secret` extension, and the
//! two PIN/UV protocols that encrypt what crosses the USB cable.

use hmac::{Hmac, Mac};
use openssl::bn::{BigNum, BigNumContext};
use openssl::ec::{EcGroup, EcKey, EcPoint};
use openssl::nid::Nid;
use openssl::symm::{Cipher, Crypter, Mode};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::cbor::Cbor;
use super::hid::CtapHid;
use crate::Error;

const GET_INFO: u8 = 0x04;
const CLIENT_PIN: u8 = 0x06;
const MAKE_CREDENTIAL: u8 = 0x01;
const GET_ASSERTION: u8 = 0x02;
/// CTAP2_ERR_NO_CREDENTIALS: this key does not hold the credential.
const ERR_NO_CREDENTIALS: u8 = 0x2E;
const ERR_PIN_INVALID: u8 = 0x31;
const ERR_PIN_BLOCKED: u8 = 0x32;
const ERR_PIN_AUTH_BLOCKED: u8 = 0x34;
const ERR_PIN_REQUIRED: u8 = 0x36;

fn ssl(e: openssl::error::ErrorStack) -> Error {
    Error::Failed(format!("OpenSSL: {e}"))
}

/// A PIN/UV auth protocol (CTAP 2.1, 6.5.6 and 6.5.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    One,
    Two,
}

/// The keys a PIN/UV protocol derives from an ECDH secret.
pub(crate) struct Shared {
    protocol: Protocol,
    hmac_key: Zeroizing<Vec<u8>>,
    aes_key: Zeroizing<Vec<u8>>,
}

impl Shared {
    /// The keys from the x coordinate `z` of the ECDH secret: SHA-256(z) for both (protocol 1),
    /// or HKDF-SHA-256 with a zero salt and the infos "CTAP2 HMAC key" and "CTAP2 AES key"
    /// (protocol 2).
    pub(crate) fn derive(protocol: Protocol, z: &[u8]) -> Shared {
        match protocol {
            Protocol::One => {
                let k = Zeroizing::new(Sha256::digest(z).to_vec());
                Shared {
                    protocol,
                    hmac_key: k.clone(),
                    aes_key: k,
                }
            }
            Protocol::Two => {
                let prk = hmac(&[0u8; 32], &[z]);
                let expand = |info: &[u8]| Zeroizing::new(hmac(&prk, &[info, &[1]]).to_vec());
                Shared {
                    protocol,
                    hmac_key: expand(b"CTAP2 HMAC key"),
                    aes_key: expand(b"CTAP2 AES key"),
                }
            }
        }
    }

    /// AES-256-CBC without padding: a zero IV (protocol 1), or a random IV sent first (2).
    pub(crate) fn encrypt(&self, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        let mut iv = [0u8; 16];
        if self.protocol == Protocol::Two {
            openssl::rand::rand_bytes(&mut iv).map_err(ssl)?;
        }
        let ct = cbc(Mode::Encrypt, &self.aes_key, &iv, plaintext)?;
        Ok(match self.protocol {
            Protocol::One => ct.to_vec(),
            Protocol::Two => [&iv[..], &ct[..]].concat(),
        })
    }

    pub(crate) fn decrypt(&self, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        let (iv, body) = match self.protocol {
            Protocol::One => ([0u8; 16], ciphertext),
            Protocol::Two if ciphertext.len() >= 16 => {
                let mut iv = [0u8; 16];
                iv.copy_from_slice(&ciphertext[..16]);
                (iv, &ciphertext[16..])
            }
            Protocol::Two => return Err(Error::Failed("a ciphertext without its IV".into())),
        };
        cbc(Mode::Decrypt, &self.aes_key, &iv, body)
    }

    /// HMAC-SHA-256 over `message`: its first 16 bytes (protocol 1), or all 32 (2).
    pub(crate) fn authenticate(&self, key: &[u8], message: &[u8]) -> Vec<u8> {
        let mac = hmac(key, &[message]);
        match self.protocol {
            Protocol::One => mac[..16].to_vec(),
            Protocol::Two => mac.to_vec(),
        }
    }

    fn number(&self) -> i64 {
        match self.protocol {
            Protocol::One => 1,
            Protocol::Two => 2,
        }
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

fn cbc(mode: Mode, key: &[u8], iv: &[u8; 16], data: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
    if !data.len().is_multiple_of(16) {
        return Err(Error::Failed(
            "an AES-CBC message not a whole number of blocks".into(),
        ));
    }
    let mut c = Crypter::new(Cipher::aes_256_cbc(), mode, key, Some(iv)).map_err(ssl)?;
    c.pad(false);
    let mut out = Zeroizing::new(vec![0u8; data.len() + 16]);
    let n = c.update(data, &mut out).map_err(ssl)?;
    let m = c.finalize(&mut out[n..]).map_err(ssl)?;
    out.truncate(n + m);
    Ok(out)
}

/// A P-256 COSE_Key (kty EC2, alg ECDH-ES+HKDF-256) from a public point.
fn cose_key(x: &[u8], y: &[u8]) -> Cbor {
    Cbor::int_map(vec![
        (1, Cbor::Int(2)),
        (3, Cbor::Int(-25)),
        (-1, Cbor::Int(1)),
        (-2, Cbor::Bytes(x.to_vec())),
        (-3, Cbor::Bytes(y.to_vec())),
    ])
}

/// Key agreement with the authenticator's COSE key: our COSE key, and the shared keys.
pub(crate) fn encapsulate(peer: &Cbor, protocol: Protocol) -> Result<(Cbor, Shared), Error> {
    let bad = || Error::Failed("the FIDO2 key's key-agreement key is not a P-256 COSE key".into());
    let coord = |k: i64| {
        peer.at(k)
            .and_then(Cbor::bytes)
            .filter(|b| b.len() == 32)
            .ok_or_else(bad)
    };
    if peer.at(1).and_then(Cbor::int) != Some(2) || peer.at(-1).and_then(Cbor::int) != Some(1) {
        return Err(bad());
    }
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).map_err(ssl)?;
    let (px, py) = (
        BigNum::from_slice(coord(-2)?).map_err(ssl)?,
        BigNum::from_slice(coord(-3)?).map_err(ssl)?,
    );
    let peer_key =
        EcKey::from_public_key_affine_coordinates(&group, &px, &py).map_err(|_| bad())?;
    let ours = EcKey::generate(&group).map_err(ssl)?;
    let mut ctx = BigNumContext::new().map_err(ssl)?;
    let mut z = EcPoint::new(&group).map_err(ssl)?;
    z.mul2(&group, peer_key.public_key(), ours.private_key(), &mut ctx)
        .map_err(ssl)?;
    let (mut zx, mut zy, mut x, mut y) = (
        BigNum::new().map_err(ssl)?,
        BigNum::new().map_err(ssl)?,
        BigNum::new().map_err(ssl)?,
        BigNum::new().map_err(ssl)?,
    );
    z.affine_coordinates(&group, &mut zx, &mut zy, &mut ctx)
        .map_err(ssl)?;
    ours.public_key()
        .affine_coordinates(&group, &mut x, &mut y, &mut ctx)
        .map_err(ssl)?;
    let zx = Zeroizing::new(zx.to_vec_padded(32).map_err(ssl)?);
    let cose = cose_key(
        &x.to_vec_padded(32).map_err(ssl)?,
        &y.to_vec_padded(32).map_err(ssl)?,
    );
    Ok((cose, Shared::derive(protocol, &zx)))
}

/// What getInfo says that matters here.
pub(crate) struct Info {
    pub(crate) hmac_secret: bool,
    /// `Some(true)`: a PIN is set; `Some(false)`: PINs are supported, none is set.
    pub(crate) client_pin: Option<bool>,
    pub(crate) uv: bool,
    pub(crate) protocol: Protocol,
}

/// A security key speaking CTAP2.
pub(crate) struct Authenticator {
    hid: CtapHid,
    name: String,
}

/// A CTAP2 status as a reason.
fn status(name: &str, code: u8) -> Error {
    match code {
        ERR_PIN_INVALID => Error::WrongPin(format!("the FIDO2 key {name} refused the PIN")),
        ERR_PIN_BLOCKED | ERR_PIN_AUTH_BLOCKED => Error::Failed(format!(
            "the FIDO2 key {name} has blocked its PIN (too many wrong ones; unplug it, or reset it)"
        )),
        ERR_PIN_REQUIRED => Error::NeedsPin(format!("the FIDO2 key {name} needs a PIN")),
        ERR_NO_CREDENTIALS => Error::Unavailable(format!(
            "the FIDO2 key {name} does not hold the token's credential"
        )),
        0x27 => Error::Failed(format!("the FIDO2 key {name}: the operation was denied")),
        0x2F => Error::Failed(format!("the FIDO2 key {name}: no touch came in time")),
        _ => Error::Failed(format!(
            "the FIDO2 key {name} answered CTAP2 error 0x{code:02x}"
        )),
    }
}

impl Authenticator {
    pub(crate) fn open(path: &std::path::Path) -> Result<Authenticator, Error> {
        Ok(Authenticator {
            hid: CtapHid::open(path)?,
            name: path.display().to_string(),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn call(&mut self, command: u8, params: Option<Cbor>) -> Result<Cbor, Error> {
        let body = params.map(|p| p.encode()).unwrap_or_default();
        let (code, data) = self.hid.cbor(command, &body)?;
        if code != 0 {
            return Err(status(&self.name, code));
        }
        if data.is_empty() {
            return Ok(Cbor::Map(Vec::new()));
        }
        Cbor::decode(&data)
    }

    pub(crate) fn info(&mut self) -> Result<Info, Error> {
        let info = self.call(GET_INFO, None)?;
        let extensions = match info.at(2) {
            Some(Cbor::Array(list)) => list.clone(),
            _ => Vec::new(),
        };
        let option = |name: &str| match info.at(4).and_then(|o| o.get(&Cbor::Text(name.into()))) {
            Some(Cbor::Bool(b)) => Some(*b),
            _ => None,
        };
        let protocols: Vec<i64> = match info.at(6) {
            Some(Cbor::Array(list)) => list.iter().filter_map(Cbor::int).collect(),
            _ => vec![1],
        };
        Ok(Info {
            hmac_secret: extensions.contains(&Cbor::Text("hmac-secret".into())),
            client_pin: option("clientPin"),
            uv: option("uv") == Some(true),
            protocol: if protocols.contains(&1) {
                Protocol::One
            } else {
                Protocol::Two
            },
        })
    }

    fn key_agreement(&mut self, protocol: Protocol) -> Result<(Cbor, Shared), Error> {
        let p = match protocol {
            Protocol::One => 1,
            Protocol::Two => 2,
        };
        let r = self.call(
            CLIENT_PIN,
            Some(Cbor::int_map(vec![(1, Cbor::Int(p)), (2, Cbor::Int(2))])),
        )?;
        let peer = r.at(1).ok_or_else(|| {
            Error::Failed(format!(
                "the FIDO2 key {} sent no key-agreement key",
                self.name
            ))
        })?;
        encapsulate(peer, protocol)
    }

    /// A PIN token for `pin` (getPinToken): the key that authenticates the next command.
    pub(crate) fn pin_token(
        &mut self,
        protocol: Protocol,
        pin: &[u8],
    ) -> Result<(Shared, Zeroizing<Vec<u8>>), Error> {
        let (platform, shared) = self.key_agreement(protocol)?;
        let pin_hash = Zeroizing::new(Sha256::digest(pin)[..16].to_vec());
        let r = self.call(
            CLIENT_PIN,
            Some(Cbor::int_map(vec![
                (1, Cbor::Int(shared.number())),
                (2, Cbor::Int(5)),
                (3, platform),
                (6, Cbor::Bytes(shared.encrypt(&pin_hash)?)),
            ])),
        )?;
        let encrypted = r.at(2).and_then(Cbor::bytes).ok_or_else(|| {
            Error::Failed(format!("the FIDO2 key {} sent no PIN token", self.name))
        })?;
        let token = shared.decrypt(encrypted)?;
        Ok((shared, token))
    }

    /// makeCredential for `rp` with `hmac-secret`, not resident: the new credential's id.
    pub(crate) fn make_credential(
        &mut self,
        rp: &str,
        user_id: &[u8],
        user_name: &str,
        uv: bool,
        pin: Option<(&Shared, &[u8])>,
    ) -> Result<Vec<u8>, Error> {
        let client_data_hash = [0u8; 32];
        let mut params = vec![
            (1, Cbor::Bytes(client_data_hash.to_vec())),
            (
                2,
                Cbor::text_map(vec![
                    ("id", Cbor::Text(rp.into())),
                    ("name", Cbor::Text("Encrypted Volume".into())),
                ]),
            ),
            (
                3,
                Cbor::text_map(vec![
                    ("id", Cbor::Bytes(user_id.to_vec())),
                    ("name", Cbor::Text(user_name.into())),
                    ("displayName", Cbor::Text(user_name.into())),
                ]),
            ),
            (
                4,
                Cbor::Array(vec![Cbor::text_map(vec![
                    ("alg", Cbor::Int(-7)),
                    ("type", Cbor::Text("public-key".into())),
                ])]),
            ),
            (6, Cbor::text_map(vec![("hmac-secret", Cbor::Bool(true))])),
        ];
        let mut options = vec![("rk", Cbor::Bool(false))];
        if uv {
            options.push(("uv", Cbor::Bool(true)));
        }
        params.push((7, Cbor::text_map(options)));
        if let Some((shared, token)) = pin {
            params.push((
                8,
                Cbor::Bytes(shared.authenticate(token, &client_data_hash)),
            ));
            params.push((9, Cbor::Int(shared.number())));
        }
        let r = self.call(MAKE_CREDENTIAL, Some(Cbor::int_map(params)))?;
        let auth_data = r.at(2).and_then(Cbor::bytes).ok_or_else(|| {
            Error::Failed(format!(
                "the FIDO2 key {} sent no authenticator data",
                self.name
            ))
        })?;
        credential_id(auth_data)
            .ok_or_else(|| Error::Failed(format!("the FIDO2 key {} sent no credential", self.name)))
    }

    /// getAssertion of credential `credential` for `rp` with the hmac-secret of `salt`: the
    /// 32-byte secret the key derives from the credential and the salt.
    #[allow(clippy::too_many_arguments)] // each is one of the token's fields
    pub(crate) fn hmac_secret(
        &mut self,
        protocol: Protocol,
        rp: &str,
        credential: &[u8],
        salt: &[u8],
        up: bool,
        uv: bool,
        pin: Option<(&Shared, &[u8])>,
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        let client_data_hash = [0u8; 32];
        let (platform, shared) = self.key_agreement(protocol)?;
        let salt_enc = shared.encrypt(salt)?;
        let salt_auth = shared.authenticate(&shared.hmac_key, &salt_enc);
        let mut ext = vec![
            (1, platform),
            (2, Cbor::Bytes(salt_enc)),
            (3, Cbor::Bytes(salt_auth)),
        ];
        if protocol == Protocol::Two {
            ext.push((4, Cbor::Int(2)));
        }
        let mut options = vec![("up", Cbor::Bool(up))];
        if uv {
            options.push(("uv", Cbor::Bool(true)));
        }
        let mut params = vec![
            (1, Cbor::Text(rp.into())),
            (2, Cbor::Bytes(client_data_hash.to_vec())),
            (
                3,
                Cbor::Array(vec![Cbor::text_map(vec![
                    ("id", Cbor::Bytes(credential.to_vec())),
                    ("type", Cbor::Text("public-key".into())),
                ])]),
            ),
            (4, Cbor::text_map(vec![("hmac-secret", Cbor::int_map(ext))])),
            (5, Cbor::text_map(options)),
        ];
        if let Some((pin_shared, token)) = pin {
            params.push((
                6,
                Cbor::Bytes(pin_shared.authenticate(token, &client_data_hash)),
            ));
            params.push((7, Cbor::Int(pin_shared.number())));
        }
        let r = self.call(GET_ASSERTION, Some(Cbor::int_map(params)))?;
        let auth_data = r.at(2).and_then(Cbor::bytes).ok_or_else(|| {
            Error::Failed(format!(
                "the FIDO2 key {} sent no authenticator data",
                self.name
            ))
        })?;
        let encrypted = hmac_secret_output(auth_data).ok_or_else(|| {
            Error::Failed(format!(
                "the FIDO2 key {} sent no hmac-secret (does it support the extension?)",
                self.name
            ))
        })?;
        let secret = shared.decrypt(&encrypted)?;
        if secret.len() != 32 {
            return Err(Error::Failed(format!(
                "the FIDO2 key {} sent an hmac-secret of {} bytes",
                self.name,
                secret.len()
            )));
        }
        Ok(secret)
    }
}

/// The credential id in authenticator data with attested credential data (flag AT): rpIdHash
/// (32), flags (1), signCount (4), AAGUID (16), length (2), id.
pub(crate) fn credential_id(auth_data: &[u8]) -> Option<Vec<u8>> {
    if auth_data.get(32)? & 0x40 == 0 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([
        *auth_data.get(53)?,
        *auth_data.get(54)?,
    ]));
    auth_data.get(55..55 + len).map(<[u8]>::to_vec)
}

/// The `hmac-secret` output in authenticator data's extensions (flag ED), after attested
/// credential data if there is any.
pub(crate) fn hmac_secret_output(auth_data: &[u8]) -> Option<Vec<u8>> {
    let flags = *auth_data.get(32)?;
    if flags & 0x80 == 0 {
        return None;
    }
    let mut rest = auth_data.get(37..)?;
    if flags & 0x40 != 0 {
        let len = usize::from(u16::from_be_bytes([*rest.get(16)?, *rest.get(17)?]));
        rest = rest.get(18 + len..)?;
        // The credential's public key, a COSE key, comes before the extensions.
        rest = Cbor::decode_prefix(rest).ok()?.1;
    }
    let ext = Cbor::decode(rest).ok()?;
    ext.get(&Cbor::Text("hmac-secret".into()))?
        .bytes()
        .map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth_data(flags: u8, attested: Option<&[u8]>, ext: Option<Cbor>) -> Vec<u8> {
        let mut d = vec![7u8; 32];
        d.push(flags);
        d.extend([0, 0, 0, 9]);
        if let Some(id) = attested {
            d.extend([1u8; 16]);
            d.extend((id.len() as u16).to_be_bytes());
            d.extend(id);
            d.extend(cose_key(&[2; 32], &[3; 32]).encode());
        }
        if let Some(e) = ext {
            d.extend(e.encode());
        }
        d
    }

    #[test]
    fn authenticator_data_yields_its_credential_and_hmac_secret() {
        let ext = Cbor::text_map(vec![("hmac-secret", Cbor::Bytes(vec![5; 48]))]);
        let with_both = auth_data(0xC1, Some(&[9; 70]), Some(ext.clone()));
        assert_eq!(credential_id(&with_both), Some(vec![9; 70]));
        assert_eq!(hmac_secret_output(&with_both), Some(vec![5; 48]));
        let assertion = auth_data(0x81, None, Some(ext));
        assert_eq!(credential_id(&assertion), None);
        assert_eq!(hmac_secret_output(&assertion), Some(vec![5; 48]));
        assert_eq!(hmac_secret_output(&auth_data(0x01, None, None)), None);
        assert_eq!(hmac_secret_output(&with_both[..60]), None, "cut short");
        assert_eq!(credential_id(&with_both[..60]), None, "cut short");
    }

    #[test]
    fn protocol_two_prefixes_a_random_iv_and_both_round_trip() {
        for p in [Protocol::One, Protocol::Two] {
            let s = Shared::derive(p, &[4; 32]);
            let ct = s.encrypt(&[6; 32]).unwrap();
            assert_eq!(ct.len(), if p == Protocol::One { 32 } else { 48 });
            assert_eq!(&s.decrypt(&ct).unwrap()[..], &[6; 32]);
            assert_eq!(
                s.authenticate(&s.hmac_key, b"m").len(),
                if p == Protocol::One { 16 } else { 32 }
            );
            assert!(s.decrypt(&[0; 15]).is_err());
        }
    }

    /// Against python-fido2 (Yubico's CTAP2 client, an independent implementation), on random
    /// inputs, for both PIN/UV protocols: the keys derived from an ECDH secret, AES-CBC both
    /// ways (each decrypts what the other encrypted) and the authentication tag.
    #[test]
    fn pin_protocols_match_python_fido2() {
        let mut lines = String::new();
        let mut cases = Vec::new();
        for i in 0..40u8 {
            let protocol = if i % 2 == 0 {
                Protocol::One
            } else {
                Protocol::Two
            };
            let mut z = [0u8; 32];
            let mut pt = [0u8; 32];
            let mut msg = vec![0u8; usize::from(i) * 3 + 1];
            openssl::rand::rand_bytes(&mut z).unwrap();
            openssl::rand::rand_bytes(&mut pt).unwrap();
            openssl::rand::rand_bytes(&mut msg).unwrap();
            let s = Shared::derive(protocol, &z);
            let ct = s.encrypt(&pt).unwrap();
            let tag = s.authenticate(&s.hmac_key, &msg);
            lines += &format!(
                "{} {} {} {} {}\n",
                s.number(),
                hex::encode(z),
                hex::encode(pt),
                hex::encode(&ct),
                hex::encode(&msg)
            );
            cases.push((s, pt, tag));
        }
        let script = r#"
import sys
from fido2.ctap2.pin import PinProtocolV1, PinProtocolV2
for line in sys.stdin:
    p, z, pt, ct, msg = line.split()
    proto = PinProtocolV1() if p == "1" else PinProtocolV2()
    key = proto.kdf(bytes.fromhex(z))
    assert proto.decrypt(key, bytes.fromhex(ct)) == bytes.fromhex(pt), "our ciphertext"
    theirs = proto.encrypt(key, bytes.fromhex(pt))
    print(key.hex(), theirs.hex(), proto.authenticate(key, bytes.fromhex(msg)).hex())
"#;
        let text = super::super::python_fido2(script, &lines);
        assert_eq!(text.lines().count(), cases.len());
        for (line, (s, pt, tag)) in text.lines().zip(&cases) {
            let f: Vec<&str> = line.split(' ').collect();
            let keys = hex::decode(f[0]).unwrap();
            let ours: Vec<u8> = match s.protocol {
                Protocol::One => s.aes_key.to_vec(),
                Protocol::Two => [&s.hmac_key[..], &s.aes_key[..]].concat(),
            };
            assert_eq!(keys, ours, "derived keys");
            assert_eq!(
                &s.decrypt(&hex::decode(f[1]).unwrap()).unwrap()[..],
                &pt[..]
            );
            assert_eq!(hex::encode(tag), f[2], "authentication tag");
        }
    }
}
