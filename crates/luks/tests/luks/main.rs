//! The LUKS crate's integration tests, as one test binary (one link instead of nine): headers and
//! keyslots against the real cryptsetup, crash sweeps of every header write and conversion, and
//! hostile headers. Each module is one family; the support modules are what they share.

mod luks1_support;
mod luks2_support;

mod convert_crash;
mod luks1;
mod luks1_write;
mod luks1_write_crash;
mod luks2;
mod luks2_fuzz;
mod luks2_reencrypt;
mod luks2_write;
mod luks2_write_crash;
