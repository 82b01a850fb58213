//! LUKS1, byte compatible with cryptsetup (`lib/luks1/`) and qemu's `luks` format: the 592-byte
//! header (`phdr`) at offset 0, big-endian integers, eight keyslots each pointing at AF-split key
//! material encrypted with the volume cipher, and a PBKDF2 digest of the volume key.
//!
//! Reading and opening are here; formatting, keyslot changes and header backup / restore (all
//! ordered to survive a power cut at any write) are in `write` ([`format`], [`Header::write`],
//! [`Header::add_keyslot`], [`Header::kill_keyslot`], [`Header::change_keyslot`],
//! [`Header::backup`], [`Header::restore`]).
//!
//! Layout of the header (offsets in bytes):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0   | 6  | magic `LUKS\xba\xbe` |
//! | 6   | 2  | version (1) |
//! | 8   | 32 | cipherName (`aes`) |
//! | 40  | 32 | cipherMode (`xts-plain64`) |
//! | 72  | 32 | hashSpec (`sha256`) |
//! | 104 | 4  | payloadOffset (512-byte sectors) |
//! | 108 | 4  | keyBytes |
//! | 112 | 20 | mkDigest |
//! | 132 | 32 | mkDigestSalt |
//! | 164 | 4  | mkDigestIterations |
//! | 168 | 40 | uuid |
//! | 208 | 8 × 48 | keyslots: active, passwordIterations, passwordSalt\[32\], keyMaterialOffset (sectors), stripes |
//!
//! Validation includes everything cryptsetup's `LUKS_read_phdr` enforces (4000 stripes in every
//! slot; keyslot areas after the header, before the payload, apart and inside the device; a known
//! hash), so whatever cryptsetup refuses to load is refused here. It also refuses what cryptsetup
//! only trips over later or silently tolerates: unterminated or non-ASCII strings, non-zero
//! padding after them, unknown keyslot markers, zero iteration counts and a key size that does
//! not fit the cipher. The payload offset is deliberately not checked against the device length:
//! a detached header file or a `luksHeaderBackup` file holds the header and keyslots only, and
//! cryptsetup accepts both.

use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_storage::Storage;
use serde_json::json;

use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::Kdf;
use crate::keyslot::{digest_matches, KeyslotArea};
use crate::Unlocked;

mod write;
pub use write::{format, FormatParams};

/// The LUKS magic, shared with LUKS2.
pub const MAGIC: [u8; 6] = *b"LUKS\xba\xbe";
/// Bytes of the LUKS1 header (`struct luks_phdr`).
pub const HEADER_SIZE: usize = 592;
/// The number of keyslots.
pub const KEYSLOTS: usize = 8;
/// AF stripes of every keyslot: cryptsetup refuses any other count (`LUKS_check_keyslots`).
pub const STRIPES: u32 = 4000;
/// The sector unit of `payloadOffset` and `keyMaterialOffset`.
pub const SECTOR_SIZE: u64 = 512;
/// Bytes of the master-key digest (truncated PBKDF2 output).
pub const DIGEST_SIZE: usize = 20;
/// Bytes of every salt.
pub const SALT_SIZE: usize = 32;

/// Marker of an enabled keyslot.
const KEY_ENABLED: u32 = 0x00AC_71F3;
/// Marker of a disabled keyslot.
const KEY_DISABLED: u32 = 0x0000_DEAD;

/// The largest `keyBytes` accepted for ciphers sectorcrypt cannot check the key size of. Real
/// keys are at most 64 bytes (512-bit XTS); the bound keeps a damaged header from making a
/// keyslot read allocate gigabytes (4000 stripes of key material per slot).
const MAX_KEY_BYTES: u32 = 512;

// Field offsets inside the header.
const OFF_VERSION: usize = 6;
const OFF_CIPHER_NAME: usize = 8;
const OFF_CIPHER_MODE: usize = 40;
const OFF_HASH_SPEC: usize = 72;
const OFF_PAYLOAD_OFFSET: usize = 104;
const OFF_KEY_BYTES: usize = 108;
const OFF_MK_DIGEST: usize = 112;
const OFF_MK_SALT: usize = 132;
const OFF_MK_ITERATIONS: usize = 164;
const OFF_UUID: usize = 168;
const OFF_KEYSLOTS: usize = 208;
const KEYSLOT_SIZE: usize = 48;
const STRING_LEN: usize = 32;
const UUID_LEN: usize = 40;

/// A parsed and validated LUKS1 header. The magic and version are implied (a `Header` is always
/// version 1); every other field of the on-disk header is here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// `cipherName`: the block cipher, e.g. `aes`.
    pub cipher_name: String,
    /// `cipherMode`: mode and IV generator, e.g. `xts-plain64` or `cbc-essiv:sha256`.
    pub cipher_mode: String,
    /// `hashSpec`: the hash of PBKDF2 and the AF splitter, e.g. `sha256`.
    pub hash_spec: String,
    /// `payloadOffset`: where the encrypted data starts, in 512-byte sectors (0 for a detached
    /// header whose data device starts with the payload).
    pub payload_offset: u32,
    /// `keyBytes`: the volume key length in bytes.
    pub key_bytes: u32,
    /// `mkDigest`: PBKDF2 of the volume key, truncated to 20 bytes.
    pub mk_digest: [u8; DIGEST_SIZE],
    /// `mkDigestSalt`.
    pub mk_digest_salt: [u8; SALT_SIZE],
    /// `mkDigestIterations`.
    pub mk_digest_iterations: u32,
    /// `uuid`, as text.
    pub uuid: String,
    /// The eight keyslots.
    pub keyslots: [Keyslot; KEYSLOTS],
}

/// One LUKS1 keyslot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keyslot {
    /// Whether the slot holds a key (`0x00AC71F3`) or not (`0x0000DEAD`).
    pub active: bool,
    /// PBKDF2 iterations for the passphrase.
    pub iterations: u32,
    /// PBKDF2 salt for the passphrase.
    pub salt: [u8; SALT_SIZE],
    /// Where the key material starts, in 512-byte sectors from the start of the header device.
    pub key_material_offset: u32,
    /// AF stripes (always 4000 in a valid header).
    pub stripes: u32,
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn put_be32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// A NUL-terminated, zero-padded text field. The padding must be zero because every writer
/// (cryptsetup, qemu) zero-fills the header first: anything else there means something else
/// overwrote the header, and it would make `to_bytes` differ from the bytes read.
fn text_field(field: &[u8], what: &str) -> Result<String, Error> {
    let Some(end) = field.iter().position(|&b| b == 0) else {
        return Err(Error::Corrupt(format!(
            "the {what} field is not NUL-terminated"
        )));
    };
    let (text, padding) = field.split_at(end);
    if !text.iter().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Corrupt(format!(
            "the {what} field holds bytes that are not printable ASCII"
        )));
    }
    if padding.iter().any(|&b| b != 0) {
        return Err(Error::Corrupt(format!(
            "the {what} field has non-zero bytes after its terminating NUL"
        )));
    }
    // Printable ASCII is UTF-8, so this cannot fail; mapping the error keeps it panic-free.
    String::from_utf8(text.to_vec())
        .map_err(|_| Error::Corrupt(format!("the {what} field is not UTF-8")))
}

/// Write `text` NUL-terminated and zero-padded into `field`, cut to fit if a caller set a string
/// longer than the on-disk field allows.
fn put_text(field: &mut [u8], text: &str) {
    let n = text.len().min(field.len() - 1);
    field[..n].copy_from_slice(&text.as_bytes()[..n]);
}

fn hex_spaced(bytes: &[u8]) -> String {
    // cryptsetup's crypt_log_hex prints every byte followed by the separator, so lines end in a
    // space; dump_text reproduces that exactly.
    bytes.iter().map(|b| format!("{b:02x} ")).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn not_luks() -> Error {
    Error::NotLuks {
        device: "the device".to_string(),
    }
}

fn no_such_slot(slot: usize) -> Error {
    Error::Unsupported(format!(
        "keyslot {slot} (LUKS1 has keyslots 0 to {})",
        KEYSLOTS - 1
    ))
}

/// Parse a header's hash name: a name no cryptsetup backend offers (md5 included: LUKS1 needs at
/// least 20 digest bytes) is damage.
fn parse_hash(name: &str) -> Result<Hash, Error> {
    Hash::from_name(name)
        .ok_or_else(|| Error::Corrupt(format!("the hash '{name}' is not a LUKS1 hash")))
}

impl Keyslot {
    fn parse(raw: &[u8], index: usize) -> Result<Keyslot, Error> {
        let active = match be32(raw, 0) {
            KEY_ENABLED => true,
            KEY_DISABLED => false,
            other => {
                return Err(Error::Corrupt(format!(
                    "keyslot {index} has the unknown state marker {other:#010x}"
                )))
            }
        };
        let mut salt = [0u8; SALT_SIZE];
        salt.copy_from_slice(&raw[8..8 + SALT_SIZE]);
        Ok(Keyslot {
            active,
            iterations: be32(raw, 4),
            salt,
            key_material_offset: be32(raw, 40),
            stripes: be32(raw, 44),
        })
    }

    fn write(&self, out: &mut [u8]) {
        put_be32(
            out,
            0,
            if self.active {
                KEY_ENABLED
            } else {
                KEY_DISABLED
            },
        );
        put_be32(out, 4, self.iterations);
        out[8..8 + SALT_SIZE].copy_from_slice(&self.salt);
        put_be32(out, 40, self.key_material_offset);
        put_be32(out, 44, self.stripes);
    }
}

impl Header {
    /// Parse and validate the header at the start of `bytes` (at least [`HEADER_SIZE`] bytes;
    /// anything after the header is ignored). `device_len` is the length in bytes of the device
    /// holding the header, against which the keyslot areas are checked.
    ///
    /// Errors: [`Error::NotLuks`] for a wrong magic, a version other than 1 or fewer than
    /// [`HEADER_SIZE`] bytes; [`Error::Unsupported`] for a hash cryptsetup knows but sectorcrypt
    /// does not implement; [`Error::Corrupt`] naming the first inconsistency otherwise.
    pub fn parse(bytes: &[u8], device_len: u64) -> Result<Header, Error> {
        if bytes.len() < HEADER_SIZE || bytes[..MAGIC.len()] != MAGIC {
            return Err(not_luks());
        }
        // Version 2 is LUKS2, handled by `crate::luks2`; anything else is not LUKS at all.
        if u16::from_be_bytes([bytes[OFF_VERSION], bytes[OFF_VERSION + 1]]) != 1 {
            return Err(not_luks());
        }
        let field = |at: usize, len: usize| &bytes[at..at + len];
        let cipher_name = text_field(field(OFF_CIPHER_NAME, STRING_LEN), "cipher name")?;
        let cipher_mode = text_field(field(OFF_CIPHER_MODE, STRING_LEN), "cipher mode")?;
        let hash_spec = text_field(field(OFF_HASH_SPEC, STRING_LEN), "hash spec")?;
        let uuid = text_field(field(OFF_UUID, UUID_LEN), "UUID")?;
        let mut mk_digest = [0u8; DIGEST_SIZE];
        mk_digest.copy_from_slice(field(OFF_MK_DIGEST, DIGEST_SIZE));
        let mut mk_digest_salt = [0u8; SALT_SIZE];
        mk_digest_salt.copy_from_slice(field(OFF_MK_SALT, SALT_SIZE));
        let mut keyslots = [Keyslot {
            active: false,
            iterations: 0,
            salt: [0; SALT_SIZE],
            key_material_offset: 0,
            stripes: 0,
        }; KEYSLOTS];
        for (i, slot) in keyslots.iter_mut().enumerate() {
            *slot = Keyslot::parse(field(OFF_KEYSLOTS + i * KEYSLOT_SIZE, KEYSLOT_SIZE), i)?;
        }
        let header = Header {
            cipher_name,
            cipher_mode,
            hash_spec,
            payload_offset: be32(bytes, OFF_PAYLOAD_OFFSET),
            key_bytes: be32(bytes, OFF_KEY_BYTES),
            mk_digest,
            mk_digest_salt,
            mk_digest_iterations: be32(bytes, OFF_MK_ITERATIONS),
            uuid,
            keyslots,
        };
        header.validate(device_len)?;
        Ok(header)
    }

    /// Every check beyond the byte format, in the order cryptsetup makes them.
    fn validate(&self, device_len: u64) -> Result<(), Error> {
        for (name, what) in [
            (&self.cipher_name, "cipher name"),
            (&self.cipher_mode, "cipher mode"),
            (&self.hash_spec, "hash spec"),
        ] {
            if name.is_empty() {
                return Err(Error::Corrupt(format!("the {what} is empty")));
            }
        }
        parse_hash(&self.hash_spec)?;
        if self.key_bytes == 0 {
            return Err(Error::Corrupt("the volume key size is 0 bytes".into()));
        }
        // A cipher sectorcrypt does not implement (serpent, twofish, ...) is still a valid
        // header: it can be dumped, and opening it reports the cipher as unsupported.
        match CipherSpec::parse(&self.cipher_spec()) {
            Ok(spec) => spec.check_key_len(self.key_bytes as usize).map_err(|e| {
                Error::Corrupt(format!("the volume key size does not fit the cipher: {e}"))
            })?,
            Err(_) if self.key_bytes > MAX_KEY_BYTES => {
                return Err(Error::Corrupt(format!(
                    "a volume key of {} bytes is larger than any cipher takes",
                    self.key_bytes
                )))
            }
            Err(_) => {}
        }
        if self.mk_digest_iterations == 0 {
            return Err(Error::Corrupt(
                "the volume key digest has an iteration count of 0".into(),
            ));
        }
        for (i, slot) in self.keyslots.iter().enumerate() {
            // Disabled slots keep whatever iteration count they had (cryptsetup zeroes it).
            if slot.active && slot.iterations == 0 {
                return Err(Error::Corrupt(format!(
                    "keyslot {i} is enabled with an iteration count of 0"
                )));
            }
            // cryptsetup checks every slot, enabled or not: a disabled slot's area is where the
            // next added key goes.
            if slot.stripes != STRIPES {
                return Err(Error::Corrupt(format!(
                    "keyslot {i} has {} AF stripes instead of {STRIPES}",
                    slot.stripes
                )));
            }
        }
        self.check_layout(device_len)
    }

    /// Sectors of one keyslot's key material (cryptsetup's `AF_split_sectors`: not rounded to
    /// the 4096-byte alignment cryptsetup places slots at).
    fn keyslot_sectors(&self) -> u64 {
        (u64::from(self.key_bytes) * u64::from(STRIPES)).div_ceil(SECTOR_SIZE)
    }

    /// The keyslot areas must lie after the header, before the payload (unless the payload
    /// offset is 0, as in detached headers), apart from each other and inside the device.
    fn check_layout(&self, device_len: u64) -> Result<(), Error> {
        let len = self.keyslot_sectors();
        let span = |i: usize| {
            let start = u64::from(self.keyslots[i].key_material_offset);
            (start, start + len)
        };
        for i in 0..KEYSLOTS {
            let (start, end) = span(i);
            if start * SECTOR_SIZE < HEADER_SIZE as u64 {
                return Err(Error::Corrupt(format!(
                    "keyslot {i}'s key material at sector {start} overlaps the header"
                )));
            }
            if self.payload_offset != 0 && end > u64::from(self.payload_offset) {
                return Err(Error::Corrupt(format!(
                    "keyslot {i}'s key material (sectors {start} to {end}) runs past the payload \
                     offset (sector {})",
                    self.payload_offset
                )));
            }
        }
        let mut order: [usize; KEYSLOTS] = std::array::from_fn(|i| i);
        order.sort_by_key(|&i| self.keyslots[i].key_material_offset);
        for pair in order.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let ((a_start, a_end), (b_start, b_end)) = (span(a), span(b));
            if b_start < a_end {
                return Err(Error::Corrupt(format!(
                    "the key material of keyslots {a} (sectors {a_start} to {a_end}) and {b} \
                     (sectors {b_start} to {b_end}) overlaps"
                )));
            }
        }
        for i in 0..KEYSLOTS {
            let (_, end) = span(i);
            if end * SECTOR_SIZE > device_len {
                return Err(Error::Corrupt(format!(
                    "keyslot {i}'s key material ends at byte {}, past the end of the device \
                     ({device_len} bytes)",
                    end * SECTOR_SIZE
                )));
            }
        }
        Ok(())
    }

    /// Read and validate the header at offset 0 of `dev`.
    ///
    /// Errors: [`Error::NotLuks`] (naming the device) if it is shorter than a header or not
    /// LUKS1; [`Error::Io`]; otherwise as [`Header::parse`].
    pub fn read(dev: &dyn Storage) -> Result<Header, Error> {
        let io = |source| Error::Io {
            device: dev.name(),
            source,
        };
        let len = dev.len().map_err(io)?;
        if len < HEADER_SIZE as u64 {
            return Err(Error::NotLuks { device: dev.name() });
        }
        let mut bytes = [0u8; HEADER_SIZE];
        dev.read_at(&mut bytes, 0).map_err(io)?;
        Header::parse(&bytes, len).map_err(|e| match e {
            Error::NotLuks { .. } => Error::NotLuks { device: dev.name() },
            other => other,
        })
    }

    /// The on-disk bytes: the exact inverse of [`Header::parse`]. Strings longer than their
    /// field (only possible if a caller set them so) are cut to keep the terminating NUL.
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[..MAGIC.len()].copy_from_slice(&MAGIC);
        out[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&1u16.to_be_bytes());
        put_text(
            &mut out[OFF_CIPHER_NAME..OFF_CIPHER_NAME + STRING_LEN],
            &self.cipher_name,
        );
        put_text(
            &mut out[OFF_CIPHER_MODE..OFF_CIPHER_MODE + STRING_LEN],
            &self.cipher_mode,
        );
        put_text(
            &mut out[OFF_HASH_SPEC..OFF_HASH_SPEC + STRING_LEN],
            &self.hash_spec,
        );
        put_be32(&mut out, OFF_PAYLOAD_OFFSET, self.payload_offset);
        put_be32(&mut out, OFF_KEY_BYTES, self.key_bytes);
        out[OFF_MK_DIGEST..OFF_MK_DIGEST + DIGEST_SIZE].copy_from_slice(&self.mk_digest);
        out[OFF_MK_SALT..OFF_MK_SALT + SALT_SIZE].copy_from_slice(&self.mk_digest_salt);
        put_be32(&mut out, OFF_MK_ITERATIONS, self.mk_digest_iterations);
        put_text(&mut out[OFF_UUID..OFF_UUID + UUID_LEN], &self.uuid);
        for (i, slot) in self.keyslots.iter().enumerate() {
            let at = OFF_KEYSLOTS + i * KEYSLOT_SIZE;
            slot.write(&mut out[at..at + KEYSLOT_SIZE]);
        }
        out
    }

    /// The dm-crypt cipher specification, `cipherName-cipherMode` (e.g. `aes-xts-plain64`).
    pub fn cipher_spec(&self) -> String {
        format!("{}-{}", self.cipher_name, self.cipher_mode)
    }

    /// The UUID text.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// The hash of PBKDF2 (keyslots and digest) and the AF splitter.
    pub fn hash(&self) -> Result<Hash, Error> {
        parse_hash(&self.hash_spec)
    }

    /// Where the encrypted data starts, in bytes.
    pub fn payload_offset_bytes(&self) -> u64 {
        u64::from(self.payload_offset) * SECTOR_SIZE
    }

    /// Where and how keyslot `slot`'s material is stored (enabled or not: a disabled slot's area
    /// is where a new key goes). The area uses the volume cipher, a key as long as the volume key,
    /// and the header hash for the AF splitter.
    ///
    /// Errors: [`Error::Unsupported`] for a slot number above 7 or a cipher sectorcrypt does not
    /// implement.
    pub fn keyslot_area(&self, slot: usize) -> Result<KeyslotArea, Error> {
        let Some(ks) = self.keyslots.get(slot) else {
            return Err(no_such_slot(slot));
        };
        let cipher = self.cipher_spec();
        if CipherSpec::parse(&cipher).is_err() {
            return Err(Error::Unsupported(format!("the cipher '{cipher}'")));
        }
        Ok(KeyslotArea {
            offset: u64::from(ks.key_material_offset) * SECTOR_SIZE,
            cipher,
            key_size: self.key_bytes as usize,
            volume_key_size: self.key_bytes as usize,
            stripes: ks.stripes as usize,
            af_hash: self.hash()?,
        })
    }

    /// Open keyslot `slot`, or every enabled keyslot in order, with `passphrase`; `dev` is the
    /// device holding the header (the keyslots follow it there).
    ///
    /// Errors: [`Error::WrongPassphrase`] if no tried slot yields a volume key matching the
    /// digest (a disabled `slot` counts as not opening, as in cryptsetup);
    /// [`Error::Unsupported`] for an unknown slot number or an unimplemented cipher;
    /// [`Error::Io`] / [`Error::Corrupt`] if a keyslot cannot be read or its parameters are
    /// unusable.
    pub fn unlock(
        &self,
        dev: &dyn Storage,
        passphrase: &[u8],
        slot: Option<usize>,
    ) -> Result<Unlocked, Error> {
        let hash = self.hash()?;
        let candidates = match slot {
            Some(s) if s >= KEYSLOTS => return Err(no_such_slot(s)),
            Some(s) => s..s + 1,
            None => 0..KEYSLOTS,
        };
        // Nothing to try is cryptsetup's "No usable keyslot" (exit 1), not a wrong passphrase.
        if !candidates.clone().any(|s| self.keyslots[s].active) {
            return Err(Error::NoUsableKeyslot(match slot {
                Some(s) => format!("keyslot {s} is not in use"),
                None => "no keyslot is in use".into(),
            }));
        }
        for s in candidates {
            let ks = &self.keyslots[s];
            if !ks.active {
                continue;
            }
            let area = self.keyslot_area(s)?;
            let kdf = Kdf::Pbkdf2 {
                hash,
                iterations: ks.iterations,
            };
            let candidate = area.open(dev, &kdf, &ks.salt, passphrase)?;
            if digest_matches(
                &candidate,
                hash,
                self.mk_digest_iterations,
                &self.mk_digest_salt,
                &self.mk_digest,
            )? {
                return Ok(Unlocked {
                    slot: s,
                    volume_key: candidate,
                });
            }
        }
        Err(Error::WrongPassphrase)
    }

    /// The text `cryptsetup luksDump` prints for a LUKS1 header, from the `Version:` line on, byte
    /// for byte (tabs and the space after every hex byte included). cryptsetup precedes it with
    /// `LUKS header information for DEVICE` and an empty line; the caller prints those, since
    /// the header does not know its device's name.
    pub fn dump_text(&self) -> String {
        let mut s = String::new();
        s += "Version:       \t1\n";
        s += &format!("Cipher name:   \t{}\n", self.cipher_name);
        s += &format!("Cipher mode:   \t{}\n", self.cipher_mode);
        // cryptsetup lower-cases the hash name when it reads the header.
        s += &format!("Hash spec:     \t{}\n", self.hash_spec.to_ascii_lowercase());
        s += &format!("Payload offset:\t{}\n", self.payload_offset);
        s += &format!("MK bits:       \t{}\n", u64::from(self.key_bytes) * 8);
        s += &format!("MK digest:     \t{}\n", hex_spaced(&self.mk_digest));
        let (salt_a, salt_b) = self.mk_digest_salt.split_at(SALT_SIZE / 2);
        s += &format!("MK salt:       \t{}\n", hex_spaced(salt_a));
        s += &format!("               \t{}\n", hex_spaced(salt_b));
        s += &format!("MK iterations: \t{}\n", self.mk_digest_iterations);
        s += &format!("UUID:          \t{}\n\n", self.uuid);
        for (i, slot) in self.keyslots.iter().enumerate() {
            if !slot.active {
                s += &format!("Key Slot {i}: DISABLED\n");
                continue;
            }
            let (salt_a, salt_b) = slot.salt.split_at(SALT_SIZE / 2);
            s += &format!("Key Slot {i}: ENABLED\n");
            s += &format!("\tIterations:         \t{}\n", slot.iterations);
            s += &format!("\tSalt:               \t{}\n", hex_spaced(salt_a));
            s += &format!("\t                      \t{}\n", hex_spaced(salt_b));
            s += &format!("\tKey material offset:\t{}\n", slot.key_material_offset);
            s += &format!("\tAF stripes:            \t{}\n", slot.stripes);
        }
        s
    }

    /// The fields of [`Header::dump_text`] as JSON: binary fields in lower-case hex, offsets in
    /// 512-byte sectors (plus the payload offset in bytes), all eight keyslots in order.
    pub fn dump_json(&self) -> serde_json::Value {
        let keyslots: Vec<serde_json::Value> = self
            .keyslots
            .iter()
            .enumerate()
            .map(|(i, k)| {
                json!({
                    "slot": i,
                    "enabled": k.active,
                    "iterations": k.iterations,
                    "salt": hex(&k.salt),
                    "key_material_offset": k.key_material_offset,
                    "stripes": k.stripes,
                })
            })
            .collect();
        json!({
            "version": 1,
            "cipher_name": self.cipher_name,
            "cipher_mode": self.cipher_mode,
            "cipher": self.cipher_spec(),
            "hash_spec": self.hash_spec.to_ascii_lowercase(),
            "payload_offset": self.payload_offset,
            "payload_offset_bytes": self.payload_offset_bytes(),
            "mk_bits": u64::from(self.key_bytes) * 8,
            "mk_digest": hex(&self.mk_digest),
            "mk_salt": hex(&self.mk_digest_salt),
            "mk_iterations": self.mk_digest_iterations,
            "uuid": self.uuid,
            "keyslots": keyslots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sectorcrypt_storage::MemStorage;

    /// Sectors between keyslots as cryptsetup lays them out: the material rounded up to 4096
    /// bytes.
    fn slot_stride(key_bytes: u32) -> u32 {
        (key_bytes * STRIPES).div_ceil(4096) * 8
    }

    /// A header laid out the way `cryptsetup luksFormat --type luks1` lays it out.
    fn header(cipher: &str, key_bytes: u32, hash: &str) -> Header {
        let (name, mode) = cipher.split_once('-').unwrap();
        let stride = slot_stride(key_bytes);
        let keyslots = std::array::from_fn(|i| Keyslot {
            active: i == 0,
            iterations: if i == 0 { 1000 } else { 0 },
            salt: if i == 0 {
                [0x5a; SALT_SIZE]
            } else {
                [0; SALT_SIZE]
            },
            key_material_offset: 8 + i as u32 * stride,
            stripes: STRIPES,
        });
        Header {
            cipher_name: name.into(),
            cipher_mode: mode.into(),
            hash_spec: hash.into(),
            payload_offset: (8 + 8 * stride).div_ceil(2048) * 2048,
            key_bytes,
            mk_digest: std::array::from_fn(|i| i as u8),
            mk_digest_salt: std::array::from_fn(|i| 0xa0 + i as u8),
            mk_digest_iterations: 1000,
            uuid: "145d62f3-30c9-4ed8-ba13-8fa9f0a5ed08".into(),
            keyslots,
        }
    }

    fn sample() -> Header {
        header("aes-xts-plain64", 64, "sha256")
    }

    /// The length of a whole volume holding `h` (header, keyslots and one payload sector).
    fn volume_len(h: &Header) -> u64 {
        h.payload_offset_bytes() + 512
    }

    /// Parse `sample()` after `damage` changed its bytes.
    fn parse_damaged(damage: impl FnOnce(&mut [u8; HEADER_SIZE])) -> Result<Header, Error> {
        let h = sample();
        let mut bytes = h.to_bytes();
        damage(&mut bytes);
        Header::parse(&bytes, volume_len(&h))
    }

    /// Assert `r` is `Error::Corrupt` with a reason containing `needle`.
    fn assert_corrupt(r: Result<Header, Error>, needle: &str) {
        match r {
            Err(Error::Corrupt(why)) => {
                assert!(why.contains(needle), "reason {why:?} lacks {needle:?}")
            }
            other => panic!("expected Corrupt({needle:?}), got {other:?}"),
        }
    }

    fn assert_not_luks(r: Result<Header, Error>) {
        assert!(
            matches!(r, Err(Error::NotLuks { .. })),
            "expected NotLuks, got {r:?}"
        );
    }

    fn slot_at(i: usize) -> usize {
        OFF_KEYSLOTS + i * KEYSLOT_SIZE
    }

    /// Every field at the offset the LUKS1 specification gives, written here by hand rather than
    /// through `to_bytes`, so a layout mistake cannot cancel out between parse and to_bytes.
    #[test]
    fn fields_sit_where_the_specification_puts_them() {
        let mut b = [0u8; HEADER_SIZE];
        b[0..6].copy_from_slice(b"LUKS\xba\xbe");
        b[6..8].copy_from_slice(&[0, 1]);
        b[8..11].copy_from_slice(b"aes");
        b[40..51].copy_from_slice(b"xts-plain64");
        b[72..76].copy_from_slice(b"sha1");
        b[104..108].copy_from_slice(&[0, 0, 0x10, 0]); // payload offset 4096
        b[108..112].copy_from_slice(&[0, 0, 0, 32]); // 256-bit key
        b[112..132].fill(0x11);
        b[132..164].fill(0x22);
        b[164..168].copy_from_slice(&[0, 1, 0, 0]); // 65536 iterations
        b[168..172].copy_from_slice(b"uuid");
        for i in 0..8 {
            let at = 208 + 48 * i;
            let marker: [u8; 4] = if i == 1 {
                [0x00, 0xac, 0x71, 0xf3]
            } else {
                [0, 0, 0xde, 0xad]
            };
            b[at..at + 4].copy_from_slice(&marker);
            b[at + 4..at + 8].copy_from_slice(&[0, 0, 0, 7 + i as u8]);
            b[at + 8..at + 40].fill(0x30 + i as u8);
            // Offsets 8, 264, 520, ...: 250 sectors of material each.
            b[at + 40..at + 44].copy_from_slice(&(8 + 256 * i as u32).to_be_bytes());
            b[at + 44..at + 48].copy_from_slice(&[0, 0, 0x0f, 0xa0]);
        }
        let h = Header::parse(&b, 4096 * 512).unwrap();
        assert_eq!(h.cipher_spec(), "aes-xts-plain64");
        assert_eq!(h.hash().unwrap(), Hash::Sha1);
        assert_eq!(h.payload_offset, 4096);
        assert_eq!(h.payload_offset_bytes(), 4096 * 512);
        assert_eq!(h.key_bytes, 32);
        assert_eq!(h.mk_digest, [0x11; 20]);
        assert_eq!(h.mk_digest_salt, [0x22; 32]);
        assert_eq!(h.mk_digest_iterations, 65536);
        assert_eq!(h.uuid(), "uuid");
        for (i, k) in h.keyslots.iter().enumerate() {
            assert_eq!(k.active, i == 1);
            assert_eq!(k.iterations, 7 + i as u32);
            assert_eq!(k.salt, [0x30 + i as u8; 32]);
            assert_eq!(k.key_material_offset, 8 + 256 * i as u32);
            assert_eq!(k.stripes, 4000);
        }
        assert_eq!(h.to_bytes(), b);
        // Anything after the header (the rest of the first sector) is not part of it.
        let mut longer = b.to_vec();
        longer.extend_from_slice(&[0xff; 100]);
        assert_eq!(Header::parse(&longer, 4096 * 512).unwrap(), h);
    }

    #[test]
    fn parse_and_to_bytes_round_trip() {
        for (cipher, key_bytes, hash) in [
            ("aes-xts-plain64", 64, "sha256"),
            ("aes-xts-plain64", 32, "sha1"),
            ("aes-cbc-essiv:sha256", 32, "sha512"),
            ("aes-cbc-plain", 16, "sha256"),
            ("serpent-xts-plain64", 64, "sha256"),
        ] {
            let mut h = header(cipher, key_bytes, hash);
            h.keyslots[6].active = true;
            h.keyslots[6].iterations = 123_456;
            h.keyslots[6].salt = [0xee; 32];
            let bytes = h.to_bytes();
            let back = Header::parse(&bytes, volume_len(&h)).unwrap();
            assert_eq!(back, h, "{cipher}");
            assert_eq!(back.to_bytes(), bytes, "{cipher}");
        }
    }

    /// A detached header (payload offset 0) and a header backup (a file that ends after the last
    /// keyslot, before the payload offset) are valid, as in cryptsetup.
    #[test]
    fn detached_headers_and_header_backups_are_valid() {
        let h = sample();
        let last_end = (u64::from(h.keyslots[7].key_material_offset) + 500) * 512;
        assert!(last_end < h.payload_offset_bytes());
        Header::parse(&h.to_bytes(), last_end).unwrap();
        let mut detached = sample();
        detached.payload_offset = 0;
        Header::parse(&detached.to_bytes(), last_end).unwrap();
        // Right at the payload offset is allowed: qemu puts the payload where slot 7 ends.
        let mut tight = sample();
        tight.payload_offset = tight.keyslots[7].key_material_offset + 500;
        Header::parse(&tight.to_bytes(), last_end).unwrap();
    }

    #[test]
    fn wrong_magic_version_or_length_is_not_luks() {
        assert_not_luks(parse_damaged(|b| b[0] = b'l'));
        assert_not_luks(parse_damaged(|b| b[5] = 0xbf));
        assert_not_luks(parse_damaged(|b| b[7] = 2));
        assert_not_luks(parse_damaged(|b| b[7] = 0));
        assert_not_luks(parse_damaged(|b| b[6] = 1));
        let bytes = sample().to_bytes();
        assert_not_luks(Header::parse(&bytes[..HEADER_SIZE - 1], 1 << 30));
        assert_not_luks(Header::parse(&[], 1 << 30));
    }

    #[test]
    fn a_device_shorter_than_a_header_is_not_luks() {
        let bytes = sample().to_bytes();
        let dev = MemStorage::new(bytes[..HEADER_SIZE - 1].to_vec());
        match Header::read(&dev) {
            Err(Error::NotLuks { device }) => assert_eq!(device, "memory"),
            other => panic!("expected NotLuks, got {other:?}"),
        }
        let dev = MemStorage::new(Vec::new());
        assert!(matches!(Header::read(&dev), Err(Error::NotLuks { .. })));
    }

    /// A volume cut short after its header lost keyslot material: damaged, not "not LUKS".
    #[test]
    fn a_truncated_volume_is_corrupt() {
        let h = sample();
        let mut image = h.to_bytes().to_vec();
        image.resize(1 << 20, 0);
        assert_corrupt(
            Header::read(&MemStorage::new(image)),
            "keyslot 4's key material ends at byte 1292288, past the end of the device (1048576 bytes)",
        );
        let mut whole = h.to_bytes().to_vec();
        whole.resize(volume_len(&h) as usize, 0);
        assert_eq!(Header::read(&MemStorage::new(whole)).unwrap(), h);
    }

    #[test]
    fn keyslot_areas_must_not_overlap_the_header() {
        for offset in [0u32, 1] {
            assert_corrupt(
                parse_damaged(|b| {
                    b[slot_at(0) + 40..slot_at(0) + 44].copy_from_slice(&offset.to_be_bytes())
                }),
                "keyslot 0's key material at sector",
            );
        }
        // Sector 2 (byte 1024) is past the 592-byte header: cryptsetup 1.0 put slots there.
        let mut h = sample();
        h.keyslots[0].key_material_offset = 2;
        Header::parse(&h.to_bytes(), volume_len(&h)).unwrap();
    }

    #[test]
    fn keyslot_areas_must_not_overlap_each_other() {
        let mut h = sample();
        h.keyslots[5].key_material_offset = h.keyslots[4].key_material_offset + 499;
        assert_corrupt(
            Header::parse(&h.to_bytes(), volume_len(&h)),
            "keyslots 4 (sectors 2024 to 2524) and 5",
        );
        // Out of order but disjoint is fine (cryptsetup sorts by offset).
        let mut h = sample();
        let (a, b) = (
            h.keyslots[1].key_material_offset,
            h.keyslots[6].key_material_offset,
        );
        h.keyslots[1].key_material_offset = b;
        h.keyslots[6].key_material_offset = a;
        Header::parse(&h.to_bytes(), volume_len(&h)).unwrap();
        // Two slots sharing one area.
        let mut h = sample();
        h.keyslots[7].key_material_offset = h.keyslots[2].key_material_offset;
        assert_corrupt(Header::parse(&h.to_bytes(), volume_len(&h)), "overlaps");
    }

    #[test]
    fn keyslot_areas_must_end_before_the_payload() {
        let mut h = sample();
        h.payload_offset = h.keyslots[7].key_material_offset + 499;
        assert_corrupt(
            Header::parse(&h.to_bytes(), 1 << 30),
            "keyslot 7's key material (sectors 3536 to 4036) runs past the payload offset",
        );
        let mut h = sample();
        h.payload_offset = 8;
        assert_corrupt(
            Header::parse(&h.to_bytes(), 1 << 30),
            "keyslot 0's key material (sectors 8 to 508) runs past the payload offset",
        );
    }

    #[test]
    fn keyslot_areas_must_lie_inside_the_device() {
        let h = sample();
        let end = (u64::from(h.keyslots[7].key_material_offset) + 500) * 512;
        Header::parse(&h.to_bytes(), end).unwrap();
        assert_corrupt(
            Header::parse(&h.to_bytes(), end - 1),
            "keyslot 7's key material ends at byte 2066432, past the end of the device (2066431 bytes)",
        );
        // An offset near u32::MAX must not overflow.
        let mut h = sample();
        h.payload_offset = 0;
        h.keyslots[7].key_material_offset = u32::MAX;
        assert_corrupt(
            Header::parse(&h.to_bytes(), 1 << 40),
            "past the end of the device",
        );
    }

    #[test]
    fn hashes_are_checked() {
        let with_hash = |name: &str| {
            let mut h = sample();
            h.hash_spec = name.into();
            Header::parse(&h.to_bytes(), volume_len(&h))
        };
        assert_corrupt(with_hash("sha257"), "the hash 'sha257' is not a LUKS1 hash");
        assert_corrupt(with_hash("md5"), "is not a LUKS1 hash");
        assert_eq!(
            with_hash("whirlpool").unwrap().hash().unwrap(),
            Hash::Whirlpool
        );
        assert_eq!(
            with_hash("ripemd160").unwrap().hash().unwrap(),
            Hash::Ripemd160
        );
        // cryptsetup lower-cases the name when it reads a header; so do the dumps.
        let h = with_hash("SHA512").unwrap();
        assert_eq!(h.hash().unwrap(), Hash::Sha512);
        assert!(h.dump_text().contains("Hash spec:     \tsha512\n"));
        assert_eq!(h.to_bytes()[OFF_HASH_SPEC..OFF_HASH_SPEC + 7], *b"SHA512\0");
        assert_corrupt(with_hash(""), "the hash spec is empty");
    }

    #[test]
    fn key_sizes_must_fit_the_cipher() {
        let with_key = |cipher: &str, key_bytes: u32| {
            let mut h = header(cipher, 64, "sha256");
            h.key_bytes = key_bytes;
            Header::parse(&h.to_bytes(), volume_len(&h))
        };
        assert_corrupt(with_key("aes-xts-plain64", 16), "does not fit the cipher");
        assert_corrupt(with_key("aes-xts-plain64", 63), "does not fit the cipher");
        assert_corrupt(
            with_key("aes-cbc-essiv:sha256", 64),
            "does not fit the cipher",
        );
        assert_corrupt(
            with_key("aes-xts-plain64", 0),
            "the volume key size is 0 bytes",
        );
        assert_corrupt(
            with_key("serpent-xts-plain64", 0),
            "the volume key size is 0 bytes",
        );
        assert_corrupt(
            with_key("serpent-xts-plain64", 1 << 20),
            "does not fit the cipher",
        );
        assert_corrupt(
            with_key("blowfish-cbc-plain", 1 << 20),
            "larger than any cipher",
        );
        with_key("aes-xts-plain64", 48).unwrap();
        with_key("aes-cbc-essiv:sha256", 16).unwrap();
    }

    #[test]
    fn unknown_keyslot_markers_are_corrupt() {
        for marker in [0u32, 1, 0x00AC_71F2, 0xDEAD_0000, u32::MAX] {
            assert_corrupt(
                parse_damaged(|b| {
                    b[slot_at(4)..slot_at(4) + 4].copy_from_slice(&marker.to_be_bytes())
                }),
                &format!("keyslot 4 has the unknown state marker {marker:#010x}"),
            );
        }
    }

    #[test]
    fn zero_iterations_are_corrupt() {
        assert_corrupt(
            parse_damaged(|b| b[slot_at(0) + 4..slot_at(0) + 8].fill(0)),
            "keyslot 0 is enabled with an iteration count of 0",
        );
        assert_corrupt(
            parse_damaged(|b| b[OFF_MK_ITERATIONS..OFF_MK_ITERATIONS + 4].fill(0)),
            "the volume key digest has an iteration count of 0",
        );
        // Disabled slots are kept with 0 iterations by cryptsetup: valid.
        assert_eq!(sample().keyslots[3].iterations, 0);
        Header::parse(&sample().to_bytes(), volume_len(&sample())).unwrap();
    }

    #[test]
    fn stripes_other_than_4000_are_corrupt() {
        for stripes in [0u32, 1, 3999, 4001, u32::MAX] {
            // Disabled slots too: cryptsetup checks all eight.
            assert_corrupt(
                parse_damaged(|b| {
                    b[slot_at(2) + 44..slot_at(2) + 48].copy_from_slice(&stripes.to_be_bytes())
                }),
                &format!("keyslot 2 has {stripes} AF stripes instead of 4000"),
            );
        }
    }

    #[test]
    fn text_fields_must_be_terminated_ascii_and_zero_padded() {
        let name = OFF_CIPHER_NAME..OFF_CIPHER_NAME + STRING_LEN;
        assert_corrupt(
            parse_damaged(|b| b[name.clone()].fill(b'a')),
            "the cipher name field is not NUL-terminated",
        );
        assert_corrupt(
            parse_damaged(|b| b[OFF_UUID..OFF_UUID + UUID_LEN].fill(b'0')),
            "the UUID field is not NUL-terminated",
        );
        assert_corrupt(
            parse_damaged(|b| b[OFF_CIPHER_MODE + 1] = 0xff),
            "the cipher mode field holds bytes that are not printable ASCII",
        );
        assert_corrupt(
            parse_damaged(|b| b[OFF_CIPHER_MODE + 1] = b' '),
            "not printable ASCII",
        );
        assert_corrupt(
            parse_damaged(|b| b[OFF_HASH_SPEC + 20] = b'x'),
            "the hash spec field has non-zero bytes after its terminating NUL",
        );
        assert_corrupt(
            parse_damaged(|b| b[name].fill(0)),
            "the cipher name is empty",
        );
    }

    /// A cipher sectorcrypt does not implement: the header is valid (and dumps), opening it is
    /// unsupported.
    #[test]
    fn an_unimplemented_cipher_parses_but_does_not_open() {
        let h = header("blowfish-cbc-essiv:sha256", 32, "sha256");
        let back = Header::parse(&h.to_bytes(), volume_len(&h)).unwrap();
        assert!(back.dump_text().contains("Cipher name:   \tblowfish\n"));
        let dev = MemStorage::new(vec![0; volume_len(&h) as usize]);
        assert!(matches!(
            back.unlock(&dev, b"x", None),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(back.keyslot_area(0), Err(Error::Unsupported(_))));
    }

    /// A whole volume in memory: volume key, digest and keyslots written with the crate's own
    /// keyslot code, then opened through `unlock`.
    fn make_volume(
        cipher: &str,
        key_bytes: u32,
        hash: &str,
        slots: &[(usize, &[u8])],
    ) -> (Header, MemStorage, Vec<u8>) {
        let mut h = header(cipher, key_bytes, hash);
        let vk: Vec<u8> = (0..key_bytes)
            .map(|i| (i as u8).wrapping_mul(37) ^ 0x5c)
            .collect();
        let hash_fn = h.hash().unwrap();
        let digest = Kdf::Pbkdf2 {
            hash: hash_fn,
            iterations: h.mk_digest_iterations,
        }
        .derive(&vk, &h.mk_digest_salt, DIGEST_SIZE)
        .unwrap();
        h.mk_digest.copy_from_slice(&digest);
        let dev = MemStorage::new(vec![0; volume_len(&h) as usize]);
        for (s, k) in h.keyslots.iter_mut().enumerate() {
            k.active = false;
            k.iterations = 0;
            k.salt = [0; SALT_SIZE];
            if slots.iter().any(|&(i, _)| i == s) {
                k.active = true;
                k.iterations = 1000 + s as u32;
                k.salt = [s as u8 + 1; SALT_SIZE];
            }
        }
        for &(s, pass) in slots {
            let area = h.keyslot_area(s).unwrap();
            let kdf = Kdf::Pbkdf2 {
                hash: hash_fn,
                iterations: h.keyslots[s].iterations,
            };
            let sealed = area.seal(&kdf, &h.keyslots[s].salt, pass, &vk).unwrap();
            dev.write_at(&sealed, area.offset).unwrap();
        }
        dev.write_at(&h.to_bytes(), 0).unwrap();
        (h, dev, vk)
    }

    #[test]
    fn unlock_opens_only_the_slot_the_passphrase_belongs_to() {
        for (cipher, key_bytes, hash) in [
            ("aes-xts-plain64", 64, "sha256"),
            ("aes-cbc-essiv:sha256", 32, "sha1"),
            ("aes-xts-plain64", 32, "sha512"),
        ] {
            let (_, dev, vk) = make_volume(cipher, key_bytes, hash, &[(0, b"zero"), (5, b"five")]);
            let h = Header::read(&dev).unwrap();
            let u = h.unlock(&dev, b"five", None).unwrap();
            assert_eq!((u.slot, &u.volume_key[..]), (5, &vk[..]), "{cipher}");
            let u = h.unlock(&dev, b"zero", Some(0)).unwrap();
            assert_eq!((u.slot, &u.volume_key[..]), (0, &vk[..]), "{cipher}");
            // An inactive slot named is "no usable keyslot" (cryptsetup's exit 1), not a wrong
            // passphrase.
            assert!(
                matches!(
                    h.unlock(&dev, b"zero", Some(2)),
                    Err(Error::NoUsableKeyslot(_))
                ),
                "{cipher}"
            );
            for (pass, slot) in [
                (&b"five"[..], Some(0)),
                (b"zero", Some(5)),
                (b"fivE", None),
                (b"", None),
            ] {
                assert!(
                    matches!(h.unlock(&dev, pass, slot), Err(Error::WrongPassphrase)),
                    "{cipher}: {pass:?} in {slot:?}"
                );
            }
            assert!(matches!(
                h.unlock(&dev, b"five", Some(8)),
                Err(Error::Unsupported(_))
            ));
        }
    }

    /// One flipped bit in the key material makes the AF merge yield a different key, which the
    /// digest then refuses.
    #[test]
    fn damaged_key_material_does_not_open() {
        let (h, dev, _) = make_volume("aes-xts-plain64", 64, "sha256", &[(1, b"pass")]);
        let at = h.keyslots[1].key_material_offset as u64 * 512 + 10_000;
        let mut b = [0u8; 1];
        dev.read_at(&mut b, at).unwrap();
        dev.write_at(&[b[0] ^ 0x10], at).unwrap();
        assert!(matches!(
            h.unlock(&dev, b"pass", None),
            Err(Error::WrongPassphrase)
        ));
    }

    /// The exact luksDump layout (the integration tests compare it with cryptsetup itself).
    #[test]
    fn dump_text_has_the_luks_dump_layout() {
        let mut h = sample();
        h.keyslots[2].active = true;
        h.keyslots[2].iterations = 77;
        h.keyslots[2].salt = std::array::from_fn(|i| i as u8);
        let expected = "Version:       \t1\n\
Cipher name:   \taes\n\
Cipher mode:   \txts-plain64\n\
Hash spec:     \tsha256\n\
Payload offset:\t4096\n\
MK bits:       \t512\n\
MK digest:     \t00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f 10 11 12 13 \n\
MK salt:       \ta0 a1 a2 a3 a4 a5 a6 a7 a8 a9 aa ab ac ad ae af \n               \tb0 b1 b2 b3 b4 b5 b6 b7 b8 b9 ba bb bc bd be bf \n\
MK iterations: \t1000\n\
UUID:          \t145d62f3-30c9-4ed8-ba13-8fa9f0a5ed08\n\
\n\
Key Slot 0: ENABLED\n\
\tIterations:         \t1000\n\
\tSalt:               \t5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a \n\
\t                      \t5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a \n\
\tKey material offset:\t8\n\
\tAF stripes:            \t4000\n\
Key Slot 1: DISABLED\n\
Key Slot 2: ENABLED\n\
\tIterations:         \t77\n\
\tSalt:               \t00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f \n\
\t                      \t10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f \n\
\tKey material offset:\t1016\n\
\tAF stripes:            \t4000\n\
Key Slot 3: DISABLED\n\
Key Slot 4: DISABLED\n\
Key Slot 5: DISABLED\n\
Key Slot 6: DISABLED\n\
Key Slot 7: DISABLED\n";
        assert_eq!(h.dump_text(), expected);
    }

    #[test]
    fn dump_json_holds_every_field() {
        let j = sample().dump_json();
        assert_eq!(j["version"], 1);
        assert_eq!(j["cipher"], "aes-xts-plain64");
        assert_eq!(j["cipher_name"], "aes");
        assert_eq!(j["cipher_mode"], "xts-plain64");
        assert_eq!(j["hash_spec"], "sha256");
        assert_eq!(j["payload_offset"], 4096);
        assert_eq!(j["payload_offset_bytes"], 4096 * 512);
        assert_eq!(j["mk_bits"], 512);
        assert_eq!(j["mk_digest"], "000102030405060708090a0b0c0d0e0f10111213");
        assert_eq!(j["mk_salt"].as_str().unwrap().len(), 64);
        assert!(j["mk_salt"].as_str().unwrap().starts_with("a0a1a2"));
        assert_eq!(j["mk_iterations"], 1000);
        assert_eq!(j["uuid"], "145d62f3-30c9-4ed8-ba13-8fa9f0a5ed08");
        let slots = j["keyslots"].as_array().unwrap();
        assert_eq!(slots.len(), 8);
        assert_eq!(slots[0]["enabled"], true);
        assert_eq!(slots[0]["salt"], "5a".repeat(32));
        assert_eq!(slots[0]["iterations"], 1000);
        assert_eq!(slots[0]["stripes"], 4000);
        assert_eq!(slots[7]["slot"], 7);
        assert_eq!(slots[7]["enabled"], false);
        assert_eq!(slots[7]["key_material_offset"], 3536);
    }
}
