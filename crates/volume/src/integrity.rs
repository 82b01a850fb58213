//! Volumes with authenticated encryption (LUKS2 `--integrity`): requests go to the volume's
//! [`IntegrityDevice`], which reads and writes whole blocks; an unaligned head or tail is read,
//! patched and written back whole, with no other write in between.
//! Discards are refused (as `cryptsetup open --integrity` volumes have none), and so are
//! conversions and resizing (cryptsetup refuses them too).

use std::sync::{Arc, PoisonError};

use sectorcrypt_integrity::{IntegrityDevice, Mode};
use sectorcrypt_luks::luks2;
use sectorcrypt_storage::Storage;

use crate::{Error, Layout, Volume, VolumeOptions};

impl Volume {
    /// Open the integrity data segment of `header` on `storage` with `volume_key` (the
    /// encryption key and, for HMAC modes, the MAC key after it). Opened writable, a journal a
    /// crash left is replayed first. Writes go through the journal unless `journal` is false
    /// (`--integrity-no-journal`) or the header's persistent flags say `no-journal`.
    ///
    /// Errors: [`Error::Refused`] with `allow_discards`; [`Error::Luks`] for the segment;
    /// [`Error::Integrity`] for the mode or the integrity device.
    pub fn open_integrity(
        header: &luks2::Header,
        storage: Arc<dyn Storage>,
        volume_key: &[u8],
        opts: &VolumeOptions,
        journal: bool,
    ) -> Result<Volume, Error> {
        header.metadata().check_requirements_known()?;
        if opts.allow_discards {
            return Err(Error::Refused(
                "discards on a volume with integrity: a discarded block would fail its check \
                 (cryptsetup does not pass them either)"
                    .into(),
            ));
        }
        let segment = header.integrity_segment()?;
        let mode = Mode::new(
            &segment.cipher,
            &segment.integrity,
            volume_key,
            segment.sector_size as usize,
        )
        .map_err(Error::Integrity)?;
        let persistent_no_journal = header
            .metadata()
            .config
            .flags
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == "no-journal"));
        let device = IntegrityDevice::open_with(
            Arc::clone(&storage),
            segment.offset,
            mode,
            opts.read_only,
            journal && !persistent_no_journal,
        )
        .map_err(Error::Integrity)?;
        let layout = Layout {
            offset: segment.offset,
            size: device.size(),
            cipher: segment.cipher,
            sector_size: segment.sector_size as usize,
            iv_offset: 0,
        };
        let mut volume = Volume::around(storage, layout, None, opts);
        volume.integrity = Some(device);
        Ok(volume)
    }

    /// Whether the volume has authenticated encryption.
    pub fn has_integrity(&self) -> bool {
        self.integrity.is_some()
    }

    /// The blocks covering `len` bytes at `offset`: the first and how many.
    fn blocks(&self, offset: u64, len: usize) -> (u64, u64) {
        let bs = self.layout.sector_size as u64;
        let first = offset / bs;
        (first, (offset + len as u64).div_ceil(bs) - first)
    }

    pub(crate) fn integrity_read(
        &self,
        device: &IntegrityDevice,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<(), Error> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let _busy = self.begin();
        self.read_covering(buf, offset, |blocks, first| {
            device.read(first, blocks).map_err(Error::Integrity)
        })
    }

    pub(crate) fn integrity_write(
        &self,
        device: &IntegrityDevice,
        data: &mut [u8],
        offset: u64,
    ) -> Result<(), Error> {
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let _busy = self.begin();
        let bs = self.layout.sector_size as u64;
        if offset.is_multiple_of(bs) && (data.len() as u64).is_multiple_of(bs) {
            let _whole = self.rmw.read().unwrap_or_else(PoisonError::into_inner);
            return (device.write_in_place(offset / bs, data)).map_err(Error::Integrity);
        }
        // No write lands between the read and the write of this read-modify-write.
        let _partial = self.rmw.write().unwrap_or_else(PoisonError::into_inner);
        let (first, count) = self.blocks(offset, data.len());
        let mut span = vec![0u8; (count * bs) as usize];
        device.read(first, &mut span).map_err(Error::Integrity)?;
        let skip = (offset - first * bs) as usize;
        span[skip..skip + data.len()].copy_from_slice(data);
        (device.write_in_place(first, &mut span)).map_err(Error::Integrity)
    }
}
