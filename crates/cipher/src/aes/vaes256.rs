//! VAES backend on 256-bit registers (AVX2 + VAES + VPCLMULQDQ, no AVX-512): two AES blocks per
//! `ymm`, eight registers (16 blocks) in flight. It is for CPUs that have VAES but not AVX-512
//! (AMD Zen 3, Intel's client cores since Alder Lake), where `vaesenc ymm` issues as often as
//! `aesenc xmm` and so does twice the AES-NI kernel's work per cycle.
//!
//! - Round keys are stored pre-broadcast to 32 bytes: every round is one `vaesenc` per register.
//! - XTS: the 16 tweaks of a group are made in registers from the unit's first tweak:
//!   `[T, Ta] .. [Ta^6, Ta^7]` from variable 64-bit shifts, the next four registers those times
//!   `a^8`, and the next group of a long unit the current one times `a^16`. Multiplying by
//!   `a^(8m)` is a byte shift of each lane plus a carry-less multiply of the carried-out bytes by
//!   0x87. The next group's tweaks are made while this group's rounds run. Units that are not a
//!   multiple of 256 bytes take their tweaks from the shared integer sequence
//!   ([`super::x86::TweakSeq`]).
//! - A tail shorter than a group runs padded in a stack buffer (AVX2 has no byte-masked stores).
//! - CBC runs on the AES-NI kernels: encryption is serial within a unit, and CBC is not the XTS
//!   path this backend exists for.

use core::arch::x86_64::*;

use zeroize::Zeroize;

use super::x86::{RoundKeys, TweakSeq};
use crate::backend::Backend;
use crate::engine::{Block, BLOCK};

/// Registers in flight.
const REGS: usize = 8;
/// Bytes per register.
const REG: usize = 32;
/// Bytes per group of `REGS` registers (16 blocks).
const GROUP: usize = REGS * REG;
/// Blocks per group.
const GROUP_BLOCKS: usize = GROUP / BLOCK;

/// One round key repeated in both 128-bit lanes.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Rk256([u8; 32]);

/// Encryption and decryption round keys, pre-broadcast, and the 128-bit ones for CBC; zeroized
/// on drop.
struct Keys {
    enc: [Rk256; 15],
    dec: [Rk256; 15],
    rounds: usize,
    narrow: RoundKeys,
}

impl Drop for Keys {
    fn drop(&mut self) {
        for k in self.enc.iter_mut().chain(self.dec.iter_mut()) {
            k.0.zeroize();
        }
    }
}

/// Proof that the CPU runs every feature the kernels enable: only [`Vaes256::new`] makes one.
#[derive(Clone, Copy)]
struct CpuHasVaes256(());

/// AES on VAES + AVX2.
pub(crate) struct Vaes256 {
    keys: Keys,
    _cpu: CpuHasVaes256,
}

impl Vaes256 {
    /// Expand `key` (16, 24 or 32 bytes); `None` unless vaes, vpclmulqdq, avx2, aes and sse4.1
    /// are all present.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        if !Backend::Vaes256.is_available() {
            return None;
        }
        // SAFETY: `aes` was detected just above.
        let narrow = unsafe { RoundKeys::expand(key) };
        let mut keys = Keys {
            enc: [Rk256([0; 32]); 15],
            dec: [Rk256([0; 32]); 15],
            rounds: narrow.rounds,
            narrow,
        };
        let Keys {
            enc, dec, narrow, ..
        } = &mut keys;
        for (wide, k) in enc
            .iter_mut()
            .zip(&narrow.enc)
            .chain(dec.iter_mut().zip(&narrow.dec))
        {
            wide.0[..16].copy_from_slice(&k.0);
            wide.0[16..].copy_from_slice(&k.0);
        }
        Some(Vaes256 {
            keys,
            _cpu: CpuHasVaes256(()),
        })
    }
}

super::x86::x86_block_engine!(Vaes256, Backend::Vaes256);

// ---------------------------------------------------------------------------------------------
// Leaf helpers, inlined into the kernels (same target features).

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn rk(k: &Rk256) -> __m256i {
    // SAFETY: `Rk256` is 32 bytes with 32-byte alignment.
    unsafe { _mm256_load_si256(k.0.as_ptr().cast()) }
}

/// Register `i` of a group.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn load_reg(g: &[u8; GROUP], i: usize) -> __m256i {
    let r: &[u8; REG] = g[i * REG..(i + 1) * REG].try_into().unwrap();
    // SAFETY: `r` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(r.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn store_reg(g: &mut [u8; GROUP], i: usize, v: __m256i) {
    let r: &mut [u8; REG] = (&mut g[i * REG..(i + 1) * REG]).try_into().unwrap();
    // SAFETY: `r` is 32 writable bytes; the store is unaligned.
    unsafe { _mm256_storeu_si256(r.as_mut_ptr().cast(), v) }
}

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn load_block(b: &Block) -> __m128i {
    // SAFETY: `b` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// Run `f` on every whole group of `buf`, then on the tail padded to a group in a stack buffer.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn for_groups(buf: &mut [u8], mut f: impl FnMut(&mut [u8; GROUP], usize)) {
    let mut groups = buf.chunks_exact_mut(GROUP);
    let mut index = 0;
    for g in &mut groups {
        f(g.try_into().unwrap(), index);
        index += 1;
    }
    let tail = groups.into_remainder();
    if !tail.is_empty() {
        let mut pad = [0u8; GROUP];
        pad[..tail.len()].copy_from_slice(tail);
        f(&mut pad, index);
        tail.copy_from_slice(&pad[..tail.len()]);
        pad.zeroize();
    }
}

/// The middle rounds (1 .. rounds-1), straight-line per round count (as in `vaes512`).
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn middle_rounds<const DEC: bool>(k: &Keys, x: &mut [__m256i; REGS]) {
    match k.rounds {
        10 => rounds_fixed::<DEC, 10>(k, x),
        12 => rounds_fixed::<DEC, 12>(k, x),
        _ => rounds_fixed::<DEC, 14>(k, x),
    }
}

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn rounds_fixed<const DEC: bool, const NR: usize>(k: &Keys, x: &mut [__m256i; REGS]) {
    let keys = if DEC { &k.dec } else { &k.enc };
    for key in &keys[1..NR] {
        let key = rk(key);
        for v in x.iter_mut() {
            *v = if DEC {
                _mm256_aesdec_epi128(*v, key)
            } else {
                _mm256_aesenc_epi128(*v, key)
            };
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn last_round<const DEC: bool>(x: __m256i, key: __m256i) -> __m256i {
    if DEC {
        _mm256_aesdeclast_epi128(x, key)
    } else {
        _mm256_aesenclast_epi128(x, key)
    }
}

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn first_key<const DEC: bool>(k: &Keys) -> __m256i {
    rk(if DEC { &k.dec[0] } else { &k.enc[0] })
}

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn last_key<const DEC: bool>(k: &Keys) -> __m256i {
    rk(if DEC {
        &k.dec[k.rounds]
    } else {
        &k.enc[k.rounds]
    })
}

// ---------------------------------------------------------------------------------------------
// XTS tweak arithmetic on two 128-bit lanes at once (IEEE 1619 little-endian order: "times a^s"
// is a left shift of the 128-bit integer with the 0x87 reduction).

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn gf_poly() -> __m256i {
    _mm256_set1_epi64x(0x87)
}

/// Lane `j` times `a^(s_j)`, with `shifts` = `s_j` in both 64-bit halves of lane `j` (s < 57).
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn mul_lanes(t: __m256i, shifts: __m256i) -> __m256i {
    let shifted = _mm256_sllv_epi64(t, shifts);
    // The bits pushed out of each half (a count of 64 gives 0 for s = 0).
    let carries = _mm256_srlv_epi64(t, _mm256_sub_epi64(_mm256_set1_epi64x(64), shifts));
    // Low half's carries go into the high half; the high half's are reduced into the low half.
    let into_high = _mm256_bslli_epi128::<8>(carries);
    let reduced = _mm256_clmulepi64_epi128::<0x01>(carries, gf_poly());
    _mm256_xor_si256(_mm256_xor_si256(shifted, into_high), reduced)
}

/// Every lane times `a^(8 M)`: an `M`-byte shift of the lane, and the `M` bytes shifted out
/// (brought down by `TOP = 16 - M` bytes) times 0x87.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn mul_bytes<const M: i32, const TOP: i32>(t: __m256i) -> __m256i {
    const { assert!(M + TOP == 16 && M <= 7) };
    let top = _mm256_bsrli_epi128::<TOP>(t);
    _mm256_xor_si256(
        _mm256_bslli_epi128::<M>(t),
        _mm256_clmulepi64_epi128::<0x00>(top, gf_poly()),
    )
}

/// The 16 tweaks `T a^0 .. T a^15` of a group starting a unit, two per register.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn unit_tweaks(t: &Block) -> [__m256i; REGS] {
    let b = _mm256_broadcastsi128_si256(load_block(t));
    let r0 = mul_lanes(b, _mm256_set_epi64x(1, 1, 0, 0));
    let r1 = mul_lanes(b, _mm256_set_epi64x(3, 3, 2, 2));
    let r2 = mul_lanes(b, _mm256_set_epi64x(5, 5, 4, 4));
    let r3 = mul_lanes(b, _mm256_set_epi64x(7, 7, 6, 6));
    [
        r0,
        r1,
        r2,
        r3,
        mul_bytes::<1, 15>(r0),
        mul_bytes::<1, 15>(r1),
        mul_bytes::<1, 15>(r2),
        mul_bytes::<1, 15>(r3),
    ]
}

/// One group's tweaks in memory (little-endian `u128` = the block's byte order on x86).
#[repr(C, align(32))]
struct StagedTweaks([u128; GROUP_BLOCKS]);

impl StagedTweaks {
    #[inline]
    #[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
    fn load(&self) -> [__m256i; REGS] {
        let mut tw = [_mm256_setzero_si256(); REGS];
        for (v, two) in tw.iter_mut().zip(self.0.chunks_exact(2)) {
            // SAFETY: `two` is 32 readable bytes, 32-byte aligned (the array is, and each chunk
            // starts at a multiple of 32 bytes).
            *v = unsafe { _mm256_load_si256(two.as_ptr().cast()) };
        }
        tw
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels.

#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn ecb<const DEC: bool>(k: &Keys, buf: &mut [u8]) {
    let (k0, kl) = (first_key::<DEC>(k), last_key::<DEC>(k));
    for_groups(buf, |g, _| {
        let mut x = [_mm256_setzero_si256(); REGS];
        for (i, v) in x.iter_mut().enumerate() {
            *v = _mm256_xor_si256(load_reg(g, i), k0);
        }
        middle_rounds::<DEC>(k, &mut x);
        for (i, v) in x.iter().enumerate() {
            store_reg(g, i, last_round::<DEC>(*v, kl));
        }
    });
}

/// XTS on one group with its 16 tweaks. `next` makes the following group's tweaks between the
/// whitening and the rounds, so its latency overlaps this group's AES rounds.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn xts_group<const DEC: bool>(
    k: &Keys,
    g: &mut [u8; GROUP],
    tw: &[__m256i; REGS],
    next: impl FnOnce() -> [__m256i; REGS],
) -> [__m256i; REGS] {
    let k0 = first_key::<DEC>(k);
    let mut x = [_mm256_setzero_si256(); REGS];
    for (i, v) in x.iter_mut().enumerate() {
        *v = _mm256_xor_si256(_mm256_xor_si256(load_reg(g, i), tw[i]), k0);
    }
    let next = next();
    middle_rounds::<DEC>(k, &mut x);
    let kl = last_key::<DEC>(k);
    for (i, v) in x.iter().enumerate() {
        // aesenclast(x, k ^ t) = aesenclast(x, k) ^ t: the second whitening for free.
        store_reg(g, i, last_round::<DEC>(*v, _mm256_xor_si256(kl, tw[i])));
    }
    next
}

#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn xts<const DEC: bool>(k: &Keys, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
    if buf.is_empty() {
        return;
    }
    if unit_len.is_multiple_of(GROUP) {
        // Sector-sized units: groups never straddle a unit, all tweaks stay in registers.
        let groups_per_unit = unit_len / GROUP;
        let mut tw = unit_tweaks(&tweaks[0]);
        for (u, unit) in buf.chunks_exact_mut(unit_len).enumerate() {
            // Past the last unit this makes tweaks nobody uses, to keep the loop simple.
            let next_unit = tweaks.get(u + 1).unwrap_or(&tweaks[u]);
            for (gi, g) in unit.chunks_exact_mut(GROUP).enumerate() {
                tw = xts_group::<DEC>(k, g.try_into().unwrap(), &tw, || {
                    if gi + 1 < groups_per_unit {
                        tw.map(|v| mul_bytes::<2, 14>(v))
                    } else {
                        unit_tweaks(next_unit)
                    }
                });
            }
        }
    } else {
        // Other unit sizes: groups across unit boundaries, tweaks from the integer sequence
        // one group ahead.
        let mut seq = TweakSeq::new(tweaks, unit_len);
        let mut staged = StagedTweaks([0; GROUP_BLOCKS]);
        let len = buf.len();
        seq.fill(&mut staged.0, len.min(GROUP) / BLOCK);
        let mut tw = staged.load();
        for_groups(buf, |g, gi| {
            let next_blocks = len.saturating_sub((gi + 1) * GROUP).min(GROUP) / BLOCK;
            tw = xts_group::<DEC>(k, g, &tw, || {
                seq.fill(&mut staged.0, next_blocks);
                staged.load()
            });
        });
        staged.0.zeroize();
    }
}

#[target_feature(enable = "aes,sse4.1")]
fn cbc_encrypt(k: &Keys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    super::ni::cbc_encrypt(&k.narrow, buf, unit_len, ivs)
}

#[target_feature(enable = "aes,sse4.1")]
fn cbc_decrypt(k: &Keys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    super::ni::cbc_decrypt(&k.narrow, buf, unit_len, ivs)
}

#[cfg(test)]
mod tests {
    use super::super::ni::AesNi;
    use super::super::x86::testing::{self, available};
    use super::*;
    use crate::engine::BlockEngine;

    fn make(key: &[u8]) -> Box<dyn BlockEngine> {
        Box::new(Vaes256::new(key).expect("this test needs VAES + AVX2"))
    }

    #[test]
    fn standard_vectors() {
        if available(Backend::Vaes256) {
            testing::check_standard_vectors(make);
        }
    }

    #[test]
    fn matches_generic_modes() {
        if available(Backend::Vaes256) {
            // The generic modes on this engine's own ECB, on AES-NI's and on the portable AES's.
            testing::compare_with_generic(make, make, 0x5eed_0102, 120);
            testing::compare_with_generic(
                make,
                |k| Box::new(AesNi::new(k).unwrap()),
                0x5eed_0103,
                60,
            );
            testing::compare_with_generic(
                make,
                |k| Box::new(super::super::soft::AesSoft::new(k)),
                0x5eed_0105,
                25,
            );
        }
    }

    #[test]
    fn unit_tweaks_match_scalar_alpha_chain() {
        if !available(Backend::Vaes256) {
            return;
        }
        #[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
        fn lanes(t: &Block, steps: usize) -> Vec<u8> {
            let mut tw = unit_tweaks(t);
            for _ in 0..steps {
                tw = tw.map(|v| mul_bytes::<2, 14>(v));
            }
            let mut out = [0u8; GROUP];
            for (i, v) in tw.iter().enumerate() {
                store_reg(&mut out, i, *v);
            }
            out.to_vec()
        }
        for first in [
            [0xffu8; 16],
            [0x80; 16],
            core::array::from_fn(|i| (i as u8).wrapping_mul(29) ^ 0xc3),
        ] {
            let mut want = vec![0u8; GROUP * 3];
            crate::gf128::fill_tweaks(first, &mut want);
            for steps in 0..3 {
                // SAFETY: `available()` checked the target features.
                let got = unsafe { lanes(&first, steps) };
                assert_eq!(got, want[steps * GROUP..(steps + 1) * GROUP]);
            }
        }
    }
}
