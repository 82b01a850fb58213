//! Many keys of one cipher specification under 32-bit tags, for Key Per I/O: a table whose every
//! key's engines sit by value in the slot of secret memory its tag indexes ([`SecretTable`]), so
//! a request under one of 65,536 keys finds its round keys with one fetch of adjacent cache lines,
//! not a chain of pointers through boxes and pages of their own as a [`crate::SectorCipher`] per
//! key would.
//!
//! AES, the cipher of Key Per I/O, keeps its engines by value; other ciphers keep boxed engines
//! in the slot (the table works, without the flat layout's gain).

use std::time::Duration;

use sectorcrypt_secret::{InsertError, SecretTable};

use crate::backend::{Algorithm, Backend, BackendChoice};
use crate::engine::{Block, BlockEngine, Direction};
use crate::error::Error;
use crate::sector::{Engines, HeldEngine, Kind, Params, SectorOptions};
use crate::spec::{CipherName, CipherSpec};

/// Why [`SectorKeys::load`] loaded nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// A key is loaded under the tag already.
    Exists,
    /// The key evicted from the tag is still used by running requests.
    InUse,
    /// The tag is not below the table's capacity.
    OutOfRange,
    /// The key does not fit the cipher.
    Cipher(Error),
}

/// Keys of one specification and sector layout under tags; see the module docs.
pub struct SectorKeys {
    params: Params,
    backend: Backend,
    slots: Box<dyn Slots>,
}

impl std::fmt::Debug for SectorKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SectorKeys")
            .field("spec", &self.params.spec.to_string())
            .field("backend", &self.backend)
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

/// One key of a [`SectorKeys`], for the length of a request.
pub struct SectorKey<'a> {
    params: &'a Params,
    engines: Engines<'a>,
}

impl SectorKey<'_> {
    /// Encrypt or decrypt whole sectors in place, on the calling thread (as
    /// [`crate::SectorCipher::process_inline`]).
    pub fn process(&self, buf: &mut [u8], first_sector: u64, dir: Direction) -> Result<(), Error> {
        if self.params.check(buf, first_sector)? {
            self.params
                .run_from(self.engines, None, buf, first_sector, dir);
        }
        Ok(())
    }

    /// Encrypt or decrypt whole sectors from `src` into `dst` (as
    /// [`crate::SectorCipher::process_from_inline`]).
    pub fn process_from(
        &self,
        src: &[u8],
        dst: &mut [u8],
        first_sector: u64,
        dir: Direction,
    ) -> Result<(), Error> {
        if self.params.check_from(src, dst, first_sector)? {
            self.params
                .run_from(self.engines, Some(src), dst, first_sector, dir);
        }
        Ok(())
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> usize {
        self.params.sector_size
    }
}

impl SectorKeys {
    /// A table for keys of `spec` under tags `0..capacity`, with the sector layout of `opts`
    /// (`opts.threads` is ignored: requests run on their callers' threads).
    pub fn new(spec: CipherSpec, opts: &SectorOptions, capacity: usize) -> Result<Self, Error> {
        // The checks a SectorCipher makes, on a key of the right length.
        let probe = vec![0u8; spec.default_key_bits() / 8];
        crate::SectorCipher::new(spec, &probe, opts)?;
        let backend = match spec.cipher {
            CipherName::Null => Backend::Null,
            CipherName::Block(alg) => opts.backend.resolve(alg)?,
        };
        let slots = match spec.cipher {
            CipherName::Block(Algorithm::Aes) => crate::aes::slots(backend, capacity),
            _ => None,
        }
        .unwrap_or_else(|| Box::new(Typed::<Box<dyn BlockEngine>>::new(capacity, boxed)));
        Ok(SectorKeys {
            params: Params::new(spec, opts),
            backend,
            slots,
        })
    }

    /// Load `key` under `tag`.
    pub fn load(&self, tag: u32, key: &[u8]) -> Result<(), LoadError> {
        self.params
            .spec
            .check_key_len(key.len())
            .map_err(LoadError::Cipher)?;
        self.slots.load(tag, self.params.spec, key, self.backend)
    }

    /// Run `f` with the key under `tag` (kept while `f` runs, even if evicted meanwhile); `None`
    /// if no key is loaded under it. The key's round keys are prefetched first.
    pub fn with_key<R>(&self, tag: u32, f: impl FnOnce(&SectorKey<'_>) -> R) -> Option<R> {
        let mut f = Some(f);
        let mut out = None;
        let params = &self.params;
        let found = self.slots.with(tag, &mut |engines| {
            if let Some(f) = f.take() {
                out = Some(f(&SectorKey { params, engines }));
            }
        });
        found.then_some(()).and(out)
    }

    /// Start fetching the key under `tag` into the cache, for a [`SectorKeys::with_key`] after
    /// other work (a read's storage read): a table far larger than the caches then costs one
    /// miss that overlaps the work, not one before it.
    pub fn prefetch(&self, tag: u32) {
        self.slots.prefetch(tag)
    }

    /// Take the key under `tag` out (zeroized when the requests using it end).
    pub fn evict(&self, tag: u32) -> bool {
        self.slots.evict(tag)
    }

    /// Evict and wait up to `wait` for the key to be zeroized: `Ok(false)` if none was loaded,
    /// `Err(())` if requests still use it then.
    #[allow(clippy::result_unit_err)]
    pub fn destroy(&self, tag: u32, wait: Duration) -> Result<bool, ()> {
        self.slots.destroy(tag, wait)
    }

    /// Whether a key is loaded under `tag`.
    pub fn contains(&self, tag: u32) -> bool {
        self.slots.contains(tag)
    }

    /// The tags loaded, ascending.
    pub fn tags(&self) -> Vec<u32> {
        self.slots.tags()
    }

    /// Keys loaded.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no key is loaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys the table holds at most.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// The backend running the block cipher.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> usize {
        self.params.sector_size
    }

    /// The IV input block of `sector` (as [`crate::SectorCipher::iv_block`]).
    pub fn iv_block(&self, sector: u64) -> Block {
        self.params.iv_block(sector)
    }
}

/// A table of [`Kind`]s of one engine type, behind one interface.
pub(crate) trait Slots: Send + Sync {
    fn load(
        &self,
        tag: u32,
        spec: CipherSpec,
        key: &[u8],
        backend: Backend,
    ) -> Result<(), LoadError>;
    fn with(&self, tag: u32, f: &mut dyn FnMut(Engines<'_>)) -> bool;
    fn prefetch(&self, tag: u32);
    fn evict(&self, tag: u32) -> bool;
    fn destroy(&self, tag: u32, wait: Duration) -> Result<bool, ()>;
    fn contains(&self, tag: u32) -> bool;
    fn tags(&self) -> Vec<u32>;
    fn len(&self) -> usize;
    fn capacity(&self) -> usize;
}

/// How a slot's block cipher is made.
pub(crate) type MakeEngine<E> = fn(Algorithm, &[u8], Backend) -> Result<E, Error>;

/// The [`Slots`] of engines of type `E`.
pub(crate) struct Typed<E> {
    table: SecretTable<Kind<E>>,
    make: MakeEngine<E>,
}

impl<E> Typed<E> {
    pub(crate) fn new(capacity: usize, make: MakeEngine<E>) -> Self {
        Typed {
            table: SecretTable::new(capacity),
            make,
        }
    }
}

fn boxed(alg: Algorithm, key: &[u8], backend: Backend) -> Result<Box<dyn BlockEngine>, Error> {
    crate::block_cipher(alg, key, BackendChoice::Exact(backend))
}

impl<E: HeldEngine + 'static> Slots for Typed<E> {
    fn load(
        &self,
        tag: u32,
        spec: CipherSpec,
        key: &[u8],
        backend: Backend,
    ) -> Result<(), LoadError> {
        let make = self.make;
        self.table
            .insert_with(tag, || {
                Kind::new(spec, key, BackendChoice::Exact(backend), &|alg, k| {
                    make(alg, k, backend)
                })
            })
            .map_err(|e| match e {
                InsertError::Exists => LoadError::Exists,
                InsertError::InUse => LoadError::InUse,
                InsertError::Make(e) => LoadError::Cipher(e),
                _ => LoadError::OutOfRange,
            })?;
        // Building a key schedule leaves round keys in the vector registers.
        crate::wipe::after_keyed_call(crate::wipe::DEEP_STACK);
        Ok(())
    }

    fn with(&self, tag: u32, f: &mut dyn FnMut(Engines<'_>)) -> bool {
        match self.table.get(tag) {
            Some(entry) => {
                f(entry.engines());
                true
            }
            None => false,
        }
    }

    fn prefetch(&self, tag: u32) {
        self.table.prefetch(tag)
    }
    fn evict(&self, tag: u32) -> bool {
        self.table.evict(tag)
    }
    fn destroy(&self, tag: u32, wait: Duration) -> Result<bool, ()> {
        self.table.destroy(tag, wait)
    }
    fn contains(&self, tag: u32) -> bool {
        self.table.contains(tag)
    }
    fn tags(&self) -> Vec<u32> {
        self.table.tags()
    }
    fn len(&self) -> usize {
        self.table.len()
    }
    fn capacity(&self) -> usize {
        self.table.capacity()
    }
}

/// An engine held by value in a slot: every keyed call ends by clearing the vector registers and
/// the stack below it, as an engine in a [`sectorcrypt_secret::SecretBox`] does.
pub(crate) struct InSlot<E>(pub(crate) E);

impl<E: BlockEngine> HeldEngine for InSlot<E> {
    fn engine(&self) -> &dyn BlockEngine {
        self
    }
}

impl<E> std::ops::Deref for InSlot<E> {
    type Target = E;
    fn deref(&self) -> &E {
        &self.0
    }
}

crate::engine::wiping_engine!(InSlot);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SectorCipher;

    fn key(tag: u32, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u32 * 31 + tag * 7) as u8).collect()
    }

    /// A table of `capacity` keys of `spec` on each backend that runs here, at 512- and
    /// 4096-byte sectors with IVs offset by `iv_offset`, with the options it was made with.
    fn tables(spec: &str, iv_offset: u64, capacity: usize) -> Vec<(SectorKeys, SectorOptions)> {
        let spec = CipherSpec::parse(spec).unwrap();
        let CipherName::Block(alg) = spec.cipher else {
            unreachable!()
        };
        let each = alg.available_backends().into_iter().flat_map(|backend| {
            [512, 4096].map(|sector_size| SectorOptions {
                sector_size,
                backend: BackendChoice::Exact(backend),
                iv_offset,
                ..SectorOptions::default()
            })
        });
        each.map(|opts| (SectorKeys::new(spec, &opts, capacity).unwrap(), opts))
            .collect()
    }

    /// Every key of the table encrypts as a SectorCipher of the same key does, on every backend
    /// that runs here, for XTS and CBC-ESSIV, at 512 and 4096-byte sectors.
    #[test]
    fn each_key_encrypts_as_its_own_sector_cipher() {
        for spec in [
            "aes-xts-plain64",
            "aes-cbc-essiv:sha256",
            "serpent-xts-plain64",
        ] {
            for (keys, opts) in tables(spec, 5, 300) {
                let (spec, sector_size) = (keys.params.spec, opts.sector_size);
                let len = spec.default_key_bits() / 8;
                for tag in [0u32, 7, 255, 256, 299] {
                    keys.load(tag, &key(tag, len)).unwrap();
                }
                for tag in [0u32, 7, 255, 256, 299] {
                    let one = SectorCipher::new(spec, &key(tag, len), &opts).unwrap();
                    let plain: Vec<u8> = (0..3 * sector_size).map(|i| i as u8).collect();
                    let mut want = plain.clone();
                    one.encrypt(&mut want, 11).unwrap();
                    let mut got = plain.clone();
                    keys.with_key(tag, |k| k.process(&mut got, 11, Direction::Encrypt))
                        .unwrap()
                        .unwrap();
                    assert_eq!(
                        got, want,
                        "{spec} {:?} {sector_size} tag {tag}",
                        keys.backend
                    );
                    keys.with_key(tag, |k| k.process(&mut got, 11, Direction::Decrypt))
                        .unwrap()
                        .unwrap();
                    assert_eq!(got, plain);
                }
            }
        }
    }

    /// As `sector::tests::every_keyed_call_stays_within_the_stack_its_wipe_clears`, for keys in a
    /// table: AES keeps its engines by value in the slot (other monomorphized kernels, other
    /// frames), the other ciphers boxed. Loading a key and every request shape, on every
    /// backend here.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_keyed_call_stays_within_the_stack_its_wipe_clears() {
        use crate::wipe::reach::{deepest_within, measure_leaving};
        use crate::wipe::residue::assert_left_none;
        let src: Vec<u8> = (0..256 * 1024u32)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        for (spec, key_len) in [
            ("aes-xts-plain64", 64),
            ("aes-xts-plain64", 32),
            ("aes-cbc-essiv:sha256", 32),
            ("serpent-xts-plain64", 64),
        ] {
            for (keys, opts) in tables(spec, 0, 4) {
                let sector_size = opts.sector_size;
                let what = format!(
                    "{spec} ({key_len}-byte key) in a table on {}, {sector_size}-byte sectors",
                    keys.backend
                );
                let (loaded, left) = measure_leaving(|| keys.load(1, &key(1, key_len)).unwrap());
                let mut deepest = deepest_within(&loaded, &format!("{what}, loading"));
                let key = key(1, key_len);
                assert_left_none(&*left, spec, &key, &format!("{what}, loading"));
                for len in [sector_size, 4096, 64 * 1024, 256 * 1024] {
                    for dir in [Direction::Encrypt, Direction::Decrypt] {
                        let mut buf = src[..len].to_vec();
                        let (wipes, left) = measure_leaving(|| {
                            keys.with_key(1, |k| k.process(&mut buf, 3, dir))
                                .unwrap()
                                .unwrap();
                        });
                        let case = format!("{what}, {len}-byte request in place, {dir:?}");
                        deepest = deepest.max(deepest_within(&wipes, &case));
                        assert_left_none(&*left, spec, &key, &case);
                        let (wipes, left) = measure_leaving(|| {
                            keys.with_key(1, |k| k.process_from(&src[..len], &mut buf, 3, dir))
                                .unwrap()
                                .unwrap();
                        });
                        let case = format!("{what}, {len}-byte request from a source, {dir:?}");
                        deepest = deepest.max(deepest_within(&wipes, &case));
                        assert_left_none(&*left, spec, &key, &case);
                    }
                }
                eprintln!("{what}: deepest {deepest} bytes");
            }
        }
    }

    #[test]
    fn load_evict_destroy_and_bad_keys() {
        let spec = CipherSpec::parse("aes-xts-plain64").unwrap();
        let keys = SectorKeys::new(spec, &SectorOptions::default(), 3).unwrap();
        keys.load(1, &key(1, 64)).unwrap();
        assert!(matches!(keys.load(1, &key(2, 64)), Err(LoadError::Exists)));
        assert!(matches!(keys.load(2, &[0; 5]), Err(LoadError::Cipher(_))));
        keys.load(2, &key(2, 32)).unwrap();
        assert!(matches!(
            keys.load(3, &key(3, 64)),
            Err(LoadError::OutOfRange)
        ));
        assert_eq!(keys.tags(), [1, 2]);
        assert!(keys.with_key(3, |_| ()).is_none());
        // A key evicted while in use is kept for that use.
        let mut buf = vec![0u8; 512];
        keys.with_key(1, |k| {
            assert!(keys.evict(1));
            k.process(&mut buf, 0, Direction::Encrypt).unwrap();
        })
        .unwrap();
        assert_ne!(buf, vec![0u8; 512]);
        assert!(!keys.contains(1));
        assert_eq!(keys.destroy(2, Duration::from_secs(1)), Ok(true));
        assert!(keys.is_empty());
        keys.load(1, &key(3, 64)).unwrap();
        assert_eq!(keys.len(), 1);
    }
}
