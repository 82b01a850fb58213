//! Serpent with AVX-512F: sixteen blocks per set of four `__m512i`.
//!
//! A set is loaded and transposed as in LEA's AVX-512 backend (`crate::lea::avx512`: four
//! registers of four blocks, a 4x4 transpose of 32-bit words inside every 128-bit lane), so
//! register `i` holds word `i` of sixteen blocks. Rotations are native (`vprold`), and LLVM folds
//! the S-box circuits' ANDs, XORs and NOTs into three-input `vpternlogd`.
//!
//! `unsafe` is confined to calling the `#[target_feature]` kernels, which [`SerpentAvx512::new`]
//! only allows on CPUs with AVX-512F (the loads and stores are LEA's).

use core::arch::x86_64::*;

use crate::lea::avx512::{load_set, store_set, transpose, SET};

super::simd::serpent_simd_engine! {
    /// Serpent on AVX-512F.
    engine: SerpentAvx512,
    feature: "avx512f",
    cpu: cpu_avx512f,
    backend: crate::backend::Backend::Avx512,
}

/// Word `i` of sixteen blocks.
type W = __m512i;

#[inline]
#[target_feature(enable = "avx512f")]
fn and(a: W, b: W) -> W {
    _mm512_and_si512(a, b)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn xor(a: W, b: W) -> W {
    _mm512_xor_si512(a, b)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn not(a: W) -> W {
    _mm512_ternarylogic_epi32::<0x55>(a, a, a)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn rol<const N: i32>(x: W) -> W {
    _mm512_rol_epi32::<N>(x)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn shl<const N: i32>(x: W) -> W {
    // The count as a register operand (the immediate form takes a `u32` parameter); LLVM emits
    // the immediate shift for the constant.
    _mm512_sll_epi32(x, _mm_cvtsi32_si128(N))
}

#[inline]
#[target_feature(enable = "avx512f")]
fn splat(k: u32) -> W {
    _mm512_set1_epi32(k as i32)
}
