//! The command line as a user and a script see it: output shapes, backend forcing, exit codes.

use std::process::{Command, Output};

use serde_json::Value;

/// sectorcrypt with `args`, its backend chosen by itself (unless the caller sets one).
fn sectorcrypt_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sectorcrypt"));
    cmd.args(args).env_remove("SECTORCRYPT_BACKEND");
    cmd
}

fn sectorcrypt(args: &[&str]) -> Output {
    sectorcrypt_cmd(args).output().expect("run sectorcrypt")
}

fn json_lines(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// A failure prints exactly one line on stderr and exits with `code`.
fn assert_fails(args: &[&str], code: i32, mentions: &str) {
    let out = sectorcrypt(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: stderr {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {err}"
    );
    assert!(
        err.contains(mentions),
        "{args:?}: {err:?} does not mention {mentions:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn json_lines_have_the_documented_fields() {
    let out = sectorcrypt(&[
        "benchmark",
        "--json",
        "--seconds",
        "0.05",
        "-c",
        "aes-xts-plain64",
        "-s",
        "512",
        "-s",
        "256",
        "--sector-size",
        "512",
        "--sector-size",
        "4096",
        "--request-size",
        "65536",
    ]);
    let lines = json_lines(&out);
    assert_eq!(
        lines.len(),
        2 * 2 * 2,
        "key sizes x sector sizes x directions"
    );
    let aes_backends = ["vaes512", "vaes256", "aesni", "portable"];
    for l in &lines {
        assert_eq!(l["cipher"], "aes-xts-plain64");
        assert!(l["key_bits"] == 512 || l["key_bits"] == 256);
        assert!(l["sector_size"] == 512 || l["sector_size"] == 4096);
        assert_eq!(l["request_size"], 65536);
        assert_eq!(l["threads"], 1);
        assert!(l["op"] == "encrypt" || l["op"] == "decrypt");
        assert!(
            aes_backends.contains(&l["backend"].as_str().unwrap()),
            "{l}"
        );
        assert!(l["bytes_per_sec"].as_f64().unwrap() > 0.0);
        assert!(l["cycles_per_byte"].as_f64().unwrap() > 0.0);
        let steal = l["steal_max"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&steal), "{l}");
    }
}

#[test]
fn backend_can_be_forced_by_flag_or_environment() {
    // A short JSON benchmark of `cipher` with `extra` options.
    let quick = |cipher: &str, extra: &[&str]| {
        sectorcrypt_cmd(
            &[
                &["benchmark", "--json", "--seconds", "0.02", "-c", cipher][..],
                extra,
            ]
            .concat(),
        )
    };
    let out = quick("lea-xts-plain64", &["--backend", "portable"])
        .output()
        .unwrap();
    for l in json_lines(&out) {
        assert_eq!(l["backend"], "portable");
        assert_eq!(l["key_bits"], 512);
    }
    let out = quick("aes-cbc-essiv:sha256", &[])
        .env("SECTORCRYPT_BACKEND", "portable")
        .output()
        .unwrap();
    for l in json_lines(&out) {
        assert_eq!(l["backend"], "portable");
        assert_eq!(l["key_bits"], 256);
    }
    let out = quick("cipher_null-ecb", &[]).output().unwrap();
    for l in json_lines(&out) {
        assert_eq!(l["backend"], "null");
    }
}

#[test]
fn default_table_lists_every_row() {
    let out = sectorcrypt(&["benchmark", "--seconds", "0.02"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 13, "{text}");
    for want in [
        "aes-cbc-essiv:sha256",
        "aes-xts-plain64",
        "serpent-cbc-essiv:sha256",
        "serpent-xts-plain64",
        "twofish-cbc-essiv:sha256",
        "twofish-xts-plain64",
        "lea-xts-plain64",
        "lea-cbc-essiv:sha256",
        "cipher_null-ecb",
    ] {
        assert!(
            rows.iter().any(|r| r.contains(want)),
            "{want} missing in {text}"
        );
    }
    assert!(
        rows.iter().all(|r| r.matches("MiB/s").count() == 2),
        "{text}"
    );
}

#[test]
fn breakdown_reports_every_phase() {
    let out = sectorcrypt(&[
        "benchmark",
        "--breakdown",
        "--json",
        "-c",
        "aes-xts-plain64",
    ]);
    let rows = json_lines(&out);
    assert_eq!(
        rows.len(),
        4,
        "512 and 4096-byte requests, encrypt and decrypt"
    );
    for r in &rows {
        let total = r["total_s"].as_f64().unwrap();
        let parts: f64 = ["tweak_s", "xor1_s", "ecb_s", "xor2_s", "other_s"]
            .iter()
            .map(|k| r[*k].as_f64().unwrap())
            .sum();
        assert!(total > 0.0);
        assert!((parts - total).abs() <= total * 1e-6 + 1e-9, "{r}");
        assert!(r["fused_s"].as_f64().unwrap() > 0.0);
        assert_eq!(r["total_bytes"], 49_999_872);
    }
    let text =
        String::from_utf8(sectorcrypt(&["benchmark", "--breakdown", "-c", "lea"]).stdout).unwrap();
    for want in [
        "Tweak computation time",
        "First XOR time",
        "Second XOR time",
        "ECB encryption time",
        "ECB decryption time",
        "Other time",
        "Total time",
    ] {
        assert!(text.contains(want), "{want} missing in {text}");
    }
}

#[test]
fn tcrypt_covers_every_mode_and_key_size() {
    let rows = json_lines(&sectorcrypt(&[
        "benchmark",
        "--tcrypt",
        "--json",
        "-c",
        "lea",
    ]));
    assert_eq!(rows.len(), 12);
    for mode in ["ecb", "cbc", "ctr", "xts"] {
        assert_eq!(
            rows.iter().filter(|r| r["mode"] == mode).count(),
            3,
            "{mode}"
        );
    }
    for r in &rows {
        assert_eq!(r["cipher"], "lea");
        assert!(
            r["encrypt_cycles"].as_f64().unwrap() > 0.0
                && r["decrypt_cycles"].as_f64().unwrap() > 0.0
        );
    }
    let text =
        String::from_utf8(sectorcrypt(&["benchmark", "--tcrypt", "-c", "aes"]).stdout).unwrap();
    assert!(text.contains("xts 512-bit key"), "{text}");
}

#[test]
fn bad_input_exits_1_with_one_line() {
    // Bad command lines, each with a word its one-line error must mention.
    let cases: &[(&[&str], &str)] = &[
        (&["benchmark", "-c", "aes-xts-plain65"], "aes-xts-plain65"),
        (
            &["benchmark", "-c", "blowfish-xts-plain64"],
            "unknown cipher",
        ),
        (
            &["benchmark", "-c", "aes-xts-plain64", "-s", "128"],
            "128-bit key",
        ),
        (&["benchmark", "-c", "aes-xts-plain64", "-s", "100"], "100"),
        (&["benchmark", "--sector-size", "768"], "768"),
        (
            &["benchmark", "-c", "aes-xts-plain64", "--sector-size", "0"],
            "sector size 0",
        ),
        (
            &["benchmark", "-c", "aes-xts-plain64", "--request-size", "0"],
            "request size 0",
        ),
        (&["benchmark", "--breakdown", "--request-size", "0"], "0"),
        (
            &[
                "benchmark",
                "-c",
                "aes-xts-plain64",
                "--request-size",
                "1000",
            ],
            "1000",
        ),
        (&["benchmark", "--backend", "avx1024"], "avx1024"),
        (
            &["benchmark", "-c", "lea-xts-plain64", "--backend", "aesni"],
            "aesni",
        ),
        (&["benchmark", "--seconds", "0"], "--seconds"),
        (&["benchmark", "--threads", "0"], "--threads"),
        (&["benchmark", "--no-such-flag"], "--no-such-flag"),
        (&["frobnicate"], "frobnicate"),
        (&["benchmark", "--breakdown", "-s", "128"], "128"),
        (&["benchmark", "--breakdown", "--tcrypt"], "--tcrypt"),
    ];
    for (args, mentions) in cases {
        assert_fails(args, 1, mentions);
    }
    let help = sectorcrypt(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("benchmark"));
}

/// `benchmark --device`: the same requests on the ciphertext and through the encryption, as
/// JSON lines; a read benchmark changes nothing; a write benchmark leaves zeros where it wrote
/// (Python's `cryptography` decrypts them); a wrong passphrase changes nothing (exit 2).
#[test]
fn benchmark_device_times_a_volume_against_its_ciphertext() {
    use crate::common::{our_volume_key, p, sc, sc_fast, scratch};
    let dir = scratch("benchmark-device");
    let img = dir.join("vol.img");
    std::fs::write(&img, vec![0u8; (16 + 8) << 20]).unwrap();
    let key = crate::common::key(&dir, "bench");
    let out = sc_fast(&["format", "-q", "--key-file", p(&key), p(&img)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = std::fs::read(&img).unwrap();

    let reads = json_lines(&sc(&[
        "benchmark",
        "--device",
        p(&img),
        "--key-file",
        p(&key),
        "--io-size",
        "64K",
        "--io-total",
        "4M",
        "--io-pattern",
        "rand",
        "--json",
    ]));
    assert_eq!(reads.len(), 2);
    for (r, path) in reads.iter().zip(["raw", "volume"]) {
        assert_eq!(r["path"], path);
        assert_eq!(r["io_type"], "read");
        assert_eq!(r["pattern"], "rand");
        assert_eq!(
            (r["ops"].as_u64(), r["bytes"].as_u64()),
            (Some(64), Some(4 << 20))
        );
        assert!(r["bytes_per_sec"].as_f64().unwrap() > 0.0);
        assert_eq!(r["cipher"], "aes-xts-plain64");
    }
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a read benchmark wrote"
    );

    let wrong = crate::common::key(&dir, "wrong");
    let out = sc(&[
        "benchmark",
        "--device",
        p(&img),
        "--key-file",
        p(&wrong),
        "--io-type",
        "write",
        "-q",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused benchmark wrote"
    );

    let text = sc(&[
        "benchmark",
        "--device",
        p(&img),
        "--key-file",
        p(&key),
        "--io-type",
        "write",
        "-q",
        "--io-size",
        "128K",
        "--io-total",
        "1M",
        "--io-threads",
        "3",
    ]);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("seq write, 128KiB requests, 3 in flight, 1MiB each way"),
        "{text}"
    );
    assert!(
        text.contains("raw (ciphertext)") && text.contains("the raw bandwidth"),
        "{text}"
    );
    let dump: Value = serde_json::from_slice(&sc(&["dump", "--json", p(&img)]).stdout).unwrap();
    let segment = &dump["segments"]["0"];
    let offset = segment["offset"].as_str().unwrap().parse().unwrap();
    let sector = segment["sector_size"].as_u64().unwrap();
    let vk = our_volume_key(&img, &key);
    let plain = crate::nbd::python_decrypt(&dir, &img, offset, sector, &vk, 0, 2 << 20);
    assert!(
        plain[..1 << 20].iter().all(|&b| b == 0),
        "the written MiB is zeros"
    );
    assert!(
        plain[1 << 20..].iter().any(|&b| b != 0),
        "the next MiB was not written"
    );

    assert_fails(
        &[
            "benchmark",
            "--device",
            p(&img),
            "--key-file",
            p(&key),
            "--io-size",
            "1000",
        ],
        1,
        "1000",
    );
    assert_fails(&["benchmark", "--key-file", p(&key)], 1, "--device");
    std::fs::remove_dir_all(&dir).unwrap();
}
