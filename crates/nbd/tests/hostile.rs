//! Malformed and hostile NBD input against an in-process server: every exchange gets an error
//! reply or a closed connection, and afterwards a well-behaved client still reads back exactly
//! the data written before. The same goes for TLS: options before STARTTLS, garbage in and
//! around the TLS handshake and inside the session, clients the server must not trust, with
//! certificates and with pre-shared keys. And how many requests of one connection run at once.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openssl::ssl::{Ssl, SslContextBuilder, SslMethod, SslStream};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use sectorcrypt_nbd::proto::*;
use sectorcrypt_nbd::{Exports, Listen, Server, ServerOptions, StopHandle, Tls, TlsMode};
use sectorcrypt_storage::{MemStorage, Storage};
use sectorcrypt_testkit::pattern;
use sectorcrypt_testkit::pki::Pki;
use sectorcrypt_volume::kpio::KeyTable;
use sectorcrypt_volume::{Layout, Volume, VolumeOptions};

const SIZE: u64 = 4 << 20;

/// Anything a client talks through: a socket, or a TLS session over one.
trait Duplex: Read + Write {}
impl<T: Read + Write> Duplex for T {}

/// A client's TLS session over the Unix socket.
type TlsSession = StreamOwned<ClientConnection, UnixStream>;

/// The user and key of the pre-shared key servers.
const PSK_USER: &str = "alice";
const PSK: [u8; 32] = [0x5c; 32];

/// A harness's TLS: the server's mode and credentials, which well-behaved clients use.
enum Credentials {
    Certificates(TlsMode),
    /// `PSK_USER` with `PSK`.
    PreSharedKey(TlsMode),
}

/// What well-behaved clients of a TLS harness use.
enum ClientCredentials {
    Certificates(Pki),
    PreSharedKey,
}

struct Harness {
    socket: PathBuf,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
    storage: Arc<MemStorage>,
    /// With TLS, the clients' credentials: well-behaved clients start TLS.
    tls: Option<ClientCredentials>,
}

impl Harness {
    fn start(name: &str, opts: VolumeOptions) -> Harness {
        Harness::start_with(name, opts, None)
    }

    /// A server with TLS (`--tls on` or `require`), clients asked for certificates signed by the
    /// test CA. Well-behaved clients start TLS.
    fn start_tls(name: &str, mode: TlsMode) -> Harness {
        Harness::start_with(
            name,
            VolumeOptions::default(),
            Some(Credentials::Certificates(mode)),
        )
    }

    /// A server of a volume over `storage`, which wraps `memory` (what the harness checks).
    fn start_over(name: &str, storage: Arc<dyn Storage>, memory: Arc<MemStorage>) -> Harness {
        let volume =
            Volume::with_layout(storage, layout(), &[3; 64], &VolumeOptions::default()).unwrap();
        Harness::serve(name, Arc::new(volume).into(), memory, None)
    }

    fn start_with(name: &str, opts: VolumeOptions, tls: Option<Credentials>) -> Harness {
        let storage = Arc::new(MemStorage::new(vec![0; SIZE as usize + 4096]));
        let volume = Volume::with_layout(storage.clone(), layout(), &[3; 64], &opts).unwrap();
        Harness::serve(name, Arc::new(volume).into(), storage, tls)
    }

    fn serve(
        name: &str,
        exports: Exports,
        storage: Arc<MemStorage>,
        tls: Option<Credentials>,
    ) -> Harness {
        let dir =
            std::env::temp_dir().join(format!("sectorcrypt-nbd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("nbd.sock");
        let tls = tls.map(|credentials| match credentials {
            Credentials::Certificates(mode) => {
                let root = dir.join("pki");
                std::fs::create_dir_all(&root).unwrap();
                let pki = Pki::create(&root);
                let tls = Tls::load(mode, &pki.server).unwrap();
                (tls, ClientCredentials::Certificates(pki))
            }
            Credentials::PreSharedKey(mode) => {
                let file = dir.join("keys.psk");
                let line = format!("carol:00ff\n{PSK_USER}:{}\n", hex::encode(PSK));
                std::fs::write(&file, line).unwrap();
                let tls = Tls::load_psk(mode, &file).unwrap();
                (tls, ClientCredentials::PreSharedKey)
            }
        });
        let (tls, clients) = tls.unzip();
        let server = Server::bind(
            &Listen::Unix(socket.clone()),
            exports,
            ServerOptions {
                export_name: "vol".into(),
                tls,
                ..Default::default()
            },
        )
        .unwrap();
        let stop = server.stop_handle().unwrap();
        let thread = std::thread::spawn(move || server.run().unwrap());
        Harness {
            socket,
            stop,
            thread: Some(thread),
            storage,
            tls: clients,
        }
    }

    fn pki(&self) -> &Pki {
        match &self.tls {
            Some(ClientCredentials::Certificates(pki)) => pki,
            _ => panic!("a harness with certificates"),
        }
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// A connection past the greeting (client flags sent).
    fn greeted(&self) -> UnixStream {
        let mut s = self.connect();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        assert_eq!(be64(&greeting[0..8]), NBDMAGIC);
        assert_eq!(be64(&greeting[8..16]), IHAVEOPT);
        assert_eq!(
            be16(&greeting[16..18]),
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
        );
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        s
    }

    /// A connection past the greeting, over TLS (with the good client's certificates) if the
    /// harness has TLS.
    fn negotiating(&self) -> Box<dyn Duplex> {
        match &self.tls {
            Some(ClientCredentials::Certificates(pki)) => {
                Box::new(start_tls(self.greeted(), &pki.client).unwrap())
            }
            Some(ClientCredentials::PreSharedKey) => {
                Box::new(start_tls_psk(self.greeted(), PSK_USER, &PSK).unwrap())
            }
            None => Box::new(self.greeted()),
        }
    }

    /// A connection in transmission, with or without structured replies.
    fn client(&self, structured: bool) -> Client {
        self.client_of(b"vol", structured)
    }

    /// A connection to the export `name` in transmission.
    fn client_of(&self, name: &[u8], structured: bool) -> Client {
        let mut s = self.negotiating();
        if structured {
            send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(read_option_reply(&mut s).1, REP_ACK);
        }
        send_option(&mut s, OPT_GO, &go_data(name, &[INFO_BLOCK_SIZE]));
        let mut saw_size = false;
        loop {
            let (_, kind, data) = read_option_reply(&mut s);
            match kind {
                REP_INFO if be16(&data[0..2]) == INFO_EXPORT => {
                    assert_eq!(be64(&data[2..10]), SIZE);
                    saw_size = true;
                }
                REP_INFO => {}
                REP_ACK => break,
                other => panic!("unexpected reply {other:#x} to GO"),
            }
        }
        assert!(saw_size);
        Client {
            s,
            structured,
            cookie: 0,
        }
    }

    /// The server is still healthy: a fresh client reads `expect` at `offset`.
    fn check_data(&self, offset: u64, expect: &[u8]) {
        let mut c = self.client(false);
        assert_eq!(c.read(offset, expect.len() as u32).unwrap(), expect);
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(dir) = self.socket.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn option_bytes(option: u32, data: &[u8]) -> Vec<u8> {
    let mut out = IHAVEOPT.to_be_bytes().to_vec();
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

fn send_option(s: &mut impl Write, option: u32, data: &[u8]) {
    s.write_all(&option_bytes(option, data)).unwrap();
}

fn read_option_reply(s: &mut impl Read) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(be64(&h[0..8]), OPTION_REPLY_MAGIC);
    let mut data = vec![0u8; be32(&h[16..20]) as usize];
    s.read_exact(&mut data).unwrap();
    (be32(&h[8..12]), be32(&h[12..16]), data)
}

fn go_data(name: &[u8], infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name);
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// The server closed the connection (read sees the end; nothing else arrives).
fn assert_closed(s: &mut impl Read) {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => {}
        Ok(_) => panic!("the server sent more instead of closing"),
        Err(e) => assert_ne!(
            e.kind(),
            std::io::ErrorKind::WouldBlock,
            "the server neither replied nor closed"
        ),
    }
}

struct Client {
    s: Box<dyn Duplex>,
    structured: bool,
    cookie: u64,
}

impl Client {
    fn send(&mut self, kind: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> u64 {
        self.cookie += 1;
        let req = Request {
            flags,
            kind,
            cookie: self.cookie,
            offset,
            length,
        };
        self.s.write_all(&req.to_bytes()).unwrap();
        self.s.write_all(payload).unwrap();
        self.cookie
    }

    /// The error of a simple reply to `cookie`.
    fn simple_reply(&mut self, cookie: u64) -> u32 {
        let mut h = [0u8; SIMPLE_REPLY_LEN];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(be32(&h[0..4]), SIMPLE_REPLY_MAGIC);
        assert_eq!(be64(&h[8..16]), cookie);
        be32(&h[4..8])
    }

    fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        let cookie = self.send(CMD_READ, 0, offset, length, &[]);
        if !self.structured {
            let err = self.simple_reply(cookie);
            if err != 0 {
                return Err(err);
            }
            let mut data = vec![0u8; length as usize];
            self.s.read_exact(&mut data).unwrap();
            return Ok(data);
        }
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(be32(&h[0..4]), STRUCTURED_REPLY_MAGIC);
        assert_eq!(be16(&h[4..6]) & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
        assert_eq!(be64(&h[8..16]), cookie);
        let mut body = vec![0u8; be32(&h[16..20]) as usize];
        self.s.read_exact(&mut body).unwrap();
        match be16(&h[6..8]) {
            REPLY_TYPE_OFFSET_DATA => {
                assert_eq!(be64(&body[0..8]), offset);
                Ok(body[8..].to_vec())
            }
            REPLY_TYPE_NONE => Ok(Vec::new()),
            REPLY_TYPE_ERROR => Err(be32(&body[0..4])),
            t => panic!("unexpected chunk type {t}"),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> u32 {
        let cookie = self.send(CMD_WRITE, flags, offset, data.len() as u32, data);
        self.simple_reply(cookie)
    }

    fn command(&mut self, kind: u16, flags: u16, offset: u64, length: u32) -> u32 {
        let cookie = self.send(kind, flags, offset, length, &[]);
        self.simple_reply(cookie)
    }
}

fn layout() -> Layout {
    Layout {
        offset: 4096,
        size: SIZE,
        cipher: "aes-xts-plain64".into(),
        sector_size: 512,
        iv_offset: 0,
    }
}

#[test]
fn handshake_abuse_gets_errors_or_a_closed_connection() {
    let h = Harness::start("handshake", VolumeOptions::default());
    let data = pattern(64 * 1024, 1);
    assert_eq!(h.client(false).write(8192, &data, CMD_FLAG_FUA), 0);

    // Unknown client flags, and a client without fixed newstyle: dropped.
    for flags in [0x8000_0000u32, 0] {
        let mut s = h.connect();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        s.write_all(&flags.to_be_bytes()).unwrap();
        assert_closed(&mut s);
    }
    // A bad option magic: dropped.
    let mut s = h.greeted();
    s.write_all(&[0x55; 16]).unwrap();
    assert_closed(&mut s);
    // A huge option length: told why, then dropped.
    let mut s = h.greeted();
    let mut head = IHAVEOPT.to_be_bytes().to_vec();
    head.extend_from_slice(&OPT_GO.to_be_bytes());
    head.extend_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&head).unwrap();
    assert_eq!(read_option_reply(&mut s).1, REP_ERR_TOO_BIG);
    assert_closed(&mut s);
    // A truncated option, then the client vanishes.
    let mut s = h.greeted();
    let mut head = IHAVEOPT.to_be_bytes().to_vec();
    head.extend_from_slice(&OPT_GO.to_be_bytes());
    head.extend_from_slice(&100u32.to_be_bytes());
    head.extend_from_slice(&[0; 10]);
    s.write_all(&head).unwrap();
    drop(s);
    // Unknown options, malformed GO/INFO, unknown export, bad LIST and STRUCTURED_REPLY data
    // and meta contexts before structured replies: each an error, the connection goes on.
    let mut s = h.greeted();
    let cases: Vec<(u32, Vec<u8>, u32)> = vec![
        (0xdead, vec![1, 2, 3], REP_ERR_UNSUP),
        (OPT_GO, vec![0, 0, 0, 9, b'v'], REP_ERR_INVALID),
        (
            OPT_INFO,
            go_data(b"vol", &[1])[..9].to_vec(),
            REP_ERR_INVALID,
        ),
        (OPT_GO, go_data(b"other", &[]), REP_ERR_UNKNOWN),
        (OPT_LIST, vec![0], REP_ERR_INVALID),
        (OPT_STRUCTURED_REPLY, vec![0], REP_ERR_INVALID),
        (OPT_SET_META_CONTEXT, vec![0; 8], REP_ERR_INVALID),
        (OPT_STARTTLS, vec![], REP_ERR_POLICY),
    ];
    for (option, payload, want) in cases {
        send_option(&mut s, option, &payload);
        let (opt, kind, _) = read_option_reply(&mut s);
        assert_eq!((opt, kind), (option, want), "option {option:#x}");
    }
    // LIST names the export; INFO describes it without ending the handshake; GO then works.
    send_option(&mut s, OPT_LIST, &[]);
    let (_, kind, entry) = read_option_reply(&mut s);
    assert_eq!(kind, REP_SERVER);
    assert_eq!(&entry[4..4 + be32(&entry[0..4]) as usize], b"vol");
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    send_option(
        &mut s,
        OPT_INFO,
        &go_data(b"", &[INFO_BLOCK_SIZE, INFO_NAME]),
    );
    let mut infos = Vec::new();
    loop {
        let (_, kind, d) = read_option_reply(&mut s);
        if kind == REP_ACK {
            break;
        }
        assert_eq!(kind, REP_INFO);
        infos.push(d);
    }
    let sizes = infos
        .iter()
        .find(|d| be16(&d[0..2]) == INFO_BLOCK_SIZE)
        .expect("block sizes");
    assert_eq!(
        (
            be32(&sizes[2..6]),
            be32(&sizes[6..10]),
            be32(&sizes[10..14])
        ),
        (512, 4096, 32 << 20)
    );
    assert!(infos
        .iter()
        .any(|d| be16(&d[0..2]) == INFO_NAME && &d[2..] == b"vol"));
    // EXPORT_NAME with an unknown name: the protocol has no error reply, so it is dropped.
    send_option(&mut s, OPT_EXPORT_NAME, b"nope");
    assert_closed(&mut s);
    // EXPORT_NAME with the right name: size and flags, no zero padding (NO_ZEROES).
    let mut s = h.greeted();
    send_option(&mut s, OPT_EXPORT_NAME, b"vol");
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(be64(&reply[0..8]), SIZE);
    let flags = be16(&reply[8..10]);
    assert_eq!(flags & FLAG_CAN_MULTI_CONN, FLAG_CAN_MULTI_CONN);
    assert_eq!(flags & (FLAG_READ_ONLY | FLAG_SEND_TRIM), 0);
    // ABORT is acknowledged, then the server closes.
    let mut s = h.greeted();
    send_option(&mut s, OPT_ABORT, &[]);
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    assert_closed(&mut s);

    h.check_data(8192, &data);
}

#[test]
fn request_abuse_gets_errors_and_damages_nothing() {
    let h = Harness::start("requests", VolumeOptions::default());
    let data = pattern(256 * 1024, 2);
    let mut c = h.client(false);
    assert_eq!(c.write(0, &data, 0), 0);
    assert_eq!(c.command(CMD_FLUSH, 0, 0, 0), 0);

    // Past the end, overflowing, too large: errors, and the connection goes on.
    assert_eq!(c.read(SIZE - 100, 200), Err(EINVAL));
    assert_eq!(c.read(u64::MAX - 10, 100), Err(EINVAL));
    assert_eq!(c.read(0, (32 << 20) + 1), Err(EINVAL));
    assert_eq!(c.write(SIZE - 100, &[1; 200], 0), ENOSPC);
    assert_eq!(c.write(u64::MAX - 10, &[1; 100], 0), ENOSPC);
    assert_eq!(c.command(CMD_WRITE_ZEROES, 0, SIZE, 1), ENOSPC);
    // A write larger than the maximum payload: its payload is skipped, the stream stays in step.
    let big = vec![7u8; (32 << 20) + 512];
    assert_eq!(c.write(0, &big, 0), EINVAL);
    // Unknown command, unknown flags, TRIM while discards are off.
    assert_eq!(c.command(99, 0, 0, 0), EINVAL);
    assert_eq!(c.command(CMD_FLUSH, 0x4000, 0, 0), EINVAL);
    assert_eq!(c.write(0, &[9; 512], 0x4000), EINVAL);
    assert_eq!(c.command(CMD_TRIM, 0, 0, 4096), EINVAL);
    // Zero-length requests are harmless.
    assert_eq!(c.read(SIZE, 0), Ok(Vec::new()));
    assert_eq!(c.write(100, &[], 0), 0);
    // Still in step and nothing changed.
    assert_eq!(c.read(0, data.len() as u32).unwrap(), data);

    // A write whose payload never fully arrives changes nothing.
    let mut s = h.client(false);
    let req = Request {
        flags: 0,
        kind: CMD_WRITE,
        cookie: 1,
        offset: 0,
        length: 65536,
    };
    s.s.write_all(&req.to_bytes()).unwrap();
    s.s.write_all(&[0xee; 1000]).unwrap();
    drop(s);
    // A bad request magic closes that connection only.
    let mut s = h.client(false);
    s.s.write_all(&[0x11; REQUEST_LEN]).unwrap();
    assert_closed(&mut s.s);
    // Garbage after the handshake, and a truncated header.
    let mut s = h.client(true);
    s.s.write_all(&REQUEST_MAGIC.to_be_bytes()).unwrap();
    drop(s);

    assert_eq!(c.read(0, data.len() as u32).unwrap(), data);
    h.check_data(0, &data);
    // The storage holds ciphertext, not the data.
    let stored = h.storage.contents();
    assert_ne!(&stored[4096..4096 + 4096], &data[..4096]);
}

#[test]
fn structured_replies_unaligned_io_and_zeroes() {
    let h = Harness::start("structured", VolumeOptions::default());
    let mut c = h.client(true);
    let data = pattern(10_000, 3);
    // Unaligned write and read (read-modify-write of the edge sectors).
    assert_eq!(c.write(777, &data, CMD_FLAG_FUA), 0);
    assert_eq!(c.read(777, data.len() as u32).unwrap(), data);
    assert_eq!(c.read(0, 0), Ok(Vec::new()));
    assert_eq!(c.read(SIZE, 1), Err(EINVAL));
    // WRITE_ZEROES of an unaligned range inside the data.
    assert_eq!(c.command(CMD_WRITE_ZEROES, 0, 1000, 3000), 0);
    let mut expect = data.clone();
    expect[223..3223].fill(0);
    assert_eq!(c.read(777, data.len() as u32).unwrap(), expect);
    // Pipelined requests: several in flight, replies matched by cookie in any order.
    let mut cookies = Vec::new();
    for i in 0..16u64 {
        let chunk = pattern(4096, 100 + i);
        cookies.push(c.send(CMD_WRITE, 0, 1 << 20 | i << 12, 4096, &chunk));
    }
    let mut seen = Vec::new();
    for _ in 0..16 {
        let mut h = [0u8; SIMPLE_REPLY_LEN];
        c.s.read_exact(&mut h).unwrap();
        assert_eq!(be32(&h[4..8]), 0);
        seen.push(be64(&h[8..16]));
    }
    seen.sort_unstable();
    assert_eq!(seen, cookies);
    for i in 0..16u64 {
        assert_eq!(
            c.read(1 << 20 | i << 12, 4096).unwrap(),
            pattern(4096, 100 + i)
        );
    }
}

#[test]
fn read_only_and_discards() {
    let h = Harness::start(
        "readonly",
        VolumeOptions {
            read_only: true,
            ..Default::default()
        },
    );
    let before = h.storage.contents();
    let mut c = h.client(false);
    assert_eq!(c.write(0, &[1; 4096], 0), EPERM);
    assert_eq!(c.command(CMD_WRITE_ZEROES, 0, 0, 4096), EPERM);
    assert!(c.read(0, 4096).is_ok());
    assert_eq!(h.storage.contents(), before);

    let h = Harness::start(
        "discards",
        VolumeOptions {
            allow_discards: true,
            ..Default::default()
        },
    );
    let mut c = h.client(false);
    assert_eq!(c.write(0, &[5; 8192], 0), 0);
    assert_eq!(c.command(CMD_TRIM, 0, 0, 8192), 0);
    assert!(h.storage.contents()[4096..4096 + 8192]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn stopping_answers_what_was_read_and_flushes() {
    let mut h = Harness::start("stop", VolumeOptions::default());
    let mut c = h.client(false);
    let data = pattern(4096, 9);
    assert_eq!(c.write(4096, &data, 0), 0);
    h.stop.stop();
    h.thread.take().unwrap().join().unwrap();
    // The socket file is gone and the client's connection is closed.
    assert!(!h.socket.exists());
    assert_closed(&mut c.s);
}

/// The names a key-table server lists, one `NBD_REP_SERVER` each.
fn listed(h: &Harness) -> Vec<String> {
    let mut s = h.greeted();
    send_option(&mut s, OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let (_, kind, data) = read_option_reply(&mut s);
        match kind {
            REP_SERVER => {
                let len = be32(&data[0..4]) as usize;
                names.push(String::from_utf8(data[4..4 + len].to_vec()).unwrap());
            }
            REP_ACK => return names,
            other => panic!("unexpected reply {other:#x} to LIST"),
        }
    }
}

#[test]
fn key_table_exports_one_name_per_tag() {
    let storage = Arc::new(MemStorage::new(vec![0; SIZE as usize + 4096]));
    let table = Arc::new(
        KeyTable::new(storage.clone(), layout(), &VolumeOptions::default(), 70001).unwrap(),
    );
    for tag in [0u32, 5, 70000] {
        table.load(tag, &[tag as u8 + 1; 64]).unwrap();
    }
    let h = Harness::serve("kpio", Arc::clone(&table).into(), storage, None);
    assert_eq!(listed(&h), ["0", "5", "70000"]);

    // No default export, no unknown tag, no second spelling of a tag.
    for name in [&b""[..], b"vol", b"6", b"05"] {
        let mut s = h.greeted();
        send_option(&mut s, OPT_GO, &go_data(name, &[]));
        assert_eq!(read_option_reply(&mut s).1, REP_ERR_UNKNOWN, "{name:?}");
    }

    // The same offset under two keys: each connection reads what it wrote, and the store
    // holds the last write's ciphertext.
    let (a, b) = (pattern(8192, 21), pattern(8192, 22));
    let mut c5 = h.client_of(b"5", false);
    let mut c0 = h.client_of(b"0", true);
    assert_eq!(c5.write(65536, &a, 0), 0);
    assert_eq!(c5.read(65536, 8192).unwrap(), a);
    assert_eq!(c0.write(65536, &b, CMD_FLAG_FUA), 0);
    assert_eq!(c0.read(65536, 8192).unwrap(), b);
    assert_ne!(
        c5.read(65536, 8192).unwrap(),
        a,
        "tag 5 reads tag 0's data as noise"
    );
    assert_eq!(c5.write(65536, &a, 0), 0);

    // Evicted while connected: its requests fail with EIO, a flush still works, and other
    // tags go on.
    assert!(table.evict(5));
    assert_eq!(c5.read(65536, 8192), Err(EIO));
    assert_eq!(c5.write(0, &a, 0), EIO);
    assert_eq!(c5.command(CMD_WRITE_ZEROES, 0, 0, 4096), EIO);
    assert_eq!(c5.command(CMD_FLUSH, 0, 0, 0), 0);
    assert_eq!(c0.read(0, 4096).map(|d| d.len()), Ok(4096));
    assert_eq!(listed(&h), ["0", "70000"]);
    // Loaded again with the same key: the data written under it is back.
    table.load(5, &[6; 64]).unwrap();
    assert_eq!(c5.read(65536, 8192).unwrap(), a);
    // Destroyed and a new key under the tag: noise.
    assert!(table.destroy(5).unwrap());
    table.load(5, &[7; 64]).unwrap();
    assert_ne!(h.client_of(b"5", false).read(65536, 8192).unwrap(), a);
}

/// A TLS client with the certificates of `dir` (libnbd's layout): it trusts `ca-cert.pem` and
/// presents `client-cert.pem` if there is one.
fn tls_config(dir: &Path) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(dir.join("ca-cert.pem")).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let cert = dir.join("client-cert.pem");
    Arc::new(if cert.exists() {
        let chain = CertificateDer::pem_file_iter(&cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(dir.join("client-key.pem")).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    })
}

/// STARTTLS on a greeted connection (acknowledged), then the TLS handshake as the client
/// `dir` describes. Under TLS 1.3 the client is done before the server has checked its
/// certificate: a server's refusal can come with the first read instead.
fn start_tls(mut s: UnixStream, dir: &Path) -> io::Result<TlsSession> {
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s), (OPT_STARTTLS, REP_ACK, vec![]));
    let server = ServerName::try_from("localhost").unwrap();
    let mut tls = ClientConnection::new(tls_config(dir), server).unwrap();
    while tls.is_handshaking() {
        tls.complete_io(&mut s)?;
    }
    Ok(StreamOwned::new(tls, s))
}

/// STARTTLS on a greeted connection (acknowledged), then the TLS handshake with `user`'s
/// pre-shared `key`, as OpenSSL's client does it.
fn start_tls_psk(mut s: UnixStream, user: &str, key: &[u8]) -> io::Result<SslStream<UnixStream>> {
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s), (OPT_STARTTLS, REP_ACK, vec![]));
    let mut context = SslContextBuilder::new(SslMethod::tls_client()).unwrap();
    let (user, key) = (user.as_bytes().to_vec(), key.to_vec());
    context.set_psk_client_callback(move |_, _, identity, psk| {
        // The identity is NUL-terminated.
        identity[..user.len()].copy_from_slice(&user);
        identity[user.len()] = 0;
        psk[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let ssl = Ssl::new(&context.build()).unwrap();
    ssl.connect(s).map_err(io::Error::other)
}

/// A client whose TLS session the server refused: the handshake fails, or the first option
/// cannot be sent or gets no reply, only the end of the connection.
fn assert_refused(session: io::Result<TlsSession>) {
    let Ok(mut s) = session else { return };
    let sent = s.write_all(&option_bytes(OPT_LIST, &[]));
    if sent.and_then(|()| s.flush()).is_err() {
        return;
    }
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => {}
        Ok(_) => panic!("a refused client got a reply"),
        Err(e) => assert_ne!(e.kind(), io::ErrorKind::WouldBlock, "no refusal"),
    }
}

/// After STARTTLS, what the server sends before it closes is at most TLS alerts.
fn assert_alert_then_closed(s: &mut UnixStream) {
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert_ne!(e.kind(), io::ErrorKind::WouldBlock, "not closed"),
    }
    let mut at = 0;
    while at < rest.len() {
        assert_eq!(rest[at], 21, "only alert records: {rest:02x?}");
        at += 5 + usize::from(be16(&rest[at + 3..at + 5]));
    }
}

#[test]
fn tls_required_refuses_everything_before_starttls() {
    let h = Harness::start_tls("tls-require", TlsMode::Require);
    let data = pattern(64 * 1024, 31);
    assert_eq!(h.client(true).write(4096, &data, CMD_FLAG_FUA), 0);

    // Every option but STARTTLS and ABORT: NBD_REP_ERR_TLS_REQD, data and all, and the
    // connection goes on.
    let mut s = h.greeted();
    let cases: Vec<(u32, Vec<u8>)> = vec![
        (OPT_GO, go_data(b"vol", &[])),
        (OPT_INFO, go_data(b"", &[INFO_NAME])),
        (OPT_LIST, vec![]),
        (OPT_STRUCTURED_REPLY, vec![]),
        (OPT_LIST_META_CONTEXT, vec![0; 8]),
        (0xdead, vec![1, 2, 3]),
    ];
    for (option, payload) in &cases {
        send_option(&mut s, *option, payload);
        let (opt, kind, _) = read_option_reply(&mut s);
        assert_eq!(
            (opt, kind),
            (*option, REP_ERR_TLS_REQD),
            "option {option:#x}"
        );
    }
    // STARTTLS with data is invalid; ABORT is acknowledged.
    send_option(&mut s, OPT_STARTTLS, b"x");
    assert_eq!(read_option_reply(&mut s).1, REP_ERR_INVALID);
    send_option(&mut s, OPT_ABORT, &[]);
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    assert_closed(&mut s);
    // EXPORT_NAME before TLS has no error reply: the connection ends, with nothing sent.
    let mut s = h.greeted();
    send_option(&mut s, OPT_EXPORT_NAME, b"vol");
    assert_closed(&mut s);

    // Clients the server must not trust: no certificate, or one another CA signed; and a client
    // that does not trust the server gives up on its own. None gets a reply.
    let pki = h.pki();
    assert_refused(start_tls(h.greeted(), &pki.client_without_certificate));
    assert_refused(start_tls(h.greeted(), &pki.client_signed_by_another_ca));
    assert!(start_tls(h.greeted(), &pki.client_trusting_another_ca).is_err());

    // Over TLS: a second STARTTLS is invalid, and options work, with nothing kept from before.
    let mut s = start_tls(h.greeted(), &pki.client).unwrap();
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s).1, REP_ERR_INVALID);
    send_option(&mut s, OPT_LIST, &[]);
    assert_eq!(read_option_reply(&mut s).1, REP_SERVER);
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    send_option(&mut s, OPT_EXPORT_NAME, b"vol");
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(be64(&reply[0..8]), SIZE);

    h.check_data(4096, &data);
}

#[test]
fn tls_offered_lets_each_client_choose_and_forgets_plain_text_state() {
    let h = Harness::start_tls("tls-on", TlsMode::On);
    let data = pattern(32 * 1024, 32);
    // A plain-text client is served.
    let mut plain = {
        let mut s = h.greeted();
        send_option(&mut s, OPT_GO, &go_data(b"vol", &[]));
        loop {
            if read_option_reply(&mut s).1 == REP_ACK {
                break;
            }
        }
        Client {
            s: Box::new(s),
            structured: false,
            cookie: 0,
        }
    };
    assert_eq!(plain.write(0, &data, 0), 0);
    // Structured replies agreed in plain text are forgotten once TLS starts: meta contexts
    // then need them again.
    let mut s = h.greeted();
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    let mut s = start_tls(s, &h.pki().client).unwrap();
    let meta = [0u8; 8];
    send_option(&mut s, OPT_LIST_META_CONTEXT, &meta);
    assert_eq!(read_option_reply(&mut s).1, REP_ERR_INVALID);
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    send_option(&mut s, OPT_LIST_META_CONTEXT, &meta);
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    // A TLS client reads what the plain one wrote, with structured replies.
    assert_eq!(h.client(true).read(0, data.len() as u32).unwrap(), data);
}

#[test]
fn hostile_bytes_around_and_inside_tls_hurt_nobody() {
    let h = Harness::start_tls("tls-hostile", TlsMode::Require);
    let data = pattern(128 * 1024, 33);
    let mut c = h.client(false);
    assert_eq!(c.write(0, &data, 0), 0);

    let after_starttls = || {
        let mut s = h.greeted();
        send_option(&mut s, OPT_STARTTLS, &[]);
        assert_eq!(read_option_reply(&mut s).1, REP_ACK);
        s
    };
    // Not TLS at all where the ClientHello belongs: NBD options, text, zeros.
    for junk in [
        {
            let mut o = IHAVEOPT.to_be_bytes().to_vec();
            o.extend_from_slice(&OPT_GO.to_be_bytes());
            o.extend_from_slice(&0u32.to_be_bytes());
            o
        },
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        vec![0; 64],
    ] {
        let mut s = after_starttls();
        s.write_all(&junk).unwrap();
        assert_alert_then_closed(&mut s);
    }
    // A handshake record that claims more than TLS allows; a ClientHello cut short, then silence
    // from a client that hangs up; a record header alone.
    let mut s = after_starttls();
    // (One write: the server may hang up as soon as it has seen the header.)
    s.write_all(&[&[22, 3, 1, 0xff, 0xff][..], &[1; 512]].concat())
        .unwrap();
    assert_alert_then_closed(&mut s);
    let mut s = after_starttls();
    s.write_all(&[22, 3, 1, 0, 200, 1, 0, 0, 196, 3, 3])
        .unwrap();
    drop(s);
    let mut s = after_starttls();
    s.write_all(&[22, 3, 3]).unwrap();
    drop(s);
    // A good session, then a record whose authentication fails, then a valid-looking record
    // header of garbage: the server drops that connection only.
    let mut s = start_tls(h.greeted(), &h.pki().client).unwrap();
    send_option(&mut s, OPT_LIST, &[]);
    assert_eq!(read_option_reply(&mut s).1, REP_SERVER);
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    s.sock
        .write_all(&[&[23, 3, 3, 0, 40][..], &[0x5a; 40]].concat())
        .unwrap();
    assert_closed(&mut s);
    // Garbage NBD inside a good session: a bad request magic in transmission.
    let mut t = h.client(true);
    t.s.write_all(&[0x11; REQUEST_LEN]).unwrap();
    assert_closed(&mut t.s);
    // A session that vanishes mid-write, without close_notify: nothing is written.
    let mut t = h.client(false);
    let req = Request {
        flags: 0,
        kind: CMD_WRITE,
        cookie: 1,
        offset: 0,
        length: 65536,
    };
    t.s.write_all(&req.to_bytes()).unwrap();
    t.s.write_all(&[0xee; 1000]).unwrap();
    t.s.flush().unwrap();
    drop(t);

    // The first connection still works, and so do new ones; the data is intact.
    assert_eq!(c.read(0, data.len() as u32).unwrap(), data);
    h.check_data(0, &data);
}

#[test]
fn hostile_bytes_and_wrong_keys_against_pre_shared_keys_hurt_nobody() {
    let h = Harness::start_with(
        "tls-psk-hostile",
        VolumeOptions::default(),
        Some(Credentials::PreSharedKey(TlsMode::Require)),
    );
    let data = pattern(96 * 1024, 35);
    let mut c = h.client(true);
    assert_eq!(c.write(8192, &data, CMD_FLAG_FUA), 0);

    // Garbage where the ClientHello belongs, and a record header claiming too much.
    for junk in [
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        vec![0; 64],
        [&[22, 3, 1, 0xff, 0xff][..], &[1; 512]].concat(),
    ] {
        let mut s = h.greeted();
        send_option(&mut s, OPT_STARTTLS, &[]);
        assert_eq!(read_option_reply(&mut s).1, REP_ACK);
        s.write_all(&junk).unwrap();
        assert_alert_then_closed(&mut s);
    }
    // A wrong key, an unknown user: no session.
    assert!(start_tls_psk(h.greeted(), PSK_USER, &[0x5d; 32]).is_err());
    assert!(start_tls_psk(h.greeted(), "mallory", &PSK).is_err());
    // A good session, then a record whose authentication fails: that connection only is
    // dropped.
    let mut s = start_tls_psk(h.greeted(), PSK_USER, &PSK).unwrap();
    send_option(&mut s, OPT_LIST, &[]);
    assert_eq!(read_option_reply(&mut s).1, REP_SERVER);
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    s.get_mut()
        .write_all(&[&[23, 3, 3, 0, 40][..], &[0x5a; 40]].concat())
        .unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)), "still served");

    assert_eq!(c.read(8192, data.len() as u32).unwrap(), data);
    h.check_data(8192, &data);
}

#[test]
fn stopping_closes_tls_sessions() {
    let mut h = Harness::start_tls("tls-stop", TlsMode::Require);
    let mut c = h.client(false);
    let data = pattern(4096, 34);
    assert_eq!(c.write(8192, &data, 0), 0);
    // One client in transmission, one in the middle of option haggling over TLS, one that
    // started TLS and said nothing more.
    let mut haggling = start_tls(h.greeted(), &h.pki().client).unwrap();
    send_option(&mut haggling, OPT_LIST, &[]);
    assert_eq!(read_option_reply(&mut haggling).1, REP_SERVER);
    assert_eq!(read_option_reply(&mut haggling).1, REP_ACK);
    let mut silent = h.greeted();
    send_option(&mut silent, OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut silent).1, REP_ACK);

    h.stop.stop();
    h.thread.take().unwrap().join().unwrap();
    assert!(!h.socket.exists());
    assert_closed(&mut c.s);
    assert_closed(&mut haggling);
    assert_alert_then_closed(&mut silent);
    // What was written before the stop is on the storage, encrypted.
    let stored = h.storage.contents()[4096 + 8192..4096 + 8192 + 4096].to_vec();
    assert!(stored.iter().any(|&b| b != 0) && stored != data);
}

/// Storage that counts the reads and writes in progress at once. A read waits (up to a minute,
/// a hang detector) until `READERS` reads are in progress together; a write waits a moment for
/// company, so that writes beyond the server's limit would overlap if the server let them.
struct CountsInProgress {
    inner: Arc<MemStorage>,
    state: Mutex<InProgress>,
    changed: Condvar,
}

#[derive(Default)]
struct InProgress {
    reads: usize,
    /// Reads that found `READERS` in progress together: the barrier is open from then on.
    met: bool,
    writes: usize,
    most_writes: usize,
    syncs: usize,
}

/// Reads that must run at once: more than the writes allowed.
const READERS: usize = 8;

impl Storage for CountsInProgress {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut st = self.state.lock().unwrap();
        st.reads += 1;
        if st.reads >= READERS {
            st.met = true;
            self.changed.notify_all();
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while !st.met && Instant::now() < deadline {
            st = self
                .changed
                .wait_timeout(st, Duration::from_secs(1))
                .unwrap()
                .0;
        }
        let met = st.met;
        st.reads -= 1;
        drop(st);
        if !met {
            return Err(io::Error::other("reads never ran eight at once"));
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut st = self.state.lock().unwrap();
        st.writes += 1;
        st.most_writes = st.most_writes.max(st.writes);
        self.changed.notify_all();
        let deadline = Instant::now() + Duration::from_millis(300);
        while st.writes <= 4 && Instant::now() < deadline {
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        st.writes -= 1;
        drop(st);
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.state.lock().unwrap().syncs += 1;
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

impl CountsInProgress {
    fn over(memory: &Arc<MemStorage>) -> Arc<CountsInProgress> {
        Arc::new(CountsInProgress {
            inner: Arc::clone(memory),
            state: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    fn syncs(&self) -> usize {
        self.state.lock().unwrap().syncs
    }
}

#[test]
fn flush_and_fua_reach_the_storage_before_their_replies() {
    let memory = Arc::new(MemStorage::new(vec![0; SIZE as usize + 4096]));
    let counts = CountsInProgress::over(&memory);
    let h = Harness::start_over("syncs", Arc::clone(&counts) as Arc<dyn Storage>, memory);
    let mut c = h.client(false);
    assert_eq!(c.write(0, &pattern(4096, 1), 0), 0);
    let before = counts.syncs();
    assert_eq!(c.command(CMD_FLUSH, 0, 0, 0), 0);
    assert!(counts.syncs() > before, "a flush was answered unsynced");
    let before = counts.syncs();
    assert_eq!(c.write(4096, &pattern(4096, 2), CMD_FLAG_FUA), 0);
    assert!(counts.syncs() > before, "a FUA write was answered unsynced");
}

#[test]
fn many_reads_but_few_writes_of_one_connection_run_at_once() {
    let memory = Arc::new(MemStorage::new(vec![0; SIZE as usize + 4096]));
    let counts = CountsInProgress::over(&memory);
    let h = Harness::start_over(
        "in-progress",
        Arc::clone(&counts) as Arc<dyn Storage>,
        memory,
    );
    let defaults = ServerOptions::default();
    assert!(defaults.workers >= READERS && defaults.writers < READERS);
    let mut c = h.client(false);
    // Twelve pipelined writes: no more than the permits run at once.
    let cookies: Vec<u64> = (0..12u64)
        .map(|i| c.send(CMD_WRITE, 0, i << 12, 4096, &pattern(4096, i)))
        .collect();
    for _ in &cookies {
        let mut r = [0u8; SIMPLE_REPLY_LEN];
        c.s.read_exact(&mut r).unwrap();
        assert_eq!(be32(&r[4..8]), 0);
    }
    let most = counts.state.lock().unwrap().most_writes;
    assert!(
        (1..=defaults.writers).contains(&most),
        "{most} writes ran at once"
    );
    // Eight pipelined reads of the same: they all run at once, or none would finish.
    let cookies: Vec<u64> = (0..READERS as u64)
        .map(|i| c.send(CMD_READ, 0, i << 12, 4096, &[]))
        .collect();
    let mut got = std::collections::HashMap::new();
    for _ in &cookies {
        let mut r = [0u8; SIMPLE_REPLY_LEN];
        c.s.read_exact(&mut r).unwrap();
        assert_eq!(be32(&r[4..8]), 0, "a read failed: not {READERS} at once");
        let mut data = vec![0u8; 4096];
        c.s.read_exact(&mut data).unwrap();
        got.insert(be64(&r[8..16]), data);
    }
    for (i, cookie) in cookies.iter().enumerate() {
        assert_eq!(got[cookie], pattern(4096, i as u64));
    }
}

/// A device whose first half is in the "page cache": cached reads there are answered, elsewhere
/// declined. Once `pairs` is set, a read that waits (of the second half) waits until a second
/// one runs beside it.
struct HalfCached {
    inner: Arc<MemStorage>,
    state: Mutex<HalfCachedState>,
    changed: Condvar,
}

#[derive(Default)]
struct HalfCachedState {
    cached_answers: usize,
    declined: usize,
    waiting_reads: usize,
    pairs: bool,
    paired: bool,
}

impl HalfCached {
    const HALF: u64 = 4096 + SIZE / 2;

    fn state(&self) -> std::sync::MutexGuard<'_, HalfCachedState> {
        self.state.lock().unwrap()
    }
}

impl Storage for HalfCached {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut st = self.state();
        if st.pairs && offset + buf.len() as u64 > HalfCached::HALF {
            st.waiting_reads += 1;
            st.paired |= st.waiting_reads >= 2;
            self.changed.notify_all();
            // Long enough for a loaded host (a pair meets within milliseconds), short of the
            // client's 10 s timeout so that a failure names itself.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !st.paired && Instant::now() < deadline {
                st = self
                    .changed
                    .wait_timeout(st, Duration::from_millis(50))
                    .unwrap()
                    .0;
            }
            st.waiting_reads -= 1;
            if !st.paired {
                return Err(io::Error::other("a read waited alone: the socket was held"));
            }
        }
        drop(st);
        self.inner.read_at(buf, offset)
    }
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let mut st = self.state();
        if offset + buf.len() as u64 > HalfCached::HALF {
            st.declined += 1;
            return Ok(false);
        }
        st.cached_answers += 1;
        self.inner.read_at(buf, offset)?;
        Ok(true)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

#[test]
fn reads_from_the_cache_are_answered_at_once_and_reads_that_wait_let_the_socket_go() {
    let memory = Arc::new(MemStorage::new(vec![0; SIZE as usize + 4096]));
    let storage = Arc::new(HalfCached {
        inner: Arc::clone(&memory),
        state: Mutex::default(),
        changed: Condvar::new(),
    });
    let h = Harness::start_over("cached", Arc::clone(&storage) as Arc<dyn Storage>, memory);
    for structured in [false, true] {
        let mut c = h.client(structured);
        let data = pattern(SIZE as usize, structured as u64);
        for at in (0..SIZE).step_by(1 << 20) {
            assert_eq!(c.write(at, &data[at as usize..][..1 << 20], 0), 0);
        }
        // One at a time from the cached half: small reads answered from the cache, larger ones
        // handed on; all of them right.
        let before = storage.state().cached_answers;
        for (at, len) in [
            (0, 4096),
            (512, 512),
            (8192, 32 << 10),
            (SIZE / 2 - 4096, 4096),
            (65536, 64 << 10),
        ] {
            let got = c.read(at, len).unwrap();
            assert!(got == data[at as usize..][..len as usize], "{at} {len}");
        }
        assert_eq!(storage.state().cached_answers - before, 4);
        // Pipelined, across both halves: every reply right, matched by cookie.
        let reads: Vec<(u64, u64)> = (0..16u64)
            .map(|i| {
                (
                    c.send(CMD_READ, 0, i * (SIZE / 16), 4096, &[]),
                    i * (SIZE / 16),
                )
            })
            .collect();
        let mut got = std::collections::HashMap::new();
        for _ in &reads {
            let (cookie, body) = if structured {
                let mut h = [0u8; 20];
                c.s.read_exact(&mut h).unwrap();
                assert_eq!(be16(&h[6..8]), REPLY_TYPE_OFFSET_DATA);
                let mut body = vec![0u8; be32(&h[16..20]) as usize];
                c.s.read_exact(&mut body).unwrap();
                (be64(&h[8..16]), body[8..].to_vec())
            } else {
                let mut r = [0u8; SIMPLE_REPLY_LEN];
                c.s.read_exact(&mut r).unwrap();
                assert_eq!(be32(&r[4..8]), 0, "a pipelined read failed");
                let mut body = vec![0u8; 4096];
                c.s.read_exact(&mut body).unwrap();
                (be64(&r[8..16]), body)
            };
            got.insert(cookie, body);
        }
        for (cookie, at) in reads {
            assert!(got[&cookie] == data[at as usize..][..4096], "{at}");
        }
    }
    // A read of the other half waits for the disk: it is refused by the cache and lets the socket
    // go before it waits, so a second read sent only afterwards is read and runs beside it.
    let mut c = h.client(false);
    storage.state().pairs = true;
    let declined = storage.state().declined;
    let first = c.send(CMD_READ, 0, SIZE - 8192, 4096, &[]);
    while storage.state().waiting_reads == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = c.send(CMD_READ, 0, SIZE - 4096, 4096, &[]);
    let mut answered = Vec::new();
    for _ in 0..2 {
        let mut r = [0u8; SIMPLE_REPLY_LEN];
        c.s.read_exact(&mut r).unwrap();
        assert_eq!(
            be32(&r[4..8]),
            0,
            "a read waited alone: the socket was held"
        );
        let mut body = vec![0u8; 4096];
        c.s.read_exact(&mut body).unwrap();
        answered.push(be64(&r[8..16]));
    }
    answered.sort_unstable();
    assert_eq!(answered, [first, second]);
    assert!(storage.state().declined >= declined + 2);
}
