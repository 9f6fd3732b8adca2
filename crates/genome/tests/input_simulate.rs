//! The synthetic genome and read simulator: determinism, genome composition, and that every read
//! name's truth points at where the read really came from.

use kura_genome::fasta::FastaReader;
use kura_genome::fastq::{FastqReader, PairedReader};
use kura_genome::simulate::{
    complement, synthetic_genome, write_fasta, write_reads, GenomeOptions, ReadOptions, ReadSim,
};
use kura_genome::source::ByteSource;
use kura_genome::truth::TrueOrigin;
use std::collections::HashSet;

fn revcomp(s: &[u8]) -> Vec<u8> {
    s.iter().rev().map(|&b| complement(b)).collect()
}

#[test]
fn genome_is_deterministic_balanced_and_repetitive() {
    let opts = GenomeOptions::with_total(5, 300_000);
    let g = synthetic_genome(&opts);
    assert_eq!(g, synthetic_genome(&opts));
    assert_ne!(
        g,
        synthetic_genome(&GenomeOptions {
            seed: 6,
            ..opts.clone()
        })
    );
    assert_eq!(g.iter().map(|c| c.seq.len()).sum::<usize>(), 300_000);
    assert_eq!(
        g.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["chr1", "chr2", "chr3"]
    );
    let all: Vec<u8> = g.iter().flat_map(|c| c.seq.iter().copied()).collect();
    assert!(all.iter().all(|b| b"ACGTN".contains(b)));
    let n = all.iter().filter(|&&b| b == b'N').count();
    assert!(n >= 10, "N runs planted: {n}");
    let gc =
        all.iter().filter(|&&b| b == b'G' || b == b'C').count() as f64 / (all.len() - n) as f64;
    assert!((0.48..0.52).contains(&gc), "GC {gc}");
    let mut seen = HashSet::new();
    let mut repeated = 0;
    for c in &g {
        for w in c.seq.windows(40).step_by(7) {
            if !w.contains(&b'N') && !seen.insert(w) {
                repeated += 1;
            }
        }
    }
    assert!(
        repeated > 100,
        "repeat families planted: {repeated} repeated 40-mers"
    );
    assert!(synthetic_genome(&GenomeOptions {
        lengths: vec![0, 5],
        ..opts
    })
    .iter()
    .all(|c| c.seq.len() <= 5));
}

#[test]
fn exact_reads_sit_where_their_names_say() {
    let g = synthetic_genome(&GenomeOptions::with_total(1, 200_000));
    let opts = ReadOptions {
        seed: 9,
        n: 2000,
        error_rate: 0.0,
        mutation_rate: 0.0,
        len2: 100,
        ..ReadOptions::default()
    };
    let pairs: Vec<_> = ReadSim::new(&g, opts.clone()).collect();
    assert_eq!(
        pairs,
        ReadSim::new(&g, opts.clone()).collect::<Vec<_>>(),
        "same seed, same reads"
    );
    assert!(
        pairs.len().abs_diff(2000) <= g.len(),
        "{} pairs",
        pairs.len()
    );
    let (mut first_forward, mut insert_sum) = (0, 0u64);
    let mut names = HashSet::new();
    for p in &pairs {
        assert_eq!(p.first.name, p.second.name);
        assert!(names.insert(p.first.name.clone()), "names unique");
        assert_eq!(p.first.seq.len(), 150);
        assert_eq!(p.second.seq.len(), 100);
        assert!(p.first.qual.iter().all(|&q| q == b'I'));
        let t = TrueOrigin::parse(&p.first.name).expect("truth parses");
        let contig = &g
            .iter()
            .find(|c| c.name == t.contig)
            .expect("contig exists")
            .seq;
        let (s, e) = (t.start as usize, t.end as usize);
        let at_start = |r: &[u8]| contig.get(s - 1..s - 1 + r.len()) == Some(r);
        let at_end = |r: &[u8]| e >= r.len() && contig[e - r.len()..e] == revcomp(r)[..];
        if at_start(&p.first.seq) {
            first_forward += 1;
            assert!(at_end(&p.second.seq), "{}", p.first.name);
        } else {
            assert!(
                at_end(&p.first.seq) && at_start(&p.second.seq),
                "{}",
                p.first.name
            );
        }
        insert_sum += t.end - t.start + 1;
    }
    let frac = f64::from(first_forward) / pairs.len() as f64;
    assert!((0.45..0.55).contains(&frac), "first file forward {frac}");
    let mean = insert_sum as f64 / pairs.len() as f64;
    assert!((490.0..510.0).contains(&mean), "mean outer distance {mean}");
}

#[test]
fn error_counts_in_names_match_the_reads() {
    let g = synthetic_genome(&GenomeOptions::with_total(2, 100_000));
    let opts = ReadOptions {
        seed: 3,
        n: 500,
        error_rate: 0.02,
        mutation_rate: 0.0,
        ..ReadOptions::default()
    };
    let mut total = 0;
    for p in ReadSim::new(&g, opts) {
        let t = TrueOrigin::parse(&p.first.name).expect("truth parses");
        let contig = &g.iter().find(|c| c.name == t.contig).expect("contig").seq;
        let fields: Vec<&str> = p.first.name.rsplitn(6, '|').collect();
        let errs = |f: &str| {
            f.split(':')
                .next()
                .and_then(|x| x.parse::<usize>().ok())
                .expect("e:s:i")
        };
        let fwd_truth = &contig[t.start as usize - 1..t.start as usize - 1 + 150];
        let rev_truth = revcomp(&contig[t.end as usize - 150..t.end as usize]);
        let diff = |a: &[u8], b: &[u8]| a.iter().zip(b).filter(|(x, y)| x != y).count();
        let (fwd, rev) = if diff(&p.first.seq, fwd_truth) < diff(&p.second.seq, fwd_truth) {
            (&p.first.seq, &p.second.seq)
        } else {
            (&p.second.seq, &p.first.seq)
        };
        assert_eq!(diff(fwd, fwd_truth), errs(fields[2]), "{}", p.first.name);
        assert_eq!(diff(rev, &rev_truth), errs(fields[1]), "{}", p.first.name);
        total += errs(fields[1]) + errs(fields[2]);
    }
    assert!(total > 1000, "errors drawn: {total}");
    assert!(
        ReadSim::new(
            &g,
            ReadOptions {
                n: 5,
                error_rate: 0.002,
                ..ReadOptions::default()
            }
        )
        .all(|p| p.first.qual.iter().all(|&q| q == b'<')),
        "wgsim's quality for -e 0.002 is Q27 ('<')"
    );
}

#[test]
fn mutated_reads_report_indels_and_keep_truth_close() {
    let g = synthetic_genome(&GenomeOptions::with_total(4, 100_000));
    let opts = ReadOptions {
        seed: 8,
        n: 300,
        error_rate: 0.0,
        mutation_rate: 0.02,
        ..ReadOptions::default()
    };
    let mut indels = 0;
    for p in ReadSim::new(&g, opts) {
        let fields: Vec<&str> = p.first.name.rsplitn(6, '|').collect();
        for f in &fields[1..3] {
            indels += f
                .rsplit(':')
                .next()
                .and_then(|x| x.parse::<u32>().ok())
                .expect("e:s:i");
        }
        let t = TrueOrigin::parse(&p.first.name).expect("truth parses");
        assert!(t.end > t.start && t.end - t.start < 900, "{}", p.first.name);
        assert_eq!(p.first.seq.len(), 150);
    }
    assert!(indels > 10, "indels drawn: {indels}");
}

#[test]
fn files_written_gzip_and_plain_parse_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let g = synthetic_genome(&GenomeOptions::with_total(7, 50_000));
    let fa = dir.path().join("ref.fa");
    write_fasta(std::fs::File::create(&fa).expect("create"), &g, 60).expect("write fasta");
    let back = FastaReader::new(ByteSource::open_path(&fa).expect("open"), "ref.fa")
        .read_all()
        .expect("parses");
    assert_eq!(back, g);
    let opts = ReadOptions {
        n: 300,
        ..ReadOptions::default()
    };
    for gzip in [false, true] {
        let (r1, r2) = (dir.path().join("r1.fq"), dir.path().join("r2.fq"));
        let n = write_reads(&g, &opts, &r1, Some(&r2), gzip).expect("write reads");
        let want: Vec<_> = ReadSim::new(&g, opts.clone()).collect();
        assert_eq!(n, want.len() as u64);
        let a = FastqReader::new(ByteSource::open_path(&r1).expect("open"), "r1.fq");
        let b = FastqReader::new(ByteSource::open_path(&r2).expect("open"), "r2.fq");
        let mut p = PairedReader::new(a, b);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        assert_eq!(
            p.next_batch(&mut x, &mut y, usize::MAX)
                .expect("pairs parse"),
            want.len()
        );
        for (i, w) in want.iter().enumerate() {
            assert_eq!((&x[i], &y[i]), (&w.first, &w.second));
        }
        let head = std::fs::read(&r1).expect("read back");
        assert_eq!(head.starts_with(&[0x1f, 0x8b]), gzip);
    }
    let se = dir.path().join("se.fq.gz");
    let n = write_reads(&g, &opts, &se, None, true).expect("single-end");
    let reads: Vec<_> = FastqReader::new(ByteSource::open_path(&se).expect("open"), "se.fq.gz")
        .collect::<Result<_, _>>()
        .expect("parses");
    assert_eq!(reads.len() as u64, n);
}
