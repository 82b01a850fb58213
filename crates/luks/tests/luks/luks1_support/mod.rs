//! What the LUKS1 integration tests share: scratch folders, running the real tools (installed by
//! scripts/install-test-deps.sh), and reading cryptsetup's answers.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub(crate) use sectorcrypt_testkit::cryptsetup_volume_key;

pub(crate) use sectorcrypt_testkit::scratch;

/// Run `cmd`; a tool that cannot start is a test failure, its exit status is the caller's.
pub(crate) fn output(cmd: &mut Command) -> Output {
    sectorcrypt_testkit::output(cmd)
}

/// Run `cmd`; a tool that cannot start or fails is a test failure.
pub(crate) fn run(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    sectorcrypt_testkit::ok(output(cmd), &what)
}

/// Write `passphrase` to a key file in `dir` (cryptsetup reads the whole file, no newline).
pub(crate) fn key_file(dir: &Path, name: &str, passphrase: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, passphrase).unwrap();
    path
}

/// `cryptsetup luksDump` output without its first two lines (`LUKS header information for
/// DEVICE` and an empty line), which `luks1::Header::dump_text` leaves to the caller.
pub(crate) fn cryptsetup_dump(file: &Path) -> String {
    let out = run(Command::new("cryptsetup").arg("luksDump").arg(file));
    let text = String::from_utf8(out.stdout).unwrap();
    let heading = format!("LUKS header information for {}\n\n", file.display());
    text.strip_prefix(&heading)
        .unwrap_or_else(|| panic!("unexpected luksDump heading:\n{text}"))
        .to_string()
}
