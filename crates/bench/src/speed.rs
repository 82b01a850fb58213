//! Throughput of the sector data path.
//!
//! `threads` means: for requests of at least [`PARALLEL_MIN`] bytes, one submitter and a cipher
//! with that many workers (the extended request is split across them, as a volume would); for
//! smaller requests, that many submitter threads sharing one cipher, each with its own buffer
//! (small requests always run inline on the submitting thread).

use std::time::{Duration, Instant};

use sectorcrypt_cipher::sector::PARALLEL_MIN;
use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_cipher::{tsc, BackendChoice, Direction, Error, SectorCipher, SectorOptions};
use serde::Serialize;

/// What to measure.
#[derive(Clone, Debug)]
pub struct SpeedCase {
    /// The dm-crypt cipher spec.
    pub spec: CipherSpec,
    /// The whole key size in bits.
    pub key_bits: usize,
    /// Encryption sector size.
    pub sector_size: usize,
    /// Bytes per request (a multiple of the sector size).
    pub request_size: usize,
    /// Threads (see the module documentation).
    pub threads: usize,
    /// Backend choice.
    pub backend: BackendChoice,
}

/// Rows of the default table (cryptsetup benchmark's: AES, Serpent and Twofish in CBC and XTS;
/// with LEA and cipher_null added).
pub const DEFAULT_TABLE: [(&str, usize); 13] = [
    ("aes-cbc-essiv:sha256", 128),
    ("aes-cbc-essiv:sha256", 256),
    ("serpent-cbc-essiv:sha256", 256),
    ("twofish-cbc-essiv:sha256", 256),
    ("aes-xts-plain64", 256),
    ("aes-xts-plain64", 512),
    ("serpent-xts-plain64", 512),
    ("twofish-xts-plain64", 512),
    ("lea-cbc-essiv:sha256", 128),
    ("lea-cbc-essiv:sha256", 256),
    ("lea-xts-plain64", 256),
    ("lea-xts-plain64", 512),
    ("cipher_null-ecb", 0),
];

/// The (cipher, key bits) cases to measure: the default table when neither is given; else each
/// of `ciphers` (default aes-xts-plain64) with each of `key_sizes` (default the cipher's).
///
/// Errors: a cipher that does not parse, or a key size it does not take.
pub fn cases(ciphers: &[String], key_sizes: &[usize]) -> Result<Vec<(CipherSpec, usize)>, String> {
    if ciphers.is_empty() && key_sizes.is_empty() {
        return Ok(DEFAULT_TABLE
            .iter()
            .map(|&(spec, bits)| (CipherSpec::parse(spec).expect("built-in spec"), bits))
            .collect());
    }
    let default = ["aes-xts-plain64".to_string()];
    let ciphers = if ciphers.is_empty() {
        &default[..]
    } else {
        ciphers
    };
    let mut out = Vec::new();
    for c in ciphers {
        let spec = CipherSpec::parse(c).map_err(|e| e.to_string())?;
        let sizes = if key_sizes.is_empty() {
            vec![spec.default_key_bits()]
        } else {
            key_sizes.to_vec()
        };
        for bits in sizes {
            if bits % 8 != 0 {
                return Err(format!("key size {bits} is not a whole number of bytes"));
            }
            spec.check_key_len(bits / 8).map_err(|e| e.to_string())?;
            out.push((spec, bits));
        }
    }
    Ok(out)
}

/// One measured line, the JSON object of CLI.md.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    /// The cipher specification.
    pub cipher: String,
    /// The whole key size in bits.
    pub key_bits: usize,
    /// The encryption sector size.
    pub sector_size: usize,
    /// Bytes per request (one extended request).
    pub request_size: usize,
    /// Cipher threads.
    pub threads: usize,
    /// `encrypt` or `decrypt`.
    pub op: &'static str,
    /// The backend that ran.
    pub backend: String,
    /// Throughput.
    pub bytes_per_sec: f64,
    /// Time-stamp counter ticks per byte.
    pub cycles_per_byte: f64,
    /// The largest share of the machine's CPU time the hypervisor stole during a counted slice
    /// (slices above [`crate::steal::MAX_STEAL`] were taken again, up to
    /// [`crate::steal::ATTEMPTS`] times); `None` where /proc/stat cannot be read.
    pub steal_max: Option<f64>,
}

/// Why a case cannot be measured.
#[derive(Debug)]
#[non_exhaustive]
pub enum SpeedError {
    /// The cipher layer refused the parameters.
    Cipher(Error),
    /// The request size is not a positive multiple of the sector size.
    RequestSize {
        /// The request size given.
        request_size: usize,
        /// The sector size.
        sector_size: usize,
    },
}

impl std::fmt::Display for SpeedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpeedError::Cipher(e) => e.fmt(f),
            SpeedError::RequestSize {
                request_size,
                sector_size,
            } => {
                write!(f, "request size {request_size} is not a positive multiple of the sector size {sector_size}")
            }
        }
    }
}

impl std::error::Error for SpeedError {}

impl From<Error> for SpeedError {
    fn from(e: Error) -> Self {
        SpeedError::Cipher(e)
    }
}

/// Slices per measurement; the median slice is reported.
const SLICES: u32 = 5;

/// Measure `case` in direction `dir` for about `seconds`.
pub fn measure(case: &SpeedCase, dir: Direction, seconds: f64) -> Result<Measurement, SpeedError> {
    if case.request_size == 0 || !case.request_size.is_multiple_of(case.sector_size) {
        return Err(SpeedError::RequestSize {
            request_size: case.request_size,
            sector_size: case.sector_size,
        });
    }
    let threads = case.threads.max(1);
    let split = case.request_size >= PARALLEL_MIN;
    let opts = SectorOptions {
        sector_size: case.sector_size,
        backend: case.backend,
        threads: if split { threads } else { 1 },
        ..Default::default()
    };
    let key = crate::random_buffer(case.key_bits / 8);
    let cipher = SectorCipher::new(case.spec, &key, &opts)?;
    let submitters = if split { 1 } else { threads };
    let slice = Duration::from_secs_f64((seconds / f64::from(SLICES + 1)).max(0.01));

    let mut rates = Vec::new();
    let mut steal_max: Option<f64> = None;
    let one_slice = || {
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..submitters)
                .map(|_| {
                    let cipher = &cipher;
                    s.spawn(move || run_for(cipher, case.request_size, dir, slice))
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("benchmark thread"))
                .sum::<u64>()
        })
    };
    // The first slice warms caches, the thread pool and the CPU clock; it is not counted. A
    // slice taken while the host stole the CPU is taken again.
    one_slice();
    for _ in 0..SLICES {
        let (bytes, steal) =
            crate::steal::least_stolen(|| Ok::<_, std::convert::Infallible>(one_slice()))
                .unwrap_or_else(|never| match never {});
        rates.push(bytes as f64 / slice.as_secs_f64());
        steal_max = steal.map(|s| steal_max.map_or(s, |m| m.max(s)));
    }
    let bytes_per_sec = crate::median(rates);
    Ok(Measurement {
        cipher: case.spec.to_string(),
        key_bits: case.key_bits,
        sector_size: case.sector_size,
        request_size: case.request_size,
        threads,
        op: match dir {
            Direction::Encrypt => "encrypt",
            Direction::Decrypt => "decrypt",
        },
        backend: cipher.backend().to_string(),
        bytes_per_sec,
        cycles_per_byte: tsc::ticks_per_second() / bytes_per_sec,
        steal_max,
    })
}

/// Process requests back to back for `slice`; return the bytes processed (whole requests only,
/// timed so that the count matches the slice).
fn run_for(cipher: &SectorCipher, request_size: usize, dir: Direction, slice: Duration) -> u64 {
    let mut buf = crate::random_buffer(request_size);
    let sectors = (request_size / cipher.sector_size()) as u64;
    let start = Instant::now();
    let mut sector = 0u64;
    let mut bytes = 0u64;
    while start.elapsed() < slice {
        // Several requests between clock reads keep the clock out of the measurement.
        for _ in 0..8 {
            cipher
                .process(&mut buf, sector, dir)
                .expect("validated request");
            sector = (sector + sectors) % (1 << 40);
            bytes += request_size as u64;
        }
    }
    // Scale to the nominal slice so that the overshoot of the last batch is not counted as free.
    (bytes as f64 * slice.as_secs_f64() / start.elapsed().as_secs_f64()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_follow_the_defaults_and_refuse_bad_sizes() {
        assert_eq!(cases(&[], &[]).unwrap().len(), DEFAULT_TABLE.len());
        let one = cases(&[], &[256]).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(
            (one[0].0.to_string(), one[0].1),
            ("aes-xts-plain64".into(), 256)
        );
        let lea = cases(&["lea-xts-plain64".into()], &[]).unwrap();
        assert_eq!(lea[0].1, 512, "the cipher's default key size");
        assert!(cases(&[], &[100]).is_err(), "not whole bytes");
        assert!(cases(&[], &[128]).is_err(), "XTS needs two keys");
        assert!(cases(&["blowfish-xts-plain64".into()], &[]).is_err());
        assert_eq!(
            crate::tcrypt::algorithms(&["lea-cbc-essiv:sha256".into(), "lea".into()]).unwrap(),
            vec![sectorcrypt_cipher::Algorithm::Lea]
        );
        assert!(crate::tcrypt::algorithms(&["cipher_null-ecb".into()]).is_err());
    }
}
