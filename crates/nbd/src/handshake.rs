//! The fixed-newstyle handshake: the server's greeting, then option haggling until the client
//! picks the export (`NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME`), starts TLS or leaves. After TLS has
//! started, haggling begins again over the TLS session with nothing kept from before (as nbdkit
//! does: structured replies negotiated in plain text are forgotten).
//!
//! Every option's length is checked before its data is read, and every reply is sent before the
//! next option is read, so a malformed option costs the client an error reply (or, where the
//! protocol leaves no way to go on, the connection), never the server anything.

use std::io::{self, Read, Write};

use crate::proto::*;

/// The largest option payload accepted: an export name (at most 4096 bytes) and a few
/// information requests or meta-context queries fit many times over.
const MAX_OPTION_LEN: u32 = 64 * 1024;

/// A client that sends more options than this without choosing an export is dropped.
const MAX_OPTIONS: usize = 1000;

/// One export, as clients see it.
#[derive(Clone, Debug)]
pub struct ExportInfo {
    /// Its name (clients asking for "" get it too: the empty name is the default export).
    pub name: String,
    /// A line for people, sent when asked for.
    pub description: String,
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Smallest efficient request and alignment (the encryption sector size).
    pub min_block: u32,
    /// Preferred request size.
    pub preferred_block: u32,
    /// Largest READ or WRITE payload.
    pub max_payload: u32,
}

/// The exports a server offers, by name.
pub(crate) trait Offer {
    /// The export a client names (the empty name: the default export, if there is one).
    fn find(&self, name: &[u8]) -> Option<ExportInfo>;
    /// Every export, for `NBD_OPT_LIST`.
    fn list(&self) -> Vec<ExportInfo>;
}

/// Where a connection stands with TLS, as option haggling sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TlsState {
    /// The server has no TLS: STARTTLS is refused by policy.
    Unavailable,
    /// TLS is offered and not started: the client may start it or go on in plain text.
    Offered,
    /// TLS must be started before any other option (FORCEDTLS).
    Required,
    /// TLS is running.
    Running,
}

/// What the client said in the greeting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClientFlags {
    /// `NBD_FLAG_C_NO_ZEROES`: no 124 zero bytes after `NBD_OPT_EXPORT_NAME`'s reply.
    no_zeroes: bool,
}

/// How option haggling ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The client chose an export (the name it used): serve requests, with structured replies
    /// if negotiated.
    Transmission { structured: bool, name: Vec<u8> },
    /// STARTTLS was acknowledged: the TLS handshake comes next, then haggling again.
    StartTls,
    /// The client left, or broke the protocol so that the connection had to be dropped.
    Closed,
}

fn option_reply(s: &mut impl Write, option: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    s.write_all(&out)
}

/// An error reply with a message for people.
fn option_error(s: &mut impl Write, option: u32, kind: u32, why: &str) -> io::Result<()> {
    option_reply(s, option, kind, why.as_bytes())
}

/// Send the greeting and read the client's flags: `None` if the client must be dropped. I/O
/// errors (the client vanished, a timeout) are returned as such.
pub(crate) fn greet<S: Read + Write>(s: &mut S) -> io::Result<Option<ClientFlags>> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBDMAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greeting)?;
    s.flush()?;

    let mut flags = [0u8; 4];
    s.read_exact(&mut flags)?;
    let client_flags = u32::from_be_bytes(flags);
    // Unknown client flags, or a client that does not speak fixed newstyle: the protocol says
    // to drop it. (STARTTLS needs fixed newstyle too, so every client let past may start TLS.)
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0
        || client_flags & FLAG_C_FIXED_NEWSTYLE == 0
    {
        return Ok(None);
    }
    Ok(Some(ClientFlags {
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
    }))
}

/// Haggle over options on `s` (after [`greet`], or after the TLS handshake) until the client
/// picks an export, starts TLS or leaves. I/O errors are returned as such.
pub(crate) fn negotiate<S: Read + Write>(
    s: &mut S,
    offer: &dyn Offer,
    flags: ClientFlags,
    tls: TlsState,
) -> io::Result<Outcome> {
    let mut structured = false;

    for _ in 0..MAX_OPTIONS {
        let mut head = [0u8; 16];
        s.read_exact(&mut head)?;
        if be64(&head[0..8]) != IHAVEOPT {
            return Ok(Outcome::Closed);
        }
        let option = be32(&head[8..12]);
        let len = be32(&head[12..16]);
        if len > MAX_OPTION_LEN {
            // Skipping gigabytes of a hostile option is not worth it: say why, then leave.
            option_error(s, option, REP_ERR_TOO_BIG, "option too large")?;
            return Ok(Outcome::Closed);
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        if tls == TlsState::Required && option != OPT_STARTTLS && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                // It has no error reply: the protocol says to end the session.
                return Ok(Outcome::Closed);
            }
            option_error(
                s,
                option,
                REP_ERR_TLS_REQD,
                "TLS is required: NBD_OPT_STARTTLS first",
            )?;
            s.flush()?;
            continue;
        }
        match option {
            OPT_EXPORT_NAME => {
                // No error reply exists for this option: an unknown name drops the connection.
                let Some(export) = offer.find(&data) else {
                    return Ok(Outcome::Closed);
                };
                let mut out = Vec::with_capacity(10 + 124);
                out.extend_from_slice(&export.size.to_be_bytes());
                out.extend_from_slice(&export.flags.to_be_bytes());
                if !flags.no_zeroes {
                    out.resize(out.len() + 124, 0);
                }
                s.write_all(&out)?;
                s.flush()?;
                return Ok(Outcome::Transmission {
                    structured,
                    name: data,
                });
            }
            OPT_ABORT => {
                option_reply(s, option, REP_ACK, &[])?;
                s.flush()?;
                return Ok(Outcome::Closed);
            }
            OPT_LIST if !data.is_empty() => {
                option_error(s, option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?
            }
            OPT_LIST => {
                for export in offer.list() {
                    let mut entry = Vec::new();
                    entry.extend_from_slice(&(export.name.len() as u32).to_be_bytes());
                    entry.extend_from_slice(export.name.as_bytes());
                    entry.extend_from_slice(export.description.as_bytes());
                    option_reply(s, option, REP_SERVER, &entry)?;
                }
                option_reply(s, option, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => match parse_info_request(&data) {
                None => option_error(s, option, REP_ERR_INVALID, "malformed info request")?,
                Some((name, requests)) => match offer.find(name) {
                    None => option_error(s, option, REP_ERR_UNKNOWN, "no such export")?,
                    Some(export) => {
                        send_info(s, option, &export, &requests)?;
                        option_reply(s, option, REP_ACK, &[])?;
                        if option == OPT_GO {
                            s.flush()?;
                            return Ok(Outcome::Transmission {
                                structured,
                                name: name.to_vec(),
                            });
                        }
                    }
                },
            },
            OPT_STRUCTURED_REPLY if !data.is_empty() => option_error(
                s,
                option,
                REP_ERR_INVALID,
                "NBD_OPT_STRUCTURED_REPLY takes no data",
            )?,
            OPT_STRUCTURED_REPLY if structured => option_error(
                s,
                option,
                REP_ERR_INVALID,
                "structured replies are already on",
            )?,
            OPT_STRUCTURED_REPLY => {
                structured = true;
                option_reply(s, option, REP_ACK, &[])?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                if !structured {
                    option_error(s, option, REP_ERR_INVALID, "needs structured replies first")?
                } else if !meta_context_request_is_valid(&data) {
                    option_error(s, option, REP_ERR_INVALID, "malformed meta context request")?
                } else {
                    // No metadata contexts (block status) are offered: an empty list.
                    option_reply(s, option, REP_ACK, &[])?
                }
            }
            OPT_STARTTLS if !data.is_empty() => {
                option_error(s, option, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data")?
            }
            OPT_STARTTLS => match tls {
                TlsState::Unavailable => {
                    option_error(s, option, REP_ERR_POLICY, "TLS is not configured")?
                }
                TlsState::Running => {
                    option_error(s, option, REP_ERR_INVALID, "TLS is already running")?
                }
                TlsState::Offered | TlsState::Required => {
                    option_reply(s, option, REP_ACK, &[])?;
                    s.flush()?;
                    return Ok(Outcome::StartTls);
                }
            },
            _ => option_error(s, option, REP_ERR_UNSUP, "unsupported option")?,
        }
        s.flush()?;
    }
    Ok(Outcome::Closed)
}

/// `NBD_OPT_INFO`/`GO` data: u32 name length, name, u16 count, count x u16 information types.
fn parse_info_request(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let name_len = be32(data.get(0..4)?) as usize;
    let name = data.get(4..4usize.checked_add(name_len)?)?;
    let rest = &data[4 + name_len..];
    let count = be16(rest.get(0..2)?) as usize;
    let list = &rest[2..];
    if list.len() != count * 2 {
        return None;
    }
    Some((name, list.chunks(2).map(be16).collect()))
}

/// `NBD_OPT_{LIST,SET}_META_CONTEXT` data: u32 name length, name, u32 count, count x (u32
/// length, query).
fn meta_context_request_is_valid(data: &[u8]) -> bool {
    let parse = || -> Option<()> {
        let name_len = be32(data.get(0..4)?) as usize;
        let mut at = 4usize.checked_add(name_len)?;
        let count = be32(data.get(at..at + 4)?);
        at += 4;
        for _ in 0..count {
            let len = be32(data.get(at..at + 4)?) as usize;
            at = at.checked_add(4 + len)?;
            data.get(..at)?;
        }
        (at == data.len()).then_some(())
    };
    parse().is_some()
}

/// The information replies of `NBD_OPT_INFO`/`GO`: the export itself and its block sizes always
/// (the sizes matter even to a client that did not ask), its name and description when asked.
fn send_info(
    s: &mut impl Write,
    option: u32,
    export: &ExportInfo,
    requests: &[u16],
) -> io::Result<()> {
    let mut info = Vec::with_capacity(12);
    info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    info.extend_from_slice(&export.size.to_be_bytes());
    info.extend_from_slice(&export.flags.to_be_bytes());
    option_reply(s, option, REP_INFO, &info)?;

    let mut sizes = Vec::with_capacity(14);
    sizes.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    sizes.extend_from_slice(&export.min_block.to_be_bytes());
    sizes.extend_from_slice(&export.preferred_block.to_be_bytes());
    sizes.extend_from_slice(&export.max_payload.to_be_bytes());
    option_reply(s, option, REP_INFO, &sizes)?;

    if requests.contains(&INFO_NAME) {
        let mut name = INFO_NAME.to_be_bytes().to_vec();
        name.extend_from_slice(export.name.as_bytes());
        option_reply(s, option, REP_INFO, &name)?;
    }
    if requests.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
        let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
        d.extend_from_slice(export.description.as_bytes());
        option_reply(s, option, REP_INFO, &d)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_request_parsing() {
        let mut d = 3u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"abc");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        let (name, reqs) = parse_info_request(&d).unwrap();
        assert_eq!(name, b"abc");
        assert_eq!(reqs, [INFO_NAME, INFO_BLOCK_SIZE]);
        // Truncated, overlong, and a name length that overflows.
        assert!(parse_info_request(&d[..d.len() - 1]).is_none());
        let mut long = d.clone();
        long.push(0);
        assert!(parse_info_request(&long).is_none());
        let mut huge = d.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&huge).is_none());
    }

    #[test]
    fn meta_context_parsing() {
        let mut d = 0u32.to_be_bytes().to_vec();
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&15u32.to_be_bytes());
        d.extend_from_slice(b"base:allocation");
        assert!(meta_context_request_is_valid(&d));
        assert!(!meta_context_request_is_valid(&d[..d.len() - 1]));
        let mut lying = d.clone();
        lying[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(!meta_context_request_is_valid(&lying));
    }
}
