//! Every record of the shared vector files, on every backend this machine runs.

mod common;

use std::collections::BTreeMap;

use sectorcrypt_cipher::modes::{self, Xts};
use sectorcrypt_cipher::{block_cipher, Algorithm, BackendChoice, BlockEngine, Direction};

fn iv16(iv: &[u8]) -> [u8; 16] {
    iv.try_into().expect("16-byte IV")
}

fn check_xts(alg: Algorithm, file: &str, expected_records: usize) {
    let records = common::load(file);
    assert_eq!(
        records.len(),
        expected_records,
        "{file}: record count changed"
    );
    let backends = alg.available_backends();
    assert!(!backends.is_empty());
    for backend in backends {
        for r in &records {
            let xts = Xts::new(alg, &r.key, BackendChoice::Exact(backend)).unwrap();
            assert_eq!(xts.backend(), backend);
            let mut buf = r.plaintext.clone();
            xts.encrypt_unit(&mut buf, &iv16(&r.iv)).unwrap();
            assert_eq!(
                hex::encode(&buf),
                hex::encode(&r.ciphertext),
                "{backend} encrypt: {}",
                r.comment
            );
            xts.decrypt_unit(&mut buf, &iv16(&r.iv)).unwrap();
            assert_eq!(buf, r.plaintext, "{backend} decrypt: {}", r.comment);
        }
    }
}

#[test]
fn xts_aes_ieee1619_all_records_all_backends() {
    check_xts(Algorithm::Aes, "xts-ieee1619.txt", 19);
}

#[test]
fn xts_lea_all_records_all_backends() {
    check_xts(Algorithm::Lea, "xts-lea.txt", 12);
}

/// Runs `mode` (the last part of a record's `Name:`, e.g. `LEA-128/CBC`) over `buf` in place.
fn run_mode(mode: &str, engine: &dyn BlockEngine, iv: &[u8], buf: &mut [u8], dir: Direction) {
    match mode {
        "ECB" => {
            assert!(iv.is_empty(), "ECB record with an IV");
            modes::ecb(engine, buf, dir).unwrap()
        }
        "CBC" => modes::cbc(engine, &iv16(iv), buf, dir).unwrap(),
        // CTR is its own inverse.
        "CTR" => modes::ctr(engine, &iv16(iv), buf),
        other => panic!("unexpected mode {other}"),
    }
}

/// Every record of a block-cipher vector file (`Name: <cipher>/ECB`, `/CBC` or `/CTR`) on every
/// backend of `alg` this machine runs: encryption gives the ciphertext and decryption the
/// plaintext back. The file must hold exactly `expected_records` records, and `expected_counts`
/// lists how many of them there are per (mode, key bits). Failures are collected so that one run
/// names every failing record.
fn check_block_modes(
    alg: Algorithm,
    file: &str,
    expected_records: usize,
    expected_counts: &[(&str, usize, usize)],
) {
    let records = common::load(file);
    assert_eq!(
        records.len(),
        expected_records,
        "{file}: record count changed"
    );
    // `Name: LEA-128/...` names the 128-bit block; the key size varies within a section.
    let mode_of = |name: &str| name.rsplit('/').next().unwrap().to_string();
    let mut counts = BTreeMap::new();
    for r in &records {
        *counts
            .entry((mode_of(&r.name), r.key.len() * 8))
            .or_insert(0) += 1;
    }
    let expected: BTreeMap<_, _> = expected_counts
        .iter()
        .map(|&(mode, bits, n)| ((mode.to_string(), bits), n))
        .collect();
    assert_eq!(counts, expected, "{file}: records per (mode, key bits)");

    let backends = alg.available_backends();
    assert!(!backends.is_empty());
    let mut failures = Vec::new();
    for backend in backends {
        for (i, r) in records.iter().enumerate() {
            let mode = mode_of(&r.name);
            let what = format!(
                "{file} record {} ({}, {}) on {backend}",
                i + 1,
                r.name,
                r.comment
            );
            let engine = block_cipher(alg, &r.key, BackendChoice::Exact(backend)).unwrap();
            assert_eq!(engine.backend(), backend);
            let mut buf = r.plaintext.clone();
            run_mode(&mode, engine.as_ref(), &r.iv, &mut buf, Direction::Encrypt);
            if buf != r.ciphertext {
                failures.push(format!(
                    "{what}: encrypt gave {}, expected {}",
                    hex::encode(&buf),
                    hex::encode(&r.ciphertext)
                ));
            }
            let mut buf = r.ciphertext.clone();
            run_mode(&mode, engine.as_ref(), &r.iv, &mut buf, Direction::Decrypt);
            if buf != r.plaintext {
                failures.push(format!(
                    "{what}: decrypt gave {}, expected {}",
                    hex::encode(&buf),
                    hex::encode(&r.plaintext)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The nine combinations of ECB, CBC and CTR with 128, 192 and 256-bit keys, `n` records each.
fn three_modes_three_keys(n: [usize; 9]) -> [(&'static str, usize, usize); 9] {
    let mut out = [("", 0, 0); 9];
    for (i, mode) in ["ECB", "CBC", "CTR"].into_iter().enumerate() {
        for (j, bits) in [128, 192, 256].into_iter().enumerate() {
            out[3 * i + j] = (mode, bits, n[3 * i + j]);
        }
    }
    out
}

#[test]
fn lea_kisa_ecb_cbc_ctr_all_records_all_backends() {
    check_block_modes(
        Algorithm::Lea,
        "lea-kisa.txt",
        90,
        &three_modes_three_keys([10; 9]),
    );
}

#[test]
fn aria_ecb_cbc_ctr_all_records_all_backends() {
    // ECB: the ARIA specification's 80-byte message and RFC 5794 A.1-A.3 for each key size.
    check_block_modes(
        Algorithm::Aria,
        "aria.txt",
        12,
        &three_modes_three_keys([2, 2, 2, 1, 1, 1, 1, 1, 1]),
    );
}

#[test]
fn sm4_ecb_cbc_all_records_all_backends() {
    check_block_modes(
        Algorithm::Sm4,
        "sm4.txt",
        51,
        &[("ECB", 128, 21), ("CBC", 128, 30)],
    );
}

#[test]
fn camellia_rfc3713_nessie_all_records_all_backends() {
    check_block_modes(
        Algorithm::Camellia,
        "camellia.txt",
        99,
        &[("ECB", 128, 29), ("ECB", 192, 33), ("ECB", 256, 37)],
    );
}

#[test]
fn serpent_all_records_all_backends() {
    check_block_modes(
        Algorithm::Serpent,
        "serpent.txt",
        12,
        &[("ECB", 128, 5), ("ECB", 192, 4), ("ECB", 256, 3)],
    );
}

#[test]
fn twofish_all_records_all_backends() {
    check_block_modes(
        Algorithm::Twofish,
        "twofish.txt",
        9,
        &[("ECB", 128, 4), ("ECB", 192, 3), ("ECB", 256, 2)],
    );
}

#[test]
fn cast6_rfc2612_all_records_all_backends() {
    check_block_modes(
        Algorithm::Cast6,
        "cast6.txt",
        3,
        &[("ECB", 128, 1), ("ECB", 192, 1), ("ECB", 256, 1)],
    );
}

/// FIPS-197 Appendix C, through the public ECB entry point, on every AES backend.
#[test]
fn aes_fips197_all_backends() {
    let pt = hex::decode("00112233445566778899aabbccddeeff").unwrap();
    let cases = [
        (
            "000102030405060708090a0b0c0d0e0f",
            "69c4e0d86a7b0430d8cdb78070b4c55a",
        ),
        (
            "000102030405060708090a0b0c0d0e0f1011121314151617",
            "dda97ca4864cdfe06eaf70a0ec0d7191",
        ),
        (
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
            "8ea2b7ca516745bfeafc49904b496089",
        ),
    ];
    for backend in Algorithm::Aes.available_backends() {
        for (key, ct) in cases {
            let e = block_cipher(
                Algorithm::Aes,
                &hex::decode(key).unwrap(),
                BackendChoice::Exact(backend),
            )
            .unwrap();
            let mut buf = pt.clone();
            e.encrypt_ecb(&mut buf);
            assert_eq!(hex::encode(&buf), ct, "{backend}");
            e.decrypt_ecb(&mut buf);
            assert_eq!(buf, pt, "{backend}");
        }
    }
}

/// LRW-AES, the IEEE P1619 LRW-32-AES vectors and the kernel's wrap-around and 512-byte-sector
/// records, through the public single-unit entry point on every AES backend.
#[test]
fn lrw_aes_all_records_all_backends() {
    use sectorcrypt_cipher::lrw::Lrw;
    let records = common::load("lrw-aes.txt");
    assert_eq!(records.len(), 9, "lrw-aes.txt: record count changed");
    for backend in Algorithm::Aes.available_backends() {
        for r in &records {
            let lrw = Lrw::new(Algorithm::Aes, &r.key, BackendChoice::Exact(backend)).unwrap();
            let mut buf = r.plaintext.clone();
            lrw.unit(&mut buf, &iv16(&r.iv), Direction::Encrypt)
                .unwrap();
            assert_eq!(
                hex::encode(&buf),
                hex::encode(&r.ciphertext),
                "{backend}: {}",
                r.comment
            );
            lrw.unit(&mut buf, &iv16(&r.iv), Direction::Decrypt)
                .unwrap();
            assert_eq!(buf, r.plaintext, "{backend} decrypt: {}", r.comment);
        }
    }
}
