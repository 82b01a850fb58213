//! The integrity format against the real kernel, under power cuts, and against hostile input.

mod concurrent;
mod crash;
mod kernel;
mod replay;
mod superblock;
mod wipe;

use std::path::Path;
use std::sync::Arc;

use sectorcrypt_integrity::{IntegrityDevice, Mode};
use sectorcrypt_storage::{FileStorage, Storage};

/// Every mode: (LUKS2 encryption, integrity, volume key bytes).
pub(crate) const MODES: [(&str, &str, usize); 6] = [
    ("aes-xts-plain64", "hmac(sha256)", 96),
    ("aes-xts-plain64", "hmac(sha512)", 128),
    ("aes-xts-plain64", "hmac(sha1)", 84),
    ("aes-gcm-random", "aead", 32),
    ("chacha20-random", "poly1305", 32),
    ("aegis128-random", "aead", 16),
];

/// The passphrase of every test volume.
pub(crate) const PASSPHRASE: &[u8] = b"integrity pass";

/// The LUKS2 integrity volume in `image`, unlocked with [`PASSPHRASE`] and opened.
pub(crate) fn open(image: &Path, read_only: bool) -> IntegrityDevice {
    let storage: Arc<dyn Storage> = Arc::new(if read_only {
        FileStorage::open_read_only(image).unwrap()
    } else {
        FileStorage::open(image).unwrap()
    });
    open_storage(storage, read_only)
}

/// [`open`] on any device.
pub(crate) fn open_storage(storage: Arc<dyn Storage>, read_only: bool) -> IntegrityDevice {
    let header = sectorcrypt_luks::luks2::Header::read(&*storage).unwrap();
    let segment = header.integrity_segment().unwrap();
    let key = header
        .unlock(&*storage, PASSPHRASE, None)
        .unwrap()
        .volume_key;
    let mode = Mode::new(
        &segment.cipher,
        &segment.integrity,
        &key,
        segment.sector_size as usize,
    )
    .unwrap();
    IntegrityDevice::open(storage, segment.offset, mode, read_only).unwrap()
}
