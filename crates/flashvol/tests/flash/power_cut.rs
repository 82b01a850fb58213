//! Power cuts at every program and erase of the chip below the encryption layer (the thesis
//! policy: every program a read-modify-erase-write of its block) while UBI changes LEBs
//! atomically, updates its volume table and wear-levels: after the next unlock and attach every
//! LEB holds its old or its new data and the volume table the old or the new volumes.
//!
//! The wear-levelling sweep found that a cut inside the layer's rewrite of a block that UBI had
//! just erased (its EC header) can leave a valid EC header over a block that is not erased; UBI
//! now checks a PEB found free at attach before writing it (`ubi::wl`).
//!
//! Every sweep runs under the thesis' policy and under the default one (free space hidden at
//! rest). A plain LEB write (an append into a mapped LEB) is swept under the default policy
//! only, after the flash was detached (its free space filled), so that the append is a
//! journalled read-modify-erase-write: under the thesis' policy a cut inside that rewrite loses
//! what the block held before (the thesis' design has that window; `flash::crypt` says so).

use std::cell::Cell;
use std::sync::Arc;

use sectorcrypt_flash::crypt::Policy;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_flashvol::{format, unlock};
use sectorcrypt_storage::{MemStorage, Window};
use sectorcrypt_testkit::pattern;
use sectorcrypt_ubi::media::VolType;
use sectorcrypt_ubi::{AttachOptions, Error, NewVolume, Ubi};

use crate::small_key;

const PASS: &[u8] = b"pass";

/// The policies swept: the thesis' and the default.
const SWEPT: [Policy; 2] = [Policy::Thesis, Policy::AtRest];

/// A small chip of `blocks` 16 KiB eraseblocks of 2 KiB pages, 512-byte sub-pages.
fn geometry(blocks: u32) -> Geometry {
    Geometry {
        peb_size: 16 * 1024,
        page_size: 2048,
        sub_page_size: 512,
        oob_size: 64,
        peb_count: blocks,
        nop: 4,
    }
}

const LEB: usize = 16 * 1024 - 2048;

fn volume(name: &str, lebs: u32, vol_type: VolType) -> NewVolume {
    NewVolume {
        id: None,
        name: name.into(),
        lebs,
        vol_type,
        alignment: 1,
        autoresize: false,
    }
}

/// Format an encrypted flash, `prepare` its UBI, then for n = 1, 2, ... cut the power at the
/// n-th chip operation of `op` on a copy, unlock, attach and `verify`, until `op` completes.
/// Returns the cut points.
fn sweep(
    policy: Policy,
    blocks: u32,
    opts: &AttachOptions,
    prepare: impl Fn(&Ubi),
    op: impl Fn(&Ubi) -> Result<(), Error>,
    verify: impl Fn(&Ubi),
) -> u64 {
    let g = geometry(blocks);
    let len = SimNand::image_len(&g);
    let mem = Arc::new(MemStorage::new(vec![0; len as usize]));
    let sim = Arc::new(SimNand::create(Window::new(Arc::clone(&mem), 0, len), g, &[]).unwrap());
    let new = small_key(policy);
    let opened = format(sim as Arc<dyn Flash>, &new, PASS).unwrap();
    let ubi = opened.attach(opts).unwrap();
    prepare(&ubi);
    ubi.sync().unwrap();
    drop(ubi);
    opened.detach().unwrap();
    drop(opened);
    let base = mem.contents();
    for n in 1.. {
        let copy = Arc::new(MemStorage::new(base.clone()));
        let open = || Arc::new(SimNand::open(Window::new(Arc::clone(&copy), 0, len)).unwrap());
        let sim = open();
        let opened = unlock(sim.clone(), PASS, None).unwrap();
        let ubi = opened.attach(opts).unwrap();
        sim.cut_power_at(Some(n));
        let result = op(&ubi);
        if !sim.is_off() {
            result.unwrap();
            return n - 1;
        }
        drop((ubi, opened));
        let opened = unlock(open(), PASS, None)
            .unwrap_or_else(|e| panic!("cut {n}: the header no longer opens: {e}"));
        let after = opened
            .attach(opts)
            .unwrap_or_else(|e| panic!("cut {n}: attach refused: {e}"));
        verify(&after);
    }
    unreachable!()
}

fn leb(ubi: &Ubi, id: u32, lnum: u32) -> Vec<u8> {
    let mut buf = vec![0u8; LEB];
    ubi.read(id, lnum, 0, &mut buf).unwrap();
    buf
}

#[test]
fn atomic_changes_and_volume_table_updates_through_the_layer_are_old_or_new() {
    let old = pattern(LEB, 1);
    let new = pattern(LEB, 2);
    let prepare = |u: &Ubi| {
        u.create_volume(&volume("v", 4, VolType::Dynamic)).unwrap();
        u.change(0, 1, &old).unwrap();
    };
    let opts = AttachOptions::default();
    for policy in SWEPT {
        let changes = sweep(
            policy,
            64,
            &opts,
            prepare,
            |u| u.change(0, 1, &new),
            |u| {
                let got = leb(u, 0, 1);
                assert!(got == old || got == new, "LEB 1 is neither old nor new");
            },
        );
        let tables = sweep(
            policy,
            64,
            &opts,
            prepare,
            |u| u.create_volume(&volume("w", 3, VolType::Static)).map(drop),
            |u| {
                assert_eq!(leb(u, 0, 1), old, "an untouched LEB changed");
                let names: Vec<String> = u.info().volumes.into_iter().map(|v| v.name).collect();
                assert!(names == ["v"] || names == ["v", "w"], "{names:?}");
            },
        );
        assert!(
            changes >= 3 && tables >= 6,
            "{policy:?}: {changes} and {tables} cut points"
        );
    }
}

#[test]
fn wear_levelling_moves_through_the_layer_keep_static_data_whole() {
    let opts = AttachOptions {
        wl_threshold: 3,
        ..AttachOptions::default()
    };
    let blob = pattern(2 * LEB + 77, 3);
    let change = |i: u64| pattern(2048, 500 + i);
    let done = Cell::new(0u64);
    // 36 PEBs for UBI: the hot LEB cycles through the free ones, and every few cycles the
    // PEBs that hold still data fall the threshold behind and are moved.
    for policy in SWEPT {
        let cuts = sweep(
            policy,
            72,
            &opts,
            |u| {
                u.create_volume(&volume("hot", 1, VolType::Dynamic))
                    .unwrap();
                let s = u
                    .create_volume(&volume("cold", 3, VolType::Static))
                    .unwrap();
                u.update_volume(s, &blob).unwrap();
                u.change(0, 0, &change(0)).unwrap();
            },
            |u| {
                done.set(0);
                for i in 1..=80 {
                    u.change(0, 0, &change(i))?;
                    done.set(i);
                }
                // Reached only by the run that was not cut: every PEB was erased since the
                // format, so the static data was moved.
                let (min, _, _) = u.info().erase_counters;
                assert!(
                    min >= 2,
                    "no wear-levelling move happened (lowest erase counter {min})"
                );
                Ok(())
            },
            |u| {
                let i = done.get();
                let got = &leb(u, 0, 0)[..2048];
                assert!(got == change(i) || got == change(i + 1), "after change {i}");
                let mut data = vec![0u8; blob.len()];
                for (lnum, chunk) in data.chunks_mut(LEB).enumerate() {
                    u.read(1, lnum as u32, 0, chunk).unwrap();
                }
                assert!(data == blob, "the static volume moved by wear-levelling");
            },
        );
        assert!(cuts >= 300, "{policy:?}: {cuts} cut points");
    }
}

#[test]
fn an_append_into_a_leb_after_a_detach_keeps_what_the_leb_held() {
    let half = 3 * 2048;
    let first = pattern(half, 5);
    let second = pattern(LEB - half, 6);
    let cuts = sweep(
        Policy::AtRest,
        64,
        &AttachOptions::default(),
        |u| {
            u.create_volume(&volume("v", 4, VolType::Dynamic)).unwrap();
            u.write(0, 1, 0, &first).unwrap();
        },
        |u| {
            u.write(0, 1, half as u32, &second)?;
            assert_eq!(leb(u, 0, 1)[half..], second[..], "the append, uncut");
            Ok(())
        },
        |u| {
            let got = leb(u, 0, 1);
            assert!(got[..half] == first, "the synced half was lost");
            // The append was not acknowledged: as on plain NAND, what a cut program leaves of
            // it is undefined (UBI and UBIFS find it by their CRCs).
        },
    );
    assert!(cuts >= 3, "{cuts} cut points");
}

/// `format` cut at any chip operation: the chip is then either not an encrypted flash yet (and a
/// new format succeeds) or one whose header opens and whose UBI attaches empty (the next attach
/// formats what the cut left), never something that refuses both.
#[test]
fn a_format_cut_anywhere_leaves_a_chip_that_formats_or_attaches() {
    let g = geometry(64);
    let len = SimNand::image_len(&g);
    let new = small_key(Policy::Thesis);
    let (mut encrypted, mut not_yet) = (0, 0);
    for n in 1.. {
        let mem = Arc::new(MemStorage::new(vec![0; len as usize]));
        let open = || Arc::new(SimNand::open(Window::new(Arc::clone(&mem), 0, len)).unwrap());
        let sim = Arc::new(SimNand::create(Window::new(Arc::clone(&mem), 0, len), g, &[]).unwrap());
        sim.cut_power_at(Some(n));
        let result = format(sim.clone() as Arc<dyn Flash>, &new, PASS);
        if !sim.is_off() {
            result.unwrap();
            break;
        }
        match unlock(open(), PASS, None) {
            Ok(opened) => {
                let ubi = opened
                    .attach(&AttachOptions::default())
                    .unwrap_or_else(|e| panic!("cut {n}: UBI refused: {e}"));
                assert!(ubi.info().volumes.is_empty());
                encrypted += 1;
            }
            Err(_) => {
                format(open() as Arc<dyn Flash>, &new, PASS)
                    .unwrap_or_else(|e| panic!("cut {n}: format again refused: {e}"));
                not_yet += 1;
            }
        }
    }
    assert!(
        encrypted > 10 && not_yet > 10,
        "{encrypted} and {not_yet} cut points"
    );
}
