//! GHASH on PCLMULQDQ, in the byte-reflected form of Intel's white paper ("Intel Carry-Less
//! Multiplication Instruction and its Usage for Computing the GCM Mode", Gueron and Kounavis):
//! blocks are byte-swapped on load, products are 256-bit, shifted left by one bit and reduced
//! modulo `x^128 + x^7 + x^2 + x + 1`. Reduction is linear, so eight products are summed first and
//! reduced once (the "aggregated reduction" of the same paper).
//!
//! Two kernels: PCLMULQDQ on one block per instruction, eight blocks per reduction (`narrow`),
//! and VPCLMULQDQ on 256-bit registers, two blocks per instruction, sixteen per reduction and
//! three multiplies per product (`wide`, on the CPUs whose AES runs on VAES). The
//! caller picks one per key, so tests run both on one machine.

use std::arch::x86_64::*;

/// Blocks summed per reduction in the narrow kernel.
const WAYS: usize = 8;
/// Blocks summed per reduction in the wide kernel (a reduction costs as much as several
/// products, and its latency chains one group to the next).
const WIDE_WAYS: usize = 16;

/// The GHASH key `H` and its powers up to `H^16`, byte-reflected (`powers[i]` is `H^(i+1)`).
pub(super) struct Key {
    powers: [[u8; 16]; WIDE_WAYS],
    /// Groups of eight blocks go through the VPCLMULQDQ kernel.
    wide: bool,
}

impl Drop for Key {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.powers);
    }
}

/// Whether this CPU runs the narrow kernel.
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("pclmulqdq") && std::is_x86_feature_detected!("avx")
}

/// Whether this CPU runs the wide kernel too.
fn wide_available() -> bool {
    available()
        && std::is_x86_feature_detected!("vpclmulqdq")
        && std::is_x86_feature_detected!("avx2")
}

impl Key {
    /// The key of hash subkey `h` (`E(K, 0^128)`), on the wide kernel if `wide` and this CPU
    /// has it. The CPU must have passed [`available`].
    pub(super) fn new(h: &[u8; 16], wide: bool) -> Key {
        assert!(available(), "GHASH kernels on a CPU without pclmulqdq");
        // SAFETY: the CPU has PCLMULQDQ and AVX (checked just above).
        let mut key = unsafe { powers(h) };
        key.wide = wide && wide_available();
        key
    }

    /// GHASH over `parts` in turn, each zero-padded to whole blocks.
    pub(super) fn hash<const N: usize>(&self, parts: [&[u8]; N]) -> [u8; 16] {
        // SAFETY: a `Key` exists only on a CPU that passed `available` (see `Key::new`).
        unsafe { hash(self, &parts) }
    }
}

#[inline(always)]
fn reverse_bytes() -> __m128i {
    // SAFETY: SSE2 is part of x86-64.
    unsafe { _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) }
}

#[target_feature(enable = "pclmulqdq,avx")]
unsafe fn load(block: &[u8]) -> __m128i {
    debug_assert_eq!(block.len(), 16);
    // SAFETY: `block` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_shuffle_epi8(_mm_loadu_si128(block.as_ptr().cast()), reverse_bytes()) }
}

/// Add the unreduced product `a * b` into `lo`, `mid` and `hi`.
#[inline]
#[target_feature(enable = "pclmulqdq,avx")]
unsafe fn mul_add(a: __m128i, b: __m128i, lo: &mut __m128i, mid: &mut __m128i, hi: &mut __m128i) {
    *lo = _mm_xor_si128(*lo, _mm_clmulepi64_si128(a, b, 0x00));
    *hi = _mm_xor_si128(*hi, _mm_clmulepi64_si128(a, b, 0x11));
    *mid = _mm_xor_si128(
        *mid,
        _mm_xor_si128(
            _mm_clmulepi64_si128(a, b, 0x10),
            _mm_clmulepi64_si128(a, b, 0x01),
        ),
    );
}

/// Reduce a sum of products to one field element.
#[inline]
#[target_feature(enable = "pclmulqdq,avx")]
unsafe fn reduce(lo: __m128i, mid: __m128i, hi: __m128i) -> __m128i {
    let mut lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
    let mut hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
    // The 256-bit product shifted left by one bit (the operands are bit-reflected).
    let lo_carry = _mm_srli_epi32(lo, 31);
    let hi_carry = _mm_srli_epi32(hi, 31);
    lo = _mm_slli_epi32(lo, 1);
    hi = _mm_slli_epi32(hi, 1);
    let across = _mm_srli_si128(lo_carry, 12);
    lo = _mm_or_si128(lo, _mm_slli_si128(lo_carry, 4));
    hi = _mm_or_si128(hi, _mm_slli_si128(hi_carry, 4));
    hi = _mm_or_si128(hi, across);
    // Reduction, first phase.
    let a = _mm_slli_epi32(lo, 31);
    let b = _mm_slli_epi32(lo, 30);
    let c = _mm_slli_epi32(lo, 25);
    let t = _mm_xor_si128(_mm_xor_si128(a, b), c);
    let carry = _mm_srli_si128(t, 4);
    lo = _mm_xor_si128(lo, _mm_slli_si128(t, 12));
    // Second phase.
    let d = _mm_srli_epi32(lo, 1);
    let e = _mm_srli_epi32(lo, 2);
    let f = _mm_srli_epi32(lo, 7);
    let t = _mm_xor_si128(_mm_xor_si128(_mm_xor_si128(d, e), f), carry);
    _mm_xor_si128(hi, _mm_xor_si128(lo, t))
}

#[inline]
#[target_feature(enable = "pclmulqdq,avx")]
unsafe fn mul(a: __m128i, b: __m128i) -> __m128i {
    let (mut lo, mut mid, mut hi) = (
        _mm_setzero_si128(),
        _mm_setzero_si128(),
        _mm_setzero_si128(),
    );
    // SAFETY: same CPU features as this function.
    unsafe { mul_add(a, b, &mut lo, &mut mid, &mut hi) };
    // SAFETY: as above.
    unsafe { reduce(lo, mid, hi) }
}

#[target_feature(enable = "pclmulqdq,avx")]
unsafe fn powers(h: &[u8; 16]) -> Key {
    // SAFETY: `h` is 16 bytes.
    let h = unsafe { load(h) };
    let mut key = Key {
        powers: [[0; 16]; WIDE_WAYS],
        wide: false,
    };
    let mut p = h;
    for slot in key.powers.iter_mut() {
        // SAFETY: `slot` is 16 writable bytes.
        unsafe { _mm_storeu_si128(slot.as_mut_ptr().cast(), p) };
        // SAFETY: same CPU features as this function.
        p = unsafe { mul(p, h) };
    }
    key
}

#[target_feature(enable = "pclmulqdq,avx")]
unsafe fn hash(key: &Key, parts: &[&[u8]]) -> [u8; 16] {
    let mut h = [_mm_setzero_si128(); WAYS];
    for (slot, p) in h.iter_mut().zip(&key.powers) {
        // SAFETY: `p` is 16 readable bytes.
        *slot = unsafe { _mm_loadu_si128(p.as_ptr().cast()) };
    }
    let mut y = _mm_setzero_si128();
    for part in parts {
        let whole = part.len() / 16 * 16;
        let mut whole_part = &part[..whole];
        if key.wide {
            let mut groups = whole_part.chunks_exact(16 * WIDE_WAYS);
            // SAFETY: `wide` is set only where the CPU has VPCLMULQDQ and AVX2 (`Key::new`).
            y = unsafe { hash_groups_wide(key, y, &mut groups) };
            whole_part = groups.remainder();
        }
        let mut groups = whole_part.chunks_exact(16 * WAYS);
        for group in &mut groups {
            let (mut lo, mut mid, mut hi) = (
                _mm_setzero_si128(),
                _mm_setzero_si128(),
                _mm_setzero_si128(),
            );
            for (i, block) in group.chunks_exact(16).enumerate() {
                // SAFETY: `block` is 16 bytes; same CPU features as this function.
                let mut x = unsafe { load(block) };
                if i == 0 {
                    x = _mm_xor_si128(x, y);
                }
                // Block i of eight is multiplied by H^(8 - i).
                // SAFETY: same CPU features as this function.
                unsafe { mul_add(x, h[WAYS - 1 - i], &mut lo, &mut mid, &mut hi) };
            }
            // SAFETY: same CPU features as this function.
            y = unsafe { reduce(lo, mid, hi) };
        }
        for block in groups.remainder().chunks_exact(16) {
            // SAFETY: `block` is 16 bytes; same CPU features as this function.
            y = unsafe { mul(_mm_xor_si128(y, load(block)), h[0]) };
        }
        if whole < part.len() {
            let mut last = [0u8; 16];
            last[..part.len() - whole].copy_from_slice(&part[whole..]);
            // SAFETY: `last` is 16 bytes; same CPU features as this function.
            y = unsafe { mul(_mm_xor_si128(y, load(&last)), h[0]) };
            zeroize::Zeroize::zeroize(&mut last);
        }
    }
    let mut out = [0u8; 16];
    // SAFETY: `out` is 16 writable bytes.
    unsafe {
        _mm_storeu_si128(
            out.as_mut_ptr().cast(),
            _mm_shuffle_epi8(y, reverse_bytes()),
        )
    };
    out
}

/// GHASH every group of sixteen blocks left in `groups` into `y`, two blocks per instruction:
/// block pairs `(2j, 2j + 1)` are multiplied by `(H^(16-2j), H^(15-2j))` and the two halves of the
/// sums added before the one reduction. Each product takes three multiplies (Karatsuba: the
/// middle term is `(a_lo ^ a_hi)(b_lo ^ b_hi) ^ lo ^ hi`), not four.
#[target_feature(enable = "pclmulqdq,avx,avx2,vpclmulqdq")]
unsafe fn hash_groups_wide(
    key: &Key,
    mut y: __m128i,
    groups: &mut std::slice::ChunksExact<'_, u8>,
) -> __m128i {
    const PAIRS: usize = WIDE_WAYS / 2;
    // Each pair of powers, and in each lane's low half the XOR of its two halves.
    let mut h = [_mm256_setzero_si256(); PAIRS];
    let mut h_folded = [_mm256_setzero_si256(); PAIRS];
    for j in 0..PAIRS {
        // SAFETY: each power is 16 readable bytes.
        let (first, second) = unsafe {
            (
                _mm_loadu_si128(key.powers[WIDE_WAYS - 1 - 2 * j].as_ptr().cast()),
                _mm_loadu_si128(key.powers[WIDE_WAYS - 2 - 2 * j].as_ptr().cast()),
            )
        };
        h[j] = _mm256_set_m128i(second, first);
        h_folded[j] = fold_halves(h[j]);
    }
    let reverse = _mm256_broadcastsi128_si256(reverse_bytes());
    for group in groups {
        let (mut lo, mut mid, mut hi) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        for (j, pair) in group.chunks_exact(32).enumerate() {
            // SAFETY: `pair` is 32 readable bytes; the load is unaligned.
            let mut x = unsafe { _mm256_loadu_si256(pair.as_ptr().cast()) };
            x = _mm256_shuffle_epi8(x, reverse);
            if j == 0 {
                x = _mm256_xor_si256(x, _mm256_set_m128i(_mm_setzero_si128(), y));
            }
            lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(x, h[j], 0x00));
            hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(x, h[j], 0x11));
            mid = _mm256_xor_si256(
                mid,
                _mm256_clmulepi64_epi128(fold_halves(x), h_folded[j], 0x00),
            );
        }
        let lanes =
            |v: __m256i| _mm_xor_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let (lo, hi) = (lanes(lo), lanes(hi));
        let mid = _mm_xor_si128(lanes(mid), _mm_xor_si128(lo, hi));
        // SAFETY: same CPU features as this function.
        y = unsafe { reduce(lo, mid, hi) };
    }
    y
}

/// Each lane's two 64-bit halves XORed, in its low half (Karatsuba's middle operand).
#[inline]
#[target_feature(enable = "pclmulqdq,avx,avx2,vpclmulqdq")]
fn fold_halves(v: __m256i) -> __m256i {
    _mm256_xor_si256(v, _mm256_shuffle_epi32(v, 0x4e))
}
