//! A power-cut model for crash tests: devices with a durable image and a volatile cache.
//!
//! A real disk acknowledges a write once it is in its cache; only a completed flush (`sync`)
//! guarantees that what was written before it is on the media. When power fails, any of the
//! writes since the last flush may be lost, each may be torn (some of its sectors written, others
//! not), and they may reach the media in any order. So each [`CrashingStorage`] keeps
//!
//! - a *durable* image: what its last completed `sync` guarantees, and
//! - the *volatile* writes made since then, in order (reads see them, as they would see a cache).
//!
//! After a cut, a surviving image is the durable one plus any subset of the volatile writes, each
//! whole or torn at 512-byte granularity (a sector is written whole or not at all, the atomicity
//! the LUKS formats and dm-crypt assume of sectors), or at a larger atomic unit for a device
//! modelled as writing, say, 4 KiB blocks atomically ([`Power::device_with_atom`]). [`outcomes`] gives a deterministic, seeded
//! family of such survivals for a sweep to try at every cut point: nothing survives, everything
//! survives, every prefix of the writes in issue order (at most [`MAX_PREFIXES`] of them), and
//! random subsets and tearings. A writer that forgets a `sync` it needs is then caught, which a
//! model that only stops writing (and keeps every write made before the cut) cannot do.
//!
//! Several devices can share one [`Power`] supply, as a detached header file and its data file
//! share a machine: one cut stops all of them, and a `sync` of one device makes only that device's
//! writes durable (`fdatasync` of one file says nothing about another).

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::dir::Directory;
use crate::{past_end, Storage};

/// The unit a write can be torn into by default: a 512-byte sector, whole or not at all.
pub const SECTOR: u64 = 512;

/// At most this many prefixes of the volatile writes are tried per cut (spread evenly).
pub const MAX_PREFIXES: usize = 8;

/// How many random subsets and how many random tearings are tried per cut.
pub const RANDOM_OUTCOMES: u64 = 3;

/// The power supply of one or more devices: it counts their writes and syncs together and cuts
/// all of them after the chosen number.
#[derive(Clone, Debug)]
pub struct Power {
    inner: Arc<PowerState>,
}

#[derive(Debug)]
struct PowerState {
    cut_after: Option<u64>,
    operations: AtomicU64,
}

impl Power {
    /// A supply that fails every write and sync after the first `cut_after` (never, with
    /// `None`: then it only counts).
    pub fn new(cut_after: Option<u64>) -> Self {
        Power {
            inner: Arc::new(PowerState {
                cut_after,
                operations: AtomicU64::new(0),
            }),
        }
    }

    /// A device on this supply holding `data`, all of it durable, that tears writes into
    /// [`SECTOR`]s.
    pub fn device(&self, data: Vec<u8>) -> CrashingStorage {
        self.device_with_atom(data, SECTOR)
    }

    /// A device whose writes tear into `atom`-byte units (a multiple of [`SECTOR`]; 4096 for a
    /// drive with 4 KiB atomic writes, which is what a format's checksums may assume).
    pub fn device_with_atom(&self, data: Vec<u8>, atom: u64) -> CrashingStorage {
        assert!(
            atom >= SECTOR && atom.is_multiple_of(SECTOR),
            "an atomic write unit of {atom} bytes"
        );
        CrashingStorage {
            power: self.clone(),
            atom,
            state: Mutex::new(DeviceState {
                durable: data.clone(),
                current: data,
                volatile: Vec::new(),
            }),
        }
    }

    /// Writes and syncs attempted so far on every device of this supply (refused ones too).
    pub fn operations(&self) -> u64 {
        self.inner.operations.load(Ordering::Relaxed)
    }

    /// Whether the cut has happened.
    pub fn is_cut(&self) -> bool {
        self.inner
            .cut_after
            .is_some_and(|cut| self.operations() > cut)
    }

    /// The number of this operation, or the power-cut error.
    fn allow(&self) -> io::Result<u64> {
        let n = self.inner.operations.fetch_add(1, Ordering::Relaxed);
        match self.inner.cut_after {
            Some(cut) if n >= cut => Err(io::Error::other(format!(
                "simulated power cut after {cut} operations"
            ))),
            _ => Ok(n),
        }
    }
}

/// A memory device with a durable image and volatile writes (see the module docs).
#[derive(Debug)]
pub struct CrashingStorage {
    power: Power,
    /// The unit a write tears into.
    atom: u64,
    state: Mutex<DeviceState>,
}

#[derive(Debug)]
struct DeviceState {
    /// What the last completed sync guarantees.
    durable: Vec<u8>,
    /// What reads see: `durable` with every volatile write applied.
    current: Vec<u8>,
    /// Writes since the last completed sync, in issue order.
    volatile: Vec<Pending>,
}

/// A write that has not been made durable: its operation number on the power supply (the issue
/// order across devices), where, and what.
#[derive(Debug)]
struct Pending {
    op: u64,
    offset: u64,
    data: Vec<u8>,
    /// A change of length (`Storage::grow`) to `offset` bytes rather than a write: kept whole or
    /// lost, never torn (a file's size is one field of its inode).
    grows: bool,
}

/// What survives a power cut (see [`outcomes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every write since the last sync is lost.
    NothingSurvives,
    /// Every write reached the media, as if the cut came just after the last one.
    EverythingSurvives,
    /// The writes issued before operation `n` reached the media, the later ones did not (a cache
    /// that drains in order).
    IssuedBefore(u64),
    /// Each write is kept or lost, drawn from this seed.
    Subset(u64),
    /// Each write is kept, lost or torn (a random part of its sectors kept), drawn from this seed.
    Torn(u64),
}

impl Outcome {
    /// Whether the part of write `op` in atomic unit `unit` survives.
    fn keeps(&self, op: u64, unit: u64) -> bool {
        match *self {
            Outcome::NothingSurvives => false,
            Outcome::EverythingSurvives => true,
            Outcome::IssuedBefore(n) => op < n,
            Outcome::Subset(seed) => mix(seed, op) & 1 == 1,
            Outcome::Torn(seed) => match mix(seed, op) % 3 {
                0 => false,
                1 => true,
                _ => mix(mix(seed, op), unit) & 1 == 1,
            },
        }
    }
}

/// The survivals to try after a cut on `devices` (those of one power supply): nothing, everything,
/// every prefix of their volatile writes in issue order (at most [`MAX_PREFIXES`], spread
/// evenly), and [`RANDOM_OUTCOMES`] subsets and tearings drawn from `seed`. With no volatile write
/// left there is only one surviving image, and one outcome.
pub fn outcomes(devices: &[&CrashingStorage], seed: u64) -> Vec<Outcome> {
    let ops: Vec<u64> = devices.iter().flat_map(|d| d.volatile_ops()).collect();
    outcomes_of(ops, seed)
}

/// [`outcomes`] for the volatile operations `ops` (their numbers on the power supply), of
/// devices and directories alike.
pub fn outcomes_of(mut ops: Vec<u64>, seed: u64) -> Vec<Outcome> {
    ops.sort_unstable();
    ops.dedup();
    if ops.is_empty() {
        return vec![Outcome::EverythingSurvives];
    }
    let mut out = vec![Outcome::NothingSurvives, Outcome::EverythingSurvives];
    // Prefixes keep 1..len writes (0 and len are the two above).
    let inner = ops.len() - 1;
    let step = inner.div_ceil(MAX_PREFIXES).max(1);
    out.extend(
        (1..=inner)
            .step_by(step)
            .map(|k| Outcome::IssuedBefore(ops[k])),
    );
    for i in 0..RANDOM_OUTCOMES {
        out.push(Outcome::Subset(mix(seed, 2 * i)));
        out.push(Outcome::Torn(mix(seed, 2 * i + 1)));
    }
    out
}

impl CrashingStorage {
    /// A device with its own power supply (see [`Power::new`]) holding `data`.
    pub fn new(data: Vec<u8>, cut_after: Option<u64>) -> Self {
        Power::new(cut_after).device(data)
    }

    /// The power supply.
    pub fn power(&self) -> &Power {
        &self.power
    }

    /// Writes and syncs attempted so far on this device's power supply.
    pub fn operations(&self) -> u64 {
        self.power.operations()
    }

    /// Writes made since the last completed sync.
    pub fn volatile_writes(&self) -> usize {
        self.lock().volatile.len()
    }

    /// The operation numbers of the writes made since the last completed sync.
    pub fn volatile_ops(&self) -> Vec<u64> {
        self.lock().volatile.iter().map(|p| p.op).collect()
    }

    /// What is on the media after a power cut with `outcome`: the durable image and the volatile
    /// writes (or parts of them, in whole atomic units) that `outcome` keeps, applied in issue
    /// order.
    pub fn image(&self, outcome: &Outcome) -> Vec<u8> {
        let state = self.lock();
        let mut image = state.durable.clone();
        let atom = self.atom;
        for p in &state.volatile {
            if p.grows {
                if outcome.keeps(p.op, 0) && image.len() < p.offset as usize {
                    image.resize(p.offset as usize, 0);
                }
                continue;
            }
            // Bytes past the survivor's end (its growth lost) are lost with it.
            let end = (p.offset + p.data.len() as u64).min(image.len() as u64);
            let mut at = p.offset;
            while at < end {
                let piece_end = ((at / atom + 1) * atom).min(end);
                if outcome.keeps(p.op, at / atom) {
                    let (a, b) = ((at - p.offset) as usize, (piece_end - p.offset) as usize);
                    image[at as usize..piece_end as usize].copy_from_slice(&p.data[a..b]);
                }
                at = piece_end;
            }
        }
        image
    }

    fn lock(&self) -> MutexGuard<'_, DeviceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Storage for CrashingStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let state = self.lock();
        let start = checked_range(offset, buf.len(), state.current.len())
            .ok_or_else(|| past_end("a read", offset, buf.len(), state.current.len() as u64))?;
        buf.copy_from_slice(&state.current[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.lock();
        let start = checked_range(offset, buf.len(), state.current.len())
            .ok_or_else(|| past_end("a write", offset, buf.len(), state.current.len() as u64))?;
        let op = self.power.allow()?;
        state.current[start..start + buf.len()].copy_from_slice(buf);
        state.volatile.push(Pending {
            op,
            offset,
            data: buf.to_vec(),
            grows: false,
        });
        Ok(())
    }

    fn grow(&self, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        if state.current.len() >= len {
            return Ok(());
        }
        let op = self.power.allow()?;
        state.current.resize(len, 0);
        state.volatile.push(Pending {
            op,
            offset: len as u64,
            data: Vec::new(),
            grows: true,
        });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut state = self.lock();
        self.power.allow()?;
        let DeviceState {
            durable, volatile, ..
        } = &mut *state;
        for p in volatile.drain(..) {
            let at = p.offset as usize;
            if p.grows {
                durable.resize(durable.len().max(at), 0);
            } else {
                durable[at..at + p.data.len()].copy_from_slice(&p.data);
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.lock().current.len() as u64)
    }

    fn name(&self) -> String {
        "crashing memory device".to_string()
    }
}

/// A directory on a power supply, as a file system keeps one: its files are [`CrashingStorage`]
/// devices on the same supply, and creating, removing and renaming names are operations that
/// stay volatile until the directory is synced. After a cut, [`CrashingDirectory::image`] gives
/// the names that survive an [`Outcome`] (the durable ones, with the volatile changes it keeps
/// applied in order) and each file's surviving bytes.
#[derive(Debug)]
pub struct CrashingDirectory {
    power: Power,
    state: Mutex<DirState>,
}

#[derive(Debug, Default)]
struct DirState {
    /// The names the last completed directory sync guarantees.
    durable: BTreeMap<String, Arc<CrashingStorage>>,
    /// The names as lookups see them.
    current: BTreeMap<String, Arc<CrashingStorage>>,
    /// Name changes since the last directory sync, with their operation numbers.
    volatile: Vec<(u64, NameChange)>,
}

#[derive(Debug, Clone)]
enum NameChange {
    Create(String, Arc<CrashingStorage>),
    Remove(String),
    Rename(String, String),
}

impl NameChange {
    fn apply(&self, names: &mut BTreeMap<String, Arc<CrashingStorage>>) {
        match self {
            NameChange::Create(name, file) => {
                names.insert(name.clone(), Arc::clone(file));
            }
            NameChange::Remove(name) => {
                names.remove(name);
            }
            NameChange::Rename(from, to) => {
                if let Some(file) = names.remove(from) {
                    names.insert(to.clone(), file);
                }
            }
        }
    }
}

impl Power {
    /// An empty directory on this supply (all of it durable).
    pub fn directory(&self) -> CrashingDirectory {
        CrashingDirectory {
            power: self.clone(),
            state: Mutex::new(DirState::default()),
        }
    }
}

impl CrashingDirectory {
    fn lock(&self) -> MutexGuard<'_, DirState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn change(&self, change: NameChange) -> io::Result<()> {
        let mut state = self.lock();
        let op = self.power.allow()?;
        change.apply(&mut state.current);
        state.volatile.push((op, change));
        Ok(())
    }

    /// The operation numbers of every volatile change: of names, and of the data of every file
    /// the directory has held.
    pub fn volatile_ops(&self) -> Vec<u64> {
        let state = self.lock();
        let mut ops: Vec<u64> = state.volatile.iter().map(|(op, _)| *op).collect();
        let files = state.durable.values().chain(state.current.values());
        ops.extend(files.flat_map(|f| f.volatile_ops()));
        for (_, change) in &state.volatile {
            if let NameChange::Create(_, f) = change {
                ops.extend(f.volatile_ops());
            }
        }
        ops
    }

    /// The files that survive a cut with `outcome`, by name, with their surviving bytes.
    pub fn image(&self, outcome: &Outcome) -> BTreeMap<String, Vec<u8>> {
        let state = self.lock();
        let mut names = state.durable.clone();
        for (op, change) in &state.volatile {
            if outcome.keeps(*op, 0) {
                change.apply(&mut names);
            }
        }
        names
            .into_iter()
            .map(|(name, file)| (name, file.image(outcome)))
            .collect()
    }
}

/// A file of a [`CrashingDirectory`], shared between its names and its handles.
struct SharedFile(Arc<CrashingStorage>);

impl Storage for SharedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn name(&self) -> String {
        self.0.name()
    }
}

impl Directory for CrashingDirectory {
    fn create(&self, name: &str, len: u64) -> io::Result<Box<dyn Storage>> {
        if self.exists(name) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{name} exists"),
            ));
        }
        let file = Arc::new(self.power.device(vec![0; len as usize]));
        self.change(NameChange::Create(name.to_string(), Arc::clone(&file)))?;
        Ok(Box::new(SharedFile(file)))
    }

    fn open(&self, name: &str) -> io::Result<Box<dyn Storage>> {
        let file = self.lock().current.get(name).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{name}: no such file"))
        })?;
        Ok(Box::new(SharedFile(file)))
    }

    fn exists(&self, name: &str) -> bool {
        self.lock().current.contains_key(name)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        if !self.exists(name) {
            return Ok(());
        }
        self.change(NameChange::Remove(name.to_string()))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        if !self.exists(from) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{from}: no such file"),
            ));
        }
        self.change(NameChange::Rename(from.to_string(), to.to_string()))
    }

    fn sync(&self) -> io::Result<()> {
        let mut state = self.lock();
        self.power.allow()?;
        let DirState {
            durable, volatile, ..
        } = &mut *state;
        for (_, change) in volatile.drain(..) {
            change.apply(durable);
        }
        Ok(())
    }

    fn path_of(&self, name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("crashing-directory/{name}"))
    }
}

/// `offset` as an index when `len` bytes from it fit in `size`.
fn checked_range(offset: u64, len: usize, size: usize) -> Option<usize> {
    usize::try_from(offset)
        .ok()
        .filter(|s| s.checked_add(len).is_some_and(|e| e <= size))
}

/// A well-mixed 64-bit value from two (SplitMix64's finaliser): deterministic choices without a
/// random-number crate.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(0x632b_e59b_d9b4_e019);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_stops_writes_and_syncs() {
        let d = CrashingStorage::new(vec![0; 16], Some(2));
        d.write_at(&[1], 0).unwrap();
        d.sync().unwrap();
        assert!(d.write_at(&[2], 1).is_err());
        assert!(d.sync().is_err());
        assert_eq!(&d.image(&Outcome::EverythingSurvives)[..2], &[1, 0]);
        assert_eq!(d.operations(), 4);
        let counting = CrashingStorage::new(vec![0; 4], None);
        for _ in 0..10 {
            counting.write_at(&[9], 3).unwrap();
        }
        assert_eq!(counting.operations(), 10);
        assert!(!counting.power().is_cut());
    }

    #[test]
    fn only_synced_writes_are_sure_to_survive() {
        let d = CrashingStorage::new(vec![0; 2048], None);
        d.write_at(&[1; 512], 0).unwrap();
        d.sync().unwrap();
        d.write_at(&[2; 512], 512).unwrap();
        d.write_at(&[3; 512], 1024).unwrap();
        let mut b = [0u8; 1];
        d.read_at(&mut b, 1024).unwrap();
        assert_eq!(b, [3], "reads see the cache");
        assert_eq!(d.volatile_writes(), 2);
        let none = d.image(&Outcome::NothingSurvives);
        assert_eq!((none[0], none[512], none[1024]), (1, 0, 0));
        let all = d.image(&Outcome::EverythingSurvives);
        assert_eq!((all[0], all[512], all[1024]), (1, 2, 3));
        // The writes were operations 2 and 3: a prefix keeps the first only.
        let first = d.image(&Outcome::IssuedBefore(3));
        assert_eq!((first[512], first[1024]), (2, 0));
        let family = outcomes(&[&d], 7);
        assert!(family.contains(&Outcome::IssuedBefore(3)));
        assert_eq!(family.len(), 3 + 2 * RANDOM_OUTCOMES as usize);
        d.sync().unwrap();
        assert_eq!(outcomes(&[&d], 7), vec![Outcome::EverythingSurvives]);
    }

    #[test]
    fn a_growth_is_durable_only_once_synced_and_never_torn() {
        let d = CrashingStorage::new(vec![1; 1024], None);
        d.grow(4096).unwrap();
        d.write_at(&[2; 512], 2048).unwrap();
        assert_eq!(d.len().unwrap(), 4096, "reads see the new length");
        let none = d.image(&Outcome::NothingSurvives);
        assert_eq!(
            none,
            vec![1; 1024],
            "the growth lost, the write past the old end with it"
        );
        let grown = d.image(&Outcome::IssuedBefore(1));
        assert_eq!((grown.len(), grown[2048]), (4096, 0));
        let all = d.image(&Outcome::EverythingSurvives);
        assert_eq!((all.len(), all[2048], all[1024]), (4096, 2, 0));
        d.sync().unwrap();
        assert_eq!(d.image(&Outcome::NothingSurvives), all);
        d.grow(100).unwrap();
        assert_eq!(d.len().unwrap(), 4096, "never shrinks");
    }

    #[test]
    fn tears_fall_on_sector_boundaries() {
        let d = CrashingStorage::new(vec![0; 8 * 512], None);
        d.write_at(&[5; 6 * 512 - 100], 100).unwrap();
        let mut torn_seen = false;
        for seed in 0..64 {
            let image = d.image(&Outcome::Torn(seed));
            // Within each sector the bytes written are all kept or all lost.
            for s in 0..6 {
                let piece = &image[(s * 512).max(100)..((s + 1) * 512).min(6 * 512)];
                assert!(
                    piece.iter().all(|&b| b == piece[0]),
                    "seed {seed} sector {s}"
                );
            }
            let kept = (0..6).filter(|s| image[s * 512 + 200] == 5).count();
            torn_seen |= kept > 0 && kept < 6;
        }
        assert!(torn_seen, "no outcome tore the write");
    }

    #[test]
    fn a_rename_is_durable_only_once_the_directory_is_synced() {
        let power = Power::new(None);
        let dir = power.directory();
        crate::dir::install_file(&dir, "h", b"header").unwrap();
        assert!(
            dir.volatile_ops().is_empty(),
            "install leaves nothing volatile"
        );
        // The same steps without the directory sync: the rename may be lost.
        let f = dir.create("t", 3).unwrap();
        f.write_at(b"new", 0).unwrap();
        f.sync().unwrap();
        dir.rename("t", "h").unwrap();
        let lost = dir.image(&Outcome::NothingSurvives);
        assert_eq!(lost["h"], b"header", "the old file is still there");
        assert!(!lost.contains_key("t"), "and the new one never got a name");
        let kept = dir.image(&Outcome::EverythingSurvives);
        assert_eq!((kept["h"].as_slice(), kept.len()), (&b"new"[..], 1));
    }

    #[test]
    fn a_sync_makes_durable_only_its_own_device() {
        let power = Power::new(None);
        let header = power.device(vec![0; 512]);
        let data = power.device(vec![0; 512]);
        header.write_at(&[1; 512], 0).unwrap();
        data.write_at(&[2; 512], 0).unwrap();
        data.sync().unwrap();
        assert_eq!(power.operations(), 3);
        assert_eq!(header.image(&Outcome::NothingSurvives)[0], 0);
        assert_eq!(data.image(&Outcome::NothingSurvives)[0], 2);
        assert_eq!(outcomes(&[&header, &data], 1).len(), 2 + 2 * 3);
    }
}
