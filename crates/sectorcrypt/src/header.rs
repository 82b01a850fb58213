//! Commands that read a LUKS header: `dump` (luksDump), `is-luks` (isLuks), `uuid` (luksUUID)
//! and `test-passphrase`.

use std::io::Write;
use std::path::{Path, PathBuf};

use sectorcrypt_luks::luks2::metadata::SegmentEntry;
use sectorcrypt_luks::Header;
use sectorcrypt_storage::Storage;

use crate::chip::open_header;
use crate::exit::{CliError, Code};
use crate::keyfile::KeyArgs;
use crate::keyslots::confirm;
use crate::unlock::{unlock, TokenArgs, Tokens};

/// A device, or a detached header beside it.
#[derive(clap::Args, Debug)]
pub(crate) struct DeviceArgs {
    /// The LUKS device or image file, or an encrypted flash.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Read the header from this detached header file instead of DEVICE.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
}

impl DeviceArgs {
    fn header_path(&self) -> &Path {
        self.header.as_deref().unwrap_or(&self.device)
    }

    /// Open the header device read-only and read its header.
    fn read(&self) -> Result<(Box<dyn Storage>, Header), CliError> {
        let dev = open_header(self.header_path(), true)?;
        let header = Header::read(&*dev)?;
        Ok((dev, header))
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct DumpArgs {
    #[command(flatten)]
    target: DeviceArgs,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// Also print the volume key (needs a passphrase).
    #[arg(long = "dump-volume-key", alias = "dump-master-key")]
    dump_volume_key: bool,
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    tokens: TokenArgs,
    /// With --unbound, the unbound keyslot whose key to print; otherwise accepted and ignored,
    /// as by `cryptsetup luksDump` (the volume key comes from any keyslot bound to the data).
    #[arg(short = 'S', long = "key-slot", value_name = "N")]
    key_slot: Option<usize>,
    /// Print the key of the unbound keyslot --key-slot N (LUKS2; needs its passphrase).
    #[arg(long, requires = "key_slot", conflicts_with = "dump_volume_key")]
    unbound: bool,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

pub(crate) fn dump(args: DumpArgs) -> Result<(), CliError> {
    let (dev, header) = args.target.read()?;
    let mut out = std::io::stdout().lock();
    let text = if args.unbound {
        unbound_key_text(&args, &*dev, &header)?
    } else if args.dump_volume_key {
        // cryptsetup asks before printing a volume key on a terminal; so do we.
        confirm(
            args.batch,
            "The header dump with the volume key is sensitive information that allows access \
             to the encrypted partition without a passphrase.",
        )?;
        // cryptsetup reads the key from any slot (`CRYPT_ANY_SLOT`, whatever `-S` says) and,
        // since printing a key activates nothing, checks no conversion metadata.
        let _ = args.key_slot;
        let (unlocked, _) = unlock(
            &args.key,
            &args.tokens,
            Tokens::WhenAsked,
            &header,
            &args.target.device,
            None,
            |pass, slot| header.unlock(&*dev, pass, slot),
        )?;
        let key_hex = hex::encode(&unlocked.volume_key[..]);
        if args.json {
            let v = serde_json::json!({
                "device": args.target.device.display().to_string(),
                "version": header.version(),
                "uuid": header.uuid(),
                "keyslot": unlocked.slot,
                "volume_key_bits": unlocked.volume_key.len() * 8,
                "volume_key": key_hex,
            });
            format!("{v}\n")
        } else {
            let (name, mode, payload) = cipher_and_payload(&header);
            let mut s = format!(
                "LUKS header information for {}\nCipher name:   \t{name}\nCipher mode:   \t{mode}\n\
                 Payload offset:\t{payload}\nUUID:          \t{}\nMK bits:       \t{}\nMK dump:\t",
                args.target.device.display(),
                header.uuid(),
                unlocked.volume_key.len() * 8
            );
            s += &hex_lines(&unlocked.volume_key, "\t\t");
            s
        }
    } else if args.json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&header.dump_json()).expect("serializable")
        )
    } else {
        header.dump_text(&args.target.device.display().to_string())
    };
    out.write_all(text.as_bytes())
        .map_err(|e| CliError::io("cannot write the output", e))
}

/// `key` as cryptsetup prints keys: 16 bytes a line, each `xx `, lines after the first indented.
fn hex_lines(key: &[u8], indent: &str) -> String {
    let mut s = String::new();
    for (i, line) in key.chunks(16).enumerate() {
        if i > 0 {
            s += indent;
        }
        for b in line {
            s += &format!("{b:02x} ");
        }
        s += "\n";
    }
    s
}

/// `dump --unbound -S N` (`cryptsetup luksDump --unbound`): the key of an unbound keyslot, in
/// cryptsetup's lines, or `--json` as `{"keyslot": N, "key_bits": ..., "key": "<hex>"}`.
fn unbound_key_text(
    args: &DumpArgs,
    dev: &dyn Storage,
    header: &Header,
) -> Result<String, CliError> {
    let Header::Luks2(h) = header else {
        return Err(CliError::usage(
            "unbound keyslots are a LUKS2 feature; this is a LUKS1 volume",
        ));
    };
    let slot = args.key_slot.unwrap_or_default();
    let unbound = u32::try_from(slot)
        .ok()
        .and_then(|s| h.metadata().digest_of_keyslot(s));
    if !unbound.is_some_and(|(_, d)| d.segments().is_empty()) {
        return Err(CliError::usage(format!(
            "Keyslot {slot} does not contain unbound key."
        )));
    }
    confirm(
        args.batch,
        "The header dump with the unbound key is sensitive information.",
    )?;
    let pass = args.key.read(&format!(
        "Enter passphrase for {}: ",
        args.target.device.display()
    ))?;
    let unlocked = h.unlock_in(dev, &pass, args.key_slot, true)?;
    let key = &unlocked.volume_key;
    if args.json {
        let v = serde_json::json!({
            "device": args.target.device.display().to_string(),
            "uuid": header.uuid(),
            "keyslot": unlocked.slot,
            "key_bits": key.len() * 8,
            "key": hex::encode(&key[..]),
        });
        return Ok(format!("{v}\n"));
    }
    Ok(format!(
        "LUKS header information for {}\nUUID:    \t{}\nKeyslot: \t{}\nKey bits:\t{}\nUnbound Key:\t{}",
        args.target.device.display(),
        header.uuid(),
        unlocked.slot,
        key.len() * 8,
        hex_lines(key, "\t\t")
    ))
}

/// What `cryptsetup luksDump --dump-volume-key` prints before the UUID: the data cipher's name
/// and mode (LUKS2: of its first segment, split at the first `-`; a plaintext segment is
/// `cipher_null-ecb`) and where the data starts, in 512-byte sectors.
fn cipher_and_payload(header: &Header) -> (String, String, u64) {
    let (spec, offset) = match header {
        Header::Luks1(h) => {
            return (
                h.cipher_name.clone(),
                h.cipher_mode.clone(),
                u64::from(h.payload_offset),
            )
        }
        Header::Luks2(h) => match h.metadata().segments.get(0) {
            Some(SegmentEntry::Crypt(c)) => (c.encryption.as_str(), c.offset),
            Some(SegmentEntry::Linear(l)) => ("cipher_null-ecb", l.offset),
            _ => ("", 0),
        },
    };
    let (name, mode) = spec.split_once('-').unwrap_or((spec, ""));
    (name.to_string(), mode.to_string(), offset / 512)
}

/// `is-luks`: exit 0 for a LUKS header, 1 for anything else, 4 for a missing device (as
/// cryptsetup isLuks; a yes/no question, so "not LUKS" is the answer 1, not an error 4).
pub(crate) fn is_luks(args: DeviceArgs, verbose: bool) -> Result<(), CliError> {
    let path = args.header_path();
    let not_luks = |e: CliError| {
        Err(CliError {
            code: Code::Usage,
            message: if verbose { e.message } else { String::new() },
        })
    };
    let dev = match open_header(path, true) {
        Ok(dev) => dev,
        // A flash device without an encrypted-flash header is an answer, not an error.
        Err(e) if e.code == Code::Device && path.exists() => return not_luks(e),
        Err(e) => return Err(e),
    };
    match Header::read(&*dev) {
        Ok(_) => Ok(()),
        Err(e) => not_luks(e.into()),
    }
}

pub(crate) fn uuid(args: DeviceArgs) -> Result<(), CliError> {
    let (_, header) = args.read()?;
    println!("{}", header.uuid());
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct TestArgs {
    #[command(flatten)]
    target: DeviceArgs,
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    tokens: TokenArgs,
    /// Only try this keyslot (it may be unbound, as with cryptsetup's `open --test-passphrase`).
    #[arg(short = 'S', long = "key-slot", value_name = "N")]
    key_slot: Option<usize>,
    /// Also try keyslots bound to no segment (`add-key --unbound`), as cryptsetup's `--unbound`.
    #[arg(long)]
    unbound: bool,
}

/// `test-passphrase`: exit 0 if the passphrase opens a keyslot, 2 if not; checked as
/// `cryptsetup open --test-passphrase` checks before it would activate (during an in-place
/// conversion, the old and new keys and the conversion metadata's digest too).
pub(crate) fn test_passphrase(args: TestArgs) -> Result<(), CliError> {
    let (dev, header) = args.target.read()?;
    let unbound = args.unbound || args.key_slot.is_some();
    let (unlocked, _) = unlock(
        &args.key,
        &args.tokens,
        Tokens::ByDefault,
        &header,
        &args.target.device,
        args.key_slot,
        |pass, slot| header.unlock_checked(&*dev, pass, slot, unbound),
    )?;
    eprintln!("Key slot {} unlocked.", unlocked.slot);
    Ok(())
}
