//! LUKS2 and LUKS1 on-disk formats, byte compatible with cryptsetup: reading either header
//! version, opening keyslots with a passphrase and checking the volume key against the header's
//! digest.
//!
//! Modules follow cryptsetup's `lib/luks2/` split: [`luks2`] (binary header with its two copies,
//! JSON metadata), [`luks1`], [`keyslot`] (area encryption shared by both), [`af`] (the
//! anti-forensic splitter), [`kdf`] (PBKDF2, Argon2) and [`hash`].

pub mod af;
pub mod convert;
pub mod error;
pub mod hash;
pub mod kdf;
pub mod keyslot;
pub mod luks1;
pub mod luks2;
pub mod signatures;
pub mod uuid;

pub use error::Error;

use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;

/// A keyslot opened with a passphrase: which slot, and the volume key it holds (already checked
/// against the header's digest).
pub struct Unlocked {
    /// The keyslot number.
    pub slot: usize,
    /// The volume (master) key, zeroized on drop.
    pub volume_key: SecretBytes,
}

/// A LUKS header of either version.
pub enum Header {
    /// LUKS1.
    Luks1(Box<luks1::Header>),
    /// LUKS2.
    Luks2(Box<luks2::Header>),
}

impl Header {
    /// Read the header of `dev`, whichever version it is. A damaged primary LUKS2 header is
    /// read from its secondary copy.
    pub fn read(dev: &dyn Storage) -> Result<Self, Error> {
        let mut start = [0u8; 8];
        let len = dev.len().map_err(|source| Error::Io {
            device: dev.name(),
            source,
        })?;
        if len >= start.len() as u64 {
            dev.read_at(&mut start, 0).map_err(|source| Error::Io {
                device: dev.name(),
                source,
            })?;
        }
        // Only a primary LUKS1 header says version 1; everything else (a LUKS2 primary, or a
        // wiped primary whose secondary survives) is for the LUKS2 reader to judge.
        // A conversion between the versions in progress is neither until it finishes.
        if start[..6] == convert::CONVERTING_MAGIC {
            if let Some(to) = convert::interrupted(dev)? {
                return Err(Error::ConversionInterrupted { to: to.version() });
            }
        }
        if start[..6] == luks1::MAGIC && start[6..8] == [0, 1] {
            return luks1::Header::read(dev).map(|h| Header::Luks1(Box::new(h)));
        }
        luks2::Header::read(dev).map(|h| Header::Luks2(Box::new(h)))
    }

    /// Whether `dev` holds a LUKS header that reads, or one in the middle of a conversion between
    /// the versions (which must not be taken for plaintext either).
    pub fn is_present(dev: &dyn Storage) -> bool {
        matches!(
            Header::read(dev),
            Ok(_) | Err(Error::ConversionInterrupted { .. })
        )
    }

    /// 1 or 2.
    pub fn version(&self) -> u8 {
        match self {
            Header::Luks1(_) => 1,
            Header::Luks2(_) => 2,
        }
    }

    /// The volume UUID.
    pub fn uuid(&self) -> &str {
        match self {
            Header::Luks1(h) => h.uuid(),
            Header::Luks2(h) => h.uuid(),
        }
    }

    /// Open a keyslot (`slot`, or any) with `passphrase`.
    pub fn unlock(
        &self,
        dev: &dyn Storage,
        passphrase: &[u8],
        slot: Option<usize>,
    ) -> Result<Unlocked, Error> {
        match self {
            Header::Luks1(h) => h.unlock(dev, passphrase, slot),
            Header::Luks2(h) => h.unlock(dev, passphrase, slot),
        }
    }

    /// Open a keyslot as `cryptsetup open` checks a volume before activating it (and as
    /// `open --test-passphrase` answers): LUKS2 verifies an in-place conversion's metadata with
    /// its volume keys, and accepts keyslots bound to no segment when `unbound` (LUKS1 has none:
    /// it is [`Header::unlock`] there). See `luks2::reencrypt::unlock_checked`.
    pub fn unlock_checked(
        &self,
        dev: &dyn Storage,
        passphrase: &[u8],
        slot: Option<usize>,
        unbound: bool,
    ) -> Result<Unlocked, Error> {
        match self {
            Header::Luks1(h) => h.unlock(dev, passphrase, slot),
            Header::Luks2(h) => h.unlock_checked(dev, passphrase, slot, unbound),
        }
    }

    /// The header as `cryptsetup luksDump DEVICE` prints it, headline included (LUKS1 names the
    /// device there, LUKS2 does not).
    pub fn dump_text(&self, device: &str) -> String {
        match self {
            Header::Luks1(h) => {
                format!("LUKS header information for {device}\n\n{}", h.dump_text())
            }
            Header::Luks2(h) => h.dump_text(),
        }
    }

    /// The header as JSON (LUKS2: the metadata plus the binary-header fields).
    pub fn dump_json(&self) -> serde_json::Value {
        match self {
            Header::Luks1(h) => h.dump_json(),
            Header::Luks2(h) => h.dump_json(),
        }
    }
}

/// The KDF of new keyslots as the command line states it (cryptsetup's `--pbkdf`, `--hash`,
/// `--iter-time`, `--pbkdf-memory`, `--pbkdf-parallel`, `--pbkdf-force-iterations`); `None`
/// means cryptsetup's default for the header version.
#[derive(Clone, Debug, Default)]
pub struct PbkdfOptions {
    /// The PBKDF (LUKS2 default argon2id; LUKS1 is always pbkdf2).
    pub kind: Option<PbkdfChoice>,
    /// PBKDF2, AF and digest hash (default sha256).
    pub hash: Option<hash::Hash>,
    /// Calibration target in milliseconds.
    pub iter_time_ms: u32,
    /// Argon2 memory ceiling in KiB.
    pub memory_kib: Option<u32>,
    /// Argon2 threads.
    pub parallel: Option<u32>,
    /// A fixed cost instead of calibration.
    pub force_iterations: Option<u32>,
}

/// A PBKDF by cryptsetup's name for it (`--pbkdf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PbkdfChoice {
    /// `pbkdf2` (the only one LUKS1 has).
    Pbkdf2,
    /// `argon2i`.
    Argon2i,
    /// `argon2id` (the LUKS2 default).
    Argon2id,
}

impl PbkdfChoice {
    /// cryptsetup's name.
    pub fn name(self) -> &'static str {
        match self {
            PbkdfChoice::Pbkdf2 => "pbkdf2",
            PbkdfChoice::Argon2i => "argon2i",
            PbkdfChoice::Argon2id => "argon2id",
        }
    }
}

impl std::str::FromStr for PbkdfChoice {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "pbkdf2" => Ok(PbkdfChoice::Pbkdf2),
            "argon2i" => Ok(PbkdfChoice::Argon2i),
            "argon2id" => Ok(PbkdfChoice::Argon2id),
            _ => Err(format!(
                "unknown PBKDF '{name}' (use argon2id, argon2i or pbkdf2)"
            )),
        }
    }
}

impl PbkdfOptions {
    /// These options as LUKS2 keyslot parameters.
    pub fn luks2(&self) -> Result<luks2::Pbkdf, Error> {
        use kdf::Argon2Variant;
        use luks2::PbkdfKind;
        let kind = match self.kind.unwrap_or(PbkdfChoice::Argon2id) {
            PbkdfChoice::Argon2id => PbkdfKind::Argon2 {
                variant: Argon2Variant::Argon2id,
            },
            PbkdfChoice::Argon2i => PbkdfKind::Argon2 {
                variant: Argon2Variant::Argon2i,
            },
            PbkdfChoice::Pbkdf2 => PbkdfKind::Pbkdf2 {
                hash: self.hash.unwrap_or(hash::Hash::Sha256),
            },
        };
        Ok(luks2::Pbkdf {
            kind,
            forced_iterations: self.force_iterations,
            memory_kib: self
                .memory_kib
                .unwrap_or(kdf::ARGON2_DEFAULT_MAX_MEMORY_KIB),
            parallel: self.parallel.unwrap_or(0),
            iter_time_ms: self.iter_time_ms,
        })
    }

    fn check_luks1(&self) -> Result<(), Error> {
        match self.kind {
            None | Some(PbkdfChoice::Pbkdf2) => {}
            Some(other) => {
                return Err(Error::Unsupported(format!(
                    "the PBKDF '{}' in LUKS1, which has only pbkdf2",
                    other.name()
                )))
            }
        }
        if self.memory_kib.is_some() || self.parallel.is_some() {
            return Err(Error::Unsupported(
                "--pbkdf-memory and --pbkdf-parallel in LUKS1 (PBKDF2 only)".into(),
            ));
        }
        if let Some(n) = self.force_iterations {
            if n < kdf::PBKDF2_MIN_ITERATIONS {
                return Err(Error::Unsupported(format!(
                    "{n} PBKDF2 iterations (the minimum is {})",
                    kdf::PBKDF2_MIN_ITERATIONS
                )));
            }
        }
        Ok(())
    }
}

/// What `format` is told, for either version.
#[derive(Clone, Debug, Default)]
pub struct FormatOptions {
    /// 1 or 2.
    pub version: u8,
    /// Cipher specification (default aes-xts-plain64).
    pub cipher: Option<String>,
    /// Whole key size in bits (default: the spec's, 512 for XTS).
    pub key_bits: Option<usize>,
    /// LUKS2 encryption sector size.
    pub sector_size: Option<usize>,
    /// New keyslot KDF.
    pub pbkdf: PbkdfOptions,
    /// LUKS2 label.
    pub label: Option<String>,
    /// LUKS2 subsystem.
    pub subsystem: Option<String>,
    /// UUID instead of a random one.
    pub uuid: Option<String>,
    /// Keyslot of the first passphrase.
    pub keyslot: Option<usize>,
    /// Volume key instead of a random one.
    pub volume_key: Option<SecretBytes>,
    /// LUKS2 metadata (one header copy) size.
    pub metadata_size: Option<u64>,
    /// LUKS2 keyslots area size.
    pub keyslots_size: Option<u64>,
    /// The header goes to its own device; data starts at offset 0 of the data device.
    pub detached_header: bool,
    /// Where the data starts (`--offset`, bytes) instead of after the header.
    pub data_offset: Option<u64>,
    /// The data device's optimal I/O size (an RBD image's stripe period), as cryptsetup takes a
    /// block device's: without `data_offset`, data starts at a multiple of it (LUKS1's payload
    /// after the keyslots; LUKS2's default 16 MiB, rounded up).
    pub data_alignment: Option<u64>,
    /// LUKS2 authenticated encryption: the integrity type as the segment stores it
    /// (`hmac(sha256)`, `aead`, ...). `cipher` is then taken as given (the caller checks the
    /// pair) and `key_bits` must count the cipher's and the MAC's keys.
    pub integrity: Option<String>,
}

impl FormatOptions {
    fn spec(&self) -> Result<sectorcrypt_cipher::CipherSpec, Error> {
        Ok(sectorcrypt_cipher::CipherSpec::parse(
            self.cipher.as_deref().unwrap_or("aes-xts-plain64"),
        )?)
    }

    fn key_bits(&self) -> Result<usize, Error> {
        if self.integrity.is_some() {
            return self.key_bits.filter(|b| b % 8 == 0).ok_or_else(|| {
                Error::Unsupported("an integrity volume without its whole key size".into())
            });
        }
        let spec = self.spec()?;
        // cipher_null takes any key; cryptsetup's luksFormat still makes a 256-bit one.
        let default_bits = match spec.default_key_bits() {
            0 => 256,
            bits => bits,
        };
        let bits = self.key_bits.unwrap_or(default_bits);
        if !bits.is_multiple_of(8) {
            return Err(Error::Unsupported(format!(
                "a key of {bits} bits (not whole bytes)"
            )));
        }
        spec.check_key_len(bits / 8)?;
        Ok(bits)
    }

    /// Refuse, before any device is touched, whatever format would refuse for its parameters.
    pub fn check(&self) -> Result<(), Error> {
        let bits = self.key_bits()?;
        if let Some(vk) = &self.volume_key {
            if vk.len() * 8 != bits {
                return Err(Error::Unsupported(format!(
                    "a volume key file of {} bytes for a {bits}-bit key",
                    vk.len()
                )));
            }
        }
        match self.version {
            1 => {
                self.pbkdf.check_luks1()?;
                if self.keyslot.is_some_and(|s| s >= luks1::KEYSLOTS) {
                    return Err(Error::Unsupported(format!(
                        "keyslot {} (LUKS1 has keyslots 0 to 7)",
                        self.keyslot.unwrap_or(0)
                    )));
                }
                let luks2_only = [
                    (self.sector_size.is_some_and(|s| s != 512), "--sector-size"),
                    (self.label.is_some(), "--label"),
                    (self.subsystem.is_some(), "--subsystem"),
                    (self.metadata_size.is_some(), "--luks2-metadata-size"),
                    (self.keyslots_size.is_some(), "--luks2-keyslots-size"),
                ];
                if let Some((_, what)) = luks2_only.iter().find(|(given, _)| *given) {
                    return Err(Error::Unsupported(format!("{what} with LUKS1")));
                }
            }
            2 => {
                self.pbkdf.luks2()?;
                if self.keyslot.is_some_and(|s| s >= 32) {
                    return Err(Error::Unsupported(format!(
                        "keyslot {} (LUKS2 has keyslots 0 to 31)",
                        self.keyslot.unwrap_or(0)
                    )));
                }
                if let Some(s) = self.sector_size {
                    if !sectorcrypt_cipher::sector::SECTOR_SIZES.contains(&s) {
                        return Err(sectorcrypt_cipher::Error::SectorSize(s).into());
                    }
                }
            }
            v => return Err(Error::Unsupported(format!("LUKS version {v}"))),
        }
        Ok(())
    }

    /// Bytes a new detached header file needs: LUKS2's two metadata copies and keyslots area
    /// (16 MiB by default), LUKS1's header and eight keyslot areas (2 MiB holds 512-bit keys).
    pub fn header_file_size(&self) -> u64 {
        match self.version {
            1 => 2 << 20,
            _ => {
                let meta = self.metadata_size.unwrap_or(16 << 10);
                self.keyslots_size.map_or(16 << 20, |k| 2 * meta + k)
            }
        }
    }
}

/// Format `dev` (the header device) as LUKS `options.version` with one keyslot for `passphrase`.
/// `data_len` is the data device's length (the same device unless the header is detached).
pub fn format(
    dev: &dyn Storage,
    data_len: u64,
    options: &FormatOptions,
    passphrase: &[u8],
) -> Result<(Header, Unlocked), Error> {
    options.check()?;
    let cipher = match &options.integrity {
        Some(_) if options.version != 2 => {
            return Err(Error::Unsupported("integrity with LUKS1".into()))
        }
        Some(_) => options
            .cipher
            .clone()
            .unwrap_or_else(|| "aes-xts-plain64".into()),
        None => options.spec()?.to_string(),
    };
    let key_bits = options.key_bits()?;
    let hash = options.pbkdf.hash.unwrap_or(hash::Hash::Sha256);
    match options.version {
        1 => {
            let params = luks1::FormatParams {
                cipher,
                key_bits,
                hash,
                iterations: options.pbkdf.force_iterations,
                iter_time_ms: options.pbkdf.iter_time_ms,
                uuid: options.uuid.clone(),
                keyslot: options.keyslot,
                volume_key: options.volume_key.clone(),
                detached_header: options.detached_header,
                payload_align: options
                    .data_alignment
                    .map_or(LUKS1_PAYLOAD_ALIGN, |a| a.max(LUKS1_PAYLOAD_ALIGN)),
            };
            luks1::format(dev, &params, passphrase).map(|(h, u)| (Header::Luks1(Box::new(h)), u))
        }
        _ => {
            let params = luks2::FormatParams {
                cipher,
                key_bits,
                sector_size: options.sector_size.map(|s| s as u32),
                pbkdf: options.pbkdf.luks2()?,
                hash,
                label: options.label.clone(),
                subsystem: options.subsystem.clone(),
                uuid: options.uuid.clone(),
                keyslot: options.keyslot,
                volume_key: options.volume_key.clone(),
                metadata_size: options.metadata_size,
                keyslots_size: options.keyslots_size,
                detached_header: options.detached_header,
                data_device_size: Some(data_len),
                data_offset: options
                    .data_offset
                    .or_else(|| luks2_aligned_offset(options)),
                integrity: options.integrity.clone(),
            };
            luks2::format(dev, &params, passphrase).map(|(h, u)| (Header::Luks2(Box::new(h)), u))
        }
    }
}

/// cryptsetup's LUKS1 payload alignment when the device states none.
const LUKS1_PAYLOAD_ALIGN: u64 = 1 << 20;

/// cryptsetup's LUKS2 data offset with the default metadata and keyslots areas.
const LUKS2_DEFAULT_DATA_OFFSET: u64 = 16 << 20;

/// LUKS2's default data offset rounded up to the device's alignment, where it is not already a
/// multiple and the areas have their default sizes; `None`: the writer's own default.
fn luks2_aligned_offset(options: &FormatOptions) -> Option<u64> {
    let a = options.data_alignment.filter(|&a| a > 0)?;
    let defaults = options.metadata_size.is_none() && options.keyslots_size.is_none();
    (defaults && !options.detached_header && !LUKS2_DEFAULT_DATA_OFFSET.is_multiple_of(a))
        .then(|| LUKS2_DEFAULT_DATA_OFFSET.div_ceil(a) * a)
}

impl Header {
    /// Keyslots in use.
    pub fn active_keyslots(&self) -> Vec<usize> {
        match self {
            Header::Luks1(h) => h
                .keyslots
                .iter()
                .enumerate()
                .filter(|(_, k)| k.active)
                .map(|(i, _)| i)
                .collect(),
            Header::Luks2(h) => h
                .metadata()
                .keyslots
                .iter()
                .map(|(n, _)| n as usize)
                .collect(),
        }
    }

    /// Add a keyslot for `passphrase` holding `volume_key` (in `slot`, or the first free one).
    pub fn add_keyslot(
        &mut self,
        dev: &dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        pbkdf: &PbkdfOptions,
    ) -> Result<usize, Error> {
        match self {
            Header::Luks1(h) => {
                pbkdf.check_luks1()?;
                h.add_keyslot(
                    dev,
                    volume_key,
                    passphrase,
                    slot,
                    pbkdf.force_iterations,
                    pbkdf.iter_time_ms,
                )
            }
            Header::Luks2(h) => h.add_keyslot(dev, volume_key, passphrase, slot, &pbkdf.luks2()?),
        }
    }

    /// Add a keyslot holding `key` bound to no segment (`cryptsetup luksAddKey --unbound`): LUKS2
    /// only. See [`luks2::Header::add_unbound_keyslot`].
    pub fn add_unbound_keyslot(
        &mut self,
        dev: &dyn Storage,
        key: &[u8],
        passphrase: &[u8],
        slot: Option<usize>,
        pbkdf: &PbkdfOptions,
    ) -> Result<usize, Error> {
        match self {
            Header::Luks1(_) => Err(Error::Unsupported(
                "unbound keyslots on LUKS1 (they are a LUKS2 feature)".into(),
            )),
            Header::Luks2(h) => h.add_unbound_keyslot(dev, key, passphrase, slot, &pbkdf.luks2()?),
        }
    }

    /// Remove keyslot `slot`.
    pub fn kill_keyslot(&mut self, dev: &dyn Storage, slot: usize) -> Result<(), Error> {
        match self {
            Header::Luks1(h) => h.kill_keyslot(dev, slot),
            Header::Luks2(h) => h.kill_keyslot(dev, slot),
        }
    }

    /// Remove every keyslot, one after the other as [`Header::kill_keyslot`] does (`cryptsetup
    /// luksErase`): the volume can no longer be opened with any passphrase. Returns how many
    /// keyslots were removed.
    pub fn erase(&mut self, dev: &dyn Storage) -> Result<usize, Error> {
        let slots: Vec<usize> = match self {
            Header::Luks1(_) => self.active_keyslots(),
            Header::Luks2(h) => h
                .metadata()
                .keyslots
                .iter()
                .map(|(n, _)| n as usize)
                .collect(),
        };
        for &slot in &slots {
            self.kill_keyslot(dev, slot)?;
        }
        Ok(slots.len())
    }

    /// Replace the passphrase of `old_slot`; returns the slot now holding the new one.
    pub fn change_keyslot(
        &mut self,
        dev: &dyn Storage,
        old_slot: usize,
        volume_key: &[u8],
        new_passphrase: &[u8],
        pbkdf: &PbkdfOptions,
    ) -> Result<usize, Error> {
        match self {
            Header::Luks1(h) => {
                pbkdf.check_luks1()?;
                h.change_keyslot(
                    dev,
                    old_slot,
                    volume_key,
                    new_passphrase,
                    pbkdf.force_iterations,
                    pbkdf.iter_time_ms,
                )
            }
            Header::Luks2(h) => {
                h.change_keyslot(dev, old_slot, volume_key, new_passphrase, &pbkdf.luks2()?)
            }
        }
    }

    /// The header and keyslot areas of `dev`, as cryptsetup luksHeaderBackup writes them.
    pub fn backup(dev: &dyn Storage) -> Result<Vec<u8>, Error> {
        match Header::read(dev)? {
            Header::Luks1(_) => luks1::Header::backup(dev),
            Header::Luks2(_) => luks2::Header::backup(dev),
        }
    }

    /// Write the header in `backup` to `dev`, checked in full first.
    pub fn restore(dev: &dyn Storage, backup: &dyn Storage) -> Result<Header, Error> {
        match Header::read(backup)? {
            Header::Luks1(_) => {
                luks1::Header::restore(dev, backup).map(|h| Header::Luks1(Box::new(h)))
            }
            Header::Luks2(_) => {
                luks2::Header::restore(dev, backup).map(|h| Header::Luks2(Box::new(h)))
            }
        }
    }
}
