//! Measurements of the cipher core, as `sectorcrypt benchmark` prints them.
//!
//! - [`speed`]: bytes per second of a sector cipher for a spec, key size, sector size, request size
//!   and thread count (the table and the `--json` lines of `docs/CLI.md`).
//! - [`breakdown`]: the dm-crypt paper's Tables 1 and 2: time per XTS phase (tweak, first XOR, ECB,
//!   second XOR, other) over a large buffer cut into one-sector requests vs 4 KiB requests.
//! - [`flash`]: UBI's LEB write and read throughput on a simulated chip with and without the
//!   encryption layer below it, by request size, and the cipher work per PEB written.
//! - [`wear`]: erases per eraseblock when a recorded UBI trace is replayed with and without the
//!   encryption layer (the thesis' 24.43x).
//! - [`synthetic`]: workloads with syncs (sequential and random LEB rewrites, a journal, small
//!   synced writes, volume updates) run on our UBI and recorded as traces for [`wear`].
//! - [`io`]: timed reads or writes on an unlocked volume against the same requests on its
//!   storage (`sectorcrypt benchmark --device`, as `rbd bench` times an image).
//! - [`kpio`]: requests under a key drawn per request from a table of N keys (Key Per I/O)
//!   against the same requests under one key.
//! - [`report`]: the P/E study and the flash throughput as a Markdown report with SVG figures
//!   and the raw rows as JSON (`sectorcrypt flash study --report`).
//! - [`tcrypt`]: cycles per 4096-byte operation for ECB/CBC/CTR/XTS, as the Linux `tcrypt` speed
//!   test reports them (the LEA kernel patch's table).
//! - [`steal`]: the hypervisor's steal over a round, so that [`speed`] and [`kpio`] take a stolen
//!   round again.
//!
//! Numbers are medians over several timed slices after a warm-up, so one descheduled slice on a
//! shared machine does not move them much; [`speed`] and [`kpio`] also take a slice again when
//! the hypervisor stole the CPU during it ([`steal`]). Cycles use the TSC rate ([`sectorcrypt_cipher::tsc`]).

pub mod breakdown;
pub mod flash;
pub mod io;
pub mod kpio;
pub mod report;
pub mod speed;
pub mod steal;
mod svg;
pub mod synthetic;
pub mod tcrypt;
pub mod wear;

use rand::RngCore;

/// A buffer of random bytes (random so that no backend can take a shortcut on zeros).
pub(crate) fn random_buffer(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

/// Median of a non-empty list.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
