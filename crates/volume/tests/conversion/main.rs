//! The in-place conversion engine, as one test binary: conversions in place (detached or
//! attached header; checksum resilience) and the data-shift conversions (header on the device),
//! each crash-swept on the cache model and checked against the real cryptsetup both ways; and each
//! served while it runs.

mod common;
mod datashift;
mod in_place;
mod online;
