//! `mount`: unlock a volume and expose it as the regular file `MOUNTPOINT/volume` through FUSE,
//! in the foreground until it is unmounted (`fusermount3 -u`) or SIGINT/SIGTERM arrives.

use std::path::PathBuf;

use sectorcrypt_fuse::{Error as FuseError, MountFile, MountOptions, Stop, Unmounted};

use crate::exit::{CliError, Code};
use crate::open::VolumeArgs;

#[derive(clap::Args, Debug)]
pub(crate) struct MountArgs {
    #[command(flatten)]
    pub volume: VolumeArgs,
    /// An empty directory; the decrypted volume appears in it as the file `volume`.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
}

pub(crate) fn run(args: MountArgs) -> Result<(), CliError> {
    if args.volume.allow_discards {
        return Err(CliError::usage(
            "mount cannot pass discards: a hole punched in MOUNTPOINT/volume must read back as \
             zeros, and a discarded encrypted sector reads back as noise (serve passes discards)",
        ));
    }
    // Before the passphrase: the KDF may take seconds, a wrong mount point is known at once.
    sectorcrypt_fuse::check_mountpoint(&args.mountpoint).map_err(fuse_error)?;
    // The devices are kept for their locks and for conversions run online.
    let mut opened = args.volume.open()?;
    let volume = std::sync::Arc::clone(&opened.volume);
    let options = MountOptions {
        threads: args.volume.threads(),
    };
    let files = vec![MountFile {
        name: "volume".into(),
        volume,
    }];
    // The control socket before the mount appears (see `serve`).
    let host = opened.host(&args.volume)?;
    let mut session = match sectorcrypt_fuse::mount(files, &args.mountpoint, &options) {
        Ok(session) => session,
        Err(e) => {
            host.shutdown();
            return Err(fuse_error(e));
        }
    };
    let host = host.begin()?;
    loop {
        match session.wait() {
            Stop::Unmounted => break,
            Stop::Signal(_) => match session.unmount() {
                Ok(Unmounted::Now) => break,
                Ok(Unmounted::WhenClosed) => {
                    eprintln!(
                        "sectorcrypt: {} is in use (a loop device or an open file); detached it, \
                         exiting once its last user closes it",
                        session.mountpoint().display()
                    );
                    break;
                }
                // Exiting now would leave a dead mount and lose writes in flight: keep serving.
                Err(e) => eprintln!("sectorcrypt: {e}; still serving (signal again to retry)"),
            },
        }
    }
    host.shutdown();
    session.close().map_err(fuse_error)
}

/// CLI.md's exit codes: a missing mount point is a wrong device (4), one in use is busy (5).
pub(crate) fn fuse_error(e: FuseError) -> CliError {
    let code = match &e {
        FuseError::NoMountpoint(_) => Code::Device,
        FuseError::MountpointBusy { .. } => Code::Busy,
        FuseError::Mount { source, .. } if source.kind() == std::io::ErrorKind::ResourceBusy => {
            Code::Busy
        }
        _ => Code::Usage,
    };
    CliError {
        code,
        message: e.to_string(),
    }
}
