//! The seeds of the `integrity_device` fuzz target (`scripts/make-fuzz-corpus.sh` runs this):
//! 1 MiB devices formatted as the kernel formats them, in the modes the target picks by tag
//! size, with blocks written through the journal; in one, the written blocks' data is gone from
//! its place, so that reading it needs the journal. Each seed stops after its last nonzero byte.
//!
//!     cargo run -p sectorcrypt-fuzzing --example integrity-seeds -- DIR

use std::sync::Arc;

use sectorcrypt_integrity::{format, IntegrityDevice, Mode};
use sectorcrypt_storage::{MemStorage, Storage};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: integrity-seeds DIR");
    std::fs::create_dir_all(&dir).expect("the seed directory");
    let key = [0x5Cu8; 128];
    for (name, cipher, integrity, key_len, only_journal) in [
        ("hmac-sha256", "aes-xts-plain64", "hmac(sha256)", 96, false),
        ("hmac-sha512", "aes-xts-plain64", "hmac(sha512)", 128, false),
        ("hmac-sha1", "aes-xts-plain64", "hmac(sha1)", 84, false),
        ("aes-gcm-random", "aes-gcm-random", "aead", 32, false),
        (
            "hmac-sha256-journal-only",
            "aes-xts-plain64",
            "hmac(sha256)",
            96,
            true,
        ),
    ] {
        let mode = || Mode::new(cipher, integrity, &key[..key_len], 4096).expect("a mode");
        let mem = Arc::new(MemStorage::new(vec![0; 1 << 20]));
        let sb = format::plan(1 << 20, 0, mode().tag_size() as u16, 4096, false).expect("a plan");
        let layout = format::format(&*mem, 0, &sb).expect("formatted");
        let dev = IntegrityDevice::open(Arc::clone(&mem) as Arc<dyn Storage>, 0, mode(), false)
            .expect("opened");
        for b in 0..6u64 {
            dev.write(b * 3, &vec![b as u8 + 1; 4096]).expect("written");
        }
        dev.flush().expect("flushed");
        drop(dev);
        let mut image = mem.contents();
        if only_journal {
            for b in 0..6u64 {
                let at = layout.data_offset(b * 3) as usize;
                image[at..at + 4096].fill(0);
            }
        }
        let end = image.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        std::fs::write(format!("{dir}/{name}"), &image[..end]).expect("a seed written");
    }
}
