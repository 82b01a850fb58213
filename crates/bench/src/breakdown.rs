//! The dm-crypt paper's Tables 1 and 2 on this machine: a large buffer (50 MB, like the paper's
//! file) encrypted or decrypted through the staged XTS path, once in one-sector requests (dm-crypt
//! without extended requests) and once in 4 KiB requests (with them), with the time of every phase.
//!
//! The fused data path ([`SectorCipher`]) runs over the same buffer and request size for reference:
//! what a volume really uses.

use std::time::Instant;

use sectorcrypt_cipher::spec::{CipherName, CipherSpec, IvMode, Mode};
use sectorcrypt_cipher::staged::{PhaseTicks, StagedXts};
use sectorcrypt_cipher::{
    tsc, Algorithm, BackendChoice, Direction, Error, SectorCipher, SectorOptions,
};
use serde::Serialize;

/// Phase times for one request size and direction, in seconds.
#[derive(Clone, Debug, Serialize)]
pub struct BreakdownRow {
    /// The cipher specification.
    pub cipher: String,
    /// The whole key size in bits.
    pub key_bits: usize,
    /// The backend that ran.
    pub backend: String,
    /// `encrypt` or `decrypt`.
    pub op: &'static str,
    /// Bytes processed in all.
    pub total_bytes: usize,
    /// Bytes per request.
    pub request_size: usize,
    /// Time of the staged path in all.
    pub total_s: f64,
    /// Computing the tweaks (the sectors' IVs encrypted).
    pub tweak_s: f64,
    /// The first XOR with the tweaks.
    pub xor1_s: f64,
    /// The block cipher in ECB over the whole request.
    pub ecb_s: f64,
    /// The second XOR with the tweaks.
    pub xor2_s: f64,
    /// What is left: splitting, loops, bookkeeping.
    pub other_s: f64,
    /// The same data through the fused extended-request path.
    pub fused_s: f64,
}

/// Measure every request size in `request_sizes` (each a multiple of 512) in direction `dir`.
pub fn measure(
    alg: Algorithm,
    key_bits: usize,
    total_bytes: usize,
    request_sizes: &[usize],
    dir: Direction,
    backend: BackendChoice,
) -> Result<Vec<BreakdownRow>, Error> {
    let key = crate::random_buffer(key_bits / 8);
    let spec = CipherSpec {
        cipher: CipherName::Block(alg),
        mode: Mode::Xts,
        iv: IvMode::Plain64,
    };
    let mut staged = StagedXts::new(alg, &key, 512, backend)?;
    let fused = SectorCipher::new(
        spec,
        &key,
        &SectorOptions {
            sector_size: 512,
            backend,
            ..Default::default()
        },
    )?;
    let mut buf = crate::random_buffer(total_bytes - total_bytes % 4096);
    let rate = tsc::ticks_per_second();
    let mut rows = Vec::new();
    for &request in request_sizes {
        if request == 0 || request % 512 != 0 || request > buf.len() {
            return Err(Error::NotWholeSectors {
                len: request,
                sector_size: 512,
            });
        }
        let whole = buf.len() - buf.len() % request;
        // One untimed pass warms the caches and the clock, then one timed pass.
        let mut times = PhaseTicks::default();
        for _ in 0..2 {
            times = PhaseTicks::default();
            for (i, r) in buf[..whole].chunks_mut(request).enumerate() {
                staged.process(r, (i * request / 512) as u64, dir, &mut times)?;
            }
        }
        let start = Instant::now();
        for (i, r) in buf[..whole].chunks_mut(request).enumerate() {
            fused.process(r, (i * request / 512) as u64, dir)?;
        }
        let fused_s = start.elapsed().as_secs_f64();
        let s = |t: u64| t as f64 / rate;
        rows.push(BreakdownRow {
            cipher: spec.to_string(),
            key_bits,
            backend: staged.backend().to_string(),
            op: match dir {
                Direction::Encrypt => "encrypt",
                Direction::Decrypt => "decrypt",
            },
            total_bytes: whole,
            request_size: request,
            total_s: s(times.total),
            tweak_s: s(times.tweak),
            xor1_s: s(times.xor1),
            ecb_s: s(times.ecb),
            xor2_s: s(times.xor2),
            other_s: s(times.other()),
            fused_s,
        });
    }
    Ok(rows)
}

/// The paper's table layout: one column pair (time, percent) per request size.
pub fn render(rows: &[BreakdownRow]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut out = format!(
        "Time breakdown of {:.1} MB {}ion, {} ({}-bit key), {} backend, staged (mixed) path\n",
        first.total_bytes as f64 / 1e6,
        first.op,
        first.cipher,
        first.key_bits,
        first.backend
    );
    out += &format!("{:<28}", "");
    for r in rows {
        out += &format!("{:>22}", format!("{}-byte requests", r.request_size));
    }
    out += "\n";
    out += &format!("{:<28}", "");
    for _ in rows {
        out += &format!("{:>13}{:>9}", "Time (ms)", "%");
    }
    out += "\n";
    let ecb_label = if first.op == "encrypt" {
        "ECB encryption time"
    } else {
        "ECB decryption time"
    };
    type Field = fn(&BreakdownRow) -> f64;
    let lines: [(&str, Field); 6] = [
        ("Total time", |r| r.total_s),
        ("Tweak computation time", |r| r.tweak_s),
        ("First XOR time", |r| r.xor1_s),
        ("Second XOR time", |r| r.xor2_s),
        ("", |r| r.ecb_s),
        ("Other time", |r| r.other_s),
    ];
    for (label, get) in lines {
        let label = if label.is_empty() { ecb_label } else { label };
        out += &format!("{label:<28}");
        for r in rows {
            out += &format!("{:>13.2}{:>9.2}", get(r) * 1e3, 100.0 * get(r) / r.total_s);
        }
        out += "\n";
    }
    out += &format!("{:<28}", "Fused extended request");
    for r in rows {
        out += &format!("{:>13.2}{:>9}", r.fused_s * 1e3, "");
    }
    out += "\n";
    if let [a, b, ..] = rows {
        out += &format!(
            "Staged total {:.2}x faster with {}-byte requests than with {}-byte requests; tweak time {:.2}x, other time {:.2}x.\n",
            a.total_s / b.total_s,
            b.request_size,
            a.request_size,
            a.tweak_s / b.tweak_s,
            a.other_s / b.other_s.max(f64::MIN_POSITIVE)
        );
    }
    out
}
