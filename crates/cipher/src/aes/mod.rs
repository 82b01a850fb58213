//! AES (FIPS 197) on three backends:
//!
//! - [`soft`]: portable, constant-time bitsliced code (no table lookups, no secret branches). The
//!   `aes` crate's own software path cannot be chosen at run time (it is a build-time `cfg`), and
//!   the project must be able to run every backend in one test run, so the portable AES lives here.
//! - `ni`: AES-NI with eight blocks in flight, fused XTS and parallel CBC-decrypt kernels.
//! - `vaes512`: VAES on 512-bit registers (four blocks each) with VPCLMULQDQ tweak generation.
//! - `vaes256`: VAES on 256-bit registers (two blocks each), for CPUs with VAES but no AVX-512.
//!
//! The backend is chosen once, when the key is set up ([`new_engine`]).

pub(crate) mod soft;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AES-NI kernels
pub(crate) mod ni;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // VAES + AVX2 kernels
pub(crate) mod vaes256;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // VAES + AVX-512 kernels
pub(crate) mod vaes512;
#[cfg(target_arch = "x86_64")]
mod wide;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // SSE loads and stores of round keys shared by both kernels
mod x86;

use crate::backend::Backend;
use crate::engine::{keyed, BlockEngine};
use crate::keys::{InSlot, Typed};

/// A keyed AES engine on `backend`. `key` is 16, 24 or 32 bytes (checked by the caller); the
/// backend has been checked to run on this CPU.
pub(crate) fn new_engine(key: &[u8], backend: Backend) -> Option<Box<dyn BlockEngine>> {
    debug_assert!(matches!(key.len(), 16 | 24 | 32));
    match backend {
        Backend::Portable => keyed(|| Some(soft::AesSoft::new(key))),
        #[cfg(target_arch = "x86_64")]
        Backend::AesNi => keyed(|| ni::AesNi::new(key)),
        #[cfg(target_arch = "x86_64")]
        Backend::Vaes512 => keyed(|| vaes512::Vaes512::new(key)),
        #[cfg(target_arch = "x86_64")]
        Backend::Vaes256 => keyed(|| vaes256::Vaes256::new(key)),
        _ => None,
    }
}

/// A Key Per I/O table whose slots hold AES engines by value on `backend` (see `crate::keys`);
/// `None` where the backend has no such engine.
pub(crate) fn slots(backend: Backend, capacity: usize) -> Option<Box<dyn crate::keys::Slots>> {
    use crate::error::Error;
    fn unavailable(b: Backend) -> Error {
        Error::BackendUnavailable(b)
    }
    Some(match backend {
        Backend::Portable => Box::new(Typed::new(capacity, |_, key, _| {
            Ok(InSlot(soft::AesSoft::new(key)))
        })),
        #[cfg(target_arch = "x86_64")]
        Backend::AesNi => Box::new(Typed::new(capacity, |_, key, b| {
            ni::AesNi::new(key).map(InSlot).ok_or(unavailable(b))
        })),
        #[cfg(target_arch = "x86_64")]
        Backend::Vaes512 => Box::new(Typed::new(capacity, |_, key, b| {
            vaes512::Vaes512::new(key).map(InSlot).ok_or(unavailable(b))
        })),
        #[cfg(target_arch = "x86_64")]
        Backend::Vaes256 => Box::new(Typed::new(capacity, |_, key, b| {
            vaes256::Vaes256::new(key).map(InSlot).ok_or(unavailable(b))
        })),
        _ => return None,
    })
}
