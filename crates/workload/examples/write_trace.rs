//! Writes one workload as a trace file, for the C++ peer (`crates/bench/peers/kv_replay.cc`, which
//! `kura bench kv` builds under `target/*/kura-peers/`) or for inspection:
//!
//! ```sh
//! cargo run -p kura-workload --example write_trace -- ycsb-a 100000 100000 1000 1 /tmp/a.trace
//! cargo run -p kura-workload --example write_trace -- fillrandom 100000 0 256 1 /tmp/f.trace
//! target/release/kura-peers/kv-replay-rocksdb-* --trace /tmp/a.trace --db /tmp/rocks-a
//! ```
//!
//! Arguments: workload (`ycsb-a` … `ycsb-f` or a db_bench name), record count (db_bench: `num`),
//! operation count (ignored by db_bench), value size, seed, output path.

use std::fs::File;
use std::io::BufWriter;
use std::process::ExitCode;

use kura_workload::{db_bench, write_workload, ycsb, Workload};

fn build(args: &[String]) -> Result<(Workload, String), String> {
    let [name, records, ops, value_len, seed, out] = args else {
        return Err("usage: write_trace WORKLOAD RECORDS OPS VALUE_LEN SEED OUT".into());
    };
    let int = |s: &String| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let (records, ops, value_len, seed) = (int(records)?, int(ops)?, int(value_len)?, int(seed)?);
    let value_len = usize::try_from(value_len).map_err(|e| e.to_string())?;
    let w = match name.strip_prefix("ycsb-") {
        Some(kind) if kind.len() == 1 => {
            let kind = kind.chars().next().unwrap_or('?');
            ycsb(kind, records, ops, value_len, seed)
        }
        _ => db_bench(name, records, value_len, seed),
    }
    .map_err(|e| e.to_string())?;
    Ok((w, out.clone()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = build(&args).and_then(|(w, out)| {
        let file = File::create(&out).map_err(|e| format!("{out}: {e}"))?;
        let ops = write_workload(BufWriter::new(file), &w).map_err(|e| e.to_string())?;
        println!("{}: {ops} operations -> {out}", w.name());
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_trace: {e}");
            ExitCode::from(2)
        }
    }
}
