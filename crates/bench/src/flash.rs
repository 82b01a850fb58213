//! Throughput of UBI on a simulated chip with and without the encryption layer below it, by
//! request size from one minimum I/O unit to a whole LEB: the thesis' throughput-vs-block-size
//! view, with the plain stack as the peer in the same run, and what one encrypted PEB write
//! costs in cipher calls and bytes.
//!
//! Each case builds the stack in memory (a 32 MiB chip of the default SLC geometry, UBI
//! formatted on it, one dynamic volume), then writes `bytes` sequentially LEB by LEB in
//! `request_size` pieces (the last piece of a LEB is what is left of it) and reads them back
//! the same way; each phase is timed whole, the median of `rounds` fresh stacks is reported.
//! The simulated chip costs memory copies, a real one program and erase time; so the chip's page
//! programs, page reads and erases are counted too, and turned into the time a typical SLC chip
//! would take ([`SLC_TIMES`]): the figure that says what a user of real flash would see.
//!
//! The cipher's share is the time the same bytes take in the cipher alone (measured by
//! [`crate::speed`] in the same run, at the layer's unit and the mean size of its cipher calls)
//! over the write phase's time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_cipher::{BackendChoice, Direction, SectorOptions};
use sectorcrypt_flash::crypt::{rewrite_journal_blocks, CryptFlash, CryptStats, Policy};
use sectorcrypt_flash::part::Partition;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::{Error as FlashError, Flash, Geometry, ReadStatus};
use sectorcrypt_storage::MemStorage;
use sectorcrypt_ubi::media::VolType;
use sectorcrypt_ubi::{AttachOptions, NewVolume, Ubi};
use serde::Serialize;

use crate::speed::{self, SpeedCase};

/// What UBI works on, and the encryption layer in it if there is one.
pub(crate) type Layered = (Arc<dyn Flash>, Option<Arc<CryptFlash>>);

/// A stack to measure.
#[derive(Clone, Copy, Debug)]
pub enum Stack {
    /// UBI straight on the chip.
    Plain,
    /// UBI on the encryption layer with this cipher and erased-space policy.
    Encrypted(CipherSpec, Policy),
    /// As `Encrypted`, with the free space hidden (as at a detach) once more when a trace's
    /// workload starts: what one more attach between set-up and workload costs.
    Reattached(CipherSpec, Policy),
}

impl Stack {
    pub(crate) fn name(self) -> String {
        match self {
            Stack::Plain => "plain".into(),
            Stack::Encrypted(spec, policy) => format!("{spec} {}", policy.name()),
            Stack::Reattached(spec, policy) => format!("{spec} {} re-attached", policy.name()),
        }
    }

    /// Eraseblocks the chip needs besides UBI's `ubi_blocks`: the layer's rewrite journal,
    /// after them.
    pub(crate) fn journal_blocks(self, ubi_blocks: u32) -> u32 {
        match self {
            Stack::Encrypted(_, p) | Stack::Reattached(_, p) if p.hides_at_rest() => {
                rewrite_journal_blocks(ubi_blocks)
            }
            _ => 0,
        }
    }

    /// The flash UBI works on over `chip` (its first `ubi_blocks` blocks; the rest the
    /// journal's), and the layer if there is one, keyed with a random key.
    pub(crate) fn over(self, chip: Arc<dyn Flash>, ubi_blocks: u32) -> Result<Layered, FlashError> {
        let (Stack::Encrypted(spec, policy) | Stack::Reattached(spec, policy)) = self else {
            return Ok((chip, None));
        };
        let key = crate::random_buffer(spec.default_key_bits() / 8);
        let options = SectorOptions::default();
        let journal = chip.geometry().peb_count - ubi_blocks;
        let crypt = if journal == 0 {
            CryptFlash::new(chip, spec, &key, policy, &options)?
        } else {
            let data = Arc::new(Partition::range(Arc::clone(&chip), 0, ubi_blocks)?);
            let journal = Arc::new(Partition::range(chip, ubi_blocks, journal)?);
            CryptFlash::with_journal(data, journal, spec, &key, policy, &options)?
        };
        let crypt = Arc::new(crypt);
        Ok((Arc::clone(&crypt) as Arc<dyn Flash>, Some(crypt)))
    }
}

/// The stacks of the default run: plain, XTS under the default policy and with free space
/// visible, and XTS and the thesis' CBC-ESSIV under the thesis' policy.
pub fn default_stacks() -> Vec<Stack> {
    let xts = CipherSpec::parse("aes-xts-plain64").expect("built-in spec");
    let cbc = CipherSpec::parse("aes-cbc-essiv:sha256").expect("built-in spec");
    vec![
        Stack::Plain,
        Stack::Encrypted(xts, Policy::AtRest),
        Stack::Encrypted(xts, Policy::Visible),
        Stack::Encrypted(xts, Policy::Thesis),
        Stack::Encrypted(cbc, Policy::Thesis),
    ]
}

/// Request sizes of the default run: one page (the minimum I/O unit) to a whole LEB.
pub const DEFAULT_REQUESTS: [usize; 5] = [2048, 8192, 16384, 65536, 129_024];

/// Typical SLC NAND times (datasheet orders of magnitude for 2 KiB-page chips): page read
/// (tR, with the transfer), page program (tPROG), block erase (tBERS), in seconds.
pub const SLC_TIMES: (f64, f64, f64) = (25e-6, 200e-6, 2e-3);

/// The chip below everything, counting what it is asked in pages and erases.
struct Counted {
    chip: Arc<dyn Flash>,
    page: u32,
    pages_read: AtomicU64,
    pages_programmed: AtomicU64,
    erases: AtomicU64,
}

impl Counted {
    fn pages(&self, offset: u32, len: usize) -> u64 {
        if len == 0 {
            return 0;
        }
        u64::from((offset + len as u32).div_ceil(self.page) - offset / self.page)
    }

    /// Seconds a typical SLC chip would spend on what was counted.
    fn slc_seconds(&self) -> f64 {
        let (read, program, erase) = SLC_TIMES;
        self.pages_read.load(Ordering::Relaxed) as f64 * read
            + self.pages_programmed.load(Ordering::Relaxed) as f64 * program
            + self.erases.load(Ordering::Relaxed) as f64 * erase
    }

    fn reset(&self) {
        for c in [&self.pages_read, &self.pages_programmed, &self.erases] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

impl Flash for Counted {
    fn geometry(&self) -> Geometry {
        self.chip.geometry()
    }
    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, FlashError> {
        self.pages_read
            .fetch_add(self.pages(offset, buf.len()), Ordering::Relaxed);
        self.chip.read(peb, offset, buf)
    }
    fn program(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), FlashError> {
        self.pages_programmed
            .fetch_add(self.pages(offset, data.len()), Ordering::Relaxed);
        self.chip.program(peb, offset, data)
    }
    fn erase(&self, peb: u32) -> Result<(), FlashError> {
        self.erases.fetch_add(1, Ordering::Relaxed);
        self.chip.erase(peb)
    }
    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), FlashError> {
        self.chip.read_oob(peb, page, buf)
    }
    fn is_bad(&self, peb: u32) -> Result<bool, FlashError> {
        self.chip.is_bad(peb)
    }
    fn mark_bad(&self, peb: u32) -> Result<(), FlashError> {
        self.chip.mark_bad(peb)
    }
    fn sync(&self) -> Result<(), FlashError> {
        self.chip.sync()
    }

    fn is_read_only(&self) -> bool {
        self.chip.is_read_only()
    }
}

/// One measured line.
#[derive(Clone, Debug, Serialize)]
pub struct FlashMeasurement {
    /// `plain`, or the cipher and policy.
    pub stack: String,
    /// Bytes per LEB write or read.
    pub request_size: usize,
    /// LEB write throughput.
    pub write_bytes_per_sec: f64,
    /// LEB read throughput.
    pub read_bytes_per_sec: f64,
    /// LEB write throughput a typical SLC chip would give ([`SLC_TIMES`], host time not counted).
    pub slc_write_bytes_per_sec: f64,
    /// LEB read throughput a typical SLC chip would give.
    pub slc_read_bytes_per_sec: f64,
    /// Chip erases per PEB the writes filled.
    pub erases_per_peb: f64,
    /// Cipher calls per PEB the writes filled (0 for the plain stack).
    pub cipher_calls_per_peb: f64,
    /// Bytes through the cipher per PEB the writes filled.
    pub cipher_bytes_per_peb: f64,
    /// The share of the write phase's time the cipher alone would take.
    pub cipher_share_of_write: f64,
}

/// The chip of every measurement (the default SLC geometry, 32 MiB).
pub(crate) fn geometry() -> Geometry {
    Geometry {
        peb_count: 256,
        ..Geometry::default()
    }
}

/// One round's counts.
struct Round {
    write_secs: f64,
    read_secs: f64,
    slc_write_secs: f64,
    slc_read_secs: f64,
    bytes: f64,
    pebs: f64,
    chip_erases: u64,
    cipher: CryptStats,
}

/// Build `stack` in memory, write `bytes` (whole LEBs) in `request_size` pieces and read them
/// back.
fn round(stack: Stack, request_size: usize, bytes: usize) -> Round {
    let g = Geometry {
        peb_count: geometry().peb_count + stack.journal_blocks(geometry().peb_count),
        ..geometry()
    };
    let sim = Arc::new(
        SimNand::create(
            MemStorage::new(vec![0; SimNand::image_len(&g) as usize]),
            g,
            &[],
        )
        .expect("a chip in memory"),
    );
    let counted = Arc::new(Counted {
        chip: Arc::clone(&sim) as Arc<dyn Flash>,
        page: g.page_size,
        pages_read: AtomicU64::new(0),
        pages_programmed: AtomicU64::new(0),
        erases: AtomicU64::new(0),
    });
    let (flash, crypt) = stack
        .over(Arc::clone(&counted) as Arc<dyn Flash>, geometry().peb_count)
        .expect("the layer");
    let ubi = Ubi::attach(flash, &AttachOptions::default()).expect("UBI");
    let leb = ubi.info().layout.leb_size as usize;
    let lebs = bytes.div_ceil(leb) as u32;
    let id = ubi
        .create_volume(&NewVolume {
            id: None,
            name: "bench".into(),
            lebs,
            vol_type: VolType::Dynamic,
            alignment: 1,
            autoresize: false,
        })
        .expect("a volume");
    let data = crate::random_buffer(leb);
    let erases = || {
        sim.erase_counts()
            .iter()
            .map(|&e| u64::from(e))
            .sum::<u64>()
    };
    let stats = || crypt.as_ref().map(|c| c.stats()).unwrap_or_default();
    let (erases_before, stats_before) = (erases(), stats());
    counted.reset();
    let t = Instant::now();
    for lnum in 0..lebs {
        for (i, piece) in data.chunks(request_size).enumerate() {
            ubi.write(id, lnum, (i * request_size) as u32, piece)
                .expect("a LEB write");
        }
    }
    let write_secs = t.elapsed().as_secs_f64();
    let slc_write_secs = counted.slc_seconds();
    let after = stats();
    let cipher = CryptStats {
        cipher_calls: after.cipher_calls - stats_before.cipher_calls,
        cipher_bytes: after.cipher_bytes - stats_before.cipher_bytes,
        ..CryptStats::default()
    };
    let chip_erases = erases() - erases_before;
    let mut buf = vec![0u8; request_size];
    counted.reset();
    let t = Instant::now();
    for lnum in 0..lebs {
        let mut at = 0;
        while at < leb {
            let n = request_size.min(leb - at);
            ubi.read(id, lnum, at as u32, &mut buf[..n])
                .expect("a LEB read");
            at += n;
        }
    }
    Round {
        write_secs,
        read_secs: t.elapsed().as_secs_f64(),
        slc_write_secs,
        slc_read_secs: counted.slc_seconds(),
        bytes: f64::from(lebs) * leb as f64,
        pebs: f64::from(lebs),
        chip_erases,
        cipher,
    }
}

/// Measure `stack` at `request_size`, writing and reading `bytes` (rounded up to whole LEBs)
/// on `rounds` fresh stacks; the round with the median write time is reported.
///
/// # Panics
/// If the stack cannot be built in memory (a bug, not a measurement).
pub fn measure(stack: Stack, request_size: usize, bytes: usize, rounds: usize) -> FlashMeasurement {
    let mut all: Vec<Round> = (0..rounds.max(1))
        .map(|_| round(stack, request_size, bytes))
        .collect();
    all.sort_by(|a, b| a.write_secs.total_cmp(&b.write_secs));
    let reads = crate::median(all.iter().map(|r| r.bytes / r.read_secs).collect());
    let r = &all[all.len() / 2];
    let cipher_share = match stack {
        Stack::Plain => 0.0,
        Stack::Encrypted(spec, _) | Stack::Reattached(spec, _) => {
            // The cipher alone, at the layer's unit and its mean request size in this round.
            let unit = geometry().sub_page_size as usize;
            let mean = r.cipher.cipher_bytes / r.cipher.cipher_calls.max(1);
            let case = SpeedCase {
                spec,
                key_bits: spec.default_key_bits(),
                sector_size: unit,
                request_size: (mean as usize).div_ceil(unit).max(1) * unit,
                threads: 1,
                backend: BackendChoice::Auto,
            };
            let rate = speed::measure(&case, Direction::Encrypt, 0.2)
                .map_or(f64::INFINITY, |m| m.bytes_per_sec);
            r.cipher.cipher_bytes as f64 / rate / r.write_secs
        }
    };
    FlashMeasurement {
        stack: stack.name(),
        request_size,
        write_bytes_per_sec: r.bytes / r.write_secs,
        read_bytes_per_sec: reads,
        slc_write_bytes_per_sec: r.bytes / r.slc_write_secs,
        slc_read_bytes_per_sec: r.bytes / r.slc_read_secs,
        erases_per_peb: r.chip_erases as f64 / r.pebs,
        cipher_calls_per_peb: r.cipher.cipher_calls as f64 / r.pebs,
        cipher_bytes_per_peb: r.cipher.cipher_bytes as f64 / r.pebs,
        cipher_share_of_write: cipher_share,
    }
}
