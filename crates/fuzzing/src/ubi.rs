//! UBI attach of arbitrary flash contents.

use std::sync::Arc;

use sectorcrypt_flash::dump::{DumpFlash, Layout};
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_storage::{MemStorage, Storage};
use sectorcrypt_ubi::block::VolumeStorage;
use sectorcrypt_ubi::media::{
    crc, Layout as UbiLayout, VolType, EC_HDR_MAGIC, EC_HDR_SIZE, LAYOUT_VOLUME_ID, VID_HDR_MAGIC,
    VID_HDR_SIZE, VTBL_RECORD_SIZE,
};
use sectorcrypt_ubi::{AttachOptions, NewVolume, Ubi};

/// The chip of the UBI seeds (`ubinize -p 16KiB -m 512 -s 512`): small-page NAND, 32
/// eraseblocks (512 KiB).
pub(crate) const UBI_GEOMETRY: Geometry = Geometry {
    peb_size: 16 << 10,
    page_size: 512,
    sub_page_size: 512,
    oob_size: 16,
    peb_count: 32,
    nop: 1,
};

/// The input as the start of a raw flash dump (a `ubinize` image is one), the rest of the chip
/// erased, its header CRCs made right ([`seal_headers`]): attach it as the kernel would (scan, volume table, EBA, wear-levelling, auto-resize,
/// formatting an empty flash), read every LEB of every volume and each volume as a device,
/// write through UBI (a LEB of each dynamic volume, a new volume), and attach what that left.
pub fn ubi_attach(data: &[u8]) {
    let g = UBI_GEOMETRY;
    let mut chip = vec![0xFF; g.size() as usize];
    let n = data.len().min(chip.len());
    chip[..n].copy_from_slice(&data[..n]);
    seal_headers(&mut chip);
    let Ok(dump) = DumpFlash::open(Box::new(MemStorage::new(chip)), g, Layout::DataOnly) else {
        return;
    };
    let flash: Arc<dyn Flash> = Arc::new(dump);
    let opts = AttachOptions::default();
    let Ok(ubi) = Ubi::attach(Arc::clone(&flash), &opts) else {
        return;
    };
    let ubi = Arc::new(ubi);
    let info = ubi.info();
    for v in &info.volumes {
        let mut leb = vec![0u8; v.usable_leb_size as usize];
        for lnum in 0..v.lebs {
            let _ = ubi.read(v.id, lnum, 0, &mut leb);
        }
        if let Ok(dev) = VolumeStorage::open(Arc::clone(&ubi), v.id, false) {
            let mut head = [0u8; 512];
            if dev.read_at(&mut head, 0).is_ok() && dev.is_writable() {
                head[0] ^= 0xA5;
                let _ = dev.write_at(&head, 0);
            }
        }
        if v.vol_type == VolType::Dynamic && v.lebs > 0 {
            let _ = ubi.change(v.id, v.lebs - 1, &[0x5A; 512]);
        }
    }
    let _ = ubi.create_volume(&NewVolume {
        id: None,
        name: "fuzz".into(),
        lebs: 1,
        vol_type: VolType::Dynamic,
        alignment: 1,
        autoresize: false,
    });
    let _ = ubi.sync();
    drop(ubi);
    let _ = Ubi::attach(flash, &opts);
}

/// Where a header's CRC is: its last 4 bytes, over the bytes before them.
const HDR_CRC_AT: usize = 60;

/// Make the CRC of every EC header, VID header and volume-table record right, unless the
/// input stores 0 there: a CRC32 is what a mutation cannot fix, so without this nearly every
/// mutation of a header field would stop at the CRC check and the parsers behind it would go
/// unfuzzed (a planted unchecked name length in the volume table went unfound for 10 minutes).
/// A stored 0 keeps the wrong-CRC paths reachable.
fn seal_headers(chip: &mut [u8]) {
    let g = UBI_GEOMETRY;
    let Ok(layout) = UbiLayout::new(g.peb_size, g.page_size, g.sub_page_size, None) else {
        return;
    };
    let be32 = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let seal = |b: &mut [u8], len: usize| {
        let at = len - 4;
        if be32(b, at) != 0 {
            let c = crc(&b[..at]);
            b[at..len].copy_from_slice(&c.to_be_bytes());
        }
    };
    for peb in chip.chunks_mut(g.peb_size as usize) {
        if be32(peb, 0) == EC_HDR_MAGIC {
            seal(&mut peb[..EC_HDR_SIZE], HDR_CRC_AT + 4);
        }
        let vid = layout.vid_hdr_offset as usize;
        let hdr = &mut peb[vid..vid + VID_HDR_SIZE];
        if be32(hdr, 0) != VID_HDR_MAGIC {
            continue;
        }
        seal(hdr, HDR_CRC_AT + 4);
        if be32(hdr, 8) == LAYOUT_VOLUME_ID {
            let table = &mut peb[layout.data_offset as usize..];
            for record in table
                .chunks_mut(VTBL_RECORD_SIZE)
                .take(layout.vtbl_slots as usize)
            {
                if record.len() == VTBL_RECORD_SIZE {
                    seal(record, VTBL_RECORD_SIZE);
                }
            }
        }
    }
}
