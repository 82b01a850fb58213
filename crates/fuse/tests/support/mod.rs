//! Helpers shared by the integration tests and, through `#[path]` in lib.rs, the unit tests, so
//! that both mount and check the same kind of volume.

use std::sync::Arc;

use sectorcrypt_storage::MemStorage;
use sectorcrypt_volume::{Layout, Volume, VolumeOptions};

/// A volume filling all of `storage`: aes-xts-plain64 with a fixed key, `sector_size`-byte
/// sectors.
pub(crate) fn mem_volume(
    storage: &Arc<MemStorage>,
    sector_size: usize,
    read_only: bool,
) -> Arc<Volume> {
    let layout = Layout {
        offset: 0,
        size: storage.contents().len() as u64,
        cipher: "aes-xts-plain64".into(),
        sector_size,
        iv_offset: 0,
    };
    let opts = VolumeOptions {
        read_only,
        ..Default::default()
    };
    Arc::new(Volume::with_layout(storage.clone(), layout, &[7; 64], &opts).unwrap())
}

pub(crate) use sectorcrypt_testkit::scratch;
