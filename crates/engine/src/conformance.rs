//! The device-interface contract as runnable checks, so that "passes on `uring`" and "passes on
//! `nvme`" name the same tests: the engine's tests run them on every backend, the NVMe crate on
//! its simulated controller, and the QEMU guest on `nvme:`, `nvme-pt:` and `uring:` over the
//! emulated controller. Each check works inside a region of the device, leaves nothing in flight,
//! and returns a one-line summary or what went wrong.
//!
//! - [`model`]: seeded random batches of reads, writes, flushes, write-zeroes and discards of all
//!   sizes (one block up to three commands' worth, so splitting and, on NVMe, PRP lists occur),
//!   from pool and heap buffers, compared against a flat buffer, then the region read back. As in
//!   the engine's property test, mutations within one batch never overlap another request of the
//!   batch (no order is promised among commands in flight); batches drain in between.
//! - [`refuses_invalid_requests`]: zero length, out of range, LBA overflow, short or missing
//!   buffers come back whole with a typed reason, and nothing is queued.
//! - [`splits_above_max_transfer`]: a request larger than the device's largest command completes
//!   once, with every byte in place.
//! - [`fills_the_queue`]: the queue takes exactly its depth, refuses one more with `QueueFull`,
//!   and completes each request once with the right data.
//! - [`reads_overwrite_stale_bytes`]: a read of zeroed or discarded blocks into a buffer still
//!   holding another request's bytes returns only zeroes (pool buffers are reused without clearing, so a backend
//!   that skips part of a read would leak one client's data to another).

use crate::{BlockDevice, BlockingIo, Completion, DeviceError, IoBuf, Opcode, Request};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

/// A check's summary line, or what broke.
pub type Outcome = Result<String, String>;

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

/// Runs `batches` random batches on the blocks of `dev` from `base` that `model` covers (whose
/// contents must equal `model` on entry) and checks every result. `model` is updated.
pub fn model(
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
                    // The buffer holds foreign bytes, as a reused pool buffer does: a backend that
                    // leaves part of it untouched fails the comparison.
                    let mut b = buf();
                    b.fill(0xa5);
                    Request::read(tag, dev_lba, op.blocks, b)
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

/// [`model`] over `blocks` blocks from `base`, starting from what is there, once per seed.
pub fn model_region(
    dev: &mut dyn BlockDevice,
    base: u64,
    blocks: u64,
    seeds: std::ops::Range<u64>,
    batches: usize,
) -> Outcome {
    let bs = dev.geometry().block_size as usize;
    let mut image = vec![0u8; blocks as usize * bs];
    dev.read_blocks(base, &mut image)
        .map_err(|e| format!("reading the region first: {e}"))?;
    let mut total = ModelReport::default();
    for seed in seeds {
        let r = model(dev, seed, batches, base, &mut image)?;
        total.requests += r.requests;
        total.bytes += r.bytes;
        total.largest_request_blocks = total.largest_request_blocks.max(r.largest_request_blocks);
    }
    Ok(format!(
        "{} requests, {} bytes, largest {} blocks",
        total.requests, total.bytes, total.largest_request_blocks
    ))
}

/// Submits a request that must be refused, and returns the reason once the request came back.
/// One that was accepted is waited for, so nothing stays in flight.
fn refused(dev: &mut dyn BlockDevice, req: Request, what: &str) -> Result<DeviceError, String> {
    let tag = req.tag;
    match dev.submit(req) {
        Ok(()) => {
            let _ = drain(dev);
            Err(format!("{what}: accepted"))
        }
        Err(r) if r.request.tag != tag => Err(format!("{what}: another request came back")),
        Err(r) => Ok(r.error),
    }
}

/// Invalid requests come back whole with the reason, before anything is queued.
pub fn refuses_invalid_requests(dev: &mut dyn BlockDevice) -> Outcome {
    let geo = dev.geometry();
    let (blocks, bs) = (geo.num_blocks, geo.block_size as usize);
    let mut reasons = Vec::new();
    let mut expect = |dev: &mut dyn BlockDevice,
                      req: Request,
                      what: &str,
                      ok: &dyn Fn(&DeviceError) -> bool|
     -> Result<(), String> {
        let e = refused(dev, req, what)?;
        if !ok(&e) {
            return Err(format!("{what}: refused for the wrong reason: {e}"));
        }
        reasons.push(what.to_string());
        Ok(())
    };
    expect(
        dev,
        Request::read(1, 0, 0, IoBuf::zeroed(bs)),
        "zero length",
        &|e| matches!(e, DeviceError::ZeroLength { .. }),
    )?;
    expect(
        dev,
        Request::write(2, blocks, 1, IoBuf::zeroed(bs)),
        "write past the end",
        &|e| matches!(e, DeviceError::OutOfRange { lba, .. } if *lba == blocks),
    )?;
    expect(
        dev,
        Request::read(3, blocks - 1, 2, IoBuf::zeroed(2 * bs)),
        "read across the end",
        &|e| matches!(e, DeviceError::OutOfRange { .. }),
    )?;
    expect(
        dev,
        Request::discard(4, u64::MAX, 2),
        "LBA overflow",
        &|e| matches!(e, DeviceError::OutOfRange { .. }),
    )?;
    let need = 2 * bs as u64;
    expect(
        dev,
        Request::read(5, 0, 2, IoBuf::zeroed(bs)),
        "short buffer",
        &|e| matches!(e, DeviceError::BadBuffer { need: n, .. } if *n == need),
    )?;
    let no_buffer = Request {
        tag: 6,
        op: Opcode::Write,
        lba: 0,
        blocks: 1,
        buf: None,
    };
    expect(dev, no_buffer, "missing buffer", &|e| {
        matches!(e, DeviceError::BadBuffer { have: 0, .. })
    })?;
    if dev.in_flight() != 0 {
        return Err(format!("{} refused requests were queued", dev.in_flight()));
    }
    Ok(reasons.join(", "))
}

/// A pattern that differs per block and per call.
fn pattern(len: usize, bs: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i / bs) as u8 ^ (i as u8).wrapping_mul(7) ^ salt)
        .collect()
}

/// Drains the queue and returns every completion.
fn drain(dev: &mut dyn BlockDevice) -> Result<Vec<Completion>, String> {
    let mut done = Vec::new();
    while dev.in_flight() > 0 {
        dev.poll(&mut done, 1).map_err(|e| e.to_string())?;
    }
    Ok(done)
}

/// A write and a read larger than the largest command, within `blocks` blocks from `base`,
/// each complete once with the data in place.
pub fn splits_above_max_transfer(dev: &mut dyn BlockDevice, base: u64, blocks: u64) -> Outcome {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let max = u64::from(geo.max_transfer_blocks());
    let len = (max * 2 + 1).min(blocks);
    if len <= max {
        return Ok(format!(
            "nothing to split: the region ({blocks} blocks) fits one command ({max} blocks)"
        ));
    }
    let data = pattern(len as usize * bs, bs, 0xa5);
    let mut buf = IoBuf::zeroed(data.len());
    buf.copy_from_slice(&data);
    let submit = |dev: &mut dyn BlockDevice, req: Request| {
        dev.submit(req).map_err(|r| format!("refused: {}", r.error))
    };
    submit(dev, Request::write(11, base, len, buf))?;
    let done = drain(dev)?;
    if done.len() != 1 || done[0].tag != 11 {
        return Err(format!("the write completed {} times", done.len()));
    }
    done[0]
        .status
        .clone()
        .map_err(|e| format!("the write failed: {e}"))?;
    submit(dev, Request::read(12, base, len, IoBuf::zeroed(data.len())))?;
    let done = drain(dev)?;
    if done.len() != 1 || done[0].tag != 12 {
        return Err(format!("the read completed {} times", done.len()));
    }
    let c = &done[0];
    c.status
        .clone()
        .map_err(|e| format!("the read failed: {e}"))?;
    let back = c.buf.as_ref().ok_or("the read lost its buffer")?;
    if back[..data.len()] != data[..] {
        return Err("the read returned other data than was written".into());
    }
    Ok(format!(
        "{len} blocks against a {max}-block largest command, one completion each"
    ))
}

/// Fills the queue to its depth with reads of known blocks within `blocks` blocks from `base`,
/// checks that one more is refused with `QueueFull`, and that each read completes once with its
/// block's data.
pub fn fills_the_queue(dev: &mut dyn BlockDevice, base: u64, blocks: u64) -> Outcome {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let depth = u64::from(geo.queue_depth);
    let span = blocks.min(depth * 2).max(1);
    let data = pattern(span as usize * bs, bs, 0x3c);
    dev.write_blocks(base, &data).map_err(|e| e.to_string())?;
    let lba_of = |tag: u64| (tag * 13) % span;
    for tag in 0..depth {
        let req = Request::read(tag, base + lba_of(tag), 1, IoBuf::zeroed(bs));
        dev.submit(req)
            .map_err(|r| format!("read {tag} of {depth} refused: {}", r.error))?;
    }
    if dev.in_flight() != depth as usize {
        return Err(format!("{} in flight, not {depth}", dev.in_flight()));
    }
    match refused(
        dev,
        Request::read(u64::MAX, base, 1, IoBuf::zeroed(bs)),
        "one past the depth",
    ) {
        Ok(DeviceError::QueueFull { .. }) => {}
        Ok(e) => {
            let _ = drain(dev);
            return Err(format!(
                "one past the depth refused for another reason: {e}"
            ));
        }
        Err(e) => return Err(e),
    }
    let done = drain(dev)?;
    let tags: HashSet<u64> = done.iter().map(|c| c.tag).collect();
    if done.len() != depth as usize || tags.len() != depth as usize {
        return Err(format!(
            "{} completions with {} distinct tags for {depth} reads",
            done.len(),
            tags.len()
        ));
    }
    for c in done {
        c.status
            .clone()
            .map_err(|e| format!("read {} failed: {e}", c.tag))?;
        let at = lba_of(c.tag) as usize * bs;
        let got = c.buf.as_ref().ok_or("a read lost its buffer")?;
        if got[..bs] != data[at..at + bs] {
            return Err(format!("read {} returned another block's data", c.tag));
        }
    }
    Ok(format!(
        "{depth} in flight, one more refused, each completed once"
    ))
}

/// Zeroes, then discards, up to 8 blocks from `base` and reads each state back into buffers full
/// of a foreign pattern: every byte must be a zero from the device. (Reads of written data over
/// stale buffers are part of [`model`].)
pub fn reads_overwrite_stale_bytes(dev: &mut dyn BlockDevice, base: u64, blocks: u64) -> Outcome {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let len = blocks.min(8);
    if len == 0 {
        return Err("no blocks to check".into());
    }
    let bytes = len as usize * bs;
    let stale = |salt: u8| {
        let mut b = IoBuf::zeroed(bytes);
        b.copy_from_slice(&pattern(bytes, bs, salt));
        b
    };
    let run = |dev: &mut dyn BlockDevice, req: Request| -> Result<Completion, String> {
        let tag = req.tag;
        dev.submit(req)
            .map_err(|r| format!("refused: {}", r.error))?;
        let mut done = drain(dev)?;
        match (done.pop(), done.is_empty()) {
            (Some(c), true) if c.tag == tag => {
                c.status
                    .clone()
                    .map_err(|e| format!("{} failed: {e}", c.op))?;
                Ok(c)
            }
            _ => Err("a request did not complete exactly once".into()),
        }
    };
    run(dev, Request::write_zeroes(21, base, len))?;
    let c = run(dev, Request::read(22, base, len, stale(0x3c)))?;
    let back = c.buf.as_ref().ok_or("the read lost its buffer")?;
    if let Some(i) = back[..bytes].iter().position(|&b| b != 0) {
        return Err(format!(
            "a read of zeroed blocks returned the buffer's old byte {:#04x} at offset {i}",
            back[i]
        ));
    }
    run(dev, Request::discard(23, base, len))?;
    let c = run(dev, Request::read(24, base, len, stale(0xc3)))?;
    let back = c.buf.as_ref().ok_or("the read lost its buffer")?;
    if let Some(i) = back[..bytes].iter().position(|&b| b != 0) {
        return Err(format!(
            "a read of discarded blocks returned the buffer's old byte {:#04x} at offset {i}",
            back[i]
        ));
    }
    Ok(format!(
        "{len} zeroed and discarded blocks read as zeroes over stale buffers"
    ))
}

/// Every check, in order, on `blocks` blocks from `base` (which it overwrites).
pub fn suite(
    dev: &mut dyn BlockDevice,
    base: u64,
    blocks: u64,
    seed: u64,
) -> Vec<(&'static str, Outcome)> {
    vec![
        ("refuses invalid requests", refuses_invalid_requests(dev)),
        ("model", model_region(dev, base, blocks, seed..seed + 3, 6)),
        (
            "splits above max transfer",
            splits_above_max_transfer(dev, base, blocks),
        ),
        ("fills the queue", fills_the_queue(dev, base, blocks)),
        (
            "reads overwrite stale bytes",
            reads_overwrite_stale_bytes(dev, base, blocks),
        ),
    ]
}
