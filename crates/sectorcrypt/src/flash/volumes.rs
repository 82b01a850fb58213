//! The UBI volume commands, with ubi-utils' names: `mkvol`, `rsvol`, `update`, `read` (`rmvol` is one line in `run`).

use std::path::PathBuf;

use sectorcrypt_ubi::media::VolType;
use sectorcrypt_ubi::{AttachOptions, NewVolume};

use super::{with_ubi, write_out, OpenArgs, SizeArgs, VolArgs};
use crate::exit::CliError;

#[derive(clap::Args, Debug)]
pub(crate) struct MkvolArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// The new volume's name.
    #[arg(short = 'N', long = "name", value_name = "NAME")]
    name: String,
    /// Its ID (default: the first free).
    #[arg(short = 'n', long = "vol-id", value_name = "ID")]
    vol_id: Option<u32>,
    #[command(flatten)]
    size: SizeArgs,
    /// dynamic (read-write) or static (written whole, CRC-checked).
    #[arg(short = 't', long = "type", value_name = "TYPE", default_value = "dynamic", value_parser = parse_vol_type)]
    vol_type: VolType,
    /// LEB alignment.
    #[arg(
        short = 'a',
        long = "alignment",
        value_name = "BYTES",
        default_value_t = 1
    )]
    alignment: u32,
    /// Grow over all free space at the next attach.
    #[arg(long)]
    autoresize: bool,
}

fn parse_vol_type(name: &str) -> Result<VolType, String> {
    match name {
        "dynamic" => Ok(VolType::Dynamic),
        "static" => Ok(VolType::Static),
        other => Err(format!("unknown volume type '{other}' (dynamic or static)")),
    }
}

pub(super) fn mkvol(args: MkvolArgs) -> Result<(), CliError> {
    with_ubi(&args.open, |ubi| {
        let info = ubi.info();
        let usable = info.layout.leb_size - info.layout.leb_size % args.alignment.max(1);
        let lebs = args.size.lebs(&info, usable, 0)?;
        let id = ubi.create_volume(&NewVolume {
            id: args.vol_id,
            name: args.name.clone(),
            lebs,
            vol_type: args.vol_type,
            alignment: args.alignment,
            autoresize: args.autoresize,
        })?;
        println!(
            "Volume ID {id}, size {lebs} LEBs ({} bytes), name \"{}\"",
            u64::from(lebs) * u64::from(usable),
            args.name
        );
        Ok(())
    })
}

#[derive(clap::Args, Debug)]
pub(crate) struct RsvolArgs {
    #[command(flatten)]
    vol: VolArgs,
    #[command(flatten)]
    size: SizeArgs,
}

pub(super) fn rsvol(args: RsvolArgs) -> Result<(), CliError> {
    with_ubi(&args.vol.open, |ubi| {
        let v = args.vol.which.find(ubi)?;
        let lebs = args.size.lebs(&ubi.info(), v.usable_leb_size, v.lebs)?;
        Ok(ubi.resize_volume(v.id, lebs)?)
    })
}

#[derive(clap::Args, Debug)]
pub(crate) struct UpdateArgs {
    #[command(flatten)]
    vol: VolArgs,
    /// The new contents.
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

pub(super) fn update(args: UpdateArgs) -> Result<(), CliError> {
    let data = std::fs::read(&args.file)
        .map_err(|e| CliError::io(format!("cannot read {}", args.file.display()), e))?;
    with_ubi(&args.vol.open, |ubi| {
        let v = args.vol.which.find(ubi)?;
        Ok(ubi.update_volume(v.id, &data)?)
    })
}

#[derive(clap::Args, Debug)]
pub(crate) struct ReadArgs {
    #[command(flatten)]
    vol: VolArgs,
    /// Where to write the contents ('-' = standard output).
    #[arg(value_name = "FILE")]
    out: PathBuf,
}

pub(super) fn read(args: ReadArgs) -> Result<(), CliError> {
    let (_, opened) = args.vol.open.unlock(true)?;
    let ubi = opened.attach(&AttachOptions {
        read_only: true,
        ..AttachOptions::default()
    })?;
    let v = args.vol.which.find(&ubi)?;
    let usable = v.usable_leb_size as usize;
    let mut data = vec![0u8; v.data_bytes as usize];
    for (lnum, chunk) in data.chunks_mut(usable).enumerate() {
        ubi.read(v.id, lnum as u32, 0, chunk)?;
    }
    write_out(&args.out, &data)
}
