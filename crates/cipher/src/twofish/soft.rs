//! Portable, constant-time Twofish: bitsliced over up to 64 blocks.
//!
//! A batch of `n <= 64` blocks is transposed so that `u64` number `b` of state word `w` holds bit
//! `b` of word `w` of every block (block `l` in bit `l`). Then:
//! - rotations are renamings of the 32 planes;
//! - `q0`/`q1` work on the eight planes of a byte: the nibble steps are XORs of planes, and each
//!   4-bit table `t0..t3` is evaluated from its algebraic normal form, computed at compile time
//!   (every branch below is on a compile-time constant, never on key or data);
//! - the MDS products are XORs of planes (multiplication by a constant is linear over GF(2));
//! - the 32-bit additions are ripple-carry adders, the subkeys all-zero or all-one planes.
//!
//! A batch costs the same for 1 or 64 blocks, so ECB takes 64 at a time. The key schedule runs
//! the same `h` with 40 lanes, each with its own input and key words ([`subkeys`]).

use super::{stages, Keys, MDS, QT};
use crate::backend::Backend;
use crate::engine::{BlockEngine, BLOCK};

/// 32 bit planes: bit `b` of a 32-bit word of every lane in `[b]`.
type Planes = [u64; 32];

/// Lanes per batch.
const LANES: usize = 64;

/// The normal forms of `QT`.
const QT_ANF: [[[u16; 4]; 4]; 2] = {
    let mut out = [[[0u16; 4]; 4]; 2];
    let mut v = 0;
    while v < 2 {
        let mut t = 0;
        while t < 4 {
            out[v][t] = crate::anf::anf(&QT[v][t]);
            t += 1;
        }
        v += 1;
    }
    out
};

/// For each MDS coefficient `MDS[i][j]` and input bit `p`, the product `MDS[i][j] * x^p`: output
/// bit `o` of byte `i` takes input bit `p` of byte `j` where bit `o` of this is set.
const MDS_BITS: [[[u8; 8]; 4]; 4] = {
    let mut out = [[[0u8; 8]; 4]; 4];
    let mut i = 0;
    while i < 4 {
        let mut j = 0;
        while j < 4 {
            let mut p = 0;
            while p < 8 {
                out[i][j][p] = super::mds_mul(1 << p, MDS[i][j]);
                p += 1;
            }
            j += 1;
        }
        i += 1;
    }
    out
};

/// A 4-bit table, given by its normal form, on four planes.
#[inline(always)]
fn table4(anf: &[u16; 4], x: [u64; 4]) -> [u64; 4] {
    let mut m = [0u64; 16];
    m[0] = !0;
    for s in 1..16usize {
        m[s] = m[s & (s - 1)] & x[s.trailing_zeros() as usize];
    }
    let mut out = [0u64; 4];
    for (o, form) in out.iter_mut().zip(anf) {
        for (s, mono) in m.iter().enumerate() {
            // `form` is a compile-time constant once inlined: this folds to plain XORs.
            if (form >> s) & 1 == 1 {
                *o ^= mono;
            }
        }
    }
    out
}

/// `q_V` on the eight planes of a byte (`x[0]` the low bit).
#[inline(always)]
fn q<const V: usize>(x: [u64; 8]) -> [u64; 8] {
    let t = &QT_ANF[V];
    let a0 = [x[4], x[5], x[6], x[7]];
    let b0 = [x[0], x[1], x[2], x[3]];
    // a1 = a0 ^ b0; b1 = a0 ^ ROR4(b0, 1) ^ 8 a0 mod 16.
    let mix = |a: [u64; 4], b: [u64; 4]| {
        (
            [a[0] ^ b[0], a[1] ^ b[1], a[2] ^ b[2], a[3] ^ b[3]],
            [a[0] ^ b[1], a[1] ^ b[2], a[2] ^ b[3], a[3] ^ b[0] ^ a[0]],
        )
    };
    let (a1, b1) = mix(a0, b0);
    let (a3, b3) = mix(table4(&t[0], a1), table4(&t[1], b1));
    let a4 = table4(&t[2], a3);
    let b4 = table4(&t[3], b3);
    [a4[0], a4[1], a4[2], a4[3], b4[0], b4[1], b4[2], b4[3]]
}

/// The S-box `s_j` (byte position `j` of `h`) on the eight planes of a byte, `l[s]` the planes of
/// the key word XORed in after stage `s`.
#[inline(always)]
fn sbox(j: usize, mut y: [u64; 8], l: &[Planes], k: usize) -> [u64; 8] {
    for (s, v) in stages(k).iter().enumerate() {
        y = if v[j] == 0 { q::<0>(y) } else { q::<1>(y) };
        if s < k {
            for (p, bit) in y.iter_mut().enumerate() {
                *bit ^= l[s][8 * j + p];
            }
        }
    }
    y
}

/// `h(x, L)` on bitsliced words, `l[s]` the planes of the key word XORed in after stage `s`
/// (lane by lane, so the key schedule can give every lane its own).
#[inline(always)]
fn h(x: &Planes, l: &[Planes], k: usize) -> Planes {
    let y: [[u64; 8]; 4] =
        core::array::from_fn(|j| sbox(j, x[8 * j..8 * j + 8].try_into().expect("8 planes"), l, k));
    mds(&y)
}

/// The four key-dependent S-boxes as 256-byte tables (`[j][x] = s_j(x)`), computed in constant
/// time: key material, for the kernels that keep them in registers.
pub(super) fn sbox_tables(k: usize, words: &[u32; 4]) -> [[u8; 256]; 4] {
    let mut l = [[0u64; 32]; 4];
    for (ls, &w) in l.iter_mut().zip(words).take(k) {
        *ls = splat(w);
    }
    let mut out = [[0u8; 256]; 4];
    for (j, table) in out.iter_mut().enumerate() {
        for (batch, entries) in table.chunks_exact_mut(LANES).enumerate() {
            // Lane `x` holds input `64 batch + x`.
            let x: [u64; 8] = core::array::from_fn(|p| {
                (0..LANES).fold(0, |plane, x| {
                    plane | ((((LANES * batch + x) >> p) & 1) as u64) << x
                })
            });
            let mut y = sbox(j, x, &l, k);
            for (x, e) in entries.iter_mut().enumerate() {
                *e = (0..8).fold(0u8, |b, p| b | ((((y[p] >> x) & 1) as u8) << p));
            }
            zeroize::Zeroize::zeroize(&mut y);
        }
    }
    zeroize::Zeroize::zeroize(&mut l);
    out
}

/// The MDS product of the four S-box outputs.
#[inline(always)]
fn mds(y: &[[u64; 8]; 4]) -> Planes {
    let mut z = [0u64; 32];
    for i in 0..4 {
        for (j, yj) in y.iter().enumerate() {
            for (p, &bit) in yj.iter().enumerate() {
                let prod = MDS_BITS[i][j][p];
                for o in 0..8 {
                    if (prod >> o) & 1 == 1 {
                        z[8 * i + o] ^= bit;
                    }
                }
            }
        }
    }
    z
}

/// Lane-wise `a + b` mod 2^32.
#[inline(always)]
fn add(a: &Planes, b: &Planes) -> Planes {
    let mut s = [0u64; 32];
    let mut carry = 0u64;
    for i in 0..32 {
        let t = a[i] ^ b[i];
        s[i] = t ^ carry;
        carry = (a[i] & b[i]) | (carry & t);
    }
    s
}

/// The same word in every lane: all-zero or all-one planes.
#[inline(always)]
fn splat(w: u32) -> Planes {
    core::array::from_fn(|b| 0u64.wrapping_sub(u64::from((w >> b) & 1)))
}

#[inline(always)]
fn rotl(x: &Planes, r: usize) -> Planes {
    core::array::from_fn(|b| x[(b + 32 - r) % 32])
}

#[inline(always)]
fn xor(a: &mut Planes, b: &Planes) {
    for (a, b) in a.iter_mut().zip(b) {
        *a ^= b;
    }
}

/// Transpose a 64x64 bit matrix in place: bit `c` of row `r` goes to bit `r` of row `c`
/// (block swaps of halves, quarters, ...; every index below is public).
fn transpose64(a: &mut [u64; 64]) {
    let mut j = 32;
    let mut m = 0x0000_0000_FFFF_FFFF_u64;
    while j != 0 {
        for k in 0..64 {
            if k & j == 0 {
                let t = ((a[k] >> j) ^ a[k + j]) & m;
                a[k] ^= t << j;
                a[k + j] ^= t;
            }
        }
        j >>= 1;
        m ^= m << j;
    }
}

/// Words `words[l]` of lanes `l` as planes.
fn to_planes(words: impl Iterator<Item = u32>) -> Planes {
    let mut p = [0u64; 32];
    for (l, w) in words.enumerate() {
        for (b, plane) in p.iter_mut().enumerate() {
            *plane |= u64::from((w >> b) & 1) << l;
        }
    }
    p
}

/// Lane `l`'s word.
fn lane(p: &Planes, l: usize) -> u32 {
    p.iter()
        .enumerate()
        .fold(0, |w, (b, plane)| w | ((((plane >> l) & 1) as u32) << b))
}

/// The 40 subkeys of a key with `k` words, `even`/`odd` the words of `M_e`/`M_o` in stage order.
pub(super) fn subkeys(k: usize, even: &[u32; 4], odd: &[u32; 4]) -> [u32; 40] {
    const RHO: u32 = 0x0101_0101;
    // Lanes 0..20: A_i = h(2i rho, M_e); lanes 20..40: h((2i+1) rho, M_o).
    let x = to_planes((0..40u32).map(|l| if l < 20 { 2 * l } else { 2 * (l - 20) + 1 } * RHO));
    let mut l = [[0u64; 32]; 4];
    for (s, ls) in l.iter_mut().enumerate().take(k) {
        *ls = to_planes((0..40).map(|lane| if lane < 20 { even[s] } else { odd[s] }));
    }
    let mut y = h(&x, &l, k);
    let mut sub = [0u32; 40];
    for i in 0..20 {
        let a = lane(&y, i);
        let b = lane(&y, 20 + i).rotate_left(8);
        sub[2 * i] = a.wrapping_add(b);
        sub[2 * i + 1] = a.wrapping_add(b).wrapping_add(b).rotate_left(9);
    }
    zeroize::Zeroize::zeroize(&mut l);
    zeroize::Zeroize::zeroize(&mut y);
    sub
}

/// Twofish on the portable backend.
pub(crate) struct TwofishSoft {
    keys: Keys,
}

impl TwofishSoft {
    pub(crate) fn new(keys: Keys) -> Self {
        TwofishSoft { keys }
    }

    /// `(F0, F1)` of the round with subkeys `K[2r + 8]`, `K[2r + 9]`.
    #[inline(always)]
    fn f(&self, l: &[Planes; 4], a: &Planes, b: &Planes, r: usize) -> (Planes, Planes) {
        let k = self.keys.k;
        let t0 = h(a, l, k);
        let t1 = h(&rotl(b, 8), l, k);
        let s = add(&t0, &t1);
        let f0 = add(&s, &splat(self.keys.sub[2 * r + 8]));
        let f1 = add(&add(&s, &t1), &splat(self.keys.sub[2 * r + 9]));
        (f0, f1)
    }

    /// Encrypt or decrypt up to 64 blocks.
    fn batch<const ENC: bool>(&self, blocks: &mut [u8]) {
        let n = blocks.len() / BLOCK;
        debug_assert!(n <= LANES);
        // Two words per 64x64 bit transpose: row `l` = words `2i`, `2i + 1` of block `l` becomes
        // rows `b` (planes of word `2i`) and `32 + b` (of word `2i + 1`).
        let mut words = [[0u64; 32]; 4];
        for half in 0..2 {
            let mut m = [0u64; 64];
            for (row, block) in m.iter_mut().zip(blocks.chunks_exact(BLOCK)) {
                let at = 8 * half;
                *row = u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes"));
            }
            transpose64(&mut m);
            words[2 * half].copy_from_slice(&m[..32]);
            words[2 * half + 1].copy_from_slice(&m[32..]);
            zeroize::Zeroize::zeroize(&mut m);
        }
        let mut l = [[0u64; 32]; 4];
        for (ls, &w) in l.iter_mut().zip(&self.keys.sbox).take(self.keys.k) {
            *ls = splat(w);
        }
        let sub = &self.keys.sub;
        // Whitening: R0_i = P_i ^ K_i in; decryption starts from R16_{(i+2) mod 4} = C_i ^ K_{i+4}.
        let (w_in, w_out) = if ENC { (0, 4) } else { (4, 0) };
        let order = if ENC { [0, 1, 2, 3] } else { [2, 3, 0, 1] };
        let mut r = [[0u64; 32]; 4];
        for (i, &w) in order.iter().enumerate() {
            r[w] = words[i];
            xor(&mut r[w], &splat(sub[w_in + i]));
        }
        zeroize::Zeroize::zeroize(&mut words);
        let [mut a, mut b, mut c, mut d] = r;
        if ENC {
            for pair in 0..8 {
                let (f0, f1) = self.f(&l, &a, &b, 2 * pair);
                xor(&mut c, &f0);
                c = rotl(&c, 31);
                d = rotl(&d, 1);
                xor(&mut d, &f1);
                let (f0, f1) = self.f(&l, &c, &d, 2 * pair + 1);
                xor(&mut a, &f0);
                a = rotl(&a, 31);
                b = rotl(&b, 1);
                xor(&mut b, &f1);
            }
        } else {
            for pair in (0..8).rev() {
                let (f0, f1) = self.f(&l, &c, &d, 2 * pair + 1);
                a = rotl(&a, 1);
                xor(&mut a, &f0);
                xor(&mut b, &f1);
                b = rotl(&b, 31);
                let (f0, f1) = self.f(&l, &a, &b, 2 * pair);
                c = rotl(&c, 1);
                xor(&mut c, &f0);
                xor(&mut d, &f1);
                d = rotl(&d, 31);
            }
        }
        let mut r = [a, b, c, d];
        // Encryption outputs C_i = R16_{(i+2) mod 4} ^ K_{i+4}; decryption P_i = R0_i ^ K_i.
        let out = if ENC { [2, 3, 0, 1] } else { [0, 1, 2, 3] };
        for (i, &w) in out.iter().enumerate() {
            xor(&mut r[w], &splat(sub[w_out + i]));
        }
        for half in 0..2 {
            let mut m = [0u64; 64];
            m[..32].copy_from_slice(&r[out[2 * half]]);
            m[32..].copy_from_slice(&r[out[2 * half + 1]]);
            transpose64(&mut m);
            for (row, block) in m.iter().zip(blocks.chunks_exact_mut(BLOCK)) {
                let at = 8 * half;
                block[at..at + 8].copy_from_slice(&row.to_le_bytes());
            }
            zeroize::Zeroize::zeroize(&mut m);
        }
        zeroize::Zeroize::zeroize(&mut l);
        zeroize::Zeroize::zeroize(&mut r);
    }
}

impl BlockEngine for TwofishSoft {
    fn backend(&self) -> Backend {
        Backend::Portable
    }

    fn encrypt_ecb(&self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(LANES * BLOCK) {
            let whole = chunk.len() - chunk.len() % BLOCK;
            self.batch::<true>(&mut chunk[..whole]);
        }
    }

    fn decrypt_ecb(&self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(LANES * BLOCK) {
            let whole = chunk.len() - chunk.len() % BLOCK;
            self.batch::<false>(&mut chunk[..whole]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::*;

    /// The normal forms give back the tables.
    #[test]
    fn normal_forms_reproduce_the_tables() {
        for v in 0..2 {
            for t in 0..4 {
                let x: [u64; 4] = core::array::from_fn(|i| {
                    (0..16u64).fold(0, |p, lane| p | (((lane >> i) & 1) << lane))
                });
                let y = table4(&QT_ANF[v][t], x);
                for (lane, &want) in QT[v][t].iter().enumerate() {
                    let got = (0..4).fold(0u8, |o, i| o | ((((y[i] >> lane) & 1) as u8) << i));
                    assert_eq!(got, want, "q{v} t{t} at {lane}");
                }
            }
        }
    }

    /// Bitsliced `q0`/`q1` and `h` agree with the textbook ones on every byte.
    #[test]
    fn bitsliced_h_matches_the_reference() {
        let keys = Keys::new(&[0x5a; 32]).unwrap();
        for k in 2..=4 {
            for base in (0..256u32).step_by(64) {
                let xs: Vec<u32> = (base..base + 64)
                    .map(|i| i.wrapping_mul(0x0103_0507) ^ 0x9e37_79b9)
                    .collect();
                let x = to_planes(xs.iter().copied());
                let l: Vec<Planes> = keys.sbox.iter().map(|&w| splat(w)).collect();
                let y = h(&x, &l, k);
                for (i, &xi) in xs.iter().enumerate() {
                    assert_eq!(lane(&y, i), reference::h(xi, &keys.sbox, k));
                }
            }
        }
    }

    /// The S-box tables give `h` back through the MDS matrix.
    #[test]
    fn sbox_tables_match_the_reference() {
        let keys = Keys::new(&[0x3c; 32]).unwrap();
        for k in 2..=4 {
            let t = sbox_tables(k, &keys.sbox);
            for x in (0..=u32::MAX).step_by(0x0101_0101 * 7 + 12345).take(300) {
                let b = x.to_le_bytes();
                let y: [u8; 4] = core::array::from_fn(|j| t[j][usize::from(b[j])]);
                let mut z = [0u8; 4];
                for (i, zi) in z.iter_mut().enumerate() {
                    for (j, &yj) in y.iter().enumerate() {
                        *zi ^= crate::twofish::mds_mul(yj, MDS[i][j]);
                    }
                }
                assert_eq!(u32::from_le_bytes(z), reference::h(x, &keys.sbox, k));
            }
        }
    }

    #[test]
    fn transpose64_transposes() {
        let mut a: [u64; 64] =
            core::array::from_fn(|i| (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let orig = a;
        transpose64(&mut a);
        for (r, row) in a.iter().enumerate() {
            for (c, col) in orig.iter().enumerate() {
                assert_eq!((row >> c) & 1, (col >> r) & 1);
            }
        }
    }

    #[test]
    fn batches_match_the_reference() {
        for key_len in [16, 24, 32] {
            let key: Vec<u8> = (0..key_len as u8)
                .map(|i| i.wrapping_mul(37) ^ 0xa5)
                .collect();
            let keys = Keys::new(&key).unwrap();
            let mut expect = [0u8; 70 * BLOCK];
            for (i, b) in expect.iter_mut().enumerate() {
                *b = (i * 7 + 3) as u8;
            }
            let plain = expect;
            for block in expect.chunks_exact_mut(BLOCK) {
                reference::encrypt(&keys, block.try_into().unwrap());
            }
            let engine = TwofishSoft::new(keys);
            let mut got = plain;
            engine.encrypt_ecb(&mut got);
            assert_eq!(got, expect);
            engine.decrypt_ecb(&mut got);
            assert_eq!(got, plain);
        }
    }
}
