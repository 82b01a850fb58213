//! A new dm-integrity device, laid out as the kernel lays one out when cryptsetup formats a LUKS2
//! volume with `--integrity` (`dm_integrity_ctr` and `initialize_superblock` with cryptsetup's
//! arguments: default journal size and interleave, `fix_padding` unless
//! `--integrity-legacy-padding`, the volume's sector size as the block size): superblock version
//! 4 (1 with the legacy padding), a journal of `min(131072, device sectors / 128)` sectors in
//! whole sections, and the largest data size whose last block fits the device.

use sectorcrypt_storage::Storage;

use crate::journal;
use crate::layout::Layout;
use crate::superblock::{Superblock, FLAG_FIXED_PADDING};
use crate::Error;

/// The kernel's default journal size limit, in sectors.
const MAX_JOURNAL_SECTORS: u64 = 131_072;
/// The kernel's default journal size as a fraction of the device (1/2^7).
const JOURNAL_SIZE_FACTOR: u32 = 7;
/// The kernel's default interleave (log2 of data sectors per area).
const LOG2_INTERLEAVE_SECTORS: u8 = 15;
/// The kernel's default sectors per bitmap bit (log2), where the search for its field starts.
const LOG2_SECTORS_PER_BITMAP_BIT: u32 = 15;

/// The superblock the kernel would write on a device of `device_bytes` whose superblock is at
/// byte `offset`, for `tag_size`-byte tags on `block_size`-byte blocks, tag runs padded to 4 KiB
/// or (`legacy_padding`, for kernels before 5.4) to 128 KiB.
///
/// Errors: [`Error::Format`] for a block size other than 512 to 4096 bytes (a power of two), an
/// offset off a block, or a device too small to hold one block.
pub fn plan(
    device_bytes: u64,
    offset: u64,
    tag_size: u16,
    block_size: usize,
    legacy_padding: bool,
) -> Result<Superblock, Error> {
    if !block_size.is_power_of_two() || !(512..=4096).contains(&block_size) {
        return Err(Error::Format(format!(
            "{block_size}-byte blocks (512 to 4096, a power of two)"
        )));
    }
    if !offset.is_multiple_of(block_size as u64) {
        return Err(Error::Format(format!(
            "a superblock at byte {offset}, not on a {block_size}-byte block"
        )));
    }
    let device_sectors = device_bytes / 512;
    let start = offset / 512;
    let l2spb = (block_size / 512).trailing_zeros() as u8;
    let mut sb = Superblock {
        version: if legacy_padding { 1 } else { 4 },
        log2_interleave_sectors: LOG2_INTERLEAVE_SECTORS,
        tag_size,
        journal_sections: 1,
        provided_data_sectors: 1 << l2spb,
        flags: if legacy_padding {
            0
        } else {
            FLAG_FIXED_PADDING
        },
        log2_sectors_per_block: l2spb,
        log2_blocks_per_bitmap_bit: 0,
        recalc_sector: 0,
        salt: [0; 16],
    };
    let journal_sectors = MAX_JOURNAL_SECTORS.min(device_sectors >> JOURNAL_SIZE_FACTOR);
    let section = Layout::new(&sb, start)?.journal_section_sectors;
    sb.journal_sections = u32::try_from((journal_sectors / section).max(1))
        .map_err(|_| Error::Format("a journal too large".into()))?;
    // The largest data size, bit by bit from the top, whose last sector still lies on the device.
    let fits = |sb: &Superblock| -> Result<bool, Error> {
        let layout = Layout::new(sb, start)?;
        if layout.initial_sectors + 8 >= device_sectors {
            return Ok(false);
        }
        let last = layout.data_offset(layout.blocks() - 1) / 512 + (1 << l2spb) - 1;
        Ok(last >= start && last < device_sectors)
    };
    let mut provided = 0u64;
    for bit in (3..device_sectors.max(1).ilog2() + 1).rev() {
        let candidate = provided | (1 << bit);
        sb.provided_data_sectors = candidate;
        if fits(&sb)? {
            provided = candidate;
        }
    }
    if provided == 0 {
        return Err(Error::Format(format!(
            "a device of {device_bytes} bytes holds no data block after its integrity metadata"
        )));
    }
    sb.provided_data_sectors = provided;
    let layout = Layout::new(&sb, start)?;
    let bits_in_journal =
        ((layout.journal_section_sectors * layout.journal_sections) << 12).min(u64::from(u32::MAX));
    let mut log2_bit = LOG2_SECTORS_PER_BITMAP_BIT.max(u32::from(l2spb));
    while bits_in_journal < provided.div_ceil(1 << log2_bit) {
        log2_bit += 1;
    }
    sb.log2_blocks_per_bitmap_bit = (log2_bit - u32::from(l2spb)) as u8;
    Ok(sb)
}

/// Write `sb` and an empty journal at byte `offset` of `storage`, as the kernel's first
/// activation does: the journal, then the superblock, each synced. The tags are not written:
/// every block fails its check until written (see [`crate::IntegrityDevice::wipe`]).
pub fn format(storage: &dyn Storage, offset: u64, sb: &Superblock) -> Result<Layout, Error> {
    let layout = Layout::new(sb, offset / 512)?;
    let len = storage.len()?;
    if layout.device_bytes() > len {
        return Err(Error::Format(format!(
            "the integrity layout needs {} bytes of device; there are {len}",
            layout.device_bytes()
        )));
    }
    journal::clear(storage, &layout, 0)?;
    storage.sync()?;
    storage.write_at(&sb.to_bytes(), offset)?;
    storage.sync()?;
    Ok(layout)
}
