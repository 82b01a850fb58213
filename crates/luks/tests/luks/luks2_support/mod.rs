//! Shared by the LUKS2 integration tests: running the real cryptsetup on image files, and editing
//! header bytes the way a damaged or hand-made header would look. The checksum is computed here
//! with SHA-256 directly (not with the crate's code), so the tests do not trust what they test.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
// Each test binary uses some of these.
#[allow(unused_imports)]
pub(crate) use sectorcrypt_testkit::luks2_json::{
    edit_json, hdr_size, json_at, put_json_text, reencrypt_keyslot, reseal,
};

pub(crate) use sectorcrypt_testkit::scratch;

pub(crate) fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Run cryptsetup; passphrases only ever reach it through key files.
pub(crate) fn cryptsetup(args: &[&str]) -> Output {
    sectorcrypt_testkit::cryptsetup(args)
}

/// Run cryptsetup and insist that it succeeds; its stdout.
pub(crate) fn cryptsetup_ok(args: &[&str]) -> String {
    let out = cryptsetup(args);
    assert!(
        out.status.success(),
        "cryptsetup {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The JSON metadata `cryptsetup luksDump --dump-json-metadata` shows for `img`.
pub(crate) fn cryptsetup_json(img: &Path) -> Value {
    serde_json::from_str(&cryptsetup_ok(&[
        "luksDump",
        "--dump-json-metadata",
        path(img),
    ]))
    .unwrap()
}

/// Write a key file holding `passphrase`.
pub(crate) fn key_file(dir: &Path, name: &str, passphrase: &str) -> PathBuf {
    let p = dir.join(format!("{name}.key"));
    std::fs::write(&p, passphrase).unwrap();
    p
}

/// A sparse image of `size` bytes formatted as LUKS2 by cryptsetup with `extra` options.
pub(crate) fn format(dir: &Path, name: &str, key: &Path, size: u64, extra: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(size).unwrap();
    drop(f);
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--key-file",
        path(key),
    ];
    args.extend_from_slice(extra);
    args.push(path(&img));
    cryptsetup_ok(&args);
    img
}

/// Fast KDF options for formats and added keys.
pub(crate) const FAST_PBKDF2: &[&str] = &sectorcrypt_testkit::FAST_PBKDF;
pub(crate) const FAST_ARGON2ID: &[&str] = &sectorcrypt_testkit::FAST_ARGON2ID;
pub(crate) const FAST_ARGON2I: &[&str] = &[
    "--pbkdf",
    "argon2i",
    "--pbkdf-force-iterations",
    "4",
    "--pbkdf-memory",
    "32",
];

/// Add a key with `cryptsetup luksAddKey`, unlocking with `old`.
pub(crate) fn add_key(img: &Path, old: &Path, new: &Path, extra: &[&str]) {
    let mut args = vec![
        "luksAddKey",
        "-q",
        "--key-file",
        path(old),
        "--new-keyfile",
        path(new),
    ];
    args.extend_from_slice(extra);
    args.push(path(img));
    cryptsetup_ok(&args);
}

/// The volume key as `cryptsetup luksDump --dump-volume-key` prints it ("MK dump" lines).
pub(crate) fn cryptsetup_volume_key(img: &Path, key: &Path) -> Vec<u8> {
    sectorcrypt_testkit::cryptsetup_volume_key(img, key, &[])
}

/// The keyslot `cryptsetup open --test-passphrase` opens with `key` ("Key slot N unlocked."),
/// or None if it refuses.
pub(crate) fn cryptsetup_slot(img: &Path, key: &Path, slot: Option<usize>) -> Option<usize> {
    let slot_text = slot.map(|s| s.to_string());
    let mut args = vec!["open", "--test-passphrase", "-v", "--key-file", path(key)];
    if let Some(s) = &slot_text {
        args.extend(["--key-slot", s.as_str()]);
    }
    args.push(path(img));
    let out = cryptsetup(&args);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return None;
    }
    let at = text
        .find("Key slot ")
        .expect("cryptsetup -v names the slot")
        + 9;
    Some(
        text[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap(),
    )
}

/// Whether `cryptsetup luksDump` accepts `bytes` as a header, and what it prints. It runs on a
/// copy, because cryptsetup repairs a damaged copy in place as it reads.
pub(crate) fn cryptsetup_dump(dir: &Path, bytes: &[u8]) -> Option<String> {
    let copy = dir.join("cryptsetup-view.img");
    std::fs::write(&copy, bytes).unwrap();
    let out = cryptsetup(&["luksDump", path(&copy)]);
    let _ = std::fs::remove_file(&copy);
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).unwrap())
}
