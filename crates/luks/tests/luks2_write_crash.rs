//! Power cuts at every write and sync of every LUKS2 update. Each operation first runs on a
//! counting device to learn how many writes and syncs it does (N); then, for every cut point n in
//! 0..=N, it runs on a fresh copy of the starting bytes that "loses power" after n of them, and
//! what survived is read back.
//!
//! "Old or new" is checked exactly: of a list of candidate passphrases, the set that opens the
//! survived header must be precisely the set that opened before the operation or precisely the
//! set that opens after it (never neither, never a mixture such as the removed passphrase still
//! opening next to the new one), and every passphrase that opens gives the same volume key.

use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::{self, FormatParams, Header, Pbkdf};
use sectorcrypt_luks::Error;
use sectorcrypt_storage::{CrashingStorage, MemStorage};

const MIB: usize = 1 << 20;

fn pbkdf() -> Pbkdf {
    Pbkdf::pbkdf2_forced(Hash::Sha256, 1000)
}

/// The candidates that open `bytes`, with the volume key; `None` if there is no usable header.
fn opening_set(bytes: &[u8], candidates: &[&[u8]]) -> Option<(Vec<usize>, Option<Vec<u8>>)> {
    let dev = MemStorage::new(bytes.to_vec());
    let h = match Header::read(&dev) {
        Ok(h) => h,
        Err(Error::NotLuks { .. } | Error::Corrupt(_)) => return None,
        Err(e) => panic!("unexpected error reading the header: {e}"),
    };
    let mut set = Vec::new();
    let mut key: Option<Vec<u8>> = None;
    for (i, p) in candidates.iter().enumerate() {
        if let Ok(u) = h.unlock(&dev, p, None) {
            if let Some(k) = &key {
                assert_eq!(k, &u.volume_key[..], "two passphrases give different keys");
            }
            key = Some(u.volume_key.to_vec());
            set.push(i);
        }
    }
    Some((set, key))
}

/// Format a 17 MiB memory device with `pass` (keyslot 0).
fn formatted(pass: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let dev = MemStorage::new(vec![0; 17 * MIB]);
    let params = FormatParams {
        pbkdf: pbkdf(),
        ..FormatParams::default()
    };
    let (_, u) = luks2::format(&dev, &params, pass).unwrap();
    (dev.contents(), u.volume_key.to_vec())
}

/// Sweep every cut point of `op` run on `start`; `old` and `new` are the indices of the
/// candidates that open before and after. Returns the number of cut points tried.
fn sweep(
    name: &str,
    start: &[u8],
    candidates: &[&[u8]],
    old: &[usize],
    new: &[usize],
    key: &[u8],
    op: impl Fn(&CrashingStorage) -> Result<(), Error>,
) -> u64 {
    let counting = CrashingStorage::new(start.to_vec(), None);
    op(&counting).unwrap_or_else(|e| panic!("{name} without a power cut: {e}"));
    let total = counting.operations();
    let done = opening_set(&counting.contents(), candidates).expect("a header after the operation");
    assert_eq!(done.0, new, "{name}: the completed operation");
    let mut tried = 0;
    for n in 0..=total {
        let dev = CrashingStorage::new(start.to_vec(), Some(n));
        let result = op(&dev);
        assert_eq!(
            result.is_ok(),
            n >= total,
            "{name}: cut after {n} of {total}"
        );
        let (set, got) = opening_set(&dev.contents(), candidates)
            .unwrap_or_else(|| panic!("{name}: no usable header after a cut at {n}"));
        assert!(
            set == old || set == new,
            "{name}: cut after {n} of {total}: passphrases {set:?} open (old {old:?}, new {new:?})"
        );
        assert_eq!(got.as_deref(), Some(key), "{name}: the volume key changed");
        tried += 1;
    }
    println!("{name}: {tried} crash points tried ({total} writes and syncs)");
    assert!(tried > 0);
    tried
}

#[test]
fn add_keyslot_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let cands: &[&[u8]] = &[b"A", b"B"];
    let n = sweep("add_keyslot", &start, cands, &[0], &[0, 1], &vk, |dev| {
        let mut h = Header::read(dev)?;
        h.add_keyslot(dev, &vk, b"B", None, &pbkdf()).map(|_| ())
    });
    assert!(n >= 9);
}

#[test]
fn kill_keyslot_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let dev = MemStorage::new(start);
    let mut h = Header::read(&dev).unwrap();
    h.add_keyslot(&dev, &vk, b"B", None, &pbkdf()).unwrap();
    let cands: &[&[u8]] = &[b"A", b"B"];
    sweep(
        "kill_keyslot",
        &dev.contents(),
        cands,
        &[0, 1],
        &[1],
        &vk,
        |dev| Header::read(dev)?.kill_keyslot(dev, 0),
    );
}

#[test]
fn change_keyslot_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let dev = MemStorage::new(start);
    let mut h = Header::read(&dev).unwrap();
    h.add_keyslot(&dev, &vk, b"C", None, &pbkdf()).unwrap();
    let cands: &[&[u8]] = &[b"A", b"B", b"C"];
    // A free slot number exists: the new keyslot takes it.
    sweep(
        "change_keyslot",
        &dev.contents(),
        cands,
        &[0, 2],
        &[1, 2],
        &vk,
        |dev| {
            let mut h = Header::read(dev)?;
            assert_eq!(h.change_keyslot(dev, 0, &vk, b"B", &pbkdf())?, 2);
            Ok(())
        },
    );
    // All 32 numbers taken: the keyslot keeps its number, with a new area.
    for _ in 2..32 {
        h.add_keyslot(&dev, &vk, b"C", None, &pbkdf()).unwrap();
    }
    sweep(
        "change_keyslot (same number)",
        &dev.contents(),
        cands,
        &[0, 2],
        &[1, 2],
        &vk,
        |dev| {
            let mut h = Header::read(dev)?;
            assert_eq!(h.change_keyslot(dev, 0, &vk, b"B", &pbkdf())?, 0);
            Ok(())
        },
    );
}

/// The restored backup's keyslot 0 area is the one the current keyslot 0 uses with other
/// material: the restore must move the current keyslot away first.
#[test]
fn restore_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let dev = MemStorage::new(start);
    let backup = Header::backup(&dev).unwrap();
    let mut h = Header::read(&dev).unwrap();
    h.add_keyslot(&dev, &vk, b"B", None, &pbkdf()).unwrap();
    h.kill_keyslot(&dev, 0).unwrap();
    assert_eq!(h.add_keyslot(&dev, &vk, b"D", None, &pbkdf()).unwrap(), 0);
    h.kill_keyslot(&dev, 1).unwrap();
    let cands: &[&[u8]] = &[b"A", b"B", b"D"];
    let backup_dev = MemStorage::new(backup.clone());
    sweep("restore", &dev.contents(), cands, &[2], &[0], &vk, |d| {
        Header::restore(d, &backup_dev).map(|_| ())
    });
    // And the end result is the backup, byte for byte.
    let d = MemStorage::new(dev.contents());
    Header::restore(&d, &backup_dev).unwrap();
    assert!(d.contents()[..backup.len()] == backup[..]);
}

/// Formatting over an old LUKS2 volume: until the new header is complete the device may be
/// unreadable or (before the first write) still the old volume, never anything else; after,
/// only the new passphrase opens.
#[test]
fn format_survives_every_power_cut() {
    let (old, old_key) = formatted(b"OLD");
    let params = FormatParams {
        pbkdf: pbkdf(),
        volume_key: Some(zeroize::Zeroizing::new(vec![9; 64])),
        ..FormatParams::default()
    };
    let counting = CrashingStorage::new(old.clone(), None);
    luks2::format(&counting, &params, b"NEW").unwrap();
    let total = counting.operations();
    let cands: &[&[u8]] = &[b"OLD", b"NEW"];
    let mut tried = 0;
    for n in 0..=total {
        let dev = CrashingStorage::new(old.clone(), Some(n));
        let _ = luks2::format(&dev, &params, b"NEW");
        match opening_set(&dev.contents(), cands) {
            None => {}
            Some((set, key)) if set == [0] => assert_eq!(key.unwrap(), old_key, "cut {n}"),
            Some((set, key)) => {
                assert_eq!(set, [1], "cut {n} of {total}");
                assert_eq!(key.unwrap(), vec![9; 64]);
            }
        }
        tried += 1;
    }
    println!("format: {tried} crash points tried ({total} writes and syncs)");
    assert!(tried > 0);
    let done = opening_set(&counting.contents(), cands).unwrap();
    assert_eq!(done.0, [1]);
}
