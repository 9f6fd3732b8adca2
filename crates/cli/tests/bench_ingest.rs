//! `kura bench ingest` end to end, small: every case of the report is measured (positive,
//! finite rates from real runs of `kura ingest serve`, fio and the naive host path), the
//! two-host case runs across two network namespaces joined by a veth pair, and the bench
//! removes the namespaces it made. Figures are not judged here (tests never fail on timing).

mod common;

use common::{kura, text};
use std::os::unix::fs::MetadataExt;
use std::process::Command;

fn can_run_netns() -> bool {
    // /proc/self belongs to the process's effective user.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    root && kura_testkit::which("ip").is_some()
}

fn namespaces() -> String {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bench_ingest_measures_every_case_and_removes_its_namespaces() {
    let test = "bench_ingest_measures_every_case_and_removes_its_namespaces";
    if !can_run_netns() {
        kura_testkit::skip(test, "netns", "needs root and iproute2 (ip netns)");
        return;
    }
    if kura_testkit::which("fio").is_none() {
        kura_testkit::skip(test, "fio", "fio not installed (apt: fio)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("ingest.json");
    let plot = dir.path().join("ingest.png");
    let out = kura(&[
        "bench",
        "ingest",
        "--quick",
        "--bytes",
        "32M",
        "--netns",
        "--dir",
        dir.path().to_str().expect("utf-8"),
        "--json",
        json.to_str().expect("utf-8"),
        "--plot",
        plot.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "kura bench ingest: {}", text(&out));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("read JSON")).expect("parse JSON");
    let cases = report["cases"].as_array().expect("cases");
    let names: Vec<&str> = cases.iter().filter_map(|c| c["name"].as_str()).collect();
    for wanted in [
        "kura ingest, 9 MB, in-order",
        "naive host path, 9 MB",
        "kura ingest, random, in-order",
        "kura ingest, random, out-of-order",
        "fio sequential write",
        "kura ingest, 9 MB, two hosts (veth)",
    ] {
        assert!(
            names.contains(&wanted),
            "case {wanted} missing from {names:?}"
        );
    }
    for c in cases {
        let rate = c["mb_per_s"]["median"].as_f64();
        assert!(
            rate.is_some_and(|r| r.is_finite() && r > 0.0),
            "case {} has no measured rate: {c}",
            c["name"]
        );
        assert!(
            c["command"].as_str().is_some_and(|s| !s.is_empty()),
            "case without its command: {c}"
        );
    }
    let stages: Vec<&str> = report["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .filter_map(|s| s["stage"].as_str())
        .collect();
    assert_eq!(stages, ["crc32c", "zstd", "classify"]);
    assert!(
        report["throttled_peak_buffers"]
            .as_f64()
            .is_some_and(|b| (1.0..=64.0).contains(&b)),
        "peak buffers under the throttled device: {}",
        report["throttled_peak_buffers"]
    );
    assert!(
        std::fs::metadata(&plot).is_ok_and(|m| m.len() > 0),
        "no plot written"
    );
    let left = namespaces();
    assert!(
        !left.contains("kura-ingest-"),
        "namespaces left behind: {left}"
    );
}
