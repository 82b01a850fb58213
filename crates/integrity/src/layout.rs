//! Where things are on a dm-integrity device (the kernel's `calculate_device_limits`,
//! `get_area_and_offset` and `get_metadata_sector_and_offset`), from its superblock.
//!
//! From `start` (the LUKS2 data offset, in 512-byte sectors): the superblock (8 sectors), the
//! journal (`journal_sections` sections of `journal_section_sectors`), then areas, each a run of
//! tags (`metadata_run` sectors: one tag per block of the area, packed, the run padded to 4 KiB or
//! 128 KiB) followed by `2^log2_interleave_sectors` data sectors. The last area's data may stop
//! early; its tag run is whole.

use crate::superblock::Superblock;
use crate::Error;

/// Bytes of a journal sector that hold entries (the last 8 hold its commit id).
pub(crate) const JOURNAL_SECTOR_DATA: usize = 504;
/// Entry sectors at the head of each journal section.
pub(crate) const JOURNAL_BLOCK_SECTORS: u64 = 8;

/// The geometry of one dm-integrity device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The superblock's sector on the device.
    pub start: u64,
    /// log2 of 512-byte sectors per block.
    pub log2_sectors_per_block: u32,
    /// log2 of data sectors per area.
    pub log2_interleave_sectors: u32,
    /// Tag bytes per block.
    pub tag_size: u64,
    /// Bytes of one journal entry (sector number, the blocks' last 8 bytes per sector, the tag).
    pub journal_entry_size: usize,
    /// Entries per journal section.
    pub journal_section_entries: u64,
    /// Sectors per journal section (8 entry sectors, then one block per entry).
    pub journal_section_sectors: u64,
    /// Journal sections.
    pub journal_sections: u64,
    /// Sectors from `start` to the first tag run: the superblock and the journal.
    pub initial_sectors: u64,
    /// Sectors of each tag run.
    pub metadata_run: u64,
    /// The usable size in 512-byte sectors.
    pub provided_data_sectors: u64,
}

impl Layout {
    /// The layout `sb` describes for a device whose superblock is at sector `start`.
    ///
    /// Errors: [`Error::Format`] for a tag too large for a journal entry.
    pub fn new(sb: &Superblock, start: u64) -> Result<Layout, Error> {
        let l2spb = u32::from(sb.log2_sectors_per_block);
        let spb = 1u64 << l2spb;
        let tag = u64::from(sb.tag_size);
        let journal_entry_size = (8 + 8 * spb + tag).next_multiple_of(8) as usize;
        let per_sector = (JOURNAL_SECTOR_DATA / journal_entry_size) as u64;
        if per_sector == 0 {
            return Err(Error::Format(format!(
                "{tag}-byte tags do not fit a journal entry"
            )));
        }
        let journal_section_entries = per_sector * JOURNAL_BLOCK_SECTORS;
        let journal_section_sectors = (journal_section_entries << l2spb) + JOURNAL_BLOCK_SECTORS;
        let journal_sections = u64::from(sb.journal_sections);
        let initial_sectors = 8 + journal_section_sectors * journal_sections;
        let il2 = u32::from(sb.log2_interleave_sectors);
        let padding = if sb.fixed_padding() { 4096 } else { 131_072 };
        let metadata_run = (tag << (il2 - l2spb)).next_multiple_of(padding) / 512;
        Ok(Layout {
            start,
            log2_sectors_per_block: l2spb,
            log2_interleave_sectors: il2,
            tag_size: tag,
            journal_entry_size,
            journal_section_entries,
            journal_section_sectors,
            journal_sections,
            initial_sectors,
            metadata_run,
            provided_data_sectors: sb.provided_data_sectors,
        })
    }

    /// Bytes per block.
    pub fn block_size(&self) -> usize {
        512 << self.log2_sectors_per_block
    }

    /// Blocks of data.
    pub fn blocks(&self) -> u64 {
        self.provided_data_sectors >> self.log2_sectors_per_block
    }

    /// The area of block `block` and its sector offset inside it.
    fn area_and_offset(&self, block: u64) -> (u64, u64) {
        let sector = block << self.log2_sectors_per_block;
        (
            sector >> self.log2_interleave_sectors,
            sector & ((1 << self.log2_interleave_sectors) - 1),
        )
    }

    /// The byte offset on the device of block `block`'s data.
    pub fn data_offset(&self, block: u64) -> u64 {
        let (area, offset) = self.area_and_offset(block);
        let sector = self.start
            + self.initial_sectors
            + (area << self.log2_interleave_sectors)
            + (area + 1) * self.metadata_run
            + offset;
        sector * 512
    }

    /// The byte offset on the device of block `block`'s tag.
    pub fn tag_offset(&self, block: u64) -> u64 {
        let (area, offset) = self.area_and_offset(block);
        let run = self.start
            + self.initial_sectors
            + area * ((1 << self.log2_interleave_sectors) + self.metadata_run);
        run * 512 + (offset >> self.log2_sectors_per_block) * self.tag_size
    }

    /// Bytes the device needs: up to the end of the last block's data.
    pub fn device_bytes(&self) -> u64 {
        match self.blocks() {
            0 => (self.start + self.initial_sectors) * 512,
            n => self.data_offset(n - 1) + self.block_size() as u64,
        }
    }

    /// The byte offset of sector `sector` of journal section `section`.
    pub(crate) fn journal_sector_offset(&self, section: u64, sector: u64) -> u64 {
        (self.start + 8 + section * self.journal_section_sectors + sector) * 512
    }
}
