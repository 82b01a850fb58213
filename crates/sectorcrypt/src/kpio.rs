//! `kpio`: Key Per I/O in software. `kpio serve` exports a raw store over NBD with a table of
//! keys, one export per key tag; `kpio benchmark` measures what choosing the key per request costs.
//!
//! The key table file is the host key manager's side of the protocol: keys of `--key-size` bits
//! back to back, the i-th under tag i, an all-zero entry meaning "no key under this tag". SIGHUP
//! makes the server read it again and bring its table in line: new entries are loaded, changed
//! ones replaced, and keys whose entry is gone or zeroed are destroyed (zeroized once the requests
//! using them end, before the reload is reported).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sectorcrypt_bench::kpio::{self as bench, KpioCase};
use sectorcrypt_cipher::CipherSpec;
use sectorcrypt_nbd::{Server, ServerOptions};
use sectorcrypt_secret::signals::{self, SIGHUP, SIGINT, SIGTERM};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{FileStorage, Storage};
use sectorcrypt_volume::kpio::{self, KeyTable, Mirror, Reload};
use sectorcrypt_volume::{Error as VolumeError, Layout, VolumeOptions};

use crate::benchmark::backend_choice;
use crate::exit::{chain, CliError, Code};
use crate::serve::{bind_error, listen_on, TlsArgs};

#[derive(clap::Subcommand, Debug)]
pub(crate) enum Command {
    /// Export DEVICE over NBD with a table of keys: export "N" reads and writes with the key
    /// under tag N. SIGHUP reloads the key table file; SIGINT/SIGTERM flush and stop.
    Serve(Box<ServeArgs>),
    /// Requests under a key drawn per request from N keys against the same under one key.
    Benchmark(BenchmarkArgs),
}

/// The cipher of every key in the table.
#[derive(clap::Args, Debug)]
struct KeyFormat {
    /// Cipher specification.
    #[arg(
        short = 'c',
        long,
        value_name = "SPEC",
        default_value = "aes-xts-plain64"
    )]
    cipher: String,
    /// Whole key size in bits (default 512 for XTS, 256 otherwise).
    #[arg(short = 's', long = "key-size", value_name = "BITS")]
    key_size: Option<usize>,
    /// Encryption sector size.
    #[arg(long = "sector-size", value_name = "BYTES", default_value_t = 512)]
    sector_size: usize,
}

impl KeyFormat {
    /// The key size in bytes, checked against the cipher.
    fn key_bytes(&self) -> Result<usize, CliError> {
        let spec = CipherSpec::parse(&self.cipher).map_err(|e| CliError::usage(chain(&e)))?;
        let bits = self.key_size.unwrap_or_else(|| spec.default_key_bits());
        if bits == 0 || !bits.is_multiple_of(8) {
            return Err(CliError::usage(format!(
                "--key-size {bits}: not a whole number of bytes"
            )));
        }
        Ok(bits / 8)
    }
}

#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("address").required(true).args(["socket", "listen"]))]
pub(crate) struct ServeArgs {
    /// The store: a file, block device or RBD image (rbd:POOL/IMAGE) holding only encrypted data
    /// (no header).
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The key table: keys back to back, the i-th under tag i, all zeros for none.
    #[arg(long = "key-table", value_name = "FILE")]
    key_table: PathBuf,
    #[command(flatten)]
    format: KeyFormat,
    /// Keys the table may hold (a reload with more entries is refused).
    #[arg(long = "max-keys", value_name = "N", default_value_t = 65536,
          value_parser = clap::value_parser!(u32).range(1..=1 << 24))]
    max_keys: u32,
    /// Where the data starts on DEVICE, in bytes (a multiple of the sector size).
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    offset: u64,
    /// Refuse writes (the device is opened read-only).
    #[arg(short = 'r', long)]
    readonly: bool,
    /// Pass discards (TRIM) down to the device.
    #[arg(long = "allow-discards")]
    allow_discards: bool,
    /// Block-cipher implementation: auto, portable, aesni, vaes256, vaes512, avx2, avx512.
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// Listen on this Unix socket (created with mode 0600).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Listen on TCP at HOST:PORT instead (without --tls, anyone who can reach it reads the
    /// decrypted data).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

#[derive(clap::Args, Debug)]
pub(crate) struct BenchmarkArgs {
    #[command(flatten)]
    format: KeyFormat,
    /// Key counts to compare (repeatable or comma-separated); the first is the baseline.
    #[arg(long = "keys", value_name = "N", value_delimiter = ',',
          default_values_t = [1usize, 16, 256, 4096, 65536])]
    keys: Vec<usize>,
    /// Bytes per request.
    #[arg(long = "request-size", value_name = "BYTES", default_value_t = 4096)]
    request_size: usize,
    /// Seconds per key count and direction.
    #[arg(long, default_value_t = 2.0, value_name = "S")]
    seconds: f64,
    /// Block-cipher implementation: auto, portable, aesni, vaes256, vaes512, avx2, avx512.
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// One JSON object per measurement, one per line.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Serve(args) => serve(*args),
        Command::Benchmark(args) => benchmark(args),
    }
}

/// The key table file, checked: a whole number of entries, at most `max` of them.
fn read_key_table(path: &Path, key_bytes: usize, max: usize) -> Result<SecretBytes, CliError> {
    let name = path.display();
    let file = std::fs::File::open(path).map_err(|e| CliError {
        code: Code::Device,
        message: format!("cannot read the key table {name}: {e}"),
    })?;
    kpio::read_key_table(file, key_bytes, max).map_err(|e| match e {
        VolumeError::Io(e) => CliError::io(format!("cannot read the key table {name}"), e),
        VolumeError::Refused(why) => CliError::usage(format!("the key table {name} {why}")),
        other => CliError::usage(format!("the key table {name}: {}", chain(&other))),
    })
}

/// What a reload did, as one line (`failed`: the first entry that could not be changed).
fn reload_summary(r: &Reload, in_use: usize) -> (String, Option<String>) {
    let done = format!(
        "{} loaded, {} replaced, {} destroyed, {in_use} in use",
        r.loaded, r.replaced, r.destroyed
    );
    let failed = r
        .failed
        .as_ref()
        .map(|(tag, e)| format!("tag {tag}: {}", chain(e)));
    (done, failed)
}

fn serve(args: ServeArgs) -> Result<(), CliError> {
    let (_signals, signalled) = signals::channel(&[SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| CliError::io("cannot take signals", e))?;
    let tls = args.tls.load(args.listen.as_deref())?;
    let key_bytes = args.format.key_bytes()?;
    let max = args.max_keys as usize;
    let keys = read_key_table(&args.key_table, key_bytes, max)?;
    let storage: Arc<dyn Storage> = match crate::device::rbd(&args.device, !args.readonly) {
        Some(image) => Arc::from(image?),
        None => {
            let opened = if args.readonly {
                FileStorage::open_shared(&args.device)
            } else {
                FileStorage::open(&args.device)
            };
            Arc::new(opened.map_err(|e| crate::exit::open_failed(&args.device, e))?)
        }
    };
    let len = storage
        .len()
        .map_err(|e| CliError::io("cannot size the store", e))?;
    let ss = args.format.sector_size as u64;
    if ss == 0 || !args.offset.is_multiple_of(ss) || args.offset >= len || (len - args.offset) < ss
    {
        return Err(CliError {
            code: Code::Device,
            message: format!(
                "{} ({len} bytes) has no whole {ss}-byte sector after --offset {}",
                args.device.display(),
                args.offset
            ),
        });
    }
    let layout = Layout {
        offset: args.offset,
        size: (len - args.offset) / ss * ss,
        cipher: args.format.cipher.clone(),
        sector_size: args.format.sector_size,
        iv_offset: 0,
    };
    let options = VolumeOptions {
        read_only: args.readonly,
        allow_discards: args.allow_discards,
        backend: backend_choice(args.backend.as_deref())?,
        ..VolumeOptions::default()
    };
    let table = Arc::new(KeyTable::new(storage, layout, &options, max)?);
    let mut mirror = Mirror::new(key_bytes);
    let initial = table.reload(&mut mirror, &keys);
    drop(keys);
    crate::secrets::keys_ready();
    if let (_, Some(why)) = reload_summary(&initial, table.len()) {
        return Err(CliError::usage(format!(
            "cannot load the key table {}: {why}",
            args.key_table.display()
        )));
    }
    let listen = listen_on(args.socket.as_deref(), args.listen.as_deref())?;
    let server = Server::bind(
        &listen,
        Arc::clone(&table),
        ServerOptions {
            on_storage_error: Some(crate::serve::report_storage_error),
            workers: if crate::device::is_rbd(&args.device) {
                crate::device::RBD_WORKERS
            } else {
                ServerOptions::default().workers
            },
            writers: if crate::device::is_rbd(&args.device) {
                crate::device::RBD_WORKERS
            } else {
                ServerOptions::default().writers
            },
            tls,
            ..ServerOptions::default()
        },
    )
    .map_err(bind_error)?;
    let stop = server
        .stop_handle()
        .map_err(|e| CliError::io("cannot set up the server", e))?;
    let path = args.key_table.clone();
    let reloader = Arc::clone(&table);
    std::thread::spawn(move || {
        for signal in signalled {
            if signal != SIGHUP {
                stop.stop();
                continue;
            }
            let message = match read_key_table(&path, key_bytes, max) {
                Err(e) => format!("key table not reloaded: {}", e.message),
                Ok(new) => {
                    let r = reloader.reload(&mut mirror, &new);
                    drop(new);
                    crate::secrets::keys_ready();
                    match reload_summary(&r, reloader.len()) {
                        (done, None) => format!("key table reloaded: {done}"),
                        (done, Some(why)) => format!(
                            "key table reloaded in part ({done}); not changed: {why} \
                             (tried again at the next SIGHUP)"
                        ),
                    }
                }
            };
            let _ = writeln!(std::io::stderr(), "sectorcrypt: {message}");
        }
    });
    // The URI names the lowest tag: every export is the same but for the name.
    let first = table.tags().first().map(u32::to_string).unwrap_or_default();
    eprintln!(
        "sectorcrypt: {} keys loaded ({}, {}-byte sectors); each key tag is an export name",
        initial.loaded, args.format.cipher, args.format.sector_size
    );
    eprintln!(
        "sectorcrypt: serving {} ({} bytes) at {}",
        args.device.display(),
        table.size(),
        server.uri_of(&first)
    );
    server.run().map_err(CliError::usage)
}

fn benchmark(args: BenchmarkArgs) -> Result<(), CliError> {
    let key_bytes = args.format.key_bytes()?;
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err(CliError::usage(format!(
            "--seconds {}: must be positive",
            args.seconds
        )));
    }
    let case = KpioCase {
        cipher: args.format.cipher.clone(),
        key_bits: key_bytes * 8,
        sector_size: args.format.sector_size,
        request_size: args.request_size,
        keys: args.keys.clone(),
        seconds: args.seconds,
        backend: backend_choice(args.backend.as_deref())?,
    };
    if !args.json {
        eprintln!(
            "# {} {}-bit keys, {}-byte requests at random offsets, tags drawn per request",
            case.cipher, case.key_bits, case.request_size
        );
    }
    let samples = bench::measure(&case)?;
    let mut out = std::io::stdout().lock();
    if !args.json {
        let _ = writeln!(
            out,
            "{:>7} {:>6} {:>12} {:>10} {:>9} {:>10} {:>7}",
            "keys", "op", "requests/s", "MiB/s", "vs first", "bytes/key", "steal"
        );
    }
    for s in &samples {
        let line = if args.json {
            serde_json::to_string(s).map_err(|e| CliError::usage(e.to_string()))?
        } else {
            format!(
                "{:>7} {:>6} {:>12.0} {:>10.1} {:>8.3}x {:>10} {:>7}",
                s.keys,
                s.op,
                s.requests_per_sec,
                s.bytes_per_sec / f64::from(1 << 20),
                s.vs_baseline,
                s.table_bytes_per_key
                    .map_or_else(|| "-".to_string(), |b| format!("{b:.0}")),
                s.steal_max
                    .map_or_else(|| "-".to_string(), |v| format!("{:.1}%", 100.0 * v))
            )
        };
        writeln!(out, "{line}").map_err(|e| CliError::io("cannot write the results", e))?;
    }
    Ok(())
}
