//! Sizes as users write them (command-line options, `nanddump:` device names), with cryptsetup's
//! units.

/// A size in bytes with an optional unit, as cryptsetup takes them: `S` (512-byte sectors),
/// `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (powers of 1024), `KB`, `MB`, `GB`, `TB` (of 1000).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text[digits.len()..];
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{text}' is not a size (a number with an optional unit: 32M)"))?;
    let scale: u64 = match unit {
        "" => 1,
        "S" | "s" => 512,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        "G" | "g" | "GiB" => 1 << 30,
        "T" | "t" | "TiB" => 1 << 40,
        "KB" | "kB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "'{unit}' is not a size unit (S, K, M, G, T, KB, MB, ...)"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("'{text}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_cryptsetups_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("32MiB"), Ok(32 << 20));
        assert_eq!(parse_size("2048S"), Ok(1 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2KB"), Ok(2000));
        for bad in ["", "M", "12X", "-1M", "1.5M", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
