//! Header backup and restore, byte compatible with `cryptsetup luksHeaderBackup` and
//! `luksHeaderRestore` (`LUKS2_hdr_backup`, `LUKS2_hdr_restore`): a backup is the device's first
//! `hdr_and_areas_size` bytes (both header copies and the keyslots area), nothing else.
//!
//! cryptsetup restores with one write from offset 0, which a power cut can leave half done with
//! neither the old nor the restored keyslots usable. Here the restore is ordered so that the
//! device opens with exactly the old or exactly the restored passphrases at every point (when the
//! device holds a valid LUKS2 header of the same header size, the case cryptsetup allows):
//! 1. old keyslots whose areas the backup's keyslots would overwrite are moved (their encrypted
//!    material copied verbatim: it does not depend on its position) to areas neither uses, and
//!    a metadata version naming the new places is written;
//! 2. the backup's keyslot areas are written;
//! 3. the backup's primary, then secondary header copy;
//! 4. the rest of the backup's keyslots area.
//!
//! The end result is the backup's bytes exactly, as cryptsetup's.

use sectorcrypt_storage::{MemStorage, Storage};

use super::binary::{BinaryHeader, BIN_LEN, CHECKSUM_LEN};
use super::metadata::Keyslot;
use super::write::{io, write_metadata};
use super::Header;
use crate::error::Error;

/// A checked backup, ready to be written; the CLI shows what it is about to replace and asks,
/// as cryptsetup does, before [`RestorePlan::apply`].
pub struct RestorePlan {
    bytes: Vec<u8>,
    backup: Header,
    current: Option<Header>,
    /// The device holds a valid LUKS2 header now (whose keyslots the restore replaces).
    pub device_has_luks2: bool,
    /// That header's UUID differs from the backup's (cryptsetup warns and asks).
    pub different_uuid: bool,
}

fn within(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

fn areas(h: &Header) -> Vec<(u32, (u64, u64))> {
    h.metadata
        .keyslots
        .iter()
        .filter_map(|(n, k)| match k {
            Keyslot::Luks2(k) => Some((n, (k.area.offset, k.area.size))),
            Keyslot::Reencrypt(_) | Keyslot::Other(_) => None,
        })
        .collect()
}

impl Header {
    /// The header backup of `dev` as `cryptsetup luksHeaderBackup` writes it: the first
    /// `hdr_and_areas_size` bytes (a multiple of 4096, so no page padding is added). The header
    /// is read, and so validated, first.
    pub fn backup(dev: &dyn Storage) -> Result<Vec<u8>, Error> {
        let h = Header::read(dev)?;
        let len = h.hdr_and_areas_size();
        let mut bytes = vec![0u8; len as usize];
        dev.read_at(&mut bytes, 0).map_err(|e| io(dev, e))?;
        // The bytes must read back as the header just read (nothing changed in between).
        let again = Header::read(&MemStorage::new(bytes.clone()))?;
        if again.seqid() != h.seqid() || again.uuid() != h.uuid() {
            return Err(Error::Corrupt(
                "the header changed while it was being backed up".into(),
            ));
        }
        Ok(bytes)
    }

    /// Check a header backup against `dev` as `cryptsetup luksHeaderRestore` does, writing
    /// nothing: the backup must be a valid LUKS2 header without an unfinished reencryption, and
    /// if `dev` holds a LUKS2 header, the data offset and the size of header plus keyslots area
    /// must be the same (a different UUID is only reported).
    pub fn check_restore(dev: &dyn Storage, backup: &dyn Storage) -> Result<RestorePlan, Error> {
        let b = Header::read(backup).map_err(|e| match e {
            Error::Io { .. } => e,
            other => Error::Corrupt(format!(
                "the backup does not contain a valid LUKS2 header ({other})"
            )),
        })?;
        if !b.metadata.mandatory_requirements().is_empty() {
            return Err(Error::Unsupported(format!(
                "restoring a backup with mandatory requirements ({})",
                b.metadata.mandatory_requirements().join(", ")
            )));
        }
        let len = b.hdr_and_areas_size();
        let mut bytes = vec![0u8; len as usize];
        backup.read_at(&mut bytes, 0).map_err(|e| io(backup, e))?;
        // What gets written is exactly what is validated.
        let b = Header::read(&MemStorage::new(bytes.clone()))?;
        let dev_len = dev.len().map_err(|e| io(dev, e))?;
        if dev_len < len {
            return Err(Error::Unsupported(format!(
                "restoring a {len}-byte header backup to a device of {dev_len} bytes"
            )));
        }
        let current = Header::read(dev).ok();
        let mut different_uuid = false;
        if let Some(c) = &current {
            different_uuid = c.binary.uuid != b.binary.uuid;
            // cryptsetup skips the layout checks during a reencryption.
            if c.metadata.mandatory_requirements().is_empty() {
                let offset = |h: &Header| h.data_segment().map(|s| s.offset).ok();
                if offset(c) != offset(&b) {
                    return Err(Error::Unsupported(
                        "a backup whose data offset differs from the device's".into(),
                    ));
                }
                if c.hdr_and_areas_size() != len {
                    return Err(Error::Unsupported(
                        "a backup whose header and keyslots area size differs from the device's"
                            .into(),
                    ));
                }
            }
        }
        Ok(RestorePlan {
            bytes,
            backup: b,
            device_has_luks2: current.is_some(),
            different_uuid,
            current,
        })
    }

    /// [`Header::check_restore`] then [`RestorePlan::apply`]: restore without asking.
    pub fn restore(dev: &dyn Storage, backup: &dyn Storage) -> Result<Header, Error> {
        Header::check_restore(dev, backup)?.apply(dev)
    }
}

impl RestorePlan {
    fn write(&self, dev: &dyn Storage, from: u64, to: u64) -> Result<(), Error> {
        if from < to {
            dev.write_at(&self.bytes[from as usize..to as usize], from)
                .map_err(|e| io(dev, e))?;
        }
        Ok(())
    }

    /// Write one of the backup's header copies as cryptsetup writes copies: the binary header
    /// with a zeroed checksum, the JSON area, the binary header as stored; then sync.
    fn write_copy(&self, dev: &dyn Storage, at: u64, hdr_size: u64) -> Result<(), Error> {
        let mut raw = [0u8; BIN_LEN];
        raw.copy_from_slice(&self.bytes[at as usize..at as usize + BIN_LEN]);
        if let Some(mut bin) = BinaryHeader::parse(&raw) {
            bin.checksum = [0; CHECKSUM_LEN];
            dev.write_at(&bin.to_bytes(), at).map_err(|e| io(dev, e))?;
        }
        self.write(dev, at + BIN_LEN as u64, at + hdr_size)?;
        self.write(dev, at, at + BIN_LEN as u64)?;
        dev.sync().map_err(|e| io(dev, e))
    }

    /// Write the backup to `dev` (see the module documentation for the order) and read the
    /// restored header back.
    pub fn apply(self, dev: &dyn Storage) -> Result<Header, Error> {
        let hdr_size = self.backup.binary.hdr_size;
        let start = 2 * hdr_size;
        let end = self.bytes.len() as u64;
        let new_areas: Vec<(u64, u64)> = areas(&self.backup).into_iter().map(|(_, a)| a).collect();
        let safe = self
            .current
            .as_ref()
            .is_some_and(|c| c.binary.hdr_size == hdr_size);
        if let (true, Some(cur)) = (safe, &self.current) {
            self.move_conflicting(dev, cur, &new_areas)?;
        }
        // The backup's keyslot areas, now named by no current keyslot.
        for &(o, s) in &new_areas {
            self.write(dev, o.max(start), (o + s).min(end))?;
        }
        dev.sync().map_err(|e| io(dev, e))?;
        self.write_copy(dev, 0, hdr_size)?;
        self.write_copy(dev, hdr_size, hdr_size)?;
        // Everything else: the unused parts of the keyslots area (and the moved old material).
        let mut at = start;
        let mut sorted = new_areas.clone();
        sorted.sort_unstable();
        for (o, s) in sorted {
            self.write(dev, at, o.min(end))?;
            at = at.max((o + s).min(end));
        }
        self.write(dev, at, end)?;
        dev.sync().map_err(|e| io(dev, e))?;
        Header::read(dev)
    }

    /// Step 1: move each current keyslot whose area the backup's keyslots overlap (with other
    /// bytes) to an area neither header uses, and write the metadata naming the new places.
    fn move_conflicting(
        &self,
        dev: &dyn Storage,
        cur: &Header,
        new_areas: &[(u64, u64)],
    ) -> Result<(), Error> {
        let mut md = cur.metadata.clone();
        let mut taken: Vec<(u64, u64)> = new_areas.to_vec();
        let mut moved = false;
        for (slot, area) in areas(cur) {
            if !new_areas.iter().any(|&n| within(n, area)) {
                continue;
            }
            let mut now = vec![0u8; area.1 as usize];
            dev.read_at(&mut now, area.0).map_err(|e| io(dev, e))?;
            let same = area.0 + area.1 <= self.bytes.len() as u64
                && self.bytes[area.0 as usize..(area.0 + area.1) as usize] == now[..];
            if same {
                continue;
            }
            let Some(to) = md.find_area_gap(cur.binary.hdr_size, area.1, &taken) else {
                // No room to move it: the restore goes on in cryptsetup's unprotected order.
                return Ok(());
            };
            taken.push((to, area.1));
            dev.write_at(&now, to).map_err(|e| io(dev, e))?;
            if let Some((_, Keyslot::Luks2(k))) = md.keyslots.0.iter_mut().find(|(n, _)| *n == slot)
            {
                k.area.offset = to;
            }
            moved = true;
        }
        if moved {
            dev.sync().map_err(|e| io(dev, e))?;
            write_metadata(dev, &cur.next_fields(), &md)?;
        }
        Ok(())
    }
}
