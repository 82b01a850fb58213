//! A raw flash dump in `nanddump`'s layout as a chip: what mtd-utils, ubi_reader and a kernel
//! nandsim exchange.
//!
//! Two layouts, as `nanddump` writes them: data only (the eraseblocks one after another; what
//! `nanddump -f` writes and what `ubireader_*` and `nandwrite` read), or each page followed by its
//! spare area (`nanddump --oob`, `nandwrite --oob`). The geometry is not in the file: it comes from
//! the caller (the chip the dump was taken from), and the block count from the file's length.
//!
//! A dump keeps bytes, not history, so of NAND's rules it enforces those the bytes can show:
//! erase sets a block (and its spare areas) to 0xFF, programs only clear bits and are sub-page
//! aligned. Program counts (NOP) and page order need a chip's record of past programs (the
//! simulated chip keeps one). Bad blocks are the factory marker, as in the kernel: a non-0xFF first
//! byte in the spare area of a block's first page, so only a dump with spare areas has them; in a
//! data-only dump every block is good (`nanddump --bb=padbad` writes bad blocks as 0xFF).

use crate::{Error, Flash, Geometry, ReadStatus};
use sectorcrypt_storage::Storage;

/// Whether each page of the dump is followed by its spare (OOB) area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Data only, the eraseblocks one after another (`nanddump -f FILE`).
    DataOnly,
    /// Each page followed by its spare area (`nanddump --oob -f FILE`).
    WithOob,
}

/// A dump named on the command line as `nanddump:FILE[?peb=SIZE&page=SIZE&subpage=SIZE&oob=SIZE&layout=data|oob]`
/// (a dump does not say its geometry), split into its parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceName<'a> {
    /// The dump file.
    pub file: &'a str,
    /// The chip it was taken from, as given (the defaults are [`Geometry::default`]'s; the
    /// block count is the dump's length and is set by [`DumpFlash::open`]); NOP is page /
    /// sub-page. Not validated: [`DumpFlash::open`] does that.
    pub geometry: Geometry,
    /// Whether its pages carry their spare areas.
    pub layout: Layout,
}

impl DeviceName<'_> {
    /// Split `spec`, the part after `nanddump:`. Sizes take cryptsetup's units (`16K`).
    ///
    /// Errors: a sentence naming the first `KEY=VALUE` pair that is not one of the keys above
    /// with a size that fits 32 bits (or `data`/`oob` for `layout`).
    pub fn parse(spec: &str) -> Result<DeviceName<'_>, String> {
        let (file, query) = spec.split_once('?').unwrap_or((spec, ""));
        let (mut g, mut layout) = (Geometry::default(), Layout::DataOnly);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let bad = || {
                format!(
                    "nanddump:{spec}: '{pair}' is not KEY=VALUE (peb, page, subpage, oob, layout)"
                )
            };
            let (key, value) = pair.split_once('=').ok_or_else(bad)?;
            let size = || -> Result<u32, String> {
                sectorcrypt_storage::units::parse_size(value)
                    .ok()
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(bad)
            };
            match key {
                "peb" => g.peb_size = size()?,
                "page" => g.page_size = size()?,
                "subpage" => g.sub_page_size = size()?,
                "oob" => g.oob_size = size()?,
                "layout" if value == "data" => layout = Layout::DataOnly,
                "layout" if value == "oob" => layout = Layout::WithOob,
                _ => return Err(bad()),
            }
        }
        g.nop = (g.page_size / g.sub_page_size.max(1)).clamp(1, 255) as u8;
        Ok(DeviceName {
            file,
            geometry: g,
            layout,
        })
    }
}

/// A `nanddump`-layout dump in a [`Storage`], as a [`Flash`].
pub struct DumpFlash {
    storage: Box<dyn Storage>,
    geometry: Geometry,
    layout: Layout,
}

fn io(e: std::io::Error) -> Error {
    Error::Io(e)
}

impl DumpFlash {
    /// The dump in `storage`, taken from a chip shaped as `shape` (whose `peb_count` is ignored:
    /// the dump's length sets it).
    ///
    /// Errors: [`Error::Geometry`] for an invalid shape or a length that is not whole
    /// eraseblocks of it; [`Error::Io`].
    pub fn open(
        storage: Box<dyn Storage>,
        shape: Geometry,
        layout: Layout,
    ) -> Result<DumpFlash, Error> {
        // The shape is checked before any size is computed from it: a page size of 0 (say, from
        // a `nanddump:FILE?page=0` device name) would divide by zero below.
        Geometry {
            peb_count: 1,
            ..shape
        }
        .validate()?;
        let len = storage.len().map_err(io)?;
        let block = Self::block_bytes(&shape, layout);
        if len == 0 || !len.is_multiple_of(block) {
            return Err(Error::Geometry(format!(
                "{} is {len} bytes, not a whole number of {block}-byte eraseblocks{}",
                storage.name(),
                if layout == Layout::WithOob {
                    " with spare areas"
                } else {
                    ""
                }
            )));
        }
        let count = u32::try_from(len / block)
            .map_err(|_| Error::Geometry(format!("{} has too many eraseblocks", storage.name())))?;
        let geometry = Geometry {
            peb_count: count,
            ..shape
        };
        geometry.validate()?;
        Ok(DumpFlash {
            storage,
            geometry,
            layout,
        })
    }

    /// Bytes a dump of `geometry` in `layout` takes.
    pub fn image_len(geometry: &Geometry, layout: Layout) -> u64 {
        Self::block_bytes(geometry, layout) * u64::from(geometry.peb_count)
    }

    fn block_bytes(g: &Geometry, layout: Layout) -> u64 {
        u64::from(g.pages_per_peb()) * u64::from(Self::page_stride(g, layout))
    }

    fn page_stride(g: &Geometry, layout: Layout) -> u32 {
        match layout {
            Layout::DataOnly => g.page_size,
            Layout::WithOob => g.page_size + g.oob_size,
        }
    }

    /// The layout of the file.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// File offset of byte `offset` of eraseblock `peb` (inside one page).
    fn data_at(&self, peb: u32, offset: u32) -> u64 {
        let g = &self.geometry;
        let stride = u64::from(Self::page_stride(g, self.layout));
        Self::block_bytes(g, self.layout) * u64::from(peb)
            + u64::from(offset / g.page_size) * stride
            + u64::from(offset % g.page_size)
    }

    fn oob_at(&self, peb: u32, page: u32) -> Result<u64, Error> {
        if self.layout == Layout::DataOnly {
            return Err(Error::Format(
                "a data-only dump has no spare areas (take it with nanddump --oob)".into(),
            ));
        }
        let g = &self.geometry;
        Ok(self.data_at(peb, page * g.page_size) + u64::from(g.page_size))
    }
}

impl Flash for DumpFlash {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, Error> {
        self.geometry.check_range(peb, offset, buf.len())?;
        let mut done = 0;
        for (at, n) in self.geometry.page_pieces(offset, buf.len()) {
            self.storage
                .read_at(&mut buf[done..done + n], self.data_at(peb, at))
                .map_err(io)?;
            done += n;
        }
        Ok(ReadStatus::default())
    }

    fn program(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        self.geometry.check_program(peb, offset, data.len())?;
        if self.is_bad(peb)? {
            return Err(Error::BadBlock(peb));
        }
        let mut done = 0;
        for (at, n) in self.geometry.page_pieces(offset, data.len()) {
            let pos = self.data_at(peb, at);
            let mut cells = vec![0u8; n];
            self.storage.read_at(&mut cells, pos).map_err(io)?;
            for (c, d) in cells.iter_mut().zip(&data[done..done + n]) {
                *c &= d;
            }
            self.storage.write_at(&cells, pos).map_err(io)?;
            done += n;
        }
        Ok(())
    }

    fn erase(&self, peb: u32) -> Result<(), Error> {
        self.geometry.check_range(peb, 0, 0)?;
        if self.is_bad(peb)? {
            return Err(Error::BadBlock(peb));
        }
        let len = Self::block_bytes(&self.geometry, self.layout);
        let start = self.data_at(peb, 0);
        self.storage
            .write_at(&vec![0xFF; len as usize], start)
            .map_err(io)
    }

    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), Error> {
        self.geometry.check_oob(peb, page, buf.len())?;
        let at = self.oob_at(peb, page)?;
        self.storage.read_at(buf, at).map_err(io)
    }

    fn is_bad(&self, peb: u32) -> Result<bool, Error> {
        self.geometry.check_range(peb, 0, 0)?;
        if self.layout == Layout::DataOnly {
            return Ok(false);
        }
        let mut marker = [0u8; 1];
        self.read_oob(peb, 0, &mut marker)?;
        Ok(marker[0] != 0xFF)
    }

    fn mark_bad(&self, peb: u32) -> Result<(), Error> {
        self.geometry.check_range(peb, 0, 0)?;
        let at = self.oob_at(peb, 0)?;
        self.storage.write_at(&[0], at).map_err(io)
    }

    fn sync(&self) -> Result<(), Error> {
        self.storage.sync().map_err(io)
    }

    fn is_read_only(&self) -> bool {
        !self.storage.is_writable()
    }
}

/// Every eraseblock of `flash` as `nanddump` writes it in `layout` (the reader of this format is
/// [`DumpFlash`]): bad blocks as 0xFF (`--bb=padbad`), their marker kept in the spare area; a
/// page too damaged for the ECC as the chip returned it, as nanddump does.
pub fn write(flash: &dyn Flash, layout: Layout) -> Result<Vec<u8>, Error> {
    let g = flash.geometry();
    let page = g.page_size as usize;
    let stride = DumpFlash::page_stride(&g, layout) as usize;
    let block_bytes = DumpFlash::block_bytes(&g, layout) as usize;
    let mut dump = vec![0xFFu8; g.peb_count as usize * block_bytes];
    let mut block = vec![0u8; g.peb_size as usize];
    for (peb, out) in dump.chunks_mut(block_bytes).enumerate() {
        let peb = peb as u32;
        let bad = flash.is_bad(peb)?;
        if !bad {
            match flash.read(peb, 0, &mut block) {
                Ok(_) | Err(Error::Uncorrectable { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        for (i, slot) in out.chunks_mut(stride).enumerate() {
            if !bad {
                slot[..page].copy_from_slice(&block[i * page..(i + 1) * page]);
            }
            if layout == Layout::WithOob {
                flash.read_oob(peb, i as u32, &mut slot[page..])?;
            }
        }
    }
    Ok(dump)
}
