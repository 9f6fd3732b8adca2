//! `BlockDevice::stats` across NBD: a `remote:` drive reports its reconnect counters and then its
//! connection; a running server asks each export's driver thread for its device's counters
//! (`Server::export_stats`), and hands the device back on stop with the counters of everything
//! served.

mod common;

use common::{mem_disk, start};
use kura_engine::device::stats_of;
use kura_engine::fault::{FaultDevice, FaultPlan};
use kura_engine::{BlockingIo, Spec};
use kura_nbd::Export;
use std::time::Duration;

#[test]
fn remote_reports_its_connection_and_the_export_keeps_its_counters() {
    let (disk, _) = mem_disk(1 << 20);
    let counted = FaultDevice::new(disk, FaultPlan::default());
    let server = start(vec![Export::new("disk", Box::new(counted))]);
    let spec = Spec::parse(&format!("remote:{}/disk", server.local_addr())).expect("spec");
    let mut dev = kura_nbd::remote::open(&spec).expect("open remote");
    dev.write_blocks(0, &[5u8; 4096]).expect("write");
    let mut back = [0u8; 4096];
    dev.read_blocks(0, &mut back).expect("read");
    assert_eq!(back, [5u8; 4096]);
    let stats = stats_of(&dev);
    let shape: Vec<(&str, usize)> = stats.iter().map(|s| (s.kind.as_str(), s.depth)).collect();
    assert_eq!(shape, [("remote", 0), ("nbd", 1)]);
    assert_eq!(stats[0].counter("reconnects"), Some(0));
    assert_eq!(stats[0].counter("replayed"), Some(0));
    drop(dev);

    // The driver thread answers while the server runs (the wait only bounds a hang).
    let running = server.export_stats(Duration::from_secs(60));
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].0, "disk");
    let live = &running[0].1;
    assert_eq!(live.len(), 2);
    assert_eq!(live[0].counter("writes"), Some(1), "{}", live[0]);
    assert_eq!(live[0].counter("reads"), Some(1), "{}", live[0]);

    let mut exports = server.stop();
    let stats = stats_of(exports[0].device_mut());
    let shape: Vec<(&str, usize)> = stats.iter().map(|s| (s.kind.as_str(), s.depth)).collect();
    assert_eq!(shape, [("fault", 0), ("mem", 1)]);
    assert_eq!(stats[0].counter("writes"), Some(1), "{}", stats[0]);
    assert_eq!(stats[0].counter("reads"), Some(1), "{}", stats[0]);
}
