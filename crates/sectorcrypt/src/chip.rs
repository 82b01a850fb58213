//! Which devices are raw flash: a simulated NAND image (recognised by its magic), a Linux MTD
//! character device (`/dev/mtdN`), or a raw dump in `nanddump`'s layout named as
//! `nanddump:FILE[?peb=SIZE&page=SIZE&subpage=SIZE&oob=SIZE&layout=data|oob]` (a dump does not
//! say its geometry: the defaults are the default SLC chip's, 128 KiB / 2048 / 512 / 64, data
//! only). On such a device the LUKS commands work on the encrypted flash's header area, the same
//! code as on a file.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Arc;

use sectorcrypt_flash::dump::{DeviceName, DumpFlash};
use sectorcrypt_flash::mtd::MtdFlash;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::Flash;
use sectorcrypt_flashvol::Error as FlashVolError;
use sectorcrypt_storage::{Access, FileStorage, Storage};

use crate::exit::{held_elsewhere, open_failed, CliError, Code};

/// What a command does with a device, which decides its lock (`sectorcrypt_storage::lock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// Reads the header only (`dump`, `test-passphrase`): no lock, safe beside a writer.
    Header,
    /// Reads data that a writer would change underneath (`flash read`, a read-only server): a
    /// shared lock.
    Read,
    /// Writes: an exclusive lock for as long as the device is open.
    Write,
}

/// `path` as a file, locked for `how`.
pub(crate) fn open_file(path: &Path, how: Use) -> Result<FileStorage, CliError> {
    match how {
        Use::Header => FileStorage::open_read_only(path),
        Use::Read => FileStorage::open_shared(path),
        Use::Write => FileStorage::open(path),
    }
    .map_err(|e| open_failed(path, e))
}

/// A raw flash device.
pub(crate) enum Chip {
    /// A simulated NAND image (it knows its true erase counts).
    Sim(Arc<SimNand>),
    /// A Linux MTD character device.
    Mtd(Arc<MtdFlash>),
    /// A raw dump in nanddump's layout.
    Dump(Arc<DumpFlash>),
}

impl Chip {
    /// The device as a chip.
    pub(crate) fn flash(&self) -> Arc<dyn Flash> {
        match self {
            Chip::Sim(s) => Arc::clone(s) as Arc<dyn Flash>,
            Chip::Mtd(m) => Arc::clone(m) as Arc<dyn Flash>,
            Chip::Dump(d) => Arc::clone(d) as Arc<dyn Flash>,
        }
    }

    /// The chip's own erase count of every eraseblock, where it keeps one.
    pub(crate) fn erase_counts(&self) -> Option<Vec<u32>> {
        match self {
            Chip::Sim(s) => Some(s.erase_counts()),
            Chip::Mtd(_) | Chip::Dump(_) => None,
        }
    }
}

fn chip_error(path: &Path, e: sectorcrypt_flash::Error) -> CliError {
    if let Some(busy) = match &e {
        sectorcrypt_flash::Error::Io(io) => held_elsewhere(io),
        _ => None,
    } {
        return busy;
    }
    CliError {
        code: Code::Device,
        message: format!("{}: {e}", path.display()),
    }
}

/// The raw flash at `path`, if it is one (`None`: an ordinary file or block device), locked for
/// `how`.
pub(crate) fn open_chip(path: &Path, how: Use) -> Result<Option<Chip>, CliError> {
    if path.to_str().is_some_and(|p| p.starts_with("rbd:")) {
        return Ok(None);
    }
    if let Some(spec) = path.to_str().and_then(|p| p.strip_prefix("nanddump:")) {
        return open_dump(spec, how).map(Some);
    }
    let meta = std::fs::metadata(path).map_err(|e| open_failed(path, e))?;
    if meta.file_type().is_char_device() {
        let mtd = MtdFlash::open(path, how != Use::Write)
            .and_then(|mtd| match how {
                Use::Header => Ok(mtd),
                Use::Read => mtd.locked(Access::Shared),
                Use::Write => mtd.locked(Access::Exclusive),
            })
            .map_err(|e| chip_error(path, e))?;
        return Ok(Some(Chip::Mtd(Arc::new(mtd))));
    }
    let file = open_file(path, how)?;
    if !SimNand::is_image(&file) {
        return Ok(None);
    }
    let sim = SimNand::open(file).map_err(|e| chip_error(path, e))?;
    Ok(Some(Chip::Sim(Arc::new(sim))))
}

/// Whether `path` names an existing device rather than a file to create (a `nanddump:` name is
/// never a new image).
pub(crate) fn exists(path: &Path) -> bool {
    path.exists() || path.to_str().is_some_and(|p| p.starts_with("nanddump:"))
}

/// A dump named `FILE[?key=value&...]` (see the module docs).
fn open_dump(spec: &str, how: Use) -> Result<Chip, CliError> {
    let name = DeviceName::parse(spec).map_err(CliError::usage)?;
    let path = Path::new(name.file);
    let storage = open_file(path, how)?;
    let dump = DumpFlash::open(Box::new(storage), name.geometry, name.layout)
        .map_err(|e| chip_error(path, e))?;
    Ok(Chip::Dump(Arc::new(dump)))
}

/// The raw flash at `path`, which must be one; its data is read (shared lock) or written
/// (exclusive lock).
pub(crate) fn require_chip(path: &Path, read_only: bool) -> Result<Chip, CliError> {
    let how = if read_only { Use::Read } else { Use::Write };
    open_chip(path, how)?.ok_or_else(|| CliError {
        code: Code::Device,
        message: format!(
            "{} is not a flash device (a NAND image made by 'sectorcrypt flash format', \
             /dev/mtdN, or nanddump:FILE)",
            path.display()
        ),
    })
}

/// Where the LUKS header of `path` is: the header area of an encrypted flash, or the file.
/// While a flash is being converted, its header is read-only: a key change would rewrite the
/// blocks whose journal the conversion is using. Read, it takes no lock (as `cryptsetup
/// luksDump` reads an active device); written, an exclusive one.
pub(crate) fn open_header(path: &Path, read_only: bool) -> Result<Box<dyn Storage>, CliError> {
    if let Some(image) = crate::device::rbd(path, !read_only) {
        return image;
    }
    let how = if read_only { Use::Header } else { Use::Write };
    match open_chip(path, how)? {
        Some(chip) => {
            let h = sectorcrypt_flashvol::read_header(chip.flash())?;
            match h.params.conversion {
                Some(stage) if !read_only => {
                    Err(sectorcrypt_flashvol::Error::Converting(stage).into())
                }
                _ => Ok(Box::new(h.area)),
            }
        }
        None => Ok(Box::new(open_file(path, how)?)),
    }
}

/// An encrypted-flash error as the user sees it: no such header is a wrong device (4), a wrong
/// passphrase is 2 (through the LUKS error), the rest 1.
impl From<FlashVolError> for CliError {
    fn from(e: FlashVolError) -> Self {
        match e {
            FlashVolError::Luks(l) => l.into(),
            FlashVolError::NotEncrypted(_) | FlashVolError::Geometry(_) => CliError {
                code: Code::Device,
                message: e.to_string(),
            },
            FlashVolError::Converting(_) => CliError {
                code: Code::Busy,
                message: e.to_string(),
            },
            other => CliError::usage(crate::exit::chain(&other)),
        }
    }
}
