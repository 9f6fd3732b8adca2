//! `kura bench kv`: the paper's key-value figures. db_bench-style workloads (fillseq,
//! fillrandom, fillsync, overwrite, readrandom, readseq) and YCSB core workloads A–F, each on
//! Google LevelDB over AccelFS (direct), LevelDB over its POSIX Env on ext4, LevelDB over AccelFS
//! through `redirect`, and RocksDB on ext4 (through `rocksdict`, replaying the exact same
//! operation trace) — same keys, value sizes and block-cache budget, same run.
//!
//! Every system gets a fresh database per workload; the load phase is untimed, the run phase is
//! timed per operation (throughput and p50/p99/p99.9 latency). The systems take turns in each of
//! `--rounds` rounds (A B A B); each figure is the median round with its min–max, and the ratios
//! are taken per round pair ([`crate::stats`]).
//!
//! RocksDB is configured as LevelDB is: the same block cache, the same memtable (write buffer)
//! size, a 10 bits/key bloom filter, no compression. The Python peer script takes the memtable
//! size; the bloom filter is set by a small wrapper that runs it ([`ROCKSDB_EQUAL`]). Where g++
//! and librocksdb-dev are installed, RocksDB is instead driven by a C++ replay program
//! (`cpp/rocksdb_peer.cc`, compiled at run time and cached), in process as LevelDB is. The
//! settings RocksDB actually used are read back from the OPTIONS file it writes, and kept in the
//! JSON with the exact command line. The host file system is named by statfs, not assumed.

use crate::output::{plot_help, RunArgs};
use crate::stats::{compare, quotient, Compared, Spread};
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
    /// Rounds of every (workload, value size), the systems taking turns in each; median and
    /// min-max are reported. Default 5, or 1 with --quick.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// How RocksDB is driven: `cpp` (a C++ replay program compiled with g++ against
    /// librocksdb-dev, in process like LevelDB), `python` (rocksdict), or `auto` (cpp where it
    /// builds, else python).
    #[arg(long, default_value = "auto", value_parser = ["auto", "cpp", "python"])]
    pub rocksdb_peer: String,
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
    /// Throughput over the rounds (the other figures are the median round's).
    pub ops_per_s_range: Spread,
}

/// How one store was configured, and how it was run.
#[derive(Debug, Clone, Serialize)]
pub struct StoreSettings {
    pub system: String,
    pub block_cache_bytes: usize,
    pub write_buffer_bytes: usize,
    pub bloom_bits_per_key: i32,
    pub compression: bool,
    /// The peer's command line (RocksDB), or how it runs (LevelDB in this process).
    pub command: String,
    /// RocksDB only: the settings its OPTIONS file recorded, as RocksDB wrote them.
    pub options_file: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub rounds: usize,
    /// The file system of `--dir` (statfs): where LevelDB's POSIX Env and RocksDB write.
    pub file_system: String,
    pub points: Vec<Point>,
    /// Ratios per (workload, value size), over the rounds' pairs.
    pub ratios: Vec<KvRatio>,
    pub settings: Vec<StoreSettings>,
    pub cache_bytes: usize,
    pub peak_rss_bytes: u64,
    pub notes: Vec<String>,
}

/// One ratio of throughputs for a (workload, value size).
#[derive(Debug, Clone, Serialize)]
pub struct KvRatio {
    pub what: String,
    pub workload: String,
    pub value_bytes: usize,
    pub compared: Compared,
}

const ACCELFS: &str = "LevelDB/AccelFS";
const REDIRECT: &str = "LevelDB/AccelFS/redirect";

/// LevelDB's POSIX Env on the host file system `fs`.
fn posix_name(fs: &str) -> String {
    format!("LevelDB/{fs}")
}

/// RocksDB on the host file system `fs`.
fn rocksdb_name(fs: &str) -> String {
    format!("RocksDB/{fs}")
}

/// Bits per key of both stores' bloom filters.
const BLOOM_BITS: i32 = 10;

/// Runs the RocksDB peer script (its path first in argv) with every `BlockBasedOptions` given a
/// bloom filter of the bits per key in `KURA_BLOOM_BITS`, as LevelDB's is.
pub const ROCKSDB_EQUAL: &str = r#"import os, runpy, sys
import rocksdict
_plain = rocksdict.BlockBasedOptions
_bits = float(os.environ["KURA_BLOOM_BITS"])
def _with_bloom():
    t = _plain()
    t.set_bloom_filter(_bits, False)
    return t
rocksdict.BlockBasedOptions = _with_bloom
peer = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(peer, run_name="__main__")
"#;

/// The RocksDB settings worth recording from its OPTIONS file.
pub fn options_of_interest(text: &str) -> Vec<String> {
    const KEYS: [&str; 7] = [
        "rocksdb_version",
        "write_buffer_size",
        "filter_policy",
        "compression",
        "bottommost_compression",
        "block_cache",
        "block_size",
    ];
    text.lines()
        .map(str::trim)
        .filter(|l| {
            l.split_once('=')
                .is_some_and(|(k, _)| KEYS.contains(&k.trim()))
        })
        .map(str::to_string)
        .collect()
}

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
        ops_per_s_range: Spread::of(&[counted as f64 / secs.max(1e-9)]),
    }
}

/// The settings of every store, LevelDB's and RocksDB's alike: the block cache asked for,
/// LevelDB's default memtable, a [`BLOOM_BITS`] bloom filter, and no compression (so both move
/// the same bytes).
fn db_options(cache: usize) -> DbOptions {
    DbOptions {
        block_cache_bytes: cache,
        compression: false,
        bloom_bits: BLOOM_BITS,
        ..DbOptions::default()
    }
}

fn run_leveldb(
    system: &str,
    store: Location,
    w: &Workload,
    value: usize,
    opts: &DbOptions,
) -> anyhow::Result<Point> {
    let db = Db::open(store, opts).with_context(|| format!("{system}: open"))?;
    run_phase(&db, w, w.load(), false)?;
    let t = Instant::now();
    let (lat, entries) = run_phase(&db, w, w.run(), true)?;
    let secs = t.elapsed().as_secs_f64();
    db.close()?;
    Ok(point(system, w, value, lat, entries, secs))
}

/// How the RocksDB peer runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RocksPeer {
    /// The C++ replay program (`cpp/rocksdb_peer.cc`), built at this path.
    Cpp(PathBuf),
    /// The Python script through rocksdict, with the bloom-filter wrapper.
    Python,
}

/// The C++ replay program's source.
pub const PEER_CC: &str = include_str!("../cpp/rocksdb_peer.cc");

/// Builds the C++ peer with g++ against librocksdb (once per source: the binary is kept in the
/// temp dir under a name with the source's CRC32C), or says why it cannot be built.
pub fn build_cpp_peer() -> Result<PathBuf, String> {
    let cache = std::env::temp_dir().join(format!(
        "kura-rocksdb-peer-{:08x}",
        crc32c::crc32c(PEER_CC.as_bytes())
    ));
    if cache.is_file() {
        return Ok(cache);
    }
    let work = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let src = work.path().join("rocksdb_peer.cc");
    std::fs::write(&src, PEER_CC).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let bin = work.path().join("rocksdb_peer");
    let out = Command::new("g++")
        .args(["-O2", "-std=c++17", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-lrocksdb")
        .output()
        .map_err(|e| format!("g++ is not available ({e}); apt-get install g++ librocksdb-dev"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "g++ could not build the RocksDB peer (apt-get install librocksdb-dev): {}",
            err.lines()
                .find(|l| l.contains("error"))
                .unwrap_or("failed")
        ));
    }
    // Another run may have built it meanwhile: a rename over it is as good.
    std::fs::rename(&bin, &cache)
        .or_else(|_| std::fs::copy(&bin, &cache).map(|_| ()))
        .map_err(|e| format!("keeping {}: {e}", cache.display()))?;
    Ok(cache)
}

/// Chooses the RocksDB peer for `--rocksdb-peer` (`auto`, `cpp`, `python`), or says why there
/// is none.
fn choose_peer(choice: &str) -> Result<RocksPeer, String> {
    let python = || match rocksdb_missing() {
        None => Ok(RocksPeer::Python),
        Some(why) => Err(why),
    };
    match choice {
        "cpp" => build_cpp_peer().map(RocksPeer::Cpp),
        "python" => python(),
        _ => build_cpp_peer()
            .map(RocksPeer::Cpp)
            .or_else(|cpp| python().map_err(|py| format!("{cpp}; {py}"))),
    }
}

/// The arguments both RocksDB peers take: the trace, the database directory, and LevelDB's block
/// cache and memtable size.
fn peer_args(trace: &Path, db: &Path, opts: &DbOptions) -> Vec<String> {
    vec![
        "--trace".into(),
        trace.display().to_string(),
        "--db".into(),
        db.display().to_string(),
        "--cache-bytes".into(),
        opts.block_cache_bytes.to_string(),
        "--write-buffer-bytes".into(),
        opts.write_buffer_bytes.to_string(),
    ]
}

/// The C++ peer's arguments: LevelDB's block cache, memtable size and bloom filter.
pub fn cpp_peer_args(trace: &Path, db: &Path, opts: &DbOptions) -> Vec<String> {
    let mut args = peer_args(trace, db, opts);
    args.extend(["--bloom-bits".into(), opts.bloom_bits.to_string()]);
    args
}

/// The RocksDB peer: the same workload as a trace file, replayed with LevelDB's settings by the
/// C++ program or the Python script; returns the point, the command line and RocksDB's
/// recorded options.
fn run_rocksdb(
    dir: &Path,
    peer: &RocksPeer,
    system: &str,
    w: &Workload,
    value: usize,
    opts: &DbOptions,
) -> anyhow::Result<(Point, String, Vec<String>)> {
    let trace = dir.join(format!("{}.trace", w.name()));
    let f = std::fs::File::create(&trace)?;
    kura_workload::write_workload(f, w)?;
    let db = dir.join(format!("rocks-{}-{value}", w.name()));
    let (command, out) = match peer {
        RocksPeer::Cpp(bin) => {
            let args = cpp_peer_args(&trace, &db, opts);
            let command = format!("{} {}", bin.display(), args.join(" "));
            let out = Command::new(bin)
                .args(&args)
                .output()
                .with_context(|| format!("running {}", bin.display()))?;
            (command, out)
        }
        RocksPeer::Python => {
            let script = dir.join("kv_rocksdb_peer.py");
            std::fs::write(&script, PEER)?;
            let equal = dir.join("kv_rocksdb_equal.py");
            std::fs::write(&equal, ROCKSDB_EQUAL)?;
            let args = rocksdb_args(&script, &trace, &db, opts);
            let command = format!(
                "KURA_BLOOM_BITS={} python3 {} {}",
                opts.bloom_bits,
                equal.display(),
                args.join(" ")
            );
            let out = Command::new("python3")
                .arg(&equal)
                .args(&args)
                .env("KURA_BLOOM_BITS", opts.bloom_bits.to_string())
                .output()
                .context("running python3")?;
            (command, out)
        }
    };
    let recorded = std::fs::read_dir(&db)
        .ok()
        .and_then(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("OPTIONS-"))
                .max_by_key(|e| e.file_name())
        })
        .and_then(|e| std::fs::read_to_string(e.path()).ok())
        .map(|t| options_of_interest(&t))
        .unwrap_or_default();
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
    // The C++ peer reports scanned entries at the top, the Python one per operation kind.
    let entries = v
        .get("entries")
        .or_else(|| {
            v.get("by_op")
                .and_then(|b| b.get("scan"))
                .and_then(|s| s.get("entries"))
        })
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    let ops = num("ops") as u64;
    let secs = num("seconds");
    let ops_per_s = if entries > 0 {
        entries as f64 / secs.max(1e-9)
    } else {
        num("ops_per_s")
    };
    let point = Point {
        system: system.into(),
        workload: w.name().to_string(),
        value_bytes: value,
        records: w.loaded_records(),
        ops,
        entries,
        seconds: secs,
        ops_per_s,
        p50_us: num("p50_us"),
        p99_us: num("p99_us"),
        p999_us: num("p999_us"),
        ops_per_s_range: Spread::of(&[ops_per_s]),
    };
    Ok((point, command, recorded))
}

/// The peer script's arguments: LevelDB's block cache and memtable size.
pub fn rocksdb_args(script: &Path, trace: &Path, db: &Path, opts: &DbOptions) -> Vec<String> {
    let mut args = vec![script.display().to_string()];
    args.extend(peer_args(trace, db, opts));
    args
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
    let mut peer = None;
    if systems.iter().any(|s| s == "rocksdb") {
        match choose_peer(&args.rocksdb_peer) {
            Ok(p) => peer = Some(p),
            Err(why) => {
                notes.push(format!("RocksDB skipped: {why}"));
                systems.retain(|s| s != "rocksdb");
            }
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
    let rounds = crate::stats::rounds(args.rounds, args.run.quick, 1);
    let file_system = crate::stats::fs_name(&args.dir);
    let (posix, rocks) = (posix_name(&file_system), rocksdb_name(&file_system));
    let opts = db_options(cache);
    let total = (names.len() * sizes.len() * systems.len() * rounds) as u64;
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let mut points = Vec::new();
    let mut ratios = Vec::new();
    let mut rocks_run: Option<(String, Vec<String>)> = None;
    for &value in &sizes {
        let recs = records.min((data / value as u64).max(100));
        for name in &names {
            let w = workload(name, recs, ops, value, sync_records)?;
            let mut by_system: Vec<Vec<Point>> = vec![Vec::new(); systems.len()];
            for round in 0..rounds {
                for (i, system) in systems.iter().enumerate() {
                    bar.set_message(format!("{name} {value} B on {system}, round {}", round + 1));
                    let path = format!("/db-{name}-{value}-{i}");
                    let p = match system.as_str() {
                        "accelfs" | "redirect" => {
                            let (label, fs) = if system == "accelfs" {
                                (ACCELFS, fs.clone().context("AccelFS not prepared")?)
                            } else {
                                (
                                    REDIRECT,
                                    rfs.clone().context("redirect AccelFS not prepared")?,
                                )
                            };
                            let p = run_leveldb(
                                label,
                                Location::AccelFs {
                                    fs: fs.clone(),
                                    path: path.clone(),
                                },
                                &w,
                                value,
                                &opts,
                            )?;
                            remove_tree(&fs, &path)?;
                            p
                        }
                        "posix" => {
                            let host = dir.path().join(path.trim_start_matches('/'));
                            let p =
                                run_leveldb(&posix, Location::Dir(host.clone()), &w, value, &opts)?;
                            std::fs::remove_dir_all(&host)?;
                            p
                        }
                        _ => {
                            let (p, command, recorded) = run_rocksdb(
                                dir.path(),
                                peer.as_ref().context("no RocksDB peer")?,
                                &rocks,
                                &w,
                                value,
                                &opts,
                            )?;
                            rocks_run = Some((command, recorded));
                            p
                        }
                    };
                    by_system[i].push(p);
                    bar.inc(1);
                }
            }
            let rate = |v: &[Point]| v.iter().map(|p| p.ops_per_s).collect::<Vec<f64>>();
            let find = |label: &str| {
                by_system
                    .iter()
                    .find(|v| v.first().is_some_and(|p| p.system == label))
            };
            for (what, peer) in [("fs/host", &posix), ("fs/rocks", &rocks)] {
                if let (Some(k), Some(p)) = (find(ACCELFS), find(peer)) {
                    ratios.push(KvRatio {
                        what: format!("{ACCELFS} / {peer} ({what})"),
                        workload: w.name().to_string(),
                        value_bytes: value,
                        compared: compare(&rate(k), &rate(p), quotient, None),
                    });
                }
            }
            points.extend(by_system.into_iter().filter_map(median_round));
        }
    }
    bar.finish_and_clear();
    if let Some(fs) = fs {
        fs.unmount()?;
    }
    if let Some(fs) = rfs {
        fs.unmount()?;
    }
    let leveldb = |system: &str| StoreSettings {
        system: system.to_string(),
        block_cache_bytes: opts.block_cache_bytes,
        write_buffer_bytes: opts.write_buffer_bytes,
        bloom_bits_per_key: opts.bloom_bits,
        compression: opts.compression,
        command: "Google LevelDB in this process (kura_kv::Db)".into(),
        options_file: Vec::new(),
    };
    let mut settings: Vec<StoreSettings> = Vec::new();
    for system in &systems {
        settings.push(match system.as_str() {
            "accelfs" => leveldb(ACCELFS),
            "redirect" => leveldb(REDIRECT),
            "posix" => leveldb(&posix),
            _ => {
                let (command, options_file) = rocks_run.clone().unwrap_or_default();
                StoreSettings {
                    command,
                    options_file,
                    ..leveldb(&rocks)
                }
            }
        });
    }
    notes.push(format!(
        "every store: block cache {cache} B, memtable {} B, bloom filter {} bits/key, no compression; AccelFS buffer cache {fs_cache} B; {file_system} has the page cache, which is not bounded",
        opts.write_buffer_bytes, opts.bloom_bits
    ));
    match &peer {
        Some(RocksPeer::Python) => notes.push("RocksDB runs in Python (rocksdict): its latencies include a few µs of interpreter time per call".into()),
        Some(RocksPeer::Cpp(_)) => notes.push(
            "RocksDB runs in a C++ replay program against librocksdb (its version is in the OPTIONS lines), timed as LevelDB is in this process".into(),
        ),
        None => {}
    }
    notes.push(
        "fillsync and readseq/YCSB-E: fillsync syncs every write; scans count entries per second"
            .into(),
    );
    let report = Report {
        rounds,
        file_system,
        points,
        ratios,
        settings,
        cache_bytes: cache,
        peak_rss_bytes: crate::fs::peak_rss(),
        notes,
    };
    print_report(&report);
    args.run.output.emit("kv", PLOT, &report)
}

/// One system's rounds as one point: the round of median throughput, with the spread of all.
fn median_round(mut rounds: Vec<Point>) -> Option<Point> {
    let rates: Vec<f64> = rounds.iter().map(|p| p.ops_per_s).collect();
    rounds.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    let mid = rounds.len().checked_sub(1)? / 2;
    let mut p = rounds.swap_remove(mid);
    p.ops_per_s_range = Spread::of(&rates);
    p.ops_per_s = p.ops_per_s_range.median;
    Some(p)
}

fn remove_tree(fs: &FileSystem, path: &str) -> anyhow::Result<()> {
    for e in fs.read_dir(path)? {
        fs.remove_file(&format!("{path}/{}", e.name_lossy()))?;
    }
    fs.remove_dir(path)?;
    Ok(())
}

fn print_report(r: &Report) {
    let (posix, rocks) = (posix_name(&r.file_system), rocksdb_name(&r.file_system));
    let find = |s: &str, w: &str, v: usize| {
        r.points
            .iter()
            .find(|p| p.system == s && p.workload == w && p.value_bytes == v)
    };
    let ratio = |what: &str, w: &str, v: usize| {
        r.ratios
            .iter()
            .find(|x| x.workload == w && x.value_bytes == v && x.what.ends_with(what))
            .map_or("-".into(), |x| x.compared.ratio.show(2))
    };
    let mut keys: Vec<(usize, String)> = Vec::new();
    for p in &r.points {
        if !keys.contains(&(p.value_bytes, p.workload.clone())) {
            keys.push((p.value_bytes, p.workload.clone()));
        }
    }
    println!(
        "throughput, ops/s (entries/s for scans), median [min–max] of {} round(s); ratios per round pair; p99 µs in the JSON",
        r.rounds
    );
    println!(
        "{:<12} {:>7} {:>22} {:>22} {:>24} {:>22} {:>18} {:>18}",
        "workload", "value", ACCELFS, posix, REDIRECT, rocks, "fs/host", "fs/rocks"
    );
    for (v, w) in keys {
        let cell = |s: &str| find(s, &w, v).map_or("-".into(), |p| p.ops_per_s_range.show(0));
        println!(
            "{:<12} {:>7} {:>22} {:>22} {:>24} {:>22} {:>18} {:>18}",
            w,
            v,
            cell(ACCELFS),
            cell(&posix),
            cell(REDIRECT),
            cell(&rocks),
            ratio("(fs/host)", &w, v),
            ratio("(fs/rocks)", &w, v)
        );
    }
    println!("store settings (side by side):");
    for st in &r.settings {
        println!(
            "  {:<26} block cache {} B, memtable {} B, bloom {} bits/key, compression {}",
            st.system,
            st.block_cache_bytes,
            st.write_buffer_bytes,
            st.bloom_bits_per_key,
            if st.compression { "on" } else { "off" }
        );
        if !st.options_file.is_empty() {
            println!("    RocksDB's OPTIONS file: {}", st.options_file.join("; "));
        }
        println!("    {}", st.command);
    }
    println!(
        "peak RSS of this process (LevelDB runs in it): {} MiB",
        r.peak_rss_bytes >> 20
    );
    for n in &r.notes {
        println!("note: {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rocksdb_gets_leveldbs_cache_memtable_and_bloom_filter() {
        let opts = db_options(8 << 20);
        assert!(!opts.compression, "no compression on either side");
        assert_eq!(opts.bloom_bits, BLOOM_BITS);
        let args = rocksdb_args(
            Path::new("/w/peer.py"),
            Path::new("/w/t.trace"),
            Path::new("/w/db"),
            &opts,
        );
        assert_eq!(
            args.join(" "),
            format!(
                "/w/peer.py --trace /w/t.trace --db /w/db --cache-bytes {} --write-buffer-bytes {}",
                8 << 20,
                opts.write_buffer_bytes
            )
        );
        assert!(ROCKSDB_EQUAL.contains("set_bloom_filter(_bits, False)"));
        let cpp = cpp_peer_args(Path::new("/w/t.trace"), Path::new("/w/db"), &opts).join(" ");
        assert_eq!(
            cpp,
            format!(
                "--trace /w/t.trace --db /w/db --cache-bytes {} --write-buffer-bytes {} --bloom-bits {BLOOM_BITS}",
                8 << 20,
                opts.write_buffer_bytes
            )
        );
        assert!(PEER_CC.contains("NewBloomFilterPolicy(bloom, false)"));
        assert!(PEER_CC.contains("rocksdb::kNoCompression"));
        // The peer script builds its table options by this name, which the wrapper replaces.
        assert!(PEER.contains("table = BlockBasedOptions()"));
        assert!(PEER.contains("--write-buffer-bytes"));
    }

    #[test]
    fn the_options_file_lines_that_matter_are_kept() {
        let text = "[CFOptions \"default\"]\n  write_buffer_size=4194304\n  compression=kNoCompression\n  max_write_buffer_number=2\n[TableOptions/BlockBasedTable \"default\"]\n  filter_policy=bloomfilter:10:false\n  block_size=4096\n";
        assert_eq!(
            options_of_interest(text),
            [
                "write_buffer_size=4194304",
                "compression=kNoCompression",
                "filter_policy=bloomfilter:10:false",
                "block_size=4096"
            ]
        );
    }

    #[test]
    fn a_system_is_its_median_round() {
        let w = workload("fillrandom", 10, 10, 100, 10).unwrap();
        let mk = |rate: f64| point("s", &w, 100, vec![1.0], 0, 1.0 / rate);
        let p = median_round(vec![mk(10.0), mk(30.0), mk(20.0)]).unwrap();
        assert!((p.ops_per_s - 20.0).abs() < 1e-9);
        assert!((p.ops_per_s_range.min - 10.0).abs() < 1e-9);
        assert!((p.ops_per_s_range.max - 30.0).abs() < 1e-9);
        assert!(median_round(Vec::new()).is_none());
        assert_eq!(posix_name("xfs"), "LevelDB/xfs");
    }
}
