//! CTAPHID (CTAP 2.1, section 11.2) over Linux's hidraw: FIDO security keys found by their HID
//! usage page (0xF1D0) in sysfs, a channel allocated with INIT, CBOR messages split into 64-byte
//! reports, keep-alives skipped while the key waits for a touch.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::Error;

const REPORT: usize = 64;
const BROADCAST: [u8; 4] = [0xFF; 4];
const CMD_INIT: u8 = 0x86;
const CMD_CBOR: u8 = 0x90;
const CMD_KEEPALIVE: u8 = 0xBB;
const CMD_ERROR: u8 = 0xBF;
/// The longest message taken (CTAP's own limit is 7609 bytes).
const MAX_MESSAGE: usize = 7609;

/// The hidraw devices that are FIDO security keys: their report descriptor declares the FIDO
/// usage page (`06 D0 F1`).
pub(crate) fn devices() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/class/hidraw") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("device/report_descriptor")).is_ok_and(|d| is_fido(&d))
        })
        .map(|e| Path::new("/dev").join(e.file_name()))
        .collect();
    found.sort();
    found
}

/// Whether a HID report descriptor declares the FIDO usage page.
pub(crate) fn is_fido(descriptor: &[u8]) -> bool {
    descriptor.windows(3).any(|w| w == [0x06, 0xD0, 0xF1])
}

/// A CTAPHID channel to one security key.
pub(crate) struct CtapHid {
    file: File,
    cid: [u8; 4],
    name: String,
}

impl CtapHid {
    /// Open `path` and allocate a channel.
    pub(crate) fn open(path: &Path) -> Result<CtapHid, Error> {
        let name = path.display().to_string();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::Unavailable(format!("cannot open the FIDO2 key {name}: {e}")))?;
        let mut dev = CtapHid {
            file,
            cid: BROADCAST,
            name,
        };
        let mut nonce = [0u8; 8];
        openssl::rand::rand_bytes(&mut nonce)
            .map_err(|e| Error::Failed(format!("random bytes: {e}")))?;
        dev.send(CMD_INIT, &nonce)?;
        // Answers to other channels' INITs may come first: only ours counts.
        loop {
            let (cmd, data) = dev.receive()?;
            if cmd == CMD_INIT && data.len() >= 12 && data[..8] == nonce {
                dev.cid.copy_from_slice(&data[8..12]);
                return Ok(dev);
            }
        }
    }

    /// One CTAP2 command: its byte and CBOR parameters; the status byte and the rest.
    pub(crate) fn cbor(&mut self, command: u8, params: &[u8]) -> Result<(u8, Vec<u8>), Error> {
        let message = [&[command][..], params].concat();
        self.send(CMD_CBOR, &message)?;
        let (cmd, data) = self.receive()?;
        if cmd != CMD_CBOR || data.is_empty() {
            return Err(Error::Failed(format!(
                "the FIDO2 key {} answered command 0x{cmd:02x}",
                self.name
            )));
        }
        Ok((data[0], data[1..].to_vec()))
    }

    fn io(&self, e: std::io::Error) -> Error {
        Error::Unavailable(format!("the FIDO2 key {}: {e}", self.name))
    }

    fn send(&mut self, cmd: u8, data: &[u8]) -> Result<(), Error> {
        for report in frame(self.cid, cmd, data) {
            // hidraw takes a report-number byte first (0: the key has no numbered reports).
            let mut out = [0u8; REPORT + 1];
            out[1..].copy_from_slice(&report);
            self.file.write_all(&out).map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    /// The next whole message on our channel (keep-alives skipped), as its command and data.
    fn receive(&mut self) -> Result<(u8, Vec<u8>), Error> {
        let mut reassembly = Reassembly::new(self.cid);
        loop {
            let mut report = [0u8; REPORT];
            let n = self.file.read(&mut report).map_err(|e| self.io(e))?;
            if n != REPORT {
                return Err(Error::Failed(format!(
                    "the FIDO2 key {} sent a report of {n} bytes",
                    self.name
                )));
            }
            match reassembly.push(&report)? {
                Some((CMD_KEEPALIVE, _)) => reassembly = Reassembly::new(self.cid),
                Some((CMD_ERROR, data)) => {
                    return Err(Error::Failed(format!(
                        "the FIDO2 key {} reports CTAPHID error 0x{:02x}",
                        self.name,
                        data.first().copied().unwrap_or(0)
                    )))
                }
                Some(message) => return Ok(message),
                None => {}
            }
        }
    }
}

/// `data` for channel `cid` as 64-byte reports: an initialization packet (channel, command,
/// length, 57 bytes) and continuation packets (channel, sequence 0..127, 59 bytes).
pub(crate) fn frame(cid: [u8; 4], cmd: u8, data: &[u8]) -> Vec<[u8; REPORT]> {
    let mut reports = Vec::new();
    let mut first = [0u8; REPORT];
    first[..4].copy_from_slice(&cid);
    first[4] = cmd;
    first[5..7].copy_from_slice(&(data.len() as u16).to_be_bytes());
    let n = data.len().min(REPORT - 7);
    first[7..7 + n].copy_from_slice(&data[..n]);
    reports.push(first);
    for (seq, chunk) in data[n..].chunks(REPORT - 5).enumerate() {
        let mut r = [0u8; REPORT];
        r[..4].copy_from_slice(&cid);
        r[4] = seq as u8;
        r[5..5 + chunk.len()].copy_from_slice(chunk);
        reports.push(r);
    }
    reports
}

/// Reports on one channel put back together.
pub(crate) struct Reassembly {
    cid: [u8; 4],
    cmd: u8,
    want: usize,
    data: Vec<u8>,
    next_seq: u8,
}

impl Reassembly {
    pub(crate) fn new(cid: [u8; 4]) -> Reassembly {
        Reassembly {
            cid,
            cmd: 0,
            want: 0,
            data: Vec::new(),
            next_seq: 0,
        }
    }

    /// Take one report; the whole message once its last report came. Reports of other
    /// channels are ignored.
    pub(crate) fn push(&mut self, report: &[u8; REPORT]) -> Result<Option<(u8, Vec<u8>)>, Error> {
        if report[..4] != self.cid && self.cid != BROADCAST {
            return Ok(None);
        }
        let bad = |why: &str| Error::Failed(format!("a malformed CTAPHID report: {why}"));
        if report[4] & 0x80 != 0 {
            self.cmd = report[4];
            self.want = usize::from(u16::from_be_bytes([report[5], report[6]]));
            if self.want > MAX_MESSAGE {
                return Err(bad("a message longer than CTAP allows"));
            }
            self.data = report[7..].iter().take(self.want).copied().collect();
            self.next_seq = 0;
        } else {
            if self.cmd == 0 || report[4] != self.next_seq {
                return Err(bad("a continuation out of sequence"));
            }
            self.next_seq += 1;
            let left = self.want - self.data.len();
            self.data.extend(report[5..].iter().take(left));
        }
        Ok((self.data.len() == self.want).then(|| (self.cmd, std::mem::take(&mut self.data))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_framed_and_put_back_together() {
        let cid = [1, 2, 3, 4];
        for len in [0usize, 1, 57, 58, 57 + 59, 57 + 59 + 1, 1000, MAX_MESSAGE] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let reports = frame(cid, CMD_CBOR, &data);
            assert_eq!(
                reports.len(),
                1 + len.saturating_sub(57).div_ceil(59),
                "{len}"
            );
            let mut r = Reassembly::new(cid);
            let mut got = None;
            for (i, rep) in reports.iter().enumerate() {
                got = r.push(rep).unwrap();
                assert_eq!(got.is_some(), i == reports.len() - 1);
            }
            assert_eq!(got, Some((CMD_CBOR, data)));
        }
    }

    #[test]
    fn bad_reports_are_refused_and_other_channels_ignored() {
        let cid = [1, 2, 3, 4];
        let mut r = Reassembly::new(cid);
        let mut other = frame([9, 9, 9, 9], CMD_CBOR, &[1])[0];
        assert_eq!(r.push(&other).unwrap(), None);
        other[..4].copy_from_slice(&cid);
        other[4] = 5; // a continuation with nothing before it
        assert!(r.push(&other).is_err());
        let mut long = frame(cid, CMD_CBOR, &[0; 10])[0];
        long[5..7].copy_from_slice(&9000u16.to_be_bytes());
        assert!(Reassembly::new(cid).push(&long).is_err());
        let reports = frame(cid, CMD_CBOR, &[7; 200]);
        let mut r = Reassembly::new(cid);
        r.push(&reports[0]).unwrap();
        assert!(r.push(&reports[2]).is_err(), "a skipped sequence number");
    }

    #[test]
    fn fido_descriptors_are_told_from_others() {
        // The first bytes of a YubiKey's FIDO interface descriptor; a keyboard's.
        assert!(is_fido(&[0x06, 0xD0, 0xF1, 0x09, 0x01, 0xA1, 0x01]));
        assert!(!is_fido(&[0x05, 0x01, 0x09, 0x06, 0xA1, 0x01]));
    }
}
