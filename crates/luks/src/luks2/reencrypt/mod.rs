//! LUKS2 reencryption metadata as cryptsetup 2.6 stores it (`lib/luks2/luks2_reencrypt.c`,
//! `luks2_keyslot_reenc.c`, `luks2_reencrypt_digest.c`, `luks2_segment.c`): reading it from a
//! header, checking its digest, and building the metadata `cryptsetup reencrypt --init-only`
//! writes, for an in-place encrypt / decrypt / reencrypt engine to drive.
//!
//! # The format
//!
//! An in-place (re)encryption converts the data device chunk by chunk (the "hotzone") and must
//! survive a crash at any moment, so all its state lives in the LUKS2 JSON:
//!
//! - `config.requirements.mandatory` holds `online-reencrypt-v2` (or `-v3` for decryption with a
//!   moved first segment; the legacy `online-reencrypt` is v1). Older tools refuse the volume.
//! - One keyslot of type `reencrypt` (priority 0, `key_size` 1) records the `mode` (encrypt,
//!   decrypt, reencrypt), the `direction` (forward, backward) and an `area` in the keyslots area
//!   holding the resilience data: hashes of the hotzone's old blocks (`checksum`), a copy of the
//!   old hotzone (`journal`), nothing (`none`), or nothing because data moves by a fixed shift so
//!   that source and destination never overlap (`datashift`, `datashift-checksum`,
//!   `datashift-journal`).
//! - The regular segments `0..n` describe the current mixed layout (done / not done); a step in
//!   progress flags one of them `in-reencryption`. After them come backup segments, found by
//!   **flag, never by number** (cryptsetup renumbers them): `backup-previous` (the old layout),
//!   `backup-final` (the target layout), and, with a moved first segment, `backup-moved-segment`.
//!   A `linear` segment is plaintext; the volume key of a `crypt` segment is the one whose digest
//!   lists the segment.
//! - The state follows from the JSON alone ([`state`]): no requirement is [`State::None`], the
//!   requirement without an `in-reencryption` segment is [`State::Clean`] (safe to resume), with
//!   one it is [`State::Crash`] (the hotzone must be recovered first).
//!
//! # The reencryption digest
//!
//! Since cryptsetup 2.4.3 (CVE-2021-4122) the keyslot fields and backup segments are
//! authenticated: whoever can write the header but does not know the volume keys must not be
//! able to make cryptsetup "resume" an operation that would decrypt the data in place. A
//! `pbkdf2` digest, listing only the reencrypt keyslot, holds `PBKDF2(blob, salt)` where the blob
//! ([`reencrypt_digest_blob`]) is the version, the old and new volume keys, the keyslot fields
//! and the backup segments, serialised in binary. The regular segments (progress) are not
//! covered, so steps do not need the keys again. cryptsetup refuses to resume, recover or
//! activate when the digest is missing or wrong.
//!
//! # What this module does not do
//!
//! It moves no data and writes no resilience area: that is the engine's job, in cryptsetup's
//! order for each step (resilience data, the header with the "hot" segments, the data and a
//! sync, the header with the "post" segments; for the datashift modes the first chunk is moved
//! before the first header names it). [`write_metadata`] only hands a built [`Metadata`] to the
//! crate's header writer (validated, both copies, seqid + 1).
//!
//! # Where things are
//!
//! `model.rs`: the types, [`state`] and [`parse`]; `digest.rs`: the reencryption digest;
//! `keys.rs`: opening the keys; `init.rs`: what `--init-only` writes; `progress.rs`: the metadata
//! of each step and of the end; here: [`write_metadata`]. Everything is re-exported here, so
//! callers name `luks2::reencrypt::X` whatever file `X` lives in.

mod digest;
mod init;
mod keys;
mod model;
mod progress;

pub use self::digest::*;
pub use self::init::*;
pub use self::keys::*;
pub use self::model::*;
pub use self::progress::*;

use rand::RngCore;
use sectorcrypt_storage::Storage;
use serde_json::{Map, Value};

use super::limits::{DIGESTS_MAX, DIGEST_ITER_TIME_MS, KDF_SALT_LEN, KEYSLOTS_MAX};
pub use super::metadata::{Direction, Mode, ReencryptKeyslot, Resilience};

use super::metadata::{
    CryptSegment, Digest, Keyslot, LinearSegment, Metadata, Pbkdf2Digest, Requirements,
    SegmentEntry,
};
use super::unlock::{open_in_order, open_slot, SlotFailure};
use super::validate::{as_u32, str_to_u64};
use super::Header;
use crate::error::Error;
use crate::hash::Hash;
use crate::kdf::{self, Kdf};
use crate::keyslot::digest_matches;
use crate::Unlocked;

/// Write `metadata` as the next version of `header` on `dev` with the crate's header writer
/// (validated first, both copies, seqid + 1) and read the header back.
pub fn write_metadata(
    dev: &dyn Storage,
    header: &Header,
    metadata: &Metadata,
) -> Result<Header, Error> {
    super::write::write_metadata(dev, &header.next_fields(), metadata)?;
    Header::read(dev)
}

#[cfg(test)]
mod tests;
