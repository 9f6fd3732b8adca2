//! `kura bench genome --matrix` at a tiny size: every tool (kura, minimap2, bwa mem, bowtie2) in
//! every cell, with figures that come from the runs (times, RSS, scores, the kura/minimap2 ratio
//! and the targets derived from them), every index build reported, and the PNG drawn.

mod common;

use common::{ok_output, text};

#[test]
fn matrix_reports_every_tool_in_every_cell() {
    for (tool, package) in [
        ("minimap2", "minimap2"),
        ("bwa", "bwa"),
        ("bowtie2", "bowtie2"),
        ("bowtie2-build", "bowtie2"),
    ] {
        if let Some(m) = kura_testkit::missing_tool(tool, &format!("apt-get install {package}")) {
            m.skip("matrix_reports_every_tool_in_every_cell");
            return;
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let json = tmp.path().join("m.json");
    let png = tmp.path().join("m.png");
    let o = ok_output(&[
        "bench",
        "genome",
        "--matrix",
        "--ref-sizes",
        "150k",
        "--errors",
        "0.002,0.02",
        "--indels",
        "0.001",
        "--modes",
        "single,paired",
        "--reads",
        "300",
        "--rounds",
        "1",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    let out = text(&o);
    assert!(out.contains("targets held in cells"), "{out}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON")).expect("parse");
    assert_eq!(r["skipped"].as_array().map(Vec::len), Some(0), "{out}");
    let tools = ["kura", "minimap2", "bwa mem", "bowtie2"];
    let refs = r["references"].as_array().expect("references");
    assert_eq!(refs.len(), 1);
    assert_eq!(refs[0]["bases"].as_u64(), Some(150_000));
    let indexes = refs[0]["indexes"].as_array().expect("indexes");
    assert_eq!(indexes.len(), 4);
    for (i, t) in indexes.iter().zip(tools) {
        assert_eq!(i["tool"].as_str(), Some(t), "{i}");
        assert!(i["seconds"].as_f64().unwrap_or(0.0) > 0.0, "{i}");
        assert!(i["bytes"].as_u64().unwrap_or(0) > 10_000, "{i}");
        assert!(i["command"].as_str().is_some_and(|c| !c.is_empty()), "{i}");
    }
    let cells = r["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 4, "2 error rates x 2 modes");
    for c in cells {
        let paired = c["mode"] == "paired";
        // The simulator shares reads between contigs by length, rounding each share.
        let records = row_reads(c);
        let expected = if paired { 600 } else { 300 };
        assert!(records.abs_diff(expected) <= 4, "{records} records: {c}");
        let low_error = c["error_rate"].as_f64() == Some(0.002);
        let row = |name: &str| {
            c["tools"]
                .as_array()
                .expect("tools")
                .iter()
                .find(|t| t["tool"] == name)
                .unwrap_or_else(|| panic!("{name} missing in {c}"))
                .clone()
        };
        for name in tools {
            let t = row(name);
            assert_eq!(t["reads"].as_u64(), Some(records), "{t}");
            assert!(t["seconds"]["median"].as_f64().unwrap_or(0.0) > 0.0, "{t}");
            assert!(t["peak_rss_mib"].as_f64().unwrap_or(0.0) > 1.0, "{t}");
            let correct = t["correct"].as_u64().unwrap_or(0);
            assert!(correct <= records && correct > records / 2, "{t}");
            if low_error && name != "bowtie2" {
                assert!(correct >= records * 9 / 10, "{t}");
            }
            let max_q = t["max_mapq"].as_u64().unwrap_or(0);
            assert!(
                max_q > 0 && max_q <= if name == "bowtie2" { 42 } else { 60 },
                "{t}"
            );
            let cmd = t["command"].as_str().unwrap_or("");
            assert_eq!(cmd.contains("reads_2.fq"), paired, "{cmd}");
        }
        let (k, m) = (row("kura"), row("minimap2"));
        let ratio = c["kura_vs_minimap2"]["ratio"]["median"]
            .as_f64()
            .expect("ratio");
        let expect =
            k["seconds"]["median"].as_f64().unwrap() / m["seconds"]["median"].as_f64().unwrap();
        assert!((ratio - expect).abs() < 1e-9, "{c}");
        assert_eq!(c["targets"]["time"].as_bool(), Some(ratio <= 0.8));
        assert_eq!(
            c["targets"]["rss"].as_bool(),
            Some(k["peak_rss_mib"].as_f64() <= m["peak_rss_mib"].as_f64())
        );
        let best = row(c["most_accurate_peer"].as_str().expect("best peer"));
        assert_eq!(
            c["targets"]["correct"].as_bool(),
            Some(k["correct"].as_u64() >= best["correct"].as_u64())
        );
        if paired {
            assert!(row("bowtie2")["command"]
                .as_str()
                .unwrap_or("")
                .contains("-X 1000"));
        }
    }
    assert!(
        png.exists(),
        "the PNG is drawn (python3-matplotlib is in scripts/setup.sh): {out}"
    );
}

/// The records of a cell's first tool (every tool must then have as many).
fn row_reads(c: &serde_json::Value) -> u64 {
    c["tools"][0]["reads"].as_u64().expect("reads")
}
