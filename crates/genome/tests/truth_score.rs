//! Truth parsing and SAM scoring on hand-made records: both strands, CIGARs with soft clips and
//! indels, tolerance edges, MAPQ, skipped secondary/supplementary records, paired flags, and
//! malformed input.

use kura_genome::truth::{cigar_ref_len, score_sam, Score, ScoreOptions, TrueOrigin, TruthError};

#[test]
fn names_parse_from_the_right() {
    let t = TrueOrigin::parse("chr|B|1859|2385|0:0:0|1:0:1|1a").expect("parses");
    assert_eq!(
        t,
        TrueOrigin {
            contig: "chr|B".into(),
            start: 1859,
            end: 2385
        }
    );
    assert_eq!(t.coordinate(false), 1859);
    assert_eq!(t.coordinate(true), 2385);
    let t = TrueOrigin::parse("NC_000913.3|10|400|0:0:0|0:0:0|5/2").expect("mate suffix ignored");
    assert_eq!((t.start, t.end), (10, 400));
    for bad in [
        "read1",
        "a|1|2|x|y",
        "a|one|2|x|y|0",
        "|1|2|x|y|0",
        "a|1|-2|x|y|0",
    ] {
        let e = TrueOrigin::parse(bad).expect_err(bad);
        assert!(matches!(e, TruthError::Name(ref n) if n == bad), "{e}");
    }
}

#[test]
fn cigar_reference_length() {
    assert_eq!(cigar_ref_len("150M"), Ok(150));
    assert_eq!(cigar_ref_len("5S60M2D40M3I42M"), Ok(144));
    assert_eq!(cigar_ref_len("3H10=1X2N4P5M"), Ok(18));
    for bad in ["", "*", "M", "10", "10Q", "99999999999999999999M"] {
        assert!(cigar_ref_len(bad).is_err(), "{bad:?}");
    }
}

fn line(name: &str, flag: u16, rname: &str, pos: u64, mapq: u8, cigar: &str) -> String {
    format!("{name}\t{flag}\t{rname}\t{pos}\t{mapq}\t{cigar}\t*\t0\t0\tACGT\tIIII\n")
}

fn score(text: &str) -> Score {
    score_sam(text.as_bytes(), "t.sam", ScoreOptions::default()).expect("scores")
}

#[test]
fn single_end_both_strands_clips_and_indels() {
    let n = "chr1|1000|1500|0:0:0|0:0:0|0";
    let cases = [
        // Forward: POS against START, soft clips do not move POS.
        (line(n, 0, "chr1", 1000, 60, "150M"), true),
        (line(n, 0, "chr1", 1010, 60, "5S145M"), true),
        (line(n, 0, "chr1", 990, 60, "150M"), true),
        (line(n, 0, "chr1", 1011, 60, "150M"), false),
        (line(n, 0, "chr1", 989, 60, "150M"), false),
        (line(n, 0, "chr2", 1000, 60, "150M"), false),
        // Reverse: POS + reference span − 1 against END (1500).
        (line(n, 16, "chr1", 1351, 60, "150M"), true),
        // 60M + 2D + 40M + 42M = 144 reference bases: rightmost = 1357 + 143 = 1500.
        (line(n, 16, "chr1", 1357, 60, "5S60M2D40M3I42M"), true),
        (line(n, 16, "chr1", 1367, 60, "5S60M2D40M3I42M"), true),
        (line(n, 16, "chr1", 1368, 60, "5S60M2D40M3I42M"), false),
        // Reverse read placed by its POS at START would be wrong: strand decides the coordinate.
        (line(n, 16, "chr1", 1000, 60, "150M"), false),
        // Forward read placed at the fragment's right end is wrong too.
        (line(n, 0, "chr1", 1351, 60, "150M"), false),
    ];
    for (l, want) in &cases {
        let s = score(l);
        assert_eq!((s.total, s.mapped, s.correct == 1), (1, 1, *want), "{l}");
        assert_eq!(s.misplaced_confident, u64::from(!*want), "{l}");
    }
}

#[test]
fn counts_mapq_unmapped_and_skipped_records() {
    let a = "chr1|1000|1500|0:0:0|0:0:0|0";
    let b = "chr1|5000|5500|0:0:0|0:0:0|1";
    let c = "chr2|70|560|0:0:0|0:0:0|2";
    let d = "chr2|700|1160|0:0:0|0:0:0|3";
    let text = [
        "@HD\tVN:1.6\n".to_string(),
        "@SQ\tSN:chr1\tLN:10000\n".to_string(),
        line(a, 0, "chr1", 1000, 60, "150M"),
        line(a, 256, "chr2", 5, 0, "150M"),
        line(a, 2048, "chr2", 5, 0, "50M100H"),
        line(b, 0, "chr1", 9000, 19, "150M"),
        line(c, 16, "chr1", 411, 20, "150M"),
        format!("{d}\t4\t*\t0\t0\t*\t*\t0\t0\tACGT\tIIII\n"),
    ]
    .concat();
    let s = score(&text);
    let want = Score {
        total: 4,
        mapped: 3,
        correct: 1,
        misplaced: 2,
        misplaced_confident: 1,
        unmapped: 1,
        ..Score::default()
    };
    assert_eq!(s, want);
    assert!((s.fraction_correct() - 0.25).abs() < 1e-12);
    assert_eq!(
        s.to_string(),
        "4 reads, 3 mapped, 1 correct (25.000 %), 2 misplaced (1 with MAPQ >= 20), 1 unmapped"
    );
    let strict = score_sam(
        text.as_bytes(),
        "t.sam",
        ScoreOptions {
            tolerance: 10,
            min_mapq: 10,
        },
    )
    .expect("scores");
    assert_eq!(strict.misplaced_confident, 2);
}

#[allow(clippy::too_many_arguments)]
fn paired(
    name: &str,
    flag: u16,
    rname: &str,
    pos: u64,
    cigar: &str,
    rnext: &str,
    pnext: u64,
) -> String {
    format!("{name}\t{flag}\t{rname}\t{pos}\t60\t{cigar}\t{rnext}\t{pnext}\t0\tACGT\tIIII\n")
}

#[test]
fn paired_flags_and_mate_consistency() {
    let n1 = "chr1|1000|1500|0:0:0|0:0:0|0";
    let n2 = "chr1|3000|3500|0:0:0|0:0:0|1";
    let n3 = "chr1|6000|6500|0:0:0|0:0:0|2";
    let n4 = "chr1|8000|8500|0:0:0|0:0:0|3";
    let n5 = "chr1|9000|9500|0:0:0|0:0:0|4";
    let text = [
        // Proper and right: first mate forward at START, second reverse ending at END.
        paired(n1, 99, "chr1", 1000, "150M", "=", 1351),
        paired(n1, 147, "chr1", 1351, "150M", "=", 1000),
        // Flagged proper, but the second mate is 100 bp off.
        paired(n2, 83, "chr1", 3351, "150M", "=", 3100),
        paired(n2, 163, "chr1", 3100, "150M", "=", 3351),
        // Both right, not flagged proper.
        paired(n3, 97, "chr1", 6000, "150M", "=", 6351),
        paired(n3, 145, "chr1", 6351, "150M", "=", 6000),
        // Right and proper, but the first mate's PNEXT is wrong (records apart, as after sorting).
        paired(n4, 99, "chr1", 8000, "150M", "=", 8300),
        paired(n5, 73, "chr1", 9000, "150M", "=", 9000),
        paired(n4, 147, "chr1", 8351, "150M", "=", 8000),
        // The mate of n5 is unmapped; its own record points at n5's placement.
        paired(n5, 133, "chr1", 9000, "*", "=", 9000),
    ]
    .concat();
    let s = score(&text);
    assert_eq!(
        (s.total, s.mapped, s.correct, s.unmapped),
        (10, 9, 8, 1),
        "{s}"
    );
    assert_eq!(
        (s.pairs, s.proper_right, s.proper_wrong, s.proper_missed),
        (5, 2, 1, 1),
        "{s}"
    );
    assert_eq!((s.mate_inconsistent, s.orphans), (1, 0), "{s}");
    let s = score(&paired(n1, 99, "chr1", 1000, "150M", "=", 1351));
    assert_eq!((s.pairs, s.orphans), (0, 1));
}

#[test]
fn malformed_sam_is_an_error_with_its_line() {
    let good = line("chr1|1|2|0:0:0|0:0:0|0", 0, "chr1", 1, 60, "2M");
    let cases = [
        (format!("{good}only\tthree\tfields\n"), 2, "3 fields"),
        (
            format!("{good}{}", good.replace("\t0\tchr1", "\tx\tchr1")),
            2,
            "FLAG \"x\"",
        ),
        (
            format!(
                "@HD\n{}",
                line("chr1|1|2|0:0:0|0:0:0|0", 0, "chr1", 1, 60, "2Q")
            ),
            2,
            "unknown operation 'Q'",
        ),
        (
            line("read7", 0, "chr1", 1, 60, "2M"),
            1,
            "has no simulated origin",
        ),
        (
            line("chr1|1|2|0:0:0|0:0:0|0", 0, "*", 0, 60, "2M"),
            1,
            "without RNAME/POS",
        ),
    ];
    for (text, want_line, want_msg) in cases {
        match score_sam(text.as_bytes(), "t.sam", ScoreOptions::default()) {
            Err(TruthError::Sam { path, line, msg }) => {
                assert_eq!((path.as_str(), line), ("t.sam", want_line), "{msg}");
                assert!(msg.contains(want_msg), "{msg}");
            }
            other => panic!("{text:?}: expected a SAM error, got {other:?}"),
        }
    }
}
