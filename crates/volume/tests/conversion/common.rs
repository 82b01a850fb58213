//! What the in-place conversion tests share: patterns, fast KDF settings, a reference
//! encryption, and cryptsetup invocations.

use std::path::{Path, PathBuf};

use sectorcrypt_cipher::{CipherSpec, SectorCipher, SectorOptions};
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::reencrypt::{self, InitOptions, ResilienceKind, State};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_luks::PbkdfOptions;
use sectorcrypt_storage::{FileStorage, Storage};
use sectorcrypt_testkit::{ok, scratch, Scratch};
use sectorcrypt_volume::reencrypt::{run, Options, Outcome};

pub(crate) use sectorcrypt_testkit::{cryptsetup_format_with_volume_key, p, with_fast_pbkdf};

pub(crate) const PASS: &[u8] = b"in place";
pub(crate) const HEADER_LEN: u64 = 16 << 20;

pub(crate) use sectorcrypt_testkit::pattern;

pub(crate) fn fast_init() -> InitOptions {
    InitOptions {
        resilience: ResilienceKind::Checksum(Hash::Sha256),
        block_size: 4096,
        digest_hash: Hash::Sha256,
        digest_iterations: Some(1000),
    }
}

pub(crate) fn fast_pbkdf() -> PbkdfOptions {
    PbkdfOptions {
        kind: Some(sectorcrypt_luks::PbkdfChoice::Pbkdf2),
        force_iterations: Some(1000),
        ..Default::default()
    }
}

/// `plain` encrypted sector by sector with `key` (aes-xts-plain64, IVs in 512-byte units).
pub(crate) fn expected_ciphertext(key: &[u8], sector_size: usize, plain: &[u8]) -> Vec<u8> {
    let c = SectorCipher::new(
        CipherSpec::parse("aes-xts-plain64").unwrap(),
        key,
        &SectorOptions {
            sector_size,
            ..Default::default()
        },
    )
    .unwrap();
    let mut out = plain.to_vec();
    c.encrypt(&mut out, 0).unwrap();
    out
}

pub(crate) fn state_of(header_dev: &dyn Storage) -> State {
    reencrypt::state(Luks2Header::read(header_dev).unwrap().metadata())
}

/// The data sector size the LUKS2 header on `header_dev` records.
pub(crate) fn sector_size_of(header_dev: &dyn Storage) -> usize {
    let h = Luks2Header::read(header_dev).unwrap();
    h.data_segment().unwrap().sector_size as usize
}

/// `cryptsetup ARGS...`, which must succeed.
pub(crate) fn cryptsetup(args: &[&str]) {
    ok(
        sectorcrypt_testkit::cryptsetup(args),
        &format!("cryptsetup {args:?}"),
    );
}

/// `cryptsetup reencrypt EXTRA... --force-offline-reencrypt [--header HDR] --batch-mode
/// --key-file KEY DATA`, which must succeed.
pub(crate) fn cryptsetup_reencrypt(extra: &[&str], hdr: Option<&Path>, key: &Path, data: &Path) {
    let mut args = vec!["reencrypt"];
    args.extend_from_slice(extra);
    args.push("--force-offline-reencrypt");
    if let Some(h) = hdr {
        args.extend_from_slice(&["--header", p(h)]);
    }
    args.extend_from_slice(&["--batch-mode", "--key-file", p(key), p(data)]);
    cryptsetup(&args);
}

/// A scratch folder for an interop test and the key file holding [`PASS`] in it.
pub(crate) fn interop_dir(name: &str) -> (Scratch, PathBuf) {
    let dir = scratch(&format!("reenc-{name}"));
    let key_file = dir.join("pass");
    std::fs::write(&key_file, PASS).unwrap();
    (dir, key_file)
}

/// Run the conversion recorded in the header file `hdr` over the data file `data` (the same
/// file for a header on the device) for one step of `hotzone` bytes (or the shift), and stop:
/// a clean state part way, for the other tool to resume.
pub(crate) fn one_step(hdr: &Path, data: &Path, hotzone: u64) {
    let opts = Options {
        hotzone,
        threads: 2,
    };
    let (h, d) = (
        FileStorage::open(hdr).unwrap(),
        FileStorage::open(data).unwrap(),
    );
    let out = run(&h, &d, PASS, &opts, &mut |_| false).unwrap();
    assert!(matches!(out, Outcome::Paused(_)), "{out:?}");
}

/// Run the conversion recorded in the header file `hdr` over the data file `data` to its end.
pub(crate) fn run_to_end(hdr: &Path, data: &Path) {
    let (h, d) = (
        FileStorage::open(hdr).unwrap(),
        FileStorage::open(data).unwrap(),
    );
    let out = run(&h, &d, PASS, &Options::default(), &mut |_| true).unwrap();
    assert_eq!(out, Outcome::Finished);
}
