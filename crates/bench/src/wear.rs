//! Program/erase cycles per eraseblock when a recorded UBI trace ([`Trace`]) is replayed on a
//! simulated chip, with UBI straight on it or behind the encryption layer: the thesis'
//! measurement (it found 24.43x the erases of plain UBI under iozone) with Linux's own UBI and
//! UBIFS having made the requests. The chip's own erase counts are the ground truth: every
//! erase the layer adds is counted, whatever UBI's erase counters say.

use std::sync::Arc;

use sectorcrypt_cipher::CipherSpec;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::trace::Trace;
use sectorcrypt_flash::{Error, Flash, Geometry};
use sectorcrypt_storage::MemStorage;
use serde::Serialize;

use crate::flash::Stack;

/// Erases per eraseblock: lowest, mean, highest.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Spread {
    /// The least-erased eraseblock's count.
    pub min: u64,
    /// The mean over all eraseblocks.
    pub mean: f64,
    /// The most-erased eraseblock's count.
    pub max: u64,
}

impl Spread {
    /// The spread of UBI's eraseblocks' `counts`, the mean charged with `extra` erases of
    /// blocks outside UBI (the layer's journal): erases the chip paid for UBI's blocks.
    fn of(counts: &[u64], extra: u64) -> Spread {
        Spread {
            min: counts.iter().copied().min().unwrap_or(0),
            mean: (counts.iter().sum::<u64>() + extra) as f64 / counts.len().max(1) as f64,
            max: counts.iter().copied().max().unwrap_or(0),
        }
    }
}

/// One trace replayed on one stack.
#[derive(Clone, Debug, Serialize)]
pub struct Wear {
    /// The trace's name.
    pub trace: String,
    /// `plain`, or the cipher and policy.
    pub stack: String,
    /// Erases per eraseblock during the workload (after `# workload starts`).
    pub workload: Spread,
    /// Erases per eraseblock over the whole trace (attach, format and unmount included).
    pub whole: Spread,
    /// Erases during the workload per GiB the workload wrote into UBI's data areas.
    pub erases_per_gib: f64,
    /// Erases of the layer's rewrite journal during the workload (in the means above).
    pub journal_erases: u64,
    /// Erases of each of the chip's eraseblocks during the workload, by number (UBI's, then the
    /// layer's journal's if it has one). Not in the JSON lines, which stay one short row each;
    /// [`crate::report`]'s `results.json` has them.
    #[serde(skip)]
    pub per_peb: Vec<u64>,
}

/// Replay `trace` (called `name`) on a fresh simulated chip of its geometry, through `stack`.
///
/// Errors: what the chip or the layer answers (a trace of a real UBI keeps NAND's rules).
pub fn replay(trace: &Trace, name: &str, stack: Stack) -> Result<Wear, Error> {
    let g = Geometry {
        peb_count: trace.geometry.peb_count + stack.journal_blocks(trace.geometry.peb_count),
        ..trace.geometry
    };
    let sim = Arc::new(SimNand::create(
        MemStorage::new(vec![0; SimNand::image_len(&g) as usize]),
        g,
        &[],
    )?);
    let (flash, crypt) =
        stack.over(Arc::clone(&sim) as Arc<dyn Flash>, trace.geometry.peb_count)?;
    let counts = || -> Vec<u64> { sim.erase_counts().iter().map(|&c| u64::from(c)).collect() };
    let mut at_start = Vec::new();
    let mut hidden = Ok(0);
    trace.replay(&*flash, &mut || {
        if let (Stack::Reattached(..), Some(c)) = (stack, &crypt) {
            hidden = c.hide_free_space();
        }
        at_start = counts();
    })?;
    hidden?;
    // The trace ends with UBI detached: the layer hides what is free.
    if let Some(c) = &crypt {
        c.hide_free_space()?;
    }
    let end = counts();
    let during: Vec<u64> = end.iter().zip(&at_start).map(|(e, s)| e - s).collect();
    let ubi = trace.geometry.peb_count as usize;
    let journal = |c: &[u64]| c[ubi..].iter().sum::<u64>();
    let gib = trace.workload_data_bytes() as f64 / f64::from(1u32 << 30);
    Ok(Wear {
        trace: name.to_string(),
        stack: stack.name(),
        workload: Spread::of(&during[..ubi], journal(&during)),
        whole: Spread::of(&end[..ubi], journal(&end)),
        erases_per_gib: during.iter().sum::<u64>() as f64 / gib.max(f64::MIN_POSITIVE),
        journal_erases: journal(&during),
        per_peb: during,
    })
}

/// The stacks a study compares: plain UBI; the default policy (free space hidden at rest), also
/// with one more attach before the workload; hidden at every sync; the thesis policy (its
/// CBC-ESSIV and XTS); erased space left visible.
pub fn study_stacks() -> Vec<Stack> {
    let xts = CipherSpec::parse("aes-xts-plain64").expect("built-in spec");
    let cbc = CipherSpec::parse("aes-cbc-essiv:sha256").expect("built-in spec");
    use sectorcrypt_flash::crypt::Policy;
    vec![
        Stack::Plain,
        Stack::Encrypted(xts, Policy::AtRest),
        Stack::Reattached(xts, Policy::AtRest),
        Stack::Encrypted(xts, Policy::Synced),
        Stack::Encrypted(cbc, Policy::Thesis),
        Stack::Encrypted(xts, Policy::Thesis),
        Stack::Encrypted(xts, Policy::Visible),
    ]
}
