//! UBI flash-I/O traces (`data/flash-traces/` in the repository: every read, write and erase Linux's UBI sent
//! to MTD while UBIFS ran a benchmark, in order) and their replay on any [`Flash`]: the thesis'
//! experiment with a real UBIFS above the encryption layer, and the ground truth for what each
//! erased-space policy costs in program/erase cycles. Traces of our own UBI are recorded with
//! [`crate::record::Recorder`] and saved with [`Trace`]'s `Display` (the same text).
//!
//! The format (v1): `#` lines are comments (the geometry line `# peb_size N leb_size N
//! peb_count N page N subpage N vid_hdr_offset N data_offset N`, and markers such as
//! `# workload starts`); every other line is `R|W|E pnum offset len`. Files may be xz-compressed.
//! A trace holds no data, only where it went: a replayed write programs a fixed non-0xFF pattern,
//! which is all a P/E count needs (the layer rewrites a block whatever its contents).
//!
//! Two extensions, for recorded traces (Linux's traces have neither):
//!
//! - a line `S` alone is a [`Flash::sync`] (the upper layer asked for what it wrote to be made
//!   durable: where an erased-space policy may hide free space). It has no numbers, so it cannot
//!   be taken for one of the `R|W|E` lines, and a v1 reader that does not know it (the traces'
//!   `stats.py`) refuses it rather than miscounting;
//! - the geometry line may end with `oob N nop N` (spare bytes per page, partial programs per
//!   page); without them a trace is taken to come from the default SLC chip's spare size, with
//!   NOP = page / sub-page, as Linux's traces do.

use std::fmt;
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
    /// [`Flash::sync`] (line `S`; only in recorded traces).
    Sync,
}

/// A parsed trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The chip it was recorded on (spare size and NOP as the default SLC chip's unless the
    /// geometry line gives them).
    pub geometry: Geometry,
    /// Where UBI's VID header sits in a PEB.
    pub vid_hdr_offset: u32,
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

/// The geometry line's words (after `#`): a chip and UBI's offsets in it.
fn parse_geometry(words: &[&str], n: usize) -> Result<(Geometry, u32, u32), Error> {
    let field = |key: &str| -> Option<Result<u32, Error>> {
        let p = words.iter().position(|w| *w == key)?;
        Some(
            words
                .get(p + 1)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(n, &format!("{key} without a number in the geometry line"))),
        )
    };
    let need = |key: &str| {
        field(key).unwrap_or_else(|| Err(bad(n, &format!("no {key} in the geometry line"))))
    };
    let page = need("page")?;
    let sub_page = need("subpage")?;
    let nop = match field("nop") {
        Some(v) => u8::try_from(v?).map_err(|_| bad(n, "nop is at most 255"))?,
        None => (page / sub_page.max(1)).clamp(1, 255) as u8,
    };
    let g = Geometry {
        peb_size: need("peb_size")?,
        page_size: page,
        sub_page_size: sub_page,
        peb_count: need("peb_count")?,
        oob_size: field("oob").unwrap_or(Ok(Geometry::default().oob_size))?,
        nop,
    };
    g.validate()?;
    Ok((g, need("vid_hdr_offset")?, need("data_offset")?))
}

impl Trace {
    /// Parse the text of a trace.
    ///
    /// Errors: [`Error::Format`] for a line that is neither a comment nor an operation, a missing
    /// or second geometry line, or an operation outside the geometry.
    pub fn parse(text: &str) -> Result<Trace, Error> {
        let mut geometry = None;
        let mut ops = Vec::new();
        let mut workload_start = 0;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if let Some(comment) = line.strip_prefix('#') {
                let words: Vec<&str> = comment.split_whitespace().collect();
                if words.first() == Some(&"peb_size") {
                    // One chip per trace: the operations before a second geometry line were
                    // checked against the first, and could lie outside the second (found by
                    // fuzzing).
                    if geometry.is_some() {
                        return Err(bad(n, "a second geometry line"));
                    }
                    geometry = Some(parse_geometry(&words, n)?);
                } else if words == ["workload", "starts"] {
                    workload_start = ops.len();
                }
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let Some(&kind) = f.first() else {
                continue;
            };
            let (g, _, _) =
                geometry.ok_or_else(|| bad(n, "an operation before the geometry line"))?;
            let op = match kind {
                "S" if f.len() == 1 => Op::Sync,
                "S" => return Err(bad(n, "a sync is a line S alone")),
                "R" | "W" | "E" => {
                    let num = |k: usize| -> Result<u32, Error> {
                        f.get(k)
                            .filter(|_| f.len() == 4)
                            .and_then(|v| v.parse().ok())
                            .ok_or_else(|| bad(n, "expected R|W|E pnum offset len"))
                    };
                    let (peb, offset, len) = (num(1)?, num(2)?, num(3)?);
                    g.check_range(peb, offset, len as usize)?;
                    match kind {
                        "R" => Op::Read { peb, offset, len },
                        "W" => Op::Write { peb, offset, len },
                        _ => Op::Erase { peb },
                    }
                }
                other => return Err(bad(n, &format!("unknown operation {other:?}"))),
            };
            ops.push(op);
        }
        let (geometry, vid_hdr_offset, data_offset) =
            geometry.ok_or_else(|| Error::Format("a trace without its geometry line".into()))?;
        Ok(Trace {
            geometry,
            vid_hdr_offset,
            data_offset,
            ops,
            workload_start,
        })
    }

    /// Read a trace file, xz-compressed or not.
    ///
    /// Errors: [`Error::Io`] for a file that cannot be read or decompressed; as [`Trace::parse`].
    pub fn read(path: &Path) -> Result<Trace, Error> {
        Trace::from_bytes(&std::fs::read(path)?, &path.display().to_string())
    }

    /// Parse the contents of a trace file, xz-compressed or not; `name` says where they came
    /// from, for errors.
    ///
    /// Errors: [`Error::Format`] for bytes that do not decompress or are not text; as
    /// [`Trace::parse`].
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Trace, Error> {
        let decompressed;
        let text = if bytes.starts_with(b"\xFD7zXZ\x00") {
            let mut out = Vec::new();
            lzma_rs::xz_decompress(&mut &bytes[..], &mut out)
                .map_err(|e| Error::Format(format!("{name}: not a readable xz file: {e}")))?;
            decompressed = out;
            &decompressed[..]
        } else {
            bytes
        };
        let text = std::str::from_utf8(text)
            .map_err(|_| Error::Format(format!("{name}: a trace is text")))?;
        Trace::parse(text)
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

    /// Apply the operations to `flash`, in order (a sync as [`Flash::sync`]); `at_workload` runs
    /// once when the workload starts (to take the counts of the setup).
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
                Op::Sync => flash.sync()?,
            }
        }
        if self.workload_start >= self.ops.len() {
            at_workload();
        }
        Ok(())
    }
}

/// The trace as text, in the format [`Trace::parse`] reads (a recorded trace saved this way
/// parses back to an equal `Trace`): a header, the geometry line (with `oob` and `nop`), the
/// operations with `# workload starts` before the first of the workload (an erase written as
/// Linux's traces write it, `E pnum 0 peb_size`).
impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.geometry;
        writeln!(
            f,
            "# ubitrace v1 with S: one line per flash operation, in issue order: \"R|W|E pnum offset len\" or \"S\" (Flash::sync)"
        )?;
        writeln!(
            f,
            "# peb_size {} leb_size {} peb_count {} page {} subpage {} vid_hdr_offset {} data_offset {} oob {} nop {}",
            g.peb_size,
            g.peb_size.saturating_sub(self.data_offset),
            g.peb_count,
            g.page_size,
            g.sub_page_size,
            self.vid_hdr_offset,
            self.data_offset,
            g.oob_size,
            g.nop
        )?;
        writeln!(f, "# ops {}", self.ops.len())?;
        for (i, op) in self.ops.iter().enumerate() {
            if i == self.workload_start {
                writeln!(f, "# workload starts")?;
            }
            match *op {
                Op::Read { peb, offset, len } => writeln!(f, "R {peb} {offset} {len}")?,
                Op::Write { peb, offset, len } => writeln!(f, "W {peb} {offset} {len}")?,
                Op::Erase { peb } => writeln!(f, "E {peb} 0 {}", g.peb_size)?,
                Op::Sync => writeln!(f, "S")?,
            }
        }
        if self.workload_start >= self.ops.len() {
            writeln!(f, "# workload starts")?;
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
            &format!("{GEOMETRY}W 1 0 512 7\n"),
            &format!("{GEOMETRY}S 1\n"),
            "# peb_size 131072 leb_size 129024 peb_count 8 page 2048 subpage 512 data_offset 2048\n",
            &GEOMETRY.replace("\n", " nop 300\n"),
            // A second chip after an operation that only fits the first.
            &format!("{GEOMETRY}W 6 0 512\n{}", GEOMETRY.replace("count 8", "count 4")),
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

    #[test]
    fn syncs_and_the_chip_extras_parse_and_print_back() {
        let text = format!(
            "{}R 0 0 64\nS\n# workload starts\nW 1 2048 2048\n  S  \nE 1 0 131072\n",
            GEOMETRY.replace("\n", " oob 128 nop 8\n")
        );
        let t = Trace::parse(&text).unwrap();
        assert_eq!((t.geometry.oob_size, t.geometry.nop), (128, 8));
        assert_eq!((t.vid_hdr_offset, t.data_offset), (512, 2048));
        assert_eq!(
            (t.ops[1], t.ops[3], t.workload_start),
            (Op::Sync, Op::Sync, 2)
        );
        let printed = t.to_string();
        assert!(printed.contains(" oob 128 nop 8\n"), "{printed}");
        assert_eq!(Trace::parse(&printed).unwrap(), t);
    }

    /// A trace of Linux's (the one kept with the CLI's tests) prints to text that parses back to
    /// the same trace.
    #[test]
    fn a_linux_trace_round_trips_through_text() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sectorcrypt/tests/data/C-iozone.trace.xz");
        let linux = Trace::read(&path).unwrap();
        assert_eq!((linux.vid_hdr_offset, linux.data_offset), (512, 2048));
        assert_eq!(linux.geometry, Geometry::default());
        assert!(linux.workload_start > 0 && !linux.ops.contains(&Op::Sync));
        assert_eq!(Trace::parse(&linux.to_string()).unwrap(), linux);
    }
}
