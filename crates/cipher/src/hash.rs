//! The hash functions a LUKS volume may name (PBKDF2, the AF splitter, digests) and dm-crypt's
//! ESSIV uses: every hash cryptsetup 2.6 offers through its crypto backends, on RustCrypto's
//! implementations. One place dispatches on the function, so the ESSIV salt and the LUKS code
//! cannot disagree about what a name computes.
//!
//! Names here are the ones LUKS headers carry (cryptsetup's, which are OpenSSL's and libgcrypt's:
//! `ripemd160`, `whirlpool`, `stribog512`); the kernel's ESSIV names (`rmd160`, `wp256`,
//! `streebog512`) are mapped by [`crate::essiv`].

use std::fmt;

use digest::core_api::BlockSizeUser;
use digest::Digest;
use zeroize::Zeroize;

/// A hash function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Hash {
    /// SHA-1 (old LUKS1 volumes).
    Sha1,
    /// SHA-224.
    Sha224,
    /// SHA-256 (cryptsetup's default).
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
    /// SHA3-224.
    Sha3_224,
    /// SHA3-256.
    Sha3_256,
    /// SHA3-384.
    Sha3_384,
    /// SHA3-512.
    Sha3_512,
    /// RIPEMD-160.
    Ripemd160,
    /// Whirlpool (512-bit digest).
    Whirlpool,
    /// SM3 (GB/T 32905).
    Sm3,
    /// BLAKE2b with a 160-bit digest.
    Blake2b160,
    /// BLAKE2b with a 256-bit digest.
    Blake2b256,
    /// BLAKE2b with a 384-bit digest.
    Blake2b384,
    /// BLAKE2b with a 512-bit digest.
    Blake2b512,
    /// BLAKE2s with a 160-bit digest.
    Blake2s160,
    /// BLAKE2s with a 256-bit digest.
    Blake2s256,
    /// GOST R 34.11-2012 (Streebog) with a 256-bit digest.
    Stribog256,
    /// GOST R 34.11-2012 (Streebog) with a 512-bit digest.
    Stribog512,
}

/// Runs `$body` with the type alias `$d` bound to the RustCrypto type of `$hash`.
macro_rules! with_digest {
    ($hash:expr, $d:ident => $body:expr) => {
        match $hash {
            Hash::Sha1 => {
                type $d = sha1::Sha1;
                $body
            }
            Hash::Sha224 => {
                type $d = sha2::Sha224;
                $body
            }
            Hash::Sha256 => {
                type $d = sha2::Sha256;
                $body
            }
            Hash::Sha384 => {
                type $d = sha2::Sha384;
                $body
            }
            Hash::Sha512 => {
                type $d = sha2::Sha512;
                $body
            }
            Hash::Sha3_224 => {
                type $d = sha3::Sha3_224;
                $body
            }
            Hash::Sha3_256 => {
                type $d = sha3::Sha3_256;
                $body
            }
            Hash::Sha3_384 => {
                type $d = sha3::Sha3_384;
                $body
            }
            Hash::Sha3_512 => {
                type $d = sha3::Sha3_512;
                $body
            }
            Hash::Ripemd160 => {
                type $d = ripemd::Ripemd160;
                $body
            }
            Hash::Whirlpool => {
                type $d = whirlpool::Whirlpool;
                $body
            }
            Hash::Sm3 => {
                type $d = sm3::Sm3;
                $body
            }
            Hash::Blake2b160 => {
                type $d = blake2::Blake2b<digest::consts::U20>;
                $body
            }
            Hash::Blake2b256 => {
                type $d = blake2::Blake2b<digest::consts::U32>;
                $body
            }
            Hash::Blake2b384 => {
                type $d = blake2::Blake2b<digest::consts::U48>;
                $body
            }
            Hash::Blake2b512 => {
                type $d = blake2::Blake2b512;
                $body
            }
            Hash::Blake2s160 => {
                type $d = blake2::Blake2s<digest::consts::U20>;
                $body
            }
            Hash::Blake2s256 => {
                type $d = blake2::Blake2s256;
                $body
            }
            Hash::Stribog256 => {
                type $d = streebog::Streebog256;
                $body
            }
            Hash::Stribog512 => {
                type $d = streebog::Streebog512;
                $body
            }
        }
    };
}

impl Hash {
    /// Every hash, in cryptsetup's usual listing order.
    pub const ALL: [Hash; 20] = [
        Hash::Sha1,
        Hash::Sha224,
        Hash::Sha256,
        Hash::Sha384,
        Hash::Sha512,
        Hash::Sha3_224,
        Hash::Sha3_256,
        Hash::Sha3_384,
        Hash::Sha3_512,
        Hash::Ripemd160,
        Hash::Whirlpool,
        Hash::Sm3,
        Hash::Blake2b160,
        Hash::Blake2b256,
        Hash::Blake2b384,
        Hash::Blake2b512,
        Hash::Blake2s160,
        Hash::Blake2s256,
        Hash::Stribog256,
        Hash::Stribog512,
    ];

    /// The name LUKS headers and cryptsetup's `--hash` use.
    pub fn name(self) -> &'static str {
        match self {
            Hash::Sha1 => "sha1",
            Hash::Sha224 => "sha224",
            Hash::Sha256 => "sha256",
            Hash::Sha384 => "sha384",
            Hash::Sha512 => "sha512",
            Hash::Sha3_224 => "sha3-224",
            Hash::Sha3_256 => "sha3-256",
            Hash::Sha3_384 => "sha3-384",
            Hash::Sha3_512 => "sha3-512",
            Hash::Ripemd160 => "ripemd160",
            Hash::Whirlpool => "whirlpool",
            Hash::Sm3 => "sm3",
            Hash::Blake2b160 => "blake2b-160",
            Hash::Blake2b256 => "blake2b-256",
            Hash::Blake2b384 => "blake2b-384",
            Hash::Blake2b512 => "blake2b-512",
            Hash::Blake2s160 => "blake2s-160",
            Hash::Blake2s256 => "blake2s-256",
            Hash::Stribog256 => "stribog256",
            Hash::Stribog512 => "stribog512",
        }
    }

    /// The hash of a LUKS name, ignoring ASCII case (as cryptsetup's backends do).
    pub fn from_name(name: &str) -> Option<Hash> {
        Hash::ALL
            .into_iter()
            .find(|h| h.name().eq_ignore_ascii_case(name))
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        with_digest!(self, D => <D as Digest>::output_size())
    }

    /// Hash the concatenation of `parts` into `out`, which takes the first `out.len()` bytes of the
    /// digest (at most [`Self::digest_len`]).
    pub fn digest_into(self, parts: &[&[u8]], out: &mut [u8]) {
        fn run<D: Digest>(parts: &[&[u8]], out: &mut [u8]) {
            let mut d = D::new();
            for p in parts {
                d.update(p);
            }
            let mut full = d.finalize();
            out.copy_from_slice(&full[..out.len()]);
            full.as_mut_slice().zeroize();
        }
        with_digest!(self, D => run::<D>(parts, out))
    }

    /// PBKDF2-HMAC with this hash: `out.len()` bytes derived from `passphrase` and `salt`.
    pub fn pbkdf2(self, passphrase: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        fn run<D>(passphrase: &[u8], salt: &[u8], iterations: u32, out: &mut [u8])
        where
            D: Digest + BlockSizeUser + Clone + Sync,
        {
            pbkdf2::pbkdf2::<hmac::SimpleHmac<D>>(passphrase, salt, iterations, out)
                .expect("HMAC takes keys of any length");
        }
        // SHA-1 and SHA-2, the hashes nearly every volume uses, on the HMAC that keeps the
        // padded key's hash state (about twice as fast per iteration); the others on the generic
        // one, which fits every hash (BLAKE2's lazy buffering included).
        match self {
            Hash::Sha1 => pbkdf2::pbkdf2_hmac::<sha1::Sha1>(passphrase, salt, iterations, out),
            Hash::Sha256 => pbkdf2::pbkdf2_hmac::<sha2::Sha256>(passphrase, salt, iterations, out),
            Hash::Sha512 => pbkdf2::pbkdf2_hmac::<sha2::Sha512>(passphrase, salt, iterations, out),
            other => with_digest!(other, D => run::<D>(passphrase, salt, iterations, out)),
        }
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_lengths_match_the_names() {
        for h in Hash::ALL {
            assert_eq!(Hash::from_name(h.name()), Some(h));
            assert_eq!(Hash::from_name(&h.name().to_uppercase()), Some(h));
            let bits: usize = h
                .name()
                .rsplit(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let want = match h {
                Hash::Sha1 | Hash::Ripemd160 => 20,
                Hash::Whirlpool => 64,
                Hash::Sm3 => 32,
                _ => bits / 8,
            };
            assert_eq!(h.digest_len(), want, "{h}");
        }
        assert_eq!(Hash::from_name("md5"), None);
    }

    /// One known answer per function (the empty message or "abc", from each function's standard
    /// or reference implementation); the cross-checks against OpenSSL are in the luks tests.
    #[test]
    fn known_answers() {
        let cases: [(Hash, &[u8], &str); 6] = [
            (
                Hash::Sha1,
                b"abc",
                "a9993e364706816aba3e25717850c26c9cd0d89d",
            ),
            (
                Hash::Sm3,
                b"abc",
                "66c7f0f462eeedd9d1f2d46bdc10e4e24167c4875cf2f7a2297da02b8f4ba8e0",
            ),
            (
                Hash::Ripemd160,
                b"abc",
                "8eb208f7e05d987a9b044a8e98c6b087f15a0bfc",
            ),
            (
                Hash::Sha3_256,
                b"",
                "a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a",
            ),
            (
                Hash::Blake2s256,
                b"",
                "69217a3079908094e11121d042354a7c1f55b6482ca1a51e1b250dfd1ed0eef9",
            ),
            (
                Hash::Whirlpool,
                b"",
                "19fa61d75522a4669b44e39c1d2e1726c530232130d407f89afee0964997f7a7\
                 3e83be698b288febcf88e3e03c4f0757ea8964e59b63d93708b138cc42a66eb3",
            ),
        ];
        for (h, msg, want) in cases {
            let mut out = vec![0u8; h.digest_len()];
            h.digest_into(&[msg], &mut out);
            let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, want.replace(' ', ""), "{h}");
        }
    }
}
