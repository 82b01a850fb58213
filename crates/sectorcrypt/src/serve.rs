//! `serve`: unlock a volume and export it over NBD until SIGINT/SIGTERM.

use std::path::{Path, PathBuf};

use sectorcrypt_nbd::{Error as NbdError, Listen, Server, ServerOptions};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::exit::{CliError, Code};
use crate::open::VolumeArgs;

#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("address").required(true).args(["socket", "listen"]))]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// Listen on this Unix socket (created with mode 0600).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Listen on TCP at HOST:PORT instead (anyone who can reach it reads the decrypted data).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// The export name clients ask for (the empty name reaches it too).
    #[arg(long = "export-name", value_name = "NAME", default_value = "")]
    export_name: String,
}

/// A request the storage failed, on standard error: at most one line a second, counting the
/// failures in between (an unreachable cluster fails every request).
pub(crate) fn report_storage_error(e: &sectorcrypt_volume::Error) {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    static LAST: Mutex<(Option<Instant>, u64)> = Mutex::new((None, 0));
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = Instant::now();
    match last.0 {
        Some(at) if now.duration_since(at) < Duration::from_secs(1) => last.1 += 1,
        _ => {
            let more = match last.1 {
                0 => String::new(),
                n => format!(" ({n} more failed requests since the last report)"),
            };
            eprintln!("sectorcrypt: a request failed: {e}{more}");
            *last = (Some(now), 0);
        }
    }
}

/// Where to listen: `--socket PATH` (made absolute, so that the URI a server prints works from
/// any directory) or `--listen HOST:PORT`; clap requires one of them.
pub(crate) fn listen_on(socket: Option<&Path>, listen: Option<&str>) -> Result<Listen, CliError> {
    match (socket, listen) {
        (Some(path), _) => Ok(Listen::Unix(std::path::absolute(path).map_err(|e| {
            CliError::io(format!("cannot use the socket path {}", path.display()), e)
        })?)),
        (None, Some(addr)) => Ok(Listen::Tcp(addr.to_string())),
        (None, None) => Err(CliError::usage("give --socket PATH or --listen HOST:PORT")),
    }
}

/// A server that could not bind: exit 5 when the address is taken.
pub(crate) fn bind_error(e: NbdError) -> CliError {
    match e {
        NbdError::Busy(why) => CliError {
            code: Code::Busy,
            message: why,
        },
        other => CliError::usage(other),
    }
}

pub(crate) fn run(args: ServeArgs) -> Result<(), CliError> {
    // Signals are caught before the volume is opened, so a signal at any point ends in an
    // orderly exit rather than the default termination.
    let mut signals = Signals::new([SIGINT, SIGTERM])
        .map_err(|e| CliError::io("cannot install signal handlers", e))?;
    // The header device is kept (unused) for its lock.
    let (volume, _header) = args.volume.open()?;
    let listen = listen_on(args.socket.as_deref(), args.listen.as_deref())?;
    let threads = args.volume.threads();
    let description = format!(
        "{} ({}, {}-byte sectors)",
        args.volume.device.display(),
        volume.layout().cipher,
        volume.sector_size()
    );
    let size = volume.size();
    let server = Server::bind(
        &listen,
        volume,
        ServerOptions {
            export_name: args.export_name.clone(),
            description,
            // Enough workers per connection to keep the disk and the cipher threads busy at
            // once, without one client tying up the whole machine. An RBD image answers each
            // request after a network round trip, so there they are as many as a client
            // usually queues: the requests in flight make the bandwidth.
            workers: if crate::device::is_rbd(&args.volume.device) {
                crate::device::RBD_WORKERS
            } else {
                (2 * threads).max(4)
            },
            on_storage_error: Some(report_storage_error),
            ..Default::default()
        },
    )
    .map_err(bind_error)?;
    let stop = server
        .stop_handle()
        .map_err(|e| CliError::io("cannot set up the server", e))?;
    std::thread::spawn(move || {
        for _ in signals.forever() {
            stop.stop();
        }
    });
    eprintln!(
        "sectorcrypt: serving {} ({size} bytes) at {}",
        args.volume.device.display(),
        server.uri()
    );
    server.run().map_err(CliError::usage)
}
