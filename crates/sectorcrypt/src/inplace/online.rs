//! The server's side of an online conversion (`crate::online`): the client's command line parsed
//! again, its paths taken from the client's working directory, checked against what is served,
//! and the conversion started on the server's own devices (the client asked and confirmed).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sectorcrypt_luks::luks2::reencrypt::{InitOptions, Mode};
use sectorcrypt_storage::Storage;
use sectorcrypt_volume::convert::{self, read_luks2, ExportPlan};
use sectorcrypt_volume::reencrypt::{self, DEFAULT_HOTZONE};
use sectorcrypt_volume::resilience;

use super::{directory_of, resume_hint, DecryptArgs, EncryptArgs, ReencryptArgs, RunArgs};
use crate::exit::CliError;
use crate::keyslots::open_rw;
use crate::online::{same_file, Conversion, Served};

/// A conversion a client asked a server for.
pub(crate) enum Asked {
    Reencrypt(Box<ReencryptArgs>),
    Encrypt(Box<EncryptArgs>),
    Decrypt(Box<DecryptArgs>),
    /// Not a conversion: the size the volume exposes.
    Resize(crate::resize::ResizeArgs),
}

impl Asked {
    /// The command line `argv`, run in `cwd`.
    pub(crate) fn parse(argv: &[String], cwd: &Path) -> Result<Asked, CliError> {
        let first_line = |e: clap::Error| {
            let text = e.to_string();
            CliError::usage(text.lines().next().unwrap_or_default().to_string())
        };
        let matches = crate::command()
            .try_get_matches_from(argv)
            .map_err(first_line)?;
        let cli =
            <crate::Cli as clap::FromArgMatches>::from_arg_matches(&matches).map_err(first_line)?;
        let mut asked = match cli.command {
            crate::Command::Reencrypt(a) => Asked::Reencrypt(a),
            crate::Command::Encrypt(a) => Asked::Encrypt(a),
            crate::Command::Decrypt(a) => Asked::Decrypt(a),
            crate::Command::Resize(a) => Asked::Resize(a),
            _ => {
                return Err(CliError::usage(
                    "a server runs reencrypt, encrypt, decrypt and resize only",
                ))
            }
        };
        let (device, header) = match &mut asked {
            Asked::Reencrypt(a) => (&mut a.device, &mut a.header),
            Asked::Encrypt(a) => (&mut a.device, &mut a.header),
            Asked::Decrypt(a) => (&mut a.device, &mut a.header),
            Asked::Resize(a) => (&mut a.device, &mut a.header),
        };
        // Relative names are the client's; RBD images have no directory.
        for path in std::iter::once(device).chain(header) {
            if !crate::device::is_rbd(path) {
                *path = cwd.join(&*path);
            }
        }
        Ok(asked)
    }

    fn run(&self) -> Option<&RunArgs> {
        match self {
            Asked::Reencrypt(a) => Some(&a.run),
            Asked::Encrypt(a) => Some(&a.run),
            Asked::Decrypt(a) => Some(&a.run),
            Asked::Resize(_) => None,
        }
    }

    /// For a resize: the size asked for (`None` inside: all the data).
    pub(crate) fn resize_to(&self) -> Option<Result<Option<u64>, CliError>> {
        match self {
            Asked::Resize(a) => Some(a.bytes()),
            _ => None,
        }
    }

    /// The device named.
    pub(crate) fn device(&self) -> &Path {
        match self {
            Asked::Reencrypt(a) => &a.device,
            Asked::Encrypt(a) => &a.device,
            Asked::Decrypt(a) => &a.device,
            Asked::Resize(a) => &a.device,
        }
    }

    fn header(&self) -> Option<&Path> {
        match self {
            Asked::Reencrypt(a) => a.header.as_deref(),
            Asked::Encrypt(a) => a.header.as_deref(),
            Asked::Decrypt(a) => a.header.as_deref(),
            Asked::Resize(a) => a.header.as_deref(),
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            Asked::Reencrypt(_) => "reencrypt",
            Asked::Encrypt(_) => "encrypt",
            Asked::Decrypt(_) => "decrypt",
            Asked::Resize(_) => "resize",
        }
    }

    pub(crate) fn resume_only(&self) -> bool {
        self.run().is_some_and(|r| r.resume_only)
    }

    pub(crate) fn init_only(&self) -> bool {
        self.run().is_some_and(|r| r.init_only)
    }

    /// Check the request against what `served` serves and start the conversion on its devices
    /// if it is new (`pass` opens the header: checked before anything is written).
    pub(crate) fn prepare_online(
        &self,
        served: &Served,
        pass: &[u8],
    ) -> Result<Conversion, CliError> {
        let Some(run) = self.run() else {
            return Err(CliError::usage("not a conversion"));
        };
        let device = self.device();
        let header_dev = match (self, self.header(), served.header.as_deref()) {
            // A decryption of a volume whose header is on the device: the header is exported
            // to the new file named, and the data moved (under no request: see below).
            (Asked::Decrypt(a), Some(new_file), None) => {
                return export_and_decrypt(a, new_file, served, pass)
            }
            (_, Some(asked), Some(served_header)) if same_file(asked, served_header) => {
                Arc::clone(&served.header_dev)
            }
            (_, None, None) => Arc::clone(&served.header_dev),
            (_, _, Some(served_header)) => {
                return Err(CliError::usage(format!(
                    "{} is served with its header in {}: give --header {}",
                    served.device.display(),
                    served_header.display(),
                    served_header.display()
                )))
            }
            (_, Some(_), None) => {
                return Err(CliError::usage(format!(
                    "{} is served with its header on it: give no --header",
                    served.device.display()
                )))
            }
        };
        let h = read_luks2(&*header_dev)?;
        let name = self.header().unwrap_or(device).display().to_string();
        match self {
            Asked::Resize(_) => return Err(CliError::usage("not a conversion")),
            Asked::Reencrypt(a) => {
                if !convert::resuming(&h, &name, Mode::Reencrypt, run.resume_only)? {
                    super::reencrypt::start(
                        a,
                        &*header_dev,
                        &h,
                        &*served.data,
                        (pass, None),
                        &|_| Ok(()),
                    )?;
                }
            }
            Asked::Encrypt(_) => {
                convert::resuming(&h, &name, Mode::Encrypt, true)?;
            }
            Asked::Decrypt(a) => {
                if !convert::resuming(&h, &name, Mode::Decrypt, run.resume_only)? {
                    let path = self.header().unwrap_or(device);
                    super::decrypt::start_detached(a, &*header_dev, &h, path, pass, &|| Ok(()))?;
                }
            }
        }
        Ok(conversion(header_dev, self, run, served))
    }
}

/// How the server runs what `asked` asks, from `header_dev`.
fn conversion(
    header_dev: Arc<dyn Storage>,
    asked: &Asked,
    run: &RunArgs,
    served: &Served,
) -> Conversion {
    Conversion {
        header_dev,
        hotzone: run.hotzone_size.unwrap_or(DEFAULT_HOTZONE),
        threads: run.threads.map_or(served.threads, |n| n as usize),
        max_rate: run.max_rate,
        resume: resume_hint(asked.verb(), &served.device, asked.header()),
    }
}

/// `decrypt --header NEWFILE` of a served volume whose header is on the device: the header goes
/// to NEWFILE and the first chunk is copied to offset 0 while no request runs (one landing
/// between the copy and the header write would be lost), and requests are routed by the exported
/// header from then on.
fn export_and_decrypt(
    args: &DecryptArgs,
    new_file: &Path,
    served: &Served,
    pass: &[u8],
) -> Result<Conversion, CliError> {
    let init = InitOptions {
        resilience: resilience::exported_decryption(args.run.resilience)?,
        ..InitOptions::default()
    };
    let (dir, name) = directory_of(new_file)?;
    let plan = convert::plan_exported_decryption(&*served.data, &dir, &name, args.run.resume_only)?;
    if let ExportPlan::Fresh(h) = &plan {
        h.unlock(&*served.data, pass, None)?;
    }
    let moved = args.run.hotzone_size.unwrap_or(DEFAULT_HOTZONE);
    let mut exported: Option<Arc<dyn Storage>> = None;
    served.volume.reroute_after(|| {
        convert::start_exported_decryption(&*served.data, &dir, &name, &plan, pass, moved, &init)?;
        let file = open_rw(&PathBuf::from(new_file))
            .map_err(|e| sectorcrypt_volume::Error::Refused(e.message))?;
        let file: Arc<dyn Storage> = Arc::from(file);
        let converting = reencrypt::converting(&*file, &*served.data, pass)?;
        let header = sectorcrypt_luks::luks2::Header::read(&*file)?;
        exported = Some(file);
        Ok((header, converting.old_key, converting.new_key))
    })?;
    let header_dev = exported.ok_or_else(|| CliError::usage("the header was not exported"))?;
    Ok(Conversion {
        header_dev,
        hotzone: DEFAULT_HOTZONE,
        threads: args.run.threads.map_or(served.threads, |n| n as usize),
        max_rate: args.run.max_rate,
        resume: resume_hint("decrypt", &served.device, Some(new_file)),
    })
}
