//! The hashes of dm-crypt's `essiv:HASH` IV generator: the ESSIV key is `HASH(volume key)` (the
//! whole digest), so the digest length must be a key length of the block cipher (e.g. 32 bytes
//! for AES-256: `essiv:sha256`, `essiv:wp256`, `essiv:sha3-256`, `essiv:blake2s-256`, `essiv:sm3`).
//!
//! Names are the kernel's crypto API names (`wp256`, `rmd160`, ...) that dm-crypt tables and LUKS
//! headers carry, plus the OpenSSL/cryptsetup spellings of the same functions (`ripemd160`,
//! `whirlpool`), kept apart so a header's string prints back unchanged.

use std::fmt;

use zeroize::Zeroizing;

use crate::hash::Hash;

/// A hash for ESSIV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EssivHash {
    /// `sha1` (20 bytes).
    Sha1,
    /// `sha224` (28 bytes).
    Sha224,
    /// `sha256` (32 bytes).
    Sha256,
    /// `sha384` (48 bytes).
    Sha384,
    /// `sha512` (64 bytes).
    Sha512,
    /// `sha3-224` (28 bytes).
    Sha3_224,
    /// `sha3-256` (32 bytes).
    Sha3_256,
    /// `sha3-384` (48 bytes).
    Sha3_384,
    /// `sha3-512` (64 bytes).
    Sha3_512,
    /// `rmd160`, the kernel's RIPEMD-160 (20 bytes).
    Rmd160,
    /// `ripemd160`, OpenSSL's name of the same (20 bytes).
    Ripemd160,
    /// `wp256`: Whirlpool truncated to 32 bytes (the kernel's).
    Wp256,
    /// `wp384`: Whirlpool truncated to 48 bytes.
    Wp384,
    /// `wp512`: Whirlpool (64 bytes).
    Wp512,
    /// `whirlpool`: OpenSSL's name of Whirlpool (64 bytes).
    Whirlpool,
    /// `sm3` (32 bytes).
    Sm3,
    /// `blake2s-256` (32 bytes).
    Blake2s256,
    /// `blake2b-512` (64 bytes).
    Blake2b512,
}

impl EssivHash {
    /// Every ESSIV hash.
    pub const ALL: [EssivHash; 18] = [
        EssivHash::Sha1,
        EssivHash::Sha224,
        EssivHash::Sha256,
        EssivHash::Sha384,
        EssivHash::Sha512,
        EssivHash::Sha3_224,
        EssivHash::Sha3_256,
        EssivHash::Sha3_384,
        EssivHash::Sha3_512,
        EssivHash::Rmd160,
        EssivHash::Ripemd160,
        EssivHash::Wp256,
        EssivHash::Wp384,
        EssivHash::Wp512,
        EssivHash::Whirlpool,
        EssivHash::Sm3,
        EssivHash::Blake2s256,
        EssivHash::Blake2b512,
    ];

    /// The name in a cipher specification.
    pub fn name(self) -> &'static str {
        match self {
            EssivHash::Sha1 => "sha1",
            EssivHash::Sha224 => "sha224",
            EssivHash::Sha256 => "sha256",
            EssivHash::Sha384 => "sha384",
            EssivHash::Sha512 => "sha512",
            EssivHash::Sha3_224 => "sha3-224",
            EssivHash::Sha3_256 => "sha3-256",
            EssivHash::Sha3_384 => "sha3-384",
            EssivHash::Sha3_512 => "sha3-512",
            EssivHash::Rmd160 => "rmd160",
            EssivHash::Ripemd160 => "ripemd160",
            EssivHash::Wp256 => "wp256",
            EssivHash::Wp384 => "wp384",
            EssivHash::Wp512 => "wp512",
            EssivHash::Whirlpool => "whirlpool",
            EssivHash::Sm3 => "sm3",
            EssivHash::Blake2s256 => "blake2s-256",
            EssivHash::Blake2b512 => "blake2b-512",
        }
    }

    /// The hash of a name (exact, lower case, as dm-crypt compares).
    pub fn from_name(name: &str) -> Option<EssivHash> {
        EssivHash::ALL.into_iter().find(|h| h.name() == name)
    }

    /// The hash function and the length of its digest ESSIV keeps (the kernel's `wp256` and
    /// `wp384` are Whirlpool truncated).
    fn function(self) -> (Hash, usize) {
        let h = match self {
            EssivHash::Sha1 => Hash::Sha1,
            EssivHash::Sha224 => Hash::Sha224,
            EssivHash::Sha256 => Hash::Sha256,
            EssivHash::Sha384 => Hash::Sha384,
            EssivHash::Sha512 => Hash::Sha512,
            EssivHash::Sha3_224 => Hash::Sha3_224,
            EssivHash::Sha3_256 => Hash::Sha3_256,
            EssivHash::Sha3_384 => Hash::Sha3_384,
            EssivHash::Sha3_512 => Hash::Sha3_512,
            EssivHash::Rmd160 | EssivHash::Ripemd160 => Hash::Ripemd160,
            EssivHash::Wp256 => return (Hash::Whirlpool, 32),
            EssivHash::Wp384 => return (Hash::Whirlpool, 48),
            EssivHash::Wp512 | EssivHash::Whirlpool => Hash::Whirlpool,
            EssivHash::Sm3 => Hash::Sm3,
            EssivHash::Blake2s256 => Hash::Blake2s256,
            EssivHash::Blake2b512 => Hash::Blake2b512,
        };
        (h, h.digest_len())
    }

    /// The digest length in bytes (the ESSIV key length).
    pub fn digest_len(self) -> usize {
        self.function().1
    }

    /// The ESSIV key: the digest of `key`, [`Self::digest_len`] bytes.
    pub fn digest(self, key: &[u8]) -> Zeroizing<Vec<u8>> {
        let (h, len) = self.function();
        let mut out = Zeroizing::new(vec![0u8; len]);
        h.digest_into(&[key], &mut out);
        out
    }
}

impl fmt::Display for EssivHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
