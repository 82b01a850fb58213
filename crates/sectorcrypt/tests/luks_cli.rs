//! The header commands against volumes made by the real cryptsetup: the volume key, UUID and
//! keyslot checks must agree with cryptsetup's own answers, and bad input gets CLI.md's exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("luks_cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (run scripts/install-test-deps.sh)"))
}

fn sectorcrypt(args: &[&str]) -> Output {
    run(Command::new(env!("CARGO_BIN_EXE_sectorcrypt")).args(args))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A volume made by cryptsetup with a fast PBKDF, and its passphrase file.
fn cryptsetup_volume(dir: &Path, name: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let img = dir.join(format!("{name}.img"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&key, format!("passphrase of {name}\n")).unwrap();
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(32 << 20).unwrap();
    let out = run(Command::new("cryptsetup")
        .args(["luksFormat", "-q", "--key-file", path(&key)])
        .args(extra)
        .arg(&img));
    assert!(
        out.status.success(),
        "cryptsetup luksFormat {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (img, key)
}

/// The volume key as cryptsetup prints it.
fn cryptsetup_volume_key(img: &Path, key: &Path) -> String {
    let out = run(Command::new("cryptsetup").args([
        "luksDump",
        "--dump-volume-key",
        "-q",
        "--key-file",
        path(key),
        path(img),
    ]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let start = text.find("MK dump:").expect("MK dump line") + "MK dump:".len();
    text[start..]
        .split_whitespace()
        .take_while(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .collect()
}

#[test]
fn volume_keys_match_cryptsetup_for_luks1_and_luks2() {
    let dir = scratch("keys");
    let cases: [(&str, &[&str]); 6] = [
        (
            "l2-pbkdf2",
            &[
                "--type",
                "luks2",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
            ],
        ),
        (
            "l2-argon2id",
            &[
                "--type",
                "luks2",
                "--pbkdf",
                "argon2id",
                "--pbkdf-force-iterations",
                "4",
                "--pbkdf-memory",
                "32",
            ],
        ),
        (
            "l2-512",
            &[
                "--type",
                "luks2",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--sector-size",
                "512",
                "--key-size",
                "256",
            ],
        ),
        (
            "l1-sha256",
            &["--type", "luks1", "--pbkdf-force-iterations", "1000"],
        ),
        (
            "l1-sha1",
            &[
                "--type",
                "luks1",
                "--pbkdf-force-iterations",
                "1000",
                "--hash",
                "sha1",
                "--cipher",
                "aes-cbc-essiv:sha256",
                "--key-size",
                "256",
            ],
        ),
        (
            "l1-sha512",
            &[
                "--type",
                "luks1",
                "--pbkdf-force-iterations",
                "1000",
                "--hash",
                "sha512",
            ],
        ),
    ];
    for (name, extra) in cases {
        let (img, key) = cryptsetup_volume(&dir, name, extra);
        let want = cryptsetup_volume_key(&img, &key);
        let out = sectorcrypt(&[
            "dump",
            "--dump-volume-key",
            "--json",
            "--key-file",
            path(&key),
            path(&img),
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
        // The text form prints the same bytes as cryptsetup's "MK dump".
        let out = sectorcrypt(&[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            path(&key),
            path(&img),
        ]);
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text.split("MK dump:")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .collect::<String>(),
            want,
            "{name}"
        );
        // UUID as cryptsetup luksUUID.
        let theirs = run(Command::new("cryptsetup").args(["luksUUID", path(&img)]));
        let ours = sectorcrypt(&["luksUUID", path(&img)]);
        assert_eq!(ours.stdout, theirs.stdout, "{name}");
        // test-passphrase: right 0, wrong 2.
        assert_eq!(
            sectorcrypt(&["test-passphrase", "--key-file", path(&key), path(&img)])
                .status
                .code(),
            Some(0)
        );
        let wrong = dir.join("wrong.key");
        std::fs::write(&wrong, "not it").unwrap();
        let out = sectorcrypt(&["test-passphrase", "--key-file", path(&wrong), path(&img)]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
        assert_eq!(sectorcrypt(&["is-luks", path(&img)]).status.code(), Some(0));
        // The header dump parses as JSON and names the same UUID.
        let out = sectorcrypt(&["dump", "--json", path(&img)]);
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
    let dir = scratch("keyfile");
    // A key file whose passphrase is bytes 5..25 of a larger file.
    let big = dir.join("big.key");
    let bytes: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(7)).collect();
    std::fs::write(&big, &bytes).unwrap();
    let img = dir.join("v.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let out = run(Command::new("cryptsetup")
        .args([
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ])
        .args([
            "--key-file",
            path(&big),
            "--keyfile-offset",
            "5",
            "--keyfile-size",
            "20",
        ])
        .arg(&img));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ok = sectorcrypt(&[
        "test-passphrase",
        "--key-file",
        path(&big),
        "--keyfile-offset",
        "5",
        "--keyfile-size",
        "20",
        path(&img),
    ]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let off = sectorcrypt(&[
        "test-passphrase",
        "--key-file",
        path(&big),
        "--keyfile-offset",
        "6",
        "--keyfile-size",
        "20",
        path(&img),
    ]);
    assert_eq!(off.status.code(), Some(2));
    // The same 20 bytes through standard input.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sectorcrypt"))
        .args(["test-passphrase", "--key-file", "-", path(&img)])
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
        sectorcrypt(&["test-passphrase", "--key-file", path(&nl), path(&img)])
            .status
            .code(),
        Some(2)
    );
    // Asking for more bytes than the file has is an error, not a shorter passphrase.
    let short = sectorcrypt(&[
        "test-passphrase",
        "--key-file",
        path(&big),
        "--keyfile-offset",
        "90",
        "--keyfile-size",
        "20",
        path(&img),
    ]);
    assert_eq!(short.status.code(), Some(1));
}

#[test]
fn bad_devices_get_the_documented_exit_codes() {
    let dir = scratch("bad");
    let missing = dir.join("missing.img");
    let zero = dir.join("zero.img");
    std::fs::File::create(&zero)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let tiny = dir.join("tiny.img");
    std::fs::write(&tiny, b"LUKS").unwrap();
    for (args, code) in [
        (vec!["is-luks", path(&missing)], 4),
        (vec!["is-luks", path(&zero)], 1),
        (vec!["isLuks", path(&tiny)], 1),
        (vec!["dump", path(&missing)], 4),
        (vec!["dump", path(&zero)], 4),
        (vec!["luksUUID", path(&zero)], 4),
        (vec!["uuid", path(&tiny)], 4),
    ] {
        let out = sectorcrypt(&args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).lines().count() <= 1,
            "{args:?}"
        );
    }
    // is-luks is quiet unless asked.
    assert!(sectorcrypt(&["is-luks", path(&zero)]).stderr.is_empty());
    assert!(!sectorcrypt(&["is-luks", "-v", path(&zero)])
        .stderr
        .is_empty());
    // No key file and no terminal: refuse to prompt (exit 1), never hang.
    let (img, _) = cryptsetup_volume(
        &dir,
        "prompt",
        &[
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ],
    );
    let out = sectorcrypt(&["test-passphrase", path(&img)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a terminal"));
}
