//! Power cuts at every program and erase of an operation (the chip leaves the page or block in
//! flight half done): after the next attach every LEB holds its old or its new data, the volume
//! table the old or the new volumes, never garbage, and attaching never refuses.

use std::cell::Cell;

use sectorcrypt_flash::sim::MemChip;
use sectorcrypt_testkit::pattern;
use sectorcrypt_ubi::{AttachOptions, Error, Ubi};

use crate::{attach, dynamic, read_volume, small, static_volume, Chip, LEB};

/// Prepare a chip with `prepare`, then for n = 1, 2, ... cut the power at the n-th flash
/// operation of `op` on a copy of it, attach again and `verify`, until `op` runs to its end.
/// Returns the number of cut points.
fn sweep(
    opts: &AttachOptions,
    prepare: impl Fn(&Ubi),
    op: impl Fn(&Ubi) -> Result<(), Error>,
    verify: impl Fn(&Ubi),
) -> u64 {
    let (base, flash) = MemChip::create(small(32), &[]).unwrap();
    let ubi = Ubi::attach(flash, opts).unwrap();
    prepare(&ubi);
    ubi.sync().unwrap();
    drop(ubi);
    for n in 1.. {
        let run = base.copy();
        let open = || run.power_on().unwrap();
        let flash = open();
        let ubi = Ubi::attach(flash.clone(), opts).unwrap();
        flash.cut_power_at(Some(n));
        let result = op(&ubi);
        if !flash.is_off() {
            result.unwrap();
            return n - 1;
        }
        drop(ubi);
        let after = Ubi::attach(open(), opts)
            .unwrap_or_else(|e| panic!("cut {n}: attach refused after the power cut: {e}"));
        verify(&after);
    }
    unreachable!()
}

/// The data of LEB `lnum` of volume `id`.
fn leb(ubi: &Ubi, id: u32, lnum: u32) -> Vec<u8> {
    let mut buf = vec![0u8; LEB];
    ubi.read(id, lnum, 0, &mut buf).unwrap();
    buf
}

/// A read-only attach (of a flash opened read-only, as `flash read` opens it) after a cut
/// anywhere in an atomic change: what the cut left to erase stays as it is, nothing is written,
/// and the LEB reads old or new. (Under the kernel's nandsim, `flash read` after a killed
/// `flash attach` is this case.)
#[test]
fn a_read_only_attach_after_a_cut_anywhere_writes_nothing() {
    let read_only = AttachOptions {
        read_only: true,
        ..AttachOptions::default()
    };
    let (old, new) = (pattern(LEB, 3), pattern(LEB, 4));
    let (base, flash) = MemChip::create(small(32), &[]).unwrap();
    let ubi = Ubi::attach(flash, &AttachOptions::default()).unwrap();
    let v = ubi.create_volume(&dynamic("v", 1)).unwrap();
    ubi.write(v, 0, 0, &old).unwrap();
    ubi.sync().unwrap();
    drop(ubi);
    for n in 1.. {
        let run = base.copy();
        let flash = run.power_on().unwrap();
        let ubi = Ubi::attach(flash.clone(), &AttachOptions::default()).unwrap();
        flash.cut_power_at(Some(n));
        let result = ubi.change(v, 0, &new);
        if !flash.is_off() {
            result.unwrap();
            assert!(n > 2, "only {} cut points", n - 1);
            return;
        }
        drop(ubi);
        let flash = run.power_on().unwrap();
        let after = Ubi::attach(flash.clone(), &read_only)
            .unwrap_or_else(|e| panic!("cut {n}: the read-only attach refused: {e}"));
        let got = leb(&after, v, 0);
        assert!(got == old || got == new, "cut {n}");
        assert_eq!(flash.operations(), 0, "cut {n}: the read-only attach wrote");
    }
}

#[test]
fn an_atomic_change_is_old_or_new_after_a_cut_anywhere() {
    let old = pattern(LEB, 1);
    let new = pattern(LEB, 2);
    let cuts = sweep(
        &AttachOptions::default(),
        |u| {
            u.create_volume(&dynamic("v", 4)).unwrap();
            u.write(0, 1, 0, &old).unwrap();
        },
        |u| u.change(0, 1, &new),
        |u| {
            let got = leb(u, 0, 1);
            assert!(got == old || got == new, "LEB 1 is neither old nor new");
        },
    );
    assert!(cuts >= 4, "{cuts} cut points");
}

#[test]
fn volume_table_updates_are_old_or_new_after_a_cut_anywhere() {
    let keep = pattern(LEB, 3);
    let prepare = |u: &Ubi| {
        u.create_volume(&dynamic("keep", 2)).unwrap();
        u.write(0, 0, 0, &keep).unwrap();
        u.create_volume(&dynamic("gone", 2)).unwrap();
        u.write(1, 1, 0, &keep).unwrap();
    };
    let check_keep = |u: &Ubi| assert_eq!(leb(u, 0, 0), keep, "an untouched volume changed");
    let mut total = 0;
    total += sweep(
        &AttachOptions::default(),
        prepare,
        |u| u.create_volume(&dynamic("new", 3)).map(|_| ()),
        |u| {
            check_keep(u);
            let names: Vec<String> = u.info().volumes.into_iter().map(|v| v.name).collect();
            assert!(
                names == ["keep", "gone"] || names == ["keep", "gone", "new"],
                "{names:?}"
            );
        },
    );
    total += sweep(
        &AttachOptions::default(),
        prepare,
        |u| u.remove_volume(1),
        |u| {
            check_keep(u);
            match u.info().volumes.len() {
                1 => {}
                2 => assert_eq!(leb(u, 1, 1), keep, "a volume not removed lost data"),
                n => panic!("{n} volumes"),
            }
        },
    );
    total += sweep(
        &AttachOptions::default(),
        prepare,
        |u| u.rename_volume(1, "renamed"),
        |u| {
            check_keep(u);
            let name = u.info().volumes[1].name.clone();
            assert!(name == "gone" || name == "renamed", "{name}");
        },
    );
    assert!(total >= 12, "{total} cut points");
}

#[test]
fn a_static_volume_update_cut_short_is_seen_never_read_as_data() {
    let old = pattern(2 * LEB + 10, 4);
    let new = pattern(LEB + 500, 5);
    let cuts = sweep(
        &AttachOptions::default(),
        |u| {
            let id = u.create_volume(&static_volume("s", 3)).unwrap();
            u.update_volume(id, &old).unwrap();
        },
        |u| u.update_volume(0, &new),
        |u| {
            let v = u.info().volumes[0].clone();
            if v.corrupted {
                assert!(matches!(
                    u.read(0, 0, 0, &mut [0; 1]),
                    Err(Error::Corrupt(_))
                ));
                return;
            }
            let mut buf = vec![0u8; v.data_bytes as usize];
            let read = (0..v.lebs).try_for_each(|lnum| {
                let at = lnum as usize * LEB;
                let end = (at + LEB).min(buf.len());
                if at < end {
                    u.read(0, lnum, 0, &mut buf[at..end])
                } else {
                    Ok(())
                }
            });
            match read {
                Ok(()) => assert!(buf == old || buf == new, "static volume is neither"),
                Err(Error::Corrupt(_)) => {}
                Err(e) => panic!("{e}"),
            }
        },
    );
    assert!(cuts >= 6, "{cuts} cut points");
}

/// Wear-levelling moves (a threshold of 4) while one LEB changes again and again: after a cut,
/// the changing LEB holds the last change made or the one in flight, the static data that the
/// moves carry around is whole.
#[test]
fn wear_levelling_moves_survive_a_cut_anywhere() {
    let opts = AttachOptions {
        wl_threshold: 4,
        ..AttachOptions::default()
    };
    let blob = pattern(3 * LEB, 6);
    let done = Cell::new(0u64);
    let change = |i: u64| pattern(2048, 1000 + i);
    let cuts = sweep(
        &opts,
        |u| {
            u.create_volume(&dynamic("hot", 1)).unwrap();
            let s = u.create_volume(&static_volume("cold", 3)).unwrap();
            u.update_volume(s, &blob).unwrap();
            u.change(0, 0, &change(0)).unwrap();
            done.set(0);
        },
        |u| {
            done.set(0);
            for i in 1..=24 {
                u.change(0, 0, &change(i))?;
                done.set(i);
            }
            Ok(())
        },
        |u| {
            let got = &leb(u, 0, 0)[..2048];
            let i = done.get();
            assert!(got == change(i) || got == change(i + 1), "after change {i}");
            assert_eq!(&read_volume(u, 1)[..blob.len()], &blob[..]);
        },
    );
    assert!(cuts >= 50, "{cuts} cut points");
}

#[test]
fn attaching_a_half_formatted_chip_never_refuses() {
    // The format itself, cut anywhere: the next attach formats what is left or finds it done.
    let (_chip, flash) = Chip::new(small(16));
    let ops = {
        let u = attach(&flash);
        drop(u);
        flash.operations()
    };
    for n in 1..=ops {
        let (chip, flash) = Chip::new(small(16));
        flash.cut_power_at(Some(n));
        assert!(Ubi::attach(flash.clone(), &AttachOptions::default()).is_err());
        let ubi = attach(&chip.power_on());
        assert!(ubi.info().volumes.is_empty(), "cut {n}");
        ubi.create_volume(&dynamic("v", 2)).unwrap();
    }
}
