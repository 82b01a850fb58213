//! `systemd-tpm2` tokens: 32 random bytes sealed by a TPM 2.0 under a policy (PCR values, and a
//! PIN as PolicyAuthValue), as systemd 252 writes them; the keyslot's passphrase is the bytes in
//! base64. The token object:
//!
//! ```json
//! {"type": "systemd-tpm2", "keyslots": ["1"], "tpm2-blob": "<TPM2B_PRIVATE || TPM2B_PUBLIC>",
//!  "tpm2-pcrs": [7], "tpm2-pcr-bank": "sha256", "tpm2-primary-alg": "ecc",
//!  "tpm2-policy-hash": "<hex>", "tpm2-pin": false}
//! ```
//!
//! Unsealing: the primary key is recreated from the owner seed with systemd's template (the same
//! template gives the same key), the blob loaded under it, a policy session started, PolicyPCR
//! (and PolicyAuthValue) run, the session's digest compared with the stored one (a mismatch means
//! the PCRs changed), and the object unsealed. The session is unsalted and carries no parameter
//! encryption (systemd's carries both): the unsealed bytes cross the TPM's bus in the clear.
//! A signed PCR policy (`tpm2_pubkey`, `tpm2_pubkey_pcrs`: systemd-cryptenroll
//! `--tpm2-public-key`) is satisfied with the signature systemd-measure wrote (PolicyPCR, the
//! TPM's check of the signature of its digest, PolicyAuthorize). systemd 254's salted PINs are
//! reported as not used.

pub(crate) mod device;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rand::RngCore;
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::{Pbkdf, PbkdfKind};
use sectorcrypt_secret::SecretBytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use self::device::{
    bank, pcr_selection, PrimaryAlg, Reader, Tpm, CC_POLICY_AUTH_VALUE, CC_POLICY_PCR,
    TPM_ALG_SHA256,
};
use crate::{base64_field, base64_passphrase, Enrolment, Error, Pins};

/// The token type.
pub const TYPE: &str = "systemd-tpm2";

/// The TPM used when none is named: the kernel's resource manager.
pub const DEFAULT_DEVICE: &str = "/dev/tpmrm0";

/// systemd's persistent SRK handle (systemd 253 and later seal under it).
const SRK_HANDLE: u32 = 0x8100_0001;

/// A `systemd-tpm2` token, checked.
pub(crate) struct Sealed {
    private: Vec<u8>,
    public: Vec<u8>,
    pcrs: Vec<u32>,
    bank: u16,
    /// A signed PCR policy: the signer's public key (PEM) and the PCRs it signs for.
    pubkey: Option<(Vec<u8>, Vec<u32>)>,
    primary: Option<PrimaryAlg>,
    policy_hash: Option<Vec<u8>>,
    pin: bool,
}

impl Sealed {
    pub(crate) fn parse(token: &Value) -> Result<Sealed, Error> {
        let bad = |why: String| Error::BadToken(why);
        if token.get("tpm2_salt").is_some_and(|v| !v.is_null()) {
            return Err(Error::Unavailable(
                "its PIN is salted (tpm2_salt, systemd 254 and later): not used by sectorcrypt"
                    .into(),
            ));
        }
        let pubkey = match token.get("tpm2_pubkey") {
            None | Some(Value::Null) => None,
            Some(_) => {
                let pem = base64_field(token, "tpm2_pubkey", 8192)?;
                let pcrs = pcr_list(token, "tpm2_pubkey_pcrs")?;
                Some((pem, pcrs))
            }
        };
        let blob = base64_field(token, "tpm2-blob", 4096)?;
        let mut rd = Reader::new(&blob);
        let private = rd
            .tpm2b_raw()
            .map_err(|_| bad("its tpm2-blob is cut short".into()))?;
        let public = rd
            .tpm2b_raw()
            .map_err(|_| bad("its tpm2-blob is cut short".into()))?;
        if !rd.is_empty() || public.len() < 6 {
            return Err(bad(
                "its tpm2-blob is not a private and a public part".into()
            ));
        }
        let pcrs = pcr_list(token, "tpm2-pcrs")?;
        let bank = match token.get("tpm2-pcr-bank").and_then(Value::as_str) {
            None => TPM_ALG_SHA256,
            Some(name) => {
                bank(name).ok_or_else(|| bad(format!("unknown tpm2-pcr-bank {name:?}")))?
            }
        };
        let primary = match token.get("tpm2-primary-alg").and_then(Value::as_str) {
            None => None,
            Some(a) => Some(
                PrimaryAlg::parse(a)
                    .ok_or_else(|| bad(format!("unknown tpm2-primary-alg {a:?}")))?,
            ),
        };
        let policy_hash = match token.get("tpm2-policy-hash").and_then(Value::as_str) {
            None => None,
            Some(h) => {
                Some(hex_decode(h).ok_or_else(|| bad("its tpm2-policy-hash is not hex".into()))?)
            }
        };
        let pin = match token.get("tpm2-pin") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| bad("its tpm2-pin is not a boolean".into()))?,
        };
        Ok(Sealed {
            private,
            public,
            pcrs,
            bank,
            pubkey,
            primary,
            policy_hash,
            pin,
        })
    }

    /// The loaded object's name: its name algorithm and the hash of its public area.
    fn name(&self) -> Result<Vec<u8>, Error> {
        let area = &self.public[2..];
        if area[2..4] != device::TPM_ALG_SHA256.to_be_bytes() {
            return Err(Error::BadToken(
                "its sealed object is not named with SHA-256".into(),
            ));
        }
        Ok([&area[2..4], &Sha256::digest(area)[..]].concat())
    }
}

/// Where systemd looks for the signature of a signed PCR policy.
pub const DEFAULT_SIGNATURE: &str = "/run/systemd/tpm2-pcr-signature.json";

/// A list of PCR numbers (0 to 23) in field `name`.
fn pcr_list(token: &Value, name: &str) -> Result<Vec<u32>, Error> {
    token
        .get(name)
        .and_then(Value::as_array)
        .ok_or_else(|| Error::BadToken(format!("it has no \"{name}\" list")))?
        .iter()
        .map(|v| v.as_u64().filter(|&p| p < 24).map(|p| p as u32))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| Error::BadToken(format!("its {name} are not PCR numbers 0 to 23")))
}

/// The signature of `policy` for `pcrs` in `bank` by the key whose SubjectPublicKeyInfo hashes
/// to `fingerprint`, in the JSON systemd-measure writes: `{"sha256": [{"pcrs": [11], "pkfp":
/// HEX, "pol": HEX, "sig": BASE64}, ...]}`.
fn find_signature(
    json: &Value,
    bank: &str,
    pcrs: &[u32],
    fingerprint: &[u8],
    policy: &[u8],
) -> Result<Vec<u8>, Error> {
    let entries = json.get(bank).and_then(Value::as_array).ok_or_else(|| {
        Error::Unavailable(format!("the PCR signature has nothing for the {bank} bank"))
    })?;
    let mut want = pcrs.to_vec();
    want.sort_unstable();
    for e in entries {
        let mut got: Vec<u32> = e
            .get("pcrs")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(|p| p.as_u64().map(|p| p as u32))
                    .collect()
            })
            .unwrap_or_default();
        got.sort_unstable();
        let hex_is = |k: &str, v: &[u8]| {
            e.get(k)
                .and_then(Value::as_str)
                .and_then(hex_decode)
                .as_deref()
                == Some(v)
        };
        if got == want && hex_is("pkfp", fingerprint) && hex_is("pol", policy) {
            return base64_field(e, "sig", 1024);
        }
    }
    Err(Error::Rejected(format!(
        "no signature in the PCR signature file is for PCRs {pcrs:?} as they are now (the \
         signed policy does not cover this boot)"
    )))
}

/// Run the signed part of a policy: PolicyPCR over `pcrs`, the TPM's check of the signature
/// (by `pem`'s key, from the signature file) of the digest that gives, and PolicyAuthorize
/// with the TPM's ticket for it.
fn authorize_signed(
    tpm: &mut Tpm,
    session: u32,
    (bank_alg, bank_name): (u16, &str),
    pem: &[u8],
    pcrs: &[u32],
    signature: &std::path::Path,
) -> Result<(), Error> {
    let key = openssl::pkey::PKey::public_key_from_pem(pem)
        .map_err(|e| Error::BadToken(format!("its tpm2_pubkey is not a PEM public key: {e}")))?;
    let rsa = key
        .rsa()
        .map_err(|_| Error::Unavailable("its tpm2_pubkey is not RSA".into()))?;
    let e = rsa
        .e()
        .to_vec()
        .iter()
        .try_fold(0u32, |a, &b| a.checked_mul(256).map(|a| a | u32::from(b)))
        .ok_or_else(|| Error::Unavailable("its RSA exponent does not fit a TPM".into()))?;
    let spki = key
        .public_key_to_der()
        .map_err(|e| Error::Failed(e.to_string()))?;
    let fingerprint = Sha256::digest(spki);
    let text = std::fs::read(signature).map_err(|e| {
        Error::Unavailable(format!(
            "its PCR policy is signed, and there is no signature at {} ({e}; --tpm2-signature \
             FILE)",
            signature.display()
        ))
    })?;
    let json: Value = serde_json::from_slice(&text)
        .map_err(|_| Error::Unavailable(format!("{} is not JSON", signature.display())))?;
    let (handle, name) = tpm.load_external_rsa(&rsa.n().to_vec(), e)?;
    tpm.policy_pcr(session, bank_alg, pcrs)?;
    let approved = tpm.policy_get_digest(session)?;
    let sig = find_signature(&json, bank_name, pcrs, &fingerprint, &approved)?;
    let ticket = tpm.verify_signature(handle, &Sha256::digest(&approved), &sig)?;
    tpm.policy_authorize(session, &approved, &name, &ticket)?;
    Ok(())
}

/// The passphrase a `systemd-tpm2` token releases, from the TPM `device`; a signed PCR
/// policy's signature is read from `signature`.
pub(crate) fn release(
    token: &Value,
    device: &str,
    signature: &std::path::Path,
    pins: &mut dyn Pins,
) -> Result<SecretBytes, Error> {
    let sealed = Sealed::parse(token)?;
    let srk = token.get("tpm2_srk").is_some();
    let auth = if sealed.pin {
        let pin = pins
            .pin("Please enter TPM2 PIN: ")
            .ok_or_else(|| Error::NeedsPin("the TPM2 token needs a PIN".into()))?;
        Some(hash_pin(&pin))
    } else {
        None
    };
    let mut tpm = Tpm::open(device)?;
    let primary = tpm.create_primary(sealed.primary.unwrap_or(PrimaryAlg::Ecc))?;
    let parent = if srk { SRK_HANDLE } else { primary.handle };
    let item = tpm.load(parent, &sealed.private, &sealed.public)?;
    // The session is salted by the primary key (ECC): its key stays between this process and
    // the TPM, and the secret crosses the bus encrypted.
    let session = tpm.start_policy_session(Some(&primary))?;
    if let Some((pem, pk_pcrs)) = &sealed.pubkey {
        if !pk_pcrs.is_empty() {
            let bank_name = token
                .get("tpm2-pcr-bank")
                .and_then(Value::as_str)
                .unwrap_or("sha256");
            let bank = (sealed.bank, bank_name);
            authorize_signed(&mut tpm, session.handle, bank, pem, pk_pcrs, signature)?;
        }
    }
    if !sealed.pcrs.is_empty() {
        tpm.policy_pcr(session.handle, sealed.bank, &sealed.pcrs)?;
    }
    if auth.is_some() {
        tpm.policy_auth_value(session.handle)?;
    }
    if let Some(expected) = &sealed.policy_hash {
        if tpm.policy_get_digest(session.handle)? != *expected {
            return Err(Error::Rejected(format!(
                "the TPM's policy does not match the sealed one: PCRs {:?} changed since \
                 enrolment (or the token belongs to another TPM)",
                sealed.pcrs
            )));
        }
    }
    let secret = tpm.unseal(
        item,
        &sealed.name()?,
        &session,
        auth.as_deref().map_or(&[][..], |a| &a[..]),
    )?;
    Ok(base64_passphrase(&secret))
}

/// The data a clevis `tpm2` pin sealed (a JWK), unsealed: `public` and `private` are the object
/// as tpm2-tools wrote it, under the primary key tpm2-tools makes for `key` ("ecc" or "rsa"),
/// with PolicyPCR over `pcrs` of `bank` when it has a policy (else its empty password).
pub(crate) fn unseal_clevis(
    device: &str,
    key: &str,
    public: &[u8],
    private: &[u8],
    bank_name: Option<&str>,
    pcrs: &[u32],
) -> Result<Zeroizing<Vec<u8>>, Error> {
    let alg = PrimaryAlg::parse(key)
        .ok_or_else(|| Error::Unavailable(format!("clevis tpm2 key type {key:?} (ecc or rsa)")))?;
    // Part of the public area: type, nameAlg, objectAttributes (userWithAuth is 0x40).
    let attributes = public
        .get(6..10)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| Error::BadToken("its jwk_pub is cut short".into()))?;
    let sealed = Sealed {
        private: private.to_vec(),
        public: public.to_vec(),
        pcrs: pcrs.to_vec(),
        bank: bank(bank_name.unwrap_or("sha1"))
            .ok_or_else(|| Error::BadToken("its pcr_bank is unknown".into()))?,
        pubkey: None,
        primary: Some(alg),
        policy_hash: None,
        pin: false,
    };
    let mut tpm = Tpm::open(device)?;
    let primary = tpm.create_primary(alg)?;
    let item = tpm.load(primary.handle, &sealed.private, &sealed.public)?;
    if attributes & 0x40 != 0 {
        return Ok(tpm.unseal_with_password(item)?);
    }
    let session = tpm.start_policy_session(Some(&primary))?;
    if !pcrs.is_empty() {
        tpm.policy_pcr(session.handle, sealed.bank, pcrs)?;
    }
    Ok(tpm.unseal(item, &sealed.name()?, &session, &[])?)
}

/// systemd's PIN: its SHA-256 is the sealed object's authValue.
fn hash_pin(pin: &[u8]) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(Sha256::digest(pin).to_vec())
}

/// The policy digest of PolicyPCR over PCRs with `values` (in index order), then PolicyAuthValue
/// with `pin`, from the empty policy: what a trial session would compute.
fn policy_digest(pcrs: &[u32], values: &[Vec<u8>], pin: bool) -> Vec<u8> {
    let mut digest = vec![0u8; 32];
    if !pcrs.is_empty() {
        let pcr_digest = values
            .iter()
            .fold(Sha256::new(), |h, v| h.chain_update(v))
            .finalize();
        digest = Sha256::new()
            .chain_update(&digest)
            .chain_update(CC_POLICY_PCR.to_be_bytes())
            .chain_update(pcr_selection(TPM_ALG_SHA256, pcrs))
            .chain_update(pcr_digest)
            .finalize()
            .to_vec();
    }
    if pin {
        digest = Sha256::new()
            .chain_update(&digest)
            .chain_update(CC_POLICY_AUTH_VALUE.to_be_bytes())
            .finalize()
            .to_vec();
    }
    digest
}

/// Seal 32 random bytes in the TPM `device` to the current values of `pcrs` (SHA-256 bank) and
/// `pin`: what `systemd-cryptenroll --tpm2-device=... --tpm2-pcrs=... [--tpm2-with-pin=yes]`
/// makes.
pub fn enroll(device: &str, pcrs: &[u32], pin: Option<&[u8]>) -> Result<Enrolment, Error> {
    if let Some(&p) = pcrs.iter().find(|&&p| p >= 24) {
        return Err(Error::BadToken(format!("PCR {p} (a TPM has 0 to 23)")));
    }
    let mut pcrs = pcrs.to_vec();
    pcrs.sort_unstable();
    pcrs.dedup();
    let mut tpm = Tpm::open(device)?;
    // systemd tries ECC first (fast), RSA if the TPM cannot.
    let (primary, alg) = match tpm.create_primary(PrimaryAlg::Ecc) {
        Ok(p) => (p.handle, PrimaryAlg::Ecc),
        Err(_) => (tpm.create_primary(PrimaryAlg::Rsa)?.handle, PrimaryAlg::Rsa),
    };
    let values = if pcrs.is_empty() {
        Vec::new()
    } else {
        tpm.pcr_read(&pcrs)?
    };
    let policy = policy_digest(&pcrs, &values, pin.is_some());
    let mut secret = SecretBytes::zeroed(32);
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let auth = pin.map(hash_pin);
    let (private, public) = tpm.create_sealed(
        primary,
        &secret,
        auth.as_deref().map_or(&[][..], |a| &a[..]),
        &policy,
    )?;
    Ok(Enrolment {
        passphrase: base64_passphrase(&secret),
        token: json!({
            "type": TYPE,
            "keyslots": [],
            "tpm2-blob": STANDARD.encode([private, public].concat()),
            "tpm2-pcrs": pcrs,
            "tpm2-pcr-bank": "sha256",
            "tpm2-primary-alg": alg.name(),
            "tpm2-policy-hash": hex::encode(&policy),
            "tpm2-pin": pin.is_some(),
        }),
        // As systemd-cryptenroll: PBKDF2-SHA512 at 1,000 iterations.
        pbkdf: Pbkdf {
            kind: PbkdfKind::Pbkdf2 { hash: Hash::Sha512 },
            forced_iterations: Some(1000),
            ..Pbkdf::default()
        },
    })
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    (s.len() <= 128).then(|| hex::decode(s).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The token systemd-cryptenroll 252 wrote for PCR 7 on a fresh swtpm (PCR 7 all zeros): our
    /// policy digest for the same PCR values is the one it stored, and the blob's object is
    /// policy-only (fixedTPM | fixedParent) with that policy.
    #[test]
    fn a_systemd_token_parses_and_its_policy_is_recomputed() {
        let token = json!({"type":"systemd-tpm2","keyslots":["1"],
            "tpm2-blob":"AJ4AIK8gft/kByPKMW0WEj3jix0FV5ENpNPb8mpcJSdTLDMqABAFuMAmPj1kCHRZPE7y/eGhYyk/wF4MDG5E1kEZStRBFcZJ0P4lKpZgjkKM8Jy2RCsLjw+BXgzUZIqkEAT77MV2Ran7Mnm36QD9Oc6Usp4KHW+OXrTMFJEu5b8NnuEHpZOJyM4L825caa06dlIek5Cb0rLs7QjtlahY/QBOAAgACwAAABIAIItWgtgbKUNdCNeSeBUGEdx+WSOy/vzOaEoJV3tAEwqLABAAIONUkKea0KOtBfwE25wyEieDncX1Jt3IV0SUBIorOfH8",
            "tpm2-pcrs":[7],"tpm2-pcr-bank":"sha256","tpm2-primary-alg":"ecc",
            "tpm2-policy-hash":"8b5682d81b29435d08d79278150611dc7e5923b2fefcce684a09577b40130a8b",
            "tpm2-pin":false});
        let s = Sealed::parse(&token).unwrap();
        assert_eq!(s.pcrs, [7]);
        assert_eq!(s.primary, Some(PrimaryAlg::Ecc));
        let policy = policy_digest(&s.pcrs, &[vec![0u8; 32]], false);
        assert_eq!(Some(policy.clone()), s.policy_hash);
        assert_eq!(&s.public[2..10], &[0, 8, 0, 0x0b, 0, 0, 0, 0x12]);
        assert_eq!(&s.public[12..44], &policy[..]);
        assert_eq!(s.name().unwrap().len(), 34);
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let base = json!({"type":"systemd-tpm2","keyslots":["1"],"tpm2-blob":"AAIAAAACAAA=",
            "tpm2-pcrs":[7],"tpm2-pcr-bank":"sha256","tpm2-primary-alg":"ecc",
            "tpm2-policy-hash":"00","tpm2-pin":false});
        assert!(Sealed::parse(&base).is_err(), "a public part too short");
        for (field, value) in [
            ("tpm2-blob", json!("AAE=")),
            ("tpm2-blob", json!(5)),
            ("tpm2-pcrs", json!([24])),
            ("tpm2-pcrs", json!("7")),
            ("tpm2-pcr-bank", json!("md5")),
            ("tpm2-primary-alg", json!("dsa")),
            ("tpm2-policy-hash", json!("xyz")),
            ("tpm2-pin", json!("yes")),
            ("tpm2_salt", json!("AAAA")),
        ] {
            let mut t = base.clone();
            t["tpm2-blob"] = json!("AAIAAAAIAAAACwAAABIAAAAQAAA=");
            t[field] = value;
            assert!(Sealed::parse(&t).is_err(), "{field}");
        }
    }

    #[test]
    fn pins_and_pcr_policies_extend_the_digest_as_the_tpm_does() {
        // PolicyAuthValue alone: SHA-256(zeros || TPM_CC_PolicyAuthValue).
        let mut h = Sha256::new();
        h.update([0u8; 32]);
        h.update(0x16Bu32.to_be_bytes());
        assert_eq!(policy_digest(&[], &[], true), h.finalize().to_vec());
        assert_eq!(policy_digest(&[], &[], false), vec![0u8; 32]);
        assert_ne!(
            policy_digest(&[7], &[vec![0; 32]], false),
            policy_digest(&[7], &[vec![1; 32]], false)
        );
    }
}
