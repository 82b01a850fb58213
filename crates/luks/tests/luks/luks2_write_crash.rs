//! Power cuts at every write and sync of every LUKS2 update. Each operation first runs on a
//! counting device to learn how many writes and syncs it does (N); then, for every cut point n in
//! 0..=N, it runs on a fresh copy of the starting bytes that "loses power" after n of them, and
//! every survivor the crash model allows is read back: the writes since the last sync lost,
//! kept, kept in part or torn at sector granularity (`sectorcrypt_storage::crash`).
//!
//! "Old or new" is checked exactly: of a list of candidate passphrases, the set that opens the
//! survived header must be precisely the set that opened before the operation or precisely the
//! set that opens after it (never neither, never a mixture such as the removed passphrase still
//! opening next to the new one), and every passphrase that opens gives the same volume key.

use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::{self, FormatParams, Header, Pbkdf};
use sectorcrypt_luks::Error;
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{CrashingStorage, MemStorage};
use sectorcrypt_testkit::sweep::{self, ForgetsSync, Report};

const MIB: usize = 1 << 20;

fn pbkdf() -> Pbkdf {
    Pbkdf::pbkdf2_forced(Hash::Sha256, 1000)
}

/// The indices of the candidates that open a header, and the volume key they give.
type Opening = (Vec<usize>, Option<Vec<u8>>);

/// The candidates that open `bytes`, with the volume key; `None` if there is no usable header.
/// A keyslot that opens with none of the candidates is an error.
fn opening_set(bytes: &[u8], candidates: &[&[u8]]) -> Result<Option<Opening>, String> {
    let dev = MemStorage::new(bytes.to_vec());
    let h = match Header::read(&dev) {
        Ok(h) => h,
        Err(Error::NotLuks { .. } | Error::Corrupt(_)) => return Ok(None),
        Err(e) => return Err(format!("unexpected error reading the header: {e}")),
    };
    let mut set = Vec::new();
    let mut key: Option<Vec<u8>> = None;
    for (i, p) in candidates.iter().enumerate() {
        if let Ok(u) = h.unlock(&dev, p, None) {
            if key.as_ref().is_some_and(|k| k[..] != u.volume_key[..]) {
                return Err("two passphrases give different keys".into());
            }
            key = Some(u.volume_key.to_vec());
            set.push(i);
        }
    }
    for (slot, _) in h.metadata().keyslots.iter() {
        let slot = slot as usize;
        if !candidates
            .iter()
            .any(|p| h.unlock(&dev, p, Some(slot)).is_ok())
        {
            return Err(format!("keyslot {slot} opens with no candidate"));
        }
    }
    Ok(Some((set, key)))
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
/// candidates that open before and after. Returns what the sweep found.
fn sweep_report(
    start: &[u8],
    candidates: &[&[u8]],
    old: &[usize],
    new: &[usize],
    key: &[u8],
    op: impl Fn(&CrashingStorage) -> Result<(), Error>,
) -> Report {
    sweep::sweep(
        &[start.to_vec()],
        |devs| op(&devs[0]),
        |s| {
            let Some((set, got)) = opening_set(&s.devices[0].contents(), candidates)? else {
                return Err("no usable header".into());
            };
            if set != new && (s.complete || set != old) {
                return Err(format!(
                    "passphrases {set:?} open (old {old:?}, new {new:?})"
                ));
            }
            if got.as_deref() != Some(key) {
                return Err("the volume key changed".into());
            }
            Ok(())
        },
    )
}

#[test]
fn add_keyslot_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let cands: &[&[u8]] = &[b"A", b"B"];
    let report = sweep_report(&start, cands, &[0], &[0, 1], &vk, |dev| {
        let mut h = Header::read(dev)?;
        h.add_keyslot(dev, &vk, b"B", None, &pbkdf()).map(|_| ())
    });
    report.assert_no_loss("add_keyslot");
    assert!(report.operations + 1 >= 9, "cut points");
}

/// An unbound keyslot (`add-key --unbound`): at every cut the volume opens with the old
/// passphrase and key, and the new keyslot either is not named or opens with its own key.
#[test]
fn add_unbound_keyslot_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let unbound = [7u8; 24];
    let report = sweep::sweep(
        &[start],
        |devs| {
            let dev = &devs[0];
            let mut h = Header::read(dev)?;
            h.add_unbound_keyslot(dev, &unbound, b"B", None, &pbkdf())
                .map(|_| ())
        },
        |s| {
            let dev = MemStorage::new(s.devices[0].contents());
            let h = Header::read(&dev).map_err(|e| format!("header: {e}"))?;
            let u = h.unlock(&dev, b"A", None).map_err(|e| format!("A: {e}"))?;
            if u.volume_key[..] != vk[..] {
                return Err("the volume key changed".into());
            }
            let named = h.metadata().keyslots.get(1).is_some();
            match h.unlock_in(&dev, b"B", Some(1), true) {
                Ok(u) if u.volume_key[..] == unbound => Ok(()),
                Ok(_) => Err("the unbound keyslot gives another key".into()),
                Err(e) if named => Err(format!("keyslot 1 is named but does not open: {e}")),
                Err(_) if s.complete => Err("finished without the unbound keyslot".into()),
                Err(_) => Ok(()),
            }
        },
    );
    report.assert_no_loss("add_unbound_keyslot");
    assert!(report.operations + 1 >= 5, "cut points");
}

#[test]
fn kill_keyslot_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let dev = MemStorage::new(start);
    let mut h = Header::read(&dev).unwrap();
    h.add_keyslot(&dev, &vk, b"B", None, &pbkdf()).unwrap();
    let cands: &[&[u8]] = &[b"A", b"B"];
    sweep_report(&dev.contents(), cands, &[0, 1], &[1], &vk, |dev| {
        Header::read(dev)?.kill_keyslot(dev, 0)
    })
    .assert_no_loss("kill_keyslot");
}

#[test]
fn change_keyslot_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let dev = MemStorage::new(start);
    let mut h = Header::read(&dev).unwrap();
    h.add_keyslot(&dev, &vk, b"C", None, &pbkdf()).unwrap();
    let cands: &[&[u8]] = &[b"A", b"B", b"C"];
    // Keyslot 0's passphrase changed to B, into keyslot `slot`.
    let sweep_change = |name: &str, slot: usize| {
        sweep_report(&dev.contents(), cands, &[0, 2], &[1, 2], &vk, |dev| {
            let mut h = Header::read(dev)?;
            assert_eq!(h.change_keyslot(dev, 0, &vk, b"B", &pbkdf())?, slot);
            Ok(())
        })
        .assert_no_loss(name);
    };
    // A free slot number exists: the new keyslot takes it.
    sweep_change("change_keyslot", 2);
    // All 32 numbers taken: the keyslot keeps its number, with a new area.
    for _ in 2..32 {
        h.add_keyslot(&dev, &vk, b"C", None, &pbkdf()).unwrap();
    }
    sweep_change("change_keyslot (same number)", 0);
}

/// A `systemd-pkcs11` token, its keyslots still to be filled in.
fn pkcs11_token() -> serde_json::Value {
    serde_json::json!({"type": "systemd-pkcs11", "keyslots": [],
        "pkcs11-uri": "pkcs11:token=t", "pkcs11-key": "AAAA"})
}

/// Whether the header on `bytes` has a token, and the keyslots it names.
fn token_slots(bytes: &[u8]) -> Option<Vec<String>> {
    let dev = MemStorage::new(bytes.to_vec());
    let h = Header::read(&dev).ok()?;
    let (_, t) = h.token_of_type("systemd-pkcs11")?;
    Some(
        t["keyslots"]
            .as_array()?
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
    )
}

/// A keyslot enrolled with its token (`enroll`): at every cut, either neither is there or both
/// are, the token naming the new keyslot; never a keyslot whose passphrase nothing holds.
#[test]
fn add_keyslot_with_token_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let cands: &[&[u8]] = &[b"A", b"T"];
    let token = pkcs11_token();
    let report = sweep::sweep(
        &[start],
        |devs| {
            let dev = &devs[0];
            let mut h = Header::read(dev)?;
            h.add_keyslot_with_token(dev, &vk, b"T", None, &pbkdf(), token.clone())
                .map(|_| ())
        },
        |s| {
            let bytes = s.devices[0].contents();
            let (set, key) = opening_set(&bytes, cands)?.ok_or("no usable header")?;
            if key.as_deref() != Some(&vk[..]) {
                return Err("the volume key changed".into());
            }
            match (set.as_slice(), token_slots(&bytes)) {
                ([0, 1], Some(slots)) if slots == ["1"] => Ok(()),
                ([0], None) if !s.complete => Ok(()),
                other => Err(format!("neither old nor new: {other:?}")),
            }
        },
    );
    report.assert_no_loss("add_keyslot_with_token");
    assert!(report.operations + 1 >= 9, "cut points");
}

/// `enroll --wipe-slot`: keyslots 1 and 2 and the token that held only keyslot 1 go in one
/// metadata write; at every cut either all are there or none is.
#[test]
fn kill_keyslots_and_tokens_survives_every_power_cut() {
    let (start, vk) = formatted(b"A");
    let dev = MemStorage::new(start);
    let mut h = Header::read(&dev).unwrap();
    let token = pkcs11_token();
    h.add_keyslot_with_token(&dev, &vk, b"T", None, &pbkdf(), token)
        .unwrap();
    h.add_keyslot(&dev, &vk, b"C", None, &pbkdf()).unwrap();
    let cands: &[&[u8]] = &[b"A", b"T", b"C"];
    let report = sweep::sweep(
        &[dev.contents()],
        |devs| {
            let dev = &devs[0];
            let removed = Header::read(dev)?.kill_keyslots_and_tokens(dev, &[1, 2])?;
            assert_eq!(removed, [0], "the token of keyslot 1 is removed");
            Ok::<_, Error>(())
        },
        |s| {
            let bytes = s.devices[0].contents();
            let (set, key) = opening_set(&bytes, cands)?.ok_or("no usable header")?;
            if key.as_deref() != Some(&vk[..]) {
                return Err("the volume key changed".into());
            }
            match (set.as_slice(), token_slots(&bytes)) {
                ([0, 1, 2], Some(slots)) if slots == ["1"] && !s.complete => Ok(()),
                ([0], None) => Ok(()),
                other => Err(format!("neither old nor new: {other:?}")),
            }
        },
    );
    report.assert_no_loss("kill_keyslots_and_tokens");
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
    sweep_report(&dev.contents(), cands, &[2], &[0], &vk, |d| {
        Header::restore(d, &backup_dev).map(|_| ())
    })
    .assert_no_loss("restore");
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
        volume_key: Some(SecretBytes::from_slice(&[9; 64])),
        ..FormatParams::default()
    };
    let cands: &[&[u8]] = &[b"OLD", b"NEW"];
    let report = sweep::sweep(
        &[old],
        |devs| luks2::format(&devs[0], &params, b"NEW"),
        |s| match opening_set(&s.devices[0].contents(), cands)? {
            None if !s.complete => Ok(()),
            Some((set, key)) if set == [0] && !s.complete => match key == Some(old_key.clone()) {
                true => Ok(()),
                false => Err("the old passphrase opens another key".into()),
            },
            Some((set, key)) if set == [1] => match key == Some(vec![9; 64]) {
                true => Ok(()),
                false => Err("the new passphrase opens another key".into()),
            },
            other => Err(format!("neither old, new nor unusable: {other:?}")),
        },
    );
    report.assert_no_loss("format");
}

/// The crash model bites: the same sweep of `add_keyslot` run with the sync between the new key
/// material and the metadata that names it left out finds survivors where a keyslot opens with
/// nothing (the old model, which kept every write made before the cut, could not see this).
#[test]
fn a_forgotten_sync_is_caught() {
    let (start, vk) = formatted(b"A");
    let cands: &[&[u8]] = &[b"A", b"B"];
    let losses = sweep_report(&start, cands, &[0], &[0, 1], &vk, |dev| {
        let forgetful = ForgetsSync::new(dev, 1);
        let mut h = Header::read(&forgetful)?;
        h.add_keyslot(&forgetful, &vk, b"B", None, &pbkdf())
            .map(|_| ())
    })
    .losses;
    assert!(
        losses.iter().any(|l| l.contains("opens with no candidate")),
        "{losses:?}"
    );
}

/// A second crash: an earlier one left the secondary copy torn, so only the primary is valid.
/// The next update, cut after every write and sync, must still leave a usable header that opens
/// with the old or the new passphrases: it writes the copy not in use first (a primary-first
/// order would leave no valid copy while the primary is rewritten).
#[test]
fn an_update_over_a_torn_secondary_survives_every_power_cut() {
    let (mut start, vk) = formatted(b"A");
    let secondary_json = 0x4000 + 4096;
    start[secondary_json + 100] ^= 0xff;
    let torn = MemStorage::new(start.clone());
    let h = Header::read(&torn).unwrap();
    assert_eq!(h.binary().hdr_size, 0x4000, "the default metadata size");
    let cands: &[&[u8]] = &[b"A", b"B"];
    sweep_report(&start, cands, &[0], &[0, 1], &vk, |dev| {
        let mut h = Header::read(dev)?;
        h.add_keyslot(dev, &vk, b"B", None, &pbkdf()).map(|_| ())
    })
    .assert_no_loss("add_keyslot over a torn secondary");
}
