//! Mapper speed against `crushtool --test` on the same map, rule and inputs.
//!
//! For each bucket algorithm it builds a 3-level map with crushtool (`--num_osds 120 host ALG
//! 10 rack ALG 4 root ALG 0`: 120 devices, 12 hosts, 3 racks, one root), times crushtool
//! mapping x = 0..N with rule 0 (chooseleaf firstn over hosts) and 3 replicas (its own
//! process, `--show-statistics` so that it maps without printing every line), then kura's
//! scalar mapper on one thread and the batch mapper on 1..T threads, checks that every kura
//! result equals the batch result, and prints mappings per second.
//!
//! `cargo run --release -p kura-crush --example mapper_bench -- [N] [THREADS] [ALG,...]`
//! (defaults: N = 1000000, THREADS = all cores, every algorithm).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kura_crush::{decode, map_range, Mapper, Workspace};

/// (user + system CPU seconds of this process, of its waited-for children), from
/// /proc/self/stat, so rates can be computed from CPU time on a loaded machine.
fn cpu_times() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime is field 14 of the whole line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let tick = 100.0; // USER_HZ on Linux
    let get = |i: usize| f.get(i).copied().unwrap_or(0.0) / tick;
    // rest[0] is field 3 (state): utime = field 14 -> index 11.
    (get(11) + get(12), get(13) + get(14))
}

fn crushtool(args: &[&str]) -> std::process::Output {
    let out = Command::new("crushtool")
        .args(args)
        .output()
        .expect("crushtool runs (apt-get install ceph-base)");
    assert!(
        out.status.success(),
        "crushtool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let n: i32 = argv
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let cores = std::thread::available_parallelism().map_or(1, |v| v.get());
    let threads: usize = argv.next().and_then(|v| v.parse().ok()).unwrap_or(cores);
    let only: Option<String> = argv.next();
    let dir = tempfile::tempdir().expect("tempdir");
    println!("x = 0..{}, rule 0 (chooseleaf firstn 0 type host), 3 replicas, 120 OSDs / 12 hosts / 3 racks", n - 1);
    println!("wall-clock rates (best of 3), then CPU-time rates (best of 3; immune to other load)");
    println!(
        "{:<8} {:>12} {:>12} {:>7} {:>12} {:>12} {:>7}  kura batch (wall) by threads",
        "alg", "crushtool", "kura 1T", "ratio", "crushtool", "kura 1T", "ratio"
    );
    for alg in ["straw2", "straw", "list", "tree", "uniform"] {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|a| a == alg))
        {
            continue;
        }
        let map = dir.path().join(alg);
        let m = map.to_str().expect("utf-8 path");
        crushtool(&[
            "--build",
            "--num_osds",
            "120",
            "host",
            alg,
            "10",
            "rack",
            alg,
            "4",
            "root",
            alg,
            "0",
            "-o",
            m,
        ]);
        let max_x = (n - 1).to_string();
        // crushtool: best of three runs of its own process, wall and CPU time.
        let mut best = f64::MAX;
        let mut best_cpu = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            let c0 = cpu_times().1;
            crushtool(&[
                "-i",
                m,
                "--test",
                "--rule",
                "0",
                "--num-rep",
                "3",
                "--min-x",
                "0",
                "--max-x",
                &max_x,
                "--show-statistics",
            ]);
            best = best.min(t.elapsed().as_secs_f64());
            best_cpu = best_cpu.min(cpu_times().1 - c0);
        }
        let ct_rate = n as f64 / best;
        let ct_cpu_rate = n as f64 / best_cpu;
        let cmap = decode(&std::fs::read(Path::new(&map)).expect("read map")).expect("decode");
        let weights = cmap.default_weights();
        let mapper = Mapper::for_test(&cmap);
        // Scalar, one thread, best of three.
        let mut ws = Workspace::new();
        let mut out = Vec::with_capacity(3);
        let mut best1 = f64::MAX;
        let mut best1_cpu = f64::MAX;
        let mut check = 0u64;
        for _ in 0..3 {
            let t = Instant::now();
            let c0 = cpu_times().0;
            for x in 0..n {
                mapper
                    .do_rule(&mut ws, 0, x, 3, &weights, &mut out)
                    .expect("rule 0");
                check = check.wrapping_add(out.iter().map(|&d| d as u64).sum::<u64>());
            }
            best1 = best1.min(t.elapsed().as_secs_f64());
            best1_cpu = best1_cpu.min(cpu_times().0 - c0);
        }
        let k1 = n as f64 / best1;
        let k1_cpu = n as f64 / best1_cpu;
        let mut by_threads = Vec::new();
        let mut t = 1;
        while t <= threads {
            let mut bestb = f64::MAX;
            for _ in 0..3 {
                let s = Instant::now();
                let r = map_range(&mapper, 0, 0..=n - 1, 3, &weights, t).expect("batch");
                bestb = bestb.min(s.elapsed().as_secs_f64());
                let sum: u64 = (0..r.len())
                    .map(|i| r.get(i).iter().map(|&d| d as u64).sum::<u64>())
                    .fold(0u64, |a, b| a.wrapping_add(b));
                assert_eq!(
                    sum.wrapping_mul(3),
                    check,
                    "batch and scalar results differ"
                );
            }
            by_threads.push(format!("{t}T {:.2}M", n as f64 / bestb / 1e6));
            t *= 2;
        }
        println!(
            "{:<8} {:>11.2}M {:>11.2}M {:>6.2}x {:>11.2}M {:>11.2}M {:>6.2}x  {}",
            alg,
            ct_rate / 1e6,
            k1 / 1e6,
            k1 / ct_rate,
            ct_cpu_rate / 1e6,
            k1_cpu / 1e6,
            k1_cpu / ct_cpu_rate,
            by_threads.join("  ")
        );
    }
}
