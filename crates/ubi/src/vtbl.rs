//! The volume table (the kernel's `vtbl.c`): 128 records (fewer on tiny LEBs) kept twice, in the
//! two LEBs of the layout volume. An update rewrites copy 0, then copy 1, each into a fresh PEB
//! with a newer sequence number; at attach a copy that is damaged or differs is restored from
//! the other, copy 0 winning when both are sound, so a power cut in the middle of an update
//! leaves the old table or the new one.

use crate::media::{Layout, VolType, VtblRecord, VTBL_RECORD_SIZE};

/// The table's slots, `None` for an empty one.
pub(crate) type Table = Vec<Option<VtblRecord>>;

/// The bytes of `table` as a layout LEB holds them: `vtbl_size` bytes, the records then zeros up
/// to the minimum I/O unit, as `ubinize` writes them.
pub(crate) fn to_bytes(layout: &Layout, table: &Table) -> Vec<u8> {
    let mut bytes = vec![0; layout.vtbl_size as usize];
    for (i, r) in table.iter().enumerate() {
        bytes[i * VTBL_RECORD_SIZE..(i + 1) * VTBL_RECORD_SIZE]
            .copy_from_slice(&VtblRecord::to_bytes(r.as_ref()));
    }
    bytes
}

/// An empty table.
pub(crate) fn empty(layout: &Layout) -> Table {
    vec![None; layout.vtbl_slots as usize]
}

/// Parse and check one copy (`vtbl_check`): every record's CRC and fields, sizes that fit a
/// device of `good_pebs` PEBs, alignment and padding consistent with the LEB size, names unique.
pub(crate) fn parse(layout: &Layout, bytes: &[u8], good_pebs: u32) -> Result<Table, String> {
    let mut table = Vec::with_capacity(layout.vtbl_slots as usize);
    for i in 0..layout.vtbl_slots as usize {
        let r = VtblRecord::parse(&bytes[i * VTBL_RECORD_SIZE..], i)?;
        if let Some(r) = &r {
            check_record(layout, r, good_pebs)
                .map_err(|why| format!("volume table slot {i}: {why}"))?;
            if table
                .iter()
                .flatten()
                .any(|o: &VtblRecord| o.name == r.name)
            {
                return Err(format!(
                    "volume table slot {i}: the name {:?} is used twice",
                    String::from_utf8_lossy(&r.name)
                ));
            }
        }
        table.push(r);
    }
    Ok(table)
}

/// The checks of one record against the device.
pub(crate) fn check_record(layout: &Layout, r: &VtblRecord, good_pebs: u32) -> Result<(), String> {
    if r.alignment > layout.leb_size {
        return Err(format!(
            "alignment {} is larger than the LEB ({} bytes)",
            r.alignment, layout.leb_size
        ));
    }
    if r.alignment != 1 && !r.alignment.is_multiple_of(layout.min_io_size) {
        return Err(format!(
            "alignment {} is not a multiple of the minimum I/O unit {}",
            r.alignment, layout.min_io_size
        ));
    }
    if r.data_pad != layout.leb_size % r.alignment {
        return Err(format!(
            "data padding {} does not match alignment {}",
            r.data_pad, r.alignment
        ));
    }
    if r.reserved_pebs > good_pebs {
        return Err(format!(
            "{} PEBs reserved on a device of {good_pebs} good PEBs",
            r.reserved_pebs
        ));
    }
    if r.vol_type == VolType::Static && r.flags & crate::media::VTBL_AUTORESIZE_FLG != 0 {
        return Err("a static volume cannot be auto-resized".into());
    }
    Ok(())
}
