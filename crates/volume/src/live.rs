//! Serving a volume while it is converted in place (online reencryption, encryption and
//! decryption), as dm-crypt serves an active device that `cryptsetup reencrypt` converts.
//!
//! # Routing
//!
//! While a conversion runs, the data is in up to three LUKS2 segments (converted, not yet
//! converted, and a data shift's moved first chunk), each with its own place on the device, cipher
//! and key: the header's regular segments, in logical order, are a routing table. Each request is
//! cut at segment boundaries and each piece handed to the [`Volume`] of its segment. Those views
//! are made once per *identity* (where logical byte 0 would be on the device, cipher, sector size,
//! IV base, key) and reused when a step moves a boundary, so two requests for the same bytes always
//! meet the same view, and so the same read-modify-write locks.
//!
//! # The hotzone
//!
//! A step converts one hotzone. Before it reads it, the step *holds* the hotzone's logical range:
//! new requests that touch it wait, and the step waits for those already in it to end; requests
//! elsewhere never wait. With the step's header written, the table is rebuilt from it and the
//! range let go. A request therefore never sees a half-converted sector, and a write never lands
//! in the hotzone between the step's read and its write (it would be lost). A step that fails
//! leaves its range failed: requests there get an I/O error, the rest of the volume is served.
//!
//! Routing costs a mutex per request, so a volume starts without it and switches when a
//! conversion starts on it, after the requests then in flight have ended (a write lock that every
//! unrouted request holds for reading).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use sectorcrypt_luks::luks2::metadata::Metadata;
use sectorcrypt_luks::luks2::reencrypt::{self, SegmentKind};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;

use crate::{Error, Layout, Volume, VolumeOptions};

/// What a running conversion tells the volume that serves its device (see the module docs).
/// [`Offline`] is the conversion with no server: nothing to tell.
pub trait Serving: Sync {
    /// A conversion runs with these volume keys (`None` for a plaintext side) and the header it
    /// has just read or written (a clean state): route every request by its segments from now
    /// on.
    fn started(
        &self,
        header: &Luks2Header,
        old_key: Option<&[u8]>,
        new_key: Option<&[u8]>,
    ) -> Result<(), Error>;

    /// The logical bytes `[at, at + len)` are about to be converted: hold new requests there off
    /// and wait for those in it to end.
    fn hold(&self, at: u64, len: u64);

    /// The step is done and `metadata` records it: route by it and let the held requests in.
    fn release(&self, metadata: &Metadata) -> Result<(), Error>;

    /// The step failed (`why`): requests in its range fail from now on.
    fn failed(&self, why: &Error);

    /// Whether anything is served (so writes can arrive between a step's own reads).
    fn is_live(&self) -> bool;
}

/// No server: a conversion of a device nothing else uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Offline;

impl Serving for Offline {
    fn started(&self, _: &Luks2Header, _: Option<&[u8]>, _: Option<&[u8]>) -> Result<(), Error> {
        Ok(())
    }
    fn hold(&self, _: u64, _: u64) {}
    fn release(&self, _: &Metadata) -> Result<(), Error> {
        Ok(())
    }
    fn failed(&self, _: &Error) {}
    fn is_live(&self) -> bool {
        false
    }
}

/// Where a segment's bytes are and how they are encrypted, independent of where the segment
/// starts: two segments with one identity are one view.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    /// Device offset of logical byte 0 (the segment's offset minus its logical start).
    delta: u64,
    /// `None`: plaintext.
    cipher: Option<String>,
    sector_size: usize,
    /// IV of logical byte 0, in 512-byte units.
    iv_base: u64,
    /// Which key: the conversion's new one (or else the old one).
    new_key: bool,
}

/// One piece of the table: logical `[start, end)` served by `view`.
struct Route {
    start: u64,
    end: u64,
    view: Arc<Volume>,
}

/// The requests in flight and the hotzone held.
struct Traffic {
    routes: Arc<Vec<Route>>,
    /// The held range, and why it failed if its step did.
    hot: Option<(u64, u64, Option<String>)>,
    /// In-flight requests: ticket and logical range.
    inflight: Vec<(u64, u64, u64)>,
    next_ticket: u64,
}

/// The routing state of a volume under conversion.
pub(crate) struct Live {
    storage: Arc<dyn Storage>,
    options: VolumeOptions,
    /// The exposed size.
    size: u64,
    old_key: Option<SecretBytes>,
    new_key: Option<SecretBytes>,
    views: Mutex<Vec<(Identity, Arc<Volume>)>>,
    traffic: Mutex<Traffic>,
    changed: Condvar,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// A request in flight; leaves the table when dropped.
struct Ticket<'a> {
    live: &'a Live,
    id: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut t = self.live.traffic();
        t.inflight.retain(|(id, _, _)| *id != self.id);
        if t.hot.is_some() {
            self.live.changed.notify_all();
        }
    }
}

impl Live {
    /// Routing for `header` (a clean conversion state) over `storage`, `size` bytes exposed.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        options: VolumeOptions,
        size: u64,
        header: &Luks2Header,
        old_key: Option<&[u8]>,
        new_key: Option<&[u8]>,
    ) -> Result<Live, Error> {
        let live = Live {
            storage,
            options,
            size,
            old_key: old_key.map(SecretBytes::from_slice),
            new_key: new_key.map(SecretBytes::from_slice),
            views: Mutex::new(Vec::new()),
            traffic: Mutex::new(Traffic {
                routes: Arc::new(Vec::new()),
                hot: None,
                inflight: Vec::new(),
                next_ticket: 0,
            }),
            changed: Condvar::new(),
        };
        let routes = live.routes(header.metadata())?;
        live.traffic().routes = Arc::new(routes);
        Ok(live)
    }

    fn traffic(&self) -> MutexGuard<'_, Traffic> {
        self.traffic.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The routing table of `header`'s regular segments.
    fn routes(&self, md: &Metadata) -> Result<Vec<Route>, Error> {
        let r = reencrypt::parse(md)?;
        let Some(r) = r else {
            return Err(Error::Unsupported(
                "routing a header that records no conversion".into(),
            ));
        };
        let digest_new = r.digest_new;
        let device_len = self.storage.len()?;
        let mut routes = Vec::new();
        let mut start = 0u64;
        for seg in &r.segments {
            if start >= self.size {
                break;
            }
            let len = match seg.size {
                Some(n) => n,
                None => device_len.saturating_sub(seg.offset),
            };
            let end = start.saturating_add(len).min(self.size);
            let unsupported = |why: &str| Error::Unsupported(format!("serving a segment {why}"));
            let delta = seg
                .offset
                .checked_sub(start)
                .ok_or_else(|| unsupported("that starts before its logical offset"))?;
            let identity = match &seg.kind {
                SegmentKind::Linear => Identity {
                    delta,
                    cipher: None,
                    sector_size: 512,
                    iv_base: 0,
                    new_key: false,
                },
                SegmentKind::Crypt {
                    iv_tweak,
                    encryption,
                    sector_size,
                } => {
                    let digest = md.digest_of_segment(seg.id).map(|(n, _)| n);
                    let new_key = digest.is_some() && digest == digest_new;
                    Identity {
                        delta,
                        cipher: Some(encryption.clone()),
                        sector_size: *sector_size as usize,
                        iv_base: iv_tweak
                            .checked_sub(start / 512)
                            .ok_or_else(|| unsupported("whose IV starts before its offset"))?,
                        new_key,
                    }
                }
                _ => return Err(unsupported("of an unknown kind")),
            };
            let view = self.view(identity, device_len)?;
            if end > start {
                routes.push(Route { start, end, view });
            }
            start = end;
        }
        if start < self.size {
            return Err(Error::Unsupported(format!(
                "segments that cover {start} of the {} bytes served",
                self.size
            )));
        }
        Ok(routes)
    }

    /// The view of `identity`, made on first use.
    fn view(&self, identity: Identity, device_len: u64) -> Result<Arc<Volume>, Error> {
        let mut views = self.views.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, v)) = views.iter().find(|(i, _)| *i == identity) {
            return Ok(Arc::clone(v));
        }
        let ss = identity.sector_size as u64;
        let room = device_len.saturating_sub(identity.delta);
        let layout = Layout {
            offset: identity.delta,
            size: room - room % ss,
            cipher: identity
                .cipher
                .clone()
                .unwrap_or_else(|| "cipher_null-ecb".into()),
            sector_size: identity.sector_size,
            iv_offset: identity.iv_base,
        };
        let key: &[u8] = match (&identity.cipher, identity.new_key) {
            (None, _) => &[],
            (Some(_), true) => self.new_key.as_deref().unwrap_or_default(),
            (Some(_), false) => self.old_key.as_deref().unwrap_or_default(),
        };
        let view = Arc::new(Volume::with_layout(
            Arc::clone(&self.storage),
            layout,
            key,
            &self.options,
        )?);
        views.push((identity, Arc::clone(&view)));
        Ok(view)
    }

    /// Enter `[offset, offset + len)`: wait while it is held, then count the request in flight.
    fn enter(&self, offset: u64, len: u64) -> Result<(Ticket<'_>, Arc<Vec<Route>>), Error> {
        let range = (offset, offset + len.max(1));
        let mut t = self.traffic();
        loop {
            match &t.hot {
                Some((s, e, failed)) if overlaps(range, (*s, *e)) => {
                    if let Some(why) = failed {
                        return Err(Error::Io(std::io::Error::other(format!(
                            "the conversion failed in bytes {s}..{e}: {why}"
                        ))));
                    }
                    t = self.changed.wait(t).unwrap_or_else(PoisonError::into_inner);
                }
                _ => break,
            }
        }
        let id = t.next_ticket;
        t.next_ticket += 1;
        t.inflight.push((id, range.0, range.1));
        let routes = Arc::clone(&t.routes);
        Ok((Ticket { live: self, id }, routes))
    }

    /// Run `each` over the pieces of `[offset, offset + len)`, one per route: the piece's
    /// logical offset and its range within the request.
    fn pieces(
        &self,
        offset: u64,
        len: u64,
        mut each: impl FnMut(&Volume, u64, std::ops::Range<usize>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let (_ticket, routes) = self.enter(offset, len)?;
        let end = offset + len;
        for route in routes.iter() {
            let (s, e) = (route.start.max(offset), route.end.min(end));
            if s < e {
                each(&route.view, s, (s - offset) as usize..(e - offset) as usize)?;
            }
        }
        Ok(())
    }

    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        self.pieces(offset, buf.len() as u64, |view, at, range| {
            view.read(&mut buf[range], at)
        })
    }

    pub(crate) fn write_in_place(&self, data: &mut [u8], offset: u64) -> Result<(), Error> {
        self.pieces(offset, data.len() as u64, |view, at, range| {
            view.write_in_place(&mut data[range], at)
        })
    }

    pub(crate) fn discard(&self, offset: u64, len: u64) -> Result<(), Error> {
        self.pieces(offset, len, |view, at, range| {
            view.discard(at, range.len() as u64)
        })
    }

    pub(crate) fn hold(&self, at: u64, len: u64) {
        let range = (at, at + len);
        let mut t = self.traffic();
        t.hot = Some((range.0, range.1, None));
        while t.inflight.iter().any(|(_, s, e)| overlaps(range, (*s, *e))) {
            t = self.changed.wait(t).unwrap_or_else(PoisonError::into_inner);
        }
    }

    pub(crate) fn release(&self, md: &Metadata) -> Result<(), Error> {
        let routes = self.routes(md);
        let mut t = self.traffic();
        match routes {
            Ok(routes) => {
                t.routes = Arc::new(routes);
                t.hot = None;
                self.changed.notify_all();
                Ok(())
            }
            Err(e) => {
                if let Some(hot) = &mut t.hot {
                    hot.2 = Some(e.to_string());
                }
                self.changed.notify_all();
                Err(e)
            }
        }
    }

    pub(crate) fn failed(&self, why: &Error) {
        let mut t = self.traffic();
        if let Some(hot) = &mut t.hot {
            hot.2 = Some(why.to_string());
        }
        self.changed.notify_all();
    }
}
