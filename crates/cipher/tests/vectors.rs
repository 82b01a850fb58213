//! Every record of the shared vector files, on every backend this machine runs.

mod common;

use sectorcrypt_cipher::modes::{self, Xts};
use sectorcrypt_cipher::{block_cipher, Algorithm, BackendChoice, Direction};

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

#[test]
fn lea_kisa_ecb_cbc_ctr_all_records_all_backends() {
    let records = common::load("lea-kisa.txt");
    assert_eq!(records.len(), 90);
    let mut seen = std::collections::BTreeMap::new();
    for backend in Algorithm::Lea.available_backends() {
        for r in &records {
            let mode = r.name.rsplit('/').next().unwrap();
            // `Name: LEA-128/...` names the 128-bit block; the key size varies within a section.
            let bits = r.key.len() * 8;
            let engine =
                block_cipher(Algorithm::Lea, &r.key, BackendChoice::Exact(backend)).unwrap();
            let mut buf = r.plaintext.clone();
            match mode {
                "ECB" => modes::ecb(engine.as_ref(), &mut buf, Direction::Encrypt).unwrap(),
                "CBC" => {
                    modes::cbc(engine.as_ref(), &iv16(&r.iv), &mut buf, Direction::Encrypt).unwrap()
                }
                "CTR" => modes::ctr(engine.as_ref(), &iv16(&r.iv), &mut buf),
                other => panic!("unexpected mode {other}"),
            }
            assert_eq!(
                hex::encode(&buf),
                hex::encode(&r.ciphertext),
                "{backend} {} {}",
                r.name,
                r.comment
            );
            match mode {
                "ECB" => modes::ecb(engine.as_ref(), &mut buf, Direction::Decrypt).unwrap(),
                "CBC" => {
                    modes::cbc(engine.as_ref(), &iv16(&r.iv), &mut buf, Direction::Decrypt).unwrap()
                }
                _ => modes::ctr(engine.as_ref(), &iv16(&r.iv), &mut buf),
            }
            assert_eq!(buf, r.plaintext, "{backend} {} decrypt", r.name);
            *seen.entry((mode, bits)).or_insert(0) += 1;
        }
    }
    // Every mode and key size is present (the file holds all nine combinations).
    assert_eq!(seen.len(), 9, "{seen:?}");
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
