//! What the LUKS command-line tests share: scratch folders, running sectorcrypt and cryptsetup
//! (real tools, installed by scripts/install-test-deps.sh), and reading cryptsetup's answers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// An empty folder for one test, under the target's scratch space.
pub fn scratch(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Run with no standard input (so nothing can wait for a terminal).
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (run scripts/install-test-deps.sh)"))
}

/// `out`, after asserting it succeeded (else its status and both outputs are the message).
pub fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// sectorcrypt with `args`.
pub fn sc(args: &[&str]) -> Output {
    run(Command::new(env!("CARGO_BIN_EXE_sectorcrypt")).args(args))
}

/// cryptsetup with `args`.
pub fn cs(args: &[&str]) -> Output {
    run(Command::new("cryptsetup").args(args))
}

pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The volume key as `cryptsetup luksDump --dump-volume-key` prints it, as hex.
pub fn cryptsetup_volume_key(img: &Path, key: &Path) -> String {
    let out = ok(
        cs(&[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            p(key),
            p(img),
        ]),
        "cryptsetup luksDump --dump-volume-key",
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let start = text.find("MK dump:").expect("MK dump line") + "MK dump:".len();
    text[start..]
        .split_whitespace()
        .take_while(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .collect()
}

/// The Python interpreter that has `cryptography` (scripts/install-test-deps.sh installs it):
/// `$SECTORCRYPT_PYTHON`, or `python3` on PATH.
pub fn python() -> String {
    std::env::var("SECTORCRYPT_PYTHON").unwrap_or_else(|_| "python3".to_string())
}
