//! AES round keys, as a key-residue check looks for them: a core or a stack holding any one
//! round key gives away the key (AES's key schedule runs backwards from any `Nk` consecutive
//! words), and only the first one or two are bytes of the key itself.
//!
//! A plain, table-free key expansion (FIPS-197 section 5.2), independent of the cipher crate's.

/// Every round key of `key` (16, 24 or 32 bytes) in both the forms an engine may keep: as the
/// cipher uses them, and the inner ones through InvMixColumns, as AES-NI's and VAES's
/// decryption (`aesdec`, the equivalent inverse cipher) uses them.
pub fn aes_round_keys(key: &[u8]) -> Vec<[u8; 16]> {
    let encryption = expand(key);
    let inner = &encryption[1..encryption.len() - 1];
    let mut all = encryption.clone();
    all.extend(inner.iter().map(inv_mix_columns));
    all
}

/// The encryption round keys, first to last.
fn expand(key: &[u8]) -> Vec<[u8; 16]> {
    assert!(
        matches!(key.len(), 16 | 24 | 32),
        "an AES key is 16, 24 or 32 bytes"
    );
    let nk = key.len() / 4;
    let rounds = nk + 6;
    let mut words: Vec<[u8; 4]> = key.chunks(4).map(|c| [c[0], c[1], c[2], c[3]]).collect();
    let mut rcon = 1u8;
    for i in nk..4 * (rounds + 1) {
        let mut t = words[i - 1];
        if i % nk == 0 {
            t = [sbox(t[1]) ^ rcon, sbox(t[2]), sbox(t[3]), sbox(t[0])];
            rcon = xtime(rcon);
        } else if nk > 6 && i % nk == 4 {
            t = t.map(sbox);
        }
        let back = words[i - nk];
        words.push(std::array::from_fn(|j| back[j] ^ t[j]));
    }
    words
        .chunks(4)
        .map(|w| std::array::from_fn(|j| w[j / 4][j % 4]))
        .collect()
}

fn xtime(b: u8) -> u8 {
    (b << 1) ^ if b & 0x80 != 0 { 0x1b } else { 0 }
}

fn mul(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        a = xtime(a);
        b >>= 1;
    }
    product
}

/// The S-box from its definition: the inverse in GF(2^8), then the affine map.
fn sbox(b: u8) -> u8 {
    let inverse = (1..=255u8).find(|&x| mul(b, x) == 1).unwrap_or(0);
    inverse
        ^ inverse.rotate_left(1)
        ^ inverse.rotate_left(2)
        ^ inverse.rotate_left(3)
        ^ inverse.rotate_left(4)
        ^ 0x63
}

fn inv_mix_columns(block: &[u8; 16]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (col, c) in block.chunks(4).enumerate() {
        for row in 0..4 {
            out[4 * col + row] = mul(c[row], 14)
                ^ mul(c[(row + 1) % 4], 11)
                ^ mul(c[(row + 2) % 4], 13)
                ^ mul(c[(row + 3) % 4], 9);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex16(s: &str) -> [u8; 16] {
        std::array::from_fn(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
    }

    /// FIPS-197 appendix A: the expansions' last words, and appendix C's AES-256 key.
    #[test]
    fn round_keys_match_fips_197() {
        let key128 = hex16("2b7e151628aed2a6abf7158809cf4f3c");
        let keys = expand(&key128);
        assert_eq!(keys.len(), 11);
        assert_eq!(keys[10], hex16("d014f9a8c9ee2589e13f0cc8b6630ca6"));
        let key256: Vec<u8> = (0..32).collect();
        let keys = expand(&key256);
        assert_eq!(keys.len(), 15);
        assert_eq!(keys[0], hex16("000102030405060708090a0b0c0d0e0f"));
        assert_eq!(keys[14], hex16("24fc79ccbf0979e9371ac23c6d68de36"));
        // Both forms: 15 round keys and the 13 inner ones through InvMixColumns.
        assert_eq!(aes_round_keys(&key256).len(), 28);
    }

    /// InvMixColumns undoes MixColumns (FIPS-197's column example: db 13 53 45 -> 8e 4d a1 bc).
    #[test]
    fn inv_mix_columns_inverts_the_standard_column() {
        let mixed = hex16("8e4da1bc8e4da1bc8e4da1bc8e4da1bc");
        assert_eq!(
            inv_mix_columns(&mixed),
            hex16("db135345db135345db135345db135345")
        );
    }
}
