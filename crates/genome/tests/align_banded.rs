//! Banded alignment: hand-checked cases (exact, mismatch, insertion, deletion, clipping, N) and a
//! property test that the CIGAR consumes the whole read and that the reported score, NM and
//! reference span agree with a recomputation from the CIGAR.

use kura_genome::align::{align_ungapped, Aligner, Alignment, CigarOp, Scoring};
use kura_genome::pack::{encode_base, AMBIGUOUS};
use proptest::prelude::*;

fn codes(s: &str) -> Vec<u8> {
    s.bytes().map(encode_base).collect()
}

/// Score, mismatches, insertions, deletions recomputed by walking the CIGAR.
fn recompute(read: &[u8], reference: &[u8], a: &Alignment, sc: &Scoring) -> (i32, u32, u32, u32) {
    let (mut i, mut j) = (0usize, a.ref_start);
    let (mut score, mut mm, mut ins, mut del) = (0i32, 0u32, 0u32, 0u32);
    for (k, &(op, n)) in a.cigar.0.iter().enumerate() {
        let n = n as usize;
        match op {
            CigarOp::Match => {
                for _ in 0..n {
                    let (x, y) = (read[i], reference[j]);
                    if x >= AMBIGUOUS || y >= AMBIGUOUS {
                        score -= sc.ambiguous;
                        mm += 1;
                    } else if x == y {
                        score += sc.matched;
                    } else {
                        score -= sc.mismatch;
                        mm += 1;
                    }
                    i += 1;
                    j += 1;
                }
            }
            CigarOp::Ins => {
                score -= sc.gap_open + sc.gap_extend * n as i32;
                ins += n as u32;
                i += n;
            }
            CigarOp::Del => {
                score -= sc.gap_open + sc.gap_extend * n as i32;
                del += n as u32;
                j += n;
            }
            CigarOp::SoftClip => {
                assert!(k == 0 || k == a.cigar.0.len() - 1, "clip only at the ends");
                score -= sc.clip;
                i += n;
            }
        }
    }
    assert_eq!(i, read.len(), "CIGAR consumes the read");
    assert_eq!(j, a.ref_end, "CIGAR ends at ref_end");
    (score, mm, ins, del)
}

fn check(read: &[u8], reference: &[u8], a: &Alignment) {
    let sc = Scoring::default();
    assert_eq!(a.cigar.read_len(), read.len() as u64);
    let (score, mm, ins, del) = recompute(read, reference, a, &sc);
    assert_eq!(score, a.score, "score matches CIGAR {}", a.cigar);
    assert_eq!((mm, ins, del), (a.mismatches, a.inserted, a.deleted));
    assert_eq!(a.nm(), mm + ins + del);
}

const REF: &str = "TTGACCATGCATGCCGTAGCTAGCTAGGATCGATCGGCTAAGCTTACGGATCCAGTCAGTCAGGTACCTTAAGGCC";

#[test]
fn exact_match_in_the_middle() {
    let r = codes(REF);
    let read = r[10..60].to_vec();
    let a = Aligner::new()
        .align(&read, &r, 10, 8, &Scoring::default())
        .expect("aligns");
    assert_eq!(a.cigar.to_string(), "50M");
    assert_eq!((a.ref_start, a.score, a.nm()), (10, 100, 0));
    check(&read, &r, &a);
    let u = align_ungapped(&read, &r, 10, &Scoring::default()).expect("fits");
    assert_eq!(u, a);
}

#[test]
fn mismatch_insertion_deletion() {
    let r = codes(REF);
    let mut read = r[10..60].to_vec();
    read[25] = (read[25] + 1) % 4;
    let a = Aligner::new()
        .align(&read, &r, 10, 8, &Scoring::default())
        .expect("aligns");
    assert_eq!((a.cigar.to_string(), a.mismatches), ("50M".to_string(), 1));
    check(&read, &r, &a);

    let mut ins = r[10..60].to_vec();
    ins.insert(25, 2);
    ins.insert(25, 2);
    let a = Aligner::new()
        .align(&ins, &r, 10, 8, &Scoring::default())
        .expect("aligns");
    assert_eq!(a.inserted, 2, "{}", a.cigar);
    assert_eq!(a.cigar.ref_len(), 50);
    check(&ins, &r, &a);

    let mut del = r[10..60].to_vec();
    del.drain(20..23);
    let a = Aligner::new()
        .align(&del, &r, 10, 8, &Scoring::default())
        .expect("aligns");
    assert_eq!(
        (a.deleted, a.cigar.to_string()),
        (3, "20M3D27M".to_string())
    );
    check(&del, &r, &a);
}

#[test]
fn junk_end_is_soft_clipped_and_n_costs_one() {
    let r = codes(REF);
    let mut read = r[10..60].to_vec();
    for b in &mut read[44..] {
        *b = (*b + 2) % 4;
    }
    let a = Aligner::new()
        .align(&read, &r, 10, 8, &Scoring::default())
        .expect("aligns");
    assert_eq!(a.cigar.to_string(), "44M6S");
    check(&read, &r, &a);

    let mut read = r[10..60].to_vec();
    read[5] = AMBIGUOUS;
    let a = Aligner::new()
        .align(&read, &r, 10, 8, &Scoring::default())
        .expect("aligns");
    assert_eq!((a.score, a.nm()), (98 - 1, 1));
    check(&read, &r, &a);
}

#[test]
fn read_hanging_off_the_window_start() {
    let r = codes(REF);
    // The read starts 5 bases before the window: those 5 bases are clipped.
    let read: Vec<u8> = codes("ACGTA")
        .into_iter()
        .chain(r[0..40].iter().copied())
        .collect();
    let a = Aligner::new()
        .align(&read, &r, -5, 8, &Scoring::default())
        .expect("aligns");
    assert_eq!(a.ref_start, 0);
    assert!(a.cigar.to_string().ends_with("40M"), "{}", a.cigar);
    check(&read, &r, &a);
}

fn base() -> impl Strategy<Value = u8> {
    prop_oneof![50 => 0u8..4, 1 => Just(AMBIGUOUS)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn cigar_and_score_are_consistent(
        reference in proptest::collection::vec(base(), 60..200),
        start in 0usize..40,
        len in 20usize..60,
        edits in proptest::collection::vec((0usize..60, 0u8..3, 0u8..4), 0..6),
        shift in -6isize..6,
    ) {
        let end = (start + len).min(reference.len());
        let mut read = reference[start..end].to_vec();
        for (at, kind, b) in edits {
            if read.len() < 10 { break; }
            let at = at % read.len();
            match kind {
                0 => read[at] = b,
                1 => read.insert(at, b),
                _ => { read.remove(at); }
            }
        }
        let mut al = Aligner::new();
        if let Some(a) = al.align(&read, &reference, start as isize + shift, 12, &Scoring::default()) {
            check(&read, &reference, &a);
            prop_assert!(a.ref_end <= reference.len());
            let again = al.align(&read, &reference, start as isize + shift, 12, &Scoring::default());
            prop_assert_eq!(Some(a), again, "buffers are reused without leaking state");
        }
    }
}
