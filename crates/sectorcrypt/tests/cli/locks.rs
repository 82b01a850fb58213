//! One writer per device: every process that may write a file, block device, flash image or
//! detached header holds an exclusive lock on it for as long as it has it open, a read-only
//! server a shared one, and header reads none. What is refused exits 5, names the holder and
//! changes nothing; a holder killed with SIGKILL leaves no lock behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sectorcrypt_testkit::kernel_oracle;

use crate::common::{ok, p, run, sc, sc_fast, scratch, with_fast_pbkdf, FAST_PBKDF};
use crate::fuse::{mountpoint, Mounted};
use crate::nbd::Served;

/// A 32 MiB LUKS2 volume `dir/NAME.img` (with a detached header `dir/NAME.hdr` if `detached`)
/// and its passphrase file.
fn volume(dir: &Path, name: &str, detached: bool) -> (PathBuf, Option<PathBuf>, PathBuf) {
    let img = dir.join(format!("{name}.img"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&key, format!("passphrase of {name}")).unwrap();
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let header = detached.then(|| dir.join(format!("{name}.hdr")));
    let mut args = vec!["format", "-q", "--key-file", p(&key)];
    if let Some(h) = &header {
        args.extend(["--header", p(h)]);
    }
    args.push(p(&img));
    ok(sc_fast(&args), "format");
    (img, header, key)
}

/// The bytes of every file in `dir` (to prove that a refused command changed nothing and made
/// nothing).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|f| f.is_file() && f.extension().is_some_and(|e| e == "img" || e == "hdr"))
        .map(|f| {
            let bytes = std::fs::read(&f).unwrap();
            (f, bytes)
        })
        .collect();
    files.sort();
    files
}

/// `sectorcrypt ARGS` must exit 5 in one line naming one of the processes `holders` as the
/// one holding the device.
fn refused(args: &[&str], holders: &[u32]) {
    let out = sc(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{args:?}: {err}");
    assert!(
        err.lines().count() == 1
            && err.contains("is in use by another process")
            && holders.iter().any(|h| err.contains(&format!("(pid {h}:"))),
        "{args:?}: {err}"
    );
}

/// Every kind of writer on `img` (header `header` if detached), while `holder` holds it: a new
/// encryption, format, add-key and header-restore all exit 5, and no byte of any image or header
/// in `dir` changes, no file appears.
fn every_writer_is_refused(dir: &Path, img: &Path, header: Option<&Path>, key: &Path, holder: u32) {
    let backup = dir.join("backup.bak");
    let _ = std::fs::remove_file(&backup);
    let target = header.unwrap_or(img);
    // A header backup is a read: it works beside a writer, as cryptsetup's does.
    ok(
        sc(&[
            "header-backup",
            p(target),
            "--header-backup-file",
            p(&backup),
        ]),
        "header-backup beside a writer",
    );
    let before = snapshot(dir);
    let fast: Vec<&str> = FAST_PBKDF.to_vec();
    // ARGS [--header HEADER] IMG AFTER...
    let with_header = |args: &[&str], after: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if let Some(h) = header {
            v.extend(["--header".to_string(), p(h).to_string()]);
        }
        v.push(p(img).to_string());
        v.extend(after.iter().map(|a| a.to_string()));
        v
    };
    let new_header = dir.join("new-header.hdr");
    // (`reencrypt` and `decrypt` beside a server run in it, online: `serve_converting.rs`.)
    let mut commands: Vec<Vec<String>> = vec![
        with_header(
            &[&["format", "-q", "--key-file", p(key)][..], &fast].concat(),
            &[],
        ),
        with_header(
            &[&["add-key", "--key-file", p(key)][..], &fast].concat(),
            &[p(key)],
        ),
    ];
    commands.push(
        [
            vec![
                "encrypt",
                "-q",
                "--key-file",
                p(key),
                "--header",
                p(&new_header),
                p(img),
            ],
            fast.clone(),
        ]
        .concat()
        .iter()
        .map(|s| s.to_string())
        .collect(),
    );
    commands.push(vec![
        "header-restore".into(),
        "-q".into(),
        p(target).into(),
        "--header-backup-file".into(),
        p(&backup).into(),
    ]);
    for args in &commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, &[holder]);
    }
    assert!(!new_header.exists(), "a refused command made a header file");
    assert!(before == snapshot(dir), "a refused command changed a byte");
    // Reads of the header coexist with the writer.
    for args in [
        vec!["dump", p(target)],
        vec!["is-luks", p(target)],
        vec!["uuid", p(target)],
    ] {
        ok(sc(&args), "a header read beside a writer");
    }
    let mut test = vec!["test-passphrase", "--key-file", p(key)];
    if let Some(h) = header {
        test.extend(["--header", p(h)]);
    }
    test.push(p(img));
    ok(sc(&test), "test-passphrase beside a writer");
}

/// A key rotation of `img` (with its detached `header`) runs at once, its holder just killed with
/// SIGKILL: the kernel dropped the lock with the process.
fn reencrypts_at_once(img: &Path, header: Option<&Path>, key: &Path) {
    let mut args = vec!["reencrypt", "-q", "--key-file", p(key)];
    if let Some(h) = header {
        args.extend(["--header", p(h)]);
    }
    args.push(p(img));
    ok(
        sc_fast(&args),
        "reencrypt at once after the holder's SIGKILL",
    );
}

/// fio through the export: 4 KiB random writes over 16 MiB with crc32c checksums, then (or,
/// with `verify_only`, only) the verify pass.
fn fio(dir: &Path, uri: &str, verify_only: bool) -> std::process::Child {
    let job = dir.join("verify.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\nioengine=nbd\nuri={uri}\nrw=randwrite\nbs=4k\nsize=16m\n\
             verify=crc32c\nverify_fatal=1\nrandrepeat=1\nrandseed=7\n\
             verify_state_save=0\n{}\n[w]\n",
            if verify_only { "verify_only=1" } else { "" }
        ),
    )
    .unwrap();
    Command::new("fio")
        .arg("--output-format=normal")
        .arg(&job)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio")
}

fn fio_clean(child: std::process::Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("err= 0") && !text.contains("verify:"),
        "{what}: {text}"
    );
}

/// The reported case: a key rotation started beside a server that a client writes through runs
/// in the server (online) and fio's checksums stay clean through it; every other writer is
/// refused (exit 5, nothing changed);
/// a second server is refused, and so is a read-only one (it would serve data a writer changes
/// underneath); once the server is killed with SIGKILL, the rotation starts at once and the
/// data fio wrote reads back under the new key.
#[test]
fn a_served_file_refuses_every_other_writer_and_fio_verifies_clean() {
    let dir = scratch("locks-serve");
    let (img, _, key) = volume(&dir, "v", false);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    every_writer_is_refused(&dir, &img, None, &key, server.pid());
    // The key rotation the report started beside the server now runs in it, online, while fio
    // writes and verifies.
    let writer = fio(&dir, &server.uri, false);
    ok(
        sc(&with_fast_pbkdf(&[
            "reencrypt",
            "-q",
            "--key-file",
            p(&key),
            p(&img),
        ])),
        "reencrypt beside the server (online)",
    );
    fio_clean(writer, "fio write and verify beside an online reencryption");
    for extra in [&[][..], &["--readonly"][..]] {
        let sock = dir.join("second.sock");
        let serve = [
            "serve",
            p(&img),
            "--key-file",
            p(&key),
            "--socket",
            p(&sock),
        ];
        refused(&[&serve[..], extra].concat(), &[server.pid()]);
    }
    // Key Per I/O's server writes the store too.
    let table = dir.join("keys.bin");
    std::fs::write(&table, [0x11u8; 64]).unwrap();
    let sock = dir.join("k.sock");
    refused(
        &[
            "kpio",
            "serve",
            p(&img),
            "--key-table",
            p(&table),
            "--socket",
            p(&sock),
        ],
        &[server.pid()],
    );
    server.kill();
    reencrypts_at_once(&img, None, &key);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    fio_clean(
        fio(&dir, &server.uri, true),
        "fio verify after the rotation",
    );
    server.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A detached header in use is locked with its data: a server on HEADER + DATA refuses every
/// writer named by either, and `format --header HEADER` of another device too.
#[test]
fn a_detached_header_in_use_is_locked_with_its_data() {
    let dir = scratch("locks-detached");
    let (img, header, key) = volume(&dir, "d", true);
    let header = header.unwrap();
    let server = Served::unix(&dir, "s.sock", &img, &key, &["--header", p(&header)]);
    every_writer_is_refused(&dir, &img, Some(&header), &key, server.pid());
    // The header alone, with another data device.
    let other = dir.join("other.img");
    std::fs::File::create(&other)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let before = snapshot(&dir);
    refused(
        &with_fast_pbkdf(&[
            "format",
            "-q",
            "--key-file",
            p(&key),
            "--header",
            p(&header),
            p(&other),
        ]),
        &[server.pid()],
    );
    assert!(before == snapshot(&dir));
    server.kill();
    reencrypts_at_once(&img, Some(&header), &key);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Readers share: two read-only servers of one file run side by side, header commands run
/// beside them, and a writer is refused while either serves (a conversion would change the
/// data they serve). `--disable-locks` lets a writer through, with a warning.
#[test]
fn read_only_servers_share_and_keep_writers_out_unless_locks_are_disabled() {
    let dir = scratch("locks-readers");
    let (img, _, key) = volume(&dir, "r", false);
    let first = Served::unix(&dir, "a.sock", &img, &key, &["--readonly"]);
    let second = Served::unix(&dir, "b.sock", &img, &key, &["--readonly"]);
    ok(sc(&["dump", p(&img)]), "dump beside readers");
    let before = snapshot(&dir);
    let readers = [first.pid(), second.pid()];
    refused(
        &with_fast_pbkdf(&["reencrypt", "-q", "--key-file", p(&key), p(&img)]),
        &readers,
    );
    let sock = dir.join("w.sock");
    refused(
        &[
            "serve",
            p(&img),
            "--key-file",
            p(&key),
            "--socket",
            p(&sock),
        ],
        &readers,
    );
    assert!(before == snapshot(&dir));
    // The user who knows better: a new passphrase beside the readers (not the data).
    let extra = dir.join("extra.key");
    std::fs::write(&extra, b"another passphrase").unwrap();
    let out = sc_fast(&[
        "add-key",
        "--disable-locks",
        "--key-file",
        p(&key),
        p(&img),
        p(&extra),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("WARNING: locking is disabled"), "{err}");
    ok(
        sc(&["test-passphrase", "--key-file", p(&extra), p(&img)]),
        "the key added with --disable-locks",
    );
    first.stop();
    second.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `mount` holds its device as `serve` does; killed with SIGKILL, it lets go at once (the stale
/// FUSE mount point aside, which `fusermount3 -u` clears).
#[test]
fn a_mounted_file_refuses_every_other_writer_until_the_mount_is_killed() {
    let dir = scratch("locks-mount");
    let (img, _, key) = volume(&dir, "m", false);
    let mnt = mountpoint(&dir, "mnt");
    let mounted = Mounted::start(&img, &key, &mnt, &[]);
    let data = sectorcrypt_testkit::pattern(1 << 20, 5);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(mounted.volume())
            .unwrap();
        f.write_all_at(&data, 4096).unwrap();
        f.sync_all().unwrap();
    }
    every_writer_is_refused(&dir, &img, None, &key, mounted.pid());
    let second = mountpoint(&dir, "second");
    refused(
        &["mount", p(&img), p(&second), "--key-file", p(&key)],
        &[mounted.pid()],
    );
    mounted.signal("KILL");
    let _ = run(Command::new("fusermount3").arg("-u").arg(&mnt));
    reencrypts_at_once(&img, None, &key);
    let mounted = Mounted::start(&img, &key, &mnt, &["--readonly"]);
    let back = std::fs::read(mounted.volume()).unwrap();
    assert!(
        back[4096..4096 + data.len()] == data[..],
        "the data under the new key"
    );
    mounted.unmount();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `flash attach` holds the chip image: the flash writers (a new volume, a key change, a
/// conversion, a second attach) exit 5 and change nothing; `dump` reads its header beside it;
/// once attach is killed with SIGKILL, a new volume is made at once.
#[test]
fn an_attached_flash_refuses_every_other_writer() {
    let dir = scratch("locks-flash");
    let (img, key) = crate::flash::new_flash(&dir, &[]);
    let (img_arg, key_arg) = (p(&img).to_string(), p(&key).to_string());
    let mkvol = |name: &'static str| {
        [
            "flash",
            "mkvol",
            &img_arg,
            "-N",
            name,
            "-S",
            "2",
            "--key-file",
            &key_arg,
        ]
        .map(str::to_string)
    };
    let sc_owned = |args: &[String]| sc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    ok(sc_owned(&mkvol("data")), "mkvol");
    // Its volumes as files only (FUSE): what holds the chip is the same with NBD exports.
    let mnt = mountpoint(&dir, "mnt");
    let attach = ["flash", "attach", p(&img), p(&mnt), "--key-file", p(&key)];
    let attached = Mounted::spawn(&attach, &mnt);
    let holder = [attached.pid()];
    let before = snapshot(&dir);
    refused(&mkvol("more").each_ref().map(String::as_str), &holder);
    refused(
        &with_fast_pbkdf(&["add-key", "--key-file", p(&key), p(&img), p(&key)]),
        &holder,
    );
    refused(
        &[
            "flash",
            "convert",
            "--decrypt",
            p(&img),
            "--key-file",
            p(&key),
            "-q",
        ],
        &holder,
    );
    let second = mountpoint(&dir, "second");
    let mut again = attach.to_vec();
    again[3] = p(&second);
    refused(&again, &holder);
    assert!(
        before == snapshot(&dir),
        "a refused command changed the chip"
    );
    ok(sc(&["dump", p(&img)]), "dump beside the attach");
    attached.signal("KILL");
    let _ = run(Command::new("fusermount3").arg("-u").arg(&mnt));
    ok(
        sc_owned(&mkvol("more")),
        "mkvol at once after the attach's SIGKILL",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A block device (a loop device in the kernel oracle, whose kernel is the same on every host):
/// a server holds it, a key addition exits 5 and changes no byte of it, a rotation runs in the
/// server (online), and once the server is killed with SIGKILL a rotation runs offline.
#[test]
fn a_served_block_device_refuses_other_writers() {
    let dir = scratch("locks-blockdev");
    let script = dir.join("blockdev.sh");
    let bin = env!("CARGO_BIN_EXE_sectorcrypt");
    std::fs::write(
        &script,
        format!(
            r#"set -u
B={bin}
F="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
modprobe loop
printf 'block passphrase' >/tmp/key
truncate -s 32M /tmp/v.img
dev=$(losetup -f --show /tmp/v.img)
$B format -q $F --key-file /tmp/key "$dev" || exit 10
$B serve "$dev" --key-file /tmp/key --socket /tmp/s.sock 2>/tmp/serve.log &
server=$!
while ! grep -q serving /tmp/serve.log; do kill -0 $server || {{ cat /tmp/serve.log; exit 11; }}; sleep 0.1; done
echo "server $server"
before=$(sha256sum <"$dev")
$B add-key $F --key-file /tmp/key "$dev" /tmp/key; echo "add-key $?"
[ "$before" = "$(sha256sum <"$dev")" ] && echo unchanged
$B reencrypt -q $F --key-file /tmp/key "$dev"; echo "online $?"
grep -q "the conversion is finished" /tmp/serve.log && echo "in the server"
kill -9 $server; wait $server
$B reencrypt -q $F --key-file /tmp/key "$dev"; echo "after-kill $?"
"#
        ),
    )
    .unwrap();
    let out = kernel_oracle::run(&dir, &script, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = text
        .lines()
        .find_map(|l| l.strip_prefix("server "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        text.matches(&format!("is in use by another process (pid {pid}:"))
            .count()
            == 1,
        "{text}"
    );
    for line in [
        "add-key 5",
        "unchanged",
        "online 0",
        "in the server",
        "after-kill 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}: {text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
