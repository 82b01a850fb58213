//! UBI (Unsorted Block Images) on a raw flash device, as Linux's `drivers/mtd/ubi/` does it and
//! bit-exact with it, so that images move between sectorcrypt, mtd-utils, ubi_reader and a kernel.
//!
//! UBI turns a NAND chip's physical eraseblocks (PEBs), which wear out, go bad and must be
//! erased before they are written again, into volumes of logical eraseblocks (LEBs) that any PEB
//! can hold: the map lives in the headers on flash (an erase-counter header and a volume-ID
//! header at the start of every PEB) and is rebuilt by scanning at attach.
//!
//! The modules follow the kernel's files, each one job:
//!
//! - [`media`]: the on-flash headers and volume table, and where they sit in a PEB (`ubi-media.h`);
//! - `io`: the one place that touches the flash (`io.c`);
//! - `attach`: scanning at attach (`attach.c`);
//! - `vtbl`: the volume table in the layout volume (`vtbl.c`);
//! - `wl`: the PEB pool, erase counters, bad PEBs, wear-levelling choices (`wl.c`);
//! - `eba`: LEB read, write, map, unmap, atomic change, move (`eba.c`);
//! - `vmt`: volume create, remove, resize, rename, update (`vmt.c`, `upd.c`);
//! - `device`: attaching and reserving PEBs (`build.c`);
//! - [`flash_image`]: writing a `ubinize` image as `ubiformat -f` does;
//! - [`block`]: a volume as a `Storage`, for the NBD and FUSE exports.
//!
//! Unlike the kernel, work the kernel leaves to a background thread (erasing PEBs given back,
//! scrubbing, wear-levelling) is done before an operation returns, so an operation that returns
//! has left nothing pending; what it wrote is durable once the flash's [`Flash::sync`] returns
//! ([`Ubi::sync`]).

mod attach;
pub mod block;
mod device;
mod eba;
mod error;
mod flasher;
mod io;
pub mod media;
mod vmt;
mod vtbl;
mod wl;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sectorcrypt_flash::Flash;

pub use error::Error;
pub use flasher::{flash_image, Flashed};
use media::{Layout, VolType, LAYOUT_VOLUME_ID, VTBL_AUTORESIZE_FLG};

/// How to attach (the kernel's `ubiattach` options).
#[derive(Clone, Copy, Debug)]
pub struct AttachOptions {
    /// The VID header offset (`-O`); `None`: the default for the geometry.
    pub vid_hdr_offset: Option<u32>,
    /// PEBs kept per 1024 to replace PEBs that go bad (`-b`, default 20).
    pub max_beb_per1024: u32,
    /// Erase-counter difference that triggers a wear-levelling move (default 4096).
    pub wl_threshold: u64,
    /// Grow a volume marked for auto-resize (as the kernel does at attach; off: leave the mark
    /// for a later attach, e.g. while converting the flash).
    pub autoresize: bool,
    /// Attach for reading only (the flash is open read-only): nothing is written, so PEBs left
    /// to erase (by a power cut) or read with bit-flips stay as they are and a pending
    /// auto-resize waits; changes are refused with [`Error::ReadOnly`].
    pub read_only: bool,
}

impl Default for AttachOptions {
    fn default() -> Self {
        AttachOptions {
            vid_hdr_offset: None,
            max_beb_per1024: 20,
            wl_threshold: 4096,
            autoresize: true,
            read_only: false,
        }
    }
}

/// A volume to create (`ubimkvol`).
#[derive(Clone, Debug)]
pub struct NewVolume {
    /// Its ID (`None`: the first free).
    pub id: Option<u32>,
    /// Its name.
    pub name: String,
    /// Its size in LEBs.
    pub lebs: u32,
    /// Dynamic or static.
    pub vol_type: VolType,
    /// LEB alignment (1: none).
    pub alignment: u32,
    /// Grow over every free PEB at the next attach.
    pub autoresize: bool,
}

/// A volume as `ubinfo` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The ID.
    pub id: u32,
    /// The name.
    pub name: String,
    /// Dynamic or static.
    pub vol_type: VolType,
    /// Its size in LEBs.
    pub lebs: u32,
    /// Bytes a LEB holds.
    pub usable_leb_size: u32,
    /// LEB alignment.
    pub alignment: u32,
    /// Bytes of data: a static volume's contents, a dynamic volume's whole size.
    pub data_bytes: u64,
    /// LEBs mapped to a PEB.
    pub mapped_lebs: u32,
    /// Marked for auto-resize.
    pub autoresize: bool,
    /// An update was cut short, or a static volume misses LEBs or fails its CRC.
    pub corrupted: bool,
}

/// The device as `ubinfo -a` shows it.
#[derive(Clone, Debug)]
pub struct Info {
    /// Where headers and data sit in a PEB.
    pub layout: Layout,
    /// The image sequence number.
    pub image_seq: u32,
    /// PEBs of the flash.
    pub pebs: u32,
    /// PEBs marked bad.
    pub bad_pebs: u32,
    /// PEBs found corrupted and kept.
    pub corrupted_pebs: u32,
    /// PEBs no volume has reserved.
    pub available_pebs: u32,
    /// PEBs kept to replace PEBs that go bad.
    pub reserved_for_bad: u32,
    /// The highest sequence number written so far.
    pub max_sqnum: u64,
    /// Erase counters of the good PEBs: min, mean, max.
    pub erase_counters: (u64, u64, u64),
    /// Read-only (an internal volume asked for it, or no PEB is left to replace a bad one).
    pub read_only: bool,
    /// The user volumes.
    pub volumes: Vec<VolumeInfo>,
}

/// An attached UBI device. Every call takes `&self`; calls are serialised inside.
pub struct Ubi {
    dev: Mutex<device::Device>,
}

impl Ubi {
    /// Attach the UBI on `flash`, formatting it first if it is empty (every good PEB erased), as
    /// the kernel does.
    ///
    /// Errors: [`Error::Refused`] for a flash that holds something else, too many corrupted
    /// PEBs, headers of another geometry or image, or a damaged volume table; [`Error::Flash`].
    pub fn attach(flash: Arc<dyn Flash>, opts: &AttachOptions) -> Result<Ubi, Error> {
        Ok(Ubi {
            dev: Mutex::new(device::Device::attach(flash, opts)?),
        })
    }

    fn dev(&self) -> MutexGuard<'_, device::Device> {
        self.dev.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device and its volumes.
    pub fn info(&self) -> Info {
        let dev = self.dev();
        let volumes = dev
            .vols
            .iter()
            .filter(|(&id, _)| id != LAYOUT_VOLUME_ID)
            .map(|(&id, v)| volume_info(&dev.io.layout, id, v))
            .collect();
        Info {
            layout: dev.io.layout,
            image_seq: dev.io.image_seq,
            pebs: dev.pool.uses.len() as u32,
            bad_pebs: dev.pool.count(wl::Use::Bad),
            corrupted_pebs: dev.corrupted_pebs,
            available_pebs: dev.pool.avail,
            reserved_for_bad: dev.pool.beb_rsvd,
            max_sqnum: dev.sqnum.map_or(u64::MAX, |next| next - 1),
            erase_counters: dev.pool.ec_stats(),
            read_only: dev.pool.read_only,
            volumes,
        }
    }

    /// The volume named `name`.
    pub fn volume_by_name(&self, name: &str) -> Option<VolumeInfo> {
        self.info().volumes.into_iter().find(|v| v.name == name)
    }

    /// The erase counter of each PEB as UBI keeps it (bad PEBs included, at their last value).
    pub fn erase_counters(&self) -> Vec<u64> {
        self.dev().pool.ec.clone()
    }

    /// Create a volume; returns its ID.
    pub fn create_volume(&self, req: &NewVolume) -> Result<u32, Error> {
        self.dev().create(req)
    }

    /// Remove a volume.
    pub fn remove_volume(&self, id: u32) -> Result<(), Error> {
        self.dev().remove(id)
    }

    /// Resize a volume to `lebs` LEBs.
    pub fn resize_volume(&self, id: u32, lebs: u32) -> Result<(), Error> {
        self.dev().resize(id, lebs)
    }

    /// Rename a volume.
    pub fn rename_volume(&self, id: u32, name: &str) -> Result<(), Error> {
        self.dev().rename(id, name)
    }

    /// Replace a volume's whole contents (`ubiupdatevol`).
    pub fn update_volume(&self, id: u32, data: &[u8]) -> Result<(), Error> {
        self.dev().update(id, data)
    }

    /// Read from LEB `lnum` of volume `id` (an unmapped LEB reads 0xFF). A static volume's CRCs
    /// are checked at its first read.
    ///
    /// Errors: [`Error::Corrupt`] for a static volume that fails them or an update cut short.
    pub fn read(&self, id: u32, lnum: u32, offset: u32, buf: &mut [u8]) -> Result<(), Error> {
        let mut dev = self.dev();
        dev.check_volume(user(id)?)?;
        dev.read(id, lnum, offset, buf)?;
        dev.background()
    }

    /// Write to LEB `lnum` of a dynamic volume, into space not written since it was mapped
    /// (offset and length in whole minimum I/O units).
    pub fn write(&self, id: u32, lnum: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        let mut dev = self.dev();
        dev.check_dynamic(user(id)?)?;
        dev.write(id, lnum, offset, data)?;
        dev.background()
    }

    /// Replace LEB `lnum` of a dynamic volume atomically.
    pub fn change(&self, id: u32, lnum: u32, data: &[u8]) -> Result<(), Error> {
        let mut dev = self.dev();
        dev.check_dynamic(user(id)?)?;
        dev.change(id, lnum, data)?;
        dev.background()
    }

    /// Unmap LEB `lnum` of a dynamic volume.
    pub fn unmap(&self, id: u32, lnum: u32) -> Result<(), Error> {
        let mut dev = self.dev();
        dev.check_dynamic(user(id)?)?;
        dev.unmap(id, lnum)?;
        dev.background()
    }

    /// Map LEB `lnum` of a dynamic volume to an erased PEB.
    pub fn map(&self, id: u32, lnum: u32) -> Result<(), Error> {
        let mut dev = self.dev();
        dev.check_dynamic(user(id)?)?;
        dev.map(id, lnum)?;
        dev.background()
    }

    /// Whether LEB `lnum` of volume `id` is mapped.
    pub fn is_mapped(&self, id: u32, lnum: u32) -> Result<bool, Error> {
        let dev = self.dev();
        dev.check_leb(user(id)?, lnum, 0, 0, false)?;
        Ok(dev.vol(id)?.lebs[lnum as usize].is_some())
    }

    /// Move every LEB held below PEB `first` to PEBs at or above it and stop using the PEBs
    /// below it until the next attach (what an in-place conversion needs to make room for a
    /// header); the moves are crash-safe as wear-levelling's are.
    ///
    /// Errors: [`Error::NoSpace`] when fewer PEBs are available than must leave.
    pub fn evacuate(&self, first: u32) -> Result<(), Error> {
        self.dev().evacuate(first)?;
        self.sync()
    }

    /// Make everything written so far durable.
    pub fn sync(&self) -> Result<(), Error> {
        Ok(self.dev().io.flash.sync()?)
    }
}

/// A user volume's ID (the layout volume is UBI's own).
fn user(id: u32) -> Result<u32, Error> {
    if id as usize >= media::MAX_VOLUMES {
        return Err(Error::Volume(format!("volume {id} does not exist")));
    }
    Ok(id)
}

fn volume_info(layout: &Layout, id: u32, v: &device::Vol) -> VolumeInfo {
    let usable = v.usable_leb_size(layout);
    let data_bytes = match v.record.vol_type {
        VolType::Dynamic => u64::from(v.record.reserved_pebs) * u64::from(usable),
        VolType::Static if v.used_ebs == 0 => 0,
        VolType::Static => {
            u64::from(v.used_ebs - 1) * u64::from(usable) + u64::from(v.last_eb_bytes)
        }
    };
    VolumeInfo {
        id,
        name: String::from_utf8_lossy(&v.record.name).into_owned(),
        vol_type: v.record.vol_type,
        lebs: v.record.reserved_pebs,
        usable_leb_size: usable,
        alignment: v.record.alignment,
        data_bytes,
        mapped_lebs: v.lebs.iter().flatten().count() as u32,
        autoresize: v.record.flags & VTBL_AUTORESIZE_FLG != 0,
        corrupted: v.corrupted,
    }
}
