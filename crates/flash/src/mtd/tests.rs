//! The MTD backend's pure parts: its ABI against the kernel's headers (through a C compiler),
//! the geometry a `MEMGETINFO` answer gives, and what errnos and ECC counters mean.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use sectorcrypt_testkit::{ok, output, scratch, which};

use super::sys::{
    self, EccStats, EraseInfo64, MtdInfo, OobBuf64, ECCGETSTATS, MEMERASE64, MEMGETBADBLOCK,
    MEMGETINFO, MEMREADOOB64, MEMSETBADBLOCK,
};
use super::*;

/// `(C expression, value)` for the size of a structure and the offset of each of its fields.
macro_rules! layout {
    ($rust:ty, $c:literal { $($field:ident: $c_field:literal),* }) => {
        [
            (concat!("sizeof(struct ", $c, ")"), size_of::<$rust>() as u64),
            $((
                concat!("offsetof(struct ", $c, ", ", $c_field, ")"),
                offset_of!($rust, $field) as u64,
            ),)*
        ]
    };
}

/// Every number the backend takes from the kernel's headers, by the C expression that gives it.
fn ours() -> Vec<(&'static str, u64)> {
    let mut all = vec![
        ("MEMGETINFO", MEMGETINFO.into()),
        ("MEMERASE64", MEMERASE64.into()),
        ("MEMGETBADBLOCK", MEMGETBADBLOCK.into()),
        ("MEMSETBADBLOCK", MEMSETBADBLOCK.into()),
        ("MEMREADOOB64", MEMREADOOB64.into()),
        ("ECCGETSTATS", ECCGETSTATS.into()),
        ("MTD_NANDFLASH", MTD_NANDFLASH.into()),
        ("MTD_MLCNANDFLASH", MTD_MLCNANDFLASH.into()),
        ("MTD_CHAR_MAJOR", MTD_CHAR_MAJOR.into()),
        ("sizeof(__kernel_loff_t)", size_of::<i64>() as u64),
    ];
    all.extend(layout!(MtdInfo, "mtd_info_user" {
        kind: "type", flags: "flags", size: "size", erasesize: "erasesize",
        writesize: "writesize", oobsize: "oobsize", padding: "padding"
    }));
    all.extend(layout!(EccStats, "mtd_ecc_stats" {
        corrected: "corrected", failed: "failed", badblocks: "badblocks", bbtblocks: "bbtblocks"
    }));
    all.extend(layout!(EraseInfo64, "erase_info_user64" { start: "start", length: "length" }));
    all.extend(layout!(OobBuf64, "mtd_oob_buf64" {
        start: "start", pad: "pad", length: "length", usr_ptr: "usr_ptr"
    }));
    all
}

/// The same numbers as the installed kernel headers give them, printed by a C program (the
/// test command installs the compiler and the headers: without them the test fails, it does not
/// pass unrun).
fn theirs() -> HashMap<String, u64> {
    let cc = which("cc").expect("no `cc` on PATH to compile the MTD header check (scripts/install-test-deps.sh installs g++)");
    let dir = scratch("flash-mtd-abi");
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <sys/ioctl.h>\n#include <linux/major.h>\n\
         #include <mtd/mtd-abi.h>\n\
         #define SHOW(x) printf(\"%s=%llu\\n\", #x, (unsigned long long)(x))\n\
         int main(void) {\n",
    );
    for (name, _) in ours() {
        c += &format!("    SHOW({name});\n");
    }
    c += "    return 0;\n}\n";
    std::fs::write(dir.join("abi.c"), c).unwrap();
    let compiled = output(
        Command::new(&cc)
            .current_dir(&dir)
            .args(["-o", "abi", "abi.c"]),
    );
    assert!(
        compiled.status.success(),
        "cc abi.c failed (the kernel's MTD headers come with Debian's linux-libc-dev): {}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = ok(output(&mut Command::new(dir.join("abi"))), "the ABI probe");
    let text = String::from_utf8(run.stdout).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

#[test]
fn ioctl_numbers_and_structures_match_the_kernel_headers() {
    let theirs = theirs();
    for (name, value) in ours() {
        assert_eq!(theirs.get(name), Some(&value), "{name}");
    }
}

/// The values `include/uapi/mtd/mtd-abi.h` gives on x86-64 (and every architecture with the
/// generic `_IOC` encoding): a check that needs no C compiler.
#[test]
fn ioctl_numbers_are_the_generic_encodings() {
    assert_eq!(MEMGETINFO, 0x8020_4d01);
    assert_eq!(MEMERASE64, 0x4010_4d14);
    assert_eq!(MEMGETBADBLOCK, 0x4008_4d0b);
    assert_eq!(MEMSETBADBLOCK, 0x4008_4d0c);
    assert_eq!(MEMREADOOB64, 0xc018_4d16);
    assert_eq!(ECCGETSTATS, 0x8010_4d12);
    // _IOWR('U', 15, 8 bytes) from the other end of the fields.
    assert_eq!(sys::ioc(3, b'U', 15, 8), 0xc008_550f);
}

/// What nandsim with `id_bytes=0x20,0xa2,0x00,0x15` reports: 64 MiB of 128 KiB eraseblocks,
/// 2 KiB pages with 64 spare bytes.
fn nandsim() -> MtdInfo {
    MtdInfo {
        kind: MTD_NANDFLASH,
        flags: 0x400,
        size: 64 << 20,
        erasesize: 128 << 10,
        writesize: 2048,
        oobsize: 64,
        padding: 0,
    }
}

#[test]
fn a_nand_device_gives_its_geometry_with_sysfs_sub_pages() {
    let sysfs = Sysfs {
        sub_page_size: Some(512),
        size: Some(64 << 20),
        bitflip_threshold: Some(1),
    };
    assert_eq!(geometry_of(&nandsim(), &sysfs), Ok(Geometry::default()));
    let mlc = MtdInfo {
        kind: MTD_MLCNANDFLASH,
        ..nandsim()
    };
    assert_eq!(geometry_of(&mlc, &sysfs), Ok(Geometry::default()));
}

#[test]
fn without_sysfs_the_page_is_the_sub_page_and_nop_is_1() {
    let g = geometry_of(&nandsim(), &Sysfs::default()).unwrap();
    assert_eq!((g.sub_page_size, g.nop, g.peb_count), (2048, 1, 512));
}

#[test]
fn the_sysfs_size_counts_past_4_gib() {
    // MEMGETINFO's 32-bit size of an 8 GiB device is 0.
    let big = MtdInfo {
        size: 0,
        erasesize: 512 << 10,
        writesize: 4096,
        oobsize: 224,
        ..nandsim()
    };
    let sysfs = Sysfs {
        size: Some(8 << 30),
        ..Sysfs::default()
    };
    assert_eq!(geometry_of(&big, &sysfs).unwrap().peb_count, 16384);
    assert!(geometry_of(&big, &Sysfs::default()).is_err());
}

#[test]
fn what_is_not_nand_is_refused_by_name() {
    for (kind, name) in [
        (0, "absent"),
        (1, "RAM"),
        (2, "ROM"),
        (3, "NOR"),
        (6, "DataFlash"),
        (7, "UBI volume"),
        (42, "unknown type 42"),
    ] {
        let info = MtdInfo { kind, ..nandsim() };
        let why = geometry_of(&info, &Sysfs::default()).unwrap_err();
        assert!(why.contains(name) && why.contains("not NAND"), "{why}");
    }
}

#[test]
fn impossible_shapes_are_refused() {
    let sysfs = Sysfs::default();
    for (info, says) in [
        (
            MtdInfo {
                size: (64 << 20) + 2048,
                ..nandsim()
            },
            "whole number",
        ),
        (
            MtdInfo {
                erasesize: 0,
                ..nandsim()
            },
            "whole number",
        ),
        (
            MtdInfo {
                writesize: 256,
                ..nandsim()
            },
            "page size",
        ),
        (
            MtdInfo {
                oobsize: 1024,
                ..nandsim()
            },
            "spare bytes",
        ),
    ] {
        let why = geometry_of(&info, &sysfs).unwrap_err();
        assert!(why.contains(says), "{info:?}: {why}");
    }
    let tiny_sub_pages = Sysfs {
        sub_page_size: Some(4),
        ..sysfs
    };
    let huge_pages = MtdInfo {
        erasesize: 4 << 20,
        writesize: 65536,
        oobsize: 0,
        ..nandsim()
    };
    assert!(geometry_of(&huge_pages, &tiny_sub_pages)
        .unwrap_err()
        .contains("sub-pages per page"));
}

#[test]
fn errnos_take_their_mtd_meaning() {
    let e = |errno: Errno| Some(errno.raw_os_error());
    assert_eq!(outcome(Op::Read, e(Errno::UCLEAN)), Outcome::Corrected);
    assert_eq!(outcome(Op::Read, e(Errno::BADMSG)), Outcome::Uncorrectable);
    assert_eq!(outcome(Op::Program, e(Errno::IO)), Outcome::ProgramFailed);
    assert_eq!(outcome(Op::Erase, e(Errno::IO)), Outcome::EraseFailed);
    // EIO means a failed program or erase only for those: elsewhere it is plain I/O.
    assert_eq!(outcome(Op::Read, e(Errno::IO)), Outcome::Other);
    assert_eq!(outcome(Op::Other, e(Errno::IO)), Outcome::Other);
    // And ECC results only on reads.
    assert_eq!(outcome(Op::Program, e(Errno::BADMSG)), Outcome::Other);
    assert_eq!(outcome(Op::Erase, e(Errno::ROFS)), Outcome::Other);
    assert_eq!(outcome(Op::Other, e(Errno::NOTTY)), Outcome::NotMtd);
    assert_eq!(outcome(Op::Read, e(Errno::INVAL)), Outcome::Other);
    assert_eq!(outcome(Op::Read, None), Outcome::Other);
}

#[test]
fn ecc_counters_say_corrected_from_the_threshold_and_failed_on_any_rise() {
    let at = |corrected, failed| EccStats {
        corrected,
        failed,
        ..EccStats::default()
    };
    assert_eq!(ecc_outcome(&at(10, 2), &at(10, 2), 1), (0, false));
    assert_eq!(ecc_outcome(&at(10, 2), &at(11, 2), 1), (1, false));
    // Below the threshold the kernel says nothing (no -EUCLEAN): neither does the read.
    assert_eq!(ecc_outcome(&at(10, 2), &at(12, 2), 3), (0, false));
    assert_eq!(ecc_outcome(&at(10, 2), &at(13, 2), 3), (3, false));
    assert_eq!(ecc_outcome(&at(10, 2), &at(10, 3), 3), (0, true));
    // A threshold of 0 (a device without ECC strength) still needs a corrected bit.
    assert_eq!(ecc_outcome(&at(10, 2), &at(10, 2), 0), (0, false));
    // The counters wrap.
    assert_eq!(ecc_outcome(&at(u32::MAX, 2), &at(1, 2), 1), (2, false));
}
