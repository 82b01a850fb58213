//! Getting the passphrase that opens a keyslot: from a token in the header (cryptsetup's
//! `--token-only`, `--token-id`, `--token-type`), else from `--key-file` or the terminal. Which
//! tokens there are and how each releases its passphrase is `sectorcrypt-token`'s business; this
//! module is the command-line side: options, the PIN prompt, `--verbose` reasons, exit codes.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use sectorcrypt_luks::{Error as LuksError, Header};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_token::{Choice, Outcome, Pins};

use crate::exit::{CliError, Code};
use crate::keyfile::{prompt_terminal, KeyArgs};

/// Which tokens unlock the volume.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct TokenArgs {
    /// Unlock only by a token in the header; never ask for a passphrase.
    #[arg(long = "token-only", conflicts_with = "key_file")]
    pub token_only: bool,
    /// Try only token N.
    #[arg(long = "token-id", value_name = "N", value_parser = clap::value_parser!(u32).range(0..32))]
    pub token_id: Option<u32>,
    /// Try only tokens of this type (systemd-tpm2, systemd-fido2, systemd-pkcs11, clevis).
    #[arg(long = "token-type", value_name = "TYPE")]
    pub token_type: Option<String>,
    /// Read a token's PIN from the first line of FILE ('-' = standard input) instead of asking
    /// on the terminal.
    #[arg(long = "token-pin-file", value_name = "FILE")]
    pub pin_file: Option<PathBuf>,
    /// The TPM for systemd-tpm2 tokens: a device (default /dev/tpmrm0, or $SYSTEMD_TPM2_DEVICE
    /// as systemd reads it) or swtpm:host=H,port=P / swtpm:path=SOCKET.
    #[arg(long = "tpm2-device", value_name = "PATH|TCTI")]
    pub tpm2_device: Option<String>,
    /// The FIDO2 security key for systemd-fido2 tokens: a /dev/hidrawN, or auto (default: every
    /// one plugged in).
    #[arg(long = "fido2-device", value_name = "PATH|auto")]
    pub fido2_device: Option<String>,
    /// The signature of a signed TPM2 PCR policy, as systemd-measure writes it (default
    /// /run/systemd/tpm2-pcr-signature.json, as systemd).
    #[arg(long = "tpm2-signature", value_name = "FILE")]
    pub tpm2_signature: Option<PathBuf>,
}

impl TokenArgs {
    /// The TPM to use: --tpm2-device (`auto`: as if not given), else $SYSTEMD_TPM2_DEVICE (a
    /// device name, not a secret); `None`: the default device.
    pub(crate) fn tpm2_device(&self) -> Option<String> {
        self.tpm2_device
            .clone()
            .filter(|d| d != "auto")
            .or_else(|| std::env::var("SYSTEMD_TPM2_DEVICE").ok())
    }

    /// Whether a token option was given.
    pub(crate) fn asked_for(&self) -> bool {
        self.token_only || self.token_id.is_some() || self.token_type.is_some()
    }
}

/// When tokens are tried without a token option: before the passphrase prompt (as `cryptsetup
/// open` does), or only when asked for (as `cryptsetup luksAddKey` does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tokens {
    /// Unless `--key-file` is given.
    ByDefault,
    /// Only with `--token-only`, `--token-id` or `--token-type`.
    WhenAsked,
}

/// Open a keyslot of `header` with `attempt` (given a passphrase and the keyslot to try, or
/// `None` for any): first with the tokens chosen, then, unless `--token-only`, with the
/// passphrase from `key`. Returns what `attempt` returned and the passphrase that worked.
pub(crate) fn unlock<T>(
    key: &KeyArgs,
    tokens: &TokenArgs,
    when: Tokens,
    header: &Header,
    device: &Path,
    key_slot: Option<usize>,
    attempt: impl FnMut(&[u8], Option<usize>) -> Result<T, LuksError>,
) -> Result<(T, SecretBytes), CliError> {
    let (value, pass, _) =
        unlock_noting_token(key, tokens, when, header, device, key_slot, attempt)?;
    Ok((value, pass))
}

/// [`unlock`], also saying which token released the passphrase (`None`: the passphrase was
/// typed or read from `--key-file`).
pub(crate) fn unlock_noting_token<T>(
    key: &KeyArgs,
    tokens: &TokenArgs,
    when: Tokens,
    header: &Header,
    device: &Path,
    key_slot: Option<usize>,
    mut attempt: impl FnMut(&[u8], Option<usize>) -> Result<T, LuksError>,
) -> Result<(T, SecretBytes, Option<u32>), CliError> {
    let try_tokens = tokens.asked_for() || (when == Tokens::ByDefault && key.key_file.is_none());
    let mut reasons = Vec::new();
    match header {
        Header::Luks2(h) if try_tokens => {
            if tokens.pin_file.as_deref() == Some(Path::new("-"))
                && key.key_file.as_deref() == Some(Path::new("-"))
            {
                return Err(CliError::usage(
                    "--key-file - and --token-pin-file - would both read standard input",
                ));
            }
            let mut pins = PinSource::new(tokens.pin_file.as_deref())?;
            let choice = Choice {
                id: tokens.token_id,
                kind: tokens.token_type.clone(),
                keyslot: key_slot,
                tpm2_device: tokens.tpm2_device(),
                fido2_device: tokens.fido2_device.clone(),
                tpm2_signature: tokens.tpm2_signature.clone(),
            };
            match sectorcrypt_token::unlock(h, &choice, &mut pins, |p, s| attempt(p, Some(s)))? {
                Outcome::Unlocked(u) => {
                    if crate::secrets::verbose() {
                        eprintln!(
                            "sectorcrypt: token {} unlocked keyslot {}",
                            u.token, u.keyslot
                        );
                    }
                    return Ok((u.value, u.passphrase, Some(u.token)));
                }
                Outcome::NotUnlocked(r) => reasons = r,
            }
        }
        Header::Luks1(_) if tokens.asked_for() => {
            return Err(CliError::usage(format!(
                "{} is a LUKS1 volume: tokens are a LUKS2 feature",
                device.display()
            )))
        }
        _ => {}
    }
    if crate::secrets::verbose() {
        for r in &reasons {
            eprintln!("sectorcrypt: {r}");
        }
    }
    if tokens.token_only {
        let why = if reasons.is_empty() {
            "it has no such token".to_string()
        } else {
            reasons
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        return Err(CliError {
            code: Code::Permission,
            message: format!("no token unlocked {}: {why}", device.display()),
        });
    }
    let pass = key.read(&format!("Enter passphrase for {}: ", device.display()))?;
    let value = attempt(&pass, key_slot)?;
    Ok((value, pass, None))
}

/// Where tokens get a PIN: `--token-pin-file`, else the terminal.
pub(crate) fn pin_source(tokens: &TokenArgs) -> Result<impl Pins, CliError> {
    PinSource::new(tokens.pin_file.as_deref())
}

/// A PIN from `--token-pin-file` (read once, up front, so that a bad file is an error of its
/// own) or the terminal.
struct PinSource {
    from_file: Option<SecretBytes>,
}

impl PinSource {
    fn new(file: Option<&Path>) -> Result<PinSource, CliError> {
        let Some(path) = file else {
            return Ok(PinSource { from_file: None });
        };
        let name = path.display().to_string();
        let read_err = |e: std::io::Error| CliError::io(format!("cannot read PIN file {name}"), e);
        let mut line = SecretBytes::with_capacity(256);
        let mut source: Box<dyn BufRead> = if name == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(path).map_err(read_err)?,
            ))
        };
        // A PIN is a line: up to the first newline, which is not part of it.
        loop {
            let buf = source.fill_buf().map_err(read_err)?;
            if buf.is_empty() {
                break;
            }
            let (take, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(n) => (n, true),
                None => (buf.len(), false),
            };
            if line.len() + take > 256 {
                return Err(CliError::usage(format!(
                    "PIN file {name}: the PIN is longer than 256 bytes"
                )));
            }
            line.extend_from_slice(&buf[..take]);
            source.consume(take + usize::from(done));
            if done {
                break;
            }
        }
        if line.is_empty() {
            return Err(CliError::usage(format!("PIN file {name} holds no PIN")));
        }
        Ok(PinSource {
            from_file: Some(line),
        })
    }
}

impl Pins for PinSource {
    fn pin(&mut self, prompt: &str) -> Option<SecretBytes> {
        if let Some(pin) = &self.from_file {
            return Some(pin.clone());
        }
        if !std::io::stdin().is_terminal() {
            return None;
        }
        prompt_terminal(prompt).ok()
    }

    fn notice(&mut self, message: &str) {
        eprintln!("{message}");
    }
}
