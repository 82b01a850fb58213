//! TLS for `NBD_OPT_STARTTLS`: the server's credentials (X.509 certificates laid out as nbdkit
//! lays them out, on rustls; or nbdkit's pre-shared key file, on OpenSSL: see [`psk`]), and the
//! relay that carries a connection's TLS session once the handshake is done.
//!
//! Why a relay: the transmission phase reads and writes one socket from several threads at once
//! (one reader at a time, replies from every worker), which a socket allows and a TLS session,
//! one state machine, does not. So once the TLS handshake is done, two threads run the session
//! between the client's socket and one end of a Unix socket pair, and option haggling and
//! transmission carry on over the other end as over any Unix stream: plain and TLS connections
//! share one code path, shutdown semantics included. One thread opens the client's records, the
//! other seals what the server writes; they share the session under a lock held only while
//! records are opened or sealed, so a client that keeps sending never holds up the encryption of
//! replies, nor the other way round. Sealed records are sent in the order they were sealed (the
//! lock on the socket's write side is taken before the session's is let go), as TLS sequence
//! numbers demand. The price is one more copy through the kernel each way.
//!
//! Both libraries' sessions run in memory, records in and records out, behind one small trait,
//! [`ServerSession`]: rustls's connections work that way, and OpenSSL's do over a buffer in place
//! of a socket. So one handshake loop and one relay serve both, and neither library ever blocks
//! on the socket or is shared across a blocking call (an OpenSSL stream over the socket itself
//! would need one lock for reads and writes, or a non-blocking socket and polling).

mod psk;

use std::fs;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rustls::crypto::ring;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use zeroize::Zeroizing;

use self::psk::PskSession;

use crate::stream::Stream;
use crate::Error;

/// The CA that client certificates must chain to (nbdkit's name); without it clients are not
/// asked for certificates.
pub const CA_CERT: &str = "ca-cert.pem";
/// The server's certificate chain, leaf first.
pub const SERVER_CERT: &str = "server-cert.pem";
/// The server's private key (PKCS#8, PKCS#1 or SEC1, in PEM).
pub const SERVER_KEY: &str = "server-key.pem";

/// Bytes moved per read on either side of the relay: a few TLS records' worth.
const RELAY_CHUNK: usize = 256 * 1024;

/// The most plaintext a TLS record carries.
const TLS_RECORD: usize = 16 * 1024;

/// Whether a client may do without TLS (nbdkit's `--tls on` and `--tls require`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// Offered: a client may start TLS or carry on in plain text.
    On,
    /// Required: until a client starts TLS, every option but `NBD_OPT_STARTTLS` and
    /// `NBD_OPT_ABORT` is refused (`NBD_REP_ERR_TLS_REQD`), and `NBD_OPT_EXPORT_NAME` ends the
    /// connection (the protocol's FORCEDTLS mode).
    Require,
}

/// A server's TLS setup: its mode and its credentials.
#[derive(Clone, Debug)]
pub struct Tls {
    mode: TlsMode,
    credentials: Credentials,
}

#[derive(Clone, Debug)]
enum Credentials {
    /// X.509, on rustls.
    Certificates {
        config: Arc<ServerConfig>,
        verifies_clients: bool,
    },
    /// Pre-shared keys, on OpenSSL.
    PreSharedKeys(openssl::ssl::SslContext),
}

impl Tls {
    /// Load `dir/server-cert.pem` and `dir/server-key.pem`, and `dir/ca-cert.pem` if it exists:
    /// then every client must present a certificate that it signed. A missing or unreadable file,
    /// a file without the PEM item expected, or a key that does not match the certificate is
    /// [`Error::Tls`], naming the file.
    pub fn load(mode: TlsMode, dir: &Path) -> Result<Tls, Error> {
        let provider = Arc::new(ring::default_provider());
        let cert_path = dir.join(SERVER_CERT);
        let key_path = dir.join(SERVER_KEY);
        let chain = read_certificates(&cert_path)?;
        let key = read_key(&key_path)?;
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(dir, e))?;
        let ca_path = dir.join(CA_CERT);
        let verifies_clients = ca_path.exists();
        let builder = if verifies_clients {
            let mut roots = RootCertStore::empty();
            for ca in read_certificates(&ca_path)? {
                roots.add(ca).map_err(|e| tls_error(&ca_path, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| tls_error(&ca_path, e))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(chain, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                tls_error(&key_path, format!("does not match {SERVER_CERT}"))
            }
            other => tls_error(&key_path, other),
        })?;
        Ok(Tls {
            mode,
            credentials: Credentials::Certificates {
                config: Arc::new(config),
                verifies_clients,
            },
        })
    }

    /// Load nbdkit's pre-shared key file: `username:hexkey` lines (as GnuTLS's `psktool` writes
    /// them), the keys kept in secret memory. Clients then prove they hold their user's key; no
    /// certificates are involved. A missing or unreadable file, or a malformed line, is
    /// [`Error::Tls`], naming the file (and the line).
    pub fn load_psk(mode: TlsMode, file: &Path) -> Result<Tls, Error> {
        Ok(Tls {
            mode,
            credentials: Credentials::PreSharedKeys(psk::context(file)?),
        })
    }

    /// Whether clients may do without TLS.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// Whether clients must present a certificate signed by `ca-cert.pem` (or, with pre-shared
    /// keys, prove they hold one).
    pub fn verifies_clients(&self) -> bool {
        match self.credentials {
            Credentials::Certificates {
                verifies_clients, ..
            } => verifies_clients,
            Credentials::PreSharedKeys(_) => true,
        }
    }

    /// A new server session for one connection.
    fn session(&self) -> io::Result<Box<dyn ServerSession>> {
        Ok(match &self.credentials {
            Credentials::Certificates { config, .. } => {
                let mut session =
                    ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
                // Replies are sealed a chunk at a time and sent at once, so the buffers stay one
                // chunk large.
                session.set_buffer_limit(None);
                Box::new(session)
            }
            Credentials::PreSharedKeys(context) => Box::new(PskSession::new(context)?),
        })
    }
}

fn tls_error(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Tls {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let pem = fs::read(path).map_err(|e| tls_error(path, e))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(path, e))?;
    if certs.is_empty() {
        return Err(tls_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    let pem = Zeroizing::new(fs::read(path).map_err(|e| tls_error(path, e))?);
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        pem::Error::NoItemsFound => tls_error(path, "holds no PEM private key"),
        other => tls_error(path, other),
    })
}

/// A server's TLS session, driven in memory: the client's records in, its own records out.
trait ServerSession: Send {
    /// Take in `records` from the client (none: whatever is held already); the plaintext they
    /// carried goes to `data`. Advances the handshake while it runs. Returns whether the client
    /// has closed the session. After an error, [`take_records`](Self::take_records) holds the
    /// alert that says why.
    fn receive(&mut self, records: &[u8], data: &mut Vec<u8>) -> io::Result<bool>;
    /// Whether the handshake is still running.
    fn handshaking(&self) -> bool;
    /// Seal `data` for the client.
    fn send(&mut self, data: &[u8]) -> io::Result<()>;
    /// Seal a close_notify.
    fn close(&mut self);
    /// Move the records waiting to go to the client to the end of `out`.
    fn take_records(&mut self, out: &mut Vec<u8>) -> io::Result<()>;
}

impl ServerSession for ServerConnection {
    fn receive(&mut self, mut records: &[u8], data: &mut Vec<u8>) -> io::Result<bool> {
        loop {
            let state = self
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let at = data.len();
            data.resize(at + state.plaintext_bytes_to_read(), 0);
            self.reader().read_exact(&mut data[at..])?;
            if state.peer_has_closed() {
                return Ok(true);
            }
            if records.is_empty() || self.read_tls(&mut records)? == 0 {
                return Ok(false);
            }
        }
    }

    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }

    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        self.writer().write_all(data)
    }

    fn close(&mut self) {
        self.send_close_notify();
    }

    fn take_records(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.wants_write() {
            self.write_tls(out)?;
        }
        Ok(())
    }
}

/// A connection's TLS session, shared by the relay's two threads.
struct Session {
    tls: Mutex<Box<dyn ServerSession>>,
    /// The socket's write side. Whoever seals records takes it before letting go of `tls`, so
    /// records leave in the order they were sealed.
    socket_out: Mutex<Stream>,
}

impl Session {
    /// Run `f` on the session, then send the records it left to send (handshake messages, alerts,
    /// sealed data). An error is the socket's.
    fn with_tls<T>(&self, f: impl FnOnce(&mut dyn ServerSession) -> T) -> io::Result<T> {
        let mut tls = self.tls.lock().unwrap_or_else(PoisonError::into_inner);
        let out = f(tls.as_mut());
        let mut records = Vec::new();
        tls.take_records(&mut records)?;
        if !records.is_empty() {
            let mut socket = self
                .socket_out
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            drop(tls);
            socket.write_all(&records)?;
        }
        Ok(out)
    }
}

/// The relay's threads; [`Relay::wait`] returns once both have ended, the session closed.
pub(crate) struct Relay {
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    pub(crate) fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Run the TLS handshake on `socket` (the `NBD_REP_ACK` to STARTTLS already sent), within
/// `deadline` in all, then start the relay. Returns the plaintext side of the session. On
/// failure the socket is shut down (after the alert that says why, where TLS has one).
pub(crate) fn start(
    mut socket: Stream,
    tls: &Tls,
    deadline: Duration,
) -> io::Result<(Stream, Relay)> {
    let started = tls.session().and_then(|mut session| {
        let early = handshake(&mut socket, session.as_mut(), deadline)?;
        relay(socket.try_clone()?, session, early)
    });
    if started.is_err() {
        socket.shutdown();
    }
    started
}

/// Run the handshake to its end; the plaintext that came in with its last records.
fn handshake(
    socket: &mut Stream,
    session: &mut dyn ServerSession,
    deadline: Duration,
) -> io::Result<Vec<u8>> {
    // The socket's read timeout bounds each read; this bounds a client that trickles bytes.
    let end = Instant::now() + deadline;
    let mut records = vec![0u8; TLS_RECORD];
    let mut early = Vec::new();
    let mut n = 0;
    loop {
        let received = session.receive(&records[..n], &mut early);
        let mut out = Vec::new();
        session.take_records(&mut out)?;
        socket.write_all(&out)?;
        if received? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if !session.handshaking() {
            return Ok(early);
        }
        if Instant::now() > end {
            return Err(io::ErrorKind::TimedOut.into());
        }
        n = match socket.read(&mut records) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
    }
}

fn relay(
    socket: Stream,
    session: Box<dyn ServerSession>,
    early: Vec<u8>,
) -> io::Result<(Stream, Relay)> {
    // From here the plaintext side carries the handshake's timeouts; the client may idle between
    // requests as long as it likes.
    socket.set_read_timeout(None)?;
    let (plain, relay_end) = UnixStream::pair()?;
    let session = Arc::new(Session {
        tls: Mutex::new(session),
        socket_out: Mutex::new(socket.try_clone()?),
    });
    let inbound = {
        let (session, socket, to_plain) = (
            Arc::clone(&session),
            socket.try_clone()?,
            relay_end.try_clone()?,
        );
        thread::Builder::new()
            .name("nbd-tls-in".into())
            .spawn(move || inbound(&session, socket, to_plain, early))?
    };
    // Should this fail, the inbound thread ends once the caller shuts the socket down.
    let outbound = thread::Builder::new()
        .name("nbd-tls-out".into())
        .spawn(move || outbound(&session, relay_end, socket))?;
    Ok((
        Stream::Unix(plain),
        Relay {
            threads: vec![inbound, outbound],
        },
    ))
}

/// Client to server: open the records read from the socket and pass their plaintext on, after
/// `early`, what came with the handshake. Ends at the client's close_notify or hang-up, at a TLS
/// error (once the alert is out), or when the plaintext side is gone; the plaintext side then
/// reads the end of the stream.
fn inbound(session: &Session, mut socket: Stream, mut to_plain: UnixStream, early: Vec<u8>) {
    let mut records = vec![0u8; RELAY_CHUNK];
    let mut data = early;
    // The session may hold records that came with the handshake's last ones: open those first.
    let mut n = 0;
    loop {
        let opened = session.with_tls(|tls| tls.receive(&records[..n], &mut data));
        let Ok(Ok(closed)) = opened else {
            break;
        };
        if to_plain.write_all(&data).is_err() || closed {
            break;
        }
        data.clear();
        let Some(read) = read_some(&mut socket, &mut records) else {
            break;
        };
        n = read;
    }
    let _ = to_plain.shutdown(Shutdown::Write);
}

/// Read what has arrived, through interruptions; `None` at the end of the stream or an error.
fn read_some(from: &mut impl Read, buf: &mut [u8]) -> Option<usize> {
    loop {
        match from.read(buf) {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Server to client: seal what the plaintext side writes and send it. Ends when the plaintext
/// side closes (close_notify then goes out) or the socket fails; either way the socket is then
/// shut down, which ends [`inbound`] too.
fn outbound(session: &Session, mut from_plain: UnixStream, socket: Stream) {
    let mut data = vec![0u8; RELAY_CHUNK];
    while let Some(n) = read_some(&mut from_plain, &mut data) {
        match session.with_tls(|tls| tls.send(&data[..n])) {
            Ok(Ok(())) => {}
            _ => break,
        }
    }
    let _ = session.with_tls(|tls| tls.close());
    socket.shutdown();
    // A writer on the plaintext side gets an error now rather than a full buffer later.
    let _ = from_plain.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use sectorcrypt_testkit::pki::Pki;

    /// The one-line message of loading `dir`, which must fail.
    fn refusal(dir: &Path) -> String {
        let e = Tls::load(TlsMode::Require, dir).expect_err("refused");
        let message = e.to_string();
        assert_eq!(message.lines().count(), 1, "{message}");
        message
    }

    #[test]
    fn certificates_load_and_bad_files_are_named() {
        let root = sectorcrypt_testkit::scratch("nbd-tls-load");
        let pki = Pki::create(&root);
        let tls = Tls::load(TlsMode::On, &pki.server).unwrap();
        assert_eq!(tls.mode(), TlsMode::On);
        assert!(tls.verifies_clients());
        assert!(!Tls::load(TlsMode::Require, &pki.server_any_client)
            .unwrap()
            .verifies_clients());

        // Each broken file in turn, in a copy of the server's directory.
        let copy = |name: &str| {
            let d = root.join(name);
            fs::create_dir_all(&d).unwrap();
            for f in [CA_CERT, SERVER_CERT, SERVER_KEY] {
                fs::copy(pki.server.join(f), d.join(f)).unwrap();
            }
            d
        };
        let missing = root.join("nowhere");
        assert!(refusal(&missing).contains(&format!("{}: ", missing.join(SERVER_CERT).display())));
        let d = copy("not-pem");
        fs::write(d.join(SERVER_CERT), b"not a certificate").unwrap();
        assert!(refusal(&d).ends_with("server-cert.pem: holds no PEM certificate"));
        let d = copy("no-key");
        fs::copy(pki.server.join(SERVER_CERT), d.join(SERVER_KEY)).unwrap();
        assert!(refusal(&d).ends_with("server-key.pem: holds no PEM private key"));
        let d = copy("other-key");
        fs::copy(pki.client.join("client-key.pem"), d.join(SERVER_KEY)).unwrap();
        assert!(refusal(&d).ends_with("server-key.pem: does not match server-cert.pem"));
        let d = copy("bad-ca");
        fs::write(
            d.join(CA_CERT),
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(refusal(&d).contains("ca-cert.pem: "));
        fs::remove_dir_all(&root).unwrap();
    }
}
