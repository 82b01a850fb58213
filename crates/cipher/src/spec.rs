//! dm-crypt cipher specifications: `CIPHER-MODE-IV`, e.g. `aes-xts-plain64`, `aes-cbc-essiv:sha256`,
//! `lea-xts-plain64`, `cipher_null-ecb`. The same strings LUKS stores in its headers.

use std::fmt;
use std::str::FromStr;

use crate::backend::Algorithm;
use crate::error::Error;

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
    /// `essiv:sha256`: the plain64 IV encrypted with the cipher keyed by SHA-256(volume key).
    EssivSha256,
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
            "aes" => CipherName::Block(Algorithm::Aes),
            "lea" => CipherName::Block(Algorithm::Lea),
            "cipher_null" => CipherName::Null,
            "" => return Err(bad("it is empty")),
            _ => return Err(bad("unknown cipher (use aes, lea or cipher_null)")),
        };
        let mode = match parts.next() {
            Some("xts") => Mode::Xts,
            Some("cbc") => Mode::Cbc,
            Some("ecb") => Mode::Ecb,
            Some(_) => return Err(bad("unknown mode (use xts, cbc or ecb)")),
            None => return Err(bad("the mode is missing (e.g. aes-xts-plain64)")),
        };
        let iv = match parts.next() {
            Some("plain") => IvMode::Plain,
            Some("plain64") => IvMode::Plain64,
            Some("plain64be") => IvMode::Plain64Be,
            Some("essiv:sha256") => IvMode::EssivSha256,
            Some(_) => {
                return Err(bad(
                    "unknown IV generator (use plain, plain64, plain64be or essiv:sha256)",
                ))
            }
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
                return Err(bad("XTS and CBC need an IV generator (e.g. -plain64)"))
            }
            (_, Mode::Xts, IvMode::EssivSha256) => {
                return Err(bad("ESSIV is for CBC; XTS uses plain64"));
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
            (_, Mode::Xts) => &[256, 384, 512],
            _ => &[128, 192, 256],
        }
    }

    /// cryptsetup's default key size for the spec (512 bits for XTS, 256 otherwise).
    pub fn default_key_bits(&self) -> usize {
        match (self.cipher, self.mode) {
            (CipherName::Null, _) => 0,
            (_, Mode::Xts) => 512,
            _ => 256,
        }
    }

    /// Check that a key of `bytes` bytes fits.
    pub fn check_key_len(&self, bytes: usize) -> Result<(), Error> {
        if self.cipher == CipherName::Null || self.key_bits_allowed().contains(&(bytes * 8)) {
            return Ok(());
        }
        let allowed = match self.mode {
            Mode::Xts => "256, 384 or 512 bits (two equal halves)",
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
        };
        write!(f, "{cipher}-{mode}")?;
        let iv = match self.iv {
            IvMode::Plain => "plain",
            IvMode::Plain64 => "plain64",
            IvMode::Plain64Be => "plain64be",
            IvMode::EssivSha256 => "essiv:sha256",
            IvMode::None => return Ok(()),
        };
        write!(f, "-{iv}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of the three parts, rather than a list of names: whatever `parse`
    /// accepts prints back to the same spec, and it accepts exactly the 17 dm-crypt ones.
    #[test]
    fn round_trips_every_supported_spec() {
        let ciphers = [
            CipherName::Block(Algorithm::Aes),
            CipherName::Block(Algorithm::Lea),
            CipherName::Null,
        ];
        let ivs = [
            IvMode::Plain,
            IvMode::Plain64,
            IvMode::Plain64Be,
            IvMode::EssivSha256,
            IvMode::None,
        ];
        let mut supported = 0;
        for cipher in ciphers {
            for mode in [Mode::Xts, Mode::Cbc, Mode::Ecb] {
                for iv in ivs {
                    let spec = CipherSpec { cipher, mode, iv };
                    if let Ok(parsed) = CipherSpec::parse(&spec.to_string()) {
                        assert_eq!(parsed, spec, "{spec}");
                        supported += 1;
                    }
                }
            }
        }
        // Per block cipher: XTS with plain, plain64 and plain64be; CBC with those and ESSIV;
        // ECB. Plus cipher_null-ecb.
        assert_eq!(supported, 2 * (3 + 4 + 1) + 1);
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
    }
}
