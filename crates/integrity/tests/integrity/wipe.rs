//! What the modes' keyed code leaves on the stack: nothing below what its wipe clears
//! (`sectorcrypt_cipher::wiping`), and no 16 bytes of the key once a call has returned. HMAC, ChaCha20-Poly1305 and AEGIS-128 are other crates' code
//! or this crate's own, outside the cipher crate's engines; they are measured as the cipher crate
//! measures its engines (`sectorcrypt_cipher::reach`, the `stack-reach` feature): on a painted
//! stack, each wipe must cover the deepest byte the calls before it left.

use sectorcrypt_integrity::Mode;

use crate::MODES;

/// Key set-up, then sealing and opening one and 16 blocks, in every mode.
#[cfg(target_arch = "x86_64")]
#[test]
fn every_keyed_call_stays_within_the_stack_its_wipe_clears() {
    use sectorcrypt_cipher::reach::{assert_holds_none_of, deepest_within, measure_leaving};
    for (encryption, integrity, key_len) in MODES {
        for block_size in [512, 4096] {
            let key: Vec<u8> = (0..key_len).map(|i| (i * 29 + 3) as u8).collect();
            let what = format!("{encryption} with {integrity}, {block_size}-byte blocks");
            let mut mode = None;
            let (wipes, left) = measure_leaving(|| {
                mode = Some(Mode::new(encryption, integrity, &key, block_size).unwrap());
            });
            let mode = mode.unwrap();
            let mut deepest = deepest_within(&wipes, &format!("{what}, key set-up"));
            assert_holds_none_of(&*left, &key, &format!("{what}, key set-up"));
            for blocks in [1, 16] {
                let mut data: Vec<u8> = (0..blocks * block_size).map(|i| i as u8).collect();
                let mut tuples = vec![0; blocks * mode.tag_size()];
                let ivs = vec![0x6b; blocks * mode.random_iv_size()];
                let (wipes, left) = measure_leaving(|| {
                    mode.seal_blocks(8, &mut data, &mut tuples, &ivs).unwrap();
                });
                let case = format!("{what}, sealing {blocks}");
                deepest = deepest.max(deepest_within(&wipes, &case));
                assert_holds_none_of(&*left, &key, &case);
                let (wipes, left) =
                    measure_leaving(|| mode.open_blocks(8, &mut data, &tuples).unwrap());
                let case = format!("{what}, opening {blocks}");
                deepest = deepest.max(deepest_within(&wipes, &case));
                assert_holds_none_of(&*left, &key, &case);
            }
            eprintln!("{what}: deepest {deepest} bytes");
        }
    }
}
