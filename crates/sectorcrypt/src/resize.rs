//! `resize`: change the size a served volume exposes (cryptsetup `resize` of an active device):
//! grow it to data added under it (a file or RBD image grown, a larger block device), or shrink
//! it. The process serving DEVICE does it (`crate::online`); new NBD connections and the FUSE
//! file see the new size.

use std::path::PathBuf;

use crate::exit::{CliError, Code};

#[derive(clap::Args, Debug)]
pub(crate) struct ResizeArgs {
    /// The served device (file, block device or rbd:POOL/IMAGE).
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,
    /// Its detached header, if it was served with one (not read: the server has it open).
    #[arg(long, value_name = "FILE")]
    pub header: Option<PathBuf>,
    /// The new size in 512-byte sectors (default: all the data the device holds now).
    #[arg(long, value_name = "SECTORS", conflicts_with = "device_size")]
    pub size: Option<u64>,
    /// The new size in bytes.
    #[arg(long = "device-size", value_name = "BYTES", value_parser = sectorcrypt_storage::units::parse_size)]
    pub device_size: Option<u64>,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    pub batch: bool,
}

impl ResizeArgs {
    /// The size asked for in bytes (`None`: as large as the data allows).
    pub(crate) fn bytes(&self) -> Result<Option<u64>, CliError> {
        match (self.size, self.device_size) {
            (Some(sectors), _) => sectors
                .checked_mul(512)
                .map(Some)
                .ok_or_else(|| CliError::usage(format!("--size {sectors}: too large"))),
            (None, bytes) => Ok(bytes),
        }
    }
}

pub(crate) fn resize(args: ResizeArgs) -> Result<(), CliError> {
    args.bytes()?;
    let Some(server) = crate::online::server_of(&args.device) else {
        return Err(CliError {
            code: Code::Device,
            message: format!(
                "{} is not served by a sectorcrypt process: resize changes what a running serve \
                 or mount exposes (as cryptsetup resize acts on an active device)",
                args.device.display()
            ),
        });
    };
    if let Some(bytes) = args.bytes()? {
        crate::keyslots::confirm(
            args.batch,
            &format!(
                "WARNING!\n========\nThis resizes {} to {bytes} bytes; if that is less than \
                 now, clients lose what lies past the new end (it stays on the device).",
                args.device.display()
            ),
        )?;
    }
    crate::online::ask(server, &[], false)
}
