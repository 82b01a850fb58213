//! The hash functions LUKS names in its headers, for PBKDF2, the AF splitter's diffusion and
//! digests: the cipher core's [`Hash`] (every hash cryptsetup 2.6 offers), parsed from a header or
//! an option with this crate's error.

pub use sectorcrypt_cipher::hash::Hash;

use crate::error::Error;

/// Parse a LUKS hash name (ASCII case ignored, as cryptsetup).
pub fn parse(name: &str) -> Result<Hash, Error> {
    Hash::from_name(name).ok_or_else(|| {
        Error::Unsupported(format!(
            "hash '{name}' (use sha1, sha224, sha256, sha384, sha512, sha3-224, sha3-256, \
             sha3-384, sha3-512, ripemd160, whirlpool, sm3, blake2b-160, blake2b-256, \
             blake2b-384, blake2b-512, blake2s-160, blake2s-256, stribog256 or stribog512)"
        ))
    })
}
