//! Passphrase-based key derivation as LUKS stores it: PBKDF2 (LUKS1 keyslots and digests, LUKS2
//! `pbkdf2` keyslots and digests) and Argon2i / Argon2id (LUKS2 keyslots). The cost is always the
//! one recorded in the header, never more.

use zeroize::Zeroizing;

use crate::error::Error;
use crate::hash::Hash;

/// A key-derivation function with its recorded cost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kdf {
    /// PBKDF2-HMAC.
    Pbkdf2 { hash: Hash, iterations: u32 },
    /// Argon2 (`argon2i` or `argon2id`), version 0x13.
    Argon2 {
        variant: Argon2Variant,
        time: u32,
        memory_kib: u32,
        parallel: u32,
    },
}

/// Which Argon2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Argon2Variant {
    /// Data-independent addressing.
    Argon2i,
    /// Hybrid (cryptsetup's default).
    Argon2id,
}

impl Kdf {
    /// LUKS2's name of the function (`pbkdf2`, `argon2i`, `argon2id`).
    pub fn name(&self) -> &'static str {
        match self {
            Kdf::Pbkdf2 { .. } => "pbkdf2",
            Kdf::Argon2 {
                variant: Argon2Variant::Argon2i,
                ..
            } => "argon2i",
            Kdf::Argon2 {
                variant: Argon2Variant::Argon2id,
                ..
            } => "argon2id",
        }
    }

    /// Derive `len` bytes from `passphrase` and `salt`.
    pub fn derive(
        &self,
        passphrase: &[u8],
        salt: &[u8],
        len: usize,
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        let mut out = Zeroizing::new(vec![0u8; len]);
        match *self {
            Kdf::Pbkdf2 { hash, iterations } => {
                if iterations == 0 {
                    return Err(Error::Corrupt("a PBKDF2 iteration count of 0".into()));
                }
                match hash {
                    Hash::Sha1 => {
                        pbkdf2::pbkdf2_hmac::<sha1::Sha1>(passphrase, salt, iterations, &mut out)
                    }
                    Hash::Sha256 => {
                        pbkdf2::pbkdf2_hmac::<sha2::Sha256>(passphrase, salt, iterations, &mut out)
                    }
                    Hash::Sha512 => {
                        pbkdf2::pbkdf2_hmac::<sha2::Sha512>(passphrase, salt, iterations, &mut out)
                    }
                }
            }
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => {
                let params = argon2::Params::new(memory_kib, time, parallel, Some(len))
                    .map_err(|e| Error::Corrupt(format!("Argon2 parameters: {e}")))?;
                let algorithm = match variant {
                    Argon2Variant::Argon2i => argon2::Algorithm::Argon2i,
                    Argon2Variant::Argon2id => argon2::Algorithm::Argon2id,
                };
                argon2::Argon2::new(algorithm, argon2::Version::V0x13, params)
                    .hash_password_into(passphrase, salt, &mut out)
                    .map_err(|e| match e {
                        argon2::Error::MemoryTooLittle | argon2::Error::MemoryTooMuch => {
                            Error::Corrupt(format!("Argon2 memory cost: {e}"))
                        }
                        other => Error::Corrupt(format!("Argon2: {other}")),
                    })?;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6070 (PBKDF2-HMAC-SHA1) and the widely published SHA-256 equivalent.
    #[test]
    fn pbkdf2_known_answers() {
        let k = Kdf::Pbkdf2 {
            hash: Hash::Sha1,
            iterations: 4096,
        };
        assert_eq!(
            hex::encode(&k.derive(b"password", b"salt", 20).unwrap()[..]),
            "4b007901b765489abead49d926f721d065a429c1"
        );
        let k = Kdf::Pbkdf2 {
            hash: Hash::Sha256,
            iterations: 1,
        };
        assert_eq!(
            hex::encode(&k.derive(b"password", b"salt", 32).unwrap()[..]),
            "120fb6cffcf8b32c43e7225256c4f837a86548c92ccc35480805987cb70be17b"
        );
    }

    /// Argon2 itself is the `argon2` crate's (tested upstream against RFC 9106); what is checked
    /// here is that every parameter reaches it. Interop tests against cryptsetup check the rest.
    #[test]
    fn argon2id_runs_and_depends_on_every_input() {
        let k = Kdf::Argon2 {
            variant: Argon2Variant::Argon2id,
            time: 1,
            memory_kib: 64,
            parallel: 1,
        };
        let a = k.derive(b"pass", b"saltsaltsaltsalt", 32).unwrap();
        assert_ne!(
            &a[..],
            &k.derive(b"pasS", b"saltsaltsaltsalt", 32).unwrap()[..]
        );
        assert_ne!(
            &a[..],
            &k.derive(b"pass", b"saltsaltsaltsalT", 32).unwrap()[..]
        );
        let i = Kdf::Argon2 {
            variant: Argon2Variant::Argon2i,
            time: 1,
            memory_kib: 64,
            parallel: 1,
        };
        assert_ne!(
            &a[..],
            &i.derive(b"pass", b"saltsaltsaltsalt", 32).unwrap()[..]
        );
        let bad = Kdf::Argon2 {
            variant: Argon2Variant::Argon2id,
            time: 1,
            memory_kib: 1,
            parallel: 4,
        };
        assert!(bad.derive(b"p", b"saltsaltsaltsalt", 32).is_err());
    }
}
