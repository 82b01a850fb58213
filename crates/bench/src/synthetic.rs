//! Synthetic workloads for the P/E study, as traces: each runs on our own UBI
//! ([`sectorcrypt_ubi::Ubi`]) on a simulated chip of the Linux traces' geometry (512 PEBs of
//! 128 KiB, 2 KiB pages, 512-byte sub-pages, NOP 4: nandsim's `0x20,0xa2,0x00,0x15`, the
//! default [`Geometry`]), through a [`Recorder`], and comes back as a [`Trace`] that
//! [`crate::wear::replay`] replays plain or behind the encryption layer like Linux's.
//!
//! Linux's traces come from UBIFS, which never asks the flash for a sync (MTD's programs and
//! erases are durable when they return), so they cannot show what a policy that hides free
//! space at [`Flash::sync`] costs. These workloads sync where a user of UBI would: they call
//! [`Ubi::sync`], which reaches the chip's `Flash::sync` and is recorded as an `S` line; the
//! counts of syncs per workload are part of what each stresses.
//!
//! Every workload starts the same way, before `# workload starts` (the setup, as in Linux's
//! traces): the empty chip attached (UBI formats it: every PEB erased, its EC header written),
//! the workload's volume created, any prefill written, then a sync (Linux's traces also sync
//! before the marker). Every workload ends with a sync (as `sync; umount` ends Linux's). What
//! the writes contain does not matter (a trace keeps only where they went); the choices are
//! seeded, so a workload gives the same trace on every run and machine.
//!
//! The workloads (their sizes: a quick scale for tests, a full one for the study, in the table
//! after the list):
//!
//! - **`seq-leb`**: a dynamic volume written LEB by LEB whole, synced, then rewritten the same
//!   way by atomic LEB changes (what `ubi::block::VolumeStorage`, behind `flash attach`'s NBD
//!   and FUSE exports, does for a rewrite, and the kernel's `UBI_IOCEBCH`), synced. The best case
//!   for any policy: whole blocks, no free space inside a block, two syncs. The erases it costs
//!   over plain UBI are the floor of what hiding free space costs.
//! - **`rand-leb`**: the volume filled (setup), then random whole-LEB atomic changes with a sync
//!   every 8. Each change frees a PEB (erased at once), so every sync finds freshly
//!   erased blocks: what a policy pays for hiding erased blocks rather than erased pages.
//! - **`journal-appends`**: UBIFS's journal as UBI sees it: three heads (data, base, garbage
//!   collection, written 6:3:1), each appending one to four 2 KiB min. I/O units into its open
//!   LEB, a sync every 8 appends (an `fsync` flushing the write-buffers); a full head
//!   takes the next LEB of a ring (the journal's LEBs, unmapped before reuse, as UBIFS's commit
//!   and garbage collection free them). The pattern of A, B and C in Linux's traces, with syncs:
//!   each sync leaves up to three blocks partly written, whose erased tails a hide-on-sync
//!   policy must hide and the next appends must undo.
//! - **`small-sync`**: LEBs partly written in the setup (1 to half their pages), then one-page
//!   writes into random ones (a full LEB unmapped and started again), a sync after each. The
//!   worst case for a hide-on-sync policy: every sync finds partly written blocks and every
//!   write lands in a block whose free space was hidden at the last sync.
//! - **`vol-update`**: the volume tools on a static volume, as `sectorcrypt flash rsvol` and
//!   `flash update` (ubirsvol, ubiupdatevol) run them on an attached device: rounds of a whole
//!   update of a new size (half to all of the volume), the volume grown before or shrunk after
//!   to fit, each command followed by the sync the CLI ends it with. Volume-table changes (two
//!   copies, each an atomic change of a layout LEB) between large sequential writes: few syncs,
//!   most of them right after a table write.
//!
//! | workload | volume, LEBs (quick / full) | steps (quick / full) | syncs in the workload |
//! |---|---|---|---|
//! | `seq-leb` | 16 / 256 | 2 passes | one per pass |
//! | `rand-leb` | 16 / 128 | 48 / 768 LEB changes | one per 8 changes |
//! | `journal-appends` | 8 / 24 (the ring) | 400 / 4,000 appends | one per 8 appends |
//! | `small-sync` | 4 / 32 | 200 / 1,000 page writes | one per write |
//! | `vol-update` | 8 / 64 (static) | 2 / 6 update rounds | one per command (resize, update) |
//!
//! Each also has the final sync. At full scale a workload phase is 1,400 to 5,000 operations
//! after a setup of about 1,600 (the format of the 512 PEBs); recording all five takes about
//! 0.3 s in a release build, and replaying one takes 0.05 s plain and 0.2 to 0.35 s behind the
//! thesis policy (on a 2-core Intel Xeon).

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sectorcrypt_flash::record::Recorder;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::trace::Trace;
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_storage::MemStorage;
use sectorcrypt_ubi::media::{Layout, VolType};
use sectorcrypt_ubi::{AttachOptions, Error, NewVolume, Ubi};

/// Appends or LEB changes between two syncs in `rand-leb` and `journal-appends`.
const SYNC_EVERY: u32 = 8;

/// How big a workload runs.
#[derive(Clone, Copy, Debug)]
struct Scale {
    /// LEBs of the workload's volume.
    lebs: u32,
    /// Its steps: passes over the volume (`seq-leb`), LEB changes, appends, page writes or
    /// update rounds.
    steps: u32,
}

/// One synthetic workload.
#[derive(Clone, Copy)]
struct Workload {
    /// Its name (the trace's).
    name: &'static str,
    /// Its size for tests.
    quick: Scale,
    /// Its size for the study.
    full: Scale,
    /// Its setup and workload on UBI (the final sync is [`Workload::record`]'s).
    run: fn(&mut Run, Scale) -> Result<(), Error>,
}

/// The workloads, in the order [`synthetic_traces`] returns them (see the module docs).
const WORKLOADS: [Workload; 5] = [
    Workload {
        name: "seq-leb",
        quick: Scale { lebs: 16, steps: 2 },
        full: Scale {
            lebs: 256,
            steps: 2,
        },
        run: seq_leb,
    },
    Workload {
        name: "rand-leb",
        quick: Scale {
            lebs: 16,
            steps: 48,
        },
        full: Scale {
            lebs: 128,
            steps: 768,
        },
        run: rand_leb,
    },
    Workload {
        name: "journal-appends",
        quick: Scale {
            lebs: 8,
            steps: 400,
        },
        full: Scale {
            lebs: 24,
            steps: 4000,
        },
        run: journal_appends,
    },
    Workload {
        name: "small-sync",
        quick: Scale {
            lebs: 4,
            steps: 200,
        },
        full: Scale {
            lebs: 32,
            steps: 1000,
        },
        run: small_sync,
    },
    Workload {
        name: "vol-update",
        quick: Scale { lebs: 8, steps: 2 },
        full: Scale { lebs: 64, steps: 6 },
        run: vol_update,
    },
];

/// Every workload (see the module docs) recorded, at the quick (tests) or full (study) scale, as
/// `(name, trace)`.
///
/// Errors: what UBI answers (none is expected: the chip is simulated in memory, without
/// faults).
pub fn synthetic_traces(quick: bool) -> Result<Vec<(String, Trace)>, Error> {
    WORKLOADS
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let scale = if quick { w.quick } else { w.full };
            Ok((w.name.to_string(), w.record(scale, i as u64)?))
        })
        .collect()
}

impl Workload {
    /// Run the workload at `scale` with RNG seed `seed` on a fresh chip and return its trace.
    fn record(&self, scale: Scale, seed: u64) -> Result<Trace, Error> {
        let mut run = Run::new(seed)?;
        (self.run)(&mut run, scale)?;
        run.ubi.sync()?;
        Ok(run.recorder.trace())
    }
}

/// UBI on a recorded chip, and what a workload draws from.
struct Run {
    recorder: Arc<Recorder>,
    ubi: Ubi,
    rng: StdRng,
    /// Bytes of a LEB.
    leb: u32,
    /// The minimum I/O unit.
    min_io: u32,
    /// A LEB's worth of data (its contents do not matter to a trace).
    data: Vec<u8>,
}

impl Run {
    /// An empty chip of the Linux traces' geometry in memory, UBI attached (so formatted) on it
    /// through a recorder.
    fn new(seed: u64) -> Result<Run, Error> {
        let g = Geometry::default();
        let layout = Layout::new(g.peb_size, g.page_size, g.sub_page_size, None)
            .expect("the default chip has a UBI layout");
        let chip = SimNand::create(
            MemStorage::new(vec![0; SimNand::image_len(&g) as usize]),
            g,
            &[],
        )?;
        let recorder = Arc::new(Recorder::new(
            Arc::new(chip),
            layout.vid_hdr_offset,
            layout.data_offset,
        ));
        let opts = AttachOptions {
            vid_hdr_offset: Some(layout.vid_hdr_offset),
            ..AttachOptions::default()
        };
        let ubi = Ubi::attach(Arc::clone(&recorder) as Arc<dyn Flash>, &opts)?;
        Ok(Run {
            recorder,
            ubi,
            rng: StdRng::seed_from_u64(seed),
            leb: layout.leb_size,
            min_io: layout.min_io_size,
            data: vec![0xA5; layout.leb_size as usize],
        })
    }

    /// Create the workload's volume, `lebs` LEBs, called `data` as in Linux's traces.
    fn volume(&self, vol_type: VolType, lebs: u32) -> Result<u32, Error> {
        self.ubi.create_volume(&NewVolume {
            id: None,
            name: "data".into(),
            lebs,
            vol_type,
            alignment: 1,
            autoresize: false,
        })
    }

    /// End the setup: sync, then `# workload starts`.
    fn start_workload(&self) -> Result<(), Error> {
        self.ubi.sync()?;
        self.recorder.mark_workload_start();
        Ok(())
    }

    /// Min. I/O units in a LEB.
    fn pages(&self) -> u32 {
        self.leb / self.min_io
    }

    /// `units` min. I/O units of data.
    fn units(&self, units: u32) -> &[u8] {
        &self.data[..(units * self.min_io) as usize]
    }
}

fn seq_leb(run: &mut Run, s: Scale) -> Result<(), Error> {
    let id = run.volume(VolType::Dynamic, s.lebs)?;
    run.start_workload()?;
    for pass in 0..s.steps {
        for lnum in 0..s.lebs {
            if pass == 0 {
                run.ubi.write(id, lnum, 0, &run.data)?;
            } else {
                run.ubi.change(id, lnum, &run.data)?;
            }
        }
        run.ubi.sync()?;
    }
    Ok(())
}

fn rand_leb(run: &mut Run, s: Scale) -> Result<(), Error> {
    let id = run.volume(VolType::Dynamic, s.lebs)?;
    for lnum in 0..s.lebs {
        run.ubi.write(id, lnum, 0, &run.data)?;
    }
    run.start_workload()?;
    for step in 1..=s.steps {
        let lnum = run.rng.gen_range(0..s.lebs);
        run.ubi.change(id, lnum, &run.data)?;
        if step % SYNC_EVERY == 0 {
            run.ubi.sync()?;
        }
    }
    Ok(())
}

fn journal_appends(run: &mut Run, s: Scale) -> Result<(), Error> {
    /// How often each head (data, base, garbage collection) is written, out of 10.
    const WEIGHTS: [u32; 3] = [6, 3, 1];
    let id = run.volume(VolType::Dynamic, s.lebs)?;
    run.start_workload()?;
    let pages = run.pages();
    // Each head's open LEB and the units written into it.
    let mut heads: [Option<(u32, u32)>; 3] = [None; 3];
    let mut ring = 0;
    for step in 1..=s.steps {
        let mut pick = run.rng.gen_range(0..WEIGHTS.iter().sum::<u32>());
        let head = WEIGHTS
            .iter()
            .position(|&w| {
                let here = pick < w;
                pick = pick.saturating_sub(w);
                here
            })
            .expect("the pick is below the weights' sum");
        let units = run.rng.gen_range(1..=4);
        if heads[head].is_none_or(|(_, used)| used + units > pages) {
            // The ring's next LEB that no head has open.
            let lnum = loop {
                let lnum = ring % s.lebs;
                ring += 1;
                if !heads.iter().flatten().any(|&(open, _)| open == lnum) {
                    break lnum;
                }
            };
            if run.ubi.is_mapped(id, lnum)? {
                run.ubi.unmap(id, lnum)?;
            }
            heads[head] = Some((lnum, 0));
        }
        let (lnum, used) = heads[head].as_mut().expect("a head with an open LEB");
        run.ubi
            .write(id, *lnum, *used * run.min_io, run.units(units))?;
        *used += units;
        if step % SYNC_EVERY == 0 {
            run.ubi.sync()?;
        }
    }
    Ok(())
}

fn small_sync(run: &mut Run, s: Scale) -> Result<(), Error> {
    let id = run.volume(VolType::Dynamic, s.lebs)?;
    let pages = run.pages();
    let mut used = Vec::new();
    for lnum in 0..s.lebs {
        let n = run.rng.gen_range(1..=pages / 2);
        run.ubi.write(id, lnum, 0, run.units(n))?;
        used.push(n);
    }
    run.start_workload()?;
    for _ in 0..s.steps {
        let lnum = run.rng.gen_range(0..s.lebs);
        let n = &mut used[lnum as usize];
        if *n == pages {
            run.ubi.unmap(id, lnum)?;
            *n = 0;
        }
        run.ubi.write(id, lnum, *n * run.min_io, run.units(1))?;
        *n += 1;
        run.ubi.sync()?;
    }
    Ok(())
}

fn vol_update(run: &mut Run, s: Scale) -> Result<(), Error> {
    let id = run.volume(VolType::Static, s.lebs)?;
    let leb = run.leb as usize;
    let image = vec![0xA5u8; s.lebs as usize * leb];
    run.ubi.update_volume(id, &image)?;
    run.start_workload()?;
    let mut lebs = s.lebs;
    for _ in 0..s.steps {
        let bytes = run.rng.gen_range(image.len() / 2..=image.len());
        let need = bytes.div_ceil(leb) as u32;
        if need > lebs {
            run.ubi.resize_volume(id, need)?;
            run.ubi.sync()?;
        }
        run.ubi.update_volume(id, &image[..bytes])?;
        run.ubi.sync()?;
        if need < lebs {
            run.ubi.resize_volume(id, need)?;
            run.ubi.sync()?;
        }
        lebs = need;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sectorcrypt_flash::trace::Op;

    use super::*;
    use crate::flash::Stack;

    fn count(trace: &Trace, from: usize, want: fn(&Op) -> bool) -> usize {
        trace.ops[from..].iter().filter(|op| want(op)).count()
    }

    /// Every workload replays on a fresh chip, writes and erases in its workload phase, syncs
    /// where its docs say, and comes out the same on a second run.
    #[test]
    fn the_synthetic_traces_replay_sync_as_promised_and_repeat() {
        let traces = synthetic_traces(true).unwrap();
        let names: Vec<&str> = traces.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, WORKLOADS.map(|w| w.name));
        for ((name, t), w) in traces.iter().zip(WORKLOADS) {
            let s = w.quick;
            let at = t.workload_start;
            let writes = count(t, at, |op| matches!(op, Op::Write { .. }));
            let erases = count(t, at, |op| matches!(op, Op::Erase { .. }));
            let syncs = count(t, at, |op| *op == Op::Sync) as u32;
            // The setup: the format (an erase and an EC header per PEB), then a sync.
            let pebs = t.geometry.peb_count as usize;
            assert!(
                count(t, 0, |op| matches!(op, Op::Erase { .. })) >= pebs,
                "{name}"
            );
            assert!(at > 2 * pebs && t.ops[at - 1] == Op::Sync, "{name}");
            assert_eq!(t.ops.last(), Some(&Op::Sync), "{name}");
            assert!(
                writes as u32 >= s.steps && erases > 0,
                "{name}: {writes} W {erases} E"
            );
            // One per pass, change, append or update round as the docs say, and the last.
            let promised = match w.name {
                "rand-leb" | "journal-appends" => s.steps / SYNC_EVERY,
                _ => s.steps,
            } + 1;
            if w.name == "vol-update" {
                // Each resize is a command of its own, with its own sync.
                assert!(syncs >= promised, "{name}: {syncs} syncs");
            } else {
                assert_eq!(syncs, promised, "{name}");
            }
            let wear = crate::wear::replay(t, name, Stack::Plain).unwrap();
            assert!(wear.workload.max > 0 && wear.erases_per_gib > 0.0, "{name}");
            assert_eq!(Trace::parse(&t.to_string()).unwrap(), *t, "{name}");
        }
        let again = synthetic_traces(true).unwrap();
        assert!(
            traces == again,
            "the synthetic traces differ from run to run"
        );
    }

    /// The synthetic traces are on the chip, and have UBI's layout, of Linux's traces.
    #[test]
    fn the_synthetic_chip_is_the_linux_traces_chip() {
        let linux = Trace::read(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../sectorcrypt/tests/data/C-iozone.trace.xz"),
        )
        .unwrap();
        let ours = WORKLOADS[0].record(Scale { lebs: 1, steps: 1 }, 0).unwrap();
        assert_eq!(
            (ours.geometry, ours.vid_hdr_offset, ours.data_offset),
            (linux.geometry, linux.vid_hdr_offset, linux.data_offset)
        );
    }
}
