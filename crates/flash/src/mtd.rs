//! A Linux MTD character device (`/dev/mtdN`) as a chip: the real NAND under the flash stack.
//!
//! # How the device is driven
//!
//! Data goes through `pread`/`pwrite` on the character device, everything else through MTD's
//! ioctls: `MEMGETINFO` (the shape), `MEMERASE64`, `MEMGETBADBLOCK`/`MEMSETBADBLOCK` and
//! `MEMREADOOB64`. The device stays in its default file mode (ECC on, no `MTD_FILE_MODE_RAW`), so
//! the controller corrects bit-flips and the kernel counts them.
//!
//! The geometry is `MEMGETINFO`'s eraseblock, page (`writesize`) and spare sizes, completed from
//! sysfs (`/sys/class/mtd/mtdN/`, where libmtd reads it too): `subpagesize`, which `MEMGETINFO`
//! lacks (without it the page is the sub-page and NOP is 1, the safe guess), and `size`, which
//! `MEMGETINFO` truncates to 32 bits on devices of 4 GiB and more. NOP is not reported by MTD at
//! all: it is taken as the number of sub-pages per page, which is what the kernel lets UBI do.
//!
//! # Bit-flips: the ECC counters, not the read's result
//!
//! Inside the kernel `mtd_read` answers `-EUCLEAN` (corrected, UBI scrubs the block) or `-EBADMSG`
//! (uncorrectable), but the character device swallows both: `mtdchar_read` copies the data out
//! and returns success, "for our userspace tools it is important to dump areas with ECC errors".
//! So, as `nanddump` does, each page is read between two `ECCGETSTATS` calls and the counters say
//! what happened: a rise of `failed` is [`Error::Uncorrectable`] (the buffer holds the data the
//! kernel returned, as the trait asks), a rise of `corrected` is a [`ReadStatus`] with that many
//! corrected bits when it reaches the device's `bitflip_threshold` (sysfs), the point from which
//! the kernel's `mtd_read` says `-EUCLEAN`. The counter is the sum over the page's ECC steps where
//! the kernel compares the worst step, so a page may be reported a little earlier than UBI in the
//! kernel would: a block scrubbed early, never late. Should a read nonetheless fail with
//! `EUCLEAN` or `EBADMSG` itself, the errno is taken at its MTD meaning.
//!
//! The counters belong to the device, not to the file: reads in this process are serialized
//! around them, but another process reading the same device at the same moment can lend a read
//! its bit-flips. Give the flash stack the device to itself (as the kernel's UBI has it). Linux
//! 5.19's `MEMREAD` ioctl returns per-request counters and would close that gap; it is not used
//! because older kernels lack it.
//!
//! # Programs, erases, bad blocks
//!
//! Programs are whole sub-pages ([`Geometry::check_program`], the rule every backend shares, and
//! the kernel's own `-EINVAL` otherwise) and go one page per `pwrite`, so that a failure (`EIO`)
//! names its page ([`Error::ProgramFailed`]); an erase that fails (`EIO`) is
//! [`Error::EraseFailed`]. Blocks marked bad are refused with [`Error::BadBlock`] before the
//! kernel is asked, as the other backends do. A NAND program or erase is durable when it returns
//! (there is no cache above the chip), so [`Flash::sync`] has nothing to do. A device opened
//! read-only refuses programs, erases and bad-block marks before they reach the kernel.
//!
//! NOP and page order are the chip's business here: unlike the simulated chip, nothing records
//! past programs, and the chip (or its driver) answers a broken rule as it does.
//!
//! A bad-block mark writes a marker into the block's first spare area; on a block too worn to
//! program that write fails (`EIO`) while the kernel has already marked the block in its
//! bad-block table, which every later query answers from: the mark then counts as done.
//!
//! # Where it is tested
//!
//! The ioctl numbers and structure layouts are checked against the kernel's headers by a C
//! program, and opening is tried on files and devices that are not MTD. Every call runs on a
//! real kernel in the CLI's test `tests/cli/mtd.rs`: `scripts/kernel-oracle-mtd.sh` boots
//! Debian's kernel under QEMU and drives nandsim's `/dev/mtd0` through the `flash` commands in
//! three geometries (2 KiB pages with 512-byte sub-pages, 4 KiB pages with 1 KiB sub-pages, an
//! MLC chip without sub-pages), with blocks bad from the start, failing their erase and failing
//! a program, random bit-flips (seen through the counters, then scrubbed), spare areas read
//! back, and a power cut (the process killed mid-write, nandsim's chip kept). The crate's own
//! tests also try a device named in `SECTORCRYPT_TEST_MTD` (read-only calls only).
//!
//! This is the one module of the crate with `unsafe`: the ioctl calls, each with its SAFETY
//! comment, all in its `sys` module.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use rustix::io::Errno;

use crate::{Error, Flash, Geometry, ReadStatus};

use sys::{EccStats, MtdInfo};

/// The character devices' major number (`MTD_CHAR_MAJOR`); minor 2N is `mtdN`, 2N+1 `mtdNro`.
const MTD_CHAR_MAJOR: u32 = 90;
/// `MTD_NANDFLASH`: SLC NAND.
const MTD_NANDFLASH: u8 = 4;
/// `MTD_MLCNANDFLASH`: MLC (and TLC) NAND.
const MTD_MLCNANDFLASH: u8 = 8;

/// A Linux MTD NAND device, opened through its character device (see the module docs).
pub struct MtdFlash {
    file: File,
    path: PathBuf,
    geometry: Geometry,
    read_only: bool,
    /// Corrected bits in a page from which a read reports them (sysfs `bitflip_threshold`).
    bitflip_threshold: u32,
    /// Held across each page read and the ECC counters around it.
    reading: Mutex<()>,
    /// The device lock, once [`MtdFlash::locked`] took it.
    lock: Option<sectorcrypt_storage::DeviceLock>,
}

/// What sysfs adds to `MEMGETINFO` (`None` where the attribute is missing).
#[derive(Clone, Copy, Debug, Default)]
struct Sysfs {
    /// `size`: the device's exact byte count.
    size: Option<u64>,
    /// `subpagesize`.
    sub_page_size: Option<u32>,
    /// `bitflip_threshold`.
    bitflip_threshold: Option<u32>,
}

impl Sysfs {
    /// The attributes of MTD device number `n`.
    fn read(n: u32) -> Sysfs {
        let dir = PathBuf::from(format!("/sys/class/mtd/mtd{n}"));
        let number = |name: &str| -> Option<u64> {
            std::fs::read_to_string(dir.join(name))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Sysfs {
            size: number("size"),
            sub_page_size: number("subpagesize").and_then(|v| u32::try_from(v).ok()),
            bitflip_threshold: number("bitflip_threshold").and_then(|v| u32::try_from(v).ok()),
        }
    }
}

/// What an MTD device of type `kind` is, for a refusal.
fn kind_name(kind: u8) -> String {
    match kind {
        0 => "an absent MTD device (type 0)".into(),
        1 => "a RAM MTD device (type 1)".into(),
        2 => "a ROM MTD device (type 2)".into(),
        3 => "a NOR flash MTD device (type 3)".into(),
        6 => "a DataFlash MTD device (type 6)".into(),
        7 => "a UBI volume emulated as MTD (gluebi, type 7)".into(),
        k => format!("an MTD device of unknown type {k}"),
    }
}

/// The geometry of a NAND MTD device that `MEMGETINFO` describes as `info`, completed by
/// `sysfs`; the reason (without the device's name) if it is not NAND or not a shape this crate
/// handles.
fn geometry_of(info: &MtdInfo, sysfs: &Sysfs) -> Result<Geometry, String> {
    if info.kind != MTD_NANDFLASH && info.kind != MTD_MLCNANDFLASH {
        return Err(format!(
            "it is {}, not NAND flash (SLC or MLC)",
            kind_name(info.kind)
        ));
    }
    let size = sysfs.size.unwrap_or(u64::from(info.size));
    if info.erasesize == 0 || !size.is_multiple_of(u64::from(info.erasesize)) {
        return Err(format!(
            "its {size} bytes are not a whole number of {}-byte eraseblocks",
            info.erasesize
        ));
    }
    let peb_count = u32::try_from(size / u64::from(info.erasesize))
        .map_err(|_| format!("its {size} bytes are too many eraseblocks"))?;
    let sub_page_size = sysfs.sub_page_size.unwrap_or(info.writesize);
    let pieces = info
        .writesize
        .checked_div(sub_page_size)
        .unwrap_or(0)
        .max(1);
    let nop = u8::try_from(pieces)
        .map_err(|_| format!("{pieces} sub-pages per page is more than this crate handles"))?;
    let geometry = Geometry {
        peb_size: info.erasesize,
        page_size: info.writesize,
        sub_page_size,
        oob_size: info.oobsize,
        peb_count,
        nop,
    };
    geometry.validate().map_err(|e| format!("{e}"))?;
    Ok(geometry)
}

/// An operation, for reading its errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Program,
    Erase,
    /// Any other call (spare reads, bad-block queries and marks, `MEMGETINFO`).
    Other,
}

/// What a failed call's errno means in MTD's conventions (those UBI reads in the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// `EUCLEAN` on a read: corrected bit-flips, the data is good.
    Corrected,
    /// `EBADMSG` on a read: uncorrectable bit-flips, the buffer holds what the chip gave.
    Uncorrectable,
    /// `EIO` on a program.
    ProgramFailed,
    /// `EIO` on an erase.
    EraseFailed,
    /// `ENOTTY`: the file does not know MTD's ioctls.
    NotMtd,
    /// Anything else: an I/O error as such.
    Other,
}

/// The meaning of `errno` (from `io::Error::raw_os_error`) as the result of `op`.
fn outcome(op: Op, errno: Option<i32>) -> Outcome {
    let Some(errno) = errno.map(Errno::from_raw_os_error) else {
        return Outcome::Other;
    };
    match (op, errno) {
        (Op::Read, Errno::UCLEAN) => Outcome::Corrected,
        (Op::Read, Errno::BADMSG) => Outcome::Uncorrectable,
        (Op::Program, Errno::IO) => Outcome::ProgramFailed,
        (Op::Erase, Errno::IO) => Outcome::EraseFailed,
        (_, Errno::NOTTY) => Outcome::NotMtd,
        _ => Outcome::Other,
    }
}

/// What the ECC counters moving from `before` to `after` across one page's read say: the
/// corrected bits to report (none below `threshold`) and whether the page was uncorrectable.
/// The counters are `u32` and wrap.
fn ecc_outcome(before: &EccStats, after: &EccStats, threshold: u32) -> (u32, bool) {
    let corrected = after.corrected.wrapping_sub(before.corrected);
    let failed = after.failed != before.failed;
    let reported = if corrected >= threshold.max(1) {
        corrected
    } else {
        0
    };
    (reported, failed)
}

/// `e`, met doing `what` on `device`, as an [`Error::Io`] that names both.
fn io_error(what: &str, device: &Path, e: io::Error) -> Error {
    Error::Io(io::Error::new(
        e.kind(),
        format!("{}: {what}: {e}", device.display()),
    ))
}

/// The refusal of `device`, which is `what`.
fn not_mtd(device: &Path, what: &str) -> Error {
    Error::Format(format!(
        "{} is {what}, not an MTD character device (/dev/mtdN)",
        device.display()
    ))
}

/// The minor number of `file`, opened from `device`, if it is an MTD character device.
fn mtd_minor(device: &Path, file: &File) -> Result<u32, Error> {
    let meta = file.metadata().map_err(|e| io_error("stat", device, e))?;
    let kind = meta.file_type();
    if !kind.is_char_device() {
        let what = if kind.is_file() {
            "a regular file"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_block_device() {
            "a block device"
        } else {
            "not a device"
        };
        return Err(not_mtd(device, what));
    }
    let (major, minor) = (
        rustix::fs::major(meta.rdev()),
        rustix::fs::minor(meta.rdev()),
    );
    // Only MTD's own driver is sent MTD's ioctls: another driver may give the numbers a meaning
    // of its own.
    if major != MTD_CHAR_MAJOR {
        let what = format!("a character device {major}:{minor} (MTD's major is {MTD_CHAR_MAJOR})");
        return Err(not_mtd(device, &what));
    }
    Ok(minor)
}

impl MtdFlash {
    /// This device with a lock (`sectorcrypt_storage::lock`) held for as long as it is open:
    /// exclusive for a writer, shared for a reader of its data. [`Error::Io`] of kind
    /// `ResourceBusy`, naming the holder, while another process holds a conflicting one.
    pub fn locked(mut self, access: sectorcrypt_storage::Access) -> Result<MtdFlash, Error> {
        self.lock = sectorcrypt_storage::lock::lock(&self.file, &self.path, access)?;
        Ok(self)
    }

    /// Open the MTD character device at `path` (`/dev/mtdN`), read-only or for writing.
    ///
    /// Errors: [`Error::Format`] for anything that is not the character device of a NAND MTD
    /// device of a shape [`Geometry::validate`] accepts (the message says what it is);
    /// [`Error::Io`] when it cannot be opened or asked.
    pub fn open(path: &Path, read_only: bool) -> Result<MtdFlash, Error> {
        let how = if read_only {
            "open for reading"
        } else {
            "open for writing"
        };
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|e| io_error(how, path, e))?;
        let minor = mtd_minor(path, &file)?;
        let info = sys::get_info(file.as_fd()).map_err(|e| {
            match outcome(Op::Other, Some(e.raw_os_error())) {
                Outcome::NotMtd => not_mtd(path, "a character device that refuses MEMGETINFO"),
                _ => io_error("MEMGETINFO", path, e.into()),
            }
        })?;
        let sysfs = Sysfs::read(minor >> 1);
        let geometry = geometry_of(&info, &sysfs)
            .map_err(|why| Error::Format(format!("{} cannot be used: {why}", path.display())))?;
        // The counters must answer before reads depend on them.
        sys::ecc_stats(file.as_fd()).map_err(|e| io_error("ECCGETSTATS", path, e.into()))?;
        Ok(MtdFlash {
            file,
            path: path.to_path_buf(),
            geometry,
            read_only,
            bitflip_threshold: sysfs.bitflip_threshold.unwrap_or(1),
            reading: Mutex::new(()),
            lock: None,
        })
    }

    /// The device's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Byte offset of `offset` in eraseblock `peb` on the device.
    fn at(&self, peb: u32, offset: u32) -> u64 {
        u64::from(peb) * u64::from(self.geometry.peb_size) + u64::from(offset)
    }

    /// `e` with what was being done, for an [`Error::Io`].
    fn io(&self, what: &str, e: io::Error) -> Error {
        io_error(what, &self.path, e)
    }

    /// Refuse a change to a device opened read-only.
    fn writable(&self, what: &str) -> Result<(), Error> {
        if self.read_only {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!("{} was opened read-only: no {what}", self.path.display()),
            )));
        }
        Ok(())
    }

    fn ecc_stats(&self) -> Result<EccStats, Error> {
        sys::ecc_stats(self.file.as_fd()).map_err(|e| self.io("ECCGETSTATS", e.into()))
    }

    /// Read `buf` from `offset` of `peb`, inside one page: corrected bits to report, or
    /// whether the page was uncorrectable.
    fn read_page(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<(u32, bool), Error> {
        let before = self.ecc_stats()?;
        let read = self.file.read_exact_at(buf, self.at(peb, offset));
        let after = self.ecc_stats()?;
        let (corrected, failed) = ecc_outcome(&before, &after, self.bitflip_threshold);
        match read {
            Ok(()) => Ok((corrected, failed)),
            Err(e) => match outcome(Op::Read, e.raw_os_error()) {
                Outcome::Corrected => Ok((corrected.max(1), failed)),
                Outcome::Uncorrectable => Ok((corrected, true)),
                _ => Err(self.io("read", e)),
            },
        }
    }

    fn check_good(&self, peb: u32) -> Result<(), Error> {
        if self.is_bad(peb)? {
            return Err(Error::BadBlock(peb));
        }
        Ok(())
    }
}

impl Flash for MtdFlash {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, Error> {
        let g = self.geometry;
        g.check_range(peb, offset, buf.len())?;
        // The counters are the device's: one page read (and its pair of counts) at a time.
        let _reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        let mut status = ReadStatus::default();
        let mut failed = None;
        let mut done = 0;
        for (at, n) in g.page_pieces(offset, buf.len()) {
            let (corrected, uncorrectable) = self.read_page(peb, at, &mut buf[done..done + n])?;
            status.corrected = status.corrected.max(corrected);
            if uncorrectable {
                failed.get_or_insert(Error::Uncorrectable {
                    peb,
                    page: at / g.page_size,
                });
            }
            done += n;
        }
        failed.map_or(Ok(status), Err)
    }

    fn program(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        let g = self.geometry;
        g.check_program(peb, offset, data.len())?;
        self.writable("program")?;
        if data.is_empty() {
            return Ok(());
        }
        self.check_good(peb)?;
        let mut done = 0;
        for (at, n) in g.page_pieces(offset, data.len()) {
            let page = at / g.page_size;
            self.file
                .write_all_at(&data[done..done + n], self.at(peb, at))
                .map_err(|e| match outcome(Op::Program, e.raw_os_error()) {
                    Outcome::ProgramFailed => Error::ProgramFailed { peb, page },
                    _ => self.io(&format!("program of page {page} of eraseblock {peb}"), e),
                })?;
            done += n;
        }
        Ok(())
    }

    fn erase(&self, peb: u32) -> Result<(), Error> {
        self.geometry.check_range(peb, 0, 0)?;
        self.writable("erase")?;
        self.check_good(peb)?;
        sys::erase(
            self.file.as_fd(),
            self.at(peb, 0),
            self.geometry.peb_size.into(),
        )
        .map_err(|e| match outcome(Op::Erase, Some(e.raw_os_error())) {
            Outcome::EraseFailed => Error::EraseFailed(peb),
            _ => self.io(&format!("erase of eraseblock {peb}"), e.into()),
        })
    }

    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), Error> {
        let g = self.geometry;
        g.check_oob(peb, page, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let what = || format!("spare read of page {page} of eraseblock {peb}");
        // A spare read may move the ECC counters too: not while a data read watches them.
        let _reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        let got = sys::read_oob(self.file.as_fd(), self.at(peb, page * g.page_size), buf)
            .map_err(|e| self.io(&what(), e.into()))?;
        if got != buf.len() {
            return Err(self.io(
                &what(),
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{got} of {} spare bytes came back", buf.len()),
                ),
            ));
        }
        Ok(())
    }

    fn is_bad(&self, peb: u32) -> Result<bool, Error> {
        self.geometry.check_range(peb, 0, 0)?;
        sys::is_bad(self.file.as_fd(), self.at(peb, 0))
            .map_err(|e| self.io(&format!("bad-block query of eraseblock {peb}"), e.into()))
    }

    fn mark_bad(&self, peb: u32) -> Result<(), Error> {
        self.geometry.check_range(peb, 0, 0)?;
        self.writable("bad-block mark")?;
        match sys::mark_bad(self.file.as_fd(), self.at(peb, 0)) {
            Ok(()) => Ok(()),
            // A block too worn to program fails the marker's write into its spare area (EIO),
            // yet the kernel has marked it in its bad-block table, which is what every later
            // query answers from.
            Err(_) if self.is_bad(peb)? => Ok(()),
            Err(e) => Err(self.io(&format!("marking eraseblock {peb} bad"), e.into())),
        }
    }

    fn sync(&self) -> Result<(), Error> {
        // A NAND program or erase is done when its call returns: nothing is held back.
        Ok(())
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }
}

/// MTD's kernel ABI (`include/uapi/mtd/mtd-abi.h`): the structures, the ioctl numbers and the
/// calls, the only `unsafe` of the crate.
mod sys {
    use std::ffi::c_void;
    use std::mem::size_of;
    use std::os::fd::BorrowedFd;

    use rustix::io::Errno;
    use rustix::ioctl::{ioctl, Ioctl, IoctlOutput, Opcode, RawOpcode};

    /// `struct mtd_info_user`, what `MEMGETINFO` fills in.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(super) struct MtdInfo {
        /// `type`: `MTD_NANDFLASH`, `MTD_NORFLASH`...
        pub(super) kind: u8,
        pub(super) flags: u32,
        /// Bytes of the device, truncated to 32 bits.
        pub(super) size: u32,
        pub(super) erasesize: u32,
        pub(super) writesize: u32,
        pub(super) oobsize: u32,
        /// Obsolete, always 0.
        pub(super) padding: u64,
    }

    /// `struct mtd_ecc_stats`, the device's ECC counters (`ECCGETSTATS`).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(super) struct EccStats {
        /// Bits corrected so far.
        pub(super) corrected: u32,
        /// Uncorrectable ECC errors so far.
        pub(super) failed: u32,
        pub(super) badblocks: u32,
        pub(super) bbtblocks: u32,
    }

    /// `struct erase_info_user64` (`MEMERASE64`).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub(super) struct EraseInfo64 {
        pub(super) start: u64,
        pub(super) length: u64,
    }

    /// `struct mtd_oob_buf64` (`MEMREADOOB64`): the kernel writes `length` spare bytes at
    /// `usr_ptr`, then the count it wrote into `length`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub(super) struct OobBuf64 {
        pub(super) start: u64,
        pub(super) pad: u32,
        pub(super) length: u32,
        pub(super) usr_ptr: u64,
    }

    /// Whether this architecture encodes ioctl numbers as `include/uapi/asm-generic/ioctl.h`
    /// does (number, type, size, direction from the low bits up, 14 size bits, write = 1): all
    /// but MIPS, PowerPC and SPARC, whose own `asm/ioctl.h` have 13 size bits and write = 4.
    const GENERIC_IOC: bool = !cfg!(any(
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "sparc",
        target_arch = "sparc64"
    ));
    const WRITE: u32 = if GENERIC_IOC { 1 } else { 4 };
    const READ: u32 = 2;
    const SIZE_BITS: u32 = if GENERIC_IOC { 14 } else { 13 };
    const TYPE_SHIFT: u32 = 8;
    const SIZE_SHIFT: u32 = 16;
    const DIR_SHIFT: u32 = SIZE_SHIFT + SIZE_BITS;

    /// `_IOC(dir, ty, nr, size)`.
    pub(super) const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
        assert!(
            size < 1 << SIZE_BITS,
            "an ioctl argument too large to encode"
        );
        (dir << DIR_SHIFT) | ((size as u32) << SIZE_SHIFT) | ((ty as u32) << TYPE_SHIFT) | nr as u32
    }

    /// The argument size a request number carries.
    const fn size_field(request: u32) -> usize {
        ((request >> SIZE_SHIFT) & ((1 << SIZE_BITS) - 1)) as usize
    }

    /// MTD's ioctl type.
    const MTD: u8 = b'M';
    /// `_IOR('M', 1, struct mtd_info_user)`.
    pub(super) const MEMGETINFO: u32 = ioc(READ, MTD, 1, size_of::<MtdInfo>());
    /// `_IOW('M', 11, __kernel_loff_t)`.
    pub(super) const MEMGETBADBLOCK: u32 = ioc(WRITE, MTD, 11, size_of::<i64>());
    /// `_IOW('M', 12, __kernel_loff_t)`.
    pub(super) const MEMSETBADBLOCK: u32 = ioc(WRITE, MTD, 12, size_of::<i64>());
    /// `_IOR('M', 18, struct mtd_ecc_stats)`.
    pub(super) const ECCGETSTATS: u32 = ioc(READ, MTD, 18, size_of::<EccStats>());
    /// `_IOW('M', 20, struct erase_info_user64)`.
    pub(super) const MEMERASE64: u32 = ioc(WRITE, MTD, 20, size_of::<EraseInfo64>());
    /// `_IOWR('M', 22, struct mtd_oob_buf64)`.
    pub(super) const MEMREADOOB64: u32 = ioc(READ | WRITE, MTD, 22, size_of::<OobBuf64>());

    /// Request `REQ` with a pointer to a `T` as its argument; the call answers the ioctl's
    /// return value. That the request's size field is `T`'s size is checked when compiled.
    struct Call<'a, T, const REQ: u32> {
        arg: &'a mut T,
    }

    impl<T, const REQ: u32> Call<'_, T, REQ> {
        const SIZE_MATCHES: () = assert!(size_field(REQ) == size_of::<T>());
    }

    // SAFETY: `as_ptr` points at the `T` borrowed mutably for the call's whole duration, so the
    // kernel reads and writes live memory of the size the request declares (SIZE_MATCHES);
    // `output_from_ptr` only passes the return value on.
    unsafe impl<T, const REQ: u32> Ioctl for Call<'_, T, REQ> {
        type Output = IoctlOutput;

        const OPCODE: Opcode = {
            let () = Self::SIZE_MATCHES;
            Opcode::old(REQ as RawOpcode)
        };
        const IS_MUTATING: bool = true;

        fn as_ptr(&mut self) -> *mut c_void {
            std::ptr::from_mut(self.arg).cast()
        }

        unsafe fn output_from_ptr(
            out: IoctlOutput,
            _: *mut c_void,
        ) -> rustix::io::Result<IoctlOutput> {
            Ok(out)
        }
    }

    /// `MEMGETINFO`.
    pub(super) fn get_info(fd: BorrowedFd<'_>) -> Result<MtdInfo, Errno> {
        let mut info = MtdInfo::default();
        // SAFETY: MEMGETINFO writes one `struct mtd_info_user`, which `MtdInfo` is (layout
        // checked against the C header by the tests); a driver that is not MTD refuses the
        // number (the caller checked the major first).
        unsafe { ioctl(fd, Call::<_, MEMGETINFO> { arg: &mut info }) }?;
        Ok(info)
    }

    /// `ECCGETSTATS`.
    pub(super) fn ecc_stats(fd: BorrowedFd<'_>) -> Result<EccStats, Errno> {
        let mut stats = EccStats::default();
        // SAFETY: ECCGETSTATS writes one `struct mtd_ecc_stats`, which `EccStats` is.
        unsafe { ioctl(fd, Call::<_, ECCGETSTATS> { arg: &mut stats }) }?;
        Ok(stats)
    }

    /// `MEMERASE64` of `length` bytes from `start`.
    pub(super) fn erase(fd: BorrowedFd<'_>, start: u64, length: u64) -> Result<(), Errno> {
        let mut req = EraseInfo64 { start, length };
        // SAFETY: MEMERASE64 reads one `struct erase_info_user64`, which `EraseInfo64` is; it
        // holds no pointer.
        unsafe { ioctl(fd, Call::<_, MEMERASE64> { arg: &mut req }) }?;
        Ok(())
    }

    /// `MEMGETBADBLOCK` of the block at byte `offset`.
    pub(super) fn is_bad(fd: BorrowedFd<'_>, offset: u64) -> Result<bool, Errno> {
        let mut offset = offset as i64;
        // SAFETY: MEMGETBADBLOCK reads one `loff_t` (an `i64`) and answers in its return value.
        let bad = unsafe { ioctl(fd, Call::<_, MEMGETBADBLOCK> { arg: &mut offset }) }?;
        Ok(bad > 0)
    }

    /// `MEMSETBADBLOCK` of the block at byte `offset`.
    pub(super) fn mark_bad(fd: BorrowedFd<'_>, offset: u64) -> Result<(), Errno> {
        let mut offset = offset as i64;
        // SAFETY: MEMSETBADBLOCK reads one `loff_t` (an `i64`).
        unsafe { ioctl(fd, Call::<_, MEMSETBADBLOCK> { arg: &mut offset }) }?;
        Ok(())
    }

    /// `MEMREADOOB64`: the spare bytes of the page at byte `start` into `buf`; how many came.
    pub(super) fn read_oob(fd: BorrowedFd<'_>, start: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let length = u32::try_from(buf.len()).map_err(|_| Errno::INVAL)?;
        let mut req = OobBuf64 {
            start,
            pad: 0,
            length,
            usr_ptr: buf.as_mut_ptr() as u64,
        };
        // SAFETY: MEMREADOOB64 reads and writes one `struct mtd_oob_buf64`, which `OobBuf64`
        // is, and writes at most `length` bytes at `usr_ptr`: `buf`, exactly that long and
        // borrowed mutably until the call returns.
        unsafe { ioctl(fd, Call::<_, MEMREADOOB64> { arg: &mut req }) }?;
        Ok((req.length as usize).min(buf.len()))
    }
}

#[cfg(test)]
mod tests;
