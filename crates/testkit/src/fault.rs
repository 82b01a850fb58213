//! A real process stopped at an exact point of its I/O.
//!
//! strace's fault injection delivers a signal on entry to the n-th call of a system call
//! (`-e inject=pwrite64:signal=SIGKILL:when=N`): with SIGKILL the process dies before that write
//! reaches the file, with SIGINT its handler runs there. The point is a count of writes, not a
//! time, so the same seed gives the same run on any machine, loaded or idle, slow or fast. Counts
//! are per thread: the programs tested here do their file I/O on one thread.
//!
//! Which call to count: sectorcrypt writes with `pwrite64` (`FileExt::write_at`), cryptsetup
//! with `write` after `lseek`.

use std::ffi::OsString;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{output, wrapped};

/// strace takes `when=N` up to this.
pub const MAX_CALL: u64 = 65535;

/// `cmd` under strace, tracing `syscall` only into `log`, with `extra` strace options.
fn traced(cmd: &Command, syscall: &str, log: &str, extra: &[String]) -> Command {
    let mut front: Vec<OsString> = ["-f", "-qq", "-o", log, "-e"].map(OsString::from).to_vec();
    front.push(format!("trace={syscall}").into());
    front.extend(extra.iter().map(OsString::from));
    front.push("--".into());
    wrapped("strace", &front, cmd.get_program(), cmd)
}

/// Run `cmd` to its end; returns its output and how many `syscall` calls it made.
pub fn count_calls(cmd: &Command, syscall: &str) -> (Output, u64) {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let log = std::env::temp_dir().join(format!(
        "sectorcrypt-strace-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let out = output(&mut traced(cmd, syscall, log.to_str().unwrap(), &[]));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    // Lines read "PID syscall(...) = N"; with -qq nothing else is logged for a traced call.
    let call = format!("{syscall}(");
    let n = text
        .lines()
        .filter(|l| {
            l.split_once(' ')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(&call))
        })
        .count() as u64;
    (out, n)
}

/// Run `cmd`, sending it `signal` (`KILL`, `INT`...) on entry to its `n`-th `syscall` call
/// (counted from 1). A process that makes fewer calls is not signalled; see the status.
pub fn signal_at(cmd: &Command, syscall: &str, n: u64, signal: &str) -> Output {
    assert!(
        (1..=MAX_CALL).contains(&n),
        "strace counts calls from 1 to {MAX_CALL}, not {n}"
    );
    let inject = format!("inject={syscall}:signal=SIG{signal}:when={n}");
    output(&mut traced(
        cmd,
        syscall,
        "/dev/null",
        &["-e".into(), inject],
    ))
}
