//! LUKS2 against the real cryptsetup 2.6: volumes it formats open to the volume key it reports,
//! headers read to the UUID, label, metadata and luksDump text it shows, keyslots are tried in
//! its order, and damaged or hand-edited headers are accepted or refused as it accepts or
//! refuses them (each refusal with its own error, never a panic).
//!
//! cryptsetup runs on regular image files (no root or device-mapper needed), passphrases reach it
//! only through key files, and the KDF costs are the smallest it allows, so the tests stay fast.

use std::path::{Path, PathBuf};

use crate::luks2_support::*;
use sectorcrypt_luks::luks2::binary::HeaderCopy;
use sectorcrypt_luks::luks2::{CopyState, Header};
use sectorcrypt_luks::Error;
use sectorcrypt_storage::{FileStorage, MemStorage, Storage};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

fn open(img: &Path) -> FileStorage {
    FileStorage::open_read_only(img).unwrap()
}

fn read(img: &Path) -> Header {
    Header::read(&open(img)).unwrap_or_else(|e| panic!("{}: {e}", img.display()))
}

fn read_bytes(bytes: &[u8]) -> Result<Header, Error> {
    Header::read(&MemStorage::new(bytes.to_vec()))
}

fn unlock_bytes(bytes: &[u8], pass: &[u8], slot: Option<usize>) -> Result<usize, Error> {
    let dev = MemStorage::new(bytes.to_vec());
    let h = Header::read(&dev)?;
    h.unlock(&dev, pass, slot).map(|u| u.slot)
}

fn corrupt_text(r: Result<Header, Error>) -> String {
    match r {
        Err(Error::Corrupt(why)) => why,
        Err(e) => panic!("expected Error::Corrupt, got {e:?}"),
        Ok(_) => panic!("expected Error::Corrupt, the header was accepted"),
    }
}

/// The JSON text stored in the primary copy's JSON area.
fn stored_json_text(img: &Path) -> String {
    let bytes = std::fs::read(img).unwrap();
    let area = &bytes[4096..hdr_size(&bytes)];
    let end = area.iter().position(|&b| b == 0).unwrap();
    String::from_utf8(area[..end].to_vec()).unwrap()
}

/// Whether serde_json keeps object keys in document order (its `preserve_order` feature). Only
/// then do objects kept as raw JSON (tokens, unknown keyslot types) serialise back byte for byte;
/// without it their keys come out sorted, the same JSON with other bytes.
fn json_keeps_key_order() -> bool {
    let text = r#"{"b":0,"a":0}"#;
    let value: Value = serde_json::from_str(text).unwrap();
    serde_json::to_string(&value).unwrap() == text
}

/// The model serialises back to the JSON text stored on disk: byte for byte where serde_json can
/// keep key order, as the same JSON otherwise.
fn assert_round_trip(h: &Header, img: &Path, what: &str) {
    let ours = h.metadata().to_json_text();
    let stored = stored_json_text(img);
    if json_keeps_key_order() {
        assert_eq!(ours, stored, "{what}: round trip");
    } else {
        let parse = |t: &str| serde_json::from_str::<Value>(t).unwrap();
        assert_eq!(parse(&ours), parse(&stored), "{what}: round trip");
    }
}

/// `format`s image `v` with a `keyslots`-sized keyslots area (e.g. "1M") and `options` (the KDF
/// first): a small volume whose keyslots all fit, whatever the KDF.
fn format_v(dir: &Path, key: &Path, size: u64, keyslots: &str, options: &[&str]) -> PathBuf {
    let area = ["--luks2-keyslots-size", keyslots];
    format(dir, "v", key, size, &[options, &area].concat())
}

/// `add_key` into keyslot `slot`, with the KDF options `kdf`.
fn add_key_in_slot(img: &Path, old: &Path, new: &Path, kdf: &[&str], slot: &str) {
    add_key(img, old, new, &[kdf, &["--key-slot", slot]].concat());
}

/// `cryptsetup config --priority` (prefer, normal or ignore) for keyslot `slot`.
fn set_priority(img: &Path, slot: &str, priority: &str) {
    cryptsetup_ok(&[
        "config",
        "--priority",
        priority,
        "--key-slot",
        slot,
        path(img),
    ]);
}

/// Every format variant: the volume key equals cryptsetup's, the UUID equals `luksUUID`, the
/// metadata equals `--dump-json-metadata`, the typed model serialises back to the very bytes
/// cryptsetup stored, the dump equals `luksDump` byte for byte, the data segment is the one in
/// the metadata, and a wrong passphrase is `WrongPassphrase`.
#[test]
fn formats_open_and_read_like_cryptsetup() {
    let dir = scratch("luks2-formats");
    let ks = ["--luks2-keyslots-size", "1M"];
    let cases: Vec<(&str, u64, Vec<&str>)> = vec![
        // cryptsetup's default layout: 16 MiB of header and keyslots.
        ("pbkdf2-default-layout", 17 * MIB, FAST_PBKDF2.to_vec()),
        ("argon2id", 4 * MIB, [FAST_ARGON2ID, &ks].concat()),
        (
            "argon2i-512-sectors-256-bit",
            4 * MIB,
            [
                FAST_ARGON2I,
                &ks,
                &["--sector-size", "512", "--key-size", "256"],
            ]
            .concat(),
        ),
        (
            "pbkdf2-4096-sectors-512-bit",
            4 * MIB,
            [
                FAST_PBKDF2,
                &ks,
                &["--sector-size", "4096", "--key-size", "512"],
            ]
            .concat(),
        ),
        (
            "cbc-essiv-sha512",
            4 * MIB,
            [
                FAST_PBKDF2,
                &ks,
                &[
                    "--cipher",
                    "aes-cbc-essiv:sha256",
                    "--key-size",
                    "256",
                    "--hash",
                    "sha512",
                ],
            ]
            .concat(),
        ),
        (
            "sha1",
            4 * MIB,
            [FAST_PBKDF2, &ks, &["--hash", "sha1"]].concat(),
        ),
        (
            "label-subsystem-uuid",
            4 * MIB,
            [
                FAST_ARGON2ID,
                &ks,
                &[
                    "--label",
                    "my volume",
                    "--subsystem",
                    "sub/system",
                    "--uuid",
                    "12345678-9abc-def0-1234-56789abcdef0",
                ],
            ]
            .concat(),
        ),
        (
            "metadata-64k-keyslots-2m",
            6 * MIB,
            [
                FAST_PBKDF2,
                &[
                    "--luks2-metadata-size",
                    "64k",
                    "--luks2-keyslots-size",
                    "2M",
                ],
            ]
            .concat(),
        ),
        (
            "metadata-4m",
            16 * MIB,
            [
                FAST_PBKDF2,
                &["--luks2-metadata-size", "4M", "--luks2-keyslots-size", "1M"],
            ]
            .concat(),
        ),
    ];
    for (name, size, extra) in cases {
        let key = key_file(&dir, name, &format!("passphrase of {name}\n"));
        let img = format(&dir, name, &key, size, &extra);
        let dev = open(&img);
        let h = read(&img);

        let unlocked = h
            .unlock(&dev, format!("passphrase of {name}\n").as_bytes(), None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(unlocked.slot, 0, "{name}");
        assert_eq!(
            &unlocked.volume_key[..],
            &cryptsetup_volume_key(&img, &key)[..],
            "{name}: volume key"
        );
        let again = h
            .unlock(&dev, format!("passphrase of {name}\n").as_bytes(), Some(0))
            .unwrap();
        assert_eq!(again.volume_key[..], unlocked.volume_key[..], "{name}");
        assert!(
            matches!(
                h.unlock(&dev, format!("passphrase of {name}").as_bytes(), None),
                Err(Error::WrongPassphrase)
            ),
            "{name}: a passphrase without its newline is wrong"
        );

        assert_eq!(
            h.uuid(),
            cryptsetup_ok(&["luksUUID", path(&img)]).trim_end(),
            "{name}"
        );
        if name == "label-subsystem-uuid" {
            assert_eq!(h.label(), "my volume");
            assert_eq!(h.subsystem(), "sub/system");
            assert_eq!(h.uuid(), "12345678-9abc-def0-1234-56789abcdef0");
        } else {
            assert_eq!((h.label(), h.subsystem()), ("", ""), "{name}");
        }

        let cs_json = cryptsetup_json(&img);
        assert_eq!(h.metadata().to_json(), cs_json, "{name}: metadata");
        assert_eq!(
            h.metadata().to_json_text(),
            stored_json_text(&img),
            "{name}: serialising the model gives cryptsetup's bytes"
        );
        assert_eq!(
            h.dump_text(),
            cryptsetup_ok(&["luksDump", path(&img)]),
            "{name}: luksDump text"
        );

        let seg = h.data_segment().unwrap();
        let s0 = &cs_json["segments"]["0"];
        assert_eq!(
            seg.offset.to_string(),
            s0["offset"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(seg.size, None, "{name}");
        assert_eq!(seg.cipher, s0["encryption"].as_str().unwrap(), "{name}");
        assert_eq!(
            u64::from(seg.sector_size),
            s0["sector_size"].as_u64().unwrap()
        );
        assert_eq!(seg.iv_tweak, 0);

        let health = h.health();
        assert_eq!(
            health.primary,
            CopyState::Valid { seqid: h.seqid() },
            "{name}"
        );
        assert_eq!(
            health.secondary,
            CopyState::Valid { seqid: h.seqid() },
            "{name}"
        );
        assert_eq!(health.secondary_offset, Some(h.metadata_size()), "{name}");
        assert_eq!(health.in_use, HeaderCopy::Primary);
        assert!(!health.needs_repair());

        let j = h.dump_json();
        assert_eq!(j["uuid"], h.uuid(), "{name}");
        assert_eq!(j["version"], 2);
        assert_eq!(j["seqid"], h.seqid());
        assert_eq!(j["hdr_size"], h.metadata_size());
        assert_eq!(j["checksum_alg"], "sha256");
        assert_eq!(j["salt"].as_str().unwrap().len(), 128);
        assert_eq!(j["checksum"].as_str().unwrap().len(), 64);
        assert_eq!(j["keyslots"], cs_json["keyslots"]);
        std::fs::remove_file(&img).unwrap();
    }
}

/// Keyslots added with luksAddKey (a default slot, slot 7 with Argon2i, an unbound slot) open
/// with their own passphrases and give the same volume key; slots are tried in cryptsetup's
/// priority order, as `cryptsetup open --test-passphrase` confirms for every case.
#[test]
fn added_keyslots_and_priorities_follow_cryptsetup() {
    let dir = scratch("luks2-keyslots");
    let k0 = key_file(&dir, "k0", "first passphrase");
    let k1 = key_file(&dir, "k1", "second passphrase");
    let k7 = key_file(&dir, "k7", "seventh passphrase");
    let img = format_v(&dir, &k0, 6 * MIB, "2M", FAST_PBKDF2);
    add_key(&img, &k0, &k1, FAST_ARGON2ID);
    add_key_in_slot(&img, &k0, &k7, FAST_ARGON2I, "7");
    // The same passphrase as slot 0 in slot 2, to see which of the two is tried first.
    add_key_in_slot(&img, &k0, &k0, FAST_PBKDF2, "2");

    let dev = open(&img);
    let check = |h: &Header, key: &Path, pass: &str, slot: Option<usize>| {
        let ours = h.unlock(&dev, pass.as_bytes(), slot).map(|u| u.slot).ok();
        assert_eq!(
            ours,
            cryptsetup_slot(&img, key, slot),
            "passphrase {pass:?}, slot {slot:?}"
        );
        ours
    };
    let h = read(&img);
    let vk = cryptsetup_volume_key(&img, &k0);
    for (key, pass, slot) in [
        (&k0, "first passphrase", 0),
        (&k1, "second passphrase", 1),
        (&k7, "seventh passphrase", 7),
    ] {
        let u = h.unlock(&dev, pass.as_bytes(), None).unwrap();
        assert_eq!(u.slot, slot);
        assert_eq!(&u.volume_key[..], &vk[..], "slot {slot}");
        assert_eq!(check(&h, key, pass, None), Some(slot));
    }
    assert_eq!(check(&h, &k0, "first passphrase", Some(2)), Some(2));
    assert!(matches!(
        h.unlock(&dev, b"first passphrase", Some(7)),
        Err(Error::WrongPassphrase)
    ));
    assert_eq!(check(&h, &k0, "first passphrase", Some(7)), None);
    // An unused slot number: cryptsetup says "No usable keyslot is available".
    assert!(matches!(
        h.unlock(&dev, b"first passphrase", Some(5)),
        Err(Error::NoUsableKeyslot(_))
    ));
    assert_eq!(check(&h, &k0, "first passphrase", Some(5)), None);

    // Preferred slots first: slot 2 now opens before slot 0.
    set_priority(&img, "2", "prefer");
    let h = read(&img);
    assert_eq!(check(&h, &k0, "first passphrase", None), Some(2));
    // Ignored slots only when asked for by number.
    set_priority(&img, "2", "ignore");
    set_priority(&img, "0", "ignore");
    let h = read(&img);
    assert_eq!(check(&h, &k0, "first passphrase", None), None);
    assert!(matches!(
        h.unlock(&dev, b"first passphrase", None),
        Err(Error::WrongPassphrase)
    ));
    assert_eq!(check(&h, &k0, "first passphrase", Some(0)), Some(0));
    assert_eq!(check(&h, &k7, "seventh passphrase", None), Some(7));
    assert_eq!(h.dump_text(), cryptsetup_ok(&["luksDump", path(&img)]));

    // An unbound keyslot holds another key: never used to open the data segment.
    let ku = key_file(&dir, "ku", "unbound passphrase");
    cryptsetup_ok(&[
        "luksAddKey",
        "-q",
        "--unbound",
        "--key-size",
        "256",
        "--key-slot",
        "4",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        path(&img),
        path(&ku),
    ]);
    let h = read(&img);
    assert_eq!(check(&h, &ku, "unbound passphrase", None), None);
    assert!(h.unlock(&dev, b"unbound passphrase", Some(4)).is_err());
    assert!(h.dump_text().contains("  4: luks2 (unbound)\n"));
    assert_eq!(h.dump_text(), cryptsetup_ok(&["luksDump", path(&img)]));
}

/// Tokens, flags, requirements, unknown fields and types, a reencrypt-free but decorated
/// header: luksDump's text, byte for byte.
#[test]
fn dump_matches_luksdump_for_decorated_headers() {
    let dir = scratch("luks2-dump");
    let k0 = key_file(&dir, "k0", "pass 0");
    let k1 = key_file(&dir, "k1", "pass 1");
    let options = [FAST_ARGON2ID, &["--label", "L"]].concat();
    let img = format_v(&dir, &k0, 4 * MIB, "1M", &options);
    add_key_in_slot(&img, &k0, &k1, FAST_PBKDF2, "3");
    cryptsetup_ok(&["token", "add", "--key-description", "my key", path(&img)]);
    set_priority(&img, "3", "prefer");
    let h = read(&img);
    assert_eq!(h.metadata().tokens.len(), 1);
    assert_round_trip(&h, &img, "token");
    assert_eq!(h.dump_text(), cryptsetup_ok(&["luksDump", path(&img)]));

    // Hand-made additions cryptsetup accepts: persistent flags, a token of a type it has no
    // handler for, segment flags, unknown fields everywhere.
    let mut bytes = std::fs::read(&img).unwrap();
    edit_json(&mut bytes, |v| {
        v["config"]["flags"] = json!(["allow-discards", "no-read-workqueue"]);
        v["config"]["future"] = json!({"a": 1});
        v["tokens"]["5"] =
            json!({"type": "x-sectorcrypt-test", "keyslots": ["0", "3"], "x": [1, 2]});
        v["segments"]["0"]["flags"] = json!(["some-flag", "other"]);
        v["keyslots"]["0"]["unknown"] = json!("kept");
        v["digests"]["0"]["more"] = json!(null);
        v["extra-top"] = json!(true);
    });
    let h = read_bytes(&bytes).unwrap();
    let cs = cryptsetup_dump(&dir, &bytes).expect("cryptsetup accepts the additions");
    assert_eq!(h.dump_text(), cs);
    assert!(cs.contains("allow-discards no-read-workqueue \n"));
    assert_eq!(h.metadata().extra["extra-top"], json!(true));

    // An unknown mandatory requirement: cryptsetup still dumps it.
    edit_json(&mut bytes, |v| {
        v["config"]["requirements"] = json!({"mandatory": ["future-feature"]});
    });
    let h = read_bytes(&bytes).unwrap();
    let cs = cryptsetup_dump(&dir, &bytes).expect("cryptsetup dumps unknown requirements");
    assert_eq!(h.dump_text(), cs);
    assert!(matches!(h.data_segment(), Err(Error::Unsupported(_))));
}

/// Makes a two-keyslot volume (slot 0 "pass 0", slot 1 "pass 1") and returns its bytes.
fn two_slot_volume(dir: &Path, extra: &[&str]) -> Vec<u8> {
    let k0 = key_file(dir, "k0", "pass 0");
    let k1 = key_file(dir, "k1", "pass 1");
    let img = format(
        dir,
        "base",
        &k0,
        4 * MIB,
        &[FAST_PBKDF2, &["--luks2-keyslots-size", "1M"], extra].concat(),
    );
    add_key(&img, &k0, &k1, FAST_PBKDF2);
    let bytes = std::fs::read(&img).unwrap();
    std::fs::remove_file(&img).unwrap();
    bytes
}

/// Damage to one copy: the other is used and the damage reported; to both: `Corrupt` naming
/// both; no magic anywhere: `NotLuks`. cryptsetup agrees on what can be read each time.
#[test]
fn damaged_copies_fall_back_or_fail_like_cryptsetup() {
    let dir = scratch("luks2-copies");
    for metadata in ["16k", "64k"] {
        let good = two_slot_volume(&dir, &["--luks2-metadata-size", metadata]);
        let size = hdr_size(&good);
        let good_header = read_bytes(&good).unwrap();

        // The primary's JSON area padding: only the checksum notices.
        let mut bad1 = good.clone();
        bad1[size - 100] ^= 0x55;
        let h = read_bytes(&bad1).expect("the secondary copy is used");
        assert!(cryptsetup_dump(&dir, &bad1).is_some(), "{metadata}");
        assert!(matches!(&h.health().primary, CopyState::Damaged(why) if why.contains("checksum")));
        assert_eq!(h.health().secondary, CopyState::Valid { seqid: h.seqid() });
        assert_eq!(h.health().in_use, HeaderCopy::Secondary);
        // With the primary's size untrustworthy, the secondary was found by searching.
        assert_eq!(h.health().secondary_offset, Some(size as u64));
        assert!(h.health().needs_repair());
        assert_eq!(h.uuid(), good_header.uuid());
        assert_eq!(h.metadata(), good_header.metadata());
        assert_eq!(unlock_bytes(&bad1, b"pass 1", None).unwrap(), 1);

        // The primary's binary header (its magic): the same, but no primary at all.
        let mut nomagic1 = good.clone();
        nomagic1[0] = b'X';
        let h = read_bytes(&nomagic1).unwrap();
        assert_eq!(h.health().primary, CopyState::Missing);
        assert_eq!(h.health().in_use, HeaderCopy::Secondary);
        assert!(cryptsetup_dump(&dir, &nomagic1).is_some());

        // The secondary: the primary is used.
        let mut bad2 = good.clone();
        bad2[size + 5000] ^= 1;
        let h = read_bytes(&bad2).unwrap();
        assert!(cryptsetup_dump(&dir, &bad2).is_some());
        assert_eq!(h.health().in_use, HeaderCopy::Primary);
        assert!(
            matches!(&h.health().secondary, CopyState::Damaged(why) if why.contains("checksum"))
        );
        assert!(h.health().needs_repair());
        assert_eq!(unlock_bytes(&bad2, b"pass 0", None).unwrap(), 0);

        // Both checksums: unusable, with both reasons.
        let mut both = bad1.clone();
        both[size + 5000] ^= 1;
        let why = corrupt_text(read_bytes(&both));
        assert!(
            why.contains("primary") && why.contains("secondary"),
            "{why}"
        );
        assert!(cryptsetup_dump(&dir, &both).is_none());

        // Both magics: not LUKS at all.
        let mut nomagic = good.clone();
        nomagic[0] = b'X';
        nomagic[size] = b'X';
        assert!(matches!(read_bytes(&nomagic), Err(Error::NotLuks { .. })));
        assert!(cryptsetup_dump(&dir, &nomagic).is_none());
    }
}

/// A newer secondary copy (an update interrupted after the secondary was written... or before
/// the primary was) wins by its sequence number, as in cryptsetup.
#[test]
fn the_copy_with_the_higher_seqid_wins() {
    let dir = scratch("luks2-seqid");
    let mut bytes = two_slot_volume(&dir, &[]);
    let size = hdr_size(&bytes);
    let seqid = u64::from_be_bytes(bytes[16..24].try_into().unwrap());
    // The secondary: one update later, with a label.
    bytes[size + 16..size + 24].copy_from_slice(&(seqid + 1).to_be_bytes());
    bytes[size + 24..size + 29].copy_from_slice(b"newer");
    reseal(&mut bytes, size);
    let h = read_bytes(&bytes).unwrap();
    assert_eq!(h.health().in_use, HeaderCopy::Secondary);
    assert_eq!(h.health().primary, CopyState::Valid { seqid });
    assert_eq!(h.health().secondary, CopyState::Valid { seqid: seqid + 1 });
    assert!(h.health().needs_repair());
    assert_eq!((h.label(), h.seqid()), ("newer", seqid + 1));
    assert_eq!(h.dump_text(), cryptsetup_dump(&dir, &bytes).unwrap());
}

/// Truncated images: from the empty file (not LUKS) to one missing only the end of the keyslots
/// area (the device is smaller than the header says): each refused, as by cryptsetup.
#[test]
fn truncated_images_are_refused() {
    let dir = scratch("luks2-truncated");
    let good = two_slot_volume(&dir, &[]);
    let end = read_bytes(&good).unwrap().hdr_and_areas_size() as usize;
    for len in [
        0,
        5,
        7,
        100,
        4095,
        4096,
        10000,
        16384,
        20000,
        32768,
        100_000,
        end - 1,
    ] {
        let r = read_bytes(&good[..len]);
        match len {
            0 | 5 => assert!(matches!(r, Err(Error::NotLuks { .. })), "{len}: {r:?}"),
            _ => {
                let why = corrupt_text(r);
                if len > 32768 {
                    assert!(why.contains("need"), "{len}: {why}");
                }
            }
        }
        assert!(cryptsetup_dump(&dir, &good[..len]).is_none(), "{len}");
    }
    // Exactly the header and keyslots, no data (a luksHeaderBackup file): fine for both.
    assert!(read_bytes(&good[..end]).is_ok());
    assert!(cryptsetup_dump(&dir, &good[..end]).is_some());
}

/// One hand-made edit of the JSON metadata (in both copies, checksums made right again).
struct Edit {
    name: &'static str,
    edit: fn(&mut Value),
    /// What cryptsetup does: accept (`true`) or refuse.
    cryptsetup_accepts: bool,
    /// A fragment of our error message when we refuse (None: we accept).
    refusal: Option<&'static str>,
}

/// JSON metadata edits: accepted where cryptsetup accepts them, refused with a precise reason
/// where it refuses them. The one deliberate difference is flagged in its case.
#[test]
fn json_edits_are_judged_like_cryptsetup() {
    let dir = scratch("luks2-edits");
    let good = two_slot_volume(&dir, &[]);
    let edits = [
        Edit {
            name: "json_size not a header size",
            edit: |v| v["config"]["json_size"] = json!("12000"),
            cryptsetup_accepts: false,
            refusal: Some("header size"),
        },
        Edit {
            name: "keyslot area past the keyslots area",
            edit: |v| v["keyslots"]["1"]["area"]["offset"] = json!("1306624"),
            cryptsetup_accepts: false,
            refusal: Some("past the end of the keyslots area"),
        },
        Edit {
            name: "keyslot area inside the header copies",
            edit: |v| v["keyslots"]["0"]["area"]["offset"] = json!("16384"),
            cryptsetup_accepts: false,
            refusal: Some("inside the header copies"),
        },
        Edit {
            name: "overlapping keyslot areas",
            edit: |v| {
                v["keyslots"]["1"]["area"]["offset"] = v["keyslots"]["0"]["area"]["offset"].clone()
            },
            cryptsetup_accepts: false,
            refusal: Some("overlap"),
        },
        Edit {
            name: "keyslots area reaching into the data",
            edit: |v| v["config"]["keyslots_size"] = json!("4194304"),
            cryptsetup_accepts: false,
            refusal: Some("data offset"),
        },
        Edit {
            name: "keyslot in two digests",
            edit: |v| {
                let mut d = v["digests"]["0"].clone();
                d["segments"] = json!([]);
                v["digests"]["1"] = d;
            },
            cryptsetup_accepts: false,
            refusal: Some("belongs to 2 digests"),
        },
        Edit {
            name: "digest naming a missing keyslot",
            edit: |v| v["digests"]["0"]["keyslots"] = json!(["0", "1", "9"]),
            cryptsetup_accepts: false,
            refusal: Some("keyslot \"9\""),
        },
        Edit {
            name: "crypt segment without a digest",
            edit: |v| v["digests"]["0"]["segments"] = json!([]),
            cryptsetup_accepts: false,
            refusal: Some("no key digest"),
        },
        Edit {
            name: "sector size not a multiple of 512",
            edit: |v| v["segments"]["0"]["sector_size"] = json!(1000),
            cryptsetup_accepts: false,
            refusal: Some("sector size"),
        },
        Edit {
            name: "size as a number instead of a string",
            edit: |v| v["keyslots"]["0"]["area"]["size"] = json!(258048),
            cryptsetup_accepts: false,
            refusal: Some("\"size\""),
        },
        Edit {
            name: "no segments",
            edit: |v| {
                v["segments"] = json!({});
                v["digests"]["0"]["segments"] = json!([]);
            },
            cryptsetup_accepts: false,
            refusal: Some("segments section is empty"),
        },
        Edit {
            name: "keyslot without kdf",
            edit: |v| {
                v["keyslots"]["1"].as_object_mut().unwrap().remove("kdf");
            },
            cryptsetup_accepts: false,
            refusal: Some("\"kdf\""),
        },
        Edit {
            name: "unknown af type",
            edit: |v| v["keyslots"]["1"]["af"]["type"] = json!("luks9"),
            cryptsetup_accepts: false,
            refusal: Some("af type"),
        },
        Edit {
            name: "the data segment past the end of the device",
            edit: |v| v["segments"]["0"]["offset"] = json!("1073741824"),
            cryptsetup_accepts: true,
            refusal: None,
        },
        Edit {
            name: "a fixed-size data segment",
            edit: |v| v["segments"]["0"]["size"] = json!("1048576"),
            cryptsetup_accepts: true,
            refusal: None,
        },
        Edit {
            name: "leftover PBKDF2 fields in an Argon2 KDF (repaired, as cryptsetup does)",
            edit: |v| {
                v["keyslots"]["1"]["kdf"] = json!({"type": "argon2id", "time": 4, "memory": 32,
                    "cpus": 1, "salt": v["keyslots"]["1"]["kdf"]["salt"].clone(),
                    "hash": "sha256", "iterations": 1000});
            },
            cryptsetup_accepts: true,
            refusal: None,
        },
        Edit {
            name: "a keyslot of an unknown type",
            edit: |v| v["keyslots"]["1"]["type"] = json!("future"),
            cryptsetup_accepts: true,
            refusal: None,
        },
        Edit {
            name: "a luks2 keyslot with an unknown KDF",
            edit: |v| v["keyslots"]["1"]["kdf"]["type"] = json!("scrypt"),
            cryptsetup_accepts: true,
            refusal: None,
        },
        // The deliberate difference: cryptsetup loads a header whose salt is not base64 and
        // fails only when that keyslot is opened; sectorcrypt validates base64 fields on reading.
        Edit {
            name: "a KDF salt that is not base64",
            edit: |v| v["keyslots"]["1"]["kdf"]["salt"] = json!("not*base64"),
            cryptsetup_accepts: true,
            refusal: Some("base64"),
        },
    ];
    for e in &edits {
        let mut bytes = good.clone();
        edit_json(&mut bytes, e.edit);
        assert_eq!(
            cryptsetup_dump(&dir, &bytes).is_some(),
            e.cryptsetup_accepts,
            "cryptsetup on: {}",
            e.name
        );
        match e.refusal {
            Some(fragment) => {
                let why = corrupt_text(read_bytes(&bytes));
                assert!(why.contains(fragment), "{}: {why}", e.name);
            }
            None => {
                let h = read_bytes(&bytes).unwrap_or_else(|err| panic!("{}: {err}", e.name));
                assert_eq!(
                    h.dump_text(),
                    cryptsetup_dump(&dir, &bytes).unwrap(),
                    "{}: luksDump text",
                    e.name
                );
                assert_eq!(
                    unlock_bytes(&bytes, b"pass 0", None).unwrap(),
                    0,
                    "{}",
                    e.name
                );
            }
        }
    }

    // config.json_size naming another allowed size than the binary header's. Only a smaller
    // claim leaves the keyslot areas outside the claimed header copies, so a 64 KiB header
    // claims 16 KiB (with a larger claim the area check would fail first, in cryptsetup too).
    let mut bytes = two_slot_volume(&dir, &["--luks2-metadata-size", "64k"]);
    edit_json(&mut bytes, |v| v["config"]["json_size"] = json!("12288"));
    assert!(cryptsetup_dump(&dir, &bytes).is_none());
    let why = corrupt_text(read_bytes(&bytes));
    assert!(why.contains("does not match the binary header"), "{why}");
}

/// A keyslot of an unknown type is skipped: the other slot still opens, and asking for it by
/// number finds no usable keyslot (cryptsetup refuses it too).
#[test]
fn unknown_keyslot_types_are_skipped() {
    let dir = scratch("luks2-unknown-type");
    let mut bytes = two_slot_volume(&dir, &[]);
    edit_json(&mut bytes, |v| v["keyslots"]["0"]["type"] = json!("future"));
    let img = dir.join("edited.img");
    std::fs::write(&img, &bytes).unwrap();
    let k0 = key_file(&dir, "k0", "pass 0");
    let k1 = key_file(&dir, "k1", "pass 1");
    assert_eq!(unlock_bytes(&bytes, b"pass 1", None).unwrap(), 1);
    assert_eq!(cryptsetup_slot(&img, &k1, None), Some(1));
    assert!(matches!(
        unlock_bytes(&bytes, b"pass 0", Some(0)),
        Err(Error::NoUsableKeyslot(_))
    ));
    assert_eq!(cryptsetup_slot(&img, &k0, Some(0)), None);
    // Slot 1 is tried and says no; slot 0 is not a candidate.
    assert!(matches!(
        unlock_bytes(&bytes, b"pass 0", None),
        Err(Error::WrongPassphrase)
    ));
    assert_eq!(cryptsetup_slot(&img, &k0, None), None);
}

/// JSON area damage the checksum covers: text that fills the whole area with no terminating NUL
/// ("too large"), bytes after the JSON, a JSON syntax error, a non-object.
#[test]
fn json_area_damage_is_refused() {
    let dir = scratch("luks2-json-area");
    let good = two_slot_volume(&dir, &[]);
    let size = hdr_size(&good);
    let area = size - 4096;
    let text = serde_json::to_string(&json_at(&good, 0)).unwrap();
    let full = format!(
        "{}{}}}",
        &text[..text.len() - 1],
        " ".repeat(area - text.len())
    );
    assert_eq!(full.len(), area);
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("too large", full.into_bytes(), "no terminating NUL"),
        (
            "trailing bytes",
            format!("{text}\0garbage").into_bytes(),
            "non-NUL byte",
        ),
        (
            "syntax error",
            text.as_bytes()[..text.len() - 1].to_vec(),
            "does not parse",
        ),
        ("an array", b"[]".to_vec(), "start with"),
        ("an empty object", b"{}".to_vec(), "\"config\""),
    ];
    for (name, json, fragment) in cases {
        let mut bytes = good.clone();
        put_json_text(&mut bytes, 0, &json);
        put_json_text(&mut bytes, size, &json);
        let why = corrupt_text(read_bytes(&bytes));
        assert!(why.contains(fragment), "{name}: {why}");
        assert!(cryptsetup_dump(&dir, &bytes).is_none(), "{name}");
    }
}

/// A LUKS1 volume is not LUKS2.
#[test]
fn luks1_is_not_luks2() {
    let dir = scratch("luks2-luks1");
    let k = key_file(&dir, "k", "pass");
    let img = format(&dir, "v1", &k, 4 * MIB, &sectorcrypt_testkit::FAST_LUKS1);
    assert!(matches!(
        Header::read(&open(&img)),
        Err(Error::NotLuks { .. })
    ));
}

/// The device name reaches `NotLuks`, and a `Storage` that fails reports `Io`.
#[test]
fn errors_name_the_device() {
    struct Failing;
    impl Storage for Failing {
        fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
            Err(std::io::Error::other("broken disk"))
        }
        fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
            unreachable!()
        }
        fn sync(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            Ok(1 << 20)
        }
        fn name(&self) -> String {
            "failing".into()
        }
    }
    assert!(matches!(Header::read(&Failing), Err(Error::Io { device, .. }) if device == "failing"));
    match Header::read(&MemStorage::new(vec![0; 1 << 16])) {
        Err(e @ Error::NotLuks { .. }) => assert_eq!(e.to_string(), "memory is not a LUKS device"),
        other => panic!("{other:?}"),
    }
}

/// An unfinished reencryption (`cryptsetup reencrypt --init-only`): a reencrypt keyslot, backup
/// segments and the online-reencrypt-v2 requirement. The header reads and dumps like
/// cryptsetup's, opens the same keyslot (the one bound to the `backup-final` segment) to the same
/// key, and refuses to name a data segment.
#[test]
fn unfinished_reencryption_reads_and_opens_like_cryptsetup() {
    let dir = scratch("luks2-reencrypt");
    let k = key_file(&dir, "k", "reencrypt me");
    let img = format_v(&dir, &k, 4 * MIB, "2M", FAST_PBKDF2);
    cryptsetup_ok(
        &[
            &["reencrypt", "--init-only", "-q", "--key-file", path(&k)][..],
            FAST_PBKDF2,
            &[path(&img)],
        ]
        .concat(),
    );
    let dev = open(&img);
    let h = read(&img);
    assert_eq!(h.metadata().keyslots.get(2).unwrap().kind(), "reencrypt");
    assert_eq!(h.dump_text(), cryptsetup_ok(&["luksDump", path(&img)]));
    let cs_json = cryptsetup_json(&img);
    assert_eq!(h.metadata().to_json(), cs_json);
    let u = h.unlock(&dev, b"reencrypt me", None).unwrap();
    assert_eq!(Some(u.slot), cryptsetup_slot(&img, &k, None));
    assert_eq!(&u.volume_key[..], &cryptsetup_volume_key(&img, &k)[..]);
    assert!(matches!(h.data_segment(), Err(Error::Unsupported(_))));
    assert_round_trip(&h, &img, "reencrypt");
}
