//! The on-disk index: exact round trip through bytes, and every kind of damage (a flipped byte
//! anywhere, truncation anywhere, wrong magic or version) refused with a typed error.

mod mapsim;

use kura_genome::index::{Index, IndexError, IndexParams, FORMAT_VERSION, HEADER_LEN, SECTIONS};
use kura_genome::pack::PackedRef;

fn small_index() -> Index {
    let g = mapsim::genome(21, &[1200, 600], 0);
    Index::build(mapsim::packed(&g), IndexParams { k: 15, w: 5 }, 2).expect("builds")
}

/// The small index's bytes, built once for the property tests.
fn small_bytes() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| bytes(&small_index()))
}

fn bytes(idx: &Index) -> Vec<u8> {
    let mut out = Vec::new();
    idx.write_to(&mut out).expect("writes to a Vec");
    out
}

/// Byte ranges of the header and of each section (tag+length head, payload, checksum).
fn layout(b: &[u8]) -> Vec<(usize, usize)> {
    let mut out = vec![(0, HEADER_LEN)];
    let mut at = HEADER_LEN;
    for _ in SECTIONS {
        let len = u64::from_le_bytes(b[at + 4..at + 12].try_into().expect("8 bytes")) as usize;
        out.push((at, at + 12 + len + 4));
        at += 12 + len + 4;
    }
    assert_eq!(at, b.len());
    out
}

#[test]
fn round_trip_is_exact() {
    let idx = small_index();
    let b = bytes(&idx);
    let back = Index::read_from(&b[..]).expect("reads back");
    assert_eq!(back, idx);
    assert_eq!(bytes(&back), b, "rewriting gives identical bytes");
    let mut codes = Vec::new();
    back.reference().fetch(0, 1800, &mut codes);
    let mut mins = Vec::new();
    kura_genome::index::minimizers(&codes[..1200], idx.params(), &mut mins);
    assert!(!mins.is_empty());
    for m in &mins {
        assert_eq!(back.get(m.hash), idx.get(m.hash));
        let want = (u64::from(m.pos) << 1) | u64::from(m.rev);
        assert!(
            back.get(m.hash).contains(&want),
            "minimizer at {} is indexed",
            m.pos
        );
    }
}

#[test]
fn build_is_independent_of_thread_count() {
    let g = mapsim::genome(5, &[1_200_000, 10_000], 3);
    let a = Index::build(mapsim::packed(&g), IndexParams::default(), 1).expect("builds");
    let b = Index::build(mapsim::packed(&g), IndexParams::default(), 3).expect("builds");
    assert_eq!(a, b);
}

#[test]
fn every_flipped_byte_is_detected() {
    let b = bytes(&small_index());
    let sections = layout(&b);
    let mut hits_per_section = vec![0usize; sections.len()];
    for i in 0..b.len() {
        let mut c = b.clone();
        c[i] ^= 0x5A;
        let err = Index::read_from(&c[..]).expect_err("a flipped byte must be refused");
        assert!(
            matches!(
                err,
                IndexError::Checksum { .. }
                    | IndexError::Malformed { .. }
                    | IndexError::BadMagic
                    | IndexError::Truncated { .. }
            ),
            "byte {i}: unexpected {err:?}"
        );
        let s = sections
            .iter()
            .position(|&(a, e)| (a..e).contains(&i))
            .expect("in a section");
        hits_per_section[s] += 1;
    }
    assert!(
        hits_per_section.iter().all(|&n| n > 0),
        "every section was damaged at least once"
    );
}

#[test]
fn every_truncation_is_detected() {
    let b = bytes(&small_index());
    for len in 0..b.len() {
        let err = Index::read_from(&b[..len]).expect_err("a truncated index must be refused");
        assert!(
            matches!(err, IndexError::Truncated { .. }),
            "length {len}: {err:?}"
        );
    }
}

#[test]
fn wrong_magic_and_version_are_typed() {
    let b = bytes(&small_index());
    let mut c = b.clone();
    c[0] = b'X';
    assert!(matches!(
        Index::read_from(&c[..]),
        Err(IndexError::BadMagic)
    ));
    let mut c = b.clone();
    c[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let crc = crc_of_header(&c);
    c[60..64].copy_from_slice(&crc.to_le_bytes());
    match Index::read_from(&c[..]) {
        Err(IndexError::UnsupportedVersion { found, supported }) => {
            assert_eq!((found, supported), (FORMAT_VERSION + 1, FORMAT_VERSION));
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
    assert!(matches!(
        Index::read_from(&b"not an index at all, just text"[..]),
        Err(IndexError::BadMagic)
    ));
}

/// CRC32C (Castagnoli), bitwise, so the test does not trust the code under test.
fn crc_of_header(b: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in &b[..60] {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn bad_parameters_are_refused() {
    let mut r = PackedRef::new();
    r.push_contig("c", b"ACGTACGTACGTACGTACGTACGT")
        .expect("valid");
    for (k, w) in [(16, 10), (9, 10), (33, 10), (19, 0), (19, 65)] {
        let e = Index::build(r.clone(), IndexParams { k, w }, 1).expect_err("refused");
        assert!(matches!(e, IndexError::BadParams(_)), "k={k} w={w}: {e:?}");
    }
}

#[test]
fn failing_writer_and_reader_give_io_errors() {
    struct Broken;
    impl std::io::Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk gone"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl std::io::Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk gone"))
        }
    }
    assert!(matches!(
        small_index().write_to(Broken),
        Err(IndexError::Io { .. })
    ));
    assert!(matches!(
        Index::read_from(Broken),
        Err(IndexError::Io { .. })
    ));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Several random bytes overwritten, then possibly cut short: always a typed error, never a
    /// panic or a different index.
    #[test]
    fn random_damage_is_refused(
        edits in proptest::collection::vec((0usize..1_000_000, 0u8..=255), 1..8),
        cut in proptest::option::of(0usize..1_000_000),
    ) {
        let b = small_bytes();
        let mut c = b.to_vec();
        for (at, v) in edits {
            let at = at % c.len();
            c[at] = v;
        }
        if let Some(cut) = cut {
            c.truncate(cut % c.len());
        }
        if let Ok(idx) = Index::read_from(&c[..]) {
            proptest::prop_assert!(c == b && bytes(&idx) == b);
        }
    }

    /// Arbitrary bytes behind a valid magic are refused without panicking.
    #[test]
    fn garbage_after_magic_is_refused(tail in proptest::collection::vec(0u8..=255, 0..4096)) {
        let mut c = kura_genome::index::MAGIC.to_vec();
        c.extend_from_slice(&tail);
        proptest::prop_assert!(Index::read_from(&c[..]).is_err());
    }
}
