//! What the command-line tests share: running sectorcrypt, and the helpers of the dev-only
//! `sectorcrypt-testkit` crate (scratch folders, the real tools, fast key derivation).

use std::path::Path;
use std::process::{Command, Output};

pub(crate) use sectorcrypt_testkit::{
    ok, p, python, scratch, with_fast_pbkdf, Scratch, FAST_PBKDF,
};

/// Run with no standard input (so nothing can wait for a terminal).
pub(crate) fn run(cmd: &mut Command) -> Output {
    sectorcrypt_testkit::output(cmd)
}

/// sectorcrypt with `args`.
pub(crate) fn sc(args: &[&str]) -> Output {
    run(Command::new(env!("CARGO_BIN_EXE_sectorcrypt")).args(args))
}

/// cryptsetup with `args`.
pub(crate) fn cs(args: &[&str]) -> Output {
    sectorcrypt_testkit::cryptsetup(args)
}

/// The volume key as `cryptsetup luksDump --dump-volume-key` prints it, as hex.
pub(crate) fn cryptsetup_volume_key(img: &Path, key: &Path) -> String {
    hex::encode(sectorcrypt_testkit::cryptsetup_volume_key(img, key, &[]))
}

/// The volume key `sectorcrypt dump --dump-volume-key --json` reports for `img` with the
/// passphrase in the file `key`, as hex.
pub(crate) fn our_volume_key(img: &Path, key: &Path) -> String {
    our_volume_key_with(img, key, &[])
}

/// [`our_volume_key`] with `extra` options (`--ceph-conf FILE` for an `rbd:` image).
pub(crate) fn our_volume_key_with(img: &Path, key: &Path, extra: &[&str]) -> String {
    let mut args = vec!["dump", "--dump-volume-key", "--json", "--key-file", p(key)];
    args.extend_from_slice(extra);
    args.push(p(img));
    let out = ok(sc(&args), "sectorcrypt dump --dump-volume-key");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["volume_key"].as_str().unwrap().to_string()
}

/// sectorcrypt with `args` and fast key derivation ([`FAST_PBKDF`]).
pub(crate) fn sc_fast(args: &[&str]) -> Output {
    sc(&with_fast_pbkdf(args))
}

/// cryptsetup with `args` and fast key derivation ([`FAST_PBKDF`]).
pub(crate) fn cs_fast(args: &[&str]) -> Output {
    cs(&with_fast_pbkdf(args))
}

/// A passphrase file `dir/NAME.key` holding "passphrase NAME".
pub(crate) fn key(dir: &Path, name: &str) -> std::path::PathBuf {
    let k = dir.join(format!("{name}.key"));
    std::fs::write(&k, format!("passphrase {name}")).unwrap();
    k
}

/// Whether `cryptsetup open --test-passphrase` opens `img` with the passphrase in `key`.
pub(crate) fn opens_in_cryptsetup(img: &Path, key: &Path) -> bool {
    cs(&["open", "--test-passphrase", "--key-file", p(key), p(img)])
        .status
        .success()
}

/// Whether `sectorcrypt test-passphrase` opens `img` with the passphrase in `key`.
pub(crate) fn opens_here(img: &Path, key: &Path) -> bool {
    sc(&["test-passphrase", "--key-file", p(key), p(img)])
        .status
        .success()
}

/// sectorcrypt with `args`, which must exit with `code`; its standard error.
pub(crate) fn sc_exits(args: &[&str], code: i32) -> String {
    let out = sc(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    err
}

/// A sparse `len`-byte LUKS2 volume made by cryptsetup with the passphrase in `key`.
pub(crate) fn luks2_volume(path: &Path, len: u64, key: &Path) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
    ok(
        cs_fast(&[
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--key-file",
            p(key),
            p(path),
        ]),
        "luksFormat",
    );
}
