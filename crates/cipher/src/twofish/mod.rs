//! Twofish (Schneier et al., 1998), constant time on every backend.
//!
//! The fast table form of Twofish (key-dependent S-boxes and the MDS matrix folded into four
//! 256-entry tables indexed by data) leaks the data through the cache, and the table-free form
//! (RustCrypto's `twofish`, which sectorcrypt used before) re-evaluates the S-boxes from `q0`/`q1`
//! tables that are indexed by data just the same. Here no table is ever indexed by key or data:
//!
//! - `q0` and `q1` are built, as the specification defines them, from four 4-bit tables each
//!   (`t0..t3`) and nibble arithmetic. A 16-entry table is exactly one in-register byte shuffle
//!   (`vpshufb`), whose timing does not depend on the indices, so the AVX2 and AVX-512BW
//!   backends evaluate the key-dependent S-boxes `s0..s3` nibble by nibble on 32 or 64 bytes at
//!   once (`simd`, `avx2`, `avx512`). Byte `j` of every 32-bit lane goes through `s_j`, whose
//!   `q0`/`q1` order differs per position: each lookup is done with both tables and blended per
//!   byte position.
//! - With AVX-512VBMI the whole S-boxes `s0..s3` (4 x 256 bytes, computed in constant time at
//!   key set-up: [`Keys::tables`]) fit in sixteen registers, and `vpermi2b` (a register
//!   permutation, as data-independent in time as `vpshufb`) looks up 128 entries at once.
//! - The MDS multiply over GF(2^8) mod 0x169 is linear over GF(2): a product by 0x5B or 0xEF is
//!   two nibble shuffles, and the byte placement of the matrix five constant shuffles.
//! - The portable backend (`soft`) is bitsliced: up to 64 blocks, one bit of each per `u64`
//!   lane, the 4-bit tables as their algebraic normal forms (ANDs and XORs), the 32-bit
//!   additions as ripple-carry adders. The key schedule uses the same bitsliced `h` (its 40
//!   evaluations are 40 lanes), and the RS code multiplies with masks instead of branches.
//!
//! Backends: portable, AVX2 (eight blocks per set), AVX-512 (sixteen blocks per set; the whole
//! S-boxes with AVX-512VBMI, else the nibble S-boxes with the AVX-512BW blend by
//! merge-masking). The engines hold [`Keys`], zeroized on drop; the kernels zeroize the key
//! material they copy to the stack (register spills the compiler adds are beyond reach, as in
//! the other kernels), and every keyed call ends by clearing the vector registers
//! (`engine::keyed`).

pub(crate) mod soft;

#[cfg(target_arch = "x86_64")]
mod simd;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 kernels
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512BW kernels
pub(crate) mod avx512;

use zeroize::Zeroize;

use crate::backend::Backend;
use crate::engine::{keyed, BlockEngine};

/// A keyed Twofish engine on `backend`. `key` is 16, 24 or 32 bytes (checked by the caller); the
/// backend has been checked to run on this CPU. `Backend::Avx512` needs AVX-512BW besides the
/// AVX-512F that `Backend::is_available` checks: on a CPU with F but not BW (Xeon Phi) the AVX2
/// kernels run instead, and the engine reports `avx2`.
pub(crate) fn new_engine(key: &[u8], backend: Backend) -> Option<Box<dyn BlockEngine>> {
    debug_assert!(matches!(key.len(), 16 | 24 | 32));
    match backend {
        Backend::Portable => keyed(|| Keys::new(key).map(soft::TwofishSoft::new)),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => keyed(|| avx2::TwofishAvx2::new(key)),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => {
            if avx512::vbmi::runs_here() {
                keyed(|| avx512::vbmi::TwofishAvx512Vbmi::new(key))
            } else if avx512::bw::runs_here() {
                keyed(|| avx512::bw::TwofishAvx512::new(key))
            } else {
                keyed(|| avx2::TwofishAvx2::new(key))
            }
        }
        _ => None,
    }
}

/// The 4-bit tables `t0..t3` of `q0` (index 0) and `q1` (index 1), from the specification.
pub(crate) const QT: [[[u8; 16]; 4]; 2] = [
    [
        [8, 1, 7, 13, 6, 15, 3, 2, 0, 11, 5, 9, 14, 12, 10, 4],
        [14, 12, 11, 8, 1, 2, 3, 5, 15, 4, 10, 6, 7, 0, 9, 13],
        [11, 10, 5, 14, 6, 13, 9, 0, 12, 8, 15, 3, 2, 4, 7, 1],
        [13, 7, 15, 4, 1, 2, 6, 14, 9, 11, 3, 0, 8, 5, 12, 10],
    ],
    [
        [2, 8, 11, 13, 15, 7, 6, 14, 3, 1, 9, 4, 0, 10, 12, 5],
        [1, 14, 2, 11, 4, 12, 3, 7, 6, 13, 10, 5, 15, 9, 0, 8],
        [4, 12, 7, 5, 1, 6, 9, 10, 0, 14, 13, 8, 2, 11, 3, 15],
        [11, 9, 5, 1, 12, 3, 13, 14, 6, 4, 7, 15, 2, 0, 8, 10],
    ],
];

/// Which `q` (0 or 1) each byte position of `h` goes through, stage by stage, for a 256-bit
/// key; shorter keys skip the first stages (a 192-bit key the first, a 128-bit key two). A key
/// word is XORed in after every stage but the last.
pub(crate) const STAGES: [[u8; 4]; 5] = [
    [1, 0, 0, 1],
    [1, 1, 0, 0],
    [0, 1, 0, 1],
    [0, 0, 1, 1],
    [1, 0, 1, 0],
];

/// The stages of `h` for a key of `k` 64-bit words.
pub(crate) fn stages(k: usize) -> &'static [[u8; 4]] {
    &STAGES[4 - k..]
}

/// The MDS matrix of `g` (GF(2^8) mod x^8 + x^6 + x^5 + x^3 + 1).
pub(crate) const MDS: [[u8; 4]; 4] = [
    [0x01, 0xEF, 0x5B, 0x5B],
    [0x5B, 0xEF, 0xEF, 0x01],
    [0xEF, 0x5B, 0x01, 0xEF],
    [0xEF, 0x01, 0xEF, 0x5B],
];
const MDS_POLY: u8 = 0x69;

/// The Reed-Solomon code that makes the S-box key words (GF(2^8) mod x^8 + x^6 + x^3 + x^2 + 1).
const RS: [[u8; 8]; 4] = [
    [0x01, 0xA4, 0x55, 0x87, 0x5A, 0x58, 0xDB, 0x9E],
    [0xA4, 0x56, 0x82, 0xF3, 0x1E, 0xC6, 0x68, 0xE5],
    [0x02, 0xA1, 0xFC, 0xC1, 0x47, 0xAE, 0x3D, 0x19],
    [0xA4, 0x55, 0x87, 0x5A, 0x58, 0xDB, 0x9E, 0x03],
];
const RS_POLY: u8 = 0x4D;

/// `a * c` in GF(2^8) mod `0x100 | poly`, in constant time in `a` (`c` may be secret too: every
/// bit is a mask, not a branch).
pub(crate) const fn gf_mul(mut a: u8, c: u8, poly: u8) -> u8 {
    let mut r = 0u8;
    let mut bit = 0;
    while bit < 8 {
        r ^= a & 0u8.wrapping_sub((c >> bit) & 1);
        a = (a << 1) ^ (poly & 0u8.wrapping_sub(a >> 7));
        bit += 1;
    }
    r
}

/// `a * c` in the MDS field.
pub(crate) const fn mds_mul(a: u8, c: u8) -> u8 {
    gf_mul(a, c, MDS_POLY)
}

/// The linear nibble maps of `q`: `b1 = M(a0) ^ R(b0)` with `M(a) = a ^ (8a mod 16)` and
/// `R(b) = ROR4(b, 1)`.
pub(crate) const fn nib_m(a: u8) -> u8 {
    (a ^ (a << 3)) & 15
}

/// See [`nib_m`].
pub(crate) const fn nib_r(b: u8) -> u8 {
    ((b >> 1) | (b << 3)) & 15
}

/// A Twofish key schedule: the 40 subkeys and, in the order `h` XORs them in (stage by stage),
/// the S-box key words, with the nibble forms the SIMD kernels use. Key material: kept inside
/// the keyed engine (secret memory) and zeroized on drop.
pub(crate) struct Keys {
    /// Number of 64-bit key words: 2, 3 or 4.
    pub(crate) k: usize,
    /// `K0..K39`.
    pub(crate) sub: [u32; 40],
    /// The word XORed into the bytes after stage `s` of `g` (`S_s`; only `k` are used).
    pub(crate) sbox: [u32; 4],
    /// Per stage, for each key byte `(kh, kl)` (high and low nibble), `kh ^ kl` ...
    pub(crate) c1: [u32; 4],
    /// ... and `M(kh) ^ R(kl)`: what the key byte adds to the next `q`'s `a1` and `b1`.
    pub(crate) c2: [u32; 4],
    /// The key-dependent S-boxes as tables, `[j][x] = s_j(x)`, for the AVX-512VBMI kernels
    /// (which hold them in registers); computed in constant time, never indexed in memory.
    pub(crate) tables: [[u8; 256]; 4],
}

impl Keys {
    /// The schedule of `key` (16, 24 or 32 bytes), in constant time.
    pub(crate) fn new(key: &[u8]) -> Option<Keys> {
        if !matches!(key.len(), 16 | 24 | 32) {
            return None;
        }
        let k = key.len() / 8;
        let mut m = [0u32; 8];
        for (w, b) in m.iter_mut().zip(key.chunks_exact(4)) {
            *w = u32::from_le_bytes(b.try_into().expect("4 bytes"));
        }
        // S_i = RS . (m_8i .. m_8i+7); g XORs S_0 in after its first stage, S_{k-1} last.
        let mut sbox = [0u32; 4];
        for (i, s) in sbox.iter_mut().take(k).enumerate() {
            let mut bytes = [0u8; 4];
            for (row, out) in RS.iter().zip(bytes.iter_mut()) {
                for (c, &coef) in row.iter().enumerate() {
                    *out ^= gf_mul(key[8 * i + c], coef, RS_POLY);
                }
            }
            *s = u32::from_le_bytes(bytes);
            bytes.zeroize();
        }
        // h(X, L) XORs L_{k-1} in first and L_0 last, with L = M_e (even words) for A_i and
        // M_o (odd words) for B_i.
        let mut even = [0u32; 4];
        let mut odd = [0u32; 4];
        for s in 0..k {
            even[s] = m[2 * (k - 1 - s)];
            odd[s] = m[2 * (k - 1 - s) + 1];
        }
        let mut sub = soft::subkeys(k, &even, &odd);
        let mut c1 = [0u32; 4];
        let mut c2 = [0u32; 4];
        for s in 0..k {
            let b = sbox[s].to_le_bytes();
            let n1: [u8; 4] = core::array::from_fn(|j| (b[j] >> 4) ^ (b[j] & 15));
            let n2: [u8; 4] = core::array::from_fn(|j| nib_m(b[j] >> 4) ^ nib_r(b[j] & 15));
            c1[s] = u32::from_le_bytes(n1);
            c2[s] = u32::from_le_bytes(n2);
        }
        let mut tables = soft::sbox_tables(k, &sbox);
        m.zeroize();
        even.zeroize();
        odd.zeroize();
        let keys = Keys {
            k,
            sub,
            sbox,
            c1,
            c2,
            tables,
        };
        tables.zeroize();
        sub.zeroize();
        sbox.zeroize();
        c1.zeroize();
        c2.zeroize();
        Some(keys)
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.sub.zeroize();
        self.sbox.zeroize();
        self.c1.zeroize();
        self.c2.zeroize();
        self.tables.zeroize();
    }
}

#[cfg(test)]
pub(crate) mod reference {
    //! The textbook Twofish with table lookups (`q0`/`q1` as 256-entry tables): NOT constant
    //! time, only for the tests that check the constant-time code against it.

    use super::*;

    /// `q_v(x)` by the specification's nibble steps.
    pub(crate) fn q(v: usize, x: u8) -> u8 {
        let t = &QT[v];
        let (a0, b0) = (x >> 4, x & 15);
        let (a1, b1) = (a0 ^ b0, nib_m(a0) ^ nib_r(b0));
        let (a2, b2) = (t[0][a1 as usize], t[1][b1 as usize]);
        let (a3, b3) = (a2 ^ b2, nib_m(a2) ^ nib_r(b2));
        let (a4, b4) = (t[2][a3 as usize], t[3][b3 as usize]);
        (b4 << 4) | a4
    }

    /// `h(x, L)` with the key words in stage order (`l[0]` XORed in first).
    pub(crate) fn h(x: u32, l: &[u32], k: usize) -> u32 {
        let mut y = x.to_le_bytes();
        let st = stages(k);
        for (s, v) in st.iter().enumerate() {
            for j in 0..4 {
                y[j] = q(v[j] as usize, y[j]);
                if s < k {
                    y[j] ^= l[s].to_le_bytes()[j];
                }
            }
        }
        let mut z = [0u8; 4];
        for i in 0..4 {
            for j in 0..4 {
                z[i] ^= mds_mul(y[j], MDS[i][j]);
            }
        }
        u32::from_le_bytes(z)
    }

    /// Encrypt one block with `keys`.
    pub(crate) fn encrypt(keys: &Keys, block: &mut [u8; 16]) {
        let w = |i: usize| u32::from_le_bytes(block[4 * i..4 * i + 4].try_into().unwrap());
        let mut r: [u32; 4] = core::array::from_fn(|i| w(i) ^ keys.sub[i]);
        for round in 0..16 {
            let t0 = h(r[0], &keys.sbox, keys.k);
            let t1 = h(r[1].rotate_left(8), &keys.sbox, keys.k);
            let f0 = t0.wrapping_add(t1).wrapping_add(keys.sub[2 * round + 8]);
            let f1 = t0
                .wrapping_add(t1.wrapping_mul(2))
                .wrapping_add(keys.sub[2 * round + 9]);
            let n0 = (r[2] ^ f0).rotate_right(1);
            let n1 = r[3].rotate_left(1) ^ f1;
            r = [n0, n1, r[0], r[1]];
        }
        let out = [r[2], r[3], r[0], r[1]];
        for i in 0..4 {
            block[4 * i..4 * i + 4].copy_from_slice(&(out[i] ^ keys.sub[4 + i]).to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's 128-bit intermediate values (ecb_ival.txt): the S-box key words and
    /// the first subkeys of the all-zero key, and its ciphertext of the zero block.
    #[test]
    fn zero_key_schedule_matches_the_specification() {
        let keys = Keys::new(&[0u8; 16]).unwrap();
        assert_eq!(keys.sub[0], 0x52C54DDE);
        assert_eq!(keys.sub[1], 0x11F0626D);
        let mut block = [0u8; 16];
        reference::encrypt(&keys, &mut block);
        assert_eq!(hex(&block), "9f589f5cf6122c32b6bfec2f2ae8c35a");
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
