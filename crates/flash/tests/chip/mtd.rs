//! Linux MTD devices: what is not one is refused by name; a real one (named in
//! `SECTORCRYPT_TEST_MTD`, read-only calls only) answers as a chip. The test machines have no
//! MTD device of their own, so there only the refusals run here; the backend runs on the
//! kernel's nandsim in the CLI's kernel-oracle test (`crates/sectorcrypt/tests/cli/mtd.rs`).

use std::path::Path;

use sectorcrypt_flash::mtd::MtdFlash;
use sectorcrypt_flash::{Error, Flash};
use sectorcrypt_testkit::scratch;

/// The message of the `Error::Format` that opening `path` must fail with.
fn refusal(path: &Path, read_only: bool) -> String {
    match MtdFlash::open(path, read_only) {
        Err(Error::Format(why)) => why,
        Err(e) => panic!("{}: not a format error: {e:?}", path.display()),
        Ok(_) => panic!("{} was taken for an MTD device", path.display()),
    }
}

#[test]
fn a_regular_file_is_not_an_mtd_device() {
    let dir = scratch("flash-mtd-file");
    let file = dir.join("image.bin");
    std::fs::write(&file, vec![0xFF; 128 * 1024]).unwrap();
    for read_only in [true, false] {
        let why = refusal(&file, read_only);
        assert!(
            why.contains("image.bin is a regular file, not an MTD character device"),
            "{why}"
        );
    }
    let why = refusal(&dir, true);
    assert!(why.contains("is a directory, not an MTD"), "{why}");
}

#[test]
fn dev_null_is_a_character_device_but_not_mtd() {
    let why = refusal(Path::new("/dev/null"), true);
    assert!(
        why.contains("/dev/null is a character device 1:3 (MTD's major is 90), not an MTD"),
        "{why}"
    );
}

#[test]
fn a_missing_device_is_an_io_error_that_names_it() {
    match MtdFlash::open(Path::new("/dev/mtd-does-not-exist"), true) {
        Err(Error::Io(e)) => {
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            assert!(e.to_string().contains("/dev/mtd-does-not-exist"), "{e}");
        }
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("opened a missing device"),
    }
}

/// Read-only calls on the device `SECTORCRYPT_TEST_MTD` names (e.g. a nandsim's `/dev/mtd0`):
/// a valid geometry, every block's bad mark, the first good block's first page and spare area,
/// and refusals of changes. Skipped, with a message, without one.
#[test]
#[ignore = "needs an MTD device: SECTORCRYPT_TEST_MTD=/dev/mtdN cargo test -- --ignored"]
fn a_named_mtd_device_answers_read_only_calls() {
    let path = std::env::var_os("SECTORCRYPT_TEST_MTD")
        .expect("SECTORCRYPT_TEST_MTD=/dev/mtdN names the device to try");
    let mtd = MtdFlash::open(Path::new(&path), true).unwrap();
    let g = mtd.geometry();
    g.validate().unwrap();
    let bad: Vec<bool> = (0..g.peb_count)
        .map(|peb| mtd.is_bad(peb).unwrap())
        .collect();
    let good = bad.iter().position(|&b| !b).expect("a good block");
    let mut page = vec![0u8; g.page_size as usize];
    match mtd.read(good as u32, 0, &mut page) {
        Ok(_) | Err(Error::Uncorrectable { .. }) => {}
        Err(e) => panic!("{e}"),
    }
    let mut spare = vec![0u8; g.oob_size as usize];
    mtd.read_oob(good as u32, 0, &mut spare).unwrap();
    assert!(matches!(mtd.erase(good as u32), Err(Error::Io(_))));
    assert!(matches!(
        mtd.program(good as u32, 0, &page[..g.sub_page_size as usize]),
        Err(Error::Io(_))
    ));
    assert!(matches!(mtd.mark_bad(good as u32), Err(Error::Io(_))));
}
