//! Which devices are raw flash: a simulated NAND image (recognised by its magic), a Linux MTD
//! character device (`/dev/mtdN`), or a raw dump in `nanddump`'s layout named as
//! `nanddump:FILE[?peb=SIZE&page=SIZE&subpage=SIZE&oob=SIZE&layout=data|oob]` (a dump does not
//! say its geometry: the defaults are the default SLC chip's, 128 KiB / 2048 / 512 / 64, data
//! only). On such a device the LUKS commands work on the encrypted flash's header area, the same
//! code as on a file.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Arc;

use sectorcrypt_flash::dump::{DumpFlash, Layout};
use sectorcrypt_flash::mtd::MtdFlash;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_flashvol::Error as FlashVolError;
use sectorcrypt_storage::{FileStorage, Storage};

use crate::exit::{CliError, Code};

/// The device at `path`: exit 4 if it is missing or cannot be opened as asked.
fn missing(path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError {
        code: Code::Device,
        message: format!(
            "Device {} does not exist or access denied ({e}).",
            path.display()
        ),
    }
}

/// `path` as a file (read-only or writable).
pub(crate) fn open_file(path: &Path, read_only: bool) -> Result<FileStorage, CliError> {
    let opened = if read_only {
        FileStorage::open_read_only(path)
    } else {
        FileStorage::open(path)
    };
    opened.map_err(|e| missing(path, e))
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
    CliError {
        code: Code::Device,
        message: format!("{}: {e}", path.display()),
    }
}

/// The raw flash at `path`, if it is one (`None`: an ordinary file or block device).
pub(crate) fn open_chip(path: &Path, read_only: bool) -> Result<Option<Chip>, CliError> {
    if path.to_str().is_some_and(|p| p.starts_with("rbd:")) {
        return Ok(None);
    }
    if let Some(spec) = path.to_str().and_then(|p| p.strip_prefix("nanddump:")) {
        return open_dump(spec, read_only).map(Some);
    }
    let meta = std::fs::metadata(path).map_err(|e| missing(path, e))?;
    if meta.file_type().is_char_device() {
        let mtd = MtdFlash::open(path, read_only).map_err(|e| chip_error(path, e))?;
        return Ok(Some(Chip::Mtd(Arc::new(mtd))));
    }
    let file = open_file(path, read_only)?;
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
fn open_dump(spec: &str, read_only: bool) -> Result<Chip, CliError> {
    let (file, query) = spec.split_once('?').unwrap_or((spec, ""));
    let d = Geometry::default();
    let (mut g, mut layout) = (d, Layout::DataOnly);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let bad = || {
            CliError::usage(format!(
                "nanddump:{spec}: '{pair}' is not KEY=VALUE (peb, page, subpage, oob, layout)"
            ))
        };
        let (key, value) = pair.split_once('=').ok_or_else(bad)?;
        let size = || -> Result<u32, CliError> {
            crate::units::parse_size(value)
                .ok()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(bad)
        };
        match key {
            "peb" => g.peb_size = size()?,
            "page" => g.page_size = size()?,
            "subpage" => g.sub_page_size = size()?,
            "oob" => g.oob_size = size()?,
            "layout" if value == "data" => layout = Layout::DataOnly,
            "layout" if value == "oob" => layout = Layout::WithOob,
            _ => return Err(bad()),
        }
    }
    g.nop = (g.page_size / g.sub_page_size.max(1)).clamp(1, 255) as u8;
    let path = Path::new(file);
    let storage = open_file(path, read_only)?;
    let dump = DumpFlash::open(Box::new(storage), g, layout).map_err(|e| chip_error(path, e))?;
    Ok(Chip::Dump(Arc::new(dump)))
}

/// The raw flash at `path`, if it is one.
pub(crate) fn open_flash(path: &Path, read_only: bool) -> Result<Option<Arc<dyn Flash>>, CliError> {
    Ok(open_chip(path, read_only)?.map(|c| c.flash()))
}

/// The raw flash at `path`, which must be one.
pub(crate) fn require_chip(path: &Path, read_only: bool) -> Result<Chip, CliError> {
    open_chip(path, read_only)?.ok_or_else(|| CliError {
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
/// blocks whose journal the conversion is using.
pub(crate) fn open_header(path: &Path, read_only: bool) -> Result<Box<dyn Storage>, CliError> {
    if let Some(image) = crate::device::rbd(path, !read_only) {
        return image;
    }
    match open_flash(path, read_only)? {
        Some(flash) => {
            let h = sectorcrypt_flashvol::read_header(flash)?;
            match h.params.conversion {
                Some(stage) if !read_only => {
                    Err(sectorcrypt_flashvol::Error::Converting(stage).into())
                }
                _ => Ok(Box::new(h.area)),
            }
        }
        None => Ok(Box::new(open_file(path, read_only)?)),
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
