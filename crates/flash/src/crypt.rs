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
//! erased) reads as erased plaintext, and so does *filler*: a unit holding the encryption of
//! 0xFF under its own IV, which looks like any other ciphertext. The policies differ in when free
//! space is filler and so hidden (measured in `docs/BENCHMARKS.md`):
//!
//! - [`Policy::Thesis`], the thesis' design: always. An erase is followed by filling the whole
//!   block; every program is a read-modify-erase-write of its block (the old plaintext read,
//!   the new data merged in with NAND's AND, the block erased and programmed whole). Its cost:
//!   an erase per program, 24x the erases of plain UBI in the thesis.
//! - [`Policy::Visible`]: never. Free space stays physically erased; no extra erase, but the
//!   chip shows which blocks and pages are free.
//! - [`Policy::AtRest`]: free space is physically erased while the device is attached, and
//!   filled when it is detached ([`CryptFlash::hide_free_space`], which the owner calls on
//!   close, when idle and at a bounded interval). A program into erased space is a plain
//!   program; the first program into a filled tail after a fill is one read-modify-erase-write
//!   of its block, which leaves the block's tail erased again, so it costs one erase per block
//!   per fill, not one per write. A program also fills any erased units between the block's
//!   last programmed unit and itself (the sub-pages of page 0 UBI leaves between its VID header
//!   and its data), since NAND's ascending page rule would forbid filling them later.
//! - [`Policy::Synced`]: as `AtRest`, and every [`Flash::sync`] also fills the blocks programmed
//!   or erased since the last fill: writes between syncs are coalesced into the erased tail of
//!   their block (the thesis' "cache and coalesce small writes"), and at every durable point the
//!   chip shows no free space except the blocks erased since.
//!
//! Under every policy each unit is encrypted on its own (XTS or CBC-ESSIV per unit, the thesis'
//! "XTS instead of CBC chains" made general): changing a unit never re-encrypts another, and a
//! read-modify-erase-write copies the ciphertext of the units it keeps (encryption is
//! deterministic per unit and IV, so re-encrypting them gives the same bytes).
//!
//! # Power cuts
//!
//! A cut during the physical erase or program of a block leaves, as on plain NAND, a block that
//! is partly erased and partly programmed, one page undefined. Under [`Policy::Visible`] a
//! program is a program, with exactly NAND's guarantees. A read-modify-erase-write erases data
//! that was durable before it; the hiding policies make it atomic with a journal on blocks of
//! its own ([`journal`]): the units the block keeps are copied there first, and a rewrite a cut
//! interrupted is redone when the layer is opened, before anything above it reads the chip. So
//! a cut loses at most the program in flight, as on NAND. [`Policy::Thesis`] keeps the thesis'
//! window, as designed and measured: a cut inside its read-modify-erase-write also loses what
//! the block held before (the crash sweeps record it; it is the reproduction, not a choice).
//! A cut during a fill leaves some free units erased; they are filled by the next fill.
//!
//! # Counts
//!
//! The layer counts what it is asked (erases, programs and their bytes) and what it does (erases
//! and page programs it issues per block, read-modify-erase-writes, cipher calls and bytes): its
//! ground truth, separate from UBI's erase counters.

mod journal;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sectorcrypt_cipher::{CipherSpec, SectorCipher, SectorOptions};

use crate::{Error, Flash, Geometry, ReadStatus};

use journal::Journal;

/// Eraseblocks a rewrite journal should have next to `blocks` eraseblocks of data: rewrites run
/// one at a time, so two would do; more spread the journal's own erases (measured in
/// `docs/BENCHMARKS.md`): one in 128, four at least.
pub fn rewrite_journal_blocks(blocks: u32) -> u32 {
    (blocks / 128).max(4)
}

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
    /// Erased space hidden at rest: physically erased while attached, filled when detached,
    /// idle, or at an interval; one read-modify-erase-write per block per fill, journalled.
    AtRest,
    /// As [`Policy::AtRest`], and filled at every sync too.
    Synced,
}

impl Policy {
    /// Every policy, the default for new devices first.
    pub const ALL: [Policy; 4] = [
        Policy::AtRest,
        Policy::Synced,
        Policy::Visible,
        Policy::Thesis,
    ];

    /// Its name in headers and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Thesis => "thesis",
            Policy::Visible => "visible",
            Policy::AtRest => "at-rest",
            Policy::Synced => "synced",
        }
    }

    /// The policy called `name`.
    pub fn from_name(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether it fills free space with filler and needs a journal for its rewrites.
    pub fn hides_at_rest(self) -> bool {
        matches!(self, Policy::AtRest | Policy::Synced)
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
    /// Erases issued to the chip below UBI (the journal's not counted).
    pub chip_erases: u64,
    /// Pages programmed on the chip (a page programmed in several sub-page steps counts each).
    pub chip_page_programs: u64,
    /// Programs that needed a read-modify-erase-write of their block.
    pub rewrites: u64,
    /// Bytes of filler programmed to hide free space.
    pub filler_bytes: u64,
    /// Erases of the journal's blocks.
    pub journal_erases: u64,
    /// Bytes programmed into the journal.
    pub journal_bytes: u64,
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
    filler_bytes: AtomicU64,
    journal_erases: AtomicU64,
    journal_bytes: AtomicU64,
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
    /// For the blocks looked at since opening (under every policy but the thesis'): the unit
    /// from which everything is erased (below it, under the hiding policies, everything is
    /// programmed: data or filler).
    frontiers: Mutex<HashMap<u32, u32>>,
    /// On a chip opened read-only, the raw images of the blocks that opening would have
    /// repaired (a rewrite or a fill a power cut interrupted): reads see the repair, the chip
    /// keeps what the cut left for the next writable opening to repair.
    repaired: Mutex<HashMap<u32, Vec<u8>>>,
    journal: Option<Journal>,
    erase_counts: Vec<AtomicU32>,
    counters: Counters,
}

impl CryptFlash {
    /// Encrypt `inner` with `spec` under `key` (the whole key, both halves for XTS), storing
    /// erased space as `policy` says.
    ///
    /// Errors: [`Error::Geometry`] if the chip's sub-page is not a size the cipher has sectors
    /// of (256 to 4096 bytes); [`Error::Format`] if the cipher refuses the spec or key, or if
    /// `policy` needs a journal ([`CryptFlash::with_journal`]).
    pub fn new(
        inner: Arc<dyn Flash>,
        spec: CipherSpec,
        key: &[u8],
        policy: Policy,
        options: &SectorOptions,
    ) -> Result<CryptFlash, Error> {
        if policy.hides_at_rest() {
            return Err(Error::Format(format!(
                "the {} policy needs a journal for its rewrites",
                policy.name()
            )));
        }
        CryptFlash::open(inner, None, spec, key, policy, options)
    }

    /// As [`CryptFlash::new`], with the blocks of `journal` (another range of the same chip,
    /// never used by anything else) keeping rewrites atomic. A rewrite that a power cut
    /// interrupted is finished here, before anything reads the chip through the layer.
    ///
    /// Errors: as [`CryptFlash::new`]; [`Error::Geometry`] for a journal with fewer than two
    /// good blocks or a geometry other than the chip's; the journal's and the chip's errors.
    pub fn with_journal(
        inner: Arc<dyn Flash>,
        journal: Arc<dyn Flash>,
        spec: CipherSpec,
        key: &[u8],
        policy: Policy,
        options: &SectorOptions,
    ) -> Result<CryptFlash, Error> {
        CryptFlash::open(inner, Some(journal), spec, key, policy, options)
    }

    fn open(
        inner: Arc<dyn Flash>,
        journal: Option<Arc<dyn Flash>>,
        spec: CipherSpec,
        key: &[u8],
        policy: Policy,
        options: &SectorOptions,
    ) -> Result<CryptFlash, Error> {
        let geometry = inner.geometry();
        let unit = geometry.sub_page_size as usize;
        let options = SectorOptions {
            sector_size: unit,
            iv_large_sectors: true,
            iv_offset: 0,
            ..options.clone()
        };
        let cipher = SectorCipher::new(spec, key, &options).map_err(|e| match e {
            sectorcrypt_cipher::Error::SectorSize(_) => Error::Geometry(format!(
                "{unit}-byte sub-pages cannot be encrypted units (256 to 4096 bytes)"
            )),
            e => Error::Format(format!("flash cipher {spec}: {e}")),
        })?;
        let blocks = geometry.peb_count as usize;
        let journal = match journal {
            Some(j) => Some(Journal::new(j, &geometry)?),
            None => None,
        };
        let layer = CryptFlash {
            inner,
            cipher,
            policy,
            geometry,
            unit,
            locks: (0..blocks).map(|_| Mutex::new(())).collect(),
            frontiers: Mutex::new(HashMap::new()),
            repaired: Mutex::new(HashMap::new()),
            journal,
            erase_counts: (0..blocks).map(|_| AtomicU32::new(0)).collect(),
            counters: Counters::default(),
        };
        layer.recover()?;
        Ok(layer)
    }

    /// The chip below.
    pub fn inner(&self) -> &Arc<dyn Flash> {
        &self.inner
    }

    /// How erased space is stored.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    fn units_per_block(&self) -> u32 {
        self.geometry.peb_size / self.unit as u32
    }

    /// The cipher's sector (IV) number of byte `offset` of eraseblock `peb` (a unit boundary).
    pub fn unit_number(&self, peb: u32, offset: u32) -> u64 {
        let per_peb = u64::from(self.units_per_block());
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
            filler_bytes: get(&c.filler_bytes),
            journal_erases: get(&c.journal_erases),
            journal_bytes: get(&c.journal_bytes),
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

    fn lock(&self, peb: u32) -> MutexGuard<'_, ()> {
        self.locks[peb as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn repaired(&self) -> MutexGuard<'_, HashMap<u32, Vec<u8>>> {
        self.repaired.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn frontiers(&self) -> MutexGuard<'_, HashMap<u32, u32>> {
        self.frontiers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// En- or decrypt `buf` in place as the units from `sector` on.
    fn crypt_at(&self, buf: &mut [u8], sector: u64, encrypt: bool) -> Result<(), Error> {
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

    fn crypt(&self, buf: &mut [u8], peb: u32, offset: u32, encrypt: bool) -> Result<(), Error> {
        self.crypt_at(buf, self.unit_number(peb, offset), encrypt)
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
        for run in written_runs(raw, self.unit) {
            let start = offset as usize + run.start;
            self.chip_program(peb, start as u32, &raw[run])?;
        }
        Ok(())
    }

    fn chip_program(&self, peb: u32, offset: u32, raw: &[u8]) -> Result<(), Error> {
        let page = self.geometry.page_size as usize;
        let (start, end) = (offset as usize, offset as usize + raw.len());
        self.inner.program(peb, offset, raw).inspect_err(|_| {
            self.frontiers().remove(&peb);
        })?;
        if let Some(f) = self.frontiers().get_mut(&peb) {
            *f = (*f).max((end / self.unit) as u32);
        }
        add(
            &self.counters.chip_page_programs,
            (end.div_ceil(page) - start / page) as u64,
        );
        Ok(())
    }

    fn chip_erase(&self, peb: u32) -> Result<(), Error> {
        self.inner.erase(peb).inspect_err(|_| {
            self.frontiers().remove(&peb);
        })?;
        add(&self.counters.chip_erases, 1);
        self.erase_counts[peb as usize].fetch_add(1, Ordering::Relaxed);
        if self.policy != Policy::Thesis {
            self.frontiers().insert(peb, 0);
        }
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
        self.forget_rewrite(peb)?;
        self.store_block(peb, plain)
    }

    /// Erase `peb` and store `plain` (the whole block) as the policy says.
    fn store_block(&self, peb: u32, mut plain: Vec<u8>) -> Result<(), Error> {
        self.chip_erase(peb)?;
        match self.policy {
            Policy::Thesis => self.crypt(&mut plain, peb, 0, true)?,
            Policy::Visible => self.encrypt_written_units(&mut plain, peb, 0)?,
            Policy::AtRest | Policy::Synced => {
                // Data and the filler below it; the erased tail stays erased until a fill.
                let end = last_written_unit(&plain, self.unit).map_or(0, |u| (u + 1) * self.unit);
                plain.truncate(end);
                self.crypt(&mut plain, peb, 0, true)?;
                self.chip_program(peb, 0, &plain)?;
                self.frontiers().insert(peb, (end / self.unit) as u32);
                return Ok(());
            }
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

    /// The frontier of `peb` (see `frontiers`), read from the chip the first time.
    fn frontier(&self, peb: u32) -> Result<u32, Error> {
        if let Some(&f) = self.frontiers().get(&peb) {
            return Ok(f);
        }
        let mut raw = vec![0u8; self.geometry.peb_size as usize];
        self.inner.read(peb, 0, &mut raw)?;
        let f = last_written_unit(&raw, self.unit).map_or(0, |u| u as u32 + 1);
        self.frontiers().insert(peb, f);
        Ok(f)
    }

    /// Program `data` at unit-aligned `offset` of `peb` under the thesis' policy.
    fn program_thesis(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        let old = self.read_plain(peb, offset, data.len())?;
        let merged: Vec<u8> = old.iter().zip(data).map(|(o, d)| o & d).collect();
        if merged == old {
            // Programming only ones: NAND changes nothing, neither does the layer.
            return Ok(());
        }
        let mut block = self.read_plain(peb, 0, self.geometry.peb_size as usize)?;
        block[offset as usize..offset as usize + data.len()].copy_from_slice(&merged);
        add(&self.counters.rewrites, 1);
        self.store_block(peb, block)
    }

    /// Program `data` at unit-aligned `offset` of `peb` under the other policies: into erased
    /// space as a program, anywhere else as a rewrite of the block.
    fn program_layered(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        let unit = self.unit;
        let hides = self.policy.hides_at_rest();
        let first = offset / unit as u32;
        let frontier = self.frontier(peb)?;
        // At or above the frontier everything is erased: no read needed (a real chip's read
        // costs an eighth of a program).
        let raw = if first >= frontier {
            None
        } else {
            let mut raw = vec![0u8; data.len()];
            self.inner.read(peb, offset, &mut raw)?;
            Some(raw)
        };
        // NAND programs pages in ascending order: below the frontier's page only a rewrite can
        // reach erased units.
        let ppu = self.geometry.page_size / unit as u32;
        let ascending = frontier == 0 || first / ppu >= (frontier - 1) / ppu;
        if raw.as_deref().is_none_or(is_erased) && (ascending || !hides) {
            if !hides {
                let mut out = data.to_vec();
                self.encrypt_written_units(&mut out, peb, offset)?;
                return self.program_units(peb, offset, &out);
            }
            // The units between the frontier and the data become filler in the same program.
            let start = frontier.min(first);
            let gap = (first - start) as usize * unit;
            let mut out = vec![0xFF; gap + data.len()];
            out[gap..].copy_from_slice(data);
            let end = last_written_unit(&out, unit).map_or(0, |u| (u + 1) * unit);
            if end == 0 {
                return Ok(());
            }
            out.truncate(end);
            let at = start * unit as u32;
            self.crypt(&mut out, peb, at, true)?;
            add(&self.counters.filler_bytes, gap as u64);
            return self.chip_program(peb, at, &out);
        }
        let raw = match raw {
            Some(raw) => raw,
            None => {
                let mut raw = vec![0u8; data.len()];
                self.inner.read(peb, offset, &mut raw)?;
                raw
            }
        };
        let mut old = raw.clone();
        self.decrypt_units(&mut old, peb, offset)?;
        let merged: Vec<u8> = old.iter().zip(data).map(|(o, d)| o & d).collect();
        if merged == old {
            return Ok(());
        }
        if !hides {
            // Every changed unit physically erased: program just those (UBI's writes always
            // are); else rewrite the block.
            let in_place = old
                .chunks(unit)
                .zip(merged.chunks(unit))
                .zip(raw.chunks(unit))
                .all(|((o, m), r)| o == m || is_erased(r));
            if in_place {
                let mut out = merged;
                for (o, r) in out.chunks_mut(unit).zip(raw.chunks(unit)) {
                    if !is_erased(r) {
                        o.fill(0xFF);
                    }
                }
                self.encrypt_written_units(&mut out, peb, offset)?;
                return self.program_units(peb, offset, &out);
            }
        }
        self.rewrite(peb, offset, &merged)
    }

    /// Read-modify-erase-write of `peb` with `merged` at `offset`: under the hiding policies
    /// journalled, leaving the block's tail erased; else as the thesis does it.
    fn rewrite(&self, peb: u32, offset: u32, merged: &[u8]) -> Result<(), Error> {
        let size = self.geometry.peb_size as usize;
        let mut raw = vec![0u8; size];
        self.inner.read(peb, 0, &mut raw)?;
        let mut plain = raw.clone();
        self.decrypt_units(&mut plain, peb, 0)?;
        plain[offset as usize..offset as usize + merged.len()].copy_from_slice(merged);
        self.rewrite_block(peb, &raw, plain)
    }

    /// Erase `peb`, whose raw contents are `raw`, and store `plain` in it; under the hiding
    /// policies journalled: the units whose plaintext stays (and is not free) are copied first.
    fn rewrite_block(&self, peb: u32, raw: &[u8], plain: Vec<u8>) -> Result<(), Error> {
        add(&self.counters.rewrites, 1);
        if let Some(journal) = &self.journal {
            let unit = self.unit;
            let mut old = raw.to_vec();
            self.decrypt_units(&mut old, peb, 0)?;
            let kept: Vec<u32> = (0..self.units_per_block())
                .filter(|&u| {
                    let r = u as usize * unit..(u as usize + 1) * unit;
                    !is_erased(&plain[r.clone()]) && old[r.clone()] == plain[r]
                })
                .collect();
            self.journal_copy(journal, peb, &kept, raw)?;
        }
        self.store_block(peb, plain)
    }

    /// Fill the free space of every eraseblock with filler, so that the chip shows none (what
    /// the hiding policies do when the device is detached or idle). Under the other policies
    /// nothing is done. Returns the bytes of filler programmed.
    ///
    /// Errors: the chip's (a block that fails is left as it was; the others are filled).
    pub fn hide_free_space(&self) -> Result<u64, Error> {
        self.fill(None)
    }

    /// Fill the free space of the blocks programmed or erased since the last fill.
    fn fill(&self, only: Option<Vec<u32>>) -> Result<u64, Error> {
        if !self.policy.hides_at_rest() {
            return Ok(0);
        }
        let blocks = only
            .clone()
            .unwrap_or_else(|| (0..self.geometry.peb_count).collect());
        // An empty sync fill leaves no record.
        let marked = self.journal.as_ref().filter(|_| !blocks.is_empty());
        if let Some(journal) = marked {
            self.journal_fill_mark(journal, false)?;
        }
        let mut filled = 0;
        let mut failed = None;
        for peb in blocks {
            match self.fill_block(peb) {
                Ok(n) => filled += n,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let (Some(journal), None) = (marked, &failed) {
            self.journal_fill_mark(journal, true)?;
        }
        // The journal's tail is hidden on a full fill only: filling it at every sync would cost
        // a journal erase per synced rewrite.
        if let (Some(journal), None) = (&self.journal, &only) {
            filled += self.journal_fill(journal)?;
        }
        failed.map_or(Ok(filled), Err)
    }

    fn fill_block(&self, peb: u32) -> Result<u64, Error> {
        if self.inner.is_bad(peb)? {
            return Ok(0);
        }
        let _guard = self.lock(peb);
        let frontier = self.frontier(peb)?;
        let end = self.units_per_block();
        if frontier >= end {
            return Ok(0);
        }
        let mut out = vec![0xFF; (end - frontier) as usize * self.unit];
        let at = frontier * self.unit as u32;
        self.crypt(&mut out, peb, at, true)?;
        self.chip_program(peb, at, &out)?;
        self.frontiers().insert(peb, end);
        add(&self.counters.filler_bytes, out.len() as u64);
        Ok(out.len() as u64)
    }

    /// The blocks whose frontier is below their end: free space not hidden.
    fn open_blocks(&self) -> Vec<u32> {
        let end = self.units_per_block();
        let mut open: Vec<u32> = self
            .frontiers()
            .iter()
            .filter(|&(_, &f)| f < end)
            .map(|(&peb, _)| peb)
            .collect();
        open.sort_unstable();
        open
    }
}

fn is_erased(unit: &[u8]) -> bool {
    unit.iter().all(|&b| b == 0xFF)
}

/// The index of the last `unit`-byte unit of `buf` that is not all 0xFF.
fn last_written_unit(buf: &[u8], unit: usize) -> Option<usize> {
    buf.chunks(unit).rposition(|u| !is_erased(u))
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
        let read = match self.repaired().get(&peb) {
            Some(image) => {
                raw.copy_from_slice(&image[start as usize..end as usize]);
                Ok(ReadStatus::default())
            }
            None => self.inner.read(peb, start, &mut raw),
        };
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
        match self.policy {
            Policy::Thesis => self.program_thesis(peb, offset, data),
            _ => self.program_layered(peb, offset, data),
        }
    }

    fn erase(&self, peb: u32) -> Result<(), Error> {
        self.geometry.check_range(peb, 0, 0)?;
        add(&self.counters.erases, 1);
        let _guard = self.lock(peb);
        match self.policy {
            Policy::Thesis => self.store_block(peb, vec![0xFF; self.geometry.peb_size as usize]),
            Policy::Visible => self.chip_erase(peb),
            Policy::AtRest | Policy::Synced => {
                self.forget_rewrite(peb)?;
                self.chip_erase(peb)
            }
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

    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }

    fn sync(&self) -> Result<(), Error> {
        if self.policy == Policy::Synced {
            self.fill(Some(self.open_blocks()))?;
        }
        self.inner.sync()
    }
}
