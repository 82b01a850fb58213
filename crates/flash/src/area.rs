//! A run of eraseblocks used as a small rewritable disk: where an encrypted flash keeps its LUKS2
//! header, so that the header code that works on files works on flash unchanged.
//!
//! # Why a journal
//!
//! A file is rewritten in place; an eraseblock is erased whole and programmed again, and a power
//! cut in between leaves it neither old nor new. LUKS2 survives losing one of its two header
//! copies, but not losing a keyslot's material, and a keyslot area can share an eraseblock with
//! another keyslot. So every rewrite of a block of the area is made atomic with two journal
//! blocks before the area:
//!
//! 1. the new contents go to the *copy* block (erase, program);
//! 2. a one-page *record* naming the target block and the copy's CRC goes to the *record* block;
//! 3. the target block is erased and programmed with the new contents;
//! 4. the record block is erased.
//!
//! A cut before step 2 completes leaves the target untouched and no valid record; a cut in step
//! 3 leaves a valid record whose copy matches its CRC, and [`BlockArea::recover`] (run on every
//! open) redoes step 3; a cut in step 4 leaves an unreadable record, and step 3 was complete.
//! So at any moment each block of the area holds its old or its new contents, never garbage.
//! The cost is three erases per block rewrite, paid only when a header changes. The journal
//! comes first so that finding a record's target needs no knowledge of the area's length (which
//! is in the header the record may be repairing). The copy block always holds the current
//! contents of the block rewritten last, so it keeps nothing the area no longer has (a wiped
//! keyslot's material does not linger there).
//!
//! # Bad blocks
//!
//! The journal is the first two good eraseblocks from a starting block on, the area the good
//! blocks after them, in order, as the chip reports them when the area is opened; factory bad
//! blocks are skipped. A block of the area
//! that fails to erase later is not marked bad here (that would move every block after it): the
//! write fails with the chip's error, the old contents of the other blocks stay, and the caller
//! reports it.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use sectorcrypt_storage::Storage;

use crate::{Error, Flash};

const RECORD_MAGIC: &[u8; 8] = b"SCFLJRNL";
const RECORD_LEN: usize = 32;

/// A run of good eraseblocks as a [`Storage`], every block rewrite atomic (see the module docs).
pub struct BlockArea {
    flash: Arc<dyn Flash>,
    blocks: Vec<u32>,
    copy: u32,
    record: u32,
    lock: Mutex<u64>,
    recovered: bool,
}

fn crc(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

impl BlockArea {
    /// The journal in the first two good eraseblocks from block `first` on and the area in the
    /// `len` good blocks after them. Finishes a rewrite a power cut interrupted
    /// ([`BlockArea::recover`]).
    pub fn open(flash: Arc<dyn Flash>, first: u32, len: u32) -> Result<BlockArea, Error> {
        let mut good = good_blocks(flash.as_ref(), first, len as usize + 2)?;
        let copy = good.remove(0);
        let record = good.remove(0);
        let mut area = BlockArea {
            flash,
            blocks: good,
            copy,
            record,
            lock: Mutex::new(0),
            recovered: false,
        };
        area.recovered = area.recover()?;
        Ok(area)
    }

    /// Whether opening it found a record of an interrupted rewrite (and finished that rewrite).
    pub fn was_recovered(&self) -> bool {
        self.recovered
    }

    /// The eraseblocks of the area, in order.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// The first eraseblock after the area.
    pub fn end(&self) -> u32 {
        self.blocks.last().map_or(self.record, |b| *b) + 1
    }

    fn read_record(&self) -> Result<Option<(u32, u32)>, Error> {
        let mut r = [0u8; RECORD_LEN];
        // An unreadable record is a cut record erase: nothing is pending.
        if self.flash.read(self.record, 0, &mut r).is_err() {
            return Ok(None);
        }
        let valid = &r[..8] == RECORD_MAGIC
            && u32::from_le_bytes([r[28], r[29], r[30], r[31]]) == crc(&r[..28]);
        if !valid {
            return Ok(None);
        }
        let index = u32::from_le_bytes([r[8], r[9], r[10], r[11]]);
        let sum = u32::from_le_bytes([r[12], r[13], r[14], r[15]]);
        Ok(Some((index, sum)))
    }

    /// Finish a block rewrite that a power cut interrupted; `true` if there was one.
    pub fn recover(&self) -> Result<bool, Error> {
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((index, sum)) = self.read_record()? else {
            return Ok(false);
        };
        let mut contents = vec![0u8; self.flash.geometry().peb_size as usize];
        // The record is written only after the copy is complete, so a copy that does not match
        // is a record from an older rewrite that was finished: drop it.
        let copied = self.flash.read(self.copy, 0, &mut contents).is_ok();
        if copied && crc(&contents) == sum {
            // The target by its place after the journal, whatever length the area was opened
            // with.
            let after = good_blocks(self.flash.as_ref(), self.record + 1, index as usize + 1)?;
            self.put(after[index as usize], &contents)?;
        }
        self.flash.erase(self.record)?;
        Ok(true)
    }

    fn put(&self, peb: u32, contents: &[u8]) -> Result<(), Error> {
        put_block(self.flash.as_ref(), peb, contents)
    }

    /// The journal's two eraseblocks: (copy, record).
    pub fn journal(&self) -> (u32, u32) {
        (self.copy, self.record)
    }

    fn rewrite(&self, index: usize, contents: &[u8], seq: &mut u64) -> Result<(), Error> {
        let g = self.flash.geometry();
        self.put(self.copy, contents)?;
        *seq += 1;
        let mut r = vec![0xFFu8; g.page_size as usize];
        r[..8].copy_from_slice(RECORD_MAGIC);
        r[8..12].copy_from_slice(&(index as u32).to_le_bytes());
        r[12..16].copy_from_slice(&crc(contents).to_le_bytes());
        r[16..24].copy_from_slice(&seq.to_le_bytes());
        r[24..28].fill(0);
        let c = crc(&r[..28]);
        r[28..32].copy_from_slice(&c.to_le_bytes());
        self.flash.erase(self.record)?;
        self.flash.program(self.record, 0, &r)?;
        self.put(self.blocks[index], contents)?;
        self.flash.erase(self.record)
    }

    fn check(&self, offset: u64, len: usize, what: &str) -> io::Result<()> {
        let size = self.len()?;
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("a {what} of {len} bytes at offset {offset} runs past the end of the {size}-byte header area"),
            ));
        }
        Ok(())
    }
}

/// Erase `peb` and program `contents` (a whole block), leaving out trailing erased pages as a
/// flasher does.
pub fn put_block(flash: &dyn Flash, peb: u32, contents: &[u8]) -> Result<(), Error> {
    let page = flash.geometry().page_size as usize;
    flash.erase(peb)?;
    let used = contents
        .chunks(page)
        .rposition(|p| p.iter().any(|&b| b != 0xFF))
        .map_or(0, |last| (last + 1) * page);
    flash.program(peb, 0, &contents[..used])
}

/// The first `n` good eraseblocks from `first` on.
fn good_blocks(flash: &dyn Flash, first: u32, n: usize) -> Result<Vec<u32>, Error> {
    let count = flash.geometry().peb_count;
    let mut good = Vec::with_capacity(n);
    let mut peb = first;
    while good.len() < n {
        if peb >= count {
            return Err(Error::OutOfRange(format!(
                "{n} good eraseblocks do not fit from block {first} on: the chip has {count} \
                 blocks"
            )));
        }
        if !flash.is_bad(peb)? {
            good.push(peb);
        }
        peb += 1;
    }
    Ok(good)
}

fn io_error(e: Error) -> io::Error {
    match e {
        Error::Io(e) => e,
        e => io::Error::other(e),
    }
}

impl Storage for BlockArea {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len(), "read")?;
        let peb_size = u64::from(self.flash.geometry().peb_size);
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let index = (at / peb_size) as usize;
            let within = (at % peb_size) as u32;
            let n = ((peb_size - u64::from(within)) as usize).min(buf.len() - done);
            self.flash
                .read(self.blocks[index], within, &mut buf[done..done + n])
                .map_err(io_error)?;
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len(), "write")?;
        let mut seq = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let peb_size = u64::from(self.flash.geometry().peb_size);
        let mut done = 0usize;
        let mut contents = vec![0u8; peb_size as usize];
        while done < buf.len() {
            let at = offset + done as u64;
            let index = (at / peb_size) as usize;
            let within = (at % peb_size) as usize;
            let n = (peb_size as usize - within).min(buf.len() - done);
            self.flash
                .read(self.blocks[index], 0, &mut contents)
                .map_err(io_error)?;
            if contents[within..within + n] != buf[done..done + n] {
                contents[within..within + n].copy_from_slice(&buf[done..done + n]);
                self.rewrite(index, &contents, &mut seq).map_err(io_error)?;
            }
            done += n;
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.flash.sync().map_err(io_error)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.blocks.len() as u64 * u64::from(self.flash.geometry().peb_size))
    }

    fn name(&self) -> String {
        format!("the header area (eraseblocks {:?})", self.blocks)
    }
}
