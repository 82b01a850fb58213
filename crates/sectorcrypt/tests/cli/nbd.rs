//! `sectorcrypt serve` against the real NBD clients (qemu-img, qemu-io, nbdinfo, nbdcopy, fio's
//! `nbd` engine) and checked from the outside: what goes in through NBD is decrypted again by
//! Python's `cryptography` and by `cryptsetup reencrypt --decrypt`, and what cryptsetup encrypted
//! in place comes out through NBD. Exit codes, busy sockets, read-only exports and SIGTERM are
//! checked on the running binary. A few checks need requests that libnbd and qemu refuse to send
//! (writes to a read-only export, writes smaller than the encryption sector); those use a minimal
//! NBD client over the Unix socket.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::Value;

use sectorcrypt_testkit::pattern;

use crate::common::{ok, p, python, sc, Scratch};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_sectorcrypt");

/// How long a server may take to exit after SIGTERM: a hang detector, not a speed check (it takes
/// milliseconds). It stays under the server's 30 s handshake timeout, so a server that waited for
/// a silent client before exiting would be caught.
const SERVER_DEADLINE: Duration = Duration::from_secs(20);

/// How long a server may take to start serving: a hang detector too, generous because unlocking
/// a keyslot that another tool calibrated on its own host (librbd's Argon2id: seconds and a GiB)
/// takes as long as this host is slow and busy.
const START_DEADLINE: Duration = Duration::from_secs(120);

/// How long any one client command may take.
pub(crate) const TOOL_DEADLINE: Duration = Duration::from_secs(60);

pub(crate) const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Scratch space, data and volumes
// ---------------------------------------------------------------------------------------------

/// A scratch folder for one test of this group (removed when it passes).
pub(crate) fn nbd_scratch(name: &str) -> Scratch {
    crate::common::scratch(&format!("nbd-{name}"))
}

/// Assert two byte strings are equal without printing megabytes: say where they first differ.
#[track_caller]
pub(crate) fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
    if actual == expected {
        return;
    }
    let first = actual
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .unwrap_or(actual.len().min(expected.len()));
    panic!(
        "{what}: {} bytes vs {} expected, first difference at byte {first} ({:#x})",
        actual.len(),
        expected.len(),
        first
    );
}

pub(crate) fn write_file(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

pub(crate) fn read_file(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

pub(crate) fn key_file(dir: &Path) -> PathBuf {
    let k = dir.join("pass.key");
    write_file(&k, b"nbd test passphrase");
    k
}

const FAST_PBKDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// A sparse `mib` MiB image formatted by sectorcrypt with `extra` options (a fast PBKDF).
pub(crate) fn format(dir: &Path, name: &str, mib: u64, key: &Path, extra: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    File::create(&img).unwrap().set_len(mib * MIB).unwrap();
    let mut args = vec!["format", "-q", "--key-file", p(key)];
    if !extra.contains(&"luks1") {
        args.extend(FAST_PBKDF);
    } else {
        args.extend(["--pbkdf-force-iterations", "1000"]);
    }
    args.extend(extra);
    args.push(p(&img));
    let out = sc(&args);
    assert!(
        out.status.success(),
        "format {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

/// The header as `sectorcrypt dump --json` prints it.
pub(crate) fn dump_json(header: &Path) -> Value {
    let out = sc(&["dump", "--json", p(header)]);
    assert!(
        out.status.success(),
        "dump --json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("dump --json is JSON")
}

/// (data offset in bytes, encryption sector size) of the volume whose header is `header`.
pub(crate) fn data_layout(header: &Path) -> (u64, u64) {
    let v = dump_json(header);
    if v["version"] == 1 {
        (v["payload_offset_bytes"].as_u64().unwrap(), 512)
    } else {
        let seg = &v["segments"]["0"];
        let offset = seg["offset"].as_str().unwrap().parse().unwrap();
        (offset, seg["sector_size"].as_u64().unwrap())
    }
}

/// The decrypted payload's size: the device's size less the data offset.
fn payload_size(device: &Path, header: &Path) -> u64 {
    std::fs::metadata(device).unwrap().len() - data_layout(header).0
}

/// The volume key, as hex, from `sectorcrypt dump --dump-volume-key --json`.
fn volume_key(header: &Path, key: &Path) -> String {
    let out = sc(&[
        "dump",
        "--dump-volume-key",
        "--json",
        "-q",
        "--key-file",
        p(key),
        p(header),
    ]);
    assert!(
        out.status.success(),
        "dump --dump-volume-key: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["volume_key"].as_str().unwrap().to_string()
}

// ---------------------------------------------------------------------------------------------
// Running things with a time limit
// ---------------------------------------------------------------------------------------------

/// Run `cmd` (no standard input) and collect its output; a command still running after
/// `deadline` is killed and the test fails, so a hung server fails a test instead of hanging it.
pub(crate) fn run_within(cmd: &mut Command, deadline: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (run scripts/install-test-deps.sh)"));
    let collect = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let stdout = collect(Box::new(child.stdout.take().unwrap()));
    let stderr = collect(Box::new(child.stderr.take().unwrap()));
    let status = wait_within(&mut child, deadline)
        .unwrap_or_else(|| panic!("{cmd:?} did not finish within {deadline:?}"));
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Wait for `child` at most `deadline`; past it, kill and reap it and return None.
pub(crate) fn wait_within(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Run a client tool and assert it succeeded.
pub(crate) fn tool(program: &str, args: &[&str]) -> Output {
    ok(
        run_within(Command::new(program).args(args), TOOL_DEADLINE),
        &format!("{program} {args:?}"),
    )
}

/// Run `sectorcrypt serve ARGS` expecting it to refuse: its exit code and stderr.
pub(crate) fn serve_refused(args: &[&str]) -> (Option<i32>, String) {
    let out = run_within(Command::new(BIN).arg("serve").args(args), START_DEADLINE);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

// ---------------------------------------------------------------------------------------------
// The server under test
// ---------------------------------------------------------------------------------------------

/// A running `sectorcrypt serve`. Dropping it sends SIGTERM and reaps it (SIGKILL if it does not
/// exit in time) without asserting anything; [`Served::stop`] is the checked way to end it.
pub(crate) struct Served {
    child: Child,
    /// The URI from the "serving" line.
    pub(crate) uri: String,
    /// The size from the "serving" line.
    pub(crate) size: u64,
    socket: Option<PathBuf>,
    log: PathBuf,
    done: bool,
    /// Run by a wrapper (strace): signals go to the wrapper's child, the server.
    wrapped: bool,
}

impl Served {
    /// Start `sectorcrypt serve ARGS` and wait until it says it is serving.
    pub(crate) fn start(dir: &Path, args: &[&str]) -> Served {
        Served::start_command(dir, &["serve"], args)
    }

    /// Start `sectorcrypt COMMAND ARGS` (a serving command) and wait until it says it is serving.
    pub(crate) fn start_command(dir: &Path, command: &[&str], args: &[&str]) -> Served {
        Served::start_until(dir, command, args, "sectorcrypt: serving ")
    }

    /// [`Served::start_command`] for a command whose line `READY... (SIZE bytes) at URI` says
    /// it is serving.
    pub(crate) fn start_until(dir: &Path, command: &[&str], args: &[&str], ready: &str) -> Served {
        let mut program = Command::new(BIN);
        program.args(command);
        Served::launch(dir, program, args, ready)
    }

    /// `program ARGS`: a serving command built by the caller (with an environment of its own),
    /// started as [`Served::start`].
    pub(crate) fn start_program(dir: &Path, program: Command, args: &[&str]) -> Served {
        Served::launch(dir, program, args, "sectorcrypt: serving ")
    }

    /// `sectorcrypt serve ARGS` run by `wrapper` (`strace ... --`), started as
    /// [`Served::start`].
    pub(crate) fn start_wrapped(dir: &Path, wrapper: &[&str], args: &[&str]) -> Served {
        let (first, rest) = wrapper.split_first().expect("a wrapper program");
        let mut program = Command::new(first);
        program.args(rest).args([BIN, "serve"]);
        let mut served = Served::launch(dir, program, args, "sectorcrypt: serving ");
        served.wrapped = true;
        served
    }

    fn launch(dir: &Path, mut program: Command, args: &[&str], ready: &str) -> Served {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("serve-{n}.log"));
        let socket = args
            .iter()
            .position(|a| *a == "--socket")
            .map(|i| PathBuf::from(args[i + 1]));
        let mut child = program
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("start sectorcrypt serve");
        let end = Instant::now() + START_DEADLINE;
        let line = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            // Only whole lines: stderr is unbuffered, so a line can be caught half-written.
            let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
            if let Some(l) = complete.lines().find(|l| l.starts_with(ready)) {
                break l.to_string();
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("serve {args:?} exited ({status}) before serving: {text}");
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve {args:?} did not start within {START_DEADLINE:?}: {text}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // "sectorcrypt: serving DEVICE (SIZE bytes) at URI", or another READY.
        let (head, uri) = line.rsplit_once(" at ").expect("serving line has a URI");
        let size = head
            .rsplit_once(" (")
            .and_then(|(_, s)| s.strip_suffix(" bytes)"))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no size in {line:?}"));
        if let Some(s) = &socket {
            let meta = std::fs::symlink_metadata(s).expect("the socket exists once serving");
            assert!(meta.file_type().is_socket(), "{} is a socket", s.display());
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket mode");
        }
        Served {
            child,
            uri: uri.to_string(),
            size,
            socket,
            log,
            done: false,
            wrapped: false,
        }
    }

    /// Serve `img` on the Unix socket `dir/NAME` (short, to stay within sun_path's limit).
    pub(crate) fn unix(dir: &Path, name: &str, img: &Path, key: &Path, extra: &[&str]) -> Served {
        let sock = dir.join(name);
        let mut args = vec![p(img), "--key-file", p(key), "--socket", p(&sock)];
        args.extend(extra);
        Served::start(dir, &args)
    }

    pub(crate) fn socket(&self) -> &Path {
        self.socket.as_deref().expect("a Unix socket server")
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM; the server must exit 0 within the deadline and remove its socket file.
    pub(crate) fn stop(self) {
        self.stop_with("-TERM");
    }

    /// [`Served::stop`] with another signal (`-INT`).
    fn stop_with(mut self, sig: &str) {
        self.done = true;
        let pid = if self.wrapped {
            self.wrapped_server().expect("the wrapper runs the server")
        } else {
            self.child.id()
        };
        signal(pid, sig);
        let status = wait_within(&mut self.child, SERVER_DEADLINE);
        let log = self.stderr();
        let status = status
            .unwrap_or_else(|| panic!("server did not exit within {SERVER_DEADLINE:?} of {sig}"));
        assert_eq!(status.code(), Some(0), "server exit after {sig}: {log}");
        if let Some(s) = &self.socket {
            assert!(
                std::fs::symlink_metadata(s).is_err(),
                "{} still exists after the server stopped",
                s.display()
            );
        }
    }

    /// SIGKILL: no clean-up at all (leaves a stale socket file).
    pub(crate) fn kill(mut self) {
        self.done = true;
        if self.wrapped {
            // A wrapper killed first would leave its server running, detached from it: kill
            // the server, and let the wrapper end by itself (strace writes out its trace).
            if let Some(server) = self.wrapped_server() {
                signal(server, "-KILL");
            }
            if wait_within(&mut self.child, SERVER_DEADLINE).is_some() {
                return;
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server a wrapper runs, while it runs.
    fn wrapped_server(&self) -> Option<u32> {
        let children = format!("/proc/{0}/task/{0}/children", self.child.id());
        let list = std::fs::read_to_string(children).unwrap_or_default();
        list.split_whitespace().next().and_then(|p| p.parse().ok())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if !self.done {
            signal(self.child.id(), "-TERM");
            if wait_within(&mut self.child, SERVER_DEADLINE).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

/// The NBD URI of a Unix socket (the default export).
fn unix_uri(sock: &Path) -> String {
    format!("nbd+unix:///?socket={}", sock.display())
}

/// qemu's image options for `len` bytes at `offset` of the export on `sock`.
fn qemu_window(sock: &Path, offset: u64, len: u64) -> String {
    format!(
        "driver=raw,offset={offset},size={len},file.driver=nbd,file.server.type=unix,file.server.path={}",
        sock.display()
    )
}

/// The whole export, read with nbdcopy into `dir/NAME`.
fn read_export(dir: &Path, uri: &str, name: &str) -> Vec<u8> {
    let out = dir.join(name);
    tool("nbdcopy", &[uri, p(&out)]);
    let bytes = read_file(&out);
    let _ = std::fs::remove_file(&out);
    bytes
}

/// `nbdinfo --json` of the one export at `uri`.
fn nbdinfo(uri: &str) -> Value {
    let out = tool("nbdinfo", &["--json", uri]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("nbdinfo --json is JSON");
    v["exports"][0].clone()
}

// ---------------------------------------------------------------------------------------------
// A minimal NBD client, for requests the real clients refuse to send
// ---------------------------------------------------------------------------------------------

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_FLAG_FUA: u16 = 1;
const FLAG_READ_ONLY: u16 = 1 << 1;
const FLAG_SEND_TRIM: u16 = 1 << 5;
const EPERM: u32 = 1;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;

/// One connection past the handshake (`NBD_OPT_EXPORT_NAME`, simple replies only).
struct RawNbd {
    s: UnixStream,
    size: u64,
    flags: u16,
    cookie: u64,
}

impl RawNbd {
    /// Connect and read the greeting only (the handshake is left hanging).
    fn greeted(sock: &Path) -> UnixStream {
        let mut s = UnixStream::connect(sock).expect("connect to the server");
        s.set_read_timeout(Some(TOOL_DEADLINE)).unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).expect("greeting");
        assert_eq!(
            u64::from_be_bytes(greeting[0..8].try_into().unwrap()),
            NBDMAGIC
        );
        assert_eq!(
            u64::from_be_bytes(greeting[8..16].try_into().unwrap()),
            IHAVEOPT
        );
        s
    }

    fn connect(sock: &Path) -> RawNbd {
        let mut s = RawNbd::greeted(sock);
        // Fixed newstyle, no zeroes; then NBD_OPT_EXPORT_NAME with the empty (default) name.
        s.write_all(&3u32.to_be_bytes()).unwrap();
        let mut opt = IHAVEOPT.to_be_bytes().to_vec();
        opt.extend_from_slice(&1u32.to_be_bytes());
        opt.extend_from_slice(&0u32.to_be_bytes());
        s.write_all(&opt).unwrap();
        let mut export = [0u8; 10];
        s.read_exact(&mut export).expect("export size and flags");
        RawNbd {
            s,
            size: u64::from_be_bytes(export[0..8].try_into().unwrap()),
            flags: u16::from_be_bytes(export[8..10].try_into().unwrap()),
            cookie: 0,
        }
    }

    /// Send one request and wait for its reply: (error, data read).
    fn request(&mut self, kind: u16, offset: u64, len: u32, payload: &[u8]) -> (u32, Vec<u8>) {
        self.request_with(kind, 0, offset, len, payload)
    }

    /// [`RawNbd::request`] with command flags.
    fn request_with(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> (u32, Vec<u8>) {
        self.cookie += 1;
        let mut req = Vec::with_capacity(28 + payload.len());
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&flags.to_be_bytes());
        req.extend_from_slice(&kind.to_be_bytes());
        req.extend_from_slice(&self.cookie.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&len.to_be_bytes());
        req.extend_from_slice(payload);
        self.s.write_all(&req).expect("send request");
        let mut reply = [0u8; 16];
        self.s.read_exact(&mut reply).expect("reply");
        assert_eq!(
            u32::from_be_bytes(reply[0..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        assert_eq!(
            u64::from_be_bytes(reply[8..16].try_into().unwrap()),
            self.cookie,
            "reply cookie"
        );
        let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
        let mut data = Vec::new();
        if kind == CMD_READ && error == 0 {
            data.resize(len as usize, 0);
            self.s.read_exact(&mut data).expect("read payload");
        }
        (error, data)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.request(CMD_WRITE, offset, data.len() as u32, data).0
    }

    /// A read that must succeed.
    fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        let (error, data) = self.request(CMD_READ, offset, len, &[]);
        assert_eq!(error, 0, "read of {len} bytes at {offset}");
        data
    }

    fn disconnect(mut self) {
        self.cookie += 1;
        let mut req = Vec::with_capacity(28);
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&0u16.to_be_bytes());
        req.extend_from_slice(&CMD_DISC.to_be_bytes());
        req.extend_from_slice(&self.cookie.to_be_bytes());
        req.extend_from_slice(&[0u8; 12]);
        let _ = self.s.write_all(&req);
    }
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

/// 1. qemu-img writes a raw file into the export and reads it back out; a zero run in the file
///    goes over as NBD_CMD_WRITE_ZEROES and must replace the data that was there. `qemu-img info`
///    reports the payload size.
#[test]
fn qemu_img_converts_in_and_out_and_reports_the_payload_size() {
    let dir = nbd_scratch("qemu-img");
    let key = key_file(&dir);
    let img = format(&dir, "v", 64, &key, &["--sector-size", "4096"]);
    let size = payload_size(&img, &img);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    assert_eq!(server.size, size, "size in the serving line");
    assert_eq!(server.uri, unix_uri(server.socket()));

    let info = tool("qemu-img", &["info", "--output=json", &server.uri]);
    let info: Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["virtual-size"].as_u64(), Some(size), "qemu-img info");

    // First fill the start with other data, so that zeroes have something to replace.
    let noise = dir.join("noise.raw");
    write_file(&noise, &pattern((16 * MIB) as usize, 10));
    tool("nbdcopy", &[p(&noise), &server.uri]);

    let mut data = pattern((16 * MIB) as usize, 11);
    data[(5 * MIB) as usize..(7 * MIB) as usize].fill(0);
    let src = dir.join("data.raw");
    write_file(&src, &data);
    tool(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            p(&src),
            &server.uri,
        ],
    );
    let back = dir.join("back.raw");
    tool(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &server.uri, p(&back)],
    );
    let back = read_file(&back);
    assert_eq!(back.len() as u64, size, "the whole export came back");
    assert_same(&back[..data.len()], &data, "qemu-img convert out");
    server.stop();
}

/// 2. nbdinfo sees the payload size, the block sizes (minimum = the encryption sector) and the
///    flags each option turns on.
#[test]
fn nbdinfo_reports_size_block_sizes_and_flags() {
    let dir = nbd_scratch("nbdinfo");
    let key = key_file(&dir);
    for sector in [512u64, 4096] {
        let img = format(
            &dir,
            &format!("v{sector}"),
            48,
            &key,
            &["--sector-size", &sector.to_string()],
        );
        let (offset, sector_in_header) = data_layout(&img);
        assert_eq!(sector_in_header, sector);
        let size = 48 * MIB - offset;
        for (extra, read_only, trim) in [
            (&[][..], false, false),
            (&["--allow-discards"][..], false, true),
            (&["--readonly"][..], true, false),
        ] {
            let what = format!("{sector}-byte sectors, {extra:?}");
            let server = Served::unix(&dir, "s.sock", &img, &key, extra);
            let e = nbdinfo(&server.uri);
            assert_eq!(e["export-size"].as_u64(), Some(size), "{what}: size");
            assert_eq!(
                e["block_size_minimum"].as_u64(),
                Some(sector),
                "{what}: minimum"
            );
            let preferred = e["block_size_preferred"].as_u64().unwrap();
            assert!(
                preferred >= 4096 && preferred >= sector,
                "{what}: preferred {preferred}"
            );
            assert_eq!(
                e["block_size_maximum"].as_u64(),
                Some(32 * MIB),
                "{what}: maximum"
            );
            assert_eq!(e["can_multi_conn"], true, "{what}: multi-conn");
            assert_eq!(e["can_flush"], true, "{what}: flush");
            assert_eq!(e["can_fua"], true, "{what}: fua");
            assert_eq!(e["can_trim"], trim, "{what}: trim");
            assert_eq!(e["is_read_only"], read_only, "{what}: read-only");
            if !read_only {
                assert_eq!(e["can_zero"], true, "{what}: write zeroes");
            }
            server.stop();
        }
    }
    // A named export answers to its name and to the default (empty) name.
    let img = dir.join("v4096.img");
    let server = Served::unix(&dir, "n.sock", &img, &key, &["--export-name", "vol"]);
    assert_eq!(
        server.uri,
        format!("nbd+unix:///vol?socket={}", server.socket().display())
    );
    let named = nbdinfo(&server.uri);
    assert_eq!(named["export-name"], "vol");
    assert_eq!(
        named["export-size"].as_u64(),
        Some(payload_size(&img, &img))
    );
    let default = nbdinfo(&unix_uri(server.socket()));
    assert_eq!(default["export-size"], named["export-size"]);
    let wrong = run_within(
        Command::new("nbdinfo").arg(format!(
            "nbd+unix:///other?socket={}",
            server.socket().display()
        )),
        TOOL_DEADLINE,
    );
    assert!(!wrong.status.success(), "an unknown export name is refused");
    server.stop();
}

/// 3. nbdcopy with four connections in and out.
#[test]
fn nbdcopy_with_four_connections_copies_in_and_out() {
    let dir = nbd_scratch("nbdcopy");
    let key = key_file(&dir);
    let img = format(&dir, "v", 64, &key, &["--sector-size", "4096"]);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    let data = pattern((40 * MIB) as usize, 3);
    let src = dir.join("in.raw");
    write_file(&src, &data);
    tool(
        "nbdcopy",
        &["--connections", "4", "--flush", p(&src), &server.uri],
    );
    let out = dir.join("out.raw");
    tool("nbdcopy", &["--connections", "4", &server.uri, p(&out)]);
    let back = read_file(&out);
    assert_eq!(back.len() as u64, server.size);
    assert_same(&back[..data.len()], &data, "nbdcopy out");
    server.stop();
}

/// fio's normal output for `jobs` jobs: every job ended with `err= 0`, wrote something, and no
/// verification complaint appears anywhere.
pub(crate) fn check_fio(out: &Output, jobs: usize, what: &str) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what}: fio failed: {text}");
    let results: Vec<&str> = text.lines().filter(|l| l.contains("(groupid=")).collect();
    assert_eq!(results.len(), jobs, "{what}: one result per job: {text}");
    for r in &results {
        assert!(r.contains("err= 0"), "{what}: {r}\n{text}");
    }
    assert!(
        !text.to_lowercase().contains("verify"),
        "{what}: verification complaint: {text}"
    );
    let writes: Vec<u64> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("issued rwts: total="))
        .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(writes.len(), jobs, "{what}: {text}");
    assert!(
        writes.iter().all(|&w| w > 0),
        "{what}: a job wrote nothing: {text}"
    );
}

/// 4. fio's nbd engine: random 70/30 reads and writes of mixed sizes from four jobs (four
///    connections) on disjoint ranges, iodepth 16, each write checked with crc32c. libnbd only
///    sends requests aligned to the advertised minimum, so the sizes start at the sector size.
#[test]
fn fio_randrw_with_crc32c_verify_passes() {
    let dir = nbd_scratch("fio");
    let key = key_file(&dir);
    for (sector, bsrange, threads) in [(512u64, "512-64k", "1"), (4096, "4k-128k", "2")] {
        let img = format(
            &dir,
            &format!("v{sector}"),
            64,
            &key,
            &["--sector-size", &sector.to_string()],
        );
        let server = Served::unix(&dir, "s.sock", &img, &key, &["--threads", threads]);
        let jobs = 4;
        let per_job = 10 * MIB;
        assert!(jobs * per_job <= server.size);
        let mut job = format!(
            "[global]\nioengine=nbd\nuri={}\nrw=randrw\nrwmixread=70\nbsrange={bsrange}\n\
             iodepth=16\nsize={per_job}\nverify=crc32c\ndo_verify=1\nverify_fatal=1\n\
             verify_state_save=0\nrandrepeat=0\n",
            server.uri
        );
        for j in 0..jobs {
            job.push_str(&format!("[job{j}]\noffset={}\n", j * per_job));
        }
        let file = dir.join(format!("randrw-{sector}.fio"));
        write_file(&file, job.as_bytes());
        let out = run_within(
            Command::new("fio")
                .arg("--output-format=normal")
                .arg(&file)
                .current_dir(&*dir),
            TOOL_DEADLINE,
        );
        check_fio(&out, jobs as usize, &format!("{sector}-byte sectors"));
        server.stop();
    }
}

/// The payload bytes [`offset`, `offset + len`) of the volume, decrypted by Python's
/// `cryptography` from the image with AES-XTS: the tweak of each encryption sector is its
/// offset in the payload in 512-byte units, little-endian (LUKS2 counts IVs in 512-byte units
/// whatever the sector size).
pub(crate) fn python_decrypt(
    dir: &Path,
    image: &Path,
    data_offset: u64,
    sector: u64,
    key_hex: &str,
    offset: u64,
    len: u64,
) -> Vec<u8> {
    const SCRIPT: &str = r#"
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
key = bytes.fromhex(sys.argv[1])
image, data_offset, sector, offset, length, out = sys.argv[2], *map(int, sys.argv[3:7]), sys.argv[7]
assert offset % sector == 0 and length % sector == 0
with open(image, "rb") as f:
    f.seek(data_offset + offset)
    data = f.read(length)
assert len(data) == length
plain = bytearray()
for i in range(0, length, sector):
    iv = (offset + i) // 512
    d = Cipher(algorithms.AES(key), modes.XTS(iv.to_bytes(16, "little"))).decryptor()
    plain += d.update(data[i:i + sector]) + d.finalize()
with open(out, "wb") as f:
    f.write(plain)
"#;
    let out = dir.join("python-plain.raw");
    let res = run_within(
        Command::new(python()).args([
            "-c",
            SCRIPT,
            key_hex,
            p(image),
            &data_offset.to_string(),
            &sector.to_string(),
            &offset.to_string(),
            &len.to_string(),
            p(&out),
        ]),
        TOOL_DEADLINE,
    );
    assert!(
        res.status.success(),
        "python AES-XTS: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    read_file(&out)
}

/// 5. A pattern written through NBD at an offset is, once the server has stopped, exactly what
///    an independent AES-XTS implementation decrypts from the image with the volume key.
#[test]
fn data_written_over_nbd_decrypts_independently_with_python_aes_xts() {
    let dir = nbd_scratch("python-xts");
    let key = key_file(&dir);
    for (name, extra) in [
        ("l2-512", &["--sector-size", "512"][..]),
        ("l2-4096", &["--sector-size", "4096"][..]),
        ("l1", &["--type", "luks1"][..]),
    ] {
        let img = format(&dir, name, 32, &key, extra);
        let (data_offset, sector) = data_layout(&img);
        let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
        assert_eq!(server.size, 32 * MIB - data_offset, "{name}: payload size");
        let (offset, len) = (MIB + 3 * 4096, 3 * MIB);
        let data = pattern(len as usize, 5);
        let src = dir.join("pattern.raw");
        write_file(&src, &data);
        tool(
            "qemu-io",
            &[
                "-f",
                "raw",
                "-c",
                &format!("write -s {} {offset} {len}", p(&src)),
                &server.uri,
            ],
        );
        server.stop();
        let on_disk = read_file(&img);
        let start = (data_offset + offset) as usize;
        assert!(
            on_disk[start..start + len as usize] != data[..],
            "{name}: the pattern is stored encrypted"
        );
        let vk = volume_key(&img, &key);
        assert_eq!(vk.len(), 128, "{name}: a 512-bit XTS key");
        let plain = python_decrypt(&dir, &img, data_offset, sector, &vk, offset, len);
        assert_same(&plain, &data, &format!("{name}: decrypted by Python"));
    }
}

/// 6. A volume with a detached header: what went in through NBD is what
///    `cryptsetup reencrypt --decrypt` leaves in the data file (data offset 0).
#[test]
fn detached_header_volume_decrypts_with_cryptsetup_reencrypt() {
    let dir = nbd_scratch("detached");
    let key = key_file(&dir);
    let data_img = dir.join("data.img");
    File::create(&data_img).unwrap().set_len(32 * MIB).unwrap();
    let hdr = dir.join("hdr.img");
    let mut args = vec!["format", "-q", "--key-file", p(&key), "--header", p(&hdr)];
    args.extend(FAST_PBKDF);
    args.extend(["--sector-size", "4096", p(&data_img)]);
    let out = sc(&args);
    assert!(
        out.status.success(),
        "format --header: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(data_layout(&hdr), (0, 4096), "detached: data at offset 0");
    let data_before = read_file(&data_img);
    assert!(
        data_before.iter().all(|&b| b == 0),
        "format --header wrote nothing to the data device"
    );

    let server = Served::unix(&dir, "s.sock", &data_img, &key, &["--header", p(&hdr)]);
    assert_eq!(server.size, 32 * MIB, "the whole data file is payload");
    let data = pattern((20 * MIB) as usize, 6);
    let src = dir.join("pattern.raw");
    write_file(&src, &data);
    tool("nbdcopy", &[p(&src), &server.uri]);
    server.stop();

    let out = run_within(
        Command::new("cryptsetup").args([
            "reencrypt",
            "--decrypt",
            "--force-offline-reencrypt",
            "--header",
            p(&hdr),
            p(&data_img),
            "--key-file",
            p(&key),
            "--batch-mode",
        ]),
        TOOL_DEADLINE,
    );
    assert!(
        out.status.success(),
        "cryptsetup reencrypt --decrypt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = read_file(&data_img);
    assert_eq!(plain.len() as u64, 32 * MIB);
    assert_same(&plain[..data.len()], &data, "decrypted by cryptsetup");
}

/// 7. cryptsetup encrypts a file in place (moving the data behind a new LUKS2 header); served
///    here, the first `size - 32 MiB` bytes are the original data.
#[test]
fn cryptsetup_in_place_encryption_serves_the_original_data() {
    let dir = nbd_scratch("encrypt");
    let key = key_file(&dir);
    let img = dir.join("plain.img");
    let original = pattern((64 * MIB) as usize, 7);
    write_file(&img, &original);
    let out = run_within(
        Command::new("cryptsetup").args([
            "reencrypt",
            "--encrypt",
            "--type",
            "luks2",
            "--reduce-device-size",
            "32M",
            "--force-offline-reencrypt",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            p(&key),
            "--batch-mode",
            p(&img),
        ]),
        TOOL_DEADLINE,
    );
    assert!(
        out.status.success(),
        "cryptsetup reencrypt --encrypt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (data_offset, _) = data_layout(&img);
    let server = Served::unix(&dir, "s.sock", &img, &key, &["--readonly"]);
    assert_eq!(server.size, 64 * MIB - data_offset);
    let back = read_export(&dir, &server.uri, "out.raw");
    server.stop();
    let kept = (64 * MIB - 32 * MIB) as usize;
    assert_same(&back[..kept], &original[..kept], "in-place encrypted data");
}

/// 8a. Refusals: a wrong passphrase (2), a missing or non-LUKS device (4), a socket path that is a
///     regular file or has a live server (5). Nothing is created or changed, and the live server
///     keeps serving. A stale socket left by a killed server is replaced.
#[test]
fn refused_starts_have_exit_codes_and_leave_everything_alone() {
    let dir = nbd_scratch("refused");
    let key = key_file(&dir);
    let wrong = dir.join("wrong.key");
    write_file(&wrong, b"not the passphrase");
    let img = format(&dir, "v", 32, &key, &[]);
    let before = read_file(&img);
    let sock = dir.join("s.sock");

    let (code, err) = serve_refused(&[p(&img), "--key-file", p(&wrong), "--socket", p(&sock)]);
    assert_eq!(code, Some(2), "wrong passphrase: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(std::fs::symlink_metadata(&sock).is_err(), "no socket made");

    let missing = dir.join("missing.img");
    let (code, err) = serve_refused(&[p(&missing), "--key-file", p(&key), "--socket", p(&sock)]);
    assert_eq!(code, Some(4), "missing device: {err}");
    assert!(!missing.exists() && std::fs::symlink_metadata(&sock).is_err());

    let zeros = dir.join("zeros.img");
    File::create(&zeros).unwrap().set_len(8 * MIB).unwrap();
    let (code, err) = serve_refused(&[p(&zeros), "--key-file", p(&key), "--socket", p(&sock)]);
    assert_eq!(code, Some(4), "not LUKS: {err}");
    assert!(std::fs::symlink_metadata(&sock).is_err());

    let regular = dir.join("regular");
    write_file(&regular, b"not a socket\n");
    let (code, err) = serve_refused(&[p(&img), "--key-file", p(&key), "--socket", p(&regular)]);
    assert_eq!(code, Some(5), "regular file at the socket path: {err}");
    assert_eq!(
        read_file(&regular),
        b"not a socket\n",
        "the file is untouched"
    );

    let first = Served::unix(&dir, "s.sock", &img, &key, &[]);
    let (code, err) = serve_refused(&[p(&img), "--key-file", p(&key), "--socket", p(&sock)]);
    assert_eq!(code, Some(5), "live server on the socket: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let info = nbdinfo(&first.uri);
    assert_eq!(
        info["export-size"].as_u64(),
        Some(first.size),
        "the first server still serves"
    );
    let data = pattern(MIB as usize, 8);
    let src = dir.join("p.raw");
    write_file(&src, &data);
    tool("nbdcopy", &[p(&src), &first.uri]);
    assert_same(
        &read_export(&dir, &first.uri, "o.raw")[..data.len()],
        &data,
        "first server after the refusal",
    );
    first.kill();
    assert!(
        std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket(),
        "SIGKILL leaves the socket file behind"
    );
    // Nothing was written by the refused starts: the image only differs where nbdcopy wrote.
    let (data_offset, _) = data_layout(&img);
    let after = read_file(&img);
    let written = data_offset as usize..(data_offset + MIB) as usize;
    assert_same(&after[..written.start], &before[..written.start], "header");
    assert_same(&after[written.end..], &before[written.end..], "rest");

    // The stale socket is replaced.
    let again = Served::unix(&dir, "s.sock", &img, &key, &[]);
    assert_same(
        &read_export(&dir, &again.uri, "o.raw")[..data.len()],
        &data,
        "server on a stale socket",
    );
    again.stop();
}

/// 8b. A read-only export: libnbd and qemu refuse to write to it, a raw NBD write gets EPERM
///     (and a trim EINVAL), and the image stays byte for byte the same.
#[test]
fn readonly_export_refuses_writes_and_leaves_the_image_intact() {
    let dir = nbd_scratch("readonly");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &["--sector-size", "4096"]);
    // Some data first, so the read-only export has something to show.
    let data = pattern((2 * MIB) as usize, 9);
    let src = dir.join("p.raw");
    write_file(&src, &data);
    let rw = Served::unix(&dir, "s.sock", &img, &key, &[]);
    tool("nbdcopy", &[p(&src), &rw.uri]);
    rw.stop();
    let before = read_file(&img);

    let server = Served::unix(&dir, "s.sock", &img, &key, &["--readonly"]);
    let other = dir.join("other.raw");
    write_file(&other, &pattern(MIB as usize, 90));
    let nbdcopy = run_within(
        Command::new("nbdcopy").args([p(&other), &server.uri]),
        TOOL_DEADLINE,
    );
    assert!(
        !nbdcopy.status.success(),
        "nbdcopy wrote to a read-only export"
    );
    let qemu_io = run_within(
        Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0xab 0 64k", &server.uri]),
        TOOL_DEADLINE,
    );
    assert!(
        !qemu_io.status.success() || String::from_utf8_lossy(&qemu_io.stdout).contains("error"),
        "qemu-io wrote to a read-only export: {}",
        String::from_utf8_lossy(&qemu_io.stdout)
    );

    let mut raw = RawNbd::connect(server.socket());
    assert_eq!(raw.size, server.size);
    assert!(raw.flags & FLAG_READ_ONLY != 0, "read-only flag");
    assert!(
        raw.flags & FLAG_SEND_TRIM == 0,
        "no trim without --allow-discards"
    );
    assert_eq!(raw.write(0, &[0xab; 4096]), EPERM, "raw write");
    assert_eq!(
        raw.write(4096 + 512, &[0xab; 512]),
        EPERM,
        "raw sub-sector write"
    );
    assert_eq!(raw.request(CMD_TRIM, 0, 4096, &[]).0, EINVAL, "raw trim");
    let (err, read) = raw.request(CMD_READ, 0, 8192, &[]);
    assert_eq!(err, 0);
    assert_same(&read, &data[..8192], "read-only export reads");
    raw.disconnect();

    let back = read_export(&dir, &server.uri, "o.raw");
    assert_same(&back[..data.len()], &data, "read-only export");
    server.stop();

    // Read-only wins over --allow-discards.
    let server = Served::unix(
        &dir,
        "s.sock",
        &img,
        &key,
        &["--readonly", "--allow-discards"],
    );
    let mut raw = RawNbd::connect(server.socket());
    assert!(raw.flags & FLAG_READ_ONLY != 0, "read-only flag");
    assert_ne!(raw.request(CMD_TRIM, 0, 65536, &[]).0, 0, "raw trim");
    assert_ne!(
        raw.request(CMD_WRITE_ZEROES, 0, 65536, &[]).0,
        0,
        "raw write zeroes"
    );
    raw.disconnect();
    server.stop();
    assert!(
        read_file(&img) == before,
        "the image changed under --readonly"
    );
}

/// 8c. SIGTERM with clients still connected (one mid-handshake, one idle after it): exit 0
///     without waiting for them (within [`SERVER_DEADLINE`], shorter than the handshake timeout
///     a silent client would otherwise run into), the socket file is gone, and the data written
///     before is there when served again (and SIGINT stops that second server the same way).
#[test]
fn sigterm_exits_zero_removes_the_socket_and_keeps_the_data() {
    let dir = nbd_scratch("sigterm");
    let key = key_file(&dir);
    let img = format(&dir, "v", 48, &key, &["--sector-size", "512"]);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    let data = pattern((8 * MIB) as usize, 12);
    let src = dir.join("p.raw");
    write_file(&src, &data);
    tool("nbdcopy", &[p(&src), &server.uri]);
    let _mid_handshake = RawNbd::greeted(server.socket());
    let idle = RawNbd::connect(server.socket());
    server.stop();
    drop(idle);

    let again = Served::unix(&dir, "s.sock", &img, &key, &["--readonly"]);
    let back = read_export(&dir, &again.uri, "o.raw");
    assert_same(&back[..data.len()], &data, "data after SIGTERM and restart");
    again.stop_with("-INT");
}

/// 9. Two clients at once, each writing its own half (qemu-img through a raw window on the
///    export), then a third reads everything back.
#[test]
fn concurrent_clients_on_disjoint_halves_then_a_third_reads_all() {
    let dir = nbd_scratch("multiconn");
    let key = key_file(&dir);
    let img = format(&dir, "v", 64, &key, &["--sector-size", "4096"]);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    let half = 16 * MIB;
    let a = pattern(half as usize, 21);
    let b = pattern(half as usize, 22);
    let (fa, fb) = (dir.join("a.raw"), dir.join("b.raw"));
    write_file(&fa, &a);
    write_file(&fb, &b);
    let spawn = |src: &Path, offset: u64| {
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "--target-image-opts"])
            .arg(src)
            .arg(qemu_window(server.socket(), offset, half))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qemu-img")
    };
    let mut first = spawn(&fa, 0);
    let mut second = spawn(&fb, half);
    for (c, what) in [(&mut first, "first half"), (&mut second, "second half")] {
        let status = wait_within(c, TOOL_DEADLINE).expect("qemu-img finishes");
        let mut err = String::new();
        let _ = c.stderr.take().unwrap().read_to_string(&mut err);
        assert!(status.success(), "{what}: {err}");
    }
    let back = read_export(&dir, &server.uri, "o.raw");
    assert_same(&back[..half as usize], &a, "first half");
    assert_same(&back[half as usize..2 * half as usize], &b, "second half");
    server.stop();
}

/// 9b. Writes smaller than the 4096-byte encryption sector (which libnbd and qemu never send)
///     from eight connections at once, all into the same sectors: each sector is read, changed
///     and rewritten by the server, and no connection's 512 bytes may be lost to another's.
#[test]
fn sub_sector_writes_from_many_connections_are_all_kept() {
    let dir = nbd_scratch("subsector");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &["--sector-size", "4096"]);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    let sectors = 256u64;
    let slots = 8u64;
    let expected = pattern((sectors * 4096) as usize, 31);
    let expected = Arc::new(expected);
    let barrier = Arc::new(Barrier::new(slots as usize));
    let threads: Vec<_> = (0..slots)
        .map(|slot| {
            let (expected, barrier) = (Arc::clone(&expected), Arc::clone(&barrier));
            let sock = server.socket().to_path_buf();
            std::thread::spawn(move || {
                let mut c = RawNbd::connect(&sock);
                barrier.wait();
                for s in 0..sectors {
                    let at = (s * 4096 + slot * 512) as usize;
                    let err = c.write(at as u64, &expected[at..at + 512]);
                    assert_eq!(err, 0, "write at {at}");
                }
                c.disconnect();
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a writer failed");
    }
    let back = read_export(&dir, &server.uri, "o.raw");
    assert_same(
        &back[..expected.len()],
        &expected,
        "interleaved 512-byte writes",
    );
    server.stop();
}

/// 10. TCP on a loopback port: nbdinfo and nbdcopy work, and a second server on the same port
///     is refused as busy.
#[test]
fn tcp_listen_on_loopback_serves_and_refuses_a_busy_port() {
    let dir = nbd_scratch("tcp");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &[]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let server = Served::start(&dir, &[p(&img), "--key-file", p(&key), "--listen", &addr]);
    assert_eq!(server.uri, format!("nbd://{addr}/"));
    let uri = format!("nbd://{addr}");
    let info = nbdinfo(&uri);
    assert_eq!(info["export-size"].as_u64(), Some(payload_size(&img, &img)));
    let data = pattern((4 * MIB) as usize, 41);
    let src = dir.join("p.raw");
    write_file(&src, &data);
    tool("nbdcopy", &[p(&src), &uri]);
    assert_same(
        &read_export(&dir, &uri, "o.raw")[..data.len()],
        &data,
        "over TCP",
    );
    let (code, err) = serve_refused(&[p(&img), "--key-file", p(&key), "--listen", &addr]);
    assert_eq!(code, Some(5), "port in use: {err}");
    assert_eq!(
        nbdinfo(&uri)["export-size"],
        info["export-size"],
        "still serving"
    );
    server.stop();
}

/// 11. Requests at and past the limits, over one raw connection that must stay in step: past
///     the end (ENOSPC for writes, EINVAL for reads, also with an offset that overflows), over
///     the 32 MiB maximum (EINVAL, the payload skipped), unknown commands and flags (EINVAL); a
///     write of exactly 32 MiB, FUA, flush and zero-length requests work. Nothing refused
///     changes the data, and after a bad magic the server drops only that connection.
#[test]
fn protocol_limits_get_errors_and_the_connection_stays_usable() {
    let dir = nbd_scratch("limits");
    let key = key_file(&dir);
    let img = format(&dir, "v", 64, &key, &["--sector-size", "4096"]);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    let size = server.size;
    let max = 32 * MIB as u32;
    let mut c = RawNbd::connect(server.socket());
    assert_eq!(c.size, size);

    let big = pattern(max as usize, 51);
    assert_eq!(
        c.write(0, &big),
        0,
        "a write of exactly the maximum payload"
    );
    assert_same(
        &c.read(0, max),
        &big,
        "a read of exactly the maximum payload",
    );
    let tail = pattern(8192, 52);
    assert_eq!(c.write(size - 8192, &tail), 0, "the last 8 KiB");

    // Past the end.
    assert_eq!(
        c.write(size - 4096, &[0xee; 8192]),
        ENOSPC,
        "write past the end"
    );
    assert_eq!(
        c.request(CMD_WRITE_ZEROES, size - 4096, 8192, &[]).0,
        ENOSPC,
        "write zeroes past the end"
    );
    assert_eq!(
        c.request(CMD_READ, size - 512, 1024, &[]).0,
        EINVAL,
        "read past the end"
    );
    assert_eq!(
        c.request(CMD_READ, u64::MAX - 511, 1024, &[]).0,
        EINVAL,
        "read whose end overflows"
    );
    assert_eq!(
        c.write(u64::MAX - 511, &[0xee; 1024]),
        ENOSPC,
        "write whose end overflows"
    );
    // Over the maximum payload: refused, and the write's payload is skipped, not taken for
    // the next requests.
    let over = vec![0xeeu8; max as usize + 4096];
    assert_eq!(c.write(0, &over), EINVAL, "write over the maximum");
    assert_eq!(
        c.request(CMD_READ, 0, max + 1, &[]).0,
        EINVAL,
        "read over the maximum"
    );
    // Unknown command and flags.
    assert_eq!(c.request(99, 0, 4096, &[]).0, EINVAL, "unknown command");
    assert_eq!(
        c.request_with(CMD_WRITE, 1 << 10, 0, 4096, &[0xee; 4096]).0,
        EINVAL,
        "unknown flag"
    );
    // What does work.
    assert_eq!(c.request(CMD_READ, 0, 0, &[]).0, 0, "zero-length read");
    assert_eq!(c.write(4096, &[]), 0, "zero-length write");
    let fua = pattern(4096, 53);
    assert_eq!(
        c.request_with(CMD_WRITE, CMD_FLAG_FUA, 40 * MIB, 4096, &fua)
            .0,
        0,
        "FUA write"
    );
    assert_eq!(c.request(CMD_FLUSH, 0, 0, &[]).0, 0, "flush");
    // Nothing refused changed anything.
    assert_same(&c.read(0, max), &big, "after the refusals");
    assert_same(
        &c.read(size - 8192, 8192),
        &tail,
        "the end after the refusals",
    );
    c.disconnect();

    // A request with a bad magic ends that connection only.
    let mut bad = RawNbd::connect(server.socket());
    bad.s.write_all(&[0x55; 28]).unwrap();
    let mut rest = Vec::new();
    let _ = bad.s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no reply to a bad magic");
    let mut good = RawNbd::connect(server.socket());
    assert_same(
        &good.read(40 * MIB, 4096),
        &fua,
        "a new connection after a bad one",
    );
    good.disconnect();
    server.stop();
}

/// 12. Write-zeroes (from qemu-io and, unaligned, from a raw client) and discards (qemu-io and
///     raw, with --allow-discards) change only their own range: the bytes around it, including
///     the rest of partly covered sectors, are kept; zeroed bytes read back as zeros.
#[test]
fn zeroes_and_discards_keep_the_bytes_outside_their_range() {
    let dir = nbd_scratch("zero-trim");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &["--sector-size", "4096"]);
    let server = Served::unix(&dir, "s.sock", &img, &key, &["--allow-discards"]);
    let len = 2 * MIB as usize;
    let mut expected = pattern(len, 61);
    let src = dir.join("p.raw");
    write_file(&src, &expected);
    tool("nbdcopy", &[p(&src), &server.uri]);

    // Zeroes, aligned through qemu, unaligned (head and tail inside sectors) raw.
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -z 64k 12k", &server.uri],
    );
    expected[64 << 10..76 << 10].fill(0);
    let mut c = RawNbd::connect(server.socket());
    assert!(c.flags & FLAG_SEND_TRIM != 0, "trim offered");
    let (zo, zl) = (200_000u64, 10_000u32);
    assert_eq!(c.request(CMD_WRITE_ZEROES, zo, zl, &[]).0, 0, "raw zeroes");
    expected[zo as usize..(zo + u64::from(zl)) as usize].fill(0);
    assert_eq!(
        c.request_with(CMD_WRITE_ZEROES, CMD_FLAG_FUA, 300_100, 100, &[])
            .0,
        0,
        "raw sub-sector zeroes with FUA"
    );
    expected[300_100..300_200].fill(0);
    assert_same(&c.read(0, len as u32), &expected, "after write-zeroes");

    // Discards: what they cover is unspecified afterwards, what they do not is kept.
    tool(
        "qemu-io",
        &["-f", "raw", "-c", "discard 512k 64k", &server.uri],
    );
    let (to, tl) = (MIB + 4096 + 512, 3 * 4096u32);
    assert_eq!(c.request(CMD_TRIM, to, tl, &[]).0, 0, "raw unaligned trim");
    let back = c.read(0, len as u32);
    let keep = |range: std::ops::Range<usize>, what: &str| {
        assert_same(&back[range.clone()], &expected[range], what)
    };
    keep(0..512 << 10, "before the qemu discard");
    keep(576 << 10..to as usize, "between the discards");
    keep(
        (to + u64::from(tl)) as usize..len,
        "after the unaligned trim",
    );
    c.disconnect();
    server.stop();
}

/// 13. Someone removed the socket file while the server ran (a tmp cleaner, a careless `rm`).
///     SIGTERM must still stop the server with exit 0; it may not hang in accept() for ever.
#[test]
fn sigterm_stops_the_server_even_after_its_socket_file_was_removed() {
    let dir = nbd_scratch("rm-socket");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &[]);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    std::fs::remove_file(server.socket()).unwrap();
    server.stop();
}

/// 14. The URI in the "serving" line is one clients can use as printed, even when the socket
///     path and the export name hold characters a URI must escape (here, spaces).
#[test]
fn the_serving_uri_works_with_spaces_in_the_socket_path_and_export_name() {
    let dir = nbd_scratch("uri");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &[]);
    let sub = dir.join("a b");
    std::fs::create_dir(&sub).unwrap();
    let sock = sub.join("s.sock");
    let server = Served::start(
        &dir,
        &[
            p(&img),
            "--key-file",
            p(&key),
            "--socket",
            p(&sock),
            "--export-name",
            "my disk",
        ],
    );
    let info = run_within(
        Command::new("nbdinfo").args(["--size", &server.uri]),
        TOOL_DEADLINE,
    );
    assert!(
        info.status.success(),
        "nbdinfo on the printed URI {:?}: {}",
        server.uri,
        String::from_utf8_lossy(&info.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&info.stdout).trim(),
        server.size.to_string()
    );
    server.stop();
}

/// `--size` / `--device-size` (cryptsetup open's) expose a prefix of the data: the export has
/// that size, what is written through it is the start of the full volume, and sizes that are
/// not whole encryption sectors within the data are refused.
#[test]
fn size_options_expose_a_prefix_of_the_data() {
    let dir = nbd_scratch("size-options");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &["--sector-size", "4096"]);
    let full = payload_size(&img, &img);
    let noise = dir.join("noise.bin");
    write_file(&noise, &pattern(4 * MIB as usize, 7));
    for extra in [&["--size", "8192"][..], &["--device-size", "4194304"][..]] {
        let server = Served::unix(&dir, "s.sock", &img, &key, extra);
        assert_eq!(nbdinfo(&server.uri)["export-size"].as_u64(), Some(4 * MIB));
        assert_eq!(server.size, 4 * MIB);
        tool("nbdcopy", &[p(&noise), &server.uri]);
        server.stop();
    }
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    let whole = read_export(&dir, &server.uri, "whole.bin");
    assert_eq!(whole.len() as u64, full);
    assert_same(
        &whole[..4 * MIB as usize],
        &pattern(4 * MIB as usize, 7),
        "prefix",
    );
    server.stop();
    let sock = dir.join("r.sock");
    for bad in ["1000", "4097", &(full + 4096).to_string(), "0"] {
        let (code, err) = serve_refused(&[
            p(&img),
            "--key-file",
            p(&key),
            "--socket",
            p(&sock),
            "--device-size",
            bad,
        ]);
        assert_eq!(code, Some(1), "--device-size {bad}: {err}");
        assert!(err.contains("encryption sector"), "{err}");
    }
}
