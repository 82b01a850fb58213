//! The engine both Serpent SIMD backends expand from their own primitives.
//!
//! The AVX2 and AVX-512 backends differ only in their word type, its bitwise primitives and the
//! set of blocks it holds; the rounds ([`super::rounds`]), the engine type and its ECB loop are
//! written once here as a macro that expands inside each backend module, so that every function
//! is compiled under that backend's `#[target_feature]` and inlines its primitives.
//!
//! The expanding module provides `W` with `and`, `xor`, `not`, `rol::<N>`, `shl::<N>` and `splat`
//! (see [`super::rounds`]), `SET` (bytes per set, one block per 32-bit lane), `load_set`,
//! `store_set` and `transpose` (an involution taking a loaded set to word `i` of every block in
//! register `i`).

/// Expands the Serpent engine `$engine` for `$feature` in the calling module, with the tests
/// every SIMD backend runs (ignored where the build's CPU lacks `$cpu`).
macro_rules! serpent_simd_engine {
    (
        $(#[$meta:meta])*
        engine: $engine:ident,
        feature: $feature:tt,
        cpu: $cpu:ident,
        backend: $backend:expr $(,)?
    ) => {
        use $crate::engine::{BlockEngine, BLOCK};
        use $crate::serpent::soft::{self, RoundKeys};

        $crate::serpent::rounds::serpent_rounds!(
            #[inline]
            #[target_feature(enable = $feature)]
        );

        $(#[$meta])*
        pub(crate) struct $engine {
            keys: RoundKeys,
        }

        impl $engine {
            /// Expand `key` (1 to 32 bytes); `None` for another length or if the CPU lacks the
            /// backend's feature.
            pub(crate) fn new(key: &[u8]) -> Option<Self> {
                if !std::is_x86_feature_detected!($feature) {
                    return None;
                }
                RoundKeys::new(key).map(|keys| Self { keys })
            }
        }

        impl BlockEngine for $engine {
            fn backend(&self) -> $crate::backend::Backend {
                $backend
            }

            fn encrypt_ecb(&self, buf: &mut [u8]) {
                if buf.len() == BLOCK {
                    // A lone block (e.g. an XTS tweak) is faster without transposes.
                    return soft::encrypt_block(&self.keys, buf);
                }
                // SAFETY: `new` returned `Some` only if the CPU supports the feature.
                unsafe { ecb::<true>(&self.keys, buf) }
            }

            fn decrypt_ecb(&self, buf: &mut [u8]) {
                if buf.len() == BLOCK {
                    return soft::decrypt_block(&self.keys, buf);
                }
                // SAFETY: as in `encrypt_ecb`.
                unsafe { ecb::<false>(&self.keys, buf) }
            }
        }

        /// Encrypt (`ENC`) or decrypt one set in place.
        #[inline]
        #[target_feature(enable = $feature)]
        fn cipher_set<const ENC: bool>(keys: &RoundKeys, set: &mut [u8; SET]) {
            let x = transpose(load_set(set));
            let y = if ENC {
                encrypt_words(keys.words(), x)
            } else {
                decrypt_words(keys.words(), x)
            };
            store_set(set, transpose(y));
        }

        /// ECB over every whole block of `buf`: whole sets, then a zero-padded partial set.
        #[target_feature(enable = $feature)]
        fn ecb<const ENC: bool>(keys: &RoundKeys, buf: &mut [u8]) {
            let (sets, tail) = buf.as_chunks_mut::<SET>();
            for set in sets {
                cipher_set::<ENC>(keys, set);
            }
            let tail_len = tail.len() - tail.len() % BLOCK;
            if tail_len > 0 {
                let mut tmp = [0u8; SET];
                tmp[..tail_len].copy_from_slice(&tail[..tail_len]);
                cipher_set::<ENC>(keys, &mut tmp);
                tail[..tail_len].copy_from_slice(&tmp[..tail_len]);
                zeroize::Zeroize::zeroize(&mut tmp);
            }
        }

        #[cfg(test)]
        mod tests {
            use super::*;
            use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};
            use $crate::engine::Direction;
            use $crate::serpent::soft::SerpentSoft;

            /// Fail unless the CPU has `$feature`: the tests are `#[ignore]`d where the build saw
            /// a CPU without it (build.rs), so this fails only for a build moved to another CPU.
            fn require() {
                assert!(
                    std::is_x86_feature_detected!($feature),
                    "no {} on this CPU, though the build's had it: rebuild",
                    $feature
                );
            }

            /// ECB on every block count from 0 to 3 sets and some longer runs, and XTS and CBC
            /// units of several lengths, against the portable engine, with keys of every length.
            #[cfg_attr(not($cpu), ignore = "this CPU lacks the backend's instructions")]
            #[test]
            fn agrees_with_portable() {
                require();
                let mut rng = StdRng::seed_from_u64(SET as u64);
                let lanes = SET / BLOCK;
                let counts = (0..=3 * lanes).chain([7 * lanes + 5, 256, 1000]);
                for (i, blocks) in counts.enumerate() {
                    let mut key = vec![0u8; 1 + i % 32];
                    rng.fill_bytes(&mut key);
                    let simd = $engine::new(&key).expect($feature);
                    let soft = SerpentSoft::new(&key).unwrap();
                    let mut data = vec![0u8; blocks * BLOCK];
                    rng.fill_bytes(&mut data);
                    for dir in [Direction::Encrypt, Direction::Decrypt] {
                        let (mut want, mut got) = (data.clone(), data.clone());
                        match dir {
                            Direction::Encrypt => {
                                soft.encrypt_ecb(&mut want);
                                simd.encrypt_ecb(&mut got);
                            }
                            Direction::Decrypt => {
                                soft.decrypt_ecb(&mut want);
                                simd.decrypt_ecb(&mut got);
                            }
                        }
                        assert!(got == want, "ECB {dir:?}, {}-byte key, {blocks} blocks", key.len());
                    }

                    let unit_len = BLOCK * [1, 2, 3, 5, 16, 17, 32, 256][i % 8];
                    let units = rng.gen_range(1..=5);
                    let mut data = vec![0u8; unit_len * units];
                    rng.fill_bytes(&mut data);
                    let mut ivs = vec![[0u8; BLOCK]; units];
                    for iv in &mut ivs {
                        rng.fill_bytes(iv);
                    }
                    let (mut want, mut got) = (data.clone(), data.clone());
                    soft.xts_encrypt_units(&mut want, unit_len, &ivs);
                    simd.xts_encrypt_units(&mut got, unit_len, &ivs);
                    assert!(got == want, "XTS encrypt, {units} units of {unit_len}");
                    simd.xts_decrypt_units(&mut got, unit_len, &ivs);
                    assert!(got == data, "XTS decrypt, {units} units of {unit_len}");
                    let (mut want, mut got) = (data.clone(), data.clone());
                    soft.cbc_encrypt_units(&mut want, unit_len, &ivs);
                    simd.cbc_encrypt_units(&mut got, unit_len, &ivs);
                    assert!(got == want, "CBC encrypt, {units} units of {unit_len}");
                    simd.cbc_decrypt_units(&mut got, unit_len, &ivs);
                    assert!(got == data, "CBC decrypt, {units} units of {unit_len}");
                }
            }
        }
    };
}

pub(super) use serpent_simd_engine;
