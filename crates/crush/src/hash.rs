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
