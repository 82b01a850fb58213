//! The LUKS2 binary header (cryptsetup's `struct luks2_hdr_disk`): 4096 bytes at the start of each
//! of the two header copies, followed by that copy's JSON area. Integers are big endian; strings
//! are NUL-terminated and zero-padded.
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0   | 6   | magic: `LUKS\xba\xbe` (primary) or `SKUL\xba\xbe` (secondary) |
//! | 6   | 2   | version (2) |
//! | 8   | 8   | hdr_size: binary header plus JSON area, 16 KiB to 4 MiB |
//! | 16  | 8   | seqid: incremented on every metadata update |
//! | 24  | 48  | label |
//! | 72  | 32  | checksum_alg (`sha256`) |
//! | 104 | 64  | salt, different in each copy |
//! | 168 | 40  | uuid |
//! | 208 | 48  | subsystem |
//! | 256 | 8   | hdr_offset: where this copy starts on the device |
//! | 264 | 184 | padding (zero) |
//! | 448 | 64  | checksum of the binary header (checksum field zeroed) and the whole JSON area |
//! | 512 | 3584 | padding (zero) |
//!
//! The primary copy is at offset 0, the secondary right after it at offset `hdr_size`.

use crate::hash::Hash;

/// Bytes of the binary header (`LUKS2_HDR_BIN_LEN`).
pub const BIN_LEN: usize = 4096;
/// Magic of the primary copy.
pub const MAGIC_PRIMARY: [u8; 6] = *b"LUKS\xba\xbe";
/// Magic of the secondary copy.
pub const MAGIC_SECONDARY: [u8; 6] = *b"SKUL\xba\xbe";
/// The only version this module reads.
pub const VERSION: u16 = 2;
/// Smallest header size (`LUKS2_HDR_16K_LEN`).
pub const HDR_SIZE_MIN: u64 = 0x4000;
/// Largest header size (`LUKS2_HDR_OFFSET_MAX`).
pub const HDR_SIZE_MAX: u64 = 0x40_0000;
/// The header sizes cryptsetup allows (`LUKS2_check_metadata_area_size`), which are also the
/// offsets it searches for the secondary copy when the primary gives no usable size
/// (`LUKS2_HDR2_OFFSETS`).
pub const HDR_SIZES: [u64; 9] = [
    0x4000, 0x8000, 0x1_0000, 0x2_0000, 0x4_0000, 0x8_0000, 0x10_0000, 0x20_0000, 0x40_0000,
];

const OFF_VERSION: usize = 6;
const OFF_HDR_SIZE: usize = 8;
const OFF_SEQID: usize = 16;
const OFF_LABEL: usize = 24;
const OFF_CHECKSUM_ALG: usize = 72;
const OFF_SALT: usize = 104;
const OFF_UUID: usize = 168;
const OFF_SUBSYSTEM: usize = 208;
const OFF_HDR_OFFSET: usize = 256;
const OFF_CHECKSUM: usize = 448;

/// Bytes of the label and subsystem fields.
pub const LABEL_LEN: usize = 48;
/// Bytes of the checksum algorithm field.
pub const CHECKSUM_ALG_LEN: usize = 32;
/// Bytes of the salt field.
pub const SALT_LEN: usize = 64;
/// Bytes of the UUID field.
pub const UUID_LEN: usize = 40;
/// Bytes of the checksum field (a digest may be shorter; the rest is zero).
pub const CHECKSUM_LEN: usize = 64;

/// Which of the two header copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderCopy {
    /// The copy at offset 0 (magic `LUKS\xba\xbe`).
    Primary,
    /// The copy at offset `hdr_size` (magic `SKUL\xba\xbe`).
    Secondary,
}

impl HeaderCopy {
    /// The magic this copy starts with.
    pub fn magic(self) -> [u8; 6] {
        match self {
            HeaderCopy::Primary => MAGIC_PRIMARY,
            HeaderCopy::Secondary => MAGIC_SECONDARY,
        }
    }

    /// "primary" or "secondary", for messages.
    pub fn name(self) -> &'static str {
        match self {
            HeaderCopy::Primary => "primary",
            HeaderCopy::Secondary => "secondary",
        }
    }
}

/// The fields of one binary header copy, as stored (text fields as their raw bytes, so that
/// writing them back reproduces what was read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinaryHeader {
    /// The copy, from the magic.
    pub copy: HeaderCopy,
    /// The format version (2).
    pub version: u16,
    /// Bytes of the binary header plus the JSON area.
    pub hdr_size: u64,
    /// The sequence number, incremented on every update.
    pub seqid: u64,
    /// The label field.
    pub label: [u8; LABEL_LEN],
    /// The checksum algorithm field.
    pub checksum_alg: [u8; CHECKSUM_ALG_LEN],
    /// This copy's salt.
    pub salt: [u8; SALT_LEN],
    /// The UUID field.
    pub uuid: [u8; UUID_LEN],
    /// The subsystem field.
    pub subsystem: [u8; LABEL_LEN],
    /// Where this copy starts on the device.
    pub hdr_offset: u64,
    /// The stored checksum.
    pub checksum: [u8; CHECKSUM_LEN],
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut v = [0u8; N];
    v.copy_from_slice(&b[at..at + N]);
    v
}

/// The text of a NUL-terminated field the way cryptsetup reads it: the last byte is forced to NUL
/// (`hdr_from_disk`), so the text is whatever precedes the first NUL in the rest. Bytes that are
/// not UTF-8 are shown as U+FFFD; the raw bytes stay in [`BinaryHeader`].
pub fn field_text(field: &[u8]) -> String {
    let usable = &field[..field.len().saturating_sub(1)];
    let end = usable.iter().position(|&b| b == 0).unwrap_or(usable.len());
    String::from_utf8_lossy(&usable[..end]).into_owned()
}

impl BinaryHeader {
    /// The magic's copy, if `bytes` starts with a LUKS2 magic (any version).
    pub fn magic_copy(bytes: &[u8]) -> Option<HeaderCopy> {
        match bytes.get(..6)? {
            m if m == MAGIC_PRIMARY => Some(HeaderCopy::Primary),
            m if m == MAGIC_SECONDARY => Some(HeaderCopy::Secondary),
            _ => None,
        }
    }

    /// Decode the fields of a binary header; `None` without a LUKS2 magic. Nothing else is
    /// checked here.
    pub fn parse(bytes: &[u8; BIN_LEN]) -> Option<BinaryHeader> {
        Some(BinaryHeader {
            copy: Self::magic_copy(bytes)?,
            version: be16(bytes, OFF_VERSION),
            hdr_size: be64(bytes, OFF_HDR_SIZE),
            seqid: be64(bytes, OFF_SEQID),
            label: array(bytes, OFF_LABEL),
            checksum_alg: array(bytes, OFF_CHECKSUM_ALG),
            salt: array(bytes, OFF_SALT),
            uuid: array(bytes, OFF_UUID),
            subsystem: array(bytes, OFF_SUBSYSTEM),
            hdr_offset: be64(bytes, OFF_HDR_OFFSET),
            checksum: array(bytes, OFF_CHECKSUM),
        })
    }

    /// The on-disk bytes, padding zeroed as cryptsetup writes it (`hdr_to_disk`), with the stored
    /// checksum field (see [`BinaryHeader::seal`] to compute it).
    pub fn to_bytes(&self) -> [u8; BIN_LEN] {
        let mut b = [0u8; BIN_LEN];
        b[..6].copy_from_slice(&self.copy.magic());
        b[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&self.version.to_be_bytes());
        b[OFF_HDR_SIZE..OFF_HDR_SIZE + 8].copy_from_slice(&self.hdr_size.to_be_bytes());
        b[OFF_SEQID..OFF_SEQID + 8].copy_from_slice(&self.seqid.to_be_bytes());
        b[OFF_LABEL..OFF_LABEL + LABEL_LEN].copy_from_slice(&self.label);
        b[OFF_CHECKSUM_ALG..OFF_CHECKSUM_ALG + CHECKSUM_ALG_LEN]
            .copy_from_slice(&self.checksum_alg);
        b[OFF_SALT..OFF_SALT + SALT_LEN].copy_from_slice(&self.salt);
        b[OFF_UUID..OFF_UUID + UUID_LEN].copy_from_slice(&self.uuid);
        b[OFF_SUBSYSTEM..OFF_SUBSYSTEM + LABEL_LEN].copy_from_slice(&self.subsystem);
        b[OFF_HDR_OFFSET..OFF_HDR_OFFSET + 8].copy_from_slice(&self.hdr_offset.to_be_bytes());
        b[OFF_CHECKSUM..OFF_CHECKSUM + CHECKSUM_LEN].copy_from_slice(&self.checksum);
        b
    }

    /// The checksum algorithm's name.
    pub fn checksum_alg_name(&self) -> String {
        field_text(&self.checksum_alg)
    }

    /// The checksum algorithm, if sectorcrypt implements it.
    pub fn checksum_hash(&self) -> Result<Hash, crate::Error> {
        crate::hash::parse(&self.checksum_alg_name())
    }

    /// Compute the checksum for `json_area` and store it in the checksum field.
    pub fn seal(&mut self, json_area: &[u8]) -> Result<(), crate::Error> {
        let hash = self.checksum_hash()?;
        self.checksum = [0; CHECKSUM_LEN];
        let mut sum = [0u8; CHECKSUM_LEN];
        checksum(
            hash,
            &self.to_bytes(),
            json_area,
            &mut sum[..hash.digest_len()],
        );
        self.checksum = sum;
        Ok(())
    }
}

/// The header checksum: `hash(binary header with the checksum field zeroed || JSON area)`, the
/// JSON area including its unused (zero) tail, written to `out` (the digest's length).
pub fn checksum(hash: Hash, bin: &[u8; BIN_LEN], json_area: &[u8], out: &mut [u8]) {
    let mut zeroed = *bin;
    zeroed[OFF_CHECKSUM..OFF_CHECKSUM + CHECKSUM_LEN].fill(0);
    hash.digest_into(&[&zeroed, json_area], out);
}

/// Whether the checksum stored in `bin` matches. Only the digest's length is compared: the rest
/// of the 64-byte field is ignored, as cryptsetup does (`hdr_checksum_check`).
pub fn checksum_matches(hash: Hash, bin: &[u8; BIN_LEN], json_area: &[u8]) -> bool {
    let mut sum = [0u8; CHECKSUM_LEN];
    let n = hash.digest_len();
    checksum(hash, bin, json_area, &mut sum[..n]);
    sum[..n] == bin[OFF_CHECKSUM..OFF_CHECKSUM + n]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BinaryHeader {
        let mut label = [0u8; LABEL_LEN];
        label[..5].copy_from_slice(b"hello");
        let mut alg = [0u8; CHECKSUM_ALG_LEN];
        alg[..6].copy_from_slice(b"sha256");
        let mut uuid = [0u8; UUID_LEN];
        uuid[..36].copy_from_slice(b"b6d64927-a16a-42b1-bbff-e0d1ee0e1e25");
        BinaryHeader {
            copy: HeaderCopy::Secondary,
            version: 2,
            hdr_size: 0x4000,
            seqid: 0x0102_0304_0506_0708,
            label,
            checksum_alg: alg,
            salt: [7; SALT_LEN],
            uuid,
            subsystem: [0; LABEL_LEN],
            hdr_offset: 0x4000,
            checksum: [0; CHECKSUM_LEN],
        }
    }

    /// The field offsets are cryptsetup's (checked against a hexdump of a cryptsetup header: the
    /// algorithm at 0x48, salt at 0x68, UUID at 0xa8, checksum at 0x1c0).
    #[test]
    fn layout_and_round_trip() {
        let h = sample();
        let b = h.to_bytes();
        assert_eq!(&b[..6], b"SKUL\xba\xbe");
        assert_eq!(&b[6..8], &[0, 2]);
        assert_eq!(&b[8..16], &[0, 0, 0, 0, 0, 0, 0x40, 0]);
        assert_eq!(&b[16..24], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[0x18..0x1d], b"hello");
        assert_eq!(&b[0x48..0x4e], b"sha256");
        assert_eq!(b[0x68], 7);
        assert_eq!(&b[0xa8..0xac], b"b6d6");
        assert_eq!(&b[0x100..0x108], &[0, 0, 0, 0, 0, 0, 0x40, 0]);
        assert_eq!(BinaryHeader::parse(&b), Some(h));
        assert_eq!(BinaryHeader::parse(&[0u8; BIN_LEN]), None);
    }

    #[test]
    fn seal_then_check_and_any_flip_breaks_it() {
        let mut h = sample();
        let mut json = vec![0u8; 0x4000 - BIN_LEN];
        json[..2].copy_from_slice(b"{}");
        h.seal(&json).unwrap();
        let b = h.to_bytes();
        assert!(checksum_matches(Hash::Sha256, &b, &json));
        // The bytes of the field past a SHA-256 digest are not part of the comparison.
        let mut tail = b;
        tail[OFF_CHECKSUM + 40] ^= 1;
        assert!(checksum_matches(Hash::Sha256, &tail, &json));
        for at in [0usize, 20, 300, OFF_CHECKSUM, 4000] {
            let mut bad = b;
            bad[at] ^= 1;
            assert!(!checksum_matches(Hash::Sha256, &bad, &json), "flip at {at}");
        }
        json[9000] = 1;
        assert!(!checksum_matches(Hash::Sha256, &b, &json));
    }

    #[test]
    fn text_fields_stop_at_nul_and_ignore_the_last_byte() {
        assert_eq!(field_text(b"abc\0def"), "abc");
        assert_eq!(field_text(b"abcd"), "abc");
        assert_eq!(field_text(b"\0"), "");
    }
}
