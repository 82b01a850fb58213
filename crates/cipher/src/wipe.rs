//! Clearing the vector registers and the stack after a keyed operation.
//!
//! A SIMD kernel leaves round keys in the vector registers when it returns, and registers do not
//! stay in registers: the dynamic linker's lazy binding, every signal delivered to the thread and
//! `gcore` save the whole register file (XSAVE) to the stack, from where a later padded copy can
//! carry it into the heap. Kernels also spill to their stack frames: with sixteen vector
//! registers (AVX2, no AVX-512) the VAES ECB kernel keeps its first round key (the key's first
//! 16 bytes) in its frame, and a core taken later still held it there. So every keyed call
//! through an engine in secret memory ends in [`after_keyed_call`]: one `vzeroall` and sixteen
//! register clears, and the stack its engine may have reached zeroed, or, for the several calls
//! of one extended request, [`once`] at its end.
//!
//! Each engine says which of the two depths below it needs
//! ([`BlockEngine::stack_bytes`](crate::engine::BlockEngine::stack_bytes)), and tests hold it
//! to that: `sector::tests::every_keyed_call_stays_within_the_stack_its_wipe_clears` paints the
//! stack, runs every request shape of every cipher and mode on every backend the CPU has
//! (`keys::tests::...` the same for keys in a table), and each wipe first finds how deep below
//! its frame the calls left anything (`reach`, built for tests and for the `stack-reach`
//! feature, with which other crates check their keyed code run inside
//! [`wiping`](crate::wiping)); once a call has returned, no 16 bytes of its key may be left
//! below the test's frame. The test command runs them in the test and in the release
//! profile, which inline differently. On AMD Zen 4 the AES and LEA vector kernels reached
//! 1.6-3.5 KiB (`SHALLOW_STACK`), Serpent and the portable kernels 5.7-6.6 KiB, Twofish up to
//! 20.1 KiB (`DEEP_STACK`); docs/SECURITY.md has the numbers, and the four overruns the tests
//! found. A signal handler would save the registers deeper still, by the CPU's register state
//! size, which no fixed depth can follow: none runs on a thread that makes keyed calls
//! (`sectorcrypt_secret::signals`) but the storage's, for a mapped page that fails under a
//! kernel, which notes that it ran; every wipe then also clears what it left
//! (`signals::clear_after_handlers`).

use std::cell::Cell;

/// Stack an AES engine on AES-NI or VAES, or a LEA engine on AVX2 or AVX-512, may leave key
/// material in.
pub(crate) const SHALLOW_STACK: usize = 4 * 1024;
/// Stack any other engine, or a key schedule, may leave key material in.
pub(crate) const DEEP_STACK: usize = 24 * 1024;

/// Clear what a keyed call leaves behind: the vector registers, and `stack_bytes` of the stack
/// below the caller, as deep as the call's frames reach. Call it from the frame that made the
/// keyed call. Inside [`once`] it only notes the depth: the wipe at the end of `once` covers the
/// call.
#[inline(always)]
pub(crate) fn after_keyed_call(stack_bytes: usize) {
    if DEFERRED.with(Cell::get) {
        NEEDED.with(|n| n.set(n.get().max(stack_bytes)));
    } else if stack_bytes <= SHALLOW_STACK {
        stack_and_registers::<SHALLOW_STACK>();
    } else {
        stack_and_registers::<DEEP_STACK>();
    }
}

std::thread_local! {
    /// Set inside [`once`]: keyed calls on this thread leave their wipe to it.
    static DEFERRED: Cell<bool> = const { Cell::new(false) };
    /// The deepest stack the keyed calls inside [`once`] asked to have cleared.
    static NEEDED: Cell<usize> = const { Cell::new(0) };
}

/// Run `f`, which makes several keyed calls, with one wipe at its end instead of one per call.
/// An extended request of 512-byte sectors makes two calls (tweaks, then data) per
/// [`IV_BATCH`](crate::sector::IV_BATCH) sectors, so a wipe per call zeroed half as many stack
/// bytes as the request had data, and cost 512-byte sectors a tenth of their speed against
/// 4096-byte ones. What the calls leave in registers and on the stack stays there until `f`
/// returns, overwritten by the next call meanwhile; `f`'s own frame (the IV batch) is below this
/// one, so the stack wipe covers it too. The wipe also runs if `f` unwinds.
#[inline(always)]
pub(crate) fn once<R>(f: impl FnOnce() -> R) -> R {
    /// Wipes when the scope ends, by return or by a panic, after the deferral has ended.
    struct AtEnd;
    impl Drop for AtEnd {
        // Inlined, so that the wipe starts from the caller's frame, above the calls' frames.
        #[inline(always)]
        fn drop(&mut self) {
            // An outer `once` takes the depth over; no keyed call, nothing to clear.
            let needed = NEEDED.with(|n| n.replace(0));
            if needed > 0 {
                after_keyed_call(needed);
            }
        }
    }
    let _at_end = AtEnd;
    sectorcrypt_secret::deferring(&DEFERRED, f).0
}

/// Zero the `N` bytes below the caller's frame, where the frames of the calls it just made were,
/// then every vector register this CPU has, with one look at its features. With AVX-512 or AVX
/// the zeros are stored a register at a time: as a `memset` (glibc's `rep stosb` at this size)
/// the 6 KiB wipe took 18% of a 4 KiB request's time on AMD Zen 4 (`vaes512`), as stores 11-13%
/// (and 4 KiB since the IV batch lies above the wiping frame).
#[inline(always)]
fn stack_and_registers<const N: usize>() {
    #[cfg(all(any(test, feature = "stack-reach"), target_arch = "x86_64"))]
    reach::note(N);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            unsafe {
                x86::zero_stack_avx512::<N>();
                x86::avx512();
            }
        } else if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX.
            unsafe {
                x86::zero_stack_avx::<N>();
                x86::avx();
            }
        } else {
            zero_stack::<N>();
            x86::sse();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    zero_stack::<N>();
    #[cfg(all(any(test, feature = "stack-reach"), target_arch = "x86_64"))]
    reach::after();
    #[cfg(test)]
    tests::STACK_WIPES.with(|w| w.borrow_mut().push(N));
    // A handler of ours that interrupted the calls (the storage's, for a mapped page that
    // failed under them) left their registers deeper, or on its alternate stack.
    sectorcrypt_secret::signals::clear_after_handlers();
}

/// The stack part of [`stack_and_registers`], as a `memset`.
#[inline(never)]
fn zero_stack<const N: usize>() {
    let mut area = [0u8; N];
    // The zeros are written because `black_box` may read them.
    std::hint::black_box(&mut area);
}

/// Zero `buf`, a kernel's padded tail or a batch of encrypted tweaks, as one `memset`:
/// `zeroize` writes a byte at a time, which cost a 4 KiB request more than its tweak's AES. The
/// zeros are written because `black_box` may read them.
#[inline]
pub(crate) fn zero(buf: &mut [u8]) {
    buf.fill(0);
    std::hint::black_box(buf);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::{__m256i, __m512i, _mm256_setzero_si256, _mm512_setzero_si512};
    use std::mem::MaybeUninit;

    /// `N` bytes of this frame zeroed with 64-byte stores. Volatile, so that they are neither
    /// dropped (nothing reads them) nor turned back into a `memset`.
    #[inline(never)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn zero_stack_avx512<const N: usize>() {
        zero_area::<__m512i, N>(_mm512_setzero_si512());
    }

    /// As [`zero_stack_avx512`], with 32-byte stores.
    #[inline(never)]
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn zero_stack_avx<const N: usize>() {
        zero_area::<__m256i, N>(_mm256_setzero_si256());
    }

    /// `N` bytes on a register boundary.
    #[repr(C, align(64))]
    struct Area<const N: usize>([MaybeUninit<u8>; N]);

    /// Fill an area of `N` bytes of this frame with `zero`, a register at a time.
    #[inline(always)]
    fn zero_area<R: Copy, const N: usize>(zero: R) {
        const { assert!(N.is_multiple_of(64) && size_of::<R>() <= 64) };
        let mut area = Area([MaybeUninit::<u8>::uninit(); N]);
        let base = area.0.as_mut_ptr();
        for at in (0..N).step_by(size_of::<R>()) {
            // SAFETY: `at + size_of::<R>() <= N`, and `base + at` is aligned for `R` (the area
            // is 64-byte aligned and `at` a multiple of `R`'s size, a power of two up to 64).
            unsafe { base.add(at).cast::<R>().write_volatile(zero) };
        }
        std::hint::black_box(&mut area);
    }

    /// `vzeroall` clears zmm0-15 whole; zmm16-31 need their own zeroing.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512() {
        // SAFETY: only registers the C ABI lets a call clobber are written, and they are
        // declared clobbered; no memory or stack is touched.
        unsafe {
            asm!(
                "vzeroall",
                "vpxord zmm16, zmm16, zmm16",
                "vpxord zmm17, zmm17, zmm17",
                "vpxord zmm18, zmm18, zmm18",
                "vpxord zmm19, zmm19, zmm19",
                "vpxord zmm20, zmm20, zmm20",
                "vpxord zmm21, zmm21, zmm21",
                "vpxord zmm22, zmm22, zmm22",
                "vpxord zmm23, zmm23, zmm23",
                "vpxord zmm24, zmm24, zmm24",
                "vpxord zmm25, zmm25, zmm25",
                "vpxord zmm26, zmm26, zmm26",
                "vpxord zmm27, zmm27, zmm27",
                "vpxord zmm28, zmm28, zmm28",
                "vpxord zmm29, zmm29, zmm29",
                "vpxord zmm30, zmm30, zmm30",
                "vpxord zmm31, zmm31, zmm31",
                clobber_abi("C"),
                options(nomem, nostack, preserves_flags),
            )
        }
    }

    #[target_feature(enable = "avx")]
    pub(super) unsafe fn avx() {
        // SAFETY: as in `avx512`.
        unsafe {
            asm!(
                "vzeroall",
                clobber_abi("C"),
                options(nomem, nostack, preserves_flags)
            )
        }
    }

    pub(super) fn sse() {
        // SAFETY: as in `avx512`; SSE2 is part of x86-64.
        unsafe {
            asm!(
                "xorps xmm0, xmm0",
                "xorps xmm1, xmm1",
                "xorps xmm2, xmm2",
                "xorps xmm3, xmm3",
                "xorps xmm4, xmm4",
                "xorps xmm5, xmm5",
                "xorps xmm6, xmm6",
                "xorps xmm7, xmm7",
                "xorps xmm8, xmm8",
                "xorps xmm9, xmm9",
                "xorps xmm10, xmm10",
                "xorps xmm11, xmm11",
                "xorps xmm12, xmm12",
                "xorps xmm13, xmm13",
                "xorps xmm14, xmm14",
                "xorps xmm15, xmm15",
                clobber_abi("C"),
                options(nomem, nostack, preserves_flags),
            )
        }
    }
}

/// How deep below a wiping frame the calls before its wipe left anything, to check that every
/// wipe covers it ([`reach::measure`]): the stack is painted with a sentinel below the measuring
/// frame, and each wipe on the thread first copies the stack below its frame aside and finds the
/// deepest byte that is neither the sentinel nor zero (zeros hold no secret: the secret crate's
/// own scrub writes them). Reading below the stack pointer is done in `asm!`, outside Rust's
/// memory model.
#[cfg(all(any(test, feature = "stack-reach"), target_arch = "x86_64"))]
pub mod reach {
    use std::arch::asm;
    use std::cell::RefCell;

    const SENTINEL: u8 = 0x5a;
    /// Painted below the measuring frame: more than a wipe's scan plus the frames between the
    /// two.
    const PAINTED: usize = 64 * 1024;
    /// Scanned below a wiping frame: more than any wipe.
    pub const SCANNED: usize = 2 * super::DEEP_STACK;

    /// A measurement under way: the copy of the stack below a wiping frame, and every wipe so
    /// far as (bytes reached below its frame, bytes it wiped).
    struct Measuring {
        copy: Box<[u8; SCANNED]>,
        wipes: Vec<(usize, usize)>,
    }

    std::thread_local! {
        static MEASURING: RefCell<Option<Measuring>> = const { RefCell::new(None) };
    }

    /// Run `f` on a painted stack; each of its wipes on this thread, as (bytes reached below
    /// the wiping frame, bytes wiped there). A reach of [`SCANNED`] means at least that much.
    pub fn measure(f: impl FnOnce()) -> Vec<(usize, usize)> {
        measure_leaving(f).0
    }

    /// [`measure`], and the [`SCANNED`] bytes below the measuring frame once `f` has returned:
    /// what `f`'s calls left on the stack after their last wipe (see [`assert_holds_none_of`]).
    #[inline(never)]
    pub fn measure_leaving(f: impl FnOnce()) -> (Vec<(usize, usize)>, Box<[u8; SCANNED]>) {
        MEASURING.set(Some(Measuring {
            copy: Box::new([0; SCANNED]),
            wipes: Vec::with_capacity(1024),
        }));
        // Allocated first: an allocation after `f` would run on the stack it left.
        let mut left = Box::new([0; SCANNED]);
        /// `f` in a frame of its own, below the measuring one, where the copy reaches.
        #[inline(never)]
        fn below(f: impl FnOnce()) {
            f()
        }
        paint();
        below(f);
        copy_below(left.as_mut_ptr());
        let wipes = MEASURING.take().map(|m| m.wipes).unwrap_or_default();
        (wipes, left)
    }

    /// Panics, saying `what`, if `left` (from [`measure_leaving`]) holds any 16 bytes of
    /// `secret` in a row: a key's, or an AES key schedule's first round key, which is the key's
    /// first 16 bytes.
    pub fn assert_holds_none_of(left: &[u8], secret: &[u8], what: &str) {
        for piece in secret.windows(16) {
            if let Some(at) = left.windows(16).position(|w| w == piece) {
                panic!(
                    "{what}: the stack holds 16 bytes of the key, {} bytes below the measuring \
                     frame",
                    left.len() - at
                );
            }
        }
    }

    /// Copy the [`SCANNED`] bytes below the caller's frame to `to`.
    #[inline(always)]
    fn copy_below(to: *mut u8) {
        // SAFETY: copies the `SCANNED` bytes below this frame, which this thread owns and
        // `measure` painted, into `to`'s `SCANNED` bytes; `rsi`, `rdi` and `rcx` are declared
        // clobbered.
        unsafe {
            asm!(
                "mov rsi, rsp",
                "sub rsi, {scanned}",
                "rep movsb",
                scanned = const SCANNED,
                inout("rdi") to => _,
                inout("rcx") SCANNED => _,
                out("rsi") _,
            );
        }
    }

    /// Fill the unused stack below this frame with the sentinel.
    #[inline(always)]
    fn paint() {
        // SAFETY: writes only the unused stack below this frame (the red zone included, which
        // an `asm!` block without `nostack` may use); `rdi` and `rcx` are declared clobbered,
        // and the direction flag is clear (the ABI).
        unsafe {
            asm!(
                "mov rdi, rsp",
                "sub rdi, {painted}",
                "rep stosb",
                painted = const PAINTED,
                inout("rcx") PAINTED => _,
                in("al") SENTINEL,
                out("rdi") _,
            );
        }
    }

    /// Called by a wipe of `wiped` bytes, from its frame, before it wipes; [`after`] then
    /// paints again what it wiped, for the next wipe to measure.
    #[inline(always)]
    pub(super) fn note(wiped: usize) {
        let Some(copy) = MEASURING.with_borrow_mut(|m| m.as_mut().map(|m| m.copy.as_mut_ptr()))
        else {
            return;
        };
        copy_below(copy);
        MEASURING.with_borrow_mut(|m| {
            if let Some(m) = m {
                let deepest = m.copy.iter().position(|&b| b != SENTINEL && b != 0);
                m.wipes.push((deepest.map_or(0, |at| SCANNED - at), wiped));
            }
        });
    }

    /// The deepest reach among `wipes` (from [`measure`]); panics, saying `what`, if any wipe
    /// fell short of what the calls before it left.
    pub fn deepest_within(wipes: &[(usize, usize)], what: &str) -> usize {
        assert!(!wipes.is_empty(), "{what}: no wipe");
        for &(reached, wiped) in wipes {
            assert!(
                reached <= wiped,
                "{what}: left {reached} bytes below the wiping frame, wiped {wiped}"
            );
        }
        wipes.iter().map(|w| w.0).max().unwrap_or(0)
    }

    /// Called by a wipe from its frame once it has wiped.
    #[inline(always)]
    pub(super) fn after() {
        if MEASURING.with_borrow(Option::is_some) {
            paint();
        }
    }
}

/// What no stack may keep once a keyed call has returned, for the tests' residue checks
/// ([`reach::assert_holds_none_of`]): the key, and for AES every round key of every AES key in
/// it (the data key, XTS's tweak key, ESSIV's hash of the key), in both forms the engines keep
/// them. Only the first one or two round keys are bytes of the key, and any one gives it away.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) mod residue {
    use sectorcrypt_testkit::aes_schedule::aes_round_keys;
    use sha2::{Digest, Sha256};

    /// The key material of `key` under `spec` (a dm-crypt cipher specification).
    pub(crate) fn key_material(spec: &str, key: &[u8]) -> Vec<Vec<u8>> {
        let mut all = vec![key.to_vec()];
        if !spec.starts_with("aes-") {
            return all;
        }
        let mut aes_keys: Vec<Vec<u8>> = if spec.contains("-xts-") {
            key.chunks(key.len() / 2).map(<[u8]>::to_vec).collect()
        } else if spec.contains("-lrw-") {
            vec![key[..key.len() - 16].to_vec()] // and LRW's 16-byte multiplier
        } else {
            vec![key.to_vec()]
        };
        if spec.contains("essiv:sha256") {
            let salt = Sha256::digest(key).to_vec();
            all.push(salt.clone());
            aes_keys.push(salt);
        }
        for aes_key in aes_keys {
            all.extend(aes_round_keys(&aes_key).iter().map(|k| k.to_vec()));
        }
        all
    }

    /// [`super::reach::assert_holds_none_of`] for each piece of [`key_material`].
    pub(crate) fn assert_left_none(left: &[u8], spec: &str, key: &[u8], what: &str) {
        for (i, secret) in key_material(spec, key).iter().enumerate() {
            super::reach::assert_holds_none_of(left, secret, &format!("{what} (key material {i})"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    std::thread_local! {
        /// The size of every stack wipe on this thread.
        pub(super) static STACK_WIPES: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    }

    fn wipes_during(f: impl FnOnce()) -> Vec<usize> {
        STACK_WIPES.with(|w| w.borrow_mut().clear());
        f();
        STACK_WIPES.with(|w| w.take())
    }

    #[test]
    fn keyed_calls_inside_once_share_its_one_wipe_as_deep_as_the_deepest() {
        let (shallow, deep) = (SHALLOW_STACK, DEEP_STACK);
        assert_eq!(wipes_during(|| after_keyed_call(100)), [shallow]);
        assert_eq!(wipes_during(|| after_keyed_call(shallow + 1)), [deep]);
        let calls = |depths: &[usize]| {
            for &d in depths {
                after_keyed_call(d);
            }
        };
        assert_eq!(wipes_during(|| calls(&[1, 2, 3])), [shallow; 3]);
        assert_eq!(
            wipes_during(|| once(|| calls(&[1, 2, 3]))),
            [shallow],
            "one, at the end"
        );
        assert_eq!(
            wipes_during(|| once(|| calls(&[1, deep, 3]))),
            [deep],
            "the deepest"
        );
        assert_eq!(
            wipes_during(|| once(|| {
                calls(&[1]);
                once(|| calls(&[deep]));
            })),
            [deep],
            "nested: the outer one wipes, as deep as the inner calls"
        );
        assert_eq!(wipes_during(|| once(|| {})), [0; 0], "no keyed call");
        // Deferral ends with `once`, and its depth with it.
        assert_eq!(wipes_during(|| calls(&[1, 2])), [shallow; 2]);
        assert_eq!(wipes_during(|| once(|| calls(&[1]))), [shallow]);
    }

    #[test]
    fn a_panic_inside_once_wipes_and_does_not_leave_the_thread_deferring() {
        let wiped = wipes_during(|| {
            let unwound = std::panic::catch_unwind(|| {
                once(|| {
                    after_keyed_call(1);
                    panic!("in a keyed call");
                })
            });
            assert!(unwound.is_err());
        });
        assert_eq!(
            wiped,
            [SHALLOW_STACK],
            "the calls before the panic are wiped"
        );
        assert_eq!(
            wipes_during(|| after_keyed_call(1)),
            [SHALLOW_STACK],
            "a later call wipes at once"
        );
    }

    /// What a handler of ours left on a thread's alternate signal stack during keyed calls (the
    /// storage's SIGBUS handler notes that it ran) goes with the wipe after the calls, on
    /// whichever thread they ran, the cipher's workers too; not before a handler ran. The stack
    /// is filled and read through `/proc/self/mem`.
    #[test]
    fn the_wipe_after_keyed_calls_clears_what_a_handler_left_on_the_alternate_stack() {
        use std::os::unix::fs::FileExt;
        use std::sync::mpsc;
        let check = |note: bool| {
            let (at, len) = sectorcrypt_secret::signals::alt_stack()
                .expect("Rust gives its threads an alternate signal stack");
            let mem = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/proc/self/mem")
                .unwrap();
            mem.write_all_at(&vec![0xa5; len], at as u64).unwrap();
            if note {
                sectorcrypt_secret::signals::note_handler_ran();
            }
            once(|| after_keyed_call(1));
            let mut left = vec![0u8; len];
            mem.read_exact_at(&mut left, at as u64).unwrap();
            left
        };
        // A new thread each time: a thread clears once for handlers noted before it first looked.
        let on_a_thread = |note: bool| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                check(false);
                tx.send(check(note)).unwrap();
            });
            rx.recv().unwrap()
        };
        assert!(
            on_a_thread(false).iter().all(|&b| b == 0xa5),
            "cleared without a handler"
        );
        assert!(
            on_a_thread(true).iter().all(|&b| b == 0),
            "a handler's frame is left"
        );
    }
}
