//! The CBOR CTAP2 speaks (RFC 8949 as CTAP2 restricts it): integers, byte and text strings,
//! arrays, maps, booleans and null, definite lengths only, encoded canonically (map keys sorted
//! by their encoding's length, then its bytes). What a security key sends is decoded with every
//! length checked against the bytes present and a nesting limit, so that hostile answers fail
//! with an error.

use crate::Error;

/// Nesting deeper than this is refused (CTAP2's own limit is 4).
const MAX_DEPTH: usize = 16;

/// A CBOR data item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cbor {
    Int(i64),
    Bytes(Vec<u8>),
    Text(String),
    Array(Vec<Cbor>),
    Map(Vec<(Cbor, Cbor)>),
    Bool(bool),
    Null,
}

fn bad(why: &str) -> Error {
    Error::Failed(format!("the security key sent malformed CBOR: {why}"))
}

impl Cbor {
    /// Canonical encoding.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Cbor::Int(n) if *n >= 0 => head(out, 0, *n as u64),
            Cbor::Int(n) => head(out, 1, !(*n) as u64),
            Cbor::Bytes(b) => {
                head(out, 2, b.len() as u64);
                out.extend_from_slice(b);
            }
            Cbor::Text(t) => {
                head(out, 3, t.len() as u64);
                out.extend_from_slice(t.as_bytes());
            }
            Cbor::Array(items) => {
                head(out, 4, items.len() as u64);
                for i in items {
                    i.encode_into(out);
                }
            }
            Cbor::Map(entries) => {
                let mut encoded: Vec<(Vec<u8>, Vec<u8>)> = entries
                    .iter()
                    .map(|(k, v)| (k.encode(), v.encode()))
                    .collect();
                encoded.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then_with(|| a.0.cmp(&b.0)));
                head(out, 5, encoded.len() as u64);
                for (k, v) in encoded {
                    out.extend(k);
                    out.extend(v);
                }
            }
            Cbor::Bool(false) => out.push(0xF4),
            Cbor::Bool(true) => out.push(0xF5),
            Cbor::Null => out.push(0xF6),
        }
    }

    /// Decode exactly one item filling `bytes`.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Cbor, Error> {
        let mut at = 0;
        let v = item(bytes, &mut at, 0)?;
        if at != bytes.len() {
            return Err(bad("bytes after the item"));
        }
        Ok(v)
    }

    /// Decode one item at the start of `bytes`; the item and the bytes after it.
    pub(crate) fn decode_prefix(bytes: &[u8]) -> Result<(Cbor, &[u8]), Error> {
        let mut at = 0;
        let v = item(bytes, &mut at, 0)?;
        Ok((v, &bytes[at..]))
    }

    /// The value under `key` in a map.
    pub(crate) fn get(&self, key: &Cbor) -> Option<&Cbor> {
        match self {
            Cbor::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value under the integer key `key`.
    pub(crate) fn at(&self, key: i64) -> Option<&Cbor> {
        self.get(&Cbor::Int(key))
    }

    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Cbor::Bytes(b) => Some(b),
            _ => None,
        }
    }

    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Cbor::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// A map from `(key, value)` pairs with integer keys.
    pub(crate) fn int_map(entries: Vec<(i64, Cbor)>) -> Cbor {
        Cbor::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Cbor::Int(k), v))
                .collect(),
        )
    }

    /// A map from `(key, value)` pairs with text keys.
    pub(crate) fn text_map(entries: Vec<(&str, Cbor)>) -> Cbor {
        Cbor::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Cbor::Text(k.to_string()), v))
                .collect(),
        )
    }
}

fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xFF => out.extend([m | 24, n as u8]),
        0x100..=0xFFFF => {
            out.push(m | 25);
            out.extend((n as u16).to_be_bytes());
        }
        0x1_0000..=0xFFFF_FFFF => {
            out.push(m | 26);
            out.extend((n as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend(n.to_be_bytes());
        }
    }
}

fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], Error> {
    let end = at
        .checked_add(n)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad("cut short"))?;
    let s = &bytes[*at..end];
    *at = end;
    Ok(s)
}

fn item(bytes: &[u8], at: &mut usize, depth: usize) -> Result<Cbor, Error> {
    if depth > MAX_DEPTH {
        return Err(bad("nested too deep"));
    }
    let first = take(bytes, at, 1)?[0];
    let (major, info) = (first >> 5, first & 0x1F);
    let arg = match info {
        0..=23 => u64::from(info),
        24 => u64::from(take(bytes, at, 1)?[0]),
        25 => u64::from(u16::from_be_bytes(
            take(bytes, at, 2)?.try_into().expect("2"),
        )),
        26 => u64::from(u32::from_be_bytes(
            take(bytes, at, 4)?.try_into().expect("4"),
        )),
        27 => u64::from_be_bytes(take(bytes, at, 8)?.try_into().expect("8")),
        _ => return Err(bad("an indefinite or reserved length")),
    };
    // A count can never exceed the bytes left (each element takes at least one).
    let count = |n: u64| -> Result<usize, Error> {
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= bytes.len() - *at)
            .ok_or_else(|| bad("a length beyond the message"))
    };
    Ok(match major {
        0 => Cbor::Int(i64::try_from(arg).map_err(|_| bad("an integer too large"))?),
        1 => Cbor::Int(-1 - i64::try_from(arg).map_err(|_| bad("an integer too small"))?),
        2 => Cbor::Bytes(take(bytes, at, count(arg)?)?.to_vec()),
        3 => Cbor::Text(
            String::from_utf8(take(bytes, at, count(arg)?)?.to_vec())
                .map_err(|_| bad("text that is not UTF-8"))?,
        ),
        4 => {
            let n = count(arg)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(item(bytes, at, depth + 1)?);
            }
            Cbor::Array(items)
        }
        5 => {
            let n = count(arg)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let k = item(bytes, at, depth + 1)?;
                let v = item(bytes, at, depth + 1)?;
                entries.push((k, v));
            }
            Cbor::Map(entries)
        }
        7 => match info {
            20 => Cbor::Bool(false),
            21 => Cbor::Bool(true),
            22 => Cbor::Null,
            _ => return Err(bad("a float or unknown simple value")),
        },
        _ => return Err(bad("a tag")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8949 Appendix A examples (the kinds CTAP2 uses).
    #[test]
    fn rfc_8949_examples_encode_and_decode() {
        let cases: Vec<(Cbor, &str)> = vec![
            (Cbor::Int(0), "00"),
            (Cbor::Int(23), "17"),
            (Cbor::Int(24), "1818"),
            (Cbor::Int(1000), "1903e8"),
            (Cbor::Int(1_000_000), "1a000f4240"),
            (Cbor::Int(1_000_000_000_000), "1b000000e8d4a51000"),
            (Cbor::Int(-1), "20"),
            (Cbor::Int(-1000), "3903e7"),
            (Cbor::Bool(false), "f4"),
            (Cbor::Bool(true), "f5"),
            (Cbor::Null, "f6"),
            (Cbor::Bytes(vec![1, 2, 3, 4]), "4401020304"),
            (Cbor::Text("IETF".into()), "6449455446"),
            (Cbor::Text("\u{fc}".into()), "62c3bc"),
            (
                Cbor::Array(vec![
                    Cbor::Int(1),
                    Cbor::Array(vec![Cbor::Int(2), Cbor::Int(3)]),
                ]),
                "8201820203",
            ),
            (
                Cbor::text_map(vec![
                    ("a", Cbor::Int(1)),
                    ("b", Cbor::Array(vec![Cbor::Int(2), Cbor::Int(3)])),
                ]),
                "a26161016162820203",
            ),
        ];
        for (value, hex_text) in cases {
            assert_eq!(hex::encode(value.encode()), hex_text, "{value:?}");
            assert_eq!(
                Cbor::decode(&hex::decode(hex_text).unwrap()).unwrap(),
                value
            );
        }
    }

    #[test]
    fn canonical_maps_sort_keys_by_length_then_bytes() {
        let m = Cbor::Map(vec![
            (Cbor::Text("bb".into()), Cbor::Int(1)),
            (Cbor::Int(-1), Cbor::Int(2)),
            (Cbor::Int(3), Cbor::Int(3)),
            (Cbor::Text("a".into()), Cbor::Int(4)),
        ]);
        // 03 < 20 (one byte each), then "a" (61 61), then "bb" (62 62 62).
        assert_eq!(hex::encode(m.encode()), "a40303200261610462626201");
    }

    #[test]
    fn hostile_input_is_refused() {
        for bad in [
            "",
            "18",
            "5affffffff00",
            "9b00000000ffffffff",
            "bf",
            "c1",
            "f9",
            "62c3",
            "6280ff",
            "0001",
            "3bffffffffffffffff",
        ] {
            assert!(Cbor::decode(&hex::decode(bad).unwrap()).is_err(), "{bad}");
        }
        let deep = "81".repeat(40) + "00";
        assert!(Cbor::decode(&hex::decode(deep).unwrap()).is_err());
    }

    /// Against python-fido2's CBOR (an independent implementation of CTAP2's canonical form):
    /// random CTAP-like items encoded here decode there and re-encode to the same bytes, and
    /// python-fido2's own random items decode here and re-encode to its bytes.
    #[test]
    fn canonical_cbor_matches_python_fido2() {
        fn random(seed: &mut u64, depth: u32) -> Cbor {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = *seed >> 33;
            match (r % 7, depth) {
                (0, _) => Cbor::Int((r as i64 % 2_000_000_000_000) - 1_000_000_000_000),
                (1, _) => Cbor::Bytes((0..r % 70).map(|i| i as u8).collect()),
                (2, _) => Cbor::Text(format!("t{}", r % 1000)),
                (3, _) => Cbor::Bool(r.is_multiple_of(2)),
                (4, d) if d < 3 => Cbor::Array((0..r % 5).map(|_| random(seed, d + 1)).collect()),
                (_, d) if d < 3 => Cbor::Map(
                    (0..r % 5)
                        .map(|i| {
                            let k = if r.is_multiple_of(2) {
                                Cbor::Int(i as i64 - 2)
                            } else {
                                Cbor::Text(format!("k{i}"))
                            };
                            (k, random(seed, d + 1))
                        })
                        .collect(),
                ),
                _ => Cbor::Int(r as i64 % 30),
            }
        }
        let mut seed = 7u64;
        let ours: Vec<Vec<u8>> = (0..200).map(|_| random(&mut seed, 0).encode()).collect();
        let input: String = ours.iter().map(|e| hex::encode(e) + "\n").collect();
        let script = r#"
import sys, random
from fido2 import cbor
for line in sys.stdin:
    print(cbor.encode(cbor.decode(bytes.fromhex(line.strip()))).hex())
rng = random.Random(11)
def item(d):
    k = rng.randrange(6)
    if k == 0: return rng.randrange(-2**40, 2**40)
    if k == 1: return bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
    if k == 2: return "s%d" % rng.randrange(10**6)
    if k == 3: return rng.random() < 0.5
    if d > 2: return 1
    if k == 4: return [item(d + 1) for _ in range(rng.randrange(4))]
    return {(i - 3 if rng.random() < 0.5 else "k%d" % i): item(d + 1) for i in range(rng.randrange(4))}
for _ in range(200):
    print("py", cbor.encode(item(0)).hex())
"#;
        let text = super::super::python_fido2(script, &input);
        let (theirs, round): (Vec<&str>, Vec<&str>) =
            text.lines().partition(|l| l.starts_with("py "));
        assert_eq!(round.len(), ours.len());
        for (ours, back) in ours.iter().zip(round) {
            assert_eq!(
                hex::encode(ours),
                back,
                "python-fido2 re-encodes ours differently"
            );
        }
        assert_eq!(theirs.len(), 200);
        for line in theirs {
            let bytes = hex::decode(&line[3..]).unwrap();
            assert_eq!(Cbor::decode(&bytes).unwrap().encode(), bytes, "{line}");
        }
    }
}
