//! `sectorcrypt_fuzzing::integrity_device`: see its documentation for what the input is.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sectorcrypt_fuzzing::integrity_device(data));
