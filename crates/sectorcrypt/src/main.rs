//! `sectorcrypt`: the command line. It parses arguments, calls the library crates and maps their
//! errors to cryptsetup's exit codes (`docs/CLI.md`); nothing else lives here.

mod attach;
mod backup;
mod benchmark;
mod chip;
mod config;
mod device;
mod enroll;
mod examples;
mod exit;
mod flash;
mod format;
mod generate;
mod header;
mod inplace;
mod keyfile;
mod keyslots;
mod kpio;
mod mount;
mod online;
mod open;
mod pbkdf_args;
mod progress;
mod resize;
mod secrets;
mod serve;
mod unlock;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::CliError;

/// User-space storage encryption, compatible with cryptsetup.
#[derive(Parser, Debug)]
#[command(name = "sectorcrypt", version, about, long_about = None)]
struct Cli {
    /// Print more about what happens (and why a check failed).
    #[arg(short = 'v', long, global = true, help_heading = "Global options")]
    verbose: bool,
    /// Take no device locks (as cryptsetup's option): nothing then stops a second process from
    /// writing the same file, block device or flash at the same time. RBD images keep their
    /// exclusive lock.
    #[arg(long = "disable-locks", global = true, help_heading = "Global options")]
    disable_locks: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure ciphers and modes in memory, or (--device) time a volume's reads or writes against
    /// its ciphertext.
    #[command(after_help = examples::BENCHMARK)]
    Benchmark(benchmark::Args),
    /// Print the LUKS header (cryptsetup luksDump).
    #[command(alias = "luksDump")]
    #[command(after_help = examples::DUMP)]
    Dump(header::DumpArgs),
    /// Exit 0 if DEVICE has a LUKS header, 1 if not (cryptsetup isLuks).
    #[command(name = "is-luks", alias = "isLuks")]
    #[command(after_help = examples::IS_LUKS)]
    IsLuks(header::DeviceArgs),
    /// Print the UUID of a LUKS device (cryptsetup luksUUID).
    #[command(alias = "luksUUID")]
    #[command(after_help = examples::UUID)]
    Uuid(header::DeviceArgs),
    /// Exit 0 if the passphrase opens a keyslot, 2 if not.
    #[command(name = "test-passphrase")]
    #[command(after_help = examples::TEST_PASSPHRASE)]
    TestPassphrase(header::TestArgs),
    /// Create a LUKS2 (default) or LUKS1 volume (cryptsetup luksFormat).
    #[command(alias = "luksFormat")]
    #[command(after_help = examples::FORMAT)]
    Format(Box<format::FormatArgs>),
    /// Add a keyslot; the existing passphrase comes from --key-file (cryptsetup luksAddKey).
    #[command(name = "add-key", alias = "luksAddKey")]
    #[command(after_help = examples::ADD_KEY)]
    AddKey(keyslots::AddKeyArgs),
    /// Remove the keyslot that --key-file opens (cryptsetup luksRemoveKey).
    #[command(name = "remove-key", alias = "luksRemoveKey")]
    #[command(after_help = examples::REMOVE_KEY)]
    RemoveKey(keyslots::SlotArgs),
    /// Replace a passphrase (cryptsetup luksChangeKey).
    #[command(name = "change-key", alias = "luksChangeKey")]
    #[command(after_help = examples::CHANGE_KEY)]
    ChangeKey(keyslots::ChangeKeyArgs),
    /// Wipe keyslot N (cryptsetup luksKillSlot).
    #[command(name = "kill-slot", alias = "luksKillSlot")]
    #[command(after_help = examples::KILL_SLOT)]
    KillSlot(keyslots::KillSlotArgs),
    /// Add a keyslot that a TPM2 chip, a FIDO2 or PKCS#11 security token or a tang server
    /// unlocks, with the token that releases it (systemd-cryptenroll, clevis luks bind).
    #[command(after_help = examples::ENROLL)]
    Enroll(enroll::EnrollArgs),
    /// Save the header and keyslots to a file (cryptsetup luksHeaderBackup).
    #[command(name = "header-backup", alias = "luksHeaderBackup")]
    #[command(after_help = examples::HEADER_BACKUP)]
    HeaderBackup(backup::BackupArgs),
    /// Restore the header and keyslots from a backup file (cryptsetup luksHeaderRestore).
    #[command(name = "header-restore", alias = "luksHeaderRestore")]
    #[command(after_help = examples::HEADER_RESTORE)]
    HeaderRestore(backup::BackupArgs),
    /// Set the label, subsystem or a keyslot's priority of a LUKS2 header (cryptsetup config).
    #[command(after_help = examples::CONFIG)]
    Config(config::ConfigArgs),
    /// Remove every keyslot: no passphrase opens the volume any more (cryptsetup luksErase).
    #[command(alias = "luksErase")]
    #[command(after_help = examples::ERASE)]
    Erase(config::EraseArgs),
    /// Rewrite a damaged or out-of-date LUKS2 header copy from the good one (cryptsetup repair).
    #[command(after_help = examples::REPAIR)]
    Repair(config::RepairArgs),
    /// Convert a LUKS1 header to LUKS2 or back, in place and crash safe (cryptsetup convert).
    #[command(after_help = examples::CONVERT)]
    Convert(config::ConvertArgs),
    /// Import, export or remove LUKS2 JSON tokens (cryptsetup token).
    #[command(subcommand)]
    #[command(after_help = examples::TOKEN)]
    Token(config::TokenCommand),
    /// Encrypt a plaintext device in place, resumably: header to a file (--header) or onto the
    /// device, the data shifted (--reduce-device-size).
    #[command(after_help = examples::ENCRYPT)]
    Encrypt(Box<inplace::EncryptArgs>),
    /// Decrypt a device in place, resumably: with its detached header (--header), or exporting a
    /// header on the device to a new file (--header NEWFILE) and moving the data to offset 0.
    #[command(after_help = examples::DECRYPT)]
    Decrypt(Box<inplace::DecryptArgs>),
    /// Re-encrypt a LUKS2 device in place with a new volume key (key rotation), optionally a new
    /// cipher, key size or sector size, resumably; header on the device or detached.
    #[command(after_help = examples::REENCRYPT)]
    Reencrypt(Box<inplace::ReencryptArgs>),
    /// Change the size a served volume exposes: grow it to data added under it, or shrink it
    /// (cryptsetup resize).
    #[command(after_help = examples::RESIZE)]
    Resize(resize::ResizeArgs),
    /// Unlock DEVICE and export the decrypted volume over NBD until SIGINT/SIGTERM.
    #[command(after_help = examples::SERVE)]
    Serve(Box<serve::ServeArgs>),
    /// Unlock DEVICE and expose the decrypted volume as MOUNTPOINT/volume via FUSE until unmounted.
    #[command(after_help = examples::MOUNT)]
    Mount(Box<mount::MountArgs>),
    /// Encrypted raw NAND flash with UBI inside: format, convert, info, volumes (mkvol, rmvol,
    /// rsvol, update, read), import, export, attach, benchmark, study.
    #[command(subcommand)]
    #[command(after_help = examples::FLASH)]
    Flash(flash::Command),
    /// Key Per I/O: a store with a table of keys, each request under the key its export names.
    #[command(subcommand)]
    #[command(after_help = examples::KPIO)]
    Kpio(kpio::Command),
    /// Write the man pages or the shell completions (bash, zsh, fish) into a folder.
    #[command(subcommand)]
    #[command(after_help = examples::GENERATE)]
    Generate(generate::What),
}

/// The command line, as parsed and as documented (help, man pages, completions): the Ceph
/// options on every command that takes a device (raw flash and the generators take none).
fn command() -> clap::Command {
    device::with_ceph_options(
        <Cli as clap::CommandFactory>::command(),
        &["flash", "kpio benchmark", "generate"],
    )
}

fn main() -> ExitCode {
    // Before any thread is started, so that every thread has SIGINT, SIGTERM and SIGHUP blocked
    // and no signal handler runs on a thread in the middle of a keyed call (secret::signals).
    if let Err(e) = sectorcrypt_secret::signals::route() {
        return CliError::io("cannot take signals", e).report();
    }
    let parsed = command().try_get_matches().and_then(|m| {
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&m)?;
        Ok((cli, device::ceph_args_of(&m)))
    });
    let (cli, ceph) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return exit::usage(e),
    };
    secrets::protect_process(cli.verbose);
    device::configure(ceph);
    if cli.disable_locks {
        sectorcrypt_storage::lock::disable();
        eprintln!(
            "sectorcrypt: WARNING: locking is disabled (--disable-locks): nothing stops another \
             process from writing the same device at the same time"
        );
    }
    let result: Result<(), CliError> = match cli.command {
        Command::Benchmark(args) => benchmark::run(args),
        Command::Dump(args) => header::dump(args),
        Command::IsLuks(args) => header::is_luks(args, cli.verbose),
        Command::Uuid(args) => header::uuid(args),
        Command::TestPassphrase(args) => header::test_passphrase(args),
        Command::Format(args) => format::format(*args),
        Command::AddKey(args) => keyslots::add_key(args),
        Command::RemoveKey(args) => keyslots::remove_key(args),
        Command::ChangeKey(args) => keyslots::change_key(args),
        Command::KillSlot(args) => keyslots::kill_slot(args),
        Command::Enroll(args) => enroll::enroll(args),
        Command::HeaderBackup(args) => backup::header_backup(args),
        Command::HeaderRestore(args) => backup::header_restore(args),
        Command::Config(args) => config::config(args),
        Command::Erase(args) => config::erase(args),
        Command::Repair(args) => config::repair(args),
        Command::Token(command) => config::token(command),
        Command::Convert(args) => config::convert(args),
        Command::Serve(args) => serve::run(*args),
        Command::Encrypt(args) => inplace::encrypt(*args),
        Command::Decrypt(args) => inplace::decrypt(*args),
        Command::Reencrypt(args) => inplace::reencrypt(*args),
        Command::Resize(args) => resize::resize(args),
        Command::Mount(args) => mount::run(*args),
        Command::Flash(command) => flash::run(command),
        Command::Kpio(command) => kpio::run(command),
        Command::Generate(what) => generate::run(what, command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}

#[cfg(test)]
mod tests {

    /// Every command's options are consistent (unique short and long names...): clap checks it
    /// only when a command is parsed, so check them all here.
    #[test]
    fn the_command_line_is_consistent() {
        super::command().debug_assert();
    }
}
