//! LUKS: both binary headers as a device holds them, the LUKS2 JSON metadata on its own, and
//! the LUKS1 header with its keyslots.

use sectorcrypt_luks::luks1;
use sectorcrypt_luks::luks2::binary::{
    BinaryHeader, HeaderCopy, BIN_LEN, CHECKSUM_ALG_LEN, CHECKSUM_LEN, HDR_SIZES, LABEL_LEN,
    SALT_LEN, UUID_LEN,
};
use sectorcrypt_luks::luks2::{self, reencrypt, validate};
use sectorcrypt_luks::Header;
use sectorcrypt_storage::MemStorage;
use sectorcrypt_volume::Layout;

use crate::padded::Padded;

/// A data device far longer than any header and keyslots area, for the data segment checks.
const DATA_DEVICE_LEN: u64 = 1 << 40;

/// The passphrase of the seed headers: a keyslot that opens with it reaches the volume key
/// checks.
const PASSPHRASE: &[u8] = b"fuzz";

/// PBKDF2 iterations up to which a LUKS1 keyslot is tried with [`PASSPHRASE`] (more would make
/// an execution slow, not find more: the KDF's cost is the header's to choose).
const MAX_ITERATIONS: u32 = 1000;

/// Any bytes as a device: read the header whichever version it is (both binary headers, the
/// LUKS2 JSON and its validation, the secondary-copy search and the foreign-signature probe),
/// and render what reads as `luksDump` would, and as a volume's layout.
pub fn luks_header(data: &[u8]) {
    let dev = MemStorage::new(data.to_vec());
    if let Ok(header) = Header::read(&dev) {
        let _ = header.dump_text("fuzz");
        let _ = header.dump_json();
        let _ = header.active_keyslots();
        let _ = Layout::from_header(&header, DATA_DEVICE_LEN);
    }
}

/// The input as the JSON area of a LUKS2 header (both copies, checksums right): the JSON parser,
/// the validation cryptsetup does (tokens, digests, segments, keyslots, reencrypt keyslots,
/// config, areas, requirements), the typed model, the reencryption state, the checks of the
/// tokens sectorcrypt can unlock by, and the dumps.
/// Metadata that reads must also serialise to text that reads back the same.
pub fn luks2_json(data: &[u8]) {
    // The smallest header size whose JSON area holds the input and its terminating NUL.
    let Some(&hdr_size) = HDR_SIZES
        .iter()
        .find(|&&s| s - BIN_LEN as u64 > data.len() as u64)
    else {
        return;
    };
    let mut json_area = vec![0u8; (hdr_size - BIN_LEN as u64) as usize];
    json_area[..data.len()].copy_from_slice(data);
    let mut device = Vec::with_capacity(2 * hdr_size as usize);
    for (copy, offset) in [(HeaderCopy::Primary, 0), (HeaderCopy::Secondary, hdr_size)] {
        let mut bin = binary_header(copy, hdr_size, offset);
        if bin.seal(&json_area).is_err() {
            return;
        }
        device.extend_from_slice(&bin.to_bytes());
        device.extend_from_slice(&json_area);
    }
    let dev = Padded::new(device, DATA_DEVICE_LEN, 0);
    let Ok(header) = luks2::Header::read(&dev) else {
        return;
    };
    let metadata = header.metadata();
    let _ = header.dump_text();
    let _ = header.dump_json();
    let _ = header.data_segment();
    let _ = header.volume_key_len();
    let _ = metadata.unknown_requirements();
    let _ = reencrypt::state(metadata);
    let _ = reencrypt::parse(metadata);
    // Tokens as `token import` and an unlock check them (URIs, base64 keys, keyslot lists).
    for (_, token) in metadata.tokens.iter() {
        let _ = sectorcrypt_token::validate(token);
    }
    let _ = Layout::from_header(&Header::Luks2(Box::new(header.clone())), DATA_DEVICE_LEN);

    // Writing a header back starts from this text: it must be metadata that reads again.
    let text = metadata.to_json_text();
    let mut area = text.clone().into_bytes();
    area.push(0);
    let again = validate::parse_json_area(&area)
        .and_then(|mut v| {
            validate::repair(&mut v);
            validate::validate(&v, json_area.len() as u64)?;
            luks2::metadata::Metadata::from_json(v)
        })
        .unwrap_or_else(|why| panic!("the metadata's own text does not read back: {why}\n{text}"));
    assert_eq!(
        again.to_json_text(),
        text,
        "the metadata changed on a round trip"
    );
}

/// A binary header for a copy at `offset` of a header of `hdr_size` bytes, checksum still to be
/// sealed.
fn binary_header(copy: HeaderCopy, hdr_size: u64, offset: u64) -> BinaryHeader {
    let mut checksum_alg = [0u8; CHECKSUM_ALG_LEN];
    checksum_alg[..6].copy_from_slice(b"sha256");
    let mut uuid = [0u8; UUID_LEN];
    uuid[..36].copy_from_slice(b"0badc0de-0000-4000-8000-000000000000");
    BinaryHeader {
        copy,
        version: 2,
        hdr_size,
        seqid: 1,
        label: [0; LABEL_LEN],
        checksum_alg,
        salt: [0; SALT_LEN],
        uuid,
        subsystem: [0; LABEL_LEN],
        hdr_offset: offset,
        checksum: [0; CHECKSUM_LEN],
    }
}

/// The input as a LUKS1 header (and what follows it: the keyslot areas): parse it against a
/// device as long as the input and a long one, render it, check that its bytes parse back to
/// the same header, and open its keyslots with [`PASSPHRASE`] where their PBKDF2 is cheap.
pub fn luks1(data: &[u8]) {
    let _ = luks1::Header::parse(data, data.len() as u64);
    let Ok(header) = luks1::Header::parse(data, DATA_DEVICE_LEN) else {
        return;
    };
    let _ = header.dump_text();
    let _ = header.dump_json();
    let _ = header.cipher_spec();
    for slot in 0..header.keyslots.len() + 1 {
        let _ = header.keyslot_area(slot);
    }
    let bytes = header.to_bytes();
    let again = luks1::Header::parse(&bytes, DATA_DEVICE_LEN)
        .unwrap_or_else(|e| panic!("a header's own bytes do not parse: {e}"));
    assert_eq!(again, header, "the header changed on a round trip");

    let cheap = header.mk_digest_iterations <= MAX_ITERATIONS
        && header
            .keyslots
            .iter()
            .all(|k| !k.active || k.iterations <= MAX_ITERATIONS);
    if cheap {
        // The keyslot areas lie inside the input or in zeros after it.
        let dev = Padded::new(data.to_vec(), 4 << 20, 0);
        let _ = header.unlock(&dev, PASSPHRASE, None);
    }
}
