//! A dm-integrity device with dm-crypt's authenticated encryption on top: what
//! `cryptsetup open` of a LUKS2 `--integrity` volume maps, as one object over the data device.
//!
//! Reads take each block's data and tag from their places (or from the journal, on a device
//! opened read-only whose journal still holds committed blocks) and hand out only blocks whose
//! tag verifies.
//!
//! Writes go through the journal as the kernel's journal mode ('J') takes them: a written block
//! waits in memory (reads see it) until a flush, or until it and the others waiting fill a
//! quarter of the journal; then they are committed: written as whole journal sections, synced
//! (the commit point), and copied in place. A crash leaves every block as its last flush left it
//! or newer, never torn: a replay (here or by the kernel) finishes any copy in place.
//!
//! A commit's I/O runs outside the device lock, in three stages (journal write, sync, copies in
//! place) that successive commits overlap: while one commit syncs, the next one writes its
//! sections and the one before copies in place, and later blocks are sealed and queued. One
//! commit is in each stage at a time, in order (each takes the next stage's turn before leaving
//! its own), and reads see every commit's blocks until they are in place. A quarter of the
//! journal per commit makes one sync per commit enough: a commit's copies in place are done
//! before the sync two commits later begins, which ends before the commit four later writes the
//! journal, the first that can reach the same sections. When that does not hold (a small
//! journal, a flush that left the ring elsewhere), a commit waits for the stages to empty and
//! syncs first. After an I/O error in a commit the device refuses writes and flushes, as the
//! kernel's fails; reopening replays the journal.
//!
//! Commits of full batches run on the device's three committer threads, one per stage, not on
//! the thread whose write filled the batch: that write returns at once, and a write that finds
//! the batch full waits only until a committer has taken it, not for its I/O. (Run by the
//! writers, a commit held its writer through all three stages, so a server's few writers were
//! mostly waiting for the disk, and the stages seldom overlapped.) A flush commits what waits
//! on its own thread, after the commits under way. A failed commit is reported by the next write
//! or flush.
//!
//! The journal's sections and the copies in place are written past the page cache
//! ([`Storage::write_uncached`], `O_DIRECT` on a file), as the kernel's bios go to the device:
//! the journal is read again only by a replay, and for both the copy into the cache and its
//! writeback at the next sync cost the server more CPU than the I/O itself. Tags stay cached
//! (they are small, and read with every block).
//!
//! Without the journal (`--integrity-no-journal`, the kernel's 'D' mode) blocks go in place at
//! once, data and tag, and a crash can leave a block that fails its check, as there.
//!
//! Reads and writes exclude each other per device (a read under a shared lock, a placement in
//! place under an exclusive one, or with the blocks still readable from memory): a read never
//! sees a block's new data with its old tag.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::{self, JoinHandle};

use rand::RngCore;
use sectorcrypt_storage::{uncached_start, Storage, UNCACHED_ALIGN};

use crate::batch::{Aligned, Batch, Buffers, Sealed};
use crate::journal::{self, Ring};
use crate::layout::Layout;
use crate::mode::Mode;
use crate::superblock::{Superblock, SUPERBLOCK_BYTES};
use crate::Error;

/// An opened integrity device.
pub struct IntegrityDevice {
    device: Arc<Device>,
    /// The threads that commit full batches (with the journal, opened writable).
    committers: Vec<JoinHandle<()>>,
}

/// How many committer threads a journalled device has: one for each stage of a commit.
const COMMITTERS: usize = 3;

/// What an [`IntegrityDevice`] and its committer threads share.
struct Device {
    storage: Arc<dyn Storage>,
    layout: Layout,
    mode: Mode,
    read_only: bool,
    /// Writes go through the journal (else straight in place).
    journal: bool,
    /// Opened read-only: the committed blocks the journal holds that may not be in place yet.
    journalled: Batch,
    /// The writes not yet committed and the ring (reads hold it shared, writes exclusive).
    writes: RwLock<Writes>,
    /// The turns of a commit's stages (see the module docs), taken in this order, each before
    /// `writes`. The journal stage's holds the buffer its sections are made in (kept: a fresh
    /// one would be page-faulted in for every commit).
    journal_turn: Mutex<Vec<u8>>,
    sync_turn: Mutex<()>,
    place_turn: Mutex<()>,
    /// Buffers of placed requests, for the next ones.
    buffers: Buffers,
    /// A full batch waits for a committer, or the committers are to stop.
    wanted: Mutex<Wanted>,
    commit_wanted: Condvar,
    /// Commits begun (each takes the waiting blocks, making room for more): what writes that
    /// found no room wait on.
    begun: Mutex<u64>,
    room: Condvar,
}

#[derive(Default)]
struct Wanted {
    commit: bool,
    stop: bool,
}

/// The most bytes of journal sections made and written at once.
const JOURNAL_WRITE_BYTES: usize = 4 << 20;

fn lock<T>(turn: &Mutex<T>) -> MutexGuard<'_, T> {
    turn.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sections `start..start + count` of a ring of `sections` (wrapping).
#[derive(Clone, Copy, Debug)]
struct Sections {
    start: u64,
    count: u64,
}

impl Sections {
    fn overlaps(self, other: Sections, sections: u64) -> bool {
        (0..self.count).any(|i| {
            let s = (self.start + i) % sections;
            (s + sections - other.start) % sections < other.count
        })
    }
}

/// What waits to be committed, and where the journal goes on.
struct Writes {
    /// The next journal section and its sequence.
    ring: Ring,
    /// Blocks written since the last commit began.
    pending: Batch,
    /// Commits begun and not yet in place, oldest first, with their sections.
    unplaced: VecDeque<(Sections, Arc<Batch>)>,
    /// Sections of commits copied in place since the last sync began, oldest first.
    placed_unsynced: Vec<Sections>,
    /// A commit failed: writes and flushes are refused.
    failed: bool,
}

impl Writes {
    /// The newest data of `block` not yet in place.
    fn unplaced(&self, block: u64) -> Option<(&[u8], &[u8])> {
        self.pending
            .get(block)
            .or_else(|| self.unplaced.iter().rev().find_map(|(_, b)| b.get(block)))
    }

    fn check_failed(&self) -> Result<(), Error> {
        if self.failed {
            return Err(Error::Io(std::io::Error::other(
                "a journal commit failed; reopen the device to replay its journal",
            )));
        }
        Ok(())
    }
}

impl std::fmt::Debug for IntegrityDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntegrityDevice")
            .field("layout", &self.device.layout)
            .field("mode", &self.device.mode)
            .field("read_only", &self.device.read_only)
            .finish_non_exhaustive()
    }
}

impl Device {
    fn open(
        storage: Arc<dyn Storage>,
        offset: u64,
        mode: Mode,
        read_only: bool,
        journal: bool,
    ) -> Result<Device, Error> {
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
        let mut device = Device {
            storage,
            layout,
            mode,
            read_only,
            journal,
            journalled: Batch::default(),
            writes: RwLock::new(Writes {
                ring: scan.ring,
                pending: Batch::default(),
                unplaced: VecDeque::new(),
                placed_unsynced: Vec::new(),
                failed: false,
            }),
            journal_turn: Mutex::new(Vec::new()),
            sync_turn: Mutex::new(()),
            place_turn: Mutex::new(()),
            buffers: Buffers::default(),
            wanted: Mutex::default(),
            commit_wanted: Condvar::new(),
            begun: Mutex::new(0),
            room: Condvar::new(),
        };
        let replay = Batch::from_journal(scan.replay);
        if read_only {
            device.journalled = replay;
        } else {
            if !replay.is_empty() {
                device.place(&replay)?;
                device.storage.sync()?;
            }
            let clear = match scan.clear {
                None if !journal && !replay.is_empty() => Some(0),
                clear => clear,
            };
            if let Some(seq) = clear {
                journal::clear(&*device.storage, &device.layout, seq)?;
                device.storage.sync()?;
            }
        }
        Ok(device)
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

    fn read(&self, first: u64, buf: &mut [u8]) -> Result<(), Error> {
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
            for (i, (block, tag)) in data.chunks_mut(bs).zip(tags.chunks_mut(ts)).enumerate() {
                let number = start + i as u64;
                let newer = writes
                    .unplaced(number)
                    .or_else(|| self.journalled.get(number));
                if let Some((newer_data, newer_tag)) = newer {
                    block.copy_from_slice(newer_data);
                    tag.copy_from_slice(newer_tag);
                }
            }
            if let Err(k) = self.mode.open_blocks(self.sector(start), data, &tags) {
                failed = failed.or(Some(start + k as u64));
            }
            done += count as usize * bs;
        }
        match failed {
            Some(block) => Err(Error::Integrity { block }),
            None => Ok(()),
        }
    }

    fn write(&self, first: u64, buf: &[u8]) -> Result<(), Error> {
        let n = self.check_write(first, buf.len())?;
        let mut data = self.buffers.copy_of(buf);
        let tags = self.seal(first, n, &mut data)?;
        if !self.journal {
            return self.write_direct(first, n, &data, &tags);
        }
        self.queue(first, n, data, tags)
    }

    fn write_in_place(&self, first: u64, buf: &mut [u8]) -> Result<(), Error> {
        if self.journal {
            // The journal keeps the sealed blocks until they are in place: they need a buffer
            // of their own either way.
            return self.write(first, buf);
        }
        let n = self.check_write(first, buf.len())?;
        let tags = self.seal(first, n, buf)?;
        self.write_direct(first, n, buf, &tags)
    }

    /// The number of blocks of a write of `len` bytes at block `first`, if the device takes it.
    fn check_write(&self, first: u64, len: usize) -> Result<u64, Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.check_range(first, len)
    }

    /// Encrypt the `n` blocks of `data` from block `first` in place; their tags.
    fn seal(&self, first: u64, n: u64, data: &mut [u8]) -> Result<Vec<u8>, Error> {
        // Every block's random IV from one call: one system call a request, not a block.
        let iv_size = self.mode.random_iv_size();
        let mut ivs = vec![0u8; n as usize * iv_size];
        rand::rngs::OsRng.fill_bytes(&mut ivs);
        let mut tags = vec![0u8; n as usize * self.layout.tag_size as usize];
        // Sealed before any lock: concurrent writes encrypt in parallel, and only queue or
        // place one at a time.
        self.mode
            .seal_blocks(self.sector(first), data, &mut tags, &ivs)?;
        Ok(tags)
    }

    /// Without the journal: the sealed blocks and their tags in place.
    fn write_direct(&self, first: u64, n: u64, data: &[u8], tags: &[u8]) -> Result<(), Error> {
        let (bs, ts) = (self.layout.block_size(), self.layout.tag_size as usize);
        let _writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
        for (start, count) in self.runs(first, n) {
            let k = (start - first) as usize;
            let end = k + count as usize;
            self.write_run(start, &data[k * bs..end * bs], &tags[k * ts..end * ts])?;
        }
        Ok(())
    }

    /// With the journal: the sealed blocks join the waiting ones, committing full batches.
    fn queue(&self, first: u64, n: u64, data: Aligned, tags: Vec<u8>) -> Result<(), Error> {
        let sealed = Arc::new(Sealed {
            first,
            block_size: self.layout.block_size(),
            data,
            tags,
        });
        let (n, mut k) = (n as usize, 0);
        loop {
            let mut writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
            writes.check_failed()?;
            while k < n
                && (writes.pending.len() < self.batch_blocks()
                    || writes.pending.contains(first + k as u64))
            {
                writes.pending.put(&sealed, k);
                k += 1;
            }
            if writes.pending.len() < self.batch_blocks() {
                return Ok(());
            }
            // A full batch: a committer takes it. The rest of this request waits for that
            // (the room it makes), not for the commit's I/O.
            let begun = *lock(&self.begun);
            drop(writes);
            lock(&self.wanted).commit = true;
            self.commit_wanted.notify_one();
            if k == n {
                return Ok(());
            }
            let mut now = lock(&self.begun);
            while *now == begun {
                now = self.room.wait(now).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }

    /// A committer thread: commit each full batch it is woken for, until told to stop. A commit
    /// that fails marks the device failed, which later writes and flushes report.
    fn run_committer(&self) {
        loop {
            {
                let mut wanted = lock(&self.wanted);
                while !wanted.commit && !wanted.stop {
                    wanted = self
                        .commit_wanted
                        .wait(wanted)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if !wanted.commit {
                    return;
                }
                wanted.commit = false;
            }
            // A panic would leave writers waiting for room: make it a failed commit.
            let commit = panic::catch_unwind(AssertUnwindSafe(|| self.commit(false)));
            if commit.is_err() {
                self.fail();
            }
        }
    }

    /// Refuse writes and flushes from now on (a commit failed), and wake the writes waiting for
    /// room to say so.
    fn fail(&self) {
        self.writes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .failed = true;
        self.began();
    }

    /// Count a commit begun (or failed), waking the writes waiting for room.
    fn began(&self) {
        *lock(&self.begun) += 1;
        self.room.notify_all();
    }

    /// Blocks per commit: those of a quarter of the journal's sections (at least one section).
    fn batch_blocks(&self) -> usize {
        let sections = (self.layout.journal_sections / 4).max(1);
        (sections * self.layout.journal_section_entries) as usize
    }

    /// Commit the blocks waiting (at most a batch of them; see the module docs), after the
    /// commits under way; unless `partial`, only a full batch (the commit this caller waited for
    /// may have taken its blocks). With nothing to commit and `partial`, wait for the commits
    /// under way to be durable.
    ///
    /// Errors: [`Error::Io`]; the device then refuses writes and flushes.
    fn commit(&self, partial: bool) -> Result<(), Error> {
        let mut journal_turn = lock(&self.journal_turn);
        let mut writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
        writes.check_failed()?;
        let waiting = writes.pending.len();
        if waiting == 0 && partial {
            drop(writes);
            // The commit before this one has synced once its turn is free.
            drop(lock(&self.sync_turn));
            return self.read_writes().check_failed();
        }
        if waiting == 0 || (!partial && waiting < self.batch_blocks()) {
            return Ok(());
        }
        // Never more than a batch: writes wait for a commit rather than grow it.
        // The next batch is likely this one's size again.
        let next = Batch::with_capacity(writes.pending.len());
        let batch = Arc::new(std::mem::replace(&mut writes.pending, next));
        let entries = self.layout.journal_section_entries as usize;
        let start = writes.ring;
        let sections = Sections {
            start: start.section,
            count: batch.len().div_ceil(entries) as u64,
        };
        let ring_sections = self.layout.journal_sections;
        let mut ring = start;
        for _ in 0..sections.count {
            ring = journal::advance(&self.layout, ring);
        }
        writes.ring = ring;
        let reused = writes
            .unplaced
            .iter()
            .map(|(s, _)| s)
            .chain(&writes.placed_unsynced)
            .any(|s| s.overlaps(sections, ring_sections));
        writes.unplaced.push_back((sections, Arc::clone(&batch)));
        self.began();
        drop(writes);
        let stages = || -> Result<(), Error> {
            // Sections whose copies in place may not be durable: wait for the commits under way
            // to leave every stage, then sync.
            let early = reused.then(|| (lock(&self.sync_turn), lock(&self.place_turn)));
            if early.is_some() {
                self.sync_placed()?;
            }
            self.write_journal(start, &batch, &mut journal_turn)?;
            let (sync_turn, early_place) = match early {
                Some((s, p)) => (s, Some(p)),
                None => (lock(&self.sync_turn), None),
            };
            drop(journal_turn);
            self.read_writes().check_failed()?;
            // The commit point; it also makes the copies in place done before it durable.
            self.sync_placed()?;
            let place_turn = early_place.unwrap_or_else(|| lock(&self.place_turn));
            drop(sync_turn);
            self.read_writes().check_failed()?;
            self.place(&batch)?;
            let mut writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
            writes.unplaced.retain(|(_, b)| !Arc::ptr_eq(b, &batch));
            writes.placed_unsynced.push(sections);
            drop(place_turn);
            Ok(())
        };
        let done = stages();
        if done.is_err() {
            // Its blocks stay readable from memory.
            self.fail();
        } else if let Ok(batch) = Arc::try_unwrap(batch) {
            // In place, and no longer seen by reads: its buffers can take later requests.
            let limit = 2 * self.batch_blocks() * self.layout.block_size();
            self.buffers.recycle(batch, limit);
        }
        done
    }

    /// Write the sections of `batch` from `start` on: each stretch of them that is consecutive on
    /// the device (up to the ring's end, at most [`JOURNAL_WRITE_BYTES`]) made in `buf` and
    /// written at once.
    fn write_journal(
        &self,
        start: journal::Ring,
        batch: &Batch,
        buf: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let section_bytes = (self.layout.journal_section_sectors * 512) as usize;
        let per_write = (JOURNAL_WRITE_BYTES / section_bytes).max(1);
        let entries = batch.entries();
        let mut sections = entries.chunks(self.layout.journal_section_entries as usize);
        let mut left = sections.len();
        let mut at = start;
        while left > 0 {
            let to_end = (self.layout.journal_sections - at.section) as usize;
            let n = left.min(per_write).min(to_end);
            // Aligned for a write past the page cache: the journal is read back only by a
            // replay, and the copy into the cache and its writeback cost as much as the write.
            buf.resize(n * section_bytes + UNCACHED_ALIGN, 0);
            let skip = uncached_start(buf);
            let bytes = &mut buf[skip..skip + n * section_bytes];
            let offset = self.layout.journal_sector_offset(at.section, 0);
            for out in bytes.chunks_mut(section_bytes) {
                let chunk = sections.next().unwrap_or_default();
                journal::fill_section(&self.layout, at.section, at.seq, chunk, out);
                at = journal::advance(&self.layout, at);
            }
            self.storage.write_uncached(&[bytes], offset)?;
            left -= n;
        }
        Ok(())
    }

    fn read_writes(&self) -> std::sync::RwLockReadGuard<'_, Writes> {
        self.writes.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sync the storage; the copies in place done before it are then durable.
    fn sync_placed(&self) -> Result<(), Error> {
        let covered = self.read_writes().placed_unsynced.len();
        self.storage.sync()?;
        let mut writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
        writes.placed_unsynced.drain(..covered);
        Ok(())
    }

    fn wipe(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let _writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
        let (bs, ts) = (self.layout.block_size(), self.layout.tag_size as usize);
        let total = self.layout.blocks();
        // At most 1 MiB of data a write.
        let chunk = (1 << 20) / bs as u64;
        let mut done = 0;
        for (start, count) in self.runs(0, total) {
            let mut b = start;
            while b < start + count {
                let n = chunk.min(start + count - b);
                let mut data = vec![0u8; n as usize * bs];
                let mut tags = vec![0u8; n as usize * ts];
                let mut ivs = vec![0u8; n as usize * self.mode.random_iv_size()];
                rand::rngs::OsRng.fill_bytes(&mut ivs);
                self.mode
                    .seal_blocks(self.sector(b), &mut data, &mut tags, &ivs)?;
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

    fn flush(&self) -> Result<(), Error> {
        if !self.journal {
            let _writes = self.writes.write().unwrap_or_else(PoisonError::into_inner);
            return Ok(self.storage.sync()?);
        }
        // Each commit waits for the one before; the last one (with nothing left to commit, the
        // one under way) makes every write so far durable.
        loop {
            self.commit(true)?;
            if self.read_writes().pending.is_empty() {
                return Ok(());
            }
        }
    }

    /// Write the blocks of `batch` (ciphertext and tags) in their places: each run of them that
    /// one request holds, inside an area, with one write for the data and one for the tags.
    fn place(&self, batch: &Batch) -> Result<(), Error> {
        let per_area =
            1u64 << (self.layout.log2_interleave_sectors - self.layout.log2_sectors_per_block);
        // The data past the page cache, as the kernel's: it is read back from the device, and
        // copying it into the cache and writing it back from there cost the server more than
        // the write itself.
        for run in batch.runs(per_area) {
            self.storage
                .write_uncached(&run.data, self.layout.data_offset(run.first))?;
            self.storage
                .write_gathered(&run.tags, self.layout.tag_offset(run.first))?;
        }
        Ok(())
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
        let device = Arc::new(Device::open(storage, offset, mode, read_only, journal)?);
        let mut opened = IntegrityDevice {
            device,
            committers: Vec::new(),
        };
        if journal && !read_only {
            for _ in 0..COMMITTERS {
                let device = Arc::clone(&opened.device);
                let thread = thread::Builder::new()
                    .name("integrity-commit".into())
                    .spawn(move || device.run_committer())?;
                opened.committers.push(thread);
            }
        }
        Ok(opened)
    }

    /// Opened read-only: the blocks read from the journal (committed there, perhaps not yet in
    /// place). Opened writable: 0 (the journal was replayed).
    pub fn journalled_blocks(&self) -> usize {
        self.device.journalled.len()
    }

    /// Its geometry.
    pub fn layout(&self) -> &Layout {
        &self.device.layout
    }

    /// Its authenticated encryption.
    pub fn mode(&self) -> &Mode {
        &self.device.mode
    }

    /// Bytes of data it holds.
    pub fn size(&self) -> u64 {
        self.device.layout.provided_data_sectors * 512
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.device.read_only
    }

    /// Read whole blocks from block `first` into `buf`, each checked against its tag.
    ///
    /// Errors: [`Error::Integrity`] naming the first block whose tag does not verify (the
    /// kernel's EILSEQ; `buf` then holds no unverified data); [`Error::Range`]; [`Error::Io`].
    pub fn read(&self, first: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.device.read(first, buf)
    }

    /// Encrypt and write whole blocks from block `first`: into the journal's waiting blocks
    /// (committed at the next flush, or by a committer thread once they fill a quarter of the
    /// journal), or in place without the journal.
    ///
    /// Errors: [`Error::ReadOnly`]; [`Error::Range`]; [`Error::Io`] after a commit failed (the
    /// device then refuses writes and flushes; reopening replays the journal, and a block reads
    /// as the last flush left it or newer).
    pub fn write(&self, first: u64, buf: &[u8]) -> Result<(), Error> {
        self.device.write(first, buf)
    }

    /// [`IntegrityDevice::write`], encrypting `buf` in place (it is scrambled afterwards): without
    /// the journal, this saves a copy of the request.
    pub fn write_in_place(&self, first: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.device.write_in_place(first, buf)
    }

    /// Write every block as zeros, encrypted and tagged, in place without the journal (as
    /// cryptsetup's wipe after formatting: a block never written otherwise fails its check).
    /// `progress` gets the blocks done and the total after each run.
    ///
    /// Errors: [`Error::ReadOnly`]; [`Error::Io`] (the blocks not reached still fail their
    /// checks).
    pub fn wipe(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), Error> {
        self.device.wipe(progress)
    }

    /// Make every write so far durable: the waiting blocks committed (or, without the journal,
    /// the storage synced).
    ///
    /// Errors: [`Error::Io`].
    pub fn flush(&self) -> Result<(), Error> {
        self.device.flush()
    }
}

impl Drop for IntegrityDevice {
    /// Commit what still waits, as closing the kernel's device does (what cannot be written is
    /// what a crash would have lost), then stop the committers.
    fn drop(&mut self) {
        if !self.device.read_only {
            let _ = self.device.flush();
        }
        lock(&self.device.wanted).stop = true;
        self.device.commit_wanted.notify_all();
        for committer in self.committers.drain(..) {
            let _ = committer.join();
        }
    }
}
