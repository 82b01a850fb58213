//! A dm-integrity device with dm-crypt's authenticated encryption on top: what
//! `cryptsetup open` of a LUKS2 `--integrity` volume maps, as one object over the data device.
//!
//! Reads take each block's data and tag from their places (or from the journal, on a device
//! opened read-only whose journal still holds committed blocks) and hand out only blocks whose
//! tag verifies.
//!
//! Writes go through the journal as the kernel's journal mode ('J') takes them: a written block
//! waits in memory (reads see it) until a flush, or until it and the others waiting fill the
//! journal; then they are committed: the previous commit's copies in place are synced (the ring
//! is about to overwrite their sections), the waiting blocks are written as whole journal
//! sections, synced (the commit point), and copied in place. A crash leaves every block as its
//! last flush left it or newer, never torn: a replay (here or by the kernel) finishes any copy
//! in place. Without the journal (`--integrity-no-journal`, the kernel's 'D' mode) blocks go in
//! place at once, data and tag, and a crash can leave a block that fails its check, as there.
//!
//! Reads and writes exclude each other per device (a read under a shared lock, a write under an
//! exclusive one): a read never sees a block's new data with its old tag.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock, RwLockWriteGuard};

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
    /// Writes go through the journal (else straight in place).
    journal: bool,
    /// Opened read-only: the committed blocks the journal holds that may not be in place yet.
    journalled: HashMap<u64, JournalBlock>,
    /// The writes not yet committed and the ring (reads hold it shared, writes exclusive).
    writes: RwLock<Writes>,
}

/// What waits to be committed, and where the journal goes on.
struct Writes {
    /// The next journal section and its sequence.
    ring: Ring,
    /// Blocks written since the last commit, each once (its latest data), in order of first
    /// write.
    pending: Vec<JournalBlock>,
    /// Where each pending block is in `pending`.
    index: HashMap<u64, usize>,
    /// Copies in place made since the storage was last synced.
    placed_unsynced: bool,
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
        IntegrityDevice::open_with(storage, offset, mode, read_only, true)
    }

    /// [`IntegrityDevice::open`], writing through the journal or (`journal` false, cryptsetup's
    /// `--integrity-no-journal`) straight in place; then a journal left by a crash is replayed
    /// and cleared, as the kernel's direct mode does.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        offset: u64,
        mode: Mode,
        read_only: bool,
        journal: bool,
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
            journal,
            journalled: HashMap::new(),
            writes: RwLock::new(Writes {
                ring: scan.ring,
                pending: Vec::new(),
                index: HashMap::new(),
                placed_unsynced: false,
            }),
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
            let clear = match scan.clear {
                None if !journal && !scan.replay.is_empty() => Some(0),
                clear => clear,
            };
            if let Some(seq) = clear {
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
        let writes = self.writes.read().unwrap_or_else(PoisonError::into_inner);
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
                let newer = writes
                    .index
                    .get(&number)
                    .map(|&i| &writes.pending[i])
                    .or_else(|| self.journalled.get(&number));
                let tag = match newer {
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

    /// Encrypt and write whole blocks from block `first`: into the journal's waiting blocks
    /// (committed at the next flush, or once they fill the journal), or in place without the
    /// journal.
    ///
    /// Errors: [`Error::ReadOnly`]; [`Error::Range`]; [`Error::Io`] from a commit (the blocks
    /// then keep waiting; a crash leaves them as the last flush did).
    pub fn write(&self, first: u64, buf: &[u8]) -> Result<(), Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let n = self.check_range(first, buf.len())?;
        let bs = self.layout.block_size();
        let ts = self.layout.tag_size as usize;
        // Every block's random IV from one call: one system call a request, not a block.
        let iv_size = self.mode.random_iv_size();
        let mut ivs = vec![0u8; n as usize * iv_size];
        rand::rngs::OsRng.fill_bytes(&mut ivs);
        let mut data = buf.to_vec();
        let mut tags = vec![0u8; n as usize * ts];
        for (k, (block, tag)) in data.chunks_mut(bs).zip(tags.chunks_mut(ts)).enumerate() {
            let iv = &ivs[k * iv_size..(k + 1) * iv_size];
            self.mode
                .seal(self.sector(first + k as u64), block, tag, iv)?;
        }
        // Sealed before the lock: concurrent writes encrypt in parallel, and only queue or
        // place one at a time.
        let mut writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
        if !self.journal {
            for (start, count) in self.runs(first, n) {
                let k = (start - first) as usize;
                let end = k + count as usize;
                self.write_run(start, &data[k * bs..end * bs], &tags[k * ts..end * ts])?;
            }
            writes.placed_unsynced = true;
            return Ok(());
        }
        let sealed = data
            .chunks(bs)
            .zip(tags.chunks(ts))
            .enumerate()
            .map(|(k, (data, tag))| JournalBlock {
                block: first + k as u64,
                data: data.to_vec(),
                tag: tag.to_vec(),
            });
        let capacity =
            (self.layout.journal_section_entries * self.layout.journal_sections) as usize;
        for b in sealed {
            if writes.pending.len() == capacity && !writes.index.contains_key(&b.block) {
                self.commit(&mut writes)?;
            }
            match writes.index.get(&b.block) {
                Some(&i) => writes.pending[i] = b,
                None => {
                    let i = writes.pending.len();
                    writes.index.insert(b.block, i);
                    writes.pending.push(b);
                }
            }
        }
        Ok(())
    }

    /// Commit the waiting blocks (see the module docs).
    fn commit(&self, writes: &mut RwLockWriteGuard<'_, Writes>) -> Result<(), Error> {
        if writes.pending.is_empty() {
            return Ok(());
        }
        if writes.placed_unsynced {
            self.storage.sync()?;
            writes.placed_unsynced = false;
        }
        let mut ring = writes.ring;
        for entries in writes
            .pending
            .chunks(self.layout.journal_section_entries as usize)
        {
            let section = journal::section_bytes(&self.layout, ring.section, ring.seq, entries);
            self.storage
                .write_at(&section, self.layout.journal_sector_offset(ring.section, 0))?;
            ring = journal::advance(&self.layout, ring);
        }
        self.storage.sync()?;
        // Committed: from here a crash is repaired by the replay.
        writes.ring = ring;
        writes.placed_unsynced = true;
        let placed = self.place(&writes.pending);
        writes.pending.clear();
        writes.index.clear();
        placed
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
        let _writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
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

    /// Make every write so far durable: the waiting blocks committed (or, without the journal,
    /// the storage synced).
    ///
    /// Errors: [`Error::Io`].
    pub fn flush(&self) -> Result<(), Error> {
        let mut writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
        if self.journal {
            self.commit(&mut writes)
        } else {
            self.storage.sync()?;
            writes.placed_unsynced = false;
            Ok(())
        }
    }

    /// Write `blocks` (ciphertext and tags; a later one of the same block wins) in their places:
    /// each run of consecutive blocks inside an area with one write for the data and one for the
    /// tags.
    fn place(&self, blocks: &[JournalBlock]) -> Result<(), Error> {
        let latest: BTreeMap<u64, &JournalBlock> = blocks.iter().map(|b| (b.block, b)).collect();
        let per_area =
            1u64 << (self.layout.log2_interleave_sectors - self.layout.log2_sectors_per_block);
        let mut run: Vec<&JournalBlock> = Vec::new();
        let flush_run = |run: &mut Vec<&JournalBlock>| -> Result<(), Error> {
            if let Some(first) = run.first() {
                let (data, tags): (Vec<&[u8]>, Vec<&[u8]>) =
                    run.iter().map(|b| (&b.data[..], &b.tag[..])).unzip();
                self.write_run(first.block, &data.concat(), &tags.concat())?;
            }
            run.clear();
            Ok(())
        };
        for b in latest.into_values() {
            let follows = run
                .last()
                .is_some_and(|l| l.block + 1 == b.block && b.block % per_area != 0);
            if !follows {
                flush_run(&mut run)?;
            }
            run.push(b);
        }
        flush_run(&mut run)
    }

    /// Write the ciphertext `data` and the tags `tags` of consecutive blocks from `first`, all in
    /// one area, in their places.
    fn write_run(&self, first: u64, data: &[u8], tags: &[u8]) -> Result<(), Error> {
        self.storage
            .write_at(data, self.layout.data_offset(first))?;
        self.storage.write_at(tags, self.layout.tag_offset(first))?;
        Ok(())
    }

    /// The 512-byte sector number of block `block` (what the associated data carries).
    fn sector(&self, block: u64) -> u64 {
        block << self.layout.log2_sectors_per_block
    }
}

impl Drop for IntegrityDevice {
    /// Commit what still waits, as closing the kernel's device does (what cannot be written is
    /// what a crash would have lost).
    fn drop(&mut self) {
        if !self.read_only {
            let _ = self.flush();
        }
    }
}
