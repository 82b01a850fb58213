//! A simulated NAND chip kept in a [`Storage`] (an image file, or memory in tests).
//!
//! The image is persistent: it holds the geometry, every page's data and spare area, and the
//! ground truth a real chip keeps to itself: how often each block was erased, how often each page
//! was programmed since, and which blocks are bad. The chip enforces NAND's rules (erase to 0xFF,
//! programs only clear bits, at most NOP programs per page, ascending pages within a block) and
//! can misbehave like nandsim (factory bad blocks, blocks that stop erasing, pages that stop
//! programming, pages that lose their data, random bit-flips) and lose power at a chosen program
//! or erase, leaving that page or block in an undefined state.
//!
//! # Image layout (all integers little-endian)
//!
//! ```text
//! 0       header (4096 bytes): magic "SCNANDv1", geometry
//! 4096    block table: per block, erase count (u32), flags (u8: 1 = bad), 3 zero bytes, then
//!         one program count (u8) per page; padded to a multiple of 4096
//! ...     pages: for each block, for each page, page_size data bytes then oob_size spare bytes
//!         (the order `nanddump --oob` writes)
//! ```
//!
//! Unlike a block device under a file system, a NAND program or erase is durable when it
//! returns: there is no volatile cache to lose, so a power cut only damages the operation in
//! flight (see [`SimNand::cut_power_at`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sectorcrypt_storage::{MemStorage, Storage, Window};

use crate::{Error, Flash, Geometry, ReadStatus};

const MAGIC: &[u8; 8] = b"SCNANDv1";
const HEADER_LEN: u64 = 4096;
const FLAG_BAD: u8 = 1;

/// nandsim's chance of bit-flips in a page read: 2^22 in 2^32, about 1 in 1024.
const BITFLIP_CHANCE: f64 = (1u64 << 22) as f64 / (1u64 << 32) as f64;

/// Misbehaviour to inject, as nandsim's module parameters (`weakblocks=`, `weakpages=`,
/// `gravepages=`, `bitflips=`). Not stored in the image: a fault belongs to a run.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Blocks whose erase fails (`-EIO`) from their n-th erase in this run on: (block, n).
    pub weak_blocks: Vec<(u32, u32)>,
    /// Pages whose program fails (`-EIO`) from their n-th program in this run on: (block, page, n).
    pub weak_pages: Vec<(u32, u32, u32)>,
    /// Pages that lose their data after n reads in this run: later reads return random bytes
    /// and [`Error::Uncorrectable`]: (block, page, n).
    pub grave_pages: Vec<(u32, u32, u32)>,
    /// Up to this many bits flip in about one page read of 1024 (0: never).
    pub bitflips: u32,
    /// Bit-flips per page the ECC corrects; more is [`Error::Uncorrectable`].
    pub ecc_strength: u32,
    /// Seed of every random choice (which reads flip, what a power cut leaves).
    pub seed: u64,
}

#[derive(Clone, Debug)]
struct Block {
    erases: u32,
    bad: bool,
    programs: Vec<u8>,
}

impl Block {
    fn entry(&self) -> Vec<u8> {
        let mut e = Vec::with_capacity(8 + self.programs.len());
        e.extend_from_slice(&self.erases.to_le_bytes());
        e.push(if self.bad { FLAG_BAD } else { 0 });
        e.extend_from_slice(&[0; 3]);
        e.extend_from_slice(&self.programs);
        e
    }

    /// The page above the highest programmed one: where the next program may start.
    fn next_page(&self) -> u32 {
        self.programs
            .iter()
            .rposition(|&n| n > 0)
            .map_or(0, |p| p as u32 + 1)
    }
}

struct State {
    blocks: Vec<Block>,
    faults: Faults,
    rng: StdRng,
    /// Programs and erases so far in this run (what a power cut counts).
    operations: u64,
    cut_at: Option<u64>,
    off: bool,
    erases_this_run: Vec<u32>,
    programs_this_run: HashMap<(u32, u32), u32>,
    reads_this_run: HashMap<(u32, u32), u32>,
}

/// A simulated NAND chip in an image (see the module docs).
pub struct SimNand {
    storage: Box<dyn Storage>,
    geometry: Geometry,
    data_start: u64,
    state: Mutex<State>,
}

/// Bytes of one block's entry in the block table.
fn entry_len(g: &Geometry) -> u64 {
    8 + u64::from(g.pages_per_peb())
}

fn table_len(g: &Geometry) -> u64 {
    (entry_len(g) * u64::from(g.peb_count)).div_ceil(4096) * 4096
}

impl SimNand {
    /// Bytes an image of geometry `g` takes.
    pub fn image_len(g: &Geometry) -> u64 {
        HEADER_LEN
            + table_len(g)
            + u64::from(g.peb_count)
                * u64::from(g.pages_per_peb())
                * u64::from(g.page_size + g.oob_size)
    }

    /// Make a new, fully erased chip in `storage` (which must be [`SimNand::image_len`] bytes),
    /// with `factory_bad` blocks marked bad as shipped.
    pub fn create(
        storage: impl Storage + 'static,
        geometry: Geometry,
        factory_bad: &[u32],
    ) -> Result<SimNand, Error> {
        geometry.validate()?;
        let want = Self::image_len(&geometry);
        let have = storage.len()?;
        if have != want {
            return Err(Error::Format(format!(
                "{}: a NAND image of this geometry needs {want} bytes, it has {have}",
                storage.name()
            )));
        }
        let mut header = vec![0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(MAGIC);
        for (i, v) in [
            geometry.peb_size,
            geometry.page_size,
            geometry.sub_page_size,
            geometry.oob_size,
            geometry.peb_count,
            u32::from(geometry.nop),
        ]
        .iter()
        .enumerate()
        {
            header[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        let blocks: Vec<Block> = (0..geometry.peb_count)
            .map(|peb| Block {
                erases: 0,
                bad: factory_bad.contains(&peb),
                programs: vec![0; geometry.pages_per_peb() as usize],
            })
            .collect();
        let mut table: Vec<u8> = blocks.iter().flat_map(Block::entry).collect();
        table.resize(table_len(&geometry) as usize, 0);
        let erased = vec![0xFF; Self::block_bytes(&geometry)];
        let data_start = HEADER_LEN + table_len(&geometry);
        for peb in 0..u64::from(geometry.peb_count) {
            storage.write_at(&erased, data_start + peb * erased.len() as u64)?;
        }
        storage.write_at(&table, HEADER_LEN)?;
        // The header last: an image cut short while being made is not taken for a chip.
        storage.sync()?;
        storage.write_at(&header, 0)?;
        storage.sync()?;
        let sim = SimNand::with_blocks(Box::new(storage), geometry, blocks);
        for &peb in factory_bad {
            sim.write_bad_marker(peb)?;
        }
        Ok(sim)
    }

    /// Whether `storage` holds a simulated chip (its magic; the rest is checked by
    /// [`SimNand::open`]).
    pub fn is_image(storage: &dyn Storage) -> bool {
        let mut magic = [0u8; 8];
        storage.len().is_ok_and(|len| len >= HEADER_LEN)
            && storage.read_at(&mut magic, 0).is_ok()
            && &magic == MAGIC
    }

    /// Open the chip kept in `storage`.
    pub fn open(storage: impl Storage + 'static) -> Result<SimNand, Error> {
        let name = storage.name();
        let not_image = |why: &str| Error::Format(format!("{name} is not a NAND image: {why}"));
        if storage.len()? < HEADER_LEN {
            return Err(not_image("it is too short"));
        }
        let mut header = vec![0u8; HEADER_LEN as usize];
        storage.read_at(&mut header, 0)?;
        if &header[..8] != MAGIC {
            return Err(not_image("no SCNANDv1 magic"));
        }
        let field = |i: usize| {
            u32::from_le_bytes(header[8 + 4 * i..12 + 4 * i].try_into().unwrap_or([0; 4]))
        };
        let geometry = Geometry {
            peb_size: field(0),
            page_size: field(1),
            sub_page_size: field(2),
            oob_size: field(3),
            peb_count: field(4),
            nop: u8::try_from(field(5)).map_err(|_| not_image("its NOP does not fit a byte"))?,
        };
        geometry.validate()?;
        if storage.len()? != Self::image_len(&geometry) {
            return Err(not_image("its length does not match its geometry"));
        }
        let mut table = vec![0u8; table_len(&geometry) as usize];
        storage.read_at(&mut table, HEADER_LEN)?;
        let blocks = table
            .chunks_exact(entry_len(&geometry) as usize)
            .take(geometry.peb_count as usize)
            .map(|e| Block {
                erases: u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                bad: e[4] & FLAG_BAD != 0,
                programs: e[8..].to_vec(),
            })
            .collect();
        Ok(SimNand::with_blocks(Box::new(storage), geometry, blocks))
    }

    fn with_blocks(storage: Box<dyn Storage>, geometry: Geometry, blocks: Vec<Block>) -> SimNand {
        SimNand {
            storage,
            geometry,
            data_start: HEADER_LEN + table_len(&geometry),
            state: Mutex::new(State {
                blocks,
                faults: Faults::default(),
                rng: StdRng::seed_from_u64(0),
                operations: 0,
                cut_at: None,
                off: false,
                erases_this_run: Vec::new(),
                programs_this_run: HashMap::new(),
                reads_this_run: HashMap::new(),
            }),
        }
    }

    fn block_bytes(g: &Geometry) -> usize {
        (g.pages_per_peb() * (g.page_size + g.oob_size)) as usize
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is only changed by whole assignments: a panic cannot leave it half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Inject `faults` from now on (replacing earlier ones; counts start again).
    pub fn set_faults(&self, faults: Faults) {
        let mut s = self.state();
        s.rng = StdRng::seed_from_u64(faults.seed);
        s.faults = faults;
        s.erases_this_run.clear();
        s.programs_this_run.clear();
        s.reads_this_run.clear();
    }

    /// Cut the power during the `n`-th program or erase from now on (1 = the next one): that
    /// page or block is left half done (a random part programmed, or a random part erased), and
    /// it and every later operation fails with [`Error::PowerCut`]. `None` never cuts.
    pub fn cut_power_at(&self, n: Option<u64>) {
        let mut s = self.state();
        s.cut_at = n.map(|n| s.operations + n);
    }

    /// Programs and erases done since the chip was opened.
    pub fn operations(&self) -> u64 {
        self.state().operations
    }

    /// Whether the power was cut.
    pub fn is_off(&self) -> bool {
        self.state().off
    }

    /// How often each block was erased over the chip's life (ground truth, not UBI's EC).
    pub fn erase_counts(&self) -> Vec<u32> {
        self.state().blocks.iter().map(|b| b.erases).collect()
    }

    /// How often each page of block `peb` was programmed since its last erase.
    pub fn program_counts(&self, peb: u32) -> Result<Vec<u8>, Error> {
        self.geometry.check_range(peb, 0, 0)?;
        Ok(self.state().blocks[peb as usize].programs.clone())
    }

    fn page_offset(&self, peb: u32, page: u32) -> u64 {
        let g = &self.geometry;
        self.data_start
            + (u64::from(peb) * u64::from(g.pages_per_peb()) + u64::from(page))
                * u64::from(g.page_size + g.oob_size)
    }

    fn save_entry(&self, s: &State, peb: u32) -> Result<(), Error> {
        let at = HEADER_LEN + u64::from(peb) * entry_len(&self.geometry);
        self.storage.write_at(&s.blocks[peb as usize].entry(), at)?;
        Ok(())
    }

    fn write_bad_marker(&self, peb: u32) -> Result<(), Error> {
        // Linux's marker: a non-0xFF first spare byte of the block's first page.
        self.storage.write_at(
            &[0],
            self.page_offset(peb, 0) + u64::from(self.geometry.page_size),
        )?;
        Ok(())
    }

    /// Count one program or erase; `true` if the power goes during it.
    fn power_goes(s: &mut State) -> Result<bool, Error> {
        if s.off {
            return Err(Error::PowerCut);
        }
        s.operations += 1;
        if s.cut_at == Some(s.operations) {
            s.off = true;
            return Ok(true);
        }
        Ok(false)
    }

    /// Count one more operation on `page` of `peb` in this run; the new count.
    fn bump(counts: &mut HashMap<(u32, u32), u32>, peb: u32, page: u32) -> u32 {
        let n = counts.entry((peb, page)).or_insert(0);
        *n += 1;
        *n
    }
}

impl Flash for SimNand {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, peb: u32, offset: u32, buf: &mut [u8]) -> Result<ReadStatus, Error> {
        let g = self.geometry;
        g.check_range(peb, offset, buf.len())?;
        let mut s = self.state();
        if s.off {
            return Err(Error::PowerCut);
        }
        let mut status = ReadStatus::default();
        let mut failed = None;
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u32;
            let page = at / g.page_size;
            let in_page = at % g.page_size;
            let n = ((g.page_size - in_page) as usize).min(buf.len() - done);
            let piece = &mut buf[done..done + n];
            self.storage
                .read_at(piece, self.page_offset(peb, page) + u64::from(in_page))?;
            let reads = Self::bump(&mut s.reads_this_run, peb, page);
            let grave = s
                .faults
                .grave_pages
                .iter()
                .any(|&(b, p, after)| b == peb && p == page && reads > after);
            if grave {
                s.rng.fill(piece);
                failed.get_or_insert(Error::Uncorrectable { peb, page });
            } else if s.faults.bitflips > 0 && s.rng.gen_bool(BITFLIP_CHANCE) {
                let most = s.faults.bitflips;
                let flips = s.rng.gen_range(1..=most);
                if flips <= s.faults.ecc_strength {
                    status.corrected = status.corrected.max(flips);
                } else {
                    for _ in 0..flips {
                        let bit = s.rng.gen_range(0..piece.len() * 8);
                        piece[bit / 8] ^= 1 << (bit % 8);
                    }
                    failed.get_or_insert(Error::Uncorrectable { peb, page });
                }
            }
            done += n;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(status),
        }
    }

    fn program(&self, peb: u32, offset: u32, data: &[u8]) -> Result<(), Error> {
        let g = self.geometry;
        g.check_program(peb, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let mut s = self.state();
        if s.off {
            return Err(Error::PowerCut);
        }
        let block = &s.blocks[peb as usize];
        if block.bad {
            return Err(Error::BadBlock(peb));
        }
        let first = offset / g.page_size;
        let last = (offset + data.len() as u32 - 1) / g.page_size;
        let next = block.next_page();
        if first + 1 < next {
            return Err(Error::ProgramRule(format!(
                "page {first} of eraseblock {peb} is programmed after page {}: pages of a block \
                 must be programmed in ascending order",
                next - 1
            )));
        }
        if let Some(page) = (first..=last).find(|&p| block.programs[p as usize] >= g.nop) {
            return Err(Error::ProgramRule(format!(
                "page {page} of eraseblock {peb} was already programmed {} times (NOP {})",
                block.programs[page as usize], g.nop
            )));
        }
        let cut = Self::power_goes(&mut s)?;
        for page in first..=last {
            let n = Self::bump(&mut s.programs_this_run, peb, page);
            let weak = s
                .faults
                .weak_pages
                .iter()
                .any(|&(b, p, after)| b == peb && p == page && n >= after);
            if weak && !cut {
                return Err(Error::ProgramFailed { peb, page });
            }
        }
        // NAND programs by clearing bits: what was 0 stays 0.
        let mut cells = vec![0u8; data.len()];
        let mut wanted = data.to_vec();
        if cut {
            // A random part of the request made it, the rest is some bits on the way.
            let keep = s.rng.gen_range(0..=data.len());
            let noise: Vec<u8> = (keep..data.len()).map(|_| s.rng.gen()).collect();
            for (w, r) in wanted[keep..].iter_mut().zip(noise) {
                *w |= r;
            }
        }
        for page in first..=last {
            let lo = page.max(first) * g.page_size;
            let start = lo.max(offset) - offset;
            let end = ((page + 1) * g.page_size).min(offset + data.len() as u32) - offset;
            let at = self.page_offset(peb, page) + u64::from(lo.max(offset) % g.page_size);
            let piece = &mut cells[start as usize..end as usize];
            self.storage.read_at(piece, at)?;
            for (c, w) in piece.iter_mut().zip(&wanted[start as usize..end as usize]) {
                *c &= w;
            }
            self.storage.write_at(piece, at)?;
            s.blocks[peb as usize].programs[page as usize] += 1;
        }
        self.save_entry(&s, peb)?;
        if cut {
            return Err(Error::PowerCut);
        }
        Ok(())
    }

    fn erase(&self, peb: u32) -> Result<(), Error> {
        let g = self.geometry;
        g.check_range(peb, 0, 0)?;
        let mut s = self.state();
        if s.off {
            return Err(Error::PowerCut);
        }
        if s.blocks[peb as usize].bad {
            return Err(Error::BadBlock(peb));
        }
        let cut = Self::power_goes(&mut s)?;
        let n = match s.erases_this_run.get_mut(peb as usize) {
            Some(n) => {
                *n += 1;
                *n
            }
            None => {
                s.erases_this_run.resize(g.peb_count as usize, 0);
                s.erases_this_run[peb as usize] = 1;
                1
            }
        };
        let weak = s
            .faults
            .weak_blocks
            .iter()
            .any(|&(b, after)| b == peb && n >= after);
        if weak && !cut {
            return Err(Error::EraseFailed(peb));
        }
        let len = Self::block_bytes(&g);
        let at = self.page_offset(peb, 0);
        let mut cells = vec![0xFF; len];
        if cut {
            // Erasing sets bits: some got there, some did not yet.
            self.storage.read_at(&mut cells, at)?;
            for c in cells.iter_mut() {
                *c |= s.rng.gen::<u8>();
            }
        }
        self.storage.write_at(&cells, at)?;
        let block = &mut s.blocks[peb as usize];
        block.erases += 1;
        // After a cut the pages are neither erased nor programmed: say "programmed", so a
        // program without a new erase is refused as on a chip whose state is unknown.
        let after = u8::from(cut).saturating_mul(g.nop);
        block.programs.iter_mut().for_each(|p| *p = after);
        self.save_entry(&s, peb)?;
        if cut {
            return Err(Error::PowerCut);
        }
        Ok(())
    }

    fn read_oob(&self, peb: u32, page: u32, buf: &mut [u8]) -> Result<(), Error> {
        let g = self.geometry;
        g.check_oob(peb, page, buf.len())?;
        if self.state().off {
            return Err(Error::PowerCut);
        }
        self.storage
            .read_at(buf, self.page_offset(peb, page) + u64::from(g.page_size))?;
        Ok(())
    }

    fn is_bad(&self, peb: u32) -> Result<bool, Error> {
        self.geometry.check_range(peb, 0, 0)?;
        Ok(self.state().blocks[peb as usize].bad)
    }

    fn mark_bad(&self, peb: u32) -> Result<(), Error> {
        self.geometry.check_range(peb, 0, 0)?;
        let mut s = self.state();
        if s.off {
            return Err(Error::PowerCut);
        }
        s.blocks[peb as usize].bad = true;
        self.write_bad_marker(peb)?;
        self.save_entry(&s, peb)
    }

    fn sync(&self) -> Result<(), Error> {
        self.storage.sync()?;
        Ok(())
    }

    fn is_read_only(&self) -> bool {
        !self.storage.is_writable()
    }
}
/// A simulated chip in memory that outlives the [`SimNand`] on it: opened again as the next
/// power-on finds it after a cut, or copied to try something on (what crash sweeps need).
pub struct MemChip {
    mem: Arc<MemStorage>,
    len: u64,
}

impl MemChip {
    /// A new chip of geometry `g` with factory bad blocks `bad`, and the [`SimNand`] on it.
    ///
    /// Errors: as [`SimNand::create`].
    pub fn create(g: Geometry, bad: &[u32]) -> Result<(MemChip, Arc<SimNand>), Error> {
        let len = SimNand::image_len(&g);
        let mem = Arc::new(MemStorage::new(vec![0; len as usize]));
        let sim = SimNand::create(Window::new(Arc::clone(&mem), 0, len), g, bad)?;
        Ok((MemChip { mem, len }, Arc::new(sim)))
    }

    /// The chip as the next power-on finds it.
    ///
    /// Errors: as [`SimNand::open`].
    pub fn power_on(&self) -> Result<Arc<SimNand>, Error> {
        Ok(Arc::new(SimNand::open(Window::new(
            Arc::clone(&self.mem),
            0,
            self.len,
        ))?))
    }

    /// An independent copy of the chip as it is now.
    pub fn copy(&self) -> MemChip {
        MemChip {
            mem: Arc::new(MemStorage::new(self.mem.contents())),
            len: self.len,
        }
    }
}
