//! A Ceph RBD image as storage, through librbd (feature `rbd`; links librados and librbd).
//!
//! Names take the form `rbd:POOL/IMAGE` or `rbd:POOL/NAMESPACE/IMAGE`. The cluster is found by
//! a ceph.conf (`--ceph-conf`, else librados' own search: `$CEPH_CONF`, `/etc/ceph/ceph.conf`,
//! ...) and reached as a client id (`--ceph-id`, default `admin`), as Ceph's tools do.
//!
//! Design:
//! - Requests in pieces (`read_pieces`, `write_pieces`: what the volume layer uses between the
//!   cipher and the storage) go through librbd's asynchronous calls in runs of 1 MiB, every run
//!   in flight at once: a read decrypts its first run while the others are still on the
//!   network, and a write encrypts its next run while the last ones travel. Runs, rather than
//!   the volume's cache-sized pieces, because each request is an operation for the OSDs. Single reads and writes use the
//!   synchronous calls (librbd splits them over objects itself). librbd is thread-safe on one
//!   image handle, so the servers' worker threads add their requests on top.
//! - By default a request waits as long as the cluster needs (an OSD that restarts is waited
//!   for, as librbd does). With an operation timeout ([`CephOptions::op_timeout`], librados'
//!   `rados_osd_op_timeout` and `rados_mon_op_timeout`) a request that takes longer fails with
//!   ETIMEDOUT instead: the client sees an I/O error, never a write acknowledged that is not in
//!   the cluster.
//! - A writable open takes the image's exclusive lock explicitly (`rbd_lock_acquire`): librbd
//!   then refuses writes from every other client (EROFS), instead of handing the lock over on
//!   request as it does by default. A second writer is refused at open ([`io::ErrorKind::ResourceBusy`]);
//!   read-only opens take no lock and coexist with the writer.
//! - `sync` is `rbd_flush`: librbd acknowledges a write once the OSDs have it, but its cache
//!   (when enabled) holds writes until a flush.
//! - This module is the crate's only `unsafe` code: the FFI declarations and one call per
//!   function, each with a SAFETY comment.

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::path::Path;
use std::ptr;
use std::time::Duration;

type RadosT = *mut c_void;
type IoCtxT = *mut c_void;
type ImageT = *mut c_void;
type CompletionT = *mut c_void;
type CallbackT = extern "C" fn(completion: CompletionT, arg: *mut c_void);

/// `RBD_LOCK_MODE_EXCLUSIVE` of `<rbd/librbd.h>`.
const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

#[link(name = "rados")]
extern "C" {
    fn rados_create(cluster: *mut RadosT, id: *const c_char) -> c_int;
    fn rados_conf_read_file(cluster: RadosT, path: *const c_char) -> c_int;
    fn rados_conf_set(cluster: RadosT, option: *const c_char, value: *const c_char) -> c_int;
    fn rados_connect(cluster: RadosT) -> c_int;
    fn rados_shutdown(cluster: RadosT);
    fn rados_ioctx_create(cluster: RadosT, pool: *const c_char, ioctx: *mut IoCtxT) -> c_int;
    fn rados_ioctx_set_namespace(ioctx: IoCtxT, nspace: *const c_char);
    fn rados_ioctx_destroy(ioctx: IoCtxT);
}

#[link(name = "rbd")]
extern "C" {
    fn rbd_open(io: IoCtxT, name: *const c_char, image: *mut ImageT, snap: *const c_char) -> c_int;
    fn rbd_open_read_only(
        io: IoCtxT,
        name: *const c_char,
        image: *mut ImageT,
        snap: *const c_char,
    ) -> c_int;
    fn rbd_close(image: ImageT) -> c_int;
    fn rbd_get_size(image: ImageT, size: *mut u64) -> c_int;
    fn rbd_lock_acquire(image: ImageT, mode: c_int) -> c_int;
    fn rbd_read2(image: ImageT, ofs: u64, len: usize, buf: *mut c_char, flags: c_int) -> isize;
    fn rbd_write2(image: ImageT, ofs: u64, len: usize, buf: *const c_char, flags: c_int) -> isize;
    fn rbd_discard(image: ImageT, ofs: u64, len: u64) -> c_int;
    fn rbd_get_stripe_unit(image: ImageT, stripe_unit: *mut u64) -> c_int;
    fn rbd_get_stripe_count(image: ImageT, stripe_count: *mut u64) -> c_int;
    fn rbd_flush(image: ImageT) -> c_int;
    fn rbd_aio_create_completion(
        arg: *mut c_void,
        complete: CallbackT,
        completion: *mut CompletionT,
    ) -> c_int;
    fn rbd_aio_read2(
        image: ImageT,
        ofs: u64,
        len: usize,
        buf: *mut c_char,
        completion: CompletionT,
        flags: c_int,
    ) -> c_int;
    fn rbd_aio_write2(
        image: ImageT,
        ofs: u64,
        len: usize,
        buf: *const c_char,
        completion: CompletionT,
        flags: c_int,
    ) -> c_int;
    fn rbd_aio_wait_for_complete(completion: CompletionT) -> c_int;
    fn rbd_aio_get_return_value(completion: CompletionT) -> isize;
    fn rbd_aio_release(completion: CompletionT);
}

/// Pieces go to librbd in runs of about this many bytes, one request each: every request costs
/// the OSD an operation (and, replicated, one per replica), so a 1 MiB write in 256 KiB pieces
/// is one request, not four; a larger one still has several runs in flight.
const RUN: usize = 1 << 20;

/// The bytes of one run: whole pieces, at least one.
fn run_len(piece: usize) -> usize {
    piece * (RUN / piece).max(1)
}

/// The completion callback: nothing to do, completions are waited for.
extern "C" fn no_callback(_completion: CompletionT, _arg: *mut c_void) {}

/// One asynchronous request in flight. Dropping it waits for the request to end, so the buffer
/// it reads into or writes from (which the owner keeps borrowed for longer) is never released
/// while librbd may still touch it.
struct InFlight {
    completion: CompletionT,
    len: usize,
}

impl InFlight {
    /// Wait for the request; its error, or a short transfer, as an `io::Error`.
    fn wait(&mut self, what: &dyn Fn() -> String) -> io::Result<()> {
        // SAFETY: `completion` was created by `rbd_aio_create_completion`, handed to one aio
        // call, and is released only in `Drop`.
        let r = unsafe {
            rbd_aio_wait_for_complete(self.completion);
            rbd_aio_get_return_value(self.completion)
        };
        if r < 0 {
            return Err(rbd_error(&what(), r as i64));
        }
        // Reads return the bytes read, writes 0 or the bytes written.
        if r != 0 && r as usize != self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: {r} of {} bytes", what(), self.len),
            ));
        }
        Ok(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // SAFETY: as in `wait`; waiting again after a completed wait returns at once, and the
        // completion is released exactly once, after the request has ended.
        unsafe {
            rbd_aio_wait_for_complete(self.completion);
            rbd_aio_release(self.completion);
        }
    }
}

/// Where an image is: pool, namespace (empty: the default) and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    /// The pool.
    pub pool: String,
    /// The namespace inside the pool ("" for none).
    pub namespace: String,
    /// The image.
    pub image: String,
}

impl RbdSpec {
    /// `rbd:POOL/IMAGE` or `rbd:POOL/NAMESPACE/IMAGE`; `None` for any other name (a path).
    pub fn parse(name: &str) -> Option<Result<RbdSpec, String>> {
        let rest = name.strip_prefix("rbd:")?;
        let parts: Vec<&str> = rest.split('/').collect();
        let bad = || {
            Err(format!(
                "{name}: expected rbd:POOL/IMAGE or rbd:POOL/NAMESPACE/IMAGE"
            ))
        };
        if parts
            .iter()
            .any(|p| p.is_empty() || p.contains('\0') || p.contains('@'))
        {
            return Some(bad());
        }
        Some(match parts.as_slice() {
            [pool, image] => Ok(RbdSpec {
                pool: pool.to_string(),
                namespace: String::new(),
                image: image.to_string(),
            }),
            [pool, namespace, image] => Ok(RbdSpec {
                pool: pool.to_string(),
                namespace: namespace.to_string(),
                image: image.to_string(),
            }),
            _ => bad(),
        })
    }
}

impl std::fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "rbd:{}/{}", self.pool, self.image)
        } else {
            write!(f, "rbd:{}/{}/{}", self.pool, self.namespace, self.image)
        }
    }
}

/// How to reach the cluster.
#[derive(Clone, Debug, Default)]
pub struct CephOptions<'a> {
    /// A ceph.conf; `None`: librados' own search.
    pub conf: Option<&'a Path>,
    /// The client id (`admin` for `client.admin`); `None`: `admin`.
    pub id: Option<&'a str>,
    /// How long one request may take before it fails with ETIMEDOUT; `None`: requests wait
    /// for the cluster however long it takes (librados' default).
    pub op_timeout: Option<Duration>,
}

/// A librbd error code as an `io::Error`, with what failed.
fn rbd_error(what: &str, code: i64) -> io::Error {
    // EIO for anything that is not a negative errno.
    let errno = i32::try_from(-code).ok().filter(|e| *e > 0).unwrap_or(5);
    let os = io::Error::from_raw_os_error(errno);
    io::Error::new(os.kind(), format!("{what}: {os}"))
}

fn c_string(what: &str, s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

/// The connection, pool context and image; closed in reverse order on drop.
struct Handles {
    cluster: RadosT,
    ioctx: IoCtxT,
    image: ImageT,
}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: each handle is either null (never opened) or was returned by its open call
        // and is released exactly once, image before context before cluster.
        unsafe {
            if !self.image.is_null() {
                rbd_close(self.image);
            }
            if !self.ioctx.is_null() {
                rados_ioctx_destroy(self.ioctx);
            }
            if !self.cluster.is_null() {
                rados_shutdown(self.cluster);
            }
        }
    }
}

/// An open RBD image.
pub struct RbdStorage {
    handles: Handles,
    spec: RbdSpec,
    writable: bool,
}

// SAFETY: librbd's image handle may be used from several threads at once (its calls lock
// internally); the handles are only released in `Drop`, which has `&mut self`.
unsafe impl Send for RbdStorage {}
// SAFETY: as for `Send`: every method takes `&self` and calls thread-safe librbd functions.
unsafe impl Sync for RbdStorage {}

impl std::fmt::Debug for RbdStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdStorage")
            .field("spec", &self.spec)
            .field("writable", &self.writable)
            .finish_non_exhaustive()
    }
}

impl RbdStorage {
    /// The handle this process has on `spec` (writable if `write`), opened with [`Self::open`]
    /// on first use: one handle per image per process, so that a command that opens the image
    /// twice (its header and its data) does not find its own exclusive lock in the way. A
    /// read-only handle is shared by readers; a writer gets a handle of its own the first time.
    pub fn open_shared(
        spec: &RbdSpec,
        write: bool,
        ceph: &CephOptions<'_>,
    ) -> io::Result<std::sync::Arc<Self>> {
        use std::sync::{Arc, Mutex, PoisonError, Weak};
        static OPEN: Mutex<Vec<(RbdSpec, Weak<RbdStorage>)>> = Mutex::new(Vec::new());
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|(_, handle)| handle.strong_count() > 0);
        let shared = open
            .iter()
            .filter(|(s, _)| s == spec)
            .filter_map(|(_, handle)| handle.upgrade())
            .find(|image| image.is_writable() || !write);
        if let Some(image) = shared {
            return Ok(image);
        }
        let image = Arc::new(Self::open(spec, write, ceph)?);
        open.push((spec.clone(), Arc::downgrade(&image)));
        Ok(image)
    }

    /// Open `spec`; `write` takes the image's exclusive lock, and fails with
    /// [`io::ErrorKind::ResourceBusy`] if another client holds it.
    pub fn open(spec: &RbdSpec, write: bool, ceph: &CephOptions<'_>) -> io::Result<Self> {
        let id = c_string("the client id", ceph.id.unwrap_or("admin"))?;
        let conf = match ceph.conf {
            Some(p) => Some(c_string(
                "the ceph.conf path",
                p.to_str().ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the ceph.conf path is not UTF-8",
                    )
                })?,
            )?),
            None => None,
        };
        let pool = c_string("the pool name", &spec.pool)?;
        let namespace = c_string("the namespace", &spec.namespace)?;
        let image = c_string("the image name", &spec.image)?;
        let mut h = Handles {
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
            image: ptr::null_mut(),
        };
        // SAFETY: `h.cluster` is a valid out-pointer; `id` is a NUL-terminated string that
        // outlives the call.
        let r = unsafe { rados_create(&mut h.cluster, id.as_ptr()) };
        if r < 0 {
            h.cluster = ptr::null_mut();
            return Err(rbd_error("cannot create a Ceph client", r.into()));
        }
        let conf_ptr = conf.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // SAFETY: `h.cluster` was created above and not yet connected; `conf_ptr` is null (the
        // default search) or a NUL-terminated path that outlives the call.
        let r = unsafe { rados_conf_read_file(h.cluster, conf_ptr) };
        if r < 0 {
            let which = ceph.conf.map_or("the default ceph.conf".to_string(), |p| {
                p.display().to_string()
            });
            return Err(rbd_error(&format!("cannot read {which}"), r.into()));
        }
        if let Some(t) = ceph.op_timeout {
            // Whole seconds as librados takes them; at least one (0 means "no timeout").
            let secs = t.as_secs_f64().ceil().max(1.0).to_string();
            let value = c_string("the timeout", &secs)?;
            for option in [
                c"rados_osd_op_timeout",
                c"rados_mon_op_timeout",
                c"client_mount_timeout",
            ] {
                // SAFETY: `h.cluster` is not yet connected; both strings outlive the call.
                let r = unsafe { rados_conf_set(h.cluster, option.as_ptr(), value.as_ptr()) };
                if r < 0 {
                    return Err(rbd_error("cannot set the Ceph timeout", r.into()));
                }
            }
        }
        // SAFETY: `h.cluster` is configured and not yet connected.
        let r = unsafe { rados_connect(h.cluster) };
        if r < 0 {
            return Err(rbd_error("cannot connect to the Ceph cluster", r.into()));
        }
        // SAFETY: `h.cluster` is connected; `pool` outlives the call; `h.ioctx` is a valid
        // out-pointer.
        let r = unsafe { rados_ioctx_create(h.cluster, pool.as_ptr(), &mut h.ioctx) };
        if r < 0 {
            h.ioctx = ptr::null_mut();
            return Err(rbd_error(
                &format!("cannot open pool {}", spec.pool),
                r.into(),
            ));
        }
        // SAFETY: `h.ioctx` is a live context; librados copies the namespace string.
        unsafe { rados_ioctx_set_namespace(h.ioctx, namespace.as_ptr()) };
        // SAFETY: `h.ioctx` is live, `image` outlives the call, `h.image` is a valid
        // out-pointer, and a null snapshot name opens the image head.
        let r = unsafe {
            if write {
                rbd_open(h.ioctx, image.as_ptr(), &mut h.image, ptr::null())
            } else {
                rbd_open_read_only(h.ioctx, image.as_ptr(), &mut h.image, ptr::null())
            }
        };
        if r < 0 {
            h.image = ptr::null_mut();
            return Err(rbd_error(&format!("cannot open {spec}"), r.into()));
        }
        if write {
            // SAFETY: `h.image` is an open image.
            let r = unsafe { rbd_lock_acquire(h.image, RBD_LOCK_MODE_EXCLUSIVE) };
            if r < 0 {
                let e = rbd_error(&format!("cannot lock {spec}"), r.into());
                // EROFS / EBUSY: another client holds the lock.
                return Err(if matches!(-r, 30 | 16) {
                    io::Error::new(
                        io::ErrorKind::ResourceBusy,
                        format!("{spec} is in use by another writer (its exclusive lock is held)"),
                    )
                } else {
                    e
                });
            }
        }
        Ok(RbdStorage {
            handles: h,
            spec: spec.clone(),
            writable: write,
        })
    }

    /// Whether the image was opened for writing (and locked).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Start one asynchronous request of `len` bytes: `start` hands the completion to the aio
    /// call and returns what it returned.
    fn submit(
        &self,
        len: usize,
        what: &str,
        start: impl FnOnce(CompletionT) -> c_int,
    ) -> io::Result<InFlight> {
        let mut completion = ptr::null_mut();
        // SAFETY: `completion` is a valid out-pointer; the callback does nothing with its
        // (null) argument.
        let r = unsafe { rbd_aio_create_completion(ptr::null_mut(), no_callback, &mut completion) };
        if r < 0 {
            return Err(rbd_error("cannot create an RBD completion", r.into()));
        }
        let r = start(completion);
        if r < 0 {
            // Never submitted: released without waiting for a request that does not exist.
            // SAFETY: the completion was created above and handed to no request.
            unsafe { rbd_aio_release(completion) };
            return Err(rbd_error(&format!("{what} {}", self.spec), r.into()));
        }
        Ok(InFlight { completion, len })
    }

    fn check_range(&self, what: &str, offset: u64, len: usize) -> io::Result<()> {
        let size = super::Storage::len(self)?;
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(super::past_end(what, offset, len, size));
        }
        Ok(())
    }
}

impl super::Storage for RbdStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range("a read", offset, buf.len())?;
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: the image is open; `rest` is writable for `rest.len()` bytes.
            let n = unsafe {
                rbd_read2(
                    self.handles.image,
                    offset + done as u64,
                    rest.len(),
                    rest.as_mut_ptr().cast(),
                    0,
                )
            };
            if n < 0 {
                return Err(rbd_error(&format!("reading {}", self.spec), n as i64));
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{} ended early at byte {}", self.spec, offset + done as u64),
                ));
            }
            done += n as usize;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_range("a write", offset, buf.len())?;
        let mut done = 0;
        while done < buf.len() {
            let rest = &buf[done..];
            // SAFETY: the image is open; `rest` is readable for `rest.len()` bytes.
            let n = unsafe {
                rbd_write2(
                    self.handles.image,
                    offset + done as u64,
                    rest.len(),
                    rest.as_ptr().cast(),
                    0,
                )
            };
            if n <= 0 {
                // 0 bytes written is no progress: EIO.
                return Err(rbd_error(&format!("writing {}", self.spec), n as i64));
            }
            done += n as usize;
        }
        Ok(())
    }

    fn read_pieces(
        &self,
        buf: &mut [u8],
        offset: u64,
        piece: usize,
        each: &mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        self.check_range("a read", offset, buf.len())?;
        let run = run_len(piece);
        let mut runs: Vec<&mut [u8]> = buf.chunks_mut(run).collect();
        // Declared after `runs`, so on an early return the requests are waited for (dropped)
        // before the slices go.
        let mut in_flight = Vec::with_capacity(runs.len());
        for (r, part) in runs.iter_mut().enumerate() {
            let (at, len, buf) = (offset + (r * run) as u64, part.len(), part.as_mut_ptr());
            in_flight.push(self.submit(len, "reading", |completion| {
                // SAFETY: the image is open; the run stays valid and untouched until the
                // request has been waited for (below, or when `in_flight` drops), and no other
                // run overlaps it.
                unsafe { rbd_aio_read2(self.handles.image, at, len, buf.cast(), completion, 0) }
            })?);
        }
        let per_run = run / piece;
        for (r, (part, request)) in runs.iter_mut().zip(in_flight.iter_mut()).enumerate() {
            request.wait(&|| format!("reading {}", self.spec))?;
            for (j, p) in part.chunks_mut(piece).enumerate() {
                each(r * per_run + j, p)?;
            }
        }
        Ok(())
    }

    fn write_pieces(
        &self,
        buf: &mut [u8],
        offset: u64,
        piece: usize,
        prepare: &mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        self.check_range("a write", offset, buf.len())?;
        let run = run_len(piece);
        let per_run = run / piece;
        let mut runs: Vec<&mut [u8]> = buf.chunks_mut(run).collect();
        let mut in_flight = Vec::with_capacity(runs.len());
        for (r, part) in runs.iter_mut().enumerate() {
            for (j, p) in part.chunks_mut(piece).enumerate() {
                prepare(r * per_run + j, p)?;
            }
            let (at, len, buf) = (offset + (r * run) as u64, part.len(), part.as_ptr());
            in_flight.push(self.submit(len, "writing", |completion| {
                // SAFETY: the image is open; the run stays valid and unchanged until the
                // request has been waited for (below, or when `in_flight` drops), and no other
                // run overlaps it.
                unsafe { rbd_aio_write2(self.handles.image, at, len, buf.cast(), completion, 0) }
            })?);
        }
        // Every request is waited for, and the first error reported.
        let mut result = Ok(());
        for request in &mut in_flight {
            let r = request.wait(&|| format!("writing {}", self.spec));
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    fn sync(&self) -> io::Result<()> {
        // SAFETY: the image is open.
        let r = unsafe { rbd_flush(self.handles.image) };
        if r < 0 {
            return Err(rbd_error(&format!("flushing {}", self.spec), r.into()));
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(
            "a discard",
            offset,
            usize::try_from(len).unwrap_or(usize::MAX),
        )?;
        // SAFETY: the image is open.
        let r = unsafe { rbd_discard(self.handles.image, offset, len) };
        if r < 0 {
            return Err(rbd_error(&format!("discarding in {}", self.spec), r.into()));
        }
        Ok(())
    }

    /// The stripe period (stripe unit times stripe count; the object size unless the image
    /// uses fancy striping): librbd lays its own LUKS data out at a multiple of it, and newer
    /// releases refuse a data offset that is not.
    fn optimal_io_size(&self) -> Option<u64> {
        let (mut unit, mut count) = (0u64, 0u64);
        // SAFETY: the image is open; `unit` and `count` are valid out-pointers.
        let ok = unsafe {
            rbd_get_stripe_unit(self.handles.image, &mut unit) >= 0
                && rbd_get_stripe_count(self.handles.image, &mut count) >= 0
        };
        ok.then(|| unit.saturating_mul(count)).filter(|&p| p > 0)
    }

    fn len(&self) -> io::Result<u64> {
        let mut size = 0u64;
        // SAFETY: the image is open; `size` is a valid out-pointer.
        let r = unsafe { rbd_get_size(self.handles.image, &mut size) };
        if r < 0 {
            return Err(rbd_error(&format!("sizing {}", self.spec), r.into()));
        }
        Ok(size)
    }

    fn name(&self) -> String {
        self.spec.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::RbdSpec;

    #[test]
    fn names() {
        assert_eq!(RbdSpec::parse("disk.img"), None);
        let s = RbdSpec::parse("rbd:pool/img").unwrap().unwrap();
        assert_eq!(
            (s.pool.as_str(), s.namespace.as_str(), s.image.as_str()),
            ("pool", "", "img")
        );
        assert_eq!(s.to_string(), "rbd:pool/img");
        let s = RbdSpec::parse("rbd:pool/ns/img").unwrap().unwrap();
        assert_eq!(s.to_string(), "rbd:pool/ns/img");
        for bad in [
            "rbd:",
            "rbd:pool",
            "rbd:pool/",
            "rbd:/img",
            "rbd:a/b/c/d",
            "rbd:p/i@snap",
        ] {
            assert!(RbdSpec::parse(bad).unwrap().is_err(), "{bad}");
        }
    }
}
