//! Differential test against Ceph's `crushtool`: seeded random maps built by crushtool itself
//! (`--build` with mixed bucket algorithms and depths, `--reweight-item` with zero and uneven
//! weights, `--set-*` tunables from every profile and random mixes, device classes with shadow
//! trees, extra rules compiled from text: `firstn` and `indep`, `choose` and `chooseleaf`,
//! nested choices, several takes, `set_*` steps), then `crushtool --test` over every rule and
//! replica count 1..5 (rule 0: 1..10), with `--weight` out-devices and `--pool-id` on some
//! maps. Every output line of `kura_crush::tester::run_test` must equal crushtool's.
//!
//! Default size fits CI (a few seconds); `KURA_CRUSH_MAPS=N` and `KURA_CRUSH_XMAX=X` run more
//! maps and more inputs per map, and `KURA_CRUSH_SEED` picks other maps.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use kura_crush::tester::{run_test, TestOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const ALGS: [&str; 5] = ["straw2", "straw", "list", "tree", "uniform"];

fn crushtool() -> Option<PathBuf> {
    kura_testkit::which("crushtool")
}

fn skip_if_missing(test: &str) -> Option<PathBuf> {
    let t = crushtool();
    if t.is_none() {
        kura_testkit::skip(
            test,
            "crushtool",
            "Ceph's crushtool is not installed (apt-get install ceph-base)",
        );
    }
    t
}

fn run(tool: &Path, args: &[String], log: &mut String) -> Vec<u8> {
    let _ = writeln!(log, "crushtool {}", args.join(" "));
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running crushtool {args:?}: {e}"));
    assert!(
        out.status.success(),
        "crushtool {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log
    );
    out.stdout
}

/// Compiles the map text at `text` with `crushtool -c` into `out`.
fn compile(tool: &Path, text: &Path, out: &Path, log: &mut String) {
    run(
        tool,
        &[
            s("-c"),
            text.display().to_string(),
            s("-o"),
            out.display().to_string(),
        ],
        log,
    );
}

/// Puts `extra` into the map `text` before its end marker, writes it to `text_path` and
/// compiles it into `out`.
fn add_and_compile(
    tool: &Path,
    text: &mut String,
    extra: &str,
    text_path: &Path,
    out: &Path,
    log: &mut String,
) {
    let end = text.find("# end crush map").unwrap_or(text.len());
    text.insert_str(end, extra);
    std::fs::write(text_path, &*text).expect("write map text");
    compile(tool, text_path, out, log);
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// One random map, built by crushtool in `dir`; returns its path and the test options.
struct Built {
    map: PathBuf,
    opts: TestOptions,
    extra_args: Vec<String>,
    log: String,
}

fn build_map(tool: &Path, dir: &Path, seed: u64, xmax: i32) -> Built {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut log = format!("seed {seed}\n");
    let osds: usize = rng.gen_range(1..=48);
    let depth: usize = rng.gen_range(1..=3);
    let names = ["host", "rack", "row"];
    let mut layers: Vec<String> = Vec::new();
    let mut algs = Vec::new();
    for name in names.iter().take(depth - 1) {
        let alg = ALGS[rng.gen_range(0..ALGS.len())];
        algs.push(alg);
        layers.extend([s(name), s(alg), s(rng.gen_range(1..=5))]);
    }
    let root_alg = ALGS[rng.gen_range(0..ALGS.len())];
    algs.push(root_alg);
    layers.extend([s("root"), s(root_alg), s(0)]);
    let base = dir.join("base");
    let mut args = vec![s("--build"), s("--num_osds"), s(osds)];
    args.extend(layers.iter().cloned());
    args.extend([s("-o"), base.display().to_string()]);
    run(tool, &args, &mut log);
    let mut cur = base;
    let mut step = 0;
    let mut next = |cur: &Path| {
        step += 1;
        let _ = cur;
        dir.join(format!("m{step}"))
    };
    // Reweights: zero, fractional and large, on random devices (not with uniform buckets at
    // any level, whose items share one weight: a reweight below one changes its item's weight
    // and crushtool then aborts compiling the map's own text).
    if !algs.contains(&"uniform") && rng.gen_bool(0.7) {
        for _ in 0..rng.gen_range(1..=4) {
            let dev = rng.gen_range(0..osds);
            let w = match rng.gen_range(0..4) {
                0 => 0.0,
                1 => rng.gen_range(1..=20) as f64 / 10.0,
                2 => rng.gen_range(1..=1000) as f64 / 1000.0,
                _ => rng.gen_range(1..=8) as f64,
            };
            let n = next(&cur);
            run(
                tool,
                &[
                    s("-i"),
                    cur.display().to_string(),
                    s("--reweight-item"),
                    format!("osd.{dev}"),
                    format!("{w}"),
                    s("-o"),
                    n.display().to_string(),
                ],
                &mut log,
            );
            cur = n;
        }
    }
    // Tunables: a named profile or a random mix.
    let t: [u32; 6] = match rng.gen_range(0..6) {
        0 => [2, 5, 19, 0, 0, 0], // legacy / argonaut
        1 => [0, 0, 50, 1, 0, 0], // bobtail
        2 => [0, 0, 50, 1, 1, 0], // firefly / hammer
        3 => [0, 0, 50, 1, 1, 1], // jewel / optimal
        _ => [
            rng.gen_range(0..=3),
            rng.gen_range(0..=6),
            rng.gen_range(1..=60),
            rng.gen_range(0..=1),
            rng.gen_range(0..=3),
            rng.gen_range(0..=1),
        ],
    };
    let n = next(&cur);
    run(
        tool,
        &[
            s("-i"),
            cur.display().to_string(),
            s("--set-choose-local-tries"),
            s(t[0]),
            s("--set-choose-local-fallback-tries"),
            s(t[1]),
            s("--set-choose-total-tries"),
            s(t[2]),
            s("--set-chooseleaf-descend-once"),
            s(t[3]),
            s("--set-chooseleaf-vary-r"),
            s(t[4]),
            s("--set-chooseleaf-stable"),
            s(t[5]),
            s("-o"),
            n.display().to_string(),
        ],
        &mut log,
    );
    cur = n;
    // Text round trip: device classes (not with uniform buckets, which crushtool cannot
    // shadow) and extra rules.
    let txt = run(tool, &[s("-d"), cur.display().to_string()], &mut log);
    let mut text = String::from_utf8(txt).expect("crushtool -d prints text");
    // crushtool cannot shadow uniform buckets, and it encodes shadow tree buckets with
    // uninitialised node weights that send Ceph past the item array (undefined behaviour), so
    // classes go on maps with neither.
    let classes = !algs.contains(&"uniform") && rng.gen_bool(0.5);
    let classes = classes && !algs.contains(&"tree");
    if classes {
        let mut lines = Vec::new();
        for line in text.lines() {
            if line.starts_with("device ") && !line.contains(" class ") {
                let class = if rng.gen_bool(0.6) { "ssd" } else { "hdd" };
                lines.push(format!("{line} class {class}"));
            } else {
                lines.push(line.to_string());
            }
        }
        text = lines.join("\n") + "\n";
    }
    // A class rule compiles only when some device has that class.
    let has_class = |c: &str| {
        text.lines()
            .any(|l| l.starts_with("device ") && l.ends_with(c))
    };
    let leaf = if depth >= 2 { "host" } else { "osd" };
    let mut rules = Vec::new();
    let mut rule = |name: &str, ty: &str, steps: &[String]| {
        let id = rules.len() + 1;
        let mut r = format!("rule {name} {{\n\tid {id}\n\ttype {ty}\n\tmin_size 1\n\tmax_size 5\n");
        for st in steps {
            let _ = writeln!(r, "\tstep {st}");
        }
        r.push_str("}\n");
        rules.push(r);
    };
    let take = s("take root");
    rule(
        "leaf_firstn",
        "replicated",
        &[
            take.clone(),
            format!("chooseleaf firstn 0 type {leaf}"),
            s("emit"),
        ],
    );
    rule(
        "leaf_indep",
        "erasure",
        &[
            s("set_chooseleaf_tries 5"),
            s("set_choose_tries 100"),
            take.clone(),
            format!("chooseleaf indep 0 type {leaf}"),
            s("emit"),
        ],
    );
    rule(
        "osd_firstn",
        "replicated",
        &[take.clone(), s("choose firstn 0 type osd"), s("emit")],
    );
    rule(
        "osd_indep",
        "erasure",
        &[take.clone(), s("choose indep 0 type osd"), s("emit")],
    );
    rule(
        "steps",
        "replicated",
        &[
            format!("set_choose_local_tries {}", rng.gen_range(0..=3)),
            format!("set_choose_local_fallback_tries {}", rng.gen_range(0..=5)),
            format!("set_chooseleaf_vary_r {}", rng.gen_range(0..=4)),
            format!("set_chooseleaf_stable {}", rng.gen_range(0..=1)),
            format!("set_choose_tries {}", rng.gen_range(1..=30)),
            take.clone(),
            format!("chooseleaf firstn 0 type {leaf}"),
            s("emit"),
        ],
    );
    if depth >= 3 {
        rule(
            "nested_firstn",
            "replicated",
            &[
                take.clone(),
                s("choose firstn 2 type rack"),
                s("chooseleaf firstn 2 type host"),
                s("emit"),
            ],
        );
        rule(
            "nested_indep",
            "erasure",
            &[
                take.clone(),
                s("choose indep 2 type rack"),
                s("chooseleaf indep -1 type host"),
                s("emit"),
            ],
        );
    }
    if depth >= 2 {
        rule(
            "two_takes",
            "replicated",
            &[
                s("take host0"),
                s("choose firstn 1 type osd"),
                s("emit"),
                take.clone(),
                s("chooseleaf firstn -1 type host"),
                s("emit"),
            ],
        );
    }
    if classes && has_class(" class ssd") {
        rule(
            "ssd_firstn",
            "replicated",
            &[
                s("take root class ssd"),
                format!("chooseleaf firstn 0 type {leaf}"),
                s("emit"),
            ],
        );
    }
    if classes && has_class(" class hdd") {
        rule(
            "hdd_indep",
            "erasure",
            &[
                s("take root class hdd"),
                format!("chooseleaf indep 0 type {leaf}"),
                s("emit"),
            ],
        );
    }
    let text_path = dir.join("final.txt");
    let fin = dir.join("final");
    add_and_compile(tool, &mut text, &rules.concat(), &text_path, &fin, &mut log);
    // Weight sets on some maps: `choose_args` for a few straw2 buckets (one or two positions,
    // sometimes with replacement ids), appended to the text and compiled again.
    if rng.gen_bool(0.3) {
        let m = kura_crush::decode(&std::fs::read(&fin).expect("read map")).expect("decode");
        let mut block = format!("choose_args {} {{\n", [0, 0, 3][rng.gen_range(0..3)]);
        for b in m.buckets.iter().flatten() {
            let shadow = m.item_names.get(&b.id).is_some_and(|n| n.contains('~'));
            if b.kind.alg_name() != "straw2" || shadow || rng.gen_bool(0.3) {
                continue;
            }
            let _ = writeln!(block, "  {{\n    bucket_id {}", b.id);
            if rng.gen_bool(0.8) {
                block.push_str("    weight_set [\n");
                for _ in 0..rng.gen_range(1..=2) {
                    let ws: Vec<String> = b
                        .items
                        .iter()
                        .map(|_| format!("{:.3}", rng.gen_range(0..3000) as f64 / 1000.0))
                        .collect();
                    let _ = writeln!(block, "      [ {} ]", ws.join(" "));
                }
                block.push_str("    ]\n");
            }
            if rng.gen_bool(0.3) {
                let ids: Vec<String> = b.items.iter().map(|&i| s(i * 7 + 1)).collect();
                let _ = writeln!(block, "    ids [ {} ]", ids.join(" "));
            }
            block.push_str("  }\n");
        }
        block.push_str("}\n");
        add_and_compile(tool, &mut text, &block, &text_path, &fin, &mut log);
    }
    // Test options: partial and zero test weights, a pool id, statistics.
    let mut opts = TestOptions {
        min_x: 0,
        max_x: xmax,
        show_mappings: true,
        show_bad_mappings: true,
        ..TestOptions::default()
    };
    let mut extra = Vec::new();
    if rng.gen_bool(0.4) {
        let mut dw = BTreeMap::new();
        for _ in 0..rng.gen_range(1..=3) {
            let dev = rng.gen_range(0..osds) as i32;
            let w = [0.0f32, 0.5, 0.25, 0.9][rng.gen_range(0..4)];
            dw.insert(dev, w);
        }
        for (d, w) in &dw {
            extra.extend([s("--weight"), s(d), s(w)]);
        }
        opts.device_weights = dw;
    }
    if rng.gen_bool(0.3) {
        let pool = rng.gen_range(0..20u32);
        extra.extend([s("--pool-id"), s(pool)]);
        opts.pool_id = Some(pool);
    }
    if rng.gen_bool(0.3) {
        extra.push(s("--show-utilization"));
        opts.show_utilization = true;
    }
    Built {
        map: fin,
        opts,
        extra_args: extra,
        log,
    }
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Compares maps `first..first + count`; returns (maps, lines compared).
fn compare_maps(tool: &Path, first: u64, count: u64, xmax: i32) -> (u64, u64) {
    let seed0 = env_num("KURA_CRUSH_SEED", 0x5eed);
    let mut lines_total = 0u64;
    let only: Option<u64> = std::env::var("KURA_CRUSH_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    for i in first..first + count {
        if only.is_some_and(|o| o != seed0.wrapping_add(i)) {
            continue;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = build_map(tool, dir.path(), seed0.wrapping_add(i), xmax);
        let mut args = vec![
            s("-i"),
            b.map.display().to_string(),
            s("--test"),
            s("--min-x"),
            s(0),
            s("--max-x"),
            s(xmax),
            s("--show-mappings"),
            s("--show-bad-mappings"),
        ];
        args.extend(b.extra_args.iter().cloned());
        let want = run(tool, &args, &mut b.log);
        let bytes = std::fs::read(&b.map).expect("read compiled map");
        let map = kura_crush::decode(&bytes)
            .unwrap_or_else(|e| panic!("decoding crushtool's map: {e}\n{}", b.log));
        assert!(
            kura_crush::encode(&map) == bytes,
            "re-encoding differs from crushtool's bytes\n{}",
            b.log
        );
        // The text crushtool compiled, and crushtool's decompiled form of the result
        // (compiled again by crushtool), parsed by kura: byte for byte what crushtool wrote.
        let text_path = b.map.with_extension("txt");
        let text = std::fs::read_to_string(&text_path).expect("read map text");
        let parsed = kura_crush::parse(&text)
            .unwrap_or_else(|e| panic!("parsing the map text: {e}\n{text}\n{}", b.log));
        assert!(
            kura_crush::encode(&parsed) == bytes,
            "kura's compile of the text differs from crushtool -c\n{text}\n{}",
            b.log
        );
        let dtext = run(tool, &[s("-d"), b.map.display().to_string()], &mut b.log);
        let dtext = String::from_utf8(dtext).expect("crushtool -d prints text");
        let dpath = b.map.with_extension("d.txt");
        std::fs::write(&dpath, &dtext).expect("write decompiled text");
        let recompiled = b.map.with_extension("re");
        compile(tool, &dpath, &recompiled, &mut b.log);
        let parsed = kura_crush::parse(&dtext)
            .unwrap_or_else(|e| panic!("parsing crushtool -d text: {e}\n{dtext}\n{}", b.log));
        assert!(
            kura_crush::encode(&parsed) == std::fs::read(&recompiled).expect("read recompiled"),
            "kura's compile of crushtool -d text differs from crushtool -c\n{dtext}\n{}",
            b.log
        );
        let mut got = Vec::new();
        run_test(&map, &b.opts, &mut got, &mut std::io::sink()).expect("run_test");
        let want = String::from_utf8_lossy(&want);
        let got = String::from_utf8_lossy(&got);
        let mut n = 0u64;
        let mut wl = want.lines();
        let mut gl = got.lines();
        loop {
            match (wl.next(), gl.next()) {
                (None, None) => break,
                (w, g) => {
                    n += 1;
                    if w != g {
                        // Keep the map for reproduction.
                        let keep = std::env::temp_dir()
                            .join(format!("kura-crush-diff-{}", seed0.wrapping_add(i)));
                        let _ = std::fs::copy(&b.map, &keep);
                        b.log.push_str(&format!("map kept at {}\n", keep.display()));
                    }
                    assert_eq!(
                        g, w,
                        "line {n} differs from crushtool (left: kura, right: crushtool)\n{}",
                        b.log
                    );
                }
            }
        }
        assert!(n > 0, "crushtool printed nothing\n{}", b.log);
        lines_total += n;
    }
    (count, lines_total)
}

fn shard(test: &str, shard: u64, shards: u64) {
    let Some(tool) = skip_if_missing(test) else {
        return;
    };
    let maps = env_num("KURA_CRUSH_MAPS", 24);
    let xmax = env_num("KURA_CRUSH_XMAX", 999) as i32;
    let per = maps.div_ceil(shards);
    let first = shard * per;
    let count = per.min(maps.saturating_sub(first));
    let (m, lines) = compare_maps(&tool, first, count, xmax);
    eprintln!("{test}: {m} maps, x 0..={xmax}, {lines} identical lines");
}

#[test]
fn random_maps_shard_0() {
    shard("random_maps_shard_0", 0, 2);
}

#[test]
fn random_maps_shard_1() {
    shard("random_maps_shard_1", 1, 2);
}

/// A few maps over at least x = 0..=100000 for one straw2 rule with three replicas.
#[test]
fn wide_input_range() {
    let Some(tool) = skip_if_missing("wide_input_range") else {
        return;
    };
    let xmax = env_num("KURA_CRUSH_WIDE_XMAX", 100_000) as i32;
    let mut lines_total = 0;
    for (osds, layers) in [
        (120usize, "host straw2 6 rack straw2 4 root straw2 0"),
        (40, "host straw 4 rack list 3 root tree 0"),
        (30, "host uniform 3 rack tree 2 root straw2 0"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let map = dir.path().join("m");
        let mut log = String::new();
        let mut args = vec![s("--build"), s("--num_osds"), s(osds)];
        args.extend(layers.split(' ').map(s));
        args.extend([s("-o"), map.display().to_string()]);
        run(&tool, &args, &mut log);
        let want = run(
            &tool,
            &[
                s("-i"),
                map.display().to_string(),
                s("--test"),
                s("--rule"),
                s(0),
                s("--num-rep"),
                s(3),
                s("--min-x"),
                s(0),
                s("--max-x"),
                s(xmax),
                s("--show-mappings"),
            ],
            &mut log,
        );
        let m = kura_crush::decode(&std::fs::read(&map).expect("read map")).expect("decode");
        let opts = TestOptions {
            min_rule: 0,
            max_rule: 0,
            min_rep: 3,
            max_rep: 3,
            min_x: 0,
            max_x: xmax,
            show_mappings: true,
            ..TestOptions::default()
        };
        let mut got = Vec::new();
        run_test(&m, &opts, &mut got, &mut std::io::sink()).expect("run_test");
        let (want, got) = (
            String::from_utf8_lossy(&want),
            String::from_utf8_lossy(&got),
        );
        let wl: Vec<&str> = want.lines().collect();
        let gl: Vec<&str> = got.lines().collect();
        assert_eq!(wl.len(), xmax as usize + 1, "{log}");
        for (i, (g, w)) in gl.iter().zip(&wl).enumerate() {
            assert_eq!(g, w, "line {i} differs\n{log}");
        }
        assert_eq!(gl.len(), wl.len(), "{log}");
        lines_total += wl.len();
    }
    eprintln!("wide_input_range: 3 maps, x 0..={xmax}, {lines_total} identical lines");
}

/// A handwritten map using every construct of the text form (positions, items without
/// weights, explicit shadow ids, `hash rjenkins1`, every step, a weight set with ids): kura's
/// compile equals crushtool's byte for byte, and maps the same.
#[test]
fn handwritten_text_compiles_like_crushtool() {
    let Some(tool) = skip_if_missing("handwritten_text_compiles_like_crushtool") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let text = include_str!("data/full.txt");
    let path = dir.path().join("full.txt");
    std::fs::write(&path, text).expect("write text");
    let bin = dir.path().join("full");
    let mut log = String::new();
    compile(&tool, &path, &bin, &mut log);
    let want = std::fs::read(&bin).expect("read compiled map");
    let map = kura_crush::parse(text).expect("kura parses the text");
    assert!(kura_crush::encode(&map) == want, "compiled bytes differ");
    let out = run(
        &tool,
        &[
            s("-i"),
            bin.display().to_string(),
            s("--test"),
            s("--show-mappings"),
            s("--min-x"),
            s(0),
            s("--max-x"),
            s(200),
        ],
        &mut log,
    );
    let opts = TestOptions {
        max_x: 200,
        min_x: 0,
        show_mappings: true,
        ..TestOptions::default()
    };
    let mut got = Vec::new();
    run_test(&map, &opts, &mut got, &mut std::io::sink()).expect("run_test");
    let (got, want) = (String::from_utf8_lossy(&got), String::from_utf8_lossy(&out));
    assert_eq!(got.lines().count(), want.lines().count());
    for (g, w) in got.lines().zip(want.lines()) {
        assert_eq!(g, w, "left: kura, right: crushtool");
    }
}
