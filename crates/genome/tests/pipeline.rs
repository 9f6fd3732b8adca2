//! The whole application over each store: host files, AccelFS on the direct engine and AccelFS
//! on redirect give the same SAM, stage times that add up, and accuracy scored from the names;
//! bad inputs name their file.

use kura_genome::index::IndexParams;
use kura_genome::paths::{IoPath, Workspace};
use kura_genome::pipeline::{self, OutputFormat, PipelineError, RunOptions};
use kura_genome::simulate::{self, GenomeOptions, ReadOptions};
use kura_genome::store::Store;
use kura_genome::truth::{score_sam, ScoreOptions};
use std::path::{Path, PathBuf};

fn dataset(dir: &Path, reads: u64, paired: bool) -> Vec<PathBuf> {
    let genome = simulate::synthetic_genome(&GenomeOptions::with_total(5, 400_000));
    let reference = dir.join("ref.fa");
    simulate::write_fasta(
        std::fs::File::create(&reference).expect("create ref"),
        &genome,
        70,
    )
    .expect("write ref");
    let opts = ReadOptions {
        seed: 9,
        n: reads,
        ..ReadOptions::default()
    };
    let (r1, r2) = (dir.join("r1.fq"), dir.join("r2.fq"));
    simulate::write_reads(&genome, &opts, &r1, paired.then_some(r2.as_path()), false)
        .expect("write reads");
    let mut files = vec![reference, r1];
    if paired {
        files.push(r2);
    }
    files
}

fn options(paired: bool) -> RunOptions {
    RunOptions {
        reference: "ref.fa".into(),
        reads: "r1.fq".into(),
        mates: paired.then(|| "r2.fq".to_string()),
        index: "idx/ref.kgi".into(),
        output: Some(("out.sam".into(), OutputFormat::Sam)),
        threads: 2,
        params: IndexParams::default(),
        batch_bases: 50_000,
        command_line: "test".into(),
    }
}

#[test]
fn every_path_gives_the_same_sam_and_accurate_placements() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let files = dataset(tmp.path(), 1500, true);
    let names = ["ref.fa", "r1.fq", "r2.fq"];
    let inputs: Vec<(&str, &Path)> = names
        .iter()
        .zip(&files)
        .map(|(n, f)| (*n, f.as_path()))
        .collect();
    let work = Workspace::prepare(&tmp.path().join("work"), &inputs, &mut |_, _| {})
        .expect("prepare the workspace");
    let mut sams = Vec::new();
    for path in IoPath::ALL {
        let opened = work.open(path).expect("open the path");
        let mut events = 0;
        let report = pipeline::run(&opened.store, &options(true), &mut |_| events += 1)
            .unwrap_or_else(|e| panic!("{}: {e}", path.name()));
        assert!(events >= 5, "stages and progress are reported");
        assert_eq!(report.reads, 3000, "{}: every mate mapped", path.name());
        assert_eq!(report.contigs, 3);
        assert!(report.index_bytes > 0 && report.read_bytes > 0);
        assert!(
            report.stages.total() <= report.wall,
            "stages lie within the wall time"
        );
        let a = report.accuracy;
        assert_eq!(a.reads, 3000);
        assert!(a.fraction_correct() >= 0.95, "{}: {a:?}", path.name());
        assert_eq!(a.misplaced_confident, 0, "{}: {a:?}", path.name());
        assert!(a.proper_pairs >= 1400, "{a:?}");
        // The SAM it wrote scores the same from the file as in memory.
        let sam = {
            let mut src = opened.store.open_stream("out.sam").expect("open the SAM");
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut src, &mut v).expect("read the SAM");
            v
        };
        let score = score_sam(&sam[..], "out.sam", ScoreOptions::default()).expect("score");
        assert_eq!(score.total, 3000);
        assert_eq!(score.correct, a.correct, "{}", path.name());
        assert_eq!(score.misplaced_confident, 0);
        opened.close().expect("unmount");
        sams.push(sam);
    }
    assert!(
        sams.windows(2).all(|w| w[0] == w[1]),
        "every path writes the same SAM"
    );
}

#[test]
fn single_end_on_host_files_maps_and_reloads_the_saved_index() {
    let tmp = tempfile::tempdir().expect("tempdir");
    dataset(tmp.path(), 1000, false);
    let store = Store::host(tmp.path());
    let report = pipeline::run(&store, &options(false), &mut |_| {}).expect("run");
    assert_eq!(report.reads, 1000);
    assert!(
        report.accuracy.fraction_correct() >= 0.95,
        "{:?}",
        report.accuracy
    );
    assert!(pipeline::is_index(&store, "idx/ref.kgi").expect("peek"));
    assert!(!pipeline::is_index(&store, "ref.fa").expect("peek"));
    let index = pipeline::load_index(&store, "idx/ref.kgi").expect("load");
    assert_eq!(index.reference().contigs().len(), 3);
}

#[test]
fn bad_inputs_name_their_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    dataset(tmp.path(), 50, false);
    let store = Store::host(tmp.path());
    let text = |e: PipelineError| e.to_string();

    let mut opts = options(false);
    opts.reference = "missing.fa".into();
    let e = text(pipeline::run(&store, &opts, &mut |_| {}).expect_err("missing reference"));
    assert!(e.contains("missing.fa"), "{e}");

    let mut opts = options(false);
    opts.reads = "ref.fa".into();
    let e = text(pipeline::run(&store, &opts, &mut |_| {}).expect_err("FASTA as reads"));
    assert!(e.contains("ref.fa"), "{e}");

    std::fs::write(tmp.path().join("empty.fa"), b"").expect("write");
    let e = text(pipeline::load_reference(&store, "empty.fa").expect_err("empty reference"));
    assert!(e.contains("empty.fa"), "{e}");

    pipeline::run(&store, &options(false), &mut |_| {}).expect("run");
    let idx = tmp.path().join("idx/ref.kgi");
    let bytes = std::fs::read(&idx).expect("read index");
    std::fs::write(&idx, &bytes[..bytes.len() / 2]).expect("truncate");
    let e = text(pipeline::load_index(&store, "idx/ref.kgi").expect_err("truncated index"));
    assert!(e.contains("ref.kgi"), "{e}");
}
