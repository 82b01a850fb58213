//! The command-line tests, as one test binary (one link of the whole workspace instead of six):
//! `sectorcrypt` run as a user and a script would, against the real tools. Each module is one
//! family of commands.

mod basics;
#[cfg(feature = "rbd")]
mod ceph;
#[cfg(feature = "rbd")]
mod ceph_faults;
mod ciphers;
mod common;
mod convert;
mod dmcrypt;
mod flash;
mod fuse;
mod integrity;
mod kpio;
mod locks;
mod luks_convert;
mod luks_read;
mod luks_write;
mod manual;
mod mtd;
mod nbd;
mod online_reencrypt;
mod parity;
mod secrets;
mod serve_converting;
mod study;
mod tls;
mod tokens;
