//! `reencrypt`: a new volume key (and optionally cipher, key size, sector size) in place, header on the device or detached.

use std::path::PathBuf;

use sectorcrypt_luks::luks2::reencrypt::Mode;
use sectorcrypt_storage::Storage;
use sectorcrypt_volume::convert::{self, read_luks2};

use sectorcrypt_luks::luks2::Header as Luks2Header;

use super::{
    ask_server, device_len, init_options, records_conversion, resume_hint, run_conversion,
    stop_on_signals, RunArgs,
};
use crate::exit::CliError;
use crate::keyslots::{confirm, open_rw, pbkdf_options};
use crate::pbkdf_args::PbkdfArgs;

#[derive(clap::Args, Debug)]
pub(crate) struct ReencryptArgs {
    /// The LUKS2 device or image file whose volume key to replace.
    #[arg(value_name = "DEVICE")]
    pub(super) device: PathBuf,
    /// Its detached header, if it has one.
    #[arg(long, value_name = "FILE")]
    pub(super) header: Option<PathBuf>,
    /// New cipher specification (default: the current one).
    #[arg(short = 'c', long, value_name = "SPEC")]
    pub(super) cipher: Option<String>,
    /// New whole key size in bits (default: the current one, or the new cipher's default).
    #[arg(short = 's', long = "key-size", value_name = "BITS")]
    pub(super) key_size: Option<usize>,
    /// New encryption sector size (default: the current one).
    #[arg(long = "sector-size", value_name = "BYTES")]
    pub(super) sector_size: Option<u32>,
    #[command(flatten)]
    pub(super) pbkdf: PbkdfArgs,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

/// `reencrypt`: a new volume key for the data (key rotation), optionally a new cipher or sector
/// size, in place, resumably. The data does not move, so a header on the device itself works
/// too. A device that a sectorcrypt process serves is converted by that process, online.
pub(crate) fn reencrypt(args: ReencryptArgs) -> Result<(), CliError> {
    let header_path = args.header.clone().unwrap_or_else(|| args.device.clone());
    if let Some(server) = crate::online::server_of(&args.device) {
        let warning = (!args.run.resume_only && !records_conversion(&header_path)).then(|| {
            format!(
                "WARNING!\n========\nThis will re-encrypt {} with a new volume key while it \
                 is served; the passphrase given keeps working, the other keyslots are removed \
                 at the end.",
                args.device.display()
            )
        });
        return ask_server(server, &args.device, &header_path, &args.run, warning);
    }
    let data = open_rw(&args.device)?;
    let header = open_rw(&header_path)?;
    let stop = stop_on_signals()?;
    let h = read_luks2(&header)?;
    let name = header_path.display().to_string();
    let in_progress = convert::resuming(&h, &name, Mode::Reencrypt, args.run.resume_only)?;
    let (pass, token) = args.run.passphrase(&args.device, Some((&header, &h)))?;
    if !in_progress {
        start(&args, &header, &h, &data, (&pass, token), &|others| {
            confirm(
                args.run.batch,
                &format!(
                    "WARNING!\n========\nThis will re-encrypt {} with a new volume key; the \
                     passphrase given keeps working, the {others} other keyslot(s) are removed \
                     at the end.",
                    args.device.display()
                ),
            )
        })?;
    }
    let resume = resume_hint("reencrypt", &args.device, args.header.as_deref());
    run_conversion(&resume, &header_path, &data, &pass, &args.run, &stop)
}

/// Record a new reencryption of `data` in `header` (read as `h`), once the passphrase (and the
/// token that released it, which then names the new keyslot too) opens it and `confirm` (told
/// how many other keyslots go) agrees.
pub(super) fn start(
    args: &ReencryptArgs,
    header: &dyn Storage,
    h: &Luks2Header,
    data: &dyn Storage,
    (pass, token): (&[u8], Option<u32>),
    confirm: &dyn Fn(usize) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let data_len = device_len(data)?;
    let offset = h.data_segment()?.offset;
    convert::check_size(&data.name(), data_len.saturating_sub(offset))?;
    let old = h.unlock(header, pass, None)?;
    // Run by the server for a client that unlocked by a token (its options are in the argv the
    // client sent), the token is the one that names the keyslot the passphrase opens.
    let token = token.or_else(|| {
        args.run
            .tokens_asked()
            .then(|| {
                h.metadata().tokens.iter().find_map(|(n, t)| {
                    let names = t.get("keyslots")?.as_array()?;
                    names
                        .iter()
                        .any(|s| s.as_str() == Some(&old.slot.to_string()))
                        .then_some(n)
                })
            })
            .flatten()
    });
    let pbkdf = pbkdf_options(&args.pbkdf)?.luks2()?;
    let new = convert::plan_reencryption(
        h,
        args.cipher.as_deref(),
        args.key_size,
        args.sector_size,
        old.volume_key.len(),
    )?;
    confirm(h.metadata().keyslots.iter().count().saturating_sub(1))?;
    convert::start_reencryption(
        header,
        h,
        &old.volume_key,
        pass,
        token,
        &new,
        &pbkdf,
        &init_options(&args.pbkdf, &args.run)?,
    )?;
    Ok(())
}
