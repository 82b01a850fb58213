//! `sectorcrypt_fuzzing::flash_metadata`: see its documentation for what the input is.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sectorcrypt_fuzzing::flash_metadata(data));
