//! Foreign signatures on a LUKS device: the file systems, volume managers and partition tables
//! that libblkid would report there, looked for the way libblkid looks (a magic at a fixed
//! offset, checked further where libblkid checks further: LVM2's and GPT's checksums, the swap
//! header's version, the MBR's boot flags).
//!
//! Why: when one LUKS2 header copy is unusable or out of date, cryptsetup probes the device with
//! libblkid (LUKS filtered out) before it would recover the bad copy from the good one, and
//! refuses with "ambiguous signatures" if anything else is there, so that no one rewrites a LUKS
//! header over a live LVM physical volume or file system that has since been created on the
//! device. This module is that probe, on any [`Storage`] (files, block devices, a flash header
//! area), without a C library: it covers the signatures below, each checked against the real
//! `blkid -p` in the tests; libblkid knows more exotic ones.

use sectorcrypt_storage::Storage;

use crate::error::Error;

/// A foreign signature found: libblkid's name for it and the byte offset of its magic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// libblkid's `TYPE` (or `PTTYPE` for a partition table): `LVM2_member`, `ext4`, `swap`, ...
    pub kind: &'static str,
    /// Where its magic is.
    pub offset: u64,
}

/// Bytes `[offset, offset + len)` of `dev`, or `None` where the device is shorter.
fn bytes(
    dev: &dyn Storage,
    dev_len: u64,
    offset: u64,
    len: usize,
) -> Result<Option<Vec<u8>>, Error> {
    if offset + len as u64 > dev_len {
        return Ok(None);
    }
    let mut buf = vec![0u8; len];
    dev.read_at(&mut buf, offset).map_err(|e| Error::Io {
        device: dev.name(),
        source: e,
    })?;
    Ok(Some(buf))
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// LVM2's label checksum: reflected CRC-32 (polynomial 0xEDB88320) from 0xf597a6cf, no final
/// inversion.
fn lvm2_crc(data: &[u8]) -> u32 {
    let mut crc: u32 = 0xf597_a6cf;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & 0u32.wrapping_sub(crc & 1));
        }
    }
    crc
}

/// An LVM2 physical-volume label in one of the first four sectors, with its checksum right.
fn lvm2(dev: &dyn Storage, len: u64) -> Result<Option<Signature>, Error> {
    for sector in 0..4u64 {
        let Some(s) = bytes(dev, len, sector * 512, 512)? else {
            break;
        };
        if &s[0..8] == b"LABELONE"
            && &s[24..32] == b"LVM2 001"
            && u64::from_le_bytes(s[8..16].try_into().expect("8 bytes")) == sector
            && le32(&s, 16) == lvm2_crc(&s[20..])
        {
            return Ok(Some(Signature {
                kind: "LVM2_member",
                offset: sector * 512,
            }));
        }
    }
    Ok(None)
}

/// An ext2/3/4 superblock (magic 0xEF53 at 1080, a plausible block size and block count); the
/// kind by its journal and extent features, as libblkid names them.
fn ext(dev: &dyn Storage, len: u64) -> Result<Option<Signature>, Error> {
    let Some(sb) = bytes(dev, len, 1024, 1024)? else {
        return Ok(None);
    };
    let blocks = le32(&sb, 4);
    let log_block = le32(&sb, 24);
    if le16(&sb, 56) != 0xEF53 || blocks == 0 || log_block > 6 {
        return Ok(None);
    }
    let (compat, incompat) = (le32(&sb, 92), le32(&sb, 96));
    const HAS_JOURNAL: u32 = 0x4;
    const INCOMPAT_EXTENTS_64BIT_FLEX: u32 = 0x40 | 0x80 | 0x200;
    let kind = if incompat & INCOMPAT_EXTENTS_64BIT_FLEX != 0 {
        "ext4"
    } else if compat & HAS_JOURNAL != 0 {
        "ext3"
    } else {
        "ext2"
    };
    Ok(Some(Signature { kind, offset: 1080 }))
}

/// A swap area: `SWAPSPACE2` (or the old `SWAP-SPACE`) in the last ten bytes of the first page,
/// for every page size Linux has; version 1 headers need their version right, as libblkid
/// checks.
fn swap(dev: &dyn Storage, len: u64) -> Result<Option<Signature>, Error> {
    for page in [4096u64, 8192, 16384, 65536] {
        let Some(magic) = bytes(dev, len, page - 10, 10)? else {
            break;
        };
        let new = &magic[..] == b"SWAPSPACE2";
        if !new && &magic[..] != b"SWAP-SPACE" {
            continue;
        }
        if new {
            let Some(h) = bytes(dev, len, 1024, 8)? else {
                continue;
            };
            // version 1 and a last page past the header, in either byte order.
            let (version, last) = (le32(&h, 0), le32(&h, 4));
            let ok = (version == 1 && last > 0) || (version.swap_bytes() == 1 && last != 0);
            if !ok {
                continue;
            }
        }
        return Ok(Some(Signature {
            kind: "swap",
            offset: page - 10,
        }));
    }
    Ok(None)
}

/// Magics that identify a superblock by themselves (libblkid checks some further, but a match
/// of this length is no accident on an encrypted device).
const PLAIN_MAGICS: &[(&str, u64, &[u8])] = &[
    ("xfs", 0, b"XFSB"),
    ("btrfs", 65536 + 64, b"_BHRfS_M"),
    ("iso9660", 32769, b"CD001"),
    ("squashfs", 0, b"hsqs"),
    ("ntfs", 3, b"NTFS    "),
    ("f2fs", 1024, &[0x10, 0x20, 0xF5, 0xF2]),
    ("linux_raid_member", 4096, &[0xfc, 0x4e, 0x2b, 0xa9]),
    ("linux_raid_member", 0, &[0xfc, 0x4e, 0x2b, 0xa9]),
    (
        "bcache",
        4096 + 24,
        &[
            0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca, 0x82, 0x65, 0xf5, 0x7f, 0x48, 0xba,
            0x6d, 0x81,
        ],
    ),
];

fn plain(dev: &dyn Storage, len: u64) -> Result<Option<Signature>, Error> {
    for &(kind, offset, magic) in PLAIN_MAGICS {
        if bytes(dev, len, offset, magic.len())?.as_deref() == Some(magic) {
            return Ok(Some(Signature { kind, offset }));
        }
    }
    Ok(None)
}

/// A GPT header at LBA 1 (`EFI PART`, its CRC-32 right).
fn gpt(dev: &dyn Storage, len: u64) -> Result<Option<Signature>, Error> {
    let Some(mut h) = bytes(dev, len, 512, 512)? else {
        return Ok(None);
    };
    let size = le32(&h, 12) as usize;
    if &h[..8] != b"EFI PART" || !(92..=512).contains(&size) {
        return Ok(None);
    }
    let want = le32(&h, 16);
    h[16..20].fill(0);
    let found = crc32fast::hash(&h[..size]) == want;
    Ok(found.then_some(Signature {
        kind: "gpt",
        offset: 512,
    }))
}

/// An MBR partition table (`dos`): the 0x55AA signature, every boot flag 0x00 or 0x80, and at
/// least one partition.
fn dos(dev: &dyn Storage, len: u64) -> Result<Option<Signature>, Error> {
    let Some(s) = bytes(dev, len, 0, 512)? else {
        return Ok(None);
    };
    if s[510] != 0x55 || s[511] != 0xAA {
        return Ok(None);
    }
    let entries: Vec<&[u8]> = s[446..510].chunks(16).collect();
    let flags_ok = entries.iter().all(|e| e[0] == 0 || e[0] == 0x80);
    let any = entries.iter().any(|e| e[4] != 0);
    Ok((flags_ok && any).then_some(Signature {
        kind: "dos",
        offset: 510,
    }))
}

/// The first foreign signature on `dev` (LUKS itself is not looked for), or `None`.
pub fn probe(dev: &dyn Storage) -> Result<Option<Signature>, Error> {
    let len = dev.len().map_err(|e| Error::Io {
        device: dev.name(),
        source: e,
    })?;
    type Probe = fn(&dyn Storage, u64) -> Result<Option<Signature>, Error>;
    // Partition tables last, as libblkid reports a file system on a whole device first.
    let probes: [Probe; 6] = [lvm2, ext, swap, plain, gpt, dos];
    for p in probes {
        if let Some(s) = p(dev, len)? {
            return Ok(Some(s));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sectorcrypt_storage::MemStorage;

    #[test]
    fn nothing_on_zeros_or_random_bytes() {
        assert_eq!(probe(&MemStorage::new(vec![0; 1 << 20])).unwrap(), None);
        let mut state = 1u64;
        let random: Vec<u8> = (0..1 << 20)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as u8
            })
            .collect();
        assert_eq!(probe(&MemStorage::new(random)).unwrap(), None);
        // A device shorter than the probes' offsets is simply not looked at there.
        assert_eq!(probe(&MemStorage::new(vec![0; 600])).unwrap(), None);
    }

    #[test]
    fn an_lvm2_label_needs_its_checksum() {
        let mut dev = vec![0u8; 1 << 20];
        let s = &mut dev[512..1024];
        s[0..8].copy_from_slice(b"LABELONE");
        s[8..16].copy_from_slice(&1u64.to_le_bytes());
        s[20..24].copy_from_slice(&32u32.to_le_bytes());
        s[24..32].copy_from_slice(b"LVM2 001");
        let crc = lvm2_crc(&s[20..]);
        s[16..20].copy_from_slice(&(crc ^ 1).to_le_bytes());
        assert_eq!(probe(&MemStorage::new(dev.clone())).unwrap(), None);
        dev[528..532].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            probe(&MemStorage::new(dev)).unwrap(),
            Some(Signature {
                kind: "LVM2_member",
                offset: 512
            })
        );
    }
}
