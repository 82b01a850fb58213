//! An encrypted flash end to end: the header read by cryptsetup from a dump of its eraseblocks,
//! the chip holding ciphertext only, OpenSSL decrypting it from the volume key cryptsetup finds
//! and the header's data segment, a `ubinize` image imported and read back by ubi_reader from the
//! decrypted export, and the key commands on the header area.

use std::panic::AssertUnwindSafe;
use std::process::Command;
use std::sync::Arc;

use sectorcrypt_flash::crypt::Policy;
use sectorcrypt_flash::sim::{Faults, SimNand};
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_flashvol::convert::{decrypt, encrypt};
use sectorcrypt_flashvol::{format, read_header, unlock, Error};
use sectorcrypt_luks::FormatOptions;
use sectorcrypt_storage::{MemStorage, Storage};
use sectorcrypt_testkit::luks2_json::require_unknown;
use sectorcrypt_testkit::tools::ubi_reader_volumes;
use sectorcrypt_testkit::{
    cryptsetup, cryptsetup_volume_key, ok, openssl, output, p, pattern, scratch,
};
use sectorcrypt_ubi::media::{EC_HDR_MAGIC, VID_HDR_MAGIC};
use sectorcrypt_ubi::{flash_image, AttachOptions};

use crate::new_flash;

const PASS: &[u8] = b"flash passphrase";

/// The default SLC chip (128 KiB eraseblocks, 2 KiB pages, 512-byte sub-pages), 64 blocks.
fn geometry() -> Geometry {
    Geometry {
        peb_count: 64,
        ..Geometry::default()
    }
}

fn chip() -> Arc<SimNand> {
    let g = geometry();
    let mem = MemStorage::new(vec![0; SimNand::image_len(&g) as usize]);
    Arc::new(SimNand::create(mem, g, &[3]).unwrap())
}

fn dynamic_volume(name: &str, lebs: u32) -> sectorcrypt_ubi::NewVolume {
    sectorcrypt_ubi::NewVolume {
        id: None,
        name: name.into(),
        lebs,
        vol_type: sectorcrypt_ubi::media::VolType::Dynamic,
        alignment: 1,
        autoresize: false,
    }
}

/// Blocks that wear out while the flash is made, as nandsim's `weakblocks=` and `weakpages=`
/// showed them to the format under the kernel: one failing its first erase, one failing the
/// first program of its first page (the EC header UBI writes while it formats). Both are marked
/// bad and the format goes on, as ubiformat does; the flash then attaches writable.
#[test]
fn format_marks_blocks_failing_their_first_erase_or_program_bad() {
    let flash = chip();
    flash.set_faults(Faults {
        weak_blocks: vec![(40, 1)],
        weak_pages: vec![(45, 0, 1)],
        ..Faults::default()
    });
    let opened = format(
        Arc::clone(&flash) as Arc<dyn Flash>,
        &crate::small_key(Policy::AtRest),
        PASS,
    )
    .unwrap();
    assert!(flash.is_bad(40).unwrap(), "the block whose erase failed");
    assert!(flash.is_bad(45).unwrap(), "the block whose program failed");
    let ubi = opened.attach(&AttachOptions::default()).unwrap();
    assert!(!ubi.info().read_only);
    ubi.create_volume(&dynamic_volume("data", 2)).unwrap();
}

/// The data of eraseblocks `blocks`, concatenated.
fn blocks(flash: &dyn Flash, blocks: impl IntoIterator<Item = u32>) -> Vec<u8> {
    let size = flash.geometry().peb_size as usize;
    let mut out = Vec::new();
    for b in blocks {
        let mut buf = vec![0u8; size];
        flash.read(b, 0, &mut buf).unwrap();
        out.extend_from_slice(&buf);
    }
    out
}

#[test]
fn cryptsetup_reads_the_header_and_openssl_decrypts_the_chip() {
    let dir = scratch("flashvol-cryptsetup");
    for (policy, cipher) in [
        (Policy::Thesis, "aes-xts-plain64"),
        (Policy::Visible, "aes-cbc-essiv:sha256"),
        (Policy::AtRest, "aes-xts-plain64"),
    ] {
        let raw = chip();
        let flash = raw.clone() as Arc<dyn Flash>;
        let opened = format(Arc::clone(&flash), &new_flash(policy, cipher, None), PASS).unwrap();
        let area = &opened.header.area;
        assert!(
            !area.blocks().contains(&3),
            "the factory bad block is skipped"
        );
        let hdr = dir.join(format!("{}.hdr", policy.name()));
        std::fs::write(&hdr, blocks(&*flash, area.blocks().iter().copied())).unwrap();
        let key = dir.join("pass");
        std::fs::write(&key, PASS).unwrap();
        let dump = ok(cryptsetup(&["luksDump", p(&hdr)]), "cryptsetup luksDump");
        let text = String::from_utf8_lossy(&dump.stdout);
        assert!(
            text.contains("sectorcrypt-flash"),
            "the token is listed:\n{text}"
        );
        assert!(text.contains(cipher), "{text}");
        ok(
            cryptsetup(&["open", "--test-passphrase", "--key-file", p(&key), p(&hdr)]),
            "cryptsetup open --test-passphrase",
        );
        let vk = cryptsetup_volume_key(&hdr, &key, &[]);

        // Some data in UBI, then the chip's bytes of one data block decrypted by OpenSSL from
        // cryptsetup's volume key by the data segment's rule: sectors of one sub-page counted
        // from the segment's start.
        let ubi = opened.attach(&AttachOptions::default()).unwrap();
        let id = ubi.create_volume(&dynamic_volume("v", 4)).unwrap();
        let data = pattern(126 * 1024, 9);
        ubi.write(id, 0, 0, &data).unwrap();
        drop(ubi);
        // Detached: under every policy but the visible one, no unit is left erased.
        opened.detach().unwrap();
        let first = opened.header.params.data_first;
        let g = geometry();
        let units = u64::from(g.peb_size / g.sub_page_size);
        for peb in [0u32, 1, 7] {
            let file = dir.join(format!("{}-{peb}.bin", policy.name()));
            std::fs::write(&file, blocks(&*flash, [first + peb])).unwrap();
            let plain = openssl::decrypt_units(
                &file,
                cipher,
                &vk,
                g.sub_page_size as usize,
                u64::from(peb) * units,
            );
            let mut ours = vec![0u8; g.peb_size as usize];
            opened.crypt.read(peb, 0, &mut ours).unwrap();
            match policy {
                Policy::Thesis | Policy::AtRest => assert!(
                    plain == ours,
                    "{cipher}: PEB {peb} decrypts to what UBI reads"
                ),
                // Units left erased are not ciphertext: compare the programmed ones.
                _ => {
                    let raw_block = std::fs::read(&file).unwrap();
                    for (i, unit) in raw_block.chunks(512).enumerate() {
                        if unit.iter().any(|&b| b != 0xFF) {
                            assert_eq!(plain[i * 512..(i + 1) * 512], ours[i * 512..(i + 1) * 512]);
                        }
                    }
                }
            }
        }
        assert!(
            opened.crypt.read(0, 0, &mut [0u8; 4]).is_ok(),
            "reads go on after the checks"
        );
    }
}

#[test]
fn detached_the_chip_holds_only_ciphertext_and_every_block_looks_alike() {
    for policy in [Policy::Thesis, Policy::AtRest, Policy::Synced] {
        let raw = chip();
        let flash = raw.clone() as Arc<dyn Flash>;
        let opened = format(
            Arc::clone(&flash),
            &new_flash(policy, "aes-xts-plain64", None),
            PASS,
        )
        .unwrap();
        let ubi = opened.attach(&AttachOptions::default()).unwrap();
        let id = ubi
            .create_volume(&dynamic_volume("secret-volume-name", 8))
            .unwrap();
        let marker = b"PLAINTEXT-MARKER".repeat(128);
        ubi.write(id, 2, 0, &marker).unwrap();
        // An append into a LEB written before the last detach: a journalled rewrite.
        opened.detach().unwrap();
        ubi.write(id, 2, 2048, &marker).unwrap();
        drop(ubi);
        opened.detach().unwrap();
        // Everything after the header area: the rewrite journal, UBI's free and used blocks.
        let g = geometry();
        let from = opened.header.params.rewrite_journal().start;
        let data: Vec<u32> = (from..g.peb_count).filter(|&b| b != 3).collect();
        let bytes = blocks(&*flash, data.iter().copied());
        let find = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        // UBI writes its headers at sub-page boundaries (the erase counter at 0, the volume
        // header at its offset): looked for there. Anywhere in 8 MiB of ciphertext, a given
        // 4 bytes turn up by chance in about one run of 500.
        let header = |magic: u32| {
            let sub = g.sub_page_size as usize;
            bytes.chunks(sub).any(|s| s[..4] == magic.to_be_bytes())
        };
        assert!(
            !header(EC_HDR_MAGIC) && !header(VID_HDR_MAGIC),
            "{policy:?}: no UBI header"
        );
        assert!(
            !find(b"PLAINTEXT-MARKER") && !find(b"secret-volume-name"),
            "{policy:?}: no plaintext"
        );
        assert!(
            !find(&[0xFF; 32]),
            "{policy:?}: no erased run: free space is hidden"
        );
        // Every block on its own, free or used, journal or data: bytes as uniform as random
        // ones (255 degrees of freedom: a chi-square above 400 has a probability below 1e-8).
        for (b, block) in data.iter().zip(bytes.chunks(g.peb_size as usize)) {
            let mut histogram = [0u64; 256];
            block.iter().for_each(|&x| histogram[x as usize] += 1);
            let expected = block.len() as f64 / 256.0;
            let chi2: f64 = histogram
                .iter()
                .map(|&n| (n as f64 - expected).powi(2) / expected)
                .sum();
            assert!(chi2 < 400.0, "{policy:?}: block {b}: chi-square {chi2}");
        }
    }
}

#[test]
fn a_ubinize_image_imported_and_exported_reads_the_same_in_ubi_reader() {
    let dir = scratch("flashvol-import");
    let d = pattern(300_000, 1);
    let s = pattern(70_000, 2);
    std::fs::write(dir.join("d.bin"), &d).unwrap();
    std::fs::write(dir.join("s.bin"), &s).unwrap();
    std::fs::write(
        dir.join("u.cfg"),
        "[d]\nmode=ubi\nimage=d.bin\nvol_id=0\nvol_size=1MiB\nvol_type=dynamic\nvol_name=data\n\
         [s]\nmode=ubi\nimage=s.bin\nvol_id=1\nvol_type=static\nvol_name=cfg\n\
         [a]\nmode=ubi\nvol_id=2\nvol_size=512KiB\nvol_type=dynamic\nvol_name=rest\nvol_flags=autoresize\n",
    )
    .unwrap();
    ok(
        output(Command::new("ubinize").current_dir(&dir).args([
            "-o", "img.ubi", "-p", "128KiB", "-m", "2048", "-s", "512", "u.cfg",
        ])),
        "ubinize",
    );
    let img = std::fs::read(dir.join("img.ubi")).unwrap();
    let raw = chip();
    let flash = raw.clone() as Arc<dyn Flash>;
    let opened = format(
        Arc::clone(&flash),
        &new_flash(Policy::Thesis, "aes-xts-plain64", None),
        PASS,
    )
    .unwrap();
    flash_image(&*opened.crypt, &img, None).unwrap();
    drop(opened);

    let opened = unlock(Arc::clone(&flash), PASS, None).unwrap();
    let ubi = opened.attach(&AttachOptions::default()).unwrap();
    let names: Vec<String> = ubi.info().volumes.into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["data", "cfg", "rest"]);
    drop(ubi);
    // The decrypted export: what UBI sees, block by block, as a nanddump without spare areas.
    let crypt = &opened.crypt;
    let export = dir.join("export.bin");
    std::fs::write(&export, blocks(&**crypt, 0..crypt.geometry().peb_count)).unwrap();
    let volumes = ubi_reader_volumes(&dir, &export);
    let image = |name: &str| volumes[name].clone();
    assert_eq!(&image("data")[..d.len()], &d[..]);
    assert_eq!(image("cfg"), s, "the static volume, exactly");
}

#[test]
fn key_commands_work_on_the_header_area_and_a_wrong_passphrase_changes_nothing() {
    let raw = chip();
    let flash = raw.clone() as Arc<dyn Flash>;
    format(
        Arc::clone(&flash),
        &new_flash(Policy::Thesis, "aes-xts-plain64", None),
        PASS,
    )
    .unwrap();
    let before = blocks(&*flash, 0..64);
    assert!(matches!(
        unlock(Arc::clone(&flash), b"wrong", None),
        Err(Error::Luks(sectorcrypt_luks::Error::WrongPassphrase))
    ));
    assert!(
        blocks(&*flash, 0..64) == before,
        "a wrong passphrase wrote nothing"
    );
    let mut h = read_header(Arc::clone(&flash)).unwrap();
    let vk = sectorcrypt_flashvol::volume_key(&h, PASS, None).unwrap();
    let pbkdf =
        sectorcrypt_luks::luks2::Pbkdf::pbkdf2_forced(sectorcrypt_luks::hash::Hash::Sha256, 1000);
    h.header
        .add_keyslot(&h.area, &vk, b"second", Some(3), &pbkdf)
        .unwrap();
    let second = unlock(Arc::clone(&flash), b"second", None).unwrap();
    assert_eq!(second.keyslot, 3);
    let mut h = read_header(Arc::clone(&flash)).unwrap().header;
    let area = read_header(Arc::clone(&flash)).unwrap().area;
    h.kill_keyslot(&area, 0).unwrap();
    assert!(unlock(Arc::clone(&flash), PASS, None).is_err());
    assert!(unlock(Arc::clone(&flash), b"second", None).is_ok());
}

#[test]
fn a_plain_chip_or_a_luks_volume_is_not_an_encrypted_flash() {
    let raw = chip();
    let flash = raw.clone() as Arc<dyn Flash>;
    let Err(Error::NotEncrypted(why)) = read_header(Arc::clone(&flash)) else {
        panic!("an erased chip read as an encrypted flash")
    };
    assert!(why.contains("no LUKS2 header"), "{why}");
    // A LUKS2 header without the flash token (a disk's header copied onto the chip).
    let area = sectorcrypt_flash::area::BlockArea::open(Arc::clone(&flash), 0, 3).unwrap();
    let options = FormatOptions {
        detached_header: true,
        metadata_size: Some(16 << 10),
        keyslots_size: Some(3 * (128 << 10) - (32 << 10)),
        ..new_flash(Policy::Thesis, "aes-xts-plain64", None).luks
    };
    sectorcrypt_luks::format(&area, 1 << 20, &options, PASS).unwrap();
    let Err(Error::NotEncrypted(why)) = read_header(Arc::clone(&flash)) else {
        panic!("a LUKS volume read as an encrypted flash")
    };
    assert!(why.contains("token"), "{why}");
    assert!(matches!(
        unlock(flash, PASS, None),
        Err(Error::NotEncrypted(_))
    ));
}

/// Give the header on `flash` the mandatory requirement `x-future-feature`.
fn add_requirement(flash: &Arc<dyn Flash>) {
    let h = read_header(Arc::clone(flash)).unwrap();
    let mut bytes = vec![0; h.area.len().unwrap() as usize];
    h.area.read_at(&mut bytes, 0).unwrap();
    require_unknown(&mut bytes, "x-future-feature");
    h.area.write_at(&bytes, 0).unwrap();
    h.area.sync().unwrap();
}

#[test]
fn a_header_with_an_unknown_mandatory_requirement_is_read_but_never_attached_or_written() {
    let flash = chip() as Arc<dyn Flash>;
    let new = new_flash(Policy::Thesis, "aes-xts-plain64", None);
    format(Arc::clone(&flash), &new, PASS).unwrap();
    add_requirement(&flash);
    let before = blocks(&*flash, 0..64);
    // Refused, naming the requirement (as UnmetRequirements, or as a header edit refused).
    let unmet = |r: Result<(), Error>, what: &str| match r {
        Err(e) => {
            let why = e.to_string();
            assert!(
                why.contains("requirements") && why.contains("(x-future-feature)"),
                "{what}: {why}"
            );
        }
        Ok(()) => panic!("{what} went ahead"),
    };
    // Reading it works (dump does), with the requirement shown.
    let h = read_header(Arc::clone(&flash)).unwrap();
    assert_eq!(
        h.header.metadata().unknown_requirements(),
        ["x-future-feature"]
    );
    unmet(unlock(Arc::clone(&flash), PASS, None).map(drop), "attach");
    let pbkdf =
        sectorcrypt_luks::luks2::Pbkdf::pbkdf2_forced(sectorcrypt_luks::hash::Hash::Sha256, 1000);
    let vk = sectorcrypt_flashvol::volume_key(&h, PASS, None).unwrap();
    let mut header = h.header;
    unmet(
        header
            .add_keyslot(&h.area, &vk, b"second", None, &pbkdf)
            .map(drop)
            .map_err(Error::Luks),
        "add a keyslot",
    );
    unmet(decrypt(Arc::clone(&flash), PASS, &mut |_, _| {}), "decrypt");
    unmet(
        encrypt(Arc::clone(&flash), &new, PASS, &mut |_, _| {}).map(drop),
        "encrypt",
    );
    assert!(blocks(&*flash, 0..64) == before, "nothing was written");

    // A decryption cut short, then given the requirement: resuming it writes nothing either.
    let flash = chip() as Arc<dyn Flash>;
    format(Arc::clone(&flash), &new, PASS).unwrap();
    let cut = std::panic::catch_unwind(AssertUnwindSafe(|| {
        decrypt(Arc::clone(&flash), PASS, &mut |done, _| {
            assert!(done < 2, "cut");
        })
    }));
    assert!(cut.is_err(), "the decryption was cut");
    add_requirement(&flash);
    let before = blocks(&*flash, 0..64);
    unmet(
        decrypt(Arc::clone(&flash), PASS, &mut |_, _| {}),
        "resume a decryption",
    );
    assert!(blocks(&*flash, 0..64) == before, "the resume wrote nothing");
}
