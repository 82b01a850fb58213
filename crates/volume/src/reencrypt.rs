//! In-place conversion, driven by LUKS2's own reencryption metadata so that cryptsetup sees (and
//! can resume) the same state (`docs/LUKS2-REENCRYPT.md`).
//!
//! What runs today: **forward encryption with a detached header** and `checksum` resilience (the
//! state `cryptsetup reencrypt --encrypt --header HDR --init-only` leaves, or ours). Each step of
//! one hotzone follows cryptsetup's order, so that a power cut at any write leaves a state that
//! this code or cryptsetup recovers without losing a byte:
//!
//! 1. read the hotzone's plaintext and write one hash per resilience block into the reencrypt
//!    keyslot's area; sync;
//! 2. write the header naming the hotzone `in-reencryption` (both copies, seqid + 1);
//! 3. encrypt the hotzone as one extended request and write it over itself; sync;
//! 4. write the header with the hotzone merged into the encrypted part.
//!
//! After a crash between 2 and 4 the hotzone is part old, part new. Recovery compares every block
//! with its stored hash: a block that still hashes to its old contents is encrypted again, any
//! other block was already written (each block is written whole). When everything is encrypted,
//! the header drops the backup segments, the reencrypt keyslot, its digest and the requirement.

use std::io;

use sectorcrypt_cipher::{CipherSpec, SectorCipher, SectorOptions};
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::reencrypt::{
    self, Direction, Mode, Reencryption, Resilience, SegmentKind, State,
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

/// Resume (or start, from the init state) the reencryption recorded in the LUKS2 header on
/// `header_dev`, converting the data on `data_dev`. `progress` is called after every step (the
/// last one included); when it returns `false` the run stops at that clean point.
///
/// Errors: [`Error::Unsupported`] for modes this code does not run yet (see the module docs);
/// [`Error::Luks`] for a wrong passphrase or metadata whose digest does not verify (nothing is
/// written then); [`Error::Io`].
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
    let (hash, block) = match (&r.keyslot.resilience, r.keyslot.mode, r.keyslot.direction) {
        (Resilience::Checksum { hash, sector_size }, Mode::Encrypt, Direction::Forward)
            if r.backup_moved.is_none() =>
        {
            (Hash::parse(hash).map_err(luks)?, u64::from(*sector_size))
        }
        _ => {
            return Err(Error::Unsupported(format!(
                "resuming a {} {} reencryption with {} resilience (only forward encryption with \
                 checksum resilience runs here yet)",
                r.keyslot.direction.as_str(),
                r.keyslot.mode.as_str(),
                r.keyslot.resilience.area_type()
            )))
        }
    };
    let keys = reencrypt::unlock_volume_keys(&header, header_dev, passphrase).map_err(luks)?;
    let new_key = keys
        .new
        .ok_or_else(|| Error::Unsupported("an encryption without a new volume key".into()))?
        .volume_key;
    // The digest binds the keyslot and backup segments to the keys: metadata edited by someone
    // without them must not steer what is written.
    if !reencrypt::verify_reencrypt_digest(&header, None, Some(&new_key)).map_err(luks)? {
        return Err(Error::Unsupported(
            "the reencryption metadata is invalid (its digest does not verify)".into(),
        ));
    }
    let SegmentKind::Crypt {
        iv_tweak,
        encryption,
        sector_size,
    } = &r.backup_final.kind
    else {
        return Err(Error::Unsupported(
            "a final layout without encryption".into(),
        ));
    };
    let base = r.backup_final.offset;
    let device_len = data_dev
        .len()
        .map_err(|e| io_at(data_dev, "reading the size", e))?;
    let total = device_len.checked_sub(base).ok_or_else(|| {
        Error::Unsupported(format!(
            "the data starts at {base}, past the end of {}",
            data_dev.name()
        ))
    })?;
    let ss = *sector_size as u64;
    if block % ss != 0 || !total.is_multiple_of(block) {
        return Err(Error::Unsupported(format!(
            "a data device of {total} bytes with {block}-byte resilience blocks and \
             {ss}-byte sectors (the size must be a multiple of both)"
        )));
    }
    let cipher = SectorCipher::new(
        CipherSpec::parse(encryption)?,
        &new_key,
        &SectorOptions {
            sector_size: ss as usize,
            iv_offset: *iv_tweak,
            threads: options.threads.max(1),
            ..Default::default()
        },
    )?;
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
        cipher: &cipher,
        hash,
        block,
        base,
        area: r.keyslot.area_offset,
    };

    if r.state() == State::Crash {
        let hot = r
            .in_reencryption()
            .ok_or_else(|| Error::Unsupported("a crashed state without a hotzone".into()))?;
        let done = hot.offset - base;
        let len = hot
            .size
            .ok_or_else(|| Error::Unsupported("a hotzone of dynamic size".into()))?;
        step.recover(done, len)?;
        header = step.commit(&header, &r, done + len, None)?;
    }
    loop {
        let r = reencrypt::parse(header.metadata())
            .map_err(luks)?
            .ok_or_else(|| {
                Error::Unsupported("the reencryption vanished from the header".into())
            })?;
        let done = encrypted_prefix(&r, base);
        if done >= total {
            let md = reencrypt::finished(header.metadata(), &r).map_err(luks)?;
            reencrypt::write_metadata(header_dev, &header, &md).map_err(luks)?;
            return Ok(Outcome::Finished);
        }
        let len = hotzone.min(total - done);
        // Read once: nothing else writes the device while it is converted offline.
        let mut buf = step.read(done, len)?;
        step.protect(&buf)?;
        header = step.commit(&header, &r, done, Some(len))?;
        step.convert(&mut buf, done)?;
        header = step.commit(&header, &r, done + len, None)?;
        let now = Progress {
            done: done + len,
            total,
        };
        if !progress(now) && now.done < total {
            return Ok(Outcome::Paused(now));
        }
    }
}

/// Bytes already encrypted from the start of the data: the size of a leading crypt segment.
fn encrypted_prefix(r: &Reencryption, base: u64) -> u64 {
    match r.segments.first() {
        Some(s) if matches!(s.kind, SegmentKind::Crypt { .. }) && s.offset == base => {
            s.size.unwrap_or(0)
        }
        _ => 0,
    }
}

/// What one hotzone step needs.
struct Step<'a> {
    header_dev: &'a dyn Storage,
    data_dev: &'a dyn Storage,
    cipher: &'a SectorCipher,
    hash: Hash,
    block: u64,
    /// The data's offset on `data_dev`.
    base: u64,
    /// Where the hashes go on `header_dev`.
    area: u64,
}

impl Step<'_> {
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

    /// Step 3: encrypt the hotzone (`buf`, read from `done`) and write it over itself, durably.
    fn convert(&self, buf: &mut [u8], done: u64) -> Result<(), Error> {
        self.cipher
            .encrypt(buf, done / self.cipher.sector_size() as u64)?;
        self.data_dev
            .write_at(buf, self.base + done)
            .and_then(|()| self.data_dev.sync())
            .map_err(|e| io_at(self.data_dev, "writing the hotzone", e))
    }

    /// After a crash: encrypt the blocks of the hotzone that still hash to what they held before.
    fn recover(&self, done: u64, len: u64) -> Result<(), Error> {
        let mut data = self.read(done, len)?;
        let n = self.hash.digest_len();
        let mut stored = vec![0u8; (len / self.block) as usize * n];
        self.header_dev
            .read_at(&mut stored, self.area)
            .map_err(|e| io_at(self.header_dev, "reading the resilience hashes", e))?;
        let now = self.hashes(&data);
        let ss = self.cipher.sector_size() as u64;
        for (i, block) in data.chunks_mut(self.block as usize).enumerate() {
            if now[i * n..(i + 1) * n] != stored[i * n..(i + 1) * n] {
                continue; // already the new contents
            }
            let at = done + i as u64 * self.block;
            self.cipher.encrypt(block, at / ss)?;
            self.data_dev
                .write_at(block, self.base + at)
                .map_err(|e| io_at(self.data_dev, "recovering the hotzone", e))?;
        }
        self.data_dev
            .sync()
            .map_err(|e| io_at(self.data_dev, "recovering the hotzone", e))
    }

    /// Steps 2 and 4: the header saying `done` bytes are encrypted and `hot` bytes after them are
    /// being written.
    fn commit(
        &self,
        header: &Luks2Header,
        r: &Reencryption,
        done: u64,
        hot: Option<u64>,
    ) -> Result<Luks2Header, Error> {
        let md =
            reencrypt::encrypt_forward_progress(header.metadata(), r, done, hot).map_err(luks)?;
        reencrypt::write_metadata(self.header_dev, header, &md).map_err(luks)
    }
}
