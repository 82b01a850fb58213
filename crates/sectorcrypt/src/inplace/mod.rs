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

mod decrypt;
mod encrypt;
mod online;
mod reencrypt;

pub(crate) use decrypt::{decrypt, DecryptArgs};
pub(crate) use encrypt::{encrypt, EncryptArgs};
pub(crate) use online::Asked;
pub(crate) use reencrypt::{reencrypt, ReencryptArgs};

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sectorcrypt_luks::luks2::reencrypt::{InitOptions, Mode};
use sectorcrypt_secret::signals::{self, Subscription};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{FsDirectory, Storage};
use sectorcrypt_volume::convert::{self, read_luks2};
use sectorcrypt_volume::reencrypt::{run, Options, Outcome, Pace, DEFAULT_HOTZONE};
use sectorcrypt_volume::resilience::{self, Resilience};
use sectorcrypt_volume::Error as VolumeError;

use crate::progress::Reporter;
use sectorcrypt_storage::units::parse_size;

use crate::exit::CliError;
use crate::keyfile::KeyArgs;
use crate::keyslots::open_rw;
use crate::pbkdf_args::PbkdfArgs;
use crate::unlock::{unlock_noting_token, TokenArgs, Tokens};
use sectorcrypt_luks::luks2::Header as Luks2Header;

/// What `encrypt`, `decrypt` and `reencrypt` share: the passphrase and how the conversion runs.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// Only continue a conversion already in progress (started here or by cryptsetup).
    #[arg(long = "resume-only")]
    resume_only: bool,
    /// Only record the conversion in the header and stop, without converting anything (serve or
    /// mount the device to convert it online, or resume it later).
    #[arg(long = "init-only", conflicts_with = "resume_only")]
    init_only: bool,
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    tokens: TokenArgs,
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
    /// Convert at most this many bytes a second (K, M, G: KiB...), leaving the rest of the disk
    /// to the device's clients; default: as fast as it goes.
    #[arg(long = "max-rate", value_name = "BYTES", value_parser = parse_size)]
    max_rate: Option<u64>,
    /// Progress as JSON lines on standard output (one per step) instead of a bar.
    #[arg(long)]
    json: bool,
    /// How a step in place is protected against a crash, when starting: checksum (default:
    /// a hash per block), journal (the step's old data copied into the header first; smaller
    /// steps) or none (nothing: a crash inside a step loses that step's data). Decrypting a
    /// volume whose header is on it moves the data, and converts the first chunk last and in
    /// place: under datashift-checksum (default) or datashift-journal. An encryption that moves
    /// the data is protected by its copy.
    #[arg(long, value_name = "MODE", value_parser = clap::value_parser!(Resilience))]
    resilience: Option<Resilience>,
}

impl RunArgs {
    /// Whether a token option was given.
    pub(super) fn tokens_asked(&self) -> bool {
        self.tokens.asked_for()
    }

    /// The passphrase of `device`: from a token of its LUKS2 header `header` (the header device
    /// and the header read from it) when a `--token-*` option asks for one (as `cryptsetup
    /// reencrypt` takes them), else from the key file or a prompt; checked against the header
    /// as `cryptsetup open` checks it (during a conversion, the old and new keys too). Returns
    /// the token that released it, if one did.
    ///
    /// Without a header at hand, a token cannot be read: asking for one is refused.
    fn passphrase(
        &self,
        device: &Path,
        header: Option<(&dyn Storage, &Luks2Header)>,
    ) -> Result<(SecretBytes, Option<u32>), CliError> {
        let asked = self.tokens.asked_for();
        // The passphrase alone is not checked here: the conversion checks it, and a second key
        // derivation would double an Argon2 keyslot's cost.
        let (Some((dev, h)), true) = (header, asked) else {
            if asked {
                return Err(CliError::usage(format!(
                    "no LUKS2 header of {} to read tokens from",
                    device.display()
                )));
            }
            let pass = self
                .key
                .read(&format!("Enter passphrase for {}: ", device.display()))?;
            return Ok((pass, None));
        };
        let header = sectorcrypt_luks::Header::Luks2(Box::new(h.clone()));
        let (_, pass, token) = unlock_noting_token(
            &self.key,
            &self.tokens,
            Tokens::WhenAsked,
            &header,
            device,
            None,
            |pass, slot| header.unlock_checked(dev, pass, slot, false),
        )?;
        Ok((pass, token))
    }
}

/// The LUKS2 header in the file `path`, read without a lock (as beside a writer: reading is
/// safe) for its tokens, when a token option asks for them; `None` otherwise.
pub(super) fn header_for_tokens(
    run: &RunArgs,
    path: &Path,
) -> Result<Option<(sectorcrypt_storage::FileStorage, Luks2Header)>, CliError> {
    if !run.tokens.asked_for() {
        return Ok(None);
    }
    let dev = sectorcrypt_storage::FileStorage::open_read_only(path)
        .map_err(|e| crate::exit::open_failed(path, e))?;
    let h = read_luks2(&dev)?;
    Ok(Some((dev, h)))
}

/// A flag that SIGINT and SIGTERM set while it lives (instead of ending the process): the
/// conversion stops at its next safe point.
pub(crate) struct StopFlag {
    flag: Arc<AtomicBool>,
    _signals: Subscription,
}

impl StopFlag {
    /// Whether a stop was asked for. A signal sent to this thread alone (as strace's fault
    /// injection sends it at an exact write) is taken here, where the conversion checks anyway.
    pub(crate) fn is_set(&self) -> bool {
        signals::take_pending();
        self.flag.load(Ordering::SeqCst)
    }
}

impl std::ops::Deref for StopFlag {
    type Target = AtomicBool;
    fn deref(&self) -> &AtomicBool {
        &self.flag
    }
}

/// The stop flag, taken before anything is written.
pub(crate) fn stop_on_signals() -> Result<StopFlag, CliError> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = Arc::clone(&flag);
    let subscription = signals::subscribe(&[signals::SIGINT, signals::SIGTERM], move |_| {
        set.store(true, Ordering::SeqCst);
    })
    .map_err(|e| CliError::io("cannot take signals", e))?;
    Ok(StopFlag {
        flag,
        _signals: subscription,
    })
}

/// Run the conversion recorded in the header at `header_path` to its end, with progress; an
/// interruption is an error that says how to resume.
pub(super) fn run_conversion(
    resume: &str,
    header_path: &Path,
    data: &dyn Storage,
    pass: &[u8],
    args: &RunArgs,
    stop: &StopFlag,
) -> Result<(), CliError> {
    if args.init_only {
        return Ok(());
    }
    let header = open_rw(header_path)?;
    let options = Options {
        hotzone: args.hotzone_size.unwrap_or(DEFAULT_HOTZONE),
        threads: args.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| n as usize,
        ),
    };
    run_reporting(&header, data, pass, &options, args, stop, resume)
}

/// Run the conversion to its end, reporting each step; a stop request pauses it at a safe point,
/// which is an error that says `resume`.
pub(super) fn run_reporting(
    header: &dyn Storage,
    data: &dyn Storage,
    pass: &[u8],
    options: &Options,
    args: &RunArgs,
    stop: &StopFlag,
    resume: &str,
) -> Result<(), CliError> {
    let mut report = Reporter::new(args.json);
    let mut pace = Pace::new(args.max_rate);
    let outcome = run(header, data, pass, options, &mut |p| {
        report.step(p);
        pace.after(p, false, stop);
        !stop.is_set()
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

/// Whether the LUKS2 header at `path` records a conversion (read without a lock, as `dump` reads:
/// the device may be served).
pub(super) fn records_conversion(path: &Path) -> bool {
    sectorcrypt_storage::FileStorage::open_read_only(path)
        .ok()
        .and_then(|dev| read_luks2(&dev).ok())
        .is_some_and(|h| {
            sectorcrypt_luks::luks2::reencrypt::state(h.metadata())
                != sectorcrypt_luks::luks2::reencrypt::State::None
        })
}

/// `device` is served by a sectorcrypt process: ask it to run the conversion (see
/// `crate::online`), after the passphrase (a token's, read from the header at `header_path`
/// without a lock, beside the server) and, for a new conversion, the `warning` confirmed.
pub(super) fn ask_server(
    server: std::os::unix::net::UnixStream,
    device: &Path,
    header_path: &Path,
    run: &RunArgs,
    warning: Option<String>,
) -> Result<(), CliError> {
    let header = header_for_tokens(run, header_path)?;
    let header = header.as_ref().map(|(d, h)| (d as &dyn Storage, h));
    let (pass, _) = run.passphrase(device, header)?;
    if let Some(warning) = warning {
        crate::keyslots::confirm(run.batch, &warning)?;
    }
    crate::online::ask(server, &pass, run.json)
}

/// The header at `path` must record a conversion in progress of `mode`.
pub(super) fn check_in_progress(path: &Path, mode: Mode) -> Result<(), CliError> {
    let h = read_luks2(&open_rw(path)?)?;
    convert::resuming(&h, &path.display().to_string(), mode, true)?;
    Ok(())
}

/// The reencryption's start options: cryptsetup's defaults, but with `--pbkdf-force-iterations`
/// the reencryption digest takes the minimum PBKDF2 count instead of a calibration, as
/// cryptsetup's does.
pub(super) fn init_options(pbkdf: &PbkdfArgs, run: &RunArgs) -> Result<InitOptions, CliError> {
    Ok(InitOptions {
        digest_iterations: pbkdf
            .force_iterations
            .map(|_| sectorcrypt_luks::kdf::PBKDF2_MIN_ITERATIONS),
        resilience: resilience::in_place(run.resilience)?,
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

pub(super) fn device_len(dev: &dyn Storage) -> Result<u64, CliError> {
    dev.len()
        .map_err(|e| CliError::io(format!("cannot read the size of {}", dev.name()), e))
}

/// The directory of a header file, and its name there.
pub(super) fn directory_of(path: &Path) -> Result<(FsDirectory, String), CliError> {
    FsDirectory::of(path).map_err(|e| CliError::io(format!("header file {}", path.display()), e))
}

/// A conversion in progress is reported with the command that finishes it.
pub(super) fn with_resume_hint(e: VolumeError, device: &Path) -> CliError {
    match e {
        VolumeError::InProgress { mode, .. } => {
            let hint = resume_hint(mode.as_str(), device, None);
            CliError::usage(format!("{e}; run: {hint}"))
        }
        other => other.into(),
    }
}
