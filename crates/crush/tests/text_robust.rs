//! The text compiler on hostile input: every truncation of a real map's text, random token
//! soups built from the grammar's own words, and random token edits of a valid map. Each gives
//! a map that validates and maps, or a `Parse` error whose line and column lie inside the text;
//! never a panic.

use kura_crush::{parse, CrushError, Mapper, Workspace};
use proptest::prelude::*;

/// A map using every construct: tunables, classes, all five algorithms, positions, explicit
/// shadow ids, rules with every step, and a weight set.
const FULL: &str = include_str!("data/full.txt");

const WORDS: &[&str] = &[
    "tunable",
    "device",
    "type",
    "rule",
    "choose_args",
    "host",
    "root",
    "osd",
    "{",
    "}",
    "[",
    "]",
    "id",
    "alg",
    "hash",
    "item",
    "weight",
    "pos",
    "class",
    "step",
    "take",
    "choose",
    "chooseleaf",
    "firstn",
    "indep",
    "emit",
    "straw2",
    "straw",
    "list",
    "tree",
    "uniform",
    "replicated",
    "erasure",
    "min_size",
    "max_size",
    "bucket_id",
    "weight_set",
    "ids",
    "0",
    "1",
    "-1",
    "-2",
    "2",
    "1.5",
    "-0.5",
    "99999999999",
    "osd.0",
    "a",
    "ssd",
    "#",
    "\n",
    "set_choose_tries",
    "choose_total_tries",
    "1e40",
    "nan",
];

/// Parses and, for a map that compiles, maps a few inputs through every rule.
fn check(text: &str) {
    match parse(text) {
        Ok(map) => {
            let mapper = Mapper::for_test(&map);
            let mut ws = Workspace::new();
            let weights = map.default_weights();
            let mut out = Vec::new();
            for rule in 0..map.rules.len() as u32 {
                if map.rule(rule).is_some() {
                    for x in 0..3 {
                        mapper
                            .do_rule(&mut ws, rule, x, 3, &weights, &mut out)
                            .expect("a compiled rule maps");
                        assert!(out.len() <= 3);
                    }
                }
            }
        }
        Err(CrushError::Parse { line, column, .. }) => {
            let lines = text.split('\n').count();
            assert!(line >= 1 && line <= lines, "line {line} of {lines}");
            let len = text
                .split('\n')
                .nth(line - 1)
                .map_or(0, |l| l.chars().count());
            assert!(column >= 1 && column <= len + 1, "column {column} of {len}");
        }
        Err(other) => panic!("text errors are Parse errors, got {other:?}"),
    }
}

#[test]
fn the_full_map_compiles() {
    let map = parse(FULL).expect("FULL compiles");
    assert_eq!(map.rules.len(), 4);
    assert_eq!(map.max_devices, 6);
    // Two classes over one root: every bucket has an ssd and an hdd shadow.
    for id in -5..=-1 {
        assert_eq!(map.class_buckets[&id].len(), 2, "bucket {id}");
    }
    assert_eq!(
        map.class_buckets[&-1][&0], -10,
        "the explicit shadow id is kept"
    );
    assert_eq!(map.choose_args[&0][0].ids, vec![-20, 7]);
    check(FULL);
}

#[test]
fn every_truncation_gives_an_error_or_a_map() {
    for (i, _) in FULL.char_indices() {
        check(&FULL[..i]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn token_soup_never_panics(words in prop::collection::vec(0..WORDS.len(), 0..80)) {
        let text: Vec<&str> = words.iter().map(|&i| WORDS[i]).collect();
        check(&text.join(" "));
    }

    #[test]
    fn edited_maps_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0..WORDS.len(), 0..3u8), 1..6)
    ) {
        let mut toks: Vec<String> = FULL.split(' ').map(str::to_string).collect();
        for (at, w, kind) in edits {
            let i = at.index(toks.len());
            match kind {
                0 => toks[i] = WORDS[w].to_string(),
                1 => { toks.remove(i); }
                _ => toks.insert(i, WORDS[w].to_string()),
            }
            if toks.is_empty() {
                break;
            }
        }
        check(&toks.join(" "));
    }
}
