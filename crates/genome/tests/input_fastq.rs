//! FASTQ parsing: accepted layouts, every bad-input case with its line, batches, paired files,
//! gzip, round trips and arbitrary input (property tests).

use flate2::write::GzEncoder;
use flate2::Compression;
use kura_genome::fastq::{FastqReader, FastqRecord, PairedReader, ParseError, ParseErrorKind};
use kura_genome::simulate::write_fastq_record;
use kura_genome::source::{ByteSource, SourceOptions};
use proptest::prelude::*;
use std::io::Write;

fn parse(text: &[u8]) -> Result<Vec<FastqRecord>, ParseError> {
    FastqReader::new(text, "r.fq").collect()
}

fn rec(name: &str, seq: &[u8], qual: &[u8]) -> FastqRecord {
    FastqRecord {
        name: name.into(),
        seq: seq.to_vec(),
        qual: qual.to_vec(),
    }
}

fn err_of(text: &[u8]) -> ParseError {
    match parse(text) {
        Ok(r) => panic!("expected an error, parsed {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn accepted_layouts() {
    let text =
        b"@r1 comment here\nacgtn\n+\nIIII#\n\n@r2/1\r\nACGT\r\n+r2/1\r\n!!~~\r\n@r3\n\n+\n\n";
    assert_eq!(
        parse(text).expect("parses"),
        vec![
            rec("r1", b"ACGTN", b"IIII#"),
            rec("r2/1", b"ACGT", b"!!~~"),
            rec("r3", b"", b"")
        ]
    );
    assert_eq!(
        parse(b"@a\nAC\n+\nII").expect("no final newline"),
        vec![rec("a", b"AC", b"II")]
    );
}

/// (input, line, check of the kind, expected message after "r.fq:LINE: ")
type Case = (
    &'static [u8],
    u64,
    fn(&ParseErrorKind) -> bool,
    &'static str,
);

#[test]
fn bad_inputs_name_file_line_and_problem() {
    let cases: &[Case] = &[
        (b"", 0, |k| matches!(k, ParseErrorKind::Empty), "empty file: no records"),
        (b"\n\n", 0, |k| matches!(k, ParseErrorKind::Empty), "empty file: no records"),
        (
            b">chr1\nACGT\n",
            1,
            |k| matches!(k, ParseErrorKind::FastaNotFastq),
            "this is a FASTA file ('>' header), not FASTQ: reads must be FASTQ",
        ),
        (
            b"@a\nAC\n+\nII\nAC\n+\nII\n",
            5,
            |k| matches!(k, ParseErrorKind::MissingAt(_)),
            "expected a record header starting with '@', found \"AC\"",
        ),
        (
            b"@a\nAC\n+\nII\n@b\n",
            6,
            |k| matches!(k, ParseErrorKind::Truncated { missing: "sequence", record_line: 5 }),
            "truncated record: the file ends before the sequence line of the record that starts at line 5",
        ),
        (
            b"@a\nAC\n",
            3,
            |k| matches!(k, ParseErrorKind::Truncated { missing: "'+' separator", .. }),
            "truncated record: the file ends before the '+' separator line of the record that starts at line 1",
        ),
        (
            b"@a\nAC\n+\n",
            4,
            |k| matches!(k, ParseErrorKind::Truncated { missing: "quality", .. }),
            "truncated record: the file ends before the quality line of the record that starts at line 1",
        ),
        (
            b"@a\nACGT\nACGT\n+\nIIIIIIII\n",
            3,
            |k| matches!(k, ParseErrorKind::MissingPlus(_)),
            "expected the '+' separator line, found \"ACGT\" (multi-line FASTQ is not supported)",
        ),
        (
            b"@a\nAC\n+\nII\n@b\nACGT\n+\nIII\n",
            8,
            |k| matches!(k, ParseErrorKind::LengthMismatch { seq: 4, qual: 3 }),
            "quality length 3 differs from sequence length 4",
        ),
        (
            b"@a\nACXT\n+\nIIII\n",
            2,
            |k| matches!(k, ParseErrorKind::BadBase { byte: b'X', col: 3 }),
            "invalid base 'X' in sequence (column 3; only A, C, G, T, N are accepted)",
        ),
        (
            b"@a\nAC.T\n+\nIIII\n",
            2,
            |k| matches!(k, ParseErrorKind::BadBase { byte: b'.', col: 3 }),
            "invalid base '.' in sequence (column 3; only A, C, G, T, N are accepted)",
        ),
        (
            b"@a\nACGT\n+\nII I\n",
            4,
            |k| matches!(k, ParseErrorKind::BadQuality { byte: b' ', col: 3 }),
            "invalid quality character byte 0x20 (column 3; must be '!'..'~')",
        ),
        (b"@ x\nAC\n+\nII\n", 1, |k| matches!(k, ParseErrorKind::EmptyReadName), "'@' header with an empty read name"),
        (
            b"@a\xfe\nAC\n+\nII\n",
            1,
            |k| matches!(k, ParseErrorKind::BadReadName { byte: 0xfe, col: 3 }),
            "read name has byte 0xfe at column 3; names must be printable ASCII",
        ),
        (
            b"@\x00r\nAC\n+\nII\n",
            1,
            |k| matches!(k, ParseErrorKind::BadReadName { byte: 0, col: 2 }),
            "read name has byte 0x00 at column 2; names must be printable ASCII",
        ),
        (
            b"chr1\t100\t200\n",
            1,
            |k| matches!(k, ParseErrorKind::MissingAt(_)),
            "expected a record header starting with '@', found \"chr1\\t100\\t200\"",
        ),
    ];
    for (text, line, check, msg) in cases {
        let e = err_of(text);
        assert!(
            check(&e.kind),
            "{:?}: wrong kind {:?}",
            String::from_utf8_lossy(text),
            e.kind
        );
        assert_eq!(e.line, *line, "{e}");
        assert_eq!(e.path, "r.fq");
        let want = if *line == 0 {
            format!("r.fq: {msg}")
        } else {
            format!("r.fq:{line}: {msg}")
        };
        assert_eq!(e.to_string(), want);
    }
}

#[test]
fn nothing_after_an_error() {
    let mut r = FastqReader::new(&b"@a\nAX\n+\nII\n@b\nAC\n+\nII\n"[..], "r.fq");
    assert!(r.next().expect("one item").is_err());
    assert!(r.next().is_none());
}

#[test]
fn batches_reuse_records_and_respect_max_bases() {
    let mut text = Vec::new();
    for i in 0..10 {
        write_fastq_record(
            &mut text,
            &rec(&format!("r{i}"), b"ACGTACGTAC", b"IIIIIIIIII"),
        )
        .expect("to memory");
    }
    let mut r = FastqReader::new(&text[..], "r.fq");
    let mut batch = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let n = r.next_batch(&mut batch, 25).expect("parses");
        assert_eq!(n, batch.len());
        if n == 0 {
            break;
        }
        sizes.push(n);
    }
    assert_eq!(sizes, vec![3, 3, 3, 1]);
    assert_eq!(r.records(), 10);
    let mut r = FastqReader::new(&text[..], "r.fq");
    assert_eq!(
        r.next_batch(&mut batch, 0).expect("parses"),
        1,
        "at least one record per batch"
    );
}

fn fastq(records: &[FastqRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        write_fastq_record(&mut out, r).expect("to memory");
    }
    out
}

#[test]
fn paired_reader() {
    let a = fastq(&[rec("p1/1", b"AC", b"II"), rec("p2", b"GG", b"II")]);
    let b = fastq(&[rec("p1/2", b"TT", b"II"), rec("p2", b"CA", b"II")]);
    let mut p = PairedReader::new(
        FastqReader::new(&a[..], "a.fq"),
        FastqReader::new(&b[..], "b.fq"),
    );
    let (mut x, mut y) = (Vec::new(), Vec::new());
    assert_eq!(p.next_batch(&mut x, &mut y, 1000).expect("pairs"), 2);
    assert_eq!(
        (x[1].name.as_str(), y[1].seq.as_slice()),
        ("p2", &b"CA"[..])
    );
    assert_eq!(p.next_batch(&mut x, &mut y, 1000).expect("pairs"), 0);
    assert_eq!(p.pairs(), 2);

    let short = fastq(&[rec("p1", b"AC", b"II")]);
    let mut p = PairedReader::new(
        FastqReader::new(&a[..], "a.fq"),
        FastqReader::new(&short[..], "b.fq"),
    );
    let e = p
        .next_batch(&mut x, &mut y, 1000)
        .expect_err("counts differ");
    assert!(
        matches!(e.kind, ParseErrorKind::MateCount(ref f) if f == "b.fq"),
        "{e}"
    );
    assert_eq!((e.path.as_str(), e.line), ("a.fq", 5));
    assert_eq!(
        e.to_string(),
        "a.fq:5: the mate files have different numbers of reads: b.fq ends first"
    );
    let mut p = PairedReader::new(
        FastqReader::new(&short[..], "a.fq"),
        FastqReader::new(&b[..], "b.fq"),
    );
    let e = p
        .next_batch(&mut x, &mut y, 1000)
        .expect_err("counts differ");
    assert_eq!((e.path.as_str(), e.line), ("b.fq", 5));

    let other = fastq(&[rec("p1", b"AC", b"II"), rec("p3", b"AC", b"II")]);
    let mut p = PairedReader::new(
        FastqReader::new(&a[..], "a.fq"),
        FastqReader::new(&other[..], "b.fq"),
    );
    let e = p
        .next_batch(&mut x, &mut y, 1000)
        .expect_err("names differ");
    assert!(matches!(e.kind, ParseErrorKind::MateName(..)), "{e}");
    assert_eq!(e.to_string(), "b.fq:5: mate names differ: \"p2\" vs \"p3\"");

    let empty: &[u8] = b"";
    let mut p = PairedReader::new(
        FastqReader::new(empty, "a.fq"),
        FastqReader::new(&b[..], "b.fq"),
    );
    let e = p.next_batch(&mut x, &mut y, 1000).expect_err("empty");
    assert!(matches!(e.kind, ParseErrorKind::Empty), "{e}");
}

#[test]
fn gzip_fastq_through_read_ahead() {
    let records: Vec<_> = (0..500)
        .map(|i| rec(&format!("read{i}"), b"ACGTNACGTA", b"IIIII#####"))
        .collect();
    let text = fastq(&records);
    let mut g = GzEncoder::new(Vec::new(), Compression::fast());
    g.write_all(&text).expect("gzip to memory");
    let data = g.finish().expect("gzip to memory");
    let src = ByteSource::read_ahead(
        std::io::Cursor::new(data),
        SourceOptions {
            chunk: 777,
            depth: 3,
        },
    )
    .expect("thread");
    let stats = src.stats();
    let got: Vec<_> = FastqReader::new(src, "r.fq.gz")
        .collect::<Result<_, _>>()
        .expect("parses");
    assert_eq!(got, records);
    assert_eq!(stats.bytes(), text.len() as u64);
    assert_eq!(stats.is_gzip(), Some(true));
}

fn arb_record() -> impl Strategy<Value = FastqRecord> {
    ("[!-~&&[^ ]]{1,20}", 0usize..200).prop_flat_map(|(name, len)| {
        (
            Just(name),
            proptest::collection::vec(
                prop_oneof![Just(b'A'), Just(b'C'), Just(b'G'), Just(b'T'), Just(b'N')],
                len,
            ),
            proptest::collection::vec(b'!'..=b'~', len),
        )
            .prop_map(|(n, s, q)| FastqRecord {
                name: n,
                seq: s,
                qual: q,
            })
    })
}

proptest! {
    #[test]
    fn round_trip(records in proptest::collection::vec(arb_record(), 1..20), chunk in 1usize..100, crlf in any::<bool>(), max_bases in 1usize..500) {
        let mut text = fastq(&records);
        if crlf {
            text = text.iter().flat_map(|&b| if b == b'\n' { vec![b'\r', b'\n'] } else { vec![b] }).collect();
        }
        let src = ByteSource::inline(std::io::Cursor::new(text), SourceOptions { chunk, depth: 1 });
        let mut r = FastqReader::new(src, "p.fq");
        let mut got = Vec::new();
        let mut batch = Vec::new();
        while r.next_batch(&mut batch, max_bases).expect("parses") > 0 {
            got.extend(batch.iter().cloned());
        }
        prop_assert_eq!(got, records);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        for r in FastqReader::new(&data[..], "any.fq").flatten() {
            prop_assert_eq!(r.seq.len(), r.qual.len());
        }
    }

    #[test]
    fn fastq_like_bytes_never_panic(data in proptest::collection::vec(prop_oneof![
        Just(b'@'), Just(b'+'), Just(b'\n'), Just(b'\r'), Just(b'A'), Just(b'c'), Just(b'I'), Just(b' '), Just(b'>')
    ], 0..200)) {
        let mut n = 0;
        for r in FastqReader::new(&data[..], "any.fq") {
            match r {
                Ok(r) => prop_assert!(r.seq.iter().all(|b| b"ACGTN".contains(b))),
                Err(e) => prop_assert!(e.line > 0 || matches!(e.kind, ParseErrorKind::Empty)),
            }
            n += 1;
            prop_assert!(n < 1000);
        }
    }
}
