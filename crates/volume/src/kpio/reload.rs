//! Bringing a [`KeyTable`] in line with a key table file (the host's list of keys: entries of a
//! key's size back to back, the i-th under tag i, all zeros for none), entry by entry, as a
//! server does when told to reload.
//!
//! A [`Mirror`] keeps what the table holds in the file's layout, in step with every change that
//! succeeded: an entry that fails (the table is full, the key is refused) stays as it was and is
//! tried again at the next reload, and an entry that did not change is left alone. Keys are
//! compared in constant time, and the mirror is zeroized on drop.

use std::io::Read;

use sectorcrypt_secret::SecretBytes;
use subtle::ConstantTimeEq;

use super::KeyTable;
use crate::Error;

/// What a key table holds, in a key table file's layout.
pub struct Mirror {
    entries: SecretBytes,
    key_bytes: usize,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("entries", &(self.entries.len() / self.key_bytes.max(1)))
            .finish_non_exhaustive()
    }
}

/// What a reload did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Reload {
    /// Keys loaded under tags that had none.
    pub loaded: usize,
    /// Keys replaced by another.
    pub replaced: usize,
    /// Keys destroyed (their entry became zeros or left the file).
    pub destroyed: usize,
    /// The first entry that could not be changed, and why.
    pub failed: Option<(u32, Error)>,
}

impl Mirror {
    /// An empty table's mirror, for keys of `key_bytes` bytes.
    pub fn new(key_bytes: usize) -> Mirror {
        Mirror {
            entries: SecretBytes::zeroed(0),
            key_bytes,
        }
    }

    /// The key under `tag` in `table` (a file's contents); `None` past the end or for zeros.
    fn entry(table: &[u8], tag: usize, key_bytes: usize) -> Option<&[u8]> {
        let key = table.get(tag * key_bytes..(tag + 1) * key_bytes)?;
        (key.iter().fold(0u8, |acc, b| acc | b) != 0).then_some(key)
    }
}

/// Read a key table file from `source`: a whole number of `key_bytes`-byte entries, at least
/// one and at most `max`. Reading stops one byte past `max` entries, so a huge or endless file
/// (a FIFO, `/dev/zero`) costs nothing. The bytes are zeroized on drop.
///
/// Errors: [`Error::Io`] if reading fails; [`Error::Refused`] saying what is wrong with the
/// contents ("holds ...", to follow the file's name).
pub fn read_key_table(
    source: impl Read,
    key_bytes: usize,
    max: usize,
) -> Result<SecretBytes, Error> {
    if key_bytes == 0 {
        return Err(Error::Refused("keys of 0 bytes".into()));
    }
    // Saturating: a key size and count from the command line must not overflow into a small
    // limit (at usize::MAX the file's own end is the limit).
    let limit = max.saturating_mul(key_bytes);
    let bytes = SecretBytes::read_from(source, limit.saturating_add(1)).map_err(Error::Io)?;
    if bytes.is_empty() || bytes.len() % key_bytes != 0 {
        return Err(Error::Refused(format!(
            "holds {} bytes, not a whole number of {key_bytes}-byte keys",
            bytes.len()
        )));
    }
    if bytes.len() > limit {
        return Err(Error::Refused(format!(
            "holds more than the {max} keys allowed"
        )));
    }
    Ok(bytes)
}

impl KeyTable {
    /// Load, replace and destroy keys so that the table holds what `file` (a key table file's
    /// contents, a whole number of entries of `mirror`'s key size) lists; `mirror` is what the
    /// table held after the last reload.
    pub fn reload(&self, mirror: &mut Mirror, file: &[u8]) -> Reload {
        // Thousands of key schedules: one stack scrub for all of them.
        sectorcrypt_secret::scrubbing_once(|| self.reload_entries(mirror, file))
    }

    fn reload_entries(&self, mirror: &mut Mirror, file: &[u8]) -> Reload {
        let key_bytes = mirror.key_bytes;
        let mut done = Reload::default();
        if mirror.entries.len() < file.len() {
            mirror.entries.resize(file.len());
        }
        for tag in 0..mirror.entries.len() / key_bytes {
            let slot = tag * key_bytes..(tag + 1) * key_bytes;
            let wanted = Mirror::entry(file, tag, key_bytes);
            // Whether the table holds a key under `tag`, and whether it is already the wanted one.
            let (had, same) = match (Mirror::entry(&mirror.entries, tag, key_bytes), wanted) {
                (Some(a), Some(b)) => (true, bool::from(a.ct_eq(b))),
                (Some(_), None) => (true, false),
                (None, w) => (false, w.is_none()),
            };
            if same {
                continue;
            }
            if had {
                if let Err(e) = self.destroy(tag as u32) {
                    done.failed.get_or_insert((tag as u32, e));
                    continue;
                }
                mirror.entries[slot.clone()].fill(0);
                if wanted.is_none() {
                    done.destroyed += 1;
                    continue;
                }
            }
            let Some(key) = wanted else { continue };
            match self.load(tag as u32, key) {
                Ok(()) => {
                    mirror.entries[slot].copy_from_slice(key);
                    if had {
                        done.replaced += 1;
                    } else {
                        done.loaded += 1;
                    }
                }
                Err(e) => {
                    done.failed.get_or_insert((tag as u32, e));
                }
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: usize = 64;

    fn file(entries: &[u8]) -> Vec<u8> {
        // Entry i: 64 bytes of `entries[i]` (0 = no key).
        entries.iter().flat_map(|&b| [b; KEY]).collect()
    }

    fn table(capacity: usize) -> KeyTable {
        super::super::tests::table(capacity).0
    }

    #[test]
    fn reloads_load_replace_and_destroy_entry_by_entry() {
        let t = table(8);
        let mut m = Mirror::new(KEY);
        let c = t.reload(&mut m, &file(&[1, 0, 3]));
        assert_eq!((c.loaded, c.replaced, c.destroyed), (2, 0, 0));
        assert!(c.failed.is_none());
        assert_eq!(t.tags(), [0, 2]);
        t.write(2, &[9; 512], 0).unwrap();

        // Tag 0 destroyed, tag 2 replaced, tag 3 added (the file grew), tag 1 still empty.
        let c = t.reload(&mut m, &file(&[0, 0, 4, 5]));
        assert_eq!((c.loaded, c.replaced, c.destroyed), (1, 1, 1));
        assert_eq!(t.tags(), [2, 3]);
        let mut back = [0u8; 512];
        t.read(2, &mut back, 0).unwrap();
        assert_ne!(back, [9; 512], "tag 2 has a new key");
        // The same file again changes nothing; a shorter file destroys what it no longer has.
        let c = t.reload(&mut m, &file(&[0, 0, 4, 5]));
        assert_eq!((c.loaded, c.replaced, c.destroyed), (0, 0, 0));
        let c = t.reload(&mut m, &file(&[0, 0, 4]));
        assert_eq!((c.loaded, c.replaced, c.destroyed), (0, 0, 1));
        assert_eq!(t.tags(), [2]);
    }

    #[test]
    fn a_failed_entry_is_tried_again_at_the_next_reload() {
        let t = table(2);
        let mut m = Mirror::new(KEY);
        // Tags 0 and 1 only: tag 2 fails, and the mirror records only what loaded.
        let c = t.reload(&mut m, &file(&[1, 2, 3]));
        assert_eq!(c.loaded, 2);
        assert_eq!(c.failed.as_ref().map(|(tag, _)| *tag), Some(2));
        assert_eq!(t.tags(), [0, 1]);
        // The same file again: the loaded entries are unchanged, the failed one is tried again.
        let c = t.reload(&mut m, &file(&[1, 2, 3]));
        assert_eq!((c.loaded, c.replaced, c.destroyed), (0, 0, 0));
        assert_eq!(c.failed.as_ref().map(|(tag, _)| *tag), Some(2));
        // Dropped from the file, it is no longer tried.
        let c = t.reload(&mut m, &file(&[1, 2]));
        assert!(c.failed.is_none());
        assert_eq!(t.tags(), [0, 1]);
    }
}
