//! `sectorcrypt generate man|completions DIR`: the manual and the shell completions, written from
//! the command-line definitions themselves (so they cannot drift from `--help`), as ripgrep's
//! `--generate` does. Man pages are section 8, as cryptsetup's, one per command and one per
//! command of a family (`sectorcrypt-flash-attach(8)`), in the manner of cryptsetup's per-action
//! pages.

use std::path::{Path, PathBuf};

use clap::Command;

use crate::exit::CliError;

/// What to write.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum What {
    /// Man pages: DIR/sectorcrypt.8 and DIR/sectorcrypt-COMMAND.8 for every command.
    Man {
        /// The folder to write into (made if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Completions for bash (DIR/sectorcrypt.bash), zsh (DIR/_sectorcrypt) and fish
    /// (DIR/sectorcrypt.fish).
    Completions {
        /// The folder to write into (made if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// Write what `what` asks for, from `cli` (the whole command line's definition).
pub(crate) fn run(what: What, mut cli: Command) -> Result<(), CliError> {
    // Global options reach the subcommands' definitions only once built.
    cli.build();
    match what {
        What::Man { dir } => {
            create(&dir)?;
            man_pages(&cli, "sectorcrypt", &dir)
        }
        What::Completions { dir } => {
            create(&dir)?;
            use clap_complete::Shell;
            for (shell, file) in [
                (Shell::Bash, "sectorcrypt.bash"),
                (Shell::Zsh, "_sectorcrypt"),
                (Shell::Fish, "sectorcrypt.fish"),
            ] {
                let mut out = Vec::new();
                clap_complete::generate(shell, &mut cli.clone(), "sectorcrypt", &mut out);
                write(&dir.join(file), &out)?;
            }
            Ok(())
        }
    }
}

fn create(dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::io(format!("cannot create {}", dir.display()), e))
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    std::fs::write(path, bytes)
        .map_err(|e| CliError::io(format!("cannot write {}", path.display()), e))
}

/// The page of `cmd`, named `name`, and those of its subcommands (`name-SUB`), recursively.
fn man_pages(cmd: &Command, name: &str, dir: &Path) -> Result<(), CliError> {
    let page = cmd
        .clone()
        .name(name.to_string())
        .bin_name(name.replace('-', " "));
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .section("8")
        .manual("sectorcrypt manual")
        .source(format!("sectorcrypt {}", env!("CARGO_PKG_VERSION")))
        .render(&mut out)
        .map_err(|e| CliError::io(format!("cannot render the page of {name}"), e))?;
    write(&dir.join(format!("{name}.8")), &out)?;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        man_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(())
}
