//! Twofish with AVX2: eight blocks per set of four `__m256i`.
//!
//! The kernels are the shared ones of `simd`. A lookup in a 16-entry table is `vpshufb`; the
//! `q0`/`q1` choice per byte position is a `vpblendvb` of both lookups with the stage's byte
//! mask. AVX2 has no vector rotate: rotations by one bit are two shifts and an OR.
//!
//! `unsafe` is confined to the unaligned loads of tables (bounds proved by fixed-size array
//! references; the blocks are loaded and stored by LEA's functions, the same layout) and to
//! calling the `#[target_feature]` kernels, which the engines' `new` only allows on CPUs with
//! the features.

use core::arch::x86_64::*;

// The set loads, stores and in-lane transposes are LEA's (the same layout).
use crate::lea::avx2::{load_set, store_set, transpose};

super::simd::twofish_simd_engine! {
    /// Twofish on AVX2.
    engine: TwofishAvx2,
    feature: "avx2",
    cpu: cpu_avx2,
    backend: crate::backend::Backend::Avx2,
}

super::simd::twofish_nibble_sboxes! { feature: "avx2" }

pub(crate) fn runs_here() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Bytes per set of eight blocks.
const SET: usize = 8 * BLOCK;

type V = __m256i;
type State = [V; 4];

#[inline]
#[target_feature(enable = "avx2")]
fn xor(a: V, b: V) -> V {
    _mm256_xor_si256(a, b)
}

#[inline]
#[target_feature(enable = "avx2")]
fn xor3(a: V, b: V, c: V) -> V {
    xor(xor(a, b), c)
}

#[inline]
#[target_feature(enable = "avx2")]
fn and(a: V, b: V) -> V {
    _mm256_and_si256(a, b)
}

#[inline]
#[target_feature(enable = "avx2")]
fn or(a: V, b: V) -> V {
    _mm256_or_si256(a, b)
}

#[inline]
#[target_feature(enable = "avx2")]
fn add(a: V, b: V) -> V {
    _mm256_add_epi32(a, b)
}

#[inline]
#[target_feature(enable = "avx2")]
fn splat(k: u32) -> V {
    _mm256_set1_epi32(k as i32)
}

/// A 16-byte table in both 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn tab(t: &[u8; 16]) -> V {
    // SAFETY: one 16-byte unaligned load of exactly `t`.
    _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) })
}

/// `table[idx]` per byte (within each 128-bit lane; an index with its top bit set gives zero).
#[inline]
#[target_feature(enable = "avx2")]
fn shuf(table: V, idx: V) -> V {
    _mm256_shuffle_epi8(table, idx)
}

/// Every 16-bit lane shifted right by 4 (the high nibbles, with bits of the next byte above).
#[inline]
#[target_feature(enable = "avx2")]
fn srl4(x: V) -> V {
    _mm256_srli_epi16::<4>(x)
}

#[inline]
#[target_feature(enable = "avx2")]
fn rol1(x: V) -> V {
    or(_mm256_slli_epi32::<1>(x), _mm256_srli_epi32::<31>(x))
}

#[inline]
#[target_feature(enable = "avx2")]
fn ror1(x: V) -> V {
    or(_mm256_srli_epi32::<1>(x), _mm256_slli_epi32::<31>(x))
}

/// A lookup of one stage: the `q0` and the `q1` table, and `0xFF` in the bytes whose position
/// in their 32-bit word goes through `q1`.
type Look = ([V; 2], V);

#[inline]
#[target_feature(enable = "avx2")]
fn stage_look(v: [u8; 4], t: [&[u8; 16]; 2]) -> Look {
    let mask = splat(u32::from_le_bytes(v.map(|b| 0u8.wrapping_sub(b & 1))));
    ([tab(t[0]), tab(t[1])], mask)
}

/// The `q0` table's entry where the stage uses `q0`, the `q1` table's where it uses `q1`.
#[inline]
#[target_feature(enable = "avx2")]
fn look(l: &Look, i: V) -> V {
    let (t, m) = l;
    _mm256_blendv_epi8(
        _mm256_shuffle_epi8(t[0], i),
        _mm256_shuffle_epi8(t[1], i),
        *m,
    )
}
