//! In-place conversion, driven by LUKS2's own reencryption metadata so that cryptsetup sees (and
//! can resume) the same state (`docs/LUKS2-REENCRYPT.md`).
//!
//! What runs today, with `checksum` resilience and no data shift (the states `cryptsetup
//! reencrypt [--encrypt|--decrypt] [--header HDR] --init-only` leave, or ours): **encryption**
//! (detached header), forward from the start of the data; **decryption** (detached header),
//! backward from its end; and **reencryption** to a new volume key (header anywhere), forward —
//! cryptsetup's directions. Each step of one hotzone follows cryptsetup's order, so that a power cut at any
//! write leaves a state that this code or cryptsetup recovers without losing a byte:
//!
//! 1. read the hotzone and write one hash per resilience block into the reencrypt keyslot's area;
//!    sync;
//! 2. write the header naming the hotzone `in-reencryption` (both copies, seqid + 1);
//! 3. convert the hotzone as one extended request and write it over itself; sync;
//! 4. write the header with the hotzone merged into the converted part.
//!
//! After a crash between 2 and 4 the hotzone is part old, part new. Recovery compares every block
//! with its stored hash: a block that still hashes to its old contents is converted again, any
//! other block was already written (each block is written whole). When everything is converted,
//! the header drops the backup segments, the reencrypt keyslot, its digest and the requirement,
//! and (after a decryption) the old keyslots, whose areas are then wiped.

use std::io;

use sectorcrypt_cipher::{CipherSpec, Direction as Direction_, SectorCipher, SectorOptions};
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::metadata::Metadata;
use sectorcrypt_luks::luks2::reencrypt::{
    self, Direction, Mode, ReencryptSegment, Reencryption, Resilience, SegmentKind, State,
};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_storage::Storage;

use crate::Error;

/// Default hotzone: large enough that the two header writes per step do not show, small enough
/// for memory and for the time a step is exposed.
pub const DEFAULT_HOTZONE: u64 = 64 << 20;

/// How to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes converted per step (rounded down to the resilience block; capped by what the
    /// keyslot area can hold hashes for).
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

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything is converted and the header says so.
    Finished,
    /// The progress callback asked to stop; the header records a clean state to resume from.
    Paused(Progress),
}

fn luks(e: sectorcrypt_luks::Error) -> Error {
    Error::Luks(e)
}

fn io_at(dev: &dyn Storage, what: &str, e: io::Error) -> Error {
    Error::Io(io::Error::new(
        e.kind(),
        format!("{what} on {}: {e}", dev.name()),
    ))
}

/// The conversions this engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Plaintext to ciphertext, from the start of the data to its end.
    EncryptForward,
    /// Ciphertext to plaintext, from the end of the data to its start.
    DecryptBackward,
    /// Old key to new key, from the start of the data to its end.
    ReencryptForward,
}

/// Resume (or start, from the init state) the reencryption recorded in the LUKS2 header on
/// `header_dev`, converting the data on `data_dev`. `progress` is called after every step (the
/// last one included); when it returns `false` the run stops at that clean point.
///
/// Errors: [`Error::Unsupported`] for conversions this code does not run yet (see the module
/// docs); [`Error::Luks`] for a wrong passphrase or metadata whose digest does not verify
/// (nothing is written then); [`Error::Io`].
pub fn run(
    header_dev: &dyn Storage,
    data_dev: &dyn Storage,
    passphrase: &[u8],
    options: &Options,
    progress: &mut dyn FnMut(Progress) -> bool,
) -> Result<Outcome, Error> {
    let mut header = Luks2Header::read(header_dev).map_err(luks)?;
    let r = reencrypt::parse(header.metadata())
        .map_err(luks)?
        .ok_or_else(|| Error::Unsupported("the header has no reencryption in progress".into()))?;
    let plan = match (r.keyslot.mode, r.keyslot.direction, &r.backup_moved) {
        (Mode::Encrypt, Direction::Forward, None) => Plan::EncryptForward,
        (Mode::Decrypt, Direction::Backward, None) => Plan::DecryptBackward,
        (Mode::Reencrypt, Direction::Forward, None) => Plan::ReencryptForward,
        _ => {
            return Err(Error::Unsupported(format!(
                "resuming a {} {} reencryption{} (forward encryption and backward decryption \
                 without a data shift run here)",
                r.keyslot.direction.as_str(),
                r.keyslot.mode.as_str(),
                if r.backup_moved.is_some() {
                    " with a data shift"
                } else {
                    ""
                }
            )))
        }
    };
    let Resilience::Checksum { hash, sector_size } = &r.keyslot.resilience else {
        return Err(Error::Unsupported(format!(
            "{} resilience (checksum runs here)",
            r.keyslot.resilience.area_type()
        )));
    };
    let (hash, block) = (Hash::parse(hash).map_err(luks)?, u64::from(*sector_size));
    let keys = reencrypt::unlock_volume_keys(&header, header_dev, passphrase).map_err(luks)?;
    let missing = || Error::Unsupported("a volume key of the reencryption does not open".into());
    let old_key = keys.old.map(|u| u.volume_key);
    let new_key = keys.new.map(|u| u.volume_key);
    // The digest binds the keyslot and backup segments to the keys: metadata edited by someone
    // without them must not steer what is written.
    let (old, new) = match plan {
        Plan::EncryptForward => (None, Some(&new_key.as_ref().ok_or_else(missing)?[..])),
        Plan::DecryptBackward => (Some(&old_key.as_ref().ok_or_else(missing)?[..]), None),
        Plan::ReencryptForward => (
            Some(&old_key.as_ref().ok_or_else(missing)?[..]),
            Some(&new_key.as_ref().ok_or_else(missing)?[..]),
        ),
    };
    if !reencrypt::verify_reencrypt_digest(&header, old, new).map_err(luks)? {
        return Err(Error::Unsupported(
            "the reencryption metadata is invalid (its digest does not verify)".into(),
        ));
    }
    // What a hotzone goes through: decrypt with the old layout's key, encrypt with the new one's.
    let mut passes = Vec::new();
    if let Some(k) = old {
        passes.push((
            layout_cipher(&r.backup_previous, k, block, options)?,
            Direction_::Decrypt,
        ));
    }
    if let Some(k) = new {
        passes.push((
            layout_cipher(&r.backup_final, k, block, options)?,
            Direction_::Encrypt,
        ));
    }
    let base = match plan {
        Plan::DecryptBackward => r.backup_previous.offset,
        _ => r.backup_final.offset,
    };
    let device_len = data_dev
        .len()
        .map_err(|e| io_at(data_dev, "reading the size", e))?;
    let total = device_len.checked_sub(base).ok_or_else(|| {
        Error::Unsupported(format!(
            "the data starts at {base}, past the end of {}",
            data_dev.name()
        ))
    })?;
    if !total.is_multiple_of(block) {
        return Err(Error::Unsupported(format!(
            "a data device of {total} bytes with {block}-byte resilience blocks (the size must \
             be a multiple of it)"
        )));
    }
    let hash_len = hash.digest_len() as u64;
    let max_hot = r.keyslot.area_size / hash_len * block;
    let hotzone = options.hotzone.min(max_hot) / block * block;
    if hotzone == 0 {
        return Err(Error::Unsupported(format!(
            "a hotzone of {} bytes (at least one {block}-byte block)",
            options.hotzone
        )));
    }
    let step = Step {
        header_dev,
        data_dev,
        passes: &passes,
        hash,
        block,
        base,
        area: r.keyslot.area_offset,
        plan,
        total,
    };

    if r.state() == State::Crash {
        let hot = r
            .in_reencryption()
            .ok_or_else(|| Error::Unsupported("a crashed state without a hotzone".into()))?;
        let at = hot.offset - base;
        let len = hot
            .size
            .ok_or_else(|| Error::Unsupported("a hotzone of dynamic size".into()))?;
        step.recover(at, len)?;
        header = step.commit(&header, &r, at, len, false)?;
    }
    loop {
        let r = reencrypt::parse(header.metadata())
            .map_err(luks)?
            .ok_or_else(|| {
                Error::Unsupported("the reencryption vanished from the header".into())
            })?;
        let Some((at, len)) = step.next_hotzone(header.metadata(), &r, hotzone) else {
            let md = reencrypt::finished(header.metadata(), &r).map_err(luks)?;
            let wipe = reencrypt::removed_keyslot_areas(header.metadata(), &md);
            reencrypt::write_metadata(header_dev, &header, &md).map_err(luks)?;
            // Keys and hashes of the finished conversion are of no use to anyone now.
            for (offset, size) in wipe {
                header_dev
                    .write_at(&vec![0u8; size as usize], offset)
                    .map_err(|e| io_at(header_dev, "wiping a keyslot area", e))?;
            }
            header_dev
                .sync()
                .map_err(|e| io_at(header_dev, "wiping keyslot areas", e))?;
            return Ok(Outcome::Finished);
        };
        // Read once: nothing else writes the device while it is converted offline.
        let mut buf = step.read(at, len)?;
        step.protect(&buf)?;
        header = step.commit(&header, &r, at, len, true)?;
        step.convert(&mut buf, at)?;
        header = step.commit(&header, &r, at, len, false)?;
        let r = reencrypt::parse(header.metadata())
            .map_err(luks)?
            .ok_or_else(|| {
                Error::Unsupported("the reencryption vanished from the header".into())
            })?;
        let now = Progress {
            done: step.done(header.metadata(), &r),
            total,
        };
        if !progress(now) && now.done < total {
            return Ok(Outcome::Paused(now));
        }
    }
}

/// The keyed cipher of a crypt layout (`backup-previous` or `backup-final`), checked against the
/// resilience block (which must hold whole sectors).
fn layout_cipher(
    layout: &ReencryptSegment,
    key: &[u8],
    block: u64,
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
    if !block.is_multiple_of(u64::from(*sector_size)) {
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

/// What one hotzone step needs.
struct Step<'a> {
    header_dev: &'a dyn Storage,
    data_dev: &'a dyn Storage,
    /// What a hotzone goes through, in order (a cipher, and whether it encrypts or decrypts).
    passes: &'a [(SectorCipher, Direction_)],
    plan: Plan,
    /// Bytes of data.
    total: u64,
    hash: Hash,
    block: u64,
    /// The data's offset on `data_dev`.
    base: u64,
    /// Where the hashes go on `header_dev`.
    area: u64,
}

impl Step<'_> {
    /// Convert `buf`, the data at `at`, in place.
    fn transform(&self, buf: &mut [u8], at: u64) -> Result<(), Error> {
        for (cipher, direction) in self.passes {
            cipher.process(buf, at / cipher.sector_size() as u64, *direction)?;
        }
        Ok(())
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
        }
    }

    /// The next hotzone (offset from the data's start, length), or `None` when all is done.
    fn next_hotzone(&self, md: &Metadata, r: &Reencryption, hotzone: u64) -> Option<(u64, u64)> {
        let done = self.done(md, r);
        if done >= self.total {
            return None;
        }
        let len = hotzone.min(self.total - done);
        Some(match self.plan {
            Plan::EncryptForward | Plan::ReencryptForward => (done, len),
            // The still-encrypted part is at the start; convert its end.
            Plan::DecryptBackward => (self.total - done - len, len),
        })
    }

    fn read(&self, done: u64, len: u64) -> Result<Vec<u8>, Error> {
        let mut buf = vec![0u8; len as usize];
        self.data_dev
            .read_at(&mut buf, self.base + done)
            .map_err(|e| io_at(self.data_dev, "reading the hotzone", e))?;
        Ok(buf)
    }

    fn hashes(&self, data: &[u8]) -> Vec<u8> {
        let n = self.hash.digest_len();
        let mut out = vec![0u8; data.len() / self.block as usize * n];
        for (block, h) in data.chunks(self.block as usize).zip(out.chunks_mut(n)) {
            self.hash.digest_into(&[block], h);
        }
        out
    }

    /// Step 1: the hash of every block of the hotzone as it is now (`data`), durable before the
    /// header names the hotzone.
    fn protect(&self, data: &[u8]) -> Result<(), Error> {
        let hashes = self.hashes(data);
        self.header_dev
            .write_at(&hashes, self.area)
            .and_then(|()| self.header_dev.sync())
            .map_err(|e| io_at(self.header_dev, "writing the resilience hashes", e))
    }

    /// Step 3: convert the hotzone (`buf`, read from `at`) and write it over itself, durably.
    fn convert(&self, buf: &mut [u8], at: u64) -> Result<(), Error> {
        self.transform(buf, at)?;
        self.data_dev
            .write_at(buf, self.base + at)
            .and_then(|()| self.data_dev.sync())
            .map_err(|e| io_at(self.data_dev, "writing the hotzone", e))
    }

    /// After a crash: convert the blocks of the hotzone that still hash to what they held before.
    fn recover(&self, done: u64, len: u64) -> Result<(), Error> {
        let mut data = self.read(done, len)?;
        let n = self.hash.digest_len();
        let mut stored = vec![0u8; (len / self.block) as usize * n];
        self.header_dev
            .read_at(&mut stored, self.area)
            .map_err(|e| io_at(self.header_dev, "reading the resilience hashes", e))?;
        let now = self.hashes(&data);
        for (i, block) in data.chunks_mut(self.block as usize).enumerate() {
            if now[i * n..(i + 1) * n] != stored[i * n..(i + 1) * n] {
                continue; // already the new contents
            }
            let at = done + i as u64 * self.block;
            self.transform(block, at)?;
            self.data_dev
                .write_at(block, self.base + at)
                .map_err(|e| io_at(self.data_dev, "recovering the hotzone", e))?;
        }
        self.data_dev
            .sync()
            .map_err(|e| io_at(self.data_dev, "recovering the hotzone", e))
    }

    /// Steps 2 and 4: the header naming the hotzone `[at, at + len)` as being written (`hot`), or
    /// as converted.
    fn commit(
        &self,
        header: &Luks2Header,
        r: &Reencryption,
        at: u64,
        len: u64,
        hot: bool,
    ) -> Result<Luks2Header, Error> {
        let md = match self.plan {
            Plan::EncryptForward if hot => {
                reencrypt::encrypt_forward_progress(header.metadata(), r, at, Some(len))
            }
            Plan::EncryptForward => {
                reencrypt::encrypt_forward_progress(header.metadata(), r, at + len, None)
            }
            Plan::DecryptBackward => reencrypt::decrypt_backward_progress(
                header.metadata(),
                r,
                at,
                hot.then_some(len),
                self.total,
            ),
            Plan::ReencryptForward if hot => reencrypt::reencrypt_forward_progress(
                header.metadata(),
                r,
                at,
                Some(len),
                self.total,
            ),
            Plan::ReencryptForward => reencrypt::reencrypt_forward_progress(
                header.metadata(),
                r,
                at + len,
                None,
                self.total,
            ),
        }
        .map_err(luks)?;
        reencrypt::write_metadata(self.header_dev, header, &md).map_err(luks)
    }
}
