//! Unlocking a volume for the commands that serve it (`serve`, `mount`): the device (and a
//! detached header), the passphrase, and how the volume is opened.

use std::path::PathBuf;
use std::sync::Arc;

use sectorcrypt_luks::Header;
use sectorcrypt_storage::{FileStorage, Storage};
use sectorcrypt_volume::convert::{self, AtOpen};
use sectorcrypt_volume::{Error as VolumeError, Layout, Volume, VolumeOptions};

use crate::device;
use crate::exit::{open_failed, CliError};
use crate::inplace::{finish_conversion, resume_hint};
use crate::keyfile::KeyArgs;

/// The volume to open and how.
#[derive(clap::Args, Debug)]
pub(crate) struct VolumeArgs {
    /// The LUKS device or image file, or an RBD image (rbd:POOL[/NAMESPACE]/IMAGE).
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,
    /// Read the header from this detached header file; DEVICE then holds only data.
    #[arg(long, value_name = "FILE")]
    pub header: Option<PathBuf>,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Only try this keyslot.
    #[arg(short = 'S', long = "key-slot", value_name = "N")]
    pub key_slot: Option<usize>,
    /// Refuse writes (the device is opened read-only).
    #[arg(short = 'r', long)]
    pub readonly: bool,
    /// Pass discards (TRIM) down to the device. Off by default: holes show which blocks are in use.
    #[arg(long = "allow-discards")]
    pub allow_discards: bool,
    /// Cipher threads for large requests (default: the number of CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Block-cipher implementation: auto, portable, aesni, vaes256, vaes512, avx2, avx512
    /// (default: $SECTORCRYPT_BACKEND, else auto).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// Expose only the first N 512-byte sectors of the data (cryptsetup open --size).
    #[arg(long, value_name = "SECTORS", conflicts_with = "device_size")]
    pub size: Option<u64>,
    /// Expose only the first BYTES bytes of the data (cryptsetup open --device-size).
    #[arg(long = "device-size", value_name = "BYTES")]
    pub device_size: Option<u64>,
}

impl VolumeArgs {
    /// Threads for the cipher and for serving requests.
    pub(crate) fn threads(&self) -> usize {
        self.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| n as usize,
        )
    }

    /// Read the header, unlock it with the passphrase, and open the data segment. The data and
    /// a detached header are locked for as long as the volume and the returned header device
    /// are alive: exclusively when the volume is writable, shared when read-only (a writer
    /// beside would change what is served).
    pub(crate) fn open(&self) -> Result<(Arc<Volume>, Arc<dyn Storage>), CliError> {
        let open = |path: &PathBuf, write: bool| -> Result<Arc<dyn Storage>, CliError> {
            if let Some(image) = device::rbd(path, write) {
                return image.map(Arc::from);
            }
            let opened = if write {
                FileStorage::open(path)
            } else {
                FileStorage::open_shared(path)
            };
            Ok(Arc::new(opened.map_err(|e| open_failed(path, e))?))
        };
        let data = open(&self.device, !self.readonly)?;
        let header_dev: Arc<dyn Storage> = match &self.header {
            Some(h) => open(h, !self.readonly)?,
            None => Arc::clone(&data),
        };
        let mut header = Header::read(&*header_dev)?;
        let pass = self
            .key
            .read(&format!("Enter passphrase for {}: ", self.device.display()))?;
        // As `cryptsetup open` checks before activating: the passphrase, and during an in-place
        // conversion its metadata's digest, before anything is finished or written.
        let mut unlocked = header.unlock_checked(&*header_dev, &pass, self.key_slot, false)?;
        match convert::at_open(&header, &self.device.display().to_string(), self.readonly) {
            Ok(AtOpen::Open) => {}
            Ok(AtOpen::FinishFirst(mode)) => {
                let verb = mode.as_str();
                let hint = resume_hint(verb, &self.device, self.header.as_deref());
                eprintln!(
                    "{}: finishing the interrupted {verb} first (as {hint} would)",
                    self.device.display()
                );
                let header_rw = match &self.header {
                    Some(h) => open(h, true)?,
                    None => Arc::clone(&data),
                };
                finish_conversion(&*header_rw, &*data, &pass, self.threads(), &hint)?;
                header = Header::read(&*header_dev)?;
                unlocked = header.unlock(&*header_dev, &pass, self.key_slot)?;
            }
            Err(VolumeError::InProgress { mode, .. }) => {
                let verb = mode.as_str();
                let hint = resume_hint(verb, &self.device, self.header.as_deref());
                return Err(CliError::usage(format!(
                    "{} is being converted in place ({verb}, interrupted); finish it first: \
                     {hint}",
                    self.device.display()
                )));
            }
            Err(e) => return Err(e.into()),
        }
        let mut layout = Layout::from_header(&header, data.len().map_err(VolumeError::from)?)?;
        let wanted = match (self.size, self.device_size) {
            (Some(sectors), _) => Some(
                sectors
                    .checked_mul(512)
                    .ok_or_else(|| CliError::usage(format!("--size {sectors}: too large")))?,
            ),
            (None, bytes) => bytes,
        };
        if let Some(bytes) = wanted {
            layout
                .limit_to(bytes)
                .map_err(|e| CliError::usage(format!("{} for {}", e, self.device.display())))?;
        }
        let volume = Volume::with_layout(
            data,
            layout,
            &unlocked.volume_key,
            &VolumeOptions {
                read_only: self.readonly,
                allow_discards: self.allow_discards,
                threads: self.threads(),
                backend: crate::benchmark::backend_choice(self.backend.as_deref())?,
            },
        )
        .map_err(|e| {
            let inner = CliError::from(e);
            CliError {
                message: format!(
                    "cannot open the volume on {}: {}",
                    self.device.display(),
                    inner.message
                ),
                ..inner
            }
        })?;
        drop((pass, unlocked));
        crate::secrets::keys_ready();
        Ok((Arc::new(volume), header_dev))
    }
}
