//! Cycles per 4096-byte operation for ECB, CBC, CTR and XTS, encrypt and decrypt, by cipher and
//! key size: the table Linux's `tcrypt` speed test prints and the LEA kernel patch quotes.
//! One XTS operation is one 4096-byte data unit; CBC and CTR chain over the 4096 bytes.

use sectorcrypt_cipher::modes::{self, Xts};
use sectorcrypt_cipher::{block_cipher, tsc, Algorithm, BackendChoice, Direction, Error};
use serde::Serialize;

/// Bytes per operation, as in the patch's table.
pub const OP_BYTES: usize = 4096;

/// One line of the table.
#[derive(Clone, Debug, Serialize)]
pub struct TcryptRow {
    /// The block cipher.
    pub cipher: &'static str,
    /// The mode.
    pub mode: &'static str,
    /// The key size in bits.
    pub key_bits: usize,
    /// The backend that ran.
    pub backend: String,
    /// Time-stamp counter ticks per encrypted block.
    pub encrypt_cycles: f64,
    /// Time-stamp counter ticks per decrypted block.
    pub decrypt_cycles: f64,
}

/// Median cycles of one call of `op` (after a warm-up).
fn cycles(mut op: impl FnMut()) -> f64 {
    const BATCH: u32 = 32;
    for _ in 0..8 {
        op();
    }
    let samples = (0..16)
        .map(|_| {
            let t0 = tsc::now();
            for _ in 0..BATCH {
                op();
            }
            (tsc::now() - t0) as f64 / f64::from(BATCH)
        })
        .collect();
    crate::median(samples)
}

/// The block ciphers named by `ciphers` (`aes-...`, `lea-...`), each once; both when empty.
///
/// Errors: a cipher this table does not cover.
pub fn algorithms(ciphers: &[String]) -> Result<Vec<Algorithm>, String> {
    if ciphers.is_empty() {
        return Ok(vec![Algorithm::Aes, Algorithm::Lea]);
    }
    let mut algs = Vec::new();
    for c in ciphers {
        let alg = match c.split('-').next().unwrap_or("") {
            "aes" => Algorithm::Aes,
            "lea" => Algorithm::Lea,
            _ => {
                return Err(format!(
                    "cipher '{c}' cannot be benchmarked this way (use aes or lea)"
                ))
            }
        };
        if !algs.contains(&alg) {
            algs.push(alg);
        }
    }
    Ok(algs)
}

/// Measure every mode and key size of `alg`.
pub fn measure(alg: Algorithm, backend: BackendChoice) -> Result<Vec<TcryptRow>, Error> {
    let mut rows = Vec::new();
    let mut buf = crate::random_buffer(OP_BYTES);
    let iv = [0x24u8; 16];
    for key_bits in [128, 192, 256] {
        let key = crate::random_buffer(key_bits / 8);
        let e = block_cipher(alg, &key, backend)?;
        let e = e.as_ref();
        // The buffer length is fixed, so one checked call of each mode validates every timed call.
        modes::ecb(e, &mut buf, Direction::Encrypt)?;
        modes::cbc(e, &iv, &mut buf, Direction::Encrypt)?;
        let mut row = |mode: &'static str, enc: f64, dec: f64| {
            rows.push(TcryptRow {
                cipher: alg.name(),
                mode,
                key_bits,
                backend: e.backend().to_string(),
                encrypt_cycles: enc,
                decrypt_cycles: dec,
            })
        };
        let ecb_e = cycles(|| drop(modes::ecb(e, &mut buf, Direction::Encrypt)));
        let ecb_d = cycles(|| drop(modes::ecb(e, &mut buf, Direction::Decrypt)));
        row("ecb", ecb_e, ecb_d);
        let cbc_e = cycles(|| drop(modes::cbc(e, &iv, &mut buf, Direction::Encrypt)));
        let cbc_d = cycles(|| drop(modes::cbc(e, &iv, &mut buf, Direction::Decrypt)));
        row("cbc", cbc_e, cbc_d);
        let ctr = cycles(|| modes::ctr(e, &iv, &mut buf));
        row("ctr", ctr, ctr);
    }
    for key_bits in [256, 384, 512] {
        let key = crate::random_buffer(key_bits / 8);
        let xts = Xts::new(alg, &key, backend)?;
        xts.encrypt_unit(&mut buf, &iv)?;
        let enc = cycles(|| drop(xts.encrypt_unit(&mut buf, &iv)));
        let dec = cycles(|| drop(xts.decrypt_unit(&mut buf, &iv)));
        rows.push(TcryptRow {
            cipher: alg.name(),
            mode: "xts",
            key_bits,
            backend: xts.backend().to_string(),
            encrypt_cycles: enc,
            decrypt_cycles: dec,
        });
    }
    Ok(rows)
}

/// The table as text, in the patch's "cipher mode key: encrypt / decrypt" style.
pub fn render(rows: &[TcryptRow]) -> String {
    let mut out =
        format!("# cycles per {OP_BYTES}-byte operation (tcrypt style), encrypt / decrypt\n");
    for r in rows {
        out += &format!(
            "- {}-{} {} {}-bit key: {:>8} / {:>8}\n",
            r.cipher,
            r.backend,
            r.mode,
            r.key_bits,
            group(r.encrypt_cycles),
            group(r.decrypt_cycles)
        );
    }
    out
}

/// 12345.6 -> "12,346".
fn group(v: f64) -> String {
    let digits = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn groups_thousands() {
        assert_eq!(super::group(2177.4), "2,177");
        assert_eq!(super::group(12.0), "12");
        assert_eq!(super::group(1234567.0), "1,234,567");
    }
}
