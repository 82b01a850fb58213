//! Portable, constant-time AES: 64-bit bitslicing with fixsliced rounds.
//!
//! Why bitslicing: a table-driven AES leaks the key through the cache (Bernstein 2005; Osvik,
//! Shamir, Tromer 2006). Here four blocks are spread over eight `u64` bit-planes (plane `b` holds
//! bit `b` of all 64 state bytes), SubBytes is a Boyar–Peralta boolean circuit evaluated on whole
//! planes, and the linear layers are rotations and masks. Nothing indexes memory or branches on
//! secret data, the key schedule included.
//!
//! Why fixslicing (Adomnicai & Peyrin, TCHES 2021/1): ShiftRows on a bitsliced state costs about
//! as much as the S-box. Instead the state after round `i` is kept as `T_i = SR^-i(S_i)`; the round
//! keys are pre-shifted the same way, and MixColumns is replaced by its conjugate
//! `MC_j = SR^-j · MC · SR^j` (`j = i mod 4`), which mixes diagonals instead of columns and is
//! still a handful of rotations. Only one fix-up (`SR^Nr`, the identity for AES-192 and `SR^2`
//! otherwise) remains at the end.
//!
//! Layout of a plane: bit `16·r + 4·c + k` is row `r`, column `c` of block `k`, so "next row" is a
//! 16-bit rotation of the whole word and "next column" a 4-bit rotation inside each 16-bit row.
//!
//! The S-box affine constant 0x63 is folded into the round keys: the circuit computes only the
//! linear part `L(x^-1)`, and since a state of equal bytes is fixed by (conjugated) ShiftRows and
//! (Inv)MixColumns, XOR-ing 0x63 into every round key after the first cancels it in both
//! directions. Decryption reuses the circuit's non-linear core: `InvSubBytes = L^-1 · S' · L^-1`
//! without constants, each `L^-1` merged into the adjacent linear layer.
//!
//! Speed (one thread, Xeon with 2 vCPUs, ECB): about 270/230 MB/s encrypt/decrypt for AES-128
//! and 200/170 MB/s for AES-256.

use zeroize::Zeroize;

use crate::backend::Backend;
use crate::engine::{BlockEngine, BLOCK};

/// Blocks per bitsliced state.
const WIDTH: usize = 4;
/// Bytes per bitsliced state.
const CHUNK: usize = WIDTH * BLOCK;
/// Most rounds (AES-256).
const MAX_ROUNDS: usize = 14;

/// Eight bit-planes, least significant bit of each byte first.
type State = [u64; 8];

/// Portable AES-128/192/256 engine.
pub(crate) struct AesSoft {
    /// Number of rounds: 10, 12 or 14.
    rounds: usize,
    /// Round keys in fixsliced, bitsliced form (each replicated over the four block slots). Key
    /// `i >= 1` is pre-shifted by `SR^-i` and carries the 0x63 S-box constant.
    rk: [State; MAX_ROUNDS + 1],
}

impl AesSoft {
    /// Expand `key` (16, 24 or 32 bytes; checked by the caller).
    pub(crate) fn new(key: &[u8]) -> Self {
        debug_assert!(matches!(key.len(), 16 | 24 | 32));
        let nk = key.len() / 4;
        let rounds = nk + 6;

        // FIPS 197 key expansion on little-endian words (byte 0 of the word in the low bits),
        // with SubWord through the bitsliced circuit.
        let mut w = [0u32; 4 * (MAX_ROUNDS + 1)];
        for (wi, chunk) in w.iter_mut().zip(key.chunks_exact(4)) {
            *wi = u32::from_le_bytes(chunk.try_into().unwrap());
        }
        let mut rcon: u32 = 1;
        for i in nk..4 * (rounds + 1) {
            let mut t = w[i - 1];
            if i % nk == 0 {
                // RotWord moves byte 1 to byte 0: a right rotation of the little-endian word.
                t = sub_word(t.rotate_right(8)) ^ rcon;
                rcon = u32::from(xtime_byte(rcon as u8));
            } else if nk > 6 && i % nk == 4 {
                t = sub_word(t);
            }
            w[i] = w[i - nk] ^ t;
        }

        let mut rk = [[0u64; 8]; MAX_ROUNDS + 1];
        let mut plain = [0u8; BLOCK];
        let mut shifted = [0u8; BLOCK];
        let mut rep = [0u8; CHUNK];
        for (i, rk_i) in rk.iter_mut().enumerate().take(rounds + 1) {
            for (j, word) in w[4 * i..4 * i + 4].iter().enumerate() {
                plain[4 * j..4 * j + 4].copy_from_slice(&word.to_le_bytes());
            }
            // K'_i = SR^-i(K_i): (SR^-i a)[r][c] = a[r][c - i·r]. Indices are public.
            for c in 0..4 {
                for r in 0..4 {
                    let src = (c + 4 * 4 - (i % 4) * r) % 4;
                    shifted[4 * c + r] = plain[4 * src + r] ^ if i == 0 { 0 } else { 0x63 };
                }
            }
            for slot in rep.chunks_exact_mut(BLOCK) {
                slot.copy_from_slice(&shifted);
            }
            *rk_i = pack(&rep);
        }
        w.zeroize();
        plain.zeroize();
        shifted.zeroize();
        rep.zeroize();
        AesSoft { rounds, rk }
    }

    /// Encrypt the four blocks held in `q`.
    #[inline]
    fn encrypt_state(&self, q: &mut State) {
        let nr = self.rounds;
        let rk = &self.rk;
        add_round_key(q, &rk[0]);
        // Round i uses MC_(i mod 4); unrolled by four so the variant is a compile-time constant.
        let mut i = 1;
        while i + 4 <= nr {
            enc_round::<1>(q, &rk[i]);
            enc_round::<2>(q, &rk[i + 1]);
            enc_round::<3>(q, &rk[i + 2]);
            enc_round::<0>(q, &rk[i + 3]);
            i += 4;
        }
        if i < nr {
            enc_round::<1>(q, &rk[i]);
            i += 1;
        }
        if i < nr {
            enc_round::<2>(q, &rk[i]);
            i += 1;
        }
        if i < nr {
            enc_round::<3>(q, &rk[i]);
        }
        sbox(q);
        add_round_key(q, &rk[nr]);
        if nr % 4 == 2 {
            shift_rows_2(q);
        }
    }

    /// Decrypt the four blocks held in `q`: the encryption steps undone in reverse order.
    #[inline]
    fn decrypt_state(&self, q: &mut State) {
        let nr = self.rounds;
        let rk = &self.rk;
        if nr % 4 == 2 {
            shift_rows_2(q);
        }
        add_round_key(q, &rk[nr]);
        inv_sbox(q);
        let mut i = nr - 1;
        if i % 4 == 3 {
            dec_round::<3>(q, &rk[i]);
            i -= 1;
        }
        if i % 4 == 2 {
            dec_round::<2>(q, &rk[i]);
            i -= 1;
        }
        if i % 4 == 1 {
            dec_round::<1>(q, &rk[i]);
            i -= 1;
        }
        while i > 0 {
            dec_round::<0>(q, &rk[i]);
            dec_round::<3>(q, &rk[i - 1]);
            dec_round::<2>(q, &rk[i - 2]);
            dec_round::<1>(q, &rk[i - 3]);
            i -= 4;
        }
        add_round_key(q, &rk[0]);
    }

    /// Run `f` over `buf` four blocks at a time; a short tail goes through a zero-padded copy.
    #[inline]
    fn for_each_state(&self, buf: &mut [u8], f: impl Fn(&Self, &mut State)) {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        let mut chunks = buf.chunks_exact_mut(CHUNK);
        for chunk in &mut chunks {
            let chunk: &mut [u8; CHUNK] = chunk.try_into().unwrap();
            let mut q = pack(chunk);
            f(self, &mut q);
            unpack(&q, chunk);
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mut tmp = [0u8; CHUNK];
            tmp[..tail.len()].copy_from_slice(tail);
            let mut q = pack(&tmp);
            f(self, &mut q);
            unpack(&q, &mut tmp);
            tail.copy_from_slice(&tmp[..tail.len()]);
            tmp.zeroize();
            q.zeroize();
        }
    }
}

impl Drop for AesSoft {
    fn drop(&mut self) {
        self.rk.zeroize();
    }
}

impl BlockEngine for AesSoft {
    fn backend(&self) -> Backend {
        Backend::Portable
    }

    fn encrypt_ecb(&self, buf: &mut [u8]) {
        self.for_each_state(buf, Self::encrypt_state);
    }

    fn decrypt_ecb(&self, buf: &mut [u8]) {
        self.for_each_state(buf, Self::decrypt_state);
    }
}

/// One full encryption round in fixsliced form: SubBytes, MC_J, AddRoundKey.
#[inline(always)]
fn enc_round<const J: u32>(q: &mut State, rk: &State) {
    sbox(q);
    mix_columns::<J>(q);
    add_round_key(q, rk);
}

/// Inverse of [`enc_round`].
#[inline(always)]
fn dec_round<const J: u32>(q: &mut State, rk: &State) {
    add_round_key(q, rk);
    inv_mix_columns::<J>(q);
    inv_sbox(q);
}

#[inline(always)]
fn add_round_key(q: &mut State, rk: &State) {
    for (x, k) in q.iter_mut().zip(rk) {
        *x ^= k;
    }
}

// ---------------------------------------------------------------------------------------------
// Packing: four blocks <-> eight bit-planes.
// ---------------------------------------------------------------------------------------------

/// Exchange bit `log2(d)` of the word index with the same bit of the bit index, between words
/// `i` (index bit clear) and `j` (index bit set); `m` selects the bit positions where that bit is
/// clear. One stage of an 8x8 bit-matrix transpose ("SWAPMOVE").
#[inline(always)]
fn swap_move(w: &mut [u64; 8], i: usize, j: usize, m: u64, d: u32) {
    let t = ((w[i] >> d) ^ w[j]) & m;
    w[j] ^= t;
    w[i] ^= t << d;
}

/// The three transpose stages. Each is an involution and they commute, so this is its own
/// inverse.
#[inline(always)]
fn transpose(w: &mut [u64; 8]) {
    for i in [0, 2, 4, 6] {
        swap_move(w, i, i + 1, 0x5555_5555_5555_5555, 1);
    }
    for i in [0, 1, 4, 5] {
        swap_move(w, i, i + 2, 0x3333_3333_3333_3333, 2);
    }
    for i in [0, 1, 2, 3] {
        swap_move(w, i, i + 4, 0x0F0F_0F0F_0F0F_0F0F, 4);
    }
}

/// Move byte `r` of a column to bits `16·r..16·r+8`.
#[inline(always)]
fn spread(col: u32) -> u64 {
    let x = u64::from(col);
    let x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
    (x | (x << 8)) & 0x00FF_00FF_00FF_00FF
}

/// Inverse of [`spread`] (other bits ignored).
#[inline(always)]
fn compact(x: u64) -> u32 {
    let x = x & 0x00FF_00FF_00FF_00FF;
    let x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
    (x | (x >> 16)) as u32
}

#[inline(always)]
fn column(chunk: &[u8; CHUNK], block: usize, col: usize) -> u32 {
    let at = BLOCK * block + 4 * col;
    u32::from_le_bytes(chunk[at..at + 4].try_into().unwrap())
}

/// Four blocks to bit-planes. Word `4·c0 + k` gets columns `c0` and `c0 + 2` of block `k`
/// interleaved byte by byte (bit `16·r + 8·x + b` = bit `b` of row `r` of column `c0 + 2x`); the
/// transpose then swaps the three word-index bits with the three bit-in-byte bits, which leaves
/// bit `b` of row `r`, column `c` of block `k` at bit `16·r + 4·c + k` of plane `b`.
#[inline(always)]
fn pack(chunk: &[u8; CHUNK]) -> State {
    let mut w = [0u64; 8];
    for (i, wi) in w.iter_mut().enumerate() {
        let (c0, k) = (i >> 2, i & 3);
        *wi = spread(column(chunk, k, c0)) | (spread(column(chunk, k, c0 + 2)) << 8);
    }
    transpose(&mut w);
    w
}

/// Bit-planes back to four blocks (inverse of [`pack`]).
#[inline(always)]
fn unpack(q: &State, chunk: &mut [u8; CHUNK]) {
    let mut w = *q;
    transpose(&mut w);
    for (i, wi) in w.iter().enumerate() {
        let (c0, k) = (i >> 2, i & 3);
        let at = BLOCK * k + 4 * c0;
        chunk[at..at + 4].copy_from_slice(&compact(*wi).to_le_bytes());
        chunk[at + 8..at + 12].copy_from_slice(&compact(*wi >> 8).to_le_bytes());
    }
}

// ---------------------------------------------------------------------------------------------
// Linear layers.
// ---------------------------------------------------------------------------------------------

/// Per-row masks of the columns `c < 4 - l`, i.e. those that do not wrap when rotated by `l`.
const COL_KEEP: [u64; 4] = [
    !0,
    0x0FFF_0FFF_0FFF_0FFF,
    0x00FF_00FF_00FF_00FF,
    0x000F_000F_000F_000F,
];

/// `out[r][c] = in[r + K][c + L]` on one plane (indices mod 4). A column move is a rotation of
/// the whole word, except for the columns that wrap inside their row, which come from the
/// rotation by one row less.
#[inline(always)]
fn rot<const K: u32, const L: u32>(x: u64) -> u64 {
    if L == 0 {
        x.rotate_right(16 * K)
    } else {
        let keep = COL_KEEP[L as usize];
        (x.rotate_right(16 * K + 4 * L) & keep)
            | (x.rotate_right((16 * K + 4 * L + 48) % 64) & !keep)
    }
}

/// The conjugated row rotation `R_J: a[r][c] <- a[r+1][c+J]` of `MC_J`.
#[inline(always)]
fn rot1<const J: u32>(x: u64) -> u64 {
    match J {
        0 => rot::<1, 0>(x),
        1 => rot::<1, 1>(x),
        2 => rot::<1, 2>(x),
        _ => rot::<1, 3>(x),
    }
}

/// `R_J^2: a[r][c] <- a[r+2][c+2J]`.
#[inline(always)]
fn rot2<const J: u32>(x: u64) -> u64 {
    match J {
        0 | 2 => rot::<2, 0>(x),
        _ => rot::<2, 2>(x),
    }
}

/// Multiply every byte by x in GF(2^8) (reduction polynomial x^8 + x^4 + x^3 + x + 1).
#[inline(always)]
fn xtime(t: &State) -> State {
    [
        t[7],
        t[0] ^ t[7],
        t[1],
        t[2] ^ t[7],
        t[3] ^ t[7],
        t[4],
        t[5],
        t[6],
    ]
}

/// `MC_J = SR^-J · MixColumns · SR^J`: `out = 2a ^ 3·R(a) ^ R²(a) ^ R³(a)` with the conjugated
/// rotation `R`, computed as `2·t ^ R(a) ^ R²(t)` where `t = a ^ R(a)`. Plane by plane (`2·t` in
/// plane `b` needs only `t` of planes `b - 1` and 7) to keep few values live.
#[inline(always)]
fn mix_columns<const J: u32>(q: &mut State) {
    let ra7 = rot1::<J>(q[7]);
    let t7 = q[7] ^ ra7;
    let mut t_prev = t7;
    for (b, x) in q.iter_mut().enumerate().take(7) {
        let ra = rot1::<J>(*x);
        let t = *x ^ ra;
        // xtime: plane b of 2·t is plane b-1 of t, plus plane 7 where x^8 reduces (0x1B).
        let xt = if b == 0 {
            t7
        } else if matches!(b, 1 | 3 | 4) {
            t_prev ^ t7
        } else {
            t_prev
        };
        *x = xt ^ ra ^ rot2::<J>(t);
        t_prev = t;
    }
    q[7] = t_prev ^ ra7 ^ rot2::<J>(t7);
}

/// `SR^-J · InvMixColumns · SR^J`, using InvMixColumns = MixColumns · (05 + 04·x^2), i.e.
/// `a ^ 4·(a ^ R²(a))` followed by `MC_J`.
#[inline(always)]
fn inv_mix_columns<const J: u32>(q: &mut State) {
    let mut u = [0u64; 8];
    for b in 0..8 {
        u[b] = q[b] ^ rot2::<J>(q[b]);
    }
    let u4 = xtime(&xtime(&u));
    for b in 0..8 {
        q[b] ^= u4[b];
    }
    mix_columns::<J>(q);
}

/// `SR^2` (= `SR^-2`): rows 1 and 3 move by two columns, i.e. swap the bytes of their 16-bit row.
#[inline(always)]
fn shift_rows_2(q: &mut State) {
    for x in q.iter_mut() {
        *x = (*x & 0x0000_FFFF_0000_FFFF)
            | ((*x >> 8) & 0x00FF_0000_00FF_0000)
            | ((*x << 8) & 0xFF00_0000_FF00_0000);
    }
}

// ---------------------------------------------------------------------------------------------
// S-box.
// ---------------------------------------------------------------------------------------------

/// `x -> L(x^-1)` on every byte: the AES S-box without its 0x63 constant.
///
/// The circuit is Boyar & Peralta's ("A new combinational logic minimization technique with
/// applications to cryptology", SEA 2010): a linear layer to 22 values, a shared GF(2^4)-tower
/// inversion with 32 ANDs, and a linear layer to the 8 output bits, with the paper's gate names.
/// Its XNORs (the constant) are plain XORs here.
#[inline(always)]
fn sbox(q: &mut State) {
    let top = top_forward(q);
    let z = sbox_core(&top);
    *q = bottom_forward(&z);
}

/// The linear combinations of the input bits that the non-linear core reads (the circuit's
/// names; `x7` is the least significant input bit).
#[derive(Clone, Copy)]
struct Top {
    x7: u64,
    y1: u64,
    y2: u64,
    y3: u64,
    y4: u64,
    y5: u64,
    y6: u64,
    y7: u64,
    y8: u64,
    y9: u64,
    y10: u64,
    y11: u64,
    y12: u64,
    y13: u64,
    y14: u64,
    y15: u64,
    y16: u64,
    y17: u64,
    y18: u64,
    y19: u64,
    y20: u64,
    y21: u64,
}

/// The circuit's top linear layer.
#[inline(always)]
fn top_forward(q: &State) -> Top {
    // The circuit numbers bits from the most significant.
    let x0 = q[7];
    let x1 = q[6];
    let x2 = q[5];
    let x3 = q[4];
    let x4 = q[3];
    let x5 = q[2];
    let x6 = q[1];
    let x7 = q[0];

    // Top linear layer.
    let y14 = x3 ^ x5;
    let y13 = x0 ^ x6;
    let y9 = x0 ^ x3;
    let y8 = x0 ^ x5;
    let t0 = x1 ^ x2;
    let y1 = t0 ^ x7;
    let y4 = y1 ^ x3;
    let y12 = y13 ^ y14;
    let y2 = y1 ^ x0;
    let y5 = y1 ^ x6;
    let y3 = y5 ^ y8;
    let t1 = x4 ^ y12;
    let y15 = t1 ^ x5;
    let y20 = t1 ^ x1;
    let y6 = y15 ^ x7;
    let y10 = y15 ^ t0;
    let y11 = y20 ^ y9;
    let y7 = x7 ^ y11;
    let y17 = y10 ^ y11;
    let y19 = y10 ^ y8;
    let y16 = t0 ^ y11;
    let y21 = y13 ^ y16;
    let y18 = x0 ^ y16;

    Top {
        x7,
        y1,
        y2,
        y3,
        y4,
        y5,
        y6,
        y7,
        y8,
        y9,
        y10,
        y11,
        y12,
        y13,
        y14,
        y15,
        y16,
        y17,
        y18,
        y19,
        y20,
        y21,
    }
}

/// The non-linear core shared by both directions: GF(2^8) inversion through GF(2^4), ending in
/// the 18 products the output layer combines.
#[inline(always)]
fn sbox_core(top: &Top) -> [u64; 18] {
    // Non-linear middle: inversion in the tower field.
    let t2 = top.y12 & top.y15;
    let t3 = top.y3 & top.y6;
    let t4 = t3 ^ t2;
    let t5 = top.y4 & top.x7;
    let t6 = t5 ^ t2;
    let t7 = top.y13 & top.y16;
    let t8 = top.y5 & top.y1;
    let t9 = t8 ^ t7;
    let t10 = top.y2 & top.y7;
    let t11 = t10 ^ t7;
    let t12 = top.y9 & top.y11;
    let t13 = top.y14 & top.y17;
    let t14 = t13 ^ t12;
    let t15 = top.y8 & top.y10;
    let t16 = t15 ^ t12;
    let t17 = t4 ^ t14;
    let t18 = t6 ^ t16;
    let t19 = t9 ^ t14;
    let t20 = t11 ^ t16;
    let t21 = t17 ^ top.y20;
    let t22 = t18 ^ top.y19;
    let t23 = t19 ^ top.y21;
    let t24 = t20 ^ top.y18;

    let t25 = t21 ^ t22;
    let t26 = t21 & t23;
    let t27 = t24 ^ t26;
    let t28 = t25 & t27;
    let t29 = t28 ^ t22;
    let t30 = t23 ^ t24;
    let t31 = t22 ^ t26;
    let t32 = t31 & t30;
    let t33 = t32 ^ t24;
    let t34 = t23 ^ t33;
    let t35 = t27 ^ t33;
    let t36 = t24 & t35;
    let t37 = t36 ^ t34;
    let t38 = t27 ^ t36;
    let t39 = t29 & t38;
    let t40 = t25 ^ t39;

    let t41 = t40 ^ t37;
    let t42 = t29 ^ t33;
    let t43 = t29 ^ t40;
    let t44 = t33 ^ t37;
    let t45 = t42 ^ t41;
    let z0 = t44 & top.y15;
    let z1 = t37 & top.y6;
    let z2 = t33 & top.x7;
    let z3 = t43 & top.y16;
    let z4 = t40 & top.y1;
    let z5 = t29 & top.y7;
    let z6 = t42 & top.y11;
    let z7 = t45 & top.y17;
    let z8 = t41 & top.y10;
    let z9 = t44 & top.y12;
    let z10 = t37 & top.y3;
    let z11 = t33 & top.y4;
    let z12 = t43 & top.y13;
    let z13 = t40 & top.y5;
    let z14 = t29 & top.y2;
    let z15 = t42 & top.y9;
    let z16 = t45 & top.y14;
    let z17 = t41 & top.y8;

    [
        z0, z1, z2, z3, z4, z5, z6, z7, z8, z9, z10, z11, z12, z13, z14, z15, z16, z17,
    ]
}

/// The circuit's bottom linear layer (without the constant).
#[inline(always)]
fn bottom_forward(z: &[u64; 18]) -> State {
    let [z0, z1, z2, z3, z4, z5, z6, z7, z8, z9, z10, z11, z12, z13, z14, z15, z16, z17] = *z;
    // Bottom linear layer.
    let t46 = z15 ^ z16;
    let t47 = z10 ^ z11;
    let t48 = z5 ^ z13;
    let t49 = z9 ^ z10;
    let t50 = z2 ^ z12;
    let t51 = z2 ^ z5;
    let t52 = z7 ^ z8;
    let t53 = z0 ^ z3;
    let t54 = z6 ^ z7;
    let t55 = z16 ^ z17;
    let t56 = z12 ^ t48;
    let t57 = t50 ^ t53;
    let t58 = z4 ^ t46;
    let t59 = z3 ^ t54;
    let t60 = t46 ^ t57;
    let t61 = z14 ^ t57;
    let t62 = t52 ^ t58;
    let t63 = t49 ^ t58;
    let t64 = z4 ^ t59;
    let t65 = t61 ^ t62;
    let t66 = z1 ^ t63;
    let s0 = t59 ^ t63;
    let s6 = t56 ^ t62;
    let s7 = t48 ^ t60;
    let t67 = t64 ^ t65;
    let s3 = t53 ^ t66;
    let s4 = t51 ^ t66;
    let s5 = t47 ^ t65;
    let s1 = t64 ^ s3;
    let s2 = t55 ^ t67;

    [s7, s6, s5, s4, s3, s2, s1, s0]
}

/// `y -> (L^-1(y))^-1`, the inverse of [`sbox`]: `L^-1 · S' · L^-1`, with each `L^-1` folded
/// into the adjacent linear layer of the circuit so that decryption shares the non-linear core.
#[inline(always)]
fn inv_sbox(q: &mut State) {
    let top = top_inverse(q);
    let z = sbox_core(&top);
    *q = bottom_inverse(&z);
}

/// `L^-1` (bit `i` of the result is bits `i+2`, `i+5`, `i+7` mod 8 of the input) followed by the
/// top layer of [`top_forward`]: 24 XORs instead of 16 + 23. Machine-generated (a greedy
/// shortest-linear-program search in the style of Boyar–Peralta); `inv_sbox_circuit_exhaustive`
/// checks it on all inputs. Inputs are the planes, least significant bit first.
#[inline(always)]
fn top_inverse(q: &State) -> Top {
    let [u0, u1, u2, u3, u4, u5, u6, u7] = *q;
    let a0 = u4 ^ u6;
    let a1 = u0 ^ u1;
    let a2 = u6 ^ u7;
    let a3 = u3 ^ u4;
    let a4 = a0 ^ a1;
    let a5 = u5 ^ a4;
    let a6 = u2 ^ u7;
    let a7 = u0 ^ a3;
    let a8 = a4 ^ a6;
    let a9 = u4 ^ a7;
    let a10 = a2 ^ a9;
    let a11 = u4 ^ u7;
    let a12 = a5 ^ a7;
    let a13 = a8 ^ a10;
    let a14 = a4 ^ a11;
    let a15 = u1 ^ a5;
    let a16 = a7 ^ a10;
    let a17 = a3 ^ a4;
    let a18 = u1 ^ a7;
    let a19 = a2 ^ a3;
    let a20 = u5 ^ a6;
    let a21 = a6 ^ a17;
    let a22 = a16 ^ a20;
    let a23 = a5 ^ a17;
    Top {
        x7: a20,
        y1: a7,
        y2: a17,
        y3: a11,
        y4: a4,
        y5: a0,
        y6: a16,
        y7: a5,
        y8: a2,
        y9: a3,
        y10: a10,
        y11: a8,
        y12: a14,
        y13: a18,
        y14: a19,
        y15: a22,
        y16: a12,
        y17: a13,
        y18: a23,
        y19: a9,
        y20: a21,
        y21: a15,
    }
}

/// [`bottom_forward`] followed by `L^-1`: 35 XORs instead of 30 + 16, generated and checked like
/// [`top_inverse`]. Outputs are the planes, least significant bit first.
#[inline(always)]
fn bottom_inverse(z: &[u64; 18]) -> State {
    let [z0, z1, z2, z3, z4, z5, z6, z7, z8, z9, z10, z11, z12, z13, z14, z15, z16, z17] = *z;
    let a0 = z6 ^ z15;
    let a1 = z13 ^ a0;
    let a2 = z12 ^ z16;
    let a3 = a1 ^ a2;
    let a4 = z1 ^ z8;
    let a5 = z4 ^ a4;
    let a6 = z2 ^ z10;
    let a7 = z17 ^ a6;
    let a8 = z3 ^ a3;
    let a9 = z0 ^ a3;
    let a10 = z3 ^ a5;
    let a11 = z4 ^ z7;
    let a12 = a1 ^ a7;
    let a13 = z14 ^ a10;
    let a14 = z11 ^ z17;
    let a15 = a11 ^ a12;
    let a16 = z8 ^ a9;
    let a17 = z9 ^ z15;
    let a18 = a0 ^ a6;
    let a19 = z5 ^ a5;
    let a20 = z5 ^ a15;
    let a21 = z11 ^ a13;
    let a22 = z2 ^ a16;
    let a23 = z5 ^ z8;
    let a24 = a2 ^ a21;
    let a25 = a9 ^ a19;
    let a26 = z12 ^ a20;
    let a27 = z9 ^ a13;
    let a28 = z0 ^ z11;
    let a29 = a14 ^ a17;
    let a30 = a18 ^ a24;
    let a31 = a8 ^ a11;
    let a32 = a8 ^ a23;
    let a33 = a12 ^ a27;
    let a34 = a26 ^ a28;
    [a29, a31, a25, a34, a22, a30, a33, a32]
}

/// The AES S-box on the four bytes of a word, through the circuit (no table, so the key schedule
/// is constant-time too).
fn sub_word(w: u32) -> u32 {
    let mut q = [0u64; 8];
    for (b, plane) in q.iter_mut().enumerate() {
        for j in 0..4 {
            *plane |= u64::from((w >> (8 * j + b)) & 1) << j;
        }
    }
    sbox(&mut q);
    let mut out = 0u32;
    for (b, plane) in q.iter().enumerate() {
        for j in 0..4 {
            out |= ((*plane >> j) as u32 & 1) << (8 * j + b);
        }
    }
    q.zeroize();
    out ^ 0x6363_6363
}

/// Multiply a byte by x in GF(2^8) (used for the public round constants only).
fn xtime_byte(b: u8) -> u8 {
    (b << 1) ^ if b & 0x80 != 0 { 0x1B } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngCore, SeedableRng};
    use sha2::{Digest, Sha256};

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    fn enc(key: &[u8], data: &[u8]) -> Vec<u8> {
        let mut buf = data.to_vec();
        AesSoft::new(key).encrypt_ecb(&mut buf);
        buf
    }

    fn dec(key: &[u8], data: &[u8]) -> Vec<u8> {
        let mut buf = data.to_vec();
        AesSoft::new(key).decrypt_ecb(&mut buf);
        buf
    }

    /// Encrypt and decrypt one known answer.
    fn check(key: &str, pt: &str, ct: &str) {
        let (key, pt, ct) = (h(key), h(pt), h(ct));
        assert_eq!(
            hex::encode(enc(&key, &pt)),
            hex::encode(&ct),
            "encrypt, key {}",
            hex::encode(&key)
        );
        assert_eq!(
            hex::encode(dec(&key, &ct)),
            hex::encode(&pt),
            "decrypt, key {}",
            hex::encode(&key)
        );
    }

    /// Slow, obviously-correct GF(2^8) arithmetic to check the circuit against.
    fn gf_mul(mut a: u8, mut b: u8) -> u8 {
        let mut p = 0;
        while b != 0 {
            if b & 1 != 0 {
                p ^= a;
            }
            a = xtime_byte(a);
            b >>= 1;
        }
        p
    }

    fn reference_sbox(x: u8) -> u8 {
        // x^254 = x^-1 (and 0 -> 0), then the FIPS 197 affine map.
        let mut inv = 1u8;
        for _ in 0..254 {
            inv = gf_mul(inv, x);
        }
        let mut s = 0x63;
        for i in 0..8 {
            let bit = (inv >> i)
                ^ (inv >> ((i + 4) % 8))
                ^ (inv >> ((i + 5) % 8))
                ^ (inv >> ((i + 6) % 8))
                ^ (inv >> ((i + 7) % 8));
            s ^= (bit & 1) << i;
        }
        s
    }

    /// All 256 bytes, bitsliced: byte `v` at bit `v % 64` of plane-set `v / 64`.
    fn all_bytes() -> [State; 4] {
        let mut sets = [[0u64; 8]; 4];
        for v in 0..256usize {
            for (b, plane) in sets[v / 64].iter_mut().enumerate() {
                *plane |= (((v >> b) & 1) as u64) << (v % 64);
            }
        }
        sets
    }

    fn byte_at(sets: &[State; 4], v: usize) -> u8 {
        (0..8)
            .map(|b| (((sets[v / 64][b] >> (v % 64)) & 1) as u8) << b)
            .sum()
    }

    #[test]
    fn sbox_circuit_exhaustive() {
        let mut sets = all_bytes();
        for q in sets.iter_mut() {
            sbox(q);
        }
        for v in 0..256 {
            assert_eq!(
                byte_at(&sets, v) ^ 0x63,
                reference_sbox(v as u8),
                "S({v:#04x})"
            );
        }
    }

    #[test]
    fn inv_sbox_circuit_exhaustive() {
        let mut sets = all_bytes();
        for q in sets.iter_mut() {
            inv_sbox(q);
        }
        for v in 0..256usize {
            // inv_sbox inverts the constant-free S' = S ^ 0x63.
            let u = byte_at(&sets, v);
            assert_eq!(reference_sbox(u) ^ 0x63, v as u8, "S'^-1({v:#04x})");
        }
        for v in 0..256u32 {
            let w = v | (v ^ 0x5a) << 8 | (v ^ 0xa5) << 16 | (255 - v) << 24;
            let want = u32::from_le_bytes(w.to_le_bytes().map(reference_sbox));
            assert_eq!(sub_word(w), want);
        }
    }

    #[test]
    fn pack_unpack_layout() {
        let mut chunk = [0u8; CHUNK];
        let mut rng = StdRng::seed_from_u64(1);
        rng.fill_bytes(&mut chunk);
        let q = pack(&chunk);
        // Bit b of row r, column c of block k sits at bit 16r + 4c + k of plane b.
        for k in 0..WIDTH {
            for c in 0..4 {
                for r in 0..4 {
                    for (b, plane) in q.iter().enumerate() {
                        let want = (chunk[BLOCK * k + 4 * c + r] >> b) & 1;
                        assert_eq!((plane >> (16 * r + 4 * c + k)) & 1, u64::from(want));
                    }
                }
            }
        }
        let mut back = [0u8; CHUNK];
        unpack(&q, &mut back);
        assert_eq!(back, chunk);
    }

    #[test]
    fn fips197_appendix_c() {
        let pt = "00112233445566778899aabbccddeeff";
        check(
            "000102030405060708090a0b0c0d0e0f",
            pt,
            "69c4e0d86a7b0430d8cdb78070b4c55a",
        );
        check(
            "000102030405060708090a0b0c0d0e0f1011121314151617",
            pt,
            "dda97ca4864cdfe06eaf70a0ec0d7191",
        );
        check(
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
            pt,
            "8ea2b7ca516745bfeafc49904b496089",
        );
    }

    /// SP 800-38A F.1.1-F.1.6 (ECB-AES128/192/256, encrypt and decrypt), all four blocks at once
    /// and one block at a time.
    #[test]
    fn sp800_38a_ecb() {
        let pt = "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51\
                  30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710";
        let cases = [
            (
                "2b7e151628aed2a6abf7158809cf4f3c",
                "3ad77bb40d7a3660a89ecaf32466ef97f5d3d58503b9699de785895a96fdbaaf\
                 43b1cd7f598ece23881b00e3ed0306887b0c785e27e8ad3f8223207104725dd4",
            ),
            (
                "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
                "bd334f1d6e45f25ff712a214571fa5cc974104846d0ad3ad7734ecb3ecee4eef\
                 ef7afd2270e2e60adce0ba2face6444e9a4b41ba738d6c72fb16691603c18e0e",
            ),
            (
                "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
                "f3eed1bdb5d2a03c064b5a7e3db181f8591ccb10d410ed26dc5ba74a31362870\
                 b6ed21b99ca6f4f9f153e7b1beafed1d23304b7a39f9f3ff067d8d8f9e24ecc7",
            ),
        ];
        for (key, ct) in cases {
            check(key, pt, ct);
            for i in 0..4 {
                check(key, &pt[32 * i..32 * i + 32], &ct[32 * i..32 * i + 32]);
            }
        }
    }

    /// AESAVS (Appendix B-E) GFSbox, KeySbox, VarTxt and VarKey samples.
    #[test]
    fn aesavs_samples() {
        let z = "00000000000000000000000000000000";
        check(
            z,
            "f34481ec3cc627bacd5dc3fb08f273e6",
            "0336763e966d92595a567cc9ce537f5e",
        );
        check(
            "10a58869d74be5a374cf867cfb473859",
            z,
            "6d251e6944b051e04eaa6fb4dbf78465",
        );
        check(
            z,
            "80000000000000000000000000000000",
            "3ad78e726c1ec02b7ebfe92b23d9ec34",
        );
        check(
            "80000000000000000000000000000000",
            z,
            "0edd33d3c621e546455bd8ba1418bec8",
        );
        check(
            &"00".repeat(24),
            "1b077a6af4b7f98229de786d7516b639",
            "275cfc0413d8ccb70513c3859b1d0f72",
        );
        check(
            &"00".repeat(32),
            "014730f80ac625fe84f026c60bfd547d",
            "5c9d844ed46f9885085e5d6a4f94c7d7",
        );
    }

    /// The whole AESAVS VarTxt and VarKey sets for each key size (inputs with the first i bits
    /// set), checked through a SHA-256 of all ciphertexts computed with an independent AES
    /// (Python `cryptography`).
    #[test]
    fn aesavs_vartxt_varkey_digest() {
        fn first_bits(n: usize, len: usize) -> Vec<u8> {
            (0..len)
                .map(|i| (0xFF00u16 >> n.saturating_sub(8 * i).min(8)) as u8)
                .collect()
        }
        let digests = [
            (
                16,
                "f4332cdf05423aa99027ce7c85d8fce6020e2635a70f423d3532d9415874eec3",
            ),
            (
                24,
                "00bcf3bb6fa7929be952d20ebf42a18e6dbd1e4da1294cdcc775f212d05a3473",
            ),
            (
                32,
                "22d77aaf4191f9a4cbda3987f0489376b11a25c533b0ee850c9db645aee1588b",
            ),
        ];
        for (key_len, digest) in digests {
            let mut hash = Sha256::new();
            let zero_key = vec![0u8; key_len];
            for i in 1..=128 {
                let pt = first_bits(i, 16);
                let ct = enc(&zero_key, &pt);
                assert_eq!(dec(&zero_key, &ct), pt);
                hash.update(&ct);
            }
            for i in 1..=8 * key_len {
                let key = first_bits(i, key_len);
                let ct = enc(&key, &[0u8; 16]);
                assert_eq!(dec(&key, &ct), [0u8; 16]);
                hash.update(&ct);
            }
            assert_eq!(hex::encode(hash.finalize()), digest, "AES-{}", key_len * 8);
        }
    }

    /// Random keys and data, cross-checked with Python `cryptography`.
    #[test]
    fn random_keys_cross_check() {
        check(
            "906e8c867d1e9b3f92cb3b2dbd5720ba",
            "4806e8a997e2a670eab5987fde0b4d88",
            "ec5b41ea310cd2e4f9ed99350bb79683",
        );
        check(
            "8d372c183a2d096a2642e037a14e8040",
            "7d1d4bb4224d7df77118d89c839feae0cbad77f77435569951ada9a581727387\
             b43dbbbbf63e799c60fbc8627b7fc2f360ce0b5757d7fc027630b6fe13105807\
             347be763bac8e98837d0b1daa1c4d6aade86fe403c0cbebdf6ae8d37618df19b\
             cf9e2dd62b7841747b3a40f59c5e3070",
            "5b1059bb1f3a2090cc045aa2850df38d67d99b30c489537312b67488a05c226c\
             c52941e5f8d0ee8e87a59c0352489bbc2da57844425ba238265f6115dcb49e46\
             6afeb11853df1a8221e74de34bc532f6c1a6dde6d01e54973d81fb71470048fb\
             24a12806cce10541ec30b818decf902e",
        );
        check(
            "d413d236f795032eb0137edfffb160cbc57cafc870044820",
            "43c9b8974efd03628b0954bb189b6a13",
            "d04e88637c9b2ca1e26382cd55efb56e",
        );
        check(
            "b7293957c424bfa12f6987906478881c30f3800645222e00",
            "e9f5563f9a71367b27324b26b72be81953633018a29348ab533a7608282a663f\
             93817521cb39fa5ac09a190091103ea9fda8477d73962342f5d96eb4e26aa261\
             5bb489eedce16f9cef2567c141b50c78dd53894ed51b35d7ce447ff2550152b9\
             930508a6b2b26a3db197a40697c512b8",
            "23cc903ffc2ae4a1740e2e2aa07d77aa24759a56099a619a1fdf320914f4c9e2\
             c5d7c4ec3faf2f7a580feb6f98d0b02f47d2c9b01b52f54d0d979c05fcb912a8\
             13a0ab336b4f698d6ebd954bbd84b12d5885983b4d253102f0d8c1b778573de1\
             5fc37af5b41dd76d725faba250b9200d",
        );
        check(
            "f32ad22e9178a3238db2b7ce8fe931089c98d2309addb25d58749b1a176f841a",
            "4093db29076c6f482453472448b94c60",
            "efc095d4ad7513a59148ed27b70e77a0",
        );
        check(
            "a33f876c7151e4899720ffd280684c07147e7b80c54b3c592a5794597719c484",
            "1251127f34285d0467e51d9e8e59b738ab2cf3a0e96aa4855b83ed95747bce15\
             8cfb84d3d120b93f4443ee58ef50b26711d11644b8864af9356c080a7c6859fe\
             14a11236d06badbf94993c11798f9c7dacf6e96966c5b5350feb929ca9f54e6a\
             274b14775354ad2a4a440bec89b4dd09",
            "3c10d9f2f3ddcd3c69c74432010e58b29d118d24ad2558233580d853c90fac12\
             fa4d819b9f771bd2457b44b7866566350c2d65f271e9f69dc210911806dd1528\
             c3d4fecdd4f3ea450fc0501846404fcf1d71f0959bcd096b1b2ceaec12c8d59d\
             2bd6ccf182f7b3c8f9495fc324035f5e",
        );
    }

    /// 1000 chained ECB encryptions of a seven-block buffer (a full state plus a three-block
    /// tail), then 1000 decryptions back; the midpoint comes from Python `cryptography`.
    #[test]
    fn chained_encryptions() {
        let cases = [
            (
                16,
                "a2e3f248aafd22f0f084dc0c0ed941b5a7fa72492c5a53d426fddaeffec62d88\
                 4e1003ecb2f205346fffc80899f3bd532a4d45ac5c5e122227006a3c56c74bd8\
                 25144b60cc9ba28ae52c3ea5e3358508c7a0c50eb7e09e8f152ea002a597741c\
                 2aa85825fef6d28a6d2ec26116c9e36f",
            ),
            (
                24,
                "afbd7212b80fd402a84eb3bad976ef0438609d5e43b98b2372bec2a263f57501\
                 a219d813aad4d5af077bf4dc72e816d7289011c87505135c7d0a7e92697961a3\
                 644b57e28b6c6511ba519b7fdfe9fd822f8e4fa071cd979ae3b4db6dbd51b4c1\
                 304117fa59a7333f014d6b5c2ec8d7e2",
            ),
            (
                32,
                "490e96cfe3eb1b07346f434d30b65b794608d69e0dbf12cdbf8891c748c130f1\
                 f20de1516d26809f2b36ddf53be846f8df2a58d18735944b76d41c013aabf2c1\
                 ffe668203a4c84c4c2383caa31550d2ca2feec17e4e341f7a31f5755ef936858\
                 5ca4796fa28dd8df5eb9f1cb046084b0",
            ),
        ];
        for (key_len, want) in cases {
            let key: Vec<u8> = (0..key_len as u8).collect();
            let aes = AesSoft::new(&key);
            let start: Vec<u8> = (0..112u8).collect();
            let mut buf = start.clone();
            for _ in 0..1000 {
                aes.encrypt_ecb(&mut buf);
            }
            assert_eq!(hex::encode(&buf), want, "AES-{}", key_len * 8);
            for _ in 0..1000 {
                aes.decrypt_ecb(&mut buf);
            }
            assert_eq!(buf, start);
        }
    }

    /// Every buffer length from one block to 1 KiB, every key size: decryption inverts
    /// encryption, and the four-block path agrees with the padded-tail path block by block.
    #[test]
    fn roundtrip_all_lengths() {
        let mut rng = StdRng::seed_from_u64(0x5ec7_0c27);
        for key_len in [16, 24, 32] {
            let mut key = vec![0u8; key_len];
            rng.fill_bytes(&mut key);
            let aes = AesSoft::new(&key);
            for len in (BLOCK..=1024).step_by(BLOCK) {
                let mut pt = vec![0u8; len];
                rng.fill_bytes(&mut pt);
                let mut buf = pt.clone();
                aes.encrypt_ecb(&mut buf);
                assert_ne!(buf, pt);
                let mut one_by_one = pt.clone();
                for block in one_by_one.chunks_exact_mut(BLOCK) {
                    aes.encrypt_ecb(block);
                }
                assert_eq!(buf, one_by_one, "len {len}, AES-{}", key_len * 8);
                aes.decrypt_ecb(&mut buf);
                assert_eq!(buf, pt, "len {len}, AES-{}", key_len * 8);
            }
        }
    }

    #[test]
    fn empty_buffer_and_backend() {
        let aes = AesSoft::new(&[7u8; 16]);
        assert_eq!(aes.backend(), Backend::Portable);
        let mut empty: [u8; 0] = [];
        aes.encrypt_ecb(&mut empty);
        aes.decrypt_ecb(&mut empty);
    }
}
