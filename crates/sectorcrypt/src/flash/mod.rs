//! `sectorcrypt flash ...`: encrypted raw NAND flash with UBI inside, with ubi-utils' habits
//! (`ubimkvol`'s `--name`/`--vol-id`/`--type`, `ubinize`'s geometry names) and cryptsetup's for
//! keys. DEVICE is a simulated NAND image (made by `flash format` when it does not exist yet) or
//! a Linux MTD character device; the key commands (`add-key`, `dump`, ...) take it too.

mod format;
mod images;
mod info;
mod study;
mod volumes;

use std::io::Write;
use std::path::{Path, PathBuf};

use sectorcrypt_flash::Geometry;
use sectorcrypt_flashvol::EncryptedFlash;
use sectorcrypt_ubi::{AttachOptions, Info, Ubi, VolumeInfo};

use crate::chip::{require_chip, Chip};
use crate::exit::CliError;
use crate::keyfile::KeyArgs;
use crate::unlock::{unlock, TokenArgs, Tokens};
use format::{convert, format, ConvertArgs, FormatArgs};
use images::{export, import, ExportArgs, ImportArgs};
use info::{info, InfoArgs};
use sectorcrypt_luks::Error as LuksError;
use sectorcrypt_storage::units::parse_size;
use study::{benchmark, study, BenchArgs, StudyArgs};
use volumes::{mkvol, read, rsvol, update, MkvolArgs, ReadArgs, RsvolArgs, UpdateArgs};

#[derive(clap::Subcommand, Debug)]
pub(crate) enum Command {
    /// Make DEVICE an encrypted flash: LUKS2 header, every block erased through the
    /// encryption layer, an empty UBI (a new NAND image file of the given geometry if DEVICE
    /// does not exist).
    Format(Box<FormatArgs>),
    /// Print the geometry, the header and, with a passphrase, UBI's volumes and erase counters.
    Info(InfoArgs),
    /// Create a UBI volume (ubimkvol).
    Mkvol(MkvolArgs),
    /// Remove a UBI volume (ubirmvol).
    Rmvol(VolArgs),
    /// Resize a UBI volume (ubirsvol).
    Rsvol(RsvolArgs),
    /// Replace a volume's contents with a file (ubiupdatevol).
    Update(UpdateArgs),
    /// Write a volume's contents to a file (a static volume's data, a dynamic volume whole).
    Read(ReadArgs),
    /// Write a UBI image made by ubinize onto the encrypted flash, keeping erase counters
    /// (ubiformat -f).
    Import(ImportArgs),
    /// Write the decrypted flash, as UBI sees it, to a raw dump (nanddump layout, data only) for
    /// ubi_reader, nandwrite or a kernel.
    Export(ExportArgs),
    /// Encrypt a plain UBI flash in place (or, with --decrypt, an encrypted one back to plain
    /// UBI), keeping erase counters; after an interruption, run it again to finish.
    Convert(Box<ConvertArgs>),
    /// Unlock, attach UBI and expose every volume as a file under MOUNTPOINT (FUSE) and/or an
    /// NBD export on DIR/<name>.sock, until unmounted or SIGINT/SIGTERM.
    Attach(Box<crate::attach::AttachArgs>),
    /// Replay recorded UBI traces (data/flash-traces) on a simulated chip with plain UBI and
    /// behind the encryption layer, and count the program/erase cycles per eraseblock.
    Study(StudyArgs),
    /// Measure UBI's LEB write and read throughput on a simulated chip in memory, with and
    /// without the encryption layer, by request size.
    Benchmark(BenchArgs),
}

pub(crate) fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Format(args) => format(*args),
        Command::Info(args) => info(args),
        Command::Mkvol(args) => mkvol(args),
        Command::Rmvol(args) => with_ubi(&args.open, |ubi| Ok(ubi.remove_volume(args.id(ubi)?)?)),
        Command::Rsvol(args) => rsvol(args),
        Command::Update(args) => update(args),
        Command::Read(args) => read(args),
        Command::Import(args) => import(args),
        Command::Export(args) => export(args),
        Command::Benchmark(args) => benchmark(args),
        Command::Study(args) => study(args),
        Command::Attach(args) => crate::attach::run(*args),
        Command::Convert(args) => convert(*args),
    }
}

/// The shape of a new NAND image, with mtd-utils' option names; the defaults are a common SLC
/// chip (128 KiB eraseblocks, 2 KiB pages, 512-byte sub-pages, 64 spare bytes, NOP 4), 64 MiB.
#[derive(clap::Args, Debug)]
pub(crate) struct GeometryArgs {
    /// Eraseblock (PEB) size.
    #[arg(short = 'p', long = "peb-size", value_name = "BYTES", value_parser = parse_size)]
    peb_size: Option<u64>,
    /// Page size, the minimum I/O unit.
    #[arg(short = 'm', long = "min-io-size", value_name = "BYTES", value_parser = parse_size)]
    min_io_size: Option<u64>,
    /// Sub-page size (the page size on chips without sub-pages).
    #[arg(long = "sub-page-size", value_name = "BYTES", value_parser = parse_size)]
    sub_page_size: Option<u64>,
    /// Spare (OOB) bytes per page.
    #[arg(long = "oob-size", value_name = "BYTES", value_parser = parse_size)]
    oob_size: Option<u64>,
    /// How often a page may be programmed between erases (1 for MLC-like chips).
    #[arg(long, value_name = "N")]
    nop: Option<u8>,
    /// The chip's size.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    size: Option<u64>,
}

impl GeometryArgs {
    fn given(&self) -> bool {
        self.peb_size.is_some()
            || self.min_io_size.is_some()
            || self.sub_page_size.is_some()
            || self.oob_size.is_some()
            || self.nop.is_some()
            || self.size.is_some()
    }

    fn geometry(&self) -> Result<Geometry, CliError> {
        let d = Geometry::default();
        let small = |v: Option<u64>, default: u32, what: &str| {
            v.map_or(Ok(default), |v| {
                u32::try_from(v).map_err(|_| CliError::usage(format!("{what} {v} is too large")))
            })
        };
        let peb_size = small(self.peb_size, d.peb_size, "--peb-size")?;
        let page_size = small(self.min_io_size, d.page_size, "--min-io-size")?;
        let sub_page_size = small(
            self.sub_page_size,
            d.sub_page_size.min(page_size),
            "--sub-page-size",
        )?;
        let size = self.size.unwrap_or(d.size());
        if peb_size == 0 || !size.is_multiple_of(u64::from(peb_size)) {
            return Err(CliError::usage(format!(
                "--size {size} is not a whole number of {peb_size}-byte eraseblocks"
            )));
        }
        let g = Geometry {
            peb_size,
            page_size,
            sub_page_size,
            oob_size: small(self.oob_size, d.oob_size, "--oob-size")?,
            peb_count: small(Some(size / u64::from(peb_size)), 0, "--size")?,
            nop: self.nop.unwrap_or((page_size / sub_page_size).max(1) as u8),
        };
        g.validate().map_err(|e| CliError::usage(e.to_string()))?;
        Ok(g)
    }
}

/// A device and its passphrase: what every command on the UBI inside needs.
#[derive(clap::Args, Debug)]
pub(crate) struct OpenArgs {
    /// The encrypted flash (a NAND image file or /dev/mtdN).
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    tokens: TokenArgs,
    /// Only try this keyslot (no short form here: `-S` is a volume's size in LEBs, as
    /// ubimkvol has it).
    #[arg(long = "key-slot", value_name = "N")]
    key_slot: Option<usize>,
}

impl OpenArgs {
    pub(crate) fn unlock(&self, read_only: bool) -> Result<(Chip, EncryptedFlash), CliError> {
        let chip = require_chip(&self.device, read_only)?;
        let header = sectorcrypt_flashvol::read_header(chip.flash())?;
        let header = sectorcrypt_luks::Header::Luks2(Box::new(header.header));
        // A token's passphrase, or the one typed, goes straight to the unlock: one key
        // derivation, whichever it is. Errors other than a wrong passphrase come back whole.
        let (opened, pass) = unlock(
            &self.key,
            &self.tokens,
            Tokens::ByDefault,
            &header,
            &self.device,
            self.key_slot,
            |pass, slot| match sectorcrypt_flashvol::unlock(chip.flash(), pass, slot) {
                Err(sectorcrypt_flashvol::Error::Luks(LuksError::WrongPassphrase)) => {
                    Err(LuksError::WrongPassphrase)
                }
                other => Ok(other),
            },
        )?;
        let opened = opened?;
        drop((pass, header));
        crate::secrets::keys_ready();
        Ok((chip, opened))
    }
}

/// Unlock, attach UBI, run `f` on it, make what it wrote durable.
fn with_ubi(open: &OpenArgs, f: impl FnOnce(&Ubi) -> Result<(), CliError>) -> Result<(), CliError> {
    let (_, opened) = open.unlock(false)?;
    let ubi = opened.attach(&AttachOptions::default())?;
    f(&ubi)?;
    ubi.sync()?;
    drop(ubi);
    opened.detach()?;
    Ok(())
}

/// A UBI error: "no such volume" and friends are usage errors (1), as ubi-utils report them.
impl From<sectorcrypt_ubi::Error> for CliError {
    fn from(e: sectorcrypt_ubi::Error) -> Self {
        CliError::usage(crate::exit::chain(&e))
    }
}

/// Which volume: by name (`-N`) or by ID (`-n`), as ubi-utils take them.
#[derive(clap::Args, Debug)]
pub(crate) struct WhichVolume {
    /// The volume's name.
    #[arg(
        short = 'N',
        long = "name",
        value_name = "NAME",
        conflicts_with = "vol_id"
    )]
    name: Option<String>,
    /// The volume's ID.
    #[arg(short = 'n', long = "vol-id", value_name = "ID")]
    vol_id: Option<u32>,
}

impl WhichVolume {
    fn find(&self, ubi: &Ubi) -> Result<VolumeInfo, CliError> {
        let volumes = ubi.info().volumes;
        let found = match (&self.name, self.vol_id) {
            (Some(name), _) => volumes.into_iter().find(|v| &v.name == name),
            (None, Some(id)) => volumes.into_iter().find(|v| v.id == id),
            (None, None) => {
                return Err(CliError::usage(
                    "name the volume: --name NAME or --vol-id ID",
                ))
            }
        };
        found.ok_or_else(|| CliError::usage(format!("no volume {}", self.describe())))
    }

    fn describe(&self) -> String {
        match (&self.name, self.vol_id) {
            (Some(n), _) => format!("named {n:?}"),
            (None, Some(id)) => format!("with ID {id}"),
            _ => String::new(),
        }
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct VolArgs {
    #[command(flatten)]
    open: OpenArgs,
    #[command(flatten)]
    which: WhichVolume,
}

impl VolArgs {
    fn id(&self, ubi: &Ubi) -> Result<u32, CliError> {
        Ok(self.which.find(ubi)?.id)
    }
}

/// A volume size: bytes (`-s`, rounded up to whole LEBs) or LEBs (`-S`), as ubimkvol takes it.
#[derive(clap::Args, Debug)]
pub(crate) struct SizeArgs {
    /// Size in bytes (rounded up to whole LEBs).
    #[arg(short = 's', long = "size", value_name = "BYTES", value_parser = parse_size, conflicts_with = "lebs")]
    size: Option<u64>,
    /// Size in LEBs.
    #[arg(short = 'S', long = "lebs", value_name = "N")]
    lebs: Option<u32>,
    /// All the space left.
    #[arg(short = 'm', long = "maxavsize", conflicts_with_all = ["size", "lebs"])]
    max: bool,
}

impl SizeArgs {
    /// The size in LEBs for a volume of `usable`-byte LEBs, `now` LEBs already (for a resize).
    fn lebs(&self, info: &Info, usable: u32, now: u32) -> Result<u32, CliError> {
        match (self.size, self.lebs, self.max) {
            (Some(bytes), _, _) => u32::try_from(bytes.div_ceil(u64::from(usable)))
                .map_err(|_| CliError::usage(format!("--size {bytes} is too large"))),
            (None, Some(n), _) => Ok(n),
            (None, None, true) => Ok(now + info.available_pebs),
            (None, None, false) => Err(CliError::usage(
                "give the size: --size BYTES, --lebs N or --maxavsize",
            )),
        }
    }
}

/// Write `data` to `path` ('-': standard output).
fn write_out(path: &Path, data: &[u8]) -> Result<(), CliError> {
    let written = if path == Path::new("-") {
        std::io::stdout().lock().write_all(data)
    } else {
        std::fs::write(path, data)
    };
    written.map_err(|e| CliError::io(format!("cannot write {}", path.display()), e))
}

/// A flash error (the chip failed): exit 1 with what failed.
impl From<sectorcrypt_flash::Error> for CliError {
    fn from(e: sectorcrypt_flash::Error) -> Self {
        CliError::usage(crate::exit::chain(&e))
    }
}
