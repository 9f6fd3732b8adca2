//! FASTA parsing: normalisation, layout variants, every error with its line, gzip through the
//! byte source, round trips and arbitrary input (property tests).

use flate2::write::GzEncoder;
use flate2::Compression;
use kura_genome::fasta::{FastaReader, FastaRecord, ParseErrorKind};
use kura_genome::simulate::write_fasta;
use kura_genome::source::{ByteSource, SourceOptions};
use proptest::prelude::*;
use std::io::Write;

fn parse(text: &[u8]) -> Result<Vec<FastaRecord>, kura_genome::fasta::ParseError> {
    FastaReader::new(text, "t.fa").read_all()
}

fn rec(name: &str, desc: &str, seq: &[u8]) -> FastaRecord {
    FastaRecord {
        name: name.into(),
        description: desc.into(),
        seq: seq.to_vec(),
    }
}

#[test]
fn multi_record_lowercase_iupac_n_runs_crlf_blank_lines() {
    let text = b"\n>chr1 the first  contig \r\nacgtNNNNac\r\nRYKMswbdhv\r\n\r\n>chr2\nAC GT\tA\n\n>empty\n>chr3\tx y\nnnnn\n";
    let got = parse(text).expect("parses");
    assert_eq!(
        got,
        vec![
            rec("chr1", "the first  contig", b"ACGTNNNNACNNNNNNNNNN"),
            rec("chr2", "", b"ACGTA"),
            rec("empty", "", b""),
            rec("chr3", "x y", b"NNNN"),
        ]
    );
}

#[test]
fn no_final_newline() {
    assert_eq!(
        parse(b">a\nAC\nGT").expect("parses"),
        vec![rec("a", "", b"ACGT")]
    );
}

fn err_of(text: &[u8]) -> kura_genome::fasta::ParseError {
    match parse(text) {
        Ok(r) => panic!("expected an error, parsed {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn empty_inputs_are_errors() {
    for text in [&b""[..], b"\n\n", b"\r\n  \n"] {
        let e = err_of(text);
        assert!(matches!(e.kind, ParseErrorKind::Empty), "{e}");
        assert_eq!(e.to_string(), "t.fa: empty file: no records");
    }
}

#[test]
fn sequence_before_header() {
    let e = err_of(b"\nACGT\n>a\nAC\n");
    assert!(
        matches!(e.kind, ParseErrorKind::SequenceBeforeHeader),
        "{e}"
    );
    assert_eq!(e.line, 2);
    assert!(
        e.to_string()
            .starts_with("t.fa:2: sequence before the first '>' header"),
        "{e}"
    );
}

#[test]
fn fastq_given_as_reference() {
    let e = err_of(b"\n@read1\nACGT\n+\nIIII\n");
    assert!(matches!(e.kind, ParseErrorKind::FastqNotFasta), "{e}");
    assert_eq!(
        e.to_string(),
        "t.fa:2: this is a FASTQ file ('@' header), not FASTA: the reference must be FASTA"
    );
}

#[test]
fn empty_name() {
    for (text, line) in [
        (&b">\nAC\n"[..], 1),
        (b">a\nAC\n> desc only\nAC\n", 3),
        (b">a\n>\r\n", 2),
    ] {
        let e = err_of(text);
        assert!(matches!(e.kind, ParseErrorKind::EmptyName), "{e}");
        assert_eq!(e.line, line, "{e}");
    }
}

#[test]
fn invalid_sequence_character_names_line_and_column() {
    let e = err_of(b">a\nACGT\nAC-T\n");
    assert!(
        matches!(e.kind, ParseErrorKind::FastaChar { byte: b'-', col: 3 }),
        "{e}"
    );
    assert_eq!(e.line, 3);
    assert_eq!(
        e.to_string(),
        "t.fa:3: invalid character '-' in sequence (column 3)"
    );
    let e = err_of(b">a\nAC\x00T\n");
    assert!(e.to_string().contains("byte 0x00"), "{e}");
}

#[test]
fn non_utf8_header() {
    let e = err_of(b">a\xff\nAC\n");
    assert!(matches!(e.kind, ParseErrorKind::NotUtf8), "{e}");
    assert_eq!(e.line, 1);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut g = GzEncoder::new(Vec::new(), Compression::default());
    g.write_all(data).expect("gzip into memory");
    g.finish().expect("gzip into memory")
}

#[test]
fn gzip_and_multi_member_gzip_through_both_source_modes() {
    let text = b">a desc\nACGTACGT\nacgt\n>b\nNNNN\n";
    let want = parse(text).expect("parses");
    // bgzip writes a series of gzip members; split the text in two members the same way.
    let mut multi = gzip(&text[..13]);
    multi.extend(gzip(&text[13..]));
    for data in [gzip(text), multi] {
        for chunk in [1, 3, 4096] {
            let opts = SourceOptions { chunk, depth: 2 };
            let inline = ByteSource::inline(std::io::Cursor::new(data.clone()), opts);
            let stats = inline.stats();
            assert_eq!(
                FastaReader::new(inline, "g.fa.gz")
                    .read_all()
                    .expect("parses"),
                want
            );
            assert_eq!(stats.is_gzip(), Some(true));
            assert_eq!(stats.raw_bytes(), data.len() as u64);
            assert_eq!(stats.bytes(), text.len() as u64);
            let ahead =
                ByteSource::read_ahead(std::io::Cursor::new(data.clone()), opts).expect("thread");
            assert_eq!(
                FastaReader::new(ahead, "g.fa.gz")
                    .read_all()
                    .expect("parses"),
                want
            );
        }
    }
}

#[test]
fn corrupt_gzip_is_a_read_error_not_a_short_genome() {
    let mut data = gzip(b">a\nACGTACGTACGTACGTACGTACGTACGTAAAAAAACCCCCCCGGGGGGG\n");
    let n = data.len();
    data.truncate(n - 12);
    let src = ByteSource::inline(std::io::Cursor::new(data), SourceOptions::default());
    let e = FastaReader::new(src, "bad.fa.gz")
        .read_all()
        .expect_err("truncated gzip must fail");
    assert!(matches!(e.kind, ParseErrorKind::Io(_)), "{e}");
}

fn arb_records() -> impl Strategy<Value = Vec<FastaRecord>> {
    let name = "[A-Za-z0-9_.|:-]{1,12}";
    let desc = prop_oneof![
        Just(String::new()),
        "[A-Za-z0-9=;]{1,8}( [A-Za-z0-9=;]{1,8}){0,3}"
    ];
    let seq = proptest::collection::vec(
        prop_oneof![Just(b'A'), Just(b'C'), Just(b'G'), Just(b'T'), Just(b'N')],
        0..300,
    );
    proptest::collection::vec(
        (name, desc, seq).prop_map(|(n, d, s)| rec(&n, &d, &s)),
        1..6,
    )
}

proptest! {
    #[test]
    fn round_trip(records in arb_records(), width in 0usize..80, chunk in 1usize..64, crlf in any::<bool>()) {
        let mut text = Vec::new();
        write_fasta(&mut text, &records, width).expect("write to memory");
        if crlf {
            text = text.iter().flat_map(|&b| if b == b'\n' { vec![b'\r', b'\n'] } else { vec![b] }).collect();
        }
        let src = ByteSource::inline(std::io::Cursor::new(text), SourceOptions { chunk, depth: 1 });
        let got = FastaReader::new(src, "p.fa").read_all().expect("parses");
        prop_assert_eq!(got, records);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        for r in FastaReader::new(&data[..], "any.fa").flatten() {
            prop_assert!(r.seq.iter().all(|b| b"ACGTN".contains(b)));
            prop_assert!(!r.name.is_empty());
        }
    }

    #[test]
    fn fasta_like_bytes_never_panic(data in proptest::collection::vec(prop_oneof![
        Just(b'>'), Just(b'\n'), Just(b'\r'), Just(b' '), Just(b'A'), Just(b'c'), Just(b'n'), Just(b'R'), Just(b'-')
    ], 0..200)) {
        for r in FastaReader::new(&data[..], "any.fa") {
            if let Err(e) = r {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
