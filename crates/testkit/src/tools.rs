//! The real peer tools, run so that they work on every host.

use std::process::{Command, Output};

use crate::{output, which, wrapped};

/// What qemu-img 7.2 says when its PBKDF2 calibration fails: it times its first 2^15 iterations
/// in whole milliseconds of thread CPU time and gives up when that is 0, whatever `iter-time`
/// asks. On a fast CPU that happens often but not always.
pub const QEMU_TOO_FAST: &str = "Unable to get accurate CPU usage";

/// How [`qemu_img`] runs qemu-img.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qemu {
    /// On the host; when the calibration fails with [`QEMU_TOO_FAST`], once more emulated.
    Native,
    /// The same qemu-img binary under qemu-user (`qemu-x86_64 /usr/bin/qemu-img ...`), tens of
    /// times slower, so its calibration always measures something.
    Emulated,
}

/// Run `cmd`, a `qemu-img` command, as `how` says: natively it is run again under qemu-user if,
/// and only if, it failed because the CPU is too fast for qemu's PBKDF2 calibration. The caller
/// checks the status.
pub fn qemu_img(how: Qemu, cmd: &mut Command) -> Output {
    assert_eq!(cmd.get_program(), "qemu-img", "not a qemu-img command");
    if how == Qemu::Native {
        let out = output(cmd);
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains(QEMU_TOO_FAST) {
            return out;
        }
    }
    let binary = which("qemu-img")
        .unwrap_or_else(|| panic!("qemu-img is not on PATH (run scripts/install-test-deps.sh)"));
    let emulator = format!("qemu-{}", std::env::consts::ARCH);
    output(&mut wrapped(&emulator, &[], binary.as_os_str(), cmd))
}
