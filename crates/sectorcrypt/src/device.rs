//! Opening a DEVICE argument: a file or block device, or a Ceph RBD image named
//! `rbd:POOL[/NAMESPACE]/IMAGE` (CLI.md), reached with `--ceph-conf` and `--ceph-id` as Ceph's own
//! tools name them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sectorcrypt_storage::{FileStorage, Storage};

use crate::exit::{CliError, Code};

/// How to reach a Ceph cluster, for `rbd:` devices.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct CephArgs {
    /// The ceph.conf for rbd: devices (default: $CEPH_CONF, then /etc/ceph/ceph.conf).
    #[arg(long = "ceph-conf", value_name = "FILE")]
    pub conf: Option<PathBuf>,
    /// The Ceph client id for rbd: devices (default: admin).
    #[arg(long = "ceph-id", value_name = "NAME")]
    pub id: Option<String>,
}

/// Open `device` for reading, or reading and writing. A writable RBD image is locked against
/// other writers (exit 5 if one holds it); a missing file or image is exit 4.
pub(crate) fn open(
    device: &Path,
    write: bool,
    ceph: &CephArgs,
) -> Result<Arc<dyn Storage>, CliError> {
    let name = device.to_string_lossy();
    if name.starts_with("rbd:") {
        return open_rbd(&name, write, ceph);
    }
    let opened = if write {
        FileStorage::open(device)
    } else {
        FileStorage::open_read_only(device)
    };
    let storage = opened.map_err(|e| CliError {
        code: if e.kind() == std::io::ErrorKind::PermissionDenied {
            Code::Usage
        } else {
            Code::Device
        },
        message: format!("cannot open {}: {e}", device.display()),
    })?;
    Ok(Arc::new(storage))
}

#[cfg(feature = "rbd")]
fn open_rbd(name: &str, write: bool, ceph: &CephArgs) -> Result<Arc<dyn Storage>, CliError> {
    use sectorcrypt_storage::rbd::{CephOptions, RbdSpec, RbdStorage};
    let spec = match RbdSpec::parse(name) {
        Some(Ok(spec)) => spec,
        Some(Err(why)) => return Err(CliError::usage(why)),
        None => unreachable!("the caller checked the rbd: prefix"),
    };
    let options = CephOptions {
        conf: ceph.conf.as_deref(),
        id: ceph.id.as_deref(),
    };
    let image = RbdStorage::open(&spec, write, &options).map_err(|e| CliError {
        code: match e.kind() {
            std::io::ErrorKind::NotFound => Code::Device,
            std::io::ErrorKind::ResourceBusy => Code::Busy,
            _ => Code::Usage,
        },
        message: e.to_string(),
    })?;
    Ok(Arc::new(image))
}

#[cfg(not(feature = "rbd"))]
fn open_rbd(name: &str, _write: bool, _ceph: &CephArgs) -> Result<Arc<dyn Storage>, CliError> {
    Err(CliError::usage(format!(
        "{name}: this sectorcrypt was built without RBD support (cargo build --features rbd, \
         with librbd-dev installed)"
    )))
}
