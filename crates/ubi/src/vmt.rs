//! Volume management (the kernel's `vmt.c` and `upd.c`): create, remove, resize, rename, and
//! replace a volume's contents whole. Each changes the volume table once (both copies), in an
//! order that a power cut cannot turn into lost data: a removal unmaps the LEBs after the table
//! no longer names the volume (a scan then erases the orphans), a shrink after the table
//! shrinks, and an update marks the volume as being updated in the table for as long as its
//! LEBs are rewritten, so an update cut short is seen, not read as data.

use crate::device::{Device, Vol};
use crate::eba::data_len;
use crate::media::{
    crc, VidHdr, VolType, VtblRecord, MAX_VOLUMES, VOL_NAME_MAX, VTBL_AUTORESIZE_FLG,
};
use crate::{Error, NewVolume};

impl Device {
    fn writable(&self) -> Result<(), Error> {
        if self.pool.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// A user volume's ID, checked.
    fn user(&self, id: u32) -> Result<u32, Error> {
        if id as usize >= MAX_VOLUMES || self.table.get(id as usize).is_none_or(Option::is_none) {
            return Err(Error::Volume(format!("volume {id} does not exist")));
        }
        Ok(id)
    }

    fn check_name(&self, name: &str, except: Option<u32>) -> Result<(), Error> {
        if name.is_empty() || name.len() > VOL_NAME_MAX || name.contains('\0') {
            return Err(Error::Volume(format!(
                "a volume name is 1 to {VOL_NAME_MAX} bytes without NUL, not {name:?}"
            )));
        }
        let taken = self.table.iter().enumerate().any(|(i, r)| {
            Some(i as u32) != except && r.as_ref().is_some_and(|r| r.name == name.as_bytes())
        });
        if taken {
            return Err(Error::Volume(format!(
                "a volume named {name:?} exists already"
            )));
        }
        Ok(())
    }

    /// Record `vol`'s table entry (`None`: none) and write the table.
    fn set_record(&mut self, id: u32, record: Option<VtblRecord>) -> Result<(), Error> {
        self.table[id as usize] = record;
        self.write_table()
    }

    /// Create a volume; returns its ID.
    pub(crate) fn create(&mut self, req: &NewVolume) -> Result<u32, Error> {
        self.writable()?;
        self.check_name(&req.name, None)?;
        let id = match req.id {
            Some(id) if id as usize >= self.table.len() => {
                return Err(Error::Volume(format!(
                    "volume ID {id}: IDs go from 0 to {}",
                    self.table.len() - 1
                )))
            }
            Some(id) if self.table[id as usize].is_some() => {
                return Err(Error::Volume(format!("volume {id} exists already")))
            }
            Some(id) => id,
            None => self
                .table
                .iter()
                .position(Option::is_none)
                .ok_or_else(|| Error::Volume("the volume table is full".into()))?
                as u32,
        };
        let layout = self.io.layout;
        let alignment = req.alignment.max(1);
        let record = VtblRecord {
            reserved_pebs: req.lebs,
            alignment,
            data_pad: layout.leb_size % alignment,
            vol_type: req.vol_type,
            upd_marker: false,
            name: req.name.as_bytes().to_vec(),
            flags: if req.autoresize {
                VTBL_AUTORESIZE_FLG
            } else {
                0
            },
        };
        let good = self.pool.uses.len() as u32;
        crate::vtbl::check_record(&layout, &record, good).map_err(Error::Volume)?;
        if req.lebs == 0 {
            return Err(Error::Volume("a volume needs at least one LEB".into()));
        }
        if req.autoresize
            && self
                .table
                .iter()
                .flatten()
                .any(|r| r.flags & VTBL_AUTORESIZE_FLG != 0)
        {
            return Err(Error::Volume("only one volume may be auto-resized".into()));
        }
        self.take_pebs(req.lebs)?;
        self.vols.insert(id, Vol::new(record.clone()));
        self.set_record(id, Some(record))?;
        Ok(id)
    }

    fn take_pebs(&mut self, n: u32) -> Result<(), Error> {
        if n > self.pool.avail {
            return Err(Error::NoSpace(format!(
                "{n} LEBs asked for, {} PEBs available",
                self.pool.avail
            )));
        }
        self.pool.avail -= n;
        Ok(())
    }

    /// Remove volume `id` and erase its LEBs.
    pub(crate) fn remove(&mut self, id: u32) -> Result<(), Error> {
        self.writable()?;
        let id = self.user(id)?;
        self.set_record(id, None)?;
        let vol = self
            .vols
            .remove(&id)
            .ok_or_else(|| Error::Volume(format!("volume {id}")))?;
        for peb in vol.lebs.iter().flatten() {
            self.release(*peb, false)?;
        }
        self.pool.avail += vol.record.reserved_pebs;
        self.background()
    }

    /// Resize volume `id` to `lebs` LEBs (shrinking erases the LEBs past the end).
    pub(crate) fn resize(&mut self, id: u32, lebs: u32) -> Result<(), Error> {
        self.writable()?;
        let id = self.user(id)?;
        let vol = self.vol(id)?;
        let old = vol.record.reserved_pebs;
        if lebs == 0 {
            return Err(Error::Volume("a volume needs at least one LEB".into()));
        }
        if vol.record.vol_type == VolType::Static && lebs < vol.used_ebs {
            return Err(Error::Volume(format!(
                "static volume {id} holds {} LEBs of data",
                vol.used_ebs
            )));
        }
        let mut record = vol.record.clone();
        if lebs > old {
            self.take_pebs(lebs - old)?;
        }
        record.reserved_pebs = lebs;
        self.vol_mut(id)?.record = record.clone();
        self.set_record(id, Some(record))?;
        let cut: Vec<u32> = {
            let vol = self.vol_mut(id)?;
            let cut = vol
                .lebs
                .iter()
                .skip(lebs as usize)
                .flatten()
                .copied()
                .collect();
            vol.lebs.resize(lebs as usize, None);
            cut
        };
        for peb in cut {
            self.release(peb, false)?;
        }
        if lebs < old {
            self.pool.avail += old - lebs;
        }
        self.background()
    }

    /// Rename volume `id`.
    pub(crate) fn rename(&mut self, id: u32, name: &str) -> Result<(), Error> {
        self.writable()?;
        let id = self.user(id)?;
        self.check_name(name, Some(id))?;
        let vol = self.vol_mut(id)?;
        vol.record.name = name.as_bytes().to_vec();
        let record = vol.record.clone();
        self.set_record(id, Some(record))
    }

    /// Replace the whole contents of volume `id` with `data` (`ubiupdatevol`): the volume is
    /// marked as being updated, its LEBs erased and written again, the mark cleared. A dynamic
    /// volume's trailing 0xFF units are not written (they stay writable).
    pub(crate) fn update(&mut self, id: u32, data: &[u8]) -> Result<(), Error> {
        self.writable()?;
        let id = self.user(id)?;
        let vol = self.vol(id)?;
        let usable = vol.usable_leb_size(&self.io.layout) as usize;
        let lebs = data.len().div_ceil(usable);
        if lebs > vol.lebs.len() {
            return Err(Error::NoSpace(format!(
                "{} bytes do not fit volume {id} ({} bytes)",
                data.len(),
                vol.lebs.len() * usable
            )));
        }
        let mut record = vol.record.clone();
        let vol_type = record.vol_type;
        record.upd_marker = true;
        self.vol_mut(id)?.record = record.clone();
        self.set_record(id, Some(record.clone()))?;
        for lnum in 0..self.vol(id)?.lebs.len() as u32 {
            self.unmap(id, lnum)?;
        }
        let min_io = self.io.layout.min_io_size as usize;
        for (lnum, chunk) in data.chunks(usable).enumerate() {
            let lnum = lnum as u32;
            match vol_type {
                VolType::Dynamic => {
                    let len = data_len(chunk, min_io);
                    if len > 0 {
                        let mut padded = chunk[..len.min(chunk.len())].to_vec();
                        padded.resize(len, 0xFF);
                        self.write(id, lnum, 0, &padded)?;
                    }
                }
                VolType::Static => {
                    let mut vid: VidHdr = self.new_vid(id, lnum)?;
                    vid.data_size = chunk.len() as u32;
                    vid.used_ebs = lebs as u32;
                    vid.data_crc = crc(chunk);
                    let mut padded = chunk.to_vec();
                    padded.resize(chunk.len().div_ceil(min_io) * min_io, 0xFF);
                    self.write_new(id, lnum, &vid, 0, &padded)?;
                }
            }
        }
        let last = data.len() - (lebs.max(1) - 1) * usable;
        let vol = self.vol_mut(id)?;
        record.upd_marker = false;
        vol.record = record.clone();
        vol.corrupted = false;
        vol.checked = false;
        if vol_type == VolType::Static {
            vol.used_ebs = lebs as u32;
            vol.last_eb_bytes = if lebs == 0 { 0 } else { last as u32 };
        }
        self.set_record(id, Some(record))?;
        self.background()
    }
}

impl Device {
    /// Before a read of volume `id`: an update cut short is refused, and a static volume's LEBs
    /// are checked against their CRCs once (`ubi_check_volume`).
    pub(crate) fn check_volume(&mut self, id: u32) -> Result<(), Error> {
        let id = self.user(id)?;
        let vol = self.vol(id)?;
        if vol.record.vol_type == VolType::Static && !vol.checked && !vol.corrupted {
            let pebs: Vec<u32> = vol
                .lebs
                .iter()
                .take(vol.used_ebs as usize)
                .flatten()
                .copied()
                .collect();
            let mut whole = pebs.len() as u32 == vol.used_ebs;
            for peb in pebs {
                whole &= self.static_leb_is_whole(peb)?;
            }
            let vol = self.vol_mut(id)?;
            vol.checked = true;
            vol.corrupted = !whole;
        }
        let vol = self.vol(id)?;
        if vol.corrupted {
            let name = String::from_utf8_lossy(&vol.record.name).into_owned();
            return Err(Error::Corrupt(if vol.record.upd_marker {
                format!("volume {id} ({name}): its update was cut short; update it again")
            } else {
                format!("static volume {id} ({name}) misses LEBs or fails its CRC")
            }));
        }
        Ok(())
    }

    /// Whether the static LEB in `peb` matches its header's size and CRC.
    fn static_leb_is_whole(&mut self, peb: u32) -> Result<bool, Error> {
        let crate::media::Header::Valid(vid) = self.io.read_vid(peb)?.header else {
            return Ok(false);
        };
        let mut data = vec![0u8; vid.data_size as usize];
        match self.io.read_data(peb, 0, &mut data) {
            Ok(flips) => {
                if flips {
                    self.scrub.push(peb);
                }
                Ok(crc(&data) == vid.data_crc)
            }
            Err(Error::Flash(sectorcrypt_flash::Error::Uncorrectable { .. })) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Before a LEB write, change, map or unmap: the volume is dynamic and the device writable
    /// (a static volume is written whole by [`Device::update`]).
    pub(crate) fn check_dynamic(&mut self, id: u32) -> Result<(), Error> {
        self.writable()?;
        let id = self.user(id)?;
        if self.vol(id)?.record.vol_type == VolType::Static {
            return Err(Error::Volume(format!(
                "volume {id} is static: it is written whole (update), not by LEB"
            )));
        }
        Ok(())
    }
}
