//! The FASTA parser on arbitrary bytes, read whole and through the byte source in small chunks
//! (gzip detection included): errors are fine, panics are bugs, and both paths must agree.
#![no_main]

use kura_genome::fasta::FastaReader;
use kura_genome::source::{ByteSource, SourceOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole: Vec<_> = FastaReader::new(data, "fuzz.fa")
        .map(|r| r.map_err(|e| e.to_string()))
        .collect();
    for r in whole.iter().flatten() {
        assert!(!r.name.is_empty());
        assert!(r.seq.iter().all(|b| b"ACGTN".contains(b)));
    }
    let chunk = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let src = ByteSource::inline(
        std::io::Cursor::new(data.to_vec()),
        SourceOptions { chunk, depth: 1 },
    );
    let chunked: Vec<_> = FastaReader::new(src, "fuzz.fa")
        .map(|r| r.map_err(|e| e.to_string()))
        .collect();
    if data.get(..2) != Some(&[0x1f, 0x8b][..]) {
        assert_eq!(whole, chunked);
    }
});
