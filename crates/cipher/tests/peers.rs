//! Random cross-checks against independent implementations: AES (XTS, CBC-ESSIV, CBC, ECB, every
//! IV generator; GCM) against OpenSSL through Python's `cryptography`; LEA, Serpent, Twofish, Camellia,
//! ARIA, SM4 and CAST6 (XTS, CBC with every IV generator and ESSIV hash, ECB) and AES-XTS against
//! Crypto++. Random keys, sector numbers (including above 2^32), sector sizes and request lengths,
//! on every backend. The peers are installed by the test set-up (scripts/install-test-deps.sh);
//! a missing peer fails the test.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};
use sectorcrypt_cipher::spec::{CipherSpec, IvMode, Mode};
use sectorcrypt_cipher::{BackendChoice, SectorCipher, SectorOptions};

struct Job {
    spec: &'static str,
    key: Vec<u8>,
    sector_size: usize,
    first: u64,
    encrypt: bool,
    data: Vec<u8>,
}

/// Random jobs over `specs`; `xts_key_bits` lists the whole XTS key sizes the peer implements (of
/// those the cipher takes).
fn random_jobs(
    specs: &[&'static str],
    xts_key_bits: &[usize],
    count: usize,
    seed: u64,
) -> Vec<Job> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|i| {
            let spec = specs[i % specs.len()];
            let parsed = CipherSpec::parse(spec).unwrap();
            let allowed: Vec<usize> = match parsed.mode {
                Mode::Xts => parsed
                    .key_bits_allowed()
                    .iter()
                    .copied()
                    .filter(|b| xts_key_bits.contains(b))
                    .collect(),
                _ => parsed.key_bits_allowed().to_vec(),
            };
            let mut key = vec![0u8; allowed[rng.gen_range(0..allowed.len())] / 8];
            rng.fill_bytes(&mut key);
            let mut sector_size = [512, 1024, 2048, 4096][rng.gen_range(0..4)];
            // loop-AES's IV is defined for 512-byte sectors only.
            if parsed.iv == IvMode::Lmk {
                sector_size = 512;
            }
            let first = match rng.gen_range(0..3) {
                0 => rng.gen_range(0..1000),
                1 => rng.gen_range(1u64 << 32..1u64 << 52),
                _ => rng.gen_range(0..u32::MAX as u64),
            };
            let mut data = vec![0u8; sector_size * rng.gen_range(1..=12)];
            rng.fill_bytes(&mut data);
            Job {
                spec,
                key,
                sector_size,
                first,
                encrypt: rng.gen_bool(0.5),
                data,
            }
        })
        .collect()
}

/// Run every job through the peer program and through sectorcrypt on every backend.
/// Feed `input` (one job a line) to `peer` and return its `count` answer lines.
fn answers(mut peer: Command, input: String, count: usize) -> Vec<String> {
    let mut child = peer
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start peer {peer:?}: {e} (run scripts/install-test-deps.sh)")
        });
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let outputs: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
        .collect();
    writer.join().unwrap().unwrap();
    assert!(child.wait().unwrap().success(), "peer {peer:?} failed");
    assert_eq!(
        outputs.len(),
        count,
        "peer answered {} of {count} jobs",
        outputs.len()
    );
    outputs
}

fn cross_check(peer: Command, jobs: &[Job]) {
    let mut input = String::new();
    for j in jobs {
        input += &format!(
            "{} {} {} {} {} {}\n",
            j.spec,
            hex::encode(&j.key),
            j.sector_size,
            j.first,
            if j.encrypt { "encrypt" } else { "decrypt" },
            hex::encode(&j.data)
        );
    }
    let outputs = answers(peer, input, jobs.len());
    let mut checked = 0;
    for (j, want) in jobs.iter().zip(&outputs) {
        let spec = CipherSpec::parse(j.spec).unwrap();
        for backend in spec.algorithm().unwrap().available_backends() {
            let opts = SectorOptions {
                sector_size: j.sector_size,
                backend: BackendChoice::Exact(backend),
                ..Default::default()
            };
            let c = SectorCipher::new(spec, &j.key, &opts).unwrap();
            let mut buf = j.data.clone();
            if j.encrypt {
                c.encrypt(&mut buf, j.first).unwrap();
            } else {
                c.decrypt(&mut buf, j.first).unwrap();
            }
            assert_eq!(
                &hex::encode(&buf),
                want,
                "{} {backend} key {} bits, sector size {}, first sector {}, {} bytes, encrypt={}",
                j.spec,
                j.key.len() * 8,
                j.sector_size,
                j.first,
                j.data.len(),
                j.encrypt
            );
            checked += 1;
        }
    }
    assert!(checked >= jobs.len());
}

#[test]
fn aes_matches_openssl() {
    let jobs = random_jobs(
        &[
            "aes-xts-plain64",
            "aes-cbc-essiv:sha256",
            "aes-xts-plain",
            "aes-cbc-plain64",
            "aes-ecb",
            "aes-xts-plain64be",
            "aes-xts-benbi",
            "aes-cbc-benbi",
            "aes-cbc-null",
            "aes-cbc-eboiv",
            "aes-cbc-lmk",
            "aes-cbc-essiv:sha3-256",
            "aes-cbc-essiv:blake2s-256",
            "aes-lrw-benbi",
            "aes-lrw-plain64",
        ],
        // OpenSSL has no XTS-AES-192.
        &[256, 512],
        240,
        0xA5,
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/dmcrypt_openssl.py");
    let mut cmd = Command::new(common::python());
    cmd.arg(script);
    cross_check(cmd, &jobs);
}

/// AES-GCM against OpenSSL, with the AES of every backend: random keys of every size, nonces,
/// associated data and lengths from 0 to past 4 KiB (partial blocks, fewer and more than the eight
/// blocks GHASH sums per reduction).
#[test]
fn aes_gcm_matches_openssl() {
    use sectorcrypt_cipher::gcm::{AesGcm, NONCE, TAG};
    if !AesGcm::available() {
        eprintln!("no carry-less multiply on this CPU: nothing to check");
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x6C);
    // Key, nonce, associated data, message.
    type GcmJob = (Vec<u8>, [u8; NONCE], Vec<u8>, Vec<u8>);
    let jobs: Vec<GcmJob> = (0..300)
        .map(|i| {
            let mut key = vec![0u8; [16, 24, 32][i % 3]];
            rng.fill_bytes(&mut key);
            let mut nonce = [0u8; NONCE];
            rng.fill_bytes(&mut nonce);
            let mut aad = vec![0u8; [0, 20, 24, 37, 200][i % 5]];
            rng.fill_bytes(&mut aad);
            let len = match i % 4 {
                0 => 4096,
                1 => 512,
                _ => rng.gen_range(0..4200),
            };
            let mut data = vec![0u8; len];
            rng.fill_bytes(&mut data);
            (key, nonce, aad, data)
        })
        .collect();
    let field = |b: &[u8]| {
        if b.is_empty() {
            "-".to_string()
        } else {
            hex::encode(b)
        }
    };
    let input: String = jobs
        .iter()
        .map(|(k, n, a, d)| format!("{} {} {} {}\n", field(k), field(n), field(a), field(d)))
        .collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/gcm_openssl.py");
    let mut peer = Command::new(common::python());
    peer.arg(script);
    let outputs = answers(peer, input, jobs.len());
    let backends = sectorcrypt_cipher::Algorithm::Aes.available_backends();
    for (i, ((key, nonce, aad, data), want)) in jobs.iter().zip(&outputs).enumerate() {
        let backend = backends[i % backends.len()];
        let gcm = AesGcm::new(key, BackendChoice::Exact(backend)).unwrap();
        let mut buf = data.clone();
        let tag = gcm.seal(nonce, aad, &mut buf);
        buf.extend_from_slice(&tag);
        assert_eq!(
            &hex::encode(&buf),
            want,
            "AES on {backend}, {}-bit key, {} bytes of associated data, {} bytes",
            key.len() * 8,
            aad.len(),
            data.len()
        );
        let (cipher, tag) = buf.split_at(data.len());
        let mut opened = cipher.to_vec();
        assert!(gcm.open(nonce, aad, &mut opened, tag.try_into().unwrap()));
        assert_eq!(&opened, data);
        let mut forged: [u8; TAG] = tag.try_into().unwrap();
        forged[rng.gen_range(0..TAG)] ^= 1 << rng.gen_range(0..8);
        let mut refused = cipher.to_vec();
        assert!(!gcm.open(nonce, aad, &mut refused, &forged));
        assert_eq!(refused, cipher, "a refused message stays as it was");
    }
}

/// Build the Crypto++ peer once into the test scratch directory. Tests run on several threads, so
/// the build happens under a `OnceLock`: a second test waits instead of running a half-written
/// binary.
fn cryptopp_peer() -> PathBuf {
    static PEER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PEER.get_or_init(build_cryptopp_peer).clone()
}

fn build_cryptopp_peer() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/dmcrypt_cryptopp.cpp");
    let bin = common::scratch_dir().join("dmcrypt_cryptopp");
    let stale = match (std::fs::metadata(&bin), std::fs::metadata(&src)) {
        (Ok(b), Ok(s)) => b.modified().unwrap() < s.modified().unwrap(),
        _ => true,
    };
    if stale {
        let tmp = bin.with_extension(format!("tmp{}", std::process::id()));
        let status = Command::new("g++")
            .args(["-O2", "-std=c++17", "-o"])
            .arg(&tmp)
            .arg(&src)
            .arg("-lcryptopp")
            .status()
            .expect("g++ is needed to build the Crypto++ peer");
        assert!(
            status.success(),
            "building the Crypto++ peer failed: is libcrypto++-dev installed?"
        );
        std::fs::rename(&tmp, &bin).unwrap();
    }
    bin
}

#[test]
fn lea_matches_cryptopp() {
    let jobs = random_jobs(
        &[
            "lea-xts-plain64",
            "lea-cbc-essiv:sha256",
            "lea-cbc-plain64",
            "lea-ecb",
        ],
        &[256, 384, 512],
        240,
        0x1EA,
    );
    cross_check(Command::new(cryptopp_peer()), &jobs);
}

/// Every other block cipher, in every mode, with every IV generator and a spread of ESSIV hashes
/// (those whose digest is a key length of the cipher in Crypto++).
#[test]
fn other_ciphers_match_cryptopp() {
    let mut specs = Vec::new();
    for cipher in ["serpent", "twofish", "camellia", "aria", "sm4", "cast6"] {
        for mode_iv in [
            "xts-plain64",
            "xts-plain",
            "xts-plain64be",
            "xts-benbi",
            "cbc-plain64",
            "cbc-null",
            "cbc-benbi",
            "cbc-eboiv",
            "ecb",
        ] {
            specs.push(format!("{cipher}-{mode_iv}"));
        }
        if cipher != "sm4" {
            for hash in ["sha256", "wp256", "sm3", "sha3-256", "blake2s-256"] {
                specs.push(format!("{cipher}-cbc-essiv:{hash}"));
            }
        }
    }
    let specs: Vec<&'static str> = specs
        .into_iter()
        .map(|s| &*Box::leak(s.into_boxed_str()))
        .collect();
    let jobs = random_jobs(&specs, &[256, 384, 512], 6 * specs.len(), 0x07E4);
    cross_check(Command::new(cryptopp_peer()), &jobs);
}

#[test]
fn aes_xts_matches_cryptopp() {
    let jobs = random_jobs(&["aes-xts-plain64"], &[256, 384, 512], 60, 0xC0);
    cross_check(Command::new(cryptopp_peer()), &jobs);
}
