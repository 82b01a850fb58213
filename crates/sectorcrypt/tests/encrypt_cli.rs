//! `sectorcrypt encrypt`, `decrypt` (in place: detached header, or header on the device with the
//! data shifted) and `reencrypt` (new volume key, cipher or sector size; header anywhere) with the
//! real cryptsetup: what we encrypt, cryptsetup decrypts back to the original and the other way
//! round; runs killed with SIGKILL at random moments and resumed lose nothing; SIGINT pauses at a
//! safe point; bad input changes nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cs, ok, p, sc, scratch};
use rand::{Rng, RngCore, SeedableRng};

const FAST: [&str; 5] = [
    "--pbkdf",
    "pbkdf2",
    "--pbkdf-force-iterations",
    "1000",
    "-q",
];

/// A scratch directory, a passphrase file in it, and the path of a data image there.
fn workspace(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = scratch(name);
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let data = dir.join("data.img");
    (dir, key, data)
}

fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    std::fs::write(path, &v).unwrap();
    v
}

/// cryptsetup decrypts DATA in place with header HDR; DATA must then equal `plain`.
fn cryptsetup_decrypts_to(hdr: &Path, data: &Path, key: &Path, plain: &[u8]) {
    ok(
        cs(&[
            "reencrypt",
            "--decrypt",
            "--force-offline-reencrypt",
            "--header",
            p(hdr),
            "--batch-mode",
            "--key-file",
            p(key),
            p(data),
        ]),
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

/// Start `sectorcrypt encrypt` (or `--resume-only`) and, once the header shows progress, wait a
/// random moment and send `signal`. Returns the exit status.
fn signalled(
    args: &[&str],
    hdr: &Path,
    signal: &str,
    rng: &mut impl Rng,
) -> std::process::ExitStatus {
    signalled_after(args, Some(hdr), signal, rng)
}

/// As [`signalled`], counting the random moment from the start when `hdr` is `None` (to hit
/// the writes that come before any header records progress).
fn signalled_after(
    args: &[&str],
    hdr: Option<&Path>,
    signal: &str,
    rng: &mut impl Rng,
) -> std::process::ExitStatus {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sectorcrypt"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut sent = false;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        let progressed = hdr.is_none_or(|hdr| {
            std::fs::metadata(hdr).is_ok()
                && cs(&["luksDump", "--dump-json-metadata", p(hdr)])
                    .status
                    .success()
        });
        if progressed && !sent {
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..400)));
            let _ = Command::new("kill")
                .args(["-s", signal, &child.id().to_string()])
                .status();
            sent = true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait().unwrap()
}

/// The test: a real 512 MiB encryption killed with SIGKILL at random moments, then run
/// again until done: cryptsetup decrypts the result to the original.
#[test]
fn sigkill_at_random_moments_then_resume_loses_nothing() {
    let (dir, key, data) = workspace("encrypt_cli-sigkill");
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, 512 << 20, 2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let small_steps = ["--hotzone-size", "16777216"];
    let first = encrypt_args(&data, &hdr, &key, &small_steps);
    let status = signalled(&first, &hdr, "KILL", &mut rng);
    let mut kills = u32::from(!status.success());
    let mut resume = encrypt_args(&data, &hdr, &key, &small_steps);
    resume.push("--resume-only");
    for _ in 0..3 {
        let status = signalled(&resume, &hdr, "KILL", &mut rng);
        if status.success() {
            break;
        }
        kills += 1;
    }
    eprintln!("sigkill: {kills} runs killed before the last one");
    assert!(kills >= 1, "no run was killed part way");
    // Finish whatever is left.
    let last = sc(&resume);
    if !last.status.success() {
        let err = String::from_utf8_lossy(&last.stderr);
        assert!(
            err.contains("no encryption in progress"),
            "resume failed: {err}"
        );
    }
    cryptsetup_decrypts_to(&hdr, &data, &key, &plain);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sigint_pauses_at_a_safe_point_and_resume_finishes() {
    let (dir, key, data) = workspace("encrypt_cli-sigint");
    let hdr = dir.join("hdr.img");
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut interrupted = false;
    // A run may finish before the signal lands; then try again from the start.
    for attempt in 0..5 {
        let _ = std::fs::remove_file(&hdr);
        let plain = random_file(&data, 256 << 20, 3 + attempt);
        let args = encrypt_args(&data, &hdr, &key, &["--hotzone-size", "4194304"]);
        let status = signalled(&args, &hdr, "INT", &mut rng);
        if status.success() {
            continue;
        }
        assert_eq!(status.code(), Some(1), "an interrupted run exits 1");
        let json = ok(
            cs(&["luksDump", "--dump-json-metadata", p(&hdr)]),
            "luksDump",
        )
        .stdout;
        let md: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let segments = md["segments"].to_string();
        assert!(
            segments.contains("backup-final") && !segments.contains("in-reencryption"),
            "a SIGINT must leave a clean, resumable state: {segments}"
        );
        // Serving the half-converted volume read-only is refused with the command that
        // finishes it; read-write, serving finishes it first (and a second attempt at
        // resuming finds nothing to do).
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
        let mut readonly = serve.clone();
        readonly.push("--readonly");
        let refused = sc(&readonly);
        assert_eq!(refused.status.code(), Some(1));
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            err.contains("encrypt") && err.contains("--resume-only"),
            "{err}"
        );
        serve.extend_from_slice(&["--threads", "2"]);
        let mut server = Command::new(env!("CARGO_BIN_EXE_sectorcrypt"))
            .args(&serve)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !sock.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            sock.exists(),
            "serve did not finish the encryption and listen"
        );
        let _ = Command::new("kill")
            .args(["-s", "TERM", &server.id().to_string()])
            .status();
        assert!(server.wait().unwrap().success(), "serve after finishing");
        let mut resume = args.clone();
        resume.push("--resume-only");
        assert_eq!(sc(&resume).status.code(), Some(1), "nothing left to resume");
        cryptsetup_decrypts_to(&hdr, &data, &key, &plain);
        interrupted = true;
        break;
    }
    assert!(interrupted, "no run was interrupted by SIGINT");
    std::fs::remove_dir_all(&dir).unwrap();
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
            &["--cipher", "twofish-xts-plain64"]
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
    ok(
        cs(&[
            "reencrypt",
            "--encrypt",
            "--type",
            "luks2",
            "--header",
            p(&hdr),
            "--force-offline-reencrypt",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--batch-mode",
            "--key-file",
            p(&key),
            p(&data),
        ]),
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

#[test]
fn decryption_killed_at_random_moments_then_resumed_loses_nothing() {
    let (dir, key, data) = workspace("encrypt_cli-decrypt-kill");
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, 256 << 20, 12);
    ok(sc(&encrypt_args(&data, &hdr, &key, &[])), "encrypt");
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let steps = ["--hotzone-size", "8388608"];
    let mut kills = 0;
    for _ in 0..4 {
        let status = signalled(
            &decrypt_args(&data, &hdr, &key, &steps),
            &hdr,
            "KILL",
            &mut rng,
        );
        if status.success() {
            break;
        }
        kills += 1;
    }
    eprintln!("decrypt sigkill: {kills} runs killed");
    assert!(kills >= 1, "no decryption was killed part way");
    let last = sc(&decrypt_args(&data, &hdr, &key, &steps));
    if !last.status.success() {
        let err = String::from_utf8_lossy(&last.stderr);
        assert!(err.contains("not encrypted"), "resume failed: {err}");
    }
    assert!(
        std::fs::read(&data).unwrap() == plain,
        "not the original after kills and resume"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The volume key cryptsetup reads from `img` (or its detached header).
fn cryptsetup_key(img: &Path, key: &Path) -> Vec<u8> {
    let hex = common::cryptsetup_volume_key(img, key);
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
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

#[test]
fn reencrypt_rotates_the_key_of_an_attached_header_volume_even_when_killed() {
    let dir = scratch("encrypt_cli-reencrypt");
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let vk_file = dir.join("vk");
    let old = {
        let mut v = vec![0u8; 64];
        rand::rngs::StdRng::seed_from_u64(21).fill_bytes(&mut v);
        v
    };
    std::fs::write(&vk_file, &old).unwrap();
    let img = dir.join("img");
    let payload = 128usize << 20;
    std::fs::write(&img, vec![0u8; (16 << 20) + payload]).unwrap();
    ok(
        cs(&[
            "luksFormat",
            "--type",
            "luks2",
            "--sector-size",
            "512",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--volume-key-file",
            p(&vk_file),
            "--batch-mode",
            "--key-file",
            p(&key),
            p(&img),
        ]),
        "cryptsetup luksFormat",
    );
    let plain = {
        let mut v = vec![0u8; payload];
        rand::rngs::StdRng::seed_from_u64(22).fill_bytes(&mut v);
        v
    };
    let mut image = std::fs::read(&img).unwrap();
    image[16 << 20..].copy_from_slice(&xts(&old, 512, &plain));
    std::fs::write(&img, &image).unwrap();

    // Killed at random moments, resumed each time (the first run starts it).
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut args = vec![
        "reencrypt",
        p(&img),
        "--key-file",
        p(&key),
        "--hotzone-size",
        "8388608",
    ];
    args.extend_from_slice(&FAST);
    let mut kills = 0;
    for _ in 0..3 {
        if signalled(&args, &img, "KILL", &mut rng).success() {
            break;
        }
        kills += 1;
    }
    eprintln!("reencrypt sigkill: {kills} runs killed");
    let state = ok(
        cs(&["luksDump", "--dump-json-metadata", p(&img)]),
        "luksDump",
    )
    .stdout;
    if String::from_utf8_lossy(&state).contains("online-reencrypt") {
        ok(sc(&args), "reencrypt (resume)");
    }
    // The passphrase opens the new key in cryptsetup, and that key decrypts the payload.
    let new = cryptsetup_key(&img, &key);
    assert_ne!(new, old, "the volume key did not change");
    let sector = {
        let json = ok(
            cs(&["luksDump", "--dump-json-metadata", p(&img)]),
            "luksDump",
        )
        .stdout;
        let md: serde_json::Value = serde_json::from_slice(&json).unwrap();
        md["segments"]["0"]["sector_size"].as_u64().unwrap() as usize
    };
    let stored = std::fs::read(&img).unwrap()[16 << 20..].to_vec();
    assert!(
        stored == xts(&new, sector, &plain),
        "the payload is not the plaintext under the new key"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn encrypt_reencrypt_decrypt_comes_back_to_the_original() {
    let (dir, key, data) = workspace("encrypt_cli-cycle");
    let hdr = dir.join("hdr.img");
    let plain = random_file(&data, 32 << 20, 31);
    ok(sc(&encrypt_args(&data, &hdr, &key, &[])), "encrypt");
    let first = cryptsetup_key(&hdr, &key);
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
    bad.extend_from_slice(&["--cipher", "twofish-xts-plain64"]);
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
    let second = cryptsetup_key(&hdr, &key);
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

/// `sectorcrypt decrypt DEVICE --header NEWFILE` as a list of arguments.
fn decrypt_export_args<'a>(data: &'a Path, hdr: &'a Path, key: &'a Path) -> Vec<&'a str> {
    vec![
        "decrypt",
        p(data),
        "--header",
        p(hdr),
        "--key-file",
        p(key),
        "-q",
    ]
}

/// The interop test: a file encrypted in place by cryptsetup with
/// `--reduce-device-size` (header on the device, data shifted) is decrypted in place here, the
/// header exported to a new file, back to the original at offset 0.
#[test]
fn decrypts_in_place_what_cryptsetup_encrypted_with_reduce_device_size() {
    let (dir, key, data) = workspace("encrypt_cli-shift-theirs");
    let plain = random_file(&data, 96 << 20, 41);
    let kept = 64 << 20; // 96 MiB less --reduce-device-size 32M
    ok(
        cs(&[
            "reencrypt",
            "--encrypt",
            "--type",
            "luks2",
            "--reduce-device-size",
            "32M",
            "--force-offline-reencrypt",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--batch-mode",
            "--key-file",
            p(&key),
            p(&data),
        ]),
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
        sc(&decrypt_export_args(&data, &hdr, &wrong)).status.code(),
        Some(2)
    );
    assert!(
        std::fs::read(&data).unwrap() == encrypted,
        "a refused decrypt wrote"
    );
    assert!(!hdr.exists() && !dir.join("exported.hdr.partial").exists());

    ok(
        sc(&decrypt_export_args(&data, &hdr, &key)),
        "decrypt --header NEWFILE",
    );
    let now = std::fs::read(&data).unwrap();
    assert!(now[..kept] == plain[..kept], "not the original at offset 0");
    assert!(!dir.join("exported.hdr.partial").exists());
    // The exported header is spent: no keyslots, plaintext segment, no requirement.
    let json = ok(
        cs(&["luksDump", "--dump-json-metadata", p(&hdr)]),
        "luksDump",
    )
    .stdout;
    let md: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(md["keyslots"], serde_json::json!({}));
    assert_eq!(md["segments"]["0"]["type"], "linear");
    assert!(md["config"].get("requirements").is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A shifted encryption killed with SIGKILL at random moments and run again with the same
/// command each time; cryptsetup then opens it and decrypts it (exporting the header) back to
/// the original. Then the same for our shifted decryption of it, killed at random moments
/// too, some of them before the exported header is in place.
#[test]
fn shifted_encryption_and_decryption_killed_at_random_moments_lose_nothing() {
    let (dir, key, data) = workspace("encrypt_cli-shift-kill");
    let plain = random_file(&data, 512 << 20, 42);
    let kept = 504 << 20; // less --reduce-device-size 8M
    let mut args = vec![
        "encrypt",
        p(&data),
        "--reduce-device-size",
        "8M",
        "--key-file",
        p(&key),
    ];
    args.extend_from_slice(&FAST);
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    let mut kills = 0;
    for _ in 0..4 {
        if signalled(&args, &data, "KILL", &mut rng).success() {
            break;
        }
        kills += 1;
    }
    eprintln!("shifted encrypt sigkill: {kills} runs killed");
    assert!(kills >= 1, "no shifted encryption was killed part way");
    // Finish with the short form: the device's header says what to resume.
    let resume = ["encrypt", p(&data), "--key-file", p(&key), "--resume-only"];
    let json = ok(
        cs(&["luksDump", "--dump-json-metadata", p(&data)]),
        "luksDump",
    )
    .stdout;
    if String::from_utf8_lossy(&json).contains("online-reencrypt") {
        ok(sc(&resume), "encrypt --resume-only");
    }
    ok(
        cs(&["open", "--test-passphrase", "--key-file", p(&key), p(&data)]),
        "cryptsetup open --test-passphrase",
    );
    let encrypted = std::fs::read(&data).unwrap();

    // Our decryption of it, killed: twice from the start (the export, the move), then during
    // the steps.
    let hdr = dir.join("exported.hdr");
    let dec = decrypt_export_args(&data, &hdr, &key);
    let mut kills = 0;
    for round in 0..5 {
        let wait_for = (round >= 2).then_some(hdr.as_path());
        if signalled_after(&dec, wait_for, "KILL", &mut rng).success() {
            break;
        }
        kills += 1;
    }
    eprintln!("shifted decrypt sigkill: {kills} runs killed");
    assert!(kills >= 1, "no shifted decryption was killed part way");
    let last = sc(&dec);
    if !last.status.success() {
        let err = String::from_utf8_lossy(&last.stderr);
        assert!(err.contains("not encrypted"), "resume failed: {err}");
    }
    let now = std::fs::read(&data).unwrap();
    assert!(
        now[..kept] == plain[..kept],
        "not the original after kills and resume"
    );

    // And cryptsetup's decryption of the same encryption gives the same.
    std::fs::write(&data, &encrypted).unwrap();
    let hdr2 = dir.join("theirs.hdr");
    ok(
        cs(&[
            "reencrypt",
            "--decrypt",
            "--header",
            p(&hdr2),
            "--force-offline-reencrypt",
            "--batch-mode",
            "--key-file",
            p(&key),
            p(&data),
        ]),
        "cryptsetup reencrypt --decrypt --header NEWFILE",
    );
    assert!(std::fs::read(&data).unwrap()[..kept] == plain[..kept]);
    std::fs::remove_dir_all(&dir).unwrap();
}
