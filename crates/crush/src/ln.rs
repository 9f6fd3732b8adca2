//! `crush_ln`: straw2's fixed-point logarithm, `2^44 * log2(u + 1)` for `u` in `0..=0xffff`,
//! computed the way Ceph computes it, from two lookup tables.
//!
//! The tables are generated here at compile time from their definition, in exact integer
//! arithmetic (an `atanh` series in 78-bit fixed point, no floating point):
//!
//! * `RH[k] = ceil(2^48 / (1 + k/128))` and `LH[k] = floor(2^48 * log2(1 + k/128))`, `k` in
//!   `0..=128`;
//! * `LL[k] = floor(2^48 * log2(1 + k/2^15))`, `k` in `0..=255`.
//!
//! Ceph's published tables (`crush_ln_table.h`, the ones every Ceph cluster maps with) depart
//! from that definition in a few places, and placement must be bit-identical to Ceph's, so
//! those departures are reproduced as data: `LH[128]` is `0xffff_0000_0000` instead of `2^48`;
//! most `LL[k]` for `k >= 2` carry an extra `0x1_4770_0000` (all but the indices in
//! [`LL_WITHOUT_OFFSET`]); and 23 entries ([`LL_IRREGULAR`]) hold values of no evident formula.
//! `tests/ln_tables.rs` checks the generated tables entry by entry against the tables inside
//! the installed Ceph library (`libceph-common`), and the differential tests check the
//! mappings they produce against `crushtool`.

/// Fixed-point scale of the series: 2^78.
const SHIFT: u32 = 78;

/// `ln(a / b)` for `a > b > 0`, scaled by 2^78, truncated: `2 * atanh((a-b)/(a+b))`.
const fn ln_ratio(a: u128, b: u128) -> u128 {
    let p = a - b;
    let q = a + b;
    let mut term = (1u128 << SHIFT) * p / q;
    let mut sum = 0u128;
    let mut n = 0u128;
    while term != 0 {
        sum += term / (2 * n + 1);
        term = term * p / q * p / q;
        n += 1;
    }
    2 * sum
}

/// `floor(2^48 * log2(a / b))` for `a >= b > 0`.
const fn log2_q48(a: u128, b: u128) -> u64 {
    if a == b {
        return 0;
    }
    let ln2 = ln_ratio(2, 1);
    ((ln_ratio(a, b) << 48) / ln2) as u64
}

/// Added to most `LL` entries in Ceph's table (see the module documentation).
const LL_OFFSET: u64 = 0x1_4770_0000;

/// Indices `k >= 2` whose `LL` entry in Ceph's table is the plain definition, with no offset.
pub const LL_WITHOUT_OFFSET: [usize; 19] = [
    203, 216, 222, 233, 237, 238, 239, 243, 244, 245, 246, 248, 249, 250, 251, 252, 253, 254, 255,
];

/// `LL` entries of Ceph's table that follow no formula, as `(index, value)`.
pub const LL_IRREGULAR: [(usize, u64); 23] = [
    (56, 0xa2_b07f_3458),
    (127, 0x16d_f6ca_19bd),
    (134, 0x182_b07f_3458),
    (181, 0x209_c06e_6212),
    (184, 0x212_b07f_3458),
    (188, 0x21d_6a73_a78f),
    (193, 0x22c_2367_9b4e),
    (198, 0x23a_2c3b_0ea4),
    (199, 0x23d_13ee_805b),
    (200, 0x240_35e9_221f),
    (207, 0x254_9264_4d65),
    (210, 0x25d_13ee_805b),
    (212, 0x262_9645_3882),
    (225, 0x287_bdbf_5255),
    (227, 0x28d_13ee_805b),
    (228, 0x290_35e9_221f),
    (229, 0x292_9645_3882),
    (231, 0x299_02a3_7aab),
    (235, 0x2a4_c760_5d61),
    (236, 0x2a7_bdbf_5255),
    (240, 0x2b2_9645_3882),
    (241, 0x2b5_d022_d80f),
    (247, 0x2c6_1a5e_8f4c),
];

/// `LH[128]` in Ceph's table (the definition gives `2^48`).
const LH_LAST: u64 = 0xffff_0000_0000;

const fn build_rh_lh() -> [u64; 258] {
    let mut t = [0u64; 258];
    let mut k = 0;
    while k <= 128 {
        let d = 128 + k as u128;
        t[2 * k] = (1u128 << 55).div_ceil(d) as u64;
        t[2 * k + 1] = log2_q48(128 + k as u128, 128);
        k += 1;
    }
    t[257] = LH_LAST;
    t
}

const fn build_ll() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut k = 0;
    while k < 256 {
        let mut v = log2_q48((1 << 15) + k as u128, 1 << 15);
        if k >= 2 {
            let mut plain = false;
            let mut i = 0;
            while i < LL_WITHOUT_OFFSET.len() {
                if LL_WITHOUT_OFFSET[i] == k {
                    plain = true;
                }
                i += 1;
            }
            if !plain {
                v += LL_OFFSET;
            }
        }
        let mut i = 0;
        while i < LL_IRREGULAR.len() {
            if LL_IRREGULAR[i].0 == k {
                v = LL_IRREGULAR[i].1;
            }
            i += 1;
        }
        t[k] = v;
        k += 1;
    }
    t
}

/// `RH_LH[2k]` = `RH[k]`, `RH_LH[2k+1]` = `LH[k]`, as Ceph interleaves them.
pub static RH_LH: [u64; 258] = build_rh_lh();
/// `LL[k]`.
pub static LL: [u64; 256] = build_ll();

/// `2^44 * log2(xin + 1)` in Ceph's fixed point, for `xin` in `0..=0xffff`.
#[inline]
pub fn crush_ln(xin: u32) -> u64 {
    let mut x = xin.wrapping_add(1);
    let mut iexpon: i64 = 15;
    if x & 0x18000 == 0 {
        let bits = (x & 0x1ffff).leading_zeros() as i64 - 16;
        x <<= bits;
        iexpon = 15 - bits;
    }
    let index1 = ((x >> 8) << 1) as usize;
    let rh = RH_LH[index1 - 256];
    let lh = RH_LH[index1 + 1 - 256];
    let xl64 = (x as u64).wrapping_mul(rh) >> 48;
    let mut result = (iexpon as u64) << (12 + 32);
    let ll = LL[(xl64 & 0xff) as usize];
    result = result.wrapping_add(lh.wrapping_add(ll) >> (48 - 12 - 32));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_match_their_definition_at_known_points() {
        // 2^48 / (1 + 1/128), rounded up; 2^48 * log2(1 + 1/128), rounded down.
        assert_eq!(RH_LH[0], 1 << 48);
        assert_eq!(RH_LH[1], 0);
        assert_eq!(RH_LH[2], 0xfe03_f80f_e040);
        assert_eq!(RH_LH[3], 0x2df_ca16_dde1);
        // k = 64: 2^48 / 1.5 and 2^48 * log2(1.5).
        assert_eq!(RH_LH[128], 0xaaaa_aaaa_aaab);
        assert_eq!(RH_LH[129], 0x95c0_1a39_fbd6);
        assert_eq!(RH_LH[256], 1 << 47);
        assert_eq!(LL[0], 0);
        assert_eq!(LL[1], 0x2_e2a6_0a00);
    }

    #[test]
    fn crush_ln_is_log2_scaled_by_2_pow_44() {
        // Exact at powers of two: log2(2^n) = n.
        for n in 0..=16u32 {
            let u = (1u32 << n) - 1;
            let expect = (n as u64) << 44;
            let got = crush_ln(u);
            let err = got.abs_diff(expect);
            assert!(err < 1 << 30, "u={u} got {got:#x} expect {expect:#x}");
        }
        // Close to the real logarithm everywhere (the table quirks are far below 2^-8).
        for u in (0..=0xffffu32).step_by(97) {
            let real = ((u as f64) + 1.0).log2() * (1u64 << 44) as f64;
            let got = crush_ln(u) as f64;
            assert!((got - real).abs() < (1u64 << 37) as f64, "u={u}");
        }
        // Monotone in the large over the whole input range.
        assert!(crush_ln(0) < crush_ln(0x7fff) && crush_ln(0x7fff) < crush_ln(0xffff));
    }
}
