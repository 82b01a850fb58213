//! The shape of a NAND chip: what MTD reports in `struct mtd_info_user` plus the partial-program
//! limit (NOP) that MTD does not report but every chip has.

use crate::Error;

/// Eraseblock, page, sub-page and spare sizes, block count and partial-program limit.
///
/// UBI calls a physical eraseblock a PEB and the page the *minimum I/O unit*; a chip that allows
/// `nop` partial programs of a page lets it be written in `sub_page_size` pieces (an SLC 2 KiB page
/// with NOP 4 has 512-byte sub-pages), which is where UBI puts its VID header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of one eraseblock (PEB).
    pub peb_size: u32,
    /// Bytes of one page, the minimum I/O unit.
    pub page_size: u32,
    /// Bytes of the smallest separately programmable piece of a page (= `page_size` without
    /// sub-pages).
    pub sub_page_size: u32,
    /// Spare (OOB) bytes per page.
    pub oob_size: u32,
    /// Number of eraseblocks.
    pub peb_count: u32,
    /// How many times a page may be programmed between erases (1 for MLC-like chips).
    pub nop: u8,
}

impl Default for Geometry {
    /// A common SLC chip: 128 KiB eraseblocks of 2 KiB pages with 64 spare bytes, NOP 4 (512-byte
    /// sub-pages), 64 MiB (nandsim's `0x20,0xa2,0x00,0x15`).
    fn default() -> Self {
        Geometry {
            peb_size: 128 * 1024,
            page_size: 2048,
            sub_page_size: 512,
            oob_size: 64,
            peb_count: 512,
            nop: 4,
        }
    }
}

impl Geometry {
    /// Check that the sizes describe a chip: powers of two, pages dividing the eraseblock,
    /// sub-pages dividing the page at most `nop` times, at least one block.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |why: String| Err(Error::Geometry(why));
        let pow2 = |v: u32| v != 0 && v.is_power_of_two();
        if !pow2(self.page_size) || self.page_size < 512 || self.page_size > 64 * 1024 {
            return bad(format!(
                "the page size {} is not a power of two from 512 to 65536",
                self.page_size
            ));
        }
        if !pow2(self.peb_size) || self.peb_size < self.page_size || self.peb_size > 64 << 20 {
            return bad(format!(
                "the eraseblock size {} is not a power of two from the page size to 64 MiB",
                self.peb_size
            ));
        }
        if !pow2(self.sub_page_size) || self.sub_page_size > self.page_size {
            return bad(format!(
                "the sub-page size {} is not a power of two dividing the page size {}",
                self.sub_page_size, self.page_size
            ));
        }
        if self.nop == 0 {
            return bad("a page must be programmable at least once (NOP 0)".into());
        }
        let pieces = self.page_size / self.sub_page_size;
        if pieces > u32::from(self.nop) {
            return bad(format!(
                "{pieces} sub-pages per page need NOP {pieces} or more, the chip has {}",
                self.nop
            ));
        }
        if self.oob_size > self.page_size / 8 {
            return bad(format!(
                "{} spare bytes per page is more than 1/8 of the {}-byte page",
                self.oob_size, self.page_size
            ));
        }
        if self.peb_count == 0 {
            return bad("the chip has no eraseblocks".into());
        }
        Ok(())
    }

    /// Pages per eraseblock.
    pub fn pages_per_peb(&self) -> u32 {
        self.peb_size / self.page_size
    }

    /// Bytes of data of the whole chip (spare areas not counted).
    pub fn size(&self) -> u64 {
        u64::from(self.peb_size) * u64::from(self.peb_count)
    }

    /// Check that `len` bytes at `offset` of eraseblock `peb` lie inside the chip.
    pub fn check_range(&self, peb: u32, offset: u32, len: usize) -> Result<(), Error> {
        if peb >= self.peb_count {
            return Err(Error::OutOfRange(format!(
                "eraseblock {peb} does not exist (the chip has {})",
                self.peb_count
            )));
        }
        if u64::from(offset) + len as u64 > u64::from(self.peb_size) {
            return Err(Error::OutOfRange(format!(
                "{len} bytes at offset {offset} of eraseblock {peb} run past its {} bytes",
                self.peb_size
            )));
        }
        Ok(())
    }

    /// Check a program of `len` bytes at `offset` of eraseblock `peb`: inside the chip and in
    /// whole sub-pages, the unit every backend (and MTD) programs in.
    pub fn check_program(&self, peb: u32, offset: u32, len: usize) -> Result<(), Error> {
        self.check_range(peb, offset, len)?;
        let sub = self.sub_page_size as usize;
        if !(offset as usize).is_multiple_of(sub) || !len.is_multiple_of(sub) {
            return Err(Error::Unaligned(format!(
                "a program of {len} bytes at offset {offset} is not in whole {sub}-byte sub-pages"
            )));
        }
        Ok(())
    }

    /// Check a read of `len` spare bytes of page `page` of eraseblock `peb`: the page exists and
    /// `len` is at most the spare size.
    pub fn check_oob(&self, peb: u32, page: u32, len: usize) -> Result<(), Error> {
        self.check_range(peb, 0, 0)?;
        if page >= self.pages_per_peb() || len > self.oob_size as usize {
            return Err(Error::OutOfRange(format!(
                "{len} spare bytes of page {page} of eraseblock {peb}"
            )));
        }
        Ok(())
    }

    /// The pieces of `offset .. offset + len` of an eraseblock that lie in one page each, in
    /// order: (offset in the block, length). NAND reads, programs and reports errors per page.
    pub fn page_pieces(&self, offset: u32, len: usize) -> impl Iterator<Item = (u32, usize)> {
        let page = self.page_size as usize;
        let end = offset as usize + len;
        let mut at = offset as usize;
        std::iter::from_fn(move || {
            (at < end).then(|| {
                let n = (page - at % page).min(end - at);
                let piece = (at as u32, n);
                at += n;
                piece
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_a_valid_slc_chip() {
        let g = Geometry::default();
        g.validate().unwrap();
        assert_eq!(g.pages_per_peb(), 64);
        assert_eq!(g.size(), 64 << 20);
    }

    #[test]
    fn impossible_shapes_are_refused() {
        let g = Geometry::default();
        for bad in [
            Geometry {
                page_size: 1000,
                ..g
            },
            Geometry {
                peb_size: 1024,
                ..g
            },
            Geometry {
                sub_page_size: 4096,
                ..g
            },
            Geometry { nop: 2, ..g },
            Geometry { nop: 0, ..g },
            Geometry { oob_size: 512, ..g },
            Geometry { peb_count: 0, ..g },
        ] {
            assert!(matches!(bad.validate(), Err(Error::Geometry(_))), "{bad:?}");
        }
        assert!(Geometry {
            sub_page_size: 2048,
            nop: 1,
            ..g
        }
        .validate()
        .is_ok());
    }

    #[test]
    fn ranges_are_checked() {
        let g = Geometry::default();
        assert!(g.check_range(511, 126 * 1024, 2048).is_ok());
        assert!(g.check_range(512, 0, 1).is_err());
        assert!(g.check_range(0, 128 * 1024 - 1, 2).is_err());
    }

    #[test]
    fn programs_are_whole_sub_pages_and_spare_reads_fit_the_spare_area() {
        let g = Geometry::default();
        assert!(g.check_program(3, 1536, 1024).is_ok());
        assert!(matches!(
            g.check_program(3, 100, 512),
            Err(Error::Unaligned(_))
        ));
        assert!(matches!(
            g.check_program(3, 512, 100),
            Err(Error::Unaligned(_))
        ));
        assert!(matches!(
            g.check_program(512, 0, 512),
            Err(Error::OutOfRange(_))
        ));
        assert!(g.check_oob(3, 63, 64).is_ok());
        assert!(g.check_oob(3, 64, 1).is_err());
        assert!(g.check_oob(3, 0, 65).is_err());
        assert!(g.check_oob(512, 0, 1).is_err());
    }

    #[test]
    fn page_pieces_split_at_page_boundaries() {
        let g = Geometry::default();
        let pieces: Vec<_> = g.page_pieces(1000, 5000).collect();
        assert_eq!(pieces, [(1000, 1048), (2048, 2048), (4096, 1904)]);
        assert_eq!(g.page_pieces(0, 0).count(), 0);
    }
}
