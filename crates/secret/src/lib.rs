//! Memory for secrets: passphrases, volume keys, derived keys, key-table entries and the round-key
//! schedules of ciphers.
//!
//! Every secret lives in pages of its own that are
//! - locked in RAM (`mlock`), so they never reach swap: when the `RLIMIT_MEMLOCK` limit refuses,
//!   the secret is kept unlocked and the warning registered with [`on_lock_failure`] is given
//!   once, as cryptsetup does;
//! - left out of core dumps (`MADV_DONTDUMP`), which also keeps them out of `gcore`;
//! - zeroized, unlocked and unmapped on drop.
//!
//! Nothing is copied out of secret memory: a `SecretBytes` clones into a region of its own, a
//! `SecretBox` does not clone, and both print as `[REDACTED]`. [`SecretBytes`] is a byte string of fixed capacity (a key, a passphrase), and
//! [`SecretBox`] any value (a cipher's expanded keys). A process that holds keys also calls
//! [`forbid_core_dumps`], which makes it non-dumpable and so not attachable by a debugger of the
//! same user.
//!
//! Why not a global allocator that locks everything: Argon2's working memory (up to GiBs) is not a
//! key and would exhaust the lock limit, and I/O buffers would drown the few pages that matter.
//! Why a page per secret: locking and dump exclusion work on whole pages, and a handful of keys
//! per process makes that cheap.

// The crate's modules with `unsafe`: the mappings and the raw pointer into them, and the signal
// mask and the wait for signals.
#[allow(unsafe_code)]
mod region;
#[allow(unsafe_code)]
pub mod signals;
#[allow(unsafe_code)]
mod table;

use std::io::{self, Read};

use region::Region;
pub use region::SecretBox;
pub use table::{prefetch, Entry, InsertError, SecretTable};
use zeroize::Zeroize;

/// Bytes of secret memory locked in RAM right now (for `--verbose`).
pub fn locked_bytes() -> usize {
    region::locked_bytes()
}

/// Call `warn` the first time a secret cannot be locked (at most once per process).
pub fn on_lock_failure(warn: fn(&io::Error)) {
    region::on_lock_failure(warn);
}

/// Make this process non-dumpable (`PR_SET_DUMPABLE` 0): no core dump is written for it, and
/// other processes of the same user cannot attach to it or read its memory.
pub fn forbid_core_dumps() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(io::Error::from)
}

/// Overwrite the stack below the caller with zeros.
///
/// Values are built on the stack before they move into secret memory (a cipher's key schedule,
/// a hash state derived from the passphrase), and the stack is ordinary memory: call this after
/// unlocking, from a frame above the code that handled the keys, to wipe what their frames left.
#[inline(never)]
pub fn scrub_stack() {
    let mut stack = [0u8; 128 * 1024];
    stack.zeroize();
    std::hint::black_box(&stack);
    #[cfg(test)]
    tests::SCRUBS.with(|n| n.set(n.get() + 1));
}

std::thread_local! {
    /// Set inside [`scrubbing_once`]: secrets built on this thread leave the scrub to it.
    static DEFERRED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f`, in which many secrets are built (a table of thousands of keys), with one scrub of the
/// stack at its end instead of one per secret ([`SecretBox::try_init`] scrubs 128 KiB each time,
/// 75 µs a key: seconds for a table of 65,536). What the builds leave on the stack stays there
/// until `f` returns, overwritten by the next build meanwhile.
#[inline(never)]
pub fn scrubbing_once<R>(f: impl FnOnce() -> R) -> R {
    let (result, outer) = deferring(&DEFERRED, f);
    if !outer {
        scrub_stack();
    }
    result
}

/// Run `f` with `flag` set on this thread, in a frame of its own below the caller's, so that what
/// `f` leaves on the stack lies where a wipe made from the caller reaches; and whether `flag` was
/// set already (by a scope further up, which then does the cleanup). The scopes that defer a
/// cleanup to their end are built on it.
#[inline(always)]
pub fn deferring<R>(
    flag: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    f: impl FnOnce() -> R,
) -> (R, bool) {
    /// Puts the flag back even if `f` unwinds, so that a panic does not leave this thread
    /// deferring every later cleanup to a scope that has ended.
    struct Restore {
        flag: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
        outer: bool,
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            self.flag.with(|d| d.set(self.outer));
        }
    }
    #[inline(never)]
    fn below<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
    let outer = flag.with(|d| d.replace(true));
    let restore = Restore { flag, outer };
    let result = below(f);
    drop(restore);
    (result, outer)
}

/// Scrub the stack now unless a [`scrubbing_once`] further up will.
fn scrub_stack_unless_deferred() {
    if !DEFERRED.with(std::cell::Cell::get) {
        scrub_stack();
    }
}

/// A byte string in secret memory, with a fixed capacity (it moves to a new region, zeroizing
/// the old one, only if it must grow).
pub struct SecretBytes {
    region: Region,
    len: usize,
}

impl SecretBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> SecretBytes {
        SecretBytes {
            region: Region::new(len),
            len,
        }
    }

    /// Empty, with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> SecretBytes {
        SecretBytes {
            region: Region::new(capacity),
            len: 0,
        }
    }

    /// A copy of `bytes` (the caller zeroizes the original).
    pub fn from_slice(bytes: &[u8]) -> SecretBytes {
        let mut out = SecretBytes::zeroed(bytes.len());
        out.copy_from_slice(bytes);
        out
    }

    /// Read `source` to its end, at most `limit` bytes, straight into secret memory.
    pub fn read_from(mut source: impl Read, limit: usize) -> io::Result<SecretBytes> {
        let mut out = SecretBytes::with_capacity(limit.min(4096));
        loop {
            if out.len == out.region.len() {
                if out.len >= limit {
                    return Ok(out);
                }
                out.reserve(out.len.max(4096).min(limit - out.len));
            }
            let room = out.region.len().min(limit) - out.len;
            let start = out.len;
            match source.read(&mut out.region.bytes_mut()[start..start + room]) {
                Ok(0) => return Ok(out),
                Ok(n) => out.len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Append `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        self.region.bytes_mut()[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// Keep the first `len` bytes (zeroizing the rest).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.region.bytes_mut()[len..self.len].zeroize();
            self.len = len;
        }
    }

    /// Make the length `len`: longer with zeros, or shorter with the rest zeroized.
    pub fn resize(&mut self, len: usize) {
        if len > self.len {
            // Bytes past the length are always zero: fresh regions are, and `truncate` and
            // growing keep them so.
            self.reserve(len - self.len);
            self.len = len;
        } else {
            self.truncate(len);
        }
    }

    /// Make room for `more` bytes beyond the current length.
    fn reserve(&mut self, more: usize) {
        let needed = self.len.checked_add(more).expect("a secret fits in memory");
        if needed <= self.region.len() {
            return;
        }
        let mut grown = Region::new(needed.max(2 * self.region.len()));
        grown.bytes_mut()[..self.len].copy_from_slice(&self.region.bytes()[..self.len]);
        // The old region is zeroized as it drops.
        self.region = grown;
    }
}

impl std::ops::Deref for SecretBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.region.bytes()[..self.len]
    }
}

impl std::ops::DerefMut for SecretBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.region.bytes_mut()[..len]
    }
}

/// A copy in another secret region: nothing leaves secret memory.
impl Clone for SecretBytes {
    fn clone(&self) -> SecretBytes {
        SecretBytes::from_slice(self)
    }
}

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes([REDACTED; {}])", self.len)
    }
}

#[cfg(test)]
mod tests {
    std::thread_local! {
        /// Stack scrubs on this thread.
        pub(crate) static SCRUBS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    use super::*;

    #[test]
    fn bytes_hold_what_was_put_in_and_grow_without_losing_it() {
        let mut s = SecretBytes::with_capacity(3);
        s.extend_from_slice(b"abc");
        s.extend_from_slice(&[7u8; 10_000]);
        assert_eq!(&s[..3], b"abc");
        assert_eq!(s.len(), 10_003);
        assert!(s[3..].iter().all(|&b| b == 7));
        s.truncate(2);
        assert_eq!(&*s, b"ab");
        s.resize(5);
        assert_eq!(&*s, b"ab\0\0\0", "the truncated bytes were zeroized");
        assert_eq!(&*SecretBytes::from_slice(b"key"), b"key");
        assert_eq!(&*SecretBytes::zeroed(5), &[0u8; 5]);
        assert!(SecretBytes::zeroed(0).is_empty());
    }

    #[test]
    fn many_secrets_built_in_one_go_share_one_scrub() {
        let scrubs = || SCRUBS.with(std::cell::Cell::get);
        let before = scrubs();
        let boxes: Vec<_> = (0..10u64)
            .map(|i| SecretBox::try_init(|| Some([i; 8])).unwrap())
            .collect();
        assert_eq!(scrubs() - before, 10, "one scrub per secret alone");
        let before = scrubs();
        let boxes2 = scrubbing_once(|| {
            (0..10u64)
                .map(|i| SecretBox::try_init(|| Some([i; 8])).unwrap())
                .collect::<Vec<_>>()
        });
        assert_eq!(scrubs() - before, 1, "one scrub for the batch, at its end");
        assert_eq!(boxes2[3][0], 3);
        assert_eq!(boxes[9][7], 9);
        // Nested: still one, by the outermost.
        let before = scrubs();
        scrubbing_once(|| scrubbing_once(|| SecretBox::try_init(|| Some(1u8))));
        assert_eq!(scrubs() - before, 1);
    }

    #[test]
    fn reading_stops_at_the_limit_or_the_end() {
        let data: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let all = SecretBytes::read_from(&data[..], 1 << 20).unwrap();
        assert_eq!(&*all, &data[..]);
        let some = SecretBytes::read_from(&data[..], 5000).unwrap();
        assert_eq!(&*some, &data[..5000]);
        assert!(SecretBytes::read_from(&[][..], 10).unwrap().is_empty());
    }

    #[test]
    fn secrets_never_print() {
        let s = SecretBytes::from_slice(b"hunter2");
        let b = SecretBox::new(*b"hunter2");
        assert_eq!(format!("{s:?}"), "SecretBytes([REDACTED; 7])");
        assert_eq!(format!("{b:?}"), "SecretBox([REDACTED])");
        assert_eq!(&*b, b"hunter2");
    }

    #[test]
    fn a_box_drops_its_value_once() {
        let counter = std::sync::Arc::new(());
        let b = SecretBox::new(std::sync::Arc::clone(&counter));
        assert_eq!(std::sync::Arc::strong_count(&counter), 2);
        drop(b);
        assert_eq!(std::sync::Arc::strong_count(&counter), 1);
    }

    /// Every mapping of secret memory carries the `dd` (do not dump) flag and, where the lock
    /// limit allows, is locked: read back from the kernel's own view of this process.
    #[test]
    fn the_kernel_sees_secret_pages_as_locked_and_not_dumped() {
        let s = SecretBytes::from_slice(&[0x5a; 100]);
        let (fields, flags) = mapping_of(s.as_ptr() as usize);
        assert!(flags.split_whitespace().any(|f| f == "dd"), "{flags}");
        if locked_bytes() > 0 {
            assert!(flags.split_whitespace().any(|f| f == "lo"), "{flags}");
            assert!(!fields.contains("Locked:                0 kB"), "{fields}");
        }
    }

    /// The kernel's view of the mapping that holds `addr` (`/proc/self/smaps`): its fields, and
    /// its `VmFlags`.
    pub(crate) fn mapping_of(addr: usize) -> (String, String) {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        // Each mapping: a line "start-end perms ...", its fields, and a closing "VmFlags:" line.
        let mut inside = false;
        let mut fields = String::new();
        for line in smaps.lines() {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                if inside {
                    return (fields, flags.to_string());
                }
                continue;
            }
            let range = line.split(' ').next().and_then(|r| r.split_once('-'));
            match range.map(|(a, b)| (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))) {
                Some((Ok(start), Ok(end))) => {
                    inside = (start..end).contains(&addr);
                    fields.clear();
                }
                _ => {
                    fields.push_str(line);
                    fields.push('\n');
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }
}
