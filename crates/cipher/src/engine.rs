//! The contract every block-cipher backend implements, and the generic mode code that a backend
//! inherits unless it has a faster fused kernel.
//!
//! A [`BlockEngine`] is one keyed 128-bit block cipher on one backend (portable, AES-NI, VAES, AVX2,
//! AVX-512). The mode layer ([`crate::sector`], [`crate::modes`]) talks only to this trait, so
//! adding a backend means implementing `encrypt_ecb`/`decrypt_ecb` and, where it pays, overriding
//! the whole-data-unit XTS and CBC entry points with kernels that keep many blocks in flight.
//!
//! Why "units": an extended request hands a backend N whole data units (sectors) at once together
//! with their already-encrypted initial tweaks, so a kernel can run straight across sector
//! boundaries instead of paying set-up per sector.

use sectorcrypt_secret::SecretBox;

use crate::backend::Backend;
use crate::gf128;

/// Size of a cipher block in bytes (AES and LEA both have 128-bit blocks).
pub const BLOCK: usize = 16;

/// One 128-bit block.
pub type Block = [u8; BLOCK];

/// Independent CBC chains (units) the generic CBC encryption interleaves per ECB call: a whole
/// set of the 16-block AVX-512 kernels (Serpent, Twofish), two sets of the 8-block AVX2 ones.
pub const CBC_LANES: usize = 16;

/// Blocks of tweaks or keystream the generic code keeps on the stack (dm-crypt's largest sector,
/// 4 KiB). Larger units are processed in pieces of this size with the tweak carried across.
const STACK_BLOCKS: usize = 4096 / BLOCK;

/// A keyed block cipher on one backend.
///
/// Preconditions, checked by the callers in this crate (never by the kernels, which must stay
/// branch-free on data): every buffer length is a multiple of [`BLOCK`]; `unit_len` is a non-zero
/// multiple of [`BLOCK`]; `buf.len() == unit_len * tweaks.len()` (resp. `ivs.len()`).
///
/// Implementations hold expanded round keys and must zeroize them on drop.
pub trait BlockEngine: Send + Sync {
    /// Which implementation runs.
    fn backend(&self) -> Backend;

    /// How much stack below its caller a call may leave key material in (its frames, and the
    /// buffers of the generic modes): what `wipe` clears after it. The default covers every
    /// engine; the shallow AES and LEA kernels say less, so that a 4 KiB request does not pay
    /// for clearing Twofish's frames.
    fn stack_bytes(&self) -> usize {
        crate::wipe::DEEP_STACK
    }

    /// ECB-encrypt every block of `buf` in place.
    fn encrypt_ecb(&self, buf: &mut [u8]);

    /// ECB-decrypt every block of `buf` in place.
    fn decrypt_ecb(&self, buf: &mut [u8]);

    /// XEX-encrypt whole data units in place: unit `u` starts with tweak `tweaks[u]` (already
    /// encrypted with the tweak key), block `j` of the unit uses `tweaks[u] * alpha^j`, and
    /// `C = E(P ^ T) ^ T`.
    fn xts_encrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
        generic_xts_units(self, buf, unit_len, tweaks, Direction::Encrypt);
    }

    /// Inverse of [`BlockEngine::xts_encrypt_units`]: `P = D(C ^ T) ^ T`.
    fn xts_decrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
        generic_xts_units(self, buf, unit_len, tweaks, Direction::Decrypt);
    }

    /// [`BlockEngine::xts_encrypt_units`] or [`BlockEngine::xts_decrypt_units`] from `src` into
    /// `dst` (of equal lengths): ciphertext lent by the storage (a mapped page cache) read once
    /// and never copied, or plaintext encrypted straight into such a mapping. `dst` only ever
    /// receives the result: encrypting, it must never hold plaintext, even for a moment (others
    /// may read the page cache, and the kernel write it back, at any time). The default runs in
    /// place on copies ([`xts_units_via_copies`]).
    fn xts_units_from(
        &self,
        src: &[u8],
        dst: &mut [u8],
        unit_len: usize,
        tweaks: &[Block],
        dir: Direction,
    ) {
        xts_units_via_copies(self, src, dst, unit_len, tweaks, dir);
    }

    /// Counter mode with GCM's `inc32`: XOR each job's buffer (any length) with the keystream
    /// from its counter block, block `j` with `E(counter + j)` where `+` adds to the low 32 bits
    /// (big-endian, wrapping); a partial last block takes the keystream's first bytes.
    fn ctr32_xor(&self, jobs: &mut [(Block, &mut [u8])]) {
        generic_ctr32(self, jobs);
    }

    /// CBC-encrypt whole data units in place, unit `u` chained from `ivs[u]`.
    ///
    /// One chain is sequential, but the units are independent chains: the default runs up to
    /// [`CBC_LANES`] of them side by side, so every ECB call carries one block of each.
    fn cbc_encrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
        let mut lanes = [0u8; CBC_LANES * BLOCK];
        for (units, ivs) in buf
            .chunks_mut(unit_len * CBC_LANES)
            .zip(ivs.chunks(CBC_LANES))
        {
            let n = ivs.len();
            // Each lane holds its chain's previous ciphertext block (the IV to begin with).
            lanes[..n * BLOCK].copy_from_slice(ivs.as_flattened());
            for block in (0..unit_len).step_by(BLOCK) {
                for (lane, unit) in lanes
                    .chunks_exact_mut(BLOCK)
                    .zip(units.chunks_exact(unit_len))
                {
                    xor_into(lane, &unit[block..block + BLOCK]);
                }
                self.encrypt_ecb(&mut lanes[..n * BLOCK]);
                for (lane, unit) in lanes
                    .chunks_exact(BLOCK)
                    .zip(units.chunks_exact_mut(unit_len))
                {
                    unit[block..block + BLOCK].copy_from_slice(lane);
                }
            }
        }
    }

    /// CBC-decrypt whole data units in place, unit `u` chained from `ivs[u]`.
    fn cbc_decrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
        let mut saved = [0u8; 4096];
        for (unit, iv) in buf.chunks_exact_mut(unit_len).zip(ivs) {
            let mut prev = *iv;
            for piece in unit.chunks_mut(saved.len()) {
                let saved = &mut saved[..piece.len()];
                saved.copy_from_slice(piece);
                self.decrypt_ecb(piece);
                for (block, cipher) in piece.chunks_exact_mut(BLOCK).zip(saved.chunks_exact(BLOCK))
                {
                    xor_into(block, &prev);
                    prev.copy_from_slice(cipher);
                }
            }
        }
    }
}

/// An engine whose round keys live in secret memory (locked, left out of core dumps, zeroized on
/// drop): a key schedule is key material (AES's first round key is the key itself). Every
/// constructor in this crate hands out its engines this way, through [`keyed`]; every keyed call
/// ends by clearing the vector registers and the stack below it (`crate::wipe`).
/// `BlockEngine` for `$holder<E>`, a holder that derefs to an engine `E`: every keyed call goes
/// to `E` and ends by clearing the vector registers and the stack below it (`crate::wipe`).
macro_rules! wiping_engine {
    ($holder:ident) => {
        impl<E: BlockEngine> BlockEngine for $holder<E> {
            fn backend(&self) -> Backend {
                (**self).backend()
            }
            fn stack_bytes(&self) -> usize {
                (**self).stack_bytes()
            }
            fn encrypt_ecb(&self, buf: &mut [u8]) {
                (**self).encrypt_ecb(buf);
                crate::wipe::after_keyed_call(self.stack_bytes());
            }
            fn decrypt_ecb(&self, buf: &mut [u8]) {
                (**self).decrypt_ecb(buf);
                crate::wipe::after_keyed_call(self.stack_bytes());
            }
            fn xts_encrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
                (**self).xts_encrypt_units(buf, unit_len, tweaks);
                crate::wipe::after_keyed_call(self.stack_bytes());
            }
            fn xts_decrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
                (**self).xts_decrypt_units(buf, unit_len, tweaks);
                crate::wipe::after_keyed_call(self.stack_bytes());
            }
            fn xts_units_from(
                &self,
                src: &[u8],
                dst: &mut [u8],
                unit_len: usize,
                tweaks: &[Block],
                dir: Direction,
            ) {
                (**self).xts_units_from(src, dst, unit_len, tweaks, dir);
                crate::wipe::after_keyed_call(self.stack_bytes());
            }
            fn ctr32_xor(&self, jobs: &mut [(Block, &mut [u8])]) {
                (**self).ctr32_xor(jobs);
                crate::wipe::after_keyed_call(self.stack_bytes());
            }
            fn cbc_encrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
                (**self).cbc_encrypt_units(buf, unit_len, ivs);
                crate::wipe::after_keyed_call(self.stack_bytes());
            }
            fn cbc_decrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
                (**self).cbc_decrypt_units(buf, unit_len, ivs);
                crate::wipe::after_keyed_call(self.stack_bytes());
            }
        }
    };
}
pub(crate) use wiping_engine;

wiping_engine!(SecretBox);

/// The engine `make` builds (`None`: it cannot run here), in secret memory, as a trait object.
/// Built inside [`SecretBox::try_init`], so that no copy of its round keys stays on the stack.
pub(crate) fn keyed<E: BlockEngine + 'static>(
    make: impl FnOnce() -> Option<E>,
) -> Option<Box<dyn BlockEngine>> {
    let engine = SecretBox::try_init(make);
    // The key expansion leaves round keys in the vector registers too.
    crate::wipe::after_keyed_call(crate::wipe::DEEP_STACK);
    engine.map(|e| Box::new(e) as Box<dyn BlockEngine>)
}

/// Which way a mode runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Plaintext to ciphertext.
    Encrypt,
    /// Ciphertext to plaintext.
    Decrypt,
}

/// XOR `src` into `dst` (equal lengths).
#[inline]
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    // Eight bytes at a time: the compiler turns this into wide vector XORs.
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        let v =
            u64::from_ne_bytes(d.try_into().unwrap()) ^ u64::from_ne_bytes(s.try_into().unwrap());
        d.copy_from_slice(&v.to_ne_bytes());
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d ^= s;
    }
}

/// The counter mode every backend gets for free: a stack buffer of counter blocks, one ECB call
/// per 4 KiB, XOR.
fn generic_ctr32<E: BlockEngine + ?Sized>(engine: &E, jobs: &mut [(Block, &mut [u8])]) {
    let mut ks = [[0u8; BLOCK]; STACK_BLOCKS];
    for (counter, buf) in jobs.iter_mut() {
        let (prefix, start) = counter.split_at(BLOCK - 4);
        let mut n = u32::from_be_bytes(start.try_into().unwrap());
        for piece in buf.chunks_mut(ks.as_flattened().len()) {
            let ks = &mut ks[..piece.len().div_ceil(BLOCK)];
            for block in ks.iter_mut() {
                block[..BLOCK - 4].copy_from_slice(prefix);
                block[BLOCK - 4..].copy_from_slice(&n.to_be_bytes());
                n = n.wrapping_add(1);
            }
            engine.encrypt_ecb(ks.as_flattened_mut());
            xor_into(piece, &ks.as_flattened()[..piece.len()]);
        }
    }
    // The keystream is as secret as the plaintext it hides.
    zeroize::Zeroize::zeroize(ks.as_flattened_mut());
}

/// [`BlockEngine::xts_units_from`] in place, a unit at a time: decrypting, in `dst` after a copy
/// (while the unit is in cache); encrypting, in a copy of its own, of which only the ciphertext
/// goes to `dst`.
pub(crate) fn xts_units_via_copies<E: BlockEngine + ?Sized>(
    engine: &E,
    src: &[u8],
    dst: &mut [u8],
    unit_len: usize,
    tweaks: &[Block],
    dir: Direction,
) {
    let mut own = match dir {
        Direction::Encrypt => vec![0u8; unit_len],
        Direction::Decrypt => Vec::new(),
    };
    for ((from, to), tweak) in src
        .chunks_exact(unit_len)
        .zip(dst.chunks_exact_mut(unit_len))
        .zip(tweaks)
    {
        let tweak = core::slice::from_ref(tweak);
        match dir {
            Direction::Decrypt => {
                to.copy_from_slice(from);
                engine.xts_decrypt_units(to, unit_len, tweak);
            }
            Direction::Encrypt => {
                own.copy_from_slice(from);
                engine.xts_encrypt_units(&mut own, unit_len, tweak);
                to.copy_from_slice(&own);
            }
        }
    }
}

/// The XTS path every backend gets for free: tweaks into a stack buffer, XOR, one ECB call, XOR.
/// This is the paper's "extended request" structure, one unit (or 4 KiB of it) at a time.
fn generic_xts_units<E: BlockEngine + ?Sized>(
    engine: &E,
    buf: &mut [u8],
    unit_len: usize,
    tweaks: &[Block],
    dir: Direction,
) {
    let mut tweak_buf = [0u8; STACK_BLOCKS * BLOCK];
    for (unit, first) in buf.chunks_exact_mut(unit_len).zip(tweaks) {
        let mut next = *first;
        for piece in unit.chunks_mut(tweak_buf.len()) {
            let t = &mut tweak_buf[..piece.len()];
            next = gf128::fill_tweaks(next, t);
            xor_into(piece, t);
            match dir {
                Direction::Encrypt => engine.encrypt_ecb(piece),
                Direction::Decrypt => engine.decrypt_ecb(piece),
            }
            xor_into(piece, t);
        }
    }
    zeroize::Zeroize::zeroize(&mut tweak_buf);
}
