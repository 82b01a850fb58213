//! A long read-only device without the memory: the input at its start, one byte value after it.

use std::io;

use sectorcrypt_storage::Storage;

/// `len` bytes: `data`, then `fill` to the end. Writes are refused.
pub(crate) struct Padded {
    data: Vec<u8>,
    len: u64,
    fill: u8,
}

impl Padded {
    /// `data` followed by `fill` up to `len` bytes (at least `data`'s length).
    pub(crate) fn new(data: Vec<u8>, len: u64, fill: u8) -> Padded {
        let len = len.max(data.len() as u64);
        Padded { data, len, fill }
    }
}

impl Storage for Padded {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a read past the end of the fuzz device",
            ));
        }
        let held = (self.data.len() as u64)
            .saturating_sub(offset)
            .min(buf.len() as u64) as usize;
        if held > 0 {
            let at = offset as usize;
            buf[..held].copy_from_slice(&self.data[at..at + held]);
        }
        buf[held..].fill(self.fill);
        Ok(())
    }

    fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Err(io::Error::other("the fuzz device is read only"))
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.len)
    }

    fn name(&self) -> String {
        "fuzz-input".into()
    }
}
