//! Writing LUKS1: `luksFormat`, `luksAddKey`, `luksKillSlot`, `luksChangeKey`,
//! `luksHeaderBackup` and `luksHeaderRestore`, laid out as cryptsetup 2.6 lays them out
//! (`lib/luks1/keymanage.c`): keyslot areas from byte 4096 on, each rounded up to 4096 bytes, the
//! payload at the next 1 MiB boundary, a master-key digest costing 125 ms of PBKDF2.
//!
//! LUKS1 has a single header copy, so crash safety comes from the order of writes alone: key
//! material only ever goes to areas the header on disk does not reference, and the header itself
//! (592 bytes, inside one sector) is the single switch from the old set of passphrases to the new
//! one. A power cut after any write therefore leaves a volume that opens with exactly the old or
//! exactly the new passphrases, always with the same volume key. cryptsetup orders `luksKillSlot`
//! the other way round (wipe, then header) and `luksChangeKey` as add-then-kill; the orders here
//! are the safe ones and produce the same final bytes apart from random salts and wipes.

use rand::RngCore;
use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;

use super::{
    no_such_slot, Header, Keyslot, HEADER_SIZE, KEYSLOTS, SALT_SIZE, SECTOR_SIZE, STRIPES,
};
use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::{calibrate_pbkdf2, Kdf};
use crate::keyslot::digest_matches;
use crate::Unlocked;

/// cryptsetup's `LUKS_ALIGN_KEYSLOTS`: the first keyslot starts here and every keyslot area is
/// rounded up to it.
const KEYSLOT_ALIGN: u64 = 4096;
/// cryptsetup's default data alignment (`DEFAULT_DISK_ALIGNMENT`): the payload starts at the
/// first 1 MiB boundary after the keyslots.
const PAYLOAD_ALIGN: u64 = 1 << 20;
/// cryptsetup's `LUKS_SLOT_ITERATIONS_MIN` and `LUKS_MKD_ITERATIONS_MIN`.
const MIN_ITERATIONS: u32 = 1000;
/// cryptsetup's `LUKS_MKD_ITERATIONS_MS`: the master-key digest costs this much PBKDF2 time.
const DIGEST_ITERATION_MS: u32 = 125;
/// Zeroes and random data are written in pieces of this size, so that formatting needs no more
/// memory than this.
const WIPE_CHUNK: usize = 1 << 20;

/// What `luksFormat --type luks1` takes. [`Default`] gives cryptsetup's defaults:
/// `aes-xts-plain64`, a 512-bit key, sha256, 2000 ms of PBKDF2, keyslot 0, a random UUID and
/// volume key, the payload on the same device.
#[derive(Clone)]
pub struct FormatParams {
    /// The dm-crypt cipher specification, `cipher-mode` (e.g. `aes-xts-plain64`,
    /// `aes-cbc-essiv:sha256`).
    pub cipher: String,
    /// Volume key size in bits (the whole key: 512 for AES-256 in XTS, whose key has two halves).
    pub key_bits: usize,
    /// Hash for PBKDF2 (keyslots and digest) and the AF splitter.
    pub hash: Hash,
    /// A forced PBKDF2 iteration count for the keyslot (`--pbkdf-force-iterations`, raised to
    /// cryptsetup's minimum of 1000); `None` calibrates to `iter_time_ms`.
    pub iterations: Option<u32>,
    /// PBKDF2 time for the keyslot when `iterations` is `None` (`--iter-time`); with forced
    /// iterations it still scales the digest iterations, as in cryptsetup.
    pub iter_time_ms: u32,
    /// The UUID (`--uuid`), in any letter case; `None` generates a random (version 4) one.
    pub uuid: Option<String>,
    /// The keyslot for the passphrase (`--key-slot`); `None` is slot 0.
    pub keyslot: Option<usize>,
    /// The volume key (`--volume-key-file`); `None` draws a random one.
    pub volume_key: Option<SecretBytes>,
    /// The header lives on its own device (`--header`): the payload offset is 0 and the device
    /// needs room for the header and keyslots only.
    pub detached_header: bool,
    /// The payload starts at the first multiple of this many bytes after the keyslots
    /// (cryptsetup's `--align-payload`, in bytes; a multiple of 512): 1 MiB by default, a
    /// device's optimal I/O size where it is larger (an RBD image's object size).
    pub payload_align: u64,
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            cipher: "aes-xts-plain64".into(),
            key_bits: 512,
            hash: Hash::Sha256,
            iterations: None,
            iter_time_ms: 2000,
            uuid: None,
            keyslot: None,
            volume_key: None,
            detached_header: false,
            payload_align: PAYLOAD_ALIGN,
        }
    }
}

impl std::fmt::Debug for FormatParams {
    // Hand-written so that a volume key never ends up in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FormatParams")
            .field("cipher", &self.cipher)
            .field("key_bits", &self.key_bits)
            .field("hash", &self.hash)
            .field("iterations", &self.iterations)
            .field("iter_time_ms", &self.iter_time_ms)
            .field("uuid", &self.uuid)
            .field("keyslot", &self.keyslot)
            .field("volume_key", &self.volume_key.as_ref().map(|_| "<given>"))
            .field("detached_header", &self.detached_header)
            .finish()
    }
}

fn io_error(dev: &dyn Storage) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        device: dev.name(),
        source,
    }
}

fn write_at(dev: &dyn Storage, bytes: &[u8], offset: u64) -> Result<(), Error> {
    dev.write_at(bytes, offset).map_err(io_error(dev))
}

fn sync(dev: &dyn Storage) -> Result<(), Error> {
    dev.sync().map_err(io_error(dev))
}

fn read_at(dev: &dyn Storage, len: usize, offset: u64) -> Result<SecretBytes, Error> {
    let mut buf = SecretBytes::zeroed(len);
    dev.read_at(&mut buf, offset).map_err(io_error(dev))?;
    Ok(buf)
}

fn device_len(dev: &dyn Storage) -> Result<u64, Error> {
    dev.len().map_err(io_error(dev))
}

fn random_bytes(buf: &mut [u8]) {
    rand::rngs::OsRng.fill_bytes(buf);
}

fn random_salt() -> [u8; SALT_SIZE] {
    let mut salt = [0u8; SALT_SIZE];
    random_bytes(&mut salt);
    salt
}

/// Overwrite `len` bytes at `offset` with random data, piece by piece.
fn wipe_random(dev: &dyn Storage, offset: u64, len: u64) -> Result<(), Error> {
    let mut buf = SecretBytes::zeroed(WIPE_CHUNK);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(WIPE_CHUNK as u64) as usize;
        random_bytes(&mut buf[..n]);
        write_at(dev, &buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Overwrite the first `len` bytes with zeroes, piece by piece.
fn wipe_zero(dev: &dyn Storage, len: u64) -> Result<(), Error> {
    let zeroes = vec![0u8; WIPE_CHUNK];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(WIPE_CHUNK as u64) as usize;
        write_at(dev, &zeroes[..n], done)?;
        done += n as u64;
    }
    Ok(())
}

/// The keyslot's PBKDF2 iterations: forced (at least cryptsetup's 1000) or calibrated for a
/// `key_bytes` output, as cryptsetup's benchmark does.
fn keyslot_iterations(
    hash: Hash,
    key_bytes: usize,
    iterations: Option<u32>,
    iter_time_ms: u32,
) -> Result<u32, Error> {
    let n = match iterations {
        Some(n) => n,
        None => calibrate_pbkdf2(hash, key_bytes, iter_time_ms)?,
    };
    Ok(n.max(MIN_ITERATIONS))
}

/// The master-key digest iterations as `LUKS_generate_phdr` computes them: the keyslot's rate
/// (iterations per `iter_time_ms`) times 125 ms, at least 1000. With forced iterations that is
/// `forced * 125 / iter_time_ms` (so 1000 forced iterations give the minimum 1000).
fn digest_iterations(
    hash: Hash,
    key_bytes: usize,
    iterations: Option<u32>,
    iter_time_ms: u32,
) -> Result<u32, Error> {
    let n = match (iterations, iter_time_ms) {
        (_, 0) => MIN_ITERATIONS,
        (Some(forced), ms) => {
            let scaled = u64::from(forced) * u64::from(DIGEST_ITERATION_MS) / u64::from(ms);
            u32::try_from(scaled).unwrap_or(u32::MAX)
        }
        (None, _) => calibrate_pbkdf2(hash, key_bytes, DIGEST_ITERATION_MS)?,
    };
    Ok(n.max(MIN_ITERATIONS))
}

fn too_small(dev: &dyn Storage, len: u64, needed: u64) -> Error {
    Error::Unsupported(format!(
        "formatting {} ({len} bytes) as LUKS1: this key size needs at least {needed} bytes",
        dev.name()
    ))
}

/// Format `dev` as LUKS1 with one keyslot holding `passphrase`, as `cryptsetup luksFormat --type
/// luks1` does: zeroes up to the payload offset (the first 4096 bytes for a detached header),
/// random data in every keyslot area, the keyslot, then the header. Returns the header written
/// and the volume key with its slot.
///
/// The device is not grown (cryptsetup grows header files): it must hold the header and all
/// eight keyslot areas, and unless the header is detached, reach the payload offset.
///
/// Errors: [`Error::Unsupported`] for a cipher, key size, UUID or keyslot cryptsetup would refuse,
/// a given volume key of the wrong length, or a device too small; [`Error::Io`].
pub fn format(
    dev: &dyn Storage,
    params: &FormatParams,
    passphrase: &[u8],
) -> Result<(Header, Unlocked), Error> {
    let spec = CipherSpec::parse(&params.cipher)?;
    // cryptsetup splits at the first dash: `aes` and `xts-plain64`.
    let Some((cipher_name, cipher_mode)) = params.cipher.split_once('-') else {
        return Err(Error::Unsupported(format!(
            "the cipher '{}' without a mode",
            params.cipher
        )));
    };
    if cipher_name.len() >= super::STRING_LEN || cipher_mode.len() >= super::STRING_LEN {
        return Err(Error::Unsupported(format!(
            "the cipher '{}': LUKS1 stores at most 31 characters of name and of mode",
            params.cipher
        )));
    }
    if params.key_bits == 0 || !params.key_bits.is_multiple_of(8) {
        return Err(Error::Unsupported(format!(
            "a key of {} bits (not whole bytes)",
            params.key_bits
        )));
    }
    let key_bytes = params.key_bits / 8;
    spec.check_key_len(key_bytes)?;
    let slot = params.keyslot.unwrap_or(0);
    if slot >= KEYSLOTS {
        return Err(no_such_slot(slot));
    }
    let volume_key = match &params.volume_key {
        Some(vk) if vk.len() != key_bytes => {
            return Err(Error::Unsupported(format!(
                "a volume key of {} bytes for a {}-bit key size",
                vk.len(),
                params.key_bits
            )))
        }
        Some(vk) => SecretBytes::from_slice(vk),
        None => {
            let mut vk = SecretBytes::zeroed(key_bytes);
            random_bytes(&mut vk);
            vk
        }
    };
    let uuid = match &params.uuid {
        Some(u) => crate::uuid::normalize(u)?,
        None => crate::uuid::random(),
    };

    // LUKS_generate_phdr's layout: 4096-byte-aligned areas from sector 8, the payload at the next
    // 1 MiB boundary (0 for a detached header).
    let key_bytes_u32 = key_bytes as u32;
    let area_sectors = (u64::from(key_bytes_u32) * u64::from(STRIPES)).div_ceil(SECTOR_SIZE);
    let align = KEYSLOT_ALIGN / SECTOR_SIZE;
    let mut next = align;
    let mut offsets = [0u32; KEYSLOTS];
    for o in offsets.iter_mut() {
        *o = u32::try_from(next)
            .map_err(|_| Error::Unsupported("a key too large for LUKS1".into()))?;
        next = (next + area_sectors).div_ceil(align) * align;
    }
    let payload_offset = if params.detached_header {
        0
    } else {
        if params.payload_align == 0 || !params.payload_align.is_multiple_of(SECTOR_SIZE) {
            return Err(Error::Unsupported(format!(
                "a payload alignment of {} bytes, not a positive multiple of 512",
                params.payload_align
            )));
        }
        let align = params.payload_align / SECTOR_SIZE;
        let p = next.div_ceil(align) * align;
        u32::try_from(p).map_err(|_| Error::Unsupported("a key too large for LUKS1".into()))?
    };
    let keyslots_end = (u64::from(offsets[KEYSLOTS - 1]) + area_sectors) * SECTOR_SIZE;
    let needed = keyslots_end.max(u64::from(payload_offset) * SECTOR_SIZE);
    let len = device_len(dev)?;
    if len < needed {
        return Err(too_small(dev, len, needed));
    }

    let hash = params.hash;
    let slot_iterations =
        keyslot_iterations(hash, key_bytes, params.iterations, params.iter_time_ms)?;
    let mk_digest_iterations =
        digest_iterations(hash, key_bytes, params.iterations, params.iter_time_ms)?;
    let mk_digest_salt = random_salt();
    let digest = Kdf::Pbkdf2 {
        hash,
        iterations: mk_digest_iterations,
    }
    .derive(&volume_key, &mk_digest_salt, super::DIGEST_SIZE)?;
    let mut mk_digest = [0u8; super::DIGEST_SIZE];
    mk_digest.copy_from_slice(&digest);

    let mut header = Header {
        cipher_name: cipher_name.to_string(),
        cipher_mode: cipher_mode.to_string(),
        hash_spec: hash.name().to_string(),
        payload_offset,
        key_bytes: key_bytes_u32,
        mk_digest,
        mk_digest_salt,
        mk_digest_iterations,
        uuid,
        keyslots: offsets.map(|key_material_offset| Keyslot {
            active: false,
            iterations: 0,
            salt: [0; SALT_SIZE],
            key_material_offset,
            stripes: STRIPES,
        }),
    };
    header.validate(len)?;

    // LUKS_wipe_header_areas: zeroes over everything before the payload (old signatures go), then
    // random data in every keyslot area (an unused slot looks like a used one). The old headers
    // go first, alone and synced (see `erase_old_headers`).
    let zero_len = if payload_offset == 0 {
        KEYSLOT_ALIGN
    } else {
        header.payload_offset_bytes()
    };
    crate::luks2::write::erase_old_headers(dev, zero_len)?;
    wipe_zero(dev, zero_len)?;
    for k in &header.keyslots {
        wipe_random(
            dev,
            u64::from(k.key_material_offset) * SECTOR_SIZE,
            area_sectors * SECTOR_SIZE,
        )?;
    }
    sync(dev)?;
    header.install_keyslot(dev, &volume_key, passphrase, slot, slot_iterations, None)?;
    Ok((header, Unlocked { slot, volume_key }))
}

impl Header {
    /// Write this header to offset 0 of `dev` and sync. The header is validated against the
    /// device first, so nothing cryptsetup would refuse to load is ever written.
    ///
    /// Errors: [`Error::Corrupt`] / [`Error::Unsupported`] if the header is not valid for `dev`;
    /// [`Error::Io`].
    pub fn write(&self, dev: &dyn Storage) -> Result<(), Error> {
        self.validate(device_len(dev)?)?;
        write_at(dev, &self.to_bytes(), 0)?;
        sync(dev)
    }

    /// The header on `dev` must be this one: every update below relies on knowing which areas
    /// the header on disk references.
    fn check_on_disk(&self, dev: &dyn Storage) -> Result<(), Error> {
        if Header::read(dev)? != *self {
            return Err(Error::Unsupported(
                "changing a LUKS1 header that differs from the one on the device (read it again)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Keyslot `slot` must exist and be in use; `doing` (e.g. "removing") names the refused
    /// action.
    fn check_in_use(&self, slot: usize, doing: &str) -> Result<(), Error> {
        if slot >= KEYSLOTS {
            return Err(no_such_slot(slot));
        }
        if !self.keyslots[slot].active {
            return Err(Error::Unsupported(format!(
                "{doing} keyslot {slot}, which is not in use"
            )));
        }
        Ok(())
    }

    /// What adding a keyslot for `volume_key` needs: this header on `dev` and the volume's key;
    /// returns the PBKDF2 iterations for the new keyslot (`iterations`, or calibrated to
    /// `iter_time_ms`).
    fn check_new_keyslot(
        &self,
        dev: &dyn Storage,
        volume_key: &[u8],
        iterations: Option<u32>,
        iter_time_ms: u32,
    ) -> Result<u32, Error> {
        self.check_on_disk(dev)?;
        self.check_volume_key(volume_key)?;
        keyslot_iterations(
            self.hash()?,
            self.key_bytes as usize,
            iterations,
            iter_time_ms,
        )
    }

    /// The volume key must be this volume's, or the new keyslot would never open.
    fn check_volume_key(&self, volume_key: &[u8]) -> Result<(), Error> {
        let matches = volume_key.len() == self.key_bytes as usize
            && digest_matches(
                volume_key,
                self.hash()?,
                self.mk_digest_iterations,
                &self.mk_digest_salt,
                &self.mk_digest,
            )?;
        if matches {
            Ok(())
        } else {
            Err(Error::WrongPassphrase)
        }
    }

    /// The first disabled keyslot (cryptsetup's `LUKS_keyslot_find_empty`).
    fn free_keyslot(&self) -> Option<usize> {
        self.keyslots.iter().position(|k| !k.active)
    }

    /// Seal `volume_key` with `passphrase` into disabled keyslot `slot`: the material goes to the
    /// slot's area (unreferenced by the header on disk) and is synced, then one header write
    /// enables the slot (and, for a change, disables `retire` in the same write) and is synced.
    /// `self` is updated only once the header is on disk.
    fn install_keyslot(
        &mut self,
        dev: &dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: usize,
        iterations: u32,
        retire: Option<usize>,
    ) -> Result<(), Error> {
        let area = self.keyslot_area(slot)?;
        let salt = random_salt();
        let kdf = Kdf::Pbkdf2 {
            hash: self.hash()?,
            iterations,
        };
        let sealed = area.seal(&kdf, &salt, passphrase, volume_key)?;
        write_at(dev, &sealed, area.offset)?;
        sync(dev)?;
        let mut next = self.clone();
        next.keyslots[slot].active = true;
        next.keyslots[slot].iterations = iterations;
        next.keyslots[slot].salt = salt;
        if let Some(old) = retire {
            next.disable(old);
        }
        next.write(dev)?;
        *self = next;
        Ok(())
    }

    /// Mark `slot` disabled the way `LUKS_del_key` leaves it: salt zeroed, iterations 0.
    fn disable(&mut self, slot: usize) {
        let k = &mut self.keyslots[slot];
        k.active = false;
        k.iterations = 0;
        k.salt = [0; SALT_SIZE];
    }

    /// Overwrite keyslot `slot`'s area with random data and sync. One pass: on files and flash,
    /// more passes do not reach older copies anyway, and random data makes the area look like
    /// any unused one.
    fn wipe_keyslot(&self, dev: &dyn Storage, slot: usize) -> Result<(), Error> {
        let area = self.keyslot_area(slot)?;
        wipe_random(dev, area.offset, area.disk_len()? as u64)?;
        sync(dev)
    }

    /// Add `passphrase` for `volume_key` in keyslot `slot` (or the first free one), as
    /// `cryptsetup luksAddKey`: PBKDF2 iterations forced (at least 1000) or calibrated to
    /// `iter_time_ms`. Crash safe: the material is written and synced before the header that
    /// enables it. Returns the keyslot used; `self` is the header on disk afterwards.
    ///
    /// Errors: [`Error::WrongPassphrase`] if `volume_key` does not match the header's digest;
    /// [`Error::Unsupported`] for a slot number above 7, a slot in use, no free slot, or a header
    /// that differs from the one on `dev`; [`Error::Io`].
    pub fn add_keyslot(
        &mut self,
        dev: &dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        iterations: Option<u32>,
        iter_time_ms: u32,
    ) -> Result<usize, Error> {
        let slot = match slot {
            Some(s) if s >= KEYSLOTS => return Err(no_such_slot(s)),
            Some(s) if self.keyslots[s].active => {
                return Err(Error::Unsupported(format!(
                    "adding a key to keyslot {s}, which is in use (remove it first)"
                )))
            }
            Some(s) => s,
            None => self.free_keyslot().ok_or_else(|| {
                Error::Unsupported("adding a key: all eight LUKS1 keyslots are in use".into())
            })?,
        };
        let iterations = self.check_new_keyslot(dev, volume_key, iterations, iter_time_ms)?;
        self.install_keyslot(dev, volume_key, passphrase, slot, iterations, None)?;
        Ok(slot)
    }

    /// Remove keyslot `slot`, as `cryptsetup luksKillSlot`, in the crash-safe order: the header
    /// that disables it is written and synced first, then the key material is overwritten with
    /// random data and synced. Killing the last keyslot is allowed (the caller asks first).
    ///
    /// Errors: [`Error::Unsupported`] for a slot number above 7, a disabled slot, or a header that
    /// differs from the one on `dev`; [`Error::Io`].
    pub fn kill_keyslot(&mut self, dev: &dyn Storage, slot: usize) -> Result<(), Error> {
        self.check_in_use(slot, "removing")?;
        self.check_on_disk(dev)?;
        let mut next = self.clone();
        next.disable(slot);
        next.write(dev)?;
        *self = next;
        self.wipe_keyslot(dev, slot)
    }

    /// Replace the passphrase of keyslot `old_slot` with `new_passphrase`, as `cryptsetup
    /// luksChangeKey`: the new key goes to the first free keyslot and `old_slot` is removed.
    /// Crash safe when a slot is free: the new material is synced first, then ONE header write
    /// enables the new slot and disables the old one (so no moment has both or neither), then
    /// the old material is wiped. With all eight slots in use the key is rewritten in place, as
    /// cryptsetup does; that path is not crash safe (a cut between the wipe and the new header
    /// leaves the slot disabled). Returns the keyslot now holding `new_passphrase`.
    ///
    /// Errors: as [`Header::add_keyslot`], and [`Error::Unsupported`] if `old_slot` is not in use.
    pub fn change_keyslot(
        &mut self,
        dev: &dyn Storage,
        old_slot: usize,
        volume_key: &[u8],
        new_passphrase: &[u8],
        iterations: Option<u32>,
        iter_time_ms: u32,
    ) -> Result<usize, Error> {
        self.check_in_use(old_slot, "changing")?;
        let iterations = self.check_new_keyslot(dev, volume_key, iterations, iter_time_ms)?;
        match self.free_keyslot() {
            Some(new_slot) => {
                self.install_keyslot(
                    dev,
                    volume_key,
                    new_passphrase,
                    new_slot,
                    iterations,
                    Some(old_slot),
                )?;
                self.wipe_keyslot(dev, old_slot)?;
                Ok(new_slot)
            }
            None => {
                self.kill_keyslot(dev, old_slot)?;
                self.install_keyslot(dev, volume_key, new_passphrase, old_slot, iterations, None)?;
                Ok(old_slot)
            }
        }
    }

    /// Bytes from the start of the device to the end of the last keyslot area (cryptsetup's
    /// `LUKS_device_sectors`).
    fn keyslots_end(&self) -> u64 {
        let last = self
            .keyslots
            .iter()
            .map(|k| k.key_material_offset)
            .max()
            .unwrap_or(0);
        (u64::from(last) + self.keyslot_sectors()) * SECTOR_SIZE
    }

    /// The header backup `cryptsetup luksHeaderBackup` writes: the header and every keyslot area
    /// (the device up to the end of the last area, not the payload offset), zero-padded to a
    /// multiple of 4096 bytes, with the bytes between the header and a first keyslot at 4096
    /// zeroed so that no old signature survives in the backup.
    ///
    /// Errors: as [`Header::read`]; [`Error::Io`].
    pub fn backup(dev: &dyn Storage) -> Result<Vec<u8>, Error> {
        let header = Header::read(dev)?;
        let end = header.keyslots_end();
        let size = usize::try_from(end)
            .map_err(|_| Error::Corrupt("the keyslot areas are too large to back up".into()))?;
        let mut out = vec![0u8; size.div_ceil(KEYSLOT_ALIGN as usize) * KEYSLOT_ALIGN as usize];
        dev.read_at(&mut out[..size], 0).map_err(io_error(dev))?;
        if u64::from(header.keyslots[0].key_material_offset) * SECTOR_SIZE == KEYSLOT_ALIGN {
            out[HEADER_SIZE..KEYSLOT_ALIGN as usize].fill(0);
        }
        Ok(out)
    }

    /// Restore a header backup (from [`Header::backup`] or `cryptsetup luksHeaderBackup`) onto
    /// `dev`, as `cryptsetup luksHeaderRestore`: the backup is validated fully before anything
    /// is written, and if `dev` holds a LUKS1 header its payload offset and key size must match
    /// the backup's. Then the device up to the end of the backup's last keyslot area becomes the
    /// backup's bytes.
    ///
    /// Crash safe: keyslot areas the backup enables are written before the header and only where
    /// the header on disk references nothing; an enabled area that the old header still uses is
    /// first staged in an area neither header uses, with a header pointing there, and moved into
    /// place after; everything else is written after the header. A cut at any write leaves
    /// either the old or the backup's passphrases. Returns the restored header.
    ///
    /// Errors: [`Error::NotLuks`] / [`Error::Corrupt`] / [`Error::Unsupported`] for a backup that
    /// is not a valid LUKS1 header with all its keyslot areas; [`Error::Unsupported`] if the
    /// device is too small, its header's payload offset or key size differ, or no spare keyslot
    /// area exists for staging; [`Error::Io`].
    pub fn restore(dev: &dyn Storage, backup: &dyn Storage) -> Result<Header, Error> {
        let new = Header::read(backup)?;
        let size = new.keyslots_end();
        if size < KEYSLOT_ALIGN {
            return Err(Error::Corrupt(
                "the backup's keyslot areas end before byte 4096".into(),
            ));
        }
        let image = read_at(backup, size as usize, 0)?;
        let len = device_len(dev)?;
        if len < size {
            return Err(Error::Unsupported(format!(
                "restoring a {size}-byte header backup onto {} ({len} bytes)",
                dev.name()
            )));
        }
        new.validate(len)?;
        // Only a header sectorcrypt can read is protected; anything else (no LUKS, damage) has no
        // passphrases to keep.
        let old = match Header::read(dev) {
            Ok(h) => Some(h),
            Err(Error::Io { device, source }) => return Err(Error::Io { device, source }),
            Err(_) => None,
        };
        if let Some(old) = &old {
            if old.payload_offset != new.payload_offset || old.key_bytes != new.key_bytes {
                return Err(Error::Unsupported(
                    "restoring a header backup whose payload offset or key size differs from \
                     the device's"
                        .into(),
                ));
            }
        }
        Restore::plan(dev, &new, &image, old.as_ref())?.run(dev, &image)?;
        Header::read(dev)
    }
}

/// A byte range on the device.
type Span = (u64, u64);

fn overlaps(a: Span, spans: &[Span]) -> bool {
    spans.iter().any(|&(s, e)| a.0 < e && s < a.1)
}

/// The writes of a crash-safe restore, in order.
struct Restore {
    /// Enabled keyslot areas of the backup that the old header does not reference: written
    /// before the switch.
    before: Vec<Span>,
    /// Enabled areas the old header does reference, each with the spare area it is staged in:
    /// (where it belongs, staging offset).
    staged: Vec<(Span, u64)>,
    /// The header written first: the backup's, with staged slots pointing at their spares.
    switch: Header,
    /// The backup's header, if staging made `switch` differ from it.
    final_header: Option<Header>,
    /// Everything else (padding, disabled areas, staging areas): written after the last header.
    after: Vec<Span>,
}

impl Restore {
    fn plan(
        dev: &dyn Storage,
        new: &Header,
        image: &[u8],
        old: Option<&Header>,
    ) -> Result<Restore, Error> {
        let area_len = new.keyslot_sectors() * SECTOR_SIZE;
        let area = |h: &Header, i: usize| {
            let start = u64::from(h.keyslots[i].key_material_offset) * SECTOR_SIZE;
            (start, start + area_len)
        };
        // What the old header needs intact until the switch.
        let old_refs: Vec<Span> = match old {
            Some(o) => {
                let mut v = vec![(0, HEADER_SIZE as u64)];
                v.extend(
                    (0..KEYSLOTS)
                        .filter(|&i| o.keyslots[i].active)
                        .map(|i| area(o, i)),
                );
                v
            }
            None => Vec::new(),
        };
        let differs = |span: Span| -> Result<bool, Error> {
            let on_disk = read_at(dev, (span.1 - span.0) as usize, span.0)?;
            Ok(on_disk[..] != image[span.0 as usize..span.1 as usize])
        };
        let mut before = Vec::new();
        let mut conflicts = Vec::new();
        for i in (0..KEYSLOTS).filter(|&i| new.keyslots[i].active) {
            let span = area(new, i);
            if !differs(span)? {
                continue;
            }
            if overlaps(span, &old_refs) {
                conflicts.push(i);
            } else {
                before.push(span);
            }
        }
        let mut switch = new.clone();
        let mut staged = Vec::new();
        let mut spares = (0..KEYSLOTS)
            .filter(|&j| !new.keyslots[j].active && !overlaps(area(new, j), &old_refs));
        for i in conflicts {
            let Some(j) = spares.next() else {
                return Err(Error::Unsupported(
                    "restoring this backup crash-safely needs a keyslot that neither the device \
                     nor the backup uses (remove a keyslot first)"
                        .into(),
                ));
            };
            // Swapping the two offsets keeps every area apart: the staged slot points at the
            // spare, the disabled spare slot at the area being replaced.
            let (a, b) = (
                switch.keyslots[i].key_material_offset,
                switch.keyslots[j].key_material_offset,
            );
            switch.keyslots[i].key_material_offset = b;
            switch.keyslots[j].key_material_offset = a;
            staged.push((area(new, i), area(new, j).0));
        }
        let final_header = (!staged.is_empty()).then(|| new.clone());
        // The rest of the backup: from the end of the header to the end of the last area, minus
        // the enabled areas (already in place by then).
        let enabled: Vec<Span> = (0..KEYSLOTS)
            .filter(|&i| new.keyslots[i].active)
            .map(|i| area(new, i))
            .collect();
        let mut after = Vec::new();
        let mut cuts: Vec<u64> = vec![HEADER_SIZE as u64, image.len() as u64];
        for &(s, e) in &enabled {
            cuts.extend([s, e]);
        }
        for i in 0..KEYSLOTS {
            let (s, e) = area(new, i);
            cuts.extend([s, e]);
        }
        cuts.retain(|&c| c >= HEADER_SIZE as u64 && c <= image.len() as u64);
        cuts.sort_unstable();
        cuts.dedup();
        for w in cuts.windows(2) {
            let span = (w[0], w[1]);
            if !overlaps(span, &enabled) && differs(span)? {
                after.push(span);
            }
        }
        Ok(Restore {
            before,
            staged,
            switch,
            final_header,
            after,
        })
    }

    fn run(&self, dev: &dyn Storage, image: &[u8]) -> Result<(), Error> {
        let bytes = |(s, e): Span| &image[s as usize..e as usize];
        for &span in &self.before {
            write_at(dev, bytes(span), span.0)?;
        }
        for &(span, spare) in &self.staged {
            write_at(dev, bytes(span), spare)?;
        }
        if !self.before.is_empty() || !self.staged.is_empty() {
            sync(dev)?;
        }
        self.switch.write(dev)?;
        if let Some(header) = &self.final_header {
            for &(span, _) in &self.staged {
                write_at(dev, bytes(span), span.0)?;
            }
            sync(dev)?;
            header.write(dev)?;
        }
        for &span in &self.after {
            write_at(dev, bytes(span), span.0)?;
        }
        if !self.after.is_empty() {
            sync(dev)?;
        }
        Ok(())
    }
}
