//! Reads and writes of a file's cached data without a copy: the file mapped into memory (for
//! writing too where it is open for writing), and a range lent to the caller only when every
//! page of it is in the page cache (`mincore`).
//!
//! Why: a read of cached data through `pread` copies it from the page cache into the caller's
//! buffer, and a volume then decrypts that buffer in place: the data crosses memory three times.
//! Decrypting straight from the mapped page cache into the reply crosses it once, and saves the
//! system call (for 128 KiB reads through NBD, about the cipher's whole cost:
//! `docs/BENCHMARKS.md`). Writes are the mirror image: encrypting the received plaintext
//! straight into the mapped page cache saves `pwrite`'s copy and system call. Only ciphertext
//! is ever stored there (the cipher's `process_from` promises it), and a write through the
//! mapping reaches the disk as a `pwrite` would: the page is dirty in the same cache, and
//! `fdatasync` writes it back (a clean page is mapped write-protected, so the first store after
//! writeback faults and marks it dirty again).
//!
//! The hazard of a mapping is `SIGBUS`: a page that leaves the cache between the check and the
//! access and then fails to read back, a store the file system cannot find space for, or a file
//! that another process truncates (locks are advisory). A process-wide handler, installed with
//! the first mapping, looks the faulting address up in a fixed table of the live mappings. For
//! an address in one it counts the fault and maps an anonymous zero page over the faulting page
//! (`mmap` is async-signal-safe), so that the access completes, reading zeros or storing into
//! nothing; any other fault goes on to the handler that was there before. A borrower checks the
//! count after using the bytes: a fault throws the work away and the caller reads or writes
//! again through `pread` or `pwrite`, which reports the real error (a write's pages that did
//! reach the file are written again). A mapping that once faulted is never lent again (its
//! zero pages no longer show the file). The handler interrupts a cipher kernel, whose registers
//! (round keys) the kernel saves where the handler runs (the thread's alternate stack) and leaves
//! there: it notes that it ran, and the cipher's wipe after the calls, or the lend itself,
//! zeroes that frame (`sectorcrypt_secret::signals::clear_after_handlers`).
//!
//! A page evicted between the check and the access but readable is only read back in (the
//! caller waits, as `pread` would have). Bytes lent while another thread writes the same range
//! may be old or new or a mix, as a `pread` racing that write returns; two writes of one range
//! leave either or a mix, as racing `pwrite`s may. The lent bytes are memory that any process
//! with the file open can change at any moment, and the cipher kernels treat them so: they read
//! each byte of a source once and store each byte of a destination once, never reading it back.

use std::ffi::c_void;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Live mappings the fault handler can tell apart; a file opened while all are taken is read
/// through `pread` only.
const SLOTS: usize = 64;

/// Pages one `mincore` call checks (its result lives on the stack).
const CHECK_PAGES: usize = 256;

/// One live mapping, as the fault handler sees it: plain atomics, read without locks.
struct Slot {
    taken: AtomicBool,
    /// Whether the mapping may be stored to (its zero pages must be too).
    writable: AtomicBool,
    start: AtomicUsize,
    /// 0 while the slot is being filled or emptied: the handler matches no address then.
    len: AtomicUsize,
    faults: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // only as the array's initializer
const FREE: Slot = Slot {
    taken: AtomicBool::new(false),
    writable: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faults: AtomicU64::new(0),
};

static SLOTS_IN_USE: [Slot; SLOTS] = [FREE; SLOTS];

/// The `SIGBUS` action that was installed before ours, for faults outside every mapping.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

static INSTALL: Once = Once::new();

/// A file's first `len` bytes mapped, registered with the fault handler.
pub(crate) struct Mapping {
    at: NonNull<u8>,
    len: usize,
    slot: &'static Slot,
    page: usize,
    writable: bool,
}

// SAFETY: the mapping is shared memory owned by this value; every access goes through `lend` or
// `lend_mut`, whose borrows end with the call.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping").field("len", &self.len).finish()
    }
}

impl Mapping {
    /// `file`'s first `len` bytes, mapped for reading, and for writing too if `writable` and
    /// the file allows it (`None`: empty, too large for the address space, every slot taken, or
    /// the handler could not be installed).
    pub(crate) fn new(file: &File, len: u64, writable: bool) -> Option<Mapping> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        if !install_handler() {
            return None;
        }
        let slot = SLOTS_IN_USE.iter().find(|s| {
            s.taken
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })?;
        let map = |prot| {
            // SAFETY: a fresh shared mapping of an open file; the kernel chooses the address,
            // so nothing of ours is replaced.
            unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    prot,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            }
        };
        // A file open for writing whose file system refuses shared writable mappings still
        // lends its reads.
        let (at, writable) = match writable.then(|| map(libc::PROT_READ | libc::PROT_WRITE)) {
            Some(at) if at != libc::MAP_FAILED => (at, true),
            _ => (map(libc::PROT_READ), false),
        };
        let Some(at) = NonNull::new(at.cast::<u8>()).filter(|_| at != libc::MAP_FAILED) else {
            slot.taken.store(false, Ordering::Release);
            return None;
        };
        slot.faults.store(0, Ordering::Relaxed);
        slot.writable.store(writable, Ordering::Relaxed);
        slot.start.store(at.as_ptr() as usize, Ordering::Relaxed);
        // Last: from here on the handler matches addresses in the mapping.
        slot.len.store(len, Ordering::Release);
        Some(Mapping {
            at,
            len,
            slot,
            page: rustix::param::page_size(),
            writable,
        })
    }

    /// Hand `each` the `len` mapped bytes at `offset` if every page of them is in the page
    /// cache: `false` without calling it when one is not (or the range is not mapped), and
    /// `false` after calling it when a page could not be read meanwhile (its bytes were zeros:
    /// the caller throws its work away).
    pub(crate) fn lend(&self, offset: u64, len: usize, each: &mut dyn FnMut(&[u8])) -> bool {
        self.lend_at(offset, len, &mut |at| {
            // SAFETY: `lend_at` hands over `len` mapped bytes, readable until it returns.
            each(unsafe { std::slice::from_raw_parts(at, len) })
        })
    }

    /// [`Mapping::lend`] for storing into: `each` gets the `len` mapped bytes at `offset` to
    /// overwrite, all of them (`false` without calling it also when the mapping is read-only;
    /// `false` after calling it when a page could not be written meanwhile: the caller writes
    /// the whole range again another way).
    pub(crate) fn lend_mut(
        &self,
        offset: u64,
        len: usize,
        each: &mut dyn FnMut(&mut [u8]),
    ) -> bool {
        self.writable
            && self.lend_at(offset, len, &mut |at| {
                // SAFETY: `lend_at` hands over `len` mapped bytes, writable in a writable
                // mapping until it returns; no other borrow of them exists in this process but
                // a racing request's, which the module docs cover.
                each(unsafe { std::slice::from_raw_parts_mut(at, len) })
            })
    }

    /// The address of the `len` mapped bytes at `offset`, for `each`, under [`Mapping::lend`]'s
    /// checks and answer.
    fn lend_at(&self, offset: u64, len: usize, each: &mut dyn FnMut(*mut u8)) -> bool {
        let Some(start) = usize::try_from(offset)
            .ok()
            .filter(|&o| o.checked_add(len).is_some_and(|end| end <= self.len) && len > 0)
        else {
            return false;
        };
        if self.slot.faults.load(Ordering::Acquire) != 0 || !self.resident(start, len) {
            return false;
        }
        // SAFETY: `start + len` lies within the mapping, which lives as long as `self`; pages
        // that fail meanwhile become zero pages (the handler) rather than a fault.
        each(unsafe { self.at.as_ptr().add(start) });
        // The handler counts before it maps the zero page that `each` may have used.
        fence(Ordering::SeqCst);
        let clean = self.slot.faults.load(Ordering::Acquire) == 0;
        if !clean {
            // The handler may have run on this thread in the middle of `each`'s cipher call:
            // the registers the kernel saved for it (round keys) are still where it ran. (The
            // cipher's wipe does the same on its worker threads.)
            sectorcrypt_secret::signals::clear_after_handlers();
        }
        clean
    }

    /// Whether every page of `len` bytes at `start` is in the page cache.
    fn resident(&self, start: usize, len: usize) -> bool {
        let first = start / self.page * self.page;
        let end = start + len;
        let mut vec = [0u8; CHECK_PAGES];
        let mut at = first;
        while at < end {
            let span = (end - at).min(CHECK_PAGES * self.page);
            let pages = span.div_ceil(self.page);
            // SAFETY: `at .. at + span` lies within the mapping (whole pages of it: the
            // mapping's last page is whole in the address space), and `vec` has a byte for
            // each of its pages.
            let r = unsafe {
                libc::mincore(
                    self.at.as_ptr().add(at).cast::<c_void>(),
                    span,
                    vec.as_mut_ptr(),
                )
            };
            if r != 0 || vec[..pages].iter().any(|v| v & 1 == 0) {
                return false;
            }
            at += span;
        }
        true
    }

    /// How many faults the handler has caught in this mapping (tests).
    #[cfg(test)]
    pub(crate) fn faults(&self) -> u64 {
        self.slot.faults.load(Ordering::Acquire)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // The handler stops matching before the memory goes.
        self.slot.len.store(0, Ordering::Release);
        // SAFETY: the mapping made in `new`, whose bytes nobody borrows any more (`lend`'s
        // borrow ends with its call).
        unsafe { libc::munmap(self.at.as_ptr().cast(), self.len) };
        self.slot.start.store(0, Ordering::Relaxed);
        self.slot.taken.store(false, Ordering::Release);
    }
}

/// Install the `SIGBUS` handler once; `false` if it could not be.
fn install_handler() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed `sigaction` is a valid empty one; the handler is async-signal-safe
        // (atomics, `mmap`, `sigaction`, and the previous handler).
        unsafe {
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_sigbus as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&raw mut ours.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &ours, &mut previous) == 0 {
                let _ = PREVIOUS.set(previous);
            }
        }
    });
    PREVIOUS.get().is_some()
}

/// The `SIGBUS` handler: a fault inside a live mapping becomes a zero page and a count; any
/// other goes to the previous handler (or, with none, to the default action: the fault
/// happens again on return, with `SIGBUS`'s default action in place).
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: the kernel hands a valid `siginfo_t` to an `SA_SIGINFO` handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let page = rustix::param::page_size();
    // Only faults the kernel raised (a positive code; `kill` sends others) name an address.
    for slot in SLOTS_IN_USE.iter().filter(|_| code > 0) {
        let len = slot.len.load(Ordering::Acquire);
        let start = slot.start.load(Ordering::Relaxed);
        if len == 0 || addr < start || addr - start >= len {
            continue;
        }
        slot.faults.fetch_add(1, Ordering::SeqCst);
        // Registers saved for this handler may hold a cipher kernel's keys.
        sectorcrypt_secret::signals::note_handler_ran();
        let at = addr / page * page;
        let prot = if slot.writable.load(Ordering::Relaxed) {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: replaces one page of our own mapping, as accessible as the mapping was; what
        // is stored into it is thrown away.
        let zero = unsafe {
            libc::mmap(
                at as *mut c_void,
                page,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zero != libc::MAP_FAILED {
            return;
        }
        break;
    }
    let Some(previous) = PREVIOUS.get() else {
        return;
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restoring the default action is async-signal-safe; the faulting access runs
        // again on return and takes it.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
        }
    } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with `SA_SIGINFO`: this is its type.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(handler) };
        f(signal, info, context);
    } else {
        // SAFETY: a plain handler, installed without `SA_SIGINFO`.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scratch(name: &str, bytes: &[u8]) -> (std::path::PathBuf, File) {
        let dir =
            std::env::temp_dir().join(format!("sectorcrypt-mapped-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("file");
        let mut f = File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        (
            dir,
            File::options().read(true).write(true).open(&path).unwrap(),
        )
    }

    #[test]
    fn lends_cached_bytes_and_refuses_outside_the_mapping() {
        let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 + 3) as u8).collect();
        let (dir, f) = scratch("lend", &data);
        let m = Mapping::new(&f, data.len() as u64, false).unwrap();
        let mut seen = Vec::new();
        assert!(m.lend(4096 + 5, 9000, &mut |b| seen = b.to_vec()));
        assert_eq!(seen, data[4096 + 5..4096 + 5 + 9000]);
        assert!(!m.lend(60 * 1024, 8 * 1024, &mut |_| panic!("past the end lent")));
        assert!(!m.lend(0, 0, &mut |_| panic!("nothing lent")));
        drop(m);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A file truncated under its mapping: the access that faults reads zeros, the lend says
    /// `false`, and the mapping is never lent again; the process lives on.
    #[test]
    fn a_fault_in_the_mapping_is_caught_and_refused() {
        let data = vec![0xa5u8; 4 * 4096];
        let (dir, f) = scratch("fault", &data);
        let m = Mapping::new(&f, data.len() as u64, false).unwrap();
        assert!(m.lend(0, 4096, &mut |b| assert_eq!(b[0], 0xa5)));
        // Pages stay resident in the mapping's view until the kernel drops them with the
        // truncation; a lend past the new end then faults on access, or is refused by
        // `mincore`: force the access by reading the bytes without the residency check.
        f.set_len(4096).unwrap();
        // SAFETY: inside the mapping; the fault is what the test is about.
        let byte = unsafe { std::ptr::read_volatile(m.at.as_ptr().add(2 * 4096)) };
        assert_eq!(byte, 0, "the faulting page reads as zeros");
        assert_eq!(m.faults(), 1);
        assert!(!m.lend(0, 4096, &mut |_| panic!("a mapping that faulted lent")));
        drop(m);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A store into a page that faults (the file truncated under its mapping) lands in a zero
    /// page of the process's own instead of killing it; the lend says `false`, and neither
    /// reads nor writes are lent again.
    #[test]
    fn a_store_that_faults_is_caught_and_refused() {
        let data = vec![0xa5u8; 4 * 4096];
        let (dir, f) = scratch("store-fault", &data);
        let m = Mapping::new(&f, data.len() as u64, true).unwrap();
        assert!(m.lend_mut(0, 8192, &mut |b| b.fill(0x3c)));
        f.set_len(4096).unwrap();
        // Past the new end: the store runs without the residency check, as one racing the
        // truncation would.
        let mut ran = false;
        let stored = m.lend_at(8192, 8192, &mut |at| {
            // SAFETY: inside the mapping; the fault is what the test is about.
            unsafe { std::ptr::write_bytes(at, 0x77, 8192) };
            ran = true;
        });
        assert!(ran && !stored, "the store ran and was refused");
        assert!(m.faults() >= 1);
        assert!(!m.lend_mut(0, 4096, &mut |_| panic!("a mapping that faulted lent")));
        assert!(!m.lend(0, 4096, &mut |_| panic!("a mapping that faulted lent")));
        drop(m);
        let mut first = [0u8; 4096];
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut first, 0).unwrap();
        assert_eq!(first, [0x3c; 4096], "stored before the fault: in the file");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Set in the child of `a_fault_outside_every_mapping_still_kills`.
    const FOREIGN: &str = "SECTORCRYPT_TEST_FOREIGN_SIGBUS";

    /// The handler passes faults in memory it does not know on: a process whose own mapping
    /// faults dies of `SIGBUS` as it would without us (here in a child process: this test binary
    /// run again on this test alone).
    #[test]
    fn a_fault_outside_every_mapping_still_kills() {
        if std::env::var_os(FOREIGN).is_some() {
            let (_dir, f) = scratch("foreign-child", &[1u8; 2 * 4096]);
            let ours = Mapping::new(&f, 2 * 4096, false).unwrap();
            // SAFETY: a fresh mapping of our own, outside the handler's table.
            let theirs = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    2 * 4096,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(theirs, libc::MAP_FAILED);
            f.set_len(0).unwrap();
            // SAFETY: inside the mapping; the fault is what the test is about.
            let byte = unsafe { std::ptr::read_volatile(theirs.cast::<u8>().add(4096)) };
            // Reached only if the fault was swallowed.
            println!("survived with {byte} and {} faults", ours.faults());
            std::process::exit(0);
        }
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "mapped::tests::a_fault_outside_every_mapping_still_kills",
            ])
            .env(FOREIGN, "1")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("the child neither died nor finished: a fault loops in the handler");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGBUS), "{status}");
    }
}
