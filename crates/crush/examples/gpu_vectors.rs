//! Test vectors for the CUDA straw2 mapper in `crates/crush/gpu/`: a map, a rule and kura's
//! own mappings for a range of inputs, in files a small C++ program reads without Rust.
//!
//! It builds a 4-level straw2 hierarchy (root → racks → hosts → OSDs, the bucket arrays made
//! by [`kura_crush::builder::make_bucket`] as crushtool makes them) with uneven OSD weights,
//! a few OSDs of crush weight 0, and a few whose device weight (`crushtool --weight`) is 0
//! (out) or fractional (in for a share of the inputs), one replicated rule
//! (`take root; chooseleaf firstn 0 type host; emit`), and writes into `OUT_DIR`:
//!
//! * `NAME.flat`: the map flattened to text (tunables, buckets with items and weights, rule
//!   steps, device weights, and straw2's `crush_ln` tables as [`kura_crush::ln`] generates
//!   them, so the CUDA code carries no copy of its own);
//! * `NAME.expect`: kura's mappings, little-endian: magic `KCX1`, count `n`, first input,
//!   slots per input, then `n * slots` `i32`s (unused slots `0x7fffffff`);
//! * `NAME.crush`: the compiled map (crushtool's binary form), and `NAME.crushtool-args`:
//!   the `--weight` arguments, so `crushtool --test` can check the same mappings.
//!
//! `cargo run --release -p kura-crush --example gpu_vectors -- OUT_DIR [--osds N]
//! [--inputs N] [--num-rep N] [--tunables jewel|hammer|firefly|bobtail] [--name NAME]`

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use kura_crush::builder::make_bucket;
use kura_crush::ln::{LL, RH_LH};
use kura_crush::map::{op, Rule, Step, ALG_STRAW2};
use kura_crush::tester::device_weight_fixed;
use kura_crush::{encode, map_range, CrushMap, Mapper, Tunables, ITEM_NONE};

struct Args {
    out: PathBuf,
    osds: usize,
    inputs: u32,
    num_rep: usize,
    tunables: String,
    name: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut out = None;
    let mut a = Args {
        out: PathBuf::new(),
        osds: 100,
        inputs: 1_000_000,
        num_rep: 3,
        tunables: "jewel".into(),
        name: None,
    };
    while let Some(arg) = it.next() {
        let mut val = |flag: &str| it.next().ok_or(format!("{flag} needs a value"));
        match arg.as_str() {
            "--osds" => a.osds = val("--osds")?.parse().map_err(|e| format!("--osds: {e}"))?,
            "--inputs" => {
                a.inputs = val("--inputs")?
                    .parse()
                    .map_err(|e| format!("--inputs: {e}"))?
            }
            "--num-rep" => {
                a.num_rep = val("--num-rep")?
                    .parse()
                    .map_err(|e| format!("--num-rep: {e}"))?
            }
            "--tunables" => a.tunables = val("--tunables")?,
            "--name" => a.name = Some(val("--name")?),
            s if s.starts_with("--") => return Err(format!("unknown option {s}")),
            s => out = Some(PathBuf::from(s)),
        }
    }
    a.out = out.ok_or("usage: gpu_vectors OUT_DIR [--osds N] [--inputs N] [--num-rep N] [--tunables P] [--name NAME]")?;
    if a.osds < 8 {
        return Err("--osds must be at least 8".into());
    }
    if a.inputs == 0 || a.inputs > i32::MAX as u32 {
        return Err("--inputs must be in 1..2^31".into());
    }
    if a.num_rep == 0 || a.num_rep > 16 {
        return Err("--num-rep must be in 1..=16 (the CUDA mapper's result size)".into());
    }
    Ok(a)
}

/// A xorshift64 stream: the map's shape and weights, reproducible from a fixed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const TYPE_HOST: u16 = 1;
const TYPE_RACK: u16 = 2;
const TYPE_ROOT: u16 = 3;

/// The map and the per-device weights to map with (as `(device, float weight)` overrides of
/// crushtool's default 1.0).
fn build_map(osds: usize, tunables: Tunables) -> Result<(CrushMap, BTreeMap<i32, f32>), String> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ osds as u64);
    // Hosts of 6..=14 OSDs (about 10 on average), racks of 2..=6 hosts.
    let mut host_sizes = Vec::new();
    let mut left = osds;
    while left > 0 {
        let s = (6 + rng.below(9) as usize).min(left);
        host_sizes.push(s);
        left -= s;
    }
    let mut rack_sizes = Vec::new();
    let mut left = host_sizes.len();
    while left > 0 {
        let s = (2 + rng.below(5) as usize).min(left);
        rack_sizes.push(s);
        left -= s;
    }
    let nb = 1 + rack_sizes.len() + host_sizes.len();
    let mut buckets = vec![None; nb];
    let mut item_names = BTreeMap::new();
    let sv = tunables.straw_calc_version;
    let mut next_bucket = -2i32;
    let mut dev = 0i32;
    let mut host = 0usize;
    let mut racks = Vec::new();
    let mut rack_weights = Vec::new();
    for (ri, &nh) in rack_sizes.iter().enumerate() {
        let mut hosts = Vec::new();
        let mut host_weights = Vec::new();
        for _ in 0..nh {
            let n = host_sizes[host];
            let items: Vec<i32> = (dev..dev + n as i32).collect();
            // 0.5 to 8.0 in 1/64 steps; one OSD in 37 has crush weight 0 (just added).
            let weights: Vec<u32> = items
                .iter()
                .map(|_| {
                    if rng.below(37) == 0 {
                        0
                    } else {
                        (32 + rng.below(481) as u32) * 0x400
                    }
                })
                .collect();
            for &d in &items {
                item_names.insert(d, format!("osd.{d}"));
            }
            let id = next_bucket;
            next_bucket -= 1;
            let b = make_bucket(id, ALG_STRAW2, 0, TYPE_HOST, &items, &weights, sv)
                .map_err(|e| e.to_string())?;
            host_weights.push(b.weight);
            hosts.push(id);
            item_names.insert(id, format!("host{host}"));
            buckets[(-1 - id) as usize] = Some(b);
            dev += n as i32;
            host += 1;
        }
        let id = next_bucket;
        next_bucket -= 1;
        let b = make_bucket(id, ALG_STRAW2, 0, TYPE_RACK, &hosts, &host_weights, sv)
            .map_err(|e| e.to_string())?;
        rack_weights.push(b.weight);
        racks.push(id);
        item_names.insert(id, format!("rack{ri}"));
        buckets[(-1 - id) as usize] = Some(b);
    }
    let root = make_bucket(-1, ALG_STRAW2, 0, TYPE_ROOT, &racks, &rack_weights, sv)
        .map_err(|e| e.to_string())?;
    buckets[0] = Some(root);
    item_names.insert(-1, "default".into());
    let steps = vec![
        Step {
            op: op::TAKE,
            arg1: -1,
            arg2: 0,
        },
        Step {
            op: op::CHOOSELEAF_FIRSTN,
            arg1: 0,
            arg2: TYPE_HOST as i32,
        },
        Step {
            op: op::EMIT,
            arg1: 0,
            arg2: 0,
        },
    ];
    let map = CrushMap {
        buckets,
        rules: vec![Some(Rule {
            ruleset: 0,
            rule_type: 1,
            min_size: 1,
            max_size: 10,
            steps,
        })],
        max_devices: dev,
        tunables,
        type_names: [(0, "osd"), (1, "host"), (2, "rack"), (3, "root")]
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect(),
        item_names,
        rule_names: [(0, "replicated_rule".to_string())].into_iter().collect(),
        class_map: BTreeMap::new(),
        class_names: BTreeMap::new(),
        class_buckets: BTreeMap::new(),
        choose_args: BTreeMap::new(),
    };
    map.validate().map_err(|e| e.to_string())?;
    // About one device in 25 out (weight 0), one in 12 partly in (reweighted).
    let mut overrides = BTreeMap::new();
    for d in 0..dev {
        match rng.below(300) {
            0..=11 => {
                overrides.insert(d, 0.0f32);
            }
            12..=36 => {
                overrides.insert(d, [0.25f32, 0.5, 0.8, 0.95][rng.below(4) as usize]);
            }
            _ => {}
        }
    }
    Ok((map, overrides))
}

fn flat_text(map: &CrushMap, weights: &[u32]) -> String {
    let t = &map.tunables;
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(s, "kura-crush-flat 1");
    let _ = writeln!(
        s,
        "tunables {} {} {} {} {} {}",
        t.choose_local_tries,
        t.choose_local_fallback_tries,
        t.choose_total_tries,
        t.chooseleaf_descend_once,
        t.chooseleaf_vary_r,
        t.chooseleaf_stable
    );
    let _ = writeln!(s, "max_devices {}", map.max_devices);
    let _ = writeln!(s, "max_buckets {}", map.buckets.len());
    for b in map.buckets.iter().flatten() {
        let weights: Vec<u32> = match &b.kind {
            kura_crush::map::BucketKind::Straw2 { item_weights } => item_weights.clone(),
            _ => Vec::new(),
        };
        let _ = write!(
            s,
            "bucket {} {} {} {} {}",
            b.id,
            b.bucket_type,
            b.kind.alg(),
            b.hash,
            b.items.len()
        );
        for (i, &it) in b.items.iter().enumerate() {
            let _ = write!(s, " {} {}", it, weights.get(i).copied().unwrap_or(0));
        }
        s.push('\n');
    }
    let rule = map.rule(0).expect("rule 0 exists");
    let _ = writeln!(s, "rule {}", rule.steps.len());
    for st in &rule.steps {
        let _ = writeln!(s, "step {} {} {}", st.op, st.arg1, st.arg2);
    }
    let _ = write!(s, "device_weights {}", weights.len());
    for w in weights {
        let _ = write!(s, " {w}");
    }
    s.push('\n');
    let _ = write!(s, "ln_rh_lh {}", RH_LH.len());
    for v in RH_LH.iter() {
        let _ = write!(s, " {v:x}");
    }
    s.push('\n');
    let _ = write!(s, "ln_ll {}", LL.len());
    for v in LL.iter() {
        let _ = write!(s, " {v:x}");
    }
    s.push('\n');
    let _ = writeln!(s, "end");
    s
}

fn main() -> Result<(), String> {
    let a = parse_args()?;
    let tunables = Tunables::profile(&a.tunables)
        .ok_or_else(|| format!("unknown tunables profile {}", a.tunables))?;
    if tunables.choose_local_fallback_tries != 0 {
        return Err(format!(
            "profile {} uses the permutation fallback, which the CUDA mapper does not cover",
            a.tunables
        ));
    }
    let (map, overrides) = build_map(a.osds, tunables)?;
    let mut weights = map.default_weights();
    for (&d, &f) in &overrides {
        weights[d as usize] = device_weight_fixed(f);
    }
    let mapper = Mapper::for_test(&map);
    let last = (a.inputs - 1) as i32;
    let res = map_range(&mapper, 0, 0..=last, a.num_rep, &weights, 0).map_err(|e| e.to_string())?;

    let name = a.name.clone().unwrap_or_else(|| {
        format!(
            "straw2-{}osd-{}-r{}-{}",
            a.osds, a.tunables, a.num_rep, a.inputs
        )
    });
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let path = |ext: &str| a.out.join(format!("{name}.{ext}"));
    let write = |ext: &str, bytes: &[u8]| -> Result<(), String> {
        let p = path(ext);
        std::fs::write(&p, bytes).map_err(|e| format!("{}: {e}", p.display()))
    };
    write("flat", flat_text(&map, &weights).as_bytes())?;
    let mut ex = Vec::with_capacity(16 + res.items.len() * 4);
    ex.extend_from_slice(b"KCX1");
    ex.extend_from_slice(&a.inputs.to_le_bytes());
    ex.extend_from_slice(&0i32.to_le_bytes());
    ex.extend_from_slice(&(a.num_rep as u32).to_le_bytes());
    for &v in &res.items {
        ex.extend_from_slice(&v.to_le_bytes());
    }
    write("expect", &ex)?;
    write("crush", &encode(&map))?;
    let mut targs = String::new();
    for (d, f) in &overrides {
        let _ = write!(targs, "--weight {d} {f} ");
    }
    write("crushtool-args", targs.trim_end().as_bytes())?;

    let short = res
        .lens
        .iter()
        .filter(|&&l| (l as usize) < a.num_rep)
        .count();
    let none = res.items.iter().filter(|&&v| v == ITEM_NONE).count();
    println!(
        "{name}: {} devices, {} buckets, {} inputs, {} with fewer than {} items ({none} empty slots), files in {}",
        map.max_devices,
        map.buckets.len(),
        a.inputs,
        short,
        a.num_rep,
        a.out.display()
    );
    Ok(())
}
