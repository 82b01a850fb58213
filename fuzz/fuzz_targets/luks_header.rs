//! Any bytes as a device: reading the LUKS header (binary headers of both versions, the LUKS2
//! JSON metadata and its validation) and rendering it must never panic, whatever it decides.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sectorcrypt_luks::Header;
use sectorcrypt_storage::MemStorage;

fuzz_target!(|data: &[u8]| {
    let dev = MemStorage::new(data.to_vec());
    if let Ok(header) = Header::read(&dev) {
        let _ = header.dump_text("fuzz");
        let _ = header.dump_json();
        let _ = header.active_keyslots();
    }
});
