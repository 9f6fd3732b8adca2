//! Encoder for the compiled CRUSH map, the inverse of [`crate::decode`]: writes the same
//! layout (all tunables, device classes, `choose_args`), so `crushtool` reads what it writes.
//! Used to hand-build maps in tests and to re-emit a decoded map.

use std::collections::BTreeMap;

use crate::decode::CRUSH_MAGIC;
use crate::map::{BucketKind, CrushMap};

fn u32v(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn i32v(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn names(out: &mut Vec<u8>, m: &BTreeMap<i32, String>) {
    u32v(out, m.len() as u32);
    for (k, v) in m {
        i32v(out, *k);
        if v.is_empty() {
            // A zero length reads as the upper half of an old 64-bit key, so an empty name is
            // written in that old form: zero, then its real (zero) length.
            u32v(out, 0);
        }
        u32v(out, v.len() as u32);
        out.extend_from_slice(v.as_bytes());
    }
}

fn ints(out: &mut Vec<u8>, m: &BTreeMap<i32, i32>) {
    u32v(out, m.len() as u32);
    for (k, v) in m {
        i32v(out, *k);
        i32v(out, *v);
    }
}

/// Encodes a map (it need not be valid: tests encode broken maps on purpose).
pub fn encode(map: &CrushMap) -> Vec<u8> {
    let mut o = Vec::new();
    u32v(&mut o, CRUSH_MAGIC);
    i32v(&mut o, map.buckets.len() as i32);
    u32v(&mut o, map.rules.len() as u32);
    i32v(&mut o, map.max_devices);
    for b in &map.buckets {
        let Some(b) = b else {
            u32v(&mut o, 0);
            continue;
        };
        let alg = b.kind.alg();
        u32v(&mut o, alg as u32);
        i32v(&mut o, b.id);
        o.extend_from_slice(&b.bucket_type.to_le_bytes());
        o.push(alg);
        o.push(b.hash);
        u32v(&mut o, b.weight);
        u32v(&mut o, b.items.len() as u32);
        for &it in &b.items {
            i32v(&mut o, it);
        }
        match &b.kind {
            BucketKind::Uniform { item_weight } => u32v(&mut o, *item_weight),
            BucketKind::List {
                item_weights,
                sum_weights,
            } => {
                for (w, s) in item_weights.iter().zip(sum_weights) {
                    u32v(&mut o, *w);
                    u32v(&mut o, *s);
                }
            }
            BucketKind::Tree { node_weights } => {
                o.push(node_weights.len() as u8);
                for w in node_weights {
                    u32v(&mut o, *w);
                }
            }
            BucketKind::Straw {
                item_weights,
                straws,
            } => {
                for (w, s) in item_weights.iter().zip(straws) {
                    u32v(&mut o, *w);
                    u32v(&mut o, *s);
                }
            }
            BucketKind::Straw2 { item_weights } => {
                for w in item_weights {
                    u32v(&mut o, *w);
                }
            }
        }
    }
    for r in &map.rules {
        let Some(r) = r else {
            u32v(&mut o, 0);
            continue;
        };
        u32v(&mut o, 1);
        u32v(&mut o, r.steps.len() as u32);
        o.extend_from_slice(&[r.ruleset, r.rule_type, r.min_size, r.max_size]);
        for s in &r.steps {
            u32v(&mut o, s.op);
            i32v(&mut o, s.arg1);
            i32v(&mut o, s.arg2);
        }
    }
    names(&mut o, &map.type_names);
    names(&mut o, &map.item_names);
    names(&mut o, &map.rule_names);
    let t = &map.tunables;
    u32v(&mut o, t.choose_local_tries);
    u32v(&mut o, t.choose_local_fallback_tries);
    u32v(&mut o, t.choose_total_tries);
    u32v(&mut o, t.chooseleaf_descend_once);
    o.push(t.chooseleaf_vary_r);
    o.push(t.straw_calc_version);
    u32v(&mut o, t.allowed_bucket_algs);
    o.push(t.chooseleaf_stable);
    ints(&mut o, &map.class_map);
    names(&mut o, &map.class_names);
    u32v(&mut o, map.class_buckets.len() as u32);
    for (k, m) in &map.class_buckets {
        i32v(&mut o, *k);
        ints(&mut o, m);
    }
    u32v(&mut o, map.choose_args.len() as u32);
    for (index, args) in &map.choose_args {
        o.extend_from_slice(&index.to_le_bytes());
        let used: Vec<(usize, _)> = args
            .iter()
            .enumerate()
            .filter(|(_, a)| !a.weight_set.is_empty() || !a.ids.is_empty())
            .collect();
        u32v(&mut o, used.len() as u32);
        for (bi, a) in used {
            u32v(&mut o, bi as u32);
            u32v(&mut o, a.weight_set.len() as u32);
            for ws in &a.weight_set {
                u32v(&mut o, ws.len() as u32);
                for w in ws {
                    u32v(&mut o, *w);
                }
            }
            u32v(&mut o, a.ids.len() as u32);
            for id in &a.ids {
                i32v(&mut o, *id);
            }
        }
    }
    o
}
