//! Talking to a TPM 2.0: the byte stream (`/dev/tpmrm0`, or swtpm's command socket, TCP or Unix,
//! as `swtpm:host=H,port=P` or `swtpm:path=SOCKET` in tpm2-tss' TCTI syntax) and the handful of
//! commands unsealing and sealing need, marshalled by hand (TPM 2.0 Library, Part 3). No TSS
//! library: these few commands are smaller than the bindings to one.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::Error;

pub(crate) const TPM_ALG_SHA256: u16 = 0x000B;
pub(crate) const TPM_ALG_SHA1: u16 = 0x0004;

/// A PCR bank by its name (`sha1`, `sha256`, `sha384`, `sha512`).
pub(crate) fn bank(name: &str) -> Option<u16> {
    match name {
        "sha1" => Some(TPM_ALG_SHA1),
        "sha256" => Some(TPM_ALG_SHA256),
        "sha384" => Some(0x000C),
        "sha512" => Some(0x000D),
        _ => None,
    }
}
const TPM_ALG_NULL: u16 = 0x0010;
const TPM_ST_NO_SESSIONS: u16 = 0x8001;
const TPM_ST_SESSIONS: u16 = 0x8002;
const TPM_RH_OWNER: u32 = 0x4000_0001;
const TPM_RH_NULL: u32 = 0x4000_0007;
const TPM_RS_PW: u32 = 0x4000_0009;
const TPM_SE_POLICY: u8 = 0x01;

const CC_CREATE_PRIMARY: u32 = 0x131;
const CC_CREATE: u32 = 0x153;
const CC_LOAD: u32 = 0x157;
const CC_UNSEAL: u32 = 0x15E;
const CC_FLUSH_CONTEXT: u32 = 0x165;
pub(crate) const CC_POLICY_AUTH_VALUE: u32 = 0x16B;
const CC_START_AUTH_SESSION: u32 = 0x176;
const CC_PCR_READ: u32 = 0x17E;
pub(crate) const CC_POLICY_PCR: u32 = 0x17F;
const CC_POLICY_GET_DIGEST: u32 = 0x189;
const CC_LOAD_EXTERNAL: u32 = 0x167;
const CC_VERIFY_SIGNATURE: u32 = 0x177;
const CC_POLICY_AUTHORIZE: u32 = 0x16A;

/// The longest response taken (a TPM's buffers are a few KiB).
const MAX_RESPONSE: usize = 64 << 10;
const IO_TIMEOUT: Duration = Duration::from_secs(120);

/// The primary key systemd derives from the owner hierarchy's seed: a storage key (restricted,
/// decrypt, fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth) with AES-128-CFB, ECC
/// NIST P-256 or RSA 2048. The same template gives the same key on the same TPM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrimaryAlg {
    Ecc,
    Rsa,
}

impl PrimaryAlg {
    fn template(self) -> Vec<u8> {
        let mut t = Vec::new();
        let (kind, params): (u16, &[u8]) = match self {
            // ECC: symmetric AES 128 CFB, scheme NULL, curve NIST P-256, kdf NULL; unique x, y empty.
            PrimaryAlg::Ecc => (
                0x0023,
                &[0, 6, 0, 128, 0, 0x43, 0, 0x10, 0, 3, 0, 0x10, 0, 0, 0, 0],
            ),
            // RSA: symmetric AES 128 CFB, scheme NULL, 2048 bits, exponent 0; unique empty.
            PrimaryAlg::Rsa => (
                0x0001,
                &[0, 6, 0, 128, 0, 0x43, 0, 0x10, 8, 0, 0, 0, 0, 0, 0, 0],
            ),
        };
        t.extend(kind.to_be_bytes());
        t.extend(TPM_ALG_SHA256.to_be_bytes());
        t.extend(0x0003_0072u32.to_be_bytes());
        t.extend(0u16.to_be_bytes()); // authPolicy: empty
        t.extend_from_slice(params);
        t
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            PrimaryAlg::Ecc => "ecc",
            PrimaryAlg::Rsa => "rsa",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<PrimaryAlg> {
        match s {
            "ecc" => Some(PrimaryAlg::Ecc),
            "rsa" => Some(PrimaryAlg::Rsa),
            _ => None,
        }
    }
}

/// A TPM response code, with what a user can do about it.
fn describe(rc: u32) -> String {
    // Format-one codes carry a handle, session or parameter number in bits 8-11.
    let base = if rc & 0x80 != 0 { rc & 0xBF } else { rc };
    let what = match base {
        0x08E => "the PIN is wrong (authorization failed)",
        0x09D => "the policy does not match (PCR values changed since enrolment)",
        0x09F => "the sealed key does not belong to this TPM (integrity check failed)",
        0x0A2 => "the PIN is wrong (bad authorization)",
        0x921 => "the TPM is in dictionary-attack lockout; wait, or clear the lockout",
        0x902..=0x904 => "the TPM is out of memory or object slots",
        0x100 => "the TPM is not initialized (TPM2_Startup has not run)",
        _ => "",
    };
    if what.is_empty() {
        format!("TPM error 0x{rc:03x}")
    } else {
        format!("{what} (TPM error 0x{rc:03x})")
    }
}

/// An error from the TPM, or a failure to talk to it.
pub(crate) struct TpmError {
    pub(crate) rc: Option<u32>,
    pub(crate) message: String,
}

impl From<TpmError> for Error {
    fn from(e: TpmError) -> Error {
        match e.rc.map(|rc| if rc & 0x80 != 0 { rc & 0xBF } else { rc }) {
            Some(0x08E | 0x0A2) => Error::WrongPin(e.message),
            None => Error::Unavailable(e.message),
            _ => Error::Failed(e.message),
        }
    }
}

enum Stream {
    Device(File),
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A connection to a TPM.
pub(crate) struct Tpm {
    stream: Stream,
    name: String,
    /// Transient handles to flush when done.
    loaded: Vec<u32>,
}

impl Tpm {
    /// Open `device`: a path (`/dev/tpmrm0`), `device:PATH`, or `swtpm:host=H,port=P` /
    /// `swtpm:path=SOCKET` / `swtpm:` (localhost:2321, tpm2-tss' default).
    pub(crate) fn open(device: &str) -> Result<Tpm, Error> {
        let fail =
            |e: std::io::Error| Error::Unavailable(format!("cannot open the TPM {device}: {e}"));
        let stream = if let Some(conf) = device.strip_prefix("swtpm:") {
            let mut host = "localhost".to_string();
            let mut port = 2321u16;
            let mut path = None;
            for kv in conf.split(',').filter(|s| !s.is_empty()) {
                match kv.split_once('=') {
                    Some(("host", h)) => host = h.to_string(),
                    Some(("port", p)) => {
                        port = p.parse().map_err(|_| {
                            Error::Unavailable(format!("TPM {device}: bad port {p:?}"))
                        })?
                    }
                    Some(("path", p)) => path = Some(p.to_string()),
                    _ => {
                        return Err(Error::Unavailable(format!(
                            "TPM {device}: unknown swtpm option {kv:?} (host=, port=, path=)"
                        )))
                    }
                }
            }
            match path {
                Some(p) => Stream::Unix(UnixStream::connect(p).map_err(fail)?),
                None => Stream::Tcp(TcpStream::connect((host.as_str(), port)).map_err(fail)?),
            }
        } else {
            let path = device.strip_prefix("device:").unwrap_or(device);
            if device.contains(':') && !device.starts_with("device:") {
                return Err(Error::Unavailable(format!(
                    "TPM {device}: only device paths and swtpm: are supported"
                )));
            }
            Stream::Device(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(fail)?,
            )
        };
        match &stream {
            Stream::Tcp(s) => {
                s.set_read_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
            }
            Stream::Device(_) => {}
        }
        Ok(Tpm {
            stream,
            name: device.to_string(),
            loaded: Vec::new(),
        })
    }

    /// Send one command; the response after its header, or the TPM's error. A TPM that asks for
    /// the command again (yielded, testing, retry: warnings 0x908, 0x90A, 0x922) gets it again,
    /// as the TSS does.
    fn execute(&mut self, command: &[u8]) -> Result<Vec<u8>, TpmError> {
        let mut tries = 0;
        loop {
            match self.execute_once(command) {
                Err(TpmError {
                    rc: Some(0x908 | 0x90A | 0x922),
                    ..
                }) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    fn execute_once(&mut self, command: &[u8]) -> Result<Vec<u8>, TpmError> {
        let io = |e: std::io::Error| TpmError {
            rc: None,
            message: format!("TPM {}: {e}", self.name),
        };
        // An unseal's answer holds the secret: the buffer is zeroized when dropped.
        let mut response = Zeroizing::new(vec![0u8; MAX_RESPONSE]);
        let n = match &mut self.stream {
            // The kernel's TPM device takes a command in one write and answers in one read.
            Stream::Device(f) => {
                f.write_all(command).map_err(io)?;
                f.read(&mut response).map_err(io)?
            }
            Stream::Tcp(s) => exchange(s, command, &mut response).map_err(io)?,
            Stream::Unix(s) => exchange(s, command, &mut response).map_err(io)?,
        };
        let response = &response[..n];
        if n < 10 {
            return Err(TpmError {
                rc: None,
                message: format!("TPM {}: a short response", self.name),
            });
        }
        let rc = u32::from_be_bytes(response[6..10].try_into().expect("4 bytes"));
        if rc != 0 {
            return Err(TpmError {
                rc: Some(rc),
                message: format!("TPM {}: {}", self.name, describe(rc)),
            });
        }
        Ok(response[10..].to_vec())
    }

    /// The primary storage key systemd uses, created from the owner hierarchy's seed; for an
    /// ECC key also its public point, which salts sessions.
    pub(crate) fn create_primary(&mut self, alg: PrimaryAlg) -> Result<Primary, TpmError> {
        let mut params = Vec::new();
        params.extend([0, 4, 0, 0, 0, 0]); // inSensitive: empty userAuth and data
        tpm2b(&mut params, &alg.template());
        params.extend([0, 0]); // outsideInfo
        params.extend([0, 0, 0, 0]); // creationPCR: none
        let r = self.execute(&command(
            CC_CREATE_PRIMARY,
            &[TPM_RH_OWNER],
            Some(&password_session()),
            &params,
        ))?;
        let mut rd = Reader::new(&r);
        let handle = rd.u32()?;
        self.loaded.push(handle);
        rd.u32()?; // parameterSize
        let public = rd.tpm2b()?;
        let point = match alg {
            PrimaryAlg::Ecc => Some(ecc_point(&public)?),
            PrimaryAlg::Rsa => None,
        };
        Ok(Primary { handle, point })
    }

    /// Load a sealed object (its `TPM2B_PRIVATE` and `TPM2B_PUBLIC`, as marshalled) under
    /// `parent`.
    pub(crate) fn load(
        &mut self,
        parent: u32,
        private: &[u8],
        public: &[u8],
    ) -> Result<u32, TpmError> {
        let params = [private, public].concat();
        let r = self.execute(&command(
            CC_LOAD,
            &[parent],
            Some(&password_session()),
            &params,
        ))?;
        let handle = Reader::new(&r).u32()?;
        self.loaded.push(handle);
        Ok(handle)
    }

    /// Create a sealed data object under `parent`: `data` sealed, `auth` its authValue (empty
    /// without a PIN), `policy` the digest that must be satisfied. Returns the marshalled
    /// `TPM2B_PRIVATE` and `TPM2B_PUBLIC`.
    pub(crate) fn create_sealed(
        &mut self,
        parent: u32,
        data: &[u8],
        auth: &[u8],
        policy: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), TpmError> {
        let mut sensitive = Zeroizing::new(Vec::new());
        tpm2b(&mut sensitive, auth);
        tpm2b(&mut sensitive, data);
        let mut template = Vec::new();
        template.extend(0x0008u16.to_be_bytes()); // TPM_ALG_KEYEDHASH
        template.extend(TPM_ALG_SHA256.to_be_bytes());
        template.extend(0x0000_0012u32.to_be_bytes()); // fixedTPM | fixedParent: policy only
        tpm2b(&mut template, policy);
        template.extend(TPM_ALG_NULL.to_be_bytes()); // scheme
        tpm2b(&mut template, &[0; 32]); // unique: as systemd's template (the TPM sets it)
        let mut params = Zeroizing::new(Vec::new());
        tpm2b(&mut params, &sensitive);
        tpm2b(&mut params, &template);
        params.extend([0, 0, 0, 0, 0, 0]); // outsideInfo, creationPCR
        let r = self.execute(&command(
            CC_CREATE,
            &[parent],
            Some(&password_session()),
            &params,
        ))?;
        let mut rd = Reader::new(&r);
        rd.u32()?; // parameterSize
        let private = rd.tpm2b_raw()?;
        let public = rd.tpm2b_raw()?;
        Ok((private, public))
    }

    /// The values of `pcrs` in `bank` (SHA-256), in index order.
    pub(crate) fn pcr_read(&mut self, pcrs: &[u32]) -> Result<Vec<Vec<u8>>, TpmError> {
        let mut values = Vec::new();
        // A TPM answers at most 8 digests per call: ask for what is still missing until done.
        let mut missing: Vec<u32> = pcrs.to_vec();
        while !missing.is_empty() {
            let r = self.execute(&command(
                CC_PCR_READ,
                &[],
                None,
                &pcr_selection(TPM_ALG_SHA256, &missing),
            ))?;
            let mut rd = Reader::new(&r);
            rd.u32()?; // update counter
            let count = rd.u32()?;
            let mut got = Vec::new();
            for _ in 0..count {
                let _hash = rd.u16()?;
                let size = rd.u8()? as usize;
                let select = rd.bytes(size)?;
                for (byte, bits) in select.iter().enumerate() {
                    for bit in 0..8 {
                        if bits & (1 << bit) != 0 {
                            got.push((byte * 8 + bit) as u32);
                        }
                    }
                }
            }
            let n = rd.u32()? as usize;
            if n == 0 || n != got.len() {
                return Err(TpmError {
                    rc: None,
                    message: format!("TPM {}: PCR values missing from its answer", self.name),
                });
            }
            for _ in 0..n {
                values.push(rd.tpm2b()?);
            }
            missing.retain(|p| !got.contains(p));
        }
        Ok(values)
    }

    /// Start an unbound policy session. Salted by `salt_to` (the ECC primary key), the session
    /// has a key of its own that no one watching the bus can know, and encrypts what it is
    /// asked to (AES-128-CFB, as systemd's): the unsealed secret. Without it (an RSA primary),
    /// the session is neither.
    pub(crate) fn start_policy_session(
        &mut self,
        salt_to: Option<&Primary>,
    ) -> Result<Session, TpmError> {
        let fail = |what: &'static str| {
            move |e: openssl::error::ErrorStack| TpmError {
                rc: None,
                message: format!("{what}: {e}"),
            }
        };
        let mut nonce_caller = vec![0u8; 32];
        openssl::rand::rand_bytes(&mut nonce_caller).map_err(fail("random bytes"))?;
        let salt = match salt_to.and_then(|p| Some((p.handle, p.point.as_ref()?))) {
            Some((handle, (qx, qy))) => Some((handle, salt_for(qx, qy).map_err(fail("ECDH"))?)),
            None => None,
        };
        let mut params = Vec::new();
        tpm2b(&mut params, &nonce_caller);
        match &salt {
            Some((_, (_, encrypted))) => tpm2b(&mut params, encrypted),
            None => params.extend([0, 0]),
        }
        params.push(TPM_SE_POLICY);
        if salt.is_some() {
            params.extend([0, 6, 0, 128, 0, 0x43]); // AES 128 CFB
        } else {
            params.extend(TPM_ALG_NULL.to_be_bytes());
        }
        params.extend(TPM_ALG_SHA256.to_be_bytes());
        let tpm_key = salt.as_ref().map_or(TPM_RH_NULL, |(h, _)| *h);
        let r = self.execute(&command(
            CC_START_AUTH_SESSION,
            &[tpm_key, TPM_RH_NULL],
            None,
            &params,
        ))?;
        let mut rd = Reader::new(&r);
        let handle = rd.u32()?;
        self.loaded.push(handle);
        let nonce_tpm = rd.tpm2b()?;
        let key = match &salt {
            Some((_, (seed, _))) => kdfa(seed, "ATH", &nonce_tpm, &nonce_caller, 32),
            None => Zeroizing::new(Vec::new()),
        };
        Ok(Session {
            handle,
            nonce_tpm,
            key,
            encrypting: salt.is_some(),
        })
    }

    pub(crate) fn policy_pcr(
        &mut self,
        session: u32,
        bank: u16,
        pcrs: &[u32],
    ) -> Result<(), TpmError> {
        let params = [&[0u8, 0][..], &pcr_selection(bank, pcrs)].concat();
        self.execute(&command(CC_POLICY_PCR, &[session], None, &params))
            .map(drop)
    }

    /// Load an RSA public key (modulus `n`, exponent `e`) as systemd does for a signed PCR
    /// policy (decrypt, sign, userWithAuth; no scheme): its handle and name.
    pub(crate) fn load_external_rsa(
        &mut self,
        n: &[u8],
        e: u32,
    ) -> Result<(u32, Vec<u8>), TpmError> {
        let mut public = Vec::new();
        public.extend(0x0001u16.to_be_bytes()); // TPM_ALG_RSA
        public.extend(TPM_ALG_SHA256.to_be_bytes());
        public.extend(0x0006_0040u32.to_be_bytes());
        public.extend([0, 0]); // authPolicy
        public.extend(TPM_ALG_NULL.to_be_bytes()); // symmetric
        public.extend(TPM_ALG_NULL.to_be_bytes()); // scheme
        public.extend(((n.len() * 8) as u16).to_be_bytes());
        public.extend(e.to_be_bytes());
        tpm2b(&mut public, n);
        let mut params = vec![0, 0]; // inPrivate: none
        tpm2b(&mut params, &public);
        params.extend(TPM_RH_OWNER.to_be_bytes());
        let r = self.execute(&command(CC_LOAD_EXTERNAL, &[], None, &params))?;
        let mut rd = Reader::new(&r);
        let handle = rd.u32()?;
        self.loaded.push(handle);
        Ok((handle, rd.tpm2b()?))
    }

    /// Have the TPM check an RSASSA-SHA256 `signature` of `digest` by `key`: its ticket (a
    /// `TPMT_TK_VERIFIED`, marshalled).
    pub(crate) fn verify_signature(
        &mut self,
        key: u32,
        digest: &[u8],
        signature: &[u8],
    ) -> Result<Vec<u8>, TpmError> {
        let mut params = Vec::new();
        tpm2b(&mut params, digest);
        params.extend(0x0014u16.to_be_bytes()); // TPM_ALG_RSASSA
        params.extend(TPM_ALG_SHA256.to_be_bytes());
        tpm2b(&mut params, signature);
        self.execute(&command(CC_VERIFY_SIGNATURE, &[key], None, &params))
    }

    /// PolicyAuthorize: `approved` (the policy digest a key signed) stands for the session's
    /// policy, given the key's name and the TPM's ticket for the signature.
    pub(crate) fn policy_authorize(
        &mut self,
        session: u32,
        approved: &[u8],
        key_name: &[u8],
        ticket: &[u8],
    ) -> Result<(), TpmError> {
        let mut params = Vec::new();
        tpm2b(&mut params, approved);
        params.extend([0, 0]); // policyRef: empty
        tpm2b(&mut params, key_name);
        params.extend_from_slice(ticket);
        self.execute(&command(CC_POLICY_AUTHORIZE, &[session], None, &params))
            .map(drop)
    }

    pub(crate) fn policy_auth_value(&mut self, session: u32) -> Result<(), TpmError> {
        self.execute(&command(CC_POLICY_AUTH_VALUE, &[session], None, &[]))
            .map(drop)
    }

    pub(crate) fn policy_get_digest(&mut self, session: u32) -> Result<Vec<u8>, TpmError> {
        let r = self.execute(&command(CC_POLICY_GET_DIGEST, &[session], None, &[]))?;
        Reader::new(&r).tpm2b()
    }

    /// Unseal `item` (whose name is `name`) under the policy `session`: the HMAC is keyed with
    /// the session's key and `auth` (the object's authValue, when the policy includes
    /// PolicyAuthValue; else empty). An encrypting session has the TPM encrypt the secret on
    /// its way out; the response's HMAC is checked before it is decrypted.
    pub(crate) fn unseal(
        &mut self,
        item: u32,
        name: &[u8],
        session: &Session,
        auth: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, TpmError> {
        let mut nonce = [0u8; 32];
        openssl::rand::rand_bytes(&mut nonce).map_err(|e| TpmError {
            rc: None,
            message: format!("random bytes: {e}"),
        })?;
        // The session ends with this command; with `encrypt`, the response parameter is
        // encrypted.
        let attributes = if session.encrypting { 0x40u8 } else { 0 };
        let cp_hash = Sha256::new()
            .chain_update(CC_UNSEAL.to_be_bytes())
            .chain_update(name)
            .finalize();
        // Part 1, 19.6: trailing zero octets of an authValue are not part of the HMAC key.
        let auth = &auth[..auth.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
        let key = Zeroizing::new([&session.key[..], auth].concat());
        let hmac = |parts: &[&[u8]]| {
            let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
            for p in parts {
                mac.update(p);
            }
            mac.finalize().into_bytes()
        };
        let mut session_area = Vec::new();
        session_area.extend(session.handle.to_be_bytes());
        tpm2b(&mut session_area, &nonce);
        session_area.push(attributes);
        tpm2b(
            &mut session_area,
            &hmac(&[&cp_hash, &nonce, &session.nonce_tpm, &[attributes]]),
        );
        let r =
            Zeroizing::new(self.execute(&command(CC_UNSEAL, &[item], Some(&session_area), &[]))?);
        // A session not continued ends with the command that succeeds with it (a failed command
        // leaves it open, to be flushed).
        self.loaded.retain(|h| *h != session.handle);
        let mut rd = Reader::new(&r);
        let size = rd.u32()? as usize;
        let params = rd.bytes(size)?;
        let nonce_tpm = rd.tpm2b()?;
        let response_attributes = rd.bytes(1)?[0];
        let response_hmac = rd.tpm2b()?;
        let rp_hash = Sha256::new()
            .chain_update(0u32.to_be_bytes())
            .chain_update(CC_UNSEAL.to_be_bytes())
            .chain_update(params)
            .finalize();
        let expected = hmac(&[&rp_hash, &nonce_tpm, &nonce, &[response_attributes]]);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            &expected[..],
            &response_hmac[..],
        )) {
            return Err(TpmError {
                rc: None,
                message: format!("TPM {}: its answer fails its integrity check", self.name),
            });
        }
        let mut data = Zeroizing::new(Reader::new(params).tpm2b()?);
        if session.encrypting {
            let kv = kdfa(&key, "CFB", &nonce_tpm, &nonce, 32);
            let mut c = openssl::symm::Crypter::new(
                openssl::symm::Cipher::aes_128_cfb128(),
                openssl::symm::Mode::Decrypt,
                &kv[..16],
                Some(&kv[16..]),
            )
            .and_then(|mut c| {
                let mut out = Zeroizing::new(vec![0u8; data.len() + 16]);
                let n = c.update(&data, &mut out)?;
                let m = c.finalize(&mut out[n..])?;
                out.truncate(n + m);
                Ok(out)
            })
            .map_err(|e| TpmError {
                rc: None,
                message: format!("AES-CFB: {e}"),
            })?;
            std::mem::swap(&mut data, &mut c);
        }
        Ok(data)
    }

    /// Unseal `item`, whose owner may use it with its (empty) password: an object sealed
    /// without a policy (`userWithAuth`), as clevis seals when it binds no PCR.
    pub(crate) fn unseal_with_password(
        &mut self,
        item: u32,
    ) -> Result<Zeroizing<Vec<u8>>, TpmError> {
        let r = Zeroizing::new(self.execute(&command(
            CC_UNSEAL,
            &[item],
            Some(&password_session()),
            &[],
        ))?);
        let mut rd = Reader::new(&r);
        rd.u32()?; // parameterSize
        Ok(Zeroizing::new(rd.tpm2b()?))
    }

    fn flush(&mut self, handle: u32) {
        let _ = self.execute(&command(CC_FLUSH_CONTEXT, &[], None, &handle.to_be_bytes()));
    }
}

impl Drop for Tpm {
    /// Transient objects and sessions are flushed: a TPM has only a few slots.
    fn drop(&mut self) {
        for h in std::mem::take(&mut self.loaded).into_iter().rev() {
            self.flush(h);
        }
    }
}

/// A primary key: its handle and, for ECC, its public point (x, y).
pub(crate) struct Primary {
    pub(crate) handle: u32,
    point: Option<(Vec<u8>, Vec<u8>)>,
}

/// A policy session: its handle, the TPM's nonce, its key (empty unless salted), whether it
/// encrypts.
pub(crate) struct Session {
    pub(crate) handle: u32,
    nonce_tpm: Vec<u8>,
    key: Zeroizing<Vec<u8>>,
    encrypting: bool,
}

/// The x and y of an ECC key's `TPMT_PUBLIC` (its `unique` field, after the parameters).
pub(crate) fn ecc_point(public: &[u8]) -> Result<(Vec<u8>, Vec<u8>), TpmError> {
    let mut rd = Reader::new(public);
    rd.bytes(8)?; // type, nameAlg, objectAttributes
    rd.tpm2b()?; // authPolicy
    if rd.u16()? != TPM_ALG_NULL {
        rd.bytes(4)?; // symmetric keyBits, mode
    }
    if rd.u16()? != TPM_ALG_NULL {
        rd.bytes(2)?; // scheme hash
    }
    rd.bytes(2)?; // curveID
    if rd.u16()? != TPM_ALG_NULL {
        rd.bytes(2)?; // kdf hash
    }
    Ok((rd.tpm2b()?, rd.tpm2b()?))
}

/// A salt for a session salted by the P-256 key (qx, qy): the seed (KDFe over the ECDH secret
/// of a fresh key and that key, Part 1, 11.4.10.3) and the `TPMS_ECC_POINT` the TPM needs to
/// compute it too.
fn salt_for(
    qx: &[u8],
    qy: &[u8],
) -> Result<(Zeroizing<Vec<u8>>, Vec<u8>), openssl::error::ErrorStack> {
    use openssl::bn::{BigNum, BigNumContext};
    use openssl::ec::{EcGroup, EcKey, EcPoint};
    let group = EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1)?;
    let mut ctx = BigNumContext::new()?;
    let (qx_bn, qy_bn) = (BigNum::from_slice(qx)?, BigNum::from_slice(qy)?);
    let q = EcKey::from_public_key_affine_coordinates(&group, &qx_bn, &qy_bn)?;
    let eph = EcKey::generate(&group)?;
    let mut z = EcPoint::new(&group)?;
    z.mul2(&group, q.public_key(), eph.private_key(), &mut ctx)?;
    let (mut zx, mut ex, mut ey) = (BigNum::new()?, BigNum::new()?, BigNum::new()?);
    let mut unused = BigNum::new()?;
    z.affine_coordinates(&group, &mut zx, &mut unused, &mut ctx)?;
    eph.public_key()
        .affine_coordinates(&group, &mut ex, &mut ey, &mut ctx)?;
    let (zx, ex, ey) = (
        Zeroizing::new(zx.to_vec_padded(32)?),
        ex.to_vec_padded(32)?,
        ey.to_vec_padded(32)?,
    );
    let qx = [vec![0u8; 32usize.saturating_sub(qx.len())], qx.to_vec()].concat();
    let seed = Zeroizing::new(
        Sha256::new()
            .chain_update(1u32.to_be_bytes())
            .chain_update(&*zx)
            .chain_update(b"SECRET\0")
            .chain_update(&ex)
            .chain_update(&qx)
            .finalize()
            .to_vec(),
    );
    let mut point = Vec::new();
    tpm2b(&mut point, &ex);
    tpm2b(&mut point, &ey);
    Ok((seed, point))
}

/// KDFa with SHA-256 (Part 1, 11.4.10.2): `bytes` of HMAC(key, counter || label || 0 ||
/// context_u || context_v || bits).
fn kdfa(
    key: &[u8],
    label: &str,
    context_u: &[u8],
    context_v: &[u8],
    bytes: usize,
) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(bytes + 32));
    let mut counter = 1u32;
    while out.len() < bytes {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
        mac.update(&counter.to_be_bytes());
        mac.update(label.as_bytes());
        mac.update(&[0]);
        mac.update(context_u);
        mac.update(context_v);
        mac.update(&((bytes * 8) as u32).to_be_bytes());
        out.extend_from_slice(&mac.finalize().into_bytes());
        counter += 1;
    }
    out.truncate(bytes);
    out
}

/// One command over a socket: swtpm answers with exactly one response, its length in its
/// header.
fn exchange(s: &mut (impl Read + Write), command: &[u8], buf: &mut [u8]) -> std::io::Result<usize> {
    s.write_all(command)?;
    s.read_exact(&mut buf[..10])?;
    let size = u32::from_be_bytes(buf[2..6].try_into().expect("4 bytes")) as usize;
    if !(10..=buf.len()).contains(&size) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a response of {size} bytes"),
        ));
    }
    s.read_exact(&mut buf[10..size])?;
    Ok(size)
}

/// A password session with an empty password (the owner hierarchy, and objects without a PIN).
fn password_session() -> Vec<u8> {
    let mut s = TPM_RS_PW.to_be_bytes().to_vec();
    s.extend([0, 0, 0, 0, 0]); // nonce, attributes, hmac: empty
    s
}

/// A command: tag, size, code, handles, the authorization area (if any), parameters.
fn command(code: u32, handles: &[u32], auth: Option<&[u8]>, params: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for h in handles {
        body.extend(h.to_be_bytes());
    }
    let tag = match auth {
        Some(a) => {
            body.extend((a.len() as u32).to_be_bytes());
            body.extend_from_slice(a);
            TPM_ST_SESSIONS
        }
        None => TPM_ST_NO_SESSIONS,
    };
    body.extend_from_slice(params);
    let mut c = Vec::with_capacity(10 + body.len());
    c.extend(tag.to_be_bytes());
    c.extend(((10 + body.len()) as u32).to_be_bytes());
    c.extend(code.to_be_bytes());
    c.extend(body);
    c
}

/// A `TPML_PCR_SELECTION` of `pcrs` in `bank` (three select bytes, as PC TPMs have 24).
pub(crate) fn pcr_selection(bank: u16, pcrs: &[u32]) -> Vec<u8> {
    let mut select = [0u8; 3];
    for &p in pcrs {
        select[(p / 8) as usize] |= 1 << (p % 8);
    }
    let mut v = 1u32.to_be_bytes().to_vec();
    v.extend(bank.to_be_bytes());
    v.push(3);
    v.extend(select);
    v
}

fn tpm2b(out: &mut Vec<u8>, data: &[u8]) {
    out.extend((data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
}

/// Reading a response (or a blob) field by field; running out is an error, not a panic.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], TpmError> {
        if self.data.len() < n {
            return Err(TpmError {
                rc: None,
                message: "a TPM structure is cut short".into(),
            });
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, TpmError> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, TpmError> {
        Ok(u16::from_be_bytes(
            self.bytes(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, TpmError> {
        Ok(u32::from_be_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }

    /// A `TPM2B`'s contents.
    pub(crate) fn tpm2b(&mut self) -> Result<Vec<u8>, TpmError> {
        let n = self.u16()? as usize;
        Ok(self.bytes(n)?.to_vec())
    }

    /// A `TPM2B` as marshalled (size included).
    pub(crate) fn tpm2b_raw(&mut self) -> Result<Vec<u8>, TpmError> {
        let start = self.data;
        let n = self.u16()? as usize;
        self.bytes(n)?;
        Ok(start[..2 + n].to_vec())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}
