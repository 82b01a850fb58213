//! Properties of the data path: the extended request equals sector-by-sector processing, every
//! backend produces the same bytes, decryption inverts encryption, threads change nothing, and
//! bad input is an error rather than a panic.

use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};
use sectorcrypt_cipher::modes::{self, Xts};
use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_cipher::staged::{PhaseTicks, StagedXts};
use sectorcrypt_cipher::{
    block_cipher, Algorithm, Backend, BackendChoice, Direction, Error, SectorCipher, SectorOptions,
};

const SPECS: [&str; 12] = [
    "aes-xts-plain64",
    "aes-xts-plain",
    "aes-xts-plain64be",
    "aes-cbc-essiv:sha256",
    "aes-cbc-plain64",
    "aes-ecb",
    "lea-xts-plain64",
    "lea-cbc-essiv:sha256",
    "lea-ecb",
    "twofish-xts-plain64",
    "twofish-cbc-essiv:sha256",
    "twofish-ecb",
];

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    v
}

fn cipher(spec: &str, key: &[u8], ss: usize, backend: Backend, threads: usize) -> SectorCipher {
    let opts = SectorOptions {
        sector_size: ss,
        backend: BackendChoice::Exact(backend),
        threads,
        ..Default::default()
    };
    SectorCipher::new(CipherSpec::parse(spec).unwrap(), key, &opts).unwrap()
}

fn key_sizes(spec: &CipherSpec) -> Vec<usize> {
    spec.key_bits_allowed().iter().map(|b| b / 8).collect()
}

/// One extended request over N sectors == N one-sector requests, for every spec, key size,
/// sector size and backend; and all backends agree with the portable one.
#[test]
fn extended_request_equals_sector_by_sector_on_every_backend() {
    let mut rng = StdRng::seed_from_u64(0x5ec7);
    for spec_name in SPECS {
        let spec = CipherSpec::parse(spec_name).unwrap();
        let alg = spec.algorithm().unwrap();
        for key_len in key_sizes(&spec) {
            for ss in [512, 1024, 2048, 4096] {
                let key = random_bytes(&mut rng, key_len);
                let sectors = rng.gen_range(1..=40);
                let first: u64 = if rng.gen_bool(0.3) {
                    rng.gen_range(1u64 << 32..1u64 << 40)
                } else {
                    rng.gen_range(0..1 << 20)
                };
                let plain = random_bytes(&mut rng, sectors * ss);
                let mut reference = None;
                for backend in alg.available_backends() {
                    let c = cipher(spec_name, &key, ss, backend, 1);
                    let mut whole = plain.clone();
                    c.encrypt(&mut whole, first).unwrap();
                    let mut pieces = plain.clone();
                    for (i, s) in pieces.chunks_mut(ss).enumerate() {
                        c.encrypt(s, first + i as u64).unwrap();
                    }
                    assert_eq!(whole, pieces, "{spec_name} {key_len} {ss} {backend}");
                    assert_ne!(whole, plain);
                    match &reference {
                        None => reference = Some(whole.clone()),
                        Some(r) => {
                            assert_eq!(&whole, r, "{spec_name} {backend} differs from portable")
                        }
                    }
                    c.decrypt(&mut whole, first).unwrap();
                    assert_eq!(whole, plain, "{spec_name} {backend} round trip");
                }
            }
        }
    }
}

/// Encryption and decryption from a source into a destination (bytes lent by the storage) equal
/// the same in place, for every spec, sector size and backend, whatever the destination held,
/// and leave the source as it was; sources of another length are an error.
#[test]
fn processing_from_a_source_equals_processing_in_place() {
    let mut rng = StdRng::seed_from_u64(0xf80);
    let specs = SPECS.iter().chain(&[
        "aes-lrw-benbi",
        "aes-cbc-lmk",
        "serpent-xts-plain64",
        "aes-cbc-eboiv",
    ]);
    let in_place = |c: &SectorCipher, buf: &mut [u8], first: u64, dir: Direction| {
        c.process(buf, first, dir).unwrap()
    };
    for spec_name in specs {
        let spec = CipherSpec::parse(spec_name).unwrap();
        let alg = spec.algorithm().unwrap();
        for ss in [512, 4096] {
            let ss = if *spec_name == "aes-cbc-lmk" { 512 } else { ss };
            let key = random_bytes(&mut rng, spec.default_key_bits() / 8);
            let sectors = rng.gen_range(1..=70);
            let first = rng.gen_range(0..1u64 << 40);
            let source = random_bytes(&mut rng, sectors * ss);
            for backend in alg.available_backends() {
                let c = cipher(spec_name, &key, ss, backend, 1);
                for dir in [Direction::Encrypt, Direction::Decrypt] {
                    let mut want = source.clone();
                    in_place(&c, &mut want, first, dir);
                    let mut got = random_bytes(&mut rng, source.len());
                    let src = source.clone();
                    c.process_from(&src, &mut got, first, dir).unwrap();
                    assert!(got == want, "{spec_name} {ss} {backend} {dir:?}");
                    assert!(
                        src == source,
                        "{spec_name} {ss} {backend} {dir:?}: source changed"
                    );
                }
            }
        }
    }
    // Large enough to be shared with the worker threads, and not a whole number of their pieces.
    let key = random_bytes(&mut rng, 64);
    let source = random_bytes(&mut rng, (1 << 20) + 12288);
    for backend in Algorithm::Aes.available_backends() {
        for dir in [Direction::Encrypt, Direction::Decrypt] {
            let mut want = source.clone();
            in_place(
                &cipher("aes-xts-plain64", &key, 4096, backend, 1),
                &mut want,
                77,
                dir,
            );
            let c = cipher("aes-xts-plain64", &key, 4096, backend, 3);
            let mut got = random_bytes(&mut rng, source.len());
            c.process_from(&source, &mut got, 77, dir).unwrap();
            assert!(got == want, "{backend} {dir:?} shared with 3 threads");
            let mut got = random_bytes(&mut rng, source.len());
            c.process_from_inline(&source, &mut got, 77, dir).unwrap();
            assert!(got == want, "{backend} {dir:?} inline");
        }
    }
    let null = cipher("cipher_null-ecb", &[], 512, Backend::Null, 1);
    let mut out = vec![0u8; 1024];
    for dir in [Direction::Encrypt, Direction::Decrypt] {
        out.fill(0);
        null.process_from(&[7u8; 1024], &mut out, 3, dir).unwrap();
        assert_eq!(out, vec![7u8; 1024]);
        assert_eq!(
            null.process_from(&[7u8; 512], &mut out, 3, dir),
            Err(Error::LengthMismatch {
                src: 512,
                dst: 1024
            })
        );
    }
}

/// XTS sectors agree with the single-data-unit XTS of IEEE 1619 (the IV is the 512-byte sector
/// number, little endian), and with the staged (mixed) path.
#[test]
fn xts_sectors_match_single_unit_xts_and_the_staged_path() {
    let mut rng = StdRng::seed_from_u64(7);
    for alg in [
        Algorithm::Aes,
        Algorithm::Lea,
        Algorithm::Serpent,
        Algorithm::Twofish,
    ] {
        for backend in alg.available_backends() {
            for key_len in [32, 48, 64] {
                for ss in [512, 4096] {
                    let key = random_bytes(&mut rng, key_len);
                    let spec = format!("{}-xts-plain64", alg.name());
                    let c = cipher(&spec, &key, ss, backend, 1);
                    let xts = Xts::new(alg, &key, BackendChoice::Exact(backend)).unwrap();
                    let mut staged =
                        StagedXts::new(alg, &key, ss, BackendChoice::Exact(backend)).unwrap();
                    let first = rng.gen_range(0..1u64 << 50);
                    let n = rng.gen_range(1..=9);
                    let plain = random_bytes(&mut rng, ss * n);
                    let mut fused = plain.clone();
                    c.encrypt(&mut fused, first).unwrap();
                    let mut unit = plain.clone();
                    for (i, s) in unit.chunks_mut(ss).enumerate() {
                        let mut iv = [0u8; 16];
                        iv[..8].copy_from_slice(
                            &((first + i as u64) * (ss as u64 / 512)).to_le_bytes(),
                        );
                        xts.encrypt_unit(s, &iv).unwrap();
                    }
                    assert_eq!(fused, unit, "{alg:?} {backend} {ss}");
                    let mut times = PhaseTicks::default();
                    let mut st = plain.clone();
                    staged
                        .process(&mut st, first, Direction::Encrypt, &mut times)
                        .unwrap();
                    assert_eq!(st, fused, "staged {alg:?} {backend}");
                    staged
                        .process(&mut st, first, Direction::Decrypt, &mut times)
                        .unwrap();
                    assert_eq!(st, plain);
                    assert!(times.total >= times.tweak + times.xor1 + times.ecb + times.xor2);
                }
            }
        }
    }
}

/// Serpent on every backend against the portable one: ECB on every block count from 1 to 40
/// (whole and partial sets of 8 and 16 blocks), whole-unit XTS and CBC with units of 1 to 40
/// blocks, and the sector modes through `SectorCipher`.
#[test]
fn serpent_and_twofish_backends_agree_with_portable() {
    let mut rng = StdRng::seed_from_u64(0x5e4);
    // Serpent takes any key up to 32 bytes (20: an ESSIV salt of SHA-1), Twofish 16, 24 or 32.
    for (alg, key_lens) in [
        (Algorithm::Serpent, [16, 24, 32, 20]),
        (Algorithm::Twofish, [16, 24, 32, 32]),
    ] {
        backends_agree_with_portable(&mut rng, alg, key_lens);
    }
}

/// `alg`'s every backend against its portable one: ECB, XTS and CBC units of 1 to 40 blocks
/// (whole and partial SIMD sets), and XTS and CBC-ESSIV sectors.
fn backends_agree_with_portable(rng: &mut StdRng, alg: Algorithm, key_lens: [usize; 4]) {
    let backends = alg.available_backends();
    assert_eq!(backends.last(), Some(&Backend::Portable));
    for blocks in 1..=40 {
        let key = random_bytes(rng, key_lens[blocks % 4]);
        let portable = block_cipher(alg, &key, BackendChoice::Portable).unwrap();
        let plain = random_bytes(rng, 16 * blocks);
        let units = rng.gen_range(1..=4);
        let units_plain = random_bytes(rng, 16 * blocks * units);
        let tweaks: Vec<[u8; 16]> = (0..units)
            .map(|_| random_bytes(rng, 16).try_into().unwrap())
            .collect();
        let mut ecb = plain.clone();
        portable.encrypt_ecb(&mut ecb);
        let mut xts = units_plain.clone();
        portable.xts_encrypt_units(&mut xts, 16 * blocks, &tweaks);
        let mut cbc = units_plain.clone();
        portable.cbc_encrypt_units(&mut cbc, 16 * blocks, &tweaks);
        for &backend in &backends {
            let e = block_cipher(alg, &key, BackendChoice::Exact(backend)).unwrap();
            assert_eq!(e.backend(), backend);
            let what = format!("{backend}, {blocks} blocks, {}-byte key", key.len());
            let mut buf = plain.clone();
            e.encrypt_ecb(&mut buf);
            assert_eq!(buf, ecb, "ECB encrypt, {what}");
            e.decrypt_ecb(&mut buf);
            assert_eq!(buf, plain, "ECB decrypt, {what}");
            let mut buf = units_plain.clone();
            e.xts_encrypt_units(&mut buf, 16 * blocks, &tweaks);
            assert_eq!(buf, xts, "XTS encrypt, {units} units, {what}");
            e.xts_decrypt_units(&mut buf, 16 * blocks, &tweaks);
            assert_eq!(buf, units_plain, "XTS decrypt, {units} units, {what}");
            let mut buf = units_plain.clone();
            e.cbc_encrypt_units(&mut buf, 16 * blocks, &tweaks);
            assert_eq!(buf, cbc, "CBC encrypt, {units} units, {what}");
            e.cbc_decrypt_units(&mut buf, 16 * blocks, &tweaks);
            assert_eq!(buf, units_plain, "CBC decrypt, {units} units, {what}");
        }
    }
    for spec in [
        format!("{}-xts-plain64", alg.name()),
        format!("{}-cbc-essiv:sha256", alg.name()),
    ] {
        let spec = spec.as_str();
        for ss in [512, 4096] {
            let key = random_bytes(rng, if spec.contains("xts") { 64 } else { 32 });
            let sectors = rng.gen_range(1..=9);
            let first = rng.gen_range(0..1u64 << 40);
            let plain = random_bytes(rng, ss * sectors);
            let mut reference = plain.clone();
            cipher(spec, &key, ss, Backend::Portable, 1)
                .encrypt(&mut reference, first)
                .unwrap();
            for &backend in &backends {
                let c = cipher(spec, &key, ss, backend, 1);
                let mut buf = plain.clone();
                c.encrypt(&mut buf, first).unwrap();
                assert_eq!(buf, reference, "{spec} {ss} {backend}");
                c.decrypt(&mut buf, first).unwrap();
                assert_eq!(buf, plain, "{spec} {ss} {backend} round trip");
            }
        }
    }
}

/// The worker-thread split is invisible in the output.
#[test]
fn threads_change_nothing() {
    let mut rng = StdRng::seed_from_u64(99);
    for spec in ["aes-xts-plain64", "lea-xts-plain64", "aes-cbc-essiv:sha256"] {
        let key = random_bytes(&mut rng, if spec.contains("xts") { 64 } else { 32 });
        let alg = CipherSpec::parse(spec).unwrap().algorithm().unwrap();
        let backend = alg.available_backends()[0];
        let one = cipher(spec, &key, 512, backend, 1);
        let two = cipher(spec, &key, 512, backend, 2);
        let three = cipher(spec, &key, 4096, backend, 3);
        let three_ref = cipher(spec, &key, 4096, backend, 1);
        assert_eq!(two.threads(), 2);
        // Lengths that are and are not a whole number of work-sharing pieces.
        for len in [512 * 1024, 1 << 20, (1 << 20) + 12288, 3 << 20] {
            let plain = random_bytes(&mut rng, len);
            let mut a = plain.clone();
            let mut b = plain.clone();
            one.encrypt(&mut a, 12345).unwrap();
            two.encrypt(&mut b, 12345).unwrap();
            assert_eq!(a, b, "{spec} {len}");
            two.decrypt(&mut b, 12345).unwrap();
            assert_eq!(b, plain);
            let mut c = plain.clone();
            let mut d = plain.clone();
            three.encrypt(&mut c, 77).unwrap();
            three_ref.encrypt(&mut d, 77).unwrap();
            assert_eq!(c, d);
        }
    }
}

/// dm-crypt IV semantics: 4096-byte sectors number IVs in 512-byte units (sector k has IV 8k),
/// unless iv_large_sectors; plain truncates to 32 bits; plain64be is big endian at the end.
#[test]
fn iv_generators_follow_dm_crypt() {
    let key = [7u8; 64];
    let c = cipher("aes-xts-plain64", &key, 4096, Backend::Portable, 1);
    let mut want = [0u8; 16];
    want[0] = 24;
    assert_eq!(c.iv_block(3), want);
    let large = SectorCipher::new(
        CipherSpec::parse("aes-xts-plain64").unwrap(),
        &key,
        &SectorOptions {
            sector_size: 4096,
            iv_large_sectors: true,
            iv_offset: 5,
            ..Default::default()
        },
    )
    .unwrap();
    want[0] = 8;
    assert_eq!(large.iv_block(3), want);
    let plain = cipher("aes-xts-plain", &key, 512, Backend::Portable, 1);
    let mut want = [0u8; 16];
    want[..4].copy_from_slice(&0x8765_4321u32.to_le_bytes());
    assert_eq!(plain.iv_block(0x1234_8765_4321), want);
    // With plain, sectors 2^32 apart encrypt alike; with plain64 they do not.
    let p64 = cipher("aes-xts-plain64", &key, 512, Backend::Portable, 1);
    let (mut a, mut b, mut x, mut y) = ([1u8; 512], [1u8; 512], [1u8; 512], [1u8; 512]);
    plain.encrypt(&mut a, 5).unwrap();
    plain.encrypt(&mut b, 5 + (1 << 32)).unwrap();
    p64.encrypt(&mut x, 5).unwrap();
    p64.encrypt(&mut y, 5 + (1 << 32)).unwrap();
    assert_eq!(a, b);
    assert_ne!(x, y);
    let be = cipher("aes-xts-plain64be", &key, 512, Backend::Portable, 1);
    let mut want = [0u8; 16];
    want[8..].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    assert_eq!(be.iv_block(0x0102_0304_0506_0708), want);
}

/// CBC-ESSIV: IV = E_{SHA256(key)}(sector, little endian), then plain CBC per sector.
#[test]
fn essiv_is_cbc_with_encrypted_sector_number() {
    use sha2::{Digest, Sha256};
    let key = [0x42u8; 32];
    let c = cipher("aes-cbc-essiv:sha256", &key, 512, Backend::Portable, 1);
    let salt = Sha256::digest(key);
    let essiv = block_cipher(Algorithm::Aes, &salt, BackendChoice::Portable).unwrap();
    let data_key = block_cipher(Algorithm::Aes, &key, BackendChoice::Portable).unwrap();
    let mut iv = [0u8; 16];
    iv[..8].copy_from_slice(&9u64.to_le_bytes());
    essiv.encrypt_ecb(&mut iv);
    let plain = [0x5au8; 512];
    let mut want = plain;
    modes::cbc(data_key.as_ref(), &iv, &mut want, Direction::Encrypt).unwrap();
    let mut got = plain;
    c.encrypt(&mut got, 9).unwrap();
    assert_eq!(got, want);
}

/// lmk (loop-AES): the IV comes from the plaintext. Requests of many sectors equal one sector at
/// a time on every backend and with threads, and decrypt back; ciphertext block 0 depends on the
/// other plaintext blocks and on 56 bits of the sector number; sectors are 512 bytes only.
#[test]
fn lmk_derives_the_iv_from_the_plaintext() {
    let mut rng = StdRng::seed_from_u64(0x10ae5);
    let key = random_bytes(&mut rng, 32);
    // More than a work-sharing request, so the threads take part.
    let plain = random_bytes(&mut rng, 600 * 512);
    let first = (1u64 << 40) + 3;
    let mut reference = None;
    for backend in Algorithm::Aes.available_backends() {
        for threads in [1, 2] {
            let c = cipher("aes-cbc-lmk", &key, 512, backend, threads);
            let mut whole = plain.clone();
            c.encrypt(&mut whole, first).unwrap();
            let mut pieces = plain.clone();
            for (i, s) in pieces.chunks_mut(512).enumerate() {
                c.encrypt(s, first + i as u64).unwrap();
            }
            assert_eq!(whole, pieces, "{backend} {threads}");
            match &reference {
                None => reference = Some(whole.clone()),
                Some(r) => assert_eq!(&whole, r, "{backend} {threads} differs"),
            }
            c.decrypt(&mut whole, first).unwrap();
            assert_eq!(whole, plain, "{backend} {threads} round trip");
        }
    }
    let c = cipher("aes-cbc-lmk", &key, 512, Backend::Portable, 1);
    let encrypt = |sector: &[u8], n: u64| {
        let mut buf = sector.to_vec();
        c.encrypt(&mut buf, n).unwrap();
        buf
    };
    let sector = &plain[..512];
    let mut block_5_changed = sector.to_vec();
    block_5_changed[5 * 16] ^= 1;
    assert_ne!(encrypt(sector, 7)[..16], encrypt(&block_5_changed, 7)[..16]);
    assert_ne!(encrypt(sector, 7), encrypt(sector, 8));
    assert_ne!(encrypt(sector, 7), encrypt(sector, 7 + (1 << 55)));
    assert_eq!(encrypt(sector, 7), encrypt(sector, 7 + (1 << 56)));
    let refused = SectorCipher::new(
        CipherSpec::parse("aes-cbc-lmk").unwrap(),
        &key,
        &SectorOptions {
            sector_size: 4096,
            ..Default::default()
        },
    );
    assert!(matches!(
        refused,
        Err(Error::IvSectorSize {
            sector_size: 4096,
            required: 512,
            ..
        })
    ));
}

#[test]
fn cipher_null_is_the_identity() {
    let c = SectorCipher::new(
        CipherSpec::parse("cipher_null-ecb").unwrap(),
        &[],
        &SectorOptions::default(),
    )
    .unwrap();
    assert_eq!(c.backend(), Backend::Null);
    let mut buf = vec![3u8; 4096];
    c.encrypt(&mut buf, 1).unwrap();
    assert_eq!(buf, vec![3u8; 4096]);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let spec = CipherSpec::DEFAULT;
    let key = [1u8; 64];
    assert_eq!(
        SectorCipher::new(
            spec,
            &key,
            &SectorOptions {
                sector_size: 768,
                ..Default::default()
            }
        )
        .err(),
        Some(Error::SectorSize(768))
    );
    assert!(matches!(
        SectorCipher::new(spec, &key[..40], &SectorOptions::default()),
        Err(Error::KeySize { .. })
    ));
    assert!(matches!(
        SectorCipher::new(spec, &[], &SectorOptions::default()),
        Err(Error::KeySize { .. })
    ));
    let c = SectorCipher::new(spec, &key, &SectorOptions::default()).unwrap();
    let mut odd = vec![0u8; 1000];
    assert_eq!(
        c.encrypt(&mut odd, 0),
        Err(Error::NotWholeSectors {
            len: 1000,
            sector_size: 512
        })
    );
    assert_eq!(odd, vec![0u8; 1000], "a refused buffer is untouched");
    let mut buf = vec![0u8; 1024];
    assert_eq!(c.encrypt(&mut buf, u64::MAX), Err(Error::SectorOverflow));
    let c4k = SectorCipher::new(
        spec,
        &key,
        &SectorOptions {
            sector_size: 4096,
            ..Default::default()
        },
    )
    .unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        c4k.encrypt(&mut buf, u64::MAX / 4),
        Err(Error::SectorOverflow)
    );
    assert!(c.encrypt(&mut [], 0).is_ok());
    for s in [
        "aes-xts",
        "aes-xts-plain65",
        "blowfish-xts-plain64",
        "",
        "aes-ecb-plain",
    ] {
        assert!(
            matches!(CipherSpec::parse(s), Err(Error::BadSpec { .. })),
            "{s}"
        );
    }
    assert!(BackendChoice::parse("avx1024").is_err());
    assert!(matches!(
        BackendChoice::Exact(Backend::AesNi).resolve(Algorithm::Lea),
        Err(Error::BackendUnsupported { .. })
    ));
    let xts = Xts::new(Algorithm::Aes, &key, BackendChoice::Portable).unwrap();
    assert!(matches!(
        xts.encrypt_unit(&mut [0u8; 15], &[0; 16]),
        Err(Error::DataUnitLength { .. })
    ));
    assert!(matches!(
        Xts::new(Algorithm::Aes, &key[..16], BackendChoice::Auto),
        Err(Error::KeySize { .. })
    ));
    let e = block_cipher(Algorithm::Lea, &key[..32], BackendChoice::Auto).unwrap();
    assert!(modes::ecb(e.as_ref(), &mut [0u8; 17], Direction::Encrypt).is_err());
    assert!(modes::cbc(e.as_ref(), &[0; 16], &mut [0u8; 31], Direction::Decrypt).is_err());
    assert!(matches!(
        block_cipher(Algorithm::Aes, &key[..20], BackendChoice::Auto),
        Err(Error::KeySize { .. })
    ));
    let mut st = StagedXts::new(Algorithm::Aes, &key, 512, BackendChoice::Auto).unwrap();
    assert!(st
        .process(
            &mut [0u8; 100],
            0,
            Direction::Encrypt,
            &mut PhaseTicks::default()
        )
        .is_err());
    // Every error renders as one line.
    for e in [
        Error::SectorSize(3),
        Error::SectorOverflow,
        Error::BackendUnavailable(Backend::Vaes512),
    ] {
        assert!(!e.to_string().contains('\n'));
    }
}

/// Twofish on every backend against RustCrypto's `twofish` (an independent, table-driven
/// implementation) on random keys of every length and 1 to 40 blocks (whole and partial SIMD
/// sets), both directions.
#[test]
fn twofish_matches_rustcrypto_on_every_backend() {
    use twofish::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
    let mut rng = StdRng::seed_from_u64(0x2f15);
    for backend in Algorithm::Twofish.available_backends() {
        for key_len in [16, 24, 32] {
            for n in 1..=40 {
                let key = random_bytes(&mut rng, key_len);
                let plain = random_bytes(&mut rng, 16 * n);
                let reference = twofish::Twofish::new_from_slice(&key).unwrap();
                let mut want = plain.clone();
                for block in want.chunks_exact_mut(16) {
                    reference.encrypt_block(GenericArray::from_mut_slice(block));
                }
                let engine =
                    block_cipher(Algorithm::Twofish, &key, BackendChoice::Exact(backend)).unwrap();
                assert_eq!(engine.backend(), backend);
                let mut got = plain.clone();
                engine.encrypt_ecb(&mut got);
                assert_eq!(got, want, "{backend} {key_len}-byte key, {n} blocks");
                engine.decrypt_ecb(&mut got);
                assert_eq!(got, plain, "{backend} {key_len}-byte key, {n} blocks");
            }
        }
    }
}
