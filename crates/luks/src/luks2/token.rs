//! Tokens: JSON objects in the header that say where a passphrase comes from or, for types
//! cryptsetup does not know, what else a volume needs (cryptsetup keeps and ignores a token of
//! an unknown type, so a tool may keep its own parameters there without breaking
//! compatibility; `luks2-` types are reserved for cryptsetup's own).

use sectorcrypt_storage::Storage;
use serde_json::Value;

use super::write::write_metadata;
use super::Header;
use crate::Error;

/// Tokens a header holds at most (`LUKS2_TOKENS_MAX`).
pub const TOKENS_MAX: u32 = 32;

impl Header {
    /// The first token whose `type` is `kind`, with its number.
    pub fn token_of_type(&self, kind: &str) -> Option<(u32, &Value)> {
        self.metadata()
            .tokens
            .iter()
            .find(|(_, t)| t.get("type").and_then(Value::as_str) == Some(kind))
    }

    /// Store `token` (an object with a string `type` and a `keyslots` array) as token `id`, or
    /// the first free number, in both header copies on `dev` (`cryptsetup token import`).
    /// Returns the header as written and the token's number.
    ///
    /// Errors: [`Error::Unsupported`] for a token that is not such an object, a taken or
    /// out-of-range number, or a reserved type; [`Error::Io`] for a failed write.
    pub fn import_token(
        &self,
        dev: &dyn Storage,
        id: Option<u32>,
        token: Value,
    ) -> Result<(Header, u32), Error> {
        self.put_token(dev, id, token, false)
    }

    /// [`Header::import_token`], or with `replace` over token `id` if it exists (`cryptsetup
    /// token import --token-replace`). cryptsetup's built-in `luks2-keyring` type is taken with
    /// its `key_description`; other `luks2-` types are refused as cryptsetup refuses them.
    pub fn put_token(
        &self,
        dev: &dyn Storage,
        id: Option<u32>,
        token: Value,
        replace: bool,
    ) -> Result<(Header, u32), Error> {
        let refuse = |why: String| Err(Error::Unsupported(why));
        let kind = token.get("type").and_then(Value::as_str).unwrap_or("");
        if kind.is_empty() || !token.get("keyslots").is_some_and(Value::is_array) {
            return refuse("a token is an object with a \"type\" and a \"keyslots\" array".into());
        }
        let keyring =
            kind == "luks2-keyring" && token.get("key_description").is_some_and(Value::is_string);
        if kind.starts_with("luks2-") && !keyring {
            return refuse(format!(
                "token type {kind}: luks2- types are cryptsetup's own (luks2-keyring needs a \
                 key_description)"
            ));
        }
        let mut md = self.metadata().clone();
        if replace {
            if let Some(n) = id {
                md.tokens.0.retain(|(t, _)| *t != n);
            }
        }
        let taken = |n: u32| md.tokens.get(n).is_some();
        let id = match id {
            Some(n) if n >= TOKENS_MAX => return refuse(format!("token {n} (0 to 31)")),
            Some(n) if taken(n) => return refuse(format!("token {n} is in use")),
            Some(n) => n,
            None => match (0..TOKENS_MAX).find(|&n| !taken(n)) {
                Some(n) => n,
                None => return refuse("every token number is taken".into()),
            },
        };
        md.tokens.0.push((id, token));
        md.tokens.0.sort_by_key(|(n, _)| *n);
        write_metadata(dev, &self.next_fields(), &md)?;
        Ok((Header::read(dev)?, id))
    }

    /// Add keyslot `slot` to token `id`'s keyslots in this header's metadata, **in memory
    /// only**: for a header staged to be written whole (the keyslot of a new volume key that a
    /// reencryption adds for a token's passphrase, so that the token still releases it once the
    /// old keyslots are gone).
    ///
    /// Errors: [`Error::Unsupported`] if there is no such token or keyslot.
    pub fn assign_token(&mut self, id: u32, slot: usize) -> Result<(), Error> {
        if u32::try_from(slot)
            .ok()
            .and_then(|s| self.metadata.keyslots.get(s))
            .is_none()
        {
            return Err(Error::Unsupported(format!("keyslot {slot} is not in use")));
        }
        let Some((_, token)) = self.metadata.tokens.0.iter_mut().find(|(n, _)| *n == id) else {
            return Err(Error::Unsupported(format!("token {id} is not in use")));
        };
        let Some(list) = token.get_mut("keyslots").and_then(Value::as_array_mut) else {
            return Err(Error::Unsupported(format!(
                "token {id} has no keyslot list"
            )));
        };
        let name = Value::from(slot.to_string());
        if !list.contains(&name) {
            list.push(name);
        }
        Ok(())
    }

    /// Token `id`, if the header has it.
    pub fn token(&self, id: u32) -> Option<&Value> {
        self.metadata().tokens.get(id)
    }

    /// Remove token `id` from both header copies on `dev` (`cryptsetup token remove`). Returns
    /// the header as written.
    ///
    /// Errors: [`Error::Unsupported`] if there is no such token; [`Error::Io`] for a failed write.
    pub fn remove_token(&self, dev: &dyn Storage, id: u32) -> Result<Header, Error> {
        let mut md = self.metadata().clone();
        if md.tokens.get(id).is_none() {
            return Err(Error::Unsupported(format!("token {id} is not in use")));
        }
        md.tokens.0.retain(|(n, _)| *n != id);
        write_metadata(dev, &self.next_fields(), &md)?;
        Header::read(dev)
    }

    /// Replace token `id` with `token` (of the same type) in both header copies on `dev`.
    /// Returns the header as written.
    ///
    /// Errors: [`Error::Unsupported`] if there is no such token or the type would change;
    /// [`Error::Io`] for a failed write.
    pub fn update_token(&self, dev: &dyn Storage, id: u32, token: Value) -> Result<Header, Error> {
        let mut md = self.metadata().clone();
        let kind = |t: &Value| t.get("type").and_then(Value::as_str).map(str::to_owned);
        let Some((_, slot)) = md.tokens.0.iter_mut().find(|(n, _)| *n == id) else {
            return Err(Error::Unsupported(format!("token {id} does not exist")));
        };
        if kind(slot) != kind(&token) {
            return Err(Error::Unsupported(format!(
                "token {id} would change its type"
            )));
        }
        *slot = token;
        write_metadata(dev, &self.next_fields(), &md)?;
        Header::read(dev)
    }
}

#[cfg(test)]
mod tests {
    use sectorcrypt_storage::MemStorage;
    use serde_json::json;

    use crate::{FormatOptions, Header as AnyHeader, PbkdfChoice, PbkdfOptions};

    use super::*;

    fn formatted() -> (MemStorage, Header) {
        let dev = MemStorage::new(vec![0; 2 << 20]);
        let options = FormatOptions {
            version: 2,
            pbkdf: PbkdfOptions {
                kind: Some(PbkdfChoice::Pbkdf2),
                force_iterations: Some(1000),
                ..Default::default()
            },
            keyslots_size: Some(512 << 10),
            ..Default::default()
        };
        let (h, _) = crate::format(&dev, 2 << 20, &options, b"pass").unwrap();
        let AnyHeader::Luks2(h) = h else {
            unreachable!()
        };
        (dev, *h)
    }

    #[test]
    fn a_token_is_stored_in_both_copies_and_found_by_type() {
        let (dev, h) = formatted();
        let token = json!({"type": "example-tool", "keyslots": [], "x": 1});
        let (h2, id) = h.import_token(&dev, None, token.clone()).unwrap();
        assert_eq!(id, 0);
        assert_eq!(h2.seqid(), h.seqid() + 1);
        let read = Header::read(&dev).unwrap();
        assert!(read.health().primary.is_valid() && read.health().secondary.is_valid());
        assert_eq!(read.token_of_type("example-tool"), Some((0, &token)));
        let (_, next) = read.import_token(&dev, None, token.clone()).unwrap();
        assert_eq!(next, 1);
    }

    #[test]
    fn bad_tokens_are_refused_and_nothing_is_written() {
        let (dev, h) = formatted();
        let before = dev.contents();
        for (id, token) in [
            (None, json!({"keyslots": []})),
            (None, json!({"type": "t"})),
            (None, json!({"type": "luks2-keyring", "keyslots": []})),
            (
                None,
                json!({"type": "luks2-other", "keyslots": [], "key_description": "k"}),
            ),
            (Some(TOKENS_MAX), json!({"type": "t", "keyslots": []})),
        ] {
            assert!(matches!(
                h.import_token(&dev, id, token),
                Err(Error::Unsupported(_))
            ));
        }
        assert!(dev.contents() == before);
        let (h, _) = h
            .import_token(&dev, Some(5), json!({"type": "t", "keyslots": []}))
            .unwrap();
        assert!(h
            .import_token(&dev, Some(5), json!({"type": "t", "keyslots": []}))
            .is_err());
        let new = json!({"type": "t", "keyslots": [], "n": 2});
        let h = h.update_token(&dev, 5, new.clone()).unwrap();
        assert_eq!(h.token_of_type("t"), Some((5, &new)));
        assert!(h
            .update_token(&dev, 5, json!({"type": "u", "keyslots": []}))
            .is_err());
        assert!(h.update_token(&dev, 6, new).is_err());
    }
}
