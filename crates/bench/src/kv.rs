//! `kura bench kv`: the paper's key-value figures. db_bench-style workloads (fillseq,
//! fillrandom, fillsync, overwrite, readrandom, readseq) and YCSB core workloads A–F, each on
//! kura's native store (kura-store on a raw `file:` image), Google LevelDB over AccelFS (direct),
//! LevelDB over its POSIX Env on the host file system, LevelDB over AccelFS through `redirect`,
//! RocksDB and LMDB on the host file system — same keys, value bytes and budgets, same run.
//!
//! Every system gets a fresh database per workload; the load phase is untimed, the run phase is
//! timed per operation (throughput and p50/p99/p99.9 latency). The systems take turns in each of
//! `--rounds` rounds (A B C … A B C …); each figure is the median round with its min–max, and the
//! ratios are taken per round pair ([`crate::stats`]).
//!
//! RocksDB and LMDB run out of process in a C++ replay program (`peers/kv_replay.cc`, built with
//! g++ once per engine and source, kept beside the `kura` binary) that reads the workload as a
//! trace file the bench writes ([`kura_workload::write_workload`]), so every engine replays
//! exactly the same operations; the peer times the run phase itself, and the bench records the
//! process's wall time too. RocksDB is configured as LevelDB is: the same block cache, memtable
//! (write buffer) size, a 10 bits/key bloom filter, no compression; the settings it actually used
//! are read back from the OPTIONS file it writes. LMDB has no cache or memtable of its own; it
//! runs with MDB_NORDAHEAD, and MDB_NOSYNC only where the workload does not sync. Every peer
//! command line is kept in the JSON. The host file system is named by statfs, not assumed.

use crate::output::{plot_help, RunArgs};
use crate::stats::{compare, quotient, Compared, Spread};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_accelfs::{FileSystem, MkfsOptions, MountOptions};
use kura_kv::{Db, DbOptions, Location};
use kura_store::{Store, StoreOptions};
use kura_workload::{Op, Workload};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const PLOT: &str = include_str!("../../../scripts/plot_kvbench.py");

/// Every system, in the order they take turns and fill the table.
const SYSTEMS: [&str; 6] = ["native", "accelfs", "posix", "redirect", "rocksdb", "lmdb"];

#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("plot", |a| plot_help(a, "kv")))]
pub struct KvBenchArgs {
    /// Directory for the images, the ext4 databases, RocksDB and LMDB (a disk file system).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Comma-separated workloads: fillseq, fillrandom, fillsync, overwrite, readrandom,
    /// readseq, ycsb-a … ycsb-f, or `all`.
    #[arg(long, default_value = "all")]
    pub workloads: String,
    /// Comma-separated systems: native (kura-store on a raw file: image), accelfs, posix,
    /// redirect (LevelDB on AccelFS, the host file system, AccelFS through redirect), rocksdb,
    /// lmdb.
    #[arg(long, default_value = "native,accelfs,posix,redirect,rocksdb,lmdb")]
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
    /// Data loaded per workload, replacing --records, --data and --quick's record cap: a size
    /// (`2G`: records = size / value size), or `Nx`, N times the stores' memory budget (block
    /// cache + memtable: --cache + 4 MiB). `--cache 252M --data-size 8x` loads 2 GiB into stores
    /// given 256 MiB, so no engine wins by holding the data set in memory (the host's page cache
    /// still can: say how much memory the host has when quoting such a run).
    #[arg(long)]
    pub data_size: Option<String>,
    /// Block cache of every store that has one (LevelDB and RocksDB alike).
    #[arg(long, default_value = "8M")]
    pub cache: String,
    /// AccelFS buffer cache (ext4 has the whole page cache, which cannot be bounded here).
    #[arg(long, default_value = "256M")]
    pub fs_cache: String,
    /// kura-store's raw image (a written file), in multiples of the data per workload (at
    /// least 256 MiB). Its merges need free segments beside the data, fewer when slots are
    /// short (they then free inputs as they go, and flushes inside merges wait), while the
    /// peers on ext4 have all of its free space.
    #[arg(long, default_value_t = 4.0, value_parser = image_factor)]
    pub native_image: f64,
    /// fillsync writes this many keys (each one synced).
    #[arg(long, default_value_t = 2000)]
    pub sync_records: u64,
    /// Rounds of every (workload, value size), the systems taking turns in each; median and
    /// min-max are reported. Default 5, or 1 with --quick.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// How RocksDB is driven. `cpp` and `auto` both mean the C++ replay program
    /// (peers/kv_replay.cc against librocksdb-dev); `python` (the rocksdict script) was removed
    /// and is refused with a message.
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
    /// Peers only: wall time of the whole peer process (trace parsing, open, load, run, close).
    pub process_seconds: Option<f64>,
}

/// How one store was configured, and how it was run.
#[derive(Debug, Clone, Serialize)]
pub struct StoreSettings {
    pub system: String,
    /// 0: the store has no block cache of its own (LMDB: the host's page cache); kura-store's
    /// page cache gets about this much of its memory budget.
    pub block_cache_bytes: usize,
    pub write_buffer_bytes: usize,
    /// 0: no bloom filter (LMDB, a B+ tree).
    pub bloom_bits_per_key: i32,
    pub compression: bool,
    /// The configuration in words, as the store (or its peer program) states it.
    pub config: String,
    /// The last peer command line, or how the store runs (in this process).
    pub command: String,
    /// Peers: every command line run, one per (workload, value size, round).
    pub commands: Vec<String>,
    /// RocksDB only: the settings its OPTIONS file recorded, as RocksDB wrote them.
    pub options_file: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub rounds: usize,
    /// The file system of `--dir` (statfs): where LevelDB's POSIX Env, RocksDB and LMDB write.
    pub file_system: String,
    pub points: Vec<Point>,
    /// Ratios per (workload, value size), over the rounds' pairs.
    pub ratios: Vec<KvRatio>,
    pub settings: Vec<StoreSettings>,
    pub cache_bytes: usize,
    /// Bytes loaded per workload at the first value size (records × value).
    pub data_bytes: u64,
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

const NATIVE: &str = "kura-store/file";
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

/// LMDB on the host file system `fs`.
fn lmdb_name(fs: &str) -> String {
    format!("LMDB/{fs}")
}

/// The table's label of `system` (one of [`SYSTEMS`]) with the host file system `fs`.
fn label(system: &str, fs: &str) -> String {
    match system {
        "native" => NATIVE.into(),
        "accelfs" => ACCELFS.into(),
        "redirect" => REDIRECT.into(),
        "posix" => posix_name(fs),
        "rocksdb" => rocksdb_name(fs),
        _ => lmdb_name(fs),
    }
}

/// The ratios reported: (short name, numerator, denominator), as labels for the file system `fs`.
fn ratio_pairs(fs: &str) -> [(&'static str, String, String); 4] {
    [
        ("native/rocks", NATIVE.into(), rocksdb_name(fs)),
        ("native/host", NATIVE.into(), posix_name(fs)),
        ("fs/host", ACCELFS.into(), posix_name(fs)),
        ("fs/rocks", ACCELFS.into(), rocksdb_name(fs)),
    ]
}

/// Bits per key of the stores' bloom filters (kura-store's is fixed at the same 10).
const BLOOM_BITS: i32 = 10;

/// The RocksDB settings worth recording from its OPTIONS file.
pub fn options_of_interest(text: &str) -> Vec<String> {
    const KEYS: [&str; 9] = [
        "rocksdb_version",
        "write_buffer_size",
        "max_subcompactions",
        "max_background_jobs",
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

fn image_factor(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(k) if (2.0..=64.0).contains(&k) => Ok(k),
        _ => Err(format!(
            "{text:?}: give a multiple of the data from 2 to 64 (the store needs room to merge)"
        )),
    }
}

fn size_arg(s: &str) -> anyhow::Result<u64> {
    kura_engine::spec::parse_size(s).map_err(anyhow::Error::msg)
}

/// `--data-size`: a size, or `Nx` times `budget`.
fn data_size(text: &str, budget: u64) -> anyhow::Result<u64> {
    match text.trim().strip_suffix(['x', 'X']) {
        Some(n) => {
            let k: f64 = n
                .parse()
                .ok()
                .filter(|k: &f64| k.is_finite() && *k > 0.0)
                .with_context(|| format!("--data-size {text:?}: expected a size or Nx (8x)"))?;
            Ok((budget as f64 * k) as u64)
        }
        None => size_arg(text).with_context(|| format!("--data-size {text:?}")),
    }
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

/// Runs one phase against an in-process store; returns per-op latencies (µs) and scanned
/// entries.
fn run_phase(
    db: &impl Kv,
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
                db.put(op.key().as_bytes(), v, sync)?;
            }
            Op::Read { .. } => db.get(op.key().as_bytes())?,
            Op::Scan { count, .. } => entries += db.scan(op.key().as_bytes(), *count as usize)?,
            Op::ReadModifyWrite { .. } => {
                db.get(op.key().as_bytes())?;
                let v = w.value(&op).context("value outside the pool")?;
                db.put(op.key().as_bytes(), v, sync)?;
            }
            Op::Delete { .. } => db.delete(op.key().as_bytes(), sync)?,
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
        process_seconds: None,
    }
}

/// The settings of every store, LevelDB's and RocksDB's alike (kura-store takes the memtable):
/// the block cache asked for, LevelDB's default memtable, a [`BLOOM_BITS`] bloom filter, and no compression (so both move
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

/// What the timed loop needs of a store, so every in-process store runs the same loop.
trait Kv {
    fn put(&self, key: &[u8], value: &[u8], sync: bool) -> anyhow::Result<()>;
    fn get(&self, key: &[u8]) -> anyhow::Result<()>;
    /// Up to `count` entries from `from` on; returns how many there were.
    fn scan(&self, from: &[u8], count: usize) -> anyhow::Result<u64>;
    fn delete(&self, key: &[u8], sync: bool) -> anyhow::Result<()>;
}

impl Kv for Db {
    fn put(&self, key: &[u8], value: &[u8], sync: bool) -> anyhow::Result<()> {
        if sync {
            Db::put_sync(self, key, value)?;
        } else {
            Db::put(self, key, value)?;
        }
        Ok(())
    }
    fn get(&self, key: &[u8]) -> anyhow::Result<()> {
        Db::get(self, key)?;
        Ok(())
    }
    fn scan(&self, from: &[u8], count: usize) -> anyhow::Result<u64> {
        Ok(Db::scan(self, from, None, count)?.len() as u64)
    }
    fn delete(&self, key: &[u8], sync: bool) -> anyhow::Result<()> {
        let mut batch = kura_kv::WriteBatch::new();
        batch.delete(key);
        Db::write(self, batch, sync)?;
        Ok(())
    }
}

impl Kv for Store {
    fn put(&self, key: &[u8], value: &[u8], sync: bool) -> anyhow::Result<()> {
        Store::put(self, key, value, sync)?;
        Ok(())
    }
    fn get(&self, key: &[u8]) -> anyhow::Result<()> {
        Store::get(self, key)?;
        Ok(())
    }
    fn scan(&self, from: &[u8], count: usize) -> anyhow::Result<u64> {
        // Each pair is seen and dropped, as the peers' iterators do: a full scan gathers no
        // copy of the store in memory.
        Ok(Store::scan_each(self, Some(from), None, count, false, |_, _| true)? as u64)
    }
    fn delete(&self, key: &[u8], sync: bool) -> anyhow::Result<()> {
        Store::delete(self, key, sync)?;
        Ok(())
    }
}

/// kura-store's settings: LevelDB's memtable size as its write buffer, and one memory budget
/// of what LevelDB may hold (the block cache and two memtables: the active one and the one
/// being flushed), so its page cache of run pages gets about the block cache's size; the rest
/// are its defaults (its bloom filters are [`BLOOM_BITS`] too). Its merges run on
/// [`merge_threads`] threads, as RocksDB's compactions get as many subcompactions.
fn store_options(opts: &DbOptions) -> StoreOptions {
    StoreOptions {
        memtable_bytes: opts.write_buffer_bytes,
        memory_budget: opts.block_cache_bytes + 2 * opts.write_buffer_bytes,
        merge_threads: merge_threads(),
        ..StoreOptions::default()
    }
}

/// Threads one merge of kura-store, and one compaction of RocksDB (`max_subcompactions`), may
/// use: the host's cores, up to [`kura_store::MAX_MERGE_PARTS`].
fn merge_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, kura_store::MAX_MERGE_PARTS)
}

/// kura-store, formatted afresh on the raw image file `image` (the whole file, no file system).
fn run_native(
    image: &Path,
    w: &Workload,
    value: usize,
    opts: &StoreOptions,
) -> anyhow::Result<Point> {
    // Buffered, as every peer's files are: all of them then read through the same host page
    // cache, and the figures compare the engines rather than O_DIRECT against cached reads.
    let dev = kura_engine::open(&format!("file:{}?direct=0", image.display()))?;
    let store = Store::create(dev, opts).context("kura-store: create")?;
    run_phase(&store, w, w.load(), false)?;
    let t = Instant::now();
    let (lat, entries) = run_phase(&store, w, w.run(), true)?;
    let secs = t.elapsed().as_secs_f64();
    store.close()?;
    Ok(point(NATIVE, w, value, lat, entries, secs))
}

/// An engine the C++ replay program drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEngine {
    RocksDb,
    Lmdb,
}

impl PeerEngine {
    fn name(self) -> &'static str {
        match self {
            PeerEngine::RocksDb => "rocksdb",
            PeerEngine::Lmdb => "lmdb",
        }
    }

    /// g++'s arguments that select and link the engine.
    fn flags(self) -> [&'static str; 2] {
        match self {
            PeerEngine::RocksDb => ["-DKV_ROCKSDB", "-lrocksdb"],
            PeerEngine::Lmdb => ["-DKV_LMDB", "-llmdb"],
        }
    }

    fn package(self) -> &'static str {
        match self {
            PeerEngine::RocksDb => "librocksdb-dev",
            PeerEngine::Lmdb => "liblmdb-dev",
        }
    }
}

/// The C++ replay program's source.
pub const PEER_CC: &str = include_str!("../peers/kv_replay.cc");

/// Where built peers are kept: beside the running binary (`target/release/kura-peers`), or
/// the temp dir where that cannot be written.
fn peer_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("kura-peers")))
        .filter(|d| std::fs::create_dir_all(d).is_ok())
        .unwrap_or_else(std::env::temp_dir)
}

/// Builds the replay program for `engine` with g++ (once per source: the binary's name carries
/// the source's CRC32C, so an edited source is rebuilt), or says why it cannot be built.
pub fn build_peer(engine: PeerEngine) -> Result<PathBuf, String> {
    let dir = peer_dir();
    let cache = dir.join(format!(
        "kv-replay-{}-{:08x}",
        engine.name(),
        crc32c::crc32c(PEER_CC.as_bytes())
    ));
    if cache.is_file() {
        return Ok(cache);
    }
    let work = tempfile::tempdir_in(&dir).map_err(|e| format!("temp dir: {e}"))?;
    let src = work.path().join("kv_replay.cc");
    std::fs::write(&src, PEER_CC).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let bin = work.path().join("kv_replay");
    let [define, lib] = engine.flags();
    let out = Command::new("g++")
        .args(["-O2", "-std=c++17", define, "-o"])
        .arg(&bin)
        .arg(&src)
        .arg(lib)
        .output()
        .map_err(|e| {
            format!(
                "g++ is not available ({e}); apt-get install g++ {}",
                engine.package()
            )
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "g++ could not build the {} peer (apt-get install {}): {}",
            engine.name(),
            engine.package(),
            err.lines()
                .find(|l| l.contains("error"))
                .unwrap_or("failed")
        ));
    }
    // Another run may have built it meanwhile: a rename over it is as good.
    std::fs::rename(&bin, &cache).map_err(|e| format!("keeping {}: {e}", cache.display()))?;
    Ok(cache)
}

/// The replay program's arguments for `engine`: RocksDB gets LevelDB's block cache, memtable
/// and bloom filter; LMDB its map size.
pub fn peer_args(
    engine: PeerEngine,
    trace: &Path,
    db: &Path,
    opts: &DbOptions,
    map_bytes: u64,
) -> Vec<String> {
    let mut args = vec![
        "--trace".into(),
        trace.display().to_string(),
        "--db".into(),
        db.display().to_string(),
    ];
    match engine {
        PeerEngine::RocksDb => args.extend([
            "--cache-bytes".into(),
            opts.block_cache_bytes.to_string(),
            "--write-buffer-bytes".into(),
            opts.write_buffer_bytes.to_string(),
            "--bloom-bits".into(),
            opts.bloom_bits.to_string(),
            "--subcompactions".into(),
            merge_threads().to_string(),
        ]),
        PeerEngine::Lmdb => args.extend(["--map-bytes".into(), map_bytes.to_string()]),
    }
    args
}

/// One run of a peer process.
struct PeerRun {
    point: Point,
    command: String,
    /// The configuration the peer printed.
    config: String,
    /// RocksDB's OPTIONS file lines of interest.
    options_file: Vec<String>,
}

/// Runs the replay program `bin` for `engine` on `trace` (the workload `w`), in a fresh
/// database under `dir`.
#[allow(clippy::too_many_arguments)]
fn run_peer(
    dir: &Path,
    engine: PeerEngine,
    bin: &Path,
    system: &str,
    trace: &Path,
    w: &Workload,
    value: usize,
    opts: &DbOptions,
    map_bytes: u64,
) -> anyhow::Result<PeerRun> {
    let db = dir.join(format!("{}-{}-{value}", engine.name(), w.name()));
    let args = peer_args(engine, trace, &db, opts, map_bytes);
    let command = format!("{} {}", bin.display(), args.join(" "));
    let started = Instant::now();
    let out = Command::new(bin)
        .args(&args)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let process_seconds = started.elapsed().as_secs_f64();
    let options_file = std::fs::read_dir(&db)
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
    if !out.status.success() {
        bail!(
            "{system} peer ({command}): {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("failed")
        );
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).with_context(|| format!("{system} peer output"))?;
    let num = |k: &str| v.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    let entries = v
        .get("entries")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    let point = Point {
        system: system.into(),
        workload: w.name().to_string(),
        value_bytes: value,
        records: w.loaded_records(),
        ops: num("ops") as u64,
        entries,
        seconds: num("seconds"),
        ops_per_s: num("ops_per_s"),
        p50_us: num("p50_us"),
        p99_us: num("p99_us"),
        p999_us: num("p999_us"),
        ops_per_s_range: Spread::of(&[num("ops_per_s")]),
        process_seconds: Some(process_seconds),
    };
    let config = v
        .get("config")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(PeerRun {
        point,
        command,
        config,
        options_file,
    })
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

/// The workloads of `--workloads` (`all`: the db_bench ones this bench runs, then YCSB A–F).
fn workload_names(asked: &str) -> Vec<String> {
    if asked != "all" {
        return asked.split(',').map(|s| s.trim().to_lowercase()).collect();
    }
    let db_bench = [
        "fillseq",
        "fillrandom",
        "fillsync",
        "overwrite",
        "readrandom",
        "readseq",
    ];
    kura_workload::DB_BENCH_WORKLOADS
        .iter()
        .filter(|n| db_bench.contains(n))
        .map(|s| s.to_string())
        .chain(
            kura_workload::YCSB_WORKLOADS
                .iter()
                .map(|c| format!("ycsb-{}", c.to_ascii_lowercase())),
        )
        .collect()
}

/// What the peers of one system did over the whole run.
#[derive(Default, Clone)]
struct PeerLog {
    commands: Vec<String>,
    config: String,
    options_file: Vec<String>,
}

pub fn run(args: &KvBenchArgs) -> anyhow::Result<()> {
    let mut names = workload_names(&args.workloads);
    let mut systems: Vec<String> = args
        .systems
        .split(',')
        .map(|s| s.trim().to_lowercase())
        .collect();
    for s in &systems {
        if !SYSTEMS.contains(&s.as_str()) {
            bail!("unknown system {s:?}: {}", SYSTEMS.join(", "));
        }
    }
    if args.rocksdb_peer == "python" {
        bail!("--rocksdb-peer python: the Python RocksDB peer was removed; RocksDB now runs in the C++ replay program (--rocksdb-peer cpp, the default)");
    }
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
    let cache = size_arg(&args.cache)? as usize;
    let opts = db_options(cache);
    let sopts = store_options(&opts);
    let budget = cache as u64 + opts.write_buffer_bytes as u64;
    let fixed_data = args
        .data_size
        .as_deref()
        .map(|t| data_size(t, budget))
        .transpose()?;
    let data = size_arg(&args.data)?;
    let sizes: Vec<usize> = args
        .value_sizes
        .split(',')
        .map(|s| size_arg(s.trim()).map(|v| v as usize))
        .collect::<anyhow::Result<_>>()?;
    if sizes.contains(&0) {
        bail!("--value-sizes: a value size must be at least 1 byte");
    }
    let records_for = |value: usize| match fixed_data {
        Some(d) => (d / value as u64).max(100),
        None => records.min((data / value as u64).max(100)),
    };
    let most_data = sizes
        .iter()
        .map(|&v| records_for(v) * v as u64)
        .max()
        .unwrap_or(0);
    let mut notes = Vec::new();
    let mut peers: Vec<(String, PeerEngine, PathBuf)> = Vec::new();
    for (system, engine) in [("rocksdb", PeerEngine::RocksDb), ("lmdb", PeerEngine::Lmdb)] {
        if !systems.iter().any(|s| s == system) {
            continue;
        }
        match build_peer(engine) {
            Ok(bin) => peers.push((system.to_string(), engine, bin)),
            Err(why) => {
                notes.push(format!("{system} skipped: {why}"));
                systems.retain(|s| s != system);
            }
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("kura-bench-kv")
        .tempdir_in(&args.dir)
        .with_context(|| format!("work directory in {}", args.dir.display()))?;
    let image_bytes = (most_data * 3).max(256 << 20);
    // LMDB's map is address space, not memory: room for the data, its B+ tree and free pages.
    let map_bytes = (most_data * 4).max(1 << 30);
    let fs_cache = size_arg(&args.fs_cache)?;
    let mounted = |system: &str, kind: &str| -> anyhow::Result<Option<FileSystem>> {
        if !systems.iter().any(|s| s == system) {
            return Ok(None);
        }
        let img = dir.path().join(format!("{system}.img"));
        accelfs(&img, image_bytes, kind, fs_cache).map(Some)
    };
    let fs = mounted("accelfs", "uring")?;
    let rfs = mounted("redirect", "redirect")?;
    let native_image = dir.path().join("native.img");
    // kura-store's runs take whole segments; merges free inputs as they go only when slots are
    // short, and below 240 MiB 96 MiB written twice fills the image (`examples/writepath`).
    let native_image_bytes = ((most_data as f64 * args.native_image) as u64).max(256 << 20);
    if systems.iter().any(|s| s == "native") {
        crate::fs::write_host_file(&native_image, native_image_bytes)?;
    }
    let rounds = crate::stats::rounds(args.rounds, args.run.quick, 1);
    let file_system = crate::stats::fs_name(&args.dir);
    let posix = posix_name(&file_system);
    let total = (names.len() * sizes.len() * systems.len() * rounds) as u64;
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let mut points = Vec::new();
    let mut ratios = Vec::new();
    let mut logs: Vec<PeerLog> = vec![PeerLog::default(); systems.len()];
    for &value in &sizes {
        let recs = records_for(value);
        for name in &names {
            let w = workload(name, recs, ops, value, sync_records)?;
            let trace = dir.path().join(format!("{name}-{value}.trace"));
            if !peers.is_empty() {
                kura_workload::write_workload(std::fs::File::create(&trace)?, &w)?;
            }
            let mut by_system: Vec<Vec<Point>> = vec![Vec::new(); systems.len()];
            for round in 0..rounds {
                for (i, system) in systems.iter().enumerate() {
                    bar.set_message(format!("{name} {value} B on {system}, round {}", round + 1));
                    let path = format!("/db-{name}-{value}-{i}");
                    let p = match system.as_str() {
                        "native" => run_native(&native_image, &w, value, &sopts)?,
                        "accelfs" | "redirect" => {
                            let (label, fs) = if system == "accelfs" {
                                (ACCELFS, fs.clone().context("AccelFS not prepared")?)
                            } else {
                                (REDIRECT, rfs.clone().context("redirect not prepared")?)
                            };
                            let store = Location::AccelFs {
                                fs: fs.clone(),
                                path: path.clone(),
                            };
                            let p = run_leveldb(label, store, &w, value, &opts)?;
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
                            let (_, engine, bin) = peers
                                .iter()
                                .find(|(s, _, _)| s == system)
                                .context("peer not built")?;
                            let r = run_peer(
                                dir.path(),
                                *engine,
                                bin,
                                &label(system, &file_system),
                                &trace,
                                &w,
                                value,
                                &opts,
                                map_bytes,
                            )?;
                            logs[i].commands.push(r.command);
                            logs[i].config = r.config;
                            logs[i].options_file = r.options_file;
                            r.point
                        }
                    };
                    by_system[i].push(p);
                    bar.inc(1);
                }
            }
            let _ = std::fs::remove_file(&trace);
            let rate = |v: &[Point]| v.iter().map(|p| p.ops_per_s).collect::<Vec<f64>>();
            let find = |label: &str| {
                by_system
                    .iter()
                    .find(|v| v.first().is_some_and(|p| p.system == label))
            };
            for (what, num, den) in ratio_pairs(&file_system) {
                if let (Some(k), Some(p)) = (find(&num), find(&den)) {
                    ratios.push(KvRatio {
                        what: format!("{num} / {den} ({what})"),
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
    let leveldb = |system: &str| {
        StoreSettings {
        system: system.to_string(),
        block_cache_bytes: opts.block_cache_bytes,
        write_buffer_bytes: opts.write_buffer_bytes,
        bloom_bits_per_key: opts.bloom_bits,
        compression: opts.compression,
        config: format!(
            "Google LevelDB: block cache {} B (LRU), write buffer {} B, bloom {} bits/key, no compression, sync {}",
            opts.block_cache_bytes,
            opts.write_buffer_bytes,
            opts.bloom_bits,
            "as the workload asks (fillsync: every write)"
        ),
        command: "Google LevelDB in this process (kura_kv::Db)".into(),
        commands: Vec::new(),
        options_file: Vec::new(),
    }
    };
    let settings: Vec<StoreSettings> = systems
        .iter()
        .zip(logs)
        .map(|(system, log)| {
            let name = label(system, &file_system);
            match system.as_str() {
                "native" => StoreSettings {
                    block_cache_bytes: opts.block_cache_bytes,
                    write_buffer_bytes: sopts.memtable_bytes,
                    config: format!(
                        "kura-store: memory budget {} B (memtable {} B and the one being flushed, a page cache of run pages, bloom filters), bloom {BLOOM_BITS} bits/key (built in), no compression, segments of {} B, commit groups up to {} B, flush and compaction on a background thread, each merge on up to {} threads (RocksDB gets as many subcompactions), sync as the workload asks",
                        sopts.memory_budget,
                        sopts.memtable_bytes,
                        1u64 << sopts.segment_shift,
                        sopts.max_group_bytes,
                        sopts.merge_threads
                    ),
                    command: format!(
                        "kura-store in this process (kura_store::Store on file:{}?direct=0, {native_image_bytes} B, buffered like the peers' files)",
                        native_image.display()
                    ),
                    ..leveldb(&name)
                },
                "rocksdb" | "lmdb" => {
                    let lmdb = system == "lmdb";
                    StoreSettings {
                        block_cache_bytes: if lmdb { 0 } else { opts.block_cache_bytes },
                        write_buffer_bytes: if lmdb { 0 } else { opts.write_buffer_bytes },
                        bloom_bits_per_key: if lmdb { 0 } else { opts.bloom_bits },
                        config: log.config,
                        command: log.commands.last().cloned().unwrap_or_default(),
                        commands: log.commands,
                        options_file: log.options_file,
                        ..leveldb(&name)
                    }
                }
                _ => leveldb(&name),
            }
        })
        .collect();
    notes.push(format!(
        "memory budget of the stores: block cache {cache} B + memtable {} B; AccelFS buffer cache {fs_cache} B; {file_system} (LevelDB/POSIX, RocksDB, LMDB) and the native store's buffered file: image have the host's page cache, which is not bounded",
        opts.write_buffer_bytes
    ));
    notes.push(format!(
        "data per workload: up to {most_data} B ({})",
        match &args.data_size {
            Some(t) => format!("--data-size {t}"),
            None => "--records, capped by --data".into(),
        }
    ));
    if !peers.is_empty() {
        notes.push("RocksDB and LMDB run in a C++ replay program of the same trace (its own process: the figures are its timed run phase; process_seconds is the process's wall time)".into());
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
        data_bytes: most_data,
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
    let find = |s: &str, w: &str, v: usize| {
        r.points
            .iter()
            .find(|p| p.system == s && p.workload == w && p.value_bytes == v)
    };
    let ratio = |what: &str, w: &str, v: usize| {
        r.ratios
            .iter()
            .find(|x| {
                x.workload == w && x.value_bytes == v && x.what.ends_with(&format!("({what})"))
            })
            .map(|x| x.compared.ratio.show(2))
    };
    let mut keys: Vec<(usize, String)> = Vec::new();
    for p in &r.points {
        if !keys.contains(&(p.value_bytes, p.workload.clone())) {
            keys.push((p.value_bytes, p.workload.clone()));
        }
    }
    let systems: Vec<&str> = r.settings.iter().map(|s| s.system.as_str()).collect();
    let shown: Vec<&str> = ratio_pairs(&r.file_system)
        .iter()
        .map(|(what, _, _)| *what)
        .filter(|what| {
            r.ratios
                .iter()
                .any(|x| x.what.ends_with(&format!("({what})")))
        })
        .collect();
    println!(
        "throughput, ops/s (entries/s for scans), median [min–max] of {} round(s); ratios per round pair; p99 µs in the JSON",
        r.rounds
    );
    let mut head = format!("{:<12} {:>7}", "workload", "value");
    for s in &systems {
        head.push_str(&format!(" {s:>24}"));
    }
    for what in &shown {
        head.push_str(&format!(" {what:>18}"));
    }
    println!("{head}");
    for (v, w) in keys {
        let mut line = format!("{w:<12} {v:>7}");
        for s in &systems {
            let cell = find(s, &w, v).map_or("-".into(), |p| p.ops_per_s_range.show(0));
            line.push_str(&format!(" {cell:>24}"));
        }
        for what in &shown {
            let cell = ratio(what, &w, v).unwrap_or_else(|| "-".into());
            line.push_str(&format!(" {cell:>18}"));
        }
        println!("{line}");
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
        println!("    {}", st.config);
        if !st.options_file.is_empty() {
            println!("    RocksDB's OPTIONS file: {}", st.options_file.join("; "));
        }
        println!("    {}", st.command);
    }
    println!(
        "peak RSS of this process (LevelDB and kura-store run in it): {} MiB",
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
        let (t, d) = (Path::new("/w/t.trace"), Path::new("/w/db"));
        let rocks = peer_args(PeerEngine::RocksDb, t, d, &opts, 1 << 30).join(" ");
        assert_eq!(
            rocks,
            format!(
                "--trace /w/t.trace --db /w/db --cache-bytes {} --write-buffer-bytes {} --bloom-bits {BLOOM_BITS} --subcompactions {}",
                8 << 20,
                opts.write_buffer_bytes,
                merge_threads()
            )
        );
        let lmdb = peer_args(PeerEngine::Lmdb, t, d, &opts, 1 << 30).join(" ");
        assert_eq!(lmdb, "--trace /w/t.trace --db /w/db --map-bytes 1073741824");
        assert_eq!(store_options(&opts).memtable_bytes, opts.write_buffer_bytes);
        assert_eq!(store_options(&opts).merge_threads, merge_threads());
        assert_eq!(
            store_options(&opts).memory_budget,
            opts.block_cache_bytes + 2 * opts.write_buffer_bytes
        );
        assert!(PEER_CC.contains("NewBloomFilterPolicy(a.bloom, false)"));
        assert!(PEER_CC.contains("rocksdb::kNoCompression"));
        assert!(PEER_CC.contains("MDB_NORDAHEAD | (sync ? 0 : MDB_NOSYNC)"));
    }

    #[test]
    fn the_native_image_is_a_multiple_of_the_data_with_room_to_merge() {
        assert_eq!(image_factor("4").unwrap(), 4.0);
        assert_eq!(image_factor("8.5").unwrap(), 8.5);
        for bad in ["1", "1.9", "65", "-4", "nan", "x", ""] {
            assert!(image_factor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn data_size_is_a_size_or_a_multiple_of_the_budget() {
        assert_eq!(data_size("2G", 1).unwrap(), 2 << 30);
        assert_eq!(data_size("8x", 256 << 20).unwrap(), 2 << 30);
        assert_eq!(data_size("1.5X", 100).unwrap(), 150);
        for bad in ["x", "-1x", "0x", "nanx", "many"] {
            assert!(data_size(bad, 1 << 20).is_err(), "{bad}");
        }
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
        assert_eq!(label("lmdb", "xfs"), "LMDB/xfs");
        assert_eq!(label("native", "xfs"), NATIVE);
    }

    #[test]
    fn the_native_store_runs_a_workload_on_a_raw_image() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("n.img");
        crate::fs::write_host_file(&img, 64 << 20).unwrap();
        let w = workload("ycsb-e", 300, 50, 100, 10).unwrap();
        let opts = store_options(&db_options(1 << 20));
        let p = run_native(&img, &w, 100, &opts).unwrap();
        assert_eq!(p.system, NATIVE);
        assert_eq!(p.ops, 50);
        assert!(p.entries > 0, "scans found entries");
        assert!(p.ops_per_s > 0.0);
    }
}
