//! The encrypted flash's tests, one binary: the header, the chip's ciphertext and the standard
//! tools (`encrypted`), power cuts through the encryption layer (`power_cut`), and in-place
//! conversion (`convert`).

mod convert;
mod encrypted;
mod power_cut;

use sectorcrypt_flash::crypt::Policy;
use sectorcrypt_flashvol::NewFlash;
use sectorcrypt_luks::{FormatOptions, PbkdfChoice, PbkdfOptions};

/// A new encrypted flash's options with `cipher` (default key size unless `key_bits`) and fast
/// key derivation.
fn new_flash(policy: Policy, cipher: &str, key_bits: Option<usize>) -> NewFlash {
    NewFlash {
        luks: FormatOptions {
            version: 2,
            cipher: Some(cipher.into()),
            key_bits,
            pbkdf: PbkdfOptions {
                kind: Some(PbkdfChoice::Pbkdf2),
                force_iterations: Some(1000),
                ..Default::default()
            },
            ..Default::default()
        },
        policy,
        keyslots: None,
    }
}

/// The same with AES-XTS and a 256-bit key (small header areas for small test chips).
fn small_key(policy: Policy) -> NewFlash {
    new_flash(policy, "aes-xts-plain64", Some(256))
}
