//! Serpent's rounds, written once over a word type.
//!
//! Every backend runs the same bitsliced circuit: the S-boxes as algebraic normal forms (XORs of
//! ANDs of the four input words, the forms computed from the tables at compile time in
//! [`super::soft`]) and the linear transform as rotations, shifts and XORs. Only the word differs:
//! a `u32` (one block, the portable code), an `__m256i` (word `i` of eight blocks) or an
//! `__m512i` (sixteen blocks). The macro expands the rounds inside the calling module, over that
//! module's `W` and primitives, so that in the SIMD modules every function is compiled under the
//! backend's `#[target_feature]` and inlines the intrinsics (a trait over the word type would need
//! the primitives as trait methods, which cannot carry `#[target_feature]`).
//!
//! The expanding module provides `W` and `and`, `xor`, `not`, `rol::<N>`, `shl::<N>` (rotate and
//! shift every 32-bit word left by `N`, `0 < N < 32`) and `splat` (a round-key word in every
//! lane). Nothing here indexes memory by data or branches on it: the S-box forms are constants.

/// Expands `sbox`, `linear`, `linear_inverse`, `encrypt_words` and `decrypt_words` over the
/// calling module's `W`; every function gets the attributes given (`#[inline(always)]` for the
/// portable code, `#[inline]` and the backend's `#[target_feature]` for a SIMD one).
macro_rules! serpent_rounds {
    ($(#[$attr:meta])*) => {
        /// S-box `I` (its inverse if `INV`) over the bit columns of `x`: bit `j` of `x[0]` is the
        /// low input bit of column `j`. The normal form is a constant here, so the loops fold into
        /// straight-line ANDs and XORs of the words.
        $(#[$attr])*
        fn sbox<const I: usize, const INV: bool>(x: [W; 4]) -> [W; 4] {
            let forms = if INV {
                $crate::serpent::soft::BACKWARD[I]
            } else {
                $crate::serpent::soft::FORWARD[I]
            };
            let [a, b, c, d] = x;
            let (ab, ac, bc) = (and(a, b), and(a, c), and(b, c));
            let (ad, bd, cd) = (and(a, d), and(b, d), and(c, d));
            let (abc, abd, acd, bcd) = (and(ab, c), and(ab, d), and(ac, d), and(bc, d));
            // Monomial `m` is the AND of the inputs whose bits are set in `m`; the constant
            // monomial (m = 0) is applied as a NOT at the end.
            let monomials = [a, a, b, ab, c, ac, bc, abc, d, ad, bd, abd, cd, acd, bcd, and(abc, d)];
            let zero = xor(a, a);
            let mut out = [zero; 4];
            let mut k = 0;
            while k < 4 {
                let form = forms[k];
                let mut o = zero;
                let mut m = 1;
                while m < 16 {
                    if (form >> m) & 1 == 1 {
                        o = xor(o, monomials[m]);
                    }
                    m += 1;
                }
                out[k] = if form & 1 == 1 { not(o) } else { o };
                k += 1;
            }
            out
        }

        $(#[$attr])*
        fn linear(x: [W; 4]) -> [W; 4] {
            let [x0, x1, x2, x3] = x;
            let x0 = rol::<13>(x0);
            let x2 = rol::<3>(x2);
            let x1 = xor(xor(x1, x0), x2);
            let x3 = xor(xor(x3, x2), shl::<3>(x0));
            let x1 = rol::<1>(x1);
            let x3 = rol::<7>(x3);
            let x0 = xor(xor(x0, x1), x3);
            let x2 = xor(xor(x2, x3), shl::<7>(x1));
            [rol::<5>(x0), x1, rol::<22>(x2), x3]
        }

        $(#[$attr])*
        fn linear_inverse(x: [W; 4]) -> [W; 4] {
            let [x0, x1, x2, x3] = x;
            let x2 = rol::<10>(x2);
            let x0 = rol::<27>(x0);
            let x2 = xor(xor(x2, x3), shl::<7>(x1));
            let x0 = xor(xor(x0, x1), x3);
            let x3 = rol::<25>(x3);
            let x1 = rol::<31>(x1);
            let x3 = xor(xor(x3, x2), shl::<3>(x0));
            let x1 = xor(xor(x1, x0), x2);
            [rol::<19>(x0), x1, rol::<29>(x2), x3]
        }

        $(#[$attr])*
        fn add_key(x: [W; 4], k: &[u32; 4]) -> [W; 4] {
            [
                xor(x[0], splat(k[0])),
                xor(x[1], splat(k[1])),
                xor(x[2], splat(k[2])),
                xor(x[3], splat(k[3])),
            ]
        }

        /// Round `base + N` of the encryption without the last round's final key (S-box `N`;
        /// the last round has no linear transform).
        $(#[$attr])*
        fn round<const N: usize>(keys: &[[u32; 4]; 33], x: [W; 4], base: usize) -> [W; 4] {
            let x = sbox::<N, false>(add_key(x, &keys[base + N]));
            if base + N < 31 {
                linear(x)
            } else {
                x
            }
        }

        /// Round `base + N` undone, but for the last round's final key.
        $(#[$attr])*
        fn unround<const N: usize>(keys: &[[u32; 4]; 33], x: [W; 4], base: usize) -> [W; 4] {
            let x = if base + N < 31 { linear_inverse(x) } else { x };
            add_key(sbox::<N, true>(x), &keys[base + N])
        }

        /// The 32 rounds on the words of one block per lane. Key 32 is added after the loop,
        /// so that no key is loop-invariant: the compiler would keep it in registers across the
        /// loop, and where registers are short (AVX2) spill it to the stack.
        $(#[$attr])*
        fn encrypt_words(keys: &[[u32; 4]; 33], mut x: [W; 4]) -> [W; 4] {
            for base in [0, 8, 16, 24] {
                x = round::<0>(keys, x, base);
                x = round::<1>(keys, x, base);
                x = round::<2>(keys, x, base);
                x = round::<3>(keys, x, base);
                x = round::<4>(keys, x, base);
                x = round::<5>(keys, x, base);
                x = round::<6>(keys, x, base);
                x = round::<7>(keys, x, base);
            }
            add_key(x, &keys[32])
        }

        /// Inverse of `encrypt_words`.
        $(#[$attr])*
        fn decrypt_words(keys: &[[u32; 4]; 33], x: [W; 4]) -> [W; 4] {
            let mut x = add_key(x, &keys[32]);
            for base in [24, 16, 8, 0] {
                x = unround::<7>(keys, x, base);
                x = unround::<6>(keys, x, base);
                x = unround::<5>(keys, x, base);
                x = unround::<4>(keys, x, base);
                x = unround::<3>(keys, x, base);
                x = unround::<2>(keys, x, base);
                x = unround::<1>(keys, x, base);
                x = unround::<0>(keys, x, base);
            }
            x
        }
    };
}

pub(super) use serpent_rounds;
