//! In-place encryption with a detached header: a plain run, a crash sweep that cuts power after
//! every write and sync of the run and resumes, and interop with cryptsetup in both directions
//! (it resumes what we started; we resume what it started).

use std::sync::Arc;

use sectorcrypt_luks::luks2::reencrypt::{self, InitOptions, ResilienceKind, State};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_luks::{FormatOptions, Header};
use sectorcrypt_storage::crash;
use sectorcrypt_storage::{
    CrashingDirectory, CrashingStorage, Directory, FileStorage, MemStorage, Power, Storage, Window,
};
use sectorcrypt_testkit::cryptsetup_volume_key;
use sectorcrypt_testkit::sweep::{sweep, sweep_with_atoms, ForgetsSync, Report};
use sectorcrypt_volume::convert::{self, NewKey, Placement};
use sectorcrypt_volume::reencrypt::{run, Options, Outcome, Progress};
use sectorcrypt_volume::Error;

use crate::common::*;

/// A fresh detached LUKS2 header for `data_len` bytes of data, and its volume key.
fn format_detached(
    header_dev: &dyn Storage,
    data_len: u64,
    sector_size: usize,
) -> (Luks2Header, Vec<u8>) {
    let opts = FormatOptions {
        version: 2,
        sector_size: Some(sector_size),
        detached_header: true,
        pbkdf: fast_pbkdf(),
        ..Default::default()
    };
    let (header, unlocked) = sectorcrypt_luks::format(header_dev, data_len, &opts, PASS).unwrap();
    let Header::Luks2(h) = header else {
        panic!("not LUKS2")
    };
    (*h, unlocked.volume_key.to_vec())
}

/// A detached LUKS2 header for `data_len` bytes of plaintext, set up for encryption in place
/// (what `cryptsetup reencrypt --encrypt --header H --init-only` writes); returns its volume key.
pub(crate) fn init_detached(
    header_dev: &dyn Storage,
    data_len: u64,
    sector_size: usize,
) -> Vec<u8> {
    init_detached_with(header_dev, data_len, sector_size, &fast_init())
}

/// [`init_detached`] with `init`'s resilience.
fn init_detached_with(
    header_dev: &dyn Storage,
    data_len: u64,
    sector_size: usize,
    init: &InitOptions,
) -> Vec<u8> {
    let (h, key) = format_detached(header_dev, data_len, sector_size);
    let md = reencrypt::init_encrypt(&h, &key, init).unwrap();
    reencrypt::write_metadata(header_dev, &h, &md).unwrap();
    key
}

/// A detached LUKS2 header whose data (`data_len` bytes, already encrypted with the returned key
/// by the caller) is set up for decryption in place (what `cryptsetup reencrypt --decrypt
/// --header H --init-only` writes).
pub(crate) fn init_detached_decrypt(
    header_dev: &dyn Storage,
    data_len: u64,
    sector_size: usize,
) -> Vec<u8> {
    init_detached_decrypt_with(header_dev, data_len, sector_size, &fast_init())
}

/// [`init_detached_decrypt`] with `init`'s resilience.
fn init_detached_decrypt_with(
    header_dev: &dyn Storage,
    data_len: u64,
    sector_size: usize,
    init: &InitOptions,
) -> Vec<u8> {
    let (h, key) = format_detached(header_dev, data_len, sector_size);
    convert::start_decryption(header_dev, &h, &key, init).unwrap();
    key
}

/// What a reencryption here converts to: a new 512-bit key for aes-xts-plain64 with sectors of
/// `sector_size`.
fn new_key(sector_size: u32) -> NewKey {
    NewKey {
        len: 64,
        target: reencrypt::Target {
            cipher: "aes-xts-plain64".into(),
            sector_size,
        },
    }
}

/// A detached LUKS2 header whose data (`data_len` bytes, which the caller encrypts with the first
/// returned key) is set up for a reencryption to the second returned key, new sectors of
/// `new_sector_size` (what `cryptsetup reencrypt --header H --init-only` writes after adding a
/// keyslot for the new key).
pub(crate) fn init_detached_reencrypt(
    header_dev: &dyn Storage,
    data_len: u64,
    new_sector_size: u32,
) -> (Vec<u8>, Vec<u8>) {
    init_detached_reencrypt_with(header_dev, data_len, new_sector_size, &fast_init())
}

/// [`init_detached_reencrypt`] with `init`'s resilience.
fn init_detached_reencrypt_with(
    header_dev: &dyn Storage,
    data_len: u64,
    new_sector_size: u32,
    init: &InitOptions,
) -> (Vec<u8>, Vec<u8>) {
    let (h, old_vk) = format_detached(header_dev, data_len, 512);
    let pbkdf = fast_pbkdf().luks2().unwrap();
    let new = new_key(new_sector_size);
    let h = convert::start_reencryption(header_dev, &h, &old_vk, PASS, None, &new, &pbkdf, init)
        .unwrap();
    let keys = reencrypt::unlock_volume_keys(&h, header_dev, PASS).unwrap();
    (old_vk, keys.new.unwrap().volume_key.to_vec())
}

/// The starts of a reencryption and of a decryption (detached header), cut after every write and
/// sync on the cache model: the volume is exactly as it was (one keyslot, the old key, nothing
/// recorded), or the conversion is recorded and then runs to its end with the data right.
#[test]
fn conversion_starts_survive_every_power_cut() {
    let data_len: u64 = 256 << 10;
    let plain = pattern(data_len as usize, 5);
    let opts = Options {
        hotzone: 64 << 10,
        threads: 1,
    };
    for kind in ["reencryption", "decryption"] {
        let hdr = MemStorage::new(vec![0; HEADER_LEN as usize]);
        let (_, old_vk) = format_detached(&hdr, data_len, 512);
        let data = expected_ciphertext(&old_vk, 512, &plain);
        let pbkdf = fast_pbkdf().luks2().unwrap();
        let start = |devs: &[std::sync::Arc<CrashingStorage>]| -> Result<Luks2Header, Error> {
            let h = Luks2Header::read(&devs[0])?;
            match kind {
                "reencryption" => convert::start_reencryption(
                    &devs[0],
                    &h,
                    &old_vk,
                    PASS,
                    None,
                    &new_key(512),
                    &pbkdf,
                    &fast_init(),
                ),
                _ => convert::start_decryption(&devs[0], &h, &old_vk, &fast_init()),
            }
        };
        let report = sweep(&[hdr.contents(), data.clone()], start, |s| {
            let (hd, dd) = (&*s.devices[0], &*s.devices[1]);
            let h = Luks2Header::read(hd).map_err(|e| format!("no header: {e}"))?;
            if reencrypt::state(h.metadata()) == State::None {
                if s.complete {
                    return Err("the start recorded nothing".into());
                }
                let u = h.unlock(hd, PASS, None).map_err(|e| e.to_string())?;
                if h.metadata().keyslots.len() != 1 || u.volume_key[..] != old_vk[..] {
                    return Err("not the volume as it was".into());
                }
                return Ok(());
            }
            run(hd, dd, PASS, &opts, &mut |_| true)
                .map_err(|e| format!("the recorded conversion does not run: {e}"))?;
            let want = match kind {
                "decryption" => plain.clone(),
                _ => {
                    let h = Luks2Header::read(hd).map_err(|e| e.to_string())?;
                    let u = h.unlock(hd, PASS, None).map_err(|e| e.to_string())?;
                    expected_ciphertext(&u.volume_key, 512, &plain)
                }
            };
            match dd.contents() == want {
                true => Ok(()),
                false => Err("the data is not the converted data".into()),
            }
        });
        report.assert_no_loss(&format!("start of a {kind}"));
    }
}

#[test]
fn encrypts_in_place_and_pauses_at_clean_points() {
    let data_len = 3 << 20;
    let plain = pattern(data_len, 1);
    let header = MemStorage::new(vec![0; HEADER_LEN as usize]);
    let key = init_detached(&header, data_len as u64, 4096);
    let data = MemStorage::new(plain.clone());
    let opts = Options {
        hotzone: 1 << 20,
        threads: 2,
    };
    // Stop after the first step: a clean state, a third encrypted.
    let mut seen = Vec::new();
    let out = run(&header, &data, PASS, &opts, &mut |p: Progress| {
        seen.push(p);
        false
    })
    .unwrap();
    assert_eq!(
        out,
        Outcome::Paused(Progress {
            done: 1 << 20,
            total: data_len as u64
        })
    );
    assert_eq!(state_of(&header), State::Clean);
    let want = expected_ciphertext(&key, 4096, &plain);
    assert_eq!(data.contents()[..1 << 20], want[..1 << 20]);
    assert_eq!(data.contents()[1 << 20..], plain[1 << 20..]);
    // Resume to the end.
    let out = run(&header, &data, PASS, &opts, &mut |_| true).unwrap();
    assert_eq!(out, Outcome::Finished);
    assert_eq!(state_of(&header), State::None);
    assert_eq!(data.contents(), want);
    // The header now opens like any volume, the data segment at 0.
    let h = Header::read(&header).unwrap();
    let Header::Luks2(h2) = &h else { panic!() };
    assert_eq!(h2.data_segment().unwrap().offset, 0);
    // A wrong passphrase on a header in progress changes nothing.
    let header2 = MemStorage::new(vec![0; HEADER_LEN as usize]);
    init_detached(&header2, data_len as u64, 512);
    let data2 = MemStorage::new(plain.clone());
    let before = header2.contents();
    assert!(matches!(
        run(&header2, &data2, b"wrong", &opts, &mut |_| true),
        Err(Error::Luks(sectorcrypt_luks::Error::WrongPassphrase))
    ));
    assert_eq!(header2.contents(), before);
    assert_eq!(data2.contents(), plain);
}

/// Cut power after every write and sync of a whole run (header and data on two devices of one
/// power supply), power back on with every survival the crash model allows (writes since each
/// device's last sync lost, kept in part, torn), resume: every byte must end up converted
/// exactly once. `decrypt` sweeps a
/// decryption of the same data instead of an encryption.
fn crash_sweep(kind: &str, forget_data_sync: Option<u64>) -> Report {
    crash_sweep_with(kind, forget_data_sync, &fast_init())
}

/// [`crash_sweep`] with `init`'s resilience. Without resilience (`none`) a cut inside a hotzone
/// cannot be recovered: resuming must then refuse, saying so, never finish with wrong data.
fn crash_sweep_with(kind: &str, forget_data_sync: Option<u64>, init: &InitOptions) -> Report {
    let data_len: u64 = 1 << 20;
    let unprotected = init.resilience == ResilienceKind::None;
    let plain = pattern(data_len as usize, 2);
    // The starting machine: header (init state) then data on one device.
    let start = Arc::new(MemStorage::new(vec![0; (HEADER_LEN + data_len) as usize]));
    let header_view = Window::new(start.clone(), 0, HEADER_LEN);
    let (image_data, want) = match kind {
        "decryption" => {
            let key = init_detached_decrypt_with(&header_view, data_len, 4096, init);
            (expected_ciphertext(&key, 4096, &plain), plain.clone())
        }
        "encryption" => {
            let key = init_detached_with(&header_view, data_len, 4096, init);
            (plain.clone(), expected_ciphertext(&key, 4096, &plain))
        }
        _ => {
            let (old, new) = init_detached_reencrypt_with(&header_view, data_len, 4096, init);
            (
                expected_ciphertext(&old, 512, &plain),
                expected_ciphertext(&new, 4096, &plain),
            )
        }
    };
    start.write_at(&image_data, HEADER_LEN).unwrap();
    let image = start.contents();
    let opts = Options {
        hotzone: 256 << 10,
        threads: 1,
    };
    let convert = |h: &dyn Storage, d: &dyn Storage| run(h, d, PASS, &opts, &mut |_| true);
    // Two devices on one power supply, as a header file and its data file: a sync of one makes
    // only its own writes durable. Checksum resilience hashes 4 KiB blocks and so assumes the
    // data device writes them atomically (as cryptsetup's does): a block torn at 512 bytes
    // matches neither its old hash nor, knowably, the new data. The data device is modelled so;
    // the header device tears at 512 bytes.
    let (header, data) = image.split_at(HEADER_LEN as usize);
    let report = sweep_with_atoms(
        &[header.to_vec(), data.to_vec()],
        &[512, 4096],
        |devs| match forget_data_sync {
            Some(n) => convert(&devs[0], &ForgetsSync::new(&devs[1], n)),
            None => convert(&devs[0], &devs[1]),
        },
        |s| {
            let (h, d) = (&*s.devices[0], &*s.devices[1]);
            match convert(h, d) {
                Ok(Outcome::Finished) => {}
                // The cut came after the final header write: nothing left to resume.
                Err(Error::Unsupported(ref why)) if why.contains("no reencryption") => {}
                Err(Error::Unsupported(ref why))
                    if unprotected && why.contains("without resilience") =>
                {
                    return Ok(())
                }
                other => return Err(format!("resuming gave {other:?}")),
            }
            if d.contents() != want {
                return Err("the data is not exactly the converted data".into());
            }
            if state_of(h) != State::None {
                return Err("the conversion is not finished".into());
            }
            Ok(())
        },
    );
    assert!(report.operations > 20, "{} operations", report.operations);
    report
}

#[test]
fn crash_sweep_of_an_encryption_loses_nothing() {
    crash_sweep("encryption", None).assert_no_loss("crash sweep (encryption)");
}

#[test]
fn crash_sweep_of_a_decryption_loses_nothing() {
    crash_sweep("decryption", None).assert_no_loss("crash sweep (decryption)");
}

#[test]
fn crash_sweep_of_a_reencryption_loses_nothing() {
    crash_sweep("reencryption", None).assert_no_loss("crash sweep (reencryption)");
}

/// cryptsetup's `journal` resilience (the hotzone's old bytes copied into the area first): every
/// direction in place, swept like `checksum`.
#[test]
fn crash_sweeps_with_journal_resilience_lose_nothing() {
    let init = InitOptions {
        resilience: ResilienceKind::Journal,
        ..fast_init()
    };
    for kind in ["encryption", "decryption", "reencryption"] {
        crash_sweep_with(kind, None, &init).assert_no_loss(&format!("journal {kind}"));
    }
}

/// `none`: at every cut, resuming either finishes with exactly the converted data or refuses,
/// naming the hotzone to restore; never a silently wrong result.
#[test]
fn crash_sweeps_without_resilience_never_finish_wrong() {
    let init = InitOptions {
        resilience: ResilienceKind::None,
        ..fast_init()
    };
    for kind in ["encryption", "reencryption"] {
        crash_sweep_with(kind, None, &init).assert_no_loss(&format!("none {kind}"));
    }
}

#[test]
fn decryption_ends_with_plaintext_and_no_keys() {
    let data_len = 2 << 20;
    let plain = pattern(data_len, 5);
    let header = MemStorage::new(vec![0; HEADER_LEN as usize]);
    let key = init_detached_decrypt(&header, data_len as u64, 512);
    let data = MemStorage::new(expected_ciphertext(&key, 512, &plain));
    let out = run(
        &header,
        &data,
        PASS,
        &Options {
            hotzone: 768 << 10,
            threads: 2,
        },
        &mut |_| true,
    )
    .unwrap();
    assert_eq!(out, Outcome::Finished);
    assert_eq!(data.contents(), plain);
    let h = Luks2Header::read(&header).unwrap();
    assert_eq!(reencrypt::state(h.metadata()), State::None);
    assert_eq!(
        h.metadata().keyslots.iter().count(),
        0,
        "keyslots left after decryption"
    );
    // Their areas are wiped: no stored key material is left in the header.
    let stored = header.contents();
    assert!(stored[32768..(1 << 20)].iter().all(|&b| b == 0));
}

/// Tokens outlive a reencryption: one naming only the old keyslot is left naming none (the
/// header stays valid metadata: a token naming a removed keyslot is refused by cryptsetup and
/// here), and one the passphrase came from names the new keyslot and still opens the volume.
#[test]
fn reencryption_keeps_tokens_valid_and_carries_the_one_used() {
    let data_len: u64 = 1 << 20;
    let plain = pattern(data_len as usize, 6);
    for carried in [false, true] {
        let header = MemStorage::new(vec![0; HEADER_LEN as usize]);
        let (h, old_vk) = format_detached(&header, data_len, 512);
        let token = serde_json::json!({"type": "x-test", "keyslots": ["0"]});
        let (h, id) = h.import_token(&header, None, token).unwrap();
        let data = MemStorage::new(expected_ciphertext(&old_vk, 512, &plain));
        let pbkdf = fast_pbkdf().luks2().unwrap();
        let started = convert::start_reencryption(
            &header,
            &h,
            &old_vk,
            PASS,
            carried.then_some(id),
            &new_key(512),
            &pbkdf,
            &fast_init(),
        )
        .unwrap();
        let keys = reencrypt::unlock_volume_keys(&started, &header, PASS).unwrap();
        let new_vk = keys.new.unwrap().volume_key.to_vec();
        let out = run(&header, &data, PASS, &Options::default(), &mut |_| true).unwrap();
        assert_eq!(out, Outcome::Finished);
        let done = Luks2Header::read(&header).expect("valid metadata after the reencryption");
        let slots = done.token(id).unwrap()["keyslots"].clone();
        let new_slot = done
            .metadata()
            .keyslots
            .iter()
            .map(|(n, _)| n)
            .next()
            .unwrap();
        if carried {
            assert_eq!(slots, serde_json::json!([new_slot.to_string()]));
            let u = done.unlock(&header, PASS, Some(new_slot as usize)).unwrap();
            assert_eq!(&u.volume_key[..], &new_vk[..]);
        } else {
            assert_eq!(
                slots,
                serde_json::json!([]),
                "the removed keyslot's reference"
            );
        }
        assert_eq!(data.contents(), expected_ciphertext(&new_vk, 512, &plain));
    }
}

// ---- with cryptsetup ----

#[test]
fn cryptsetup_resumes_ours_and_we_resume_cryptsetups() {
    let (dir, key_file) = interop_dir("interop");
    let data_len = 8usize << 20;
    let plain = pattern(data_len, 3);

    // Ours paused after a quarter, cryptsetup finishes.
    let hdr = dir.join("ours.hdr");
    let data = dir.join("ours.img");
    std::fs::write(&hdr, vec![0u8; HEADER_LEN as usize]).unwrap();
    std::fs::write(&data, &plain).unwrap();
    let key = init_detached(&FileStorage::open(&hdr).unwrap(), data_len as u64, 4096);
    one_step(&hdr, &data, 2 << 20);
    cryptsetup_reencrypt(&["--resume-only"], Some(&hdr), &key_file, &data);
    assert_eq!(
        std::fs::read(&data).unwrap(),
        expected_ciphertext(&key, 4096, &plain)
    );

    // cryptsetup initialises, we do all of it.
    let hdr = dir.join("theirs.hdr");
    let data = dir.join("theirs.img");
    let vk_file = dir.join("vk");
    let vk = pattern(64, 4);
    std::fs::write(&vk_file, &vk).unwrap();
    std::fs::write(&data, &plain).unwrap();
    cryptsetup_reencrypt(
        &with_fast_pbkdf(&[
            "--encrypt",
            "--type",
            "luks2",
            "--init-only",
            "--volume-key-file",
            p(&vk_file),
        ]),
        Some(&hdr),
        &key_file,
        &data,
    );
    run_to_end(&hdr, &data);
    // cryptsetup sees a finished volume: the passphrase opens it, and it decrypts it in place
    // back to the plaintext.
    cryptsetup(&[
        "open",
        "--test-passphrase",
        "--header",
        p(&hdr),
        "--key-file",
        p(&key_file),
        p(&data),
    ]);
    let sector = sector_size_of(&FileStorage::open_read_only(&hdr).unwrap());
    assert_eq!(
        std::fs::read(&data).unwrap(),
        expected_ciphertext(&vk, sector, &plain)
    );
    cryptsetup_reencrypt(&["--decrypt"], Some(&hdr), &key_file, &data);
    assert!(
        std::fs::read(&data).unwrap() == plain,
        "cryptsetup decrypted to the plaintext"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn decryption_interop_with_cryptsetup() {
    let (dir, key_file) = interop_dir("interop-decrypt");
    let data_len = 8usize << 20;
    let plain = pattern(data_len, 6);

    // cryptsetup encrypts in place (detached header); we decrypt all of it.
    let hdr = dir.join("theirs.hdr");
    let data = dir.join("theirs.img");
    std::fs::write(&data, &plain).unwrap();
    cryptsetup_reencrypt(
        &with_fast_pbkdf(&["--encrypt", "--type", "luks2"]),
        Some(&hdr),
        &key_file,
        &data,
    );
    cryptsetup_reencrypt(&["--decrypt", "--init-only"], Some(&hdr), &key_file, &data);
    run_to_end(&hdr, &data);
    assert!(
        std::fs::read(&data).unwrap() == plain,
        "our decryption of cryptsetup's encryption"
    );

    // We start a decryption and pause after a step; cryptsetup finishes it.
    let hdr = dir.join("ours.hdr");
    let data = dir.join("ours.img");
    std::fs::write(&hdr, vec![0u8; HEADER_LEN as usize]).unwrap();
    let key = init_detached_decrypt(&FileStorage::open(&hdr).unwrap(), data_len as u64, 4096);
    std::fs::write(&data, expected_ciphertext(&key, 4096, &plain)).unwrap();
    one_step(&hdr, &data, 2 << 20);
    cryptsetup_reencrypt(&["--resume-only"], Some(&hdr), &key_file, &data);
    assert!(
        std::fs::read(&data).unwrap() == plain,
        "cryptsetup finished our decryption"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reencryption_interop_with_cryptsetup() {
    let (dir, key_file) = interop_dir("interop-reencrypt");
    let data_len = 8usize << 20;
    let plain = pattern(data_len, 8);

    // Ours, paused after a step; cryptsetup finishes; the passphrase opens the new key, which
    // decrypts the data.
    let hdr = dir.join("ours.hdr");
    let data = dir.join("ours.img");
    std::fs::write(&hdr, vec![0u8; HEADER_LEN as usize]).unwrap();
    let (old, new) =
        init_detached_reencrypt(&FileStorage::open(&hdr).unwrap(), data_len as u64, 4096);
    std::fs::write(&data, expected_ciphertext(&old, 512, &plain)).unwrap();
    one_step(&hdr, &data, 2 << 20);
    cryptsetup_reencrypt(&["--resume-only"], Some(&hdr), &key_file, &data);
    assert!(std::fs::read(&data).unwrap() == expected_ciphertext(&new, 4096, &plain));

    // cryptsetup starts (attached header: nothing moves in a reencryption), we finish.
    let img = dir.join("theirs.img");
    let vk_file = dir.join("vk");
    std::fs::write(&vk_file, &old).unwrap();
    std::fs::write(&img, vec![0u8; (16 << 20) + data_len]).unwrap();
    cryptsetup_format_with_volume_key(&img, &key_file, &vk_file, &["--sector-size", "512"]);
    let mut image = std::fs::read(&img).unwrap();
    image[16 << 20..].copy_from_slice(&expected_ciphertext(&old, 512, &plain));
    std::fs::write(&img, &image).unwrap();
    cryptsetup_reencrypt(&with_fast_pbkdf(&["--init-only"]), None, &key_file, &img);
    run_to_end(&img, &img);
    let dev = FileStorage::open(&img).unwrap();
    // The new key, as cryptsetup sees it, decrypts the payload to the plaintext.
    let new_key = cryptsetup_volume_key(&img, &key_file, &[]);
    assert_ne!(new_key, old, "the volume key did not change");
    let sector = sector_size_of(&dev);
    let payload = std::fs::read(&img).unwrap()[16 << 20..].to_vec();
    assert!(payload == expected_ciphertext(&new_key, sector, &plain));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The crash model bites: the encryption sweep run with the sync of the first hotzone's data
/// left out (the header then records the step done while its data may still be in the cache)
/// finds survivors whose data is not the converted data.
#[test]
fn a_forgotten_data_sync_is_caught() {
    let report = crash_sweep("encryption", Some(1));
    assert!(
        report
            .losses
            .iter()
            .any(|l| l.contains("not exactly the converted data")),
        "{:?}",
        report.losses
    );
}

/// A directory that reports its syncs done without doing them (a writer that forgot them).
struct ForgetsDirSync<'a>(&'a CrashingDirectory);

impl Directory for ForgetsDirSync<'_> {
    fn create(&self, name: &str, len: u64) -> std::io::Result<Box<dyn Storage>> {
        self.0.create(name, len)
    }
    fn open(&self, name: &str) -> std::io::Result<Box<dyn Storage>> {
        self.0.open(name)
    }
    fn exists(&self, name: &str) -> bool {
        self.0.exists(name)
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.0.remove(name)
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        self.0.rename(from, to)
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn path_of(&self, name: &str) -> std::path::PathBuf {
        self.0.path_of(name)
    }
}

/// A whole detached encryption, the header file's install included, cut after every write, sync
/// and name change (the header in a directory, the data on a device, one power supply), every
/// survival checked: no header file and the data untouched, or the header file there and the
/// encryption resumed to its end. Returns (cut points, surviving states, losses).
fn detached_encryption_sweep(forget_dir_sync: bool) -> (u64, u64, Vec<String>) {
    let data_len = 512u64 << 10;
    let plain = pattern(data_len as usize, 9);
    let options = FormatOptions {
        version: 2,
        sector_size: Some(4096),
        detached_header: true,
        pbkdf: fast_pbkdf(),
        ..Default::default()
    };
    let image = convert::encryption_header(
        &options,
        options.header_file_size(),
        data_len,
        PASS,
        Placement::Detached,
        &fast_init(),
    )
    .unwrap();
    let key = {
        let dev = MemStorage::new(image.clone());
        let h = Luks2Header::read(&dev).unwrap();
        reencrypt::unlock_volume_keys(&h, &dev, PASS)
            .unwrap()
            .new
            .unwrap()
            .volume_key
    };
    let want = expected_ciphertext(&key, 4096, &plain);
    let opts = Options {
        hotzone: 128 << 10,
        threads: 1,
    };
    let machine = |cut: Option<u64>| {
        let power = Power::new(cut);
        // Checksum resilience assumes 4 KiB atomic writes on the data device (see the sweeps).
        (
            power.directory(),
            power.device_with_atom(plain.clone(), 4096),
            power,
        )
    };
    let encrypt = |dir: &CrashingDirectory, data: &CrashingStorage| -> Result<Outcome, Error> {
        let forgetful = ForgetsDirSync(dir);
        let d: &dyn Directory = if forget_dir_sync { &forgetful } else { dir };
        convert::start_detached_encryption(d, "hdr", &image)?;
        let header = dir.open("hdr")?;
        run(&*header, data, PASS, &opts, &mut |_| true)
    };
    let (dir, data, power) = machine(None);
    encrypt(&dir, &data).unwrap();
    let total = power.operations();
    let (mut images, mut losses) = (0, Vec::new());
    for cut in 0..=total {
        let (dir, data, _) = machine(Some(cut));
        let _ = encrypt(&dir, &data);
        let mut ops = dir.volatile_ops();
        ops.extend(data.volatile_ops());
        for o in crash::outcomes_of(ops, cut) {
            images += 1;
            let (names, bytes) = (dir.image(&o), data.image(&o));
            let verdict = match names.get("hdr") {
                None if bytes == plain => Ok(()),
                None => Err("the data changed but the header file is gone".to_string()),
                Some(h) => {
                    let (hd, dd) = (MemStorage::new(h.clone()), MemStorage::new(bytes));
                    match run(&hd, &dd, PASS, &opts, &mut |_| true) {
                        Ok(Outcome::Finished) if dd.contents() == want => Ok(()),
                        Err(Error::Unsupported(ref why))
                            if why.contains("no reencryption") && dd.contents() == want =>
                        {
                            Ok(())
                        }
                        other => Err(format!("resuming gave {other:?}, or other data")),
                    }
                }
            };
            if let Err(why) = verdict {
                losses.push(format!("cut after {cut} of {total}, {o:?}: {why}"));
            }
        }
    }
    (total + 1, images, losses)
}

#[test]
fn a_detached_encryption_with_its_header_install_survives_every_power_cut() {
    let (cuts, images, losses) = detached_encryption_sweep(false);
    assert!(losses.is_empty(), "{losses:#?}");
    println!("detached encryption with its header install: {cuts} cut points x outcomes = {images} surviving images, 0 losses");
}

/// The file model bites: without the directory sync after the rename, a cut can keep encrypted
/// data while the header file's name is lost.
#[test]
fn a_forgotten_directory_sync_is_caught() {
    let (_, _, losses) = detached_encryption_sweep(true);
    assert!(
        losses.iter().any(|l| l.contains("header file is gone")),
        "{losses:?}"
    );
}

/// Reencryption metadata changed without the keys (here the resilience's hash) is refused with
/// a digest mismatch before anything is written.
#[test]
fn metadata_changed_without_the_keys_is_refused() {
    use sectorcrypt_luks::luks2::metadata::Keyslot;
    let data_len = 1u64 << 20;
    let hdr = MemStorage::new(vec![0; HEADER_LEN as usize]);
    init_detached(&hdr, data_len, 4096);
    let h = Luks2Header::read(&hdr).unwrap();
    let mut md = h.metadata().clone();
    let tampered = md.keyslots.0.iter_mut().any(|(_, k)| match k {
        Keyslot::Reencrypt(k) => match &mut k.resilience {
            reencrypt::Resilience::Checksum { hash, .. } => {
                *hash = "sha1".into();
                true
            }
            _ => false,
        },
        _ => false,
    });
    assert!(tampered, "no reencrypt keyslot to change");
    reencrypt::write_metadata(&hdr, &h, &md).unwrap();
    let data = MemStorage::new(pattern(data_len as usize, 3));
    let before = (hdr.contents(), data.contents());
    let out = run(&hdr, &data, PASS, &Options::default(), &mut |_| true);
    assert!(
        matches!(
            out,
            Err(Error::Luks(sectorcrypt_luks::Error::DigestMismatch(_)))
        ),
        "{out:?}"
    );
    assert!(
        (hdr.contents(), data.contents()) == before,
        "a refused run wrote"
    );
}
