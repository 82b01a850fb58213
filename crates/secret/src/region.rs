//! The one place that maps, locks and unmaps secret memory.
//!
//! Each region is its own anonymous mapping, rounded up to whole pages: `mlock` and
//! `MADV_DONTDUMP` work on pages, and a page shared with ordinary heap data would be locked or
//! left out of a core for the wrong reasons, or unlocked when that data is freed. Secrets are few
//! and small (a volume key, a passphrase, a cipher's round keys), so a page each is cheap.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use rustix::mm::{self, Advice, MapFlags, ProtFlags};
use zeroize::Zeroize;

/// The size of an x86-64 (and most arm64) huge page.
const HUGE_PAGE: usize = 2 << 20;
/// Bytes locked right now, by every live region.
static LOCKED: AtomicUsize = AtomicUsize::new(0);
/// Whether a lock has failed yet: the warning is given once per process.
static LOCK_FAILED: AtomicBool = AtomicBool::new(false);
/// Told the first time locking fails.
static ON_LOCK_FAILURE: OnceLock<fn(&io::Error)> = OnceLock::new();

pub(crate) fn locked_bytes() -> usize {
    LOCKED.load(Ordering::Relaxed)
}

pub(crate) fn on_lock_failure(warn: fn(&io::Error)) {
    let _ = ON_LOCK_FAILURE.set(warn);
}

/// Whole pages of anonymous memory, zero-filled, readable and writable, excluded from core dumps
/// and (when the limit allows) locked in RAM.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    /// Mapped length: a whole number of pages, 0 for an empty region (nothing mapped).
    len: usize,
    locked: bool,
}

// SAFETY: a region is plain memory owned by exactly one `Region`; access goes through `&self` /
// `&mut self`, so Rust's usual rules for the bytes apply across threads.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only hands out shared views of the bytes.
unsafe impl Sync for Region {}

impl Region {
    /// At least `size` bytes. Panics only when the address space is exhausted, as `Vec` does.
    pub(crate) fn new(size: usize) -> Region {
        Region::map(size, false)
    }

    /// At least `size` bytes (a whole number of 2 MiB), aligned to 2 MiB and asked to be backed by
    /// huge pages: for tables that requests reach at random, where a TLB miss per request would
    /// cost as much as the fetch itself. The kernel may still use small pages.
    pub(crate) fn huge(size: usize) -> Region {
        Region::map(size.next_multiple_of(HUGE_PAGE), true)
    }

    fn map(size: usize, huge: bool) -> Region {
        if size == 0 {
            return Region {
                ptr: NonNull::dangling(),
                len: 0,
                locked: false,
            };
        }
        let page = rustix::param::page_size();
        let len = size.div_ceil(page) * page;
        // Room to align a huge mapping, trimmed off again below.
        let spare = if huge { HUGE_PAGE } else { 0 };
        // SAFETY: a fresh private anonymous mapping at an address of the kernel's choosing
        // aliases nothing.
        let mapped = unsafe {
            mm::mmap_anonymous(
                std::ptr::null_mut(),
                len + spare,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .unwrap_or_else(|e| panic!("cannot map {len} bytes of secret memory: {e}"));
        let head = (mapped as usize).next_multiple_of(spare.max(1)) - mapped as usize;
        let ptr: *mut std::ffi::c_void = mapped.cast::<u8>().wrapping_add(head).cast();
        if huge {
            // SAFETY: the mapping's unaligned head and unused tail, both whole pages (the mapping
            // and `HUGE_PAGE` are page-aligned), untouched and owned by nothing else.
            unsafe {
                if head > 0 {
                    let _ = mm::munmap(mapped, head);
                }
                if spare > head {
                    let _ = mm::munmap(ptr.cast::<u8>().add(len).cast(), spare - head);
                }
            }
            // SAFETY: the region's own pages, not yet touched; advice does not change contents.
            // Without huge pages the region works as any other, so a refusal is not an error.
            let _ = unsafe { mm::madvise(ptr, len, Advice::LinuxHugepage) };
        }
        // SAFETY: `ptr..ptr+len` is the mapping just made, owned by this region alone. Neither
        // call changes its contents.
        let (dont_dump, lock) = unsafe {
            (
                mm::madvise(ptr, len, Advice::LinuxDontDump),
                mm::mlock(ptr, len),
            )
        };
        // MADV_DONTDUMP cannot fail on a private anonymous mapping of this process; if a kernel
        // ever refuses it, the secret would reach a core dump, so do not go on silently.
        dont_dump.unwrap_or_else(|e| panic!("cannot exclude secret memory from core dumps: {e}"));
        let locked = match lock {
            Ok(()) => {
                LOCKED.fetch_add(len, Ordering::Relaxed);
                true
            }
            Err(e) => {
                if !LOCK_FAILED.swap(true, Ordering::Relaxed) {
                    if let Some(warn) = ON_LOCK_FAILURE.get() {
                        warn(&io::Error::from(e));
                    }
                }
                false
            }
        };
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap never returns a null mapping");
        Region { ptr, len, locked }
    }

    /// The mapped length (whole pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` are mapped, initialized (zero-filled by the kernel, then
        // written only through `bytes_mut`) and owned by this region; for `len == 0` the pointer
        // is dangling but well aligned, which an empty slice allows.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // Zeroize before unmapping: the kernel would zero the pages before reusing them, but
        // until then they sit in the free pool, readable by anyone who can read physical memory.
        self.bytes_mut().zeroize();
        let ptr = self.ptr.as_ptr().cast();
        if self.locked {
            // SAFETY: the region's own mapping; unlocking does not touch its contents.
            let _ = unsafe { mm::munlock(ptr, self.len) };
            LOCKED.fetch_sub(self.len, Ordering::Relaxed);
        }
        // SAFETY: the region's own mapping, and no reference into it outlives `self`.
        let _ = unsafe { mm::munmap(ptr, self.len) };
    }
}

/// One value of type `T` in a region of its own; it never moves from there.
pub struct SecretBox<T> {
    region: Region,
    value: std::marker::PhantomData<T>,
}

impl<T> SecretBox<T> {
    /// A region for one `T`, holding none yet.
    fn region() -> Region {
        assert!(
            std::mem::align_of::<T>() <= rustix::param::page_size(),
            "no type is aligned beyond a page"
        );
        Region::new(std::mem::size_of::<T>().max(1))
    }

    /// Move `value` into secret memory. Where it was built (the stack) keeps a copy: use this for
    /// values that hold no secret yet, [`SecretBox::try_init`] for the others.
    pub fn new(value: T) -> SecretBox<T> {
        let region = Self::region();
        // SAFETY: the region is at least `size_of::<T>()` bytes, page-aligned (so aligned for
        // `T`), and holds no value yet.
        unsafe { region.as_ptr().cast::<T>().write(value) };
        SecretBox {
            region,
            value: std::marker::PhantomData,
        }
    }

    /// Build a value that holds a secret (a key schedule) and move it into secret memory,
    /// leaving no copy behind on the stack: the slot `make` returned it in is wiped, and so is
    /// the stack below, where `make` ran. `None` if `make` made nothing.
    ///
    /// Why this matters: stack bytes do not stay on the stack. A later `Box::new` of a padded
    /// value copies whatever its padding's stack bytes held into the heap, so a key schedule
    /// built on the stack can reach a core dump by way of an unrelated allocation.
    #[inline(never)]
    pub fn try_init(make: impl FnOnce() -> Option<T>) -> Option<SecretBox<T>> {
        // `make` runs in a frame of its own, below this one, so that its locals (the schedule
        // as it was built) are in the stack that `scrub_stack` wipes, not in this frame.
        #[inline(never)]
        fn below<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        let mut made = std::mem::MaybeUninit::new(below(make));
        // SAFETY: just initialized.
        let boxed = unsafe { made.assume_init_ref() }.as_ref().map(|value| {
            let region = Self::region();
            // SAFETY: as in `new`; the value is moved bitwise into the region, and the original
            // is never used, dropped or read as a `T` again (it is a `MaybeUninit`, wiped next).
            unsafe {
                region
                    .as_ptr()
                    .cast::<T>()
                    .copy_from_nonoverlapping(value, 1)
            };
            SecretBox {
                region,
                value: std::marker::PhantomData,
            }
        });
        // SAFETY: the `MaybeUninit`'s own bytes, all `size_of::<Option<T>>()` of them; nothing
        // reads them as a value afterwards.
        let slot = unsafe {
            std::slice::from_raw_parts_mut(
                made.as_mut_ptr().cast::<u8>(),
                std::mem::size_of::<Option<T>>(),
            )
        };
        slot.zeroize();
        crate::scrub_stack_unless_deferred();
        boxed
    }
}

impl<T> std::ops::Deref for SecretBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: `new` wrote a `T` there, and it lives until `drop`.
        unsafe { &*self.region.as_ptr().cast::<T>() }
    }
}

impl<T> std::ops::DerefMut for SecretBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { &mut *self.region.as_ptr().cast::<T>() }
    }
}

impl<T> Drop for SecretBox<T> {
    fn drop(&mut self) {
        // SAFETY: the value `new` wrote, dropped once; the region (zeroized and unmapped next)
        // is not read as a `T` again.
        unsafe { std::ptr::drop_in_place(self.region.as_ptr().cast::<T>()) };
    }
}

// SAFETY: a `SecretBox<T>` owns its `T` as a `Box<T>` does, so it may cross threads exactly when
// `T` may.
unsafe impl<T: Send> Send for SecretBox<T> {}
// SAFETY: as above, for shared references.
unsafe impl<T: Sync> Sync for SecretBox<T> {}

impl<T> std::fmt::Debug for SecretBox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretBox([REDACTED])")
    }
}
