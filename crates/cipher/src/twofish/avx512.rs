//! Twofish with AVX-512: sixteen blocks per set of four `__m512i`, rotations native (`vprold`).
//!
//! The kernels are the shared ones of `simd`, in two builds that differ in their S-boxes:
//! - [`vbmi`] (AVX-512VBMI, e.g. Ice Lake and later, Zen 4): the whole key-dependent S-boxes,
//!   4 x 256 bytes computed in constant time at key set-up, in sixteen registers, looked up with
//!   `vpermi2b` (a register permutation: its timing does not depend on the indices);
//! - [`bw`] (AVX-512BW only, e.g. Skylake-SP): `q0`/`q1` from their 4-bit tables, each lookup a
//!   `vpshufb` with the `q0` table and a merge-masked `vpshufb` with the `q1` table over the
//!   byte positions that take `q1`.
//!
//! `unsafe` is confined to the unaligned loads of tables (bounds proved by fixed-size array
//! references; the blocks are loaded and stored by LEA's functions, the same layout) and to
//! calling the `#[target_feature]` kernels, which the engines' `new` only allows on CPUs with
//! the features.

use core::arch::x86_64::*;

// The set loads, stores and in-lane transposes are LEA's (the same layout).
use crate::lea::avx512::{load_set, store_set, transpose};

/// Bytes per set of sixteen blocks.
const SET: usize = 16 * crate::engine::BLOCK;

type V = __m512i;
type State = [V; 4];

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn xor(a: V, b: V) -> V {
    _mm512_xor_si512(a, b)
}

/// `a ^ b ^ c` in one instruction.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn xor3(a: V, b: V, c: V) -> V {
    _mm512_ternarylogic_epi32::<0x96>(a, b, c)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn and(a: V, b: V) -> V {
    _mm512_and_si512(a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn or(a: V, b: V) -> V {
    _mm512_or_si512(a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn add(a: V, b: V) -> V {
    _mm512_add_epi32(a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn splat(k: u32) -> V {
    _mm512_set1_epi32(k as i32)
}

/// A 16-byte table in every 128-bit lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn tab(t: &[u8; 16]) -> V {
    // SAFETY: one 16-byte unaligned load of exactly `t`.
    _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(t.as_ptr().cast()) })
}

/// `table[idx]` per byte (within each 128-bit lane; an index with its top bit set gives zero).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn shuf(table: V, idx: V) -> V {
    _mm512_shuffle_epi8(table, idx)
}

/// Every 16-bit lane shifted right by 4 (the high nibbles, with bits of the next byte above).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn srl4(x: V) -> V {
    _mm512_srli_epi16::<4>(x)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn rol1(x: V) -> V {
    _mm512_rol_epi32::<1>(x)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn ror1(x: V) -> V {
    _mm512_ror_epi32::<1>(x)
}

/// The AVX-512BW build.
pub(crate) mod bw {
    use super::*;

    super::super::simd::twofish_simd_engine! {
        /// Twofish on AVX-512BW.
        engine: TwofishAvx512,
        feature: "avx512f,avx512bw",
        cpu: cpu_avx512bw,
        backend: crate::backend::Backend::Avx512,
    }

    super::super::simd::twofish_nibble_sboxes! { feature: "avx512f,avx512bw" }

    /// Whether this CPU has AVX-512F and BW.
    pub(crate) fn runs_here() -> bool {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
    }

    /// A lookup of one stage: the `q0` and the `q1` table, and the bytes whose position in
    /// their 32-bit word goes through `q1`.
    type Look = ([V; 2], __mmask64);

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn stage_look(v: [u8; 4], t: [&[u8; 16]; 2]) -> Look {
        let word = (0..4).fold(0u64, |m, j| m | (u64::from(v[j] & 1) << j));
        ([tab(t[0]), tab(t[1])], word * 0x1111_1111_1111_1111)
    }

    /// The `q0` table's entry where the stage uses `q0`, the `q1` table's where it uses `q1`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn look(l: &Look, i: V) -> V {
        let (t, m) = l;
        _mm512_mask_shuffle_epi8(_mm512_shuffle_epi8(t[0], i), *m, t[1], i)
    }
}

/// The AVX-512VBMI build.
pub(crate) mod vbmi {
    use super::*;

    super::super::simd::twofish_simd_engine! {
        /// Twofish on AVX-512VBMI.
        engine: TwofishAvx512Vbmi,
        feature: "avx512f,avx512bw,avx512vbmi",
        cpu: cpu_avx512vbmi,
        backend: crate::backend::Backend::Avx512,
    }

    /// Whether this CPU has AVX-512F, BW and VBMI.
    pub(crate) fn runs_here() -> bool {
        super::bw::runs_here() && std::is_x86_feature_detected!("avx512vbmi")
    }

    /// The key-dependent S-boxes (`Keys::tables`) in sixteen registers: `[4 j + h]` holds
    /// entries `64 h .. 64 h + 64` of `s_j`. (`NS` plays no part: the key is in the tables.)
    struct Sbox<const NS: usize> {
        t: [V; 16],
    }

    impl<const NS: usize> Sbox<NS> {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        fn new(keys: &Keys) -> Self {
            let t = core::array::from_fn(|i| {
                let part: &[u8; 64] = keys.tables[i / 4][64 * (i % 4)..][..64]
                    .try_into()
                    .expect("64 bytes");
                // SAFETY: one 64-byte unaligned load of exactly `part`.
                unsafe { _mm512_loadu_si512(part.as_ptr().cast()) }
            });
            Sbox { t }
        }

        fn wipe(&mut self) {
            zeroize::Zeroize::zeroize(&mut self.t);
        }
    }

    /// `s_j` on byte `j` of every word of `x`: for each `j`, two `vpermi2b` (entries below and
    /// above 128, told apart by the byte's top bit) zero-masked to the bytes in position `j`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn sboxes<const NS: usize>(sb: &Sbox<NS>, x: V) -> V {
        let top = _mm512_movepi8_mask(x);
        let part = |j: usize| {
            let at = 0x1111_1111_1111_1111_u64 << j;
            let t = &sb.t[4 * j..4 * j + 4];
            let low = _mm512_maskz_permutex2var_epi8(at & !top, t[0], x, t[1]);
            let high = _mm512_maskz_permutex2var_epi8(at & top, t[2], x, t[3]);
            or(low, high)
        };
        or(or(part(0), part(1)), or(part(2), part(3)))
    }
}
