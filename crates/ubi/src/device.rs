//! An attached UBI device: the state behind [`crate::Ubi`] and attaching (the kernel's
//! `build.c` and the attach half of `vtbl.c`): scan, erase what is to be erased, format an empty
//! flash, read and repair the volume table, check what was found against it, reserve PEBs as the
//! kernel does (layout volume, wear-levelling, atomic change, bad-block reserve), auto-resize.

use std::collections::BTreeMap;
use std::sync::Arc;

use sectorcrypt_flash::Flash;

use crate::attach::{self, Kind, Scan};
use crate::io::Io;
use crate::media::{
    Layout, VolType, VtblRecord, LAYOUT_VOLUME_EBS, LAYOUT_VOLUME_ID, LAYOUT_VOLUME_NAME,
    VTBL_AUTORESIZE_FLG,
};
use crate::vtbl::{self, Table};
use crate::wl::{Pool, Use};
use crate::{AttachOptions, Error};

/// PEBs kept for wear-levelling moves (`WL_RESERVED_PEBS`).
const WL_RESERVED_PEBS: u32 = 1;
/// PEBs kept for atomic LEB changes (`EBA_RESERVED_PEBS`).
const EBA_RESERVED_PEBS: u32 = 1;

/// A volume: its table record and where its LEBs are.
#[derive(Clone, Debug)]
pub(crate) struct Vol {
    pub(crate) record: VtblRecord,
    /// The PEB of each LEB (`None`: unmapped).
    pub(crate) lebs: Vec<Option<u32>>,
    /// Static volumes: LEBs holding data, and bytes in the last of them.
    pub(crate) used_ebs: u32,
    pub(crate) last_eb_bytes: u32,
    /// A static volume missing LEBs or failing its CRC, or a volume whose update was cut short.
    pub(crate) corrupted: bool,
    /// A static volume's CRCs were checked.
    pub(crate) checked: bool,
}

impl Vol {
    pub(crate) fn new(record: VtblRecord) -> Vol {
        Vol {
            lebs: vec![None; record.reserved_pebs as usize],
            corrupted: record.upd_marker,
            record,
            used_ebs: 0,
            last_eb_bytes: 0,
            checked: false,
        }
    }

    /// Bytes of data a LEB holds.
    pub(crate) fn usable_leb_size(&self, layout: &Layout) -> u32 {
        layout.leb_size - self.record.data_pad
    }
}

/// The layout volume's own record (it has no slot in the table it holds).
fn layout_record() -> VtblRecord {
    VtblRecord {
        reserved_pebs: LAYOUT_VOLUME_EBS,
        alignment: 1,
        data_pad: 0,
        vol_type: VolType::Dynamic,
        upd_marker: false,
        name: LAYOUT_VOLUME_NAME.as_bytes().to_vec(),
        flags: 0,
    }
}

/// The state of an attached device.
pub(crate) struct Device {
    pub(crate) io: Io,
    pub(crate) pool: Pool,
    /// Every volume, the layout volume included, by ID.
    pub(crate) vols: BTreeMap<u32, Vol>,
    pub(crate) table: Table,
    /// The next sequence number; `None` once every one is used, which only a forged VID header
    /// (sqnum 2^64 - 1) brings about: writes are then refused, since nothing written could be
    /// newer than what is on flash and the next attach would prefer the old copies.
    pub(crate) sqnum: Option<u64>,
    /// Which LEB each used PEB holds.
    pub(crate) owner: Vec<Option<(u32, u32)>>,
    /// PEBs whose reads needed the ECC: their LEBs move at the next chance.
    pub(crate) scrub: Vec<u32>,
    /// PEBs found corrupted (not by a power cut) and kept.
    pub(crate) corrupted_pebs: u32,
}

impl Device {
    /// Attach the UBI on `flash` (formatting it if it is empty).
    pub(crate) fn attach(flash: Arc<dyn Flash>, opts: &AttachOptions) -> Result<Device, Error> {
        let g = flash.geometry();
        let layout = Layout::new(
            g.peb_size,
            g.page_size,
            g.sub_page_size,
            opts.vid_hdr_offset,
        )
        .map_err(Error::Refused)?;
        let mut io = Io {
            flash,
            layout,
            image_seq: 0,
        };
        let scan = attach::scan(&io)?;
        io.image_seq = if scan.is_empty {
            // As the kernel formats an empty device: a random, non-zero image sequence.
            loop {
                let seq: u32 = rand::random();
                if seq != 0 {
                    break seq;
                }
            }
        } else {
            scan.image_seq
        };
        let mut dev = Device::from_scan(io, &scan, opts)?;
        // A first bad-block reserve, before anything is written: a PEB that fails while the
        // attach erases or formats is replaced from it, instead of turning the device
        // read-only. It is counted again once the volumes are known.
        dev.reserve(opts.max_beb_per1024)?;
        // Read-only, what a power cut left to erase stays as it is (and out of use).
        if !opts.read_only {
            dev.erase_scanned(&scan)?;
        }
        let user_lebs = scan.lebs.keys().any(|&(vol, _)| vol != LAYOUT_VOLUME_ID);
        if scan.is_empty {
            dev.format()?;
        } else if let Err(e) = dev.read_table() {
            // No volume table and no LEB of any volume: a format cut short, with nothing to
            // lose; format again, keeping the erase counters. (The kernel refuses such a flash;
            // `ubiformat` would do this.)
            if user_lebs {
                return Err(e);
            }
            dev.format()?;
        }
        dev.reserve(opts.max_beb_per1024)?;
        if opts.autoresize && !opts.read_only {
            dev.autoresize()?;
        }
        dev.pool.read_only |= scan.read_only || opts.read_only;
        dev.scrub.extend(scan.scrub.iter().copied());
        dev.background()?;
        Ok(dev)
    }

    /// An empty volume table in a new layout volume (any old copy erased first).
    fn format(&mut self) -> Result<(), Error> {
        let old: Vec<u32> = self.vols.remove(&LAYOUT_VOLUME_ID).map_or_else(
            || {
                self.owner
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| o.is_some_and(|(v, _)| v == LAYOUT_VOLUME_ID))
                    .map(|(p, _)| p as u32)
                    .collect()
            },
            |v| v.lebs.iter().flatten().copied().collect(),
        );
        for peb in old {
            self.release(peb, false)?;
        }
        self.vols
            .insert(LAYOUT_VOLUME_ID, Vol::new(layout_record()));
        self.table = vtbl::empty(&self.io.layout);
        self.write_table()
    }

    /// The pool and the LEBs as scanned.
    fn from_scan(io: Io, scan: &Scan, opts: &AttachOptions) -> Result<Device, Error> {
        let uses = scan
            .kind
            .iter()
            .map(|k| match k {
                Kind::Bad => Use::Bad,
                Kind::Free => Use::Free,
                Kind::Used | Kind::Erase => Use::Used,
                Kind::Corrupt | Kind::Alien => Use::Kept,
            })
            .collect();
        let peb_count = scan.kind.len();
        let mut dev = Device {
            pool: Pool::new(scan.ec.clone(), uses, opts.wl_threshold),
            io,
            vols: BTreeMap::new(),
            table: Vec::new(),
            sqnum: scan.max_sqnum.checked_add(1),
            owner: vec![None; peb_count],
            scrub: Vec::new(),
            corrupted_pebs: scan.count(Kind::Corrupt),
        };
        for (&(vol_id, lnum), found) in &scan.lebs {
            dev.owner[found.peb as usize] = Some((vol_id, lnum));
        }
        Ok(dev)
    }

    /// Erase the PEBs the scan put on the erase list.
    fn erase_scanned(&mut self, scan: &Scan) -> Result<(), Error> {
        for peb in 0..scan.kind.len() as u32 {
            if scan.kind[peb as usize] == Kind::Erase {
                self.pool.put(&self.io, peb, false)?;
            }
        }
        Ok(())
    }

    /// The LEBs the scan found, grouped by volume (the layout volume's included).
    fn scanned_lebs(&self) -> BTreeMap<u32, Vec<(u32, u32)>> {
        let mut by_vol: BTreeMap<u32, Vec<(u32, u32)>> = BTreeMap::new();
        for (peb, owner) in self.owner.iter().enumerate() {
            if let Some((vol, lnum)) = owner {
                by_vol.entry(*vol).or_default().push((*lnum, peb as u32));
            }
        }
        by_vol
    }

    /// Read the volume table from the layout volume, restore a damaged copy, and set the
    /// volumes up from it (`process_lvol`, `init_volumes`, `check_attaching_info`).
    fn read_table(&mut self) -> Result<(), Error> {
        let lebs = self.scanned_lebs();
        let Some(layout_lebs) = lebs.get(&LAYOUT_VOLUME_ID) else {
            return Err(Error::Refused(
                "the layout volume (the volume table) was not found".into(),
            ));
        };
        let good = self.pool.uses.len() as u32 - self.pool.count(Use::Bad);
        let size = self.io.layout.vtbl_size as usize;
        let mut copies: [Option<Result<Table, String>>; 2] = [None, None];
        for &(lnum, peb) in layout_lebs {
            if lnum >= LAYOUT_VOLUME_EBS {
                return Err(Error::Refused(format!(
                    "PEB {peb} holds LEB {lnum} of the layout volume, which has two"
                )));
            }
            let mut bytes = vec![0u8; size];
            let parsed = match self.io.read_data(peb, 0, &mut bytes) {
                Ok(_) => vtbl::parse(&self.io.layout, &bytes, good),
                Err(e) => Err(e.to_string()),
            };
            copies[lnum as usize] = Some(parsed);
        }
        let mut layout_vol = Vol::new(layout_record());
        for &(lnum, peb) in layout_lebs {
            layout_vol.lebs[lnum as usize] = Some(peb);
        }
        self.vols.insert(LAYOUT_VOLUME_ID, layout_vol);
        let (table, restore) = match copies {
            [Some(Ok(t0)), Some(Ok(t1))] if t0 == t1 => (t0, None),
            [Some(Ok(t0)), _] => (t0, Some(1)),
            [_, Some(Ok(t1))] => (t1, Some(0)),
            [a, b] => {
                let why = |c: Option<Result<Table, String>>| match c {
                    Some(Err(e)) => e,
                    _ => "missing".into(),
                };
                return Err(Error::Refused(format!(
                    "both copies of the volume table are damaged (copy 0: {}; copy 1: {})",
                    why(a),
                    why(b)
                )));
            }
        };
        self.table = table;
        for (id, r) in self.table.iter().enumerate() {
            if let Some(r) = r {
                self.vols.insert(id as u32, Vol::new(r.clone()));
            }
        }
        for (vol_id, found) in lebs {
            if vol_id == LAYOUT_VOLUME_ID {
                continue;
            }
            if !self.vols.contains_key(&vol_id) {
                // A volume the table does not know (its removal was cut short): erase it.
                for (_, peb) in found {
                    self.release(peb, false)?;
                }
                continue;
            }
            self.place_lebs(vol_id, &found)?;
        }
        if let Some(copy) = restore {
            self.write_table_copy(copy)?;
        }
        Ok(())
    }

    /// Put the scanned LEBs of volume `vol_id` in place, and work out a static volume's size.
    fn place_lebs(&mut self, vol_id: u32, found: &[(u32, u32)]) -> Result<(), Error> {
        let mut last = None;
        let mut used_ebs = 0;
        for &(lnum, peb) in found {
            let vid = match self.io.read_vid(peb)?.header {
                crate::media::Header::Valid(v) => v,
                _ => return Err(Error::Refused(format!("PEB {peb}: its VID header changed"))),
            };
            let vol = self.vol_mut(vol_id)?;
            if lnum as usize >= vol.lebs.len() {
                return Err(Error::Refused(format!(
                    "PEB {peb} holds LEB {lnum} of volume {vol_id}, which has {} LEBs",
                    vol.lebs.len()
                )));
            }
            if vid.vol_type != vol.record.vol_type {
                return Err(Error::Refused(format!(
                    "PEB {peb}: volume {vol_id}'s type differs from the volume table's"
                )));
            }
            vol.lebs[lnum as usize] = Some(peb);
            used_ebs = vid.used_ebs;
            if vid.vol_type == VolType::Static && lnum + 1 == vid.used_ebs {
                last = Some(vid.data_size);
            }
        }
        let vol = self.vol_mut(vol_id)?;
        if vol.record.vol_type == VolType::Static && !found.is_empty() {
            if found.len() as u32 != used_ebs || last.is_none() {
                vol.corrupted = true;
            } else {
                vol.used_ebs = used_ebs;
                vol.last_eb_bytes = last.unwrap_or(0);
            }
        }
        Ok(())
    }

    /// Reserve PEBs as the kernel does: every volume's, then wear-levelling's and atomic
    /// change's, then the bad-block reserve from what is left.
    fn reserve(&mut self, max_beb_per1024: u32) -> Result<(), Error> {
        let peb_count = self.pool.uses.len() as u32;
        let bad = self.pool.count(Use::Bad);
        let kept = self.pool.count(Use::Kept);
        let volumes: u32 = self.vols.values().map(|v| v.record.reserved_pebs).sum();
        let need = volumes + WL_RESERVED_PEBS + EBA_RESERVED_PEBS;
        let have = peb_count - bad - kept;
        if have < need {
            return Err(Error::Refused(format!(
                "not enough PEBs: the volumes and UBI's own reserve need {need}, {have} are good"
            )));
        }
        let mut avail = have - need;
        // The bad-block reserve: max_beb_per1024 per 1024 PEBs of the device, rounded up as
        // the kernel rounds, less the PEBs already bad.
        let mut limit = (u64::from(peb_count) * u64::from(max_beb_per1024) / 1024) as u32;
        if max_beb_per1024 > 0
            && u64::from(limit) * 1024 / u64::from(max_beb_per1024) < u64::from(peb_count)
        {
            limit += 1;
        }
        let level = limit.saturating_sub(bad);
        let beb = level.min(avail);
        avail -= beb;
        self.pool.beb_rsvd = beb;
        self.pool.avail = avail;
        Ok(())
    }

    /// Grow the volume marked for auto-resize over every available PEB, once, and clear the
    /// mark (`autoresize`).
    fn autoresize(&mut self) -> Result<(), Error> {
        let Some(id) = self.table.iter().position(|r| {
            r.as_ref()
                .is_some_and(|r| r.flags & VTBL_AUTORESIZE_FLG != 0)
        }) else {
            return Ok(());
        };
        let id = id as u32;
        let avail = self.pool.avail;
        let vol = self.vol_mut(id)?;
        vol.record.flags &= !VTBL_AUTORESIZE_FLG;
        vol.record.reserved_pebs += avail;
        let len = vol.record.reserved_pebs as usize;
        vol.lebs.resize(len, None);
        let record = vol.record.clone();
        self.pool.avail = 0;
        self.table[id as usize] = Some(record);
        self.write_table()
    }

    /// The volume `id`.
    pub(crate) fn vol(&self, id: u32) -> Result<&Vol, Error> {
        self.vols
            .get(&id)
            .ok_or_else(|| Error::Volume(format!("volume {id} does not exist")))
    }

    pub(crate) fn vol_mut(&mut self, id: u32) -> Result<&mut Vol, Error> {
        self.vols
            .get_mut(&id)
            .ok_or_else(|| Error::Volume(format!("volume {id} does not exist")))
    }

    /// Write both copies of the volume table, copy 0 first.
    pub(crate) fn write_table(&mut self) -> Result<(), Error> {
        for copy in 0..LAYOUT_VOLUME_EBS {
            self.write_table_copy(copy)?;
        }
        Ok(())
    }

    /// Rewrite one copy of the volume table: unmap its LEB, write it again.
    fn write_table_copy(&mut self, copy: u32) -> Result<(), Error> {
        let bytes = vtbl::to_bytes(&self.io.layout, &self.table);
        self.unmap(LAYOUT_VOLUME_ID, copy)?;
        self.write(LAYOUT_VOLUME_ID, copy, 0, &bytes)
    }

    /// The next sequence number.
    ///
    /// Errors: [`Error::ReadOnly`] once every sequence number is used (see `sqnum`; found by
    /// fuzzing: an overflow before).
    pub(crate) fn next_sqnum(&mut self) -> Result<u64, Error> {
        let n = self.sqnum.ok_or(Error::ReadOnly)?;
        self.sqnum = n.checked_add(1);
        Ok(n)
    }

    /// Give back the PEB `peb` (erased at once); `torture` after a failed write.
    pub(crate) fn release(&mut self, peb: u32, torture: bool) -> Result<(), Error> {
        self.owner[peb as usize] = None;
        self.pool.put(&self.io, peb, torture)
    }

    /// Move every LEB held below PEB `first` to a PEB at or above it, and stop using the PEBs
    /// below it (until the next attach): room at the start of the flash for something else.
    /// The PEBs leave first (so no move lands there), then each LEB moves as wear-levelling
    /// moves it (a copy, then the old PEB erased), so a power cut loses nothing.
    pub(crate) fn evacuate(&mut self, first: u32) -> Result<(), Error> {
        let below = first.min(self.owner.len() as u32);
        let used: Vec<u32> = (0..below)
            .filter(|&p| self.owner[p as usize].is_some())
            .collect();
        let free = (0..below)
            .filter(|&p| self.pool.uses[p as usize] == Use::Free)
            .count();
        // Refused before anything moves: every good PEB below `first` leaves.
        if (used.len() + free) as u32 > self.pool.avail {
            return Err(Error::NoSpace(format!(
                "{} PEBs must leave UBI, only {} are available (shrink or remove a volume)",
                used.len() + free,
                self.pool.avail
            )));
        }
        // The used PEBs below `first` become free as they are moved: they leave too.
        self.pool.give_away_free_below(first)?;
        for from in used {
            let to = self.pool.get(&self.io)?;
            self.move_leb(from, to)?;
            self.pool.give_away_free_below(first)?;
        }
        Ok(())
    }

    /// Work the kernel does in the background, done here after each operation: move the LEBs
    /// of PEBs read with bit-flips, then wear-level while a move is due.
    pub(crate) fn background(&mut self) -> Result<(), Error> {
        // Moves write: a read-only device leaves its bit-flips for a later writable attach.
        if self.pool.read_only {
            return Ok(());
        }
        while let Some(peb) = self.scrub.pop() {
            if self.owner[peb as usize].is_some() {
                let to = self.pool.get(&self.io)?;
                self.move_leb(peb, to)?;
            }
        }
        // Each move raises the lowest used counter or lowers the highest free one: bounded.
        for _ in 0..self.pool.uses.len() {
            let Some((from, to)) = self.pool.wear_levelling_move() else {
                break;
            };
            if self.owner[from as usize].is_none() {
                break;
            }
            if self.pool.take(&self.io, to)? {
                self.move_leb(from, to)?;
            }
        }
        Ok(())
    }
}
