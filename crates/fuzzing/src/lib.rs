//! The bodies of the fuzz targets: one function per parser that takes untrusted bytes, each
//! feeding them to the parser and then doing what a user would do next with what it accepted
//! (dump it, attach it and read the volumes, serve requests). For any input a target must
//! return: no panic, no hang, no allocation beyond what its bounded input justifies.
//!
//! cargo-fuzz (`fuzz/`, outside the workspace, nightly) has one tiny binary per function; the
//! stable test `tests/corpus.rs` replays every committed corpus and regression input through
//! the same functions in the test command. [`TARGETS`] lists them for both.
//!
//! Where a target needs a device, it is built in memory around the input; sizes are fixed and
//! small so that an execution takes milliseconds at most.

mod flash;
mod integrity;
mod kpio;
mod luks;
mod nbd;
mod padded;
mod ubi;

/// The token types' parsers of bytes from devices and servers (CBOR, CTAPHID, HTTP, FIDO2
/// authenticator data, TPM structures, JOSE): the first byte picks the parser
/// (`sectorcrypt_token::fuzzing::wire`).
pub fn token_wire(data: &[u8]) {
    sectorcrypt_token::fuzzing::wire(data);
}

pub use flash::{flash_metadata, flash_trace, nanddump_device};
pub use integrity::integrity_device;
pub use kpio::kpio_keytable;
pub use luks::{luks1, luks2_json, luks_header};
pub use nbd::nbd_session;
pub use ubi::ubi_attach;

/// A fuzz target: its name (the cargo-fuzz binary and the corpus directory) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("luks_header", luks_header),
    ("luks2_json", luks2_json),
    ("luks1", luks1),
    ("ubi_attach", ubi_attach),
    ("flash_metadata", flash_metadata),
    ("nbd_session", nbd_session),
    ("kpio_keytable", kpio_keytable),
    ("nanddump_device", nanddump_device),
    ("flash_trace", flash_trace),
    ("token_wire", token_wire),
    ("integrity_device", integrity_device),
];
