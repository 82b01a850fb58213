//! LRW (Liskov-Rivest-Wagner, the IEEE P1619 drafts' tweakable mode; dm-crypt's `lrw`, usually
//! `aes-lrw-benbi`): each 16-byte block j of a sector is `C = E_K1(P ^ T) ^ T` with
//! `T = K2 * (I + j)` in GF(2^128), where the key is `K1 || K2` (the tweak key K2 is the last 16
//! bytes) and `I` is the sector's IV read as a 128-bit big-endian block index (benbi's count).
//!
//! Field elements are 128-bit big-endian integers whose bit i is the coefficient of x^i, reduced
//! by x^128 + x^7 + x^2 + x + 1 (the kernel's "bbe" convention). As in the kernel, the tweak of
//! the next block is the last one XORed with a precomputed `K2 * (2^(k+1) - 1)`, where k is the
//! count of trailing one bits of the index: the index is the public sector position, so the
//! table lookup reveals nothing about the key; the one full multiplication per sector runs in
//! constant time over the key.

use sectorcrypt_secret::SecretBox;
use zeroize::Zeroize;

use crate::backend::{Algorithm, BackendChoice};
use crate::engine::{BlockEngine, Direction, BLOCK};
use crate::error::Error;

/// `v * x` in GF(2^128), constant time.
fn mul_x(v: u128) -> u128 {
    (v << 1) ^ ((v >> 127).wrapping_neg() & 0x87)
}

/// `a * b` in GF(2^128), constant time in both.
fn mul(a: u128, b: u128) -> u128 {
    let (mut acc, mut v) = (0u128, a);
    for i in 0..128 {
        acc ^= v & ((b >> i) & 1).wrapping_neg();
        v = mul_x(v);
    }
    acc
}

/// A keyed LRW: the data cipher and the tweak key's table.
pub struct Lrw {
    data: Box<dyn BlockEngine>,
    /// Derived from the tweak key, so kept in secret memory as the key is.
    tweak: SecretBox<TweakTable>,
}

/// The tweak key K2 and its multiples.
struct TweakTable {
    k2: u128,
    /// `increments[k] = K2 * (2^(k+1) - 1)`: what the tweak changes by when the index's lowest
    /// k+1 bits flip.
    increments: [u128; 128],
}

impl Drop for TweakTable {
    fn drop(&mut self) {
        self.k2.zeroize();
        self.increments.zeroize();
    }
}

impl Lrw {
    /// LRW over `alg` with `key` = the cipher key || the 16-byte tweak key.
    pub fn new(alg: Algorithm, key: &[u8], choice: BackendChoice) -> Result<Lrw, Error> {
        if key.len() <= BLOCK {
            return Err(Error::KeySize {
                spec: format!("{}-lrw", alg.name()),
                bits: key.len() * 8,
                allowed: "the cipher key and a 128-bit tweak key",
            });
        }
        let (k1, k2) = key.split_at(key.len() - BLOCK);
        let k2: &[u8; BLOCK] = k2.try_into().expect("16 bytes");
        Ok(Lrw::from_engine(crate::block_cipher(alg, k1, choice)?, k2))
    }

    /// `data` keyed with K1, and `tweak_key` (K2, 16 bytes).
    fn from_engine(data: Box<dyn BlockEngine>, tweak_key: &[u8; BLOCK]) -> Lrw {
        let mut tweak = SecretBox::new(TweakTable {
            k2: 0,
            increments: [0; 128],
        });
        // The multiplications leave the tweak key and its multiples in registers and spilled to
        // the stack (a release build left K2 there), so they run below a wipe.
        crate::wiping(|| {
            tweak.k2 = u128::from_be_bytes(*tweak_key);
            let mut mask: u128 = 0;
            for k in 0..128 {
                mask |= 1 << k;
                tweak.increments[k] = mul(tweak.k2, mask);
            }
        });
        Lrw { data, tweak }
    }

    /// Encrypt or decrypt one unit whose first block has the index `iv` (big endian).
    ///
    /// Errors: [`Error::NotWholeSectors`] unless `buf` is whole 16-byte blocks.
    pub fn unit(&self, buf: &mut [u8], iv: &[u8; BLOCK], dir: Direction) -> Result<(), Error> {
        if !buf.len().is_multiple_of(BLOCK) {
            return Err(Error::NotWholeSectors {
                len: buf.len(),
                sector_size: BLOCK,
            });
        }
        // The tweaks are walked twice, around the block cipher, rather than kept: a sector's
        // worth of them (4 KiB) sat in this frame, below the sector layer's wipe, and AES-LRW
        // then left key-derived bytes deeper than that wipe reaches.
        let first = u128::from_be_bytes(*iv);
        let mut t0 = mul(self.tweak.k2, first);
        self.xor_tweaks(buf, first, t0);
        match dir {
            Direction::Encrypt => self.data.encrypt_ecb(buf),
            Direction::Decrypt => self.data.decrypt_ecb(buf),
        }
        self.xor_tweaks(buf, first, t0);
        // Tweaks are key-derived.
        t0.zeroize();
        Ok(())
    }

    /// XOR block j of `buf` with the tweak of index `first + j`; `t0` is the tweak of `first`.
    fn xor_tweaks(&self, buf: &mut [u8], first: u128, t0: u128) {
        let (mut index, mut t) = (first, t0);
        for block in buf.chunks_exact_mut(BLOCK) {
            for (b, k) in block.iter_mut().zip(t.to_be_bytes()) {
                *b ^= k;
            }
            t ^= self.tweak.increments[(index.trailing_ones() as usize).min(127)];
            index = index.wrapping_add(1);
        }
        t.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_arithmetic() {
        // x * x^127 = x^128 = x^7 + x^2 + x + 1.
        assert_eq!(mul(2, 1 << 127), 0x87);
        assert_eq!(mul(1, 0x1234), 0x1234);
        let (a, b, c) = (
            0x0123_4567_89ab_cdef_u128 << 40 | 77,
            0xfeed_u128 << 100 | 5,
            99u128,
        );
        assert_eq!(mul(a, b), mul(b, a));
        assert_eq!(mul(a, b ^ c), mul(a, b) ^ mul(a, c));
        // Increments: K2*(i+1) = K2*i ^ increments[trailing_ones(i)].
        let key = [[7u8; 16], [0x5a; 16]].concat();
        let lrw = Lrw::new(Algorithm::Aes, &key, BackendChoice::Auto).unwrap();
        for i in [0u128, 1, 2, 3, 7, 8, 255, u64::MAX as u128, u128::MAX - 1] {
            let step = lrw.tweak.increments[(i.trailing_ones() as usize).min(127)];
            assert_eq!(
                mul(lrw.tweak.k2, i) ^ step,
                mul(lrw.tweak.k2, i.wrapping_add(1)),
                "{i}"
            );
        }
    }
}
