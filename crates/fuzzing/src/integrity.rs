//! An integrity device (dm-integrity's superblock, journal and tag areas) from arbitrary bytes.

use std::sync::Arc;

use sectorcrypt_integrity::{IntegrityDevice, Mode, Superblock};
use sectorcrypt_storage::{MemStorage, Storage};

/// Bytes of the device the input is the start of.
const DEVICE: usize = 1 << 20;

/// The input as the start of a 1 MiB device whose integrity superblock is at byte 0 (the rest
/// zeros), under a fixed key in the mode its tag size names (32 bytes hmac(sha256) over XTS, 64
/// hmac(sha512), 20 hmac(sha1), 28 aes-gcm-random): open it read-only (superblock, layout, journal scan and its
/// blocks read from the journal) and read every block; open it writable (the journal replayed or
/// cleared), write block 0, flush, and read it back, there and after opening again: it must be
/// what was written.
pub fn integrity_device(data: &[u8]) {
    let mut image = vec![0u8; DEVICE];
    let n = data.len().min(DEVICE);
    image[..n].copy_from_slice(&data[..n]);
    let Ok(sb) = Superblock::parse(&image[..4096]) else {
        return;
    };
    let block = 512usize << sb.log2_sectors_per_block;
    let (cipher, integrity, key_len) = match sb.tag_size {
        32 => ("aes-xts-plain64", "hmac(sha256)", 96),
        64 => ("aes-xts-plain64", "hmac(sha512)", 128),
        20 => ("aes-xts-plain64", "hmac(sha1)", 84),
        28 => ("aes-gcm-random", "aead", 32),
        _ => return,
    };
    let key = [0x5Cu8; 128];
    let mode = || Mode::new(cipher, integrity, &key[..key_len], block).expect("a valid mode");
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new(image));
    if let Ok(dev) = IntegrityDevice::open(Arc::clone(&storage), 0, mode(), true) {
        let mut buf = vec![0u8; block];
        for b in 0..dev.layout().blocks() {
            let _ = dev.read(b, &mut buf);
        }
    }
    let Ok(dev) = IntegrityDevice::open(Arc::clone(&storage), 0, mode(), false) else {
        return;
    };
    let written = vec![0xA7u8; block];
    dev.write(0, &written).expect("a write to memory");
    dev.flush().expect("a flush of memory");
    let mut back = vec![0u8; block];
    dev.read(0, &mut back)
        .expect("the block just written verifies");
    assert!(back == written, "the block just written reads back");
    drop(dev);
    let again = IntegrityDevice::open(storage, 0, mode(), true).expect("it opened before");
    again
        .read(0, &mut back)
        .expect("the block written verifies after reopening");
    assert!(
        back == written,
        "the block written reads back after reopening"
    );
}
