//! The one place that touches the flash (the kernel's `io.c`): headers read and classified as
//! the kernel classifies them, headers and data written at the layout's offsets, PEBs erased
//! with their new erase counter written at once, and PEBs tortured before they are given up.

use std::sync::Arc;

use sectorcrypt_flash::{Error as FlashError, Flash};

use crate::media::{EcHdr, Header, Layout, VidHdr, EC_HDR_SIZE, MAX_ERASECOUNTER, VID_HDR_SIZE};
use crate::Error;

/// A header as read: what it holds, and whether the read needed the ECC (bit-flips corrected or
/// an uncorrectable error: either way the PEB is to be scrubbed, as the kernel does).
#[derive(Clone, Debug)]
pub(crate) struct Read<T> {
    pub(crate) header: Header<T>,
    pub(crate) bitflips: bool,
    /// The read hit an uncorrectable ECC error (`UBI_IO_BAD_HDR_EBADMSG` when the header is bad).
    pub(crate) ecc_error: bool,
}

impl<T> Read<T> {
    fn new(header: Header<T>, (bitflips, ecc_error): (bool, bool)) -> Read<T> {
        Read {
            header,
            bitflips,
            ecc_error,
        }
    }
}

/// The flash with UBI's layout on it.
pub(crate) struct Io {
    pub(crate) flash: Arc<dyn Flash>,
    pub(crate) layout: Layout,
    pub(crate) image_seq: u32,
}

/// How often an erase is tried before the PEB is given up (`UBI_IO_RETRIES`).
const RETRIES: usize = 3;

/// The byte patterns torture writes and checks (`torture_peb`).
const PATTERNS: [u8; 3] = [0xA5, 0x5A, 0x00];

impl Io {
    /// Read `buf.len()` bytes at `offset` of `peb`; an uncorrectable error still fills `buf`.
    /// Returns (corrected bit-flips seen, uncorrectable error seen).
    fn read_raw(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<(bool, bool), Error> {
        match self.flash.read(peb, offset, buf) {
            Ok(status) => Ok((status.corrected > 0, false)),
            Err(FlashError::Uncorrectable { .. }) => Ok((true, true)),
            Err(e) => Err(e.into()),
        }
    }

    /// The EC header of `peb`.
    pub(crate) fn read_ec(&self, peb: u32) -> Result<Read<EcHdr>, Error> {
        let mut buf = [0u8; EC_HDR_SIZE];
        let flags = self.read_raw(peb, 0, &mut buf)?;
        Ok(Read::new(EcHdr::parse(&buf), flags))
    }

    /// The VID header of `peb`.
    pub(crate) fn read_vid(&self, peb: u32) -> Result<Read<VidHdr>, Error> {
        let mut buf = [0u8; VID_HDR_SIZE];
        let flags = self.read_raw(peb, self.layout.vid_hdr_offset, &mut buf)?;
        Ok(Read::new(VidHdr::parse(&buf, self.layout.leb_size), flags))
    }

    /// Read LEB data: `buf.len()` bytes at `offset` of the data area of `peb`. Returns whether
    /// bit-flips were corrected (the PEB is then scrubbed).
    ///
    /// Errors: [`sectorcrypt_flash::Error::Uncorrectable`] as the flash reports it.
    pub(crate) fn read_data(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<bool, Error> {
        let status = self
            .flash
            .read(peb, self.layout.data_offset + offset, buf)?;
        Ok(status.corrected > 0)
    }

    /// Whether `peb` reads erased after its EC header's I/O unit (cleanly: a read that needed
    /// the ECC does not count as erased).
    pub(crate) fn erased_after_ec(&self, peb: u32) -> Result<bool, Error> {
        let from = self.layout.hdrs_min_io_size;
        let mut buf = vec![0u8; (self.layout.peb_size - from) as usize];
        Ok(self.read_raw(peb, from, &mut buf)? == (false, false) && buf.iter().all(|&b| b == 0xFF))
    }

    /// A header in its own header I/O unit: the 64 bytes at `shift`, 0xFF around them (as
    /// `ubinize` pads).
    fn unit(&self, bytes: &[u8], shift: usize) -> Vec<u8> {
        let size = self.layout.hdrs_min_io_size as usize;
        let len = (shift + bytes.len()).div_ceil(size) * size;
        let mut unit = vec![0xFF; len];
        unit[shift..shift + bytes.len()].copy_from_slice(bytes);
        unit
    }

    /// Write the EC header of `peb` (erased) with erase counter `ec`.
    pub(crate) fn write_ec(&self, peb: u32, ec: u64) -> Result<(), Error> {
        let hdr = EcHdr {
            ec,
            vid_hdr_offset: self.layout.vid_hdr_offset,
            data_offset: self.layout.data_offset,
            image_seq: self.image_seq,
        };
        Ok(self.flash.program(peb, 0, &self.unit(&hdr.to_bytes(), 0))?)
    }

    /// Write the VID header of `peb`.
    pub(crate) fn write_vid(&self, peb: u32, vid: &VidHdr) -> Result<(), Error> {
        let at = self.layout.vid_hdr_aloffset();
        let shift = (self.layout.vid_hdr_offset - at) as usize;
        let unit = self.unit(&vid.to_bytes(), shift);
        Ok(self.flash.program(peb, at, &unit)?)
    }

    /// Write LEB data at `offset` of the data area of `peb` (both multiples of the minimum I/O
    /// unit).
    pub(crate) fn write_data(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        Ok(self
            .flash
            .program(peb, self.layout.data_offset + offset, data)?)
    }

    /// Erase `peb` (retrying as the kernel does) and write its EC header with `ec`.
    ///
    /// Errors: [`sectorcrypt_flash::Error::EraseFailed`] once the retries are spent (the caller
    /// marks the PEB bad); [`Error::Refused`] for an erase counter past UBI's limit.
    pub(crate) fn erase_with_ec(&self, peb: u32, ec: u64) -> Result<(), Error> {
        if ec > MAX_ERASECOUNTER {
            return Err(Error::Refused(format!(
                "PEB {peb}: erase counter {ec} would pass UBI's limit"
            )));
        }
        self.erase(peb)?;
        self.write_ec(peb, ec)
    }

    fn erase(&self, peb: u32) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            match self.flash.erase(peb) {
                Err(FlashError::EraseFailed(_)) if tries + 1 < RETRIES => tries += 1,
                other => return Ok(other?),
            }
        }
    }

    /// Torture `peb` after a write failed on it (`torture_peb`): erase it, check it reads
    /// 0xFF, write each test pattern over it and check it reads back, erase again. Returns
    /// the erases it cost, or `None` if the PEB failed and must be marked bad.
    pub(crate) fn torture(&self, peb: u32) -> Result<Option<u64>, Error> {
        let size = self.layout.peb_size as usize;
        let mut buf = vec![0u8; size];
        let mut erases = 0;
        for pattern in PATTERNS {
            match self.erase(peb) {
                Ok(()) => erases += 1,
                Err(Error::Flash(FlashError::EraseFailed(_))) => return Ok(None),
                Err(e) => return Err(e),
            }
            if self.read_raw(peb, 0, &mut buf)? != (false, false) || buf.iter().any(|&b| b != 0xFF)
            {
                return Ok(None);
            }
            let fill = vec![pattern; size];
            match self.flash.program(peb, 0, &fill) {
                Ok(()) => {}
                Err(FlashError::ProgramFailed { .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            if self.read_raw(peb, 0, &mut buf)? != (false, false)
                || buf.iter().any(|&b| b != pattern)
            {
                return Ok(None);
            }
        }
        match self.erase(peb) {
            Ok(()) => Ok(Some(erases + 1)),
            Err(Error::Flash(FlashError::EraseFailed(_))) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
