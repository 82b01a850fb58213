//! `enroll` (systemd-cryptenroll, `clevis luks bind`): a new keyslot with a random passphrase,
//! and the token that releases it, written in one header update; then, with `--wipe-slot`, the
//! keyslots to retire.

use std::path::PathBuf;

use sectorcrypt_luks::Header;
use sectorcrypt_storage::Storage;
use sectorcrypt_token::clevis::{self, Trust};
use sectorcrypt_token::{pkcs11, Enrolment};
use serde_json::Value;

use crate::chip::open_header;
use crate::exit::{CliError, Code};
use crate::keyfile::KeyArgs;
use crate::unlock::{pin_source, unlock, TokenArgs, Tokens};

#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["pkcs11_token_uri", "clevis", "tpm2_device", "fido2_device"]))]
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
    #[arg(long = "pkcs11-token-uri", value_name = "URI")]
    pkcs11_token_uri: Option<String>,
    /// Bind to a clevis pin, as `clevis luks bind PIN`: `--clevis tang URL` (a tang server; its
    /// signing keys are trusted by --tang-thumbprint, -q, or an answer on the terminal).
    #[arg(long, num_args = 2, value_names = ["PIN", "URL"])]
    clevis: Vec<String>,
    /// With --tpm2-device: the PCRs to seal to, '+' or ',' separated ("" for none; default 7, as
    /// systemd-cryptenroll).
    #[arg(long = "tpm2-pcrs", value_name = "PCRS", default_value = "7")]
    tpm2_pcrs: String,
    /// With --tpm2-device: also require a PIN (asked twice, or the first line of
    /// --token-pin-file).
    #[arg(long = "tpm2-with-pin", value_name = "BOOL", num_args = 0..=1, default_missing_value = "yes",
          value_parser = clap::builder::BoolishValueParser::new())]
    tpm2_with_pin: Option<bool>,
    /// With --fido2-device: require the key's PIN (default yes, as systemd-cryptenroll).
    #[arg(long = "fido2-with-client-pin", value_name = "BOOL", default_value = "yes",
          value_parser = clap::builder::BoolishValueParser::new())]
    fido2_with_client_pin: bool,
    /// With --fido2-device: require a touch (default yes).
    #[arg(long = "fido2-with-user-presence", value_name = "BOOL", default_value = "yes",
          value_parser = clap::builder::BoolishValueParser::new())]
    fido2_with_user_presence: bool,
    /// With --fido2-device: require the key's own user verification (fingerprint; default no).
    #[arg(long = "fido2-with-user-verification", value_name = "BOOL", default_value = "no",
          value_parser = clap::builder::BoolishValueParser::new())]
    fido2_with_user_verification: bool,
    /// Trust the tang server only if one of its signing keys has this thumbprint (as `clevis
    /// encrypt tang '{"thp": ...}'`).
    // A base64url thumbprint may begin with '-'.
    #[arg(
        long = "tang-thumbprint",
        value_name = "THP",
        allow_hyphen_values = true
    )]
    tang_thumbprint: Option<String>,
    /// Trust the tang server's signing keys without asking (clevis' -y).
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
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
    let (enrolment, what) = make_enrolment(&args)?;
    let kind = enrolment.token["type"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (slot, token) = h.add_keyslot_with_token(
        &*dev,
        &unlocked.volume_key,
        &enrolment.passphrase,
        args.key_slot,
        &enrolment.pbkdf,
        enrolment.token,
    )?;
    drop((unlocked, enrolment.passphrase));
    eprintln!("New {what} enrolled as key slot {slot}.");
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
                "type": kind,
                "wiped_keyslots": doomed,
                "removed_tokens": removed_tokens,
            })
        );
    }
    Ok(())
}

/// The new passphrase and its token, from the token device or server asked for; and what it
/// is, for the message.
fn make_enrolment(args: &EnrollArgs) -> Result<(Enrolment, &'static str), CliError> {
    let failed = |what: &'static str| {
        move |e: sectorcrypt_token::Error| CliError {
            code: match e {
                sectorcrypt_token::Error::WrongPin(_) => Code::Permission,
                _ => Code::Usage,
            },
            message: format!("cannot enroll {what}: {e}"),
        }
    };
    if args.tokens.tpm2_device.is_some() {
        let device = args
            .tokens
            .tpm2_device()
            .unwrap_or_else(|| sectorcrypt_token::tpm2::DEFAULT_DEVICE.to_string());
        let pcrs = parse_pcrs(&args.tpm2_pcrs)?;
        let pin = match args.tpm2_with_pin {
            Some(true) => Some(new_pin(&args.tokens)?),
            _ => None,
        };
        let e = sectorcrypt_token::tpm2::enroll(&device, &pcrs, pin.as_deref())
            .map_err(failed("the TPM2 chip"))?;
        return Ok((e, "TPM2 token"));
    }
    if let Some(device) = &args.tokens.fido2_device {
        let mut pins = pin_source(&args.tokens)?;
        let e = sectorcrypt_token::fido2::enroll(
            device,
            args.fido2_with_client_pin,
            args.fido2_with_user_presence,
            args.fido2_with_user_verification,
            &mut pins,
        )
        .map_err(failed("the FIDO2 key"))?;
        return Ok((e, "FIDO2 token"));
    }
    if let Some(uri) = &args.pkcs11_token_uri {
        let mut pins = pin_source(&args.tokens)?;
        let e = pkcs11::enroll(uri, &mut pins).map_err(failed("the PKCS#11 token"))?;
        return Ok((e, "PKCS#11 token"));
    }
    let (pin, url) = (&args.clevis[0], &args.clevis[1]);
    if pin != "tang" {
        return Err(CliError::usage(format!(
            "--clevis {pin}: sectorcrypt binds the tang pin (--clevis tang URL)"
        )));
    }
    let mut ask = |thumbprints: &[String]| ask_trust(url, thumbprints);
    let trust = match (&args.tang_thumbprint, args.batch) {
        (Some(t), _) => Trust::Thumbprint(t),
        (None, true) => Trust::Any,
        (None, false) => Trust::Ask(&mut ask),
    };
    let e = clevis::enroll_tang(url, trust).map_err(|e| {
        let mut err = failed("the tang server")(e);
        if err.message.contains("not trusted") {
            err.message += "; trust them with --tang-thumbprint THP or -q";
        }
        err
    })?;
    Ok((e, "clevis (tang) token"))
}

/// `7+11`, `7,11` or `` (none), as systemd-cryptenroll's `--tpm2-pcrs`.
fn parse_pcrs(text: &str) -> Result<Vec<u32>, CliError> {
    text.split(['+', ','])
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .ok()
                .filter(|&p| p < 24)
                .ok_or_else(|| {
                    CliError::usage(format!("--tpm2-pcrs {text}: {s:?} is not a PCR (0 to 23)"))
                })
        })
        .collect()
}

/// A new TPM2 PIN: the first line of --token-pin-file, or asked twice on the terminal.
fn new_pin(tokens: &TokenArgs) -> Result<sectorcrypt_secret::SecretBytes, CliError> {
    let mut pins = pin_source(tokens)?;
    let ask = |pins: &mut dyn sectorcrypt_token::Pins, prompt: &str| {
        pins.pin(prompt).ok_or_else(|| {
            CliError::usage("a TPM2 PIN is needed: give --token-pin-file FILE or run on a terminal")
        })
    };
    let first = ask(&mut pins, "Please enter TPM2 PIN: ")?;
    if tokens.pin_file.is_none() {
        let again = ask(&mut pins, "Please enter TPM2 PIN (repeat): ")?;
        if first[..] != again[..] {
            return Err(CliError::usage("the PINs do not match"));
        }
    }
    Ok(first)
}

/// Ask on the terminal whether to trust a tang server's signing keys, as clevis asks; without a
/// terminal, no (the error then names the thumbprints and the options that trust them).
fn ask_trust(url: &str, thumbprints: &[String]) -> bool {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return false;
    }
    eprintln!(
        "The advertisement of {url} contains the following signing keys:
"
    );
    for t in thumbprints {
        eprintln!("{t}");
    }
    eprint!("\nDo you wish to trust these keys? [yn] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).is_ok() && answer.trim().eq_ignore_ascii_case("y")
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
