//! The encryption layer at the thesis' cut point: a [`Flash`] that encrypts everything another
//! [`Flash`] stores, so that UBI above it works unchanged while the chip holds only ciphertext.
//!
//! # Units and IVs
//!
//! The unit of encryption is the sub-page (the smallest piece UBI programs on its own: its EC and
//! VID headers); on chips without sub-pages that is the page. Unit `u` of eraseblock `peb` is
//! sector `peb * units_per_peb + u` of the cipher (`plain64`, counted in units, not in 512-byte
//! sectors), so every unit of the chip has its own IV and a unit's ciphertext does not depend on
//! any other unit. A read, a program or a whole-block fill is one extended request to the cipher
//! (every unit of the run in one call).
//!
//! # Erased space
//!
//! Above the layer the chip behaves as NAND: an erased block reads 0xFF, a program clears bits,
//! programming 0xFF changes nothing. Below it, a unit whose ciphertext is all 0xFF (physically
//! erased) reads as erased plaintext; that is how [`Policy::Visible`] stores free space and how
//! a block whose rewrite a power cut interrupted reads back. With [`Policy::Thesis`] nothing is
//! left erased:
//!
//! - **erase**: the block is erased, then programmed whole with encrypted 0xFF, so that the chip
//!   shows no free space;
//! - **program**: the block's plaintext is read, the new data merged into it (NAND's AND), and
//!   the block erased and programmed whole again (read-modify-erase-write), so every program
//!   costs an erase. This is the thesis' design and its measured cost (24x the erases of plain
//!   UBI); the policies that cut it belong to the next step of the work.
//!
//! # Power cuts
//!
//! A cut during the physical erase or program of a block leaves, as on plain NAND, a block that
//! is partly erased and partly programmed, one page undefined. Under [`Policy::Visible`] a
//! program is a program, with exactly NAND's guarantees. Under [`Policy::Thesis`] a cut inside a
//! read-modify-erase-write also loses what the block held before (the thesis' design has this
//! window; UBI recovers from it as from a torn write for new data, by its CRCs, but data synced
//! earlier into the same block is gone): that is recorded here and measured by the crash sweeps
//! rather than hidden.
//!
//! # Counts
//!
//! The layer counts what it is asked (erases, programs and their bytes) and what it does (erases
//! and page programs it issues per block, read-modify-erase-writes, cipher calls and bytes): its
//! ground truth, separate from UBI's erase counters.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use sectorcrypt_cipher::{CipherSpec, SectorCipher, SectorOptions};

use crate::{Error, Flash, Geometry, ReadStatus};

/// How erased space is stored (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// The thesis: erased space stored as encrypted 0xFF; every program is a
    /// read-modify-erase-write of its block.
    Thesis,
    /// Erased space left physically erased: no extra erases, but the chip shows which blocks and
    /// pages are free.
    Visible,
}

impl Policy {
    /// Its name in headers and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Thesis => "thesis",
            Policy::Visible => "visible",
        }
    }

    /// The policy called `name`.
    pub fn from_name(name: &str) -> Option<Policy> {
        match name {
            "thesis" => Some(Policy::Thesis),
            "visible" => Some(Policy::Visible),
            _ => None,
        }
    }
}

/// What the layer was asked and what it did, since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CryptStats {
    /// Erases asked from above.
    pub erases: u64,
    /// Programs asked from above, and their bytes.
    pub programs: u64,
    /// Bytes of those programs.
    pub program_bytes: u64,
    /// Erases issued to the chip.
    pub chip_erases: u64,
    /// Pages programmed on the chip (a page programmed in several sub-page steps counts each).
    pub chip_page_programs: u64,
    /// Programs that needed a read-modify-erase-write of their block.
    pub rewrites: u64,
    /// Calls into the cipher (each an extended request over a run of units).
    pub cipher_calls: u64,
    /// Bytes through the cipher.
    pub cipher_bytes: u64,
}

#[derive(Default)]
struct Counters {
    erases: AtomicU64,
    programs: AtomicU64,
    program_bytes: AtomicU64,
    chip_erases: AtomicU64,
    chip_page_programs: AtomicU64,
    rewrites: AtomicU64,
    cipher_calls: AtomicU64,
    cipher_bytes: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// A [`Flash`] whose contents are encrypted on another one (see the module docs).
pub struct CryptFlash {
    inner: Arc<dyn Flash>,
    cipher: SectorCipher,
    policy: Policy,
    geometry: Geometry,
    unit: usize,
    /// One lock per eraseblock: a rewrite and a read of the same block never interleave.
    locks: Vec<Mutex<()>>,
    erase_counts: Vec<AtomicU32>,
    counters: Counters,
}

impl CryptFlash {
    /// Encrypt `inner` with `spec` under `key` (the whole key, both halves for XTS), storing
    /// erased space as `policy` says.
    ///
    /// Errors: [`Error::Geometry`] if the chip's sub-page is not a size the cipher has sectors
    /// of (512 to 4096 bytes); [`Error::Format`] if the cipher refuses the spec or key.
    pub fn new(
        inner: Arc<dyn Flash>,
        spec: CipherSpec,
        key: &[u8],
        policy: Policy,
        options: &SectorOptions,
    ) -> Result<CryptFlash, Error> {
        let geometry = inner.geometry();
        let unit = geometry.sub_page_size as usize;
        if !sectorcrypt_cipher::sector::SECTOR_SIZES.contains(&unit) {
            return Err(Error::Geometry(format!(
                "{unit}-byte sub-pages cannot be encrypted units (512, 1024, 2048 or 4096 bytes)"
            )));
        }
        let options = SectorOptions {
            sector_size: unit,
            iv_large_sectors: true,
            iv_offset: 0,
            ..options.clone()
        };
        let cipher = SectorCipher::new(spec, key, &options)
            .map_err(|e| Error::Format(format!("flash cipher {spec}: {e}")))?;
        let blocks = geometry.peb_count as usize;
        Ok(CryptFlash {
            inner,
            cipher,
            policy,
            geometry,
            unit,
            locks: (0..blocks).map(|_| Mutex::new(())).collect(),
            erase_counts: (0..blocks).map(|_| AtomicU32::new(0)).collect(),
            counters: Counters::default(),
        })
    }

    /// The chip below.
    pub fn inner(&self) -> &Arc<dyn Flash> {
        &self.inner
    }

    /// How erased space is stored.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The cipher's sector (IV) number of byte `offset` of eraseblock `peb` (a unit boundary).
    pub fn unit_number(&self, peb: u32, offset: u32) -> u64 {
        let per_peb = u64::from(self.geometry.peb_size) / self.unit as u64;
        u64::from(peb) * per_peb + u64::from(offset) / self.unit as u64
    }

    /// What was asked and done since opening.
    pub fn stats(&self) -> CryptStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CryptStats {
            erases: get(&c.erases),
            programs: get(&c.programs),
            program_bytes: get(&c.program_bytes),
            chip_erases: get(&c.chip_erases),
            chip_page_programs: get(&c.chip_page_programs),
            rewrites: get(&c.rewrites),
            cipher_calls: get(&c.cipher_calls),
            cipher_bytes: get(&c.cipher_bytes),
        }
    }

    /// Erases this layer issued to each eraseblock since opening.
    pub fn erase_counts(&self) -> Vec<u32> {
        self.erase_counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    fn lock(&self, peb: u32) -> std::sync::MutexGuard<'_, ()> {
        self.locks[peb as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn crypt(&self, buf: &mut [u8], peb: u32, offset: u32, encrypt: bool) -> Result<(), Error> {
        let sector = self.unit_number(peb, offset);
        let done = if encrypt {
            self.cipher.encrypt(buf, sector)
        } else {
            self.cipher.decrypt(buf, sector)
        };
        done.map_err(|e| Error::Format(format!("flash cipher: {e}")))?;
        add(&self.counters.cipher_calls, 1);
        add(&self.counters.cipher_bytes, buf.len() as u64);
        Ok(())
    }

    /// Decrypt the units of `raw` (read from unit-aligned `offset` of `peb`) in place: each run
    /// of units that are not physically erased in one call, erased units left as 0xFF.
    fn decrypt_units(&self, raw: &mut [u8], peb: u32, offset: u32) -> Result<(), Error> {
        for run in written_runs(raw, self.unit) {
            let at = offset + run.start as u32;
            self.crypt(&mut raw[run], peb, at, false)?;
        }
        Ok(())
    }

    /// Encrypt the units of `buf` (at unit-aligned `offset` of `peb`) that are not all 0xFF,
    /// leaving the others as 0xFF (erased space that stays erased).
    fn encrypt_written_units(&self, buf: &mut [u8], peb: u32, offset: u32) -> Result<(), Error> {
        for run in written_runs(buf, self.unit) {
            let at = offset + run.start as u32;
            self.crypt(&mut buf[run], peb, at, true)?;
        }
        Ok(())
    }

    /// Program `raw` (ciphertext, or 0xFF for units to leave erased) at unit-aligned `offset` of
    /// `peb`: each run of units that are not all 0xFF, in ascending order.
    fn program_units(&self, peb: u32, offset: u32, raw: &[u8]) -> Result<(), Error> {
        let page = self.geometry.page_size as usize;
        for run in written_runs(raw, self.unit) {
            let (start, end) = (offset as usize + run.start, offset as usize + run.end);
            self.inner.program(peb, start as u32, &raw[run])?;
            add(
                &self.counters.chip_page_programs,
                (end.div_ceil(page) - start / page) as u64,
            );
        }
        Ok(())
    }

    fn chip_erase(&self, peb: u32) -> Result<(), Error> {
        self.inner.erase(peb)?;
        add(&self.counters.chip_erases, 1);
        self.erase_counts[peb as usize].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Erase `peb` and store `plain`, the block's whole contents, as the policy says (what an
    /// in-place conversion writes: one erase, one program, whatever the contents).
    ///
    /// Errors: [`Error::OutOfRange`] for a `plain` that is not one block; the chip's errors.
    pub fn store(&self, peb: u32, plain: Vec<u8>) -> Result<(), Error> {
        self.geometry.check_range(peb, 0, plain.len())?;
        if plain.len() != self.geometry.peb_size as usize {
            return Err(Error::OutOfRange(format!(
                "{} bytes are not one {}-byte eraseblock",
                plain.len(),
                self.geometry.peb_size
            )));
        }
        let _guard = self.lock(peb);
        add(&self.counters.erases, 1);
        self.store_block(peb, plain)
    }

    /// Erase `peb` and store `plain` (the whole block) as the policy says.
    fn store_block(&self, peb: u32, mut plain: Vec<u8>) -> Result<(), Error> {
        self.chip_erase(peb)?;
        match self.policy {
            Policy::Thesis => self.crypt(&mut plain, peb, 0, true)?,
            Policy::Visible => self.encrypt_written_units(&mut plain, peb, 0)?,
        }
        self.program_units(peb, 0, &plain)
    }

    /// The plaintext of units `offset .. offset + len` of `peb` (unit-aligned).
    fn read_plain(&self, peb: u32, offset: u32, len: usize) -> Result<Vec<u8>, Error> {
        let mut raw = vec![0u8; len];
        self.inner.read(peb, offset, &mut raw)?;
        self.decrypt_units(&mut raw, peb, offset)?;
        Ok(raw)
    }
}

fn is_erased(unit: &[u8]) -> bool {
    unit.iter().all(|&b| b == 0xFF)
}

/// The byte ranges of `buf`'s maximal runs of `unit`-byte units that are not all 0xFF.
fn written_runs(buf: &[u8], unit: usize) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, u) in buf.chunks(unit).enumerate() {
        if is_erased(u) {
            continue;
        }
        match runs.last_mut() {
            Some(run) if run.end == i * unit => run.end += u.len(),
            _ => runs.push(i * unit..i * unit + u.len()),
        }
    }
    runs
}

impl Flash for CryptFlash {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, Error> {
        self.geometry.check_range(peb, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(ReadStatus::default());
        }
        // Whole units around the range: the head and tail units are decrypted whole.
        let unit = self.unit as u32;
        let start = offset / unit * unit;
        let end = (offset + buf.len() as u32).div_ceil(unit) * unit;
        let _guard = self.lock(peb);
        let mut raw = vec![0u8; (end - start) as usize];
        let read = self.inner.read(peb, start, &mut raw);
        // MTD hands back what it read even when it was uncorrectable: so does the layer.
        if let Ok(_) | Err(Error::Uncorrectable { .. }) = read {
            self.decrypt_units(&mut raw, peb, start)?;
            let from = (offset - start) as usize;
            buf.copy_from_slice(&raw[from..from + buf.len()]);
        }
        read
    }

    fn program(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        self.geometry.check_range(peb, offset, data.len())?;
        let unit = self.unit;
        if !(offset as usize).is_multiple_of(unit) || !data.len().is_multiple_of(unit) {
            return Err(Error::Unaligned(format!(
                "a program of {} bytes at offset {offset} is not in whole {unit}-byte sub-pages",
                data.len()
            )));
        }
        add(&self.counters.programs, 1);
        add(&self.counters.program_bytes, data.len() as u64);
        let _guard = self.lock(peb);
        let peb_size = self.geometry.peb_size as usize;
        let old = self.read_plain(peb, offset, data.len())?;
        let merged: Vec<u8> = old.iter().zip(data).map(|(o, d)| o & d).collect();
        if merged == old {
            // Programming only ones: NAND changes nothing, neither does the layer.
            return Ok(());
        }
        let in_place = self.policy == Policy::Visible
            && old
                .chunks(unit)
                .zip(merged.chunks(unit))
                .all(|(o, m)| o == m || is_erased(o));
        if in_place {
            // Every changed unit is physically erased: program just those.
            let mut raw = merged;
            for (r, o) in raw.chunks_mut(unit).zip(old.chunks(unit)) {
                if !is_erased(o) {
                    r.fill(0xFF);
                }
            }
            self.encrypt_written_units(&mut raw, peb, offset)?;
            return self.program_units(peb, offset, &raw);
        }
        let mut block = self.read_plain(peb, 0, peb_size)?;
        block[offset as usize..offset as usize + data.len()].copy_from_slice(&merged);
        add(&self.counters.rewrites, 1);
        self.store_block(peb, block)
    }

    fn erase(&self, peb: u32) -> Result<(), Error> {
        self.geometry.check_range(peb, 0, 0)?;
        add(&self.counters.erases, 1);
        let _guard = self.lock(peb);
        match self.policy {
            Policy::Thesis => self.store_block(peb, vec![0xFF; self.geometry.peb_size as usize]),
            Policy::Visible => self.chip_erase(peb),
        }
    }

    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), Error> {
        self.inner.read_oob(peb, page, buf)
    }

    fn is_bad(&self, peb: u32) -> Result<bool, Error> {
        self.inner.is_bad(peb)
    }

    fn mark_bad(&self, peb: u32) -> Result<(), Error> {
        self.inner.mark_bad(peb)
    }

    fn sync(&self) -> Result<(), Error> {
        self.inner.sync()
    }
}
