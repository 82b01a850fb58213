//! The superblock and layout on their own: round trips, the kernel's geometry, hostile fields.

use sectorcrypt_integrity::superblock::{Superblock, FLAG_FIXED_PADDING, MAGIC, SUPERBLOCK_BYTES};
use sectorcrypt_integrity::{Error, Layout};

fn kernel_4k_hmac_sha256() -> Superblock {
    Superblock {
        version: 4,
        log2_interleave_sectors: 15,
        tag_size: 32,
        journal_sections: 3,
        provided_data_sectors: 96736,
        flags: FLAG_FIXED_PADDING,
        log2_sectors_per_block: 3,
        log2_blocks_per_bitmap_bit: 12,
        recalc_sector: 0,
        salt: [0; 16],
    }
}

#[test]
fn a_superblock_round_trips_and_its_layout_is_the_kernels() {
    let sb = kernel_4k_hmac_sha256();
    let bytes = sb.to_bytes();
    assert_eq!(bytes.len(), SUPERBLOCK_BYTES);
    assert_eq!(&bytes[..8], MAGIC);
    assert_eq!(Superblock::parse(&bytes).unwrap(), sb);
    // A 64 MiB device with the LUKS2 data at 16 MiB, as the kernel lays it out (dm-integrity's
    // calculate_device_limits): 3 journal sections of 264 sectors, 256-sector tag runs.
    let layout = Layout::new(&sb, 32768).unwrap();
    assert_eq!(layout.journal_section_sectors, 264);
    assert_eq!(layout.initial_sectors, 800);
    assert_eq!(layout.metadata_run, 256);
    assert_eq!(layout.tag_offset(0), 0x106_4000);
    assert_eq!(layout.data_offset(0), 0x108_4000);
    assert_eq!(layout.tag_offset(1000), 0x106_BD00);
    assert_eq!(layout.data_offset(1000), 0x146_C000);
    assert_eq!(layout.tag_offset(5000), 0x208_B100);
    assert_eq!(layout.data_offset(5000), 0x242_C000);
    assert_eq!(layout.device_bytes(), 64 << 20);
}

#[test]
fn hostile_superblocks_are_refused_with_a_reason() {
    let good = kernel_4k_hmac_sha256().to_bytes();
    let with = |at: usize, value: &[u8]| {
        let mut b = good.clone();
        b[at..at + value.len()].copy_from_slice(value);
        Superblock::parse(&b)
    };
    assert!(matches!(with(0, b"integrT\0"), Err(Error::NotIntegrity)));
    for (at, value) in [
        (8, &[0u8][..]),
        (8, &[6]),
        (9, &[2]),
        (9, &[32]),
        (10, &[0, 0]),
        (12, &[0, 0, 0, 0]),
        (16, &[0; 8]),
        (16, &[1, 0, 0, 0, 0, 0, 0, 0]),
        (24, &[0x40, 0, 0, 0]),
        (28, &[4]),
    ] {
        assert!(
            matches!(with(at, value), Err(Error::Format(_))),
            "byte {at} = {value:?}: {:?}",
            with(at, value)
        );
    }
    for flag in [0x01u8, 0x02, 0x04, 0x10, 0x20] {
        assert!(matches!(
            with(24, &[flag | 0x08]),
            Err(Error::Unsupported(_))
        ));
    }
    assert!(Superblock::parse(&good[..4095]).is_err());
    // A tag no journal entry can hold.
    let mut sb = kernel_4k_hmac_sha256();
    sb.tag_size = 500;
    assert!(matches!(Layout::new(&sb, 0), Err(Error::Format(_))));
}
