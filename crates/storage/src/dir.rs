//! Files made and renamed in a directory, behind a trait, so that crash tests can model what a
//! power cut does to them: [`FsDirectory`] is a real directory; `crash::CrashingDirectory` keeps,
//! like a file system, new names and renames volatile until the directory is synced.
//!
//! [`install_file`] is the one way sectorcrypt makes a header file: written beside its final
//! name, synced, renamed over it, and the directory synced. A rename is durable only once the
//! directory is synced, and a caller that goes on to convert data on the strength of a header
//! file must know that file survives a crash.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::{FileStorage, Storage};

/// A directory holding files by name.
pub trait Directory: Send + Sync {
    /// Create the file `name` (mode 0600) holding `len` zero bytes; an existing file is an error.
    fn create(&self, name: &str, len: u64) -> io::Result<Box<dyn Storage>>;
    /// Open the file `name` for reading and writing.
    fn open(&self, name: &str) -> io::Result<Box<dyn Storage>>;
    /// Whether the file `name` exists.
    fn exists(&self, name: &str) -> bool;
    /// Remove the file `name`, if it exists.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Rename `from` to `to`, replacing `to`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Make the names created, removed and renamed so far durable.
    fn sync(&self) -> io::Result<()>;
    /// A path for messages.
    fn path_of(&self, name: &str) -> PathBuf;
}

/// A directory of the real file system.
#[derive(Debug, Clone)]
pub struct FsDirectory {
    path: PathBuf,
}

impl FsDirectory {
    /// The directory `path`.
    pub fn new(path: &Path) -> Self {
        FsDirectory {
            path: path.to_path_buf(),
        }
    }

    /// The directory holding `file` (the current directory for a bare name), and the file's name
    /// in it.
    pub fn of(file: &Path) -> io::Result<(Self, String)> {
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = file.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a file name", file.display()),
            )
        })?;
        Ok((FsDirectory::new(dir), name.to_string()))
    }
}

impl Directory for FsDirectory {
    fn create(&self, name: &str, len: u64) -> io::Result<Box<dyn Storage>> {
        let path = self.path.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        file.set_len(len)?;
        drop(file);
        Ok(Box::new(FileStorage::open(&path)?))
    }

    fn open(&self, name: &str) -> io::Result<Box<dyn Storage>> {
        Ok(Box::new(FileStorage::open(&self.path.join(name))?))
    }

    fn exists(&self, name: &str) -> bool {
        self.path.join(name).exists()
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.path.join(from), self.path.join(to))
    }

    fn sync(&self) -> io::Result<()> {
        File::open(&self.path)?.sync_all()
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

/// Make `bytes` the new file `name` in `dir` atomically and durably: written to `NAME.new` and
/// synced, renamed over `name`, and the directory synced. After a crash `name` holds what it held
/// before or all of `bytes`, never part of them; once this returns, it holds `bytes` for good.
pub fn install_file(dir: &dyn Directory, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = format!("{name}.new");
    dir.remove(&tmp)?;
    let file = dir.create(&tmp, bytes.len() as u64)?;
    file.write_at(bytes, 0)?;
    file.sync()?;
    drop(file);
    rename_durably(dir, &tmp, name)
}

/// Rename `from` to `to` in `dir` and sync the directory, which makes the rename durable.
pub fn rename_durably(dir: &dyn Directory, from: &str, to: &str) -> io::Result<()> {
    dir.rename(from, to)?;
    dir.sync()
}
