//! `encrypt` and `decrypt`: convert a device in place, resumably, keeping the progress in LUKS2's
//! own reencryption metadata (so `cryptsetup reencrypt --resume-only` can take over, and so can we
//! from a state cryptsetup left).
//!
//! Today: a detached header (`--header FILE`, the data stays where it is). Conversions that move
//! the data (a header on the device itself: `encrypt --reduce-device-size`, `decrypt` without
//! `--header`) are refused with a clear message, not attempted.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sectorcrypt_luks::luks2::reencrypt::{self, InitOptions, Mode, State};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_luks::{FormatOptions, Header};
use sectorcrypt_storage::{FileStorage, MemStorage, Storage};
use sectorcrypt_volume::reencrypt::{run, Options, Outcome, Progress, DEFAULT_HOTZONE};
use sectorcrypt_volume::Error as VolumeError;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::exit::{CliError, Code};
use crate::header::luks_error;
use crate::keyfile::KeyArgs;
use crate::keyslots::{confirm, new_passphrase, open_rw, pbkdf_options};
use crate::pbkdf_args::PbkdfArgs;

#[derive(clap::Args, Debug)]
pub struct EncryptArgs {
    /// The plaintext device or image file to encrypt in place.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Put the LUKS2 header in this file (detached header); the data stays where it is.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// Make room for the header at the start of DEVICE by shifting the data (not supported yet).
    #[arg(long = "reduce-device-size", value_name = "BYTES")]
    reduce_device_size: Option<String>,
    /// Cipher specification (default aes-xts-plain64).
    #[arg(short = 'c', long, value_name = "SPEC")]
    cipher: Option<String>,
    /// Whole key size in bits (default 512 for XTS).
    #[arg(short = 's', long = "key-size", value_name = "BITS")]
    key_size: Option<usize>,
    /// Encryption sector size (default 4096 when the device size allows, else 512).
    #[arg(long = "sector-size", value_name = "BYTES")]
    sector_size: Option<usize>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    run: RunArgs,
}

/// What `encrypt`, `decrypt` and `reencrypt` share: the passphrase and how the conversion runs.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Only continue a conversion already in progress (started here or by cryptsetup).
    #[arg(long = "resume-only")]
    resume_only: bool,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
    /// Bytes converted per step (default 64 MiB).
    #[arg(long = "hotzone-size", value_name = "BYTES")]
    hotzone_size: Option<u64>,
    /// Cipher threads (default: the number of CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: Option<u32>,
    /// Progress as JSON lines on standard output (one per step) instead of a bar.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
pub struct DecryptArgs {
    /// The encrypted device or image file to decrypt in place.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The detached LUKS2 header of DEVICE.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

/// SIGINT and SIGTERM set the returned flag; the conversion stops at its next safe point.
/// Installed before anything is written.
fn stop_on_signals() -> Result<Arc<AtomicBool>, CliError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .map_err(|e| CliError::usage(format!("cannot install signal handlers: {e}")))?;
    }
    Ok(stop)
}

/// Run the conversion recorded in the header at `header_path` to its end, with progress; an
/// interruption is an error that says how to resume.
fn convert(
    verb: &str,
    device: &Path,
    header_path: &Path,
    data: &FileStorage,
    pass: &[u8],
    args: &RunArgs,
    stop: &AtomicBool,
) -> Result<(), CliError> {
    let header = open_rw(header_path)?;
    let options = Options {
        hotzone: args.hotzone_size.unwrap_or(DEFAULT_HOTZONE),
        threads: args.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| n as usize,
        ),
    };
    let mut report = Reporter::new(args.json);
    let outcome = run(&header, data, pass, &options, &mut |p| {
        report.step(p);
        !stop.load(Ordering::Relaxed)
    })
    .map_err(volume_error)?;
    report.done();
    match outcome {
        Outcome::Finished => Ok(()),
        Outcome::Paused(p) => Err(CliError::usage(format!(
            "interrupted after {} of {} bytes, at a safe point; resume with: sectorcrypt {verb} \
             {} --header {} --resume-only",
            p.done,
            p.total,
            device.display(),
            header_path.display()
        ))),
    }
}

/// The conversion hashes the data in 4 KiB blocks (cryptsetup's checksum resilience): refuse a
/// device whose size does not split into them before anything is written.
fn check_size(device: &Path, len: u64) -> Result<(), CliError> {
    const BLOCK: u64 = 4096;
    if len == 0 || !len.is_multiple_of(BLOCK) {
        return Err(CliError {
            code: Code::Device,
            message: format!(
                "{} is {len} bytes; converting in place needs a size that is a non-zero multiple \
                 of {BLOCK} bytes",
                device.display()
            ),
        });
    }
    Ok(())
}

/// The header at `path` must record a conversion in progress of `mode`.
fn check_in_progress(path: &Path, mode: Mode) -> Result<(), CliError> {
    let h = read_luks2(&open_rw(path)?)?;
    let r = reencrypt::parse(h.metadata()).map_err(luks_error)?;
    match r {
        Some(r) if r.keyslot.mode == mode => Ok(()),
        Some(r) => Err(CliError::usage(format!(
            "{} records {} in progress, not {}",
            path.display(),
            r.keyslot.mode.as_str(),
            mode.as_str()
        ))),
        None => Err(CliError::usage(format!(
            "{} has no {} in progress to resume",
            path.display(),
            mode.as_str()
        ))),
    }
}

pub fn encrypt(args: EncryptArgs) -> Result<(), CliError> {
    if args.reduce_device_size.is_some() {
        return Err(CliError::usage(
            "--reduce-device-size (a header on the device itself, by shifting the data) is not \
             supported yet; use --header FILE to keep the header in a separate file",
        ));
    }
    let Some(header_path) = args.header.clone() else {
        return Err(CliError::usage(
            "encrypting in place needs --header FILE (the header goes there; the data stays)",
        ));
    };
    let data = open_rw(&args.device)?;
    let data_len = data
        .len()
        .map_err(|e| CliError::usage(format!("cannot read the size of {}: {e}", data.name())))?;
    check_size(&args.device, data_len)?;
    let stop = stop_on_signals()?;
    let pass = if args.run.resume_only {
        check_in_progress(&header_path, Mode::Encrypt)?;
        args.run
            .key
            .read(&format!("Enter passphrase for {}: ", args.device.display()))?
    } else {
        start(&args, &header_path, &data, data_len)?
    };
    convert(
        "encrypt",
        &args.device,
        &header_path,
        &data,
        &pass,
        &args.run,
        &stop,
    )
}

#[derive(clap::Args, Debug)]
pub struct ReencryptArgs {
    /// The LUKS2 device or image file whose volume key to replace.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Its detached header, if it has one.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// New encryption sector size (default: the current one).
    #[arg(long = "sector-size", value_name = "BYTES")]
    sector_size: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    run: RunArgs,
}

/// `reencrypt`: a new volume key for the data (key rotation), in place, resumably. The data
/// does not move, so a header on the device itself works too.
pub fn reencrypt(args: ReencryptArgs) -> Result<(), CliError> {
    let header_path = args.header.clone().unwrap_or_else(|| args.device.clone());
    let data = open_rw(&args.device)?;
    let header = open_rw(&header_path)?;
    let stop = stop_on_signals()?;
    let mut h = read_luks2(&header)?;
    let in_progress = reencrypt::state(h.metadata()) != State::None;
    if args.run.resume_only || in_progress {
        check_in_progress(&header_path, Mode::Reencrypt)?;
    }
    let pass = args
        .run
        .key
        .read(&format!("Enter passphrase for {}: ", args.device.display()))?;
    if !in_progress {
        let seg = h.data_segment().map_err(luks_error)?;
        let data_len = data.len().map_err(|e| {
            CliError::usage(format!("cannot read the size of {}: {e}", data.name()))
        })?;
        check_size(&args.device, data_len.saturating_sub(seg.offset))?;
        let old = h.unlock(&header, &pass, None).map_err(luks_error)?;
        let pbkdf = pbkdf_options(&args.pbkdf)?.luks2().map_err(luks_error)?;
        let target = reencrypt::Target {
            cipher: seg.cipher.clone(),
            sector_size: args.sector_size.unwrap_or(seg.sector_size),
        };
        let others = h.metadata().keyslots.iter().count().saturating_sub(1);
        confirm(
            args.run.batch,
            &format!(
                "WARNING!\n========\nThis will re-encrypt {} with a new volume key; the \
                 passphrase given keeps working, the {others} other keyslot(s) are removed at \
                 the end.",
                args.device.display()
            ),
        )?;
        // First a keyslot holding the new key (bound to nothing yet), then one header write
        // that starts the reencryption: a crash between the two leaves the volume as it was.
        let new_vk = sectorcrypt_luks::luks2::random_bytes(old.volume_key.len());
        h.add_keyslot_for_new_key(&header, &new_vk, &pass, None, &pbkdf)
            .map_err(luks_error)?;
        let md = reencrypt::init_reencrypt(
            &h,
            &old.volume_key,
            &new_vk,
            &target,
            &InitOptions::default(),
        )
        .map_err(luks_error)?;
        reencrypt::write_metadata(&header, &h, &md).map_err(luks_error)?;
    }
    let device = args.device.clone();
    let header_arg = args.header.as_deref().unwrap_or(&device);
    convert(
        "reencrypt",
        &device,
        header_arg,
        &data,
        &pass,
        &args.run,
        &stop,
    )
}

pub fn decrypt(args: DecryptArgs) -> Result<(), CliError> {
    let Some(header_path) = args.header.clone() else {
        return Err(CliError::usage(
            "decrypting in place needs the detached header (--header FILE); a header on the \
             device itself would have to be moved off it first, which is not supported yet",
        ));
    };
    let data = open_rw(&args.device)?;
    let data_len = data
        .len()
        .map_err(|e| CliError::usage(format!("cannot read the size of {}: {e}", data.name())))?;
    check_size(&args.device, data_len)?;
    let stop = stop_on_signals()?;
    let header = open_rw(&header_path)?;
    let h = read_luks2(&header)?;
    let in_progress = reencrypt::state(h.metadata()) != State::None;
    if args.run.resume_only || in_progress {
        check_in_progress(&header_path, Mode::Decrypt)?;
    }
    let pass = args
        .run
        .key
        .read(&format!("Enter passphrase for {}: ", args.device.display()))?;
    if !in_progress {
        if h.metadata()
            .segments
            .get(0)
            .is_some_and(|s| s.kind() == "linear")
        {
            return Err(CliError::usage(format!(
                "{} is not encrypted (its header describes plaintext): nothing to decrypt",
                args.device.display()
            )));
        }
        let seg = h.data_segment().map_err(luks_error)?;
        if seg.offset != 0 {
            return Err(CliError::usage(format!(
                "the data of {} starts at byte {} of {}: not a detached-header volume",
                header_path.display(),
                seg.offset,
                args.device.display()
            )));
        }
        let unlocked = h.unlock(&header, &pass, None).map_err(luks_error)?;
        confirm(
            args.run.batch,
            &format!(
                "WARNING!\n========\nThis will decrypt {} in place; afterwards {} holds no keys.",
                args.device.display(),
                header_path.display()
            ),
        )?;
        // One header write records the decryption's start: before it the volume is as it was.
        let md = reencrypt::init_decrypt(&h, &unlocked.volume_key, &InitOptions::default())
            .map_err(luks_error)?;
        reencrypt::write_metadata(&header, &h, &md).map_err(luks_error)?;
    }
    convert(
        "decrypt",
        &args.device,
        &header_path,
        &data,
        &pass,
        &args.run,
        &stop,
    )
}

/// A new encryption: check everything, format the detached header for the device's data, and
/// record the encryption's start in it. Returns the passphrase.
fn start(
    args: &EncryptArgs,
    header_path: &Path,
    data: &FileStorage,
    data_len: u64,
) -> Result<zeroize::Zeroizing<Vec<u8>>, CliError> {
    if Header::read(data).is_ok() {
        return Err(CliError {
            code: Code::Busy,
            message: format!(
                "{} already has a LUKS header; it is encrypted already",
                args.device.display()
            ),
        });
    }
    if let Ok(existing) = FileStorage::open_read_only(header_path) {
        if Header::read(&existing).is_ok() {
            return Err(CliError {
                code: Code::Busy,
                message: format!(
                    "{} already holds a LUKS header (to continue an encryption, add --resume-only)",
                    header_path.display()
                ),
            });
        }
    }
    let options = FormatOptions {
        version: 2,
        cipher: args.cipher.clone(),
        key_bits: args.key_size,
        sector_size: args.sector_size,
        pbkdf: pbkdf_options(&args.pbkdf)?,
        detached_header: true,
        ..Default::default()
    };
    options.check().map_err(luks_error)?;
    confirm(
        args.run.batch,
        &format!(
            "WARNING!\n========\nThis will encrypt {} in place and write its header to {}.",
            args.device.display(),
            header_path.display()
        ),
    )?;
    let pass = new_passphrase(
        None,
        &args.run.key,
        &format!("Enter passphrase for {}: ", args.device.display()),
    )?;
    // The header is made whole in memory (formatted, then the encryption's start recorded) and
    // only then becomes the file, by rename: a crash leaves no header or a complete one, never a
    // header that names the plaintext as encrypted.
    let header = MemStorage::new(vec![0; options.header_file_size() as usize]);
    let (formatted, unlocked) =
        sectorcrypt_luks::format(&header, data_len, &options, &pass).map_err(luks_error)?;
    let Header::Luks2(h) = formatted else {
        return Err(CliError::usage("the new header is not LUKS2"));
    };
    let md = reencrypt::init_encrypt(&h, &unlocked.volume_key, &InitOptions::default())
        .map_err(luks_error)?;
    reencrypt::write_metadata(&header, &h, &md).map_err(luks_error)?;
    install_file(header_path, &header.contents())?;
    Ok(pass)
}

/// Write `bytes` as the new file `path` (mode 0600) atomically: a temporary file beside it,
/// synced, renamed over `path`, and the directory synced.
fn install_file(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let fail = |what: &str, e: std::io::Error| {
        CliError::usage(format!("cannot {what} header file {}: {e}", path.display()))
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".new");
    let tmp = PathBuf::from(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| fail("create", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| fail("write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| fail("install", e))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| fail("sync the directory of", e))
}

fn read_luks2(dev: &FileStorage) -> Result<Luks2Header, CliError> {
    match Header::read(dev).map_err(luks_error)? {
        Header::Luks2(h) => Ok(*h),
        Header::Luks1(_) => Err(CliError::usage("LUKS1 has no in-place encryption metadata")),
    }
}

fn volume_error(e: VolumeError) -> CliError {
    match e {
        VolumeError::Luks(l) => luks_error(l),
        other => CliError::usage(other),
    }
}

/// Progress: a bar on a terminal, JSON lines with `--json`, nothing otherwise.
struct Reporter {
    json: bool,
    bar: bool,
    /// The first step seen in this run: rates count from there (a resumed run starts part way).
    first: Option<(Instant, u64)>,
}

impl Reporter {
    fn new(json: bool) -> Self {
        Reporter {
            json,
            bar: !json && std::io::stderr().is_terminal(),
            first: None,
        }
    }

    fn step(&mut self, p: Progress) {
        let (t0, d0) = *self.first.get_or_insert((Instant::now(), p.done));
        let secs = t0.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            (p.done - d0) as f64 / secs
        } else {
            0.0
        };
        let eta = (rate > 0.0).then(|| (p.total - p.done) as f64 / rate);
        if self.json {
            let line = serde_json::json!({
                "done": p.done,
                "total": p.total,
                "bytes_per_sec": rate.round(),
                "eta_sec": eta.map(f64::round),
            });
            let _ = writeln!(std::io::stdout(), "{line}");
        } else if self.bar {
            let frac = p.done as f64 / p.total.max(1) as f64;
            let filled = ((frac * 30.0) as usize).min(30);
            eprint!(
                "\r[{}{}] {:5.1}%  {} / {}  {}/s  ETA {}   ",
                "#".repeat(filled),
                ".".repeat(30 - filled),
                frac * 100.0,
                bytes(p.done),
                bytes(p.total),
                bytes(rate as u64),
                eta.map_or_else(
                    || "?".to_string(),
                    |e| format!("{}:{:02}", e as u64 / 60, e as u64 % 60)
                )
            );
        }
    }

    fn done(&self) {
        if self.bar {
            eprintln!();
        }
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}
