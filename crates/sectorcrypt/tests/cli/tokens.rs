//! Unlocking by token (issue 33) against the real tools on the other side: SoftHSM as the
//! security token (through p11-kit's proxy, as systemd loads it), `systemd-cryptenroll` to
//! enroll, and cryptsetup with systemd's token plugin to unlock. Each test has a SoftHSM token
//! store of its own (`SOFTHSM2_CONF`, passed to each child, never set in this process).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use sha2::Digest;

use crate::common::{
    cryptsetup_volume_key, cs_fast, key, luks2_volume, ok, p, run, sc_fast, scratch, Scratch,
};
use crate::nbd::{assert_same, read_file, tool, write_file, Served, BIN};

const PIN: &str = "123456";
const SOFTHSM_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

/// A SoftHSM token "sc-test" holding an RSA-2048 key and its certificate under id 01.
struct Hsm {
    dir: Scratch,
    conf: PathBuf,
}

impl Hsm {
    fn new(name: &str) -> Hsm {
        let dir = scratch(&format!("token-{name}"));
        let conf = dir.join("softhsm2.conf");
        std::fs::create_dir(dir.join("tokens")).unwrap();
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                dir.join("tokens").display()
            ),
        )
        .unwrap();
        let hsm = Hsm { dir, conf };
        ok(
            run(hsm.cmd("softhsm2-util").args([
                "--init-token",
                "--free",
                "--label",
                "sc-test",
                "--so-pin",
                "87654321",
                "--pin",
                PIN,
            ])),
            "softhsm2-util --init-token",
        );
        let d = |n: &str| hsm.dir.join(n);
        let openssl = |args: &[&str]| ok(run(Command::new("openssl").args(args)), "openssl");
        let (key_pem, cert_pem) = (d("key.pem"), d("cert.pem"));
        let (key_der, cert_der) = (d("key.der"), d("cert.der"));
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=sc-test",
            "-days",
            "3650",
            "-keyout",
            p(&key_pem),
            "-out",
            p(&cert_pem),
        ]);
        openssl(&[
            "pkcs8",
            "-topk8",
            "-nocrypt",
            "-outform",
            "DER",
            "-in",
            p(&key_pem),
            "-out",
            p(&key_der),
        ]);
        openssl(&[
            "x509",
            "-outform",
            "DER",
            "-in",
            p(&cert_pem),
            "-out",
            p(&cert_der),
        ]);
        for (file, kind) in [("key.der", "privkey"), ("cert.der", "cert")] {
            ok(
                run(hsm.cmd("pkcs11-tool").args([
                    "--module",
                    SOFTHSM_MODULE,
                    "--login",
                    "--pin",
                    PIN,
                    "--token-label",
                    "sc-test",
                    "--id",
                    "01",
                    "--label",
                    "sc-key",
                    "--type",
                    kind,
                    "--write-object",
                    p(&d(file)),
                ])),
                "pkcs11-tool --write-object",
            );
        }
        hsm
    }

    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SOFTHSM2_CONF", &self.conf);
        c
    }

    /// `sectorcrypt ARGS` (with fast key derivation where a keyslot is made) seeing the token.
    fn sc(&self, args: &[&str]) -> Output {
        run(self.cmd(BIN).args(args))
    }

    /// `sectorcrypt ARGS`, which must exit with `code`; its standard error.
    fn sc_exits(&self, args: &[&str], code: i32) -> String {
        let out = self.sc(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "sectorcrypt {args:?}: {err}");
        err
    }

    /// A file holding `pin` and a newline.
    fn pin_file(&self, name: &str, pin: &str) -> PathBuf {
        let f = self.dir.join(name);
        std::fs::write(&f, format!("{pin}\n")).unwrap();
        f
    }

    /// Whether `cryptsetup open --test-passphrase --token-only` (systemd's plugin) opens `img`
    /// with `pin` on its standard input.
    fn opens_in_cryptsetup(&self, img: &Path, pin: &str) -> bool {
        let mut child = self
            .cmd("cryptsetup")
            .args(["open", "--test-passphrase", "--token-only", p(img)])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cryptsetup");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{pin}\n").as_bytes())
            .unwrap();
        child.wait().unwrap().success()
    }
}

/// A LUKS2 image formatted by cryptsetup with the passphrase in `pass`.
fn cryptsetup_image(dir: &Path, pass: &Path) -> PathBuf {
    let img = dir.join("disk.img");
    luks2_volume(&img, 32 << 20, pass);
    img
}

/// `systemd-cryptenroll --pkcs11-token-uri URI` of `img`, unlocked by the passphrase in `pass`.
fn systemd_enroll(hsm: &Hsm, pass: &Path, img: &Path, uri: &str) {
    ok(
        run(hsm.cmd("systemd-cryptenroll").env("PIN", PIN).args([
            &format!("--unlock-key-file={}", p(pass)),
            &format!("--pkcs11-token-uri={uri}"),
            p(img),
        ])),
        "systemd-cryptenroll",
    );
}

/// The volume key `dump --dump-volume-key --json` gives for `img` through `program` (sectorcrypt,
/// perhaps with an environment) with `unlock` (token options), as hex.
fn volume_key_by(mut program: Command, unlock: &[&str], img: &Path) -> String {
    let out = ok(
        run(program
            .args(["dump", "--dump-volume-key", "--json", "-q"])
            .args(unlock)
            .arg(img)),
        "dump --dump-volume-key by token",
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["volume_key"].as_str().unwrap().to_string()
}

fn header_json(img: &Path) -> Value {
    let out = ok(
        crate::common::sc(&["dump", "--json", p(img)]),
        "dump --json",
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// 1. A volume `systemd-cryptenroll` enrolled opens here by its token, with the same volume key
///    as its passphrase gives (the token URI says `type=cert`, which systemd 252's own plugin
///    refuses; the private key beside the certificate is used).
/// 2. A wrong PIN, and no PIN at all, are refused with exit 2 and leave the image unchanged.
#[test]
fn a_volume_systemd_enrolled_unlocks_here_and_a_wrong_pin_changes_nothing() {
    let hsm = Hsm::new("systemd");
    let pass = key(&hsm.dir, "pass");
    let img = cryptsetup_image(&hsm.dir, &pass);
    systemd_enroll(&hsm, &pass, &img, "pkcs11:token=sc-test;id=%01;type=cert");
    let pin = hsm.pin_file("pin", PIN);
    let err = hsm.sc_exits(
        &[
            "test-passphrase",
            "--token-only",
            "--token-pin-file",
            p(&pin),
            p(&img),
        ],
        0,
    );
    assert!(err.contains("Key slot 1 unlocked."), "{err}");
    assert_eq!(
        volume_key_by(
            hsm.cmd(BIN),
            &[
                "--token-type",
                "systemd-pkcs11",
                "--token-only",
                "--token-pin-file",
                p(&pin)
            ],
            &img
        ),
        cryptsetup_volume_key(&img, &pass)
    );

    let before = std::fs::read(&img).unwrap();
    let bad = hsm.pin_file("bad", "000000");
    let err = hsm.sc_exits(
        &[
            "test-passphrase",
            "--token-only",
            "--token-pin-file",
            p(&bad),
            p(&img),
        ],
        2,
    );
    assert!(err.contains("refused the PIN"), "{err}");
    let err = hsm.sc_exits(&["test-passphrase", "--token-only", p(&img)], 2);
    assert!(err.contains("needs a PIN"), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused PIN wrote to the image"
    );
}

/// 1. `enroll` writes the token systemd writes: cryptsetup with systemd's plugin opens the
///    volume by it, and refuses a wrong PIN.
/// 2. The stored URI has no `type=cert` (systemd 252's plugin would refuse it), the keyslot is
///    PBKDF2-SHA512 at 1,000 iterations as systemd's, and the encrypted key is one RSA-2048 block.
/// 3. A second enrolment with `--wipe-slot password` removes the passphrase keyslot only: the
///    passphrase no longer opens the volume, both tokens still do, in both tools.
#[test]
fn a_volume_enrolled_here_unlocks_in_cryptsetup_and_wipe_slot_retires_the_passphrase() {
    let hsm = Hsm::new("enroll");
    let pass = key(&hsm.dir, "pass");
    let img = hsm.dir.join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    ok(
        sc_fast(&["format", "-q", "--key-file", p(&pass), p(&img)]),
        "format",
    );
    let pin = hsm.pin_file("pin", PIN);
    let out = ok(
        hsm.sc(&[
            "enroll",
            "--key-file",
            p(&pass),
            "--token-pin-file",
            p(&pin),
            "--json",
            "--pkcs11-token-uri",
            "pkcs11:token=sc-test;id=%01;type=cert",
            p(&img),
        ]),
        "enroll",
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["keyslot"].as_u64(), v["token"].as_u64()),
        (Some(1), Some(0))
    );
    let h = header_json(&img);
    let token = &h["tokens"]["0"];
    assert_eq!(token["type"], "systemd-pkcs11");
    assert_eq!(token["keyslots"], serde_json::json!(["1"]));
    assert_eq!(token["pkcs11-uri"], "pkcs11:token=sc-test;id=%01");
    let encrypted = token["pkcs11-key"].as_str().unwrap();
    assert_eq!(encrypted.len(), 344, "one 256-byte RSA block in base64");
    let kdf = &h["keyslots"]["1"]["kdf"];
    assert_eq!(
        (kdf["type"].as_str(), kdf["hash"].as_str()),
        (Some("pbkdf2"), Some("sha512"))
    );
    assert_eq!(kdf["iterations"], 1000);

    assert!(
        hsm.opens_in_cryptsetup(&img, PIN),
        "cryptsetup's plugin opens it"
    );
    assert!(
        !hsm.opens_in_cryptsetup(&img, "000000"),
        "a wrong PIN opens it"
    );

    let out = ok(
        hsm.sc(&[
            "enroll",
            "--key-file",
            p(&pass),
            "--json",
            "--pkcs11-token-uri",
            "pkcs11:token=sc-test;object=sc-key",
            "--wipe-slot",
            "password",
            p(&img),
        ]),
        "enroll --wipe-slot password",
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["keyslot"], 2);
    assert_eq!(v["wiped_keyslots"], serde_json::json!([0]));
    assert!(
        !crate::common::opens_in_cryptsetup(&img, &pass),
        "the passphrase still opens it"
    );
    for token in ["0", "1"] {
        hsm.sc_exits(
            &[
                "test-passphrase",
                "--token-id",
                token,
                "--token-only",
                "--token-pin-file",
                p(&pin),
                p(&img),
            ],
            0,
        );
    }
    assert!(
        hsm.opens_in_cryptsetup(&img, PIN),
        "cryptsetup's plugin opens it"
    );
}

/// 1. Without `--token-only`, a token that fails gives way to the passphrase, and `--verbose`
///    says why it failed.
/// 2. A token of a type sectorcrypt does not use is passed over with its reason.
/// 3. Malformed systemd-pkcs11 and clevis tokens are refused by `token import`, each with its
///    reason.
/// 4. Bad option combinations and a LUKS1 volume are refused before anything is asked.
#[test]
fn a_failed_token_gives_way_to_the_passphrase() {
    let hsm = Hsm::new("fallback");
    let pass = key(&hsm.dir, "pass");
    let img = cryptsetup_image(&hsm.dir, &pass);
    systemd_enroll(&hsm, &pass, &img, "pkcs11:token=sc-test;id=%01");
    let bad = hsm.pin_file("bad", "000000");
    let err = hsm.sc_exits(
        &[
            "-v",
            "test-passphrase",
            "--token-id",
            "0",
            "--token-pin-file",
            p(&bad),
            "--key-file",
            p(&pass),
            p(&img),
        ],
        0,
    );
    assert!(
        err.contains("token 0 (systemd-pkcs11): security token 'sc-test' refused the PIN")
            && err.contains("Key slot 0 unlocked."),
        "{err}"
    );

    // systemd-pkcs11 and clevis tokens are checked on import as cryptsetup's plugins check them.
    let bad = hsm.dir.join("bad.json");
    for (text, why) in [
        (
            r#"{"type":"systemd-pkcs11","keyslots":["0"],"pkcs11-key":"AAAA"}"#,
            "pkcs11-uri",
        ),
        (
            r#"{"type":"systemd-pkcs11","keyslots":["0"],"pkcs11-uri":"pkcs11:","pkcs11-key":7}"#,
            "pkcs11-key",
        ),
        (
            r#"{"type":"systemd-pkcs11","keyslots":[0],"pkcs11-uri":"pkcs11:","pkcs11-key":"AAAA"}"#,
            "keyslots",
        ),
        (
            r#"{"type":"systemd-pkcs11","keyslots":["0"],"pkcs11-uri":"pkcs11:?pin-value=1","pkcs11-key":"AAAA"}"#,
            "PIN",
        ),
        (r#"{"type":"clevis","keyslots":["0"]}"#, "jwe"),
        (
            r#"{"type":"clevis","keyslots":["0"],"jwe":{"protected":"!!","iv":"","ciphertext":"","tag":""}}"#,
            "protected",
        ),
    ] {
        std::fs::write(&bad, text).unwrap();
        let err = hsm.sc_exits(&["token", "import", "--json-file", p(&bad), p(&img)], 1);
        assert!(
            err.contains("the token is not valid") && err.contains(why),
            "{text}: {err}"
        );
    }
    let long = format!(
        r#"{{"type":"systemd-pkcs11","keyslots":["0"],"pkcs11-uri":"pkcs11:","pkcs11-key":"{}"}}"#,
        "A".repeat(4000)
    );
    std::fs::write(&bad, long).unwrap();
    let err = hsm.sc_exits(&["token", "import", "--json-file", p(&bad), p(&img)], 1);
    assert!(err.contains("longer than"), "{err}");

    let json = hsm.dir.join("other.json");
    std::fs::write(&json, r#"{"type":"x-other","keyslots":["0"]}"#).unwrap();
    ok(
        hsm.sc(&["token", "import", "--json-file", p(&json), p(&img)]),
        "token import",
    );
    let luks1 = hsm.dir.join("luks1.img");
    std::fs::File::create(&luks1)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    ok(
        cs_fast(&[
            "luksFormat",
            "-q",
            "--type",
            "luks1",
            "--key-file",
            p(&pass),
            p(&luks1),
        ]),
        "luksFormat luks1",
    );
    let (img, pass, luks1) = (p(&img), p(&pass), p(&luks1));
    let refused: [(&[&str], i32, &str); 6] = [
        (
            &["--token-only", "--token-type", "x-other", img],
            2,
            "token 1 (x-other): sectorcrypt does not use tokens of this type",
        ),
        (
            &["--token-only", "--token-type", "systemd-tpm9", img],
            2,
            "it has no such token",
        ),
        (&["--token-only", "--key-file", pass, img], 1, "--key-file"),
        (
            &[
                "--token-id",
                "0",
                "--token-pin-file",
                "-",
                "--key-file",
                "-",
                img,
            ],
            1,
            "standard input",
        ),
        (&["--token-only", luks1], 1, "LUKS1"),
        (&["--token-id", "0", "--key-file", pass, luks1], 1, "LUKS1"),
    ];
    for (args, code, why) in refused {
        let err = hsm.sc_exits(&[&["test-passphrase"], args].concat(), code);
        assert!(err.contains(why), "{args:?}: {err}");
    }
    let err = hsm.sc_exits(
        &[
            "enroll",
            "--key-file",
            pass,
            "--pkcs11-token-uri",
            "auto",
            luks1,
        ],
        1,
    );
    assert!(err.contains("LUKS1"), "{err}");
}

/// `serve` unlocks by token alone: data written through a server unlocked by the passphrase
/// reads back through one unlocked by the token.
#[test]
fn serve_unlocks_by_token() {
    let hsm = Hsm::new("serve");
    let pass = key(&hsm.dir, "pass");
    let img = cryptsetup_image(&hsm.dir, &pass);
    let pin = hsm.pin_file("pin", PIN);
    ok(
        hsm.sc(&[
            "enroll",
            "--key-file",
            p(&pass),
            "--token-pin-file",
            p(&pin),
            "--pkcs11-token-uri",
            "pkcs11:token=sc-test;id=%01",
            p(&img),
        ]),
        "enroll",
    );
    let data = sectorcrypt_testkit::pattern(1 << 20, 33);
    let src = hsm.dir.join("data.bin");
    write_file(&src, &data);
    let sock = hsm.dir.join("s");
    let by_pass = Served::unix(&hsm.dir, "s", &img, &pass, &[]);
    tool("nbdcopy", &[p(&src), &by_pass.uri]);
    by_pass.stop();
    let mut program = hsm.cmd(BIN);
    program.arg("serve");
    let by_token = Served::start_program(
        &hsm.dir,
        program,
        &[
            p(&img),
            "--token-only",
            "--token-pin-file",
            p(&pin),
            "--socket",
            p(&sock),
        ],
    );
    let out = hsm.dir.join("back.bin");
    tool("nbdcopy", &[&by_token.uri, p(&out)]);
    by_token.stop();
    assert_same(
        &read_file(&out)[..data.len()],
        &data,
        "read back through the token's server",
    );
}

/// A tang server on loopback: Debian's `tangd` run per connection (as its systemd socket unit
/// runs it), its keys made by `tangd-keygen` in the test's folder. Stopped when dropped.
struct Tang {
    url: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    addr: std::net::SocketAddr,
}

impl Tang {
    fn start(db: &Path) -> Tang {
        std::fs::create_dir_all(db).unwrap();
        ok(
            run(Command::new("/usr/libexec/tangd-keygen").arg(db)),
            "tangd-keygen",
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (db, flag) = (db.to_path_buf(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let input = std::os::fd::OwnedFd::from(conn.try_clone().unwrap());
                let output = std::os::fd::OwnedFd::from(conn);
                let child = Command::new("/usr/libexec/tangd")
                    .arg(&db)
                    .stdin(Stdio::from(input))
                    .stdout(Stdio::from(output))
                    .stderr(Stdio::null())
                    .spawn();
                if let Ok(mut child) = child {
                    std::thread::spawn(move || child.wait());
                }
            }
        });
        Tang {
            url: format!("http://{addr}"),
            stop,
            addr,
        }
    }
}

impl Drop for Tang {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag and closes the listener.
        let _ = std::net::TcpStream::connect(self.addr);
    }
}

/// 1. A volume `clevis luks bind ... tang` bound opens here by its token, with the volume key
///    its passphrase gives.
/// 2. `enroll --clevis tang` refuses a server whose signing keys it was not told to trust (and
///    names their thumbprints), then, given the thumbprint, writes the token clevis writes:
///    `clevis luks pass` recovers the passphrase from it, and cryptsetup opens the volume with
///    that passphrase.
/// 3. With the tang server gone, the tokens cannot unlock: exit 2 with the reason, and nothing
///    written.
#[test]
fn tang_bindings_work_both_ways_with_clevis() {
    let dir = scratch("token-tang");
    let tang = Tang::start(&dir.join("db"));
    let pass = key(&dir, "pass");
    let img = cryptsetup_image(&dir, &pass);
    let config = format!(r#"{{"url":"{}"}}"#, tang.url);
    ok(
        run(Command::new("clevis").args([
            "luks",
            "bind",
            "-y",
            "-d",
            p(&img),
            "-k",
            p(&pass),
            "tang",
            &config,
        ])),
        "clevis luks bind",
    );
    let err = crate::common::sc_exits(&["test-passphrase", "--token-only", p(&img)], 0);
    assert!(err.contains("Key slot 1 unlocked."), "{err}");
    assert_eq!(
        volume_key_by(
            Command::new(BIN),
            &["--token-only", "--token-type", "clevis"],
            &img
        ),
        cryptsetup_volume_key(&img, &pass)
    );

    let enroll = |extra: &[&str]| {
        let mut args = vec![
            "enroll",
            "--key-file",
            p(&pass),
            "--json",
            "--clevis",
            "tang",
        ];
        args.push(&tang.url);
        args.extend_from_slice(extra);
        args.push(p(&img));
        crate::common::sc(&args)
    };
    let before = std::fs::read(&img).unwrap();
    let refused = enroll(&[]);
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused enrolment wrote"
    );
    let thp = err
        .split("thumbprints: ")
        .nth(1)
        .and_then(|t| t.split(')').next())
        .unwrap_or_else(|| panic!("no thumbprint in {err}"))
        .to_string();
    let refused = enroll(&["--tang-thumbprint", "-AAAA"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        refused.status.code() == Some(1) && err.contains("not trusted"),
        "a thumbprint starting with '-' is a value: {err}"
    );
    let out = ok(enroll(&["--tang-thumbprint", &thp]), "enroll --clevis tang");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["keyslot"].as_u64(), v["token"].as_u64()),
        (Some(2), Some(1))
    );
    let h = header_json(&img);
    let token = &h["tokens"]["1"];
    assert_eq!(token["type"], "clevis");
    assert_eq!(token["keyslots"], serde_json::json!(["2"]));
    assert_eq!(token["jwe"]["encrypted_key"], "");
    let kdf = &h["keyslots"]["2"]["kdf"];
    assert_eq!(
        (kdf["type"].as_str(), kdf["iterations"].as_u64()),
        (Some("pbkdf2"), Some(1000))
    );
    let recovered = ok(
        run(Command::new("clevis").args(["luks", "pass", "-d", p(&img), "-s", "2"])),
        "clevis luks pass",
    );
    let pass2 = dir.join("recovered.key");
    std::fs::write(&pass2, &recovered.stdout).unwrap();
    assert!(
        crate::common::opens_in_cryptsetup(&img, &pass2),
        "clevis' passphrase opens it"
    );
    let err = crate::common::sc_exits(
        &[
            "test-passphrase",
            "--token-id",
            "1",
            "--token-only",
            p(&img),
        ],
        0,
    );
    assert!(err.contains("Key slot 2 unlocked."), "{err}");

    drop(tang);
    let before = std::fs::read(&img).unwrap();
    let err = crate::common::sc_exits(&["test-passphrase", "--token-only", p(&img)], 2);
    assert!(err.contains("cannot reach tang server"), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a failed unlock wrote"
    );
}

/// A software TPM 2.0 (swtpm) on a Unix socket in `dir`, started and stopped by the test; its
/// TCTI string is what sectorcrypt, systemd and tpm2-tools are given.
pub(crate) struct Swtpm {
    child: std::process::Child,
    pub(crate) tcti: String,
}

impl Swtpm {
    /// A TPM whose command socket sectorcrypt, systemd and tpm2-tools connect to, started up.
    pub(crate) fn start(dir: &Path) -> Swtpm {
        let sock = dir.join("tpm.sock");
        Swtpm::launch(
            dir,
            &sock,
            &[
                "--server",
                &format!("type=unixio,path={}", p(&sock)),
                "--ctrl",
                &format!("type=unixio,path={}.ctrl", p(&sock)),
                "--flags",
                "not-need-init,startup-clear",
            ],
        )
    }

    /// The same TPM (its state in `dir`) for QEMU: only a control socket, through which QEMU
    /// passes the data channel, and the guest's firmware starts it up.
    fn start_for_qemu(dir: &Path) -> Swtpm {
        let ctrl = dir.join("qemu-tpm.ctrl");
        Swtpm::launch(
            dir,
            &ctrl,
            &["--ctrl", &format!("type=unixio,path={}", p(&ctrl))],
        )
    }

    fn launch(dir: &Path, sock: &Path, args: &[&str]) -> Swtpm {
        let state = dir.join("tpm");
        std::fs::create_dir_all(&state).unwrap();
        let _ = std::fs::remove_file(sock);
        let child = Command::new("swtpm")
            .args(["socket", "--tpm2", "--tpmstate"])
            .arg(format!("dir={}", p(&state)))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("swtpm (run scripts/install-test-deps.sh)");
        // swtpm creates the socket before it accepts: wait for it (a bounded wait, not a timing).
        for _ in 0..1000 {
            if sock.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(sock.exists(), "swtpm did not create {}", sock.display());
        Swtpm {
            child,
            tcti: format!("swtpm:path={}", p(sock)),
        }
    }

    /// `sectorcrypt test-passphrase --token-only` of `img` with this TPM and `extra` options,
    /// which must exit with `code`; its standard error.
    fn test_passphrase(&self, img: &Path, extra: &[&str], code: i32) -> String {
        let mut args = vec![
            "test-passphrase",
            "--token-only",
            "--tpm2-device",
            &self.tcti,
        ];
        args.extend_from_slice(extra);
        args.push(p(img));
        crate::common::sc_exits(&args, code)
    }

    /// `tpm2_TOOL ARGS` against this TPM; it must succeed.
    fn tools(&self, tool: &str, args: &[&str]) -> Output {
        ok(
            run(Command::new(tool)
                .env("TPM2TOOLS_TCTI", &self.tcti)
                .args(args)),
            tool,
        )
    }

    /// The secret a `systemd-tpm2` token seals, unsealed by tpm2-tools (an independent TSS): the
    /// primary key from tpm2-tools' default storage template, which must be systemd's, the
    /// blob loaded under it, and a policy session of PolicyPCR over `pcrs` and, with `pin`,
    /// PolicyAuthValue with SHA-256(PIN) as the authValue.
    fn unseal_with_tpm2_tools(
        &self,
        dir: &Path,
        token: &Value,
        pcrs: &str,
        pin: Option<&str>,
    ) -> Vec<u8> {
        use base64::Engine;
        let blob = base64::engine::general_purpose::STANDARD
            .decode(token["tpm2-blob"].as_str().unwrap())
            .unwrap();
        let n = u16::from_be_bytes([blob[0], blob[1]]) as usize;
        let f = |name: &str| dir.join(name);
        std::fs::write(f("priv"), &blob[..2 + n]).unwrap();
        std::fs::write(f("pub"), &blob[2 + n..]).unwrap();
        // No resource manager: every tool's objects are flushed before the next one loads its own.
        self.tools("tpm2_flushcontext", &["-t"]);
        self.tools(
            "tpm2_createprimary",
            &[
                "-Q",
                "-C",
                "o",
                "-G",
                "ecc256:aes128cfb",
                "-g",
                "sha256",
                "-c",
                p(&f("primary.ctx")),
            ],
        );
        self.tools("tpm2_flushcontext", &["-t"]);
        self.tools(
            "tpm2_load",
            &[
                "-Q",
                "-C",
                p(&f("primary.ctx")),
                "-u",
                p(&f("pub")),
                "-r",
                p(&f("priv")),
                "-c",
                p(&f("obj.ctx")),
            ],
        );
        self.tools("tpm2_flushcontext", &["-t"]);
        let session = f("session.ctx");
        self.tools(
            "tpm2_startauthsession",
            &["-Q", "--policy-session", "-S", p(&session)],
        );
        self.tools(
            "tpm2_policypcr",
            &["-Q", "-S", p(&session), "-l", &format!("sha256:{pcrs}")],
        );
        let mut auth = format!("session:{}", p(&session));
        if let Some(pin) = pin {
            self.tools("tpm2_policyauthvalue", &["-Q", "-S", p(&session)]);
            let hash = sha2::Sha256::digest(pin.as_bytes());
            auth += &format!("+hex:{}", hex::encode(hash));
        }
        let out = self.tools("tpm2_unseal", &["-c", p(&f("obj.ctx")), "-p", &auth]);
        let _ = run(Command::new("tpm2_flushcontext")
            .env("TPM2TOOLS_TCTI", &self.tcti)
            .arg(p(&session)));
        self.tools("tpm2_flushcontext", &["-t"]);
        out.stdout
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// 1. Volumes `systemd-cryptenroll --tpm2-device` sealed (PCR 7; PCR 7 with a PIN; PCRs 0+7)
///    open here by their tokens, with the volume key the passphrase gives.
/// 2. Once PCR 7 is extended, the tokens no longer unseal: exit 2 naming the changed PCRs, and
///    nothing written; a wrong PIN exits 2.
#[test]
fn tpm2_tokens_systemd_sealed_unlock_here_until_a_pcr_changes() {
    let dir = scratch("token-tpm2-systemd");
    let tpm = Swtpm::start(&dir);
    let pass = key(&dir, "pass");
    let img = cryptsetup_image(&dir, &pass);
    for (pcrs, with_pin) in [("7", "no"), ("7", "yes"), ("0+7", "no")] {
        // No resource manager: what systemd's TSS left loaded is flushed first.
        tpm.tools("tpm2_flushcontext", &["-l"]);
        tpm.tools("tpm2_flushcontext", &["-t"]);
        ok(
            run(Command::new("systemd-cryptenroll")
                .env("NEWPIN", "4321")
                .args([
                    &format!("--unlock-key-file={}", p(&pass)),
                    &format!("--tpm2-device={}", tpm.tcti),
                    &format!("--tpm2-pcrs={pcrs}"),
                    &format!("--tpm2-with-pin={with_pin}"),
                    p(&img),
                ])),
            "systemd-cryptenroll --tpm2-device",
        );
    }
    let pin = dir.join("pin");
    std::fs::write(&pin, "4321\n").unwrap();
    let bad = dir.join("bad");
    std::fs::write(&bad, "1111\n").unwrap();
    let sc = |extra: &[&str], code: i32| tpm.test_passphrase(&img, extra, code);
    assert!(sc(&["--token-id", "0"], 0).contains("Key slot 1 unlocked."));
    assert!(
        sc(&["--token-id", "1", "--token-pin-file", p(&pin)], 0).contains("Key slot 2 unlocked.")
    );
    assert!(sc(&["--token-id", "2"], 0).contains("Key slot 3 unlocked."));
    assert_eq!(
        volume_key_by(
            Command::new(BIN),
            &["--token-id", "0", "--tpm2-device", &tpm.tcti],
            &img
        ),
        cryptsetup_volume_key(&img, &pass)
    );

    // A wrong PIN counts against the TPM's dictionary-attack protection (swtpm locks out at
    // once, so no PIN-protected unseal can follow); the PCR check below comes before any
    // authorization.
    let err = sc(&["--token-id", "1", "--token-pin-file", p(&bad)], 2);
    assert!(err.contains("the PIN is wrong"), "{err}");
    tpm.tools(
        "tpm2_pcrextend",
        &["7:sha256=0000000000000000000000000000000000000000000000000000000000000001"],
    );
    let before = std::fs::read(&img).unwrap();
    let err = sc(&["--token-id", "0"], 2);
    assert!(err.contains("PCRs [7] changed"), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused unseal wrote"
    );
}

/// `enroll --tpm2-device` seals as systemd does: tpm2-tools, from its own default primary
/// template, unseals the blob under the policy the token names (PCRs 0 and 7; and with a PIN),
/// and the base64 of what it unseals opens the keyslot in cryptsetup. sectorcrypt unlocks by
/// both tokens; a wrong PIN exits 2.
#[test]
fn tpm2_tokens_enrolled_here_unseal_with_tpm2_tools() {
    let dir = scratch("token-tpm2-enroll");
    let tpm = Swtpm::start(&dir);
    let pass = key(&dir, "pass");
    let img = cryptsetup_image(&dir, &pass);
    let pin = dir.join("pin");
    std::fs::write(&pin, "4321\n").unwrap();
    for (pcrs, with_pin) in [("0+7", false), ("7", true)] {
        let mut args = vec![
            "enroll",
            "--key-file",
            p(&pass),
            "--json",
            "--tpm2-device",
            &tpm.tcti,
            "--tpm2-pcrs",
            pcrs,
        ];
        if with_pin {
            args.extend(["--tpm2-with-pin", "--token-pin-file", p(&pin)]);
        }
        args.push(p(&img));
        let out = ok(crate::common::sc(&args), "enroll --tpm2-device");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let token = &header_json(&img)["tokens"][v["token"].as_u64().unwrap().to_string()];
        assert_eq!(token["type"], "systemd-tpm2");
        assert_eq!(token["tpm2-pin"], with_pin);
        assert_eq!(token["tpm2-primary-alg"], "ecc");
        let secret = tpm.unseal_with_tpm2_tools(
            &dir,
            token,
            &pcrs.replace('+', ","),
            with_pin.then_some("4321"),
        );
        use base64::Engine;
        let unsealed = dir.join("unsealed.key");
        std::fs::write(
            &unsealed,
            base64::engine::general_purpose::STANDARD.encode(&secret),
        )
        .unwrap();
        assert!(
            crate::common::opens_in_cryptsetup(&img, &unsealed),
            "{pcrs}: tpm2-tools' secret"
        );
    }
    let sc = |extra: &[&str], code: i32| tpm.test_passphrase(&img, extra, code);
    assert!(sc(&["--token-id", "0"], 0).contains("Key slot 1 unlocked."));
    assert!(
        sc(&["--token-id", "1", "--token-pin-file", p(&pin)], 0).contains("Key slot 2 unlocked.")
    );
    // `--tpm2-device auto` is $SYSTEMD_TPM2_DEVICE, as systemd reads it.
    let by_env = run(Command::new(BIN)
        .env("SYSTEMD_TPM2_DEVICE", &tpm.tcti)
        .args([
            "test-passphrase",
            "--token-only",
            "--token-id",
            "0",
            "--tpm2-device",
            "auto",
        ])
        .arg(&img));
    ok(by_env, "--tpm2-device auto with $SYSTEMD_TPM2_DEVICE");
    // kill-slot proves a remaining key by a token too: the passphrase's keyslot goes.
    ok(
        crate::common::sc(&[
            "kill-slot",
            "--token-id",
            "0",
            "--tpm2-device",
            &tpm.tcti,
            p(&img),
            "0",
        ]),
        "kill-slot by token",
    );
    assert!(
        !crate::common::opens_in_cryptsetup(&img, &pass),
        "keyslot 0 stayed"
    );
    let bad = dir.join("bad");
    std::fs::write(&bad, "1111\n").unwrap();
    sc(&["--token-id", "1", "--token-pin-file", p(&bad)], 2);
}

/// systemd's own TPM2 token plugin, in a real kernel that drives the test's swtpm as a TIS chip
/// (`/dev/tpmrm0` in the kernel oracle's guest):
/// 1. `cryptsetup open --test-passphrase --token-only` opens, by the plugin, both tokens enrolled
///    here (PCR 23; PCR 23 with a PIN);
/// 2. `systemd-cryptenroll --tpm2-device=auto` in the guest seals a third (PCR 16), and
///    sectorcrypt, back on the host with the same TPM, opens the volume by it;
/// 3. once PCR 23 is extended in the guest, the plugin refuses the first token.
#[test]
fn tpm2_tokens_work_both_ways_with_systemds_plugin_in_a_real_kernel() {
    let dir = scratch("token-tpm2-oracle");
    let pass = key(&dir, "pass");
    let pin = dir.join("pin");
    std::fs::write(&pin, "4321\n").unwrap();
    let img = cryptsetup_image(&dir, &pass);
    let tpm = Swtpm::start(&dir);
    for extra in [
        &[][..],
        &["--tpm2-with-pin", "--token-pin-file", p(&pin)][..],
    ] {
        let mut args = vec![
            "enroll",
            "--key-file",
            p(&pass),
            "--tpm2-device",
            &tpm.tcti,
            "--tpm2-pcrs",
            "23",
        ];
        args.extend_from_slice(extra);
        args.push(p(&img));
        ok(crate::common::sc(&args), "enroll --tpm2-device");
    }
    drop(tpm);

    let qemu_tpm = Swtpm::start_for_qemu(&dir);
    let ctrl = dir.join("qemu-tpm.ctrl");
    let out = sectorcrypt_testkit::kernel_oracle::run_with(
        &dir,
        &sectorcrypt_testkit::kernel_oracle::script("kernel-oracle-tpm2.sh"),
        &[p(&img), p(&pass), p(&pin), "0", "1", "--", "16"],
        &[("SECTORCRYPT_ORACLE_TPM", p(&ctrl))],
    );
    drop(qemu_tpm);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "the guest: {text}{err}");
    // After PCR 23 changed, systemd's plugin refuses the token sealed to it.
    for line in ["open 0 ok", "open 1 ok", "enroll ok", "changed 0 failed 1"] {
        assert!(
            text.lines().any(|l| l == line),
            "no {line:?} from the guest: {text}"
        );
    }

    let tpm = Swtpm::start(&dir);
    let h = header_json(&img);
    assert_eq!(h["tokens"]["2"]["tpm2-pcrs"], serde_json::json!([16]));
    let err = crate::common::sc_exits(
        &[
            "test-passphrase",
            "--token-only",
            "--token-id",
            "2",
            "--tpm2-device",
            &tpm.tcti,
            p(&img),
        ],
        0,
    );
    assert!(err.contains("Key slot 3 unlocked."), "{err}");
}

/// An encrypted flash takes a token as a volume does: `enroll --tpm2-device` on the NAND image,
/// then `flash mkvol --token-only` unlocks it by the TPM alone; the new volume is there when
/// read back with the passphrase.
#[test]
fn an_encrypted_flash_unlocks_by_its_tpm2_token() {
    let dir = scratch("token-flash");
    let (img, pass) = crate::flash::new_flash(&dir, &[]);
    let tpm = Swtpm::start(&dir);
    ok(
        crate::common::sc(&[
            "enroll",
            "--key-file",
            p(&pass),
            "--tpm2-device",
            &tpm.tcti,
            "--tpm2-pcrs",
            "7",
            p(&img),
        ]),
        "enroll on a flash",
    );
    ok(
        crate::common::sc(&[
            "flash",
            "mkvol",
            p(&img),
            "-N",
            "tokened",
            "-s",
            "1MiB",
            "--token-only",
            "--tpm2-device",
            &tpm.tcti,
        ]),
        "flash mkvol by token",
    );
    let names = crate::flash::info(&img, &pass);
    assert!(
        crate::flash::volume_names(&names).contains(&"tokened"),
        "{names}"
    );
}

/// `reencrypt --token-only` rotates the volume key of a volume unlocked by its TPM2 token: the
/// data reads back the same through a server unlocked by the token, the passphrase's keyslot is
/// gone as with any reencryption (only the passphrase given keeps working), and the token now
/// names the new keyslot alone.
#[test]
fn reencrypt_by_token_keeps_the_token_working() {
    let dir = scratch("token-reencrypt");
    let tpm = Swtpm::start(&dir);
    let pass = key(&dir, "pass");
    let img = cryptsetup_image(&dir, &pass);
    ok(
        crate::common::sc(&[
            "enroll",
            "--key-file",
            p(&pass),
            "--tpm2-device",
            &tpm.tcti,
            "--tpm2-pcrs",
            "7",
            p(&img),
        ]),
        "enroll --tpm2-device",
    );
    let data = sectorcrypt_testkit::pattern(1 << 20, 34);
    let src = dir.join("data.bin");
    write_file(&src, &data);
    let served = Served::unix(&dir, "s", &img, &pass, &[]);
    tool("nbdcopy", &[p(&src), &served.uri]);
    served.stop();
    let old_key = cryptsetup_volume_key(&img, &pass);

    ok(
        crate::common::sc_fast(&[
            "reencrypt",
            "-q",
            "--token-only",
            "--tpm2-device",
            &tpm.tcti,
            p(&img),
        ]),
        "reencrypt --token-only",
    );
    let h = header_json(&img);
    let slots = h["tokens"]["0"]["keyslots"].clone();
    let only: Vec<&str> = slots
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(only.len(), 1, "{slots}");
    assert_ne!(only[0], "1", "the token names the new keyslot");
    assert!(
        !crate::common::opens_in_cryptsetup(&img, &pass),
        "the passphrase's keyslot stayed"
    );
    let unlock = ["--token-only", "--tpm2-device", &tpm.tcti];
    let new_key = volume_key_by(Command::new(BIN), &unlock, &img);
    assert_ne!(new_key, old_key, "the volume key changed");
    let sock = dir.join("t");
    let mut program = Command::new(BIN);
    program.arg("serve");
    let by_token = Served::start_program(
        &dir,
        program,
        &[
            p(&img),
            "--token-only",
            "--tpm2-device",
            &tpm.tcti,
            "--socket",
            p(&sock),
        ],
    );
    let out = dir.join("back.bin");
    tool("nbdcopy", &[&by_token.uri, p(&out)]);
    // Again while served: the conversion runs inside the server (online), unlocked by the
    // token here, and the server carries the token to the newer keyslot.
    let before_online = h["tokens"]["0"]["keyslots"].clone();
    ok(
        crate::common::sc_fast(&[
            "reencrypt",
            "-q",
            "--token-only",
            "--tpm2-device",
            &tpm.tcti,
            p(&img),
        ]),
        "reencrypt --token-only while served",
    );
    let after_online = header_json(&img)["tokens"]["0"]["keyslots"].clone();
    assert_eq!(
        after_online.as_array().map(Vec::len),
        Some(1),
        "{after_online}"
    );
    assert_ne!(
        after_online, before_online,
        "the token names the newest keyslot"
    );
    let again = dir.join("again.bin");
    tool("nbdcopy", &[&by_token.uri, p(&again)]);
    assert_same(
        &read_file(&again)[..data.len()],
        &data,
        "read back after the online one",
    );
    by_token.stop();
    assert_same(
        &read_file(&out)[..data.len()],
        &data,
        "read back after reencryption",
    );

    // `decrypt --header NEWFILE` by the token: the header goes to the file, the plaintext to the
    // start of the device; `kill-slot` by the token refuses nothing it should not.
    let exported = dir.join("exported.hdr");
    ok(
        crate::common::sc(&[
            "decrypt",
            "-q",
            "--header",
            p(&exported),
            "--token-only",
            "--tpm2-device",
            &tpm.tcti,
            p(&img),
        ]),
        "decrypt --token-only",
    );
    assert_same(
        &read_file(&img)[..data.len()],
        &data,
        "the plaintext after decrypting by token",
    );
}

/// FIDO2 without a key (none exists in software here; the token's CBOR and PIN/UV protocols are
/// checked against python-fido2 in `crates/token`): a volume with a systemd-fido2 token (its
/// shape as systemd-cryptenroll writes it) is refused cleanly, exit 2 with the reason, and
/// `enroll --fido2-device` refuses with exit 1 writing nothing.
#[test]
fn fido2_tokens_without_a_key_are_refused_cleanly() {
    let dir = scratch("token-fido2");
    let pass = key(&dir, "pass");
    let img = cryptsetup_image(&dir, &pass);
    let json = dir.join("fido2.json");
    std::fs::write(
        &json,
        r#"{"type":"systemd-fido2","keyslots":["0"],"fido2-credential":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=","fido2-salt":"ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=","fido2-rp":"io.systemd.cryptsetup","fido2-clientPin-required":true,"fido2-up-required":true,"fido2-uv-required":false}"#,
    )
    .unwrap();
    ok(
        crate::common::sc(&["token", "import", "--json-file", p(&json), p(&img)]),
        "token import of a systemd-fido2 token",
    );
    let before = std::fs::read(&img).unwrap();
    let err = crate::common::sc_exits(
        &[
            "test-passphrase",
            "--token-only",
            "--fido2-device",
            "/nonexistent/hidraw7",
            p(&img),
        ],
        2,
    );
    assert!(
        err.contains("token 0 (systemd-fido2): cannot open the FIDO2 key"),
        "{err}"
    );
    let err = crate::common::sc_exits(
        &[
            "enroll",
            "--key-file",
            p(&pass),
            "--fido2-device",
            "/nonexistent/hidraw7",
            p(&img),
        ],
        1,
    );
    assert!(err.contains("cannot enroll the FIDO2 key"), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused FIDO2 token wrote"
    );
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"type":"systemd-fido2","keyslots":["0"],"fido2-credential":"AA==","fido2-salt":"AA=="}"#).unwrap();
    let err = crate::common::sc_exits(&["token", "import", "--json-file", p(&bad), p(&img)], 1);
    assert!(err.contains("fido2-salt is not 32 bytes"), "{err}");
}

/// clevis' `tpm2` pin (swtpm as the TPM, clevis and tpm2-tools on the other side): bindings with
/// no PCR, PCR 7 in clevis' default SHA-1 bank, and PCRs 0 and 7 in the SHA-256 bank open here;
/// once PCR 7 is extended, the PCR-bound ones refuse (exit 2, the policy named) and the unbound
/// one still opens.
#[test]
fn clevis_tpm2_bindings_unlock_here_until_a_pcr_changes() {
    let dir = scratch("token-clevis-tpm2");
    let tpm = Swtpm::start(&dir);
    let pass = key(&dir, "pass");
    let img = cryptsetup_image(&dir, &pass);
    for config in [
        "{}",
        r#"{"pcr_ids":"7"}"#,
        r#"{"pcr_bank":"sha256","pcr_ids":"0,7"}"#,
    ] {
        // No resource manager: what clevis' tpm2-tools calls leave loaded is flushed first.
        tpm.tools("tpm2_flushcontext", &["-l"]);
        tpm.tools("tpm2_flushcontext", &["-t"]);
        ok(
            run(Command::new("clevis")
                .env("TPM2TOOLS_TCTI", &tpm.tcti)
                .args([
                    "luks",
                    "bind",
                    "-y",
                    "-d",
                    p(&img),
                    "-k",
                    p(&pass),
                    "tpm2",
                    config,
                ])),
            "clevis luks bind tpm2",
        );
    }
    let sc = |token: &str, code: i32| {
        crate::common::sc_exits(
            &[
                "test-passphrase",
                "--token-only",
                "--token-id",
                token,
                "--tpm2-device",
                &tpm.tcti,
                p(&img),
            ],
            code,
        )
    };
    for (token, slot) in [("0", 1), ("1", 2), ("2", 3)] {
        let err = sc(token, 0);
        assert!(
            err.contains(&format!("Key slot {slot} unlocked.")),
            "{token}: {err}"
        );
    }
    assert_eq!(
        volume_key_by(
            Command::new(BIN),
            &["--token-id", "2", "--tpm2-device", &tpm.tcti],
            &img
        ),
        cryptsetup_volume_key(&img, &pass)
    );

    tpm.tools(
        "tpm2_pcrextend",
        &["7:sha1=0000000000000000000000000000000000000001"],
    );
    let err = sc("1", 2);
    assert!(err.contains("PCR values changed"), "{err}");
    sc("2", 0);
    sc("0", 0);
}

/// A signed PCR policy as systemd 252 enrolls it (`systemd-cryptenroll --tpm2-public-key
/// --tpm2-public-key-pcrs=11`): the volume opens here with a signature of the PCR 11 policy
/// (made with openssl, in systemd-measure's JSON) and refuses without one or with one for
/// other PCR values (exit 2, nothing written); once PCR 11 changes, a new signature for the new
/// value opens it again, which is what signed policies are for.
#[test]
fn signed_tpm2_pcr_policies_open_with_a_signature_for_the_current_pcrs() {
    let dir = scratch("token-tpm2-signed");
    let tpm = Swtpm::start(&dir);
    let pass = key(&dir, "pass");
    let img = cryptsetup_image(&dir, &pass);
    let (private, public) = (dir.join("priv.pem"), dir.join("pub.pem"));
    ok(
        run(Command::new("openssl").args(["genrsa", "-out", p(&private), "2048"])),
        "openssl genrsa",
    );
    ok(
        run(Command::new("openssl").args([
            "rsa",
            "-in",
            p(&private),
            "-pubout",
            "-out",
            p(&public),
        ])),
        "openssl rsa -pubout",
    );
    ok(
        run(Command::new("systemd-cryptenroll").args([
            &format!("--unlock-key-file={}", p(&pass)),
            &format!("--tpm2-device={}", tpm.tcti),
            &format!("--tpm2-public-key={}", p(&public)),
            "--tpm2-public-key-pcrs=11",
            "--tpm2-pcrs=",
            p(&img),
        ])),
        "systemd-cryptenroll --tpm2-public-key",
    );
    let spki = ok(
        run(Command::new("openssl").args(["pkey", "-pubin", "-in", p(&public), "-outform", "DER"])),
        "openssl pkey",
    )
    .stdout;
    // systemd-measure's JSON for a PolicyPCR over PCR 11 (SHA-256 bank) holding `value`.
    let sign = |value: &[u8], name: &str| -> PathBuf {
        let selection = [0, 0, 0, 1, 0, 0x0b, 3, 0, 8, 0];
        let policy = sha2::Sha256::new()
            .chain_update([0u8; 32])
            .chain_update(0x17Fu32.to_be_bytes())
            .chain_update(selection)
            .chain_update(sha2::Sha256::digest(value))
            .finalize();
        let pol = dir.join(format!("{name}.pol"));
        let sig = dir.join(format!("{name}.sig"));
        std::fs::write(&pol, policy).unwrap();
        ok(
            run(Command::new("openssl").args([
                "dgst",
                "-sha256",
                "-sign",
                p(&private),
                "-out",
                p(&sig),
                p(&pol),
            ])),
            "openssl dgst -sign",
        );
        use base64::Engine;
        let json = serde_json::json!({"sha256": [{
            "pcrs": [11],
            "pkfp": hex::encode(sha2::Sha256::digest(&spki)),
            "pol": hex::encode(policy),
            "sig": base64::engine::general_purpose::STANDARD.encode(std::fs::read(&sig).unwrap()),
        }]});
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, json.to_string()).unwrap();
        file
    };
    let zero = sign(&[0; 32], "zero");
    let sc = |signature: &Path, code: i32| {
        crate::common::sc_exits(
            &[
                "test-passphrase",
                "--token-only",
                "--tpm2-device",
                &tpm.tcti,
                "--tpm2-signature",
                p(signature),
                p(&img),
            ],
            code,
        )
    };
    assert!(sc(&zero, 0).contains("Key slot 1 unlocked."));
    let before = std::fs::read(&img).unwrap();
    let err = sc(&dir.join("none.json"), 2);
    assert!(err.contains("there is no signature at"), "{err}");
    tpm.tools(
        "tpm2_pcrextend",
        &["11:sha256=0000000000000000000000000000000000000000000000000000000000000001"],
    );
    let err = sc(&zero, 2);
    assert!(
        err.contains("no signature in the PCR signature file is for PCRs [11]"),
        "{err}"
    );
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused unseal wrote"
    );
    let mut extended = [0u8; 32];
    extended[31] = 1;
    let now = sha2::Sha256::new()
        .chain_update([0u8; 32])
        .chain_update(extended)
        .finalize();
    assert!(sc(&sign(&now, "now"), 0).contains("Key slot 1 unlocked."));
}

/// A token sealed under a persistent SRK (0x81000001, as systemd 253 and later seal, the token
/// saying so with `tpm2_srk`): the object, made by tpm2-tools under an SRK it made persistent
/// (with a template of its own), is loaded under that handle and opens the volume; the same
/// token without `tpm2_srk` does not.
#[test]
fn tpm2_tokens_sealed_under_a_persistent_srk_unlock() {
    let dir = scratch("token-tpm2-srk");
    let tpm = Swtpm::start(&dir);
    let pass = key(&dir, "pass");
    let img = cryptsetup_image(&dir, &pass);
    let f = |n: &str| dir.join(n);
    tpm.tools(
        "tpm2_createprimary",
        &[
            "-Q",
            "-C",
            "o",
            "-G",
            "ecc256:aes128cfb",
            "-g",
            "sha256",
            "-a",
            "restricted|decrypt|fixedtpm|fixedparent|sensitivedataorigin|userwithauth|noda",
            "-c",
            p(&f("srk.ctx")),
        ],
    );
    tpm.tools(
        "tpm2_evictcontrol",
        &["-Q", "-C", "o", "-c", p(&f("srk.ctx")), "0x81000001"],
    );
    tpm.tools("tpm2_flushcontext", &["-t"]);
    let session = f("trial.ctx");
    tpm.tools("tpm2_startauthsession", &["-Q", "-S", p(&session)]);
    tpm.tools(
        "tpm2_policypcr",
        &[
            "-Q",
            "-S",
            p(&session),
            "-l",
            "sha256:7",
            "-L",
            p(&f("policy.bin")),
        ],
    );
    tpm.tools("tpm2_flushcontext", &[p(&session)]);
    let secret: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37)).collect();
    std::fs::write(f("secret.bin"), &secret).unwrap();
    tpm.tools(
        "tpm2_create",
        &[
            "-Q",
            "-C",
            "0x81000001",
            "-g",
            "sha256",
            "-L",
            p(&f("policy.bin")),
            "-a",
            "fixedtpm|fixedparent",
            "-i",
            p(&f("secret.bin")),
            "-u",
            p(&f("pub")),
            "-r",
            p(&f("priv")),
        ],
    );
    tpm.tools("tpm2_flushcontext", &["-t"]);
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let blob = [
        std::fs::read(f("priv")).unwrap(),
        std::fs::read(f("pub")).unwrap(),
    ]
    .concat();
    let new_pass = f("token.pass");
    std::fs::write(&new_pass, b64(&secret)).unwrap();
    ok(
        cs_fast(&["luksAddKey", "--key-file", p(&pass), p(&img), p(&new_pass)]),
        "luksAddKey",
    );
    let token = serde_json::json!({"type": "systemd-tpm2", "keyslots": ["1"],
        "tpm2-blob": b64(&blob), "tpm2-pcrs": [7], "tpm2-pcr-bank": "sha256",
        "tpm2-primary-alg": "ecc", "tpm2-policy-hash": hex::encode(std::fs::read(f("policy.bin")).unwrap()),
        "tpm2-pin": false, "tpm2_srk": b64(b"persistent SRK 0x81000001")});
    let json = f("token.json");
    std::fs::write(&json, token.to_string()).unwrap();
    ok(
        crate::common::sc(&["token", "import", "--json-file", p(&json), p(&img)]),
        "token import",
    );
    assert!(tpm
        .test_passphrase(&img, &[], 0)
        .contains("Key slot 1 unlocked."));
    // The SRK's template is not systemd 252's (noDA): without `tpm2_srk` the object is loaded
    // under the transient primary, whose key differs, and the TPM refuses it.
    let mut old_style = token.clone();
    old_style.as_object_mut().unwrap().remove("tpm2_srk");
    std::fs::write(&json, old_style.to_string()).unwrap();
    ok(
        crate::common::sc(&[
            "token",
            "import",
            "--token-replace",
            "--token-id",
            "0",
            "--json-file",
            p(&json),
            p(&img),
        ]),
        "token import --token-replace",
    );
    tpm.test_passphrase(&img, &[], 2);
}
