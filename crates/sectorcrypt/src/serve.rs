//! `serve`: unlock a volume and export it over NBD until SIGINT/SIGTERM.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sectorcrypt_nbd::{Error as NbdError, Listen, Server, ServerOptions, Tls, TlsMode};
use sectorcrypt_secret::signals::{self, SIGINT, SIGTERM};

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
    /// Listen on TCP at HOST:PORT instead (without --tls, anyone who can reach it reads the
    /// decrypted data).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// The export name clients ask for (the empty name reaches it too).
    #[arg(long = "export-name", value_name = "NAME", default_value = "")]
    export_name: String,
    #[command(flatten)]
    tls: TlsArgs,
}

/// `--tls`: nbdkit's modes, explained in the option's help (doc comments here would make clap
/// lay out every option's help in the long form).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TlsChoice {
    Off,
    On,
    Require,
}

/// The TLS options of every command that serves NBD (nbdkit's names and meanings).
#[derive(clap::Args, Debug)]
pub(crate) struct TlsArgs {
    /// TLS (NBD_OPT_STARTTLS): off, on (offered, each client chooses) or require (a client that
    /// does not start TLS is refused everything).
    #[arg(long, value_enum, value_name = "MODE", default_value = "off")]
    tls: TlsChoice,
    /// For --tls on|require: the directory of server-cert.pem and server-key.pem, and of
    /// ca-cert.pem if clients must present a certificate it signed.
    #[arg(long = "tls-certificates", value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
    /// For --tls on|require, instead of certificates: nbdkit's pre-shared key file
    /// (username:hexkey lines, as psktool writes them); clients prove they hold their user's key.
    #[arg(long = "tls-psk", value_name = "FILE")]
    tls_psk: Option<PathBuf>,
}

impl TlsArgs {
    /// The server's TLS, loaded before anything is unlocked (a bad certificate costs no
    /// passphrase). Plain TCP (`tcp`: the address listened on) is served with a warning.
    pub(crate) fn load(&self, tcp: Option<&str>) -> Result<Option<Tls>, CliError> {
        let mode = match self.tls {
            TlsChoice::Off => None,
            TlsChoice::On => Some(TlsMode::On),
            TlsChoice::Require => Some(TlsMode::Require),
        };
        match (mode, &self.tls_certificates, &self.tls_psk) {
            // As in nbdkit, pre-shared keys are an alternative to certificates.
            (_, Some(_), Some(_)) => Err(CliError::usage(
                "--tls-certificates and --tls-psk exclude each other: give one",
            )),
            (None, Some(_), None) => Err(CliError::usage(
                "--tls-certificates needs --tls on or --tls require",
            )),
            (None, None, Some(_)) => {
                Err(CliError::usage("--tls-psk needs --tls on or --tls require"))
            }
            (Some(_), None, None) => Err(CliError::usage(
                "--tls on and --tls require need --tls-certificates DIR or --tls-psk FILE",
            )),
            (Some(mode), Some(dir), None) => {
                Ok(Some(Tls::load(mode, dir).map_err(CliError::usage)?))
            }
            (Some(mode), None, Some(file)) => {
                Ok(Some(Tls::load_psk(mode, file).map_err(CliError::usage)?))
            }
            (None, None, None) => {
                if let Some(address) = tcp {
                    eprintln!(
                        "sectorcrypt: warning: serving TCP without TLS: whoever reaches \
                         {address} reads and writes the decrypted data (see --tls)"
                    );
                }
                Ok(None)
            }
        }
    }
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
    let (_signals, signalled) =
        signals::channel(&[SIGINT, SIGTERM]).map_err(|e| CliError::io("cannot take signals", e))?;
    let tls = args.tls.load(args.listen.as_deref())?;
    // The devices are kept for their locks and for conversions run online.
    let mut opened = args.volume.open()?;
    let volume = Arc::clone(&opened.volume);
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
            // once. An RBD image answers each request after a network round trip, so there
            // they are as many as a client usually queues: the requests in flight make the
            // bandwidth.
            workers: if crate::device::is_rbd(&args.volume.device) {
                crate::device::RBD_WORKERS
            } else {
                ServerOptions::default().workers.max(2 * threads)
            },
            // On a file, two writes per cipher thread: one encrypting while the other is
            // received. An RBD write waits for its replicas: there, as many as the workers.
            writers: if crate::device::is_rbd(&args.volume.device) {
                crate::device::RBD_WORKERS
            } else {
                (2 * threads).max(ServerOptions::default().writers)
            },
            on_storage_error: Some(report_storage_error),
            tls,
            ..Default::default()
        },
    )
    .map_err(bind_error)?;
    let stop = server
        .stop_handle()
        .map_err(|e| CliError::io("cannot set up the server", e))?;
    std::thread::spawn(move || {
        for _ in signalled {
            stop.stop();
        }
    });
    // The control socket before the announcement: a conversion command started the moment a
    // script reads "serving" must find this process, not fall back to an offline run that the
    // lock refuses.
    let host = opened.host(&args.volume)?;
    eprintln!(
        "sectorcrypt: serving {} ({size} bytes) at {}",
        args.volume.device.display(),
        server.uri()
    );
    let host = host.begin()?;
    let served = server.run().map_err(CliError::usage);
    host.shutdown();
    served
}
