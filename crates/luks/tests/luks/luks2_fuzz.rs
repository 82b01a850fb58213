//! Random damage to a real cryptsetup header never makes `Header::read` (or the dump, the data
//! segment or an unlock attempt on what it accepts) panic: byte flips anywhere in the two header
//! copies, the same with the checksums made right again (so the damage reaches the JSON parser
//! and validator), truncations, random edits of the JSON metadata, and random binary-header
//! fields. Seeded, so a failure names a reproducible case; counted, so the test fails if the
//! damage stops reaching the deeper checks.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::luks2_support::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sectorcrypt_luks::luks2::metadata::{Keyslot, KeyslotKdf};
use sectorcrypt_luks::luks2::Header;
use sectorcrypt_luks::Error;
use sectorcrypt_storage::MemStorage;
use serde_json::{json, Value};

/// A small two-keyslot volume (PBKDF2 slot 0, Argon2id slot 1), cut after its keyslots area
/// (like a header backup file): 288 KiB to damage.
fn base_image() -> Vec<u8> {
    let dir = scratch("luks2-fuzz");
    let k0 = key_file(&dir, "k0", "pass 0");
    let k1 = key_file(&dir, "k1", "pass 1");
    let img = format(
        &dir,
        "base",
        &k0,
        2 << 20,
        &[
            FAST_PBKDF2,
            &["--luks2-keyslots-size", "256k", "--key-size", "256"],
        ]
        .concat(),
    );
    add_key(&img, &k0, &k1, FAST_ARGON2ID);
    let mut bytes = std::fs::read(&img).unwrap();
    let end = Header::read(&MemStorage::new(bytes.clone()))
        .unwrap()
        .hdr_and_areas_size() as usize;
    bytes.truncate(end);
    std::fs::remove_dir_all(&dir).unwrap();
    bytes
}

/// Values likely to upset a parser that trusts its input.
fn nasty_value(rng: &mut StdRng) -> Value {
    let choices = [
        json!(null),
        json!(true),
        json!(0),
        json!(1),
        json!(-1),
        json!(4000),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1.5),
        json!(""),
        json!("0"),
        json!("1"),
        json!("7"),
        json!("dynamic"),
        json!("32768"),
        json!("4096"),
        json!("18446744073709551615"),
        json!("18446744073709551616"),
        json!("-1"),
        json!(" 1"),
        json!("luks2"),
        json!("pbkdf2"),
        json!("argon2id"),
        json!("crypt"),
        json!("backup-final"),
        json!("online-reencrypt-v2"),
        json!("reencrypt"),
        json!("AAAA"),
        json!("*"),
        json!("x".repeat(300)),
        json!([]),
        json!(["0"]),
        json!(["0", "1", "0"]),
        json!([0]),
        json!({}),
        json!({"type": "luks2"}),
        json!({"type": "crypt", "offset": "0", "size": "dynamic"}),
        json!({"type": "reencrypt", "mode": "encrypt", "direction": "forward", "key_size": 1,
               "area": {"type": "datashift", "offset": "32768", "size": "4096", "shift_size": "0"}}),
    ];
    choices.choose(rng).unwrap().clone()
}

/// A random path to a node of `v` (possibly the root).
fn random_node<'a>(v: &'a mut Value, rng: &mut StdRng) -> &'a mut Value {
    let depth = rng.gen_range(0..6);
    let mut node = v;
    for _ in 0..depth {
        let len = match &*node {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => 0,
        };
        if len == 0 {
            break;
        }
        let i = rng.gen_range(0..len);
        node = match node {
            Value::Object(m) => m.values_mut().nth(i).unwrap(),
            Value::Array(a) => &mut a[i],
            _ => unreachable!(),
        };
    }
    node
}

/// One to four random edits of the metadata.
fn mutate_json(v: &mut Value, rng: &mut StdRng) {
    for _ in 0..rng.gen_range(1..=4) {
        let replacement = nasty_value(rng);
        let node = random_node(v, rng);
        match rng.gen_range(0..4) {
            0 => *node = replacement,
            1 => {
                if let Value::Object(m) = node {
                    if let Some(k) = m.keys().nth(rng.gen_range(0..m.len().max(1))).cloned() {
                        m.remove(&k);
                    }
                }
            }
            2 => {
                if let Value::Object(m) = node {
                    let key = [
                        "0", "1", "2", "31", "01", "type", "offset", "flags", "priority",
                    ]
                    .choose(rng)
                    .unwrap();
                    m.insert(key.to_string(), replacement);
                }
            }
            _ => {
                if let Value::Array(a) = node {
                    a.push(replacement);
                }
            }
        }
    }
}

/// Whether unlocking `h` costs little enough to try (the mutations can make a KDF arbitrarily
/// expensive, which is legal, just slow).
fn cheap(h: &Header) -> bool {
    h.metadata().keyslots.iter().all(|(_, k)| match k {
        Keyslot::Luks2(k) => match &k.kdf {
            KeyslotKdf::Pbkdf2 { iterations, .. } => *iterations <= 5000,
            KeyslotKdf::Argon2 {
                time, memory, cpus, ..
            } => *time <= 8 && *memory <= 1024 && *cpus <= 8,
        },
        Keyslot::Reencrypt(_) | Keyslot::Other(_) => true,
    }) && h.metadata().digests.iter().all(|(_, d)| match d {
        sectorcrypt_luks::luks2::metadata::Digest::Pbkdf2(d) => d.iterations <= 5000,
        _ => true,
    })
}

#[derive(Default, Debug)]
struct Tally {
    accepted: u32,
    not_luks: u32,
    corrupt_checksum: u32,
    corrupt_json: u32,
    corrupt_other: u32,
    unlocked: u32,
}

/// Read `bytes`, then use whatever was accepted (unlocking too if `unlock`, which costs a few
/// KDF runs); panics propagate to the caller's catch_unwind.
fn exercise(bytes: Vec<u8>, unlock: bool, tally: &mut Tally) {
    let dev = MemStorage::new(bytes);
    match Header::read(&dev) {
        Ok(h) => {
            tally.accepted += 1;
            let _ = h.dump_text();
            let _ = h.dump_json();
            let _ = h.data_segment();
            let _ = h.metadata().to_json_text();
            let _ = h.health().needs_repair();
            if unlock && cheap(&h) {
                for pass in [&b"pass 0"[..], b"pass 1", b"wrong"] {
                    if h.unlock(&dev, pass, None).is_ok() {
                        tally.unlocked += 1;
                    }
                }
                let _ = h.unlock(&dev, b"pass 1", Some(1));
            }
        }
        Err(Error::NotLuks { .. }) => tally.not_luks += 1,
        Err(Error::Corrupt(why)) if why.contains("JSON") => tally.corrupt_json += 1,
        Err(Error::Corrupt(why)) if why.contains("checksum") => tally.corrupt_checksum += 1,
        Err(Error::Corrupt(_)) => tally.corrupt_other += 1,
        Err(e) => panic!("unexpected error kind reading a damaged header: {e:?}"),
    }
}

fn run_cases(name: &str, seed: u64, cases: u32, make: impl Fn(&mut StdRng) -> Vec<u8>) -> Tally {
    let mut tally = Tally::default();
    for case in 0..cases {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003) + u64::from(case));
        let bytes = make(&mut rng);
        let unlock = case % 8 == 0;
        let r = catch_unwind(AssertUnwindSafe(|| exercise(bytes, unlock, &mut tally)));
        assert!(r.is_ok(), "{name}: case {case} (seed {seed}) panicked");
    }
    eprintln!("{name}: {tally:?}");
    tally
}

#[test]
fn damaged_headers_never_panic() {
    let base = base_image();
    let size = hdr_size(&base);
    let both = 2 * size;

    let t = run_cases("byte flips", 1, 1500, |rng| {
        let mut b = base.clone();
        for _ in 0..rng.gen_range(1..=16) {
            let at = rng.gen_range(0..both);
            b[at] = rng.gen();
        }
        b
    });
    assert!(t.accepted > 0 && t.corrupt_checksum > 0, "{t:?}");

    let t = run_cases("byte flips, resealed", 2, 1500, |rng| {
        let mut b = base.clone();
        for _ in 0..rng.gen_range(1..=4) {
            // Mostly inside the JSON text (the first 2 KiB of each area), sometimes anywhere.
            let copy = if rng.gen() { 0 } else { size };
            let at = if rng.gen_range(0..4) > 0 {
                copy + 4096 + rng.gen_range(0..2048)
            } else {
                copy + rng.gen_range(0..size)
            };
            b[at] = *b" {}[]\",:0123456789aez\0\xff".choose(rng).unwrap();
        }
        reseal(&mut b, 0);
        reseal(&mut b, size);
        b
    });
    assert!(t.corrupt_json > 0 && t.accepted > 0, "{t:?}");

    let t = run_cases("truncations", 3, 400, |rng| {
        let len = match rng.gen_range(0..4) {
            0 => rng.gen_range(0..16),
            1 => rng.gen_range(0..=both + 4096),
            2 => rng.gen_range(0..=base.len()),
            _ => base.len() - rng.gen_range(0..4096),
        };
        base[..len].to_vec()
    });
    assert!(
        t.not_luks > 0 && t.corrupt_other + t.corrupt_json > 0,
        "{t:?}"
    );

    let t = run_cases("JSON edits", 4, 2500, |rng| {
        let mut b = base.clone();
        let mut v = json_at(&b, 0);
        mutate_json(&mut v, rng);
        let text = serde_json::to_vec(&v).unwrap();
        if text.len() < size - 4096 {
            put_json_text(&mut b, 0, &text);
            if rng.gen_range(0..4) > 0 {
                put_json_text(&mut b, size, &text);
            }
        }
        b
    });
    assert!(
        t.corrupt_json > 100 && t.accepted > 50 && t.unlocked > 0,
        "{t:?}"
    );

    let t = run_cases("binary fields", 5, 800, |rng| {
        let mut b = base.clone();
        // One copy, or both (else the intact copy always saves the header).
        let copies = [&[0][..], &[size], &[0, size]]
            .choose(rng)
            .unwrap()
            .to_vec();
        for copy in copies {
            let sizes = [
                0u64,
                1,
                4096,
                0x4000,
                0x8000,
                0x10000,
                0x400000,
                0x400001,
                u64::MAX,
            ];
            match rng.gen_range(0..6) {
                0 => b[copy + 6..copy + 8].copy_from_slice(&rng.gen::<u16>().to_be_bytes()),
                1 => b[copy + 8..copy + 16]
                    .copy_from_slice(&sizes.choose(rng).unwrap().to_be_bytes()),
                2 => b[copy + 16..copy + 24].copy_from_slice(&rng.gen::<u64>().to_be_bytes()),
                3 => b[copy + 256..copy + 264]
                    .copy_from_slice(&sizes.choose(rng).unwrap().to_be_bytes()),
                4 => {
                    let alg: &[u8] = [&b"sha1"[..], b"sha512", b"SHA256", b"md5", b"", b"\xff\xfe"]
                        .choose(rng)
                        .unwrap();
                    b[copy + 72..copy + 104].fill(0);
                    b[copy + 72..copy + 72 + alg.len()].copy_from_slice(alg);
                }
                _ => {
                    let at = copy + rng.gen_range(0..512);
                    b[at] = rng.gen();
                }
            }
            if rng.gen_range(0..3) > 0 && hdr_size(&b[copy..]) <= size {
                reseal(&mut b, copy);
            }
        }
        b
    });
    assert!(
        t.accepted > 0 && t.corrupt_other + t.corrupt_checksum > 0,
        "{t:?}"
    );
}
