//! Building the metadata `cryptsetup reencrypt --init-only` writes: for an encryption (detached or
//! data shift), a reencryption and a decryption (detached or data shift).

use super::*;

/// The resilience of a step that does not shift data (`--resilience`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResilienceKind {
    /// `none`.
    None,
    /// `checksum` with this hash (`--resilience-hash`, default sha256).
    Checksum(Hash),
    /// `journal`.
    Journal,
}

/// Choices shared by the builders, as `cryptsetup reencrypt` options give them.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// The resilience (not used by [`init_encrypt_datashift`], which is always `datashift`).
    pub resilience: ResilienceKind,
    /// The data device's logical block size; the checksum block is the largest of it and both
    /// sector sizes (`reencrypt_get_alignment`). cryptsetup sees 4096 for files on most file
    /// systems and `BLKSSZGET` for block devices.
    pub block_size: u32,
    /// The reencryption digest's hash (cryptsetup's PBKDF hash, sha256 by default).
    pub digest_hash: Hash,
    /// The reencryption digest's iterations; `None` benchmarks 125 ms. cryptsetup uses 1000
    /// when given `--pbkdf-force-iterations`.
    pub digest_iterations: Option<u32>,
}

impl Default for InitOptions {
    /// cryptsetup's defaults: checksum/sha256, a 4096-byte block, a sha256 digest benchmarked.
    fn default() -> Self {
        InitOptions {
            resilience: ResilienceKind::Checksum(Hash::Sha256),
            block_size: 4096,
            digest_hash: Hash::Sha256,
            digest_iterations: None,
        }
    }
}

/// The target of a reencryption: the new cipher and sector size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The new cipher specification (`aes-xts-plain64`).
    pub cipher: String,
    /// The new encryption sector size.
    pub sector_size: u32,
}

/// The data segment of a header that is not under reencryption, with its digest.
pub(super) fn plain_data_segment(header: &Header) -> Result<(CryptSegment, u32), Error> {
    let md = header.metadata();
    let reqs = md.mandatory_requirements();
    if !reqs.is_empty() {
        return Err(Error::Unsupported(format!(
            "starting a reencryption on a volume with mandatory requirements ({})",
            reqs.join(", ")
        )));
    }
    match md.segments.get(0) {
        Some(SegmentEntry::Crypt(c)) if md.segments.len() == 1 && c.integrity.is_none() => {
            let (d, _) = md
                .digest_of_segment(0)
                .ok_or_else(|| Error::Corrupt("segment 0 has no digest".into()))?;
            Ok((c.clone(), d))
        }
        Some(SegmentEntry::Crypt(c)) if c.integrity.is_some() => Err(Error::Unsupported(
            "reencryption of a device with an integrity profile (as in cryptsetup)".into(),
        )),
        _ => Err(Error::Unsupported(
            "starting a reencryption on anything but one crypt segment without integrity".into(),
        )),
    }
}

/// Keyslot areas as (offset, size), whatever the keyslot type (`LUKS2_keyslot_area`).
pub(super) fn keyslot_areas(md: &Metadata) -> Vec<(u64, u64)> {
    keyslot_areas_by_slot(md)
        .into_iter()
        .map(|(_, area)| area)
        .collect()
}

pub(super) fn keyslot_areas_by_slot(md: &Metadata) -> Vec<(u32, (u64, u64))> {
    md.keyslots
        .iter()
        .filter_map(|(n, k)| Some((n, k.area()?)))
        .collect()
}

/// The keyslot areas (offset, size) of the keyslots in `before` that `after` no longer has: what
/// to wipe once `after` is written.
pub fn removed_keyslot_areas(before: &Metadata, after: &Metadata) -> Vec<(u64, u64)> {
    let kept: Vec<u32> = after.keyslots.iter().map(|(n, _)| n).collect();
    keyslot_areas_by_slot(before)
        .into_iter()
        .filter(|(n, _)| !kept.contains(n))
        .map(|(_, area)| area)
        .collect()
}

/// The largest free gap of the keyslots area (`LUKS2_find_area_max_gap`, same tie rule: the
/// first of equal gaps).
pub(super) fn find_area_max_gap(md: &Metadata, hdr_size: u64) -> Option<(u64, u64)> {
    let max_offset = 2 * hdr_size + md.config.keyslots_size;
    let mut areas: Vec<(u64, u64)> = keyslot_areas(md)
        .into_iter()
        .filter(|(o, l)| *o != 0 && *l != 0)
        .collect();
    areas.sort_by_key(|a| a.0);
    areas.push((max_offset, 1));
    let (mut offset, mut best, mut best_len) = (2 * hdr_size, 0, 0);
    for (o, l) in areas {
        if offset < o && o - offset > best_len {
            best_len = o - offset;
            best = offset;
        }
        offset = o.saturating_add(l);
    }
    (best_len > 0).then_some((best, best_len))
}

/// Add the reencrypt keyslot, the requirement and the digest to `md` (the end of
/// `reencrypt_init`).
#[allow(clippy::too_many_arguments)]
pub(super) fn finish_init(
    mut md: Metadata,
    hdr_size: u64,
    mode: Mode,
    direction: Direction,
    resilience: Resilience,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
    opts: &InitOptions,
) -> Result<Metadata, Error> {
    let slot = (0..KEYSLOTS_MAX as u32)
        .find(|n| md.keyslots.get(*n).is_none())
        .ok_or_else(|| Error::Unsupported("all 32 keyslots are in use".into()))?;
    let no_room = || Error::Unsupported("no free space in the keyslots area".into());
    let (area_offset, area_size) = if matches!(resilience, Resilience::Datashift { .. }) {
        let o = md
            .find_area_gap(hdr_size, DATASHIFT_AREA, &[])
            .ok_or_else(no_room)?;
        (o, DATASHIFT_AREA)
    } else {
        find_area_max_gap(&md, hdr_size).ok_or_else(no_room)?
    };
    // Only a decryption that moves its first segment needs v3 (`reencrypt_init`).
    let requirement = match (&mode, &resilience) {
        (
            Mode::Decrypt,
            Resilience::DatashiftChecksum { .. } | Resilience::DatashiftJournal { .. },
        ) => REQUIREMENT_V3,
        _ => REQUIREMENT_V2,
    };
    let ks = ReencryptKeyslot::new(slot, mode, direction, (area_offset, area_size), resilience);
    md.keyslots.0.push((slot, Keyslot::Reencrypt(Box::new(ks))));
    md.config.requirements = Some(Requirements {
        mandatory: Some(vec![requirement.into()]),
        extra: md
            .config
            .requirements
            .take()
            .map(|r| r.extra)
            .unwrap_or_default(),
    });
    set_reencrypt_digest(
        &mut md,
        old_vk,
        new_vk,
        opts.digest_hash,
        opts.digest_iterations,
    )?;
    Ok(md)
}

/// The non-shift resilience with its checksum block size.
pub(super) fn resilience_for(
    opts: &InitOptions,
    sector_sizes: &[u32],
) -> Result<Resilience, Error> {
    if opts.block_size < 512 || !opts.block_size.is_power_of_two() {
        return Err(Error::Unsupported(format!(
            "a block size of {} bytes",
            opts.block_size
        )));
    }
    let alignment = sector_sizes.iter().copied().fold(opts.block_size, u32::max);
    Ok(match opts.resilience {
        ResilienceKind::None => Resilience::None,
        ResilienceKind::Journal => Resilience::Journal,
        ResilienceKind::Checksum(h) => Resilience::Checksum {
            hash: h.name().into(),
            sector_size: alignment,
        },
    })
}

/// Take every segment off every digest (`LUKS2_digest_segment_assign(ANY, ANY, 0)`).
pub(super) fn clear_segment_digests(md: &mut Metadata) {
    for (_, d) in md.digests.0.iter_mut() {
        match d {
            Digest::Pbkdf2(d) => d.segments.clear(),
            Digest::Other(v) => {
                if let Some(Value::Array(a)) = v.get_mut("segments") {
                    a.clear();
                }
            }
        }
    }
}

/// List segment `segment` in digest `digest` (`LUKS2_digest_segment_assign(.., 1, ..)`).
pub(super) fn assign_segment(md: &mut Metadata, digest: u32, segment: u32) -> Result<(), Error> {
    let name = segment.to_string();
    match md.digests.0.iter_mut().find(|(n, _)| *n == digest) {
        Some((_, Digest::Pbkdf2(d))) => {
            if !d.segments.contains(&name) {
                d.segments.push(name);
            }
            Ok(())
        }
        _ => Err(Error::Unsupported(format!(
            "digest {digest}, which is not a pbkdf2 digest"
        ))),
    }
}

/// `entry` with `flag` added (`LUKS2_segment_set_flag`).
pub(super) fn with_flag(entry: &SegmentEntry, flag: &str) -> SegmentEntry {
    let mut e = entry.clone();
    e.add_flag(flag);
    e
}

pub(super) fn linear(offset: u64, size: Option<u64>, flag: Option<&str>) -> SegmentEntry {
    ReencryptSegment {
        id: 0,
        offset,
        size,
        kind: SegmentKind::Linear,
        flags: flag.map(|f| vec![f.to_string()]).unwrap_or_default(),
    }
    .to_entry()
}

pub(super) fn crypt(
    offset: u64,
    iv_tweak: u64,
    cipher: &str,
    sector_size: u32,
    flag: &str,
) -> SegmentEntry {
    ReencryptSegment {
        id: 0,
        offset,
        size: None,
        kind: SegmentKind::Crypt {
            iv_tweak,
            encryption: cipher.into(),
            sector_size,
        },
        flags: vec![flag.into()],
    }
    .to_entry()
}

/// The metadata `cryptsetup reencrypt --encrypt --header HDR --init-only DATA` writes, from the
/// freshly formatted detached header (data offset 0, one crypt segment whose keyslots hold
/// `new_vk`): segment 0 becomes plaintext (`linear`, dynamic), `backup-previous` is that linear
/// layout, `backup-final` the formatted crypt segment; direction forward; resilience from
/// `opts`.
///
/// Nothing moves on the device: the data is encrypted in place, chunk by chunk, by the engine.
///
/// Errors: [`Error::WrongPassphrase`] if `new_vk` is not the header's key; [`Error::Unsupported`]
/// for a header with requirements, several segments, or no room for the keyslot.
pub fn init_encrypt(header: &Header, new_vk: &[u8], opts: &InitOptions) -> Result<Metadata, Error> {
    let (seg, digest) = plain_data_segment(header)?;
    check_key(header.metadata(), digest, new_vk)?;
    let mut md = header.metadata().clone();
    clear_segment_digests(&mut md);
    md.segments.0 = vec![
        (0, linear(seg.offset, None, None)),
        (1, linear(seg.offset, None, Some(FLAG_BACKUP_PREVIOUS))),
        (
            2,
            crypt(
                seg.offset,
                seg.iv_tweak,
                &seg.encryption,
                seg.sector_size,
                FLAG_BACKUP_FINAL,
            ),
        ),
    ];
    assign_segment(&mut md, digest, 2)?;
    let resilience = resilience_for(opts, &[seg.sector_size])?;
    finish_init(
        md,
        header.binary().hdr_size,
        Mode::Encrypt,
        Direction::Forward,
        resilience,
        None,
        Some(new_vk),
        opts,
    )
}

/// The metadata `cryptsetup reencrypt --encrypt --reduce-device-size 2*S --init-only DEV`
/// writes (header attached, `CRYPT_REENCRYPT_MOVE_FIRST_SEGMENT`), from a freshly formatted
/// header whose data offset is the shift S, for a device of `device_size` bytes.
///
/// With D = `device_size` − S and L = D − S (the size of the plaintext that will be encrypted):
/// segment 0 is `linear(D, min(S, L))` — where the engine must have **copied the device's first
/// bytes before writing this metadata** —, segment 1 (if L > S) `linear(S, L − S)` (the rest,
/// in place); `backup-moved-segment` copies segment 0, `backup-previous` is `linear(0, L)`,
/// `backup-final` the crypt segment at S; direction backward, resilience `datashift` by S in a
/// 4 KiB area. The header itself then goes over the first S bytes, which are safe at D.
///
/// Errors: those of [`init_encrypt`], and [`Error::Unsupported`] if the device is smaller than
/// twice the shift or not a multiple of the sector size past the header.
pub fn init_encrypt_datashift(
    header: &Header,
    new_vk: &[u8],
    device_size: u64,
    opts: &InitOptions,
) -> Result<Metadata, Error> {
    let (seg, digest) = plain_data_segment(header)?;
    check_key(header.metadata(), digest, new_vk)?;
    let shift = seg.offset;
    if shift == 0 || shift % 512 != 0 {
        return Err(Error::Unsupported(format!(
            "a data shift of {shift} bytes (the header's data offset must be the shift)"
        )));
    }
    let data_size = device_size.saturating_sub(shift);
    if data_size < shift {
        return Err(Error::Unsupported(format!(
            "a device of {device_size} bytes for a shift of {shift} bytes"
        )));
    }
    if data_size % u64::from(seg.sector_size.max(512)) != 0 {
        return Err(Error::Unsupported(format!(
            "a data area of {data_size} bytes, not a multiple of the sector size {}",
            seg.sector_size
        )));
    }
    // `reencrypt_set_encrypt_segments` with move_first_segment.
    let remaining = data_size - shift;
    if remaining == 0 {
        return Err(Error::Unsupported(format!(
            "a device of {device_size} bytes for a shift of {shift} bytes"
        )));
    }
    let first = linear(data_size, Some(remaining.min(shift)), None);
    let mut segments = vec![(0, first.clone())];
    if remaining > shift {
        segments.push((1, linear(shift, Some(remaining - shift), None)));
    }
    let n = segments.len() as u32;
    let mut md = header.metadata().clone();
    clear_segment_digests(&mut md);
    segments.push((n, with_flag(&first, FLAG_BACKUP_MOVED)));
    segments.push((
        n + 1,
        linear(0, Some(remaining), Some(FLAG_BACKUP_PREVIOUS)),
    ));
    segments.push((
        n + 2,
        crypt(
            shift,
            seg.iv_tweak,
            &seg.encryption,
            seg.sector_size,
            FLAG_BACKUP_FINAL,
        ),
    ));
    md.segments.0 = segments;
    assign_segment(&mut md, digest, n + 2)?;
    finish_init(
        md,
        header.binary().hdr_size,
        Mode::Encrypt,
        Direction::Backward,
        Resilience::Datashift { shift_size: shift },
        None,
        Some(new_vk),
        opts,
    )
}

/// The digest `vk` matches, preferring `first` (`LUKS2_digest_by_keyslot` of the new keyslot).
pub(super) fn digest_of_key(md: &Metadata, vk: &[u8], first: u32) -> Result<u32, Error> {
    let mut order: Vec<u32> = vec![first];
    order.extend(md.digests.iter().map(|(n, _)| n).filter(|n| *n != first));
    for n in order {
        if matches!(md.digests.get(n), Some(Digest::Pbkdf2(_))) && check_key(md, n, vk).is_ok() {
            return Ok(n);
        }
    }
    Err(Error::Unsupported(
        "a new volume key that no keyslot holds (add a keyslot for it first)".into(),
    ))
}

/// The metadata `cryptsetup reencrypt --init-only DEV` writes once the keyslots for the new key
/// exist (the CLI first adds them, bound to a digest of their own and to no segment): segment 0
/// stays, `backup-previous` is a copy of it, `backup-final` a crypt segment at the same offset
/// with `target`'s cipher and sector size; direction forward; resilience from `opts`.
///
/// Errors: [`Error::WrongPassphrase`] if `old_vk` is not the data segment's key;
/// [`Error::Unsupported`] if no keyslot holds `new_vk`, and as [`init_encrypt`].
pub fn init_reencrypt(
    header: &Header,
    old_vk: &[u8],
    new_vk: &[u8],
    target: &Target,
    opts: &InitOptions,
) -> Result<Metadata, Error> {
    let (seg, digest_old) = plain_data_segment(header)?;
    let md0 = header.metadata();
    check_key(md0, digest_old, old_vk)?;
    // Prefer a digest other than the old one: the same key is a cipher change with --keep-key.
    let first_other = md0
        .digests
        .iter()
        .map(|(n, _)| n)
        .find(|n| *n != digest_old)
        .unwrap_or(digest_old);
    let digest_new = digest_of_key(md0, new_vk, first_other)?;
    if !(512..=4096).contains(&target.sector_size) || !target.sector_size.is_power_of_two() {
        return Err(Error::Unsupported(format!(
            "a sector size of {}",
            target.sector_size
        )));
    }
    let mut md = md0.clone();
    let entry0 = SegmentEntry::Crypt(seg.clone());
    md.segments.0 = vec![
        (0, entry0.clone()),
        (1, with_flag(&entry0, FLAG_BACKUP_PREVIOUS)),
        (
            2,
            crypt(
                seg.offset,
                seg.iv_tweak,
                &target.cipher,
                target.sector_size,
                FLAG_BACKUP_FINAL,
            ),
        ),
    ];
    assign_segment(&mut md, digest_old, 1)?;
    assign_segment(&mut md, digest_new, 2)?;
    let resilience = resilience_for(opts, &[seg.sector_size, target.sector_size])?;
    finish_init(
        md,
        header.binary().hdr_size,
        Mode::Reencrypt,
        Direction::Forward,
        resilience,
        Some(old_vk),
        Some(new_vk),
        opts,
    )
}

/// The metadata `cryptsetup reencrypt --decrypt --header HDR --init-only DATA` writes for a
/// detached header (data offset 0): segment 0 stays, `backup-previous` is a copy of it,
/// `backup-final` is `linear` at the same offset, dynamic; direction backward; resilience from
/// `opts`.
///
/// Errors: [`Error::WrongPassphrase`] if `old_vk` is not the volume's key, and as
/// [`init_encrypt`].
pub fn init_decrypt(header: &Header, old_vk: &[u8], opts: &InitOptions) -> Result<Metadata, Error> {
    let (seg, digest) = plain_data_segment(header)?;
    check_key(header.metadata(), digest, old_vk)?;
    let mut md = header.metadata().clone();
    let entry0 = SegmentEntry::Crypt(seg.clone());
    md.segments.0 = vec![
        (0, entry0.clone()),
        (1, with_flag(&entry0, FLAG_BACKUP_PREVIOUS)),
        (2, linear(seg.offset, None, Some(FLAG_BACKUP_FINAL))),
    ];
    assign_segment(&mut md, digest, 1)?;
    let resilience = resilience_for(opts, &[seg.sector_size])?;
    finish_init(
        md,
        header.binary().hdr_size,
        Mode::Decrypt,
        Direction::Backward,
        resilience,
        Some(old_vk),
        None,
        opts,
    )
}

/// The metadata `cryptsetup reencrypt --decrypt --header NEWFILE --init-only DEV` writes to
/// NEWFILE for a volume whose header is on DEV (data offset S, `device_size` bytes): the first
/// `moved` bytes of ciphertext (clipped to S and to the data) are copied from S to 0 over the old
/// header **before this metadata is written**, the rest is decrypted forward, each chunk of S
/// bytes written S bytes before where it was read, and the moved chunk last, in place under
/// checksums (`docs/LUKS2-REENCRYPT.md` §5.2). Regular segments `crypt(0, M)`, `crypt(S + M,
/// dynamic)`; backups `backup-moved-segment` (the first), `backup-previous` `crypt(S,
/// dynamic)`, `backup-final` `linear(0, dynamic)`; resilience `datashift-checksum` (or
/// `datashift-journal` when `opts` asks for a journal); requirement `online-reencrypt-v3`.
///
/// Errors: as [`init_decrypt`], and [`Error::Unsupported`] for a header without a data offset,
/// a moved size that is not a multiple of the checksum block, or too large for the area.
pub fn init_decrypt_datashift(
    header: &Header,
    old_vk: &[u8],
    device_size: u64,
    moved: u64,
    opts: &InitOptions,
) -> Result<Metadata, Error> {
    let (seg, digest) = plain_data_segment(header)?;
    check_key(header.metadata(), digest, old_vk)?;
    let shift = seg.offset;
    let data_size = device_size.checked_sub(shift).filter(|d| *d > 0);
    let (Some(data_size), true) = (data_size, shift > 0) else {
        return Err(Error::Unsupported(format!(
            "moving the data of a {device_size}-byte device whose data starts at {shift}"
        )));
    };
    // The moved chunk is converted last and in place: under checksums of its blocks
    // (`datashift-checksum`, the default) or copied whole into the area first
    // (`datashift-journal`).
    let (resilience, block) = match resilience_for(opts, &[seg.sector_size])? {
        Resilience::Checksum { hash, sector_size } => (
            Resilience::DatashiftChecksum {
                hash,
                sector_size,
                shift_size: shift,
            },
            sector_size,
        ),
        Resilience::Journal => (
            Resilience::DatashiftJournal { shift_size: shift },
            seg.sector_size,
        ),
        _ => {
            return Err(Error::Unsupported(
                "decrypting a moved first segment without checksums or a journal".into(),
            ))
        }
    };
    let moved = moved.min(shift).min(data_size);
    if moved == 0 || !moved.is_multiple_of(u64::from(block)) {
        return Err(Error::Unsupported(format!(
            "a moved first segment of {moved} bytes (a non-zero multiple of {block})"
        )));
    }
    let previous = ReencryptSegment {
        id: 0,
        offset: shift,
        size: None,
        kind: SegmentKind::Crypt {
            iv_tweak: seg.iv_tweak,
            encryption: seg.encryption.clone(),
            sector_size: seg.sector_size,
        },
        flags: Vec::new(),
    };
    let first = previous.piece(0, 0, Some(moved), false);
    let mut segments = vec![first.to_entry()];
    if moved < data_size {
        segments.push(previous.piece(moved, shift + moved, None, false).to_entry());
    }
    segments.push(with_flag(&first.to_entry(), FLAG_BACKUP_MOVED));
    segments.push(with_flag(&previous.to_entry(), FLAG_BACKUP_PREVIOUS));
    segments.push(linear(0, None, Some(FLAG_BACKUP_FINAL)));
    let mut md = header.metadata().clone();
    clear_segment_digests(&mut md);
    md.segments.0 = segments
        .into_iter()
        .enumerate()
        .map(|(i, e)| (i as u32, e))
        .collect();
    let n = md.segments.0.len() as u32;
    for id in 0..n - 1 {
        assign_segment(&mut md, digest, id)?;
    }
    let hdr_size = header.binary().hdr_size;
    let md = finish_init(
        md,
        hdr_size,
        Mode::Decrypt,
        Direction::Forward,
        resilience.clone(),
        Some(old_vk),
        None,
        opts,
    )?;
    let r = parse(&md)?.ok_or_else(|| Error::Corrupt("the reencryption vanished".into()))?;
    let area = r.keyslot.area_size;
    match &resilience {
        Resilience::DatashiftChecksum {
            hash, sector_size, ..
        } => {
            let hash_len = crate::hash::parse(hash)?.digest_len() as u64;
            if moved / u64::from(*sector_size) * hash_len > area {
                return Err(Error::Unsupported(format!(
                    "a moved first segment of {moved} bytes: the keyslots area has room for the \
                     checksums of {} bytes",
                    area / hash_len * u64::from(*sector_size)
                )));
            }
        }
        // cryptsetup's words: the journal holds the whole moved segment.
        _ if moved > area => {
            return Err(Error::Unsupported(format!(
                "a moved segment too large for the journal: requested size {moved}, available \
                 space for {area} (a smaller --hotzone-size moves less)"
            )))
        }
        _ => {}
    }
    Ok(md)
}
