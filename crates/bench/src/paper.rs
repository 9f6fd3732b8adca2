//! The numbers the seed papers state (`shared/seeds/`: Hayagui 000, its slides 001, SNAcc 002,
//! DeLiBA 003, LeapIO 004), one entry per number with the figure or table and the passage it is
//! stated in, and for each the kura figure `kura bench all` sets beside it ([`Kura`], computed
//! from the benchmarks' JSON by [`kura_value`]) labelled measured or modeled — or why kura has
//! none. Where a paper only plots a figure, the entry gives the number its text states about
//! the plot; a section whose paper states no number has a [`NOTES`] line saying so.
//!
//! The papers ran on other hardware (an NEC SX-Aurora vector engine, Ceph over 10 GbE, FPGAs),
//! so the numbers to compare are the relative ones (percent lower, ratios), not absolute rates.

use serde_json::Value;
use std::collections::BTreeMap;

/// A section of the report: one seed figure (or group of figures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Hayagui Fig. 2 (device I/O, redirected against the host).
    Io,
    /// Hayagui Fig. 5 (direct I/O engine and AccelFS against redirect).
    Fs,
    /// Hayagui Fig. 6 and 7 (LevelDB db_bench and YCSB).
    Kv,
    /// The slides' YCSB value-size sweep.
    Sweep,
    /// Hayagui Fig. 8 and Table 2 (genome matching).
    Genome,
    /// The slides' CRC32C microbenchmark.
    Crc,
    /// LeapIO Fig. 6 and 11 (per-layer overhead, prioritisation).
    Layers,
    /// DeLiBA (NBD export, cache, coalescing).
    Nbd,
    /// SNAcc Fig. 4 (streaming ingest).
    Ingest,
}

/// How kura's figure beside a paper's number is found in the benchmarks' JSON.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kura {
    /// io.json: how much lower uring's mean QD1 latency of `op` is than the redirect path's
    /// (the modeled Aurora link's when `modeled`), over the sizes measured. For one request at
    /// a time this is also how much lower redirect's throughput is.
    DirectLowerThanRedirect { op: &'static str, modeled: bool },
    /// io.json: redirect's (modeled when `modeled`) mean latency of `op` at `bytes` against
    /// uring's.
    LatencyPair {
        op: &'static str,
        bytes: u64,
        modeled: bool,
    },
    /// io.json: what the measured redirect path adds to a 4 KiB QD1 read.
    AddedPerCall,
    /// fs.json: how much lower AccelFS's mean latency of `op` is than AccelFS/redirect's.
    AccelFsLowerThanRedirect { op: &'static str },
    /// kv.json: LevelDB/AccelFS's per-request latency (1/throughput) below each baseline's
    /// over the db_bench workloads.
    DbBenchLatencyLower,
    /// kv.json: LevelDB/AccelFS's throughput above each baseline's over the YCSB workloads.
    YcsbGain,
    /// kv-sweep.json: the best (`best`) or worst AccelFS/host throughput ratio of the sweep.
    SweepRatio { best: bool },
    /// genome.json: the direct path's pipeline time below the redirect path's.
    GenomeDirectVsRedirect,
    /// genome.json: the "load reads" stage's share of the pipeline, per kura path.
    GenomeLoadShare,
    /// drives.json: each layer's throughput overhead against pass-through on `test`; as mean
    /// latency overhead (`1/(1 − o) − 1`) when `latency`.
    LayerOverhead { test: &'static str, latency: bool },
    /// drives.json: the foreground p99 with priority (and without) against its p99 alone.
    PriorityP99,
    /// drives.json: the background stream's rate with priority against its rate without.
    BackgroundShare,
    /// drives.json: kura serve through NBD against the in-process pass-through 1M seqread.
    NbdAgainstInProcess,
    /// drives.json: the overhead of one layer on one test.
    LayerRow {
        layer: &'static str,
        test: &'static str,
        setting: &'static str,
    },
    /// kura has no counterpart; the reason.
    None(&'static str),
}

/// One number a paper states.
#[derive(Debug, Clone, Copy)]
pub struct Stated {
    pub section: Section,
    /// The figure or table, and the seed file and passage it is stated in.
    pub source: &'static str,
    /// What was measured.
    pub what: &'static str,
    /// The number as the paper states it, with its units.
    pub paper: &'static str,
    pub kura: Kura,
}

/// Every number of the seeds the report sets beside kura's.
pub const STATED: &[Stated] = &[
    // Hayagui Fig. 2 (seeds/000, §2.2): the accelerator's redirected I/O against the host's.
    Stated {
        section: Section::Io,
        source: "Hayagui §2.2 (000)",
        what: "cost of one system call (fcntl loop), accelerator against host",
        paper: "42748 ns against 105 ns per call (420×)",
        kura: Kura::AddedPerCall,
    },
    Stated {
        section: Section::Io,
        source: "Hayagui Fig. 2 caption (000)",
        what: "read throughput, redirected (accelerator) below the host's, single thread",
        paper: "92–99 % slower",
        kura: Kura::DirectLowerThanRedirect {
            op: "read",
            modeled: true,
        },
    },
    Stated {
        section: Section::Io,
        source: "Hayagui Fig. 2 caption (000)",
        what: "write throughput, redirected below the host's",
        paper: "86–99 % slower",
        kura: Kura::DirectLowerThanRedirect {
            op: "write",
            modeled: true,
        },
    },
    Stated {
        section: Section::Io,
        source: "Hayagui Fig. 2 caption (000)",
        what: "write+fdatasync throughput, redirected below the host's",
        paper: "21–34 % slower",
        kura: Kura::DirectLowerThanRedirect {
            op: "write+flush",
            modeled: true,
        },
    },
    Stated {
        section: Section::Io,
        source: "Hayagui §2.2, Fig. 2 left (000)",
        what: "one 1 MB read() from the host's page cache",
        paper: "1087 µs in the accelerator against 77 µs on the host",
        kura: Kura::LatencyPair {
            op: "read",
            bytes: 1 << 20,
            modeled: true,
        },
    },
    Stated {
        section: Section::Io,
        source: "Hayagui §2.2, Fig. 2 right (000)",
        what: "one 1 MB write() + fdatasync() to the NVMe SSD",
        paper: "2937 µs in the accelerator against 1847 µs on the host",
        kura: Kura::LatencyPair {
            op: "write+flush",
            bytes: 1 << 20,
            modeled: true,
        },
    },
    // Hayagui Fig. 5 (seeds/000, §5): direct I/O engine and AccelFS against redirect.
    Stated {
        section: Section::Fs,
        source: "Hayagui Fig. 5 caption (000)",
        what: "direct I/O engine read latency below Redirect",
        paper: "74–87 % lower",
        kura: Kura::DirectLowerThanRedirect {
            op: "read",
            modeled: false,
        },
    },
    Stated {
        section: Section::Fs,
        source: "Hayagui Fig. 5 caption (000)",
        what: "direct I/O engine write latency below Redirect",
        paper: "62–99 % lower",
        kura: Kura::DirectLowerThanRedirect {
            op: "write",
            modeled: false,
        },
    },
    Stated {
        section: Section::Fs,
        source: "Hayagui Fig. 5 caption (000)",
        what: "direct I/O engine sync latency below Redirect",
        paper: "20–46 % lower",
        kura: Kura::DirectLowerThanRedirect {
            op: "write+flush",
            modeled: false,
        },
    },
    Stated {
        section: Section::Fs,
        source: "Hayagui Fig. 5 caption (000)",
        what: "AccelFS read latency below Redirect",
        paper: "64–95 % lower",
        kura: Kura::AccelFsLowerThanRedirect { op: "read" },
    },
    Stated {
        section: Section::Fs,
        source: "Hayagui Fig. 5 caption (000)",
        what: "AccelFS write latency below Redirect",
        paper: "67–97 % lower",
        kura: Kura::AccelFsLowerThanRedirect { op: "write" },
    },
    Stated {
        section: Section::Fs,
        source: "Hayagui Fig. 5 caption (000)",
        what: "AccelFS sync latency below Redirect",
        paper: "−1–42 % lower",
        kura: Kura::AccelFsLowerThanRedirect { op: "write+sync" },
    },
    // Hayagui Fig. 6 and 7 (seeds/000, §5).
    Stated {
        section: Section::Kv,
        source: "Hayagui Fig. 6, §5 (000)",
        what: "LevelDB db_bench per-request latency, on Hayagui below LevelDB with redirected system calls",
        paper: "33–81 % lower",
        kura: Kura::DbBenchLatencyLower,
    },
    Stated {
        section: Section::Kv,
        source: "Hayagui Fig. 7, §5 (000)",
        what: "YCSB on LevelDB, Hayagui against redirected system calls",
        paper: "12–89 % improvement",
        kura: Kura::YcsbGain,
    },
    // The slides (seeds/001), "Realistic KVS workloads: YCSB benchmark".
    Stated {
        section: Section::Sweep,
        source: "slides, YCSB (001)",
        what: "LevelDB with direct I/O against syscall-based LevelDB, values 256 B–1 MB: best case",
        paper: "up to 2.5× throughput",
        kura: Kura::SweepRatio { best: true },
    },
    Stated {
        section: Section::Sweep,
        source: "slides, YCSB (001)",
        what: "the same sweep: worst case",
        paper: "29 % drop (0.71×)",
        kura: Kura::SweepRatio { best: false },
    },
    // Hayagui Fig. 8 and Table 2 (seeds/000, §2.3 and §5).
    Stated {
        section: Section::Genome,
        source: "Hayagui Fig. 8 caption (000)",
        what: "end-to-end genome matching time, direct against redirected I/O (2.1–15.0 GB of reads)",
        paper: "33–46 % lower (8–53 s)",
        kura: Kura::GenomeDirectVsRedirect,
    },
    Stated {
        section: Section::Genome,
        source: "Hayagui Table 2, §2.3 (000)",
        what: "share of the end-to-end time spent loading the target sequence (redirected I/O)",
        paper: "72–96 % (bacteria 19.997 of 22.284 s; mouse 113.768 of 156.717 s)",
        kura: Kura::GenomeLoadShare,
    },
    // LeapIO (seeds/004, §5.1 and §5.3).
    Stated {
        section: Section::Layers,
        source: "LeapIO Fig. 6a, §5.1 (004)",
        what: "4 KB read-only throughput, LeapIO runtime against pass-through",
        paper: "2 % lower",
        kura: Kura::LayerOverhead {
            test: "4K randread QD32",
            latency: false,
        },
    },
    Stated {
        section: Section::Layers,
        source: "LeapIO Fig. 6b, §5.1 (004)",
        what: "4 KB 50/50 read-write throughput against pass-through (kura: random writes)",
        paper: "5 % lower",
        kura: Kura::LayerOverhead {
            test: "4K randwrite QD32",
            latency: false,
        },
    },
    Stated {
        section: Section::Layers,
        source: "LeapIO Fig. 6c-d, §5.1 (004)",
        what: "latency against pass-through (kura: mean 4K QD1 read latency)",
        paper: "3 % higher on average below p99; 6–12 % at p99.9",
        kura: Kura::LayerOverhead {
            test: "4K randread QD1",
            latency: true,
        },
    },
    Stated {
        section: Section::Layers,
        source: "LeapIO Fig. 11a, §5.3(a) (004)",
        what: "foreground latency with prioritisation, co-located with a background job",
        paper: "the same as without contention (no number stated)",
        kura: Kura::PriorityP99,
    },
    Stated {
        section: Section::Layers,
        source: "LeapIO §5.3(a) (004)",
        what: "the background job's share with prioritisation",
        paper: "10 % of the average resources",
        kura: Kura::BackgroundShare,
    },
    // DeLiBA (seeds/003, §III).
    Stated {
        section: Section::Nbd,
        source: "DeLiBA Fig. 3b, §III-C (003)",
        what: "128 kB sequential reads through the NBD detour against the same stack without it",
        paper: "550 MB/s against ~800 MB/s (0.69×; Ceph over 10 GbE)",
        kura: Kura::NbdAgainstInProcess,
    },
    Stated {
        section: Section::Nbd,
        source: "DeLiBA Fig. 3b, §III-C (003)",
        what: "most 4 kB I/Os per second through NBD (sequential reads)",
        paper: "9,000 IOPS",
        kura: Kura::None("bench drives reads the export with nbdcopy's large requests only; it has no 4 KiB NBD figure"),
    },
    Stated {
        section: Section::Nbd,
        source: "DeLiBA §III-A (003)",
        what: "the user-space request cache",
        paper: "LRU, 32 MiB by default (a setting; no figure of its own)",
        kura: Kura::LayerRow {
            layer: "cache (wt)",
            test: "4K randread QD32",
            setting: "cache drive, write-through, 32 MiB",
        },
    },
    Stated {
        section: Section::Nbd,
        source: "DeLiBA §III-A (003)",
        what: "the coalescing scheduler's delay",
        paper: "up to half the observed average I/O latency (a setting; no figure of its own)",
        kura: Kura::LayerRow {
            layer: "coalesce",
            test: "4K randwrite QD32",
            setting: "coalesce waits half its moving-average child latency",
        },
    },
    // SNAcc Fig. 4 (seeds/002, §5.2-5.3).
    Stated {
        section: Section::Ingest,
        source: "SNAcc Fig. 4a, §5.2 (002)",
        what: "sequential read, one 1 GB transfer",
        paper: "≈6.9 GB/s (SPDK the same)",
        kura: Kura::None(INGEST),
    },
    Stated {
        section: Section::Ingest,
        source: "SNAcc Fig. 4a, §5.2 (002)",
        what: "sequential write, one 1 GB transfer",
        paper: "up to 6.24 GB/s with host-DRAM buffers (SPDK 6.24 GB/s); URAM 5.6/5.32, on-board DRAM 4.6–4.8 GB/s",
        kura: Kura::None(INGEST),
    },
    Stated {
        section: Section::Ingest,
        source: "SNAcc Fig. 4b, §5.2 (002)",
        what: "random 4 kB reads, queue depth 64, in-order retirement",
        paper: "≈1.6 GB/s against SPDK's 4.5 GB/s",
        kura: Kura::None(INGEST),
    },
    Stated {
        section: Section::Ingest,
        source: "SNAcc Fig. 4b, §5.2 (002)",
        what: "random 4 kB writes",
        paper: "4.8 GB/s (host DRAM) against SPDK's 5.25 GB/s",
        kura: Kura::None(INGEST),
    },
    Stated {
        section: Section::Ingest,
        source: "SNAcc Fig. 4c, §5.3 (002)",
        what: "latency of one 4 kB read",
        paper: "34 µs (URAM; DRAM 41 and 43 µs) against SPDK's 57 µs",
        kura: Kura::None(INGEST),
    },
];

const INGEST: &str = "not measured: kura has no network-to-storage ingest path yet (issue 17)";

/// What the papers state about a section beyond [`STATED`]: why a section has no paper number,
/// or which of its paper's figures do not apply.
pub const NOTES: &[(Section, &str)] = &[
    (
        Section::Crc,
        "no number to set beside kura's: the slides plot CRC32C throughput of their vectorised version (256 32-bit integers at once on the vector engine) but state no value in their text (seeds/001).",
    ),
    (
        Section::Nbd,
        "DeLiBA's Fig. 4-5 and Table II compare its FPGA-accelerated Ceph client with the software one (up to 1.9× throughput, 2.36× IOPS); kura has no FPGA path, so they do not apply.",
    ),
    (
        Section::Io,
        "the paper's redirect is the SX-Aurora's system-call path to the host; kura's `redirect-modeled` adds the paper's 42.7 µs per call and 0.92 GB/s to a real call, so those rows are modeled, and kura's host side reads the image with O_DIRECT where the paper read the page cache.",
    ),
];

/// How kura's figure was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Measured,
    Modeled,
}

impl Label {
    pub fn word(self) -> &'static str {
        match self {
            Label::Measured => "measured",
            Label::Modeled => "modeled",
        }
    }
}

/// The benchmarks' JSON by name (`io`, `fs`, `kv`, `kv-sweep`, `drives`, `genome`).
pub type Runs = BTreeMap<String, Value>;

fn get<'a>(runs: &'a Runs, name: &str) -> Result<&'a Value, String> {
    runs.get(name)
        .ok_or_else(|| format!("— ({name}.json is missing)"))
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

/// `a–b` of `xs` with `prec` decimals (one value when they agree).
fn range(xs: &[f64], prec: usize) -> Option<String> {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if xs.is_empty() || !lo.is_finite() {
        None
    } else if format!("{lo:.prec$}") == format!("{hi:.prec$}") {
        Some(format!("{lo:.prec$}"))
    } else {
        Some(format!("{lo:.prec$} to {hi:.prec$}"))
    }
}

fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Mean latency of `backend`'s `op` at each size in io.json's latency sweep.
fn io_latency(io: &Value, backend: &str, op: &str) -> BTreeMap<u64, f64> {
    arr(&io["latency"])
        .iter()
        .filter(|p| p["backend"] == backend && p["op"] == op)
        .filter_map(|p| Some((p["bytes"].as_u64()?, p["mean_us"].as_f64()?)))
        .collect()
}

/// `1 − ours/theirs` in percent at each size both have, and the sizes.
fn lower_by_size(ours: &BTreeMap<u64, f64>, theirs: &BTreeMap<u64, f64>) -> (Vec<f64>, Vec<u64>) {
    let mut pct = Vec::new();
    let mut sizes = Vec::new();
    for (b, o) in ours {
        if let Some(t) = theirs.get(b).filter(|t| **t > 0.0) {
            pct.push((1.0 - o / t) * 100.0);
            sizes.push(*b);
        }
    }
    (pct, sizes)
}

fn sizes_span(sizes: &[u64]) -> String {
    match (sizes.first(), sizes.last()) {
        (Some(a), Some(b)) if a != b => format!("{}–{}", size(*a), size(*b)),
        (Some(a), _) => size(*a),
        _ => String::new(),
    }
}

fn median(v: &Value) -> Option<f64> {
    v["median"].as_f64()
}

/// kura's figure for `k` from the benchmarks' JSON, with its label; `Err` says why there is
/// none (kura has no counterpart, or the benchmark's JSON lacks it).
pub fn kura_value(k: Kura, runs: &Runs) -> Result<(String, Label), String> {
    let none = |what: &str| Err(format!("— ({what})"));
    match k {
        Kura::None(why) => Err(format!("— ({why})")),
        Kura::DirectLowerThanRedirect { op, modeled } => {
            let io = get(runs, "io")?;
            let redirect = if modeled {
                "redirect-modeled"
            } else {
                "redirect"
            };
            let (pct, sizes) =
                lower_by_size(&io_latency(io, "uring", op), &io_latency(io, redirect, op));
            let Some(r) = range(&pct, 0) else {
                return none(&format!(
                    "io.json has no {op} latency for uring and {redirect}"
                ));
            };
            Ok((
                format!(
                    "{r} % ({redirect} against uring, QD1 mean latency, {})",
                    sizes_span(&sizes)
                ),
                if modeled {
                    Label::Modeled
                } else {
                    Label::Measured
                },
            ))
        }
        Kura::LatencyPair { op, bytes, modeled } => {
            let io = get(runs, "io")?;
            let redirect = if modeled {
                "redirect-modeled"
            } else {
                "redirect"
            };
            let (Some(r), Some(u)) = (
                io_latency(io, redirect, op).get(&bytes).copied(),
                io_latency(io, "uring", op).get(&bytes).copied(),
            ) else {
                return none(&format!("io.json has no {} {op} latency", size(bytes)));
            };
            Ok((
                format!(
                    "{redirect} {r:.0} µs against uring {u:.0} µs ({:.1}×), {} {op}",
                    r / u,
                    size(bytes)
                ),
                if modeled {
                    Label::Modeled
                } else {
                    Label::Measured
                },
            ))
        }
        Kura::AddedPerCall => {
            let io = get(runs, "io")?;
            let (Some(r), Some(u)) = (
                io_latency(io, "redirect", "read").get(&4096).copied(),
                io_latency(io, "uring", "read").get(&4096).copied(),
            ) else {
                return none("io.json has no 4 KiB read latency for uring and redirect");
            };
            Ok((
                format!(
                    "redirect adds {:.1} µs to a 4 KiB QD1 read ({r:.1} against uring's {u:.1} µs, {:.1}×)",
                    r - u,
                    r / u
                ),
                Label::Measured,
            ))
        }
        Kura::AccelFsLowerThanRedirect { op } => {
            let fs = get(runs, "fs")?;
            let lat = |sys: &str| -> BTreeMap<u64, f64> {
                arr(&fs["latency"])
                    .iter()
                    .filter(|p| p["system"] == sys && p["op"] == op)
                    .filter_map(|p| Some((p["bytes"].as_u64()?, p["mean_us"].as_f64()?)))
                    .collect()
            };
            let (pct, sizes) = lower_by_size(&lat("AccelFS"), &lat("AccelFS/redirect"));
            let Some(r) = range(&pct, 0) else {
                return none(&format!("fs.json has no {op} latency for AccelFS/redirect"));
            };
            Ok((
                format!(
                    "{r} % (AccelFS against AccelFS/redirect, mean latency, {})",
                    sizes_span(&sizes)
                ),
                Label::Measured,
            ))
        }
        Kura::DbBenchLatencyLower | Kura::YcsbGain => {
            let kv = get(runs, "kv")?;
            let ycsb = k == Kura::YcsbGain;
            let fs = kv["file_system"].as_str().unwrap_or("host");
            let ops = |sys: &str| -> BTreeMap<(String, u64), f64> {
                arr(&kv["points"])
                    .iter()
                    .filter(|p| p["system"] == sys)
                    .filter(|p| p["workload"].as_str().unwrap_or("").starts_with("ycsb") == ycsb)
                    .filter_map(|p| {
                        Some((
                            (
                                p["workload"].as_str()?.to_string(),
                                p["value_bytes"].as_u64()?,
                            ),
                            median(&p["ops_per_s_range"]).or(p["ops_per_s"].as_f64())?,
                        ))
                    })
                    .collect()
            };
            let ours = ops("LevelDB/AccelFS");
            let mut parts = Vec::new();
            for base in [
                format!("LevelDB/{fs}"),
                "LevelDB/AccelFS/redirect".to_string(),
            ] {
                let theirs = ops(&base);
                let pct: Vec<f64> = ours
                    .iter()
                    .filter_map(|(w, o)| {
                        let t = theirs.get(w).filter(|t| **t > 0.0 && *o > 0.0)?;
                        Some(if ycsb {
                            (o / t - 1.0) * 100.0
                        } else {
                            (1.0 - t / o) * 100.0
                        })
                    })
                    .collect();
                if let Some(r) = range(&pct, 0) {
                    parts.push(format!("against {base}: {r} %"));
                }
            }
            if parts.is_empty() {
                return none(if ycsb {
                    "kv.json has no YCSB workload for LevelDB/AccelFS and a baseline"
                } else {
                    "kv.json has no db_bench workload for LevelDB/AccelFS and a baseline"
                });
            }
            Ok((
                format!(
                    "{} ({})",
                    parts.join("; "),
                    if ycsb {
                        "throughput gain over the YCSB workloads"
                    } else {
                        "1/throughput lower over the db_bench workloads"
                    }
                ),
                Label::Measured,
            ))
        }
        Kura::SweepRatio { best } => {
            let sweep = get(runs, "kv-sweep")?;
            let points = arr(&sweep["ratios"])
                .iter()
                .filter(|r| r["what"].as_str().unwrap_or("").contains("fs/host"))
                .filter_map(|r| {
                    Some((
                        median(&r["compared"]["ratio"])?,
                        r["workload"].as_str()?.to_string(),
                        r["value_bytes"].as_u64()?,
                    ))
                });
            let pick = if best {
                points.max_by(|a, b| a.0.total_cmp(&b.0))
            } else {
                points.min_by(|a, b| a.0.total_cmp(&b.0))
            };
            let Some((ratio, w, b)) = pick else {
                return none("kv-sweep.json has no AccelFS/host ratio");
            };
            Ok((
                format!(
                    "{ratio:.2}× ({w}, {b} B values; LevelDB/AccelFS against LevelDB/{})",
                    sweep["file_system"].as_str().unwrap_or("host")
                ),
                Label::Measured,
            ))
        }
        Kura::GenomeDirectVsRedirect => {
            let g = get(runs, "genome")?;
            let c = &g["direct_vs_redirect"];
            let (Some(m), Some(k), Some(p)) =
                (median(&c["ratio"]), median(&c["kura"]), median(&c["peer"]))
            else {
                return none("genome.json has no direct-vs-redirect comparison");
            };
            let lo = c["ratio"]["min"].as_f64().unwrap_or(m) * 100.0;
            let hi = c["ratio"]["max"].as_f64().unwrap_or(m) * 100.0;
            let spread = if (hi - lo).abs() < 0.05 {
                String::new()
            } else {
                format!(" [{lo:.1}–{hi:.1}]")
            };
            Ok((
                format!(
                    "{:.1}{spread} % lower ({:.3} s; pipeline {k:.3} s against {p:.3} s, {} reads)",
                    m * 100.0,
                    p - k,
                    g["reads"]
                ),
                Label::Measured,
            ))
        }
        Kura::GenomeLoadShare => {
            let g = get(runs, "genome")?;
            let parts: Vec<String> = arr(&g["systems"])
                .iter()
                .filter_map(|s| {
                    let total = s["pipeline_seconds"].as_f64().filter(|t| *t > 0.0)?;
                    let load =
                        arr(&s["stages"]).iter().find(|st| st[0] == "load reads")?[1].as_f64()?;
                    Some(format!(
                        "{}: {:.1} %",
                        s["label"].as_str()?,
                        load / total * 100.0
                    ))
                })
                .collect();
            if parts.is_empty() {
                return none("genome.json has no stage times");
            }
            Ok((
                format!(
                    "{} of the pipeline in \"load reads\" ({} reads)",
                    parts.join("; "),
                    g["reads"]
                ),
                Label::Measured,
            ))
        }
        Kura::LayerOverhead { test, latency } => {
            let d = get(runs, "drives")?;
            let parts: Vec<String> = arr(&d["layers"])
                .iter()
                .filter(|l| l["test"] == test)
                .filter_map(|l| {
                    let o = median(&l["overhead_range"]).or(l["overhead"].as_f64())?;
                    let o = if latency { 1.0 / (1.0 - o) - 1.0 } else { o };
                    Some(format!("{} {:.1}", l["layer"].as_str()?, o * 100.0))
                })
                .collect();
            if parts.is_empty() {
                return none(&format!("drives.json has no {test} layer rows"));
            }
            Ok((
                format!(
                    "{} % ({test}, {} against pass-through, median of rounds)",
                    parts.join(", "),
                    if latency {
                        "mean latency"
                    } else {
                        "throughput"
                    }
                ),
                Label::Measured,
            ))
        }
        Kura::PriorityP99 | Kura::BackgroundShare => {
            let d = get(runs, "drives")?;
            let case = |prefix: &str| {
                arr(&d["isolation"])
                    .iter()
                    .find(|c| c["case"].as_str().unwrap_or("").starts_with(prefix))
            };
            let (Some(alone), Some(noprio), Some(prio)) = (
                case("foreground alone"),
                case("with background, no priority"),
                case("with background, priority"),
            ) else {
                return none("drives.json has no isolation cases");
            };
            let f = |c: &Value, k: &str| c[k].as_f64().unwrap_or(f64::NAN);
            if k == Kura::PriorityP99 {
                let a = f(alone, "p99_us");
                Ok((
                    format!(
                        "foreground p99 {:.2}× its p99 alone with priority, {:.2}× without ({:.0} and {:.0} against {:.0} µs)",
                        f(prio, "p99_us") / a,
                        f(noprio, "p99_us") / a,
                        f(prio, "p99_us"),
                        f(noprio, "p99_us"),
                        a
                    ),
                    Label::Measured,
                ))
            } else {
                let (p, n) = (
                    f(prio, "background_mib_per_s"),
                    f(noprio, "background_mib_per_s"),
                );
                if n.is_nan() || n <= 0.0 {
                    return none("the background stream moved nothing without priority");
                }
                Ok((
                    format!(
                        "{:.0} % ({p:.0} MiB/s with priority against {n:.0} MiB/s without)",
                        p / n * 100.0
                    ),
                    Label::Measured,
                ))
            }
        }
        Kura::NbdAgainstInProcess => {
            let d = get(runs, "drives")?;
            let served = arr(&d["nbd"])
                .iter()
                .find(|s| s["server"] == "kura serve")
                .and_then(|s| median(&s["range"]).or(s["mib_per_s"].as_f64()));
            let pass: Vec<f64> = arr(&d["layers"])
                .iter()
                .filter(|l| l["test"] == "1M seqread QD8")
                .filter_map(|l| median(&l["passthrough_range"]).or(l["passthrough"].as_f64()))
                .collect();
            let pass = crate::stats::Spread::of(&pass);
            let Some(s) = served.filter(|_| pass.rounds > 0 && pass.median > 0.0) else {
                return none("drives.json has no kura serve or 1M seqread pass-through figure");
            };
            Ok((
                format!(
                    "kura serve {s:.0} MiB/s (nbdcopy, 4 connections) against in-process pass-through 1M seqread QD8 {:.0} MiB/s ({:.2}×)",
                    pass.median,
                    s / pass.median
                ),
                Label::Measured,
            ))
        }
        Kura::LayerRow {
            layer,
            test,
            setting,
        } => {
            let d = get(runs, "drives")?;
            let Some(o) = arr(&d["layers"])
                .iter()
                .find(|l| l["layer"] == layer && l["test"] == test)
                .and_then(|l| median(&l["overhead_range"]).or(l["overhead"].as_f64()))
            else {
                return none(&format!("drives.json has no {layer} {test} row"));
            };
            Ok((
                format!(
                    "{setting}; overhead {:.1} % on {test} against pass-through",
                    o * 100.0
                ),
                Label::Measured,
            ))
        }
    }
}

/// The rows of a section's paper table: source, what, paper, kura, label.
pub fn rows(section: Section, runs: &Runs) -> Vec<Vec<String>> {
    STATED
        .iter()
        .filter(|s| s.section == section)
        .map(|s| {
            let (kura, label) = match kura_value(s.kura, runs) {
                Ok((v, l)) => (v, l.word().to_string()),
                Err(why) => (why, "—".to_string()),
            };
            vec![
                s.source.to_string(),
                s.what.to_string(),
                s.paper.to_string(),
                kura,
                label,
            ]
        })
        .collect()
}

/// The headers of [`rows`].
pub fn headers() -> Vec<String> {
    ["source", "what", "paper", "kura", "kura is"]
        .map(String::from)
        .to_vec()
}

/// The notes of a section.
pub fn notes(section: Section) -> impl Iterator<Item = &'static str> {
    NOTES
        .iter()
        .filter(move |(s, _)| *s == section)
        .map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn runs(pairs: &[(&str, Value)]) -> Runs {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    const ALL: [Section; 9] = [
        Section::Io,
        Section::Fs,
        Section::Kv,
        Section::Sweep,
        Section::Genome,
        Section::Crc,
        Section::Layers,
        Section::Nbd,
        Section::Ingest,
    ];

    #[test]
    fn every_section_has_a_paper_number_or_says_why_not() {
        for s in ALL {
            let stated = STATED.iter().any(|x| x.section == s);
            assert!(stated || notes(s).next().is_some(), "{s:?}");
        }
        for s in STATED {
            assert!(!s.paper.is_empty() && !s.source.is_empty() && !s.what.is_empty());
            assert!(
                s.source.contains('(') && s.source.ends_with(')'),
                "{}: the seed file is named",
                s.source
            );
        }
    }

    #[test]
    fn io_figures_are_computed_from_the_latency_sweep() {
        let lat = |b: &str, op: &str, bytes: u64, us: f64| json!({"backend": b, "op": op, "bytes": bytes, "mean_us": us});
        let io = json!({"latency": [
            lat("uring", "read", 4096, 40.0),
            lat("redirect", "read", 4096, 100.0),
            lat("uring", "read", 1 << 20, 500.0),
            lat("redirect", "read", 1 << 20, 625.0),
            lat("redirect-modeled", "read", 4096, 160.0),
            lat("redirect-modeled", "read", 1 << 20, 2000.0),
        ]});
        let r = runs(&[("io", io)]);
        let (v, l) = kura_value(
            Kura::DirectLowerThanRedirect {
                op: "read",
                modeled: false,
            },
            &r,
        )
        .unwrap();
        // 1 − 40/100 = 60 %, 1 − 500/625 = 20 %.
        assert!(v.starts_with("20 to 60 % (redirect against uring"), "{v}");
        assert!(v.contains("4 KiB–1 MiB"), "{v}");
        assert_eq!(l, Label::Measured);
        let (v, l) = kura_value(
            Kura::DirectLowerThanRedirect {
                op: "read",
                modeled: true,
            },
            &r,
        )
        .unwrap();
        assert!(v.starts_with("75 % (redirect-modeled"), "{v}");
        assert_eq!(l, Label::Modeled);
        let (v, _) = kura_value(
            Kura::LatencyPair {
                op: "read",
                bytes: 1 << 20,
                modeled: true,
            },
            &r,
        )
        .unwrap();
        assert!(
            v.starts_with("redirect-modeled 2000 µs against uring 500 µs (4.0×)"),
            "{v}"
        );
        let (v, _) = kura_value(Kura::AddedPerCall, &r).unwrap();
        assert!(v.starts_with("redirect adds 60.0 µs"), "{v}");
        let err = kura_value(
            Kura::DirectLowerThanRedirect {
                op: "write",
                modeled: false,
            },
            &r,
        )
        .unwrap_err();
        assert!(err.contains("no write latency"), "{err}");
        let err = kura_value(Kura::AddedPerCall, &Runs::new()).unwrap_err();
        assert!(err.contains("io.json is missing"), "{err}");
        let err = kura_value(Kura::None("no such path"), &r).unwrap_err();
        assert_eq!(err, "— (no such path)");
    }

    #[test]
    fn kv_figures_compare_accelfs_with_each_baseline() {
        let p = |sys: &str, w: &str, ops: f64| {
            json!({"system": sys, "workload": w, "value_bytes": 1024,
                   "ops_per_s_range": {"median": ops}})
        };
        let kv = json!({"file_system": "xfs", "points": [
            p("LevelDB/AccelFS", "fillrandom", 200.0),
            p("LevelDB/xfs", "fillrandom", 100.0),
            p("LevelDB/AccelFS", "readrandom", 100.0),
            p("LevelDB/xfs", "readrandom", 80.0),
            p("LevelDB/AccelFS", "ycsb-a", 150.0),
            p("LevelDB/xfs", "ycsb-a", 100.0),
            p("LevelDB/AccelFS/redirect", "ycsb-a", 50.0),
        ]});
        let r = runs(&[("kv", kv)]);
        let (v, _) = kura_value(Kura::DbBenchLatencyLower, &r).unwrap();
        // fillrandom 1 − 100/200 = 50 %, readrandom 1 − 80/100 = 20 %; no redirect db_bench.
        assert!(v.starts_with("against LevelDB/xfs: 20 to 50 % ("), "{v}");
        assert!(!v.contains("redirect"), "{v}");
        let (v, _) = kura_value(Kura::YcsbGain, &r).unwrap();
        assert!(
            v.starts_with("against LevelDB/xfs: 50 %; against LevelDB/AccelFS/redirect: 200 %"),
            "{v}"
        );
        let ratio = |w: &str, b: u64, m: f64| {
            json!({"what": "LevelDB/AccelFS / LevelDB/xfs (fs/host)", "workload": w,
                   "value_bytes": b, "compared": {"ratio": {"median": m}}})
        };
        let sweep = json!({"file_system": "xfs", "ratios": [
            ratio("ycsb-a", 256, 2.5), ratio("ycsb-c", 4096, 0.7), ratio("ycsb-b", 256, 1.1)
        ]});
        let r = runs(&[("kv-sweep", sweep)]);
        let (best, _) = kura_value(Kura::SweepRatio { best: true }, &r).unwrap();
        assert!(best.starts_with("2.50× (ycsb-a, 256 B"), "{best}");
        let (worst, _) = kura_value(Kura::SweepRatio { best: false }, &r).unwrap();
        assert!(worst.starts_with("0.70× (ycsb-c, 4096 B"), "{worst}");
    }

    #[test]
    fn drive_and_genome_figures_come_from_their_rows() {
        let layer = |l: &str, t: &str, o: f64, pass: f64| {
            json!({"layer": l, "test": t, "overhead_range": {"median": o},
                   "passthrough_range": {"median": pass}})
        };
        let iso = |c: &str, p99: f64, bg: f64| json!({"case": c, "p99_us": p99, "background_mib_per_s": bg});
        let drives = json!({
            "layers": [
                layer("split", "4K randread QD1", 0.5, 1.0),
                layer("split", "1M seqread QD8", 0.0, 1000.0),
                layer("coalesce", "1M seqread QD8", 0.0, 3000.0),
                layer("cache (wt)", "4K randread QD32", 0.2, 1.0),
            ],
            "isolation": [
                iso("foreground alone", 100.0, 0.0),
                iso("with background, no priority", 1000.0, 800.0),
                iso("with background, priority 8:1, bgdepth 4", 110.0, 80.0),
            ],
            "nbd": [{"server": "kura serve", "range": {"median": 500.0}}],
        });
        let r = runs(&[("drives", drives)]);
        let (v, _) = kura_value(
            Kura::LayerOverhead {
                test: "4K randread QD1",
                latency: true,
            },
            &r,
        )
        .unwrap();
        // Half the throughput is twice the mean latency: 100 % more.
        assert!(v.starts_with("split 100.0 % ("), "{v}");
        let (v, _) = kura_value(Kura::PriorityP99, &r).unwrap();
        assert!(
            v.starts_with("foreground p99 1.10× its p99 alone with priority, 10.00× without"),
            "{v}"
        );
        let (v, _) = kura_value(Kura::BackgroundShare, &r).unwrap();
        assert!(v.starts_with("10 % (80 MiB/s"), "{v}");
        let (v, _) = kura_value(Kura::NbdAgainstInProcess, &r).unwrap();
        // The pass-through median of 1000 and 3000 is 2000.
        assert!(v.contains("2000 MiB/s (0.25×)"), "{v}");
        let (v, _) = kura_value(
            Kura::LayerRow {
                layer: "cache (wt)",
                test: "4K randread QD32",
                setting: "32 MiB",
            },
            &r,
        )
        .unwrap();
        assert_eq!(
            v,
            "32 MiB; overhead 20.0 % on 4K randread QD32 against pass-through"
        );
        let genome = json!({
            "reads": 1000,
            "direct_vs_redirect": {
                "kura": {"median": 3.0}, "peer": {"median": 4.0},
                "ratio": {"median": 0.25, "min": 0.2, "max": 0.3}
            },
            "systems": [{"label": "kura redirect", "pipeline_seconds": 4.0,
                         "stages": [["index", 1.0], ["load reads", 3.0]]}],
        });
        let r = runs(&[("genome", genome)]);
        let (v, _) = kura_value(Kura::GenomeDirectVsRedirect, &r).unwrap();
        assert!(v.starts_with("25.0 [20.0–30.0] % lower (1.000 s;"), "{v}");
        let (v, _) = kura_value(Kura::GenomeLoadShare, &r).unwrap();
        assert!(v.starts_with("kura redirect: 75.0 %"), "{v}");
    }

    #[test]
    fn rows_carry_the_label_or_the_reason() {
        let rows = rows(Section::Ingest, &Runs::new());
        assert_eq!(rows.len(), 5);
        assert!(rows
            .iter()
            .all(|r| r[4] == "—" && r[3].contains("issue 17")));
        let rows = super::rows(Section::Io, &Runs::new());
        assert!(rows.iter().all(|r| r[3].contains("io.json is missing")));
        assert_eq!(headers().len(), rows[0].len());
    }
}
