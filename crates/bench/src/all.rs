//! `kura bench all --out DIR`: every benchmark in turn, each writing its JSON and plot into DIR,
//! then one report of them, `DIR/report.md` and `DIR/report.html` (one page, the plots inline).
//! The report starts with the environment (kernel, CPU, the disk and file system of `--dir`,
//! each peer's version) and has one section per seed figure it reproduces, each labelled
//! measured or modeled, with the paper's stated numbers beside kura's (crate::paper: a table of
//! source, paper and kura, kura's labelled measured or modeled, or a note saying why the paper
//! has none) and the targets; a section whose benchmark failed or does not exist yet
//! says why.
//!
//! `--quick` is a smoke run: every benchmark at its smallest sizes and one round.

use crate::io::Opener;
use crate::paper::{Runs, Section};
use anyhow::Context;
use clap::{Args, FromArgMatches};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Arguments of `kura bench all`.
#[derive(Debug, Clone, clap::Args)]
pub struct AllArgs {
    /// Directory for every benchmark's JSON and plot and for report.md / report.html.
    #[arg(long)]
    pub out: PathBuf,
    /// Directory the benchmarks put their images and databases in (a disk file system).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// A smoke run: every benchmark at its smallest sizes, one round.
    #[arg(long)]
    pub quick: bool,
    /// Rounds of every head-to-head figure (default 5, or 1 with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
}

/// One benchmark of the run: its name, its arguments, and how it went.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: &'static str,
    pub argv: Vec<String>,
    pub outcome: Result<(), String>,
    /// Wall time of the benchmark, seconds.
    pub seconds: f64,
}

/// The command lines `kura bench all` runs, one per benchmark (after `kura bench`), without the
/// shared `--dir`, `--json` and `--plot`.
pub fn plan(quick: bool, rounds: Option<usize>) -> Vec<(&'static str, Vec<String>)> {
    let s = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    let mut io = if quick {
        s(&[
            "--quick",
            "--size",
            "32M",
            "--seconds",
            "0.03",
            "--backends",
            "uring,redirect,redirect-modeled,null",
        ])
    } else {
        Vec::new()
    };
    let mut drives = if quick {
        s(&["--quick", "--size", "32M", "--seconds", "0.03"])
    } else {
        Vec::new()
    };
    let mut kv = if quick {
        s(&[
            "--quick",
            "--workloads",
            "fillrandom,ycsb-a",
            "--records",
            "500",
            "--ops",
            "500",
        ])
    } else {
        Vec::new()
    };
    let mut sweep = s(&["--workloads", "ycsb-a,ycsb-b,ycsb-c"]);
    sweep.extend(if quick {
        s(&[
            "--quick",
            "--value-sizes",
            "256,4K",
            "--records",
            "300",
            "--ops",
            "300",
            "--systems",
            "accelfs,posix",
        ])
    } else {
        s(&[
            "--value-sizes",
            "256,1K,4K,16K,64K",
            "--records",
            "20000",
            "--ops",
            "20000",
        ])
    });
    let mut genome = if quick {
        s(&["--quick", "--reads", "1000", "--paths", "accelfs,redirect"])
    } else {
        Vec::new()
    };
    let fs = if quick { s(&["--quick"]) } else { Vec::new() };
    let mut crc = if quick {
        s(&["--seconds", "0.01"])
    } else {
        Vec::new()
    };
    for v in [
        &mut io,
        &mut crc,
        &mut drives,
        &mut kv,
        &mut sweep,
        &mut genome,
    ] {
        if let Some(n) = rounds.or(quick.then_some(1)) {
            v.extend(["--rounds".into(), n.to_string()]);
        }
    }
    vec![
        ("io", io),
        ("crc", crc),
        ("fs", fs),
        ("kv", kv),
        ("kv-sweep", sweep),
        ("drives", drives),
        ("genome", genome),
    ]
}

fn parse<T: Args + FromArgMatches>(name: &str, argv: &[String]) -> anyhow::Result<T> {
    let cmd = T::augment_args(clap::Command::new("kura-bench").no_binary_name(true));
    let m = cmd
        .try_get_matches_from(argv)
        .with_context(|| format!("arguments of bench {name}: {argv:?}"))?;
    Ok(T::from_arg_matches(&m)?)
}

/// Runs one benchmark by name with `argv` (its own arguments, `--json`/`--plot` included).
fn run_one(name: &str, argv: &[String], open: Opener) -> anyhow::Result<()> {
    match name {
        "io" => crate::io::run(&parse(name, argv)?, open),
        "crc" => crate::crc::run(&parse(name, argv)?),
        "fs" => crate::fs::run(&parse(name, argv)?),
        "kv" | "kv-sweep" => crate::kv::run(&parse(name, argv)?),
        "drives" => crate::drives::run(&parse(name, argv)?),
        "genome" => crate::genome::run(&parse(name, argv)?),
        other => anyhow::bail!("no benchmark {other}"),
    }
}

/// Runs every benchmark, then writes the report.
pub fn run(args: &AllArgs, open: Opener) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let mut steps = Vec::new();
    for (name, mut argv) in plan(args.quick, args.rounds) {
        if name != "crc" {
            argv.extend(["--dir".into(), args.dir.display().to_string()]);
        }
        argv.extend([
            "--json".into(),
            args.out.join(format!("{name}.json")).display().to_string(),
            "--plot".into(),
            args.out.join(format!("{name}.png")).display().to_string(),
        ]);
        println!("\n=== kura bench {} {}", name, argv.join(" "));
        let started = std::time::Instant::now();
        let outcome = run_one(name, &argv, open).map_err(|e| format!("{e:#}"));
        let seconds = started.elapsed().as_secs_f64();
        if let Err(e) = &outcome {
            println!("kura bench {name} failed: {e}");
        }
        steps.push(Step {
            name,
            argv,
            outcome,
            seconds,
        });
    }
    let env = environment(&args.dir);
    let doc = report(&args.out, &steps, &env, args.quick);
    let md = args.out.join("report.md");
    std::fs::write(&md, to_markdown(&doc)).with_context(|| format!("writing {}", md.display()))?;
    let html = args.out.join("report.html");
    std::fs::write(&html, to_html(&doc, &args.out))
        .with_context(|| format!("writing {}", html.display()))?;
    println!("\nreport: {} and {}", md.display(), html.display());
    Ok(())
}

/// A piece of the report, rendered to Markdown and HTML alike.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Heading(usize, String),
    Para(String),
    Table(Vec<String>, Vec<Vec<String>>),
    /// A PNG in the output directory.
    Image(String),
}

/// The machine and each peer's version, as `(what, value)`.
pub fn environment(dir: &Path) -> Vec<(String, String)> {
    let v = crate::stats::tool_version;
    let disk = mount_source(dir).unwrap_or_else(|| "unknown".into());
    vec![
        ("kernel".into(), crate::stats::kernel()),
        ("CPU".into(), crate::stats::cpu_model()),
        (
            "cores".into(),
            std::thread::available_parallelism().map_or("?".into(), |n| n.to_string()),
        ),
        (
            "--dir".into(),
            format!(
                "{} on {} ({disk})",
                dir.display(),
                crate::stats::fs_name(dir)
            ),
        ),
        ("fio".into(), v("fio", "--version")),
        ("qemu-nbd".into(), v("qemu-nbd", "--version")),
        ("nbdkit".into(), v("nbdkit", "--version")),
        ("nbdcopy".into(), v("nbdcopy", "--version")),
        ("minimap2".into(), v("minimap2", "--version")),
        ("python3".into(), v("python3", "--version")),
        ("g++".into(), v("g++", "--version")),
    ]
}

/// The device `/proc/mounts` lists for the longest mount point holding `dir`.
fn mount_source(dir: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(dir).ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some((f.next()?.to_string(), f.next()?.replace("\\040", " ")))
        })
        .filter(|(_, mnt)| canon.starts_with(mnt))
        .max_by_key(|(_, mnt)| mnt.len())
        .map(|(src, _)| src)
}

fn load(out: &Path, name: &str) -> Option<Value> {
    let text = std::fs::read_to_string(out.join(format!("{name}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

fn num(v: &Value, prec: usize) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.prec$}"))
}

fn spread(v: &Value, prec: usize) -> String {
    match (v["median"].as_f64(), v["min"].as_f64(), v["max"].as_f64()) {
        (Some(m), Some(lo), Some(hi)) if lo != hi => {
            format!("{m:.prec$} [{lo:.prec$}–{hi:.prec$}]")
        }
        (Some(m), _, _) => format!("{m:.prec$}"),
        _ => "-".into(),
    }
}

fn verdict(v: &Value) -> String {
    match (v["target"].as_str(), v["verdict"].as_str()) {
        (Some(t), Some(w)) => format!("{t}: {}", w.replace('_', " ")),
        _ => String::new(),
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("-").to_string()
}

/// What went wrong with a section's benchmark, if anything.
fn missing(steps: &[Step], name: &str) -> Option<String> {
    match steps.iter().find(|s| s.name == name).map(|s| &s.outcome) {
        None => Some(format!("`kura bench {name}` was not run")),
        Some(Err(e)) => Some(format!("`kura bench {name}` failed: {e}")),
        Some(Ok(())) => None,
    }
}

/// A section that shows one benchmark's JSON: the step that writes it, the section's heading
/// ([`head`]), and the blocks it draws from the JSON once loaded.
struct Measured {
    step: &'static str,
    title: &'static str,
    label: &'static str,
    section: Section,
    body: fn(&mut Vec<Block>, &Value),
}

/// The measured sections, in report order (two of them show `drives.json`).
const MEASURED: [Measured; 8] = [
    Measured {
        step: "io",
        title: "Hayagui Fig. 2 — device I/O on the direct path, against fio and redirect",
        label: "Measured (the redirect rows over the modeled Aurora link are modeled: 42.7 µs and 0.92 GB/s per call added to a real call)",
        section: Section::Io,
        body: io_body,
    },
    Measured {
        step: "fs",
        title: "Hayagui Fig. 5 — file-system latency, AccelFS against the host file system",
        label: "Measured",
        section: Section::Fs,
        body: fs_body,
    },
    Measured {
        step: "kv",
        title: "Hayagui Fig. 6 and 7 — key-value stores: db_bench and YCSB",
        label: "Measured",
        section: Section::Kv,
        body: kv_body,
    },
    Measured {
        step: "kv-sweep",
        title: "Slides — YCSB by value size",
        label: "Measured",
        section: Section::Sweep,
        body: sweep_body,
    },
    Measured {
        step: "genome",
        title: "Hayagui Fig. 8 and Table 2 — genome matching on each I/O path, against minimap2",
        label: "Measured",
        section: Section::Genome,
        body: genome_body,
    },
    Measured {
        step: "crc",
        title: "Slides — CRC32C by method and size",
        label: "Measured",
        section: Section::Crc,
        body: crc_body,
    },
    Measured {
        step: "drives",
        title: "LeapIO Fig. 6 and 11 — per-layer overhead and priority isolation",
        label: "Measured",
        section: Section::Layers,
        body: layers_body,
    },
    Measured {
        step: "drives",
        title: "DeLiBA — the NBD export against qemu-nbd and nbdkit, cache and coalescing",
        label: "Measured",
        section: Section::Nbd,
        body: nbd_body,
    },
];

/// The report's blocks from the benchmarks' JSON in `out`.
pub fn report(out: &Path, steps: &[Step], env: &[(String, String)], quick: bool) -> Vec<Block> {
    let mut d = vec![
        Block::Heading(1, "kura: the seed figures, regenerated".into()),
        Block::Para(format!(
            "Generated by `kura bench all{}`. Every figure is measured on this machine against its peer in the same run, the two interleaved round by round; figures are median [min–max] over the rounds, and a target is met only when the whole range is on its side. {}",
            if quick { " --quick" } else { "" },
            if quick {
                "This is a smoke run (--quick): smallest sizes, one round — the numbers show the pipeline works, not what kura can do."
            } else {
                ""
            }
        )),
        Block::Heading(2, "Environment".into()),
        Block::Table(
            vec!["what".into(), "value".into()],
            env.iter().map(|(k, v)| vec![k.clone(), v.clone()]).collect(),
        ),
        Block::Heading(2, "Commands".into()),
        Block::Table(
            vec![
                "benchmark".into(),
                "command".into(),
                "outcome".into(),
                "seconds".into(),
            ],
            steps
                .iter()
                .map(|s| {
                    vec![
                        s.name.to_string(),
                        format!("kura bench {} {}", s.name.trim_end_matches("-sweep"), s.argv.join(" ")),
                        match &s.outcome {
                            Ok(()) => "ok".into(),
                            Err(e) => format!("failed: {e}"),
                        },
                        format!("{:.1}", s.seconds),
                    ]
                })
                .collect(),
        ),
    ];
    let runs: Runs = ["io", "fs", "kv", "kv-sweep", "drives", "genome"]
        .into_iter()
        .filter(|n| missing(steps, n).is_none())
        .filter_map(|n| Some((n.to_string(), load(out, n)?)))
        .collect();
    for m in &MEASURED {
        let loaded = outcome(out, steps, m.step);
        if let Some(v) = open(&mut d, m.title, m.label, m.section, &runs, loaded) {
            (m.body)(&mut d, &v);
        }
    }
    d.push(Block::Heading(
        2,
        "SNAcc Fig. 4 — streaming ingest, sequential and random, in-order vs out-of-order".into(),
    ));
    d.push(Block::Para(
        "Not reproduced: kura has no network-to-storage ingest path yet (issue 17), so there is nothing to measure.".into(),
    ));
    paper_table(&mut d, Section::Ingest, &runs);
    d
}

/// A benchmark's JSON from `out`, or why there is none: the step was not run, failed, or left
/// no readable `<name>.json`.
fn outcome(out: &Path, steps: &[Step], name: &str) -> Result<Value, String> {
    if let Some(why) = missing(steps, name) {
        return Err(why);
    }
    load(out, name).ok_or_else(|| format!("{name}.json could not be read"))
}

/// Opens a section ([`head`]) and hands back its benchmark's JSON; when there is none, the
/// section says why in a paragraph and this returns `None`.
fn open(
    d: &mut Vec<Block>,
    title: &str,
    label: &str,
    section: Section,
    runs: &Runs,
    loaded: Result<Value, String>,
) -> Option<Value> {
    head(d, title, label, section, runs);
    loaded.map_err(|why| d.push(Block::Para(why))).ok()
}

/// A `{median, min, max}` range scaled by 100, for showing a fraction as a percentage.
fn percent(v: &Value) -> Value {
    serde_json::json!({
        "median": v["median"].as_f64().map(|x| x * 100.0),
        "min": v["min"].as_f64().map(|x| x * 100.0),
        "max": v["max"].as_f64().map(|x| x * 100.0),
    })
}

/// A section's title and label, then the paper's numbers beside kura's.
fn head(d: &mut Vec<Block>, title: &str, label: &str, section: Section, runs: &Runs) {
    d.push(Block::Heading(2, title.into()));
    d.push(Block::Para(format!("**{label}.**")));
    paper_table(d, section, runs);
}

/// The seed's stated numbers for `section` beside kura's (crate::paper), and the paper's notes.
fn paper_table(d: &mut Vec<Block>, section: Section, runs: &Runs) {
    let rows = crate::paper::rows(section, runs);
    if !rows.is_empty() {
        d.push(Block::Para(
            "The paper's numbers beside kura's (paper: as the seed states it; kura: measured on this machine, or modeled):".into(),
        ));
        d.push(Block::Table(crate::paper::headers(), rows));
    }
    for n in crate::paper::notes(section) {
        d.push(Block::Para(format!("**Paper:** {n}")));
    }
}

fn ratio_rows(v: &Value) -> Vec<Vec<String>> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let pct = r["percent"].as_bool().unwrap_or(false);
            let ratio = if pct {
                format!("{} %", spread(&percent(&r["ratio"]), 1))
            } else {
                spread(&r["ratio"], 2)
            };
            let what = text(&r["what"]);
            let modeled = if r["modeled"].as_bool().unwrap_or(false) && !what.contains("modeled") {
                " (modeled)"
            } else {
                ""
            };
            vec![
                format!("{what}{modeled}"),
                spread(&r["kura"], 1),
                r["peer_name"].as_str().unwrap_or("—").to_string(),
                if r["peer"].is_null() {
                    "—".into()
                } else {
                    spread(&r["peer"], 1)
                },
                ratio,
                verdict(r),
            ]
        })
        .collect()
}

/// The io section's body, from `io.json`.
fn io_body(d: &mut Vec<Block>, v: &Value) {
    d.push(Block::Para(format!(
        "{} MiB image on {}, {} s per point, {} round(s); {}. The targets column holds issue 20's goals: QD1 4 KiB latency at least 50 % below the host-served path, and at least 5 M commands/s through the full interface on the null device.",
        v["image_bytes"].as_u64().unwrap_or(0) >> 20,
        text(&v["file_system"]),
        num(&v["seconds_per_point"], 2),
        v["rounds"],
        text(&v["fio_status"])
    )));
    d.push(Block::Table(
        ["figure", "kura", "peer", "peer value", "ratio", "target"]
            .map(String::from)
            .to_vec(),
        ratio_rows(&v["ratios"]),
    ));
    d.push(Block::Image("io.png".into()));
}

/// The fs section's body, from `fs.json`.
fn fs_body(d: &mut Vec<Block>, v: &Value) {
    let host = format!("{} syscalls", text(&v["file_system"]));
    let lat = v["latency"].as_array().cloned().unwrap_or_default();
    let find = |sys: &str, op: &str, b: u64| {
        lat.iter()
            .find(|p| p["system"] == sys && p["op"] == op && p["bytes"].as_u64() == Some(b))
            .and_then(|p| p["mean_us"].as_f64())
    };
    let mut rows = Vec::new();
    for p in lat.iter().filter(|p| p["system"] == "AccelFS") {
        let (op, b) = (text(&p["op"]), p["bytes"].as_u64().unwrap_or(0));
        let a = find("AccelFS", &op, b);
        let h = find(&host, &op, b);
        rows.push(vec![
            op.clone(),
            format!("{} KiB", b >> 10),
            a.map_or("-".into(), |x| format!("{x:.1}")),
            h.map_or("-".into(), |x| format!("{x:.1}")),
            match (a, h) {
                (Some(a), Some(h)) if h > 0.0 => format!("{:.2}", a / h),
                _ => "-".into(),
            },
        ]);
    }
    d.push(Block::Table(
        vec![
            "op".into(),
            "size".into(),
            "AccelFS mean µs (median of rounds)".into(),
            format!("{host} mean µs (median of rounds)"),
            "AccelFS / host".into(),
        ],
        rows,
    ));
    let appends: Vec<Vec<String>> = v["appends_rounds"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| vec![text(&p[0]), spread(&p[1], 0)])
        .collect();
    d.push(Block::Table(
        vec!["fsync'd 4 KiB appends/s".into(), "median [min–max]".into()],
        appends,
    ));
    d.push(Block::Image("fs.png".into()));
}

fn kv_rows(v: &Value) -> Vec<Vec<String>> {
    v["points"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                text(&p["workload"]),
                p["value_bytes"].to_string(),
                text(&p["system"]),
                spread(&p["ops_per_s_range"], 0),
                num(&p["p99_us"], 1),
            ]
        })
        .collect()
}

fn kv_headers() -> Vec<String> {
    ["workload", "value B", "system", "ops/s", "p99 µs"]
        .map(String::from)
        .to_vec()
}

/// The kv section's body, from `kv.json`.
fn kv_body(d: &mut Vec<Block>, v: &Value) {
    let settings: Vec<Vec<String>> = v["settings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            vec![
                text(&s["system"]),
                s["block_cache_bytes"].to_string(),
                s["write_buffer_bytes"].to_string(),
                s["bloom_bits_per_key"].to_string(),
                s["compression"].to_string(),
                s["options_file"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join("; ")
                    })
                    .unwrap_or_default(),
            ]
        })
        .collect();
    d.push(Block::Table(
        [
            "store",
            "block cache B",
            "memtable B",
            "bloom bits/key",
            "compression",
            "RocksDB's OPTIONS file",
        ]
        .map(String::from)
        .to_vec(),
        settings,
    ));
    d.push(Block::Table(kv_headers(), kv_rows(v)));
    d.push(Block::Image("kv.png".into()));
}

/// The kv-sweep section's body, from `kv-sweep.json`.
fn sweep_body(d: &mut Vec<Block>, v: &Value) {
    d.push(Block::Table(kv_headers(), kv_rows(v)));
    d.push(Block::Image("kv-sweep.png".into()));
}

/// The genome section's body, from `genome.json`.
fn genome_body(d: &mut Vec<Block>, v: &Value) {
    let rows = v["systems"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            vec![
                text(&s["system"]),
                spread(&s["seconds_range"], 3),
                num(&s["pipeline_seconds"], 3),
                num(&s["peak_rss_mib"], 1),
                format!("{}/{}", s["correct"], s["reads"]),
            ]
        })
        .collect();
    d.push(Block::Table(
        [
            "system",
            "process wall s",
            "pipeline s",
            "peak RSS MiB",
            "correct",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    ));
    let mut lines = Vec::new();
    for pair in v["versus_minimap2"].as_array().into_iter().flatten() {
        lines.push(format!(
            "{}: process wall time {}x per round pair (below 1: kura faster).",
            text(&pair[0]),
            spread(&pair[1]["ratio"], 2)
        ));
    }
    let dvr = &v["direct_vs_redirect"]["ratio"];
    if !dvr.is_null() {
        lines.push(format!(
            "Direct path against redirect, pipeline total: {} % lower (paper: 33–46 %).",
            spread(&percent(dvr), 1)
        ));
    }
    lines.push(format!(
        "{} reads ({}); reference {}.",
        v["reads"],
        text(&v["simulator"]),
        text(&v["reference"])
    ));
    d.push(Block::Para(lines.join(" ")));
    d.push(Block::Image("genome.png".into()));
}

/// The crc section's body, from `crc.json`.
fn crc_body(d: &mut Vec<Block>, v: &Value) {
    let rows = v
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| matches!(p["bytes"].as_u64(), Some(64 | 4096 | 1048576)))
        .map(|p| {
            vec![
                text(&p["method"]),
                p["bytes"].to_string(),
                if p["range"].is_null() {
                    num(&p["gib_per_s"], 2)
                } else {
                    spread(&p["range"], 2)
                },
                if p["versus_crate"].is_null() {
                    "—".into()
                } else {
                    spread(&p["versus_crate"]["ratio"], 2)
                },
            ]
        })
        .collect();
    d.push(Block::Table(
        ["method", "bytes", "GiB/s", "against the crc32c crate"]
            .map(String::from)
            .to_vec(),
        rows,
    ));
    d.push(Block::Image("crc.png".into()));
}

/// The drives section's layer table and isolation figures, from `drives.json`.
fn layers_body(d: &mut Vec<Block>, v: &Value) {
    let rows = v["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                text(&p["layer"]),
                text(&p["test"]),
                spread(&p["value_range"], 0),
                spread(&p["passthrough_range"], 0),
                spread(&percent(&p["overhead_range"]), 1),
                verdict(p),
            ]
        })
        .collect();
    d.push(Block::Table(
        [
            "layer",
            "test",
            "value",
            "pass-through",
            "overhead %",
            "target",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    ));
    let iso = v["isolation"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                text(&p["case"]),
                num(&p["p50_us"], 1),
                num(&p["p99_us"], 1),
                num(&p["background_mib_per_s"], 0),
            ]
        })
        .collect();
    d.push(Block::Table(
        ["isolation case (fg 4K QD1)", "p50 µs", "p99 µs", "bg MiB/s"]
            .map(String::from)
            .to_vec(),
        iso,
    ));
    d.push(Block::Para(
        "Target: foreground p99 with priority at most 1.2× its p99 alone.".into(),
    ));
    d.push(Block::Image("drives.png".into()));
}

/// The NBD section's servers and ratios, from `drives.json`.
fn nbd_body(d: &mut Vec<Block>, v: &Value) {
    let rows = v["nbd"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                text(&p["server"]),
                spread(&p["range"], 0),
                text(&p["command"]),
            ]
        })
        .collect::<Vec<_>>();
    if rows.is_empty() {
        let why = v["notes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|n| n.starts_with("NBD"))
            .unwrap_or("no NBD figures in drives.json")
            .to_string();
        d.push(Block::Para(why));
    } else {
        d.push(Block::Table(
            ["server", "MiB/s (nbdcopy)", "command"]
                .map(String::from)
                .to_vec(),
            rows,
        ));
        let ratios: Vec<String> = v["nbd_ratios"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| format!("{} = {}x", text(&r[0]), spread(&r[1]["ratio"], 2)))
            .collect();
        d.push(Block::Para(format!(
                    "{} (per round pair). Cache and coalescing: the `cache (wt)` and `coalesce` rows of the layer table above.",
                    ratios.join("; ")
                )));
    }
}

fn escape_md(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The report as Markdown (images linked by file name, next to the report).
pub fn to_markdown(doc: &[Block]) -> String {
    let mut s = String::new();
    for b in doc {
        match b {
            Block::Heading(level, t) => {
                let _ = writeln!(s, "{} {t}\n", "#".repeat(*level));
            }
            Block::Para(t) => {
                let _ = writeln!(s, "{t}\n");
            }
            Block::Table(head, rows) => {
                let _ = writeln!(
                    s,
                    "| {} |",
                    head.iter()
                        .map(|h| escape_md(h))
                        .collect::<Vec<_>>()
                        .join(" | ")
                );
                let _ = writeln!(s, "|{}", "---|".repeat(head.len()));
                for r in rows {
                    let _ = writeln!(
                        s,
                        "| {} |",
                        r.iter()
                            .map(|c| escape_md(c))
                            .collect::<Vec<_>>()
                            .join(" | ")
                    );
                }
                s.push('\n');
            }
            Block::Image(png) => {
                let _ = writeln!(s, "![{png}]({png})\n");
            }
        }
    }
    s
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `**bold**` spans and `` `code` `` spans of a paragraph, as HTML.
fn inline_html(s: &str) -> String {
    let mut out = String::new();
    let (mut bold, mut code) = (false, false);
    let e = escape_html(s);
    let mut rest = e.as_str();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("**") {
            out.push_str(if bold { "</b>" } else { "<b>" });
            bold = !bold;
            rest = r;
        } else if let Some(r) = rest.strip_prefix('`') {
            out.push_str(if code { "</code>" } else { "<code>" });
            code = !code;
            rest = r;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    if code {
        out.push_str("</code>");
    }
    if bold {
        out.push_str("</b>");
    }
    out
}

/// Standard base64 (RFC 4648, with padding).
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The report as one HTML page, each PNG in `out` inlined as a data URI (or a note where the
/// plot was not drawn).
pub fn to_html(doc: &[Block], out: &Path) -> String {
    let mut s = String::from(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>kura benchmarks</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #999;padding:3px 8px;font-size:90%}img{max-width:100%}</style></head><body>\n",
    );
    for b in doc {
        match b {
            Block::Heading(level, t) => {
                let _ = writeln!(s, "<h{level}>{}</h{level}>", escape_html(t));
            }
            Block::Para(t) => {
                let _ = writeln!(s, "<p>{}</p>", inline_html(t));
            }
            Block::Table(head, rows) => {
                s.push_str("<table><tr>");
                for h in head {
                    let _ = write!(s, "<th>{}</th>", escape_html(h));
                }
                s.push_str("</tr>\n");
                for r in rows {
                    s.push_str("<tr>");
                    for c in r {
                        let _ = write!(s, "<td>{}</td>", escape_html(c));
                    }
                    s.push_str("</tr>\n");
                }
                s.push_str("</table>\n");
            }
            Block::Image(png) => match std::fs::read(out.join(png)) {
                Ok(bytes) => {
                    let _ = writeln!(
                        s,
                        "<p><img alt=\"{}\" src=\"data:image/png;base64,{}\"></p>",
                        escape_html(png),
                        base64(&bytes)
                    );
                }
                Err(_) => {
                    let _ = writeln!(
                        s,
                        "<p><i>{}: no plot (python3 with matplotlib draws it)</i></p>",
                        escape_html(png)
                    );
                }
            },
        }
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn every_planned_command_parses() {
        for quick in [true, false] {
            for (name, argv) in plan(quick, Some(3)) {
                let mut argv = argv.clone();
                argv.extend(["--json".into(), "/x/a.json".into()]);
                let ok = match name {
                    "io" => parse::<crate::io::IoArgs>(name, &argv).map(|_| ()),
                    "crc" => parse::<crate::crc::CrcArgs>(name, &argv).map(|_| ()),
                    "fs" => parse::<crate::fs::FsBenchArgs>(name, &argv).map(|_| ()),
                    "kv" | "kv-sweep" => parse::<crate::kv::KvBenchArgs>(name, &argv).map(|_| ()),
                    "drives" => parse::<crate::drives::DrivesArgs>(name, &argv).map(|_| ()),
                    "genome" => parse::<crate::genome::GenomeBenchArgs>(name, &argv).map(|_| ()),
                    _ => Err(anyhow::anyhow!("unplanned {name}")),
                };
                ok.unwrap_or_else(|e| panic!("{name} {argv:?}: {e:#}"));
            }
        }
        let full = plan(false, Some(3));
        let io = &full.iter().find(|(n, _)| *n == "io").unwrap().1;
        assert_eq!(
            io,
            &["--rounds", "3"],
            "a full run keeps each bench's defaults"
        );
    }

    #[test]
    fn a_failed_or_missing_benchmark_says_why_and_tables_render() {
        let dir = tempfile::tempdir().unwrap();
        let steps = vec![Step {
            name: "io",
            argv: vec!["--quick".into()],
            outcome: Err("fio exploded".into()),
            seconds: 1.0,
        }];
        let doc = report(dir.path(), &steps, &[("kernel".into(), "6.1".into())], true);
        let md = to_markdown(&doc);
        assert!(md.contains("`kura bench io` failed: fio exploded"), "{md}");
        assert!(md.contains("`kura bench genome` was not run"), "{md}");
        assert!(md.contains("SNAcc Fig. 4"), "{md}");
        // Every seed section has the paper's numbers (a table with a paper column) or a note
        // saying why not, even when its benchmark failed.
        for part in md.split("\n## ").skip(3) {
            let title = part.lines().next().unwrap_or("");
            assert!(
                part.contains("| paper |") || part.contains("**Paper:**"),
                "{title}: no paper column or reason"
            );
        }
        assert!(md.contains("| Hayagui Fig. 2 caption (000) |"), "{md}");
        assert!(md.contains("io.json is missing"), "{md}");
        assert!(md.contains("| kernel | 6.1 |"), "{md}");
        let html = to_html(&doc, dir.path());
        assert!(html.contains("<td>kernel</td><td>6.1</td>"));
        assert!(html.contains("<b>Measured"), "{html}");
        assert_eq!(
            inline_html("a `b<c>` **d**"),
            "a <code>b&lt;c&gt;</code> <b>d</b>"
        );
    }
}
