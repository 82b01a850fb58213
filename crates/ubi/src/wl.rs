//! The pool of PEBs (the kernel's `wl.c`): erase counters, the free PEBs, which PEB a write
//! gets, erasing a PEB given back, bad PEBs and their reserve, and the choice of wear-levelling
//! moves.
//!
//! A write gets the free PEB with the lowest erase counter. Wear-levelling moves the data of the
//! least-worn used PEB to the most-worn free one once their counters differ by the threshold
//! (the kernel's `UBI_WL_THRESHOLD`, 4096 by default), so that PEBs holding data that never
//! changes still take their share of erases. A PEB given back is erased (and its new counter
//! written) at once rather than in the background, so the pool never holds PEBs waiting for an
//! erase; a PEB that fails to erase, or fails torture after a failed write, is marked bad and
//! replaces a PEB of the bad-block reserve.

use std::collections::BTreeSet;

use sectorcrypt_flash::Error as FlashError;

use crate::io::Io;
use crate::Error;

/// What a PEB is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// Marked bad.
    Bad,
    /// Erased, EC header written, in the free set.
    Free,
    /// Holds a LEB.
    Used,
    /// Kept as found (corrupted, or an internal volume of another implementation).
    Kept,
}

/// The PEBs and their erase counters.
pub(crate) struct Pool {
    pub(crate) ec: Vec<u64>,
    pub(crate) uses: Vec<Use>,
    free: BTreeSet<(u64, u32)>,
    used: BTreeSet<(u64, u32)>,
    /// Free PEBs found at attach, not erased by this attach: checked before their first use.
    unverified: BTreeSet<u32>,
    /// PEBs left to replace PEBs that go bad.
    pub(crate) beb_rsvd: u32,
    /// PEBs that no volume has reserved.
    pub(crate) avail: u32,
    /// The wear-levelling threshold.
    pub(crate) threshold: u64,
    /// The device turned read-only (a bad PEB with no reserve left).
    pub(crate) read_only: bool,
}

impl Pool {
    pub(crate) fn new(ec: Vec<u64>, uses: Vec<Use>, threshold: u64) -> Pool {
        let mut pool = Pool {
            free: BTreeSet::new(),
            used: BTreeSet::new(),
            unverified: BTreeSet::new(),
            ec,
            uses,
            beb_rsvd: 0,
            avail: 0,
            threshold,
            read_only: false,
        };
        for peb in 0..pool.uses.len() as u32 {
            pool.index(peb, true);
            if pool.uses[peb as usize] == Use::Free {
                pool.unverified.insert(peb);
            }
        }
        pool
    }

    /// Add `peb` to (or remove it from) the set its use puts it in.
    fn index(&mut self, peb: u32, add: bool) {
        let key = (self.ec[peb as usize], peb);
        let set = match self.uses[peb as usize] {
            Use::Free => &mut self.free,
            Use::Used => &mut self.used,
            Use::Bad | Use::Kept => return,
        };
        if add {
            set.insert(key);
        } else {
            set.remove(&key);
        }
    }

    fn set_use(&mut self, peb: u32, to: Use) {
        self.index(peb, false);
        self.uses[peb as usize] = to;
        self.index(peb, true);
    }

    /// PEBs in use `u`.
    pub(crate) fn count(&self, u: Use) -> u32 {
        self.uses.iter().filter(|&&x| x == u).count() as u32
    }

    /// A free PEB for a write (the least worn), now in use.
    ///
    /// A PEB found free at attach is first checked to read erased past its EC header: a power
    /// cut below UBI (inside an encryption layer's rewrite of a whole block, or an erase on a
    /// chip with unstable bits) can leave a valid EC header over a block that is not erased,
    /// and a write there would AND new data into old bits. Such a PEB is erased again.
    ///
    /// Errors: [`Error::NoSpace`] when none is free.
    pub(crate) fn get(&mut self, io: &Io) -> Result<u32, Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        loop {
            let Some(&(_, peb)) = self.free.iter().next() else {
                return Err(Error::NoSpace("no free PEB is left".into()));
            };
            self.set_use(peb, Use::Used);
            if self.verified(io, peb)? {
                return Ok(peb);
            }
        }
    }

    /// Stop using every PEB below `first` that is free (they leave UBI until the next attach),
    /// taking their place from the available PEBs.
    ///
    /// Errors: [`Error::NoSpace`] when fewer PEBs are available than that.
    pub(crate) fn give_away_free_below(&mut self, first: u32) -> Result<(), Error> {
        let below: Vec<u32> = (0..first.min(self.uses.len() as u32))
            .filter(|&p| self.uses[p as usize] == Use::Free)
            .collect();
        let n = below.len() as u32;
        if n > self.avail {
            return Err(Error::NoSpace(format!(
                "{n} PEBs must leave UBI, only {} are available (shrink or remove a volume)",
                self.avail
            )));
        }
        self.avail -= n;
        for peb in below {
            self.set_use(peb, Use::Kept);
        }
        Ok(())
    }

    /// Whether `peb` (just taken from the free set) may be written; if it was found free at
    /// attach and does not read erased, it is erased again (and is free again, or bad).
    fn verified(&mut self, io: &Io, peb: u32) -> Result<bool, Error> {
        if !self.unverified.remove(&peb) || io.erased_after_ec(peb)? {
            return Ok(true);
        }
        self.put(io, peb, false)?;
        Ok(false)
    }

    /// Give `peb` back: erase it, write its new erase counter, make it free. `torture`: a write
    /// failed on it, so test it first. A PEB that fails is marked bad.
    pub(crate) fn put(&mut self, io: &Io, peb: u32, torture: bool) -> Result<(), Error> {
        let mut ec = self.ec[peb as usize];
        if torture {
            match io.torture(peb)? {
                Some(erases) => ec += erases,
                None => return self.give_up(io, peb),
            }
        }
        match io.erase_with_ec(peb, ec + 1) {
            Ok(()) => {
                self.index(peb, false);
                self.ec[peb as usize] = ec + 1;
                self.uses[peb as usize] = Use::Free;
                self.index(peb, true);
                Ok(())
            }
            Err(Error::Flash(FlashError::EraseFailed(_) | FlashError::ProgramFailed { .. })) => {
                self.give_up(io, peb)
            }
            Err(e) => Err(e),
        }
    }

    /// Mark `peb` bad and take its place from the reserve (or from the available PEBs; with
    /// neither, the device turns read-only, as the kernel's does).
    fn give_up(&mut self, io: &Io, peb: u32) -> Result<(), Error> {
        io.flash.mark_bad(peb)?;
        self.set_use(peb, Use::Bad);
        if self.beb_rsvd > 0 {
            self.beb_rsvd -= 1;
        } else if self.avail > 0 {
            self.avail -= 1;
        } else {
            self.read_only = true;
        }
        Ok(())
    }

    /// A wear-levelling move to make, if one is due: (the least-worn used PEB, the most-worn
    /// free PEB) when their counters differ by the threshold or more.
    pub(crate) fn wear_levelling_move(&self) -> Option<(u32, u32)> {
        let &(low, from) = self.used.iter().next()?;
        let &(high, to) = self.free.iter().next_back()?;
        (high >= low + self.threshold).then_some((from, to))
    }

    /// Take the free PEB `peb` for a move: `false` if it had to be erased again first (see
    /// [`Pool::get`]; choose again).
    pub(crate) fn take(&mut self, io: &Io, peb: u32) -> Result<bool, Error> {
        debug_assert_eq!(self.uses[peb as usize], Use::Free);
        self.set_use(peb, Use::Used);
        self.verified(io, peb)
    }

    /// Erase counters of the good PEBs: (min, mean, max).
    pub(crate) fn ec_stats(&self) -> (u64, u64, u64) {
        let good: Vec<u64> = (0..self.uses.len())
            .filter(|&p| self.uses[p] != Use::Bad)
            .map(|p| self.ec[p])
            .collect();
        if good.is_empty() {
            return (0, 0, 0);
        }
        let sum: u64 = good.iter().sum();
        (
            *good.iter().min().unwrap_or(&0),
            sum / good.len() as u64,
            *good.iter().max().unwrap_or(&0),
        )
    }
}
