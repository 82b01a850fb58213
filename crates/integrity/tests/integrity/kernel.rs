//! The kernel as the oracle (`scripts/kernel-oracle-integrity.sh` in the QEMU guest): volumes
//! cryptsetup formats with `--integrity` and the kernel writes read back here; what this crate
//! then writes (through its journal, across sections and ring wraps) reads back in the kernel;
//! and a flipped data byte and a flipped tag byte are refused by both, block for block.

use std::collections::BTreeSet;
use std::path::Path;

use sectorcrypt_integrity::format;
use sectorcrypt_integrity::superblock::{Superblock, SUPERBLOCK_BYTES};
use sectorcrypt_testkit::{kernel_oracle, ok, pattern, scratch};

use crate::{open, PASSPHRASE};

/// ID, cipher, integrity, key bits, sector size, `--integrity-legacy-padding`.
const CASES: [(&str, &str, &str, u32, usize, bool); 8] = [
    ("h256", "aes-xts-plain64", "hmac-sha256", 512, 4096, false),
    ("h512", "aes-xts-plain64", "hmac-sha512", 512, 512, false),
    ("h1", "aes-xts-plain64", "hmac-sha1", 256, 512, false),
    ("gcm", "aes-gcm-random", "aead", 256, 4096, false),
    ("gcm128", "aes-gcm-random", "aead", 128, 512, false),
    ("cha", "chacha20-random", "poly1305", 256, 4096, false),
    ("aegis", "aegis128-random", "aead", 128, 4096, false),
    ("legacy", "aes-gcm-random", "aead", 256, 4096, true),
];
/// Bytes of each image, and where its LUKS2 data (the integrity superblock) starts.
const IMAGE: u64 = 32 << 20;
const DATA_OFFSET: u64 = 16 << 20;

/// Bytes the kernel writes at the start of each volume.
const KERNEL_DATA: usize = 1 << 20;
/// Bytes it then writes at 2 MiB and leaves in its journal.
const JOURNAL_DATA: usize = 8 << 10;

fn lines(output: &str, word: &str, id: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            (f.next() == Some(word) && f.next() == Some(id))
                .then(|| f.collect::<Vec<_>>().join(" "))
        })
        .collect()
}

fn boot(dir: &Path, phase: &str, cases: &[String]) -> String {
    std::fs::write(dir.join("cases"), cases.join("\n") + "\n").unwrap();
    let out = ok(
        kernel_oracle::run(
            dir,
            &kernel_oracle::script("kernel-oracle-integrity.sh"),
            &[phase, sectorcrypt_testkit::p(&dir.join("cases"))],
        ),
        &format!("the kernel oracle's {phase} phase"),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What this crate writes over the kernel's data, in blocks: a run across several journal
/// sections, then single blocks that make the ring wrap, one over the kernel's own data.
fn writes(section_entries: u64, blocks: u64) -> Vec<(u64, u64)> {
    let mut w = vec![(300, 3 * section_entries + 5)];
    for i in 0..(2 * section_entries.min(40)) {
        w.push(((i * 7919) % blocks, 1));
    }
    w.push((2, 3));
    w
}

#[test]
fn kernel_and_sectorcrypt_read_each_others_integrity_volumes_and_refuse_the_same_blocks() {
    let dir = scratch("integrity-kernel");
    std::fs::write(dir.join("key"), PASSPHRASE).unwrap();
    let write_cases: Vec<String> = CASES
        .iter()
        .map(|(id, cipher, integrity, bits, sector, legacy)| {
            std::fs::write(dir.join(format!("data-{id}.bin")), pattern(KERNEL_DATA, 1)).unwrap();
            std::fs::write(
                dir.join(format!("journal-{id}.bin")),
                pattern(JOURNAL_DATA, 2),
            )
            .unwrap();
            let img = std::fs::File::create(dir.join(format!("int-{id}.img"))).unwrap();
            img.set_len(IMAGE).unwrap();
            let padding = if *legacy {
                " --integrity-legacy-padding"
            } else {
                ""
            };
            format!("{id} {cipher} {integrity} {bits} {sector}{padding}")
        })
        .collect();
    let written = boot(&dir, "write", &write_cases);
    let mut read_cases = Vec::new();
    let mut expected = Vec::new();
    for (id, cipher, integrity, bits, sector, legacy) in CASES {
        assert_eq!(lines(&written, "write", id), ["ok"], "{written}");
        let image = dir.join(format!("int-{id}.img"));
        // The superblock the kernel wrote is the one `format` writes here, byte for byte.
        let bytes = std::fs::read(&image).unwrap();
        let at = DATA_OFFSET as usize;
        let kernels = &bytes[at..at + SUPERBLOCK_BYTES];
        let tag_size = Superblock::parse(kernels).unwrap().tag_size;
        let ours = format::plan(IMAGE, DATA_OFFSET, tag_size, sector, legacy).unwrap();
        assert!(
            ours.to_bytes()[..] == kernels[..],
            "{id}: our superblock {ours:?} is not the kernel's {:?}",
            Superblock::parse(kernels).unwrap()
        );
        // The kernel's writes and cryptsetup's wipe (zeros) read back here, every tag verified.
        let device = open(&image, true);
        let size: u64 = lines(&written, "size", id)[0].parse().unwrap();
        assert_eq!(device.size(), size, "{id}: the usable size is the kernel's");
        let mut model = vec![0u8; size as usize];
        device
            .read(0, &mut model)
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert!(
            model[..KERNEL_DATA] == pattern(KERNEL_DATA, 1)[..],
            "{id}: kernel data"
        );
        let journalled = 2 << 20..(2 << 20) + JOURNAL_DATA;
        assert!(
            model[journalled.clone()] == pattern(JOURNAL_DATA, 2)[..],
            "{id}: journal data"
        );
        model[journalled.clone()].fill(0);
        assert!(
            model[KERNEL_DATA..].iter().all(|&b| b == 0),
            "{id}: the wipe's zeros"
        );
        model[journalled].copy_from_slice(&pattern(JOURNAL_DATA, 2));
        drop(device);
        // The image as the kernel left it with the last write committed to its journal (whether
        // or not it had also copied it in place), those blocks' in-place data then wiped out:
        // read from the journal when opened read-only, replayed in place when opened writable,
        // byte for byte as the kernel itself copied them out when it closed.
        let layout = open(&image, true).layout().clone();
        let snapshot = dir.join(format!("snap-{id}.img"));
        let journalled =
            (2 << 20) / sector as u64..((2 << 20) + JOURNAL_DATA) as u64 / sector as u64;
        let mut bytes = std::fs::read(&snapshot).unwrap();
        for b in journalled.clone() {
            let at = layout.data_offset(b) as usize;
            bytes[at..at + sector].fill(0);
        }
        std::fs::write(&snapshot, bytes).unwrap();
        let device = open(&snapshot, true);
        assert!(
            device.journalled_blocks() >= journalled.clone().count(),
            "{id}: the kernel's journal held {} blocks",
            device.journalled_blocks()
        );
        let mut seen = vec![0u8; size as usize];
        device
            .read(0, &mut seen)
            .unwrap_or_else(|e| panic!("{id}, snapshot: {e}"));
        assert!(seen == model, "{id}: the snapshot read with its journal");
        drop(device);
        let device = open(&snapshot, false);
        let mut replayed = vec![0u8; size as usize];
        device.read(0, &mut replayed).unwrap();
        assert!(
            replayed == model,
            "{id}: the snapshot with its journal replayed"
        );
        drop(device);
        let (closed, replayed) = (
            std::fs::read(&image).unwrap(),
            std::fs::read(&snapshot).unwrap(),
        );
        for b in journalled {
            for (at, len) in [
                (layout.data_offset(b), sector),
                (layout.tag_offset(b), layout.tag_size as usize),
            ] {
                let r = at as usize..at as usize + len;
                assert!(
                    closed[r.clone()] == replayed[r],
                    "{id}: block {b} replayed unlike the kernel"
                );
            }
        }
        // Writes here, through the journal.
        let device = open(&image, false);
        let layout = device.layout().clone();
        let blocks = layout.blocks();
        for (n, (first, count)) in writes(layout.journal_section_entries, blocks)
            .into_iter()
            .enumerate()
        {
            let count = count.min(blocks - first);
            let data = pattern(count as usize * sector, 100 + n as u64);
            device.write(first, &data).unwrap();
            let at = first as usize * sector;
            model[at..at + data.len()].copy_from_slice(&data);
        }
        drop(device);
        let mut back = vec![0u8; size as usize];
        open(&image, true).read(0, &mut back).unwrap();
        assert!(back == model, "{id}: this crate's writes, read back here");
        // A copy with one data byte and one tag byte flipped, in two blocks.
        let (a, b) = (blocks / 3, blocks / 2 + 1);
        let flipped = dir.join(format!("int-{id}-flip.img"));
        let mut bytes = std::fs::read(&image).unwrap();
        bytes[(layout.data_offset(a) + 100) as usize] ^= 0x01;
        bytes[(layout.tag_offset(b) + 3) as usize] ^= 0x80;
        std::fs::write(&flipped, bytes).unwrap();
        let device = open(&flipped, true);
        let mut refused = BTreeSet::new();
        let mut one = vec![0u8; sector];
        for n in 0..blocks {
            if device.read(n, &mut one).is_err() {
                refused.insert(n);
            }
        }
        assert_eq!(refused, BTreeSet::from([a, b]), "{id}: refused here");
        read_cases.push(format!("{id} {cipher} {integrity} {bits} {sector}"));
        read_cases.push(format!("{id}-flip {cipher} {integrity} {bits} {sector}"));
        expected.push((id, model, [a, b]));
    }
    let read = boot(&dir, "read", &read_cases);
    for (id, model, [a, b]) in expected {
        let sector = model.len()
            / open(&dir.join(format!("int-{id}.img")), true)
                .layout()
                .blocks() as usize;
        assert_eq!(lines(&read, "read", id), ["ok"], "{read}");
        assert!(
            lines(&read, "bad", id).is_empty(),
            "{id}: the kernel refused {:?}",
            lines(&read, "bad", id)
        );
        let kernel = std::fs::read(dir.join(format!("read-{id}.bin"))).unwrap();
        assert!(
            kernel == model,
            "{id}: the kernel reads what this crate wrote"
        );
        let flip = format!("{id}-flip");
        let bad: BTreeSet<u64> = lines(&read, "bad", &flip)
            .iter()
            .map(|l| l.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(bad, BTreeSet::from([a, b]), "{id}: refused by the kernel");
        let mut want = model;
        for n in [a, b] {
            want[n as usize * sector..(n as usize + 1) * sector].fill(0);
        }
        let kernel = std::fs::read(dir.join(format!("read-{flip}.bin"))).unwrap();
        assert!(
            kernel == want,
            "{id}: the kernel reads every other block of the flipped copy"
        );
    }
}
