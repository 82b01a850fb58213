//! `cryptsetup convert --type luks1|luks2`: a LUKS1 header turned into LUKS2 and back, in place,
//! with the result cryptsetup 2.6 produces (`lib/luks2/luks2_luks1_convert.c`) and its rules for
//! what can be converted, but crash safe where cryptsetup is not.
//!
//! # Layout
//!
//! LUKS1 keeps its keyslot areas from byte 4096 on; LUKS2 needs the first 32 KiB for its two
//! 16 KiB header copies. So converting moves the whole keyslot region by [`SHIFT`] (28 KiB): up
//! for LUKS2 (`[4096, E)` to `[32768, E + SHIFT)`), down for LUKS1. Every keyslot keeps its
//! salt, iterations and material; the digest keeps its bytes (LUKS1 stores the first 20).
//!
//! # Crash safety
//!
//! cryptsetup moves the region with one write and then writes the new header: a power cut in
//! between leaves the old header naming areas already overwritten. Here:
//!
//! 1. A *conversion record* is written (two checksummed copies at bytes 2048 and 3072, which
//!    neither format uses there, alternated so that a torn write leaves the previous one) and
//!    synced. It holds the LUKS1 header (the source, or the computed target), the region to move
//!    and how much of it has moved.
//! 2. The first sector gets [`CONVERTING_MAGIC`] instead of `LUKS\xba\xbe` and is synced: from
//!    now on no tool takes the device for LUKS1 or for a primary LUKS2 header, and this library
//!    refuses it with [`Error::ConversionInterrupted`] until [`convert`] finishes.
//! 3. The region moves in pieces of at most [`SHIFT`] bytes, taken from the end that the move
//!    goes away from (top down when moving up, bottom up when moving down), so a piece's
//!    destination only ever overlaps sources that have already moved. Each piece is synced, and
//!    then the record's progress is synced: after a cut, the piece in flight is copied again from
//!    its untouched source.
//! 4. The new header is written: for LUKS2 the secondary copy, synced, then the primary (its JSON
//!    area, then its binary header in one write over the record); for LUKS1 the stale tail of
//!    the old region is zeroed, the header's second sector is written and synced, then its first
//!    (with the LUKS magic), and the record is zeroed.
//!
//! A first sector with the converting magic but no valid record can only be a cut during the
//! last write of a conversion to LUKS2, whose secondary copy is then complete: such a device is
//! read as LUKS2. Until the first piece lands in a conversion to LUKS1, the old secondary LUKS2
//! copy is intact, and a tool that restores the primary from it gets the unchanged volume back.

use sectorcrypt_storage::Storage;
use serde_json::{Map, Value};

use crate::error::Error;
use crate::hash::Hash;
use crate::luks1::{self, HEADER_SIZE, KEYSLOTS, SALT_SIZE, SECTOR_SIZE, STRIPES};
use crate::luks2::binary::{
    BinaryHeader, HeaderCopy, BIN_LEN, CHECKSUM_ALG_LEN, CHECKSUM_LEN, HDR_SIZE_MIN, SALT_LEN,
    UUID_LEN, VERSION,
};
use crate::luks2::metadata::{
    Af, Area, Config, CryptSegment, Digest, Keyslot, KeyslotKdf, Luks2Keyslot, Metadata, Numbered,
    Pbkdf2Digest, SegmentEntry,
};
use crate::luks2::{self, keyslot_area_size, random_bytes};

/// What the first sector starts with while a conversion is under way: neither LUKS magic, nor
/// any signature libblkid knows.
pub const CONVERTING_MAGIC: [u8; 6] = *b"SCNV\xba\xbe";
/// How far the keyslot region moves: two 16 KiB LUKS2 header copies, less the 4 KiB LUKS1
/// leaves before its first keyslot (`luks1_shift` in cryptsetup).
pub const SHIFT: u64 = 2 * HDR_SIZE_MIN - LUKS1_KEYSLOTS;
/// Where LUKS1 keyslot areas start (`LUKS_ALIGN_KEYSLOTS`); they must start there to convert.
const LUKS1_KEYSLOTS: u64 = 4096;
/// Where LUKS2 keyslot areas start with 16 KiB header copies.
const LUKS2_KEYSLOTS: u64 = 2 * HDR_SIZE_MIN;
/// The two copies of the conversion record.
const RECORD_OFFSETS: [u64; 2] = [2048, 3072];
const RECORD_LEN: usize = 1024;
const RECORD_MAGIC: [u8; 8] = *b"SCCONVRT";
const RECORD_VERSION: u32 = 1;
/// The record's checksum (SHA-256 of everything before it) sits at the end.
const RECORD_SUM_AT: usize = RECORD_LEN - 32;
/// cryptsetup 2.6 writes the converted LUKS2 header as its second version (seqid 1, then
/// incremented by the write).
const CONVERTED_SEQID: u64 = 2;

/// The format to convert to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// LUKS1.
    Luks1,
    /// LUKS2.
    Luks2,
}

impl Format {
    /// 1 or 2.
    pub fn version(self) -> u8 {
        match self {
            Format::Luks1 => 1,
            Format::Luks2 => 2,
        }
    }

    /// `LUKS1` or `LUKS2`, as cryptsetup names the types in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Luks1 => "LUKS1",
            Format::Luks2 => "LUKS2",
        }
    }
}

/// A conversion in progress, as recorded on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    seq: u64,
    to: Format,
    /// The LUKS1 header: the source of a conversion to LUKS2, the target of one to LUKS1.
    luks1: [u8; HEADER_SIZE],
    /// The keyslot region moves from `from` to `dest`, `len` bytes of it; `moved` are done.
    from: u64,
    dest: u64,
    len: u64,
    moved: u64,
    /// The LUKS2 keyslots area (conversions to LUKS2).
    keyslots_size: u64,
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

impl Record {
    fn to_bytes(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[..8].copy_from_slice(&RECORD_MAGIC);
        out[8..12].copy_from_slice(&RECORD_VERSION.to_be_bytes());
        out[12..20].copy_from_slice(&self.seq.to_be_bytes());
        out[20] = self.to.version();
        for (i, v) in [
            self.from,
            self.dest,
            self.len,
            self.moved,
            self.keyslots_size,
        ]
        .iter()
        .enumerate()
        {
            out[24 + 8 * i..32 + 8 * i].copy_from_slice(&v.to_be_bytes());
        }
        out[64..64 + HEADER_SIZE].copy_from_slice(&self.luks1);
        let (body, sum) = out.split_at_mut(RECORD_SUM_AT);
        Hash::Sha256.digest_into(&[body], sum);
        out
    }

    fn parse(b: &[u8; RECORD_LEN]) -> Option<Record> {
        let mut sum = [0u8; 32];
        Hash::Sha256.digest_into(&[&b[..RECORD_SUM_AT]], &mut sum);
        if b[..8] != RECORD_MAGIC
            || b[8..12] != RECORD_VERSION.to_be_bytes()
            || sum[..] != b[RECORD_SUM_AT..]
        {
            return None;
        }
        let to = match b[20] {
            1 => Format::Luks1,
            2 => Format::Luks2,
            _ => return None,
        };
        let mut luks1 = [0u8; HEADER_SIZE];
        luks1.copy_from_slice(&b[64..64 + HEADER_SIZE]);
        let r = Record {
            seq: be64(b, 12),
            to,
            luks1,
            from: be64(b, 24),
            dest: be64(b, 32),
            len: be64(b, 40),
            moved: be64(b, 48),
            keyslots_size: be64(b, 56),
        };
        // A record this code wrote moves by SHIFT, within what it moved so far.
        let shift_ok = r.from.abs_diff(r.dest) == SHIFT;
        (shift_ok && r.moved <= r.len).then_some(r)
    }
}

fn io(dev: &dyn Storage, source: std::io::Error) -> Error {
    Error::Io {
        device: dev.name(),
        source,
    }
}

fn read(dev: &dyn Storage, len: usize, at: u64) -> Result<Vec<u8>, Error> {
    let mut buf = vec![0u8; len];
    dev.read_at(&mut buf, at).map_err(|e| io(dev, e))?;
    Ok(buf)
}

fn write(dev: &dyn Storage, bytes: &[u8], at: u64) -> Result<(), Error> {
    dev.write_at(bytes, at).map_err(|e| io(dev, e))
}

fn sync(dev: &dyn Storage) -> Result<(), Error> {
    dev.sync().map_err(|e| io(dev, e))
}

/// The newest valid conversion record on `dev`, if its first sector says a conversion is under
/// way.
fn current_record(dev: &dyn Storage) -> Result<Option<Record>, Error> {
    let len = dev.len().map_err(|e| io(dev, e))?;
    if len < LUKS1_KEYSLOTS || read(dev, 6, 0)? != CONVERTING_MAGIC {
        return Ok(None);
    }
    let mut best: Option<Record> = None;
    for at in RECORD_OFFSETS {
        let mut b = [0u8; RECORD_LEN];
        dev.read_at(&mut b, at).map_err(|e| io(dev, e))?;
        if let Some(r) = Record::parse(&b) {
            if best.as_ref().is_none_or(|x| r.seq > x.seq) {
                best = Some(r);
            }
        }
    }
    Ok(best)
}

/// The format an interrupted conversion on `dev` was converting to, if one is under way (the
/// first sector holds [`CONVERTING_MAGIC`] and a valid record exists).
pub fn interrupted(dev: &dyn Storage) -> Result<Option<Format>, Error> {
    Ok(current_record(dev)?.map(|r| r.to))
}

fn refuse(what: impl Into<String>) -> Error {
    Error::CannotConvert(what.into())
}

/// Convert the header of `dev` to `to`, or finish an interrupted conversion to `to`.
/// `progress(done, total)` is called as the keyslot region moves.
///
/// Errors: [`Error::CannotConvert`] with cryptsetup's reason when the header cannot be converted
/// (nothing is written then); [`Error::ConversionInterrupted`] if a conversion to the other
/// format is under way; the header's read errors; [`Error::Io`].
pub fn convert(
    dev: &dyn Storage,
    to: Format,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), Error> {
    if let Some(r) = current_record(dev)? {
        if r.to != to {
            return Err(Error::ConversionInterrupted { to: r.to.version() });
        }
        return run(dev, r, progress);
    }
    let dev_len = dev.len().map_err(|e| io(dev, e))?;
    let record = match (crate::Header::read(dev)?, to) {
        (crate::Header::Luks1(h), Format::Luks2) => plan_luks2(dev, &h, dev_len)?,
        (crate::Header::Luks2(h), Format::Luks1) => plan_luks1(&h, dev_len)?,
        (_, to) => return Err(refuse(format!("Device is already {} type.", to.name()))),
    };
    // The record first, then the magic that makes it count (see the module documentation).
    write_record(dev, &record)?;
    let mut first = read(dev, 512, 0)?;
    first[..6].copy_from_slice(&CONVERTING_MAGIC);
    write(dev, &first, 0)?;
    sync(dev)?;
    run(dev, record, progress)
}

/// cryptsetup's `LUKS_device_sectors`, rounded up to 4 KiB: the end of the last keyslot area.
fn luks1_region_end(h: &luks1::Header) -> u64 {
    let area = (u64::from(h.key_bytes) * u64::from(STRIPES)).div_ceil(SECTOR_SIZE) * SECTOR_SIZE;
    let last = h
        .keyslots
        .iter()
        .map(|k| u64::from(k.key_material_offset) * SECTOR_SIZE)
        .max()
        .unwrap_or(0);
    (last + area).div_ceil(LUKS1_KEYSLOTS) * LUKS1_KEYSLOTS
}

/// The checks of `LUKS2_luks1_to_luks2` and the record of the move.
fn plan_luks2(dev: &dyn Storage, h: &luks1::Header, dev_len: u64) -> Result<Record, Error> {
    let first = h
        .keyslots
        .iter()
        .map(|k| u64::from(k.key_material_offset) * SECTOR_SIZE)
        .min()
        .unwrap_or(0);
    if first != LUKS1_KEYSLOTS {
        return Err(refuse(format!(
            "Cannot convert to LUKS2 format - the first keyslot area starts at byte {first}, \
             not at {LUKS1_KEYSLOTS}."
        )));
    }
    let spec = h.cipher_spec();
    if spec.starts_with("cipher_null") {
        return Err(refuse(format!(
            "Unable to use cipher specification {spec} for LUKS2 keyslot."
        )));
    }
    let end = luks1_region_end(h);
    // Foreign metadata of the luksmeta package right after the keyslots would be overwritten.
    if end + 8 <= dev_len && read(dev, 8, end)? == b"LUKSMETA" {
        return Err(refuse(
            "Unable to convert header with LUKSMETA additional metadata.",
        ));
    }
    let needed = end + SHIFT;
    let max_size = match h.payload_offset_bytes() {
        // A detached header file grows to what LUKS2 needs, as cryptsetup grows it, once nothing
        // else can refuse: the bytes added are zeros no header names, so a power cut after the
        // growth leaves the LUKS1 header as valid as before. A device of fixed size cannot grow.
        0 if dev_len < needed => match dev.grow(needed) {
            Ok(()) => {
                sync(dev)?;
                needed
            }
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => dev_len,
            Err(e) => return Err(io(dev, e)),
        },
        0 => dev_len,
        data => data,
    };
    if max_size < needed {
        return Err(refuse(format!(
            "Unable to move keyslot area. Not enough space: the LUKS2 header and keyslots need \
             {needed} bytes, {} {max_size}.",
            if h.payload_offset == 0 {
                "the header device has"
            } else {
                "the data starts at byte"
            }
        )));
    }
    let record = Record {
        seq: 1,
        to: Format::Luks2,
        luks1: h.to_bytes(),
        from: LUKS1_KEYSLOTS,
        dest: LUKS2_KEYSLOTS,
        len: end - LUKS1_KEYSLOTS,
        moved: 0,
        keyslots_size: max_size - LUKS2_KEYSLOTS,
    };
    // The new metadata is checked as the LUKS2 reader will check it before anything moves.
    let metadata = luks2_metadata(h, record.keyslots_size)?;
    check_metadata(&metadata)?;
    Ok(record)
}

/// The LUKS2 metadata cryptsetup's `json_luks1_object` makes of `h`, keyslot areas moved up.
fn luks2_metadata(h: &luks1::Header, keyslots_size: u64) -> Result<Metadata, Error> {
    let spec = h.cipher_spec();
    let offset_of = |i: usize| u64::from(h.keyslots[i].key_material_offset) * SECTOR_SIZE;
    // cryptsetup sizes every area as the distance from keyslot 0 to keyslot 1.
    let area_size = offset_of(1).saturating_sub(offset_of(0));
    let active: Vec<usize> = (0..KEYSLOTS).filter(|&i| h.keyslots[i].active).collect();
    let keyslots = active
        .iter()
        .map(|&i| {
            let k = &h.keyslots[i];
            let slot = Luks2Keyslot {
                key_size: h.key_bytes,
                af: Af {
                    stripes: STRIPES,
                    hash: h.hash_spec.clone(),
                    extra: Map::new(),
                },
                area: Area {
                    offset: offset_of(i) + SHIFT,
                    size: area_size,
                    encryption: spec.clone(),
                    key_size: h.key_bytes,
                    extra: Map::new(),
                },
                kdf: KeyslotKdf::Pbkdf2 {
                    hash: h.hash_spec.clone(),
                    iterations: k.iterations,
                    salt: k.salt.to_vec(),
                },
                priority: None,
                extra: Map::new(),
            };
            (i as u32, Keyslot::Luks2(Box::new(slot)))
        })
        .collect();
    Ok(Metadata {
        keyslots: Numbered(keyslots),
        tokens: Numbered(Vec::new()),
        segments: Numbered(vec![(
            0,
            SegmentEntry::Crypt(CryptSegment {
                offset: h.payload_offset_bytes(),
                size: None,
                iv_tweak: 0,
                encryption: spec,
                sector_size: SECTOR_SIZE as u32,
                integrity: None,
                flags: None,
                extra: Map::new(),
            }),
        )]),
        digests: Numbered(vec![(
            0,
            Digest::Pbkdf2(Pbkdf2Digest {
                keyslots: active.iter().map(usize::to_string).collect(),
                segments: vec!["0".into()],
                hash: h.hash_spec.clone(),
                iterations: h.mk_digest_iterations,
                salt: h.mk_digest_salt.to_vec(),
                digest: h.mk_digest.to_vec(),
                extra: Map::new(),
            }),
        )]),
        config: Config {
            json_size: HDR_SIZE_MIN - BIN_LEN as u64,
            keyslots_size,
            flags: None,
            requirements: None,
            extra: Map::new(),
        },
        extra: Map::new(),
    })
}

fn check_metadata(metadata: &Metadata) -> Result<(), Error> {
    let text = metadata.to_json_text();
    let invalid = |why: String| {
        refuse(format!(
            "Cannot convert to LUKS2 format - invalid metadata: {why}."
        ))
    };
    if text.len() as u64 >= HDR_SIZE_MIN - BIN_LEN as u64 {
        return Err(invalid("the JSON does not fit a 16 KiB header".into()));
    }
    let value: Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    luks2::validate::validate(&value, HDR_SIZE_MIN - BIN_LEN as u64).map_err(invalid)
}

fn not_compatible(slot: u32) -> Error {
    refuse(format!(
        "Cannot convert to LUKS1 format - keyslot {slot} is not LUKS1 compatible."
    ))
}

/// The checks of `LUKS2_luks2_to_luks1` (cryptsetup 2.6 and later, in its order) and the record
/// of the move, holding the LUKS1 header to write.
fn plan_luks1(h: &luks2::Header, dev_len: u64) -> Result<Record, Error> {
    let m = h.metadata();
    let (segment, digest) = luks1_segment_and_digest(m)?;
    let hash = &digest.hash;
    let (key_size, slots) = luks1_keyslots(m, segment, hash)?;
    let (keyslots, placed) = luks1_slot_table(h, &slots, key_size)?;
    let region_end = m
        .keyslots
        .iter()
        .filter_map(|(_, k)| k.area())
        .chain(placed.iter().copied())
        .map(|(o, l)| o + l)
        .max()
        .unwrap_or(LUKS2_KEYSLOTS)
        .div_ceil(LUKS1_KEYSLOTS)
        * LUKS1_KEYSLOTS;
    let Some((cipher_name, cipher_mode)) = segment.encryption.split_once('-') else {
        return Err(refuse(format!(
            "Cannot convert to LUKS1 format - the cipher {} has no mode.",
            segment.encryption
        )));
    };
    let mut mk_digest = [0u8; luks1::DIGEST_SIZE];
    let mut mk_salt = [0u8; SALT_SIZE];
    if digest.digest.len() < mk_digest.len() || digest.salt.len() != SALT_SIZE {
        return Err(refuse(
            "Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible.",
        ));
    }
    mk_digest.copy_from_slice(&digest.digest[..luks1::DIGEST_SIZE]);
    mk_salt.copy_from_slice(&digest.salt);
    let payload = u32::try_from(segment.offset / SECTOR_SIZE)
        .map_err(|_| refuse("Cannot convert to LUKS1 format - the data offset is too large."))?;
    let target = luks1::Header {
        cipher_name: cipher_name.to_string(),
        cipher_mode: cipher_mode.to_string(),
        hash_spec: hash.clone(),
        payload_offset: payload,
        key_bytes: key_size,
        mk_digest,
        mk_digest_salt: mk_salt,
        mk_digest_iterations: digest.iterations,
        uuid: h.uuid().to_string(),
        keyslots,
    };
    // The new header must read back as LUKS1 (field sizes, areas apart and before the data).
    let bytes = target.to_bytes();
    luks1::Header::parse(&bytes, dev_len).map_err(|e| {
        refuse(format!(
            "Cannot convert to LUKS1 format - the LUKS1 header would be invalid: {e}."
        ))
    })?;
    Ok(Record {
        seq: 1,
        to: Format::Luks1,
        luks1: bytes,
        from: LUKS2_KEYSLOTS,
        dest: LUKS1_KEYSLOTS,
        len: region_end - LUKS2_KEYSLOTS,
        moved: 0,
        keyslots_size: 0,
    })
}

/// The data segment and the volume-key digest of a LUKS2 header LUKS1 can express (cryptsetup's
/// rules: no requirements, one 512-byte-sector segment without IV tweak, one PBKDF2 digest of a
/// known hash, no tokens), or cryptsetup's reason why not.
fn luks1_segment_and_digest(m: &Metadata) -> Result<(&CryptSegment, &Pbkdf2Digest), Error> {
    m.check_requirements_known()?;
    let reqs = m.mandatory_requirements();
    if !reqs.is_empty() {
        return Err(refuse(
            if reqs.iter().any(|r| r.starts_with("online-reencrypt")) {
                "Operation incompatible with device marked for LUKS2 reencryption. Aborting."
                    .to_string()
            } else {
                format!("Unmet LUKS2 requirements detected ({}).", reqs.join(", "))
            },
        ));
    }
    let Some(SegmentEntry::Crypt(segment)) = m.segments.get(0) else {
        return Err(refuse(
            "Cannot convert to LUKS1 format - there is no encrypted data segment 0.",
        ));
    };
    if segment.sector_size != SECTOR_SIZE as u32 {
        return Err(refuse(
            "Cannot convert to LUKS1 format - default segment encryption sector size is not 512 \
             bytes.",
        ));
    }
    let digest = match (m.digests.len(), m.digests.get(0)) {
        (1, Some(Digest::Pbkdf2(d))) => d,
        _ => {
            return Err(refuse(
                "Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible.",
            ))
        }
    };
    let hash = &digest.hash;
    if Hash::from_name(hash).is_none() {
        return Err(refuse(format!(
            "Cannot convert to LUKS1 format - the hash {hash} is unknown."
        )));
    }
    if m.segments.len() != 1 {
        return Err(refuse(
            "Cannot convert to LUKS1 format - device uses more segments.",
        ));
    }
    if !m.tokens.is_empty() {
        return Err(refuse(format!(
            "Cannot convert to LUKS1 format - LUKS2 header contains {} token(s).",
            m.tokens.len()
        )));
    }
    // LUKS1 has no IV offset: data written with one would no longer decrypt.
    if segment.iv_tweak != 0 {
        return Err(refuse(format!(
            "Cannot convert to LUKS1 format - the data segment's IV tweak is {}, LUKS1 has none.",
            segment.iv_tweak
        )));
    }
    Ok((segment, digest))
}

/// The key size and the LUKS2 keyslots by number (0-7), every one LUKS1 compatible: bound,
/// PBKDF2 with the digest's hash, cryptsetup's AF stripes and area size, the segment's cipher.
fn luks1_keyslots<'a>(
    m: &'a Metadata,
    segment: &CryptSegment,
    hash: &str,
) -> Result<(u32, [Option<&'a Luks2Keyslot>; KEYSLOTS]), Error> {
    let key_size = m
        .keyslots
        .iter()
        .find_map(|(_, k)| match k {
            Keyslot::Luks2(k) => Some(k.key_size),
            _ => None,
        })
        .ok_or_else(|| refuse("Cannot convert to LUKS1 format - there are no active keyslots."))?;
    let mut slots: [Option<&Luks2Keyslot>; KEYSLOTS] = [None; KEYSLOTS];
    for (n, k) in m.keyslots.iter() {
        let bound = m
            .digest_of_keyslot(n)
            .is_some_and(|(_, d)| d.segments().contains(&"0"));
        let Keyslot::Luks2(k) = k else {
            return Err(refuse(format!(
                "Cannot convert to LUKS1 format - keyslot {n} is in invalid state."
            )));
        };
        if m.digest_of_keyslot(n).is_none() {
            return Err(refuse(format!(
                "Cannot convert to LUKS1 format - keyslot {n} is in invalid state."
            )));
        }
        if !bound {
            return Err(refuse(format!(
                "Cannot convert to LUKS1 format - keyslot {n} is unbound."
            )));
        }
        if n as usize >= KEYSLOTS {
            return Err(refuse(format!(
                "Cannot convert to LUKS1 format - slot {n} (over maximum slots) is still active."
            )));
        }
        let KeyslotKdf::Pbkdf2 {
            hash: kdf_hash,
            salt,
            ..
        } = &k.kdf
        else {
            return Err(not_compatible(n));
        };
        let compatible = kdf_hash == hash
            && k.af.stripes == STRIPES
            && k.af.hash == hash
            && k.area.encryption == segment.encryption
            && k.key_size == key_size
            && k.area.key_size == key_size
            && salt.len() == SALT_SIZE
            && k.area.size == keyslot_area_size(key_size as usize)
            && k.area.offset >= LUKS2_KEYSLOTS;
        if !compatible {
            return Err(not_compatible(n));
        }
        slots[n as usize] = Some(k);
    }
    Ok((key_size, slots))
}

/// A LUKS1 header's eight keyslots.
type SlotTable = [luks1::Keyslot; KEYSLOTS];

/// A byte range: offset and length.
type Extent = (u64, u64);

/// The LUKS1 keyslot table for `slots`, and the areas placed for inactive slots: LUKS1 gives
/// every slot an area, so inactive ones get the first gaps, as cryptsetup's placeholders.
fn luks1_slot_table(
    h: &luks2::Header,
    slots: &[Option<&Luks2Keyslot>; KEYSLOTS],
    key_size: u32,
) -> Result<(SlotTable, Vec<Extent>), Error> {
    let m = h.metadata();
    let area_len = keyslot_area_size(key_size as usize);
    let mut placed: Vec<(u64, u64)> = Vec::new();
    let mut keyslots = [luks1::Keyslot {
        active: false,
        iterations: 0,
        salt: [0; SALT_SIZE],
        key_material_offset: 0,
        stripes: STRIPES,
    }; KEYSLOTS];
    for (i, slot) in slots.iter().enumerate() {
        let (offset, active, iterations, salt) = match slot {
            Some(k) => {
                let KeyslotKdf::Pbkdf2 {
                    iterations, salt, ..
                } = &k.kdf
                else {
                    return Err(not_compatible(i as u32));
                };
                let mut s = [0u8; SALT_SIZE];
                s.copy_from_slice(salt);
                (k.area.offset, true, *iterations, s)
            }
            None => {
                let at = m
                    .find_area_gap(h.binary().hdr_size, area_len, &placed)
                    .ok_or_else(|| {
                        refuse(format!(
                            "Cannot convert to LUKS1 format - no room in the keyslots area for \
                             LUKS1 keyslot {i}."
                        ))
                    })?;
                placed.push((at, area_len));
                (at, false, 0, [0; SALT_SIZE])
            }
        };
        keyslots[i] = luks1::Keyslot {
            active,
            iterations,
            salt,
            key_material_offset: u32::try_from((offset - SHIFT) / SECTOR_SIZE)
                .map_err(|_| not_compatible(i as u32))?,
            stripes: STRIPES,
        };
    }
    Ok((keyslots, placed))
}

/// Write `r` over the older of the two record copies, and sync.
fn write_record(dev: &dyn Storage, r: &Record) -> Result<(), Error> {
    write(dev, &r.to_bytes(), RECORD_OFFSETS[(r.seq % 2) as usize])?;
    sync(dev)
}

/// Move what is left of the region, then write the new header.
fn run(dev: &dyn Storage, mut r: Record, progress: &mut dyn FnMut(u64, u64)) -> Result<(), Error> {
    progress(r.moved, r.len);
    while r.moved < r.len {
        let n = SHIFT.min(r.len - r.moved);
        let src = if r.dest > r.from {
            r.from + r.len - r.moved - n
        } else {
            r.from + r.moved
        };
        let dst = src - r.from + r.dest;
        let piece = zeroize::Zeroizing::new(read(dev, n as usize, src)?);
        write(dev, &piece, dst)?;
        sync(dev)?;
        r.moved += n;
        r.seq += 1;
        write_record(dev, &r)?;
        progress(r.moved, r.len);
    }
    match r.to {
        Format::Luks2 => finish_luks2(dev, &r),
        Format::Luks1 => finish_luks1(dev, &r),
    }
}

fn finish_luks2(dev: &dyn Storage, r: &Record) -> Result<(), Error> {
    let dev_len = dev.len().map_err(|e| io(dev, e))?;
    let h = luks1::Header::parse(&r.luks1, dev_len)?;
    let metadata = luks2_metadata(&h, r.keyslots_size)?;
    check_metadata(&metadata)?;
    let text = metadata.to_json_text();
    let mut area = vec![0u8; (HDR_SIZE_MIN - BIN_LEN as u64) as usize];
    area[..text.len()].copy_from_slice(text.as_bytes());
    let mut uuid = [0u8; UUID_LEN];
    uuid[..h.uuid.len()].copy_from_slice(h.uuid.as_bytes());
    let mut checksum_alg = [0u8; CHECKSUM_ALG_LEN];
    checksum_alg[..6].copy_from_slice(b"sha256");
    for copy in [HeaderCopy::Secondary, HeaderCopy::Primary] {
        let at = if copy == HeaderCopy::Primary {
            0
        } else {
            HDR_SIZE_MIN
        };
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(&random_bytes(SALT_LEN));
        let mut bin = BinaryHeader {
            copy,
            version: VERSION,
            hdr_size: HDR_SIZE_MIN,
            seqid: CONVERTED_SEQID,
            label: [0; crate::luks2::binary::LABEL_LEN],
            checksum_alg,
            salt,
            uuid,
            subsystem: [0; crate::luks2::binary::LABEL_LEN],
            hdr_offset: at,
            checksum: [0; CHECKSUM_LEN],
        };
        bin.seal(&area)?;
        // The JSON area first; the binary header, which makes the copy valid, in one write.
        write(dev, &area, at + BIN_LEN as u64)?;
        write(dev, &bin.to_bytes(), at)?;
        sync(dev)?;
    }
    Ok(())
}

fn finish_luks1(dev: &dyn Storage, r: &Record) -> Result<(), Error> {
    // The old region's tail, which the move left behind, holds a stale copy of key material.
    let stale = (r.dest + r.len).max(r.from);
    let zeros = vec![0u8; (r.from + r.len - stale) as usize];
    write(dev, &zeros, stale)?;
    sync(dev)?;
    // The header's second sector first: the first, with the magic, makes it LUKS1.
    let mut second = [0u8; 512];
    second[..HEADER_SIZE - 512].copy_from_slice(&r.luks1[512..]);
    write(dev, &second, 512)?;
    sync(dev)?;
    write(dev, &r.luks1[..512], 0)?;
    sync(dev)?;
    // What is left of the LUKS2 binary header and the record: zeros, as a LUKS1 header has.
    write(dev, &[0u8; (LUKS1_KEYSLOTS - 1024) as usize], 1024)?;
    sync(dev)
}
