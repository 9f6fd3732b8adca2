//! Key naming and value bytes.
//!
//! **Keys** are fixed-width, inline and `Copy` ([`Key`], at most [`KEY_CAP`] bytes), so an
//! operation stream never allocates for them:
//! - YCSB ([`KeyStyle::Ycsb`]): `user` followed by the record number as 19 zero-padded decimal
//!   digits (23 bytes). With hashed insert order (YCSB's default, `insertorder=hashed`) the number
//!   is first run through [`fnv64`], YCSB's `Utils.fnvhash64` (FNV-1a over the eight
//!   little-endian bytes, then the absolute value as a signed 64-bit integer), so records land all
//!   over the key space; with ordered inserts it is the record number itself. YCSB pads with
//!   `zeropadding=1` by default (variable width); we pad to 19 digits, the width of the largest
//!   hash, so every key has the same length and, in ordered mode, byte order equals number order.
//! - db_bench ([`KeyStyle::DbBench`]): the key number as 16 zero-padded decimal digits, as
//!   LevelDB's `db_bench` formats it (`%016d`).
//!
//! **Values** come from a [`ValuePool`]: a buffer of pseudo-random bytes (SplitMix64 words from
//! the workload seed, so incompressible) of at least 1 MiB and at least twice the value size.
//! An operation's value is the slice `[offset, offset + len)` of the pool ([`Value`]), the offset
//! drawn per write; reading it is free (a borrowed slice) and no per-operation memory is
//! allocated. Like db_bench's `RandomGenerator`, which hands out windows of one random buffer,
//! distinct writes get distinct-looking bytes without generating them each time.

use std::fmt;
use std::sync::Arc;

use crate::rng::splitmix64;

/// The most bytes a [`Key`] holds.
pub const KEY_CAP: usize = 31;

/// The YCSB key prefix (`keyprefix`'s default).
pub const YCSB_PREFIX: &[u8] = b"user";

/// Decimal digits in a YCSB key (the width of the largest value [`fnv64`] returns).
pub const YCSB_DIGITS: usize = 19;

/// Decimal digits in a db_bench key.
pub const DB_BENCH_DIGITS: usize = 16;

/// The smallest value pool, in bytes.
pub const MIN_POOL_LEN: usize = 1 << 20;

/// The largest value size a workload accepts (64 MiB), so pool offsets fit in `u32`.
pub const MAX_VALUE_LEN: usize = 64 << 20;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 0x0000_0100_0000_01B3;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the eight little-endian bytes of `v`, returned as the
/// absolute value of the result read as a signed 64-bit integer (so at most 2^63).
#[inline]
pub fn fnv64(v: u64) -> u64 {
    let mut h = FNV_OFFSET_BASIS_64;
    for byte in v.to_le_bytes() {
        h ^= u64::from(byte);
        h = h.wrapping_mul(FNV_PRIME_64);
    }
    (h as i64).unsigned_abs()
}

/// A key of at most [`KEY_CAP`] bytes, stored inline. Ordered by its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    len: u8,
    bytes: [u8; KEY_CAP],
}

impl Key {
    /// A key holding `bytes`, or `None` when they are empty or longer than [`KEY_CAP`].
    pub fn new(bytes: &[u8]) -> Option<Key> {
        if bytes.is_empty() || bytes.len() > KEY_CAP {
            return None;
        }
        let mut k = Key {
            len: bytes.len() as u8,
            bytes: [0; KEY_CAP],
        };
        k.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(k)
    }

    /// `prefix` followed by `n` in decimal, zero-padded to at least `width` digits. The prefix
    /// and width are clipped so the result fits in [`KEY_CAP`] bytes (a `u64` has at most 20
    /// digits, so a prefix of up to 11 bytes is never clipped).
    pub fn numbered(prefix: &[u8], n: u64, width: usize) -> Key {
        let mut digits = [b'0'; 20];
        let mut pos = digits.len();
        let mut rest = n;
        loop {
            pos -= 1;
            digits[pos] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        let ndigits = (digits.len() - pos).max(width.min(20));
        let prefix = &prefix[..prefix.len().min(KEY_CAP - ndigits.min(KEY_CAP))];
        let mut k = Key {
            len: (prefix.len() + ndigits) as u8,
            bytes: [0; KEY_CAP],
        };
        k.bytes[..prefix.len()].copy_from_slice(prefix);
        k.bytes[prefix.len()..prefix.len() + ndigits]
            .copy_from_slice(&digits[digits.len() - ndigits..]);
        k
    }

    /// The key's bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The key's length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Always false: a key holds at least one byte.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", String::from_utf8_lossy(self.as_bytes()))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

/// How a workload turns record numbers into keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStyle {
    /// `user` + 19 digits; `hashed` runs the record number through [`fnv64`] first.
    Ycsb {
        /// YCSB's `insertorder=hashed` (the default) when true, `ordered` when false.
        hashed: bool,
    },
    /// 16 digits, no prefix, in record-number order.
    DbBench,
}

impl KeyStyle {
    /// The key of record number `n`.
    #[inline]
    pub fn key(self, n: u64) -> Key {
        match self {
            KeyStyle::Ycsb { hashed: true } => Key::numbered(YCSB_PREFIX, fnv64(n), YCSB_DIGITS),
            KeyStyle::Ycsb { hashed: false } => Key::numbered(YCSB_PREFIX, n, YCSB_DIGITS),
            KeyStyle::DbBench => Key::numbered(b"", n, DB_BENCH_DIGITS),
        }
    }
}

/// A value: `len` bytes of the workload's [`ValuePool`] starting at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value {
    /// Where the value starts in the pool.
    pub offset: u32,
    /// The value's length in bytes.
    pub len: u32,
}

impl Value {
    /// The value's length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True for a zero-length value.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Draws [`Value`]s of one size at random offsets of a pool of `pool_len` bytes.
#[derive(Debug, Clone)]
pub(crate) struct ValueChooser {
    len: u32,
    max_offset: u64,
}

impl ValueChooser {
    pub(crate) fn new(value_len: usize, pool_len: usize) -> Self {
        ValueChooser {
            len: value_len as u32,
            max_offset: pool_len.saturating_sub(value_len) as u64,
        }
    }

    #[inline]
    pub(crate) fn next(&self, rng: &mut crate::rng::Rng) -> Value {
        Value {
            offset: rng.range_inclusive(0, self.max_offset) as u32,
            len: self.len,
        }
    }
}

/// The pool of incompressible bytes that every [`Value`] of a workload is a window of.
///
/// Its bytes are the little-endian SplitMix64 words of a stream started at `seed` (state =
/// `seed`, each word: add `0x9E3779B97F4A7C15`, then the SplitMix64 mix), truncated to
/// [`ValuePool::len`]. Cloning is cheap (shared).
#[derive(Clone)]
pub struct ValuePool {
    seed: u64,
    bytes: Arc<[u8]>,
}

impl fmt::Debug for ValuePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValuePool")
            .field("seed", &self.seed)
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl ValuePool {
    /// The pool length used for values of `max_value_len` bytes: at least [`MIN_POOL_LEN`] and
    /// twice the value size, rounded up to a multiple of 8.
    pub fn len_for(max_value_len: usize) -> usize {
        let want = MIN_POOL_LEN.max(max_value_len.saturating_mul(2));
        want.div_ceil(8) * 8
    }

    /// A pool of `len` bytes generated from `seed`.
    pub fn new(seed: u64, len: usize) -> Self {
        let mut bytes = Vec::with_capacity(len.div_ceil(8) * 8);
        let mut state = seed;
        while bytes.len() < len {
            bytes.extend_from_slice(&splitmix64(&mut state).to_le_bytes());
        }
        bytes.truncate(len);
        ValuePool {
            seed,
            bytes: bytes.into(),
        }
    }

    /// The seed the pool was generated from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The pool's length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for an empty pool.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A check word for a peer that rebuilt the pool: the last 8 bytes, little-endian (the
    /// whole pool when shorter, zero-extended).
    pub fn check_word(&self) -> u64 {
        let tail = &self.bytes[self.bytes.len().saturating_sub(8)..];
        let mut word = [0u8; 8];
        word[..tail.len()].copy_from_slice(tail);
        u64::from_le_bytes(word)
    }

    /// The bytes of `value`, or `None` when it does not lie inside the pool.
    #[inline]
    pub fn get(&self, value: Value) -> Option<&[u8]> {
        let start = value.offset as usize;
        self.bytes.get(start..start.checked_add(value.len())?)
    }

    /// All of the pool's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ycsb_keys_are_fixed_width_and_prefixed() {
        for n in [0u64, 1, 42, 999_999, u64::MAX] {
            for hashed in [false, true] {
                let k = KeyStyle::Ycsb { hashed }.key(n);
                let s = k.to_string();
                assert!(s.starts_with("user"), "{s}");
                if hashed || n < 10u64.pow(19) {
                    assert_eq!(k.len(), 4 + YCSB_DIGITS, "{s}");
                }
                assert!(s[4..].bytes().all(|b| b.is_ascii_digit()), "{s}");
            }
        }
        assert_eq!(
            KeyStyle::Ycsb { hashed: false }.key(42).as_bytes(),
            b"user0000000000000000042"
        );
        assert_eq!(KeyStyle::DbBench.key(7).as_bytes(), b"0000000000000007");
        assert_eq!(KeyStyle::DbBench.key(u64::MAX).len(), 20);
    }

    #[test]
    fn ordered_keys_sort_like_numbers() {
        let style = KeyStyle::Ycsb { hashed: false };
        let mut prev = style.key(0);
        for n in 1..5000u64 {
            let k = style.key(n * 7919);
            assert!(k > prev);
            prev = k;
        }
    }

    #[test]
    fn fnv_matches_ycsb_definition() {
        // FNV-1a of eight zero bytes, computed by hand from the offset basis and prime.
        let mut h = FNV_OFFSET_BASIS_64;
        for _ in 0..8 {
            h = h.wrapping_mul(FNV_PRIME_64);
        }
        assert_eq!(fnv64(0), (h as i64).unsigned_abs());
        assert!(fnv64(12345) <= 1 << 63);
        // Hashed keys of distinct records do not collide in a modest range.
        let mut seen = std::collections::HashSet::new();
        for n in 0..100_000u64 {
            assert!(seen.insert(fnv64(n)));
        }
    }

    #[test]
    fn key_new_and_clipping() {
        assert!(Key::new(b"").is_none());
        assert!(Key::new(&[b'x'; KEY_CAP + 1]).is_none());
        assert_eq!(Key::new(b"abc").map(|k| k.len()), Some(3));
        let long = Key::numbered(&[b'p'; 40], 5, 30);
        assert_eq!(long.len(), KEY_CAP);
    }

    #[test]
    fn pool_is_deterministic_and_windows_are_in_bounds() {
        let a = ValuePool::new(9, ValuePool::len_for(100));
        let b = ValuePool::new(9, ValuePool::len_for(100));
        let c = ValuePool::new(10, ValuePool::len_for(100));
        assert_eq!(a.len(), MIN_POOL_LEN);
        assert_eq!(a.as_bytes(), b.as_bytes());
        assert_ne!(a.as_bytes(), c.as_bytes());
        assert_eq!(a.check_word(), b.check_word());
        assert_eq!(ValuePool::len_for(1 << 20), 2 << 20);
        let chooser = ValueChooser::new(1000, a.len());
        let mut rng = crate::rng::Rng::new(3);
        for _ in 0..10_000 {
            let v = chooser.next(&mut rng);
            assert_eq!(a.get(v).map(<[u8]>::len), Some(1000));
        }
        assert!(a
            .get(Value {
                offset: u32::MAX,
                len: 10
            })
            .is_none());
    }

    #[test]
    fn pool_bytes_look_incompressible() {
        // Every byte value appears, and no byte value takes much more than its 1/256 share.
        let pool = ValuePool::new(1, MIN_POOL_LEN);
        let mut counts = [0usize; 256];
        for &b in pool.as_bytes() {
            counts[usize::from(b)] += 1;
        }
        let expect = MIN_POOL_LEN / 256;
        assert!(counts
            .iter()
            .all(|&c| c > expect * 9 / 10 && c < expect * 11 / 10));
    }
}
