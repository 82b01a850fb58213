//! Multiplication by the primitive element alpha (x) in GF(2^128) with the XTS reduction
//! polynomial x^128 + x^7 + x^2 + x + 1, in the IEEE 1619 byte order (the tweak is a
//! little-endian 128-bit integer).
//!
//! Constant time: the carry-out bit selects the reduction constant through a mask, not a branch.

use crate::engine::{Block, BLOCK};

/// `t * alpha`.
#[inline]
pub fn mul_alpha(t: Block) -> Block {
    let v = u128::from_le_bytes(t);
    let carry = (v >> 127) as u8;
    let reduced = (v << 1) ^ u128::from(0u8.wrapping_sub(carry) & 0x87);
    reduced.to_le_bytes()
}

/// Write the tweaks `first, first*alpha, first*alpha^2, ...` into `out` (one per 16-byte block)
/// and return the tweak that would follow the last one.
#[inline]
pub fn fill_tweaks(first: Block, out: &mut [u8]) -> Block {
    let mut v = u128::from_le_bytes(first);
    for slot in out.chunks_exact_mut(BLOCK) {
        slot.copy_from_slice(&v.to_le_bytes());
        let carry = (v >> 127) as u8;
        v = (v << 1) ^ u128::from(0u8.wrapping_sub(carry) & 0x87);
    }
    v.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_reduces_the_top_bit() {
        let mut t = [0u8; 16];
        t[15] = 0x80;
        let mut want = [0u8; 16];
        want[0] = 0x87;
        assert_eq!(mul_alpha(t), want);
        let mut one = [0u8; 16];
        one[0] = 1;
        let mut two = [0u8; 16];
        two[0] = 2;
        assert_eq!(mul_alpha(one), two);
    }

    #[test]
    fn fill_matches_repeated_multiplication() {
        let first: Block = core::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0xa5);
        let mut out = [0u8; 16 * 40];
        let next = fill_tweaks(first, &mut out);
        let mut t = first;
        for slot in out.chunks_exact(16) {
            assert_eq!(slot, t);
            t = mul_alpha(t);
        }
        assert_eq!(next, t);
    }
}
