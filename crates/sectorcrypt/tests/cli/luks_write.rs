//! The commands that write LUKS headers, checked against the real cryptsetup in both directions:
//! what sectorcrypt writes, cryptsetup reads (and `cryptsetup repair` leaves alone), what
//! cryptsetup writes, sectorcrypt edits; refused commands leave the device byte for byte intact.

use std::path::{Path, PathBuf};

use crate::common::{
    cryptsetup_volume_key, cs, cs_fast, key, ok, opens_here, opens_in_cryptsetup, our_volume_key,
    p, sc, sc_exits, sc_fast, scratch, with_fast_pbkdf, FAST_PBKDF,
};
use sectorcrypt_testkit::FAST_LUKS1;

fn image(dir: &Path, name: &str, mib: u64) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    std::fs::File::create(&img)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    img
}

/// `sectorcrypt format` of `img` with the passphrase in `key`, fast key derivation and `extra`
/// options; it must succeed.
fn format_here(img: &Path, key: &Path, extra: &[&str]) {
    let mut args = vec!["format", "-q", "--key-file", p(key)];
    args.extend_from_slice(extra);
    args.push(p(img));
    ok(sc_fast(&args), "format");
}

#[test]
fn formats_cryptsetup_accepts_with_the_given_volume_key() {
    let dir = scratch("luks_write-format");
    let k = key(&dir, "a");
    let vk_hex = "00112233445566778899aabbccddeeff102132435465768798a9bacbdcedfe0f0123456789abcdef0123456789abcdeffedcba9876543210fedcba9876543210";
    let vk = dir.join("vk.bin");
    std::fs::write(&vk, hex::decode(vk_hex).unwrap()).unwrap();
    let cases: [(&str, Vec<&str>); 5] = [
        ("l2-pbkdf2", with_fast_pbkdf(&["--type", "luks2"])),
        (
            "l2-argon2id",
            vec![
                "--type",
                "luks2",
                "--pbkdf",
                "argon2id",
                "--pbkdf-force-iterations",
                "4",
                "--pbkdf-memory",
                "32768",
                "--label",
                "data",
                "--sector-size",
                "512",
            ],
        ),
        ("l2-default-type", FAST_PBKDF.to_vec()),
        ("l1", FAST_LUKS1.to_vec()),
        (
            "l1-sha512",
            [&FAST_LUKS1[..], &["--hash", "sha512"]].concat(),
        ),
    ];
    for (name, extra) in cases {
        let img = image(&dir, name, 32);
        let mut args = vec![
            "format",
            "-q",
            "--key-file",
            p(&k),
            "--volume-key-file",
            p(&vk),
        ];
        args.extend(extra.iter().copied());
        args.push(p(&img));
        ok(sc(&args), name);
        ok(cs(&["luksDump", p(&img)]), name);
        assert!(opens_in_cryptsetup(&img, &k), "{name}");
        assert_eq!(cryptsetup_volume_key(&img, &k), vk_hex, "{name}");
        assert_eq!(our_volume_key(&img, &k), vk_hex, "{name}");
        // cryptsetup's own repair finds nothing to change.
        let before = std::fs::read(&img).unwrap();
        ok(cs(&["repair", "-q", p(&img)]), name);
        assert!(
            std::fs::read(&img).unwrap() == before,
            "{name}: cryptsetup repair changed the header"
        );
        // The dump is the same text cryptsetup prints.
        assert_eq!(
            sc(&["dump", p(&img)]).stdout,
            cs(&["luksDump", p(&img)]).stdout,
            "{name}"
        );
    }
}

#[test]
fn keyslots_added_and_removed_here_are_seen_by_cryptsetup_and_back() {
    let dir = scratch("luks_write-slots");
    for version in ["luks2", "luks1"] {
        let (a, b, c, d) = (
            key(&dir, "a"),
            key(&dir, "b"),
            key(&dir, "c"),
            key(&dir, "d"),
        );
        let img = image(&dir, version, 32);
        format_here(&img, &a, &["--type", version]);
        let vk = our_volume_key(&img, &a);
        // Added here, opens in cryptsetup.
        ok(
            sc_fast(&["add-key", "--key-file", p(&a), "-S", "3", p(&img), p(&b)]),
            "add-key",
        );
        assert!(opens_in_cryptsetup(&img, &b), "{version}");
        // Added by cryptsetup, opens here.
        ok(
            cs_fast(&["luksAddKey", "-q", "--key-file", p(&a), p(&img), p(&c)]),
            "luksAddKey",
        );
        assert!(opens_here(&img, &c), "{version}");
        // Changed here.
        ok(
            sc_fast(&["change-key", "--key-file", p(&c), p(&img), p(&d)]),
            "change-key",
        );
        assert!(
            !opens_in_cryptsetup(&img, &c) && opens_in_cryptsetup(&img, &d),
            "{version}"
        );
        // Removed and killed here.
        ok(
            sc(&["remove-key", "-q", "--key-file", p(&b), p(&img)]),
            "remove-key",
        );
        assert!(!opens_in_cryptsetup(&img, &b), "{version}");
        ok(
            sc(&["kill-slot", "--key-file", p(&a), p(&img), "0"]),
            "kill-slot",
        );
        assert!(!opens_in_cryptsetup(&img, &a), "{version}");
        assert!(
            opens_in_cryptsetup(&img, &d) && opens_here(&img, &d),
            "{version}"
        );
        assert_eq!(
            cryptsetup_volume_key(&img, &d),
            vk,
            "{version}: the volume key survived every change"
        );
    }
}

#[test]
fn header_backups_restore_across_tools() {
    let dir = scratch("luks_write-backup");
    let (a, b) = (key(&dir, "a"), key(&dir, "b"));
    for version in ["luks2", "luks1"] {
        let img = image(&dir, version, 32);
        format_here(&img, &a, &["--type", version]);
        let ours = dir.join(format!("{version}-ours.backup"));
        ok(
            sc(&["header-backup", p(&img), "--header-backup-file", p(&ours)]),
            "backup",
        );
        // A second backup to the same file is refused and changes nothing.
        let again = sc(&["header-backup", p(&img), "--header-backup-file", p(&ours)]);
        assert_eq!(again.status.code(), Some(1));
        // Change the passphrase, restore our backup with cryptsetup: the old passphrase is back.
        ok(
            sc_fast(&["change-key", "--key-file", p(&a), p(&img), p(&b)]),
            "change-key",
        );
        assert!(!opens_here(&img, &a));
        ok(
            cs(&[
                "luksHeaderRestore",
                "-q",
                p(&img),
                "--header-backup-file",
                p(&ours),
            ]),
            "cryptsetup restore",
        );
        assert!(opens_here(&img, &a) && !opens_here(&img, &b), "{version}");
        // cryptsetup's backup restores here.
        let theirs = dir.join(format!("{version}-theirs.backup"));
        ok(
            cs(&[
                "luksHeaderBackup",
                p(&img),
                "--header-backup-file",
                p(&theirs),
            ]),
            "cryptsetup backup",
        );
        ok(
            sc_fast(&["change-key", "--key-file", p(&a), p(&img), p(&b)]),
            "change-key",
        );
        ok(
            sc(&[
                "header-restore",
                "-q",
                p(&img),
                "--header-backup-file",
                p(&theirs),
            ]),
            "restore here",
        );
        assert!(
            opens_in_cryptsetup(&img, &a) && !opens_in_cryptsetup(&img, &b),
            "{version}"
        );
    }
}

#[test]
fn refused_commands_change_nothing() {
    let dir = scratch("luks_write-refused");
    let (a, wrong, new) = (key(&dir, "a"), key(&dir, "wrong"), key(&dir, "new"));
    let img = image(&dir, "v", 32);
    format_here(&img, &a, &[]);
    let before = std::fs::read(&img).unwrap();
    // `format` with one bad option.
    let bad_format =
        |option, value| vec!["format", "-q", "--key-file", p(&a), option, value, p(&img)];
    for (args, code) in [
        (
            vec!["add-key", "--key-file", p(&wrong), p(&img), p(&new)],
            2,
        ),
        (
            vec!["change-key", "--key-file", p(&wrong), p(&img), p(&new)],
            2,
        ),
        (
            vec!["remove-key", "-q", "--key-file", p(&wrong), p(&img)],
            2,
        ),
        (vec!["kill-slot", "--key-file", p(&wrong), p(&img), "0"], 2),
        (vec!["kill-slot", "-q", p(&img), "5"], 1),
        (
            vec!["add-key", "--key-file", p(&a), "-S", "99", p(&img), p(&new)],
            1,
        ),
        (bad_format("--cipher", "aes-xts-plain65"), 1),
        (bad_format("--key-size", "100"), 1),
        (bad_format("--type", "luks3"), 1),
        (bad_format("--pbkdf", "scrypt"), 1),
        (
            vec![
                "header-restore",
                "-q",
                p(&img),
                "--header-backup-file",
                p(&a),
            ],
            1,
        ),
    ] {
        let err = sc_exits(&args, code);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}");
        assert!(
            std::fs::read(&img).unwrap() == before,
            "{args:?} changed the device"
        );
    }
    let missing = dir.join("missing.img");
    assert_eq!(
        sc(&["format", "-q", "--key-file", p(&a), p(&missing)])
            .status
            .code(),
        Some(4)
    );
    assert!(!missing.exists(), "format must not create a missing device");
}

/// A volume cryptsetup is in the middle of re-encrypting carries the `online-reencrypt`
/// requirement: it still reads, but nothing here may change it. A header whose two copies both
/// fail their checksums is refused with exit 1 and left as it is.
#[test]
fn requirements_and_damage_are_refused_without_writing() {
    let dir = scratch("luks_write-requirements");
    let (a, new) = (key(&dir, "a"), key(&dir, "new"));
    let img = dir.join("reenc.img");
    crate::common::luks2_volume(&img, 32 << 20, &a);
    ok(
        cs_fast(&[
            "reencrypt",
            "--init-only",
            "-q",
            "--key-file",
            p(&a),
            p(&img),
        ]),
        "reencrypt --init-only",
    );
    assert!(
        opens_here(&img, &a),
        "a volume mid-reencryption still opens"
    );
    let before = std::fs::read(&img).unwrap();
    for args in [
        with_fast_pbkdf(&["add-key", "--key-file", p(&a), p(&img), p(&new)]),
        vec!["kill-slot", "-q", p(&img), "0"],
    ] {
        let err = sc_exits(&args, 1);
        assert!(err.contains("requirement"), "{err}");
        assert!(
            std::fs::read(&img).unwrap() == before,
            "{args:?} changed the device"
        );
    }

    // Both checksums broken: no copy is usable.
    let img = image(&dir, "damaged", 32);
    format_here(&img, &a, &[]);
    let mut bytes = std::fs::read(&img).unwrap();
    let csum = 0x1c0; // the checksum field of a LUKS2 binary header
    bytes[csum] ^= 0xff;
    bytes[16384 + csum] ^= 0xff;
    std::fs::write(&img, &bytes).unwrap();
    for args in [
        vec!["dump", p(&img)],
        vec!["test-passphrase", "--key-file", p(&a), p(&img)],
        vec!["add-key", "--key-file", p(&a), p(&img), p(&new)],
    ] {
        let err = sc_exits(&args, 1);
        assert_eq!(err.trim_end().lines().count(), 1);
        assert!(!err.contains("panicked"));
    }
    assert_eq!(sc(&["is-luks", p(&img)]).status.code(), Some(1));
    assert!(
        cs(&["luksDump", p(&img)]).status.code() != Some(0),
        "cryptsetup refuses it too"
    );
    assert!(
        std::fs::read(&img).unwrap() == bytes,
        "refusals wrote nothing"
    );
}
