//! The kernel oracle itself: it runs a script as root in a real kernel, shares the work folder
//! and nothing else of the host writably, and when the guest cannot reach user space it says so
//! in one line instead of hanging or looking like a wrong answer.

use sectorcrypt_testkit::kernel_oracle::{self, GUEST_FAILED};
use sectorcrypt_testkit::{p, scratch};

#[test]
fn the_guest_runs_a_script_as_root_and_returns_its_output_and_status() {
    let work = scratch("kernel-oracle-run");
    let script = work.join("probe.sh");
    let outside = std::env::temp_dir().join(format!(
        "sectorcrypt-kernel-oracle-outside-{}",
        std::process::id()
    ));
    std::fs::write(
        &script,
        format!(
            "set -e\nid -u\nuname -r\nmodprobe nandsim\nmodprobe dm-crypt\n\
             grep -c 'NAND simulator' /proc/mtd\ngrep -q crypt /proc/modules && echo dm-crypt\n\
             pwd\necho written >from-guest.txt\necho no >{}\nexit 7\n",
            p(&outside)
        ),
    )
    .unwrap();
    let out = kernel_oracle::run(&work, &script, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let release = std::fs::read_to_string(kernel_oracle::dir().join("release")).unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        ["0", release.trim(), "1", "dm-crypt", p(&work)],
        "{text}"
    );
    assert_eq!(
        std::fs::read(work.join("from-guest.txt")).unwrap(),
        b"written\n"
    );
    assert!(
        !outside.exists(),
        "a write outside the work folder reached the host"
    );
}

/// The failure an Intel AMX host gave the old User-Mode-Linux oracle: the kernel starts but its
/// first process dies ("Attempted to kill init!"). Provoked here by an init that exits at once.
#[test]
fn a_guest_that_cannot_run_user_space_is_one_line_with_the_panic() {
    let work = scratch("kernel-oracle-panic");
    let script = work.join("never.sh");
    std::fs::write(&script, "echo ran >ran.txt\n").unwrap();
    let out = kernel_oracle::run_with(
        &work,
        &script,
        &[],
        &[("SECTORCRYPT_ORACLE_APPEND", "rdinit=/bin/busybox")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(GUEST_FAILED), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("Kernel panic") && err.contains("Attempted to kill init"),
        "{err}"
    );
    assert!(!work.join("ran.txt").exists());
}
