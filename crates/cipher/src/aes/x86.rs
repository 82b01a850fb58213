//! What the x86 AES backends share: AES key expansion with AES-NI, the clamping of requests to
//! what the kernels may touch, the prefetching of a source elsewhere, and the XTS tweak sequence
//! for unit sizes the wide kernels do not keep in registers.
//!
//! The FIPS-197 word recurrence runs in general-purpose registers; only SubWord goes through
//! `aeskeygenassist` (constant time, no S-box table), so one loop covers 128-, 192- and 256-bit
//! keys. Decryption keys for the Equivalent Inverse Cipher (what `aesdec` expects) come from
//! `aesimc`. No branch or index depends on key bytes.

use core::arch::x86_64::*;

use zeroize::Zeroize;

use crate::engine::{Block, BLOCK};

/// Clamp a units request to whole units that have a tweak/IV (the kernels index by these
/// lengths, so memory safety never depends on the caller's preconditions).
pub(crate) fn units_region(buf: &mut [u8], unit_len: usize, n: usize) -> &mut [u8] {
    assert!(
        unit_len > 0 && unit_len.is_multiple_of(BLOCK),
        "unit length must be a non-zero multiple of 16"
    );
    debug_assert_eq!(buf.len(), unit_len * n);
    let units = n.min(buf.len() / unit_len);
    &mut buf[..units * unit_len]
}

/// How far ahead of the group being decrypted a source elsewhere is prefetched. Such a source is
/// the page cache (reads decrypted straight from it), which is in memory, not in a cache; the
/// hardware prefetchers stop at every 4 KiB page, so without this the AES rounds wait for each
/// page's first lines. 2 KiB ahead decrypted a source in memory 1.35x faster on AMD Zen 4
/// (1 KiB: 1.2x; 4 and 8 KiB no better than 2).
const SOURCE_AHEAD: usize = 2048;

/// The `len` bytes of `src` (if any) at `at`, after asking for those `SOURCE_AHEAD` bytes
/// further on (as far as `src` goes). Takes the `Option` itself: the kernels' `src.map(..)` was
/// left a call, and a call in the group loop spills every vector register around it.
#[inline(always)]
pub(crate) fn source_group(src: Option<&[u8]>, at: usize, len: usize) -> Option<&[u8]> {
    let src = src?;
    if let Some(ahead) = src.get(at + SOURCE_AHEAD..) {
        sectorcrypt_secret::prefetch(ahead.as_ptr(), len.min(ahead.len()));
    }
    Some(&src[at..][..len])
}

/// Whole blocks of `buf`.
pub(crate) fn whole_blocks(buf: &mut [u8]) -> &mut [u8] {
    debug_assert_eq!(buf.len() % BLOCK, 0);
    let n = buf.len() / BLOCK * BLOCK;
    &mut buf[..n]
}

/// `impl BlockEngine` for an x86 AES engine: its module has the kernels `ecb::<DEC>`,
/// `xts::<DEC>`, `cbc_encrypt` and `cbc_decrypt` over `self.keys`, and the engine is only made
/// after detecting their target features (its `_cpu` field is the proof). Every method trims its
/// buffer to whole blocks or whole units first, so that the kernels never see a partial one.
macro_rules! x86_block_engine {
    ($engine:ty, $backend:expr) => {
        impl $crate::engine::BlockEngine for $engine {
            fn backend(&self) -> $crate::backend::Backend {
                $backend
            }

            fn stack_bytes(&self) -> usize {
                $crate::wipe::SHALLOW_STACK
            }

            fn encrypt_ecb(&self, buf: &mut [u8]) {
                // SAFETY: `self._cpu` proves the kernel's target features were detected.
                unsafe { ecb::<false>(&self.keys, $crate::aes::x86::whole_blocks(buf)) }
            }

            fn decrypt_ecb(&self, buf: &mut [u8]) {
                // SAFETY: as in `encrypt_ecb`.
                unsafe { ecb::<true>(&self.keys, $crate::aes::x86::whole_blocks(buf)) }
            }

            fn xts_encrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
                let buf = $crate::aes::x86::units_region(buf, unit_len, tweaks.len());
                // SAFETY: as in `encrypt_ecb`.
                unsafe { xts::<false>(&self.keys, None, buf, unit_len, tweaks) }
            }

            fn xts_decrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
                let buf = $crate::aes::x86::units_region(buf, unit_len, tweaks.len());
                // SAFETY: as in `encrypt_ecb`.
                unsafe { xts::<true>(&self.keys, None, buf, unit_len, tweaks) }
            }

            fn xts_units_from(
                &self,
                src: &[u8],
                dst: &mut [u8],
                unit_len: usize,
                tweaks: &[Block],
                dir: $crate::engine::Direction,
            ) {
                // The kernels read a source elsewhere only for units of whole groups (every
                // sector size); for others they would copy it into `dst` first, which must
                // never hold plaintext.
                if !unit_len.is_multiple_of(GROUP) {
                    $crate::engine::xts_units_via_copies(self, src, dst, unit_len, tweaks, dir);
                    return;
                }
                let dst = $crate::aes::x86::units_region(dst, unit_len, tweaks.len());
                let src = &src[..dst.len()];
                // SAFETY: as in `encrypt_ecb`.
                unsafe {
                    match dir {
                        $crate::engine::Direction::Encrypt => {
                            xts::<false>(&self.keys, Some(src), dst, unit_len, tweaks)
                        }
                        $crate::engine::Direction::Decrypt => {
                            xts::<true>(&self.keys, Some(src), dst, unit_len, tweaks)
                        }
                    }
                }
            }

            fn ctr32_xor(&self, jobs: &mut [(Block, &mut [u8])]) {
                // SAFETY: as in `encrypt_ecb`.
                unsafe { ctr32(&self.keys, jobs) }
            }

            fn cbc_encrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
                let buf = $crate::aes::x86::units_region(buf, unit_len, ivs.len());
                // SAFETY: as in `encrypt_ecb`.
                unsafe { cbc_encrypt(&self.keys, buf, unit_len, ivs) }
            }

            fn cbc_decrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
                let buf = $crate::aes::x86::units_region(buf, unit_len, ivs.len());
                // SAFETY: as in `encrypt_ecb`.
                unsafe { cbc_decrypt(&self.keys, buf, unit_len, ivs) }
            }
        }
    };
}

pub(crate) use x86_block_engine;

/// The XTS tweak sequence across units as 128-bit integers (IEEE 1619 order is little-endian,
/// so multiplying by alpha is a left shift with the 0x87 reduction); the current tweak is
/// zeroized on drop.
pub(crate) struct TweakSeq<'a> {
    tweaks: &'a [Block],
    blocks_per_unit: usize,
    unit: usize,
    pos: usize,
    t: u128,
}

impl<'a> TweakSeq<'a> {
    /// The sequence of units of `unit_len` bytes starting with `tweaks[0]` (non-empty).
    pub(crate) fn new(tweaks: &'a [Block], unit_len: usize) -> Self {
        TweakSeq {
            tweaks,
            blocks_per_unit: unit_len / BLOCK,
            unit: 0,
            pos: 0,
            t: u128::from_le_bytes(tweaks[0]),
        }
    }

    /// Store the next `n` tweaks in `out`.
    #[inline]
    pub(crate) fn fill(&mut self, out: &mut [u128], n: usize) {
        for slot in out.iter_mut().take(n) {
            *slot = self.t;
            self.pos += 1;
            if self.pos == self.blocks_per_unit {
                self.unit += 1;
                self.pos = 0;
                self.t = self
                    .tweaks
                    .get(self.unit)
                    .map_or(0, |t| u128::from_le_bytes(*t));
            } else {
                // Reduction through a mask, not a branch: the tweak is secret.
                self.t = (self.t << 1) ^ (0u128.wrapping_sub(self.t >> 127) & 0x87);
            }
        }
    }
}

impl Drop for TweakSeq<'_> {
    fn drop(&mut self) {
        self.t.zeroize();
    }
}

/// One 128-bit round key, 16-byte aligned so that aligned loads (foldable into the legacy-SSE
/// `aesenc xmm, m128` form) are valid.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
pub(crate) struct Rk128(pub(crate) [u8; 16]);

/// A `pshufb` index that reverses a block's bytes: the counter kernels keep GCM's big-endian
/// counter blocks reversed, so that the 32-bit counter is the lowest lane and `inc32` one add.
pub(crate) const REVERSE_BYTES: Block = [15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0];

/// The expanded key: `enc[0..=rounds]` for `aesenc`, `dec[0..=rounds]` in the order the
/// `aesdec` sequence consumes them (`dec[0] = enc[rounds]`, middle keys through `aesimc`,
/// `dec[rounds] = enc[0]`). Zeroized on drop.
pub(crate) struct RoundKeys {
    pub(crate) enc: [Rk128; 15],
    pub(crate) dec: [Rk128; 15],
    /// 10, 12 or 14.
    pub(crate) rounds: usize,
}

impl Drop for RoundKeys {
    fn drop(&mut self) {
        for k in self.enc.iter_mut().chain(self.dec.iter_mut()) {
            k.0.zeroize();
        }
    }
}

/// Round constants (FIPS-197 5.2), as the low byte of a little-endian word.
const RCON: [u32; 10] = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1b, 0x36];

impl RoundKeys {
    /// Expand a 16-, 24- or 32-byte key (panics on any other length; callers validate).
    #[target_feature(enable = "aes")]
    pub(crate) fn expand(key: &[u8]) -> Self {
        let nk = key.len() / 4;
        assert!(
            key.len().is_multiple_of(4) && matches!(nk, 4 | 6 | 8),
            "AES key must be 16, 24 or 32 bytes"
        );
        let rounds = nk + 6;
        // Words are little-endian u32s of the key bytes, so byte 0 of a word is its low byte
        // and FIPS-197 RotWord ([a0,a1,a2,a3] -> [a1,a2,a3,a0]) is a rotate right by 8.
        let mut w = [0u32; 60];
        for (slot, bytes) in w.iter_mut().zip(key.chunks_exact(4)) {
            *slot = u32::from_le_bytes(bytes.try_into().unwrap());
        }
        for i in nk..4 * (rounds + 1) {
            let prev = w[i - 1];
            let t = if i % nk == 0 {
                sub_word(prev.rotate_right(8)) ^ RCON[i / nk - 1]
            } else if nk == 8 && i % nk == 4 {
                sub_word(prev)
            } else {
                prev
            };
            w[i] = w[i - nk] ^ t;
        }

        let mut enc = [Rk128([0; 16]); 15];
        for (r, rk) in enc.iter_mut().enumerate().take(rounds + 1) {
            for (c, word) in rk.0.chunks_exact_mut(4).zip(&w[4 * r..4 * r + 4]) {
                c.copy_from_slice(&word.to_le_bytes());
            }
        }
        w.zeroize();

        let mut dec = [Rk128([0; 16]); 15];
        dec[0] = enc[rounds];
        for i in 1..rounds {
            store_rk(&mut dec[i], _mm_aesimc_si128(load_rk(&enc[rounds - i])));
        }
        dec[rounds] = enc[0];
        RoundKeys { enc, dec, rounds }
    }
}

/// SubWord (the S-box on each byte) of one word.
#[target_feature(enable = "aes")]
fn sub_word(x: u32) -> u32 {
    // aeskeygenassist substitutes dwords 1 and 3 of its input; dword 0 of the result is
    // SubWord(dword 1). Rcon is applied by the caller (immediate 0 here).
    let v = _mm_set_epi32(0, 0, x as i32, 0);
    _mm_cvtsi128_si32(_mm_aeskeygenassist_si128(v, 0)) as u32
}

/// Aligned load of a round key.
#[inline]
#[target_feature(enable = "sse2")]
pub(crate) fn load_rk(k: &Rk128) -> __m128i {
    // SAFETY: `Rk128` is 16 bytes with 16-byte alignment.
    unsafe { _mm_load_si128(k.0.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "sse2")]
fn store_rk(k: &mut Rk128, v: __m128i) {
    // SAFETY: `Rk128` is 16 writable bytes with 16-byte alignment.
    unsafe { _mm_store_si128(k.0.as_mut_ptr().cast(), v) }
}

/// Shared test helpers for the x86 AES backends.
#[cfg(test)]
pub(crate) mod testing {
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

    use crate::backend::Backend;
    use crate::engine::{Block, BlockEngine, Direction, BLOCK};

    /// Forwards only ECB, so every mode method is the trait's generic default: the reference
    /// the fused kernels are compared with.
    pub(crate) struct EcbOnly<'a>(pub(crate) &'a dyn BlockEngine);

    impl BlockEngine for EcbOnly<'_> {
        fn backend(&self) -> Backend {
            self.0.backend()
        }
        fn encrypt_ecb(&self, buf: &mut [u8]) {
            self.0.encrypt_ecb(buf)
        }
        fn decrypt_ecb(&self, buf: &mut [u8]) {
            self.0.decrypt_ecb(buf)
        }
    }

    /// Fail unless `backend` runs here. Its tests are `#[ignore]`d where the build saw a CPU
    /// without it (build.rs), so this fails only for a build moved to another CPU.
    pub(crate) fn require(backend: Backend) {
        assert!(
            backend.is_available(),
            "{backend} does not run on this CPU, though the build's did: rebuild (cargo clean -p \
             sectorcrypt-cipher)"
        );
    }

    /// The standard vectors: FIPS-197 Appendix C (ECB, every key size) and IEEE 1619 (XTS).
    /// The checks every wide (VAES) backend runs: standard vectors, and the generic modes on
    /// its own ECB, on AES-NI's and on the portable (bitsliced) AES's, which are independent
    /// implementations of the rounds and key layout. `seed` varies the random cases.
    pub(crate) fn check_wide_backend(make: impl Fn(&[u8]) -> Box<dyn BlockEngine>, seed: u64) {
        check_standard_vectors(&make);
        compare_with_generic(&make, &make, seed, 120);
        compare_with_generic(
            &make,
            |k| Box::new(crate::aes::ni::AesNi::new(k).unwrap()),
            seed + 1,
            60,
        );
        compare_with_generic(
            &make,
            |k| Box::new(crate::aes::soft::AesSoft::new(k)),
            seed + 3,
            25,
        );
    }

    /// A wide kernel's register tweaks against the scalar alpha chain: `lanes(first, steps)`
    /// is the tweaks of the group `steps` groups into a unit starting at `first`, `group` bytes.
    pub(crate) fn check_register_tweaks(group: usize, lanes: impl Fn(&Block, usize) -> Vec<u8>) {
        for first in [
            [0xffu8; 16],
            [0x80; 16],
            core::array::from_fn(|i| (i as u8).wrapping_mul(29) ^ 0xc3),
        ] {
            let mut want = vec![0u8; group * 3];
            crate::gf128::fill_tweaks(first, &mut want);
            for steps in 0..3 {
                assert_eq!(
                    lanes(&first, steps),
                    want[steps * group..(steps + 1) * group]
                );
            }
        }
    }

    pub(crate) fn check_standard_vectors(make: impl Fn(&[u8]) -> Box<dyn BlockEngine>) {
        check_fips197(&make);
        check_ieee1619(&make);
        check_ctr(&make);
    }

    /// Counter-mode vectors (`tests/vectors/ctr-aes.txt`: SP 800-38A F.5, RFC 3686) through the
    /// backend's `ctr32_xor` and through the generic one on its ECB, each vector alone and twice
    /// in one call.
    pub(crate) fn check_ctr(make: impl Fn(&[u8]) -> Box<dyn BlockEngine>) {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/ctr-aes.txt");
        let vectors = sectorcrypt_testkit::vectors::load(&path);
        assert!(
            vectors.len() >= 12,
            "parsed only {} CTR vectors",
            vectors.len()
        );
        for v in vectors {
            let engine = make(&v.key);
            let counter: Block = v.iv.as_slice().try_into().unwrap();
            for e in [engine.as_ref(), &EcbOnly(engine.as_ref())] {
                let (mut a, mut b) = (v.plaintext.clone(), v.plaintext.clone());
                e.ctr32_xor(&mut [(counter, a.as_mut_slice()), (counter, b.as_mut_slice())]);
                assert_eq!(hex::encode(&a), hex::encode(&v.ciphertext), "{}", v.comment);
                assert_eq!(a, b, "{}", v.comment);
            }
        }
    }

    /// FIPS-197 Appendix C: plaintext 00112233..ff, key 000102..; (key length, ciphertext).
    pub(crate) const FIPS197: [(usize, &str); 3] = [
        (16, "69c4e0d86a7b0430d8cdb78070b4c55a"),
        (24, "dda97ca4864cdfe06eaf70a0ec0d7191"),
        (32, "8ea2b7ca516745bfeafc49904b496089"),
    ];

    pub(crate) fn check_fips197(make: impl Fn(&[u8]) -> Box<dyn BlockEngine>) {
        let pt = hex::decode("00112233445566778899aabbccddeeff").unwrap();
        for (klen, ct) in FIPS197 {
            let key: Vec<u8> = (0..klen as u8).collect();
            let e = make(&key);
            let ct = hex::decode(ct).unwrap();
            // Also in the middle of longer buffers, so every tail/bulk path sees the vector.
            for n in [1usize, 3, 8, 9, 31, 32, 33, 100] {
                let mut buf = pt.repeat(n);
                e.encrypt_ecb(&mut buf);
                assert_eq!(buf, ct.repeat(n), "encrypt, {klen}-byte key, {n} blocks");
                e.decrypt_ecb(&mut buf);
                assert_eq!(buf, pt.repeat(n), "decrypt, {klen}-byte key, {n} blocks");
            }
        }
    }

    /// One IEEE 1619 record: (key = K1||K2, 16-byte IV, plaintext, ciphertext).
    type XtsVector = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

    /// The IEEE 1619 XTS-AES vectors (`tests/vectors/xts-ieee1619.txt`; a missing file fails).
    fn xts_vectors() -> Vec<XtsVector> {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/xts-ieee1619.txt");
        let out: Vec<XtsVector> = sectorcrypt_testkit::vectors::load(&path)
            .into_iter()
            .map(|r| (r.key, r.iv, r.plaintext, r.ciphertext))
            .collect();
        assert!(out.len() >= 14, "parsed only {} XTS vectors", out.len());
        out
    }

    /// IEEE 1619 vectors (whole blocks only) through `xts_encrypt_units` / `xts_decrypt_units`,
    /// as one unit and as the same unit repeated in a multi-unit request.
    pub(crate) fn check_ieee1619(make: impl Fn(&[u8]) -> Box<dyn BlockEngine>) {
        let mut checked = 0;
        for (key, iv, pt, ct) in xts_vectors() {
            if pt.len() % BLOCK != 0 {
                continue; // ciphertext stealing is done by the mode layer
            }
            let (k1, k2) = key.split_at(key.len() / 2);
            let (data, tweak) = (make(k1), make(k2));
            let mut t: Block = iv.as_slice().try_into().unwrap();
            tweak.encrypt_ecb(&mut t);
            for reps in [1usize, 3] {
                let mut buf = pt.repeat(reps);
                let tweaks = vec![t; reps];
                data.xts_encrypt_units(&mut buf, pt.len(), &tweaks);
                assert_eq!(
                    hex::encode(&buf),
                    hex::encode(ct.repeat(reps)),
                    "key {}",
                    hex::encode(&key)
                );
                data.xts_decrypt_units(&mut buf, pt.len(), &tweaks);
                assert_eq!(buf, pt.repeat(reps));
            }
            checked += 1;
        }
        assert!(checked >= 3);
    }

    /// Every method of `fast` against the trait defaults on `reference`'s ECB, for random
    /// lengths, unit sizes and unit counts.
    pub(crate) fn compare_with_generic(
        make: impl Fn(&[u8]) -> Box<dyn BlockEngine>,
        reference: impl Fn(&[u8]) -> Box<dyn BlockEngine>,
        seed: u64,
        iters: usize,
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        for klen in [16usize, 24, 32] {
            let mut key = vec![0u8; klen];
            rng.fill_bytes(&mut key);
            let fast = make(&key);
            let slow_engine = reference(&key);
            let slow = EcbOnly(slow_engine.as_ref());
            for it in 0..iters {
                // ECB on any whole number of blocks, biased towards small counts.
                let nblocks = if it % 2 == 0 {
                    rng.gen_range(0..70)
                } else {
                    rng.gen_range(0..700)
                };
                let mut a = vec![0u8; nblocks * BLOCK];
                rng.fill_bytes(&mut a);
                let mut b = a.clone();
                fast.encrypt_ecb(&mut a);
                slow.encrypt_ecb(&mut b);
                assert_eq!(a, b, "ecb enc klen {klen} blocks {nblocks}");
                fast.decrypt_ecb(&mut a);
                slow.decrypt_ecb(&mut b);
                assert_eq!(a, b, "ecb dec klen {klen} blocks {nblocks}");

                // Units: common sector sizes and arbitrary multiples of 16 up to 4096.
                let unit_len = match it % 4 {
                    0 => [512usize, 1024, 4096][rng.gen_range(0..3)],
                    1 => BLOCK * rng.gen_range(1..=8),
                    _ => BLOCK * rng.gen_range(1..=256),
                };
                let max_units = (200_000 / unit_len).clamp(1, 70);
                let units = rng.gen_range(1..=max_units);
                let mut data = vec![0u8; units * unit_len];
                rng.fill_bytes(&mut data);
                let mut tweaks = vec![[0u8; 16]; units];
                for t in &mut tweaks {
                    rng.fill_bytes(t);
                }
                // Tweaks with the top bit set exercise the reduction on the first step.
                if it % 3 == 0 {
                    tweaks[0] = [0xff; 16];
                }
                let ctx = format!("klen {klen} unit {unit_len} units {units}");
                type Op = fn(&dyn BlockEngine, &mut [u8], usize, &[Block]);
                let ops: [(&str, Op); 4] = [
                    ("xts enc", |e, b, u, t| e.xts_encrypt_units(b, u, t)),
                    ("xts dec", |e, b, u, t| e.xts_decrypt_units(b, u, t)),
                    ("cbc enc", |e, b, u, t| e.cbc_encrypt_units(b, u, t)),
                    ("cbc dec", |e, b, u, t| e.cbc_decrypt_units(b, u, t)),
                ];
                for (name, op) in ops {
                    let mut a = data.clone();
                    let mut b = data.clone();
                    op(fast.as_ref(), &mut a, unit_len, &tweaks);
                    op(&slow, &mut b, unit_len, &tweaks);
                    assert!(a == b, "{name} {ctx}");
                }
                // From a source elsewhere, into a destination of other bytes (which it must
                // neither read nor leave), both ways; the source stays as it was. Destinations
                // on a 64-byte boundary and off one (encryption stores past the caches where
                // the stores are aligned for it).
                for (dir, shift) in [
                    (Direction::Encrypt, 0),
                    (Direction::Encrypt, 16),
                    (Direction::Encrypt, 32),
                    (Direction::Decrypt, 0),
                ] {
                    let mut room = vec![0u8; data.len() + 128];
                    rng.fill_bytes(&mut room);
                    let at = room.as_ptr().align_offset(64) + shift;
                    let before = room.clone();
                    let source = data.clone();
                    let to = &mut room[at..][..data.len()];
                    fast.xts_units_from(&source, to, unit_len, &tweaks, dir);
                    let mut want = data.clone();
                    match dir {
                        Direction::Encrypt => slow.xts_encrypt_units(&mut want, unit_len, &tweaks),
                        Direction::Decrypt => slow.xts_decrypt_units(&mut want, unit_len, &tweaks),
                    }
                    let ctx = format!("xts {dir:?} from, {shift} past a boundary, {ctx}");
                    assert!(room[at..][..data.len()] == want[..], "{ctx}");
                    assert!(room[..at] == before[..at], "{ctx}: stored before");
                    assert!(
                        room[at + data.len()..] == before[at + data.len()..],
                        "{ctx}: after"
                    );
                    assert!(source == data, "{ctx}: source changed");
                }

                // Counter mode: jobs of any byte length, counters about to wrap their 32 bits.
                let mut jobs: Vec<(Block, Vec<u8>)> = (0..rng.gen_range(1..4))
                    .map(|_| {
                        let mut counter = [0u8; BLOCK];
                        rng.fill_bytes(&mut counter);
                        if it % 2 == 0 {
                            counter[12..].copy_from_slice(&[0xff, 0xff, 0xff, 0xfb]);
                        }
                        let len = rng.gen_range(0..3000);
                        (counter, data[..len.min(data.len())].to_vec())
                    })
                    .collect();
                let mut want = jobs.clone();
                fast.ctr32_xor(
                    &mut jobs
                        .iter_mut()
                        .map(|(c, b)| (*c, b.as_mut_slice()))
                        .collect::<Vec<_>>(),
                );
                slow.ctr32_xor(
                    &mut want
                        .iter_mut()
                        .map(|(c, b)| (*c, b.as_mut_slice()))
                        .collect::<Vec<_>>(),
                );
                assert!(jobs == want, "ctr32 {ctx}");

                // Round trips.
                let mut a = data.clone();
                fast.xts_encrypt_units(&mut a, unit_len, &tweaks);
                fast.xts_decrypt_units(&mut a, unit_len, &tweaks);
                assert!(a == data, "xts round trip {ctx}");
                fast.cbc_encrypt_units(&mut a, unit_len, &tweaks);
                fast.cbc_decrypt_units(&mut a, unit_len, &tweaks);
                assert!(a == data, "cbc round trip {ctx}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_group_is_its_bytes_wherever_the_prefetch_would_reach() {
        let src: Vec<u8> = (0..3 * SOURCE_AHEAD).map(|i| (i * 7 + 1) as u8).collect();
        for (at, len) in [
            (0, 512),
            (SOURCE_AHEAD - 512, 512),
            (2 * SOURCE_AHEAD - 16, 16),
            (2 * SOURCE_AHEAD, 512),
            (3 * SOURCE_AHEAD - 128, 128),
        ] {
            assert_eq!(
                source_group(Some(&src), at, len),
                Some(&src[at..at + len]),
                "{at} {len}"
            );
        }
        assert_eq!(source_group(None, 0, 512), None, "no source, in place");
    }
}
