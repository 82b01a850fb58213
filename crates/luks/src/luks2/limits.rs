//! LUKS2's limits and fixed parameters, in one place so that the reader, the writer, the dump and
//! the reencryption agree on them. The values and names follow cryptsetup 2.6 (`lib/luks2/`).

/// Keyslot numbers LUKS2 allows (`LUKS2_KEYSLOTS_MAX`).
pub const KEYSLOTS_MAX: usize = 32;

/// Digest numbers LUKS2 allows (`LUKS2_DIGEST_MAX`).
pub const DIGESTS_MAX: u32 = 8;

/// The largest keyslots area (`LUKS2_MAX_KEYSLOTS_SIZE`, 128 MiB).
pub const KEYSLOTS_SIZE_MAX: u64 = 128 << 20;

/// The header and keyslot areas of a default format (16 MiB), before the data.
pub const DEFAULT_HDR_AND_AREAS: u64 = 16 << 20;

/// Data offsets are aligned to this by default (1 MiB).
pub const DATA_ALIGNMENT: u64 = 1 << 20;

/// Bytes of a keyslot's KDF salt and of a digest's salt.
pub const KDF_SALT_LEN: usize = 32;

/// Milliseconds a calibrated PBKDF2 digest (volume-key or reencryption digest) takes
/// (`LUKS_MKD_ITERATIONS_MS`).
pub const DIGEST_ITER_TIME_MS: u32 = 125;

/// Anti-forensic stripes of every keyslot (`LUKS_STRIPES`).
pub const STRIPES: u32 = 4000;
