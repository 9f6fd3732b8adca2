//! Shared by the virtual-drive tests: a flat `Vec<u8>` model of a device and a driver that runs
//! seeded random batches of mixed commands against a device at queue depth and checks every
//! completion against the model.
//!
//! Within one batch, mutations never overlap another command of the batch (the interface promises
//! no order among commands in flight); between batches the queue drains, so the model is exact.

#![allow(dead_code)]

use kura_engine::{BlockDevice, BlockingIo, Completion, DeviceError, IoBuf, Opcode, Request};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

/// What the device should hold.
pub struct Model {
    pub data: Vec<u8>,
    pub block: usize,
    pub blocks: u64,
    tag: u64,
    rng: SmallRng,
}

struct Op {
    op: Opcode,
    lba: u64,
    blocks: u64,
}

impl Model {
    /// A model of `dev` (all zeroes) with a seeded workload.
    pub fn of(dev: &dyn BlockDevice, seed: u64) -> Self {
        let geo = dev.geometry();
        Model {
            data: vec![0; geo.capacity_bytes() as usize],
            block: geo.block_size as usize,
            blocks: geo.num_blocks,
            tag: 0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    fn random_op(&mut self) -> Op {
        let op = match self.rng.gen_range(0..11) {
            0..=3 => Opcode::Read,
            4..=7 => Opcode::Write,
            8 => Opcode::Flush,
            9 => Opcode::WriteZeroes,
            _ => Opcode::Discard,
        };
        let max = if self.rng.gen_bool(0.2) { 48 } else { 8 };
        let blocks = self.rng.gen_range(1..=max).min(self.blocks);
        let lba = self.rng.gen_range(0..=self.blocks - blocks);
        Op { op, lba, blocks }
    }

    /// Runs `batches` random batches of up to 32 commands and checks every completion.
    pub fn run(&mut self, dev: &mut dyn BlockDevice, batches: usize) {
        for _ in 0..batches {
            let n = self.rng.gen_range(1..=32);
            let mut batch: Vec<Op> = Vec::new();
            for _ in 0..n {
                let op = self.random_op();
                let overlaps = |a: &Op, b: &Op| {
                    a.op != Opcode::Flush
                        && b.op != Opcode::Flush
                        && a.lba < b.lba + b.blocks
                        && b.lba < a.lba + a.blocks
                };
                if !batch
                    .iter()
                    .any(|k| overlaps(k, &op) && (k.op.is_mutation() || op.op.is_mutation()))
                {
                    batch.push(op);
                }
            }
            self.run_batch(dev, &batch);
        }
    }

    fn run_batch(&mut self, dev: &mut dyn BlockDevice, batch: &[Op]) {
        let bs = self.block;
        let mut expected = HashMap::new();
        let mut outstanding = HashSet::new();
        let mut done: Vec<Completion> = Vec::new();
        for op in batch {
            self.tag += 1;
            let tag = self.tag;
            let range = op.lba as usize * bs..(op.lba + op.blocks) as usize * bs;
            let mut req = match op.op {
                Opcode::Read => {
                    expected.insert(tag, self.data[range.clone()].to_vec());
                    Request::read(tag, op.lba, op.blocks, IoBuf::zeroed(range.len()))
                }
                Opcode::Write => {
                    let mut buf = IoBuf::zeroed(range.len());
                    let fill: u8 = self.rng.gen();
                    for (i, b) in buf.iter_mut().enumerate() {
                        *b = fill.wrapping_add((i / 512) as u8).wrapping_add(i as u8 & 7);
                    }
                    self.data[range].copy_from_slice(&buf);
                    Request::write(tag, op.lba, op.blocks, buf)
                }
                Opcode::Flush => Request::flush(tag),
                Opcode::WriteZeroes => {
                    self.data[range].fill(0);
                    Request::write_zeroes(tag, op.lba, op.blocks)
                }
                Opcode::Discard => {
                    self.data[range].fill(0);
                    Request::discard(tag, op.lba, op.blocks)
                }
            };
            loop {
                match dev.submit(req) {
                    Ok(()) => break,
                    Err(rejected) => {
                        assert!(
                            matches!(rejected.error, DeviceError::QueueFull { .. }),
                            "only back-pressure may refuse a valid request: {}",
                            rejected.error
                        );
                        assert_eq!(
                            rejected.request.tag, tag,
                            "refused request comes back whole"
                        );
                        req = rejected.request;
                        dev.poll(&mut done, 1).expect("poll");
                    }
                }
            }
            outstanding.insert(tag);
            if self.rng.gen_bool(0.2) {
                dev.poll(&mut done, 0).expect("poll");
            }
        }
        while dev.in_flight() > 0 {
            dev.poll(&mut done, 1).expect("poll");
        }
        for c in done {
            assert!(
                outstanding.remove(&c.tag),
                "tag {} completed twice or was never submitted",
                c.tag
            );
            assert!(
                c.status.is_ok(),
                "tag {} ({}) failed: {:?}",
                c.tag,
                c.op,
                c.status
            );
            if let Some(want) = expected.get(&c.tag) {
                let buf = c.buf.as_ref().expect("a read hands its buffer back");
                assert!(
                    buf[..want.len()] == want[..],
                    "tag {} read wrong data",
                    c.tag
                );
            }
        }
        assert!(outstanding.is_empty(), "never completed: {outstanding:?}");
    }

    /// Reads the whole device through the blocking API and compares it with the model.
    pub fn check_image(&self, dev: &mut dyn BlockDevice) {
        let mut whole = vec![0u8; self.data.len()];
        dev.read_blocks(0, &mut whole)
            .expect("read the whole device");
        if let Some(i) = (0..whole.len()).find(|&i| whole[i] != self.data[i]) {
            panic!(
                "{}: image differs from the model at byte {i} (block {})",
                dev.describe(),
                i / self.block
            );
        }
    }
}
