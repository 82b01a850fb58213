//! `sectorcrypt mount` with the real tools: mkfs.ext4, the loop driver (or fuse2fs), e2fsck,
//! fusermount3, and an independent AES-XTS (Python's `cryptography`) to check that what goes in
//! through `MOUNTPOINT/volume` is stored as dm-crypt would store it. Needs root, /dev/fuse and
//! the tools of scripts/install-test-deps.sh; every mount is taken down again by a guard, also
//! when a test fails.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::{ok, p, run, sc, scratch};

/// How long a mount may take to appear, or a process to exit, before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// `n` bytes from the kernel's random generator.
fn random(n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut buf)
        .unwrap();
    buf
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A LUKS2 image of `mib` MiB with a fast PBKDF, and its passphrase file.
fn luks_image(dir: &Path, name: &str, mib: u64, extra: &[&str]) -> (PathBuf, PathBuf) {
    let img = dir.join(format!("{name}.img"));
    let key = dir.join(format!("{name}.key"));
    fs::write(&key, format!("passphrase of {name}")).unwrap();
    File::create(&img).unwrap().set_len(mib << 20).unwrap();
    let mut args = vec![
        "format",
        "-q",
        "--key-file",
        p(&key),
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
    ];
    args.extend_from_slice(extra);
    args.push(p(&img));
    ok(sc(&args), "sectorcrypt format");
    (img, key)
}

/// The data segment of `img`: its byte offset and sector size.
fn segment(img: &Path) -> (u64, usize) {
    let out = ok(sc(&["dump", "--json", p(img)]), "sectorcrypt dump --json");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let seg = &json["segments"]["0"];
    let offset = seg["offset"].as_str().unwrap().parse().unwrap();
    let sector_size = seg["sector_size"].as_u64().unwrap() as usize;
    (offset, sector_size)
}

/// An empty directory to mount on, canonical (as /proc/self/mountinfo shows it).
pub(crate) fn mountpoint(dir: &Path, name: &str) -> PathBuf {
    let mp = dir.join(name);
    fs::create_dir_all(&mp).unwrap();
    fs::canonicalize(&mp).unwrap()
}

/// Whether something is mounted on `path`.
fn is_mounted(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .any(|line| line.split(' ').nth(4) == Some(p(path)))
}

/// `sectorcrypt` with `args`, killed (and the test failed) if it has not exited within
/// [`PATIENCE`]: a mount that should have been refused would otherwise run forever.
fn sc_bounded(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sectorcrypt"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "sectorcrypt {args:?} still running after {PATIENCE:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A running `sectorcrypt mount`. Dropping it while it runs (a failed test) detaches the mount
/// and kills the process.
pub(crate) struct Mounted {
    child: Child,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl Mounted {
    /// Start `sectorcrypt mount IMG MOUNTPOINT --key-file KEY EXTRA` and wait for the mount.
    pub(crate) fn start(img: &Path, key: &Path, mountpoint: &Path, extra: &[&str]) -> Mounted {
        let mut args = vec!["mount", p(img), p(mountpoint), "--key-file", p(key)];
        args.extend_from_slice(extra);
        Mounted::spawn(&args, mountpoint)
    }

    /// Start `sectorcrypt ARGS`, which mounts on `mountpoint`, and wait for the mount.
    pub(crate) fn spawn(args: &[&str], mountpoint: &Path) -> Mounted {
        Mounted::spawn_wrapped(&[], args, mountpoint)
    }

    /// [`Mounted::spawn`] under `wrapper` (a program and its arguments, then `sectorcrypt`'s).
    pub(crate) fn spawn_wrapped(wrapper: &[&str], args: &[&str], mountpoint: &Path) -> Mounted {
        let log = mountpoint.with_extension("stderr");
        let bin = env!("CARGO_BIN_EXE_sectorcrypt");
        let mut program = Command::new(wrapper.first().unwrap_or(&bin));
        if !wrapper.is_empty() {
            program.args(&wrapper[1..]).arg(bin);
        }
        let child = program
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut mounted = Mounted {
            child,
            mountpoint: mountpoint.to_path_buf(),
            log,
        };
        let deadline = Instant::now() + PATIENCE;
        while !is_mounted(mountpoint) {
            if let Some(status) = mounted.child.try_wait().unwrap() {
                panic!("sectorcrypt mount exited ({status}): {}", mounted.stderr());
            }
            assert!(Instant::now() < deadline, "no mount on {mountpoint:?}");
            sleep(Duration::from_millis(20));
        }
        mounted
    }

    pub(crate) fn volume(&self) -> PathBuf {
        self.mountpoint.join("volume")
    }

    pub(crate) fn stderr(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        ok(run(Command::new("kill").args(["-s", name, &pid])), "kill");
    }

    fn still_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Wait for the process to exit and return how it did.
    pub(crate) fn exit_status(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "sectorcrypt mount did not exit");
            sleep(Duration::from_millis(20));
        }
    }

    /// `fusermount3 -u` (retried while the loop driver lets go of the file), then the exit
    /// status, after checking that the mount is gone.
    pub(crate) fn unmount(mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let out = run(Command::new("fusermount3").arg("-u").arg(&self.mountpoint));
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "fusermount3 -u: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            sleep(Duration::from_millis(50));
        }
        let status = self.exit_status();
        assert!(!is_mounted(&self.mountpoint), "still mounted after exit");
        status
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.still_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if is_mounted(&self.mountpoint) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mountpoint)
                .status();
        }
    }
}

/// An ext4 file system on `MOUNTPOINT/volume`, mounted through a loop device, or through fuse2fs
/// where no loop device can be had. Dropping it while mounted detaches it.
struct Ext4 {
    dir: PathBuf,
}

impl Ext4 {
    fn mount(image: &Path, dir: &Path) -> Ext4 {
        fs::create_dir_all(dir).unwrap();
        let ext4 = Ext4 {
            dir: fs::canonicalize(dir).unwrap(),
        };
        let looped = run(Command::new("mount").args(["-o", "loop", p(image), p(dir)]));
        if looped.status.success() {
            eprintln!("ext4 on {}: mounted through a loop device", image.display());
            return ext4;
        }
        let fused = run(Command::new("fuse2fs").args([p(image), p(dir)]));
        assert!(
            fused.status.success(),
            "neither mount -o loop ({}) nor fuse2fs ({}) mounts {image:?}",
            String::from_utf8_lossy(&looped.stderr),
            String::from_utf8_lossy(&fused.stderr)
        );
        eprintln!(
            "ext4 on {}: mounted through fuse2fs (no loop device: {})",
            image.display(),
            String::from_utf8_lossy(&looped.stderr).trim()
        );
        ext4
    }

    fn unmount(self) {
        ok(run(Command::new("umount").arg(&self.dir)), "umount ext4");
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        if is_mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Every file under `root`, by path relative to it, with its contents, in order.
fn tree(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_path_buf();
                files.push((rel, fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn ext4_on_the_volume_survives_a_remount_and_is_stored_encrypted() {
    let dir = scratch("fuse_cli-ext4");
    let (img, key) = luks_image(&dir, "ext4", 64, &[]);
    let (data_offset, _) = segment(&img);
    let mp = mountpoint(&dir, "mnt");
    let fsdir = dir.join("fs");
    let marker = hex(&random(32));

    let m = Mounted::start(&img, &key, &mp, &[]);
    let meta = fs::metadata(m.volume()).unwrap();
    assert_eq!(
        meta.len(),
        (64 << 20) - data_offset,
        "size of MOUNTPOINT/volume"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    ok(
        run(Command::new("mkfs.ext4").args(["-q", "-F", p(&m.volume())])),
        "mkfs.ext4",
    );
    let ext4 = Ext4::mount(&m.volume(), &fsdir);
    let src = fsdir.join("tree");
    fs::create_dir_all(src.join("sub/deeper")).unwrap();
    fs::write(src.join("hello.txt"), "hello, volume\n").unwrap();
    fs::write(src.join("sub/marker.txt"), &marker).unwrap();
    fs::write(src.join("sub/deeper/random.bin"), random(5 << 20)).unwrap();
    fs::write(src.join("sub/empty"), b"").unwrap();
    let written = tree(&src);
    ext4.unmount();
    assert_eq!(
        m.unmount().code(),
        Some(0),
        "exit status after fusermount3 -u"
    );

    let m = Mounted::start(&img, &key, &mp, &[]);
    let ext4 = Ext4::mount(&m.volume(), &fsdir);
    assert_eq!(
        tree(&fsdir.join("tree")),
        written,
        "the tree after a remount"
    );
    ext4.unmount();
    // fuse2fs reads the same file system straight from MOUNTPOINT/volume (FUSE on FUSE).
    let fuse2fs_dir = dir.join("fuse2fs");
    fs::create_dir_all(&fuse2fs_dir).unwrap();
    ok(
        run(Command::new("fuse2fs").args(["-o", "ro", p(&m.volume()), p(&fuse2fs_dir)])),
        "fuse2fs -o ro",
    );
    // Unmounted on drop if anything below fails.
    let fuse2fs = Ext4 {
        dir: fs::canonicalize(&fuse2fs_dir).unwrap(),
    };
    let via_fuse2fs = tree(&fuse2fs.dir.join("tree"));
    fuse2fs.unmount();
    assert_eq!(via_fuse2fs, written, "the tree as fuse2fs reads it");
    let fsck = run(Command::new("e2fsck").args(["-f", "-n", p(&m.volume())]));
    assert_eq!(
        fsck.status.code(),
        Some(0),
        "e2fsck -f -n: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let plain = fs::read(m.volume()).unwrap();
    assert!(
        contains(&plain, marker.as_bytes()),
        "the marker is not in the decrypted volume"
    );
    assert_eq!(m.unmount().code(), Some(0));
    let stored = fs::read(&img).unwrap();
    assert!(
        !contains(&stored, marker.as_bytes()),
        "the marker is in the image in the clear"
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// Decrypt `count` sectors from sector `first` of the data segment of `img` with Python's
/// `cryptography` (OpenSSL's AES-XTS): the tweak is the sector's position in 512-byte units as
/// a 16-byte little-endian number (dm-crypt's plain64 without iv_large_sectors).
fn decrypt_independently(
    img: &Path,
    key_hex: &str,
    (data_offset, sector_size): (u64, usize),
    first: u64,
    count: u64,
    out: &Path,
) -> Vec<u8> {
    const SCRIPT: &str = r#"
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
img, key, offset, ss, first, count, out = sys.argv[1:]
key, offset, ss, first, count = bytes.fromhex(key), int(offset), int(ss), int(first), int(count)
with open(img, "rb") as f:
    f.seek(offset + first * ss)
    ct = f.read(count * ss)
plain = bytearray()
for i in range(count):
    tweak = ((first + i) * ss // 512).to_bytes(16, "little")
    d = Cipher(algorithms.AES(key), modes.XTS(tweak)).decryptor()
    plain += d.update(ct[i * ss:(i + 1) * ss]) + d.finalize()
with open(out, "wb") as f:
    f.write(plain)
"#;
    let numbers = [data_offset, sector_size as u64, first, count].map(|n| n.to_string());
    ok(
        run(Command::new(crate::common::python())
            .args(["-c", SCRIPT, p(img), key_hex])
            .args(&numbers)
            .arg(out)),
        "python3 AES-XTS",
    );
    fs::read(out).unwrap()
}

#[test]
fn bytes_written_through_the_file_decrypt_with_an_independent_aes_xts() {
    let dir = scratch("fuse_cli-xts");
    for (name, extra) in [("s4096", &[][..]), ("s512", &["--sector-size", "512"][..])] {
        let (img, key) = luks_image(&dir, name, 32, extra);
        let segment = segment(&img);
        let mp = mountpoint(&dir, &format!("mnt-{name}"));
        let data = random(1 << 20);
        let at = (3 << 20) + 1234;

        let m = Mounted::start(&img, &key, &mp, &[]);
        let mut f = OpenOptions::new().write(true).open(m.volume()).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(m.unmount().code(), Some(0));

        let out = ok(
            sc(&[
                "dump",
                "--dump-volume-key",
                "--json",
                "-q",
                "--key-file",
                p(&key),
                p(&img),
            ]),
            "dump --dump-volume-key",
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let key_hex = json["volume_key"].as_str().unwrap();
        let ss = segment.1 as u64;
        let first = at / ss;
        let count = (at + data.len() as u64).div_ceil(ss) - first;
        let plain = decrypt_independently(&img, key_hex, segment, first, count, &dir.join("plain"));
        let skip = (at - first * ss) as usize;
        assert!(
            plain[skip..skip + data.len()] == data[..],
            "{name}: what OpenSSL decrypts differs from what was written"
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_read_only_mount_refuses_writes_and_leaves_the_image_alone() {
    let dir = scratch("fuse_cli-ro");
    let (img, key) = luks_image(&dir, "ro", 32, &[]);
    let before = fs::read(&img).unwrap();
    let mp = mountpoint(&dir, "mnt");

    let m = Mounted::start(&img, &key, &mp, &["--readonly"]);
    let meta = fs::metadata(m.volume()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o400);
    let err = OpenOptions::new()
        .write(true)
        .open(m.volume())
        .expect_err("opening the volume of a read-only mount for writing");
    assert!(
        matches!(
            err.raw_os_error(),
            Some(30 /* EROFS */) | Some(1 /* EPERM */)
        ),
        "{err}"
    );
    // Reads still work.
    let mut head = [0u8; 4096];
    File::open(m.volume())
        .unwrap()
        .read_exact_at(&mut head, 8192)
        .unwrap();
    assert_eq!(m.unmount().code(), Some(0));
    assert!(fs::read(&img).unwrap() == before, "the image changed");
    fs::remove_dir_all(&dir).unwrap();
}

/// Run `cmd`, which must fail with `message` (part of) on stderr.
fn fails_with(cmd: &mut Command, message: &str) {
    let out = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(message),
        "{cmd:?} should fail with {message:?}: {stderr}"
    );
}

#[test]
fn the_volume_is_a_file_of_fixed_size() {
    let dir = scratch("fuse_cli-file");
    let (img, key) = luks_image(&dir, "file", 32, &[]);
    let mp = mountpoint(&dir, "mnt");
    let m = Mounted::start(&img, &key, &mp, &[]);
    let vol = m.volume();
    let size = fs::metadata(&vol).unwrap().len();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&vol)
        .unwrap();

    // Past the end: short reads and writes, then nothing / ENOSPC; the size never changes.
    let mut buf = [0u8; 100];
    assert_eq!(f.read_at(&mut buf, size - 10).unwrap(), 10);
    assert_eq!(f.read_at(&mut buf, size).unwrap(), 0);
    assert_eq!(f.write_at(&[1; 100], size - 10).unwrap(), 10);
    let err = f.write_at(&[1; 100], size).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(28 /* ENOSPC */), "{err}");
    f.set_len(size).unwrap();
    let err = f.set_len(size - 4096).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(1 /* EPERM */), "{err}");
    assert_eq!(fs::metadata(&vol).unwrap().len(), size);

    // A hole would have to read back as zeros: refused. A zeroed range is zeros.
    f.write_all_at(&[0xee; 20000], 100_000).unwrap();
    let range = ["-o", "102400", "-l", "8192"];
    fails_with(
        Command::new("fallocate")
            .arg("--punch-hole")
            .args(range)
            .arg(&vol),
        "supported",
    );
    ok(
        run(Command::new("fallocate")
            .arg("--zero-range")
            .args(range)
            .arg(&vol)),
        "fallocate --zero-range",
    );
    let mut back = vec![0u8; 20000];
    f.read_exact_at(&mut back, 100_000).unwrap();
    let mut want = vec![0xee; 20000];
    want[2400..2400 + 8192].fill(0);
    assert!(back == want, "fallocate --zero-range");
    drop(f);

    // Nothing else can live in the directory.
    let err = fs::write(mp.join("other"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(1 /* EPERM */), "{err}");
    let names: Vec<_> = fs::read_dir(&mp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["volume"]);
    assert_eq!(m.unmount().code(), Some(0));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_gets_cryptsetup_exit_codes_and_mounts_nothing() {
    let dir = scratch("fuse_cli-bad");
    let (img, key) = luks_image(&dir, "bad", 32, &[]);
    let before = fs::read(&img).unwrap();
    let wrong = dir.join("wrong.key");
    fs::write(&wrong, "not the passphrase").unwrap();
    let not_luks = dir.join("plain.img");
    fs::write(&not_luks, vec![0u8; 4 << 20]).unwrap();
    let empty = mountpoint(&dir, "empty");
    let full = mountpoint(&dir, "full");
    fs::write(full.join("something"), "x").unwrap();
    let file = dir.join("a-file");
    fs::write(&file, "x").unwrap();
    let missing = dir.join("missing");

    // What is wrong, DEVICE, key file, MOUNTPOINT, more options, the exit code.
    type Case<'a> = (&'a str, &'a Path, &'a Path, &'a Path, &'a [&'a str], i32);
    let cases: [Case; 6] = [
        ("wrong passphrase", &img, &wrong, &empty, &[], 2),
        ("missing mount point", &img, &key, &missing, &[], 4),
        ("not a LUKS file", &not_luks, &key, &empty, &[], 4),
        ("mount point not empty", &img, &key, &full, &[], 5),
        ("mount point a file", &img, &key, &file, &[], 5),
        (
            "discards asked for",
            &img,
            &key,
            &empty,
            &["--allow-discards"],
            1,
        ),
    ];
    for (what, img, key, mp, extra, code) in cases {
        let mut args = vec!["mount", p(img), p(mp), "--key-file", p(key)];
        args.extend_from_slice(extra);
        let out = sc_bounded(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
        assert_eq!(
            stderr.lines().count(),
            1,
            "{what}: one line on stderr: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        for path in [&empty, &full] {
            assert!(!is_mounted(path), "{what}: {path:?} is mounted");
        }
    }

    // A mount point that already has a mount on it.
    let m = Mounted::start(&img, &key, &empty, &[]);
    let out = sc_bounded(&["mount", p(&img), p(&empty), "--key-file", p(&key)]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "mounting twice: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(m.unmount().code(), Some(0));
    assert!(!is_mounted(&empty));
    assert!(fs::read(&img).unwrap() == before, "the image changed");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sigterm_and_sigint_unmount_flush_and_exit_zero() {
    let dir = scratch("fuse_cli-signal");
    let (img, key) = luks_image(&dir, "signal", 32, &[]);
    let mp = mountpoint(&dir, "mnt");
    for (i, signal) in ["TERM", "INT"].into_iter().enumerate() {
        let data = random(100_000);
        let at = 5_000_000 + 777 * i as u64;
        let mut m = Mounted::start(&img, &key, &mp, &[]);
        // Written and closed, not synced: the exit must flush it.
        OpenOptions::new()
            .write(true)
            .open(m.volume())
            .unwrap()
            .write_all_at(&data, at)
            .unwrap();
        m.signal(signal);
        let status = m.exit_status();
        assert_eq!(status.code(), Some(0), "SIG{signal}: {}", m.stderr());
        assert!(!is_mounted(&mp), "SIG{signal}: still mounted");
        drop(m);

        let m = Mounted::start(&img, &key, &mp, &["--readonly"]);
        let mut back = vec![0u8; data.len()];
        File::open(m.volume())
            .unwrap()
            .read_exact_at(&mut back, at)
            .unwrap();
        assert!(
            back == data,
            "SIG{signal}: the data written before it is lost"
        );
        assert_eq!(m.unmount().code(), Some(0));
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_signal_while_in_use_detaches_and_serves_until_the_last_user_goes() {
    let dir = scratch("fuse_cli-busy");
    let (img, key) = luks_image(&dir, "busy", 40, &[]);
    let mp = mountpoint(&dir, "mnt");
    let fsdir = dir.join("fs");
    let payload = random(1 << 20);

    let mut m = Mounted::start(&img, &key, &mp, &[]);
    ok(
        run(Command::new("mkfs.ext4").args(["-q", "-F", p(&m.volume())])),
        "mkfs.ext4",
    );
    let ext4 = Ext4::mount(&m.volume(), &fsdir);
    m.signal("TERM");
    // The notice follows the detach: wait for both.
    let deadline = Instant::now() + PATIENCE;
    while is_mounted(&mp) || !m.stderr().contains("in use") {
        assert!(
            Instant::now() < deadline,
            "no detach and notice after SIGTERM: {}",
            m.stderr()
        );
        sleep(Duration::from_millis(20));
    }
    assert!(m.still_running(), "exited while the volume is in use");
    // The file system on it still works, and what it writes now must reach the image.
    fs::write(fsdir.join("late.bin"), &payload).unwrap();
    ext4.unmount();
    assert_eq!(m.exit_status().code(), Some(0), "{}", m.stderr());
    drop(m);

    let m = Mounted::start(&img, &key, &mp, &[]);
    let fsck = run(Command::new("e2fsck").args(["-f", "-n", p(&m.volume())]));
    assert_eq!(fsck.status.code(), Some(0), "e2fsck after the detach");
    let ext4 = Ext4::mount(&m.volume(), &fsdir);
    assert!(fs::read(fsdir.join("late.bin")).unwrap() == payload);
    ext4.unmount();
    assert_eq!(m.unmount().code(), Some(0));
    fs::remove_dir_all(&dir).unwrap();
}
