//! `sectorcrypt flash ...` on the Linux kernel's own MTD character device: nandsim chips in the
//! kernel oracle (`scripts/kernel-oracle-mtd.sh`, one boot for every geometry), so that every
//! call of the MTD backend (reads with their ECC counters, programs, erases, bad-block queries
//! and marks, spare reads) reaches a real kernel. The guest writes what it read back into the
//! work folder; the bytes are compared here.

use std::path::Path;
use std::process::Command;

use sectorcrypt_testkit::{kernel_oracle, pattern};
use serde_json::Value;

use crate::common::{ok, p, run, scratch};

/// The inputs the guest script takes from its IN folder: name, length (whole 4 KiB blocks, as
/// the NBD exports take writes), pattern seed.
const INPUTS: [(&str, usize, u64); 6] = [
    ("data.bin", 299_008, 1),
    ("nbd.bin", 499_712, 2),
    ("fuse.bin", 200_704, 3),
    ("img.bin", 401_408, 4),
    ("kvol.bin", 1_499_136, 5),
    ("kvol2.bin", 1_802_240, 6),
];

fn input(name: &str) -> Vec<u8> {
    let &(_, len, seed) = INPUTS.iter().find(|(n, _, _)| *n == name).unwrap();
    pattern(len, seed)
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}

fn json(dir: &Path, name: &str) -> Value {
    serde_json::from_slice(&read(dir, name)).unwrap()
}

fn number(dir: &Path, name: &str) -> u64 {
    String::from_utf8(read(dir, name))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The eraseblock numbers listed one a line in `dir/name`.
fn blocks(dir: &Path, name: &str) -> Vec<u64> {
    String::from_utf8(read(dir, name))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

/// `got` starts with `want` (a volume read whole holds its data and then the rest of its LEBs).
#[track_caller]
fn assert_starts_with(got: &[u8], want: &[u8], what: &str) {
    assert!(
        got.len() >= want.len() && got[..want.len()] == want[..],
        "{what}: {} bytes read, the {} written are not their start",
        got.len(),
        want.len()
    );
}

#[test]
fn flash_commands_run_on_a_kernel_mtd_device() {
    let dir = scratch("cli-mtd");
    let inputs = dir.join("in");
    std::fs::create_dir_all(&inputs).unwrap();
    std::fs::write(inputs.join("key"), b"mtd pass").unwrap();
    for (name, _, _) in INPUTS {
        std::fs::write(inputs.join(name), input(name)).unwrap();
    }
    std::fs::write(
        inputs.join("u.cfg"),
        "[img]\nmode=ubi\nimage=img.bin\nvol_id=0\nvol_size=1MiB\nvol_type=dynamic\nvol_name=img\n",
    )
    .unwrap();
    ok(
        run(Command::new("ubinize").current_dir(&inputs).args([
            "-o",
            "slc2k.ubi",
            "-p",
            "128KiB",
            "-m",
            "2048",
            "-s",
            "512",
            "u.cfg",
        ])),
        "ubinize",
    );
    let out = dir.join("out");
    let guest = kernel_oracle::run(
        &dir,
        &kernel_oracle::script("kernel-oracle-mtd.sh"),
        &[env!("CARGO_BIN_EXE_sectorcrypt"), p(&inputs), p(&out)],
    );
    ok(
        guest,
        "sectorcrypt flash on nandsim's /dev/mtd0 in the kernel oracle",
    );
    slc2k(&out.join("slc2k"));
    four_k(&out.join("4k"));
    nop1(&out.join("nop1"));
}

/// 2 KiB pages with sub-pages; bad blocks from the start, at the first erase and at a program.
fn slc2k(o: &Path) {
    let format = json(o, "info-format.json");
    assert_eq!(format["geometry"]["page_size"], 2048);
    assert_eq!(format["geometry"]["sub_page_size"], 512);
    assert_eq!(blocks(o, "bad-before"), [5, 100], "nandsim's badblocks=");
    // Blocks 5 and 100 (bad from the start), 200 (its erase fails) and 210 (its first page
    // fails every program, the bad-block marker's too): the kernel marked what the backend
    // asked, and UBI counts those in its part of the chip.
    let bad = blocks(o, "bad-blocks");
    assert_eq!(bad, [5, 100, 200, 210]);
    let first = format["header"]["ubi_first_block"].as_u64().unwrap();
    let in_ubi = bad.iter().filter(|&&b| b >= first).count();
    assert_eq!(format["ubi"]["bad_pebs"], in_ubi, "{format}");
    assert_starts_with(
        &read(o, "img.bin"),
        &input("img.bin"),
        "the imported volume",
    );
    assert_starts_with(
        &read(o, "data.bin"),
        &input("data.bin"),
        "the updated volume",
    );
    assert_starts_with(
        &read(o, "data-fuse.bin"),
        &input("nbd.bin"),
        "written over NBD, read through FUSE",
    );
    assert_starts_with(
        &read(o, "img-nbd.bin"),
        &input("fuse.bin"),
        "written through FUSE, read over NBD",
    );
    let mut data = input("nbd.bin");
    data[4096..4096 + 8192].fill(0x5a);
    assert_starts_with(&read(o, "data-after.bin"), &data, "data after detaching");
    assert_starts_with(
        &read(o, "img-after.bin"),
        &input("fuse.bin"),
        "img after detaching",
    );
    assert_eq!(json(o, "info-after.json")["ubi"]["bad_pebs"], in_ubi);
    // The raw export's spare areas are the chip's: the bad-block markers (byte 0 of the first
    // page's spare area on a large-page chip) of the blocks bad from the start and of the one
    // marked for its failed erase, and the ECC bytes of a programmed page.
    let raw = read(o, "raw-oob.bin");
    let (page, spare, pages) = (2048, 64, 64);
    assert_eq!(raw.len(), 256 * pages * (page + spare));
    let first_spare = |block: usize| {
        let at = block * pages * (page + spare) + page;
        &raw[at..at + spare]
    };
    for block in [5, 100, 200] {
        assert_ne!(
            first_spare(block)[0],
            0xFF,
            "block {block}'s bad-block marker"
        );
    }
    let used = first + 40;
    assert!(
        first_spare(used as usize).iter().any(|&b| b != 0xFF),
        "block {used}: a programmed page without ECC bytes"
    );
}

/// 4 KiB pages, random bit-flips: converted both ways, scrubbed, read by the kernel's UBI.
fn four_k(o: &Path) {
    assert_starts_with(
        &read(o, "kvol.bin"),
        &input("kvol.bin"),
        "the kernel's volume, converted",
    );
    let (before, after) = (number(o, "corrected-before"), number(o, "corrected-after"));
    assert!(
        after > before,
        "the kernel corrected no bit-flip: {before} then {after}"
    );
    let written = json(o, "info-written.json");
    let scrubbed = json(o, "info-scrubbed.json");
    assert_eq!(written["geometry"]["page_size"], 4096);
    assert_eq!(written["geometry"]["sub_page_size"], 1024);
    // A scrub moves a LEB to another PEB under a new sequence number; the reads wrote nothing.
    assert!(
        scrubbed["ubi"]["max_sqnum"].as_u64() > written["ubi"]["max_sqnum"].as_u64(),
        "no PEB read with bit-flips was scrubbed: {written} then {scrubbed}"
    );
    assert_starts_with(
        &read(o, "kvol-kernel.bin"),
        &input("kvol2.bin"),
        "the volume as the kernel's UBI reads it after convert --decrypt",
    );
}

/// No sub-pages (NOP 1), and a power cut while writes are in flight.
fn nop1(o: &Path) {
    assert_eq!(number(o, "subpagesize"), 2048);
    let info = json(o, "info.json");
    assert_eq!(info["geometry"]["sub_page_size"], 2048);
    assert_eq!(info["geometry"]["nop"], 1);
    let before = read(o, "data.bin");
    assert_starts_with(&before, &input("data.bin"), "the updated volume");
    let leb = info["ubi"]["leb_size"].as_u64().unwrap() as usize;
    let cut = read(o, "data-cut.bin");
    assert_eq!(cut.len(), before.len());
    assert!(
        cut[..4 * leb].iter().all(|&b| b == 0x11),
        "the flushed writes are lost"
    );
    // What was in flight is old or new by sector, never a mix inside one: a write not yet
    // acknowledged may be partly done, as on any disk (the export changes a LEB atomically,
    // but a request may reach it in more than one piece).
    let acknowledged = number(o, "acknowledged-at-cut");
    let sector = 512;
    let in_flight = cut.chunks(sector).zip(before.chunks(sector)).enumerate();
    for (i, (now, then)) in in_flight.skip(4 * leb / sector) {
        assert!(
            now.iter().all(|&b| b == 0x22) || now == then,
            "sector {i} is torn by the power cut ({acknowledged} of 12 writes acknowledged)"
        );
    }
    assert_eq!(json(o, "info-cut.json")["ubi"]["corrupted_pebs"], 0);
    assert_starts_with(
        &read(o, "data-recovered.bin"),
        &input("nbd.bin"),
        "after the cut",
    );
}
