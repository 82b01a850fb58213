//! The journal that makes a read-modify-erase-write atomic under the hiding policies.
//!
//! A rewrite erases a block that holds data written (and acknowledged) before; a power cut
//! between the erase and the end of the program would lose it. So before the erase, the units
//! the block keeps are copied into the journal: a *record* of one header unit (magic, sequence
//! number, target block, a bitmap of the kept units, a CRC over itself and the copies) followed
//! by the copies, the raw ciphertext of those units (it needs no re-encryption: it goes back to
//! the same block and offsets, so the same IVs). Records are appended in a ring of blocks of
//! their own; a block is erased when the ring comes back to it.
//!
//! Rewrites run one at a time per block and each is finished before the layer returns, so only
//! the newest record can describe an unfinished one. On opening, the newest valid record is
//! found; if its target's kept units differ from the copies, the rewrite was cut, and the
//! target is erased and programmed again with the copies (the program that was in flight,
//! never acknowledged, is what is lost, as on NAND). On a chip opened read-only (`flash read`
//! after a power cut) the repaired image is kept in memory instead: reads see it, the chip is
//! left for the next writable opening to repair. When the layer erases the newest record's
//! target for another reason (an erase from above), a *void* record goes first, so that a later
//! opening does not bring old data back over new.
//!
//! A fill (programming filler over free space) is bracketed by a *fill* record and a *filled*
//! record. A power cut inside it leaves units half programmed: filler with some of its zero
//! bits still one, which would decrypt to garbage where UBI expects erased space (and a later
//! program there would be ANDed with it). So when the newest record is a fill without its
//! filled, opening the layer looks for such units: a unit is torn filler when every one bit of
//! its filler is set in it (a cut program only leaves bits it should have cleared; random
//! ciphertext passes this with probability 2^-(bits of filler set), about 2^-2048 for 512 bytes),
//! and each block that has one is rewritten without them (journalled as any rewrite), its tail
//! erased again for the next fill.
//!
//! The header unit is encrypted under the IVs of the journal's own units (numbered after the
//! data blocks'), and the copies are ciphertext: the journal looks like the rest of the chip,
//! and a full fill programs filler over its free tail too. The journal never starts a record
//! behind filler or a record it could not read: after a fill, or on opening unless all that
//! follows the newest record is erased, the next record goes to the next block of the ring.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{add, is_erased, last_written_unit, CryptFlash};
use crate::{Error, Flash, Geometry};

const MAGIC: &[u8; 8] = b"SCFLRWJ1";
const KIND_COPY: u32 = 1;
const KIND_VOID: u32 = 2;
const KIND_FILL: u32 = 3;
const KIND_FILLED: u32 = 4;
/// Bytes of the header unit before the bitmap: magic, sequence, kind, target, count.
const FIXED: usize = 28;
/// Bytes of the CRC at the end of the header unit.
const CRC_LEN: usize = 4;

/// The journal's blocks and where the next record goes.
pub(super) struct Journal {
    flash: Arc<dyn Flash>,
    /// Its good blocks, in ring order.
    blocks: Vec<u32>,
    /// The data blocks' count: the journal's IVs are numbered after theirs.
    data_blocks: u32,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    seq: u64,
    /// Index into `blocks` of the block being appended to.
    index: usize,
    /// Its next free unit (`units_per_block`: full, move on).
    next: u32,
    /// The newest record, if it is a copy: its target, kept units and where its copies are.
    live: Option<Record>,
}

#[derive(Clone, Debug)]
struct Record {
    seq: u64,
    kind: u32,
    target: u32,
    kept: Vec<u32>,
    /// Journal block and first unit of the copies.
    block: u32,
    first: u32,
}

impl Journal {
    /// The journal on `flash`, for a layer over a chip of geometry `data`.
    pub(super) fn new(flash: Arc<dyn Flash>, data: &Geometry) -> Result<Journal, Error> {
        let g = flash.geometry();
        if (g.peb_size, g.page_size, g.sub_page_size)
            != (data.peb_size, data.page_size, data.sub_page_size)
        {
            return Err(Error::Geometry(
                "the journal's blocks are not the chip's".into(),
            ));
        }
        let units = (g.peb_size / g.sub_page_size) as usize;
        if FIXED + units.div_ceil(8) + CRC_LEN > g.sub_page_size as usize {
            return Err(Error::Geometry(format!(
                "{units} units per eraseblock do not fit a journal record's {}-byte header",
                g.sub_page_size
            )));
        }
        let mut blocks = Vec::new();
        for b in 0..g.peb_count {
            if !flash.is_bad(b)? {
                blocks.push(b);
            }
        }
        if blocks.len() < 2 {
            return Err(Error::Geometry(format!(
                "a journal needs two good eraseblocks; it has {}",
                blocks.len()
            )));
        }
        Ok(Journal {
            flash,
            blocks,
            data_blocks: data.peb_count,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl CryptFlash {
    /// The IV number of unit `unit` of journal block `block`.
    fn journal_sector(&self, journal: &Journal, block: u32, unit: u32) -> u64 {
        self.unit_number(journal.data_blocks + block, unit * self.unit as u32)
    }

    /// The valid records of journal block `block`, in order.
    fn journal_records(&self, journal: &Journal, block: u32) -> Result<Vec<Record>, Error> {
        let unit = self.unit;
        let mut raw = vec![0u8; self.geometry.peb_size as usize];
        // An unreadable journal block holds no record to trust.
        if journal.flash.read(block, 0, &mut raw).is_err() {
            return Ok(Vec::new());
        }
        let per_block = self.units_per_block();
        let mut records = Vec::new();
        let mut u = 0u32;
        while u < per_block {
            let at = u as usize * unit;
            let mut head = raw[at..at + unit].to_vec();
            if is_erased(&head) {
                break;
            }
            self.crypt_at(&mut head, self.journal_sector(journal, block, u), false)?;
            let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
            let count = word(24);
            if &head[..8] != MAGIC || count >= per_block - u {
                break;
            }
            let copies = at + unit..at + unit + count as usize * unit;
            let mut sum = crc32fast::Hasher::new();
            sum.update(&head[..unit - CRC_LEN]);
            sum.update(&raw[copies]);
            if sum.finalize() != word(unit - CRC_LEN) {
                break;
            }
            let bitmap = &head[FIXED..FIXED + per_block.div_ceil(8) as usize];
            let kept: Vec<u32> = (0..per_block)
                .filter(|&k| bitmap[k as usize / 8] & (1 << (k % 8)) != 0)
                .collect();
            if kept.len() != count as usize {
                break;
            }
            records.push(Record {
                seq: u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")),
                kind: word(16),
                target: word(20),
                kept,
                block,
                first: u + 1,
            });
            u += 1 + count;
        }
        Ok(records)
    }

    /// Find the newest record and, if it describes a rewrite a power cut interrupted, finish it.
    pub(super) fn recover(&self) -> Result<(), Error> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        let mut newest: Option<(usize, Record)> = None;
        for (index, &block) in journal.blocks.iter().enumerate() {
            for r in self.journal_records(journal, block)? {
                if newest.as_ref().is_none_or(|(_, n)| r.seq > n.seq) {
                    newest = Some((index, r));
                }
            }
        }
        let mut state = journal.state();
        // Records go on after the newest if what follows it is erased (not filler, not a
        // record cut short), else in the next block.
        let (index, end) = newest
            .as_ref()
            .map_or((0, 0), |(i, r)| (*i, r.first + r.kept.len() as u32));
        state.index = index;
        state.next = if self.erased_from(journal, journal.blocks[index], end)? {
            end
        } else {
            self.units_per_block()
        };
        let Some((_, record)) = newest else {
            return Ok(());
        };
        state.seq = record.seq;
        if record.kind == KIND_FILL {
            drop(state);
            return self.repair_torn_fill();
        }
        if record.kind != KIND_COPY || record.target >= self.geometry.peb_count {
            return Ok(());
        }
        let unit = self.unit;
        let mut copies = vec![0u8; record.kept.len() * unit];
        journal
            .flash
            .read(record.block, record.first * unit as u32, &mut copies)?;
        let mut target = vec![0u8; self.geometry.peb_size as usize];
        let intact = self.inner.read(record.target, 0, &mut target).is_ok()
            && record.kept.iter().zip(copies.chunks(unit)).all(|(&k, c)| {
                let at = k as usize * unit;
                target[at..at + unit] == *c
            });
        if !intact {
            // Filler below the last kept unit, the copies over it; the tail stays erased.
            let end = record.kept.last().map_or(0, |&k| (k as usize + 1) * unit);
            let mut image = vec![0xFF; end];
            self.crypt(&mut image, record.target, 0, true)?;
            for (&k, c) in record.kept.iter().zip(copies.chunks(unit)) {
                let at = k as usize * unit;
                image[at..at + unit].copy_from_slice(c);
            }
            if self.inner.is_read_only() {
                image.resize(self.geometry.peb_size as usize, 0xFF);
                self.repaired().insert(record.target, image);
            } else {
                self.chip_erase(record.target)?;
                if end > 0 {
                    self.chip_program(record.target, 0, &image)?;
                }
                self.frontiers().insert(record.target, (end / unit) as u32);
            }
        }
        state.live = Some(record);
        Ok(())
    }

    /// Whether journal block `block` is erased from unit `from` on.
    fn erased_from(&self, journal: &Journal, block: u32, from: u32) -> Result<bool, Error> {
        let unit = self.unit as u32;
        let mut raw = vec![0u8; ((self.units_per_block() - from) * unit) as usize];
        Ok(journal.flash.read(block, from * unit, &mut raw).is_ok() && is_erased(&raw))
    }

    /// Append a record of `kind` for `target` with the units `kept` of the block image `raw`.
    fn journal_append(
        &self,
        journal: &Journal,
        kind: u32,
        target: u32,
        kept: &[u32],
        raw: &[u8],
    ) -> Result<(), Error> {
        let unit = self.unit;
        let per_block = self.units_per_block();
        let need = 1 + kept.len() as u32;
        let mut state = journal.state();
        if state.next + need > per_block {
            let index = (state.index + 1) % journal.blocks.len();
            journal.flash.erase(journal.blocks[index])?;
            add(&self.counters.journal_erases, 1);
            state.index = index;
            state.next = 0;
        }
        let block = journal.blocks[state.index];
        let mut out = vec![0u8; need as usize * unit];
        let (head, copies) = out.split_at_mut(unit);
        head[..8].copy_from_slice(MAGIC);
        head[8..16].copy_from_slice(&(state.seq + 1).to_le_bytes());
        head[16..20].copy_from_slice(&kind.to_le_bytes());
        head[20..24].copy_from_slice(&target.to_le_bytes());
        head[24..28].copy_from_slice(&(kept.len() as u32).to_le_bytes());
        for (&k, c) in kept.iter().zip(copies.chunks_mut(unit)) {
            head[FIXED + k as usize / 8] |= 1 << (k % 8);
            c.copy_from_slice(&raw[k as usize * unit..(k as usize + 1) * unit]);
        }
        let mut sum = crc32fast::Hasher::new();
        sum.update(&head[..unit - CRC_LEN]);
        sum.update(copies);
        let crc = sum.finalize().to_le_bytes();
        head[unit - CRC_LEN..].copy_from_slice(&crc);
        self.crypt_at(head, self.journal_sector(journal, block, state.next), true)?;
        let at = state.next;
        // Whatever happens to the program, the units are no longer free.
        state.next += need;
        journal.flash.program(block, at * unit as u32, &out)?;
        add(&self.counters.journal_bytes, out.len() as u64);
        state.seq += 1;
        state.live = (kind == KIND_COPY).then(|| Record {
            seq: state.seq,
            kind,
            target,
            kept: kept.to_vec(),
            block,
            first: at + 1,
        });
        Ok(())
    }

    /// Record the units `kept` of `peb` (whose raw contents are `raw`) before rewriting it.
    pub(super) fn journal_copy(
        &self,
        journal: &Journal,
        peb: u32,
        kept: &[u32],
        raw: &[u8],
    ) -> Result<(), Error> {
        self.journal_append(journal, KIND_COPY, peb, kept, raw)
    }

    /// Before `peb` is erased for another reason than a rewrite: if the newest record is a
    /// copy of it, void it, so that opening the layer never puts that copy back.
    pub(super) fn forget_rewrite(&self, peb: u32) -> Result<(), Error> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        let live = journal.state().live.as_ref().map(|r| r.target);
        if live == Some(peb) {
            self.journal_append(journal, KIND_VOID, peb, &[], &[])?;
        }
        Ok(())
    }

    /// Record that a fill starts (`done` false) or has ended (see the module docs).
    pub(super) fn journal_fill_mark(&self, journal: &Journal, done: bool) -> Result<(), Error> {
        let kind = if done { KIND_FILLED } else { KIND_FILL };
        self.journal_append(journal, kind, 0, &[], &[])
    }

    /// After a fill a power cut interrupted: rewrite every block that holds torn filler without
    /// it.
    fn repair_torn_fill(&self) -> Result<(), Error> {
        let unit = self.unit;
        let mut raw = vec![0u8; self.geometry.peb_size as usize];
        for peb in 0..self.geometry.peb_count {
            if self.inner.is_bad(peb)? || self.inner.read(peb, 0, &mut raw).is_err() {
                continue;
            }
            let mut filler = vec![0xFF; raw.len()];
            self.crypt(&mut filler, peb, 0, true)?;
            let torn: Vec<usize> = raw
                .chunks(unit)
                .zip(filler.chunks(unit))
                .enumerate()
                .filter(|(_, (r, f))| {
                    r != f && !is_erased(r) && r.iter().zip(*f).all(|(r, f)| r & f == *f)
                })
                .map(|(u, _)| u)
                .collect();
            if torn.is_empty() {
                continue;
            }
            if self.inner.is_read_only() {
                // A torn unit reads erased after the rewrite; so it does as erased ciphertext.
                let mut image = raw.clone();
                for &u in &torn {
                    image[u * unit..(u + 1) * unit].fill(0xFF);
                }
                self.repaired().insert(peb, image);
                continue;
            }
            let mut plain = raw.clone();
            self.decrypt_units(&mut plain, peb, 0)?;
            for &u in &torn {
                plain[u * unit..(u + 1) * unit].fill(0xFF);
            }
            self.rewrite_block(peb, &raw, plain)?;
        }
        Ok(())
    }

    /// Program filler over the free tail of every journal block; the next record starts a new
    /// block. Returns the bytes programmed.
    pub(super) fn journal_fill(&self, journal: &Journal) -> Result<u64, Error> {
        let mut state = journal.state();
        let unit = self.unit;
        let per_block = self.units_per_block();
        let mut filled = 0;
        let mut raw = vec![0u8; self.geometry.peb_size as usize];
        for &block in &journal.blocks {
            if journal.flash.read(block, 0, &mut raw).is_err() {
                continue;
            }
            let from = last_written_unit(&raw, unit).map_or(0, |u| u as u32 + 1);
            if from >= per_block {
                continue;
            }
            let mut out = vec![0xFF; (per_block - from) as usize * unit];
            self.crypt_at(&mut out, self.journal_sector(journal, block, from), true)?;
            journal.flash.program(block, from * unit as u32, &out)?;
            filled += out.len() as u64;
        }
        state.next = per_block;
        add(&self.counters.filler_bytes, filled);
        Ok(filled)
    }
}
