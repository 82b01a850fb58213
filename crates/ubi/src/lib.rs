//! UBI (Unsorted Block Images) on a raw flash device, as Linux's `drivers/mtd/ubi/` does it and
//! bit-exact with it, so that images move between sectorcrypt, mtd-utils, ubi_reader and a kernel.
//!
//! - [`media`]: the on-flash headers and volume table, and where they sit in a PEB.

pub mod media;
