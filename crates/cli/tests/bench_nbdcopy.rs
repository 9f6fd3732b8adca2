//! `kura bench nbdcopy` end to end, small (256 MiB image, 4 MiB of data, 2 rounds): every point
//! is measured with positive, finite times; the server with block status sends little more than
//! the data, the one without it every byte; the JSON records the nbdcopy command. Figures are
//! not judged here (tests never fail on timing).

mod common;

use common::{kura, text};

#[test]
fn bench_nbdcopy_copies_the_sparse_image_with_and_without_block_status() {
    let test = "bench_nbdcopy_copies_the_sparse_image_with_and_without_block_status";
    if let Some(m) = kura_testkit::missing_tool("nbdcopy", "apt-get install libnbd-bin") {
        m.skip(test);
        return;
    }
    let dir = tempfile::tempdir().expect("scratch directory");
    let json = dir.path().join("nbdcopy.json");
    let d = dir.path().to_str().expect("utf-8 path");
    let o = kura(&[
        "bench",
        "nbdcopy",
        "--size",
        "256M",
        "--data",
        "4M",
        "--rounds",
        "2",
        "--dir",
        d,
        "--json",
        json.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON")).expect("JSON");
    let points = r["points"].as_array().expect("points");
    assert_eq!(points.len(), 3);
    let mib = 1u64 << 20;
    for p in points {
        let median = p["seconds"]["median"].as_f64().expect("seconds");
        assert!(median.is_finite() && median > 0.0, "{p}");
        assert_eq!(p["seconds"]["rounds"], 2, "{p}");
        let sent = p["bytes_sent"].as_u64().expect("bytes");
        let data = p["data_bytes"].as_u64().expect("data");
        if p["block_status"] == true {
            assert!(sent >= data && sent <= data + 2 * mib, "{p}");
        } else {
            assert_eq!(sent, 256 * mib, "{p}");
        }
    }
    assert!(r["speedup"]["ratio"]["median"].as_f64().expect("ratio") > 0.0);
    assert!(r["client"]
        .as_str()
        .expect("client")
        .starts_with("nbdcopy nbd://"));
}

#[test]
fn bench_nbdcopy_data_sizes_fits_the_copy_time_against_the_data() {
    let test = "bench_nbdcopy_data_sizes_fits_the_copy_time_against_the_data";
    if let Some(m) = kura_testkit::missing_tool("nbdcopy", "apt-get install libnbd-bin") {
        m.skip(test);
        return;
    }
    let dir = tempfile::tempdir().expect("scratch directory");
    let json = dir.path().join("scale.json");
    let o = kura(&[
        "bench",
        "nbdcopy",
        "--size",
        "128M",
        "--data-sizes",
        "2M,8M",
        "--rounds",
        "1",
        "--dir",
        dir.path().to_str().expect("utf-8 path"),
        "--json",
        json.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("R² ="), "{}", text(&o));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON")).expect("JSON");
    let points = r["points"].as_array().expect("points");
    assert_eq!(points.len(), 2);
    let mib = 1u64 << 20;
    for p in points {
        let data = p["data_bytes"].as_u64().expect("data");
        let sent = p["bytes_sent_with"].as_u64().expect("bytes");
        assert!(sent >= data && sent <= data + 2 * mib, "{p}");
        assert_eq!(p["bytes_sent_without"], 128 * mib, "{p}");
    }
    for fit in ["fit_with_block_status", "fit_without_block_status"] {
        let r2 = r[fit]["r2"].as_f64().expect("R²");
        assert!((0.0..=1.0 + 1e-9).contains(&r2), "{fit}: {r2}");
        assert_eq!(r[fit]["samples"], 2);
    }
}
