//! How a conversion protects the step it is in against a crash, as the user names it
//! (cryptsetup's `--resilience` names), and which protection each kind of conversion takes.
//!
//! In place (encrypt with a detached header, reencrypt, decrypt with a detached header) a step is
//! protected by `checksum` (a hash per block, the default), `journal` (the step's old data copied
//! into the header first) or `none`. Decrypting a volume whose header is on it moves the data and
//! converts its first chunk last, in place: that chunk needs `datashift-checksum` (default) or
//! `datashift-journal`, never nothing. An encryption that moves the data (`--reduce-device-size`)
//! is protected by its own copy and takes no choice.

use std::str::FromStr;

use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::reencrypt::{InitOptions, ResilienceKind};

use crate::Error;

/// A `--resilience` choice: the protection, and whether it was named for a data shift
/// (`datashift-checksum`, `datashift-journal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resilience {
    /// The protection.
    pub kind: ResilienceKind,
    /// Named `datashift-*`.
    pub datashift: bool,
}

impl FromStr for Resilience {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, datashift) = match s.strip_prefix("datashift-") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let kind =
            match name {
                "checksum" => ResilienceKind::Checksum(Hash::Sha256),
                "journal" => ResilienceKind::Journal,
                "none" if !datashift => ResilienceKind::None,
                "datashift" => return Err(
                    "datashift is chosen by itself: encrypt --reduce-device-size shifts the data"
                        .into(),
                ),
                _ => {
                    return Err(format!(
                    "unknown resilience '{s}' (use checksum, journal or none; datashift-checksum \
                     or datashift-journal to decrypt a volume whose header is on it)"
                ))
                }
            };
        Ok(Resilience { kind, datashift })
    }
}

/// The protection of a conversion in place: `datashift-*` is refused there.
pub fn in_place(choice: Option<Resilience>) -> Result<ResilienceKind, Error> {
    match choice {
        Some(Resilience {
            datashift: true, ..
        }) => Err(Error::Refused(
            "datashift-checksum and datashift-journal protect the decryption of a volume whose \
             header is on it (decrypt --header NEWFILE); in place use checksum, journal or none"
                .into(),
        )),
        Some(r) => Ok(r.kind),
        None => Ok(InitOptions::default().resilience),
    }
}

/// An encryption that moves the data takes no choice: its copy protects it.
pub fn shifted_encryption(choice: Option<Resilience>) -> Result<(), Error> {
    match choice {
        Some(_) => Err(Error::Refused(
            "--resilience applies to conversions in place and to decrypting a volume whose \
             header is on it; an encryption that moves the data (--reduce-device-size) is \
             protected by its own copy"
                .into(),
        )),
        None => Ok(()),
    }
}

/// The protection of the moved first chunk when a volume whose header is on it is decrypted:
/// anything but nothing.
pub fn exported_decryption(choice: Option<Resilience>) -> Result<ResilienceKind, Error> {
    match choice {
        Some(Resilience {
            kind: ResilienceKind::None,
            ..
        }) => Err(Error::Refused(
            "the moved first chunk of this decryption needs protection: --resilience \
             datashift-checksum (default) or datashift-journal"
                .into(),
        )),
        Some(r) => Ok(r.kind),
        None => Ok(InitOptions::default().resilience),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_conversion_takes_the_protections_it_can_use() {
        let parse = |s: &str| s.parse::<Resilience>();
        assert!(parse("datashift").is_err() && parse("datashift-none").is_err());
        assert!(parse("bogus").is_err());
        let journal = parse("journal").unwrap();
        let shift_journal = parse("datashift-journal").unwrap();
        let none = parse("none").unwrap();
        assert_eq!(in_place(Some(journal)).unwrap(), ResilienceKind::Journal);
        assert!(in_place(Some(shift_journal)).is_err());
        assert_eq!(in_place(Some(none)).unwrap(), ResilienceKind::None);
        assert_eq!(in_place(None).unwrap(), InitOptions::default().resilience);
        assert!(shifted_encryption(Some(journal)).is_err() && shifted_encryption(None).is_ok());
        assert_eq!(
            exported_decryption(Some(shift_journal)).unwrap(),
            ResilienceKind::Journal
        );
        assert!(exported_decryption(Some(none)).is_err());
        assert_eq!(
            exported_decryption(None).unwrap(),
            InitOptions::default().resilience
        );
    }
}
