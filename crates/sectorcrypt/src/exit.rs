//! Errors as the user sees them: one sentence on stderr and cryptsetup's exit code.

use std::fmt;
use std::process::ExitCode;

/// cryptsetup's exit codes (CLI.md): 1 usage or other error, 2 no key slot opens, 3 out of
/// memory, 4 wrong device, 5 busy. No command so far can report 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
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
pub struct CliError {
    pub code: Code,
    pub message: String,
}

impl CliError {
    /// A usage or parameter error (exit 1).
    pub fn usage(message: impl fmt::Display) -> Self {
        CliError {
            code: Code::Usage,
            message: message.to_string(),
        }
    }

    /// Print the message (if any) and return the exit code.
    pub fn report(self) -> ExitCode {
        if !self.message.is_empty() {
            eprintln!("sectorcrypt: {}", self.message);
        }
        ExitCode::from(self.code as u8)
    }
}

/// A command-line parse failure: help and version go to stdout with exit 0; anything else is one
/// line on stderr and exit 1 (clap's own default would be 2, which means "wrong passphrase" here).
pub fn usage(e: clap::Error) -> ExitCode {
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
            let first = text
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            CliError::usage(format!("{first} (see 'sectorcrypt --help')")).report()
        }
    }
}
