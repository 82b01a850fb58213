//! `format` (cryptsetup luksFormat): a new LUKS2 or LUKS1 header on a device, or in a detached header file (made with mode 0600 if missing).
//!
//! Everything that can be refused (options, passphrases, the volume key file) is refused before the device is touched.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use sectorcrypt_luks::FormatOptions;
use sectorcrypt_storage::{FileStorage, Storage};

use crate::exit::{open_failed, CliError, Code};
use crate::keyfile::KeyArgs;
use crate::keyslots::{confirm, new_passphrase, open_rw, pbkdf_options};
use crate::pbkdf_args::{CipherArgs, NewKeyArgs, PbkdfArgs};

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
    /// Authenticated encryption (dm-integrity's format, as cryptsetup's `--integrity`):
    /// hmac-sha256, hmac-sha512 or hmac-sha1 (with aes-xts-plain64), aead (with
    /// --cipher aes-gcm-random, or aegis128-random and --key-size 128) or poly1305 (with
    /// --cipher chacha20-random); none: no integrity (as cryptsetup).
    #[arg(long, value_name = "MODE")]
    integrity: Option<String>,
    /// With --integrity: leave the data unwritten (every sector then fails its check until
    /// written) instead of writing zeros over all of it.
    #[arg(long = "integrity-no-wipe", requires = "integrity")]
    integrity_no_wipe: bool,
    /// With --integrity: pad the tag areas to 128 KiB as kernels before 5.4 need (cryptsetup's
    /// option of that name), not to 4 KiB.
    #[arg(long = "integrity-legacy-padding", requires = "integrity")]
    integrity_legacy_padding: bool,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

/// cryptsetup's `--integrity` names: the type the LUKS2 segment stores and the MAC key's bytes
/// (after the cipher's key in the volume key).
fn integrity_type(name: &str) -> Result<(&'static str, usize), CliError> {
    match name {
        "hmac-sha256" => Ok(("hmac(sha256)", 32)),
        "hmac-sha512" => Ok(("hmac(sha512)", 64)),
        "hmac-sha1" => Ok(("hmac(sha1)", 20)),
        "aead" => Ok(("aead", 0)),
        "poly1305" => Ok(("poly1305", 0)),
        other => Err(CliError::usage(format!(
            "--integrity {other}: use hmac-sha256, hmac-sha512, hmac-sha1, aead, poly1305 or none"
        ))),
    }
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
    let data: std::sync::Arc<dyn Storage> = std::sync::Arc::from(open_rw(&args.device)?);
    if args.new.new_key_file.is_some() && args.key.key_file.is_some() {
        return Err(CliError::usage(
            "give the passphrase either as --key-file or as the key file argument, not both",
        ));
    }
    let pbkdf = pbkdf_options(&args.pbkdf)?;
    let volume_key = match &args.volume_key_file {
        Some(path) => Some(crate::keyfile::read_volume_key_file(path)?),
        None => None,
    };
    let integrity = match &args.integrity {
        Some(name) => integrity_options(&args, name)?,
        None => None,
    };
    let options = FormatOptions {
        version,
        cipher: args.segment.cipher.clone(),
        key_bits: integrity
            .as_ref()
            .map_or(args.segment.key_size, |i| Some(i.key_bits)),
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
        integrity: integrity.as_ref().map(|i| i.kind.to_string()),
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
    let (header, unlocked) = sectorcrypt_luks::format(
        target,
        data.len().map_err(|e| CliError::usage(e.to_string()))?,
        &options,
        &pass,
    )?;
    drop(pass);
    if let (Some(integrity), sectorcrypt_luks::Header::Luks2(header)) = (&integrity, &header) {
        format_integrity(&args, header, &data, &unlocked.volume_key, integrity)?;
    }
    Ok(())
}

/// What `--integrity` asks of the header.
struct Integrity {
    /// The segment's integrity type.
    kind: &'static str,
    /// The whole volume key (cipher and MAC) in bits.
    key_bits: usize,
}

/// The header's part of `--integrity NAME`, checked against the cipher before anything is
/// written: the cipher's key (`--key-size`, default 512 bits for XTS and 256 otherwise, as
/// cryptsetup) and the MAC's. `none` is no integrity, as cryptsetup takes it.
fn integrity_options(args: &FormatArgs, name: &str) -> Result<Option<Integrity>, CliError> {
    if args.luks_version != 2 {
        return Err(CliError::usage("--integrity needs LUKS2 (--type luks2)"));
    }
    if name == "none" {
        return Ok(None);
    }
    let (kind, mac_bytes) = integrity_type(name)?;
    let cipher = args.segment.cipher.as_deref().unwrap_or("aes-xts-plain64");
    let cipher_bits = args
        .segment
        .key_size
        .unwrap_or(if cipher.contains("-xts-") { 512 } else { 256 });
    let key_bits = cipher_bits + mac_bytes * 8;
    let sector = args.segment.sector_size.unwrap_or(512);
    sectorcrypt_integrity::Mode::new(cipher, kind, &vec![0; key_bits / 8], sector)
        .map_err(|e| CliError::usage(format!("--integrity {name} with {cipher}: {e}")))?;
    Ok(Some(Integrity { kind, key_bits }))
}

/// The dm-integrity device at the data offset, as the kernel formats it, then (unless
/// `--integrity-no-wipe`) zeros written over every sector, so that each has a valid tag.
fn format_integrity(
    args: &FormatArgs,
    header: &sectorcrypt_luks::luks2::Header,
    data: &std::sync::Arc<dyn Storage>,
    volume_key: &[u8],
    integrity: &Integrity,
) -> Result<(), CliError> {
    use sectorcrypt_integrity::{format, IntegrityDevice, Mode};
    let segment = header.integrity_segment()?;
    let failed = |e: sectorcrypt_integrity::Error| {
        CliError::usage(format!("{}: {e}", args.device.display()))
    };
    let mode = Mode::new(
        &segment.cipher,
        integrity.kind,
        volume_key,
        segment.sector_size as usize,
    )
    .map_err(failed)?;
    let len = data
        .len()
        .map_err(|e| CliError::io("cannot size the device", e))?;
    let sb = format::plan(
        len,
        segment.offset,
        mode.tag_size() as u16,
        segment.sector_size as usize,
        args.integrity_legacy_padding,
    )
    .map_err(failed)?;
    format::format(&**data, segment.offset, &sb).map_err(failed)?;
    if args.integrity_no_wipe {
        return Ok(());
    }
    let device = IntegrityDevice::open(std::sync::Arc::clone(data), segment.offset, mode, false)
        .map_err(failed)?;
    let bar = crate::progress::terminal_bar(
        "wiping to initialize integrity tags [{bar:40}] {percent}% {eta}",
    );
    device
        .wipe(&mut |done, total| {
            if let Some(bar) = &bar {
                bar.set_length(total);
                bar.set_position(done);
            }
        })
        .map_err(failed)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
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
    // A header device of fixed size stays as it is: format says if it is too small.
    match file.grow(size) {
        Err(e) if e.kind() != std::io::ErrorKind::Unsupported => Err(CliError::io(
            format!("cannot size header file {}", path.display()),
            e,
        )),
        _ => Ok(file),
    }
}
