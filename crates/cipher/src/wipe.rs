//! Clearing the vector registers and the stack after a keyed operation.
//!
//! A SIMD kernel leaves round keys in the vector registers when it returns, and registers do not
//! stay in registers: the dynamic linker's lazy binding, every signal delivered to the thread and
//! `gcore` save the whole register file (XSAVE) to the stack, from where a later padded copy can
//! carry it into the heap. Kernels also spill to their stack frames: with sixteen vector
//! registers (AVX2, no AVX-512) the VAES ECB kernel keeps its first round key (the key's first
//! 16 bytes) in its frame, and a core taken later still held it there. So every keyed call
//! through an engine in secret memory ends in [`after_keyed_call`]: one `vzeroall` and sixteen
//! register clears, and 8 KiB of stack zeroed (about 100 ns; a request of many sectors is one
//! call).

/// Clear what a keyed call leaves behind: the vector registers, and the stack below the caller
/// as deep as the kernels' frames reach. Call it from the frame that made the keyed call.
#[inline(always)]
pub(crate) fn after_keyed_call() {
    vector_registers();
    stack();
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
