//! The reencryption digest (`luks2_reencrypt_digest.c`, CVE-2021-4122): the keyslot fields and
//! backup segments serialised and authenticated with the volume keys, so that a header edited
//! without the keys cannot steer a conversion.

use super::*;
use sectorcrypt_secret::SecretBytes;

/// Appends JSON fields to the blob with the typing rules of cryptsetup's `sr()`: a missing or
/// mistyped field makes the whole blob invalid.
pub(super) struct Serializer<'a> {
    out: &'a mut SecretBytes,
}

impl Serializer<'_> {
    fn field<'v>(obj: &'v Value, key: &str) -> Result<&'v Value, String> {
        obj.get(key).ok_or_else(|| format!("\"{key}\" is missing"))
    }

    /// A string: its bytes, 1 to 64 of them.
    fn str(&mut self, obj: &Value, key: &str) -> Result<(), String> {
        let s = Self::field(obj, key)?
            .as_str()
            .ok_or_else(|| format!("\"{key}\" is not a string"))?;
        if s.is_empty() || s.len() > MAX_STR {
            return Err(format!("\"{key}\" has {} bytes (1 to {MAX_STR})", s.len()));
        }
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn decimal(obj: &Value, key: &str) -> Result<u64, String> {
        let s = Self::field(obj, key)?
            .as_str()
            .ok_or_else(|| format!("\"{key}\" is not a string"))?;
        str_to_u64(s).ok_or_else(|| format!("\"{key}\" is \"{s}\", not a number"))
    }

    /// A u64 stored as a decimal string: 8 bytes big-endian.
    fn u64(&mut self, obj: &Value, key: &str) -> Result<(), String> {
        let n = Self::decimal(obj, key)?;
        self.out.extend_from_slice(&n.to_be_bytes());
        Ok(())
    }

    /// A segment size: the 7 bytes "dynamic", or a u64.
    fn size(&mut self, obj: &Value, key: &str) -> Result<(), String> {
        if Self::field(obj, key)?.as_str() == Some("dynamic") {
            self.out.extend_from_slice(b"dynamic");
            Ok(())
        } else {
            self.u64(obj, key)
        }
    }

    /// A u32 stored as a JSON integer: 4 bytes big-endian.
    fn u32(&mut self, obj: &Value, key: &str) -> Result<(), String> {
        let v = Self::field(obj, key)?;
        let n = as_u32(v).ok_or_else(|| format!("\"{key}\" is {v}, not a 32-bit integer"))?;
        self.out.extend_from_slice(&n.to_be_bytes());
        Ok(())
    }

    /// `reenc_keyslot_serialize`.
    fn keyslot(&mut self, ks: &Value) -> Result<(), String> {
        let area = Self::field(ks, "area")?;
        let area_type = Self::field(area, "type")?.as_str().unwrap_or("");
        self.str(ks, "mode")?;
        self.str(ks, "direction")?;
        self.str(area, "type")?;
        self.u64(area, "offset")?;
        self.u64(area, "size")?;
        if matches!(area_type, "checksum" | "datashift-checksum") {
            self.str(area, "hash")?;
            self.u32(area, "sector_size")?;
        }
        if matches!(
            area_type,
            "datashift" | "datashift-journal" | "datashift-checksum"
        ) {
            self.u64(area, "shift_size")?;
        }
        Ok(())
    }

    /// `segment_serialize`.
    fn segment(&mut self, seg: &Value) -> Result<(), String> {
        let kind = Self::field(seg, "type")?.as_str().unwrap_or("");
        if !matches!(kind, "crypt" | "linear") {
            return Err(format!("a segment of type \"{kind}\""));
        }
        self.str(seg, "type")?;
        self.u64(seg, "offset")?;
        self.size(seg, "size")?;
        if kind == "crypt" {
            self.u64(seg, "iv_tweak")?;
            self.str(seg, "encryption")?;
            self.u32(seg, "sector_size")?;
        }
        Ok(())
    }
}

pub(super) fn segment_json(md: &Metadata, flag: &str) -> Option<Value> {
    segment_by_flag(md, flag).and_then(|(_, s)| serde_json::to_value(s).ok())
}

/// The bytes cryptsetup hashes into the reencryption digest
/// (`reencrypt_assembly_verification_data`):
///
/// ```text
/// 'v' '0'+version ‖ old VK (if backup-previous has a digest)
///                 ‖ new VK (if backup-final has another digest)
/// ‖ mode ‖ direction ‖ area.type ‖ u64 area.offset ‖ u64 area.size
///   [‖ area.hash ‖ u32 area.sector_size]   (checksum, datashift-checksum)
///   [‖ u64 area.shift_size]                (datashift*)
/// ‖ seg(backup-previous) ‖ seg(backup-final) [‖ seg(backup-moved-segment)]
/// seg = type ‖ u64 offset ‖ ("dynamic" | u64 size) [‖ u64 iv_tweak ‖ encryption ‖ u32 sector_size]
/// ```
///
/// Strings are their bytes without terminator, integers big-endian. The keys are taken as given
/// (check them against their digests first, as [`verify_reencrypt_digest`] does).
///
/// Errors: [`Error::Unsupported`] if a key the blob needs is not given; [`Error::Corrupt`] if the
/// metadata has no reencryption or a field cryptsetup's serialiser would refuse.
pub fn reencrypt_digest_blob(
    metadata: &Metadata,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
) -> Result<SecretBytes, Error> {
    let version = requirement_version(metadata).ok_or_else(|| {
        Error::Corrupt("there is no reencryption requirement to build a digest for".into())
    })?;
    let digest_old = digest_of_flag(metadata, FLAG_BACKUP_PREVIOUS);
    let digest_new = digest_of_flag(metadata, FLAG_BACKUP_FINAL);
    // Room for everything up front (strings are at most 64 bytes, so the fields take well under
    // 1 KiB); growing would move the keys, zeroizing the old copy, which costs only time.
    let keys_len = old_vk.map_or(0, <[u8]>::len) + new_vk.map_or(0, <[u8]>::len);
    let mut out = SecretBytes::with_capacity(2 + keys_len + 1024);
    out.extend_from_slice(&[b'v', b'0' + version]);
    let missing = |which: &str, digest: u32| {
        Error::Unsupported(format!(
            "checking the reencryption digest without the {which} volume key (digest {digest})"
        ))
    };
    if let Some(d) = digest_old {
        out.extend_from_slice(old_vk.ok_or_else(|| missing("old", d))?);
    }
    if let Some(d) = digest_new.filter(|d| Some(*d) != digest_old) {
        out.extend_from_slice(new_vk.ok_or_else(|| missing("new", d))?);
    }
    if out.len() == 2 {
        return Err(Error::Corrupt(
            "neither backup segment has a volume key digest".into(),
        ));
    }
    let (_, ks) = reencrypt_keyslot(metadata)
        .ok_or_else(|| Error::Corrupt("there is no reencrypt keyslot".into()))?;
    let bad = |why: String| Error::Corrupt(format!("the reencryption metadata: {why}"));
    let mut s = Serializer { out: &mut out };
    // Serialised as stored: a keyslot the model could not read is refused by the same rules.
    s.keyslot(&serde_json::to_value(ks).unwrap_or_default())
        .map_err(|e| bad(format!("reencrypt keyslot: {e}")))?;
    for (flag, required) in [
        (FLAG_BACKUP_PREVIOUS, true),
        (FLAG_BACKUP_FINAL, true),
        (FLAG_BACKUP_MOVED, false),
    ] {
        match segment_json(metadata, flag) {
            Some(seg) => s
                .segment(&seg)
                .map_err(|e| bad(format!("{flag} segment: {e}")))?,
            None if required => return Err(bad(format!("there is no {flag} segment"))),
            None => {}
        }
    }
    Ok(out)
}

/// Check `vk` against digest `n` of `metadata`: [`Error::WrongPassphrase`] if it is not that
/// digest's key.
pub(super) fn check_key(metadata: &Metadata, n: u32, vk: &[u8]) -> Result<(), Error> {
    let Some(Digest::Pbkdf2(d)) = metadata.digests.get(n) else {
        return Err(Error::Unsupported(format!(
            "digest {n}, which is not a pbkdf2 digest"
        )));
    };
    if digest_matches(
        vk,
        crate::hash::parse(&d.hash)?,
        d.iterations,
        &d.salt,
        &d.digest,
    )? {
        Ok(())
    } else {
        Err(Error::WrongPassphrase)
    }
}

/// Whether the reencryption digest of `header` matches its keyslot and backup segments, for the
/// given volume keys (`LUKS2_reencrypt_digest_verify`). Pass the old key when `backup-previous`
/// is a crypt segment (decrypt, reencrypt) and the new key when `backup-final` is (encrypt,
/// reencrypt); a key that is not needed is ignored.
///
/// `Ok(false)` means the metadata was changed by someone without the keys (or by a tool that did
/// not refresh the digest): cryptsetup says "Reencryption metadata is invalid." and refuses it.
///
/// Errors: [`Error::WrongPassphrase`] if a given key does not match its own digest;
/// [`Error::Corrupt`] if there is no reencryption, no reencryption digest (cryptsetup asks for a
/// `repair`), or a field the serialiser refuses; [`Error::Unsupported`] if a needed key is
/// missing or a digest is not pbkdf2.
pub fn verify_reencrypt_digest(
    header: &Header,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
) -> Result<bool, Error> {
    verify_metadata_digest(header.metadata(), old_vk, new_vk)
}

/// [`verify_reencrypt_digest`] on metadata that is not (yet) a header.
pub fn verify_metadata_digest(
    metadata: &Metadata,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
) -> Result<bool, Error> {
    let (slot, _) = reencrypt_keyslot(metadata)
        .ok_or_else(|| Error::Corrupt("there is no reencrypt keyslot".into()))?;
    let Some((n, digest)) = metadata.digest_of_keyslot(slot) else {
        return Err(Error::Corrupt(
            "the reencrypt keyslot has no digest (cryptsetup repair adds one)".into(),
        ));
    };
    let Digest::Pbkdf2(d) = digest else {
        return Err(Error::Unsupported(format!(
            "reencryption digest {n} of type '{}'",
            digest.kind()
        )));
    };
    let digest_old = digest_of_flag(metadata, FLAG_BACKUP_PREVIOUS);
    let digest_new = digest_of_flag(metadata, FLAG_BACKUP_FINAL);
    if let (Some(d), Some(k)) = (digest_old, old_vk) {
        check_key(metadata, d, k)?;
    }
    if let (Some(d), Some(k)) = (digest_new, new_vk) {
        check_key(metadata, d, k)?;
    }
    let blob = reencrypt_digest_blob(metadata, old_vk, new_vk)?;
    if d.salt.len() != KDF_SALT_LEN || d.digest.is_empty() {
        return Ok(false);
    }
    digest_matches(
        &blob,
        crate::hash::parse(&d.hash)?,
        d.iterations,
        &d.salt,
        &d.digest,
    )
}

/// A new reencryption digest for `blob` (`PBKDF2_digest_store`): a random 32-byte salt and
/// `PBKDF2-HMAC-hash(blob, salt, iterations)` of the hash's length, listing keyslot
/// `reencrypt_slot` and no segment.
pub fn make_reencrypt_digest(
    blob: &[u8],
    hash: Hash,
    iterations: u32,
    reencrypt_slot: u32,
) -> Result<Pbkdf2Digest, Error> {
    let mut salt = vec![0u8; KDF_SALT_LEN];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    let digest = Kdf::Pbkdf2 { hash, iterations }.derive(blob, &salt, hash.digest_len())?;
    Ok(Pbkdf2Digest {
        keyslots: vec![reencrypt_slot.to_string()],
        segments: Vec::new(),
        hash: hash.name().into(),
        iterations,
        salt,
        digest: digest.to_vec(),
        extra: Map::new(),
    })
}

/// Compute and install the reencryption digest of `metadata`, as
/// `LUKS2_keyslot_reencrypt_digest_create` and the next header write do: the new digest takes the
/// first free number, the reencrypt keyslot is taken off every other digest, and digests left
/// with neither keyslots nor segments are dropped (`LUKS2_digests_erase_unused`). Call it after
/// every change to the reencrypt keyslot or a backup segment. Returns the digest's number.
///
/// `iterations` `None` benchmarks PBKDF2 for 125 ms, as cryptsetup does unless told the cost;
/// a count below cryptsetup's minimum (1000) is raised to it.
pub fn set_reencrypt_digest(
    metadata: &mut Metadata,
    old_vk: Option<&[u8]>,
    new_vk: Option<&[u8]>,
    hash: Hash,
    iterations: Option<u32>,
) -> Result<u32, Error> {
    let (slot, _) = reencrypt_keyslot(metadata)
        .ok_or_else(|| Error::Corrupt("there is no reencrypt keyslot".into()))?;
    let blob = reencrypt_digest_blob(metadata, old_vk, new_vk)?;
    let iterations = match iterations {
        Some(n) => n.max(kdf::PBKDF2_MIN_ITERATIONS),
        None => kdf::calibrate_pbkdf2(hash, hash.digest_len(), DIGEST_ITER_TIME_MS)?,
    };
    let id = (0..DIGESTS_MAX)
        .find(|n| metadata.digests.get(*n).is_none())
        .ok_or_else(|| Error::Unsupported("all 8 digests are in use".into()))?;
    let digest = make_reencrypt_digest(&blob, hash, iterations, slot)?;
    let name = slot.to_string();
    for (_, d) in metadata.digests.0.iter_mut() {
        match d {
            Digest::Pbkdf2(d) => d.keyslots.retain(|k| *k != name),
            Digest::Other(v) => {
                if let Some(Value::Array(a)) = v.get_mut("keyslots") {
                    a.retain(|k| k.as_str() != Some(&name));
                }
            }
        }
    }
    metadata.digests.0.push((id, Digest::Pbkdf2(digest)));
    metadata.digests.0.retain(|(_, d)| {
        let lists_empty = |key: &str| match d {
            Digest::Pbkdf2(p) => {
                if key == "keyslots" {
                    p.keyslots.is_empty()
                } else {
                    p.segments.is_empty()
                }
            }
            Digest::Other(v) => v
                .get(key)
                .and_then(Value::as_array)
                .is_some_and(|a| a.is_empty()),
        };
        !(lists_empty("segments") && lists_empty("keyslots"))
    });
    Ok(id)
}
