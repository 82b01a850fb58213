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
//!
//! The callers (the command line) check their arguments, ask for passphrases and confirmation,
//! and then call these; the conversion itself is [`crate::reencrypt::run`].

use std::path::Path;

use sectorcrypt_luks::luks2::reencrypt::{self, InitOptions, Target};
use sectorcrypt_luks::luks2::{random_bytes, Header as Luks2Header, Pbkdf};
use sectorcrypt_luks::{FormatOptions, Header};
use sectorcrypt_storage::{install_file, MemStorage, Storage};

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
/// file `header_path`, atomically and durably.
///
/// Errors: [`Error::Io`] if the file cannot be written, synced or renamed.
pub fn start_detached_encryption(header_path: &Path, image: &[u8]) -> Result<(), Error> {
    install_file(header_path, image).map_err(|e| {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!("installing header file {}: {e}", header_path.display()),
        ))
    })
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
