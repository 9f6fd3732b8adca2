//! Writes one cell's dataset of `kura bench genome --matrix` (the synthetic reference with
//! repeats, seed 19, and its simulated reads, seed 42) to a directory, so a change to the mapper
//! can be checked by diffing its SAM output on the same reads before and after.
//!
//! `cargo run --release -p kura-genome --example matrix_dataset -- DIR [SIZE_BASES] [READS]
//! [ERROR_RATE] [INDEL_RATE]` (defaults 5000000 10000 0.02 0.001) writes `DIR/reference.fa`,
//! `DIR/reads_1.fq` and `DIR/reads_2.fq`, the same files the bench writes for that cell.

use kura_genome::repeats::{repeat_genome, RepeatGenomeOptions};
use kura_genome::simulate::{write_fasta, write_reads, ReadOptions};
use std::error::Error;
use std::path::PathBuf;

/// The bench's haplotype SNP rate (`crates/bench/src/genome_matrix.rs`).
const SNP_RATE: f64 = 0.00085;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().map(PathBuf::from) else {
        return Err(
            "usage: matrix_dataset DIR [SIZE_BASES] [READS] [ERROR_RATE] [INDEL_RATE]".into(),
        );
    };
    let size: usize = args.get(1).map_or(Ok(5_000_000), |s| s.parse())?;
    let reads: u64 = args.get(2).map_or(Ok(10_000), |s| s.parse())?;
    let error_rate: f64 = args.get(3).map_or(Ok(0.02), |s| s.parse())?;
    let indel_rate: f64 = args.get(4).map_or(Ok(0.001), |s| s.parse())?;
    std::fs::create_dir_all(&dir)?;
    let genome = repeat_genome(&RepeatGenomeOptions::with_total(19, size));
    write_fasta(
        std::io::BufWriter::new(std::fs::File::create(dir.join("reference.fa"))?),
        &genome,
        80,
    )?;
    let mutation_rate = SNP_RATE + indel_rate;
    let opts = ReadOptions {
        n: reads,
        error_rate,
        mutation_rate,
        indel_fraction: indel_rate / mutation_rate,
        ..ReadOptions::default()
    };
    write_reads(
        &genome,
        &opts,
        &dir.join("reads_1.fq"),
        Some(&dir.join("reads_2.fq")),
        false,
    )?;
    println!("wrote {}", dir.display());
    Ok(())
}
