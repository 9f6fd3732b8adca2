//! SAM output read back by samtools (`view -b`, `flagstat`, `sort`, `view`), single- and
//! paired-end, plus PAF lines and the writer's refusal of reads SAM cannot hold. The samtools
//! part skips visibly (`kura_testkit::skip`) when samtools is not installed.

mod mapsim;

use kura_genome::map::{MapOptions, Mapper, Mapping, Read};
use kura_genome::sam::{self, SamError};
use std::process::Command;

fn run(args: &[&str]) -> String {
    let out = Command::new("samtools")
        .args(args)
        .output()
        .expect("samtools runs");
    assert!(
        out.status.success(),
        "samtools {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

/// The count before " + 0 <what>" in flagstat output.
fn flagstat(text: &str, what: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no {what:?} in {text}"));
    line.split_whitespace()
        .next()
        .expect("count")
        .parse()
        .expect("number")
}

#[test]
fn samtools_reads_single_and_paired_output() {
    if let Some(m) = kura_testkit::missing_tool("samtools", "apt-get install samtools") {
        return m.skip("samtools_reads_single_and_paired_output");
    }
    let g = mapsim::genome(41, &[200_000, 100_000], 3);
    let idx = mapsim::index(&g);
    let mapper = Mapper::new(
        &idx,
        MapOptions {
            threads: 2,
            ..MapOptions::default()
        },
    );
    let dir = tempfile::tempdir().expect("tempdir");

    let mut reads: Vec<Read> = mapsim::reads(&g, 43, 500, 150, 0.001, 0.002)
        .into_iter()
        .map(|r| r.0)
        .collect();
    reads.push(Read {
        name: "junk read".into(),
        seq: b"ACGT".repeat(10).to_vec(),
        qual: Vec::new(),
    });
    let mapped = mapper.map_batch(&reads).expect("maps");
    assert!(
        mapped.last().expect("last").hit.is_none(),
        "a 40 bp tandem repeat of ACGT does not map"
    );
    let mut text = Vec::new();
    sam::write_header(
        &mut text,
        idx.reference(),
        "kura genome map ref.fa reads.fq",
    )
    .expect("header");
    for (r, m) in reads.iter().zip(&mapped) {
        sam::write_single(&mut text, idx.reference(), r, m).expect("record");
    }
    let se = dir.path().join("se.sam");
    std::fs::write(&se, &text).expect("write");
    let bam = dir.path().join("se.bam");
    run(&[
        "view",
        "-b",
        "-o",
        bam.to_str().expect("path"),
        se.to_str().expect("path"),
    ]);
    let fs = run(&["flagstat", bam.to_str().expect("path")]);
    assert_eq!(flagstat(&fs, "in total"), reads.len() as u64);
    let n_mapped = mapped.iter().filter(|m| m.hit.is_some()).count() as u64;
    assert_eq!(flagstat(&fs, "mapped ("), n_mapped);
    let sorted = dir.path().join("sorted.bam");
    run(&[
        "sort",
        "-o",
        sorted.to_str().expect("path"),
        bam.to_str().expect("path"),
    ]);
    let back = run(&["view", sorted.to_str().expect("path")]);
    assert_eq!(back.lines().count(), reads.len());
    let header = run(&["view", "-H", sorted.to_str().expect("path")]);
    assert_eq!(header.lines().filter(|l| l.starts_with("@SQ")).count(), 2);

    let sim = mapsim::pairs(&g, 47, 300, 150, 400);
    let first: Vec<Read> = sim.iter().map(|p| p.0.clone()).collect();
    let second: Vec<Read> = sim.iter().map(|p| p.1.clone()).collect();
    let pairs = mapper.map_pairs(&first, &second).expect("maps");
    let mut text = Vec::new();
    sam::write_header(
        &mut text,
        idx.reference(),
        "kura genome map ref.fa r1.fq r2.fq",
    )
    .expect("header");
    for ((a, b), p) in first.iter().zip(&second).zip(&pairs) {
        sam::write_pair(&mut text, idx.reference(), a, b, p).expect("record");
    }
    let pe = dir.path().join("pe.sam");
    std::fs::write(&pe, &text).expect("write");
    let fs = run(&["flagstat", pe.to_str().expect("path")]);
    assert_eq!(flagstat(&fs, "paired in sequencing"), 2 * sim.len() as u64);
    let proper = pairs.iter().filter(|p| p.proper).count() as u64;
    assert_eq!(flagstat(&fs, "properly paired"), 2 * proper);
    assert!(
        proper as f64 >= 0.95 * sim.len() as f64,
        "{proper} proper of {}",
        sim.len()
    );
    // samtools' own consistency checker on name-collated pairs.
    let fixed = dir.path().join("fixmate.bam");
    run(&[
        "fixmate",
        pe.to_str().expect("path"),
        fixed.to_str().expect("path"),
    ]);
}

/// FASTQ pairs often name mates `NAME/1` and `NAME/2`; in SAM both records carry the template's
/// name, `NAME` (what samtools' name sort, collate and fixmate pair up by). A single-end read
/// keeps its name whole.
#[test]
fn mates_named_slash_1_and_slash_2_share_one_qname() {
    let g = mapsim::genome(53, &[100_000], 3);
    let idx = mapsim::index(&g);
    let mapper = Mapper::new(&idx, MapOptions::default());
    let sim = mapsim::pairs(&g, 59, 20, 150, 400);
    let rename = |r: &Read, name: String| Read { name, ..r.clone() };
    let first: Vec<Read> = (sim.iter().enumerate())
        .map(|(i, p)| rename(&p.0, format!("t{i}/1 comment=x")))
        .collect();
    let second: Vec<Read> = (sim.iter().enumerate())
        .map(|(i, p)| rename(&p.1, format!("t{i}/2")))
        .collect();
    let pairs = mapper.map_pairs(&first, &second).expect("maps");
    let mut text = Vec::new();
    for ((a, b), p) in first.iter().zip(&second).zip(&pairs) {
        sam::write_pair(&mut text, idx.reference(), a, b, p).expect("record");
    }
    let names: Vec<String> = String::from_utf8(text)
        .expect("utf8")
        .lines()
        .map(|l| l.split('\t').next().expect("QNAME").to_string())
        .collect();
    let expected: Vec<String> = (0..sim.len())
        .flat_map(|i| [format!("t{i}"), format!("t{i}")])
        .collect();
    assert_eq!(names, expected);

    let single = rename(&first[0], "s1/1".into());
    let m = mapper
        .map_batch(std::slice::from_ref(&single))
        .expect("maps");
    let mut text = Vec::new();
    sam::write_single(&mut text, idx.reference(), &single, &m[0]).expect("record");
    assert!(String::from_utf8(text).expect("utf8").starts_with("s1/1\t"));
}

#[test]
fn paf_lines_and_reverse_strand_sam_fields() {
    let g = mapsim::genome(53, &[100_000], 0);
    let idx = mapsim::index(&g);
    let mapper = Mapper::new(
        &idx,
        MapOptions {
            threads: 1,
            ..MapOptions::default()
        },
    );
    let sim = mapsim::reads(&g, 59, 50, 150, 0.0, 0.0);
    for (r, t) in &sim {
        let m = mapper.map_read(r);
        let h = m.hit.as_ref().expect("exact reads map");
        assert!(mapsim::correct(h, t));
        let mut paf = Vec::new();
        sam::write_paf(&mut paf, idx.reference(), r, &m).expect("paf");
        let line = String::from_utf8(paf).expect("utf8");
        let f: Vec<&str> = line.trim_end().split('\t').collect();
        assert_eq!(f[1], "150");
        assert_eq!(f[4], if t.reverse { "-" } else { "+" });
        assert_eq!(f[7].parse::<u64>().expect("tstart"), h.pos);
        assert_eq!(f[9], "150", "exact read: 150 matching bases");
        let mut rec = Vec::new();
        sam::write_single(&mut rec, idx.reference(), r, &m).expect("sam");
        let rec = String::from_utf8(rec).expect("utf8");
        let f: Vec<&str> = rec.trim_end().split('\t').collect();
        let forward_seq = &g.contigs[t.contig].1[h.pos as usize..h.end() as usize];
        assert_eq!(
            f[9].as_bytes(),
            forward_seq,
            "SEQ is on the forward reference strand"
        );
        assert_eq!(f[1], if t.reverse { "16" } else { "0" });
    }
}

#[test]
fn unwritable_reads_are_refused() {
    let g = mapsim::genome(61, &[20_000], 0);
    let idx = mapsim::index(&g);
    let m = Mapping { hit: None };
    let cases = [
        Read {
            name: "".into(),
            seq: b"ACGT".to_vec(),
            qual: Vec::new(),
        },
        Read {
            name: "@bad".into(),
            seq: b"ACGT".to_vec(),
            qual: Vec::new(),
        },
        Read {
            name: "q".into(),
            seq: b"ACGT".to_vec(),
            qual: b"II".to_vec(),
        },
        Read {
            name: "s".into(),
            seq: b"AC GT".to_vec(),
            qual: Vec::new(),
        },
        Read {
            name: "e".into(),
            seq: Vec::new(),
            qual: Vec::new(),
        },
    ];
    for r in &cases {
        let e = sam::write_single(&mut Vec::new(), idx.reference(), r, &m).expect_err("refused");
        assert!(matches!(e, SamError::BadRead { .. }), "{r:?}: {e:?}");
    }
    let ok = Read {
        name: "fine extra words".into(),
        seq: b"ACGN".to_vec(),
        qual: Vec::new(),
    };
    let mut out = Vec::new();
    sam::write_single(&mut out, idx.reference(), &ok, &m).expect("writes");
    assert_eq!(
        String::from_utf8(out).expect("utf8"),
        "fine\t4\t*\t0\t0\t*\t*\t0\t0\tACGN\t*\n"
    );
}
