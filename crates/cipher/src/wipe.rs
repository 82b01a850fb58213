//! Clearing the vector registers and the stack after a keyed operation.
//!
//! A SIMD kernel leaves round keys in the vector registers when it returns, and registers do not
//! stay in registers: the dynamic linker's lazy binding, every signal delivered to the thread and
//! `gcore` save the whole register file (XSAVE) to the stack, from where a later padded copy can
//! carry it into the heap. Kernels also spill to their stack frames: with sixteen vector
//! registers (AVX2, no AVX-512) the VAES ECB kernel keeps its first round key (the key's first
//! 16 bytes) in its frame, and a core taken later still held it there. So every keyed call
//! through an engine in secret memory ends in [`after_keyed_call`]: one `vzeroall` and sixteen
//! register clears, and 8 KiB of stack zeroed (about 100 ns), or, for the several calls of one
//! extended request, [`once`] at its end.

use std::cell::Cell;

/// Clear what a keyed call leaves behind: the vector registers, and the stack below the caller
/// as deep as the kernels' frames reach. Call it from the frame that made the keyed call. Inside
/// [`once`] it does nothing: the wipe at the end of `once` covers the call.
#[inline(always)]
pub(crate) fn after_keyed_call() {
    if !DEFERRED.with(Cell::get) {
        vector_registers();
        stack();
    }
}

std::thread_local! {
    /// Set inside [`once`]: keyed calls on this thread leave their wipe to it.
    static DEFERRED: Cell<bool> = const { Cell::new(false) };
}

/// Run `f`, which makes several keyed calls, with one wipe at its end instead of one per call.
/// An extended request of 512-byte sectors makes two calls (tweaks, then data) per
/// [`IV_BATCH`](crate::sector::IV_BATCH) sectors, so a wipe per call zeroed half as many stack
/// bytes as the request had data, and cost 512-byte sectors a tenth of their speed against
/// 4096-byte ones. What the calls leave in registers and on the stack stays there until `f`
/// returns, overwritten by the next call meanwhile; `f`'s own frame (the IV batch) is below this
/// one, so the stack wipe covers it too.
#[inline(always)]
pub(crate) fn once<R>(f: impl FnOnce() -> R) -> R {
    // Not inlined, so that `f`'s locals live in a frame below the caller's, where the wipe
    // reaches.
    #[inline(never)]
    fn below<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
    let outer = DEFERRED.with(|d| d.replace(true));
    let result = below(f);
    DEFERRED.with(|d| d.set(outer));
    after_keyed_call();
    result
}

/// Bytes of stack [`stack`] clears: the AES kernels' frames take about 2 KiB, the portable
/// Twofish and LEA ones up to 5 KiB.
const STACK_BYTES: usize = 8192;

/// Zero the [`STACK_BYTES`] below the caller's frame, where the frames of the calls it just made
/// were.
#[inline(never)]
fn stack() {
    let mut area = [0u128; STACK_BYTES / 16];
    // The zeros are written because `black_box` may read them.
    std::hint::black_box(&mut area);
    #[cfg(test)]
    tests::STACK_WIPES.with(|n| n.set(n.get() + 1));
}

/// Zero `buf`, a kernel's padded tail or a batch of encrypted tweaks, as one `memset`:
/// `zeroize` writes a byte at a time, which cost a 4 KiB request more than its tweak's AES. The
/// zeros are written because `black_box` may read them.
#[inline]
pub(crate) fn zero(buf: &mut [u8]) {
    buf.fill(0);
    std::hint::black_box(buf);
}

/// Zero every vector register this CPU has.
pub(crate) fn vector_registers() {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            unsafe { x86::avx512() }
        } else if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX.
            unsafe { x86::avx() }
        } else {
            x86::sse()
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

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

#[cfg(test)]
mod tests {
    use super::*;

    std::thread_local! {
        pub(super) static STACK_WIPES: Cell<usize> = const { Cell::new(0) };
    }

    fn wipes_during(f: impl FnOnce()) -> usize {
        let before = STACK_WIPES.with(Cell::get);
        f();
        STACK_WIPES.with(Cell::get) - before
    }

    #[test]
    fn keyed_calls_inside_once_share_its_one_wipe() {
        assert_eq!(wipes_during(after_keyed_call), 1, "a lone keyed call wipes");
        let calls = || {
            for _ in 0..5 {
                after_keyed_call();
            }
        };
        assert_eq!(wipes_during(calls), 5);
        assert_eq!(wipes_during(|| once(calls)), 1, "one wipe, at the end");
        assert_eq!(
            wipes_during(|| once(|| once(calls))),
            1,
            "nested: the outer one wipes"
        );
        assert_eq!(wipes_during(|| once(|| {})), 1);
        // Deferral ends with `once`.
        assert_eq!(wipes_during(calls), 5);
    }
}
