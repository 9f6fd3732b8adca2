//! `kura genome map` with a saved index on the host file system, as the CLI runs it (the same
//! pipeline calls and batch size), for measuring the mapper's own memory and time without the
//! rest of the `kura` binary (its shared libraries are resident in every `kura` process).
//!
//! `cargo run --release -p kura-genome --example map_rss -- INDEX.kgi READS.fq [MATES.fq] OUT.sam [THREADS]`

use kura_genome::pipeline::{self, MapJob, OutputFormat};
use kura_genome::store::Store;
use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (index, reads, mates, out, threads) = match args.len() {
        3 => (&args[0], &args[1], None, &args[2], 2),
        4 if args[3].parse::<usize>().is_ok() => {
            (&args[0], &args[1], None, &args[2], args[3].parse()?)
        }
        4 => (&args[0], &args[1], Some(args[2].as_str()), &args[3], 2),
        5 => (
            &args[0],
            &args[1],
            Some(args[2].as_str()),
            &args[3],
            args[4].parse()?,
        ),
        _ => return Err("usage: map_rss INDEX.kgi READS.fq [MATES.fq] OUT.sam [THREADS]".into()),
    };
    let store = Store::host("");
    let index = pipeline::load_index(&store, index)?;
    let job = MapJob {
        reads,
        mates,
        output: Some((out, OutputFormat::Sam)),
        threads,
        batch_bases: pipeline::DEFAULT_BATCH_BASES,
        command_line: "map_rss",
    };
    let report = pipeline::map_reads(&store, &index, &job, &mut |_| {})?;
    eprintln!("{} reads mapped", report.reads);
    Ok(())
}
