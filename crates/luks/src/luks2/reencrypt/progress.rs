//! Building the metadata of each step: the segments after the next hotzone (or with it "hot"),
//! for every plan, and the metadata once the conversion is finished.

use super::*;

/// The metadata of a forward encryption in place (detached header, no data shift) with `done`
/// bytes encrypted from the start of the data and, if `hot` is given, the next `hot` bytes being
/// written (flagged `in-reencryption`): the "hot" and "post" segment sets of cryptsetup's
/// `reencrypt_make_hot_segments` / `_post_segments` for this mode. Regular segments: `crypt(0,
/// done)`, `crypt(done, hot, in-reencryption)`, `linear(rest, dynamic)`; then the backup segments
/// unchanged; the new volume key's digest lists `backup-final` and every regular crypt segment.
///
/// Errors: [`Error::Unsupported`] unless `r` is a forward encryption without a data shift.
pub fn encrypt_forward_progress(
    md: &Metadata,
    r: &Reencryption,
    done: u64,
    hot: Option<u64>,
) -> Result<Metadata, Error> {
    in_place_layout(r, Mode::Encrypt, Direction::Forward)?;
    let side = CryptSide::of(r, Mode::Encrypt)?;
    let base = side.layout.offset;
    let crypt_at =
        |at: u64, size: u64, hot: bool| side.layout.piece(at, base + at, Some(size), hot);
    let mut regular = Vec::new();
    if done > 0 {
        regular.push(crypt_at(0, done, false));
    }
    if let Some(len) = hot {
        regular.push(crypt_at(done, len, true));
    }
    let rest = done + hot.unwrap_or(0);
    regular.push(linear_at(base + rest, None, false));
    side.progress(md, regular)
}

/// The metadata of a backward decryption in place (detached header, no data shift) with the
/// first `remaining` bytes still encrypted and, if `hot` is given, the next `hot` bytes being
/// written as plaintext (flagged `in-reencryption`); `total` is the size of the data. Regular
/// segments: `crypt(0, remaining)`, `linear(remaining, hot, in-reencryption)`, `linear(rest,
/// dynamic)` (as cryptsetup's decrypt states in `docs/LUKS2-REENCRYPT.md` §6.C); the old volume
/// key's digest lists `backup-previous` and the regular crypt segment.
///
/// Errors: [`Error::Unsupported`] unless `r` is a backward decryption without a data shift.
pub fn decrypt_backward_progress(
    md: &Metadata,
    r: &Reencryption,
    remaining: u64,
    hot: Option<u64>,
    total: u64,
) -> Result<Metadata, Error> {
    in_place_layout(r, Mode::Decrypt, Direction::Backward)?;
    let side = CryptSide::of(r, Mode::Decrypt)?;
    let base = side.layout.offset;
    let mut regular = Vec::new();
    if remaining > 0 {
        regular.push(side.layout.piece(0, base, Some(remaining), false));
    }
    let mut end = remaining;
    if let Some(len) = hot {
        regular.push(linear_at(base + remaining, Some(len), true));
        end += len;
    }
    if end < total {
        regular.push(linear_at(base + end, None, false));
    }
    side.progress(md, regular)
}

/// The metadata of a forward reencryption in place (new volume key, optionally a new sector
/// size; no data shift) with `done` bytes under the new key and, if `hot` is given, the next
/// `hot` bytes being rewritten (flagged `in-reencryption`, listed by both keys' digests, as
/// cryptsetup does); `total` is the size of the data. Regular segments: new `crypt(0, done)`,
/// `crypt(done, hot)`, old `crypt(rest, dynamic)`; once everything is done, one new dynamic
/// segment (`docs/LUKS2-REENCRYPT.md` §6.E).
///
/// Errors: [`Error::Unsupported`] unless `r` is a forward reencryption without a data shift.
pub fn reencrypt_forward_progress(
    md: &Metadata,
    r: &Reencryption,
    done: u64,
    hot: Option<u64>,
    total: u64,
) -> Result<Metadata, Error> {
    in_place_layout(r, Mode::Reencrypt, Direction::Forward)?;
    let (Some(old_digest), Some(new_digest)) = (r.digest_old, r.digest_new) else {
        return Err(Error::Corrupt("a reencryption without two digests".into()));
    };
    let base = r.backup_final.offset;
    let piece = |template: &ReencryptSegment, at: u64, size: Option<u64>, hot: bool| {
        template.piece(at, base + at, size, hot)
    };
    // (segment, listed by the new key's digest, listed by the old key's digest)
    let mut regular: Vec<(ReencryptSegment, bool, bool)> = Vec::new();
    let end = done + hot.unwrap_or(0);
    if end >= total && hot.is_none() {
        regular.push((piece(&r.backup_final, 0, None, false), true, false));
    } else {
        if done > 0 {
            regular.push((piece(&r.backup_final, 0, Some(done), false), true, false));
        }
        if let Some(len) = hot {
            regular.push((piece(&r.backup_final, done, Some(len), true), true, true));
        }
        if end < total {
            regular.push((piece(&r.backup_previous, end, None, false), false, true));
        }
    }
    let mut out = with_regular_segments(
        md,
        regular.iter().map(|(s, _, _)| s.clone()).collect(),
        new_digest,
        FLAG_BACKUP_FINAL,
    )?;
    // `with_regular_segments` listed every crypt segment under the new digest: put each where it
    // belongs, and the backup-previous under the old digest.
    clear_segment_digests(&mut out);
    let final_id = segment_by_flag(&out, FLAG_BACKUP_FINAL).map(|(id, _)| id);
    let previous_id = segment_by_flag(&out, FLAG_BACKUP_PREVIOUS).map(|(id, _)| id);
    let (Some(final_id), Some(previous_id)) = (final_id, previous_id) else {
        return Err(Error::Corrupt("backup segments are missing".into()));
    };
    assign_segment(&mut out, new_digest, final_id)?;
    assign_segment(&mut out, old_digest, previous_id)?;
    for (i, (_, new, old)) in regular.iter().enumerate() {
        if *new {
            assign_segment(&mut out, new_digest, i as u32)?;
        }
        if *old {
            assign_segment(&mut out, old_digest, i as u32)?;
        }
    }
    Ok(out)
}

pub(super) fn linear_at(offset: u64, size: Option<u64>, hot: bool) -> ReencryptSegment {
    ReencryptSegment {
        id: 0,
        offset,
        size,
        kind: SegmentKind::Linear,
        flags: if hot {
            vec![FLAG_IN_REENCRYPTION.into()]
        } else {
            Vec::new()
        },
    }
}

/// `md` with `regular` as its regular segments (numbered from 0), the backup segments after them
/// unchanged, and `digest` listing the backup segment flagged `backup` and every regular crypt
/// segment.
pub(super) fn with_regular_segments(
    md: &Metadata,
    regular: Vec<ReencryptSegment>,
    digest: u32,
    backup: &str,
) -> Result<Metadata, Error> {
    let crypt_ids: Vec<u32> = (0..regular.len() as u32)
        .filter(|&i| matches!(regular[i as usize].kind, SegmentKind::Crypt { .. }))
        .collect();
    let mut out = md.clone();
    let backups: Vec<SegmentEntry> = md
        .segments
        .0
        .iter()
        .filter(|(_, e)| is_backup(e))
        .map(|(_, e)| e.clone())
        .collect();
    let n = regular.len() as u32;
    out.segments.0 = regular
        .iter()
        .enumerate()
        .map(|(i, seg)| (i as u32, seg.to_entry()))
        .chain(
            backups
                .into_iter()
                .enumerate()
                .map(|(i, e)| (n + i as u32, e)),
        )
        .collect();
    clear_segment_digests(&mut out);
    let backup_id = segment_by_flag(&out, backup)
        .map(|(id, _)| id)
        .ok_or_else(|| Error::Corrupt(format!("there is no {backup} segment")))?;
    assign_segment(&mut out, digest, backup_id)?;
    for id in crypt_ids {
        assign_segment(&mut out, digest, id)?;
    }
    Ok(out)
}

/// The metadata once a reencryption has converted everything (`reencrypt_teardown_ok`): the
/// `backup-final` layout as the only segment, no reencrypt keyslot, no reencryption digest, no
/// reencryption requirement, the new volume key's digest listing segment 0, and the old key's
/// keyslots and digest removed. The caller wipes the removed keyslots' areas.
pub fn finished(md: &Metadata, r: &Reencryption) -> Result<Metadata, Error> {
    let mut out = md.clone();
    let mut last = r.backup_final.clone();
    last.flags.clear();
    out.segments.0 = vec![(0, last.to_entry())];
    out.keyslots.0.retain(|(n, _)| *n != r.keyslot.slot);
    if let Some(d) = r.digest {
        out.digests.0.retain(|(n, _)| *n != d);
    }
    clear_segment_digests(&mut out);
    if let (Some(d), SegmentKind::Crypt { .. }) = (r.digest_new, &r.backup_final.kind) {
        assign_segment(&mut out, d, 0)?;
    }
    // The old key protects nothing any more: its keyslots and digest go (a decryption ends
    // with no keyslots at all, as cryptsetup's does), and with them every token's reference to
    // those keyslots (a token left naming a removed keyslot is invalid metadata).
    if let Some(old) = r.digest_old.filter(|d| Some(*d) != r.digest_new) {
        let slots: Vec<u32> = out
            .digests
            .get(old)
            .map(|d| d.keyslots().iter().filter_map(|s| s.parse().ok()).collect())
            .unwrap_or_default();
        for slot in slots {
            out.remove_keyslot(slot);
        }
        out.digests.0.retain(|(n, _)| *n != old);
    }
    if let Some(req) = out.config.requirements.as_mut() {
        if let Some(m) = req.mandatory.as_mut() {
            m.retain(|x| !x.starts_with("online-reencrypt"));
            if m.is_empty() {
                req.mandatory = None;
            }
        }
        if req.mandatory.is_none() && req.extra.is_empty() {
            out.config.requirements = None;
        }
    }
    Ok(out)
}

/// The datashift layout of `r` (shift, moved segment), checked to be `mode` with `direction`.
pub(super) fn shift_layout(
    r: &Reencryption,
    mode: Mode,
    direction: Direction,
) -> Result<(u64, &ReencryptSegment), Error> {
    match (r.keyslot.resilience.shift_size(), &r.backup_moved) {
        (Some(shift), Some(moved))
            if r.keyslot.mode == mode && r.keyslot.direction == direction =>
        {
            Ok((shift, moved))
        }
        _ => Err(wrong_layout(mode, direction, "with a moved first segment")),
    }
}

/// `r` must be `mode` in `direction` without a data shift.
pub(super) fn in_place_layout(
    r: &Reencryption,
    mode: Mode,
    direction: Direction,
) -> Result<(), Error> {
    match r.backup_moved {
        None if r.keyslot.mode == mode && r.keyslot.direction == direction => Ok(()),
        _ => Err(wrong_layout(mode, direction, "without a data shift")),
    }
}

/// The one key of an encryption or a decryption: the backup layout its crypt segments are cut
/// from (`backup-final` for an encryption, `backup-previous` for a decryption), found by `flag`,
/// and the digest of its volume key. Each progress step of those modes lists its crypt segments
/// under that digest, so the three always go together.
struct CryptSide<'a> {
    layout: &'a ReencryptSegment,
    digest: u32,
    flag: &'static str,
}

impl<'a> CryptSide<'a> {
    /// The crypt side of `r`, an encryption (`mode` [`Mode::Encrypt`]) or a decryption.
    fn of(r: &'a Reencryption, mode: Mode) -> Result<Self, Error> {
        let (layout, digest, flag) = if mode == Mode::Encrypt {
            (&r.backup_final, r.digest_new, FLAG_BACKUP_FINAL)
        } else {
            (&r.backup_previous, r.digest_old, FLAG_BACKUP_PREVIOUS)
        };
        if !matches!(layout.kind, SegmentKind::Crypt { .. }) {
            return Err(Error::Corrupt(format!(
                "the {flag} segment is not a crypt segment"
            )));
        }
        let digest =
            digest.ok_or_else(|| Error::Corrupt(format!("no digest lists the {flag} segment")))?;
        Ok(CryptSide {
            layout,
            digest,
            flag,
        })
    }

    /// The metadata of a step: [`with_regular_segments`] under this side's digest.
    fn progress(&self, md: &Metadata, regular: Vec<ReencryptSegment>) -> Result<Metadata, Error> {
        with_regular_segments(md, regular, self.digest, self.flag)
    }
}

pub(super) fn wrong_layout(mode: Mode, direction: Direction, how: &str) -> Error {
    Error::Unsupported(format!(
        "progress of anything but a {} {} {how}",
        direction.as_str(),
        mode.as_str()
    ))
}

/// The metadata of the attached-header decryption of [`init_decrypt_datashift`] when the
/// logical range `[at, at + len)` of the `total` data bytes is being written (`hot`) or has
/// just been written. For `at > 0` that is a datashift chunk: regular segments `crypt(0, M)`
/// (the moved copy), `linear(M, ...)` (decrypted), the hotzone, `crypt(S + at + len, dynamic)`
/// (still to do); once the last chunk is done the plaintext is `linear(M, dynamic)`. `at == 0`
/// is the final step, the moved segment decrypted in place: `linear(0, M, in-reencryption)`,
/// `linear(M, dynamic)`, then just `linear(0, dynamic)` (`docs/LUKS2-REENCRYPT.md` §6.D).
///
/// Errors: [`Error::Unsupported`] unless `r` is a forward decryption with a moved segment.
pub fn decrypt_datashift_progress(
    md: &Metadata,
    r: &Reencryption,
    at: u64,
    len: u64,
    hot: bool,
    total: u64,
) -> Result<Metadata, Error> {
    let (shift, moved) = shift_layout(r, Mode::Decrypt, Direction::Forward)?;
    let side = CryptSide::of(r, Mode::Decrypt)?;
    let m = moved.size.unwrap_or(0);
    let end = at + len;
    let mut regular = Vec::new();
    if at == 0 {
        if hot {
            regular.push(linear_at(0, Some(len), true));
            regular.push(linear_at(len, None, false));
        } else {
            regular.push(linear_at(0, None, false));
        }
    } else {
        regular.push(moved.piece(0, moved.offset, moved.size, false));
        if hot {
            if at > m {
                regular.push(linear_at(m, Some(at - m), false));
            }
            regular.push(linear_at(at, Some(len), true));
        } else {
            regular.push(linear_at(m, (end < total).then(|| end - m), false));
        }
        if end < total {
            regular.push(side.layout.piece(end, shift + end, None, false));
        }
    }
    let mut out = side.progress(md, regular)?;
    let moved_id = segment_by_flag(&out, FLAG_BACKUP_MOVED)
        .map(|(id, _)| id)
        .ok_or_else(|| Error::Corrupt("there is no backup-moved-segment".into()))?;
    assign_segment(&mut out, side.digest, moved_id)?;
    Ok(out)
}

/// The metadata of the attached-header encryption of [`init_encrypt_datashift`] (backward, shift
/// S) when the logical range `[at, at + len)` of the `total` plaintext bytes is being written
/// (`hot`: `crypt(S + at, len, in-reencryption)`) or has just been written. The plaintext still
/// to do, `[0, at)`, is `linear(moved, min(S, at))` (its first S bytes, copied to the moved
/// segment) and `linear(S, at - S)` (the rest, in place); the ciphertext after the hotzone is
/// `crypt(S + at + len, total - at - len)`, and when `at` reaches 0, `crypt(S, dynamic)`
/// (`docs/LUKS2-REENCRYPT.md` §6.A).
///
/// Errors: [`Error::Unsupported`] unless `r` is a backward encryption with a moved segment.
pub fn encrypt_datashift_progress(
    md: &Metadata,
    r: &Reencryption,
    at: u64,
    len: u64,
    hot: bool,
    total: u64,
) -> Result<Metadata, Error> {
    let (shift, moved) = shift_layout(r, Mode::Encrypt, Direction::Backward)?;
    let side = CryptSide::of(r, Mode::Encrypt)?;
    let mut regular = Vec::new();
    if at > 0 {
        regular.push(linear_at(moved.offset, Some(at.min(shift)), false));
    }
    if at > shift {
        regular.push(linear_at(shift, Some(at - shift), false));
    }
    let final_ = side.layout;
    if hot {
        regular.push(final_.piece(at, shift + at, Some(len), true));
        if at + len < total {
            let rest = at + len;
            regular.push(final_.piece(rest, shift + rest, Some(total - rest), false));
        }
    } else {
        let size = (at > 0).then(|| total - at);
        regular.push(final_.piece(at, shift + at, size, false));
    }
    side.progress(md, regular)
}
