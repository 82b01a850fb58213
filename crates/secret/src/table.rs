//! A table of secret values of one type under 32-bit tags, in secret memory and flat: a value
//! sits in a slot of a chunk of slots, so that finding it costs a lookup in a small map and no
//! chain of pointers (Key Per I/O tables of 65,536 keys, each request under a key of its own).
//!
//! A value stays alive while [`Entry`]s for it exist. [`SecretTable::evict`] takes the tag out at
//! once; the value is dropped (and its slot zeroized) when the last entry for it goes, by
//! whichever of the two comes last. Each slot's state is one atomic word: a "loaded" bit and the
//! count of entries. An entry is made only under the map's read lock from a tag the map holds,
//! and a tag leaves the map under its write lock before the bit is cleared, so a slot whose bit
//! is clear gets no new entries: the holder that sees the count reach zero with the bit clear is
//! the last, and only it drops the value.
//!
//! Chunks of slots are mapped when first needed, so a table sized for millions of keys costs
//! memory only for the keys loaded.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use zeroize::Zeroize;

use crate::region::Region;

/// Slots per chunk of secret memory.
const CHUNK: usize = 256;
/// The slot's value is loaded (its tag is in the map).
const LOADED: u32 = 1 << 31;

/// Why [`SecretTable::insert_with`] stored nothing.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InsertError<E> {
    /// A value is stored under the tag already.
    Exists,
    /// Every slot is taken.
    Full,
    /// The value could not be made.
    Make(E),
}

/// Hashes a tag with one multiplication (Fibonacci hashing): tags are chosen by the host, not
/// by an attacker of the map, and SipHash would cost a tenth of a small request.
#[derive(Clone, Copy, Default)]
struct TagHash;

/// The hasher of [`TagHash`].
#[derive(Default)]
struct TagHasher(u64);

impl std::hash::BuildHasher for TagHash {
    type Hasher = TagHasher;
    fn build_hasher(&self) -> TagHasher {
        TagHasher(0)
    }
}

impl std::hash::Hasher for TagHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 << 8 | u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        // The hash table takes the top bits for the group and the low ones for the bucket.
        self.0 = (n ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Secret values under tags; see the module docs.
pub struct SecretTable<T> {
    chunks: Box<[OnceLock<Region>]>,
    states: Box<[AtomicU32]>,
    /// Bumped each time a slot's value is dropped (for [`SecretTable::destroy`]).
    drops: Box<[AtomicU64]>,
    /// Bytes per slot: a whole number of cache lines, aligned for `T`.
    stride: usize,
    map: RwLock<HashMap<u32, u32, TagHash>>,
    /// Slots of mapped chunks that hold nothing, and how many slots are mapped.
    free: Mutex<(Vec<u32>, usize)>,
    value: PhantomData<T>,
}

// SAFETY: the table owns its `T`s as a `Vec<T>` would, and hands out `&T` to any thread.
unsafe impl<T: Send + Sync> Send for SecretTable<T> {}
// SAFETY: as above: shared access only gives `&T`; slots are written only by the one thread that
// owns them (a free slot taken from the list, or the last holder of a cleared one).
unsafe impl<T: Send + Sync> Sync for SecretTable<T> {}

/// A value of a [`SecretTable`], kept alive while this exists.
pub struct Entry<'a, T> {
    table: &'a SecretTable<T>,
    slot: u32,
}

impl<T> SecretTable<T> {
    /// A table for up to `capacity` values.
    pub fn new(capacity: usize) -> Self {
        assert!(
            std::mem::align_of::<T>() <= 4096,
            "no type is aligned beyond a page"
        );
        let stride = std::mem::size_of::<T>()
            .max(1)
            .next_multiple_of(std::mem::align_of::<T>().max(64));
        SecretTable {
            chunks: (0..capacity.div_ceil(CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
            states: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            drops: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            stride,
            map: RwLock::default(),
            free: Mutex::new((Vec::new(), 0)),
            value: PhantomData,
        }
    }

    /// Values the table can hold.
    pub fn capacity(&self) -> usize {
        self.states.len()
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.read_map().len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a value is stored under `tag`.
    pub fn contains(&self, tag: u32) -> bool {
        self.read_map().contains_key(&tag)
    }

    /// The tags stored, in ascending order.
    pub fn tags(&self) -> Vec<u32> {
        let mut tags: Vec<u32> = self.read_map().keys().copied().collect();
        tags.sort_unstable();
        tags
    }

    fn read_map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u32, u32, TagHash>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_map(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<u32, u32, TagHash>> {
        self.map.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where slot `slot` is (its chunk is mapped).
    fn slot_ptr(&self, slot: u32) -> *mut T {
        let slot = slot as usize;
        let chunk = self.chunks[slot / CHUNK]
            .get()
            .expect("a slot in use is in a mapped chunk");
        // `slot % CHUNK * stride` is within the chunk, mapped for `CHUNK * stride` bytes.
        chunk
            .as_ptr()
            .wrapping_add(slot % CHUNK * self.stride)
            .cast()
    }

    /// A slot that holds nothing, mapping a new chunk when needed; `None` when full.
    fn take_slot(&self) -> Option<u32> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.0.is_empty() && free.1 < self.capacity() {
            let first = free.1;
            let n = CHUNK.min(self.capacity() - first);
            let _ = self.chunks[first / CHUNK].set(Region::new(CHUNK * self.stride));
            free.0.extend((first..first + n).rev().map(|s| s as u32));
            free.1 += n;
        }
        free.0.pop()
    }

    fn give_back(&self, slot: u32) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        free.0.push(slot);
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
        if self.contains(tag) {
            return Err(InsertError::Exists);
        }
        let slot = self.take_slot().ok_or(InsertError::Full)?;
        #[inline(never)]
        fn below<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        let mut made = MaybeUninit::new(below(make));
        // SAFETY: just initialized.
        let stored = match unsafe { made.assume_init_ref() } {
            Ok(value) => {
                // SAFETY: the slot is free (taken from the list), so no entry reads it and no
                // value lives there; it is mapped, aligned for `T` (the chunk is page-aligned and
                // the stride a multiple of `T`'s alignment) and `size_of::<T>()` fits the
                // stride. The value moves bitwise; the original is a `MaybeUninit`, wiped next
                // and never dropped.
                unsafe { self.slot_ptr(slot).copy_from_nonoverlapping(value, 1) };
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
            self.give_back(slot);
            return Err(InsertError::Make(e));
        }
        let mut map = self.write_map();
        if map.contains_key(&tag) {
            drop(map);
            self.drop_value(slot);
            return Err(InsertError::Exists);
        }
        map.insert(tag, slot);
        self.states[slot as usize].store(LOADED, Ordering::Release);
        Ok(())
    }

    /// The value under `tag`, kept alive while the entry exists. Its bytes are prefetched:
    /// the caller's own work (reading the data) overlaps their way from memory.
    pub fn get(&self, tag: u32) -> Option<Entry<'_, T>> {
        let slot = {
            let map = self.read_map();
            let slot = *map.get(&tag)?;
            self.states[slot as usize].fetch_add(1, Ordering::Acquire);
            slot
        };
        prefetch(self.slot_ptr(slot).cast(), self.stride);
        Some(Entry { table: self, slot })
    }

    /// Take the value under `tag` out: it is dropped now, or when the last entry for it goes.
    /// False if there was none.
    pub fn evict(&self, tag: u32) -> bool {
        self.evict_slot(tag).is_some()
    }

    /// [`SecretTable::evict`], returning the slot and its drop count before.
    fn evict_slot(&self, tag: u32) -> Option<(u32, u64)> {
        let (slot, drops, before) = {
            let mut map = self.write_map();
            let slot = map.remove(&tag)?;
            let drops = self.drops[slot as usize].load(Ordering::Acquire);
            let before = self.states[slot as usize].fetch_and(!LOADED, Ordering::AcqRel);
            (slot, drops, before)
        };
        if before & !LOADED == 0 {
            self.drop_value(slot);
        }
        Some((slot, drops))
    }

    /// Evict the value under `tag` and wait, up to `wait`, until it is dropped. `Ok(false)` if
    /// there was none; `Err(())` if entries still hold it after `wait` (it is dropped when they
    /// go).
    #[allow(clippy::result_unit_err)]
    pub fn destroy(&self, tag: u32, wait: Duration) -> Result<bool, ()> {
        let Some((slot, drops)) = self.evict_slot(tag) else {
            return Ok(false);
        };
        let start = Instant::now();
        while self.drops[slot as usize].load(Ordering::Acquire) == drops {
            if start.elapsed() >= wait {
                return Err(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(true)
    }

    /// Drop the value in `slot`, zeroize the slot and free it. Only for the one owner of the
    /// slot: the last holder after an eviction, or an insertion that lost its tag.
    fn drop_value(&self, slot: u32) {
        let ptr = self.slot_ptr(slot);
        // SAFETY: the slot holds a value (written by `insert_with`), that no entry reads any more
        // (none is left, and none can be made: its tag is out of the map); it is dropped once,
        // then its bytes are wiped and the slot freed.
        unsafe {
            std::ptr::drop_in_place(ptr);
            std::slice::from_raw_parts_mut(ptr.cast::<u8>(), self.stride).zeroize();
        }
        self.drops[slot as usize].fetch_add(1, Ordering::Release);
        self.give_back(slot);
    }
}

impl<T> Drop for SecretTable<T> {
    fn drop(&mut self) {
        // No entry outlives the table (they borrow it): every stored value is in the map.
        let slots: Vec<u32> = self.write_map().drain().map(|(_, s)| s).collect();
        for slot in slots {
            // SAFETY: as in `drop_value`, with `&mut self`; the chunks are zeroized when unmapped.
            unsafe { std::ptr::drop_in_place(self.slot_ptr(slot)) };
        }
    }
}

impl<T> std::ops::Deref for Entry<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the entry counts as a user of its slot, so the value stays there until it goes.
        unsafe { &*self.table.slot_ptr(self.slot) }
    }
}

impl<T> Drop for Entry<'_, T> {
    fn drop(&mut self) {
        let before = self.table.states[self.slot as usize].fetch_sub(1, Ordering::AcqRel);
        // The last user of an evicted value drops it.
        if before == 1 {
            self.table.drop_value(self.slot);
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

/// Ask for the `len` bytes at `ptr` to be brought into the cache (a hint; never faults).
#[inline]
fn prefetch(ptr: *const u8, len: usize) {
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
        let t = SecretTable::<Counted>::new(600);
        for tag in 0..600u32 {
            t.insert_with(tag * 7, || counted(u64::from(tag), &drops))
                .unwrap();
        }
        assert_eq!(t.len(), 600);
        assert!(matches!(
            t.insert_with(1, || counted(0, &drops)),
            Err(InsertError::Full)
        ));
        assert!(matches!(
            t.insert_with(7, || counted(0, &drops)),
            Err(InsertError::Exists)
        ));
        assert!(matches!(
            t.insert_with(1, || Err::<Counted, _>("no")),
            Err(InsertError::Full)
        ));
        for tag in 0..600u32 {
            assert_eq!(t.get(tag * 7).unwrap().0, u64::from(tag));
        }
        // Evicted while held: dropped when the entry goes, not before.
        let held = t.get(7).unwrap();
        assert!(t.evict(7));
        assert!(!t.evict(7));
        assert!(t.get(7).is_none());
        assert_eq!(held.0, 1);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(held);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        // Its slot is free again, and a failed build leaves it free.
        assert!(matches!(
            t.insert_with(1, || Err::<Counted, _>("no")),
            Err(InsertError::Make("no"))
        ));
        t.insert_with(1, || counted(1000, &drops)).unwrap();
        assert_eq!(t.get(1).unwrap().0, 1000);
        // Destroy waits for entries, then returns with the value dropped.
        let held = t.get(14).unwrap();
        assert_eq!(t.destroy(14, Duration::from_millis(20)), Err(()));
        drop(held);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        assert_eq!(t.destroy(21, Duration::from_secs(1)), Ok(true));
        assert_eq!(t.destroy(21, Duration::from_secs(1)), Ok(false));
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        assert_eq!(t.tags().len(), 598);
        drop(t);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            601,
            "every value dropped once"
        );
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
