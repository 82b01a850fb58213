//! Power cuts during `convert` (LUKS1 <-> LUKS2). For every cut point of a conversion, and every
//! survivor the crash model allows (writes since the last sync lost, reordered or torn into
//! sectors), the device must either still be a volume of the old format or already one of the
//! new, or be an interrupted conversion that `convert` then finishes; in every case each
//! passphrase opens with the unchanged volume key, and no keyslot is lost. A resumed conversion is
//! swept too, and the checker is checked: a conversion that forgets a sync is caught.

use sectorcrypt_luks::convert::{convert, interrupted, Format};
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::{self, Pbkdf};
use sectorcrypt_luks::{luks1, Error, Header};
use sectorcrypt_storage::{CrashingStorage, MemStorage, Storage};
use sectorcrypt_testkit::sweep::{sweep, ForgetsSync};

const A: &[u8] = b"passphrase A";
const B: &[u8] = b"passphrase B";
const C: &[u8] = b"passphrase C";

/// A LUKS1 volume with 256-bit keys (the smallest areas) and passphrases in slots 0, 3 and 7, so
/// that the region holds inactive areas in between and one at the very end.
fn luks1_volume() -> (Vec<u8>, Vec<u8>) {
    let (dev, vk) = luks1_on(false);
    (dev.contents(), vk)
}

/// [`luks1_volume`]'s header and keyslots, on a data device or (`detached`) a header device.
fn luks1_on(detached: bool) -> (MemStorage, Vec<u8>) {
    let dev = MemStorage::new(vec![0; (2 << 20) + 8192]);
    let p = luks1::FormatParams {
        key_bits: 256,
        hash: Hash::Sha256,
        iterations: Some(1000),
        detached_header: detached,
        ..luks1::FormatParams::default()
    };
    let (mut h, u) = luks1::format(&dev, &p, A).unwrap();
    h.add_keyslot(&dev, &u.volume_key, B, Some(3), Some(1000), 0)
        .unwrap();
    h.add_keyslot(&dev, &u.volume_key, C, Some(7), Some(1000), 0)
        .unwrap();
    (dev, u.volume_key.to_vec())
}

/// A LUKS2 volume LUKS1 can hold: PBKDF2, 512-byte sectors, a 2 MiB header; passphrases in slots
/// 0, 2 and 5.
fn luks2_volume() -> (Vec<u8>, Vec<u8>) {
    let dev = MemStorage::new(vec![0; (2 << 20) + 8192]);
    let p = luks2::FormatParams {
        key_bits: 256,
        sector_size: Some(512),
        pbkdf: Pbkdf::pbkdf2_forced(Hash::Sha256, 1000),
        data_offset: Some(2 << 20),
        ..luks2::FormatParams::default()
    };
    let (h, u) = luks2::format(&dev, &p, A).unwrap();
    let mut h = Header::Luks2(Box::new(h));
    let opts = sectorcrypt_luks::PbkdfOptions {
        kind: Some(sectorcrypt_luks::PbkdfChoice::Pbkdf2),
        force_iterations: Some(1000),
        ..Default::default()
    };
    h.add_keyslot(&dev, &u.volume_key, B, Some(2), &opts)
        .unwrap();
    h.add_keyslot(&dev, &u.volume_key, C, Some(5), &opts)
        .unwrap();
    (dev.contents(), u.volume_key.to_vec())
}

/// Why `dev` is not a volume opening with every passphrase and `vk`, or `None`.
fn opens(dev: &dyn Storage, vk: &[u8]) -> Option<String> {
    let h = match Header::read(dev) {
        Ok(h) => h,
        Err(e) => return Some(format!("the header does not read: {e}")),
    };
    for pass in [A, B, C] {
        match h.unlock(dev, pass, None) {
            Ok(u) if u.volume_key[..] == *vk => {}
            Ok(_) => return Some(format!("{pass:?} opens with another volume key")),
            Err(e) => return Some(format!("LUKS{} {pass:?}: {e}", h.version())),
        }
    }
    None
}

/// What is wrong with a survivor of a conversion to `to`: it must open as it is, or be an
/// interrupted conversion to `to` that finishes and then opens as `to`.
fn check(image: Vec<u8>, vk: &[u8], to: Format, complete: bool) -> Result<(), String> {
    let dev = MemStorage::new(image);
    match interrupted(&dev).map_err(|e| e.to_string())? {
        Some(t) if t != to => return Err(format!("interrupted towards {t:?}")),
        Some(_) => convert(&dev, to, &mut |_, _| {}).map_err(|e| format!("resume: {e}"))?,
        None => {}
    }
    if let Some(why) = opens(&dev, vk) {
        return Err(why);
    }
    let version = Header::read(&dev).map_err(|e| e.to_string())?.version();
    if complete && version != to.version() {
        return Err(format!("the finished conversion left LUKS{version}"));
    }
    Ok(())
}

fn sweep_conversion(what: &str, image: &[u8], vk: &[u8], to: Format) -> u64 {
    let report = sweep(
        &[image.to_vec()],
        |devs: &[std::sync::Arc<CrashingStorage>]| convert(&devs[0], to, &mut |_, _| {}),
        |s| check(s.devices[0].contents(), vk, to, s.complete),
    );
    report.assert_no_loss(what);
    report.operations
}

#[test]
fn luks1_to_luks2_survives_every_power_cut() {
    let (image, vk) = luks1_volume();
    let ops = sweep_conversion("convert to LUKS2", &image, &vk, Format::Luks2);
    // Record and magic (2 writes, 2 syncs), 37 pieces of 28 KiB (4 operations each), the two
    // copies (2 writes and a sync each).
    assert_eq!(ops, 4 + 37 * 4 + 6);
}

/// A detached LUKS1 header file of just its header and keyslots (as cryptsetup makes one): too
/// short for LUKS2, so the conversion grows it first.
fn detached_luks1_header() -> (Vec<u8>, Vec<u8>) {
    let (dev, vk) = luks1_on(true);
    let mut image = dev.contents();
    // The file as cryptsetup leaves it: the region's end, rounded up to 4 KiB.
    let end = image.iter().rposition(|b| *b != 0).unwrap() + 1;
    image.truncate(end.div_ceil(4096) * 4096);
    (image, vk)
}

/// The growth of a detached header file is part of the conversion, swept with it: a cut before
/// its sync leaves the short file (still LUKS1), a cut after it a longer one (zeros added).
#[test]
fn a_detached_luks1_header_grows_and_survives_every_power_cut() {
    let (image, vk) = detached_luks1_header();
    let ops = sweep_conversion(
        "convert a detached header to LUKS2",
        &image,
        &vk,
        Format::Luks2,
    );
    let dev = MemStorage::new(image.clone());
    convert(&dev, Format::Luks2, &mut |_, _| {}).unwrap();
    let grown = dev.contents().len();
    assert!(grown > image.len(), "the file grew");
    assert_eq!(opens(&dev, &vk), None);
    // The sweep covered the growth and its sync: two operations more than the same conversion
    // of a file that is long enough already.
    let mut long = image.clone();
    long.resize(grown, 0);
    let without = sweep_conversion("convert a long detached header", &long, &vk, Format::Luks2);
    assert_eq!(ops, without + 2);
    // A device that cannot grow (a window of fixed size) is refused, untouched.
    let under = MemStorage::new(image.clone());
    let fixed = sectorcrypt_storage::Window::new(&under, 0, image.len() as u64);
    match convert(&fixed, Format::Luks2, &mut |_, _| {}) {
        Err(Error::CannotConvert(why)) => assert!(why.contains("Not enough space"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(under.contents() == image);
}

#[test]
fn luks2_to_luks1_survives_every_power_cut() {
    let (image, vk) = luks2_volume();
    sweep_conversion("convert to LUKS1", &image, &vk, Format::Luks1);
}

#[test]
fn a_resumed_conversion_survives_every_power_cut() {
    for (to, (image, vk)) in [
        (Format::Luks2, luks1_volume()),
        (Format::Luks1, luks2_volume()),
    ] {
        // Cut half way through the move: the survivor is an interrupted conversion.
        let power = sectorcrypt_storage::Power::new(Some(60));
        let dev = power.device(image.clone());
        assert!(convert(&dev, to, &mut |_, _| {}).is_err());
        let mid = dev.image(&sectorcrypt_storage::crash::Outcome::EverythingSurvives);
        assert_eq!(
            interrupted(&MemStorage::new(mid.clone())).unwrap(),
            Some(to)
        );
        let report = sweep(
            &[mid],
            |devs: &[std::sync::Arc<CrashingStorage>]| convert(&devs[0], to, &mut |_, _| {}),
            |s| check(s.devices[0].contents(), &vk, to, s.complete),
        );
        report.assert_no_loss(&format!("resumed conversion to {to:?}"));
    }
}

#[test]
fn an_interrupted_conversion_is_refused_until_finished() {
    let (image, vk) = luks1_volume();
    let power = sectorcrypt_storage::Power::new(Some(30));
    let dev = power.device(image);
    assert!(convert(&dev, Format::Luks2, &mut |_, _| {}).is_err());
    let dev = MemStorage::new(dev.image(&sectorcrypt_storage::crash::Outcome::EverythingSurvives));
    assert!(matches!(
        Header::read(&dev),
        Err(Error::ConversionInterrupted { to: 2 })
    ));
    // Not the other way round: that would move the region back over itself.
    assert!(matches!(
        convert(&dev, Format::Luks1, &mut |_, _| {}),
        Err(Error::ConversionInterrupted { to: 2 })
    ));
    convert(&dev, Format::Luks2, &mut |_, _| {}).unwrap();
    assert_eq!(opens(&dev, &vk), None);
    assert_eq!(Header::read(&dev).unwrap().version(), 2);
}

#[test]
fn a_round_trip_gives_back_the_same_bytes() {
    let (image, vk) = luks1_volume();
    let dev = MemStorage::new(image.clone());
    convert(&dev, Format::Luks2, &mut |_, _| {}).unwrap();
    assert_eq!(opens(&dev, &vk), None);
    convert(&dev, Format::Luks1, &mut |_, _| {}).unwrap();
    assert!(
        dev.contents() == image,
        "LUKS1 -> LUKS2 -> LUKS1 changed bytes"
    );
    assert!(matches!(
        convert(&dev, Format::Luks1, &mut |_, _| {}),
        Err(Error::CannotConvert(m)) if m == "Device is already LUKS1 type."
    ));
}

#[test]
fn the_sweep_catches_a_conversion_that_forgets_a_sync() {
    let (image, vk) = luks1_volume();
    // Forgetting the sync after a moved piece lets its record land first.
    let report = sweep(
        &[image],
        |devs: &[std::sync::Arc<CrashingStorage>]| {
            convert(
                &ForgetsSync::new(&devs[0], 4),
                Format::Luks2,
                &mut |_, _| {},
            )
        },
        |s| check(s.devices[0].contents(), &vk, Format::Luks2, s.complete),
    );
    assert!(
        !report.losses.is_empty(),
        "a conversion without the sync after a piece passed the sweep"
    );
}
