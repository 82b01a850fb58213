//! `sectorcrypt benchmark`: cipher speed on this machine (CLI.md), the paper's per-phase breakdown
//! (`--breakdown`), the tcrypt-style cycle table (`--tcrypt`), and timed I/O on a volume against
//! its ciphertext (`--device`, as `rbd bench` times an image).

use std::io::Write;
use std::path::PathBuf;

use sectorcrypt_bench::io::{IoCase, IoType, Pattern};
use sectorcrypt_bench::{breakdown, speed, tcrypt};
use sectorcrypt_cipher::{BackendChoice, Direction};

use crate::exit::{CliError, Code};
use crate::keyfile::KeyArgs;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Cipher specification (repeatable), e.g. aes-xts-plain64, lea-xts-plain64, cipher_null-ecb.
    #[arg(short = 'c', long = "cipher", value_name = "SPEC")]
    ciphers: Vec<String>,
    /// Whole key size in bits (repeatable; for XTS both halves). Default: the cipher's default.
    #[arg(short = 's', long = "key-size", value_name = "BITS")]
    key_sizes: Vec<usize>,
    /// Encryption sector size (repeatable).
    #[arg(long = "sector-size", value_name = "BYTES")]
    sector_sizes: Vec<usize>,
    /// Bytes per request (repeatable), a multiple of the sector size.
    #[arg(long = "request-size", value_name = "BYTES")]
    request_sizes: Vec<usize>,
    /// Threads: workers splitting large requests, or submitters of small ones.
    #[arg(long, default_value_t = 1, value_name = "N")]
    threads: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 0.3, value_name = "S")]
    seconds: f64,
    /// One JSON object per measurement, one per line.
    #[arg(long)]
    json: bool,
    /// The dm-crypt paper's per-phase XTS time breakdown (one-sector vs 4 KiB requests).
    #[arg(long, conflicts_with = "tcrypt")]
    breakdown: bool,
    /// Cycles per 4096-byte operation for ECB/CBC/CTR/XTS by cipher and key size.
    #[arg(long)]
    tcrypt: bool,
    /// Block-cipher implementation: auto, portable, aesni, vaes256, vaes512, avx2, avx512
    /// (default: $SECTORCRYPT_BACKEND, else auto).
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// Time I/O on this volume instead (a LUKS device or image, or rbd:POOL/IMAGE): the same
    /// requests through the encryption and on the ciphertext. Needs its passphrase.
    #[arg(long, value_name = "DEVICE", conflicts_with_all = ["breakdown", "tcrypt"])]
    device: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    /// With --device: the volume's detached header.
    #[arg(long, value_name = "FILE", requires = "device")]
    header: Option<PathBuf>,
    /// With --device: only try this keyslot.
    #[arg(short = 'S', long = "key-slot", value_name = "N", requires = "device")]
    key_slot: Option<usize>,
    /// With --device: read, or write (zeros: overwrites the data it reaches).
    #[arg(long = "io-type", value_name = "TYPE", default_value = "read",
          value_parser = ["read", "write"], requires = "device")]
    io_type: String,
    /// With --device: sequential from the start, or random offsets.
    #[arg(long = "io-pattern", value_name = "PATTERN", default_value = "seq",
          value_parser = ["seq", "rand"], requires = "device")]
    io_pattern: String,
    /// With --device: bytes per request (K, M, G suffixes), a multiple of the sector size.
    #[arg(
        long = "io-size",
        value_name = "SIZE",
        default_value = "4K",
        requires = "device"
    )]
    io_size: String,
    /// With --device: requests in flight.
    #[arg(
        long = "io-threads",
        value_name = "N",
        default_value_t = 16,
        requires = "device"
    )]
    io_threads: usize,
    /// With --device, a volume with integrity: write without its journal (as
    /// `serve --integrity-no-journal`).
    #[arg(long = "integrity-no-journal", requires = "device")]
    integrity_no_journal: bool,
    /// With --device: bytes to move, each way (K, M, G suffixes).
    #[arg(
        long = "io-total",
        value_name = "SIZE",
        default_value = "1G",
        requires = "device"
    )]
    io_total: String,
    /// Do not ask before a write benchmark overwrites data.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

/// `--backend NAME`, else `$SECTORCRYPT_BACKEND`, else auto.
pub(crate) fn backend_choice(arg: Option<&str>) -> Result<BackendChoice, CliError> {
    BackendChoice::from_arg_or_env(arg).map_err(CliError::usage)
}

pub(crate) fn run(args: Args) -> Result<(), CliError> {
    if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        return Err(CliError::usage("--seconds must be between 0 and 3600"));
    }
    if args.threads == 0 || args.threads > 1024 {
        return Err(CliError::usage("--threads must be between 1 and 1024"));
    }
    let backend = backend_choice(args.backend.as_deref())?;
    let mut out = std::io::stdout().lock();
    let mut emit = |line: String| -> Result<(), CliError> {
        writeln!(out, "{line}").map_err(|e| CliError::io("cannot write the results", e))
    };
    if let Some(device) = &args.device {
        return run_io(&args, device, &mut emit);
    }
    if args.key.key_file.is_some() {
        return Err(CliError::usage("--key-file is for --device"));
    }
    if args.breakdown {
        return run_breakdown(&args, backend, &mut emit);
    }
    if args.tcrypt {
        for alg in tcrypt::algorithms(&args.ciphers).map_err(CliError::usage)? {
            let rows = tcrypt::measure(alg, backend).map_err(CliError::usage)?;
            if args.json {
                for r in rows {
                    emit(serde_json::to_string(&r).expect("serializable"))?;
                }
            } else {
                emit(tcrypt::render(&rows))?;
            }
        }
        return Ok(());
    }
    run_speed(&args, backend, &mut emit)
}

fn run_speed(
    args: &Args,
    backend: BackendChoice,
    emit: &mut impl FnMut(String) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let cases = speed::cases(&args.ciphers, &args.key_sizes).map_err(CliError::usage)?;
    let sector_sizes = if args.sector_sizes.is_empty() {
        vec![512]
    } else {
        args.sector_sizes.clone()
    };
    let request_sizes = if args.request_sizes.is_empty() {
        vec![65536]
    } else {
        args.request_sizes.clone()
    };
    if !args.json {
        emit("# Tests are approximate using memory only (no storage IO).".into())?;
        emit(format!(
            "#{:>23} | {:>5} | {:>6} | {:>8} | {:>7} | {:>15} | {:>15} | {}",
            "Algorithm",
            "Key",
            "Sector",
            "Request",
            "Threads",
            "Encryption",
            "Decryption",
            "Backend"
        ))?;
    }
    for (spec, bits) in cases {
        for &ss in &sector_sizes {
            for &rs in &request_sizes {
                let case = speed::SpeedCase {
                    spec,
                    key_bits: bits,
                    sector_size: ss,
                    request_size: rs,
                    threads: args.threads,
                    backend,
                };
                let enc = speed::measure(&case, Direction::Encrypt, args.seconds)
                    .map_err(CliError::usage)?;
                let dec = speed::measure(&case, Direction::Decrypt, args.seconds)
                    .map_err(CliError::usage)?;
                if args.json {
                    emit(serde_json::to_string(&enc).expect("serializable"))?;
                    emit(serde_json::to_string(&dec).expect("serializable"))?;
                } else {
                    emit(format!(
                        "{:>24}   {:>4}b   {:>6}   {:>8}   {:>7}   {:>10.1} MiB/s   {:>10.1} MiB/s   {}",
                        spec.to_string(),
                        bits,
                        ss,
                        human_size(rs),
                        args.threads,
                        enc.bytes_per_sec / 1048576.0,
                        dec.bytes_per_sec / 1048576.0,
                        enc.backend
                    ))?;
                }
            }
        }
    }
    Ok(())
}

fn run_breakdown(
    args: &Args,
    backend: BackendChoice,
    emit: &mut impl FnMut(String) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let algs = tcrypt::algorithms(&args.ciphers).map_err(CliError::usage)?;
    let key_bits = args.key_sizes.first().copied().unwrap_or(512);
    if !matches!(key_bits, 256 | 384 | 512) {
        return Err(CliError::usage(format!(
            "--breakdown runs XTS: the key size must be 256, 384 or 512 bits, not {key_bits}"
        )));
    }
    let requests = if args.request_sizes.is_empty() {
        vec![512, 4096]
    } else {
        args.request_sizes.clone()
    };
    for alg in algs {
        for dir in [Direction::Encrypt, Direction::Decrypt] {
            // The paper's 50 MB file.
            let rows = breakdown::measure(alg, key_bits, 50_000_000, &requests, dir, backend)
                .map_err(CliError::usage)?;
            if args.json {
                for r in rows {
                    emit(serde_json::to_string(&r).expect("serializable"))?;
                }
            } else {
                emit(breakdown::render(&rows))?;
            }
        }
    }
    Ok(())
}

/// `--device`: unlock the volume, run the requests on its storage and through it, print both.
fn run_io(
    args: &Args,
    device: &std::path::Path,
    emit: &mut impl FnMut(String) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let size = |what: &str, text: &str| {
        sectorcrypt_storage::units::parse_size(text)
            .map_err(|e| CliError::usage(format!("{what}: {e}")))
    };
    let io_type = if args.io_type == "write" {
        IoType::Write
    } else {
        IoType::Read
    };
    let case = IoCase {
        io_type,
        pattern: if args.io_pattern == "rand" {
            Pattern::Rand
        } else {
            Pattern::Seq
        },
        io_size: usize::try_from(size("--io-size", &args.io_size)?).unwrap_or(usize::MAX),
        threads: args.io_threads,
        total: size("--io-total", &args.io_total)?,
    };
    // The devices are kept (unused) for their locks. A conversion recorded on the device is
    // not gone on with: the benchmark measures the volume, not a conversion.
    let opened = crate::open::VolumeArgs {
        device: device.to_path_buf(),
        header: args.header.clone(),
        key: args.key.clone(),
        tokens: crate::unlock::TokenArgs::default(),
        key_slot: args.key_slot,
        readonly: io_type == IoType::Read,
        allow_discards: false,
        integrity_no_journal: args.integrity_no_journal,
        threads: None,
        backend: args.backend.clone(),
        size: None,
        device_size: None,
        no_resume: true,
        conversion_max_rate: None,
    }
    .open()?;
    let volume = &opened.volume;
    sectorcrypt_bench::io::check(&case, volume).map_err(CliError::usage)?;
    if io_type == IoType::Write {
        crate::keyslots::confirm(
            args.batch,
            &format!(
                "WARNING!\n========\nThis overwrites data on {} with zeros.",
                device.display()
            ),
        )?;
    }
    let bar = crate::progress::terminal_bar(
        "{msg:>6} [{bar:30}] {percent:>3}%  {bytes} / {total_bytes}  {bytes_per_sec}",
    );
    if let Some(bar) = &bar {
        bar.set_length(case.total / case.io_size as u64 * case.io_size as u64);
    }
    let results = sectorcrypt_bench::io::measure(&case, volume, &|path, done| {
        if let Some(bar) = &bar {
            if bar.message() != path {
                bar.set_message(path);
                bar.reset();
            }
            bar.set_position(done);
        }
    })
    .map_err(|e| CliError {
        code: Code::Device,
        message: format!("{}: {e}", device.display()),
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let layout = volume.layout();
    if args.json {
        for r in &results {
            let mut v = serde_json::to_value(r).expect("serializable");
            v["device"] = device.display().to_string().into();
            v["cipher"] = layout.cipher.clone().into();
            v["sector_size"] = layout.sector_size.into();
            emit(v.to_string())?;
        }
        return Ok(());
    }
    emit(format!(
        "# {} ({}, {}-byte sectors): {} {}, {} requests, {} in flight, {} each way",
        device.display(),
        layout.cipher,
        layout.sector_size,
        args.io_pattern,
        args.io_type,
        human_size(case.io_size),
        case.threads,
        human_size(usize::try_from(results[0].bytes).unwrap_or(usize::MAX)),
    ))?;
    emit(format!(
        "#{:>24} | {:>10} | {:>12} | {:>12} | {:>9}",
        "path", "ops", "ops/s", "MiB/s", "seconds"
    ))?;
    for r in &results {
        let label = if r.path == "raw" {
            "raw (ciphertext)"
        } else {
            "through the encryption"
        };
        emit(format!(
            "{:>25}   {:>10}   {:>12.1}   {:>12.1}   {:>9.2}",
            label,
            r.ops,
            r.ops_per_sec,
            r.bytes_per_sec / 1048576.0,
            r.seconds
        ))?;
    }
    emit(format!(
        "# through the encryption: {:.2}x the raw bandwidth",
        results[1].bytes_per_sec / results[0].bytes_per_sec
    ))
}

fn human_size(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => n.to_string(),
    }
}
