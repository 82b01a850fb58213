//! The file system the kernel talks to: a root directory holding one regular file per
//! [`MountFile`], every request on a file answered by its own [`Volume`]. The decisions about
//! names, inodes, sizes, ranges and errors are plain functions and methods below, so that they
//! are tested without a mount.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use rustix::fs::FallocateFlags;
use sectorcrypt_volume::{Error as VolumeError, Volume};

use crate::{BadName, Error, MountFile};

/// The inode of the first file; the root directory is [`INodeNo::ROOT`] (1), file `i` is
/// `FIRST_FILE + i`. Fixed by position, so that nothing needs a table from inode to file.
const FIRST_FILE: u64 = 2;

/// The longest name a directory entry can hold on Linux (`NAME_MAX`), in bytes.
pub(crate) const NAME_MAX: usize = 255;

/// How long the kernel may cache names and attributes: nothing changes them behind its back
/// (the files and their sizes are fixed and every write comes through this mount).
const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The inode of the file at `index` in the order given to `mount`.
pub(crate) fn file_ino(index: usize) -> INodeNo {
    INodeNo(FIRST_FILE + index as u64)
}

/// Refuse what the root directory cannot list: no files at all, or a name that is empty,
/// longer than [`NAME_MAX`], holds '/' or NUL, is "." or "..", or is taken by an earlier file.
/// Checked before mounting, since the kernel would only show such a name wrongly or not at all.
pub(crate) fn check_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), Error> {
    let mut seen = HashSet::new();
    for name in names {
        let reason = if name.is_empty() {
            Some(BadName::Empty)
        } else if name.len() > NAME_MAX {
            Some(BadName::TooLong)
        } else if name.contains('/') {
            Some(BadName::Slash)
        } else if name.contains('\0') {
            Some(BadName::Nul)
        } else if name == "." || name == ".." {
            Some(BadName::Dot)
        } else if !seen.insert(name) {
            Some(BadName::Duplicate)
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(Error::FileName {
                name: name.to_owned(),
                reason,
            });
        }
    }
    if seen.is_empty() {
        return Err(Error::NoFiles);
    }
    Ok(())
}

/// One file of the mount and what it owes the next flush.
struct File {
    name: String,
    volume: Arc<Volume>,
    /// Whether a write completed since the last flush. Set *after* each write, cleared *before*
    /// each flush: a write that completes during a flush leaves it set for the next one, so no
    /// completed write is ever skipped, and a close of an untouched file costs no fdatasync.
    /// Kept per file, so that closing one file flushes no other file's volume.
    dirty: AtomicBool,
}

impl File {
    /// `result` of a write to the volume, remembered for the next flush when it succeeded (set
    /// only *after* the write completes, as the `dirty` field requires).
    fn completed_write(&self, result: Result<(), VolumeError>) -> Result<(), Errno> {
        result.map_err(|e| errno(&e))?;
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Make every completed write durable, unless none happened since the last time.
    fn flush_if_dirty(&self) -> Result<(), Errno> {
        if self.dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.volume.flush() {
                self.dirty.store(true, Ordering::Release);
                return Err(errno(&e));
            }
        }
        Ok(())
    }
}

/// The files behind the mount, and who may see them.
pub(crate) struct VolumeFs {
    /// In the order given: file `i` has inode [`file_ino`]`(i)` and is listed `i`-th.
    files: Vec<File>,
    uid: u32,
    gid: u32,
    /// All timestamps: the files have no history of their own to show.
    mounted_at: SystemTime,
}

impl VolumeFs {
    /// The file system over `files`, whose names [`check_names`] has accepted.
    pub(crate) fn new(files: Vec<MountFile>, uid: u32, gid: u32) -> Self {
        let files = files
            .into_iter()
            .map(|f| File {
                name: f.name,
                volume: f.volume,
                dirty: AtomicBool::new(false),
            })
            .collect();
        VolumeFs {
            files,
            uid,
            gid,
            mounted_at: SystemTime::now(),
        }
    }

    /// The file behind `ino`: EISDIR for the root directory, ENOENT for an inode never handed
    /// out. Every request on a file's contents passes this first.
    fn file(&self, ino: INodeNo) -> Result<&File, Errno> {
        if ino == INodeNo::ROOT {
            return Err(Errno::EISDIR);
        }
        ino.0
            .checked_sub(FIRST_FILE)
            .and_then(|i| self.files.get(usize::try_from(i).ok()?))
            .ok_or(Errno::ENOENT)
    }

    /// What [`file`](Self::file) says, and EROFS for a read-only volume: every request that
    /// changes a file's contents passes this first. The other files stay writable.
    fn writable(&self, ino: INodeNo) -> Result<&File, Errno> {
        let file = self.file(ino)?;
        if file.volume.is_read_only() {
            return Err(Errno::EROFS);
        }
        Ok(file)
    }

    /// Nothing unless `ino` is the root directory: ENOTDIR for a file, ENOENT for an inode
    /// never handed out.
    fn dir_only(&self, ino: INodeNo) -> Result<(), Errno> {
        match self.file(ino) {
            Err(Errno::EISDIR) => Ok(()),
            Ok(_) => Err(Errno::ENOTDIR),
            Err(e) => Err(e),
        }
    }

    fn attr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        match self.file(ino) {
            Ok(file) => Ok(file_attr(
                &file.volume,
                ino,
                self.uid,
                self.gid,
                self.mounted_at,
            )),
            Err(Errno::EISDIR) => Ok(dir_attr(self.uid, self.gid, self.mounted_at)),
            Err(e) => Err(e),
        }
    }

    /// The attributes of `name` in `parent`. A linear search: a mount holds a handful of files
    /// (UBI allows 128 volumes), and the kernel caches what it finds for [`TTL`].
    fn lookup_name(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        self.dir_only(parent)?;
        let index = (self.files.iter())
            .position(|f| OsStr::new(&f.name) == name)
            .ok_or(Errno::ENOENT)?;
        self.attr(file_ino(index))
    }

    /// The root directory's entries in order: ".", ".." and the files as given.
    fn dir_entries(&self) -> impl Iterator<Item = (INodeNo, FileType, &str)> {
        let dots = [".", ".."].map(|name| (INodeNo::ROOT, FileType::Directory, name));
        let files = (self.files.iter().enumerate())
            .map(|(i, f)| (file_ino(i), FileType::RegularFile, f.name.as_str()));
        dots.into_iter().chain(files)
    }

    /// `statfs`'s block size and block count: blocks of the largest preferred I/O size (so
    /// that `df` never shows a block smaller than a sector of some file), as many as all the
    /// files fill together.
    fn statfs_blocks(&self) -> (u32, u64) {
        let bsize = (self.files.iter())
            .map(|f| preferred_io(&f.volume))
            .max()
            .unwrap_or(4096);
        let total: u64 = self.files.iter().map(|f| f.volume.size()).sum();
        (bsize, total / u64::from(bsize))
    }
}

/// The attributes of the file `ino` holding `volume`: the payload size, owned by the mounting
/// user, 0600 (0400 when the volume is read-only).
pub(crate) fn file_attr(
    volume: &Volume,
    ino: INodeNo,
    uid: u32,
    gid: u32,
    time: SystemTime,
) -> FileAttr {
    let size = volume.size();
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind: FileType::RegularFile,
        perm: if volume.is_read_only() { 0o400 } else { 0o600 },
        nlink: 1,
        uid,
        gid,
        rdev: 0,
        blksize: preferred_io(volume),
        flags: 0,
    }
}

/// The root directory: 0555, nothing can be created in it.
pub(crate) fn dir_attr(uid: u32, gid: u32, time: SystemTime) -> FileAttr {
    FileAttr {
        ino: INodeNo::ROOT,
        size: 0,
        blocks: 0,
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind: FileType::Directory,
        perm: 0o555,
        nlink: 2,
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// `st_blksize`: a whole encryption sector at least, so that I/O of that size needs no
/// read-modify-write.
fn preferred_io(volume: &Volume) -> u32 {
    (volume.sector_size() as u32).max(4096)
}

/// The errno a volume error reaches the caller as.
pub(crate) fn errno(e: &VolumeError) -> Errno {
    match e {
        VolumeError::OutOfRange { .. } => Errno::ENOSPC,
        VolumeError::ReadOnly => Errno::EROFS,
        VolumeError::DiscardsNotAllowed => Errno::EOPNOTSUPP,
        // A full or over-quota host file system is worth telling apart from a broken disk.
        VolumeError::Io(io) => match io.kind() {
            io::ErrorKind::StorageFull => Errno::ENOSPC,
            io::ErrorKind::QuotaExceeded => Errno::EDQUOT,
            _ => Errno::EIO,
        },
        _ => Errno::EIO,
    }
}

/// Answer a request that returns nothing but success or an errno.
fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// How many bytes a read of `want` at `offset` returns: short at the end, none past it, as
/// for any regular file.
pub(crate) fn read_len(offset: u64, want: u32, size: u64) -> usize {
    size.saturating_sub(offset).min(u64::from(want)) as usize
}

/// How many bytes of a `len`-byte write at `offset` fit: the part before the end (a short
/// write, as on a full disk), or ENOSPC when none does. The file never grows.
pub(crate) fn write_len(offset: u64, len: usize, size: u64) -> Result<usize, Errno> {
    if len == 0 {
        return Ok(0);
    }
    match size.saturating_sub(offset) {
        0 => Err(Errno::ENOSPC),
        room => Ok(room.min(len as u64) as usize),
    }
}

/// What an `fallocate` asks of the volume: `Some((offset, len))` to zero, `None` for nothing
/// to do, or the errno that refuses it.
///
/// A punched hole must read back as zeros (mke2fs then skips zeroing its inode tables, and a
/// loop device turns write-zeroes into hole punching), but a discarded sector decrypts to noise
/// and writing zeros instead would make every discard a full write. So `PUNCH_HOLE` is
/// EOPNOTSUPP, which every caller handles (mke2fs skips its discard, the loop driver and the
/// block layer fall back to writing zeros where zeros are needed). `ZERO_RANGE` writes
/// encrypted zeros. Plain allocation inside the file succeeds: its storage exists. Nothing may
/// grow the file; with `KEEP_SIZE` the part past the end is ignored, as by any file system.
pub(crate) fn fallocate_plan(
    offset: u64,
    len: u64,
    mode: i32,
    size: u64,
) -> Result<Option<(u64, u64)>, Errno> {
    let mode = FallocateFlags::from_bits_retain(mode as u32);
    let known = FallocateFlags::KEEP_SIZE | FallocateFlags::PUNCH_HOLE | FallocateFlags::ZERO_RANGE;
    if !known.contains(mode) || mode.contains(FallocateFlags::PUNCH_HOLE) {
        return Err(Errno::EOPNOTSUPP);
    }
    let end = offset.checked_add(len).ok_or(Errno::EFBIG)?;
    let end = if end <= size {
        end
    } else if mode.contains(FallocateFlags::KEEP_SIZE) {
        size
    } else {
        return Err(Errno::ENOSPC);
    };
    if mode.contains(FallocateFlags::ZERO_RANGE) && end > offset {
        Ok(Some((offset, end - offset)))
    } else {
        Ok(None)
    }
}

/// Whether a `setattr` may go ahead: only what leaves the attributes as they are (timestamps
/// are accepted and not kept). A size change is EPERM: the file is the volume and has its size.
pub(crate) fn check_setattr(
    attr: &FileAttr,
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
) -> Result<(), Errno> {
    if size.is_some_and(|s| s != attr.size) {
        return Err(if attr.kind == FileType::Directory {
            Errno::EISDIR
        } else {
            Errno::EPERM
        });
    }
    let same_mode = mode.is_none_or(|m| m & 0o7777 == u32::from(attr.perm));
    if !same_mode || uid.is_some_and(|u| u != attr.uid) || gid.is_some_and(|g| g != attr.gid) {
        return Err(Errno::EPERM);
    }
    Ok(())
}

impl Filesystem for VolumeFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_name(parent, name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let checked = self.attr(ino).and_then(|attr| {
            check_setattr(&attr, mode, uid, gid, size)?;
            Ok(attr)
        });
        match checked {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let allowed = if flags.acc_mode() == OpenAccMode::O_RDONLY {
            self.file(ino)
        } else {
            self.writable(ino)
        };
        match allowed {
            // Every change comes through this mount, so what the page cache holds stays true
            // across opens.
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = self.file(ino).and_then(|file| {
            let mut buf = vec![0u8; read_len(offset, size, file.volume.size())];
            file.volume.read(&mut buf, offset).map_err(|e| errno(&e))?;
            Ok(buf)
        });
        match data {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let written = self.writable(ino).and_then(|file| {
            let n = write_len(offset, data.len(), file.volume.size())?;
            file.completed_write(file.volume.write(&data[..n], offset))?;
            Ok(n)
        });
        match written {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.file(ino).and_then(File::flush_if_dirty));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.file(ino).and_then(File::flush_if_dirty));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let done = self.writable(ino).and_then(|file| {
            match fallocate_plan(offset, length, mode, file.volume.size())? {
                Some((offset, len)) => file.completed_write(file.volume.write_zeroes(offset, len)),
                None => Ok(()),
            }
        });
        reply_empty(reply, done);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if let Err(e) = self.dir_only(ino) {
            return reply.error(e);
        }
        // Each entry's offset is that of the one after it, so a listing resumes where it stopped.
        for (i, (ino, kind, name)) in self.dir_entries().enumerate().skip(offset as usize) {
            if reply.add(ino, i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (bsize, blocks) = self.statfs_blocks();
        let files = self.files.len() as u64;
        reply.statfs(blocks, 0, 0, files, 0, bsize, NAME_MAX as u32, bsize);
    }

    // Nothing can be created, removed or renamed: the files are the volumes, always there.
    // EPERM says so more plainly than the ENOSYS these would get by default.

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EPERM);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EPERM);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::mem_volume;
    use sectorcrypt_storage::MemStorage;

    /// A volume of `size` bytes over zeroed memory.
    fn volume(size: u64, sector_size: usize, read_only: bool) -> Arc<Volume> {
        let storage = Arc::new(MemStorage::new(vec![0; size as usize]));
        mem_volume(&storage, sector_size, read_only)
    }

    #[test]
    fn the_file_has_the_volume_size_and_the_mounting_owner() {
        let t = SystemTime::UNIX_EPOCH;
        let rw = file_attr(&volume(1 << 20, 512, false), INodeNo(2), 1000, 100, t);
        assert_eq!(
            (rw.ino, rw.size, rw.blocks, rw.kind, rw.perm, rw.uid, rw.gid),
            (
                INodeNo(2),
                1 << 20,
                2048,
                FileType::RegularFile,
                0o600,
                1000,
                100
            )
        );
        assert_eq!(rw.blksize, 4096);
        let ro = file_attr(&volume(8192, 4096, true), INodeNo(7), 0, 0, t);
        assert_eq!(
            (ro.ino, ro.perm, ro.size, ro.blocks),
            (INodeNo(7), 0o400, 8192, 16)
        );
        let dir = dir_attr(7, 8, t);
        assert_eq!(
            (dir.ino, dir.kind, dir.perm, dir.uid, dir.gid),
            (INodeNo::ROOT, FileType::Directory, 0o555, 7, 8)
        );
    }

    #[test]
    fn volume_errors_map_to_errnos() {
        let out = VolumeError::OutOfRange {
            offset: 1,
            len: 2,
            size: 2,
        };
        assert_eq!(errno(&out), Errno::ENOSPC);
        assert_eq!(errno(&VolumeError::ReadOnly), Errno::EROFS);
        assert_eq!(errno(&VolumeError::DiscardsNotAllowed), Errno::EOPNOTSUPP);
        let io = |kind| VolumeError::Io(io::Error::from(kind));
        assert_eq!(errno(&io(io::ErrorKind::Other)), Errno::EIO);
        assert_eq!(errno(&io(io::ErrorKind::StorageFull)), Errno::ENOSPC);
        assert_eq!(errno(&io(io::ErrorKind::QuotaExceeded)), Errno::EDQUOT);
        assert_eq!(errno(&VolumeError::Unsupported("x".into())), Errno::EIO);
    }

    #[test]
    fn reads_are_short_at_the_end_and_empty_past_it() {
        assert_eq!(read_len(0, 4096, 1 << 20), 4096);
        assert_eq!(read_len((1 << 20) - 100, 4096, 1 << 20), 100);
        assert_eq!(read_len(1 << 20, 4096, 1 << 20), 0);
        assert_eq!(read_len(u64::MAX, u32::MAX, 1 << 20), 0);
    }

    #[test]
    fn writes_never_grow_the_file() {
        assert_eq!(write_len(0, 4096, 1 << 20), Ok(4096));
        assert_eq!(write_len((1 << 20) - 1, 4096, 1 << 20), Ok(1));
        assert_eq!(write_len(1 << 20, 1, 1 << 20), Err(Errno::ENOSPC));
        assert_eq!(write_len(u64::MAX, 1, 1 << 20), Err(Errno::ENOSPC));
        assert_eq!(write_len(1 << 30, 0, 1 << 20), Ok(0));
    }

    #[test]
    fn fallocate_zeroes_ranges_refuses_holes_and_never_grows() {
        let (keep, punch, zero) = (
            FallocateFlags::KEEP_SIZE.bits() as i32,
            FallocateFlags::PUNCH_HOLE.bits() as i32,
            FallocateFlags::ZERO_RANGE.bits() as i32,
        );
        let size = 1 << 20;
        assert_eq!(
            fallocate_plan(0, 4096, punch | keep, size),
            Err(Errno::EOPNOTSUPP)
        );
        assert_eq!(fallocate_plan(512, 1000, zero, size), Ok(Some((512, 1000))));
        assert_eq!(
            fallocate_plan(size - 10, 100, zero | keep, size),
            Ok(Some((size - 10, 10)))
        );
        assert_eq!(
            fallocate_plan(size - 10, 100, zero, size),
            Err(Errno::ENOSPC)
        );
        assert_eq!(fallocate_plan(size, 100, zero | keep, size), Ok(None));
        assert_eq!(fallocate_plan(0, size, 0, size), Ok(None));
        assert_eq!(fallocate_plan(0, size + 1, 0, size), Err(Errno::ENOSPC));
        assert_eq!(fallocate_plan(0, 1, keep, size), Ok(None));
        let collapse = FallocateFlags::COLLAPSE_RANGE.bits() as i32;
        assert_eq!(
            fallocate_plan(0, 4096, collapse, size),
            Err(Errno::EOPNOTSUPP)
        );
        assert_eq!(fallocate_plan(u64::MAX, 2, zero, size), Err(Errno::EFBIG));
    }

    #[test]
    fn setattr_accepts_only_what_changes_nothing() {
        let t = SystemTime::UNIX_EPOCH;
        let attr = file_attr(&volume(1 << 20, 512, false), INodeNo(2), 5, 6, t);
        assert_eq!(check_setattr(&attr, None, None, None, None), Ok(()));
        assert_eq!(
            check_setattr(&attr, None, None, None, Some(1 << 20)),
            Ok(())
        );
        assert_eq!(
            check_setattr(&attr, None, None, None, Some(0)),
            Err(Errno::EPERM)
        );
        assert_eq!(
            check_setattr(&attr, Some(0o100600), Some(5), Some(6), None),
            Ok(())
        );
        assert_eq!(
            check_setattr(&attr, Some(0o644), None, None, None),
            Err(Errno::EPERM)
        );
        assert_eq!(
            check_setattr(&attr, None, Some(0), None, None),
            Err(Errno::EPERM)
        );
        assert_eq!(
            check_setattr(&attr, None, None, Some(0), None),
            Err(Errno::EPERM)
        );
        let dir = dir_attr(5, 6, t);
        assert_eq!(
            check_setattr(&dir, None, None, None, Some(1)),
            Err(Errno::EISDIR)
        );
    }

    /// Two files as `flash attach` mounts them: "data", writable, 1 MiB of 512-byte sectors,
    /// then "rootfs", read-only, 64 KiB of 4096-byte sectors.
    fn two_files() -> VolumeFs {
        let files = vec![
            MountFile {
                name: "data".into(),
                volume: volume(1 << 20, 512, false),
            },
            MountFile {
                name: "rootfs".into(),
                volume: volume(64 << 10, 4096, true),
            },
        ];
        VolumeFs::new(files, 1000, 100)
    }

    #[test]
    fn each_inode_has_the_attributes_of_its_own_volume() {
        let fs = two_files();
        let data = fs.attr(file_ino(0)).unwrap();
        assert_eq!(
            (data.ino, data.size, data.perm, data.kind),
            (INodeNo(2), 1 << 20, 0o600, FileType::RegularFile)
        );
        let rootfs = fs.attr(file_ino(1)).unwrap();
        assert_eq!(
            (rootfs.ino, rootfs.size, rootfs.perm, rootfs.kind),
            (INodeNo(3), 64 << 10, 0o400, FileType::RegularFile)
        );
        let root = fs.attr(INodeNo::ROOT).unwrap();
        assert_eq!((root.kind, root.perm), (FileType::Directory, 0o555));
        for missing in [INodeNo(0), INodeNo(4), INodeNo(u64::MAX)] {
            assert_eq!(fs.attr(missing).err(), Some(Errno::ENOENT), "{missing:?}");
        }
    }

    #[test]
    fn names_are_looked_up_in_the_root_only() {
        let fs = two_files();
        let lookup = |parent, name: &str| {
            fs.lookup_name(parent, OsStr::new(name))
                .map(|a| (a.ino, a.size))
        };
        assert_eq!(lookup(INodeNo::ROOT, "data"), Ok((INodeNo(2), 1 << 20)));
        assert_eq!(lookup(INodeNo::ROOT, "rootfs"), Ok((INodeNo(3), 64 << 10)));
        for missing in ["volume", "", "Data", "data/"] {
            assert_eq!(
                lookup(INodeNo::ROOT, missing),
                Err(Errno::ENOENT),
                "{missing:?}"
            );
        }
        assert_eq!(lookup(file_ino(0), "rootfs"), Err(Errno::ENOTDIR));
        assert_eq!(lookup(INodeNo(9), "data"), Err(Errno::ENOENT));
    }

    #[test]
    fn the_directory_lists_the_files_in_the_order_given() {
        let fs = two_files();
        let entries: Vec<_> = fs.dir_entries().collect();
        assert_eq!(
            entries,
            [
                (INodeNo::ROOT, FileType::Directory, "."),
                (INodeNo::ROOT, FileType::Directory, ".."),
                (INodeNo(2), FileType::RegularFile, "data"),
                (INodeNo(3), FileType::RegularFile, "rootfs"),
            ]
        );
        assert_eq!(fs.dir_only(INodeNo::ROOT), Ok(()));
        assert_eq!(fs.dir_only(file_ino(1)), Err(Errno::ENOTDIR));
        assert_eq!(fs.dir_only(INodeNo(4)), Err(Errno::ENOENT));
        // Blocks of the largest preferred size, as many as both files fill.
        assert_eq!(fs.statfs_blocks(), (4096, ((1 << 20) + (64 << 10)) / 4096));
    }

    #[test]
    fn only_the_read_only_file_refuses_writes() {
        let fs = two_files();
        assert!(fs.writable(file_ino(0)).is_ok());
        assert_eq!(fs.writable(file_ino(1)).err(), Some(Errno::EROFS));
        // Reading the read-only one is fine.
        assert!(fs.file(file_ino(1)).is_ok());
        assert_eq!(fs.file(INodeNo::ROOT).err(), Some(Errno::EISDIR));
        assert_eq!(fs.writable(INodeNo::ROOT).err(), Some(Errno::EISDIR));
        assert_eq!(fs.writable(INodeNo(4)).err(), Some(Errno::ENOENT));
    }

    #[test]
    fn a_write_leaves_only_its_own_file_to_flush() {
        let fs = two_files();
        let dirty = |i: usize| fs.files[i].dirty.load(Ordering::Acquire);
        let data = fs.writable(file_ino(0)).unwrap();
        data.completed_write(data.volume.write(b"hello", 4000))
            .unwrap();
        assert_eq!((dirty(0), dirty(1)), (true, false));
        let mut back = [0u8; 5];
        data.volume.read(&mut back, 4000).unwrap();
        assert_eq!(&back, b"hello");
        // The other file's volume is untouched (its storage started zeroed).
        let rootfs = fs.file(file_ino(1)).unwrap();
        let mut other = [1u8; 5];
        rootfs.volume.read(&mut other, 4000).unwrap();
        assert_ne!(other, back);
        data.flush_if_dirty().unwrap();
        assert!(!dirty(0));
        // A failed write leaves nothing to flush.
        let refused = rootfs.completed_write(rootfs.volume.write(b"x", 0));
        assert_eq!((refused, dirty(1)), (Err(Errno::EROFS), false));
    }

    #[test]
    fn names_are_checked_before_mounting() {
        let long = "x".repeat(NAME_MAX);
        assert!(check_names(["data", "rootfs", "...", ".hidden", "a b", &long]).is_ok());
        assert!(matches!(check_names([]), Err(Error::NoFiles)));
        let too_long = "x".repeat(NAME_MAX + 1);
        let cases: [(&[&str], &str, BadName); 7] = [
            (&["ok", ""], "", BadName::Empty),
            (&[&too_long], &too_long, BadName::TooLong),
            (&["a/b"], "a/b", BadName::Slash),
            (&["a\0b"], "a\0b", BadName::Nul),
            (&["."], ".", BadName::Dot),
            (&[".."], "..", BadName::Dot),
            (&["a", "b", "a"], "a", BadName::Duplicate),
        ];
        for (names, bad, want) in cases {
            match check_names(names.iter().copied()) {
                Err(Error::FileName { name, reason }) => {
                    assert_eq!((name.as_str(), reason), (bad, want), "{names:?}")
                }
                other => panic!("{names:?}: {other:?}"),
            }
        }
    }
}
