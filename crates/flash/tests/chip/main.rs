//! The flash crate's tests, one binary: the simulated chip (`sim`), the encryption layer on it
//! (`crypt`), dumps in nanddump's layout (`dump`), the header area (`area`) and Linux MTD
//! devices (`mtd`).

mod area;
mod crypt;
mod dump;
mod hiding;
#[cfg(target_os = "linux")]
mod mtd;
mod sim;

use sectorcrypt_flash::Geometry;

/// A small SLC chip: 16 KiB blocks of 2 KiB pages (512-byte sub-pages, NOP 4), 16 blocks.
fn small() -> Geometry {
    Geometry {
        peb_size: 16 * 1024,
        page_size: 2048,
        sub_page_size: 512,
        oob_size: 64,
        peb_count: 16,
        nop: 4,
    }
}
