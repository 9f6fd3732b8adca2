//! The C++ peers of `kura bench kv` (`peers/kv_replay.cc`, built for RocksDB and for LMDB) replay
//! the traces kura-workload writes: a YCSB-A trace (every read finds its key, the run phase has
//! all its operations), a db_bench `readseq` trace (its one scan returns every record) and a
//! fillsync trace; malformed and truncated traces fail with exit status 2 and a message. An
//! engine whose library or g++ is missing skips visibly (`kura_testkit::skip`).

use kura_bench::kv::{build_peer, peer_args, PeerEngine};
use kura_kv::DbOptions;
use kura_workload::{db_bench, write_workload, ycsb, Op, Workload};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ENGINES: [(PeerEngine, &str); 2] = [
    (PeerEngine::RocksDb, "rocksdb-peer"),
    (PeerEngine::Lmdb, "lmdb-peer"),
];

/// The peer for `engine`, or a logged skip of `test`.
fn peer_or_skip(test: &str, engine: PeerEngine, capability: &str) -> Option<PathBuf> {
    match build_peer(engine) {
        Ok(bin) => Some(bin),
        Err(why) => {
            kura_testkit::skip(test, capability, &why);
            None
        }
    }
}

fn trace(dir: &Path, w: &Workload) -> PathBuf {
    let path = dir.join(format!("{}.trace", w.name()));
    write_workload(std::fs::File::create(&path).expect("create"), w).expect("write trace");
    path
}

fn replay(engine: PeerEngine, bin: &Path, trace: &Path, db: &Path) -> Output {
    let args = peer_args(engine, trace, db, &DbOptions::default(), 1 << 30);
    Command::new(bin)
        .args(&args)
        .output()
        .expect("run the peer")
}

fn replay_ok(engine: PeerEngine, bin: &Path, trace: &Path, db: &Path) -> Value {
    let out = replay(engine, bin, trace, db);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{engine:?}: {stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

#[test]
fn both_peers_replay_ycsb_a_readseq_and_fillsync() {
    for (engine, capability) in ENGINES {
        let test = "both_peers_replay_ycsb_a_readseq_and_fillsync";
        let Some(bin) = peer_or_skip(test, engine, capability) else {
            continue;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let w = ycsb('A', 1000, 2000, 100, 7).expect("workload");
        let reads = w.run().filter(|op| matches!(op, Op::Read { .. })).count() as f64;
        let v = replay_ok(engine, &bin, &trace(dir.path(), &w), &dir.path().join("a"));
        assert_eq!(v["workload"], "ycsb-a");
        assert_eq!(v["sync"], false);
        assert_eq!(num(&v, "ops"), 2000.0, "{v}");
        // Every read asks for a loaded record, so every read finds it.
        assert_eq!(num(&v, "found"), reads, "{v}");
        assert!(num(&v, "ops_per_s") > 0.0);
        let (p50, p99, p999) = (num(&v, "p50_us"), num(&v, "p99_us"), num(&v, "p999_us"));
        assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{v}");
        assert!(!v["config"].as_str().expect("config").is_empty());

        let w = db_bench("readseq", 500, 256, 1).expect("workload");
        let v = replay_ok(engine, &bin, &trace(dir.path(), &w), &dir.path().join("s"));
        assert_eq!(num(&v, "ops"), 1.0);
        assert_eq!(num(&v, "entries"), 500.0, "{v}");

        let w = db_bench("fillsync", 50, 256, 1).expect("workload");
        let v = replay_ok(engine, &bin, &trace(dir.path(), &w), &dir.path().join("f"));
        assert_eq!(v["sync"], true);
        assert_eq!(num(&v, "ops"), 50.0);
        let config = v["config"].as_str().expect("config");
        assert!(config.contains("sync every write"), "{config}");
        assert!(!config.contains("MDB_NOSYNC"), "{config}");
    }
}

#[test]
fn malformed_traces_exit_2_with_a_message() {
    for (engine, capability) in ENGINES {
        let Some(bin) = peer_or_skip("malformed_traces_exit_2_with_a_message", engine, capability)
        else {
            continue;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let bad = dir.path().join("bad.trace");
        std::fs::write(&bad, b"not a trace, though long enough for a header").expect("write");
        let out = replay(engine, &bin, &bad, &dir.path().join("a"));
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("bad magic"));

        let w = ycsb('B', 10, 10, 8, 1).expect("workload");
        let bytes = std::fs::read(trace(dir.path(), &w)).expect("read");
        std::fs::write(&bad, &bytes[..bytes.len() - 3]).expect("write");
        let out = replay(engine, &bin, &bad, &dir.path().join("b"));
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("truncated"));
    }
}
