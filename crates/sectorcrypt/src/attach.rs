//! `flash attach`: unlock an encrypted flash, attach its UBI, and expose every volume to
//! ordinary tools until SIGINT/SIGTERM or unmount: as the file `MOUNTPOINT/<volume name>`
//! (FUSE) and as the NBD export `<volume name>` on the socket `DIR/<volume name>.sock`. Static
//! volumes are read-only; a write into a dynamic volume replaces the LEBs it touches atomically
//! (`ubi::block`).
//!
//! Under the policies that hide free space at rest, the free space the session leaves erased is
//! hidden when it ends and, so that a power cut does not leave it visible for long, every
//! `--hide-interval` seconds (UBI synced first). Each hiding costs, later, one erase per block
//! written into again, so the interval trades exposure for wear.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use sectorcrypt_fuse::{MountFile, MountOptions, Stop, Unmounted};
use sectorcrypt_nbd::{Error as NbdError, Listen, Server, ServerOptions, StopHandle, Tls};
use sectorcrypt_secret::signals::{self, SIGINT, SIGTERM};
use sectorcrypt_storage::Storage;
use sectorcrypt_ubi::block::VolumeStorage;
use sectorcrypt_ubi::{AttachOptions, Ubi};
use sectorcrypt_volume::{Layout, Volume, VolumeOptions};

use crate::exit::{CliError, Code};
use crate::flash::OpenArgs;
use crate::mount::fuse_error;
use crate::serve::TlsArgs;

#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("exports").required(true).multiple(true).args(["mountpoint", "socket_dir"]))]
pub(crate) struct AttachArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// An empty directory: each volume appears in it as a regular file named after it.
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: Option<PathBuf>,
    /// Serve each volume over NBD on the Unix socket DIR/<volume name>.sock (mode 0600), export
    /// name = volume name.
    #[arg(long = "socket-dir", value_name = "DIR")]
    socket_dir: Option<PathBuf>,
    #[command(flatten)]
    tls: TlsArgs,
    /// Expose every volume read-only.
    #[arg(short = 'r', long)]
    readonly: bool,
    /// Hide the free space left erased every this many seconds while attached (0: only when
    /// detaching), under the policies that hide it at rest.
    #[arg(long = "hide-interval", value_name = "SECONDS", default_value_t = 600)]
    hide_interval: u64,
}

/// One exported volume: its name and the block view of it.
struct Export {
    name: String,
    volume: Arc<Volume>,
}

/// Every volume of `ubi` as a `Volume` (no cipher: the encryption is below UBI). A volume that
/// cannot be opened (a static one failing its CRC, an update cut short) is left out, with a
/// warning.
fn exports(ubi: &Arc<Ubi>, read_only: bool) -> Result<Vec<Export>, CliError> {
    let mut out = Vec::new();
    for v in ubi.info().volumes {
        let storage = match VolumeStorage::open(Arc::clone(ubi), v.id, read_only) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "sectorcrypt: volume {} ({}) is not exported: {e}",
                    v.id, v.name
                );
                continue;
            }
        };
        let layout = Layout {
            offset: 0,
            size: storage.len().map_err(|e| CliError::io("UBI volume", e))?,
            cipher: "cipher_null-ecb".into(),
            sector_size: 512,
            iv_offset: 0,
        };
        let options = VolumeOptions {
            read_only: !storage.is_writable(),
            ..VolumeOptions::default()
        };
        let volume = Volume::with_layout(Arc::new(storage), layout, &[], &options)?;
        out.push(Export {
            name: v.name,
            volume: Arc::new(volume),
        });
    }
    Ok(out)
}

/// Bind one NBD server per export in `dir`.
fn serve(dir: &Path, exports: &[Export], tls: Option<&Tls>) -> Result<Vec<Server>, CliError> {
    let dir = std::path::absolute(dir)
        .map_err(|e| CliError::io(format!("cannot use {}", dir.display()), e))?;
    exports
        .iter()
        .map(|e| {
            let socket = dir.join(format!("{}.sock", e.name));
            let options = ServerOptions {
                export_name: e.name.clone(),
                description: format!("UBI volume {}", e.name),
                on_storage_error: Some(crate::serve::report_storage_error),
                tls: tls.cloned(),
                ..ServerOptions::default()
            };
            Server::bind(&Listen::Unix(socket), Arc::clone(&e.volume), options).map_err(|err| {
                match err {
                    NbdError::Busy(why) => CliError {
                        code: Code::Busy,
                        message: why,
                    },
                    other => CliError::usage(format!("volume {}: {other}", e.name)),
                }
            })
        })
        .collect()
}

pub(crate) fn run(args: AttachArgs) -> Result<(), CliError> {
    // Before anything is unlocked, so that a signal at any point ends in an orderly exit.
    let (_signals, signalled) =
        signals::channel(&[SIGINT, SIGTERM]).map_err(|e| CliError::io("cannot take signals", e))?;
    if let Some(dir) = &args.mountpoint {
        sectorcrypt_fuse::check_mountpoint(dir).map_err(fuse_error)?;
    }
    if args.socket_dir.as_ref().is_some_and(|d| !d.is_dir()) {
        return Err(CliError {
            code: Code::Device,
            message: format!(
                "{} is not a directory",
                args.socket_dir
                    .as_ref()
                    .map_or(String::new(), |d| d.display().to_string())
            ),
        });
    }
    // The exports are Unix sockets, never plain TCP to warn about.
    let tls = args.tls.load(None)?;
    if tls.is_some() && args.socket_dir.is_none() {
        return Err(CliError::usage(
            "--tls is for the NBD exports: give --socket-dir DIR",
        ));
    }
    let (_, opened) = args.open.unlock(args.readonly)?;
    let opened = Arc::new(opened);
    let ubi = Arc::new(opened.attach(&AttachOptions::default())?);
    let exports = exports(&ubi, args.readonly)?;
    if exports.is_empty() {
        return Err(CliError::usage("the flash has no volume to expose"));
    }
    let servers = match &args.socket_dir {
        Some(dir) => serve(dir, &exports, tls.as_ref())?,
        None => Vec::new(),
    };
    let stops: Vec<StopHandle> = servers
        .iter()
        .map(|s| s.stop_handle())
        .collect::<Result<_, _>>()
        .map_err(|e| CliError::io("cannot set up the NBD servers", e))?;
    for (e, s) in exports.iter().zip(&servers) {
        eprintln!(
            "sectorcrypt: volume {} ({} bytes) at {}",
            e.name,
            e.volume.size(),
            s.uri()
        );
    }
    let threads: Vec<JoinHandle<_>> = servers
        .into_iter()
        .map(|s| std::thread::spawn(move || s.run()))
        .collect();
    let (stop_hiding, hiding) = mpsc::channel::<()>();
    let hider = (!args.readonly && args.hide_interval > 0).then(|| {
        let (ubi, opened) = (Arc::clone(&ubi), Arc::clone(&opened));
        let every = Duration::from_secs(args.hide_interval);
        std::thread::spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = hiding.recv_timeout(every) {
                let hidden = ubi
                    .sync()
                    .map_err(|e| e.to_string())
                    .and_then(|()| opened.detach().map_err(|e| e.to_string()));
                if let Err(e) = hidden {
                    eprintln!("sectorcrypt: hiding free space: {e}");
                }
            }
        })
    });
    let result = match &args.mountpoint {
        Some(dir) => mount_until_done(dir, &exports, &signalled),
        None => {
            let _ = signalled.recv();
            Ok(())
        }
    };
    for stop in &stops {
        stop.stop();
    }
    for t in threads {
        if let Ok(Err(e)) = t.join() {
            eprintln!("sectorcrypt: {e}");
        }
    }
    drop(stop_hiding);
    if let Some(h) = hider {
        let _ = h.join();
    }
    result?;
    ubi.sync()?;
    if !args.readonly {
        opened.detach()?;
    }
    Ok(())
}

/// Mount every export as a file in `dir` and serve until unmounted or signalled. `early` took
/// the signals that came before the mount's own subscription (while the NBD sockets were
/// already there): one of them unmounts at once instead of being lost.
fn mount_until_done(dir: &Path, exports: &[Export], early: &Receiver<i32>) -> Result<(), CliError> {
    let files = exports
        .iter()
        .map(|e| MountFile {
            name: e.name.clone(),
            volume: Arc::clone(&e.volume),
        })
        .collect();
    let mut session =
        sectorcrypt_fuse::mount(files, dir, &MountOptions::default()).map_err(fuse_error)?;
    for e in exports {
        eprintln!(
            "sectorcrypt: volume {} at {}",
            e.name,
            session.mountpoint().join(&e.name).display()
        );
    }
    // The session's subscription is in place now: a signal from here on reaches `wait` too.
    let mut signalled_early = early.try_recv().ok().map(Stop::Signal);
    loop {
        match signalled_early.take().unwrap_or_else(|| session.wait()) {
            Stop::Unmounted => break,
            Stop::Signal(_) => match session.unmount() {
                Ok(Unmounted::Now | Unmounted::WhenClosed) => break,
                Err(e) => eprintln!("sectorcrypt: {e}; still serving (signal again to retry)"),
            },
        }
    }
    session.close().map_err(fuse_error)
}
