//! Decoder for Ceph's binary CRUSH map (the `CrushWrapper` encoding `crushtool -c` and
//! `crushtool --build -o` write): buckets, rules, names, tunables (each optional, as older
//! encodings stop early), device classes and shadow-bucket tables, `choose_args` weight sets,
//! and the MSR tunables of newer releases. Every count is checked against the bytes left before
//! anything is allocated, so a hostile or truncated map gives a [`CrushError`], never a panic or
//! a huge allocation.

use std::collections::BTreeMap;

use crate::error::CrushError;
use crate::map::{
    Bucket, BucketKind, ChooseArg, CrushMap, Rule, Step, Tunables, ALG_LIST, ALG_STRAW, ALG_STRAW2,
    ALG_TREE, ALG_UNIFORM,
};

/// `CRUSH_MAGIC`.
pub const CRUSH_MAGIC: u32 = 0x0001_0000;

/// Largest device count accepted (Ceph's OSD ids stay far below it).
pub const MAX_DEVICES: i32 = 1 << 24;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CrushError> {
        if self.left() < n {
            return Err(CrushError::Truncated {
                what,
                offset: self.pos,
                need: n - self.left(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, CrushError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, CrushError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, CrushError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, CrushError> {
        Ok(self.u32(what)? as i32)
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, CrushError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }

    /// A count of elements that take at least `each` bytes apiece, bounded by the bytes left.
    fn count(&mut self, what: &'static str, each: usize) -> Result<usize, CrushError> {
        let n = self.u32(what)? as usize;
        let max = self.left() / each.max(1);
        if n > max {
            return Err(CrushError::TooLarge {
                what,
                value: n as u64,
                max: max as u64,
            });
        }
        Ok(n)
    }

    fn u32s(&mut self, n: usize, what: &'static str) -> Result<Vec<u32>, CrushError> {
        let bytes = self.take(n.saturating_mul(4), what)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn string(&mut self, len: usize, what: &'static str) -> Result<String, CrushError> {
        Ok(String::from_utf8_lossy(self.take(len, what)?).into_owned())
    }

    /// `map<int32, string>` where old encoders wrote 64-bit keys: a zero length means the key
    /// had four more bytes and the real length follows.
    fn name_map(&mut self, what: &'static str) -> Result<BTreeMap<i32, String>, CrushError> {
        let n = self.count(what, 8)?;
        let mut m = BTreeMap::new();
        for _ in 0..n {
            let key = self.i32(what)?;
            let mut len = self.u32(what)? as usize;
            if len == 0 {
                len = self.u32(what)? as usize;
            }
            let s = self.string(len, what)?;
            m.insert(key, s);
        }
        Ok(m)
    }

    fn int_map(&mut self, what: &'static str) -> Result<BTreeMap<i32, i32>, CrushError> {
        let n = self.count(what, 8)?;
        let mut m = BTreeMap::new();
        for _ in 0..n {
            let k = self.i32(what)?;
            let v = self.i32(what)?;
            m.insert(k, v);
        }
        Ok(m)
    }
}

fn bucket(r: &mut Reader<'_>, index: usize) -> Result<Option<Bucket>, CrushError> {
    let alg = r.u32("bucket alg")?;
    if alg == 0 {
        return Ok(None);
    }
    if !matches!(
        alg as u8,
        ALG_UNIFORM | ALG_LIST | ALG_TREE | ALG_STRAW | ALG_STRAW2
    ) || alg > 0xff
    {
        return Err(CrushError::UnknownAlgorithm { index, alg });
    }
    let id = r.i32("bucket id")?;
    let bucket_type = r.u16("bucket type")?;
    let inner_alg = r.u8("bucket alg")?;
    if inner_alg as u32 != alg {
        return Err(CrushError::Invalid(format!(
            "bucket at index {index} says algorithm {alg} then {inner_alg}"
        )));
    }
    let hash = r.u8("bucket hash")?;
    let weight = r.u32("bucket weight")?;
    let size = r.count("bucket size", 4)?;
    let items: Vec<i32> = r
        .u32s(size, "bucket items")?
        .into_iter()
        .map(|v| v as i32)
        .collect();
    let kind = match alg as u8 {
        ALG_UNIFORM => BucketKind::Uniform {
            item_weight: r.u32("uniform item weight")?,
        },
        ALG_LIST => {
            let pairs = r.u32s(size.saturating_mul(2), "list weights")?;
            BucketKind::List {
                item_weights: pairs.iter().step_by(2).copied().collect(),
                sum_weights: pairs.iter().skip(1).step_by(2).copied().collect(),
            }
        }
        ALG_TREE => {
            let num_nodes = r.u8("tree num_nodes")? as usize;
            let node_weights = r.u32s(num_nodes, "tree node weights")?;
            BucketKind::Tree { node_weights }
        }
        ALG_STRAW => {
            let pairs = r.u32s(size.saturating_mul(2), "straw weights")?;
            BucketKind::Straw {
                item_weights: pairs.iter().step_by(2).copied().collect(),
                straws: pairs.iter().skip(1).step_by(2).copied().collect(),
            }
        }
        _ => BucketKind::Straw2 {
            item_weights: r.u32s(size, "straw2 weights")?,
        },
    };
    Ok(Some(Bucket {
        id,
        bucket_type,
        hash,
        weight,
        items,
        kind,
    }))
}

/// Decodes a compiled CRUSH map and checks it ([`CrushMap::validate`]). Bytes after the last
/// field this decoder knows are ignored, as Ceph ignores them.
pub fn decode(bytes: &[u8]) -> Result<CrushMap, CrushError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let magic = r.u32("magic")?;
    if magic != CRUSH_MAGIC {
        return Err(CrushError::BadMagic(magic));
    }
    let max_buckets = r.i32("max_buckets")?;
    let max_rules = r.u32("max_rules")?;
    let max_devices = r.i32("max_devices")?;
    if max_buckets < 0 {
        return Err(CrushError::Negative {
            what: "max_buckets",
            value: max_buckets as i64,
        });
    }
    if max_devices < 0 {
        return Err(CrushError::Negative {
            what: "max_devices",
            value: max_devices as i64,
        });
    }
    if max_devices > MAX_DEVICES {
        return Err(CrushError::TooLarge {
            what: "max_devices",
            value: max_devices as u64,
            max: MAX_DEVICES as u64,
        });
    }
    // Every bucket slot and rule slot takes at least four bytes.
    let left = r.left() as u64 / 4;
    if max_buckets as u64 > left {
        return Err(CrushError::TooLarge {
            what: "max_buckets",
            value: max_buckets as u64,
            max: left,
        });
    }
    if max_rules as u64 > left {
        return Err(CrushError::TooLarge {
            what: "max_rules",
            value: max_rules as u64,
            max: left,
        });
    }
    let mut buckets = Vec::with_capacity(max_buckets as usize);
    for i in 0..max_buckets as usize {
        buckets.push(bucket(&mut r, i)?);
    }
    let mut rules = Vec::with_capacity(max_rules as usize);
    for i in 0..max_rules {
        let yes = r.u32("rule present")?;
        if yes == 0 {
            rules.push(None);
            continue;
        }
        let len = r.u32("rule len")? as usize;
        let ruleset = r.u8("rule ruleset")?;
        if ruleset as u32 != i {
            return Err(CrushError::RulesetMismatch { rule: i, ruleset });
        }
        let rule_type = r.u8("rule type")?;
        let min_size = r.u8("rule min_size")?;
        let max_size = r.u8("rule max_size")?;
        if len > r.left() / 12 {
            return Err(CrushError::TooLarge {
                what: "rule len",
                value: len as u64,
                max: (r.left() / 12) as u64,
            });
        }
        let mut steps = Vec::with_capacity(len);
        for _ in 0..len {
            steps.push(Step {
                op: r.u32("rule step op")?,
                arg1: r.i32("rule step arg1")?,
                arg2: r.i32("rule step arg2")?,
            });
        }
        rules.push(Some(Rule {
            ruleset,
            rule_type,
            min_size,
            max_size,
            steps,
        }));
    }
    let type_names = r.name_map("type names")?;
    let item_names = r.name_map("item names")?;
    let rule_names = r.name_map("rule names")?;

    let mut t = Tunables::legacy();
    if !r.at_end() {
        t.choose_local_tries = r.u32("choose_local_tries")?;
        t.choose_local_fallback_tries = r.u32("choose_local_fallback_tries")?;
        t.choose_total_tries = r.u32("choose_total_tries")?;
    }
    if !r.at_end() {
        t.chooseleaf_descend_once = r.u32("chooseleaf_descend_once")?;
    }
    if !r.at_end() {
        t.chooseleaf_vary_r = r.u8("chooseleaf_vary_r")?;
    }
    if !r.at_end() {
        t.straw_calc_version = r.u8("straw_calc_version")?;
    }
    if !r.at_end() {
        t.allowed_bucket_algs = r.u32("allowed_bucket_algs")?;
    }
    if !r.at_end() {
        t.chooseleaf_stable = r.u8("chooseleaf_stable")?;
    }
    let mut class_map = BTreeMap::new();
    let mut class_names = BTreeMap::new();
    let mut class_buckets = BTreeMap::new();
    if !r.at_end() {
        class_map = r.int_map("class map")?;
        class_names = r.name_map("class names")?;
        let n = r.count("class buckets", 8)?;
        for _ in 0..n {
            let id = r.i32("class bucket id")?;
            let m = r.int_map("class bucket map")?;
            class_buckets.insert(id, m);
        }
    }
    let mut choose_args = BTreeMap::new();
    if !r.at_end() {
        let n = r.count("choose_args", 12)?;
        for _ in 0..n {
            let index = r.i64("choose_args index")?;
            let mut args = vec![ChooseArg::default(); buckets.len()];
            let entries = r.count("choose_args entries", 12)?;
            for _ in 0..entries {
                let bi = r.u32("choose_args bucket index")? as usize;
                if bi >= buckets.len() {
                    return Err(CrushError::TooLarge {
                        what: "choose_args bucket index",
                        value: bi as u64,
                        max: buckets.len().saturating_sub(1) as u64,
                    });
                }
                let positions = r.count("weight_set positions", 4)?;
                let mut weight_set = Vec::with_capacity(positions);
                for _ in 0..positions {
                    let size = r.count("weight_set size", 4)?;
                    weight_set.push(r.u32s(size, "weight_set weights")?);
                }
                let ids_size = r.count("choose_args ids", 4)?;
                let ids = r
                    .u32s(ids_size, "choose_args ids")?
                    .into_iter()
                    .map(|v| v as i32)
                    .collect();
                args[bi] = ChooseArg { weight_set, ids };
            }
            choose_args.insert(index, args);
        }
    }
    // Newer releases append msr_descents and msr_collision_tries; they only affect MSR rule
    // steps, which this mapper does not run, so they are read past.
    if r.left() >= 8 {
        r.u32("msr_descents")?;
        r.u32("msr_collision_tries")?;
    }
    let map = CrushMap {
        buckets,
        rules,
        max_devices,
        tunables: t,
        type_names,
        item_names,
        rule_names,
        class_map,
        class_names,
        class_buckets,
        choose_args,
    };
    map.validate()?;
    Ok(map)
}
