//! A smoke run of every `kura bench` subcommand with `--quick` at the smallest sizes, through
//! `kura bench all --quick` (which runs each of them in turn, with the same `run` as `kura bench
//! NAME`). Each must finish and write its JSON, record
//! its peers configured as issue 20 asks (fio with and without registered files and buffers,
//! qemu-nbd with multi-conn and io_uring, RocksDB with LevelDB's memtable and bloom filter, LMDB
//! and kura's native store beside them,
//! minimap2 against kura's process wall time), name the file system of `--dir`, and use only
//! the three verdict words; the report must have every section, each with data or a reason, and
//! each with the paper's numbers beside kura's labelled ones or a note why the paper has none.
//!
//! A peer that is not installed is skipped through `kura_testkit::skip` (scripts/setup.sh
//! installs them all).

mod common;

use serde_json::Value;

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

fn check_io(v: &Value) {
    named_fs(v);
    let rounds = v["rounds"].as_u64().expect("rounds") as usize;
    assert!(rounds >= 1);
    assert_eq!(
        v["null_rounds"]
            .as_array()
            .expect("as the bench writes it")
            .len(),
        rounds
    );
    let null = v["ratios"]
        .as_array()
        .expect("as the bench writes it")
        .iter()
        .find(|r| {
            r["what"]
                .as_str()
                .expect("as the bench writes it")
                .starts_with("null device")
        })
        .expect("null device line");
    assert!(null["peer"].is_null(), "no constant stored as the peer");
    verdicts_are_words(&v["ratios"]);
    if !has("fio") {
        return kura_testkit::skip(
            "bench_all_quick_runs_every_benchmark",
            "fio",
            "fio is not installed",
        );
    }
    let runs = v["fio_runs"].as_array().expect("as the bench writes it");
    let registered: Vec<&Value> = runs.iter().filter(|r| r["registered"] == true).collect();
    assert!(!registered.is_empty() && registered.len() * 2 == runs.len());
    for r in &registered {
        let cmd = r["command"].as_str().expect("as the bench writes it");
        assert!(cmd.contains("--registerfiles --fixedbufs"), "{cmd}");
    }
    for h in v["head_to_head"]
        .as_array()
        .expect("as the bench writes it")
    {
        for side in ["kura", "fio", "fio_registered"] {
            let n = h[side].as_array().expect("as the bench writes it").len();
            assert_eq!(n, rounds, "{side}: one point per round");
        }
    }
    let qd32 = v["ratios"]
        .as_array()
        .expect("as the bench writes it")
        .iter()
        .find(|r| r["what"] == "4K randread QD32 IOPS, uring/fio")
        .expect("the QD32 target line");
    assert!(qd32["verdict"].is_string());
    assert!(qd32["peer_name"]
        .as_str()
        .expect("as the bench writes it")
        .starts_with("fio"));
}

fn check_crc(v: &Value) {
    let points = v.as_array().expect("crc points");
    assert!(points
        .iter()
        .all(|p| p["gib_per_s"].as_f64().expect("as the bench writes it") > 0.0));
    // Rounds like the other benchmarks: a range per point, and kura's folding against the crate.
    for p in points {
        assert!(
            p["range"]["rounds"]
                .as_u64()
                .expect("as the bench writes it")
                >= 1
        );
    }
    assert!(points
        .iter()
        .any(|p| p["method"] == "folding (crc-fast)" && p["versus_crate"]["ratio"].is_object()));
}

fn check_fs(v: &Value) {
    named_fs(v);
    let fs = v["file_system"].as_str().expect("as the bench writes it");
    let host = format!("{fs} syscalls");
    assert!(v["latency"]
        .as_array()
        .expect("as the bench writes it")
        .iter()
        .any(|p| p["system"] == host.as_str()));
    assert_eq!(
        v["appends_rounds"]
            .as_array()
            .expect("as the bench writes it")
            .len(),
        3
    );
    assert!(
        v["appends_ratio"]["ratio"]["rounds"]
            .as_u64()
            .expect("as the bench writes it")
            >= 1
    );
}

/// The points of `system` in a kv report: one per workload, each with sane figures.
fn kv_points<'a>(v: &'a Value, system: &str) -> Vec<&'a Value> {
    let points: Vec<&Value> = v["points"]
        .as_array()
        .expect("as the bench writes it")
        .iter()
        .filter(|p| p["system"] == system)
        .collect();
    assert!(!points.is_empty(), "no points for {system}: {v}");
    for p in &points {
        let f = |k: &str| p[k].as_f64().expect("as the bench writes it");
        assert!(
            p["ops"].as_u64().expect("as the bench writes it") > 0,
            "{p}"
        );
        assert!(f("ops_per_s") > 0.0 && f("ops_per_s").is_finite(), "{p}");
        assert!(
            f("p50_us") <= f("p99_us") && f("p99_us") <= f("p999_us"),
            "{p}"
        );
    }
    points
}

fn check_kv(v: &Value) {
    named_fs(v);
    let fs = v["file_system"].as_str().expect("as the bench writes it");
    let settings = v["settings"].as_array().expect("as the bench writes it");
    let by_name = |name: &str| settings.iter().find(|s| s["system"] == name);
    let leveldb = by_name("LevelDB/AccelFS").expect("LevelDB on AccelFS");
    assert_eq!(leveldb["bloom_bits_per_key"], 10);
    assert_eq!(leveldb["compression"], false);
    let ratios = v["ratios"].as_array().expect("as the bench writes it");
    assert!(!ratios.is_empty());
    // The native store: same memtable as LevelDB, a point per workload, and its ratios.
    let native = by_name("kura-store/file").expect("the native store");
    assert_eq!(native["write_buffer_bytes"], leveldb["write_buffer_bytes"]);
    let workloads = kv_points(v, "LevelDB/AccelFS").len();
    assert_eq!(kv_points(v, "kura-store/file").len(), workloads);
    assert_eq!(kv_points(v, &format!("LevelDB/{fs}")).len(), workloads);
    let host_ratios = ratios
        .iter()
        .filter(|r| {
            r["what"]
                .as_str()
                .expect("as the bench writes it")
                .ends_with("(native/host)")
        })
        .count();
    assert_eq!(host_ratios, workloads, "{v}");
    let peer = |name: &str, engine: &str, package: &str| -> Option<&Value> {
        let Some(s) = by_name(name) else {
            let why = v["notes"].to_string();
            assert!(why.contains(&format!("{engine} skipped")), "{why}");
            kura_testkit::skip(
                "bench_all_quick_runs_every_benchmark",
                &format!("{engine}-peer"),
                &format!("g++ or {package} is not installed"),
            );
            return None;
        };
        assert_eq!(kv_points(v, name).len(), workloads);
        for p in kv_points(v, name) {
            assert!(p["process_seconds"].as_f64().expect("a peer process") > 0.0);
        }
        let commands = s["commands"].as_array().expect("as the bench writes it");
        assert!(!commands.is_empty(), "{s}");
        for c in commands {
            assert!(
                c.as_str().expect("a command line").contains("--trace"),
                "{c}"
            );
        }
        assert!(!s["config"].as_str().expect("its configuration").is_empty());
        Some(s)
    };
    if let Some(l) = peer(&format!("LMDB/{fs}"), "lmdb", "liblmdb-dev") {
        assert!(l["config"]
            .as_str()
            .expect("as the bench writes it")
            .contains("MDB_NORDAHEAD"));
    }
    let Some(r) = peer(&format!("RocksDB/{fs}"), "rocksdb", "librocksdb-dev") else {
        return;
    };
    let rocks_ratios = ratios
        .iter()
        .filter(|r| {
            r["what"]
                .as_str()
                .expect("as the bench writes it")
                .ends_with("(native/rocks)")
        })
        .count();
    assert_eq!(rocks_ratios, workloads, "{v}");
    assert_eq!(r["write_buffer_bytes"], leveldb["write_buffer_bytes"]);
    assert_eq!(r["block_cache_bytes"], leveldb["block_cache_bytes"]);
    let recorded: Vec<&str> = r["options_file"]
        .as_array()
        .expect("as the bench writes it")
        .iter()
        .map(|l| l.as_str().expect("as the bench writes it"))
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
        .expect("as the bench writes it")
        .contains("--write-buffer-bytes"));
}

fn check_drives(v: &Value) {
    named_fs(v);
    assert!(!v["layers"]
        .as_array()
        .expect("as the bench writes it")
        .is_empty());
    for l in v["layers"].as_array().expect("as the bench writes it") {
        assert!(
            l["overhead_range"]["rounds"]
                .as_u64()
                .expect("as the bench writes it")
                >= 1
        );
    }
    if !(has("nbdcopy") && has("qemu-nbd") && has("nbdkit")) {
        return kura_testkit::skip(
            "bench_all_quick_runs_every_benchmark",
            "nbd-peers",
            "nbdcopy, qemu-nbd or nbdkit is not installed",
        );
    }
    let nbd = v["nbd"].as_array().expect("as the bench writes it");
    assert_eq!(nbd.len(), 3, "{v}");
    let qemu = nbd[1]["command"].as_str().expect("as the bench writes it");
    for flag in ["-e 4", "--aio=io_uring", "--cache=none"] {
        assert!(qemu.contains(flag), "{qemu}");
    }
    assert!(nbd[2]["command"]
        .as_str()
        .expect("as the bench writes it")
        .contains("cache=none"));
    assert!(nbd[0]["client_command"]
        .as_str()
        .expect("as the bench writes it")
        .contains("--connections=4"));
    assert_eq!(
        v["nbd_ratios"]
            .as_array()
            .expect("as the bench writes it")
            .len(),
        2
    );
}

fn check_genome(v: &Value) {
    named_fs(v);
    let systems = v["systems"].as_array().expect("as the bench writes it");
    let kura = &systems[0];
    assert!(
        kura["pipeline_seconds"]
            .as_f64()
            .expect("as the bench writes it")
            > 0.0
    );
    assert!(
        kura["seconds"].as_f64().expect("as the bench writes it")
            >= kura["pipeline_seconds"]
                .as_f64()
                .expect("as the bench writes it"),
        "the process wall time holds the pipeline"
    );
    assert!(kura["command"]
        .as_str()
        .expect("as the bench writes it")
        .contains("genome"));
    if !has("minimap2") {
        return kura_testkit::skip(
            "bench_all_quick_runs_every_benchmark",
            "minimap2",
            "minimap2 is not installed",
        );
    }
    assert!(systems.iter().any(|s| s["label"] == "minimap2"));
    let vs = v["versus_minimap2"]
        .as_array()
        .expect("as the bench writes it");
    assert_eq!(vs.len(), 2, "accelfs and redirect against minimap2");
    assert!(
        vs[0][1]["ratio"]["median"]
            .as_f64()
            .expect("as the bench writes it")
            > 0.0
    );
    assert!(!v["minimap2_version"].as_str().unwrap_or("").is_empty());
}

#[test]
fn bench_all_quick_runs_every_benchmark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let out = d.join("report");
    common::ok(&[
        "bench",
        "all",
        "--quick",
        "--out",
        out.to_str().expect("as the bench writes it"),
        "--dir",
        d.to_str().expect("as the bench writes it"),
    ]);
    let json = |name: &str| -> Value {
        let text = std::fs::read_to_string(out.join(format!("{name}.json")))
            .unwrap_or_else(|e| panic!("{name}.json: {e}"));
        serde_json::from_str(&text).expect("valid JSON")
    };
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    let html = std::fs::read_to_string(out.join("report.html")).expect("report.html");
    for section in [
        "## Environment",
        "Hayagui Fig. 2",
        "Hayagui Fig. 5",
        "Hayagui Fig. 6 and 7",
        "YCSB by value size",
        "Hayagui Fig. 8 and Table 2",
        "CRC32C",
        "LeapIO Fig. 6 and 11",
        "DeLiBA",
        "SNAcc Fig. 4",
    ] {
        assert!(md.contains(section), "{section} missing from report.md");
        let bare = section.trim_start_matches("## ");
        assert!(html.contains(bare), "{bare} missing from report.html");
    }
    assert!(!md.contains("failed:"), "a benchmark failed:\n{md}");
    // Every section but SNAcc's says whether it is measured or modeled, and has a table; every
    // section has the paper's numbers in a paper column, or a note saying why the paper has none.
    let mut labelled = 0;
    for part in md.split("\n## ").skip(3) {
        let title = part.lines().next().unwrap_or("");
        if title.starts_with("SNAcc") {
            assert!(part.contains("Not reproduced"), "{part}");
        } else {
            assert!(part.contains("**Measured"), "{title}: no label");
            assert!(part.contains("|---"), "{title}: no data");
        }
        let paper_table = part
            .lines()
            .find(|l| l.starts_with("| source | what | paper | kura | kura is |"));
        assert!(
            paper_table.is_some() || part.contains("**Paper:** no number"),
            "{title}: no paper column and no reason"
        );
        // Each paper row's kura cell is labelled, or says why there is no kura figure.
        for row in part
            .lines()
            .filter(|l| l.starts_with("| ") && l.contains("(00"))
        {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            let label = cells.last().copied().unwrap_or("");
            assert!(
                ["measured", "modeled", "—"].contains(&label),
                "{title}: {row}"
            );
            if label == "—" {
                assert!(cells[3].starts_with("— ("), "{title}: no reason in {row}");
            } else {
                labelled += 1;
            }
        }
    }
    assert!(
        labelled > 10,
        "kura's figures beside the papers' numbers:\n{md}"
    );
    assert!(
        html.contains("<th>paper</th>"),
        "the paper column in report.html"
    );
    assert!(
        md.contains("| fio |") && md.contains("| minimap2 |"),
        "peer versions"
    );
    if kura_testkit::which("python3").is_some() && python_module("matplotlib") {
        assert!(html.contains("data:image/png;base64,"), "plots inline");
    }
    check_io(&json("io"));
    check_crc(&json("crc"));
    check_fs(&json("fs"));
    check_kv(&json("kv"));
    check_drives(&json("drives"));
    check_genome(&json("genome"));
    let sweep = json("kv-sweep");
    let sizes: Vec<u64> = sweep["points"]
        .as_array()
        .expect("as the bench writes it")
        .iter()
        .map(|p| p["value_bytes"].as_u64().expect("as the bench writes it"))
        .collect();
    assert!(sizes.contains(&256) && sizes.contains(&4096), "{sizes:?}");
}
