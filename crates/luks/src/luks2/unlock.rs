//! Opening `luks2` keyslots with a passphrase (cryptsetup's `luks2_keyslot_get_key` and
//! `LUKS2_keyslot_open`): derive the area key with the keyslot's KDF, decrypt the area, merge the
//! AF stripes, and accept the result only if the keyslot's digest matches it.

use super::limits::{KDF_SALT_LEN, STRIPES};
use sectorcrypt_storage::Storage;
use zeroize::Zeroizing;

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

/// A hash named in the header; names sectorcrypt does not implement are unsupported, not damage
/// (cryptsetup's crypto backends know many more).
fn hash(name: &str, slot: u32, what: &str) -> Result<Hash, SlotFailure> {
    Hash::parse(name).map_err(|_| {
        SlotFailure::Failed(Error::Unsupported(format!(
            "keyslot {slot} uses the {what} hash '{name}' (sectorcrypt has sha1, sha256 and sha512)"
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

/// Try keyslot `slot` for the data segment `segment`.
pub(super) fn open_slot(
    meta: &Metadata,
    dev: &dyn Storage,
    slot: u32,
    segment: u32,
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
    // A slot whose digest does not cover the data segment holds some other key ("unbound").
    let Some((number, digest)) = meta.digest_of_keyslot(slot) else {
        return Err(SlotFailure::Unusable(format!(
            "keyslot {slot} has no digest"
        )));
    };
    if !digest.segments().contains(&segment.to_string().as_str()) {
        return Err(SlotFailure::Unusable(format!(
            "keyslot {slot} is not bound to the data segment"
        )));
    }
    let (kdf, salt) = kdf(k, slot)?;
    let area = area(k, slot)?;
    let candidate: Zeroizing<Vec<u8>> = area.open(dev, &kdf, salt, passphrase)?;
    if digest_ok(digest, number, slot, &candidate)? {
        Ok(Unlocked {
            slot: slot as usize,
            volume_key: candidate,
        })
    } else {
        Err(SlotFailure::WrongPassphrase)
    }
}

/// Open the keyslot `slot`, or else every candidate in cryptsetup's order: the preferred slots,
/// then the normal ones, each group in header order; slots with priority "ignore" only when asked
/// for by number.
///
/// When none opens: the first hard failure (unsupported or damaged slot, I/O), since the
/// passphrase could not be checked there; otherwise [`Error::WrongPassphrase`] if any slot was
/// tried; otherwise "no usable keyslot" (cryptsetup's `-ENOENT`).
pub(super) fn unlock(
    meta: &Metadata,
    dev: &dyn Storage,
    passphrase: &[u8],
    slot: Option<usize>,
    segment: u32,
) -> Result<Unlocked, Error> {
    let order: Vec<u32> = match slot {
        Some(s) => match u32::try_from(s) {
            Ok(s) => vec![s],
            Err(_) => return Err(no_usable(&format!("keyslot {s} is not in use"))),
        },
        None => [Priority::Prefer, Priority::Normal]
            .iter()
            .flat_map(|p| {
                meta.keyslots
                    .iter()
                    .filter(move |(_, k)| k.priority() == *p)
                    .map(|(n, _)| n)
            })
            .collect(),
    };
    let mut hard: Option<Error> = None;
    let mut wrong = false;
    let mut unusable: Option<String> = None;
    for s in order {
        match open_slot(meta, dev, s, segment, passphrase) {
            Ok(u) => return Ok(u),
            Err(SlotFailure::WrongPassphrase) => wrong = true,
            Err(SlotFailure::Failed(e)) => {
                hard.get_or_insert(e);
            }
            Err(SlotFailure::Unusable(why)) => {
                unusable.get_or_insert(why);
            }
        }
    }
    if let Some(e) = hard {
        return Err(e);
    }
    if wrong {
        return Err(Error::WrongPassphrase);
    }
    Err(no_usable(
        unusable
            .as_deref()
            .unwrap_or("no keyslot may be tried without its number"),
    ))
}

/// cryptsetup's "No usable keyslot is available." The error enum has no variant of its own for it
/// yet, so it is reported as unsupported, with the reason.
fn no_usable(why: &str) -> Error {
    Error::NoUsableKeyslot(why.to_string())
}
