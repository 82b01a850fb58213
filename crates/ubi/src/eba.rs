//! LEB operations (the kernel's `eba.c`): which PEB holds each LEB, and reading, writing,
//! mapping, unmapping and atomically changing LEBs, and moving a LEB to another PEB (for
//! wear-levelling and scrubbing).
//!
//! Crash rules, as the kernel's: a LEB's PEB gets its VID header (with a new sequence number)
//! before any data; an atomic change and a move write a *copy* (`copy_flag`, data size and CRC
//! in the header) to a fresh PEB before the old one is erased, so after a power cut the scan
//! finds either the old PEB alone, or both and keeps the copy only if its data is whole. A
//! write into a PEB that fails moves what the LEB held, with the new data, to another PEB and
//! tortures the old one.

use sectorcrypt_flash::Error as FlashError;

use crate::device::Device;
use crate::media::{crc, Header, VidHdr, VolType, COMPAT_REJECT, LAYOUT_VOLUME_ID};
use crate::Error;

/// Attempts at a write before giving up (`UBI_IO_RETRIES`).
const RETRIES: usize = 3;

/// Whether `e` is the chip refusing a program (the PEB is suspect; try another).
fn program_failed(e: &Error) -> bool {
    matches!(e, Error::Flash(FlashError::ProgramFailed { .. }))
}

/// The length of `data` without its trailing minimum I/O units of 0xFF (`ubi_calc_data_len`):
/// what is worth writing, so that erased space stays writable.
pub(crate) fn data_len(data: &[u8], min_io: usize) -> usize {
    let end = data.iter().rposition(|&b| b != 0xFF).map_or(0, |i| i + 1);
    end.div_ceil(min_io) * min_io
}

impl Device {
    /// A VID header for LEB `lnum` of volume `vol_id`, with the next sequence number.
    pub(crate) fn new_vid(&mut self, vol_id: u32, lnum: u32) -> Result<VidHdr, Error> {
        let vol = self.vol(vol_id)?;
        let mut vid = VidHdr::dynamic(vol_id, lnum, 0);
        vid.vol_type = vol.record.vol_type;
        vid.data_pad = vol.record.data_pad;
        if vol_id == LAYOUT_VOLUME_ID {
            vid.compat = COMPAT_REJECT;
        }
        vid.sqnum = self.next_sqnum()?;
        Ok(vid)
    }

    /// Check that `len` bytes at `offset` of LEB `lnum` of volume `vol_id` lie inside it;
    /// `aligned`: offset and length must be multiples of the minimum I/O unit (writes).
    pub(crate) fn check_leb(
        &self,
        vol_id: u32,
        lnum: u32,
        offset: u32,
        len: usize,
        aligned: bool,
    ) -> Result<(), Error> {
        let vol = self.vol(vol_id)?;
        let usable = vol.usable_leb_size(&self.io.layout);
        if lnum as usize >= vol.lebs.len() {
            return Err(Error::OutOfRange(format!(
                "LEB {lnum} of volume {vol_id}, which has {} LEBs",
                vol.lebs.len()
            )));
        }
        if u64::from(offset) + len as u64 > u64::from(usable) {
            return Err(Error::OutOfRange(format!(
                "{len} bytes at offset {offset} of a {usable}-byte LEB"
            )));
        }
        let min_io = self.io.layout.min_io_size;
        if aligned && (!offset.is_multiple_of(min_io) || !(len as u32).is_multiple_of(min_io)) {
            return Err(Error::OutOfRange(format!(
                "{len} bytes at offset {offset}: writes go in whole {min_io}-byte units"
            )));
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset` of LEB `lnum` of volume `vol_id`; an unmapped LEB
    /// reads 0xFF.
    pub(crate) fn read(
        &mut self,
        vol_id: u32,
        lnum: u32,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<(), Error> {
        self.check_leb(vol_id, lnum, offset, buf.len(), false)?;
        let Some(peb) = self.vol(vol_id)?.lebs[lnum as usize] else {
            buf.fill(0xFF);
            return Ok(());
        };
        if self.io.read_data(peb, offset, buf)? {
            self.scrub.push(peb);
        }
        Ok(())
    }

    /// Write `data` at `offset` of LEB `lnum` (dynamic volumes: into space not written since
    /// the LEB was mapped).
    pub(crate) fn write(
        &mut self,
        vol_id: u32,
        lnum: u32,
        offset: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        self.check_leb(vol_id, lnum, offset, data.len(), true)?;
        match self.vol(vol_id)?.lebs[lnum as usize] {
            Some(peb) => match self.io.write_data(peb, offset, data) {
                Err(e) if program_failed(&e) => self.recover(vol_id, lnum, peb, offset, data),
                other => other,
            },
            None => {
                let vid = self.new_vid(vol_id, lnum)?;
                self.write_new(vol_id, lnum, &vid, 0, data)
            }
        }
    }

    /// Map LEB `lnum` to a fresh PEB holding `vid` and `data` at `offset`, trying other PEBs
    /// when a program fails.
    pub(crate) fn write_new(
        &mut self,
        vol_id: u32,
        lnum: u32,
        vid: &VidHdr,
        offset: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            let peb = self.pool.get(&self.io)?;
            let written = self
                .io
                .write_vid(peb, vid)
                .and_then(|()| match data.is_empty() {
                    true => Ok(()),
                    false => self.io.write_data(peb, offset, data),
                });
            match written {
                Ok(()) => {
                    self.owner[peb as usize] = Some((vol_id, lnum));
                    self.vol_mut(vol_id)?.lebs[lnum as usize] = Some(peb);
                    return Ok(());
                }
                Err(e) if program_failed(&e) && tries + 1 < RETRIES => {
                    tries += 1;
                    self.release(peb, true)?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A write of `data` at `offset` into `peb` (LEB `lnum`) failed: put what the LEB held
    /// before `offset`, and `data`, into another PEB (`recover_peb`), and torture `peb`.
    fn recover(
        &mut self,
        vol_id: u32,
        lnum: u32,
        peb: u32,
        offset: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        let mut whole = vec![0u8; offset as usize];
        self.io.read_data(peb, 0, &mut whole)?;
        whole.extend_from_slice(data);
        let vid = self.new_vid(vol_id, lnum)?;
        self.vol_mut(vol_id)?.lebs[lnum as usize] = None;
        self.write_new(vol_id, lnum, &vid, 0, &whole)?;
        self.release(peb, true)
    }

    /// Unmap LEB `lnum`: it reads 0xFF; its PEB is erased.
    pub(crate) fn unmap(&mut self, vol_id: u32, lnum: u32) -> Result<(), Error> {
        self.check_leb(vol_id, lnum, 0, 0, false)?;
        if let Some(peb) = self.vol_mut(vol_id)?.lebs[lnum as usize].take() {
            self.release(peb, false)?;
        }
        Ok(())
    }

    /// Map LEB `lnum` (unmapped) to an erased PEB, so that it survives a power cut as an empty
    /// LEB (`ubi_leb_map`).
    pub(crate) fn map(&mut self, vol_id: u32, lnum: u32) -> Result<(), Error> {
        self.check_leb(vol_id, lnum, 0, 0, false)?;
        if self.vol(vol_id)?.lebs[lnum as usize].is_some() {
            return Err(Error::Volume(format!(
                "LEB {lnum} of volume {vol_id} is mapped already"
            )));
        }
        let vid = self.new_vid(vol_id, lnum)?;
        self.write_new(vol_id, lnum, &vid, 0, &[])
    }

    /// Replace the contents of LEB `lnum` with `data` atomically (`ubi_leb_change`): after a
    /// power cut it holds the old data or `data`, never a mix.
    pub(crate) fn change(&mut self, vol_id: u32, lnum: u32, data: &[u8]) -> Result<(), Error> {
        self.check_leb(vol_id, lnum, 0, data.len(), true)?;
        if data.is_empty() {
            self.unmap(vol_id, lnum)?;
            return self.map(vol_id, lnum);
        }
        let mut vid = self.new_vid(vol_id, lnum)?;
        vid.copy_flag = true;
        vid.data_size = data.len() as u32;
        vid.data_crc = crc(data);
        let old = self.vol_mut(vol_id)?.lebs[lnum as usize].take();
        self.write_new(vol_id, lnum, &vid, 0, data)?;
        if let Some(peb) = old {
            self.release(peb, false)?;
        }
        Ok(())
    }

    /// Move the LEB in `from` to the free PEB `to` (taken already), as a copy, then erase
    /// `from` (`ubi_eba_copy_leb`).
    pub(crate) fn move_leb(&mut self, from: u32, to: u32) -> Result<(), Error> {
        let Some((vol_id, lnum)) = self.owner[from as usize] else {
            return self.release(to, false);
        };
        let mut vid = match self.io.read_vid(from)?.header {
            Header::Valid(v) => v,
            _ => {
                return Err(Error::Corrupt(format!(
                    "PEB {from} (LEB {lnum} of volume {vol_id}) lost its VID header"
                )))
            }
        };
        let usable = self.vol(vol_id)?.usable_leb_size(&self.io.layout);
        let min_io = self.io.layout.min_io_size as usize;
        let (size, mut data) = match vid.vol_type {
            VolType::Static => {
                let size = vid.data_size as usize;
                (size, vec![0u8; size.div_ceil(min_io) * min_io])
            }
            VolType::Dynamic => (usable as usize, vec![0u8; usable as usize]),
        };
        self.io.read_data(from, 0, &mut data)?;
        let size = match vid.vol_type {
            VolType::Static => size,
            VolType::Dynamic => {
                let len = data_len(&data, min_io);
                data.truncate(len);
                len
            }
        };
        vid.copy_flag = true;
        vid.data_size = size as u32;
        vid.data_crc = crc(&data[..size]);
        vid.sqnum = self.next_sqnum()?;
        let written = self
            .io
            .write_vid(to, &vid)
            .and_then(|()| match data.is_empty() {
                true => Ok(()),
                false => self.io.write_data(to, 0, &data),
            });
        if let Err(e) = written {
            if program_failed(&e) {
                // The target is suspect, the source still holds the LEB: keep it there.
                return self.release(to, true);
            }
            return Err(e);
        }
        self.owner[to as usize] = Some((vol_id, lnum));
        self.vol_mut(vol_id)?.lebs[lnum as usize] = Some(to);
        self.release(from, false)
    }
}
