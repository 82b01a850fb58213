//! Key per I/O in software: one store, a table of keys, and every request names the key it is
//! encrypted with by a tag, as with NVMe's Key Per I/O (TCG Storage Key Per I/O): the host manages
//! the keys, loads them into the device's table, and picks one per command.
//!
//! Design:
//! - Each loaded key is a whole [`Volume`] over the shared storage and layout, so a tagged request
//!   takes exactly the path every request takes (head / aligned body / tail, read-modify-write
//!   under a stripe lock, one extended request for the cipher). Choosing the key costs one read
//!   lock and one reference count per request.
//! - Keys are expanded once, when loaded, as a drive keeps its key cache: switching keys per
//!   request costs a lookup and cache misses on round keys, never a key schedule.
//! - The table holds the only lasting reference to a key; a request holds one while it runs.
//!   [`KeyTable::evict`] takes the key out of the table (its material is zeroized when the last
//!   request using it ends); [`KeyTable::destroy`] also waits for that moment, so that when it
//!   returns no copy of the key is left in the process: the sectors written under it are
//!   crypto-erased unless the host kept the key.
//! - As on a KPIO drive, nothing records which key wrote which sector: a read with another key than
//!   the one that wrote returns noise, not an error. Overlapping writes under different tags have
//!   no order, as overlapping writes never do.
//! - Cipher workers are not used: a table of thousands of keys must not start threads per key, and
//!   KPIO requests are many and small, so each runs on its caller's thread.

mod reload;
pub use reload::{read_key_table, Mirror, Reload};

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sectorcrypt_storage::Storage;

use crate::{Error, Layout, Volume, VolumeOptions};

/// How long [`KeyTable::destroy`] waits for the requests still using a key.
const DESTROY_WAIT: Duration = Duration::from_secs(60);

/// A store whose requests are encrypted with keys chosen per request by tag.
pub struct KeyTable {
    storage: Arc<dyn Storage>,
    layout: Layout,
    options: VolumeOptions,
    capacity: usize,
    keys: RwLock<HashMap<u32, Arc<Volume>>>,
}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTable")
            .field("storage", &self.storage.name())
            .field("layout", &self.layout)
            .field("capacity", &self.capacity)
            .field("loaded", &self.len())
            .finish_non_exhaustive()
    }
}

impl KeyTable {
    /// An empty table for the data at `layout` on `storage`, holding at most `capacity` keys.
    /// `options.threads` is ignored (see the module docs).
    pub fn new(
        storage: Arc<dyn Storage>,
        layout: Layout,
        options: &VolumeOptions,
        capacity: usize,
    ) -> Result<Self, Error> {
        layout.check_fits(&*storage)?;
        if capacity == 0 {
            return Err(Error::Refused(
                "a key table needs room for at least one key".into(),
            ));
        }
        Ok(KeyTable {
            storage,
            layout,
            options: VolumeOptions {
                threads: 1,
                ..options.clone()
            },
            capacity,
            keys: RwLock::default(),
        })
    }

    fn read_keys(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u32, Arc<Volume>>> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write_keys(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<u32, Arc<Volume>>> {
        self.keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Load `key` under `tag`. A tag holds one key: replacing one means evicting or destroying it
    /// first, so that a key is never swapped under requests by mistake.
    pub fn load(&self, tag: u32, key: &[u8]) -> Result<(), Error> {
        // The key schedule runs outside the lock: loading thousands of keys must not stall requests.
        let volume = Volume::with_layout(
            Arc::clone(&self.storage),
            self.layout.clone(),
            key,
            &self.options,
        )?;
        let mut keys = self.write_keys();
        if keys.contains_key(&tag) {
            return Err(Error::Exists(format!(
                "a key is loaded under tag {tag} already; evict or destroy it first"
            )));
        }
        if keys.len() >= self.capacity {
            return Err(Error::Refused(format!(
                "the key table is full ({} keys)",
                self.capacity
            )));
        }
        keys.insert(tag, Arc::new(volume));
        Ok(())
    }

    /// Take the key under `tag` out of the table; requests that name it fail from now on, and its
    /// material is zeroized when the requests running with it end. False if none was loaded.
    pub fn evict(&self, tag: u32) -> bool {
        self.write_keys().remove(&tag).is_some()
    }

    /// Evict the key under `tag` and wait until its material is zeroized (the requests running
    /// with it have ended). False if none was loaded.
    pub fn destroy(&self, tag: u32) -> Result<bool, Error> {
        let Some(mut volume) = self.write_keys().remove(&tag) else {
            return Ok(false);
        };
        let start = Instant::now();
        loop {
            match Arc::try_unwrap(volume) {
                // The last reference: dropping it zeroizes the round keys.
                Ok(last) => {
                    drop(last);
                    return Ok(true);
                }
                Err(shared) if start.elapsed() < DESTROY_WAIT => {
                    volume = shared;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => {
                    return Err(Error::Refused(format!(
                        "the key under tag {tag} is evicted, but requests have used it for \
                         {} s and it is not yet zeroized",
                        DESTROY_WAIT.as_secs()
                    )))
                }
            }
        }
    }

    /// The volume for requests under `tag`, held for as long as the caller keeps it.
    pub fn get(&self, tag: u32) -> Result<Arc<Volume>, Error> {
        self.read_keys()
            .get(&tag)
            .cloned()
            .ok_or(Error::KeyNotLoaded(tag))
    }

    /// Whether a key is loaded under `tag`.
    pub fn contains(&self, tag: u32) -> bool {
        self.read_keys().contains_key(&tag)
    }

    /// The loaded tags, in ascending order.
    pub fn tags(&self) -> Vec<u32> {
        let mut tags: Vec<u32> = self.read_keys().keys().copied().collect();
        tags.sort_unstable();
        tags
    }

    /// Keys loaded.
    pub fn len(&self) -> usize {
        self.read_keys().len()
    }

    /// Whether no key is loaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys the table can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Where the data is and how it is encrypted (the cipher of every key).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Payload bytes (the same under every tag).
    pub fn size(&self) -> u64 {
        self.layout.size
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> usize {
        self.layout.sector_size
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.options.read_only
    }

    /// Whether discards reach the storage.
    pub fn allows_discards(&self) -> bool {
        self.options.allow_discards
    }

    /// Fill `buf` with the data at `offset`, decrypted with the key under `tag`.
    pub fn read(&self, tag: u32, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        self.get(tag)?.read(buf, offset)
    }

    /// Write `data` at `offset`, encrypted with the key under `tag`.
    pub fn write(&self, tag: u32, data: &[u8], offset: u64) -> Result<(), Error> {
        self.get(tag)?.write(data, offset)
    }

    /// Make every completed write durable; needs no key.
    pub fn flush(&self) -> Result<(), Error> {
        self.storage.sync()?;
        Ok(())
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
        let (t, storage) = table(16);
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

    #[test]
    fn load_evict_destroy() {
        let (t, _) = table(2);
        t.load(7, &key(7)).unwrap();
        assert!(matches!(t.load(7, &key(8)), Err(Error::Exists(_))));
        t.load(8, &key(8)).unwrap();
        assert!(matches!(t.load(9, &key(9)), Err(Error::Refused(_))));
        assert!(matches!(t.load(10, &[0u8; 5]), Err(Error::Cipher(_))));
        assert_eq!(t.tags(), [7, 8]);

        let data = vec![0xa5u8; 1024];
        t.write(7, &data, 0).unwrap();
        // A request that started before the eviction keeps its key until it ends.
        let held = t.get(7).unwrap();
        assert!(t.evict(7));
        assert!(!t.evict(7));
        assert!(matches!(
            t.read(7, &mut [0; 16], 0),
            Err(Error::KeyNotLoaded(7))
        ));
        let mut back = vec![0; 1024];
        held.read(&mut back, 0).unwrap();
        assert_eq!(back, data);
        drop(held);

        // The host kept the key: loaded again, it reads the data.
        t.load(7, &key(7)).unwrap();
        t.read(7, &mut back, 0).unwrap();
        assert_eq!(back, data);

        // Destroyed: gone, and a different key under the same tag reads noise.
        assert!(t.destroy(7).unwrap());
        assert!(!t.destroy(7).unwrap());
        assert!(matches!(t.get(7), Err(Error::KeyNotLoaded(7))));
        t.load(7, &key(1)).unwrap();
        t.read(7, &mut back, 0).unwrap();
        assert_ne!(back, data);
        t.flush().unwrap();
    }

    #[test]
    fn destroy_waits_for_requests_in_flight() {
        let (t, _) = table(4);
        let t = Arc::new(t);
        t.load(3, &key(3)).unwrap();
        let held = t.get(3).unwrap();
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t2, released2) = (Arc::clone(&t), Arc::clone(&released));
        let destroyer = std::thread::spawn(move || {
            let destroyed = t2.destroy(3).unwrap();
            // destroy returned: the last reference must have been dropped already.
            (
                destroyed,
                released2.load(std::sync::atomic::Ordering::SeqCst),
            )
        });
        // The key is out of the table at once, but destroy is still waiting for `held`.
        while t.contains(3) {
            std::thread::yield_now();
        }
        assert!(!destroyer.is_finished());
        released.store(true, std::sync::atomic::Ordering::SeqCst);
        drop(held);
        assert_eq!(destroyer.join().unwrap(), (true, true));
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
