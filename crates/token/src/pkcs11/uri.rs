//! PKCS#11 URIs (RFC 7512): which token, which object, and optionally which module. Only what
//! names a token or an object is kept; a PIN in the URI (`pin-value`) is refused, because the URI
//! is stored in the LUKS header in the clear.

use std::path::PathBuf;

use crate::Error;

/// A parsed `pkcs11:` URI. Every attribute left out matches anything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pkcs11Uri {
    /// The token's label (`token=`).
    pub token: Option<String>,
    /// The token's manufacturer (`manufacturer=`).
    pub manufacturer: Option<String>,
    /// The token's serial number (`serial=`).
    pub serial: Option<String>,
    /// The token's model (`model=`).
    pub model: Option<String>,
    /// The object's label (`object=`).
    pub object: Option<String>,
    /// The object's `CKA_ID` (`id=`, percent-encoded bytes).
    pub id: Option<Vec<u8>>,
    /// The object's class (`type=`: `cert`, `private`, `public`, `secret-key`, `data`).
    pub kind: Option<String>,
    /// The module to load (`module-path=`), instead of p11-kit's proxy of every registered one.
    pub module_path: Option<PathBuf>,
}

impl Pkcs11Uri {
    /// Parse `text`. Unknown attributes are ignored, as RFC 7512 asks of a consumer; repeated
    /// ones, bad percent-encoding and a PIN in the URI are refused.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = |why: String| Error::BadToken(format!("PKCS#11 URI {text:?}: {why}"));
        let Some(rest) = text.strip_prefix("pkcs11:") else {
            return Err(bad("it does not start with \"pkcs11:\"".into()));
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut uri = Pkcs11Uri::default();
        let pairs = path
            .split(';')
            .chain(query.split('&'))
            .filter(|p| !p.is_empty());
        for pair in pairs {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("attribute {pair:?} has no '='")))?;
            let bytes =
                percent_decode(value).ok_or_else(|| bad(format!("bad escape in {pair:?}")))?;
            let text_value = || {
                String::from_utf8(bytes.clone()).map_err(|_| bad(format!("{name} is not UTF-8")))
            };
            let fresh = match name {
                "token" => uri.token.replace(text_value()?).is_none(),
                "manufacturer" => uri.manufacturer.replace(text_value()?).is_none(),
                "serial" => uri.serial.replace(text_value()?).is_none(),
                "model" => uri.model.replace(text_value()?).is_none(),
                "object" => uri.object.replace(text_value()?).is_none(),
                "type" => uri.kind.replace(text_value()?).is_none(),
                "id" => uri.id.replace(bytes.clone()).is_none(),
                "module-path" => uri.module_path.replace(text_value()?.into()).is_none(),
                "pin-value" | "pin-source" => {
                    return Err(bad(
                        "a PIN does not belong in a URI that is stored in the header".into(),
                    ))
                }
                _ => true,
            };
            if !fresh {
                return Err(bad(format!("{name} is given twice")));
            }
        }
        if let Some(kind) = &uri.kind {
            if !["cert", "private", "public", "secret-key", "data"].contains(&kind.as_str()) {
                return Err(bad(format!("unknown object type {kind:?}")));
            }
        }
        Ok(uri)
    }

    /// Whether a token with this label, manufacturer, serial number and model is the one named.
    pub fn matches_token(
        &self,
        label: &str,
        manufacturer: &str,
        serial: &str,
        model: &str,
    ) -> bool {
        let is = |want: &Option<String>, have: &str| {
            want.as_deref().is_none_or(|w| w == have.trim_end())
        };
        is(&self.token, label)
            && is(&self.manufacturer, manufacturer)
            && is(&self.serial, serial)
            && is(&self.model, model)
    }

    /// The URI of a token (its attributes, percent-encoded) and an object on it: what
    /// enrolment stores.
    pub fn for_object(
        label: &str,
        manufacturer: &str,
        serial: &str,
        model: &str,
        id: Option<&[u8]>,
        object: Option<&str>,
    ) -> String {
        let mut s = format!(
            "pkcs11:model={};manufacturer={};serial={};token={}",
            percent_encode(model.trim_end().as_bytes()),
            percent_encode(manufacturer.trim_end().as_bytes()),
            percent_encode(serial.trim_end().as_bytes()),
            percent_encode(label.trim_end().as_bytes())
        );
        if let Some(id) = id {
            s += ";id=";
            // An id is bytes: every one escaped, as p11tool prints them.
            for b in id {
                s += &format!("%{b:02X}");
            }
        }
        if let Some(o) = object {
            s += &format!(";object={}", percent_encode(o.as_bytes()));
        }
        s
    }
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// RFC 7512's path characters stay; everything else is escaped.
fn percent_encode(b: &[u8]) -> String {
    b.iter()
        .map(|&c| {
            if c.is_ascii_alphanumeric() || b"-._~:[]@!$'()*+,=&".contains(&c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_parsed_and_unescaped() {
        let u = Pkcs11Uri::parse(
            "pkcs11:model=SoftHSM%20v2;manufacturer=SoftHSM%20project;serial=15ec;token=sc-test;\
             id=%01%ab;object=my%20key;type=cert?module-path=/usr/lib/x.so&x-unknown=1",
        )
        .unwrap();
        assert_eq!(u.model.as_deref(), Some("SoftHSM v2"));
        assert_eq!(u.token.as_deref(), Some("sc-test"));
        assert_eq!(u.id.as_deref(), Some(&[1u8, 0xab][..]));
        assert_eq!(u.object.as_deref(), Some("my key"));
        assert_eq!(u.kind.as_deref(), Some("cert"));
        assert_eq!(u.module_path, Some(PathBuf::from("/usr/lib/x.so")));
        assert!(u.matches_token("sc-test   ", "SoftHSM project", "15ec", "SoftHSM v2"));
        assert!(!u.matches_token("sc-test2", "SoftHSM project", "15ec", "SoftHSM v2"));
        assert_eq!(Pkcs11Uri::parse("pkcs11:").unwrap(), Pkcs11Uri::default());
    }

    #[test]
    fn bad_uris_are_refused() {
        for bad in [
            "pkcs12:token=a",
            "pkcs11:token",
            "pkcs11:id=%0",
            "pkcs11:id=%zz",
            "pkcs11:token=a;token=b",
            "pkcs11:token=a?pin-value=1234",
            "pkcs11:type=key",
            "pkcs11:token=%ff",
        ] {
            assert!(Pkcs11Uri::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_enrolled_uri_reads_back() {
        let text = Pkcs11Uri::for_object("my token;1", "M", "0001", "v2 ", Some(&[0, 255]), None);
        let u = Pkcs11Uri::parse(&text).unwrap();
        assert!(u.matches_token("my token;1", "M", "0001", "v2"));
        assert_eq!(u.id, Some(vec![0, 255]));
    }
}
