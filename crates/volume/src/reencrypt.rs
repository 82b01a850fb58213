//! In-place conversion, driven by LUKS2's own reencryption metadata so that cryptsetup sees (and
//! can resume) the same state (`docs/LUKS2-REENCRYPT.md`).
//!
//! What runs (the states `cryptsetup reencrypt [--encrypt|--decrypt] --init-only` leave, or
//! ours), in cryptsetup's directions:
//!
//! - in place, with `checksum`, `journal` or `none` resilience: **encryption** with a detached
//!   header (forward), **decryption** with a detached header (backward), **reencryption** to a
//!   new volume key, header anywhere (forward);
//! - moving the data by the header's size (`datashift`): **encryption** that puts the header at
//!   the start of the device (`--reduce-device-size`; backward, each chunk written S bytes after
//!   where it was read, the first chunk read from the copy made at the device's end before the
//!   header went over it: [`crate::datashift`]) and **decryption** of such a volume, its header
//!   exported to a file first (forward, each chunk written S bytes before where it was read; the
//!   first chunk, moved to offset 0 at the start, last and in place under checksums).
//!
//! A step of one hotzone follows cryptsetup's order, so that a power cut at any write leaves a
//! state that this code or cryptsetup recovers without losing a byte. In place:
//!
//! 1. read the hotzone and write one hash per resilience block into the reencrypt keyslot's area
//!    (`journal`: the hotzone's bytes themselves; `none`: nothing); sync;
//! 2. write the header naming the hotzone `in-reencryption` (both copies, seqid + 1);
//! 3. convert the hotzone as one extended request and write it over itself; sync;
//! 4. write the header with the hotzone merged into the converted part; after the last hotzone,
//!    the final header (below) instead. cryptsetup 2.6 resumes a header whose reencryption has
//!    converted everything from the start again (a forward conversion with one segment is at
//!    offset 0), converting the data a second time with the wrong keys: that state, which
//!    cryptsetup itself leaves when cut short in its end, is never written here, and is ended
//!    here without touching the data when found.
//!
//! After a crash between 2 and 4 the hotzone is part old, part new. Recovery compares every block
//! with its stored hash: a block that still hashes to its old contents is converted again, any
//! other block was already written (each block is written whole); with `journal` the whole
//! hotzone is converted again from its copy; with `none` recovery is refused, naming the range
//! (nothing says which blocks were written), never guessed. A data-shift step skips 1:
//! its source is not overwritten by the step, so recovery simply converts the whole hotzone
//! again from there. When everything is converted, data no longer needed is overwritten with
//! random bytes (the plaintext copy a shifted encryption made, the stale tail a shifted
//! decryption leaves), and the header drops the backup segments, the reencrypt keyslot, its
//! digest and the requirement, and (after a decryption or a new key) the old keyslots, whose
//! areas are then wiped. cryptsetup removes those keyslots one header write at a time before the
//! rest, so a crash in its end leaves an old key that no longer opens: with everything
//! converted, that end is written here without the old key (no data is touched; a new key must
//! still open with the passphrase).

use std::io;

use sectorcrypt_cipher::{CipherSpec, Direction as Direction_, SectorCipher, SectorOptions};
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::metadata::Metadata;
use sectorcrypt_luks::luks2::reencrypt::{
    self, Direction, Mode, ReencryptSegment, Reencryption, Resilience, SegmentKind, State,
};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;

use crate::live::{Offline, Serving};
use crate::{Error, Layout};

/// Default hotzone: large enough that the two header writes per step do not show, small enough
/// for memory and for the time a step is exposed.
pub const DEFAULT_HOTZONE: u64 = 64 << 20;

/// How to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes converted per step (rounded down to the resilience block; capped by what the
    /// keyslot area can hold hashes for). A data-shift step is always the shift; this is then
    /// the size of the pieces it is copied in.
    pub hotzone: u64,
    /// Cipher threads.
    pub threads: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            hotzone: DEFAULT_HOTZONE,
            threads: 1,
        }
    }
}

/// Where a conversion stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes converted.
    pub done: u64,
    /// Bytes to convert in all.
    pub total: u64,
}

/// Throughput control, after each step (see [`Pace::after`]): two rules.
///
/// - **Clients first**: a served conversion whose step ran while clients sent requests waits, before
///   the next step, as long as that step took: under load it takes at most half the time, so
///   clients keep at least about half of the disk and CPU whatever the step size (measured in
///   `docs/BENCHMARKS.md`); idle, it runs flat out. A step itself is never slowed: the hotzone's
///   size bounds how long a request into it waits.
/// - **A rate** (`--max-rate`): at most so many bytes a second, counted from the first step.
///
/// Waits are cut into tenths of a second, so that `stop` is seen promptly.
#[derive(Debug)]
pub struct Pace {
    bytes_per_sec: Option<u64>,
    /// When the rate is counted from, and the progress then.
    start: std::time::Instant,
    first: Option<u64>,
    /// When the last step ended.
    last: std::time::Instant,
}

impl Pace {
    /// A pace of at most `bytes_per_sec` (none: as fast as the clients let it).
    pub fn new(bytes_per_sec: Option<u64>) -> Pace {
        let now = std::time::Instant::now();
        Pace {
            bytes_per_sec: bytes_per_sec.filter(|&r| r > 0),
            start: now,
            first: None,
            last: now,
        }
    }

    /// Wait after a step that left the conversion at `now`; `clients` says whether requests were
    /// served during it. Returns early once `stop` is set.
    pub fn after(&mut self, now: Progress, clients: bool, stop: &std::sync::atomic::AtomicBool) {
        use std::time::{Duration, Instant};
        let step = self.last.elapsed();
        let mut until = Instant::now();
        if clients {
            until += step;
        }
        match (self.first, self.bytes_per_sec) {
            (None, _) => {
                // The rate is that of this run, counted from its first step reported.
                self.first = Some(now.done);
                self.start = Instant::now();
            }
            (Some(first), Some(rate)) => {
                let due = self.start
                    + Duration::from_secs_f64(now.done.saturating_sub(first) as f64 / rate as f64);
                until = until.max(due);
            }
            (Some(_), None) => {}
        }
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
        self.last = Instant::now();
    }
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything is converted and the header says so.
    Finished,
    /// The progress callback asked to stop; the header records a clean state to resume from.
    Paused(Progress),
}

pub(crate) fn luks(e: sectorcrypt_luks::Error) -> Error {
    Error::Luks(e)
}

pub(crate) fn io_at(dev: &dyn Storage, what: &str, e: io::Error) -> Error {
    Error::Io(io::Error::new(
        e.kind(),
        format!("{what} on {}: {e}", dev.name()),
    ))
}

/// The conversions this engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Plaintext to ciphertext in place, from the start of the data to its end.
    EncryptForward,
    /// Ciphertext to plaintext in place, from the end of the data to its start.
    DecryptBackward,
    /// Old key to new key in place, from the start of the data to its end.
    ReencryptForward,
    /// Plaintext at 0 to ciphertext at the shift, from the end to the start.
    EncryptShift,
    /// Ciphertext at the shift to plaintext at 0, from the start to the end, the moved first
    /// chunk last.
    DecryptShift,
}

/// One step: the logical bytes `[at, at + len)` of the data, read at `src` and written at `dst`
/// on the data device (the same place for a conversion in place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hotzone {
    at: u64,
    len: u64,
    src: u64,
    dst: u64,
}

impl Hotzone {
    fn in_place(&self) -> bool {
        self.src == self.dst
    }
}

/// Where a step leaves the conversion (returned once per step: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Stepped {
    /// The header that records the step: more to convert.
    Next(Luks2Header),
    /// All converted, the header `hot` still naming the last hotzone: the final header is to be
    /// written next. Requests go by `routing` (the converted state, never written) until the
    /// device is opened again.
    Last { hot: Luks2Header, routing: Metadata },
}

/// Checksum resilience: the hash, its block, and where the hashes go on the header device.
struct Checksums {
    hash: Hash,
    block: u64,
    area: u64,
}

/// Resume (or start, from the init state) the reencryption recorded in the LUKS2 header on
/// `header_dev`, converting the data on `data_dev` (the same device for a header on the device).
/// `progress` is called after every step (the last one included); when it returns `false` the
/// run stops at that clean point.
///
/// Errors: [`Error::Unsupported`] for conversions this code does not run (see the module docs);
/// [`Error::Luks`] for a wrong passphrase or metadata whose digest does not verify (nothing is
/// written then; but a decryption with every chunk converted ends without any key, see the
/// module docs); [`Error::Io`].
pub fn run(
    header_dev: &dyn Storage,
    data_dev: &dyn Storage,
    passphrase: &[u8],
    options: &Options,
    progress: &mut dyn FnMut(Progress) -> bool,
) -> Result<Outcome, Error> {
    run_serving(
        header_dev, data_dev, passphrase, options, progress, &Offline,
    )
}

/// [`run`] on a device that `serving` serves meanwhile: each step holds its hotzone's range in
/// `serving` and reroutes it when the header records the step ([`crate::live`]). A step that
/// fails leaves its range failed there.
pub fn run_serving(
    header_dev: &dyn Storage,
    data_dev: &dyn Storage,
    passphrase: &[u8],
    options: &Options,
    progress: &mut dyn FnMut(Progress) -> bool,
    serving: &dyn Serving,
) -> Result<Outcome, Error> {
    drive(
        header_dev,
        data_dev,
        passphrase,
        options,
        progress,
        serving,
        Until::End,
    )
}

/// Recover the step a crash cut short, if the header records one, and stop there (a device must
/// be in a clean state to be served while converted). Errors as [`run`].
pub fn recover(
    header_dev: &dyn Storage,
    data_dev: &dyn Storage,
    passphrase: &[u8],
    options: &Options,
) -> Result<(), Error> {
    drive(
        header_dev,
        data_dev,
        passphrase,
        options,
        &mut |_| true,
        &Offline,
        Until::Recovered,
    )
    .map(drop)
}

/// How far [`drive`] goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// To the end (or a pause).
    End,
    /// Only a crashed step's recovery.
    Recovered,
}

/// What serving a device in the middle of a conversion needs.
pub struct Converting {
    /// The volume key of the layout before (`None`: plaintext).
    pub old_key: Option<SecretBytes>,
    /// The volume key of the layout after (`None`: plaintext).
    pub new_key: Option<SecretBytes>,
    /// The data when the conversion ends: where, how encrypted, and how many bytes (the size
    /// served throughout).
    pub final_layout: Layout,
}

/// The keys (checked against the reencryption digest, as a resumed run checks them) and the
/// layouts of the conversion recorded in `header`, read from `header_dev`, over `data_dev`.
///
/// Errors: as [`run`]; [`Error::Refused`] for a crashed state (see [`recover`]).
pub fn converting(
    header_dev: &dyn Storage,
    data_dev: &dyn Storage,
    passphrase: &[u8],
) -> Result<Converting, Error> {
    let header = Luks2Header::read(header_dev).map_err(luks)?;
    header.metadata().check_requirements_known().map_err(luks)?;
    let r = in_progress(&header)?;
    if r.state() == State::Crash {
        return Err(Error::Refused(
            "a step of the conversion was cut short: recover it first".into(),
        ));
    }
    let plan = plan_of(&r)?;
    let (_, guard) = guard_of(plan, &r)?;
    let (old_key, new_key) = volume_keys(plan, &header, header_dev, passphrase)?;
    let shift = r.keyslot.resilience.shift_size().unwrap_or(0);
    let Extent { total, .. } = extent(plan, &r, data_dev, shift, &guard)?;
    let final_layout = match &r.backup_final.kind {
        SegmentKind::Crypt {
            iv_tweak,
            encryption,
            sector_size,
        } => Layout {
            offset: r.backup_final.offset,
            size: total,
            cipher: encryption.clone(),
            sector_size: *sector_size as usize,
            iv_offset: *iv_tweak,
        },
        _ => Layout {
            offset: r.backup_final.offset,
            size: total,
            cipher: "cipher_null-ecb".into(),
            sector_size: 512,
            iv_offset: 0,
        },
    };
    Ok(Converting {
        old_key,
        new_key,
        final_layout,
    })
}

fn drive(
    header_dev: &dyn Storage,
    data_dev: &dyn Storage,
    passphrase: &[u8],
    options: &Options,
    progress: &mut dyn FnMut(Progress) -> bool,
    serving: &dyn Serving,
    until: Until,
) -> Result<Outcome, Error> {
    let mut header = Luks2Header::read(header_dev).map_err(luks)?;
    // A requirement of a newer cryptsetup beside the reencryption one: this conversion is not
    // ours to continue.
    header.metadata().check_requirements_known().map_err(luks)?;
    let r = reencrypt::parse(header.metadata())
        .map_err(luks)?
        .ok_or_else(|| Error::Unsupported("the header has no reencryption in progress".into()))?;
    let plan = plan_of(&r)?;
    let (checksums, guard) = guard_of(plan, &r)?;
    let (old_key, new_key) = match volume_keys(plan, &header, header_dev, passphrase) {
        Ok(keys) => keys,
        Err(e) if reencrypt::all_converted(header.metadata(), &r) => {
            return end_without_the_old_key(header_dev, &header, &r, passphrase, e);
        }
        Err(e) => return Err(e),
    };
    let (old, new) = (old_key.as_deref(), new_key.as_deref());
    let block = checksums.as_ref().map(|c| c.block);
    // What a hotzone goes through: decrypt with the old layout's key, encrypt with the new one's.
    let mut passes = Vec::new();
    if let Some(k) = old {
        let cipher = layout_cipher(&r.backup_previous, k, block, options)?;
        passes.push((cipher, Direction_::Decrypt));
    }
    if let Some(k) = new {
        let cipher = layout_cipher(&r.backup_final, k, block, options)?;
        passes.push((cipher, Direction_::Encrypt));
    }
    let shift = r.keyslot.resilience.shift_size().unwrap_or(0);
    let Extent { base, total, moved } = extent(plan, &r, data_dev, shift, &guard)?;
    let hotzone = hotzone_size(plan, &r, checksums.as_ref(), &guard, total, options)?;
    let engine = Engine {
        header_dev,
        data_dev,
        passes: &passes,
        plan,
        total,
        base,
        shift,
        moved: moved.unwrap_or((0, 0)),
        checksums,
        guard,
        hotzone,
    };

    if r.state() == State::Crash {
        let hot = r
            .in_reencryption()
            .ok_or_else(|| Error::Unsupported("a crashed state without a hotzone".into()))?;
        let hz = engine.crashed_hotzone(hot)?;
        engine.recover(hz)?;
        match engine.end_step(&header, &r, hz)? {
            Stepped::Next(h) => header = h,
            Stepped::Last { hot, .. } => {
                write_the_end(header_dev, &hot, &r)?;
                return Ok(Outcome::Finished);
            }
        }
    }
    let mut r = in_progress(&header)?;
    let total_done = engine.done(header.metadata(), &r);
    if until == Until::Recovered {
        return Ok(Outcome::Paused(Progress {
            done: total_done,
            total,
        }));
    }
    serving.started(&header, old, new)?;
    loop {
        let Some(hz) = engine.next_hotzone(header.metadata(), &r) else {
            engine.finish(&header, &r)?;
            return Ok(Outcome::Finished);
        };
        serving.hold(hz.at, hz.len);
        let stepped = engine.step(&header, &r, hz, serving.is_live());
        header = match stepped {
            Ok(Stepped::Next(h)) => h,
            Ok(Stepped::Last { hot, routing }) => {
                serving.release(&routing)?;
                write_the_end(header_dev, &hot, &r)?;
                progress(Progress { done: total, total });
                return Ok(Outcome::Finished);
            }
            Err(e) => {
                serving.failed(&e);
                return Err(e);
            }
        };
        serving.release(header.metadata())?;
        r = in_progress(&header)?;
        let now = Progress {
            done: engine.done(header.metadata(), &r),
            total,
        };
        if !progress(now) && now.done < total {
            return Ok(Outcome::Paused(now));
        }
    }
}

/// What the reencryption keyslot asks for, among what runs here.
fn plan_of(r: &Reencryption) -> Result<Plan, Error> {
    let moved = r.backup_moved.is_some();
    Ok(match (r.keyslot.mode, r.keyslot.direction, moved) {
        (Mode::Encrypt, Direction::Forward, false) => Plan::EncryptForward,
        (Mode::Decrypt, Direction::Backward, false) => Plan::DecryptBackward,
        (Mode::Reencrypt, Direction::Forward, false) => Plan::ReencryptForward,
        (Mode::Encrypt, Direction::Backward, true) => Plan::EncryptShift,
        (Mode::Decrypt, Direction::Forward, true) => Plan::DecryptShift,
        _ => {
            return Err(Error::Unsupported(format!(
                "resuming a {} {} reencryption{} (cryptsetup's directions run here: forward \
                 encryption and reencryption, backward decryption; with a data shift, backward \
                 encryption and forward decryption)",
                r.keyslot.direction.as_str(),
                r.keyslot.mode.as_str(),
                if moved { " with a data shift" } else { "" }
            )))
        }
    })
}

/// How each step is protected: checksums of its blocks, a journal of its old bytes, the data
/// shift itself, or nothing; refused where the resilience does not fit the direction.
fn guard_of(plan: Plan, r: &Reencryption) -> Result<(Option<Checksums>, Guard), Error> {
    let in_place = matches!(
        plan,
        Plan::EncryptForward | Plan::DecryptBackward | Plan::ReencryptForward
    );
    Ok(match (plan, &r.keyslot.resilience) {
        (Plan::EncryptShift, Resilience::Datashift { .. }) => (None, Guard::Shift),
        (
            Plan::DecryptShift,
            Resilience::DatashiftChecksum {
                hash, sector_size, ..
            },
        )
        | (
            Plan::EncryptForward | Plan::DecryptBackward | Plan::ReencryptForward,
            Resilience::Checksum { hash, sector_size },
        ) => (
            Some(Checksums {
                hash: sectorcrypt_luks::hash::parse(hash).map_err(luks)?,
                block: u64::from(*sector_size),
                area: r.keyslot.area_offset,
            }),
            Guard::Checksum,
        ),
        // The moved first chunk, converted last and in place, copied whole into the area first.
        (Plan::DecryptShift, Resilience::DatashiftJournal { .. }) => (
            None,
            Guard::Journal {
                area: r.keyslot.area_offset,
                size: r.keyslot.area_size,
            },
        ),
        (_, Resilience::Journal) if in_place => (
            None,
            Guard::Journal {
                area: r.keyslot.area_offset,
                size: r.keyslot.area_size,
            },
        ),
        (_, Resilience::None) if in_place => (None, Guard::Unprotected),
        (_, other) => {
            return Err(Error::Unsupported(format!(
                "{} resilience with this direction (checksum, journal and none run in place; \
                 datashift, datashift-checksum and datashift-journal with a data shift)",
                other.area_type()
            )))
        }
    })
}

/// A volume key, zeroized when dropped.
type VolumeKey = SecretBytes;

/// The old and new volume keys the plan needs, opened with `passphrase` and checked against the
/// reencryption digest: metadata edited by someone without the keys must not steer what is
/// written.
fn volume_keys(
    plan: Plan,
    header: &Luks2Header,
    header_dev: &dyn Storage,
    passphrase: &[u8],
) -> Result<(Option<VolumeKey>, Option<VolumeKey>), Error> {
    let keys = reencrypt::unlock_volume_keys(header, header_dev, passphrase).map_err(luks)?;
    let missing = || Error::Unsupported("a volume key of the reencryption does not open".into());
    let old_key = keys.old.map(|u| u.volume_key);
    let new_key = keys.new.map(|u| u.volume_key);
    let need_old = matches!(
        plan,
        Plan::DecryptBackward | Plan::DecryptShift | Plan::ReencryptForward
    );
    let need_new = matches!(
        plan,
        Plan::EncryptForward | Plan::EncryptShift | Plan::ReencryptForward
    );
    let old = match need_old {
        true => Some(old_key.ok_or_else(missing)?),
        false => None,
    };
    let new = match need_new {
        true => Some(new_key.ok_or_else(missing)?),
        false => None,
    };
    if !reencrypt::verify_reencrypt_digest(header, old.as_deref(), new.as_deref()).map_err(luks)? {
        return Err(luks(sectorcrypt_luks::Error::DigestMismatch(
            "the reencryption digest".into(),
        )));
    }
    Ok((old, new))
}

/// What a conversion covers on the data device.
struct Extent {
    /// Where the converted data starts.
    base: u64,
    /// How much of it there is.
    total: u64,
    /// A data shift's moved segment: offset and size.
    moved: Option<(u64, u64)>,
}

/// What the conversion covers; refused where the segments do not fit the device.
fn extent(
    plan: Plan,
    r: &Reencryption,
    data_dev: &dyn Storage,
    shift: u64,
    guard: &Guard,
) -> Result<Extent, Error> {
    let device_len = data_dev
        .len()
        .map_err(|e| io_at(data_dev, "reading the size", e))?;
    let (base, total) = match plan {
        Plan::DecryptBackward => (r.backup_previous.offset, None),
        Plan::EncryptForward | Plan::ReencryptForward => (r.backup_final.offset, None),
        Plan::EncryptShift => (0, r.backup_previous.size),
        Plan::DecryptShift => (0, device_len.checked_sub(shift)),
    };
    let total = match total {
        Some(t) => t,
        None => device_len.checked_sub(base).ok_or_else(|| {
            Error::Unsupported(format!(
                "the data starts at {base}, past the end of {}",
                data_dev.name()
            ))
        })?,
    };
    let moved = r
        .backup_moved
        .as_ref()
        .map(|m| (m.offset, m.size.unwrap_or(0)));
    let layout_fits = match (plan, moved) {
        (Plan::EncryptShift, Some((offset, size))) => {
            shift + total <= offset && offset + size <= device_len && size > 0
        }
        (Plan::DecryptShift, Some((offset, size))) => {
            let journal_holds = match guard {
                Guard::Journal { size: area, .. } => size <= *area,
                _ => true,
            };
            offset == 0 && size > 0 && size <= shift && journal_holds
        }
        _ => true,
    };
    if !layout_fits {
        return Err(Error::Unsupported(format!(
            "a data shift whose segments do not fit the {device_len}-byte {}",
            data_dev.name()
        )));
    }
    Ok(Extent { base, total, moved })
}

/// The bytes of one step: as asked, within what a checksum area or a journal can hold, in whole
/// resilience blocks.
fn hotzone_size(
    plan: Plan,
    r: &Reencryption,
    checksums: Option<&Checksums>,
    guard: &Guard,
    total: u64,
    options: &Options,
) -> Result<u64, Error> {
    let hotzone = match checksums {
        Some(c) => {
            if plan != Plan::DecryptShift && !total.is_multiple_of(c.block) {
                return Err(Error::Unsupported(format!(
                    "a data device of {total} bytes with {}-byte resilience blocks (the size \
                     must be a multiple of it)",
                    c.block
                )));
            }
            let max_hot = r.keyslot.area_size / c.hash.digest_len() as u64 * c.block;
            options.hotzone.min(max_hot) / c.block * c.block
        }
        // A journal holds a whole hotzone's old bytes.
        None => match guard {
            Guard::Journal { size, .. } => options.hotzone.min(*size) / 4096 * 4096,
            _ => options.hotzone / 4096 * 4096,
        },
    };
    if hotzone == 0 {
        return Err(Error::Unsupported(format!(
            "a hotzone of {} bytes (at least one {}-byte block)",
            options.hotzone,
            checksums.map_or(4096, |c| c.block)
        )));
    }
    Ok(hotzone)
}

fn in_progress(header: &Luks2Header) -> Result<Reencryption, Error> {
    reencrypt::parse(header.metadata())
        .map_err(luks)?
        .ok_or_else(|| Error::Unsupported("the reencryption vanished from the header".into()))
}

/// The keyed cipher of a crypt layout (`backup-previous` or `backup-final`), checked against the
/// resilience block (which must hold whole sectors).
fn layout_cipher(
    layout: &ReencryptSegment,
    key: &[u8],
    block: Option<u64>,
    options: &Options,
) -> Result<SectorCipher, Error> {
    let SegmentKind::Crypt {
        iv_tweak,
        encryption,
        sector_size,
    } = &layout.kind
    else {
        return Err(Error::Unsupported(
            "an encrypted layout without a cipher".into(),
        ));
    };
    if let Some(block) = block.filter(|b| !b.is_multiple_of(u64::from(*sector_size))) {
        return Err(Error::Unsupported(format!(
            "{sector_size}-byte sectors with {block}-byte resilience blocks"
        )));
    }
    Ok(SectorCipher::new(
        CipherSpec::parse(encryption)?,
        key,
        &SectorOptions {
            sector_size: *sector_size as usize,
            iv_offset: *iv_tweak,
            threads: options.threads.max(1),
            ..Default::default()
        },
    )?)
}

/// The size of the leading crypt segment, if the regular segments start with one.
fn leading_crypt(r: &Reencryption, base: u64) -> Option<Option<u64>> {
    match r.segments.first() {
        Some(s) if matches!(s.kind, SegmentKind::Crypt { .. }) && s.offset == base => Some(s.size),
        _ => None,
    }
}

/// Overwrite `len` bytes at `offset` with bytes nobody can tell from ciphertext (zeros
/// encrypted under a throwaway random key, as fast as the cipher), durably.
pub(crate) fn wipe_random(dev: &dyn Storage, offset: u64, len: u64) -> Result<(), Error> {
    const PIECE: u64 = 1 << 20;
    let key = sectorcrypt_luks::luks2::random_bytes(64);
    let cipher = SectorCipher::new(
        CipherSpec::parse("aes-xts-plain64")?,
        &key,
        &SectorOptions::default(),
    )?;
    let mut buf = vec![0u8; PIECE.min(len).div_ceil(512) as usize * 512];
    let mut done = 0;
    while done < len {
        let n = PIECE.min(len - done);
        // Whole sectors for the cipher; a ragged end just keeps some zero bytes' ciphertext.
        let buf = &mut buf[..n.div_ceil(512) as usize * 512];
        buf.fill(0);
        cipher.process(buf, (offset + done) / 512, Direction_::Encrypt)?;
        dev.write_at(&buf[..n as usize], offset + done)
            .map_err(|e| io_at(dev, "overwriting data no longer needed", e))?;
        done += n;
    }
    dev.sync()
        .map_err(|e| io_at(dev, "overwriting data no longer needed", e))
}

/// What every step needs.
/// How an in-place hotzone is protected (the reencrypt keyslot's resilience).
#[derive(Clone, Copy)]
enum Guard {
    /// One hash per block of the old contents (`checksum`, `datashift-checksum`).
    Checksum,
    /// The hotzone's old bytes copied into the area first (`journal`).
    Journal {
        /// The area's offset on the header device.
        area: u64,
        /// Its size: the largest hotzone.
        size: u64,
    },
    /// Nothing (`none`): a cut inside a hotzone cannot be recovered.
    Unprotected,
    /// The source is not overwritten (`datashift`).
    Shift,
}

struct Engine<'a> {
    header_dev: &'a dyn Storage,
    data_dev: &'a dyn Storage,
    /// What a hotzone goes through, in order (a cipher, and whether it encrypts or decrypts).
    passes: &'a [(SectorCipher, Direction_)],
    plan: Plan,
    /// Bytes of data.
    total: u64,
    /// The data's offset on `data_dev` (conversions in place).
    base: u64,
    /// The data shift (0 in place).
    shift: u64,
    /// The moved first chunk: (offset on `data_dev`, bytes); (0, 0) without a shift.
    moved: (u64, u64),
    checksums: Option<Checksums>,
    /// How a hotzone is protected while it is written.
    guard: Guard,
    /// Bytes per in-place step, or per piece of a data-shift copy.
    hotzone: u64,
}

impl Engine<'_> {
    /// One step over `hz`, from the clean state `header` (whose reencryption is `r`) to the
    /// header that records it converted. `live`: requests are served meanwhile (none in the
    /// hotzone: it is held), so what they wrote there is made durable before it is hashed: a
    /// recovery must find the bytes the hashes were taken of.
    fn step(
        &self,
        header: &Luks2Header,
        r: &Reencryption,
        hz: Hotzone,
        live: bool,
    ) -> Result<Stepped, Error> {
        let header = if hz.in_place() {
            if live {
                self.sync_data("making served writes durable")?;
            }
            // Read once: nothing else writes the hotzone while it is converted.
            let mut buf = self.read(hz.src, hz.len)?;
            self.protect(&buf)?;
            let header = self.commit(header, r, hz, true)?;
            self.transform(&mut buf, hz.at)?;
            self.write(&buf, hz.dst, "writing the hotzone")?;
            self.sync_data("writing the hotzone")?;
            header
        } else {
            let header = self.commit(header, r, hz, true)?;
            self.shift_copy(hz)?;
            header
        };
        self.end_step(&header, r, hz)
    }

    /// Step 4 for `hz`, converted under the header `header` that names it hot: the header
    /// recording it converted, unless that leaves nothing to convert in place: then nothing is
    /// written, and the caller writes the final header next (see the module docs). A data-shift
    /// conversion still has its clean-up to do before its end ([`Engine::finish`]).
    fn end_step(
        &self,
        header: &Luks2Header,
        r: &Reencryption,
        hz: Hotzone,
    ) -> Result<Stepped, Error> {
        let post = self.progressed(header, r, hz, false)?;
        let in_place = matches!(
            self.plan,
            Plan::EncryptForward | Plan::DecryptBackward | Plan::ReencryptForward
        );
        if in_place {
            let after = reencrypt::parse(&post)
                .map_err(luks)?
                .ok_or_else(|| Error::Unsupported("a step that ends the reencryption".into()))?;
            if self.next_hotzone(&post, &after).is_none() {
                return Ok(Stepped::Last {
                    hot: header.clone(),
                    routing: post,
                });
            }
        }
        reencrypt::write_metadata(self.header_dev, header, &post)
            .map(Stepped::Next)
            .map_err(luks)
    }

    /// Convert `buf`, the data at logical offset `at`, in memory.
    fn transform(&self, buf: &mut [u8], at: u64) -> Result<(), Error> {
        for (cipher, direction) in self.passes {
            cipher.process(buf, at / cipher.sector_size() as u64, *direction)?;
        }
        Ok(())
    }

    /// Plaintext bytes still to encrypt in a shifted encryption: the linear segments.
    fn plaintext_left(r: &Reencryption) -> u64 {
        r.segments
            .iter()
            .filter(|s| s.kind == SegmentKind::Linear)
            .map(|s| s.size.unwrap_or(0))
            .sum()
    }

    /// Bytes converted so far, from the regular segments.
    fn done(&self, md: &Metadata, r: &Reencryption) -> u64 {
        let leading = leading_crypt(r, self.base);
        match self.plan {
            Plan::EncryptForward => leading.map_or(0, |size| size.unwrap_or(self.total)),
            Plan::DecryptBackward => {
                leading.map_or(self.total, |size| self.total - size.unwrap_or(self.total))
            }
            // Old and new segments may look alike; the new key's digest tells them apart.
            Plan::ReencryptForward => match leading {
                Some(size) if md.digest_of_segment(0).map(|(n, _)| n) == r.digest_new => {
                    size.unwrap_or(self.total)
                }
                _ => 0,
            },
            Plan::EncryptShift => self.total - Self::plaintext_left(r).min(self.total),
            Plan::DecryptShift => match self.next_hotzone(md, r) {
                None => self.total,
                Some(hz) if hz.at == 0 => self.total - hz.len,
                Some(hz) => hz.at - self.moved.1,
            },
        }
    }

    /// The next hotzone, or `None` when all is converted.
    fn next_hotzone(&self, md: &Metadata, r: &Reencryption) -> Option<Hotzone> {
        let s = self.shift;
        match self.plan {
            Plan::EncryptForward | Plan::DecryptBackward | Plan::ReencryptForward => {
                let done = self.done(md, r);
                if done >= self.total {
                    return None;
                }
                let len = self.hotzone.min(self.total - done);
                // A backward decryption converts the end of the still-encrypted start.
                let at = match self.plan {
                    Plan::DecryptBackward => self.total - done - len,
                    _ => done,
                };
                let src = self.base + at;
                Some(Hotzone {
                    at,
                    len,
                    src,
                    dst: src,
                })
            }
            // Chunks of S from the end of the plaintext; the last S bytes a chunk of their own,
            // read from the copy at the moved segment (`reencrypt_offset_backward_moved`).
            Plan::EncryptShift => {
                let left = Self::plaintext_left(r);
                if left == 0 {
                    None
                } else if left <= s {
                    Some(Hotzone {
                        at: 0,
                        len: left,
                        src: self.moved.0,
                        dst: s,
                    })
                } else {
                    let at = s.max(left - s);
                    Some(Hotzone {
                        at,
                        len: left - at,
                        src: at,
                        dst: s + at,
                    })
                }
            }
            // The chunk after the decrypted part (the last crypt segment), S at a time; when
            // only the moved copy at 0 is left, that, in place.
            Plan::DecryptShift => match r.segments.first() {
                Some(first) if first.kind == SegmentKind::Linear => None,
                _ => match r.segments.last() {
                    Some(last)
                        if r.segments.len() > 1
                            && matches!(last.kind, SegmentKind::Crypt { .. }) =>
                    {
                        let at = last.offset - s;
                        let len = s.min(self.total - at);
                        Some(Hotzone {
                            at,
                            len,
                            src: s + at,
                            dst: at,
                        })
                    }
                    _ => Some(Hotzone {
                        at: 0,
                        len: self.moved.1,
                        src: 0,
                        dst: 0,
                    }),
                },
            },
        }
    }

    /// The hotzone a crash interrupted: the `in-reencryption` segment.
    fn crashed_hotzone(&self, hot: &ReencryptSegment) -> Result<Hotzone, Error> {
        let len = hot
            .size
            .ok_or_else(|| Error::Unsupported("a hotzone of dynamic size".into()))?;
        let bad = || Error::Unsupported("a hotzone outside the data".into());
        let s = self.shift;
        let (at, src) = match self.plan {
            Plan::EncryptShift => {
                let at = hot.offset.checked_sub(s).ok_or_else(bad)?;
                (at, if at == 0 { self.moved.0 } else { at })
            }
            Plan::DecryptShift if hot.offset == 0 => (0, 0),
            Plan::DecryptShift => (hot.offset, hot.offset + s),
            _ => (
                hot.offset.checked_sub(self.base).ok_or_else(bad)?,
                hot.offset,
            ),
        };
        if at.checked_add(len).is_none_or(|end| end > self.total) {
            return Err(bad());
        }
        Ok(Hotzone {
            at,
            len,
            src,
            dst: hot.offset,
        })
    }

    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, Error> {
        let mut buf = vec![0u8; len as usize];
        self.data_dev
            .read_at(&mut buf, offset)
            .map_err(|e| io_at(self.data_dev, "reading the hotzone", e))?;
        Ok(buf)
    }

    fn write(&self, buf: &[u8], offset: u64, what: &str) -> Result<(), Error> {
        self.data_dev
            .write_at(buf, offset)
            .map_err(|e| io_at(self.data_dev, what, e))
    }

    fn sync_data(&self, what: &str) -> Result<(), Error> {
        self.data_dev
            .sync()
            .map_err(|e| io_at(self.data_dev, what, e))
    }

    fn hashes(&self, c: &Checksums, data: &[u8]) -> Vec<u8> {
        let n = c.hash.digest_len();
        let mut out = vec![0u8; data.len() / c.block as usize * n];
        for (block, h) in data.chunks(c.block as usize).zip(out.chunks_mut(n)) {
            c.hash.digest_into(&[block], h);
        }
        out
    }

    fn checksums(&self) -> Result<&Checksums, Error> {
        self.checksums
            .as_ref()
            .ok_or_else(|| Error::Unsupported("converting in place without checksums".into()))
    }

    /// Step 1 in place: the hash of every block of the hotzone as it is now (`data`), durable
    /// before the header names the hotzone.
    fn protect(&self, data: &[u8]) -> Result<(), Error> {
        match self.guard {
            Guard::Unprotected => return Ok(()),
            Guard::Journal { area, .. } => {
                return self
                    .header_dev
                    .write_at(data, area)
                    .and_then(|()| self.header_dev.sync())
                    .map_err(|e| io_at(self.header_dev, "writing the resilience journal", e))
            }
            Guard::Checksum | Guard::Shift => {}
        }
        let c = self.checksums()?;
        let hashes = self.hashes(c, data);
        self.header_dev
            .write_at(&hashes, c.area)
            .and_then(|()| self.header_dev.sync())
            .map_err(|e| io_at(self.header_dev, "writing the resilience hashes", e))
    }

    /// A data-shift step: convert the hotzone from its source to its destination, in pieces
    /// (they never overlap, so no piece needs protecting), durably.
    fn shift_copy(&self, hz: Hotzone) -> Result<(), Error> {
        let mut done = 0;
        while done < hz.len {
            let n = self.hotzone.min(hz.len - done);
            let mut buf = self.read(hz.src + done, n)?;
            self.transform(&mut buf, hz.at + done)?;
            self.write(&buf, hz.dst + done, "writing the hotzone")?;
            done += n;
        }
        self.sync_data("writing the hotzone")
    }

    /// After a crash: a data-shift hotzone is converted again from its intact source; in place,
    /// the blocks that still hash to what they held before are.
    fn recover(&self, hz: Hotzone) -> Result<(), Error> {
        if !hz.in_place() {
            return self.shift_copy(hz);
        }
        match self.guard {
            // The journal holds the hotzone's old bytes: convert them again, whole.
            Guard::Journal { area, .. } => {
                let mut old = vec![0u8; hz.len as usize];
                self.header_dev
                    .read_at(&mut old, area)
                    .map_err(|e| io_at(self.header_dev, "reading the resilience journal", e))?;
                self.transform(&mut old, hz.at)?;
                self.write(&old, hz.dst, "recovering the hotzone")?;
                return self.sync_data("recovering the hotzone");
            }
            Guard::Unprotected => {
                return Err(Error::Unsupported(format!(
                    "recovering a hotzone of {} bytes at {} written without resilience \
                     (`none`): which of its blocks were converted cannot be known; restore \
                     that range from a backup",
                    hz.len, hz.dst
                )))
            }
            Guard::Checksum | Guard::Shift => {}
        }
        let c = self.checksums()?;
        let mut data = self.read(hz.src, hz.len)?;
        let n = c.hash.digest_len();
        let mut stored = vec![0u8; (hz.len / c.block) as usize * n];
        self.header_dev
            .read_at(&mut stored, c.area)
            .map_err(|e| io_at(self.header_dev, "reading the resilience hashes", e))?;
        let now = self.hashes(c, &data);
        for (i, block) in data.chunks_mut(c.block as usize).enumerate() {
            if now[i * n..(i + 1) * n] != stored[i * n..(i + 1) * n] {
                continue; // already the new contents
            }
            let offset = i as u64 * c.block;
            self.transform(block, hz.at + offset)?;
            self.write(block, hz.dst + offset, "recovering the hotzone")?;
        }
        self.sync_data("recovering the hotzone")
    }

    /// Steps 2 and 4: the header naming the hotzone as being written (`hot`), or as converted.
    fn commit(
        &self,
        header: &Luks2Header,
        r: &Reencryption,
        hz: Hotzone,
        hot: bool,
    ) -> Result<Luks2Header, Error> {
        let md = self.progressed(header, r, hz, hot)?;
        reencrypt::write_metadata(self.header_dev, header, &md).map_err(luks)
    }

    /// The metadata of [`Engine::commit`], not yet written.
    fn progressed(
        &self,
        header: &Luks2Header,
        r: &Reencryption,
        hz: Hotzone,
        hot: bool,
    ) -> Result<Metadata, Error> {
        let md = header.metadata();
        let (at, len, total) = (hz.at, hz.len, self.total);
        let hot_len = hot.then_some(len);
        match self.plan {
            Plan::EncryptForward if hot => reencrypt::encrypt_forward_progress(md, r, at, hot_len),
            Plan::EncryptForward => reencrypt::encrypt_forward_progress(md, r, at + len, None),
            Plan::DecryptBackward => {
                reencrypt::decrypt_backward_progress(md, r, at, hot_len, total)
            }
            Plan::ReencryptForward if hot => {
                reencrypt::reencrypt_forward_progress(md, r, at, hot_len, total)
            }
            Plan::ReencryptForward => {
                reencrypt::reencrypt_forward_progress(md, r, at + len, None, total)
            }
            Plan::EncryptShift => reencrypt::encrypt_datashift_progress(md, r, at, len, hot, total),
            Plan::DecryptShift => reencrypt::decrypt_datashift_progress(md, r, at, len, hot, total),
        }
        .map_err(luks)
    }

    /// Everything is converted: overwrite what is no longer needed, then the final header.
    fn finish(&self, header: &Luks2Header, r: &Reencryption) -> Result<(), Error> {
        match self.plan {
            // The plaintext copy of the first chunk.
            Plan::EncryptShift => wipe_random(self.data_dev, self.moved.0, self.moved.1)?,
            // Ciphertext left behind the plaintext.
            Plan::DecryptShift => wipe_random(self.data_dev, self.total, self.shift)?,
            _ => {}
        }
        write_the_end(self.header_dev, header, r)
    }
}

/// The final header, then the keyslot areas it no longer has wiped.
fn write_the_end(
    header_dev: &dyn Storage,
    header: &Luks2Header,
    r: &Reencryption,
) -> Result<(), Error> {
    let md = reencrypt::finished(header.metadata(), r).map_err(luks)?;
    let wipe = reencrypt::removed_keyslot_areas(header.metadata(), &md);
    reencrypt::write_metadata(header_dev, header, &md).map_err(luks)?;
    // Keys and hashes of the finished conversion are of no use to anyone now.
    for (offset, size) in wipe {
        header_dev
            .write_at(&vec![0u8; size as usize], offset)
            .map_err(|e| io_at(header_dev, "wiping a keyslot area", e))?;
    }
    header_dev
        .sync()
        .map_err(|e| io_at(header_dev, "wiping keyslot areas", e))
}

/// The end of a conversion cryptsetup cut short while ending it ([`reencrypt::all_converted`]):
/// the data is all converted and the old key's keyslots are wiped or gone, so the keys do not
/// open (`unopened`, returned if the new key does not open either). The reencryption digest
/// needs the old key and cannot be checked; nothing it guards runs: no data is written (cryptsetup
/// overwrote what was no longer needed before it destroyed a keyslot), only the final header,
/// which keeps the new key's keyslots, whose key the passphrase must open.
fn end_without_the_old_key(
    header_dev: &dyn Storage,
    header: &Luks2Header,
    r: &Reencryption,
    passphrase: &[u8],
    unopened: Error,
) -> Result<Outcome, Error> {
    if r.digest_new.is_some() && reencrypt::unlock_new_key(header, header_dev, passphrase).is_err()
    {
        return Err(unopened);
    }
    write_the_end(header_dev, header, r)?;
    Ok(Outcome::Finished)
}
