//! Every registered spec kind works everywhere a spec is taken: through the key-value store's
//! device store, through `kura genome index|map --dev` and through `kura bench io --device`, and
//! `kura specs` lists each of them. Kinds that cannot keep data between two opens (`mem:`,
//! `nvme-sim:`) reach the key-value store and the genome tools as NBD exports of an in-process
//! server, opened through the same registry; `null:` stores nothing and holds no file system, so
//! only the benchmark takes it; `nvme:` and `nvme-pt:` need a controller and run in
//! `crates/nvme-guest`'s QEMU guest instead.

mod common;

use common::{fresh_db, kura, ok_output};
use kura_engine::Registry;
use kura_kv::Db;
use kura_nbd::{bind_loopback, serve, Export, ServeOptions, Server};
use std::collections::BTreeSet;
use std::path::Path;

/// Kinds no test here can open: they need an NVMe controller.
const NEEDS_HARDWARE: &[&str] = &["nvme", "nvme-pt"];

/// The kinds the `kura` binary knows, composed as `kura`'s `dev::registry` composes them.
fn registry() -> Registry {
    let mut registry = Registry::engine();
    kura_vdrive::register(&mut registry);
    kura_nvme::register(&mut registry);
    kura_nbd::register(&mut registry);
    registry
}

/// An NBD server in this process exporting `mem` (`mem:64M`) and `sim` (`nvme-sim:64M`), so
/// those kinds keep their data between the opens of a test.
fn volatile_exports(registry: &Registry) -> Server {
    let exports = [("mem", "mem:64M"), ("sim", "nvme-sim:64M?lba=4096")]
        .into_iter()
        .map(|(name, spec)| Export::new(name, registry.open(spec).expect(spec)))
        .collect();
    serve(
        bind_loopback(0).expect("bind"),
        exports,
        ServeOptions::default(),
    )
    .expect("serve")
}

/// One spec per kind that holds data across opens, each on its own files under `dir`; wrappers
/// wrap `file:` images. `(kind, spec)`; the kinds `mem` and `nvme-sim` are the server's exports.
fn persistent_specs(dir: &Path, server: &Server, registry: &Registry) -> Vec<(String, String)> {
    let img = |name: &str, size: &str| format!("file:{}?size={size}", dir.join(name).display());
    let addr = server.local_addr();
    // A snapshot drive is formatted once; the spec used afterwards opens its head.
    let snap_child = img("snapshot.img", "64M");
    drop(
        registry
            .open(&format!("snapshot({snap_child})?format=1"))
            .expect("format the snapshot drive"),
    );
    [
        ("file", img("file.img", "64M")),
        (
            "uring",
            format!("uring:{}?size=64M", dir.join("uring.img").display()),
        ),
        (
            "sync",
            format!("sync:{}?size=64M", dir.join("sync.img").display()),
        ),
        (
            "redirect",
            format!("redirect:{}?size=64M", dir.join("redirect.img").display()),
        ),
        ("fault", format!("fault({})", img("fault.img", "64M"))),
        (
            "split",
            format!("split({})?offset=16M&len=64M", img("split.img", "96M")),
        ),
        (
            "concat",
            format!("concat({},{})", img("c1.img", "32M"), img("c2.img", "32M")),
        ),
        (
            "stripe",
            format!("stripe({},{})", img("s1.img", "32M"), img("s2.img", "32M")),
        ),
        (
            "mirror",
            format!("mirror({},{})", img("m1.img", "64M"), img("m2.img", "64M")),
        ),
        (
            "placed",
            format!(
                "placed({},{},{})?replicas=2&chunk=1M",
                img("p0.img", "64M"),
                img("p1.img", "64M"),
                img("p2.img", "64M")
            ),
        ),
        (
            "cache",
            format!("cache({})?mode=wb", img("cache.img", "64M")),
        ),
        (
            "coalesce",
            format!("coalesce({})", img("coalesce.img", "64M")),
        ),
        (
            "spill",
            format!(
                "spill({},{})?local=16M",
                img("local.img", "16M"),
                img("remote.img", "64M")
            ),
        ),
        (
            "priority",
            format!("priority({})", img("priority.img", "64M")),
        ),
        (
            "throttle",
            format!(
                "throttle({})?lat_us=20&slow_us=200&slow_pct=10",
                img("throttle.img", "64M")
            ),
        ),
        (
            "qos",
            format!("qos({})?iops=100000&bw=2G", img("qos.img", "64M")),
        ),
        (
            "atomic",
            format!("atomic({})?log=4M", img("atomic.img", "68M")),
        ),
        ("snapshot", format!("snapshot({snap_child})")),
        ("nbd", format!("nbd:{addr}/mem")),
        ("mem", format!("nbd:{addr}/mem")),
        ("remote", format!("remote:{addr}/sim")),
        ("nvme-sim", format!("remote:{addr}/sim")),
    ]
    .into_iter()
    .map(|(k, s)| (k.to_string(), s))
    .collect()
}

/// Fails unless `covered` and the kinds left out on purpose are exactly the registered kinds, so
/// a newly registered kind must be added to these tests.
fn assert_every_kind(registry: &Registry, covered: impl IntoIterator<Item = String>, out: &[&str]) {
    let registered: BTreeSet<String> = registry.kinds().iter().map(|k| k.name.into()).collect();
    let mut seen: BTreeSet<String> = covered.into_iter().collect();
    seen.extend(out.iter().map(|k| k.to_string()));
    assert_eq!(seen, registered, "kinds covered vs registered");
}

#[test]
fn every_kind_holds_a_key_value_store() {
    let registry = registry();
    let server = volatile_exports(&registry);
    let tmp = tempfile::tempdir().expect("tempdir");
    let specs = persistent_specs(tmp.path(), &server, &registry);
    for (kind, spec) in &specs {
        let (store, opts) = fresh_db(&registry, spec).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let db = Db::open(store.clone(), &opts).unwrap_or_else(|e| panic!("{kind}: {spec}: {e}"));
        db.put(b"kind", kind.as_bytes()).expect("put");
        db.close().expect("close");
        let db = Db::open(store, &opts).unwrap_or_else(|e| panic!("{kind}: reopen: {e}"));
        assert_eq!(
            db.get(b"kind").expect("get").as_deref(),
            Some(kind.as_bytes())
        );
        db.close().expect("close");
    }
    assert_every_kind(
        &registry,
        specs.into_iter().map(|(k, _)| k),
        &[NEEDS_HARDWARE, &["null"]].concat(),
    );
}

#[test]
fn every_kind_holds_the_genome_tools_files() {
    let registry = registry();
    let server = volatile_exports(&registry);
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    let data = d.join("data");
    ok_output(&[
        "genome",
        "simulate",
        "-o",
        data.to_str().unwrap(),
        "--genome-size",
        "60000",
        "--reads",
        "40",
    ]);
    let specs = persistent_specs(d, &server, &registry);
    for (kind, spec) in &specs {
        ok_output(&["mkfs", spec]);
        for f in ["reference.fa", "reads_1.fq"] {
            ok_output(&[
                "fs",
                "put",
                spec,
                data.join(f).to_str().unwrap(),
                &format!("/{f}"),
            ]);
        }
        ok_output(&[
            "genome",
            "index",
            "/reference.fa",
            "-o",
            "/ref.kgi",
            "--dev",
            spec,
        ]);
        // To stdout: the device is only read (opened ro=1 where it has image files).
        let o = ok_output(&["genome", "map", "/ref.kgi", "/reads_1.fq", "--dev", spec]);
        let records = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.starts_with('@'))
            .count();
        assert_eq!(records, 40, "{kind}: {spec}");
    }
    assert_every_kind(
        &registry,
        specs.into_iter().map(|(k, _)| k),
        &[NEEDS_HARDWARE, &["null"]].concat(),
    );
}

#[test]
fn every_kind_runs_the_io_benchmark() {
    let registry = registry();
    let server = volatile_exports(&registry);
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut specs = persistent_specs(tmp.path(), &server, &registry);
    // The benchmark writes and reads within one open, so these kinds are opened directly.
    specs.retain(|(kind, _)| kind != "mem" && kind != "nvme-sim");
    specs.extend([
        ("mem".to_string(), "mem:64M".to_string()),
        ("null".to_string(), "null:64M".to_string()),
        ("nvme-sim".to_string(), "nvme-sim:64M?lba=4096".to_string()),
    ]);
    // The report and its plot go to the temp dir, not the working directory.
    let json = tmp.path().join("io.json");
    for (kind, spec) in &specs {
        ok_output(&[
            "bench",
            "io",
            "--quick",
            "--overwrite",
            "--size",
            "16M",
            "--seconds",
            "0.02",
            "--device",
            spec,
            "--json",
            json.to_str().unwrap(),
            // The plot is tested with the bench itself; here it would only add Python's start-up
            // to every kind.
            "--no-plot",
        ]);
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("read the report"))
                .expect("parse the report");
        let measured = report["devices"].as_array().map_or(0, Vec::len);
        let points = report["latency"].as_array().map_or(0, Vec::len);
        assert!(
            measured == 1 && points > 0,
            "{kind}: {spec}: {measured} devices, {points} latency points in the report"
        );
    }
    assert_every_kind(&registry, specs.into_iter().map(|(k, _)| k), NEEDS_HARDWARE);
}

#[test]
fn specs_lists_every_registered_kind() {
    let o = ok_output(&["specs"]);
    let text = String::from_utf8_lossy(&o.stdout);
    for kind in registry().kinds() {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(kind.usage)),
            "`kura specs` does not list {} ({})",
            kind.name,
            kind.usage
        );
    }
}

#[test]
fn read_only_commands_add_ro_1_to_every_kind_that_takes_it() {
    use kura_engine::registry::ReadOnly;
    let registry = registry();
    let tmp = tempfile::tempdir().expect("tempdir");
    let text = String::from_utf8_lossy(&ok_output(&["specs"]).stdout).into_owned();
    let takes_ro: Vec<_> = registry
        .kinds()
        .iter()
        .filter(|k| k.read_only == ReadOnly::RoOption)
        .collect();
    assert!(!takes_ro.is_empty(), "no kind takes ro=1");
    for kind in registry.kinds() {
        let marked = text.lines().any(|l| {
            l.trim_start()
                .starts_with(&format!("{} [ro=1]", kind.usage))
        });
        assert_eq!(
            marked,
            kind.read_only == ReadOnly::RoOption,
            "`kura specs` marks exactly the kinds that take ro=1 ({}):\n{text}",
            kind.name
        );
    }
    // A read-only open cannot create an image, so a missing one fails with the ro=1 refusal, on
    // its own and wrapped (the marking walks the whole spec through the registry).
    for kind in takes_ro {
        let image = tmp.path().join(format!("{}.img", kind.name));
        let leaf = format!("{}:{}?size=1M", kind.name, image.display());
        for spec in [leaf.clone(), format!("cache(fault({leaf}))")] {
            let o = kura(&["dev", "info", &spec]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                !o.status.success() && err.contains("read-only open (ro=1) cannot create"),
                "kura dev info {spec}: {err}"
            );
            assert!(
                !image.exists(),
                "a read-only open created {}",
                image.display()
            );
        }
        // The same spec opens when the command may write (and creates the image).
        ok_output(&["dev", "create", &leaf]);
        assert!(image.exists());
        ok_output(&["dev", "info", &leaf]);
    }
}
