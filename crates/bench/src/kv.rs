//! `kura bench kv`: the paper's key-value figures. db_bench-style workloads (fillseq,
//! fillrandom, fillsync, overwrite, readrandom, readseq) and YCSB core workloads A–F, each on
//! Google LevelDB over AccelFS (direct), LevelDB over its POSIX Env on ext4, LevelDB over AccelFS
//! through `redirect`, and RocksDB on ext4 (through `rocksdict`, replaying the exact same
//! operation trace) — same keys, value sizes and block-cache budget, same run.
//!
//! Every system gets a fresh database per workload; the load phase is untimed, the run phase is
//! timed per operation (throughput and p50/p99/p99.9 latency).

use crate::output::{plot_help, RunArgs};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_accelfs::{FileSystem, MkfsOptions, MountOptions};
use kura_kv::{Db, DbOptions, Location};
use kura_workload::{Op, Workload};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const PLOT: &str = include_str!("../../../scripts/plot_kvbench.py");
const PEER: &str = include_str!("../../../scripts/kv_rocksdb_peer.py");

#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("plot", |a| plot_help(a, "kv")))]
pub struct KvBenchArgs {
    /// Directory for the images, the ext4 databases and RocksDB (a disk file system).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Comma-separated workloads: fillseq, fillrandom, fillsync, overwrite, readrandom,
    /// readseq, ycsb-a … ycsb-f, or `all`.
    #[arg(long, default_value = "all")]
    pub workloads: String,
    /// Comma-separated systems: accelfs, posix, redirect, rocksdb.
    #[arg(long, default_value = "accelfs,posix,redirect,rocksdb")]
    pub systems: String,
    /// Records loaded (db_bench: keys written) per workload.
    #[arg(long, default_value_t = 50_000)]
    pub records: u64,
    /// Operations in each run phase (YCSB).
    #[arg(long, default_value_t = 50_000)]
    pub ops: u64,
    /// Value sizes, comma-separated (the slides use 256 B to 1 MiB).
    #[arg(long, default_value = "1K")]
    pub value_sizes: String,
    /// At most this much data per workload: records are reduced for large values.
    #[arg(long, default_value = "512M")]
    pub data: String,
    /// Block cache of every store (LevelDB and RocksDB alike).
    #[arg(long, default_value = "8M")]
    pub cache: String,
    /// AccelFS buffer cache (ext4 has the whole page cache, which cannot be bounded here).
    #[arg(long, default_value = "256M")]
    pub fs_cache: String,
    /// fillsync writes this many keys (each one synced).
    #[arg(long, default_value_t = 2000)]
    pub sync_records: u64,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub system: String,
    pub workload: String,
    pub value_bytes: usize,
    pub records: u64,
    pub ops: u64,
    /// Entries read by scans (readseq, YCSB-E), which is what their throughput counts.
    pub entries: u64,
    pub seconds: f64,
    pub ops_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub points: Vec<Point>,
    pub cache_bytes: usize,
    pub peak_rss_bytes: u64,
    pub notes: Vec<String>,
}

const ACCELFS: &str = "LevelDB/AccelFS";
const POSIX: &str = "LevelDB/ext4";
const REDIRECT: &str = "LevelDB/AccelFS/redirect";
const ROCKSDB: &str = "RocksDB/ext4";

fn size_arg(s: &str) -> anyhow::Result<u64> {
    kura_engine::spec::parse_size(s).map_err(anyhow::Error::msg)
}

/// Builds the named workload with `records` keys of `value` bytes.
fn workload(
    name: &str,
    records: u64,
    ops: u64,
    value: usize,
    sync_records: u64,
) -> anyhow::Result<Workload> {
    let w = match name.strip_prefix("ycsb-") {
        Some(letter) => {
            let c = letter
                .chars()
                .next()
                .map(|c| c.to_ascii_uppercase())
                .context("ycsb workload needs a letter")?;
            kura_workload::ycsb(c, records, ops, value, 42)?
        }
        None if name == "fillsync" => kura_workload::db_bench(name, sync_records, value, 42)?,
        None => kura_workload::db_bench(name, records, value, 42)?,
    };
    Ok(w)
}

/// Runs one phase against a `Db`; returns per-op latencies (µs) and scanned entries.
fn run_phase(
    db: &Db,
    w: &Workload,
    ops: kura_workload::Ops,
    timed: bool,
) -> anyhow::Result<(Vec<f64>, u64)> {
    let sync = w.sync();
    let mut lat = Vec::new();
    let mut entries = 0u64;
    for op in ops {
        let t = Instant::now();
        match &op {
            Op::Insert { .. } | Op::Update { .. } => {
                let v = w.value(&op).context("value outside the pool")?;
                if sync {
                    db.put_sync(op.key().as_bytes(), v)?;
                } else {
                    db.put(op.key().as_bytes(), v)?;
                }
            }
            Op::Read { .. } => {
                db.get(op.key().as_bytes())?;
            }
            Op::Scan { count, .. } => {
                entries += db.scan(op.key().as_bytes(), None, *count as usize)?.len() as u64;
            }
            Op::ReadModifyWrite { .. } => {
                db.get(op.key().as_bytes())?;
                let v = w.value(&op).context("value outside the pool")?;
                db.put(op.key().as_bytes(), v)?;
            }
            Op::Delete { .. } => db.delete(op.key().as_bytes())?,
        }
        if timed {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok((lat, entries))
}

fn point(
    system: &str,
    w: &Workload,
    value: usize,
    mut lat: Vec<f64>,
    entries: u64,
    secs: f64,
) -> Point {
    lat.sort_by(f64::total_cmp);
    let pick = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p).round() as usize]
        }
    };
    let ops = lat.len() as u64;
    let counted = if entries > 0 { entries } else { ops };
    Point {
        system: system.into(),
        workload: w.name().to_string(),
        value_bytes: value,
        records: w.loaded_records(),
        ops,
        entries,
        seconds: secs,
        ops_per_s: counted as f64 / secs.max(1e-9),
        p50_us: pick(0.5),
        p99_us: pick(0.99),
        p999_us: pick(0.999),
    }
}

fn db_options(cache: usize) -> DbOptions {
    DbOptions {
        block_cache_bytes: cache,
        // Same as RocksDB's side: no compression, so both move the same bytes.
        compression: false,
        ..DbOptions::default()
    }
}

fn run_leveldb(
    system: &str,
    store: Location,
    w: &Workload,
    value: usize,
    cache: usize,
) -> anyhow::Result<Point> {
    let db = Db::open(store, &db_options(cache)).with_context(|| format!("{system}: open"))?;
    run_phase(&db, w, w.load(), false)?;
    let t = Instant::now();
    let (lat, entries) = run_phase(&db, w, w.run(), true)?;
    let secs = t.elapsed().as_secs_f64();
    db.close()?;
    Ok(point(system, w, value, lat, entries, secs))
}

/// The RocksDB peer: the same workload as a trace file, replayed by the Python script.
fn run_rocksdb(dir: &Path, w: &Workload, value: usize, cache: usize) -> anyhow::Result<Point> {
    let trace = dir.join(format!("{}.trace", w.name()));
    let f = std::fs::File::create(&trace)?;
    kura_workload::write_workload(f, w)?;
    let script = dir.join("kv_rocksdb_peer.py");
    std::fs::write(&script, PEER)?;
    let db = dir.join(format!("rocks-{}-{value}", w.name()));
    let out = Command::new("python3")
        .arg(&script)
        .arg("--trace")
        .arg(&trace)
        .arg("--db")
        .arg(&db)
        .arg("--cache-bytes")
        .arg(cache.to_string())
        .output()
        .context("running python3")?;
    let _ = std::fs::remove_dir_all(&db);
    let _ = std::fs::remove_file(&trace);
    if !out.status.success() {
        bail!(
            "RocksDB peer: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("failed")
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("peer output")?;
    let num = |k: &str| v.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    let entries = v
        .get("by_op")
        .and_then(|b| b.get("scan"))
        .and_then(|s| s.get("entries"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    let ops = num("ops") as u64;
    let secs = num("seconds");
    Ok(Point {
        system: ROCKSDB.into(),
        workload: w.name().to_string(),
        value_bytes: value,
        records: w.loaded_records(),
        ops,
        entries,
        seconds: secs,
        ops_per_s: if entries > 0 {
            entries as f64 / secs.max(1e-9)
        } else {
            num("ops_per_s")
        },
        p50_us: num("p50_us"),
        p99_us: num("p99_us"),
        p999_us: num("p999_us"),
    })
}

fn rocksdb_missing() -> Option<String> {
    match Command::new("python3")
        .args(["-c", "import rocksdict"])
        .output()
    {
        Err(e) => Some(format!("python3: {e}")),
        Ok(o) if !o.status.success() => {
            Some("rocksdict is not installed (pip install rocksdict)".into())
        }
        Ok(_) => None,
    }
}

/// An image file written in full, formatted and mounted through `kind` (`uring`/`redirect`).
fn accelfs(path: &Path, bytes: u64, kind: &str, cache: u64) -> anyhow::Result<FileSystem> {
    crate::fs::write_host_file(path, bytes)?;
    let fs = FileSystem::format(
        kura_engine::open(&format!("{kind}:{}", path.display()))?,
        MkfsOptions::default(),
        MountOptions {
            cache_bytes: cache,
            ..MountOptions::default()
        },
    )?;
    Ok(fs)
}

pub fn run(args: &KvBenchArgs) -> anyhow::Result<()> {
    let mut names: Vec<String> = if args.workloads == "all" {
        kura_workload::DB_BENCH_WORKLOADS
            .iter()
            .filter(|n| {
                [
                    "fillseq",
                    "fillrandom",
                    "fillsync",
                    "overwrite",
                    "readrandom",
                    "readseq",
                ]
                .contains(n)
            })
            .map(|s| s.to_string())
            .chain(
                kura_workload::YCSB_WORKLOADS
                    .iter()
                    .map(|c| format!("ycsb-{}", c.to_ascii_lowercase())),
            )
            .collect()
    } else {
        args.workloads
            .split(',')
            .map(|s| s.trim().to_lowercase())
            .collect()
    };
    let mut systems: Vec<String> = args
        .systems
        .split(',')
        .map(|s| s.trim().to_lowercase())
        .collect();
    let (mut records, mut ops, mut sync_records) = (args.records, args.ops, args.sync_records);
    if args.run.quick {
        records = records.min(2000);
        ops = ops.min(2000);
        sync_records = sync_records.min(100);
        if args.workloads == "all" {
            names = ["fillrandom", "fillsync", "readrandom", "ycsb-a", "ycsb-e"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        }
    }
    for s in &systems {
        if !["accelfs", "posix", "redirect", "rocksdb"].contains(&s.as_str()) {
            bail!("unknown system {s:?}: accelfs, posix, redirect, rocksdb");
        }
    }
    let mut notes = Vec::new();
    if systems.iter().any(|s| s == "rocksdb") {
        if let Some(why) = rocksdb_missing() {
            notes.push(format!("RocksDB skipped: {why}"));
            systems.retain(|s| s != "rocksdb");
        }
    }
    let sizes: Vec<usize> = args
        .value_sizes
        .split(',')
        .map(|s| size_arg(s.trim()).map(|v| v as usize))
        .collect::<anyhow::Result<_>>()?;
    let data = size_arg(&args.data)?;
    let cache = size_arg(&args.cache)? as usize;
    let dir = tempfile::Builder::new()
        .prefix("kura-bench-kv")
        .tempdir_in(&args.dir)
        .with_context(|| format!("work directory in {}", args.dir.display()))?;
    let image_bytes = (data * 3).max(256 << 20);
    let fs_cache = size_arg(&args.fs_cache)?;
    let fs = if systems.iter().any(|s| s == "accelfs") {
        Some(accelfs(
            &dir.path().join("accelfs.img"),
            image_bytes,
            "uring",
            fs_cache,
        )?)
    } else {
        None
    };
    let rfs = if systems.iter().any(|s| s == "redirect") {
        Some(accelfs(
            &dir.path().join("redirect.img"),
            image_bytes,
            "redirect",
            fs_cache,
        )?)
    } else {
        None
    };
    let total = (names.len() * sizes.len() * systems.len()) as u64;
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let mut points = Vec::new();
    for &value in &sizes {
        let recs = records.min((data / value as u64).max(100));
        for name in &names {
            let w = workload(name, recs, ops, value, sync_records)?;
            for (i, system) in systems.iter().enumerate() {
                bar.set_message(format!("{name} {value} B on {system}"));
                let path = format!("/db-{name}-{value}-{i}");
                let p = match system.as_str() {
                    "accelfs" => {
                        let fs = fs.clone().context("AccelFS not prepared")?;
                        let p = run_leveldb(
                            ACCELFS,
                            Location::AccelFs {
                                fs: fs.clone(),
                                path: path.clone(),
                            },
                            &w,
                            value,
                            cache,
                        )?;
                        remove_tree(&fs, &path)?;
                        p
                    }
                    "redirect" => {
                        let fs = rfs.clone().context("redirect AccelFS not prepared")?;
                        let p = run_leveldb(
                            REDIRECT,
                            Location::AccelFs {
                                fs: fs.clone(),
                                path: path.clone(),
                            },
                            &w,
                            value,
                            cache,
                        )?;
                        remove_tree(&fs, &path)?;
                        p
                    }
                    "posix" => {
                        let host = dir.path().join(path.trim_start_matches('/'));
                        let p = run_leveldb(POSIX, Location::Dir(host.clone()), &w, value, cache)?;
                        std::fs::remove_dir_all(&host)?;
                        p
                    }
                    _ => run_rocksdb(dir.path(), &w, value, cache)?,
                };
                points.push(p);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    if let Some(fs) = fs {
        fs.unmount()?;
    }
    if let Some(fs) = rfs {
        fs.unmount()?;
    }
    notes.push(format!(
        "block cache {cache} B for every store; LevelDB and RocksDB without compression; AccelFS buffer cache {fs_cache} B; ext4 has the page cache, which is not bounded"
    ));
    notes.push("RocksDB runs in Python (rocksdict): its latencies include a few µs of interpreter time per call".into());
    notes.push(
        "fillsync and readseq/YCSB-E: fillsync syncs every write; scans count entries per second"
            .into(),
    );
    let report = Report {
        points,
        cache_bytes: cache,
        peak_rss_bytes: crate::fs::peak_rss(),
        notes,
    };
    print_report(&report);
    args.run.output.emit("kv", PLOT, &report)
}

fn remove_tree(fs: &FileSystem, path: &str) -> anyhow::Result<()> {
    for e in fs.read_dir(path)? {
        fs.remove_file(&format!("{path}/{}", e.name_lossy()))?;
    }
    fs.remove_dir(path)?;
    Ok(())
}

fn print_report(r: &Report) {
    let find = |s: &str, w: &str, v: usize| {
        r.points
            .iter()
            .find(|p| p.system == s && p.workload == w && p.value_bytes == v)
    };
    let mut keys: Vec<(usize, String)> = r
        .points
        .iter()
        .map(|p| (p.value_bytes, p.workload.clone()))
        .collect();
    keys.dedup();
    println!("throughput, ops/s (entries/s for scans); p99 µs in the JSON");
    println!(
        "{:<12} {:>7} {:>16} {:>14} {:>18} {:>14} {:>9} {:>9}",
        "workload", "value", ACCELFS, POSIX, REDIRECT, ROCKSDB, "fs/ext4", "fs/rocks"
    );
    let mut seen = Vec::new();
    for (v, w) in keys {
        if seen.contains(&(v, w.clone())) {
            continue;
        }
        seen.push((v, w.clone()));
        let cell = |s: &str| find(s, &w, v).map_or("-".into(), |p| format!("{:.0}", p.ops_per_s));
        let ratio = |a: &str, b: &str| match (find(a, &w, v), find(b, &w, v)) {
            (Some(x), Some(y)) if y.ops_per_s > 0.0 => format!("{:.2}", x.ops_per_s / y.ops_per_s),
            _ => "-".into(),
        };
        println!(
            "{:<12} {:>7} {:>16} {:>14} {:>18} {:>14} {:>9} {:>9}",
            w,
            v,
            cell(ACCELFS),
            cell(POSIX),
            cell(REDIRECT),
            cell(ROCKSDB),
            ratio(ACCELFS, POSIX),
            ratio(ACCELFS, ROCKSDB)
        );
    }
    println!(
        "peak RSS of this process (LevelDB runs in it): {} MiB",
        r.peak_rss_bytes >> 20
    );
    for n in &r.notes {
        println!("note: {n}");
    }
}
