//! `sectorcrypt`: the command line. It parses arguments, calls the library crates and maps their
//! errors to cryptsetup's exit codes (`../shared/design/CLI.md`); nothing else lives here.

mod attach;
mod benchmark;
mod chip;
mod config;
mod convert;
mod device;
mod exit;
mod flash;
mod header;
mod keyfile;
mod keyslots;
mod kpio;
mod mount;
mod open;
mod pbkdf_args;
mod progress;
mod serve;
mod units;

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
    /// Take no device locks (as cryptsetup's option): nothing then stops a second process from
    /// writing the same file, block device or flash at the same time. RBD images keep their
    /// exclusive lock.
    #[arg(long = "disable-locks", global = true)]
    disable_locks: bool,
    #[command(flatten)]
    ceph: device::CephArgs,
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
    /// Create a LUKS2 (default) or LUKS1 volume (cryptsetup luksFormat).
    #[command(alias = "luksFormat")]
    Format(Box<keyslots::FormatArgs>),
    /// Add a keyslot; the existing passphrase comes from --key-file (cryptsetup luksAddKey).
    #[command(name = "add-key", alias = "luksAddKey")]
    AddKey(keyslots::AddKeyArgs),
    /// Remove the keyslot that --key-file opens (cryptsetup luksRemoveKey).
    #[command(name = "remove-key", alias = "luksRemoveKey")]
    RemoveKey(keyslots::SlotArgs),
    /// Replace a passphrase (cryptsetup luksChangeKey).
    #[command(name = "change-key", alias = "luksChangeKey")]
    ChangeKey(keyslots::ChangeKeyArgs),
    /// Wipe keyslot N (cryptsetup luksKillSlot).
    #[command(name = "kill-slot", alias = "luksKillSlot")]
    KillSlot(keyslots::KillSlotArgs),
    /// Save the header and keyslots to a file (cryptsetup luksHeaderBackup).
    #[command(name = "header-backup", alias = "luksHeaderBackup")]
    HeaderBackup(keyslots::BackupArgs),
    /// Restore the header and keyslots from a backup file (cryptsetup luksHeaderRestore).
    #[command(name = "header-restore", alias = "luksHeaderRestore")]
    HeaderRestore(keyslots::BackupArgs),
    /// Set the label, subsystem or a keyslot's priority of a LUKS2 header (cryptsetup config).
    Config(config::ConfigArgs),
    /// Remove every keyslot: no passphrase opens the volume any more (cryptsetup luksErase).
    #[command(alias = "luksErase")]
    Erase(config::EraseArgs),
    /// Rewrite a damaged or out-of-date LUKS2 header copy from the good one (cryptsetup repair).
    Repair(config::RepairArgs),
    /// Convert a LUKS1 header to LUKS2 or back, in place and crash safe (cryptsetup convert).
    Convert(config::ConvertArgs),
    /// Import, export or remove LUKS2 JSON tokens (cryptsetup token).
    #[command(subcommand)]
    Token(config::TokenCommand),
    /// Encrypt a plaintext device in place, resumably: header to a file (--header) or onto the
    /// device, the data shifted (--reduce-device-size).
    Encrypt(Box<convert::EncryptArgs>),
    /// Decrypt a device in place, resumably: with its detached header (--header), or exporting a
    /// header on the device to a new file (--header NEWFILE) and moving the data to offset 0.
    Decrypt(Box<convert::DecryptArgs>),
    /// Re-encrypt a LUKS2 device in place with a new volume key (key rotation), optionally a new
    /// cipher, key size or sector size, resumably; header on the device or detached.
    Reencrypt(Box<convert::ReencryptArgs>),
    /// Unlock DEVICE and export the decrypted volume over NBD until SIGINT/SIGTERM.
    Serve(Box<serve::ServeArgs>),
    /// Unlock DEVICE and expose the decrypted volume as MOUNTPOINT/volume via FUSE until unmounted.
    Mount(Box<mount::MountArgs>),
    /// Encrypted raw NAND flash with UBI inside: format, info, volumes, import, export.
    #[command(subcommand)]
    Flash(flash::Command),
    /// Key Per I/O: a store with a table of keys, each request under the key its export names.
    #[command(subcommand)]
    Kpio(kpio::Command),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return exit::usage(e),
    };
    device::configure(cli.ceph);
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
        Command::Format(args) => keyslots::format(*args),
        Command::AddKey(args) => keyslots::add_key(args),
        Command::RemoveKey(args) => keyslots::remove_key(args),
        Command::ChangeKey(args) => keyslots::change_key(args),
        Command::KillSlot(args) => keyslots::kill_slot(args),
        Command::HeaderBackup(args) => keyslots::header_backup(args),
        Command::HeaderRestore(args) => keyslots::header_restore(args),
        Command::Config(args) => config::config(args),
        Command::Erase(args) => config::erase(args),
        Command::Repair(args) => config::repair(args),
        Command::Token(command) => config::token(command),
        Command::Convert(args) => config::convert(args),
        Command::Serve(args) => serve::run(*args),
        Command::Encrypt(args) => convert::encrypt(*args),
        Command::Decrypt(args) => convert::decrypt(*args),
        Command::Reencrypt(args) => convert::reencrypt(*args),
        Command::Mount(args) => mount::run(*args),
        Command::Flash(command) => flash::run(command),
        Command::Kpio(command) => kpio::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every command's options are consistent (unique short and long names...): clap checks it
    /// only when a command is parsed, so check them all here.
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
