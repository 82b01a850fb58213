//! dm-crypt's `lmk` IV generator, loop-AES's compatibility mode (its "multi-key-v2" volumes, in the
//! one-key form LUKS1 can hold): the IV of a 512-byte sector is a raw MD5 compression of the
//! sector's plaintext blocks 1 to 31 and its number, so it depends on the data.
//!
//! Encryption derives the IV from the plaintext and runs CBC from it. Decryption runs CBC from a
//! zero IV (blocks 1 to 31 do not depend on the IV), derives the IV from the plaintext blocks 1
//! to 31 so recovered, and XORs it into block 0.
//!
//! MD5 is here for compatibility with existing volumes, not as a security choice. Its compression
//! function takes the same time whatever the data.

use zeroize::Zeroize;

use crate::engine::{Block, BLOCK};

/// The only sector size lmk is defined for (dm-crypt refuses others).
pub(crate) const LMK_SECTOR: usize = 512;

/// MD5's initial state (RFC 1321).
const MD5_INITIAL_STATE: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];

/// The tag word after the sector number in the last hashed block (loop-AES's).
const SECTOR_TAG: u32 = 4024;

/// The lmk IV of a 512-byte sector from its plaintext (block 0 is not read); `iv_sector` is
/// dm-crypt's IV sector number, of which 56 bits are hashed.
///
/// The 496 bytes of blocks 1 to 31 and a 16-byte sector trailer make eight whole MD5 blocks,
/// compressed from MD5's initial state without padding; the state words, little endian, are the
/// IV.
pub(crate) fn iv(sector: &[u8], iv_sector: u64) -> Block {
    debug_assert_eq!(sector.len(), LMK_SECTOR);
    let mut state = MD5_INITIAL_STATE;
    // Blocks 1 to 28 fill seven MD5 blocks; blocks 29 to 31 and the trailer the eighth.
    let (whole, tail) = sector[BLOCK..].as_chunks::<64>();
    md5::block_api::compress(&mut state, whole);
    let mut last = [0u8; 64];
    last[..tail.len()].copy_from_slice(tail);
    let trailer = [
        iv_sector as u32,
        ((iv_sector >> 32) as u32 & 0x00ff_ffff) | 0x8000_0000,
        SECTOR_TAG,
        0,
    ];
    for (out, word) in last[tail.len()..].chunks_exact_mut(4).zip(trailer) {
        out.copy_from_slice(&word.to_le_bytes());
    }
    md5::block_api::compress(&mut state, &[last]);
    // A copy of plaintext.
    last.zeroize();
    let mut iv = [0u8; BLOCK];
    for (out, word) in iv.chunks_exact_mut(4).zip(state) {
        out.copy_from_slice(&word.to_le_bytes());
    }
    iv
}
