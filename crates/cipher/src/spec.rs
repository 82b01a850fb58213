//! dm-crypt cipher specifications: `CIPHER-MODE-IV`, e.g. `aes-xts-plain64`, `aes-cbc-essiv:sha256`,
//! `serpent-xts-plain64`, `camellia-cbc-essiv:wp256`, `cipher_null-ecb`. The same strings LUKS
//! stores in its headers.
//!
//! Ciphers: `aes`, `serpent`, `twofish`, `camellia`, `aria`, `sm4`, `cast6`, `lea` (and
//! `cipher_null`); modes `xts`, `cbc`, `ecb`; IV generators `plain`, `plain64`, `plain64be`,
//! `essiv:HASH` (CBC; [`EssivHash`] lists the hashes), `benbi`, `null`, `eboiv` (CBC) and `lmk`
//! (CBC, 512-byte sectors). Multi-key specs (`aes:64-cbc-lmk`) are not supported.

use std::fmt;
use std::str::FromStr;

use crate::backend::Algorithm;
use crate::error::Error;
pub use crate::essiv::EssivHash;

/// The block cipher of a spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CipherName {
    /// A real block cipher.
    Block(Algorithm),
    /// `cipher_null`: the identity, for measuring everything but the cipher.
    Null,
}

/// The sector mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// XTS (IEEE 1619): two keys, a tweak per sector.
    Xts,
    /// CBC, one chain per sector.
    Cbc,
    /// ECB: every block on its own (no IV).
    Ecb,
    /// LRW (IEEE P1619 drafts): a tweak per block from a 16-byte tweak key at the end of the key
    /// and the IV as a big-endian block index (`benbi`).
    Lrw,
}

/// How the per-sector IV is derived from the sector number (dm-crypt's IV generators).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IvMode {
    /// `plain`: the low 32 bits of the sector number, little endian, zero padded.
    Plain,
    /// `plain64`: the 64-bit sector number, little endian, zero padded.
    Plain64,
    /// `plain64be`: the 64-bit sector number, big endian, in the last eight bytes of the IV.
    Plain64Be,
    /// `essiv:HASH`: the plain64 IV encrypted with the cipher keyed by HASH(volume key).
    Essiv(EssivHash),
    /// `null`: an all-zero IV for every sector (dm-crypt's, for compatibility with old volumes).
    Null,
    /// `eboiv`: the sector's byte offset (the IV sector times the sector size), 64-bit little
    /// endian, encrypted with the data key (BitLocker's CBC volumes; CBC only).
    Eboiv,
    /// `benbi`: the 64-bit big-endian "narrow block count" (the count of 16-byte blocks before
    /// the sector, plus one) in the last eight bytes of the IV.
    Benbi,
    /// `lmk`: loop-AES's IV, an MD5 compression of the sector's plaintext blocks 1 to 31 and
    /// its number (CBC with 512-byte sectors only; see `crate::lmk`).
    Lmk,
    /// No IV (ECB).
    None,
}

/// A parsed `CIPHER-MODE-IV` specification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CipherSpec {
    /// The block cipher.
    pub cipher: CipherName,
    /// The sector mode.
    pub mode: Mode,
    /// The IV generator.
    pub iv: IvMode,
}

impl CipherSpec {
    /// cryptsetup's default, `aes-xts-plain64`.
    pub const DEFAULT: CipherSpec = CipherSpec {
        cipher: CipherName::Block(Algorithm::Aes),
        mode: Mode::Xts,
        iv: IvMode::Plain64,
    };

    /// Parse a dm-crypt cipher specification.
    pub fn parse(spec: &str) -> Result<Self, Error> {
        let bad = |reason| Error::BadSpec {
            spec: spec.to_string(),
            reason,
        };
        let mut parts = spec.splitn(3, '-');
        let cipher = match parts.next().unwrap_or("") {
            "cipher_null" => CipherName::Null,
            "" => return Err(bad("it is empty")),
            name if name.contains(':') => {
                return Err(bad(
                    "multi-key specs (CIPHER:KEYCOUNT, e.g. loop-AES's aes:64-cbc-lmk) are not supported",
                ))
            }
            name => match Algorithm::from_name(name) {
                Some(alg) => CipherName::Block(alg),
                None => {
                    return Err(bad(
                        "unknown cipher (use aes, serpent, twofish, camellia, aria, sm4, cast6, lea or cipher_null)",
                    ))
                }
            },
        };
        let mode = match parts.next() {
            Some("xts") => Mode::Xts,
            Some("lrw") => Mode::Lrw,
            Some("cbc") => Mode::Cbc,
            Some("ecb") => Mode::Ecb,
            Some(_) => return Err(bad("unknown mode (use xts, cbc, ecb or lrw)")),
            None => return Err(bad("the mode is missing (e.g. aes-xts-plain64)")),
        };
        let iv = match parts.next() {
            Some("plain") => IvMode::Plain,
            Some("plain64") => IvMode::Plain64,
            Some("plain64be") => IvMode::Plain64Be,
            Some("null") => IvMode::Null,
            Some("benbi") => IvMode::Benbi,
            Some("eboiv") => IvMode::Eboiv,
            Some("lmk") => IvMode::Lmk,
            Some(iv) => match iv.strip_prefix("essiv:").map(EssivHash::from_name) {
                Some(Some(hash)) => IvMode::Essiv(hash),
                Some(None) => return Err(bad(
                    "unknown ESSIV hash (use sha1, sha224, sha256, sha384, sha512, sha3-224, sha3-256, sha3-384, sha3-512, rmd160, ripemd160, wp256, wp384, wp512, whirlpool, sm3, blake2s-256 or blake2b-512)",
                )),
                None => return Err(bad(
                    "unknown IV generator (use plain, plain64, plain64be, essiv:HASH, benbi, null, eboiv or lmk)",
                )),
            },
            None => IvMode::None,
        };
        match (cipher, mode, iv) {
            (CipherName::Null, Mode::Ecb, IvMode::None) => {}
            (CipherName::Null, _, _) => {
                return Err(bad("cipher_null is only valid as cipher_null-ecb"))
            }
            (_, Mode::Ecb, IvMode::None) => {}
            (_, Mode::Ecb, _) => return Err(bad("ECB takes no IV generator")),
            (_, _, IvMode::None) => {
                return Err(bad("XTS, CBC and LRW need an IV generator (e.g. -plain64)"))
            }
            (_, Mode::Lrw, IvMode::Essiv(_) | IvMode::Eboiv) => {
                return Err(bad(
                    "LRW takes a counting IV (benbi, plain64, ...), not ESSIV or EBOIV",
                ));
            }
            (_, Mode::Xts, IvMode::Essiv(_)) => {
                return Err(bad("ESSIV is for CBC; XTS uses plain64"));
            }
            (_, Mode::Xts, IvMode::Eboiv) => {
                return Err(bad("EBOIV is for CBC; XTS uses plain64"));
            }
            // Decryption relies on CBC: only the first block's plaintext depends on the IV.
            (_, Mode::Xts | Mode::Lrw, IvMode::Lmk) => {
                return Err(bad("LMK is for CBC (loop-AES's aes-cbc-lmk)"));
            }
            (CipherName::Block(alg), _, IvMode::Essiv(hash))
                if !alg.accepts_key_len(hash.digest_len()) =>
            {
                return Err(bad(
                    "the ESSIV hash's digest is not a key length of the cipher (e.g. AES needs a 16, 24 or 32-byte digest: essiv:sha256)",
                ));
            }
            _ => {}
        }
        Ok(CipherSpec { cipher, mode, iv })
    }

    /// The block cipher, if the spec has one.
    pub fn algorithm(&self) -> Option<Algorithm> {
        match self.cipher {
            CipherName::Block(a) => Some(a),
            CipherName::Null => None,
        }
    }

    /// Key sizes in bits this spec accepts (the whole key: both halves for XTS).
    pub fn key_bits_allowed(&self) -> &'static [usize] {
        match (self.cipher, self.mode) {
            (CipherName::Null, _) => &[0, 128, 256, 512],
            (CipherName::Block(Algorithm::Sm4), Mode::Xts | Mode::Lrw) => &[256],
            (CipherName::Block(Algorithm::Sm4), _) => &[128],
            (_, Mode::Xts) => &[256, 384, 512],
            // The cipher key and the 128-bit tweak key.
            (_, Mode::Lrw) => &[256, 320, 384],
            _ => &[128, 192, 256],
        }
    }

    /// cryptsetup's default key size for the spec (512 bits for XTS, 256 otherwise: for LRW an
    /// AES-128 key and the tweak key), capped at the largest the cipher takes (SM4: 256 for XTS,
    /// 128 otherwise).
    pub fn default_key_bits(&self) -> usize {
        match (self.cipher, self.mode) {
            (CipherName::Null, _) => 0,
            (_, Mode::Xts) => 512.min(*self.key_bits_allowed().last().unwrap_or(&512)),
            _ => 256.min(*self.key_bits_allowed().last().unwrap_or(&256)),
        }
    }

    /// Check that a key of `bytes` bytes fits.
    pub fn check_key_len(&self, bytes: usize) -> Result<(), Error> {
        if self.cipher == CipherName::Null || self.key_bits_allowed().contains(&(bytes * 8)) {
            return Ok(());
        }
        let allowed = match (self.cipher, self.mode) {
            (CipherName::Block(Algorithm::Sm4), Mode::Xts) => "256 bits (two equal halves)",
            (CipherName::Block(Algorithm::Sm4), Mode::Lrw) => "256 bits (key and tweak key)",
            (CipherName::Block(Algorithm::Sm4), _) => "128 bits",
            (_, Mode::Xts) => "256, 384 or 512 bits (two equal halves)",
            (_, Mode::Lrw) => "256, 320 or 384 bits (the cipher key and a 128-bit tweak key)",
            _ => "128, 192 or 256 bits",
        };
        Err(Error::KeySize {
            spec: self.to_string(),
            bits: bytes * 8,
            allowed,
        })
    }
}

impl FromStr for CipherSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        CipherSpec::parse(s)
    }
}

impl fmt::Display for CipherSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cipher = match self.cipher {
            CipherName::Block(a) => a.name(),
            CipherName::Null => "cipher_null",
        };
        let mode = match self.mode {
            Mode::Xts => "xts",
            Mode::Cbc => "cbc",
            Mode::Ecb => "ecb",
            Mode::Lrw => "lrw",
        };
        write!(f, "{cipher}-{mode}")?;
        let iv = match self.iv {
            IvMode::Plain => "plain",
            IvMode::Plain64 => "plain64",
            IvMode::Plain64Be => "plain64be",
            IvMode::Essiv(hash) => return write!(f, "-essiv:{hash}"),
            IvMode::Null => "null",
            IvMode::Benbi => "benbi",
            IvMode::Eboiv => "eboiv",
            IvMode::Lmk => "lmk",
            IvMode::None => return Ok(()),
        };
        write!(f, "-{iv}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of the three parts, rather than a list of names: whatever `parse`
    /// accepts prints back to the same spec, and it accepts exactly the dm-crypt ones.
    #[test]
    fn round_trips_every_supported_spec() {
        let mut ciphers: Vec<CipherName> =
            Algorithm::ALL.into_iter().map(CipherName::Block).collect();
        ciphers.push(CipherName::Null);
        let mut ivs = vec![
            IvMode::Plain,
            IvMode::Plain64,
            IvMode::Plain64Be,
            IvMode::Null,
            IvMode::Benbi,
            IvMode::Eboiv,
            IvMode::Lmk,
            IvMode::None,
        ];
        ivs.extend(EssivHash::ALL.into_iter().map(IvMode::Essiv));
        let mut supported = 0;
        for cipher in ciphers {
            for mode in [Mode::Xts, Mode::Cbc, Mode::Ecb, Mode::Lrw] {
                for &iv in &ivs {
                    let spec = CipherSpec { cipher, mode, iv };
                    if let Ok(parsed) = CipherSpec::parse(&spec.to_string()) {
                        assert_eq!(parsed, spec, "{spec}");
                        supported += 1;
                    }
                }
            }
        }
        // Per block cipher: XTS, CBC and LRW with plain, plain64, plain64be, null and benbi; CBC
        // also with eboiv, lmk and each ESSIV hash whose digest keys the cipher; ECB. Plus
        // cipher_null-ecb.
        let essiv = |alg: Algorithm| {
            EssivHash::ALL
                .into_iter()
                .filter(|h| alg.accepts_key_len(h.digest_len()))
                .count()
        };
        let want: usize = Algorithm::ALL
            .into_iter()
            .map(|alg| 3 * 5 + 2 + essiv(alg) + 1)
            .sum::<usize>()
            + 1;
        assert_eq!(supported, want);
        // AES: sha256, sha3-256, wp256, sm3, blake2s-256 (32 bytes), sha224/sha3-224 are 28.
        assert_eq!(essiv(Algorithm::Aes), 5);
        // Serpent takes any key up to 32 bytes: every hash of at most 32 bytes.
        assert_eq!(essiv(Algorithm::Serpent), 10);
    }

    #[test]
    fn rejects_malformed_specs() {
        for s in [
            "",
            "aes",
            "aes-",
            "aes-xts",
            "aes-xts-plain65",
            "des-cbc-plain",
            "aes-ecb-plain64",
            "cipher_null-xts-plain64",
            "aes-xts-essiv:sha256",
            "aes-xts-eboiv",
            "aes-xts-lmk",
            "aes-lrw-lmk",
            "aes:64-cbc-lmk",
            "aes-cbc-essiv:sha512",
            "aes-cbc-essiv:md5",
            "aes-cbc-essiv:",
            "sm4-cbc-essiv:sha256",
            "blowfish-cbc-plain",
            "serpent-lrw-essiv:sha256",
            "aes-lrw",
            "aes-gcm-random",
            "aes-xts-plain64-extra",
        ] {
            assert!(CipherSpec::parse(s).is_err(), "{s:?} was accepted");
        }
    }

    #[test]
    fn key_sizes() {
        let xts = CipherSpec::DEFAULT;
        assert!(xts.check_key_len(64).is_ok());
        assert!(xts.check_key_len(32).is_ok());
        assert!(xts.check_key_len(16).is_err());
        assert!(xts.check_key_len(63).is_err());
        let cbc = CipherSpec::parse("aes-cbc-essiv:sha256").unwrap();
        assert!(cbc.check_key_len(32).is_ok());
        assert!(cbc.check_key_len(64).is_err());
        let sm4 = CipherSpec::parse("sm4-xts-plain64").unwrap();
        assert!(sm4.check_key_len(32).is_ok());
        assert!(sm4.check_key_len(64).is_err());
        assert_eq!(sm4.default_key_bits(), 256);
        let serpent = CipherSpec::parse("serpent-cbc-essiv:sha1").unwrap();
        assert_eq!(serpent.default_key_bits(), 256);
        assert!(serpent.check_key_len(20).is_err());
    }
}
