//! An encrypted raw NAND flash: the thesis' system with the header its future work asks for.
//!
//! # Layout on the chip
//!
//! ```text
//! good eraseblocks:  journal (2) | LUKS2 header area (n) | rewrite journal (j) | UBI, encrypted
//! ```
//!
//! - The **header area** is a [`BlockArea`]: the first two good eraseblocks journal its block
//!   rewrites, so that a power cut during a key change leaves every block old or new. It holds
//!   a LUKS2 header made by the same code as on a disk, so a dump of those blocks is a LUKS2
//!   header file that `cryptsetup luksDump` reads and `cryptsetup open --test-passphrase`
//!   opens, and every key command (add, remove, change, kill, backup, restore) works on it
//!   unchanged. Its metadata is LUKS2's minimum (16 KiB a copy) and its keyslots area fills the
//!   rest of its eraseblocks (room for four keyslots of the volume key at least).
//! - The **rewrite journal** (only under the policies that hide free space at rest, which are
//!   the default) keeps the encryption layer's read-modify-erase-writes atomic
//!   ([`sectorcrypt_flash::crypt`]); it is [`rewrite_journal_blocks`] of the chip's blocks, bad ones skipped.
//! - The **data segment** of that header describes the encrypted UBI as dm-crypt would see a
//!   linear map of it: it starts at the byte offset of the first eraseblock after the area, its
//!   sector size is the chip's sub-page (the unit [`CryptFlash`] encrypts), its IVs count
//!   sub-pages from there (`plain64`). So `cryptsetup open --header AREA CHIP` on dumps would
//!   show the decrypted UBI image.
//! - A **token** of type [`TOKEN_TYPE`] (cryptsetup keeps tokens of types it does not know)
//!   records what LUKS2 cannot say: the erased-space policy and the chip geometry the layout was
//!   made for, so that a wrong geometry or a damaged token is refused, not misread.
//!
//! Bad eraseblocks are skipped wherever they are: in the journal and header area (the next
//! good block takes the place) and below UBI (which handles them itself). The data segment's
//! offset counts eraseblocks, bad ones included: UBI's PEB numbers, and so the IVs, are those of
//! the chip after the area.

pub mod convert;
mod error;

use std::sync::Arc;

use sectorcrypt_cipher::{CipherSpec, SectorOptions};
use sectorcrypt_flash::area::BlockArea;
use sectorcrypt_flash::crypt::{rewrite_journal_blocks, CryptFlash, Policy};
use sectorcrypt_flash::part::Partition;
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_luks::luks2::limits::KEYSLOTS_SIZE_MAX;
use sectorcrypt_luks::luks2::{keyslot_area_size, Header as Luks2Header};
use sectorcrypt_luks::{FormatOptions, Header};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_storage::Storage;
use sectorcrypt_ubi::{AttachOptions, Ubi};
use serde_json::{json, Value};

pub use error::Error;

/// The type of the token that holds the flash parameters.
pub const TOKEN_TYPE: &str = "sectorcrypt-flash";

/// LUKS2 metadata size on flash: the minimum, 16 KiB a copy.
const METADATA_SIZE: u64 = 16 << 10;

/// Keyslots of the volume key the header area holds at least.
const MIN_KEYSLOTS: u64 = 4;

/// The eraseblock where the journal starts.
const FIRST_BLOCK: u32 = 0;

/// The erased-space policy of new flashes: free space hidden at rest, for about the erases of
/// plain UBI (`docs/BENCHMARKS.md`).
pub const DEFAULT_POLICY: Policy = Policy::AtRest;

/// A new encrypted flash.
#[derive(Clone, Debug)]
pub struct NewFlash {
    /// The LUKS2 options (cipher, key size, PBKDF, label, UUID...). The metadata size, sector
    /// size and data offset are the flash's own and may not be given.
    pub luks: FormatOptions,
    /// How erased space is stored.
    pub policy: Policy,
    /// Room for this many keyslots (at least 4; `None`: what fills the header's eraseblocks).
    pub keyslots: Option<u32>,
}

/// The parameters the token records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashParams {
    /// How erased space is stored.
    pub policy: Policy,
    /// An in-place conversion in progress ([`convert`]): the flash cannot be used until it ends.
    pub conversion: Option<convert::Stage>,
    /// Eraseblocks of the header area (good ones; the journal's two not counted).
    pub header_blocks: u32,
    /// Eraseblocks of the rewrite journal, just before UBI (0 under the policies without one).
    pub rewrite_journal_blocks: u32,
    /// The first eraseblock of UBI.
    pub data_first: u32,
    /// The geometry the layout was made for.
    pub geometry: Geometry,
}

impl FlashParams {
    /// The eraseblocks of the rewrite journal.
    pub fn rewrite_journal(&self) -> std::ops::Range<u32> {
        self.data_first - self.rewrite_journal_blocks..self.data_first
    }

    fn to_token(self) -> Value {
        let g = self.geometry;
        json!({
            "type": TOKEN_TYPE,
            "keyslots": [],
            "policy": self.policy.name(),
            "header_blocks": self.header_blocks,
            "rewrite_journal_blocks": self.rewrite_journal_blocks,
            "data_first_block": self.data_first,
            "peb_size": g.peb_size,
            "page_size": g.page_size,
            "sub_page_size": g.sub_page_size,
            "peb_count": g.peb_count,
            "conversion": self.conversion.map(convert::Stage::name),
        })
    }

    fn from_token(t: &Value, chip: Geometry) -> Result<FlashParams, Error> {
        let bad = |why: &str| Error::NotEncrypted(format!("the {TOKEN_TYPE} token {why}"));
        let num = |k: &str| {
            t.get(k)
                .and_then(Value::as_u64)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| bad(&format!("has no valid \"{k}\"")))
        };
        let policy = t
            .get("policy")
            .and_then(Value::as_str)
            .and_then(Policy::from_name)
            .ok_or_else(|| bad("names no known policy"))?;
        let made_for = (
            num("peb_size")?,
            num("page_size")?,
            num("sub_page_size")?,
            num("peb_count")?,
        );
        let have = (
            chip.peb_size,
            chip.page_size,
            chip.sub_page_size,
            chip.peb_count,
        );
        if made_for != have {
            return Err(Error::Geometry(format!(
                "the header was made for eraseblocks of {} bytes, pages of {}, sub-pages of {} \
                 and {} blocks; this chip has {}, {}, {} and {}",
                made_for.0, made_for.1, made_for.2, made_for.3, have.0, have.1, have.2, have.3
            )));
        }
        // Headers made before the rewrite journal existed have none.
        let rewrite_journal_blocks = match t.get("rewrite_journal_blocks") {
            None => 0,
            Some(_) => num("rewrite_journal_blocks")?,
        };
        if policy.hides_at_rest() && rewrite_journal_blocks < 2 {
            return Err(bad(&format!(
                "gives the {} policy no rewrite journal",
                policy.name()
            )));
        }
        let conversion = match t.get("conversion") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_str()
                    .and_then(convert::Stage::from_name)
                    .ok_or_else(|| bad("names no known conversion"))?,
            ),
        };
        let header_blocks = num("header_blocks")?;
        let data_first = num("data_first_block")?;
        // The block journal (2), the header area and the rewrite journal lie before UBI's first
        // block (further with bad blocks among them), which lies on the chip: a token that says
        // otherwise would put the rewrite journal before block 0 (an underflow, found by
        // fuzzing) or on the header.
        let before_ubi = u64::from(FIRST_BLOCK)
            + 2
            + u64::from(header_blocks)
            + u64::from(rewrite_journal_blocks);
        if before_ubi > u64::from(data_first) || data_first >= chip.peb_count {
            return Err(bad(&format!(
                "puts UBI at eraseblock {data_first}, which is not after its {header_blocks} \
                 header blocks and {rewrite_journal_blocks} journal blocks on a chip of {}",
                chip.peb_count
            )));
        }
        Ok(FlashParams {
            policy,
            conversion,
            header_blocks,
            rewrite_journal_blocks,
            data_first,
            geometry: chip,
        })
    }
}

/// The header of an encrypted flash, found and read (no passphrase needed): what the key
/// commands work on.
pub struct HeaderArea {
    /// The header area as a rewritable `Storage` (LUKS2 code works on it as on a file).
    pub area: BlockArea,
    /// The header.
    pub header: Luks2Header,
    /// The flash parameters from its token.
    pub params: FlashParams,
}

/// Find and read the header of the encrypted flash on `flash` (finishing a header block rewrite
/// that a power cut interrupted).
///
/// Errors: [`Error::NotEncrypted`] for a chip with no such header (or a LUKS1 one, or one with
/// no flash token); [`Error::Geometry`] for a header made for another chip.
pub fn read_header(flash: Arc<dyn Flash>) -> Result<HeaderArea, Error> {
    let g = flash.geometry();
    // The area's length is in the token, inside the header: read the header copies from the
    // blocks that hold them, seen as the start of a device long enough for any LUKS2 header.
    let copies = (2 * METADATA_SIZE).div_ceil(u64::from(g.peb_size)) as u32;
    let first = BlockArea::open(Arc::clone(&flash), FIRST_BLOCK, copies)?;
    let not = |why: String| Error::NotEncrypted(why);
    let header = match Header::read(&Prefix(&first)) {
        Ok(Header::Luks2(h)) => *h,
        Ok(Header::Luks1(_)) => {
            return Err(not(
                "its header is LUKS1; an encrypted flash has LUKS2".into()
            ))
        }
        Err(e) => {
            return Err(not(format!(
                "no LUKS2 header in its first good eraseblocks ({e})"
            )))
        }
    };
    let Some((_, token)) = header.token_of_type(TOKEN_TYPE) else {
        return Err(not(format!(
            "its LUKS2 header has no {TOKEN_TYPE} token: it is a LUKS volume, not an encrypted flash"
        )));
    };
    let params = FlashParams::from_token(token, g)?;
    let area = BlockArea::open(flash, FIRST_BLOCK, params.header_blocks)?;
    let header = Luks2Header::read(&area)?;
    Ok(HeaderArea {
        area,
        header,
        params,
    })
}

/// The start of a device, as long as the largest LUKS2 header: reads past what it holds
/// return zeros, writes are refused. Enough to read a header's metadata, not its keyslots.
struct Prefix<'a>(&'a dyn Storage);

impl Storage for Prefix<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let have = self.0.len()?;
        let inside = have.saturating_sub(offset).min(buf.len() as u64) as usize;
        if inside > 0 {
            self.0.read_at(&mut buf[..inside], offset)?;
        }
        buf[inside..].fill(0);
        Ok(())
    }

    fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other(
            "the header's first blocks are read only here",
        ))
    }

    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn len(&self) -> std::io::Result<u64> {
        Ok(2 * (4 << 20) + KEYSLOTS_SIZE_MAX)
    }

    fn name(&self) -> String {
        self.0.name()
    }
}

/// An unlocked encrypted flash.
pub struct EncryptedFlash {
    /// The header.
    pub header: HeaderArea,
    /// The keyslot that opened it.
    pub keyslot: usize,
    /// The decrypted view of UBI's eraseblocks (the encryption layer).
    pub crypt: Arc<CryptFlash>,
}

impl EncryptedFlash {
    /// Attach the UBI inside (formatting it if it is empty).
    pub fn attach(&self, opts: &AttachOptions) -> Result<Ubi, Error> {
        Ok(Ubi::attach(
            Arc::clone(&self.crypt) as Arc<dyn Flash>,
            opts,
        )?)
    }

    /// What to do when the flash is left (UBI detached, nothing writing): hide its free space
    /// as the policy says ([`CryptFlash::hide_free_space`]) and sync the chip. Returns the bytes
    /// of filler programmed.
    pub fn detach(&self) -> Result<u64, Error> {
        let filled = self.crypt.hide_free_space()?;
        self.crypt.sync()?;
        Ok(filled)
    }
}

/// Unlock the encrypted flash on `flash` with `passphrase` (keyslot `keyslot` only, if given).
///
/// Errors: as [`read_header`]; [`Error::Luks`] with a wrong passphrase.
pub fn unlock(
    flash: Arc<dyn Flash>,
    passphrase: &[u8],
    keyslot: Option<usize>,
) -> Result<EncryptedFlash, Error> {
    let header = read_header(Arc::clone(&flash))?;
    if let Some(d) = header.params.conversion {
        return Err(Error::Converting(d));
    }
    // As cryptsetup activates no device whose header asks for what it does not know.
    header.header.metadata().check_requirements_known()?;
    let unlocked = header.header.unlock(&header.area, passphrase, keyslot)?;
    let crypt = layer(&flash, &header, &unlocked.volume_key)?;
    Ok(EncryptedFlash {
        keyslot: unlocked.slot,
        header,
        crypt: Arc::new(crypt),
    })
}

/// The encryption layer over UBI's eraseblocks, as the header's data segment describes it.
fn layer(flash: &Arc<dyn Flash>, h: &HeaderArea, volume_key: &[u8]) -> Result<CryptFlash, Error> {
    let segment = h.header.data_segment()?;
    let g = flash.geometry();
    if segment.offset != u64::from(h.params.data_first) * u64::from(g.peb_size)
        || segment.sector_size != g.sub_page_size
    {
        return Err(Error::NotEncrypted(format!(
            "the header's data segment (offset {}, sectors of {}) does not match its flash token",
            segment.offset, segment.sector_size
        )));
    }
    let spec = CipherSpec::parse(&segment.cipher)?;
    let part = Arc::new(Partition::new(Arc::clone(flash), h.params.data_first)?);
    let (policy, options) = (h.params.policy, SectorOptions::default());
    let journal = h.params.rewrite_journal_blocks;
    Ok(if journal == 0 {
        CryptFlash::new(part, spec, volume_key, policy, &options)?
    } else {
        let first = h.params.data_first - journal;
        let journal = Arc::new(Partition::range(Arc::clone(flash), first, journal)?);
        CryptFlash::with_journal(part, journal, spec, volume_key, policy, &options)?
    })
}

/// Make `flash` an encrypted flash with one keyslot for `passphrase`: the header area written,
/// every eraseblock after it erased through the encryption layer, an empty UBI formatted inside,
/// and free space hidden as the policy says (so that, under every policy but
/// [`Policy::Visible`], the chip holds ciphertext only). Returns the flash unlocked.
///
/// Errors: [`Error::Luks`] for LUKS options the format refuses; [`Error::Geometry`] for a chip
/// too small for the header and a UBI; [`Error::Flash`].
pub fn format(
    flash: Arc<dyn Flash>,
    new: &NewFlash,
    passphrase: &[u8],
) -> Result<EncryptedFlash, Error> {
    let plan = Plan::new(&flash, new)?;
    let (header, volume_key, keyslot) = plan.write_header(&flash, new, passphrase, None)?;
    let crypt = layer(&flash, &header, &volume_key)?;
    let parts = crypt.geometry().peb_count;
    for peb in 0..parts {
        if crypt.is_bad(peb)? {
            continue;
        }
        // A block that fails its erase is worn out: marked bad, as ubiformat does.
        match crypt.erase(peb) {
            Err(sectorcrypt_flash::Error::EraseFailed(_)) => crypt.mark_bad(peb)?,
            done => done?,
        }
    }
    let opened = EncryptedFlash {
        keyslot,
        header,
        crypt: Arc::new(crypt),
    };
    drop(opened.attach(&AttachOptions::default())?);
    opened.detach()?;
    Ok(opened)
}

/// Where a new header goes on a chip: its area (opened), its size in blocks, and UBI's first
/// block after it.
struct Plan {
    area: BlockArea,
    header_blocks: u64,
    rewrite_journal_blocks: u32,
    data_first: u32,
}

impl Plan {
    /// Check the options and lay the header out on `flash`.
    fn new(flash: &Arc<dyn Flash>, new: &NewFlash) -> Result<Plan, Error> {
        let g = flash.geometry();
        let fixed = [
            (new.luks.version != 2, "LUKS1"),
            (new.luks.metadata_size.is_some(), "a metadata size"),
            (new.luks.keyslots_size.is_some(), "a keyslots area size"),
            (new.luks.sector_size.is_some(), "a sector size"),
            (new.luks.data_offset.is_some(), "a data offset"),
        ];
        if let Some((_, what)) = fixed.iter().find(|(given, _)| *given) {
            return Err(Error::Unsupported(format!(
                "{what}: an encrypted flash's header is LUKS2 with sizes set by the chip"
            )));
        }
        new.luks.check()?;
        let key_len = new.luks.key_bits.unwrap_or(512) / 8;
        let keyslots = u64::from(new.keyslots.unwrap_or(MIN_KEYSLOTS as u32)).max(MIN_KEYSLOTS);
        let peb = u64::from(g.peb_size);
        let header_blocks =
            (2 * METADATA_SIZE + keyslots * keyslot_area_size(key_len)).div_ceil(peb);
        let area = BlockArea::open(Arc::clone(flash), FIRST_BLOCK, header_blocks as u32)?;
        let rewrite_journal_blocks = if new.policy.hides_at_rest() {
            rewrite_journal_blocks(g.peb_count)
        } else {
            0
        };
        let data_first = area.end() + rewrite_journal_blocks;
        // UBI needs its layout volume, the reserves and room for data: 16 blocks at the least.
        if data_first + 16 > g.peb_count {
            return Err(Error::Geometry(format!(
                "a chip of {} eraseblocks has no room for a UBI after a {header_blocks}-block header",
                g.peb_count
            )));
        }
        Ok(Plan {
            area,
            header_blocks,
            rewrite_journal_blocks,
            data_first,
        })
    }

    /// Format the LUKS2 header in the area with one keyslot for `passphrase` and the flash
    /// token (recording `conversion`). Returns the header, the volume key and the keyslot.
    fn write_header(
        self,
        flash: &Arc<dyn Flash>,
        new: &NewFlash,
        passphrase: &[u8],
        conversion: Option<convert::Stage>,
    ) -> Result<(HeaderArea, SecretBytes, usize), Error> {
        let g = flash.geometry();
        let peb = u64::from(g.peb_size);
        let options = FormatOptions {
            metadata_size: Some(METADATA_SIZE),
            keyslots_size: Some(self.header_blocks * peb - 2 * METADATA_SIZE),
            sector_size: Some(g.sub_page_size as usize),
            detached_header: true,
            data_offset: Some(u64::from(self.data_first) * peb),
            ..new.luks.clone()
        };
        let data_len = u64::from(g.peb_count - self.data_first) * peb;
        let (formatted, unlocked) =
            sectorcrypt_luks::format(&self.area, data_len, &options, passphrase)?;
        let Header::Luks2(h) = formatted else {
            return Err(Error::Unsupported("the format made no LUKS2 header".into()));
        };
        let params = FlashParams {
            policy: new.policy,
            conversion,
            header_blocks: self.header_blocks as u32,
            rewrite_journal_blocks: self.rewrite_journal_blocks,
            data_first: self.data_first,
            geometry: g,
        };
        // Whatever the rewrite journal's blocks held (UBI's data, moved out of them), it is
        // no record: the journal starts empty.
        for b in params.rewrite_journal() {
            if !flash.is_bad(b)? {
                flash.erase(b)?;
            }
        }
        let (header, _) = h.import_token(&self.area, None, params.to_token())?;
        self.area.sync().map_err(Error::Storage)?;
        let header = HeaderArea {
            area: self.area,
            header,
            params,
        };
        Ok((header, unlocked.volume_key, unlocked.slot))
    }
}

/// The volume key of an unlocked flash, for `dump --dump-volume-key`.
pub fn volume_key(
    h: &HeaderArea,
    passphrase: &[u8],
    keyslot: Option<usize>,
) -> Result<SecretBytes, Error> {
    Ok(h.header.unlock(&h.area, passphrase, keyslot)?.volume_key)
}
