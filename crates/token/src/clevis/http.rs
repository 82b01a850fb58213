//! The HTTP tang speaks, and no more: one request per connection (`Connection: close`) to an
//! `http://` URL, a bounded reply, `Content-Length` or chunked bodies. Tang's protocol needs no
//! TLS (what crosses the wire is blinded); `https://` URLs are refused with that said.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::Error;

/// How long a connection may take to open, and a reply to come.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest reply taken (an advertisement is a few KiB).
const MAX_REPLY: u64 = 1 << 20;

/// An `http://HOST[:PORT][/PATH]` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Url {
    host: String,
    port: u16,
    /// The path without a trailing '/' ("" for the root).
    path: String,
}

impl Url {
    pub(crate) fn parse(text: &str) -> Result<Url, Error> {
        let bad = |why: &str| Error::BadToken(format!("tang URL {text:?}: {why}"));
        if text.starts_with("https://") {
            return Err(Error::Unavailable(format!(
                "tang URL {text:?}: https is not supported (tang's exchange needs no TLS: use http)"
            )));
        }
        // clevis accepts a URL without a scheme, as curl does.
        let rest = text.strip_prefix("http://").unwrap_or(text);
        if rest.contains("://") {
            return Err(bad("only http:// URLs are supported"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("an unclosed '['"))?;
            (h, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || host.contains(['@', ' ']) {
            return Err(bad("no host, or user information in it"));
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| bad("a bad port"))?,
            None => 80,
        };
        if path.contains(['?', '#', ' ']) {
            return Err(bad("a query or fragment"));
        }
        Ok(Url {
            host: host.to_string(),
            port,
            path: path.trim_end_matches('/').to_string(),
        })
    }

    /// `METHOD PATH/suffix` with `body`; the reply's body when the status is 200.
    pub(crate) fn request(
        &self,
        method: &str,
        suffix: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<Vec<u8>, Error> {
        let target = format!("{}/{suffix}", self.path);
        let down = |why: String| {
            Error::Unavailable(format!(
                "cannot reach tang server {}:{}: {why}",
                self.host, self.port
            ))
        };
        let addrs = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| down(e.to_string()))?;
        let mut last = "no address".to_string();
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
        }
        let mut stream = stream.ok_or_else(|| down(last))?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
            .map_err(|e| down(e.to_string()))?;
        let host = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let mut request = format!(
            "{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: */*\r\n\
             Content-Length: {}\r\n",
            body.len()
        );
        if let Some(ct) = content_type {
            request += &format!("Content-Type: {ct}\r\n");
        }
        request += "\r\n";
        stream
            .write_all(request.as_bytes())
            .and_then(|()| stream.write_all(body))
            .map_err(|e| down(e.to_string()))?;
        // tangd serves further requests on the connection whatever `Connection: close` says:
        // the reply ends where its length says, not at the end of the stream.
        let mut reply = Vec::new();
        let mut buf = [0u8; 8192];
        while !complete(&reply) && reply.len() as u64 <= MAX_REPLY {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => reply.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(down(e.to_string())),
            }
        }
        if reply.len() as u64 > MAX_REPLY {
            return Err(Error::Failed(format!(
                "tang server {host} sent more than 1 MiB"
            )));
        }
        parse_reply(&reply).map_err(|why| match why {
            Reply::Status(line) => Error::Unavailable(format!(
                "tang server {host} answered {method} {target} with {line:?}"
            )),
            Reply::Malformed(why) => {
                Error::Failed(format!("tang server {host} sent a malformed reply: {why}"))
            }
        })
    }
}

pub(crate) enum Reply {
    Status(String),
    Malformed(&'static str),
}

/// Whether `reply` holds a whole response: its headers, and the body its length (or the last
/// chunk) says.
pub(crate) fn complete(reply: &[u8]) -> bool {
    let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&reply[..end]).to_ascii_lowercase();
    let body = &reply[end + 4..];
    if head.contains("transfer-encoding: chunked") {
        return body.ends_with(b"0\r\n\r\n");
    }
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|n| body.len() >= n)
}

/// The body of a `200` reply.
pub(crate) fn parse_reply(reply: &[u8]) -> Result<Vec<u8>, Reply> {
    let end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(Reply::Malformed("no end of headers"))?;
    let head = std::str::from_utf8(&reply[..end]).map_err(|_| Reply::Malformed("headers"))?;
    let body = &reply[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    let code = status.split_whitespace().nth(1);
    if !status.starts_with("HTTP/1.") || code.is_none() {
        return Err(Reply::Malformed("no status line"));
    }
    if code != Some("200") {
        return Err(Reply::Status(status.to_string()));
    }
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| Reply::Malformed("length"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    if chunked {
        return dechunk(body);
    }
    match length {
        Some(n) if n <= body.len() => Ok(body[..n].to_vec()),
        Some(_) => Err(Reply::Malformed("a body shorter than its length")),
        None => Ok(body.to_vec()),
    }
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, Reply> {
    let mut out = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(Reply::Malformed("a chunk"))?;
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
            .ok_or(Reply::Malformed("a chunk size"))?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            return Err(Reply::Malformed("a short chunk"));
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_as_clevis_takes_them() {
        let u = Url::parse("http://tang.example:8080/base/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("tang.example", 8080, "/base")
        );
        let u = Url::parse("127.0.0.1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 80, "")
        );
        let u = Url::parse("http://[::1]:81").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 81));
        for bad in [
            "http://",
            "http://h:x",
            "ftp://h",
            "http://u@h",
            "http://h/a?b",
            "http://[::1",
        ] {
            assert!(matches!(Url::parse(bad), Err(Error::BadToken(_))), "{bad}");
        }
        assert!(matches!(
            Url::parse("https://h"),
            Err(Error::Unavailable(_))
        ));
    }

    #[test]
    fn replies_are_read_whole_or_refused() {
        let ok = |r: &[u8]| parse_reply(r).ok();
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi!"),
            Some(b"hi".to_vec())
        );
        assert_eq!(ok(b"HTTP/1.0 200 OK\r\n\r\nall"), Some(b"all".to_vec()));
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1;x\r\nc\r\n0\r\n\r\n"),
            Some(b"abc".to_vec())
        );
        for bad in [
            &b"HTTP/1.1 404 Not Found\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhi",
            b"HTTP/1.1 200 OK",
            b"SSH-2.0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab\r\n",
        ] {
            assert!(ok(bad).is_none(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
