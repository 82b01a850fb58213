//! UBI's on-flash structures, bit for bit as Linux writes them (`drivers/mtd/ubi/ubi-media.h`):
//! the erase-counter (EC) header, the volume-identifier (VID) header and the volume-table
//! record, all big-endian and protected by UBI's CRC, and where they sit in an eraseblock
//! (`ubigen_info_init` in mtd-utils, `io_init` in the kernel).

use std::fmt;

/// "UBI#": the EC header magic.
pub const EC_HDR_MAGIC: u32 = 0x5542_4923;
/// "UBI!": the VID header magic.
pub const VID_HDR_MAGIC: u32 = 0x5542_4921;
/// The only UBI format version.
pub const VERSION: u8 = 1;
/// Bytes of an EC header.
pub const EC_HDR_SIZE: usize = 64;
/// Bytes of a VID header.
pub const VID_HDR_SIZE: usize = 64;
/// Bytes of a volume-table record.
pub const VTBL_RECORD_SIZE: usize = 172;
/// Most user volumes.
pub const MAX_VOLUMES: usize = 128;
/// Longest volume name (bytes, without the NUL).
pub const VOL_NAME_MAX: usize = 127;
/// The highest erase counter UBI accepts.
pub const MAX_ERASECOUNTER: u64 = 0x7FFF_FFFF;
/// Volume IDs from here on are UBI's own.
pub const INTERNAL_VOL_START: u32 = 0x7FFF_FFFF - 4096;
/// The layout volume, which holds the volume table.
pub const LAYOUT_VOLUME_ID: u32 = INTERNAL_VOL_START;
/// LEBs of the layout volume (each a full copy of the table).
pub const LAYOUT_VOLUME_EBS: u32 = 2;
/// The layout volume's name.
pub const LAYOUT_VOLUME_NAME: &str = "layout volume";
/// `compat` of the layout volume: an implementation that does not know it must refuse the
/// device.
pub const COMPAT_REJECT: u8 = 5;
/// Volume-table flag: grow this volume to fill the device on the first attach.
pub const VTBL_AUTORESIZE_FLG: u8 = 0x01;

/// UBI's CRC: CRC-32 (the zlib polynomial, reflected) seeded with 0xFFFFFFFF and **without**
/// the final inversion (`crc32(UBI_CRC32_INIT, buf, len)`).
pub fn crc(buf: &[u8]) -> u32 {
    !crc32fast::hash(buf)
}

/// Dynamic (read-write, any LEB) or static (written once whole, data CRC-checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolType {
    /// `UBI_VID_DYNAMIC` (1).
    Dynamic,
    /// `UBI_VID_STATIC` (2).
    Static,
}

impl VolType {
    fn byte(self) -> u8 {
        match self {
            VolType::Dynamic => 1,
            VolType::Static => 2,
        }
    }

    fn from_byte(b: u8) -> Option<VolType> {
        match b {
            1 => Some(VolType::Dynamic),
            2 => Some(VolType::Static),
            _ => None,
        }
    }
}

/// What reading a header found, as the kernel's `ubi_io_read_ec_hdr`/`_vid_hdr` classify it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Header<T> {
    /// A valid header.
    Valid(T),
    /// All 64 bytes 0xFF: never written (`UBI_IO_FF`).
    Empty,
    /// Bad magic or CRC, not all 0xFF (`UBI_IO_BAD_HDR`), with the reason.
    Corrupt(String),
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

/// Checks shared by both headers: all-0xFF, magic, CRC over the first 60 bytes.
fn check<T>(b: &[u8], magic: u32, what: &str) -> Result<(), Header<T>> {
    if b.iter().all(|&x| x == 0xFF) {
        return Err(Header::Empty);
    }
    if be32(b, 0) != magic {
        return Err(Header::Corrupt(format!(
            "bad {what} magic {:#010x}",
            be32(b, 0)
        )));
    }
    let want = be32(b, 60);
    let got = crc(&b[..60]);
    if want != got {
        return Err(Header::Corrupt(format!(
            "bad {what} CRC {want:#010x}, computed {got:#010x}"
        )));
    }
    Ok(())
}

/// Put the CRC of a header's first 60 bytes into its last 4, as both header kinds end.
fn seal(b: &mut [u8; 64]) {
    let c = crc(&b[..60]);
    b[60..64].copy_from_slice(&c.to_be_bytes());
}

/// The erase-counter header at offset 0 of every PEB UBI has erased.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EcHdr {
    /// How often the PEB was erased.
    pub ec: u64,
    /// Where the VID header is.
    pub vid_hdr_offset: u32,
    /// Where the data (the LEB) starts.
    pub data_offset: u32,
    /// The image's random number: every PEB of one UBI image carries the same.
    pub image_seq: u32,
}

impl EcHdr {
    /// The 64 bytes on flash.
    pub fn to_bytes(&self) -> [u8; EC_HDR_SIZE] {
        let mut b = [0u8; EC_HDR_SIZE];
        b[0..4].copy_from_slice(&EC_HDR_MAGIC.to_be_bytes());
        b[4] = VERSION;
        b[8..16].copy_from_slice(&self.ec.to_be_bytes());
        b[16..20].copy_from_slice(&self.vid_hdr_offset.to_be_bytes());
        b[20..24].copy_from_slice(&self.data_offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.image_seq.to_be_bytes());
        seal(&mut b);
        b
    }

    /// Parse the first 64 bytes of `b` (`validate_ec_hdr`): magic, CRC, version, EC range.
    pub fn parse(b: &[u8]) -> Header<EcHdr> {
        let b = &b[..EC_HDR_SIZE];
        if let Err(h) = check(b, EC_HDR_MAGIC, "EC header") {
            return h;
        }
        if b[4] != VERSION {
            return Header::Corrupt(format!("unknown UBI version {}", b[4]));
        }
        let h = EcHdr {
            ec: be64(b, 8),
            vid_hdr_offset: be32(b, 16),
            data_offset: be32(b, 20),
            image_seq: be32(b, 24),
        };
        if h.ec > MAX_ERASECOUNTER {
            return Header::Corrupt(format!("erase counter {} is too large", h.ec));
        }
        Header::Valid(h)
    }
}

/// The volume-identifier header: which LEB of which volume a PEB holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VidHdr {
    /// Dynamic or static.
    pub vol_type: VolType,
    /// Set when wear-levelling or an atomic change copied the LEB: `data_size` and `data_crc`
    /// then describe the data.
    pub copy_flag: bool,
    /// What to do if the volume is unknown (internal volumes only; 0 for user volumes).
    pub compat: u8,
    /// The volume.
    pub vol_id: u32,
    /// The logical eraseblock number.
    pub lnum: u32,
    /// Bytes of data (static volumes and copies).
    pub data_size: u32,
    /// LEBs the static volume uses.
    pub used_ebs: u32,
    /// Bytes left unused at the end of the LEB for alignment.
    pub data_pad: u32,
    /// CRC of the data (static volumes and copies).
    pub data_crc: u32,
    /// Global write sequence number: of two PEBs claiming one LEB, the higher wins.
    pub sqnum: u64,
}

impl VidHdr {
    /// A header for LEB `lnum` of a dynamic volume, not a copy.
    pub fn dynamic(vol_id: u32, lnum: u32, sqnum: u64) -> VidHdr {
        VidHdr {
            vol_type: VolType::Dynamic,
            copy_flag: false,
            compat: 0,
            vol_id,
            lnum,
            data_size: 0,
            used_ebs: 0,
            data_pad: 0,
            data_crc: 0,
            sqnum,
        }
    }

    /// The 64 bytes on flash.
    pub fn to_bytes(&self) -> [u8; VID_HDR_SIZE] {
        let mut b = [0u8; VID_HDR_SIZE];
        b[0..4].copy_from_slice(&VID_HDR_MAGIC.to_be_bytes());
        b[4] = VERSION;
        b[5] = self.vol_type.byte();
        b[6] = u8::from(self.copy_flag);
        b[7] = self.compat;
        b[8..12].copy_from_slice(&self.vol_id.to_be_bytes());
        b[12..16].copy_from_slice(&self.lnum.to_be_bytes());
        b[20..24].copy_from_slice(&self.data_size.to_be_bytes());
        b[24..28].copy_from_slice(&self.used_ebs.to_be_bytes());
        b[28..32].copy_from_slice(&self.data_pad.to_be_bytes());
        b[32..36].copy_from_slice(&self.data_crc.to_be_bytes());
        b[40..48].copy_from_slice(&self.sqnum.to_be_bytes());
        seal(&mut b);
        b
    }

    /// Parse the first 64 bytes of `b` with the kernel's `validate_vid_hdr` rules for a LEB of
    /// `leb_size` bytes.
    pub fn parse(b: &[u8], leb_size: u32) -> Header<VidHdr> {
        let b = &b[..VID_HDR_SIZE];
        if let Err(h) = check(b, VID_HDR_MAGIC, "VID header") {
            return h;
        }
        let bad = |why: String| Header::Corrupt(why);
        if b[4] != VERSION {
            return bad(format!("unknown UBI version {}", b[4]));
        }
        let Some(vol_type) = VolType::from_byte(b[5]) else {
            return bad(format!("unknown volume type {}", b[5]));
        };
        if b[6] > 1 {
            return bad(format!("bad copy flag {}", b[6]));
        }
        let h = VidHdr {
            vol_type,
            copy_flag: b[6] == 1,
            compat: b[7],
            vol_id: be32(b, 8),
            lnum: be32(b, 12),
            data_size: be32(b, 20),
            used_ebs: be32(b, 24),
            data_pad: be32(b, 28),
            data_crc: be32(b, 32),
            sqnum: be64(b, 40),
        };
        let internal = h.vol_id >= INTERNAL_VOL_START;
        if h.vol_id as usize >= MAX_VOLUMES && !internal {
            return bad(format!("volume ID {} is out of range", h.vol_id));
        }
        if !internal && h.compat != 0 {
            return bad(format!("user volume {} has compat {}", h.vol_id, h.compat));
        }
        if internal && !matches!(h.compat, 1 | 2 | 4 | 5) {
            return bad(format!("internal volume with compat {}", h.compat));
        }
        if h.data_pad >= leb_size / 2 {
            return bad(format!("data_pad {} is too large", h.data_pad));
        }
        match vol_type {
            VolType::Static => {
                if h.used_ebs == 0 {
                    return bad("a static volume's LEB with used_ebs 0".into());
                }
                if h.lnum >= h.used_ebs {
                    return bad(format!("LEB {} past used_ebs {}", h.lnum, h.used_ebs));
                }
                let room = leb_size - h.data_pad;
                if h.data_size > room {
                    return bad(format!("data_size {} over {room}", h.data_size));
                }
            }
            VolType::Dynamic => {
                if h.used_ebs != 0 {
                    return bad("a dynamic volume's LEB with used_ebs".into());
                }
                if !h.copy_flag && (h.data_crc != 0 || h.data_size != 0) {
                    return bad("a dynamic LEB that is no copy has data_size or data_crc".into());
                }
                if h.data_size > leb_size - h.data_pad {
                    return bad(format!("data_size {} too large", h.data_size));
                }
            }
        }
        Header::Valid(h)
    }
}

/// One volume's entry in the volume table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VtblRecord {
    /// PEBs reserved for the volume (its size in LEBs).
    pub reserved_pebs: u32,
    /// LEB alignment (1 = none).
    pub alignment: u32,
    /// Bytes unused at the end of each LEB so that LEBs are a multiple of `alignment`.
    pub data_pad: u32,
    /// Dynamic or static.
    pub vol_type: VolType,
    /// Set while the volume is being updated: its contents are not to be trusted.
    pub upd_marker: bool,
    /// The name (at most 127 bytes).
    pub name: Vec<u8>,
    /// `VTBL_AUTORESIZE_FLG` and others.
    pub flags: u8,
}

impl VtblRecord {
    /// The 172 bytes of table slot for `record` (`None`: an empty slot, all zeros with the CRC of
    /// zeros).
    pub fn to_bytes(record: Option<&VtblRecord>) -> [u8; VTBL_RECORD_SIZE] {
        let mut b = [0u8; VTBL_RECORD_SIZE];
        if let Some(r) = record {
            b[0..4].copy_from_slice(&r.reserved_pebs.to_be_bytes());
            b[4..8].copy_from_slice(&r.alignment.to_be_bytes());
            b[8..12].copy_from_slice(&r.data_pad.to_be_bytes());
            b[12] = r.vol_type.byte();
            b[13] = u8::from(r.upd_marker);
            let n = r.name.len().min(VOL_NAME_MAX);
            b[14..16].copy_from_slice(&(n as u16).to_be_bytes());
            b[16..16 + n].copy_from_slice(&r.name[..n]);
            b[144] = r.flags;
        }
        let c = crc(&b[..168]);
        b[168..172].copy_from_slice(&c.to_be_bytes());
        b
    }

    /// Parse one slot (`vtbl_check`): `Ok(None)` for an empty slot.
    pub fn parse(b: &[u8], slot: usize) -> Result<Option<VtblRecord>, String> {
        let b = &b[..VTBL_RECORD_SIZE];
        let want = be32(b, 168);
        let got = crc(&b[..168]);
        if want != got {
            return Err(format!(
                "volume table slot {slot}: bad CRC {want:#010x}, computed {got:#010x}"
            ));
        }
        let reserved_pebs = be32(b, 0);
        if reserved_pebs == 0 {
            if b[..168].iter().any(|&x| x != 0) {
                return Err(format!("volume table slot {slot}: empty but not zeroed"));
            }
            return Ok(None);
        }
        let bad = |why: String| Err(format!("volume table slot {slot}: {why}"));
        let name_len = usize::from(u16::from_be_bytes([b[14], b[15]]));
        if name_len == 0 || name_len > VOL_NAME_MAX {
            return bad(format!("name length {name_len}"));
        }
        let name = b[16..16 + name_len].to_vec();
        if name.contains(&0) || b[16 + name_len] != 0 {
            return bad("the name's length does not match its NUL".into());
        }
        let Some(vol_type) = VolType::from_byte(b[12]) else {
            return bad(format!("volume type {}", b[12]));
        };
        let alignment = be32(b, 4);
        if alignment == 0 {
            return bad("alignment 0".into());
        }
        if b[13] > 1 {
            return bad(format!("update marker {}", b[13]));
        }
        Ok(Some(VtblRecord {
            reserved_pebs,
            alignment,
            data_pad: be32(b, 8),
            vol_type,
            upd_marker: b[13] == 1,
            name,
            flags: b[144],
        }))
    }
}

/// Where things are in a PEB of a given chip, computed as mtd-utils and the kernel do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of a PEB.
    pub peb_size: u32,
    /// The minimum I/O unit (page).
    pub min_io_size: u32,
    /// The unit headers are written in (the sub-page).
    pub hdrs_min_io_size: u32,
    /// Offset of the VID header.
    pub vid_hdr_offset: u32,
    /// Offset of the data: the LEB starts here.
    pub data_offset: u32,
    /// Bytes of a LEB.
    pub leb_size: u32,
    /// Bytes of the volume table (slots × 172, rounded up to the minimum I/O unit).
    pub vtbl_size: u32,
    /// Slots in the volume table.
    pub vtbl_slots: u32,
}

impl Layout {
    /// The layout of a chip with these sizes; `vid_hdr_offset` `None` is the default (the first
    /// sub-page after the EC header), as `ubinize -O` / `ubiattach -O` take it.
    pub fn new(
        peb_size: u32,
        min_io_size: u32,
        sub_page_size: u32,
        vid_hdr_offset: Option<u32>,
    ) -> Result<Layout, String> {
        let align = |v: u32, a: u32| v.div_ceil(a) * a;
        let vid = vid_hdr_offset.unwrap_or_else(|| align(EC_HDR_SIZE as u32, sub_page_size));
        if vid < EC_HDR_SIZE as u32 || !vid.is_multiple_of(8) {
            return Err(format!("bad VID header offset {vid}"));
        }
        let data_offset = align(vid + VID_HDR_SIZE as u32, min_io_size);
        if data_offset >= peb_size {
            return Err(format!(
                "the data offset {data_offset} leaves nothing of the {peb_size}-byte PEB"
            ));
        }
        let leb_size = peb_size - data_offset;
        let vtbl_slots = (leb_size as usize / VTBL_RECORD_SIZE).min(MAX_VOLUMES) as u32;
        let vtbl_size = align(vtbl_slots * VTBL_RECORD_SIZE as u32, min_io_size);
        Ok(Layout {
            peb_size,
            min_io_size,
            hdrs_min_io_size: sub_page_size,
            vid_hdr_offset: vid,
            data_offset,
            leb_size,
            vtbl_size,
            vtbl_slots,
        })
    }

    /// The VID header's offset rounded down to the header I/O unit (`vid_hdr_aloffset`): UBI
    /// writes the VID header as one unit from here.
    pub fn vid_hdr_aloffset(&self) -> u32 {
        self.vid_hdr_offset / self.hdrs_min_io_size * self.hdrs_min_io_size
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PEB {} bytes, min. I/O {}, header I/O {}, VID header at {}, data at {}, LEB {} bytes",
            self.peb_size,
            self.min_io_size,
            self.hdrs_min_io_size,
            self.vid_hdr_offset,
            self.data_offset,
            self.leb_size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_is_ubis() {
        // zlib.crc32(b"123456789") = 0xcbf43926; UBI leaves out the final inversion.
        assert_eq!(crc(b"123456789"), !0xcbf4_3926);
    }

    #[test]
    fn layouts_match_ubinize() {
        // FLASH.md §1.5, measured with `ubinize -v`.
        for (p, m, s, o, vid, data, leb) in [
            (128 << 10, 2048, 512, None, 512, 2048, 129024),
            (128 << 10, 2048, 2048, None, 2048, 4096, 126976),
            (256 << 10, 4096, 4096, None, 4096, 8192, 253952),
            (128 << 10, 2048, 512, Some(1984), 1984, 2048, 129024),
        ] {
            let l = Layout::new(p, m, s, o).unwrap();
            assert_eq!(
                (l.vid_hdr_offset, l.data_offset, l.leb_size),
                (vid, data, leb)
            );
        }
        let l = Layout::new(128 << 10, 2048, 512, None).unwrap();
        assert_eq!((l.vtbl_slots, l.vtbl_size), (128, 22528));
        assert_eq!(
            Layout::new(128 << 10, 2048, 512, Some(1984))
                .unwrap()
                .vid_hdr_aloffset(),
            1536
        );
    }

    #[test]
    fn headers_round_trip_and_damage_is_seen() {
        let ec = EcHdr {
            ec: 17,
            vid_hdr_offset: 512,
            data_offset: 2048,
            image_seq: 0x1234,
        };
        let mut b = ec.to_bytes();
        assert_eq!(&b[..4], b"UBI#");
        assert_eq!(EcHdr::parse(&b), Header::Valid(ec));
        b[9] ^= 1;
        assert!(matches!(EcHdr::parse(&b), Header::Corrupt(_)));
        assert_eq!(EcHdr::parse(&[0xFF; 64]), Header::Empty);

        let vid = VidHdr::dynamic(3, 7, 99);
        let b = vid.to_bytes();
        assert_eq!(&b[..4], b"UBI!");
        assert_eq!(VidHdr::parse(&b, 129024), Header::Valid(vid));
        let mut wrong = vid;
        wrong.data_size = 5;
        assert!(matches!(
            VidHdr::parse(&wrong.to_bytes(), 129024),
            Header::Corrupt(_)
        ));
    }

    #[test]
    fn vtbl_records_round_trip() {
        let r = VtblRecord {
            reserved_pebs: 9,
            alignment: 1,
            data_pad: 0,
            vol_type: VolType::Dynamic,
            upd_marker: false,
            name: b"data".to_vec(),
            flags: VTBL_AUTORESIZE_FLG,
        };
        let b = VtblRecord::to_bytes(Some(&r));
        assert_eq!(VtblRecord::parse(&b, 0), Ok(Some(r)));
        let empty = VtblRecord::to_bytes(None);
        assert_eq!(VtblRecord::parse(&empty, 1), Ok(None));
        assert_eq!(&empty[168..], &crc(&[0; 168]).to_be_bytes());
        let mut bad = b;
        bad[20] ^= 1;
        assert!(VtblRecord::parse(&bad, 0).is_err());
    }
}
