//! Malformed and hostile NBD input against an in-process server: every exchange gets an error
//! reply or a closed connection, and afterwards a well-behaved client still reads back exactly
//! the data written before.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use sectorcrypt_nbd::proto::*;
use sectorcrypt_nbd::{Exports, Listen, Server, ServerOptions, StopHandle};
use sectorcrypt_storage::MemStorage;
use sectorcrypt_testkit::pattern;
use sectorcrypt_volume::kpio::KeyTable;
use sectorcrypt_volume::{Layout, Volume, VolumeOptions};

const SIZE: u64 = 4 << 20;

struct Harness {
    socket: PathBuf,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
    storage: Arc<MemStorage>,
}

impl Harness {
    fn start(name: &str, opts: VolumeOptions) -> Harness {
        let storage = Arc::new(MemStorage::new(vec![0; SIZE as usize + 4096]));
        let volume = Volume::with_layout(storage.clone(), layout(), &[3; 64], &opts).unwrap();
        Harness::serve(name, Arc::new(volume).into(), storage)
    }

    fn serve(name: &str, exports: Exports, storage: Arc<MemStorage>) -> Harness {
        let dir =
            std::env::temp_dir().join(format!("sectorcrypt-nbd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("nbd.sock");
        let server = Server::bind(
            &Listen::Unix(socket.clone()),
            exports,
            ServerOptions {
                export_name: "vol".into(),
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

    /// A connection in transmission, with or without structured replies.
    fn client(&self, structured: bool) -> Client {
        self.client_of(b"vol", structured)
    }

    /// A connection to the export `name` in transmission.
    fn client_of(&self, name: &[u8], structured: bool) -> Client {
        let mut s = self.greeted();
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

fn send_option(s: &mut UnixStream, option: u32, data: &[u8]) {
    let mut out = IHAVEOPT.to_be_bytes().to_vec();
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    s.write_all(&out).unwrap();
}

fn read_option_reply(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
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
fn assert_closed(s: &mut UnixStream) {
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
    s: UnixStream,
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
    let table =
        Arc::new(KeyTable::new(storage.clone(), layout(), &VolumeOptions::default(), 8).unwrap());
    for tag in [0u32, 5, 70000] {
        table.load(tag, &[tag as u8 + 1; 64]).unwrap();
    }
    let h = Harness::serve("kpio", Arc::clone(&table).into(), storage);
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
