//! An NBD server for sectorcrypt volumes: any NBD client (qemu, `nbdcopy`, `nbdinfo`, fio's
//! `nbd` engine, the kernel's `nbd-client`) reads and writes the decrypted volume.
//!
//! Modules: [`proto`] (wire constants and encodings), `exports` (one volume, or a key-per-I/O
//! table with an export per key tag), `handshake` (fixed newstyle option haggling, STARTTLS
//! included), [`tls`] (certificates or pre-shared keys, and the relay that runs a connection's TLS
//! session), `transmission` (one connection's requests: a few workers take turns reading the
//! socket, leader/follower as in nbdkit, and each runs the request it read and replies, out of
//! order), `server` (listeners, connections, stopping).
//!
//! Design choices:
//! - The volume does the work: each NBD request becomes one volume call, and so one extended
//!   request for the cipher, whatever its size. The server adds no lock of its own around the
//!   volume; partial-sector writes lock only their sector inside the volume.
//! - Writes are encrypted in the buffer the payload was received into, and reads are decrypted in
//!   the buffer the reply is sent from, header included: one copy in, one copy out, one
//!   `write` per reply.
//! - Block sizes advertised: minimum = the encryption sector size (smaller requests work, by
//!   read-modify-write, but cost a read), preferred = at least 4 KiB, maximum payload 32 MiB.
//! - Only the fixed newstyle handshake, as every current client speaks it; no block status (the
//!   volume has no holes to report).
//! - TLS as nbdkit offers it (`NBD_OPT_STARTTLS`, off, on or required; X.509 certificates from
//!   nbdkit's file names; client certificates checked when a CA is given) on rustls, or with
//!   nbdkit's pre-shared key files on OpenSSL (rustls has no external pre-shared keys).

mod exports;
mod handshake;
pub mod proto;
mod server;
mod stream;
pub mod tls;
mod transmission;

pub use exports::Exports;
pub use handshake::ExportInfo;
pub use server::{serve_connection, Listen, Server, ServerOptions, StopHandle, MAX_PAYLOAD};
pub use tls::{Tls, TlsMode};

use std::fmt;
use std::io;
use std::path::PathBuf;

/// What can stop a server from starting or finishing.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The address or socket path is taken by a live server (or is not a socket).
    Busy(String),
    /// Binding failed for another reason.
    Bind {
        /// The address or socket path.
        address: String,
        /// Why binding failed.
        source: io::Error,
    },
    /// The final flush failed.
    Volume(sectorcrypt_volume::Error),
    /// A TLS certificate, key or pre-shared key file is missing, unreadable or unusable.
    Tls {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Busy(why) => write!(f, "{why}"),
            Error::Bind { address, source } => write!(f, "cannot listen on {address}: {source}"),
            Error::Volume(e) => write!(f, "flushing the volume failed: {e}"),
            Error::Tls { path, why } => write!(f, "TLS: {}: {why}", path.display()),
        }
    }
}

impl std::error::Error for Error {}
