//! The cipher core of sectorcrypt: block ciphers (AES, LEA, Serpent and Twofish on portable and
//! SIMD backends, Serpent and Twofish bitsliced; Camellia, ARIA, SM4 and CAST6 portable, from
//! RustCrypto's crates),
//! dm-crypt's sector modes (`xts-plain64`, `cbc-essiv:sha256`, ...), and the *extended request*:
//! one call encrypts many sectors, computing all their tweaks as a batch.
//!
//! Layers, bottom up:
//! - [`engine::BlockEngine`]: one keyed block cipher on one backend (ECB, and whole-unit XTS/CBC
//!   kernels that backends may fuse).
//! - [`spec::CipherSpec`]: dm-crypt's `cipher-mode-iv` names.
//! - [`sector::SectorCipher`]: a keyed spec for a sector size; the data path used by volumes.
//! - [`modes`]: single-data-unit XTS (with ciphertext stealing), CBC, CTR and ECB, used for test
//!   vectors and the tcrypt-style benchmark.
//! - `staged` (feature `bench`): the paper's "mixed" design (ECB engine + separate tweak/XOR
//!   passes), timed per phase.
//!
//! `unsafe` lives only in the x86-64 kernels (`aes::ni`, `aes::vaes512`, `aes::x86`,
//! `gcm::clmul`, `lea::avx2`, `lea::avx512`, which expand the mode loops of `lea::simd`; `serpent::avx2`,
//! `serpent::avx512`, which expand `serpent::simd`; `twofish::avx2`, `twofish::avx512`, which
//! expand the kernels of `twofish::simd`) and the TSC reader
//! (`tsc`, feature `bench`) and the register wipe after keyed calls (`wipe`), each block with a `SAFETY:` comment: the crate denies `unsafe_code`
//! (Cargo.toml) and only those modules allow it.

mod aes;
mod anf;
pub mod backend;
pub mod engine;
pub mod error;
pub mod essiv;
pub mod gcm;
pub mod gf128;
pub mod hash;
pub mod keys;
mod lea;
mod lmk;
pub mod lrw;
pub mod modes;
mod portable;
pub mod sector;
mod serpent;
pub mod spec;
#[cfg(feature = "bench")]
pub mod staged;
#[cfg(feature = "bench")]
#[allow(unsafe_code)] // rdtsc
pub mod tsc;
mod twofish;
#[allow(unsafe_code)] // zeroing the vector registers
mod wipe;

pub use backend::{Algorithm, Backend, BackendChoice};
pub use engine::{Block, BlockEngine, Direction, BLOCK};
pub use error::Error;
pub use sector::{SectorCipher, SectorOptions};
pub use spec::CipherSpec;
#[cfg(all(any(test, feature = "stack-reach"), target_arch = "x86_64"))]
pub use wipe::reach;

/// Run `f`, which works with keys outside this crate's engines (another crate's cipher or MAC,
/// whose frames and registers this crate does not know), and then clear what it leaves behind as
/// every keyed call of this crate's engines is cleared: the vector registers, and the deep stack
/// depth below the caller (24 KiB). Calls to this crate's engines inside `f` share that one wipe.
/// It also runs if `f` panics.
#[inline(always)]
pub fn wiping<R>(f: impl FnOnce() -> R) -> R {
    wipe::once(|| {
        // Asked for first, so that a panic in `f` is wiped as deep.
        wipe::after_keyed_call(wipe::DEEP_STACK);
        f()
    })
}

/// A keyed block cipher: `key` must be 16, 24 or 32 bytes (SM4: 16; Serpent also any length up to
/// 32 bytes, CAST6 16 to 32 in steps of 4, as ESSIV salts may need).
pub fn block_cipher(
    alg: Algorithm,
    key: &[u8],
    choice: BackendChoice,
) -> Result<Box<dyn BlockEngine>, Error> {
    if !alg.accepts_key_len(key.len()) {
        return Err(Error::KeySize {
            spec: alg.name().to_string(),
            bits: key.len() * 8,
            allowed: if alg == Algorithm::Sm4 {
                "128"
            } else {
                "128, 192, 256"
            },
        });
    }
    let backend = choice.resolve(alg)?;
    let engine = match alg {
        Algorithm::Aes => aes::new_engine(key, backend),
        Algorithm::Lea => lea::new_engine(key, backend),
        Algorithm::Serpent => serpent::new_engine(key, backend),
        Algorithm::Twofish => twofish::new_engine(key, backend),
        _ => portable::new_engine(alg, key),
    };
    engine.ok_or(Error::BackendUnavailable(backend))
}
