//! Robert Jenkins' 32-bit mixing hash as CRUSH uses it (`rjenkins1`, hash type 0): the
//! 2- to 5-input variants every bucket algorithm and the out-device test draw from, and the
//! single-input variant. Any other hash type hashes to 0, as Ceph's does.

/// The only hash type CRUSH defines: `rjenkins1`.
pub const HASH_RJENKINS1: u8 = 0;

const SEED: u32 = 1_315_423_911;
const X0: u32 = 231_232;
const Y0: u32 = 1232;

#[inline(always)]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 13);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 8);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 13);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 12);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 16);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 5);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 3);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 10);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 15);
}

/// One input.
#[inline]
pub fn hash32_1(a: u32) -> u32 {
    let mut h = SEED ^ a;
    let (mut a, mut b, mut x, mut y) = (a, a, X0, Y0);
    mix(&mut b, &mut x, &mut h);
    mix(&mut y, &mut a, &mut h);
    h
}

/// Two inputs (the out-device test, `--pool-id` input mixing).
#[inline]
pub fn hash32_2(a: u32, b: u32) -> u32 {
    let mut h = SEED ^ a ^ b;
    let (mut a, mut b, mut x, mut y) = (a, b, X0, Y0);
    mix(&mut a, &mut b, &mut h);
    mix(&mut x, &mut a, &mut h);
    mix(&mut b, &mut y, &mut h);
    h
}

/// Three inputs (straw, straw2, uniform permutations).
#[inline]
pub fn hash32_3(a: u32, b: u32, c: u32) -> u32 {
    let mut h = SEED ^ a ^ b ^ c;
    let (mut a, mut b, mut c, mut x, mut y) = (a, b, c, X0, Y0);
    mix(&mut a, &mut b, &mut h);
    mix(&mut c, &mut x, &mut h);
    mix(&mut y, &mut a, &mut h);
    mix(&mut b, &mut x, &mut h);
    mix(&mut y, &mut c, &mut h);
    h
}

/// Four inputs (list and tree buckets).
#[inline]
pub fn hash32_4(a: u32, b: u32, c: u32, d: u32) -> u32 {
    let mut h = SEED ^ a ^ b ^ c ^ d;
    let (mut a, mut b, mut c, mut d, mut x, mut y) = (a, b, c, d, X0, Y0);
    mix(&mut a, &mut b, &mut h);
    mix(&mut c, &mut d, &mut h);
    mix(&mut a, &mut x, &mut h);
    mix(&mut y, &mut b, &mut h);
    mix(&mut c, &mut x, &mut h);
    mix(&mut y, &mut d, &mut h);
    h
}

/// Five inputs.
#[inline]
pub fn hash32_5(a: u32, b: u32, c: u32, d: u32, e: u32) -> u32 {
    let mut h = SEED ^ a ^ b ^ c ^ d ^ e;
    let (mut a, mut b, mut c, mut d, mut e, mut x, mut y) = (a, b, c, d, e, X0, Y0);
    mix(&mut a, &mut b, &mut h);
    mix(&mut c, &mut d, &mut h);
    mix(&mut e, &mut x, &mut h);
    mix(&mut y, &mut a, &mut h);
    mix(&mut b, &mut x, &mut h);
    mix(&mut y, &mut c, &mut h);
    mix(&mut d, &mut x, &mut h);
    mix(&mut y, &mut e, &mut h);
    h
}

/// `hash32_3` for a bucket's hash type: 0 for any type but rjenkins1.
#[inline]
pub fn typed_hash32_3(ty: u8, a: u32, b: u32, c: u32) -> u32 {
    if ty == HASH_RJENKINS1 {
        hash32_3(a, b, c)
    } else {
        0
    }
}

/// `hash32_4` for a bucket's hash type: 0 for any type but rjenkins1.
#[inline]
pub fn typed_hash32_4(ty: u8, a: u32, b: u32, c: u32, d: u32) -> u32 {
    if ty == HASH_RJENKINS1 {
        hash32_4(a, b, c, d)
    } else {
        0
    }
}

/// Lanes hashed at once by [`hash32_3_lanes`].
pub const LANES: usize = 8;

/// One statement of the mix on every lane: `p = (p - q - r) ^ (r >> s)` or `^ (r << s)`.
macro_rules! step {
    ($p:ident, $q:ident, $r:ident, >> $s:literal) => {
        for i in 0..N {
            $p[i] = $p[i].wrapping_sub($q[i]).wrapping_sub($r[i]) ^ ($r[i] >> $s);
        }
    };
    ($p:ident, $q:ident, $r:ident, << $s:literal) => {
        for i in 0..N {
            $p[i] = $p[i].wrapping_sub($q[i]).wrapping_sub($r[i]) ^ ($r[i] << $s);
        }
    };
}

#[inline(always)]
fn mix_lanes<const N: usize>(a: &mut [u32; N], b: &mut [u32; N], c: &mut [u32; N]) {
    step!(a, b, c, >> 13);
    step!(b, c, a, << 8);
    step!(c, a, b, >> 13);
    step!(a, b, c, >> 12);
    step!(b, c, a, << 16);
    step!(c, a, b, >> 5);
    step!(a, b, c, >> 3);
    step!(b, c, a, << 10);
    step!(c, a, b, >> 15);
}

/// [`hash32_3`] of `(a, b[i], c)` for `N` values of `b` at once, written statement by
/// statement over all lanes so the compiler emits SIMD; equal to `N` scalar calls. Always
/// inlined, so a caller compiled for a wider instruction set gets it in that set. (Sixteen
/// lanes on AVX2 were measured slower than eight: the state no longer fits the registers.)
#[inline(always)]
pub fn hash32_3_lanes<const N: usize>(a: u32, b: &[u32; N], c: u32) -> [u32; N] {
    let mut h = [0u32; N];
    for i in 0..N {
        h[i] = SEED ^ a ^ b[i] ^ c;
    }
    let mut a = [a; N];
    let mut b = *b;
    let mut c = [c; N];
    let mut x = [X0; N];
    let mut y = [Y0; N];
    mix_lanes(&mut a, &mut b, &mut h);
    mix_lanes(&mut c, &mut x, &mut h);
    mix_lanes(&mut y, &mut a, &mut h);
    mix_lanes(&mut b, &mut x, &mut h);
    mix_lanes(&mut y, &mut c, &mut h);
    h
}

/// [`hash32_3`] of `(a[i], b[i], c)` for `N` lanes at once: `N` inputs `x` hashed against one
/// item each (of the same bucket or of different ones) for one replica number `c`; equal to
/// `N` scalar calls, always inlined like [`hash32_3_lanes`].
#[inline(always)]
pub fn hash32_3_lanes_ab<const N: usize>(a: &[u32; N], b: &[u32; N], c: u32) -> [u32; N] {
    let mut h = [0u32; N];
    for i in 0..N {
        h[i] = SEED ^ a[i] ^ b[i] ^ c;
    }
    let mut a = *a;
    let mut b = *b;
    let mut c = [c; N];
    let mut x = [X0; N];
    let mut y = [Y0; N];
    mix_lanes(&mut a, &mut b, &mut h);
    mix_lanes(&mut c, &mut x, &mut h);
    mix_lanes(&mut y, &mut a, &mut h);
    mix_lanes(&mut b, &mut x, &mut h);
    mix_lanes(&mut y, &mut c, &mut h);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_equal_scalar() {
        let mut b = [0u32; LANES];
        for (i, v) in b.iter_mut().enumerate() {
            *v = (i as u32).wrapping_mul(0x9e37_79b9) ^ 0xffff_fff0;
        }
        for x in [0u32, 1, 77, 0xdead_beef] {
            for r in [0u32, 3, 1000] {
                let lanes = hash32_3_lanes(x, &b, r);
                for i in 0..LANES {
                    assert_eq!(lanes[i], hash32_3(x, b[i], r));
                }
                let mut b16 = [0u32; 16];
                for (i, v) in b16.iter_mut().enumerate() {
                    *v = b[i % LANES] ^ i as u32;
                }
                let wide = hash32_3_lanes(x, &b16, r);
                for i in 0..16 {
                    assert_eq!(wide[i], hash32_3(x, b16[i], r));
                }
                let xs: [u32; LANES] = std::array::from_fn(|i| x ^ (i as u32).wrapping_mul(77));
                let across = hash32_3_lanes_ab(&xs, &b, r);
                for i in 0..LANES {
                    assert_eq!(across[i], hash32_3(xs[i], b[i], r));
                }
            }
        }
    }

    #[test]
    fn hashes_are_not_trivial() {
        // Each input position changes the result.
        let base = hash32_5(1, 2, 3, 4, 5);
        assert_ne!(base, hash32_5(0, 2, 3, 4, 5));
        assert_ne!(base, hash32_5(1, 2, 3, 4, 6));
        assert_ne!(hash32_4(1, 2, 3, 4), hash32_4(1, 2, 4, 3));
        assert_ne!(hash32_2(1, 2), hash32_2(2, 1));
        assert_ne!(hash32_1(0), hash32_1(1));
    }
}
