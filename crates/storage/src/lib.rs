//! One storage trait for everything sectorcrypt reads and writes: headers, keyslot areas and the
//! encrypted payload. Positioned reads and writes (no shared cursor, so several threads can use one
//! device), an explicit `sync` (the ordering point for crash safety), and the length.
//!
//! Implementations: [`FileStorage`] (a regular file or a block device), `rbd::RbdStorage` (a Ceph
//! RBD image through librbd, with the `rbd` feature), [`MemStorage`] (tests) and
//! [`CrashingStorage`] (tests: a device that loses power after the n-th write or sync, keeping only
//! what its last sync made durable plus any part of the writes since; see [`crash`]).
//! Keeping every byte of I/O behind this trait is what lets tests substitute a device that fails
//! or "loses power" at a chosen write.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};

pub mod crash;
pub mod dir;
pub mod lock;
// The mapping of files for reads without a copy, and its SIGBUS handler.
#[allow(unsafe_code)]
mod mapped;
// The FFI calls into librados and librbd.
#[cfg(feature = "rbd")]
#[allow(unsafe_code)]
pub mod rbd;
pub mod units;
pub use crash::{CrashingDirectory, CrashingStorage, Outcome, Power};
pub use dir::{install_file, rename_durably, Directory, FsDirectory};
pub use lock::{Access, DeviceLock};

/// A device of fixed length addressed by byte offset.
pub trait Storage: Send + Sync {
    /// Fill `buf` from `offset`; reading past the end is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`; writing past the end is an error.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// [`Storage::read_at`], but only if no part of it waits for the device (a file's data all
    /// in the page cache): `Ok(false)` when some would, `buf` then holding anything. A server
    /// answers such a read on the thread that received it instead of waking another thread to
    /// watch the connection while it waits. The default can never promise that.
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let _ = (buf, offset);
        Ok(false)
    }
    /// Lend `len` stored bytes at `offset` to `each` without copying them, where none of them
    /// waits for the device (a file's data all in the page cache, mapped into memory), so that
    /// a reader decrypts straight from the cache into its reply. `Ok(false)` when the device
    /// cannot: either `each` was not called, or its work must be thrown away (a page could not
    /// be read meanwhile; [`Storage::read_at`] then reports why). Bytes lent while another thread
    /// writes the same range may be old, new or a mix, as a racing `read_at` returns. The
    /// default never lends.
    fn read_lent(&self, offset: u64, len: usize, each: &mut dyn FnMut(&[u8])) -> io::Result<bool> {
        let _ = (offset, len, each);
        Ok(false)
    }
    /// The mirror of [`Storage::read_lent`]: lend the `len` stored bytes at `offset` to `each`
    /// to overwrite, all of them, where none waits for the device (a file's pages all in the
    /// page cache, mapped for writing), so that a writer encrypts straight into the cache. What
    /// `each` stores there is written as by [`Storage::write_at`], durable after
    /// [`Storage::sync`], and may be seen by others as it is stored: only what may be seen goes
    /// there (ciphertext). `Ok(false)` when the device cannot: either `each` was not called, or
    /// some of what it stored was lost (a page could not be written meanwhile) and the caller
    /// writes the whole range again with [`Storage::write_at`], which reports why. The default
    /// never lends.
    fn write_lent(
        &self,
        offset: u64,
        len: usize,
        each: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<bool> {
        let _ = (offset, len, each);
        Ok(false)
    }
    /// Write `bufs` one after another from `offset`, in one request where the device can (a
    /// file's `pwritev`): pieces of memory that belong together on the device, without copying
    /// them together first. The default writes them one by one. On an error some may have been
    /// written.
    fn write_gathered(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            self.write_at(buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    /// [`Storage::write_gathered`] for data that will not be read back soon (a journal): past
    /// any cache the host keeps (a file's page cache, with `O_DIRECT`), so that it costs no copy
    /// into the cache and no writeback later. Like any write, it is durable only after
    /// [`Storage::sync`]. The default writes through the cache, as do files when the pieces or
    /// `offset` are not on [`UNCACHED_ALIGN`] bytes or the file system has no `O_DIRECT`.
    fn write_uncached(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.write_gathered(bufs, offset)
    }
    /// Make every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Release `len` bytes at `offset` (a hint, like a block device's discard: afterwards they
    /// read back as zeros or as they were). Devices that cannot release space ignore it.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// Fill `buf` from `offset` in pieces of `piece` bytes (not 0; the last may be shorter), handing
    /// each piece with its index, in order, to `each` as soon as it has arrived. Devices with
    /// asynchronous I/O have every piece in flight at once, so `each` works on one piece while
    /// the next are still on their way; the default reads a piece, then hands it over.
    fn read_pieces(
        &self,
        buf: &mut [u8],
        offset: u64,
        piece: usize,
        each: &mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        for (i, p) in buf.chunks_mut(piece).enumerate() {
            self.read_at(p, offset + (i * piece) as u64)?;
            each(i, p)?;
        }
        Ok(())
    }
    /// Write `buf` at `offset` in pieces of `piece` bytes (not 0; the last may be shorter): `prepare`
    /// gets each piece with its index, in order, just before it is sent. Devices with
    /// asynchronous I/O send a piece as soon as it is prepared and wait for all at the end, so
    /// the next piece is prepared while the last are on their way; the default prepares and
    /// writes a piece at a time. On an error some pieces may have been written.
    fn write_pieces(
        &self,
        buf: &mut [u8],
        offset: u64,
        piece: usize,
        prepare: &mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        for (i, p) in buf.chunks_mut(piece).enumerate() {
            prepare(i, p)?;
            self.write_at(p, offset + (i * piece) as u64)?;
        }
        Ok(())
    }
    /// The size that I/O is best aligned to, where the device states one (an RBD image's
    /// stripe period; cryptsetup reads a block device's `optimal_io_size`): new volumes start
    /// their data at a multiple of it.
    fn optimal_io_size(&self) -> Option<u64> {
        None
    }
    /// Make the device at least `len` bytes long: a file grows with zeros; a device of fixed
    /// size refuses with [`io::ErrorKind::Unsupported`] if it is shorter. Like a write, the new
    /// length is durable only once [`Storage::sync`] returns.
    fn grow(&self, len: u64) -> io::Result<()> {
        if self.len()? >= len {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot grow to {len} bytes", self.name()),
        ))
    }
    /// The length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the device has no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// A name for messages (the path, for files).
    fn name(&self) -> String;
    /// Whether writes are accepted (`false`: opened read-only, every write fails), so that a
    /// layer above can do without them where it would otherwise repair something.
    fn is_writable(&self) -> bool {
        true
    }
}

/// `impl Storage` for a pointer type over any device: a boxed device (openers return files and
/// RBD images alike) and a shared one (one handle used by several parts of a command).
macro_rules! delegate_storage {
    ($($ptr:ident)::+) => {
        impl<T: Storage + ?Sized> Storage for $($ptr)::+<T> {
            fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
                (**self).read_at(buf, offset)
            }
            fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
                (**self).write_at(buf, offset)
            }
            fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
                (**self).read_cached(buf, offset)
            }
            fn read_lent(
                &self,
                offset: u64,
                len: usize,
                each: &mut dyn FnMut(&[u8]),
            ) -> io::Result<bool> {
                (**self).read_lent(offset, len, each)
            }
            fn write_lent(
                &self,
                offset: u64,
                len: usize,
                each: &mut dyn FnMut(&mut [u8]),
            ) -> io::Result<bool> {
                (**self).write_lent(offset, len, each)
            }
            fn write_gathered(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
                (**self).write_gathered(bufs, offset)
            }
            fn write_uncached(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
                (**self).write_uncached(bufs, offset)
            }
            fn sync(&self) -> io::Result<()> {
                (**self).sync()
            }
            fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
                (**self).discard(offset, len)
            }
            fn read_pieces(
                &self,
                buf: &mut [u8],
                offset: u64,
                piece: usize,
                each: &mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>,
            ) -> io::Result<()> {
                (**self).read_pieces(buf, offset, piece, each)
            }
            fn write_pieces(
                &self,
                buf: &mut [u8],
                offset: u64,
                piece: usize,
                prepare: &mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>,
            ) -> io::Result<()> {
                (**self).write_pieces(buf, offset, piece, prepare)
            }
            fn optimal_io_size(&self) -> Option<u64> {
                (**self).optimal_io_size()
            }
            fn grow(&self, len: u64) -> io::Result<()> {
                (**self).grow(len)
            }
            fn len(&self) -> io::Result<u64> {
                (**self).len()
            }
            fn name(&self) -> String {
                (**self).name()
            }
            fn is_writable(&self) -> bool {
                (**self).is_writable()
            }
        }
    };
}

delegate_storage!(Box);
delegate_storage!(std::sync::Arc);

/// What [`Storage::write_uncached`] pieces and offsets must be multiples of to bypass a file's
/// page cache: the largest logical block size of a device (O_DIRECT's rule), and a page.
pub const UNCACHED_ALIGN: usize = 4096;

/// How far into `buf` its first byte on [`UNCACHED_ALIGN`] is: less than `UNCACHED_ALIGN` (0 when
/// the platform cannot say, and writes from there go through the cache).
pub fn uncached_start(buf: &[u8]) -> usize {
    match buf.as_ptr().align_offset(UNCACHED_ALIGN) {
        at if at < UNCACHED_ALIGN => at,
        _ => 0,
    }
}

/// `pwritev` until every byte of `bufs` is written, from `offset`.
fn write_all_vectored_at(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    /// The most pieces one `pwritev` takes (Linux's `IOV_MAX`).
    const IOV_MAX: usize = 1024;
    let mut slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
    let mut rest = &mut slices[..];
    let mut at = offset;
    while rest.iter().any(|s| !s.is_empty()) {
        let n = match rustix::io::pwritev(file, &rest[..rest.len().min(IOV_MAX)], at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        at += n as u64;
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

fn past_end(what: &str, offset: u64, len: usize, size: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("{what} of {len} bytes at offset {offset} runs past the end ({size} bytes)"),
    )
}

/// A regular file or block device, locked against other processes as its opener asks
/// ([`lock`]).
#[derive(Debug)]
pub struct FileStorage {
    file: File,
    path: PathBuf,
    writable: bool,
    lock: Option<DeviceLock>,
    /// The length last read (0: not yet), for bounds checks without a `statx` per request.
    known_len: AtomicU64,
    /// The file opened again with `O_DIRECT` on the first uncached write (`None`: the file
    /// system refused).
    direct: OnceLock<Option<File>>,
    /// The file mapped on the first lent read or write, as long as it was then, for writing
    /// too if the file is open for it (`None`: it could not be; reads and writes then copy).
    mapped: OnceLock<Option<mapped::Mapping>>,
}

impl FileStorage {
    /// Open `path` read-only, without a lock: for reading a header, which is safe beside a writer
    /// (as cryptsetup's `luksDump` of an active device is).
    pub fn open_read_only(path: &Path) -> io::Result<Self> {
        Ok(FileStorage {
            file: File::open(path)?,
            path: path.to_path_buf(),
            writable: false,
            lock: None,
            known_len: AtomicU64::new(0),
            direct: OnceLock::new(),
            mapped: OnceLock::new(),
        })
    }

    /// Open `path` read-only with a shared lock: for serving its data, which a writer beside
    /// would change underneath. Fails with [`io::ErrorKind::ResourceBusy`] while a writer holds it.
    pub fn open_shared(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let lock = lock::lock(&file, path, Access::Shared)?;
        Ok(FileStorage {
            file,
            path: path.to_path_buf(),
            writable: false,
            lock,
            known_len: AtomicU64::new(0),
            direct: OnceLock::new(),
            mapped: OnceLock::new(),
        })
    }

    /// Open `path` for reading and writing with an exclusive lock, held until this is dropped.
    /// Fails with [`io::ErrorKind::ResourceBusy`] while another process holds any lock on it.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let lock = lock::lock(&file, path, Access::Exclusive)?;
        Ok(FileStorage {
            file,
            path: path.to_path_buf(),
            writable: true,
            lock,
            known_len: AtomicU64::new(0),
            direct: OnceLock::new(),
            mapped: OnceLock::new(),
        })
    }

    /// A file of `len` zero bytes that lives in memory only (`memfd_create`), served as any file
    /// is (its pages lent from the page cache, mapped): for measuring the request path that a
    /// file takes without a disk's writeback underneath. `name` is for messages.
    pub fn in_memory(name: &str, len: u64) -> io::Result<Self> {
        let file = File::from(rustix::fs::memfd_create(
            name,
            rustix::fs::MemfdFlags::CLOEXEC,
        )?);
        file.set_len(len)?;
        // Nobody else can name it, but every device written takes its lock: one rule.
        let path = PathBuf::from(format!("memfd:{name}"));
        let lock = lock::lock(&file, &path, Access::Exclusive)?;
        Ok(FileStorage {
            file,
            path,
            writable: true,
            lock,
            known_len: AtomicU64::new(0),
            direct: OnceLock::new(),
            mapped: OnceLock::new(),
        })
    }

    /// This file opened again, for writes with `O_DIRECT` (through `/proc/self/fd`: the same file
    /// even if its path was renamed or replaced since).
    fn reopen_direct(&self) -> Option<File> {
        OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
            .ok()
    }

    /// The file's mapping, made on first use ([`mapped`]).
    fn mapping(&self) -> Option<&mapped::Mapping> {
        self.mapped
            .get_or_init(|| mapped::Mapping::new(&self.file, self.len().ok()?, self.writable))
            .as_ref()
    }

    /// The lock this file holds (`None`: opened without one, or locks are disabled).
    pub fn lock(&self) -> Option<&DeviceLock> {
        self.lock.as_ref()
    }

    /// Check that `n` bytes at `offset` lie within the file (`what` names the request in the
    /// error). The length last read is trusted while the range fits it, and read again when it
    /// does not (the file may have grown since: `resize`): a `statx` per request was a fifth of a
    /// server's system calls. A file does not shrink under its holder (the lock keeps other
    /// writers out); a read past a shrunken end still fails in `read_exact_at`.
    fn within(&self, what: &str, offset: u64, n: usize) -> io::Result<()> {
        let end = offset.checked_add(n as u64);
        let fits = |size: u64| end.is_some_and(|e| e <= size);
        if fits(self.known_len.load(Ordering::Relaxed)) {
            return Ok(());
        }
        let size = self.len()?;
        self.known_len.store(size, Ordering::Relaxed);
        if fits(size) {
            Ok(())
        } else {
            Err(past_end(what, offset, n, size))
        }
    }
}

impl Storage for FileStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.within("a read", offset, buf.len())?;
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.within("a write", offset, buf.len())?;
        self.file.write_all_at(buf, offset)
    }

    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        use rustix::io::{preadv2, Errno, ReadWriteFlags};
        self.within("a read", offset, buf.len())?;
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut [io::IoSliceMut::new(&mut buf[done..])];
            // RWF_NOWAIT: what is cached comes back at once, a short count where the cache ends,
            // EAGAIN where the rest would wait for the disk (and EOPNOTSUPP where the file system
            // cannot tell).
            match preadv2(
                &self.file,
                rest,
                offset + done as u64,
                ReadWriteFlags::NOWAIT,
            ) {
                Ok(0) | Err(Errno::AGAIN | Errno::OPNOTSUPP) => return Ok(false),
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(true)
    }

    fn read_lent(&self, offset: u64, len: usize, each: &mut dyn FnMut(&[u8])) -> io::Result<bool> {
        self.within("a read", offset, len)?;
        Ok(self.mapping().is_some_and(|m| m.lend(offset, len, each)))
    }

    fn write_lent(
        &self,
        offset: u64,
        len: usize,
        each: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<bool> {
        // A file not open for writing has a read-only mapping, which never lends for writing.
        self.within("a write", offset, len)?;
        Ok(self
            .mapping()
            .is_some_and(|m| m.lend_mut(offset, len, each)))
    }

    fn write_gathered(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.within("a write", offset, bufs.iter().map(|b| b.len()).sum())?;
        write_all_vectored_at(&self.file, bufs, offset)
    }

    fn write_uncached(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let aligned = |n: usize| n.is_multiple_of(UNCACHED_ALIGN);
        let direct = (self.writable
            && aligned(offset as usize)
            && bufs
                .iter()
                .all(|b| aligned(b.len()) && aligned(b.as_ptr() as usize)))
        .then(|| self.direct.get_or_init(|| self.reopen_direct()).as_ref())
        .flatten();
        let Some(direct) = direct else {
            return self.write_gathered(bufs, offset);
        };
        self.within("a write", offset, bufs.iter().map(|b| b.len()).sum())?;
        match write_all_vectored_at(direct, bufs, offset) {
            // A file system that opens with O_DIRECT and refuses it on a write.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                self.write_gathered(bufs, offset)
            }
            other => other,
        }
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        use rustix::fs::{fallocate, FallocateFlags};
        self.within("a discard", offset, len as usize)?;
        // Punching a hole works on regular files and (since Linux 4.9) block devices; where
        // the file system cannot, the hint is dropped.
        match fallocate(
            &self.file,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            offset,
            len,
        ) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn grow(&self, len: u64) -> io::Result<()> {
        let meta = self.file.metadata()?;
        if meta.file_type().is_file() {
            if meta.len() < len {
                self.file.set_len(len)?;
            }
            return Ok(());
        }
        if self.len()? >= len {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{} is a device of fixed size, shorter than {len} bytes",
                self.name()
            ),
        ))
    }

    fn len(&self) -> io::Result<u64> {
        let meta = self.file.metadata()?;
        if meta.file_type().is_file() {
            return Ok(meta.len());
        }
        // Block devices report length 0 in metadata; their end is found by seeking.
        use std::io::Seek;
        (&self.file).seek(io::SeekFrom::End(0))
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
    fn is_writable(&self) -> bool {
        self.writable
    }
}

/// A device in memory.
#[derive(Debug, Default)]
pub struct MemStorage {
    data: RwLock<Vec<u8>>,
}

impl MemStorage {
    /// A device holding `data`.
    pub fn new(data: Vec<u8>) -> Self {
        MemStorage {
            data: RwLock::new(data),
        }
    }

    /// A copy of the contents.
    pub fn contents(&self) -> Vec<u8> {
        self.data.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Storage for MemStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let data = self.data.read().unwrap_or_else(|e| e.into_inner());
        let start = usize::try_from(offset)
            .ok()
            .filter(|s| s.checked_add(buf.len()).is_some_and(|e| e <= data.len()));
        let Some(start) = start else {
            return Err(past_end("a read", offset, buf.len(), data.len() as u64));
        };
        buf.copy_from_slice(&data[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        let start = usize::try_from(offset)
            .ok()
            .filter(|s| s.checked_add(buf.len()).is_some_and(|e| e <= data.len()));
        let Some(start) = start else {
            return Err(past_end("a write", offset, buf.len(), data.len() as u64));
        };
        data[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn grow(&self, len: u64) -> io::Result<()> {
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        if data.len() < len {
            data.resize(len, 0);
        }
        Ok(())
    }

    /// Released bytes read back as zeros, as from a file with a hole.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeros = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        self.write_at(&zeros, offset)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.data.read().unwrap_or_else(|e| e.into_inner()).len() as u64)
    }

    fn name(&self) -> String {
        "memory".to_string()
    }
}

/// A window of another device: `len` bytes from `offset`. Used to read a header stored inside a
/// device's data (a prepared copy during a data shift), and by tests to put a header and its
/// data on one device so that one simulated power cut stops both.
pub struct Window<S> {
    inner: S,
    offset: u64,
    len: u64,
}

impl<S: std::ops::Deref<Target = D> + Send + Sync, D: Storage + ?Sized> Window<S> {
    /// The window `[offset, offset + len)` of `inner`.
    pub fn new(inner: S, offset: u64, len: u64) -> Self {
        Window { inner, offset, len }
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<u64> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(self.offset + offset),
            _ => Err(past_end("a window access", offset, len, self.len)),
        }
    }
}

impl<S: std::ops::Deref<Target = D> + Send + Sync, D: Storage + ?Sized> Storage for Window<S> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let at = self.check(offset, buf.len())?;
        self.inner.read_at(buf, at)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let at = self.check(offset, buf.len())?;
        self.inner.write_at(buf, at)
    }
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let at = self.check(offset, buf.len())?;
        self.inner.read_cached(buf, at)
    }
    fn read_lent(&self, offset: u64, len: usize, each: &mut dyn FnMut(&[u8])) -> io::Result<bool> {
        let at = self.check(offset, len)?;
        self.inner.read_lent(at, len, each)
    }
    fn write_lent(
        &self,
        offset: u64,
        len: usize,
        each: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<bool> {
        let at = self.check(offset, len)?;
        self.inner.write_lent(at, len, each)
    }
    fn write_gathered(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let at = self.check(offset, bufs.iter().map(|b| b.len()).sum())?;
        self.inner.write_gathered(bufs, at)
    }
    fn write_uncached(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let at = self.check(offset, bufs.iter().map(|b| b.len()).sum())?;
        self.inner.write_uncached(bufs, at)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.len)
    }
    fn name(&self) -> String {
        format!("{} at byte {}", self.inner.name(), self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installed_files_replace_whole() {
        let path = std::env::temp_dir().join(format!("sectorcrypt-install-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        let dir = FsDirectory::new(&path);
        install_file(&dir, "h.img", b"first").unwrap();
        install_file(&dir, "h.img", b"second").unwrap();
        assert_eq!(std::fs::read(path.join("h.img")).unwrap(), b"second");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path.join("h.img"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "headers are private");
        assert!(!path.join("h.img.new").exists(), "no temporary left");
        std::fs::remove_dir_all(path).unwrap();
    }

    #[test]
    fn a_file_in_memory_is_served_as_a_file() {
        let f = FileStorage::in_memory("test", 1 << 20).unwrap();
        assert_eq!(f.len().unwrap(), 1 << 20);
        assert_eq!(f.name(), "memfd:test");
        assert!(f.lock().is_some(), "written, so locked");
        let mut buf = vec![0xffu8; 8192];
        f.read_at(&mut buf, 4096).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "a new file reads as zeros");
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
        f.write_at(&data, 4096).unwrap();
        f.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, data);
        // Its pages are in memory, so it lends them, as a cached file does.
        assert!(f.write_lent(8192, 4096, &mut |b| b.fill(0x5a)).unwrap());
        f.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf[..4096], data[..4096]);
        assert!(buf[4096..].iter().all(|&b| b == 0x5a));
        assert!(f.write_at(&data, (1 << 20) - 4096).is_err(), "past the end");
    }

    #[test]
    fn a_cached_read_answers_from_the_page_cache_and_only_from_there() {
        let dir = std::env::temp_dir().join(format!("sectorcrypt-cached-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.img");
        let data: Vec<u8> = (0..1 << 20)
            .map(|i: u32| (i * 7 + i / 4096) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let f = FileStorage::open(&path).unwrap();
        // Just written: every page is in the cache.
        let mut buf = vec![0u8; 128 << 10];
        assert!(f.read_cached(&mut buf, 4096).unwrap());
        assert_eq!(buf, data[4096..4096 + buf.len()]);
        assert!(
            f.read_cached(&mut buf, (1 << 20) - 4096).is_err(),
            "past the end"
        );
        // Dropped from the cache (where the file system can: not on tmpfs), a cached read
        // refuses (on ext4, the usual home of test files, it must), and never answers with
        // anything but the data.
        const EXT4_SUPER_MAGIC: u64 = 0xEF53;
        let ext4 = rustix::fs::fstatfs(&f.file).unwrap().f_type as u64 == EXT4_SUPER_MAGIC;
        // `DONTNEED` is advice: the kernel drops what it can at that moment (a page another CPU
        // has not yet put on its lists stays), so it is asked again until the pages are gone.
        let mut cached = true;
        for _ in 0..20 {
            f.sync().unwrap();
            rustix::fs::fadvise(&f.file, 0, 0, rustix::fs::Advice::DontNeed).unwrap();
            buf.fill(0);
            cached = f.read_cached(&mut buf, 512 << 10).unwrap();
            if !cached {
                break;
            }
            assert_eq!(buf, data[512 << 10..(512 << 10) + buf.len()]);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            !(cached && ext4),
            "ext4 dropped these pages: reading them waits for the disk"
        );
        f.read_at(&mut buf, 512 << 10).unwrap();
        assert_eq!(buf, data[512 << 10..(512 << 10) + buf.len()]);
        // Devices that cannot tell never claim to.
        let mem = MemStorage::new(vec![0; 1 << 16]);
        assert!(!mem.read_cached(&mut buf[..4096], 0).unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A sparse 1 MiB file in a directory of its own (no page of it is in the cache until
    /// written or read): the directory, to remove, and the file.
    fn sparse_file(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("sectorcrypt-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.img");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        (dir, path)
    }

    #[test]
    fn a_lent_read_lends_cached_bytes_only_and_sees_every_write() {
        let (dir, path) = sparse_file("lent");
        let f = FileStorage::open(&path).unwrap();
        let data: Vec<u8> = (0..512 << 10)
            .map(|i: u32| (i * 13 + i / 4096) as u8)
            .collect();
        f.write_at(&data, 0).unwrap();
        let lent = |s: &dyn Storage, at: u64, len: usize| {
            let mut got = None;
            let ok = s
                .read_lent(at, len, &mut |b| got = Some(b.to_vec()))
                .unwrap();
            ok.then(|| got.expect("lent without a call"))
        };
        assert_eq!(
            lent(&f, 4096 + 16, 128 << 10).unwrap(),
            data[4096 + 16..][..128 << 10]
        );
        // A hole never written or read is not in the cache: nothing is lent.
        let mut called = false;
        assert!(!f
            .read_lent(768 << 10, 64 << 10, &mut |_| called = true)
            .unwrap());
        assert!(!called, "uncached bytes lent");
        // Writes after the mapping was made show through it.
        f.write_at(&[0x5a; 8192], 8192).unwrap();
        assert_eq!(lent(&f, 8192, 8192).unwrap(), vec![0x5a; 8192]);
        let window = Window::new(&f, 8192, 1 << 19);
        assert_eq!(lent(&window, 8192, 4096).unwrap(), data[16384..20480]);
        assert!(
            f.read_lent((1 << 20) - 4096, 8192, &mut |_| {}).is_err(),
            "past the end"
        );
        assert!(
            window.read_lent(1 << 19, 1, &mut |_| {}).is_err(),
            "past the window"
        );
        // Devices without a mapping never lend.
        let mem = MemStorage::new(vec![0; 1 << 16]);
        assert!(lent(&mem, 0, 4096).is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A lent write stores into the page cache: what `pread`, a lent read and the file after a
    /// sync and a fresh open see; uncached pages, read-only files and ranges past the end are
    /// refused.
    #[test]
    fn a_lent_write_stores_into_cached_pages_only_and_reaches_the_file() {
        let (dir, path) = sparse_file("lent-w");
        let f = FileStorage::open(&path).unwrap();
        f.write_at(&[0x11; 512 << 10], 0).unwrap();
        let data: Vec<u8> = (0..128 << 10).map(|i: u32| (i * 29 + 5) as u8).collect();
        let mut seen = 0;
        assert!(f
            .write_lent(8192 + 16, data.len(), &mut |b| {
                seen = b.len();
                b.copy_from_slice(&data);
            })
            .unwrap());
        assert_eq!(seen, data.len());
        let mut back = vec![0u8; data.len() + 32];
        f.read_at(&mut back, 8192).unwrap();
        assert_eq!(back[..16], [0x11; 16], "before the range: untouched");
        assert!(back[16..][..data.len()] == data[..]);
        assert_eq!(
            back[16 + data.len()..],
            [0x11; 16],
            "after the range: untouched"
        );
        let mut lent = Vec::new();
        assert!(f
            .read_lent(8192 + 16, data.len(), &mut |b| lent = b.to_vec())
            .unwrap());
        assert!(lent == data);
        // The window's offsets, and a later `pwrite` over the same bytes, show through.
        let window = Window::new(&f, 4096, 1 << 19);
        assert!(window
            .write_lent(4096, 4096, &mut |b| b.fill(0x77))
            .unwrap());
        f.write_at(&[0x99; 16], 8192 + 4096 - 16).unwrap();
        let mut page = vec![0u8; 4096];
        f.read_at(&mut page, 8192).unwrap();
        assert_eq!(page[..4080], [0x77; 4080]);
        assert_eq!(page[4080..], [0x99; 16]);
        // A hole never written or read is not in the cache: nothing is lent.
        let mut called = false;
        assert!(!f
            .write_lent(768 << 10, 64 << 10, &mut |_| called = true)
            .unwrap());
        assert!(!called, "uncached bytes lent for writing");
        assert!(f.write_lent((1 << 20) - 4096, 8192, &mut |_| {}).is_err());
        f.sync().unwrap();
        drop(f);
        let file = std::fs::read(&path).unwrap();
        assert_eq!(file[8192..8192 + 4080], [0x77; 4080]);
        assert!(file[8192 + 4096..][..data.len() - 4096 + 16] == data[4096 - 16..]);
        // A file open read-only lends reads, never writes.
        let ro = FileStorage::open_read_only(&path).unwrap();
        assert!(ro.read_lent(0, 4096, &mut |_| {}).unwrap());
        assert!(!ro.write_lent(0, 4096, &mut |_| called = true).unwrap());
        assert!(!called, "a read-only file lent for writing");
        // Devices without a mapping never lend.
        let mem = MemStorage::new(vec![0; 1 << 16]);
        assert!(!mem.write_lent(0, 4096, &mut |_| called = true).unwrap());
        assert!(!called);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// `sync` writes back what a lent write stored: afterwards the page is clean, so the
    /// kernel has mapped it write-protected again and the next store into it faults (counted
    /// on this thread), which a store into a page still dirty does not.
    #[test]
    fn a_sync_writes_back_what_a_lent_write_stored() {
        // This thread's minor faults: field 10 of its `stat`, the 8th after the command name.
        // (Into a buffer on the stack: an allocation may fault too.)
        let faults = || {
            use std::io::Read;
            let mut stat = [0u8; 1024];
            let n = File::open("/proc/thread-self/stat")
                .unwrap()
                .read(&mut stat)
                .unwrap();
            let stat = std::str::from_utf8(&stat[..n]).unwrap();
            let after_name = &stat[stat.rfind(')').unwrap() + 1..];
            let minflt: u64 = after_name
                .split_whitespace()
                .nth(7)
                .unwrap()
                .parse()
                .unwrap();
            minflt
        };
        let (dir, path) = sparse_file("lent-sync");
        let f = FileStorage::open(&path).unwrap();
        f.write_at(&[0x11; 64 << 10], 0).unwrap();
        f.sync().unwrap();
        let store = |byte| assert!(f.write_lent(0, 4096, &mut |b| b.fill(byte)).unwrap());
        store(1);
        faults();
        let before = faults();
        store(2);
        assert_eq!(faults(), before, "a store into a dirty page faulted");
        f.sync().unwrap();
        let before = faults();
        store(3);
        assert!(faults() > before, "the page was still dirty after the sync");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_grown_under_its_holder_takes_writes_at_its_new_end() {
        let dir = std::env::temp_dir().join(format!("sectorcrypt-grown-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.img");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let f = FileStorage::open(&path).unwrap();
        f.write_at(b"abc", 4093).unwrap();
        assert!(f.write_at(b"abc", 4096).is_err(), "past the end");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8192)
            .unwrap();
        f.write_at(b"abc", 4096).unwrap();
        let mut back = [0u8; 3];
        f.read_at(&mut back, 4096).unwrap();
        assert_eq!(&back, b"abc");
        assert!(f.write_at(b"abcd", 8189).is_err(), "past the new end");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            8192,
            "never extended"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A file of `len` bytes of `byte`, opened, in a directory of its own for test `name`.
    fn scratch_file(name: &str, len: usize, byte: u8) -> (PathBuf, PathBuf, FileStorage) {
        let dir = std::env::temp_dir().join(format!("sectorcrypt-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.img");
        std::fs::write(&path, vec![byte; len]).unwrap();
        let f = FileStorage::open(&path).unwrap();
        (dir, path, f)
    }

    #[test]
    fn a_gathered_write_lands_whole_in_any_number_of_pieces() {
        let len = 1 << 20;
        let (dir, path, f) = scratch_file("gather", len, 0);
        // More pieces than one pwritev takes, of every size from empty to a few KiB.
        let pieces: Vec<Vec<u8>> = (0..2500u32)
            .map(|i| vec![(i % 251) as u8 + 1; (i as usize * 7919) % 300])
            .collect();
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let whole = pieces.concat();
        f.write_gathered(&refs, 1000).unwrap();
        let window = Window::new(&f, 4096, (len - 4096) as u64);
        window.write_gathered(&[b"ab", b"", b"c"], 10).unwrap();
        let back = std::fs::read(&path).unwrap();
        assert_eq!(&back[1000..1000 + 4096 - 1000], &whole[..4096 - 1000]);
        assert_eq!(&back[4096..4106], &whole[4096 - 1000..4106 - 1000]);
        assert_eq!(&back[4106..4109], b"abc");
        assert_eq!(&back[4109..1000 + whole.len()], &whole[4109 - 1000..]);
        assert!(back[..1000].iter().all(|&b| b == 0));
        assert!(back[1000 + whole.len()..].iter().all(|&b| b == 0));
        // Past the end: refused before anything is written.
        assert!(f
            .write_gathered(&[&[9u8; 10], &[9u8; 10]], len as u64 - 15)
            .is_err());
        assert!(window
            .write_gathered(&[&[9u8; 10]], (len - 4096 - 5) as u64)
            .is_err());
        assert_eq!(std::fs::read(&path).unwrap(), back);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_uncached_write_is_read_back_whether_or_not_it_is_aligned() {
        let len = 1 << 20;
        let (dir, path, f) = scratch_file("direct", len, 1);
        let mut cached = vec![0u8; 3 * UNCACHED_ALIGN];
        f.read_at(&mut cached, 0).unwrap();
        let mut buf = vec![0u8; 3 * UNCACHED_ALIGN + UNCACHED_ALIGN];
        let at = uncached_start(&buf);
        let page = UNCACHED_ALIGN;
        let aligned = &mut buf[at..at + 3 * page];
        aligned
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        let (one, two) = aligned.split_at(page);
        // On pages, past the page cache (its pages read above must not be read again).
        f.write_uncached(&[one, two], page as u64).unwrap();
        // Not on a page: through the cache.
        f.write_uncached(&[&one[..100]], 10).unwrap();
        f.write_uncached(&[&aligned[1..page + 1]], 8 * page as u64)
            .unwrap();
        let mut back = vec![0u8; len];
        f.read_at(&mut back, 0).unwrap();
        let mut expected = vec![1u8; len];
        expected[page..4 * page].copy_from_slice(aligned);
        expected[10..110].copy_from_slice(&aligned[..100]);
        expected[8 * page..9 * page].copy_from_slice(&aligned[1..page + 1]);
        assert!(back == expected);
        let direct_here = OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(&path)
            .is_ok();
        assert_eq!(
            f.direct.get().is_some_and(Option::is_some),
            direct_here,
            "O_DIRECT where the file system has it"
        );
        assert!(
            f.write_uncached(&[one], len as u64).is_err(),
            "past the end"
        );
        drop(f);
        assert!(std::fs::read(&path).unwrap() == expected);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn memory_bounds_are_checked() {
        let m = MemStorage::new(vec![0; 100]);
        m.write_at(&[1, 2, 3], 97).unwrap();
        assert!(m.write_at(&[1, 2, 3], 98).is_err());
        assert!(m.write_at(&[1], u64::MAX).is_err());
        let mut b = [0u8; 3];
        m.read_at(&mut b, 97).unwrap();
        assert_eq!(b, [1, 2, 3]);
        assert!(m.read_at(&mut b, 98).is_err());
        assert_eq!(m.len().unwrap(), 100);
    }

    #[test]
    fn file_reads_and_writes_in_place() {
        let dir = std::env::temp_dir().join(format!("sectorcrypt-storage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.img");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let f = FileStorage::open(&path).unwrap();
        f.write_at(b"abc", 4093).unwrap();
        assert!(f.write_at(b"abcd", 4093).is_err());
        f.sync().unwrap();
        let r = FileStorage::open_read_only(&path).unwrap();
        let mut b = [0u8; 3];
        r.read_at(&mut b, 4093).unwrap();
        assert_eq!(&b, b"abc");
        assert!(
            r.write_at(b"x", 0).is_err(),
            "a read-only file refuses writes"
        );
        assert_eq!(r.len().unwrap(), 4096);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
