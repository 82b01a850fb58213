//! The key table file of `kpio serve`.

use std::sync::Arc;

use sectorcrypt_storage::MemStorage;
use sectorcrypt_volume::kpio::{read_key_table, KeyTable, Mirror};
use sectorcrypt_volume::{Layout, VolumeOptions};

/// Entries a table file may hold here (`--max-keys`).
const MAX_KEYS: usize = 16;

/// Keys the table holds at once: fewer than a file may list, so that loads also fail.
const CAPACITY: usize = 6;

/// Ciphers and key sizes (bytes) of the table, chosen by the input's first byte.
const FORMATS: [(&str, usize); 4] = [
    ("aes-xts-plain64", 64),
    ("aes-xts-plain64", 32),
    ("aes-cbc-essiv:sha256", 32),
    ("serpent-xts-plain64", 64),
];

/// The input's first byte picks a cipher and key size, the rest is a key table file: read it
/// as `kpio serve` does, load it into a table over a small store, reload it as SIGHUP does
/// (half of it, then all of it again: keys destroyed, loaded, replaced), and write and read a
/// sector under every tag loaded.
pub fn kpio_keytable(data: &[u8]) {
    let Some((&choice, file)) = data.split_first() else {
        return;
    };
    let (cipher, key_bytes) = FORMATS[usize::from(choice) % FORMATS.len()];
    let Ok(keys) = read_key_table(file, key_bytes, MAX_KEYS) else {
        return;
    };
    let layout = Layout {
        offset: 0,
        size: 4096,
        cipher: cipher.into(),
        sector_size: 512,
        iv_offset: 0,
    };
    let storage = Arc::new(MemStorage::new(vec![0; 4096]));
    let Ok(table) = KeyTable::new(storage, layout, &VolumeOptions::default(), CAPACITY) else {
        return;
    };
    let mut mirror = Mirror::new(key_bytes);
    let half = keys.len() / key_bytes / 2 * key_bytes;
    for file in [&keys[..], &keys[..half], &keys[..]] {
        let _ = table.reload(&mut mirror, file);
    }
    for tag in table.tags() {
        let mut sector = [tag as u8; 512];
        let _ = table.write(tag, &sector, 512);
        let _ = table.read(tag, &mut sector, 512);
    }
}
