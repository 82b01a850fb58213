//! LEA with AVX-512F: sixteen blocks per set of four `__m512i`, two sets in flight.
//!
//! A set is loaded as four registers of four blocks each and transposed inside every 128-bit
//! lane (`vpunpck*`), so register `i` holds word `i` of sixteen blocks and a round is twelve
//! full-width instructions (`vprold`/`vprord` rotate natively). The transpose is its own inverse.
//! After it, 32-bit lane `j` holds block `4 * (j % 4) + j / 4` of the set ([`LANE_BLOCK`]).
//!
//! XTS tweaks never leave that transposed form: the sixteen tweaks of a set are made from the
//! unit's first tweak with per-lane shifts (`T * x^e` for lane exponent `e < 32`), and stepping
//! a set by 32 blocks (`* x^32`) is a word move plus a reduction of the top word. CBC decryption
//! takes the previous ciphertext block of every block from the loaded registers (`valignd`), and
//! CBC encryption runs sixteen independent units, one chain per lane.
//!
//! Unit lengths that are not a multiple of 256 bytes (never the case for dm-crypt sectors) use
//! the chunked drivers in [`super::soft`], which still run the ECB kernel at full width.
//!
//! `unsafe` is confined to the unaligned loads and stores (bounds are proved by fixed-size array
//! references) and to calling the `#[target_feature]` kernels, which [`LeaAvx512::new`] only
//! allows on CPUs with AVX-512F.

use core::arch::x86_64::*;

super::simd::lea_simd_engine! {
    /// LEA on AVX-512F.
    engine: LeaAvx512,
    feature: "avx512f",
    cpu: cpu_avx512f,
    backend: crate::backend::Backend::Avx512,
    pair_step: mul_x32,
}

/// Bytes per set of sixteen blocks.
const SET: usize = 16 * BLOCK;

/// Which block of its set each 32-bit lane holds after [`transpose`].
const LANE_BLOCK: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Four registers: blocks as loaded, or word `i` of sixteen blocks in register `i`.
type State = [__m512i; 4];

// ---------------------------------------------------------------------------------------------
// Building blocks. All `#[inline]` so they melt into the kernels (same target features).

#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn load_set(bytes: &[u8; SET]) -> State {
    let p = bytes.as_ptr();
    // SAFETY: the four 64-byte loads cover exactly `bytes`; `loadu` has no alignment requirement.
    unsafe {
        [
            _mm512_loadu_si512(p.cast()),
            _mm512_loadu_si512(p.add(64).cast()),
            _mm512_loadu_si512(p.add(128).cast()),
            _mm512_loadu_si512(p.add(192).cast()),
        ]
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn store_set(bytes: &mut [u8; SET], s: State) {
    let p = bytes.as_mut_ptr();
    // SAFETY: the four 64-byte stores cover exactly `bytes`; `storeu` has no alignment requirement.
    unsafe {
        _mm512_storeu_si512(p.cast(), s[0]);
        _mm512_storeu_si512(p.add(64).cast(), s[1]);
        _mm512_storeu_si512(p.add(128).cast(), s[2]);
        _mm512_storeu_si512(p.add(192).cast(), s[3]);
    }
}

/// 4x4 transpose of 32-bit words inside each 128-bit lane (an involution).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose(r: State) -> State {
    let t0 = _mm512_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm512_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm512_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

#[inline]
#[target_feature(enable = "avx512f")]
fn xor4(a: State, b: State) -> State {
    [
        _mm512_xor_si512(a[0], b[0]),
        _mm512_xor_si512(a[1], b[1]),
        _mm512_xor_si512(a[2], b[2]),
        _mm512_xor_si512(a[3], b[3]),
    ]
}

/// `a ^ b ^ c` in one instruction.
#[inline]
#[target_feature(enable = "avx512f")]
fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(a, b, c)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn splat(k: u32) -> __m512i {
    _mm512_set1_epi32(k as i32)
}

/// One round on the words in `a, b, c, d` (as `X0..X3`); the new state is in `b, c, d, a`.
#[inline]
#[target_feature(enable = "avx512f")]
fn round(a: &__m512i, b: &mut __m512i, c: &mut __m512i, d: &mut __m512i, k: &[u32; 6]) {
    let x = |v, i: usize| _mm512_xor_si512(v, splat(k[i]));
    *d = _mm512_ror_epi32::<3>(_mm512_add_epi32(x(*c, 4), x(*d, 5)));
    *c = _mm512_ror_epi32::<5>(_mm512_add_epi32(x(*b, 2), x(*c, 3)));
    *b = _mm512_rol_epi32::<9>(_mm512_add_epi32(x(*a, 0), x(*b, 1)));
}

/// Inverse of [`round`] with a decryption key (`RoundKeys::dec_keys`): the state is in
/// `b, c, d, a` and returns to `a, b, c, d`.
#[inline]
#[target_feature(enable = "avx512f")]
fn inv_round(a: &__m512i, b: &mut __m512i, c: &mut __m512i, d: &mut __m512i, k: &[u32; 6]) {
    let x = |v, i: usize| _mm512_xor_si512(v, splat(k[i]));
    let s1 = _mm512_sub_epi32(_mm512_ror_epi32::<9>(*b), x(*a, 0));
    let s2 = _mm512_sub_epi32(_mm512_rol_epi32::<5>(*c), x(s1, 2));
    let s3 = _mm512_sub_epi32(_mm512_rol_epi32::<3>(*d), x(s2, 4));
    *b = x(s1, 1);
    *c = x(s2, 3);
    *d = x(s3, 5);
}

// ---------------------------------------------------------------------------------------------
// XTS tweak arithmetic on transposed sets (word `i` of sixteen tweaks in register `i`).

/// The XTS reduction of `c * x^128` for a word `c` that overflowed out of the top: `c * 0x87`
/// carry-less, as (low word, bits that spill into word 1).
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce(c: __m512i) -> (__m512i, __m512i) {
    let lo = _mm512_xor_si512(
        xor3(c, _mm512_slli_epi32::<1>(c), _mm512_slli_epi32::<2>(c)),
        _mm512_slli_epi32::<7>(c),
    );
    let hi = xor3(
        _mm512_srli_epi32::<31>(c),
        _mm512_srli_epi32::<30>(c),
        _mm512_srli_epi32::<25>(c),
    );
    (lo, hi)
}

/// Per-lane exponents of the tweaks of a pair's two sets: lane `j` of the first set holds block
/// `LANE_BLOCK[j]` of the unit's run, of the second `LANES + LANE_BLOCK[j]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lane_exponents() -> (__m512i, __m512i) {
    let b = LANE_BLOCK;
    let e_a = _mm512_setr_epi32(
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
        b[14], b[15],
    );
    (e_a, _mm512_add_epi32(e_a, _mm512_set1_epi32(16)))
}

/// Lane `j` gets `t * x^e[j]` for a tweak `t` broadcast to all lanes and exponents `e[j] < 32`.
#[inline]
#[target_feature(enable = "avx512f")]
fn tweak_powers(t: &State, e: __m512i) -> State {
    // Shifting right by 32 - e (up to 32: `vpsrlvd` then yields 0) brings down the bits that
    // cross into the next word.
    let inv = _mm512_sub_epi32(_mm512_set1_epi32(32), e);
    let up = |w| _mm512_sllv_epi32(w, e);
    let down = |w| _mm512_srlv_epi32(w, inv);
    let (lo, spill) = reduce(down(t[3]));
    [
        _mm512_xor_si512(up(t[0]), lo),
        xor3(up(t[1]), down(t[0]), spill),
        _mm512_or_si512(up(t[2]), down(t[1])),
        _mm512_or_si512(up(t[3]), down(t[2])),
    ]
}

/// Every lane times `x^32`: words move up one, the top word is reduced into the bottom two.
#[inline]
#[target_feature(enable = "avx512f")]
fn mul_x32(t: State) -> State {
    let (lo, spill) = reduce(t[3]);
    [lo, _mm512_xor_si512(t[0], spill), t[1], t[2]]
}

// ---------------------------------------------------------------------------------------------
// CBC helpers.

/// Block `b` in every 128-bit lane (the chaining value before a set, in the top lane).
#[inline]
#[target_feature(enable = "avx512f")]
fn broadcast_block(b: __m128i) -> __m512i {
    _mm512_broadcast_i32x4(b)
}

/// For each register of a loaded (untransposed) set, the ciphertext block preceding each of its
/// four blocks: the last block of the register before, shifted in with `valignd`. `prev` holds
/// the block before the set in its top 128 bits.
#[inline]
#[target_feature(enable = "avx512f")]
fn shifted(prev: __m512i, r: &State) -> State {
    [
        _mm512_alignr_epi32::<12>(r[0], prev),
        _mm512_alignr_epi32::<12>(r[1], r[0]),
        _mm512_alignr_epi32::<12>(r[2], r[1]),
        _mm512_alignr_epi32::<12>(r[3], r[2]),
    ]
}

/// Gather block `at / 16` of sixteen units starting at `base + offs[k]` (lane `l` of register `p`
/// = unit `4p + l`, the same order as [`load_set`] on sixteen consecutive blocks).
///
/// # Safety
/// `base + offs[k] + at .. + 16` must be readable for every `k`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn gather(base: *const u8, offs: &[usize; LANES], at: usize) -> State {
    let mut r = [_mm512_setzero_si512(); 4];
    for (p, v) in r.iter_mut().enumerate() {
        let o = &offs[4 * p..4 * p + 4];
        // SAFETY: the four ranges are readable (caller's guarantee).
        unsafe {
            *v = _mm512_castsi128_si512(load_at(base.add(o[0] + at)));
            *v = _mm512_inserti32x4::<1>(*v, load_at(base.add(o[1] + at)));
            *v = _mm512_inserti32x4::<2>(*v, load_at(base.add(o[2] + at)));
            *v = _mm512_inserti32x4::<3>(*v, load_at(base.add(o[3] + at)));
        }
    }
    r
}
