//! UBI images in and out: `flash import` (ubiformat -f of a ubinize image) and `flash export` (what UBI sees, or the raw chip as nanddump reads it).

use std::path::PathBuf;
use std::sync::Arc;

use sectorcrypt_flash::dump::Layout;
use sectorcrypt_flash::Flash;
use sectorcrypt_ubi::AttachOptions;

use super::format::create_image;
use super::{write_out, GeometryArgs, OpenArgs};
use crate::chip::require_chip;
use crate::exit::{CliError, Code};
use crate::keyslots::confirm;

#[derive(clap::Args, Debug)]
pub(crate) struct ImportArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// The UBI image (from ubinize, made for this flash's geometry).
    #[arg(value_name = "IMAGE")]
    image: PathBuf,
    /// The shape of a new NAND image, when DEVICE does not exist yet (the UBI is then plain).
    #[command(flatten)]
    geometry: GeometryArgs,
    /// The VID header offset the image was made with (ubinize -O).
    #[arg(short = 'O', long = "vid-hdr-offset", value_name = "BYTES")]
    vid_hdr_offset: Option<u32>,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

/// `import`: onto an encrypted flash through the encryption layer (the passphrase is asked),
/// onto a plain flash as it is (as `ubiformat -f` would; `flash convert` encrypts it later), or
/// onto a new plain NAND image made with the geometry options.
pub(super) fn import(args: ImportArgs) -> Result<(), CliError> {
    let image = std::fs::read(&args.image)
        .map_err(|e| CliError::io(format!("cannot read {}", args.image.display()), e))?;
    let device = &args.open.device;
    let (target, opened): (Arc<dyn Flash>, _) = if crate::chip::exists(device) {
        if args.geometry.given() {
            return Err(CliError {
                code: Code::Busy,
                message: format!(
                    "{} exists: its geometry is its own (the geometry options make a new image)",
                    device.display()
                ),
            });
        }
        let chip = require_chip(device, false)?;
        if sectorcrypt_flashvol::read_header(chip.flash()).is_ok() {
            let (_, opened) = args.open.unlock(false)?;
            (Arc::clone(&opened.crypt) as Arc<dyn Flash>, Some(opened))
        } else {
            (chip.flash(), None)
        }
    } else {
        (
            create_image(device, &args.geometry.geometry()?)?.flash(),
            None,
        )
    };
    confirm(
        args.batch,
        &format!(
            "WARNING!\n========\nThis will replace everything on {} with {}.",
            device.display(),
            args.image.display()
        ),
    )?;
    let done = sectorcrypt_ubi::flash_image(&*target, &image, args.vid_hdr_offset)?;
    let attach = AttachOptions {
        vid_hdr_offset: args.vid_hdr_offset,
        ..AttachOptions::default()
    };
    // Attach once through the layer, as the kernel would at first boot (auto-resize, volume
    // table checks); a plain image is left as ubiformat leaves it, its auto-resize pending, so
    // that flash convert still has room for a header.
    if let Some(opened) = opened {
        drop(opened.attach(&attach)?);
        opened.detach()?;
    }
    eprintln!(
        "{} eraseblocks of the image written, {} more formatted, {} bad",
        done.image_pebs, done.formatted_pebs, done.bad_pebs
    );
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// The dump to write.
    #[arg(value_name = "FILE")]
    out: PathBuf,
    /// The chip as it is, ciphertext and all, every eraseblock (no passphrase needed): what
    /// nanddump would read off the device, usable later as DEVICE `nanddump:FILE`.
    #[arg(long)]
    raw: bool,
    /// With --raw: each page followed by its spare area (nanddump --oob).
    #[arg(long, requires = "raw")]
    oob: bool,
}

pub(super) fn export(args: ExportArgs) -> Result<(), CliError> {
    if args.raw {
        let chip = require_chip(&args.open.device, true)?;
        return write_out(
            &args.out,
            &sectorcrypt_flash::dump::write(
                &*chip.flash(),
                if args.oob {
                    Layout::WithOob
                } else {
                    Layout::DataOnly
                },
            )?,
        );
    }
    let (_, opened) = args.open.unlock(true)?;
    let crypt = &opened.crypt;
    let g = crypt.geometry();
    let mut dump = vec![0xFFu8; g.size() as usize];
    for (peb, block) in dump.chunks_mut(g.peb_size as usize).enumerate() {
        let peb = peb as u32;
        if !crypt.is_bad(peb)? {
            match crypt.read(peb, 0, block) {
                Ok(_) | Err(sectorcrypt_flash::Error::Uncorrectable { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    write_out(&args.out, &dump)
}
