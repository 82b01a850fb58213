//! `rbd:POOL[/NAMESPACE]/IMAGE` devices (docs/CLI.md): wherever a command takes a DEVICE, an RBD
//! image can stand, reached with `--ceph-conf` and `--ceph-id`, as Ceph's own tools name them,
//! and `--ceph-timeout` for requests that must fail rather than wait for the cluster; every
//! command that takes a DEVICE has these options, under their own heading. Files, block devices
//! and flash keep their own openers (and their own messages); each asks [`rbd`] first.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sectorcrypt_storage::Storage;

use crate::exit::CliError;

/// How to reach a Ceph cluster, for `rbd:` devices (read only where RBD support is built in).
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "rbd"), allow(dead_code))]
pub(crate) struct CephArgs {
    /// `--ceph-conf FILE`.
    pub conf: Option<PathBuf>,
    /// `--ceph-id NAME`.
    pub id: Option<String>,
    /// `--ceph-timeout SECONDS`.
    pub timeout: Option<u64>,
}

/// The help heading of the Ceph options.
const CEPH_HEADING: &str = "Ceph RBD options (for rbd:POOL/IMAGE devices)";

/// The Ceph options, as every command that takes a DEVICE has them (and only those: they would
/// be noise in `flash` or `generate`).
fn ceph_options() -> [clap::Arg; 3] {
    use clap::Arg;
    [
        Arg::new("ceph_conf")
            .long("ceph-conf")
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .help_heading(CEPH_HEADING)
            .help("The ceph.conf for rbd: devices (default: $CEPH_CONF, then /etc/ceph/ceph.conf)"),
        Arg::new("ceph_id")
            .long("ceph-id")
            .value_name("NAME")
            .help_heading(CEPH_HEADING)
            .help("The Ceph client id for rbd: devices (default: admin)"),
        Arg::new("ceph_timeout")
            .long("ceph-timeout")
            .value_name("SECONDS")
            .value_parser(clap::value_parser!(u64).range(1..))
            .help_heading(CEPH_HEADING)
            .help(
                "Fail an rbd: request that the cluster has not answered within SECONDS, with an \
                 I/O error (default: wait for the cluster however long it takes, as librbd does)",
            ),
    ]
}

/// `cmd` with the Ceph options added to every subcommand that takes a device: all but those
/// named in `without` (a family's name for all of it, "family command" for one of its commands).
pub(crate) fn with_ceph_options(cmd: clap::Command, without: &[&str]) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .filter(|n| n != "help")
        .collect();
    names.iter().fold(cmd, |cmd, name| {
        if without.contains(&name.as_str()) {
            return cmd;
        }
        let inner: Vec<&str> = without
            .iter()
            .filter_map(|w| w.strip_prefix(name.as_str())?.strip_prefix(' '))
            .collect();
        cmd.mut_subcommand(name, |sub| {
            if sub.has_subcommands() {
                with_ceph_options(sub, &inner)
            } else {
                sub.args(ceph_options())
            }
        })
    })
}

/// The Ceph options given to the command that `matches` (the whole command line's) ran.
pub(crate) fn ceph_args_of(matches: &clap::ArgMatches) -> CephArgs {
    let mut m = matches;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    CephArgs {
        conf: m
            .try_get_one::<PathBuf>("ceph_conf")
            .ok()
            .flatten()
            .cloned(),
        id: m.try_get_one::<String>("ceph_id").ok().flatten().cloned(),
        timeout: m.try_get_one::<u64>("ceph_timeout").ok().flatten().copied(),
    }
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
    let image = with_lock_note(&spec, write, || {
        RbdStorage::open_shared(&spec, write, &options)
    })
    .map_err(|e| CliError {
        code: match e.kind() {
            std::io::ErrorKind::NotFound => Code::Device,
            std::io::ErrorKind::ResourceBusy => Code::Busy,
            _ => Code::Usage,
        },
        message: e.to_string(),
    })?;
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
