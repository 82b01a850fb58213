//! Starting in-place conversions: the crash-ordered writes that record a conversion in a LUKS2
//! header before the engine ([`crate::reencrypt::run`]) touches any data.
//!
//! A start is safe when a power cut at any point leaves the volume exactly as it was, or the
//! conversion recorded and resumable, never a header naming material that never reached the
//! media. So each start here is one metadata write (both header copies, in sequence), after
//! whatever it names is synced:
//!
//! - [`start_reencryption`]: the new volume key's keyslot material goes to a free area and is
//!   synced first; then one metadata write adds that keyslot and its digest and starts the
//!   reencryption, so no crash leaves an unused keyslot behind.
//! - [`start_decryption`]: a volume with a detached header; one metadata write.
//! - [`start_detached_encryption`]: a header made whole in memory ([`encryption_header`]:
//!   formatted, the encryption's start recorded) becomes the header file by an atomic, durable
//!   install, so a crash leaves no header or a complete one, never a header that names the
//!   plaintext as encrypted.
//! - [`start_shifted_encryption`]: the same header goes to the start of the device once the
//!   data there is copied away, by [`crate::datashift::start_encrypt`].
//! - [`start_exported_decryption`] (after [`plan_exported_decryption`]): a volume whose header is
//!   on the device is decrypted with the data moved back to offset 0, so the header must leave
//!   first. It is exported to `FILE.partial` (atomic, durable), the decryption is started there
//!   (the device's signatures wiped, the first chunk moved, all recorded in the exported header),
//!   and only then is the file renamed to `FILE`. A run cut short before the rename finds
//!   `FILE.partial` and carries on from it; while the device's own header is still there, it is
//!   exported afresh.
//!
//! Before any of these, the `plan_*` and `check_*` functions here decide, from the device alone,
//! whether the conversion asked for is a fresh start, a resume, or refused (a device too small or
//! of a size the checksums cannot cover, a header already there, a conversion of another kind in
//! progress), so that a refusal comes before any passphrase is asked and anything is written.
//!
//! The callers (the command line) parse their arguments, ask for passphrases and confirmation,
//! and then call these; the conversion itself is [`crate::reencrypt::run`].

use sectorcrypt_cipher::CipherSpec;
use sectorcrypt_luks::luks2::metadata::SegmentEntry;
use sectorcrypt_luks::luks2::reencrypt::{self, InitOptions, Mode, State, Target};
use sectorcrypt_luks::luks2::{random_bytes, Header as Luks2Header, Pbkdf};
use sectorcrypt_luks::{FormatOptions, Header};
use sectorcrypt_storage::{install_file, rename_durably, Directory, MemStorage, Storage};

use crate::{datashift, Error};

/// The checksum resilience (cryptsetup's) hashes the data in blocks of this size.
const CHECKSUM_BLOCK: u64 = 4096;

/// The largest `reduce` of a shifted encryption (twice the shift), as cryptsetup's 1 GiB limit.
const MAX_REDUCE: u64 = 1 << 30;

/// A `len`-byte `device` can be converted in place: its size splits into the 4 KiB blocks the
/// checksums cover.
///
/// Errors: [`Error::WrongDevice`] otherwise.
pub fn check_size(device: &str, len: u64) -> Result<(), Error> {
    if len == 0 || !len.is_multiple_of(CHECKSUM_BLOCK) {
        return Err(Error::WrongDevice(format!(
            "{device} is {len} bytes; converting in place needs a size that is a non-zero \
             multiple of {CHECKSUM_BLOCK} bytes"
        )));
    }
    Ok(())
}

/// The LUKS2 header on `dev` (in-place conversions record their state in LUKS2 metadata only).
///
/// Errors: [`Error::Luks`] if there is none; [`Error::Refused`] for LUKS1.
pub fn read_luks2(dev: &dyn Storage) -> Result<Luks2Header, Error> {
    match Header::read(dev)? {
        Header::Luks2(h) => Ok(*h),
        Header::Luks1(_) => Err(Error::Refused(
            "LUKS1 has no in-place encryption metadata".into(),
        )),
    }
}

/// Whether the header `h` of `device` has a `mode` conversion to resume (`true`) or none in
/// progress, so one may start (`false`).
///
/// Errors: [`Error::Refused`] when it records another kind of conversion, or when `resume_only`
/// finds nothing to resume.
pub fn resuming(
    h: &Luks2Header,
    device: &str,
    mode: Mode,
    resume_only: bool,
) -> Result<bool, Error> {
    let in_progress = reencrypt::state(h.metadata()) != State::None;
    if resume_only || in_progress {
        expect_in_progress(h, device, mode)?;
    }
    Ok(in_progress)
}

/// A new encryption of `data` with a detached header may start: neither `data` nor the file
/// where the header goes (`header`, if it exists) holds a LUKS header.
///
/// Errors: [`Error::Exists`] naming which one does.
pub fn check_new_encryption(data: &dyn Storage, header: Option<&dyn Storage>) -> Result<(), Error> {
    if Header::is_present(data) {
        return Err(already_encrypted(&data.name()));
    }
    match header {
        Some(file) if Header::is_present(file) => Err(Error::Exists(format!(
            "{} already holds a LUKS header (an encryption recorded there is resumed, not \
             started again)",
            file.name()
        ))),
        _ => Ok(()),
    }
}

fn already_encrypted(device: &str) -> Error {
    Error::Exists(format!(
        "{device} already has a LUKS header; it is encrypted already"
    ))
}

/// What an encryption with the header on the device (data shifted) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShiftedPlan {
    /// The device records the encryption (its header is installed): resume it.
    Resume,
    /// Start one: the header takes the first `shift` bytes, the first `keep` bytes of plaintext
    /// move `shift` bytes on.
    Fresh {
        /// The data shift, half of what the device is reduced by.
        shift: u64,
        /// The plaintext kept.
        keep: u64,
    },
}

/// Decide how to encrypt `dev` with the header at its start, the device reduced by `reduce`
/// bytes (the shift is half of it; `None`: resume what the device records). A start cut short
/// before its header was installed is finished first (no secret needed: the prepared header is
/// complete), after which it is a resume.
///
/// Errors: [`Error::Refused`] for a `reduce` that is not a non-zero multiple of 8 KiB up to
/// 1 GiB, or a conversion of another kind in progress; [`Error::WrongDevice`] for a device whose
/// size does not fit ([`check_size`], less than three shifts) or, with `resume_only`, that has
/// nothing to resume; [`Error::Exists`] for a device encrypted already; [`Error::Io`].
pub fn plan_shifted_encryption(
    dev: &dyn Storage,
    reduce: Option<u64>,
    resume_only: bool,
) -> Result<ShiftedPlan, Error> {
    let name = dev.name();
    let len = dev.len()?;
    check_size(&name, len)?;
    let Some(reduce) = reduce else {
        return resume_shifted(dev);
    };
    if reduce == 0 || reduce > MAX_REDUCE || !reduce.is_multiple_of(2 * CHECKSUM_BLOCK) {
        return Err(Error::Refused(format!(
            "reducing the device by {reduce} bytes: it must be a non-zero multiple of 8 KiB \
             (the data moves by half of it, in whole 4 KiB blocks), at most 1 GiB"
        )));
    }
    let shift = reduce / 2;
    if datashift::header_in_place(dev, shift)? {
        return resume_shifted(dev);
    }
    if resume_only {
        return Err(Error::WrongDevice(format!(
            "{name} has no encryption in progress to resume"
        )));
    }
    let keep = datashift::encrypt_data_size(len, shift).ok_or_else(|| {
        Error::WrongDevice(format!(
            "{name} is {len} bytes, too small to be reduced by {reduce}: it needs at least three \
             times the shift ({} bytes)",
            3 * shift
        ))
    })?;
    Ok(ShiftedPlan::Fresh { shift, keep })
}

/// The header installed on `dev` must record an encryption in progress.
fn resume_shifted(dev: &dyn Storage) -> Result<ShiftedPlan, Error> {
    let h = match Header::read(dev)? {
        Header::Luks2(h) if reencrypt::state(h.metadata()) != State::None => h,
        _ => return Err(already_encrypted(&dev.name())),
    };
    expect_in_progress(&h, &dev.name(), Mode::Encrypt)?;
    Ok(ShiftedPlan::Resume)
}

/// Where a new encryption puts its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In a file of its own; the data stays where it is.
    Detached,
    /// At the start of the device; the data moves on by the header's size.
    DataShift,
}

/// A new encryption's LUKS2 header, whole, in memory (`size` bytes): formatted with `options`
/// for a `data_len`-byte device, opened by `passphrase`, with the encryption's start recorded as
/// cryptsetup's `reencrypt --encrypt --init-only` records it for `placement`. Nothing is written
/// to any device.
///
/// Errors: [`Error::Luks`] for options the format refuses.
pub fn encryption_header(
    options: &FormatOptions,
    size: u64,
    data_len: u64,
    passphrase: &[u8],
    placement: Placement,
    init: &InitOptions,
) -> Result<Vec<u8>, Error> {
    let image = MemStorage::new(vec![0; size as usize]);
    let (formatted, unlocked) = sectorcrypt_luks::format(&image, data_len, options, passphrase)?;
    let Header::Luks2(h) = formatted else {
        return Err(Error::Unsupported(
            "in-place encryption needs a LUKS2 header".into(),
        ));
    };
    let vk = &unlocked.volume_key;
    let md = match placement {
        Placement::Detached => reencrypt::init_encrypt(&h, vk, init)?,
        Placement::DataShift => reencrypt::init_encrypt_datashift(&h, vk, data_len, init)?,
    };
    reencrypt::write_metadata(&image, &h, &md)?;
    Ok(image.contents())
}

/// Start an encryption with a detached header: `image` (from [`encryption_header`]) becomes the
/// file `name` in `dir`, atomically and durably.
///
/// Errors: [`Error::Io`] if the file cannot be written, synced or renamed.
pub fn start_detached_encryption(
    dir: &dyn Directory,
    name: &str,
    image: &[u8],
) -> Result<(), Error> {
    install_file(dir, name, image).map_err(|e| io_on(dir, name, "installing header file", e))
}

/// `e`, saying what failed on which file.
fn io_on(dir: &dyn Directory, name: &str, what: &str, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(
        e.kind(),
        format!("{what} {}: {e}", dir.path_of(name).display()),
    ))
}

/// Start an encryption with the header at the start of `dev`: `image` (from
/// [`encryption_header`] with [`Placement::DataShift`]) is installed there once the data it
/// covers is copied away ([`datashift::start_encrypt`], which a rerun finishes after a crash).
pub fn start_shifted_encryption(dev: &dyn Storage, image: &[u8]) -> Result<(), Error> {
    datashift::start_encrypt(dev, image)
}

/// What a reencryption of the volume whose header is `h` converts to, from what was asked
/// (`None`: keep the current cipher or sector size; the key length as [`new_key_len`] decides),
/// with `old_len` the current volume key's length. Checked before anything is written.
///
/// Errors: [`Error::Refused`] as [`new_key_len`]; [`Error::Luks`] for a header with no data
/// segment.
pub fn plan_reencryption(
    h: &Luks2Header,
    cipher: Option<&str>,
    key_bits: Option<usize>,
    sector_size: Option<u32>,
    old_len: usize,
) -> Result<NewKey, Error> {
    let segment = h.data_segment()?;
    let target = Target {
        cipher: cipher.unwrap_or(&segment.cipher).to_string(),
        sector_size: sector_size.unwrap_or(segment.sector_size),
    };
    let len = new_key_len(&target.cipher, key_bits, old_len)?;
    Ok(NewKey { len, target })
}

/// What a reencryption converts to.
#[derive(Clone, Debug)]
pub struct NewKey {
    /// The new volume key's length in bytes (a random key is made).
    pub len: usize,
    /// The new cipher and sector size.
    pub target: Target,
}

/// Start re-encrypting the data of the LUKS2 volume whose header `h` is on `header`, whose current
/// volume key is `old_volume_key`, to `new` (a random key, cipher and sector size), opened by
/// `passphrase` through a new keyslot made with `pbkdf` (and, when `token` released the
/// passphrase, named by that token too). Returns the header as written;
/// [`crate::reencrypt::run`] then converts the data.
///
/// Errors: [`Error::Luks`] for a key that is not this volume's, no free keyslot or digest, or a
/// target the cipher layer refuses (nothing is written then); [`Error::Luks`] with an I/O error
/// if a write fails.
#[allow(clippy::too_many_arguments)] // each is a separate choice of the caller
pub fn start_reencryption(
    header: &dyn Storage,
    h: &Luks2Header,
    old_volume_key: &[u8],
    passphrase: &[u8],
    token: Option<u32>,
    new: &NewKey,
    pbkdf: &Pbkdf,
    init: &InitOptions,
) -> Result<Luks2Header, Error> {
    let segment = h.data_segment()?;
    let (new_vk, target) = (random_bytes(new.len), &new.target);
    // The keyslot area is encrypted like the data it will open: with the new cipher if it
    // changes, else like the current segment.
    let keyslot_cipher = (target.cipher != segment.cipher).then_some(target.cipher.as_str());
    let mut staged =
        h.stage_keyslot_for_new_key(header, &new_vk, passphrase, None, pbkdf, keyslot_cipher)?;
    // A passphrase a token released: the token names the new keyslot too (in the same metadata
    // write), so that it still releases it when the old keyslots go at the end.
    if let Some(id) = token {
        let new_slot = staged
            .metadata()
            .keyslots
            .iter()
            .map(|(n, _)| n)
            .find(|n| h.metadata().keyslots.get(*n).is_none())
            .expect("the staged header has one more keyslot");
        staged.assign_token(id, new_slot as usize)?;
    }
    let md = reencrypt::init_reencrypt(&staged, old_volume_key, &new_vk, target, init)?;
    Ok(reencrypt::write_metadata(header, h, &md)?)
}

/// Start decrypting the data of the LUKS2 volume whose (detached) header `h` is on `header`, with
/// its volume key `volume_key`. Returns the header as written; [`crate::reencrypt::run`] then
/// converts the data.
///
/// Errors: [`Error::Luks`] for a key that is not this volume's or a header that describes no
/// encrypted data (nothing is written then), or for a failed write.
pub fn start_decryption(
    header: &dyn Storage,
    h: &Luks2Header,
    volume_key: &[u8],
    init: &InitOptions,
) -> Result<Luks2Header, Error> {
    let md = reencrypt::init_decrypt(h, volume_key, init)?;
    Ok(reencrypt::write_metadata(header, h, &md)?)
}

/// What [`start_exported_decryption`] will do, decided before any passphrase is asked.
#[derive(Debug)]
pub enum ExportPlan {
    /// The device's header is there: export it, then start. The caller checks the passphrase
    /// against it (and asks for confirmation) first.
    Fresh(Box<Luks2Header>),
    /// An earlier run exported the header to the `.partial` file and stopped before renaming it:
    /// carry on from there.
    Resume,
}

/// `NAME.partial`: where the exported header lives until the decryption has started.
pub fn partial_name(name: &str) -> String {
    format!("{name}.partial")
}

/// Decide how to decrypt `dev`, whose header is on it, exporting the header to the file `name` in
/// `dir` (which does not exist yet). `resume_only`: only carry on from an earlier run.
///
/// Errors: [`Error::InProgress`] when the device records a conversion in progress;
/// [`Error::Refused`] when its header is LUKS1 or describes no encrypted data, or `resume_only`
/// finds nothing to resume;
/// [`Error::Luks`] when there is neither a header on the device nor an exported one.
pub fn plan_exported_decryption(
    dev: &dyn Storage,
    dir: &dyn Directory,
    name: &str,
    resume_only: bool,
) -> Result<ExportPlan, Error> {
    match Header::read(dev) {
        Ok(Header::Luks2(h)) => {
            if let Some(r) = reencrypt::parse(h.metadata())? {
                return Err(Error::InProgress {
                    device: dev.name(),
                    mode: r.keyslot.mode,
                });
            }
            if resume_only {
                return Err(Error::Refused(format!(
                    "{} has no decryption in progress to resume",
                    dir.path_of(name).display()
                )));
            }
            check_encrypted(&h, &dev.name())?;
            Ok(ExportPlan::Fresh(h))
        }
        Ok(Header::Luks1(_)) => Err(Error::Refused(
            "LUKS1 has no in-place decryption metadata".into(),
        )),
        Err(_) if dir.exists(&partial_name(name)) => Ok(ExportPlan::Resume),
        Err(e) => Err(e.into()),
    }
}

/// Start the decryption `plan` describes (see the module docs), the first chunk moved being
/// `moved` bytes; afterwards the file `name` in `dir` records it and [`crate::reencrypt::run`]
/// converts the data. `passphrase` must open the header ([`ExportPlan::Fresh`]: the caller has
/// checked).
///
/// Errors: [`Error::Luks`] for a wrong passphrase on a resumed export; [`Error::Io`].
pub fn start_exported_decryption(
    dev: &dyn Storage,
    dir: &dyn Directory,
    name: &str,
    plan: &ExportPlan,
    passphrase: &[u8],
    moved: u64,
    init: &InitOptions,
) -> Result<(), Error> {
    let partial = partial_name(name);
    if let ExportPlan::Fresh(h) = plan {
        let area = 2 * h.binary().hdr_size + h.metadata().config.keyslots_size;
        let mut bytes = vec![0u8; area as usize];
        dev.read_at(&mut bytes, 0)?;
        install_file(dir, &partial, &bytes)
            .map_err(|e| io_on(dir, &partial, "exporting the header to", e))?;
    }
    let exported = dir
        .open(&partial)
        .map_err(|e| io_on(dir, &partial, "opening", e))?;
    let h = Luks2Header::read(&*exported)?;
    if reencrypt::state(h.metadata()) == reencrypt::State::None {
        datashift::start_decrypt(&*exported, dev, passphrase, moved, init)?;
    } else {
        // Recorded already: the keyslot now belongs to the reencryption (bound to the old
        // segment's digest), so the passphrase is checked the way a resumed run opens it.
        reencrypt::unlock_volume_keys(&h, &*exported, passphrase)?;
    }
    rename_durably(dir, &partial, name).map_err(|e| io_on(dir, &partial, "renaming", e))
}

/// The detached header `h` (in the file `header`) of `device` can start a decryption: it
/// describes encrypted data that starts at the device's first byte.
///
/// Errors: [`Error::Refused`] otherwise.
pub fn check_detached_decryption(h: &Luks2Header, header: &str, device: &str) -> Result<(), Error> {
    check_encrypted(h, device)?;
    let offset = h.data_segment()?.offset;
    if offset != 0 {
        return Err(Error::Refused(format!(
            "the data of {header} starts at byte {offset} of {device}: not a detached-header volume"
        )));
    }
    Ok(())
}

/// A header whose data segment is plaintext (`linear`) has nothing to decrypt.
pub fn check_encrypted(h: &Luks2Header, device: &str) -> Result<(), Error> {
    if h.metadata()
        .segments
        .get(0)
        .is_some_and(|s| matches!(s, SegmentEntry::Linear(_)))
    {
        return Err(Error::Refused(format!(
            "{device} is not encrypted (its header describes plaintext): nothing to decrypt"
        )));
    }
    Ok(())
}

/// The new volume key's length for a reencryption to `cipher`: `key_bits` if given, else the old
/// length if the cipher takes it, else the cipher's default. Refused, before anything is written,
/// when the cipher does not run here, does not take that key, or is `cipher_null` (that would
/// store plaintext: decrypt instead).
pub fn new_key_len(cipher: &str, key_bits: Option<usize>, old_len: usize) -> Result<usize, Error> {
    let refuse = |why: String| Error::Refused(why);
    let spec = CipherSpec::parse(cipher).map_err(|e| refuse(format!("cipher {cipher}: {e}")))?;
    if spec.to_string().starts_with("cipher_null") {
        return Err(refuse(
            "reencrypting to cipher_null would store plaintext; use decrypt for that".into(),
        ));
    }
    let len = match key_bits {
        Some(bits) if bits % 8 != 0 => {
            return Err(refuse(format!("a key of {bits} bits (not whole bytes)")))
        }
        Some(bits) => bits / 8,
        None if spec.check_key_len(old_len).is_ok() => old_len,
        None => spec.default_key_bits() / 8,
    };
    spec.check_key_len(len)
        .map_err(|e| refuse(format!("cipher {cipher} with a {}-bit key: {e}", len * 8)))?;
    Ok(len)
}

/// The header `h` of `device` must record a conversion of `mode` in progress (to resume it).
///
/// Errors: [`Error::Refused`] naming what it records instead, or that nothing is in progress.
pub fn expect_in_progress(
    h: &Luks2Header,
    device: &str,
    mode: reencrypt::Mode,
) -> Result<(), Error> {
    match reencrypt::parse(h.metadata())? {
        Some(r) if r.keyslot.mode == mode => Ok(()),
        Some(r) => Err(Error::Refused(format!(
            "{device} records {} in progress, not {}",
            r.keyslot.mode.as_str(),
            mode.as_str()
        ))),
        None => Err(Error::Refused(format!(
            "{device} has no {} in progress to resume",
            mode.as_str()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn plaintext(len: u64) -> MemStorage {
        MemStorage::new(vec![0x5a; len as usize])
    }

    #[test]
    fn sizes_that_checksums_cannot_cover_are_refused() {
        assert!(check_size("d", 8192).is_ok());
        for len in [0, 4095, 4097, 8192 + 512] {
            assert!(
                matches!(check_size("d", len), Err(Error::WrongDevice(_))),
                "{len}"
            );
        }
    }

    #[test]
    fn a_shifted_encryption_is_planned_from_the_device_alone() {
        let dev = plaintext(12 * MIB);
        assert_eq!(
            plan_shifted_encryption(&dev, Some(8 * MIB), false).unwrap(),
            ShiftedPlan::Fresh {
                shift: 4 * MIB,
                keep: 4 * MIB
            }
        );
        for reduce in [0, 4096, 3 * 4096, 2 << 30] {
            assert!(
                matches!(
                    plan_shifted_encryption(&dev, Some(reduce), false),
                    Err(Error::Refused(_))
                ),
                "reduce {reduce}"
            );
        }
        // Less than three shifts: the prepared header would overlap the copy.
        assert!(matches!(
            plan_shifted_encryption(&dev, Some(10 * MIB), false),
            Err(Error::WrongDevice(_))
        ));
        assert!(matches!(
            plan_shifted_encryption(&dev, Some(8 * MIB), true),
            Err(Error::WrongDevice(_))
        ));
        // Nothing to resume on plaintext: no header at all.
        assert!(matches!(
            plan_shifted_encryption(&dev, None, false),
            Err(Error::Luks(_))
        ));
        assert!(
            dev.contents().iter().all(|&b| b == 0x5a),
            "planning wrote nothing"
        );
    }
}
