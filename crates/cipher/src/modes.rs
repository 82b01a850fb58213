//! Single-data-unit modes: XTS with ciphertext stealing (any unit of at least one block), CBC, CTR
//! and ECB. Volumes use [`crate::sector::SectorCipher`]; these exist for the standard test vectors
//! (IEEE 1619 units that are not a multiple of 16 bytes, KISA LEA CBC/CTR) and for the
//! tcrypt-style benchmark, and they run through the same backend kernels.

use zeroize::Zeroize;

use crate::backend::{Algorithm, Backend, BackendChoice};
use crate::engine::{xor_into, Block, BlockEngine, Direction, BLOCK};
use crate::error::Error;
use crate::gf128::mul_alpha;

/// An XTS key pair: the data key `K1` and the tweak key `K2`.
pub struct Xts {
    pub(crate) data: Box<dyn BlockEngine>,
    pub(crate) tweak: Box<dyn BlockEngine>,
}

impl Xts {
    /// `key` is `K1 || K2`: 32, 48 or 64 bytes.
    pub fn new(alg: Algorithm, key: &[u8], choice: BackendChoice) -> Result<Self, Error> {
        if !matches!(key.len(), 32 | 48 | 64) {
            return Err(Error::KeySize {
                spec: format!("{}-xts", alg.name()),
                bits: key.len() * 8,
                allowed: "256, 384 or 512 bits (two equal halves)",
            });
        }
        let backend = choice.resolve(alg)?;
        let (k1, k2) = key.split_at(key.len() / 2);
        Ok(Xts {
            data: crate::block_cipher(alg, k1, BackendChoice::Exact(backend))?,
            tweak: crate::block_cipher(alg, k2, BackendChoice::Exact(backend))?,
        })
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.data.backend()
    }

    /// Encrypt one data unit of any length >= 16 bytes; `iv` is the tweak input (for disks, the
    /// sector number little endian).
    pub fn encrypt_unit(&self, data: &mut [u8], iv: &Block) -> Result<(), Error> {
        self.unit(data, iv, Direction::Encrypt)
    }

    /// Decrypt one data unit of any length >= 16 bytes.
    pub fn decrypt_unit(&self, data: &mut [u8], iv: &Block) -> Result<(), Error> {
        self.unit(data, iv, Direction::Decrypt)
    }

    fn unit(&self, data: &mut [u8], iv: &Block, dir: Direction) -> Result<(), Error> {
        if data.len() < BLOCK {
            return Err(Error::DataUnitLength {
                len: data.len(),
                mode: "XTS (at least 16 bytes)",
            });
        }
        let mut t = *iv;
        self.tweak.encrypt_ecb(&mut t);
        let rem = data.len() % BLOCK;
        if rem == 0 {
            let len = data.len();
            match dir {
                Direction::Encrypt => self.data.xts_encrypt_units(data, len, &[t]),
                Direction::Decrypt => self.data.xts_decrypt_units(data, len, &[t]),
            }
            t.zeroize();
            return Ok(());
        }
        // Ciphertext stealing (IEEE 1619 section 5.3.2): all full blocks but the last go the normal
        // way; the last full block and the partial one swap their tails.
        let full = data.len() / BLOCK;
        let head = (full - 1) * BLOCK;
        let (body, tail) = data.split_at_mut(head);
        if head > 0 {
            match dir {
                Direction::Encrypt => self.data.xts_encrypt_units(body, head, &[t]),
                Direction::Decrypt => self.data.xts_decrypt_units(body, head, &[t]),
            }
        }
        let mut t_last = t;
        for _ in 0..full - 1 {
            t_last = mul_alpha(t_last);
        }
        let mut t_steal = mul_alpha(t_last);
        let (last_full, partial) = tail.split_at_mut(BLOCK);
        let mut block = [0u8; BLOCK];
        block.copy_from_slice(last_full);
        // Encryption uses T_{m-1} then T_m; decryption applies them in the reverse order.
        let (first_t, second_t) = match dir {
            Direction::Encrypt => (&t_last, &t_steal),
            Direction::Decrypt => (&t_steal, &t_last),
        };
        self.xex_block(&mut block, first_t, dir);
        let mut stolen = [0u8; BLOCK];
        stolen[..rem].copy_from_slice(partial);
        stolen[rem..].copy_from_slice(&block[rem..]);
        partial.copy_from_slice(&block[..rem]);
        self.xex_block(&mut stolen, second_t, dir);
        last_full.copy_from_slice(&stolen);
        for secret in [&mut t, &mut t_last, &mut t_steal, &mut block, &mut stolen] {
            secret.zeroize();
        }
        Ok(())
    }

    fn xex_block(&self, block: &mut Block, t: &Block, dir: Direction) {
        xor_into(block, t);
        match dir {
            Direction::Encrypt => self.data.encrypt_ecb(block),
            Direction::Decrypt => self.data.decrypt_ecb(block),
        }
        xor_into(block, t);
    }
}

fn whole_blocks(data: &[u8], mode: &'static str) -> Result<(), Error> {
    if !data.len().is_multiple_of(BLOCK) {
        return Err(Error::DataUnitLength {
            len: data.len(),
            mode,
        });
    }
    Ok(())
}

/// ECB over whole blocks.
pub fn ecb(engine: &dyn BlockEngine, data: &mut [u8], dir: Direction) -> Result<(), Error> {
    whole_blocks(data, "ECB (whole 16-byte blocks)")?;
    match dir {
        Direction::Encrypt => engine.encrypt_ecb(data),
        Direction::Decrypt => engine.decrypt_ecb(data),
    }
    Ok(())
}

/// CBC over whole blocks, chained from `iv`.
pub fn cbc(
    engine: &dyn BlockEngine,
    iv: &Block,
    data: &mut [u8],
    dir: Direction,
) -> Result<(), Error> {
    whole_blocks(data, "CBC (whole 16-byte blocks)")?;
    if data.is_empty() {
        return Ok(());
    }
    let len = data.len();
    match dir {
        Direction::Encrypt => engine.cbc_encrypt_units(data, len, &[*iv]),
        Direction::Decrypt => engine.cbc_decrypt_units(data, len, &[*iv]),
    }
    Ok(())
}

/// CTR (NIST SP 800-38A): the counter block is a 128-bit big-endian integer starting at
/// `counter`; any data length. Encryption and decryption are the same operation.
pub fn ctr(engine: &dyn BlockEngine, counter: &Block, data: &mut [u8]) {
    const BATCH: usize = 64;
    let mut ks = [0u8; BATCH * BLOCK];
    let mut c = u128::from_be_bytes(*counter);
    for piece in data.chunks_mut(ks.len()) {
        let blocks = piece.len().div_ceil(BLOCK);
        for slot in ks[..blocks * BLOCK].chunks_exact_mut(BLOCK) {
            slot.copy_from_slice(&c.to_be_bytes());
            c = c.wrapping_add(1);
        }
        engine.encrypt_ecb(&mut ks[..blocks * BLOCK]);
        xor_into(piece, &ks[..piece.len()]);
    }
    ks.zeroize();
}
