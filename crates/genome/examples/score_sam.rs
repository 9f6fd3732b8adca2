//! Scores a SAM file (kura's or minimap2's, `-` for stdin) against the true origins in its
//! simulated read names, with [`kura_genome::truth::score_sam`], and parses a reference with the
//! crate's FASTA reader to report its contigs.
//!
//! `cargo run --release -p kura-genome --example score_sam -- OUT.sam [REF.fa[.gz]]`

use kura_genome::fasta::FastaReader;
use kura_genome::source::ByteSource;
use kura_genome::truth::{score_sam, ScoreOptions};
use std::error::Error;
use std::path::Path;
use std::time::Instant;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(sam) = args.first() else {
        return Err("usage: score_sam OUT.sam [REF.fa[.gz]]".into());
    };
    if let Some(fa) = args.get(1) {
        let t = Instant::now();
        let src = ByteSource::open_path(Path::new(fa))?;
        let contigs = FastaReader::new(src, fa.as_str()).read_all()?;
        let bases: usize = contigs.iter().map(|c| c.seq.len()).sum();
        let n = contigs
            .iter()
            .flat_map(|c| &c.seq)
            .filter(|&&b| b == b'N')
            .count();
        println!(
            "{fa}: {} contigs, {bases} bp ({n} N) in {:.3} s",
            contigs.len(),
            t.elapsed().as_secs_f64()
        );
        for c in &contigs {
            println!("  {} ({} bp) {}", c.name, c.seq.len(), c.description);
        }
    }
    let src = if sam == "-" {
        ByteSource::read_ahead(std::io::stdin(), Default::default())?
    } else {
        ByteSource::open_path(Path::new(sam))?
    };
    let score = score_sam(src, sam, ScoreOptions::default())?;
    println!("{sam}: {score}");
    Ok(())
}
