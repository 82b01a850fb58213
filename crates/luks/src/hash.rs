//! The hash functions LUKS names in its headers (`sha1`, `sha256`, `sha512`), for PBKDF2, the AF
//! splitter's diffusion and digests.

use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

use crate::error::Error;

/// A hash function by its LUKS name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hash {
    /// SHA-1 (old LUKS1 volumes).
    Sha1,
    /// SHA-256 (cryptsetup's default).
    Sha256,
    /// SHA-512.
    Sha512,
}

impl Hash {
    /// Parse a LUKS hash name.
    pub fn parse(name: &str) -> Result<Self, Error> {
        match name.to_ascii_lowercase().as_str() {
            "sha1" => Ok(Hash::Sha1),
            "sha256" => Ok(Hash::Sha256),
            "sha512" => Ok(Hash::Sha512),
            _ => Err(Error::Unsupported(format!(
                "hash '{name}' (use sha1, sha256 or sha512)"
            ))),
        }
    }

    /// The LUKS name.
    pub fn name(self) -> &'static str {
        match self {
            Hash::Sha1 => "sha1",
            Hash::Sha256 => "sha256",
            Hash::Sha512 => "sha512",
        }
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Hash::Sha1 => 20,
            Hash::Sha256 => 32,
            Hash::Sha512 => 64,
        }
    }

    /// Hash the concatenation of `parts` into the first `out.len()` bytes of the digest.
    pub fn digest_into(self, parts: &[&[u8]], out: &mut [u8]) {
        fn run<D: Digest>(parts: &[&[u8]], out: &mut [u8]) {
            let mut d = D::new();
            for p in parts {
                d.update(p);
            }
            let full = d.finalize();
            out.copy_from_slice(&full[..out.len()]);
        }
        match self {
            Hash::Sha1 => run::<Sha1>(parts, out),
            Hash::Sha256 => run::<Sha256>(parts, out),
            Hash::Sha512 => run::<Sha512>(parts, out),
        }
    }
}
