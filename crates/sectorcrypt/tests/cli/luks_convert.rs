//! `convert --type luks1|luks2` against `cryptsetup convert` 2.6.1, both ways: the same headers
//! (`luksDump` text, LUKS1 header bytes, keyslot material), the same volume keys and passphrases,
//! the same refusals with the same exit codes and nothing written, and an interrupted conversion
//! that no tool takes for a volume until `convert` finishes it.

use std::path::{Path, PathBuf};

use sectorcrypt_luks::convert::{convert, Format};
use sectorcrypt_storage::crash::Outcome;
use sectorcrypt_storage::Power;

use crate::common::{
    cryptsetup_volume_key, cs, key, ok, opens_here, opens_in_cryptsetup, p, sc, sc_exits, scratch,
    FAST_PBKDF,
};
use sectorcrypt_testkit::FAST_ARGON2ID;

fn sparse(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

/// `dir/name`, a sparse `len`-byte file formatted by `cryptsetup luksFormat` with the passphrase
/// in `key` and `options` (cheap PBKDF2 keyslots unless they name a PBKDF).
fn formatted(dir: &Path, name: &str, len: u64, key: &Path, options: &[&str]) -> PathBuf {
    let img = dir.join(name);
    sparse(&img, len);
    let mut args = vec!["luksFormat", "-q", "--key-file", p(key)];
    args.extend_from_slice(options);
    if !options.contains(&"--pbkdf") {
        args.extend_from_slice(&FAST_PBKDF);
    }
    args.push(p(&img));
    ok(cs(&args), "cryptsetup luksFormat");
    img
}

/// `cryptsetup luksAddKey` of the passphrase in `new` to `img`, with `options`.
fn add_key(img: &Path, options: &[&str], new: &Path) {
    let mut args = vec!["luksAddKey", "-q"];
    args.extend_from_slice(options);
    args.extend_from_slice(&FAST_PBKDF);
    args.extend_from_slice(&[p(img), p(new)]);
    ok(cs(&args), "cryptsetup luksAddKey");
}

fn dump(img: &Path) -> String {
    String::from_utf8(ok(cs(&["luksDump", p(img)]), "luksDump").stdout).unwrap()
}

/// cryptsetup converts `theirs`, sectorcrypt `ours` (a copy of it), both to `to`.
fn convert_both(theirs: &Path, ours: &Path, to: &str) {
    ok(
        cs(&["convert", "-q", "--type", to, p(theirs)]),
        "cryptsetup convert",
    );
    ok(
        sc(&["convert", "-q", "--type", to, p(ours)]),
        "sectorcrypt convert",
    );
}

/// LUKS1 made by cryptsetup, keys in slots 0 and 5, converted to LUKS2 by both tools: the same
/// header, opening in both tools with both passphrases and the same volume key; converted back
/// (each tool on the other's LUKS2), the original LUKS1 header and keyslots.
#[test]
fn luks1_to_luks2_and_back_match_cryptsetup() {
    let dir = scratch("luks_convert-1to2");
    let (a, b) = (key(&dir, "a"), key(&dir, "b"));
    let original = formatted(&dir, "original.img", 8 << 20, &a, &["--type", "luks1"]);
    add_key(&original, &["-S", "5", "--key-file", p(&a)], &b);
    let vk = cryptsetup_volume_key(&original, &a);
    let (theirs, ours) = (dir.join("theirs.img"), dir.join("ours.img"));
    std::fs::copy(&original, &theirs).unwrap();
    std::fs::copy(&original, &ours).unwrap();
    convert_both(&theirs, &ours, "luks2");
    assert_eq!(dump(&ours), dump(&theirs));
    for k in [&a, &b] {
        assert!(opens_in_cryptsetup(&ours, k) && opens_here(&ours, k));
        assert!(opens_here(&theirs, k));
        assert_eq!(cryptsetup_volume_key(&ours, k), vk);
    }
    // Back: cryptsetup converts ours, sectorcrypt converts cryptsetup's.
    convert_both(&ours, &theirs, "luks1");
    let before = std::fs::read(&original).unwrap();
    let (by_cs, by_us) = (
        std::fs::read(&ours).unwrap(),
        std::fs::read(&theirs).unwrap(),
    );
    // The LUKS1 keyslots end at 4096 + 8 * 258048; cryptsetup leaves a stale copy of the last
    // 28 KiB after them, sectorcrypt zeroes it, so its round trip gives the original bytes.
    let end = 4096 + 8 * 258048;
    assert!(by_cs[..end] == before[..end], "cryptsetup's round trip");
    assert!(by_us == before, "sectorcrypt's round trip changed bytes");
    for k in [&a, &b] {
        assert!(opens_in_cryptsetup(&theirs, k) && opens_here(&ours, k));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A LUKS2 volume made by cryptsetup (PBKDF2, 512-byte sectors, keys in slots 0 and 3, the
/// inactive LUKS1 slots placed in the gaps) converted to LUKS1 by both tools: the same header
/// bytes and keyslot material, and it opens in both with the same volume key.
#[test]
fn luks2_to_luks1_matches_cryptsetup() {
    let dir = scratch("luks_convert-2to1");
    let (a, b) = (key(&dir, "a"), key(&dir, "b"));
    let options = ["--type", "luks2", "--sector-size", "512", "--label", "gone"];
    let theirs = formatted(&dir, "theirs.img", 20 << 20, &a, &options);
    add_key(&theirs, &["-S", "3", "--key-file", p(&a)], &b);
    let vk = cryptsetup_volume_key(&theirs, &a);
    let ours = dir.join("ours.img");
    std::fs::copy(&theirs, &ours).unwrap();
    convert_both(&theirs, &ours, "luks1");
    assert_eq!(
        dump(&ours).replace("ours.img", "X"),
        dump(&theirs).replace("theirs.img", "X")
    );
    // The header, and the keyslot areas up to the last LUKS1 slot's (the 8 areas follow each
    // other from byte 4096 on).
    let end = 4096 + 8 * 258048;
    let (t, o) = (
        std::fs::read(&theirs).unwrap(),
        std::fs::read(&ours).unwrap(),
    );
    assert!(t[..592] == o[..592], "the LUKS1 headers differ");
    assert!(t[4096..end] == o[4096..end], "the keyslot areas differ");
    for k in [&a, &b] {
        assert!(opens_in_cryptsetup(&ours, k) && opens_here(&ours, k));
        assert_eq!(cryptsetup_volume_key(&ours, k), vk);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A detached LUKS1 header file as `luksFormat --header` makes it (no room for the LUKS2 header
/// copies) grows as cryptsetup grows it, to the same header.
#[test]
fn a_detached_luks1_header_grows_into_luks2() {
    let dir = scratch("luks_convert-detached");
    let a = key(&dir, "a");
    let data = dir.join("data.img");
    sparse(&data, 4 << 20);
    let theirs = dir.join("theirs.hdr");
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        "luks1",
        "--header",
        p(&theirs),
    ];
    args.extend_from_slice(&["--key-file", p(&a), p(&data)]);
    args.extend_from_slice(&FAST_PBKDF);
    ok(cs(&args), "luksFormat --header");
    let ours = dir.join("ours.hdr");
    std::fs::copy(&theirs, &ours).unwrap();
    convert_both(&theirs, &ours, "luks2");
    assert_eq!(
        std::fs::metadata(&ours).unwrap().len(),
        std::fs::metadata(&theirs).unwrap().len()
    );
    assert_eq!(dump(&ours), dump(&theirs));
    let opens = cs(&[
        "open",
        "--test-passphrase",
        "--header",
        p(&ours),
        "--key-file",
        p(&a),
        p(&data),
    ]);
    assert!(opens.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What cryptsetup refuses to convert, sectorcrypt refuses with the same exit code, leaving the
/// device byte for byte as it was.
#[test]
fn refusals_match_cryptsetup_and_write_nothing() {
    let dir = scratch("luks_convert-refused");
    let (a, b) = (key(&dir, "a"), key(&dir, "b"));
    let luks2 = |name: &str, extra: &[&str]| {
        let options = [&["--type", "luks2", "--sector-size", "512"][..], extra].concat();
        formatted(&dir, name, 20 << 20, &a, &options)
    };
    let add = |img: &Path, extra: &[&str]| {
        add_key(img, &[&["--key-file", p(&a)][..], extra].concat(), &b);
    };
    let mut cases: Vec<(PathBuf, &str)> = vec![
        (luks2("argon.img", &FAST_ARGON2ID), "luks1"),
        (
            formatted(&dir, "s4096.img", 20 << 20, &a, &["--sector-size", "4096"]),
            "luks1",
        ),
    ];
    let token = luks2("token.img", &[]);
    let json = dir.join("token.json");
    std::fs::write(&json, r#"{"type":"x","keyslots":[]}"#).unwrap();
    ok(
        cs(&["token", "import", "--json-file", p(&json), p(&token)]),
        "token import",
    );
    cases.push((token, "luks1"));
    let high = luks2("slot9.img", &[]);
    add(&high, &["-S", "9"]);
    cases.push((high, "luks1"));
    let mixed = luks2("mixed.img", &[]);
    add(&mixed, &["--hash", "sha512"]);
    cases.push((mixed, "luks1"));
    let keyslot_cipher = [
        "--keyslot-cipher",
        "aes-cbc-essiv:sha256",
        "--keyslot-key-size",
        "256",
    ];
    cases.push((luks2("kscipher.img", &keyslot_cipher), "luks1"));
    let unbound = luks2("unbound.img", &[]);
    add_key(&unbound, &["--unbound", "--key-size", "512"], &b);
    cases.push((unbound, "luks1"));
    let reenc = luks2("reenc.img", &[]);
    let mut args = vec![
        "reencrypt",
        "-q",
        "--init-only",
        "--key-file",
        p(&a),
        p(&reenc),
    ];
    args.extend_from_slice(&FAST_PBKDF);
    ok(cs(&args), "reencrypt --init-only");
    cases.push((reenc, "luks1"));
    cases.push((luks2("already2.img", &[]), "luks2"));
    let luks1 = |name: &str, extra: &[&str]| {
        let options = [&["--type", "luks1"][..], extra].concat();
        formatted(&dir, name, 20 << 20, &a, &options)
    };
    cases.push((luks1("already1.img", &[]), "luks1"));
    // The keyslots end where the data starts: no room for the LUKS2 header copies.
    let tight = ["--key-size", "256", "--align-payload", "2056"];
    cases.push((luks1("tight.img", &tight), "luks2"));
    for (img, to) in &cases {
        let copy = dir.join("copy.img");
        std::fs::copy(img, &copy).unwrap();
        let before = std::fs::read(img).unwrap();
        let theirs = cs(&["convert", "-q", "--type", to, p(&copy)]);
        assert_eq!(
            theirs.status.code(),
            Some(1),
            "cryptsetup on {}",
            img.display()
        );
        let err = sc_exits(&["convert", "-q", "--type", to, p(img)], 1);
        println!("{}: {}", img.display(), err.trim_end());
        assert!(
            std::fs::read(img).unwrap() == before,
            "{} changed: {err}",
            img.display()
        );
    }
    // A wrong type is a usage error for both; a device that is not LUKS is exit 4 here (1 in
    // cryptsetup: see the README's list of deliberate differences).
    let plain = dir.join("plain.img");
    sparse(&plain, 1 << 20);
    assert_eq!(
        cs(&["convert", "-q", "--type", "plain", p(&plain)])
            .status
            .code(),
        Some(1)
    );
    sc_exits(&["convert", "-q", "--type", "plain", p(&plain)], 1);
    sc_exits(&["convert", "-q", "--type", "luks2", p(&plain)], 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A conversion cut by a power failure half way: cryptsetup sees no LUKS device, sectorcrypt
/// refuses every command but `convert` to the same type, naming it, and does not take the
/// device for plaintext; `convert` finishes it and both tools open the volume.
#[test]
fn an_interrupted_conversion_is_finished_by_convert() {
    let dir = scratch("luks_convert-interrupted");
    let a = key(&dir, "a");
    let img = formatted(&dir, "v.img", 8 << 20, &a, &["--type", "luks1"]);
    let vk = cryptsetup_volume_key(&img, &a);
    let power = Power::new(Some(40));
    let dev = power.device(std::fs::read(&img).unwrap());
    assert!(convert(&dev, Format::Luks2, &mut |_, _| {}).is_err());
    std::fs::write(&img, dev.image(&Outcome::EverythingSurvives)).unwrap();
    assert_eq!(cs(&["isLuks", p(&img)]).status.code(), Some(1));
    let err = sc_exits(&["test-passphrase", "--key-file", p(&a), p(&img)], 1);
    assert!(err.contains("convert --type luks2"), "{err}");
    let before = std::fs::read(&img).unwrap();
    sc_exits(&["convert", "-q", "--type", "luks1", p(&img)], 1);
    let encrypt = sc(&[
        "encrypt",
        "-q",
        "--key-file",
        p(&a),
        "--header",
        p(&dir.join("h")),
        p(&img),
    ]);
    assert!(!encrypt.status.success(), "encrypt took it for plaintext");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused command wrote"
    );
    ok(
        sc(&["convert", "--type", "luks2", p(&img)]),
        "convert (resume)",
    );
    assert!(opens_in_cryptsetup(&img, &a) && opens_here(&img, &a));
    assert_eq!(cryptsetup_volume_key(&img, &a), vk);
    assert!(dump(&img).contains("Version:       \t2"));
    std::fs::remove_dir_all(&dir).unwrap();
}
