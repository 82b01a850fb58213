//! Block ciphers beyond AES, LEA, Serpent and Twofish (whose portable and SIMD engines are in
//! `aes/`, `lea/`, `serpent/` and `twofish/`) — Camellia, ARIA, SM4 and CAST6 (CAST-256) on
//! RustCrypto's portable implementations — behind the same [`BlockEngine`] as every other
//! backend: the XTS and CBC whole-unit loops (and so the extended request) are the generic ones in
//! `engine.rs`. Each engine is [`Backend::Portable`]; there are no SIMD kernels for these ciphers.
//!
//! The RustCrypto types are built with their `zeroize` feature: their key schedules are zeroized
//! on drop, so an engine here needs no `Drop` of its own.

use cipher::generic_array::GenericArray;
use cipher::{BlockDecrypt, BlockEncrypt, BlockSizeUser, KeyInit};

use crate::backend::{Algorithm, Backend};
use crate::engine::{keyed, BlockEngine, BLOCK};

/// One keyed RustCrypto block cipher with a 128-bit block.
struct Engine<C>(C);

impl<C> BlockEngine for Engine<C>
where
    C: BlockEncrypt + BlockDecrypt + BlockSizeUser<BlockSize = cipher::consts::U16> + Send + Sync,
{
    fn backend(&self) -> Backend {
        Backend::Portable
    }

    fn encrypt_ecb(&self, buf: &mut [u8]) {
        for block in buf.chunks_exact_mut(BLOCK) {
            self.0.encrypt_block(GenericArray::from_mut_slice(block));
        }
    }

    fn decrypt_ecb(&self, buf: &mut [u8]) {
        for block in buf.chunks_exact_mut(BLOCK) {
            self.0.decrypt_block(GenericArray::from_mut_slice(block));
        }
    }
}

fn boxed<C>(key: &[u8]) -> Option<Box<dyn BlockEngine>>
where
    C: KeyInit
        + BlockEncrypt
        + BlockDecrypt
        + BlockSizeUser<BlockSize = cipher::consts::U16>
        + Send
        + Sync
        + 'static,
{
    keyed(|| C::new_from_slice(key).ok().map(Engine))
}

/// A keyed engine for one of this module's algorithms, or None if `alg` is not one of them or the
/// key length does not fit (callers check lengths first, see [`Algorithm::accepts_key_len`]).
pub(crate) fn new_engine(alg: Algorithm, key: &[u8]) -> Option<Box<dyn BlockEngine>> {
    match (alg, key.len()) {
        // CAST6 takes any key from 128 to 256 bits in steps of 32 (an ESSIV salt of SHA-1's 160
        // bits keys it).
        (Algorithm::Cast6, 16..=32) if key.len().is_multiple_of(4) => boxed::<cast6::Cast6>(key),
        (Algorithm::Camellia, 16) => boxed::<camellia::Camellia128>(key),
        (Algorithm::Camellia, 24) => boxed::<camellia::Camellia192>(key),
        (Algorithm::Camellia, 32) => boxed::<camellia::Camellia256>(key),
        (Algorithm::Aria, 16) => boxed::<aria::Aria128>(key),
        (Algorithm::Aria, 24) => boxed::<aria::Aria192>(key),
        (Algorithm::Aria, 32) => boxed::<aria::Aria256>(key),
        (Algorithm::Sm4, 16) => boxed::<sm4::Sm4>(key),
        _ => None,
    }
}
