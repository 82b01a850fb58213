//! Listening, accepting and stopping.
//!
//! One thread per connection (it runs the handshake, then reads requests and feeds the
//! connection's workers). Every connection serves the same storage (one volume, or one key table
//! under any of its keys); since a flush is an fdatasync of the whole device, a flush on any
//! connection covers writes completed on all of them, which is what `NBD_FLAG_CAN_MULTI_CONN`
//! promises.

use sectorcrypt_volume::Error as VolumeError;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::exports::{Exports, Offered};
use crate::handshake::{greet, negotiate, ExportInfo, Outcome, TlsState};
use crate::proto::*;
use crate::stream::Stream;
use crate::tls::{self, Relay, Tls, TlsMode};
use crate::transmission;
use crate::Error;

/// The largest READ or WRITE payload (the protocol's recommended minimum maximum).
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// A client must finish the handshake (and the TLS handshake) within this time.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// A client that does not take a reply within this time is dropped.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// Where to listen.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A Unix socket at this path, mode 0600.
    Unix(PathBuf),
    /// TCP on `host:port`.
    Tcp(String),
}

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The export's name (the empty name always reaches it too); a key table's exports are
    /// named by their tags instead.
    pub export_name: String,
    /// A description for `nbdinfo` and friends.
    pub description: String,
    /// Worker threads per connection: the requests of one client in progress at once.
    pub workers: usize,
    /// Of those, the writes in progress at once. A write's payload is received only once it can
    /// start, so that it is still in the cache when it is encrypted and stored; more writers
    /// than cores only take turns at the file's lock and evict each other's payloads.
    pub writers: usize,
    /// Connections served at once; more are closed straight away.
    pub max_connections: usize,
    /// Called for each request the storage failed (an I/O error, not a bad request): the
    /// client gets its error reply either way; this tells whoever runs the server.
    pub on_storage_error: Option<fn(&VolumeError)>,
    /// TLS offered or required (`NBD_OPT_STARTTLS`); `None`: no TLS.
    pub tls: Option<Tls>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            export_name: String::new(),
            description: String::new(),
            // nbdkit's default thread count. Each worker has at most one request in progress,
            // so the workers bound how many of a client's queued reads reach the disk at once:
            // with 4, 4 KiB random reads at queue depth 32 from an uncached file ran at 0.7x of
            // `nbdkit file` (docs/BENCHMARKS.md).
            workers: 16,
            writers: 4,
            max_connections: 64,
            on_storage_error: None,
            tls: None,
        }
    }
}

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

/// A bound server, ready to [`run`](Server::run).
pub struct Server {
    listener: Listener,
    exports: Exports,
    export: ExportInfo,
    options: ServerOptions,
    stop: Arc<AtomicBool>,
}

/// Stops a running server from another thread (the thread that takes the signals, a test).
#[derive(Clone)]
pub struct StopHandle {
    stop: Arc<AtomicBool>,
    listener: Arc<OwnedFd>,
}

impl StopHandle {
    /// Ask the server to stop: it stops accepting, lets each connection finish the requests it
    /// has read, flushes the volume and returns from `run`.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Shutting down the listening socket wakes a blocked accept() with an error; unlike
        // connecting to it, that works even if someone removed the socket file.
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::ReadWrite);
    }
}

impl Server {
    /// Bind `listen` for `exports` (an `Arc<Volume>` or an `Arc<KeyTable>`). A Unix socket path
    /// that holds a stale socket is replaced; one where a server still answers is
    /// [`Error::Busy`].
    pub fn bind(
        listen: &Listen,
        exports: impl Into<Exports>,
        options: ServerOptions,
    ) -> Result<Self, Error> {
        let exports = exports.into();
        let listener = match listen {
            Listen::Unix(path) => Listener::Unix(bind_unix(path)?, path.clone()),
            Listen::Tcp(addr) => {
                let l = TcpListener::bind(addr).map_err(|source| {
                    if source.kind() == io::ErrorKind::AddrInUse {
                        Error::Busy(format!("{addr} is already in use"))
                    } else {
                        Error::Bind {
                            address: addr.clone(),
                            source,
                        }
                    }
                })?;
                Listener::Tcp(l)
            }
        };
        let export = export_info(&exports, &options);
        Ok(Server {
            listener,
            exports,
            export,
            options,
            stop: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Where the server listens, as an NBD URI (percent-encoded, so any path or name works):
    /// `nbds` when the server has TLS.
    pub fn uri(&self) -> String {
        self.uri_of(&self.export.name)
    }

    /// The NBD URI of the export `name` on this server (a key tag's, for a key table).
    pub fn uri_of(&self, name: &str) -> String {
        let name = percent_encode(name.as_bytes(), false);
        let scheme = if self.options.tls.is_some() {
            "nbds"
        } else {
            "nbd"
        };
        match &self.listener {
            Listener::Unix(_, p) => format!(
                "{scheme}+unix:///{name}?socket={}",
                percent_encode(p.as_os_str().as_bytes(), true)
            ),
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("{scheme}://{a}/{name}"),
                Err(_) => format!("{scheme}://"),
            },
        }
    }

    /// A handle that stops [`run`](Server::run).
    pub fn stop_handle(&self) -> io::Result<StopHandle> {
        let fd = match &self.listener {
            Listener::Unix(l, _) => l.as_fd().try_clone_to_owned()?,
            Listener::Tcp(l) => l.as_fd().try_clone_to_owned()?,
        };
        Ok(StopHandle {
            stop: Arc::clone(&self.stop),
            listener: Arc::new(fd),
        })
    }

    /// Accept and serve clients until stopped; then finish the requests already read, flush the
    /// volume and remove the socket file.
    pub fn run(self) -> Result<(), Error> {
        let live: Arc<Mutex<Vec<(u64, Stream)>>> = Arc::default();
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let mut next_id = 0u64;
        loop {
            let accepted = match &self.listener {
                Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
                Listener::Tcp(l) => l.accept().map(|(s, _)| {
                    // Replies go out as soon as they are written.
                    let _ = s.set_nodelay(true);
                    Stream::Tcp(s)
                }),
            };
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let stream = match accepted {
                Ok(s) => s,
                // A client that gave up before we accepted it, or a shortage of descriptors:
                // neither is a reason to stop serving the others.
                Err(_) => {
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            threads.retain(|t| !t.is_finished());
            if threads.len() >= self.options.max_connections {
                stream.shutdown();
                continue;
            }
            let id = next_id;
            next_id += 1;
            if let Ok(clone) = stream.try_clone() {
                live.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((id, clone));
            }
            let client = Client {
                exports: self.exports.clone(),
                // The size as it is now: a volume resized while served is seen so by new
                // connections (NBD tells a size once, in the handshake).
                template: ExportInfo {
                    size: self.exports.size(),
                    ..self.export.clone()
                },
                workers: self.options.workers,
                writers: self.options.writers,
                on_storage_error: self.options.on_storage_error,
                tls: self.options.tls.clone(),
            };
            let registry = Arc::clone(&live);
            let spawned = thread::Builder::new()
                .name(format!("nbd-conn-{id}"))
                .spawn(move || {
                    let _ = client.serve(stream);
                    registry
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|(i, _)| *i != id);
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(_) => live
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .retain(|(i, s)| {
                        if *i == id {
                            s.shutdown();
                        }
                        *i != id
                    }),
            }
        }
        // Stop reading from every client; each connection answers what it has read, then ends.
        for (_, s) in live.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            s.shutdown_read();
        }
        for t in threads {
            let _ = t.join();
        }
        let flushed = self.exports.flush();
        if let Listener::Unix(_, path) = &self.listener {
            let _ = fs::remove_file(path);
        }
        flushed.map_err(Error::Volume)
    }
}

/// What the handshake tells clients about `exports`.
fn export_info(exports: &Exports, options: &ServerOptions) -> ExportInfo {
    let mut flags = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_CAN_MULTI_CONN;
    if exports.is_read_only() {
        flags |= FLAG_READ_ONLY;
    }
    if exports.allows_discards() {
        flags |= FLAG_SEND_TRIM;
    }
    let sector = exports.sector_size() as u32;
    ExportInfo {
        name: options.export_name.clone(),
        description: options.description.clone(),
        size: exports.size(),
        flags,
        min_block: sector,
        preferred_block: sector.max(4096),
        max_payload: MAX_PAYLOAD,
    }
}

/// Serve one client already connected on `stream`, from greeting to goodbye, exactly as a
/// [`Server`] serves an accepted connection (handshake, then requests), without listening: for
/// a socket pair whose other end is a test or a fuzz target. Returns when the client leaves or
/// breaks the protocol; the volume is not flushed (a server flushes when it stops).
pub fn serve_connection(
    stream: UnixStream,
    exports: impl Into<Exports>,
    options: &ServerOptions,
) -> io::Result<()> {
    let exports = exports.into();
    let client = Client {
        template: export_info(&exports, options),
        exports,
        workers: options.workers,
        writers: options.writers,
        on_storage_error: options.on_storage_error,
        tls: options.tls.clone(),
    };
    client.serve(Stream::Unix(stream))
}

/// Percent-encode `raw` for a URI path or query value: everything but unreserved characters (and
/// `/` in a socket path) is escaped.
fn percent_encode(raw: &[u8], keep_slash: bool) -> String {
    let mut out = String::with_capacity(raw.len());
    for &b in raw {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What a connection's thread needs to serve its client.
struct Client {
    exports: Exports,
    template: ExportInfo,
    workers: usize,
    writers: usize,
    on_storage_error: Option<fn(&VolumeError)>,
    tls: Option<Tls>,
}

/// A connection after its handshake.
struct Negotiated {
    /// The stream to go on with: the socket, or under TLS the plaintext side of the relay.
    stream: Stream,
    /// The relay running the TLS session, once TLS has started.
    relay: Option<Relay>,
    /// The export chosen (whether replies are structured, and the name used), if any.
    chosen: Option<(bool, Vec<u8>)>,
}

impl Client {
    /// One client from greeting to goodbye. A TLS session's relay has ended when this returns.
    fn serve(&self, stream: Stream) -> io::Result<()> {
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        let Negotiated {
            stream,
            relay,
            chosen,
        } = self.handshake(stream);
        // The export can vanish between the handshake's answer and here (a key evicted): the
        // client then sees the connection close, as for an unknown name.
        let target = chosen.and_then(|(structured, name)| {
            self.exports
                .target(&name, &self.template.name)
                .map(|target| (structured, target))
        });
        let served = match target {
            Some((structured, target)) => {
                // Between requests a client may idle as long as it likes.
                stream.set_read_timeout(None).and_then(|()| {
                    transmission::serve(
                        stream,
                        target,
                        structured,
                        self.template.max_payload,
                        self.workers,
                        self.writers,
                        self.on_storage_error,
                    )
                })
            }
            None => {
                stream.shutdown();
                Ok(())
            }
        };
        if let Some(relay) = relay {
            relay.wait();
        }
        served
    }

    /// Greeting and option haggling, with the TLS handshake in between if the client starts TLS.
    fn handshake(&self, mut stream: Stream) -> Negotiated {
        let offered = Offered {
            exports: &self.exports,
            template: &self.template,
        };
        let flags = match greet(&mut stream) {
            Ok(Some(flags)) => flags,
            Ok(None) | Err(_) => {
                return Negotiated {
                    stream,
                    relay: None,
                    chosen: None,
                }
            }
        };
        let state = match self.tls.as_ref().map(Tls::mode) {
            None => TlsState::Unavailable,
            Some(TlsMode::On) => TlsState::Offered,
            Some(TlsMode::Require) => TlsState::Required,
        };
        let mut relay = None;
        let mut outcome = negotiate(&mut stream, &offered, flags, state);
        if let (Ok(Outcome::StartTls), Some(config)) = (&outcome, &self.tls) {
            let plain = stream
                .try_clone()
                .and_then(|socket| tls::start(socket, config, HANDSHAKE_TIMEOUT));
            outcome = match plain {
                Ok((plain, started)) => {
                    stream = plain;
                    relay = Some(started);
                    stream
                        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
                        .and_then(|()| stream.set_write_timeout(Some(REPLY_TIMEOUT)))
                        .and_then(|()| negotiate(&mut stream, &offered, flags, TlsState::Running))
                }
                Err(e) => Err(e),
            };
        }
        let chosen = match outcome {
            Ok(Outcome::Transmission { structured, name }) => Some((structured, name)),
            Ok(Outcome::StartTls | Outcome::Closed) | Err(_) => None,
        };
        Negotiated {
            stream,
            relay,
            chosen,
        }
    }
}

/// Bind a Unix socket readable and writable by the owner only, replacing a stale socket file.
fn bind_unix(path: &Path) -> Result<UnixListener, Error> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(Error::Busy(format!(
                "{} exists and is not a socket",
                path.display()
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(Error::Busy(format!(
                "a server is already listening on {}",
                path.display()
            )));
        }
        fs::remove_file(path).map_err(|source| Error::Bind {
            address: path.display().to_string(),
            source,
        })?;
    }
    // The socket is created with mode 0600 from the start (no window in which another user
    // could connect), then set explicitly in case the umask was stricter about the owner.
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound.map_err(|source| Error::Bind {
        address: path.display().to_string(),
        source,
    })?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(|source| Error::Bind {
        address: path.display().to_string(),
        source,
    })?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::percent_encode;

    #[test]
    fn uri_parts_are_percent_encoded() {
        assert_eq!(
            percent_encode(b"/tmp/a b/s?.sock", true),
            "/tmp/a%20b/s%3F.sock"
        );
        assert_eq!(percent_encode(b"my disk/1%", false), "my%20disk%2F1%25");
        assert_eq!(percent_encode(b"plain-name_1.~", false), "plain-name_1.~");
    }
}
