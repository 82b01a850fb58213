//! The encryption layer: NAND behaviour above it, only ciphertext below it, the documented IV
//! rule checked with OpenSSL, and what each policy costs the chip.

use std::sync::Arc;

use sectorcrypt_cipher::{BackendChoice, CipherSpec, SectorOptions};
use sectorcrypt_flash::crypt::{CryptFlash, Policy};
use sectorcrypt_flash::part::Partition;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_storage::MemStorage;
use sectorcrypt_testkit::{openssl, pattern, scratch};

use crate::small;

const POLICIES: [Policy; 4] = Policy::ALL;

/// Blocks at the end of a test chip kept for the journal of the hiding policies.
pub(crate) const JOURNAL_BLOCKS: u32 = 3;

pub(crate) fn chip(g: Geometry) -> Arc<SimNand> {
    let mem = MemStorage::new(vec![0; SimNand::image_len(&g) as usize]);
    Arc::new(SimNand::create(mem, g, &[]).unwrap())
}

/// The layer over `chip`; under the hiding policies over all but its last blocks, which hold
/// the journal (the layer's block numbers are the chip's either way).
pub(crate) fn layer(
    chip: &Arc<SimNand>,
    spec: &str,
    key: &[u8],
    policy: Policy,
) -> Result<CryptFlash, sectorcrypt_flash::Error> {
    layer_on(Arc::clone(chip) as Arc<dyn Flash>, spec, key, policy)
}

/// [`layer`] over any chip.
pub(crate) fn layer_on(
    whole: Arc<dyn Flash>,
    spec: &str,
    key: &[u8],
    policy: Policy,
) -> Result<CryptFlash, sectorcrypt_flash::Error> {
    let opts = SectorOptions {
        backend: BackendChoice::Auto,
        ..SectorOptions::default()
    };
    let spec = CipherSpec::parse(spec).unwrap();
    if !policy.hides_at_rest() {
        return CryptFlash::new(whole, spec, key, policy, &opts);
    }
    let n = whole.geometry().peb_count - JOURNAL_BLOCKS;
    let data = Arc::new(Partition::range(Arc::clone(&whole), 0, n)?);
    let journal = Arc::new(Partition::range(whole, n, JOURNAL_BLOCKS)?);
    CryptFlash::with_journal(data, journal, spec, key, policy, &opts)
}

pub(crate) fn read(f: &dyn Flash, peb: u32, offset: u32, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    f.read(peb, offset, &mut buf).unwrap();
    buf
}

pub(crate) fn raw_chip(chip: &SimNand) -> Vec<u8> {
    let g = chip.geometry();
    (0..g.peb_count)
        .flat_map(|peb| read(chip, peb, 0, g.peb_size as usize))
        .collect()
}

#[test]
fn above_the_layer_the_chip_behaves_as_nand() {
    let key = pattern(64, 1);
    for policy in POLICIES {
        let c = chip(small());
        let f = layer(&c, "aes-xts-plain64", &key, policy).unwrap();
        f.erase(3).unwrap();
        assert_eq!(
            read(&f, 3, 0, 16384),
            vec![0xFF; 16384],
            "{policy:?}: erased"
        );
        let a = pattern(512, 2);
        let b = pattern(1024, 3);
        f.program(3, 0, &a).unwrap();
        f.program(3, 2048, &b).unwrap();
        assert_eq!(read(&f, 3, 0, 512), a, "{policy:?}: sub-page 0");
        assert_eq!(read(&f, 3, 2048, 1024), b, "{policy:?}: page 1");
        // Unaligned reads decrypt the whole units around them.
        assert_eq!(read(&f, 3, 100, 50), a[100..150], "{policy:?}: unaligned");
        assert_eq!(
            read(&f, 3, 512, 1536),
            vec![0xFF; 1536],
            "{policy:?}: still erased"
        );
        // Programming ones changes nothing; programming zeros clears bits (NAND's AND).
        f.program(3, 0, &[0xFF; 512]).unwrap();
        assert_eq!(read(&f, 3, 0, 512), a, "{policy:?}: ones are a no-op");
        let mask = pattern(512, 4);
        f.program(3, 0, &mask).unwrap();
        let anded: Vec<u8> = a.iter().zip(&mask).map(|(x, m)| x & m).collect();
        assert_eq!(read(&f, 3, 0, 512), anded, "{policy:?}: bits only clear");
        assert_eq!(read(&f, 3, 2048, 1024), b, "{policy:?}: the rest survives");
        // Sub-page programs next to each other in one page, as UBI writes its two headers.
        f.erase(3).unwrap();
        f.program(3, 0, &a).unwrap();
        f.program(3, 512, &a).unwrap();
        assert_eq!(read(&f, 3, 0, 1024), [a.clone(), a.clone()].concat());
        assert!(
            f.program(3, 100, &a).is_err(),
            "{policy:?}: unaligned program"
        );
    }
}

#[test]
fn under_the_thesis_policy_the_chip_holds_nothing_but_ciphertext() {
    let key = pattern(64, 5);
    let g = Geometry {
        peb_count: 64,
        ..small()
    };
    let c = chip(g);
    let f = layer(&c, "aes-xts-plain64", &key, Policy::Thesis).unwrap();
    // What UBI leaves on a chip: every block erased, headers with their magic in the first two
    // sub-pages of some blocks (the rest of each header sub-page 0xFF), a marker in the data.
    let marker = b"PLAINTEXT-MARKER";
    for peb in 0..g.peb_count {
        f.erase(peb).unwrap();
        if peb % 3 == 0 {
            let mut ec = vec![0xFF; 512];
            ec[..4].copy_from_slice(b"UBI#");
            let mut vid = vec![0xFF; 512];
            vid[..4].copy_from_slice(b"UBI!");
            f.program(peb, 0, &ec).unwrap();
            f.program(peb, 512, &vid).unwrap();
            let mut data = vec![0u8; 2048];
            data[..marker.len()].copy_from_slice(marker);
            f.program(peb, 2048, &data).unwrap();
        }
    }
    let raw = raw_chip(&c);
    for needle in [&b"UBI#"[..], b"UBI!", marker] {
        assert!(
            !raw.windows(needle.len()).any(|w| w == needle),
            "{needle:?} on the chip"
        );
    }
    let longest_ff = raw.split(|&b| b != 0xFF).map(<[u8]>::len).max().unwrap();
    assert!(
        longest_ff < 8,
        "a run of {longest_ff} bytes of 0xFF on the chip"
    );
    // Byte histogram against uniform: chi-square with 255 degrees of freedom has mean 255 and
    // standard deviation 22.6; 400 is over six of them.
    let mut counts = [0u64; 256];
    for &b in &raw {
        counts[b as usize] += 1;
    }
    let expected = raw.len() as f64 / 256.0;
    let chi2: f64 = counts
        .iter()
        .map(|&n| (n as f64 - expected).powi(2) / expected)
        .sum();
    assert!(
        chi2 < 400.0,
        "byte histogram far from uniform: chi-square {chi2:.1}"
    );
    // Above the layer it is all still there.
    assert_eq!(&read(&f, 0, 0, 4), b"UBI#");
    assert_eq!(read(&f, 1, 0, 16384), vec![0xFF; 16384]);

    // The visible policy leaves free space erased on the chip, which is what the thesis hides.
    let c = chip(g);
    let f = layer(&c, "aes-xts-plain64", &key, Policy::Visible).unwrap();
    f.erase(1).unwrap();
    assert_eq!(read(c.as_ref(), 1, 0, 16384), vec![0xFF; 16384]);
}

#[test]
fn the_ciphertext_decrypts_with_openssl_by_the_documented_iv_rule() {
    let dir = scratch("flash-crypt-openssl");
    for (spec, key_len) in [("aes-xts-plain64", 64), ("aes-cbc-essiv:sha256", 32)] {
        for policy in POLICIES {
            let key = pattern(key_len, 6);
            let g = small();
            let c = chip(g);
            let f = layer(&c, spec, &key, policy).unwrap();
            let peb = 5;
            f.erase(peb).unwrap();
            let data = pattern(3 * 2048, 7);
            f.program(peb, 2048, &data).unwrap();
            // The programmed pages: units 4..16 of block 5, as ciphertext on the chip.
            let file = dir.join(format!("{spec}-{}.bin", policy.name()));
            std::fs::write(&file, read(c.as_ref(), peb, 2048, data.len())).unwrap();
            let unit = g.sub_page_size as usize;
            let first = f.unit_number(peb, 2048);
            assert_eq!(first, 5 * 32 + 4);
            let plain = openssl::decrypt_units(&file, spec, &key, unit, first);
            assert_eq!(plain, data, "{spec} {policy:?}");
            if policy != Policy::Visible {
                // Free space is encrypted 0xFF under the same rule (once hidden).
                f.hide_free_space().unwrap();
                std::fs::write(&file, read(c.as_ref(), peb, 8192, 8192)).unwrap();
                let plain =
                    openssl::decrypt_units(&file, spec, &key, unit, f.unit_number(peb, 8192));
                assert_eq!(plain, vec![0xFF; 8192], "{spec}: encrypted free space");
            }
        }
    }
}

#[test]
fn the_thesis_policy_pays_an_erase_per_program_and_the_layer_counts_it() {
    let key = pattern(64, 8);
    for policy in POLICIES {
        let c = chip(small());
        let f = layer(&c, "aes-xts-plain64", &key, policy).unwrap();
        let before = c.erase_counts()[2];
        f.erase(2).unwrap();
        for page in 0..3 {
            f.program(2, page * 2048, &pattern(2048, u64::from(page)))
                .unwrap();
        }
        let s = f.stats();
        assert_eq!((s.erases, s.programs, s.program_bytes), (1, 3, 3 * 2048));
        let chip_erases = c.erase_counts()[2] - before;
        assert_eq!(u64::from(chip_erases), s.chip_erases, "{policy:?}");
        assert_eq!(f.erase_counts()[2], chip_erases, "{policy:?}");
        match policy {
            Policy::Thesis => {
                // The erase (and its fill) and one read-modify-erase-write per program, each
                // programming the whole block: 8 pages each.
                assert_eq!((s.chip_erases, s.rewrites), (4, 3));
                assert_eq!(s.chip_page_programs, 4 * 8);
            }
            _ => {
                assert_eq!((s.chip_erases, s.rewrites), (1, 0));
                assert_eq!(s.chip_page_programs, 3);
            }
        }
        assert!(s.cipher_calls > 0 && s.cipher_bytes >= 3 * 2048);
    }
}
