//! The journal: what the kernel's `replay_journal` finds after a crash, and sections written
//! as its `integrity_commit` writes them.
//!
//! A section is 8 entry sectors followed by one block of data per entry. Every 512-byte sector
//! of the journal ends with a commit id, `0x1111111111111111 * (seq + 1) ^ (section << 32 ^
//! sector)` for a commit sequence `seq` of 0 to 3; the data sectors' own last 8 bytes are kept
//! in their entry. Entry `n` of a section is in its entry sector `n % 8`, at `n / 8` entry sizes;
//! an entry is its block's 512-byte sector number (high half `0xFFFFFFFF`: unused), the last 8
//! bytes of each of the block's sectors, and the block's tag.
//!
//! Sections are written whole, in a ring; the sequence advances each time the ring wraps. On
//! opening, the newest sequence in use and the last section that carries it give where the
//! ring continues; from there, every section that carries the sequence expected for it is
//! committed and replayed, oldest first (replaying what was already copied in place is
//! harmless: later entries come later). A section whose sectors disagree (a write cut short)
//! ends the replay, and the journal is then cleared. This module decides what to replay and where
//! to go on, exactly as the kernel does; the device applies it.

use sectorcrypt_storage::Storage;

use crate::layout::{Layout, JOURNAL_BLOCK_SECTORS, JOURNAL_SECTOR_DATA};
use crate::Error;

/// Commit sequences in use at once.
const COMMIT_SEQS: u8 = 4;
/// An entry's high sector half when it is unused.
const UNUSED: u32 = 0xFFFF_FFFF;

fn next_seq(seq: u8) -> u8 {
    (seq + 1) % COMMIT_SEQS
}

fn prev_seq(seq: u8) -> u8 {
    (seq + COMMIT_SEQS - 1) % COMMIT_SEQS
}

/// The commit id of sector `sector` of section `section` under sequence `seq`.
pub(crate) fn commit_id(section: u64, sector: u64, seq: u8) -> u64 {
    0x1111_1111_1111_1111u64.wrapping_mul(u64::from(seq) + 1) ^ ((section << 32) ^ sector)
}

/// A block the journal holds: its ciphertext and its tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JournalBlock {
    pub(crate) block: u64,
    pub(crate) data: Vec<u8>,
    pub(crate) tag: Vec<u8>,
}

/// Where the ring goes on after opening.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ring {
    /// The next section to write.
    pub(crate) section: u64,
    /// The sequence it is written with.
    pub(crate) seq: u8,
}

/// What opening finds in the journal.
#[derive(Debug)]
pub(crate) struct Scan {
    /// The committed blocks to replay, oldest first.
    pub(crate) replay: Vec<JournalBlock>,
    /// `Some(seq)`: the journal is to be cleared (every section written empty under `seq`)
    /// before the ring goes on.
    pub(crate) clear: Option<u8>,
    /// Where the ring goes on.
    pub(crate) ring: Ring,
}

/// Read section `section` whole.
fn read_section(storage: &dyn Storage, layout: &Layout, section: u64) -> Result<Vec<u8>, Error> {
    let mut buf = vec![0u8; (layout.journal_section_sectors * 512) as usize];
    storage.read_at(&mut buf, layout.journal_sector_offset(section, 0))?;
    Ok(buf)
}

fn sector_commit_id(section_bytes: &[u8], sector: u64) -> u64 {
    let at = sector as usize * 512 + JOURNAL_SECTOR_DATA;
    u64::from_le_bytes(section_bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The byte offset of entry `n` inside a section.
fn entry_offset(layout: &Layout, n: u64) -> usize {
    (n % JOURNAL_BLOCK_SECTORS) as usize * 512
        + (n / JOURNAL_BLOCK_SECTORS) as usize * layout.journal_entry_size
}

/// The 512-byte sector an entry names, if it is used.
fn entry_sector(section_bytes: &[u8], layout: &Layout, n: u64) -> Option<u64> {
    let at = entry_offset(layout, n);
    let sector = u64::from_le_bytes(section_bytes[at..at + 8].try_into().expect("8 bytes"));
    // In-progress entries (high half 0xFFFFFFFE) never reach the disk committed.
    let high = (sector >> 32) as u32;
    (high != UNUSED && high != UNUSED - 1).then_some(sector)
}

/// Find what the journal holds (the kernel's `replay_journal`, without writing anything).
pub(crate) fn scan(storage: &dyn Storage, layout: &Layout) -> Result<Scan, Error> {
    let sections = layout.journal_sections;
    let mut used = [false; COMMIT_SEQS as usize];
    let mut max_section = [0u64; COMMIT_SEQS as usize];
    let mut empty = true;
    // A sector that carries no commit id of any sequence: clear, from section 0.
    let clear_all = |last_used: u8| Scan {
        replay: Vec::new(),
        clear: Some(prev_seq(prev_seq(last_used))),
        ring: Ring {
            section: 0,
            seq: next_seq(prev_seq(prev_seq(last_used))),
        },
    };
    let mut seqs = vec![0u8; (sections * layout.journal_section_sectors) as usize];
    for i in 0..sections {
        let bytes = read_section(storage, layout, i)?;
        for j in 0..layout.journal_section_sectors {
            let id = sector_commit_id(&bytes, j);
            let Some(k) = (0..COMMIT_SEQS).find(|&k| commit_id(i, j, k) == id) else {
                return Ok(clear_all(0));
            };
            used[k as usize] = true;
            max_section[k as usize] = i;
            seqs[(i * layout.journal_section_sectors + j) as usize] = k;
        }
        if empty {
            empty = (0..layout.journal_section_entries)
                .all(|n| entry_sector(&bytes, layout, n).is_none());
        }
    }
    let unused = if !used[3] {
        let mut u = 3u8;
        while u > 0 && !used[u as usize - 1] {
            u -= 1;
        }
        u
    } else {
        match (0..COMMIT_SEQS).find(|&k| !used[k as usize]) {
            Some(u) => u,
            None => return Ok(clear_all(0)),
        }
    };
    let last_used = prev_seq(unused);
    let mut want = prev_seq(last_used);
    if !used[want as usize] && used[prev_seq(want) as usize] {
        empty = true;
    }
    let mut write_start = max_section[last_used as usize] + 1;
    if write_start >= sections {
        want = next_seq(want);
        write_start = 0;
    }
    let mut i = write_start;
    let mut write_sections = 0;
    'walk: while write_sections < sections {
        for j in 0..layout.journal_section_sectors {
            if seqs[(i * layout.journal_section_sectors + j) as usize] != want {
                break 'walk;
            }
        }
        write_sections += 1;
        i += 1;
        if i >= sections {
            want = next_seq(want);
            i = 0;
        }
    }
    let mut replay = Vec::new();
    if !empty {
        let mut i = write_start;
        for _ in 0..write_sections {
            let bytes = read_section(storage, layout, i)?;
            replay.extend(section_blocks(&bytes, layout));
            i = (i + 1) % sections;
        }
    }
    // Only a journal whose every section is consistent goes on where it is (sectorcrypt writes
    // in journal mode, the kernel's 'J').
    if write_sections == sections {
        return Ok(Scan {
            replay,
            clear: None,
            ring: Ring {
                section: write_start,
                seq: want,
            },
        });
    }
    let erase = prev_seq(prev_seq(last_used));
    Ok(Scan {
        replay,
        clear: Some(erase),
        ring: Ring {
            section: 0,
            seq: next_seq(erase),
        },
    })
}

/// The used entries of one section, with their data's last bytes put back.
fn section_blocks(bytes: &[u8], layout: &Layout) -> Vec<JournalBlock> {
    let spb = 1u64 << layout.log2_sectors_per_block;
    let block_bytes = layout.block_size();
    let tag = layout.tag_size as usize;
    let mut out = Vec::new();
    for n in 0..layout.journal_section_entries {
        let Some(sector) = entry_sector(bytes, layout, n) else {
            continue;
        };
        // As the kernel: a sector inside a block counts as the block.
        let block = sector >> layout.log2_sectors_per_block;
        if block >= layout.blocks() {
            continue;
        }
        let entry = entry_offset(layout, n);
        let first = ((JOURNAL_BLOCK_SECTORS + n * spb) * 512) as usize;
        let mut data = bytes[first..first + block_bytes].to_vec();
        for s in 0..spb as usize {
            let last = entry + 8 + s * 8;
            data[s * 512 + JOURNAL_SECTOR_DATA..(s + 1) * 512]
                .copy_from_slice(&bytes[last..last + 8]);
        }
        let tag_at = entry + 8 + spb as usize * 8;
        out.push(JournalBlock {
            block,
            data,
            tag: bytes[tag_at..tag_at + tag].to_vec(),
        });
    }
    out
}

/// A block to journal: its number, ciphertext and tag.
pub(crate) type Entry<'a> = (u64, &'a [u8], &'a [u8]);

/// Fill `out` (one section's bytes) with the section as the kernel writes it: `entries` (at most
/// a section's) in its first entries, the others unused, every sector stamped for `section`
/// under `seq`. Every byte of `out` is written.
pub(crate) fn fill_section(
    layout: &Layout,
    section: u64,
    seq: u8,
    entries: &[Entry<'_>],
    out: &mut [u8],
) {
    debug_assert!(entries.len() as u64 <= layout.journal_section_entries);
    debug_assert_eq!(out.len() as u64, layout.journal_section_sectors * 512);
    let spb = 1u64 << layout.log2_sectors_per_block;
    let data_start = (JOURNAL_BLOCK_SECTORS * 512) as usize;
    out[..data_start].fill(0);
    for n in 0..layout.journal_section_entries {
        let at = entry_offset(layout, n);
        let first = ((JOURNAL_BLOCK_SECTORS + n * spb) * 512) as usize;
        let block_bytes = (spb * 512) as usize;
        match entries.get(n as usize) {
            None => {
                out[at + 4..at + 8].copy_from_slice(&UNUSED.to_le_bytes());
                out[first..first + block_bytes].fill(0);
            }
            Some(&(block, data, tag)) => {
                let sector = block << layout.log2_sectors_per_block;
                out[at..at + 8].copy_from_slice(&sector.to_le_bytes());
                out[first..first + block_bytes].copy_from_slice(data);
                for s in 0..spb as usize {
                    let last = at + 8 + s * 8;
                    out[last..last + 8]
                        .copy_from_slice(&data[s * 512 + JOURNAL_SECTOR_DATA..(s + 1) * 512]);
                }
                let tag_at = at + 8 + spb as usize * 8;
                out[tag_at..tag_at + tag.len()].copy_from_slice(tag);
            }
        }
    }
    for j in 0..layout.journal_section_sectors {
        let at = j as usize * 512 + JOURNAL_SECTOR_DATA;
        out[at..at + 8].copy_from_slice(&commit_id(section, j, seq).to_le_bytes());
    }
}

/// Write every section empty under `seq` (the kernel's clear: the section where the ring was
/// first, then the others).
pub(crate) fn clear(storage: &dyn Storage, layout: &Layout, seq: u8) -> Result<(), Error> {
    let mut bytes = vec![0u8; (layout.journal_section_sectors * 512) as usize];
    for section in 0..layout.journal_sections {
        fill_section(layout, section, seq, &[], &mut bytes);
        storage.write_at(&bytes, layout.journal_sector_offset(section, 0))?;
    }
    Ok(())
}

/// The next section after `ring`'s, and its sequence.
pub(crate) fn advance(layout: &Layout, ring: Ring) -> Ring {
    match ring.section + 1 {
        s if s >= layout.journal_sections => Ring {
            section: 0,
            seq: next_seq(ring.seq),
        },
        s => Ring {
            section: s,
            seq: ring.seq,
        },
    }
}
