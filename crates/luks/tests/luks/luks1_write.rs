//! LUKS1 writing against the real tools, both ways: volumes formatted here load in `cryptsetup
//! luksDump` (which prints exactly our `dump_text`), open with `cryptsetup open --test-passphrase`,
//! give our volume key to `luksDump --dump-volume-key`, sit where cryptsetup would put them, and
//! decrypt in `qemu-img`; keys added, killed and changed here are seen by cryptsetup and keys
//! cryptsetup adds open here; header backups are byte-identical to `luksHeaderBackup`'s and
//! restore in either tool.
//!
//! cryptsetup and qemu-img are installed by the test set-up (scripts/install-test-deps.sh); a
//! missing tool fails the test. Everything runs on regular files with PBKDF2 at 1000 iterations.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_cipher::{SectorCipher, SectorOptions};
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks1::{format, FormatParams, Header, HEADER_SIZE};
use sectorcrypt_luks::Error;
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{FileStorage, MemStorage, Storage};

use crate::luks1_support::*;

const PASSPHRASE: &[u8] = b"correct horse battery staple";
const VOLUME_LEN: u64 = 4 << 20;

fn empty_file(dir: &Path, name: &str, len: u64) -> PathBuf {
    let path = dir.join(name);
    fs::File::create(&path).unwrap().set_len(len).unwrap();
    path
}

fn params(cipher: &str, key_bits: usize, hash: Hash) -> FormatParams {
    FormatParams {
        cipher: cipher.into(),
        key_bits,
        hash,
        iterations: Some(1000),
        ..FormatParams::default()
    }
}

/// Format `file` here; returns the volume key.
fn format_file(file: &Path, p: &FormatParams, passphrase: &[u8]) -> SecretBytes {
    let dev = FileStorage::open(file).unwrap();
    let (h, u) = format(&dev, p, passphrase).unwrap();
    assert_eq!(Header::read(&dev).unwrap(), h);
    u.volume_key
}

/// Whether cryptsetup opens `file` with the passphrase in `key` (optionally only in `slot`).
fn cryptsetup_opens(file: &Path, key: &Path, slot: Option<usize>) -> bool {
    let mut cmd = Command::new("cryptsetup");
    cmd.args(["open", "--test-passphrase", "--type", "luks1", "--key-file"])
        .arg(key);
    if let Some(s) = slot {
        cmd.args(["--key-slot", &s.to_string()]);
    }
    output(cmd.arg(file)).status.success()
}

fn read(file: &Path) -> (FileStorage, Header) {
    let dev = FileStorage::open(file).unwrap();
    let h = Header::read(&dev).unwrap();
    (dev, h)
}

/// Every hash with XTS at both key sizes and CBC-ESSIV: cryptsetup loads the header (its dump is
/// our dump), opens it with the passphrase only, reports our volume key, and a volume it formats
/// with the same parameters has the same layout.
#[test]
fn formatted_volumes_open_in_cryptsetup() {
    let dir = scratch("luks1_write-format");
    let key = key_file(&dir, "key", PASSPHRASE);
    let wrong = key_file(&dir, "wrong", b"wrong");
    for hash in [Hash::Sha1, Hash::Sha256, Hash::Sha512] {
        for (cipher, bits) in [
            ("aes-xts-plain64", 256),
            ("aes-xts-plain64", 512),
            ("aes-cbc-essiv:sha256", 256),
        ] {
            let what = format!("{cipher} {bits} {}", hash.name());
            let file = empty_file(&dir, "ours.img", VOLUME_LEN);
            let vk = format_file(&file, &params(cipher, bits, hash), PASSPHRASE);
            assert_eq!(vk.len() * 8, bits, "{what}");
            let (_, h) = read(&file);
            assert_eq!(h.dump_text(), cryptsetup_dump(&file), "{what}");
            assert_eq!(h.mk_digest_iterations, 1000, "{what}");
            assert_eq!(h.keyslots[0].iterations, 1000, "{what}");
            assert!(cryptsetup_opens(&file, &key, Some(0)), "{what}");
            assert!(!cryptsetup_opens(&file, &wrong, None), "{what}");
            assert_eq!(cryptsetup_volume_key(&file, &key, &[]), &vk[..], "{what}");

            let theirs = empty_file(&dir, "theirs.img", VOLUME_LEN);
            run(Command::new("cryptsetup")
                .args(["luksFormat", "-q", "--type", "luks1", "--key-file"])
                .arg(&key)
                .args(["--pbkdf-force-iterations", "1000", "--hash", hash.name()])
                .args(["--cipher", cipher, "--key-size", &bits.to_string()])
                .arg(&theirs));
            let (_, t) = read(&theirs);
            assert_eq!(h.payload_offset, t.payload_offset, "{what}");
            assert_eq!(h.mk_digest_iterations, t.mk_digest_iterations, "{what}");
            assert_eq!(
                (&h.cipher_name, &h.cipher_mode),
                (&t.cipher_name, &t.cipher_mode)
            );
            for (a, b) in h.keyslots.iter().zip(&t.keyslots) {
                assert_eq!(a.key_material_offset, b.key_material_offset, "{what}");
                assert_eq!((a.active, a.stripes), (b.active, b.stripes), "{what}");
            }
            // Everything between the header and the first keyslot is zero, as cryptsetup leaves
            // it.
            let bytes = fs::read(&file).unwrap();
            assert!(bytes[HEADER_SIZE..4096].iter().all(|&b| b == 0), "{what}");
        }
    }
}

/// A given UUID (any case), volume key and keyslot are used as given.
#[test]
fn format_takes_uuid_volume_key_and_slot() {
    let dir = scratch("luks1_write-given");
    let key = key_file(&dir, "key", PASSPHRASE);
    let file = empty_file(&dir, "v.img", VOLUME_LEN);
    let vk: Vec<u8> = (0..64u8).collect();
    let p = FormatParams {
        uuid: Some("0123ABCD-89ab-cdef-0123-456789ABCDEF".into()),
        volume_key: Some(SecretBytes::from_slice(&vk)),
        keyslot: Some(5),
        ..params("aes-xts-plain64", 512, Hash::Sha256)
    };
    format_file(&file, &p, PASSPHRASE);
    let uuid = run(Command::new("cryptsetup").arg("luksUUID").arg(&file)).stdout;
    assert_eq!(
        String::from_utf8(uuid).unwrap().trim(),
        "0123abcd-89ab-cdef-0123-456789abcdef"
    );
    assert!(cryptsetup_opens(&file, &key, Some(5)));
    assert!(!cryptsetup_opens(&file, &key, Some(0)));
    assert_eq!(cryptsetup_volume_key(&file, &key, &[]), vk);
}

/// Bad parameters and a device too small are refused before anything is written.
#[test]
fn format_refuses_bad_parameters_and_small_devices() {
    let p = params("aes-xts-plain64", 512, Hash::Sha256);
    let unsupported = |r: Result<_, Error>, what: &str| match r {
        Err(Error::Unsupported(_)) | Err(Error::Cipher(_)) => {}
        Err(e) => panic!("{what}: unexpected error {e}"),
        Ok(_) => panic!("{what}: formatted"),
    };
    // 8 areas of 500 sectors at 4096-byte alignment end at sector 4036; the payload is at 4096.
    let dev = MemStorage::new(vec![0xee; 4096 * 512 - 1]);
    unsupported(format(&dev, &p, b"x"), "one byte short of the payload");
    assert!(dev.contents().iter().all(|&b| b == 0xee), "nothing written");
    let detached = FormatParams {
        detached_header: true,
        ..p.clone()
    };
    let dev = MemStorage::new(vec![0; 4036 * 512 - 1]);
    unsupported(format(&dev, &detached, b"x"), "detached, short");
    let dev = MemStorage::new(vec![0; 4036 * 512]);
    let (h, _) = format(&dev, &detached, b"x").unwrap();
    assert_eq!(h.payload_offset, 0);
    assert!(h.unlock(&dev, b"x", None).is_ok());

    let dev = MemStorage::new(vec![0; 4 << 20]);
    for (bad, what) in [
        (
            FormatParams {
                key_bits: 128,
                ..p.clone()
            },
            "128-bit XTS",
        ),
        (
            FormatParams {
                cipher: "aes".into(),
                ..p.clone()
            },
            "no mode",
        ),
        (
            FormatParams {
                uuid: Some("not-a-uuid".into()),
                ..p.clone()
            },
            "bad uuid",
        ),
        (
            FormatParams {
                keyslot: Some(8),
                ..p.clone()
            },
            "slot 8",
        ),
        (
            FormatParams {
                volume_key: Some(SecretBytes::from_slice(&[1; 32])),
                ..p.clone()
            },
            "short volume key",
        ),
    ] {
        unsupported(format(&dev, &bad, b"x"), what);
    }
    assert!(dev.contents().iter().all(|&b| b == 0), "nothing written");
}

/// Keys added here open in cryptsetup, keys cryptsetup adds open here, slots killed here are
/// gone for cryptsetup, and a changed key opens in cryptsetup while the old one does not.
#[test]
fn keyslot_changes_interoperate_with_cryptsetup() {
    let dir = scratch("luks1_write-keyslots");
    let key = key_file(&dir, "key", PASSPHRASE);
    let second = key_file(&dir, "second", b"second");
    let third = key_file(&dir, "third", b"third");
    let fourth = key_file(&dir, "fourth", b"fourth");
    let file = empty_file(&dir, "v.img", VOLUME_LEN);
    let vk = format_file(
        &file,
        &params("aes-xts-plain64", 512, Hash::Sha256),
        PASSPHRASE,
    );

    let (dev, mut h) = read(&file);
    assert_eq!(
        h.add_keyslot(&dev, &vk, b"second", Some(6), Some(1000), 2000)
            .unwrap(),
        6
    );
    assert_eq!(
        h.add_keyslot(&dev, &vk, b"third", None, Some(1000), 2000)
            .unwrap(),
        1
    );
    assert_eq!(Header::read(&dev).unwrap(), h);
    assert_eq!(h.dump_text(), cryptsetup_dump(&file));
    assert!(cryptsetup_opens(&file, &second, Some(6)));
    assert!(cryptsetup_opens(&file, &third, Some(1)));
    assert_eq!(cryptsetup_volume_key(&file, &second, &[]), &vk[..]);
    // The slot in use and a wrong volume key are refused.
    assert!(matches!(
        h.add_keyslot(&dev, &vk, b"x", Some(6), Some(1000), 2000),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        h.add_keyslot(&dev, &[0; 64], b"x", None, Some(1000), 2000),
        Err(Error::WrongPassphrase)
    ));

    run(Command::new("cryptsetup")
        .args(["luksAddKey", "-q", "--key-file"])
        .arg(&key)
        .args(["--pbkdf-force-iterations", "1000", "--key-slot", "4"])
        .arg(&file)
        .arg(&fourth));
    let (dev, mut h) = read(&file);
    let u = h.unlock(&dev, b"fourth", None).unwrap();
    assert_eq!((u.slot, &u.volume_key[..]), (4, &vk[..]));

    // A header read before someone else changed the device is refused.
    let stale = h.clone();
    h.kill_keyslot(&dev, 6).unwrap();
    assert!(!cryptsetup_opens(&file, &second, None));
    assert!(cryptsetup_opens(&file, &third, None));
    assert_eq!(h.dump_text(), cryptsetup_dump(&file));
    assert!(cryptsetup_dump(&file).contains("Key Slot 6: DISABLED\n"));
    let mut stale = stale;
    assert!(matches!(
        stale.kill_keyslot(&dev, 1),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        h.kill_keyslot(&dev, 6),
        Err(Error::Unsupported(_))
    ));

    let slot = h
        .change_keyslot(&dev, 0, &vk, b"changed", Some(1000), 2000)
        .unwrap();
    assert_eq!(slot, 2, "the first free slot");
    let changed = key_file(&dir, "changed", b"changed");
    assert!(cryptsetup_opens(&file, &changed, Some(2)));
    assert!(!cryptsetup_opens(&file, &key, None));
    assert!(cryptsetup_dump(&file).contains("Key Slot 0: DISABLED\n"));

    // cryptsetup's luksKillSlot on our volume.
    run(Command::new("cryptsetup")
        .args(["luksKillSlot", "-q", "--key-file"])
        .arg(&third)
        .arg(&file)
        .arg("4"));
    let (dev, h) = read(&file);
    assert!(!h.keyslots[4].active);
    assert!(matches!(
        h.unlock(&dev, b"fourth", None),
        Err(Error::WrongPassphrase)
    ));
}

/// With all eight slots in use, a change rewrites the slot in place (as cryptsetup does).
#[test]
fn change_with_no_free_slot_reuses_the_slot() {
    let dir = scratch("luks1_write-change-full");
    let file = empty_file(&dir, "v.img", VOLUME_LEN);
    let vk = format_file(&file, &params("aes-xts-plain64", 256, Hash::Sha256), b"p0");
    let (dev, mut h) = read(&file);
    for i in 1..8 {
        h.add_keyslot(&dev, &vk, format!("p{i}").as_bytes(), None, Some(1000), 0)
            .unwrap();
    }
    assert!(matches!(
        h.add_keyslot(&dev, &vk, b"p8", None, Some(1000), 0),
        Err(Error::Unsupported(_))
    ));
    assert_eq!(
        h.change_keyslot(&dev, 3, &vk, b"new", Some(1000), 0)
            .unwrap(),
        3
    );
    let new = key_file(&dir, "new", b"new");
    let old = key_file(&dir, "old", b"p3");
    assert!(cryptsetup_opens(&file, &new, Some(3)));
    assert!(!cryptsetup_opens(&file, &old, None));
}

/// Our backup is byte-identical to cryptsetup's and restores with `luksHeaderRestore`;
/// cryptsetup's backup restores here. Both onto a device whose header and keyslots were wiped.
#[test]
fn header_backups_interoperate_with_cryptsetup() {
    let dir = scratch("luks1_write-backup");
    let key = key_file(&dir, "key", PASSPHRASE);
    let file = empty_file(&dir, "v.img", VOLUME_LEN);
    let vk = format_file(
        &file,
        &params("aes-cbc-essiv:sha256", 256, Hash::Sha512),
        PASSPHRASE,
    );
    let (dev, mut h) = read(&file);
    h.add_keyslot(&dev, &vk, b"second", Some(3), Some(1000), 2000)
        .unwrap();
    let ours = Header::backup(&dev).unwrap();
    let theirs_path = dir.join("theirs.backup");
    run(Command::new("cryptsetup")
        .args(["luksHeaderBackup", "--header-backup-file"])
        .arg(&theirs_path)
        .arg(&file));
    let theirs = fs::read(&theirs_path).unwrap();
    assert_eq!(ours.len(), theirs.len());
    assert!(ours == theirs, "our backup differs from luksHeaderBackup's");
    let ours_path = dir.join("ours.backup");
    fs::write(&ours_path, &ours).unwrap();

    let wipe = |file: &Path| {
        let dev = FileStorage::open(file).unwrap();
        dev.write_at(&vec![0u8; ours.len()], 0).unwrap();
        assert!(Header::read(&dev).is_err());
    };
    // Ours into cryptsetup.
    wipe(&file);
    run(Command::new("cryptsetup")
        .args(["luksHeaderRestore", "-q", "--header-backup-file"])
        .arg(&ours_path)
        .arg(&file));
    assert!(cryptsetup_opens(&file, &key, Some(0)));
    assert_eq!(cryptsetup_volume_key(&file, &key, &[]), &vk[..]);
    // Theirs into ours.
    wipe(&file);
    let dev = FileStorage::open(&file).unwrap();
    let backup = FileStorage::open_read_only(&theirs_path).unwrap();
    let restored = Header::restore(&dev, &backup).unwrap();
    assert_eq!(restored.dump_text(), cryptsetup_dump(&file));
    let u = restored.unlock(&dev, b"second", None).unwrap();
    assert_eq!((u.slot, &u.volume_key[..]), (3, &vk[..]));
    assert!(cryptsetup_opens(&file, &key, Some(0)));
    assert_eq!(&fs::read(&file).unwrap()[..theirs.len()], &theirs[..]);
}

/// A backup is checked before anything is written: a damaged one, one too large for the device,
/// or one whose payload offset differs from the device's changes nothing.
#[test]
fn restore_validates_before_writing() {
    let dev = MemStorage::new(vec![0; 4 << 20]);
    let (_, _) = format(&dev, &params("aes-xts-plain64", 512, Hash::Sha256), b"x").unwrap();
    let before = dev.contents();
    let backup = Header::backup(&dev).unwrap();

    let mut damaged = backup.clone();
    damaged[208 + 44] ^= 1; // slot 0's stripes
    assert!(Header::restore(&dev, &MemStorage::new(damaged)).is_err());
    let truncated = backup[..backup.len() - 8192].to_vec();
    assert!(Header::restore(&dev, &MemStorage::new(truncated)).is_err());
    assert!(Header::restore(&dev, &MemStorage::new(vec![0; backup.len()])).is_err());
    let small = MemStorage::new(vec![0; backup.len() - 4096]);
    assert!(Header::restore(&small, &MemStorage::new(backup.clone())).is_err());
    let other = MemStorage::new(vec![0; 4 << 20]);
    let detached = FormatParams {
        detached_header: true,
        ..params("aes-xts-plain64", 512, Hash::Sha256)
    };
    format(&other, &detached, b"y").unwrap();
    let other_backup = Header::backup(&other).unwrap();
    assert!(matches!(
        Header::restore(&dev, &MemStorage::new(other_backup)),
        Err(Error::Unsupported(_))
    ));
    assert!(
        dev.contents() == before,
        "a refused restore wrote something"
    );
    assert!(small.contents().iter().all(|&b| b == 0));
}

/// qemu's LUKS driver opens a volume formatted here and decrypts data encrypted with our volume
/// key at our payload offset.
#[test]
fn qemu_img_reads_a_volume_formatted_here() {
    let dir = scratch("luks1_write-qemu");
    let key = key_file(&dir, "key", PASSPHRASE);
    let file = empty_file(&dir, "v.img", 2 << 20);
    let vk = format_file(
        &file,
        &params("aes-xts-plain64", 512, Hash::Sha256),
        PASSPHRASE,
    );
    let (dev, h) = read(&file);
    assert_eq!(h.payload_offset_bytes(), 2 << 20);
    let plain: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut data = plain.clone();
    SectorCipher::new(
        CipherSpec::parse(&h.cipher_spec()).unwrap(),
        &vk,
        &SectorOptions::default(),
    )
    .unwrap()
    .encrypt(&mut data, 0)
    .unwrap();
    drop(dev);
    let f = fs::OpenOptions::new().append(true).open(&file).unwrap();
    std::io::Write::write_all(&mut &f, &data).unwrap();
    drop(f);

    let opts = |path: &Path| format!("driver=luks,key-secret=s,file.filename={}", path.display());
    let secret = format!("secret,id=s,file={}", key.display());
    let info = run(Command::new("qemu-img")
        .args(["info", "--object", &secret, "--image-opts"])
        .arg(opts(&file)));
    let info = String::from_utf8(info.stdout).unwrap();
    assert!(info.contains("virtual size: 64 KiB"), "{info}");
    let out = dir.join("plain.raw");
    run(Command::new("qemu-img")
        .args(["convert", "--object", &secret, "--image-opts"])
        .arg(opts(&file))
        .args(["-O", "raw"])
        .arg(&out));
    assert!(
        fs::read(&out).unwrap() == plain,
        "qemu decrypted other bytes"
    );
    // A wrong passphrase is refused by qemu too (`info` does not open keyslots; `convert` does).
    let wrong = key_file(&dir, "wrong", b"wrong");
    let bad = output(
        Command::new("qemu-img")
            .args(["convert", "--object"])
            .arg(format!("secret,id=s,file={}", wrong.display()))
            .arg("--image-opts")
            .arg(opts(&file))
            .args(["-O", "raw"])
            .arg(dir.join("wrong.raw")),
    );
    assert!(
        !bad.status.success(),
        "qemu-img opened with a wrong passphrase"
    );
}
