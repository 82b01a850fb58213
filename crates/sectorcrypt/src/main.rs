//! `sectorcrypt`: the command line. It parses arguments, calls the library crates and maps their
//! errors to cryptsetup's exit codes (`../shared/design/CLI.md`); nothing else lives here.

#![forbid(unsafe_code)]

mod benchmark;
mod exit;
mod header;
mod keyfile;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::CliError;

/// User-space storage encryption, compatible with cryptsetup.
#[derive(Parser, Debug)]
#[command(name = "sectorcrypt", version, about, long_about = None)]
struct Cli {
    /// Print more about what happens (and why a check failed).
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure ciphers and modes on this machine (memory only, no storage I/O).
    Benchmark(benchmark::Args),
    /// Print the LUKS header (cryptsetup luksDump).
    #[command(alias = "luksDump")]
    Dump(header::DumpArgs),
    /// Exit 0 if DEVICE has a LUKS header, 1 if not (cryptsetup isLuks).
    #[command(name = "is-luks", alias = "isLuks")]
    IsLuks(header::DeviceArgs),
    /// Print the UUID of a LUKS device (cryptsetup luksUUID).
    #[command(alias = "luksUUID")]
    Uuid(header::DeviceArgs),
    /// Exit 0 if the passphrase opens a keyslot, 2 if not.
    #[command(name = "test-passphrase")]
    TestPassphrase(header::TestArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return exit::usage(e),
    };
    let result: Result<(), CliError> = match cli.command {
        Command::Benchmark(args) => benchmark::run(args),
        Command::Dump(args) => header::dump(args),
        Command::IsLuks(args) => header::is_luks(args, cli.verbose),
        Command::Uuid(args) => header::uuid(args),
        Command::TestPassphrase(args) => header::test_passphrase(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}
