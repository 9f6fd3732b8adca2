//! Model-based test of the device interface on every backend: random batches of reads, writes,
//! flushes, write-zeroes and discards at random depths, compared against a flat `Vec<u8>`.
//!
//! Within one batch, mutations never overlap any other request of the batch, because the
//! interface (like NVMe) promises no order among commands in flight; between batches the queue
//! drains, so the model is exact. Queue depth 8 with batches up to 24 exercises back-pressure, and
//! `max_transfer=16K` makes requests of up to 12 blocks split.

mod common;

use common::{data_backends, open_or_skip, BLOCK, BLOCKS};
use kura_engine::{BlockDevice, Completion, DeviceError, IoBuf, Opcode, Request};
use proptest::prelude::*;
use std::collections::HashSet;

#[derive(Debug, Clone)]
struct Op {
    op: Opcode,
    lba: u64,
    blocks: u64,
    fill: u8,
    heap_buffer: bool,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        4 => Just(Opcode::Read),
        4 => Just(Opcode::Write),
        1 => Just(Opcode::Flush),
        1 => Just(Opcode::WriteZeroes),
        1 => Just(Opcode::Discard),
    ];
    (kind, 0..BLOCKS, 1u64..=12, any::<u8>(), any::<bool>()).prop_map(
        |(op, lba, blocks, fill, heap_buffer)| {
            let blocks = blocks.min(BLOCKS - lba);
            Op {
                op,
                lba,
                blocks,
                fill,
                heap_buffer,
            }
        },
    )
}

/// Drops ops whose mutation would overlap another op of the same batch.
fn without_conflicts(batch: Vec<Op>) -> Vec<Op> {
    let mut kept: Vec<Op> = Vec::new();
    for op in batch {
        let overlaps = |a: &Op, b: &Op| {
            a.op != Opcode::Flush
                && b.op != Opcode::Flush
                && a.lba < b.lba + b.blocks
                && b.lba < a.lba + a.blocks
        };
        let conflict = kept
            .iter()
            .any(|k| overlaps(k, &op) && (k.op.is_mutation() || op.op.is_mutation()));
        if !conflict {
            kept.push(op);
        }
    }
    kept
}

fn buffer(bytes: usize, heap: bool) -> IoBuf {
    if heap {
        IoBuf::heap(bytes, 4096)
    } else {
        IoBuf::zeroed(bytes)
    }
}

fn run_batches(dev: &mut dyn BlockDevice, batches: Vec<Vec<Op>>) -> Result<(), TestCaseError> {
    let mut model = vec![0u8; BLOCKS as usize * BLOCK];
    let mut tag = 0u64;
    for batch in batches {
        let batch = without_conflicts(batch);
        let mut expected_reads = std::collections::HashMap::new();
        let mut outstanding = HashSet::new();
        let mut done: Vec<Completion> = Vec::new();
        for op in &batch {
            tag += 1;
            let range = op.lba as usize * BLOCK..(op.lba + op.blocks) as usize * BLOCK;
            let req = match op.op {
                Opcode::Read => {
                    expected_reads.insert(tag, model[range.clone()].to_vec());
                    Request::read(tag, op.lba, op.blocks, buffer(range.len(), op.heap_buffer))
                }
                Opcode::Write => {
                    let mut buf = buffer(range.len(), op.heap_buffer);
                    for (i, b) in buf.iter_mut().enumerate() {
                        *b = op.fill.wrapping_add((i / 512) as u8);
                    }
                    model[range].copy_from_slice(&buf);
                    Request::write(tag, op.lba, op.blocks, buf)
                }
                Opcode::Flush => Request::flush(tag),
                Opcode::WriteZeroes => {
                    model[range].fill(0);
                    Request::write_zeroes(tag, op.lba, op.blocks)
                }
                Opcode::Discard => {
                    model[range].fill(0);
                    Request::discard(tag, op.lba, op.blocks)
                }
            };
            let mut req = req;
            loop {
                match dev.submit(req) {
                    Ok(()) => break,
                    Err(rejected) => {
                        prop_assert!(
                            matches!(rejected.error, DeviceError::QueueFull { .. }),
                            "only back-pressure may refuse a valid request: {}",
                            rejected.error
                        );
                        prop_assert_eq!(
                            rejected.request.tag,
                            tag,
                            "the refused request comes back whole"
                        );
                        req = rejected.request;
                        dev.poll(&mut done, 1)
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    }
                }
            }
            outstanding.insert(tag);
        }
        while dev.in_flight() > 0 {
            dev.poll(&mut done, 1)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        for c in done {
            prop_assert!(
                outstanding.remove(&c.tag),
                "tag {} completed twice or was never submitted",
                c.tag
            );
            prop_assert!(
                c.status.is_ok(),
                "tag {} ({}) failed: {:?}",
                c.tag,
                c.op,
                c.status
            );
            if let Some(expected) = expected_reads.get(&c.tag) {
                let buf = c
                    .buf
                    .as_ref()
                    .ok_or_else(|| TestCaseError::fail("read lost its buffer"))?;
                prop_assert!(
                    buf[..expected.len()] == expected[..],
                    "tag {} read wrong data",
                    c.tag
                );
            }
        }
        prop_assert!(outstanding.is_empty(), "never completed: {:?}", outstanding);
    }
    // Everything written must read back once more through the blocking API.
    let mut whole = vec![0u8; model.len()];
    kura_engine::BlockingIo::read_blocks(dev, 0, &mut whole)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(whole == model, "final image differs from the model");
    Ok(())
}

#[test]
fn every_backend_matches_a_flat_buffer() {
    let cases: u32 = std::env::var("KURA_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let dir = tempfile::tempdir().unwrap();
    for spec in data_backends(dir.path()) {
        if open_or_skip(&spec).is_none() {
            continue;
        }
        let config = ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        let batches =
            proptest::collection::vec(proptest::collection::vec(op_strategy(), 1..24), 1..8);
        let mut runner = proptest::test_runner::TestRunner::new(config);
        let result = runner.run(&batches, |batches| {
            // A fresh device per case: files are recreated, so remove the old image first.
            if let Some(path) = spec.split(':').nth(1).and_then(|t| t.split('?').next()) {
                if path.starts_with('/') {
                    let _ = std::fs::remove_file(path);
                }
            }
            let mut dev =
                kura_engine::open(&spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
            run_batches(&mut *dev, batches)
        });
        if let Err(e) = result {
            panic!("{spec}: {e}");
        }
        eprintln!("ok: {spec}: {cases} cases");
    }
}

#[test]
fn null_device_completes_every_command_exactly_once() {
    let mut dev = kura_engine::open("null:1G?qd=64").unwrap();
    let mut seen = HashSet::new();
    let mut done = Vec::new();
    for tag in 0..1000u64 {
        let req = Request::read(tag, tag * 8, 1, IoBuf::zeroed(4096));
        if let Err(rejected) = dev.submit(req) {
            assert!(matches!(
                rejected.error,
                DeviceError::QueueFull { depth: 64 }
            ));
            dev.poll(&mut done, 1).unwrap();
            dev.submit(rejected.request).unwrap();
        }
    }
    while dev.in_flight() > 0 {
        dev.poll(&mut done, 1).unwrap();
    }
    for c in done {
        assert!(seen.insert(c.tag));
        assert!(c.status.is_ok() && c.buf.is_some());
    }
    assert_eq!(seen.len(), 1000);
}
