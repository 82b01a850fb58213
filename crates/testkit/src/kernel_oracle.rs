//! The real Linux kernel as an oracle: `scripts/kernel-oracle.sh` boots Debian's own kernel
//! package in QEMU under TCG emulation (no root, no KVM, and the same emulated CPU on every
//! host: a User-Mode-Linux kernel died on hosts whose XSAVE area holds AMX state). The guest's
//! root is the host's `/`, read-only under a throw-away overlay, so the host's mtd-utils,
//! cryptsetup and the project's binaries run inside with the guest kernel's modules (nandsim,
//! UBI, UBIFS, dm-crypt, dm-integrity); a work folder is shared writable at its own path.
//!
//! `scripts/test.sh` prepares the kernel once (`kernel-oracle.sh prepare`, through
//! `install-test-deps.sh`) in `$SECTORCRYPT_KERNEL_DIR`, default `/var/tmp/sectorcrypt-kernel`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The exit status of `kernel-oracle.sh run` when the guest never ran the script (it then says
/// why in one line on stderr).
pub const GUEST_FAILED: i32 = 125;

/// Where the prepared kernel is; a test fails (naming the set-up command) if it is not there.
pub fn dir() -> PathBuf {
    let dir = std::env::var_os("SECTORCRYPT_KERNEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/sectorcrypt-kernel"));
    assert!(
        dir.join("release").is_file() && dir.join("initrd.img").is_file(),
        "no oracle kernel in {}: run scripts/kernel-oracle.sh prepare {} (scripts/test.sh does)",
        dir.display(),
        dir.display()
    );
    dir
}

/// `scripts/<name>` of this repository (the oracle's own scripts and the guest-side ones).
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// Runs `script args...` as root inside the guest, in `work` (shared with the guest at the same
/// path, writable; its `kernel-oracle/` subfolder holds the console log and the guest's
/// `dmesg`). Its output comes back as stdout; its exit status as the status, or
/// [`GUEST_FAILED`] with the reason on stderr.
pub fn run(work: &Path, script: &Path, args: &[&str]) -> Output {
    run_with(work, script, args, &[])
}

/// [`run`], with `env` set for `kernel-oracle.sh` (e.g. `SECTORCRYPT_ORACLE_APPEND`).
pub fn run_with(work: &Path, script: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(self::script("kernel-oracle.sh"))
        .arg("run")
        .arg(dir())
        .arg(work)
        .arg(script)
        .args(args)
        .envs(env.iter().copied());
    crate::output(&mut cmd)
}
