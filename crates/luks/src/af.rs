//! The LUKS anti-forensic information splitter (Fruhwirth, "TKS1"; LUKS1 and LUKS2 `luks2`
//! keyslots alike): a key is stored as `stripes` blocks so that destroying any one block destroys
//! the key. Merge: `d = 0; for each block but the last: d = H(d ^ block)`; `key = d ^ last`, where
//! the diffusion `H` hashes each digest-sized piece `j` of `d` as `hash(be32(j) || piece)`.

use rand::RngCore;
use sectorcrypt_secret::SecretBytes;

use crate::hash::Hash;

/// The diffusion step: every digest-sized piece of `d` replaced by `hash(be32(j) || piece)`.
fn diffuse(hash: Hash, d: &mut [u8]) {
    let mut out = [0u8; 64];
    for (j, piece) in d.chunks_mut(hash.digest_len()).enumerate() {
        let n = piece.len();
        hash.digest_into(&[&(j as u32).to_be_bytes(), piece], &mut out[..n]);
        piece.copy_from_slice(&out[..n]);
    }
}

/// Recover a `key_len`-byte key from `material` (`stripes * key_len` bytes).
pub fn merge(material: &[u8], key_len: usize, stripes: usize, hash: Hash) -> SecretBytes {
    debug_assert_eq!(material.len(), key_len * stripes);
    let mut d = SecretBytes::zeroed(key_len);
    let mut blocks = material.chunks_exact(key_len);
    for block in blocks.by_ref().take(stripes - 1) {
        xor(&mut d, block);
        diffuse(hash, &mut d);
    }
    if let Some(last) = blocks.next() {
        xor(&mut d, last);
    }
    d
}

/// Split `key` into `stripes` blocks of random-looking material.
pub fn split(key: &[u8], stripes: usize, hash: Hash) -> SecretBytes {
    let n = key.len();
    let mut material = SecretBytes::zeroed(n * stripes);
    rand::rngs::OsRng.fill_bytes(&mut material[..n * (stripes - 1)]);
    let mut d = SecretBytes::zeroed(n);
    for block in material[..n * (stripes - 1)].chunks_exact(n) {
        xor(&mut d, block);
        diffuse(hash, &mut d);
    }
    let last = &mut material[n * (stripes - 1)..];
    last.copy_from_slice(&d);
    xor(last, key);
    material
}

fn xor(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_merge_is_the_identity() {
        for hash in [Hash::Sha1, Hash::Sha256, Hash::Sha512] {
            for key_len in [16, 32, 48, 64, 100] {
                let key: Vec<u8> = (0..key_len as u8).collect();
                let m = split(&key, 4000, hash);
                assert_eq!(&merge(&m, key_len, 4000, hash)[..], &key[..]);
                let mut damaged = m.to_vec();
                damaged[key_len * 17] ^= 1;
                assert_ne!(
                    &merge(&damaged, key_len, 4000, hash)[..],
                    &key[..],
                    "one flipped bit must destroy the key"
                );
            }
        }
    }

    /// A fixed value computed independently with Python (hashlib), so the diffusion's byte
    /// order and piece numbering are pinned: stripes=3, sha256, 40-byte key, material = bytes 0..120.
    #[test]
    fn merge_matches_an_independent_computation() {
        let material: Vec<u8> = (0..120u8).collect();
        let key = merge(&material, 40, 3, Hash::Sha256);
        assert_eq!(
            hex::encode(&key[..]),
            "512bb18e314d508ff96bf0476fe763960d7fee88a203f1a8f60786529f022801fa236647e64a8536"
        );
    }
}
