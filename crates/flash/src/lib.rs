//! Raw NAND flash: one device trait ([`Flash`]) with MTD's operations and results, and its
//! backends.
//!
//! # Why a trait of its own
//!
//! A block device is rewritten in place; NAND is not. Its rules are what UBI is built around and
//! what an encryption layer below UBI must respect: erasing sets a whole eraseblock to 0xFF,
//! programming can only clear bits, a page is programmed at most NOP times between erases, pages of
//! a block are programmed in ascending order, blocks go bad, reads come back with corrected or
//! uncorrectable bit-flips. So the flash stack (the encryption layer, UBI above it) talks to a
//! [`Flash`], never to a `Storage`, and every backend enforces the same rules:
//!
//! - [`sim::SimNand`]: a simulated chip kept in a file (or memory), with per-block erase counts and
//!   per-page program counts as ground truth, nandsim-like fault injection and power cuts.
//! - [`dump::DumpFlash`]: a raw dump in `nanddump`'s layout (data only, or with spare areas), for
//!   exchange with mtd-utils, ubi_reader and the kernel.
//! - [`mtd::MtdFlash`] (Linux): a real NAND chip through its MTD character device (`/dev/mtdN`),
//!   with the kernel's ECC reports, erases and bad-block table.
//!
//! On top of any of them, [`crypt::CryptFlash`] is the encryption layer at the thesis' cut point (a
//! `Flash` storing only ciphertext on another), [`area::BlockArea`] turns a run of eraseblocks into a small rewritable
//! `Storage` whose block rewrites survive power cuts (where an encrypted flash keeps its header),
//! and [`part::Partition`] gives the blocks after it to UBI as a chip of their own.
//! [`trace::Trace`] replays what Linux's UBI did to a chip (recorded traces) on any of them, and
//! [`record::Recorder`] records such a trace from whatever runs above it (our own UBI under a
//! synthetic workload).
//!
//! Every operation takes `&self` (backends lock inside) so that several threads can share a chip,
//! as several volumes of one UBI device do.

pub mod area;
pub mod crypt;
pub mod dump;
mod error;
mod geometry;
// The crate's one module with `unsafe` (its ioctl calls, each with a SAFETY comment): MTD is
// driven through ioctls that no safe wrapper offers.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub mod mtd;
pub mod part;
pub mod record;
pub mod sim;
pub mod trace;

pub use error::Error;
pub use geometry::Geometry;

/// How a read went when it succeeded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStatus {
    /// Bit-flips the ECC corrected (MTD's `-EUCLEAN` when non-zero): the data is right, but the
    /// block is wearing and UBI scrubs it (moves its data and erases it).
    pub corrected: u32,
}

impl ReadStatus {
    /// Combine the status of two reads (the worse one counts).
    pub fn merge(self, other: ReadStatus) -> ReadStatus {
        ReadStatus {
            corrected: self.corrected.max(other.corrected),
        }
    }
}

/// A NAND chip, addressed by eraseblock (PEB) and byte offset inside it.
pub trait Flash: Send + Sync {
    /// Its shape.
    fn geometry(&self) -> Geometry;

    /// Fill `buf` from `offset` of eraseblock `peb`. Any offset and length inside the block.
    /// On [`Error::Uncorrectable`] `buf` still holds what was read, as MTD does.
    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, Error>;

    /// Program `data` at `offset` of eraseblock `peb`; offset and length are multiples of the
    /// sub-page size. Bits can only go from 1 to 0.
    fn program(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error>;

    /// Erase eraseblock `peb`: every byte (and its spare area) reads 0xFF again.
    fn erase(&self, peb: u32) -> Result<(), Error>;

    /// Read the spare (OOB) area of page `page` of eraseblock `peb` into `buf` (at most the OOB
    /// size).
    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), Error>;

    /// Whether eraseblock `peb` is marked bad.
    fn is_bad(&self, peb: u32) -> Result<bool, Error>;

    /// Mark eraseblock `peb` bad (for good: a bad block is never erased or programmed again).
    fn mark_bad(&self, peb: u32) -> Result<(), Error>;

    /// Make what was done so far survive the process (a no-op for a real chip, whose programs
    /// and erases are durable when they return).
    fn sync(&self) -> Result<(), Error>;

    /// Whether it was opened read-only (every program and erase fails): a layer that would
    /// repair something on opening keeps the repair in memory instead.
    fn is_read_only(&self) -> bool {
        false
    }
}
