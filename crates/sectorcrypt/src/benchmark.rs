//! `sectorcrypt benchmark`: cipher speed on this machine (CLI.md), the paper's per-phase breakdown
//! (`--breakdown`) and the tcrypt-style cycle table (`--tcrypt`).

use std::io::Write;

use sectorcrypt_bench::{breakdown, speed, tcrypt};
use sectorcrypt_cipher::{BackendChoice, Direction};

use crate::exit::CliError;

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

fn human_size(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => n.to_string(),
    }
}
