//! The decoder and mapper on hostile input: random bytes, every truncation and random byte
//! changes of real maps, and hand-made structural faults (cycles, dangling ids, absurd counts,
//! inconsistent arrays). Decoding must give a typed error or a map that maps without panicking;
//! never a panic, never a huge allocation.

use std::collections::BTreeMap;

use kura_crush::map::{op, Bucket, BucketKind, Rule, Step, Tunables};
use kura_crush::{decode, encode, CrushError, CrushMap, Mapper, Workspace};
use proptest::prelude::*;

/// A small map built by hand: two straw2 hosts of two devices under a straw root, with a
/// chooseleaf firstn rule and an indep rule.
fn sample() -> CrushMap {
    let host = |id: i32, items: Vec<i32>| Bucket {
        id,
        bucket_type: 1,
        hash: 0,
        weight: 0x20000,
        kind: BucketKind::Straw2 {
            item_weights: vec![0x10000; items.len()],
        },
        items,
    };
    let root = Bucket {
        id: -3,
        bucket_type: 2,
        hash: 0,
        weight: 0x40000,
        items: vec![-1, -2],
        kind: BucketKind::Straw {
            item_weights: vec![0x20000, 0x20000],
            straws: vec![0x10000, 0x10000],
        },
    };
    let rule = |ruleset: u8, choose: u32| Rule {
        ruleset,
        rule_type: 1,
        min_size: 1,
        max_size: 10,
        steps: vec![
            Step {
                op: op::TAKE,
                arg1: -3,
                arg2: 0,
            },
            Step {
                op: choose,
                arg1: 0,
                arg2: 1,
            },
            Step {
                op: op::EMIT,
                arg1: 0,
                arg2: 0,
            },
        ],
    };
    let names = |v: &[(i32, &str)]| -> BTreeMap<i32, String> {
        v.iter().map(|(k, s)| (*k, s.to_string())).collect()
    };
    CrushMap {
        buckets: vec![
            Some(host(-1, vec![0, 1])),
            Some(host(-2, vec![2, 3])),
            Some(root),
        ],
        rules: vec![
            Some(rule(0, op::CHOOSELEAF_FIRSTN)),
            Some(rule(1, op::CHOOSELEAF_INDEP)),
        ],
        max_devices: 4,
        tunables: Tunables::jewel(),
        type_names: names(&[(0, "osd"), (1, "host"), (2, "root")]),
        item_names: names(&[
            (0, "osd.0"),
            (1, "osd.1"),
            (2, "osd.2"),
            (3, "osd.3"),
            (-1, "host0"),
            (-2, "host1"),
            (-3, "root"),
        ]),
        rule_names: names(&[(0, "r0"), (1, "r1")]),
        class_map: BTreeMap::new(),
        class_names: BTreeMap::new(),
        class_buckets: BTreeMap::new(),
        choose_args: BTreeMap::new(),
    }
}

/// Re-encodes the map (which must decode to the same map), then maps a few inputs through
/// every rule, checking that nothing panics and results stay within `result_max`.
fn exercise(map: &CrushMap) {
    let again = decode(&encode(map)).expect("a decoded map re-encodes to a decodable one");
    assert_eq!(&again, map);
    let mapper = Mapper::new(map);
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    let weights = map.default_weights();
    for rule in 0..map.rules.len() as u32 {
        if map.rule(rule).is_none() {
            continue;
        }
        for n in [0, 1, 3, 6] {
            for x in 0..8 {
                mapper
                    .do_rule(&mut ws, rule, x, n, &weights, &mut out)
                    .expect("rule exists");
                assert!(out.len() <= n);
            }
        }
    }
}

#[test]
fn hand_built_map_round_trips_and_maps() {
    let m = sample();
    let bytes = encode(&m);
    let back = decode(&bytes).expect("decode");
    assert_eq!(back, m);
    let mapper = Mapper::new(&back);
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    let w = back.default_weights();
    for x in 0..200 {
        mapper
            .do_rule(&mut ws, 0, x, 2, &w, &mut out)
            .expect("rule 0");
        assert_eq!(out.len(), 2);
        // One device per host.
        assert_ne!(out[0] / 2, out[1] / 2, "x={x} {out:?}");
    }
}

#[test]
fn simd_and_portable_straw2_agree() {
    // Straw2 everywhere (the sample's root is straw): the fast path with and without AVX2, and
    // the plain path through choose_args that only repeat the bucket weights.
    let mut m = sample();
    if let Some(b) = m.buckets[2].as_mut() {
        b.kind = BucketKind::Straw2 {
            item_weights: vec![0x20000, 0x18000],
        };
    }
    let args: Vec<kura_crush::map::ChooseArg> = m
        .buckets
        .iter()
        .map(|b| kura_crush::map::ChooseArg {
            weight_set: match b.as_ref().map(|b| &b.kind) {
                Some(BucketKind::Straw2 { item_weights }) => vec![item_weights.clone()],
                _ => vec![],
            },
            ids: vec![],
        })
        .collect();
    let fast = Mapper::new(&m);
    let portable = Mapper::new(&m).without_avx2();
    let plain = Mapper::with_choose_args(&m, &args).expect("one arg per bucket");
    let w = m.default_weights();
    let mut ws = Workspace::new();
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for x in -500..3000 {
        for rule in [0, 1] {
            fast.do_rule(&mut ws, rule, x, 3, &w, &mut a).expect("rule");
            portable
                .do_rule(&mut ws, rule, x, 3, &w, &mut b)
                .expect("rule");
            plain
                .do_rule(&mut ws, rule, x, 3, &w, &mut c)
                .expect("rule");
            assert_eq!(a, b, "x={x} rule {rule}");
            assert_eq!(a, c, "x={x} rule {rule}");
        }
    }
}

#[test]
fn every_truncation_is_an_error_or_a_usable_map() {
    let bytes = encode(&sample());
    let mut errors = 0;
    for len in 0..bytes.len() {
        match decode(&bytes[..len]) {
            Ok(m) => exercise(&m),
            Err(CrushError::Truncated { .. }) | Err(CrushError::TooLarge { .. }) => errors += 1,
            Err(e) => panic!("prefix {len}: unexpected error {e}"),
        }
    }
    // Only cuts at the optional-tunables boundaries may decode.
    assert!(errors >= bytes.len() - 8, "{errors} of {}", bytes.len());
}

#[test]
fn structural_faults_are_typed_errors() {
    // Bad magic.
    let mut bytes = encode(&sample());
    bytes[0] ^= 1;
    assert!(matches!(decode(&bytes), Err(CrushError::BadMagic(_))));

    // Cycle: the root contains itself through host0.
    let mut m = sample();
    if let Some(b) = m.buckets[0].as_mut() {
        b.items.push(-3);
        if let BucketKind::Straw2 { item_weights } = &mut b.kind {
            item_weights.push(0x10000);
        }
    }
    assert!(matches!(decode(&encode(&m)), Err(CrushError::Cycle { .. })));

    // Dangling bucket id.
    let mut m = sample();
    if let Some(b) = m.buckets[2].as_mut() {
        b.items[1] = -9;
    }
    assert!(matches!(
        decode(&encode(&m)),
        Err(CrushError::DanglingItem { item: -9, .. })
    ));

    // Ruleset that is not the rule id.
    let mut m = sample();
    if let Some(r) = m.rules[1].as_mut() {
        r.ruleset = 7;
    }
    assert!(matches!(
        decode(&encode(&m)),
        Err(CrushError::RulesetMismatch {
            rule: 1,
            ruleset: 7
        })
    ));

    // Bucket id that does not match its slot.
    let mut m = sample();
    if let Some(b) = m.buckets[0].as_mut() {
        b.id = -2;
    }
    assert!(matches!(decode(&encode(&m)), Err(CrushError::Invalid(_))));

    // Tree whose node count cannot hold its items.
    let mut m = sample();
    if let Some(b) = m.buckets[1].as_mut() {
        b.kind = BucketKind::Tree {
            node_weights: vec![0, 0x10000],
        };
    }
    assert!(matches!(decode(&encode(&m)), Err(CrushError::Invalid(_))));

    // Absurd counts: max_buckets, a bucket size, a rule length, max_devices.
    let good = encode(&sample());
    let mut b = good.clone();
    b[4..8].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    assert!(matches!(decode(&b), Err(CrushError::TooLarge { .. })));
    let mut b = good.clone();
    b[12..16].copy_from_slice(&(-5i32).to_le_bytes());
    assert!(matches!(decode(&b), Err(CrushError::Negative { .. })));
    let mut b = good.clone();
    b[12..16].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    assert!(matches!(decode(&b), Err(CrushError::TooLarge { .. })));
    // First bucket's size field: magic, 3 counts, alg, id, type+alg+hash, weight.
    let mut b = good.clone();
    b[32..36].copy_from_slice(&0x4000_0000u32.to_le_bytes());
    assert!(matches!(decode(&b), Err(CrushError::TooLarge { .. })));

    // Unknown algorithm.
    let mut b = good;
    b[16..20].copy_from_slice(&9u32.to_le_bytes());
    assert!(matches!(
        decode(&b),
        Err(CrushError::UnknownAlgorithm { alg: 9, .. })
    ));
}

#[test]
fn empty_buckets_and_zero_weights_map_like_ceph() {
    // An empty host is legal in Ceph: choosing into it is rejected and retried elsewhere.
    let mut m = sample();
    if let Some(b) = m.buckets[1].as_mut() {
        b.items.clear();
        b.kind = BucketKind::Straw2 {
            item_weights: vec![],
        };
    }
    let m = decode(&encode(&m)).expect("empty bucket is valid");
    let mapper = Mapper::new(&m);
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    let w = m.default_weights();
    for x in 0..100 {
        mapper
            .do_rule(&mut ws, 0, x, 2, &w, &mut out)
            .expect("rule");
        assert_eq!(out.len(), 1, "only host0 can serve: {out:?}");
        assert!(out[0] == 0 || out[0] == 1);
        mapper
            .do_rule(&mut ws, 1, x, 2, &w, &mut out)
            .expect("rule");
        assert_eq!(out.len(), 2);
        assert!(
            out.contains(&kura_crush::ITEM_NONE),
            "indep leaves a hole: {out:?}"
        );
    }
    // Every device out: nothing maps.
    let zero = vec![0u32; 4];
    mapper
        .do_rule(&mut ws, 0, 5, 3, &zero, &mut out)
        .expect("rule");
    assert!(out.is_empty());
    // A missing rule is an error, not a panic.
    assert!(matches!(
        mapper.do_rule(&mut ws, 9, 0, 3, &w, &mut out),
        Err(CrushError::NoSuchRule(9))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(m) = decode(&bytes) {
            exercise(&m);
        }
    }

    #[test]
    fn random_changes_to_a_real_map_never_panic(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = encode(&sample());
        for (at, v) in edits {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        if let Ok(m) = decode(&bytes) {
            exercise(&m);
        }
    }

    #[test]
    fn random_magic_prefixed_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut bytes = 0x0001_0000u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&tail);
        if let Ok(m) = decode(&bytes) {
            exercise(&m);
        }
    }
}
