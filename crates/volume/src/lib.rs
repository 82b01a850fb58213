//! An unlocked volume: a LUKS data segment, its keyed [`SectorCipher`] and the [`Storage`] it
//! lives on, read and written at any byte offset and length.
//!
//! # How a request is cut
//!
//! The cipher works on whole encryption sectors, clients on bytes. A request is split into
//!
//! - an unaligned *head*: the part of the first sector it covers, if it does not start on a
//!   sector boundary;
//! - the aligned *body*: whole sectors, handed to the cipher as **one extended request** (all
//!   tweaks in one batch, one pass over the buffer, spread over the cipher's worker threads when
//!   it is large);
//! - an unaligned *tail*: the part of the last sector it covers.
//!
//! Reads of an unaligned request read the whole sector span once and decrypt it as one extended
//! request too. Writes of a partial sector are read-modify-write: read the sector, decrypt,
//! patch, encrypt, write. That must not race with another partial write of the same sector (the
//! second would write back the first one's sector as it was before), so each RMW holds the lock
//! of its sector's stripe in a small table of locks, never a global one: writes to different
//! sectors, and all aligned writes, proceed in parallel. Overlapping writes in flight at the same
//! time have no defined order (as on any block device), but bytes that two writes do not share
//! are never lost.
//!
//! The volume itself is `Sync`: servers call it from many threads at once. A large request is
//! spread over the cipher's worker threads only while it is the only request in progress (and,
//! for servers that queue requests, the only one queued: see [`Volume::announce`]): when other
//! requests are waiting or running, the cores have work already, and splitting would only add
//! hand-offs (and the workers' spinning) to the CPU time of every request.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use sectorcrypt_cipher::sector::PARALLEL_MIN;
use sectorcrypt_cipher::{BackendChoice, CipherSpec, Direction, SectorCipher, SectorOptions};
use sectorcrypt_luks::Header;
use sectorcrypt_storage::Storage;

/// Locks for read-modify-write of partial sectors; a sector uses stripe `sector % STRIPES`.
const STRIPES: usize = 64;

/// Write-zeroes works through buffers of this size.
const ZERO_CHUNK: usize = 1 << 20;

/// Requests handled on the calling thread go to storage and cipher in pieces of this size (a
/// multiple of every sector size), small enough to stay in a core's L2 cache between the copy
/// and the cipher.
const CACHE_PIECE: usize = 256 * 1024;

/// The smallest read decrypted from bytes the storage lends ([`Storage::read_lent`]): the first
/// touch of a mapped page is a page fault, which costs about what copying 4 KiB saves (measured:
/// docs/BENCHMARKS.md), and small random reads mostly touch new pages, each then holding a
/// page-table entry. Writes are lent at any size ([`Storage::write_lent`]): a small `pwrite`
/// costs far more than its copy where the page cache holds large folios (ext4 then walks every
/// block of the folio on each write, 4 KiB or 2 MiB alike), while a store into a page already
/// dirty costs nothing more, and one into a clean page a fault once until it is written back.
const READ_LENT_MIN: usize = 32 * 1024;

/// What went wrong in the volume layer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The request reaches past the end of the volume (or its end overflows 64 bits).
    OutOfRange {
        /// First byte asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The volume size.
        size: u64,
    },
    /// A write, write-zeroes or discard on a read-only volume.
    ReadOnly,
    /// A discard on a volume opened without `allow_discards`.
    DiscardsNotAllowed,
    /// The storage failed.
    Io(io::Error),
    /// The header describes a volume this layer cannot open.
    Unsupported(String),
    /// The header layer refused.
    Luks(sectorcrypt_luks::Error),
    /// The device records a conversion in progress (`mode`: encrypt, decrypt, reencrypt) that
    /// must be finished first.
    InProgress {
        /// The device.
        device: String,
        /// The conversion it records.
        mode: sectorcrypt_luks::luks2::reencrypt::Mode,
    },
    /// The device's state does not allow what was asked (nothing to resume, nothing to
    /// decrypt...); the text says what.
    Refused(String),
    /// The device cannot take what was asked (its size, or no conversion on it to resume); the
    /// text says what.
    WrongDevice(String),
    /// A header is there already where a new one would go (the device is encrypted already, or
    /// a header file exists); the text says what.
    Exists(String),
    /// The cipher refused (bad key, spec or sector size).
    Cipher(sectorcrypt_cipher::Error),
    /// A key-per-I/O request named a key tag that is not loaded (never, or evicted since).
    KeyNotLoaded(u32),
    /// The authenticated encryption refused: a block that fails its check (read as an I/O
    /// error), or an integrity device it cannot open.
    Integrity(sectorcrypt_integrity::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfRange { offset, len, size } => write!(
                f,
                "{len} bytes at offset {offset} reach past the end of the volume ({size} bytes)"
            ),
            Error::ReadOnly => write!(f, "the volume is read-only"),
            Error::DiscardsNotAllowed => {
                write!(
                    f,
                    "discards are off (they reveal which blocks are in use); see --allow-discards"
                )
            }
            Error::Io(e) => write!(f, "storage error: {e}"),
            Error::Unsupported(what) => write!(f, "unsupported volume: {what}"),
            Error::Luks(e) => write!(f, "{e}"),
            Error::InProgress { device, mode } => write!(
                f,
                "{device} records {} in progress; finish it first",
                mode.as_str()
            ),
            Error::Refused(why) | Error::WrongDevice(why) | Error::Exists(why) => f.write_str(why),
            Error::Cipher(e) => write!(f, "cipher error: {e}"),
            Error::KeyNotLoaded(tag) => write!(f, "no key is loaded under tag {tag}"),
            Error::Integrity(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            Error::Luks(e) => Some(e),
            Error::Cipher(e) => Some(e),
            Error::Integrity(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<sectorcrypt_cipher::Error> for Error {
    fn from(e: sectorcrypt_cipher::Error) -> Self {
        Error::Cipher(e)
    }
}

impl From<sectorcrypt_luks::Error> for Error {
    fn from(e: sectorcrypt_luks::Error) -> Self {
        Error::Luks(e)
    }
}

/// Where the encrypted data is and how it is encrypted: a LUKS data segment, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Byte offset of the first data sector on the data device.
    pub offset: u64,
    /// Payload bytes (whole encryption sectors).
    pub size: u64,
    /// dm-crypt cipher spec, e.g. `aes-xts-plain64`.
    pub cipher: String,
    /// Encryption sector size in bytes.
    pub sector_size: usize,
    /// Added to every IV, in 512-byte units.
    pub iv_offset: u64,
}

impl Layout {
    /// The data segment `header` describes on a data device of `device_len` bytes (a dynamic
    /// LUKS2 segment, and LUKS1's payload, reach to the device's end, rounded down to a sector).
    pub fn from_header(header: &Header, device_len: u64) -> Result<Self, Error> {
        let (offset, size, cipher, sector_size, iv_offset) = match header {
            Header::Luks2(h) => {
                // As cryptsetup activates no device whose header asks for what it does not know.
                h.metadata()
                    .check_requirements_known()
                    .map_err(Error::Luks)?;
                let seg = h.data_segment().map_err(Error::Luks)?;
                (
                    seg.offset,
                    seg.size,
                    seg.cipher,
                    seg.sector_size as usize,
                    seg.iv_tweak,
                )
            }
            Header::Luks1(h) => (h.payload_offset_bytes(), None, h.cipher_spec(), 512, 0),
        };
        if offset > device_len {
            return Err(Error::Unsupported(format!(
                "the data starts at byte {offset}, past the end of the {device_len}-byte device"
            )));
        }
        let available = device_len - offset;
        let size = match size {
            Some(s) if s > available => {
                return Err(Error::Unsupported(format!(
                    "the header says the data is {s} bytes, but only {available} follow its offset"
                )))
            }
            Some(s) => s,
            None => available - available % sector_size as u64,
        };
        Ok(Layout {
            offset,
            size,
            cipher,
            sector_size,
            iv_offset,
        })
    }
}

impl Layout {
    /// Expose only the first `bytes` of the data, as dm-crypt's table (`cryptsetup open --size`,
    /// `--device-size`) does: a positive whole number of encryption sectors, within the data;
    /// refused otherwise, with the rule in the message.
    pub fn limit_to(&mut self, bytes: u64) -> Result<(), Error> {
        let sector = self.sector_size as u64;
        if bytes == 0 || !bytes.is_multiple_of(sector) || bytes > self.size {
            return Err(Error::Refused(format!(
                "a size of {bytes} bytes: it must be a positive multiple of the {sector}-byte \
                 encryption sector, at most the {} bytes of data",
                self.size
            )));
        }
        self.size = bytes;
        Ok(())
    }

    /// Check that the data fits on `storage` in whole sectors; the cipher spec, parsed.
    pub fn check_fits(&self, storage: &dyn Storage) -> Result<CipherSpec, Error> {
        let spec = CipherSpec::parse(&self.cipher)?;
        let end = self.offset.checked_add(self.size);
        if end.is_none_or(|end| end > storage.len().unwrap_or(0)) {
            return Err(Error::Unsupported(format!(
                "{} bytes of data at offset {} do not fit on {}",
                self.size,
                self.offset,
                storage.name()
            )));
        }
        if !self.size.is_multiple_of(self.sector_size as u64) {
            return Err(Error::Unsupported(format!(
                "a data size of {} bytes, not a multiple of the {}-byte sector",
                self.size, self.sector_size
            )));
        }
        Ok(spec)
    }
}

/// How to open a volume.
#[derive(Clone, Debug)]
pub struct VolumeOptions {
    /// Refuse every write.
    pub read_only: bool,
    /// Pass discards down to the storage (dm-crypt's `allow_discards`). Off by default: discarded
    /// blocks read back as holes, which shows an observer which blocks are in use.
    pub allow_discards: bool,
    /// Cipher worker threads for large requests (1 = all inline).
    pub threads: usize,
    /// Which cipher backend to use.
    pub backend: BackendChoice,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            read_only: false,
            allow_discards: false,
            threads: 1,
            backend: BackendChoice::Auto,
        }
    }
}

/// An open, decrypted view of a volume.
pub struct Volume {
    storage: Arc<dyn Storage>,
    layout: Layout,
    /// `None` only for the request path a Key Per I/O table shares ([`kpio::KeyTable`]), whose
    /// requests each bring their key.
    cipher: Option<SectorCipher>,
    read_only: bool,
    allow_discards: bool,
    stripes: Vec<Mutex<()>>,
    /// Requests in progress (reads and writes), to decide whether to spread one over threads.
    in_progress: AtomicUsize,
    /// Requests servers have received and not yet finished ([`Volume::announce`]).
    announced: AtomicUsize,
    /// Set while a conversion runs on the volume (or since one did): requests go by its segments
    /// ([`live`]). Every request holds this for reading, so that switching drains them.
    live: RwLock<Option<live::Live>>,
    /// How it was opened (for the views of a conversion).
    options: VolumeOptions,
    /// The bytes exposed: the layout's size until [`Volume::resize`].
    size: AtomicU64,
    /// Requests received so far (reads, writes, discards), for a conversion that yields to them.
    requests: AtomicU64,
    /// A volume with authenticated encryption: requests go to its integrity device
    /// ([`integrity`]), which has the keys; `cipher` is then `None`.
    integrity: Option<sectorcrypt_integrity::IntegrityDevice>,
    /// Integrity volumes: whole-block writes hold this shared, a read-modify-write of partial
    /// blocks exclusive (no write lands between its read and its write).
    rmw: RwLock<()>,
}

/// A write of a buffer at an offset (scrambling the buffer), for [`Volume::zeroes`].
pub(crate) type WriteAt<'a> = &'a mut dyn FnMut(&mut [u8], u64) -> Result<(), Error>;

/// What a request encrypts with: a volume's own cipher, or a key of a Key Per I/O table (taken
/// from its table for each call, which may find it gone: hence the volume's error).
pub(crate) trait Key {
    fn process(&self, buf: &mut [u8], sector: u64, dir: Direction) -> Result<(), Error>;
    /// [`Key::process`] all on the calling thread (the same for keys without worker threads).
    fn process_inline(&self, buf: &mut [u8], sector: u64, dir: Direction) -> Result<(), Error> {
        self.process(buf, sector, dir)
    }
    /// Encrypt or decrypt whole sectors from `src` into `dst` (bytes the storage lends,
    /// [`Storage::read_lent`] and [`Storage::write_lent`]; encrypting, only ciphertext ever
    /// reaches `dst`), with the worker threads where [`Key::process`] would.
    fn process_from(
        &self,
        src: &[u8],
        dst: &mut [u8],
        sector: u64,
        dir: Direction,
    ) -> Result<(), Error>;
    /// [`Key::process_from`] all on the calling thread.
    fn process_from_inline(
        &self,
        src: &[u8],
        dst: &mut [u8],
        sector: u64,
        dir: Direction,
    ) -> Result<(), Error> {
        self.process_from(src, dst, sector, dir)
    }
}

impl Key for SectorCipher {
    fn process(&self, buf: &mut [u8], sector: u64, dir: Direction) -> Result<(), Error> {
        Ok(SectorCipher::process(self, buf, sector, dir)?)
    }
    fn process_inline(&self, buf: &mut [u8], sector: u64, dir: Direction) -> Result<(), Error> {
        Ok(SectorCipher::process_inline(self, buf, sector, dir)?)
    }
    fn process_from(
        &self,
        src: &[u8],
        dst: &mut [u8],
        sector: u64,
        dir: Direction,
    ) -> Result<(), Error> {
        Ok(SectorCipher::process_from(self, src, dst, sector, dir)?)
    }
    fn process_from_inline(
        &self,
        src: &[u8],
        dst: &mut [u8],
        sector: u64,
        dir: Direction,
    ) -> Result<(), Error> {
        Ok(SectorCipher::process_from_inline(
            self, src, dst, sector, dir,
        )?)
    }
}

/// [`Key::process_from`], or all on the calling thread unless `spread`.
fn process_from(
    key: &dyn Key,
    src: &[u8],
    dst: &mut [u8],
    sector: u64,
    dir: Direction,
    spread: bool,
) -> Result<(), Error> {
    if spread {
        key.process_from(src, dst, sector, dir)
    } else {
        key.process_from_inline(src, dst, sector, dir)
    }
}

/// A request a server has received and will run, on a volume ([`Volume::announce`]) or under a
/// tag of a Key Per I/O table ([`kpio::KeyTable::announce`]).
pub struct Announced(Target);

enum Target {
    Volume(Arc<Volume>),
    Key(Arc<kpio::KeyTable>, u32),
}

impl Announced {
    pub(crate) fn key(table: Arc<kpio::KeyTable>, tag: u32) -> Announced {
        Announced(Target::Key(table, tag))
    }

    /// [`Volume::read`].
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        match &self.0 {
            Target::Volume(v) => v.read(buf, offset),
            Target::Key(t, tag) => t.read(*tag, buf, offset),
        }
    }

    /// [`Volume::read_cached`].
    pub fn read_cached(&self, buf: &mut [u8], offset: u64) -> Result<bool, Error> {
        match &self.0 {
            Target::Volume(v) => v.read_cached(buf, offset),
            Target::Key(t, tag) => t.read_cached(*tag, buf, offset),
        }
    }

    /// [`Volume::write_in_place`].
    pub fn write_in_place(&self, data: &mut [u8], offset: u64) -> Result<(), Error> {
        match &self.0 {
            Target::Volume(v) => v.write_in_place(data, offset),
            Target::Key(t, tag) => t.write_in_place(*tag, data, offset),
        }
    }

    /// [`Volume::write_zeroes`].
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), Error> {
        match &self.0 {
            Target::Volume(v) => v.write_zeroes(offset, len),
            Target::Key(t, tag) => t.write_zeroes(*tag, offset, len),
        }
    }

    /// [`Volume::discard`].
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), Error> {
        match &self.0 {
            Target::Volume(v) => v.discard(offset, len),
            Target::Key(t, tag) => t.discard(*tag, offset, len),
        }
    }

    /// [`Volume::flush`].
    pub fn flush(&self) -> Result<(), Error> {
        match &self.0 {
            Target::Volume(v) => v.flush(),
            Target::Key(t, _) => t.flush(),
        }
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        if let Target::Volume(v) = &self.0 {
            v.announced.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Counts a request as in progress while alive.
struct InProgress<'a>(&'a AtomicUsize);

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for Volume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Volume")
            .field("storage", &self.storage.name())
            .field("layout", &self.layout)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl Volume {
    /// Open the data segment of `header` on `storage` with `volume_key` (from
    /// [`Header::unlock`]).
    pub fn open(
        header: &Header,
        storage: Arc<dyn Storage>,
        volume_key: &[u8],
        opts: &VolumeOptions,
    ) -> Result<Self, Error> {
        let layout = Layout::from_header(header, storage.len()?)?;
        Self::with_layout(storage, layout, volume_key, opts)
    }

    /// Open the data at `layout` on `storage` with `key`.
    pub fn with_layout(
        storage: Arc<dyn Storage>,
        layout: Layout,
        key: &[u8],
        opts: &VolumeOptions,
    ) -> Result<Self, Error> {
        let spec = layout.check_fits(&*storage)?;
        let cipher = Some(SectorCipher::new(
            spec,
            key,
            &SectorOptions {
                sector_size: layout.sector_size,
                backend: opts.backend,
                iv_large_sectors: false,
                iv_offset: layout.iv_offset,
                threads: opts.threads.max(1),
                // A volume's callers have other requests to run: workers that spin after a large
                // request would only take a core from them.
                linger: std::time::Duration::ZERO,
            },
        )?);
        Ok(Volume::around(storage, layout, cipher, opts))
    }

    /// The request path over `layout` for a [`kpio::KeyTable`]: no key of its own; each request
    /// runs with the one its tag names (the `*_with` methods).
    pub(crate) fn keyless(
        storage: Arc<dyn Storage>,
        layout: Layout,
        opts: &VolumeOptions,
    ) -> Result<Self, Error> {
        layout.check_fits(&*storage)?;
        Ok(Volume::around(storage, layout, None, opts))
    }

    fn around(
        storage: Arc<dyn Storage>,
        layout: Layout,
        cipher: Option<SectorCipher>,
        opts: &VolumeOptions,
    ) -> Self {
        Volume {
            storage,
            size: AtomicU64::new(layout.size),
            requests: AtomicU64::new(0),
            layout,
            cipher,
            read_only: opts.read_only,
            allow_discards: opts.allow_discards,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            in_progress: AtomicUsize::new(0),
            announced: AtomicUsize::new(0),
            live: RwLock::new(None),
            options: opts.clone(),
            integrity: None,
            rmw: RwLock::new(()),
        }
    }

    /// The routing of a served conversion, held for reading for one request.
    fn route(&self) -> RwLockReadGuard<'_, Option<live::Live>> {
        self.live.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many reads, writes and discards the volume has received.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Payload size in bytes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Expose `bytes` from now on (cryptsetup `resize` of an active device): a positive whole
    /// number of encryption sectors, within the data the storage holds now (a grown file or RBD
    /// image, a larger block device). Requests already past a shrunken end fail as out of range.
    ///
    /// Errors: [`Error::Refused`] for a size that breaks those rules, or while requests are
    /// routed by a conversion (the segments fix the size; serve the volume again afterwards).
    pub fn resize(&self, bytes: u64) -> Result<(), Error> {
        if self.integrity.is_some() {
            return Err(Error::Refused(
                "an integrity volume's size is its dm-integrity superblock's (cryptsetup resizes \
                 none either)"
                    .into(),
            ));
        }
        let routing = self.live.write().unwrap_or_else(PoisonError::into_inner);
        if routing.is_some() {
            return Err(Error::Refused(
                "the volume has been converted while served (its size follows the conversion's \
                 segments); serve it again to resize it"
                    .into(),
            ));
        }
        let sector = self.layout.sector_size as u64;
        let room = self.max_size()?;
        if bytes == 0 || !bytes.is_multiple_of(sector) || bytes > room {
            return Err(Error::Refused(format!(
                "a size of {bytes} bytes: it must be a positive multiple of the {sector}-byte \
                 encryption sector, at most the {room} bytes of data {} holds",
                self.storage.name()
            )));
        }
        self.size.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// The largest size [`Volume::resize`] takes now.
    pub fn max_size(&self) -> Result<u64, Error> {
        let sector = self.layout.sector_size as u64;
        let room = self.storage.len()?.saturating_sub(self.layout.offset);
        Ok(room - room % sector)
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> usize {
        self.layout.sector_size
    }

    /// Where the data is and how it is encrypted.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The storage the encrypted data is on (for measurements that compare the two).
    pub fn storage(&self) -> &dyn Storage {
        &*self.storage
    }

    /// The keyed cipher (for its name, backend and threads).
    pub fn cipher(&self) -> &SectorCipher {
        self.key()
    }

    /// The volume's own key (every volume has one but a key table's shared request path, which
    /// only runs requests that bring theirs).
    fn key(&self) -> &SectorCipher {
        self.cipher
            .as_ref()
            .expect("only a key table's request path has no key, and it is never asked for one")
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether discards reach the storage.
    pub fn allows_discards(&self) -> bool {
        self.allow_discards
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), Error> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                len,
                size: self.size(),
            }),
        }
    }

    fn check_writable(&self) -> Result<(), Error> {
        if self.read_only {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Mark a request in progress until the guard drops.
    fn begin(&self) -> InProgress<'_> {
        self.in_progress.fetch_add(1, Ordering::Relaxed);
        InProgress(&self.in_progress)
    }

    /// Whether a request of `len` bytes should be spread over the cipher's worker threads: it
    /// is large and the only one in progress.
    fn spread(&self, len: usize) -> bool {
        len >= PARALLEL_MIN
            && self.in_progress.load(Ordering::Relaxed) == 1
            && self.announced.load(Ordering::Relaxed) <= 1
    }

    /// Tell the volume that a request has been received and will run (until the returned value
    /// drops): servers that queue requests call this on arrival, so that a large request is not
    /// spread over the cipher threads while others wait for a core.
    pub fn announce(self: &Arc<Self>) -> Announced {
        self.announced.fetch_add(1, Ordering::Relaxed);
        Announced(Target::Volume(Arc::clone(self)))
    }

    /// Read and decrypt whole sectors into `buf`, the first being `sector`.
    fn read_sectors(&self, key: &dyn Key, buf: &mut [u8], sector: u64) -> Result<(), Error> {
        let ss = self.layout.sector_size;
        let at = self.layout.offset + sector * ss as u64;
        let spread = self.spread(buf.len());
        if self.cipher_lent(key, buf, sector, Direction::Decrypt, spread)? {
            return Ok(());
        }
        if spread {
            self.storage.read_at(buf, at)?;
            key.process(buf, sector, Direction::Decrypt)?;
            return Ok(());
        }
        // Inline: decrypt a cache-sized piece at a time, as it arrives, so the cipher finds the
        // data the read just brought in still in cache (and, on network storage, works while
        // the next pieces are on their way).
        self.in_pieces(key, sector, Direction::Decrypt, |work| {
            self.storage.read_pieces(buf, at, CACHE_PIECE, work)
        })
    }

    /// Run the cipher over whole sectors, the first being `sector`, straight between `buf` and
    /// the storage's cache where the storage lends it ([`Storage::read_lent`] to decrypt from,
    /// for reads of at least [`READ_LENT_MIN`] bytes; [`Storage::write_lent`] to encrypt into):
    /// no copy into or out of `buf` to work in place. With `spread`, over the cipher's worker
    /// threads. `Ok(false)` otherwise: a read's `buf` then holds anything, a write's is
    /// unchanged for the write that must follow.
    fn cipher_lent(
        &self,
        key: &dyn Key,
        buf: &mut [u8],
        sector: u64,
        dir: Direction,
        spread: bool,
    ) -> Result<bool, Error> {
        if dir == Direction::Decrypt && buf.len() < READ_LENT_MIN {
            return Ok(false);
        }
        let at = self.layout.offset + sector * self.layout.sector_size as u64;
        let len = buf.len();
        let mut done = Ok(());
        let lent = match dir {
            Direction::Decrypt => self.storage.read_lent(at, len, &mut |src| {
                done = process_from(key, src, buf, sector, dir, spread);
            })?,
            Direction::Encrypt => self.storage.write_lent(at, len, &mut |dst| {
                done = process_from(key, buf, dst, sector, dir, spread);
            })?,
        };
        done?;
        Ok(lent)
    }

    /// Run the cipher over the pieces of a storage call (`call` hands `work` to
    /// `read_pieces` or `write_pieces`), the first piece starting at `sector`. A cipher error (or
    /// a key found gone) travels through the storage call as an I/O error and comes out as
    /// itself.
    fn in_pieces(
        &self,
        key: &dyn Key,
        sector: u64,
        dir: Direction,
        call: impl FnOnce(&mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>) -> io::Result<()>,
    ) -> Result<(), Error> {
        let sectors_per_piece = (CACHE_PIECE / self.layout.sector_size) as u64;
        let mut refused = None;
        let result = call(&mut |i, piece| {
            let first = sector + i as u64 * sectors_per_piece;
            key.process_inline(piece, first, dir).map_err(|e| {
                let carried = io::Error::other(e.to_string());
                refused = Some(e);
                carried
            })
        });
        match (refused, result) {
            (Some(e), _) => Err(e),
            (None, result) => Ok(result?),
        }
    }

    /// Encrypt whole sectors of plaintext in `buf` in place and write them, the first being
    /// `sector`.
    fn write_sectors(&self, key: &dyn Key, buf: &mut [u8], sector: u64) -> Result<(), Error> {
        let ss = self.layout.sector_size;
        let at = self.layout.offset + sector * ss as u64;
        let spread = self.spread(buf.len());
        if self.cipher_lent(key, buf, sector, Direction::Encrypt, spread)? {
            return Ok(());
        }
        if spread {
            key.process(buf, sector, Direction::Encrypt)?;
            self.storage.write_at(buf, at)?;
            return Ok(());
        }
        // Inline: each piece is written while its ciphertext is still in cache.
        self.in_pieces(key, sector, Direction::Encrypt, |work| {
            self.storage.write_pieces(buf, at, CACHE_PIECE, work)
        })
    }

    /// Fill `buf` with the plaintext at `offset`.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        if let Some(device) = &self.integrity {
            return self.integrity_read(device, buf, offset);
        }
        let route = self.route();
        if let Some(live) = route.as_ref() {
            self.check_range(offset, buf.len() as u64)?;
            if buf.is_empty() {
                return Ok(());
            }
            return live.read(buf, offset);
        }
        self.read_with(self.key(), buf, offset)
    }

    /// [`Volume::read`], but only where that waits for nothing (the storage has every sector in
    /// its cache, [`Storage::read_cached`]): `Ok(false)`, `buf` then holding anything and no
    /// request counted, when it would wait or takes another path (integrity, a conversion in
    /// progress, a range that is not whole sectors or not in the volume). Servers answer such a
    /// read on the thread that received it.
    pub fn read_cached(&self, buf: &mut [u8], offset: u64) -> Result<bool, Error> {
        if self.integrity.is_some() {
            return Ok(false);
        }
        // Held to the end, as in `read`: no conversion starts under the read.
        let route = self.route();
        if route.is_some() {
            return Ok(false);
        }
        self.read_cached_with(self.key(), buf, offset)
    }

    /// [`Volume::read_cached`] with `key`, outside any conversion.
    pub(crate) fn read_cached_with(
        &self,
        key: &dyn Key,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<bool, Error> {
        let ss = self.layout.sector_size as u64;
        let len = buf.len() as u64;
        let whole = offset.is_multiple_of(ss) && len.is_multiple_of(ss) && len > 0;
        if !whole || offset.checked_add(len).is_none_or(|end| end > self.size()) {
            return Ok(false);
        }
        let _busy = self.begin();
        let sector = offset / ss;
        let spread = self.spread(buf.len());
        if self.cipher_lent(key, buf, sector, Direction::Decrypt, spread)? {
            self.requests.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        if !self.storage.read_cached(buf, self.layout.offset + offset)? {
            return Ok(false);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        if spread {
            key.process(buf, sector, Direction::Decrypt)?;
        } else {
            key.process_inline(buf, sector, Direction::Decrypt)?;
        }
        Ok(true)
    }

    /// [`Volume::read`] with `key`, outside any conversion.
    pub(crate) fn read_with(
        &self,
        key: &dyn Key,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<(), Error> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let _busy = self.begin();
        self.read_covering(buf, offset, |sectors, first| {
            self.read_sectors(key, sectors, first)
        })
    }

    /// Fill `buf` from `offset` with `read`, which reads whole sectors from a first sector:
    /// straight into `buf` when it is aligned (the common case, one request), else the whole
    /// sector span once, into a buffer of its own.
    pub(crate) fn read_covering(
        &self,
        buf: &mut [u8],
        offset: u64,
        read: impl FnOnce(&mut [u8], u64) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let ss = self.layout.sector_size as u64;
        let len = buf.len() as u64;
        if offset.is_multiple_of(ss) && len.is_multiple_of(ss) {
            return read(buf, offset / ss);
        }
        let first = offset / ss;
        let end = (offset + len).div_ceil(ss);
        let mut span = vec![0u8; ((end - first) * ss) as usize];
        read(&mut span, first)?;
        let skip = (offset - first * ss) as usize;
        buf.copy_from_slice(&span[skip..skip + buf.len()]);
        Ok(())
    }

    /// Write `data` at `offset`.
    pub fn write(&self, data: &[u8], offset: u64) -> Result<(), Error> {
        let mut owned = data.to_vec();
        self.write_in_place(&mut owned, offset)
    }

    /// Write `data` at `offset`, encrypting the aligned part in place: `data` is scrambled
    /// afterwards. Saves a copy for callers that own their buffer (network servers).
    pub fn write_in_place(&self, data: &mut [u8], offset: u64) -> Result<(), Error> {
        if let Some(device) = &self.integrity {
            return self.integrity_write(device, data, offset);
        }
        let route = self.route();
        if let Some(live) = route.as_ref() {
            self.check_writable()?;
            self.check_range(offset, data.len() as u64)?;
            return live.write_in_place(data, offset);
        }
        self.write_in_place_with(self.key(), data, offset)
    }

    /// [`Volume::write_in_place`] with `key`, outside any conversion.
    pub(crate) fn write_in_place_with(
        &self,
        key: &dyn Key,
        data: &mut [u8],
        offset: u64,
    ) -> Result<(), Error> {
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        let _busy = self.begin();
        let ss = self.layout.sector_size;
        let ss64 = ss as u64;
        let mut pos = offset;
        let mut rest = data;
        // Head: from `offset` to the next sector boundary (or all of a short request).
        let head_skip = (pos % ss64) as usize;
        if head_skip != 0 && !rest.is_empty() {
            let n = (ss - head_skip).min(rest.len());
            let (head, body) = rest.split_at_mut(n);
            self.patch_sector(key, pos / ss64, head_skip, head)?;
            pos += n as u64;
            rest = body;
        }
        // Body: whole sectors, one extended request.
        let whole = rest.len() - rest.len() % ss;
        let (body, tail) = rest.split_at_mut(whole);
        if !body.is_empty() {
            self.write_sectors(key, body, pos / ss64)?;
            pos += whole as u64;
        }
        // Tail: the start of the last sector.
        if !tail.is_empty() {
            self.patch_sector(key, pos / ss64, 0, tail)?;
        }
        Ok(())
    }

    /// Read-modify-write: replace `bytes` of sector `sector` from byte `skip`, under the sector's
    /// stripe lock.
    fn patch_sector(
        &self,
        key: &dyn Key,
        sector: u64,
        skip: usize,
        bytes: &[u8],
    ) -> Result<(), Error> {
        let stripe = &self.stripes[(sector % STRIPES as u64) as usize];
        let _guard = stripe.lock().unwrap_or_else(PoisonError::into_inner);
        let mut buf = vec![0u8; self.layout.sector_size];
        self.read_sectors(key, &mut buf, sector)?;
        buf[skip..skip + bytes.len()].copy_from_slice(bytes);
        self.write_sectors(key, &mut buf, sector)
    }

    /// Make `len` bytes at `offset` read back as zeros (by writing encrypted zeros: a hole in
    /// the storage would decrypt to noise).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), Error> {
        self.zeroes(offset, len, &mut |zeros, at| self.write_in_place(zeros, at))
    }

    /// Write zeros over `len` bytes at `offset` with `write`, in pieces.
    pub(crate) fn zeroes(&self, offset: u64, len: u64, write: WriteAt<'_>) -> Result<(), Error> {
        self.check_writable()?;
        self.check_range(offset, len)?;
        let mut zeros = Vec::new();
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(ZERO_CHUNK as u64) as usize;
            // The buffer is scrambled by each in-place write, so it is zeroed again each round.
            zeros.clear();
            zeros.resize(n, 0);
            write(&mut zeros, offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Discard `len` bytes at `offset`: the whole sectors inside the range are released in the
    /// storage (they read back as noise afterwards, as with dm-crypt); partial sectors at the
    /// edges are left as they are, as a block device may. Only with `allow_discards`.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), Error> {
        self.check_writable()?;
        self.check_range(offset, len)?;
        if !self.allow_discards {
            return Err(Error::DiscardsNotAllowed);
        }
        let route = self.route();
        if let Some(live) = route.as_ref() {
            return live.discard(offset, len);
        }
        let ss = self.layout.sector_size as u64;
        let start = offset.div_ceil(ss) * ss;
        let end = (offset + len) / ss * ss;
        if end > start {
            self.storage
                .discard(self.layout.offset + start, end - start)?;
        }
        Ok(())
    }

    /// Make every completed write durable (fdatasync; on a volume with integrity, the writes
    /// waiting in its journal committed first).
    pub fn flush(&self) -> Result<(), Error> {
        if let Some(device) = &self.integrity {
            return device.flush().map_err(Error::Integrity);
        }
        self.storage.sync()?;
        Ok(())
    }
}

impl Volume {
    /// A volume served while a conversion recorded in `header` runs (a clean state: a crashed
    /// step is recovered first, [`reencrypt::recover`]): requests go by the header's segments,
    /// with the keys and over the data of `converting`.
    pub fn open_converting(
        storage: Arc<dyn Storage>,
        header: &sectorcrypt_luks::luks2::Header,
        converting: &reencrypt::Converting,
        opts: &VolumeOptions,
    ) -> Result<Self, Error> {
        let volume = Volume::with_layout(
            Arc::clone(&storage),
            converting.final_layout.clone(),
            converting.new_key.as_deref().unwrap_or_default(),
            opts,
        )?;
        live::Serving::started(
            &volume,
            header,
            converting.old_key.as_deref(),
            converting.new_key.as_deref(),
        )?;
        Ok(volume)
    }
}

impl Volume {
    /// Change the device under the volume while no request is in flight (new ones wait), then
    /// route requests by the conversion `change` recorded: the header it returns, with the old
    /// and new volume keys. For a conversion whose start moves data that requests reach (a
    /// decryption that exports the header first copies the first chunk).
    pub fn reroute_after(
        &self,
        change: impl FnOnce() -> Result<
            (
                sectorcrypt_luks::luks2::Header,
                Option<sectorcrypt_secret::SecretBytes>,
                Option<sectorcrypt_secret::SecretBytes>,
            ),
            Error,
        >,
    ) -> Result<(), Error> {
        let mut routing = self.live.write().unwrap_or_else(PoisonError::into_inner);
        let (header, old_key, new_key) = change()?;
        *routing = Some(live::Live::new(
            Arc::clone(&self.storage),
            self.options.clone(),
            self.size(),
            &header,
            old_key.as_deref(),
            new_key.as_deref(),
        )?);
        Ok(())
    }
}

impl live::Serving for Volume {
    fn started(
        &self,
        header: &sectorcrypt_luks::luks2::Header,
        old_key: Option<&[u8]>,
        new_key: Option<&[u8]>,
    ) -> Result<(), Error> {
        let routed = live::Live::new(
            Arc::clone(&self.storage),
            self.options.clone(),
            self.size(),
            header,
            old_key,
            new_key,
        )?;
        *self.live.write().unwrap_or_else(PoisonError::into_inner) = Some(routed);
        Ok(())
    }

    fn hold(&self, at: u64, len: u64) {
        if let Some(live) = self.route().as_ref() {
            live.hold(at, len);
        }
    }

    fn release(&self, metadata: &sectorcrypt_luks::luks2::metadata::Metadata) -> Result<(), Error> {
        match self.route().as_ref() {
            Some(live) => live.release(metadata),
            None => Ok(()),
        }
    }

    fn failed(&self, why: &Error) {
        if let Some(live) = self.route().as_ref() {
            live.failed(why);
        }
    }

    fn is_live(&self) -> bool {
        true
    }
}

pub mod convert;
pub mod datashift;
mod integrity;
pub mod kpio;
pub mod live;
pub mod reencrypt;
pub mod resilience;

#[cfg(test)]
mod tests;
