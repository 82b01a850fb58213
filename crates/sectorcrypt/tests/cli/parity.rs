//! The same verdict as cryptsetup 2.6.1 on the cases where the two once disagreed (issue 14):
//! every case is built with the real cryptsetup (or by editing its header as an attacker or a
//! damaged disk would, checksums recomputed), and `sectorcrypt test-passphrase` must exit as
//! `cryptsetup open --test-passphrase` does with the same options.
//!
//! - In-place conversions whose metadata was tampered with (CVE-2021-4122): the reencryption
//!   digest is checked on every path that unlocks a volume for use.
//! - Unbound keyslots (`luksAddKey --unbound`), `-S` on them, `--unbound`, and the verdict when a
//!   passphrase opens only such slots.
//! - Reencryptions with the old and new keys in different keyslots, `-S` on each.
//! - "No usable keyslot" (exit 1) against "wrong passphrase" (exit 2).

use std::path::Path;

use serde_json::{json, Value};

use crate::common::{
    cs, cs_fast, key, luks2_volume, ok, p, sc, sc_exits, scratch, with_fast_pbkdf,
};
use crate::nbd::serve_refused;
use sectorcrypt_testkit::luks2_json::{edit_json, json_at, reencrypt_keyslot, require_unknown};

/// `cryptsetup open --test-passphrase` and `sectorcrypt test-passphrase` with `extra` options and
/// the passphrase in `key`, on `device`: their exit codes.
fn verdicts(device: &Path, key: &Path, extra: &[&str]) -> (Option<i32>, Option<i32>) {
    let mut theirs = vec!["open", "--test-passphrase", "--key-file", p(key)];
    theirs.extend_from_slice(extra);
    theirs.push(p(device));
    let mut ours = vec!["test-passphrase", "--key-file", p(key)];
    ours.extend_from_slice(extra);
    ours.push(p(device));
    (cs(&theirs).status.code(), sc(&ours).status.code())
}

/// Assert both tools answer `want` (an exit code) for each case `(extra options, key, want)`.
fn assert_same(device: &Path, cases: &[(&[&str], &Path, i32)], what: &str) {
    for (extra, key, want) in cases {
        let (theirs, ours) = verdicts(device, key, extra);
        assert_eq!(
            (theirs, ours),
            (Some(*want), Some(*want)),
            "{what}, {extra:?} with {}: (cryptsetup, sectorcrypt)",
            key.display()
        );
    }
}

#[test]
fn unbound_keyslots_and_unusable_slots_get_cryptsetups_verdicts() {
    let dir = scratch("parity_cli-unbound");
    let (a, b, wrong) = (key(&dir, "a"), key(&dir, "b"), key(&dir, "wrong"));
    let img = dir.join("v.img");
    luks2_volume(&img, 20 << 20, &a);
    // An unbound keyslot (cryptsetup asks no existing passphrase for one).
    ok(
        cs_fast(&["luksAddKey", "--unbound", "-s", "256", p(&img), p(&b)]),
        "luksAddKey --unbound",
    );
    let cases: &[(&[&str], &Path, i32)] = &[
        (&[], &a, 0),
        // A passphrase that opens only an unbound keyslot, the last one tried: not usable.
        (&[], &b, 1),
        (&["-S", "1"], &b, 0),
        (&["--unbound"], &b, 0),
        (&["--unbound"], &a, 0),
        (&["-S", "1"], &a, 2),
        (&[], &wrong, 1),
        (&["-S", "0"], &wrong, 2),
        (&["-S", "5"], &a, 1),
    ];
    assert_same(&img, cases, "unbound keyslot 1");
    // `luksDump --dump-volume-key` reads the key from any slot bound to the data (cryptsetup
    // ignores `-S` there): the same exit code and text from both.
    for (extra, key) in [
        (&[][..], &a),
        (&["-S", "1"][..], &a),
        (&[][..], &b),
        (&["-S", "1"][..], &b),
    ] {
        let mut args = vec!["luksDump", "--dump-volume-key", "-q", "--key-file", p(key)];
        args.extend_from_slice(extra);
        args.push(p(&img));
        let (theirs, ours) = (cs(&args), sc(&args));
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "dump {extra:?} {key:?}"
        );
        assert_eq!(ours.stdout, theirs.stdout, "dump {extra:?} {key:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reencryption_keys_and_tampered_conversion_metadata_get_cryptsetups_verdicts() {
    let dir = scratch("parity_cli-reencrypt");
    let (a, b, wrong) = (key(&dir, "a"), key(&dir, "b"), key(&dir, "wrong"));

    // A reencryption to a new key of a volume with two passphrases, started by cryptsetup: the
    // new key in keyslot 2 (for a) and the reencrypt keyslot 3.
    let img = dir.join("r.img");
    luks2_volume(&img, 24 << 20, &a);
    ok(
        cs_fast(&["luksAddKey", "-q", "--key-file", p(&a), p(&img), p(&b)]),
        "luksAddKey",
    );
    ok(
        cs_fast(&[
            "reencrypt",
            "--init-only",
            "--force-offline-reencrypt",
            "-q",
            "--key-slot",
            "0",
            "--key-file",
            p(&a),
            p(&img),
        ]),
        "reencrypt --init-only",
    );
    let cases: &[(&[&str], &Path, i32)] = &[
        (&[], &a, 0),
        // b opens only the old key: the new one is missing.
        (&[], &b, 2),
        (&["-S", "0"], &a, 1),
        (&["-S", "1"], &a, 2),
        (&["-S", "2"], &a, 1),
        (&["-S", "2"], &b, 2),
        (&["-S", "3"], &a, 1),
        (&["--unbound"], &a, 1),
        // The reencrypt keyslot, tried last, is not usable: "no usable keyslot".
        (&[], &wrong, 1),
    ];
    assert_same(&img, cases, "reencryption to a new key");

    // An encryption with a detached header, started by cryptsetup, then edited.
    let data = dir.join("data.img");
    std::fs::write(&data, sectorcrypt_testkit::pattern(8 << 20, 3)).unwrap();
    let hdr = dir.join("hdr.img");
    ok(
        cs_fast(&[
            "reencrypt",
            "--encrypt",
            "--init-only",
            "--type",
            "luks2",
            "--header",
            p(&hdr),
            "--force-offline-reencrypt",
            "-q",
            "--key-file",
            p(&a),
            p(&data),
        ]),
        "reencrypt --encrypt --init-only",
    );
    let pristine = std::fs::read(&hdr).unwrap();
    let v = json_at(&pristine, 0);
    let ks = reencrypt_keyslot(&v);
    type Edit<'a> = (&'a str, Box<dyn Fn(&mut Value) + 'a>, i32);
    let edits: Vec<Edit> = vec![
        ("unchanged", Box::new(|_: &mut Value| {}), 0),
        (
            "direction",
            Box::new(|v: &mut Value| v["keyslots"][&ks]["direction"] = json!("backward")),
            2,
        ),
        (
            "mode",
            Box::new(|v: &mut Value| v["keyslots"][&ks]["mode"] = json!("decrypt")),
            2,
        ),
        (
            "resilience area type",
            Box::new(|v: &mut Value| {
                let area = &mut v["keyslots"][&ks]["area"];
                let (offset, size) = (area["offset"].clone(), area["size"].clone());
                *area = json!({"type": "none", "offset": offset, "size": size});
            }),
            2,
        ),
        (
            "new segment's cipher",
            Box::new(|v: &mut Value| {
                for seg in v["segments"].as_object_mut().unwrap().values_mut() {
                    if seg["type"] == "crypt" {
                        seg["encryption"] = json!("aes-cbc-essiv:sha256");
                    }
                }
            }),
            2,
        ),
        (
            "backup-previous segment offset",
            Box::new(|v: &mut Value| {
                for seg in v["segments"].as_object_mut().unwrap().values_mut() {
                    if seg["flags"] == json!(["backup-previous"]) {
                        seg["offset"] = json!("4096");
                    }
                }
            }),
            2,
        ),
        (
            "old online-reencrypt requirement",
            Box::new(|v: &mut Value| {
                v["config"]["requirements"]["mandatory"] = json!(["online-reencrypt"])
            }),
            2,
        ),
        (
            "reencryption digest removed",
            Box::new(|v: &mut Value| {
                let digests = v["digests"].as_object_mut().unwrap();
                digests.retain(|_, d| d["keyslots"] != json!([ks.clone()]));
            }),
            1,
        ),
    ];
    let tampered = dir.join("tampered.hdr");
    for (what, edit, want) in &edits {
        let mut bytes = pristine.clone();
        edit_json(&mut bytes, edit);
        std::fs::write(&tampered, &bytes).unwrap();
        let cases: &[(&[&str], &Path, i32)] = &[(&["--header", p(&tampered)], &a, *want)];
        assert_same(&data, cases, &format!("encryption, {what}"));
        // The ways in that unlock the volume for use refuse it too, and change nothing.
        if *want != 0 {
            let before = std::fs::read(&data).unwrap();
            let out = sc(&[
                "serve",
                p(&data),
                "--header",
                p(&tampered),
                "--key-file",
                p(&a),
                "--socket",
                p(&dir.join("s.sock")),
            ]);
            assert_eq!(out.status.code(), Some(*want), "serve, {what}");
            assert_eq!(std::fs::read(&tampered).unwrap(), bytes, "serve, {what}");
            assert!(std::fs::read(&data).unwrap() == before, "serve, {what}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn add_key_unbound_makes_keyslots_cryptsetup_reads_and_dumps() {
    let dir = scratch("parity_cli-add-unbound");
    let (a, b, c) = (key(&dir, "a"), key(&dir, "b"), key(&dir, "c"));
    let img = dir.join("u.img");
    luks2_volume(&img, 20 << 20, &a);
    let before = std::fs::read(&img).unwrap();
    // Refused before any write: --key-size without --unbound.
    assert_eq!(
        sc(&["add-key", "-s", "128", p(&img), p(&b)]).status.code(),
        Some(1)
    );
    assert!(std::fs::read(&img).unwrap() == before);
    // A given key in keyslot 4, a random 128-bit one in the first free slot (1); no existing
    // passphrase is asked.
    let given = dir.join("given.key");
    std::fs::write(&given, sectorcrypt_testkit::pattern(24, 9)).unwrap();
    let fast = &crate::common::FAST_PBKDF;
    let mut args = vec![
        "add-key",
        "--unbound",
        "--volume-key-file",
        p(&given),
        "-S",
        "4",
    ];
    args.extend_from_slice(fast);
    args.extend([p(&img), p(&b)]);
    ok(sc(&args), "add-key --unbound --volume-key-file");
    let mut args = vec!["add-key", "--unbound", "--key-size", "128"];
    args.extend_from_slice(fast);
    args.extend([p(&img), p(&c)]);
    ok(sc(&args), "add-key --unbound --key-size");
    let dump = String::from_utf8(ok(cs(&["luksDump", p(&img)]), "luksDump").stdout).unwrap();
    assert!(
        dump.contains("  1: luks2 (unbound)\n\tKey:        128 bits"),
        "{dump}"
    );
    assert!(
        dump.contains("  4: luks2 (unbound)\n\tKey:        192 bits"),
        "{dump}"
    );
    // The volume still opens as before; each new passphrase opens its own unbound slot only.
    let cases: &[(&[&str], &Path, i32)] = &[
        (&[], &a, 0),
        (&["-S", "4"], &b, 0),
        (&["-S", "1"], &c, 0),
        (&["-S", "1"], &b, 2),
        (&[], &b, 1),
    ];
    assert_same(&img, cases, "unbound keyslots added here");
    // The unbound keys as cryptsetup prints them, the given one byte for byte.
    for (slot, key) in [("4", &b), ("1", &c), ("0", &a), ("4", &a), ("7", &b)] {
        let args = [
            "luksDump",
            "--unbound",
            "-S",
            slot,
            "-q",
            "--key-file",
            p(key),
            p(&img),
        ];
        let (theirs, ours) = (cs(&args), sc(&args));
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "--unbound -S {slot}"
        );
        assert_eq!(ours.stdout, theirs.stdout, "--unbound -S {slot}");
    }
    let out = ok(
        sc(&[
            "dump",
            "--unbound",
            "-S",
            "4",
            "--json",
            "--key-file",
            p(&b),
            p(&img),
        ]),
        "dump --unbound --json",
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["key"], hex::encode(sectorcrypt_testkit::pattern(24, 9)));
    assert_eq!(v["key_bits"], 192);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An LVM2 physical-volume label in sector 1, as `pvcreate` writes it (its checksum computed here
/// from LVM2's documented CRC, not with the code under test).
fn write_lvm2_label(img: &Path) {
    let mut s = [0u8; 512];
    s[0..8].copy_from_slice(b"LABELONE");
    s[8..16].copy_from_slice(&1u64.to_le_bytes());
    s[20..24].copy_from_slice(&32u32.to_le_bytes());
    s[24..32].copy_from_slice(b"LVM2 001");
    s[32..64].copy_from_slice(b"abcdefghijklmnopqrstuvwxyz012345");
    s[64..72].copy_from_slice(&(20u64 << 20).to_le_bytes());
    let mut crc: u32 = 0xf597_a6cf;
    for &b in &s[20..] {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    s[16..20].copy_from_slice(&crc.to_le_bytes());
    let mut bytes = std::fs::read(img).unwrap();
    bytes[512..1024].copy_from_slice(&s);
    std::fs::write(img, bytes).unwrap();
}

/// The first `len` bytes of `src` written over the start of `img`.
fn overlay(img: &Path, src: &Path, len: usize) {
    let mut bytes = std::fs::read(img).unwrap();
    bytes[..len].copy_from_slice(&std::fs::read(src).unwrap()[..len]);
    std::fs::write(img, bytes).unwrap();
}

#[test]
fn foreign_signatures_over_a_header_copy_are_refused_like_cryptsetup() {
    let dir = scratch("parity_cli-signatures");
    let a = key(&dir, "a");
    let img = dir.join("v.img");
    luks2_volume(&img, 20 << 20, &a);
    let pristine = std::fs::read(&img).unwrap();
    // Real swap and ext4 starts, made by the real tools on their own files.
    let swap = dir.join("swap.img");
    std::fs::File::create(&swap)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    ok(
        crate::common::run(std::process::Command::new("mkswap").arg(&swap)),
        "mkswap",
    );
    let ext4 = dir.join("ext4.img");
    std::fs::File::create(&ext4)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    ok(
        crate::common::run(std::process::Command::new("mkfs.ext4").args(["-q", p(&ext4)])),
        "mkfs.ext4",
    );
    type Damage<'a> = Box<dyn Fn(&Path) + 'a>;
    let cases: Vec<(&str, Damage)> = vec![
        ("LVM2_member", Box::new(write_lvm2_label)),
        ("swap", Box::new(|i: &Path| overlay(i, &swap, 4096))),
        ("ext4", Box::new(|i: &Path| overlay(i, &ext4, 4096))),
        (
            "dos",
            Box::new(|i: &Path| {
                let mut cmd = std::process::Command::new("sfdisk");
                cmd.args(["-q", "--wipe", "never", p(i)]);
                cmd.stdin(std::process::Stdio::piped());
                let mut child = cmd.spawn().expect("sfdisk (fdisk package)");
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(b"start=2048, type=83\n")
                    .unwrap();
                assert!(child.wait().unwrap().success(), "sfdisk");
            }),
        ),
    ];
    for (kind, damage) in &cases {
        std::fs::write(&img, &pristine).unwrap();
        damage(&img);
        // libblkid itself sees the signature (LUKS filtered out, as cryptsetup filters it).
        let blkid = crate::common::run(std::process::Command::new("blkid").args([
            "-p",
            "-n",
            "nocrypto_LUKS",
            "-o",
            "value",
            "-s",
            "TYPE",
            "-s",
            "PTTYPE",
            p(&img),
        ]));
        assert_eq!(
            String::from_utf8_lossy(&blkid.stdout).trim(),
            *kind,
            "blkid"
        );
        let damaged = std::fs::read(&img).unwrap();
        let ours = sc(&["test-passphrase", "--key-file", p(&a), p(&img)]);
        let err = String::from_utf8_lossy(&ours.stderr);
        assert_eq!(ours.status.code(), Some(1), "{kind}: {err}");
        assert!(
            err.contains("ambiguous signatures") && err.contains(kind),
            "{err}"
        );
        assert!(std::fs::read(&img).unwrap() == damaged, "{kind}: changed");
        let theirs = cs(&["open", "--test-passphrase", "--key-file", p(&a), p(&img)]);
        assert_eq!(theirs.status.code(), Some(1), "{kind}: cryptsetup");
        assert!(String::from_utf8_lossy(&theirs.stderr).contains("ambiguous signatures"));
    }
    // No foreign signature: the good copy is used (here without writing; cryptsetup recovers
    // the damaged copy as it reads, which sectorcrypt leaves to an explicit repair).
    std::fs::write(&img, &pristine).unwrap();
    let mut bytes = pristine.clone();
    bytes[..4096].fill(0);
    std::fs::write(&img, &bytes).unwrap();
    ok(
        sc(&["test-passphrase", "--key-file", p(&a), p(&img)]),
        "no signature",
    );
    assert!(std::fs::read(&img).unwrap() == bytes);
    ok(
        cs(&["open", "--test-passphrase", "--key-file", p(&a), p(&img)]),
        "cryptsetup, no signature",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `config`, `token` and `erase` run the same way on two copies of one volume, by cryptsetup
/// and by sectorcrypt: the same exit codes, the same `luksDump` afterwards, each tool reading
/// what the other wrote, and nothing written when refused.
#[test]
fn config_tokens_and_erase_match_cryptsetup() {
    let dir = scratch("parity_cli-config");
    let a = key(&dir, "a");
    let theirs = dir.join("theirs.img");
    luks2_volume(&theirs, 20 << 20, &a);
    let ours = dir.join("ours.img");
    std::fs::copy(&theirs, &ours).unwrap();
    let token = dir.join("token.json");
    std::fs::write(
        &token,
        r#"{"type":"example-tool","keyslots":["0"],"z":1,"a":{"n":[1,2]}}"#,
    )
    .unwrap();
    let keyring = dir.join("keyring.json");
    std::fs::write(
        &keyring,
        r#"{"type":"luks2-keyring","keyslots":[],"key_description":"vol1"}"#,
    )
    .unwrap();
    let reserved = dir.join("reserved.json");
    std::fs::write(&reserved, r#"{"type":"luks2-other","keyslots":[]}"#).unwrap();
    let dangling = dir.join("dangling.json");
    std::fs::write(&dangling, r#"{"type":"t","keyslots":["5"]}"#).unwrap();
    let steps: Vec<(Vec<&str>, i32)> = vec![
        (
            vec!["config", "--label", "data", "--subsystem", "backup"],
            0,
        ),
        (vec!["config", "--priority", "prefer", "-S", "0"], 0),
        (vec!["config", "--priority", "ignore", "-S", "3"], 1),
        (
            vec![
                "token",
                "import",
                "--json-file",
                p(&token),
                "--token-id",
                "3",
            ],
            0,
        ),
        (vec!["token", "import", "--json-file", p(&keyring)], 0),
        (
            vec![
                "token",
                "import",
                "--json-file",
                p(&token),
                "--token-id",
                "3",
            ],
            1,
        ),
        (vec!["token", "import", "--json-file", p(&reserved)], 1),
        (vec!["token", "import", "--json-file", p(&dangling)], 1),
        (
            vec![
                "token",
                "import",
                "--json-file",
                p(&keyring),
                "--token-id",
                "3",
                "--token-replace",
            ],
            0,
        ),
        (vec!["token", "remove", "--token-id", "0"], 0),
        (vec!["token", "remove", "--token-id", "0"], 1),
        (
            vec![
                "token",
                "import",
                "--json-file",
                p(&token),
                "--token-id",
                "5",
            ],
            0,
        ),
        (vec!["token", "export", "--token-id", "9"], 1),
    ];
    for (step, want) in &steps {
        let before = std::fs::read(&ours).unwrap();
        let run = |img: &Path, sectorcrypt: bool| {
            let mut args = step.clone();
            args.push(p(img));
            if sectorcrypt {
                sc(&args)
            } else {
                cs(&args)
            }
        };
        let (t, o) = (run(&theirs, false), run(&ours, true));
        assert_eq!(
            (t.status.code(), o.status.code()),
            (Some(*want), Some(*want)),
            "{step:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        if *want != 0 {
            assert!(std::fs::read(&ours).unwrap() == before, "{step:?} wrote");
        }
        let dump = |img: &Path| ok(cs(&["luksDump", p(img)]), "luksDump").stdout;
        assert_eq!(
            String::from_utf8(dump(&ours)).unwrap(),
            String::from_utf8(dump(&theirs)).unwrap(),
            "after {step:?}"
        );
    }
    // Each tool exports what the other imported, byte for byte.
    for id in ["3", "5"] {
        let args = ["token", "export", "--token-id", id];
        let mine = ok(sc(&[&args[..], &[p(&theirs)]].concat()), "export").stdout;
        let cs_out = ok(cs(&[&args[..], &[p(&ours)]].concat()), "export").stdout;
        assert_eq!(mine, cs_out, "token {id}");
    }
    // luksErase: no keyslot left, the same header, and no passphrase opens either.
    ok(cs(&["luksErase", "-q", p(&theirs)]), "luksErase");
    ok(sc(&["erase", "-q", p(&ours)]), "erase");
    let dump = |img: &Path| ok(cs(&["luksDump", p(img)]), "luksDump").stdout;
    assert_eq!(dump(&ours), dump(&theirs));
    assert_same(&ours, &[(&[], &a, 1)], "after erase (ours)");
    assert_same(&theirs, &[(&[], &a, 1)], "after erase (cryptsetup's)");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `repair` rewrites the damaged copy explicitly, over a foreign signature too (after a warning),
/// as `cryptsetup repair` does; a healthy header is left byte for byte as it was.
#[test]
fn repair_restores_a_damaged_copy_like_cryptsetup() {
    let dir = scratch("parity_cli-repair");
    let a = key(&dir, "a");
    let img = dir.join("v.img");
    luks2_volume(&img, 20 << 20, &a);
    let pristine = std::fs::read(&img).unwrap();
    ok(sc(&["repair", p(&img)]), "repair, healthy");
    assert!(
        std::fs::read(&img).unwrap() == pristine,
        "a healthy header was rewritten"
    );
    let theirs = dir.join("theirs.img");
    for damage in [write_lvm2_label as fn(&Path), |i: &Path| {
        let mut b = std::fs::read(i).unwrap();
        b[100..200].fill(0xA5);
        std::fs::write(i, b).unwrap();
    }] {
        std::fs::write(&img, &pristine).unwrap();
        damage(&img);
        std::fs::copy(&img, &theirs).unwrap();
        ok(sc(&["repair", p(&img)]), "repair");
        // Repaired here: cryptsetup finds nothing left to recover (it would rewrite a bad copy).
        let repaired = std::fs::read(&img).unwrap();
        ok(cs(&["repair", p(&img)]), "cryptsetup repair of ours");
        assert!(
            std::fs::read(&img).unwrap() == repaired,
            "cryptsetup still repaired"
        );
        ok(cs(&["repair", p(&theirs)]), "cryptsetup repair");
        for i in [&img, &theirs] {
            // Nothing foreign left, and the volume opens.
            let blkid = crate::common::run(std::process::Command::new("blkid").args([
                "-p",
                "-n",
                "nocrypto_LUKS",
                "-o",
                "value",
                "-s",
                "TYPE",
                p(i),
            ]));
            assert_eq!(String::from_utf8_lossy(&blkid.stdout).trim(), "");
            assert_same(i, &[(&[], &a, 0)], "repaired");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A header with a mandatory requirement of a newer cryptsetup (here beside an interrupted
/// reencryption, and alone): every write and every conversion is refused as cryptsetup 2.6
/// refuses it (exit 1, "Unmet LUKS2 requirements"), nothing changes, and `dump` still reads it.
#[test]
fn unknown_mandatory_requirements_block_every_write_and_conversion() {
    let dir = scratch("parity-requirements");
    let (a, b) = (key(&dir, "a"), key(&dir, "b"));
    for reencrypting in [true, false] {
        let img = dir.join(format!("req-{reencrypting}.img"));
        luks2_volume(&img, 32 << 20, &a);
        // `reencrypt --init-only` or `--resume-only` of `img`, for either tool.
        let reencrypt = |how| ["reencrypt", how, "-q", "--key-file", p(&a), p(&img)];
        if reencrypting {
            ok(
                cs_fast(&reencrypt("--init-only")),
                "cryptsetup reencrypt --init-only",
            );
        }
        let mut bytes = std::fs::read(&img).unwrap();
        require_unknown(&mut bytes, "x-future-feature");
        std::fs::write(&img, &bytes).unwrap();
        // cryptsetup's own verdict on the same header.
        let theirs = cs(&reencrypt("--resume-only"));
        assert_ne!(theirs.status.code(), Some(0), "cryptsetup resumed it");
        assert!(std::fs::read(&img).unwrap() == bytes);
        let header = dir.join("new.hdr");
        let writers: Vec<Vec<&str>> = vec![
            reencrypt("--resume-only").to_vec(),
            vec!["reencrypt", "-q", "--key-file", p(&a), p(&img)],
            vec![
                "decrypt",
                "-q",
                "--key-file",
                p(&a),
                "--header",
                p(&header),
                p(&img),
            ],
            vec!["add-key", "--key-file", p(&a), p(&img), p(&b)],
            vec!["kill-slot", "-q", p(&img), "0"],
            vec!["config", "--label", "x", p(&img)],
            vec!["convert", "-q", "--type", "luks1", p(&img)],
            vec!["erase", "-q", p(&img)],
        ];
        for args in writers {
            let args = match args[0] {
                "reencrypt" if !args.contains(&"--resume-only") => with_fast_pbkdf(&args),
                "add-key" => with_fast_pbkdf(&args),
                _ => args,
            };
            let out = sc(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(std::fs::read(&img).unwrap() == bytes, "{args:?} wrote");
            assert!(!header.exists(), "{args:?} made a header file");
            assert!(err.contains("requirement"), "{args:?}: {err}");
        }
        let dump = ok(sc(&["dump", p(&img)]), "dump");
        assert!(String::from_utf8_lossy(&dump.stdout).contains("x-future-feature"));
        // A passphrase test answers as cryptsetup's; activation is refused, read-only too.
        let ours = sc(&["test-passphrase", "--key-file", p(&a), p(&img)]);
        let theirs = cs(&["open", "--test-passphrase", "--key-file", p(&a), p(&img)]);
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "test-passphrase: {ours:?} {theirs:?}"
        );
        let socket = dir.join("req.sock");
        let (code, err) = serve_refused(&[
            p(&img),
            "--readonly",
            "--key-file",
            p(&a),
            "--socket",
            p(&socket),
        ]);
        assert_eq!(code, Some(1), "serve: {err}");
        assert!(err.contains("requirement"), "serve: {err}");
        assert!(std::fs::read(&img).unwrap() == bytes, "serve wrote");
        // A repair would write both copies: refused too (the secondary copy damaged first).
        let mut damaged = bytes.clone();
        damaged[16384 + 0x1c0] ^= 0xff;
        std::fs::write(&img, &damaged).unwrap();
        let err = sc_exits(&["repair", "-q", p(&img)], 1);
        assert!(err.contains("requirement"), "repair: {err}");
        assert!(std::fs::read(&img).unwrap() == damaged, "repair wrote");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
