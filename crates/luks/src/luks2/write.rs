//! Changing LUKS2 headers the way cryptsetup 2.6 does (`luks2_keyslot_luks2.c`,
//! `luks2_disk_metadata.c`): adding, removing and changing keyslots, every change crash safe, and
//! the writing every change shares (keyslot material, wipes, the two metadata copies).
//! Formatting is `format.rs`, choosing a keyslot's KDF cost `pbkdf.rs`.
//!
//! The rules that make a power cut harmless (each write is assumed to land whole or not at all,
//! in order, as sectors do):
//! - new keyslot material only ever goes to an area no keyslot in the current metadata uses, and
//!   is synced before any metadata names it;
//! - metadata is written as a whole new version (seqid + 1) to the primary copy and synced, then
//!   to the secondary copy and synced; while one copy is being written the other is intact, and
//!   the reader takes the valid copy with the higher seqid;
//! - each copy is written as cryptsetup writes it: the binary header with a zeroed checksum
//!   first (so the copy is plainly invalid while its JSON changes), the JSON area, then the
//!   binary header with its checksum;
//! - material is wiped only after the metadata no longer names it.

use rand::RngCore;
use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_cipher::{SectorCipher, SectorOptions};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;
use serde_json::{Map, Value};

use super::binary::{
    BinaryHeader, HeaderCopy, BIN_LEN, HDR_SIZES, LABEL_LEN, MAGIC_PRIMARY, MAGIC_SECONDARY,
    SALT_LEN,
};
use super::limits::{DIGESTS_MAX, DIGEST_ITER_TIME_MS, KDF_SALT_LEN, KEYSLOTS_MAX, STRIPES};
use super::metadata::{
    Af, Area, Digest, Keyslot, KeyslotKdf, Luks2Keyslot, Metadata, Pbkdf2Digest, Priority,
};
use super::pbkdf::{Pbkdf, PbkdfKind};
use super::token::TOKENS_MAX;
use super::Header;
use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::{self, Kdf};
use crate::keyslot::{digest_matches, KeyslotArea};

/// Wipes go in blocks of this size, like cryptsetup's.
const WIPE_BLOCK: u64 = 1 << 20;

pub(super) fn io(dev: &dyn Storage, source: std::io::Error) -> Error {
    Error::Io {
        device: dev.name(),
        source,
    }
}

/// `n` random bytes from the operating system: volume keys and salts (as cryptsetup reads
/// /dev/urandom).
pub fn random_bytes(n: usize) -> SecretBytes {
    let mut v = SecretBytes::zeroed(n);
    rand::rngs::OsRng.fill_bytes(&mut v);
    v
}

pub(super) fn text_field(text: &str, what: &str) -> Result<[u8; LABEL_LEN], Error> {
    let mut f = [0u8; LABEL_LEN];
    if text.len() >= LABEL_LEN || text.as_bytes().contains(&0) {
        return Err(Error::Unsupported(format!(
            "a {what} of {} bytes (at most {} without NUL bytes)",
            text.len(),
            LABEL_LEN - 1
        )));
    }
    f[..text.len()].copy_from_slice(text.as_bytes());
    Ok(f)
}

/// Bytes of keyslot area cryptsetup allocates for a key of `key_len` bytes: the AF material
/// rounded up to 4 KiB (258048 for 64 bytes).
pub fn keyslot_area_size(key_len: usize) -> u64 {
    ((key_len as u64) * u64::from(STRIPES)).div_ceil(4096) * 4096
}

fn kdf_json(kdf: &Kdf, salt: Vec<u8>) -> KeyslotKdf {
    match *kdf {
        Kdf::Pbkdf2 { hash, iterations } => KeyslotKdf::Pbkdf2 {
            hash: hash.name().into(),
            iterations,
            salt,
        },
        Kdf::Argon2 {
            variant,
            time,
            memory_kib,
            parallel,
        } => KeyslotKdf::Argon2 {
            variant,
            time,
            memory: memory_kib,
            cpus: parallel,
            salt,
        },
    }
}

/// Remove `name` from a JSON list of names (digest or token `keyslots`).
fn remove_name(list: Option<&mut Value>, name: &str) {
    if let Some(Value::Array(a)) = list {
        a.retain(|v| v.as_str() != Some(name));
    }
}

impl Metadata {
    /// The first keyslot number not in use (`LUKS2_keyslot_find_empty`).
    fn free_slot(&self) -> Option<usize> {
        (0..KEYSLOTS_MAX).find(|&n| self.keyslots.get(n as u32).is_none())
    }

    /// The first gap in the keyslots area that holds `length` bytes, avoiding every keyslot's
    /// area and `also_avoid` (`LUKS2_find_area_gap`: lowest offset first).
    pub(crate) fn find_area_gap(
        &self,
        hdr_size: u64,
        length: u64,
        also_avoid: &[(u64, u64)],
    ) -> Option<u64> {
        let start = 2 * hdr_size;
        let end = start + self.config.keyslots_size;
        let mut used: Vec<(u64, u64)> = self
            .keyslots
            .iter()
            .filter_map(|(_, k)| k.area())
            .chain(also_avoid.iter().copied())
            .collect();
        used.sort_unstable();
        let mut offset = start;
        for (o, l) in used {
            if o >= offset && o - offset >= length {
                break;
            }
            offset = offset.max(o.saturating_add(l));
        }
        (offset.checked_add(length)? <= end).then_some(offset)
    }

    /// Drop keyslot `slot` and every reference to it from digests and tokens.
    pub(crate) fn remove_keyslot(&mut self, slot: u32) {
        let name = slot.to_string();
        self.keyslots.0.retain(|(n, _)| *n != slot);
        for (_, d) in self.digests.0.iter_mut() {
            match d {
                Digest::Pbkdf2(d) => d.keyslots.retain(|s| *s != name),
                Digest::Other(v) => remove_name(v.get_mut("keyslots"), &name),
            }
        }
        for (_, t) in self.tokens.0.iter_mut() {
            remove_name(t.get_mut("keyslots"), &name);
        }
    }

    /// Name keyslot `slot` in digest `digest`'s keyslot list.
    fn assign_digest(&mut self, digest: u32, slot: u32) -> Result<(), Error> {
        let name = slot.to_string();
        match self.digests.0.iter_mut().find(|(n, _)| *n == digest) {
            Some((_, Digest::Pbkdf2(d))) => {
                if !d.keyslots.contains(&name) {
                    d.keyslots.push(name);
                }
                Ok(())
            }
            Some((_, Digest::Other(v))) => match v.get_mut("keyslots") {
                Some(Value::Array(a)) => {
                    if !a.iter().any(|x| x.as_str() == Some(&name)) {
                        a.push(Value::String(name));
                    }
                    Ok(())
                }
                _ => Err(Error::Corrupt(format!(
                    "digest {digest} has no keyslot list"
                ))),
            },
            None => Err(Error::Corrupt(format!("there is no digest {digest}"))),
        }
    }
}

/// A new `luks2` keyslot made and sealed, not yet written.
pub(super) struct NewKeyslot {
    pub(super) json: Luks2Keyslot,
    pub(super) material: SecretBytes,
}

/// The cipher of keyslot areas for volumes whose data segment uses `segment_cipher` with a key of
/// `key_len` bytes, and its key length: the segment's own, except that `cipher_null` would store
/// the volume key in the clear, so there cryptsetup (`LUKS2_keyslot_cipher_incompatible`) uses
/// aes-xts-plain64 with a 512-bit key, and so do we.
fn keyslot_area_cipher(segment_cipher: &str, key_len: usize) -> (String, usize) {
    if segment_cipher.starts_with("cipher_null") {
        ("aes-xts-plain64".to_string(), 64)
    } else {
        (segment_cipher.to_string(), key_len)
    }
}

/// Build a keyslot holding `volume_key` for `passphrase` at `offset`, its area encrypted like the
/// data segment (`segment_cipher` with an `area_key_len`-byte key, see [`keyslot_area_cipher`]),
/// as `luks2_keyslot_alloc` and `luks2_keyslot_set_key` do.
pub(super) fn make_keyslot(
    segment_cipher: &str,
    area_key_len: usize,
    af_hash: Hash,
    volume_key: &[u8],
    passphrase: &[u8],
    pbkdf: &Pbkdf,
    offset: u64,
) -> Result<NewKeyslot, Error> {
    let key_len = volume_key.len();
    let (cipher, area_key_len) = keyslot_area_cipher(segment_cipher, area_key_len);
    let kdf = pbkdf.resolve(area_key_len)?;
    let salt = random_bytes(KDF_SALT_LEN);
    let area = KeyslotArea {
        offset,
        cipher: cipher.clone(),
        key_size: area_key_len,
        volume_key_size: key_len,
        stripes: STRIPES as usize,
        af_hash,
    };
    let material = area.seal(&kdf, &salt, passphrase, volume_key)?;
    let json = Luks2Keyslot {
        key_size: key_len as u32,
        af: Af {
            stripes: STRIPES,
            hash: af_hash.name().into(),
            extra: Map::new(),
        },
        area: Area {
            offset,
            size: keyslot_area_size(key_len),
            encryption: cipher,
            key_size: area_key_len as u32,
            extra: Map::new(),
        },
        kdf: kdf_json(&kdf, salt.to_vec()),
        priority: None,
        extra: Map::new(),
    };
    Ok(NewKeyslot { json, material })
}

/// Overwrite `[offset, offset + len)` in `WIPE_BLOCK` pieces, with zeros or random bytes.
pub(super) fn wipe(dev: &dyn Storage, offset: u64, len: u64, random: bool) -> Result<(), Error> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(WIPE_BLOCK) as usize;
        let block = if random {
            random_bytes(n)
        } else {
            SecretBytes::zeroed(n)
        };
        dev.write_at(&block, offset + done)
            .map_err(|e| io(dev, e))?;
        done += n as u64;
    }
    Ok(())
}

/// Write one header copy as cryptsetup's `hdr_write_disk` does, then sync.
fn write_copy(dev: &dyn Storage, mut bin: BinaryHeader, json_area: &[u8]) -> Result<(), Error> {
    bin.checksum = [0; super::binary::CHECKSUM_LEN];
    dev.write_at(&bin.to_bytes(), bin.hdr_offset)
        .map_err(|e| io(dev, e))?;
    dev.write_at(json_area, bin.hdr_offset + BIN_LEN as u64)
        .map_err(|e| io(dev, e))?;
    bin.seal(json_area)?;
    dev.write_at(&bin.to_bytes(), bin.hdr_offset)
        .map_err(|e| io(dev, e))?;
    dev.sync().map_err(|e| io(dev, e))
}

/// The binary fields shared by both copies.
pub(super) struct BinaryFields {
    pub hdr_size: u64,
    pub seqid: u64,
    pub label: [u8; LABEL_LEN],
    pub subsystem: [u8; LABEL_LEN],
    pub uuid: [u8; super::binary::UUID_LEN],
    pub checksum_alg: [u8; super::binary::CHECKSUM_ALG_LEN],
    pub salts: [[u8; SALT_LEN]; 2],
}

/// Validate `metadata` as the reader will, then write both copies, each synced: first the copy
/// the reader would not use now (damaged, missing or older), then the one it uses. So at every
/// moment one copy holds the current or the new state, even when an earlier crash left a copy
/// torn: writing the primary first over a torn secondary would leave no valid copy in between,
/// and over an older secondary could set the header back a version.
pub(super) fn write_metadata(
    dev: &dyn Storage,
    fields: &BinaryFields,
    metadata: &Metadata,
) -> Result<(), Error> {
    // The one door every LUKS2 metadata write goes through: a header with a requirement this
    // implementation does not know is never written.
    metadata.check_requirements_known()?;
    let json_len = fields.hdr_size - BIN_LEN as u64;
    let text = metadata.to_json_text();
    // The reader needs a NUL after the text inside the area.
    if text.len() as u64 >= json_len {
        return Err(Error::Unsupported(format!(
            "JSON metadata of {} bytes in a {json_len}-byte area",
            text.len()
        )));
    }
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Corrupt(format!("the new JSON metadata does not parse: {e}")))?;
    super::validate::validate(&value, json_len)
        .map_err(|why| Error::Corrupt(format!("the new JSON metadata is invalid: {why}")))?;
    let mut area = vec![0u8; json_len as usize];
    area[..text.len()].copy_from_slice(text.as_bytes());
    let primary = super::valid_seqid(dev, 0, HeaderCopy::Primary)?;
    let secondary = super::valid_seqid(dev, fields.hdr_size, HeaderCopy::Secondary)?;
    let in_use = match (primary, secondary) {
        (Some(p), Some(s)) if s > p => HeaderCopy::Secondary,
        (None, Some(_)) => HeaderCopy::Secondary,
        _ => HeaderCopy::Primary,
    };
    let order = if in_use == HeaderCopy::Primary {
        [(1, HeaderCopy::Secondary), (0, HeaderCopy::Primary)]
    } else {
        [(0, HeaderCopy::Primary), (1, HeaderCopy::Secondary)]
    };
    for (i, copy) in order {
        let bin = BinaryHeader {
            copy,
            version: super::binary::VERSION,
            hdr_size: fields.hdr_size,
            seqid: fields.seqid,
            label: fields.label,
            checksum_alg: fields.checksum_alg,
            salt: fields.salts[i],
            uuid: fields.uuid,
            subsystem: fields.subsystem,
            hdr_offset: if i == 0 { 0 } else { fields.hdr_size },
            checksum: [0; super::binary::CHECKSUM_LEN],
        };
        write_copy(dev, bin, &area)?;
    }
    Ok(())
}

pub(super) fn random_salt() -> [u8; SALT_LEN] {
    let mut s = [0u8; SALT_LEN];
    rand::rngs::OsRng.fill_bytes(&mut s);
    s
}

/// The data cipher checked against the volume key (so a key of the wrong size is refused before
/// anything is written).
pub(super) fn check_cipher(cipher: &str, key: &[u8]) -> Result<(), Error> {
    let spec = CipherSpec::parse(cipher)?;
    SectorCipher::new(spec, key, &SectorOptions::default())?;
    Ok(())
}

/// Zero, alone and synced, the magic sector of every LUKS header copy on `dev` below `limit`
/// (LUKS1 or LUKS2, at offset 0 and cryptsetup's secondary offsets), before a format overwrites
/// anything else: writes since a sync can be lost or torn, and a surviving old header must never
/// name keyslot areas already overwritten (some old passphrases opening, others not). Only
/// sectors that hold a magic now are zeroed: the other candidate offsets may lie in an old
/// keyslot area.
pub(crate) fn erase_old_headers(dev: &dyn Storage, limit: u64) -> Result<(), Error> {
    let mut erased = false;
    for at in std::iter::once(0).chain(HDR_SIZES) {
        let mut sector = [0u8; 512];
        if at + sector.len() as u64 > limit || dev.read_at(&mut sector, at).is_err() {
            continue;
        }
        if sector[..6] == MAGIC_PRIMARY || sector[..6] == MAGIC_SECONDARY {
            wipe(dev, at, sector.len() as u64, false)?;
            erased = true;
        }
    }
    if erased {
        dev.sync().map_err(|e| io(dev, e))?;
    }
    Ok(())
}

impl Header {
    /// The binary fields for the next metadata version: seqid + 1, each copy's salt kept (a
    /// copy that was unreadable gets a new one).
    pub(super) fn next_fields(&self) -> BinaryFields {
        let own = self.binary.salt;
        let other = self.other_salt.unwrap_or_else(random_salt);
        let salts = match self.health.in_use {
            HeaderCopy::Primary => [own, other],
            HeaderCopy::Secondary => [other, own],
        };
        BinaryFields {
            hdr_size: self.binary.hdr_size,
            seqid: self.binary.seqid + 1,
            label: self.binary.label,
            subsystem: self.binary.subsystem,
            uuid: self.binary.uuid,
            checksum_alg: self.binary.checksum_alg,
            salts,
        }
    }

    /// Write `metadata` as the next version and re-read the header from `dev`.
    fn commit(&mut self, dev: &dyn Storage, metadata: &Metadata) -> Result<(), Error> {
        write_metadata(dev, &self.next_fields(), metadata)?;
        *self = Header::read(dev)?;
        Ok(())
    }

    /// Refuse changes while an operation cryptsetup marks as mandatory is unfinished (such as an
    /// interrupted reencryption): changing keyslots then could lose the data.
    fn check_writable(&self) -> Result<(), Error> {
        let reqs = self.metadata.mandatory_requirements();
        if reqs.is_empty() {
            Ok(())
        } else {
            Err(Error::Unsupported(format!(
                "changing a volume with mandatory requirements ({})",
                reqs.join(", ")
            )))
        }
    }

    /// The data segment's digest number, checked against `volume_key`.
    fn verified_digest(&self, volume_key: &[u8]) -> Result<u32, Error> {
        let seg = self.default_segment();
        let Some((n, d)) = self.metadata.digest_of_segment(seg) else {
            return Err(Error::Corrupt(format!("segment {seg} has no digest")));
        };
        let Digest::Pbkdf2(d) = d else {
            return Err(Error::Unsupported(format!(
                "a digest of type '{}'",
                d.kind()
            )));
        };
        let hash = crate::hash::parse(&d.hash)?;
        if !digest_matches(volume_key, hash, d.iterations, &d.salt, &d.digest)? {
            return Err(Error::WrongPassphrase);
        }
        Ok(n)
    }

    /// The cipher and key size new keyslots use: the data segment's, as cryptsetup's do
    /// (`LUKS2_keyslot_cipher_incompatible` aside).
    fn keyslot_cipher(&self, volume_key: &[u8]) -> Result<String, Error> {
        let seg = self.data_segment()?;
        check_cipher(&seg.cipher, volume_key)?;
        Ok(seg.cipher)
    }

    /// A slot number to use: `slot` if free, else the first free one.
    fn pick_slot(&self, slot: Option<usize>) -> Result<u32, Error> {
        match slot {
            Some(s) if s >= KEYSLOTS_MAX => Err(Error::Unsupported(format!(
                "keyslot {s} (LUKS2 has 0 to {})",
                KEYSLOTS_MAX - 1
            ))),
            Some(s) if self.metadata.keyslots.get(s as u32).is_some() => {
                Err(Error::Unsupported(format!("keyslot {s} is already in use")))
            }
            Some(s) => Ok(s as u32),
            None => self
                .metadata
                .free_slot()
                .map(|s| s as u32)
                .ok_or_else(|| Error::Unsupported("all 32 keyslots are in use".into())),
        }
    }

    /// Seal a keyslot for `passphrase` into a free area (avoiding `avoid` too) and write and sync
    /// its material; the metadata is not touched. The area is encrypted with `area` (a cipher and
    /// its key length), or else like the data segment with a key as long as `volume_key`.
    #[allow(clippy::too_many_arguments)] // each is a separate choice of the three callers
    fn stage_keyslot(
        &self,
        dev: &dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        pbkdf: &Pbkdf,
        avoid: &[(u64, u64)],
        af_hash: Hash,
        area: Option<(&str, usize)>,
    ) -> Result<Luks2Keyslot, Error> {
        let (cipher, area_key_len) = match area {
            Some((c, len)) => {
                check_cipher(c, &vec![0; len])?;
                (c.to_string(), len)
            }
            None if self.has_integrity() => (
                super::format::INTEGRITY_KEYSLOT_CIPHER.to_string(),
                super::format::INTEGRITY_KEYSLOT_KEY_LEN,
            ),
            None => (self.keyslot_cipher(volume_key)?, volume_key.len()),
        };
        let length = keyslot_area_size(volume_key.len());
        let offset = self
            .metadata
            .find_area_gap(self.binary.hdr_size, length, avoid)
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "no free space for a {length}-byte keyslot area in the keyslots area"
                ))
            })?;
        let ks = make_keyslot(
            &cipher,
            area_key_len,
            af_hash,
            volume_key,
            passphrase,
            pbkdf,
            offset,
        )?;
        dev.write_at(&ks.material, offset).map_err(|e| io(dev, e))?;
        dev.sync().map_err(|e| io(dev, e))?;
        Ok(ks.json)
    }

    /// Add a keyslot holding `volume_key` for `passphrase` (`cryptsetup luksAddKey`): in `slot`
    /// or the first free one, its area the first free gap. The volume key is checked against the
    /// digest first. Returns the slot number.
    ///
    /// Crash safety: the material is written to an unused area and synced before the metadata
    /// names it, so a power cut leaves the old or the new set of keyslots.
    pub fn add_keyslot(
        &mut self,
        dev: &dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        pbkdf: &Pbkdf,
    ) -> Result<usize, Error> {
        let (slot, _) =
            self.add_keyslot_and_token(dev, volume_key, passphrase, slot, pbkdf, None)?;
        Ok(slot)
    }

    /// [`Header::add_keyslot`] with a token that releases its passphrase (what
    /// `systemd-cryptenroll` and `clevis luks bind` add): `token`'s `keyslots` is set to the new
    /// slot, and the token takes the first free number. Returns the slot and token numbers.
    ///
    /// Crash safety: keyslot and token are named by one metadata write, so a power cut never
    /// leaves a keyslot whose passphrase nothing holds (systemd and clevis write them one after
    /// the other).
    pub fn add_keyslot_with_token(
        &mut self,
        dev: &dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        pbkdf: &Pbkdf,
        token: Value,
    ) -> Result<(usize, u32), Error> {
        let (slot, token) =
            self.add_keyslot_and_token(dev, volume_key, passphrase, slot, pbkdf, Some(token))?;
        Ok((slot, token.expect("a token was given")))
    }

    fn add_keyslot_and_token(
        &mut self,
        dev: &dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        pbkdf: &Pbkdf,
        token: Option<Value>,
    ) -> Result<(usize, Option<u32>), Error> {
        self.check_writable()?;
        let digest = self.verified_digest(volume_key)?;
        let slot = self.pick_slot(slot)?;
        let token_id = match token {
            Some(_) => Some(
                (0..TOKENS_MAX)
                    .find(|n| self.metadata.tokens.get(*n).is_none())
                    .ok_or_else(|| Error::Unsupported("every token number is taken".into()))?,
            ),
            None => None,
        };
        // cryptsetup splits a keyslot's key with its PBKDF2 hash (the token keyslots systemd
        // writes are sha512 throughout), else with sha256.
        let af_hash = match pbkdf.kind {
            PbkdfKind::Pbkdf2 { hash } => hash,
            PbkdfKind::Argon2 { .. } => Hash::Sha256,
        };
        let ks = self.stage_keyslot(dev, volume_key, passphrase, pbkdf, &[], af_hash, None)?;
        let mut md = self.metadata.clone();
        md.keyslots.0.push((slot, Keyslot::Luks2(Box::new(ks))));
        md.assign_digest(digest, slot)?;
        if let (Some(id), Some(mut token)) = (token_id, token) {
            let Some(object) = token.as_object_mut() else {
                return Err(Error::Unsupported("a token is a JSON object".into()));
            };
            object.insert("keyslots".into(), Value::from(vec![slot.to_string()]));
            md.tokens.0.push((id, token));
            md.tokens.0.sort_by_key(|(n, _)| *n);
        }
        self.commit(dev, &md)?;
        Ok((slot as usize, token_id))
    }

    /// Stage a keyslot holding a *new* volume key `new_vk` for `passphrase`, under a pbkdf2
    /// digest of its own that lists no segment yet (what `cryptsetup reencrypt` adds before it
    /// starts a key rotation): its material is written and synced to a free area, and the header
    /// returned has it in its metadata, **which is not written**. `reencrypt::init_reencrypt` on
    /// the returned header binds it to the final segment, and one metadata write (over `self`)
    /// then records both, so a crash leaves the volume as it was or the reencryption started,
    /// never an unused keyslot. The keyslot area is encrypted with `cipher` (the new data cipher,
    /// when it changes), or else like the data segment, whose cipher `new_vk` must then fit.
    pub fn stage_keyslot_for_new_key(
        &self,
        dev: &dyn Storage,
        new_vk: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        pbkdf: &Pbkdf,
        cipher: Option<&str>,
    ) -> Result<Header, Error> {
        let area = cipher.map(|c| (c, new_vk.len()));
        self.stage_with_own_digest(dev, new_vk, passphrase, slot, pbkdf, area)
    }

    /// Add a keyslot holding `key`, which need not be the volume key, bound to no segment
    /// (`cryptsetup luksAddKey --unbound`), under a pbkdf2 digest of its own: in `slot` or the
    /// first free one, its area encrypted like the data segment's keyslots (the data cipher with
    /// a key as long as the volume key, whatever `key`'s length). Returns the slot number.
    ///
    /// Crash safety: as [`Header::add_keyslot`], the material is written and synced before the
    /// metadata names it.
    pub fn add_unbound_keyslot(
        &mut self,
        dev: &dyn Storage,
        key: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        pbkdf: &Pbkdf,
    ) -> Result<usize, Error> {
        if key.is_empty() || key.len() > 512 {
            return Err(Error::Unsupported(format!(
                "an unbound key of {} bytes (1 to 512)",
                key.len()
            )));
        }
        let cipher = self.data_segment()?.cipher;
        let area_key_len = self.volume_key_len()?;
        let staged = self.stage_with_own_digest(
            dev,
            key,
            passphrase,
            slot,
            pbkdf,
            Some((&cipher, area_key_len)),
        )?;
        let slot = staged
            .metadata
            .keyslots
            .iter()
            .map(|(n, _)| n)
            .find(|n| self.metadata.keyslots.get(*n).is_none())
            .expect("the staged header has one more keyslot");
        self.commit(dev, &staged.metadata)?;
        Ok(slot as usize)
    }

    /// Seal `key` into a new keyslot under a new pbkdf2 digest that lists no segment; the
    /// material is written and synced, the metadata returned in a header that is not written.
    fn stage_with_own_digest(
        &self,
        dev: &dyn Storage,
        new_vk: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        pbkdf: &Pbkdf,
        area: Option<(&str, usize)>,
    ) -> Result<Header, Error> {
        self.check_writable()?;
        let slot = self.pick_slot(slot)?;
        let hash = Hash::Sha256;
        let iterations = if pbkdf.forced_iterations.is_some() {
            kdf::PBKDF2_MIN_ITERATIONS
        } else {
            kdf::calibrate_pbkdf2(hash, hash.digest_len(), DIGEST_ITER_TIME_MS)?
        };
        let salt = random_bytes(KDF_SALT_LEN);
        let digest = Kdf::Pbkdf2 { hash, iterations }.derive(new_vk, &salt, hash.digest_len())?;
        let number = (0..DIGESTS_MAX)
            .find(|n| self.metadata.digests.get(*n).is_none())
            .ok_or_else(|| Error::Unsupported("all 8 digests are in use".into()))?;
        let ks = self.stage_keyslot(dev, new_vk, passphrase, pbkdf, &[], hash, area)?;
        let mut md = self.metadata.clone();
        md.keyslots.0.push((slot, Keyslot::Luks2(Box::new(ks))));
        md.digests.0.push((
            number,
            Digest::Pbkdf2(Pbkdf2Digest {
                keyslots: vec![slot.to_string()],
                segments: Vec::new(),
                hash: hash.name().into(),
                iterations,
                salt: salt.to_vec(),
                digest: digest.to_vec(),
                extra: Map::new(),
            }),
        ));
        md.digests.0.sort_by_key(|(n, _)| *n);
        let mut staged = self.clone();
        staged.metadata = md;
        Ok(staged)
    }

    /// Rewrite a damaged or stale header copy from the good one (`cryptsetup repair`): both
    /// copies are written as the next version, the stale one first, so a power cut leaves at
    /// least one good copy. Returns whether anything was written (nothing when both copies are
    /// good and current).
    pub fn repair(&mut self, dev: &dyn Storage) -> Result<bool, Error> {
        if !self.health.needs_repair() {
            return Ok(false);
        }
        write_metadata(dev, &self.next_fields(), &self.metadata)?;
        *self = Header::read_for_repair(dev)?;
        Ok(true)
    }

    /// Set the label and/or the subsystem in both binary headers (`cryptsetup config --label
    /// --subsystem`); `None` keeps a field as it is, `Some("")` clears it.
    pub fn set_label(
        &mut self,
        dev: &dyn Storage,
        label: Option<&str>,
        subsystem: Option<&str>,
    ) -> Result<(), Error> {
        let mut fields = self.next_fields();
        if let Some(l) = label {
            fields.label = text_field(l, "label")?;
        }
        if let Some(s) = subsystem {
            fields.subsystem = text_field(s, "subsystem")?;
        }
        write_metadata(dev, &fields, &self.metadata)?;
        *self = Header::read(dev)?;
        Ok(())
    }

    /// Set the priority of passphrase keyslot `slot` (`cryptsetup config --priority`): `ignore`
    /// (tried only when named), `normal` or `prefer` (tried first).
    pub fn set_priority(
        &mut self,
        dev: &dyn Storage,
        slot: usize,
        priority: Priority,
    ) -> Result<(), Error> {
        let value = match priority {
            Priority::Ignore => 0,
            Priority::Normal => 1,
            Priority::Prefer => 2,
            Priority::Invalid => {
                return Err(Error::Unsupported("an invalid keyslot priority".into()))
            }
        };
        let mut md = self.metadata.clone();
        let Some(Keyslot::Luks2(k)) = u32::try_from(slot)
            .ok()
            .and_then(|s| md.keyslots.0.iter_mut().find(|(n, _)| *n == s))
            .map(|(_, k)| k)
        else {
            return Err(Error::Unsupported(format!(
                "keyslot {slot} is not a passphrase keyslot in use"
            )));
        };
        // cryptsetup leaves the field out for "normal".
        k.priority = (value != 1).then(|| Value::from(value));
        self.commit(dev, &md)
    }

    /// Remove keyslot `slot` (`cryptsetup luksKillSlot`): the metadata without it first, then
    /// its area overwritten with random bytes, so a power cut never leaves a keyslot the
    /// metadata names but whose material is gone.
    pub fn kill_keyslot(&mut self, dev: &dyn Storage, slot: usize) -> Result<(), Error> {
        self.check_writable()?;
        let Some(k) = u32::try_from(slot)
            .ok()
            .and_then(|s| self.metadata.keyslots.get(s))
        else {
            return Err(Error::Unsupported(format!("keyslot {slot} is not in use")));
        };
        let area = k.area();
        let mut md = self.metadata.clone();
        md.remove_keyslot(slot as u32);
        self.commit(dev, &md)?;
        if let Some((offset, size)) = area {
            self.wipe_area(dev, offset, size)?;
        }
        Ok(())
    }

    /// Remove several keyslots and the tokens that released only their passphrases
    /// (`systemd-cryptenroll --wipe-slot`), in one metadata write, then overwrite their areas.
    /// Returns the numbers of the tokens removed. Nothing is written when a slot is not in use.
    pub fn kill_keyslots_and_tokens(
        &mut self,
        dev: &dyn Storage,
        slots: &[usize],
    ) -> Result<Vec<u32>, Error> {
        self.check_writable()?;
        let mut md = self.metadata.clone();
        let mut areas = Vec::new();
        for &slot in slots {
            let Some(k) = u32::try_from(slot).ok().and_then(|s| md.keyslots.get(s)) else {
                return Err(Error::Unsupported(format!("keyslot {slot} is not in use")));
            };
            areas.extend(k.area());
            md.remove_keyslot(slot as u32);
        }
        // A token whose every keyslot went releases nothing any more.
        let emptied: Vec<u32> = md
            .tokens
            .iter()
            .filter(|(n, t)| {
                let now_empty = t
                    .get("keyslots")
                    .and_then(Value::as_array)
                    .is_some_and(Vec::is_empty);
                let before = self.metadata.tokens.get(*n).and_then(|t| t.get("keyslots"));
                now_empty
                    && before
                        .and_then(Value::as_array)
                        .is_some_and(|k| !k.is_empty())
            })
            .map(|(n, _)| n)
            .collect();
        md.tokens.0.retain(|(n, _)| !emptied.contains(n));
        self.commit(dev, &md)?;
        for (offset, size) in areas {
            self.wipe_area(dev, offset, size)?;
        }
        Ok(emptied)
    }

    /// Overwrite a keyslot area no keyslot uses any more, within the keyslots area only.
    fn wipe_area(&self, dev: &dyn Storage, offset: u64, size: u64) -> Result<(), Error> {
        let start = 2 * self.binary.hdr_size;
        let end = start + self.metadata.config.keyslots_size;
        let from = offset.max(start);
        let to = offset.saturating_add(size).min(end);
        if from < to {
            wipe(dev, from, to - from, true)?;
            dev.sync().map_err(|e| io(dev, e))?;
        }
        Ok(())
    }

    /// Replace keyslot `old_slot` by one for `new_passphrase` (`cryptsetup luksChangeKey`): the
    /// new keyslot takes the first free slot number, or `old_slot`'s own number when none is
    /// free, and always a free area. Unlike cryptsetup (which adds, then removes, in two header
    /// writes), the switch is one metadata update, so a power cut leaves exactly the old or
    /// exactly the new passphrase working; the old area is wiped afterwards. The new keyslot
    /// keeps the old one's priority. Returns the new slot number.
    ///
    /// Errors: [`Error::Unsupported`] if `old_slot` is not a `luks2` keyslot or no free area is
    /// left (cryptsetup would then overwrite the keyslot in place, which a power cut can
    /// destroy); [`Error::WrongPassphrase`] if `volume_key` does not match the digest.
    pub fn change_keyslot(
        &mut self,
        dev: &dyn Storage,
        old_slot: usize,
        volume_key: &[u8],
        new_passphrase: &[u8],
        pbkdf: &Pbkdf,
    ) -> Result<usize, Error> {
        self.check_writable()?;
        let old = u32::try_from(old_slot)
            .ok()
            .and_then(|s| self.metadata.keyslots.get(s));
        let Some(Keyslot::Luks2(old)) = old else {
            return Err(Error::Unsupported(format!(
                "keyslot {old_slot} is not a passphrase keyslot in use"
            )));
        };
        let old_area = (old.area.offset, old.area.size);
        let af_hash = crate::hash::parse(&old.af.hash)?;
        let priority = old.priority.clone();
        let digest = self.verified_digest(volume_key)?;
        let new_slot = self
            .metadata
            .free_slot()
            .map_or(old_slot as u32, |s| s as u32);
        let mut ks = self.stage_keyslot(
            dev,
            volume_key,
            new_passphrase,
            pbkdf,
            &[old_area],
            af_hash,
            None,
        )?;
        ks.priority = priority;
        let mut md = self.metadata.clone();
        // Token assignments follow the keyslot to its new number.
        let old_name = old_slot.to_string();
        let new_name = new_slot.to_string();
        for (_, t) in md.tokens.0.iter_mut() {
            if let Some(Value::Array(a)) = t.get_mut("keyslots") {
                if a.iter().any(|v| v.as_str() == Some(&old_name))
                    && !a.iter().any(|v| v.as_str() == Some(&new_name))
                {
                    a.push(Value::String(new_name.clone()));
                }
            }
        }
        md.remove_keyslot(old_slot as u32);
        md.keyslots.0.push((new_slot, Keyslot::Luks2(Box::new(ks))));
        md.assign_digest(digest, new_slot)?;
        self.commit(dev, &md)?;
        self.wipe_area(dev, old_area.0, old_area.1)?;
        Ok(new_slot as usize)
    }
}
