//! Opening the old and new volume keys of a reencryption with a passphrase.

use super::*;
use sectorcrypt_secret::SecretBytes;

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
    unlock_volume_keys_in(header, dev, passphrase, None)
}

/// [`unlock_volume_keys`] with only keyslot `slot` tried for each side when given (cryptsetup
/// passes the same `--key-slot` for the old and the new key, so a reencryption whose keys sit in
/// two keyslots opens only without one).
pub fn unlock_volume_keys_in(
    header: &Header,
    dev: &dyn Storage,
    passphrase: &[u8],
    slot: Option<usize>,
) -> Result<VolumeKeys, Error> {
    let md = header.metadata();
    let r =
        parse(md)?.ok_or_else(|| Error::Corrupt("there is no reencryption in progress".into()))?;
    let open = |digest: Option<u32>| -> Result<Option<Unlocked>, Error> {
        digest
            .map(|d| open_by_digest(md, dev, passphrase, slot, d))
            .transpose()
    };
    let old = open(r.digest_old)?;
    // One digest for both sides (a reencryption that keeps the key): the same key twice.
    let new = match &old {
        Some(u) if r.digest_new == r.digest_old => Some(Unlocked {
            slot: u.slot,
            volume_key: SecretBytes::from_slice(&u.volume_key),
        }),
        _ => open(r.digest_new)?,
    };
    Ok(VolumeKeys { old, new })
}

/// Open only the new volume key (`None` when the reencryption has none: a decryption), for the
/// end of a conversion whose old key no longer opens (see [`all_converted`]).
///
/// Errors: [`Error::Corrupt`] if there is no reencryption; otherwise those of [`Header::unlock`].
pub fn unlock_new_key(
    header: &Header,
    dev: &dyn Storage,
    passphrase: &[u8],
) -> Result<Option<Unlocked>, Error> {
    let md = header.metadata();
    let r =
        parse(md)?.ok_or_else(|| Error::Corrupt("there is no reencryption in progress".into()))?;
    r.digest_new
        .map(|d| open_by_digest(md, dev, passphrase, None, d))
        .transpose()
}

/// Open the key of digest `digest` (`LUKS2_keyslot_open_by_digest`): keyslot `slot`, or every
/// keyslot in priority order, where the slots of other digests count as "not usable" for the
/// verdict, as in cryptsetup.
fn open_by_digest(
    md: &Metadata,
    dev: &dyn Storage,
    passphrase: &[u8],
    slot: Option<usize>,
    digest: u32,
) -> Result<Unlocked, Error> {
    let try_slot = |s: u32| {
        if md.keyslots.get(s).is_some() && md.digest_of_keyslot(s).map(|(n, _)| n) != Some(digest) {
            return Err(SlotFailure::Unusable(format!(
                "keyslot {s} does not hold the key of digest {digest}"
            )));
        }
        open_slot(md, dev, s, None, passphrase)
    };
    let none = format!("no keyslot of digest {digest} may be tried");
    open_in_order(md, slot, try_slot, &none)
}

/// Open a volume with `passphrase` as `cryptsetup open` does before it activates anything
/// (`_open_and_activate_luks2`), and so as `open --test-passphrase` answers:
///
/// - without an in-place conversion: keyslot `slot` (or any, in priority order) bound to the data
///   segment, or to no segment at all when `unbound` (cryptsetup's `CRYPT_ANY_SEGMENT`, which
///   `--test-passphrase` with `--key-slot` or `--unbound` asks for);
/// - during a conversion: the old and new volume keys by their digests (or, when `unbound`, the
///   one key `slot` holds), then the reencryption digest over the keyslot fields and backup
///   segments, so a header whose conversion state was edited without the keys
///   (CVE-2021-4122) never opens.
///
/// Returns the key the last keyslot opened (during a conversion, the new key if it has its own).
///
/// Errors: those of [`Header::unlock`]; during a conversion also [`Error::DigestMismatch`] when
/// the metadata does not verify (cryptsetup: "Reencryption metadata is invalid.", exit 2),
/// [`Error::NoUsableKeyslot`] when the reencryption digest is missing or a key the digest needs
/// was not opened (exit 1), [`Error::Corrupt`] / [`Error::Unsupported`] for metadata the
/// digest's serialiser refuses.
pub fn unlock_checked(
    header: &Header,
    dev: &dyn Storage,
    passphrase: &[u8],
    slot: Option<usize>,
    unbound: bool,
) -> Result<Unlocked, Error> {
    let md = header.metadata();
    if state(md) == State::None {
        return header.unlock_in(dev, passphrase, slot, unbound);
    }
    let r =
        parse(md)?.ok_or_else(|| Error::Corrupt("there is no reencryption in progress".into()))?;
    let keys = if unbound {
        let u = header.unlock_in(dev, passphrase, slot, true)?;
        let digest = md.digest_of_keyslot(u.slot as u32).map(|(n, _)| n);
        let copy = |u: &Unlocked| Unlocked {
            slot: u.slot,
            volume_key: SecretBytes::from_slice(&u.volume_key),
        };
        let needed = |d: Option<u32>| d.is_some() && d == digest;
        let old = needed(r.digest_old).then(|| copy(&u));
        let new = needed(r.digest_new).then(|| copy(&u));
        let missing = |side: &str, d: Option<u32>, have: &Option<Unlocked>| {
            if d.is_some() && have.is_none() {
                Err(Error::NoUsableKeyslot(format!(
                    "keyslot {} does not hold the {side} volume key, which checking the \
                     reencryption metadata needs",
                    u.slot
                )))
            } else {
                Ok(())
            }
        };
        missing("old", r.digest_old, &old)?;
        missing("new", r.digest_new, &new)?;
        VolumeKeys { old, new }
    } else {
        unlock_volume_keys_in(header, dev, passphrase, slot)?
    };
    if r.digest.is_none() {
        return Err(Error::NoUsableKeyslot(
            "reencryption metadata is invalid: the reencrypt keyslot has no digest".into(),
        ));
    }
    fn key(u: &Option<Unlocked>) -> Option<&[u8]> {
        u.as_ref().map(|u| &u.volume_key[..])
    }
    if !verify_metadata_digest(md, key(&keys.old), key(&keys.new))? {
        return Err(Error::DigestMismatch(
            "the digest over the reencrypt keyslot (mode, direction, resilience area) and the backup \
             segments"
                .into(),
        ));
    }
    keys.new
        .or(keys.old)
        .ok_or_else(|| Error::NoUsableKeyslot("the reencryption has no volume key".into()))
}
