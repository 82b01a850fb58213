//! Writing a UBI image (from `ubinize`) onto flash as `ubiformat -f` does (the flasher
//! algorithm of the UBI documentation): the erase counters already on the flash are kept (each
//! PEB's counter plus one for the erase it now gets, the mean for PEBs whose counter is
//! unknown), the image's PEBs go to the good PEBs in order, each without its trailing all-0xFF
//! minimum I/O units (so that UBIFS can still write there), and every other good PEB is erased
//! and given an EC header, so that the kernel attaches the result without a scan for empty
//! space.

use sectorcrypt_flash::{Error as FlashError, Flash};

use crate::eba::data_len;
use crate::media::{EcHdr, Header, Layout, EC_HDR_SIZE};
use crate::Error;

/// What flashing did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flashed {
    /// PEBs of the image written.
    pub image_pebs: u32,
    /// Other PEBs erased and given an EC header.
    pub formatted_pebs: u32,
    /// PEBs found bad or that failed to erase and were marked bad.
    pub bad_pebs: u32,
}

/// Write `image` onto `flash` (see the module docs); `vid_hdr_offset` as `ubiformat -O`.
///
/// Errors: [`Error::Refused`] for an image that is not whole PEBs of UBI of this flash's
/// layout; [`Error::NoSpace`] when its PEBs outnumber the good PEBs; [`Error::Flash`].
pub fn flash_image(
    flash: &dyn Flash,
    image: &[u8],
    vid_hdr_offset: Option<u32>,
) -> Result<Flashed, Error> {
    let g = flash.geometry();
    let layout = Layout::new(g.peb_size, g.page_size, g.sub_page_size, vid_hdr_offset)
        .map_err(Error::Refused)?;
    let peb_size = g.peb_size as usize;
    if image.is_empty() || !image.len().is_multiple_of(peb_size) {
        return Err(Error::Refused(format!(
            "the image is {} bytes, not a whole number of {peb_size}-byte PEBs",
            image.len()
        )));
    }
    let mut headers = Vec::new();
    for (i, peb) in image.chunks(peb_size).enumerate() {
        let Header::Valid(h) = EcHdr::parse(peb) else {
            return Err(Error::Refused(format!(
                "PEB {i} of the image has no valid EC header"
            )));
        };
        if (h.vid_hdr_offset, h.data_offset) != (layout.vid_hdr_offset, layout.data_offset) {
            return Err(Error::Refused(format!(
                "the image puts VID headers at {} and data at {}, this flash at {} and {} \
                 (made for another geometry: see ubinize -m, -s, -O)",
                h.vid_hdr_offset, h.data_offset, layout.vid_hdr_offset, layout.data_offset
            )));
        }
        headers.push(h);
    }
    let image_seq = headers[0].image_seq;
    let ec = erase_counters(flash)?;
    let mut done = Flashed::default();
    let mut next = image.chunks(peb_size).zip(&headers).peekable();
    for peb in 0..g.peb_count {
        if flash.is_bad(peb)? {
            done.bad_pebs += 1;
            continue;
        }
        let new_ec = ec[peb as usize] + 1;
        if let Err(e) = flash.erase(peb) {
            if matches!(e, FlashError::EraseFailed(_)) {
                flash.mark_bad(peb)?;
                done.bad_pebs += 1;
                continue;
            }
            return Err(e.into());
        }
        let hdr = |h: &EcHdr| EcHdr { ec: new_ec, ..*h }.to_bytes();
        match next.next() {
            Some((contents, h)) => {
                let mut buf = contents.to_vec();
                buf[..EC_HDR_SIZE].copy_from_slice(&hdr(h));
                let len = data_len(&buf, layout.min_io_size as usize);
                flash.program(peb, 0, &buf[..len])?;
                done.image_pebs += 1;
            }
            None => {
                let mut unit = vec![0xFF; layout.hdrs_min_io_size as usize];
                let template = EcHdr {
                    ec: new_ec,
                    vid_hdr_offset: layout.vid_hdr_offset,
                    data_offset: layout.data_offset,
                    image_seq,
                };
                unit[..EC_HDR_SIZE].copy_from_slice(&hdr(&template));
                flash.program(peb, 0, &unit)?;
                done.formatted_pebs += 1;
            }
        }
    }
    if next.peek().is_some() {
        return Err(Error::NoSpace(format!(
            "the image has {} PEBs, the flash only {} good ones",
            headers.len(),
            done.image_pebs + done.formatted_pebs
        )));
    }
    flash.sync()?;
    Ok(done)
}

/// The erase counter of every PEB as its EC header says, the mean of the known ones where it
/// says nothing (as `ubiformat` scans).
fn erase_counters(flash: &dyn Flash) -> Result<Vec<u64>, Error> {
    let mut known = Vec::new();
    let mut buf = [0u8; EC_HDR_SIZE];
    for peb in 0..flash.geometry().peb_count {
        let ec = if flash.is_bad(peb)? {
            None
        } else {
            match flash.read(peb, 0, &mut buf) {
                Ok(_) => match EcHdr::parse(&buf) {
                    Header::Valid(h) => Some(h.ec),
                    _ => None,
                },
                Err(FlashError::Uncorrectable { .. }) => None,
                Err(e) => return Err(e.into()),
            }
        };
        known.push(ec);
    }
    let seen: Vec<u64> = known.iter().flatten().copied().collect();
    let mean = if seen.is_empty() {
        0
    } else {
        seen.iter().sum::<u64>() / seen.len() as u64
    };
    Ok(known.into_iter().map(|e| e.unwrap_or(mean)).collect())
}
