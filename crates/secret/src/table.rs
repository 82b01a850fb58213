//! A table of secret values of one type under 32-bit tags `0..capacity`, in secret memory and
//! flat: the value under tag `t` sits in slot `t` of a chunk of slots, so that finding it costs no
//! lookup and no chain of pointers, only the fetch of the slot itself (Key Per I/O tables of
//! 65,536 keys, each request under a key of its own). Key Per I/O tags are indexes into a table
//! of keys, as NVMe's are, so a map from tag to slot would only add cache misses.
//!
//! A value stays alive while [`Entry`]s for it exist. [`SecretTable::evict`] takes the tag out at
//! once; the value is dropped (and its slot zeroized) when the last entry for it goes, by
//! whichever of the two comes last. Each slot's state is one atomic word, kept at the slot's end
//! beside the value so that a request fetches both together:
//!
//! - `LOADED`: the value is visible under its tag; an entry is made only while it is set.
//! - `LIVE`: a value is in the slot (loaded, or evicted and still in use).
//! - `BUSY`: one thread owns the slot's bytes (building a value into it, or dropping one).
//! - the rest: the count of users. A lookup counts itself in first and checks `LOADED` after, so
//!   lookups take no lock; one that finds the tag empty counts itself out again.
//!
//! Whoever brings the count to zero on a `LIVE` value that is no longer `LOADED` (the last entry,
//! the eviction, or a lookup that found the tag empty) tries to swap the state from exactly `LIVE`
//! to `BUSY`; the one that succeeds drops the value, so it is dropped once. A slot is filled only
//! from a state with neither `LIVE` nor `BUSY`, and becomes visible (`LIVE | LOADED`) only after
//! its bytes are written.
//!
//! Chunks of slots are mapped when a tag in them is first loaded, so a table sized for millions of
//! keys costs memory only near the tags in use.

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use zeroize::Zeroize;

use crate::region::Region;

/// Bytes per chunk of slots, mapped, locked and zeroized together: a huge page, so that requests
/// under random tags of a large table do not each miss the TLB.
const CHUNK_BYTES: usize = 2 << 20;
/// The value is visible under its tag.
const LOADED: u32 = 1 << 31;
/// A value is in the slot.
const LIVE: u32 = 1 << 30;
/// One thread owns the slot's bytes.
const BUSY: u32 = 1 << 29;
/// The count of users.
const USERS: u32 = BUSY - 1;

/// Why [`SecretTable::insert_with`] stored nothing.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InsertError<E> {
    /// A value is stored under the tag already.
    Exists,
    /// The value evicted from the tag is still in use; it is dropped when its last entry goes.
    InUse,
    /// The tag is not below the table's capacity.
    OutOfRange,
    /// The value could not be made.
    Make(E),
}

/// The words at a slot's end: its state, and how many values it has dropped (for
/// [`SecretTable::destroy`]).
#[repr(C)]
struct SlotState {
    state: AtomicU32,
    drops: AtomicU32,
}

/// Secret values under tags; see the module docs.
pub struct SecretTable<T> {
    chunks: Box<[OnceLock<Region>]>,
    capacity: usize,
    /// Slots per chunk.
    per_chunk: usize,
    /// Bytes per slot: a whole number of cache lines, aligned for `T`, the value then its state.
    stride: usize,
    /// Where a slot's [`SlotState`] is.
    state_at: usize,
    /// Values stored (loaded).
    loaded: AtomicUsize,
    value: PhantomData<T>,
}

// SAFETY: the table owns its `T`s as a `Vec<T>` would, and hands out `&T` to any thread.
unsafe impl<T: Send + Sync> Send for SecretTable<T> {}
// SAFETY: as above: shared access only gives `&T`; a slot's bytes are written only by the one
// thread that set its `BUSY` bit.
unsafe impl<T: Send + Sync> Sync for SecretTable<T> {}

/// A value of a [`SecretTable`], kept alive while this exists.
pub struct Entry<'a, T> {
    table: &'a SecretTable<T>,
    slot: *mut T,
    state: &'a SlotState,
}

// SAFETY: an entry is a counted `&T`; the count is atomic.
unsafe impl<T: Sync> Send for Entry<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Entry<'_, T> {}

impl<T> SecretTable<T> {
    /// A table for values under tags `0..capacity`.
    pub fn new(capacity: usize) -> Self {
        assert!(
            std::mem::align_of::<T>() <= 4096,
            "no type is aligned beyond a page"
        );
        assert!(capacity as u64 <= 1 << 32, "tags are 32-bit");
        let state_at = std::mem::size_of::<T>().next_multiple_of(std::mem::align_of::<SlotState>());
        let stride = (state_at + std::mem::size_of::<SlotState>())
            .next_multiple_of(std::mem::align_of::<T>().max(64));
        let per_chunk = (CHUNK_BYTES / stride).clamp(1, capacity.max(1));
        SecretTable {
            chunks: (0..capacity.div_ceil(per_chunk))
                .map(|_| OnceLock::new())
                .collect(),
            capacity,
            per_chunk,
            stride,
            state_at,
            loaded: AtomicUsize::new(0),
            value: PhantomData,
        }
    }

    /// Values the table can hold: its tags are `0..capacity`.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.loaded.load(Ordering::Relaxed)
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a value is stored under `tag`.
    pub fn contains(&self, tag: u32) -> bool {
        self.slot(tag)
            .is_some_and(|(_, s)| s.state.load(Ordering::Acquire) & LOADED != 0)
    }

    /// The tags stored, in ascending order.
    pub fn tags(&self) -> Vec<u32> {
        let mapped = self
            .chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.get().is_some());
        mapped
            .flat_map(|(i, _)| i * self.per_chunk..((i + 1) * self.per_chunk).min(self.capacity))
            .map(|tag| tag as u32)
            .filter(|&tag| self.contains(tag))
            .collect()
    }

    /// A chunk of slots: on huge pages when it fills one.
    fn map_chunk(&self) -> Region {
        let bytes = self.per_chunk * self.stride;
        if bytes * 2 > CHUNK_BYTES {
            Region::huge(bytes)
        } else {
            Region::new(bytes)
        }
    }

    /// Slot `tag` and its state, if `tag` is in range and its chunk is mapped.
    fn slot(&self, tag: u32) -> Option<(*mut T, &SlotState)> {
        let tag = tag as usize;
        if tag >= self.capacity {
            return None;
        }
        let chunk = self.chunks.get(tag / self.per_chunk)?.get()?;
        Some(self.slot_in(chunk, tag))
    }

    /// Slot `tag` in `chunk`, the chunk it is in.
    fn slot_in<'a>(&self, chunk: &'a Region, tag: usize) -> (*mut T, &'a SlotState) {
        let at = chunk
            .as_ptr()
            .wrapping_add(tag % self.per_chunk * self.stride);
        // SAFETY: `tag % per_chunk * stride + state_at` plus the state's size is within the
        // chunk, mapped for `per_chunk * stride` bytes and zero-filled, and aligned for the state
        // (the chunk is page-aligned, `stride` a multiple of 64 and `state_at` of the state's
        // alignment). A state is only ever accessed atomically, and lives as long as the chunk.
        let state = unsafe { &*at.wrapping_add(self.state_at).cast::<SlotState>() };
        (at.cast(), state)
    }

    /// Store the value `make` builds under `tag`. `make` runs in a frame of its own whose stack
    /// is wiped afterwards, and the value is moved into the slot leaving no copy behind, as
    /// [`crate::SecretBox::try_init`] does: for values that hold keys.
    #[inline(never)]
    pub fn insert_with<E>(
        &self,
        tag: u32,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<(), InsertError<E>> {
        let index = tag as usize;
        if index >= self.capacity {
            return Err(InsertError::OutOfRange);
        }
        let chunk = self.chunks[index / self.per_chunk].get_or_init(|| self.map_chunk());
        let (slot, state) = self.slot_in(chunk, index);
        state
            .state
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |s| {
                (s & (LIVE | BUSY) == 0).then_some(s | BUSY)
            })
            .map_err(|s| match s & LOADED {
                0 => InsertError::InUse,
                _ => InsertError::Exists,
            })?;
        #[inline(never)]
        fn below<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        let mut made = MaybeUninit::new(below(make));
        // SAFETY: just initialized.
        let stored = match unsafe { made.assume_init_ref() } {
            Ok(value) => {
                // SAFETY: this thread set the slot's `BUSY` bit on a slot without a value, so no
                // entry reads it and nothing else writes it; it is mapped, aligned for `T` (the
                // chunk is page-aligned and the stride a multiple of `T`'s alignment) and
                // `size_of::<T>()` bytes fit before the state. The value moves bitwise; the
                // original is a `MaybeUninit`, wiped next and never dropped.
                unsafe { slot.copy_from_nonoverlapping(value, 1) };
                Ok(())
            }
            // SAFETY: read out once; the `MaybeUninit` is not used as a value again.
            Err(_) => match unsafe { made.as_ptr().read() } {
                Err(e) => Err(e),
                Ok(_) => unreachable!("matched as an error"),
            },
        };
        // SAFETY: the `MaybeUninit`'s own bytes; nothing reads them as a value afterwards.
        unsafe {
            std::slice::from_raw_parts_mut(
                made.as_mut_ptr().cast::<u8>(),
                std::mem::size_of::<Result<T, E>>(),
            )
        }
        .zeroize();
        crate::scrub_stack_unless_deferred();
        if let Err(e) = stored {
            state.state.fetch_and(!BUSY, Ordering::Release);
            return Err(InsertError::Make(e));
        }
        self.loaded.fetch_add(1, Ordering::Relaxed);
        // Users counted meanwhile found the tag empty and count themselves out.
        state
            .state
            .fetch_xor(BUSY | LIVE | LOADED, Ordering::Release);
        Ok(())
    }

    /// Start fetching the slot of `tag` into the cache, for a [`SecretTable::get`] that follows
    /// other work: the fetch then overlaps that work instead of stalling the lookup's atomic
    /// update of the slot's state.
    pub fn prefetch(&self, tag: u32) {
        if let Some((slot, _)) = self.slot(tag) {
            prefetch(slot.cast(), self.stride);
        }
    }

    /// The value under `tag`, kept alive while the entry exists. Its bytes are prefetched
    /// before its state is touched, so that the two come from memory together.
    pub fn get(&self, tag: u32) -> Option<Entry<'_, T>> {
        let (slot, state) = self.slot(tag)?;
        prefetch(slot.cast(), self.stride);
        let entry = Entry {
            table: self,
            slot,
            state,
        };
        if state.state.fetch_add(1, Ordering::Acquire) & LOADED == 0 {
            // Dropping the entry counts this lookup out (and drops an evicted value if it was
            // the last user).
            drop(entry);
            return None;
        }
        Some(entry)
    }

    /// Take the value under `tag` out: it is dropped now, or when the last entry for it goes.
    /// False if there was none.
    pub fn evict(&self, tag: u32) -> bool {
        self.evict_counting(tag).is_some()
    }

    /// [`SecretTable::evict`], returning the slot's state and its drop count before.
    fn evict_counting(&self, tag: u32) -> Option<(&SlotState, *mut T, u32)> {
        let (slot, state) = self.slot(tag)?;
        // Read before the value can be dropped: no drop happens while `LOADED` is set.
        let drops = state.drops.load(Ordering::Acquire);
        let before = state.state.fetch_and(!LOADED, Ordering::AcqRel);
        if before & LOADED == 0 {
            return None;
        }
        self.loaded.fetch_sub(1, Ordering::Relaxed);
        if before & USERS == 0 {
            self.drop_if_unused(slot, state);
        }
        Some((state, slot, drops))
    }

    /// Evict the value under `tag` and wait, up to `wait`, until it is dropped. `Ok(false)` if
    /// there was none; `Err(())` if entries still hold it after `wait` (it is dropped when they
    /// go).
    #[allow(clippy::result_unit_err)]
    pub fn destroy(&self, tag: u32, wait: Duration) -> Result<bool, ()> {
        let Some((state, _, drops)) = self.evict_counting(tag) else {
            return Ok(false);
        };
        let start = Instant::now();
        while state.drops.load(Ordering::Acquire) == drops {
            if start.elapsed() >= wait {
                return Err(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(true)
    }

    /// Drop the value in `slot` if it is evicted and nobody uses it, zeroize the slot and free
    /// it. Of the threads that may see it unused, only the one that sets `BUSY` drops it.
    fn drop_if_unused(&self, slot: *mut T, state: &SlotState) {
        if state
            .state
            .compare_exchange(LIVE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // SAFETY: the slot holds a value (it was `LIVE`) that no entry reads any more (none is
        // left, and none can be made: `LOADED` is clear), and this thread owns its bytes
        // (`BUSY`): it is dropped once, then its bytes are wiped.
        unsafe {
            std::ptr::drop_in_place(slot);
            std::slice::from_raw_parts_mut(slot.cast::<u8>(), std::mem::size_of::<T>()).zeroize();
        }
        state.drops.fetch_add(1, Ordering::Release);
        state.state.fetch_and(!BUSY, Ordering::Release);
    }
}

impl<T> Drop for SecretTable<T> {
    fn drop(&mut self) {
        // No entry outlives the table (they borrow it): every value still here is unused.
        for (i, chunk) in self.chunks.iter().enumerate() {
            let Some(chunk) = chunk.get() else { continue };
            for tag in i * self.per_chunk..((i + 1) * self.per_chunk).min(self.capacity) {
                let (slot, state) = self.slot_in(chunk, tag);
                if state.state.load(Ordering::Acquire) & LIVE != 0 {
                    // SAFETY: as in `drop_if_unused`, with `&mut self`; the chunks are
                    // zeroized when unmapped.
                    unsafe { std::ptr::drop_in_place(slot) };
                }
            }
        }
    }
}

impl<T> std::ops::Deref for Entry<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the entry counts as a user of its slot, which was `LOADED` when it counted
        // itself in, so the value stays there until it goes.
        unsafe { &*self.slot }
    }
}

impl<T> Drop for Entry<'_, T> {
    fn drop(&mut self) {
        let before = self.state.state.fetch_sub(1, Ordering::AcqRel);
        // The last user of an evicted value drops it.
        if before & USERS == 1 && before & (LOADED | LIVE) == LIVE {
            self.table.drop_if_unused(self.slot, self.state);
        }
    }
}

impl<T> std::fmt::Debug for SecretTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretTable")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

/// Ask for the `len` bytes at `ptr` to be brought into the cache: a hint that never faults,
/// whatever the address (a slot about to be used, or a source about to be read from memory).
#[inline]
pub fn prefetch(ptr: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..len).step_by(64) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is part of
        // x86-64.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                ptr.wrapping_add(line).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Counts its drops.
    struct Counted(u64, Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counted(v: u64, drops: &Arc<AtomicUsize>) -> Result<Counted, ()> {
        Ok(Counted(v, Arc::clone(drops)))
    }

    #[test]
    fn insert_get_evict_destroy() {
        let drops = Arc::new(AtomicUsize::new(0));
        // Tags spread over the first of two chunks (32,768 slots of 64 bytes each).
        let t = SecretTable::<Counted>::new(20_000);
        let stored: Vec<u32> = (0..10_000).step_by(7).collect();
        for &tag in &stored {
            t.insert_with(tag, || counted(u64::from(tag), &drops))
                .unwrap();
        }
        assert_eq!(t.len(), stored.len());
        assert_eq!(t.tags(), stored);
        assert!(t.contains(7) && !t.contains(8) && !t.contains(19_999) && !t.contains(20_000));
        assert!(t.get(8).is_none() && t.get(15_000).is_none() && t.get(u32::MAX).is_none());
        assert!(matches!(
            t.insert_with(20_000, || counted(0, &drops)),
            Err(InsertError::OutOfRange)
        ));
        assert!(matches!(
            t.insert_with(7, || counted(0, &drops)),
            Err(InsertError::Exists)
        ));
        for &tag in &stored {
            assert_eq!(t.get(tag).unwrap().0, u64::from(tag));
        }
        // Evicted while held: dropped when the entry goes, not before; the tag takes no new value
        // until then.
        let held = t.get(7).unwrap();
        assert!(t.evict(7));
        assert!(!t.evict(7));
        assert!(t.get(7).is_none());
        assert!(matches!(
            t.insert_with(7, || counted(0, &drops)),
            Err(InsertError::InUse)
        ));
        assert_eq!(held.0, 7);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(held);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        // The slot is free again, and a failed build leaves it free.
        assert!(matches!(
            t.insert_with(7, || Err::<Counted, _>("no")),
            Err(InsertError::Make("no"))
        ));
        assert!(!t.contains(7));
        t.insert_with(7, || counted(1000, &drops)).unwrap();
        assert_eq!(t.get(7).unwrap().0, 1000);
        // Destroy waits for entries, then returns with the value dropped.
        let held = t.get(14).unwrap();
        assert_eq!(t.destroy(14, Duration::from_millis(20)), Err(()));
        drop(held);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        assert_eq!(t.destroy(21, Duration::from_secs(1)), Ok(true));
        assert_eq!(t.destroy(21, Duration::from_secs(1)), Ok(false));
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        assert_eq!(t.tags().len(), stored.len() - 2);
        assert_eq!(t.len(), stored.len() - 2);
        drop(t);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            stored.len() + 1,
            "every value dropped once"
        );
    }

    /// A value's bytes are zeroized when it is dropped from its slot.
    #[test]
    fn a_dropped_value_leaves_zeroes() {
        let t = SecretTable::<[u64; 4]>::new(4);
        t.insert_with(2, || Ok::<_, ()>([u64::MAX; 4])).unwrap();
        let entry = t.get(2).unwrap();
        let at = &*entry as *const [u64; 4];
        drop(entry);
        assert!(t.evict(2));
        // SAFETY: the slot stays mapped while the table lives; read as plain bytes.
        assert_eq!(unsafe { at.read_volatile() }, [0; 4]);
    }

    /// A large table's slots sit in 2 MiB chunks asked to be huge pages, locked and left out of
    /// core dumps; a small table's in a chunk of its own size.
    #[test]
    fn large_tables_sit_on_huge_pages() {
        let t = SecretTable::<[u64; 120]>::new(65_536);
        t.insert_with(40_000, || Ok::<_, ()>([7; 120])).unwrap();
        let at = &*t.get(40_000).unwrap() as *const _ as usize;
        let (_, flags) = crate::tests::mapping_of(at);
        let flags: Vec<&str> = flags.split_whitespace().collect();
        assert!(flags.contains(&"dd"), "{flags:?}");
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            assert!(flags.contains(&"hg"), "{flags:?}");
        }
        // 960 bytes and the state make a 1 KiB slot: 40,000 is slot 1,088 of chunk 19.
        assert_eq!(at % (2 << 20), 1088 * 1024);
        let small = SecretTable::<[u64; 120]>::new(3);
        small.insert_with(2, || Ok::<_, ()>([7; 120])).unwrap();
        let at = &*small.get(2).unwrap() as *const _ as usize;
        assert!(!crate::tests::mapping_of(at).1.contains("hg"));
    }

    #[test]
    fn concurrent_gets_and_evictions_drop_each_value_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let t = Arc::new(SecretTable::<Counted>::new(64));
        let rounds = 2000u64;
        let readers: Vec<_> = (0..3)
            .map(|r| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    let mut seen = 0u64;
                    for i in 0..rounds * 4 {
                        if let Some(e) = t.get(((i + r) % 8) as u32) {
                            // A value read under its tag is the one stored under it.
                            assert_eq!(e.0 % 8, (i + r) % 8);
                            seen += 1;
                        }
                    }
                    seen
                })
            })
            .collect();
        for i in 0..rounds {
            let tag = (i % 8) as u32;
            let _ = t.insert_with(tag, || counted(i - i % 8 + u64::from(tag), &drops));
            if i % 3 == 0 {
                t.evict(tag);
            }
        }
        for r in readers {
            r.join().unwrap();
        }
        let left = t.len();
        let made = drops.load(Ordering::SeqCst) + left;
        drop(t);
        assert_eq!(drops.load(Ordering::SeqCst), made);
    }
}
