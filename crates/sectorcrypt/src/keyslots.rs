//! The keyslot commands: `add-key` (luksAddKey), `remove-key` (luksRemoveKey), `change-key`
//! (luksChangeKey), `kill-slot` (luksKillSlot); and what every header writer shares (opening for
//! writing, confirmation, new passphrases, PBKDF options). `format` and the header backups have
//! their own modules.
//!
//! Each reads and checks everything it needs (passphrases, key files, the header) before the
//! first write, so a refused command leaves the device byte for byte as it was; the LUKS layer
//! orders its own writes so that a crash leaves the old or the new state.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use sectorcrypt_luks::{Header, PbkdfOptions};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::{FileStorage, Storage};
use subtle::ConstantTimeEq;

use crate::chip::open_header;
use crate::exit::{open_failed, CliError};
use crate::keyfile::KeyArgs;
use crate::pbkdf_args::{NewKeyArgs, PbkdfArgs};
use crate::unlock::{unlock, TokenArgs, Tokens};

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
) -> Result<SecretBytes, CliError> {
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
        if !bool::from(first[..].ct_eq(&again[..])) {
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
    #[command(flatten)]
    tokens: TokenArgs,
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
    let (unlocked, _) = unlock(
        &s.key,
        &args.tokens,
        Tokens::WhenAsked,
        &header,
        &s.device,
        None,
        |pass, slot| header.unlock(&*dev, pass, slot),
    )?;
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
        (Some(path), _) => crate::keyfile::read_volume_key_file(path)?,
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
    #[command(flatten)]
    tokens: TokenArgs,
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
    // As cryptsetup: prove knowledge of a passphrase (or hold a token) unless in batch mode
    // without a key file.
    if !args.batch || args.key.key_file.is_some() || args.tokens.asked_for() {
        unlock(
            &args.key,
            &args.tokens,
            Tokens::WhenAsked,
            &header,
            &args.device,
            None,
            |pass, slot| header.unlock(dev, pass, slot),
        )?;
    }
    if active.len() == 1 {
        confirm(args.batch, "WARNING!\n========\nThis is the last keyslot. The device will become unusable after purging this key.")?;
    }
    header.kill_keyslot(dev, args.slot)?;
    Ok(())
}
