//! Faults on the project's Ceph test cluster (issue 16): the OSD dies as in a crash and comes
//! back while fio writes through `sectorcrypt serve rbd:...`, and an in-place reencryption of an
//! RBD image is killed with SIGKILL at random moments and resumed.
//!
//! - Without `--ceph-timeout` the server waits for the OSD: fio's writes all complete, and
//!   fio's `verify=crc32c` pass after the restart finds every block it wrote.
//! - With `--ceph-timeout` requests fail with an I/O error instead (fio stops on it, the server
//!   says so on standard error), and once the OSD is back the same server serves again.
//! - After the reencryption's kills and resumes, librbd's own LUKS2 reads the original data
//!   under the new volume key.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::ceph::{librbd, Cluster, FAST, LIBRBD_READ};
use sectorcrypt_testkit::pattern;

use crate::common::{ok, our_volume_key_with, p, sc, scratch};
use crate::nbd::{run_within, tool, wait_within, write_file, Served, MIB};

/// An fio job on the export at `uri`: 64 KiB random writes over the first 48 MiB, each block
/// carrying a crc32c checksum, plus `extra` options.
fn fio_job(dir: &Path, name: &str, uri: &str, extra: &str) -> std::path::PathBuf {
    let job = dir.join(format!("{name}.fio"));
    write_file(
        &job,
        format!(
            "[{name}]\nioengine=nbd\nuri={uri}\nrw=randwrite\nbs=64k\nsize=48m\niodepth=8\n\
             verify=crc32c\nrandseed=16\n{extra}"
        )
        .as_bytes(),
    );
    job
}

fn fio(job: &Path) -> std::process::Child {
    // In the job's folder: a failed verify leaves its state files there, not in the crate.
    Command::new("fio")
        .arg(job)
        .current_dir(job.parent().expect("a job file in a folder"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fio (scripts/install-test-deps.sh installs it)")
}

/// Wait until a write workload running beside has reached `more` objects of `image` that did
/// not exist before (`before` of them did): the fault then lands inside the workload, an event
/// and not a moment, however fast this host is. Fails if the workload stops short of it.
fn wait_for_new_objects(cluster: &Cluster, image: &str, before: usize, more: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while cluster.data_objects(image) < before + more {
        assert!(
            std::time::Instant::now() < deadline,
            "the workload wrote no {more} new objects of {image}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// fio's output once it has ended, and its status.
fn fio_result(mut child: std::process::Child, deadline: Duration) -> (bool, String) {
    let status = wait_within(&mut child, deadline)
        .unwrap_or_else(|| panic!("fio did not finish within {deadline:?}"));
    let mut text = String::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut stream = stream;
        let _ = stream.read_to_string(&mut text);
    }
    (status.success(), text)
}

#[test]
fn an_osd_that_dies_and_comes_back_loses_no_acknowledged_write() {
    let dir = scratch("ceph-osd-fault");
    let cluster = Cluster::start(&dir.join("cluster"), 3396);
    let conf = cluster.conf.clone();
    let key = dir.join("pass");
    write_file(&key, b"osd fault passphrase");
    cluster.rbd(&["create", "--size", "80M", "rbd/faults"]);
    let mut args = vec!["format", "-q", "--key-file", p(&key), "--ceph-conf", &conf];
    args.extend(FAST);
    args.push("rbd:rbd/faults");
    ok(sc(&args), "format rbd:");

    // Waiting (the default): the OSD is killed once a 16 s write workload has reached two new
    // objects of the image, and restarted 5 s later. Every write completes, and each block fio
    // wrote reads back with its checksum.
    let server = Served::unix(
        &dir,
        "w.sock",
        Path::new("rbd:rbd/faults"),
        &key,
        &["--ceph-conf", &conf],
    );
    let job = fio_job(&dir, "waits", &server.uri, "rate=3m\n");
    let before = cluster.data_objects("faults");
    let writer = fio(&job);
    wait_for_new_objects(&cluster, "faults", before, 2);
    cluster.osd("osd-kill");
    std::thread::sleep(Duration::from_secs(5));
    cluster.osd("osd-start");
    let (written, text) = fio_result(writer, Duration::from_secs(300));
    assert!(
        written && text.contains("err= 0"),
        "fio through the fault: {text}"
    );
    let verify = fio_job(&dir, "waits", &server.uri, "verify_only=1\n");
    let (verified, text) = fio_result(fio(&verify), Duration::from_secs(120));
    assert!(
        verified && text.contains("err= 0") && !text.contains("verify:"),
        "fio verify after the restart: {text}"
    );
    assert!(
        !server.stderr().contains("a request failed"),
        "the waiting server failed nothing: {}",
        server.stderr()
    );
    server.stop();

    // With a timeout: requests fail with an I/O error once the OSD has been gone 10 s; the
    // server reports it; once the OSD is back, the same server serves and verifies again. Not
    // shorter: the same timeout bounds every request after the restart, and an OSD just back
    // on a host this test shares with another cluster can hold a request for seconds.
    let server = Served::unix(
        &dir,
        "t.sock",
        Path::new("rbd:rbd/faults"),
        &key,
        &["--ceph-conf", &conf, "--ceph-timeout", "10"],
    );
    let job = fio_job(
        &dir,
        "fails",
        &server.uri,
        // The last 16 MiB of the data, which the first workload left alone: its first new
        // object places the fault.
        "offset=48m\nsize=16m\ntime_based=1\nruntime=120\ndo_verify=0\n",
    );
    let before = cluster.data_objects("faults");
    let writer = fio(&job);
    wait_for_new_objects(&cluster, "faults", before, 1);
    cluster.osd("osd-kill");
    let (written, text) = fio_result(writer, Duration::from_secs(100));
    assert!(
        !written && text.contains("Input/output error"),
        "fio sees the timeout as an I/O error: {text}"
    );
    let log = server.stderr();
    assert!(
        log.contains("sectorcrypt: a request failed:") && log.contains("timed out"),
        "the server reports the failure: {log}"
    );
    cluster.osd("osd-start");
    let job = fio_job(&dir, "after", &server.uri, "");
    let (rewritten, text) = fio_result(fio(&job), Duration::from_secs(120));
    assert!(
        rewritten && text.contains("err= 0"),
        "write and verify once the OSD is back: {text}"
    );
    server.stop();
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Start `sectorcrypt reencrypt --json` on `image` and SIGKILL it right after its `step`-th
/// progress line, in the middle of the next step; `false` if it ended on its own first.
fn reencrypt_killed_after(args: &[&str], step: usize) -> bool {
    let mut child = Command::new(crate::nbd::BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let reported = lines.take(step).count();
    let _ = child.kill();
    let status = wait_within(&mut child, Duration::from_secs(20)).expect("reaped");
    use std::os::unix::process::ExitStatusExt;
    reported == step && status.signal() == Some(9)
}

#[test]
fn reencryption_of_an_rbd_image_killed_at_random_moments_resumes_and_librbd_reads_it() {
    let dir = scratch("ceph-reencrypt-kill");
    let cluster = Cluster::start(&dir.join("cluster"), 3398);
    let conf = cluster.conf.clone();
    let key = dir.join("pass");
    write_file(&key, b"rotation passphrase");
    cluster.rbd(&["create", "--size", "64M", "rbd/rot"]);
    let mut args = vec!["format", "-q", "--key-file", p(&key), "--ceph-conf", &conf];
    args.extend(FAST);
    args.push("rbd:rbd/rot");
    ok(sc(&args), "format rbd:");

    // 48 MiB of data (all of the volume) written through serve.
    let data = pattern(48 * MIB as usize, 29);
    let src = dir.join("data.raw");
    write_file(&src, &data);
    let server = Served::unix(
        &dir,
        "r.sock",
        Path::new("rbd:rbd/rot"),
        &key,
        &["--ceph-conf", &conf],
    );
    assert_eq!(server.size, 48 * MIB);
    tool("nbdcopy", &[p(&src), &server.uri]);
    server.stop();
    let image = Path::new("rbd:rbd/rot");
    let volume_key = || our_volume_key_with(image, &key, &["--ceph-conf", &conf]);
    let before = volume_key();

    // 1 MiB steps (48 of them); each run is killed in a random step among the next few. A
    // killed writer keeps the image's lock until the OSD drops its watch (about 30 s), so
    // each resume starts by waiting for it: that is part of what is tested.
    // The reencryption runs with librbd's cache in writeback from the start (Pacific's default
    // policy writes around the cache): a SIGKILL then loses every write not yet flushed, and
    // each resume must start from what the last `sync` made durable. (librbd writes its cache
    // back oldest first, so deleting the flush from `sync` still passes here; the crash sweeps
    // on `CrashingStorage`, which lose arbitrary subsets, are what catch a missing sync.)
    let cached = dir.join("writeback.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(text.contains("[client]\n"), "{text}");
    write_file(
        &cached,
        text.replacen(
            "[client]\n",
            "[client]\nrbd cache policy = writeback\nrbd cache writethrough until flush = false\nrbd cache max dirty age = 30\n",
            1,
        )
        .as_bytes(),
    );
    let mut args = vec![
        "reencrypt",
        "--json",
        "--key-file",
        p(&key),
        "--hotzone-size",
        "1048576",
        "--ceph-conf",
        p(&cached),
    ];
    args.extend(FAST);
    args.push("rbd:rbd/rot");
    let mut rng = StdRng::seed_from_u64(16);
    for run in 0..3 {
        let step = rng.gen_range(1..=8);
        assert!(
            reencrypt_killed_after(&args, step),
            "run {run} was not killed in its step {}",
            step + 1
        );
        eprintln!("reencrypt run {run} killed in its step {}", step + 1);
    }
    let out = run_within(
        Command::new(crate::nbd::BIN).args(&args),
        Duration::from_secs(180),
    );
    let out = ok(out, "reencrypt (resumed to the end)");
    let last = String::from_utf8_lossy(&out.stdout);
    assert!(
        last.lines()
            .last()
            .is_some_and(|l| l.contains("\"done\":50331648,\"total\":50331648")),
        "the last run finished: {last}"
    );
    assert_ne!(volume_key(), before, "a new volume key");

    // librbd's own LUKS2 decrypts the data under the new key.
    let back = dir.join("back.raw");
    librbd(
        LIBRBD_READ,
        &[
            &conf,
            "rot",
            p(&key),
            "0",
            &(48 * MIB).to_string(),
            p(&back),
        ],
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "librbd reads the original data after the resumed reencryption"
    );
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}
