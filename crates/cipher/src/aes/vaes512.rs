//! VAES backend on 512-bit registers: four AES blocks per `zmm`, eight registers (32 blocks,
//! one 512-byte sector) in flight so that the one-per-cycle `vaesenc` never waits on its own
//! latency.
//!
//! - Round keys are stored as 16 bytes each and broadcast to the four lanes as they are loaded
//!   (`vbroadcasti32x4`, a plain load): an engine is 488 bytes, which matters when thousands of
//!   keys share the caches (Key Per I/O); pre-broadcast keys (1,928 bytes) measured no faster.
//! - XTS: the 32 tweaks of a group are made in registers. For a unit start `T`, two registers
//!   `[T, Ta, Ta^2, Ta^3]` and `[Ta^4..Ta^7]` come from variable 64-bit shifts; the other six are
//!   those times `a^8` / `a^16`, and the next group of a long unit is the current one times
//!   `a^32`. Multiplying by `a^(8m)` is a byte shift of each 128-bit lane plus a carry-less
//!   multiply of the `m` carried-out bytes by 0x87, which keeps the work off the port that runs
//!   `vaesenc`. The whitening XORs are folded into the first round (`vpternlogq`) and the last
//!   round key (`aesenclast(x, k ^ t) = aesenclast(x, k) ^ t`).
//! - CBC decryption shifts the ciphertext registers by one block with `valignq`.
//! - CBC encryption runs one unit per 128-bit lane: up to 32 independent chains. Units over
//!   1 KiB go a cache line at a time with a 4x4 block transpose (see `cbc_encrypt_lines`).
//! - Unit sizes that are not a multiple of 512 bytes run 32-block groups across unit boundaries
//!   (tweaks from integer arithmetic one group ahead; CBC chaining values patched with the IV at
//!   unit starts). Lengths that are not a multiple of 64 bytes use masked loads and stores.

use core::arch::x86_64::*;
use core::marker::PhantomData;

use zeroize::Zeroize;

use super::x86::{Rk128, RoundKeys, TweakSeq};
use crate::backend::Backend;
use crate::engine::{Block, BLOCK};

/// Registers in flight.
const REGS: usize = 8;
/// Bytes per register.
const REG: usize = 64;
/// Bytes per group of `REGS` registers (32 blocks).
const GROUP: usize = REGS * REG;
/// Blocks per group.
const GROUP_BLOCKS: usize = GROUP / BLOCK;

/// Proof that the CPU runs every feature the kernels enable: only [`Vaes512::new`] makes one.
#[derive(Clone, Copy)]
struct CpuHasVaes512(());

/// AES on VAES + AVX-512.
pub(crate) struct Vaes512 {
    keys: RoundKeys,
    _cpu: CpuHasVaes512,
}

impl Vaes512 {
    /// Expand `key` (16, 24 or 32 bytes); `None` unless vaes, vpclmulqdq, avx512f, avx512bw,
    /// avx512vl and aes are all present.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        // Exactly the features the kernels enable.
        let cpu_ok = std::is_x86_feature_detected!("vaes")
            && std::is_x86_feature_detected!("vpclmulqdq")
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("aes");
        if !cpu_ok {
            return None;
        }
        // SAFETY: `aes` was detected just above.
        let keys = unsafe { RoundKeys::expand(key) };
        Some(Vaes512 {
            keys,
            _cpu: CpuHasVaes512(()),
        })
    }
}

super::x86::x86_block_engine!(Vaes512, Backend::Vaes512);

// ---------------------------------------------------------------------------------------------
// Leaf helpers, inlined into the kernels (same target features).

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn rk(k: &Rk128) -> __m512i {
    // SAFETY: `Rk128` is 16 bytes with 16-byte alignment.
    _mm512_broadcast_i32x4(unsafe { _mm_load_si128(k.0.as_ptr().cast()) })
}

/// 64-bit-lane mask for the bytes of register `i` that lie inside `len` bytes.
#[inline]
fn reg_mask(len: usize, i: usize) -> __mmask8 {
    let qwords = (len.saturating_sub(i * REG) / 8).min(8);
    (0xffu16 >> (8 - qwords)) as __mmask8
}

/// Register `i` of `s` (bytes `64 i ..`), zero-filled past the end of `s`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn load_reg(s: &[u8], i: usize) -> __m512i {
    if s.len() >= (i + 1) * REG {
        let r: &[u8; REG] = s[i * REG..(i + 1) * REG].try_into().unwrap();
        // SAFETY: `r` is 64 readable bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(r.as_ptr().cast()) }
    } else {
        let mask = reg_mask(s.len(), i);
        // SAFETY: only the qwords selected by `mask` are read, and they lie inside `s`; masked-off
        // elements are never accessed (AVX-512 fault suppression), so the pointer may run past
        // the end (`wrapping_add` keeps the arithmetic defined).
        unsafe { _mm512_maskz_loadu_epi64(mask, s.as_ptr().wrapping_add(i * REG).cast()) }
    }
}

/// Store register `i` of `s`, dropping the bytes past the end of `s`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn store_reg(s: &mut [u8], i: usize, v: __m512i) {
    if s.len() >= (i + 1) * REG {
        let r: &mut [u8; REG] = (&mut s[i * REG..(i + 1) * REG]).try_into().unwrap();
        // SAFETY: `r` is 64 writable bytes; the store is unaligned.
        unsafe { _mm512_storeu_si512(r.as_mut_ptr().cast(), v) }
    } else {
        let mask = reg_mask(s.len(), i);
        // SAFETY: only the qwords selected by `mask` are written, and they lie inside `s`;
        // masked-off elements are never accessed.
        unsafe { _mm512_mask_storeu_epi64(s.as_mut_ptr().wrapping_add(i * REG).cast(), mask, v) }
    }
}

/// Block `i` of `s`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn load_block(s: &[u8], i: usize) -> __m128i {
    let b: &[u8; BLOCK] = s[i * BLOCK..(i + 1) * BLOCK].try_into().unwrap();
    // SAFETY: `b` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// `x ^ y ^ z` in one instruction.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn xor3(x: __m512i, y: __m512i, z: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64(x, y, z, 0x96)
}

/// `b` in all four lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn broadcast_block(b: &Block) -> __m512i {
    _mm512_broadcast_i32x4(load_block(b, 0))
}

/// Counter offsets of a register's four lanes (in each lane's lowest 32 bits), and four: the
/// step to the next register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn ctr_lanes() -> (__m512i, __m512i) {
    (
        _mm512_set_epi32(0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0),
        _mm512_set_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4),
    )
}

super::wide::vaes_common! {
    feature: "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes",
    reg: __m512i,
    keys: RoundKeys,
    group_step: mul_a32,
    align: 64,
    load_aligned: _mm512_load_si512,
    stream: _mm512_stream_si512,
    zero: _mm512_setzero_si512,
    xor: _mm512_xor_si512,
    aesenc: _mm512_aesenc_epi128,
    aesdec: _mm512_aesdec_epi128,
    aesenclast: _mm512_aesenclast_epi128,
    aesdeclast: _mm512_aesdeclast_epi128,
    set1_epi64: _mm512_set1_epi64,
    sllv: _mm512_sllv_epi64,
    srlv: _mm512_srlv_epi64,
    sub: _mm512_sub_epi64,
    bslli: _mm512_bslli_epi128,
    bsrli: _mm512_bsrli_epi128,
    clmul: _mm512_clmulepi64_epi128,
    add32: _mm512_add_epi32,
    shuffle: _mm512_shuffle_epi8,
}

// ---------------------------------------------------------------------------------------------
// XTS tweaks: four per register.

/// Every lane times `a^32` (the step from one 32-block group to the next).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn mul_a32(t: __m512i) -> __m512i {
    mul_bytes::<4, 12>(t)
}

/// The 32 tweaks `T a^0 .. T a^31` of a group starting a unit, four per register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn unit_tweaks(t: &Block) -> [__m512i; REGS] {
    let b = _mm512_broadcast_i32x4(load_block(t, 0));
    let r0 = mul_lanes(b, _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0));
    let r1 = mul_lanes(b, _mm512_set_epi64(7, 7, 6, 6, 5, 5, 4, 4));
    let r2 = mul_bytes::<1, 15>(r0);
    let r3 = mul_bytes::<1, 15>(r1);
    [
        r0,
        r1,
        r2,
        r3,
        mul_bytes::<2, 14>(r0),
        mul_bytes::<2, 14>(r1),
        mul_bytes::<2, 14>(r2),
        mul_bytes::<2, 14>(r3),
    ]
}

// ---------------------------------------------------------------------------------------------
// Kernels.

/// ECB on `N` registers of `s` (`s.len() <= 64 N`; a partial last register is masked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn ecb_regs<const N: usize, const DEC: bool>(k: &RoundKeys, s: &mut [u8]) {
    let k0 = first_key::<DEC>(k);
    let mut x = [_mm512_setzero_si512(); N];
    for (i, v) in x.iter_mut().enumerate() {
        *v = _mm512_xor_si512(load_reg(s, i), k0);
    }
    middle_rounds::<N, DEC>(k, &mut x);
    let kl = last_key::<DEC>(k);
    for (i, v) in x.iter().enumerate() {
        store_reg(s, i, last_round::<DEC>(*v, kl));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn ecb<const DEC: bool>(k: &RoundKeys, buf: &mut [u8]) {
    let mut groups = buf.chunks_exact_mut(GROUP);
    for g in &mut groups {
        ecb_regs::<REGS, DEC>(k, g);
    }
    let tail = groups.into_remainder();
    match tail.len().div_ceil(REG) {
        0 => {}
        1 => ecb_regs::<1, DEC>(k, tail),
        2 => ecb_regs::<2, DEC>(k, tail),
        3 => ecb_regs::<3, DEC>(k, tail),
        4 => ecb_regs::<4, DEC>(k, tail),
        5 => ecb_regs::<5, DEC>(k, tail),
        6 => ecb_regs::<6, DEC>(k, tail),
        7 => ecb_regs::<7, DEC>(k, tail),
        _ => ecb_regs::<8, DEC>(k, tail),
    }
}

/// Run `f` on every group of `buf` with its index; the last may be partial (the kernels mask
/// it).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn for_groups(buf: &mut [u8], mut f: impl FnMut(&mut [u8], usize)) {
    for (i, g) in buf.chunks_mut(GROUP).enumerate() {
        f(g, i);
    }
}

/// CBC-decrypt one group: `chain` holds the 32 chaining values (previous ciphertext or IV).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn cbc_decrypt_group(k: &RoundKeys, g: &mut [u8], c: &[__m512i; REGS], chain: &[__m512i; REGS]) {
    let k0 = first_key::<true>(k);
    let mut x = [_mm512_setzero_si512(); REGS];
    for (v, c) in x.iter_mut().zip(c) {
        *v = _mm512_xor_si512(*c, k0);
    }
    middle_rounds::<REGS, true>(k, &mut x);
    let kl = last_key::<true>(k);
    for (i, v) in x.iter().enumerate() {
        store_reg(g, i, last_round::<true>(*v, _mm512_xor_si512(kl, chain[i])));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn cbc_decrypt(k: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    if unit_len.is_multiple_of(GROUP) {
        for (unit, iv) in buf.chunks_exact_mut(unit_len).zip(ivs) {
            // Lane 3 of `prev` is the chaining value of the group's first block.
            let mut prev = _mm512_broadcast_i32x4(load_block(iv, 0));
            for g in unit.chunks_exact_mut(GROUP) {
                let mut c = [_mm512_setzero_si512(); REGS];
                for (i, v) in c.iter_mut().enumerate() {
                    *v = load_reg(g, i);
                }
                // Shift the ciphertext up by one block: [prev.3, c.0, c.1, c.2] per register.
                let mut chain = [_mm512_setzero_si512(); REGS];
                chain[0] = _mm512_alignr_epi64(c[0], prev, 6);
                for i in 1..REGS {
                    chain[i] = _mm512_alignr_epi64(c[i], c[i - 1], 6);
                }
                prev = c[REGS - 1];
                cbc_decrypt_group(k, g, &c, &chain);
            }
        }
    } else {
        // Other unit sizes: 32-block groups across unit boundaries. The chaining values are
        // the ciphertext shifted by one block, except at unit starts, which take their IV.
        let blocks_per_unit = unit_len / BLOCK;
        let (mut unit, mut next_start) = (0, 0);
        let mut prev = _mm512_setzero_si512();
        for (gi, g) in buf.chunks_mut(GROUP).enumerate() {
            let first = gi * GROUP_BLOCKS;
            let mut c = [_mm512_setzero_si512(); REGS];
            for (i, v) in c.iter_mut().enumerate() {
                *v = load_reg(g, i);
            }
            let mut chain = [_mm512_setzero_si512(); REGS];
            chain[0] = _mm512_alignr_epi64(c[0], prev, 6);
            for i in 1..REGS {
                chain[i] = _mm512_alignr_epi64(c[i], c[i - 1], 6);
            }
            while next_start < first + g.len() / BLOCK {
                let b = next_start - first;
                let lane: __mmask16 = 0xf << (4 * (b % 4));
                chain[b / 4] =
                    _mm512_mask_broadcast_i32x4(chain[b / 4], lane, load_block(&ivs[unit], 0));
                unit += 1;
                next_start += blocks_per_unit;
            }
            prev = c[REGS - 1];
            cbc_decrypt_group(k, g, &c, &chain);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn cbc_encrypt(k: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    // Units more than 1 KiB apart put every lane in the same few L1 sets; for those, go a cache
    // line at a time (`cbc_encrypt_lines`) with at most 16 units (4 registers, whose transposed
    // lines fit in the register file) per batch. The twelve kernels below are not inlined: in
    // one frame their spill slots added up to 5.5-6.1 KiB, as deep as the wipe after the call
    // reached then (`wipe::SHALLOW_STACK`); each alone reaches 3.5 KiB at most.
    let by_lines = unit_len.is_multiple_of(REG) && unit_len > 1024;
    let per_batch = if by_lines { 16 } else { 4 * REGS };
    for (batch, ivs) in buf
        .chunks_mut(per_batch * unit_len)
        .zip(ivs.chunks(per_batch))
    {
        let units = ivs.len().min(batch.len() / unit_len);
        let ivs = &ivs[..units];
        if by_lines {
            match units.div_ceil(4) {
                4 => cbc_encrypt_lines::<4>(k, batch, unit_len, ivs),
                3 => cbc_encrypt_lines::<3>(k, batch, unit_len, ivs),
                2 => cbc_encrypt_lines::<2>(k, batch, unit_len, ivs),
                _ => cbc_encrypt_lines::<1>(k, batch, unit_len, ivs),
            }
        } else {
            match units.div_ceil(4) {
                8 => cbc_encrypt_blocks::<8>(k, batch, unit_len, ivs),
                7 => cbc_encrypt_blocks::<7>(k, batch, unit_len, ivs),
                6 => cbc_encrypt_blocks::<6>(k, batch, unit_len, ivs),
                5 => cbc_encrypt_blocks::<5>(k, batch, unit_len, ivs),
                4 => cbc_encrypt_blocks::<4>(k, batch, unit_len, ivs),
                3 => cbc_encrypt_blocks::<3>(k, batch, unit_len, ivs),
                2 => cbc_encrypt_blocks::<2>(k, batch, unit_len, ivs),
                _ => cbc_encrypt_blocks::<1>(k, batch, unit_len, ivs),
            }
        }
    }
}

/// Up to `4 N` units of one batch, one unit per 128-bit lane of `N` registers. Lanes past the
/// last unit repeat it: they compute the same chain and store the same bytes, which keeps the
/// loops free of masks. Raw pointers instead of slices because per-access bounds checks on
/// eight lanes per register cost more front-end bandwidth than the AES rounds; the constructor
/// checks every lane's unit lies inside the batch, and each access checks its offset against
/// the unit length (one compare per step, shared by all lanes).
struct CbcLanes<'a, const N: usize> {
    unit: [[*mut u8; 4]; N],
    unit_len: usize,
    _batch: PhantomData<&'a mut [u8]>,
}

impl<'a, const N: usize> CbcLanes<'a, N> {
    /// The lanes of `batch` (units of `unit_len` bytes, one per IV) and their IVs.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
    fn new(batch: &'a mut [u8], unit_len: usize, ivs: &[Block]) -> (Self, [__m512i; N]) {
        assert!(!ivs.is_empty() && ivs.len() <= 4 * N && ivs.len() * unit_len <= batch.len());
        let last_unit = ivs.len() - 1;
        let base = batch.as_mut_ptr();
        let mut unit = [[base; 4]; N];
        let mut chain = [_mm512_setzero_si512(); N];
        for (r, (p, c)) in unit.iter_mut().zip(chain.iter_mut()).enumerate() {
            let mut iv = [_mm_setzero_si128(); 4];
            for l in 0..4 {
                let u = (4 * r + l).min(last_unit);
                p[l] = base.wrapping_add(u * unit_len);
                iv[l] = load_block(&ivs[u], 0);
            }
            *c = gather(iv);
        }
        (
            CbcLanes {
                unit,
                unit_len,
                _batch: PhantomData,
            },
            chain,
        )
    }

    /// Block at byte `off` of the units of register `r`, one per lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
    fn load_blocks(&self, r: usize, off: usize) -> __m512i {
        assert!(off + BLOCK <= self.unit_len);
        let mut b = [_mm_setzero_si128(); 4];
        for (b, p) in b.iter_mut().zip(&self.unit[r]) {
            // SAFETY: `p` starts a unit inside the batch (checked in `new`), `off + 16` is
            // within the unit.
            *b = unsafe { _mm_loadu_si128(p.add(off).cast()) };
        }
        gather(b)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
    fn store_blocks(&mut self, r: usize, off: usize, v: __m512i) {
        assert!(off + BLOCK <= self.unit_len);
        let b = [
            _mm512_castsi512_si128(v),
            _mm512_extracti32x4_epi32(v, 1),
            _mm512_extracti32x4_epi32(v, 2),
            _mm512_extracti32x4_epi32(v, 3),
        ];
        for (b, p) in b.iter().zip(&self.unit[r]) {
            // SAFETY: as in `load_blocks`; lanes that repeat a unit store identical bytes.
            unsafe { _mm_storeu_si128(p.add(off).cast(), *b) };
        }
    }

    /// The 64-byte lines at byte `off` of the four units of register `r`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
    fn load_lines(&self, r: usize, off: usize) -> [__m512i; 4] {
        assert!(off + REG <= self.unit_len);
        let mut rows = [_mm512_setzero_si512(); 4];
        for (row, p) in rows.iter_mut().zip(&self.unit[r]) {
            // SAFETY: `p` starts a unit inside the batch (checked in `new`), `off + 64` is
            // within the unit.
            *row = unsafe { _mm512_loadu_si512(p.add(off).cast()) };
        }
        rows
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
    fn store_lines(&mut self, r: usize, off: usize, rows: [__m512i; 4]) {
        assert!(off + REG <= self.unit_len);
        for (row, p) in rows.iter().zip(&self.unit[r]) {
            // SAFETY: as in `load_lines`; lanes that repeat a unit store identical bytes.
            unsafe { _mm512_storeu_si512(p.add(off).cast(), *row) };
        }
    }
}

/// CBC encryption of up to `4 N` units in lockstep, a block of each per step (any unit length).
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn cbc_encrypt_blocks<const N: usize>(
    k: &RoundKeys,
    batch: &mut [u8],
    unit_len: usize,
    ivs: &[Block],
) {
    let (mut lanes, mut chain) = CbcLanes::<N>::new(batch, unit_len, ivs);
    let k0 = first_key::<false>(k);
    let kl = last_key::<false>(k);
    for off in (0..unit_len).step_by(BLOCK) {
        let mut x = [_mm512_setzero_si512(); N];
        for (r, (v, c)) in x.iter_mut().zip(&chain).enumerate() {
            *v = xor3(lanes.load_blocks(r, off), *c, k0);
        }
        middle_rounds::<N, false>(k, &mut x);
        for (r, (v, c)) in x.iter().zip(chain.iter_mut()).enumerate() {
            *c = last_round::<false>(*v, kl);
            lanes.store_blocks(r, off, *c);
        }
    }
}

/// Line-wise CBC encryption of up to `4 N` units (unit length a multiple of 64): per step, one
/// cache line (four blocks) of every unit. The lines of four units are transposed so that each
/// register holds one block of each unit, and the ciphertext is transposed back and stored as
/// whole lines: half the shuffles of per-block gathers, and each line is touched once (units
/// 2 or 4 KiB apart all map to the same L1 sets, so re-touching a line per block misses).
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn cbc_encrypt_lines<const N: usize>(
    k: &RoundKeys,
    batch: &mut [u8],
    unit_len: usize,
    ivs: &[Block],
) {
    let (mut lanes, mut chain) = CbcLanes::<N>::new(batch, unit_len, ivs);
    let k0 = first_key::<false>(k);
    let kl = last_key::<false>(k);
    for off in (0..unit_len / REG * REG).step_by(REG) {
        let mut p = [[_mm512_setzero_si512(); 4]; N];
        for (r, p) in p.iter_mut().enumerate() {
            *p = transpose4(lanes.load_lines(r, off));
        }
        for s in 0..4 {
            let mut x = [_mm512_setzero_si512(); N];
            for ((v, p), c) in x.iter_mut().zip(&p).zip(&chain) {
                *v = xor3(p[s], *c, k0);
            }
            middle_rounds::<N, false>(k, &mut x);
            for ((v, p), c) in x.iter().zip(p.iter_mut()).zip(chain.iter_mut()) {
                *c = last_round::<false>(*v, kl);
                p[s] = *c;
            }
        }
        for (r, p) in p.iter().enumerate() {
            lanes.store_lines(r, off, transpose4(*p));
        }
    }
}

/// Transpose a 4x4 matrix of 128-bit blocks held in four registers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn transpose4(m: [__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_shuffle_i64x2(m[0], m[1], 0x44); // a0 a1 b0 b1
    let t1 = _mm512_shuffle_i64x2(m[0], m[1], 0xee); // a2 a3 b2 b3
    let t2 = _mm512_shuffle_i64x2(m[2], m[3], 0x44); // c0 c1 d0 d1
    let t3 = _mm512_shuffle_i64x2(m[2], m[3], 0xee); // c2 c3 d2 d3
    [
        _mm512_shuffle_i64x2(t0, t2, 0x88), // a0 b0 c0 d0
        _mm512_shuffle_i64x2(t0, t2, 0xdd), // a1 b1 c1 d1
        _mm512_shuffle_i64x2(t1, t3, 0x88), // a2 b2 c2 d2
        _mm512_shuffle_i64x2(t1, t3, 0xdd), // a3 b3 c3 d3
    ]
}

/// Four blocks into the four lanes of a register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
fn gather(b: [__m128i; 4]) -> __m512i {
    let v = _mm512_castsi128_si512(b[0]);
    let v = _mm512_inserti32x4(v, b[1], 1);
    let v = _mm512_inserti32x4(v, b[2], 2);
    _mm512_inserti32x4(v, b[3], 3)
}

#[cfg(test)]
mod tests {
    use super::super::x86::testing::{self, require};
    use super::*;
    use crate::engine::BlockEngine;

    #[cfg_attr(not(cpu_vaes512), ignore = "this CPU lacks VAES with AVX-512")]
    #[test]
    fn standard_vectors_and_generic_modes() {
        {
            require(Backend::Vaes512);
            testing::check_wide_backend(
                |k| {
                    Box::new(Vaes512::new(k).expect("this test needs VAES + AVX-512"))
                        as Box<dyn BlockEngine>
                },
                0x5eed_0002,
            );
        }
    }

    #[cfg_attr(not(cpu_vaes512), ignore = "this CPU lacks VAES with AVX-512")]
    #[test]
    fn unit_tweaks_match_scalar_alpha_chain() {
        require(Backend::Vaes512);
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes")]
        fn lanes(t: &Block, steps: usize) -> Vec<u8> {
            let mut tw = unit_tweaks(t);
            for _ in 0..steps {
                tw = next_group(&tw);
            }
            let mut out = vec![0u8; GROUP];
            for (i, v) in tw.iter().enumerate() {
                store_reg(&mut out, i, *v);
            }
            out.to_vec()
        }
        // SAFETY: `require` checked the target features.
        testing::check_register_tweaks(GROUP, |t, steps| unsafe { lanes(t, steps) });
    }
}
