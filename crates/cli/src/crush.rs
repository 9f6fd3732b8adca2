//! `kura crush`: Ceph CRUSH placement on compiled or text maps (`kura-crush`). `test` prints exactly
//! the lines `crushtool --test` prints for the same options; `map` places an object the way a
//! Ceph OSD map does (name hash, PG, placement seed, rule), printing `osdmaptool
//! --test-map-object`'s line.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kura_crush::tester::{run_test, TestOptions};
use kura_crush::{pg, CrushMap, Mapper, Workspace, ITEM_NONE};

/// `kura crush` subcommands.
#[derive(Debug, Subcommand)]
pub enum CrushCommand {
    /// Map a range of inputs through a CRUSH map (compiled or text) and
    /// print what `crushtool --test` prints for the same options.
    Test(TestArgs),
    /// Place an object: name hash -> PG -> placement seed -> rule -> devices, as
    /// `osdmaptool --test-map-object` prints it (every device up and in).
    Map(MapArgs),
    /// What changes from OLD to NEW: the inputs whose mapping differs and the placements a
    /// rebalance would copy, against the least any placement could move (`--compare`: print
    /// what `crushtool -i OLD --compare NEW` prints instead).
    Diff(DiffArgs),
}

/// Options of `kura crush diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The map before (compiled or text).
    old: PathBuf,
    /// The map after (compiled or text).
    new: PathBuf,
    /// Rule (default 0; with --compare, every rule).
    #[arg(long)]
    rule: Option<u32>,
    /// Replicas (default 3; with --compare, each rule's min_size..max_size).
    #[arg(long = "num-rep")]
    num_rep: Option<usize>,
    /// First input (default 0).
    #[arg(long = "min-x")]
    min_x: Option<i32>,
    /// Last input (default 9999; with --compare, 1023 as crushtool).
    #[arg(long = "max-x")]
    max_x: Option<i32>,
    /// Print each device's placements before and after.
    #[arg(long = "show-devices")]
    show_devices: bool,
    /// Print exactly `crushtool -i OLD --compare NEW`'s lines (the old map's test weights for
    /// both maps; exit status 1 when they differ).
    #[arg(long)]
    compare: bool,
}

/// Options of `kura crush test`, named as crushtool names them.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// The CRUSH map: compiled (crushtool -c) or text (crushtool -d), told apart by content.
    #[arg(short = 'i', long = "infn")]
    input: PathBuf,
    /// Only this rule (sets --min-rule and --max-rule).
    #[arg(long)]
    rule: Option<i32>,
    /// First rule.
    #[arg(long = "min-rule")]
    min_rule: Option<i32>,
    /// Last rule.
    #[arg(long = "max-rule")]
    max_rule: Option<i32>,
    /// Only rules of this ruleset.
    #[arg(long)]
    ruleset: Option<i32>,
    /// Replica count; default: each rule's min_size..max_size.
    #[arg(long = "num-rep")]
    num_rep: Option<i32>,
    /// Only this input (sets --min-x and --max-x).
    #[arg(long = "x")]
    x: Option<i32>,
    /// First input (default 0).
    #[arg(long = "min-x")]
    min_x: Option<i32>,
    /// Last input (default 1023).
    #[arg(long = "max-x")]
    max_x: Option<i32>,
    /// Mix each input with this pool id, as crushtool does.
    #[arg(long = "pool-id")]
    pool_id: Option<u32>,
    /// `--weight DEV W`: test with device DEV at weight W (0..1), repeatable.
    #[arg(short = 'w', long = "weight", num_args = 2, value_names = ["DEV", "WEIGHT"])]
    weight: Vec<String>,
    /// Print each mapping.
    #[arg(long = "show-mappings")]
    show_mappings: bool,
    /// Print mappings with fewer results than replicas or with holes.
    #[arg(long = "show-bad-mappings")]
    show_bad_mappings: bool,
    /// Print result-size statistics.
    #[arg(long = "show-statistics")]
    show_statistics: bool,
    /// Print per-device utilization (with statistics).
    #[arg(long = "show-utilization")]
    show_utilization: bool,
    /// Print per-device utilization including unused devices.
    #[arg(long = "show-utilization-all")]
    show_utilization_all: bool,
}

/// Options of `kura crush map`.
#[derive(Debug, Args)]
pub struct MapArgs {
    /// The CRUSH map: compiled (crushtool -c) or text (crushtool -d), told apart by content.
    #[arg(short = 'i', long = "infn")]
    input: PathBuf,
    /// Pool id.
    #[arg(long)]
    pool: u32,
    /// The pool's pg_num.
    #[arg(long = "pg-num")]
    pg_num: u32,
    /// The pool's pgp_num (default: pg_num).
    #[arg(long = "pgp-num")]
    pgp_num: Option<u32>,
    /// The pool's CRUSH rule.
    #[arg(long, default_value_t = 0)]
    rule: u32,
    /// The pool's size (replicas).
    #[arg(long, default_value_t = 3)]
    size: usize,
    /// Object names.
    #[arg(required = true)]
    objects: Vec<String>,
}

/// Reads a map in either form: compiled (`crushtool -c` output) or text (`crushtool -d`).
fn load(path: &PathBuf) -> anyhow::Result<CrushMap> {
    let bytes =
        std::fs::read(path).with_context(|| format!("reading CRUSH map {}", path.display()))?;
    kura_crush::load(&bytes).with_context(|| format!("loading CRUSH map {}", path.display()))
}

/// Runs a `kura crush` subcommand.
pub fn run(cmd: CrushCommand) -> anyhow::Result<()> {
    match cmd {
        CrushCommand::Test(a) => test(&a),
        CrushCommand::Map(a) => map(&a),
        CrushCommand::Diff(a) => diff(&a),
    }
}

fn test(a: &TestArgs) -> anyhow::Result<()> {
    let map = load(&a.input)?;
    let mut o = TestOptions {
        pool_id: a.pool_id,
        show_mappings: a.show_mappings,
        show_bad_mappings: a.show_bad_mappings,
        show_statistics: a.show_statistics,
        show_utilization: a.show_utilization,
        show_utilization_all: a.show_utilization_all,
        ..TestOptions::default()
    };
    if let Some(r) = a.rule {
        o.min_rule = r;
        o.max_rule = r;
    }
    o.min_rule = a.min_rule.unwrap_or(o.min_rule);
    o.max_rule = a.max_rule.unwrap_or(o.max_rule);
    o.ruleset = a.ruleset.unwrap_or(-1);
    if let Some(n) = a.num_rep {
        o.min_rep = n;
        o.max_rep = n;
    }
    if let Some(x) = a.x {
        o.min_x = x;
        o.max_x = x;
    }
    o.min_x = a.min_x.unwrap_or(o.min_x);
    o.max_x = a.max_x.unwrap_or(o.max_x);
    let mut weights = BTreeMap::new();
    for pair in a.weight.chunks(2) {
        let [dev, w] = pair else {
            bail!("--weight takes a device and a weight");
        };
        let dev: i32 = dev
            .parse()
            .with_context(|| format!("--weight device {dev}"))?;
        let w: f32 = w.parse().with_context(|| format!("--weight weight {w}"))?;
        weights.insert(dev, w);
    }
    o.device_weights = weights;
    if !(o.show_mappings
        || o.show_bad_mappings
        || o.show_statistics
        || o.show_utilization
        || o.show_utilization_all)
    {
        eprintln!("WARNING: no output selected; use --output-csv or --show-X");
    }
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    run_test(&map, &o, &mut out, &mut std::io::stderr())?;
    out.flush()?;
    Ok(())
}

fn map(a: &MapArgs) -> anyhow::Result<()> {
    let map = load(&a.input)?;
    if a.pg_num == 0 {
        bail!("--pg-num must be at least 1");
    }
    let pgp_num = a.pgp_num.unwrap_or(a.pg_num);
    // An OSD map maps with the pool's choose_args when it has them, else the default set.
    let args = map
        .choose_args
        .get(&(a.pool as i64))
        .or_else(|| map.choose_args.get(&-1));
    let mapper = match args {
        Some(args) => Mapper::with_choose_args(&map, args)?,
        None => Mapper::new(&map),
    };
    let weights = vec![0x10000u32; map.max_devices.max(0) as usize];
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    for name in &a.objects {
        let ps = pg::object_pg(name, a.pg_num);
        let pps = pg::pg_to_pps(a.pool, ps, pgp_num);
        mapper.do_rule(&mut ws, a.rule, pps as i32, a.size, &weights, &mut out)?;
        // Replicated pools drop the holes; every device exists and is up.
        let osds: Vec<String> = out
            .iter()
            .filter(|&&d| d != ITEM_NONE)
            .map(|d| d.to_string())
            .collect();
        println!(
            " object '{name}' -> {}.{ps:x} -> [{}]",
            a.pool,
            osds.join(",")
        );
    }
    Ok(())
}

fn diff(a: &DiffArgs) -> anyhow::Result<()> {
    let old = load(&a.old)?;
    let new = load(&a.new)?;
    let min_x = a.min_x.unwrap_or(0);
    if a.compare {
        let max_x = a.max_x.unwrap_or(1023);
        let (lo, hi) = match a.rule {
            Some(r) => (r, r),
            None => (0, (old.rules.len() as u32).saturating_sub(1)),
        };
        let mut differ = false;
        for r in lo..=hi.min((old.rules.len() as u32).saturating_sub(1)) {
            let Some(rule) = old.rule(r) else { continue };
            let reps = match a.num_rep {
                Some(n) => n..=n,
                None => rule.min_size as usize..=rule.max_size as usize,
            };
            let (bad, total) = kura_crush::diff::compare(&old, &new, r, reps, min_x..=max_x)?;
            differ |= bad > 0;
            println!(
                "rule {r} had {bad}/{total} mismatched mappings ({})",
                kura_crush::tester::cpp_double(bad as f64 / total.max(1) as f64)
            );
        }
        if differ {
            eprintln!("warning: maps are NOT equivalent");
            std::process::exit(1);
        }
        println!("maps appear equivalent");
        return Ok(());
    }
    let max_x = a.max_x.unwrap_or(9999);
    if max_x < min_x {
        bail!("--max-x {max_x} is below --min-x {min_x}");
    }
    let rule = a.rule.unwrap_or(0);
    let replicas = a.num_rep.unwrap_or(3);
    let m = kura_crush::diff::movement(&old, &new, rule, replicas, min_x..=max_x)
        .with_context(|| format!("mapping rule {rule}"))?;
    let pct = |v: f64| format!("{:.2}%", 100.0 * v);
    let per = |v: u64| v as f64 / m.new_placements.max(1) as f64;
    println!(
        "rule {rule} ({}), {replicas} replicas, x = {min_x}..{max_x}: {} placements before, {} after",
        old.rule_name(rule),
        m.old_placements,
        m.new_placements
    );
    println!(
        "inputs changed:      {} of {} ({})",
        m.inputs_changed,
        m.inputs,
        pct(m.inputs_changed as f64 / m.inputs.max(1) as f64)
    );
    println!(
        "placements moved:    {} ({} of placements)",
        m.moved,
        pct(m.moved_fraction())
    );
    let ratio = |bound: f64| {
        if bound > 0.0 {
            format!("{:.3}", m.moved as f64 / bound)
        } else {
            "-".to_string()
        }
    };
    println!(
        "minimum (counts):    {} ({})  moved/minimum {}",
        m.min_moves,
        pct(per(m.min_moves)),
        ratio(m.min_moves as f64)
    );
    println!(
        "minimum (weights):   {:.1} ({})  moved/minimum {}",
        m.ideal_moves,
        pct(m.ideal_fraction()),
        ratio(m.ideal_moves)
    );
    if a.show_devices {
        println!(
            "{:>8} {:>10} {:>10} {:>10}",
            "device", "before", "after", "change"
        );
        for (d, (o, n)) in &m.per_device {
            println!("{d:>8} {o:>10} {n:>10} {:>+10}", *n as i64 - *o as i64);
        }
    }
    Ok(())
}
