//! Encrypt a volume file in the working tree and read it back: the project's main job on its
//! embedded default, with no root and no device.
//!
//! `cargo run --release --example volume_roundtrip -- [DIR] [MIB]` writes `DIR/plain.img` (MIB MiB,
//! default 256), encrypts it into `DIR/volume.img` with aes-xts-plain64 (512-bit random key, kept
//! in memory only), decrypts the volume again, checks every byte, and prints the speed of each
//! step next to cipher_null (the same path without encryption) and lea-xts-plain64.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::{rngs::OsRng, RngCore, SeedableRng};
use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_cipher::{SectorCipher, SectorOptions};
use zeroize::Zeroizing;

const REQUEST: usize = 1 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("volume_roundtrip: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "demo".into()));
    let mib: usize = match args.next() {
        Some(s) => s
            .parse()
            .map_err(|_| format!("size '{s}' is not a number of MiB"))?,
        None => 256,
    };
    if mib == 0 {
        return Err("the size must be at least 1 MiB".into());
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let plain = dir.join("plain.img");
    let volume = dir.join("volume.img");
    write_plain(&plain, mib)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "plaintext image: {} ({mib} MiB); requests of {} KiB, {threads} threads",
        plain.display(),
        REQUEST >> 10
    );
    println!("MiB/s: 'file' = read + cipher + write through the page cache, 'cipher' = inside the cipher");
    println!(
        "{:<18} {:>8} {:>19} {:>19} {:>11}",
        "cipher", "backend", "encrypt", "decrypt", "round trip"
    );
    println!(
        "{:<18} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "", "", "file", "cipher", "file", "cipher"
    );
    for (spec, key_len) in [
        ("cipher_null-ecb", 0),
        ("aes-xts-plain64", 64),
        ("lea-xts-plain64", 64),
    ] {
        let mut key = Zeroizing::new(vec![0u8; key_len]);
        OsRng.fill_bytes(&mut key);
        let opts = SectorOptions {
            threads,
            ..Default::default()
        };
        let cipher = SectorCipher::new(
            CipherSpec::parse(spec).map_err(|e| e.to_string())?,
            &key,
            &opts,
        )
        .map_err(|e| e.to_string())?;
        let enc = transform(&cipher, &plain, &volume, true)?;
        let restored = dir.join("restored.img");
        let dec = transform(&cipher, &volume, &restored, false)?;
        let same = files_equal(&plain, &restored)?;
        let differs = spec.starts_with("cipher_null") || !files_equal(&plain, &volume)?;
        std::fs::remove_file(&restored).map_err(|e| e.to_string())?;
        let rate = |t: f64| format!("{:.0}", mib as f64 / t);
        // cipher_null does no work worth a rate.
        let cipher_rate = |t: f64| {
            if spec.starts_with("cipher_null") {
                "-".to_string()
            } else {
                rate(t)
            }
        };
        println!(
            "{:<18} {:>8} {:>9} {:>9} {:>9} {:>9} {:>11}",
            spec,
            cipher.backend().name(),
            rate(enc.0),
            cipher_rate(enc.1),
            rate(dec.0),
            cipher_rate(dec.1),
            if same && differs { "ok" } else { "MISMATCH" }
        );
        if !(same && differs) {
            return Err(format!(
                "{spec}: the round trip did not restore the plaintext"
            ));
        }
    }
    println!(
        "encrypted volume left at {} (aes-xts-plain64 would need its key; this demo keeps none)",
        volume.display()
    );
    Ok(())
}

/// A plaintext image with incompressible content and a readable marker in every MiB.
fn write_plain(path: &Path, mib: usize) -> Result<(), String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(mib as u64);
    let mut f = File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut buf = vec![0u8; REQUEST];
    for i in 0..mib {
        rng.fill_bytes(&mut buf);
        let marker = format!("sectorcrypt demo plaintext, MiB {i}\n");
        buf[..marker.len()].copy_from_slice(marker.as_bytes());
        f.write_all(&buf)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    f.sync_all().map_err(|e| e.to_string())
}

/// Stream `from` into `to` through the cipher, 1 MiB requests; returns the seconds taken in all
/// and inside the cipher.
fn transform(
    cipher: &SectorCipher,
    from: &Path,
    to: &Path,
    encrypt: bool,
) -> Result<(f64, f64), String> {
    let mut src = File::open(from).map_err(|e| format!("cannot open {}: {e}", from.display()))?;
    let mut dst = File::create(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    let sectors_per_request = (REQUEST / cipher.sector_size()) as u64;
    let mut buf = vec![0u8; REQUEST];
    let start = Instant::now();
    let mut in_cipher = 0.0;
    for request in 0u64.. {
        let n = read_full(&mut src, &mut buf)
            .map_err(|e| format!("cannot read {}: {e}", from.display()))?;
        if n == 0 {
            break;
        }
        let chunk = &mut buf[..n];
        let first = request * sectors_per_request;
        let t = Instant::now();
        let r = if encrypt {
            cipher.encrypt(chunk, first)
        } else {
            cipher.decrypt(chunk, first)
        };
        in_cipher += t.elapsed().as_secs_f64();
        r.map_err(|e| e.to_string())?;
        dst.write_all(chunk)
            .map_err(|e| format!("cannot write {}: {e}", to.display()))?;
    }
    dst.flush().map_err(|e| e.to_string())?;
    Ok((start.elapsed().as_secs_f64(), in_cipher))
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn files_equal(a: &Path, b: &Path) -> Result<bool, String> {
    let (mut fa, mut fb) = (
        File::open(a).map_err(|e| e.to_string())?,
        File::open(b).map_err(|e| e.to_string())?,
    );
    let (mut ba, mut bb) = (vec![0u8; REQUEST], vec![0u8; REQUEST]);
    loop {
        let na = read_full(&mut fa, &mut ba).map_err(|e| e.to_string())?;
        let nb = read_full(&mut fb, &mut bb).map_err(|e| e.to_string())?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}
