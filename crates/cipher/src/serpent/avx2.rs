//! Serpent with AVX2: eight blocks per set of four `__m256i`.
//!
//! A set is loaded and transposed as in LEA's AVX2 backend (`crate::lea::avx2`: four registers
//! of two blocks, a 4x4 transpose of 32-bit words inside every 128-bit lane), so register `i`
//! holds word `i` of eight blocks. AVX2 has no vector rotate: each rotation is two shifts and an
//! OR.
//!
//! `unsafe` is confined to calling the `#[target_feature]` kernels, which [`SerpentAvx2::new`]
//! only allows on CPUs with AVX2 (the loads and stores are LEA's).

use core::arch::x86_64::*;

use crate::lea::avx2::{load_set, store_set, transpose, SET};

super::simd::serpent_simd_engine! {
    /// Serpent on AVX2.
    engine: SerpentAvx2,
    feature: "avx2",
    cpu: cpu_avx2,
    backend: crate::backend::Backend::Avx2,
}

/// Word `i` of eight blocks.
type W = __m256i;

#[inline]
#[target_feature(enable = "avx2")]
fn and(a: W, b: W) -> W {
    _mm256_and_si256(a, b)
}

#[inline]
#[target_feature(enable = "avx2")]
fn xor(a: W, b: W) -> W {
    _mm256_xor_si256(a, b)
}

#[inline]
#[target_feature(enable = "avx2")]
fn not(a: W) -> W {
    _mm256_xor_si256(a, _mm256_set1_epi32(-1))
}

#[inline]
#[target_feature(enable = "avx2")]
fn rol<const N: i32>(x: W) -> W {
    // Counts as register operands (the immediate forms cannot take `32 - N`); LLVM emits the
    // immediate shifts for the constants.
    _mm256_or_si256(
        _mm256_sll_epi32(x, _mm_cvtsi32_si128(N)),
        _mm256_srl_epi32(x, _mm_cvtsi32_si128(32 - N)),
    )
}

#[inline]
#[target_feature(enable = "avx2")]
fn shl<const N: i32>(x: W) -> W {
    _mm256_slli_epi32::<N>(x)
}

#[inline]
#[target_feature(enable = "avx2")]
fn splat(k: u32) -> W {
    _mm256_set1_epi32(k as i32)
}
