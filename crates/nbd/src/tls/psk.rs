//! TLS with pre-shared keys (nbdkit's `--tls-psk`), on OpenSSL: rustls has no external PSK.
//!
//! The keys come from nbdkit's file, `username:hexkey` lines as GnuTLS's `psktool` writes them,
//! and live in secret memory. The session runs in memory like rustls's: OpenSSL reads the
//! client's records from a buffer the relay fills and writes its own to a buffer the relay
//! empties, so the relay drives both libraries alike.
//!
//! Versions and ciphersuites: TLS 1.3 with `psk_dhe_ke` (libnbd and qemu's GnuTLS both choose it),
//! on the SHA-256 suites, the hash OpenSSL gives a key from `SSL_CTX_set_psk_server_callback`;
//! and TLS 1.2's forward-secret PSK suites for older clients. No session tickets: every
//! connection proves its key.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslStream, SslVersion,
};
use sectorcrypt_secret::SecretBytes;

use super::{tls_error, ServerSession};
use crate::Error;

/// A PSK file larger than this is refused: a line is a name and a key, and a file holds a few.
const MAX_FILE: usize = 1 << 20;

/// The longest key OpenSSL takes (`PSK_MAX_PSK_LEN`).
const MAX_KEY: usize = 512;

/// TLS 1.3 suites whose hash is SHA-256: those a key from the server callback can be used with.
const TLS13_SUITES: &str = "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256";

/// TLS 1.2 PSK suites with (EC)DHE, for forward secrecy, and AEAD.
const TLS12_SUITES: &str = "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:\
                            DHE-PSK-AES128-GCM-SHA256:DHE-PSK-CHACHA20-POLY1305";

/// Each user's key, in the file's order.
struct Keys(Vec<(String, SecretBytes)>);

impl Keys {
    /// Read nbdkit's PSK file: `username:hexkey` lines (blank lines skipped), hex of any even
    /// length. The file is read into secret memory and decoded from there.
    fn read(path: &Path) -> Result<Keys, Error> {
        let file = File::open(path).map_err(|e| tls_error(path, e))?;
        let text = SecretBytes::read_from(file, MAX_FILE + 1).map_err(|e| tls_error(path, e))?;
        if text.len() > MAX_FILE {
            return Err(tls_error(path, "larger than 1 MiB"));
        }
        let mut keys = Vec::new();
        for (n, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let bad = |why: &str| tls_error(path, format!("line {}: {why}", n + 1));
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(bad("not username:hexkey"));
            };
            let (name, hex) = (&line[..colon], &line[colon + 1..]);
            let name = std::str::from_utf8(name)
                .ok()
                .filter(|name| !name.is_empty())
                .ok_or_else(|| bad("the username is empty or not UTF-8"))?;
            if keys.iter().any(|(other, _)| other == name) {
                return Err(bad(&format!("user {name} already has a key")));
            }
            if hex.is_empty() || hex.len() % 2 != 0 {
                return Err(bad("the key is not an even number of hex digits"));
            }
            if hex.len() / 2 > MAX_KEY {
                return Err(bad(&format!("the key is longer than {MAX_KEY} bytes")));
            }
            let mut key = SecretBytes::zeroed(hex.len() / 2);
            hex::decode_to_slice(hex, &mut key).map_err(|_| bad("the key is not hex"))?;
            keys.push((name.to_string(), key));
        }
        if keys.is_empty() {
            return Err(tls_error(path, "holds no username:hexkey line"));
        }
        Ok(Keys(keys))
    }

    fn find(&self, name: &[u8]) -> Option<&SecretBytes> {
        self.0
            .iter()
            .find(|(user, _)| user.as_bytes() == name)
            .map(|(_, key)| key)
    }
}

/// The server's OpenSSL context for the users and keys in `path`. An unreadable or malformed
/// file is [`Error::Tls`], naming it (and the line).
pub(super) fn context(path: &Path) -> Result<SslContext, Error> {
    let keys = Keys::read(path)?;
    let openssl = |e: openssl::error::ErrorStack| tls_error(path, e);
    let mut builder = SslContextBuilder::new(SslMethod::tls_server()).map_err(openssl)?;
    builder
        .set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(openssl)?;
    builder.set_ciphersuites(TLS13_SUITES).map_err(openssl)?;
    builder.set_cipher_list(TLS12_SUITES).map_err(openssl)?;
    builder.set_num_tickets(0).map_err(openssl)?;
    builder.set_options(SslOptions::NO_TICKET);
    // An unknown user gets no key (0 bytes), and the handshake fails.
    builder.set_psk_server_callback(move |_, identity, psk| {
        Ok(match identity.and_then(|name| keys.find(name)) {
            Some(key) if key.len() <= psk.len() => {
                psk[..key.len()].copy_from_slice(key);
                key.len()
            }
            _ => 0,
        })
    });
    Ok(builder.build())
}

/// The records between the client and an OpenSSL session kept in memory.
#[derive(Default)]
struct Records {
    /// From the client, not yet taken in by the session.
    received: VecDeque<u8>,
    /// From the session, for the client.
    to_send: Vec<u8>,
}

impl Read for Records {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Nothing received is "not yet" (OpenSSL then wants to read), not the end of the stream.
        if self.received.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.received.read(buf)
    }
}

impl Write for Records {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.to_send.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection's session under a PSK context.
pub(super) struct PskSession(SslStream<Records>);

impl PskSession {
    pub(super) fn new(context: &SslContext) -> io::Result<PskSession> {
        let mut ssl = Ssl::new(context).map_err(io::Error::other)?;
        ssl.set_accept_state();
        Ok(PskSession(
            SslStream::new(ssl, Records::default()).map_err(io::Error::other)?,
        ))
    }
}

fn io_error(e: openssl::ssl::Error) -> io::Error {
    e.into_io_error()
        .unwrap_or_else(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl ServerSession for PskSession {
    fn receive(&mut self, records: &[u8], data: &mut Vec<u8>) -> io::Result<bool> {
        self.0.get_mut().received.extend(records);
        if self.handshaking() {
            match self.0.do_handshake() {
                Ok(()) => {}
                Err(e) if e.code() == ErrorCode::WANT_READ => return Ok(false),
                Err(e) => return Err(io_error(e)),
            }
        }
        loop {
            let at = data.len();
            data.resize(at + super::TLS_RECORD, 0);
            let read = self.0.ssl_read(&mut data[at..]);
            data.truncate(at + *read.as_ref().unwrap_or(&0));
            match read {
                Ok(_) => {}
                Err(e) if e.code() == ErrorCode::WANT_READ => return Ok(false),
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => return Ok(true),
                Err(e) => return Err(io_error(e)),
            }
        }
    }

    fn handshaking(&self) -> bool {
        !self.0.ssl().is_init_finished()
    }

    fn send(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = self.0.ssl_write(data).map_err(io_error)?;
            data = &data[n..];
        }
        Ok(())
    }

    fn close(&mut self) {
        // Sends close_notify; the client's own is not waited for.
        let _ = self.0.shutdown();
    }

    fn take_records(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        out.append(&mut self.0.get_mut().to_send);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-line message of loading a PSK file holding `text`, which must fail.
    fn refusal(text: &str) -> String {
        let dir = sectorcrypt_testkit::scratch("nbd-psk-refusal");
        let path = dir.join("keys.psk");
        std::fs::write(&path, text).unwrap();
        let message = match context(&path) {
            Ok(_) => panic!("{text:?} was taken"),
            Err(e) => e.to_string(),
        };
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(message.lines().count(), 1, "{message}");
        assert!(message.contains("keys.psk: "), "{message}");
        message
    }

    #[test]
    fn psk_files_parse_and_bad_lines_are_named() {
        let dir = sectorcrypt_testkit::scratch("nbd-psk-parse");
        let path = dir.join("keys.psk");
        std::fs::write(&path, "alice:00ff10\r\n\nbob:0123456789ABCDEF\n").unwrap();
        let keys = Keys::read(&path).unwrap();
        assert_eq!(&keys.find(b"alice").unwrap()[..], &[0x00, 0xff, 0x10]);
        assert_eq!(keys.find(b"bob").unwrap().len(), 8);
        assert!(keys.find(b"carol").is_none());
        assert!(context(&path).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();

        assert!(refusal("alice:00\nbob\n").ends_with("line 2: not username:hexkey"));
        assert!(refusal(":00\n").ends_with("line 1: the username is empty or not UTF-8"));
        assert!(
            refusal("alice:0\n").ends_with("line 1: the key is not an even number of hex digits")
        );
        assert!(refusal("alice:\n").contains("line 1: the key is not an even"));
        assert!(refusal("alice:zz\n").ends_with("line 1: the key is not hex"));
        assert!(refusal("a:00\n\na:11\n").ends_with("line 3: user a already has a key"));
        assert!(refusal(&format!("a:{}\n", "00".repeat(MAX_KEY + 1))).contains("longer than 512"));
        assert!(refusal("\n\n").ends_with("holds no username:hexkey line"));
        let missing = refusal_missing();
        assert!(missing.contains("nowhere.psk: "), "{missing}");
    }

    fn refusal_missing() -> String {
        match context(Path::new("/nonexistent/nowhere.psk")) {
            Ok(_) => panic!("a missing file was taken"),
            Err(e) => e.to_string(),
        }
    }
}
