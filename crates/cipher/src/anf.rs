//! The algebraic normal form of a 4-bit S-box, computed at compile time: the bitsliced ciphers
//! (Serpent, Twofish's `q` tables) evaluate each output bit as an XOR of ANDs of the input bits,
//! with no table indexed by data.

/// The algebraic normal form of each output bit of the 4-bit table `s`: bit `m` of `anf(s)[k]`
/// says whether the monomial "AND of the input bits set in `m`" is in output bit `k` (the Moebius
/// transform of the truth table).
pub(crate) const fn anf(s: &[u8; 16]) -> [u16; 4] {
    let mut out = [0u16; 4];
    let mut k = 0;
    while k < 4 {
        let mut t = [0u8; 16];
        let mut x = 0;
        while x < 16 {
            t[x] = (s[x] >> k) & 1;
            x += 1;
        }
        let mut i = 0;
        while i < 4 {
            let mut x = 0;
            while x < 16 {
                if x & (1 << i) != 0 {
                    t[x] ^= t[x ^ (1 << i)];
                }
                x += 1;
            }
            i += 1;
        }
        let mut x = 0;
        while x < 16 {
            out[k] |= (t[x] as u16) << x;
            x += 1;
        }
        k += 1;
    }
    out
}
