//! Smoke run of `kura bench fs --threads 1,2 --quick` through the library: the JSON report has a
//! point per system, workload and thread count that did work, ratios for every pair, and the
//! plot is drawn when matplotlib is there. Nothing here depends on timing.

use clap::{Args, FromArgMatches};
use kura_bench::fs::FsBenchArgs;
use serde_json::Value;

fn parse(argv: &[&str]) -> Result<FsBenchArgs, clap::Error> {
    let cmd = FsBenchArgs::augment_args(clap::Command::new("fs").no_binary_name(true));
    FsBenchArgs::from_arg_matches(&cmd.try_get_matches_from(argv)?)
}

#[test]
fn threads_quick_reports_a_point_per_system_workload_and_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out/fs-threads.json");
    let png = dir.path().join("out/fs-threads.png");
    let args = parse(&[
        "--threads",
        "1,2",
        "--quick",
        "--dir",
        dir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ])
    .unwrap();
    kura_bench::fs::run(&args).unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["bench"], "fs-threads");
    let fs = v["file_system"].as_str().unwrap();
    assert!(!fs.is_empty() && !fs.starts_with("unknown"), "{fs}");
    let systems: Vec<&str> = v["systems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(systems, ["AccelFS".to_string(), format!("{fs} syscalls")]);
    let workloads: Vec<&str> = v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(
        workloads,
        ["read own", "read shared", "fsync append", "metadata"]
    );
    assert_eq!(v["threads"], serde_json::json!([1, 2]));
    assert_eq!(v["rounds"], 1, "--quick runs one round");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), systems.len() * workloads.len() * 2);
    for s in &systems {
        for w in &workloads {
            for n in [1, 2] {
                let p = points
                    .iter()
                    .find(|p| p["system"] == *s && p["workload"] == *w && p["threads"] == n)
                    .unwrap_or_else(|| panic!("no point for {s} {w} {n}"));
                // Every thread does at least one operation, so each point has a positive rate.
                assert!(p["ops_per_s"]["median"].as_f64().unwrap() > 0.0, "{p}");
                assert_eq!(p["rounds_ops_per_s"].as_array().unwrap().len(), 1);
                assert_eq!(p["scaling"]["rounds"], 1, "{p}");
                // CPU time is measured for every point (its value is not asserted: timing).
                assert_eq!(p["cores_used"]["rounds"], 1, "{p}");
                assert!(p["ops_per_cpu_s"].is_object(), "{p}");
                if n == 1 {
                    assert_eq!(p["scaling"]["median"], 1.0, "{p}");
                }
                let group = *s == "AccelFS" && *w == "fsync append";
                assert_eq!(p["commits"].is_u64(), group, "{p}");
                if group {
                    // Every fsync'd append was made durable by some commit; commits were shared
                    // or not, so at most one per fsync.
                    let (c, f) = (
                        p["commits"].as_u64().unwrap(),
                        p["fsyncs"].as_u64().unwrap(),
                    );
                    assert!(c >= 1 && f >= n, "{p}");
                }
            }
        }
    }
    let versus = v["versus"].as_array().unwrap();
    assert_eq!(versus.len(), workloads.len() * 2);
    for x in versus {
        assert!(
            x["accelfs_over_host"]["ratio"]["median"].as_f64().unwrap() > 0.0,
            "{x}"
        );
    }
    let has_matplotlib = std::process::Command::new("python3")
        .args(["-c", "import matplotlib"])
        .status()
        .is_ok_and(|s| s.success());
    if has_matplotlib {
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
    // Nothing is left behind in --dir but the output folder.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["out"]);
}

#[test]
fn bad_thread_lists_are_refused_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    for list in ["0", "1,x", "2000"] {
        let args = parse(&[
            "--threads",
            list,
            "--dir",
            dir.path().to_str().unwrap(),
            "--plot",
            dir.path().join("p.png").to_str().unwrap(),
        ])
        .unwrap();
        let err = kura_bench::fs::run(&args).unwrap_err().to_string();
        assert!(err.contains("--threads"), "{list}: {err}");
    }
    let args = parse(&["--threads", "1", "--thread-secs", "0"]).unwrap();
    let err = kura_bench::fs::run(&args).unwrap_err().to_string();
    assert!(err.contains("--thread-secs"), "{err}");
    // `--threads` alone is 1,2,4.
    let args = parse(&["--threads", "--quick"]).unwrap();
    assert_eq!(args.threads.threads.as_deref(), Some("1,2,4"));
    assert!(args.run.quick);
    assert!(parse(&[]).unwrap().threads.threads.is_none());
}
