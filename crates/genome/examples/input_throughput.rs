//! Read-loading throughput of the input side: raw chunked reads, FASTQ parsing on the caller's
//! thread, and FASTQ parsing with the read-ahead thread, for plain and gzip input.
//!
//! `cargo run --release -p kura-genome --example input_throughput [-- READS.fq[.gz] ...]`
//! Without arguments it simulates 300,000 150 bp reads into a temp dir (plain and gzip). Files
//! are read through the page cache, so the figures are parser speed, not device speed.

use kura_genome::fastq::FastqReader;
use kura_genome::simulate::{synthetic_genome, write_reads, GenomeOptions, ReadOptions};
use kura_genome::source::{ByteSource, SourceOptions};
use std::error::Error;
use std::fs::File;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn drain(mut src: ByteSource) -> std::io::Result<u64> {
    let mut n = 0;
    loop {
        let len = src.fill_buf()?.len();
        if len == 0 {
            return Ok(n);
        }
        n += len as u64;
        src.consume(len);
    }
}

fn parse(src: ByteSource, path: &Path) -> Result<(u64, u64), Box<dyn Error>> {
    let mut r = FastqReader::new(src, path.display().to_string());
    let mut batch = Vec::new();
    let (mut reads, mut bases) = (0u64, 0u64);
    loop {
        let n = r.next_batch(&mut batch, 4 << 20)?;
        if n == 0 {
            return Ok((reads, bases));
        }
        reads += n as u64;
        bases += batch.iter().map(|x| x.seq.len() as u64).sum::<u64>();
    }
}

fn measure(path: &Path) -> Result<(), Box<dyn Error>> {
    let opts = SourceOptions::default();
    let size = std::fs::metadata(path)?.len();
    // Warm the page cache so every row reads the same way.
    drain(ByteSource::inline(File::open(path)?, opts))?;
    let t = Instant::now();
    let src = ByteSource::inline(File::open(path)?, opts);
    let stats = src.stats();
    let bytes = drain(src)?;
    let raw = t.elapsed().as_secs_f64();
    let gz = if stats.is_gzip() == Some(true) {
        "gzip"
    } else {
        "plain"
    };
    println!(
        "{} ({gz}, {:.1} MB on disk, {:.1} MB of text)",
        path.display(),
        size as f64 / 1e6,
        bytes as f64 / 1e6
    );
    println!(
        "  {:<34} {:>8.3} s {:>9.1} MB/s of text",
        "read + decompress, no parsing",
        raw,
        bytes as f64 / 1e6 / raw
    );
    for (label, ahead) in [
        ("parse, inline reads", false),
        ("parse, read-ahead thread", true),
    ] {
        let file = File::open(path)?;
        let src = if ahead {
            ByteSource::read_ahead(file, opts)?
        } else {
            ByteSource::inline(file, opts)
        };
        let stats = src.stats();
        let t = Instant::now();
        let (reads, _) = parse(src, path)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  {label:<34} {secs:>8.3} s {:>9.1} MB/s of text, {:>6.2} M reads/s, waited on input {:.3} s",
            stats.bytes() as f64 / 1e6 / secs,
            reads as f64 / 1e6 / secs,
            stats.wait().as_secs_f64()
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if !args.is_empty() {
        for p in &args {
            measure(p)?;
        }
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let genome = synthetic_genome(&GenomeOptions::with_total(1, 2_000_000));
    let opts = ReadOptions {
        n: 300_000,
        ..ReadOptions::default()
    };
    for (name, gzip) in [("reads.fq", false), ("reads.fq.gz", true)] {
        let p = dir.path().join(name);
        let t = Instant::now();
        let n = write_reads(&genome, &opts, &p, None, gzip)?;
        println!(
            "simulated {n} reads into {name} in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        measure(&p)?;
    }
    Ok(())
}
