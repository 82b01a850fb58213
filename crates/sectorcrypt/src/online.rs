//! Conversions of a device that a sectorcrypt process is serving (`serve`, `mount`): online
//! reencryption, encryption and decryption, as `cryptsetup reencrypt` runs them on an active
//! device.
//!
//! The server holds the device's lock, so a second process cannot convert it. Instead the server
//! listens on a *control socket* named after the device's identity (its device and inode numbers,
//! what its lock is on), in a directory that is the user's alone: `/run/sectorcrypt` for root,
//! `/run/user/UID/sectorcrypt` or else `/tmp/sectorcrypt-UID` for others (made 0700 and checked:
//! one that another user owns or can enter is not used). The server also checks each peer's user
//! id. `sectorcrypt reencrypt|encrypt|decrypt DEVICE ...` finds the socket, sends its command
//! line, working directory and passphrase, and shows the progress the server reports; the server
//! runs the conversion beside the requests it serves (`sectorcrypt_volume::live`). When the
//! client goes away (SIGINT), the conversion stops at its next safe point; the server keeps
//! serving the device half converted, and the same command resumes it.
//!
//! The protocol: one JSON line `{"argv": [...], "cwd": "..."}`, then the passphrase (4 bytes of
//! big-endian length, then its bytes, read straight into locked memory). Replies are JSON lines:
//! `{"done": N, "total": N}` after each step, then `{"exit": CODE, "message": "..."}`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;
use sectorcrypt_volume::reencrypt::{self, Options, Outcome, Progress};
use sectorcrypt_volume::Volume;
use serde_json::{json, Value};

use crate::exit::{CliError, Code};
use crate::progress::Reporter;

/// The longest request line and passphrase a server reads (cryptsetup's key-file limit).
const MAX_REQUEST: u64 = 1 << 16;
const MAX_PASSPHRASE: usize = 8 << 20;

fn uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// The directory of this user's control sockets (see the module docs).
fn control_dir() -> PathBuf {
    match uid() {
        0 => PathBuf::from("/run/sectorcrypt"),
        uid if Path::new(&format!("/run/user/{uid}")).is_dir() => {
            PathBuf::from(format!("/run/user/{uid}/sectorcrypt"))
        }
        uid => PathBuf::from(format!("/tmp/sectorcrypt-{uid}")),
    }
}

/// The control directory, made if missing; `None` unless it is this user's alone.
fn private_dir() -> Option<PathBuf> {
    let dir = control_dir();
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir);
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    (meta.is_dir() && meta.uid() == uid() && meta.mode() & 0o077 == 0).then_some(dir)
}

/// What names a device's control socket: a file's or block device's device and inode numbers
/// (what its lock is on); for an RBD image, a hash of its `rbd:` name (the image's lock is in the
/// cluster).
fn identity(device: &Path) -> Option<String> {
    if crate::device::is_rbd(device) {
        // FNV-1a: a short, stable name; two images never share a server, whose `request` also
        // compares the names themselves.
        let name = device.to_string_lossy();
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        return Some(format!("rbd-{hash:016x}"));
    }
    let meta = std::fs::metadata(device).ok()?;
    Some(format!("{:x}-{}", meta.dev(), meta.ino()))
}

/// The control socket of `device`.
fn socket_of(device: &Path) -> Option<PathBuf> {
    Some(private_dir()?.join(format!("{}.sock", identity(device)?)))
}

/// Whether two device names name one device (one file, or one RBD image).
pub(crate) fn same_device(a: &Path, b: &Path) -> bool {
    match (crate::device::is_rbd(a), crate::device::is_rbd(b)) {
        (true, true) => a == b,
        (false, false) => identity(a).is_some() && identity(a) == identity(b),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

/// A connection to the process serving `device`, if one listens.
pub(crate) fn server_of(device: &Path) -> Option<UnixStream> {
    UnixStream::connect(socket_of(device)?).ok()
}

/// Ask the server on `conn` to run this command line with `pass`, showing its progress (JSON
/// lines with `json`); SIGINT or SIGTERM here stops the conversion at its next safe point.
pub(crate) fn ask(mut conn: UnixStream, pass: &[u8], json: bool) -> Result<(), CliError> {
    let argv: Option<Vec<String>> = std::env::args_os().map(|a| a.into_string().ok()).collect();
    let argv = argv.ok_or_else(|| CliError::usage("arguments that are not UTF-8"))?;
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::io("cannot read the working directory", e))?;
    let lost = |e: std::io::Error| CliError::io("the serving process went away", e);
    let request = json!({ "argv": argv, "cwd": cwd.to_string_lossy() });
    let stop = crate::inplace::stop_on_signals()?;
    conn.write_all(format!("{request}\n").as_bytes())
        .and_then(|()| conn.write_all(&(pass.len() as u32).to_be_bytes()))
        .and_then(|()| conn.write_all(pass))
        .map_err(lost)?;
    conn.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(lost)?;
    let mut reader = BufReader::new(conn.try_clone().map_err(lost)?);
    let mut report = Reporter::new(json);
    let mut stopped = false;
    let mut line = String::new();
    loop {
        if stop.load(Ordering::Relaxed) && !stopped {
            // The server stops at its next safe point and says where.
            let _ = conn.shutdown(std::net::Shutdown::Write);
            stopped = true;
        }
        match reader.read_line(&mut line) {
            Ok(0) => return Err(CliError::usage("the serving process ended the conversion")),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(lost(e)),
        }
        let reply: Value = serde_json::from_str(line.trim_end())
            .map_err(|e| CliError::usage(format!("a garbled reply from the server: {e}")))?;
        line.clear();
        if let (Some(done), Some(total)) = (reply["done"].as_u64(), reply["total"].as_u64()) {
            report.step(Progress { done, total });
            continue;
        }
        report.done();
        let code = reply["exit"].as_u64().unwrap_or(1);
        let message = reply["message"].as_str().unwrap_or_default().to_string();
        return match code {
            0 => {
                if !message.is_empty() {
                    println!("{message}");
                }
                Ok(())
            }
            2 => Err(CliError {
                code: Code::Permission,
                message,
            }),
            4 => Err(CliError {
                code: Code::Device,
                message,
            }),
            5 => Err(CliError {
                code: Code::Busy,
                message,
            }),
            _ => Err(CliError::usage(message)),
        };
    }
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// What a server offers a conversion: the volume it serves and the devices under it.
pub(crate) struct Served {
    pub volume: Arc<Volume>,
    pub data: Arc<dyn Storage>,
    /// The header's device (the data device itself for a header on it).
    pub header_dev: Arc<dyn Storage>,
    pub device: PathBuf,
    pub header: Option<PathBuf>,
    pub threads: usize,
    pub read_only: bool,
}

/// A conversion run in the server: one at a time.
#[derive(Default)]
struct Job {
    thread: Option<JoinHandle<()>>,
    running: bool,
    stop: Arc<AtomicBool>,
    progress: Option<Progress>,
    /// How the last run ended: its exit code and message.
    ended: Option<(u8, String)>,
    /// Runs so far, so that a client knows when the one it follows has ended.
    runs: u64,
}

struct Shared {
    served: Served,
    job: Mutex<Job>,
    changed: Condvar,
    closing: AtomicBool,
}

impl Shared {
    fn job(&self) -> MutexGuard<'_, Job> {
        self.job.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the server does for a client: the conversion asked for is prepared (started on the
/// device if new) by the command's own code, then run here.
pub(crate) struct Conversion {
    /// The header device to run it from (a decryption that exports the header runs from the file).
    pub header_dev: Arc<dyn Storage>,
    pub hotzone: u64,
    pub threads: usize,
    /// At most this many bytes a second (`--max-rate`).
    pub max_rate: Option<u64>,
    /// How to resume it if it stops.
    pub resume: String,
}

/// A device's control socket and the conversion it runs. [`Host::start`] binds the socket, so
/// that a command started from then on finds this process (its connection waits in the backlog);
/// [`Host::begin`], once the process has announced itself, resumes a recorded conversion and
/// takes requests; [`Host::shutdown`] pauses the conversion at a safe point and removes the
/// socket.
pub(crate) struct Host {
    shared: Arc<Shared>,
    socket: Option<PathBuf>,
    listener: Option<UnixListener>,
    /// The passphrase of the conversion to resume, and its `--max-rate`.
    resume: Option<(SecretBytes, Option<u64>)>,
    acceptor: Option<JoinHandle<()>>,
}

impl Host {
    /// Listen for conversion requests on `served`'s control socket; with `resume` (the
    /// passphrase of a conversion recorded on it), [`Host::begin`] goes on with that conversion
    /// in the background.
    pub(crate) fn start(
        served: Served,
        resume: Option<SecretBytes>,
        max_rate: Option<u64>,
    ) -> Result<Host, CliError> {
        // A read-only server converts nothing, and shares its device with other readers: it
        // listens for nobody (a writer beside it meets the lock).
        let socket = socket_of(&served.device).filter(|_| !served.read_only);
        let listener = match &socket {
            Some(path) => {
                // A socket file left by a server that was killed: the lock says nobody serves.
                let _ = std::fs::remove_file(path);
                let listener = UnixListener::bind(path)
                    .map_err(|e| CliError::io(format!("cannot listen on {}", path.display()), e))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| CliError::io(format!("cannot protect {}", path.display()), e))?;
                Some(listener)
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            served,
            job: Mutex::new(Job::default()),
            changed: Condvar::new(),
            closing: AtomicBool::new(false),
        });
        Ok(Host {
            shared,
            socket,
            listener,
            resume: resume.map(|pass| (pass, max_rate)),
            acceptor: None,
        })
    }

    /// Resume the recorded conversion, if any, then take requests. A request that came in
    /// since [`Host::start`] is answered now, after the resumed run (which it then finds
    /// running). On an error the host is shut down.
    pub(crate) fn begin(mut self) -> Result<Host, CliError> {
        if let Some((pass, max_rate)) = self.resume.take() {
            let served = &self.shared.served;
            let conversion = Conversion {
                header_dev: Arc::clone(&served.header_dev),
                hotzone: reencrypt::DEFAULT_HOTZONE,
                threads: served.threads,
                max_rate,
                resume: String::new(),
            };
            eprintln!(
                "sectorcrypt: {}: resuming the conversion in the background (--no-resume \
                 serves without converting)",
                served.device.display()
            );
            if let Err(e) = launch(&self.shared, conversion, pass) {
                self.shutdown();
                return Err(e);
            }
        }
        self.acceptor = self.listener.take().map(|listener| {
            let shared = Arc::clone(&self.shared);
            std::thread::spawn(move || accept(&listener, &shared))
        });
        Ok(self)
    }

    /// Stop: the conversion pauses at its next safe point (the header then records a clean
    /// state), the socket goes.
    pub(crate) fn shutdown(mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        let thread = {
            let mut job = self.shared.job();
            job.stop.store(true, Ordering::SeqCst);
            job.thread.take()
        };
        if let Some(t) = thread {
            let _ = t.join();
        }
        if let Some(path) = self.socket.take() {
            // Wake the acceptor, which then sees `closing`.
            let _ = UnixStream::connect(&path);
            if let Some(t) = self.acceptor.take() {
                let _ = t.join();
            }
            let _ = std::fs::remove_file(path);
        }
    }
}

fn accept(listener: &UnixListener, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let peer = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials);
        if peer.map(|c| c.uid()).ok() != Some(uid()) {
            continue; // only this user (the directory should already have kept others out)
        }
        let shared = Arc::clone(shared);
        std::thread::spawn(move || serve_client(conn, &shared));
    }
}

/// Run `conversion` in the background; refused while one runs.
fn launch(shared: &Arc<Shared>, conversion: Conversion, pass: SecretBytes) -> Result<(), CliError> {
    let mut job = shared.job();
    if job.running {
        return Err(CliError {
            code: Code::Busy,
            message: "a conversion of this device is running in its server already".into(),
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    job.running = true;
    job.stop = Arc::clone(&stop);
    job.progress = None;
    job.ended = None;
    job.runs += 1;
    let worker = Arc::clone(shared);
    job.thread = Some(std::thread::spawn(move || {
        let served = &worker.served;
        let options = Options {
            hotzone: conversion.hotzone,
            threads: conversion.threads,
        };
        let mut pace = reencrypt::Pace::new(conversion.max_rate);
        let mut seen = served.volume.requests();
        let result = reencrypt::run_serving(
            &*conversion.header_dev,
            &*served.data,
            &pass,
            &options,
            &mut |p| {
                worker.job().progress = Some(p);
                worker.changed.notify_all();
                let requests = served.volume.requests();
                pace.after(p, requests != seen, &stop);
                seen = served.volume.requests();
                !stop.load(Ordering::SeqCst)
            },
            &*served.volume,
        );
        drop(pass);
        let device = served.device.display();
        let ended = match result {
            Ok(Outcome::Finished) => {
                eprintln!("sectorcrypt: {device}: the conversion is finished");
                (0, String::new())
            }
            Ok(Outcome::Paused(p)) => {
                let resume = if conversion.resume.is_empty() {
                    String::new()
                } else {
                    format!("; resume with: {}", conversion.resume)
                };
                eprintln!(
                    "sectorcrypt: {device}: the conversion paused after {} of {} bytes",
                    p.done, p.total
                );
                (
                    1,
                    format!(
                        "interrupted after {} of {} bytes, at a safe point{resume}",
                        p.done, p.total
                    ),
                )
            }
            Err(e) => {
                let e = CliError::from(e);
                eprintln!(
                    "sectorcrypt: {device}: the conversion failed: {}",
                    e.message
                );
                (e.code as u8, e.message)
            }
        };
        let mut job = worker.job();
        job.running = false;
        job.ended = Some(ended);
        worker.changed.notify_all();
    }));
    Ok(())
}

/// One client: read its request, prepare and launch (or follow) the conversion, report.
fn serve_client(conn: UnixStream, shared: &Arc<Shared>) {
    let mut out = match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    };
    let mut send = |v: Value| out.write_all(format!("{v}\n").as_bytes()).is_ok();
    let (runs, stop) = match request(&conn, shared) {
        Ok(Reply::Follow(runs, stop)) => (runs, stop),
        Ok(Reply::Done(message)) => {
            send(json!({ "exit": 0, "message": message }));
            return;
        }
        Err(e) => {
            send(json!({ "exit": e.code as u8, "message": e.message }));
            return;
        }
    };
    // The client going away (its SIGINT) stops the conversion.
    {
        let mut watch = match conn.try_clone() {
            Ok(c) => c,
            Err(_) => return,
        };
        let shared = Arc::clone(shared);
        std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            let _ = watch.read(&mut byte);
            let job = shared.job();
            if job.runs == runs && job.running {
                stop.store(true, Ordering::SeqCst);
            }
        });
    }
    let mut last = None;
    let mut job = shared.job();
    loop {
        if job.progress != last {
            last = job.progress;
            if let Some(p) = last {
                drop(job);
                if !send(json!({ "done": p.done, "total": p.total })) {
                    return;
                }
                job = shared.job();
                continue;
            }
        }
        if job.runs != runs || !job.running {
            let (code, message) = match (job.runs == runs, &job.ended) {
                (true, Some(ended)) => ended.clone(),
                _ => (1, "the conversion ended".to_string()),
            };
            drop(job);
            send(json!({ "exit": code, "message": message }));
            return;
        }
        job = shared
            .changed
            .wait(job)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// What the server does after a request.
enum Reply {
    /// Follow this run of the conversion (its stop flag).
    Follow(u64, Arc<AtomicBool>),
    /// Done at once (prepared only, or resized), saying this.
    Done(String),
}

/// Read a request, check it names this server's device, and have its command prepare the
/// conversion; launch it, or follow the one running; or resize.
fn request(conn: &UnixStream, shared: &Arc<Shared>) -> Result<Reply, CliError> {
    let bad = |why: String| CliError::usage(format!("a bad request: {why}"));
    // Unbuffered: a buffer would take the passphrase's bytes too, into memory nobody wipes.
    let mut stream = conn.take(MAX_REQUEST + 4 + MAX_PASSPHRASE as u64);
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < MAX_REQUEST as usize {
        stream
            .read_exact(&mut byte)
            .map_err(|e| bad(e.to_string()))?;
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
    }
    let req: Value = serde_json::from_slice(&line).map_err(|e| bad(e.to_string()))?;
    let argv: Vec<String> = req["argv"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let cwd = PathBuf::from(req["cwd"].as_str().unwrap_or("/"));
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .map_err(|e| bad(e.to_string()))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_PASSPHRASE {
        return Err(bad(format!("a passphrase of {len} bytes")));
    }
    let pass = SecretBytes::read_from(stream.by_ref().take(len as u64), len)
        .map_err(|e| bad(e.to_string()))?;
    if pass.len() != len {
        return Err(bad("a passphrase cut short".into()));
    }
    let served = &shared.served;
    let asked = crate::inplace::Asked::parse(&argv, &cwd)?;
    if !same_device(asked.device(), &served.device) {
        return Err(CliError::usage("the request names another device"));
    }
    if let Some(bytes) = asked.resize_to() {
        // A LUKS2 data segment of fixed size ends there, whatever follows it on the device.
        let fixed = match sectorcrypt_luks::Header::read(&*served.header_dev) {
            Ok(sectorcrypt_luks::Header::Luks2(h)) => h.data_segment().ok().and_then(|s| s.size),
            _ => None,
        };
        let room = served.volume.max_size()?.min(fixed.unwrap_or(u64::MAX));
        let bytes = bytes?.unwrap_or(room);
        if bytes > room {
            return Err(CliError::usage(format!(
                "a size of {bytes} bytes: {} has {room} bytes of data",
                served.device.display()
            )));
        }
        served.volume.resize(bytes)?;
        eprintln!(
            "sectorcrypt: {}: resized to {bytes} bytes (for new connections)",
            served.device.display()
        );
        return Ok(Reply::Done(format!(
            "{}: {bytes} bytes",
            served.device.display()
        )));
    }
    {
        let job = shared.job();
        if job.running {
            // Already converting (a resume in the background, or another client's): follow it.
            if !asked.resume_only() {
                return Err(CliError {
                    code: Code::Busy,
                    message: format!(
                        "{} is being converted by its server already; follow it with \
                         --resume-only",
                        served.device.display()
                    ),
                });
            }
            return Ok(Reply::Follow(job.runs, Arc::clone(&job.stop)));
        }
    }
    let conversion = asked.prepare_online(served, &pass)?;
    if asked.init_only() {
        return Ok(Reply::Done(String::new()));
    }
    launch(shared, conversion, pass)?;
    let job = shared.job();
    Ok(Reply::Follow(job.runs, Arc::clone(&job.stop)))
}

/// Whether two paths name one file.
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    !crate::device::is_rbd(a) && !crate::device::is_rbd(b) && same_device(a, b)
}
