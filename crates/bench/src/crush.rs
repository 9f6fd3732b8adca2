//! `kura bench crush`: CRUSH mappings per second, kura's mapper against Ceph's `crushtool
//! --test` on the same maps, rule and inputs, in the same run.
//!
//! For each bucket algorithm (straw2, straw, list, tree, uniform) and size (10, 100, 1000
//! OSDs by default) crushtool builds a three-level map (`--build`: hosts, racks, one root,
//! all of that algorithm); rule 0 (`chooseleaf firstn 0 type host`) maps inputs 0..N-1 to 3
//! replicas. The sides take turns in every round ([`crate::stats::interleave`]):
//!
//! * kura's mapper on one thread, input by input without AVX2 ("scalar 1T"), and through the
//!   batch API ([`kura_crush::map_range`], straw2 draws of eight inputs in SIMD lanes, AVX2
//!   where the CPU has it: "simd 1T"), and both over the most threads asked ("allT");
//! * the batch API over each thread count of `--threads` (default 1, 2, 4, … up to every
//!   core): "simd NT", the scaling with cores;
//! * kura printing crushtool's `--show-mappings` lines ([`kura_crush::tester::run_test`] into a
//!   sink): the in-process equivalent of the first peer;
//! * `crushtool --test --show-mappings` (the lines written to /dev/null) and `crushtool --test
//!   --show-statistics` (the same mapping loop without printing a line per input), each timed
//!   as a whole process, less that process's own start-up and map load (the same command for
//!   one input, timed in the same round).
//!
//! Before any timing, kura's lines for the first inputs must equal crushtool's. Each figure is
//! the median [min–max] of its rounds; the ratios against crushtool are taken round by round.
//! Every peer command line is in the JSON.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use kura_crush::tester::{run_test, TestOptions};
use kura_crush::{map_range, CrushMap, Mapper, Workspace};
use serde::Serialize;

use crate::output::{plot_help, RunArgs};
use crate::stats::{compare, interleave, quotient, Compared, Goal, Spread};

const PLOT: &str = include_str!("../../../scripts/plot_crush.py");

/// The bucket algorithms, in the order they are measured.
pub const ALGS: [&str; 5] = ["straw2", "straw", "list", "tree", "uniform"];

/// Arguments of `kura bench crush`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("plot", |a| plot_help(a, "crush")))]
#[command(mut_arg("quick", |a| a.help("A short run: 20000 inputs, 10 and 100 OSDs, 1 round")))]
pub struct CrushBenchArgs {
    /// Inputs mapped per point (x = 0..N-1).
    #[arg(long)]
    pub inputs: Option<i32>,
    /// Map sizes in OSDs (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub osds: Option<Vec<usize>>,
    /// Bucket algorithms (comma-separated; default all five).
    #[arg(long, value_delimiter = ',')]
    pub algs: Option<Vec<String>>,
    /// Replicas per input.
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Thread counts of the scaling sides, comma-separated (default 1,2,4,… up to every
    /// core); the largest is also the allT sides' count.
    #[arg(long, value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,
    /// Rounds (sides interleaved in each; default 5, 1 with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// The crushtool to compare with.
    #[arg(long, default_value = "crushtool")]
    pub crushtool: PathBuf,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The sides, in the order they take turns.
pub const SIDES: [&str; 7] = [
    "kura scalar 1T",
    "kura simd 1T",
    "kura scalar allT",
    "kura simd allT",
    "kura test lines 1T",
    "crushtool --show-mappings",
    "crushtool --show-statistics",
];

/// One side's rate on one map.
#[derive(Debug, Clone, Serialize)]
pub struct SidePoint {
    pub side: String,
    /// Mappings per second, median [min–max] over the rounds.
    pub mappings_per_s: Spread,
}

/// The batch mapper's rate on one thread count.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingPoint {
    pub threads: usize,
    /// Mappings per second, median [min–max] over the rounds.
    pub mappings_per_s: Spread,
    /// Against the first thread count of the list, round by round.
    pub vs_first: Compared,
}

/// One map's figures.
#[derive(Debug, Clone, Serialize)]
pub struct MapPoint {
    pub alg: String,
    pub osds: usize,
    pub hosts: usize,
    /// How crushtool built the map.
    pub build: String,
    pub sides: Vec<SidePoint>,
    /// crushtool's start-up and map load (one input), seconds, taken out of its times.
    pub crushtool_startup_s: Spread,
    /// kura's one-thread SIMD mapper against crushtool's statistics loop (the straw2 target:
    /// at least 2x on one core).
    pub simd_1t_vs_statistics: Compared,
    /// kura's one-thread scalar mapper against crushtool's statistics loop.
    pub scalar_1t_vs_statistics: Compared,
    /// kura's SIMD mapper on every core against crushtool's statistics loop.
    pub simd_all_vs_statistics: Compared,
    /// kura's `--show-mappings` lines against crushtool's.
    pub lines_vs_show_mappings: Compared,
    /// kura's one-thread SIMD mapper against crushtool's statistics loop in CPU time (this
    /// process's and the child's user + system seconds, 10 ms ticks; crushtool's start-up CPU
    /// taken out): what a loaded machine's wall clock hides.
    pub simd_1t_vs_statistics_cpu: Compared,
    /// The batch mapper over each thread count asked.
    pub scaling: Vec<ScalingPoint>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct CrushReport {
    pub inputs: i32,
    pub replicas: usize,
    pub rule: u32,
    /// Threads of the allT sides (the largest of `thread_counts`).
    pub threads: usize,
    /// The thread counts of the scaling sides.
    pub thread_counts: Vec<usize>,
    /// Cores this machine offers.
    pub cores: usize,
    pub rounds: usize,
    pub avx2: bool,
    pub cpu: String,
    pub crushtool: String,
    pub crushtool_version: String,
    /// The peers' command lines (MAP stands for each map's file, N-1 for the last input).
    pub peer_commands: Vec<String>,
    pub maps: Vec<MapPoint>,
}

/// The `--build` layers for `osds` devices: hosts of `osds/10` devices (2 to 40: a tree
/// bucket holds at most 64 items, and crushtool aborts building a larger one), racks of up to
/// 10 hosts, one root; returns (arguments, hosts).
pub fn build_layers(alg: &str, osds: usize) -> (Vec<String>, usize) {
    let per_host = (osds / 10).clamp(2, 40);
    let hosts = osds.div_ceil(per_host);
    let per_rack = if hosts >= 30 { 10 } else { 2.max(hosts / 3) };
    let args = [
        "host",
        alg,
        &per_host.to_string(),
        "rack",
        alg,
        &per_rack.to_string(),
        "root",
        alg,
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    (args, hosts)
}

fn crushtool_ok(tool: &Path, args: &[String]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .with_context(|| format!("running {} (apt-get install ceph-base)", tool.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} failed: {}",
            tool.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// CPU seconds (user + system) used so far by this process and by its waited-for children,
/// from `/proc/self/stat` (in USER_HZ ticks, 100 a second on Linux); zeros where it cannot be
/// read.
fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the parenthesised command name start with field 3 (state), so utime
    // (field 14) is index 11, stime 12, cutime 13, cstime 14.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let get = |i: usize| f.get(i).copied().unwrap_or(0.0) / 100.0;
    (get(11) + get(12), get(13) + get(14))
}

/// `n` over `seconds`, or NaN (left out of the spread) when the CPU clock did not tick.
fn cpu_rate(n: i32, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        f64::NAN
    }
}

/// Seconds one crushtool process takes, its output discarded.
fn time_process(tool: &Path, args: &[String]) -> anyhow::Result<f64> {
    let t = Instant::now();
    let st = Command::new(tool)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("running {}", tool.display()))?;
    let s = t.elapsed().as_secs_f64();
    if !st.success() {
        bail!("{} {} failed", tool.display(), args.join(" "));
    }
    Ok(s)
}

fn test_args(map: &Path, replicas: usize, last: i32, show: &str) -> Vec<String> {
    [
        "-i",
        &map.display().to_string(),
        "--test",
        "--rule",
        "0",
        "--num-rep",
        &replicas.to_string(),
        "--min-x",
        "0",
        "--max-x",
        &last.to_string(),
        show,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// kura's one-thread rate with `mapper` over `0..n`, and a checksum of the results.
fn one_thread(
    mapper: &Mapper<'_>,
    n: i32,
    replicas: usize,
    weights: &[u32],
) -> anyhow::Result<(f64, u64)> {
    let mut ws = Workspace::new();
    let mut out = Vec::with_capacity(replicas);
    let mut sum = 0u64;
    let t = Instant::now();
    for x in 0..n {
        mapper.do_rule(&mut ws, 0, x, replicas, weights, &mut out)?;
        sum = out
            .iter()
            .fold(sum, |a, &d| a.wrapping_mul(31).wrapping_add(d as u64));
    }
    Ok((n as f64 / t.elapsed().as_secs_f64(), sum))
}

fn all_threads(
    mapper: &Mapper<'_>,
    n: i32,
    replicas: usize,
    weights: &[u32],
    threads: usize,
) -> anyhow::Result<(f64, u64)> {
    let t = Instant::now();
    let r = map_range(mapper, 0, 0..=n - 1, replicas, weights, threads)?;
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let sum = (0..r.len()).fold(0u64, |a, i| {
        r.get(i)
            .iter()
            .fold(a, |a, &d| a.wrapping_mul(31).wrapping_add(d as u64))
    });
    Ok((rate, sum))
}

fn test_options(replicas: usize, last: i32) -> TestOptions {
    TestOptions {
        min_rule: 0,
        max_rule: 0,
        min_rep: replicas as i32,
        max_rep: replicas as i32,
        min_x: 0,
        max_x: last,
        show_mappings: true,
        ..TestOptions::default()
    }
}

/// Checks kura's lines against crushtool's for the first inputs of a map.
fn check_lines(tool: &Path, path: &Path, map: &CrushMap, replicas: usize) -> anyhow::Result<()> {
    let last = 999;
    let want = crushtool_ok(tool, &test_args(path, replicas, last, "--show-mappings"))?;
    let mut got = Vec::new();
    run_test(
        map,
        &test_options(replicas, last),
        &mut got,
        &mut std::io::sink(),
    )?;
    if got != want {
        bail!(
            "kura's mappings differ from crushtool's on {} (x 0..={last})",
            path.display()
        );
    }
    Ok(())
}

fn measure_map(
    args: &CrushBenchArgs,
    dir: &Path,
    alg: &str,
    osds: usize,
    n: i32,
    rounds: usize,
    counts: &[usize],
) -> anyhow::Result<MapPoint> {
    let threads = counts.iter().copied().max().unwrap_or(1);
    let tool = &args.crushtool;
    let replicas = args.replicas;
    let path = dir.join(format!("{alg}-{osds}"));
    let (layers, hosts) = build_layers(alg, osds);
    let mut build = vec!["--build".to_string(), "--num_osds".into(), osds.to_string()];
    build.extend(layers);
    build.extend(["-o".to_string(), path.display().to_string()]);
    crushtool_ok(tool, &build)?;
    let map = kura_crush::load(&std::fs::read(&path)?)
        .with_context(|| format!("loading {}", path.display()))?;
    check_lines(tool, &path, &map, replicas)?;
    let weights = map.default_weights();
    let simd = Mapper::for_test(&map);
    let scalar = Mapper::for_test(&map).without_avx2();
    let last = n - 1;
    let mappings_args = test_args(&path, replicas, last, "--show-mappings");
    let stats_args = test_args(&path, replicas, last, "--show-statistics");
    let startup_args = test_args(&path, replicas, 0, "--show-statistics");
    let opts = test_options(replicas, last);
    let startup = std::cell::RefCell::new(Vec::new());
    let shared = std::cell::Cell::new(None::<u64>);
    let agree = |sum: u64| -> anyhow::Result<()> {
        match shared.get() {
            None => shared.set(Some(sum)),
            Some(r) if r != sum => bail!("kura's mapper modes disagree on {alg}-{osds}"),
            Some(_) => {}
        }
        Ok(())
    };
    let mut scalar_1t = |_| -> anyhow::Result<f64> {
        let (r, s) = one_thread(&scalar, n, replicas, &weights)?;
        agree(s)?;
        Ok(r)
    };
    let simd_cpu = std::cell::RefCell::new(Vec::new());
    let stats_cpu = std::cell::RefCell::new(Vec::new());
    let mut simd_1t = |_| -> anyhow::Result<f64> {
        let c0 = cpu_seconds().0;
        let (r, s) = all_threads(&simd, n, replicas, &weights, 1)?;
        simd_cpu
            .borrow_mut()
            .push(cpu_rate(n, cpu_seconds().0 - c0));
        agree(s)?;
        Ok(r)
    };
    let mut scalar_all = |_| -> anyhow::Result<f64> {
        let (r, s) = all_threads(&scalar, n, replicas, &weights, threads)?;
        agree(s)?;
        Ok(r)
    };
    let mut simd_all = |_| -> anyhow::Result<f64> {
        let (r, s) = all_threads(&simd, n, replicas, &weights, threads)?;
        agree(s)?;
        Ok(r)
    };
    let mut lines = |_| -> anyhow::Result<f64> {
        let t = Instant::now();
        run_test(&map, &opts, &mut std::io::sink(), &mut std::io::sink())?;
        Ok(n as f64 / t.elapsed().as_secs_f64())
    };
    // crushtool as a whole process, less the same process for one input (its start-up and
    // map load) timed next to it; at least a millisecond of mapping is assumed, so a start-up
    // slower than usual in one round cannot give an absurd rate.
    let ct = |show: &[String], cpu: Option<&std::cell::RefCell<Vec<f64>>>| -> anyhow::Result<f64> {
        let c0 = cpu_seconds().1;
        let base = time_process(tool, &startup_args)?;
        let c1 = cpu_seconds().1;
        let whole = time_process(tool, show)?;
        let c2 = cpu_seconds().1;
        startup.borrow_mut().push(base);
        if let Some(cpu) = cpu {
            cpu.borrow_mut().push(cpu_rate(n, (c2 - c1) - (c1 - c0)));
        }
        Ok(n as f64 / (whole - base).max(1e-3))
    };
    let mut ct_mappings = |_| ct(&mappings_args, None);
    let mut ct_stats = |_| ct(&stats_args, Some(&stats_cpu));
    let mut scaling: Vec<_> = counts
        .iter()
        .map(|&t| {
            let (simd, weights, agree) = (&simd, &weights, &agree);
            move |_| -> anyhow::Result<f64> {
                let (r, s) = all_threads(simd, n, replicas, weights, t)?;
                agree(s)?;
                Ok(r)
            }
        })
        .collect();
    let mut sides: Vec<&mut dyn FnMut(usize) -> anyhow::Result<f64>> = vec![
        &mut scalar_1t,
        &mut simd_1t,
        &mut scalar_all,
        &mut simd_all,
        &mut lines,
        &mut ct_mappings,
        &mut ct_stats,
    ];
    for side in scaling.iter_mut() {
        sides.push(side);
    }
    let taken = interleave(rounds, &mut sides)?;
    drop(sides);
    let startup_spread = Spread::of(&startup.take());
    let (simd_cpu, stats_cpu) = (simd_cpu.take(), stats_cpu.take());
    let sides: Vec<SidePoint> = SIDES
        .iter()
        .zip(&taken)
        .map(|(s, v)| SidePoint {
            side: s.to_string(),
            mappings_per_s: Spread::of(v),
        })
        .collect();
    let at_least_2 = (alg == "straw2").then_some(Goal::AtLeast(2.0));
    Ok(MapPoint {
        alg: alg.to_string(),
        osds,
        hosts,
        build: format!("{} {}", tool.display(), build.join(" ")),
        sides,
        crushtool_startup_s: startup_spread,
        simd_1t_vs_statistics: compare(&taken[1], &taken[6], quotient, at_least_2),
        scalar_1t_vs_statistics: compare(&taken[0], &taken[6], quotient, None),
        simd_all_vs_statistics: compare(&taken[3], &taken[6], quotient, None),
        lines_vs_show_mappings: compare(&taken[4], &taken[5], quotient, None),
        simd_1t_vs_statistics_cpu: compare(&simd_cpu, &stats_cpu, quotient, None),
        scaling: counts
            .iter()
            .enumerate()
            .map(|(k, &t)| ScalingPoint {
                threads: t,
                mappings_per_s: Spread::of(&taken[SIDES.len() + k]),
                vs_first: compare(&taken[SIDES.len() + k], &taken[SIDES.len()], quotient, None),
            })
            .collect(),
    })
}

/// Runs `kura bench crush`.
pub fn run(args: &CrushBenchArgs) -> anyhow::Result<()> {
    let quick = args.run.quick;
    let n = args.inputs.unwrap_or(if quick { 20_000 } else { 200_000 });
    if n < 1 {
        bail!("--inputs must be at least 1");
    }
    if args.replicas == 0 || args.replicas > 16 {
        bail!("--replicas must be 1..=16");
    }
    let osds = args.osds.clone().unwrap_or(if quick {
        vec![10, 100]
    } else {
        vec![10, 100, 1000]
    });
    if osds.iter().any(|&o| !(2..=100_000).contains(&o)) {
        bail!("--osds sizes must be 2..=100000");
    }
    let algs: Vec<String> = args
        .algs
        .clone()
        .unwrap_or_else(|| ALGS.iter().map(|s| s.to_string()).collect());
    if let Some(a) = algs.iter().find(|a| !ALGS.contains(&a.as_str())) {
        bail!("unknown algorithm {a} (one of {})", ALGS.join(", "));
    }
    let cores = std::thread::available_parallelism().map_or(1, |v| v.get());
    let counts = match &args.threads {
        Some(list) if list.is_empty() || list.contains(&0) || list.iter().any(|&t| t > 1024) => {
            bail!("--threads takes thread counts of 1 to 1024")
        }
        Some(list) => list.clone(),
        None => {
            let mut list: Vec<usize> = std::iter::successors(Some(1usize), |t| Some(t * 2))
                .take_while(|&t| t < cores)
                .collect();
            list.push(cores);
            list
        }
    };
    let threads = counts.iter().copied().max().unwrap_or(1);
    let rounds = crate::stats::rounds(args.rounds, quick, 1);
    let dir = tempfile::tempdir()?;
    // The AVX2 kernel exists only on x86-64; elsewhere (aarch64) the fast path is scalar.
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    println!(
        "CRUSH mappings/s (millions), rule 0 chooseleaf firstn over hosts, {} replicas, x = 0..{}, \
         {threads} threads for allT, AVX2 {}; median [min-max] of {rounds} interleaved round(s); \
         crushtool timed as a process less its start-up",
        args.replicas,
        n - 1,
        if avx2 { "yes" } else { "no" }
    );
    println!(
        "{:<8} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>15} {:>15} {:>15}",
        "alg",
        "osds",
        "scalar 1T",
        "simd 1T",
        "scalar allT",
        "simd allT",
        "lines 1T",
        "ct mappings",
        "ct stats",
        "simd1T/ct stats",
        "lines/ct mapp.",
        "simd1T/stats cpu"
    );
    let mut maps = Vec::new();
    for &o in &osds {
        for alg in &algs {
            let p = measure_map(args, dir.path(), alg, o, n, rounds, &counts)?;
            let m = |i: usize| p.sides[i].mappings_per_s.scaled(1e-6).show(2);
            println!(
                "{:<8} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>15} {:>15} {:>15}",
                alg,
                o,
                m(0),
                m(1),
                m(2),
                m(3),
                m(4),
                m(5),
                m(6),
                p.simd_1t_vs_statistics.ratio.show(2),
                p.lines_vs_show_mappings.ratio.show(2),
                p.simd_1t_vs_statistics_cpu.ratio.show(2)
            );
            let scaling: Vec<String> = p
                .scaling
                .iter()
                .map(|s| {
                    format!(
                        "{}T {} ({}x)",
                        s.threads,
                        s.mappings_per_s.scaled(1e-6).show(2),
                        s.vs_first.ratio.show(2)
                    )
                })
                .collect();
            println!("         scaling (simd, batch API): {}", scaling.join(", "));
            if let Some(v) = p.simd_1t_vs_statistics.verdict {
                println!(
                    "         straw2 target: simd 1T >= 2x crushtool on one core: {}",
                    v.word()
                );
            }
            maps.push(p);
        }
    }
    let tool = args.crushtool.display().to_string();
    let report = CrushReport {
        inputs: n,
        replicas: args.replicas,
        rule: 0,
        threads,
        thread_counts: counts.clone(),
        cores,
        rounds,
        avx2,
        cpu: crate::stats::cpu_model(),
        crushtool: tool.clone(),
        crushtool_version: crushtool_version(),
        peer_commands: ["--show-mappings", "--show-statistics"]
            .iter()
            .map(|show| {
                format!(
                    "{tool} -i MAP --test --rule 0 --num-rep {} --min-x 0 --max-x {} {show} \
                 (less: the same with --max-x 0 --show-statistics)",
                    args.replicas,
                    n - 1
                )
            })
            .collect(),
        maps,
    };
    args.run.output.emit("crush", PLOT, &report)
}

/// The Ceph package version crushtool comes from, where dpkg knows it.
fn crushtool_version() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "ceph-base"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| format!("ceph-base {}", String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_give_at_least_three_hosts_and_small_buckets() {
        for osds in [10, 100, 1000, 5000] {
            let (args, hosts) = build_layers("straw2", osds);
            let per_host: usize = args[2].parse().unwrap();
            let per_rack: usize = args[5].parse().unwrap();
            assert!(hosts >= 3, "{osds}: {hosts} hosts");
            assert!(per_host * hosts >= osds);
            assert!(per_host <= 40 && per_rack <= 10, "{args:?}");
            assert!(hosts.div_ceil(per_rack) <= 64, "tree buckets hold 64 items");
        }
    }

    #[test]
    fn a_quick_run_measures_every_side_against_crushtool() {
        if kura_testkit::which("crushtool").is_none() {
            kura_testkit::skip(
                "a_quick_run_measures_every_side_against_crushtool",
                "crushtool",
                "Ceph's crushtool is not installed (apt-get install ceph-base)",
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("crush.json");
        let args = CrushBenchArgs {
            inputs: Some(2000),
            osds: Some(vec![10]),
            algs: Some(vec!["straw2".into(), "tree".into()]),
            replicas: 3,
            threads: Some(vec![1, 2]),
            rounds: Some(2),
            crushtool: "crushtool".into(),
            run: RunArgs {
                quick: true,
                output: crate::output::OutputArgs {
                    json: Some(json.clone()),
                    plot: Some(dir.path().join("crush.png")),
                    no_plot: false,
                },
            },
        };
        run(&args).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        let maps = v["maps"].as_array().unwrap();
        assert_eq!(maps.len(), 2);
        for m in maps {
            let sides = m["sides"].as_array().unwrap();
            assert_eq!(sides.len(), SIDES.len());
            for s in sides {
                assert_eq!(s["mappings_per_s"]["rounds"], 2, "{s}");
                assert!(s["mappings_per_s"]["median"].as_f64().unwrap() > 0.0, "{s}");
            }
            assert!(m["build"].as_str().unwrap().contains("--build"));
            let scaling = m["scaling"].as_array().unwrap();
            assert_eq!(scaling.len(), 2);
            assert_eq!(scaling[1]["threads"], 2);
            assert!(scaling[1]["mappings_per_s"]["median"].as_f64().unwrap() > 0.0);
        }
        assert!(v["peer_commands"][0]
            .as_str()
            .unwrap()
            .contains("--show-mappings"));
        assert_eq!(
            maps[0]["simd_1t_vs_statistics"]["ratio"]["rounds"], 2,
            "straw2 is judged round by round"
        );
    }
}
