//! `flash format` and `flash convert`: a new encrypted flash, and a plain UBI flash encrypted in place (or back).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sectorcrypt_flash::crypt::Policy;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::Geometry;
use sectorcrypt_flashvol::NewFlash;
use sectorcrypt_luks::FormatOptions;
use sectorcrypt_storage::FileStorage;

use super::GeometryArgs;
use crate::chip::{require_chip, Chip};
use crate::exit::{CliError, Code};
use crate::keyfile::KeyArgs;
use crate::keyslots::{confirm, new_passphrase, pbkdf_options};
use crate::pbkdf_args::{CipherArgs, PbkdfArgs};

/// What making an encrypted flash asks, by `format` and by `convert`: the new header, the
/// passphrase, and whether to ask first.
#[derive(clap::Args, Debug)]
pub(crate) struct NewFlashArgs {
    #[command(flatten)]
    header: NewHeaderArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

#[derive(clap::Args, Debug)]
pub(crate) struct FormatArgs {
    /// The NAND image file (created if it does not exist) or /dev/mtdN.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    #[command(flatten)]
    geometry: GeometryArgs,
    #[command(flatten)]
    new: NewFlashArgs,
}

fn parse_policy(name: &str) -> Result<Policy, String> {
    Policy::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
        format!("unknown policy '{name}' ({})", names.join(", "))
    })
}

/// The header options `format` and `convert` share.
#[derive(clap::Args, Debug)]
pub(crate) struct NewHeaderArgs {
    #[command(flatten)]
    segment: CipherArgs,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// How erased space is stored: at-rest (erased while attached, hidden with encrypted
    /// filler when detached or idle: about plain UBI's erases), synced (hidden at every sync
    /// too), thesis (always hidden; every program rewrites its eraseblock) or visible (left
    /// erased: the chip shows its free space).
    #[arg(long, value_name = "POLICY", default_value = sectorcrypt_flashvol::DEFAULT_POLICY.name(), value_parser = parse_policy)]
    policy: Policy,
    /// LUKS2 label.
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// Use this UUID instead of a random one.
    #[arg(long, value_name = "UUID")]
    uuid: Option<String>,
}

impl NewHeaderArgs {
    /// The new header, checked.
    fn new_flash(&self) -> Result<NewFlash, CliError> {
        if self.segment.sector_size.is_some() {
            return Err(CliError::usage(
                "--sector-size: an encrypted flash encrypts sub-pages (set --sub-page-size when \
                 making the image)",
            ));
        }
        let luks = FormatOptions {
            version: 2,
            cipher: self.segment.cipher.clone(),
            key_bits: self.segment.key_size,
            pbkdf: pbkdf_options(&self.pbkdf)?,
            label: self.label.clone(),
            uuid: self.uuid.clone(),
            ..Default::default()
        };
        luks.check()?;
        Ok(NewFlash {
            luks,
            policy: self.policy,
            keyslots: None,
        })
    }
}

pub(super) fn format(args: FormatArgs) -> Result<(), CliError> {
    let new = args.new.header.new_flash()?;
    let created = !crate::chip::exists(&args.device);
    let chip = if created {
        create_image(&args.device, &args.geometry.geometry()?)?
    } else {
        if args.geometry.given() {
            return Err(CliError {
                code: Code::Busy,
                message: format!(
                    "{} exists: its geometry is its own (the geometry options make a new image)",
                    args.device.display()
                ),
            });
        }
        let chip = require_chip(&args.device, false)?;
        confirm(
            args.new.batch,
            &format!(
                "WARNING!\n========\nThis will erase everything on {} irrevocably.",
                args.device.display()
            ),
        )?;
        chip
    };
    let result = new_passphrase(
        None,
        &args.new.key,
        &format!("Enter passphrase for {}: ", args.device.display()),
    )
    .and_then(|pass| Ok(sectorcrypt_flashvol::format(chip.flash(), &new, &pass)?));
    if result.is_err() && created {
        // A half-made image is no one's data.
        let _ = std::fs::remove_file(&args.device);
    }
    result.map(drop)
}

/// A new, erased NAND image file of geometry `g` at `path`.
pub(super) fn create_image(path: &Path, g: &Geometry) -> Result<Chip, CliError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|f| f.set_len(SimNand::image_len(g)))
        .map_err(|e| CliError::io(format!("cannot create {}", path.display()), e));
    file?;
    let storage = FileStorage::open(path).map_err(|e| crate::exit::open_failed(path, e))?;
    let sim = SimNand::create(storage, *g, &[])
        .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
    Ok(Chip::Sim(Arc::new(sim)))
}

#[derive(clap::Args, Debug)]
pub(crate) struct ConvertArgs {
    /// The flash (a NAND image file or /dev/mtdN).
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Decrypt an encrypted flash back to plain UBI instead.
    #[arg(long)]
    decrypt: bool,
    #[command(flatten)]
    new: NewFlashArgs,
}

pub(super) fn convert(args: ConvertArgs) -> Result<(), CliError> {
    let chip = require_chip(&args.device, false)?;
    let new = args.new.header.new_flash()?;
    let encrypted = sectorcrypt_flashvol::read_header(chip.flash()).ok();
    let resuming = encrypted
        .as_ref()
        .and_then(|h| h.params.conversion)
        .is_some();
    let prompt = format!("Enter passphrase for {}: ", args.device.display());
    // A new encryption asks for a new passphrase (twice on a terminal); anything else opens
    // the header that is there.
    let pass = if args.decrypt || encrypted.is_some() {
        args.new.key.read(&prompt)?
    } else {
        new_passphrase(None, &args.new.key, &prompt)?
    };
    drop(encrypted);
    if !resuming {
        confirm(
            args.new.batch,
            &format!(
                "WARNING!\n========\nThis will {} {} in place; an interruption is finished by \
                 running the same command again.",
                if args.decrypt { "decrypt" } else { "encrypt" },
                args.device.display()
            ),
        )?;
    }
    let bar = crate::progress::terminal_bar("{wide_bar} {pos}/{len}");
    let mut progress = |done: u32, all: u32| {
        if let Some(bar) = &bar {
            bar.set_length(u64::from(all));
            bar.set_position(u64::from(done));
        }
    };
    let result = if args.decrypt {
        sectorcrypt_flashvol::convert::decrypt(chip.flash(), &pass, &mut progress)
    } else {
        sectorcrypt_flashvol::convert::encrypt(chip.flash(), &new, &pass, &mut progress).map(drop)
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(result?)
}
