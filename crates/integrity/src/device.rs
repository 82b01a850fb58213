//! A dm-integrity device with dm-crypt's authenticated encryption on top: what
//! `cryptsetup open` of a LUKS2 `--integrity` volume maps, as one object over the data device.
//!
//! Reads take each block's data and tag from their places (or from the journal, on a device
//! opened read-only whose journal still holds committed blocks) and hand out only blocks whose
//! tag verifies. Writes go through the journal as the kernel's journal mode writes them: the
//! blocks and their tags in one whole section (synced), then in place (synced), so that a crash
//! leaves every block old or new once the journal is replayed, here or by the kernel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rand::RngCore;
use sectorcrypt_storage::Storage;

use crate::journal::{self, JournalBlock, Ring};
use crate::layout::Layout;
use crate::mode::Mode;
use crate::superblock::{Superblock, SUPERBLOCK_BYTES};
use crate::Error;

/// An opened integrity device.
pub struct IntegrityDevice {
    storage: Arc<dyn Storage>,
    layout: Layout,
    mode: Mode,
    read_only: bool,
    /// Opened read-only: the committed blocks the journal holds that may not be in place yet.
    journalled: HashMap<u64, JournalBlock>,
    /// Where the next journal section goes (writes hold this lock: one at a time).
    ring: Mutex<Ring>,
}

impl std::fmt::Debug for IntegrityDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntegrityDevice")
            .field("layout", &self.layout)
            .field("mode", &self.mode)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl IntegrityDevice {
    /// Open the integrity device whose superblock is at byte `offset` of `storage` (the LUKS2
    /// data offset), its blocks under `mode`. Opened writable, a journal left by a crash is
    /// replayed (and cleared where the kernel would clear it); opened read-only, nothing is
    /// written and reads see the journal's blocks instead.
    ///
    /// Errors: [`Error::NotIntegrity`], [`Error::Format`], [`Error::Unsupported`] for the
    /// superblock; [`Error::Format`] if its tag or block size is not the mode's, or the device is
    /// shorter than the superblock says; [`Error::Io`].
    pub fn open(
        storage: Arc<dyn Storage>,
        offset: u64,
        mode: Mode,
        read_only: bool,
    ) -> Result<IntegrityDevice, Error> {
        if !offset.is_multiple_of(512) {
            return Err(Error::Format(format!(
                "an integrity superblock at byte {offset}, not on a sector"
            )));
        }
        let mut sb = vec![0u8; SUPERBLOCK_BYTES];
        storage.read_at(&mut sb, offset)?;
        let sb = Superblock::parse(&sb)?;
        let layout = Layout::new(&sb, offset / 512)?;
        if usize::from(sb.tag_size) != mode.tag_size() {
            return Err(Error::Format(format!(
                "the integrity superblock has {}-byte tags; {} has {}",
                sb.tag_size,
                mode.name(),
                mode.tag_size()
            )));
        }
        if layout.block_size() != mode.block_size() {
            return Err(Error::Format(format!(
                "the integrity superblock has {}-byte blocks; the volume's sectors are {} bytes",
                layout.block_size(),
                mode.block_size()
            )));
        }
        let len = storage.len()?;
        if layout.device_bytes() > len {
            return Err(Error::Format(format!(
                "the integrity superblock describes {} bytes of device; there are {len}",
                layout.device_bytes()
            )));
        }
        let scan = journal::scan(&*storage, &layout)?;
        let mut device = IntegrityDevice {
            storage,
            layout,
            mode,
            read_only,
            journalled: HashMap::new(),
            ring: Mutex::new(scan.ring),
        };
        if read_only {
            for b in scan.replay {
                device.journalled.insert(b.block, b);
            }
        } else {
            if !scan.replay.is_empty() {
                device.place(&scan.replay)?;
                device.storage.sync()?;
            }
            if let Some(seq) = scan.clear {
                journal::clear(&*device.storage, &device.layout, seq)?;
                device.storage.sync()?;
            }
        }
        Ok(device)
    }

    /// Opened read-only: the blocks read from the journal (committed there, perhaps not yet in
    /// place). Opened writable: 0 (the journal was replayed).
    pub fn journalled_blocks(&self) -> usize {
        self.journalled.len()
    }

    /// Its geometry.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Its authenticated encryption.
    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    /// Bytes of data it holds.
    pub fn size(&self) -> u64 {
        self.layout.provided_data_sectors * 512
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn check_range(&self, first: u64, len: usize) -> Result<u64, Error> {
        let bs = self.layout.block_size();
        if !len.is_multiple_of(bs) {
            return Err(Error::Range(format!(
                "{len} bytes are not whole {bs}-byte blocks"
            )));
        }
        let n = (len / bs) as u64;
        if first
            .checked_add(n)
            .is_none_or(|end| end > self.layout.blocks())
        {
            return Err(Error::Range(format!(
                "blocks {first}..{} past the end ({} blocks)",
                first.saturating_add(n),
                self.layout.blocks()
            )));
        }
        Ok(n)
    }

    /// Runs of consecutive blocks from `first` (`n` of them) that do not cross an area: their
    /// data and their tags are each contiguous on the device.
    fn runs(&self, first: u64, n: u64) -> Vec<(u64, u64)> {
        let per_area =
            1u64 << (self.layout.log2_interleave_sectors - self.layout.log2_sectors_per_block);
        let mut out = Vec::new();
        let (mut b, end) = (first, first + n);
        while b < end {
            let stop = end.min((b / per_area + 1) * per_area);
            out.push((b, stop - b));
            b = stop;
        }
        out
    }

    /// Read whole blocks from block `first` into `buf`, each checked against its tag.
    ///
    /// Errors: [`Error::Integrity`] naming the first block whose tag does not verify (the
    /// kernel's EILSEQ; `buf` then holds no unverified data); [`Error::Range`]; [`Error::Io`].
    pub fn read(&self, first: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.check_range(first, buf.len())?;
        let bs = self.layout.block_size();
        let ts = self.layout.tag_size as usize;
        let mut failed = None;
        let mut done = 0usize;
        for (start, count) in self.runs(first, (buf.len() / bs) as u64) {
            let data = &mut buf[done..done + count as usize * bs];
            self.storage.read_at(data, self.layout.data_offset(start))?;
            let mut tags = vec![0u8; count as usize * ts];
            self.storage
                .read_at(&mut tags, self.layout.tag_offset(start))?;
            for (i, (block, tag)) in data.chunks_mut(bs).zip(tags.chunks(ts)).enumerate() {
                let number = start + i as u64;
                let tag = match self.journalled.get(&number) {
                    Some(j) => {
                        block.copy_from_slice(&j.data);
                        &j.tag[..]
                    }
                    None => tag,
                };
                if self.mode.open(self.sector(number), block, tag).is_err() && failed.is_none() {
                    failed = Some(number);
                }
            }
            done += count as usize * bs;
        }
        match failed {
            Some(block) => Err(Error::Integrity { block }),
            None => Ok(()),
        }
    }

    /// Encrypt and write whole blocks from block `first`, through the journal.
    ///
    /// Errors: [`Error::ReadOnly`]; [`Error::Range`]; [`Error::Io`] (blocks not yet journalled
    /// are left as they were).
    pub fn write(&self, first: u64, buf: &[u8]) -> Result<(), Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let n = self.check_range(first, buf.len())?;
        let bs = self.layout.block_size();
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let per_section = self.layout.journal_section_entries;
        let mut iv = vec![0u8; self.mode.random_iv_size()];
        let mut b = 0;
        while b < n {
            let count = per_section.min(n - b);
            let mut blocks = Vec::with_capacity(count as usize);
            for k in b..b + count {
                let at = k as usize * bs;
                let mut data = buf[at..at + bs].to_vec();
                let mut tag = vec![0u8; self.layout.tag_size as usize];
                rand::rngs::OsRng.fill_bytes(&mut iv);
                self.mode
                    .seal(self.sector(first + k), &mut data, &mut tag, &iv)?;
                blocks.push(JournalBlock {
                    block: first + k,
                    data,
                    tag,
                });
            }
            let section = journal::section_bytes(&self.layout, ring.section, ring.seq, &blocks);
            self.storage
                .write_at(&section, self.layout.journal_sector_offset(ring.section, 0))?;
            self.storage.sync()?;
            // Committed: from here a crash is repaired by the replay.
            *ring = journal::advance(&self.layout, *ring);
            self.place(&blocks)?;
            self.storage.sync()?;
            b += count;
        }
        Ok(())
    }

    /// Write every block as zeros, encrypted and tagged, in place without the journal (as
    /// cryptsetup's wipe after formatting: a block never written otherwise fails its check).
    /// `progress` gets the blocks done and the total after each run.
    ///
    /// Errors: [`Error::ReadOnly`]; [`Error::Io`] (the blocks not reached still fail their
    /// checks).
    pub fn wipe(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let _ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let (bs, ts) = (self.layout.block_size(), self.layout.tag_size as usize);
        let total = self.layout.blocks();
        let mut iv = vec![0u8; self.mode.random_iv_size()];
        // At most 1 MiB of data a write.
        let chunk = (1 << 20) / bs as u64;
        let mut done = 0;
        for (start, count) in self.runs(0, total) {
            let mut b = start;
            while b < start + count {
                let n = chunk.min(start + count - b);
                let mut data = vec![0u8; n as usize * bs];
                let mut tags = vec![0u8; n as usize * ts];
                for (k, (block, tag)) in data.chunks_mut(bs).zip(tags.chunks_mut(ts)).enumerate() {
                    rand::rngs::OsRng.fill_bytes(&mut iv);
                    self.mode.seal(self.sector(b + k as u64), block, tag, &iv)?;
                }
                self.storage.write_at(&data, self.layout.data_offset(b))?;
                self.storage.write_at(&tags, self.layout.tag_offset(b))?;
                b += n;
                done += n;
                progress(done, total);
            }
        }
        self.storage.sync()?;
        Ok(())
    }

    /// Make what was written durable (writes are synced before they return: nothing waits).
    pub fn flush(&self) -> Result<(), Error> {
        self.storage.sync()?;
        Ok(())
    }

    /// Write `blocks` (ciphertext and tags, in order: a later one of the same block wins) in
    /// their places.
    fn place(&self, blocks: &[JournalBlock]) -> Result<(), Error> {
        for b in blocks {
            self.storage
                .write_at(&b.data, self.layout.data_offset(b.block))?;
            self.storage
                .write_at(&b.tag, self.layout.tag_offset(b.block))?;
        }
        Ok(())
    }

    /// The 512-byte sector number of block `block` (what the associated data carries).
    fn sector(&self, block: u64) -> u64 {
        block << self.layout.log2_sectors_per_block
    }
}
