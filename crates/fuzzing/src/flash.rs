//! Raw flash: the header area of an encrypted flash with its flash token and block journal,
//! the encryption layer's rewrite journal, the `nanddump:` device names and the UBI traces.

use std::ops::Range;
use std::sync::Arc;

use sectorcrypt_cipher::{CipherSpec, SectorOptions};
use sectorcrypt_flash::crypt::{CryptFlash, Policy};
use sectorcrypt_flash::dump::{DeviceName, DumpFlash, Layout};
use sectorcrypt_flash::part::Partition;
use sectorcrypt_flash::sim::{MemChip, SimNand};
use sectorcrypt_flash::trace::Trace;
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_flashvol::read_header;
use sectorcrypt_luks::luks2::binary::{BinaryHeader, BIN_LEN};
use sectorcrypt_storage::MemStorage;

use crate::padded::Padded;

/// The chip of the encrypted-flash seeds (`sectorcrypt flash format --peb-size 16K
/// --min-io-size 512 --sub-page-size 512 --oob-size 16 --nop 1 --size 2M`): 128 eraseblocks.
pub(crate) const FLASH_GEOMETRY: Geometry = Geometry {
    peb_size: 16 << 10,
    page_size: 512,
    sub_page_size: 512,
    oob_size: 16,
    peb_count: 128,
    nop: 1,
};

/// Where the rewrite journal is looked for when the input has no readable header (the journal
/// seeds are laid out so): blocks 4 to 7, UBI's blocks after them.
const FALLBACK_JOURNAL: Range<u32> = 4..8;

/// The erased-space policy when the input has no readable header: the one whose sync fills,
/// so that a short run appends every kind of record.
const FALLBACK_POLICY: Policy = Policy::Synced;

/// Blocks read through the layer after it opened (reading all would make an execution slow).
const READ_BLOCKS: u32 = 8;

/// The cipher the encryption layer is opened with: the identity, so that the input is what the
/// layer decrypts (the journal's records are encrypted; a fuzzer cannot forge ciphertext).
const IDENTITY: &str = "cipher_null-ecb";

/// The input as a chip (a simulated NAND image made by `sectorcrypt flash format`, or the start
/// of a raw dump of [`FLASH_GEOMETRY`], the rest erased, LUKS2 checksums made right): find and read the encrypted flash's
/// header (the header area's block journal and a rewrite it interrupted, the LUKS2 header,
/// the flash token), then open the encryption layer where the token says (or at
/// [`FALLBACK_JOURNAL`]), which replays its rewrite journal, read the first blocks through it,
/// and program, fill and reopen it so that new records follow what the journal held.
pub fn flash_metadata(data: &[u8]) {
    let flash: Arc<dyn Flash> = if SimNand::is_image(&MemStorage::new(data.to_vec())) {
        match SimNand::open(MemStorage::new(data.to_vec())) {
            Ok(sim) => Arc::new(sim),
            Err(_) => return,
        }
    } else {
        let g = FLASH_GEOMETRY;
        let mut chip = vec![0xFF; g.size() as usize];
        let n = data.len().min(chip.len());
        chip[..n].copy_from_slice(&data[..n]);
        seal_luks2_copies(&mut chip, g.peb_size as usize);
        match DumpFlash::open(Box::new(MemStorage::new(chip)), g, Layout::DataOnly) {
            Ok(dump) => Arc::new(dump),
            Err(_) => return,
        }
    };
    let (policy, journal) = match read_header(Arc::clone(&flash)) {
        Ok(area) => {
            let _ = area.header.dump_text();
            (area.params.policy, area.params.rewrite_journal())
        }
        Err(_) => (FALLBACK_POLICY, FALLBACK_JOURNAL),
    };
    let Some(layer) = open_layer(&flash, policy, &journal) else {
        return;
    };
    let g = layer.geometry();
    let mut block = vec![0u8; g.peb_size as usize];
    for peb in 0..g.peb_count.min(READ_BLOCKS) {
        let _ = layer.read(peb, 0, &mut block);
    }
    // A program, a sync (a fill of that block under the synced policy, bracketed by records)
    // and a program into the filled tail (a read-modify-erase-write, journalled): records
    // appended after what the journal held, which the reopening then reads.
    let unit = vec![0xA5; g.sub_page_size as usize];
    let _ = layer.erase(0);
    let _ = layer.program(0, 0, &unit);
    let _ = layer.sync();
    let _ = layer.program(0, g.sub_page_size, &unit);
    drop(layer);
    let _ = open_layer(&flash, policy, &journal);
}

/// Make the checksum of each LUKS2 header copy that starts an eraseblock right, unless the
/// input stores 0 there: a SHA-256 is what a mutation cannot fix, so without this the JSON
/// metadata, and the flash token in it, would never change (as in `ubi::seal_headers`).
fn seal_luks2_copies(chip: &mut [u8], block: usize) {
    for at in (0..chip.len()).step_by(block) {
        let Ok(raw) = <[u8; BIN_LEN]>::try_from(&chip[at..at + BIN_LEN]) else {
            continue;
        };
        let Some(mut bin) = BinaryHeader::parse(&raw) else {
            continue;
        };
        let end = usize::try_from(bin.hdr_size)
            .ok()
            .and_then(|size| at.checked_add(size))
            .filter(|&end| end <= chip.len() && end >= at + BIN_LEN);
        let (Some(end), false) = (end, bin.checksum.iter().all(|&b| b == 0)) else {
            continue;
        };
        if bin.seal(&chip[at + BIN_LEN..end]).is_ok() {
            chip[at..at + BIN_LEN].copy_from_slice(&bin.to_bytes());
        }
    }
}

/// The encryption layer over the blocks after `journal` (with that journal if it has blocks).
fn open_layer(flash: &Arc<dyn Flash>, policy: Policy, journal: &Range<u32>) -> Option<CryptFlash> {
    let spec = CipherSpec::parse(IDENTITY).ok()?;
    let options = SectorOptions::default();
    let data = Arc::new(Partition::new(Arc::clone(flash), journal.end).ok()?);
    let layer = if journal.is_empty() {
        CryptFlash::new(data, spec, &[], policy, &options)
    } else {
        let blocks = journal.end - journal.start;
        let journal = Arc::new(Partition::range(Arc::clone(flash), journal.start, blocks).ok()?);
        CryptFlash::with_journal(data, journal, spec, &[], policy, &options)
    };
    layer.ok()
}

/// The input as a `nanddump:` device name (with or without the prefix): split it, then open a
/// dump of two erased eraseblocks of the geometry it names, as the command line would open the
/// file, and read from it.
pub fn nanddump_device(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(name) = DeviceName::parse(text.strip_prefix("nanddump:").unwrap_or(text)) else {
        return;
    };
    let g = name.geometry;
    // Two eraseblocks' worth of bytes, computed without trusting the geometry (which the dump
    // checks); a wrong length is one more thing for it to refuse.
    let page = u64::from(g.page_size)
        + match name.layout {
            Layout::DataOnly => 0,
            Layout::WithOob => u64::from(g.oob_size),
        };
    let pages = u64::from(g.peb_size) / u64::from(g.page_size.max(1));
    let len = pages.saturating_mul(page).saturating_mul(2);
    let Ok(dump) = DumpFlash::open(Box::new(Padded::new(Vec::new(), len, 0xFF)), g, name.layout)
    else {
        return;
    };
    let g = dump.geometry();
    let mut buf = vec![0u8; g.page_size as usize];
    let _ = dump.read(1, g.peb_size - g.page_size, &mut buf);
    let _ = dump.is_bad(1);
    let mut oob = vec![0u8; g.oob_size as usize];
    let _ = dump.read_oob(1, 0, &mut oob);
}

/// Largest chip a trace is replayed on (a simulated one in memory).
const MAX_REPLAY_CHIP: u64 = 1 << 20;

/// The input as a trace file (xz-compressed or not): parse it, check that its text form parses
/// back to the same trace, and replay it on a simulated chip of its geometry when that is small.
pub fn flash_trace(data: &[u8]) {
    let Ok(trace) = Trace::from_bytes(data, "fuzz-input") else {
        return;
    };
    let _ = trace.workload_data_bytes();
    let text = trace.to_string();
    let again = Trace::parse(&text)
        .unwrap_or_else(|e| panic!("a trace's own text does not parse: {e}\n{text}"));
    assert_eq!(again, trace, "the trace changed on a round trip");
    if trace.geometry.size() <= MAX_REPLAY_CHIP {
        if let Ok((_chip, sim)) = MemChip::create(trace.geometry, &[]) {
            let _ = trace.replay(&*sim, &mut || {});
        }
    }
}
