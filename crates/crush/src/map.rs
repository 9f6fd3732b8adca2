//! The in-memory CRUSH map: buckets with their algorithm-specific weights, rules and their
//! steps, tunables (with Ceph's named profiles), names, device classes with their shadow
//! buckets, and `choose_args` weight sets. [`CrushMap::validate`] checks what the mapper relies
//! on (every referenced bucket exists, the hierarchy has no cycles, per-algorithm arrays are
//! consistent), so mapping a validated map never indexes out of bounds.

use std::collections::BTreeMap;

use crate::error::CrushError;

/// Bucket algorithm numbers as Ceph encodes them.
pub const ALG_UNIFORM: u8 = 1;
/// List bucket.
pub const ALG_LIST: u8 = 2;
/// Binary tree bucket.
pub const ALG_TREE: u8 = 3;
/// Straw bucket (the original, pre-Hammer straw).
pub const ALG_STRAW: u8 = 4;
/// Straw2 bucket.
pub const ALG_STRAW2: u8 = 5;

/// Largest retry count accepted in tunables and `set_*_tries` steps. Ceph takes any value, but
/// its profiles use at most 50 and erasure-code rules 100; a map asking for millions of retries
/// would make one mapping take minutes, so such maps are refused as absurd.
pub const MAX_TRIES: u32 = 256;

/// Largest replica count a rule step may ask for, and the largest result a mapping may be
/// asked to fill. Ceph sets no bound, but `firstn` makes `tries` attempts for every position
/// up to the count even when none can be filled, so a count in the millions never finishes.
pub const MAX_REP: usize = 1024;

/// The item no position could be filled with (`CRUSH_ITEM_NONE`), printed as 2147483647.
pub const ITEM_NONE: i32 = 0x7fff_ffff;
/// Not yet decided (`CRUSH_ITEM_UNDEF`), internal to `indep` choices.
pub const ITEM_UNDEF: i32 = 0x7fff_fffe;

/// What distinguishes one bucket algorithm from another: the weights it chooses with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketKind {
    /// Every item has the same weight.
    Uniform {
        /// The common item weight (16.16 fixed point).
        item_weight: u32,
    },
    /// Items and the running sums of their weights, tail first.
    List {
        /// Item weights.
        item_weights: Vec<u32>,
        /// `sum_weights[i]` = weight of items `0..=i`.
        sum_weights: Vec<u32>,
    },
    /// A binary tree of node weights; item `i` is leaf node `2i + 1`.
    Tree {
        /// Node weights, `num_nodes` of them.
        node_weights: Vec<u32>,
    },
    /// Straw lengths precomputed by the builder.
    Straw {
        /// Item weights.
        item_weights: Vec<u32>,
        /// Straw lengths.
        straws: Vec<u32>,
    },
    /// Exponential draws scaled by the item weights.
    Straw2 {
        /// Item weights.
        item_weights: Vec<u32>,
    },
}

impl BucketKind {
    /// Ceph's algorithm number.
    pub fn alg(&self) -> u8 {
        match self {
            BucketKind::Uniform { .. } => ALG_UNIFORM,
            BucketKind::List { .. } => ALG_LIST,
            BucketKind::Tree { .. } => ALG_TREE,
            BucketKind::Straw { .. } => ALG_STRAW,
            BucketKind::Straw2 { .. } => ALG_STRAW2,
        }
    }

    /// The algorithm's name as `crushtool -d` prints it.
    pub fn alg_name(&self) -> &'static str {
        match self {
            BucketKind::Uniform { .. } => "uniform",
            BucketKind::List { .. } => "list",
            BucketKind::Tree { .. } => "tree",
            BucketKind::Straw { .. } => "straw",
            BucketKind::Straw2 { .. } => "straw2",
        }
    }
}

/// One bucket: an interior node of the hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Negative id; the bucket sits at index `-1 - id`.
    pub id: i32,
    /// Its type (host, rack, ...), an index into the type names.
    pub bucket_type: u16,
    /// Hash function (0 = rjenkins1).
    pub hash: u8,
    /// Total weight (16.16 fixed point).
    pub weight: u32,
    /// Children: devices (>= 0) and buckets (< 0).
    pub items: Vec<i32>,
    /// Algorithm and its weights.
    pub kind: BucketKind,
}

/// Rule step opcodes as Ceph encodes them.
pub mod op {
    /// Does nothing.
    pub const NOOP: u32 = 0;
    /// Start from an item.
    pub const TAKE: u32 = 1;
    /// `choose firstn N type T`.
    pub const CHOOSE_FIRSTN: u32 = 2;
    /// `choose indep N type T`.
    pub const CHOOSE_INDEP: u32 = 3;
    /// Append the working set to the result.
    pub const EMIT: u32 = 4;
    /// `chooseleaf firstn N type T`.
    pub const CHOOSELEAF_FIRSTN: u32 = 6;
    /// `chooseleaf indep N type T`.
    pub const CHOOSELEAF_INDEP: u32 = 7;
    /// `set_choose_tries`.
    pub const SET_CHOOSE_TRIES: u32 = 8;
    /// `set_chooseleaf_tries`.
    pub const SET_CHOOSELEAF_TRIES: u32 = 9;
    /// `set_choose_local_tries`.
    pub const SET_CHOOSE_LOCAL_TRIES: u32 = 10;
    /// `set_choose_local_fallback_tries`.
    pub const SET_CHOOSE_LOCAL_FALLBACK_TRIES: u32 = 11;
    /// `set_chooseleaf_vary_r`.
    pub const SET_CHOOSELEAF_VARY_R: u32 = 12;
    /// `set_chooseleaf_stable`.
    pub const SET_CHOOSELEAF_STABLE: u32 = 13;
}

/// One rule step: an opcode and its two arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Opcode (see [`op`]).
    pub op: u32,
    /// First argument (item for `take`, count for choose steps, value for `set_*`).
    pub arg1: i32,
    /// Second argument (type for choose steps).
    pub arg2: i32,
}

/// A rule: its legacy mask and its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Ruleset (equal to the rule id in current encodings).
    pub ruleset: u8,
    /// Rule type (1 replicated, 3 erasure).
    pub rule_type: u8,
    /// Legacy minimum size.
    pub min_size: u8,
    /// Legacy maximum size.
    pub max_size: u8,
    /// Steps in order.
    pub steps: Vec<Step>,
}

/// The tunables that change mappings, plus the two that only change how maps are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    /// Local retries after a collision before a new descent.
    pub choose_local_tries: u32,
    /// Local retries with a permutation before a new descent.
    pub choose_local_fallback_tries: u32,
    /// Total descents (one fewer than the tries the mapper makes).
    pub choose_total_tries: u32,
    /// chooseleaf recurses with one try.
    pub chooseleaf_descend_once: u32,
    /// chooseleaf's inner r depends on the outer r (shifted by `vary_r - 1`).
    pub chooseleaf_vary_r: u8,
    /// chooseleaf firstn starts the inner choice at rep 0.
    pub chooseleaf_stable: u8,
    /// How straw buckets were built (no effect on mapping).
    pub straw_calc_version: u8,
    /// Bucket algorithms allowed when building (no effect on mapping).
    pub allowed_bucket_algs: u32,
}

impl Tunables {
    /// `legacy` (and `argonaut`): what a map that encodes no tunables maps with.
    pub fn legacy() -> Tunables {
        Tunables {
            choose_local_tries: 2,
            choose_local_fallback_tries: 5,
            choose_total_tries: 19,
            chooseleaf_descend_once: 0,
            chooseleaf_vary_r: 0,
            chooseleaf_stable: 0,
            straw_calc_version: 0,
            allowed_bucket_algs: (1 << ALG_UNIFORM) | (1 << ALG_LIST) | (1 << ALG_STRAW),
        }
    }

    /// `bobtail`.
    pub fn bobtail() -> Tunables {
        Tunables {
            choose_local_tries: 0,
            choose_local_fallback_tries: 0,
            choose_total_tries: 50,
            chooseleaf_descend_once: 1,
            ..Tunables::legacy()
        }
    }

    /// `firefly`.
    pub fn firefly() -> Tunables {
        Tunables {
            chooseleaf_vary_r: 1,
            ..Tunables::bobtail()
        }
    }

    /// `hammer`: firefly plus straw2 allowed.
    pub fn hammer() -> Tunables {
        Tunables {
            straw_calc_version: 1,
            allowed_bucket_algs: Tunables::legacy().allowed_bucket_algs | (1 << ALG_STRAW2),
            ..Tunables::firefly()
        }
    }

    /// `jewel` (also `optimal` and `default` since Jewel).
    pub fn jewel() -> Tunables {
        Tunables {
            chooseleaf_stable: 1,
            ..Tunables::hammer()
        }
    }

    /// A profile by the name `ceph osd crush tunables` takes.
    pub fn profile(name: &str) -> Option<Tunables> {
        Some(match name {
            "legacy" | "argonaut" => Tunables::legacy(),
            "bobtail" => Tunables::bobtail(),
            "firefly" => Tunables::firefly(),
            "hammer" => Tunables::hammer(),
            "jewel" | "optimal" | "default" => Tunables::jewel(),
            _ => return None,
        })
    }
}

/// Per-bucket alternative weights and ids for straw2 (`choose_args`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChooseArg {
    /// One weight vector per output position; the last serves every later position.
    pub weight_set: Vec<Vec<u32>>,
    /// Ids to hash with instead of the bucket's items.
    pub ids: Vec<i32>,
}

/// A decoded CRUSH map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrushMap {
    /// Bucket at index `-1 - id`, `None` for an unused id.
    pub buckets: Vec<Option<Bucket>>,
    /// Rule at its id, `None` for an unused id.
    pub rules: Vec<Option<Rule>>,
    /// Devices are `0..max_devices`.
    pub max_devices: i32,
    /// Tunables.
    pub tunables: Tunables,
    /// Type id to name.
    pub type_names: BTreeMap<i32, String>,
    /// Item id to name (devices and buckets).
    pub item_names: BTreeMap<i32, String>,
    /// Rule id to name.
    pub rule_names: BTreeMap<i32, String>,
    /// Item id to device-class id.
    pub class_map: BTreeMap<i32, i32>,
    /// Class id to name.
    pub class_names: BTreeMap<i32, String>,
    /// Bucket id to (class id to shadow bucket id).
    pub class_buckets: BTreeMap<i32, BTreeMap<i32, i32>>,
    /// Weight sets by index (`-1` is the default set), each with one entry per bucket index.
    pub choose_args: BTreeMap<i64, Vec<ChooseArg>>,
}

impl CrushMap {
    /// Number of bucket slots (`max_buckets`).
    pub fn max_buckets(&self) -> i32 {
        self.buckets.len() as i32
    }

    /// The bucket with this (negative) id.
    pub fn bucket(&self, id: i32) -> Option<&Bucket> {
        if id >= 0 {
            return None;
        }
        let idx = (-1i64 - id as i64) as usize;
        self.buckets.get(idx).and_then(|b| b.as_ref())
    }

    /// The rule with this id.
    pub fn rule(&self, id: u32) -> Option<&Rule> {
        self.rules.get(id as usize).and_then(|r| r.as_ref())
    }

    /// A rule's name, or `rule<N>` as crushtool names a rule without one.
    pub fn rule_name(&self, id: u32) -> String {
        self.rule_names
            .get(&(id as i32))
            .cloned()
            .unwrap_or_default()
    }

    /// The rule id with this name.
    pub fn rule_by_name(&self, name: &str) -> Option<u32> {
        self.rule_names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| *id as u32)
    }

    /// Whether a device appears in some bucket (crushtool gives such devices weight 1.0).
    pub fn device_present(&self, dev: i32) -> bool {
        self.buckets
            .iter()
            .flatten()
            .any(|b| b.items.contains(&dev))
    }

    /// The per-device weights `crushtool --test` maps with: 1.0 (0x10000) for every device in
    /// some bucket, 0 for the rest.
    pub fn default_weights(&self) -> Vec<u32> {
        let mut present = vec![false; self.max_devices.max(0) as usize];
        for b in self.buckets.iter().flatten() {
            for &it in &b.items {
                if it >= 0 && (it as usize) < present.len() {
                    present[it as usize] = true;
                }
            }
        }
        present
            .into_iter()
            .map(|p| if p { 0x10000 } else { 0 })
            .collect()
    }

    /// The choose_args `crushtool --test` maps with: set 0, else the default set (-1).
    pub fn test_choose_args(&self) -> Option<&[ChooseArg]> {
        self.choose_args
            .get(&0)
            .or_else(|| self.choose_args.get(&-1))
            .map(|v| v.as_slice())
    }

    /// Checks everything the mapper relies on; decoding calls it.
    pub fn validate(&self) -> Result<(), CrushError> {
        let nb = self.buckets.len();
        let t = &self.tunables;
        for (what, v) in [
            ("choose_local_tries", t.choose_local_tries),
            ("choose_local_fallback_tries", t.choose_local_fallback_tries),
            ("choose_total_tries", t.choose_total_tries),
        ] {
            if v > MAX_TRIES {
                return Err(CrushError::TooLarge {
                    what,
                    value: v as u64,
                    max: MAX_TRIES as u64,
                });
            }
        }
        for (idx, b) in self.buckets.iter().enumerate() {
            let Some(b) = b else { continue };
            if b.id != -1 - idx as i32 {
                return Err(CrushError::Invalid(format!(
                    "bucket at index {idx} has id {}, expected {}",
                    b.id,
                    -1 - idx as i32
                )));
            }
            for &it in &b.items {
                if it < 0 && self.bucket(it).is_none() {
                    return Err(CrushError::DanglingItem {
                        bucket: b.id,
                        item: it,
                    });
                }
                if it >= 0 && it >= self.max_devices {
                    // Ceph maps such an item to "bad item" and skips it; that is defined
                    // behaviour, so it is allowed.
                }
            }
            let n = b.items.len();
            match &b.kind {
                BucketKind::Uniform { .. } => {}
                BucketKind::List {
                    item_weights,
                    sum_weights,
                } => {
                    if item_weights.len() != n || sum_weights.len() != n {
                        return Err(CrushError::Invalid(format!(
                            "list bucket {} has {} items but {}/{} weights",
                            b.id,
                            n,
                            item_weights.len(),
                            sum_weights.len()
                        )));
                    }
                }
                BucketKind::Tree { node_weights } => {
                    // Leaves are the odd nodes 2i+1, so every item needs node 2n-1 and the
                    // root (num_nodes / 2) must be a valid node.
                    if n > 0 && node_weights.len() < 2 * n {
                        return Err(CrushError::Invalid(format!(
                            "tree bucket {} has {} items but only {} nodes",
                            b.id,
                            n,
                            node_weights.len()
                        )));
                    }
                    if n > 0 && !node_weights.len().is_power_of_two() {
                        return Err(CrushError::Invalid(format!(
                            "tree bucket {} has {} nodes, not a power of two",
                            b.id,
                            node_weights.len()
                        )));
                    }
                }
                BucketKind::Straw {
                    item_weights,
                    straws,
                } => {
                    if item_weights.len() != n || straws.len() != n {
                        return Err(CrushError::Invalid(format!(
                            "straw bucket {} has {} items but {}/{} weights",
                            b.id,
                            n,
                            item_weights.len(),
                            straws.len()
                        )));
                    }
                }
                BucketKind::Straw2 { item_weights } => {
                    if item_weights.len() != n {
                        return Err(CrushError::Invalid(format!(
                            "straw2 bucket {} has {} items but {} weights",
                            b.id,
                            n,
                            item_weights.len()
                        )));
                    }
                }
            }
        }
        // Cycles: depth-first over the bucket graph with three colours.
        let mut state = vec![0u8; nb];
        for start in 0..nb {
            if self.buckets[start].is_none() || state[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            state[start] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                let items = match &self.buckets[node] {
                    Some(b) => &b.items,
                    None => {
                        stack.pop();
                        continue;
                    }
                };
                if *next >= items.len() {
                    state[node] = 2;
                    stack.pop();
                    continue;
                }
                let it = items[*next];
                *next += 1;
                if it >= 0 {
                    continue;
                }
                let child = (-1i64 - it as i64) as usize;
                match state[child] {
                    0 => {
                        state[child] = 1;
                        stack.push((child, 0));
                    }
                    1 => {
                        return Err(CrushError::Cycle {
                            bucket: -1 - node as i32,
                            item: it,
                        })
                    }
                    _ => {}
                }
            }
        }
        for (id, rule) in self.rules.iter().enumerate() {
            let Some(rule) = rule else { continue };
            // A take of a missing bucket is ignored by Ceph (the working set stays empty) and
            // by the mapper alike, so only the retry counts are checked.
            for s in &rule.steps {
                let tries = matches!(
                    s.op,
                    op::SET_CHOOSE_TRIES
                        | op::SET_CHOOSELEAF_TRIES
                        | op::SET_CHOOSE_LOCAL_TRIES
                        | op::SET_CHOOSE_LOCAL_FALLBACK_TRIES
                );
                let choose = matches!(
                    s.op,
                    op::CHOOSE_FIRSTN
                        | op::CHOOSE_INDEP
                        | op::CHOOSELEAF_FIRSTN
                        | op::CHOOSELEAF_INDEP
                );
                if choose && s.arg1 > MAX_REP as i32 {
                    return Err(CrushError::Invalid(format!(
                        "rule {id} chooses {} items in one step, more than {MAX_REP}",
                        s.arg1
                    )));
                }
                if tries && s.arg1 > MAX_TRIES as i32 {
                    return Err(CrushError::Invalid(format!(
                        "rule {id} sets {} tries, more than {MAX_TRIES}",
                        s.arg1
                    )));
                }
            }
        }
        for (index, args) in &self.choose_args {
            if args.len() != nb {
                return Err(CrushError::Invalid(format!(
                    "choose_args {index} has {} entries for {nb} buckets",
                    args.len()
                )));
            }
            for (bi, arg) in args.iter().enumerate() {
                let size = self.buckets[bi].as_ref().map_or(0, |b| b.items.len());
                if !arg.ids.is_empty() && arg.ids.len() != size {
                    return Err(CrushError::Invalid(format!(
                        "choose_args {index} bucket {} has {} ids for {size} items",
                        -1 - bi as i32,
                        arg.ids.len()
                    )));
                }
                for ws in &arg.weight_set {
                    if ws.len() != size {
                        return Err(CrushError::Invalid(format!(
                            "choose_args {index} bucket {} has a weight set of {} for {size} items",
                            -1 - bi as i32,
                            ws.len()
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}
