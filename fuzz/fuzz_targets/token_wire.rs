//! `sectorcrypt_fuzzing::token_wire`: see its documentation for what the input is.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sectorcrypt_fuzzing::token_wire(data));
