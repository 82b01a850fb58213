//! Portable LEA, the key schedule every backend shares, and the mode drivers the SIMD backends
//! fall back to for data-unit shapes their fused kernels do not cover.
//!
//! Block layout (KS X 3246): a 128-bit block is four 32-bit little-endian words `X0..X3`; round
//! `i` with the six-word round key `K` is
//!
//! ```text
//! X0' = ROL9((X0 ^ K0) + (X1 ^ K1))
//! X1' = ROR5((X1 ^ K2) + (X2 ^ K3))
//! X2' = ROR3((X2 ^ K4) + (X3 ^ K5))
//! X3' = X0
//! ```
//!
//! The word rotation `X3' = X0` is not done with moves: every round count (24/28/32) is a multiple
//! of four, so four rounds are unrolled with the roles of the four state words rotated, which
//! brings each word back to its slot. The SIMD backends use the same scheme on vectors.

use zeroize::Zeroize;

use crate::backend::Backend;
use crate::engine::{Block, BlockEngine, Direction, BLOCK};
use crate::gf128;

/// Key-schedule constants: the hexadecimal expansion of sqrt(766965) ("LEA" in ASCII).
const DELTA: [u32; 8] = [
    0xc3ef_e9db,
    0x4462_6b02,
    0x79e2_7c8a,
    0x78df_30ec,
    0x715e_a49e,
    0xc785_da0a,
    0xe04e_f22a,
    0xe5c4_0957,
];

/// Rounds of LEA-256, the most of the three key sizes.
pub(super) const MAX_ROUNDS: usize = 32;

/// Rotation amounts of the key-schedule words `T0..T5`.
const KS_ROT: [u32; 6] = [1, 3, 6, 11, 13, 17];

/// Blocks the portable code keeps in flight. One block is a serial chain of about three
/// instructions per round; four independent chains keep the scalar ALU ports busy while the state
/// (16 words) still fits in registers. (Baseline x86-64 has no vector rotate and LLVM keeps this
/// scalar; the SIMD backends exist for that.)
const LANES: usize = 4;

/// Bytes of scratch the chunked mode drivers use on the stack (one 4 KiB sector).
const CHUNK: usize = 4096;

/// The expanded key: `rounds` round keys of six words, and the same keys in the form decryption
/// uses (see [`RoundKeys::dec_keys`]). Zeroized on drop.
pub(super) struct RoundKeys {
    rounds: usize,
    rk: [[u32; 6]; MAX_ROUNDS],
    dk: [[u32; 6]; MAX_ROUNDS],
}

impl RoundKeys {
    /// Expand a 16-, 24- or 32-byte key (LEA-128/192/256: 24/28/32 rounds).
    pub(super) fn new(key: &[u8]) -> Self {
        assert!(
            matches!(key.len(), 16 | 24 | 32),
            "LEA key must be 16, 24 or 32 bytes"
        );
        let mut t = [0u32; 8];
        for (w, c) in t.iter_mut().zip(key.chunks_exact(4)) {
            *w = u32::from_le_bytes(c.try_into().unwrap());
        }
        let mut rk = [[0u32; 6]; MAX_ROUNDS];
        let rounds = match key.len() {
            16 => {
                for (i, k) in rk.iter_mut().enumerate().take(24) {
                    let d = DELTA[i % 4];
                    for (j, w) in t.iter_mut().take(4).enumerate() {
                        // T0..T3 rotate by 1, 3, 6, 11.
                        let r = [1, 3, 6, 11][j];
                        *w = w
                            .wrapping_add(d.rotate_left(((i + j) % 32) as u32))
                            .rotate_left(r);
                    }
                    *k = [t[0], t[1], t[2], t[1], t[3], t[1]];
                }
                24
            }
            24 => {
                for (i, k) in rk.iter_mut().enumerate().take(28) {
                    let d = DELTA[i % 6];
                    for (j, w) in t.iter_mut().take(6).enumerate() {
                        *w = w
                            .wrapping_add(d.rotate_left(((i + j) % 32) as u32))
                            .rotate_left(KS_ROT[j]);
                    }
                    k.copy_from_slice(&t[..6]);
                }
                28
            }
            _ => {
                for (i, k) in rk.iter_mut().enumerate() {
                    let d = DELTA[i % 8];
                    for (j, out) in k.iter_mut().enumerate() {
                        let w = &mut t[(6 * i + j) % 8];
                        *w = w
                            .wrapping_add(d.rotate_left(((i + j) % 32) as u32))
                            .rotate_left(KS_ROT[j]);
                        *out = *w;
                    }
                }
                32
            }
        };
        t.zeroize();
        let dk = rk.map(|k| [k[0], k[1], k[1] ^ k[2], k[3], k[3] ^ k[4], k[5]]);
        Self { rounds, rk, dk }
    }

    /// The round keys in encryption order (24, 28 or 32 of them).
    #[inline]
    pub(super) fn keys(&self) -> &[[u32; 6]] {
        &self.rk[..self.rounds]
    }

    /// The round keys for decryption (applied in reverse order): `[K0, K1, K1^K2, K3, K3^K4, K5]`.
    /// Inverting a round recovers `X1 = S1 ^ K1` from a difference `S1`; the next step needs
    /// `X1 ^ K2`, which is `S1 ^ (K1^K2)`, so the chain through a round is one XOR shorter.
    #[inline]
    pub(super) fn dec_keys(&self) -> &[[u32; 6]] {
        &self.dk[..self.rounds]
    }
}

impl Drop for RoundKeys {
    fn drop(&mut self) {
        self.rk.zeroize();
        self.dk.zeroize();
    }
}

/// `N` blocks in word-sliced form: `x[w][l]` is word `w` of block `l`.
type Lanes<const N: usize> = [[u32; N]; 4];

/// One encryption round on the words in slots `A, B, C, D` (playing `X0..X3`); afterwards the new
/// `X0..X3` are in slots `B, C, D, A`. All key XORs are taken from the old words first, which
/// schedules better than updating lane by lane.
#[inline(always)]
fn round<const N: usize, const A: usize, const B: usize, const C: usize, const D: usize>(
    x: &mut Lanes<N>,
    k: &[u32; 6],
) {
    let xk = |w: usize, i: usize| -> [u32; N] { core::array::from_fn(|l| x[w][l] ^ k[i]) };
    let (a0, b1, b2, c3, c4, d5) = (xk(A, 0), xk(B, 1), xk(B, 2), xk(C, 3), xk(C, 4), xk(D, 5));
    x[D] = core::array::from_fn(|l| c4[l].wrapping_add(d5[l]).rotate_right(3));
    x[C] = core::array::from_fn(|l| b2[l].wrapping_add(c3[l]).rotate_right(5));
    x[B] = core::array::from_fn(|l| a0[l].wrapping_add(b1[l]).rotate_left(9));
}

/// Inverse of `round::<A, B, C, D>` with a decryption key `k` (see [`RoundKeys::dec_keys`]): the
/// state is in slots `B, C, D, A` and goes back to `A, B, C, D` (slot `A` already holds `X0`).
#[inline(always)]
fn inv_round<const N: usize, const A: usize, const B: usize, const C: usize, const D: usize>(
    x: &mut Lanes<N>,
    k: &[u32; 6],
) {
    #[allow(clippy::needless_range_loop)] // lane `l` of four different words
    for l in 0..N {
        let s1 = x[B][l].rotate_right(9).wrapping_sub(x[A][l] ^ k[0]);
        let s2 = x[C][l].rotate_left(5).wrapping_sub(s1 ^ k[2]);
        let s3 = x[D][l].rotate_left(3).wrapping_sub(s2 ^ k[4]);
        x[B][l] = s1 ^ k[1];
        x[C][l] = s2 ^ k[3];
        x[D][l] = s3 ^ k[5];
    }
}

#[inline(always)]
fn encrypt_lanes<const N: usize>(rk: &[[u32; 6]], x: &mut Lanes<N>) {
    for k in rk.chunks_exact(4) {
        round::<N, 0, 1, 2, 3>(x, &k[0]);
        round::<N, 1, 2, 3, 0>(x, &k[1]);
        round::<N, 2, 3, 0, 1>(x, &k[2]);
        round::<N, 3, 0, 1, 2>(x, &k[3]);
    }
}

#[inline(always)]
fn decrypt_lanes<const N: usize>(rk: &[[u32; 6]], x: &mut Lanes<N>) {
    for k in rk.chunks_exact(4).rev() {
        inv_round::<N, 3, 0, 1, 2>(x, &k[3]);
        inv_round::<N, 2, 3, 0, 1>(x, &k[2]);
        inv_round::<N, 1, 2, 3, 0>(x, &k[1]);
        inv_round::<N, 0, 1, 2, 3>(x, &k[0]);
    }
}

#[inline(always)]
fn load<const N: usize>(bytes: &[u8]) -> Lanes<N> {
    let mut x = [[0u32; N]; 4];
    for (l, block) in bytes.chunks_exact(BLOCK).take(N).enumerate() {
        for (w, word) in block.chunks_exact(4).enumerate() {
            x[w][l] = u32::from_le_bytes(word.try_into().unwrap());
        }
    }
    x
}

#[inline(always)]
fn store<const N: usize>(x: &Lanes<N>, bytes: &mut [u8]) {
    for (l, block) in bytes.chunks_exact_mut(BLOCK).take(N).enumerate() {
        for (w, word) in block.chunks_exact_mut(4).enumerate() {
            word.copy_from_slice(&x[w][l].to_le_bytes());
        }
    }
}

/// ECB over whole blocks of `buf`: `LANES` blocks at a time, then one at a time.
fn ecb(keys: &RoundKeys, buf: &mut [u8], dir: Direction) {
    let (rk, dk) = (keys.keys(), keys.dec_keys());
    let mut chunks = buf.chunks_exact_mut(LANES * BLOCK);
    for chunk in &mut chunks {
        let mut x = load::<LANES>(chunk);
        match dir {
            Direction::Encrypt => encrypt_lanes(rk, &mut x),
            Direction::Decrypt => decrypt_lanes(dk, &mut x),
        }
        store(&x, chunk);
    }
    for block in chunks.into_remainder().chunks_exact_mut(BLOCK) {
        let mut x = load::<1>(block);
        match dir {
            Direction::Encrypt => encrypt_lanes(rk, &mut x),
            Direction::Decrypt => decrypt_lanes(dk, &mut x),
        }
        store(&x, block);
    }
}

/// Encrypt one block with `keys` (used by the SIMD backends for single-block calls, where a
/// padded vector set would only add latency).
pub(super) fn encrypt_block(keys: &RoundKeys, block: &mut [u8]) {
    ecb(keys, block, Direction::Encrypt);
}

/// Decrypt one block with `keys`.
pub(super) fn decrypt_block(keys: &RoundKeys, block: &mut [u8]) {
    ecb(keys, block, Direction::Decrypt);
}

/// Portable LEA-128/192/256.
pub(crate) struct LeaSoft {
    keys: RoundKeys,
}

impl LeaSoft {
    /// Expand `key` (16, 24 or 32 bytes; checked by the caller).
    pub(crate) fn new(key: &[u8]) -> Self {
        Self {
            keys: RoundKeys::new(key),
        }
    }
}

impl BlockEngine for LeaSoft {
    fn backend(&self) -> Backend {
        Backend::Portable
    }

    fn encrypt_ecb(&self, buf: &mut [u8]) {
        ecb(&self.keys, buf, Direction::Encrypt);
    }

    fn decrypt_ecb(&self, buf: &mut [u8]) {
        ecb(&self.keys, buf, Direction::Decrypt);
    }

    // Chunked across unit boundaries so small data units still fill all lanes.
    fn xts_encrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
        xts_chunked(self, buf, unit_len, tweaks, Direction::Encrypt);
    }

    fn xts_decrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
        xts_chunked(self, buf, unit_len, tweaks, Direction::Decrypt);
    }

    fn cbc_decrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
        cbc_decrypt_chunked(self, buf, unit_len, ivs);
    }
}

/// XTS over whole units for any unit length: the tweaks of up to 4 KiB of blocks (crossing unit
/// boundaries freely) go into a stack buffer, then XOR, one ECB call, XOR. Same result as the
/// trait's default, but small units do not each pay for a separate, mostly empty ECB call.
pub(super) fn xts_chunked<E: BlockEngine + ?Sized>(
    engine: &E,
    buf: &mut [u8],
    unit_len: usize,
    tweaks: &[Block],
    dir: Direction,
) {
    assert!(
        unit_len > 0 && unit_len.is_multiple_of(BLOCK),
        "unit length must be a positive multiple of 16"
    );
    let units = (buf.len() / unit_len).min(tweaks.len());
    let buf = &mut buf[..units * unit_len];
    let mut tw = [0u8; CHUNK];
    let mut next: Block = [0; BLOCK];
    for (c, chunk) in buf.chunks_mut(CHUNK).enumerate() {
        let start = c * CHUNK;
        let t = &mut tw[..chunk.len()];
        let mut filled = 0;
        while filled < t.len() {
            let pos = (start + filled) % unit_len;
            if pos == 0 {
                next = tweaks[(start + filled) / unit_len];
            }
            let take = (unit_len - pos).min(t.len() - filled);
            next = gf128::fill_tweaks(next, &mut t[filled..filled + take]);
            filled += take;
        }
        crate::engine::xor_into(chunk, t);
        match dir {
            Direction::Encrypt => engine.encrypt_ecb(chunk),
            Direction::Decrypt => engine.decrypt_ecb(chunk),
        }
        crate::engine::xor_into(chunk, t);
    }
    tw.zeroize();
    next.zeroize();
}

/// CBC decryption of whole units for any unit length: up to 4 KiB of ciphertext (crossing unit
/// boundaries) is saved, ECB-decrypted in one call, then each block is XORed with the ciphertext
/// before it, or with its unit's IV.
pub(super) fn cbc_decrypt_chunked<E: BlockEngine + ?Sized>(
    engine: &E,
    buf: &mut [u8],
    unit_len: usize,
    ivs: &[Block],
) {
    assert!(
        unit_len > 0 && unit_len.is_multiple_of(BLOCK),
        "unit length must be a positive multiple of 16"
    );
    let units = (buf.len() / unit_len).min(ivs.len());
    let buf = &mut buf[..units * unit_len];
    let mut saved = [0u8; CHUNK];
    let mut carry: Block = [0; BLOCK];
    for (c, chunk) in buf.chunks_mut(CHUNK).enumerate() {
        let start = c * CHUNK;
        let saved = &mut saved[..chunk.len()];
        saved.copy_from_slice(chunk);
        engine.decrypt_ecb(chunk);
        for (i, block) in chunk.chunks_exact_mut(BLOCK).enumerate() {
            let at = start + i * BLOCK;
            let prev: &[u8] = if at.is_multiple_of(unit_len) {
                &ivs[at / unit_len]
            } else if i == 0 {
                &carry
            } else {
                &saved[(i - 1) * BLOCK..i * BLOCK]
            };
            crate::engine::xor_into(block, prev);
        }
        carry.copy_from_slice(&saved[saved.len() - BLOCK..]);
    }
    saved.zeroize();
}

#[cfg(test)]
pub(super) mod test_support {
    //! Shared by the tests of all three LEA backends.

    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

    /// Every record of the vector file `file` (in `tests/vectors/`; a missing file fails).
    fn load(file: &str) -> Vec<sectorcrypt_testkit::vectors::Record> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
        sectorcrypt_testkit::vectors::load(&path.join(file))
    }

    /// Check `make(key)` against the KISA ECB and CBC records (all three key sizes).
    pub(in crate::lea) fn check_kisa(make: &dyn Fn(&[u8]) -> Box<dyn BlockEngine>) {
        let records = load("lea-kisa.txt");
        let mut seen = [0usize; 3];
        for r in &records {
            let e = make(&r.key);
            if r.name.ends_with("/ECB") {
                let mut buf = r.plaintext.clone();
                e.encrypt_ecb(&mut buf);
                assert_eq!(
                    hex::encode(&buf),
                    hex::encode(&r.ciphertext),
                    "ECB enc, key {}",
                    hex::encode(&r.key)
                );
                e.decrypt_ecb(&mut buf);
                assert_eq!(buf, r.plaintext, "ECB dec, key {}", hex::encode(&r.key));
                seen[r.key.len() / 8 - 2] += 1;
            } else if r.name.ends_with("/CBC") && !r.plaintext.is_empty() {
                let iv: Block = r.iv.as_slice().try_into().unwrap();
                let mut buf = r.plaintext.clone();
                e.cbc_encrypt_units(&mut buf, r.plaintext.len(), &[iv]);
                assert_eq!(buf, r.ciphertext, "CBC enc, key {}", hex::encode(&r.key));
                e.cbc_decrypt_units(&mut buf, r.plaintext.len(), &[iv]);
                assert_eq!(buf, r.plaintext, "CBC dec, key {}", hex::encode(&r.key));
            }
        }
        assert!(
            seen.iter().all(|&n| n >= 10),
            "ECB records per key size: {seen:?}"
        );
    }

    /// Check `make(K1)` against the XTS-LEA records whose length is a whole number of blocks.
    pub(in crate::lea) fn check_xts(make: &dyn Fn(&[u8]) -> Box<dyn BlockEngine>) {
        let records = load("xts-lea.txt");
        let mut n = 0;
        for r in records {
            if !r.plaintext.len().is_multiple_of(BLOCK) {
                continue; // ciphertext stealing is handled above the engine
            }
            let (k1, k2) = r.key.split_at(r.key.len() / 2);
            let mut tweak: Block = r.iv.as_slice().try_into().unwrap();
            LeaSoft::new(k2).encrypt_ecb(&mut tweak);
            let e = make(k1);
            let mut buf = r.plaintext.clone();
            e.xts_encrypt_units(&mut buf, r.plaintext.len(), &[tweak]);
            assert_eq!(
                hex::encode(&buf),
                hex::encode(&r.ciphertext),
                "XTS enc, key {}",
                hex::encode(&r.key)
            );
            e.xts_decrypt_units(&mut buf, r.plaintext.len(), &[tweak]);
            assert_eq!(buf, r.plaintext, "XTS dec, key {}", hex::encode(&r.key));
            n += 1;
        }
        assert!(n >= 8, "only {n} whole-block XTS records (the file has 8)");
    }

    /// Forwards only ECB, so every mode comes from the trait's generic default code.
    pub(in crate::lea) struct DefaultModes(pub LeaSoft);

    impl BlockEngine for DefaultModes {
        fn backend(&self) -> Backend {
            Backend::Portable
        }
        fn encrypt_ecb(&self, buf: &mut [u8]) {
            self.0.encrypt_ecb(buf);
        }
        fn decrypt_ecb(&self, buf: &mut [u8]) {
            self.0.decrypt_ecb(buf);
        }
    }

    /// Single-block LEA straight from the specification, independent of the lane code.
    pub(in crate::lea) fn reference_block(keys: &RoundKeys, block: &[u8], dir: Direction) -> Block {
        let mut x = [0u32; 4];
        for (w, c) in x.iter_mut().zip(block.chunks_exact(4)) {
            *w = u32::from_le_bytes(c.try_into().unwrap());
        }
        match dir {
            Direction::Encrypt => {
                for k in keys.keys() {
                    x = [
                        (x[0] ^ k[0]).wrapping_add(x[1] ^ k[1]).rotate_left(9),
                        (x[1] ^ k[2]).wrapping_add(x[2] ^ k[3]).rotate_right(5),
                        (x[2] ^ k[4]).wrapping_add(x[3] ^ k[5]).rotate_right(3),
                        x[0],
                    ];
                }
            }
            Direction::Decrypt => {
                for k in keys.keys().iter().rev() {
                    let x0 = x[3];
                    let x1 = x[0].rotate_right(9).wrapping_sub(x0 ^ k[0]) ^ k[1];
                    let x2 = x[1].rotate_left(5).wrapping_sub(x1 ^ k[2]) ^ k[3];
                    let x3 = x[2].rotate_left(3).wrapping_sub(x2 ^ k[4]) ^ k[5];
                    x = [x0, x1, x2, x3];
                }
            }
        }
        let mut out = [0u8; BLOCK];
        for (c, w) in out.chunks_exact_mut(4).zip(x) {
            c.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    fn random_block(rng: &mut StdRng) -> Block {
        let mut b = [0u8; BLOCK];
        rng.fill_bytes(&mut b);
        b
    }

    /// A data-unit length: mostly the shapes the kernels special-case, sometimes anything.
    fn random_unit_len(rng: &mut StdRng) -> usize {
        match rng.gen_range(0..4) {
            0 => [16, 32, 128, 256, 512, 1024, 2048, 4096][rng.gen_range(0..8)],
            1 => 256 * rng.gen_range(1..=16),
            2 => 128 * rng.gen_range(1..=32),
            _ => 16 * rng.gen_range(1..=256),
        }
    }

    /// Compare every method of `make(key)` with the portable engine and with the generic trait
    /// defaults over random keys of all sizes, lengths, unit sizes and unit counts.
    pub(in crate::lea) fn compare_random(
        make: &dyn Fn(&[u8]) -> Box<dyn BlockEngine>,
        seed: u64,
        iters: usize,
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        for it in 0..iters {
            let klen = [16, 24, 32][it % 3];
            let mut key = vec![0u8; klen];
            rng.fill_bytes(&mut key);
            let e = make(&key);
            let soft = LeaSoft::new(&key);
            let dflt = DefaultModes(LeaSoft::new(&key));

            // ECB on any number of blocks (tails of every size), against the spec's single block.
            let blocks = if rng.gen_bool(0.5) {
                rng.gen_range(0..40)
            } else {
                rng.gen_range(0..700)
            };
            let mut data = vec![0u8; blocks * BLOCK];
            rng.fill_bytes(&mut data);
            for dir in [Direction::Encrypt, Direction::Decrypt] {
                let mut want = data.clone();
                for b in want.chunks_exact_mut(BLOCK) {
                    let r = reference_block(&soft.keys, b, dir);
                    b.copy_from_slice(&r);
                }
                let mut got = data.clone();
                match dir {
                    Direction::Encrypt => e.encrypt_ecb(&mut got),
                    Direction::Decrypt => e.decrypt_ecb(&mut got),
                }
                assert!(got == want, "ECB {dir:?}, key {klen}, {blocks} blocks");
            }

            // Whole-unit modes.
            let unit_len = random_unit_len(&mut rng);
            let max_units = (96 * 1024 / unit_len).max(1);
            let units = if rng.gen_bool(0.3) {
                rng.gen_range(1..=3)
            } else {
                rng.gen_range(1..=max_units.min(300))
            };
            let mut data = vec![0u8; unit_len * units];
            rng.fill_bytes(&mut data);
            let tweaks: Vec<Block> = (0..units).map(|_| random_block(&mut rng)).collect();
            let ctx = format!("key {klen}, unit {unit_len} x {units}");

            type Method = fn(&dyn BlockEngine, &mut [u8], usize, &[Block]);
            let methods: [(&str, Method); 4] = [
                ("xts enc", |e, b, u, t| e.xts_encrypt_units(b, u, t)),
                ("xts dec", |e, b, u, t| e.xts_decrypt_units(b, u, t)),
                ("cbc enc", |e, b, u, t| e.cbc_encrypt_units(b, u, t)),
                ("cbc dec", |e, b, u, t| e.cbc_decrypt_units(b, u, t)),
            ];
            for (name, m) in methods {
                let mut want = data.clone();
                m(&dflt, &mut want, unit_len, &tweaks);
                let mut got_soft = data.clone();
                m(&soft, &mut got_soft, unit_len, &tweaks);
                assert!(got_soft == want, "portable {name}, {ctx}");
                let mut got = data.clone();
                m(&*e, &mut got, unit_len, &tweaks);
                assert!(got == want, "{} {name}, {ctx}", e.backend());
            }
            // Round trips through the backend itself.
            let mut buf = data.clone();
            e.xts_encrypt_units(&mut buf, unit_len, &tweaks);
            e.xts_decrypt_units(&mut buf, unit_len, &tweaks);
            assert!(buf == data, "xts round trip, {ctx}");
            e.cbc_encrypt_units(&mut buf, unit_len, &tweaks);
            e.cbc_decrypt_units(&mut buf, unit_len, &tweaks);
            assert!(buf == data, "cbc round trip, {ctx}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    fn make(key: &[u8]) -> Box<dyn BlockEngine> {
        Box::new(LeaSoft::new(key))
    }

    #[test]
    fn key_schedule_first_round_keys() {
        // KS X 3246 appendix, LEA-128 key 0f1e2d3c4b5a69788796a5b4c3d2e1f0: first round key.
        let k = RoundKeys::new(&hex::decode("0f1e2d3c4b5a69788796a5b4c3d2e1f0").unwrap());
        assert_eq!(k.keys().len(), 24);
        assert_eq!(
            k.keys()[0],
            [0x003a0fd4, 0x02497010, 0x194f7db1, 0x02497010, 0x090d0883, 0x02497010]
        );
        assert_eq!(RoundKeys::new(&[0; 24]).keys().len(), 28);
        assert_eq!(RoundKeys::new(&[0; 32]).keys().len(), 32);
    }

    #[test]
    fn spec_vectors() {
        // KS X 3246 / ISO/IEC 29192-2 single-block vectors for the three key sizes.
        let cases = [
            (
                "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
                "101112131415161718191a1b1c1d1e1f",
                "9fc84e3528c6c6185532c7a704648bfd",
            ),
            (
                "0f1e2d3c4b5a69788796a5b4c3d2e1f0f0e1d2c3b4a59687",
                "202122232425262728292a2b2c2d2e2f",
                "6fb95e325aad1b878cdcf5357674c6f2",
            ),
            (
                "0f1e2d3c4b5a69788796a5b4c3d2e1f0f0e1d2c3b4a5968778695a4b3c2d1e0f",
                "303132333435363738393a3b3c3d3e3f",
                "d651aff647b189c13a8900ca27f9e197",
            ),
        ];
        for (key, pt, ct) in cases {
            let e = LeaSoft::new(&hex::decode(key).unwrap());
            let mut b = hex::decode(pt).unwrap();
            e.encrypt_ecb(&mut b);
            assert_eq!(hex::encode(&b), ct);
            assert_eq!(
                reference_block(&e.keys, &hex::decode(pt).unwrap(), Direction::Encrypt).to_vec(),
                b
            );
            e.decrypt_ecb(&mut b);
            assert_eq!(hex::encode(&b), pt);
        }
    }

    #[test]
    fn kisa_vectors() {
        check_kisa(&make);
    }

    #[test]
    fn xts_vectors() {
        check_xts(&make);
    }

    #[test]
    fn random_against_defaults() {
        compare_random(&make, 1, 150);
    }

    #[test]
    fn default_modes_match_vectors() {
        check_kisa(&|k| Box::new(DefaultModes(LeaSoft::new(k))));
        check_xts(&|k| Box::new(DefaultModes(LeaSoft::new(k))));
    }
}
