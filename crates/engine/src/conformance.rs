//! The device-interface model check shared by the host tests (against the simulated controller)
//! and the guest test binary (against QEMU's controller): seeded random batches of reads,
//! writes, flushes, write-zeroes and discards of all sizes — one block up to several commands'
//! worth, so single pages, PRP2, PRP lists and splitting all occur — from pool and heap buffers,
//! compared against a flat `Vec<u8>`, then the whole image read back.
//!
//! As in the engine's model test, mutations within one batch never overlap another request of
//! the batch (no order is promised among commands in flight); batches drain in between.

use kura_engine::{BlockDevice, BlockingIo, Completion, DeviceError, IoBuf, Opcode, Request};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// What one run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ModelReport {
    pub requests: u64,
    pub bytes: u64,
    pub largest_request_blocks: u64,
}

struct Op {
    op: Opcode,
    lba: u64,
    blocks: u64,
}

fn overlaps(a: &Op, b: &Op) -> bool {
    a.op != Opcode::Flush
        && b.op != Opcode::Flush
        && a.lba < b.lba + b.blocks
        && b.lba < a.lba + a.blocks
}

/// Runs `batches` random batches on the first `blocks` blocks of `dev` starting at `base`
/// (whose contents must equal `model` on entry) and checks every result. `model` is updated.
pub fn run(
    dev: &mut dyn BlockDevice,
    seed: u64,
    batches: usize,
    base: u64,
    model: &mut [u8],
) -> Result<ModelReport, String> {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let blocks = (model.len() / bs) as u64;
    if blocks == 0 || base + blocks > geo.num_blocks {
        return Err(format!(
            "model of {blocks} blocks at {base} does not fit the device"
        ));
    }
    let max_req = (u64::from(geo.max_transfer_blocks()) * 3 + 1).min(blocks);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut report = ModelReport::default();
    let mut tag = 0u64;
    for _ in 0..batches {
        let mut batch: Vec<Op> = Vec::new();
        for _ in 0..rng.gen_range(1..24) {
            let op = match rng.gen_range(0..11) {
                0..=3 => Opcode::Read,
                4..=7 => Opcode::Write,
                8 => Opcode::Flush,
                9 => Opcode::WriteZeroes,
                _ => Opcode::Discard,
            };
            let len = if rng.gen_bool(0.5) {
                rng.gen_range(1..=4.min(max_req))
            } else {
                rng.gen_range(1..=max_req)
            };
            let lba = rng.gen_range(0..=blocks - len);
            let cand = Op {
                op,
                lba,
                blocks: len,
            };
            let conflict = batch
                .iter()
                .any(|k| overlaps(k, &cand) && (k.op.is_mutation() || cand.op.is_mutation()));
            if !conflict {
                batch.push(cand);
            }
        }
        let mut expected: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut done: Vec<Completion> = Vec::new();
        for op in &batch {
            tag += 1;
            let range = op.lba as usize * bs..(op.lba + op.blocks) as usize * bs;
            let mut buf = || {
                if rng.gen_bool(0.3) {
                    IoBuf::heap(range.len(), 4096)
                } else {
                    IoBuf::zeroed(range.len())
                }
            };
            let dev_lba = base + op.lba;
            let req = match op.op {
                Opcode::Read => {
                    expected.insert(tag, model[range.clone()].to_vec());
                    Request::read(tag, dev_lba, op.blocks, buf())
                }
                Opcode::Write => {
                    let mut b = buf();
                    let fill = (tag as u8).wrapping_mul(31);
                    for (i, x) in b.iter_mut().enumerate() {
                        *x = fill.wrapping_add((i / 512) as u8).wrapping_add(i as u8);
                    }
                    model[range].copy_from_slice(&b);
                    Request::write(tag, dev_lba, op.blocks, b)
                }
                Opcode::Flush => Request::flush(tag),
                Opcode::WriteZeroes => {
                    model[range].fill(0);
                    Request::write_zeroes(tag, dev_lba, op.blocks)
                }
                Opcode::Discard => {
                    model[range].fill(0);
                    Request::discard(tag, dev_lba, op.blocks)
                }
            };
            report.requests += 1;
            report.bytes += req.data_bytes(&geo);
            report.largest_request_blocks = report.largest_request_blocks.max(op.blocks);
            let mut req = req;
            loop {
                match dev.submit(req) {
                    Ok(()) => break,
                    Err(r) if matches!(r.error, DeviceError::QueueFull { .. }) => {
                        req = r.request;
                        dev.poll(&mut done, 1).map_err(|e| e.to_string())?;
                    }
                    Err(r) => return Err(format!("tag {tag}: valid request refused: {}", r.error)),
                }
            }
        }
        while dev.in_flight() > 0 {
            dev.poll(&mut done, 1).map_err(|e| e.to_string())?;
        }
        if done.len() != batch.len() {
            return Err(format!(
                "{} completions for {} requests",
                done.len(),
                batch.len()
            ));
        }
        for c in done {
            c.status
                .as_ref()
                .map_err(|e| format!("tag {} ({}) failed: {e}", c.tag, c.op))?;
            if let Some(want) = expected.remove(&c.tag) {
                let got = c.buf.as_ref().ok_or("read lost its buffer")?;
                if got[..want.len()] != want[..] {
                    return Err(format!("tag {} read wrong data", c.tag));
                }
            }
        }
        if !expected.is_empty() {
            return Err("some reads never completed".into());
        }
    }
    let mut whole = vec![0u8; model.len()];
    dev.read_blocks(base, &mut whole)
        .map_err(|e| e.to_string())?;
    if whole != model {
        let first = whole
            .iter()
            .zip(model.iter())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        return Err(format!(
            "final image differs from the model at byte {first}"
        ));
    }
    Ok(report)
}
