//! `sectorcrypt flash ...`: encrypted raw NAND flash with UBI inside, with ubi-utils' habits
//! (`ubimkvol`'s `--name`/`--vol-id`/`--type`, `ubinize`'s geometry names) and cryptsetup's for
//! keys. DEVICE is a simulated NAND image (made by `flash format` when it does not exist yet) or
//! a Linux MTD character device; the key commands (`add-key`, `dump`, ...) take it too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sectorcrypt_flash::crypt::Policy;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_flashvol::{EncryptedFlash, NewFlash};
use sectorcrypt_luks::FormatOptions;
use sectorcrypt_storage::FileStorage;
use sectorcrypt_ubi::media::VolType;
use sectorcrypt_ubi::{AttachOptions, Info, NewVolume, Ubi, VolumeInfo};
use serde_json::{json, Value};

use crate::chip::{require_chip, Chip};
use crate::exit::{CliError, Code};
use crate::keyfile::KeyArgs;
use crate::keyslots::{confirm, new_passphrase, pbkdf_options};
use crate::pbkdf_args::{CipherArgs, PbkdfArgs};
use crate::progress::Steps;
use crate::units::parse_size;

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
    /// Replay recorded UBI traces (../shared/flash-traces) on a simulated chip with plain UBI and
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

#[derive(clap::Args, Debug)]
pub(crate) struct FormatArgs {
    /// The NAND image file (created if it does not exist) or /dev/mtdN.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    #[command(flatten)]
    geometry: GeometryArgs,
    #[command(flatten)]
    header: NewHeaderArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
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

fn format(args: FormatArgs) -> Result<(), CliError> {
    let new = args.header.new_flash()?;
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
            args.batch,
            &format!(
                "WARNING!\n========\nThis will erase everything on {} irrevocably.",
                args.device.display()
            ),
        )?;
        chip
    };
    let result = new_passphrase(
        None,
        &args.key,
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
fn create_image(path: &Path, g: &Geometry) -> Result<Chip, CliError> {
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

/// A device and its passphrase: what every command on the UBI inside needs.
#[derive(clap::Args, Debug)]
pub(crate) struct OpenArgs {
    /// The encrypted flash (a NAND image file or /dev/mtdN).
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    #[command(flatten)]
    key: KeyArgs,
    /// Only try this keyslot (no short form here: `-S` is a volume's size in LEBs, as
    /// ubimkvol has it).
    #[arg(long = "key-slot", value_name = "N")]
    key_slot: Option<usize>,
}

impl OpenArgs {
    pub(crate) fn unlock(&self, read_only: bool) -> Result<(Chip, EncryptedFlash), CliError> {
        let chip = require_chip(&self.device, read_only)?;
        let header = sectorcrypt_flashvol::read_header(chip.flash())?;
        let pass = self
            .key
            .read(&format!("Enter passphrase for {}: ", self.device.display()))?;
        drop(header);
        let opened = sectorcrypt_flashvol::unlock(chip.flash(), &pass, self.key_slot)?;
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

#[derive(clap::Args, Debug)]
pub(crate) struct MkvolArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// The new volume's name.
    #[arg(short = 'N', long = "name", value_name = "NAME")]
    name: String,
    /// Its ID (default: the first free).
    #[arg(short = 'n', long = "vol-id", value_name = "ID")]
    vol_id: Option<u32>,
    #[command(flatten)]
    size: SizeArgs,
    /// dynamic (read-write) or static (written whole, CRC-checked).
    #[arg(short = 't', long = "type", value_name = "TYPE", default_value = "dynamic", value_parser = parse_vol_type)]
    vol_type: VolType,
    /// LEB alignment.
    #[arg(
        short = 'a',
        long = "alignment",
        value_name = "BYTES",
        default_value_t = 1
    )]
    alignment: u32,
    /// Grow over all free space at the next attach.
    #[arg(long)]
    autoresize: bool,
}

fn parse_vol_type(name: &str) -> Result<VolType, String> {
    match name {
        "dynamic" => Ok(VolType::Dynamic),
        "static" => Ok(VolType::Static),
        other => Err(format!("unknown volume type '{other}' (dynamic or static)")),
    }
}

fn mkvol(args: MkvolArgs) -> Result<(), CliError> {
    with_ubi(&args.open, |ubi| {
        let info = ubi.info();
        let usable = info.layout.leb_size - info.layout.leb_size % args.alignment.max(1);
        let lebs = args.size.lebs(&info, usable, 0)?;
        let id = ubi.create_volume(&NewVolume {
            id: args.vol_id,
            name: args.name.clone(),
            lebs,
            vol_type: args.vol_type,
            alignment: args.alignment,
            autoresize: args.autoresize,
        })?;
        println!(
            "Volume ID {id}, size {lebs} LEBs ({} bytes), name \"{}\"",
            u64::from(lebs) * u64::from(usable),
            args.name
        );
        Ok(())
    })
}

#[derive(clap::Args, Debug)]
pub(crate) struct RsvolArgs {
    #[command(flatten)]
    vol: VolArgs,
    #[command(flatten)]
    size: SizeArgs,
}

fn rsvol(args: RsvolArgs) -> Result<(), CliError> {
    with_ubi(&args.vol.open, |ubi| {
        let v = args.vol.which.find(ubi)?;
        let lebs = args.size.lebs(&ubi.info(), v.usable_leb_size, v.lebs)?;
        Ok(ubi.resize_volume(v.id, lebs)?)
    })
}

#[derive(clap::Args, Debug)]
pub(crate) struct UpdateArgs {
    #[command(flatten)]
    vol: VolArgs,
    /// The new contents.
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

fn update(args: UpdateArgs) -> Result<(), CliError> {
    let data = std::fs::read(&args.file)
        .map_err(|e| CliError::io(format!("cannot read {}", args.file.display()), e))?;
    with_ubi(&args.vol.open, |ubi| {
        let v = args.vol.which.find(ubi)?;
        Ok(ubi.update_volume(v.id, &data)?)
    })
}

#[derive(clap::Args, Debug)]
pub(crate) struct ReadArgs {
    #[command(flatten)]
    vol: VolArgs,
    /// Where to write the contents ('-' = standard output).
    #[arg(value_name = "FILE")]
    out: PathBuf,
}

fn read(args: ReadArgs) -> Result<(), CliError> {
    let (_, opened) = args.vol.open.unlock(true)?;
    let ubi = opened.attach(&AttachOptions::default())?;
    let v = args.vol.which.find(&ubi)?;
    let usable = v.usable_leb_size as usize;
    let mut data = vec![0u8; v.data_bytes as usize];
    for (lnum, chunk) in data.chunks_mut(usable).enumerate() {
        ubi.read(v.id, lnum as u32, 0, chunk)?;
    }
    write_out(&args.out, &data)
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

#[derive(clap::Args, Debug)]
pub(crate) struct ImportArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// The UBI image (from ubinize, made for this flash's geometry).
    #[arg(value_name = "IMAGE")]
    image: PathBuf,
    /// The shape of a new NAND image, when DEVICE does not exist yet (the UBI is then plain).
    #[command(flatten)]
    geometry: GeometryArgs,
    /// The VID header offset the image was made with (ubinize -O).
    #[arg(short = 'O', long = "vid-hdr-offset", value_name = "BYTES")]
    vid_hdr_offset: Option<u32>,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

/// `import`: onto an encrypted flash through the encryption layer (the passphrase is asked),
/// onto a plain flash as it is (as `ubiformat -f` would; `flash convert` encrypts it later), or
/// onto a new plain NAND image made with the geometry options.
fn import(args: ImportArgs) -> Result<(), CliError> {
    let image = std::fs::read(&args.image)
        .map_err(|e| CliError::io(format!("cannot read {}", args.image.display()), e))?;
    let device = &args.open.device;
    let (target, opened): (Arc<dyn Flash>, _) = if crate::chip::exists(device) {
        if args.geometry.given() {
            return Err(CliError {
                code: Code::Busy,
                message: format!(
                    "{} exists: its geometry is its own (the geometry options make a new image)",
                    device.display()
                ),
            });
        }
        let chip = require_chip(device, false)?;
        if sectorcrypt_flashvol::read_header(chip.flash()).is_ok() {
            let (_, opened) = args.open.unlock(false)?;
            (Arc::clone(&opened.crypt) as Arc<dyn Flash>, Some(opened))
        } else {
            (chip.flash(), None)
        }
    } else {
        (
            create_image(device, &args.geometry.geometry()?)?.flash(),
            None,
        )
    };
    confirm(
        args.batch,
        &format!(
            "WARNING!\n========\nThis will replace everything on {} with {}.",
            device.display(),
            args.image.display()
        ),
    )?;
    let done = sectorcrypt_ubi::flash_image(&*target, &image, args.vid_hdr_offset)?;
    let attach = AttachOptions {
        vid_hdr_offset: args.vid_hdr_offset,
        ..AttachOptions::default()
    };
    // Attach once through the layer, as the kernel would at first boot (auto-resize, volume
    // table checks); a plain image is left as ubiformat leaves it, its auto-resize pending, so
    // that flash convert still has room for a header.
    if let Some(opened) = opened {
        drop(opened.attach(&attach)?);
        opened.detach()?;
    }
    eprintln!(
        "{} eraseblocks of the image written, {} more formatted, {} bad",
        done.image_pebs, done.formatted_pebs, done.bad_pebs
    );
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// The dump to write.
    #[arg(value_name = "FILE")]
    out: PathBuf,
    /// The chip as it is, ciphertext and all, every eraseblock (no passphrase needed): what
    /// nanddump would read off the device, usable later as DEVICE `nanddump:FILE`.
    #[arg(long)]
    raw: bool,
    /// With --raw: each page followed by its spare area (nanddump --oob).
    #[arg(long, requires = "raw")]
    oob: bool,
}

fn export(args: ExportArgs) -> Result<(), CliError> {
    if args.raw {
        let chip = require_chip(&args.open.device, true)?;
        return write_out(&args.out, &raw_dump(&*chip.flash(), args.oob)?);
    }
    let (_, opened) = args.open.unlock(true)?;
    let crypt = &opened.crypt;
    let g = crypt.geometry();
    let mut dump = vec![0xFFu8; g.size() as usize];
    for (peb, block) in dump.chunks_mut(g.peb_size as usize).enumerate() {
        let peb = peb as u32;
        if !crypt.is_bad(peb)? {
            match crypt.read(peb, 0, block) {
                Ok(_) | Err(sectorcrypt_flash::Error::Uncorrectable { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    write_out(&args.out, &dump)
}

/// Every eraseblock of `flash` as nanddump writes it: data only, or each page and its spare area
/// (`with_oob`); bad blocks as 0xFF, their marker kept in the spare area.
fn raw_dump(flash: &dyn Flash, with_oob: bool) -> Result<Vec<u8>, CliError> {
    let g = flash.geometry();
    let (page, oob) = (g.page_size as usize, g.oob_size as usize);
    let stride = if with_oob { page + oob } else { page };
    let mut dump = vec![0xFFu8; g.peb_count as usize * g.pages_per_peb() as usize * stride];
    let mut block = vec![0u8; g.peb_size as usize];
    for (peb, out) in dump
        .chunks_mut(g.pages_per_peb() as usize * stride)
        .enumerate()
    {
        let peb = peb as u32;
        let bad = flash.is_bad(peb)?;
        if !bad {
            match flash.read(peb, 0, &mut block) {
                Ok(_) | Err(sectorcrypt_flash::Error::Uncorrectable { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        for (i, slot) in out.chunks_mut(stride).enumerate() {
            if !bad {
                slot[..page].copy_from_slice(&block[i * page..(i + 1) * page]);
            }
            if with_oob {
                flash.read_oob(peb, i as u32, &mut slot[page..])?;
            }
        }
    }
    Ok(dump)
}

/// A flash error (the chip failed): exit 1 with what failed.
impl From<sectorcrypt_flash::Error> for CliError {
    fn from(e: sectorcrypt_flash::Error) -> Self {
        CliError::usage(crate::exit::chain(&e))
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct InfoArgs {
    /// The flash (a NAND image file or /dev/mtdN).
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Also unlock it and show UBI (the passphrase from this file; '-' = standard input);
    /// attaching UBI may write, as the kernel's attach does.
    #[arg(short = 'd', long = "key-file", value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

fn info(args: InfoArgs) -> Result<(), CliError> {
    // With a key UBI is attached, which may write as the kernel's attach does (erase PEBs left
    // unerased, grow a volume marked for auto-resize); without one nothing is written.
    let chip = require_chip(&args.device, args.key_file.is_none())?;
    let g = chip.flash().geometry();
    let mut out = json!({
        "device": args.device.display().to_string(),
        "geometry": {
            "peb_size": g.peb_size, "page_size": g.page_size, "sub_page_size": g.sub_page_size,
            "oob_size": g.oob_size, "peb_count": g.peb_count, "nop": g.nop,
        },
    });
    if let Some(counts) = chip.erase_counts() {
        out["chip_erase_counts"] = stats(counts.iter().map(|&c| u64::from(c)));
    }
    let header = match sectorcrypt_flashvol::read_header(chip.flash()) {
        Ok(h) => h,
        // A plain flash (UBI as ubiformat or flash import leaves it): the chip's facts only.
        Err(sectorcrypt_flashvol::Error::NotEncrypted(_)) if args.key_file.is_none() => {
            out["header"] = Value::Null;
            return print_info(&out, args.json);
        }
        Err(e) => return Err(e.into()),
    };
    let h = &header.header;
    let segment = h.data_segment()?;
    out["header"] = json!({
        "uuid": h.uuid(),
        "label": h.label(),
        "cipher": segment.cipher,
        "policy": header.params.policy.name(),
        "keyslots": h.metadata().keyslots.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "header_blocks": header.area.blocks(),
        "rewrite_journal_blocks": header.params.rewrite_journal().collect::<Vec<_>>(),
        "ubi_first_block": header.params.data_first,
        "conversion": header.params.conversion.map(|c| c.name()),
    });
    drop(header);
    if let Some(file) = &args.key_file {
        let key = KeyArgs {
            key_file: Some(file.clone()),
            ..KeyArgs::default()
        };
        let pass = key.read("")?;
        let opened = sectorcrypt_flashvol::unlock(chip.flash(), &pass, None)?;
        let ubi = opened.attach(&AttachOptions::default())?;
        out["ubi"] = ubi_json(&ubi);
        let crypt = opened.crypt.stats();
        out["encryption_layer"] =
            json!({"chip_erases": crypt.chip_erases, "rewrites": crypt.rewrites});
    }
    print_info(&out, args.json)
}

fn print_info(out: &Value, json: bool) -> Result<(), CliError> {
    let text = if json {
        format!("{out}\n")
    } else {
        info_text(out)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| CliError::io("cannot write the output", e))
}

/// min / mean / max of `values`.
fn stats(values: impl Iterator<Item = u64>) -> Value {
    let v: Vec<u64> = values.collect();
    let (min, max) = (
        v.iter().min().copied().unwrap_or(0),
        v.iter().max().copied().unwrap_or(0),
    );
    let mean = if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64
    };
    json!({"min": min, "mean": mean, "max": max})
}

fn ubi_json(ubi: &Ubi) -> Value {
    let i = ubi.info();
    let (min, mean, max) = i.erase_counters;
    json!({
        "image_seq": i.image_seq,
        "leb_size": i.layout.leb_size,
        "pebs": i.pebs,
        "bad_pebs": i.bad_pebs,
        "corrupted_pebs": i.corrupted_pebs,
        "available_pebs": i.available_pebs,
        "reserved_for_bad": i.reserved_for_bad,
        "max_sqnum": i.max_sqnum,
        "erase_counters": {"min": min, "mean": mean, "max": max},
        "read_only": i.read_only,
        "volumes": i.volumes.iter().map(|v| json!({
            "id": v.id, "name": v.name,
            "type": match v.vol_type { VolType::Dynamic => "dynamic", VolType::Static => "static" },
            "lebs": v.lebs, "usable_leb_size": v.usable_leb_size, "alignment": v.alignment,
            "data_bytes": v.data_bytes, "mapped_lebs": v.mapped_lebs, "corrupted": v.corrupted,
        })).collect::<Vec<_>>(),
    })
}

/// The `info` report as text, from its JSON form (one source for both).
fn info_text(v: &Value) -> String {
    let g = &v["geometry"];
    let h = &v["header"];
    let mut s = format!(
        "Flash:       {}\nGeometry:    {} eraseblocks of {} bytes, pages of {}, sub-pages of {}, {} spare bytes, NOP {}\n",
        v["device"].as_str().unwrap_or(""),
        g["peb_count"], g["peb_size"], g["page_size"], g["sub_page_size"], g["oob_size"], g["nop"]
    );
    if let Some(c) = v.get("chip_erase_counts") {
        s += &format!(
            "Chip erases: min {} mean {:.2} max {} per eraseblock\n",
            c["min"],
            c["mean"].as_f64().unwrap_or(0.0),
            c["max"]
        );
    }
    if h.is_null() {
        return s + "Header:      none: a plain flash (sectorcrypt flash convert encrypts it in place)\n";
    }
    if let Some(stage) = h["conversion"].as_str() {
        s += &format!("Conversion:  in progress ({stage}): run flash convert again to finish it\n");
    }
    s += &format!(
        "Header:      LUKS2, UUID {}, cipher {}, erased space {}, keyslots {}\n             eraseblocks {}, UBI from eraseblock {}\n",
        h["uuid"].as_str().unwrap_or(""),
        h["cipher"].as_str().unwrap_or(""),
        h["policy"].as_str().unwrap_or(""),
        h["keyslots"],
        h["header_blocks"],
        h["ubi_first_block"]
    );
    if let Some(u) = v.get("ubi") {
        let ec = &u["erase_counters"];
        s += &format!(
            "UBI:         image sequence {:#x}, {} PEBs ({} bad, {} corrupted), LEBs of {} bytes, {} available, {} reserved for bad blocks\n             erase counters min {} mean {} max {}\n",
            u["image_seq"].as_u64().unwrap_or(0), u["pebs"], u["bad_pebs"], u["corrupted_pebs"],
            u["leb_size"], u["available_pebs"], u["reserved_for_bad"], ec["min"], ec["mean"], ec["max"]
        );
        for vol in u["volumes"].as_array().into_iter().flatten() {
            s += &format!(
                "Volume {}:    {:?} {} {} LEBs, {} bytes of data{}\n",
                vol["id"],
                vol["name"].as_str().unwrap_or(""),
                vol["type"].as_str().unwrap_or(""),
                vol["lebs"],
                vol["data_bytes"],
                if vol["corrupted"] == true {
                    " (corrupted)"
                } else {
                    ""
                }
            );
        }
    }
    s
}

#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    measure: MeasureArgs,
    /// One JSON object per measurement, one per line.
    #[arg(long)]
    json: bool,
}

/// How UBI's throughput is measured: `flash benchmark`'s options, and `flash study --report`'s.
#[derive(clap::Args, Debug)]
pub(crate) struct MeasureArgs {
    /// Bytes per LEB write or read (repeatable; default one page to a whole LEB).
    #[arg(long = "request-size", value_name = "BYTES", value_parser = parse_size)]
    request_sizes: Vec<u64>,
    /// Bytes written and read per measurement.
    #[arg(long, value_name = "BYTES", default_value = "8MiB", value_parser = parse_size)]
    bytes: u64,
    /// Fresh stacks per measurement (the median is reported).
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: usize,
}

impl MeasureArgs {
    /// The request sizes to measure, checked.
    fn sizes(&self) -> Result<Vec<usize>, CliError> {
        let sizes: Vec<usize> = if self.request_sizes.is_empty() {
            sectorcrypt_bench::flash::DEFAULT_REQUESTS.to_vec()
        } else {
            self.request_sizes.iter().map(|&s| s as usize).collect()
        };
        if let Some(bad) = sizes
            .iter()
            .find(|&&s| s == 0 || s % 2048 != 0 && s != 129_024)
        {
            return Err(CliError::usage(format!(
                "--request-size {bad}: LEB writes go in whole 2048-byte pages (or a whole LEB, 129024)"
            )));
        }
        Ok(sizes)
    }
}

fn benchmark(args: BenchArgs) -> Result<(), CliError> {
    use sectorcrypt_bench::flash::{default_stacks, measure};
    let sizes = args.measure.sizes()?;
    let mut rows = Rows::new(args.json);
    rows.header(format!(
            "# UBI on a simulated 2 KiB-page SLC chip in memory, {} MiB per measurement; 'SLC' columns: the same\n# chip operations timed as a typical SLC chip (read 25 us/page, program 200 us/page, erase 2 ms)\n#{:>27} {:>8} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8} {:>9} {:>9} {:>12} {:>7}\n",
            args.measure.bytes >> 20,
            "stack", "request", "write MB/s", "read MB/s", "vs plain", "SLC write", "SLC read", "vs plain", "erase/PEB", "calls/PEB", "cipher B/PEB", "cipher%"
        ))?;
    for &size in &sizes {
        let mut plain = None;
        for stack in default_stacks() {
            let m = measure(
                stack,
                size,
                args.measure.bytes as usize,
                args.measure.rounds,
            );
            let (base, slc_base) =
                *plain.get_or_insert((m.write_bytes_per_sec, m.slc_write_bytes_per_sec));
            rows.row(&m, || {
                format!(
                    "{:>28} {:>8} {:>10.1} {:>10.1} {:>7.2}x {:>9.2} {:>9.2} {:>7.3}x {:>9.2} {:>9.1} {:>12.0} {:>6.1}%\n",
                    m.stack,
                    size,
                    m.write_bytes_per_sec / 1e6,
                    m.read_bytes_per_sec / 1e6,
                    m.write_bytes_per_sec / base,
                    m.slc_write_bytes_per_sec / 1e6,
                    m.slc_read_bytes_per_sec / 1e6,
                    m.slc_write_bytes_per_sec / slc_base,
                    m.erases_per_peb,
                    m.cipher_calls_per_peb,
                    m.cipher_bytes_per_peb,
                    m.cipher_share_of_write * 100.0
                )
            })?;
        }
    }
    Ok(())
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
    header: NewHeaderArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

fn convert(args: ConvertArgs) -> Result<(), CliError> {
    let chip = require_chip(&args.device, false)?;
    let new = args.header.new_flash()?;
    let encrypted = sectorcrypt_flashvol::read_header(chip.flash()).ok();
    let resuming = encrypted
        .as_ref()
        .and_then(|h| h.params.conversion)
        .is_some();
    let prompt = format!("Enter passphrase for {}: ", args.device.display());
    // A new encryption asks for a new passphrase (twice on a terminal); anything else opens
    // the header that is there.
    let pass = if args.decrypt || encrypted.is_some() {
        args.key.read(&prompt)?
    } else {
        new_passphrase(None, &args.key, &prompt)?
    };
    drop(encrypted);
    if !resuming {
        confirm(
            args.batch,
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

#[derive(clap::Args, Debug)]
#[command(group(
    clap::ArgGroup::new("throughput")
        .args(["request_sizes", "bytes", "rounds"])
        .multiple(true)
        .requires("report")
))]
pub(crate) struct StudyArgs {
    /// Trace files (`R|W|E pnum offset len` lines, xz-compressed or not).
    #[arg(value_name = "TRACE", required_unless_present = "synthetic")]
    traces: Vec<PathBuf>,
    /// Also replay the synthetic workloads (sequential and random LEB writes, UBIFS-like
    /// journal appends, small synced writes, volume updates; run on this UBI, with syncs).
    #[arg(long)]
    synthetic: bool,
    /// One JSON object per trace and stack, one per line.
    #[arg(long)]
    json: bool,
    /// Also measure the throughput (as flash benchmark) and write a report into DIR (made if
    /// missing; files of the same names replaced): report.md with the tables and the figures,
    /// an SVG figure per trace, ratio-by-workload.svg, throughput.svg, results.json.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    #[command(
        flatten,
        next_help_heading = "Throughput in the report (with --report)"
    )]
    measure: MeasureArgs,
}

/// Measurement output: a text table (with its header), or one JSON object per row (`--json`).
struct Rows {
    out: std::io::StdoutLock<'static>,
    json: bool,
}

impl Rows {
    fn new(json: bool) -> Rows {
        Rows {
            out: std::io::stdout().lock(),
            json,
        }
    }

    fn write(&mut self, text: &str) -> Result<(), CliError> {
        self.out
            .write_all(text.as_bytes())
            .map_err(|e| CliError::io("cannot write the output", e))
    }

    /// The table's header (not in JSON).
    fn header(&mut self, text: String) -> Result<(), CliError> {
        if self.json {
            return Ok(());
        }
        self.write(&text)
    }

    /// One row: `value` as a JSON line, or `text` as a table line.
    fn row(
        &mut self,
        value: &impl serde::Serialize,
        text: impl FnOnce() -> String,
    ) -> Result<(), CliError> {
        let line = if self.json {
            format!("{}\n", serde_json::to_string(value).expect("serializable"))
        } else {
            text()
        };
        self.write(&line)
    }
}

/// `DIR` made if missing; refused if it is something else.
fn report_dir(dir: &Path) -> Result<(), CliError> {
    if dir.exists() && !dir.is_dir() {
        return Err(CliError::usage(format!(
            "--report {}: exists and is not a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::io(format!("cannot make {}", dir.display()), e))
}

fn study(args: StudyArgs) -> Result<(), CliError> {
    use sectorcrypt_bench::flash::{default_stacks, measure};
    use sectorcrypt_bench::report::{Report, Throughput, TraceWear};
    use sectorcrypt_bench::wear::{replay, study_stacks};
    let sizes = args.measure.sizes()?;
    if let Some(dir) = &args.report {
        report_dir(dir)?;
    }
    let measured = if args.report.is_some() {
        sizes.len() * default_stacks().len()
    } else {
        0
    };
    let mut workloads = Vec::new();
    for path in &args.traces {
        let trace = sectorcrypt_flash::trace::Trace::read(path).map_err(|e| CliError {
            code: Code::Device,
            message: format!("{}: {e}", path.display()),
        })?;
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        workloads.push((name, trace));
    }
    if args.synthetic {
        workloads.extend(sectorcrypt_bench::synthetic::synthetic_traces(false)?);
    }
    let steps = Steps::new((workloads.len() * study_stacks().len() + measured) as u64);
    let mut traces = Vec::new();
    let mut rows = Rows::new(args.json);
    steps.print(|| rows.header(format!(
            "# erases per eraseblock, replayed on a simulated chip (the chip's own counts)\n#{:>29} {:>28} {:>22} {:>8} {:>22} {:>10}\n",
            "trace", "stack", "workload min/mean/max", "vs plain", "whole run min/mean/max", "erases/GiB"
        )))?;
    for (name, trace) in workloads {
        let mut plain = None;
        let mut wear = Vec::new();
        for stack in study_stacks() {
            let w = steps.step(format!("replaying {name}"), || replay(&trace, &name, stack))?;
            let base = *plain.get_or_insert(w.workload.mean);
            steps.print(|| {
                rows.row(&w, || {
                    format!(
                        "{:>30} {:>28} {:>6}/{:>7.2}/{:>6} {:>7.2}x {:>6}/{:>7.2}/{:>6} {:>10.0}\n",
                        w.trace,
                        w.stack,
                        w.workload.min,
                        w.workload.mean,
                        w.workload.max,
                        w.workload.mean / base.max(f64::MIN_POSITIVE),
                        w.whole.min,
                        w.whole.mean,
                        w.whole.max,
                        w.erases_per_gib
                    )
                })
            })?;
            wear.push(w);
        }
        traces.push(TraceWear {
            name,
            geometry: trace.geometry,
            workload_bytes: trace.workload_data_bytes(),
            rows: wear,
        });
    }
    let Some(dir) = args.report else {
        return Ok(());
    };
    let (bytes, rounds) = (args.measure.bytes as usize, args.measure.rounds);
    let mut measurements = Vec::new();
    for &size in &sizes {
        for stack in default_stacks() {
            measurements.push(steps.step(format!("throughput, {size}-byte requests"), || {
                measure(stack, size, bytes, rounds)
            }));
        }
    }
    let report = Report {
        command: std::iter::once("sectorcrypt".to_string())
            .chain(
                std::env::args_os()
                    .skip(1)
                    .map(|a| a.to_string_lossy().into_owned()),
            )
            .collect(),
        traces,
        throughput: Throughput {
            bytes,
            rounds,
            rows: measurements,
        },
    };
    sectorcrypt_bench::report::write(&dir, &report)
        .map_err(|e| CliError::io(format!("cannot write the report into {}", dir.display()), e))?;
    Ok(())
}
