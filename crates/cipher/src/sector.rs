//! The data path: a keyed cipher spec for one sector size, encrypting and decrypting *extended
//! requests* — buffers of many whole sectors — in place.
//!
//! Per request (or per batch of [`IV_BATCH`] sectors), following the paper's extended
//! request: the IVs of all sectors are generated, encrypted with the tweak key in **one** ECB call,
//! and the data engine then runs XOR / block cipher / XOR over all sectors in one kernel call that
//! crosses sector boundaries. The result is byte-identical to sector-by-sector dm-crypt.
//!
//! Requests of at least [`PARALLEL_MIN`] bytes are cut into [`PARALLEL_PIECE`]-byte pieces shared by
//! the calling thread and `threads - 1` pool workers: each owns a contiguous range and steals from
//! the others' when done, so the caller never sleeps while workers wake up, a late worker simply
//! finds less to do, and each core keeps working on the same part of a reused buffer.
//! Smaller requests run inline on the caller's thread, with no queue hop. After a large request
//! the workers stay awake for [`WORKER_LINGER`] in case another follows: waking a sleeping thread
//! costs several microseconds on a virtual machine, a tenth of a 1 MiB request.
//!
//! IV numbering follows dm-crypt: the IV of a sector is its offset in **512-byte units** (so with
//! 4096-byte sectors consecutive sectors have IVs 0, 8, 16, ...), as LUKS2 does, unless
//! `iv_large_sectors` is set (dm-crypt's flag of that name), in which case it counts sectors.
//! `iv_offset` is added to every IV (dm-crypt's `iv_offset`, LUKS2's segment `iv_tweak`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::backend::{Algorithm, Backend, BackendChoice};
use crate::engine::{xor_into, Block, BlockEngine, Direction, BLOCK};
use crate::error::Error;
use crate::lmk;
use crate::lrw::Lrw;
use crate::spec::{CipherName, CipherSpec, IvMode, Mode};

/// Sectors whose IVs are generated and encrypted in one batch: 32 KiB of 512-byte sectors, 256 KiB
/// of 4096-byte ones. The IV buffer lives on the stack and is cleared after use, so it is kept small
/// enough (1 KiB) that clearing it never shows next to a 4 KiB request.
pub const IV_BATCH: usize = 64;

/// Requests at least this large are split over the worker threads.
pub const PARALLEL_MIN: usize = 256 * 1024;

/// The unit of work sharing for large requests: small enough that waiting for the last piece is
/// short, large enough (at least 16 sectors) that per-piece set-up does not show.
pub const PARALLEL_PIECE: usize = 64 * 1024;

/// How long a worker spins after a large request, waiting for the next one, before it may sleep.
pub const WORKER_LINGER: Duration = Duration::from_micros(50);

/// Sector sizes dm-crypt and LUKS2 support.
pub const SECTOR_SIZES: [usize; 4] = [512, 1024, 2048, 4096];

/// The one smaller sector a [`SectorCipher`] also takes, with `iv_large_sectors` (its IVs cannot
/// count 512-byte units): the sub-page of small-page NAND, which raw-flash encryption uses as its
/// unit. LUKS2 has no such sector size.
pub const FLASH_SUB_PAGE: usize = 256;

/// How to set up a [`SectorCipher`].
#[derive(Clone, Debug)]
pub struct SectorOptions {
    /// Encryption sector size in bytes: 512, 1024, 2048 or 4096 ([`FLASH_SUB_PAGE`] with
    /// `iv_large_sectors`).
    pub sector_size: usize,
    /// Which backend runs the block cipher.
    pub backend: BackendChoice,
    /// Count IVs in sectors instead of 512-byte units (dm-crypt `iv_large_sectors`).
    pub iv_large_sectors: bool,
    /// Added to every IV (dm-crypt `iv_offset`).
    pub iv_offset: u64,
    /// Worker threads for large requests (1 = everything inline).
    pub threads: usize,
    /// How long a worker spins after a large request waiting for the next one
    /// ([`WORKER_LINGER`] by default). Zero suits callers that keep every core busy with other
    /// work, where the spinning would only take a core from it.
    pub linger: Duration,
}

impl Default for SectorOptions {
    fn default() -> Self {
        SectorOptions {
            sector_size: 512,
            backend: BackendChoice::Auto,
            iv_large_sectors: false,
            iv_offset: 0,
            threads: 1,
            linger: WORKER_LINGER,
        }
    }
}

/// The engines of one key, by mode. `E` is how a block cipher is held: boxed in a
/// [`SectorCipher`], by value in a slot of a key table (no pointer to follow per request).
pub(crate) enum Kind<E> {
    Xts { data: E, tweak: E },
    Cbc { data: E, essiv: Option<E> },
    Ecb { data: E },
    Lrw(Lrw),
    Null,
}

/// A block cipher held in some way ([`Kind`]'s `E`).
pub(crate) trait HeldEngine: Send + Sync {
    fn engine(&self) -> &dyn BlockEngine;
}

impl HeldEngine for Box<dyn BlockEngine> {
    fn engine(&self) -> &dyn BlockEngine {
        &**self
    }
}

/// How [`Kind::new`] makes each block cipher of a key.
pub(crate) type MakeHeld<'a, E> = &'a dyn Fn(Algorithm, &[u8]) -> Result<E, Error>;

/// The engines of one key, borrowed: what a request runs with.
#[derive(Clone, Copy)]
pub(crate) enum Engines<'a> {
    Xts {
        data: &'a dyn BlockEngine,
        tweak: &'a dyn BlockEngine,
    },
    Cbc {
        data: &'a dyn BlockEngine,
        essiv: Option<&'a dyn BlockEngine>,
    },
    Ecb {
        data: &'a dyn BlockEngine,
    },
    Lrw(&'a Lrw),
    Null,
}

impl<E: HeldEngine> Kind<E> {
    /// `spec` keyed with `key` (its length already checked against the spec), each block cipher
    /// made by `make(alg, key)` on the backend `choice` names.
    pub(crate) fn new(
        spec: CipherSpec,
        key: &[u8],
        choice: BackendChoice,
        make: MakeHeld<'_, E>,
    ) -> Result<Self, Error> {
        let CipherName::Block(alg) = spec.cipher else {
            return Ok(Kind::Null);
        };
        Ok(match spec.mode {
            Mode::Xts => {
                let (data, tweak) = key.split_at(key.len() / 2);
                Kind::Xts {
                    data: make(alg, data)?,
                    tweak: make(alg, tweak)?,
                }
            }
            Mode::Cbc => {
                let essiv = match spec.iv {
                    IvMode::Essiv(hash) => Some(make(alg, &hash.digest(key))?),
                    _ => None,
                };
                Kind::Cbc {
                    data: make(alg, key)?,
                    essiv,
                }
            }
            Mode::Ecb => Kind::Ecb {
                data: make(alg, key)?,
            },
            Mode::Lrw => Kind::Lrw(Lrw::new(alg, key, choice)?),
        })
    }

    pub(crate) fn engines(&self) -> Engines<'_> {
        match self {
            Kind::Xts { data, tweak } => Engines::Xts {
                data: data.engine(),
                tweak: tweak.engine(),
            },
            Kind::Cbc { data, essiv } => Engines::Cbc {
                data: data.engine(),
                essiv: essiv.as_ref().map(HeldEngine::engine),
            },
            Kind::Ecb { data } => Engines::Ecb {
                data: data.engine(),
            },
            Kind::Lrw(lrw) => Engines::Lrw(lrw),
            Kind::Null => Engines::Null,
        }
    }
}

/// How sectors map to IVs: what a request needs besides the keys.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub(crate) spec: CipherSpec,
    pub(crate) sector_size: usize,
    /// log2 of 512-byte units per sector for the IV (0 with `iv_large_sectors`).
    pub(crate) iv_shift: u32,
    pub(crate) iv_offset: u64,
}

/// A keyed `cipher-mode-iv` for one sector size: the object a volume encrypts through.
pub struct SectorCipher {
    params: Params,
    key_bits: usize,
    backend: Backend,
    kind: Kind<Box<dyn BlockEngine>>,
    workers: Option<Workers>,
}

/// One piece of a request shared with the worker threads: its source, if it has one elsewhere,
/// and the bytes it fills.
type Piece<'a> = (Option<&'a [u8]>, &'a mut [u8]);

/// A value alone on its cache line (128 bytes: adjacent-line prefetch pairs lines on x86).
#[repr(align(128))]
struct Padded<T>(T);

/// The pieces of one large request, cut into one contiguous range per thread. A thread takes
/// pieces from the front of its own range, then from the back of the others' (work stealing):
/// with threads of equal speed every thread keeps the same part of the buffer request after
/// request, so its cache lines stay in that core's cache; a late thread is helped.
struct Ranges(Vec<Padded<AtomicU64>>);

impl Ranges {
    /// `pieces` split into `threads` ranges; each is `front | back << 32`.
    fn split(pieces: usize, threads: usize) -> Self {
        Ranges(
            (0..threads)
                .map(|t| {
                    let (front, back) = (pieces * t / threads, pieces * (t + 1) / threads);
                    Padded(AtomicU64::new(front as u64 | (back as u64) << 32))
                })
                .collect(),
        )
    }

    /// The next piece for thread `me`, or None when every range is empty.
    fn take(&self, me: usize) -> Option<usize> {
        let n = self.0.len();
        (0..n).find_map(|k| {
            let own = k == 0;
            let range = &self.0[(me + k) % n].0;
            let mut v = range.load(Ordering::Relaxed);
            loop {
                let (front, back) = (v & 0xffff_ffff, v >> 32);
                if front >= back {
                    return None;
                }
                let (new, piece) = if own {
                    (v + 1, front)
                } else {
                    (v - (1 << 32), back - 1)
                };
                match range.compare_exchange_weak(v, new, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Some(piece as usize),
                    Err(current) => v = current,
                }
            }
        })
    }
}

/// The helper threads of large requests.
struct Workers {
    pool: rayon::ThreadPool,
    /// Bumped at the start of every large request; a lingering worker stops spinning when it moves.
    generation: Arc<AtomicU64>,
    /// How long workers spin after a large request.
    linger: Duration,
}

impl SectorCipher {
    /// Key `spec` with `key` (the whole key; for XTS both halves, data key first).
    pub fn new(spec: CipherSpec, key: &[u8], opts: &SectorOptions) -> Result<Self, Error> {
        let flash_unit = opts.sector_size == FLASH_SUB_PAGE && opts.iv_large_sectors;
        if !SECTOR_SIZES.contains(&opts.sector_size) && !flash_unit {
            return Err(Error::SectorSize(opts.sector_size));
        }
        spec.check_key_len(key.len())?;
        if spec.iv == IvMode::Lmk && opts.sector_size != lmk::LMK_SECTOR {
            return Err(Error::IvSectorSize {
                spec: spec.to_string(),
                sector_size: opts.sector_size,
                required: lmk::LMK_SECTOR,
            });
        }
        let backend = match spec.cipher {
            CipherName::Null => Backend::Null,
            CipherName::Block(alg) => opts.backend.resolve(alg)?,
        };
        let choice = BackendChoice::Exact(backend);
        let kind = Kind::new(spec, key, choice, &|alg, k| {
            crate::block_cipher(alg, k, choice)
        })?;
        let workers = if opts.threads > 1 && !matches!(kind, Kind::Null) {
            Some(Workers {
                // The calling thread is one of the `threads`.
                pool: rayon::ThreadPoolBuilder::new()
                    .num_threads(opts.threads - 1)
                    .thread_name(|i| format!("sectorcrypt-cipher-{i}"))
                    .build()
                    .map_err(|_| Error::ThreadPool)?,
                generation: Arc::new(AtomicU64::new(0)),
                linger: opts.linger,
            })
        } else {
            None
        };
        Ok(SectorCipher {
            params: Params::new(spec, opts),
            key_bits: key.len() * 8,
            backend,
            kind,
            workers,
        })
    }

    /// The cipher specification.
    pub fn spec(&self) -> CipherSpec {
        self.params.spec
    }

    /// The whole key size in bits.
    pub fn key_bits(&self) -> usize {
        self.key_bits
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> usize {
        self.params.sector_size
    }

    /// The backend running the block cipher.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Worker threads used for large requests.
    pub fn threads(&self) -> usize {
        self.workers
            .as_ref()
            .map_or(1, |w| w.pool.current_num_threads() + 1)
    }

    /// Encrypt `buf` (whole sectors) in place; `first_sector` is the index of its first sector
    /// (in units of the sector size).
    pub fn encrypt(&self, buf: &mut [u8], first_sector: u64) -> Result<(), Error> {
        self.process(buf, first_sector, Direction::Encrypt)
    }

    /// Decrypt `buf` (whole sectors) in place.
    pub fn decrypt(&self, buf: &mut [u8], first_sector: u64) -> Result<(), Error> {
        self.process(buf, first_sector, Direction::Decrypt)
    }

    /// Like [`process`](Self::process), but all on the calling thread whatever the size: for
    /// callers whose other requests already keep every core busy, where handing pieces to the
    /// worker threads would only add hand-off and waiting.
    pub fn process_inline(
        &self,
        buf: &mut [u8],
        first_sector: u64,
        dir: Direction,
    ) -> Result<(), Error> {
        if self.check(buf, first_sector)? {
            self.run(None, buf, first_sector, dir);
        }
        Ok(())
    }

    /// Encrypt or decrypt whole sectors from `src` into `dst` (of equal lengths), on the calling
    /// thread: for ciphertext the storage lends without a copy (a mapped page cache), which
    /// XTS decryption reads once, and for plaintext encrypted straight into such a mapping.
    /// `dst` only ever receives the result (encrypting, only ciphertext: others may read the
    /// page cache, and the kernel may write it back, at any moment); `src` is not changed.
    pub fn process_from_inline(
        &self,
        src: &[u8],
        dst: &mut [u8],
        first_sector: u64,
        dir: Direction,
    ) -> Result<(), Error> {
        if self.params.check_from(src, dst, first_sector)? {
            self.run(Some(src), dst, first_sector, dir);
        }
        Ok(())
    }

    /// [`process_from_inline`](Self::process_from_inline), shared with the worker threads from
    /// [`PARALLEL_MIN`] bytes as [`process`](Self::process) is.
    pub fn process_from(
        &self,
        src: &[u8],
        dst: &mut [u8],
        first_sector: u64,
        dir: Direction,
    ) -> Result<(), Error> {
        if self.params.check_from(src, dst, first_sector)? {
            self.shared(Some(src), dst, first_sector, dir);
        }
        Ok(())
    }

    /// Encrypt or decrypt `buf` in place; requests of at least [`PARALLEL_MIN`] bytes are shared
    /// with the worker threads.
    pub fn process(&self, buf: &mut [u8], first_sector: u64, dir: Direction) -> Result<(), Error> {
        if self.check(buf, first_sector)? {
            self.shared(None, buf, first_sector, dir);
        }
        Ok(())
    }

    /// Run a checked request from `src` (or in place) on this thread and, from [`PARALLEL_MIN`]
    /// bytes, the worker threads.
    fn shared(&self, src: Option<&[u8]>, buf: &mut [u8], first_sector: u64, dir: Direction) {
        let ss = self.params.sector_size;
        match &self.workers {
            Some(workers) if buf.len() >= PARALLEL_MIN => {
                let pool = &workers.pool;
                // Every shared slot on its own cache line: the threads would otherwise bounce
                // lines between cores on each piece.
                let mut sources = src.map(|s| s.chunks(PARALLEL_PIECE));
                let pieces: Vec<Padded<Mutex<Piece<'_>>>> = buf
                    .chunks_mut(PARALLEL_PIECE)
                    .map(|p| Padded(Mutex::new((sources.as_mut().and_then(Iterator::next), p))))
                    .collect();
                let threads = pool.current_num_threads() + 1;
                let ranges = Ranges::split(pieces.len(), threads);
                let done = Padded(AtomicUsize::new(0));
                // Returns how many pieces this thread did.
                let drain = |me: usize| {
                    let mut mine = 0;
                    while let Some(i) = ranges.take(me) {
                        // Each piece is taken exactly once, so the lock is never contended; it
                        // only proves to the compiler that no two threads share a piece.
                        let mut piece = pieces[i].0.lock().unwrap_or_else(PoisonError::into_inner);
                        let (from, to) = &mut *piece;
                        let first = first_sector + (i * PARALLEL_PIECE / ss) as u64;
                        self.run(*from, to, first, dir);
                        mine += 1;
                    }
                    mine
                };
                pool.in_place_scope(|scope| {
                    for me in 1..threads {
                        let (drain, done) = (&drain, &done);
                        scope.spawn(move |_| {
                            let mine = drain(me);
                            // Queued on this worker's own deque, so it runs as soon as this job
                            // returns, without a trip through the pool's idle loop.
                            if !workers.linger.is_zero() {
                                let latest = Arc::clone(&workers.generation);
                                let seen = latest.load(Ordering::Relaxed);
                                let time = workers.linger;
                                rayon::spawn(move || linger(&latest, seen, time));
                            }
                            // Last: once the caller sees every piece done it joins the scope, and
                            // the job must have returned by then or the caller sleeps.
                            done.0.fetch_add(mine, Ordering::Release);
                        });
                    }
                    // Only now release the lingering workers: they go straight from spinning to
                    // the pieces just queued.
                    workers.generation.fetch_add(1, Ordering::Relaxed);
                    done.0.fetch_add(drain(0), Ordering::Release);
                    // The pieces still running elsewhere take at most one piece's time: spin
                    // rather than sleep in the scope's join, since a sleep and wake-up costs more
                    // than a piece on a virtual machine.
                    while done.0.load(Ordering::Acquire) < pieces.len() {
                        std::hint::spin_loop();
                    }
                });
            }
            _ => self.run(src, buf, first_sector, dir),
        }
    }

    /// The IV input block of sector `sector` (before ESSIV or EBOIV encryption; zero for `lmk`,
    /// whose IV depends on the data).
    pub fn iv_block(&self, sector: u64) -> Block {
        self.params.iv_block(sector)
    }

    fn check(&self, buf: &[u8], first_sector: u64) -> Result<bool, Error> {
        self.params.check(buf, first_sector)
    }

    fn run(&self, src: Option<&[u8]>, buf: &mut [u8], first_sector: u64, dir: Direction) {
        self.params
            .run_from(self.kind.engines(), src, buf, first_sector, dir);
    }
}

impl Params {
    pub(crate) fn new(spec: CipherSpec, opts: &SectorOptions) -> Params {
        Params {
            spec,
            sector_size: opts.sector_size,
            iv_shift: if opts.iv_large_sectors {
                0
            } else {
                (opts.sector_size / 512).trailing_zeros()
            },
            iv_offset: opts.iv_offset,
        }
    }

    /// Check that `buf` is whole sectors whose IVs do not overflow; `false` if it is empty.
    pub(crate) fn check(&self, buf: &[u8], first_sector: u64) -> Result<bool, Error> {
        let ss = self.sector_size;
        if !buf.len().is_multiple_of(ss) {
            return Err(Error::NotWholeSectors {
                len: buf.len(),
                sector_size: ss,
            });
        }
        if buf.is_empty() {
            return Ok(false);
        }
        // Validate the IV arithmetic of the last sector once; the per-sector code can then use
        // plain arithmetic.
        let last = first_sector
            .checked_add((buf.len() / ss) as u64 - 1)
            .ok_or(Error::SectorOverflow)?;
        last.checked_mul(1u64 << self.iv_shift)
            .and_then(|v| v.checked_add(self.iv_offset))
            .ok_or(Error::SectorOverflow)?;
        Ok(true)
    }

    /// [`Params::check`] for `dst`, decrypted from `src` of the same length.
    pub(crate) fn check_from(
        &self,
        src: &[u8],
        dst: &[u8],
        first_sector: u64,
    ) -> Result<bool, Error> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        self.check(dst, first_sector)
    }

    /// dm-crypt's IV sector number of sector `sector`: in 512-byte units unless the IVs count
    /// large sectors, plus the IV offset.
    fn iv_sector(&self, sector: u64) -> u64 {
        (sector << self.iv_shift) + self.iv_offset
    }

    /// The IV input blocks of the sectors from `first` on, as [`iv_block`](Self::iv_block) makes
    /// them, with the IV mode looked at once per batch rather than once per sector.
    fn fill_iv_blocks(&self, ivs: &mut [Block], first: u64) {
        match self.spec.iv {
            IvMode::Plain64 | IvMode::Essiv(_) => {
                let step = 1u64 << self.iv_shift;
                let mut n = self.iv_sector(first);
                for iv in ivs {
                    *iv = [0; BLOCK];
                    iv[..8].copy_from_slice(&n.to_le_bytes());
                    n = n.wrapping_add(step);
                }
            }
            _ => {
                for (k, iv) in ivs.iter_mut().enumerate() {
                    *iv = self.iv_block(first + k as u64);
                }
            }
        }
    }

    /// The IV input block of sector `sector` (before ESSIV or EBOIV encryption; zero for `lmk`,
    /// whose IV depends on the data).
    pub(crate) fn iv_block(&self, sector: u64) -> Block {
        let n = self.iv_sector(sector);
        let mut iv = [0u8; BLOCK];
        match self.spec.iv {
            IvMode::Plain => iv[..4].copy_from_slice(&(n as u32).to_le_bytes()),
            IvMode::Plain64 | IvMode::Essiv(_) => iv[..8].copy_from_slice(&n.to_le_bytes()),
            IvMode::Plain64Be => iv[8..].copy_from_slice(&n.to_be_bytes()),
            // dm-crypt: ((iv_sector << (9 - log2(block size))) + 1), big endian; the shift drops
            // bits of IVs above 2^59, as the kernel's does.
            IvMode::Benbi => iv[8..].copy_from_slice(&((n << 5).wrapping_add(1)).to_be_bytes()),
            // The kernel multiplies the IV sector (in 512-byte units unless the IVs count large
            // sectors) by the sector size, in 64 bits.
            IvMode::Eboiv => {
                let offset = n.wrapping_mul(self.sector_size as u64);
                iv[..8].copy_from_slice(&offset.to_le_bytes());
            }
            IvMode::Null | IvMode::Lmk | IvMode::None => {}
        }
        iv
    }

    /// One inline extended request, from `src` (`buf`'s length) into `buf`, or in place without
    /// one: whole sectors, IV arithmetic already validated. Its keyed calls (tweaks and data,
    /// batch after batch) end in one wipe.
    pub(crate) fn run_from(
        &self,
        engines: Engines<'_>,
        src: Option<&[u8]>,
        buf: &mut [u8],
        first_sector: u64,
        dir: Direction,
    ) {
        // The modes other than XTS encrypt from a source in a copy of their own, so that no
        // plaintext ever lands in a destination others can see (cipher_null's plaintext is its
        // ciphertext). The copy is made here, above the wipe's frame: made inside, it added a
        // frame to the calls' depth, and AES-CBC on `vaes512` then left bytes deeper than its
        // wipe reaches.
        let in_place = matches!(
            engines,
            Engines::Ecb { .. } | Engines::Lrw(_) | Engines::Cbc { .. }
        );
        // The IV batch too: 1 KiB that the stack wipe need not cover, which it would below its
        // frame (and, as key-derived material, it is cleared on its own).
        let mut ivs = IvBatch::new();
        if let (true, Direction::Encrypt, Some(src)) = (in_place, dir, src) {
            let mut own = src.to_vec();
            crate::wipe::once(|| {
                self.run_batches(engines, None, &mut own, first_sector, dir, &mut ivs);
            });
            buf.copy_from_slice(&own);
            return;
        }
        crate::wipe::once(|| self.run_batches(engines, src, buf, first_sector, dir, &mut ivs));
    }

    fn run_batches(
        &self,
        engines: Engines<'_>,
        src: Option<&[u8]>,
        buf: &mut [u8],
        first_sector: u64,
        dir: Direction,
        ivs: &mut IvBatch,
    ) {
        let ss = self.sector_size;
        // XTS reads its input from elsewhere. The other modes run in place: decrypting, in `buf`
        // after a copy (encrypting, `run_from` gave them a copy of their own).
        let src = match (engines, src) {
            (Engines::Xts { .. }, src) => src,
            (_, Some(src)) => {
                buf.copy_from_slice(src);
                None
            }
            (_, None) => None,
        };
        let (data, iv_cipher) = match engines {
            Engines::Null => return,
            Engines::Ecb { data } => {
                match dir {
                    Direction::Encrypt => data.encrypt_ecb(buf),
                    Direction::Decrypt => data.decrypt_ecb(buf),
                }
                return;
            }
            Engines::Lrw(lrw) => {
                for (i, unit) in buf.chunks_exact_mut(ss).enumerate() {
                    // Sector sizes are whole blocks of at most 4096 bytes: cannot fail.
                    let _ = lrw.unit(unit, &self.iv_block(first_sector + i as u64), dir);
                }
                return;
            }
            Engines::Xts { data, tweak } => (data, Some(tweak)),
            // EBOIV encrypts the IV block with the data key itself.
            Engines::Cbc { data, essiv } => (
                data,
                essiv.or((self.spec.iv == IvMode::Eboiv).then_some(data)),
            ),
        };
        // The first piece uses the most entries.
        ivs.used = (buf.len() / ss).min(IV_BATCH);
        let ivs = &mut ivs.blocks;
        for (i, piece) in buf.chunks_mut(IV_BATCH * ss).enumerate() {
            let n = piece.len() / ss;
            let first = first_sector + (i * IV_BATCH) as u64;
            self.fill_iv_blocks(&mut ivs[..n], first);
            // All IVs of the piece through the tweak (or ESSIV) cipher in one call.
            if let Some(ivc) = iv_cipher {
                ivc.encrypt_ecb(ivs[..n].as_flattened_mut());
            }
            let lmk = self.spec.iv == IvMode::Lmk;
            if lmk && dir == Direction::Encrypt {
                for (k, (iv, sector)) in ivs.iter_mut().zip(piece.chunks_exact(ss)).enumerate() {
                    *iv = lmk::iv(sector, self.iv_sector(first + k as u64));
                }
            }
            match (engines, dir) {
                (Engines::Xts { .. }, dir) => {
                    let from = src.map(|s| &s[i * IV_BATCH * ss..][..piece.len()]);
                    match (dir, from) {
                        (Direction::Encrypt, None) => data.xts_encrypt_units(piece, ss, &ivs[..n]),
                        (Direction::Decrypt, None) => data.xts_decrypt_units(piece, ss, &ivs[..n]),
                        (dir, Some(from)) => data.xts_units_from(from, piece, ss, &ivs[..n], dir),
                    }
                }
                (_, Direction::Encrypt) => data.cbc_encrypt_units(piece, ss, &ivs[..n]),
                (_, Direction::Decrypt) => data.cbc_decrypt_units(piece, ss, &ivs[..n]),
            }
            // Decrypted from a zero IV: block 0 still lacks the IV, which its blocks 1 to 31
            // now give.
            if lmk && dir == Direction::Decrypt {
                for (k, sector) in piece.chunks_exact_mut(ss).enumerate() {
                    let iv = lmk::iv(sector, self.iv_sector(first + k as u64));
                    xor_into(&mut sector[..BLOCK], &iv);
                }
            }
        }
    }
}

/// The IV blocks of one batch of sectors. Encrypted, they are key-derived material: the entries
/// a request used are cleared when it drops (also after a panic), and only those (a one-sector
/// request would otherwise clear 1 KiB).
struct IvBatch {
    blocks: [Block; IV_BATCH],
    used: usize,
}

impl IvBatch {
    fn new() -> IvBatch {
        IvBatch {
            blocks: [[0; BLOCK]; IV_BATCH],
            used: 0,
        }
    }
}

impl Drop for IvBatch {
    fn drop(&mut self) {
        crate::wipe::zero(self.blocks[..self.used].as_flattened_mut());
    }
}

/// Spin until another large request starts or `time` has passed, so that a request
/// following soon finds the worker awake.
fn linger(latest: &AtomicU64, seen: u64, time: Duration) {
    let start = Instant::now();
    // `pause` takes ~140 cycles on recent x86 cores: look at the generation after every one, and
    // at the clock only now and then.
    'spin: loop {
        for _ in 0..64 {
            if latest.load(Ordering::Relaxed) != seen {
                break 'spin;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= time {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in block cipher that records every buffer it is asked to work on in place (a
    /// bitwise NOT stands in for the cipher).
    #[derive(Default)]
    struct InPlace(Mutex<Vec<std::ops::Range<usize>>>);

    impl InPlace {
        fn record(&self, buf: &mut [u8]) {
            let at = buf.as_ptr() as usize;
            self.0.lock().unwrap().push(at..at + buf.len());
            buf.iter_mut().for_each(|b| *b = !*b);
        }
    }

    impl BlockEngine for InPlace {
        fn backend(&self) -> Backend {
            Backend::Portable
        }
        fn encrypt_ecb(&self, buf: &mut [u8]) {
            self.record(buf);
        }
        fn decrypt_ecb(&self, buf: &mut [u8]) {
            self.record(buf);
        }
        fn xts_encrypt_units(&self, buf: &mut [u8], _: usize, _: &[Block]) {
            self.record(buf);
        }
        fn cbc_encrypt_units(&self, buf: &mut [u8], _: usize, _: &[Block]) {
            self.record(buf);
        }
    }

    /// Encrypting from a source, no mode runs the cipher in place in the destination (which
    /// would put plaintext there for a moment: the page cache, which others may read), while
    /// encrypting in place does run there.
    #[test]
    fn encrypting_from_a_source_never_works_in_the_destination() {
        let engine = InPlace::default();
        let src = vec![0x5au8; 8 * 512];
        for (spec, engines) in [
            (
                "aes-xts-plain64",
                Engines::Xts {
                    data: &engine,
                    tweak: &engine,
                },
            ),
            (
                "aes-cbc-plain64",
                Engines::Cbc {
                    data: &engine,
                    essiv: None,
                },
            ),
            ("aes-ecb", Engines::Ecb { data: &engine }),
        ] {
            let params = Params::new(CipherSpec::parse(spec).unwrap(), &SectorOptions::default());
            let mut dst = vec![0u8; src.len()];
            let inside = dst.as_ptr() as usize..dst.as_ptr() as usize + dst.len();
            let touches = |r: &std::ops::Range<usize>| r.start < inside.end && inside.start < r.end;
            params.run_from(engines, Some(&src), &mut dst, 3, Direction::Encrypt);
            assert!(
                dst != src && dst != vec![0u8; src.len()],
                "{spec}: nothing encrypted"
            );
            let calls = std::mem::take(&mut *engine.0.lock().unwrap());
            assert!(!calls.is_empty(), "{spec}: no cipher call");
            assert!(
                !calls.iter().any(touches),
                "{spec}: worked in the destination"
            );
            params.run_from(engines, None, &mut dst, 3, Direction::Encrypt);
            let calls = std::mem::take(&mut *engine.0.lock().unwrap());
            assert!(
                calls.iter().any(touches),
                "{spec}: in place, yet not in the buffer"
            );
        }
    }

    /// Every keyed call's writes to the stack stay within the wipe after it: each request shape
    /// (sector sizes, one sector to many, in place and from a source, both directions) of each
    /// cipher in XTS and of each other mode and keyed IV, on each backend this CPU runs, and
    /// their key set-up, measured on a painted stack (`wipe::reach`). It also prints how deep each
    /// reached, the numbers each engine's `stack_bytes` comes from.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_keyed_call_stays_within_the_stack_its_wipe_clears() {
        use crate::wipe::reach::{assert_holds_none_of, deepest_within, measure_leaving};
        use crate::wipe::residue::assert_left_none;
        let backends = [
            Backend::Portable,
            Backend::AesNi,
            Backend::Vaes256,
            Backend::Vaes512,
            Backend::Avx2,
            Backend::Avx512,
        ];
        // Every cipher in XTS, and every other mode and keyed IV: LRW's tweaks and CBC's
        // chaining take frames of their own (AES-LRW overran its wipe until this list had it).
        let specs = [
            ("aes-xts-plain64", 64),
            ("aes-xts-plain64", 32),
            ("lea-xts-plain64", 64),
            ("serpent-xts-plain64", 64),
            ("twofish-xts-plain64", 64),
            ("camellia-xts-plain64", 64),
            ("aria-xts-plain64", 64),
            ("sm4-xts-plain64", 32),
            ("cast6-xts-plain64", 64),
            ("aes-cbc-essiv:sha256", 32),
            ("aes-cbc-eboiv", 32),
            ("aes-cbc-lmk", 32),
            ("lea-cbc-essiv:sha256", 32),
            ("twofish-cbc-essiv:sha256", 32),
            ("aes-ecb", 32),
            ("aes-lrw-benbi", 48),
            ("serpent-lrw-benbi", 48),
            ("twofish-lrw-benbi", 48),
        ];
        let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5c).collect();
        let src: Vec<u8> = (0..256 * 1024u32)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let mut checked = 0;
        for (spec, key_len) in specs {
            for backend in backends.into_iter().filter(|b| b.is_available()) {
                for sector_size in [512, 4096] {
                    let opts = SectorOptions {
                        sector_size,
                        backend: BackendChoice::Exact(backend),
                        threads: 1,
                        ..SectorOptions::default()
                    };
                    let mut cipher = None;
                    let (set_up, left) = measure_leaving(|| {
                        cipher =
                            SectorCipher::new(spec.parse().unwrap(), &key[..key_len], &opts).ok();
                    });
                    let Some(cipher) = cipher else {
                        continue; // a backend without this cipher
                    };
                    let what = format!(
                        "{spec} ({key_len}-byte key) on {backend}, {sector_size}-byte sectors"
                    );
                    let mut deepest = deepest_within(&set_up, &format!("{what}, key set-up"));
                    let key = &key[..key_len];
                    assert_left_none(&*left, spec, key, &format!("{what}, key set-up"));
                    // AES-XTS's first encrypted tweak, which the IV batch held: as key-derived
                    // as the key, and cleared with the batch, above the wipe's reach.
                    let tweak = spec.starts_with("aes-xts").then(|| {
                        let mut t = Params::new(spec.parse().unwrap(), &opts).iv_block(3);
                        crate::block_cipher(Algorithm::Aes, &key[key_len / 2..], opts.backend)
                            .unwrap()
                            .encrypt_ecb(&mut t);
                        t
                    });
                    let assert_left_none = |left: &[u8], case: &str| {
                        assert_left_none(left, spec, key, case);
                        if let Some(tweak) = &tweak {
                            assert_holds_none_of(left, tweak, &format!("{case} (a tweak)"));
                        }
                    };
                    for len in [sector_size, 4096, 64 * 1024, 256 * 1024] {
                        for dir in [Direction::Encrypt, Direction::Decrypt] {
                            let mut buf = src[..len].to_vec();
                            let (wipes, left) =
                                measure_leaving(|| cipher.process(&mut buf, 3, dir).unwrap());
                            let case = format!("{what}, {len}-byte request in place, {dir:?}");
                            deepest = deepest.max(deepest_within(&wipes, &case));
                            assert_left_none(&*left, &case);
                            let (wipes, left) = measure_leaving(|| {
                                cipher.process_from(&src[..len], &mut buf, 3, dir).unwrap();
                            });
                            let case = format!("{what}, {len}-byte request from a source, {dir:?}");
                            deepest = deepest.max(deepest_within(&wipes, &case));
                            assert_left_none(&*left, &case);
                        }
                    }
                    eprintln!("{what}: deepest {deepest} bytes");
                    checked += 1;
                }
            }
        }
        assert!(checked >= 10, "only {checked} ciphers checked");
    }

    /// The batch fill is the per-sector IV, for every IV mode, sector size and offset, up to the
    /// last sector whose IV fits in 64 bits.
    #[test]
    fn iv_blocks_filled_per_batch_are_each_sectors_iv() {
        let specs = [
            "aes-xts-plain64",
            "aes-xts-plain",
            "aes-xts-plain64be",
            "aes-cbc-essiv:sha256",
            "aes-cbc-eboiv",
            "aes-cbc-benbi",
            "aes-cbc-null",
        ];
        for spec in specs {
            for (sector_size, iv_large_sectors) in [(512, false), (4096, false), (4096, true)] {
                for iv_offset in [0, 7, u64::MAX - (IV_BATCH as u64) * 8] {
                    let opts = SectorOptions {
                        sector_size,
                        iv_large_sectors,
                        iv_offset,
                        ..SectorOptions::default()
                    };
                    let params = Params::new(spec.parse().unwrap(), &opts);
                    for first in [0u64, 1, 0xffff_fffe, 1 << 12] {
                        let request = vec![0; IV_BATCH * sector_size];
                        if params.check(&request, first).is_err() {
                            continue; // past the last IV: refused before any fill
                        }
                        let mut ivs = [[0xa5; BLOCK]; IV_BATCH];
                        params.fill_iv_blocks(&mut ivs, first);
                        for (k, iv) in ivs.iter().enumerate() {
                            assert_eq!(
                                *iv,
                                params.iv_block(first + k as u64),
                                "{spec}, {sector_size}-byte sectors, offset {iv_offset}, \
                                 sector {}",
                                first + k as u64
                            );
                        }
                    }
                }
            }
        }
    }
}
