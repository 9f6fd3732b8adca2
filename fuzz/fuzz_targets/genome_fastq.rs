//! The FASTQ parser on arbitrary bytes, record by record and in batches through the byte source
//! in small chunks (gzip detection included), plus the paired reader on the input split in two:
//! errors are fine, panics are bugs, and the single-file paths must agree.
#![no_main]

use kura_genome::fastq::{FastqReader, FastqRecord, PairedReader};
use kura_genome::source::{ByteSource, SourceOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole: Vec<_> = FastqReader::new(data, "fuzz.fq")
        .map(|r| r.map_err(|e| e.to_string()))
        .collect();
    for r in whole.iter().flatten() {
        assert_eq!(r.seq.len(), r.qual.len());
        assert!(r.seq.iter().all(|b| b"ACGTN".contains(b)));
        assert!(!r.name.is_empty() && r.name.bytes().all(|b| b.is_ascii_graphic()));
    }
    let chunk = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let src = ByteSource::inline(
        std::io::Cursor::new(data.to_vec()),
        SourceOptions { chunk, depth: 1 },
    );
    let mut reader = FastqReader::new(src, "fuzz.fq");
    let mut batch = Vec::new();
    let mut batched = Vec::new();
    loop {
        match reader.next_batch(&mut batch, chunk) {
            Ok(0) => break,
            Ok(_) => batched.extend(batch.iter().cloned().map(Ok)),
            Err(e) => {
                batched.push(Err(e.to_string()));
                break;
            }
        }
    }
    if data.get(..2) != Some(&[0x1f, 0x8b][..]) {
        // A failed batch drops the records read before the error in it: the same error, and the
        // batched records a prefix of the record-by-record ones.
        let err =
            |v: &[Result<FastqRecord, String>]| v.iter().find_map(|r| r.as_ref().err()).cloned();
        let ok = |v: &[Result<FastqRecord, String>]| {
            v.iter()
                .filter_map(|r| r.as_ref().ok())
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(err(&whole), err(&batched));
        assert!(ok(&whole).starts_with(&ok(&batched)));
        if err(&whole).is_none() {
            assert_eq!(whole, batched);
        }
    }
    let (a, b) = data.split_at(data.len() / 2);
    let mut pairs = PairedReader::new(FastqReader::new(a, "a.fq"), FastqReader::new(b, "b.fq"));
    let (mut x, mut y) = (Vec::new(), Vec::new());
    while let Ok(n) = pairs.next_batch(&mut x, &mut y, 64) {
        if n == 0 {
            break;
        }
        assert_eq!(x.len(), y.len());
    }
});
