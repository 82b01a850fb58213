//! Shared test support: the vector files (inside this crate, read by the one parser in
//! `sectorcrypt-testkit`) and helpers to reach the peer implementations.
#![allow(dead_code, unused_imports)] // each test file uses its own part

use std::path::PathBuf;

pub(crate) use sectorcrypt_testkit::python;
pub(crate) use sectorcrypt_testkit::vectors::Record;

/// Every record of the vector file `file` in `tests/vectors/`; a missing file fails the test.
pub(crate) fn load(file: &str) -> Vec<Record> {
    sectorcrypt_testkit::vectors::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/vectors")
            .join(file),
    )
}

/// Where test peers (the Crypto++ helper) are built.
pub(crate) fn scratch_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
