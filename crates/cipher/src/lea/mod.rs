//! LEA (KS X 3246, ISO/IEC 29192-2): a 128-bit ARX block cipher with 24/28/32 rounds for
//! 128/192/256-bit keys. ARX code is constant time by construction (no tables, no branches on
//! data), so every backend here is.
//!
//! - [`soft`]: portable Rust, also the key schedule the SIMD backends share.
//! - `avx2`: eight blocks per 256-bit register set (words of eight blocks transposed into lanes).
//! - `avx512`: sixteen blocks per 512-bit register set, with native rotates (`vprold`).
//! - `simd`: the engine and mode loops both SIMD backends expand from their own primitives.

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

/// A keyed LEA engine on `backend`. `key` is 16, 24 or 32 bytes (checked by the caller); the
/// backend has been checked to run on this CPU.
pub(crate) fn new_engine(key: &[u8], backend: Backend) -> Option<Box<dyn BlockEngine>> {
    debug_assert!(matches!(key.len(), 16 | 24 | 32));
    match backend {
        Backend::Portable => keyed(|| Some(soft::LeaSoft::new(key))),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => keyed(|| avx2::LeaAvx2::new(key)),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => keyed(|| avx512::LeaAvx512::new(key)),
        _ => None,
    }
}
