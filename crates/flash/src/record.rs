//! Recording what an upper layer asks of a chip, as a [`Trace`]: [`Recorder`] is a [`Flash`]
//! that forwards every call to another and logs each read, program, erase and sync, in the
//! order they reach the chip (what Linux's `ubitrace` patch logs at `io.c`, plus syncs). So a
//! workload run on our own UBI becomes a trace like Linux's, replayable on any stack
//! ([`Trace::replay`]) and saved as text (`Trace`'s `Display`).
//!
//! Operations are logged as issued, failed ones included, as the kernel's traces are; an
//! operation outside the chip is not (the chip never sees it, and a trace cannot hold it). Spare
//! area reads and bad-block queries and marks are forwarded but not logged: the trace format
//! has no line for them, and Linux's traces leave them out too.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::trace::{Op, Trace};
use crate::{Error, Flash, Geometry, ReadStatus};

/// A [`Flash`] that logs what it forwards (see the module docs).
pub struct Recorder {
    inner: Arc<dyn Flash>,
    vid_hdr_offset: u32,
    data_offset: u32,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    ops: Vec<Op>,
    workload_start: usize,
}

impl Recorder {
    /// Record what is done to `inner`, on which UBI puts its VID header at `vid_hdr_offset` and
    /// its data at `data_offset` (what the trace's geometry line says).
    pub fn new(inner: Arc<dyn Flash>, vid_hdr_offset: u32, data_offset: u32) -> Recorder {
        Recorder {
            inner,
            vid_hdr_offset,
            data_offset,
            log: Mutex::new(Log::default()),
        }
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Mark the start of the workload here (`# workload starts`): what was recorded so far is
    /// the setup.
    pub fn mark_workload_start(&self) {
        let mut log = self.log();
        log.workload_start = log.ops.len();
    }

    /// What was recorded so far.
    pub fn trace(&self) -> Trace {
        let log = self.log();
        Trace {
            geometry: self.inner.geometry(),
            vid_hdr_offset: self.vid_hdr_offset,
            data_offset: self.data_offset,
            ops: log.ops.clone(),
            workload_start: log.workload_start,
        }
    }

    /// Log `op` (if `len` bytes at `offset` of `peb` lie on the chip) and run `call` on the
    /// inner chip, the log held so that its order is the chip's.
    fn record<T>(
        &self,
        op: Op,
        (peb, offset, len): (u32, u32, usize),
        call: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut log = self.log();
        if self.inner.geometry().check_range(peb, offset, len).is_ok() {
            log.ops.push(op);
        }
        call()
    }
}

impl Flash for Recorder {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, Error> {
        let len = buf.len();
        let op = Op::Read {
            peb,
            offset,
            len: len as u32,
        };
        self.record(op, (peb, offset, len), || self.inner.read(peb, offset, buf))
    }

    fn program(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        let len = data.len();
        let op = Op::Write {
            peb,
            offset,
            len: len as u32,
        };
        self.record(op, (peb, offset, len), || {
            self.inner.program(peb, offset, data)
        })
    }

    fn erase(&self, peb: u32) -> Result<(), Error> {
        self.record(Op::Erase { peb }, (peb, 0, 0), || self.inner.erase(peb))
    }

    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), Error> {
        self.inner.read_oob(peb, page, buf)
    }

    fn is_bad(&self, peb: u32) -> Result<bool, Error> {
        self.inner.is_bad(peb)
    }

    fn mark_bad(&self, peb: u32) -> Result<(), Error> {
        self.inner.mark_bad(peb)
    }

    fn sync(&self) -> Result<(), Error> {
        self.record(Op::Sync, (0, 0, 0), || self.inner.sync())
    }

    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
}

#[cfg(test)]
mod tests {
    use sectorcrypt_storage::MemStorage;

    use super::*;
    use crate::sim::SimNand;

    fn chip(g: Geometry) -> Arc<SimNand> {
        let image = MemStorage::new(vec![0; SimNand::image_len(&g) as usize]);
        Arc::new(SimNand::create(image, g, &[]).unwrap())
    }

    /// A recorded run saved as text parses back to the same trace, and replaying it on a fresh
    /// chip leaves the same erase and page-program counts as the run itself.
    #[test]
    fn a_recording_round_trips_through_text_and_replays_to_the_same_wear() {
        let g = Geometry {
            peb_count: 8,
            oob_size: 16,
            nop: 8,
            ..Geometry::default()
        };
        let sim = chip(g);
        let rec = Recorder::new(Arc::clone(&sim) as Arc<dyn Flash>, 512, 2048);
        let page = vec![0x11u8; 2048];
        let mut buf = vec![0u8; 64];
        rec.erase(1).unwrap();
        rec.program(1, 0, &page[..512]).unwrap();
        rec.sync().unwrap();
        rec.mark_workload_start();
        rec.read(1, 0, &mut buf).unwrap();
        rec.program(1, 2048, &page).unwrap();
        rec.program(3, 0, &page).unwrap();
        rec.sync().unwrap();
        rec.erase(1).unwrap();
        assert!(rec.is_bad(2).is_ok_and(|bad| !bad));
        assert!(rec.read(9, 0, &mut buf).is_err());
        let t = rec.trace();
        assert_eq!(t.workload_start, 3);
        assert_eq!(
            t.ops,
            [
                Op::Erase { peb: 1 },
                Op::Write {
                    peb: 1,
                    offset: 0,
                    len: 512
                },
                Op::Sync,
                Op::Read {
                    peb: 1,
                    offset: 0,
                    len: 64
                },
                Op::Write {
                    peb: 1,
                    offset: 2048,
                    len: 2048
                },
                Op::Write {
                    peb: 3,
                    offset: 0,
                    len: 2048
                },
                Op::Sync,
                Op::Erase { peb: 1 },
            ]
        );
        let text = t.to_string();
        assert!(
            text.contains("\nS\n# workload starts\nR 1 0 64\n"),
            "{text}"
        );
        assert!(text.contains("\nE 1 0 131072\n"), "{text}");
        assert_eq!(Trace::parse(&text).unwrap(), t);

        let fresh = chip(g);
        let mut setup = Vec::new();
        t.replay(&*fresh, &mut || setup = fresh.erase_counts())
            .unwrap();
        assert_eq!(setup[1], 1);
        assert_eq!(fresh.erase_counts(), sim.erase_counts());
        for peb in 0..g.peb_count {
            assert_eq!(
                fresh.program_counts(peb).unwrap(),
                sim.program_counts(peb).unwrap()
            );
        }
    }
}
