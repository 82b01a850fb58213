//! Conversions that move the data by the header's size: crash sweeps over a whole shifted
//! encryption (the copy to the end and the header install included) and a whole shifted
//! decryption (from the exported header on), and interop with cryptsetup's `--reduce-device-size`
//! encryption and header-exporting decryption in both directions.

use sectorcrypt_luks::luks2::reencrypt::{self, InitOptions, ResilienceKind, State};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_luks::FormatOptions;
use sectorcrypt_storage::{
    crash, CrashingStorage, Directory, FileStorage, MemStorage, Power, Storage, Window,
};
use sectorcrypt_testkit::sweep::{sweep, sweep_with_atoms};
use sectorcrypt_volume::convert::{self, Placement};
use sectorcrypt_volume::datashift;
use sectorcrypt_volume::reencrypt::{run, Options, Outcome};
use sectorcrypt_volume::Error;

use crate::common::*;

/// The shift S (half of cryptsetup's `--reduce-device-size`): room for a header with one
/// 512-bit keyslot.
pub(crate) const SHIFT: u64 = 512 << 10;
/// The first chunk a decryption moves to offset 0 (smaller than S, so the old keyslots area
/// past it must be overwritten by the steps).
pub(crate) const MOVED: u64 = 128 << 10;

/// The first S bytes of a `device_len`-byte device as a shifted encryption makes them: a LUKS2
/// header with data offset S whose metadata records the start; and the volume key.
pub(crate) fn encrypt_image(device_len: u64, sector_size: usize) -> (Vec<u8>, Vec<u8>) {
    encrypt_image_shifted(device_len, sector_size, SHIFT)
}

fn encrypt_image_shifted(device_len: u64, sector_size: usize, shift: u64) -> (Vec<u8>, Vec<u8>) {
    let opts = FormatOptions {
        version: 2,
        sector_size: Some(sector_size),
        pbkdf: fast_pbkdf(),
        data_offset: Some(shift),
        ..Default::default()
    };
    let image = convert::encryption_header(
        &opts,
        shift,
        device_len,
        PASS,
        Placement::DataShift,
        &fast_init(),
    )
    .unwrap();
    let dev = MemStorage::new(image.clone());
    let key = Luks2Header::read(&dev)
        .unwrap()
        .unlock(&dev, PASS, None)
        .unwrap();
    (image, key.volume_key.to_vec())
}

/// What `sectorcrypt encrypt --reduce-device-size` does: resume what the device records, or
/// start (again) when its start is still the plaintext.
fn encrypt_shifted(dev: &dyn Storage, image: &[u8], opts: &Options) -> Result<Outcome, Error> {
    if !datashift::header_in_place(dev, image.len() as u64)? {
        convert::start_shifted_encryption(dev, image)?;
    }
    run(dev, dev, PASS, opts, &mut |_| true)
}

/// An attached LUKS2 volume with data offset S on `device_len` bytes whose payload is
/// `plain` encrypted; returns the image and the volume key.
pub(crate) fn attached_volume(
    device_len: u64,
    plain: &[u8],
    sector_size: usize,
) -> (Vec<u8>, Vec<u8>) {
    let mem = MemStorage::new(vec![0; device_len as usize]);
    let opts = FormatOptions {
        version: 2,
        sector_size: Some(sector_size),
        pbkdf: fast_pbkdf(),
        data_offset: Some(SHIFT),
        ..Default::default()
    };
    let (_, unlocked) = sectorcrypt_luks::format(&mem, device_len, &opts, PASS).unwrap();
    let key = unlocked.volume_key.to_vec();
    mem.write_at(&expected_ciphertext(&key, sector_size, plain), SHIFT)
        .unwrap();
    (mem.contents(), key)
}

/// What `sectorcrypt decrypt --header FILE` does once the header is exported to `header`:
/// start unless the exported header records the decryption already, then run.
fn decrypt_shifted(
    header: &dyn Storage,
    data: &dyn Storage,
    opts: &Options,
) -> Result<Outcome, Error> {
    decrypt_shifted_with(header, data, opts, &fast_init())
}

/// [`decrypt_shifted`] started with `init`'s resilience.
fn decrypt_shifted_with(
    header: &dyn Storage,
    data: &dyn Storage,
    opts: &Options,
    init: &InitOptions,
) -> Result<Outcome, Error> {
    let h = Luks2Header::read(header).map_err(Error::Luks)?;
    if reencrypt::state(h.metadata()) == State::None {
        datashift::start_decrypt(header, data, PASS, MOVED, init)?;
    }
    run(header, data, PASS, opts, &mut |_| true)
}

fn opts() -> Options {
    Options {
        hotzone: 128 << 10,
        threads: 1,
    }
}

#[test]
fn crash_sweep_of_a_shifted_encryption_loses_nothing() {
    // L = 2.5 S: a full chunk, a partial one, and the moved first chunk.
    let data_len = SHIFT * 5 / 2;
    let device_len = data_len + 2 * SHIFT;
    let plain = pattern(device_len as usize, 11);
    let (image, key) = encrypt_image(device_len, 4096);
    let want = expected_ciphertext(&key, 4096, &plain[..data_len as usize]);
    let check = |dev: &MemStorage| -> Result<(), String> {
        let out = dev.contents();
        if out[SHIFT as usize..(SHIFT + data_len) as usize] != want[..] {
            return Err("the payload is not exactly the encrypted plaintext".into());
        }
        let h = Luks2Header::read(dev).map_err(|e| e.to_string())?;
        if reencrypt::state(h.metadata()) != State::None {
            return Err("not finished".into());
        }
        if h.data_segment().map(|s| s.offset).ok() != Some(SHIFT) {
            return Err("the data segment is not at the shift".into());
        }
        // The plaintext copy at the end is overwritten.
        if out[(device_len - SHIFT) as usize..] == plain[..SHIFT as usize] {
            return Err("the plaintext copy is left".into());
        }
        Ok(())
    };
    let report = sweep(
        std::slice::from_ref(&plain),
        |devs| encrypt_shifted(&devs[0], &image, &opts()),
        |s| {
            let after = &*s.devices[0];
            if !s.complete {
                match encrypt_shifted(after, &image, &opts()) {
                    Ok(Outcome::Finished) => {}
                    Err(Error::Unsupported(ref why)) if why.contains("no reencryption") => {}
                    other => return Err(format!("resuming gave {other:?}")),
                }
            }
            check(after)
        },
    );
    assert!(report.operations > 40, "{} operations", report.operations);
    report.assert_no_loss("crash sweep (shifted encryption)");
}

/// A start cut short, then run again with another `--reduce-device-size`: refused without a
/// write once the header install has begun (the start of the device is no longer the
/// plaintext), a correct encryption with the other shift before that; the original shift then
/// finishes the refused one.
#[test]
fn a_start_cut_short_and_rerun_with_another_shift_loses_nothing() {
    let device_len = 8 * SHIFT;
    let plain = pattern(device_len as usize, 17);
    let (image, key) = encrypt_image(device_len, 4096);
    let other = SHIFT * 2;
    let (image2, key2) = encrypt_image_shifted(device_len, 4096, other);
    let full = CrashingStorage::new(plain.clone(), None);
    datashift::start_encrypt(&full, &image).unwrap();
    let start_ops = full.operations();
    let (mut refused, mut restarted) = (0, 0);
    for (cut, after) in (0..start_ops).flat_map(|cut| {
        let dev = CrashingStorage::new(plain.clone(), Some(cut));
        assert!(datashift::start_encrypt(&dev, &image).is_err(), "cut {cut}");
        crash::outcomes(&[&dev], cut)
            .into_iter()
            .map(|o| (cut, MemStorage::new(dev.image(&o))))
            .collect::<Vec<_>>()
    }) {
        let before = after.contents();
        match encrypt_shifted(&after, &image2, &opts()) {
            // Either a fresh start with the other shift (the device's start was untouched), or
            // the recorded encryption resumed (its header was already readable).
            Ok(Outcome::Finished) => {
                let shift = Luks2Header::read(&after)
                    .unwrap()
                    .data_segment()
                    .unwrap()
                    .offset;
                let k = if shift == other { &key2 } else { &key };
                let (l, out) = (device_len - 2 * shift, after.contents());
                let want = expected_ciphertext(k, 4096, &plain[..l as usize]);
                assert!(
                    out[shift as usize..(shift + l) as usize] == want[..],
                    "cut {cut}"
                );
                restarted += usize::from(shift == other);
            }
            Err(Error::Unsupported(why)) if why.contains("signature") => {
                assert!(
                    after.contents() == before,
                    "cut {cut}: a refused start wrote"
                );
                assert_eq!(
                    encrypt_shifted(&after, &image, &opts()).unwrap(),
                    Outcome::Finished
                );
                let (l, out) = (device_len - 2 * SHIFT, after.contents());
                let want = expected_ciphertext(&key, 4096, &plain[..l as usize]);
                assert!(
                    out[SHIFT as usize..(SHIFT + l) as usize] == want[..],
                    "cut {cut}"
                );
                refused += 1;
            }
            other => panic!("cut {cut}: {other:?}"),
        }
    }
    eprintln!("other shift after a cut start: {restarted} restarted, {refused} refused");
    assert!(refused > 0 && restarted > 0);
}

/// A cut after the header install but before the prepared copy is invalidated, then steps run
/// (resumed from the header in place), then the start is run again: the prepared copy, still
/// readable where the first steps did not write (L < 2 S), must not set the header back.
#[test]
fn a_stale_prepared_header_never_sets_progress_back() {
    let data_len = SHIFT * 3 / 2;
    let device_len = data_len + 2 * SHIFT;
    let plain = pattern(device_len as usize, 18);
    let (image, key) = encrypt_image(device_len, 4096);
    let full = CrashingStorage::new(plain.clone(), None);
    datashift::start_encrypt(&full, &image).unwrap();
    // The last write and sync of the start invalidate the prepared copy: cut before them.
    let dev = CrashingStorage::new(plain.clone(), Some(full.operations() - 2));
    assert!(datashift::start_encrypt(&dev, &image).is_err());
    let dev = MemStorage::new(dev.image(&crash::Outcome::EverythingSurvives));
    let out = run(&dev, &dev, PASS, &opts(), &mut |_| false).unwrap();
    assert!(matches!(out, Outcome::Paused(_)));
    let before = dev.contents();
    assert!(datashift::header_in_place(&dev, SHIFT).unwrap());
    let after = dev.contents();
    assert!(
        after[..SHIFT as usize] == before[..SHIFT as usize],
        "the header in place was set back to the prepared one"
    );
    let prepared = Window::new(&dev as &dyn Storage, data_len, SHIFT);
    assert!(
        Luks2Header::read(&prepared).is_err(),
        "the prepared copy is left"
    );
    assert_eq!(
        encrypt_shifted(&dev, &image, &opts()).unwrap(),
        Outcome::Finished
    );
    let want = expected_ciphertext(&key, 4096, &plain[..data_len as usize]);
    assert!(dev.contents()[SHIFT as usize..(SHIFT + data_len) as usize] == want[..]);
}

#[test]
fn crash_sweep_of_a_shifted_decryption_loses_nothing() {
    // The moved first chunk is converted last, in place, under checksums: like every checksum
    // conversion, it needs the device to write 4 KiB blocks atomically.
    sweep_shifted_decryption(&fast_init(), 4096, "datashift-checksum");
}

/// The same with `datashift-journal`: the moved chunk is copied whole into the keyslot area
/// first, so 512-byte sectors suffice.
#[test]
fn crash_sweep_of_a_shifted_decryption_with_a_journal_loses_nothing() {
    let init = InitOptions {
        resilience: ResilienceKind::Journal,
        ..fast_init()
    };
    sweep_shifted_decryption(&init, 512, "datashift-journal");
}

fn sweep_shifted_decryption(init: &InitOptions, atom: u64, resilience: &str) {
    let device_len = SHIFT + (1280 << 10);
    let data_len = device_len - SHIFT;
    let plain = pattern(data_len as usize, 12);
    let (volume, _) = attached_volume(device_len, &plain, 4096);
    // Two devices on one power supply: the exported header file (a copy of the device's header
    // area), and the device.
    let check = |h: &MemStorage, d: &MemStorage| -> Result<(), String> {
        let data = d.contents();
        if data[..data_len as usize] != plain[..] {
            return Err("the data is not exactly the plaintext at offset 0".into());
        }
        if data[data_len as usize..] == volume[data_len as usize..] {
            return Err("the stale tail is left".into());
        }
        let h = Luks2Header::read(h).map_err(|e| e.to_string())?;
        if reencrypt::state(h.metadata()) != State::None {
            return Err("not finished".into());
        }
        if h.metadata().keyslots.iter().count() != 0 {
            return Err("keyslots left".into());
        }
        Ok(())
    };
    let report = sweep_with_atoms(
        &[volume[..SHIFT as usize].to_vec(), volume.clone()],
        &[512, atom],
        |devs| {
            let started = decrypt_shifted_with(&devs[0], &devs[1], &opts(), init);
            // The resilience asked for is the one recorded.
            let h = Luks2Header::read(&devs[0]).ok();
            let recorded = h
                .as_ref()
                .and_then(|h| reencrypt::parse(h.metadata()).ok().flatten())
                .map(|r| r.keyslot.resilience.area_type().to_string());
            assert!(
                recorded.as_ref().is_none_or(|r| r == resilience),
                "{recorded:?}"
            );
            started
        },
        |s| {
            let (h, d) = (&*s.devices[0], &*s.devices[1]);
            let md = Luks2Header::read(h)
                .map_err(|e| format!("the exported header does not read: {e}"))?
                .metadata()
                .clone();
            // Past the final header write, nothing is left to do.
            let finished = reencrypt::state(&md) == State::None
                && md.segments.get(0).is_some_and(|s| s.kind() == "linear");
            if !finished {
                match decrypt_shifted(h, d, &opts()) {
                    Ok(Outcome::Finished) => {}
                    other => return Err(format!("resuming gave {other:?}")),
                }
            }
            check(h, d)
        },
    );
    assert!(report.operations > 40, "{} operations", report.operations);
    report.assert_no_loss(&format!("crash sweep (shifted decryption, {resilience})"));
}

#[test]
fn a_device_too_small_or_a_wrong_passphrase_changes_nothing() {
    // Less than 3 S: refused before anything is written.
    let device_len = 3 * SHIFT - 4096;
    let plain = pattern(device_len as usize, 13);
    let dev = MemStorage::new(plain.clone());
    let image = vec![0u8; SHIFT as usize];
    assert!(matches!(
        datashift::start_encrypt(&dev, &image),
        Err(Error::Unsupported(_))
    ));
    assert!(dev.contents() == plain);
    // A wrong passphrase for a shifted decryption: neither the header nor the data change.
    let device_len = SHIFT + (1 << 20);
    let (volume, _) = attached_volume(device_len, &plain[..1 << 20], 4096);
    let header = MemStorage::new(volume[..SHIFT as usize].to_vec());
    let data = MemStorage::new(volume.clone());
    assert!(matches!(
        datashift::start_decrypt(&header, &data, b"wrong", MOVED, &fast_init()),
        Err(Error::Luks(sectorcrypt_luks::Error::WrongPassphrase))
    ));
    assert!(data.contents() == volume);
    assert!(header.contents() == volume[..SHIFT as usize]);
}

// ---- with cryptsetup ----

#[test]
fn shifted_encryption_interop_with_cryptsetup() {
    let (dir, key_file) = interop_dir("shift-encrypt");
    let device_len: u64 = 6 << 20;
    let data_len = device_len - 2 * SHIFT;
    let plain = pattern(device_len as usize, 14);
    let reduce = (2 * SHIFT).to_string();

    // Ours, paused after one step; cryptsetup finishes it.
    let img = dir.join("ours.img");
    std::fs::write(&img, &plain).unwrap();
    let (image, key) = encrypt_image(device_len, 4096);
    let dev = FileStorage::open(&img).unwrap();
    datashift::start_encrypt(&dev, &image).unwrap();
    one_step(&img, &img, 128 << 10);
    cryptsetup_reencrypt(&["--resume-only"], None, &key_file, &img);
    let got = std::fs::read(&img).unwrap();
    assert!(
        got[SHIFT as usize..(SHIFT + data_len) as usize]
            == expected_ciphertext(&key, 4096, &plain[..data_len as usize])[..],
        "cryptsetup finished our shifted encryption"
    );

    // cryptsetup starts one (--init-only moves the first chunk and writes the header); we do
    // all the steps; cryptsetup opens and decrypts the result.
    let img = dir.join("theirs.img");
    let vk_file = dir.join("vk");
    let vk = pattern(64, 15);
    std::fs::write(&vk_file, &vk).unwrap();
    std::fs::write(&img, &plain).unwrap();
    cryptsetup_reencrypt(
        &with_fast_pbkdf(&[
            "--encrypt",
            "--type",
            "luks2",
            "--reduce-device-size",
            &reduce,
            "--sector-size",
            "4096",
            "--init-only",
            "--volume-key-file",
            p(&vk_file),
        ]),
        None,
        &key_file,
        &img,
    );
    run_to_end(&img, &img);
    let got = std::fs::read(&img).unwrap();
    assert!(
        got[SHIFT as usize..(SHIFT + data_len) as usize]
            == expected_ciphertext(&vk, 4096, &plain[..data_len as usize])[..],
        "our steps of cryptsetup's shifted encryption"
    );
    let hdr = dir.join("exported.hdr");
    cryptsetup_reencrypt(&["--decrypt"], Some(&hdr), &key_file, &img);
    let got = std::fs::read(&img).unwrap();
    assert!(
        got[..data_len as usize] == plain[..data_len as usize],
        "cryptsetup decrypted our encryption back to the plaintext"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shifted_decryption_interop_with_cryptsetup() {
    let (dir, key_file) = interop_dir("shift-decrypt");
    let device_len: u64 = SHIFT + (5 << 20);
    let data_len = device_len - SHIFT;
    let plain = pattern(data_len as usize, 16);

    // Ours, paused after one step; cryptsetup finishes it.
    let img = dir.join("ours.img");
    let hdr = dir.join("ours.hdr");
    let (volume, _) = attached_volume(device_len, &plain, 4096);
    std::fs::write(&img, &volume).unwrap();
    std::fs::write(&hdr, &volume[..SHIFT as usize]).unwrap();
    let (h, d) = (
        FileStorage::open(&hdr).unwrap(),
        FileStorage::open(&img).unwrap(),
    );
    datashift::start_decrypt(&h, &d, PASS, MOVED, &fast_init()).unwrap();
    one_step(&hdr, &img, 128 << 10);
    cryptsetup_reencrypt(&["--resume-only"], Some(&hdr), &key_file, &img);
    assert!(
        std::fs::read(&img).unwrap()[..data_len as usize] == plain[..],
        "cryptsetup finished our shifted decryption"
    );

    // cryptsetup starts one on its own volume (header exported, first chunk moved); we finish.
    let img = dir.join("theirs.img");
    let hdr = dir.join("theirs.hdr");
    std::fs::write(&img, &volume).unwrap();
    cryptsetup_reencrypt(&["--decrypt", "--init-only"], Some(&hdr), &key_file, &img);
    run_to_end(&hdr, &img);
    assert!(
        std::fs::read(&img).unwrap()[..data_len as usize] == plain[..],
        "our steps of cryptsetup's shifted decryption"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The whole decryption of a volume whose header is on it, the header's export to a file
/// included (`NAME.partial`, the data-shift start, the durable rename), cut after every write,
/// sync and name change (the file in a `CrashingDirectory`, the device on the same power
/// supply). At every survival, doing what the command line does on a rerun (resume from `NAME`
/// if it exists, else plan and start the export again) ends with the plaintext at offset 0.
#[test]
fn an_exported_decryption_with_its_file_steps_survives_every_power_cut() {
    let device_len = SHIFT + (768 << 10);
    let data_len = device_len - SHIFT;
    let plain = pattern(data_len as usize, 13);
    let (volume, _) = attached_volume(device_len, &plain, 4096);
    // Run the decryption the command line's way on `dir` and `dev`.
    let decrypt = |dir: &dyn Directory, dev: &dyn Storage| -> Result<Outcome, Error> {
        if !dir.exists("hdr") {
            let plan = convert::plan_exported_decryption(dev, dir, "hdr", false)?;
            convert::start_exported_decryption(dev, dir, "hdr", &plan, PASS, MOVED, &fast_init())?;
        }
        let header = dir.open("hdr")?;
        run(&*header, dev, PASS, &opts(), &mut |_| true)
    };
    // The moved first chunk is converted last, in place, under checksums: 4 KiB atomic writes.
    let machine = |cut: Option<u64>| {
        let power = Power::new(cut);
        let dev = power.device_with_atom(volume.clone(), 4096);
        (power.directory(), dev, power)
    };
    let (dir, dev, power) = machine(None);
    decrypt(&dir, &dev).unwrap();
    let total = power.operations();
    let (mut images, mut losses) = (0u64, Vec::new());
    for cut in 0..=total {
        let (dir, dev, _) = machine(Some(cut));
        let _ = decrypt(&dir, &dev);
        let mut ops = dir.volatile_ops();
        ops.extend(dev.volatile_ops());
        for o in crash::outcomes_of(ops, cut) {
            images += 1;
            // Power back on: the surviving files in a fresh directory, the surviving device.
            let again = Power::new(None);
            let (dir2, dev2) = (
                again.directory(),
                again.device_with_atom(dev.image(&o), 4096),
            );
            for (name, bytes) in dir.image(&o) {
                let f = dir2.create(&name, bytes.len() as u64).unwrap();
                f.write_at(&bytes, 0).unwrap();
            }
            let done = match decrypt(&dir2, &dev2) {
                Ok(Outcome::Finished) => true,
                Err(Error::Unsupported(ref why)) if why.contains("no reencryption") => true,
                other => {
                    losses.push(format!(
                        "cut after {cut} of {total}, {o:?}: rerun gave {other:?}"
                    ));
                    false
                }
            };
            if done
                && dev2.image(&crash::Outcome::EverythingSurvives)[..data_len as usize] != plain[..]
            {
                losses.push(format!(
                    "cut after {cut} of {total}, {o:?}: not the plaintext"
                ));
            }
        }
    }
    assert!(losses.is_empty(), "{losses:#?}");
    println!(
        "exported decryption with its file steps: {} cut points x outcomes = {images} surviving states, 0 losses",
        total + 1
    );
}
