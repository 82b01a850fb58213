//! UBI flash-I/O traces (`../shared/flash-traces/`: every read, write and erase Linux's UBI sent
//! to MTD while UBIFS ran a benchmark, in order) and their replay on any [`Flash`]: the thesis'
//! experiment with a real UBIFS above the encryption layer, and the ground truth for what each
//! erased-space policy costs in program/erase cycles.
//!
//! The format (v1): `#` lines are comments (the geometry line `# peb_size N leb_size N
//! peb_count N page N subpage N vid_hdr_offset N data_offset N`, and markers such as
//! `# workload starts`); every other line is `R|W|E pnum offset len`. Files may be xz-compressed.
//! A trace holds no data, only where it went: a replayed write programs a fixed non-0xFF pattern,
//! which is all a P/E count needs (the layer rewrites a block whatever its contents).

use std::path::Path;

use crate::{Error, Flash, Geometry};

/// One operation UBI issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `mtd_read` of `len` bytes at `offset` of `peb`.
    Read {
        /// The eraseblock.
        peb: u32,
        /// The offset in it.
        offset: u32,
        /// Bytes.
        len: u32,
    },
    /// `mtd_write` of `len` bytes at `offset` of `peb`.
    Write {
        /// The eraseblock.
        peb: u32,
        /// The offset in it.
        offset: u32,
        /// Bytes.
        len: u32,
    },
    /// `mtd_erase` of `peb`.
    Erase {
        /// The eraseblock.
        peb: u32,
    },
}

/// A parsed trace.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The chip it was recorded on (spare size and NOP as the default SLC chip's).
    pub geometry: Geometry,
    /// Where UBI's data area starts in a PEB (writes from here on are the user's data).
    pub data_offset: u32,
    /// The operations, in order.
    pub ops: Vec<Op>,
    /// Index of the first operation after `# workload starts` (0 if there is no such marker).
    pub workload_start: usize,
}

fn bad(line: usize, why: &str) -> Error {
    Error::Format(format!("trace line {line}: {why}"))
}

impl Trace {
    /// Parse the text of a trace.
    ///
    /// Errors: [`Error::Format`] for a line that is neither a comment nor an operation, a missing
    /// geometry line, or an operation outside the geometry.
    pub fn parse(text: &str) -> Result<Trace, Error> {
        let mut geometry = None;
        let mut data_offset = 0;
        let mut ops = Vec::new();
        let mut workload_start = 0;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if let Some(comment) = line.strip_prefix('#') {
                let words: Vec<&str> = comment.split_whitespace().collect();
                if words.first() == Some(&"peb_size") {
                    let field = |key: &str| -> Result<u32, Error> {
                        words
                            .iter()
                            .position(|w| *w == key)
                            .and_then(|p| words.get(p + 1))
                            .and_then(|v| v.parse().ok())
                            .ok_or_else(|| bad(n, &format!("no {key} in the geometry line")))
                    };
                    let page = field("page")?;
                    let sub_page = field("subpage")?;
                    data_offset = field("data_offset")?;
                    let g = Geometry {
                        peb_size: field("peb_size")?,
                        page_size: page,
                        sub_page_size: sub_page,
                        peb_count: field("peb_count")?,
                        nop: (page / sub_page.max(1)).clamp(1, 255) as u8,
                        ..Geometry::default()
                    };
                    g.validate()?;
                    geometry = Some(g);
                } else if words == ["workload", "starts"] {
                    workload_start = ops.len();
                }
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |k: usize| -> Result<u32, Error> {
                f.get(k)
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| bad(n, "expected R|W|E pnum offset len"))
            };
            let (peb, offset, len) = (num(1)?, num(2)?, num(3)?);
            let op = match f[0] {
                "R" => Op::Read { peb, offset, len },
                "W" => Op::Write { peb, offset, len },
                "E" => Op::Erase { peb },
                other => return Err(bad(n, &format!("unknown operation {other:?}"))),
            };
            let g = geometry.ok_or_else(|| bad(n, "an operation before the geometry line"))?;
            g.check_range(peb, offset, len as usize)?;
            ops.push(op);
        }
        let geometry =
            geometry.ok_or_else(|| Error::Format("a trace without its geometry line".into()))?;
        Ok(Trace {
            geometry,
            data_offset,
            ops,
            workload_start,
        })
    }

    /// Read a trace file, xz-compressed or not.
    ///
    /// Errors: [`Error::Io`] for a file that cannot be read or decompressed; as [`Trace::parse`].
    pub fn read(path: &Path) -> Result<Trace, Error> {
        let bytes = std::fs::read(path)?;
        let text = if bytes.starts_with(b"\xFD7zXZ\x00") {
            let mut out = Vec::new();
            lzma_rs::xz_decompress(&mut &bytes[..], &mut out).map_err(|e| {
                Error::Format(format!("{}: not a readable xz file: {e}", path.display()))
            })?;
            out
        } else {
            bytes
        };
        let text = String::from_utf8(text)
            .map_err(|_| Error::Format(format!("{}: a trace is text", path.display())))?;
        Trace::parse(&text)
    }

    /// Bytes the workload wrote into UBI's data areas (the user's data and UBIFS's own).
    pub fn workload_data_bytes(&self) -> u64 {
        self.ops[self.workload_start..]
            .iter()
            .map(|op| match *op {
                Op::Write { offset, len, .. } if offset >= self.data_offset => u64::from(len),
                _ => 0,
            })
            .sum()
    }

    /// Apply operations `range` to `flash`, in order; `at_workload` runs once when the workload
    /// starts (to take the counts of the setup).
    ///
    /// Errors: what the flash answers (a trace from a real UBI keeps NAND's rules).
    pub fn replay(&self, flash: &dyn Flash, at_workload: &mut dyn FnMut()) -> Result<(), Error> {
        let peb_size = self.geometry.peb_size as usize;
        let data = vec![0x5Au8; peb_size];
        let mut buf = vec![0u8; peb_size];
        for (i, op) in self.ops.iter().enumerate() {
            if i == self.workload_start {
                at_workload();
            }
            match *op {
                Op::Read { peb, offset, len } => {
                    match flash.read(peb, offset, &mut buf[..len as usize]) {
                        Ok(_) | Err(Error::Uncorrectable { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                Op::Write { peb, offset, len } => {
                    flash.program(peb, offset, &data[..len as usize])?
                }
                Op::Erase { peb } => flash.erase(peb)?,
            }
        }
        if self.workload_start >= self.ops.len() {
            at_workload();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEOMETRY: &str =
        "# peb_size 131072 leb_size 129024 peb_count 8 page 2048 subpage 512 vid_hdr_offset 512 data_offset 2048\n";

    #[test]
    fn a_trace_parses_with_its_markers_and_refuses_nonsense() {
        let t = Trace::parse(&format!(
            "# comment\n{GEOMETRY}R 0 0 64\n# workload starts\nW 1 2048 2048\nE 1 0 131072\n"
        ))
        .unwrap();
        assert_eq!(t.geometry.peb_count, 8);
        assert_eq!(
            (t.geometry.nop, t.data_offset, t.workload_start),
            (4, 2048, 1)
        );
        assert_eq!(t.ops[2], Op::Erase { peb: 1 });
        assert_eq!(t.workload_data_bytes(), 2048);
        for bad in [
            "R 0 0 64\n",
            &format!("{GEOMETRY}X 0 0 1\n"),
            &format!("{GEOMETRY}W 9 0 512\n"),
            &format!("{GEOMETRY}W 1 0\n"),
        ] {
            assert!(
                matches!(
                    Trace::parse(bad),
                    Err(Error::Format(_) | Error::OutOfRange(_))
                ),
                "{bad}"
            );
        }
    }
}
