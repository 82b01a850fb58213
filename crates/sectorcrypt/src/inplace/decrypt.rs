//! `decrypt`: with a detached header in place; with a header on the device, exporting it to a new file and moving the data back to offset 0.

use std::path::{Path, PathBuf};

use sectorcrypt_luks::luks2::reencrypt::{InitOptions, Mode};
use sectorcrypt_luks::Header;
use sectorcrypt_storage::{FileStorage, Storage};
use sectorcrypt_volume::convert::{self, read_luks2, ExportPlan};
use sectorcrypt_volume::reencrypt::DEFAULT_HOTZONE;
use sectorcrypt_volume::resilience::{self};

use sectorcrypt_luks::luks2::Header as Luks2Header;

use super::{
    ask_server, device_len, directory_of, records_conversion, resume_hint, run_conversion,
    stop_on_signals, with_resume_hint, RunArgs, StopFlag,
};
use crate::exit::CliError;
use crate::keyslots::{confirm, open_rw};

#[derive(clap::Args, Debug)]
pub(crate) struct DecryptArgs {
    /// The encrypted device or image file to decrypt in place.
    #[arg(value_name = "DEVICE")]
    pub(super) device: PathBuf,
    /// The detached LUKS2 header of DEVICE; for a header on DEVICE, a new file to export it to
    /// (it holds the only copy of the keys until the decryption ends).
    #[arg(long, value_name = "FILE")]
    pub(super) header: Option<PathBuf>,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

pub(crate) fn decrypt(args: DecryptArgs) -> Result<(), CliError> {
    let Some(header_path) = args.header.clone() else {
        let on_device =
            FileStorage::open_read_only(&args.device).is_ok_and(|dev| Header::is_present(&dev));
        return Err(CliError::usage(if on_device {
            format!(
                "{} has its header on it, and the plaintext moves over it: add --header FILE, \
                 a new file to export the header to (it holds the keys until the end)",
                args.device.display()
            )
        } else {
            "decrypting in place needs the detached header (--header FILE)".to_string()
        }));
    };
    if let Some(server) = crate::online::server_of(&args.device) {
        let warning = (!args.run.resume_only && !records_conversion(&header_path)).then(|| {
            format!(
                "WARNING!\n========\nThis will decrypt {} in place while it is served; \
                 afterwards {} holds no keys.",
                args.device.display(),
                header_path.display()
            )
        });
        return ask_server(server, &args.device, &header_path, &args.run, warning);
    }
    let data = open_rw(&args.device)?;
    convert::check_size(&data.name(), device_len(&data)?)?;
    let stop = stop_on_signals()?;
    if !header_path.exists() {
        return decrypt_attached(&args, &header_path, &data, &stop);
    }
    let header = open_rw(&header_path)?;
    let h = read_luks2(&header)?;
    let name = header_path.display().to_string();
    let in_progress = convert::resuming(&h, &name, Mode::Decrypt, args.run.resume_only)?;
    let (pass, _) = args.run.passphrase(&args.device, Some((&header, &h)))?;
    if !in_progress {
        start_detached(&args, &header, &h, &header_path, &pass, &|| {
            confirm(
                args.run.batch,
                &format!(
                    "WARNING!\n========\nThis will decrypt {} in place; afterwards {} holds no \
                     keys.",
                    args.device.display(),
                    header_path.display()
                ),
            )
        })?;
    }
    let resume = resume_hint("decrypt", &args.device, Some(&header_path));
    run_conversion(&resume, &header_path, &data, &pass, &args.run, &stop)
}

/// Record a decryption in place in the detached header `header` (read as `h`, from the file
/// `header_path`), once the passphrase opens it and `confirm` agrees.
pub(super) fn start_detached(
    args: &DecryptArgs,
    header: &dyn Storage,
    h: &Luks2Header,
    header_path: &Path,
    pass: &[u8],
    confirm: &dyn Fn() -> Result<(), CliError>,
) -> Result<(), CliError> {
    let name = header_path.display().to_string();
    convert::check_detached_decryption(h, &name, &args.device.display().to_string())?;
    let unlocked = h.unlock(header, pass, None)?;
    confirm()?;
    let init = InitOptions {
        resilience: resilience::in_place(args.run.resilience)?,
        ..InitOptions::default()
    };
    convert::start_decryption(header, h, &unlocked.volume_key, &init)?;
    Ok(())
}

/// `decrypt --header NEWFILE` of a volume whose header is on the device: the header is exported
/// to NEWFILE and the data moved to offset 0 (`convert::start_exported_decryption`); the
/// passphrase is asked, checked and confirmed between planning and starting.
fn decrypt_attached(
    args: &DecryptArgs,
    header_path: &Path,
    dev: &dyn Storage,
    stop: &StopFlag,
) -> Result<(), CliError> {
    let init = InitOptions {
        resilience: resilience::exported_decryption(args.run.resilience)?,
        ..InitOptions::default()
    };
    let (dir, name) = directory_of(header_path)?;
    let plan = convert::plan_exported_decryption(dev, &dir, &name, args.run.resume_only)
        .map_err(|e| with_resume_hint(e, &args.device))?;
    // Resuming, the header is the exported one, still in its `.partial` file.
    let partial = match &plan {
        ExportPlan::Fresh(_) => None,
        ExportPlan::Resume => super::header_for_tokens(
            &args.run,
            &header_path.with_file_name(convert::partial_name(&name)),
        )?,
    };
    let header = match (&plan, &partial) {
        (ExportPlan::Fresh(h), _) => Some((dev, &**h)),
        (_, Some((d, h))) => Some((d as &dyn Storage, h)),
        _ => None,
    };
    let (pass, _) = args.run.passphrase(&args.device, header)?;
    if let ExportPlan::Fresh(h) = &plan {
        // A wrong passphrase is refused before anything is written.
        h.unlock(dev, &pass, None)?;
        confirm(
            args.run.batch,
            &format!(
                "WARNING!\n========\nThis will decrypt {} in place, moving the data to its \
                 start; its header is exported to {}, which holds the only copy of the keys \
                 until the decryption ends.",
                args.device.display(),
                header_path.display()
            ),
        )?;
    }
    let moved = args.run.hotzone_size.unwrap_or(DEFAULT_HOTZONE);
    convert::start_exported_decryption(dev, &dir, &name, &plan, &pass, moved, &init)?;
    let resume = resume_hint("decrypt", &args.device, Some(header_path));
    run_conversion(&resume, header_path, dev, &pass, &args.run, stop)
}
