//! A smoke run of every `kura bench` subcommand with `--quick` and the smallest sizes: each one
//! must finish, write its JSON, and record its peers configured as the issue asks (fio with and
//! without registered files and buffers, qemu-nbd with multi-conn and io_uring, RocksDB with
//! LevelDB's memtable and bloom filter, minimap2 against kura's process wall time), with the
//! file system of `--dir` named and every verdict one of the three words.
//!
//! A peer that is not installed is skipped through `kura_testkit::skip` (scripts/setup.sh
//! installs them all).

mod common;

use serde_json::Value;

/// Runs `kura bench NAME ARGS --dir D --json D/NAME.json --plot D/NAME.png` in a fresh dir and
/// returns its JSON and stdout.
fn bench(name: &str, args: &[&str]) -> (Value, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let json = d.join(format!("{name}.json"));
    let plot = d.join(format!("{name}.png"));
    let mut all: Vec<String> = vec!["bench".into(), name.into()];
    all.extend(args.iter().map(|a| a.to_string()));
    if name != "crc" {
        all.extend(["--dir".into(), d.display().to_string()]);
    }
    all.extend([
        "--json".into(),
        json.display().to_string(),
        "--plot".into(),
        plot.display().to_string(),
    ]);
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = common::ok(&refs);
    let text = std::fs::read_to_string(&json).expect("the bench wrote its JSON");
    (serde_json::from_str(&text).expect("valid JSON"), out)
}

fn has(tool: &str) -> bool {
    kura_testkit::which(tool).is_some()
}

fn python_module(m: &str) -> bool {
    std::process::Command::new("python3")
        .args(["-c", &format!("import {m}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The file system named in a report is a real name, not a fallback.
fn named_fs(v: &Value) {
    let fs = v["file_system"].as_str().expect("file_system");
    assert!(!fs.is_empty() && !fs.starts_with("unknown"), "{fs}");
}

fn verdicts_are_words(ratios: &Value) {
    for r in ratios.as_array().into_iter().flatten() {
        if let Some(v) = r["verdict"].as_str() {
            assert!(["met", "not_met", "within_noise"].contains(&v), "{v}");
        }
    }
}

#[test]
fn bench_io_compares_uring_with_both_fio_configurations() {
    let (v, out) = bench(
        "io",
        &[
            "--quick",
            "--size",
            "16M",
            "--seconds",
            "0.02",
            "--rounds",
            "2",
            "--backends",
            "uring,redirect,null",
        ],
    );
    named_fs(&v);
    assert_eq!(v["rounds"], 2);
    assert_eq!(v["null_rounds"].as_array().unwrap().len(), 2);
    let null = v["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["what"].as_str().unwrap().starts_with("null device"))
        .expect("null device line");
    assert!(null["peer"].is_null(), "no constant stored as the peer");
    verdicts_are_words(&v["ratios"]);
    if !has("fio") {
        return kura_testkit::skip(
            "bench_io_compares_uring_with_both_fio_configurations",
            "fio",
            "fio is not installed",
        );
    }
    let runs = v["fio_runs"].as_array().unwrap();
    let registered: Vec<&Value> = runs.iter().filter(|r| r["registered"] == true).collect();
    assert!(!registered.is_empty() && registered.len() * 2 == runs.len());
    for r in &registered {
        let cmd = r["command"].as_str().unwrap();
        assert!(cmd.contains("--registerfiles --fixedbufs"), "{cmd}");
    }
    for h in v["head_to_head"].as_array().unwrap() {
        assert_eq!(h["kura"].as_array().unwrap().len(), 2, "two rounds");
        assert_eq!(h["fio"].as_array().unwrap().len(), 2);
        assert_eq!(h["fio_registered"].as_array().unwrap().len(), 2);
    }
    assert!(out.contains("fio registered"), "{out}");
    let qd32 = v["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["what"] == "4K randread QD32 IOPS, uring/fio")
        .expect("the QD32 target line");
    assert!(qd32["verdict"].is_string());
    assert!(qd32["peer_name"].as_str().unwrap().starts_with("fio"));
}

#[test]
fn bench_crc_runs() {
    let (v, _) = bench("crc", &["--seconds", "0.01"]);
    assert!(v.is_object() || v.is_array());
}

#[test]
fn bench_fs_names_the_host_file_system() {
    let (v, out) = bench("fs", &["--quick", "--no-redirect"]);
    named_fs(&v);
    let fs = v["file_system"].as_str().unwrap();
    assert!(out.contains(&format!("{fs} syscalls")), "{out}");
    assert_eq!(v["appends_rounds"].as_array().unwrap().len(), 2);
    assert!(v["appends_ratio"]["ratio"]["rounds"].as_u64().unwrap() >= 1);
}

#[test]
fn bench_kv_gives_rocksdb_leveldbs_settings() {
    let mut args = vec![
        "--quick",
        "--workloads",
        "fillrandom,ycsb-a",
        "--records",
        "300",
        "--ops",
        "300",
        "--systems",
        "accelfs,posix,rocksdb",
    ];
    let rocks = python_module("rocksdict");
    if !rocks {
        args[8] = "accelfs,posix";
    }
    let (v, _) = bench("kv", &args);
    named_fs(&v);
    let settings = v["settings"].as_array().unwrap();
    let leveldb = &settings[0];
    assert_eq!(leveldb["bloom_bits_per_key"], 10);
    assert_eq!(leveldb["compression"], false);
    assert!(!v["ratios"].as_array().unwrap().is_empty());
    if !rocks {
        return kura_testkit::skip(
            "bench_kv_gives_rocksdb_leveldbs_settings",
            "rocksdict",
            "the Python module rocksdict is not installed",
        );
    }
    let r = settings
        .iter()
        .find(|s| s["system"].as_str().unwrap().starts_with("RocksDB/"))
        .expect("RocksDB's settings");
    assert_eq!(r["write_buffer_bytes"], leveldb["write_buffer_bytes"]);
    assert_eq!(r["block_cache_bytes"], leveldb["block_cache_bytes"]);
    let recorded: Vec<&str> = r["options_file"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let wb = format!("write_buffer_size={}", leveldb["write_buffer_bytes"]);
    assert!(recorded.contains(&wb.as_str()), "{recorded:?}");
    assert!(
        recorded
            .iter()
            .any(|l| l.starts_with("filter_policy=bloomfilter")),
        "{recorded:?}"
    );
    assert!(
        recorded.contains(&"compression=kNoCompression"),
        "{recorded:?}"
    );
    assert!(r["command"]
        .as_str()
        .unwrap()
        .contains("--write-buffer-bytes"));
}

#[test]
fn bench_drives_configures_qemu_nbd_like_kura() {
    let (v, _) = bench("drives", &["--quick", "--size", "16M", "--seconds", "0.02"]);
    named_fs(&v);
    assert!(!v["layers"].as_array().unwrap().is_empty());
    for l in v["layers"].as_array().unwrap() {
        assert!(l["overhead_range"]["rounds"].as_u64().unwrap() >= 1);
    }
    if !(has("nbdcopy") && has("qemu-nbd") && has("nbdkit")) {
        return kura_testkit::skip(
            "bench_drives_configures_qemu_nbd_like_kura",
            "nbd-peers",
            "nbdcopy, qemu-nbd or nbdkit is not installed",
        );
    }
    let nbd = v["nbd"].as_array().unwrap();
    assert_eq!(nbd.len(), 3, "{v}");
    let qemu = nbd[1]["command"].as_str().unwrap();
    for flag in ["-e 4", "--aio=io_uring", "--cache=none"] {
        assert!(qemu.contains(flag), "{qemu}");
    }
    assert!(nbd[2]["command"].as_str().unwrap().contains("cache=none"));
    assert!(nbd[0]["client_command"]
        .as_str()
        .unwrap()
        .contains("--connections=4"));
    assert_eq!(v["nbd_ratios"].as_array().unwrap().len(), 2);
}

#[test]
fn bench_genome_compares_process_wall_times() {
    let (v, _) = bench(
        "genome",
        &["--quick", "--reads", "1000", "--paths", "accelfs"],
    );
    named_fs(&v);
    let systems = v["systems"].as_array().unwrap();
    let kura = &systems[0];
    assert!(kura["pipeline_seconds"].as_f64().unwrap() > 0.0);
    assert!(
        kura["seconds"].as_f64().unwrap() >= kura["pipeline_seconds"].as_f64().unwrap(),
        "the process wall time holds the pipeline"
    );
    assert!(kura["command"].as_str().unwrap().contains("genome"));
    if !has("minimap2") {
        return kura_testkit::skip(
            "bench_genome_compares_process_wall_times",
            "minimap2",
            "minimap2 is not installed",
        );
    }
    assert!(systems.iter().any(|s| s["label"] == "minimap2"));
    let vs = v["versus_minimap2"].as_array().unwrap();
    assert_eq!(vs.len(), 1);
    assert!(vs[0][1]["ratio"]["median"].as_f64().unwrap() > 0.0);
    assert!(!v["minimap2_version"].as_str().unwrap_or("").is_empty());
}
