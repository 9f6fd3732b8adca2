//! The RocksDB peer (`scripts/kv_rocksdb_peer.py`) replays traces this crate writes: a YCSB-A
//! trace of 2,000 operations and a db_bench `readseq` trace, checked through the JSON it
//! prints; malformed traces and a missing rocksdict fail with exit status 2. Tests that need
//! python3 or rocksdict skip visibly (`kura_testkit::skip`) when the machine lacks them.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kura_workload::{db_bench, write_workload, ycsb, Op, Workload};
use serde_json::Value as Json;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kv_rocksdb_peer.py")
}

/// What the tests cannot run without, if this machine lacks it: python3, or (with `rocksdict`)
/// the rocksdict module. Any other failure of python3 fails the test.
fn missing(rocksdict: bool) -> Option<kura_testkit::Missing> {
    if rocksdict {
        kura_testkit::python_module_missing("rocksdict", "rocksdict")
    } else {
        kura_testkit::missing_tool("python3", "apt-get install python3")
    }
}

fn write_trace(dir: &Path, w: &Workload) -> PathBuf {
    let path = dir.join(format!("{}.trace", w.name()));
    let file = File::create(&path).expect("create trace");
    write_workload(BufWriter::new(file), w).expect("write trace");
    path
}

fn peer(trace: &Path, db: &Path, extra: &[&str]) -> Output {
    Command::new("python3")
        .arg(script())
        .arg("--trace")
        .arg(trace)
        .arg("--db")
        .arg(db)
        .args(extra)
        .output()
        .expect("run python3")
}

fn run_ok(trace: &Path, db: &Path) -> Json {
    let out = peer(trace, db, &["--cache-bytes", "8388608"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "peer failed: {stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

fn num(j: &Json, path: &[&str]) -> f64 {
    let mut v = j;
    for p in path {
        v = &v[*p];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {j}"))
}

#[test]
fn peer_replays_a_ycsb_a_trace() {
    if let Some(m) = missing(true) {
        return m.skip("peer_replays_a_ycsb_a_trace");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let w = ycsb('A', 1000, 2000, 100, 7).expect("workload");
    let reads = w.run().filter(|op| matches!(op, Op::Read { .. })).count() as f64;
    let trace = write_trace(dir.path(), &w);
    let j = run_ok(&trace, &dir.path().join("db"));

    assert_eq!(j["workload"], "ycsb-a");
    assert_eq!(j["sync"], false);
    assert_eq!(num(&j, &["ops"]), 2000.0);
    assert_eq!(num(&j, &["by_op", "read", "ops"]), reads);
    assert_eq!(num(&j, &["by_op", "update", "ops"]), 2000.0 - reads);
    // Every read asks for a loaded record, so every read finds it.
    assert_eq!(num(&j, &["by_op", "read", "found"]), reads);
    assert_eq!(num(&j, &["load", "ops"]), 1000.0);
    assert_eq!(num(&j, &["load", "by_op", "insert", "ops"]), 1000.0);
    assert!(num(&j, &["seconds"]) > 0.0);
    assert!(num(&j, &["ops_per_s"]) > 0.0);
    let (p50, p99, p999) = (
        num(&j, &["p50_us"]),
        num(&j, &["p99_us"]),
        num(&j, &["p999_us"]),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{p50} {p99} {p999}");
    println!(
        "rocksdb ycsb-a: {} ops/s, p50 {p50} us, p99 {p99} us",
        j["ops_per_s"]
    );
}

#[test]
fn peer_replays_readseq_and_honours_fillsync() {
    if let Some(m) = missing(true) {
        return m.skip("peer_replays_readseq_and_honours_fillsync");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let w = db_bench("readseq", 500, 256, 1).expect("workload");
    let j = run_ok(&write_trace(dir.path(), &w), &dir.path().join("db-readseq"));
    assert_eq!(num(&j, &["ops"]), 1.0);
    assert_eq!(num(&j, &["by_op", "scan", "entries"]), 500.0);
    assert_eq!(num(&j, &["load", "ops"]), 500.0);

    let w = db_bench("fillsync", 50, 256, 1).expect("workload");
    let j = run_ok(&write_trace(dir.path(), &w), &dir.path().join("db-sync"));
    assert_eq!(j["sync"], true);
    assert!(j["load"].is_null());
    assert_eq!(num(&j, &["by_op", "insert", "ops"]), 50.0);
}

#[test]
fn peer_rejects_a_malformed_trace_with_status_2() {
    if let Some(m) = missing(false) {
        return m.skip("peer_rejects_a_malformed_trace_with_status_2");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.trace");
    std::fs::write(
        &bad,
        b"definitely not a trace, but long enough for a header",
    )
    .expect("write");
    let out = peer(&bad, &dir.path().join("db"), &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad magic"), "{stderr}");

    // A valid header followed by a truncated body fails the same way, when rocksdict is there
    // to get that far.
    if missing(true).is_none() {
        let w = ycsb('B', 10, 10, 8, 1).expect("workload");
        let good = write_trace(dir.path(), &w);
        let bytes = std::fs::read(&good).expect("read");
        std::fs::write(&bad, &bytes[..bytes.len() - 3]).expect("write");
        let out = peer(&bad, &dir.path().join("db2"), &[]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("truncated"), "{stderr}");
    }
}

#[test]
fn peer_without_rocksdict_exits_2_with_a_clear_message() {
    if let Some(m) = missing(false) {
        return m.skip("peer_without_rocksdict_exits_2_with_a_clear_message");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // A stand-in module that fails to import, first on the path.
    let fake = dir.path().join("fake");
    std::fs::create_dir(&fake).expect("mkdir");
    std::fs::write(
        fake.join("rocksdict.py"),
        "raise ImportError('simulated absence')\n",
    )
    .expect("write");
    let w = ycsb('C', 10, 10, 8, 1).expect("workload");
    let trace = write_trace(dir.path(), &w);
    let out = Command::new("python3")
        .env("PYTHONPATH", &fake)
        .arg(script())
        .arg("--trace")
        .arg(&trace)
        .arg("--db")
        .arg(dir.path().join("db"))
        .output()
        .expect("run python3");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rocksdict is not installed"), "{stderr}");
}
