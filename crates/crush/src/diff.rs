//! What changes between two maps: `crushtool --compare`'s count of inputs whose mapping
//! differs ([`compare`], the same weights for both maps, as crushtool uses), and the data
//! movement a change causes ([`movement`]): placements (input, device) that the new map puts
//! on a device the old one did not, against two lower bounds: the moves the per-device counts
//! force (a device holding `k` more placements must receive at least `k`) and the moves the
//! device weights force if CRUSH placed exactly in proportion to weight.

use std::collections::{BTreeMap, BTreeSet};

use crate::batch::map_range;
use crate::builder::item_weight;
use crate::error::CrushError;
use crate::map::{op, CrushMap};
use crate::mapper::Mapper;

/// `crushtool -i OLD --compare NEW`'s figures for one rule: mismatched mappings out of all
/// (inputs x replica counts), the old map's test weights used for both maps.
pub fn compare(
    old: &CrushMap,
    new: &CrushMap,
    rule: u32,
    reps: std::ops::RangeInclusive<usize>,
    xs: std::ops::RangeInclusive<i32>,
) -> Result<(u64, u64), CrushError> {
    let weights = old.default_weights();
    let (mo, mn) = (Mapper::for_test(old), Mapper::for_test(new));
    let mut bad = 0u64;
    let mut total = 0u64;
    for nr in reps {
        let a = map_range(&mo, rule, xs.clone(), nr, &weights, 0)?;
        let b = match map_range(&mn, rule, xs.clone(), nr, &weights, 0) {
            Ok(b) => b,
            // A rule the new map lacks maps nothing: every non-empty old mapping differs.
            Err(CrushError::NoSuchRule(_)) => {
                bad += (0..a.len()).filter(|&i| !a.get(i).is_empty()).count() as u64;
                total += a.len() as u64;
                continue;
            }
            Err(e) => return Err(e),
        };
        bad += (0..a.len()).filter(|&i| a.get(i) != b.get(i)).count() as u64;
        total += a.len() as u64;
    }
    Ok((bad, total))
}

/// Data movement between two maps for one rule, replica count and input range, each map
/// mapping with its own test weights (every device in some bucket at 1.0).
#[derive(Debug, Clone, PartialEq)]
pub struct Movement {
    /// Inputs mapped.
    pub inputs: u64,
    /// Placements (input, device) under the old and the new map.
    pub old_placements: u64,
    /// Placements under the new map.
    pub new_placements: u64,
    /// Inputs whose set of devices changed.
    pub inputs_changed: u64,
    /// Placements on a device the input did not use before: the copies a rebalance makes.
    pub moved: u64,
    /// Lower bound from the counts: the sum over devices of how many more placements they
    /// hold under the new map.
    pub min_moves: u64,
    /// Lower bound from the weights: new placements times the share of weight that changed
    /// hands (devices the rule can reach, at their weight in their bucket).
    pub ideal_moves: f64,
    /// Per device: placements under the old and the new map.
    pub per_device: BTreeMap<i32, (u64, u64)>,
}

impl Movement {
    /// Moved placements over new placements.
    pub fn moved_fraction(&self) -> f64 {
        self.moved as f64 / self.new_placements.max(1) as f64
    }

    /// The count bound over new placements.
    pub fn min_fraction(&self) -> f64 {
        self.min_moves as f64 / self.new_placements.max(1) as f64
    }

    /// The weight bound over new placements.
    pub fn ideal_fraction(&self) -> f64 {
        self.ideal_moves / self.new_placements.max(1) as f64
    }
}

/// Device weights the rule can reach: each device at its weight in the first bucket (in
/// depth-first order from the rule's `take` steps) that holds it, where that bucket itself
/// carries weight.
pub fn reachable_weights(map: &CrushMap, rule: u32) -> Result<BTreeMap<i32, u64>, CrushError> {
    let r = map.rule(rule).ok_or(CrushError::NoSuchRule(rule))?;
    let mut out = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for s in r.steps.iter().filter(|s| s.op == op::TAKE) {
        let mut stack = vec![s.arg1];
        while let Some(id) = stack.pop() {
            let Some(b) = map.bucket(id) else { continue };
            if !seen.insert(id) {
                continue;
            }
            for (pos, &item) in b.items.iter().enumerate().rev() {
                if item >= 0 {
                    out.entry(item).or_insert(item_weight(b, pos) as u64);
                } else {
                    stack.push(item);
                }
            }
        }
    }
    Ok(out)
}

/// Movement from `old` to `new` for `rule`, `replicas` results per input, inputs `xs`.
pub fn movement(
    old: &CrushMap,
    new: &CrushMap,
    rule: u32,
    replicas: usize,
    xs: std::ops::RangeInclusive<i32>,
) -> Result<Movement, CrushError> {
    let (mo, mn) = (Mapper::for_test(old), Mapper::for_test(new));
    let a = map_range(&mo, rule, xs.clone(), replicas, &old.default_weights(), 0)?;
    let b = map_range(&mn, rule, xs, replicas, &new.default_weights(), 0)?;
    let real = |d: &i32| *d >= 0 && *d != crate::map::ITEM_NONE;
    let mut per_device: BTreeMap<i32, (u64, u64)> = BTreeMap::new();
    let (mut old_p, mut new_p, mut changed, mut moved) = (0u64, 0u64, 0u64, 0u64);
    for i in 0..a.len() {
        let before: BTreeSet<i32> = a.get(i).iter().copied().filter(real).collect();
        let after: BTreeSet<i32> = b.get(i).iter().copied().filter(real).collect();
        for d in &before {
            per_device.entry(*d).or_default().0 += 1;
        }
        for d in &after {
            per_device.entry(*d).or_default().1 += 1;
        }
        old_p += before.len() as u64;
        new_p += after.len() as u64;
        let arrived = after.difference(&before).count() as u64;
        moved += arrived;
        if before != after {
            changed += 1;
        }
    }
    let min_moves = per_device.values().map(|&(o, n)| n.saturating_sub(o)).sum();
    let (wo, wn) = (reachable_weights(old, rule)?, reachable_weights(new, rule)?);
    let (to, tn) = (
        wo.values().sum::<u64>().max(1) as f64,
        wn.values().sum::<u64>().max(1) as f64,
    );
    let devices: BTreeSet<i32> = wo.keys().chain(wn.keys()).copied().collect();
    let gained: f64 = devices
        .iter()
        .map(|d| {
            let so = wo.get(d).copied().unwrap_or(0) as f64 / to;
            let sn = wn.get(d).copied().unwrap_or(0) as f64 / tn;
            (sn - so).max(0.0)
        })
        .sum();
    Ok(Movement {
        inputs: a.len() as u64,
        old_placements: old_p,
        new_placements: new_p,
        inputs_changed: changed,
        moved,
        min_moves,
        ideal_moves: gained * new_p as f64,
        per_device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    fn flat(n: usize, weights: &[&str]) -> CrushMap {
        let mut t = String::from("type 0 osd\ntype 1 root\n");
        for i in 0..n {
            t.push_str(&format!("device {i} osd.{i}\n"));
        }
        t.push_str("root r {\n\tid -1\n\talg straw2\n");
        for (i, w) in weights.iter().enumerate().take(n) {
            t.push_str(&format!("\titem osd.{i} weight {w}\n"));
        }
        t.push_str("}\nrule x {\n\tid 0\n\ttype replicated\n\tstep take r\n\tstep choose firstn 0 type osd\n\tstep emit\n}\n");
        parse(&t).expect("test map")
    }

    #[test]
    fn the_same_map_moves_nothing() {
        let m = flat(5, &["1"; 5]);
        let mv = movement(&m, &m, 0, 2, 0..=999).expect("movement");
        assert_eq!((mv.moved, mv.min_moves, mv.inputs_changed), (0, 0, 0));
        assert_eq!(mv.new_placements, 2000);
        assert_eq!(
            compare(&m, &m, 0, 1..=3, 0..=99).expect("compare"),
            (0, 300)
        );
    }

    #[test]
    fn adding_a_device_moves_at_least_the_bounds_and_only_onto_it() {
        let old = flat(5, &["1"; 6]);
        let new = flat(6, &["1"; 6]);
        let mv = movement(&old, &new, 0, 2, 0..=9999).expect("movement");
        assert!(mv.moved >= mv.min_moves, "{mv:?}");
        assert!((mv.ideal_fraction() - 1.0 / 6.0).abs() < 1e-9, "{mv:?}");
        assert_eq!(mv.min_moves, mv.per_device[&5].1);
        for d in 0..5 {
            let (o, n) = mv.per_device[&d];
            assert!(n <= o, "device {d} gained placements: {o} -> {n}");
        }
        // A second replica can shift when the first moves (firstn retries on collision), so
        // a few placements move between old devices too; the target is 1.2x.
        assert!(mv.moved as f64 <= 1.2 * mv.ideal_moves, "{mv:?}");
        // One replica: straw2 moves placements onto the new device only.
        let one = movement(&old, &new, 0, 1, 0..=9999).expect("movement");
        assert_eq!(one.moved, one.per_device[&5].1, "{one:?}");
        assert_eq!(one.moved, one.min_moves);
    }

    #[test]
    fn reweighting_counts_weight_that_changed_hands() {
        let old = flat(4, &["1"; 4]);
        let new = flat(4, &["1", "1", "1", "3"]);
        let mv = movement(&old, &new, 0, 1, 0..=9999).expect("movement");
        // Device 3 goes from 1/4 to 1/2 of the weight.
        assert!((mv.ideal_fraction() - 0.25).abs() < 1e-9, "{mv:?}");
        assert!(mv.moved >= mv.min_moves && mv.min_moves > 0);
    }
}
