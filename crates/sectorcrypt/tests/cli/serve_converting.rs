//! Conversions of a served device (issue 31): `reencrypt`, `encrypt` and `decrypt` run beside
//! `serve` convert the device inside the server while clients keep reading and writing it; a
//! served device with a conversion recorded (by us or by cryptsetup) goes on with it in the
//! background; a server killed part way leaves a state that we (online and offline) and
//! cryptsetup resume. Clients: fio with crc32c verification, nbdcopy; the result is checked with
//! cryptsetup's volume key and Python's AES-XTS, never only with our own code.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sectorcrypt_testkit::pattern;

use crate::common::{cryptsetup_volume_key, cs, p};
use crate::nbd::{
    assert_same, check_fio, data_layout, format, key_file, nbd_scratch, python_decrypt, read_file,
    run_within, signal, tool, wait_within, write_file, Served, BIN, MIB, TOOL_DEADLINE,
};

const FAST_PBKDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// How long a conversion of a few dozen MiB may take on a slow, shared machine before the test
/// calls it hung (a hang detector, not a measurement).
const CONVERSION_DEADLINE: Duration = Duration::from_secs(300);

/// `sectorcrypt ARGS` started in the background, its output collected.
fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The output of a child started with [`spawn`], waited for within the deadline.
fn finish(mut child: Child, what: &str) -> std::process::Output {
    let status = wait_within(&mut child, CONVERSION_DEADLINE);
    assert!(status.is_some(), "{what} hung");
    child.wait_with_output().unwrap()
}

/// fio writing with crc32c verification through `uri`: random 4 KiB writes at queue depth 32 and
/// sequential 64 KiB writes at queue depth 1, each job on its own `mib`-MiB range from `from_mib`
/// (two connections).
fn fio_job(dir: &Path, uri: &str, from_mib: u64, mib: u64) -> PathBuf {
    let job = format!(
        "[global]\nioengine=nbd\nuri={uri}\nverify=crc32c\ndo_verify=1\nverify_fatal=1\n\
         verify_state_save=0\nrandrepeat=0\nsize={}\n\
         [random-qd32]\nrw=randwrite\nbs=4k\niodepth=32\noffset={}\n\
         [sequential-qd1]\nrw=write\nbs=64k\niodepth=1\noffset={}\n",
        mib * MIB,
        from_mib * MIB,
        (from_mib + mib) * MIB
    );
    let file = dir.join(format!("verify-{from_mib}.fio"));
    write_file(&file, job.as_bytes());
    file
}

/// Run `job` with fio in the background.
fn start_fio(dir: &Path, job: &Path) -> Child {
    Command::new("fio")
        .arg("--output-format=normal")
        .arg(job)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio (scripts/install-test-deps.sh installs it)")
}

/// The whole export read with nbdcopy.
fn snapshot(dir: &Path, server: &Served) -> Vec<u8> {
    let out = dir.join("snapshot.raw");
    let _ = std::fs::remove_file(&out);
    tool("nbdcopy", &[&server.uri, p(&out)]);
    read_file(&out)
}

/// `data` written over the export at byte `offset` with qemu-io, then flushed: acknowledged and
/// durable when this returns.
fn write_over(dir: &Path, server: &Served, offset: u64, data: &[u8]) {
    let file = dir.join("write.raw");
    write_file(&file, data);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            &format!("write -q -s {} {offset} {}", p(&file), data.len()),
            "-c",
            "flush",
            &server.uri,
        ],
    );
}

/// The decrypted payload of `img` as cryptsetup's volume key and Python's AES-XTS read it.
fn decrypted_by_cryptsetup(dir: &Path, img: &Path, key: &Path, len: u64) -> Vec<u8> {
    let (offset, sector) = data_layout(img);
    python_decrypt(
        dir,
        img,
        offset,
        sector,
        &cryptsetup_volume_key(img, key),
        0,
        len,
    )
}

/// cryptsetup sees a finished volume: no reencryption requirement, the passphrase opens it.
fn assert_cryptsetup_sees_it_finished(img: &Path, key: &Path, what: &str) {
    let dump = cs(&["luksDump", p(img)]);
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.status.success(), "{what}: luksDump: {text}");
    assert!(
        !text.contains("online-reencrypt"),
        "{what}: still converting: {text}"
    );
    let opened = cs(&["open", "--test-passphrase", "--key-file", p(key), p(img)]);
    assert!(
        opened.status.success(),
        "{what}: cryptsetup open --test-passphrase"
    );
}

/// Wait until the server's log says its background conversion ended (or the deadline passes).
fn wait_for_log(server: &Served, needle: &str) -> String {
    let end = Instant::now() + CONVERSION_DEADLINE;
    loop {
        let log = server.stderr();
        if log.contains(needle) {
            return log;
        }
        assert!(Instant::now() < end, "no {needle:?} in: {log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The progress lines `--json` printed: (done, total) each.
fn progress_lines(stdout: &[u8]) -> Vec<(u64, u64)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["done"].as_u64()?, v["total"].as_u64()?)))
        .collect()
}

/// `sectorcrypt reencrypt DEVICE` beside `serve` runs in the server, to the end, while fio writes
/// and verifies through two connections (random at QD 32, sequential at QD 1): no verify error,
/// the progress shown where it was asked, and cryptsetup then opens the file with its new key,
/// under which the data are exactly what the clients last read.
#[test]
fn reencrypt_runs_online_under_fio_and_cryptsetup_reads_the_result() {
    let dir = nbd_scratch("online-reencrypt");
    let key = key_file(&dir);
    let img = format(&dir, "v", 64, &key, &["--sector-size", "4096"]);
    let old_key = cryptsetup_volume_key(&img, &key);
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    let fio = start_fio(&dir, &fio_job(&dir, &server.uri, 0, 16));
    let mut args = vec!["reencrypt", "-q", "--key-file", p(&key), "--json"];
    args.extend(FAST_PBKDF);
    args.extend(["--hotzone-size", "2M", p(&img)]);
    let out = run_within(Command::new(BIN).args(&args), CONVERSION_DEADLINE);
    assert!(
        out.status.success(),
        "online reencrypt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps = progress_lines(&out.stdout);
    assert!(steps.len() >= 10, "one progress line per step: {steps:?}");
    assert_eq!(steps.last().map(|s| s.0), Some(server.size), "{steps:?}");
    check_fio(&finish(fio, "fio"), 2, "fio during an online reencryption");
    let seen = snapshot(&dir, &server);
    assert!(
        server.stderr().contains("the conversion is finished"),
        "{}",
        server.stderr()
    );
    let size = server.size;
    server.stop();
    assert_cryptsetup_sees_it_finished(&img, &key, "after an online reencryption");
    assert_ne!(
        cryptsetup_volume_key(&img, &key),
        old_key,
        "a new volume key"
    );
    assert_same(
        &decrypted_by_cryptsetup(&dir, &img, &key, size),
        &seen,
        "the data under cryptsetup's new key",
    );
}

/// A reencryption that cryptsetup started (`--init-only`) and one it ran until a signal stopped
/// it: `serve` opens each, serves it correctly while the conversion goes on in the background,
/// and finishes it; cryptsetup then sees it finished, with the data intact.
#[test]
fn states_cryptsetup_left_are_served_and_finished_in_the_background() {
    let dir = nbd_scratch("online-cryptsetup");
    let key = key_file(&dir);
    for stop_it in [false, true] {
        let img = format(&dir, "v", 48, &key, &["--sector-size", "4096"]);
        let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
        let data = pattern(server.size as usize, 3);
        write_over(&dir, &server, 0, &data);
        server.stop();
        let mut args = vec!["reencrypt", "--batch-mode", "--key-file", p(&key)];
        args.extend(FAST_PBKDF);
        if stop_it {
            // Stopped by SIGINT part way (or, on a fast machine, finished: any state will do).
            args.extend(["--force-offline-reencrypt", "--hotzone-size", "1M", p(&img)]);
            let mut child = Command::new("cryptsetup")
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(150));
            signal(child.id(), "-INT");
            assert!(
                wait_within(&mut child, TOOL_DEADLINE).is_some(),
                "cryptsetup hung"
            );
        } else {
            args.extend(["--init-only", p(&img)]);
            crate::common::ok(cs(&args), "cryptsetup reencrypt --init-only");
        }
        let converting = needs_finishing(&img);
        assert!(
            converting || stop_it,
            "--init-only leaves a conversion recorded"
        );
        let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
        assert_same(&snapshot(&dir, &server), &data, "served while converting");
        if converting {
            wait_for_log(&server, "the conversion is finished");
        }
        assert_same(&snapshot(&dir, &server), &data, "served after converting");
        let size = server.size;
        server.stop();
        assert_cryptsetup_sees_it_finished(&img, &key, "cryptsetup's state");
        assert_same(
            &decrypted_by_cryptsetup(&dir, &img, &key, size),
            &data,
            "the data under cryptsetup's key",
        );
    }
}

/// `--no-resume` serves a recorded conversion without going on with it; `reencrypt --resume-only`
/// beside it goes on online, and its SIGINT stops the conversion at a safe point (exit 1, saying
/// how to resume) while the server keeps serving; the same command then finishes it.
#[test]
fn no_resume_waits_and_a_client_interrupt_pauses_the_conversion() {
    let dir = nbd_scratch("online-no-resume");
    let key = key_file(&dir);
    let img = format(&dir, "v", 48, &key, &["--sector-size", "4096"]);
    let mut args = vec!["reencrypt", "-q", "--key-file", p(&key), "--init-only"];
    args.extend(FAST_PBKDF);
    args.push(p(&img));
    crate::common::ok(crate::common::sc(&args), "reencrypt --init-only");
    let server = Served::unix(&dir, "s.sock", &img, &key, &["--no-resume"]);
    let data = pattern(server.size as usize, 4);
    write_over(&dir, &server, 0, &data);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!server.stderr().contains("resuming"), "{}", server.stderr());
    let resume = [
        "reencrypt",
        "--resume-only",
        "--key-file",
        p(&key),
        "--json",
        "--hotzone-size",
        "1M",
        // Paced: the path of --max-rate, at a rate the test machine exceeds.
        "--max-rate",
        "64M",
        p(&img),
    ];
    let mut client = spawn(&resume);
    // Interrupt it once it has reported a step.
    let stdout = client.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let first = lines.next().expect("a progress line").unwrap();
    assert!(first.contains("\"done\""), "{first}");
    signal(client.id(), "-INT");
    let status = wait_within(&mut client, CONVERSION_DEADLINE).expect("the client hung");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut client.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "interrupted: {err}");
    assert!(err.contains("--resume-only"), "says how to resume: {err}");
    let dump = String::from_utf8_lossy(&cs(&["luksDump", p(&img)]).stdout).into_owned();
    assert!(
        dump.contains("online-reencrypt"),
        "paused, not finished: {dump}"
    );
    assert_same(&snapshot(&dir, &server), &data, "served while paused");
    let out = run_within(Command::new(BIN).args(resume), CONVERSION_DEADLINE);
    assert!(
        out.status.success(),
        "resumed online: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same(&snapshot(&dir, &server), &data, "served after");
    let size = server.size;
    server.stop();
    assert_cryptsetup_sees_it_finished(&img, &key, "after pausing and resuming online");
    assert_same(
        &decrypted_by_cryptsetup(&dir, &img, &key, size),
        &data,
        "the data under cryptsetup's key",
    );
}

/// An encryption recorded with `--init-only` (header on the device, data shifted) is done by
/// `serve` in the background under fio; then `decrypt --header FILE` beside the server exports
/// the header and decrypts online under fio again: the file ends as plaintext at offset 0, the
/// data as the clients last read them.
#[test]
fn encrypt_and_decrypt_run_online() {
    let dir = nbd_scratch("online-encdec");
    let key = key_file(&dir);
    let img = dir.join("v.img");
    let plain = pattern(64 * MIB as usize, 5);
    write_file(&img, &plain);
    let mut args = vec!["encrypt", "-q", "--key-file", p(&key), "--init-only"];
    args.extend(FAST_PBKDF);
    args.extend(["--reduce-device-size", "8M", p(&img)]);
    crate::common::ok(crate::common::sc(&args), "encrypt --init-only");
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    assert_eq!(server.size, 56 * MIB, "the shifted data");
    let fio = start_fio(&dir, &fio_job(&dir, &server.uri, 0, 8));
    wait_for_log(&server, "the conversion is finished");
    check_fio(&finish(fio, "fio"), 2, "fio during an online encryption");
    let seen = snapshot(&dir, &server);
    assert_same(
        &seen[16 * MIB as usize..],
        &plain[16 * MIB as usize..56 * MIB as usize],
        "the data fio did not write",
    );
    // Decrypt online: the header goes to a new file.
    let hdr = dir.join("exported.hdr");
    let fio = start_fio(&dir, &fio_job(&dir, &server.uri, 20, 8));
    let out = run_within(
        Command::new(BIN).args([
            "decrypt",
            "-q",
            "--key-file",
            p(&key),
            "--header",
            p(&hdr),
            "--hotzone-size",
            "1M",
            p(&img),
        ]),
        CONVERSION_DEADLINE,
    );
    assert!(
        out.status.success(),
        "online decrypt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_fio(&finish(fio, "fio"), 2, "fio during an online decryption");
    let seen = snapshot(&dir, &server);
    server.stop();
    let after = read_file(&img);
    assert_same(&after[..seen.len()], &seen, "plaintext at offset 0");
}

/// strace's options that follow a server's `fdatasync` calls (one per synced write of a
/// conversion step, one per client flush).
const TRACE_SYNCS: [&str; 6] = ["strace", "-f", "-qq", "-e", "trace=fdatasync", "-o"];

/// The server SIGKILLed during an online reencryption, on entry to its `n`-th `fdatasync` of the
/// conversion thread (a count, not a time: the same cases on any machine, loaded or not), with a
/// client write acknowledged and flushed while the conversion runs: every state left resumes to
/// the end with sectorcrypt online (served again), with sectorcrypt offline, and with cryptsetup
/// offline, and every one holds every flushed write. The cases: each of the conversion's last
/// syncs (its end, where cryptsetup 2.6 restarts a finished conversion from 0 if the header says
/// "all converted" without being final) and seeded ones before.
#[test]
fn a_server_killed_during_an_online_reencryption_resumes_everywhere() {
    let dir = nbd_scratch("online-kill");
    let key = key_file(&dir);
    let syncs = conversion_syncs(&dir, &key);
    assert!(
        syncs > 40,
        "a 32-step conversion syncs more than {syncs} times"
    );
    let mut rng = StdRng::seed_from_u64(7);
    let mut cases: Vec<u64> = (0..4).map(|k| syncs - k).collect();
    cases.extend((0..3).map(|_| rng.gen_range(3..syncs - 4)));
    let killed: Vec<bool> = cases
        .iter()
        .enumerate()
        .map(|(seed, &n)| kill_at_sync(&dir, &key, seed as u64, n))
        .collect();
    // A conversion beside a client write may sync a time or two less than the undisturbed one
    // (a case past its last sync finishes unkilled, which is checked all the same), but the
    // cases must still reach its end.
    assert!(
        killed[..4].iter().any(|&k| k),
        "no case killed the server at one of its last syncs: {cases:?}"
    );
    assert!(killed[4..].iter().all(|&k| k), "{cases:?}: {killed:?}");
}

/// The most `fdatasync` calls one thread made in `trace` ("PID fdatasync(..." lines): the
/// conversion's, which runs on one thread, the busiest.
fn thread_syncs(trace: &Path) -> u64 {
    let text = read_file(trace);
    let mut per_thread = std::collections::HashMap::<&str, u64>::new();
    for line in std::str::from_utf8(&text).unwrap().lines() {
        if let Some((pid, rest)) = line.split_once(' ') {
            if rest.trim_start().starts_with("fdatasync(") {
                *per_thread.entry(pid).or_default() += 1;
            }
        }
    }
    per_thread.into_values().max().unwrap_or(0)
}

/// A 32 MiB volume at 4096-byte sectors holding `pattern(.., seed)`, served by a traced server
/// whose `fdatasync` calls go to `trace` (with `inject`, if any).
fn traced_server(
    dir: &Path,
    key: &Path,
    seed: u64,
    trace: &Path,
    inject: Option<String>,
) -> (PathBuf, Served, Vec<u8>) {
    let img = format(dir, "v", 32, key, &["--sector-size", "4096"]);
    let plain = Served::unix(dir, "s.sock", &img, key, &[]);
    let data = pattern(plain.size as usize, seed);
    write_over(dir, &plain, 0, &data);
    plain.stop();
    let mut wrapper = TRACE_SYNCS.to_vec();
    wrapper.push(p(trace));
    let inject = inject.map(|i| format!("inject=fdatasync:{i}"));
    if let Some(i) = &inject {
        wrapper.extend(["-e", i]);
    }
    wrapper.push("--");
    let sock = dir.join("s.sock");
    let args = [p(&img), "--key-file", p(key), "--socket", p(&sock)];
    let server = Served::start_wrapped(dir, &wrapper, &args);
    (img, server, data)
}

/// The online reencryption's arguments for `img`.
fn reencrypt_args<'a>(key: &'a Path, img: &'a Path) -> Vec<&'a str> {
    let mut args = vec![
        "reencrypt",
        "-q",
        "--key-file",
        p(key),
        "--json",
        "--hotzone-size",
        "1M",
    ];
    args.extend(FAST_PBKDF);
    args.push(p(img));
    args
}

/// How many times the conversion thread of an undisturbed online reencryption syncs.
fn conversion_syncs(dir: &Path, key: &Path) -> u64 {
    let trace = dir.join("syncs.trace");
    let (img, server, _) = traced_server(dir, key, 0, &trace, None);
    let out = finish(spawn(&reencrypt_args(key, &img)), "online reencrypt");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.stop();
    thread_syncs(&trace)
}

/// One case of [`a_server_killed_during_an_online_reencryption_resumes_everywhere`]; whether the
/// server was killed (its conversion reached sync `n`).
fn kill_at_sync(dir: &Path, key: &Path, seed: u64, n: u64) -> bool {
    let what = format!("killed at sync {n} (case {seed})");
    let trace = dir.join("kill.trace");
    let (img, server, mut data) = traced_server(
        dir,
        key,
        seed + 1,
        &trace,
        Some(format!("signal=SIGKILL:when={n}")),
    );
    let size = server.size;
    let mut client = spawn(&reencrypt_args(key, &img));
    let stdout = client.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let _ = lines.next();
    // A write while the conversion runs; the server may die before acknowledging it.
    let second = pattern(4 * MIB as usize, seed + 100);
    let at = StdRng::seed_from_u64(seed).gen_range(0..(size - 4 * MIB) / 4096) * 4096;
    let file = dir.join("second.raw");
    write_file(&file, &second);
    let acknowledged = run_within(
        Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            &format!("write -q -s {} {at} {}", p(&file), second.len()),
            "-c",
            "flush",
            &server.uri,
        ]),
        TOOL_DEADLINE,
    )
    .status
    .success();
    let before = data.clone();
    data[at as usize..at as usize + second.len()].copy_from_slice(&second);
    let ended = wait_within(&mut client, CONVERSION_DEADLINE);
    let mut said = String::new();
    let _ = std::io::Read::read_to_string(&mut client.stderr.take().unwrap(), &mut said);
    // Killed or not, the server ran the conversion: the command never went offline.
    assert!(
        ended.is_some_and(|s| s.success()) || said.contains("the serving process"),
        "{what}: reencrypt {ended:?}: {said}"
    );
    server.kill();
    let killed = thread_syncs(&trace) >= n;
    // Three copies of the state, three ways to finish.
    let copies: Vec<PathBuf> = ["online", "offline", "cryptsetup"]
        .iter()
        .map(|how| {
            let copy = dir.join(format!("{how}.img"));
            std::fs::copy(&img, &copy).unwrap();
            copy
        })
        .collect();
    let again = Served::unix(dir, "t.sock", &copies[0], key, &[]);
    if needs_finishing(&copies[0]) || again.stderr().contains("recovering") {
        wait_for_log(&again, "the conversion is finished");
    }
    let served = snapshot(dir, &again);
    again.stop();
    if needs_finishing(&copies[1]) {
        crate::common::ok(
            crate::common::sc(&[
                "reencrypt",
                "--resume-only",
                "--key-file",
                p(key),
                p(&copies[1]),
            ]),
            "sectorcrypt reencrypt --resume-only",
        );
    }
    // cryptsetup recovers a step cut short only in `repair` (offline), which also ends a
    // conversion whose last step it recovers.
    if needs_finishing(&copies[2]) {
        crate::common::ok(
            cs(&[
                "repair",
                "--batch-mode",
                "--key-file",
                p(key),
                p(&copies[2]),
            ]),
            "cryptsetup repair",
        );
    }
    if needs_finishing(&copies[2]) {
        crate::common::ok(
            cs(&[
                "reencrypt",
                "--resume-only",
                "--batch-mode",
                "--force-offline-reencrypt",
                "--key-file",
                p(key),
                p(&copies[2]),
            ]),
            "cryptsetup reencrypt --resume-only",
        );
    }
    let same = |got: &[u8], how: &str| {
        if acknowledged {
            assert_same(got, &data, &format!("{what}, {how}"));
        } else {
            // Not acknowledged: each block of the write holds the old or the new bytes.
            for (i, block) in got.chunks(4096).enumerate() {
                let (old, new) = (&before[i * 4096..][..4096], &data[i * 4096..][..4096]);
                assert!(
                    block == old || block == new,
                    "{what}, {how}: block {i} is neither"
                );
            }
        }
    };
    same(&served, "served again");
    for copy in &copies {
        let how = copy.display().to_string();
        assert_cryptsetup_sees_it_finished(copy, key, &format!("{what}, {how}"));
        same(&decrypted_by_cryptsetup(dir, copy, key, size), &how);
    }
    killed
}

/// Whether the LUKS2 header of `img` still records a reencryption.
fn needs_finishing(img: &Path) -> bool {
    String::from_utf8_lossy(&cs(&["luksDump", p(img)]).stdout).contains("online-reencrypt")
}

/// strace's options that hold every `bind` of the process it runs for a second. A server that
/// bound its control socket after announcing itself would still be without one when a command
/// started at the announcement looks for it: that command would then run offline and meet the
/// device's lock ("in use by another process").
const SLOW_BINDS: [&str; 9] = [
    "strace",
    "-f",
    "-qq",
    "--detach-on=execve",
    "-o",
    "/dev/null",
    "-e",
    "inject=bind:delay_enter=1s",
    "--",
];

/// A conversion command started the moment `serve` prints its serving line, or the moment
/// `mount`'s mount appears, runs in that server: the control socket is listened on before either
/// announcement (with every `bind` slowed down, see [`SLOW_BINDS`]).
#[test]
fn a_conversion_started_at_the_announcement_finds_the_server() {
    let dir = nbd_scratch("online-announced");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &["--sector-size", "4096"]);
    let sock = dir.join("s.sock");
    let args = [p(&img), "--key-file", p(&key), "--socket", p(&sock)];
    let server = Served::start_wrapped(&dir, &SLOW_BINDS, &args);
    let out = finish(
        spawn(&reencrypt_args(&key, &img)),
        "reencrypt at the serving line",
    );
    assert!(
        out.status.success(),
        "reencrypt at the serving line: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.stop();
    assert_cryptsetup_sees_it_finished(&img, &key, "reencrypted at the serving line");

    let mp = crate::fuse::mountpoint(&dir, "mnt");
    let mount = ["mount", p(&img), p(&mp), "--key-file", p(&key)];
    let mounted = crate::fuse::Mounted::spawn_wrapped(&SLOW_BINDS, &mount, &mp);
    let out = finish(spawn(&reencrypt_args(&key, &img)), "reencrypt at the mount");
    assert!(
        out.status.success(),
        "reencrypt at the mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(mounted.unmount().success(), "mount exits 0");
    assert_cryptsetup_sees_it_finished(&img, &key, "reencrypted at the mount");
}

/// `mount` too: `reencrypt` beside it runs in the mounting process while a writer keeps writing
/// (and syncing) through `MOUNTPOINT/volume`; afterwards the file reads what was written, and so
/// does cryptsetup's new key once it is unmounted.
#[test]
fn reencrypt_runs_online_under_a_mount() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = nbd_scratch("online-mount");
    let key = key_file(&dir);
    let img = format(&dir, "v", 40, &key, &["--sector-size", "4096"]);
    let mp = crate::fuse::mountpoint(&dir, "mnt");
    let mount = crate::fuse::Mounted::start(&img, &key, &mp, &[]);
    let volume = mount.volume();
    let size = std::fs::metadata(&volume).unwrap().len();
    let mut data = pattern(size as usize, 6);
    // The file has a fixed size: written over, not truncated.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&volume)
        .unwrap();
    file.write_all(&data).unwrap();
    file.sync_data().unwrap();
    let mut args = vec![
        "reencrypt",
        "-q",
        "--key-file",
        p(&key),
        "--hotzone-size",
        "1M",
    ];
    args.extend(FAST_PBKDF);
    args.push(p(&img));
    let client = spawn(&args);
    // Writes through the file system while it runs: 64 KiB pieces at seeded places, each synced.
    let mut rng = StdRng::seed_from_u64(6);
    for i in 0..64u64 {
        let at = rng.gen_range(0..(size - 65536) / 4096) * 4096;
        let piece = pattern(65536, 1000 + i);
        file.seek(SeekFrom::Start(at)).unwrap();
        file.write_all(&piece).unwrap();
        file.sync_data().unwrap();
        data[at as usize..at as usize + piece.len()].copy_from_slice(&piece);
    }
    drop(file);
    let out = finish(client, "online reencrypt under a mount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same(&read_file(&volume), &data, "the mounted file");
    assert!(mount.unmount().success(), "mount exits 0");
    assert_cryptsetup_sees_it_finished(&img, &key, "after an online reencryption of a mount");
    assert_same(
        &decrypted_by_cryptsetup(&dir, &img, &key, size),
        &data,
        "the data under cryptsetup's new key",
    );
}

/// `resize` of a served volume: grown to data added under it (the file grown), new connections
/// see the new size and its new end holds what is written there; shrunk with `--device-size`;
/// sizes that are not whole sectors or exceed the data are refused (exit 1) and change nothing;
/// without a server, exit 4.
#[test]
fn resize_grows_and_shrinks_a_served_volume() {
    let dir = nbd_scratch("online-resize");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &["--sector-size", "4096"]);
    let refused = crate::common::sc(&["resize", p(&img)]);
    assert_eq!(refused.status.code(), Some(4), "not served");
    let server = Served::unix(&dir, "s.sock", &img, &key, &[]);
    assert_eq!(server.size, 16 * MIB);
    let data = pattern(16 * MIB as usize, 8);
    write_over(&dir, &server, 0, &data);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(48 * MIB)
        .unwrap();
    let out = crate::common::ok(crate::common::sc(&["resize", p(&img)]), "resize");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{} bytes", 32 * MIB)),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let size = |server: &Served| {
        let out = tool("nbdinfo", &["--size", &server.uri]);
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(
        size(&server),
        32 * MIB,
        "new connections see the grown size"
    );
    let tail = pattern(16 * MIB as usize, 9);
    write_over(&dir, &server, 16 * MIB, &tail);
    let seen = snapshot(&dir, &server);
    assert_same(&seen[..16 * MIB as usize], &data, "the old data");
    assert_same(&seen[16 * MIB as usize..], &tail, "the grown part");
    for bad in ["1000", "64M"] {
        let out = crate::common::sc(&["resize", "-q", "--device-size", bad, p(&img)]);
        assert_eq!(out.status.code(), Some(1), "--device-size {bad}");
        assert_eq!(
            size(&server),
            32 * MIB,
            "unchanged after --device-size {bad}"
        );
    }
    crate::common::ok(
        crate::common::sc(&["resize", "-q", "--device-size", "8M", p(&img)]),
        "resize --device-size 8M",
    );
    assert_eq!(size(&server), 8 * MIB, "shrunk");
    assert_same(
        &snapshot(&dir, &server),
        &data[..8 * MIB as usize],
        "what is left",
    );
    server.stop();
    assert_same(
        &decrypted_by_cryptsetup(&dir, &img, &key, 32 * MIB),
        &[&data[..], &tail[..]].concat(),
        "the data under cryptsetup's key",
    );
}
