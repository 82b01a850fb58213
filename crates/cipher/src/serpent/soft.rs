//! Serpent's tables, key schedule and portable engine (one block at a time, the round code of
//! [`super::rounds`] over `u32` words): each round applies one of eight 4-bit S-boxes to the 32
//! bit columns of the four 32-bit words at once. Each output bit of an S-box is written as its
//! algebraic normal form (an XOR of ANDs of the input bits), computed from the S-box table at
//! compile time, so the round is a few dozen word ANDs and XORs. It is ~15 times faster than
//! RustCrypto's `serpent` 0.5, which applies the tables one bit column at a time, and that version
//! also indexes the tables by data.

use zeroize::Zeroize;

use crate::backend::Backend;
use crate::engine::{BlockEngine, BLOCK};

const PHI: u32 = 0x9e37_79b9;

/// The eight S-boxes of the specification.
const SBOXES: [[u8; 16]; 8] = [
    [3, 8, 15, 1, 10, 6, 5, 11, 14, 13, 4, 2, 7, 0, 9, 12],
    [15, 12, 2, 7, 9, 0, 5, 10, 1, 11, 14, 8, 6, 13, 3, 4],
    [8, 6, 7, 9, 3, 12, 10, 15, 13, 1, 14, 4, 0, 11, 5, 2],
    [0, 15, 11, 8, 12, 9, 6, 3, 13, 1, 2, 4, 10, 7, 5, 14],
    [1, 15, 8, 3, 12, 0, 11, 6, 2, 5, 4, 10, 9, 14, 7, 13],
    [15, 5, 2, 11, 4, 10, 9, 12, 0, 3, 14, 8, 13, 6, 7, 1],
    [7, 2, 12, 5, 8, 4, 6, 11, 14, 9, 1, 15, 13, 3, 10, 0],
    [1, 13, 15, 0, 14, 8, 2, 11, 7, 4, 12, 10, 9, 3, 5, 6],
];

/// The inverse of a 4-bit permutation.
const fn inverse(s: [u8; 16]) -> [u8; 16] {
    let mut r = [0u8; 16];
    let mut x = 0;
    while x < 16 {
        r[s[x] as usize] = x as u8;
        x += 1;
    }
    r
}

const fn all_anf(inverted: bool) -> [[u16; 4]; 8] {
    let mut out = [[0u16; 4]; 8];
    let mut i = 0;
    while i < 8 {
        out[i] = crate::anf::anf(&if inverted {
            inverse(SBOXES[i])
        } else {
            SBOXES[i]
        });
        i += 1;
    }
    out
}

pub(crate) const FORWARD: [[u16; 4]; 8] = all_anf(false);
pub(crate) const BACKWARD: [[u16; 4]; 8] = all_anf(true);

type W = u32;

#[inline(always)]
fn and(a: u32, b: u32) -> u32 {
    a & b
}

#[inline(always)]
fn xor(a: u32, b: u32) -> u32 {
    a ^ b
}

#[inline(always)]
fn not(a: u32) -> u32 {
    !a
}

#[inline(always)]
fn rol<const N: i32>(x: u32) -> u32 {
    x.rotate_left(N as u32)
}

#[inline(always)]
fn shl<const N: i32>(x: u32) -> u32 {
    x << N
}

#[inline(always)]
fn splat(k: u32) -> u32 {
    k
}

super::rounds::serpent_rounds!(#[inline(always)]);

/// S-box `i` (its inverse if `inv`) with `i` known only at run time: a public round index (the
/// key schedule) or a test's.
fn sbox_at(i: usize, inv: bool, x: [u32; 4]) -> [u32; 4] {
    match (i, inv) {
        (0, false) => sbox::<0, false>(x),
        (1, false) => sbox::<1, false>(x),
        (2, false) => sbox::<2, false>(x),
        (3, false) => sbox::<3, false>(x),
        (4, false) => sbox::<4, false>(x),
        (5, false) => sbox::<5, false>(x),
        (6, false) => sbox::<6, false>(x),
        (7, false) => sbox::<7, false>(x),
        (0, true) => sbox::<0, true>(x),
        (1, true) => sbox::<1, true>(x),
        (2, true) => sbox::<2, true>(x),
        (3, true) => sbox::<3, true>(x),
        (4, true) => sbox::<4, true>(x),
        (5, true) => sbox::<5, true>(x),
        (6, true) => sbox::<6, true>(x),
        (7, true) => sbox::<7, true>(x),
        _ => unreachable!("Serpent has eight S-boxes"),
    }
}

/// Serpent's 33 round keys, which every backend runs from; zeroized on drop.
pub(crate) struct RoundKeys([[u32; 4]; 33]);

impl RoundKeys {
    /// The round keys of `key` (1 to 32 bytes; shorter keys are padded with a one bit and zeros,
    /// as the specification says).
    pub(crate) fn new(key: &[u8]) -> Option<RoundKeys> {
        if key.is_empty() || key.len() > 32 {
            return None;
        }
        let mut padded = [0u8; 32];
        padded[..key.len()].copy_from_slice(key);
        if key.len() < 32 {
            padded[key.len()] = 1;
        }
        let mut w = [0u32; 140];
        for (word, bytes) in w.iter_mut().zip(padded.chunks_exact(4)) {
            *word = u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
        }
        for i in 0..132 {
            w[i + 8] = (w[i] ^ w[i + 3] ^ w[i + 5] ^ w[i + 7] ^ PHI ^ i as u32).rotate_left(11);
        }
        let mut keys = RoundKeys([[0u32; 4]; 33]);
        for (r, k) in keys.0.iter_mut().enumerate() {
            let words = [w[8 + 4 * r], w[9 + 4 * r], w[10 + 4 * r], w[11 + 4 * r]];
            *k = sbox_at((35 - r) % 8, false, words);
        }
        padded.zeroize();
        w.zeroize();
        Some(keys)
    }

    /// The keys, for the rounds.
    pub(crate) fn words(&self) -> &[[u32; 4]; 33] {
        &self.0
    }
}

impl Drop for RoundKeys {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// Encrypt one block in place (16 bytes).
pub(crate) fn encrypt_block(keys: &RoundKeys, block: &mut [u8]) {
    store(encrypt_words(keys.words(), load(block)), block);
}

/// Decrypt one block in place (16 bytes).
pub(crate) fn decrypt_block(keys: &RoundKeys, block: &mut [u8]) {
    store(decrypt_words(keys.words(), load(block)), block);
}

fn load(block: &[u8]) -> [u32; 4] {
    let w = |i: usize| u32::from_le_bytes(block[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    [w(0), w(1), w(2), w(3)]
}

fn store(x: [u32; 4], block: &mut [u8]) {
    for (i, w) in x.iter().enumerate() {
        block[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
}

/// Serpent in portable Rust, one block at a time.
pub(crate) struct SerpentSoft {
    keys: RoundKeys,
}

impl SerpentSoft {
    /// Serpent with `key` (1 to 32 bytes).
    pub(crate) fn new(key: &[u8]) -> Option<SerpentSoft> {
        RoundKeys::new(key).map(|keys| SerpentSoft { keys })
    }
}

impl BlockEngine for SerpentSoft {
    fn backend(&self) -> Backend {
        Backend::Portable
    }

    fn encrypt_ecb(&self, buf: &mut [u8]) {
        for block in buf.chunks_exact_mut(BLOCK) {
            encrypt_block(&self.keys, block);
        }
    }

    fn decrypt_ecb(&self, buf: &mut [u8]) {
        for block in buf.chunks_exact_mut(BLOCK) {
            decrypt_block(&self.keys, block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The algebraic normal forms give back every S-box and its inverse on all 16 inputs, each
    /// input spread over a different bit column.
    #[test]
    fn normal_forms_reproduce_the_tables() {
        for (i, s) in SBOXES.iter().enumerate() {
            for (inv, table) in [(false, *s), (true, inverse(*s))] {
                let mut x = [0u32; 4];
                for v in 0..16u32 {
                    for (bit, word) in x.iter_mut().enumerate() {
                        *word |= ((v >> bit) & 1) << (2 * v);
                    }
                }
                let y = sbox_at(i, inv, x);
                for v in 0..16u32 {
                    let out: u32 = (0..4).map(|bit| ((y[bit] >> (2 * v)) & 1) << bit).sum();
                    assert_eq!(out, u32::from(table[v as usize]), "S{i}({v})");
                }
            }
        }
    }

    #[test]
    fn decrypt_inverts_encrypt() {
        for len in [1, 16, 20, 24, 32] {
            let key: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37)).collect();
            let keys = RoundKeys::new(&key).unwrap();
            let mut block: Vec<u8> = (0..16u8).collect();
            encrypt_block(&keys, &mut block);
            assert_ne!(block, (0..16u8).collect::<Vec<_>>());
            decrypt_block(&keys, &mut block);
            assert_eq!(block, (0..16u8).collect::<Vec<_>>(), "{len}-byte key");
        }
        assert!(RoundKeys::new(&[]).is_none() && RoundKeys::new(&[0; 33]).is_none());
    }
}
