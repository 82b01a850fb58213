//! The dm-integrity superblock: the first 4096 bytes at the LUKS2 data offset.
//!
//! Little-endian fields in its first 64 bytes (the kernel's `struct superblock`), the rest zero:
//!
//! | offset | bytes | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `integrt\0` |
//! | 8 | 1 | version (1 to 5 here; the kernel derives it from the flags) |
//! | 9 | 1 | log2 of the interleave (data sectors per area) |
//! | 10 | 2 | tag size per block |
//! | 12 | 4 | journal sections |
//! | 16 | 8 | provided data sectors (the usable size, in 512-byte sectors) |
//! | 24 | 4 | flags |
//! | 28 | 1 | log2 of 512-byte sectors per block |
//! | 29 | 1 | log2 of blocks per bitmap bit (bitmap mode only; kept as read) |
//! | 32 | 8 | recalculation position (with the recalculating flag) |
//! | 48 | 16 | salt (with the fixed-HMAC flag) |
//!
//! LUKS2 volumes use neither a journal MAC, an internal hash nor the bitmap mode (cryptsetup 2.6
//! formats them with `fix_padding` only: version 4, or version 1 with
//! `--integrity-legacy-padding`); a superblock asking for any of those is refused as unsupported
//! rather than misread.

use crate::Error;

/// The superblock's magic.
pub const MAGIC: &[u8; 8] = b"integrt\0";
/// The superblock's size on disk (the kernel's `SB_SECTORS`, 8 sectors).
pub const SUPERBLOCK_BYTES: usize = 4096;

/// The most data sectors taken (512 TiB): offsets computed from more could overflow.
const MAX_DATA_SECTORS: u64 = 1 << 40;

/// Journal sectors keep 8 bytes for a MAC.
pub const FLAG_HAVE_JOURNAL_MAC: u32 = 0x01;
/// Tags are being recalculated (an internal hash only).
pub const FLAG_RECALCULATING: u32 = 0x02;
/// Bitmap mode: the journal area holds a dirty bitmap.
pub const FLAG_DIRTY_BITMAP: u32 = 0x04;
/// Tag runs padded to 4 KiB instead of 128 KiB.
pub const FLAG_FIXED_PADDING: u32 = 0x08;
/// A salted internal hash or journal MAC.
pub const FLAG_FIXED_HMAC: u32 = 0x10;
/// Tags inline in the device's own metadata (kernels after 6.10).
pub const FLAG_INLINE: u32 = 0x20;

/// A parsed superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Format version (1 to 5).
    pub version: u8,
    /// log2 of the 512-byte data sectors between two tag runs.
    pub log2_interleave_sectors: u8,
    /// Tag bytes per block.
    pub tag_size: u16,
    /// Sections of the journal.
    pub journal_sections: u32,
    /// The usable size in 512-byte sectors.
    pub provided_data_sectors: u64,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// log2 of 512-byte sectors per block (0 for 512-byte blocks, 3 for 4096).
    pub log2_sectors_per_block: u8,
    /// log2 of blocks per bitmap bit (meaningful in bitmap mode only).
    pub log2_blocks_per_bitmap_bit: u8,
    /// How far a recalculation got (with [`FLAG_RECALCULATING`]).
    pub recalc_sector: u64,
    /// The salt of a fixed-HMAC volume.
    pub salt: [u8; 16],
}

impl Superblock {
    /// Parse the 4096 bytes at the data offset.
    ///
    /// Errors: [`Error::NotIntegrity`] without the magic; [`Error::Format`] for fields the kernel
    /// would refuse; [`Error::Unsupported`] for features LUKS2 does not use.
    pub fn parse(bytes: &[u8]) -> Result<Superblock, Error> {
        if bytes.len() < SUPERBLOCK_BYTES {
            return Err(Error::Format(format!(
                "a superblock is {SUPERBLOCK_BYTES} bytes, not {}",
                bytes.len()
            )));
        }
        if &bytes[..8] != MAGIC {
            return Err(Error::NotIntegrity);
        }
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let sb = Superblock {
            version: bytes[8],
            log2_interleave_sectors: bytes[9],
            tag_size: u16_at(10),
            journal_sections: u32_at(12),
            provided_data_sectors: u64_at(16),
            flags: u32_at(24),
            log2_sectors_per_block: bytes[28],
            log2_blocks_per_bitmap_bit: bytes[29],
            recalc_sector: u64_at(32),
            salt: bytes[48..64].try_into().expect("16 bytes"),
        };
        sb.validate()?;
        Ok(sb)
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::Format(what));
        if !(1..=5).contains(&self.version) {
            return bad(format!(
                "superblock version {} (1 to 5 are known)",
                self.version
            ));
        }
        if !(3..=31).contains(&self.log2_interleave_sectors) {
            // 0 means a separate metadata device, which LUKS2 never uses.
            return bad(format!(
                "an interleave of 2^{} sectors",
                self.log2_interleave_sectors
            ));
        }
        if self.tag_size == 0 {
            return bad("a tag size of 0".into());
        }
        if self.log2_sectors_per_block > 3 {
            return bad(format!(
                "blocks of 2^{} sectors (512 to 4096 bytes are possible)",
                self.log2_sectors_per_block
            ));
        }
        if self.log2_sectors_per_block > self.log2_interleave_sectors {
            return bad("blocks larger than the interleave".into());
        }
        if self.journal_sections == 0 {
            return bad("no journal section".into());
        }
        if self.provided_data_sectors > MAX_DATA_SECTORS {
            return bad(format!(
                "{} data sectors (more than 512 TiB)",
                self.provided_data_sectors
            ));
        }
        if self.provided_data_sectors == 0
            || !self
                .provided_data_sectors
                .is_multiple_of(1 << self.log2_sectors_per_block)
        {
            return bad(format!(
                "{} data sectors, not a whole number of blocks",
                self.provided_data_sectors
            ));
        }
        let known = FLAG_HAVE_JOURNAL_MAC
            | FLAG_RECALCULATING
            | FLAG_DIRTY_BITMAP
            | FLAG_FIXED_PADDING
            | FLAG_FIXED_HMAC
            | FLAG_INLINE;
        if self.flags & !known != 0 {
            return bad(format!("unknown flags {:#x}", self.flags & !known));
        }
        for (flag, what) in [
            (FLAG_HAVE_JOURNAL_MAC, "a journal MAC"),
            (
                FLAG_RECALCULATING,
                "a recalculation in progress (an internal hash)",
            ),
            (FLAG_DIRTY_BITMAP, "bitmap mode"),
            (FLAG_FIXED_HMAC, "a salted internal hash or journal MAC"),
            (FLAG_INLINE, "inline tags"),
        ] {
            if self.flags & flag != 0 {
                return Err(Error::Unsupported(format!(
                    "dm-integrity with {what} (LUKS2 volumes have none)"
                )));
            }
        }
        Ok(())
    }

    /// The 4096 bytes of the superblock, as the kernel writes it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; SUPERBLOCK_BYTES];
        out[..8].copy_from_slice(MAGIC);
        out[8] = self.version;
        out[9] = self.log2_interleave_sectors;
        out[10..12].copy_from_slice(&self.tag_size.to_le_bytes());
        out[12..16].copy_from_slice(&self.journal_sections.to_le_bytes());
        out[16..24].copy_from_slice(&self.provided_data_sectors.to_le_bytes());
        out[24..28].copy_from_slice(&self.flags.to_le_bytes());
        out[28] = self.log2_sectors_per_block;
        out[29] = self.log2_blocks_per_bitmap_bit;
        out[32..40].copy_from_slice(&self.recalc_sector.to_le_bytes());
        out[48..64].copy_from_slice(&self.salt);
        out
    }

    /// Whether tag runs are padded to 4 KiB (else to 128 KiB, the legacy padding).
    pub fn fixed_padding(&self) -> bool {
        self.flags & FLAG_FIXED_PADDING != 0
    }
}
