//! The header commands against volumes made by the real cryptsetup: the volume key, UUID and
//! keyslot checks must agree with cryptsetup's own answers, and bad input gets CLI.md's exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{cryptsetup_volume_key, cs, ok, p, sc, sc_exits, scratch, with_fast_pbkdf};
use sectorcrypt_testkit::{FAST_ARGON2ID, FAST_LUKS1};

/// A volume made by cryptsetup with a fast PBKDF, and its passphrase file.
fn cryptsetup_volume(dir: &Path, name: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let img = dir.join(format!("{name}.img"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&key, format!("passphrase of {name}\n")).unwrap();
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(32 << 20).unwrap();
    let mut args = vec!["luksFormat", "-q", "--key-file", p(&key)];
    args.extend_from_slice(extra);
    args.push(p(&img));
    ok(cs(&args), "cryptsetup luksFormat");
    (img, key)
}

#[test]
fn volume_keys_match_cryptsetup_for_luks1_and_luks2() {
    let dir = scratch("luks_cli-keys");
    let cases: [(&str, Vec<&str>); 6] = [
        ("l2-pbkdf2", with_fast_pbkdf(&["--type", "luks2"])),
        (
            "l2-argon2id",
            [&["--type", "luks2"][..], &FAST_ARGON2ID].concat(),
        ),
        (
            "l2-512",
            with_fast_pbkdf(&[
                "--type",
                "luks2",
                "--sector-size",
                "512",
                "--key-size",
                "256",
            ]),
        ),
        ("l1-sha256", FAST_LUKS1.to_vec()),
        (
            "l1-sha1",
            [
                &FAST_LUKS1[..],
                &[
                    "--hash",
                    "sha1",
                    "--cipher",
                    "aes-cbc-essiv:sha256",
                    "--key-size",
                    "256",
                ],
            ]
            .concat(),
        ),
        (
            "l1-sha512",
            [&FAST_LUKS1[..], &["--hash", "sha512"]].concat(),
        ),
    ];
    for (name, extra) in cases {
        let (img, key) = cryptsetup_volume(&dir, name, &extra);
        let want = cryptsetup_volume_key(&img, &key);
        let out = sc(&[
            "dump",
            "--dump-volume-key",
            "--json",
            "--key-file",
            p(&key),
            p(&img),
        ]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["volume_key"], want, "{name}");
        assert_eq!(
            v["volume_key_bits"].as_u64().unwrap() as usize,
            want.len() * 4,
            "{name}"
        );
        // The text form is cryptsetup's, line for line (cipher, payload offset, UUID, key).
        let args = [
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            p(&key),
            p(&img),
        ];
        let (ours, theirs) = (sc(&args), cs(&args));
        assert!(theirs.status.success() && ours.status.success(), "{name}");
        let text = String::from_utf8(ours.stdout).unwrap();
        assert_eq!(text, String::from_utf8(theirs.stdout).unwrap(), "{name}");
        assert_eq!(
            text.split("MK dump:")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .collect::<String>(),
            want,
            "{name}"
        );
        // No usable keyslot (an inactive slot named, or none left): exit 1, as cryptsetup.
        let copy = dir.join(format!("{name}-killed.img"));
        std::fs::copy(&img, &copy).unwrap();
        for (image, slot) in [(&img, Some("3")), (&copy, None)] {
            if image == &copy {
                ok(cs(&["luksKillSlot", "-q", p(&copy), "0"]), "luksKillSlot");
            }
            let mut args = vec!["test-passphrase", "--key-file", p(&key), p(image)];
            if let Some(s) = slot {
                args.extend(["-S", s]);
            }
            let ours = sc(&args).status.code();
            args[0] = "open";
            args.insert(1, "--test-passphrase");
            let theirs = cs(&args).status.code();
            assert_eq!((ours, theirs), (Some(1), Some(1)), "{name} slot {slot:?}");
        }
        // UUID as cryptsetup luksUUID.
        let theirs = cs(&["luksUUID", p(&img)]);
        let ours = sc(&["luksUUID", p(&img)]);
        assert_eq!(ours.stdout, theirs.stdout, "{name}");
        // test-passphrase: right 0, wrong 2.
        assert_eq!(
            sc(&["test-passphrase", "--key-file", p(&key), p(&img)])
                .status
                .code(),
            Some(0)
        );
        let wrong = dir.join("wrong.key");
        std::fs::write(&wrong, "not it").unwrap();
        let out = sc(&["test-passphrase", "--key-file", p(&wrong), p(&img)]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
        assert_eq!(sc(&["is-luks", p(&img)]).status.code(), Some(0));
        // The header dump parses as JSON and names the same UUID.
        let out = sc(&["dump", "--json", p(&img)]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            v.to_string()
                .contains(String::from_utf8_lossy(&theirs.stdout).trim()),
            "{name}: {v}"
        );
    }
}

#[test]
fn key_file_offset_size_and_stdin_work_like_cryptsetup() {
    let dir = scratch("luks_cli-keyfile");
    // A key file whose passphrase is bytes 5..25 of a larger file.
    let big = dir.join("big.key");
    let bytes: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(7)).collect();
    std::fs::write(&big, &bytes).unwrap();
    let img = dir.join("v.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    // `--key-file BIG --keyfile-offset OFFSET --keyfile-size 20`.
    let key_part = |offset| {
        [
            "--key-file",
            p(&big),
            "--keyfile-offset",
            offset,
            "--keyfile-size",
            "20",
        ]
    };
    let mut format = with_fast_pbkdf(&["luksFormat", "-q", "--type", "luks2"]);
    format.extend_from_slice(&key_part("5"));
    format.push(p(&img));
    ok(cs(&format), "cryptsetup luksFormat");
    let test_passphrase =
        |offset| sc(&[&["test-passphrase"][..], &key_part(offset), &[p(&img)]].concat());
    let right = test_passphrase("5");
    assert_eq!(
        right.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&right.stderr)
    );
    assert_eq!(test_passphrase("6").status.code(), Some(2));
    // The same 20 bytes through standard input.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sectorcrypt"))
        .args(["test-passphrase", "--key-file", "-", p(&img)])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &bytes[5..25]).unwrap();
    drop(child.stdin.take());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    // A trailing newline is part of the passphrase (no stripping).
    let nl = dir.join("nl.key");
    let mut with_nl = bytes[5..25].to_vec();
    with_nl.push(b'\n');
    std::fs::write(&nl, with_nl).unwrap();
    assert_eq!(
        sc(&["test-passphrase", "--key-file", p(&nl), p(&img)])
            .status
            .code(),
        Some(2)
    );
    // Asking for more bytes than the file has is an error, not a shorter passphrase.
    assert_eq!(test_passphrase("90").status.code(), Some(1));
}

#[test]
fn bad_devices_get_the_documented_exit_codes() {
    let dir = scratch("luks_cli-bad");
    let missing = dir.join("missing.img");
    let zero = dir.join("zero.img");
    std::fs::File::create(&zero)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let tiny = dir.join("tiny.img");
    std::fs::write(&tiny, b"LUKS").unwrap();
    for (args, code) in [
        (vec!["is-luks", p(&missing)], 4),
        (vec!["is-luks", p(&zero)], 1),
        (vec!["isLuks", p(&tiny)], 1),
        (vec!["dump", p(&missing)], 4),
        (vec!["dump", p(&zero)], 4),
        (vec!["luksUUID", p(&zero)], 4),
        (vec!["uuid", p(&tiny)], 4),
    ] {
        let err = sc_exits(&args, code);
        assert!(err.lines().count() <= 1, "{args:?}");
    }
    // is-luks is quiet unless asked.
    assert!(sc(&["is-luks", p(&zero)]).stderr.is_empty());
    assert!(!sc(&["is-luks", "-v", p(&zero)]).stderr.is_empty());
    // No key file and no terminal: refuse to prompt (exit 1), never hang.
    let (img, _) = cryptsetup_volume(&dir, "prompt", &with_fast_pbkdf(&["--type", "luks2"]));
    let out = sc(&["test-passphrase", p(&img)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a terminal"));
}
