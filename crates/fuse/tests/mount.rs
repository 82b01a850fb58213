//! Two volumes over `MemStorage` mounted for real as two files of one mount, as `sectorcrypt
//! flash attach` mounts its UBI volumes: each file answers from its own volume only. Needs
//! /dev/fuse and root (or fusermount3), as the CLI's FUSE tests do; the mount is taken down
//! again by a guard, also when the test fails.

use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use rustix::io::Errno;
use sectorcrypt_fuse::{BadName, Error, MountFile, MountOptions, MountSession};
use sectorcrypt_storage::MemStorage;

mod support;

use support::{mem_volume as volume, scratch};

/// A mount that is taken down when dropped, so that a failing test leaves nothing mounted.
struct Mounted(Option<MountSession>);

impl Mounted {
    fn close(mut self) {
        let mut session = self.0.take().unwrap();
        session.unmount().unwrap();
        session.close().unwrap();
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut session) = self.0.take() {
            let _ = session.unmount();
            let _ = session.close();
        }
    }
}

#[test]
fn two_volumes_are_two_files_each_with_its_own_size_and_mode() {
    let dir = scratch("two-files");
    let mountpoint = dir.join("mnt");
    fs::create_dir(&mountpoint).unwrap();

    let data_storage = Arc::new(MemStorage::new(vec![0; 1 << 20]));
    let rootfs_storage = Arc::new(MemStorage::new(vec![0; 64 << 10]));
    // What the read-only file holds: written through a writable volume before mounting.
    let pattern: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    volume(&rootfs_storage, 4096, false)
        .write(&pattern, 0)
        .unwrap();
    let files = vec![
        MountFile {
            name: "data".into(),
            volume: volume(&data_storage, 512, false),
        },
        MountFile {
            name: "rootfs".into(),
            volume: volume(&rootfs_storage, 4096, true),
        },
    ];
    let options = MountOptions { threads: 2 };
    let mounted = Mounted(Some(
        sectorcrypt_fuse::mount(files, &mountpoint, &options).unwrap(),
    ));

    let names: Vec<_> = fs::read_dir(&mountpoint)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["data", "rootfs"]);
    let (data, rootfs) = (mountpoint.join("data"), mountpoint.join("rootfs"));
    let mode = |path: &Path| {
        let meta = fs::metadata(path).unwrap();
        (meta.len(), meta.permissions().mode() & 0o7777)
    };
    assert_eq!(mode(&data), (1 << 20, 0o600));
    assert_eq!(mode(&rootfs), (64 << 10, 0o400));
    assert_eq!(
        fs::metadata(mountpoint.join("volume")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let stat = rustix::fs::statvfs(&mountpoint).unwrap();
    assert_eq!(stat.f_blocks * stat.f_frsize, (1 << 20) + (64 << 10));

    // Written through one file, read back through it; the other is unaffected.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&data)
        .unwrap();
    file.write_all_at(b"through data", 4000).unwrap();
    file.sync_all().unwrap();
    let mut back = [0u8; 12];
    file.read_exact_at(&mut back, 4000).unwrap();
    assert_eq!(&back, b"through data");
    // Writes stop at the end of their own file, not at the end of the larger one.
    assert_eq!(file.write_at(b"abcd", (1 << 20) - 2).unwrap(), 2);
    assert_eq!(fs::read(&rootfs).unwrap(), pattern);

    // The read-only file refuses writes: EROFS from the file system, or EACCES from the
    // kernel's mode check (0400) for a user other than root.
    let refused = OpenOptions::new().write(true).open(&rootfs).unwrap_err();
    let errno = Errno::from_io_error(&refused);
    assert!(
        errno == Some(Errno::ROFS) || errno == Some(Errno::ACCESS),
        "{refused}"
    );
    drop(file);
    mounted.close();

    // What went through "data" is on its storage, encrypted.
    let mut stored = [0u8; 12];
    volume(&data_storage, 512, true)
        .read(&mut stored, 4000)
        .unwrap();
    assert_eq!(&stored, b"through data");
    let raw = data_storage.contents();
    assert!(!raw.windows(12).any(|w| w == b"through data"));
    let mut untouched = vec![0u8; pattern.len()];
    volume(&rootfs_storage, 4096, true)
        .read(&mut untouched, 0)
        .unwrap();
    assert_eq!(untouched, pattern);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_names_are_refused_before_anything_is_mounted() {
    let dir = scratch("bad-names");
    let storage = Arc::new(MemStorage::new(vec![0; 8192]));
    let file = |name: &str| MountFile {
        name: name.into(),
        volume: volume(&storage, 512, false),
    };
    let options = MountOptions::default();
    // The mount point does not even exist: the names are checked first.
    let missing = dir.join("missing");
    let cases = [
        (vec![file("a"), file("a")], BadName::Duplicate),
        (vec![file("..")], BadName::Dot),
        (vec![file("a/b")], BadName::Slash),
    ];
    for (files, want) in cases {
        match sectorcrypt_fuse::mount(files, &missing, &options) {
            Err(Error::FileName { reason, .. }) => assert_eq!(reason, want),
            Err(e) => panic!("{want:?}: {e}"),
            Ok(_) => panic!("{want:?}: mounted"),
        }
    }
    assert!(matches!(
        sectorcrypt_fuse::mount(Vec::new(), &missing, &options),
        Err(Error::NoFiles)
    ));
    fs::remove_dir_all(&dir).unwrap();
}
