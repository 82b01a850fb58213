//! Unlocked volumes as regular files, through FUSE: each [`MountFile`] becomes
//! `MOUNTPOINT/<name>`, readable and writable with ordinary file I/O, so that `mkfs.ext4`,
//! `losetup`, `fuse2fs` or a plain `dd` work on the decrypted data without device-mapper or any
//! kernel module beyond `fuse`. `sectorcrypt mount` shows its one volume as `volume`;
//! `sectorcrypt flash attach` shows every UBI volume under its own name, in one mount, so that
//! they share one FUSE session, one set of threads and one unmount.
//!
//! # The file system
//!
//! One directory (inode 1, mode 0555) listing the files in the order given (file `i` is inode
//! `2 + i`). Names are checked before mounting: at least one file, each name non-empty, at most
//! 255 bytes, without '/' or NUL, not "." or "..", and unique ([`Error::FileName`] names the
//! first that is not). Each file answers from its own volume alone: its size is that volume's
//! payload size and never changes, its mode 0600 (0400 when the volume is read-only), its
//! owner the user who mounted it. Reads and writes go to [`Volume::read`] and
//! [`Volume::write`] at any byte offset and length (the volume does the read-modify-write of
//! partial sectors); reads at or past the end return short, as for any file, and writes past it
//! fail with ENOSPC. `fsync` and `close` (FUSE `flush`) make completed writes to that file
//! durable with [`Volume::flush`], and only when it was written since its last flush. Truncation
//! to another size, chmod and chown fail with EPERM; `fallocate` can zero a range but not punch
//! a hole (see `fs::fallocate_plan` for why). Writes to a file whose volume is read-only fail
//! with EROFS while the other files stay writable; the mount itself is read-only when every
//! volume is.
//!
//! # Caching
//!
//! The kernel's page cache stays on (no `direct_io`): small and repeated reads, `mmap` and the
//! loop driver's buffered I/O all want it, and it is coherent because every change to a file
//! comes through this one mount. Writes are write-through (no `writeback_cache`): a `write(2)`
//! returns only once the volume has encrypted the data and written it to its storage, so nothing
//! is left dirty in the kernel when the mount goes away, and `fsync` has only the storage to
//! flush. Attributes are cached for a day; they cannot change. Requests are served by
//! [`MountOptions::threads`] threads, each on its own clone of the FUSE device, and the kernel
//! may send them as large as it allows (fuser asks for 16 MiB; Linux caps this at its
//! `max_pages_limit`, 1 MiB by default).
//!
//! # Lifetime
//!
//! [`mount`] checks the mount point (an existing, empty directory that is not already a mount
//! point), takes SIGINT and SIGTERM (`sectorcrypt_secret::signals`, on a thread of their own: no
//! handler runs on a serving thread), mounts and answers requests on background threads.
//! [`MountSession::wait`] returns when the file system is unmounted from outside
//! (`fusermount3 -u`, `umount`) or a signal arrives; [`MountSession::unmount`] then unmounts,
//! and [`MountSession::close`] waits for the kernel to let go and flushes every file's volume
//! (there rather than in FUSE's `destroy`, which has no way to report a failure). A mount still
//! in use (a loop device on one of its files, an open file) is detached instead, as `umount -l`
//! does: it disappears from the tree at once and is served until its last user closes it, so
//! that no write in flight is lost.

mod fs;
mod mountpoint;
#[cfg(test)]
#[path = "../tests/support/mod.rs"]
mod support;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use fuser::{Config, MountOption, Session, SessionACL};
use rustix::mount::UnmountFlags;
use sectorcrypt_secret::signals::{self, Subscription, SIGINT, SIGTERM};
use sectorcrypt_volume::Volume;

pub use crate::mountpoint::check_mountpoint;

/// One regular file of a mount: its name in the root directory and the volume behind it.
#[derive(Clone, Debug)]
pub struct MountFile {
    /// The file's name: non-empty, at most 255 bytes, no '/' or NUL, not "." or "..".
    pub name: String,
    /// What the file reads and writes; its size and read-only state are the file's.
    pub volume: Arc<Volume>,
}

/// Why a mount point cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Busy {
    /// It is not a directory.
    NotDirectory,
    /// The directory has entries, which the mount would hide.
    NotEmpty,
    /// Something is mounted there already.
    Mounted,
    /// A FUSE file system whose process is gone is still mounted there.
    Stale,
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Busy::NotDirectory => "it is not a directory",
            Busy::NotEmpty => "the directory is not empty",
            Busy::Mounted => "something is already mounted there",
            Busy::Stale => "a file system whose process has gone is still mounted there (fusermount3 -u clears it)",
        })
    }
}

/// Why a file name cannot be used in the root directory of a mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BadName {
    /// The name is empty.
    Empty,
    /// The name is longer than 255 bytes (Linux's `NAME_MAX`).
    TooLong,
    /// The name holds a '/'.
    Slash,
    /// The name holds a NUL byte.
    Nul,
    /// The name is "." or "..".
    Dot,
    /// An earlier file has the same name.
    Duplicate,
}

impl fmt::Display for BadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadName::Empty => "a file name cannot be empty",
            BadName::TooLong => "a file name can have at most 255 bytes",
            BadName::Slash => "a file name cannot contain '/'",
            BadName::Nul => "a file name cannot contain a NUL byte",
            BadName::Dot => "\".\" and \"..\" name directories",
            BadName::Duplicate => "another file has the same name",
        })
    }
}

/// What went wrong while mounting or serving.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The mount point does not exist.
    NoMountpoint(PathBuf),
    /// The mount point exists but cannot take a mount.
    MountpointBusy {
        /// The mount point as given.
        path: PathBuf,
        /// What is in the way.
        reason: Busy,
    },
    /// The mount point could not be inspected.
    Mountpoint {
        /// The mount point as given.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The kernel or fusermount3 refused the mount (no `/dev/fuse`, no permission, ...).
    Mount {
        /// The mount point.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The signals or the serving threads could not be set up.
    Setup(io::Error),
    /// Unmounting failed.
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Serving stopped on an error from the FUSE device.
    Session(io::Error),
    /// The final flush failed: what was written may not be durable.
    Flush(sectorcrypt_volume::Error),
    /// [`mount`] was given no files.
    NoFiles,
    /// A file cannot have this name in the root directory.
    FileName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: BadName,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoMountpoint(p) => write!(f, "mount point {} does not exist", p.display()),
            Error::MountpointBusy { path, reason } => {
                write!(f, "cannot mount on {}: {reason}", path.display())
            }
            Error::Mountpoint { path, source } => {
                write!(f, "cannot use {} as a mount point: {source}", path.display())
            }
            Error::Mount { path, source } => write!(
                f,
                "cannot mount on {}: {source} (FUSE needs /dev/fuse, and fusermount3 from the fuse3 package when not root)",
                path.display()
            ),
            Error::Setup(e) => write!(f, "cannot set up the FUSE session: {e}"),
            Error::Unmount { path, source } => {
                write!(f, "cannot unmount {}: {source}", path.display())
            }
            Error::Session(e) => write!(f, "the FUSE session failed: {e}"),
            Error::Flush(e) => write!(f, "cannot flush the volume: {e}"),
            Error::NoFiles => f.write_str("nothing to mount: no files were given"),
            // Debug quoting, so that an empty name, a NUL or a newline shows on one line.
            Error::FileName { name, reason } => {
                write!(f, "cannot mount a file named {name:?}: {reason}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Mountpoint { source, .. }
            | Error::Mount { source, .. }
            | Error::Unmount { source, .. } => Some(source),
            Error::Setup(e) | Error::Session(e) => Some(e),
            Error::Flush(e) => Some(e),
            _ => None,
        }
    }
}

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Threads answering requests (each reads its own clone of the FUSE device).
    pub threads: usize,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions { threads: 1 }
    }
}

/// Why [`MountSession::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The file system was unmounted from outside.
    Unmounted,
    /// SIGINT or SIGTERM (the number) arrived; the file system is still mounted.
    Signal(i32),
}

/// How [`MountSession::unmount`] went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Unmounted (or it already was).
    Now,
    /// Still in use: detached from the tree, served until its last user closes it.
    WhenClosed,
}

/// What the serving threads report to [`MountSession`].
enum Event {
    Ended(io::Result<()>),
    Signal(i32),
}

/// A mounted set of files.
///
/// Call [`close`](MountSession::close) before dropping it: that waits for the kernel to let
/// go of the file system and flushes every file's volume.
pub struct MountSession {
    mountpoint: PathBuf,
    /// Every file's volume, in order, for the final flush.
    volumes: Vec<Arc<Volume>>,
    events: Receiver<Event>,
    /// The session's result, once it has ended.
    ended: Option<io::Result<()>>,
    session: JoinHandle<()>,
    /// Sends SIGINT and SIGTERM to `events` while it lives.
    signals: Subscription,
}

/// Mount `files` as regular files in `mountpoint` (the root directory lists them in this
/// order) and serve them on background threads.
///
/// The names are checked first ([`Error::NoFiles`], [`Error::FileName`]), then the mount point
/// ([`check_mountpoint`]). SIGINT and SIGTERM no longer end the process from here on: they are
/// reported by [`MountSession::wait`] (registered before mounting, so that a signal cannot end
/// the process while the file system is mounted).
pub fn mount(
    files: Vec<MountFile>,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<MountSession, Error> {
    fs::check_names(files.iter().map(|f| f.name.as_str()))?;
    let mountpoint = check_mountpoint(mountpoint)?;
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let volumes: Vec<_> = files.iter().map(|f| Arc::clone(&f.volume)).collect();
    let read_only = volumes.iter().all(|v| v.is_read_only());
    let fs = fs::VolumeFs::new(files, uid, gid);
    let (tx, events) = mpsc::channel();
    let on_signal = tx.clone();
    // Before the mount, so that a signal cannot end the process while it is mounted.
    let signals = signals::subscribe(&[SIGINT, SIGTERM], move |signal| {
        let _ = on_signal.send(Event::Signal(signal));
    })
    .map_err(Error::Setup)?;
    let session = Session::new(fs, &mountpoint, &config(read_only, options)).map_err(|source| {
        Error::Mount {
            path: mountpoint.clone(),
            source,
        }
    })?;
    // If this spawn fails, dropping `session` unmounts.
    let session = thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || {
            let _ = tx.send(Event::Ended(session.run()));
        })
        .map_err(Error::Setup)?;
    Ok(MountSession {
        mountpoint,
        volumes,
        events,
        ended: None,
        session,
        signals,
    })
}

/// The session configuration: mount options and threads. The mount is read-only when every
/// volume is (`read_only`): then the kernel refuses writes before they reach us; otherwise
/// each read-only file refuses them itself with EROFS.
fn config(read_only: bool, options: &MountOptions) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("sectorcrypt".into()),
        MountOption::Subtype("sectorcrypt".into()),
        // The kernel checks the file's mode and owner itself.
        MountOption::DefaultPermissions,
        MountOption::NoSuid,
        MountOption::NoDev,
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    // Only the mounting user (root included when root mounted it, as for loop devices) may
    // use the file: allow_other would need user_allow_other in /etc/fuse.conf for others.
    config.acl = SessionACL::Owner;
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    config
}

impl MountSession {
    /// The mount point, canonical.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Block until the file system is unmounted from outside or SIGINT/SIGTERM arrives.
    pub fn wait(&mut self) -> Stop {
        if self.ended.is_some() {
            return Stop::Unmounted;
        }
        match self.events.recv() {
            Ok(Event::Signal(signal)) => Stop::Signal(signal),
            Ok(Event::Ended(result)) => {
                self.ended = Some(result);
                Stop::Unmounted
            }
            // The session thread always reports before it goes, and the signals' subscription
            // lives until `close`: both senders gone means the session thread died.
            Err(_) => {
                self.ended = Some(Err(io::Error::other("the FUSE session thread died")));
                Stop::Unmounted
            }
        }
    }

    /// Unmount the file system, or detach it if it is in use.
    pub fn unmount(&mut self) -> Result<Unmounted, Error> {
        if self.ended.is_some() {
            return Ok(Unmounted::Now);
        }
        unmount_path(&self.mountpoint).map_err(|source| Error::Unmount {
            path: self.mountpoint.clone(),
            source,
        })
    }

    /// Wait until the kernel has let go of the file system (after [`wait`](Self::wait)
    /// returned [`Stop::Unmounted`] or after [`unmount`](Self::unmount); signals meanwhile are
    /// ignored), then flush every file's volume (all of them, even after a failure, so that
    /// one broken volume costs no other its writes; the first failure is returned).
    pub fn close(mut self) -> Result<(), Error> {
        let ended = loop {
            if let Some(ended) = self.ended.take() {
                break ended;
            }
            self.wait();
        };
        drop(self.signals);
        let _ = self.session.join();
        // Flush even when serving failed: whatever was written should be kept.
        // Every volume is flushed (fold runs them all); `and` keeps the first failure.
        let flushed = (self.volumes.iter())
            .map(|v| v.flush())
            .fold(Ok(()), Result::and)
            .map_err(Error::Flush);
        match ended {
            // The kernel ended the connection (seen at the end of a detached mount's last
            // user as ECONNABORTED rather than ENODEV): nothing was left to serve.
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            ended => ended.map_err(Error::Session)?,
        }
        flushed
    }
}

/// Unmount `path`: at once if nothing uses it, else detached (`umount -l`).
fn unmount_path(path: &Path) -> io::Result<Unmounted> {
    match rustix::mount::unmount(path, UnmountFlags::empty()) {
        // EINVAL: not a mount point (any more): someone unmounted it first.
        Ok(()) | Err(rustix::io::Errno::INVAL) => Ok(Unmounted::Now),
        Err(rustix::io::Errno::BUSY) => {
            rustix::mount::unmount(path, UnmountFlags::DETACH)?;
            Ok(Unmounted::WhenClosed)
        }
        // Only root may unmount; others go through the setuid helper, as fuser does.
        Err(rustix::io::Errno::PERM) => {
            if fusermount(path, &[])? {
                Ok(Unmounted::Now)
            } else if fusermount(path, &["-z"])? {
                Ok(Unmounted::WhenClosed)
            } else {
                Err(io::Error::other("fusermount3 -u -z failed"))
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Run `fusermount3 -u EXTRA PATH` quietly; whether it succeeded.
fn fusermount(path: &Path, extra: &[&str]) -> io::Result<bool> {
    let status = signals::unblock_in_child(&mut Command::new("fusermount3"))
        .args(["-u", "-q"])
        .args(extra)
        .arg("--")
        .arg(path)
        .status()?;
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_one_sentence() {
        let busy = Error::MountpointBusy {
            path: "/mnt/x".into(),
            reason: Busy::NotEmpty,
        };
        assert_eq!(
            busy.to_string(),
            "cannot mount on /mnt/x: the directory is not empty"
        );
        let missing = Error::NoMountpoint("/nope".into());
        assert_eq!(missing.to_string(), "mount point /nope does not exist");
        let name = Error::FileName {
            name: "a\nb/c".into(),
            reason: BadName::Slash,
        };
        assert_eq!(
            name.to_string(),
            r#"cannot mount a file named "a\nb/c": a file name cannot contain '/'"#
        );
        for e in [busy, missing, name, Error::NoFiles] {
            assert!(!e.to_string().contains('\n'));
        }
    }
}
