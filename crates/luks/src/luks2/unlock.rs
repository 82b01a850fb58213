//! Opening `luks2` keyslots with a passphrase (cryptsetup's `luks2_keyslot_get_key` and
//! `LUKS2_keyslot_open`): derive the area key with the keyslot's KDF, decrypt the area, merge the
//! AF stripes, and accept the result only if the keyslot's digest matches it.

use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;

use super::limits::{KDF_SALT_LEN, STRIPES};
use super::metadata::{Digest, Keyslot, KeyslotKdf, Luks2Keyslot, Metadata, Priority};
use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::Kdf;
use crate::keyslot::{digest_matches, KeyslotArea};
use crate::Unlocked;

/// The shortest digest cryptsetup checks (`LUKS_DIGESTSIZE`, from SHA-1).
const DIGEST_MIN: usize = 20;
/// The largest volume or area key accepted: real ones are at most 64 bytes (512-bit XTS); the
/// bound keeps a damaged header from making one keyslot allocate gigabytes (the area key is
/// derived into a buffer of its size, and 4000 stripes are read per volume key byte).
const MAX_KEY_BYTES: u32 = 1024;
/// The largest Argon2 memory cost cryptsetup sets (`MAX_PBKDF_MEMORY`, 4 GiB in KiB). A larger
/// one in a header is damage; allocating it would abort the process.
const MAX_ARGON2_MEMORY_KIB: u32 = 4 * 1024 * 1024;

/// Why one keyslot did not give the volume key.
pub(super) enum SlotFailure {
    /// The slot was not a candidate (cryptsetup's `-ENOENT`): the text says why.
    Unusable(String),
    /// The passphrase is not this slot's (`-EPERM`).
    WrongPassphrase,
    /// The slot could not be tried: unsupported parameters, damage, I/O.
    Failed(Error),
}

impl From<Error> for SlotFailure {
    fn from(e: Error) -> Self {
        SlotFailure::Failed(e)
    }
}

fn slot_corrupt(slot: u32, what: String) -> SlotFailure {
    SlotFailure::Failed(Error::Corrupt(format!("keyslot {slot}: {what}")))
}

/// A hash named in the header; a name no cryptsetup backend offers is unsupported, not damage.
fn hash(name: &str, slot: u32, what: &str) -> Result<Hash, SlotFailure> {
    Hash::from_name(name).ok_or_else(|| {
        SlotFailure::Failed(Error::Unsupported(format!(
            "keyslot {slot} uses the unknown {what} hash '{name}'"
        )))
    })
}

/// The KDF with its recorded cost, and the salt.
fn kdf(k: &Luks2Keyslot, slot: u32) -> Result<(Kdf, &[u8]), SlotFailure> {
    let kdf = match &k.kdf {
        KeyslotKdf::Pbkdf2 {
            hash: h,
            iterations,
            ..
        } => Kdf::Pbkdf2 {
            hash: hash(h, slot, "PBKDF2")?,
            iterations: *iterations,
        },
        KeyslotKdf::Argon2 { memory, .. } if *memory > MAX_ARGON2_MEMORY_KIB => {
            return Err(slot_corrupt(
                slot,
                format!("an Argon2 memory cost of {memory} KiB, above cryptsetup's 4 GiB"),
            ))
        }
        KeyslotKdf::Argon2 {
            variant,
            time,
            memory,
            cpus,
            ..
        } => Kdf::Argon2 {
            variant: *variant,
            time: *time,
            memory_kib: *memory,
            parallel: *cpus,
        },
    };
    let salt = k.kdf.salt();
    if salt.len() != KDF_SALT_LEN {
        return Err(slot_corrupt(
            slot,
            format!(
                "the KDF salt has {} bytes instead of {KDF_SALT_LEN}",
                salt.len()
            ),
        ));
    }
    Ok((kdf, salt))
}

/// Where and how the slot's material is stored.
fn area(k: &Luks2Keyslot, slot: u32) -> Result<KeyslotArea, SlotFailure> {
    if k.af.stripes != STRIPES {
        return Err(SlotFailure::Failed(Error::Unsupported(format!(
            "keyslot {slot} has {} AF stripes (cryptsetup opens only {STRIPES})",
            k.af.stripes
        ))));
    }
    for (size, what) in [(k.key_size, "volume"), (k.area.key_size, "area")] {
        if size == 0 || size > MAX_KEY_BYTES {
            return Err(slot_corrupt(
                slot,
                format!("its {what} key size is {size} bytes"),
            ));
        }
    }
    let area = KeyslotArea {
        offset: k.area.offset,
        cipher: k.area.encryption.clone(),
        key_size: k.area.key_size as usize,
        volume_key_size: k.key_size as usize,
        stripes: STRIPES as usize,
        af_hash: hash(&k.af.hash, slot, "AF")?,
    };
    // cryptsetup reads the material without looking at the area size; its own areas always hold
    // it, so a smaller area means damage, and reading on would read another slot's material.
    let needed = area.disk_len()? as u64;
    if needed > k.area.size {
        return Err(slot_corrupt(
            slot,
            format!(
                "its key material needs {needed} bytes but its area has {}",
                k.area.size
            ),
        ));
    }
    Ok(area)
}

/// Check `candidate` against a digest.
fn digest_ok(
    digest: &Digest,
    number: u32,
    slot: u32,
    candidate: &[u8],
) -> Result<bool, SlotFailure> {
    let Digest::Pbkdf2(d) = digest else {
        return Err(SlotFailure::Failed(Error::Unsupported(format!(
            "digest {number} of keyslot {slot} has the type '{}' (sectorcrypt has pbkdf2)",
            digest.kind()
        ))));
    };
    let h = hash(&d.hash, slot, "digest")?;
    let what = |s: String| SlotFailure::Failed(Error::Corrupt(format!("digest {number}: {s}")));
    if d.salt.len() != KDF_SALT_LEN {
        return Err(what(format!(
            "the salt has {} bytes instead of {KDF_SALT_LEN}",
            d.salt.len()
        )));
    }
    let n = d.digest.len();
    if !(DIGEST_MIN..=64).contains(&n) || (n != DIGEST_MIN && n != h.digest_len()) {
        return Err(what(format!("a digest of {n} bytes for {}", h.name())));
    }
    Ok(digest_matches(
        candidate,
        h,
        d.iterations,
        &d.salt,
        &d.digest,
    )?)
}

/// Try keyslot `slot` for the segment `segment` (`LUKS2_open_and_verify`); `None` is cryptsetup's
/// `CRYPT_ANY_SEGMENT`: the slot need not be bound to any segment (an "unbound" keyslot, as
/// `cryptsetup luksAddKey --unbound` makes), only its digest must match.
pub(super) fn open_slot(
    meta: &Metadata,
    dev: &dyn Storage,
    slot: u32,
    segment: Option<u32>,
    passphrase: &[u8],
) -> Result<Unlocked, SlotFailure> {
    let Some(keyslot) = meta.keyslots.get(slot) else {
        return Err(SlotFailure::Unusable(format!(
            "keyslot {slot} is not in use"
        )));
    };
    let k = match keyslot {
        Keyslot::Luks2(k) => k,
        Keyslot::Other(_) if keyslot.kind() == "luks2" => {
            return Err(SlotFailure::Failed(Error::Unsupported(format!(
                "keyslot {slot} uses a KDF sectorcrypt does not implement"
            ))))
        }
        Keyslot::Reencrypt(_) | Keyslot::Other(_) => {
            return Err(SlotFailure::Unusable(format!(
                "keyslot {slot} has the type '{}', which holds no passphrase",
                keyslot.kind()
            )))
        }
    };
    let Some((number, digest)) = meta.digest_of_keyslot(slot) else {
        return Err(SlotFailure::Unusable(format!(
            "keyslot {slot} has no digest"
        )));
    };
    // A slot whose digest does not cover the segment holds some other key ("unbound").
    if let Some(segment) = segment {
        if !digest.segments().contains(&segment.to_string().as_str()) {
            return Err(SlotFailure::Unusable(format!(
                "keyslot {slot} is not bound to the data segment"
            )));
        }
    }
    let (kdf, salt) = kdf(k, slot)?;
    let area = area(k, slot)?;
    let candidate: SecretBytes = area.open(dev, &kdf, salt, passphrase)?;
    if digest_ok(digest, number, slot, &candidate)? {
        Ok(Unlocked {
            slot: slot as usize,
            volume_key: candidate,
        })
    } else {
        Err(SlotFailure::WrongPassphrase)
    }
}

/// The verdict of the keyslots tried in one priority group, by cryptsetup's rule
/// (`LUKS2_keyslot_open_priority`): a slot that opens wins; otherwise the **last** slot tried
/// decides between "wrong passphrase" (`-EPERM`) and "not usable" (`-ENOENT`), so that, for
/// example, a wrong passphrase on a volume whose last keyslot is unbound is "No usable keyslot"
/// (exit 1), as with cryptsetup. Hard failures (damage, unsupported parameters, I/O) are kept
/// apart: the first is reported if nothing opens.
pub(super) struct Verdict {
    pub(super) opened: Option<Unlocked>,
    /// The last soft result: `None` when no slot was tried.
    pub(super) last: Option<SlotFailure>,
    pub(super) hard: Option<Error>,
}

impl Verdict {
    /// Try `slots` in order with `try_slot` until one opens.
    pub(super) fn of(
        slots: impl IntoIterator<Item = u32>,
        mut try_slot: impl FnMut(u32) -> Result<Unlocked, SlotFailure>,
    ) -> Verdict {
        let mut v = Verdict {
            opened: None,
            last: None,
            hard: None,
        };
        for s in slots {
            match try_slot(s) {
                Ok(u) => {
                    v.opened = Some(u);
                    break;
                }
                Err(SlotFailure::Failed(e)) => {
                    v.hard.get_or_insert(e);
                }
                Err(soft) => v.last = Some(soft),
            }
        }
        v
    }

    /// Combine the "prefer" group's verdict with the "normal" group's (`LUKS2_keyslot_open`):
    /// a wrong passphrase among the preferred slots beats "not usable" among the normal ones.
    pub(super) fn resolve(prefer: Verdict, normal: Verdict, none: &str) -> Result<Unlocked, Error> {
        if let Some(u) = prefer.opened.or(normal.opened) {
            return Ok(u);
        }
        if let Some(e) = prefer.hard.or(normal.hard) {
            return Err(e);
        }
        let prefer_wrong = matches!(prefer.last, Some(SlotFailure::WrongPassphrase));
        match normal.last {
            Some(SlotFailure::WrongPassphrase) => Err(Error::WrongPassphrase),
            _ if prefer_wrong => Err(Error::WrongPassphrase),
            Some(SlotFailure::Unusable(why)) => Err(no_usable(&why)),
            _ => Err(no_usable(none)),
        }
    }
}

/// Open the keyslot `slot`, or else every candidate in cryptsetup's order: the preferred slots,
/// then the normal ones, each group in header order; slots with priority "ignore" only when asked
/// for by number. `segment` `None` accepts keyslots bound to no segment (cryptsetup's
/// `CRYPT_ANY_SEGMENT`, what `open --test-passphrase --key-slot N` asks for).
///
/// When none opens: the first hard failure (unsupported or damaged slot, I/O), since the
/// passphrase could not be checked there; otherwise the verdict of [`Verdict::resolve`]:
/// [`Error::WrongPassphrase`] or [`Error::NoUsableKeyslot`] as cryptsetup decides them.
pub(super) fn unlock(
    meta: &Metadata,
    dev: &dyn Storage,
    passphrase: &[u8],
    slot: Option<usize>,
    segment: Option<u32>,
) -> Result<Unlocked, Error> {
    open_in_order(
        meta,
        slot,
        |s| open_slot(meta, dev, s, segment, passphrase),
        "no keyslot may be tried without its number",
    )
}

/// Try keyslot `slot` with `try_slot`, or else every keyslot in cryptsetup's order (the preferred
/// group, then the normal one unless a preferred slot opened), and give the verdict of
/// [`Verdict::resolve`]; `none` is the reason when no slot could be tried.
pub(super) fn open_in_order(
    meta: &Metadata,
    slot: Option<usize>,
    try_slot: impl Fn(u32) -> Result<Unlocked, SlotFailure>,
    none: &str,
) -> Result<Unlocked, Error> {
    let empty = || Verdict::of([], &try_slot);
    match slot {
        Some(s) => match u32::try_from(s) {
            Ok(s) => Verdict::resolve(empty(), Verdict::of([s], &try_slot), none),
            Err(_) => Err(no_usable(&format!("keyslot {s} is not in use"))),
        },
        None => {
            let group = |p: Priority| -> Vec<u32> {
                meta.keyslots
                    .iter()
                    .filter(|(_, k)| k.priority() == p)
                    .map(|(n, _)| n)
                    .collect()
            };
            let prefer = Verdict::of(group(Priority::Prefer), &try_slot);
            let normal = if prefer.opened.is_some() {
                empty()
            } else {
                Verdict::of(group(Priority::Normal), &try_slot)
            };
            Verdict::resolve(prefer, normal, none)
        }
    }
}

/// cryptsetup's "No usable keyslot is available.", with the reason.
fn no_usable(why: &str) -> Error {
    Error::NoUsableKeyslot(why.to_string())
}
