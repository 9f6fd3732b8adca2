//! `kura bench genome --real`: SPAdes' real E. coli read pair mapped by every tool, each SAM
//! described by its own flags, samtools and agreement with minimap2; and the refusals of read
//! sets it cannot use.

mod common;

use common::{fails, ok_output, text};
use std::path::Path;

const READS: [&str; 2] = [
    "/usr/share/spades/test_dataset/ecoli_1K_1.fq.gz",
    "/usr/share/spades/test_dataset/ecoli_1K_2.fq.gz",
];
const MG1655: &str = "/usr/share/doc/ragout/examples/E.Coli/references/MG1655-K12.fasta.gz";

#[test]
fn real_reads_are_described_by_every_tool_and_compared_with_minimap2() {
    let test = "real_reads_are_described_by_every_tool_and_compared_with_minimap2";
    for (tool, package) in [
        ("minimap2", "minimap2"),
        ("bwa", "bwa"),
        ("bowtie2", "bowtie2"),
        ("bowtie2-build", "bowtie2"),
        ("samtools", "samtools"),
    ] {
        if let Some(m) = kura_testkit::missing_tool(tool, &format!("apt-get install {package}")) {
            return m.skip(test);
        }
    }
    for (file, package) in [
        (READS[0], "spades"),
        (READS[1], "spades"),
        (MG1655, "ragout-examples"),
    ] {
        if !Path::new(file).exists() {
            return kura_testkit::skip(
                test,
                &format!("{package}-data"),
                &format!("{file} is missing (apt-get install {package})"),
            );
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let json = tmp.path().join("real.json");
    let o = ok_output(&[
        "bench",
        "genome",
        "--real",
        "--rounds",
        "1",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--no-plot",
    ]);
    let out = text(&o);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON")).expect("parse");
    assert_eq!(r["skipped"].as_array().map(Vec::len), Some(0), "{out}");
    let pairs = r["pairs"].as_u64().expect("pairs");
    assert!(pairs > 1000, "{pairs} pairs: {out}");
    let tools = r["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["tool"].as_str()).collect();
    assert_eq!(names, ["kura", "minimap2", "bwa mem", "bowtie2"]);
    for t in tools {
        let s = &t["summary"];
        assert_eq!(s["records"].as_u64(), Some(2 * pairs), "{t}");
        // E. coli reads on the E. coli genome: nearly all map, whichever tool.
        assert!(t["mapped_fraction"].as_f64().unwrap() > 0.95, "{t}");
        assert!(t["seconds"]["median"].as_f64().unwrap() > 0.0, "{t}");
        assert!(t["peak_rss_mib"]["median"].as_f64().unwrap() > 1.0, "{t}");
        // samtools read the same SAM: its counts are the summary's.
        let sn = |name: &str| {
            t["samtools_sn"]
                .as_array()
                .expect("SN lines")
                .iter()
                .find(|p| p[0] == name)
                .and_then(|p| p[1].as_str()?.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no SN {name} in {t}"))
        };
        assert_eq!(sn("reads mapped"), s["mapped"].as_u64().unwrap(), "{t}");
        assert_eq!(
            sn("reads properly paired"),
            s["properly_paired"].as_u64().unwrap(),
            "{t}"
        );
        assert!(t["flagstat"]
            .as_str()
            .is_some_and(|f| f.contains("properly paired")));
    }
    let versus = r["versus_minimap2"].as_array().expect("versus");
    assert_eq!(versus.len(), 3);
    for a in versus {
        let both = a["both_mapped"].as_u64().unwrap();
        let parts = ["agree", "disagree"].map(|k| a[k].as_u64().unwrap());
        assert_eq!(parts[0] + parts[1], both, "{a}");
        let all = [
            "both_mapped",
            "only_tool_mapped",
            "only_minimap2_mapped",
            "neither_mapped",
        ]
        .map(|k| a[k].as_u64().unwrap())
        .iter()
        .sum::<u64>();
        assert_eq!(all, 2 * pairs, "every record is counted once: {a}");
        assert_eq!(a["missing"].as_u64(), Some(0), "{a}");
        assert!(a["agree_fraction"].as_f64().unwrap() > 0.95, "{a}");
    }
    assert!(out.contains("kura vs minimap2:"), "{out}");
}

#[test]
fn read_sets_it_cannot_use_are_refused_with_the_reason() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_str().unwrap();
    let missing = tmp.path().join("none.fq");
    fails(
        &[
            "bench",
            "genome",
            "--real",
            "--real-reads",
            missing.to_str().unwrap(),
            "--dir",
            dir,
        ],
        "does not exist",
    );
    let one = tmp.path().join("one.fq");
    std::fs::write(&one, "@a/1\nACGTACGTAC\n+\nIIIIIIIIII\n").unwrap();
    let two = tmp.path().join("two.fq");
    std::fs::write(
        &two,
        "@a/2\nACGTACGTAC\n+\nIIIIIIIIII\n@b/2\nACGTACGTAC\n+\nIIIIIIIIII\n",
    )
    .unwrap();
    let (one, two) = (one.to_str().unwrap(), two.to_str().unwrap());
    let three = format!("{one},{two},{one}");
    fails(
        &[
            "bench",
            "genome",
            "--real",
            "--real-reads",
            &three,
            "--dir",
            dir,
        ],
        "one FASTQ (single-end) or two",
    );
    let reference = tmp.path().join("ref.fa");
    std::fs::write(
        &reference,
        ">c\n".to_string() + &"ACGTTGCA".repeat(200) + "\n",
    )
    .unwrap();
    fails(
        &[
            "bench",
            "genome",
            "--real",
            "--real-reads",
            &format!("{one},{two}"),
            "--ref",
            reference.to_str().unwrap(),
            "--dir",
            dir,
        ],
        "has 1 reads but",
    );
    let truncated = tmp.path().join("cut.fq");
    std::fs::write(&truncated, "@a/1\nACGTACGTAC\n+\nIII").unwrap();
    fails(
        &[
            "bench",
            "genome",
            "--real",
            "--real-reads",
            truncated.to_str().unwrap(),
            "--ref",
            reference.to_str().unwrap(),
            "--dir",
            dir,
        ],
        "cut.fq",
    );
}
