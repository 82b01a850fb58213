//! Header maintenance without a passphrase, as cryptsetup has it: `config` (label, subsystem,
//! keyslot priority), `erase` (luksErase: every keyslot removed), `repair` (a damaged or stale
//! LUKS2 header copy rewritten, explicitly), `token import|export|remove` (LUKS2 JSON tokens) and
//! `convert --type luks1|luks2`. Each checks its input and the header before its first write;
//! the updates are the LUKS layer's, written in its crash-safe order.

use std::io::{Read, Write};
use std::path::PathBuf;

use sectorcrypt_luks::convert::{self, Format};
use sectorcrypt_luks::luks2::metadata::Priority;
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_luks::{Error as LuksError, Header};
use sectorcrypt_storage::Storage;

use crate::chip::open_header;
use crate::exit::{CliError, Code};
use crate::keyslots::confirm;
use crate::progress::terminal_bar;

/// The device (or its detached header), opened writable or not, with its header.
#[derive(clap::Args, Debug)]
pub(crate) struct Target {
    /// The LUKS device or image file.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The detached header of DEVICE.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
}

impl Target {
    fn open(&self, writable: bool) -> Result<(Box<dyn Storage>, Header), CliError> {
        let dev = open_header(self.header.as_deref().unwrap_or(&self.device), !writable)?;
        let header = Header::read(&*dev)?;
        Ok((dev, header))
    }

    /// The LUKS2 header, or cryptsetup's refusal for LUKS1.
    fn luks2<'a>(
        &self,
        header: &'a mut Header,
        what: &str,
    ) -> Result<&'a mut Luks2Header, CliError> {
        match header {
            Header::Luks2(h) => Ok(h),
            Header::Luks1(_) => Err(CliError::usage(format!(
                "{what} is a LUKS2 feature; {} is LUKS1",
                self.device.display()
            ))),
        }
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct ConfigArgs {
    #[command(flatten)]
    target: Target,
    /// Set the label (an empty one clears it).
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// Set the subsystem (an empty one clears it).
    #[arg(long, value_name = "TEXT")]
    subsystem: Option<String>,
    /// Set the priority of --key-slot N: prefer (tried first), normal, ignore (tried only when
    /// named).
    #[arg(long, value_name = "PRIORITY", value_parser = parse_priority, requires = "key_slot")]
    priority: Option<Priority>,
    /// The keyslot whose priority to set.
    #[arg(short = 'S', long = "key-slot", value_name = "N")]
    key_slot: Option<usize>,
}

fn parse_priority(s: &str) -> Result<Priority, String> {
    match s {
        "prefer" => Ok(Priority::Prefer),
        "normal" => Ok(Priority::Normal),
        "ignore" => Ok(Priority::Ignore),
        other => Err(format!(
            "unknown priority '{other}' (use prefer, normal or ignore)"
        )),
    }
}

/// `config` (cryptsetup config): label, subsystem and keyslot priority of a LUKS2 header.
pub(crate) fn config(args: ConfigArgs) -> Result<(), CliError> {
    if args.label.is_none() && args.subsystem.is_none() && args.priority.is_none() {
        return Err(CliError::usage(
            "nothing to change: give --label, --subsystem or --priority with --key-slot",
        ));
    }
    let (dev, mut header) = args.target.open(true)?;
    let h = args.target.luks2(&mut header, "config")?;
    if args.label.is_some() || args.subsystem.is_some() {
        h.set_label(&*dev, args.label.as_deref(), args.subsystem.as_deref())?;
    }
    if let (Some(p), Some(slot)) = (args.priority, args.key_slot) {
        h.set_priority(&*dev, slot, p)?;
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct EraseArgs {
    #[command(flatten)]
    target: Target,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

/// `erase` (cryptsetup luksErase): every keyslot removed and its area wiped.
pub(crate) fn erase(args: EraseArgs) -> Result<(), CliError> {
    let (dev, mut header) = args.target.open(true)?;
    confirm(
        args.batch,
        &format!(
            "WARNING!\n========\nThis operation will erase all keyslots on {}.\nDevice will \
             become unusable after this operation.",
            args.target.device.display()
        ),
    )?;
    header.erase(&*dev)?;
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct RepairArgs {
    #[command(flatten)]
    target: Target,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

/// `repair` (cryptsetup repair): a damaged or out-of-date LUKS2 header copy rewritten from the
/// good one, also over a foreign signature (after a warning: the user asked for it, and the
/// foreign structure is overwritten). LUKS1 headers that read need nothing.
pub(crate) fn repair(args: RepairArgs) -> Result<(), CliError> {
    let path = args.target.header.as_deref().unwrap_or(&args.target.device);
    let dev = open_header(path, false)?;
    let mut h = match Luks2Header::read_for_repair(&*dev) {
        Ok(h) => h,
        Err(LuksError::NotLuks { .. }) => {
            return Header::read(&*dev).map(|_| ()).map_err(CliError::from);
        }
        Err(e) => return Err(e.into()),
    };
    if !h.health().needs_repair() {
        return Ok(());
    }
    if let Some(sig) = sectorcrypt_luks::signatures::probe(&*dev)? {
        eprintln!(
            "WARNING: Device {} already contains a '{}' superblock signature.",
            path.display(),
            sig.kind
        );
        confirm(
            args.batch,
            &format!(
                "Repairing the LUKS2 header overwrites the {} signature at byte {}.",
                sig.kind, sig.offset
            ),
        )?;
    }
    h.repair(&*dev)?;
    Ok(())
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum TokenCommand {
    /// Store a token from --json-file (or standard input), as token --token-id or the first
    /// free number.
    Import(TokenImportArgs),
    /// Print token --token-id as compact JSON (or write it to --json-file).
    Export(TokenIdArgs),
    /// Remove token --token-id.
    Remove(TokenIdArgs),
}

#[derive(clap::Args, Debug)]
pub(crate) struct TokenImportArgs {
    #[command(flatten)]
    target: Target,
    /// Read the token's JSON from FILE ('-' or none: standard input).
    #[arg(long = "json-file", value_name = "FILE")]
    json_file: Option<PathBuf>,
    /// The token number (0 to 31).
    #[arg(long = "token-id", value_name = "N")]
    token_id: Option<u32>,
    /// Replace token --token-id if it exists.
    #[arg(long = "token-replace", requires = "token_id")]
    replace: bool,
}

#[derive(clap::Args, Debug)]
pub(crate) struct TokenIdArgs {
    #[command(flatten)]
    target: Target,
    /// The token number.
    #[arg(long = "token-id", value_name = "N")]
    token_id: u32,
    /// With export: write the JSON to FILE instead of standard output.
    #[arg(long = "json-file", value_name = "FILE")]
    json_file: Option<PathBuf>,
}

/// `token import|export|remove` (cryptsetup token).
pub(crate) fn token(command: TokenCommand) -> Result<(), CliError> {
    match command {
        TokenCommand::Import(args) => {
            let mut text = Vec::new();
            match args.json_file.as_deref() {
                Some(path) if path.as_os_str() != "-" => {
                    text = std::fs::read(path)
                        .map_err(|e| CliError::io(format!("cannot read {}", path.display()), e))?
                }
                _ => {
                    std::io::stdin().read_to_end(&mut text).map_err(|e| {
                        CliError::io("cannot read the token from standard input", e)
                    })?;
                }
            }
            let value: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| CliError::usage(format!("the token is not JSON: {e}")))?;
            // As cryptsetup's plugins validate the types they know before the token is stored.
            sectorcrypt_token::validate(&value)
                .map_err(|e| CliError::usage(format!("the token is not valid: {e}")))?;
            let (dev, mut header) = args.target.open(true)?;
            let h = args.target.luks2(&mut header, "token")?;
            h.put_token(&*dev, args.token_id, value, args.replace)?;
            Ok(())
        }
        TokenCommand::Export(args) => {
            let (_, mut header) = args.target.open(false)?;
            let h = args.target.luks2(&mut header, "token")?;
            let Some(token) = h.token(args.token_id) else {
                return Err(CliError::usage(format!(
                    "Failed to get token {} for export (it is not in use).",
                    args.token_id
                )));
            };
            // As cryptsetup: the compact JSON, no newline.
            let text = serde_json::to_string(token).expect("JSON values serialise");
            match &args.json_file {
                Some(path) => std::fs::write(path, &text)
                    .map_err(|e| CliError::io(format!("cannot write {}", path.display()), e)),
                None => std::io::stdout()
                    .lock()
                    .write_all(text.as_bytes())
                    .map_err(|e| CliError::io("cannot write the output", e)),
            }
        }
        TokenCommand::Remove(args) => {
            let (dev, mut header) = args.target.open(true)?;
            let h = args.target.luks2(&mut header, "token")?;
            if h.token(args.token_id).is_none() {
                return Err(CliError {
                    code: Code::Usage,
                    message: format!("Token {} is not in use.", args.token_id),
                });
            }
            h.remove_token(&*dev, args.token_id)?;
            Ok(())
        }
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct ConvertArgs {
    #[command(flatten)]
    target: Target,
    /// The format to convert to.
    #[arg(long = "type", value_name = "luks1|luks2", value_parser = parse_format)]
    to: Format,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

fn parse_format(s: &str) -> Result<Format, String> {
    match s {
        "luks1" => Ok(Format::Luks1),
        "luks2" => Ok(Format::Luks2),
        _ => Err("Invalid LUKS type, only luks1 and luks2 are supported.".into()),
    }
}

/// `convert --type luks1|luks2` (cryptsetup convert): the header rewritten in the other format in
/// place, keyslots and volume key kept; an interrupted conversion is finished.
pub(crate) fn convert(args: ConvertArgs) -> Result<(), CliError> {
    let path = args.target.header.as_deref().unwrap_or(&args.target.device);
    let dev = open_header(path, false)?;
    let resuming = convert::interrupted(&*dev)?.is_some();
    if !resuming {
        // Refusals (already that type, not LUKS) come before the question.
        match (Header::read(&*dev)?, args.to) {
            (Header::Luks1(_), Format::Luks1) | (Header::Luks2(_), Format::Luks2) => {
                return Err(CliError::usage(format!(
                    "Device is already {} type.",
                    args.to.name()
                )))
            }
            _ => {}
        }
        confirm(
            args.batch,
            &format!(
                "WARNING!\n========\nThis operation will convert {} to {} format.\n",
                path.display(),
                args.to.name()
            ),
        )?;
    }
    let bar = terminal_bar("moving keyslots [{bar:30}] {bytes}/{total_bytes}");
    convert::convert(&*dev, args.to, &mut |done, total| {
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(())
}
