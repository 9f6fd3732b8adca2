//! `kura crush map` against a real cluster's `ceph osd map` (issue 16 item 2): the cluster
//! (`scripts/ceph/start.sh` through `kura_rbd::testing`, 1 monitor, 1 manager, 3 OSDs) is given
//! uneven CRUSH weights so its OSDs are not interchangeable, and a second pool whose PG count is
//! not a power of two (so `ceph_stable_mod` folds PG ids). For every object name the monitor's
//! answer (PG and up set) must equal kura's, computed offline from the map the cluster hands
//! out with `ceph osd getcrushmap`.
//!
//! The manager's balancer is switched off first: its `pg-upmap-items` change up sets after
//! CRUSH, which `kura crush map` (like `osdmaptool --test-map-object`) does not model.

mod common;

use common::{kura, text};
use kura_rbd::testing::{daemons_installed, TestCluster};
use std::io::Write;
use std::process::{Command, Stdio};

/// One `ceph osd map` answer: pool id, PG (`2.1f`) and the up set.
#[derive(Debug, PartialEq)]
struct Placement {
    pool: u32,
    pg: String,
    up: Vec<u32>,
}

/// Parses `osdmap e16 pool 'p2' (3) object 'b' -> pg 3.54aca597 (3.17) -> up ([0,1], p0) ...`.
fn parse_ceph(line: &str) -> Option<(String, Placement)> {
    let pool_id = line.split(" (").nth(1)?.split(')').next()?.parse().ok()?;
    let object = line
        .split("object '")
        .nth(1)?
        .split("' -> pg")
        .next()?
        .to_string();
    let pg = line
        .split(") -> up")
        .next()?
        .rsplit(" (")
        .next()?
        .to_string();
    let up = line.split("up ([").nth(1)?.split(']').next()?;
    Some((
        object,
        Placement {
            pool: pool_id,
            pg,
            up: parse_list(up)?,
        },
    ))
}

/// Parses kura's ` object 'b' -> 3.17 -> [0,1]`.
fn parse_kura(line: &str, pool: u32) -> Option<(String, Placement)> {
    let object = line
        .split("object '")
        .nth(1)?
        .split("' -> ")
        .next()?
        .to_string();
    let mut rest = line.split("' -> ").nth(1)?.split(" -> ");
    let pg = rest.next()?.to_string();
    let up = rest.next()?.trim().strip_prefix('[')?.strip_suffix(']')?;
    Some((
        object,
        Placement {
            pool,
            pg,
            up: parse_list(up)?,
        },
    ))
}

fn parse_list(s: &str) -> Option<Vec<u32>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split(',').map(|n| n.trim().parse().ok()).collect()
}

/// Asks the monitor for every object's placement in one `ceph` process (commands on stdin).
fn ceph_osd_map(c: &TestCluster, pool: &str, objects: &[String]) -> Vec<(String, Placement)> {
    let mut child = Command::new("ceph")
        .arg("-c")
        .arg(c.conf())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ceph");
    let mut script = String::new();
    for o in objects {
        script.push_str(&format!("osd map {pool} {o}\n"));
    }
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write commands");
    let out = child.wait_with_output().expect("ceph");
    assert!(
        out.status.success(),
        "ceph osd map: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("osdmap "))
        .map(|l| parse_ceph(l).unwrap_or_else(|| panic!("unexpected ceph line: {l}")))
        .collect();
    assert_eq!(answers.len(), objects.len(), "one answer per object");
    answers
}

#[test]
fn kura_crush_map_places_objects_like_the_monitor() {
    if !daemons_installed() {
        kura_testkit::skip(
            "kura_crush_map_places_objects_like_the_monitor",
            "ceph",
            "ceph-mon/ceph-osd/ceph-mgr not installed",
        );
        return;
    }
    let c = TestCluster::start().expect("start the test cluster");
    let ceph = |args: &[&str]| {
        c.ceph_ok(args)
            .unwrap_or_else(|e| panic!("ceph {}: {e}", args.join(" ")));
    };
    ceph(&["balancer", "off"]);
    ceph(&["osd", "crush", "reweight", "osd.0", "0.013"]);
    ceph(&["osd", "crush", "reweight", "osd.1", "0.004"]);
    ceph(&["osd", "pool", "create", "folded", "48", "48", "replicated"]);
    ceph(&["osd", "pool", "set", "folded", "size", "2"]);

    let map = c.root().join("crush.bin");
    ceph(&["osd", "getcrushmap", "-o", map.to_str().expect("utf-8")]);
    let objects: Vec<String> = (0..60)
        .map(|i| match i % 3 {
            0 => format!("rbd_data.{:x}.{:016x}", 0x1f2e + i, i * 7919),
            1 => format!("object-{i}"),
            _ => "x".repeat(1 + i % 40),
        })
        .collect();

    let mut compared = 0;
    let mut differing_up_sets = std::collections::BTreeSet::new();
    for (pool, size) in [("rbd", "3"), ("folded", "2")] {
        let monitor = ceph_osd_map(&c, pool, &objects);
        let (pool_id, pg_num) = {
            let id = monitor[0].1.pool;
            let detail = c
                .ceph_ok(&["osd", "pool", "get", pool, "pg_num"])
                .expect("pg_num");
            let detail = String::from_utf8_lossy(&detail);
            let pg_num = detail
                .trim()
                .trim_start_matches("pg_num:")
                .trim()
                .to_string();
            (id, pg_num)
        };
        let mut args = vec!["crush", "map", "-i", map.to_str().expect("utf-8"), "--pool"];
        let id = pool_id.to_string();
        args.extend([id.as_str(), "--pg-num", &pg_num, "--size", size]);
        args.extend(objects.iter().map(String::as_str));
        let out = kura(&args);
        assert!(out.status.success(), "kura crush map: {}", text(&out));
        let ours: Vec<_> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("object '"))
            .map(|l| parse_kura(l, pool_id).unwrap_or_else(|| panic!("unexpected kura line: {l}")))
            .collect();
        assert_eq!(ours.len(), objects.len(), "kura placed every object");
        for ((name, theirs), (our_name, our)) in monitor.iter().zip(&ours) {
            assert_eq!(name, our_name, "answers come in the order asked");
            assert_eq!(theirs, our, "pool {pool} object {name}");
            differing_up_sets.insert(our.up.clone());
            compared += 1;
        }
    }
    assert_eq!(compared, 2 * objects.len());
    // The comparison means something only if the placements vary.
    assert!(
        differing_up_sets.len() >= 4,
        "up sets seen: {differing_up_sets:?}"
    );
}
