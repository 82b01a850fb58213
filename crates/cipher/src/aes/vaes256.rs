//! VAES backend on 256-bit registers (AVX2 + VAES + VPCLMULQDQ, no AVX-512): two AES blocks per
//! `ymm`, eight registers (16 blocks) in flight. It is for CPUs that have VAES but not AVX-512
//! (AMD Zen 3, Intel's client cores since Alder Lake), where `vaesenc ymm` issues as often as
//! `aesenc xmm` and so does twice the AES-NI kernel's work per cycle.
//!
//! - Round keys are stored as 16 bytes each (one `RoundKeys` for these kernels and the AES-NI
//!   CBC ones) and broadcast to both lanes as they are loaded (`vbroadcasti128`, a plain load).
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

use super::x86::{Rk128, RoundKeys, TweakSeq};
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

/// Proof that the CPU runs every feature the kernels enable: only [`Vaes256::new`] makes one.
#[derive(Clone, Copy)]
struct CpuHasVaes256(());

/// AES on VAES + AVX2.
pub(crate) struct Vaes256 {
    keys: RoundKeys,
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
        let keys = unsafe { RoundKeys::expand(key) };
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
fn rk(k: &Rk128) -> __m256i {
    // SAFETY: `Rk128` is 16 bytes with 16-byte alignment.
    _mm256_broadcastsi128_si256(unsafe { _mm_load_si128(k.0.as_ptr().cast()) })
}

/// Register `i` of a whole group.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn load_reg(g: &[u8], i: usize) -> __m256i {
    let r: &[u8; REG] = g[i * REG..(i + 1) * REG].try_into().unwrap();
    // SAFETY: `r` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(r.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn store_reg(g: &mut [u8], i: usize, v: __m256i) {
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
fn for_groups(buf: &mut [u8], mut f: impl FnMut(&mut [u8], usize)) {
    let mut groups = buf.chunks_exact_mut(GROUP);
    let mut index = 0;
    for g in &mut groups {
        f(g, index);
        index += 1;
    }
    let tail = groups.into_remainder();
    if !tail.is_empty() {
        let mut pad = [0u8; GROUP];
        pad[..tail.len()].copy_from_slice(tail);
        f(&mut pad, index);
        tail.copy_from_slice(&pad[..tail.len()]);
        crate::wipe::zero(&mut pad);
    }
}

/// `b` in both lanes.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn broadcast_block(b: &Block) -> __m256i {
    _mm256_broadcastsi128_si256(load_block(b))
}

/// Counter offsets of a register's two lanes (in each lane's lowest 32 bits), and two: the step
/// to the next register.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn ctr_lanes() -> (__m256i, __m256i) {
    (
        _mm256_set_epi32(0, 0, 0, 1, 0, 0, 0, 0),
        _mm256_set_epi32(0, 0, 0, 2, 0, 0, 0, 2),
    )
}

/// `x ^ y ^ z`.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn xor3(x: __m256i, y: __m256i, z: __m256i) -> __m256i {
    _mm256_xor_si256(_mm256_xor_si256(x, y), z)
}

super::wide::vaes_common! {
    feature: "avx2,vaes,vpclmulqdq,aes,sse4.1",
    reg: __m256i,
    keys: RoundKeys,
    group_step: mul_a16,
    align: 32,
    load_aligned: _mm256_load_si256,
    stream: _mm256_stream_si256,
    zero: _mm256_setzero_si256,
    xor: _mm256_xor_si256,
    aesenc: _mm256_aesenc_epi128,
    aesdec: _mm256_aesdec_epi128,
    aesenclast: _mm256_aesenclast_epi128,
    aesdeclast: _mm256_aesdeclast_epi128,
    set1_epi64: _mm256_set1_epi64x,
    sllv: _mm256_sllv_epi64,
    srlv: _mm256_srlv_epi64,
    sub: _mm256_sub_epi64,
    bslli: _mm256_bslli_epi128,
    bsrli: _mm256_bsrli_epi128,
    clmul: _mm256_clmulepi64_epi128,
    add32: _mm256_add_epi32,
    shuffle: _mm256_shuffle_epi8,
}

// ---------------------------------------------------------------------------------------------
// XTS tweaks: two per register.

/// Every lane times `a^16` (the step from one 16-block group to the next).
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn mul_a16(t: __m256i) -> __m256i {
    mul_bytes::<2, 14>(t)
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

// ---------------------------------------------------------------------------------------------
// Kernels.

#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
fn ecb<const DEC: bool>(k: &RoundKeys, buf: &mut [u8]) {
    let (k0, kl) = (first_key::<DEC>(k), last_key::<DEC>(k));
    for_groups(buf, |g, _| {
        let mut x = [_mm256_setzero_si256(); REGS];
        for (i, v) in x.iter_mut().enumerate() {
            *v = _mm256_xor_si256(load_reg(g, i), k0);
        }
        middle_rounds::<REGS, DEC>(k, &mut x);
        for (i, v) in x.iter().enumerate() {
            store_reg(g, i, last_round::<DEC>(*v, kl));
        }
    });
}

#[target_feature(enable = "aes,sse4.1")]
fn cbc_encrypt(k: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    super::ni::cbc_encrypt(k, buf, unit_len, ivs)
}

#[target_feature(enable = "aes,sse4.1")]
fn cbc_decrypt(k: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
    super::ni::cbc_decrypt(k, buf, unit_len, ivs)
}

#[cfg(test)]
mod tests {
    use super::super::x86::testing::{self, require};
    use super::*;
    use crate::engine::BlockEngine;

    #[cfg_attr(not(cpu_vaes256), ignore = "this CPU lacks VAES with AVX2")]
    #[test]
    fn standard_vectors_and_generic_modes() {
        {
            require(Backend::Vaes256);
            testing::check_wide_backend(
                |k| {
                    Box::new(Vaes256::new(k).expect("this test needs VAES + AVX2"))
                        as Box<dyn BlockEngine>
                },
                0x5eed_0102,
            );
        }
    }

    #[cfg_attr(not(cpu_vaes256), ignore = "this CPU lacks VAES with AVX2")]
    #[test]
    fn unit_tweaks_match_scalar_alpha_chain() {
        require(Backend::Vaes256);
        #[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,sse4.1")]
        fn lanes(t: &Block, steps: usize) -> Vec<u8> {
            let mut tw = unit_tweaks(t);
            for _ in 0..steps {
                tw = next_group(&tw);
            }
            let mut out = [0u8; GROUP];
            for (i, v) in tw.iter().enumerate() {
                store_reg(&mut out, i, *v);
            }
            out.to_vec()
        }
        // SAFETY: `require` checked the target features.
        testing::check_register_tweaks(GROUP, |t, steps| unsafe { lanes(t, steps) });
    }
}
