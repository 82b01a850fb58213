//! `sectorcrypt`: the command line. It parses arguments, calls the library crates and maps their
//! errors to cryptsetup's exit codes (`../shared/design/CLI.md`); nothing else lives here.

#![forbid(unsafe_code)]

mod benchmark;
mod exit;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::CliError;

/// User-space storage encryption, compatible with cryptsetup.
#[derive(Parser, Debug)]
#[command(name = "sectorcrypt", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure ciphers and modes on this machine (memory only, no storage I/O).
    Benchmark(benchmark::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return exit::usage(e),
    };
    let result: Result<(), CliError> = match cli.command {
        Command::Benchmark(args) => benchmark::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}
