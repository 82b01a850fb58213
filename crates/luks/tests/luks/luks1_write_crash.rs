//! Power cuts during LUKS1 updates. For every cut point of an update (after 0, 1, ... writes and
//! syncs, up to all of them), a fresh device runs the update until the power goes, and what
//! survives must be a consistent volume holding exactly the old or exactly the new set of
//! passphrases: those passphrases open with the unchanged volume key, no other one opens, and
//! every enabled keyslot opens with one of them (an enabled slot over unwritten or wiped material
//! is a failure even though no passphrase notices it).
//!
//! The checker is itself tested: an add that writes the header before the key material, and a
//! kill that wipes before the header, are caught.

use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks1::{format, FormatParams, Header};
use sectorcrypt_luks::Error;
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{CrashingStorage, MemStorage, Storage};
use sectorcrypt_testkit::sweep::{self, ForgetsSync, Report};

const A: &[u8] = b"passphrase A";
const B: &[u8] = b"passphrase B";
const C: &[u8] = b"passphrase C";
const D: &[u8] = b"passphrase D";
const ALL: &[&[u8]] = &[A, B, C, D];

/// A fresh 256-bit XTS volume (the smallest keyslots) with `A` in slot 0 and `rest` added in
/// order; returns its bytes and volume key.
fn volume(rest: &[(&[u8], usize)]) -> (Vec<u8>, Vec<u8>) {
    let dev = MemStorage::new(vec![0; (2 << 20) + 4096]);
    let p = FormatParams {
        key_bits: 256,
        hash: Hash::Sha256,
        iterations: Some(1000),
        ..FormatParams::default()
    };
    let (mut h, u) = format(&dev, &p, A).unwrap();
    for &(pass, slot) in rest {
        h.add_keyslot(&dev, &u.volume_key, pass, Some(slot), Some(1000), 0)
            .unwrap();
    }
    (dev.contents(), u.volume_key.to_vec())
}

/// Why `image` is not a volume opening with exactly `set` and volume key `vk`, or `None` if it
/// is. An empty set also accepts an image that is not LUKS at all.
fn mismatch(image: Vec<u8>, set: &[&[u8]], vk: &[u8]) -> Option<String> {
    let dev = MemStorage::new(image);
    let h = match Header::read(&dev) {
        Ok(h) => h,
        Err(_) if set.is_empty() => return None,
        Err(e) => return Some(format!("the header does not read: {e}")),
    };
    for pass in ALL {
        let expected = set.contains(pass);
        match h.unlock(&dev, pass, None) {
            Ok(u) if !expected => return Some(format!("{pass:?} opens slot {}", u.slot)),
            Ok(u) if u.volume_key[..] != *vk => {
                return Some(format!("{pass:?} opens with another volume key"))
            }
            Ok(_) => {}
            // With every keyslot gone the answer is "no usable keyslot", as cryptsetup's.
            Err(Error::WrongPassphrase | Error::NoUsableKeyslot(_)) if expected => {
                return Some(format!("{pass:?} does not open"))
            }
            Err(Error::WrongPassphrase | Error::NoUsableKeyslot(_)) => {}
            Err(e) => return Some(format!("{pass:?}: {e}")),
        }
    }
    for (slot, k) in h.keyslots.iter().enumerate() {
        if k.active && !set.iter().any(|p| h.unlock(&dev, p, Some(slot)).is_ok()) {
            return Some(format!("keyslot {slot} is enabled but opens with nothing"));
        }
    }
    None
}

/// Run `update` on `image` cut after each of its writes and syncs, and check every survivor the
/// crash model allows (lost, reordered and torn writes since the last sync) against `old` and
/// `new`: it must open with exactly one of the two sets.
fn sweep(
    image: &[u8],
    vk: &[u8],
    old: &[&[u8]],
    new: &[&[u8]],
    update: &dyn Fn(&CrashingStorage) -> Result<(), Error>,
) -> Report {
    sweep::sweep(
        &[image.to_vec()],
        |devs| update(&devs[0]),
        |s| {
            let survivor = s.devices[0].contents();
            if s.complete {
                return mismatch(survivor, new, vk).map_or(Ok(()), Err);
            }
            match (
                mismatch(survivor.clone(), old, vk),
                mismatch(survivor, new, vk),
            ) {
                (Some(o), Some(n)) => Err(format!("not the old set ({o}) nor the new ({n})")),
                _ => Ok(()),
            }
        },
    )
}

fn assert_sweep(
    what: &str,
    image: &[u8],
    vk: &[u8],
    old: &[&[u8]],
    new: &[&[u8]],
    update: &dyn Fn(&CrashingStorage) -> Result<(), Error>,
) -> u64 {
    let report = sweep(image, vk, old, new, update);
    report.assert_no_loss(what);
    report.operations + 1
}

fn header(dev: &dyn Storage) -> Header {
    Header::read(dev).unwrap()
}

#[test]
fn add_keyslot_survives_every_power_cut() {
    let (image, vk) = volume(&[]);
    let tried = assert_sweep("add_keyslot", &image, &vk, &[A], &[A, B], &|dev| {
        header(dev)
            .add_keyslot(dev, &vk, B, None, Some(1000), 0)
            .map(|_| ())
    });
    // Material, sync, header, sync: and the cut after all four.
    assert_eq!(tried, 5);
}

#[test]
fn kill_keyslot_survives_every_power_cut() {
    let (image, vk) = volume(&[(B, 1), (C, 5)]);
    let tried = assert_sweep("kill_keyslot", &image, &vk, &[A, B, C], &[A, C], &|dev| {
        header(dev).kill_keyslot(dev, 1)
    });
    assert_eq!(tried, 5);
    // The material is really overwritten, not just disabled.
    let dev = MemStorage::new(image.clone());
    let area = header(&dev).keyslot_area(1).unwrap();
    let span = area.offset as usize..area.offset as usize + area.disk_len().unwrap();
    header(&dev).kill_keyslot(&dev, 1).unwrap();
    assert!(
        dev.contents()[span.clone()] != image[span],
        "keyslot 1 was not wiped"
    );
    // Killing the last keyslot: the old set is {A}, the new one empty.
    let (image, vk) = volume(&[]);
    assert_sweep("kill_keyslot (last)", &image, &vk, &[A], &[], &|dev| {
        header(dev).kill_keyslot(dev, 0)
    });
}

#[test]
fn change_keyslot_survives_every_power_cut() {
    let (image, vk) = volume(&[(C, 1)]);
    let tried = assert_sweep("change_keyslot", &image, &vk, &[A, C], &[B, C], &|dev| {
        let slot = header(dev).change_keyslot(dev, 0, &vk, B, Some(1000), 0)?;
        assert_eq!(slot, 2);
        Ok(())
    });
    // Material, sync, one header (new slot on, old slot off), sync, wipe, sync.
    assert_eq!(tried, 7);
}

#[test]
fn restore_survives_every_power_cut() {
    let (image, vk) = volume(&[]);
    let backup = Header::backup(&MemStorage::new(image.clone())).unwrap();

    // The backup drops a key added since.
    let dev = MemStorage::new(image.clone());
    header(&dev)
        .add_keyslot(&dev, &vk, B, Some(1), Some(1000), 0)
        .unwrap();
    let restore =
        |dev: &CrashingStorage| Header::restore(dev, &MemStorage::new(backup.clone())).map(|_| ());
    let a = assert_sweep(
        "restore (drop a key)",
        &dev.contents(),
        &vk,
        &[A, B],
        &[A],
        &restore,
    );

    // Slot 0 now holds another passphrase: the backup's slot 0 must be staged elsewhere first.
    let dev = MemStorage::new(image.clone());
    let mut h = header(&dev);
    h.add_keyslot(&dev, &vk, D, Some(1), Some(1000), 0).unwrap();
    h.kill_keyslot(&dev, 0).unwrap();
    h.add_keyslot(&dev, &vk, C, Some(0), Some(1000), 0).unwrap();
    let b = assert_sweep(
        "restore (slot 0 replaced)",
        &dev.contents(),
        &vk,
        &[C, D],
        &[A],
        &restore,
    );
    assert!(b > a, "staging adds writes ({b} vs {a})");

    // A wiped header: nothing to keep, the backup must come back whole.
    let mut wiped = image.clone();
    wiped[..4096].fill(0);
    let c = assert_sweep("restore (wiped header)", &wiped, &vk, &[], &[A], &restore);
    // Counts: header + sync, then the dropped slot's area + sync; staging adds the staged copy,
    // a sync, the move, a sync and the final header + sync; an intact keyslot area is not
    // rewritten.
    assert_eq!((a, b, c), (5, 11, 3));
    let dev = MemStorage::new(wiped);
    Header::restore(&dev, &MemStorage::new(backup.clone())).unwrap();
    assert!(
        dev.contents()[..backup.len()] == backup[..],
        "not byte for byte"
    );
}

/// With every slot in use by the device or the backup and the backup's slot in use by the
/// device, no staging area is left: refused, nothing written.
#[test]
fn restore_without_a_spare_area_is_refused() {
    let (image, vk) = volume(&[]);
    let backup = Header::backup(&MemStorage::new(image.clone())).unwrap();
    let dev = MemStorage::new(image);
    let mut h = header(&dev);
    for s in 1..8 {
        h.add_keyslot(&dev, &vk, B, Some(s), Some(1000), 0).unwrap();
    }
    h.change_keyslot(&dev, 0, &vk, C, Some(1000), 0).unwrap();
    let before = dev.contents();
    assert!(matches!(
        Header::restore(&dev, &MemStorage::new(backup)),
        Err(Error::Unsupported(_))
    ));
    assert!(dev.contents() == before);
}

/// The checker catches the unsafe orders: enabling a slot before its material is written, and
/// wiping material before the header disables it.
#[test]
fn the_sweep_catches_unsafe_orders() {
    let (image, vk) = volume(&[]);
    let header_first_add = |dev: &CrashingStorage| -> Result<(), Error> {
        let mut next = header(dev);
        next.keyslots[1].active = true;
        next.keyslots[1].iterations = 1000;
        next.keyslots[1].salt = [7; 32];
        next.write(dev)?;
        let area = next.keyslot_area(1)?;
        let kdf = sectorcrypt_luks::kdf::Kdf::Pbkdf2 {
            hash: Hash::Sha256,
            iterations: 1000,
        };
        let sealed = area.seal(&kdf, &[7; 32], B, &vk)?;
        dev.write_at(&sealed, area.offset)
            .map_err(|source| Error::Io {
                device: dev.name(),
                source,
            })
    };
    let e = sweep(&image, &vk, &[A], &[A, B], &header_first_add).losses;
    assert!(e[0].contains("enabled but opens with nothing"), "{e:?}");

    let (image, vk) = volume(&[(B, 1)]);
    let wipe_first_kill = |dev: &CrashingStorage| -> Result<(), Error> {
        let h = header(dev);
        let area = h.keyslot_area(1)?;
        let io = |source| Error::Io {
            device: dev.name(),
            source,
        };
        dev.write_at(&vec![0x55; area.disk_len()?], area.offset)
            .map_err(io)?;
        dev.sync().map_err(io)?;
        let mut next = h.clone();
        next.keyslots[1].active = false;
        next.write(dev)
    };
    let e = sweep(&image, &vk, &[A, B], &[A], &wipe_first_kill).losses;
    assert!(e[0].contains("enabled but opens with nothing"), "{e:?}");
}

/// `format` over an existing volume: at every cut point the device opens with exactly the old
/// passphrases and the old volume key, or exactly the new passphrase and the new key, or not at
/// all (formatting destroys the old volume by design) — never with a mix, never with a wrong key.
#[test]
fn format_survives_every_power_cut() {
    let (image, old_vk) = volume(&[(B, 2)]);
    let new_vk: Vec<u8> = (0..32u8).map(|b| b ^ 0x5a).collect();
    let params = FormatParams {
        key_bits: 256,
        hash: Hash::Sha256,
        iterations: Some(1000),
        volume_key: Some(SecretBytes::from_slice(&new_vk)),
        ..FormatParams::default()
    };
    let report = sweep::sweep(
        &[image],
        |devs| format(&devs[0], &params, C).map(|_| ()),
        |s| {
            let survivor = s.devices[0].contents();
            if s.complete {
                return mismatch(survivor, &[C], &new_vk).map_or(Ok(()), Err);
            }
            let verdicts = [
                mismatch(survivor.clone(), &[A, B], &old_vk),
                mismatch(survivor.clone(), &[C], &new_vk),
                mismatch(survivor, &[], &new_vk),
            ];
            match verdicts.iter().any(Option::is_none) {
                true => Ok(()),
                false => Err(format!("neither old, new nor unusable: {verdicts:?}")),
            }
        },
    );
    report.assert_no_loss("format");
}

/// The crash model bites: the same sweep of `add_keyslot` run with the sync between the new key
/// material and the header that enables it left out finds survivors where the header names
/// material that never reached the media (the old model, which kept every write made before the
/// cut, could not see this).
#[test]
fn a_forgotten_sync_is_caught() {
    let (image, vk) = volume(&[]);
    let losses = sweep(&image, &vk, &[A], &[A, B], &|dev| {
        let forgetful = ForgetsSync::new(dev, 1);
        header(&forgetful)
            .add_keyslot(&forgetful, &vk, B, None, Some(1000), 0)
            .map(|_| ())
    })
    .losses;
    assert!(
        losses
            .iter()
            .any(|l| l.contains("enabled but opens with nothing")),
        "{losses:?}"
    );
}
