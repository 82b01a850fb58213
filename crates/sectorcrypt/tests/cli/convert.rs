//! `sectorcrypt encrypt`, `decrypt` (in place: detached header, or header on the device with the
//! data shifted) and `reencrypt` (new volume key, cipher or sector size; header anywhere) with the
//! real cryptsetup: what we encrypt, cryptsetup decrypts back to the original and the other way
//! round; runs killed with SIGKILL at random moments and resumed lose nothing; SIGINT pauses at a
//! safe point; bad input changes nothing.
//!
//! "A random moment" is a seeded random write: strace delivers the signal on entry to the n-th
//! `pwrite64` (see `sectorcrypt_testkit::fault`), so every kill lands, on any machine, and a
//! failure replays exactly. Images are 32-64 MiB with small hotzones; the `#[ignore]`d
//! `*_full_size` tests run the same bodies on the earlier 128-512 MiB images
//! (`cargo test -p sectorcrypt --test cli -- --ignored convert::`).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{cs, ok, p, sc, scratch, Scratch, FAST_PBKDF};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use sectorcrypt_testkit::fault;
use sectorcrypt_testkit::{
    cryptsetup_format_with_volume_key, cryptsetup_volume_key, with_fast_pbkdf,
};

const MIB: usize = 1 << 20;

/// The system call of every file write sectorcrypt makes (`FileExt::write_at`).
const WRITE: &str = "pwrite64";

const FAST: [&str; 5] = [
    FAST_PBKDF[0],
    FAST_PBKDF[1],
    FAST_PBKDF[2],
    FAST_PBKDF[3],
    "-q",
];

/// A scratch directory, a passphrase file in it, and the path of a data image there.
fn workspace(name: &str) -> (Scratch, PathBuf, PathBuf) {
    let dir = scratch(name);
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let data = dir.join("data.img");
    (dir, key, data)
}

/// `len` seeded random bytes.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let v = random_bytes(len, seed);
    std::fs::write(path, &v).unwrap();
    v
}

/// `cryptsetup reencrypt ARGS... --force-offline-reencrypt --batch-mode --key-file KEY DATA`,
/// which must succeed (`what` names it in the failure).
fn cryptsetup_reencrypt(args: &[&str], key: &Path, data: &Path, what: &str) {
    let mut all = vec!["reencrypt"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--force-offline-reencrypt", "--batch-mode"]);
    all.extend_from_slice(&["--key-file", p(key), p(data)]);
    ok(cs(&all), what);
}

/// [`cryptsetup_reencrypt`] `--encrypt --type luks2 EXTRA...` with fast key derivation.
fn cryptsetup_encrypts(extra: &[&str], key: &Path, data: &Path, what: &str) {
    let mut args = with_fast_pbkdf(&["--encrypt", "--type", "luks2"]);
    args.extend_from_slice(extra);
    cryptsetup_reencrypt(&args, key, data, what);
}

/// The JSON metadata `cryptsetup luksDump` shows for the header at `hdr`.
fn cryptsetup_json(hdr: &Path) -> serde_json::Value {
    let json = ok(
        cs(&["luksDump", "--dump-json-metadata", p(hdr)]),
        "luksDump",
    )
    .stdout;
    serde_json::from_slice(&json).unwrap()
}

/// cryptsetup decrypts DATA in place with header HDR; DATA must then equal `plain`.
fn cryptsetup_decrypts_to(hdr: &Path, data: &Path, key: &Path, plain: &[u8]) {
    cryptsetup_reencrypt(
        &["--decrypt", "--header", p(hdr)],
        key,
        data,
        "cryptsetup reencrypt --decrypt",
    );
    assert!(
        std::fs::read(data).unwrap() == plain,
        "cryptsetup's decryption is not the original"
    );
}

fn encrypt_args<'a>(
    data: &'a Path,
    hdr: &'a Path,
    key: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["encrypt", p(data), "--header", p(hdr), "--key-file", p(key)];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(extra);
    args
}

#[test]
fn encrypted_in_place_and_decrypted_by_cryptsetup() {
    let (dir, key, data) = workspace("encrypt_cli-roundtrip");
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, 48 << 20, 1);
    let out = ok(
        sc(&encrypt_args(
            &data,
            &hdr,
            &key,
            &["--hotzone-size", "8388608", "--json"],
        )),
        "encrypt",
    );
    // One JSON line per step, the last one complete.
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[5]["done"], 48u64 << 20);
    assert_eq!(lines[5]["total"], 48u64 << 20);
    assert!(
        std::fs::read(&data).unwrap() != plain,
        "the data is still plaintext"
    );
    ok(
        cs(&[
            "open",
            "--test-passphrase",
            "--header",
            p(&hdr),
            "--key-file",
            p(&key),
            p(&data),
        ]),
        "cryptsetup open --test-passphrase",
    );
    cryptsetup_decrypts_to(&hdr, &data, &key, &plain);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn sc_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sectorcrypt"));
    cmd.args(args);
    cmd
}

/// How many writes `args` makes when run to its end from the state `files` are in now; the files
/// are then put back as they were (a file that did not exist is removed).
fn writes_of(args: &[&str], files: &[&Path]) -> u64 {
    let saved: Vec<Option<Vec<u8>>> = files.iter().map(|f| std::fs::read(f).ok()).collect();
    let (out, n) = fault::count_calls(&sc_cmd(args), WRITE);
    ok(out, "the counted run");
    for (file, bytes) in files.iter().zip(saved) {
        match bytes {
            Some(b) => std::fs::write(file, b).unwrap(),
            None => {
                let _ = std::fs::remove_file(file);
            }
        }
    }
    n
}

/// `args` run with `signal` delivered on entry to its `n`-th write.
fn signalled_at(args: &[&str], n: u64, signal: &str) -> Output {
    fault::signal_at(&sc_cmd(args), WRITE, n, signal)
}

/// Kill `kills` runs with SIGKILL, run `i` being `args(i)`, each before a seeded random write.
/// `writes` is what one uninterrupted run writes: each kill lands within the first half of what
/// the runs before it left, so every run is killed (asserted) and the kills walk through the
/// conversion. The caller finishes it.
fn kill_runs<'a>(
    writes: u64,
    kills: u32,
    rng: &mut StdRng,
    mut args: impl FnMut(u32) -> Vec<&'a str>,
) {
    let mut left = writes;
    for i in 0..kills {
        let n = rng.gen_range(1..=(left / 2).max(1));
        let out = signalled_at(&args(i), n, "KILL");
        assert_eq!(
            out.status.signal(),
            Some(9),
            "run {i} was not killed before its write {n} (of about {left}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("run {i} killed before its write {n} of about {left}");
        left -= n - 1;
    }
}

/// Whether cryptsetup reads a LUKS2 header at `hdr` (a conversion has been started there).
fn has_header(hdr: &Path) -> bool {
    hdr.exists()
        && cs(&["luksDump", "--dump-json-metadata", p(hdr)])
            .status
            .success()
}

/// The test: an encryption killed with SIGKILL at random moments, then run again until
/// done (from the start while no header is installed, else with `--resume-only`): cryptsetup
/// decrypts the result to the original.
fn sigkill_then_resume(len: usize, hotzone: &str) {
    let (dir, key, data) = workspace(&format!("encrypt_cli-sigkill-{len}"));
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, len, 2);
    let mut rng = StdRng::seed_from_u64(7);
    let steps = ["--hotzone-size", hotzone];
    let first = encrypt_args(&data, &hdr, &key, &steps);
    let mut resume = first.clone();
    resume.push("--resume-only");
    let writes = writes_of(&first, &[&data, &hdr]);
    kill_runs(writes, 4, &mut rng, |_| {
        if has_header(&hdr) {
            resume.clone()
        } else {
            first.clone()
        }
    });
    ok(sc(&resume), "encrypt --resume-only");
    cryptsetup_decrypts_to(&hdr, &data, &key, &plain);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sigkill_at_random_moments_then_resume_loses_nothing() {
    sigkill_then_resume(48 * MIB, "4194304");
}

#[test]
#[ignore = "full size (512 MiB): cargo test -p sectorcrypt --test cli -- --ignored convert::"]
fn sigkill_at_random_moments_then_resume_loses_nothing_full_size() {
    sigkill_then_resume(512 * MIB, "16777216");
}

/// SIGINT in the middle of an encryption (delivered at a seeded random write in the first half
/// of the run): the run stops at the next safe point with exit 1 and a clean, resumable state.
/// Serving the half-converted volume read-only is refused with the command that finishes it;
/// read-write, serving finishes it first.
#[test]
fn sigint_pauses_at_a_safe_point_and_resume_finishes() {
    let (dir, key, data) = workspace("encrypt_cli-sigint");
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, 32 * MIB, 3);
    let args = encrypt_args(&data, &hdr, &key, &["--hotzone-size", "4194304"]);
    let writes = writes_of(&args, &[&data, &hdr]);
    let n = StdRng::seed_from_u64(9).gen_range(writes / 4..=writes / 2);
    let out = signalled_at(&args, n, "INT");
    assert_eq!(
        out.status.code(),
        Some(1),
        "an interrupted run exits 1: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("at a safe point") && err.contains("--resume-only"),
        "{err}"
    );
    let segments = cryptsetup_json(&hdr)["segments"].to_string();
    assert!(
        segments.contains("backup-final") && !segments.contains("in-reencryption"),
        "a SIGINT must leave a clean, resumable state: {segments}"
    );
    let sock = dir.join("s.sock");
    let mut serve = vec![
        "serve",
        p(&data),
        "--header",
        p(&hdr),
        "--key-file",
        p(&key),
        "--socket",
        p(&sock),
    ];
    // Read-only: served as it stands, the encryption left where it is (going on writes).
    let mut readonly = serve.clone();
    readonly.push("--readonly");
    let (first, status) = serve_lines(&readonly, &|lines| lines[0].clone());
    assert!(first.starts_with("sectorcrypt: serving "), "{first}");
    assert!(status, "read-only serve of a half-encrypted volume");
    assert!(
        cryptsetup_json(&hdr)["segments"]
            .to_string()
            .contains("backup-final"),
        "a read-only server does not convert"
    );
    // Read-write: served at once, the encryption going on in the background to its end.
    serve.extend_from_slice(&["--threads", "2"]);
    let (said, status) = serve_lines(&serve, &|lines| lines.join("\n"));
    assert!(status, "serve after finishing: {said}");
    assert!(said.starts_with("sectorcrypt: serving "), "{said}");
    assert!(
        said.contains("resuming the conversion in the background"),
        "{said}"
    );
    let mut resume = args.clone();
    resume.push("--resume-only");
    assert_eq!(sc(&resume).status.code(), Some(1), "nothing left to resume");
    cryptsetup_decrypts_to(&hdr, &data, &key, &plain);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Run a serving command until it says it serves (read-only) or that its conversion is finished,
/// then SIGTERM it: what `enough` makes of its stderr lines, and whether it exited 0.
fn serve_lines(args: &[&str], enough: &dyn Fn(&[String]) -> String) -> (String, bool) {
    let mut server = sc_cmd(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(server.stderr.take().unwrap()));
    let mut seen = Vec::new();
    let wanted = if args.contains(&"--readonly") {
        "sectorcrypt: serving "
    } else {
        "the conversion is finished"
    };
    while let Some(Ok(line)) = lines.next() {
        let done = line.contains(wanted);
        seen.push(line);
        if done {
            break;
        }
    }
    let said = enough(&seen);
    let _ = Command::new("kill")
        .args(["-s", "TERM", &server.id().to_string()])
        .status();
    (said, server.wait().unwrap().success())
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let (dir, key, data) = workspace("encrypt_cli-bad");
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, 8 << 20, 4);
    let code = |args: &[&str]| {
        let out = sc(args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(err.trim().lines().count(), 1, "one line on stderr: {err}");
        out.status.code()
    };
    // No --header; --reduce-device-size; an unsupported cipher: nothing written, no header made.
    let mut no_header = vec!["encrypt", p(&data), "--key-file", p(&key)];
    no_header.extend_from_slice(&FAST);
    assert_eq!(code(&no_header), Some(1));
    // No room for the header and the shifted data (exit 4), a shift that is not whole blocks,
    // and a shift with a detached header (exit 1).
    let mut shift = no_header.clone();
    shift.extend_from_slice(&["--reduce-device-size", "32M"]);
    assert_eq!(code(&shift), Some(4));
    let mut ragged = no_header.clone();
    ragged.extend_from_slice(&["--reduce-device-size", "3K"]);
    assert_eq!(code(&ragged), Some(1));
    assert_eq!(
        code(&encrypt_args(
            &data,
            &hdr,
            &key,
            &["--reduce-device-size", "2M"]
        )),
        Some(1)
    );
    assert_eq!(
        code(&encrypt_args(
            &data,
            &hdr,
            &key,
            &["--cipher", "blowfish-xts-plain64"]
        )),
        Some(1)
    );
    // A size that does not split into 4 KiB blocks.
    let odd = dir.join("odd.img");
    std::fs::write(&odd, vec![7u8; (1 << 20) + 512]).unwrap();
    assert_eq!(code(&encrypt_args(&odd, &hdr, &key, &[])), Some(4));
    assert_eq!(std::fs::read(&odd).unwrap(), vec![7u8; (1 << 20) + 512]);
    assert!(!hdr.exists(), "a refused encrypt created the header file");
    assert_eq!(std::fs::read(&data).unwrap(), plain);
    // A device that is LUKS already.
    let luks = dir.join("luks.img");
    std::fs::write(&luks, vec![0u8; 32 << 20]).unwrap();
    let mut fmt = vec!["format", p(&luks), "--key-file", p(&key)];
    fmt.extend_from_slice(&FAST);
    ok(sc(&fmt), "format");
    let before = std::fs::read(&luks).unwrap();
    assert_eq!(code(&encrypt_args(&luks, &hdr, &key, &[])), Some(5));
    assert_eq!(std::fs::read(&luks).unwrap(), before);
    // Nothing to resume once it is done.
    let out = sc(&encrypt_args(
        &data,
        &hdr,
        &key,
        &["--hotzone-size", "1048576", "--json"],
    ));
    ok(out, "encrypt");
    let encrypted = std::fs::read(&data).unwrap();
    let header_before = std::fs::read(&hdr).unwrap();
    assert_eq!(
        code(&encrypt_args(&data, &hdr, &key, &["--resume-only"])),
        Some(1),
        "nothing to resume"
    );
    assert_eq!(std::fs::read(&hdr).unwrap(), header_before);
    assert_eq!(std::fs::read(&data).unwrap(), encrypted);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn decrypt_args<'a>(
    data: &'a Path,
    hdr: &'a Path,
    key: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "decrypt",
        p(data),
        "--header",
        p(hdr),
        "--key-file",
        p(key),
        "-q",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn decrypts_what_cryptsetup_encrypted_and_what_we_encrypted() {
    let (dir, key, data) = workspace("encrypt_cli-decrypt");
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, 24 << 20, 11);
    cryptsetup_encrypts(
        &["--header", p(&hdr)],
        &key,
        &data,
        "cryptsetup reencrypt --encrypt",
    );
    let encrypted = std::fs::read(&data).unwrap();
    assert!(encrypted != plain);
    // A wrong passphrase: exit 2, nothing changes.
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "not it").unwrap();
    let header_before = std::fs::read(&hdr).unwrap();
    assert_eq!(
        sc(&decrypt_args(&data, &hdr, &wrong, &[])).status.code(),
        Some(2)
    );
    assert_eq!(std::fs::read(&hdr).unwrap(), header_before);
    assert_eq!(std::fs::read(&data).unwrap(), encrypted);
    // No header given: refused, nothing changes.
    let out = sc(&["decrypt", p(&data), "--key-file", p(&key), "-q"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&data).unwrap(), encrypted);
    // Decrypted here, with progress lines.
    let out = ok(
        sc(&decrypt_args(
            &data,
            &hdr,
            &key,
            &["--json", "--hotzone-size", "8388608"],
        )),
        "decrypt",
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 3);
    assert!(
        std::fs::read(&data).unwrap() == plain,
        "not the original after decrypt"
    );
    // Again: nothing to decrypt.
    let again = sc(&decrypt_args(&data, &hdr, &key, &[]));
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not encrypted"));

    // Our encryption, our decryption.
    let hdr2 = dir.join("hdr2.img");
    ok(sc(&encrypt_args(&data, &hdr2, &key, &[])), "encrypt");
    ok(sc(&decrypt_args(&data, &hdr2, &key, &[])), "decrypt");
    assert!(
        std::fs::read(&data).unwrap() == plain,
        "not the original after our round trip"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A decryption killed at random moments, then run again with the same command: the original.
fn decryption_killed_then_resumed(len: usize, hotzone: &str) {
    let (dir, key, data) = workspace(&format!("encrypt_cli-decrypt-kill-{len}"));
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, len, 12);
    ok(sc(&encrypt_args(&data, &hdr, &key, &[])), "encrypt");
    let mut rng = StdRng::seed_from_u64(13);
    let args = decrypt_args(&data, &hdr, &key, &["--hotzone-size", hotzone]);
    let writes = writes_of(&args, &[&data, &hdr]);
    kill_runs(writes, 4, &mut rng, |_| args.clone());
    ok(sc(&args), "decrypt (resumed)");
    assert!(
        std::fs::read(&data).unwrap() == plain,
        "not the original after kills and resume"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn decryption_killed_at_random_moments_then_resumed_loses_nothing() {
    decryption_killed_then_resumed(48 * MIB, "4194304");
}

#[test]
#[ignore = "full size (256 MiB): cargo test -p sectorcrypt --test cli -- --ignored convert::"]
fn decryption_killed_at_random_moments_then_resumed_loses_nothing_full_size() {
    decryption_killed_then_resumed(256 * MIB, "8388608");
}

/// `plain` as aes-xts-plain64 with `key` and `sector` bytes per sector, IVs in 512-byte units.
fn xts(key: &[u8], sector: usize, plain: &[u8]) -> Vec<u8> {
    let c = sectorcrypt_cipher::SectorCipher::new(
        sectorcrypt_cipher::CipherSpec::parse("aes-xts-plain64").unwrap(),
        key,
        &sectorcrypt_cipher::SectorOptions {
            sector_size: sector,
            ..Default::default()
        },
    )
    .unwrap();
    let mut out = plain.to_vec();
    c.encrypt(&mut out, 0).unwrap();
    out
}

/// A reencryption of a volume cryptsetup formatted (header on the device), killed at random
/// moments and run again with the same command: the passphrase opens the new key in cryptsetup,
/// and that key decrypts the payload to the plaintext.
fn reencrypt_killed_then_resumed(payload: usize, hotzone: &str) {
    let dir = scratch(&format!("encrypt_cli-reencrypt-{payload}"));
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let vk_file = dir.join("vk");
    let old = random_bytes(64, 21);
    std::fs::write(&vk_file, &old).unwrap();
    let img = dir.join("img");
    std::fs::write(&img, vec![0u8; (16 << 20) + payload]).unwrap();
    cryptsetup_format_with_volume_key(&img, &key, &vk_file, &["--sector-size", "512"]);
    let plain = random_bytes(payload, 22);
    let mut image = std::fs::read(&img).unwrap();
    image[16 << 20..].copy_from_slice(&xts(&old, 512, &plain));
    std::fs::write(&img, &image).unwrap();

    // Killed at random moments, run again each time (the first run starts it).
    let mut rng = StdRng::seed_from_u64(23);
    let mut args = vec![
        "reencrypt",
        p(&img),
        "--key-file",
        p(&key),
        "--hotzone-size",
        hotzone,
    ];
    args.extend_from_slice(&FAST);
    let writes = writes_of(&args, &[&img]);
    kill_runs(writes, 3, &mut rng, |_| args.clone());
    ok(sc(&args), "reencrypt (resumed)");
    // The passphrase opens the new key in cryptsetup, and that key decrypts the payload.
    let new = cryptsetup_volume_key(&img, &key, &[]);
    assert_ne!(new, old, "the volume key did not change");
    let sector = cryptsetup_json(&img)["segments"]["0"]["sector_size"]
        .as_u64()
        .unwrap() as usize;
    let stored = std::fs::read(&img).unwrap()[16 << 20..].to_vec();
    assert!(
        stored == xts(&new, sector, &plain),
        "the payload is not the plaintext under the new key"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reencrypt_rotates_the_key_of_an_attached_header_volume_even_when_killed() {
    reencrypt_killed_then_resumed(32 * MIB, "4194304");
}

#[test]
#[ignore = "full size (128 MiB): cargo test -p sectorcrypt --test cli -- --ignored convert::"]
fn reencrypt_rotates_the_key_of_an_attached_header_volume_even_when_killed_full_size() {
    reencrypt_killed_then_resumed(128 * MIB, "8388608");
}

#[test]
fn encrypt_reencrypt_decrypt_comes_back_to_the_original() {
    let (dir, key, data) = workspace("encrypt_cli-cycle");
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, 32 << 20, 31);
    ok(sc(&encrypt_args(&data, &hdr, &key, &[])), "encrypt");
    let first = cryptsetup_volume_key(&hdr, &key, &[]);
    let mut re = vec![
        "reencrypt",
        p(&data),
        "--header",
        p(&hdr),
        "--key-file",
        p(&key),
    ];
    re.extend_from_slice(&FAST);
    // A cipher that does not run here: refused, nothing changes.
    let header_before = std::fs::read(&hdr).unwrap();
    let mut bad = re.clone();
    bad.extend_from_slice(&["--cipher", "blowfish-xts-plain64"]);
    assert_eq!(sc(&bad).status.code(), Some(1));
    assert_eq!(std::fs::read(&hdr).unwrap(), header_before);
    // New key, new key size (AES-128-XTS) and new sector size.
    re.extend_from_slice(&[
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "256",
        "--sector-size",
        "512",
    ]);
    ok(sc(&re), "reencrypt");
    let second = cryptsetup_volume_key(&hdr, &key, &[]);
    assert_eq!(second.len(), 32, "the new key is 256 bits");
    assert_ne!(first[..32], second[..], "the volume key did not change");
    assert!(std::fs::read(&data).unwrap() == xts(&second, 512, &plain));
    // Nothing left to resume.
    let mut resume = re.clone();
    resume.push("--resume-only");
    assert_eq!(sc(&resume).status.code(), Some(1));
    cryptsetup_decrypts_to(&hdr, &data, &key, &plain);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The interop test: a file encrypted in place by cryptsetup with
/// `--reduce-device-size` (header on the device, data shifted) is decrypted in place here, the
/// header exported to a new file, back to the original at offset 0.
#[test]
fn decrypts_in_place_what_cryptsetup_encrypted_with_reduce_device_size() {
    let (dir, key, data) = workspace("encrypt_cli-shift-theirs");
    let plain = random_file(&data, 64 * MIB, 41);
    let kept = 48 * MIB; // 64 MiB less --reduce-device-size 16M
    cryptsetup_encrypts(
        &["--reduce-device-size", "16M"],
        &key,
        &data,
        "cryptsetup reencrypt --encrypt --reduce-device-size",
    );
    let encrypted = std::fs::read(&data).unwrap();
    let hdr = dir.join("exported.hdr");
    // Without a file to export the header to, or with a wrong passphrase: refused, untouched,
    // no header file.
    let out = sc(&["decrypt", p(&data), "--key-file", p(&key), "-q"]);
    assert_eq!(out.status.code(), Some(1));
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "not it").unwrap();
    assert_eq!(
        sc(&decrypt_args(&data, &hdr, &wrong, &[])).status.code(),
        Some(2)
    );
    assert!(
        std::fs::read(&data).unwrap() == encrypted,
        "a refused decrypt wrote"
    );
    assert!(!hdr.exists() && !dir.join("exported.hdr.partial").exists());

    ok(
        sc(&decrypt_args(&data, &hdr, &key, &[])),
        "decrypt --header NEWFILE",
    );
    let now = std::fs::read(&data).unwrap();
    assert!(now[..kept] == plain[..kept], "not the original at offset 0");
    assert!(!dir.join("exported.hdr.partial").exists());
    // The exported header is spent: no keyslots, plaintext segment, no requirement.
    let md = cryptsetup_json(&hdr);
    assert_eq!(md["keyslots"], serde_json::json!({}));
    assert_eq!(md["segments"]["0"]["type"], "linear");
    assert!(md["config"].get("requirements").is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A shifted encryption killed with SIGKILL at random moments and run again with the same
/// command each time; cryptsetup then opens it and decrypts it (exporting the header) back to
/// the original. Then the same for our shifted decryption of it, killed at random moments
/// too, twice among its first writes (the header export, the move of the first chunk).
fn shifted_killed_then_resumed(len: usize, reduce_mib: usize) {
    let (dir, key, data) = workspace(&format!("encrypt_cli-shift-kill-{len}"));
    let plain = random_file(&data, len, 42);
    let kept = len - reduce_mib * MIB;
    let reduce = format!("{reduce_mib}M");
    let mut args = vec![
        "encrypt",
        p(&data),
        "--reduce-device-size",
        &reduce,
        "--key-file",
        p(&key),
    ];
    args.extend_from_slice(&FAST);
    let mut rng = StdRng::seed_from_u64(43);
    let writes = writes_of(&args, &[&data]);
    kill_runs(writes, 4, &mut rng, |_| args.clone());
    // Finish with the short form: the device's header says what to resume.
    let resume = ["encrypt", p(&data), "--key-file", p(&key), "--resume-only"];
    ok(sc(&resume), "encrypt --resume-only");
    ok(
        cs(&["open", "--test-passphrase", "--key-file", p(&key), p(&data)]),
        "cryptsetup open --test-passphrase",
    );
    let encrypted = std::fs::read(&data).unwrap();

    // Our decryption of it: first killed between recording the decryption in NAME.partial and
    // renaming it to NAME (its second rename; the first installs NAME.partial), which a rerun
    // must carry on from; then twice among its first writes, then during the steps.
    let hdr = dir.join("exported.hdr");
    let dec = decrypt_args(&data, &hdr, &key, &[]);
    let writes = writes_of(&dec, &[&data, &hdr]);
    let out = fault::signal_at(&sc_cmd(&dec), "rename", 2, "KILL");
    assert_eq!(
        out.status.signal(),
        Some(9),
        "not killed at its second rename"
    );
    assert!(
        !hdr.exists(),
        "killed before the exported header got its name"
    );
    for i in 0..2 {
        let n = rng.gen_range(1..=EARLY_WRITES);
        let out = signalled_at(&dec, n, "KILL");
        assert_eq!(
            out.status.signal(),
            Some(9),
            "early run {i} not killed at {n}"
        );
    }
    kill_runs(writes, 3, &mut rng, |_| dec.clone());
    ok(sc(&dec), "decrypt (resumed)");
    let now = std::fs::read(&data).unwrap();
    assert!(
        now[..kept] == plain[..kept],
        "not the original after kills and resume"
    );

    // And cryptsetup's decryption of the same encryption gives the same.
    std::fs::write(&data, &encrypted).unwrap();
    let hdr2 = dir.join("theirs.hdr");
    cryptsetup_reencrypt(
        &["--decrypt", "--header", p(&hdr2)],
        &key,
        &data,
        "cryptsetup reencrypt --decrypt --header NEWFILE",
    );
    assert!(std::fs::read(&data).unwrap()[..kept] == plain[..kept]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The first writes of a shifted decryption: the exported header and the move of the first
/// chunk come first.
const EARLY_WRITES: u64 = 8;

#[test]
fn shifted_encryption_and_decryption_killed_at_random_moments_lose_nothing() {
    shifted_killed_then_resumed(48 * MIB, 8);
}

#[test]
#[ignore = "full size (512 MiB): cargo test -p sectorcrypt --test cli -- --ignored convert::"]
fn shifted_encryption_and_decryption_killed_at_random_moments_lose_nothing_full_size() {
    shifted_killed_then_resumed(512 * MIB, 8);
}

/// Whether the header at `hdr` has a segment being written (a crash inside a step).
fn crashed(hdr: &Path) -> bool {
    let v = cryptsetup_json(hdr);
    v["segments"]
        .as_object()
        .unwrap()
        .values()
        .any(|s| s["flags"].to_string().contains("in-reencryption"))
}

/// The reencrypt keyslot's resilience (its area type), if a conversion is recorded.
fn resilience_of(hdr: &Path) -> Option<String> {
    let v = cryptsetup_json(hdr);
    v["keyslots"]
        .as_object()
        .unwrap()
        .values()
        .find(|k| k["type"] == "reencrypt")
        .map(|k| k["area"]["type"].as_str().unwrap().to_string())
}

/// cryptsetup's `journal` and `none` resilience, both ways: an encryption cryptsetup started is
/// cut by a signal inside a later step (journal: SIGKILL, a crash the journal must repair here;
/// none: SIGINT, a clean stop) and finished here; one started here with `--resilience`, stopped
/// by SIGINT, is finished by cryptsetup. Each decrypts to the original.
#[test]
fn journal_and_none_resilience_interoperate_with_cryptsetup() {
    let (dir, key, data) = workspace("encrypt_cli-resilience");
    for (res, signal) in [("journal", "KILL"), ("none", "INT")] {
        let plain = random_bytes(16 << 20, 21);
        let hdr = dir.join(format!("cs-{res}.hdr"));
        let mut found = false;
        for n in 16..=60 {
            std::fs::write(&data, &plain).unwrap();
            let _ = std::fs::remove_file(&hdr);
            let mut args = with_fast_pbkdf(&["reencrypt", "--encrypt", "--type", "luks2"]);
            args.extend_from_slice(&["--resilience", res, "--hotzone-size", "1M"]);
            args.extend_from_slice(&["--header", p(&hdr), "--force-offline-reencrypt"]);
            args.extend_from_slice(&["--batch-mode", "--key-file", p(&key), p(&data)]);
            let mut cmd = Command::new("cryptsetup");
            cmd.args(&args);
            fault::signal_at(&cmd, "write", n, signal);
            if !has_header(&hdr) || resilience_of(&hdr).as_deref() != Some(res) {
                continue;
            }
            // journal: a crash inside a step; none: stopped after a step or more.
            let wanted = if res == "journal" {
                crashed(&hdr)
            } else {
                !crashed(&hdr) && std::fs::read(&data).unwrap()[..1 << 20] != plain[..1 << 20]
            };
            if !wanted {
                continue;
            }
            ok(
                sc(&encrypt_args(&data, &hdr, &key, &["--resume-only"])),
                "finishing cryptsetup's conversion",
            );
            assert_eq!(resilience_of(&hdr), None, "{res}: not finished");
            cryptsetup_decrypts_to(&hdr, &data, &key, &plain);
            found = true;
            break;
        }
        assert!(
            found,
            "{res}: SIG{signal} at writes 16 to 60 never left the wanted state"
        );

        // Started here, stopped by SIGINT, finished by cryptsetup.
        std::fs::write(&data, &plain).unwrap();
        let ours = dir.join(format!("sc-{res}.hdr"));
        let args = encrypt_args(
            &data,
            &ours,
            &key,
            &["--resilience", res, "--hotzone-size", "1048576"],
        );
        let writes = writes_of(&args, &[&data, &ours]);
        let out = signalled_at(&args, writes / 2, "INT");
        assert!(!out.status.success(), "{res}: the run was not stopped");
        assert_eq!(
            resilience_of(&ours).as_deref(),
            Some(res),
            "{res}: our header"
        );
        cryptsetup_reencrypt(
            &["--resume-only", "--header", p(&ours)],
            &key,
            &data,
            "cryptsetup resuming ours",
        );
        cryptsetup_decrypts_to(&ours, &data, &key, &plain);
    }
    // A data shift protects itself: --resilience is refused there, nothing written.
    std::fs::write(&data, random_bytes(16 << 20, 22)).unwrap();
    let before = std::fs::read(&data).unwrap();
    let mut args = vec![
        "encrypt",
        p(&data),
        "--reduce-device-size",
        "8M",
        "--key-file",
        p(&key),
    ];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--resilience", "journal"]);
    assert_eq!(sc(&args).status.code(), Some(1));
    assert!(std::fs::read(&data).unwrap() == before);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `datashift-journal` (the moved first chunk of a decryption that exports the header, copied
/// whole into the keyslot area before it is converted in place), both ways: a decryption
/// cryptsetup started with it is finished here, one started here is stopped by SIGINT and
/// finished by cryptsetup; both give the original at offset 0. Where the chunk does not fit the
/// area, both refuse, as cryptsetup does ("Moved segment too large").
#[test]
fn datashift_journal_decryption_interoperates_with_cryptsetup() {
    let dir = scratch("encrypt_cli-datashift-journal");
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let vk_file = dir.join("vk");
    let vk = random_bytes(64, 51);
    std::fs::write(&vk_file, &vk).unwrap();
    // cryptsetup's header (16 MiB, an area of about 15.7 MiB for the journal) on a device with
    // `kept` bytes of data: the moved chunk is all of them, and fits.
    let volume = |len: usize, seed: u64| {
        let img = dir.join("img");
        std::fs::write(&img, vec![0u8; (16 << 20) + len]).unwrap();
        cryptsetup_format_with_volume_key(&img, &key, &vk_file, &["--sector-size", "4096"]);
        let plain = random_bytes(len, seed);
        let mut image = std::fs::read(&img).unwrap();
        image[16 << 20..].copy_from_slice(&xts(&vk, 4096, &plain));
        std::fs::write(&img, &image).unwrap();
        (img, plain, image)
    };
    let kept = 8 * MIB;
    let (data, plain, encrypted) = volume(kept, 52);

    let theirs = dir.join("theirs.hdr");
    cryptsetup_reencrypt(
        &[
            "--decrypt",
            "--init-only",
            "--header",
            p(&theirs),
            "--resilience",
            "datashift-journal",
        ],
        &key,
        &data,
        "cryptsetup --decrypt --init-only --resilience datashift-journal",
    );
    assert_eq!(resilience_of(&theirs).as_deref(), Some("datashift-journal"));
    ok(
        sc(&decrypt_args(&data, &theirs, &key, &[])),
        "finishing cryptsetup's datashift-journal decryption",
    );
    assert!(std::fs::read(&data).unwrap()[..kept] == plain[..kept]);

    // Paused by SIGINT after its first step (the data behind the 1 MiB first chunk moved):
    // cryptsetup 2.6.1 itself cannot resume this state ("Failed to write reencryption
    // resilience metadata": it sizes the last chunk as the whole data, not the moved chunk);
    // sectorcrypt finishes it.
    let paused = dir.join("paused.hdr");
    let pause_cryptsetup = |n: u64| {
        std::fs::write(&data, &encrypted).unwrap();
        let _ = std::fs::remove_file(&paused);
        let mut init = with_fast_pbkdf(&["reencrypt", "--decrypt", "--init-only"]);
        init.extend_from_slice(&["--header", p(&paused), "--hotzone-size", "1M"]);
        init.extend_from_slice(&["--resilience", "datashift-journal"]);
        init.extend_from_slice(&["--force-offline-reencrypt", "--batch-mode"]);
        init.extend_from_slice(&["--key-file", p(&key), p(&data)]);
        ok(cs(&init), "cryptsetup --init-only");
        let mut cmd = Command::new("cryptsetup");
        cmd.args(["reencrypt", "--resume-only", "--header", p(&paused)]);
        cmd.args(["--force-offline-reencrypt", "--batch-mode"]);
        cmd.args(["--key-file", p(&key), p(&data)]);
        fault::signal_at(&cmd, "write", n, "INT");
        cryptsetup_json(&paused)["segments"]["1"]["type"] == "linear"
    };
    assert!(
        (2..12).any(pause_cryptsetup),
        "SIGINT never paused cryptsetup after its first step"
    );
    // Ours, paused the same way, records the same segments and resilience.
    let ours = dir.join("ours.hdr");
    let args = decrypt_args(
        &data,
        &ours,
        &key,
        &[
            "--resilience",
            "datashift-journal",
            "--hotzone-size",
            "1048576",
        ],
    );
    let theirs_paused = cryptsetup_json(&paused);
    let theirs_data = std::fs::read(&data).unwrap();
    std::fs::write(&data, &encrypted).unwrap();
    let writes = writes_of(&args, &[&data, &ours]);
    let stopped = (1..8).any(|i| {
        std::fs::write(&data, &encrypted).unwrap();
        let _ = std::fs::remove_file(&ours);
        let out = signalled_at(&args, writes * i / 8, "INT");
        !out.status.success() && cryptsetup_json(&ours)["segments"]["1"]["type"] == "linear"
    });
    assert!(
        stopped,
        "SIGINT never paused our decryption after its first step"
    );
    // The same segments (cryptsetup renumbers the backup segments after a step; their flags
    // name them).
    let segments = |md: &serde_json::Value| {
        let mut all: Vec<String> = md["segments"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.to_string())
            .collect();
        all.sort();
        all
    };
    assert_eq!(segments(&cryptsetup_json(&ours)), segments(&theirs_paused));
    assert_eq!(resilience_of(&ours).as_deref(), Some("datashift-journal"));
    ok(
        sc(&decrypt_args(&data, &ours, &key, &["--resume-only"])),
        "resuming our paused decryption",
    );
    assert!(std::fs::read(&data).unwrap()[..kept] == plain[..kept]);
    std::fs::write(&data, &theirs_data).unwrap();
    ok(
        sc(&decrypt_args(&data, &paused, &key, &["--resume-only"])),
        "finishing cryptsetup's paused decryption",
    );
    assert!(std::fs::read(&data).unwrap()[..kept] == plain[..kept]);

    // 20 MiB of data: the moved chunk (16 MiB, the shift) does not fit the area; both refuse,
    // unchanged.
    let (data, _, before) = volume(20 * MIB, 53);
    let refused = dir.join("refused.hdr");
    let mut theirs_args = vec!["reencrypt", "--decrypt", "--init-only", "--header"];
    theirs_args.extend_from_slice(&[p(&refused), "--resilience", "datashift-journal"]);
    theirs_args.extend_from_slice(&["--force-offline-reencrypt", "--batch-mode"]);
    theirs_args.extend_from_slice(&["--key-file", p(&key), p(&data)]);
    assert_eq!(cs(&theirs_args).status.code(), Some(1));
    let _ = std::fs::remove_file(&refused);
    let out = sc(&decrypt_args(
        &data,
        &refused,
        &key,
        &["--resilience", "datashift-journal"],
    ));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&data).unwrap() == before,
        "a refused decrypt wrote"
    );
    assert!(!refused.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
