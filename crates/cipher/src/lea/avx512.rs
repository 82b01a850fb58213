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

use super::soft::{self, RoundKeys};
use crate::backend::Backend;
use crate::engine::{Block, BlockEngine, Direction, BLOCK};

/// Bytes per set of sixteen blocks.
const SET: usize = 16 * BLOCK;
/// Bytes per pair of sets.
const PAIR: usize = 2 * SET;

/// Which block of its set each 32-bit lane holds after [`transpose`].
const LANE_BLOCK: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Four registers: blocks as loaded, or word `i` of sixteen blocks in register `i`.
type State = [__m512i; 4];

/// LEA on AVX-512F.
pub(crate) struct LeaAvx512 {
    keys: RoundKeys,
}

impl LeaAvx512 {
    /// Expand `key` (16, 24 or 32 bytes); `None` if the CPU lacks AVX-512F.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        if !std::is_x86_feature_detected!("avx512f") {
            return None;
        }
        Some(Self {
            keys: RoundKeys::new(key),
        })
    }
}

impl BlockEngine for LeaAvx512 {
    fn backend(&self) -> Backend {
        Backend::Avx512
    }

    fn encrypt_ecb(&self, buf: &mut [u8]) {
        if buf.len() == BLOCK {
            // A lone block (e.g. an XTS tweak) is faster without transposes.
            return soft::encrypt_block(&self.keys, buf);
        }
        // SAFETY: `new` returned `Some` only if the CPU supports AVX-512F.
        unsafe { ecb::<true>(&self.keys, buf) }
    }

    fn decrypt_ecb(&self, buf: &mut [u8]) {
        if buf.len() == BLOCK {
            return soft::decrypt_block(&self.keys, buf);
        }
        // SAFETY: as in `encrypt_ecb`.
        unsafe { ecb::<false>(&self.keys, buf) }
    }

    fn xts_encrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
        if !unit_len.is_multiple_of(SET) {
            return soft::xts_chunked(self, buf, unit_len, tweaks, Direction::Encrypt);
        }
        // SAFETY: as in `encrypt_ecb`.
        unsafe { xts::<true>(&self.keys, buf, unit_len, tweaks) }
    }

    fn xts_decrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
        if !unit_len.is_multiple_of(SET) {
            return soft::xts_chunked(self, buf, unit_len, tweaks, Direction::Decrypt);
        }
        // SAFETY: as in `encrypt_ecb`.
        unsafe { xts::<false>(&self.keys, buf, unit_len, tweaks) }
    }

    fn cbc_encrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
        // SAFETY: as in `encrypt_ecb`.
        unsafe { cbc_encrypt(&self.keys, buf, unit_len, ivs) }
    }

    fn cbc_decrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
        if !unit_len.is_multiple_of(SET) {
            return soft::cbc_decrypt_chunked(self, buf, unit_len, ivs);
        }
        // SAFETY: as in `encrypt_ecb`.
        unsafe { cbc_decrypt(&self.keys, buf, unit_len, ivs) }
    }
}

// ---------------------------------------------------------------------------------------------
// Building blocks. All `#[inline]` so they melt into the kernels (same target features).

#[inline]
#[target_feature(enable = "avx512f")]
fn load_set(bytes: &[u8; SET]) -> State {
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
fn store_set(bytes: &mut [u8; SET], s: State) {
    let p = bytes.as_mut_ptr();
    // SAFETY: the four 64-byte stores cover exactly `bytes`; `storeu` has no alignment requirement.
    unsafe {
        _mm512_storeu_si512(p.cast(), s[0]);
        _mm512_storeu_si512(p.add(64).cast(), s[1]);
        _mm512_storeu_si512(p.add(128).cast(), s[2]);
        _mm512_storeu_si512(p.add(192).cast(), s[3]);
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load_block(bytes: &[u8; BLOCK]) -> __m128i {
    // SAFETY: one 16-byte unaligned load of exactly `bytes`.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

/// 4x4 transpose of 32-bit words inside each 128-bit lane (an involution).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose(r: State) -> State {
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

/// Encrypt (`ENC`) or decrypt `N` transposed sets, round by round across the sets so their
/// independent dependency chains overlap.
#[inline]
#[target_feature(enable = "avx512f")]
fn cipher<const ENC: bool, const N: usize>(keys: &RoundKeys, s: &mut [State; N]) {
    if ENC {
        for k in keys.keys().chunks_exact(4) {
            for [a, b, c, d] in s.iter_mut() {
                round(a, b, c, d, &k[0]);
                round(b, c, d, a, &k[1]);
                round(c, d, a, b, &k[2]);
                round(d, a, b, c, &k[3]);
            }
        }
    } else {
        for k in keys.dec_keys().chunks_exact(4).rev() {
            for [a, b, c, d] in s.iter_mut() {
                inv_round(d, a, b, c, &k[3]);
                inv_round(c, d, a, b, &k[2]);
                inv_round(b, c, d, a, &k[1]);
                inv_round(a, b, c, d, &k[0]);
            }
        }
    }
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
// Kernels.

/// ECB over every whole block of `buf`: pairs of sets, one set, then a zero-padded partial set.
#[target_feature(enable = "avx512f")]
fn ecb<const ENC: bool>(keys: &RoundKeys, buf: &mut [u8]) {
    let (pairs, rest) = buf.as_chunks_mut::<PAIR>();
    for pair in pairs {
        let (a, b) = pair.split_at_mut(SET);
        let (a, b): (&mut [u8; SET], &mut [u8; SET]) =
            (a.try_into().unwrap(), b.try_into().unwrap());
        let mut s = [transpose(load_set(a)), transpose(load_set(b))];
        cipher::<ENC, 2>(keys, &mut s);
        store_set(a, transpose(s[0]));
        store_set(b, transpose(s[1]));
    }
    let (sets, tail) = rest.as_chunks_mut::<SET>();
    for set in sets {
        let mut s = [transpose(load_set(set))];
        cipher::<ENC, 1>(keys, &mut s);
        store_set(set, transpose(s[0]));
    }
    let tail_len = tail.len() - tail.len() % BLOCK;
    if tail_len > 0 {
        let mut tmp = [0u8; SET];
        tmp[..tail_len].copy_from_slice(&tail[..tail_len]);
        let mut s = [transpose(load_set(&tmp))];
        cipher::<ENC, 1>(keys, &mut s);
        store_set(&mut tmp, transpose(s[0]));
        tail[..tail_len].copy_from_slice(&tmp[..tail_len]);
        zeroize::Zeroize::zeroize(&mut tmp);
    }
}

/// XTS over whole units, `unit_len` a multiple of [`SET`]. Per unit: the tweaks of the first two
/// sets come from the unit's tweak by per-lane shifts, later ones by `* x^32` per pair.
#[target_feature(enable = "avx512f")]
fn xts<const ENC: bool>(keys: &RoundKeys, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
    let b = LANE_BLOCK;
    let e_a = _mm512_setr_epi32(
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
        b[14], b[15],
    );
    let e_b = _mm512_add_epi32(e_a, _mm512_set1_epi32(16));
    for (unit, tweak) in buf.chunks_exact_mut(unit_len).zip(tweaks) {
        let t: State = core::array::from_fn(|i| {
            splat(u32::from_le_bytes(
                tweak[4 * i..4 * i + 4].try_into().unwrap(),
            ))
        });
        let mut ta = tweak_powers(&t, e_a);
        let mut tb = tweak_powers(&t, e_b);
        let (pairs, rest) = unit.as_chunks_mut::<PAIR>();
        for pair in pairs {
            let (a, b) = pair.split_at_mut(SET);
            let (a, b): (&mut [u8; SET], &mut [u8; SET]) =
                (a.try_into().unwrap(), b.try_into().unwrap());
            let mut s = [
                xor4(transpose(load_set(a)), ta),
                xor4(transpose(load_set(b)), tb),
            ];
            cipher::<ENC, 2>(keys, &mut s);
            store_set(a, transpose(xor4(s[0], ta)));
            store_set(b, transpose(xor4(s[1], tb)));
            ta = mul_x32(ta);
            tb = mul_x32(tb);
        }
        // `unit_len % SET == 0`, so at most one set is left; its tweaks continue from `ta`.
        if let Ok(set) = <&mut [u8; SET]>::try_from(rest) {
            let mut s = [xor4(transpose(load_set(set)), ta)];
            cipher::<ENC, 1>(keys, &mut s);
            store_set(set, transpose(xor4(s[0], ta)));
        }
    }
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

/// CBC decryption of whole units, `unit_len` a multiple of [`SET`]: all blocks are independent,
/// so pairs of sets run like ECB and the chaining XOR comes from the loaded ciphertext.
#[target_feature(enable = "avx512f")]
fn cbc_decrypt(keys: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    for (unit, iv) in buf.chunks_exact_mut(unit_len).zip(ivs) {
        let mut prev = _mm512_broadcast_i32x4(load_block(iv));
        let (pairs, rest) = unit.as_chunks_mut::<PAIR>();
        for pair in pairs {
            let (a, b) = pair.split_at_mut(SET);
            let (a, b): (&mut [u8; SET], &mut [u8; SET]) =
                (a.try_into().unwrap(), b.try_into().unwrap());
            let (ra, rb) = (load_set(a), load_set(b));
            let pa = shifted(prev, &ra);
            let pb = shifted(ra[3], &rb);
            prev = rb[3];
            let mut s = [transpose(ra), transpose(rb)];
            cipher::<false, 2>(keys, &mut s);
            store_set(a, xor4(transpose(s[0]), pa));
            store_set(b, xor4(transpose(s[1]), pb));
        }
        if let Ok(set) = <&mut [u8; SET]>::try_from(rest) {
            let r = load_set(set);
            let p = shifted(prev, &r);
            let mut s = [transpose(r)];
            cipher::<false, 1>(keys, &mut s);
            store_set(set, xor4(transpose(s[0]), p));
        }
    }
}

/// Load 16 bytes from `p`.
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_at(p: *const u8) -> __m128i {
    // SAFETY: guaranteed by the caller; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(p.cast()) }
}

/// Gather block `at / 16` of sixteen units starting at `base + offs[k]` (lane `l` of register `p`
/// = unit `4p + l`, the same order as [`load_set`] on sixteen consecutive blocks).
///
/// # Safety
/// `base + offs[k] + at .. + 16` must be readable for every `k`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn gather(base: *const u8, offs: &[usize; 16], at: usize) -> State {
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

/// CBC encryption: each unit is a serial chain, so sixteen units run side by side, one per lane,
/// with the chaining value kept transposed. In a last group of `n < 16` units the idle lanes
/// repeat the last unit and are never stored.
#[target_feature(enable = "avx512f")]
fn cbc_encrypt(keys: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    assert!(
        unit_len > 0 && unit_len.is_multiple_of(BLOCK),
        "unit length must be a positive multiple of 16"
    );
    let units = (buf.len() / unit_len).min(ivs.len());
    for first in (0..units).step_by(16) {
        let n = (units - first).min(16);
        let group = &mut buf[first * unit_len..(first + n) * unit_len];
        let offs: [usize; 16] = core::array::from_fn(|k| k.min(n - 1) * unit_len);
        let mut out = [0u8; SET];
        for (slot, &o) in out.chunks_exact_mut(BLOCK).zip(&offs) {
            slot.copy_from_slice(&ivs[first + o / unit_len]);
        }
        let mut chain = transpose(load_set(&out));
        let base = group.as_mut_ptr();
        for at in (0..unit_len).step_by(BLOCK) {
            // SAFETY: `offs[k] + at + 16 <= (n - 1) * unit_len + unit_len = group.len()`.
            let p = unsafe { gather(base, &offs, at) };
            let mut s = [xor4(transpose(p), chain)];
            cipher::<true, 1>(keys, &mut s);
            chain = s[0];
            // Through a stack buffer: plain 16-byte copies instead of lane extracts.
            store_set(&mut out, transpose(chain));
            for (k, block) in out.chunks_exact(BLOCK).take(n).enumerate() {
                // SAFETY: as for `gather`, the block is inside `group`, which `base` borrows
                // uniquely; lanes `k < n` are distinct units.
                unsafe {
                    core::ptr::copy_nonoverlapping(block.as_ptr(), base.add(offs[k] + at), BLOCK)
                };
            }
        }
        zeroize::Zeroize::zeroize(&mut out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::soft::test_support::*;
    use super::*;

    fn make(key: &[u8]) -> Box<dyn BlockEngine> {
        Box::new(LeaAvx512::new(key).expect("avx512f"))
    }

    fn available() -> bool {
        let ok = std::is_x86_feature_detected!("avx512f");
        if !ok {
            eprintln!("skipped: no AVX-512F on this CPU");
        }
        ok
    }

    #[test]
    fn kisa_vectors() {
        if available() {
            check_kisa(&make);
        }
    }

    #[test]
    fn xts_vectors() {
        if available() {
            check_xts(&make);
        }
    }

    #[test]
    fn lane_order_matches_transpose() {
        if !available() {
            return;
        }
        // Load sixteen blocks whose words are their block index, transpose, read lanes back.
        let mut bytes = [0u8; SET];
        for (i, b) in bytes.chunks_exact_mut(BLOCK).enumerate() {
            for w in b.chunks_exact_mut(4) {
                w.copy_from_slice(&(i as u32).to_le_bytes());
            }
        }
        // SAFETY: this test only runs after checking for AVX-512F.
        let lanes = unsafe { word0_lanes(&bytes) };
        assert_eq!(lanes, LANE_BLOCK);
    }

    #[target_feature(enable = "avx512f")]
    fn word0_lanes(bytes: &[u8; SET]) -> [i32; 16] {
        let w = transpose(load_set(bytes));
        let mut out = [0u8; SET];
        store_set(&mut out, [w[0]; 4]);
        core::array::from_fn(|i| i32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap()))
    }

    #[test]
    fn random_against_portable_and_defaults() {
        if available() {
            compare_random(&make, 512, 300);
        }
    }
}
