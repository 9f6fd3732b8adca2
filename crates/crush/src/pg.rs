//! Object name to placement group to CRUSH input, as Ceph's OSD map computes them:
//! `ceph_str_hash_rjenkins` over the name, `ceph_stable_mod` into `pg_num`, and the pool's
//! placement seed (`pps`) mixing the PG with the pool id.

/// Ceph's `ceph_str_hash_rjenkins`: Bob Jenkins' lookup2 over the bytes, 12 at a time.
pub fn str_hash_rjenkins(s: &[u8]) -> u32 {
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
    let word = |k: &[u8]| u32::from_le_bytes([k[0], k[1], k[2], k[3]]);
    let mut a: u32 = 0x9e37_79b9;
    let mut b: u32 = a;
    let mut c: u32 = 0;
    let mut k = s;
    while k.len() >= 12 {
        a = a.wrapping_add(word(&k[0..4]));
        b = b.wrapping_add(word(&k[4..8]));
        c = c.wrapping_add(word(&k[8..12]));
        mix(&mut a, &mut b, &mut c);
        k = &k[12..];
    }
    c = c.wrapping_add(s.len() as u32);
    let byte = |i: usize| k[i] as u32;
    let n = k.len();
    // The remaining bytes go in from the highest; the first byte of c is reserved for the
    // length.
    if n >= 11 {
        c = c.wrapping_add(byte(10) << 24);
    }
    if n >= 10 {
        c = c.wrapping_add(byte(9) << 16);
    }
    if n >= 9 {
        c = c.wrapping_add(byte(8) << 8);
    }
    if n >= 8 {
        b = b.wrapping_add(byte(7) << 24);
    }
    if n >= 7 {
        b = b.wrapping_add(byte(6) << 16);
    }
    if n >= 6 {
        b = b.wrapping_add(byte(5) << 8);
    }
    if n >= 5 {
        b = b.wrapping_add(byte(4));
    }
    if n >= 4 {
        a = a.wrapping_add(byte(3) << 24);
    }
    if n >= 3 {
        a = a.wrapping_add(byte(2) << 16);
    }
    if n >= 2 {
        a = a.wrapping_add(byte(1) << 8);
    }
    if n >= 1 {
        a = a.wrapping_add(byte(0));
    }
    mix(&mut a, &mut b, &mut c);
    c
}

/// Ceph's `ceph_stable_mod`: `x mod b` that moves few inputs when `b` grows, given `bmask`
/// (the next power of two minus one).
pub fn stable_mod(x: u32, b: u32, bmask: u32) -> u32 {
    if (x & bmask) < b {
        x & bmask
    } else {
        x & (bmask >> 1)
    }
}

/// The mask `ceph_stable_mod` takes for `pg_num` (`2^ceil(log2 pg_num) - 1`).
pub fn pg_num_mask(pg_num: u32) -> u32 {
    if pg_num <= 1 {
        return 0;
    }
    let bits = 32 - (pg_num - 1).leading_zeros();
    ((1u64 << bits) - 1) as u32
}

/// The placement group of an object: its raw hash folded into `pg_num`.
pub fn object_pg(name: &str, pg_num: u32) -> u32 {
    stable_mod(
        str_hash_rjenkins(name.as_bytes()),
        pg_num,
        pg_num_mask(pg_num),
    )
}

/// The CRUSH input of PG `ps` in pool `pool` (`pg_pool_t::raw_pg_to_pps` for pools with the
/// `HASHPSPOOL` flag, every pool since Luminous).
pub fn pg_to_pps(pool: u32, ps: u32, pgp_num: u32) -> u32 {
    crate::hash::hash32_2(stable_mod(ps, pgp_num, pg_num_mask(pgp_num)), pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_mod_folds_into_range() {
        for b in 1..100u32 {
            let m = pg_num_mask(b);
            for x in 0..1000u32 {
                assert!(stable_mod(x, b, m) < b);
            }
        }
        assert_eq!(pg_num_mask(8), 7);
        assert_eq!(pg_num_mask(9), 15);
        assert_eq!(stable_mod(13, 12, 15), 13 & 7);
    }

    #[test]
    fn str_hash_depends_on_every_byte_and_the_length() {
        let base = str_hash_rjenkins(b"rbd_data.1234567890ab");
        assert_ne!(base, str_hash_rjenkins(b"rbd_data.1234567890ac"));
        assert_ne!(str_hash_rjenkins(b""), str_hash_rjenkins(b"\0"));
    }
}
