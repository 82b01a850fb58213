//! Certificates for the TLS tests, made by `openssl(1)`: a CA, a server certificate for
//! `localhost` and `127.0.0.1`, a client certificate, and a second CA that nobody trusts, laid out
//! in directories with nbdkit's, libnbd's and qemu's file names (`ca-cert.pem`, `server-cert.pem`,
//! `server-key.pem`, `client-cert.pem`, `client-key.pem`).
//!
//! The extensions are those qemu's sanity checks and GnuTLS insist on: a CA with
//! `basicConstraints CA:TRUE` and `keyCertSign`, leaves with `digitalSignature` and
//! `keyEncipherment` and the right extended key usage.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{ok, output, p};

const EXTENSIONS: &str = "\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
";

/// The directories of one test's certificates.
pub struct Pki {
    /// The server's: `ca-cert.pem` (clients must present a certificate it signed),
    /// `server-cert.pem`, `server-key.pem`.
    pub server: PathBuf,
    /// The server's without `ca-cert.pem`: clients need no certificate.
    pub server_any_client: PathBuf,
    /// A client the server trusts and that trusts the server: `ca-cert.pem`, `client-cert.pem`,
    /// `client-key.pem`.
    pub client: PathBuf,
    /// A client that trusts the server but has no certificate of its own.
    pub client_without_certificate: PathBuf,
    /// A client that trusts another CA (so not the server), with a good certificate of its own.
    pub client_trusting_another_ca: PathBuf,
    /// A client that trusts the server, with a certificate the other CA signed.
    pub client_signed_by_another_ca: PathBuf,
}

impl Pki {
    /// Make every certificate and key under `root` (an existing, empty directory).
    pub fn create(root: &Path) -> Pki {
        let config = root.join("openssl.cnf");
        std::fs::write(&config, EXTENSIONS).unwrap();
        let work = root.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let ca = self_signed(&work, &config, "ca", "sectorcrypt test CA");
        let other = self_signed(&work, &config, "other-ca", "an untrusted CA");
        let server = signed(&work, &config, &ca, "server", "localhost");
        let client = signed(&work, &config, &ca, "client", "client");
        let stranger = signed(&work, &config, &other, "client", "stranger");

        let dir = |name: &str, files: &[(&Path, &str)]| {
            let d = root.join(name);
            std::fs::create_dir_all(&d).unwrap();
            for (from, to) in files {
                std::fs::copy(from, d.join(to)).unwrap();
            }
            d
        };
        Pki {
            server: dir(
                "server",
                &[
                    (&ca.cert, "ca-cert.pem"),
                    (&server.cert, "server-cert.pem"),
                    (&server.key, "server-key.pem"),
                ],
            ),
            server_any_client: dir(
                "server-any-client",
                &[
                    (&server.cert, "server-cert.pem"),
                    (&server.key, "server-key.pem"),
                ],
            ),
            client: dir(
                "client",
                &[
                    (&ca.cert, "ca-cert.pem"),
                    (&client.cert, "client-cert.pem"),
                    (&client.key, "client-key.pem"),
                ],
            ),
            client_without_certificate: dir("client-without-cert", &[(&ca.cert, "ca-cert.pem")]),
            client_trusting_another_ca: dir(
                "client-trusting-other-ca",
                &[
                    (&other.cert, "ca-cert.pem"),
                    (&client.cert, "client-cert.pem"),
                    (&client.key, "client-key.pem"),
                ],
            ),
            client_signed_by_another_ca: dir(
                "client-signed-by-other-ca",
                &[
                    (&ca.cert, "ca-cert.pem"),
                    (&stranger.cert, "client-cert.pem"),
                    (&stranger.key, "client-key.pem"),
                ],
            ),
        }
    }
}

/// A certificate and its key, as PEM files.
struct Pair {
    cert: PathBuf,
    key: PathBuf,
}

fn openssl(args: &[&str]) {
    ok(
        output(Command::new("openssl").args(args)),
        &format!("openssl {args:?}"),
    );
}

/// A new P-256 key and a self-signed CA certificate.
fn self_signed(work: &Path, config: &Path, name: &str, subject: &str) -> Pair {
    let pair = Pair {
        cert: work.join(format!("{name}-cert.pem")),
        key: work.join(format!("{name}-key.pem")),
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        p(&pair.key),
        "-out",
        p(&pair.cert),
        "-days",
        "3650",
        "-subj",
        &format!("/CN={subject}"),
        "-config",
        p(config),
        "-extensions",
        "ca",
    ]);
    pair
}

/// A new P-256 key and a certificate for it, `extensions` (`server` or `client`), signed by `ca`.
fn signed(work: &Path, config: &Path, ca: &Pair, extensions: &str, subject: &str) -> Pair {
    let pair = Pair {
        cert: work.join(format!("{subject}-cert.pem")),
        key: work.join(format!("{subject}-key.pem")),
    };
    let request = work.join(format!("{subject}.csr"));
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        p(&pair.key),
        "-out",
        p(&request),
        "-subj",
        &format!("/CN={subject}"),
        "-config",
        p(config),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        p(&request),
        "-CA",
        p(&ca.cert),
        "-CAkey",
        p(&ca.key),
        "-CAcreateserial",
        "-out",
        p(&pair.cert),
        "-days",
        "3650",
        "-extfile",
        p(config),
        "-extensions",
        extensions,
    ]);
    pair
}
