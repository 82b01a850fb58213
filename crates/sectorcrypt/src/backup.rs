//! `header-backup` and `header-restore` (cryptsetup luksHeaderBackup, luksHeaderRestore): the header and keyslot area to a new file and back.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use sectorcrypt_luks::Header;
use sectorcrypt_storage::FileStorage;

use crate::chip::open_header;
use crate::exit::{CliError, Code};
use crate::keyslots::confirm;

#[derive(clap::Args, Debug)]
pub(crate) struct BackupArgs {
    /// The LUKS device or image file.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The backup file.
    #[arg(long = "header-backup-file", value_name = "FILE", required = true)]
    file: PathBuf,
    /// The detached header of DEVICE.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

pub(crate) fn header_backup(args: BackupArgs) -> Result<(), CliError> {
    let dev = open_header(args.header.as_deref().unwrap_or(&args.device), true)?;
    let bytes = Header::backup(&*dev)?;
    // Never overwrite: a backup file is the last copy of a header someone may need.
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&args.file)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                CliError::usage(format!(
                    "Requested header backup file {} already exists.",
                    args.file.display()
                ))
            } else {
                CliError::io(format!("cannot create {}", args.file.display()), e)
            }
        })?;
    let written = f.write_all(&bytes).and_then(|_| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&args.file);
        return Err(CliError::io(
            format!("cannot write {}", args.file.display()),
            e,
        ));
    }
    Ok(())
}

pub(crate) fn header_restore(args: BackupArgs) -> Result<(), CliError> {
    let backup = FileStorage::open_read_only(&args.file).map_err(|e| CliError {
        code: Code::Device,
        message: format!("cannot open backup file {}: {e}", args.file.display()),
    })?;
    let dev = open_header(args.header.as_deref().unwrap_or(&args.device), false)?;
    // The backup is checked in full before anything is asked or written.
    Header::read(&backup).map_err(|e| match e {
        sectorcrypt_luks::Error::NotLuks { .. } => CliError::usage(format!(
            "{} is not a LUKS header backup.",
            args.file.display()
        )),
        other => other.into(),
    })?;
    confirm(
        args.batch,
        &format!(
            "WARNING!\n========\nDevice {} will be overwritten with the header in {}.",
            args.device.display(),
            args.file.display()
        ),
    )?;
    Header::restore(&*dev, &backup)?;
    Ok(())
}
