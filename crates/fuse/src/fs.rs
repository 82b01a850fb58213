//! The file system the kernel talks to: a root directory holding the one regular file `volume`,
//! every request on it answered by the [`Volume`]. The decisions about sizes, ranges and errors
//! are plain functions below, so that they are tested without a mount.

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

/// The inode of `volume`; the root directory is [`INodeNo::ROOT`].
pub(crate) const FILE: INodeNo = INodeNo(2);

/// The one name in the root directory.
pub(crate) const FILE_NAME: &str = "volume";

/// How long the kernel may cache names and attributes: nothing changes them behind its back
/// (the size is fixed and every write comes through this mount).
const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The volume behind the mount, and who may see it.
pub(crate) struct VolumeFs {
    volume: Arc<Volume>,
    uid: u32,
    gid: u32,
    /// All timestamps: the file has no history of its own to show.
    mounted_at: SystemTime,
    /// Whether a write completed since the last flush. Set *after* each write, cleared *before*
    /// each flush: a write that completes during a flush leaves it set for the next one, so no
    /// completed write is ever skipped, and a close of an untouched file costs no fdatasync.
    dirty: AtomicBool,
}

impl VolumeFs {
    pub(crate) fn new(volume: Arc<Volume>, uid: u32, gid: u32) -> Self {
        VolumeFs {
            volume,
            uid,
            gid,
            mounted_at: SystemTime::now(),
            dirty: AtomicBool::new(false),
        }
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        if ino == INodeNo::ROOT {
            Some(dir_attr(self.uid, self.gid, self.mounted_at))
        } else if ino == FILE {
            Some(file_attr(&self.volume, self.uid, self.gid, self.mounted_at))
        } else {
            None
        }
    }

    /// EROFS on a read-only volume, else what [`file_only`] says: every request that changes
    /// the file's contents passes this first.
    fn writable(&self, ino: INodeNo) -> Result<(), Errno> {
        file_only(ino)?;
        if self.volume.is_read_only() {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

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

/// The attributes of `volume`: the payload size, owned by the mounting user, 0600 (0400 when
/// the volume is read-only).
pub(crate) fn file_attr(volume: &Volume, uid: u32, gid: u32, time: SystemTime) -> FileAttr {
    let size = volume.size();
    FileAttr {
        ino: FILE,
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

/// EISDIR unless `ino` is the file: the only other inode is the root directory.
fn file_only(ino: INodeNo) -> Result<(), Errno> {
    if ino == FILE {
        Ok(())
    } else {
        Err(Errno::EISDIR)
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

/// The root directory's entries, each with the offset of the one after it.
pub(crate) fn dir_entries() -> [(INodeNo, FileType, &'static str); 3] {
    [
        (INodeNo::ROOT, FileType::Directory, "."),
        (INodeNo::ROOT, FileType::Directory, ".."),
        (FILE, FileType::RegularFile, FILE_NAME),
    ]
}

impl Filesystem for VolumeFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == FILE_NAME {
            let attr = file_attr(&self.volume, self.uid, self.gid, self.mounted_at);
            reply.entry(&TTL, &attr, Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
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
        let Some(attr) = self.attr(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match check_setattr(&attr, mode, uid, gid, size) {
            Ok(()) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let allowed = if flags.acc_mode() == OpenAccMode::O_RDONLY {
            file_only(ino)
        } else {
            self.writable(ino)
        };
        match allowed {
            // Every change comes through this mount, so what the page cache holds stays true
            // across opens.
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
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
        let data = file_only(ino).and_then(|()| {
            let mut buf = vec![0u8; read_len(offset, size, self.volume.size())];
            self.volume.read(&mut buf, offset).map_err(|e| errno(&e))?;
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
        let written = self.writable(ino).and_then(|()| {
            let n = write_len(offset, data.len(), self.volume.size())?;
            self.completed_write(self.volume.write(&data[..n], offset))?;
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
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.flush_if_dirty());
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.flush_if_dirty());
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
        let done = self.writable(ino).and_then(|()| {
            match fallocate_plan(offset, length, mode, self.volume.size())? {
                Some((offset, len)) => self.completed_write(self.volume.write_zeroes(offset, len)),
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
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        for (i, (ino, kind, name)) in dir_entries().into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bsize = preferred_io(&self.volume);
        let blocks = self.volume.size() / u64::from(bsize);
        reply.statfs(blocks, 0, 0, 1, 0, bsize, 255, bsize);
    }

    // Nothing can be created, removed or renamed: one file, always there. EPERM says so more
    // plainly than the ENOSYS these would get by default.

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
    use sectorcrypt_storage::MemStorage;
    use sectorcrypt_volume::{Layout, VolumeOptions};

    fn volume(size: u64, sector_size: usize, read_only: bool) -> Volume {
        let storage = Arc::new(MemStorage::new(vec![0; size as usize]));
        let layout = Layout {
            offset: 0,
            size,
            cipher: "aes-xts-plain64".into(),
            sector_size,
            iv_offset: 0,
        };
        let opts = VolumeOptions {
            read_only,
            ..Default::default()
        };
        Volume::with_layout(storage, layout, &[1; 64], &opts).unwrap()
    }

    #[test]
    fn the_file_has_the_volume_size_and_the_mounting_owner() {
        let t = SystemTime::UNIX_EPOCH;
        let rw = file_attr(&volume(1 << 20, 512, false), 1000, 100, t);
        assert_eq!(
            (rw.ino, rw.size, rw.blocks, rw.kind, rw.perm, rw.uid, rw.gid),
            (FILE, 1 << 20, 2048, FileType::RegularFile, 0o600, 1000, 100)
        );
        assert_eq!(rw.blksize, 4096);
        let ro = file_attr(&volume(8192, 4096, true), 0, 0, t);
        assert_eq!((ro.perm, ro.size, ro.blocks), (0o400, 8192, 16));
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
        let attr = file_attr(&volume(1 << 20, 512, false), 5, 6, t);
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

    #[test]
    fn the_directory_lists_only_the_volume() {
        let names: Vec<_> = dir_entries().iter().map(|e| e.2).collect();
        assert_eq!(names, [".", "..", "volume"]);
        assert_eq!(dir_entries()[2].0, FILE);
    }
}
