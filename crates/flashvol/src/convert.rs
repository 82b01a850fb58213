//! Encrypting a plain UBI flash in place, keeping its erase counters, and decrypting it back:
//! resumable after a signal or a power cut by running the same command again.
//!
//! # Encrypting
//!
//! 1. UBI is attached on the whole chip and every LEB held in the blocks the header will take is
//!    moved further on ([`Ubi::evacuate`]: copies, then erases, as wear-levelling moves; the
//!    chip is still plain UBI throughout).
//! 2. The header is written in those blocks, with a token that says an encryption is in
//!    progress (the flash cannot be unlocked until it ends).
//! 3. Every block of UBI's part is encrypted in place, through a journal: its plaintext goes to
//!    a copy block, a record naming the block, the copy's CRC and a sequence number to the
//!    record block paired with it, and only then is the block rewritten encrypted
//!    ([`CryptFlash::store`]: one erase, one program). A cut in the rewrite is finished from the
//!    newest record's copy on the next run. The pairs are the header's two journal blocks and,
//!    under the policies that have one, the layer's rewrite journal (empty while converting),
//!    taken in turn, so that the two erases each converted block costs are spread over all of
//!    them rather than paid by two blocks.
//! 4. The journal blocks are erased (no plaintext stays behind), the policy's free space hidden,
//!    and the token says the flash is ready.
//!
//! Which blocks still need it is read off the blocks, not kept in a counter: a block is plain
//! while its raw bytes start with a valid UBI erase-counter header (UBI gives every block one),
//! or, under the thesis policy, while it is physically erased (an encrypted block never is). So
//! a rerun skips what is done, whatever the order of the cut, and nothing is encrypted twice. A
//! plain block with neither (a corrupted block UBI keeps) is left as it is: UBI treats it the
//! same either way.
//!
//! # Decrypting
//!
//! The token says a decryption is in progress first; then every encrypted block (its raw bytes
//! no UBI header, its plaintext one, or all 0xFF) is rewritten plain through the same journal;
//! then the journal blocks, and the header's blocks from the last to the first, are erased, so
//! that the header stays readable until the end, and UBI, attached on the whole chip again, finds
//! them empty and gives them erase counters (the mean, as it does).

use std::cell::Cell;
use std::sync::Arc;

use sectorcrypt_flash::area::put_block;
use sectorcrypt_flash::crypt::{CryptFlash, Policy};
use sectorcrypt_flash::part::Partition;
use sectorcrypt_flash::{Error as FlashError, Flash};
use sectorcrypt_secret::SecretBytes;
use sectorcrypt_ubi::media::{EcHdr, Header as UbiHeader, EC_HDR_SIZE};
use sectorcrypt_ubi::{AttachOptions, Ubi};

use crate::{
    layer, read_header, unlock, EncryptedFlash, Error, HeaderArea, NewFlash, Plan, TOKEN_TYPE,
};

/// Which way a conversion goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// Plain UBI to encrypted flash.
    Encrypt,
    /// Encrypted flash to plain UBI.
    Decrypt,
}

/// How far a conversion is, as the token records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Blocks are being encrypted.
    Encrypting,
    /// Blocks are being decrypted.
    Decrypting,
    /// Every block is plain; the header's blocks are being erased (last to first, so the
    /// token stays readable to the end; no passphrase is needed any more).
    ErasingHeader,
}

impl Stage {
    /// Its name in the token.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Encrypting => "encrypting",
            Stage::Decrypting => "decrypting",
            Stage::ErasingHeader => "erasing-header",
        }
    }

    /// The stage called `name`.
    pub fn from_name(name: &str) -> Option<Stage> {
        [Stage::Encrypting, Stage::Decrypting, Stage::ErasingHeader]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// The command that finishes it.
    pub fn resume_command(self) -> &'static str {
        match self {
            Stage::Encrypting => "sectorcrypt flash convert",
            _ => "sectorcrypt flash convert --decrypt",
        }
    }
}

/// Reports progress: (blocks looked at, blocks in all).
pub type Progress<'a> = &'a mut dyn FnMut(u32, u32);

/// A record of this version, with a sequence number.
const RECORD_MAGIC: &[u8; 8] = b"SCFLCNV2";
/// A record written before the journal was spread (one pair, no sequence number).
const RECORD_MAGIC_V1: &[u8; 8] = b"SCFLCONV";
const RECORD_LEN: usize = 29;

/// The chip, the layer over UBI's part of it, and the journal.
struct Converter {
    /// UBI's part of the chip, plain view.
    part: Arc<dyn Flash>,
    crypt: CryptFlash,
    chip: Arc<dyn Flash>,
    /// The journal's (copy, record) block pairs, used in turn.
    pairs: Vec<(u32, u32)>,
    /// The pair the next conversion uses and the sequence number of its record.
    next: Cell<(usize, u64)>,
    policy: Policy,
}

/// A valid record: the block it names, the CRC of its copy, its direction, its sequence.
struct Record {
    block: u32,
    sum: u32,
    decrypt: bool,
    seq: u64,
}

impl Record {
    fn parse(r: &[u8; RECORD_LEN]) -> Option<Record> {
        let word = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().expect("4 bytes"));
        let (seq, valid) = match &r[..8] {
            m if m == RECORD_MAGIC => (
                u64::from_le_bytes(r[17..25].try_into().expect("8 bytes")),
                word(25) == crc(&r[..25]),
            ),
            m if m == RECORD_MAGIC_V1 => (0, word(17) == crc(&r[..17])),
            _ => return None,
        };
        valid.then(|| Record {
            block: word(8),
            sum: word(12),
            decrypt: r[16] == 1,
            seq,
        })
    }
}

fn crc(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

impl Converter {
    fn new(chip: &Arc<dyn Flash>, h: &HeaderArea, volume_key: &[u8]) -> Result<Converter, Error> {
        let mut pairs = vec![h.area.journal()];
        let mut spare = Vec::new();
        for b in h.params.rewrite_journal() {
            if !chip.is_bad(b)? {
                spare.push(b);
            }
        }
        pairs.extend(spare.chunks_exact(2).map(|p| (p[0], p[1])));
        Ok(Converter {
            part: Arc::new(Partition::new(Arc::clone(chip), h.params.data_first)?),
            crypt: layer(chip, h, volume_key)?,
            chip: Arc::clone(chip),
            pairs,
            next: Cell::new((0, 1)),
            policy: h.params.policy,
        })
    }

    fn block_len(&self) -> usize {
        self.chip.geometry().peb_size as usize
    }

    /// Block `b` of UBI's part as `view` reads it (a block read with errors counts as its bytes).
    fn read(view: &dyn Flash, b: u32, len: usize) -> Result<Vec<u8>, Error> {
        let mut buf = vec![0u8; len];
        match view.read(b, 0, &mut buf) {
            Ok(_) | Err(FlashError::Uncorrectable { .. }) => Ok(buf),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether `bytes` start with a valid UBI erase-counter header.
    fn has_ec(bytes: &[u8]) -> bool {
        matches!(EcHdr::parse(&bytes[..EC_HDR_SIZE]), UbiHeader::Valid(_))
    }

    /// The plaintext block `b` should become when going `dir`, or `None` if it is there already.
    fn wanted(&self, b: u32, dir: Direction) -> Result<Option<Vec<u8>>, Error> {
        let raw = Self::read(&*self.part, b, self.block_len())?;
        let erased = raw.iter().all(|&x| x == 0xFF);
        let plain = Self::has_ec(&raw);
        Ok(match dir {
            Direction::Encrypt if plain || (erased && self.policy == Policy::Thesis) => Some(raw),
            Direction::Encrypt => None,
            Direction::Decrypt if plain || erased => None,
            Direction::Decrypt => {
                let text = Self::read(&self.crypt, b, self.block_len())?;
                (Self::has_ec(&text) || text.iter().all(|&x| x == 0xFF)).then_some(text)
            }
        })
    }

    /// Write block `b` as `dir` wants it from its plaintext `text`.
    fn rewrite(&self, b: u32, text: Vec<u8>, dir: Direction) -> Result<(), Error> {
        match dir {
            Direction::Encrypt => self.crypt.store(b, text)?,
            Direction::Decrypt => put_block(&*self.part, b, &text)?,
        }
        Ok(())
    }

    /// Convert block `b` through the journal's next pair (see the module docs).
    fn convert(&self, b: u32, text: Vec<u8>, dir: Direction) -> Result<(), Error> {
        let (index, seq) = self.next.get();
        let (copy, record) = self.pairs[index];
        put_block(&*self.chip, copy, &text)?;
        let page = self.chip.geometry().page_size as usize;
        let mut r = vec![0xFFu8; page];
        r[..8].copy_from_slice(RECORD_MAGIC);
        r[8..12].copy_from_slice(&b.to_le_bytes());
        r[12..16].copy_from_slice(&crc(&text).to_le_bytes());
        r[16] = u8::from(dir == Direction::Decrypt);
        r[17..25].copy_from_slice(&seq.to_le_bytes());
        let c = crc(&r[..25]);
        r[25..29].copy_from_slice(&c.to_le_bytes());
        self.chip.erase(record)?;
        self.chip.program(record, 0, &r)?;
        self.next.set(((index + 1) % self.pairs.len(), seq + 1));
        self.rewrite(b, text, dir)
    }

    /// Finish the block rewrite a cut may have interrupted: the newest record's, if its copy is
    /// whole (redoing a finished one writes the same again). The next record goes to the pair
    /// after it, with a higher sequence number.
    fn recover(&self, dir: Direction) -> Result<(), Error> {
        let mut newest: Option<(usize, Record)> = None;
        for (index, &(_, record)) in self.pairs.iter().enumerate() {
            let mut r = [0u8; RECORD_LEN];
            if self.chip.read(record, 0, &mut r).is_err() {
                continue;
            }
            if let Some(rec) = Record::parse(&r) {
                if newest.as_ref().is_none_or(|(_, n)| rec.seq > n.seq) {
                    newest = Some((index, rec));
                }
            }
        }
        let Some((index, rec)) = newest else {
            return Ok(());
        };
        self.next.set(((index + 1) % self.pairs.len(), rec.seq + 1));
        if rec.decrypt != (dir == Direction::Decrypt) {
            return Ok(());
        }
        let text = Self::read(&*self.chip, self.pairs[index].0, self.block_len())?;
        if crc(&text) == rec.sum {
            self.rewrite(rec.block, text, dir)?;
        }
        Ok(())
    }

    /// Convert every block that needs it, then erase the journal.
    fn run(&self, dir: Direction, progress: Progress<'_>) -> Result<(), Error> {
        self.recover(dir)?;
        let blocks = self.part.geometry().peb_count;
        for b in 0..blocks {
            if !self.part.is_bad(b)? {
                if let Some(text) = self.wanted(b, dir)? {
                    self.convert(b, text, dir)?;
                }
            }
            progress(b + 1, blocks);
        }
        for &(copy, record) in &self.pairs {
            self.chip.erase(copy)?;
            self.chip.erase(record)?;
        }
        Ok(self.chip.sync()?)
    }
}

/// Record `conversion` in the flash token of `h`.
fn set_conversion(h: &mut HeaderArea, conversion: Option<Stage>) -> Result<(), Error> {
    let (id, _) = h
        .header
        .token_of_type(TOKEN_TYPE)
        .ok_or_else(|| Error::NotEncrypted("the flash token is gone".into()))?;
    h.params.conversion = conversion;
    h.header = h.header.update_token(&h.area, id, h.params.to_token())?;
    Ok(())
}

/// Encrypt the plain UBI on `flash` in place (see the module docs), with a LUKS2 header as
/// [`NewFlash`] asks and one keyslot for `passphrase`; or finish an encryption a signal or a
/// power cut interrupted (then `new` is not used); on a flash encrypted already, only unlock it.
/// Returns the flash unlocked.
///
/// Errors: [`Error::Unsupported`] when the flash holds no UBI; [`Error::Ubi`] when UBI has too
/// few PEBs available to give up the header's blocks; [`Error::Converting`] while a decryption
/// is unfinished; [`Error::Luks`] for a wrong passphrase (nothing written then).
pub fn encrypt(
    flash: Arc<dyn Flash>,
    new: &NewFlash,
    passphrase: &[u8],
    progress: Progress<'_>,
) -> Result<EncryptedFlash, Error> {
    let (mut header, volume_key) = match read_header(Arc::clone(&flash)) {
        Ok(h) => match h.params.conversion {
            Some(Stage::Encrypting) => {
                h.header.metadata().check_requirements_known()?;
                let vk = h.header.unlock(&h.area, passphrase, None)?.volume_key;
                (h, vk)
            }
            Some(other) => return Err(Error::Converting(other)),
            // Encrypted already (a run that ended, or was cut just after its last write):
            // nothing to do but open it.
            None => return unlock(flash, passphrase, None),
        },
        Err(Error::NotEncrypted(_)) => start(&flash, new, passphrase)?,
        Err(e) => return Err(e),
    };
    let converter = Converter::new(&flash, &header, &volume_key)?;
    converter.run(Direction::Encrypt, progress)?;
    // The blocks left erased (the policy's free space) are hidden before the flash is opened.
    converter.crypt.hide_free_space()?;
    set_conversion(&mut header, None)?;
    unlock(flash, passphrase, None)
}

/// A new encryption: make room at the start of UBI, then write the header that records it.
fn start(
    flash: &Arc<dyn Flash>,
    new: &NewFlash,
    passphrase: &[u8],
) -> Result<(HeaderArea, SecretBytes), Error> {
    let plan = Plan::new(flash, new)?;
    if !holds_ubi(&**flash)? {
        // Attaching would format it: refuse before anything is written.
        return Err(Error::Unsupported(
            "the flash holds no UBI to encrypt (flash format makes a new encrypted one)".into(),
        ));
    }
    // A volume marked for auto-resize grows at the first attach after the conversion, over the
    // PEBs the header leaves; growing it now would take the room the header needs.
    let opts = AttachOptions {
        autoresize: false,
        ..AttachOptions::default()
    };
    match Ubi::attach(Arc::clone(flash), &opts) {
        Ok(ubi) => ubi.evacuate(plan.data_first)?,
        // A start cut short while writing the header: its blocks hold neither UBI nor a
        // header, and the LEBs had all been moved out of them. UBI's part must attach alone.
        Err(sectorcrypt_ubi::Error::Refused(why)) => {
            let part = Arc::new(Partition::new(Arc::clone(flash), plan.data_first)?);
            Ubi::attach(part, &AttachOptions::default())
                .map_err(|_| Error::Ubi(sectorcrypt_ubi::Error::Refused(why)))?;
        }
        Err(e) => return Err(e.into()),
    }
    let (h, vk, _) = plan.write_header(flash, new, passphrase, Some(Stage::Encrypting))?;
    Ok((h, vk))
}

/// Whether any good block of `flash` starts with a valid UBI erase-counter header.
fn holds_ubi(flash: &dyn Flash) -> Result<bool, Error> {
    let mut hdr = [0u8; EC_HDR_SIZE];
    for b in 0..flash.geometry().peb_count {
        if !flash.is_bad(b)? && flash.read(b, 0, &mut hdr).is_ok() && Converter::has_ec(&hdr) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Decrypt the encrypted flash on `flash` back to plain UBI in place (see the module docs), or
/// finish a decryption that was interrupted (once every block is plain, no passphrase is asked
/// for: `passphrase` is then not used); a flash that holds plain UBI already is left as it is.
///
/// Errors: [`Error::NotEncrypted`] for a flash with no header; [`Error::Luks`] for a wrong
/// passphrase (nothing written then); [`Error::Converting`] while an encryption is unfinished;
/// [`Error::Luks`] with [`UnmetRequirements`](sectorcrypt_luks::Error::UnmetRequirements) for
/// a header with a mandatory requirement this tool does not know (nothing written then).
pub fn decrypt(
    flash: Arc<dyn Flash>,
    passphrase: &[u8],
    progress: Progress<'_>,
) -> Result<(), Error> {
    let mut header = match read_header(Arc::clone(&flash)) {
        Ok(h) => h,
        // Plain already (a run that ended, or was cut erasing the header's first block).
        Err(Error::NotEncrypted(_)) if holds_ubi(&*flash)? => return Ok(()),
        Err(e) => return Err(e),
    };
    // Every stage writes (data, then the header's erasure): a header from a newer tool is left
    // alone, as cryptsetup leaves it.
    header.header.metadata().check_requirements_known()?;
    match header.params.conversion {
        Some(Stage::Encrypting) => return Err(Error::Converting(Stage::Encrypting)),
        Some(Stage::ErasingHeader) => {}
        None | Some(Stage::Decrypting) => {
            let volume_key = header
                .header
                .unlock(&header.area, passphrase, None)?
                .volume_key;
            if header.params.conversion.is_none() {
                set_conversion(&mut header, Some(Stage::Decrypting))?;
            }
            Converter::new(&flash, &header, &volume_key)?.run(Direction::Decrypt, progress)?;
            set_conversion(&mut header, Some(Stage::ErasingHeader))?;
        }
    }
    // The journal first (it is free again), then the header from its last block to its first
    // (both metadata copies), so that the token says what is going on until the very end.
    let (copy, record) = header.area.journal();
    for b in [copy, record]
        .into_iter()
        .chain(header.params.rewrite_journal())
        .chain(header.area.blocks().iter().rev().copied())
    {
        if !flash.is_bad(b)? {
            flash.erase(b)?;
        }
    }
    Ok(flash.sync()?)
}
