use super::*;
use rand::{Rng, RngCore, SeedableRng};
use sectorcrypt_luks::{FormatOptions, PbkdfOptions};
use sectorcrypt_storage::{CrashingStorage, MemStorage};

const KEY: [u8; 64] = [7; 64];

/// A key of the default size for `cipher`.
fn key(cipher: &str) -> &'static [u8] {
    &KEY[..CipherSpec::parse(cipher).unwrap().default_key_bits() / 8]
}

fn layout(cipher: &str, sector_size: usize, offset: u64, size: u64) -> Layout {
    Layout {
        offset,
        size,
        cipher: cipher.into(),
        sector_size,
        iv_offset: 0,
    }
}

/// Where the test volumes' data starts on their storage.
const DATA_OFFSET: u64 = 8192;

/// A volume of `size` bytes on `storage` from [`DATA_OFFSET`], with two cipher threads.
fn volume_on(storage: Arc<dyn Storage>, cipher: &str, sector_size: usize, size: u64) -> Volume {
    Volume::with_layout(
        storage,
        layout(cipher, sector_size, DATA_OFFSET, size),
        key(cipher),
        &VolumeOptions {
            threads: 2,
            ..Default::default()
        },
    )
    .unwrap()
}

fn mem_volume(cipher: &str, sector_size: usize, size: u64) -> (Arc<MemStorage>, Volume) {
    let mem = Arc::new(MemStorage::new(vec![0xa5; (DATA_OFFSET + size) as usize]));
    let vol = volume_on(mem.clone(), cipher, sector_size, size);
    (mem, vol)
}

/// The ciphertext a per-sector encryption of `plain` gives: the reference the volume's extended
/// requests and read-modify-writes must match byte for byte.
fn per_sector_ciphertext(cipher: &str, sector_size: usize, plain: &[u8]) -> Vec<u8> {
    let c = SectorCipher::new(
        CipherSpec::parse(cipher).unwrap(),
        key(cipher),
        &SectorOptions {
            sector_size,
            ..Default::default()
        },
    )
    .unwrap();
    let mut out = plain.to_vec();
    for (i, s) in out.chunks_mut(sector_size).enumerate() {
        c.encrypt(s, i as u64).unwrap();
    }
    out
}

#[test]
fn random_unaligned_io_matches_a_plaintext_model() {
    for (cipher, ss) in [
        ("aes-xts-plain64", 512),
        ("aes-xts-plain64", 4096),
        ("lea-xts-plain64", 1024),
        ("aes-cbc-essiv:sha256", 512),
    ] {
        let size = 1 << 20;
        let (mem, vol) = mem_volume(cipher, ss, size);
        let mut model = vec![0u8; size as usize];
        vol.write_zeroes(0, size).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(ss as u64);
        for round in 0..300 {
            // Mostly small and unaligned, sometimes large enough for the worker threads.
            let len = if round % 10 == 0 {
                rng.gen_range(256 * 1024..600 * 1024)
            } else {
                rng.gen_range(0..3 * ss)
            };
            let off = rng.gen_range(0..=size as usize - len);
            if rng.gen_bool(0.5) {
                let mut data = vec![0u8; len];
                rng.fill_bytes(&mut data);
                vol.write(&data, off as u64).unwrap();
                model[off..off + len].copy_from_slice(&data);
            } else {
                let mut got = vec![0u8; len];
                vol.read(&mut got, off as u64).unwrap();
                assert_eq!(
                    got,
                    model[off..off + len],
                    "{cipher}/{ss} read at {off}+{len}"
                );
            }
        }
        let stored = mem.contents();
        assert!(
            stored[..8192].iter().all(|&b| b == 0xa5),
            "header area touched"
        );
        assert_eq!(
            stored[8192..],
            per_sector_ciphertext(cipher, ss, &model)[..],
            "{cipher}/{ss}: ciphertext differs from per-sector encryption"
        );
    }
}

#[test]
fn concurrent_partial_writes_to_one_sector_all_survive() {
    let (_, vol) = mem_volume("aes-xts-plain64", 4096, 64 * 1024);
    vol.write_zeroes(0, 64 * 1024).unwrap();
    // 8 threads each write their own 64-byte pieces of the same two sectors, many times.
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let vol = &vol;
            s.spawn(move || {
                for round in 0..200u32 {
                    for piece in 0..8u64 {
                        let off = 4096 - 256 + (piece * 8 + u64::from(t)) * 64;
                        let byte = t.wrapping_mul(31).wrapping_add(round as u8) | 1;
                        vol.write(&[byte; 64], off).unwrap();
                    }
                }
            });
        }
    });
    let mut got = vec![0u8; 8 * 8 * 64];
    vol.read(&mut got, 4096 - 256).unwrap();
    for (i, chunk) in got.chunks(64).enumerate() {
        let t = (i % 8) as u8;
        let want = t.wrapping_mul(31).wrapping_add(199) | 1;
        assert!(chunk.iter().all(|&b| b == want), "piece {i} lost an update");
    }
}

#[test]
fn requests_past_the_end_or_overflowing_are_refused_without_touching_data() {
    let (mem, vol) = mem_volume("aes-xts-plain64", 512, 4096);
    let before = mem.contents();
    let mut buf = [0u8; 512];
    for (off, len) in [
        (4096u64, 1u64),
        (3585, 512),
        (u64::MAX, 2),
        (u64::MAX - 10, 512),
    ] {
        assert!(matches!(
            vol.read(&mut buf[..len.min(512) as usize], off),
            Err(Error::OutOfRange { .. })
        ));
        assert!(matches!(
            vol.write_zeroes(off, len),
            Err(Error::OutOfRange { .. })
        ));
    }
    assert!(matches!(
        vol.write(&buf, 4000),
        Err(Error::OutOfRange { .. })
    ));
    assert_eq!(mem.contents(), before);
    // Zero-length requests at the very end are fine.
    vol.read(&mut [], 4096).unwrap();
    vol.write(&[], 4096).unwrap();
}

#[test]
fn read_only_and_discard_policy() {
    let mem = Arc::new(MemStorage::new(vec![1; 8192]));
    let ro = Volume::with_layout(
        mem.clone(),
        layout("aes-xts-plain64", 512, 0, 8192),
        &KEY,
        &VolumeOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(ro.write(&[0; 10], 0), Err(Error::ReadOnly)));
    assert!(matches!(ro.write_zeroes(0, 10), Err(Error::ReadOnly)));
    assert!(matches!(ro.discard(0, 512), Err(Error::ReadOnly)));
    let mut buf = [0u8; 100];
    ro.read(&mut buf, 7).unwrap();

    let (mem, vol) = mem_volume("aes-xts-plain64", 512, 8192);
    vol.write(&[9; 8192], 0).unwrap();
    let before = mem.contents();
    assert!(matches!(
        vol.discard(0, 8192),
        Err(Error::DiscardsNotAllowed)
    ));
    assert_eq!(
        mem.contents(),
        before,
        "a refused discard changed the storage"
    );

    let mem = Arc::new(MemStorage::new(vec![1; 8192]));
    let vol = Volume::with_layout(
        mem.clone(),
        layout("aes-xts-plain64", 512, 0, 8192),
        &KEY,
        &VolumeOptions {
            allow_discards: true,
            ..Default::default()
        },
    )
    .unwrap();
    // Only the whole sectors inside the range are released.
    vol.discard(100, 2000).unwrap();
    let after = mem.contents();
    assert!(after[..512].iter().all(|&b| b == 1));
    assert!(after[512..2048].iter().all(|&b| b == 0));
    assert!(after[2048..].iter().all(|&b| b == 1));
}

#[test]
fn storage_failure_is_an_error_not_a_panic() {
    let dev = Arc::new(CrashingStorage::new(vec![0; 16384], Some(0)));
    let vol = Volume::with_layout(
        dev,
        layout("aes-xts-plain64", 512, 0, 16384),
        &KEY,
        &VolumeOptions::default(),
    )
    .unwrap();
    assert!(matches!(vol.write(&[1; 4096], 0), Err(Error::Io(_))));
    assert!(matches!(vol.write(&[1; 10], 3), Err(Error::Io(_))));
    assert!(matches!(vol.flush(), Err(Error::Io(_))));
}

#[test]
fn opens_the_data_segment_of_a_luks2_header() {
    let mem = Arc::new(MemStorage::new(vec![0; 32 << 20]));
    let opts = FormatOptions {
        version: 2,
        cipher: Some("aes-xts-plain64".into()),
        sector_size: Some(4096),
        pbkdf: PbkdfOptions {
            kind: Some(sectorcrypt_luks::PbkdfChoice::Pbkdf2),
            force_iterations: Some(1000),
            ..Default::default()
        },
        ..Default::default()
    };
    let (header, unlocked) =
        sectorcrypt_luks::format(&*mem, 32 << 20, &opts, b"passphrase").unwrap();
    let vol = Volume::open(
        &header,
        mem.clone(),
        &unlocked.volume_key,
        &VolumeOptions::default(),
    )
    .unwrap();
    let l = vol.layout();
    assert_eq!(l.offset, 16 << 20);
    assert_eq!(l.size + l.offset, 32 << 20);
    assert_eq!(l.sector_size, 4096);
    let data: Vec<u8> = (0..20000u32).map(|i| (i * 7) as u8).collect();
    vol.write(&data, 12345).unwrap();
    let mut back = vec![0; data.len()];
    vol.read(&mut back, 12345).unwrap();
    assert_eq!(back, data);

    // A LUKS1 header: 512-byte sectors, payload after the keyslots.
    let mem1 = Arc::new(MemStorage::new(vec![0; 4 << 20]));
    let opts1 = FormatOptions { version: 1, ..opts };
    let (h1, u1) = sectorcrypt_luks::format(
        &*mem1,
        4 << 20,
        &FormatOptions {
            sector_size: None,
            ..opts1
        },
        b"pw",
    )
    .unwrap();
    let v1 = Volume::open(&h1, mem1, &u1.volume_key, &VolumeOptions::default()).unwrap();
    assert_eq!(v1.sector_size(), 512);
    assert_eq!(v1.size() + v1.layout().offset, 4 << 20);
}

#[test]
fn a_header_claiming_more_data_than_the_device_has_is_refused() {
    let mem: Arc<dyn Storage> = Arc::new(MemStorage::new(vec![0; 4096]));
    let err = Volume::with_layout(
        mem,
        layout("aes-xts-plain64", 512, 1024, 4096),
        &KEY,
        &VolumeOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
}

#[test]
fn a_limit_is_a_positive_whole_number_of_sectors_within_the_data() {
    let mut layout = Layout {
        offset: 0,
        size: 1 << 20,
        cipher: "aes-xts-plain64".into(),
        sector_size: 4096,
        iv_offset: 0,
    };
    for bad in [0, 512, 4097, (1 << 20) + 4096] {
        assert!(
            matches!(layout.clone().limit_to(bad), Err(Error::Refused(_))),
            "{bad}"
        );
    }
    layout.limit_to(8192).unwrap();
    assert_eq!(layout.size, 8192);
}

#[test]
fn a_cached_read_gives_what_a_read_gives_or_declines() {
    let dir = std::env::temp_dir().join(format!("sectorcrypt-vol-cached-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("v.img");
    let size = 2u64 << 20;
    std::fs::write(&path, vec![0u8; (DATA_OFFSET + size) as usize]).unwrap();
    let file = Arc::new(sectorcrypt_storage::FileStorage::open(&path).unwrap());
    for sector_size in [512, 4096] {
        let vol = volume_on(file.clone(), "aes-xts-plain64", sector_size, size);
        let mut rng = rand::rngs::StdRng::seed_from_u64(sector_size as u64);
        let mut plain = vec![0u8; size as usize];
        rng.fill_bytes(&mut plain);
        vol.write(&plain, 0).unwrap();
        // Small and large (spread over the cipher threads), at the start, inside and at the end.
        for (at, len) in [
            (0, 4096),
            (8192, 128 << 10),
            (4096, 1 << 20),
            (size - 8192, 8192),
        ] {
            let mut got = vec![0u8; len as usize];
            let before = vol.requests();
            assert!(
                vol.read_cached(&mut got, at).unwrap(),
                "just written: cached"
            );
            assert_eq!(vol.requests(), before + 1);
            assert!(
                got == plain[at as usize..(at + len) as usize],
                "{sector_size} {at} {len}"
            );
        }
        // Declined, and not counted: not whole sectors, empty, past the end.
        let before = vol.requests();
        let mut buf = vec![0u8; 8192];
        assert!(!vol.read_cached(&mut buf[..1000], 0).unwrap());
        assert!(!vol.read_cached(&mut buf, 100).unwrap());
        assert!(!vol.read_cached(&mut [], 0).unwrap());
        assert!(!vol.read_cached(&mut buf, size - 4096).unwrap());
        assert_eq!(vol.requests(), before);
    }
    // Storage that cannot tell declines every time.
    let (_, vol) = mem_volume("aes-xts-plain64", 512, 1 << 16);
    assert!(!vol.read_cached(&mut [0u8; 4096], 0).unwrap());
    std::fs::remove_dir_all(dir).unwrap();
}

/// Memory that lends every read and write ([`Storage::read_lent`], [`Storage::write_lent`])
/// and counts those it lent; with `refuse`, it calls the reader with noise and then says the
/// bytes were lost (a page that failed to read under a mapping), and keeps only the first half
/// of what a writer stored before saying the rest was lost, so the volume must read or write
/// again.
pub(crate) struct Lending {
    mem: MemStorage,
    refuse: bool,
    pub(crate) lent: AtomicUsize,
    pub(crate) lent_writes: AtomicUsize,
}

impl Lending {
    pub(crate) fn new(len: usize, refuse: bool) -> Lending {
        Lending {
            mem: MemStorage::new(vec![0x3c; len]),
            refuse,
            lent: AtomicUsize::new(0),
            lent_writes: AtomicUsize::new(0),
        }
    }
}

impl Storage for Lending {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.mem.write_at(buf, offset)
    }
    fn read_lent(&self, offset: u64, len: usize, each: &mut dyn FnMut(&[u8])) -> io::Result<bool> {
        let mut bytes = vec![0u8; len];
        self.mem.read_at(&mut bytes, offset)?;
        if self.refuse {
            bytes.fill(0);
            each(&bytes);
            return Ok(false);
        }
        each(&bytes);
        self.lent.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
    fn write_lent(
        &self,
        offset: u64,
        len: usize,
        each: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<bool> {
        let mut bytes = vec![0u8; len];
        self.mem.read_at(&mut bytes, offset)?;
        each(&mut bytes);
        if self.refuse {
            self.mem.write_at(&bytes[..len / 2], offset)?;
            return Ok(false);
        }
        self.mem.write_at(&bytes, offset)?;
        self.lent_writes.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.mem.len()
    }
    fn name(&self) -> String {
        "lending memory".into()
    }
}

/// Writes of whole sectors, at any size, encrypt straight into bytes the storage lends, in
/// every mode, leaving there exactly the ciphertext a sector-by-sector encryption gives; where
/// the storage loses some of what was stored, the volume writes the whole range again.
#[test]
fn writes_encrypt_into_lent_bytes_or_write_again_when_some_are_lost() {
    let ciphers = [
        "aes-xts-plain64",
        "aes-cbc-essiv:sha256",
        "serpent-xts-plain64",
        "cipher_null-ecb",
    ];
    on_lending_volumes(
        &ciphers,
        |cipher, sector_size, refuse, storage, vol, mut plain| {
            let size = plain.len() as u64;
            let ctx = format!("{cipher} {sector_size} refuse {refuse}");
            // The whole volume (spread over the cipher's threads), then whole sectors, and a
            // head and tail around whole sectors.
            let writes = [
                (0u64, size as usize),
                (4096, 4096),
                (8192, 128 << 10),
                (1000, 70_000),
            ];
            for (at, len) in writes {
                plain[at as usize..][..len]
                    .iter_mut()
                    .for_each(|b| *b ^= 0x5a);
                vol.write(&plain[at as usize..][..len], at).unwrap();
                let mut stored = vec![0u8; size as usize];
                storage.read_at(&mut stored, DATA_OFFSET).unwrap();
                assert!(
                    stored == per_sector_ciphertext(cipher, sector_size, &plain),
                    "stored after {at} {len}: {ctx}"
                );
            }
            let mut back = vec![0u8; size as usize];
            vol.read(&mut back, 0).unwrap();
            assert!(back == plain, "{ctx}");
            // Every write lent, down to a sector: three whole-sector writes, and the head, body
            // and tail of the unaligned one.
            let lent = storage.lent_writes.load(Ordering::Relaxed);
            assert_eq!(lent, if refuse { 0 } else { 6 }, "{ctx}");
        },
    );
}

/// Run `check` on a 1 MiB volume of each cipher on [`Lending`] storage, with 512- and
/// 4096-byte sectors, lending or refusing: with the cipher, the sector size, whether the
/// storage refuses, the storage, the volume and random plaintext of the volume's size.
fn on_lending_volumes(
    ciphers: &[&str],
    mut check: impl FnMut(&str, usize, bool, &Lending, &Volume, Vec<u8>),
) {
    for cipher in ciphers {
        for sector_size in [512, 4096] {
            for refuse in [false, true] {
                let size = 1u64 << 20;
                let storage = Arc::new(Lending::new((DATA_OFFSET + size) as usize, refuse));
                let vol = volume_on(storage.clone(), cipher, sector_size, size);
                let mut plain = vec![0u8; size as usize];
                rand::rngs::StdRng::seed_from_u64(sector_size as u64).fill_bytes(&mut plain);
                check(cipher, sector_size, refuse, &storage, &vol, plain);
            }
        }
    }
}

/// Reads of at least `READ_LENT_MIN` bytes decrypt straight from bytes the storage lends, in every
/// mode (XTS from the source, the others after a copy), with `read` and `read_cached` alike;
/// where the storage takes the bytes back, the volume reads them again and still answers with
/// the plaintext.
#[test]
fn reads_decrypt_from_lent_bytes_or_read_again_when_they_are_taken_back() {
    let ciphers = [
        "aes-xts-plain64",
        "aes-cbc-essiv:sha256",
        "serpent-xts-plain64",
    ];
    on_lending_volumes(
        &ciphers,
        |cipher, sector_size, refuse, storage, vol, plain| {
            vol.write(&plain, 0).unwrap();
            let ctx = format!("{cipher} {sector_size} refuse {refuse}");
            // Whole sectors, and a head and tail around them (which read a covering span);
            // 512 KiB alone is spread over the cipher's threads.
            let reads = [
                (0u64, 4096usize),
                (4096, 128 << 10),
                (1000, 70_000),
                (0, 512 << 10),
            ];
            for (at, len) in reads {
                let mut got = vec![0u8; len];
                vol.read(&mut got, at).unwrap();
                assert!(got == plain[at as usize..][..len], "read {at} {len} {ctx}");
            }
            let mut got = vec![0u8; 64 << 10];
            // Lent bytes wait for nothing: a cached read answers with them; taken back, it
            // declines (this memory cannot say what is cached otherwise).
            assert_eq!(vol.read_cached(&mut got, 8192).unwrap(), !refuse, "{ctx}");
            if !refuse {
                assert!(got == plain[8192..][..64 << 10], "read_cached {ctx}");
            }
            // Lent: the 128 KiB and 512 KiB reads, the span around the unaligned one and
            // the cached read; not the 4 KiB read, which copies.
            let lent = storage.lent.load(Ordering::Relaxed);
            assert_eq!(lent, if refuse { 0 } else { 4 }, "{ctx}");
        },
    );
}

/// A file that another process truncates while a request has its bytes lent, past its first
/// `keep` bytes: the cipher's access to the lost pages faults, and the storage's SIGBUS handler
/// runs on the request's thread in the middle of the cipher call.
struct TruncatedUnderLend {
    file: sectorcrypt_storage::FileStorage,
    path: std::path::PathBuf,
    keep: u64,
}

impl TruncatedUnderLend {
    fn truncate(&self) {
        let other = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .unwrap();
        other.set_len(self.keep).unwrap();
    }
}

impl Storage for TruncatedUnderLend {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_at(buf, offset)
    }
    fn read_lent(&self, offset: u64, len: usize, each: &mut dyn FnMut(&[u8])) -> io::Result<bool> {
        self.file.read_lent(offset, len, &mut |src| {
            self.truncate();
            each(src);
        })
    }
    fn write_lent(
        &self,
        offset: u64,
        len: usize,
        each: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<bool> {
        self.file.write_lent(offset, len, &mut |dst| {
            self.truncate();
            each(dst);
        })
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }
    fn name(&self) -> String {
        "a file truncated under a lend".into()
    }
}

/// The first 16-byte piece of `pieces` found in `bytes`, and where.
fn find_piece(bytes: &[u8], pieces: &[[u8; 16]]) -> Option<(usize, usize)> {
    let set: std::collections::HashMap<[u8; 16], usize> =
        pieces.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    bytes.windows(16).enumerate().find_map(|(at, w)| {
        let w: [u8; 16] = w.try_into().unwrap();
        set.get(&w).map(|&i| (i, at))
    })
}

/// `len` bytes of this process's memory at `at`, read through `/proc/self/mem`.
fn own_memory(at: usize, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open("/proc/self/mem").unwrap();
    let mut bytes = vec![0u8; len];
    mem.read_exact_at(&mut bytes, at as u64).unwrap();
    bytes
}

/// A page of a lent request that fails under the cipher (the file truncated by someone else)
/// makes the kernel save the cipher kernel's registers for the storage's SIGBUS handler, on the
/// thread's alternate signal stack: no round key of either XTS key may be left there, nor in the
/// stack below the request, once the request has returned. Reads and writes.
#[test]
fn a_page_that_fails_under_a_lent_request_leaves_no_round_key_in_the_signal_frame() {
    let dir = std::env::temp_dir().join(format!("sectorcrypt-vol-sigbus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("v.img");
    let size = 256u64 << 10;
    let mut rng = rand::rngs::StdRng::seed_from_u64(32);
    let mut key = [0u8; 64];
    rng.fill_bytes(&mut key);
    let pieces: Vec<[u8; 16]> = [&key[..32], &key[32..]]
        .into_iter()
        .flat_map(sectorcrypt_testkit::aes_schedule::aes_round_keys)
        .collect();
    let (alt_at, alt_len) = sectorcrypt_secret::signals::alt_stack()
        .expect("Rust gives its threads an alternate signal stack");
    for write in [false, true] {
        // In the page cache, as a lend needs.
        std::fs::write(&path, vec![0x5a; (DATA_OFFSET + size) as usize]).unwrap();
        let storage = Arc::new(TruncatedUnderLend {
            file: sectorcrypt_storage::FileStorage::open(&path).unwrap(),
            path: path.clone(),
            keep: DATA_OFFSET + 8192,
        });
        let vol = Volume::with_layout(
            storage,
            layout("aes-xts-plain64", 4096, DATA_OFFSET, size),
            &key,
            &VolumeOptions::default(),
        )
        .unwrap();
        let mut buf = vec![0u8; 64 << 10];
        // Either way the request ends: a read finds the data gone, a write is written again.
        let _ = if write {
            vol.write(&buf, 0)
        } else {
            vol.read(&mut buf, 0)
        };
        // The stack the request's frames used (every wipe and scrub reached into it, so it is
        // mapped even on a main thread, whose stack grows only as it is touched).
        let here = 0u8;
        let below = std::hint::black_box(&here) as *const u8 as usize - (100 << 10);
        for (what, bytes) in [
            ("the alternate signal stack", own_memory(alt_at, alt_len)),
            ("the stack below the request", own_memory(below, 96 << 10)),
        ] {
            if let Some((piece, at)) = find_piece(&bytes, &pieces) {
                panic!(
                    "{} of {} bytes holds round key {piece} (of both keys' schedules) at byte \
                     {at}, after a {}",
                    what,
                    bytes.len(),
                    if write { "write" } else { "read" }
                );
            }
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}
