//! What a server offers: one volume, or a key-per-I/O table with one export per key tag.
//!
//! NBD has no field for a key in a request, so a connection chooses its key once, by export
//! name, and every request on it is encrypted with that key: a client that wants several keys
//! opens a connection per key (NBD's multi-connection model), much as an NVMe host puts a key tag
//! in each command of a queue. The tag is looked up again for every request, so a key evicted or
//! destroyed while a connection is open stops being used at once (its requests fail with EIO);
//! flushes need no key and always work.

use std::sync::Arc;

use sectorcrypt_volume::kpio::KeyTable;
use sectorcrypt_volume::{Announced, Error as VolumeError, Volume};

use crate::handshake::{ExportInfo, Offer};

/// The volume or volumes a server exports.
#[derive(Clone, Debug)]
pub enum Exports {
    /// One volume, under the configured export name (and the empty name).
    Volume(Arc<Volume>),
    /// A key-per-I/O table: one export per loaded key, named by its tag in decimal ("0", "17").
    /// There is no default export: a client names its key.
    KeyTable(Arc<KeyTable>),
}

impl From<Arc<Volume>> for Exports {
    fn from(volume: Arc<Volume>) -> Self {
        Exports::Volume(volume)
    }
}

impl From<Arc<KeyTable>> for Exports {
    fn from(table: Arc<KeyTable>) -> Self {
        Exports::KeyTable(table)
    }
}

impl Exports {
    pub(crate) fn is_read_only(&self) -> bool {
        match self {
            Exports::Volume(v) => v.is_read_only(),
            Exports::KeyTable(t) => t.is_read_only(),
        }
    }

    pub(crate) fn allows_discards(&self) -> bool {
        match self {
            Exports::Volume(v) => v.allows_discards(),
            Exports::KeyTable(t) => t.allows_discards(),
        }
    }

    pub(crate) fn size(&self) -> u64 {
        match self {
            Exports::Volume(v) => v.size(),
            Exports::KeyTable(t) => t.size(),
        }
    }

    pub(crate) fn sector_size(&self) -> usize {
        match self {
            Exports::Volume(v) => v.sector_size(),
            Exports::KeyTable(t) => t.sector_size(),
        }
    }

    pub(crate) fn flush(&self) -> Result<(), VolumeError> {
        match self {
            Exports::Volume(v) => v.flush(),
            Exports::KeyTable(t) => t.flush(),
        }
    }

    /// What a connection to the export named `name` serves, if there is such an export now.
    pub(crate) fn target(&self, name: &[u8], ours: &str) -> Option<Target> {
        match self {
            Exports::Volume(v) => {
                (name.is_empty() || name == ours.as_bytes()).then(|| Target::Volume(Arc::clone(v)))
            }
            Exports::KeyTable(t) => {
                let tag = parse_tag(name)?;
                t.contains(tag).then(|| Target::Key(Arc::clone(t), tag))
            }
        }
    }
}

/// A tag in canonical decimal (no sign, no leading zeros), so that one key has one name.
fn parse_tag(name: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(name).ok()?;
    let tag: u32 = text.parse().ok()?;
    (tag.to_string() == text).then_some(tag)
}

/// The exports of a server, as the handshake sees them: `template` carries the flags, sizes and
/// (for a single volume) the name and description.
pub(crate) struct Offered<'a> {
    pub exports: &'a Exports,
    pub template: &'a ExportInfo,
}

impl Offered<'_> {
    fn keyed(&self, tag: u32) -> ExportInfo {
        ExportInfo {
            name: tag.to_string(),
            description: format!("key tag {tag}"),
            ..self.template.clone()
        }
    }
}

impl Offer for Offered<'_> {
    fn find(&self, name: &[u8]) -> Option<ExportInfo> {
        match self.exports.target(name, &self.template.name)? {
            Target::Volume(_) => Some(self.template.clone()),
            Target::Key(_, tag) => Some(self.keyed(tag)),
        }
    }

    fn list(&self) -> Vec<ExportInfo> {
        match self.exports {
            Exports::Volume(_) => vec![self.template.clone()],
            Exports::KeyTable(t) => t.tags().into_iter().map(|tag| self.keyed(tag)).collect(),
        }
    }
}

/// The volume behind one connection.
pub(crate) enum Target {
    Volume(Arc<Volume>),
    Key(Arc<KeyTable>, u32),
}

impl Target {
    /// Count a request as received on the volume it will run on (and hold that volume, with
    /// its key, until the request ends); an error if the connection's key is gone.
    pub(crate) fn announce(&self) -> Result<Announced, VolumeError> {
        match self {
            Target::Volume(v) => Ok(v.announce()),
            Target::Key(t, tag) => t.announce(*tag),
        }
    }

    pub(crate) fn flush(&self) -> Result<(), VolumeError> {
        match self {
            Target::Volume(v) => v.flush(),
            Target::Key(t, _) => t.flush(),
        }
    }

    pub(crate) fn allows_discards(&self) -> bool {
        match self {
            Target::Volume(v) => v.allows_discards(),
            Target::Key(t, _) => t.allows_discards(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_tag;

    #[test]
    fn tags_have_one_spelling() {
        assert_eq!(parse_tag(b"0"), Some(0));
        assert_eq!(parse_tag(b"65535"), Some(65535));
        assert_eq!(parse_tag(b"4294967295"), Some(u32::MAX));
        for bad in [
            &b""[..],
            b"007",
            b"+7",
            b"-1",
            b"4294967296",
            b"7 ",
            b"x",
            b"\xff",
        ] {
            assert_eq!(parse_tag(bad), None, "{bad:?}");
        }
    }
}
