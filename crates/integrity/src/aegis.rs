//! AEGIS-128, the CAESAR finalist's first version (v1.1), as the kernel's `aegis128`
//! (`crypto/aegis128-core.c`) computes it for dm-crypt's `aegis128-random`: a 16-byte key and
//! nonce, five 16-byte state words, each update one AES round per word (AES-NI where the CPU has
//! it, else RustCrypto's constant-time fixsliced AES), a 16-byte tag.
//!
//! Messages here are whole dm-crypt sectors, so always whole 16-byte blocks; the associated data
//! (24 bytes: sector number and IV) is padded with zeros to whole blocks.

use aes::hazmat::cipher_round;
use aes::Block;
use subtle::ConstantTimeEq;

const C0: [u8; 16] = [
    0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d, 0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62,
];
const C1: [u8; 16] = [
    0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1, 0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd,
];

type Word = [u8; 16];

fn xor(a: &Word, b: &Word) -> Word {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// One AES round of `block` (SubBytes, ShiftRows, MixColumns) with `key` added.
fn aes_round(block: &Word, key: &Word) -> Word {
    let mut b = Block::from(*block);
    cipher_round(&mut b, &Block::from(*key));
    b.into()
}

struct State([Word; 5]);

impl State {
    fn new(key: &Word, nonce: &Word) -> State {
        let key_nonce = xor(key, nonce);
        let mut s = State([key_nonce, C1, C0, xor(key, &C0), xor(key, &C1)]);
        for _ in 0..5 {
            s.update(key);
            s.update(&key_nonce);
        }
        s
    }

    fn update(&mut self, message: &Word) {
        let s = &self.0;
        let mut next = [
            aes_round(&s[4], &s[0]),
            aes_round(&s[0], &s[1]),
            aes_round(&s[1], &s[2]),
            aes_round(&s[2], &s[3]),
            aes_round(&s[3], &s[4]),
        ];
        next[0] = xor(&next[0], message);
        self.0 = next;
    }

    fn keystream(&self) -> Word {
        let s = &self.0;
        std::array::from_fn(|i| s[1][i] ^ s[4][i] ^ (s[2][i] & s[3][i]))
    }

    fn absorb(&mut self, data: &[u8]) {
        for chunk in data.chunks(16) {
            let mut block = [0u8; 16];
            block[..chunk.len()].copy_from_slice(chunk);
            self.update(&block);
        }
    }

    fn tag(mut self, ad_len: usize, message_len: usize) -> Word {
        let mut lengths = [0u8; 16];
        lengths[..8].copy_from_slice(&(ad_len as u64 * 8).to_le_bytes());
        lengths[8..].copy_from_slice(&(message_len as u64 * 8).to_le_bytes());
        let lengths = xor(&lengths, &self.0[3]);
        for _ in 0..7 {
            self.update(&lengths);
        }
        self.0.iter().fold([0u8; 16], |t, w| xor(&t, w))
    }
}

/// Encrypt `data` (whole 16-byte blocks) in place; the tag.
pub(crate) fn seal(key: &Word, nonce: &Word, ad: &[u8], data: &mut [u8]) -> Word {
    debug_assert!(data.len().is_multiple_of(16));
    let mut s = State::new(key, nonce);
    s.absorb(ad);
    for block in data.chunks_exact_mut(16) {
        let plain: Word = block.try_into().expect("16 bytes");
        let z = s.keystream();
        block.copy_from_slice(&xor(&plain, &z));
        s.update(&plain);
    }
    s.tag(ad.len(), data.len())
}

/// Check `tag` and decrypt `data` (whole 16-byte blocks) in place; on a mismatch `data` holds
/// unverified plaintext, which the caller wipes.
pub(crate) fn open(key: &Word, nonce: &Word, ad: &[u8], data: &mut [u8], tag: &[u8]) -> bool {
    debug_assert!(data.len().is_multiple_of(16));
    let mut s = State::new(key, nonce);
    s.absorb(ad);
    for block in data.chunks_exact_mut(16) {
        let cipher: Word = block.try_into().expect("16 bytes");
        let plain = xor(&cipher, &s.keystream());
        block.copy_from_slice(&plain);
        s.update(&plain);
    }
    bool::from(s.tag(ad.len(), data.len()).as_slice().ct_eq(tag))
}
