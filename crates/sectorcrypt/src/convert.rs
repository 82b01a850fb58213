//! `encrypt`, `decrypt` and `reencrypt`: convert a device in place, resumably, keeping the
//! progress in LUKS2's own reencryption metadata (so `cryptsetup reencrypt --resume-only` can take
//! over, and so can we from a state cryptsetup left).
//!
//! The header goes to a file (`encrypt --header FILE`: the data stays where it is) or onto the
//! device (`encrypt --reduce-device-size 2S`: the data moves S bytes on). Decrypting a volume
//! whose header is on the device exports the header to a new file first (`decrypt --header
//! FILE`), then moves the data back to offset 0. Starting such a conversion takes several writes
//! before the header records it; each start is laid out so that a crash in the middle is
//! finished (or safely redone) by running the same command again (`sectorcrypt_volume::datashift`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sectorcrypt_luks::luks2::reencrypt::{InitOptions, Mode, ResilienceKind};
use sectorcrypt_luks::{FormatOptions, Header};
use sectorcrypt_storage::{FileStorage, FsDirectory, Storage};
use sectorcrypt_volume::convert::{self, read_luks2, ExportPlan, Placement, ShiftedPlan};
use sectorcrypt_volume::reencrypt::{run, Options, Outcome, DEFAULT_HOTZONE};
use sectorcrypt_volume::Error as VolumeError;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::progress::Reporter;
use crate::units::parse_size;

use crate::exit::CliError;
use crate::keyfile::KeyArgs;
use crate::keyslots::{confirm, new_passphrase, open_rw, pbkdf_options};
use crate::pbkdf_args::{CipherArgs, PbkdfArgs};

#[derive(clap::Args, Debug)]
pub(crate) struct EncryptArgs {
    /// The plaintext device or image file to encrypt in place.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Put the LUKS2 header in this file (detached header); the data stays where it is.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// Put the header at the start of DEVICE, moving the data half of BYTES further on; the
    /// last BYTES of DEVICE must be unused (shrink the file system first). Units: K, M, G (KiB...).
    #[arg(long = "reduce-device-size", value_name = "BYTES", value_parser = parse_size)]
    reduce_device_size: Option<u64>,
    #[command(flatten)]
    segment: CipherArgs,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    run: RunArgs,
}

/// What `encrypt`, `decrypt` and `reencrypt` share: the passphrase and how the conversion runs.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// Only continue a conversion already in progress (started here or by cryptsetup).
    #[arg(long = "resume-only")]
    resume_only: bool,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
    /// Bytes converted per step (default 64 MiB; a data-shift step is always the shift, this is
    /// then the first chunk a decryption moves).
    #[arg(long = "hotzone-size", value_name = "BYTES", value_parser = parse_size)]
    hotzone_size: Option<u64>,
    /// Cipher threads (default: the number of CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: Option<u32>,
    /// Progress as JSON lines on standard output (one per step) instead of a bar.
    #[arg(long)]
    json: bool,
    /// How a step in place is protected against a crash, when starting: checksum (default:
    /// a hash per block), journal (the step's old data copied into the header first; smaller
    /// steps) or none (nothing: a crash inside a step loses that step's data). Decrypting a
    /// volume whose header is on it moves the data, and converts the first chunk last and in
    /// place: under datashift-checksum (default) or datashift-journal. An encryption that moves
    /// the data is protected by its copy.
    #[arg(long, value_name = "MODE", value_parser = parse_resilience)]
    resilience: Option<ResilienceArg>,
}

/// `--resilience` as given: the protection, and whether it was named for a data shift
/// (`datashift-checksum`, `datashift-journal`).
#[derive(Clone, Copy, Debug)]
struct ResilienceArg {
    kind: ResilienceKind,
    datashift: bool,
}

fn parse_resilience(s: &str) -> Result<ResilienceArg, String> {
    let (name, datashift) = match s.strip_prefix("datashift-") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let kind = match name {
        "checksum" => ResilienceKind::Checksum(sectorcrypt_luks::hash::Hash::Sha256),
        "journal" => ResilienceKind::Journal,
        "none" if !datashift => ResilienceKind::None,
        "datashift" => {
            return Err(
                "datashift is chosen by itself: encrypt --reduce-device-size shifts the data"
                    .into(),
            )
        }
        _ => {
            return Err(format!(
                "unknown resilience '{s}' (use checksum, journal or none; datashift-checksum or \
                 datashift-journal to decrypt a volume whose header is on it)"
            ))
        }
    };
    Ok(ResilienceArg { kind, datashift })
}

/// `--resilience` given where the data moves: refused, as the move protects itself.
fn refuse_resilience_with_shift(run: &RunArgs) -> Result<(), CliError> {
    match run.resilience {
        Some(_) => Err(CliError::usage(
            "--resilience applies to conversions in place and to decrypting a volume whose \
             header is on it; an encryption that moves the data (--reduce-device-size) is \
             protected by its own copy",
        )),
        None => Ok(()),
    }
}

/// The resilience of a conversion in place: `datashift-*` is refused there.
fn in_place_resilience(run: &RunArgs) -> Result<ResilienceKind, CliError> {
    match run.resilience {
        Some(ResilienceArg {
            datashift: true, ..
        }) => Err(CliError::usage(
            "datashift-checksum and datashift-journal protect the decryption of a volume whose \
             header is on it (decrypt --header NEWFILE); in place use checksum, journal or none",
        )),
        Some(r) => Ok(r.kind),
        None => Ok(InitOptions::default().resilience),
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct DecryptArgs {
    /// The encrypted device or image file to decrypt in place.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The detached LUKS2 header of DEVICE; for a header on DEVICE, a new file to export it to
    /// (it holds the only copy of the keys until the decryption ends).
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

impl RunArgs {
    /// The passphrase of `device`, from the key file or a prompt.
    fn passphrase(&self, device: &Path) -> Result<zeroize::Zeroizing<Vec<u8>>, CliError> {
        self.key
            .read(&format!("Enter passphrase for {}: ", device.display()))
    }
}

/// SIGINT and SIGTERM set the returned flag; the conversion stops at its next safe point.
/// Installed before anything is written.
fn stop_on_signals() -> Result<Arc<AtomicBool>, CliError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .map_err(|e| CliError::io("cannot install signal handlers", e))?;
    }
    Ok(stop)
}

/// Run the conversion recorded in the header at `header_path` to its end, with progress; an
/// interruption is an error that says how to resume.
fn convert(
    resume: &str,
    header_path: &Path,
    data: &dyn Storage,
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
    run_reporting(&header, data, pass, &options, args.json, stop, resume)
}

/// Finish the conversion recorded in the header on `header` (for `serve` and `mount` of an
/// interrupted one), with a progress bar on a terminal; a signal stops it at a safe point and
/// says `resume`.
pub(crate) fn finish_conversion(
    header: &dyn Storage,
    data: &dyn Storage,
    pass: &[u8],
    threads: usize,
    resume: &str,
) -> Result<(), CliError> {
    let stop = stop_on_signals()?;
    let options = Options {
        hotzone: DEFAULT_HOTZONE,
        threads,
    };
    run_reporting(header, data, pass, &options, false, &stop, resume)
}

/// Run the conversion to its end, reporting each step; a stop request pauses it at a safe point,
/// which is an error that says `resume`.
fn run_reporting(
    header: &dyn Storage,
    data: &dyn Storage,
    pass: &[u8],
    options: &Options,
    json: bool,
    stop: &AtomicBool,
    resume: &str,
) -> Result<(), CliError> {
    let mut report = Reporter::new(json);
    let outcome = run(header, data, pass, options, &mut |p| {
        report.step(p);
        !stop.load(Ordering::Relaxed)
    })?;
    report.done();
    match outcome {
        Outcome::Finished => Ok(()),
        Outcome::Paused(p) => Err(CliError::usage(format!(
            "interrupted after {} of {} bytes, at a safe point; resume with: {resume}",
            p.done, p.total
        ))),
    }
}

/// The header at `path` must record a conversion in progress of `mode`.
fn check_in_progress(path: &Path, mode: Mode) -> Result<(), CliError> {
    let h = read_luks2(&open_rw(path)?)?;
    convert::resuming(&h, &path.display().to_string(), mode, true)?;
    Ok(())
}

/// The reencryption's start options: cryptsetup's defaults, but with `--pbkdf-force-iterations`
/// the reencryption digest takes the minimum PBKDF2 count instead of a calibration, as
/// cryptsetup's does.
fn init_options(pbkdf: &PbkdfArgs, run: &RunArgs) -> Result<InitOptions, CliError> {
    Ok(InitOptions {
        digest_iterations: pbkdf
            .force_iterations
            .map(|_| sectorcrypt_luks::kdf::PBKDF2_MIN_ITERATIONS),
        resilience: in_place_resilience(run)?,
        ..InitOptions::default()
    })
}

/// How to resume a conversion that stopped.
pub(crate) fn resume_hint(verb: &str, device: &Path, header: Option<&Path>) -> String {
    match header {
        Some(h) => format!(
            "sectorcrypt {verb} {} --header {} --resume-only",
            device.display(),
            h.display()
        ),
        None => format!("sectorcrypt {verb} {} --resume-only", device.display()),
    }
}

fn device_len(dev: &dyn Storage) -> Result<u64, CliError> {
    dev.len()
        .map_err(|e| CliError::io(format!("cannot read the size of {}", dev.name()), e))
}

pub(crate) fn encrypt(args: EncryptArgs) -> Result<(), CliError> {
    match (&args.header, args.reduce_device_size) {
        (Some(_), Some(_)) => Err(CliError::usage(
            "--header and --reduce-device-size do not go together: with a detached header \
             nothing needs to move",
        )),
        (Some(header_path), None) => encrypt_detached(&args, header_path),
        (None, Some(reduce)) => {
            refuse_resilience_with_shift(&args.run)?;
            encrypt_shifted(&args, Some(reduce))
        }
        // Resuming a shifted encryption: the device's own header says how.
        (None, None) if has_conversion(&args.device, Mode::Encrypt) => encrypt_shifted(&args, None),
        (None, None) => Err(CliError::usage(
            "encrypting in place needs room for the header: --header FILE (the header goes to \
             FILE, the data stays) or --reduce-device-size BYTES (the header goes to the start \
             of DEVICE and the data moves half of BYTES on; the last BYTES must be unused; \
             after a crash, run the same command again)",
        )),
    }
}

/// Whether the LUKS2 header on `path` records a `mode` conversion.
fn has_conversion(path: &Path, mode: Mode) -> bool {
    FileStorage::open_read_only(path)
        .ok()
        .and_then(|dev| read_luks2(&dev).ok())
        .is_some_and(|h| convert::resuming(&h, "", mode, true).is_ok())
}

fn encrypt_detached(args: &EncryptArgs, header_path: &Path) -> Result<(), CliError> {
    let data = open_rw(&args.device)?;
    let data_len = device_len(&data)?;
    convert::check_size(&data.name(), data_len)?;
    let stop = stop_on_signals()?;
    let pass = if args.run.resume_only {
        check_in_progress(header_path, Mode::Encrypt)?;
        args.run.passphrase(&args.device)?
    } else {
        start(args, header_path, &data, data_len)?
    };
    let resume = resume_hint("encrypt", &args.device, Some(header_path));
    convert(&resume, header_path, &data, &pass, &args.run, &stop)
}

/// `encrypt --reduce-device-size`: the header at the start of the device, the data shifted.
/// `reduce` is `None` when resuming what the device records.
fn encrypt_shifted(args: &EncryptArgs, reduce: Option<u64>) -> Result<(), CliError> {
    let dev = open_rw(&args.device)?;
    // Installed first: planning may finish a start cut short (writes).
    let stop = stop_on_signals()?;
    let plan = convert::plan_shifted_encryption(&dev, reduce, args.run.resume_only)?;
    let pass = match plan {
        ShiftedPlan::Resume => args.run.passphrase(&args.device)?,
        ShiftedPlan::Fresh { shift, keep } => {
            let options = format_options(args, Some(shift))?;
            let warning = format!(
                "WARNING!\n========\nThis will encrypt {} in place. Its first {keep} bytes are \
                 kept (behind a {shift}-byte header); the last {} bytes must be unused (shrink \
                 the file system first): they are overwritten.",
                args.device.display(),
                2 * shift
            );
            let len = device_len(&dev)?;
            let (image, pass) =
                new_header(args, &options, shift, len, &warning, Placement::DataShift)?;
            convert::start_shifted_encryption(&dev, &image)?;
            pass
        }
    };
    let resume = resume_hint("encrypt", &args.device, None);
    convert(&resume, &args.device, &dev, &pass, &args.run, &stop)
}

/// The LUKS2 options of a new encryption.
fn format_options(args: &EncryptArgs, data_offset: Option<u64>) -> Result<FormatOptions, CliError> {
    let options = FormatOptions {
        version: 2,
        cipher: args.segment.cipher.clone(),
        key_bits: args.segment.key_size,
        sector_size: args.segment.sector_size,
        pbkdf: pbkdf_options(&args.pbkdf)?,
        detached_header: data_offset.is_none(),
        data_offset,
        ..Default::default()
    };
    options.check()?;
    Ok(options)
}

/// Confirm `warning`, ask for the new passphrase, and build the new encryption's header in
/// memory (`size` bytes, for a `data_len`-byte device, placed as `placement` says). Returns its
/// bytes and the passphrase.
fn new_header(
    args: &EncryptArgs,
    options: &FormatOptions,
    size: u64,
    data_len: u64,
    warning: &str,
    placement: Placement,
) -> Result<(Vec<u8>, zeroize::Zeroizing<Vec<u8>>), CliError> {
    confirm(args.run.batch, warning)?;
    let pass = new_passphrase(
        None,
        &args.run.key,
        &format!("Enter passphrase for {}: ", args.device.display()),
    )?;
    let init = init_options(&args.pbkdf, &args.run)?;
    let image = convert::encryption_header(options, size, data_len, &pass, placement, &init)?;
    Ok((image, pass))
}

#[derive(clap::Args, Debug)]
pub(crate) struct ReencryptArgs {
    /// The LUKS2 device or image file whose volume key to replace.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Its detached header, if it has one.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// New cipher specification (default: the current one).
    #[arg(short = 'c', long, value_name = "SPEC")]
    cipher: Option<String>,
    /// New whole key size in bits (default: the current one, or the new cipher's default).
    #[arg(short = 's', long = "key-size", value_name = "BITS")]
    key_size: Option<usize>,
    /// New encryption sector size (default: the current one).
    #[arg(long = "sector-size", value_name = "BYTES")]
    sector_size: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    run: RunArgs,
}

/// `reencrypt`: a new volume key for the data (key rotation), optionally a new cipher or sector
/// size, in place, resumably. The data does not move, so a header on the device itself works
/// too.
pub(crate) fn reencrypt(args: ReencryptArgs) -> Result<(), CliError> {
    let header_path = args.header.clone().unwrap_or_else(|| args.device.clone());
    let data = open_rw(&args.device)?;
    let header = open_rw(&header_path)?;
    let stop = stop_on_signals()?;
    let h = read_luks2(&header)?;
    let name = header_path.display().to_string();
    let in_progress = convert::resuming(&h, &name, Mode::Reencrypt, args.run.resume_only)?;
    let pass = args.run.passphrase(&args.device)?;
    if !in_progress {
        let data_len = device_len(&data)?;
        let offset = h.data_segment()?.offset;
        convert::check_size(&data.name(), data_len.saturating_sub(offset))?;
        let old = h.unlock(&header, &pass, None)?;
        let pbkdf = pbkdf_options(&args.pbkdf)?.luks2()?;
        let new = convert::plan_reencryption(
            &h,
            args.cipher.as_deref(),
            args.key_size,
            args.sector_size,
            old.volume_key.len(),
        )?;
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
        convert::start_reencryption(
            &header,
            &h,
            &old.volume_key,
            &pass,
            &new,
            &pbkdf,
            &init_options(&args.pbkdf, &args.run)?,
        )?;
    }
    let resume = resume_hint("reencrypt", &args.device, args.header.as_deref());
    convert(&resume, &header_path, &data, &pass, &args.run, &stop)
}

pub(crate) fn decrypt(args: DecryptArgs) -> Result<(), CliError> {
    let Some(header_path) = args.header.clone() else {
        let on_device =
            FileStorage::open_read_only(&args.device).is_ok_and(|dev| Header::is_present(&dev));
        return Err(CliError::usage(if on_device {
            format!(
                "{} has its header on it, and the plaintext moves over it: add --header FILE, \
                 a new file to export the header to (it holds the keys until the end)",
                args.device.display()
            )
        } else {
            "decrypting in place needs the detached header (--header FILE)".to_string()
        }));
    };
    let data = open_rw(&args.device)?;
    convert::check_size(&data.name(), device_len(&data)?)?;
    let stop = stop_on_signals()?;
    if !header_path.exists() {
        return decrypt_attached(&args, &header_path, &data, &stop);
    }
    let header = open_rw(&header_path)?;
    let h = read_luks2(&header)?;
    let name = header_path.display().to_string();
    let in_progress = convert::resuming(&h, &name, Mode::Decrypt, args.run.resume_only)?;
    let pass = args.run.passphrase(&args.device)?;
    if !in_progress {
        convert::check_detached_decryption(&h, &name, &args.device.display().to_string())?;
        let unlocked = h.unlock(&header, &pass, None)?;
        confirm(
            args.run.batch,
            &format!(
                "WARNING!\n========\nThis will decrypt {} in place; afterwards {} holds no keys.",
                args.device.display(),
                header_path.display()
            ),
        )?;
        let init = InitOptions {
            resilience: in_place_resilience(&args.run)?,
            ..InitOptions::default()
        };
        convert::start_decryption(&header, &h, &unlocked.volume_key, &init)?;
    }
    let resume = resume_hint("decrypt", &args.device, Some(&header_path));
    convert(&resume, &header_path, &data, &pass, &args.run, &stop)
}

/// `decrypt --header NEWFILE` of a volume whose header is on the device: the header is exported
/// to NEWFILE and the data moved to offset 0 (`convert::start_exported_decryption`); the
/// passphrase is asked, checked and confirmed between planning and starting.
fn decrypt_attached(
    args: &DecryptArgs,
    header_path: &Path,
    dev: &dyn Storage,
    stop: &AtomicBool,
) -> Result<(), CliError> {
    let init = InitOptions {
        resilience: match args.run.resilience {
            Some(ResilienceArg {
                kind: ResilienceKind::None,
                ..
            }) => {
                return Err(CliError::usage(
                    "the moved first chunk of this decryption needs protection: \
                     --resilience datashift-checksum (default) or datashift-journal",
                ))
            }
            Some(r) => r.kind,
            None => InitOptions::default().resilience,
        },
        ..InitOptions::default()
    };
    let (dir, name) = directory_of(header_path)?;
    let plan = convert::plan_exported_decryption(dev, &dir, &name, args.run.resume_only)
        .map_err(|e| with_resume_hint(e, &args.device))?;
    let pass = args.run.passphrase(&args.device)?;
    if let ExportPlan::Fresh(h) = &plan {
        // A wrong passphrase is refused before anything is written.
        h.unlock(dev, &pass, None)?;
        confirm(
            args.run.batch,
            &format!(
                "WARNING!\n========\nThis will decrypt {} in place, moving the data to its \
                 start; its header is exported to {}, which holds the only copy of the keys \
                 until the decryption ends.",
                args.device.display(),
                header_path.display()
            ),
        )?;
    }
    let moved = args.run.hotzone_size.unwrap_or(DEFAULT_HOTZONE);
    convert::start_exported_decryption(dev, &dir, &name, &plan, &pass, moved, &init)?;
    let resume = resume_hint("decrypt", &args.device, Some(header_path));
    convert(&resume, header_path, dev, &pass, &args.run, stop)
}

/// The directory of a header file, and its name there.
fn directory_of(path: &Path) -> Result<(FsDirectory, String), CliError> {
    FsDirectory::of(path).map_err(|e| CliError::io(format!("header file {}", path.display()), e))
}

/// A conversion in progress is reported with the command that finishes it.
fn with_resume_hint(e: VolumeError, device: &Path) -> CliError {
    match e {
        VolumeError::InProgress { mode, .. } => {
            let hint = resume_hint(mode.as_str(), device, None);
            CliError::usage(format!("{e}; run: {hint}"))
        }
        other => other.into(),
    }
}

/// A new encryption: check everything, format the detached header for the device's data, and
/// record the encryption's start in it. Returns the passphrase.
fn start(
    args: &EncryptArgs,
    header_path: &Path,
    data: &dyn Storage,
    data_len: u64,
) -> Result<zeroize::Zeroizing<Vec<u8>>, CliError> {
    let existing = FileStorage::open_read_only(header_path).ok();
    convert::check_new_encryption(data, existing.as_ref().map(|f| f as &dyn Storage))?;
    let options = format_options(args, None)?;
    let warning = format!(
        "WARNING!\n========\nThis will encrypt {} in place and write its header to {}.",
        args.device.display(),
        header_path.display()
    );
    // The header is made whole in memory (formatted, then the encryption's start recorded) and
    // only then becomes the file, by rename: a crash leaves no header or a complete one, never a
    // header that names the plaintext as encrypted.
    let size = options.header_file_size();
    let (image, pass) = new_header(
        args,
        &options,
        size,
        data_len,
        &warning,
        Placement::Detached,
    )?;
    let (dir, name) = directory_of(header_path)?;
    convert::start_detached_encryption(&dir, &name, &image)?;
    Ok(pass)
}
