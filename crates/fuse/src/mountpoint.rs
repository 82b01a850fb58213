//! Where a volume may be mounted: an existing, empty directory that is not a mount point
//! already. Mounting over something would hide it, and mounting over a mount that is still in
//! use would stack a second volume on top of it.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::{Busy, Error};

/// Check `path` and return it canonical (the kernel and `/proc/self/mountinfo` know it so).
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, Error> {
    let meta = fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Error::NoMountpoint(path.to_path_buf()),
        // ENOTCONN: a FUSE mount whose process is gone.
        io::ErrorKind::NotConnected => Error::MountpointBusy {
            path: path.to_path_buf(),
            reason: Busy::Stale,
        },
        _ => Error::Mountpoint {
            path: path.to_path_buf(),
            source: e,
        },
    })?;
    let busy = |reason| Error::MountpointBusy {
        path: path.to_path_buf(),
        reason,
    };
    let io_error = |source| Error::Mountpoint {
        path: path.to_path_buf(),
        source,
    };
    if !meta.is_dir() {
        return Err(busy(Busy::NotDirectory));
    }
    let canonical = fs::canonicalize(path).map_err(io_error)?;
    let mountinfo = fs::read("/proc/self/mountinfo").map_err(io_error)?;
    if mount_points(&mountinfo).any(|m| m == canonical.as_os_str().as_bytes()) {
        return Err(busy(Busy::Mounted));
    }
    if fs::read_dir(&canonical).map_err(io_error)?.next().is_some() {
        return Err(busy(Busy::NotEmpty));
    }
    Ok(canonical)
}

/// The mount points listed in `/proc/self/mountinfo` (its fifth field, unescaped).
pub(crate) fn mount_points(mountinfo: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    mountinfo
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(unescape)
}

/// Undo the kernel's octal escapes (`\040` for a space, also tab, newline and backslash).
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::scratch;

    #[test]
    fn mountinfo_fields_are_unescaped() {
        let info = b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
            95 22 0:50 / /mnt/with\\040space\\134x rw - fuse.sectorcrypt sectorcrypt rw\n";
        let points: Vec<_> = mount_points(info).collect();
        assert_eq!(points, [b"/".to_vec(), b"/mnt/with space\\x".to_vec()]);
        assert_eq!(unescape(b"a\\01"), b"a\\01");
        assert_eq!(unescape(b"tab\\011end"), b"tab\tend");
    }

    #[test]
    fn only_an_empty_directory_that_is_no_mount_point_will_do() {
        let dir = scratch("mountpoint");
        let empty = dir.join("empty");
        fs::create_dir(&empty).unwrap();
        assert_eq!(
            check_mountpoint(&empty).unwrap(),
            fs::canonicalize(&empty).unwrap()
        );

        let missing = dir.join("missing");
        assert!(matches!(check_mountpoint(&missing), Err(Error::NoMountpoint(p)) if p == missing));

        let file = dir.join("file");
        fs::write(&file, b"x").unwrap();
        let not_empty = dir.join("full");
        fs::create_dir(&not_empty).unwrap();
        fs::write(not_empty.join("x"), b"x").unwrap();
        let cases = [
            (file.as_path(), Busy::NotDirectory),
            (not_empty.as_path(), Busy::NotEmpty),
            // A mount point in every Linux system.
            (Path::new("/proc"), Busy::Mounted),
        ];
        for (path, want) in cases {
            match check_mountpoint(path) {
                Err(Error::MountpointBusy { reason, .. }) => assert_eq!(reason, want, "{path:?}"),
                other => panic!("{path:?}: {other:?}"),
            }
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
