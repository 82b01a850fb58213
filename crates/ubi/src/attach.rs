//! Scanning a flash at attach time (the kernel's `attach.c`, `scan_peb` and `late_analysis`):
//! every PEB's headers are read and the PEB sorted, with the kernel's rules, into bad, free (EC
//! header, no VID header), to erase (no EC header, a write cut short, a superseded copy),
//! corrupted (kept and counted, never erased: it may hold data that matters), or holding a LEB;
//! of two PEBs claiming one LEB the newer `sqnum` wins unless it is a copy whose data fails its
//! CRC (an atomic change or a wear-levelling move cut short).

use std::collections::{BTreeMap, BTreeSet};

use sectorcrypt_flash::Error as FlashError;

use crate::io::Io;
use crate::media::{
    crc, Header, VidHdr, VolType, COMPAT_REJECT, INTERNAL_VOL_START, LAYOUT_VOLUME_ID,
};
use crate::Error;

/// `UBI_COMPAT_DELETE`: an unknown internal volume whose PEBs may be erased (fastmap).
const COMPAT_DELETE: u8 = 1;
/// `UBI_COMPAT_RO`: an unknown internal volume that makes the device read-only.
const COMPAT_RO: u8 = 2;

/// What a PEB was found to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Marked bad on the chip.
    Bad,
    /// Erased, with an EC header and no VID header.
    Free,
    /// To be erased (and given a new EC header) before use.
    Erase,
    /// A VID header that is not a power cut's doing: kept, never touched.
    Corrupt,
    /// Held by an internal volume this implementation does not know but must keep.
    Alien,
    /// Holds a LEB (in [`Scan::lebs`]).
    Used,
}

/// A LEB found on the flash.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub(crate) peb: u32,
    pub(crate) vid: VidHdr,
}

/// What scanning found.
pub(crate) struct Scan {
    /// Per PEB.
    pub(crate) kind: Vec<Kind>,
    /// Erase counters per PEB, the unknown ones set to the mean of the known.
    pub(crate) ec: Vec<u64>,
    /// The LEBs, by (volume, LEB number).
    pub(crate) lebs: BTreeMap<(u32, u32), Found>,
    /// PEBs read with bit-flips: their data is to be moved and the PEB erased.
    pub(crate) scrub: BTreeSet<u32>,
    /// The highest sequence number seen.
    pub(crate) max_sqnum: u64,
    /// The image sequence number all PEBs share (0: none seen).
    pub(crate) image_seq: u32,
    /// No UBI at all: every good PEB erased (or unreadable in at most two): format it.
    pub(crate) is_empty: bool,
    /// An internal volume asked for read-only operation.
    pub(crate) read_only: bool,
}

impl Scan {
    /// PEBs of `kind`.
    pub(crate) fn count(&self, kind: Kind) -> u32 {
        self.kind.iter().filter(|&&k| k == kind).count() as u32
    }
}

/// Scan every PEB of the flash behind `io`.
///
/// Errors: [`Error::Refused`] for headers of another geometry or image, two PEBs claiming one
/// LEB with the same sequence number, inconsistent headers within a volume, an internal volume
/// that must not be touched, too many corrupted PEBs, or a flash that holds something else.
pub(crate) fn scan(io: &Io) -> Result<Scan, Error> {
    let peb_count = io.flash.geometry().peb_count;
    let mut s = Scan {
        kind: vec![Kind::Erase; peb_count as usize],
        ec: vec![0; peb_count as usize],
        lebs: BTreeMap::new(),
        scrub: BTreeSet::new(),
        max_sqnum: 0,
        image_seq: 0,
        is_empty: false,
        read_only: false,
    };
    let mut known_ec = vec![false; peb_count as usize];
    let (mut empty, mut maybe_bad) = (0u32, 0u32);
    for peb in 0..peb_count {
        if io.flash.is_bad(peb)? {
            s.kind[peb as usize] = Kind::Bad;
            continue;
        }
        let ec = io.read_ec(peb)?;
        let mut bitflips = ec.bitflips;
        let ec_err = match ec.header {
            Header::Empty => {
                empty += 1;
                continue;
            }
            Header::Corrupt(_) => {
                bitflips = true;
                Some(ec.ecc_error)
            }
            Header::Valid(h) => {
                if (h.vid_hdr_offset, h.data_offset)
                    != (io.layout.vid_hdr_offset, io.layout.data_offset)
                {
                    return Err(Error::Refused(format!(
                        "PEB {peb} has its VID header at {} and data at {}, but this flash's \
                         layout puts them at {} and {} (another geometry or VID header offset)",
                        h.vid_hdr_offset,
                        h.data_offset,
                        io.layout.vid_hdr_offset,
                        io.layout.data_offset
                    )));
                }
                if s.image_seq == 0 {
                    s.image_seq = h.image_seq;
                }
                if h.image_seq != 0 && h.image_seq != s.image_seq {
                    return Err(Error::Refused(format!(
                        "PEB {peb} belongs to another UBI image (image sequence {:#x}, not {:#x})",
                        h.image_seq, s.image_seq
                    )));
                }
                s.ec[peb as usize] = h.ec;
                known_ec[peb as usize] = true;
                None
            }
        };
        let vid = io.read_vid(peb)?;
        bitflips |= vid.bitflips;
        let kind = match vid.header {
            Header::Valid(v) => {
                // Bit-flips, or a lost EC header (the data counts, the EC is the mean): the
                // LEB is moved and the PEB erased.
                if bitflips {
                    s.scrub.insert(peb);
                }
                add_leb(io, &mut s, peb, v)?
            }
            Header::Corrupt(_) => {
                if vid.ecc_error && ec_err == Some(true) {
                    maybe_bad += 1;
                }
                // Both headers bad is garbage, not ours to keep; one bad VID header is a
                // write cut short if the data area is erased or unreadable.
                if ec_err.is_some() || cut_short(io, peb)? {
                    Kind::Erase
                } else {
                    Kind::Corrupt
                }
            }
            Header::Empty if ec_err.is_some() || bitflips => Kind::Erase,
            Header::Empty => Kind::Free,
        };
        s.kind[peb as usize] = kind;
    }
    let known: Vec<u64> = (0..peb_count as usize)
        .filter(|&p| known_ec[p])
        .map(|p| s.ec[p])
        .collect();
    let mean = if known.is_empty() {
        0
    } else {
        known.iter().sum::<u64>() / known.len() as u64
    };
    for (ec, known) in s.ec.iter_mut().zip(&known_ec) {
        if !known {
            *ec = mean;
        }
    }
    late_analysis(&mut s, empty, maybe_bad)?;
    Ok(s)
}

/// The kernel's `late_analysis`: refuse too many corrupted PEBs, and tell an empty flash (format
/// it) from one that holds something else (refuse it).
fn late_analysis(s: &mut Scan, empty: u32, maybe_bad: u32) -> Result<(), Error> {
    let good = s.kind.len() as u32 - s.count(Kind::Bad) - s.count(Kind::Alien);
    let corrupt = s.count(Kind::Corrupt);
    let max_corr = match good / 20 {
        0 => 8,
        n => n,
    };
    if corrupt > 0 && corrupt >= max_corr {
        return Err(Error::Refused(format!(
            "{corrupt} PEBs are corrupted (not by a power cut), {max_corr} or more is too many: \
             refusing to attach (the kernel refuses too)"
        )));
    }
    if empty + maybe_bad == good {
        if maybe_bad > 2 {
            return Err(Error::Refused(
                "the flash is not UBI-formatted and possibly holds data of another kind: refusing it"
                    .into(),
            ));
        }
        s.is_empty = true;
    }
    Ok(())
}

/// Whether a PEB whose VID header is bad had its write cut short (`check_corruption`): its data
/// area reads erased, or not cleanly.
fn cut_short(io: &Io, peb: u32) -> Result<bool, Error> {
    let mut data = vec![0u8; io.layout.leb_size as usize];
    match io.read_data(peb, 0, &mut data) {
        Ok(true) | Err(Error::Flash(FlashError::Uncorrectable { .. })) => Ok(true),
        Ok(false) => Ok(data.iter().all(|&b| b == 0xFF)),
        Err(e) => Err(e),
    }
}

/// Record the LEB that `peb` holds (`ubi_add_to_av` and `ubi_compare_lebs`), returning what
/// `peb` is now.
fn add_leb(io: &Io, s: &mut Scan, peb: u32, vid: VidHdr) -> Result<Kind, Error> {
    if vid.vol_id >= INTERNAL_VOL_START && vid.vol_id != LAYOUT_VOLUME_ID {
        return match vid.compat {
            COMPAT_DELETE => Ok(Kind::Erase),
            COMPAT_RO => {
                s.read_only = true;
                Ok(Kind::Alien)
            }
            COMPAT_REJECT => Err(Error::Refused(format!(
                "PEB {peb} belongs to internal volume {:#x}, which this UBI does not know and \
                 must not touch",
                vid.vol_id
            ))),
            _ => Ok(Kind::Alien),
        };
    }
    s.max_sqnum = s.max_sqnum.max(vid.sqnum);
    if let Some(((_, _), other)) = s
        .lebs
        .range((vid.vol_id, 0)..=(vid.vol_id, u32::MAX))
        .next()
    {
        let o = other.vid;
        if (o.vol_type, o.data_pad, o.compat) != (vid.vol_type, vid.data_pad, vid.compat)
            || (vid.vol_type == VolType::Static && o.used_ebs != vid.used_ebs)
        {
            return Err(Error::Refused(format!(
                "PEB {peb}: its VID header disagrees with PEB {} of the same volume {}",
                other.peb, vid.vol_id
            )));
        }
    }
    let key = (vid.vol_id, vid.lnum);
    let Some(old) = s.lebs.get(&key).copied() else {
        s.lebs.insert(key, Found { peb, vid });
        return Ok(Kind::Used);
    };
    if old.vid.sqnum == vid.sqnum {
        return Err(Error::Refused(format!(
            "PEBs {} and {peb} both hold LEB {} of volume {} with sequence number {}",
            old.peb, vid.lnum, vid.vol_id, vid.sqnum
        )));
    }
    let (older, newer) = if old.vid.sqnum < vid.sqnum {
        (old, Found { peb, vid })
    } else {
        (Found { peb, vid }, old)
    };
    let winner = if !newer.vid.copy_flag || copy_is_whole(io, s, newer)? {
        newer
    } else {
        older
    };
    let loser = if winner.peb == newer.peb {
        older
    } else {
        newer
    };
    s.lebs.insert(key, winner);
    s.scrub.remove(&loser.peb);
    s.kind[loser.peb as usize] = Kind::Erase;
    Ok(if loser.peb == peb {
        Kind::Erase
    } else {
        Kind::Used
    })
}

/// Whether the copy in `f` (an atomic change or a move) was written whole: its data reads and
/// matches the CRC in its header.
fn copy_is_whole(io: &Io, s: &mut Scan, f: Found) -> Result<bool, Error> {
    let mut data = vec![0u8; f.vid.data_size as usize];
    match io.read_data(f.peb, 0, &mut data) {
        Ok(flips) => {
            if flips {
                s.scrub.insert(f.peb);
            }
            Ok(crc(&data) == f.vid.data_crc)
        }
        Err(Error::Flash(FlashError::Uncorrectable { .. })) => Ok(false),
        Err(e) => Err(e),
    }
}
