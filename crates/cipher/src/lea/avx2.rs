//! LEA with AVX2: eight blocks per set of four `__m256i`, two sets in flight.
//!
//! Same scheme as the AVX-512 backend (see `avx512.rs`): a set is loaded as four registers of two
//! blocks each and transposed inside every 128-bit lane, so register `i` holds word `i` of eight
//! blocks; lane `j` then holds block `2 * (j % 4) + j / 4` of the set ([`LANE_BLOCK`]). AVX2 has
//! no vector rotate, so each rotation is two shifts and an OR.
//!
//! XTS tweaks stay transposed: per unit they are made from the first tweak with per-lane shifts
//! (`T * x^e`, `e < 16`), and each set steps by `x^16` per pair. CBC decryption shifts the loaded
//! ciphertext by one block (`vperm2i128`), CBC encryption runs eight units, one chain per lane.
//! Unit lengths that are not a multiple of 128 bytes use the chunked drivers in [`super::soft`].
//!
//! `unsafe` is confined to the unaligned loads and stores (bounds proved by fixed-size array
//! references) and to calling the `#[target_feature]` kernels, which [`LeaAvx2::new`] only allows
//! on CPUs with AVX2.

use core::arch::x86_64::*;

super::simd::lea_simd_engine! {
    /// LEA on AVX2.
    engine: LeaAvx2,
    feature: "avx2",
    cpu: cpu_avx2,
    backend: crate::backend::Backend::Avx2,
    pair_step: mul_x16,
}

/// Bytes per set of eight blocks.
const SET: usize = 8 * BLOCK;

/// Which block of its set each 32-bit lane holds after [`transpose`].
const LANE_BLOCK: [i32; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Four registers: blocks as loaded, or word `i` of eight blocks in register `i`.
type State = [__m256i; 4];

// ---------------------------------------------------------------------------------------------
// Building blocks. All `#[inline]` so they melt into the kernels (same target features).

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load_set(bytes: &[u8; SET]) -> State {
    let p = bytes.as_ptr();
    // SAFETY: the four 32-byte loads cover exactly `bytes`; `loadu` has no alignment requirement.
    unsafe {
        [
            _mm256_loadu_si256(p.cast()),
            _mm256_loadu_si256(p.add(32).cast()),
            _mm256_loadu_si256(p.add(64).cast()),
            _mm256_loadu_si256(p.add(96).cast()),
        ]
    }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn store_set(bytes: &mut [u8; SET], s: State) {
    let p = bytes.as_mut_ptr();
    // SAFETY: the four 32-byte stores cover exactly `bytes`; `storeu` has no alignment requirement.
    unsafe {
        _mm256_storeu_si256(p.cast(), s[0]);
        _mm256_storeu_si256(p.add(32).cast(), s[1]);
        _mm256_storeu_si256(p.add(64).cast(), s[2]);
        _mm256_storeu_si256(p.add(96).cast(), s[3]);
    }
}

/// 4x4 transpose of 32-bit words inside each 128-bit lane (an involution).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn transpose(r: State) -> State {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

#[inline]
#[target_feature(enable = "avx2")]
fn xor4(a: State, b: State) -> State {
    [
        _mm256_xor_si256(a[0], b[0]),
        _mm256_xor_si256(a[1], b[1]),
        _mm256_xor_si256(a[2], b[2]),
        _mm256_xor_si256(a[3], b[3]),
    ]
}

#[inline]
#[target_feature(enable = "avx2")]
fn splat(k: u32) -> __m256i {
    _mm256_set1_epi32(k as i32)
}

/// Rotate every 32-bit lane left by a literal amount.
macro_rules! rol {
    ($x:expr, $n:literal) => {{
        let x = $x;
        _mm256_or_si256(
            _mm256_slli_epi32::<$n>(x),
            _mm256_srli_epi32::<{ 32 - $n }>(x),
        )
    }};
}

/// One round on the words in `a, b, c, d` (as `X0..X3`); the new state is in `b, c, d, a`.
#[inline]
#[target_feature(enable = "avx2")]
fn round(a: &__m256i, b: &mut __m256i, c: &mut __m256i, d: &mut __m256i, k: &[u32; 6]) {
    let x = |v, i: usize| _mm256_xor_si256(v, splat(k[i]));
    *d = rol!(_mm256_add_epi32(x(*c, 4), x(*d, 5)), 29);
    *c = rol!(_mm256_add_epi32(x(*b, 2), x(*c, 3)), 27);
    *b = rol!(_mm256_add_epi32(x(*a, 0), x(*b, 1)), 9);
}

/// Inverse of [`round`] with a decryption key (`RoundKeys::dec_keys`): the state is in
/// `b, c, d, a` and returns to `a, b, c, d`.
#[inline]
#[target_feature(enable = "avx2")]
fn inv_round(a: &__m256i, b: &mut __m256i, c: &mut __m256i, d: &mut __m256i, k: &[u32; 6]) {
    let x = |v, i: usize| _mm256_xor_si256(v, splat(k[i]));
    let s1 = _mm256_sub_epi32(rol!(*b, 23), x(*a, 0));
    let s2 = _mm256_sub_epi32(rol!(*c, 5), x(s1, 2));
    let s3 = _mm256_sub_epi32(rol!(*d, 3), x(s2, 4));
    *b = x(s1, 1);
    *c = x(s2, 3);
    *d = x(s3, 5);
}

// ---------------------------------------------------------------------------------------------
// XTS tweak arithmetic on transposed sets (word `i` of eight tweaks in register `i`).

/// `c * 0x87` carry-less for a word `c < 2^25` that overflowed out of the top (the XTS reduction
/// of `c * x^128`); it fits in the low word.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce_small(c: __m256i) -> __m256i {
    let a = _mm256_xor_si256(c, _mm256_slli_epi32::<1>(c));
    let b = _mm256_xor_si256(_mm256_slli_epi32::<2>(c), _mm256_slli_epi32::<7>(c));
    _mm256_xor_si256(a, b)
}

/// Per-lane exponents of the tweaks of a pair's two sets: lane `j` of the first set holds block
/// `LANE_BLOCK[j]` of the unit's run, of the second `LANES + LANE_BLOCK[j]`.
#[inline]
#[target_feature(enable = "avx2")]
fn lane_exponents() -> (__m256i, __m256i) {
    let b = LANE_BLOCK;
    let e_a = _mm256_setr_epi32(b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
    (e_a, _mm256_add_epi32(e_a, _mm256_set1_epi32(8)))
}

/// Lane `j` gets `t[j] * x^e[j]` (for exponents `e[j] < 25`).
#[inline]
#[target_feature(enable = "avx2")]
fn tweak_powers(t: &State, e: __m256i) -> State {
    // Shifting right by 32 - e (32 for e = 0: `vpsrlvd` then yields 0) brings down the bits
    // that cross into the next word; with e < 25 the reduction stays in the low word.
    let inv = _mm256_sub_epi32(_mm256_set1_epi32(32), e);
    let up = |w| _mm256_sllv_epi32(w, e);
    let down = |w| _mm256_srlv_epi32(w, inv);
    [
        _mm256_xor_si256(up(t[0]), reduce_small(down(t[3]))),
        _mm256_or_si256(up(t[1]), down(t[0])),
        _mm256_or_si256(up(t[2]), down(t[1])),
        _mm256_or_si256(up(t[3]), down(t[2])),
    ]
}

/// Every lane times `x^16` (once per pair of sets: the variable shifts cost nothing here).
#[inline]
#[target_feature(enable = "avx2")]
fn mul_x16(t: State) -> State {
    tweak_powers(&t, _mm256_set1_epi32(16))
}

// ---------------------------------------------------------------------------------------------
// CBC helpers.

/// Block `b` in every 128-bit lane (the chaining value before a set, in the top lane).
#[inline]
#[target_feature(enable = "avx2")]
fn broadcast_block(b: __m128i) -> __m256i {
    _mm256_broadcastsi128_si256(b)
}

/// For each register of a loaded (untransposed) set, the ciphertext block preceding each of its
/// two blocks: the last block of the register before, shifted in with `vperm2i128`. `prev` holds
/// the block before the set in its top 128 bits.
#[inline]
#[target_feature(enable = "avx2")]
fn shifted(prev: __m256i, r: &State) -> State {
    [
        _mm256_permute2x128_si256::<0x21>(prev, r[0]),
        _mm256_permute2x128_si256::<0x21>(r[0], r[1]),
        _mm256_permute2x128_si256::<0x21>(r[1], r[2]),
        _mm256_permute2x128_si256::<0x21>(r[2], r[3]),
    ]
}

/// Gather block `at / 16` of eight units starting at `base + offs[k]` (lane `l` of register `p` =
/// unit `2p + l`, the same order as [`load_set`] on eight consecutive blocks).
///
/// # Safety
/// `base + offs[k] + at .. + 16` must be readable for every `k`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn gather(base: *const u8, offs: &[usize; LANES], at: usize) -> State {
    let mut r = [_mm256_setzero_si256(); 4];
    for (p, v) in r.iter_mut().enumerate() {
        // SAFETY: both ranges are readable (caller's guarantee).
        unsafe {
            *v = _mm256_set_m128i(
                load_at(base.add(offs[2 * p + 1] + at)),
                load_at(base.add(offs[2 * p] + at)),
            );
        }
    }
    r
}
