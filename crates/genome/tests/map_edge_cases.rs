//! Reads the mapper must survive without panicking or misreporting: empty, shorter than k, all N,
//! lowercase, overhanging a contig end, longer than usual, reads from identical repeat copies
//! (MAPQ 0, spread over the copies) and from tandem arrays (mapped, on their own copy when the
//! copies differ).

mod mapsim;

use kura_genome::index::{Index, IndexParams};
use kura_genome::map::{MapOptions, Mapper, Read};
use kura_genome::pack::PackedRef;

fn read(name: &str, seq: &[u8]) -> Read {
    Read {
        name: name.into(),
        seq: seq.to_vec(),
        qual: Vec::new(),
    }
}

fn one_thread(idx: &Index) -> Mapper<'_> {
    Mapper::new(
        idx,
        MapOptions {
            threads: 1,
            ..MapOptions::default()
        },
    )
}

#[test]
fn degenerate_reads_are_unmapped() {
    let g = mapsim::genome(71, &[50_000], 0);
    let idx = mapsim::index(&g);
    let mapper = one_thread(&idx);
    let short = &g.contigs[0].1[1000..1010];
    for r in [
        read("empty", b""),
        read("short", short),
        read("allN", &[b'N'; 150]),
        read("junk", &[b'*'; 150]),
    ] {
        assert_eq!(mapper.map_read(&r).hit, None, "{}", r.name);
    }
}

#[test]
fn lowercase_long_and_overhanging_reads_map() {
    let g = mapsim::genome(73, &[60_000, 40_000], 0);
    let idx = mapsim::index(&g);
    let mapper = one_thread(&idx);
    let c0 = &g.contigs[0].1;
    let lower: Vec<u8> = c0[5000..5150].iter().map(u8::to_ascii_lowercase).collect();
    let h = mapper.map_read(&read("lower", &lower)).hit.expect("maps");
    assert_eq!((h.contig, h.pos, h.nm, h.mapq), (0, 5000, 0, 60));

    let long = &c0[10_000..11_000];
    let h = mapper.map_read(&read("long", long)).hit.expect("maps");
    assert_eq!((h.pos, h.cigar.to_string()), (10_000, "1000M".to_string()));

    // The last 100 bases of contig 0 followed by 50 bases that belong nowhere: clipped, placed.
    let mut over = c0[c0.len() - 100..].to_vec();
    over.extend_from_slice(&mapsim::BASES.repeat(13)[..50]);
    let h = mapper.map_read(&read("over", &over)).hit.expect("maps");
    assert_eq!((h.contig, h.pos), (0, c0.len() as u64 - 100));
    assert!(
        h.end() <= c0.len() as u64,
        "alignment stays inside the contig"
    );
    assert!(h.cigar.to_string().ends_with('S'), "{}", h.cigar);

    // Start of contig 1 preceded by bases that are not there.
    let c1 = &g.contigs[1].1;
    let mut under = b"TTTTTTTTTTTTTTTTTTTTTTTTTTTTTT".to_vec();
    under.extend_from_slice(&c1[..120]);
    let h = mapper.map_read(&read("under", &under)).hit.expect("maps");
    assert_eq!((h.contig, h.pos), (1, 0));
}

#[test]
fn identical_copies_get_mapq_zero_and_are_spread() {
    let mut rng_seq = mapsim::genome(79, &[40_000, 40_000], 0);
    let segment = rng_seq.contigs[0].1[10_000..12_000].to_vec();
    rng_seq.contigs[1].1[20_000..22_000].copy_from_slice(&segment);
    let mut p = PackedRef::new();
    for (n, s) in &rng_seq.contigs {
        p.push_contig(n, s).expect("valid");
    }
    let idx = Index::build(p, IndexParams::default(), 1).expect("builds");
    let mapper = one_thread(&idx);
    let mut on_contig = [0usize; 2];
    for i in 0..40 {
        let r = read(&format!("rep{i}"), &segment[i * 40..i * 40 + 150]);
        let h = mapper.map_read(&r).hit.expect("maps");
        assert_eq!(
            h.mapq, 0,
            "a read with two identical placements is ambiguous"
        );
        on_contig[h.contig] += 1;
    }
    assert!(
        on_contig[0] > 5 && on_contig[1] > 5,
        "ties spread over both copies: {on_contig:?}"
    );
}

#[test]
fn tandem_repeat_reads_are_ambiguous_not_slow() {
    let mut g = mapsim::genome(83, &[60_000], 0);
    let unit = b"ACGGTCA";
    let tandem: Vec<u8> = unit.iter().cycle().take(3000).copied().collect();
    g.contigs[0].1[20_000..23_000].copy_from_slice(&tandem);
    let idx = mapsim::index(&g);
    let mapper = one_thread(&idx);
    let r = read("tandem", &tandem[100..250]);
    let t = std::time::Instant::now();
    let m = mapper.map_read(&r);
    assert!(t.elapsed().as_secs() < 2, "one read took {:?}", t.elapsed());
    // Every seed of this read is above the occurrence cutoff; the rarest of them still seed it,
    // so it maps (as minimap2, bwa mem and bowtie2 map such reads) instead of staying unmapped.
    let h = m.hit.expect("a read inside a tandem repeat still maps");
    assert_eq!(
        h.mapq, 0,
        "a read inside a tandem repeat has many equal placements"
    );
    assert!((20_000..23_000).contains(&h.pos));
}

#[test]
fn read_of_a_diverged_tandem_copy_lands_on_its_copy() {
    // A 4 kbp array of a 12 bp unit whose copies differ from it at about 2.5 % of their bases:
    // most of a read's seeds are repetitive, so the rarest of them seed it too, and seeds from
    // every copy chain into one group much wider than the band. (Aligned around the group's
    // middle, as before its densest diagonal was kept, none of these reads lands on its copy.)
    let mut g = mapsim::genome(89, &[60_000], 0);
    let unit = b"ATGCCGTAGCTT";
    let mut x = 7u64;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    let array: Vec<u8> = (0..4000)
        .map(|i| {
            let b = unit[i % unit.len()];
            if next() % 40 == 0 {
                b"ACGT"[(next() % 4) as usize]
            } else {
                b
            }
        })
        .collect();
    g.contigs[0].1[20_000..24_000].copy_from_slice(&array);
    let idx = mapsim::index(&g);
    let mapper = one_thread(&idx);
    // Reads copied exactly from near the array's ends, far from its middle: each aligns without
    // an error at its own copy and with many a period away.
    let mut placed = 0;
    for start in [300usize, 500, 700, 3300, 3500] {
        let r = read("copy", &array[start..start + 150]);
        let h = mapper.map_read(&r).hit.expect("maps");
        if h.pos == 20_000 + start as u64 && h.nm == 0 {
            placed += 1;
        }
        // Its rivals a period away were in its seed group but never aligned.
        assert_eq!(h.mapq, 0, "a placement inside an array is not certain");
    }
    assert!(placed >= 4, "{placed} of 5 reads on their own copy");
}

#[test]
fn mapq_shrinks_with_the_share_of_repetitive_seeds() {
    // A 110 bp element in 30 identical copies; the read is 40 unique bases and one copy.
    let mut g = mapsim::genome(97, &[120_000], 0);
    let element = g.contigs[0].1[500..610].to_vec();
    for c in 1..30 {
        let at = c * 3_000 + 1_000;
        g.contigs[0].1[at..at + 110].copy_from_slice(&element);
    }
    let idx = mapsim::index(&g);
    let mapper = Mapper::new(
        &idx,
        MapOptions {
            threads: 1,
            // The element's seeds (30 positions) count as repetitive, as the most frequent
            // seeds of a large genome do under the index's own cutoff.
            max_occ: Some(10),
            ..MapOptions::default()
        },
    );
    let r = read("flank", &g.contigs[0].1[460..610]);
    let h = mapper.map_read(&r).hit.expect("maps");
    assert_eq!(
        (h.pos, h.nm),
        (460, 0),
        "the unique flank places the read on its own copy"
    );
    assert!(
        h.mapq < 30,
        "most of its seeds are repetitive, so its MAPQ is not full: {}",
        h.mapq
    );
}
