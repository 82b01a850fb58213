//! The token types' parsers of bytes that come from devices and servers (a FIDO2 key's CBOR and
//! CTAPHID reports, a tang server's HTTP replies and JOSE objects, a TPM's structures), and of
//! the tokens themselves, for the fuzz target `token_wire` (`crates/fuzzing`). Not an API.

use serde_json::Value;

use crate::clevis::http::{complete, parse_reply};
use crate::clevis::jose::Jwe;
use crate::clevis::tang::Advertisement;
use crate::fido2::cbor::Cbor;
use crate::fido2::ctap::{credential_id, hmac_secret_output};
use crate::fido2::hid::Reassembly;
use crate::tpm2::device::{ecc_point, Reader};

/// The first byte picks the parser, the rest is its input. Whatever a parser accepts must hold
/// up afterwards: CBOR re-encodes canonically to bytes that decode to the same item.
pub fn wire(data: &[u8]) {
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            if let Ok(item) = Cbor::decode(input) {
                let canonical = item.encode();
                let again = Cbor::decode(&canonical).expect("our own encoding decodes");
                assert_eq!(again.encode(), canonical, "canonical CBOR is a fixed point");
            }
        }
        1 => {
            let mut reassembly = Reassembly::new([1, 2, 3, 4]);
            for chunk in input.chunks_exact(64) {
                let report: &[u8; 64] = chunk.try_into().expect("64 bytes");
                if reassembly.push(report).is_err() {
                    break;
                }
            }
        }
        2 => {
            let _ = complete(input);
            let _ = parse_reply(input);
        }
        3 => {
            let _ = credential_id(input);
            let _ = hmac_secret_output(input);
        }
        4 => {
            let mut rd = Reader::new(input);
            let _ = rd.tpm2b_raw().and_then(|_| rd.tpm2b_raw());
            let _ = ecc_point(input);
        }
        _ => {
            if let Ok(v) = serde_json::from_slice::<Value>(input) {
                let _ = Jwe::parse(&v);
                let _ = Advertisement::verify(&v);
                let _ = crate::validate(&v);
            }
        }
    }
}
