//! AES-NI backend on 128-bit registers.
//!
//! `aesenc` has a latency of several cycles but issues every cycle (or two per cycle), so every
//! kernel keeps eight independent blocks in flight: ECB and CBC decryption on eight consecutive
//! blocks, XTS with the eight tweaks generated in registers (multiplication by alpha, no tweak
//! buffer), and CBC encryption on eight *different* units, whose chains are independent.
//! Groups run straight across unit boundaries; a short tail is padded to a full group in a stack
//! buffer rather than run one block at a time.
//!
//! Only SSE2 + AES + SSE4.1 are assumed, so the code runs on every AES-NI CPU (16 xmm registers,
//! no VEX).

use core::arch::x86_64::*;

use super::x86::{load_rk, source_group, RoundKeys, REVERSE_BYTES};
use crate::backend::Backend;
use crate::engine::{Block, BLOCK};

/// Blocks in flight.
const LANES: usize = 8;
/// Bytes per group of `LANES` blocks.
const GROUP: usize = LANES * BLOCK;

/// Proof that the CPU runs AES-NI and SSE4.1: only [`AesNi::new`] creates one, after detection.
#[derive(Clone, Copy)]
struct CpuHasAesNi(());

/// AES on AES-NI.
pub(crate) struct AesNi {
    keys: RoundKeys,
    _cpu: CpuHasAesNi,
}

impl AesNi {
    /// Expand `key` (16, 24 or 32 bytes); `None` if the CPU lacks AES-NI or SSE4.1.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        if !(std::is_x86_feature_detected!("aes") && std::is_x86_feature_detected!("sse4.1")) {
            return None;
        }
        // SAFETY: `aes` was detected just above.
        let keys = unsafe { RoundKeys::expand(key) };
        Some(AesNi {
            keys,
            _cpu: CpuHasAesNi(()),
        })
    }
}

super::x86::x86_block_engine!(AesNi, Backend::AesNi);

// ---------------------------------------------------------------------------------------------
// Leaf helpers. All are `#[inline]` with the same features, so they melt into the kernels.

/// Unaligned load of block `i` of `s`.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn load(s: &[u8], i: usize) -> __m128i {
    let b: &[u8; 16] = s[i * BLOCK..(i + 1) * BLOCK].try_into().unwrap();
    // SAFETY: `b` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// Unaligned store of block `i` of `s`.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn store(s: &mut [u8], i: usize, v: __m128i) {
    let b: &mut [u8; 16] = (&mut s[i * BLOCK..(i + 1) * BLOCK]).try_into().unwrap();
    // SAFETY: `b` is 16 writable bytes; the store is unaligned.
    unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), v) }
}

/// Store block `i` of `s` past the caches (a non-temporal store, which does not fetch the line
/// it replaces) where it lies on a 16-byte boundary, else as `store`. The caller fences
/// (`_mm_sfence`) before anything else may look at the bytes.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn stream_block(s: &mut [u8], i: usize, v: __m128i) {
    let b: &mut [u8; 16] = (&mut s[i * BLOCK..(i + 1) * BLOCK]).try_into().unwrap();
    if (b.as_ptr() as usize).is_multiple_of(BLOCK) {
        // SAFETY: `b` is 16 writable bytes on a 16-byte boundary.
        unsafe { _mm_stream_si128(b.as_mut_ptr().cast(), v) }
    } else {
        // SAFETY: `b` is 16 writable bytes; the store is unaligned.
        unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), v) }
    }
}

#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn load_block(b: &Block) -> __m128i {
    load(b, 0)
}

/// `t * alpha` in the XTS field, IEEE 1619 (little-endian) order, without branches: the sign
/// bits of the two 64-bit halves become the carry into the high half and the 0x87 reduction.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn mul_alpha(t: __m128i) -> __m128i {
    let signs = _mm_srai_epi32(t, 31);
    // dword 0 <- sign of dword 3 (bit 127), dword 2 <- sign of dword 1 (bit 63).
    let carries = _mm_shuffle_epi32(signs, 0x13);
    let carries = _mm_and_si128(carries, _mm_set_epi32(0, 1, 0, 0x87));
    _mm_xor_si128(_mm_add_epi64(t, t), carries)
}

/// Encrypt (or, with `DEC`, decrypt) `N` independent blocks; `last` is XORed into each result
/// for free by folding it into the final round key (aes*last ends with the key XOR).
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn cipher<const N: usize, const DEC: bool>(
    k: &RoundKeys,
    x: &mut [__m128i; N],
    last: &[__m128i; N],
) {
    cipher_then::<N, DEC, ()>(k, x, last, || ());
}

/// [`cipher`], running `mid` after the first round-key XOR: independent work (the next group's
/// tweaks) placed there overlaps the rounds instead of delaying the next group.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn cipher_then<const N: usize, const DEC: bool, R>(
    k: &RoundKeys,
    x: &mut [__m128i; N],
    last: &[__m128i; N],
    mid: impl FnOnce() -> R,
) -> R {
    // One branch on the (public) round count, then straight-line rounds.
    match k.rounds {
        10 => cipher_nr::<N, DEC, 10, R>(k, x, last, mid),
        12 => cipher_nr::<N, DEC, 12, R>(k, x, last, mid),
        _ => cipher_nr::<N, DEC, 14, R>(k, x, last, mid),
    }
}

#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn cipher_nr<const N: usize, const DEC: bool, const NR: usize, R>(
    k: &RoundKeys,
    x: &mut [__m128i; N],
    last: &[__m128i; N],
    mid: impl FnOnce() -> R,
) -> R {
    let keys = if DEC { &k.dec } else { &k.enc };
    let k0 = load_rk(&keys[0]);
    for v in x.iter_mut() {
        *v = _mm_xor_si128(*v, k0);
    }
    let r = mid();
    for rk in &keys[1..NR] {
        let rk = load_rk(rk);
        for v in x.iter_mut() {
            *v = if DEC {
                _mm_aesdec_si128(*v, rk)
            } else {
                _mm_aesenc_si128(*v, rk)
            };
        }
    }
    let kl = load_rk(&keys[NR]);
    for (v, l) in x.iter_mut().zip(last) {
        let kl = _mm_xor_si128(kl, *l);
        *v = if DEC {
            _mm_aesdeclast_si128(*v, kl)
        } else {
            _mm_aesenclast_si128(*v, kl)
        };
    }
    r
}

/// Run `group` on every full group of `buf`, then on the tail padded to a full group in a
/// zeroized stack buffer (`group` gets the number of real blocks).
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn for_groups(buf: &mut [u8], mut group: impl FnMut(&mut [u8; GROUP], usize)) {
    let mut chunks = buf.chunks_exact_mut(GROUP);
    for c in &mut chunks {
        group(c.try_into().unwrap(), LANES);
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut pad = [0u8; GROUP];
        pad[..tail.len()].copy_from_slice(tail);
        group(&mut pad, tail.len() / BLOCK);
        tail.copy_from_slice(&pad[..tail.len()]);
        crate::wipe::zero(&mut pad);
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels.

#[target_feature(enable = "aes,sse4.1")]
fn ecb<const DEC: bool>(k: &RoundKeys, buf: &mut [u8]) {
    let zero = [_mm_setzero_si128(); LANES];
    for_groups(buf, |g, _| {
        let mut x = [_mm_setzero_si128(); LANES];
        for (i, v) in x.iter_mut().enumerate() {
            *v = load(g, i);
        }
        cipher::<LANES, DEC>(k, &mut x, &zero);
        for (i, v) in x.iter().enumerate() {
            store(g, i, *v);
        }
    });
}

/// Counter mode (`inc32`) on each job, eight counter blocks per group.
#[target_feature(enable = "aes,sse4.1")]
fn ctr32(k: &RoundKeys, jobs: &mut [(Block, &mut [u8])]) {
    let reverse = load_block(&REVERSE_BYTES);
    let one = _mm_set_epi32(0, 0, 0, 1);
    for (counter, buf) in jobs.iter_mut() {
        let mut c = _mm_shuffle_epi8(load_block(counter), reverse);
        for_groups(buf, |g, _| {
            let mut x = [_mm_setzero_si128(); LANES];
            let mut data = [_mm_setzero_si128(); LANES];
            for (i, (v, d)) in x.iter_mut().zip(&mut data).enumerate() {
                *v = _mm_shuffle_epi8(c, reverse);
                c = _mm_add_epi32(c, one);
                *d = load(g, i);
            }
            cipher::<LANES, false>(k, &mut x, &data);
            for (i, v) in x.iter().enumerate() {
                store(g, i, *v);
            }
        });
    }
}

/// The XTS tweak sequence across units: unit `u` starts at `tweaks[u]`, each following block
/// multiplies by alpha.
struct TweakStream<'a> {
    tweaks: &'a [Block],
    blocks_per_unit: usize,
    unit: usize,
    pos: usize,
    next: __m128i,
}

impl TweakStream<'_> {
    /// The tweaks of the next `LANES` blocks (past the last unit: unused zeros).
    #[inline]
    #[target_feature(enable = "aes,sse4.1")]
    fn take(&mut self) -> [__m128i; LANES] {
        let mut out = [_mm_setzero_si128(); LANES];
        if self.pos + LANES <= self.blocks_per_unit {
            // The whole group is in one unit (the usual case): a plain chain of alpha steps.
            for o in out.iter_mut() {
                *o = self.next;
                self.next = mul_alpha(self.next);
            }
            self.pos += LANES;
            if self.pos == self.blocks_per_unit {
                self.start_next_unit();
            }
        } else {
            for o in out.iter_mut() {
                *o = self.next;
                self.pos += 1;
                if self.pos == self.blocks_per_unit {
                    self.start_next_unit();
                } else {
                    self.next = mul_alpha(self.next);
                }
            }
        }
        out
    }

    #[inline]
    #[target_feature(enable = "aes,sse4.1")]
    fn start_next_unit(&mut self) {
        self.pos = 0;
        self.unit += 1;
        self.next = match self.tweaks.get(self.unit) {
            Some(t) => load_block(t),
            None => _mm_setzero_si128(),
        };
    }
}

/// `LANES` consecutive tweaks starting at `t`.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn tweak_run(mut t: __m128i) -> [__m128i; LANES] {
    let mut out = [t; LANES];
    for o in out.iter_mut().skip(1) {
        t = mul_alpha(t);
        *o = t;
    }
    out
}

/// XTS on one group of `LANES` blocks with tweaks `t`, from `src` (the group's input elsewhere)
/// or in place into `g`; returns `next()`, which runs while the rounds are in flight.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn xts_group<const DEC: bool>(
    k: &RoundKeys,
    src: Option<&[u8]>,
    g: &mut [u8; GROUP],
    t: &[__m128i; LANES],
    next: impl FnOnce() -> [__m128i; LANES],
) -> [__m128i; LANES] {
    let mut x = [_mm_setzero_si128(); LANES];
    let from: &[u8] = src.unwrap_or(g);
    for (i, v) in x.iter_mut().enumerate() {
        *v = _mm_xor_si128(load(from, i), t[i]);
    }
    let next = cipher_then::<LANES, DEC, _>(k, &mut x, t, next);
    // Encrypting from a source elsewhere is storing into the page cache: past the caches (see
    // `xts`).
    let past_caches = !DEC && src.is_some();
    for (i, v) in x.iter().enumerate() {
        if past_caches {
            stream_block(g, i, *v);
        } else {
            store(g, i, *v);
        }
    }
    next
}

/// Fused XTS: tweak, XOR, AES, XOR, eight blocks at a time across unit boundaries; in place, or
/// from `src` (of `buf`'s length) into `buf`. Encrypting from a source stores into `buf` past
/// the caches (`stream_block`): that is a write lent by the storage, into the page cache, which
/// the kernel writes back and nobody reads soon, so a store need not first fetch the line it
/// replaces.
#[target_feature(enable = "aes,sse4.1")]
fn xts<const DEC: bool>(
    k: &RoundKeys,
    src: Option<&[u8]>,
    buf: &mut [u8],
    unit_len: usize,
    tweaks: &[Block],
) {
    if buf.is_empty() {
        return;
    }
    if unit_len.is_multiple_of(GROUP) {
        // Units of whole groups (all sector sizes): the next group's tweaks are a plain alpha
        // chain, or the next unit's start, computed during this group's rounds.
        let groups_per_unit = unit_len / GROUP;
        let mut t = tweak_run(load_block(&tweaks[0]));
        for (u, unit) in buf.chunks_exact_mut(unit_len).enumerate() {
            // Past the last unit this recomputes tweaks nobody uses, to keep the loop simple.
            let next_unit = tweaks.get(u + 1).unwrap_or(&tweaks[u]);
            for (gi, g) in unit.chunks_exact_mut(GROUP).enumerate() {
                let last = t[LANES - 1];
                let from = source_group(src, u * unit_len + gi * GROUP, GROUP);
                t = xts_group::<DEC>(k, from, g.try_into().unwrap(), &t, || {
                    if gi + 1 < groups_per_unit {
                        tweak_run(mul_alpha(last))
                    } else {
                        tweak_run(load_block(next_unit))
                    }
                });
            }
        }
        if !DEC && src.is_some() {
            // Non-temporal stores are weakly ordered: done before the caller goes on.
            _mm_sfence();
        }
        return;
    }
    // Other unit sizes (rare) run in place.
    if let Some(src) = src {
        buf.copy_from_slice(src);
    }
    let mut stream = TweakStream {
        tweaks,
        blocks_per_unit: unit_len / BLOCK,
        unit: 0,
        pos: 0,
        next: load_block(&tweaks[0]),
    };
    for_groups(buf, |g, _| {
        let t = stream.take();
        xts_group::<DEC>(k, None, g, &t, || t);
    });
}

/// CBC decryption, eight blocks in flight across unit boundaries: block `i` of a unit is
/// `D(C_i) ^ C_{i-1}`, with the unit's IV for `i = 0`.
#[target_feature(enable = "aes,sse4.1")]
pub(super) fn cbc_decrypt(k: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    let blocks_per_unit = unit_len / BLOCK;
    let mut pos = 0; // block index inside the current unit
    let mut unit = 0;
    let mut prev_c = _mm_setzero_si128(); // last ciphertext block of the previous group
    for_groups(buf, |g, n| {
        let mut c = [_mm_setzero_si128(); LANES];
        for (i, v) in c.iter_mut().enumerate() {
            *v = load(g, i);
        }
        let mut chain = [_mm_setzero_si128(); LANES];
        if pos + LANES <= blocks_per_unit {
            // Inside one unit: the chaining values are the ciphertext shifted by one block.
            chain[0] = if pos == 0 {
                load_block(&ivs[unit])
            } else {
                prev_c
            };
            chain[1..].copy_from_slice(&c[..LANES - 1]);
            pos += LANES;
            if pos == blocks_per_unit {
                pos = 0;
                unit += 1;
            }
        } else {
            for i in 0..n {
                chain[i] = if pos == 0 {
                    load_block(&ivs[unit])
                } else if i == 0 {
                    prev_c
                } else {
                    c[i - 1]
                };
                pos += 1;
                if pos == blocks_per_unit {
                    pos = 0;
                    unit += 1;
                }
            }
        }
        prev_c = c[LANES - 1];
        cipher::<LANES, true>(k, &mut c, &chain);
        for (i, v) in c.iter().enumerate() {
            store(g, i, *v);
        }
    });
}

/// CBC encryption: each unit is a serial chain, so up to eight units run side by side.
#[target_feature(enable = "aes,sse4.1")]
pub(super) fn cbc_encrypt(k: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    for (batch, ivs) in buf.chunks_mut(LANES * unit_len).zip(ivs.chunks(LANES)) {
        match batch.len() / unit_len {
            8 => cbc_encrypt_batch::<8>(k, batch, unit_len, ivs),
            7 => cbc_encrypt_batch::<7>(k, batch, unit_len, ivs),
            6 => cbc_encrypt_batch::<6>(k, batch, unit_len, ivs),
            5 => cbc_encrypt_batch::<5>(k, batch, unit_len, ivs),
            4 => cbc_encrypt_batch::<4>(k, batch, unit_len, ivs),
            3 => cbc_encrypt_batch::<3>(k, batch, unit_len, ivs),
            2 => cbc_encrypt_batch::<2>(k, batch, unit_len, ivs),
            _ => cbc_encrypt_batch::<1>(k, batch, unit_len, ivs),
        }
    }
}

/// `N` units (`batch.len() == N * unit_len`) encrypted in lockstep, one block of each per step.
#[inline]
#[target_feature(enable = "aes,sse4.1")]
fn cbc_encrypt_batch<const N: usize>(
    k: &RoundKeys,
    batch: &mut [u8],
    unit_len: usize,
    ivs: &[Block],
) {
    // Raw unit pointers: slice bounds checks on every access would cost as much front-end
    // bandwidth as the rounds themselves.
    assert!(ivs.len() >= N && N * unit_len <= batch.len());
    let base = batch.as_mut_ptr();
    let mut units = [base; N];
    let mut chain = [_mm_setzero_si128(); N];
    for (u, (p, c)) in units.iter_mut().zip(chain.iter_mut()).enumerate() {
        *p = base.wrapping_add(u * unit_len);
        *c = load_block(&ivs[u]);
    }
    let zero = [_mm_setzero_si128(); N];
    for off in (0..unit_len).step_by(BLOCK) {
        let mut x = chain;
        for (v, p) in x.iter_mut().zip(&units) {
            // SAFETY: `p` is the start of unit `u < N` of `batch` (in bounds by the assert) and
            // `off + 16 <= unit_len`.
            *v = _mm_xor_si128(*v, unsafe { _mm_loadu_si128(p.add(off).cast()) });
        }
        cipher::<N, false>(k, &mut x, &zero);
        for (v, p) in x.iter().zip(&units) {
            // SAFETY: as for the load.
            unsafe { _mm_storeu_si128(p.add(off).cast(), *v) };
        }
        chain = x;
    }
}

#[cfg(test)]
mod tests {
    use super::super::x86::testing::{self, require};
    use super::*;
    use crate::engine::BlockEngine;

    fn make(key: &[u8]) -> Box<dyn BlockEngine> {
        Box::new(AesNi::new(key).expect("this test needs AES-NI"))
    }

    #[cfg_attr(not(cpu_aesni), ignore = "this CPU lacks AES-NI")]
    #[test]
    fn standard_vectors() {
        {
            require(Backend::AesNi);
            testing::check_standard_vectors(make);
        }
    }

    #[cfg_attr(not(cpu_aesni), ignore = "this CPU lacks AES-NI")]
    #[test]
    fn key_schedule_matches_fips197_appendix_a() {
        require(Backend::AesNi);
        // Last round keys of the FIPS-197 Appendix A expansions.
        let cases: [(&str, &str); 3] = [
            (
                "2b7e151628aed2a6abf7158809cf4f3c",
                "d014f9a8c9ee2589e13f0cc8b6630ca6",
            ),
            (
                "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
                "e98ba06f448c773c8ecc720401002202",
            ),
            (
                "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
                "fe4890d1e6188d0b046df344706c631e",
            ),
        ];
        for (key, last) in cases {
            let e = AesNi::new(&hex::decode(key).unwrap()).unwrap();
            assert_eq!(hex::encode(e.keys.enc[e.keys.rounds].0), last);
            assert_eq!(e.keys.dec[0].0, e.keys.enc[e.keys.rounds].0);
            assert_eq!(e.keys.dec[e.keys.rounds].0, e.keys.enc[0].0);
        }
    }

    #[cfg_attr(not(cpu_aesni), ignore = "this CPU lacks AES-NI")]
    #[test]
    fn matches_generic_modes() {
        {
            require(Backend::AesNi);
            // The reference modes on this engine's own ECB, and on the portable (bitsliced) AES:
            // an independent key schedule and round implementation.
            testing::compare_with_generic(make, make, 0x5eed_0001, 120);
            testing::compare_with_generic(
                make,
                |k| Box::new(super::super::soft::AesSoft::new(k)),
                0x5eed_0004,
                25,
            );
        }
    }
}
