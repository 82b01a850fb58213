//! Power-cut sweeps: an operation is cut after each of its writes and syncs in turn, and every
//! surviving image the crash model allows at that cut ([`crash::outcomes`]: nothing, everything,
//! prefixes, random subsets and tearings of the writes since the last sync) is powered back on
//! and checked.

use std::fmt::Debug;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sectorcrypt_storage::crash::{self, Outcome};
use sectorcrypt_storage::{CrashingStorage, MemStorage, Power, Storage};

/// What a sweep tried and found.
#[derive(Debug, Default)]
pub struct Report {
    /// Writes and syncs of an uninterrupted run (the cut points are 0 to this, inclusive).
    pub operations: u64,
    /// Surviving images checked, over every cut point.
    pub images: u64,
    /// What the check said of the images it refused.
    pub losses: Vec<String>,
}

impl Report {
    /// Panic with the first losses unless there are none; print the counts.
    pub fn assert_no_loss(&self, name: &str) {
        assert!(
            self.losses.is_empty(),
            "{name}: {} of {} surviving images lost data, e.g. {:#?}",
            self.losses.len(),
            self.images,
            &self.losses[..self.losses.len().min(3)]
        );
        println!(
            "{name}: {} cut points x outcomes = {} surviving images, 0 losses",
            self.operations + 1,
            self.images
        );
    }
}

/// What is left after a power cut, powered back on: one memory device per device of the sweep.
pub struct Survivor {
    /// The devices, in the sweep's order.
    pub devices: Vec<Arc<MemStorage>>,
    /// Whether this is the uninterrupted run (which must show the operation's result, not the
    /// starting state).
    pub complete: bool,
    /// Writes and syncs the operation had done when the power went (all of them when
    /// `complete`): a check that knows where the operation's syncs fall can ask more of a later
    /// survivor.
    pub cut: u64,
}

/// Sweep `op` over every power cut. `images` are the starting bytes of its devices, which share
/// one power supply; `op` runs on fresh devices holding them and must fail exactly when cut before
/// its end. `check` gets each survivor and says what is wrong with it, if anything. The
/// uninterrupted run is checked first.
pub fn sweep<T, E: Debug>(
    images: &[Vec<u8>],
    op: impl Fn(&[Arc<CrashingStorage>]) -> Result<T, E>,
    check: impl FnMut(&Survivor) -> Result<(), String>,
) -> Report {
    let atoms = vec![crash::SECTOR; images.len()];
    sweep_with_atoms(images, &atoms, op, check)
}

/// [`sweep`] with devices whose writes tear into `atoms[i]`-byte units instead of 512-byte
/// sectors (see `Power::device_with_atom`).
pub fn sweep_with_atoms<T, E: Debug>(
    images: &[Vec<u8>],
    atoms: &[u64],
    op: impl Fn(&[Arc<CrashingStorage>]) -> Result<T, E>,
    mut check: impl FnMut(&Survivor) -> Result<(), String>,
) -> Report {
    let devices = |cut: Option<u64>| {
        let power = Power::new(cut);
        // Shared, so that an operation can hand a device to what keeps it (a served volume).
        let devs: Vec<Arc<CrashingStorage>> = images
            .iter()
            .zip(atoms)
            .map(|(i, &atom)| Arc::new(power.device_with_atom(i.clone(), atom)))
            .collect();
        (power, devs)
    };
    let back_on = |devs: &[Arc<CrashingStorage>], o: &Outcome, complete: bool, cut: u64| Survivor {
        devices: devs
            .iter()
            .map(|d| Arc::new(MemStorage::new(d.image(o))))
            .collect(),
        complete,
        cut,
    };
    let (power, devs) = devices(None);
    if let Err(e) = op(&devs) {
        panic!("the operation fails without a power cut: {e:?}");
    }
    let total = power.operations();
    let mut report = Report {
        operations: total,
        ..Report::default()
    };
    let mut record = |what: String, survivor: Survivor, report: &mut Report| {
        report.images += 1;
        if let Err(why) = check(&survivor) {
            report.losses.push(format!("{what}: {why}"));
        }
    };
    record(
        "uninterrupted".into(),
        back_on(&devs, &Outcome::EverythingSurvives, true, total),
        &mut report,
    );
    for cut in 0..=total {
        let (_, devs) = devices(Some(cut));
        let result = op(&devs);
        assert_eq!(
            result.is_ok(),
            cut >= total,
            "cut after {cut} of {total} operations: {}",
            if result.is_ok() {
                "the operation did not notice the power cut".to_string()
            } else {
                "the operation failed without a power cut".to_string()
            }
        );
        let refs: Vec<&CrashingStorage> = devs.iter().map(|d| &**d).collect();
        for o in crash::outcomes(&refs, cut) {
            let what = format!("cut after {cut} of {total}, {o:?}");
            record(what, back_on(&devs, &o, false, cut), &mut report);
        }
    }
    report
}

/// A device that forgets one `sync`: the `n`-th (from 1) is reported done but does nothing, as if
/// the writer had left it out. For mutation tests: a sweep of a writer whose syncs all matter must
/// then find a loss.
pub struct ForgetsSync<'a> {
    inner: &'a dyn Storage,
    forget: u64,
    syncs: AtomicU64,
}

impl<'a> ForgetsSync<'a> {
    /// `inner`, forgetting its `n`-th sync.
    pub fn new(inner: &'a dyn Storage, n: u64) -> Self {
        ForgetsSync {
            inner,
            forget: n,
            syncs: AtomicU64::new(0),
        }
    }
}

impl Storage for ForgetsSync<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        if self.syncs.fetch_add(1, Ordering::Relaxed) + 1 == self.forget {
            return Ok(());
        }
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}
