//! AES-GCM (NIST SP 800-38D) with 96-bit nonces, for the per-sector AEAD of authenticated
//! volumes (`aes-gcm-random`): one message is one sector of at most 4 KiB, so what counts is the
//! cost per 4 KiB, not the set-up.
//!
//! The counter-mode half runs on the counter kernels of this crate's AES engines
//! ([`BlockEngine::ctr32_xor`]: counter blocks made in registers, the data XORed in through the
//! last round key), every sector of a request in one call and the tag masks `E(K, J0)` of all of
//! them in one ECB call. GHASH runs on the carry-less multiply (`clmul`): eight blocks are
//! multiplied by `H^8 .. H^1` and summed before one reduction, where a one-block-at-a-time GHASH
//! reduces after every block and costs three times the AES; with a VAES backend, two blocks per
//! instruction. There is no portable GHASH here: [`AesGcm::new`] says `None` on a CPU without
//! `pclmulqdq`, and the caller keeps a portable, constant-time GCM
//! (RustCrypto's `aes-gcm`) for that case. The tests check this one against the GCM
//! specification's vectors and against OpenSSL on random messages, with the AES of every backend.
//!
//! Opening computes the tag over the ciphertext and compares it in constant time before anything
//! is decrypted: a forged message is never turned into plaintext.

use sectorcrypt_secret::SecretBox;
use zeroize::Zeroize;

use crate::backend::{Algorithm, Backend, BackendChoice};
use crate::engine::{xor_into, Block, BlockEngine, BLOCK};

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // PCLMULQDQ kernels
mod clmul;

/// Bytes of a GCM nonce (the only size this implementation takes).
pub const NONCE: usize = 12;
/// Bytes of a GCM tag.
pub const TAG: usize = 16;

/// Messages per batch of tag masks. A mask `E(K, J0)` with its tag and ciphertext gives away
/// GHASH's key, so the masks stay on the stack (cleared after use), never on the heap.
const MASKS: usize = 64;

/// An AES-GCM key: AES-128, -192 or -256 and the GHASH key's powers, both in locked memory.
pub struct AesGcm {
    aes: Box<dyn BlockEngine>,
    #[cfg(target_arch = "x86_64")]
    ghash: SecretBox<clmul::Key>,
    #[cfg(not(target_arch = "x86_64"))]
    ghash: SecretBox<()>,
}

impl std::fmt::Debug for AesGcm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AesGcm")
            .field("aes", &self.aes.backend())
            .finish_non_exhaustive()
    }
}

impl AesGcm {
    /// Whether this CPU runs it (has a carry-less multiply).
    pub fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        return clmul::available();
        #[cfg(not(target_arch = "x86_64"))]
        return false;
    }

    /// The GCM of AES key `key` (16, 24 or 32 bytes), its AES on the backend `choice` gives;
    /// `None` for another key size or an unavailable backend, or where this CPU has no
    /// carry-less multiply (then use a portable GCM).
    pub fn new(key: &[u8], choice: BackendChoice) -> Option<AesGcm> {
        #[cfg(target_arch = "x86_64")]
        {
            if !AesGcm::available() {
                return None;
            }
            let aes = crate::block_cipher(Algorithm::Aes, key, choice).ok()?;
            let mut h = [0u8; BLOCK];
            aes.encrypt_ecb(&mut h);
            // The VAES backends' CPUs carry-less multiply two blocks at once too.
            let wide = matches!(aes.backend(), Backend::Vaes256 | Backend::Vaes512);
            let ghash = SecretBox::try_init(|| Some(clmul::Key::new(&h, wide)))?;
            h.zeroize();
            crate::wipe::after_keyed_call(crate::wipe::DEEP_STACK);
            Some(AesGcm { aes, ghash })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (key, choice, Algorithm::Aes);
            None
        }
    }

    /// Encrypt `data` in place under `nonce` with associated data `aad`; the tag.
    ///
    /// `data` is at most 2^36 - 32 bytes (GCM's limit for one message).
    pub fn seal(&self, nonce: &[u8; NONCE], aad: &[u8], data: &mut [u8]) -> [u8; TAG] {
        let mut tag = [0u8; TAG];
        self.seal_each([(nonce, aad, data, &mut tag)]);
        tag
    }

    /// [`AesGcm::seal`] for each message (nonce, associated data, data encrypted in place, and
    /// where its tag goes): the sectors of a request, with two AES calls per 64 of them (the
    /// tag masks `E(K, J0)` in one, every message's counter mode in the other) and one clearing
    /// of what the kernels leave behind at the end.
    pub fn seal_each<'a, A: AsRef<[u8]>>(
        &self,
        messages: impl IntoIterator<Item = (&'a [u8; NONCE], A, &'a mut [u8], &'a mut [u8; TAG])>,
    ) {
        let mut messages: Vec<_> = messages.into_iter().collect();
        crate::wipe::once(|| {
            for chunk in messages.chunks_mut(MASKS) {
                let mut stack = [[0u8; BLOCK]; MASKS];
                let masks = self.tag_masks(chunk.iter().map(|m| m.0), &mut stack);
                let mut jobs: Vec<(Block, &mut [u8])> = (chunk.iter_mut())
                    .map(|(nonce, _, data, _)| (counter_block(nonce, 2), &mut **data))
                    .collect();
                self.aes.ctr32_xor(&mut jobs);
                drop(jobs);
                for ((_, aad, data, tag), mask) in chunk.iter_mut().zip(masks.iter()) {
                    **tag = self.ghash(aad.as_ref(), data);
                    xor_into(&mut **tag, mask);
                }
                masks.as_flattened_mut().zeroize();
            }
        });
    }

    /// Check `tag` over `aad` and the ciphertext `data` under `nonce` (in constant time) and, if it
    /// verifies, decrypt `data` in place. `false`: `data` is left as it was, undecrypted.
    pub fn open(&self, nonce: &[u8; NONCE], aad: &[u8], data: &mut [u8], tag: &[u8; TAG]) -> bool {
        let mut ok = true;
        self.open_each([(nonce, aad, data, tag)], |_| ok = false);
        ok
    }

    /// [`AesGcm::open`] for each message (nonce, associated data, ciphertext decrypted in place
    /// if its tag verifies, and the tag), with two AES calls and one clearing for all of them;
    /// `refused` gets the position of each message whose tag does not verify (left as
    /// ciphertext).
    pub fn open_each<'a, A: AsRef<[u8]>>(
        &self,
        messages: impl IntoIterator<Item = (&'a [u8; NONCE], A, &'a mut [u8], &'a [u8; TAG])>,
        mut refused: impl FnMut(usize),
    ) {
        let mut messages: Vec<_> = messages.into_iter().collect();
        crate::wipe::once(|| {
            for (c, chunk) in messages.chunks_mut(MASKS).enumerate() {
                let mut stack = [[0u8; BLOCK]; MASKS];
                let masks = self.tag_masks(chunk.iter().map(|m| m.0), &mut stack);
                let verified: Vec<bool> = (chunk.iter().zip(masks.iter()))
                    .map(|((_, aad, data, tag), mask)| {
                        let hash = self.ghash(aad.as_ref(), data);
                        let diff = (hash.iter().zip(mask).zip(*tag))
                            .fold(0u8, |d, ((h, m), t)| d | (h ^ m ^ t));
                        // Read through a black box so the comparison stays branch-free up to here.
                        std::hint::black_box(diff) == 0
                    })
                    .collect();
                masks.as_flattened_mut().zeroize();
                let mut jobs: Vec<(Block, &mut [u8])> = (chunk.iter_mut().zip(&verified))
                    .filter(|(_, ok)| **ok)
                    .map(|((nonce, _, data, _), _)| (counter_block(nonce, 2), &mut **data))
                    .collect();
                self.aes.ctr32_xor(&mut jobs);
                drop(jobs);
                for (i, _) in verified.iter().enumerate().filter(|(_, ok)| !**ok) {
                    refused(c * MASKS + i);
                }
            }
        });
    }

    /// `E(K, J0)` of each nonce (what a tag is masked with; at most [`MASKS`]) in `out`, in one
    /// ECB call; the slots filled.
    fn tag_masks<'m, 'a>(
        &self,
        nonces: impl Iterator<Item = &'a [u8; NONCE]>,
        out: &'m mut [Block; MASKS],
    ) -> &'m mut [Block] {
        let mut n = 0;
        for (slot, nonce) in out.iter_mut().zip(nonces) {
            *slot = counter_block(nonce, 1);
            n += 1;
        }
        let masks = &mut out[..n];
        self.aes.encrypt_ecb(masks.as_flattened_mut());
        masks
    }

    /// GHASH of `aad` and `ciphertext`, with their lengths.
    fn ghash(&self, aad: &[u8], ciphertext: &[u8]) -> [u8; TAG] {
        let mut lengths = [0u8; BLOCK];
        lengths[..8].copy_from_slice(&(aad.len() as u64 * 8).to_be_bytes());
        lengths[8..].copy_from_slice(&(ciphertext.len() as u64 * 8).to_be_bytes());
        #[cfg(target_arch = "x86_64")]
        return self.ghash.hash([aad, ciphertext, &lengths]);
        #[cfg(not(target_arch = "x86_64"))]
        return [0u8; TAG];
    }
}

/// The counter block of `nonce` with 32-bit counter `n` (`J0` is counter 1, data starts at 2).
fn counter_block(nonce: &[u8; NONCE], n: u32) -> Block {
    let mut block = [0u8; BLOCK];
    block[..NONCE].copy_from_slice(nonce);
    block[NONCE..].copy_from_slice(&n.to_be_bytes());
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every GCM call's stack stays within the wipe after it (see the sector layer's
    /// `every_keyed_call_stays_within_the_stack_its_wipe_clears`): key set-up, then sealing and
    /// opening 512- and 4096-byte sectors, one and many per call, on every AES backend here.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_gcm_call_stays_within_the_stack_its_wipe_clears() {
        use crate::wipe::reach::{assert_holds_none_of, deepest_within, measure_leaving};
        if !AesGcm::available() {
            eprintln!("no carry-less multiply on this CPU: nothing to check");
            return;
        }
        let backends = [
            Backend::Portable,
            Backend::AesNi,
            Backend::Vaes256,
            Backend::Vaes512,
        ];
        let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0xc3).collect();
        // GHASH's key H = E(K, 0) is as secret as the key: with it, tags can be forged.
        let mut h = [0u8; BLOCK];
        crate::block_cipher(Algorithm::Aes, &key, BackendChoice::Portable)
            .unwrap()
            .encrypt_ecb(&mut h);
        let left_none = |left: &[u8], what: &str| {
            crate::wipe::residue::assert_left_none(left, "aes-gcm", &key, what);
            assert_holds_none_of(left, &h, &format!("{what} (GHASH's key)"));
        };
        let mut checked = 0;
        for backend in backends.into_iter().filter(|b| b.is_available()) {
            let mut gcm = None;
            let (set_up, left) =
                measure_leaving(|| gcm = AesGcm::new(&key, BackendChoice::Exact(backend)));
            let gcm = gcm.expect("an AES backend this CPU has");
            let what = format!("AES-256-GCM on {backend}");
            let mut deepest = deepest_within(&set_up, &format!("{what}, key set-up"));
            left_none(&*left, &format!("{what}, key set-up"));
            for (sector, count) in [(512, 1), (512, 64), (4096, 1), (4096, 16)] {
                let nonces: Vec<[u8; NONCE]> = (0..count).map(|i| [i as u8; NONCE]).collect();
                let mut data = vec![0x5au8; sector * count];
                let mut tags = vec![[0u8; TAG]; count];
                let case = format!("{what}, {count} sectors of {sector} bytes");
                let (wipes, left) = measure_leaving(|| {
                    gcm.seal_each(
                        (nonces
                            .iter()
                            .zip(data.chunks_mut(sector))
                            .zip(tags.iter_mut()))
                        .map(|((n, d), t)| (n, [0u8; 8], d, t)),
                    )
                });
                deepest = deepest.max(deepest_within(&wipes, &format!("{case}, sealed")));
                left_none(&*left, &format!("{case}, sealed"));
                let mut refused = 0;
                let (wipes, left) = measure_leaving(|| {
                    gcm.open_each(
                        (nonces.iter().zip(data.chunks_mut(sector)).zip(tags.iter()))
                            .map(|((n, d), t)| (n, [0u8; 8], d, t)),
                        |_| refused += 1,
                    )
                });
                deepest = deepest.max(deepest_within(&wipes, &format!("{case}, opened")));
                left_none(&*left, &format!("{case}, opened"));
                assert_eq!(refused, 0, "{case}: its own tags");
                assert!(
                    data.iter().all(|&b| b == 0x5a),
                    "{case}: opened to what was sealed"
                );
            }
            eprintln!("{what}: deepest {deepest} bytes");
            checked += 1;
        }
        assert!(checked >= 2, "only {checked} backends checked");
    }

    fn unhex(s: &str) -> Vec<u8> {
        hex::decode(s).expect("hex")
    }

    /// The GCM specification's test cases 3, 4 (AES-128), 15 and 16 (AES-256), and 2 (an empty
    /// message's tag).
    #[test]
    fn gcm_specification_vectors() {
        if !AesGcm::available() {
            eprintln!("no carry-less multiply on this CPU: nothing to check");
            return;
        }
        let p = "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255";
        let a = "feedfacedeadbeeffeedfacedeadbeefabaddad2";
        let cases = [
            ("00000000000000000000000000000000", "000000000000000000000000", "", "", "", "0388dace60b6a392f328c2b971b2fe78"),
            ("feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888", p, "", "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091473f5985", "4d5c2af327cd64a62cf35abd2ba6fab4"),
            ("feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888", &p[..120], a, "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091", "5bc94fbc3221a5db94fae95ae7121a47"),
            ("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888", p, "", "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad", "b094dac5d93471bdec1a502270e3cc6c"),
            ("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888", &p[..120], a, "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662", "76fc6ece0f4e1768cddf8853bb2d551b"),
        ];
        // Cases 3 and 4, and 15 and 16, share a key: sealed together in one call, each as alone.
        for pair in [&cases[1..3], &cases[3..5]] {
            let gcm = AesGcm::new(&unhex(pair[0].0), BackendChoice::Auto).expect("key");
            let nonces: Vec<[u8; NONCE]> = pair
                .iter()
                .map(|c| unhex(c.1).try_into().expect("iv"))
                .collect();
            let mut data: Vec<Vec<u8>> = pair.iter().map(|c| unhex(c.2)).collect();
            let mut tags = [[0u8; TAG]; 2];
            let messages = nonces.iter().zip(pair).zip(&mut data).zip(&mut tags);
            gcm.seal_each(messages.map(|(((n, c), d), t)| (n, unhex(c.3), &mut d[..], t)));
            for ((c, d), t) in pair.iter().zip(&data).zip(&tags) {
                assert_eq!(
                    (hex::encode(d), hex::encode(t)),
                    (c.4.to_string(), c.5.to_string())
                );
            }
            // Opened together with the second tag forged: the first decrypts, the second is
            // refused and stays ciphertext.
            tags[1][0] ^= 1;
            let mut refused = Vec::new();
            let messages = nonces.iter().zip(pair).zip(&mut data).zip(&tags);
            gcm.open_each(
                messages.map(|(((n, c), d), t)| (n, unhex(c.3), &mut d[..], t)),
                |i| refused.push(i),
            );
            assert_eq!(refused, [1]);
            assert_eq!(hex::encode(&data[0]), pair[0].2);
            assert_eq!(hex::encode(&data[1]), pair[1].4);
        }
        // Case 2's plaintext is one zero block.
        for (i, (key, iv, plain, aad, cipher, tag)) in cases.into_iter().enumerate() {
            let plain = if i == 0 { vec![0u8; 16] } else { unhex(plain) };
            let cipher = if i == 0 {
                unhex("0388dace60b6a392f328c2b971b2fe78")
            } else {
                unhex(cipher)
            };
            let tag = if i == 0 {
                unhex("ab6e47d42cec13bdf53a67b21257bddf")
            } else {
                unhex(tag)
            };
            let gcm = AesGcm::new(&unhex(key), BackendChoice::Auto).expect("key");
            let nonce: [u8; NONCE] = unhex(iv).try_into().expect("iv");
            let aad = unhex(aad);
            let mut data = plain.clone();
            let got = gcm.seal(&nonce, &aad, &mut data);
            assert_eq!(
                hex::encode(&data),
                hex::encode(&cipher),
                "case {i} ciphertext"
            );
            assert_eq!(hex::encode(got), hex::encode(&tag), "case {i} tag");
            let tag: [u8; TAG] = tag.try_into().expect("tag");
            assert!(gcm.open(&nonce, &aad, &mut data, &tag), "case {i} opens");
            assert_eq!(data, plain, "case {i} round trip");
            let mut bad = tag;
            bad[15] ^= 1;
            let mut data = cipher.clone();
            assert!(
                !gcm.open(&nonce, &aad, &mut data, &bad),
                "case {i} forged tag"
            );
            assert_eq!(data, cipher, "case {i}: a refused message stays ciphertext");
        }
    }

    /// More messages than one batch of tag masks: sealed together they are what sealing each
    /// alone gives, and opened together a forged one in a later batch is refused alone, by its
    /// own position.
    #[test]
    fn requests_longer_than_a_batch_of_masks() {
        let gcm = AesGcm::new(&[0x42; 32], BackendChoice::Auto).expect("key");
        let n = 2 * MASKS + 7;
        let nonces: Vec<[u8; NONCE]> = (0..n).map(|i| [i as u8; NONCE]).collect();
        let plain: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8 ^ 0x5a; 16 * (i % 5)]).collect();
        let mut data = plain.clone();
        let mut tags = vec![[0u8; TAG]; n];
        gcm.seal_each(
            (nonces.iter().zip(&mut data).zip(&mut tags))
                .map(|((nonce, d), t)| (nonce, [7u8; 8], d.as_mut_slice(), t)),
        );
        for i in 0..n {
            let mut alone = plain[i].clone();
            assert_eq!(
                gcm.seal(&nonces[i], &[7; 8], &mut alone),
                tags[i],
                "tag {i}"
            );
            assert_eq!(alone, data[i], "message {i}");
        }
        let forged = MASKS + 3;
        tags[forged][0] ^= 1;
        let mut refused = Vec::new();
        gcm.open_each(
            (nonces.iter().zip(&mut data).zip(&tags))
                .map(|((nonce, d), t)| (nonce, [7u8; 8], d.as_mut_slice(), t)),
            |i| refused.push(i),
        );
        assert_eq!(refused, [forged]);
        for i in (0..n).filter(|&i| i != forged) {
            assert_eq!(data[i], plain[i], "message {i} opened");
        }
    }
}
