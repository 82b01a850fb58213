//! The real peer tools, run so that they work on every host.

use std::path::Path;
use std::process::{Command, Output};

use crate::{ok, output, p, which, wrapped};

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

/// The volume images `ubireader_extract_images` (PyPI `ubi_reader`) extracts from the UBI image
/// or raw flash dump `file`, by volume name (it writes them under `dir/out`).
pub fn ubi_reader_volumes(dir: &Path, file: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let out = dir.join("out");
    let _ = std::fs::remove_dir_all(&out);
    ok(
        output(Command::new("ubireader_extract_images").args(["-o", p(&out), p(file)])),
        "ubireader_extract_images",
    );
    let mut volumes = std::collections::BTreeMap::new();
    for image in std::fs::read_dir(&out)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
    {
        let path = image.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(vol) = name
            .split("_vol-")
            .nth(1)
            .and_then(|v| v.strip_suffix(".ubifs"))
        {
            volumes.insert(vol.to_string(), std::fs::read(&path).unwrap());
        }
    }
    volumes
}
