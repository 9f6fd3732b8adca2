//! `crushtool --test` as a library: the same rule, replica-count and input loops, the same
//! device weights (1.0 for devices in the hierarchy, `--weight` overrides, `--pool-id` input
//! mixing), and exactly crushtool's output lines for `--show-mappings`, `--show-bad-mappings`,
//! `--show-statistics`, `--show-utilization` and `--show-utilization-all`, including the C++
//! stream formatting of its floating-point "expected" counts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};

use crate::error::CrushError;
use crate::hash::hash32_2;
use crate::map::{CrushMap, ITEM_NONE};
use crate::mapper::{Mapper, Workspace, XLANES};

/// Inputs handed to the mapper at a time.
const TEST_BATCH: usize = XLANES * 32;

/// What to test and what to print; the defaults are crushtool's.
#[derive(Debug, Clone, PartialEq)]
pub struct TestOptions {
    /// First rule (`--min-rule`, `--rule`); negative: all rules.
    pub min_rule: i32,
    /// Last rule (`--max-rule`, `--rule`); negative: all rules.
    pub max_rule: i32,
    /// Only rules of this ruleset (`--ruleset`); negative: any.
    pub ruleset: i32,
    /// First replica count (`--num-rep`, `--min-rep`); negative: the rule's min_size.
    pub min_rep: i32,
    /// Last replica count; negative: the rule's max_size.
    pub max_rep: i32,
    /// First input (`--min-x`, `--x`); negative (either bound): 0..=1023.
    pub min_x: i32,
    /// Last input.
    pub max_x: i32,
    /// `--pool-id`: inputs are `hash32_2(x, pool)`; `None` uses `x` itself.
    pub pool_id: Option<u32>,
    /// `--weight DEV W` overrides, W in 0..=1.
    pub device_weights: BTreeMap<i32, f32>,
    /// `--show-mappings`.
    pub show_mappings: bool,
    /// `--show-bad-mappings`.
    pub show_bad_mappings: bool,
    /// `--show-statistics`.
    pub show_statistics: bool,
    /// `--show-utilization` (implies statistics, as in crushtool).
    pub show_utilization: bool,
    /// `--show-utilization-all` (implies statistics, as in crushtool).
    pub show_utilization_all: bool,
}

impl Default for TestOptions {
    fn default() -> TestOptions {
        TestOptions {
            min_rule: -1,
            max_rule: -1,
            ruleset: -1,
            min_rep: -1,
            max_rep: -1,
            min_x: -1,
            max_x: -1,
            pool_id: None,
            device_weights: BTreeMap::new(),
            show_mappings: false,
            show_bad_mappings: false,
            show_statistics: false,
            show_utilization: false,
            show_utilization_all: false,
        }
    }
}

/// crushtool's `set_device_weight`: `(int)(w * 0x10000)` clamped to `0..=0x10000`.
pub fn device_weight_fixed(w: f32) -> u32 {
    let v = (w * 65536.0) as i32;
    v.clamp(0, 0x10000) as u32
}

/// The weights `--test` maps with.
pub fn test_weights(map: &CrushMap, opts: &TestOptions) -> Vec<u32> {
    let mut w = map.default_weights();
    for (&dev, &f) in &opts.device_weights {
        if dev >= 0 && (dev as usize) < w.len() {
            w[dev as usize] = device_weight_fixed(f);
        }
    }
    w
}

/// The largest number of results a rule can give, as crushtool estimates it for its
/// "expected" utilization figures.
fn maximum_affected_by_rule(map: &CrushMap, rule: u32) -> i32 {
    let Some(r) = map.rule(rule) else { return 0 };
    let mut affected = Vec::new();
    let mut reps: BTreeMap<i32, i32> = BTreeMap::new();
    for s in &r.steps {
        if s.op >= 2 && s.op != 4 {
            affected.push(s.arg2);
            reps.insert(s.arg2, s.arg1);
        }
    }
    // crushtool asks every named item for its bucket type; devices (and missing buckets)
    // answer -ENOENT.
    let type_of = |id: i32| -> i32 { map.bucket(id).map_or(-2, |b| b.bucket_type as i32) };
    let mut max_of_type: BTreeMap<i32, i32> = BTreeMap::new();
    for &t in &affected {
        for &id in map.item_names.keys() {
            if type_of(id) == t {
                *max_of_type.entry(t).or_insert(0) += 1;
            }
        }
    }
    for &t in &affected {
        let rep = *reps.get(&t).unwrap_or(&0);
        let m = max_of_type.entry(t).or_insert(0);
        if rep > 0 && rep < *m {
            *m = rep;
        }
    }
    let mut max_affected = map.max_buckets().max(map.max_devices);
    for &t in &affected {
        let m = *max_of_type.get(&t).unwrap_or(&0);
        if m > 0 && m < max_affected {
            max_affected = m;
        }
    }
    max_affected
}

/// Formats a float the way a default C++ `ostream` does (`%g`, 6 significant digits).
pub fn cpp_float(v: f32) -> String {
    cpp_double(v as f64)
}

/// Formats a double the way a default C++ `ostream` does (`%g`, 6 significant digits).
pub fn cpp_double(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    if !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let sci = format!("{:.5e}", v);
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let mant = strip_zeros(mant);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        strip_zeros(&format!("{:.*}", decimals, v)).to_string()
    }
}

fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

fn vec_str(v: &[i32]) -> String {
    let mut s = String::from("[");
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x}");
    }
    s.push(']');
    s
}

/// Runs the test and writes crushtool's lines: to `out` what crushtool prints on standard
/// output, to `err` what it prints on standard error (the `--show-utilization-all` weights).
pub fn run_test(
    map: &CrushMap,
    opts: &TestOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<()> {
    let stats = opts.show_statistics || opts.show_utilization || opts.show_utilization_all;
    let (mut min_rule, mut max_rule) = (opts.min_rule, opts.max_rule);
    if min_rule < 0 || max_rule < 0 {
        min_rule = 0;
        max_rule = map.rules.len() as i32 - 1;
    }
    let (mut min_x, mut max_x) = (opts.min_x, opts.max_x);
    if min_x < 0 || max_x < 0 {
        min_x = 0;
        max_x = 1023;
    }
    let weight = test_weights(map, opts);
    if opts.show_utilization_all {
        let hex: Vec<String> = weight.iter().map(|w| format!("{w:x}")).collect();
        writeln!(err, "devices weights (hex): [{}]", hex.join(","))?;
    }
    let mapper = Mapper::for_test(map);
    let mut ws = Workspace::new();
    let mut res = Vec::new();
    let mut line = String::new();
    let mut r = min_rule;
    while r < map.rules.len() as i32 && r <= max_rule {
        let ru = r as u32;
        let Some(rule) = map.rule(ru) else {
            if stats {
                writeln!(out, "rule {r} dne")?;
            }
            r += 1;
            continue;
        };
        if opts.ruleset >= 0 && rule.ruleset as i32 != opts.ruleset {
            r += 1;
            continue;
        }
        let (mut minr, mut maxr) = (opts.min_rep, opts.max_rep);
        if minr < 0 || maxr < 0 {
            minr = rule.min_size as i32;
            maxr = rule.max_size as i32;
        }
        let name = map.rule_name(ru);
        if stats {
            writeln!(
                out,
                "rule {r} ({name}), x = {min_x}..{max_x}, numrep = {minr}..{maxr}"
            )?;
        }
        for nr in minr..=maxr {
            let ndev = weight.len();
            let mut per = vec![0i64; ndev];
            let mut sizes: BTreeMap<usize, i64> = BTreeMap::new();
            let num_objects = max_x.wrapping_sub(min_x).wrapping_add(1);
            let total_weight: i32 = weight.iter().fold(0i32, |a, &w| a.wrapping_add(w as i32));
            if total_weight == 0 {
                continue;
            }
            let expected_objects = nr
                .min(maximum_affected_by_rule(map, ru))
                .wrapping_mul(num_objects) as f32;
            // Inputs go to the mapper in batches (its SIMD draws across inputs), each
            // mapping printed in order as it comes back.
            let mut xs: Vec<i32> = Vec::with_capacity(TEST_BATCH);
            let mut reals: Vec<i32> = Vec::with_capacity(TEST_BATCH);
            let mut next = (min_x <= max_x).then_some(min_x);
            while let Some(first) = next {
                xs.clear();
                reals.clear();
                next = None;
                let mut x = first;
                loop {
                    xs.push(x);
                    reals.push(match opts.pool_id {
                        Some(pool) => hash32_2(x as u32, pool) as i32,
                        None => x,
                    });
                    if x == max_x {
                        break;
                    }
                    x += 1;
                    if xs.len() == TEST_BATCH {
                        next = Some(x);
                        break;
                    }
                }
                let mut written: io::Result<()> = Ok(());
                let mut emit = |i: usize, res: &[i32]| -> io::Result<()> {
                    let x = xs[i];
                    if opts.show_mappings {
                        line.clear();
                        let _ = write!(line, "CRUSH rule {r} x {x} {}", vec_str(res));
                        writeln!(out, "{line}")?;
                    }
                    let mut has_none = false;
                    for &d in res {
                        if d == ITEM_NONE {
                            has_none = true;
                        } else if d >= 0 && (d as usize) < ndev {
                            per[d as usize] += 1;
                        }
                    }
                    *sizes.entry(res.len()).or_insert(0) += 1;
                    if opts.show_bad_mappings && (res.len() != nr as usize || has_none) {
                        writeln!(
                            out,
                            "bad mapping rule {r} x {x} num_rep {nr} result {}",
                            vec_str(res)
                        )?;
                    }
                    Ok(())
                };
                mapper
                    .do_rule_batch(
                        &mut ws,
                        ru,
                        &reals,
                        nr.max(0) as usize,
                        &weight,
                        &mut res,
                        |i, res| {
                            if written.is_ok() {
                                written = emit(i, res);
                            }
                        },
                    )
                    .map_err(|e: CrushError| io::Error::other(e.to_string()))?;
                written?;
            }
            if opts.show_utilization && !stats {
                for (i, p) in per.iter().enumerate() {
                    writeln!(out, "  device {i}:\t{p}")?;
                }
            }
            if stats {
                for (size, n) in &sizes {
                    writeln!(
                        out,
                        "rule {r} ({name}) num_rep {nr} result size == {size}:\t{n}/{}",
                        max_x.wrapping_sub(min_x).wrapping_add(1)
                    )?;
                }
                for (i, &p) in per.iter().enumerate() {
                    let prop = weight[i] as f32 / total_weight as f32;
                    let expected = prop * expected_objects;
                    if opts.show_utilization {
                        if expected > 0.0 && p > 0 {
                            writeln!(
                                out,
                                "  device {i}:\t\t stored : {p}\t expected : {}",
                                cpp_float(expected)
                            )?;
                        }
                    } else if opts.show_utilization_all {
                        writeln!(
                            out,
                            "  device {i}:\t\t stored : {p}\t expected : {}",
                            cpp_float(expected)
                        )?;
                    }
                }
            }
        }
        r += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::cpp_float;

    #[test]
    fn floats_print_like_cpp_streams() {
        assert_eq!(cpp_float(0.75), "0.75");
        assert_eq!(cpp_float(1.5), "1.5");
        assert_eq!(cpp_float(3.0), "3");
        assert_eq!(cpp_float(0.0), "0");
        assert_eq!(cpp_float(1234567.0), "1.23457e+06");
        assert_eq!(cpp_float(123456.0), "123456");
        assert_eq!(cpp_float(0.0001), "0.0001");
        assert_eq!(cpp_float(0.00001), "1e-05");
        assert_eq!(cpp_float(2.0 / 3.0), "0.666667");
    }
}
