//! `format --integrity` and what takes such a volume (`serve`, `mount`, key commands), against
//! the kernel: volumes formatted and written here open in the kernel's cryptsetup and read back
//! block for block; a tampered block is an I/O error here, the others read.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use sectorcrypt_integrity::{Layout, Superblock};
use sectorcrypt_testkit::{kernel_oracle, pattern};

use crate::common::{ok, p, run, sc, sc_exits, scratch, FAST_PBKDF};
use crate::fuse::{mountpoint, Mounted};
use crate::nbd::Served;

const PASSPHRASE: &str = "integrity pass";

/// `format --integrity` of a new 32 MiB `img`, with `extra` options.
fn format(img: &Path, key: &Path, extra: &[&str]) {
    std::fs::File::create(img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let mut args = vec!["format", p(img), "--key-file", p(key), "-q"];
    args.extend_from_slice(&FAST_PBKDF);
    args.extend_from_slice(extra);
    ok(sc(&args), "format --integrity");
}

/// Write `data` at the start of `img` through `serve` and `nbdcopy`.
fn write_through_nbd(dir: &Path, img: &Path, key: &Path, data: &[u8]) -> u64 {
    let input = dir.join("nbd-in.bin");
    std::fs::write(&input, data).unwrap();
    let served = Served::unix(dir, "w.sock", img, key, &[]);
    let size = served.size;
    ok(
        run(Command::new("nbdcopy").args([p(&input), &served.uri])),
        "nbdcopy in",
    );
    served.stop();
    size
}

/// `qemu-io` on `uri` (read-only with `-r` in `options`), running `commands` in turn.
fn qemu_io(uri: &str, options: &[&str], commands: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]).args(options).arg(uri);
    for c in commands {
        cmd.args(["-c", c]);
    }
    run(&mut cmd)
}

/// The integrity layout of a LUKS2 volume whose data segment starts at 16 MiB.
fn layout(img: &Path) -> Layout {
    let bytes = std::fs::read(img).unwrap();
    let sb = Superblock::parse(&bytes[16 << 20..(16 << 20) + 4096]).unwrap();
    Layout::new(&sb, (16 << 20) / 512).unwrap()
}

#[test]
fn integrity_volumes_formatted_and_written_here_read_back_in_the_kernel() {
    let dir = scratch("cli-integrity-kernel");
    let key = dir.join("key");
    std::fs::write(&key, PASSPHRASE).unwrap();
    // ID, --integrity, --cipher, --sector-size, wiped, --integrity-legacy-padding.
    let cases = [
        (
            "h256",
            "hmac-sha256",
            "aes-xts-plain64",
            "4096",
            true,
            false,
        ),
        ("h512", "hmac-sha512", "aes-xts-plain64", "512", true, false),
        ("h1", "hmac-sha1", "aes-xts-plain64", "4096", true, false),
        ("gcm", "aead", "aes-gcm-random", "4096", true, false),
        ("cha", "poly1305", "chacha20-random", "4096", true, false),
        ("aegis", "aead", "aegis128-random", "512", true, false),
        (
            "nowipe",
            "hmac-sha256",
            "aes-xts-plain64",
            "4096",
            false,
            false,
        ),
        ("legacy", "aead", "aes-gcm-random", "4096", true, true),
    ];
    let data = pattern(1 << 20, 21);
    let mut lines = Vec::new();
    let mut sizes = Vec::new();
    for (id, integrity, cipher, sector, wiped, legacy) in cases {
        let img = dir.join(format!("int-{id}.img"));
        let mut extra = vec![
            "--integrity",
            integrity,
            "--cipher",
            cipher,
            "--sector-size",
            sector,
        ];
        if !wiped {
            extra.push("--integrity-no-wipe");
        }
        if legacy {
            extra.push("--integrity-legacy-padding");
        }
        if cipher.starts_with("aegis128") {
            // AEGIS-128 takes a 128-bit key only; cryptsetup wants it said too.
            extra.extend(["--key-size", "128"]);
        }
        format(&img, &key, &extra);
        sizes.push(write_through_nbd(&dir, &img, &key, &data));
        lines.push(format!("{id} {cipher} {integrity} 0 {sector}"));
    }
    std::fs::write(dir.join("cases"), lines.join("\n") + "\n").unwrap();
    let out = ok(
        kernel_oracle::run(
            &dir,
            &kernel_oracle::script("kernel-oracle-integrity.sh"),
            &["read", p(&dir.join("cases"))],
        ),
        "the kernel oracle's read phase",
    );
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    for ((id, _, _, sector, wiped, legacy), size) in cases.into_iter().zip(sizes) {
        let said = |word: &str| -> Vec<String> {
            out.lines()
                .filter_map(|l| l.strip_prefix(&format!("{word} {id} ")).map(str::to_string))
                .collect()
        };
        assert_eq!(said("read"), ["ok"], "{out}");
        if legacy {
            // 4096 tags of 28 bytes: 112 KiB, padded to 128 KiB (4 KiB padding leaves it).
            assert_eq!(
                layout(&dir.join(format!("int-{id}.img"))).metadata_run,
                256,
                "{id}: tag runs padded to 128 KiB"
            );
        }
        assert_eq!(
            said("size"),
            [size.to_string()],
            "{id}: the kernel's size is ours"
        );
        let read = std::fs::read(dir.join(format!("read-{id}.bin"))).unwrap();
        assert!(
            read[..data.len()] == data[..],
            "{id}: the kernel reads what was written here"
        );
        let bad: BTreeSet<u64> = said("bad")
            .iter()
            .map(|l| l.split(' ').next().unwrap().parse().unwrap())
            .collect();
        let sector: u64 = sector.parse().unwrap();
        let written = data.len() as u64 / sector;
        if wiped {
            assert!(bad.is_empty(), "{id}: the kernel refused {bad:?}");
            assert!(
                read[data.len()..].iter().all(|&b| b == 0),
                "{id}: the wipe's zeros"
            );
        } else {
            // Never written: every tag fails, in the kernel as here.
            let want: BTreeSet<u64> = (written..size / sector).collect();
            assert_eq!(bad, want, "{id}: the unwritten blocks, and only they, fail");
        }
    }
}

#[test]
fn a_tampered_block_is_an_io_error_and_every_other_block_reads() {
    let dir = scratch("cli-integrity-serve");
    let key = dir.join("key");
    std::fs::write(&key, PASSPHRASE).unwrap();
    let img = dir.join("int.img");
    format(
        &img,
        &key,
        &["--integrity", "hmac-sha256", "--sector-size", "4096"],
    );
    let dump = String::from_utf8_lossy(&ok(sc(&["dump", p(&img)]), "dump").stdout).into_owned();
    assert!(dump.contains("integrity: hmac(sha256)"), "{dump}");
    let data = pattern(40 * 4096, 22);
    write_through_nbd(&dir, &img, &key, &data);
    // A byte of block 7's data flipped on the device.
    let at = layout(&img).data_offset(7) + 10;
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[at as usize] ^= 1;
    std::fs::write(&img, bytes).unwrap();
    let served = Served::unix(&dir, "r.sock", &img, &key, &["--readonly"]);
    let read = qemu_io(&served.uri, &["-r"], &["read 28672 4096"]);
    let said =
        String::from_utf8_lossy(&read.stdout).into_owned() + &String::from_utf8_lossy(&read.stderr);
    assert!(said.contains("Input/output error"), "block 7: {said}");
    for block in [6u64, 8, 39] {
        let out = ok(
            qemu_io(
                &served.uri,
                &["-r"],
                &[&format!("read -v {} 16", block * 4096)],
            ),
            "qemu-io read",
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let first = hex_bytes(&data[block as usize * 4096..block as usize * 4096 + 16]);
        assert!(text.contains(&first), "block {block}: {text}");
    }
    served.stop();
    // The same through FUSE: EIO for block 7 only.
    let mp = mountpoint(&dir, "mnt");
    let m = Mounted::start(&img, &key, &mp, &["--readonly"]);
    let file = std::fs::File::open(m.volume()).unwrap();
    let mut buf = vec![0u8; 4096];
    use std::os::unix::fs::FileExt;
    let err = file.read_exact_at(&mut buf, 7 * 4096).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(5), "{err}");
    file.read_exact_at(&mut buf, 8 * 4096).unwrap();
    assert!(buf == data[8 * 4096..9 * 4096]);
    drop(file);
    m.unmount();
}

/// `qemu-io read -v`'s hex of `bytes` (its first line's bytes, space separated).
fn hex_bytes(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn key_commands_work_and_what_integrity_cannot_take_is_refused_with_the_device_untouched() {
    let dir = scratch("cli-integrity-refusals");
    let key = dir.join("key");
    std::fs::write(&key, PASSPHRASE).unwrap();
    let img = dir.join("int.img");
    format(
        &img,
        &key,
        &["--integrity", "aead", "--cipher", "aes-gcm-random"],
    );
    ok(
        sc(&["test-passphrase", p(&img), "--key-file", p(&key)]),
        "test-passphrase",
    );
    let second = dir.join("second");
    std::fs::write(&second, "another passphrase").unwrap();
    let mut add = vec!["add-key", p(&img), p(&second), "--key-file", p(&key)];
    add.extend_from_slice(&FAST_PBKDF);
    ok(sc(&add), "add-key");
    ok(
        sc(&["test-passphrase", p(&img), "--key-file", p(&second)]),
        "the new key opens it",
    );
    // Without the journal: data and tags in place at once, the journal untouched.
    let l = layout(&img);
    let journal = (16 << 20) + 4096..((16 << 20) + l.initial_sectors * 512) as usize;
    let journal_before = std::fs::read(&img).unwrap()[journal.clone()].to_vec();
    let input = dir.join("direct.bin");
    let data = pattern(64 << 10, 23);
    std::fs::write(&input, &data).unwrap();
    let served = Served::unix(&dir, "d.sock", &img, &key, &["--integrity-no-journal"]);
    ok(
        run(Command::new("nbdcopy").args([p(&input), &served.uri])),
        "nbdcopy in",
    );
    let back = dir.join("direct.out");
    ok(
        run(Command::new("nbdcopy").args([&served.uri, p(&back)])),
        "nbdcopy out",
    );
    served.stop();
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..]);
    assert!(
        std::fs::read(&img).unwrap()[journal] == journal_before[..],
        "--integrity-no-journal wrote to the journal"
    );
    let before = std::fs::read(&img).unwrap();
    sc_exits(
        &[
            "serve",
            p(&img),
            "--key-file",
            p(&key),
            "--allow-discards",
            "--socket",
            p(&dir.join("d.sock")),
        ],
        1,
    );
    let err = sc_exits(&["reencrypt", p(&img), "--key-file", p(&key), "-q"], 1);
    assert!(err.contains("integrity"), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refusal changed the volume"
    );
    // Format refusals, before the device is touched.
    let fresh = dir.join("fresh.img");
    std::fs::File::create(&fresh)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    for (extra, why) in [
        (&["--integrity", "aead"][..], "aes-xts-plain64"),
        (&["--integrity", "crc32"][..], "crc32"),
        (
            &["--integrity", "hmac-sha256", "--type", "luks1"][..],
            "LUKS2",
        ),
        (&["--integrity", "none", "--type", "luks1"][..], "LUKS2"),
        (
            &["--integrity", "poly1305", "--cipher", "aes-gcm-random"][..],
            "poly1305",
        ),
    ] {
        let mut args = vec!["format", p(&fresh), "--key-file", p(&key), "-q"];
        args.extend_from_slice(extra);
        let err = sc_exits(&args, 1);
        assert!(err.contains(why), "{extra:?}: {err}");
        assert!(
            std::fs::read(&fresh).unwrap().iter().all(|&b| b == 0),
            "{extra:?} wrote to the device"
        );
    }
    // `--integrity none` is no integrity, as cryptsetup takes it: a plain LUKS2 volume.
    format(
        &fresh,
        &key,
        &["--integrity", "none", "--sector-size", "4096"],
    );
    let dump = ok(
        run(Command::new("cryptsetup").args(["luksDump", p(&fresh)])),
        "cryptsetup luksDump",
    );
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.contains("cipher: aes-xts-plain64") && !dump.contains("integrity"),
        "{dump}"
    );
}

/// A write the client flushed survives the server's SIGKILL (the flush committed it to the
/// journal); the volume then opens with the journal replayed and every tag good.
#[test]
fn a_flushed_write_survives_a_killed_server() {
    let dir = scratch("cli-integrity-kill");
    let key = dir.join("key");
    std::fs::write(&key, PASSPHRASE).unwrap();
    let img = dir.join("int.img");
    format(
        &img,
        &key,
        &["--integrity", "hmac-sha256", "--sector-size", "4096"],
    );
    let served = Served::unix(&dir, "k.sock", &img, &key, &[]);
    ok(
        qemu_io(&served.uri, &[], &["write -P 0x6b 40960 131072", "flush"]),
        "qemu-io write and flush",
    );
    ok(
        run(Command::new("kill").args(["-KILL", &served.pid().to_string()])),
        "kill",
    );
    drop(served);
    let served = Served::unix(&dir, "k2.sock", &img, &key, &["--readonly"]);
    ok(
        qemu_io(
            &served.uri,
            &["-r"],
            &["read -P 0x6b 40960 131072", "read -P 0 0 40960"],
        ),
        "the flushed write, after the kill",
    );
    served.stop();
}
