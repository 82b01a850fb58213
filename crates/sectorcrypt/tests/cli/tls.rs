//! NBD over TLS: `serve --tls require` read and written by libnbd (`nbds://` and `nbds+unix://`
//! with `tls-certificates=DIR`: nbdcopy, nbdinfo) and by qemu-img (`tls-creds-x509`); a client
//! without TLS, without a certificate the server trusts, or that does not trust the server, and
//! one that sends options before STARTTLS, is refused and gets no data. `--tls on` serves both
//! kinds of client. `--tls-psk` (nbdkit's key file) read and written by libnbd
//! (`tls-psk-file=FILE`) and qemu-img (`tls-creds-psk`); a wrong key or an unknown user gets no
//! data. TLS options that do not fit together, unusable certificates and malformed key files are
//! refused in one line; plain TCP warns once.
//! (`kpio serve` and `flash attach` over TLS: in their own modules.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use sectorcrypt_testkit::pattern;
use sectorcrypt_testkit::pki::Pki;

use crate::common::p;
use crate::nbd::{
    assert_same, format, key_file, nbd_scratch, read_file, run_within, serve_refused, tool,
    write_file, Served, MIB, TOOL_DEADLINE,
};

/// The certificates of a test, under `dir/pki`.
pub(crate) fn pki(dir: &Path) -> Pki {
    let root = dir.join("pki");
    std::fs::create_dir_all(&root).unwrap();
    Pki::create(&root)
}

/// `uri` with libnbd's query parameter for the client's certificate directory.
pub(crate) fn with_certificates(uri: &str, certificates: &Path) -> String {
    let separator = if uri.contains('?') { '&' } else { '?' };
    format!(
        "{uri}{separator}tls-certificates={}",
        certificates.display()
    )
}

/// Run a client that must fail; its output.
#[track_caller]
pub(crate) fn refused(program: &str, args: &[&str]) -> Output {
    let out = run_within(Command::new(program).args(args), TOOL_DEADLINE);
    assert!(
        !out.status.success(),
        "{program} {args:?} was served: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// qemu's TLS client credentials from `dir` (qemu's file names are libnbd's).
fn qemu_credentials(dir: &Path) -> String {
    format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        dir.display()
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;
const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;

/// A plain TCP connection past the greeting (fixed newstyle, no zeroes).
fn greeted(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TOOL_DEADLINE)).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s
}

fn send_option(s: &mut TcpStream, option: u32, data: &[u8]) {
    let mut out = IHAVEOPT.to_be_bytes().to_vec();
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    s.write_all(&out).unwrap();
}

#[test]
fn serve_tls_require_reads_and_writes_with_libnbd_and_qemu_and_refuses_the_rest() {
    let dir = nbd_scratch("tls-require");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &[]);
    let pki = pki(&dir);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = Served::start(
        &dir,
        &[
            p(&img),
            "--key-file",
            p(&key),
            "--listen",
            &addr,
            "--tls",
            "require",
            "--tls-certificates",
            p(&pki.server),
        ],
    );
    assert_eq!(server.uri, format!("nbds://{addr}/"));
    assert!(!server.stderr().contains("warning"), "{}", server.stderr());
    // libnbd checks the name in the URI against the certificate: its IP address and its name.
    let by_address = with_certificates(&server.uri, &pki.client);
    let by_name = with_certificates(&format!("nbds://localhost:{port}/"), &pki.client);

    // nbdcopy writes and reads back over TLS; nbdinfo says TLS.
    let data = pattern((4 * MIB) as usize, 51);
    let src = dir.join("in.raw");
    write_file(&src, &data);
    tool("nbdcopy", &[p(&src), &by_address]);
    let out = dir.join("out.raw");
    tool("nbdcopy", &[&by_name, p(&out)]);
    assert_same(&read_file(&out)[..data.len()], &data, "nbdcopy over TLS");
    let info: Value =
        serde_json::from_slice(&tool("nbdinfo", &["--json", &by_name]).stdout).unwrap();
    assert_eq!(info["TLS"], true);
    assert_eq!(
        info["exports"][0]["export-size"].as_u64(),
        Some(server.size)
    );

    // qemu-img reads it, and writes its first MiB.
    let creds = qemu_credentials(&pki.client);
    let first = qemu_img_round_trip(&dir, &creds, "localhost", port, &data, 52);
    std::fs::remove_file(&out).unwrap();
    tool("nbdcopy", &[&by_name, p(&out)]);
    let back = read_file(&out);
    assert_same(&back[..first.len()], &first, "qemu-img write");
    assert_same(
        &back[first.len()..data.len()],
        &data[first.len()..],
        "around qemu-img's write",
    );

    // Refused, and given nothing: no TLS; no client certificate; a certificate another CA
    // signed; a client that does not trust the server (libnbd and qemu).
    let plain_out = dir.join("plain.raw");
    refused("nbdcopy", &[&format!("nbd://{addr}/"), p(&plain_out)]);
    assert!(std::fs::read(&plain_out).unwrap_or_default().is_empty());
    refused("nbdinfo", &[&format!("nbd://{addr}/")]);
    for client in [
        &pki.client_without_certificate,
        &pki.client_signed_by_another_ca,
        &pki.client_trusting_another_ca,
    ] {
        let uri = with_certificates(&format!("nbds://localhost:{port}/"), client);
        let out = refused("nbdinfo", &["--json", &uri]);
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    refused(
        "qemu-img",
        &[
            "info",
            "--object",
            &qemu_credentials(&pki.client_trusting_another_ca),
            "--image-opts",
            &format!("driver=nbd,host=localhost,port={port},tls-creds=tls0"),
        ],
    );
    // Options before STARTTLS: NBD_REP_ERR_TLS_REQD; NBD_OPT_EXPORT_NAME ends the connection
    // without the export's size.
    let mut s = greeted(&addr);
    send_option(&mut s, OPT_GO, &[0, 0, 0, 0, 0, 0]);
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        u32::from_be_bytes(reply[12..16].try_into().unwrap()),
        REP_ERR_TLS_REQD
    );
    let mut why = vec![0u8; u32::from_be_bytes(reply[16..20].try_into().unwrap()) as usize];
    s.read_exact(&mut why).unwrap();
    send_option(&mut s, OPT_EXPORT_NAME, b"");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "sent {rest:02x?}");

    // The data is still what the good clients wrote.
    let info: Value =
        serde_json::from_slice(&tool("nbdinfo", &["--json", &by_address]).stdout).unwrap();
    assert_eq!(info["TLS"], true);
    server.stop();
}

#[test]
fn serve_tls_on_a_unix_socket_serves_tls_and_plain_clients() {
    let dir = nbd_scratch("tls-on");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &[]);
    let pki = pki(&dir);
    // Without ca-cert.pem the server asks clients for no certificate.
    let server = Served::unix(
        &dir,
        "t.sock",
        &img,
        &key,
        &[
            "--tls",
            "on",
            "--tls-certificates",
            p(&pki.server_any_client),
        ],
    );
    let sock = server.socket().to_path_buf();
    assert!(
        server.uri.starts_with("nbds+unix:///?socket="),
        "{}",
        server.uri
    );
    let tls = with_certificates(&server.uri, &pki.client_without_certificate);
    let plain = format!("nbd+unix:///?socket={}", sock.display());

    let data = pattern((2 * MIB) as usize, 53);
    let src = dir.join("in.raw");
    write_file(&src, &data);
    tool("nbdcopy", &[p(&src), &tls]);
    let out = dir.join("out.raw");
    tool("nbdcopy", &[&plain, p(&out)]);
    assert_same(&read_file(&out)[..data.len()], &data, "TLS in, plain out");
    for (uri, over_tls) in [(&tls, true), (&plain, false)] {
        let info: Value =
            serde_json::from_slice(&tool("nbdinfo", &["--json", uri]).stdout).unwrap();
        assert_eq!(info["TLS"], over_tls, "{uri}");
    }
    // (libnbd checks the server's certificate over TCP only, its documented default: the
    // refusals are tested over TCP above.)
    server.stop();
}

/// nbdkit's PSK file for `user`, with a 32-byte key as psktool makes them, and another user's
/// line.
fn psk_file(path: &Path, user: &str, seed: u64) {
    let key: String = pattern(32, seed)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    write_file(path, format!("nobody:00ff\n{user}:{key}\n").as_bytes());
}

/// qemu's PSK client credentials: `dir/keys.psk`, as `user`.
fn qemu_psk(dir: &Path, user: &str) -> String {
    format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username={user}",
        dir.display()
    )
}

#[test]
fn serve_tls_psk_reads_and_writes_with_libnbd_and_qemu_and_refuses_wrong_keys() {
    let dir = nbd_scratch("tls-psk");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &[]);
    let psk = dir.join("keys.psk");
    psk_file(&psk, "alice", 61);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = Served::start(
        &dir,
        &[
            p(&img),
            "--key-file",
            p(&key),
            "--listen",
            &addr,
            "--tls",
            "require",
            "--tls-psk",
            p(&psk),
        ],
    );
    assert_eq!(server.uri, format!("nbds://{addr}/"));
    let with_psk =
        |user: &str, file: &Path| format!("nbds://{user}@{addr}/?tls-psk-file={}", file.display());
    let alice = with_psk("alice", &psk);

    // nbdcopy writes and reads back; nbdinfo says TLS.
    let data = pattern((4 * MIB) as usize, 62);
    let src = dir.join("in.raw");
    write_file(&src, &data);
    tool("nbdcopy", &[p(&src), &alice]);
    let out = dir.join("out.raw");
    tool("nbdcopy", &[&alice, p(&out)]);
    assert_same(
        &read_file(&out)[..data.len()],
        &data,
        "nbdcopy over TLS-PSK",
    );
    let info: Value = serde_json::from_slice(&tool("nbdinfo", &["--json", &alice]).stdout).unwrap();
    assert_eq!(info["TLS"], true);
    assert_eq!(
        info["exports"][0]["export-size"].as_u64(),
        Some(server.size)
    );

    // qemu-img (GnuTLS, keys.psk in a directory) reads it, and writes its first MiB.
    let qemu_dir = dir.join("qemu");
    std::fs::create_dir_all(&qemu_dir).unwrap();
    std::fs::copy(&psk, qemu_dir.join("keys.psk")).unwrap();
    let creds = qemu_psk(&qemu_dir, "alice");
    let first = qemu_img_round_trip(&dir, &creds, "127.0.0.1", port, &data, 63);
    std::fs::remove_file(&out).unwrap();
    tool("nbdcopy", &[&alice, p(&out)]);
    assert_same(
        &read_file(&out)[..first.len()],
        &first,
        "qemu-img write over TLS-PSK",
    );

    // Refused, and given nothing: a wrong key (libnbd and qemu), an unknown user, no TLS.
    let wrong = dir.join("wrong.psk");
    psk_file(&wrong, "alice", 64);
    let strangers = dir.join("strangers.psk");
    psk_file(&strangers, "mallory", 61);
    for uri in [
        with_psk("alice", &wrong),
        with_psk("mallory", &strangers),
        format!("nbd://{addr}/"),
    ] {
        let out = refused("nbdinfo", &["--json", &uri]);
        // (Without TLS, nbdinfo prints the protocol it got before it gives up.)
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(!said.contains("export-size"), "{uri}: {said}");
        let copied = dir.join("refused.raw");
        refused("nbdcopy", &[&uri, p(&copied)]);
        assert!(
            std::fs::read(&copied).unwrap_or_default().is_empty(),
            "{uri}"
        );
    }
    let wrong_dir = dir.join("qemu-wrong");
    std::fs::create_dir_all(&wrong_dir).unwrap();
    std::fs::copy(&wrong, wrong_dir.join("keys.psk")).unwrap();
    refused(
        "qemu-img",
        &[
            "info",
            "--object",
            &qemu_psk(&wrong_dir, "alice"),
            "--image-opts",
            &format!("driver=nbd,host=127.0.0.1,port={port},tls-creds=tls0"),
        ],
    );

    // The data is what the good clients wrote: qemu-img's MiB, then nbdcopy's.
    std::fs::remove_file(&out).unwrap();
    tool("nbdcopy", &[&alice, p(&out)]);
    let back = read_file(&out);
    assert_same(&back[..first.len()], &first, "qemu-img write");
    assert_same(
        &back[first.len()..data.len()],
        &data[first.len()..],
        "around qemu-img's write",
    );
    server.stop();
}

#[test]
fn tls_option_refusals_and_the_plain_tcp_warning() {
    let dir = nbd_scratch("tls-refusals");
    let key = key_file(&dir);
    let img = format(&dir, "v", 32, &key, &[]);
    let pki = pki(&dir);
    let sock = dir.join("r.sock");
    let psk = dir.join("keys.psk");
    write_file(&psk, b"alice:0123456789abcdef0123456789abcdef\n");
    // Malformed PSK files: the file and the line are named.
    let bad_psk = |name: &str, text: &[u8]| {
        let path = dir.join(name);
        write_file(&path, text);
        path
    };
    let no_colon = bad_psk("no-colon.psk", b"alice:00ff\nbob 00ff\n");
    let odd_hex = bad_psk("odd.psk", b"alice:0ff\n");
    let not_hex = bad_psk("not-hex.psk", b"\nalice:00ff\nbob:zz\n");
    let empty = bad_psk("empty.psk", b"");
    let missing = dir.join("none.psk");
    let base = [p(&img), "--key-file", p(&key), "--socket", p(&sock)];
    let refusals: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--tls",
                "require",
                "--tls-psk",
                p(&psk),
                "--tls-certificates",
                p(&pki.server),
            ],
            "--tls-certificates and --tls-psk exclude each other",
        ),
        (vec!["--tls-psk", p(&psk)], "--tls-psk needs --tls on"),
        (
            vec!["--tls", "require", "--tls-psk", p(&no_colon)],
            "no-colon.psk: line 2: not username:hexkey",
        ),
        (
            vec!["--tls", "on", "--tls-psk", p(&odd_hex)],
            "odd.psk: line 1: the key is not an even number of hex digits",
        ),
        (
            vec!["--tls", "require", "--tls-psk", p(&not_hex)],
            "not-hex.psk: line 3: the key is not hex",
        ),
        (
            vec!["--tls", "require", "--tls-psk", p(&empty)],
            "empty.psk: holds no username:hexkey line",
        ),
        (
            vec!["--tls", "require", "--tls-psk", p(&missing)],
            "none.psk: ",
        ),
        (vec!["--tls", "require"], "--tls-certificates DIR"),
        (vec!["--tls", "on"], "--tls-certificates DIR"),
        (
            vec!["--tls-certificates", p(&pki.server)],
            "--tls on or --tls require",
        ),
        (
            vec!["--tls", "require", "--tls-certificates", p(&dir)],
            "server-cert.pem",
        ),
        (vec!["--tls", "sometimes"], "sometimes"),
    ];
    for (extra, says) in refusals {
        let args = [&base[..], &extra[..]].concat();
        let (code, err) = serve_refused(&args);
        assert_eq!(code, Some(1), "{extra:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
        assert!(
            std::fs::symlink_metadata(&sock).is_err(),
            "{extra:?}: no socket made"
        );
    }

    // Plain TCP is served, with one warning; TLS on TCP has none (the test above).
    let addr = format!("127.0.0.1:{}", free_port());
    let server = Served::start(&dir, &[p(&img), "--key-file", p(&key), "--listen", &addr]);
    tool("nbdinfo", &[&format!("nbd://{addr}/")]);
    let log = server.stderr();
    assert_eq!(log.matches("without TLS").count(), 1, "{log}");
    assert!(log.contains(&format!(
        "warning: serving TCP without TLS: whoever reaches {addr}"
    )));
    server.stop();
}

/// qemu-img, with the TLS credentials object `creds` (id `tls0`), reads the export at
/// `host:port` (its first `data.len()` bytes must be `data`), then writes a MiB of
/// `pattern(seed)` at its start; returns that MiB.
fn qemu_img_round_trip(
    dir: &Path,
    creds: &str,
    host: &str,
    port: u16,
    data: &[u8],
    seed: u64,
) -> Vec<u8> {
    let via_qemu = dir.join("qemu.raw");
    let source = format!("driver=nbd,host={host},port={port},tls-creds=tls0");
    tool(
        "qemu-img",
        &[
            "convert",
            "--object",
            creds,
            "--image-opts",
            &source,
            "-O",
            "raw",
            p(&via_qemu),
        ],
    );
    assert_same(&read_file(&via_qemu)[..data.len()], data, "qemu-img read");
    let first = pattern(MIB as usize, seed);
    let first_src = dir.join("first.raw");
    write_file(&first_src, &first);
    let target =
        format!("driver=raw,file.driver=nbd,file.host={host},file.port={port},file.tls-creds=tls0");
    tool(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            p(&first_src),
            "--object",
            creds,
            "--target-image-opts",
            &target,
        ],
    );
    first
}
