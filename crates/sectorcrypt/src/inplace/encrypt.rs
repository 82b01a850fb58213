//! `encrypt`: a plaintext device encrypted in place, its header to a file (`--header`) or onto the device with the data shifted (`--reduce-device-size`).

use std::path::{Path, PathBuf};

use sectorcrypt_luks::luks2::reencrypt::Mode;
use sectorcrypt_luks::FormatOptions;
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{FileStorage, Storage};
use sectorcrypt_volume::convert::{self, read_luks2, Placement, ShiftedPlan};
use sectorcrypt_volume::resilience::{self};

use sectorcrypt_storage::units::parse_size;

use super::{
    check_in_progress, device_len, directory_of, init_options, resume_hint, run_conversion,
    stop_on_signals, RunArgs,
};
use crate::exit::CliError;
use crate::keyslots::{confirm, new_passphrase, open_rw, pbkdf_options};
use crate::pbkdf_args::{CipherArgs, PbkdfArgs};

#[derive(clap::Args, Debug)]
pub(crate) struct EncryptArgs {
    /// The plaintext device or image file to encrypt in place.
    #[arg(value_name = "DEVICE")]
    pub(super) device: PathBuf,
    /// Put the LUKS2 header in this file (detached header); the data stays where it is.
    #[arg(long, value_name = "FILE")]
    pub(super) header: Option<PathBuf>,
    /// Put the header at the start of DEVICE, moving the data half of BYTES further on; the
    /// last BYTES of DEVICE must be unused (shrink the file system first). Units: K, M, G (KiB...).
    #[arg(long = "reduce-device-size", value_name = "BYTES", value_parser = parse_size)]
    pub(super) reduce_device_size: Option<u64>,
    #[command(flatten)]
    pub(super) segment: CipherArgs,
    #[command(flatten)]
    pub(super) pbkdf: PbkdfArgs,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

pub(crate) fn encrypt(args: EncryptArgs) -> Result<(), CliError> {
    // What a server serves is encrypted already: only an encryption recorded on it (--init-only,
    // or interrupted) goes on there; a new one meets the server's lock.
    if let Some(server) = crate::online::server_of(&args.device).filter(|_| args.run.resume_only) {
        let header_path = args.header.clone().unwrap_or_else(|| args.device.clone());
        return super::ask_server(server, &args.device, &header_path, &args.run, None);
    }
    match (&args.header, args.reduce_device_size) {
        (Some(_), Some(_)) => Err(CliError::usage(
            "--header and --reduce-device-size do not go together: with a detached header \
             nothing needs to move",
        )),
        (Some(header_path), None) => encrypt_detached(&args, header_path),
        (None, Some(reduce)) => {
            resilience::shifted_encryption(args.run.resilience)?;
            encrypt_shifted(&args, Some(reduce))
        }
        // Resuming a shifted encryption: the device's own header says how.
        (None, None) if has_conversion(&args.device, Mode::Encrypt) => encrypt_shifted(&args, None),
        (None, None) => Err(CliError::usage(
            "encrypting in place needs room for the header: --header FILE (the header goes to \
             FILE, the data stays) or --reduce-device-size BYTES (the header goes to the start \
             of DEVICE and the data moves half of BYTES on; the last BYTES must be unused; \
             after a crash, run the same command again)",
        )),
    }
}

/// Whether the LUKS2 header on `path` records a `mode` conversion.
fn has_conversion(path: &Path, mode: Mode) -> bool {
    FileStorage::open_read_only(path)
        .ok()
        .and_then(|dev| read_luks2(&dev).ok())
        .is_some_and(|h| convert::resuming(&h, "", mode, true).is_ok())
}

fn encrypt_detached(args: &EncryptArgs, header_path: &Path) -> Result<(), CliError> {
    let data = open_rw(&args.device)?;
    let data_len = device_len(&data)?;
    convert::check_size(&data.name(), data_len)?;
    let stop = stop_on_signals()?;
    let pass = if args.run.resume_only {
        check_in_progress(header_path, Mode::Encrypt)?;
        let header = super::header_for_tokens(&args.run, header_path)?;
        let header = header.as_ref().map(|(d, h)| (d as &dyn Storage, h));
        args.run.passphrase(&args.device, header)?.0
    } else {
        start(args, header_path, &data, data_len)?
    };
    let resume = resume_hint("encrypt", &args.device, Some(header_path));
    run_conversion(&resume, header_path, &data, &pass, &args.run, &stop)
}

/// `encrypt --reduce-device-size`: the header at the start of the device, the data shifted.
/// `reduce` is `None` when resuming what the device records.
fn encrypt_shifted(args: &EncryptArgs, reduce: Option<u64>) -> Result<(), CliError> {
    let dev = open_rw(&args.device)?;
    // Installed first: planning may finish a start cut short (writes).
    let stop = stop_on_signals()?;
    let plan = convert::plan_shifted_encryption(&dev, reduce, args.run.resume_only)?;
    let pass = match plan {
        ShiftedPlan::Resume => {
            let header = super::header_for_tokens(&args.run, &args.device)?;
            let header = header.as_ref().map(|(d, h)| (d as &dyn Storage, h));
            args.run.passphrase(&args.device, header)?.0
        }
        ShiftedPlan::Fresh { shift, keep } => {
            let options = format_options(args, Some(shift))?;
            let warning = format!(
                "WARNING!\n========\nThis will encrypt {} in place. Its first {keep} bytes are \
                 kept (behind a {shift}-byte header); the last {} bytes must be unused (shrink \
                 the file system first): they are overwritten.",
                args.device.display(),
                2 * shift
            );
            let len = device_len(&dev)?;
            let (image, pass) =
                new_header(args, &options, shift, len, &warning, Placement::DataShift)?;
            convert::start_shifted_encryption(&dev, &image)?;
            pass
        }
    };
    let resume = resume_hint("encrypt", &args.device, None);
    run_conversion(&resume, &args.device, &dev, &pass, &args.run, &stop)
}

/// The LUKS2 options of a new encryption.
fn format_options(args: &EncryptArgs, data_offset: Option<u64>) -> Result<FormatOptions, CliError> {
    let options = FormatOptions {
        version: 2,
        cipher: args.segment.cipher.clone(),
        key_bits: args.segment.key_size,
        sector_size: args.segment.sector_size,
        pbkdf: pbkdf_options(&args.pbkdf)?,
        detached_header: data_offset.is_none(),
        data_offset,
        ..Default::default()
    };
    options.check()?;
    Ok(options)
}

/// Confirm `warning`, ask for the new passphrase, and build the new encryption's header in
/// memory (`size` bytes, for a `data_len`-byte device, placed as `placement` says). Returns its
/// bytes and the passphrase.
fn new_header(
    args: &EncryptArgs,
    options: &FormatOptions,
    size: u64,
    data_len: u64,
    warning: &str,
    placement: Placement,
) -> Result<(Vec<u8>, SecretBytes), CliError> {
    confirm(args.run.batch, warning)?;
    let pass = new_passphrase(
        None,
        &args.run.key,
        &format!("Enter passphrase for {}: ", args.device.display()),
    )?;
    let init = init_options(&args.pbkdf, &args.run)?;
    let image = convert::encryption_header(options, size, data_len, &pass, placement, &init)?;
    Ok((image, pass))
}

/// A new encryption: check everything, format the detached header for the device's data, and
/// record the encryption's start in it. Returns the passphrase.
fn start(
    args: &EncryptArgs,
    header_path: &Path,
    data: &dyn Storage,
    data_len: u64,
) -> Result<SecretBytes, CliError> {
    let existing = FileStorage::open_read_only(header_path).ok();
    convert::check_new_encryption(data, existing.as_ref().map(|f| f as &dyn Storage))?;
    let options = format_options(args, None)?;
    let warning = format!(
        "WARNING!\n========\nThis will encrypt {} in place and write its header to {}.",
        args.device.display(),
        header_path.display()
    );
    // The header is made whole in memory (formatted, then the encryption's start recorded) and
    // only then becomes the file, by rename: a crash leaves no header or a complete one, never a
    // header that names the plaintext as encrypted.
    let size = options.header_file_size();
    let (image, pass) = new_header(
        args,
        &options,
        size,
        data_len,
        &warning,
        Placement::Detached,
    )?;
    let (dir, name) = directory_of(header_path)?;
    convert::start_detached_encryption(&dir, &name, &image)?;
    Ok(pass)
}
