//! The mode loops the LEA SIMD backends share.
//!
//! The AVX2 and AVX-512 backends differ only in their register width and in a handful of
//! primitives (loads and stores of a set, the in-lane transpose, the round with or without native
//! rotates, tweak powers, the CBC shift, the gather of one block from each unit). Everything built
//! from those, the engine type, the cipher schedule over `N` sets, and the ECB, XTS and CBC loops,
//! is written once here as a macro that expands inside each backend module, so that every loop is
//! compiled under that backend's `#[target_feature]` and inlines its primitives. A trait over the
//! register type would need the primitives to be trait methods, which cannot carry
//! `#[target_feature]` and would not inline into the kernels.
//!
//! The expanding module provides: `SET` (bytes per set), `LANE_BLOCK` (block of its set each lane
//! holds after `transpose`), `State` (four registers), `load_set`, `store_set`, `transpose`,
//! `xor4`, `splat`, `round`, `inv_round`, `lane_exponents` (per-lane exponents of the first two
//! sets' tweaks), `tweak_powers`, the pair step named by `step`, `shifted`, `broadcast_block`
//! and `gather`.

/// Expands the LEA engine `$engine` for `$feature` and its kernels in the calling module, with the
/// tests every backend runs (`$pair_step` steps the tweaks of a set by one pair of sets; the tests are ignored where the
/// build's CPU lacks `$cpu`).
macro_rules! lea_simd_engine {
    (
        $(#[$meta:meta])*
        engine: $engine:ident,
        feature: $feature:tt,
        cpu: $cpu:ident,
        backend: $backend:expr,
        pair_step: $pair_step:ident $(,)?
    ) => {
        use $crate::engine::{Block, BlockEngine, Direction, BLOCK};
        use $crate::lea::soft::{self, RoundKeys};

        /// Blocks per set: one 32-bit lane per block.
        const LANES: usize = SET / BLOCK;
        /// Bytes per pair of sets.
        const PAIR: usize = 2 * SET;

        $(#[$meta])*
        pub(crate) struct $engine {
            keys: RoundKeys,
        }

        impl $engine {
            /// Expand `key` (16, 24 or 32 bytes); `None` if the CPU lacks the backend's feature.
            pub(crate) fn new(key: &[u8]) -> Option<Self> {
                if !std::is_x86_feature_detected!($feature) {
                    return None;
                }
                Some(Self {
                    keys: RoundKeys::new(key),
                })
            }
        }

        impl BlockEngine for $engine {
            fn backend(&self) -> $crate::backend::Backend {
                $backend
            }

            fn stack_bytes(&self) -> usize {
                $crate::wipe::SHALLOW_STACK
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

            fn xts_encrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
                if !unit_len.is_multiple_of(SET) {
                    return soft::xts_chunked(self, buf, unit_len, tweaks, Direction::Encrypt);
                }
                // SAFETY: as in `encrypt_ecb`.
                unsafe { xts::<true>(&self.keys, buf, unit_len, tweaks) }
            }

            fn xts_decrypt_units(&self, buf: &mut [u8], unit_len: usize, tweaks: &[Block]) {
                if !unit_len.is_multiple_of(SET) {
                    return soft::xts_chunked(self, buf, unit_len, tweaks, Direction::Decrypt);
                }
                // SAFETY: as in `encrypt_ecb`.
                unsafe { xts::<false>(&self.keys, buf, unit_len, tweaks) }
            }

            fn cbc_encrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
                // SAFETY: as in `encrypt_ecb`.
                unsafe { cbc_encrypt(&self.keys, buf, unit_len, ivs) }
            }

            fn cbc_decrypt_units(&self, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
                if !unit_len.is_multiple_of(SET) {
                    return soft::cbc_decrypt_chunked(self, buf, unit_len, ivs);
                }
                // SAFETY: as in `encrypt_ecb`.
                unsafe { cbc_decrypt(&self.keys, buf, unit_len, ivs) }
            }
        }

        #[inline]
        #[target_feature(enable = $feature)]
        fn load_block(bytes: &[u8; BLOCK]) -> __m128i {
            // SAFETY: one 16-byte unaligned load of exactly `bytes`.
            unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
        }

        /// Load 16 bytes from `p`.
        ///
        /// # Safety
        /// `p..p + 16` must be readable.
        #[inline]
        #[target_feature(enable = $feature)]
        unsafe fn load_at(p: *const u8) -> __m128i {
            // SAFETY: guaranteed by the caller; `loadu` has no alignment requirement.
            unsafe { _mm_loadu_si128(p.cast()) }
        }

        /// The two sets of a pair, as fixed-size arrays (bounds proved once).
        #[inline]
        fn split_pair(pair: &mut [u8; PAIR]) -> (&mut [u8; SET], &mut [u8; SET]) {
            let (a, b) = pair.split_at_mut(SET);
            (a.try_into().unwrap(), b.try_into().unwrap())
        }

        /// Encrypt (`ENC`) or decrypt `N` transposed sets, round by round across the sets so
        /// their independent dependency chains overlap.
        #[inline]
        #[target_feature(enable = $feature)]
        fn cipher<const ENC: bool, const N: usize>(keys: &RoundKeys, s: &mut [State; N]) {
            if ENC {
                for k in keys.keys().chunks_exact(4) {
                    for [a, b, c, d] in s.iter_mut() {
                        round(a, b, c, d, &k[0]);
                        round(b, c, d, a, &k[1]);
                        round(c, d, a, b, &k[2]);
                        round(d, a, b, c, &k[3]);
                    }
                }
            } else {
                for k in keys.dec_keys().chunks_exact(4).rev() {
                    for [a, b, c, d] in s.iter_mut() {
                        inv_round(d, a, b, c, &k[3]);
                        inv_round(c, d, a, b, &k[2]);
                        inv_round(b, c, d, a, &k[1]);
                        inv_round(a, b, c, d, &k[0]);
                    }
                }
            }
        }

        /// ECB over every whole block of `buf`: pairs of sets, one set, then a zero-padded
        /// partial set.
        #[target_feature(enable = $feature)]
        fn ecb<const ENC: bool>(keys: &RoundKeys, buf: &mut [u8]) {
            let (pairs, rest) = buf.as_chunks_mut::<PAIR>();
            for pair in pairs {
                let (a, b) = split_pair(pair);
                let mut s = [transpose(load_set(a)), transpose(load_set(b))];
                cipher::<ENC, 2>(keys, &mut s);
                store_set(a, transpose(s[0]));
                store_set(b, transpose(s[1]));
            }
            let (sets, tail) = rest.as_chunks_mut::<SET>();
            for set in sets {
                let mut s = [transpose(load_set(set))];
                cipher::<ENC, 1>(keys, &mut s);
                store_set(set, transpose(s[0]));
            }
            let tail_len = tail.len() - tail.len() % BLOCK;
            if tail_len > 0 {
                let mut tmp = [0u8; SET];
                tmp[..tail_len].copy_from_slice(&tail[..tail_len]);
                let mut s = [transpose(load_set(&tmp))];
                cipher::<ENC, 1>(keys, &mut s);
                store_set(&mut tmp, transpose(s[0]));
                tail[..tail_len].copy_from_slice(&tmp[..tail_len]);
                zeroize::Zeroize::zeroize(&mut tmp);
            }
        }

        /// XTS over whole units, `unit_len` a multiple of `SET`. Per unit: the tweaks of the
        /// first two sets come from the unit's tweak by per-lane shifts, later ones by one pair
        /// step per pair.
        #[target_feature(enable = $feature)]
        fn xts<const ENC: bool>(
            keys: &RoundKeys,
            buf: &mut [u8],
            unit_len: usize,
            tweaks: &[Block],
        ) {
            let (e_a, e_b) = lane_exponents();
            for (unit, tweak) in buf.chunks_exact_mut(unit_len).zip(tweaks) {
                let t: State = core::array::from_fn(|i| {
                    splat(u32::from_le_bytes(tweak[4 * i..4 * i + 4].try_into().unwrap()))
                });
                let mut ta = tweak_powers(&t, e_a);
                let mut tb = tweak_powers(&t, e_b);
                let (pairs, rest) = unit.as_chunks_mut::<PAIR>();
                for pair in pairs {
                    let (a, b) = split_pair(pair);
                    let mut s = [
                        xor4(transpose(load_set(a)), ta),
                        xor4(transpose(load_set(b)), tb),
                    ];
                    cipher::<ENC, 2>(keys, &mut s);
                    store_set(a, transpose(xor4(s[0], ta)));
                    store_set(b, transpose(xor4(s[1], tb)));
                    ta = $pair_step(ta);
                    tb = $pair_step(tb);
                }
                // `unit_len % SET == 0`, so at most one set is left; its tweaks continue from `ta`.
                if let Ok(set) = <&mut [u8; SET]>::try_from(rest) {
                    let mut s = [xor4(transpose(load_set(set)), ta)];
                    cipher::<ENC, 1>(keys, &mut s);
                    store_set(set, transpose(xor4(s[0], ta)));
                }
            }
        }

        /// CBC decryption of whole units, `unit_len` a multiple of `SET`: all blocks are
        /// independent, so pairs of sets run like ECB and the chaining XOR comes from the loaded
        /// ciphertext.
        #[target_feature(enable = $feature)]
        fn cbc_decrypt(keys: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
            for (unit, iv) in buf.chunks_exact_mut(unit_len).zip(ivs) {
                let mut prev = broadcast_block(load_block(iv));
                let (pairs, rest) = unit.as_chunks_mut::<PAIR>();
                for pair in pairs {
                    let (a, b) = split_pair(pair);
                    let (ra, rb) = (load_set(a), load_set(b));
                    let pa = shifted(prev, &ra);
                    let pb = shifted(ra[3], &rb);
                    prev = rb[3];
                    let mut s = [transpose(ra), transpose(rb)];
                    cipher::<false, 2>(keys, &mut s);
                    store_set(a, xor4(transpose(s[0]), pa));
                    store_set(b, xor4(transpose(s[1]), pb));
                }
                if let Ok(set) = <&mut [u8; SET]>::try_from(rest) {
                    let r = load_set(set);
                    let p = shifted(prev, &r);
                    let mut s = [transpose(r)];
                    cipher::<false, 1>(keys, &mut s);
                    store_set(set, xor4(transpose(s[0]), p));
                }
            }
        }

        /// CBC encryption: each unit is a serial chain, so `LANES` units run side by side, one per
        /// lane, with the chaining value kept transposed. In a last group of `n < LANES` units the
        /// idle lanes repeat the last unit and are never stored.
        #[target_feature(enable = $feature)]
        fn cbc_encrypt(keys: &RoundKeys, buf: &mut [u8], unit_len: usize, ivs: &[Block]) {
            assert!(
                unit_len > 0 && unit_len.is_multiple_of(BLOCK),
                "unit length must be a positive multiple of 16"
            );
            let units = (buf.len() / unit_len).min(ivs.len());
            for first in (0..units).step_by(LANES) {
                let n = (units - first).min(LANES);
                let group = &mut buf[first * unit_len..(first + n) * unit_len];
                let offs: [usize; LANES] = core::array::from_fn(|k| k.min(n - 1) * unit_len);
                let mut out = [0u8; SET];
                for (slot, &o) in out.chunks_exact_mut(BLOCK).zip(&offs) {
                    slot.copy_from_slice(&ivs[first + o / unit_len]);
                }
                let mut chain = transpose(load_set(&out));
                let base = group.as_mut_ptr();
                for at in (0..unit_len).step_by(BLOCK) {
                    // SAFETY: `offs[k] + at + 16 <= (n - 1) * unit_len + unit_len = group.len()`.
                    let p = unsafe { gather(base, &offs, at) };
                    let mut s = [xor4(transpose(p), chain)];
                    cipher::<true, 1>(keys, &mut s);
                    chain = s[0];
                    // Through a stack buffer: plain 16-byte copies instead of lane extracts.
                    store_set(&mut out, transpose(chain));
                    for (k, block) in out.chunks_exact(BLOCK).take(n).enumerate() {
                        // SAFETY: as for `gather`, the block is inside `group`, which `base`
                        // borrows uniquely; lanes `k < n` are distinct units.
                        unsafe {
                            core::ptr::copy_nonoverlapping(
                                block.as_ptr(),
                                base.add(offs[k] + at),
                                BLOCK,
                            )
                        };
                    }
                }
                zeroize::Zeroize::zeroize(&mut out);
            }
        }

        #[cfg(test)]
        mod tests {
            use super::*;
            use $crate::lea::soft::test_support::*;

            fn make(key: &[u8]) -> Box<dyn BlockEngine> {
                Box::new($engine::new(key).expect($feature))
            }

            /// Fail unless the CPU has `$feature`: the tests are `#[ignore]`d where the build saw
            /// a CPU without it (build.rs), so this fails only for a build moved to another CPU.
            fn require() {
                assert!(
                    std::is_x86_feature_detected!($feature),
                    "no {} on this CPU, though the build's had it: rebuild",
                    $feature
                );
            }

            #[cfg_attr(not($cpu), ignore = "this CPU lacks the backend's instructions")]

            #[test]
            fn kisa_vectors() {
                {
                    require();
                    check_kisa(&make);
                }
            }

            #[cfg_attr(not($cpu), ignore = "this CPU lacks the backend's instructions")]

            #[test]
            fn xts_vectors() {
                {
                    require();
                    check_xts(&make);
                }
            }

            /// Sets whose blocks hold their index in every word, transposed: word 0's lanes name
            /// the block each lane holds, which the tweak exponents rely on.
            #[cfg_attr(not($cpu), ignore = "this CPU lacks the backend's instructions")]
            #[test]
            fn lane_order_matches_transpose() {
                require();
                let mut bytes = [0u8; SET];
                for (i, b) in bytes.chunks_exact_mut(BLOCK).enumerate() {
                    for w in b.chunks_exact_mut(4) {
                        w.copy_from_slice(&(i as u32).to_le_bytes());
                    }
                }
                // SAFETY: this test only runs after checking for the feature.
                let lanes = unsafe { word0_lanes(&bytes) };
                assert_eq!(lanes, LANE_BLOCK);
            }

            #[target_feature(enable = $feature)]
            fn word0_lanes(bytes: &[u8; SET]) -> [i32; LANES] {
                let w = transpose(load_set(bytes));
                let mut out = [0u8; SET];
                store_set(&mut out, [w[0]; 4]);
                core::array::from_fn(|i| {
                    i32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap())
                })
            }

            #[cfg_attr(not($cpu), ignore = "this CPU lacks the backend's instructions")]

            #[test]
            fn random_against_portable_and_defaults() {
                {
                    require();
                    compare_random(&make, PAIR as u64, 300);
                }
            }
        }
    };
}

pub(super) use lea_simd_engine;
