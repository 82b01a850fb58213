//! `enroll` (systemd-cryptenroll): a new keyslot with a random passphrase, and the token that
//! releases it, written in one header update; then, with `--wipe-slot`, the keyslots to retire.

use std::path::PathBuf;

use sectorcrypt_luks::Header;
use sectorcrypt_storage::Storage;
use sectorcrypt_token::{pkcs11, token_keyslot_pbkdf};
use serde_json::Value;

use crate::chip::open_header;
use crate::exit::{CliError, Code};
use crate::keyfile::KeyArgs;
use crate::unlock::{pin_source, unlock, TokenArgs, Tokens};

#[derive(clap::Args, Debug)]
pub(crate) struct EnrollArgs {
    /// The LUKS2 device or image file, an RBD image or an encrypted flash.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The detached header of DEVICE.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// An existing passphrase (or, with --token-*, a token) unlocks the volume first.
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    tokens: TokenArgs,
    /// Enroll the RSA certificate of a PKCS#11 security token (smart card, HSM) that this URI
    /// names, or 'auto' for the one certificate on the tokens present.
    #[arg(long = "pkcs11-token-uri", value_name = "URI", required = true)]
    pkcs11_token_uri: String,
    /// Then remove these keyslots, comma-separated: numbers, 'all' (every other one), 'empty'
    /// (those with an empty passphrase), 'password' (those no token holds), 'recovery',
    /// 'pkcs11', 'fido2', 'tpm2' (those such tokens hold). The new keyslot is never removed.
    #[arg(long = "wipe-slot", value_name = "SLOTS", value_delimiter = ',')]
    wipe_slot: Vec<String>,
    /// Put the new keyslot in slot N.
    #[arg(short = 'S', long = "key-slot", value_name = "N")]
    key_slot: Option<usize>,
    /// Print the new keyslot and token (and the keyslots removed) as JSON on standard output.
    #[arg(long)]
    json: bool,
}

pub(crate) fn enroll(args: EnrollArgs) -> Result<(), CliError> {
    let path = args.header.as_deref().unwrap_or(&args.device);
    let dev = open_header(path, false)?;
    let header = Header::read(&*dev)?;
    let Header::Luks2(luks2) = &header else {
        return Err(CliError::usage(format!(
            "{} is a LUKS1 volume: tokens are a LUKS2 feature (convert it with 'sectorcrypt \
             convert --type luks2')",
            args.device.display()
        )));
    };
    let mut h = luks2.clone();
    let wipe = WipeSpec::parse(&args.wipe_slot, &h)?;
    let (unlocked, _) = unlock(
        &args.key,
        &args.tokens,
        Tokens::WhenAsked,
        &header,
        &args.device,
        None,
        |pass, slot| header.unlock(&*dev, pass, slot),
    )?;
    let mut pins = pin_source(&args.tokens)?;
    let enrolment = pkcs11::enroll(&args.pkcs11_token_uri, &mut pins).map_err(|e| CliError {
        code: match e {
            sectorcrypt_token::Error::WrongPin(_) => Code::Permission,
            _ => Code::Usage,
        },
        message: format!("cannot enroll the PKCS#11 token: {e}"),
    })?;
    let (slot, token) = h.add_keyslot_with_token(
        &*dev,
        &unlocked.volume_key,
        &enrolment.passphrase,
        args.key_slot,
        &token_keyslot_pbkdf(),
        enrolment.token,
    )?;
    drop((unlocked, enrolment.passphrase));
    eprintln!("New PKCS#11 token enrolled as key slot {slot}.");
    let doomed = wipe.slots(&h, &*dev, slot);
    let removed_tokens = if doomed.is_empty() {
        Vec::new()
    } else {
        let tokens = h.kill_keyslots_and_tokens(&*dev, &doomed)?;
        eprintln!(
            "Wiped slot{} {}.",
            if doomed.len() == 1 { "" } else { "s" },
            doomed
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        tokens
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "keyslot": slot,
                "token": token,
                "type": pkcs11::TYPE,
                "wiped_keyslots": doomed,
                "removed_tokens": removed_tokens,
            })
        );
    }
    Ok(())
}

/// What `--wipe-slot` names, as systemd-cryptenroll reads it.
#[derive(Default)]
struct WipeSpec {
    numbers: Vec<usize>,
    all: bool,
    empty: bool,
    password: bool,
    token_types: Vec<&'static str>,
}

impl WipeSpec {
    /// Parse and check the list before anything is written: a number must name a keyslot in use.
    fn parse(words: &[String], h: &sectorcrypt_luks::luks2::Header) -> Result<WipeSpec, CliError> {
        let mut spec = WipeSpec::default();
        for word in words.iter().map(|w| w.trim()).filter(|w| !w.is_empty()) {
            match word {
                "all" => spec.all = true,
                "empty" => spec.empty = true,
                "password" => spec.password = true,
                "recovery" => spec.token_types.push("systemd-recovery"),
                "pkcs11" => spec.token_types.push("systemd-pkcs11"),
                "fido2" => spec.token_types.push("systemd-fido2"),
                "tpm2" => spec.token_types.push("systemd-tpm2"),
                n => {
                    let slot: usize = n.parse().map_err(|_| {
                        CliError::usage(format!(
                            "--wipe-slot {n}: not a keyslot number nor one of all, empty, \
                             password, recovery, pkcs11, fido2, tpm2"
                        ))
                    })?;
                    let in_use = u32::try_from(slot)
                        .ok()
                        .and_then(|s| h.metadata().keyslots.get(s))
                        .is_some();
                    if !in_use {
                        return Err(CliError::usage(format!(
                            "--wipe-slot {slot}: keyslot {slot} is not in use"
                        )));
                    }
                    spec.numbers.push(slot);
                }
            }
        }
        Ok(spec)
    }

    /// The keyslots to remove from `h` (as it is after enrolment), never `new`.
    fn slots(
        &self,
        h: &sectorcrypt_luks::luks2::Header,
        dev: &dyn Storage,
        new: usize,
    ) -> Vec<usize> {
        let md = h.metadata();
        let held_by = |slot: usize, kind: Option<&str>| {
            md.tokens.iter().any(|(_, t)| {
                kind.is_none_or(|k| t.get("type").and_then(Value::as_str) == Some(k))
                    && t.get("keyslots")
                        .and_then(Value::as_array)
                        .is_some_and(|l| l.iter().any(|s| s.as_str() == Some(&slot.to_string())))
            })
        };
        let mut out: Vec<usize> = md
            .keyslots
            .iter()
            .map(|(n, _)| n as usize)
            .filter(|&n| n != new)
            .filter(|&n| {
                self.all
                    || self.numbers.contains(&n)
                    || (self.password && !held_by(n, None))
                    || self.token_types.iter().any(|k| held_by(n, Some(k)))
                    || (self.empty && h.unlock(dev, b"", Some(n)).is_ok())
            })
            .collect();
        out.sort_unstable();
        out
    }
}
