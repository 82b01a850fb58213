//! Reading a passphrase or key as cryptsetup does (CLI.md, "Secrets"): `--key-file FILE` (`-` =
//! standard input) is taken byte for byte, no newline stripped, with `--keyfile-offset` and
//! `--keyfile-size`; without it, an interactive prompt without echo, refused when standard input
//! is not a terminal. Secrets never come from argv or the environment.

use std::fs::File;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use sectorcrypt_secret::SecretBytes;
use zeroize::Zeroizing;

use crate::exit::CliError;

/// cryptsetup's default limit on a key file (8 MiB).
const MAX_KEYFILE: u64 = 8 << 20;

/// Where the passphrase comes from.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct KeyArgs {
    /// Read the passphrase from FILE, all bytes as-is ('-' = standard input).
    #[arg(short = 'd', long = "key-file", value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Read at most this many bytes of the key file.
    #[arg(short = 'l', long = "keyfile-size", value_name = "BYTES")]
    pub keyfile_size: Option<u64>,
    /// Skip this many bytes at the start of the key file.
    #[arg(long = "keyfile-offset", value_name = "BYTES", default_value_t = 0)]
    pub keyfile_offset: u64,
}

impl KeyArgs {
    /// The passphrase, read once; `prompt` is shown when asking on the terminal.
    pub(crate) fn read(&self, prompt: &str) -> Result<SecretBytes, CliError> {
        let limit = self.keyfile_size.unwrap_or(MAX_KEYFILE);
        if limit > MAX_KEYFILE {
            return Err(CliError::usage(format!(
                "--keyfile-size {limit} exceeds the maximum of {MAX_KEYFILE} bytes"
            )));
        }
        let Some(path) = &self.key_file else {
            if self.keyfile_size.is_some() || self.keyfile_offset != 0 {
                return Err(CliError::usage(
                    "--keyfile-size and --keyfile-offset need --key-file",
                ));
            }
            return prompt_terminal(prompt);
        };
        let name = path.display().to_string();
        let read_err = |e: std::io::Error| CliError::io(format!("cannot read key file {name}"), e);
        // The offset is skipped by reading, not seeking, so pipes and FIFOs work as files do.
        let mut source: Box<dyn Read> = if name == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(File::open(path).map_err(read_err)?)
        };
        std::io::copy(
            &mut (&mut source).take(self.keyfile_offset),
            &mut std::io::sink(),
        )
        .map_err(read_err)?;
        let out = SecretBytes::read_from(source, limit as usize).map_err(read_err)?;
        if let Some(size) = self.keyfile_size {
            if (out.len() as u64) < size {
                return Err(CliError::usage(format!(
                    "key file {name} holds only {} bytes after offset {}, not the {size} asked for",
                    out.len(),
                    self.keyfile_offset
                )));
            }
        }
        if out.is_empty() {
            return Err(CliError::usage(format!("key file {name} is empty")));
        }
        Ok(out)
    }
}

/// Ask for a secret on the terminal, without echo; refused when standard input is not one.
pub(crate) fn prompt_terminal(prompt: &str) -> Result<SecretBytes, CliError> {
    if !std::io::stdin().is_terminal() {
        return Err(CliError::usage(
            "no --key-file given and standard input is not a terminal, so there is no way to ask for the passphrase",
        ));
    }
    // rpassword reads into an ordinary String: it is zeroized on drop and lives only until it
    // is copied into secret memory here.
    let pass = Zeroizing::new(
        rpassword::prompt_password(prompt)
            .map_err(|e| CliError::io("cannot read the passphrase", e))?,
    );
    if pass.is_empty() {
        return Err(CliError::usage("the passphrase is empty"));
    }
    Ok(SecretBytes::from_slice(pass.as_bytes()))
}

/// A volume key file (`--volume-key-file`): the key's bytes as they are, read straight into
/// secret memory.
pub(crate) fn read_volume_key_file(path: &Path) -> Result<SecretBytes, CliError> {
    let read_err = |e: std::io::Error| {
        CliError::io(format!("cannot read volume key file {}", path.display()), e)
    };
    SecretBytes::read_from(File::open(path).map_err(read_err)?, MAX_KEYFILE as usize)
        .map_err(read_err)
}
