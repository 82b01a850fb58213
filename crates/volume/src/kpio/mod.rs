//! Key per I/O in software: one store, a table of keys, and every request names the key it is
//! encrypted with by a tag, as with NVMe's Key Per I/O (TCG Storage Key Per I/O): the host manages
//! the keys, loads them into the device's table, and picks one per command.
//!
//! Design:
//! - One request path over the shared storage and layout (head / aligned body / tail,
//!   read-modify-write under a stripe lock, one extended request for the cipher), as a volume's;
//!   each request brings the key its tag names.
//! - The keys are a flat table ([`SectorKeys`]): every key's expanded round keys sit by value in
//!   the slot its tag indexes, in secret memory. A table of 65,536 keys is far larger than the
//!   caches: a key per request must cost one fetch of adjacent lines, not a chain of dependent
//!   misses through per-key objects.
//! - A request takes its key for each cipher call ([`TaggedKey`]), with the key's slot prefetched
//!   when the request starts, so that the slot's miss overlaps the request's work before its
//!   cipher: a read's storage read, a write's lend of the page cache (its residency check, a
//!   system call). Taking a key updates the slot's state atomically, and on x86 that waits for
//!   the slot's line before any later load: taken first, the miss and that work ran one after
//!   the other.
//! - Keys are expanded once, when loaded, as a drive keeps its key cache: switching keys per
//!   request never runs a key schedule.
//! - The table holds a key until it is evicted. A request holds it while it encrypts or
//!   decrypts (each piece, for a request long enough to be done in pieces), so a request whose
//!   key is evicted before its cipher runs fails: a read while its data is on the way, a write
//!   before it has stored anything (a write whose key goes between two of its pieces fails with
//!   part of its range written, as a failed write leaves its range undefined on any device).
//!   [`KeyTable::evict`] takes the key out of the table (its slot is zeroized when the last
//!   cipher call using it ends); [`KeyTable::destroy`] also waits for that moment, so that when
//!   it returns no copy of the key is left in the process: the sectors written under it are
//!   crypto-erased unless the host kept the key. (A write that encrypted before may still store
//!   its ciphertext after: it is under the destroyed key.)
//! - As on a KPIO drive, nothing records which key wrote which sector: a read with another key than
//!   the one that wrote returns noise, not an error. Overlapping writes under different tags have
//!   no order, as overlapping writes never do.
//! - Cipher workers are not used: a table of thousands of keys must not start threads per key, and
//!   KPIO requests are many and small, so each runs on its caller's thread.

mod reload;
pub use reload::{read_key_table, Mirror, Reload};

use std::sync::Arc;
use std::time::Duration;

use sectorcrypt_cipher::keys::{LoadError, SectorKeys};
use sectorcrypt_cipher::{CipherSpec, SectorOptions};
use sectorcrypt_storage::Storage;

use crate::{Error, Layout, Volume, VolumeOptions};

/// How long [`KeyTable::destroy`] waits for the requests still using a key.
const DESTROY_WAIT: Duration = Duration::from_secs(60);

/// A store whose requests are encrypted with keys chosen per request by tag.
pub struct KeyTable {
    /// The request path, without a key of its own.
    path: Volume,
    keys: SectorKeys,
}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTable")
            .field("storage", &self.path.storage().name())
            .field("layout", self.path.layout())
            .field("capacity", &self.capacity())
            .field("loaded", &self.len())
            .finish_non_exhaustive()
    }
}

impl KeyTable {
    /// An empty table for the data at `layout` on `storage`, for keys under tags `0..capacity`
    /// (a key table file's entries).
    /// `options.threads` is ignored (see the module docs).
    pub fn new(
        storage: Arc<dyn Storage>,
        layout: Layout,
        options: &VolumeOptions,
        capacity: usize,
    ) -> Result<Self, Error> {
        if capacity == 0 {
            return Err(Error::Refused(
                "a key table needs room for at least one key".into(),
            ));
        }
        let options = VolumeOptions {
            threads: 1,
            ..options.clone()
        };
        let path = Volume::keyless(storage, layout.clone(), &options)?;
        let keys = SectorKeys::new(
            CipherSpec::parse(&layout.cipher)?,
            &SectorOptions {
                sector_size: layout.sector_size,
                backend: options.backend,
                iv_offset: layout.iv_offset,
                ..SectorOptions::default()
            },
            capacity,
        )?;
        Ok(KeyTable { path, keys })
    }

    /// Load `key` under `tag`. A tag holds one key: replacing one means evicting or destroying it
    /// first, so that a key is never swapped under requests by mistake.
    pub fn load(&self, tag: u32, key: &[u8]) -> Result<(), Error> {
        self.keys.load(tag, key).map_err(|e| match e {
            LoadError::Exists => Error::Exists(format!(
                "a key is loaded under tag {tag} already; evict or destroy it first"
            )),
            LoadError::OutOfRange => Error::Refused(format!(
                "tag {tag} is beyond the key table's {} entries",
                self.capacity()
            )),
            LoadError::InUse => Error::Refused(format!(
                "the key evicted from tag {tag} is still used by running requests; destroy it \
                 first"
            )),
            LoadError::Cipher(e) => Error::Cipher(e),
            _ => Error::Refused(format!("cannot load a key under tag {tag}")),
        })
    }

    /// Take the key under `tag` out of the table; requests that name it fail from now on, and its
    /// material is zeroized when the requests running with it end. False if none was loaded.
    pub fn evict(&self, tag: u32) -> bool {
        self.keys.evict(tag)
    }

    /// Evict the key under `tag` and wait until its material is zeroized (the requests running
    /// with it have ended). False if none was loaded.
    pub fn destroy(&self, tag: u32) -> Result<bool, Error> {
        self.keys.destroy(tag, DESTROY_WAIT).map_err(|()| {
            Error::Refused(format!(
                "the key under tag {tag} is evicted, but requests have used it for {} s and it \
                 is not yet zeroized",
                DESTROY_WAIT.as_secs()
            ))
        })
    }

    /// Whether a key is loaded under `tag`.
    pub fn contains(&self, tag: u32) -> bool {
        self.keys.contains(tag)
    }

    /// The loaded tags, in ascending order.
    pub fn tags(&self) -> Vec<u32> {
        self.keys.tags()
    }

    /// Keys loaded.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is loaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys the table can hold.
    pub fn capacity(&self) -> usize {
        self.keys.capacity()
    }

    /// Where the data is and how it is encrypted (the cipher of every key).
    pub fn layout(&self) -> &Layout {
        self.path.layout()
    }

    /// Payload bytes (the same under every tag).
    pub fn size(&self) -> u64 {
        self.path.size()
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> usize {
        self.path.sector_size()
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.path.is_read_only()
    }

    /// Whether discards reach the storage.
    pub fn allows_discards(&self) -> bool {
        self.path.allows_discards()
    }

    /// Run `f` with the key under `tag`.
    fn with_key<R>(
        &self,
        tag: u32,
        f: impl FnOnce(&sectorcrypt_cipher::keys::SectorKey<'_>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        self.keys
            .with_key(tag, f)
            .unwrap_or(Err(Error::KeyNotLoaded(tag)))
    }

    /// Fill `buf` with the data at `offset`, decrypted with the key under `tag` (taken once the
    /// data is in: see the module docs).
    pub fn read(&self, tag: u32, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        if buf.is_empty() {
            return self.with_key(tag, |_| Ok(()));
        }
        self.keys.prefetch(tag);
        self.path.read_with(&self.tagged(tag), buf, offset)
    }

    /// [`KeyTable::read`] where that waits for nothing: see [`Volume::read_cached`].
    pub fn read_cached(&self, tag: u32, buf: &mut [u8], offset: u64) -> Result<bool, Error> {
        self.keys.prefetch(tag);
        self.path.read_cached_with(&self.tagged(tag), buf, offset)
    }

    /// The key under `tag`, for a request path that takes it per cipher call.
    fn tagged(&self, tag: u32) -> TaggedKey<'_> {
        TaggedKey { keys: self, tag }
    }

    /// Write `data` at `offset`, encrypted with the key under `tag` (taken when it encrypts: see
    /// the module docs).
    pub fn write(&self, tag: u32, data: &[u8], offset: u64) -> Result<(), Error> {
        self.write_in_place(tag, &mut data.to_vec(), offset)
    }

    /// [`KeyTable::write`], encrypting `data` in place (it is scrambled afterwards).
    pub fn write_in_place(&self, tag: u32, data: &mut [u8], offset: u64) -> Result<(), Error> {
        if data.is_empty() {
            return self.with_key(tag, |_| Ok(()));
        }
        self.keys.prefetch(tag);
        self.path
            .write_in_place_with(&self.tagged(tag), data, offset)
    }

    /// Make `len` bytes at `offset` read back as zeros under the key of `tag`.
    pub fn write_zeroes(&self, tag: u32, offset: u64, len: u64) -> Result<(), Error> {
        if len == 0 {
            return self.with_key(tag, |_| Ok(()));
        }
        let key = self.tagged(tag);
        self.path.zeroes(offset, len, &mut |zeros, at| {
            self.path.write_in_place_with(&key, zeros, at)
        })
    }

    /// Discard `len` bytes at `offset` (as [`Volume::discard`]); needs no key, but the tag must
    /// name one, as for every other request of a connection under it.
    pub fn discard(&self, tag: u32, offset: u64, len: u64) -> Result<(), Error> {
        self.with_key(tag, |_| self.path.discard(offset, len))
    }

    /// Make every completed write durable; needs no key.
    pub fn flush(&self) -> Result<(), Error> {
        self.path.flush()
    }

    /// A request a server has received under `tag`: an error at once if no key is loaded under
    /// it (a key evicted before the request runs fails it then).
    pub fn announce(self: &Arc<Self>, tag: u32) -> Result<crate::Announced, Error> {
        if !self.contains(tag) {
            return Err(Error::KeyNotLoaded(tag));
        }
        Ok(crate::Announced::key(Arc::clone(self), tag))
    }
}

/// The key under a tag, taken from the table for each cipher call: what a request encrypts or
/// decrypts with. Its first call comes after the request's storage work (a read's storage read,
/// a write's lend), so the slot prefetched before that is in cache by then. A call that finds the
/// key gone fails with [`Error::KeyNotLoaded`].
struct TaggedKey<'a> {
    keys: &'a KeyTable,
    tag: u32,
}

impl crate::Key for TaggedKey<'_> {
    fn process(
        &self,
        buf: &mut [u8],
        sector: u64,
        dir: sectorcrypt_cipher::Direction,
    ) -> Result<(), Error> {
        self.keys
            .with_key(self.tag, |key| crate::Key::process(key, buf, sector, dir))
    }
    fn process_from(
        &self,
        src: &[u8],
        dst: &mut [u8],
        sector: u64,
        dir: sectorcrypt_cipher::Direction,
    ) -> Result<(), Error> {
        self.keys.with_key(self.tag, |key| {
            crate::Key::process_from(key, src, dst, sector, dir)
        })
    }
}

impl crate::Key for sectorcrypt_cipher::keys::SectorKey<'_> {
    fn process(
        &self,
        buf: &mut [u8],
        sector: u64,
        dir: sectorcrypt_cipher::Direction,
    ) -> Result<(), Error> {
        Ok(sectorcrypt_cipher::keys::SectorKey::process(
            self, buf, sector, dir,
        )?)
    }
    fn process_from(
        &self,
        src: &[u8],
        dst: &mut [u8],
        sector: u64,
        dir: sectorcrypt_cipher::Direction,
    ) -> Result<(), Error> {
        Ok(sectorcrypt_cipher::keys::SectorKey::process_from(
            self, src, dst, sector, dir,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sectorcrypt_cipher::{CipherSpec, SectorCipher, SectorOptions};
    use sectorcrypt_storage::MemStorage;

    const SIZE: u64 = 64 * 1024;

    /// A table of `capacity` keys over 64 KiB of AES-XTS data at 4 KiB, and its storage.
    pub(super) fn table(capacity: usize) -> (KeyTable, Arc<MemStorage>) {
        let storage = Arc::new(MemStorage::new(vec![0; 4096 + SIZE as usize]));
        (
            table_on(Arc::clone(&storage) as Arc<dyn Storage>, capacity),
            storage,
        )
    }

    /// [`table`]'s table on `storage`.
    fn table_on(storage: Arc<dyn Storage>, capacity: usize) -> KeyTable {
        let layout = Layout {
            offset: 4096,
            size: SIZE,
            cipher: "aes-xts-plain64".into(),
            sector_size: 512,
            iv_offset: 0,
        };
        KeyTable::new(storage, layout, &VolumeOptions::default(), capacity).unwrap()
    }

    fn key(tag: u32) -> [u8; 64] {
        std::array::from_fn(|i| (i as u8).wrapping_mul(7) ^ tag as u8 ^ (tag >> 8) as u8)
    }

    #[test]
    fn each_tag_encrypts_with_its_own_key() {
        let (t, storage) = table(301);
        for tag in [1, 2, 300] {
            t.load(tag, &key(tag)).unwrap();
        }
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 31) as u8).collect();
        t.write(1, &data, 0).unwrap();
        t.write(300, &data, 8192).unwrap();
        // On the store: each range is plain aes-xts-plain64 under its own key, sector numbers
        // counted from the data's start.
        for (tag, at) in [(1u32, 0u64), (300, 8192)] {
            let cipher = SectorCipher::new(
                CipherSpec::parse("aes-xts-plain64").unwrap(),
                &key(tag),
                &SectorOptions::default(),
            )
            .unwrap();
            let mut expect = data.clone();
            cipher.encrypt(&mut expect, at / 512).unwrap();
            let mut stored = vec![0; data.len()];
            storage.read_at(&mut stored, 4096 + at).unwrap();
            assert_eq!(stored, expect, "tag {tag}");
        }
        let mut back = vec![0; data.len()];
        t.read(300, &mut back, 8192).unwrap();
        assert_eq!(back, data);
        // Another tag's key reads noise, not the data and not an error.
        t.read(2, &mut back, 8192).unwrap();
        assert_ne!(back, data);
        // Unaligned requests go through the same head/body/tail path.
        t.write(2, b"hello", 1000).unwrap();
        let mut five = [0u8; 5];
        t.read(2, &mut five, 1000).unwrap();
        assert_eq!(&five, b"hello");
    }

    /// A tag's reads and writes go straight from and into bytes the storage lends, with that tag's
    /// key.
    #[test]
    fn reads_under_a_tag_decrypt_from_lent_bytes() {
        let storage = Arc::new(crate::tests::Lending::new(4096 + SIZE as usize, false));
        let t = table_on(storage.clone(), 4);
        t.load(3, &key(3)).unwrap();
        let data: Vec<u8> = (0..32768u32).map(|i| (i * 29 + 5) as u8).collect();
        t.write(3, &data, 4096).unwrap();
        let mut back = vec![0; data.len()];
        t.read(3, &mut back, 4096).unwrap();
        assert_eq!(back, data);
        assert!(t.read_cached(3, &mut back, 4096).unwrap());
        assert_eq!(back, data);
        assert_eq!(storage.lent.load(std::sync::atomic::Ordering::Relaxed), 2);
        // The write was encrypted straight into lent bytes, with the same key.
        assert_eq!(
            storage
                .lent_writes
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }

    #[test]
    fn load_evict_destroy() {
        let (t, _) = table(9);
        t.load(7, &key(7)).unwrap();
        assert!(matches!(t.load(7, &key(8)), Err(Error::Exists(_))));
        t.load(8, &key(8)).unwrap();
        assert!(matches!(t.load(9, &key(9)), Err(Error::Refused(_))));
        assert!(matches!(t.load(10, &[0u8; 5]), Err(Error::Cipher(_))));
        assert_eq!(t.tags(), [7, 8]);

        let data = vec![0xa5u8; 1024];
        t.write(7, &data, 0).unwrap();
        assert!(t.evict(7));
        assert!(!t.evict(7));
        assert!(matches!(
            t.read(7, &mut [0; 16], 0),
            Err(Error::KeyNotLoaded(7))
        ));
        assert!(matches!(
            Arc::new(table(1).0).announce(7),
            Err(Error::KeyNotLoaded(7))
        ));
        let mut back = vec![0; 1024];

        // The host kept the key: loaded again, it reads the data.
        t.load(7, &key(7)).unwrap();
        t.read(7, &mut back, 0).unwrap();
        assert_eq!(back, data);

        // Destroyed: gone, and a different key under the same tag reads noise.
        assert!(t.destroy(7).unwrap());
        assert!(!t.destroy(7).unwrap());
        assert!(matches!(
            t.read(7, &mut back, 0),
            Err(Error::KeyNotLoaded(7))
        ));
        t.load(7, &key(1)).unwrap();
        t.read(7, &mut back, 0).unwrap();
        assert_ne!(back, data);
        t.flush().unwrap();
    }

    /// A memory device whose reads and writes wait, once `hold` is set, until it is cleared
    /// again.
    #[derive(Default)]
    struct Gated {
        data: MemStorage,
        hold: std::sync::atomic::AtomicBool,
        waiting: std::sync::atomic::AtomicBool,
    }

    impl Gated {
        fn pass(&self) {
            use std::sync::atomic::Ordering::SeqCst;
            while self.hold.load(SeqCst) {
                self.waiting.store(true, SeqCst);
                std::thread::yield_now();
            }
        }
    }

    impl Storage for Gated {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.pass();
            self.data.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.pass();
            self.data.write_at(buf, offset)
        }
        /// Lends a copy of the stored bytes, then stores it, as a page cache lends its pages:
        /// held before the lend, a write is held before it encrypts.
        fn write_lent(
            &self,
            offset: u64,
            len: usize,
            each: &mut dyn FnMut(&mut [u8]),
        ) -> std::io::Result<bool> {
            self.pass();
            let mut lent = vec![0u8; len];
            self.data.read_at(&mut lent, offset)?;
            each(&mut lent);
            self.data.write_at(&lent, offset)?;
            Ok(true)
        }
        fn sync(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            self.data.len()
        }
        fn name(&self) -> String {
            "gated".into()
        }
    }

    /// A table of 4 keys on [`Gated`] storage, 4 KiB of `0x3c` written under tag 3, the storage
    /// then held.
    fn gated_table() -> (Arc<KeyTable>, Arc<Gated>, Vec<u8>) {
        let storage = Arc::new(Gated {
            data: MemStorage::new(vec![0; 4096 + SIZE as usize]),
            ..Default::default()
        });
        let t = Arc::new(table_on(Arc::clone(&storage) as Arc<dyn Storage>, 4));
        t.load(3, &key(3)).unwrap();
        let data = vec![0x3cu8; 4096];
        t.write(3, &data, 0).unwrap();
        storage
            .hold
            .store(true, std::sync::atomic::Ordering::SeqCst);
        (t, storage, data)
    }

    /// Run `request` on a thread of its own and return once it waits for the held storage.
    fn held<R: Send + 'static>(
        storage: &Gated,
        request: impl FnOnce() -> R + Send + 'static,
    ) -> std::thread::JoinHandle<R> {
        let running = std::thread::spawn(request);
        while !storage.waiting.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::yield_now();
        }
        running
    }

    /// A write takes its key when it encrypts (so that the key's slot comes from memory during
    /// the storage's lend, not before it): a write held before its cipher holds no key, `destroy`
    /// does not wait for it, and the write then fails with nothing stored.
    #[test]
    fn a_write_takes_its_key_when_it_encrypts() {
        use std::sync::atomic::Ordering::SeqCst;
        let (t, storage, data) = gated_table();
        let writer = held(&storage, {
            let t = Arc::clone(&t);
            move || t.write(3, &[0xc3u8; 4096], 0)
        });
        let destroyer = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || t.destroy(3).unwrap())
        };
        let start = std::time::Instant::now();
        while !destroyer.is_finished() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            destroyer.is_finished(),
            "destroy waited for a write that had not yet taken its key"
        );
        assert!(destroyer.join().unwrap());
        storage.hold.store(false, SeqCst);
        assert!(matches!(
            writer.join().unwrap(),
            Err(Error::KeyNotLoaded(3))
        ));
        // Nothing was stored: loaded again, the key reads the data written before.
        t.load(3, &key(3)).unwrap();
        let mut back = vec![0u8; 4096];
        t.read(3, &mut back, 0).unwrap();
        assert_eq!(back, data);
    }

    /// A read takes its key only once its data is in (so that the key's slot comes from memory
    /// during the storage read, not before it): a read waiting for the storage holds no key,
    /// `destroy` does not wait for it, and the read then fails rather than decrypt with a key
    /// destroyed meanwhile.
    #[test]
    fn a_read_takes_its_key_once_its_data_is_in() {
        use std::sync::atomic::Ordering::SeqCst;
        let (t, storage, data) = gated_table();
        let reader = held(&storage, {
            let t = Arc::clone(&t);
            move || {
                let mut back = vec![0u8; 4096];
                t.read(3, &mut back, 0).map(|()| back)
            }
        });
        let destroyer = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || t.destroy(3).unwrap())
        };
        let start = std::time::Instant::now();
        while !destroyer.is_finished() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            destroyer.is_finished(),
            "destroy waited for a read that had not yet taken its key"
        );
        assert!(destroyer.join().unwrap());
        storage.hold.store(false, SeqCst);
        assert!(matches!(
            reader.join().unwrap(),
            Err(Error::KeyNotLoaded(3))
        ));
        // Loaded again, the key reads the data.
        t.load(3, &key(3)).unwrap();
        let mut back = vec![0u8; 4096];
        t.read(3, &mut back, 0).unwrap();
        assert_eq!(back, data);
    }

    /// A memory device that counts its syncs.
    #[derive(Default)]
    struct CountsSyncs {
        data: MemStorage,
        syncs: std::sync::atomic::AtomicUsize,
    }

    impl Storage for CountsSyncs {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.data.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.data.write_at(buf, offset)
        }
        fn sync(&self) -> std::io::Result<()> {
            self.syncs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            self.data.len()
        }
        fn name(&self) -> String {
            "counts-syncs".into()
        }
    }

    #[test]
    fn flush_reaches_the_storage_without_any_key() {
        let storage = Arc::new(CountsSyncs {
            data: MemStorage::new(vec![0; 4096 + SIZE as usize]),
            ..Default::default()
        });
        let t = table_on(Arc::clone(&storage) as Arc<dyn Storage>, 2);
        assert!(t.is_empty());
        t.flush().unwrap();
        assert_eq!(storage.syncs.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn read_only_and_bad_layouts() {
        let storage: Arc<dyn Storage> = Arc::new(MemStorage::new(vec![0; 8192]));
        let layout = Layout {
            offset: 4096,
            size: 8192,
            cipher: "aes-xts-plain64".into(),
            sector_size: 512,
            iv_offset: 0,
        };
        let opts = VolumeOptions::default();
        assert!(matches!(
            KeyTable::new(Arc::clone(&storage), layout.clone(), &opts, 4),
            Err(Error::Unsupported(_))
        ));
        let fits = Layout {
            size: 4096,
            ..layout
        };
        assert!(matches!(
            KeyTable::new(Arc::clone(&storage), fits.clone(), &opts, 0),
            Err(Error::Refused(_))
        ));
        let ro = VolumeOptions {
            read_only: true,
            ..opts
        };
        let t = KeyTable::new(storage, fits, &ro, 4).unwrap();
        t.load(0, &key(0)).unwrap();
        assert!(t.is_read_only());
        assert!(matches!(t.write(0, &[1; 512], 0), Err(Error::ReadOnly)));
    }
}
