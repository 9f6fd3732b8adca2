//! Single-end mapping accuracy on a seeded synthetic genome with planted repeats: the bar
//! (at least 98.75 % of reads placed within 10 bp, no misplaced read with MAPQ ≥ 20).

mod mapsim;

use kura_genome::map::{MapOptions, Mapper};
use std::time::Instant;

#[test]
fn single_end_accuracy_and_mapq() {
    let g = mapsim::genome(7, &[700_000, 500_000, 300_000], 40);
    let t0 = Instant::now();
    let idx = mapsim::index(&g);
    let t_index = t0.elapsed();
    let n: usize = std::env::var("KURA_MAP_TEST_READS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let sim = mapsim::reads(&g, 11, n, 150, 0.001, 0.002);
    let reads: Vec<_> = sim.iter().map(|(r, _)| r.clone()).collect();
    let t1 = Instant::now();
    let mapper = Mapper::new(
        &idx,
        MapOptions {
            threads: 2,
            ..MapOptions::default()
        },
    );
    let out = mapper.map_batch(&reads).expect("maps");
    let t_map = t1.elapsed();
    assert_eq!(out.len(), reads.len());
    let (mut unique, mut unique_ok, mut ok, mut bad_hi, mut unmapped) = (0, 0, 0, 0, 0);
    for ((_, truth), m) in sim.iter().zip(&out) {
        let rep = mapsim::in_repeat(&g, truth);
        if !rep {
            unique += 1;
        }
        match &m.hit {
            None => unmapped += 1,
            Some(h) => {
                let good = mapsim::correct(h, truth);
                if good {
                    ok += 1;
                    if !rep {
                        unique_ok += 1;
                    }
                } else if h.mapq >= 20 {
                    bad_hi += 1;
                    eprintln!("misplaced with MAPQ {}: {:?} truth {:?}", h.mapq, h, truth);
                }
            }
        }
    }
    let frac = unique_ok as f64 / unique as f64;
    eprintln!(
        "index {:?}, map {:?}: {ok}/{} correct overall, {unique_ok}/{unique} non-repeat ({:.3} %), \
         {unmapped} unmapped, {bad_hi} misplaced with MAPQ>=20",
        t_index,
        t_map,
        reads.len(),
        100.0 * frac
    );
    assert!(frac >= 0.9875, "non-repeat accuracy {frac}");
    assert_eq!(bad_hi, 0, "misplaced reads with MAPQ >= 20");
}

#[test]
fn output_does_not_depend_on_thread_count() {
    let g = mapsim::genome(3, &[200_000], 6);
    let idx = mapsim::index(&g);
    let reads: Vec<_> = mapsim::reads(&g, 5, 2000, 150, 0.001, 0.01)
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    let one = Mapper::new(
        &idx,
        MapOptions {
            threads: 1,
            ..MapOptions::default()
        },
    )
    .map_batch(&reads)
    .expect("maps");
    let four = Mapper::new(
        &idx,
        MapOptions {
            threads: 4,
            ..MapOptions::default()
        },
    )
    .map_batch(&reads)
    .expect("maps");
    assert_eq!(one, four);
}
