//! Serpent (Anderson, Biham and Knudsen; the AES finalist dm-crypt users pick as
//! `serpent-xts-plain64`), in its bitslice form and in constant time on every backend: no table
//! is indexed by key or data, and no branch depends on them.
//!
//! One round circuit ([`rounds`]: the S-boxes as algebraic normal forms folded at compile time
//! into ANDs and XORs, the linear transform as rotations and XORs) is expanded over three word
//! types:
//! - [`soft`]: a `u32` per word, one block at a time; also the tables and the key schedule the
//!   other backends share.
//! - `avx2`: word `i` of eight blocks in one `__m256i` (rotations are two shifts and an OR).
//! - `avx512`: word `i` of sixteen blocks in one `__m512i` (`vprold`; LLVM merges the S-box
//!   ANDs, XORs and NOTs into `vpternlogd`).
//! - `simd`: the engine and its ECB loop, written once for both SIMD backends.
//!
//! The SIMD backends load a set of blocks and transpose it with LEA's set layout (the same
//! loads and in-lane 4x4 transpose, `crate::lea::avx2`/`avx512`); the lanes of a set are
//! independent, so their order does not matter. XTS and CBC run through the generic whole-unit
//! loops of [`crate::engine`], whose ECB calls carry a whole sector (or 4 KiB) at once.
//!
//! Bytes and words are little endian, as in the Linux kernel's `serpent` and Crypto++ (the
//! `tnepres` byte order is not offered).

mod rounds;
pub(crate) mod soft;

#[cfg(target_arch = "x86_64")]
mod simd;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 kernels
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 kernels
pub(crate) mod avx512;

use crate::backend::Backend;
use crate::engine::{keyed, BlockEngine};

/// A keyed Serpent engine on `backend` (`key` is 1 to 32 bytes; `None` for another length or a
/// backend this CPU cannot run or that Serpent does not have).
pub(crate) fn new_engine(key: &[u8], backend: Backend) -> Option<Box<dyn BlockEngine>> {
    match backend {
        Backend::Portable => keyed(|| soft::SerpentSoft::new(key)),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => keyed(|| avx2::SerpentAvx2::new(key)),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => keyed(|| avx512::SerpentAvx512::new(key)),
        _ => None,
    }
}
