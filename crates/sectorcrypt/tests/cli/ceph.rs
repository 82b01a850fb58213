//! The project's own Ceph test cluster (`scripts/ceph-cluster.sh`, issue 16) against the real
//! Ceph tools: it starts one monitor and one OSD, serves `rbd`, refuses a second start in the
//! same directory and stops exactly the daemons it started. On it, `sectorcrypt serve rbd:...`
//! writes a volume that librbd's own LUKS2 encryption reads back (python3-rbd's
//! `encryption_load`); a second writer is refused, a read-only server coexists.

use std::path::Path;
use std::process::Command;

use sectorcrypt_testkit::luks2_json::require_unknown;
use sectorcrypt_testkit::pattern;

use crate::common::{ok, p, run, sc, scratch};
use crate::nbd::{serve_refused, tool, write_file, Served, MIB};

pub(crate) fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh")
}

/// The daemons' pids from the cluster's pid files.
fn daemon_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir.join("run"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
                .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Argon2id at forced costs for the images made here (a calibrated one would cost what this
/// host's speed says), with librbd's 64 MiB of memory.
pub(crate) const FAST: [&str; 6] = [
    "--pbkdf",
    "argon2id",
    "--pbkdf-force-iterations",
    "4",
    "--pbkdf-memory",
    "65536",
];

/// A running cluster, stopped on drop.
pub(crate) struct Cluster {
    dir: std::path::PathBuf,
    pub(crate) conf: String,
}

impl Cluster {
    pub(crate) fn start(dir: &Path, port: u16) -> Cluster {
        let out = ok(
            run(Command::new("bash").args([p(&script()), "start", p(dir), &port.to_string()])),
            "ceph-cluster.sh start",
        );
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let conf = line
            .strip_prefix("export CEPH_CONF=")
            .unwrap_or_else(|| panic!("no CEPH_CONF line: {line:?}"))
            .to_string();
        Cluster {
            dir: dir.to_path_buf(),
            conf,
        }
    }

    pub(crate) fn rbd(&self, args: &[&str]) -> std::process::Output {
        ok(
            run(Command::new("rbd").args(["--conf", &self.conf]).args(args)),
            &format!("rbd {args:?}"),
        )
    }

    /// How many of `image`'s data objects exist in the pool `rbd` (one per 4 MiB written to).
    pub(crate) fn data_objects(&self, image: &str) -> usize {
        let info = self.rbd(&["info", &format!("rbd/{image}")]);
        let info = String::from_utf8_lossy(&info.stdout);
        let prefix = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("block_name_prefix: "))
            .unwrap_or_else(|| panic!("no block_name_prefix in {info}"))
            .to_string();
        let list = ok(
            run(Command::new("rados").args(["--conf", &self.conf, "-p", "rbd", "ls"])),
            "rados ls",
        );
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .filter(|o| o.starts_with(&prefix))
            .count()
    }

    /// `ceph-cluster.sh osd-kill` or `osd-start`: the OSD dies as in a crash, or comes back.
    pub(crate) fn osd(&self, what: &str) {
        ok(
            run(Command::new("bash").args([p(&script()), what, p(&self.dir)])),
            &format!("ceph-cluster.sh {what}"),
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run(Command::new("bash").args([p(&script()), "stop", p(&self.dir)]));
    }
}

#[test]
fn the_test_cluster_serves_rbd_and_librbd_reads_a_volume_made_here() {
    let dir = scratch("ceph");
    let cluster_dir = dir.join("cluster");
    let cluster = Cluster::start(&cluster_dir, 3390);
    let pids = daemon_pids(&cluster_dir);
    assert_eq!(pids.len(), 2, "one monitor and one OSD");
    for pid in &pids {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert!(
            comm.starts_with("ceph-mon") || comm.starts_with("ceph-osd"),
            "{comm}"
        );
    }
    let status = run(Command::new("bash").args([p(&script()), "status", p(&cluster_dir)]));
    assert!(status.status.success(), "status of a running cluster");
    // A second start in the same directory is refused (busy) and leaves the first one running.
    let again = run(Command::new("bash").args([p(&script()), "start", p(&cluster_dir), "3391"]));
    assert_eq!(
        again.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(daemon_pids(&cluster_dir).len(), 2);

    // A LUKS2 volume formatted by sectorcrypt (librbd's own data offset, 16 MiB, and sector
    // size, 4096), imported into RBD, then written through `sectorcrypt serve rbd:...`, reads
    // back through librbd's encryption.
    let key = dir.join("pass");
    write_file(&key, b"rbd interop passphrase");
    let img = dir.join("vol.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(48 * MIB)
        .unwrap();
    ok(
        sc(&[
            &["format", "-q", "--type", "luks2"][..],
            &FAST,
            &["--sector-size", "4096", "--key-file", p(&key), p(&img)],
        ]
        .concat()),
        "format",
    );
    cluster.rbd(&["import", "--no-progress", p(&img), "rbd/scvol"]);
    let data = pattern(4 * MIB as usize, 16);
    let src = dir.join("data.raw");
    write_file(&src, &data);
    let conf = ["--ceph-conf", cluster.conf.as_str()];
    let server = Served::unix(&dir, "w.sock", Path::new("rbd:rbd/scvol"), &key, &conf);
    assert_eq!(server.size, 32 * MIB, "48 MiB less the 16 MiB data offset");
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            &format!("write -s {} {} {}", p(&src), MIB, 4 * MIB),
            &server.uri,
        ],
    );
    // A second writer is refused (busy); a read-only server coexists and sees the data.
    let second = run(Command::new(env!("CARGO_BIN_EXE_sectorcrypt")).args([
        "serve",
        "rbd:rbd/scvol",
        "--ceph-conf",
        &cluster.conf,
        "--key-file",
        p(&key),
        "--socket",
        p(&dir.join("x.sock")),
    ]));
    assert_eq!(
        second.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let mut ro = conf.to_vec();
    ro.push("--readonly");
    let reader = Served::unix(&dir, "r.sock", Path::new("rbd:rbd/scvol"), &key, &ro);
    let seen = dir.join("seen.raw");
    tool("nbdcopy", &[&reader.uri, p(&seen)]);
    assert!(std::fs::read(&seen).unwrap()[MIB as usize..5 * MIB as usize] == data[..]);
    reader.stop();
    server.stop();
    const READ: &str = r#"
import sys, rados, rbd
conf, key, offset, length, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
with rados.Rados(conffile=conf) as cluster, cluster.open_ioctx("rbd") as io, rbd.Image(io, "scvol") as image:
    image.encryption_load(rbd.RBD_ENCRYPTION_FORMAT_LUKS2, open(key, "rb").read())
    print(image.size())
    open(out, "wb").write(image.read(offset, length))
"#;
    let out = dir.join("librbd.raw");
    // Debian's own Python: python3-rbd is installed for it, whatever python3 is first on PATH.
    let res = ok(
        run(Command::new("/usr/bin/python3").args([
            "-c",
            READ,
            &cluster.conf,
            p(&key),
            &MIB.to_string(),
            &(4 * MIB).to_string(),
            p(&out),
        ])),
        "python3-rbd encryption_load",
    );
    let size: u64 = String::from_utf8_lossy(&res.stdout).trim().parse().unwrap();
    assert_eq!(size, 32 * MIB, "48 MiB less librbd's 16 MiB data offset");
    assert!(
        std::fs::read(&out).unwrap() == data,
        "librbd decrypts what sectorcrypt wrote"
    );

    // Stopping ends exactly the daemons the script started, and nothing is left running.
    drop(cluster);
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "daemon {pid} still runs"
        );
    }
    assert!(daemon_pids(&cluster_dir).is_empty(), "pid files removed");
    let status = run(Command::new("bash").args([p(&script()), "status", p(&cluster_dir)]));
    assert!(
        !status.status.success(),
        "a stopped cluster does not answer"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Run Debian's Python (python3-rbd is installed for it, whatever python3 is first on PATH)
/// with `script` and `args`.
pub(crate) fn librbd(script: &str, args: &[&str]) -> std::process::Output {
    ok(
        run(Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(script)
            .args(args)),
        "python3-rbd",
    )
}

/// `length` bytes at `offset` of image `image`, read through librbd's LUKS2 encryption with the
/// passphrase in `key`, into `out`.
pub(crate) const LIBRBD_READ: &str = r#"
import sys, rados, rbd
conf, image, key, offset, length, out = sys.argv[1:7]
with rados.Rados(conffile=conf) as c, c.open_ioctx("rbd") as io, rbd.Image(io, image) as im:
    im.encryption_load(rbd.RBD_ENCRYPTION_FORMAT_LUKS2, open(key, "rb").read())
    open(out, "wb").write(im.read(int(offset), int(length)))
"#;

#[test]
fn every_header_command_and_reencryption_work_on_rbd_images() {
    let dir = scratch("ceph-commands");
    let cluster = Cluster::start(&dir.join("cluster"), 3394);
    let conf = cluster.conf.clone();
    let with_conf = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        v.extend(["--ceph-conf".to_string(), conf.clone()]);
        v
    };
    let sc_rbd = |args: &[&str]| {
        let v = with_conf(args);
        sc(&v.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let key = dir.join("pass");
    write_file(&key, b"first passphrase");
    let key2 = dir.join("pass2");
    write_file(&key2, b"second passphrase");
    cluster.rbd(&["create", "--size", "48M", "rbd/cmd"]);
    let fast = FAST;

    // format and add-key on the image itself; dump as cryptsetup dumps the exported image.
    let mut args = vec!["format", "-q", "--type", "luks2", "--key-file", p(&key)];
    args.extend(fast);
    args.push("rbd:rbd/cmd");
    ok(sc_rbd(&args), "format rbd:");
    let mut args = vec!["add-key", "--key-file", p(&key)];
    args.extend(fast);
    args.extend(["rbd:rbd/cmd", p(&key2)]);
    ok(sc_rbd(&args), "add-key rbd:");
    let exported = dir.join("exported.raw");
    cluster.rbd(&["export", "--no-progress", "rbd/cmd", p(&exported)]);
    let dump = ok(sc_rbd(&["dump", "rbd:rbd/cmd"]), "dump rbd:");
    let theirs = crate::common::cs(&["luksDump", p(&exported)]);
    assert_eq!(
        dump.stdout, theirs.stdout,
        "dump equals cryptsetup's luksDump of the export"
    );
    let opens = crate::common::cs(&[
        "open",
        "--test-passphrase",
        "--key-file",
        p(&key2),
        p(&exported),
    ]);
    assert!(
        opens.status.success(),
        "cryptsetup opens the export with the added passphrase"
    );
    assert_eq!(
        sc_rbd(&[
            "test-passphrase",
            "--key-file",
            p(&dir.join("pass")),
            "rbd:rbd/cmd"
        ])
        .status
        .code(),
        Some(0)
    );
    let wrong = dir.join("wrong");
    write_file(&wrong, b"not it");
    assert_eq!(
        sc_rbd(&["test-passphrase", "--key-file", p(&wrong), "rbd:rbd/cmd"])
            .status
            .code(),
        Some(2)
    );
    let backup = dir.join("backup.img");
    ok(
        sc_rbd(&[
            "header-backup",
            "rbd:rbd/cmd",
            "--header-backup-file",
            p(&backup),
        ]),
        "header-backup rbd:",
    );
    assert!(crate::common::cs(&["isLuks", p(&backup)]).status.success());
    // The second passphrase's slot killed, then the backup restored: it opens again.
    ok(
        sc_rbd(&["kill-slot", "-q", "--key-file", p(&key), "rbd:rbd/cmd", "1"]),
        "kill-slot rbd:",
    );
    let opens_with_second = || {
        sc_rbd(&["test-passphrase", "--key-file", p(&key2), "rbd:rbd/cmd"])
            .status
            .code()
    };
    assert_eq!(opens_with_second(), Some(2), "slot 1 is gone");
    ok(
        sc_rbd(&[
            "header-restore",
            "-q",
            "rbd:rbd/cmd",
            "--header-backup-file",
            p(&backup),
        ]),
        "header-restore rbd:",
    );
    assert_eq!(
        opens_with_second(),
        Some(0),
        "the restored header has slot 1"
    );
    assert_eq!(sc_rbd(&["dump", "rbd:rbd/none"]).status.code(), Some(4));
    assert_eq!(sc_rbd(&["dump", "rbd:nonsense"]).status.code(), Some(1));

    // A copy whose header names a mandatory requirement this tool does not know: dumped, but
    // neither written nor served, as cryptsetup treats it.
    let copy = dir.join("requirement.raw");
    cluster.rbd(&["export", "--no-progress", "rbd/cmd", p(&copy)]);
    let mut bytes = std::fs::read(&copy).unwrap();
    require_unknown(&mut bytes, "x-future-feature");
    write_file(&copy, &bytes);
    cluster.rbd(&["import", "--no-progress", p(&copy), "rbd/req"]);
    let dump = ok(
        sc_rbd(&["dump", "rbd:rbd/req"]),
        "dump rbd: with a requirement",
    );
    assert!(String::from_utf8_lossy(&dump.stdout).contains("x-future-feature"));
    let writers: [&[&str]; 3] = [
        &["add-key", "--key-file", p(&key), "rbd:rbd/req", p(&key2)],
        &["config", "--label", "x", "rbd:rbd/req"],
        &["reencrypt", "-q", "--key-file", p(&key), "rbd:rbd/req"],
    ];
    for args in writers {
        let out = sc_rbd(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("requirement"), "{args:?}: {err}");
    }
    let (code, err) = serve_refused(&[
        "rbd:rbd/req",
        "--readonly",
        "--key-file",
        p(&key),
        "--socket",
        p(&dir.join("req.sock")),
        "--ceph-conf",
        &conf,
    ]);
    assert_eq!(code, Some(1), "serve: {err}");
    assert!(err.contains("requirement"), "serve: {err}");
    let after = dir.join("requirement-after.raw");
    cluster.rbd(&["export", "--no-progress", "rbd/req", p(&after)]);
    assert!(
        std::fs::read(&after).unwrap() == bytes,
        "nothing was written"
    );

    // Data written through serve, then the volume key rotated in place: librbd reads the data
    // with the new key.
    let data = pattern(4 * MIB as usize, 17);
    let src = dir.join("data.raw");
    write_file(&src, &data);
    let server = Served::unix(
        &dir,
        "c.sock",
        Path::new("rbd:rbd/cmd"),
        &key,
        &["--ceph-conf", &conf],
    );
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            &format!("write -s {} 0 {}", p(&src), 4 * MIB),
            &server.uri,
        ],
    );
    server.stop();
    // The passphrase added here unlocks in librbd, which reads the data written through serve.
    let out = dir.join("before.raw");
    librbd(
        LIBRBD_READ,
        &[&conf, "cmd", p(&key2), "0", &(4 * MIB).to_string(), p(&out)],
    );
    assert!(
        std::fs::read(&out).unwrap() == data,
        "librbd, unlocked with the passphrase added here, reads what serve wrote"
    );
    let volume_key = || {
        crate::common::our_volume_key_with(Path::new("rbd:rbd/cmd"), &key, &["--ceph-conf", &conf])
    };
    let before = volume_key();
    let mut args = vec!["reencrypt", "-q", "--key-file", p(&key)];
    args.extend(fast);
    args.push("rbd:rbd/cmd");
    ok(sc_rbd(&args), "reencrypt rbd:");
    assert_ne!(volume_key(), before, "a new volume key");
    let out = dir.join("after.raw");
    librbd(
        LIBRBD_READ,
        &[&conf, "cmd", p(&key), "0", &(4 * MIB).to_string(), p(&out)],
    );
    assert!(
        std::fs::read(&out).unwrap() == data,
        "librbd reads the re-encrypted data"
    );
    // And online: the same command beside a server of the image runs in the server.
    let before = volume_key();
    let server = Served::unix(
        &dir,
        "c.sock",
        Path::new("rbd:rbd/cmd"),
        &key,
        &["--ceph-conf", &conf],
    );
    ok(sc_rbd(&args), "reencrypt rbd: while it is served");
    assert!(
        server.stderr().contains("the conversion is finished"),
        "the server ran it: {}",
        server.stderr()
    );
    server.stop();
    assert_ne!(volume_key(), before, "a new volume key, online");
    librbd(
        LIBRBD_READ,
        &[&conf, "cmd", p(&key), "0", &(4 * MIB).to_string(), p(&out)],
    );
    assert!(
        std::fs::read(&out).unwrap() == data,
        "librbd reads the data re-encrypted online"
    );

    // benchmark --device on the image: the same requests through librbd raw and decrypted.
    let bench = ok(
        sc_rbd(&[
            "benchmark",
            "--device",
            "rbd:rbd/cmd",
            "--key-file",
            p(&key),
            "--io-size",
            "64K",
            "--io-total",
            "4M",
            "--json",
        ]),
        "benchmark --device rbd:",
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&bench.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for (line, path) in lines.iter().zip(["raw", "volume"]) {
        assert_eq!(
            (line["path"].as_str(), line["ops"].as_u64()),
            (Some(path), Some(64))
        );
        assert_eq!(line["device"], "rbd:rbd/cmd");
    }

    // Tokens on an RBD image as on a file: a TPM2 token enrolled on the image opens it.
    let tpm = crate::tokens::Swtpm::start(&dir);
    let enrolled = sc_rbd(&[
        "enroll",
        "--key-file",
        p(&key),
        "--tpm2-device",
        &tpm.tcti,
        "--tpm2-pcrs",
        "7",
        "rbd:rbd/cmd",
    ]);
    ok(enrolled, "enroll on rbd:");
    let by_token = sc_rbd(&[
        "test-passphrase",
        "--token-only",
        "--tpm2-device",
        &tpm.tcti,
        "rbd:rbd/cmd",
    ]);
    let err = String::from_utf8_lossy(&by_token.stderr);
    assert!(
        by_token.status.success() && err.contains("unlocked"),
        "by token on rbd: {err}"
    );
    drop(tpm);

    // mount: what is written to MOUNTPOINT/volume reaches the image; librbd reads it.
    let mnt = crate::fuse::mountpoint(&dir, "mnt");
    let mounted = crate::fuse::Mounted::spawn(
        &[
            "mount",
            "rbd:rbd/cmd",
            p(&mnt),
            "--key-file",
            p(&key),
            "--ceph-conf",
            &conf,
        ],
        &mnt,
    );
    let more = pattern(MIB as usize, 18);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(mounted.volume())
            .unwrap();
        f.write_all_at(&more, 8 * MIB).unwrap();
        f.sync_all().unwrap();
    }
    assert!(mounted.unmount().success(), "mount exits 0");
    librbd(
        LIBRBD_READ,
        &[
            &conf,
            "cmd",
            p(&key),
            &(8 * MIB).to_string(),
            &MIB.to_string(),
            p(&out),
        ],
    );
    assert!(
        std::fs::read(&out).unwrap() == more,
        "librbd reads what was written through the mount"
    );

    // kpio serve on an RBD image: what a tag's export writes is that key's ciphertext in the
    // image (Python's `cryptography` decrypts the rbd export).
    cluster.rbd(&["create", "--size", "16M", "rbd/kpio"]);
    let (key1, key2) = (pattern(64, 10), pattern(64, 11));
    let table = dir.join("keys.bin");
    write_file(&table, &[key1.clone(), key2].concat());
    let kpio = Served::start_command(
        &dir,
        &["kpio", "serve"],
        &[
            "rbd:rbd/kpio",
            "--key-table",
            p(&table),
            "--socket",
            p(&dir.join("k.sock")),
            "--ceph-conf",
            &conf,
        ],
    );
    assert_eq!(kpio.size, 16 * MIB);
    let tagged = pattern(256 * 1024, 12);
    let tagged_file = dir.join("tagged.raw");
    write_file(&tagged_file, &tagged);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            &format!("write -s {} {} {}", p(&tagged_file), MIB, 256 * 1024),
            &format!("nbd+unix:///0?socket={}", p(&dir.join("k.sock"))),
        ],
    );
    kpio.stop();
    let kpio_raw = dir.join("kpio.raw");
    cluster.rbd(&["export", "--no-progress", "rbd/kpio", p(&kpio_raw)]);
    let key1_hex: String = key1.iter().map(|b| format!("{b:02x}")).collect();
    let seen = crate::nbd::python_decrypt(&dir, &kpio_raw, 0, 512, &key1_hex, MIB, 256 * 1024);
    assert!(
        seen == tagged,
        "tag 0's key decrypts what its export wrote to the image"
    );

    // Encryption in place, the data shifted to make room for the header: librbd reads the
    // original; decryption in place (the header exported to a file) brings it back at 0.
    let plain = pattern(32 * MIB as usize, 19);
    let plain_file = dir.join("plain.raw");
    write_file(&plain_file, &plain);
    cluster.rbd(&["import", "--no-progress", p(&plain_file), "rbd/plain"]);
    let mut args = vec![
        "encrypt",
        "rbd:rbd/plain",
        "--reduce-device-size",
        "16M",
        "--key-file",
        p(&key),
    ];
    args.extend(fast);
    ok(sc_rbd(&args), "encrypt rbd: in place");
    let kept = 16 * MIB as usize;
    librbd(
        LIBRBD_READ,
        &[&conf, "plain", p(&key), "0", &kept.to_string(), p(&out)],
    );
    assert!(
        std::fs::read(&out).unwrap() == plain[..kept],
        "librbd reads the data encrypted in place"
    );
    let exported_hdr = dir.join("exported.hdr");
    ok(
        sc_rbd(&[
            "decrypt",
            "rbd:rbd/plain",
            "--header",
            p(&exported_hdr),
            "--key-file",
            p(&key),
        ]),
        "decrypt rbd: in place",
    );
    let back = dir.join("plain-back.raw");
    cluster.rbd(&["export", "--no-progress", "rbd/plain", p(&back)]);
    assert!(
        std::fs::read(&back).unwrap()[..kept] == plain[..kept],
        "decrypted back to the original at offset 0"
    );

    // librbd's layout: data aligned to the object size. LUKS1 starts at 4 MiB (cryptsetup's
    // 2 MiB on a file), LUKS2 on 32 MiB objects at 32 MiB; librbd loads both.
    cluster.rbd(&["create", "--size", "48M", "rbd/luks1"]);
    cluster.rbd(&[
        "create",
        "--size",
        "96M",
        "--object-size",
        "32M",
        "rbd/big-objects",
    ]);
    let mut args = vec![
        "format",
        "-q",
        "--type",
        "luks1",
        "--pbkdf-force-iterations",
        "1000",
    ];
    args.extend(["--key-file", p(&key), "rbd:rbd/luks1"]);
    ok(sc_rbd(&args), "format --type luks1 rbd:");
    let dump = ok(sc_rbd(&["dump", "rbd:rbd/luks1"]), "dump luks1");
    assert!(String::from_utf8_lossy(&dump.stdout).contains("Payload offset:\t8192\n"));
    let mut args = vec!["format", "-q", "--type", "luks2", "--key-file", p(&key)];
    args.extend(fast);
    args.push("rbd:rbd/big-objects");
    ok(sc_rbd(&args), "format rbd: with 32 MiB objects");
    let dump = ok(sc_rbd(&["dump", "rbd:rbd/big-objects"]), "dump big objects");
    assert!(String::from_utf8_lossy(&dump.stdout).contains("offset: 33554432 [bytes]"));
    const LIBRBD_SIZES: &str = r#"
import sys, rados, rbd
conf, key = sys.argv[1:3]
pw = open(key, "rb").read()
with rados.Rados(conffile=conf) as c, c.open_ioctx("rbd") as io:
    for name, fmt in (("luks1", rbd.RBD_ENCRYPTION_FORMAT_LUKS1),
                      ("big-objects", rbd.RBD_ENCRYPTION_FORMAT_LUKS2)):
        with rbd.Image(io, name) as im:
            im.encryption_load(fmt, pw)
            print(im.size())
"#;
    let sizes = librbd(LIBRBD_SIZES, &[&conf, p(&key)]);
    assert_eq!(
        String::from_utf8_lossy(&sizes.stdout)
            .split_whitespace()
            .collect::<Vec<_>>(),
        [(44 * MIB).to_string(), (64 * MIB).to_string()],
        "48 MiB less 4 MiB, 96 MiB less 32 MiB"
    );

    // The other direction: an image formatted and written by librbd's own encryption opens
    // here (librbd's Argon2id takes about 1 GiB and a few seconds, once).
    // LUKS2 and LUKS1 (LUKS1's PBKDF2 takes no memory).
    const LIBRBD_MAKE: &str = r#"
import sys, rados, rbd
conf, key, data = sys.argv[1:4]
with rados.Rados(conffile=conf) as c, c.open_ioctx("rbd") as io:
    for name, fmt in (("librbd-luks2", rbd.RBD_ENCRYPTION_FORMAT_LUKS2),
                      ("librbd-luks1", rbd.RBD_ENCRYPTION_FORMAT_LUKS1)):
        rbd.RBD().create(io, name, 48 << 20)
        with rbd.Image(io, name) as im:
            pw = open(key, "rb").read()
            # Formatting also loads the encryption on this handle (Pacific refuses a second load).
            im.encryption_format(fmt, pw)
            im.write(open(data, "rb").read(), 1 << 20)
            im.flush()
"#;
    librbd(LIBRBD_MAKE, &[&conf, p(&key), p(&src)]);
    // Data at 16 MiB (LUKS2) and 4 MiB (LUKS1, aligned to the object size).
    for (image, size) in [("librbd-luks2", 32 * MIB), ("librbd-luks1", 44 * MIB)] {
        let reader = Served::unix(
            &dir,
            "l.sock",
            Path::new(&format!("rbd:rbd/{image}")),
            &key,
            &["--ceph-conf", &conf, "--readonly"],
        );
        assert_eq!(reader.size, size, "{image}");
        let seen = dir.join("seen.raw");
        tool("nbdcopy", &[&reader.uri, p(&seen)]);
        assert!(
            std::fs::read(&seen).unwrap()[MIB as usize..5 * MIB as usize] == data[..],
            "{image}: the data librbd wrote"
        );
        reader.stop();
    }
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}
