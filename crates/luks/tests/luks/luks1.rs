//! LUKS1 against the real tools: volumes made by `cryptsetup luksFormat --type luks1` and by
//! `qemu-img create -f luks` open here with the volume key cryptsetup itself reports
//! (`luksDump --dump-volume-key`), `dump_text` matches `cryptsetup luksDump` byte for byte, and
//! headers cryptsetup refuses are refused here too.
//!
//! cryptsetup and qemu-img are installed by the test set-up (scripts/install-test-deps.sh); a
//! missing tool fails the test. Everything runs on regular files (no root, no device-mapper).
//! Passphrases reach the tools through key files only, never the command line.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sectorcrypt_luks::luks1::{Header, HEADER_SIZE};
use sectorcrypt_luks::Error;
use sectorcrypt_storage::FileStorage;
use sectorcrypt_testkit::tools::{qemu_img, Qemu};

use crate::luks1_support::*;

const PASSPHRASE: &[u8] = b"correct horse battery staple";

/// Whether `cryptsetup luksDump` accepts the file (it loads and validates the header).
fn cryptsetup_accepts(file: &Path) -> bool {
    Command::new("cryptsetup")
        .arg("luksDump")
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cryptsetup: {e} (run scripts/install-test-deps.sh)"))
        .status
        .success()
}

/// A `size`-byte regular file formatted by cryptsetup as LUKS1 with fast PBKDF2.
fn luks_format(
    dir: &Path,
    name: &str,
    cipher: &str,
    key_bits: usize,
    hash: &str,
    key: &Path,
) -> PathBuf {
    let path = dir.join(name);
    fs::File::create(&path).unwrap().set_len(4 << 20).unwrap();
    run(Command::new("cryptsetup")
        .args(["luksFormat", "-q", "--type", "luks1", "--key-file"])
        .arg(key)
        .args(["--pbkdf-force-iterations", "1000", "--hash", hash])
        .args(["--cipher", cipher, "--key-size", &key_bits.to_string()])
        .arg(&path));
    path
}

fn open(file: &Path) -> (FileStorage, Header) {
    let dev = FileStorage::open_read_only(file).unwrap();
    let header = Header::read(&dev).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    (dev, header)
}

fn assert_wrong(r: Result<sectorcrypt_luks::Unlocked, Error>, what: &str) {
    match r {
        Err(Error::WrongPassphrase) => {}
        Err(e) => panic!("{what}: expected WrongPassphrase, got {e}"),
        Ok(u) => panic!("{what}: expected WrongPassphrase, opened slot {}", u.slot),
    }
}

/// Every hash LUKS1 volumes use, with XTS and CBC-ESSIV at two key sizes each: the header reads
/// with the fields cryptsetup reports, re-serialises to the same bytes, dumps as luksDump does,
/// and the passphrase yields cryptsetup's volume key.
#[test]
fn opens_cryptsetup_volumes_of_every_hash_and_cipher() {
    let dir = scratch("luks1-matrix");
    let key = key_file(&dir, "key", PASSPHRASE);
    for hash in ["sha1", "sha256", "sha512"] {
        for (cipher, key_bits) in [
            ("aes-xts-plain64", 256),
            ("aes-xts-plain64", 512),
            ("aes-cbc-essiv:sha256", 128),
            ("aes-cbc-essiv:sha256", 256),
        ] {
            let what = format!("{cipher} {key_bits} {hash}");
            let name = format!("{hash}-{}-{key_bits}.img", cipher.replace(':', "_"));
            let file = luks_format(&dir, &name, cipher, key_bits, hash, &key);
            let (dev, h) = open(&file);
            assert_eq!(h.cipher_spec(), cipher, "{what}");
            assert_eq!(h.hash().unwrap().name(), hash, "{what}");
            assert_eq!(h.key_bytes as usize * 8, key_bits, "{what}");
            let uuid = run(Command::new("cryptsetup").arg("luksUUID").arg(&file)).stdout;
            assert_eq!(h.uuid(), String::from_utf8(uuid).unwrap().trim(), "{what}");
            let on_disk = fs::read(&file).unwrap();
            assert_eq!(h.to_bytes()[..], on_disk[..HEADER_SIZE], "{what}");
            assert_eq!(h.dump_text(), cryptsetup_dump(&file), "{what}");

            let u = h.unlock(&dev, PASSPHRASE, None).unwrap();
            assert_eq!(u.slot, 0, "{what}");
            assert_eq!(
                &u.volume_key[..],
                &cryptsetup_volume_key(&file, &key, &[])[..],
                "{what}"
            );
            assert_wrong(h.unlock(&dev, b"wrong", None), &what);
        }
    }
}

/// A second passphrase added by cryptsetup into slot 3 opens that slot (and only it) with the
/// same volume key; after cryptsetup kills slot 0, the first passphrase no longer opens.
#[test]
fn opens_a_key_added_to_slot_3() {
    let dir = scratch("luks1-add-key");
    let key = key_file(&dir, "key", PASSPHRASE);
    let second = key_file(&dir, "key2", b"second passphrase");
    let file = luks_format(&dir, "v.img", "aes-xts-plain64", 512, "sha256", &key);
    run(Command::new("cryptsetup")
        .args(["luksAddKey", "-q", "--key-file"])
        .arg(&key)
        .args(["--pbkdf-force-iterations", "1000", "--key-slot", "3"])
        .arg(&file)
        .arg(&second));
    let volume_key = cryptsetup_volume_key(&file, &second, &[]);

    let (dev, h) = open(&file);
    assert!(h.keyslots[3].active && h.keyslots[0].active);
    assert_eq!(h.dump_text(), cryptsetup_dump(&file));
    for slot in [Some(3), None] {
        let u = h.unlock(&dev, b"second passphrase", slot).unwrap();
        assert_eq!(u.slot, 3);
        assert_eq!(&u.volume_key[..], &volume_key[..]);
    }
    let u = h.unlock(&dev, PASSPHRASE, None).unwrap();
    assert_eq!((u.slot, &u.volume_key[..]), (0, &volume_key[..]));
    assert_wrong(h.unlock(&dev, b"second passphrase", Some(0)), "slot 0");
    assert_wrong(h.unlock(&dev, PASSPHRASE, Some(3)), "slot 3");
    // A disabled slot named is cryptsetup's "No usable keyslot" (exit 1), not a wrong passphrase.
    assert!(matches!(
        h.unlock(&dev, PASSPHRASE, Some(1)),
        Err(Error::NoUsableKeyslot(_))
    ));

    run(Command::new("cryptsetup")
        .args(["luksKillSlot", "-q", "--key-file"])
        .arg(&second)
        .arg(&file)
        .arg("0"));
    let (dev, h) = open(&file);
    assert!(!h.keyslots[0].active);
    assert_eq!(h.dump_text(), cryptsetup_dump(&file));
    assert_wrong(h.unlock(&dev, PASSPHRASE, None), "killed slot 0");
    assert_eq!(
        &h.unlock(&dev, b"second passphrase", None)
            .unwrap()
            .volume_key[..],
        &volume_key[..]
    );
}

/// The passphrase is exact bytes: a trailing newline, a changed case or a prefix do not open.
#[test]
fn wrong_passphrases_are_refused() {
    let dir = scratch("luks1-wrong");
    let key = key_file(&dir, "key", PASSPHRASE);
    let file = luks_format(&dir, "v.img", "aes-cbc-essiv:sha256", 256, "sha1", &key);
    let (dev, h) = open(&file);
    let mut with_newline = PASSPHRASE.to_vec();
    with_newline.push(b'\n');
    for wrong in [
        &with_newline[..],
        b"Correct horse battery staple",
        &PASSPHRASE[..PASSPHRASE.len() - 1],
        b"",
    ] {
        assert_wrong(h.unlock(&dev, wrong, None), "any slot");
        assert_wrong(h.unlock(&dev, wrong, Some(0)), "slot 0");
    }
    assert_eq!(h.unlock(&dev, PASSPHRASE, Some(0)).unwrap().slot, 0);
}

/// qemu writes LUKS1 with its own code and defaults (aes-256 XTS, sha256, its own iteration
/// counts, the payload right after slot 7); it opens here with the key cryptsetup reports. The
/// volume is made twice: by qemu-img on the host (run again under qemu-user when the CPU is too
/// fast for its PBKDF2 calibration) and by the same binary under qemu-user, so the fallback is
/// proved on every host, not only on those whose CPU trips it.
#[test]
fn opens_a_qemu_img_luks_volume() {
    for how in [Qemu::Native, Qemu::Emulated] {
        let dir = scratch(&format!("luks1-qemu-{how:?}"));
        let secret = key_file(&dir, "secret", b"qemu passphrase");
        let file = dir.join("q.img");
        let mut object = std::ffi::OsString::from("secret,id=sec0,file=");
        object.push(&secret);
        let made = qemu_img(
            how,
            Command::new("qemu-img")
                .args(["create", "-q", "-f", "luks", "--object"])
                .arg(object)
                .args(["-o", "key-secret=sec0,iter-time=10"])
                .arg(&file)
                .arg("16M"),
        );
        assert!(
            made.status.success(),
            "qemu-img create ({how:?}) failed ({}): {}",
            made.status,
            String::from_utf8_lossy(&made.stderr)
        );

        let (dev, h) = open(&file);
        assert_eq!(h.cipher_spec(), "aes-xts-plain64");
        assert_eq!(h.key_bytes, 64);
        assert_eq!(h.hash().unwrap().name(), "sha256");
        assert_eq!(
            h.payload_offset_bytes() + (16 << 20),
            fs::metadata(&file).unwrap().len(),
            "qemu puts 16 MiB of payload after the header"
        );
        assert_eq!(h.to_bytes()[..], fs::read(&file).unwrap()[..HEADER_SIZE]);
        assert_eq!(h.dump_text(), cryptsetup_dump(&file));
        let u = h.unlock(&dev, b"qemu passphrase", None).unwrap();
        assert_eq!(u.slot, 0);
        assert_eq!(
            &u.volume_key[..],
            &cryptsetup_volume_key(&file, &secret, &[])[..]
        );
        assert_wrong(h.unlock(&dev, b"qemu passphrasE", None), "qemu volume");
    }
}

/// Files holding only the header and keyslots are valid, as in cryptsetup: a `luksHeaderBackup`
/// file (shorter than its payload offset) and a detached header (payload offset 0).
#[test]
fn header_backups_and_detached_headers_open() {
    let dir = scratch("luks1-header-only");
    let key = key_file(&dir, "key", PASSPHRASE);
    let file = luks_format(&dir, "v.img", "aes-xts-plain64", 512, "sha512", &key);
    let backup = dir.join("backup.img");
    run(Command::new("cryptsetup")
        .arg("luksHeaderBackup")
        .arg(&file)
        .arg("--header-backup-file")
        .arg(&backup));
    let (dev, h) = open(&backup);
    assert!(fs::metadata(&backup).unwrap().len() < h.payload_offset_bytes());
    assert_eq!(h, open(&file).1);
    assert_eq!(
        &h.unlock(&dev, PASSPHRASE, None).unwrap().volume_key[..],
        &cryptsetup_volume_key(&file, &key, &[])[..]
    );

    let data = dir.join("data.img");
    fs::File::create(&data).unwrap().set_len(1 << 20).unwrap();
    let detached = dir.join("detached.img");
    run(Command::new("cryptsetup")
        .args(["luksFormat", "-q", "--type", "luks1", "--key-file"])
        .arg(&key)
        .args(["--pbkdf-force-iterations", "1000", "--header"])
        .arg(&detached)
        .arg(&data));
    let (dev, h) = open(&detached);
    assert_eq!(h.payload_offset, 0);
    assert_eq!(h.dump_text(), cryptsetup_dump(&detached));
    let header_arg = detached.to_str().unwrap();
    assert_eq!(
        &h.unlock(&dev, PASSPHRASE, None).unwrap().volume_key[..],
        &cryptsetup_volume_key(&data, &key, &["--header", header_arg])[..]
    );
}

/// Damage a cryptsetup volume in ways cryptsetup's loader refuses; each is refused here too
/// (damaged: Corrupt; not LUKS1: NotLuks). And one change cryptsetup accepts (a payload offset
/// past the end of a header-only file) is accepted here as well.
#[test]
fn refuses_the_headers_cryptsetup_refuses() {
    let dir = scratch("luks1-damaged");
    let key = key_file(&dir, "key", PASSPHRASE);
    let original = luks_format(&dir, "v.img", "aes-xts-plain64", 512, "sha256", &key);
    let image = fs::read(&original).unwrap();
    /// Byte offset of keyslot `i` in the header.
    fn slot(i: usize) -> usize {
        208 + 48 * i
    }
    fn be(v: u32) -> [u8; 4] {
        v.to_be_bytes()
    }
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage, &str)> = vec![
        ("magic", Box::new(|b| b[3] = b'X'), "is not a LUKS device"),
        ("version", Box::new(|b| b[7] = 3), "is not a LUKS device"),
        (
            "truncated",
            Box::new(|b| b.truncate(1 << 20)),
            "past the end of the device",
        ),
        (
            "header too short",
            Box::new(|b| b.truncate(500)),
            "is not a LUKS device",
        ),
        (
            "slot over the header",
            Box::new(|b| b[slot(0) + 40..slot(0) + 44].copy_from_slice(&be(1))),
            "overlaps the header",
        ),
        (
            "slots overlap",
            Box::new(|b| {
                // Slot 5 moved to the middle of slot 4 (which starts at sector 2024).
                b[slot(5) + 40..slot(5) + 44].copy_from_slice(&be(2024 + 250))
            }),
            "overlaps",
        ),
        (
            "slot past the payload",
            Box::new(|b| b[104..108].copy_from_slice(&be(3000))),
            "runs past the payload offset",
        ),
        (
            "stripes",
            Box::new(|b| b[slot(2) + 44..slot(2) + 48].copy_from_slice(&be(3999))),
            "AF stripes",
        ),
        (
            "hash",
            Box::new(|b| b[72..78].copy_from_slice(b"sha257")),
            "not a LUKS1 hash",
        ),
    ];
    for (name, damage, reason) in cases {
        let mut bytes = image.clone();
        damage(&mut bytes);
        let file = dir.join(format!("{}.img", name.replace(' ', "-")));
        fs::write(&file, &bytes).unwrap();
        assert!(!cryptsetup_accepts(&file), "cryptsetup accepted {name}");
        let dev = FileStorage::open_read_only(&file).unwrap();
        let err = Header::read(&dev).expect_err(name).to_string();
        assert!(err.contains(reason), "{name}: {err:?} lacks {reason:?}");
    }

    // A header-only file whose payload offset lies far past its end: both accept it.
    let h = open(&original).1;
    let last_end = (u64::from(h.keyslots[7].key_material_offset) + 500) * 512;
    let mut bytes = image[..last_end as usize].to_vec();
    bytes[104..108].copy_from_slice(&be(u32::MAX));
    let file = dir.join("far-payload.img");
    fs::write(&file, &bytes).unwrap();
    assert!(cryptsetup_accepts(&file));
    assert_eq!(open(&file).1.payload_offset, u32::MAX);
    assert_eq!(open(&file).1.dump_text(), cryptsetup_dump(&file));
}
