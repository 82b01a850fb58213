//! Errors as the user sees them: one sentence on stderr and cryptsetup's exit code.

use std::fmt;
use std::process::ExitCode;

use sectorcrypt_luks::Error as LuksError;
use sectorcrypt_volume::Error as VolumeError;

/// cryptsetup's exit codes (CLI.md): 1 usage or other error, 2 no key slot opens, 3 out of
/// memory, 4 wrong device, 5 busy. No command so far can report 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Code {
    /// Wrong parameters or any other error.
    Usage = 1,
    /// No keyslot opens with the given passphrase.
    Permission = 2,
    /// The device is missing, too small, or not LUKS where LUKS is required.
    Device = 4,
    /// The device, socket or mount point is already in use.
    Busy = 5,
}

/// A failed command.
#[derive(Debug)]
pub(crate) struct CliError {
    pub code: Code,
    pub message: String,
}

impl CliError {
    /// A usage or parameter error (exit 1).
    pub(crate) fn usage(message: impl fmt::Display) -> Self {
        CliError {
            code: Code::Usage,
            message: message.to_string(),
        }
    }

    /// A failure of the system rather than of the arguments (exit 1, cryptsetup's "any other
    /// error"): `what` failed with `e`.
    pub(crate) fn io(what: impl fmt::Display, e: std::io::Error) -> Self {
        CliError {
            code: Code::Usage,
            message: format!("{what}: {e}"),
        }
    }

    /// Print the message (if any) and return the exit code.
    pub(crate) fn report(self) -> ExitCode {
        if !self.message.is_empty() {
            eprintln!("sectorcrypt: {}", self.message);
        }
        ExitCode::from(self.code as u8)
    }
}

/// Exit 5 with the lock's own sentence if `e` says another process holds the device.
pub(crate) fn held_elsewhere(e: &std::io::Error) -> Option<CliError> {
    (e.kind() == std::io::ErrorKind::ResourceBusy).then(|| CliError {
        code: Code::Busy,
        message: e.to_string(),
    })
}

/// Opening `path` failed with `e`: exit 5 with the lock's own sentence (it names the holder) when
/// another process holds the device, else cryptsetup's "does not exist or access denied" (exit 4).
pub(crate) fn open_failed(path: &std::path::Path, e: std::io::Error) -> CliError {
    if let Some(busy) = held_elsewhere(&e) {
        return busy;
    }
    CliError {
        code: Code::Device,
        message: format!(
            "Device {} does not exist or access denied ({e}).",
            path.display()
        ),
    }
}

/// A command-line parse failure: help and version go to stdout with exit 0; anything else is one
/// line on stderr and exit 1 (clap's own default would be 2, which means "wrong passphrase" here).
pub(crate) fn usage(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(Code::Usage as u8)
            } else {
                ExitCode::SUCCESS
            }
        }
        _ => {
            let text = e.render().to_string();
            let mut lines = text.lines();
            let mut first = lines
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ")
                .to_string();
            // "... not provided:" names what is missing on the indented lines after it.
            if first.ends_with(':') {
                let listed: Vec<&str> = lines
                    .take_while(|l| l.starts_with("  "))
                    .map(str::trim)
                    .collect();
                first = format!("{first} {}", listed.join(", "));
            }
            CliError::usage(format!("{first} (see 'sectorcrypt --help')")).report()
        }
    }
}

/// A LUKS error as cryptsetup reports it: its messages for the cases a script matches on, the
/// exit code for a wrong device (4) or passphrase (2), and the whole `source()` chain otherwise.
impl From<LuksError> for CliError {
    fn from(e: LuksError) -> Self {
        let code = match &e {
            LuksError::NotLuks { .. } => Code::Device,
            // cryptsetup answers -EPERM (2) for conversion metadata that does not verify, as for
            // a wrong passphrase: the keys opened, but not for this metadata.
            LuksError::WrongPassphrase | LuksError::DigestMismatch(_) => Code::Permission,
            _ => Code::Usage,
        };
        let message = match e {
            LuksError::NotLuks { device } => format!("Device {device} is not a valid LUKS device."),
            LuksError::WrongPassphrase => "No key available with this passphrase.".to_string(),
            LuksError::NoUsableKeyslot(why) => format!("No usable keyslot is available ({why})."),
            LuksError::AmbiguousSignatures { kind, offset } => format!(
                "Device contains ambiguous signatures ({kind} at byte {offset}) and a damaged or \
                 stale LUKS2 header copy, cannot auto-recover LUKS2. If the device is meant to \
                 be LUKS, remove the other signature (wipefs lists and erases it) or restore a header \
                 backup (header-restore); if it now holds the {kind}, the LUKS header is stale."
            ),
            LuksError::DigestMismatch(what) => format!(
                "Reencryption metadata is invalid: {what} does not verify with the volume keys \
                 (changed by someone without them)."
            ),
            other => chain(&other),
        };
        CliError { code, message }
    }
}

/// A volume-layer error: the LUKS errors inside it as above, the rest with their causes.
impl From<VolumeError> for CliError {
    fn from(e: VolumeError) -> Self {
        match e {
            VolumeError::Luks(l) => l.into(),
            VolumeError::WrongDevice(message) => CliError {
                code: Code::Device,
                message,
            },
            VolumeError::Exists(message) => CliError {
                code: Code::Busy,
                message,
            },
            other => CliError::usage(chain(&other)),
        }
    }
}

/// `e` and each of its sources that adds something, joined by ": ".
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let part = cause.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        next = cause.source();
    }
    text
}
