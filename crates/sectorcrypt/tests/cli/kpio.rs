//! `sectorcrypt kpio`: a store served with a table of keys, one NBD export per key tag, driven by
//! the real clients (nbdinfo, nbdcopy, qemu-io) and checked from the outside: what a tag's export
//! wrote is what Python's `cryptography` decrypts from the store with that tag's key. Reloading
//! the key table (SIGHUP) loads, replaces and destroys keys; bad input gets its exit code.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use sectorcrypt_testkit::pattern;

use crate::common::p;
use crate::nbd::{
    assert_same, nbd_scratch, python_decrypt, read_file, run_within, signal, tool, write_file,
    Served, BIN, MIB, TOOL_DEADLINE,
};

/// Key table entries are 64 bytes (aes-xts-plain64, 512-bit keys).
const KEY: usize = 64;

/// A key table file with `keys[i]` under tag i (`None`: an all-zero entry).
fn key_table(keys: &[Option<u64>]) -> Vec<u8> {
    keys.iter()
        .flat_map(|k| k.map_or_else(|| vec![0u8; KEY], |seed| pattern(KEY, seed)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The export names `nbdinfo --list` sees.
fn listed(socket: &std::path::Path) -> Vec<String> {
    let out = tool(
        "nbdinfo",
        &[
            "--list",
            "--json",
            &format!("nbd+unix:///?socket={}", socket.display()),
        ],
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("nbdinfo --json is JSON");
    v["exports"]
        .as_array()
        .expect("an export list")
        .iter()
        .map(|e| e["export-name"].as_str().unwrap().to_string())
        .collect()
}

fn tag_uri(socket: &std::path::Path, tag: u32) -> String {
    format!("nbd+unix:///{tag}?socket={}", socket.display())
}

/// `len` bytes at `offset` of tag `tag`'s export, through nbdcopy.
fn read_tag(
    dir: &std::path::Path,
    socket: &std::path::Path,
    tag: u32,
    offset: u64,
    len: u64,
) -> Vec<u8> {
    let out = dir.join("read.raw");
    let window = format!(
        "driver=raw,offset={offset},size={len},file.driver=nbd,file.server.type=unix,file.server.path={},file.export={tag}",
        socket.display()
    );
    tool(
        "qemu-img",
        &[
            "convert",
            "-O",
            "raw",
            &format!("json:{{{}}}", to_json_opts(&window)),
            p(&out),
        ],
    );
    read_file(&out)
}

/// qemu's `key=value,...` options as the JSON object body qemu-img's `json:` syntax takes.
fn to_json_opts(opts: &str) -> String {
    opts.split(',')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            let value = v
                .parse::<u64>()
                .map_or_else(|_| format!("\"{v}\""), |n| n.to_string());
            format!("\"{k}\":{value}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Write `table` to `keys`, send SIGHUP and wait until the server reports `outcome` (a hang
/// detector, not a speed check); the server's stderr.
fn reload(server: &Served, keys: &std::path::Path, table: &[u8], outcome: &str) -> String {
    write_file(keys, table);
    signal(server.pid(), "-HUP");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let log = server.stderr();
        if log.contains(outcome) {
            return log;
        }
        assert!(Instant::now() < end, "no '{outcome}' reported: {log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn key_per_io_over_nbd_decrypts_with_each_tags_key_and_reloads() {
    let dir = nbd_scratch("kpio");
    let store = dir.join("store.img");
    write_file(&store, &vec![0u8; 16 * MIB as usize]);
    let keys = dir.join("keys.bin");
    write_file(&keys, &key_table(&[Some(10), Some(11), Some(12), None]));
    let sock = dir.join("k.sock");
    let server = Served::start_command(
        &dir,
        &["kpio", "serve"],
        &[
            p(&store),
            "--key-table",
            p(&keys),
            "--offset",
            "4096",
            "--socket",
            p(&sock),
        ],
    );
    assert_eq!(server.size, 16 * MIB - 4096);
    assert_eq!(listed(&sock), ["0", "1", "2"], "tag 3 is an empty entry");
    assert!(
        server.uri.starts_with("nbd+unix:///0?socket="),
        "{}",
        server.uri
    );

    // The same offset written under two keys, and another range under a third.
    let (offset, len) = (MIB + 8192, 256 * 1024u64);
    let (a, b) = (pattern(len as usize, 1), pattern(len as usize, 2));
    for (tag, data) in [(1u32, &a), (2, &b)] {
        let src = dir.join(format!("tag{tag}.raw"));
        write_file(&src, data);
        let at = offset + u64::from(tag) * MIB;
        tool(
            "qemu-io",
            &[
                "-f",
                "raw",
                "-c",
                &format!("write -s {} {at} {len}", p(&src)),
                &tag_uri(&sock, tag),
            ],
        );
        assert_same(
            &read_tag(&dir, &sock, tag, at, len),
            data,
            &format!("tag {tag} reads back"),
        );
    }
    // Tag 0 sees tag 1's range as noise.
    assert_ne!(read_tag(&dir, &sock, 0, offset + MIB, len), a);
    let whole = dir.join("whole.raw");
    tool("nbdcopy", &[&tag_uri(&sock, 2), p(&whole)]);
    assert_eq!(read_file(&whole).len() as u64, server.size);

    // Reload: tag 1 destroyed, tag 2 given a new key, tag 5 added.
    let reloaded = reload(
        &server,
        &keys,
        &key_table(&[Some(10), None, Some(99), None, None, Some(15)]),
        "key table reloaded",
    );
    assert!(
        reloaded.contains("1 loaded, 1 replaced, 1 destroyed, 3 in use"),
        "{reloaded}"
    );
    assert_eq!(listed(&sock), ["0", "2", "5"]);
    let gone = run_within(
        Command::new("nbdinfo").arg(tag_uri(&sock, 1)),
        TOOL_DEADLINE,
    );
    assert!(
        !gone.status.success(),
        "tag 1's export is gone after the reload"
    );
    assert_ne!(
        read_tag(&dir, &sock, 2, offset + 2 * MIB, len),
        b,
        "tag 2's new key reads noise"
    );

    // A key table that does not parse is refused and the old table stays.
    reload(&server, &keys, &[1u8; 100], "key table not reloaded");
    assert_eq!(listed(&sock), ["0", "2", "5"]);
    server.stop();

    // On the store: each range is AES-XTS under its tag's key, sector numbers counted from the
    // data's start, as an independent implementation decrypts it.
    for (tag, seed, data) in [(1u64, 11u64, &a), (2, 12, &b)] {
        let plain = python_decrypt(
            &dir,
            &store,
            4096,
            512,
            &hex(&pattern(KEY, seed)),
            offset + tag * MIB,
            len,
        );
        assert_same(&plain, data, &format!("tag {tag} decrypted by Python"));
    }
}

#[test]
fn key_per_io_refusals_and_benchmark() {
    let dir = nbd_scratch("kpio-bad");
    let store = dir.join("store.img");
    write_file(&store, &vec![0u8; MIB as usize]);
    let keys = dir.join("keys.bin");
    write_file(&keys, &key_table(&[Some(1)]));
    let sock = dir.join("b.sock");
    let refused = |args: &[&str]| {
        let out = run_within(
            Command::new(BIN).args(["kpio", "serve"]).args(args),
            TOOL_DEADLINE,
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        (out.status.code(), err)
    };
    let short = dir.join("short.bin");
    write_file(&short, &[7u8; 100]);
    let (code, err) = refused(&[p(&store), "--key-table", p(&short), "--socket", p(&sock)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not a whole number of 64-byte keys"), "{err}");
    let many = dir.join("many.bin");
    write_file(&many, &key_table(&[Some(1), Some(2), Some(3)]));
    let (code, err) = refused(&[
        p(&store),
        "--key-table",
        p(&many),
        "--max-keys",
        "2",
        "--socket",
        p(&sock),
    ]);
    assert_eq!(code, Some(1), "{err}");
    let missing = dir.join("missing.img");
    let (code, err) = refused(&[p(&missing), "--key-table", p(&keys), "--socket", p(&sock)]);
    assert_eq!(code, Some(4), "{err}");
    let (code, err) = refused(&[
        p(&store),
        "--key-table",
        p(&keys),
        "--offset",
        "1000",
        "--socket",
        p(&sock),
    ]);
    assert_eq!(code, Some(4), "{err}");
    let (code, err) = refused(&[
        p(&store),
        "--key-table",
        p(&keys),
        "-c",
        "nope-xts-plain64",
        "--socket",
        p(&sock),
    ]);
    assert_eq!(code, Some(1), "{err}");
    // A second server on a live socket: busy.
    let server = Served::start_command(
        &dir,
        &["kpio", "serve"],
        &[p(&store), "--key-table", p(&keys), "--socket", p(&sock)],
    );
    let (code, err) = refused(&[p(&store), "--key-table", p(&keys), "--socket", p(&sock)]);
    assert_eq!(code, Some(5), "{err}");
    server.stop();

    // The benchmark: one JSON line per key count and direction, the first the baseline.
    let out = run_within(
        Command::new(BIN).args([
            "kpio",
            "benchmark",
            "--keys",
            "1,64",
            "--seconds",
            "0.05",
            "--json",
        ]),
        TOOL_DEADLINE,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let shape: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| (r["keys"].as_u64().unwrap(), r["op"].as_str().unwrap()))
        .collect();
    assert_eq!(
        shape,
        [(1, "write"), (64, "write"), (1, "read"), (64, "read")]
    );
    for r in &rows {
        assert!(r["requests_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["cipher"], "aes-xts-plain64");
        let steal = r["steal_max"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&steal), "{r}");
    }
    assert_eq!(rows[0]["vs_baseline"], 1.0);
    let bad = run_within(
        Command::new(BIN).args(["kpio", "benchmark", "--keys", "0"]),
        TOOL_DEADLINE,
    );
    assert_eq!(bad.status.code(), Some(1));
}

/// `kpio serve --tls require` over its Unix socket: a tag's export written and read back by
/// nbdcopy over TLS (`nbds+unix://`); without TLS nothing is served.
#[test]
fn key_per_io_serves_over_tls() {
    use crate::tls::{pki, refused, with_certificates};
    let dir = nbd_scratch("kpio-tls");
    let store = dir.join("store.img");
    write_file(&store, &vec![0u8; 8 * MIB as usize]);
    let keys = dir.join("keys.bin");
    write_file(&keys, &key_table(&[Some(30), Some(31)]));
    let pki = pki(&dir);
    let sock = dir.join("k.sock");
    let serve = |tls: &[&str]| -> Vec<String> {
        [p(&store), "--key-table", p(&keys), "--socket", p(&sock)]
            .iter()
            .chain(tls)
            .map(|s| s.to_string())
            .collect()
    };
    let args = serve(&["--tls", "require", "--tls-certificates", p(&pki.server)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Served::start_command(&dir, &["kpio", "serve"], &args);
    assert!(
        server.uri.starts_with("nbds+unix:///0?socket="),
        "{}",
        server.uri
    );
    let uri = with_certificates(&tag_uri(&sock, 1).replacen("nbd+", "nbds+", 1), &pki.client);
    let data = pattern(MIB as usize, 32);
    let src = dir.join("in.raw");
    write_file(&src, &data);
    tool("nbdcopy", &[p(&src), &uri]);
    let out = dir.join("out.raw");
    tool("nbdcopy", &[&uri, p(&out)]);
    assert_same(&read_file(&out)[..data.len()], &data, "tag 1 over TLS");
    refused("nbdinfo", &[&tag_uri(&sock, 1)]);
    server.stop();
    // Tag 1's key encrypted it on the store.
    let plain = python_decrypt(&dir, &store, 0, 512, &hex(&pattern(KEY, 31)), 0, MIB);
    assert_same(&plain, &data, "tag 1 decrypted by Python");
}
