//! A UBI volume as a `Storage` (a block device made of LEBs, like the kernel's `ubiblock`, but
//! writable), so that the NBD and FUSE exports serve UBI volumes as they serve disks.
//!
//! UBI only appends into erased space, and a LEB is rewritten only whole. So a write here reads
//! each LEB it touches, changes the bytes, and replaces the LEB with an atomic change (its
//! trailing erased pages left unwritten, an all-0xFF LEB unmapped): any offset and length work,
//! and after a power cut each LEB holds its old or its new contents. That costs a LEB rewrite
//! per write, which is what makes UBI volumes a poor place for a file system that is not UBIFS
//! (the kernel's `ubiblock` is read-only for that reason); it is here so that ordinary tools can
//! read and change a volume, not for speed. Writes are serialised, so that two writes into one
//! LEB never lose each other's bytes.
//!
//! A static volume is read-only and as long as its data, rounded up to whole 512-byte sectors
//! (the tail reads 0xFF); a dynamic volume is as long as its LEBs.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use sectorcrypt_storage::Storage;

use crate::eba::data_len;
use crate::media::VolType;
use crate::{Error, Ubi};

/// Bytes a static volume is rounded up to.
const SECTOR: u64 = 512;

/// Volume `id` of an attached UBI as a [`Storage`] (see the module docs).
pub struct VolumeStorage {
    ubi: Arc<Ubi>,
    id: u32,
    name: String,
    size: u64,
    usable: u64,
    min_io: usize,
    writable: bool,
    writes: Mutex<()>,
}

fn io_error(e: Error) -> io::Error {
    match e {
        Error::OutOfRange(s) => io::Error::new(io::ErrorKind::InvalidInput, s),
        Error::ReadOnly => io::Error::new(io::ErrorKind::ReadOnlyFilesystem, e.to_string()),
        e => io::Error::other(e),
    }
}

impl VolumeStorage {
    /// Volume `id` of `ubi`, writable if it is dynamic and `read_only` is not set.
    ///
    /// Errors: [`Error::Volume`] if there is no such volume; [`Error::Corrupt`] for a static
    /// volume that fails its CRC or an update cut short.
    pub fn open(ubi: Arc<Ubi>, id: u32, read_only: bool) -> Result<VolumeStorage, Error> {
        let info = ubi.info();
        let Some(v) = info.volumes.iter().find(|v| v.id == id) else {
            return Err(Error::Volume(format!("volume {id} does not exist")));
        };
        // A static volume's CRCs, and an update cut short, are checked now, not at first read.
        ubi.read(id, 0, 0, &mut [])?;
        let usable = u64::from(v.usable_leb_size);
        let size = match v.vol_type {
            VolType::Dynamic => u64::from(v.lebs) * usable,
            VolType::Static => v.data_bytes.div_ceil(SECTOR) * SECTOR,
        };
        Ok(VolumeStorage {
            id,
            name: v.name.clone(),
            size,
            usable,
            min_io: info.layout.min_io_size as usize,
            writable: v.vol_type == VolType::Dynamic && !read_only,
            writes: Mutex::new(()),
            ubi,
        })
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.size)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{len} bytes at offset {offset} run past the end of UBI volume {} ({} bytes)",
                    self.name, self.size
                ),
            ));
        }
        Ok(())
    }

    /// The pieces of `len` bytes at `offset`: (LEB, offset in it, offset in the buffer, length).
    fn pieces(
        &self,
        offset: u64,
        len: usize,
    ) -> impl Iterator<Item = (u32, u32, usize, usize)> + '_ {
        let mut done = 0usize;
        std::iter::from_fn(move || {
            if done == len {
                return None;
            }
            let at = offset + done as u64;
            let within = at % self.usable;
            let n = ((self.usable - within) as usize).min(len - done);
            let piece = ((at / self.usable) as u32, within as u32, done, n);
            done += n;
            Some(piece)
        })
    }

    /// The bytes of LEB `lnum` that the volume has (a static volume's last LEB may be short).
    fn leb_len(&self, lnum: u32) -> usize {
        let start = u64::from(lnum) * self.usable;
        self.usable.min(self.size - start) as usize
    }
}

impl Storage for VolumeStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        for (lnum, at, from, n) in self.pieces(offset, buf.len()) {
            // Past a static volume's data (the rounding to a sector) there is nothing to read.
            let have = (self.leb_len(lnum).min(self.usable as usize)).saturating_sub(at as usize);
            let inside = n.min(have);
            let piece = &mut buf[from..from + n];
            self.ubi
                .read(self.id, lnum, at, &mut piece[..inside])
                .map_err(io_error)?;
            piece[inside..].fill(0xFF);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!("UBI volume {} is read-only", self.name),
            ));
        }
        self.check(offset, buf.len())?;
        let _serial = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut leb = vec![0u8; self.usable as usize];
        for (lnum, at, from, n) in self.pieces(offset, buf.len()) {
            self.ubi
                .read(self.id, lnum, 0, &mut leb)
                .map_err(io_error)?;
            if leb[at as usize..at as usize + n] == buf[from..from + n] {
                continue;
            }
            leb[at as usize..at as usize + n].copy_from_slice(&buf[from..from + n]);
            let keep = data_len(&leb, self.min_io);
            let done = if keep == 0 {
                self.ubi.unmap(self.id, lnum)
            } else {
                self.ubi.change(self.id, lnum, &leb[..keep])
            };
            done.map_err(io_error)?;
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.ubi.sync().map_err(io_error)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.size)
    }

    fn name(&self) -> String {
        format!("UBI volume {}", self.name)
    }
    fn is_writable(&self) -> bool {
        self.writable
    }
}
