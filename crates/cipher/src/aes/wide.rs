//! What the two VAES backends share: the round sequence, the XTS tweak arithmetic on 128-bit
//! lanes and the XTS group kernel, written once as a macro that expands inside `vaes512` and
//! `vaes256`. Each copy is then compiled under its module's `#[target_feature]` and inlines its
//! intrinsics; a trait over the register type could not carry `#[target_feature]` on its
//! methods (the same reason as `lea::simd`).
//!
//! The expanding module provides `REGS` (registers per group), `REG` (bytes per register),
//! `GROUP` and `GROUP_BLOCKS`, a keys type with `enc`, `dec` (round keys pre-broadcast to a
//! register) and `rounds`, `rk` (load a round key), `load_reg` and `store_reg` (register `i` of a
//! group), `xor3`, `unit_tweaks` (the tweaks of a unit's first group), the step from one group's
//! tweaks to the next one's, `for_groups` (every group of a buffer, the last one possibly
//! partial, with its index), `broadcast_block` (a block in every lane) and `ctr_lanes` (the
//! counter offsets of a register's lanes, and the step from one register to the next).

/// Expands, in the calling module: `middle_rounds`, `last_round`, `first_key`, `last_key`,
/// `gf_poly`, `mul_lanes`, `mul_bytes`, `next_group`, `stream_reg`, `xts_group`, `StagedTweaks`,
/// the XTS kernel `xts` and the counter-mode kernel `ctr32`, on registers `$v` with the named
/// intrinsics.
macro_rules! vaes_common {
    (
        feature: $feature:tt,
        reg: $v:ty,
        keys: $keys:ty,
        group_step: $step:ident,
        align: $align:literal,
        load_aligned: $load_aligned:ident,
        stream: $stream:ident,
        zero: $zero:ident,
        xor: $xor:ident,
        aesenc: $aesenc:ident,
        aesdec: $aesdec:ident,
        aesenclast: $aesenclast:ident,
        aesdeclast: $aesdeclast:ident,
        set1_epi64: $set1:ident,
        sllv: $sllv:ident,
        srlv: $srlv:ident,
        sub: $sub:ident,
        bslli: $bslli:ident,
        bsrli: $bsrli:ident,
        clmul: $clmul:ident,
        add32: $add32:ident,
        shuffle: $shuffle:ident $(,)?
    ) => {
        /// Store register `i` of a whole group past the caches (a non-temporal store, which
        /// does not fetch the line it replaces) where it lies on a register boundary, else as
        /// `store_reg`. The caller fences (`_mm_sfence`) before anything else may look at the
        /// bytes.
        #[inline]
        #[target_feature(enable = $feature)]
        fn stream_reg(g: &mut [u8], i: usize, v: $v) {
            match g.get_mut(i * REG..(i + 1) * REG) {
                Some(r) if (r.as_ptr() as usize).is_multiple_of(REG) => {
                    // SAFETY: `r` is `REG` writable bytes on a `REG`-byte boundary, as the
                    // store needs.
                    unsafe { $stream(r.as_mut_ptr().cast(), v) }
                }
                _ => store_reg(g, i, v),
            }
        }

        /// The middle rounds (1 .. rounds-1) on `N` registers. One branch on the (public) round
        /// count, then straight-line code: a runtime round loop gets unrolled by LLVM into a
        /// remainder loop plus an unrolled body, which schedules worse.
        #[inline]
        #[target_feature(enable = $feature)]
        fn middle_rounds<const N: usize, const DEC: bool>(k: &$keys, x: &mut [$v; N]) {
            match k.rounds {
                10 => rounds_fixed::<N, DEC, 10>(k, x),
                12 => rounds_fixed::<N, DEC, 12>(k, x),
                _ => rounds_fixed::<N, DEC, 14>(k, x),
            }
        }

        #[inline]
        #[target_feature(enable = $feature)]
        fn rounds_fixed<const N: usize, const DEC: bool, const NR: usize>(
            k: &$keys,
            x: &mut [$v; N],
        ) {
            let keys = if DEC { &k.dec } else { &k.enc };
            for key in &keys[1..NR] {
                let key = rk(key);
                for v in x.iter_mut() {
                    *v = if DEC {
                        $aesdec(*v, key)
                    } else {
                        $aesenc(*v, key)
                    };
                }
            }
        }

        /// The last round with key `key` (the last round key, possibly XORed with a whitening
        /// value).
        #[inline]
        #[target_feature(enable = $feature)]
        fn last_round<const DEC: bool>(x: $v, key: $v) -> $v {
            if DEC {
                $aesdeclast(x, key)
            } else {
                $aesenclast(x, key)
            }
        }

        #[inline]
        #[target_feature(enable = $feature)]
        fn first_key<const DEC: bool>(k: &$keys) -> $v {
            rk(if DEC { &k.dec[0] } else { &k.enc[0] })
        }

        #[inline]
        #[target_feature(enable = $feature)]
        fn last_key<const DEC: bool>(k: &$keys) -> $v {
            rk(if DEC {
                &k.dec[k.rounds]
            } else {
                &k.enc[k.rounds]
            })
        }

        // XTS tweak arithmetic on every 128-bit lane at once (IEEE 1619 little-endian order:
        // bit 0 of byte 0 is the lowest coefficient, so "times a^s" is a left shift of the
        // 128-bit integer).

        /// The reduction constant x^7 + x^2 + x + 1 in the low 64 bits of each lane.
        #[inline]
        #[target_feature(enable = $feature)]
        fn gf_poly() -> $v {
            $set1(0x87)
        }

        /// Lane `j` times `a^(s_j)`, with `shifts` = `s_j` in both 64-bit halves of lane `j`
        /// (s < 57).
        #[inline]
        #[target_feature(enable = $feature)]
        fn mul_lanes(t: $v, shifts: $v) -> $v {
            let shifted = $sllv(t, shifts);
            // The bits pushed out of each half (a count of 64 gives 0 for s = 0).
            let carries = $srlv(t, $sub($set1(64), shifts));
            // Low half's carries go into the high half; the high half's are reduced into the
            // low half.
            let into_high = $bslli::<8>(carries);
            let reduced = $clmul::<0x01>(carries, gf_poly());
            xor3(shifted, into_high, reduced)
        }

        /// Every lane times `a^(8 M)`: an `M`-byte shift of the lane, and the `M` bytes shifted
        /// out (brought down by `TOP = 16 - M` bytes) times 0x87.
        #[inline]
        #[target_feature(enable = $feature)]
        fn mul_bytes<const M: i32, const TOP: i32>(t: $v) -> $v {
            const { assert!(M + TOP == 16 && M <= 7) };
            let top = $bsrli::<TOP>(t);
            $xor($bslli::<M>(t), $clmul::<0x00>(top, gf_poly()))
        }

        /// The tweaks of a unit's next group: every register times the group step. Spelled out
        /// register by register: `array::map` (or a loop) built them in an array on the stack,
        /// to be loaded back.
        #[inline]
        #[target_feature(enable = $feature)]
        fn next_group(t: &[$v; REGS]) -> [$v; REGS] {
            const { assert!(REGS == 8) };
            [
                $step(t[0]),
                $step(t[1]),
                $step(t[2]),
                $step(t[3]),
                $step(t[4]),
                $step(t[5]),
                $step(t[6]),
                $step(t[7]),
            ]
        }

        /// XTS on one group with its tweaks, one per block, from `src` (the group's input
        /// elsewhere, of `g`'s length) or in place into `g`. `next` makes the tweaks of the
        /// following group; it runs between the whitening and the rounds, so its latency chain
        /// (shifts, carry-less multiplies) overlaps this group's AES rounds instead of delaying
        /// the next group's first round. The whitening XORs are folded into the first round
        /// (`xor3`) and the last round key (`aesenclast(x, k ^ t) = aesenclast(x, k) ^ t`).
        #[inline]
        #[target_feature(enable = $feature)]
        fn xts_group<const DEC: bool>(
            k: &$keys,
            src: Option<&[u8]>,
            g: &mut [u8],
            tw: &[$v; REGS],
            next: impl FnOnce() -> [$v; REGS],
        ) -> [$v; REGS] {
            let k0 = first_key::<DEC>(k);
            let mut x = [$zero(); REGS];
            let from: &[u8] = src.unwrap_or(g);
            for (i, v) in x.iter_mut().enumerate() {
                *v = xor3(load_reg(from, i), tw[i], k0);
            }
            let next = next();
            middle_rounds::<REGS, DEC>(k, &mut x);
            let kl = last_key::<DEC>(k);
            // Encrypting from a source elsewhere is storing into the page cache, which is
            // written back, not read: past the caches (see `xts`).
            let past_caches = !DEC && src.is_some();
            for (i, v) in x.iter().enumerate() {
                let out = last_round::<DEC>(*v, $xor(kl, tw[i]));
                if past_caches {
                    stream_reg(g, i, out);
                } else {
                    store_reg(g, i, out);
                }
            }
            next
        }

        /// XTS over whole units of `buf`, in place, or from `src` (of `buf`'s length) into
        /// `buf`. Encrypting from a source stores into `buf` past the caches (`stream_reg`):
        /// that is a write lent by the storage, into the page cache, which the kernel writes
        /// back and nobody reads soon, so a store need not first fetch the line it replaces.
        #[target_feature(enable = $feature)]
        fn xts<const DEC: bool>(
            k: &$keys,
            src: Option<&[u8]>,
            buf: &mut [u8],
            unit_len: usize,
            tweaks: &[Block],
        ) {
            if buf.is_empty() {
                return;
            }
            if unit_len.is_multiple_of(GROUP) {
                // Sector-sized units: groups never straddle a unit, all tweaks stay in registers.
                let groups_per_unit = unit_len / GROUP;
                let mut tw = unit_tweaks(&tweaks[0]);
                for (u, unit) in buf.chunks_exact_mut(unit_len).enumerate() {
                    // Past the last unit this makes tweaks nobody uses, to keep the loop simple.
                    let next_unit = tweaks.get(u + 1).unwrap_or(&tweaks[u]);
                    for (gi, g) in unit.chunks_exact_mut(GROUP).enumerate() {
                        let from = super::x86::source_group(src, u * unit_len + gi * GROUP, GROUP);
                        tw = xts_group::<DEC>(k, from, g, &tw, || {
                            if gi + 1 < groups_per_unit {
                                next_group(&tw)
                            } else {
                                unit_tweaks(next_unit)
                            }
                        });
                    }
                }
                if !DEC && src.is_some() {
                    // Non-temporal stores are weakly ordered: done before the caller goes on.
                    _mm_sfence();
                }
            } else {
                // Other unit sizes: groups across unit boundaries. The tweak sequence (alpha
                // steps, restarting at every unit) is made with 128-bit integer arithmetic one
                // group ahead, stored, and loaded as registers. Rare enough to run in place.
                if let Some(src) = src {
                    buf.copy_from_slice(src);
                }
                let mut seq = TweakSeq::new(tweaks, unit_len);
                let mut staged = StagedTweaks([0; GROUP_BLOCKS]);
                let len = buf.len();
                seq.fill(&mut staged.0, len.min(GROUP) / BLOCK);
                let mut tw = staged.load();
                for_groups(buf, |g, gi| {
                    let next_blocks = len.saturating_sub((gi + 1) * GROUP).min(GROUP) / BLOCK;
                    tw = xts_group::<DEC>(k, None, g, &tw, || {
                        seq.fill(&mut staged.0, next_blocks);
                        staged.load()
                    });
                });
                staged.0.zeroize();
            }
        }

        /// Counter mode (`inc32`) on each job: the counter blocks of a group are made in
        /// registers, byte-reversed so that one 32-bit add per register steps every lane, and the
        /// data is XORed in through the last round key. A tail shorter than a group runs padded
        /// in a stack buffer.
        #[target_feature(enable = $feature)]
        fn ctr32(k: &$keys, jobs: &mut [(Block, &mut [u8])]) {
            let reverse = broadcast_block(&super::x86::REVERSE_BYTES);
            let (offsets, step) = ctr_lanes();
            let (k0, kl) = (first_key::<false>(k), last_key::<false>(k));
            for (counter, buf) in jobs.iter_mut() {
                let mut c = $add32($shuffle(broadcast_block(counter), reverse), offsets);
                let mut group = |g: &mut [u8]| {
                    let mut x = [$zero(); REGS];
                    for v in x.iter_mut() {
                        *v = $xor($shuffle(c, reverse), k0);
                        c = $add32(c, step);
                    }
                    middle_rounds::<REGS, false>(k, &mut x);
                    for (i, v) in x.iter().enumerate() {
                        store_reg(g, i, last_round::<false>(*v, $xor(kl, load_reg(g, i))));
                    }
                };
                let mut groups = buf.chunks_exact_mut(GROUP);
                for g in &mut groups {
                    group(g);
                }
                let tail = groups.into_remainder();
                if !tail.is_empty() {
                    let mut pad = [0u8; GROUP];
                    pad[..tail.len()].copy_from_slice(tail);
                    group(&mut pad);
                    tail.copy_from_slice(&pad[..tail.len()]);
                    crate::wipe::zero(&mut pad);
                }
            }
        }

        /// One group's tweaks in memory (little-endian `u128` = the block's byte order on x86).
        #[repr(C, align($align))]
        struct StagedTweaks([u128; GROUP_BLOCKS]);

        impl StagedTweaks {
            #[inline]
            #[target_feature(enable = $feature)]
            fn load(&self) -> [$v; REGS] {
                let mut tw = [$zero(); REGS];
                for (v, lanes) in tw.iter_mut().zip(self.0.chunks_exact(REG / BLOCK)) {
                    // SAFETY: `lanes` is one register's bytes, aligned to the register size (the
                    // array is, and each chunk starts at a multiple of it).
                    *v = unsafe { $load_aligned(lanes.as_ptr().cast()) };
                }
                tw
            }
        }
    };
}

pub(crate) use vaes_common;
