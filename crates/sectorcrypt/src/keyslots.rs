//! Commands that change a LUKS header: `format` (luksFormat), `add-key` (luksAddKey),
//! `remove-key` (luksRemoveKey), `change-key` (luksChangeKey), `kill-slot` (luksKillSlot),
//! `header-backup` (luksHeaderBackup), `header-restore` (luksHeaderRestore).
//!
//! Each reads and checks everything it needs (passphrases, key files, the header) before the
//! first write, so a refused command leaves the device byte for byte as it was; the LUKS layer
//! orders its own writes so that a crash leaves the old or the new state.

use std::fs::OpenOptions;
use std::io::{IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use sectorcrypt_luks::{FormatOptions, Header, PbkdfOptions};
use sectorcrypt_storage::{FileStorage, Storage};
use zeroize::Zeroizing;

use crate::chip::open_header;
use crate::exit::{open_failed, CliError, Code};
use crate::keyfile::KeyArgs;
use crate::pbkdf_args::{CipherArgs, NewKeyArgs, PbkdfArgs};

/// Open `path` (a file, block device or RBD image) for writing, locked against every other
/// process until it is dropped: exit 4 if it is missing or not writable, 5 if another process
/// holds it.
pub(crate) fn open_rw(path: &Path) -> Result<Box<dyn Storage>, CliError> {
    if let Some(image) = crate::device::rbd(path, true) {
        return image;
    }
    let file = FileStorage::open(path).map_err(|e| open_failed(path, e))?;
    Ok(Box::new(file))
}

/// Ask "Are you sure?" on a terminal unless `batch`; like cryptsetup, proceed without asking when
/// standard input is not a terminal.
pub(crate) fn confirm(batch: bool, warning: &str) -> Result<(), CliError> {
    if batch || !std::io::stdin().is_terminal() {
        return Ok(());
    }
    eprint!("{warning}\nAre you sure? (Type 'yes' in capital letters): ");
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| CliError::io("cannot read the answer", e))?;
    if answer.trim_end() != "YES" {
        return Err(CliError::usage("Operation aborted."));
    }
    Ok(())
}

/// A new passphrase: from `file` if given, else asked twice on the terminal.
pub(crate) fn new_passphrase(
    file: Option<&PathBuf>,
    key: &KeyArgs,
    prompt: &str,
) -> Result<Zeroizing<Vec<u8>>, CliError> {
    if let Some(file) = file {
        let from_file = KeyArgs {
            key_file: Some(file.clone()),
            ..key.clone()
        };
        return from_file.read(prompt);
    }
    let first = key.read(prompt)?;
    if key.key_file.is_none() {
        let again = key.read("Verify passphrase: ")?;
        if first != again {
            return Err(CliError::usage("Passphrases do not match."));
        }
    }
    Ok(first)
}

pub(crate) fn pbkdf_options(args: &PbkdfArgs) -> Result<PbkdfOptions, CliError> {
    Ok(PbkdfOptions {
        kind: args.pbkdf,
        hash: args.hash,
        iter_time_ms: args.iter_time_ms()?,
        memory_kib: args.memory,
        parallel: args.parallel,
        force_iterations: args.force_iterations,
    })
}

#[derive(clap::Args, Debug)]
pub(crate) struct FormatArgs {
    /// The device or image file to format.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    #[command(flatten)]
    new: NewKeyArgs,
    /// luks2 (default) or luks1.
    #[arg(long = "type", value_name = "TYPE", default_value = "luks2", value_parser = parse_luks_version)]
    luks_version: u8,
    #[command(flatten)]
    segment: CipherArgs,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// Keyslot for the first passphrase.
    #[arg(short = 'S', long = "key-slot", value_name = "N")]
    key_slot: Option<usize>,
    /// Write the header to this file (detached header); the data starts at DEVICE's first byte.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// LUKS2 label.
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// LUKS2 subsystem.
    #[arg(long, value_name = "TEXT")]
    subsystem: Option<String>,
    /// Use this UUID instead of a random one.
    #[arg(long, value_name = "UUID")]
    uuid: Option<String>,
    /// Use the volume key in FILE instead of a random one.
    #[arg(
        long = "volume-key-file",
        alias = "master-key-file",
        value_name = "FILE"
    )]
    volume_key_file: Option<PathBuf>,
    /// LUKS2 metadata area size (bytes, 16 KiB .. 4 MiB).
    #[arg(long = "luks2-metadata-size", value_name = "BYTES")]
    metadata_size: Option<u64>,
    /// LUKS2 keyslots area size (bytes).
    #[arg(long = "luks2-keyslots-size", value_name = "BYTES")]
    keyslots_size: Option<u64>,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

/// `--type luks2|luks1` (cryptsetup also takes `luks` for the default) as the LUKS version.
fn parse_luks_version(name: &str) -> Result<u8, String> {
    match name {
        "luks2" | "luks" => Ok(2),
        "luks1" => Ok(1),
        other => Err(format!("unknown type '{other}' (use luks2 or luks1)")),
    }
}

pub(crate) fn format(args: FormatArgs) -> Result<(), CliError> {
    let version = args.luks_version;
    let data = open_rw(&args.device)?;
    if args.new.new_key_file.is_some() && args.key.key_file.is_some() {
        return Err(CliError::usage(
            "give the passphrase either as --key-file or as the key file argument, not both",
        ));
    }
    let pbkdf = pbkdf_options(&args.pbkdf)?;
    let volume_key = match &args.volume_key_file {
        Some(path) => Some(Zeroizing::new(std::fs::read(path).map_err(|e| {
            CliError::io(format!("cannot read volume key file {}", path.display()), e)
        })?)),
        None => None,
    };
    let options = FormatOptions {
        version,
        cipher: args.segment.cipher.clone(),
        key_bits: args.segment.key_size,
        sector_size: args.segment.sector_size,
        pbkdf,
        label: args.label.clone(),
        subsystem: args.subsystem.clone(),
        uuid: args.uuid.clone(),
        keyslot: args.key_slot,
        volume_key,
        metadata_size: args.metadata_size,
        keyslots_size: args.keyslots_size,
        detached_header: args.header.is_some(),
        data_offset: None,
        // An RBD image's object size, as librbd aligns its own LUKS data (files state none).
        data_alignment: data.optimal_io_size(),
    };
    // Everything that can be refused is refused before the device is touched.
    options.check()?;
    let header_dev = match &args.header {
        Some(path) => Some(open_or_create_header_file(
            path,
            options.header_file_size(),
        )?),
        None => None,
    };
    let target: &dyn Storage = match &header_dev {
        Some(h) => h,
        None => &*data,
    };
    confirm(
        args.batch,
        &format!(
            "WARNING!\n========\nThis will overwrite data on {} irrevocably.",
            target.name()
        ),
    )?;
    let pass = new_passphrase(
        args.new.new_key_file.as_ref(),
        &args.key,
        &format!("Enter passphrase for {}: ", args.device.display()),
    )?;
    sectorcrypt_luks::format(
        target,
        data.len().map_err(|e| CliError::usage(e.to_string()))?,
        &options,
        &pass,
    )?;
    Ok(())
}

/// A detached header file: opened (and locked) if it exists, and grown to `size` bytes if
/// shorter; created with mode 0600 if not.
fn open_or_create_header_file(path: &Path, size: u64) -> Result<FileStorage, CliError> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| CliError {
            code: Code::Device,
            message: format!("cannot create header file {}: {e}", path.display()),
        })?;
    let file = FileStorage::open(path).map_err(|e| open_failed(path, e))?;
    file.grow_to(size)
        .map_err(|e| CliError::io(format!("cannot size header file {}", path.display()), e))?;
    Ok(file)
}

/// Device, detached header, existing passphrase, target slot, PBKDF: what the keyslot commands share.
#[derive(clap::Args, Debug)]
pub(crate) struct SlotArgs {
    /// The LUKS device or image file.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The detached header of DEVICE.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    /// Keyslot to use (the new one for add-key, the one to open otherwise).
    #[arg(short = 'S', long = "key-slot", value_name = "N")]
    key_slot: Option<usize>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

impl SlotArgs {
    fn open(&self) -> Result<(Box<dyn Storage>, Header), CliError> {
        let dev = open_header(self.header.as_deref().unwrap_or(&self.device), false)?;
        let header = Header::read(&*dev)?;
        Ok((dev, header))
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct AddKeyArgs {
    #[command(flatten)]
    slot: SlotArgs,
    #[command(flatten)]
    new: NewKeyArgs,
    /// Add a keyslot bound to no segment (LUKS2), holding a new random key of --key-size bits
    /// (default: the volume key's size) or the key in --volume-key-file; no existing passphrase
    /// is asked, as with cryptsetup.
    #[arg(long)]
    unbound: bool,
    /// With --unbound: the size of the new random key in bits.
    #[arg(
        short = 's',
        long = "key-size",
        value_name = "BITS",
        requires = "unbound"
    )]
    key_size: Option<usize>,
    /// With --unbound: store the key in FILE instead of a random one.
    #[arg(
        long = "volume-key-file",
        alias = "master-key-file",
        value_name = "FILE",
        requires = "unbound",
        conflicts_with = "key_size"
    )]
    volume_key_file: Option<PathBuf>,
}

pub(crate) fn add_key(args: AddKeyArgs) -> Result<(), CliError> {
    let s = &args.slot;
    let (dev, mut header) = s.open()?;
    let pbkdf = pbkdf_options(&s.pbkdf)?;
    if args.unbound {
        return add_unbound_key(&args, &*dev, &mut header, &pbkdf);
    }
    let existing = s.key.read("Enter any existing passphrase: ")?;
    let unlocked = header.unlock(&*dev, &existing, None)?;
    let new = new_passphrase(
        args.new.new_key_file.as_ref(),
        &KeyArgs::default(),
        "Enter new passphrase for key slot: ",
    )?;
    header.add_keyslot(&*dev, &unlocked.volume_key, &new, s.key_slot, &pbkdf)?;
    Ok(())
}

/// `add-key --unbound`: the key and the new passphrase are checked before anything is written.
fn add_unbound_key(
    args: &AddKeyArgs,
    dev: &dyn Storage,
    header: &mut Header,
    pbkdf: &PbkdfOptions,
) -> Result<(), CliError> {
    let Header::Luks2(h) = &*header else {
        return Err(CliError::usage(
            "unbound keyslots are a LUKS2 feature; this is a LUKS1 volume",
        ));
    };
    let key = match (&args.volume_key_file, args.key_size) {
        (Some(path), _) => Zeroizing::new(std::fs::read(path).map_err(|e| {
            CliError::io(format!("cannot read volume key file {}", path.display()), e)
        })?),
        (None, Some(bits)) if bits == 0 || bits % 8 != 0 || bits > 4096 => {
            return Err(CliError::usage(format!(
                "--key-size {bits}: the key size must be a multiple of 8 bits, 8 to 4096"
            )))
        }
        (None, bits) => {
            let len = match bits {
                Some(b) => b / 8,
                None => h.volume_key_len()?,
            };
            sectorcrypt_luks::luks2::random_bytes(len)
        }
    };
    let new = new_passphrase(
        args.new.new_key_file.as_ref(),
        &KeyArgs::default(),
        "Enter new passphrase for key slot: ",
    )?;
    header.add_unbound_keyslot(dev, &key, &new, args.slot.key_slot, pbkdf)?;
    Ok(())
}

pub(crate) fn remove_key(args: SlotArgs) -> Result<(), CliError> {
    let (dev, mut header) = args.open()?;
    let pass = args.key.read("Enter passphrase to be deleted: ")?;
    let unlocked = header.unlock(&*dev, &pass, args.key_slot)?;
    if header.active_keyslots().len() == 1 {
        confirm(args.batch, "WARNING!\n========\nThis is the last keyslot. The device will become unusable after purging this key.")?;
    }
    header.kill_keyslot(&*dev, unlocked.slot)?;
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct ChangeKeyArgs {
    #[command(flatten)]
    slot: SlotArgs,
    #[command(flatten)]
    new: NewKeyArgs,
}

pub(crate) fn change_key(args: ChangeKeyArgs) -> Result<(), CliError> {
    let s = &args.slot;
    let (dev, mut header) = s.open()?;
    let pbkdf = pbkdf_options(&s.pbkdf)?;
    let old = s.key.read("Enter passphrase to be changed: ")?;
    let unlocked = header.unlock(&*dev, &old, s.key_slot)?;
    let new = new_passphrase(
        args.new.new_key_file.as_ref(),
        &KeyArgs::default(),
        "Enter new passphrase: ",
    )?;
    header.change_keyslot(&*dev, unlocked.slot, &unlocked.volume_key, &new, &pbkdf)?;
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct KillSlotArgs {
    /// The LUKS device or image file.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The keyslot to wipe.
    #[arg(value_name = "N")]
    slot: usize,
    /// The detached header of DEVICE.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask for confirmation or for a remaining passphrase.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

pub(crate) fn kill_slot(args: KillSlotArgs) -> Result<(), CliError> {
    let dev = open_header(args.header.as_deref().unwrap_or(&args.device), false)?;
    let dev = &*dev;
    let mut header = Header::read(dev)?;
    let active = header.active_keyslots();
    if !active.contains(&args.slot) {
        return Err(CliError::usage(format!(
            "Keyslot {} is not active.",
            args.slot
        )));
    }
    // As cryptsetup: prove knowledge of a passphrase unless in batch mode without a key file.
    if !args.batch || args.key.key_file.is_some() {
        let pass = args.key.read("Enter any remaining passphrase: ")?;
        header.unlock(dev, &pass, None)?;
    }
    if active.len() == 1 {
        confirm(args.batch, "WARNING!\n========\nThis is the last keyslot. The device will become unusable after purging this key.")?;
    }
    header.kill_keyslot(dev, args.slot)?;
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct BackupArgs {
    /// The LUKS device or image file.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// The backup file.
    #[arg(long = "header-backup-file", value_name = "FILE", required = true)]
    file: PathBuf,
    /// The detached header of DEVICE.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

pub(crate) fn header_backup(args: BackupArgs) -> Result<(), CliError> {
    let dev = open_header(args.header.as_deref().unwrap_or(&args.device), true)?;
    let bytes = Header::backup(&*dev)?;
    // Never overwrite: a backup file is the last copy of a header someone may need.
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&args.file)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                CliError::usage(format!(
                    "Requested header backup file {} already exists.",
                    args.file.display()
                ))
            } else {
                CliError::io(format!("cannot create {}", args.file.display()), e)
            }
        })?;
    let written = f.write_all(&bytes).and_then(|_| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&args.file);
        return Err(CliError::io(
            format!("cannot write {}", args.file.display()),
            e,
        ));
    }
    Ok(())
}

pub(crate) fn header_restore(args: BackupArgs) -> Result<(), CliError> {
    let backup = FileStorage::open_read_only(&args.file).map_err(|e| CliError {
        code: Code::Device,
        message: format!("cannot open backup file {}: {e}", args.file.display()),
    })?;
    let dev = open_header(args.header.as_deref().unwrap_or(&args.device), false)?;
    // The backup is checked in full before anything is asked or written.
    Header::read(&backup).map_err(|e| match e {
        sectorcrypt_luks::Error::NotLuks { .. } => CliError::usage(format!(
            "{} is not a LUKS header backup.",
            args.file.display()
        )),
        other => other.into(),
    })?;
    confirm(
        args.batch,
        &format!(
            "WARNING!\n========\nDevice {} will be overwritten with the header in {}.",
            args.device.display(),
            args.file.display()
        ),
    )?;
    Header::restore(&*dev, &backup)?;
    Ok(())
}
