//! Attaching, volumes and LEBs on a simulated chip.

use std::sync::Arc;

use sectorcrypt_flash::sim::Faults;
use sectorcrypt_flash::Flash;
use sectorcrypt_testkit::pattern;
use sectorcrypt_testkit::scratch;
use sectorcrypt_testkit::tools::ubi_reader_volumes;
use sectorcrypt_ubi::media::{EcHdr, Header, VolType};
use sectorcrypt_ubi::{flash_image, Error, NewVolume};

use crate::{attach, dump, dynamic, read_volume, small, static_volume, ubinize, Chip, LEB};

/// A `ubinize` image with dynamic, static and auto-resize volumes, flashed as `ubiformat -f`
/// would, attaches with the kernel's rules: the volumes, their sizes and contents as made, the
/// auto-resize volume grown over what is left (and the flag cleared for good), the PEB reserve
/// as the kernel computes it, the flasher's trailing 0xFF pages left unwritten.
#[test]
fn a_flashed_ubinize_image_attaches_with_the_kernels_rules() {
    let dir = scratch("ubi-flashed");
    let d = pattern(30_000, 1);
    let s = pattern(20_000, 2);
    std::fs::write(dir.join("d.bin"), &d).unwrap();
    std::fs::write(dir.join("s.bin"), &s).unwrap();
    let img = ubinize(
        &dir,
        "[d]\nmode=ubi\nimage=d.bin\nvol_id=0\nvol_size=200KiB\nvol_type=dynamic\nvol_name=data\n\
         [s]\nmode=ubi\nimage=s.bin\nvol_id=1\nvol_type=static\nvol_name=cfg\n\
         [a]\nmode=ubi\nvol_id=3\nvol_size=64KiB\nvol_type=dynamic\nvol_name=grow\nvol_flags=autoresize\n",
    );
    let (chip, flash) = Chip::new(small(64));
    let done = flash_image(&*flash, &img, None).unwrap();
    assert_eq!(done.image_pebs as usize, img.len() / (16 * 1024));
    assert_eq!(done.image_pebs + done.formatted_pebs, 64);
    // The flasher writes no trailing 0xFF page (ubinize's PEBs are whole, 0xFF-padded): the
    // dynamic volume's last LEB keeps erased pages that UBIFS can still write.
    let unwritten = (0..done.image_pebs)
        .filter(|&p| flash.program_counts(p).unwrap().contains(&0))
        .count();
    assert!(
        unwritten >= 2,
        "{unwritten} image PEBs with pages left erased"
    );

    let ubi = attach(&flash);
    let info = ubi.info();
    let names: Vec<_> = info
        .volumes
        .iter()
        .map(|v| (v.id, v.name.as_str(), v.vol_type))
        .collect();
    assert_eq!(
        names,
        [
            (0, "data", VolType::Dynamic),
            (1, "cfg", VolType::Static),
            (3, "grow", VolType::Dynamic)
        ]
    );
    let vol = |id: u32| info.volumes.iter().find(|v| v.id == id).unwrap().clone();
    assert_eq!(vol(0).lebs, (200 * 1024_u32).div_ceil(LEB as u32));
    assert_eq!(vol(1).data_bytes, 20_000);
    assert_eq!(&read_volume(&ubi, 0)[..d.len()], &d[..]);
    assert!(read_volume(&ubi, 0)[d.len()..].iter().all(|&b| b == 0xFF));
    assert_eq!(&read_volume(&ubi, 1)[..s.len()], &s[..]);
    // The kernel's reserve: 20 per 1024 PEBs rounded up (2 of 64), the layout volume (2),
    // wear-levelling (1) and atomic change (1); the auto-resize volume took the rest.
    assert_eq!((info.reserved_for_bad, info.available_pebs), (2, 0));
    let lebs: u32 = info.volumes.iter().map(|v| v.lebs).sum();
    assert_eq!(lebs + 2 + 1 + 1 + 2, 64);
    assert!(!vol(3).autoresize);
    assert_eq!(
        info.image_seq,
        match EcHdr::parse(&img) {
            Header::Valid(h) => h.image_seq,
            _ => unreachable!(),
        }
    );
    drop(ubi);
    let again = attach(&chip.power_on());
    assert_eq!(
        again.info().volumes,
        info.volumes,
        "the resize was written to the table"
    );
}

/// An empty chip is formatted at attach (a random image sequence, every PEB with an EC header);
/// volumes made, written, changed and unmapped read back the same after a re-attach, and
/// ubi_reader (an independent reader) extracts the same volume images from a dump.
#[test]
fn an_empty_chip_is_formatted_and_what_is_written_survives_reattach() {
    let (chip, flash) = Chip::new(small(48));
    let ubi = attach(&flash);
    let info = ubi.info();
    assert_ne!(info.image_seq, 0);
    assert!(info.volumes.is_empty());
    let a = ubi.create_volume(&dynamic("alpha", 8)).unwrap();
    let b = ubi.create_volume(&static_volume("beta", 3)).unwrap();
    let one = pattern(LEB, 10);
    let two = pattern(LEB, 11);
    ubi.write(a, 0, 0, &one[..4096]).unwrap();
    ubi.write(a, 0, 4096, &one[4096..]).unwrap();
    ubi.write(a, 1, 0, &two).unwrap();
    ubi.change(a, 1, &one).unwrap();
    ubi.write(a, 2, 0, &two).unwrap();
    ubi.unmap(a, 2).unwrap();
    ubi.map(a, 3).unwrap();
    let blob = pattern(LEB + 1000, 12);
    ubi.update_volume(b, &blob).unwrap();
    // A write into space already written is the chip's error, not silent corruption.
    assert!(ubi.write(a, 0, 0, &one[..2048]).is_err());
    ubi.sync().unwrap();
    let before = (
        read_volume(&ubi, a),
        read_volume(&ubi, b),
        ubi.info().volumes,
    );
    drop(ubi);

    let flash = chip.power_on();
    let ubi = attach(&flash);
    assert_eq!(
        (
            read_volume(&ubi, a),
            read_volume(&ubi, b),
            ubi.info().volumes
        ),
        before
    );
    assert_eq!(&before.0[..LEB], &one[..]);
    assert_eq!(&before.0[LEB..2 * LEB], &one[..], "the atomic change");
    assert!(before.0[2 * LEB..].iter().all(|&b| b == 0xFF));
    assert!(ubi.is_mapped(a, 3).unwrap() && !ubi.is_mapped(a, 2).unwrap());
    assert_eq!(&before.1[..blob.len()], &blob[..]);
    let seq = ubi.info().image_seq;
    for peb in 0..48 {
        let mut hdr = [0u8; 64];
        flash.read(peb, 0, &mut hdr).unwrap();
        let Header::Valid(h) = EcHdr::parse(&hdr) else {
            panic!("PEB {peb} has no EC header")
        };
        assert_eq!(h.image_seq, seq);
    }

    let dir = scratch("ubi-reader");
    std::fs::write(dir.join("flash.bin"), dump(&*flash)).unwrap();
    let volumes = ubi_reader_volumes(&dir, &dir.join("flash.bin"));
    let image = |name: &str| volumes[name].clone();
    assert_eq!(&image("alpha")[..2 * LEB], &before.0[..2 * LEB]);
    assert_eq!(&image("beta")[..blob.len()], &blob[..]);
}

/// Volumes: names and IDs are unique, sizes fit the free PEBs, a static volume is written only
/// whole, and removing, resizing and renaming stick across a re-attach.
#[test]
fn volumes_are_created_removed_resized_and_renamed() {
    let (chip, flash) = Chip::new(small(40));
    let ubi = attach(&flash);
    let a = ubi.create_volume(&dynamic("a", 4)).unwrap();
    assert!(matches!(
        ubi.create_volume(&dynamic("a", 1)),
        Err(Error::Volume(_))
    ));
    assert!(matches!(
        ubi.create_volume(&NewVolume {
            id: Some(a),
            ..dynamic("b", 1)
        }),
        Err(Error::Volume(_))
    ));
    let avail = ubi.info().available_pebs;
    assert!(matches!(
        ubi.create_volume(&dynamic("huge", avail + 1)),
        Err(Error::NoSpace(_))
    ));
    let s = ubi.create_volume(&static_volume("s", 2)).unwrap();
    assert!(matches!(
        ubi.write(s, 0, 0, &[0; 2048]),
        Err(Error::Volume(_))
    ));
    assert!(matches!(
        ubi.write(a, 0, 1, &[0; 2048]),
        Err(Error::OutOfRange(_))
    ));
    assert!(matches!(
        ubi.write(a, 4, 0, &[0; 2048]),
        Err(Error::OutOfRange(_))
    ));
    let data = pattern(3 * LEB, 5);
    ubi.write(a, 3, 0, &data[..LEB]).unwrap();
    ubi.resize_volume(a, 2).unwrap();
    ubi.rename_volume(a, "renamed").unwrap();
    ubi.remove_volume(s).unwrap();
    let after = ubi.info();
    drop(ubi);
    let ubi = attach(&chip.power_on());
    let info = ubi.info();
    assert_eq!(info.volumes, after.volumes);
    assert_eq!(info.available_pebs, after.available_pebs);
    assert_eq!(info.volumes.len(), 1);
    assert_eq!(
        (info.volumes[0].name.as_str(), info.volumes[0].lebs),
        ("renamed", 2)
    );
    assert_eq!(
        info.volumes[0].mapped_lebs, 0,
        "the LEB past the new end was erased"
    );
}

/// Wear-levelling: one LEB changed over and over while a static volume's data never changes;
/// with a small threshold the static data moves to worn PEBs, so the counters stay within
/// reach of each other, and the data still passes its CRC.
#[test]
fn wear_levelling_moves_data_that_never_changes() {
    let (chip, flash) = Chip::new(small(24));
    let opts = sectorcrypt_ubi::AttachOptions {
        wl_threshold: 8,
        ..Default::default()
    };
    let ubi = sectorcrypt_ubi::Ubi::attach(flash.clone(), &opts).unwrap();
    let hot = ubi.create_volume(&dynamic("hot", 1)).unwrap();
    let cold = ubi.create_volume(&static_volume("cold", 4)).unwrap();
    let blob = pattern(4 * LEB - 100, 7);
    ubi.update_volume(cold, &blob).unwrap();
    for i in 0..400 {
        ubi.change(hot, 0, &pattern(2048, i)).unwrap();
    }
    let (min, _, max) = ubi.info().erase_counters;
    assert!(
        max - min <= 2 * 8 + 2,
        "erase counters {min}..{max} with threshold 8"
    );
    assert!(
        min >= 8,
        "even the PEBs that held the static data were worn ({min})"
    );
    assert_eq!(&read_volume(&ubi, cold)[..blob.len()], &blob[..]);
    drop(ubi);
    let ubi = sectorcrypt_ubi::Ubi::attach(chip.power_on(), &opts).unwrap();
    assert_eq!(&read_volume(&ubi, cold)[..blob.len()], &blob[..]);
    // UBI's counters are the chip's own erase counts (nothing else erased this chip).
    let truth = chip.power_on().erase_counts();
    let ecs = ubi.erase_counters();
    for peb in 0..24 {
        assert_eq!(ecs[peb], u64::from(truth[peb]), "PEB {peb}");
    }
}

/// PEBs that fail to erase or to program are marked bad and replaced from the reserve, the data
/// stays; bit-flips move a LEB (scrubbing).
#[test]
fn bad_pebs_and_bit_flips_are_handled_as_ubi_does() {
    let (chip, flash) = Chip::new(small(32));
    let ubi = attach(&flash);
    let a = ubi.create_volume(&dynamic("a", 4)).unwrap();
    let keep = pattern(LEB, 3);
    ubi.write(a, 1, 0, &keep).unwrap();
    let reserve = ubi.info().reserved_for_bad;
    assert_eq!(reserve, 1);
    flash.set_faults(Faults {
        weak_blocks: (0..32).map(|b| (b, 3)).collect(),
        ..Faults::default()
    });
    // Every PEB now fails at its third erase in this run: changes wear them out one by one.
    let mut last = Vec::new();
    let mut result = Ok(());
    for i in 0..60 {
        last = pattern(4096, 100 + i);
        result = ubi.change(a, 0, &last);
        if result.is_err() {
            break;
        }
    }
    let info = ubi.info();
    assert!(
        info.bad_pebs >= 1,
        "a PEB that failed to erase was marked bad"
    );
    assert_eq!(info.reserved_for_bad, reserve.saturating_sub(info.bad_pebs));
    let mut buf = vec![0u8; LEB];
    ubi.read(a, 1, 0, &mut buf).unwrap();
    assert_eq!(buf, keep, "data written before survives");
    if result.is_ok() {
        ubi.read(a, 0, 0, &mut buf[..4096]).unwrap();
        assert_eq!(&buf[..4096], &last[..]);
    }
    drop(ubi);
    let flash = chip.power_on();
    assert!((0..32).any(|p| flash.is_bad(p).unwrap()));
    let ubi = attach(&flash);
    ubi.read(a, 1, 0, &mut buf).unwrap();
    assert_eq!(buf, keep);
}

/// A PEB with a valid EC header but programmed pages after it (what a power cut inside an
/// encryption layer's block rewrite can leave) is erased again before UBI writes it, never
/// written over.
#[test]
fn a_free_peb_that_is_not_erased_is_erased_before_use() {
    let (chip, flash) = Chip::new(small(24));
    let ubi = attach(&flash);
    let a = ubi.create_volume(&dynamic("a", 6)).unwrap();
    drop(ubi);
    let flash = chip.power_on();
    let mut dirtied = 0;
    for peb in 0..24 {
        let mut vid = [0u8; 64];
        flash.read(peb, 512, &mut vid).unwrap();
        if vid.iter().all(|&b| b == 0xFF) {
            flash
                .program(peb, 4096, &pattern(2048, u64::from(peb)))
                .unwrap();
            dirtied += 1;
        }
    }
    assert!(dirtied >= 10, "{dirtied} free PEBs dirtied");
    let ubi = attach(&flash);
    let data: Vec<Vec<u8>> = (0..6).map(|i| pattern(LEB, 40 + i)).collect();
    for (lnum, d) in data.iter().enumerate() {
        ubi.write(a, lnum as u32, 0, d).unwrap();
    }
    drop(ubi);
    let ubi = attach(&chip.power_on());
    for (lnum, d) in data.iter().enumerate() {
        let mut buf = vec![0u8; LEB];
        ubi.read(a, lnum as u32, 0, &mut buf).unwrap();
        assert!(&buf == d, "LEB {lnum}");
    }
}

/// A dynamic volume as a `Storage`: writes at any offset and length, across LEB boundaries,
/// read back as a plain model says, also after a re-attach; a static volume is read-only and as
/// long as its data rounded up to a sector.
#[test]
fn volumes_as_storage_take_writes_anywhere_and_static_ones_refuse() {
    use rand::{Rng, SeedableRng};
    use sectorcrypt_storage::Storage;
    use sectorcrypt_ubi::block::VolumeStorage;
    use std::sync::Arc;

    let (chip, flash) = Chip::new(small(40));
    let ubi = Arc::new(attach(&flash));
    let d = ubi.create_volume(&dynamic("d", 4)).unwrap();
    let s = ubi.create_volume(&static_volume("s", 2)).unwrap();
    let blob = pattern(LEB + 1000, 8);
    ubi.update_volume(s, &blob).unwrap();
    let dev = VolumeStorage::open(Arc::clone(&ubi), d, false).unwrap();
    let size = dev.len().unwrap() as usize;
    assert_eq!(size, 4 * LEB);
    let mut model = vec![0xFFu8; size];
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..40 {
        let len = rng.gen_range(1..3 * LEB / 2);
        let at = rng.gen_range(0..size - len);
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        dev.write_at(&data, at as u64).unwrap();
        model[at..at + len].copy_from_slice(&data);
    }
    let mut back = vec![0u8; size];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back == model);
    assert!(
        dev.write_at(&[0; 2], size as u64 - 1).is_err(),
        "past the end"
    );
    let st = VolumeStorage::open(Arc::clone(&ubi), s, false).unwrap();
    assert_eq!(st.len().unwrap(), (LEB as u64 + 1000).div_ceil(512) * 512);
    assert!(!st.is_writable());
    assert!(st.write_at(&[0; 512], 0).is_err());
    let mut sbuf = vec![0u8; blob.len()];
    st.read_at(&mut sbuf, 0).unwrap();
    assert!(sbuf == blob);
    dev.sync().unwrap();
    drop((dev, st, ubi));
    let ubi = Arc::new(attach(&chip.power_on()));
    let dev = VolumeStorage::open(ubi, d, true).unwrap();
    assert!(!dev.is_writable());
    dev.read_at(&mut back, 0).unwrap();
    assert!(back == model, "after re-attach");
}

/// `evacuate`: every LEB held below a PEB moves above it (the PEBs below keep no VID header),
/// the data reads the same, and asking for more room than is available is refused.
#[test]
fn evacuate_moves_every_leb_out_of_the_first_pebs() {
    let (chip, flash) = Chip::new(small(40));
    let ubi = attach(&flash);
    let a = ubi.create_volume(&dynamic("a", 8)).unwrap();
    let data: Vec<Vec<u8>> = (0..8).map(|i| pattern(LEB, 60 + i)).collect();
    for (lnum, d) in data.iter().enumerate() {
        ubi.write(a, lnum as u32, 0, d).unwrap();
    }
    let avail = ubi.info().available_pebs;
    assert!(matches!(ubi.evacuate(avail + 10), Err(Error::NoSpace(_))));
    ubi.evacuate(10).unwrap();
    for (lnum, d) in data.iter().enumerate() {
        let mut buf = vec![0u8; LEB];
        ubi.read(a, lnum as u32, 0, &mut buf).unwrap();
        assert!(&buf == d, "LEB {lnum}");
    }
    drop(ubi);
    let flash = chip.power_on();
    for peb in 0..10 {
        let mut vid = [0u8; 64];
        flash.read(peb, 512, &mut vid).unwrap();
        assert!(
            vid.iter().all(|&b| b == 0xFF),
            "PEB {peb} still holds a LEB"
        );
    }
    let ubi = attach(&flash);
    assert_eq!(read_volume(&ubi, a)[..LEB], data[0][..]);
}

/// Reads that need the ECC (nandsim's `bitflips=`: corrected flips, about one page read in 1024)
/// get their LEB moved to another PEB (scrubbing), the data unchanged; a page that loses its
/// data (`gravepages=`) is an error for its reader, not silence.
#[test]
fn bit_flips_get_a_leb_scrubbed_and_lost_pages_are_reported() {
    let (_chip, flash) = Chip::new(small(32));
    let ubi = attach(&flash);
    let a = ubi.create_volume(&dynamic("a", 4)).unwrap();
    let data: Vec<Vec<u8>> = (0..4).map(|i| pattern(LEB, 80 + i)).collect();
    for (lnum, d) in data.iter().enumerate() {
        ubi.write(a, lnum as u32, 0, d).unwrap();
    }
    let before = ubi.info().max_sqnum;
    flash.set_faults(Faults {
        bitflips: 2,
        ecc_strength: 4,
        seed: 7,
        ..Faults::default()
    });
    let mut buf = vec![0u8; LEB];
    // 4 LEBs of 7 pages, 200 times: about 5 corrected reads are expected.
    for _ in 0..200 {
        for (lnum, d) in data.iter().enumerate() {
            ubi.read(a, lnum as u32, 0, &mut buf).unwrap();
            assert!(&buf == d, "LEB {lnum} read wrong");
        }
    }
    assert!(
        ubi.info().max_sqnum > before,
        "a LEB read with bit-flips was moved"
    );
    flash.set_faults(Faults::default());
    let mut vid = [0u8; 64];
    let used = (0..32)
        .find(|&peb| {
            flash.read(peb, 512, &mut vid).unwrap();
            matches!(
                sectorcrypt_ubi::media::VidHdr::parse(&vid, LEB as u32),
                Header::Valid(v) if v.vol_id == a && v.lnum == 2
            )
        })
        .unwrap();
    flash.set_faults(Faults {
        grave_pages: vec![(used, 3, 0)],
        ..Faults::default()
    });
    assert!(matches!(
        ubi.read(a, 2, 0, &mut buf),
        Err(Error::Flash(sectorcrypt_flash::Error::Uncorrectable { .. }))
    ));
}

/// Attached read-only (the flash opened read-only, as `flash read` opens it), reads with
/// bit-flips return the data and leave the LEB where it is: a scrub writes, so it waits for a
/// writable attach instead of failing the read (as the kernel's nandsim showed it did).
#[test]
fn a_read_only_attach_reads_through_bit_flips_without_scrubbing() {
    let (_chip, flash) = Chip::new(small(32));
    let ubi = attach(&flash);
    let a = ubi.create_volume(&dynamic("a", 1)).unwrap();
    let data = pattern(LEB, 90);
    ubi.write(a, 0, 0, &data).unwrap();
    let sqnum = ubi.info().max_sqnum;
    drop(ubi);
    // The same faults and reads as the scrubbing test above, which do move a LEB.
    flash.set_faults(Faults {
        bitflips: 2,
        ecc_strength: 4,
        seed: 7,
        ..Faults::default()
    });
    let read_only = sectorcrypt_ubi::AttachOptions {
        read_only: true,
        ..Default::default()
    };
    let ubi =
        sectorcrypt_ubi::Ubi::attach(Arc::clone(&flash) as Arc<dyn Flash>, &read_only).unwrap();
    let mut buf = vec![0u8; LEB];
    for _ in 0..800 {
        ubi.read(a, 0, 0, &mut buf).unwrap();
        assert!(buf == data, "LEB 0 read wrong");
    }
    assert_eq!(ubi.info().max_sqnum, sqnum, "a read-only attach wrote");
    assert!(matches!(ubi.write(a, 0, 0, &data), Err(Error::ReadOnly)));
}

/// The kernel's attach rules: a PEB with a damaged VID header over data that is not erased is
/// corrupted (kept, counted, never erased), one over erased data was a write cut short (erased);
/// as many corrupted PEBs as the kernel's limit (5% of the good PEBs, at least 8) refuse the
/// attach; a PEB of another image (its image sequence) refuses it too.
#[test]
fn attach_keeps_counts_and_limits_corrupted_pebs_and_checks_the_image() {
    use sectorcrypt_ubi::media::EcHdr;
    let (chip, flash) = Chip::new(small(40));
    let ubi = attach(&flash);
    let a = ubi.create_volume(&dynamic("a", 2)).unwrap();
    ubi.write(a, 0, 0, &pattern(LEB, 1)).unwrap();
    let seq = ubi.info().image_seq;
    drop(ubi);
    let flash = chip.power_on();
    let free: Vec<u32> = (0..40)
        .filter(|&peb| {
            let mut vid = [0u8; 64];
            flash.read(peb, 512, &mut vid).unwrap();
            vid.iter().all(|&b| b == 0xFF)
        })
        .collect();
    // A garbage VID header: over data (corrupted) on one PEB, over erased data (cut short) on
    // another.
    flash.program(free[0], 512, &[0x42; 512]).unwrap();
    flash.program(free[0], 4096, &pattern(2048, 9)).unwrap();
    flash.program(free[1], 512, &[0x42; 512]).unwrap();
    let ubi = attach(&flash);
    assert_eq!(ubi.info().corrupted_pebs, 1);
    drop(ubi);
    let mut data = [0u8; 2048];
    flash.read(free[0], 4096, &mut data).unwrap();
    assert_eq!(
        data.to_vec(),
        pattern(2048, 9),
        "a corrupted PEB is kept as it was"
    );
    let mut vid = [0u8; 64];
    flash.read(free[1], 512, &mut vid).unwrap();
    assert!(
        vid.iter().all(|&b| b == 0xFF),
        "a write cut short was erased"
    );
    // Eight corrupted PEBs (5% of 40 is 2, the kernel's floor is 8): refused.
    let flash = chip.power_on();
    for &peb in &free[2..9] {
        flash.program(peb, 512, &[0x42; 512]).unwrap();
        flash.program(peb, 4096, &pattern(2048, 9)).unwrap();
    }
    let refused =
        sectorcrypt_ubi::Ubi::attach(flash.clone(), &sectorcrypt_ubi::AttachOptions::default());
    assert!(
        matches!(refused, Err(Error::Refused(_))),
        "eight corrupted PEBs"
    );
    // Another image's PEB.
    let (chip, flash) = Chip::new(small(24));
    drop(attach(&flash));
    let flash = chip.power_on();
    let mut hdr = [0u8; 64];
    flash.read(5, 0, &mut hdr).unwrap();
    let Header::Valid(mut ec) = EcHdr::parse(&hdr) else {
        panic!("no EC header")
    };
    assert_ne!(ec.image_seq, seq.wrapping_add(1));
    ec.image_seq = ec.image_seq.wrapping_add(1);
    flash.erase(5).unwrap();
    flash
        .program(5, 0, &[&ec.to_bytes()[..], &[0xFF; 448][..]].concat())
        .unwrap();
    let refused = sectorcrypt_ubi::Ubi::attach(flash, &sectorcrypt_ubi::AttachOptions::default());
    assert!(matches!(refused, Err(Error::Refused(why)) if why.contains("image")));
}
