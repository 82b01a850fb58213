//! `rbd:POOL[/NAMESPACE]/IMAGE` devices (CLI.md): wherever a command takes a DEVICE, an RBD image
//! can stand, reached with the global `--ceph-conf` and `--ceph-id`, as Ceph's own tools name
//! them, and `--ceph-timeout` for requests that must fail rather than wait for the cluster. Files, block devices and flash keep their own openers (and their own messages); each
//! asks [`rbd`] first.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sectorcrypt_storage::Storage;

use crate::exit::CliError;

/// How to reach a Ceph cluster, for `rbd:` devices (global options).
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct CephArgs {
    /// The ceph.conf for rbd: devices (default: $CEPH_CONF, then /etc/ceph/ceph.conf).
    #[arg(long = "ceph-conf", value_name = "FILE", global = true)]
    pub conf: Option<PathBuf>,
    /// The Ceph client id for rbd: devices (default: admin).
    #[arg(long = "ceph-id", value_name = "NAME", global = true)]
    pub id: Option<String>,
    /// Fail an rbd: request that the cluster has not answered within SECONDS, with an I/O
    /// error (default: wait for the cluster however long it takes, as librbd does).
    #[arg(long = "ceph-timeout", value_name = "SECONDS", global = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: Option<u64>,
}

static CEPH: OnceLock<CephArgs> = OnceLock::new();

/// Record the command line's Ceph options (once, before any device is opened).
pub(crate) fn configure(args: CephArgs) {
    let _ = CEPH.set(args);
}

/// NBD worker threads per connection for an RBD image: a network store needs many requests in
/// flight (qemu and fio queue 16 to 64), and a waiting worker costs only its stack.
pub(crate) const RBD_WORKERS: usize = 32;

/// Whether `device` names an RBD image.
pub(crate) fn is_rbd(device: &Path) -> bool {
    device.to_str().is_some_and(|name| name.starts_with("rbd:"))
}

/// `device` opened for reading, or reading and writing, if it names an RBD image; `None` for
/// any other name. A writable image is locked against other writers (exit 5 if one holds it);
/// a missing image is exit 4.
pub(crate) fn rbd(device: &Path, write: bool) -> Option<Result<Box<dyn Storage>, CliError>> {
    is_rbd(device).then(|| {
        let name = device.to_str().unwrap_or_default();
        open_rbd(name, write, CEPH.get_or_init(CephArgs::default))
    })
}

#[cfg(feature = "rbd")]
fn open_rbd(name: &str, write: bool, ceph: &CephArgs) -> Result<Box<dyn Storage>, CliError> {
    use crate::exit::Code;
    use sectorcrypt_storage::rbd::{CephOptions, RbdSpec, RbdStorage};
    let spec = match RbdSpec::parse(name) {
        Some(Ok(spec)) => spec,
        Some(Err(why)) => return Err(CliError::usage(why)),
        None => unreachable!("the caller checked the rbd: prefix"),
    };
    let options = CephOptions {
        conf: ceph.conf.as_deref(),
        id: ceph.id.as_deref(),
        op_timeout: ceph.timeout.map(std::time::Duration::from_secs),
    };
    // One handle per image in this process: a command that opens the device twice (header and
    // data on one image) must not find its own exclusive lock in the way.
    static OPEN: std::sync::Mutex<Vec<(RbdSpec, std::sync::Weak<RbdStorage>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut open = OPEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    open.retain(|(_, handle)| handle.strong_count() > 0);
    let shared = open
        .iter()
        .filter(|(s, _)| *s == spec)
        .filter_map(|(_, handle)| handle.upgrade())
        .find(|image| image.is_writable() || !write);
    if let Some(image) = shared {
        return Ok(Box::new(image));
    }
    let image =
        with_lock_note(&spec, write, || RbdStorage::open(&spec, write, &options)).map_err(|e| {
            CliError {
                code: match e.kind() {
                    std::io::ErrorKind::NotFound => Code::Device,
                    std::io::ErrorKind::ResourceBusy => Code::Busy,
                    _ => Code::Usage,
                },
                message: e.to_string(),
            }
        })?;
    let image = std::sync::Arc::new(image);
    open.push((spec, std::sync::Arc::downgrade(&image)));
    Ok(Box::new(image))
}

/// Run `open`, saying on standard error if a writable open waits for the image's exclusive
/// lock: a writer that died without closing (killed, its host lost) keeps the lock until the
/// OSD notices its watch is gone (`osd_client_watch_timeout`, 30 s by default), and librbd
/// waits that long before breaking it. A live writer refuses at once.
#[cfg(feature = "rbd")]
fn with_lock_note<T>(
    spec: &sectorcrypt_storage::rbd::RbdSpec,
    write: bool,
    open: impl FnOnce() -> T,
) -> T {
    if !write {
        return open();
    }
    let (done, waiting) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            if waiting.recv_timeout(std::time::Duration::from_secs(3))
                == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                eprintln!(
                    "sectorcrypt: waiting for {spec}'s exclusive lock (a writer that stopped \
                     without closing holds it until the cluster notices, about 30 s)"
                );
            }
        });
        let opened = open();
        drop(done);
        opened
    })
}

#[cfg(not(feature = "rbd"))]
fn open_rbd(name: &str, _write: bool, _ceph: &CephArgs) -> Result<Box<dyn Storage>, CliError> {
    Err(CliError::usage(format!(
        "{name}: this sectorcrypt was built without RBD support (cargo build --features rbd, \
         with librbd-dev installed)"
    )))
}
