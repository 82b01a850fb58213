//! The "mixed" XTS design of the dm-crypt paper (SAMA5D3: an ECB-only AES engine, the CPU doing
//! the tweaks and XORs), as separate, timed passes:
//!
//! 1. **tweak**: build every sector's IV, encrypt them all with the tweak key, and multiply by
//!    alpha to fill one tweak per block;
//! 2. **first XOR**: data ^= tweaks;
//! 3. **ECB**: one ECB call over the whole request (the "co-processor");
//! 4. **second XOR**: data ^= tweaks;
//! 5. **other**: everything else in the call (validation, buffer management), measured as the
//!    total minus the four phases.
//!
//! Called once per 512-byte sector it reproduces the paper's "without extReq" column; called once
//! per 4 KiB page (or more), the "with extReq" column. It is also the reference the fused kernels
//! are tested against: same bytes, simplest structure.

use zeroize::Zeroize;

use crate::backend::{Algorithm, Backend, BackendChoice};
use crate::engine::{xor_into, Direction, BLOCK};
use crate::error::Error;
use crate::gf128;
use crate::modes::Xts;
use crate::tsc;

/// Ticks spent in each phase, summed over calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseTicks {
    /// IV encryption and tweak multiplication.
    pub tweak: u64,
    /// First XOR pass.
    pub xor1: u64,
    /// The ECB pass.
    pub ecb: u64,
    /// Second XOR pass.
    pub xor2: u64,
    /// Total time inside [`StagedXts::process`].
    pub total: u64,
}

impl PhaseTicks {
    /// Time not in any of the four phases.
    pub fn other(&self) -> u64 {
        self.total
            .saturating_sub(self.tweak + self.xor1 + self.ecb + self.xor2)
    }
}

/// XTS with `plain64` IVs in separate passes over an ECB engine.
pub struct StagedXts {
    xts: Xts,
    sector_size: usize,
    tweaks: Vec<u8>,
    ivs: Vec<u8>,
}

impl StagedXts {
    /// `key` is `K1 || K2`; `sector_size` is a dm-crypt sector size.
    pub fn new(
        alg: Algorithm,
        key: &[u8],
        sector_size: usize,
        choice: BackendChoice,
    ) -> Result<Self, Error> {
        if !crate::sector::SECTOR_SIZES.contains(&sector_size) {
            return Err(Error::SectorSize(sector_size));
        }
        Ok(StagedXts {
            xts: Xts::new(alg, key, choice)?,
            sector_size,
            tweaks: Vec::new(),
            ivs: Vec::new(),
        })
    }

    /// The ECB engine's backend.
    pub fn backend(&self) -> Backend {
        self.xts.backend()
    }

    /// Process one request of whole sectors starting at `first_sector` (IVs in 512-byte units as
    /// LUKS2 does), adding each phase's ticks to `times`.
    pub fn process(
        &mut self,
        buf: &mut [u8],
        first_sector: u64,
        dir: Direction,
        times: &mut PhaseTicks,
    ) -> Result<(), Error> {
        let start = tsc::now();
        let ss = self.sector_size;
        if !buf.len().is_multiple_of(ss) {
            return Err(Error::NotWholeSectors {
                len: buf.len(),
                sector_size: ss,
            });
        }
        let sectors = buf.len() / ss;
        let shift = (ss / 512).trailing_zeros();
        first_sector
            .checked_add(sectors as u64)
            .and_then(|end| end.checked_mul(1 << shift))
            .ok_or(Error::SectorOverflow)?;
        self.tweaks.resize(buf.len(), 0);
        self.ivs.resize(sectors * BLOCK, 0);

        let t0 = tsc::now();
        for (k, iv) in self.ivs.chunks_exact_mut(BLOCK).enumerate() {
            iv.fill(0);
            iv[..8].copy_from_slice(&((first_sector + k as u64) << shift).to_le_bytes());
        }
        self.xts.tweak.encrypt_ecb(&mut self.ivs);
        for (iv, tweaks) in self
            .ivs
            .chunks_exact(BLOCK)
            .zip(self.tweaks.chunks_exact_mut(ss))
        {
            gf128::fill_tweaks(iv.try_into().expect("16-byte chunk"), tweaks);
        }
        let t1 = tsc::now();
        xor_into(buf, &self.tweaks);
        let t2 = tsc::now();
        match dir {
            Direction::Encrypt => self.xts.data.encrypt_ecb(buf),
            Direction::Decrypt => self.xts.data.decrypt_ecb(buf),
        }
        let t3 = tsc::now();
        xor_into(buf, &self.tweaks);
        let t4 = tsc::now();

        times.tweak += t1 - t0;
        times.xor1 += t2 - t1;
        times.ecb += t3 - t2;
        times.xor2 += t4 - t3;
        times.total += tsc::now() - start;
        Ok(())
    }
}

impl Drop for StagedXts {
    fn drop(&mut self) {
        self.tweaks.zeroize();
        self.ivs.zeroize();
    }
}
