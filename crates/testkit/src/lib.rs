//! What the tests of every sectorcrypt crate share. Dev-only: crates take it as a
//! `[dev-dependency]`, never as a dependency.
//!
//! The helpers here exist so that the suite passes on any x86-64 host, whatever its CPU vendor,
//! clock or load, while still running the real tools:
//!
//! - [`tools`]: the real peer programs, with what it takes to make them behave on every host
//!   (qemu-img's PBKDF2 calibration gives up on a CPU that is too fast for it; it is then run
//!   again under qemu-user, which is slow enough).
//! - [`fault`]: a real process stopped at an exact point of its I/O (before its n-th write), by
//!   strace's fault injection, so that "killed at a random moment" is a seeded random write and
//!   never a race against the clock.
//! - [`sweep`]: power cut after every write and sync of an operation, every surviving image the
//!   crash model allows checked (`sectorcrypt_storage::crash`).

pub mod fault;
pub mod sweep;
pub mod tools;

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Run `cmd` with no standard input (nothing may wait for a terminal) and collect its output; a
/// program that cannot start is a test failure that names the set-up script.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (run scripts/install-test-deps.sh)"))
}

/// Where `program` is on `PATH`.
pub fn which(program: impl AsRef<OsStr>) -> Option<PathBuf> {
    let program = program.as_ref();
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// `wrapper FRONT... PROGRAM ARGS...`: `cmd` (its arguments, environment and working directory)
/// run under a wrapper such as strace or qemu-user, with `program` in place of `cmd`'s own.
fn wrapped(wrapper: &str, front: &[OsString], program: &OsStr, cmd: &Command) -> Command {
    let mut w = Command::new(wrapper);
    w.args(front).arg(program).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => w.env(k, v),
            None => w.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        w.current_dir(dir);
    }
    w
}
