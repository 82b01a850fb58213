//! Starting the conversions that move the data by the header's size (cryptsetup's `datashift`),
//! up to the point where the LUKS2 reencryption metadata records them; [`crate::reencrypt::run`]
//! does the rest.
//!
//! # Encryption with the header on the device (`encrypt --reduce-device-size 2S`)
//!
//! The header goes over the first S bytes of the device, which hold plaintext; the data ends up
//! S bytes further on. With D the device size and L = D − 2S the plaintext to keep (the user
//! shrank the file system to L): the first S bytes are copied to the end, `[D − S, D)`, where
//! the metadata's moved segment says they are, and the header is written over them. cryptsetup
//! writes the header there with nothing that records the copy first, so a power cut that tears
//! that header write leaves the plaintext's first S bytes readable only at the end of the device
//! with no header saying so; run again, a naive tool would copy the torn start over the good
//! copy. [`start_encrypt`] closes that window with a *prepared* copy of the header, written to
//! `[L, L + S)` (free until the first step) **after** the copy at the end is durable: a valid
//! prepared header proves the copy complete, so [`install_prepared`] can always finish the
//! install, and without one the start of the device is still the untouched plaintext, unless a
//! run with another shift was cut short: every install writes a header signature first, and a
//! start that finds a signature without a readable header refuses to copy anything.
//!
//! # Decryption with the header on the device (`decrypt --header NEWFILE`)
//!
//! The header is exported to a file first (by the caller: it is the only copy of the keys from
//! then on), the device's LUKS signatures are wiped, the first M bytes of ciphertext are copied
//! from S to 0, and only then does the exported header get the metadata that says so
//! ([`start_decrypt`]). Every step of that is idempotent while the exported header has no
//! reencryption: the ciphertext at S is untouched until the metadata is written.

use sectorcrypt_luks::luks2::binary::{HDR_SIZES, MAGIC_PRIMARY, MAGIC_SECONDARY};
use sectorcrypt_luks::luks2::reencrypt::{self, Direction, InitOptions, Mode, State};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_storage::{MemStorage, Storage, Window};

use crate::reencrypt::{io_at, luks};
use crate::Error;

/// Data moves through buffers of this size.
const PIECE: u64 = 4 << 20;

/// Copy `len` bytes from `src` to `dst` on `dev` (ranges that do not overlap), durably.
fn copy(dev: &dyn Storage, src: u64, dst: u64, len: u64) -> Result<(), Error> {
    let mut buf = vec![0u8; PIECE.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = PIECE.min(len - done) as usize;
        dev.read_at(&mut buf[..n], src + done)
            .and_then(|()| dev.write_at(&buf[..n], dst + done))
            .map_err(|e| io_at(dev, "moving data", e))?;
        done += n as u64;
    }
    dev.sync().map_err(|e| io_at(dev, "moving data", e))
}

fn write_synced(dev: &dyn Storage, buf: &[u8], offset: u64, what: &str) -> Result<(), Error> {
    dev.write_at(buf, offset)
        .and_then(|()| dev.sync())
        .map_err(|e| io_at(dev, what, e))
}

/// The plaintext a shifted encryption keeps on a `device_len`-byte device with shift `shift`
/// (L = D − 2S), if there is room: at least S, so that the prepared header at `[L, L + S)`
/// overlaps neither the header's place nor the copy at the end.
pub fn encrypt_data_size(device_len: u64, shift: u64) -> Option<u64> {
    device_len
        .checked_sub(2 * shift)
        .filter(|l| *l >= shift && shift > 0)
}

/// Start a shifted encryption of `dev`: `image` is the whole first S bytes as they must become
/// (a LUKS2 header formatted with data offset S whose metadata is
/// [`reencrypt::init_encrypt_datashift`]'s for this device). Copies the first S bytes to the end,
/// writes the prepared header, then installs it ([`install_prepared`]). A crash at any point
/// leaves either the device untouched at its start (no valid prepared header: start again) or a
/// prepared header that [`install_prepared`] installs.
///
/// Errors: [`Error::Unsupported`] if the device has no room ([`encrypt_data_size`]) or the
/// image is not such a header; [`Error::Io`].
pub fn start_encrypt(dev: &dyn Storage, image: &[u8]) -> Result<(), Error> {
    let shift = image.len() as u64;
    let device_len = dev.len().map_err(|e| io_at(dev, "reading the size", e))?;
    let data = encrypt_data_size(device_len, shift).ok_or_else(|| too_small(device_len, shift))?;
    let h = Luks2Header::read(&MemStorage::new(image.to_vec())).map_err(luks)?;
    check_start(&h, shift, device_len)?;
    // Every install writes a header signature first; one without a readable header is a start
    // cut short (with another shift than this run's, or the prepared copy would have been
    // found): copying the device's start to the end now could overwrite the only good copy.
    if let Some(at) = luks_signature(dev)? {
        return Err(Error::Unsupported(format!(
            "{} has a LUKS header signature at byte {at} but no readable header: if an \
             encryption was cut short, run it again with the --reduce-device-size it was \
             started with; otherwise wipe the signature (wipefs) first",
            dev.name()
        )));
    }
    copy(dev, 0, device_len - shift, shift)?;
    write_synced(dev, image, data, "writing the prepared header")?;
    install_prepared(dev, shift).map(|_| ())
}

fn too_small(device_len: u64, shift: u64) -> Error {
    Error::Unsupported(format!(
        "a data shift of {shift} bytes on a device of {device_len} bytes (it needs at least three \
         times the shift: the header, the data, and room for the shifted end)"
    ))
}

/// `h` must be a header starting the shifted encryption by `shift` bytes of a `device_len`-byte
/// device.
fn check_start(h: &Luks2Header, shift: u64, device_len: u64) -> Result<(), Error> {
    match reencrypt::parse(h.metadata()).map_err(luks)? {
        Some(r)
            if r.keyslot.mode == Mode::Encrypt
                && r.keyslot.direction == Direction::Backward
                && r.keyslot.resilience.shift_size() == Some(shift)
                && r.state() == State::Clean
                && r.backup_moved.as_ref().map(|m| m.offset) == Some(device_len - shift) =>
        {
            Ok(())
        }
        _ => Err(Error::Unsupported(format!(
            "a header that does not start a {shift}-byte data shift of this device"
        ))),
    }
}

/// The offset of a LUKS2 binary header signature at the start of `dev` (a primary one at 0 or a
/// secondary one where LUKS2 allows it), if any.
fn luks_signature(dev: &dyn Storage) -> Result<Option<u64>, Error> {
    let len = dev.len().map_err(|e| io_at(dev, "reading the size", e))?;
    let mut magic = [0u8; 6];
    for (at, want) in std::iter::once((0, MAGIC_PRIMARY))
        .chain(HDR_SIZES.iter().map(|&at| (at, MAGIC_SECONDARY)))
        .filter(|(at, _)| at + 6 <= len)
    {
        dev.read_at(&mut magic, at)
            .map_err(|e| io_at(dev, "looking for a header", e))?;
        if magic == want {
            return Ok(Some(at));
        }
    }
    Ok(None)
}

/// After [`start_encrypt`] was cut short: if `dev` has a valid prepared header for a shift of
/// `shift` bytes (so the copy at the end is complete), write it over the start of the device,
/// invalidate the prepared copy, and return `true`. Returns `false`, writing nothing, when there
/// is no prepared header. The order: a bare secondary signature (not a readable header), so that
/// every install cut short leaves one; the keyslots; the secondary header; the primary one. So a
/// readable header at the start always has its keyslots. A header in place that is newer than
/// the prepared copy (same UUID, higher seqid: steps ran after a cut before the invalidation) is
/// kept; only the prepared copy is invalidated.
///
/// Errors: [`Error::Io`].
pub fn install_prepared(dev: &dyn Storage, shift: u64) -> Result<bool, Error> {
    let device_len = dev.len().map_err(|e| io_at(dev, "reading the size", e))?;
    let Some(data) = encrypt_data_size(device_len, shift) else {
        return Ok(false);
    };
    let Ok(prepared) = Luks2Header::read(&Window::new(dev, data, shift)) else {
        return Ok(false);
    };
    if check_start(&prepared, shift, device_len).is_err() {
        return Ok(false);
    }
    let mut image = vec![0u8; shift as usize];
    dev.read_at(&mut image, data)
        .map_err(|e| io_at(dev, "reading the prepared header", e))?;
    let hdr = prepared.binary().hdr_size as usize;
    // The install finished but the prepared copy outlived it (a cut before the invalidation)
    // and steps have run since: the header in place is newer, and must not be set back.
    let progressed = Luks2Header::read(dev)
        .is_ok_and(|h| h.uuid() == prepared.uuid() && h.seqid() > prepared.seqid());
    if !progressed {
        let install = "installing the header";
        write_synced(dev, &MAGIC_SECONDARY, hdr as u64, install)?;
        write_synced(dev, &image[2 * hdr..], 2 * hdr as u64, install)?;
        write_synced(dev, &image[hdr..2 * hdr], hdr as u64, install)?;
        write_synced(dev, &image[..hdr], 0, install)?;
    }
    write_synced(
        dev,
        &vec![0u8; 2 * hdr],
        data,
        "invalidating the prepared header",
    )?;
    Ok(true)
}

/// Before (re)starting a shifted encryption of `dev` by `shift` bytes: `true` if the device
/// starts with a LUKS2 header (one it had, or the prepared one, installed now after a start that
/// was cut short), `false` if its start is still the plaintext and a start is safe.
///
/// Errors: [`Error::Io`].
pub fn header_in_place(dev: &dyn Storage, shift: u64) -> Result<bool, Error> {
    Ok(install_prepared(dev, shift)? || Luks2Header::read(dev).is_ok())
}

/// Start a shifted decryption: `header_dev` holds the exported copy of the header of
/// `data_dev` (data offset S); unlock it, wipe the LUKS signatures on `data_dev`, copy the
/// first `moved` bytes of ciphertext (clipped to S) from S to 0, and write the metadata of
/// [`reencrypt::init_decrypt_datashift`] to `header_dev`. Safe to repeat until that last write.
///
/// Errors: [`Error::Luks`] for a wrong passphrase (nothing is written) or a header with a
/// reencryption already; [`Error::Unsupported`] for a header with its data at 0; [`Error::Io`].
pub fn start_decrypt(
    header_dev: &dyn Storage,
    data_dev: &dyn Storage,
    passphrase: &[u8],
    moved: u64,
    init: &InitOptions,
) -> Result<(), Error> {
    let h = Luks2Header::read(header_dev).map_err(luks)?;
    if reencrypt::state(h.metadata()) != State::None {
        return Err(Error::Unsupported(format!(
            "the header on {} records a reencryption already",
            header_dev.name()
        )));
    }
    let unlocked = h.unlock(header_dev, passphrase, None).map_err(luks)?;
    let device_len = data_dev
        .len()
        .map_err(|e| io_at(data_dev, "reading the size", e))?;
    let md = reencrypt::init_decrypt_datashift(&h, &unlocked.volume_key, device_len, moved, init)
        .map_err(luks)?;
    let r = reencrypt::parse(&md)
        .map_err(luks)?
        .ok_or_else(|| Error::Unsupported("the reencryption vanished".into()))?;
    let shift = r.keyslot.resilience.shift_size().unwrap_or(0);
    let moved = r.backup_moved.as_ref().and_then(|m| m.size).unwrap_or(0);
    // No LUKS header on the device from now on (as cryptsetup): the exported one is the header.
    let signatures = (2 * h.binary().hdr_size).min(shift);
    write_synced(
        data_dev,
        &vec![0u8; signatures as usize],
        0,
        "wiping the LUKS signatures",
    )?;
    copy(data_dev, shift, 0, moved)?;
    reencrypt::write_metadata(header_dev, &h, &md).map_err(luks)?;
    Ok(())
}
