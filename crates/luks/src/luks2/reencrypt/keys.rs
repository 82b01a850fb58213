//! Opening the old and new volume keys of a reencryption with a passphrase.

use super::*;

/// The volume keys of a reencryption.
pub struct VolumeKeys {
    /// The old key (`None` for encryption).
    pub old: Option<Unlocked>,
    /// The new key (`None` for decryption; the same slot as `old` when both share a digest).
    pub new: Option<Unlocked>,
}

/// Open the old and the new volume key with one passphrase (`LUKS2_keyslot_open_all_segments`):
/// for each side whose backup segment has a digest, the keyslots of that digest are tried in
/// cryptsetup's priority order.
///
/// Errors: [`Error::Corrupt`] if there is no reencryption; otherwise those of
/// [`Header::unlock`] for the side that does not open.
pub fn unlock_volume_keys(
    header: &Header,
    dev: &dyn Storage,
    passphrase: &[u8],
) -> Result<VolumeKeys, Error> {
    let md = header.metadata();
    let r =
        parse(md)?.ok_or_else(|| Error::Corrupt("there is no reencryption in progress".into()))?;
    let open = |digest: Option<u32>, segment: u32| -> Result<Option<Unlocked>, Error> {
        let Some(d) = digest else { return Ok(None) };
        let slots: Vec<u32> = md
            .digests
            .get(d)
            .map(|d| d.keyslots().iter().filter_map(|s| s.parse().ok()).collect())
            .unwrap_or_default();
        let mut wrong = false;
        let mut hard = None;
        for p in [Priority::Prefer, Priority::Normal] {
            for &s in &slots {
                if md.keyslots.get(s).map(Keyslot::priority) != Some(p) {
                    continue;
                }
                match open_slot(md, dev, s, segment, passphrase) {
                    Ok(u) => return Ok(Some(u)),
                    Err(SlotFailure::WrongPassphrase) => wrong = true,
                    Err(SlotFailure::Failed(e)) => {
                        hard.get_or_insert(e);
                    }
                    Err(SlotFailure::Unusable(_)) => {}
                }
            }
        }
        Err(hard.unwrap_or(if wrong {
            Error::WrongPassphrase
        } else {
            Error::NoUsableKeyslot(format!("no keyslot of digest {d} may be tried"))
        }))
    };
    let old = open(r.digest_old, r.backup_previous.id)?;
    let new = if r.digest_new.is_some() && r.digest_new == r.digest_old {
        open(r.digest_new, r.backup_previous.id)?
    } else {
        open(r.digest_new, r.backup_final.id)?
    };
    Ok(VolumeKeys { old, new })
}
