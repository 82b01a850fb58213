//! The transmission phase of one connection.
//!
//! A few workers per connection take turns at the socket (leader/follower, as nbdkit does): the
//! worker holding the read lock reads one request (header, and a write's payload), passes the lock
//! on, then runs the request itself and sends its reply, in whatever order requests finish (the
//! protocol matches replies by cookie). The thread that received a write's payload is the one that
//! encrypts and stores it, so the data is still in that core's cache; there is no hand-off queue. A
//! small read of cached data that arrives alone is answered by the worker holding the read lock,
//! without passing it on (see [`work`]), which then polls the socket briefly for the next request
//! rather than let its CPU halt ([`Reader::poll_for_next`]). Requests not yet read wait in the socket, so a client's
//! queue depth beyond the workers costs the server nothing. Fewer writes than workers run at once:
//! a worker that reads a write's header when all write permits are taken waits for one, holding the
//! socket, before it receives the payload (reads wait behind it only while the writes already
//! saturate the server). Many workers keep many reads in flight to the disk; few writers keep each
//! payload in the cache of the core that encrypts it, and the file's lock uncontended.
//!
//! Limits that keep a hostile or broken client from hurting anyone else:
//! - payloads over the advertised maximum are refused (a write's payload is read and dropped, so
//!   the stream stays in step); at most one request per worker is in memory;
//! - a client that stops reading its replies hits a write timeout and is dropped;
//! - a request is only acted on once all of it has arrived: a client that vanishes halfway
//!   through a write leaves the volume untouched.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use sectorcrypt_volume::{Announced, Error as VolumeError};

use crate::exports::Target;
use crate::proto::*;
use crate::stream::Stream;

/// Pooled buffers up to this size (a 4 MiB request and its reply header).
const POOLED_MAX: usize = (4 << 20) + OFFSET_DATA_HEADER_LEN;

/// The largest cached read the worker holding the read lock answers itself. Meanwhile nobody
/// reads the socket, so a request that arrives waits for this one's decryption and reply; up to
/// here that takes about what waking another worker would (128 KiB reads at queue depth 8 ran
/// 0.92x slower answered this way).
const ANSWERED_HOLDING_MAX: u32 = 32 << 10;

/// How long the worker that answered a read holding the socket polls it for the next request
/// before sleeping on it (see [`Reader::poll_for_next`]).
const POLL_WINDOW: Duration = Duration::from_micros(50);

/// Pooled buffers per connection.
const POOL_SIZE: usize = 16;

/// Buffers of finished requests, reused: a fresh buffer would be zeroed (and page-faulted in)
/// for every request, which costs about as much CPU as decrypting it.
#[derive(Default)]
struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A buffer of at least `len` bytes (old contents included: callers overwrite what they use).
    fn take(&self, len: usize) -> Vec<u8> {
        let mut buf = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        buf
    }

    fn give(&self, buf: Vec<u8>) {
        if buf.len() <= POOLED_MAX {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            if free.len() < POOL_SIZE {
                free.push(buf);
            }
        }
    }
}

/// A counting semaphore: the writes a connection runs at once.
struct Permits {
    /// Permits free, and workers waiting for one (notified only when some wait: a wake with
    /// nobody waiting would still cost a system call per write).
    state: Mutex<(usize, usize)>,
    freed: Condvar,
}

impl Permits {
    fn new(n: usize) -> Permits {
        Permits {
            state: Mutex::new((n.max(1), 0)),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (usize, usize)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire(&self) -> Permit<'_> {
        let mut state = self.lock();
        while state.0 == 0 {
            state.1 += 1;
            state = self
                .freed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.1 -= 1;
        }
        state.0 -= 1;
        Permit(self)
    }
}

/// One write's turn, given back on drop.
struct Permit<'a>(&'a Permits);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.0 += 1;
        if state.1 > 0 {
            self.0.freed.notify_one();
        }
    }
}

/// What the connection's threads share.
struct Connection {
    target: Target,
    /// The read side; whoever holds it reads the next request.
    reader: Mutex<Reader>,
    writer: Mutex<Stream>,
    structured: bool,
    max_payload: u32,
    /// Set when a reply could not be sent: the client is gone or stuck, stop serving it.
    broken: AtomicBool,
    buffers: BufferPool,
    writes: Permits,
    on_storage_error: Option<fn(&VolumeError)>,
}

impl Connection {
    /// Send a whole reply, or mark the connection broken.
    fn send(&self, bytes: &[u8]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        let mut w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if w.write_all(bytes).is_err() {
            self.broken.store(true, Ordering::Relaxed);
            // Wake the reader too: nothing more will be answered.
            w.shutdown();
        }
    }

    /// A reply without payload: success or an error.
    fn reply(&self, req: &Request, error: u32, why: &str) {
        if self.structured && req.kind == CMD_READ {
            if error == 0 {
                // A zero-length read: no data chunk may be empty, so a bare final chunk.
                let mut out = [0u8; 20];
                chunk_header(&mut out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, req.cookie, 0);
                self.send(&out);
            } else {
                self.send(&structured_error(req.cookie, error, why));
            }
        } else {
            let mut out = [0u8; SIMPLE_REPLY_LEN];
            simple_reply_header(&mut out, error, req.cookie);
            self.send(&out);
        }
    }

    /// The error reply for `e`; a storage failure is also reported to the server's owner.
    fn fail(&self, req: &Request, e: &VolumeError) {
        if let (VolumeError::Io(_), Some(report)) = (e, self.on_storage_error) {
            report(e);
        }
        self.reply(req, errno(req.kind, e), &e.to_string())
    }

    fn reply_result(&self, req: &Request, result: Result<(), VolumeError>) {
        match result {
            Ok(()) => self.reply(req, 0, ""),
            Err(e) => self.fail(req, &e),
        }
    }

    /// Read and decrypt, then send header and data in one write. With `cached_only`, only if
    /// that waits for nothing ([`Announced::read_cached`]): `false`, nothing sent, when it would.
    fn read(&self, req: &Request, volume: &Announced, cached_only: bool) -> bool {
        let len = req.length as usize;
        if len == 0 {
            if !cached_only {
                self.reply_result(req, volume.read(&mut [], req.offset));
            }
            return !cached_only;
        }
        let head = if self.structured {
            OFFSET_DATA_HEADER_LEN
        } else {
            SIMPLE_REPLY_LEN
        };
        let mut out = self.buffers.take(head + len);
        let data = &mut out[head..head + len];
        let read = if cached_only {
            volume.read_cached(data, req.offset)
        } else {
            volume.read(data, req.offset).map(|()| true)
        };
        match read {
            Ok(true) => {}
            Ok(false) => {
                self.buffers.give(out);
                return false;
            }
            Err(e) => {
                self.buffers.give(out);
                self.fail(req, &e);
                return true;
            }
        }
        if self.structured {
            chunk_header(
                &mut out,
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                req.cookie,
                (8 + len) as u32,
            );
            out[20..28].copy_from_slice(&req.offset.to_be_bytes());
        } else {
            simple_reply_header(&mut out, 0, req.cookie);
        }
        self.send(&out[..head + len]);
        self.buffers.give(out);
        true
    }

    /// Answer `job` at once if it is a small read of data in the page cache and nothing more
    /// has arrived on `stream`; hand it back if not.
    fn answer_cached<'a>(&self, job: Job<'a>, stream: &Stream) -> Option<Job<'a>> {
        match (&job.announced, job.req.kind) {
            (Ok(volume), CMD_READ)
                if job.req.length <= ANSWERED_HOLDING_MAX
                    && !stream.waiting()
                    && self.read(&job.req, volume, true) =>
            {
                None
            }
            _ => Some(job),
        }
    }

    /// Run one request that passed the reader's checks, on the volume it was announced to.
    fn execute(&self, job: Job<'_>) {
        let Job {
            req,
            payload,
            announced,
            permit,
        } = job;
        let req = &req;
        if req.kind == CMD_FLUSH {
            // A flush needs no key.
            return self.reply_result(req, self.target.flush());
        }
        let volume = match &announced {
            Ok(a) => a,
            Err(e) => {
                if let Some(data) = payload {
                    self.buffers.give(data);
                }
                return self.fail(req, e);
            }
        };
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let with_fua = |r: Result<(), VolumeError>| match r {
            Ok(()) if fua => volume.flush(),
            other => other,
        };
        let len = u64::from(req.length);
        match req.kind {
            CMD_READ => {
                self.read(req, volume, false);
            }
            CMD_WRITE => {
                let mut data = payload.unwrap_or_default();
                let r = volume.write_in_place(&mut data[..req.length as usize], req.offset);
                drop(permit);
                self.buffers.give(data);
                self.reply_result(req, with_fua(r));
            }
            CMD_TRIM => {
                let r = volume.discard(req.offset, len);
                self.reply_result(req, with_fua(r));
            }
            CMD_WRITE_ZEROES => {
                let r = volume.write_zeroes(req.offset, len);
                self.reply_result(req, with_fua(r));
            }
            _ => self.reply(req, EINVAL, "unknown command"),
        }
    }
}

/// The protocol's errno for a volume error on command `kind`.
fn errno(kind: u16, e: &VolumeError) -> u32 {
    match e {
        VolumeError::OutOfRange { .. } if kind == CMD_WRITE || kind == CMD_WRITE_ZEROES => ENOSPC,
        VolumeError::OutOfRange { .. } | VolumeError::DiscardsNotAllowed => EINVAL,
        VolumeError::ReadOnly => EPERM,
        VolumeError::Io(io) if io.raw_os_error() == Some(28) => ENOSPC,
        _ => EIO,
    }
}

/// Whether a client whose request came `after` a held answer is prompt enough to poll for: within
/// [`POLL_WINDOW`] if the worker polled (that is, the poll caught it), within twice that if the
/// worker slept (the wake-up is part of `after`).
fn prompt(after: Duration, polled: bool) -> bool {
    after <= if polled { POLL_WINDOW } else { 2 * POLL_WINDOW }
}

/// The read side of the connection.
struct Reader {
    stream: Stream,
    /// The client said goodbye, broke the protocol or went away: read no more.
    done: bool,
    /// Whether the client has been prompt: the last request after a read answered holding the
    /// socket came within [`POLL_WINDOW`] of the answer (twice that when the worker slept, which
    /// adds the wake-up). Then the worker polls next time.
    prompt: bool,
    /// When the last such answer was sent, and whether the worker polled after it.
    answered: Option<(Instant, bool)>,
}

impl Reader {
    /// After a read answered holding the socket (a client that waits for each answer before it
    /// asks again): poll the socket for up to [`POLL_WINDOW`] before the read sleeps on it, if
    /// the last request after such an answer came that soon. On a VM a sleeping server halts its
    /// virtual CPU, and waking it for the next request costs an exit to the hypervisor and back
    /// (half of a 4 KiB cached read's round trip on the 2-CPU hosts here: `docs/BENCHMARKS.md`,
    /// "Polling for the next request"). A client slower than the window stops the polling until
    /// it is prompt again, so an idle or slow client costs one window at most.
    fn poll_for_next(&mut self) {
        let now = Instant::now();
        if self.prompt {
            // Yielding, not spinning: a client on this CPU (or anything else) runs at once.
            while !self.stream.waiting() && now.elapsed() < POLL_WINDOW {
                thread::yield_now();
            }
        }
        self.answered = Some((now, self.prompt));
    }

    /// A request has been read: note whether the client was prompt.
    fn arrived(&mut self) {
        if let Some((answered, polled)) = self.answered.take() {
            self.prompt = prompt(answered.elapsed(), polled);
        }
    }
}

/// A request read in full and ready to run, with the volume (and key) it runs on, or why there
/// is none.
struct Job<'a> {
    req: Request,
    payload: Option<Vec<u8>>,
    announced: Result<Announced, VolumeError>,
    /// A write's turn.
    permit: Option<Permit<'a>>,
}

/// Serve requests on `stream` until the client disconnects, breaks the protocol or the stream
/// is shut down. Returns once every reply has been sent.
pub(crate) fn serve(
    stream: Stream,
    target: Target,
    structured: bool,
    max_payload: u32,
    workers: usize,
    writers: usize,
    on_storage_error: Option<fn(&VolumeError)>,
) -> io::Result<()> {
    let conn = Arc::new(Connection {
        target,
        writer: Mutex::new(stream.try_clone()?),
        reader: Mutex::new(Reader {
            stream,
            done: false,
            prompt: true,
            answered: None,
        }),
        structured,
        max_payload,
        broken: AtomicBool::new(false),
        writes: Permits::new(writers.min(workers)),
        buffers: BufferPool::default(),
        on_storage_error,
    });
    // This thread is one of the workers.
    let others: Vec<_> = (1..workers.max(1))
        .map(|i| {
            let conn = Arc::clone(&conn);
            thread::Builder::new()
                .name(format!("nbd-worker-{i}"))
                .spawn(move || work(&conn))
        })
        .collect::<io::Result<_>>()?;
    work(&conn);
    for worker in others {
        let _ = worker.join();
    }
    conn.reader
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .stream
        .shutdown();
    Ok(())
}

/// One worker: take the read lock, read a request, let go, run it; until the reading is done.
/// A small read whose data is all in the page cache, with nothing more on the socket, is answered
/// without letting go: a worker woken to read next would find nothing there and sleep again,
/// which costs a switch and a wake-up (on a VM, exits to the hypervisor) per request, for a
/// client that waits for each answer before it asks again. A read that would wait for the disk
/// lets go first, so that the requests behind it still reach the disk together.
fn work(conn: &Connection) {
    loop {
        let job = {
            let mut reader = conn.reader.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if reader.done {
                    return;
                }
                let Some(job) = next_job(&mut reader.stream, conn) else {
                    reader.done = true;
                    return;
                };
                reader.arrived();
                if conn.broken.load(Ordering::Relaxed) {
                    break job;
                }
                if let Some(job) = conn.answer_cached(job, &reader.stream) {
                    break job;
                }
                reader.poll_for_next();
            }
        };
        if !conn.broken.load(Ordering::Relaxed) {
            conn.execute(job);
        }
    }
}

/// Read requests until one is ready to run, answering those refused on sight; `None` at
/// `NBD_CMD_DISC`, the end of the stream, or a protocol error that leaves the stream out of step.
fn next_job<'a>(stream: &mut Stream, conn: &'a Connection) -> Option<Job<'a>> {
    const KNOWN_FLAGS: u16 = CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_DF;
    loop {
        let mut head = [0u8; REQUEST_LEN];
        stream.read_exact(&mut head).ok()?;
        if conn.broken.load(Ordering::Relaxed) {
            return None;
        }
        // A bad magic means the stream is out of step: nothing after it can be trusted.
        let req = Request::parse(&head)?;
        let len = req.length;
        if req.kind == CMD_DISC {
            return None;
        }
        if req.kind == CMD_WRITE {
            if len > conn.max_payload {
                skip(stream, u64::from(len)).ok()?;
                conn.reply(&req, EINVAL, "write larger than the maximum payload");
                continue;
            }
            let permit = conn.writes.acquire();
            let mut payload = conn.buffers.take(len as usize);
            // A client vanishing here leaves nothing half-written: the write never started.
            stream.read_exact(&mut payload[..len as usize]).ok()?;
            if req.flags & !KNOWN_FLAGS != 0 {
                conn.reply(&req, EINVAL, "unknown command flags");
                continue;
            }
            return Some(Job {
                req,
                payload: Some(payload),
                announced: conn.target.announce(),
                permit: Some(permit),
            });
        }
        let refusal = match req.kind {
            _ if req.flags & !KNOWN_FLAGS != 0 => Some("unknown command flags"),
            CMD_READ if len > conn.max_payload => Some("read larger than the maximum payload"),
            CMD_READ | CMD_FLUSH | CMD_WRITE_ZEROES => None,
            CMD_TRIM if conn.target.allows_discards() => None,
            CMD_TRIM => Some("discards are off (--allow-discards)"),
            _ => Some("unknown command"),
        };
        match refusal {
            Some(why) => conn.reply(&req, EINVAL, why),
            None => {
                return Some(Job {
                    req,
                    payload: None,
                    announced: conn.target.announce(),
                    permit: None,
                })
            }
        }
    }
}

/// Read and drop `len` bytes.
fn skip(stream: &mut Stream, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut (&mut *stream).take(len), &mut io::sink())?;
    if copied < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_stops_for_a_slow_client_and_resumes_for_a_prompt_one() {
        let us = Duration::from_micros;
        // A request the poll caught keeps the polling on; one it missed turns it off.
        assert!(prompt(us(10), true));
        assert!(prompt(POLL_WINDOW, true));
        assert!(!prompt(POLL_WINDOW + us(1), true));
        // After a sleep the wake-up counts too: a request within twice the window turns it on.
        assert!(prompt(POLL_WINDOW + us(30), false));
        assert!(!prompt(2 * POLL_WINDOW + us(1), false));
        assert!(!prompt(Duration::from_millis(5), false));
    }
}
