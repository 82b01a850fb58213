//! Device locks: one writer per device, as QEMU locks its images.
//!
//! Two processes writing one volume corrupt it silently: a server keeps writing with the old key
//! into areas a conversion has already rewritten with the new one. So every process that may
//! write a file, block device or flash image holds an exclusive lock on it for as long as it has
//! it open, and every process that serves its data read-only holds a shared one. A second writer,
//! or a writer beside a reader, is refused at once with [`io::ErrorKind::ResourceBusy`] and a
//! message naming the holder.
//!
//! Why these locks:
//!
//! - Open-file-description (OFD) `fcntl` locks, as QEMU uses: they belong to the open file, not
//!   to the process (closing another descriptor of the same file does not drop them, unlike
//!   classic POSIX locks), and the kernel drops them with the last descriptor, so a process killed
//!   with SIGKILL leaves no stale lock behind: there is no lock file. A process that lets a lock
//!   go unlocks it explicitly, because a child it forks meanwhile shares the open file until it
//!   execs, and would otherwise keep the lock for that moment.
//! - The whole file is locked, not a byte of it: QEMU's own locks (bytes 100 and up, taken by
//!   qemu-img, qemu-nbd and virtual machines on a raw image) then conflict with a sectorcrypt
//!   writer too, which is what a user who points both at one image needs.
//! - Reading the header alone (`dump`, `test-passphrase`, `is-luks`) takes no lock, as cryptsetup
//!   allows `luksDump` on an active device.
//!
//! Within one process a device is locked once: a command that opens the same file twice (its
//! header and its data) shares one lock, upgraded from shared to exclusive if a later open
//! writes; a second open of its own never finds itself in the way.
//!
//! `--disable-locks` ([`disable`]) turns all of this off for a user who knows better.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use nix::fcntl::{fcntl, FcntlArg};

/// What a lock allows others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A reader: other readers may come, writers may not.
    Shared,
    /// A writer: nobody else.
    Exclusive,
}

/// A held lock on one device (a file's inode); released when the last clone is dropped and
/// the file that took it is closed.
#[derive(Debug, Clone)]
pub struct DeviceLock {
    held: Arc<Held>,
}

impl DeviceLock {
    /// What this lock allows others now (a shared lock may have been upgraded since).
    pub fn access(&self) -> Access {
        self.held.state().1
    }
}

#[derive(Debug)]
struct Held {
    /// The open file description the lock belongs to (a duplicate of an opener's), and the
    /// lock's kind.
    state: Mutex<(File, Access)>,
}

impl Held {
    fn state(&self) -> std::sync::MutexGuard<'_, (File, Access)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Held {
    /// Unlock explicitly rather than by closing: a child forked meanwhile (any `Command` of this
    /// process, until it execs) shares the open file description, and closing ours would leave
    /// the lock held by it, refusing this process's next open of the device.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let _ = set(&state.0, None);
    }
}

static ENABLED: AtomicBool = AtomicBool::new(true);
/// A file's identity: its device and inode numbers.
type Inode = (u64, u64);

/// The locks this process holds, by inode.
static HELD: Mutex<Vec<(Inode, Weak<Held>)>> = Mutex::new(Vec::new());

/// Take no locks from now on in this process (`--disable-locks`).
pub fn disable() {
    ENABLED.store(false, Ordering::SeqCst);
}

/// Whether this process takes locks.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Lock `file` (opened from `path`, named in messages) for `access`, or share the lock this
/// process already holds on the same inode. `None` when locks are disabled.
pub fn lock(file: &File, path: &Path, access: Access) -> io::Result<Option<DeviceLock>> {
    if !enabled() {
        return Ok(None);
    }
    let meta = file.metadata()?;
    let inode = (meta.dev(), meta.ino());
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    held.retain(|(_, h)| h.strong_count() > 0);
    if let Some(mine) = held
        .iter()
        .filter(|(i, _)| *i == inode)
        .find_map(|(_, h)| h.upgrade())
    {
        let mut state = mine.state();
        if access == Access::Exclusive && state.1 == Access::Shared {
            // A write lock needs a descriptor open for writing, and two open file descriptions
            // conflict even within one process: the shared lock is let go, the exclusive one
            // taken on this opener's file, and the shared one taken back if that fails.
            let file = file.try_clone()?;
            set(&state.0, None).map_err(|e| refused(e, path, inode))?;
            if let Err(e) = set(&file, Some(Access::Exclusive)) {
                let _ = set(&state.0, Some(Access::Shared));
                return Err(refused(e, path, inode));
            }
            *state = (file, Access::Exclusive);
        }
        drop(state);
        return Ok(Some(DeviceLock { held: mine }));
    }
    let file = file.try_clone()?;
    set(&file, Some(access)).map_err(|e| refused(e, path, inode))?;
    let mine = Arc::new(Held {
        state: Mutex::new((file, access)),
    });
    held.push((inode, Arc::downgrade(&mine)));
    Ok(Some(DeviceLock { held: mine }))
}

/// An OFD lock on the whole file, or none, without waiting.
fn set(file: &File, access: Option<Access>) -> nix::Result<()> {
    let flock = nix::libc::flock {
        l_type: match access {
            Some(Access::Shared) => nix::libc::F_RDLCK,
            Some(Access::Exclusive) => nix::libc::F_WRLCK,
            None => nix::libc::F_UNLCK,
        } as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        // Must be 0 for OFD locks.
        l_pid: 0,
    };
    fcntl(file, FcntlArg::F_OFD_SETLK(&flock)).map(drop)
}

fn refused(e: nix::errno::Errno, path: &Path, inode: Inode) -> io::Error {
    if e != nix::errno::Errno::EAGAIN && e != nix::errno::Errno::EACCES {
        return io::Error::other(format!("cannot lock {}: {e}", path.display()));
    }
    let holder = holders(inode)
        .into_iter()
        .find(|pid| *pid != std::process::id())
        .map(|pid| format!(" (pid {pid}{})", describe(pid)))
        .unwrap_or_default();
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "Device {} is in use by another process{holder}; stop it first, or pass \
             --disable-locks if you are sure nothing else writes it.",
            path.display()
        ),
    )
}

/// The processes that hold locks on `inode`. `/proc/locks` does not say who holds an OFD lock
/// (its pid is -1), but each holder's `/proc/PID/fdinfo/FD` lists the locks of that open file
/// ("lock: 1: OFDLCK ADVISORY WRITE -1 fe:00:9977993 0 EOF"). Only processes this user may
/// inspect are seen.
pub fn holders(inode: Inode) -> Vec<u32> {
    let (dev, ino) = inode;
    let wanted = format!(
        "{:02x}:{:02x}:{ino}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    let mut pids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fdinfo")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_to_string(fd.path()).is_ok_and(|info| {
                info.lines()
                    .any(|l| l.starts_with("lock:") && l.split_whitespace().any(|f| f == wanted))
            })
        });
        if holds {
            pids.push(pid);
        }
    }
    pids
}

/// ": sectorcrypt serve v.img ..." for a pid whose command line can be read (at most 80
/// characters of it: enough to recognise the command).
fn describe(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut args = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned());
    let Some(program) = args.next() else {
        return String::new();
    };
    let name = Path::new(&program)
        .file_name()
        .map_or_else(|| program.clone(), |n| n.to_string_lossy().into_owned());
    let mut text = std::iter::once(name)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ");
    if text.chars().count() > 80 {
        text = text.chars().take(77).collect::<String>() + "...";
    }
    format!(": {text}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn scratch_file(name: &str) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("sectorcrypt-lock-{name}-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        path
    }

    /// Whether another process (flock(1) cannot take OFD locks; python's fcntl can) gets an
    /// exclusive OFD lock on `path` right now.
    fn other_process_can_lock(path: &Path, exclusive: bool) -> bool {
        let kind = if exclusive { "F_WRLCK" } else { "F_RDLCK" };
        let script = format!(
            "import fcntl, struct, sys\nf = open(sys.argv[1], 'rb+')\n\
             try:\n    fcntl.fcntl(f, 37, struct.pack('hhqqi4x', fcntl.{kind}, 0, 0, 0, 0))\n\
             except OSError:\n    sys.exit(1)\n"
        );
        Command::new("python3")
            .args(["-c", &script])
            .arg(path)
            .stdin(Stdio::null())
            .status()
            .expect("python3")
            .success()
    }

    #[test]
    fn a_writer_excludes_other_processes_and_one_process_shares_its_lock() {
        let path = scratch_file("own");
        let a = File::options().read(true).write(true).open(&path).unwrap();
        let b = File::open(&path).unwrap();
        let shared = lock(&b, &path, Access::Shared).unwrap().unwrap();
        assert!(other_process_can_lock(&path, false), "readers share");
        assert!(
            !other_process_can_lock(&path, true),
            "a reader keeps writers out"
        );
        // A second open in this process for writing upgrades the one lock.
        let exclusive = lock(&a, &path, Access::Exclusive).unwrap().unwrap();
        assert_eq!(shared.access(), Access::Exclusive);
        assert!(
            !other_process_can_lock(&path, false),
            "a writer keeps readers out"
        );
        // Released with the last handle and the files (an OFD lock lives as long as any
        // descriptor of the open file that took it).
        drop((shared, exclusive, a, b));
        assert!(other_process_can_lock(&path, true));
        std::fs::remove_file(&path).unwrap();
    }

    /// A child that inherited the locked open file description (as any child does between its
    /// fork and its exec) does not keep the device locked once this process lets it go.
    #[test]
    fn a_released_lock_is_not_kept_by_a_child_sharing_the_file() {
        let path = scratch_file("child");
        let f = File::options().read(true).write(true).open(&path).unwrap();
        let held = lock(&f, &path, Access::Exclusive).unwrap().unwrap();
        // The child gets a descriptor of the locked description without close-on-exec, and
        // keeps it until it is told to exit.
        let inherited: std::os::fd::OwnedFd = std::os::fd::AsFd::as_fd(&held.held.state().0)
            .try_clone_to_owned()
            .unwrap();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&inherited);
        nix::fcntl::fcntl(&inherited, FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).unwrap();
        let mut child = Command::new("sh")
            .args([
                "-c",
                &format!("test -e /proc/self/fd/{raw} || exit 3; read line; exit 0"),
            ])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        drop(inherited);
        drop((held, f));
        assert!(
            other_process_can_lock(&path, true),
            "the lock went with this process's last handle"
        );
        let again = File::options().read(true).write(true).open(&path).unwrap();
        assert!(lock(&again, &path, Access::Exclusive).unwrap().is_some());
        drop(child.stdin.take());
        assert!(
            child.wait().unwrap().success(),
            "the child held the descriptor"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn another_holder_is_refused_as_busy_with_its_pid() {
        let path = scratch_file("busy");
        let mut holder = Command::new("python3")
            .args([
                "-c",
                "import fcntl, struct, sys\nf = open(sys.argv[1], 'rb+')\n\
                 fcntl.fcntl(f, 37, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))\n\
                 print('locked', flush=True)\nsys.stdin.read()\n",
            ])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "locked\n");
        let f = File::options().read(true).write(true).open(&path).unwrap();
        let err = lock(&f, &path, Access::Shared).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy);
        let text = err.to_string();
        assert!(text.contains(&format!("pid {}", holder.id())), "{text}");
        assert!(text.contains("python3"), "{text}");
        drop(holder.stdin.take());
        holder.wait().unwrap();
        // Gone with its process.
        assert!(lock(&f, &path, Access::Exclusive).unwrap().is_some());
        std::fs::remove_file(&path).unwrap();
    }
}
