//! What the tests of every sectorcrypt crate share. Dev-only: crates take it as a
//! `[dev-dependency]`, never as a dependency.
//!
//! The helpers here exist so that the suite passes on any x86-64 host, whatever its CPU vendor,
//! clock or load, while still running the real tools:
//!
//! - [`tools`]: the real peer programs, with what it takes to make them behave on every host
//!   (qemu-img's PBKDF2 calibration gives up on a CPU that is too fast for it; it is then run
//!   again under qemu-user, which is slow enough).
//! - [`fault`]: a real process stopped at an exact point of its I/O (before its n-th write), by
//!   strace's fault injection, so that "killed at a random moment" is a seeded random write and
//!   never a race against the clock.
//! - [`kernel_oracle`]: the real Linux kernel (Debian's package in QEMU under TCG, the same
//!   emulated CPU on every host) running a script as root, for what only a kernel can check.
//! - [`sweep`]: power cut after every write and sync of an operation, every surviving image the
//!   crash model allows checked (`sectorcrypt_storage::crash`).
//! - [`vectors`]: the one parser of the standard test-vector files.
//! - [`xml`]: whether a generated document (an SVG figure) is well-formed XML.
//! - [`pki`]: certificates and keys for the TLS tests, in the directories NBD peers expect.
//!
//! And what every test file needs: a scratch folder, running a tool and checking it succeeded,
//! cryptsetup with fast key derivation, data patterns.

pub mod aes_schedule;
pub mod fault;
pub mod kernel_oracle;
pub mod luks2_json;
pub mod openssl;
pub mod pki;
pub mod sweep;
pub mod tools;
pub mod vectors;
pub mod xml;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// PBKDF2 at cryptsetup's minimum of 1000 iterations: keyslots that take a millisecond to open,
/// for tests (as `sectorcrypt` or `cryptsetup` arguments).
pub const FAST_PBKDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// Argon2id at 4 iterations and 32 KiB: the cheapest memory-hard keyslots cryptsetup makes.
pub const FAST_ARGON2ID: [&str; 6] = [
    "--pbkdf",
    "argon2id",
    "--pbkdf-force-iterations",
    "4",
    "--pbkdf-memory",
    "32",
];

/// A LUKS1 volume (always PBKDF2) at cryptsetup's minimum of 1000 iterations.
pub const FAST_LUKS1: [&str; 4] = ["--type", "luks1", "--pbkdf-force-iterations", "1000"];

/// `args` followed by [`FAST_PBKDF`], for a command that makes a keyslot.
pub fn with_fast_pbkdf<'a>(args: &[&'a str]) -> Vec<&'a str> {
    [args, &FAST_PBKDF[..]].concat()
}

/// An empty folder for one test (`name` unique per test), under the system's temporary folder.
/// Removed when the test passes, kept for inspection when it fails: a test run leaves nothing
/// behind (the suite writes gigabytes of images, and a full disk fails unrelated tests later).
pub fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("sectorcrypt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A test's scratch folder (see [`scratch`]); derefs to its path.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `path` as UTF-8, for argument lists (test paths always are).
pub fn p(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// `len` bytes of a seeded pseudo-random pattern (SplitMix64: no random-number crate needed).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `out`, after asserting it succeeded (else its status and both outputs are the message).
pub fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        failure_report(&out)
    );
    out
}

/// Lines of a long output repeated at the head of its failure report.
const REPORT_TAIL_LINES: usize = 30;

/// Both outputs of a failed command; a long one led by its last lines, where the failing step
/// is, so that a report cut short in its middle (as CI logs are) still shows it.
fn failure_report(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail_of = |text: &str| {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(REPORT_TAIL_LINES)..].join("\n")
    };
    if stdout.lines().count() + stderr.lines().count() <= 2 * REPORT_TAIL_LINES {
        return format!("{stdout}{stderr}");
    }
    format!(
        "its stderr ends with:\n{}\n--- stdout ends with:\n{}\n--- whole stdout:\n{stdout}\n--- whole stderr:\n{stderr}",
        tail_of(&stderr),
        tail_of(&stdout)
    )
}

/// `cryptsetup ARGS` (the real one, installed by the test set-up).
pub fn cryptsetup(args: &[&str]) -> Output {
    output(Command::new("cryptsetup").args(args))
}

/// `cryptsetup luksFormat --type luks2 EXTRA...` of `img` holding the volume key in the file
/// `volume_key`, with the passphrase in the file `key` and fast key derivation; it must succeed.
pub fn cryptsetup_format_with_volume_key(
    img: &Path,
    key: &Path,
    volume_key: &Path,
    extra: &[&str],
) {
    let mut args = with_fast_pbkdf(&["luksFormat", "--type", "luks2"]);
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--volume-key-file", p(volume_key)]);
    args.extend_from_slice(&["--batch-mode", "--key-file", p(key), p(img)]);
    ok(cryptsetup(&args), "cryptsetup luksFormat");
}

/// The volume key `cryptsetup luksDump --dump-volume-key` reports for `img` (`extra`: e.g.
/// `--header FILE`) with the passphrase in the file `key`.
pub fn cryptsetup_volume_key(img: &Path, key: &Path, extra: &[&str]) -> Vec<u8> {
    let mut args = vec!["luksDump", "--dump-volume-key", "-q", "--key-file", p(key)];
    args.extend_from_slice(extra);
    args.push(p(img));
    let out = ok(cryptsetup(&args), "cryptsetup luksDump --dump-volume-key");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines().skip_while(|l| !l.starts_with("MK dump:"));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no 'MK dump:' in cryptsetup output:\n{text}"));
    let mut hex = first["MK dump:".len()..].to_string();
    for l in lines.take_while(|l| l.starts_with(char::is_whitespace)) {
        hex += l;
    }
    let digits: String = hex.split_whitespace().collect();
    let key = (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex"))
        .collect::<Vec<u8>>();
    assert!(!key.is_empty(), "empty volume key in:\n{text}");
    key
}

/// The Python interpreter that has `cryptography` (scripts/install-test-deps.sh installs it):
/// `$SECTORCRYPT_PYTHON`, or `python3` on PATH.
pub fn python() -> String {
    std::env::var("SECTORCRYPT_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Run `cmd` with no standard input (nothing may wait for a terminal) and collect its output; a
/// program that cannot start is a test failure that names the set-up script.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (run scripts/install-test-deps.sh)"))
}

/// Where `program` is on `PATH`.
pub fn which(program: impl AsRef<OsStr>) -> Option<PathBuf> {
    let program = program.as_ref();
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// `wrapper FRONT... PROGRAM ARGS...`: `cmd` (its arguments, environment and working directory)
/// run under a wrapper such as strace or qemu-user, with `program` in place of `cmd`'s own.
fn wrapped(wrapper: &str, front: &[OsString], program: &OsStr, cmd: &Command) -> Command {
    let mut w = Command::new(wrapper);
    w.args(front).arg(program).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => w.env(k, v),
            None => w.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        w.current_dir(dir);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn failed(stdout: &str, stderr: &str) -> Output {
        Output {
            status: std::process::ExitStatus::from_raw(1 << 8),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_long_failure_report_leads_with_where_the_output_ended() {
        let trace: String = (0..500).map(|i| format!("+ step {i}\n")).collect();
        let report = failure_report(&failed(
            "",
            &format!("{trace}line 9: \"cmp a b\" exited with 1\n"),
        ));
        let failing = report
            .find("\"cmp a b\" exited with 1")
            .expect("the failing step");
        let first = report.find("+ step 0\n").expect("the whole output follows");
        assert!(failing < first, "{report}");
    }

    #[test]
    fn a_short_failure_report_is_the_output_as_it_was() {
        assert_eq!(failure_report(&failed("out\n", "err\n")), "out\nerr\n");
    }
}
