//! `kura genome …` end to end: simulate a dataset, index it, map single- and paired-end reads to
//! SAM (samtools reads it) and PAF, the same on the AccelFS of an image with `--dev`, bad input
//! named by file and line, and `kura bench genome --quick` against minimap2, bwa mem and bowtie2
//! when installed.

mod common;

use common::{correct_of, fails, index_and_map_on, kura, ok, ok_output, simulate, text};
use std::process::Command;

#[test]
fn simulate_index_map_on_host_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    simulate(d, "800", true);
    let fa = d.join("reference.fa");
    let idx = d.join("ref.kgi");
    let out = ok(&[
        "genome",
        "index",
        fa.to_str().unwrap(),
        "-o",
        idx.to_str().unwrap(),
    ]);
    assert!(out.contains("minimizers"));
    // Single-end from the index, SAM on stdout.
    let r1 = d.join("reads_1.fq");
    let o = ok_output(&[
        "genome",
        "map",
        idx.to_str().unwrap(),
        r1.to_str().unwrap(),
        "--score",
    ]);
    let sam = String::from_utf8_lossy(&o.stdout).into_owned();
    let records = sam.lines().filter(|l| !l.starts_with('@')).count();
    assert_eq!(records, 800);
    assert!(sam.starts_with("@HD"));
    assert!(correct_of(&String::from_utf8_lossy(&o.stderr)) >= 760);
    // Paired-end from the FASTA, PAF to a file.
    let paf = d.join("out.paf");
    let r2 = d.join("reads_2.fq");
    ok(&[
        "genome",
        "map",
        fa.to_str().unwrap(),
        r1.to_str().unwrap(),
        r2.to_str().unwrap(),
        "--format",
        "paf",
        "-o",
        paf.to_str().unwrap(),
    ]);
    let lines = std::fs::read_to_string(&paf).expect("read PAF");
    assert!(lines.lines().count() >= 1500, "most of 1600 mates map");
    assert!(lines.lines().all(|l| l.split('\t').count() >= 12));
    // samtools accepts the SAM, when installed.
    let sam_path = d.join("out.sam");
    std::fs::write(&sam_path, &sam).expect("write SAM");
    if let Some(m) = kura_testkit::missing_tool("samtools", "apt-get install samtools") {
        m.skip("simulate_index_map_on_host_files (the samtools check)");
    } else {
        let o = Command::new("samtools")
            .args(["flagstat"])
            .arg(&sam_path)
            .output()
            .expect("run samtools");
        assert!(o.status.success(), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("800 + 0 in total"));
    }
}

#[test]
fn index_and_map_on_an_accelfs_image() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    simulate(d, "500", false);
    let img = d.join("fs.img");
    let spec = format!("file:{}?size=128M", img.display());
    ok(&["mkfs", &spec]);
    assert!(index_and_map_on(&spec, d) >= 475);
    let out = d.join("out.sam");
    ok(&["fs", "get", &spec, "/out.sam", out.to_str().unwrap()]);
    let sam = std::fs::read_to_string(&out).expect("read SAM");
    assert_eq!(sam.lines().filter(|l| !l.starts_with('@')).count(), 500);
    let o = kura(&["fsck", &spec]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Mapping to stdout only reads the device: the image is opened read-only and stays as it is.
    let before = std::fs::read(&img).expect("read image");
    let records = ok(&[
        "genome",
        "map",
        "/idx/ref.kgi",
        "/reads_1.fq",
        "--dev",
        &spec,
    ])
    .lines()
    .filter(|l| !l.starts_with('@'))
    .count();
    assert_eq!(records, 500);
    assert!(
        std::fs::read(&img).expect("read image") == before,
        "map to stdout wrote the image"
    );
}

#[test]
fn bad_reads_are_named_by_file_and_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    simulate(d, "20", false);
    let fa = d.join("reference.fa");
    let cases: [(&str, &str); 4] = [
        ("truncated.fq", "@r1\nACGT\n+\nIIII\n@r2\nACGT\n"),
        ("lengths.fq", "@r1\nACGT\n+\nIII\n"),
        ("bases.fq", "@r1\nACXT\n+\nIIII\n"),
        ("empty.fq", ""),
    ];
    for (name, body) in cases {
        let p = d.join(name);
        std::fs::write(&p, body).expect("write");
        let o = kura(&["genome", "map", fa.to_str().unwrap(), p.to_str().unwrap()]);
        assert!(!o.status.success(), "{name} must be refused");
        let err = text(&o);
        assert!(
            err.contains(name),
            "{name}: the error names the file: {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    // A FASTA given as reads.
    fails(
        &["genome", "map", fa.to_str().unwrap(), fa.to_str().unwrap()],
        "reference.fa",
    );
}

#[test]
fn bench_genome_quick_reports_every_path_and_the_peer() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let json = tmp.path().join("g.json");
    let o = ok_output(&[
        "bench",
        "genome",
        "--quick",
        "--reads",
        "2000",
        "--paths",
        "accelfs,redirect",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let text = text(&o);
    assert!(text.contains("of the device's sequential read"), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON")).expect("parse");
    let systems = report["systems"].as_array().expect("systems");
    let kura_runs: Vec<_> = systems
        .iter()
        .filter(|s| {
            s["system"]
                .as_str()
                .is_some_and(|n| n.starts_with("kura ("))
        })
        .collect();
    assert_eq!(kura_runs.len(), 2, "{text}");
    for s in &kura_runs {
        assert_eq!(s["reads"].as_u64(), Some(2000), "{s}");
        assert!(s["correct"].as_u64().unwrap_or(0) >= 1900, "{s}");
        assert!(s["peak_rss_mib"].as_f64().unwrap_or(0.0) > 1.0, "{s}");
    }
    // kura's own map command and the peers that map from a prebuilt index, each with its build.
    for label in ["kura map", "bwa mem", "bowtie2"] {
        let Some(s) = systems.iter().find(|s| s["label"] == label) else {
            assert!(
                report["skipped"].as_array().is_some_and(|k| !k.is_empty()),
                "{label} neither ran nor was reported skipped: {text}"
            );
            continue;
        };
        assert_eq!(s["reads"].as_u64(), Some(2000), "{s}");
        assert!(s["correct"].as_u64().unwrap_or(0) >= 1900, "{s}");
        assert!(s["index"]["seconds"].as_f64().unwrap_or(0.0) > 0.0, "{s}");
        assert!(s["index"]["bytes"].as_u64().unwrap_or(0) > 0, "{s}");
    }
    if !systems
        .iter()
        .any(|s| s["system"].as_str().unwrap_or("").starts_with("minimap2"))
    {
        // `bench genome` looks minimap2 up on PATH: installed and not compared is a failure.
        let m = kura_testkit::missing_tool("minimap2", "apt-get install minimap2")
            .unwrap_or_else(|| panic!("minimap2 is installed but was not compared: {text}"));
        m.skip("bench_genome_quick_reports_every_path_and_the_peer (the minimap2 comparison)");
    }
}
