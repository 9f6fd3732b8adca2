//! The device-interface contract ([`kura_engine::conformance`]) on every backend that stores
//! data; the NVMe crate runs the same checks on its simulated controller and, in the QEMU guest,
//! on `nvme:`, `nvme-pt:` and `uring:` over the emulated controller.

mod common;

use common::{data_backends, open_or_skip, BLOCKS};
use kura_engine::conformance;

#[test]
fn every_backend_passes_the_device_interface_suite() {
    let dir = tempfile::tempdir().unwrap();
    for spec in data_backends(dir.path()) {
        let Some(mut dev) = open_or_skip(&spec) else {
            continue;
        };
        for (check, outcome) in conformance::suite(&mut *dev, 0, BLOCKS, 1) {
            if let Err(e) = outcome {
                panic!("{spec}: {check}: {e}");
            }
        }
    }
}

#[test]
fn a_deep_uring_queue_with_large_requests_passes_too() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!(
        "uring:{}/deep.img?size=16M&max_transfer=1M&qd=128",
        dir.path().display()
    );
    let Some(mut dev) = open_or_skip(&spec) else {
        return;
    };
    let blocks = dev.geometry().num_blocks;
    let split = conformance::splits_above_max_transfer(&mut *dev, 3, blocks - 3).unwrap();
    assert!(split.starts_with("513 blocks"), "{split}");
    let deep = conformance::fills_the_queue(&mut *dev, 0, blocks).unwrap();
    assert!(deep.starts_with("128 in flight"), "{deep}");
}

#[test]
fn the_null_device_refuses_what_every_device_refuses() {
    let mut dev = kura_engine::open("null:1M?bs=4096").unwrap();
    conformance::refuses_invalid_requests(&mut *dev).unwrap();
}

#[test]
fn the_null_device_reads_zeroes_over_stale_buffers() {
    // `null:` stores nothing; before it filled reads, a reused pool buffer reached NBD clients
    // with another export's data in it.
    let mut dev = kura_engine::open("null:1M?bs=4096").unwrap();
    let summary = conformance::reads_overwrite_stale_bytes(&mut *dev, 0, 8).unwrap();
    assert!(summary.starts_with("8 zeroed"), "{summary}");
}

#[test]
fn a_device_that_loses_writes_fails_the_suite() {
    // The null device drops every write: the model must notice, or the suite proves nothing.
    let mut dev = kura_engine::open("null:1M?bs=4096").unwrap();
    let blocks = dev.geometry().num_blocks;
    let failed: Vec<&str> = conformance::suite(&mut *dev, 0, blocks, 1)
        .into_iter()
        .filter(|(_, o)| o.is_err())
        .map(|(c, _)| c)
        .collect();
    assert!(failed.contains(&"model"), "{failed:?}");
}
