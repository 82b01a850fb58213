//! The PBKDF and cipher options shared by the commands that create keyslots or volumes
//! (cryptsetup's names).

use std::path::PathBuf;

use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::PbkdfChoice;

use crate::exit::CliError;

/// `--hash NAME`, checked once here.
fn parse_hash(name: &str) -> Result<Hash, String> {
    sectorcrypt_luks::hash::parse(name).map_err(|e| e.to_string())
}

/// `--cipher`, `--key-size`, `--sector-size`: the data segment of a new volume (`format`,
/// `encrypt`).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct CipherArgs {
    /// Cipher specification (default aes-xts-plain64).
    #[arg(short = 'c', long, value_name = "SPEC")]
    pub cipher: Option<String>,
    /// Whole key size in bits (default 512 for XTS, 256 otherwise).
    #[arg(short = 's', long = "key-size", value_name = "BITS")]
    pub key_size: Option<usize>,
    /// Encryption sector size (LUKS2; default 4096 when the device allows, else 512).
    #[arg(long = "sector-size", value_name = "BYTES")]
    pub sector_size: Option<usize>,
}

/// `--pbkdf`, `--iter-time`, `--pbkdf-memory`, `--pbkdf-parallel`, `--pbkdf-force-iterations`,
/// `--hash`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct PbkdfArgs {
    /// PBKDF for new keyslots: argon2id (LUKS2 default), argon2i or pbkdf2 (LUKS1 always).
    #[arg(long, value_name = "NAME")]
    pub pbkdf: Option<PbkdfChoice>,
    /// Milliseconds the PBKDF should take when calibrated (cryptsetup's default 2000).
    #[arg(short = 'i', long = "iter-time", value_name = "MS")]
    pub iter_time: Option<u32>,
    /// Argon2 memory cost in KiB (default up to 1 GiB, at most half of the available memory).
    #[arg(long = "pbkdf-memory", value_name = "KIB")]
    pub memory: Option<u32>,
    /// Argon2 parallel threads (default min(4, CPUs)).
    #[arg(long = "pbkdf-parallel", value_name = "N")]
    pub parallel: Option<u32>,
    /// Skip calibration: PBKDF2 iterations or Argon2 time cost.
    #[arg(long = "pbkdf-force-iterations", value_name = "N")]
    pub force_iterations: Option<u32>,
    /// Hash for PBKDF2, the AF splitter and the digest (sha256 default; sha1, sha224, sha384,
    /// sha512, sha3-*, ripemd160, whirlpool, sm3, blake2b-*, blake2s-*, stribog*). cryptsetup's `-h`
    /// is not offered: it is `--help` here.
    #[arg(long, value_name = "NAME", value_parser = parse_hash)]
    pub hash: Option<Hash>,
}

impl PbkdfArgs {
    /// The calibration time, checked.
    pub(crate) fn iter_time_ms(&self) -> Result<u32, CliError> {
        match self.iter_time {
            Some(0) => Err(CliError::usage("--iter-time must be at least 1 ms")),
            Some(t) => Ok(t),
            None => Ok(2000),
        }
    }
}

/// A passphrase for a new keyslot: the positional key file, else `--new-keyfile`-style prompt
/// twice on a terminal.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct NewKeyArgs {
    /// Read the new passphrase from this file (all bytes as-is; '-' = standard input).
    #[arg(value_name = "NEW_KEY_FILE")]
    pub new_key_file: Option<PathBuf>,
}
