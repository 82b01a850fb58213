//! A range of eraseblocks of a chip as a chip of its own, as an MTD partition is: what UBI gets
//! of an encrypted flash once the header blocks are set aside.

use std::sync::Arc;

use crate::{Error, Flash, Geometry, ReadStatus};

/// Eraseblocks `first .. first + count` of another [`Flash`], numbered from 0.
pub struct Partition {
    inner: Arc<dyn Flash>,
    first: u32,
    geometry: Geometry,
}

impl Partition {
    /// Blocks `first..` (to the end of the chip) of `inner`.
    pub fn new(inner: Arc<dyn Flash>, first: u32) -> Result<Partition, Error> {
        let count = inner.geometry().peb_count.saturating_sub(first);
        Partition::range(inner, first, count)
    }

    /// Blocks `first .. first + count` of `inner`.
    pub fn range(inner: Arc<dyn Flash>, first: u32, count: u32) -> Result<Partition, Error> {
        let mut geometry = inner.geometry();
        if count == 0 || u64::from(first) + u64::from(count) > u64::from(geometry.peb_count) {
            return Err(Error::OutOfRange(format!(
                "eraseblocks {first}..{} of a {}-block chip are not a partition",
                u64::from(first) + u64::from(count),
                geometry.peb_count
            )));
        }
        geometry.peb_count = count;
        Ok(Partition {
            inner,
            first,
            geometry,
        })
    }

    /// The chip's block number of this partition's block `peb`.
    fn outer(&self, peb: u32) -> Result<u32, Error> {
        self.geometry.check_range(peb, 0, 0)?;
        Ok(self.first + peb)
    }
}

impl Flash for Partition {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, Error> {
        self.inner.read(self.outer(peb)?, offset, buf)
    }

    fn program(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        self.inner.program(self.outer(peb)?, offset, data)
    }

    fn erase(&self, peb: u32) -> Result<(), Error> {
        self.inner.erase(self.outer(peb)?)
    }

    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), Error> {
        self.inner.read_oob(self.outer(peb)?, page, buf)
    }

    fn is_bad(&self, peb: u32) -> Result<bool, Error> {
        self.inner.is_bad(self.outer(peb)?)
    }

    fn mark_bad(&self, peb: u32) -> Result<(), Error> {
        self.inner.mark_bad(self.outer(peb)?)
    }

    fn sync(&self) -> Result<(), Error> {
        self.inner.sync()
    }

    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimNand;
    use sectorcrypt_storage::MemStorage;

    #[test]
    fn blocks_are_renumbered_and_bounded() {
        let g = Geometry {
            peb_size: 16 * 1024,
            peb_count: 8,
            ..Geometry::default()
        };
        let mem = MemStorage::new(vec![0; SimNand::image_len(&g) as usize]);
        let chip: Arc<dyn Flash> = Arc::new(SimNand::create(mem, g, &[6]).unwrap());
        let part = Partition::new(chip.clone(), 3).unwrap();
        assert_eq!(part.geometry().peb_count, 5);
        part.program(0, 0, &[0x42; 2048]).unwrap();
        let mut b = [0u8; 4];
        chip.read(3, 0, &mut b).unwrap();
        assert_eq!(b, [0x42; 4]);
        assert!(part.is_bad(3).unwrap());
        assert!(matches!(part.erase(5), Err(Error::OutOfRange(_))));
        assert!(Partition::new(chip.clone(), 8).is_err());
        let two = Partition::range(chip.clone(), 1, 2).unwrap();
        assert_eq!(two.geometry().peb_count, 2);
        assert!(matches!(two.erase(2), Err(Error::OutOfRange(_))));
        assert!(Partition::range(chip, 7, 2).is_err());
    }
}
