//! Volume UUIDs as cryptsetup writes them: random version-4 UUIDs in lower case, and `--uuid`
//! values checked the way libuuid's `uuid_parse` checks them.

use rand::RngCore;

use crate::error::Error;

/// A random version-4 UUID, as libuuid's `uuid_generate` makes one from a random source.
pub fn random() -> String {
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A UUID as `uuid_parse` accepts it (36 characters, dashes at 8, 13, 18 and 23, hex digits
/// elsewhere), returned as `uuid_unparse` writes it: lower case.
pub fn normalize(uuid: &str) -> Result<String, Error> {
    let bytes = uuid.as_bytes();
    let well_formed = bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    if !well_formed {
        return Err(Error::Unsupported(format!(
            "the UUID '{uuid}' (use the form 01234567-89ab-cdef-0123-456789abcdef)"
        )));
    }
    Ok(uuid.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_uuids_are_version_4_and_normal() {
        let u = random();
        assert_eq!(normalize(&u).unwrap(), u);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(random(), u);
    }

    #[test]
    fn normalize_checks_the_form() {
        assert_eq!(
            normalize("0123ABCD-89ab-cdef-0123-456789ABCDEF").unwrap(),
            "0123abcd-89ab-cdef-0123-456789abcdef"
        );
        for bad in [
            "",
            "0123abcd89ab-cdef-0123-456789abcdef0",
            "0123abcd-89ab-cdef-0123-456789abcdeg",
            "0123abcd-89ab-cdef-0123-456789abcde",
        ] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
    }
}
