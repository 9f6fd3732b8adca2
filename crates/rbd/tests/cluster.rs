//! `rbd:` on a real cluster (`scripts/ceph/start.sh`: 1 monitor, 1 manager, 3 memstore OSDs,
//! pool `rbd` size 3 / min_size 2), started once for this binary.
//!
//! All checks run inside one `#[test]`, in order, on that one cluster: the cluster is started at
//! its top and stopped when its guard drops, which also happens when a check panics (and the
//! start script's watchdog stops it if this process is killed). The destructive checks come
//! last: an OSD killed and restarted under a write stream, two OSDs gone under a request, then
//! the monitor stopped. Each check's failure is collected and reported with its name.

use kura_engine::{conformance, BlockDevice, BlockingIo, DeviceError, OpenError, Registry};
use kura_rbd::testing::{missing, run_checks, Check, TestCluster};
use std::path::Path;
use std::time::{Duration, Instant};

const BS: usize = 4096;

fn registry() -> Registry {
    let mut reg = Registry::engine();
    kura_rbd::register(&mut reg);
    reg
}

fn open(spec: &str) -> Box<dyn BlockDevice> {
    registry()
        .open(spec)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn open_err(spec: &str) -> OpenError {
    match registry().open(spec) {
        Ok(_) => panic!("{spec}: opened, but must fail"),
        Err(e) => e,
    }
}

/// Opening `spec` fails, within `within`, with an error that says each of `says`.
fn fails_within(spec: &str, says: &[&str], within: Duration) {
    let t0 = Instant::now();
    let e = open_err(spec).to_string();
    assert!(says.iter().all(|s| e.contains(s)), "{e}");
    assert!(t0.elapsed() < within, "took {:?}", t0.elapsed());
}

/// Bytes that differ per block and per `seed`.
fn pattern(blocks: usize, seed: u8) -> Vec<u8> {
    (0..blocks * BS)
        .map(|i| ((i / BS) as u8).wrapping_mul(31) ^ (i as u8) ^ seed)
        .collect()
}

#[test]
fn rbd_on_a_real_cluster() {
    if let Some(why) = missing() {
        kura_testkit::skip("rbd_on_a_real_cluster", "ceph", why);
        return;
    }
    let checks: &[(&str, Check)] = &[
        ("conformance suite", conformance_suite),
        ("model with small pieces", model_small_pieces),
        ("rbd export equals kura's writes", export_equals_writes),
        ("rbd import reads back", import_reads_back),
        ("snapshot reads and refuses writes", snapshot),
        ("a second writer is refused", second_writer_refused),
        ("missing image and pool", missing_image_and_pool),
        ("no ceph.conf: mon_host and keyring", no_conf_file),
        ("wrong keyring", wrong_keyring),
        ("unreachable monitor", unreachable_monitor),
        ("OSD killed during a write stream", osd_killed_during_writes),
        ("request below min_size times out", request_times_out),
        ("monitor stopped", monitor_stopped),
    ];
    if let Err(e) = run_checks(checks) {
        panic!("{e}");
    }
}

fn conformance_suite(c: &TestCluster) {
    let spec = c.spec("conformance", "create=32M");
    let mut dev = open(&spec);
    assert_eq!(
        dev.geometry().max_transfer,
        4 << 20,
        "cut at the 4 MiB object size"
    );
    for (check, outcome) in conformance::suite(&mut *dev, 0, 2048, 1) {
        if let Err(e) = outcome {
            panic!("{spec}: {check}: {e}");
        }
    }
    // A request starting 3 blocks before the end of object 0 spans objects 0 to 2.
    let blocks = dev.geometry().num_blocks;
    let split = conformance::splits_above_max_transfer(&mut *dev, 1021, blocks - 1021)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(split.starts_with("2049 blocks"), "{split}");
}

fn model_small_pieces(c: &TestCluster) {
    // 16 KiB pieces and a queue of 8: every request of more than 4 blocks is several RADOS
    // operations, and the model's batches hit back-pressure.
    let spec = c.spec("model", "create=8M&max_transfer=16K&qd=8");
    let mut dev = open(&spec);
    let blocks = dev.geometry().num_blocks;
    let summary = conformance::model_region(&mut *dev, 0, blocks, 10..14, 8)
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
    eprintln!("     model: {summary}");
    let deep = conformance::fills_the_queue(&mut *dev, 0, blocks).unwrap_or_else(|e| panic!("{e}"));
    assert!(deep.starts_with("8 in flight"), "{deep}");
}

fn export_equals_writes(c: &TestCluster) {
    let mut dev = open(&c.spec("exported", "create=6M"));
    let data = pattern(6 * 256, 7);
    dev.write_blocks(0, &data).expect("write");
    dev.zero_blocks(300, 5).expect("zero");
    dev.flush_all().expect("flush");
    drop(dev);
    let mut expect = data;
    expect[300 * BS..305 * BS].fill(0);
    let exported = c
        .rbd_ok(&["export", "rbd/exported", "-"])
        .expect("rbd export");
    assert_eq!(exported.len(), expect.len());
    assert!(exported == expect, "rbd export differs from kura's writes");
}

fn import_reads_back(c: &TestCluster) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("in.img");
    let data = pattern(1000, 99);
    std::fs::write(&file, &data).expect("write file");
    c.rbd_ok(&["import", file.to_str().expect("utf-8"), "rbd/imported"])
        .expect("rbd import");
    let mut dev = open(&c.spec("imported", ""));
    assert_eq!(dev.geometry().capacity_bytes(), data.len() as u64);
    let mut back = vec![0u8; data.len()];
    dev.read_blocks(0, &mut back).expect("read");
    assert!(back == data, "kura reads differ from the imported file");
}

fn second_writer_refused(c: &TestCluster) {
    let spec = c.spec("shared", "create=4M");
    let mut writer = open(&spec);
    let data = pattern(16, 7);
    writer.write_blocks(0, &data).expect("write");
    writer.flush_all().expect("flush");
    fails_within(
        &spec,
        &["rbd/shared", "in use by another writer"],
        Duration::from_secs(40),
    );
    // Readers still open beside the writer, and the writer kept its lock and its data.
    let mut reader = open(&c.spec("shared", "ro=1"));
    let mut back = vec![0u8; data.len()];
    reader
        .read_blocks(0, &mut back)
        .expect("read beside the writer");
    assert!(
        back == data,
        "a reader beside the writer sees its flushed data"
    );
    writer
        .write_blocks(16, &data)
        .expect("the first writer still writes");
    writer.flush_all().expect("flush");
    drop(writer);
    // With the first writer gone, the image is free again.
    let mut next = open(&spec);
    next.read_blocks(16, &mut back).expect("read");
    assert!(
        back == data,
        "the second writer sees the first one's last write"
    );
}

fn snapshot(c: &TestCluster) {
    let mut dev = open(&c.spec("snapped", "create=4M"));
    let first = pattern(64, 1);
    dev.write_blocks(0, &first).expect("write");
    dev.flush_all().expect("flush");
    c.rbd_ok(&["snap", "create", "rbd/snapped@s1"])
        .expect("snap create");
    let second = pattern(64, 2);
    dev.write_blocks(0, &second)
        .expect("write after the snapshot");
    dev.flush_all().expect("flush");
    drop(dev);

    let mut snap = open(&c.spec("snapped", "snap=s1"));
    let mut back = vec![0u8; first.len()];
    snap.read_blocks(0, &mut back).expect("read the snapshot");
    assert!(
        back == first,
        "the snapshot does not hold what was written before it"
    );
    match snap.write_blocks(0, &second[..BS]) {
        Err(DeviceError::ReadOnly { .. }) => {}
        other => panic!("a write to a snapshot must be refused as read-only: {other:?}"),
    }
    let mut head = open(&c.spec("snapped", "ro=1"));
    head.read_blocks(0, &mut back).expect("read the head");
    assert!(
        back == second,
        "the head lost the write made after the snapshot"
    );
    let e = open_err(&c.spec("snapped", "snap=nope")).to_string();
    assert!(
        e.contains("snapshot") && e.contains("does not exist"),
        "{e}"
    );
}

fn missing_image_and_pool(c: &TestCluster) {
    let e = open_err(&c.spec("absent", "")).to_string();
    assert!(
        e.contains("rbd/absent does not exist") && e.contains("create=SIZE"),
        "{e}"
    );
    let e = open_err(&format!("rbd:nopool/x?conf={}", c.conf().display())).to_string();
    assert!(e.contains("pool `nopool` does not exist"), "{e}");
}

fn no_conf_file(c: &TestCluster) {
    let conf = std::fs::read_to_string(c.conf()).expect("read ceph.conf");
    // `mon host = [v2:127.0.0.1:P2,v1:127.0.0.1:P1]`: the v2 address alone (no comma, which
    // would end the option in a spec).
    let mon_host = conf
        .lines()
        .find_map(|l| l.trim().strip_prefix("mon host = [")?.split(',').next())
        .expect("mon host line");
    let keyring = c.root().join("keyring");
    // No conf=, and no /etc/ceph/ceph.conf or $CEPH_CONF needed: the options say it all.
    let spec = format!(
        "rbd:rbd/exported?mon_host={mon_host}&keyring={}&ro=1",
        keyring.display()
    );
    if std::env::var_os("CEPH_CONF").is_some() || Path::new("/etc/ceph/ceph.conf").exists() {
        eprintln!("     (a default ceph.conf exists here; mon_host and keyring still override it)");
    }
    let mut dev = open(&spec);
    let mut back = vec![0u8; BS];
    dev.read_blocks(0, &mut back).expect("read");
    assert!(back == pattern(1, 7), "block 0 of the exported image");
}

fn wrong_keyring(c: &TestCluster) {
    let keyring = c.wrong_keyring().expect("keyring");
    let spec = c.spec(
        "exported",
        &format!("keyring={}&timeout=10", keyring.display()),
    );
    fails_within(
        &spec,
        &["cephx credentials", "keyring="],
        Duration::from_secs(40),
    );
}

fn unreachable_monitor(c: &TestCluster) {
    // TEST-NET-1: routed nowhere, so nothing ever answers.
    let spec = c.spec("exported", "mon_host=192.0.2.1:6789&timeout=3");
    fails_within(
        &spec,
        &["no answer from the cluster", "within 3 s"],
        Duration::from_secs(33),
    );
}

fn osd_killed_during_writes(c: &TestCluster) {
    let blocks = 2048u64; // 8 MiB, 2 objects' worth per 1 MiB step below
    let mut dev = open(&c.spec("stream", "create=8M&timeout=60"));
    let chunk = 64u64; // 256 KiB writes
    let mut acknowledged = Vec::new();
    let mut expect = vec![0u8; blocks as usize * BS];
    let steps = blocks / chunk;
    for step in 0..steps * 2 {
        let lba = (step % steps) * chunk;
        let data = pattern(chunk as usize, step as u8);
        if step == steps / 2 {
            c.kill("osd.1", "KILL").expect("kill osd.1");
        }
        if step == steps {
            c.restart_osd(1).expect("restart osd.1");
        }
        dev.write_blocks(lba, &data)
            .unwrap_or_else(|e| panic!("write {step} at {lba} while an OSD is down: {e}"));
        acknowledged.push(step);
        let at = lba as usize * BS;
        expect[at..at + data.len()].copy_from_slice(&data);
        if step % 8 == 7 {
            dev.flush_all().expect("flush");
        }
    }
    dev.flush_all().expect("final flush");
    drop(dev);
    c.wait_clean(Duration::from_secs(120)).expect("recovered");
    let exported = c.rbd_ok(&["export", "rbd/stream", "-"]).expect("export");
    assert_eq!(acknowledged.len() as u64, steps * 2);
    assert!(
        exported == expect,
        "an acknowledged write is missing after the OSD came back"
    );
}

fn request_times_out(c: &TestCluster) {
    let mut dev = open(&c.spec("stream", "timeout=5"));
    c.kill("osd.1", "KILL").expect("kill osd.1");
    c.kill("osd.2", "KILL").expect("kill osd.2");
    let t0 = Instant::now();
    // librbd's write-back cache may take the write (the image's lock was taken at open), so
    // the flush that must make it durable is what meets the missing OSDs.
    let result = dev
        .write_blocks(0, &pattern(1, 5))
        .and_then(|()| dev.flush_all());
    let took = t0.elapsed();
    c.restart_osd(1).expect("restart osd.1");
    c.restart_osd(2).expect("restart osd.2");
    match result {
        Err(DeviceError::Io { errno, .. }) => assert_eq!(errno.0, libc::ETIMEDOUT, "{errno}"),
        other => panic!("a write and flush with one OSD of three must time out: {other:?}"),
    }
    assert!(took < Duration::from_secs(35), "took {took:?}");
    drop(dev);
    c.wait_clean(Duration::from_secs(120)).expect("recovered");
}

fn monitor_stopped(c: &TestCluster) {
    c.kill("mon.a", "TERM").expect("stop the monitor");
    let t0 = Instant::now();
    let e = open_err(&c.spec("exported", "timeout=3")).to_string();
    assert!(e.contains("no answer from the cluster"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(33),
        "took {:?}",
        t0.elapsed()
    );
}
