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
//! The callers (the command line) check their arguments, ask for passphrases and confirmation,
//! and then call these; the conversion itself is [`crate::reencrypt::run`].

use sectorcrypt_cipher::CipherSpec;
use sectorcrypt_luks::luks2::metadata::SegmentEntry;
use sectorcrypt_luks::luks2::reencrypt::{self, InitOptions, Target};
use sectorcrypt_luks::luks2::{random_bytes, Header as Luks2Header, Pbkdf};
use sectorcrypt_luks::{FormatOptions, Header};
use sectorcrypt_storage::{install_file, rename_durably, Directory, MemStorage, Storage};

use crate::{datashift, Error};

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
/// `passphrase` through a new keyslot made with `pbkdf`. Returns the header as written;
/// [`crate::reencrypt::run`] then converts the data.
///
/// Errors: [`Error::Luks`] for a key that is not this volume's, no free keyslot or digest, or a
/// target the cipher layer refuses (nothing is written then); [`Error::Luks`] with an I/O error
/// if a write fails.
pub fn start_reencryption(
    header: &dyn Storage,
    h: &Luks2Header,
    old_volume_key: &[u8],
    passphrase: &[u8],
    new: &NewKey,
    pbkdf: &Pbkdf,
    init: &InitOptions,
) -> Result<Luks2Header, Error> {
    let segment = h.data_segment()?;
    let (new_vk, target) = (random_bytes(new.len), &new.target);
    // The keyslot area is encrypted like the data it will open: with the new cipher if it
    // changes, else like the current segment.
    let keyslot_cipher = (target.cipher != segment.cipher).then_some(target.cipher.as_str());
    let staged =
        h.stage_keyslot_for_new_key(header, &new_vk, passphrase, None, pbkdf, keyslot_cipher)?;
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

/// What opening a volume (to serve or mount it) does about a conversion its header records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtOpen {
    /// Nothing is in progress: open it.
    Open,
    /// An encryption or reencryption was interrupted: finish it first (as the next run of its
    /// command would), then open the volume it leaves.
    FinishFirst(reencrypt::Mode),
}

/// The policy for a conversion found in progress when a volume is opened: a volume half
/// converted has two layouts, which one volume cannot serve. An interrupted encryption or
/// reencryption is finished first; a decryption (it ends with no keys to open), or any
/// conversion of a volume opened read-only (finishing writes), is refused.
///
/// Errors: [`Error::InProgress`] for a conversion that must be finished by its own command;
/// [`Error::Luks`] for reencryption metadata that does not parse.
pub fn at_open(h: &Header, device: &str, read_only: bool) -> Result<AtOpen, Error> {
    let Header::Luks2(h) = h else {
        return Ok(AtOpen::Open);
    };
    match reencrypt::parse(h.metadata())? {
        None => Ok(AtOpen::Open),
        Some(r) if read_only || r.keyslot.mode == reencrypt::Mode::Decrypt => {
            Err(Error::InProgress {
                device: device.to_string(),
                mode: r.keyslot.mode,
            })
        }
        Some(r) => Ok(AtOpen::FinishFirst(r.keyslot.mode)),
    }
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
