//! `kura drive rebalance` end to end on image files: a placed drive written with
//! `kura dev write --pattern`, a fourth leg added (the drive refuses the new spec until the
//! rebalance ran), rebalanced within 1.2x the minimum copies, verified through the new spec; a
//! rerun has nothing to do; a reweighted map (`map=`) rebalanced and verified; bad input refused.

mod common;

use common::{fails, kura, ok, text};
use kura_crush::map::BucketKind;

/// Copies made and the minimum, from the report line.
fn figures(out: &str) -> (u64, u64) {
    let num = |after: &str| -> u64 {
        let at = out
            .find(after)
            .unwrap_or_else(|| panic!("`{after}` in {out}"))
            + after.len();
        out[at..]
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("a number after `{after}` in {out}"))
    };
    let copies = out
        .split("chunks moved, ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("copies in {out}"));
    (copies, num("minimum "))
}

#[test]
fn rebalance_after_adding_a_leg_and_reweighting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = |i: usize| {
        format!(
            "file:{}?size=16M",
            dir.path().join(format!("p{i}.img")).display()
        )
    };
    let spec = |legs: usize, extra: &str| {
        let l: Vec<String> = (0..legs).map(img).collect();
        format!("placed({})?replicas=2&chunk=256K{extra}", l.join(","))
    };
    let three = spec(3, "");
    ok(&["dev", "write", &three, "--pattern", "7"]);
    let blocks = {
        let info = ok(&["dev", "info", &three]);
        let line = info
            .lines()
            .find(|l| l.starts_with("capacity:"))
            .unwrap_or_else(|| panic!("capacity in {info}"));
        let n: u64 = line
            .split(", ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("blocks in {line}"));
        n.to_string()
    };
    ok(&["dev", "verify", &three, "--seed", "7"]);
    let four = spec(4, "");
    // Opening read-write creates the fourth image, blank: refused until the rebalance.
    fails(
        &["dev", "write", &four, "--pattern", "7"],
        "kura drive rebalance",
    );
    let out = ok(&["drive", "rebalance", &four, "--quiet"]);
    assert!(out.contains("1 new legs formatted"), "{out}");
    let (copies, minimum) = figures(&out);
    assert!(minimum > 0 && copies >= minimum, "{out}");
    assert!(copies as f64 <= 1.2 * minimum as f64, "{out}");
    eprintln!("{out}");
    ok(&["dev", "verify", &four, "--seed", "7", "--blocks", &blocks]);
    let again = ok(&["drive", "rebalance", &four, "--quiet"]);
    assert!(again.contains("nothing to move"), "{again}");
    // Reweight leg 1 to half through a map file.
    let mut map = kura_vdrive::placed::flat_map(4);
    if let Some(Some(b)) = map.buckets.get_mut(0) {
        if let BucketKind::Straw2 { item_weights } = &mut b.kind {
            item_weights[1] = 0x8000;
            b.weight = item_weights.iter().sum();
        }
    }
    let path = dir.path().join("half.bin");
    std::fs::write(&path, kura_crush::encode(&map)).expect("write the map");
    let half = spec(4, &format!("&map={}", path.display()));
    fails(
        &["dev", "verify", &half, "--seed", "7"],
        "follow a CRUSH map",
    );
    let out = ok(&["drive", "rebalance", &half, "--quiet"]);
    let (copies, _) = figures(&out);
    assert!(copies > 0, "{out}");
    ok(&["dev", "verify", &half, "--seed", "7", "--blocks", &blocks]);
    // Not a placed spec; a dense drive.
    fails(&["drive", "rebalance", &img(0)], "not a placed(...) spec");
    fails(
        &["drive", "rebalance", &spec(4, "&layout=dense")],
        "cannot be rebalanced",
    );
    let o = kura(&["drive", "rebalance", "placed(mem:1M)?replicas=9"]);
    assert!(!o.status.success(), "{}", text(&o));
}
