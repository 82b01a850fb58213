//! Keys in a running server: every command that holds keys for long (`serve`, `mount`,
//! `kpio serve`, `flash attach`) keeps them in locked memory (`VmLck`), out of core dumps (a
//! `gcore` core holds none of the volume key's bytes, none of a round key's, not the passphrase)
//! and is not dumpable; `kpio serve` also after a SIGHUP reload and after a key is destroyed.
//!
//! The server runs as `nobody` when the tests run as root: the kernel makes root the owner of a
//! non-dumpable process's `/proc/PID/environ` (and its other private files), which is how its dumpability shows from outside. `gcore`
//! needs root (it attaches to the server as a debugger, which a non-dumpable process refuses to
//! its own user), so the tests ask for it.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sectorcrypt_testkit::aes_schedule::aes_round_keys;
use sectorcrypt_testkit::{pattern, FAST_ARGON2ID, FAST_PBKDF};

use crate::common::{p, run, sc, Scratch};
use crate::nbd::{signal, write_file, BIN, MIB};

/// A hang detector for a server to start or reload, not a speed check.
const DEADLINE: Duration = Duration::from_secs(120);

/// The passphrase every volume here is made with: distinctive, so that a core holding it says so.
const PASSPHRASE: &[u8] = b"correct-horse-battery-staple-7f3a9c";

fn is_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// A scratch folder the unprivileged server can use.
fn scratch(name: &str) -> Scratch {
    let dir = sectorcrypt_testkit::scratch(&format!("secrets-{name}"));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// `path` made readable and writable by the unprivileged server.
fn share(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// A running command that holds keys; killed and reaped on drop.
struct Holder {
    child: Child,
    log: PathBuf,
}

impl Holder {
    /// Start `sectorcrypt ARGS` (as `nobody` when root) and wait until `ready` says it is up.
    fn start(dir: &Path, args: &[&str], ready: impl Fn(&str) -> bool) -> Holder {
        Holder::start_as(dir, args, ready, true)
    }

    /// As [`Holder::start`], as the tests' own user unless `unprivileged`.
    fn start_as(
        dir: &Path,
        args: &[&str],
        ready: impl Fn(&str) -> bool,
        unprivileged: bool,
    ) -> Holder {
        let log = dir.join(format!("{}.log", args[0]));
        let mut cmd = if is_root() && unprivileged {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
            c
        } else {
            Command::new(BIN)
        };
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut holder = Holder { child, log };
        holder.wait_for(&ready, "start");
        holder
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for(&mut self, ready: &dyn Fn(&str) -> bool, what: &str) {
        let end = Instant::now() + DEADLINE;
        while !ready(&self.stderr()) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the server exited ({status}) before it could {what}: {}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < end,
                "no {what} within {DEADLINE:?}: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A field of `/proc/PID/status`, in its unit (kB for memory).
fn status_field(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What must hold of a key holder: its memory locks at least `min_locked_kib`; it is not
/// dumpable; and a core of it taken with `gcore` holds `present` (proof the core is a real view of
/// its memory) but no 16-byte piece of `secrets`, and, of a 64-byte secret (an AES-XTS key), no
/// round key of either AES key (the first two are pieces of the key; any one gives it away).
fn assert_keys_protected(
    holder: &Holder,
    dir: &Path,
    min_locked_kib: u64,
    present: &[u8],
    secrets: &[(&str, &[u8])],
) {
    let pid = holder.pid();
    let locked = status_field(pid, "VmLck");
    assert!(
        locked >= min_locked_kib,
        "VmLck is {locked} kB, less than the {min_locked_kib} kB the keys take: {}",
        holder.stderr()
    );
    assert_no_signal_lands_on_a_keyed_thread(pid);
    // Root owns a root process's files whether it is dumpable or not: nothing to see then.
    if status_field(pid, "Uid") != 0 {
        // The kernel gives a non-dumpable process's private files (not /proc/PID itself) to root.
        let owner = std::fs::metadata(format!("/proc/{pid}/environ"))
            .unwrap()
            .uid();
        assert_eq!(
            owner, 0,
            "/proc/{pid}/environ belongs to root: the process is not dumpable"
        );
    }

    assert!(
        is_root(),
        "gcore needs root to attach to a non-dumpable process"
    );
    let prefix = dir.join("core");
    let out = run(Command::new("gcore")
        .arg("-o")
        .arg(&prefix)
        .arg(pid.to_string()));
    let core_path = PathBuf::from(format!("{}.{pid}", prefix.display()));
    assert!(out.status.success() && core_path.exists(), "gcore: {out:?}");
    let core = std::fs::read(&core_path).unwrap();
    std::fs::remove_file(&core_path).unwrap();
    assert!(
        contains(&core, present),
        "the core holds the process's ordinary memory ({} bytes)",
        core.len()
    );
    // Every 16-byte piece looked for, and what it is; the core is then read once.
    let mut pieces = std::collections::HashMap::new();
    for (what, secret) in secrets {
        for (i, piece) in secret.chunks_exact(16).enumerate() {
            pieces.insert(piece.to_vec(), format!("bytes {}.. of the {what}", 16 * i));
        }
        // A 64-byte key is AES-XTS's two AES-256 keys: any one of their round keys gives a key
        // away, and only the first two of each are its bytes.
        if secret.len() == 64 {
            for (half, aes_key) in secret.chunks(32).enumerate() {
                for (i, round_key) in aes_round_keys(aes_key).iter().enumerate() {
                    pieces.entry(round_key.to_vec()).or_insert_with(|| {
                        format!(
                            "round key {i} of the {what}'s AES key {half} (the encryption \
                             schedule's, then the decryption schedule's inner ones)"
                        )
                    });
                }
            }
        }
    }
    // Most windows are turned away by their first two bytes, before any hashing.
    let mut starts = vec![false; 1 << 16];
    for piece in pieces.keys() {
        starts[usize::from(u16::from_le_bytes([piece[0], piece[1]]))] = true;
    }
    let found = core
        .windows(16)
        .filter(|w| starts[usize::from(u16::from_le_bytes([w[0], w[1]]))])
        .find_map(|w| pieces.get(w));
    if let Some(found) = found {
        panic!("the core holds {found}");
    }
}

/// A signal handler saves the interrupted thread's registers (round keys, in a cipher call) on
/// its stack, deeper than a cipher call's wipe reaches (`sectorcrypt_secret::signals`). So: no
/// handler is installed but Rust's own for SIGSEGV and SIGBUS (faults, on an alternate stack, and
/// fatal), and every thread blocks SIGINT, SIGTERM and SIGHUP, which one thread takes with
/// `sigwaitinfo`.
fn assert_no_signal_lands_on_a_keyed_thread(pid: u32) {
    let mask = |status: &str, name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no {name} in {status}"))
    };
    let bit = |signal: u32| 1u64 << (signal - 1);
    let (sighup, sigint, sigbus, sigsegv, sigterm) = (1, 2, 7, 11, 15);
    // glibc's own SIGSETXID (33), which it sends its threads only when one of them changes the
    // process's user or group ids: sectorcrypt never does.
    let sigsetxid = 33;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let caught = mask(&status, "SigCgt");
    assert_eq!(
        caught & !(bit(sigsegv) | bit(sigbus) | bit(sigsetxid)),
        0,
        "signal handlers are installed (SigCgt {caught:#x}): one may run on a thread in a \
         cipher call"
    );
    let routed = bit(sighup) | bit(sigint) | bit(sigterm);
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        // A thread that has ended since the listing has no status to read.
        let Ok(status) = std::fs::read_to_string(task.join("status")) else {
            continue;
        };
        let name = status.lines().next().unwrap_or_default().to_owned();
        // The thread that takes them: `sigwaitinfo` unblocks what it waits for while it waits,
        // and with no handler installed (above) a signal only ends the wait.
        if name.split_whitespace().nth(1) == Some("signals") {
            threads += 1;
            continue;
        }
        let blocked = mask(&status, "SigBlk");
        assert_eq!(
            blocked & routed,
            routed,
            "thread {} ({name}) does not block SIGHUP, SIGINT and SIGTERM (SigBlk {blocked:#x})",
            task.display()
        );
        threads += 1;
    }
    assert!(
        threads >= 2,
        "the signals thread and at least one other: {threads}"
    );
}

/// A signal no command takes does what it would if no thread blocked it: SIGTERM and SIGHUP end
/// `benchmark` as that signal, and a SIGHUP ignored from the start (`nohup`) stays ignored.
#[test]
fn a_signal_no_command_takes_ends_the_process_as_that_signal_unless_ignored() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    let benchmark = |seconds: &str, nohup: bool| {
        let args = [
            "benchmark",
            "-c",
            "aes-xts-plain64",
            "--sector-size",
            "512",
            "--request-size",
            "65536",
            "--seconds",
            seconds,
        ];
        // Every signal at its default first: the test may itself run with SIGHUP ignored (under
        // `nohup`), which a child inherits.
        let mut cmd = Command::new("env");
        cmd.arg("--default-signal");
        if nohup {
            cmd.arg("nohup");
        }
        cmd.arg(BIN);
        let mut child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The table's first line is printed after `main` has routed the signals. The rest is
        // read to its end: with the pipe closed, the next line would fail the run.
        let mut table = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        table.read_line(&mut first).unwrap();
        assert!(first.starts_with("# "), "benchmark printed {first:?}");
        (child, table)
    };
    let wait = |(mut child, mut table): (Child, BufReader<std::process::ChildStdout>)| {
        std::io::copy(&mut table, &mut std::io::sink()).unwrap();
        child.wait().unwrap()
    };
    for (sig, number) in [("-TERM", 15), ("-HUP", 1)] {
        // Far longer than the test waits for the signal to act.
        let child = benchmark("60", false);
        signal(child.0.id(), sig);
        let status = wait(child);
        assert_eq!(
            status.signal(),
            Some(number),
            "kill {sig} ends benchmark as that signal: {status}"
        );
    }
    let child = benchmark("1", true);
    signal(child.0.id(), "-HUP");
    let status = wait(child);
    assert!(
        status.success(),
        "under nohup SIGHUP is ignored and benchmark finishes: {status}"
    );
}

/// A LUKS2 volume of `mib` MiB with a known volume key and [`PASSPHRASE`]: (image, passphrase
/// file, volume key).
fn volume(dir: &Path, mib: u64) -> (PathBuf, PathBuf, Vec<u8>) {
    volume_with(dir, mib, 64, &[])
}

/// [`volume`] with a volume key of `key_len` bytes and more `format` arguments.
fn volume_with(
    dir: &Path,
    mib: u64,
    key_len: usize,
    format_args: &[&str],
) -> (PathBuf, PathBuf, Vec<u8>) {
    let img = dir.join("disk.img");
    let pass = dir.join("pass");
    let vk_file = dir.join("vk");
    let vk = pattern(key_len, 0x5ec2e7);
    write_file(&img, &vec![0u8; (mib * MIB) as usize]);
    write_file(&pass, PASSPHRASE);
    write_file(&vk_file, &vk);
    let mut args = vec![
        "format",
        "-q",
        p(&img),
        "--key-file",
        p(&pass),
        "--volume-key-file",
        p(&vk_file),
    ];
    args.extend(FAST_ARGON2ID);
    args.extend(format_args);
    let out = sc(&args);
    assert!(out.status.success(), "format: {out:?}");
    std::fs::remove_file(&vk_file).unwrap();
    for f in [&img, &pass] {
        share(f);
    }
    (img, pass, vk)
}

/// Two engines (data and tweak key), each in pages of its own.
const XTS_LOCKED_KIB: u64 = 8;

/// [`assert_keys_protected`] for a holder of one volume: its key and [`PASSPHRASE`].
fn assert_volume_keys_protected(holder: &Holder, dir: &Path, device: &Path, vk: &[u8]) {
    let secrets: [(&str, &[u8]); 2] = [("volume key", vk), ("passphrase", PASSPHRASE)];
    assert_keys_protected(holder, dir, XTS_LOCKED_KIB, p(device).as_bytes(), &secrets);
}

#[test]
fn serve_keeps_keys_locked_and_out_of_a_core() {
    let dir = scratch("serve");
    let (img, pass, vk) = volume(&dir, 20);
    let sock = dir.join("s.sock");
    let holder = Holder::start(
        &dir,
        &[
            "serve",
            p(&img),
            "--key-file",
            p(&pass),
            "--socket",
            p(&sock),
            "--verbose",
        ],
        |log| log.contains("sectorcrypt: serving"),
    );
    // --verbose says how much is locked, once the keys are in place.
    let said = holder.stderr();
    let kib: u64 = said
        .lines()
        .find_map(|l| {
            l.strip_prefix("sectorcrypt: ")?
                .strip_suffix(" KiB of memory holding keys is locked")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("--verbose reports the locked memory: {said}"));
    assert!(kib >= XTS_LOCKED_KIB, "{said}");
    assert_volume_keys_protected(&holder, &dir, &img, &vk);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mount_keeps_keys_locked_and_out_of_a_core() {
    let dir = scratch("mount");
    let (img, pass, vk) = volume(&dir, 20);
    mount_and_check(&dir, &img, &pass, &vk, XTS_LOCKED_KIB);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Authenticated encryption has keyed code of its own besides the XTS engines: HMAC, and
/// ChaCha20-Poly1305, AES-GCM and AEGIS-128, which are other crates' or this project's own. Each
/// mode's keys stay out of a core taken after requests ran, as XTS keys do.
#[test]
fn mount_keeps_integrity_keys_out_of_a_core() {
    let modes: [(&str, usize, &[&str]); 4] = [
        ("hmac-sha256", 96, &["--integrity", "hmac-sha256"]),
        (
            "chacha20-poly1305",
            32,
            &["--cipher", "chacha20-random", "--integrity", "poly1305"],
        ),
        (
            "aes-gcm",
            32,
            &["--cipher", "aes-gcm-random", "--integrity", "aead"],
        ),
        (
            "aegis128",
            16,
            &[
                "--cipher",
                "aegis128-random",
                "--integrity",
                "aead",
                "--key-size",
                "128",
            ],
        ),
    ];
    for (mode, key_len, args) in modes {
        let dir = scratch(&format!("mount-{mode}"));
        let (img, pass, vk) = volume_with(&dir, 20, key_len, args);
        eprintln!("{mode}");
        mount_and_check(&dir, &img, &pass, &vk, 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Mount `img`, write and read through the mount, then check the server's keys are protected
/// ([`assert_keys_protected`], at least `min_locked_kib` locked) and unmount.
fn mount_and_check(dir: &Path, img: &Path, pass: &Path, vk: &[u8], min_locked_kib: u64) {
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let file = mnt.join("volume");
    // As the tests' user: an unprivileged FUSE mount needs /dev/fuse open to all, which hosts
    // need not grant. Not being dumpable is process-wide, and the other tests check it.
    let holder = Holder::start_as(
        dir,
        &["mount", p(img), p(&mnt), "--key-file", p(pass)],
        |_| file.exists(),
        false,
    );
    // Requests first: what the keyed calls of the data path leave on the stack and in the
    // registers must be gone when the core is taken.
    let data = pattern(256 * 1024, 0x3c);
    {
        use std::os::unix::fs::FileExt;
        let volume = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .unwrap();
        volume.write_all_at(&data, MIB).unwrap();
        volume.sync_all().unwrap();
        let mut back = vec![0; data.len()];
        volume.read_exact_at(&mut back, MIB).unwrap();
        assert!(
            back == data,
            "what was written through the mount reads back"
        );
    }
    let secrets: [(&str, &[u8]); 2] = [("volume key", vk), ("passphrase", PASSPHRASE)];
    assert_keys_protected(&holder, dir, min_locked_kib, p(img).as_bytes(), &secrets);
    drop(holder);
    let _ = run(Command::new("fusermount3").arg("-u").arg(&mnt));
}

#[test]
fn kpio_serve_keeps_keys_locked_and_out_of_a_core_across_reloads() {
    let dir = scratch("kpio");
    let store = dir.join("store.img");
    write_file(&store, &vec![0u8; MIB as usize]);
    share(&store);
    let (k0, k1, k2) = (pattern(64, 0xa0), pattern(64, 0xa1), pattern(64, 0xa2));
    let table = dir.join("keys.bin");
    write_file(&table, &[k0.clone(), k1.clone()].concat());
    share(&table);
    let sock = dir.join("k.sock");
    let mut holder = Holder::start(
        &dir,
        &[
            "kpio",
            "serve",
            p(&store),
            "--key-table",
            p(&table),
            "--socket",
            p(&sock),
        ],
        |log| log.contains("sectorcrypt: serving"),
    );
    let keys =
        |ks: &[(&'static str, &[u8])]| ks.iter().map(|&(n, k)| (n, k.to_vec())).collect::<Vec<_>>();
    let check = |holder: &Holder, min: u64, ks: Vec<(&str, Vec<u8>)>| {
        let secrets: Vec<(&str, &[u8])> = ks.iter().map(|(n, k)| (*n, &k[..])).collect();
        assert_keys_protected(
            holder,
            &dir,
            min,
            store.to_str().unwrap().as_bytes(),
            &secrets,
        );
    };
    check(
        &holder,
        2 * XTS_LOCKED_KIB,
        keys(&[("key 0", &k0), ("key 1", &k1)]),
    );
    // Reload: key 0 replaced by key 2, key 1 destroyed.
    write_file(&table, &[k2.clone(), vec![0u8; 64]].concat());
    signal(holder.pid(), "-HUP");
    holder.wait_for(&|log| log.contains("key table reloaded"), "reload");
    assert!(
        holder.stderr().contains("1 replaced, 1 destroyed"),
        "{}",
        holder.stderr()
    );
    check(
        &holder,
        XTS_LOCKED_KIB,
        keys(&[
            ("replaced key 0", &k0),
            ("destroyed key 1", &k1),
            ("new key 2", &k2),
        ]),
    );
    drop(holder);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flash_attach_keeps_keys_locked_and_out_of_a_core() {
    let dir = scratch("flash");
    let img = dir.join("chip.img");
    let pass = dir.join("pass");
    write_file(&pass, PASSPHRASE);
    let mut format = vec![
        "flash",
        "format",
        p(&img),
        "--size",
        "16MiB",
        "--key-file",
        p(&pass),
        "-q",
    ];
    format.extend(FAST_PBKDF);
    assert!(sc(&format).status.success());
    let mkvol = sc(&[
        "flash",
        "mkvol",
        p(&img),
        "-N",
        "data",
        "-S",
        "4",
        "--key-file",
        p(&pass),
    ]);
    assert!(mkvol.status.success(), "{mkvol:?}");
    let dump = sc(&[
        "dump",
        "--dump-volume-key",
        "--json",
        "--key-file",
        p(&pass),
        p(&img),
    ]);
    let json: serde_json::Value = serde_json::from_slice(&dump.stdout).expect("dump --json");
    let hex = json["volume_key"].as_str().unwrap();
    let vk: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(vk.len(), 64);
    share(&img);
    share(&pass);
    let sockets = dir.join("sockets");
    std::fs::create_dir(&sockets).unwrap();
    std::fs::set_permissions(&sockets, std::fs::Permissions::from_mode(0o777)).unwrap();
    let holder = Holder::start(
        &dir,
        &[
            "flash",
            "attach",
            p(&img),
            "--socket-dir",
            p(&sockets),
            "--key-file",
            p(&pass),
        ],
        |log| log.contains("sectorcrypt: volume data"),
    );
    assert_volume_keys_protected(&holder, &dir, &img, &vk);
    drop(holder);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Under a lock limit of zero (and without root's exemption from it) the keys cannot be locked:
/// the command says so once and does its work.
#[test]
fn a_lock_limit_too_small_warns_once_and_goes_on() {
    let dir = scratch("limit");
    let (img, pass, _) = volume(&dir, 20);
    let mut cmd = Command::new("prlimit");
    cmd.args(["--memlock=0:0", "--"]);
    if is_root() {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
    }
    let out = run(cmd.args([BIN, "test-passphrase", p(&img), "--key-file", p(&pass)]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the passphrase still opens the volume: {stderr}"
    );
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("WARNING: cannot lock memory holding keys"))
        .count();
    assert_eq!(warnings, 1, "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
