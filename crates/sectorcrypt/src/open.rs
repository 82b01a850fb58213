//! Unlocking a volume for the commands that serve it (`serve`, `mount`): the device (and a
//! detached header), the passphrase, and how the volume is opened. A device with a conversion
//! in progress is served as it stands (each request by its segment: `sectorcrypt_volume::live`)
//! and the conversion goes on in the background, as dm-crypt serves a device that
//! `cryptsetup reencrypt` converts.

use std::path::PathBuf;
use std::sync::Arc;

use sectorcrypt_luks::luks2::reencrypt::{self as metadata, State};
use sectorcrypt_luks::Header;
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{FileStorage, Storage};
use sectorcrypt_volume::reencrypt::{self, Options, DEFAULT_HOTZONE};
use sectorcrypt_volume::{Error as VolumeError, Layout, Volume, VolumeOptions};

use crate::device;
use crate::exit::{open_failed, CliError};
use crate::keyfile::KeyArgs;
use crate::online::{Host, Served};
use crate::unlock::{unlock, TokenArgs, Tokens};

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
    #[command(flatten)]
    pub tokens: TokenArgs,
    /// Only try this keyslot.
    #[arg(short = 'S', long = "key-slot", value_name = "N")]
    pub key_slot: Option<usize>,
    /// Refuse writes (the device is opened read-only).
    #[arg(short = 'r', long)]
    pub readonly: bool,
    /// Pass discards (TRIM) down to the device. Off by default: holes show which blocks are in use.
    #[arg(long = "allow-discards")]
    pub allow_discards: bool,
    /// A volume with integrity: write data and tags in place without the journal (faster; a
    /// crash can then leave a sector that fails its check, as the kernel's direct mode).
    #[arg(long = "integrity-no-journal")]
    pub integrity_no_journal: bool,
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
    /// A conversion recorded on DEVICE (reencryption, encryption, decryption) is served as it
    /// stands and goes on in the background; with this, it waits (`sectorcrypt reencrypt|encrypt|
    /// decrypt DEVICE --resume-only` beside the server goes on with it, online).
    #[arg(long = "no-resume")]
    pub no_resume: bool,
    /// A conversion that goes on in the background converts at most this many bytes a second
    /// (K, M, G: KiB...); default: as fast as it goes.
    #[arg(long = "conversion-max-rate", value_name = "BYTES", value_parser = sectorcrypt_storage::units::parse_size)]
    pub conversion_max_rate: Option<u64>,
}

/// An opened volume, the devices under it, and the conversion it has to go on with.
pub(crate) struct Opened {
    pub volume: Arc<Volume>,
    pub data: Arc<dyn Storage>,
    pub header_dev: Arc<dyn Storage>,
    /// The passphrase of a conversion recorded on the device, to go on with in the background.
    pub resume: Option<SecretBytes>,
}

impl Opened {
    /// Listen for online conversions of the volume (and go on with one recorded on it).
    pub(crate) fn host(&mut self, args: &VolumeArgs) -> Result<Host, CliError> {
        Host::start(
            Served {
                volume: Arc::clone(&self.volume),
                data: Arc::clone(&self.data),
                header_dev: Arc::clone(&self.header_dev),
                device: args.device.clone(),
                header: args.header.clone(),
                threads: args.threads(),
                read_only: args.readonly,
            },
            self.resume.take(),
            args.conversion_max_rate,
        )
    }
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
    pub(crate) fn open(&self) -> Result<Opened, CliError> {
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
        // As `cryptsetup open` checks before activating: the passphrase (or a token's), and
        // during an in-place conversion its metadata's digest, before anything is finished or
        // written.
        let (mut unlocked, pass) = unlock(
            &self.key,
            &self.tokens,
            Tokens::ByDefault,
            &header,
            &self.device,
            self.key_slot,
            |pass, slot| header.unlock_checked(&*header_dev, pass, slot, false),
        )?;
        let options = VolumeOptions {
            read_only: self.readonly,
            allow_discards: self.allow_discards,
            threads: self.threads(),
            backend: crate::benchmark::backend_choice(self.backend.as_deref())?,
        };
        let recorded = |header: &Header| match header {
            Header::Luks2(h) => metadata::parse(h.metadata()),
            Header::Luks1(_) => Ok(None),
        };
        if let Some(r) = recorded(&header)?.filter(|r| r.state() == State::Crash) {
            self.recover_step(&*data, &*header_dev, &pass, r.keyslot.mode.as_str())?;
            // The recovered step may have been the last one: then the volume opens as any.
            header = Header::read(&*header_dev)?;
            unlocked = header.unlock_checked(&*header_dev, &pass, self.key_slot, false)?;
            if recorded(&header)?.is_none() {
                eprintln!(
                    "sectorcrypt: {}: the conversion is finished",
                    self.device.display()
                );
            }
        }
        if recorded(&header)?.is_some() {
            drop(unlocked);
            return self.open_converting(data, header_dev, pass, &options);
        }
        if let Header::Luks2(h) = &header {
            if h.has_integrity() {
                if self.wanted_size()?.is_some() {
                    return Err(CliError::usage(
                        "--size and --device-size: an integrity volume's size is the one its \
                         dm-integrity superblock gives",
                    ));
                }
                let volume = Volume::open_integrity(
                    h,
                    Arc::clone(&data),
                    &unlocked.volume_key,
                    &options,
                    !self.integrity_no_journal,
                )
                .map_err(|e| self.cannot_open(e))?;
                drop((pass, unlocked));
                crate::secrets::keys_ready();
                return Ok(Opened {
                    volume: Arc::new(volume),
                    data,
                    header_dev,
                    resume: None,
                });
            }
        }
        let mut layout = Layout::from_header(&header, data.len().map_err(VolumeError::from)?)?;
        if let Some(bytes) = self.wanted_size()? {
            layout
                .limit_to(bytes)
                .map_err(|e| CliError::usage(format!("{} for {}", e, self.device.display())))?;
        }
        let volume = Volume::with_layout(Arc::clone(&data), layout, &unlocked.volume_key, &options)
            .map_err(|e| self.cannot_open(e))?;
        drop((pass, unlocked));
        crate::secrets::keys_ready();
        Ok(Opened {
            volume: Arc::new(volume),
            data,
            header_dev,
            resume: None,
        })
    }

    /// The size asked for with --size or --device-size, in bytes.
    fn wanted_size(&self) -> Result<Option<u64>, CliError> {
        Ok(match (self.size, self.device_size) {
            (Some(sectors), _) => Some(
                sectors
                    .checked_mul(512)
                    .ok_or_else(|| CliError::usage(format!("--size {sectors}: too large")))?,
            ),
            (None, bytes) => bytes,
        })
    }

    fn cannot_open(&self, e: VolumeError) -> CliError {
        let inner = CliError::from(e);
        CliError {
            message: format!(
                "cannot open the volume on {}: {}",
                self.device.display(),
                inner.message
            ),
            ..inner
        }
    }

    /// A step of a conversion (of `verb`) that a crash cut short, recovered: a write, so not on
    /// a device opened read-only.
    fn recover_step(
        &self,
        data: &dyn Storage,
        header_dev: &dyn Storage,
        pass: &[u8],
        verb: &str,
    ) -> Result<(), CliError> {
        if self.readonly {
            return Err(CliError::usage(format!(
                "a step of the conversion of {} was cut short; serve it writable once to \
                 recover it (or resume it: {})",
                self.device.display(),
                crate::inplace::resume_hint(verb, &self.device, self.header.as_deref())
            )));
        }
        eprintln!(
            "sectorcrypt: {}: recovering the conversion step a crash cut short",
            self.device.display()
        );
        let recovery = Options {
            hotzone: DEFAULT_HOTZONE,
            threads: self.threads(),
        };
        reencrypt::recover(header_dev, data, pass, &recovery)?;
        Ok(())
    }

    /// Open a device whose header records a conversion (in a clean state): the volume is served
    /// by segment, and the conversion goes on in the background unless --no-resume or read-only.
    fn open_converting(
        &self,
        data: Arc<dyn Storage>,
        header_dev: Arc<dyn Storage>,
        pass: SecretBytes,
        options: &VolumeOptions,
    ) -> Result<Opened, CliError> {
        let mut converting = reencrypt::converting(&*header_dev, &*data, &pass)?;
        if let Some(bytes) = self.wanted_size()? {
            converting
                .final_layout
                .limit_to(bytes)
                .map_err(|e| CliError::usage(format!("{} for {}", e, self.device.display())))?;
        }
        let header = sectorcrypt_luks::luks2::Header::read(&*header_dev)?;
        let volume = Volume::open_converting(Arc::clone(&data), &header, &converting, options)
            .map_err(|e| self.cannot_open(e))?;
        drop(converting);
        crate::secrets::keys_ready();
        Ok(Opened {
            volume: Arc::new(volume),
            data,
            header_dev,
            resume: (!self.readonly && !self.no_resume).then_some(pass),
        })
    }
}
