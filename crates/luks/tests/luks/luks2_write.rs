//! The LUKS2 write side against the real cryptsetup 2.6, both ways: volumes formatted here pass
//! `luksDump`, `repair` (which changes nothing) and `open --test-passphrase`, and cryptsetup
//! reports the volume key they were formatted with; keyslots added, changed or removed here are
//! seen so by cryptsetup and keyslots cryptsetup adds open here; header backups are the bytes
//! `luksHeaderBackup` writes and restore across the two tools. Also the KDF calibration.

use std::path::{Path, PathBuf};

use crate::luks2_support::*;
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::kdf::{self, Argon2Variant};
use sectorcrypt_luks::luks2::{self, FormatParams, Header, Pbkdf};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{FileStorage, MemStorage};

const MIB: u64 = 1 << 20;

fn fast_pbkdf2() -> Pbkdf {
    Pbkdf::pbkdf2_forced(Hash::Sha256, 1000)
}

/// Format parameters with the defaults but a fast keyslot.
fn fast_params() -> FormatParams {
    FormatParams {
        pbkdf: fast_pbkdf2(),
        ..FormatParams::default()
    }
}

fn fast_argon2id() -> Pbkdf {
    Pbkdf::argon2_forced(Argon2Variant::Argon2id, 4, 32 * 1024, 1)
}

/// A sparse image of `size` bytes formatted here; returns the image and the volume key.
fn format_here(dir: &Path, name: &str, size: u64, params: &FormatParams, pass: &[u8]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let dev = FileStorage::open(&img).unwrap();
    let (h, unlocked) = luks2::format(&dev, params, pass).unwrap();
    assert_eq!(h.seqid(), 1);
    assert_eq!(unlocked.slot, params.keyslot.unwrap_or(0));
    img
}

fn header_bytes(img: &Path) -> Vec<u8> {
    let b = std::fs::read(img).unwrap();
    b[..(16 * MIB) as usize].to_vec()
}

/// `cryptsetup repair` accepts the image and leaves its header and keyslots area unchanged.
fn assert_repair_is_a_no_op(img: &Path) {
    let before = header_bytes(img);
    cryptsetup_ok(&["repair", "-q", path(img)]);
    assert!(
        header_bytes(img) == before,
        "cryptsetup repair changed {}",
        img.display()
    );
}

fn unlock_here(img: &Path, pass: &[u8]) -> Option<(usize, Vec<u8>)> {
    let dev = FileStorage::open_read_only(img).unwrap();
    let h = Header::read(&dev).unwrap();
    h.unlock(&dev, pass, None)
        .ok()
        .map(|u| (u.slot, u.volume_key.to_vec()))
}

/// Every format variant passes cryptsetup's checks and gives the volume key it was made with;
/// the metadata is what cryptsetup shows, field for field, and the layout is cryptsetup's.
#[test]
fn formats_made_here_pass_cryptsetup() {
    let dir = scratch("luks2-write-format");
    let key = key_file(&dir, "pass", "format passphrase");
    struct Case {
        name: &'static str,
        size: u64,
        key_bits: usize,
        sector: Option<u32>,
        pbkdf: Pbkdf,
        expect_sector: u32,
        expect_area: u64,
        label: Option<&'static str>,
    }
    let cases = [
        Case {
            name: "pbkdf2-512-auto4096",
            size: 20 * MIB,
            key_bits: 512,
            sector: None,
            pbkdf: fast_pbkdf2(),
            expect_sector: 4096,
            expect_area: 258048,
            label: Some("my label"),
        },
        Case {
            name: "pbkdf2-256-auto512",
            size: 20 * MIB + 512,
            key_bits: 256,
            sector: None,
            pbkdf: fast_pbkdf2(),
            expect_sector: 512,
            expect_area: 131072,
            label: None,
        },
        Case {
            name: "argon2id-256-512",
            size: 20 * MIB,
            key_bits: 256,
            sector: Some(512),
            pbkdf: fast_argon2id(),
            expect_sector: 512,
            expect_area: 131072,
            label: None,
        },
        Case {
            name: "argon2id-512-4096",
            size: 17 * MIB,
            key_bits: 512,
            sector: Some(4096),
            pbkdf: fast_argon2id(),
            expect_sector: 4096,
            expect_area: 258048,
            label: Some("x"),
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let vk: Vec<u8> = (0..c.key_bits / 8).map(|b| (b * 7 + i) as u8).collect();
        let params = FormatParams {
            key_bits: c.key_bits,
            sector_size: c.sector,
            pbkdf: c.pbkdf.clone(),
            label: c.label.map(str::to_string),
            subsystem: c.label.map(|_| "sub system".to_string()),
            volume_key: Some(SecretBytes::from_slice(&vk)),
            keyslot: Some(i),
            ..FormatParams::default()
        };
        let img = format_here(&dir, c.name, c.size, &params, b"format passphrase");
        let dump = cryptsetup_ok(&["luksDump", path(&img)]);
        assert!(
            dump.contains(&format!("sector: {} [bytes]", c.expect_sector)),
            "{}: {dump}",
            c.name
        );
        if let Some(l) = c.label {
            assert!(dump.contains(&format!("Label:         \t{l}\n")), "{dump}");
            assert!(dump.contains("Subsystem:     \tsub system\n"), "{dump}");
        }
        assert_repair_is_a_no_op(&img);
        assert_eq!(cryptsetup_slot(&img, &key, None), Some(i), "{}", c.name);
        assert_eq!(cryptsetup_volume_key(&img, &key), vk, "{}", c.name);

        // The metadata cryptsetup sees, and the layout it would have chosen.
        let json = cryptsetup_json(&img);
        let ks = &json["keyslots"][i.to_string()];
        assert_eq!(ks["area"]["offset"], "32768");
        assert_eq!(ks["area"]["size"], c.expect_area.to_string());
        assert_eq!(ks["area"]["encryption"], "aes-xts-plain64");
        assert_eq!(json["segments"]["0"]["offset"], "16777216");
        assert_eq!(json["segments"]["0"]["size"], "dynamic");
        assert_eq!(json["config"]["json_size"], "12288");
        assert_eq!(json["config"]["keyslots_size"], "16744448");
        assert_eq!(json["digests"]["0"]["keyslots"][0], i.to_string());
        let h = Header::read(&FileStorage::open_read_only(&img).unwrap()).unwrap();
        assert_eq!(h.metadata().to_json(), json, "{}", c.name);
        assert_eq!(unlock_here(&img, b"format passphrase").unwrap().1, vk);
    }
}

/// The keyslots area cryptsetup fills with random bytes: no long runs of zeros are left in it
/// (the data area is not touched: its zeros stay).
#[test]
fn format_wipes_the_keyslots_area_only() {
    let dev = MemStorage::new(vec![0xAB; (17 * MIB) as usize]);
    luks2::format(&dev, &fast_params(), b"p").unwrap();
    let bytes = dev.contents();
    let area = &bytes[32768 + 258048..(16 * MIB) as usize];
    assert!(area.chunks(4096).all(|c| c.iter().any(|&b| b != 0)));
    assert!(area.chunks(4096).all(|c| c.iter().any(|&b| b != 0xAB)));
    assert!(bytes[(16 * MIB) as usize..].iter().all(|&b| b == 0xAB));
    // Between the JSON text and the end of the secondary copy: zeros.
    assert!(bytes[16384 + 4096 + 2000..32768].iter().all(|&b| b == 0));
}

/// Keyslots added, changed and killed here and keyslots cryptsetup adds, seen by both.
#[test]
fn keyslot_changes_interoperate() {
    let dir = scratch("luks2-write-keyslots");
    let k0 = key_file(&dir, "k0", "zero");
    let k1 = key_file(&dir, "k1", "one");
    let k2 = key_file(&dir, "k2", "two");
    let k3 = key_file(&dir, "k3", "three");
    let img = format_here(&dir, "v", 20 * MIB, &fast_params(), b"zero");
    let vk = cryptsetup_volume_key(&img, &k0);

    // Added here (Argon2id) -> cryptsetup opens it.
    let dev = FileStorage::open(&img).unwrap();
    let mut h = Header::read(&dev).unwrap();
    let slot = h
        .add_keyslot(&dev, &vk, b"one", None, &fast_argon2id())
        .unwrap();
    assert_eq!(slot, 1);
    assert_eq!(h.seqid(), 2);
    assert_eq!(cryptsetup_slot(&img, &k1, None), Some(1));
    assert_repair_is_a_no_op(&img);
    let json = cryptsetup_json(&img);
    assert_eq!(json["keyslots"]["1"]["area"]["offset"], "290816");
    assert_eq!(json["keyslots"]["1"]["kdf"]["type"], "argon2id");
    assert_eq!(
        json["digests"]["0"]["keyslots"],
        serde_json::json!(["0", "1"])
    );
    // A wrong volume key is refused before anything is written.
    let mut wrong = vk.clone();
    wrong[0] ^= 1;
    assert!(h
        .add_keyslot(&dev, &wrong, b"x", None, &fast_pbkdf2())
        .is_err());
    assert!(h
        .add_keyslot(&dev, &vk, b"x", Some(1), &fast_pbkdf2())
        .is_err());
    assert_eq!(h.seqid(), 2);

    // Added by cryptsetup -> opens here.
    add_key(&img, &k0, &k2, FAST_PBKDF2);
    assert_eq!(unlock_here(&img, b"two"), Some((2, vk.clone())));

    // Killed here -> cryptsetup no longer opens it, the others still do.
    let mut h = Header::read(&dev).unwrap();
    h.kill_keyslot(&dev, 0).unwrap();
    assert_eq!(cryptsetup_slot(&img, &k0, None), None);
    assert_eq!(cryptsetup_slot(&img, &k2, None), Some(2));
    assert!(h.kill_keyslot(&dev, 0).is_err());
    assert_repair_is_a_no_op(&img);

    // Changed here: slot 2's passphrase moves to the first free slot (0).
    let new = h
        .change_keyslot(&dev, 2, &vk, b"three", &fast_pbkdf2())
        .unwrap();
    assert_eq!(new, 0);
    assert_eq!(cryptsetup_slot(&img, &k2, None), None);
    assert_eq!(cryptsetup_slot(&img, &k3, None), Some(0));
    assert_eq!(cryptsetup_slot(&img, &k1, None), Some(1));
    assert_eq!(cryptsetup_volume_key(&img, &k3), vk);
    assert_repair_is_a_no_op(&img);

    // Killed by cryptsetup -> gone here.
    cryptsetup_ok(&["luksKillSlot", "-q", path(&img), "1"]);
    assert_eq!(unlock_here(&img, b"one"), None);
    assert_eq!(unlock_here(&img, b"three"), Some((0, vk)));
}

/// A backup made here is byte for byte cryptsetup's, and restores with cryptsetup; one made by
/// cryptsetup restores here. Mismatched layouts are refused before anything is written.
#[test]
fn header_backup_and_restore_interoperate() {
    let dir = scratch("luks2-write-backup");
    let k0 = key_file(&dir, "k0", "zero");
    let k1 = key_file(&dir, "k1", "one");
    let img = format_here(&dir, "v", 20 * MIB, &fast_params(), b"zero");
    let vk = cryptsetup_volume_key(&img, &k0);
    let dev = FileStorage::open(&img).unwrap();

    let ours = Header::backup(&dev).unwrap();
    let theirs_path = dir.join("theirs.bak");
    cryptsetup_ok(&[
        "luksHeaderBackup",
        path(&img),
        "--header-backup-file",
        path(&theirs_path),
    ]);
    let theirs = std::fs::read(&theirs_path).unwrap();
    assert!(ours == theirs, "our backup differs from cryptsetup's");
    let ours_path = dir.join("ours.bak");
    std::fs::write(&ours_path, &ours).unwrap();

    // Change the volume, then restore our backup with cryptsetup: passphrase "zero" is back.
    let mut h = Header::read(&dev).unwrap();
    h.add_keyslot(&dev, &vk, b"one", None, &fast_pbkdf2())
        .unwrap();
    h.kill_keyslot(&dev, 0).unwrap();
    assert_eq!(cryptsetup_slot(&img, &k0, None), None);
    cryptsetup_ok(&[
        "luksHeaderRestore",
        "-q",
        path(&img),
        "--header-backup-file",
        path(&ours_path),
    ]);
    assert_eq!(cryptsetup_slot(&img, &k0, None), Some(0));
    assert_eq!(cryptsetup_slot(&img, &k1, None), None);

    // Change it again here, then restore cryptsetup's backup here.
    let mut h = Header::read(&dev).unwrap();
    h.add_keyslot(&dev, &vk, b"one", None, &fast_pbkdf2())
        .unwrap();
    h.kill_keyslot(&dev, 0).unwrap();
    let backup = FileStorage::open_read_only(&theirs_path).unwrap();
    let plan = Header::check_restore(&dev, &backup).unwrap();
    assert!(plan.device_has_luks2 && !plan.different_uuid);
    let restored = plan.apply(&dev).unwrap();
    assert_eq!(restored.seqid(), 1);
    assert!(
        header_bytes(&img) == theirs,
        "the restore wrote the backup's bytes"
    );
    assert_eq!(cryptsetup_slot(&img, &k0, None), Some(0));
    assert_eq!(cryptsetup_slot(&img, &k1, None), None);
    assert_repair_is_a_no_op(&img);

    // A backup with another data offset is refused, and nothing is written.
    let other = format_here(
        &dir,
        "other",
        20 * MIB,
        &FormatParams {
            pbkdf: fast_pbkdf2(),
            keyslots_size: Some(8 * MIB),
            ..FormatParams::default()
        },
        b"zero",
    );
    let before = header_bytes(&img);
    let other_backup =
        MemStorage::new(Header::backup(&FileStorage::open_read_only(&other).unwrap()).unwrap());
    assert!(Header::restore(&dev, &other_backup).is_err());
    assert!(header_bytes(&img) == before);
    // Not a LUKS header at all: refused.
    let junk = MemStorage::new(vec![0u8; (16 * MIB) as usize]);
    assert!(Header::restore(&dev, &junk).is_err());
    assert!(header_bytes(&img) == before);
    // Another volume of the same layout: allowed, but reported.
    let third = format_here(&dir, "third", 20 * MIB, &fast_params(), b"zero");
    let third_backup =
        MemStorage::new(Header::backup(&FileStorage::open_read_only(&third).unwrap()).unwrap());
    assert!(
        Header::check_restore(&dev, &third_backup)
            .unwrap()
            .different_uuid
    );
}

/// Detached header: the data segment starts at 0 and cryptsetup accepts the header file.
#[test]
fn detached_header_format() {
    let dir = scratch("luks2-write-detached");
    let key = key_file(&dir, "pass", "p");
    let params = FormatParams {
        pbkdf: fast_pbkdf2(),
        detached_header: true,
        data_device_size: Some(8 * MIB),
        ..FormatParams::default()
    };
    let img = format_here(&dir, "hdr", 16 * MIB, &params, b"p");
    let json = cryptsetup_json(&img);
    assert_eq!(json["segments"]["0"]["offset"], "0");
    assert_eq!(json["segments"]["0"]["sector_size"], 4096);
    assert_eq!(cryptsetup_slot(&img, &key, None), Some(0));
}

/// Refusals before anything is written: sizes, UUIDs, labels, key sizes.
#[test]
fn format_refuses_bad_parameters() {
    let base = FormatParams {
        pbkdf: fast_pbkdf2(),
        ..FormatParams::default()
    };
    let bad = [
        FormatParams {
            uuid: Some("not-a-uuid".into()),
            ..base.clone()
        },
        FormatParams {
            label: Some("x".repeat(48)),
            ..base.clone()
        },
        FormatParams {
            key_bits: 200,
            ..base.clone()
        },
        FormatParams {
            sector_size: Some(1000),
            ..base.clone()
        },
        FormatParams {
            metadata_size: Some(20000),
            ..base.clone()
        },
        FormatParams {
            keyslot: Some(32),
            ..base.clone()
        },
    ];
    for p in &bad {
        let dev = MemStorage::new(vec![7; (17 * MIB) as usize]);
        assert!(luks2::format(&dev, p, b"p").is_err(), "{p:?}");
        assert!(dev.contents().iter().all(|&b| b == 7), "{p:?} wrote");
    }
    let small = MemStorage::new(vec![0; (16 * MIB) as usize]);
    assert!(luks2::format(&small, &base, b"p").is_err());
    let dev = MemStorage::new(vec![0; (17 * MIB) as usize]);
    let (h, _) = luks2::format(
        &dev,
        &FormatParams {
            uuid: Some("0C1A2B3C-4D5E-6F70-8192-A3B4C5D6E7F8".into()),
            ..base
        },
        b"p",
    )
    .unwrap();
    assert_eq!(h.uuid(), "0c1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8");
}

/// Calibration stays within cryptsetup's bounds, and a keyslot made with the benchmarked cost
/// opens (here and in cryptsetup). No timing is asserted.
#[test]
fn calibration_is_sane_and_usable() {
    let n = kdf::calibrate_pbkdf2(Hash::Sha256, 64, 50).unwrap();
    assert!(n >= 1000);
    let (t, m) = kdf::calibrate_argon2(Argon2Variant::Argon2id, 50, 64 * 1024, 0).unwrap();
    assert!(t >= 4);
    assert!((32..=64 * 1024).contains(&m), "{m}");
    if let Some(half) = kdf::half_available_memory_kib() {
        assert!(u64::from(m) <= half);
    }
    let dir = scratch("luks2-write-calibrated");
    let key = key_file(&dir, "pass", "calibrated");
    let params = FormatParams {
        pbkdf: Pbkdf {
            iter_time_ms: 50,
            memory_kib: 64 * 1024,
            ..Pbkdf::default()
        },
        ..FormatParams::default()
    };
    let img = format_here(&dir, "v", 17 * MIB, &params, b"calibrated");
    assert!(unlock_here(&img, b"calibrated").is_some());
    assert_eq!(cryptsetup_slot(&img, &key, None), Some(0));
    let json = cryptsetup_json(&img);
    let kdf = &json["keyslots"]["0"]["kdf"];
    assert_eq!(kdf["type"], "argon2id");
    assert!(kdf["time"].as_u64().unwrap() >= 4);
    assert!(kdf["memory"].as_u64().unwrap() <= 64 * 1024);
    assert!(json["digests"]["0"]["iterations"].as_u64().unwrap() >= 1000);
}
