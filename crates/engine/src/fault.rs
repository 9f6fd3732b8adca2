//! `fault(INNER)` — a device that wraps any other and misbehaves on purpose, for crash and
//! error-path tests of every layer above.
//!
//! It models what a real drive may do and nothing it may not:
//! - **Injected errors**: the Nth read, write or flush completes with EIO (`read_eio=N`,
//!   `write_eio=N`, `flush_eio=N`; counting from 1). A failed flush poisons the device as the
//!   engine contract requires.
//! - **A volatile write cache**: writes, write-zeroes and discards are acknowledged at once but kept
//!   in memory until a flush makes them durable on the inner device, in submission order.
//! - **Power cut** (`cut_after=N` writes, or [`FaultControl::power_cut`]): every unflushed write is
//!   kept or lost *block by block* with probability `keep` (seeded), so a multi-block write can be
//!   torn and an earlier write can survive a later one to the same block; the device then goes
//!   offline. Whatever survived is on the inner device, which the test reopens as "after reboot".
//! - **Recording** (`record=1`): every write and flush in order, so a crash harness can rebuild the
//!   image at any cut point with [`materialize`] without re-running the workload.

use crate::backend::common::CompletedQueue;
use crate::blocking::BlockingIo;
use crate::device::{BlockDevice, Geometry, Opcode, Request};
use crate::error::{DeviceError, DeviceResult, Errno, OpenError};
use crate::spec::Spec;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Unflushed data held before the cache writes the oldest back on its own (drives do the same).
const MAX_UNFLUSHED_BYTES: usize = 256 << 20;

/// What to inject and when.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    pub read_eio: Option<u64>,
    pub write_eio: Option<u64>,
    pub flush_eio: Option<u64>,
    /// Power-cut when the Nth write (counting write-zeroes and discards) is submitted; that write
    /// is part of the unflushed set and may survive, tear or vanish.
    pub cut_after_writes: Option<u64>,
    /// Probability that an unflushed block survives a power cut.
    pub keep_probability: f64,
    pub seed: u64,
    /// Keep a trace of every write and flush.
    pub record: bool,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            read_eio: None,
            write_eio: None,
            flush_eio: None,
            cut_after_writes: None,
            keep_probability: 0.5,
            seed: 0,
            record: false,
        }
    }
}

/// One entry of a recorded write stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceEvent {
    /// Data written at an LBA (write-zeroes and discards are recorded as zero data).
    Write { lba: u64, data: Arc<Vec<u8>> },
    /// A flush that completed successfully: everything before it is durable.
    Flush,
}

/// Counts of what the device saw and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub injected_errors: u64,
    pub blocks_lost_at_cut: u64,
    pub blocks_kept_at_cut: u64,
}

#[derive(Debug, Default)]
struct Shared {
    cut_requested: bool,
    offline: bool,
    trace: Vec<TraceEvent>,
    stats: FaultStats,
}

/// A handle kept by the test to cut power, read the trace and the stats while the device itself
/// is owned by the layer under test.
#[derive(Debug, Clone, Default)]
pub struct FaultControl {
    shared: Arc<Mutex<Shared>>,
}

impl FaultControl {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts power: takes effect at the device's next call or when it is dropped.
    pub fn power_cut(&self) {
        self.lock().cut_requested = true;
    }

    /// True once the cut has been carried out.
    pub fn is_offline(&self) -> bool {
        self.lock().offline
    }

    /// The recorded writes and flushes so far (empty unless recording).
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.lock().trace.clone()
    }

    pub fn stats(&self) -> FaultStats {
        self.lock().stats
    }
}

struct PendingWrite {
    lba: u64,
    data: Arc<Vec<u8>>,
}

/// The fault-injecting wrapper.
pub struct FaultDevice {
    inner: Box<dyn BlockDevice>,
    geo: Geometry,
    plan: FaultPlan,
    control: FaultControl,
    rng: SmallRng,
    /// Unflushed writes in submission order, and the newest unflushed data of each block.
    pending: Vec<PendingWrite>,
    overlay: BTreeMap<u64, (usize, usize)>,
    pending_bytes: usize,
    queue: CompletedQueue,
    counts: [u64; 3],
}

impl FaultDevice {
    /// Wraps `inner`, which must be idle and is driven through its blocking API from now on.
    pub fn new(inner: Box<dyn BlockDevice>, plan: FaultPlan) -> Self {
        let geo = inner.geometry();
        FaultDevice {
            rng: SmallRng::seed_from_u64(plan.seed),
            inner,
            geo,
            plan,
            control: FaultControl::default(),
            pending: Vec::new(),
            overlay: BTreeMap::new(),
            pending_bytes: 0,
            queue: CompletedQueue::default(),
            counts: [0; 3],
        }
    }

    /// The handle for cutting power and reading the trace.
    pub fn control(&self) -> FaultControl {
        self.control.clone()
    }

    fn eio(op: Opcode, lba: u64) -> DeviceError {
        DeviceError::Io {
            op,
            lba,
            errno: Errno(libc::EIO),
        }
    }

    /// Counts one command of a class and says whether this one is to fail.
    fn strikes(&mut self, op: Opcode) -> bool {
        let (slot, plan) = match op {
            Opcode::Read => (0, self.plan.read_eio),
            Opcode::Flush => (2, self.plan.flush_eio),
            _ => (1, self.plan.write_eio),
        };
        self.counts[slot] += 1;
        plan == Some(self.counts[slot])
    }

    fn execute(&mut self, req: &mut Request) -> DeviceResult<()> {
        if self.control.lock().cut_requested {
            self.cut_power()?;
        }
        if self.control.lock().offline {
            return Err(DeviceError::Offline {
                reason: "power cut by the fault injector".into(),
            });
        }
        let strike = self.strikes(req.op);
        {
            let mut shared = self.control.lock();
            match req.op {
                Opcode::Read => shared.stats.reads += 1,
                Opcode::Flush => shared.stats.flushes += 1,
                _ => shared.stats.writes += 1,
            }
            if strike {
                shared.stats.injected_errors += 1;
            }
        }
        if strike {
            return Err(Self::eio(req.op, req.lba));
        }
        match req.op {
            Opcode::Read => self.read(req),
            Opcode::Write | Opcode::WriteZeroes | Opcode::Discard => {
                let bytes = (req.blocks * u64::from(self.geo.block_size)) as usize;
                let data = match (&req.buf, req.op) {
                    (Some(buf), Opcode::Write) => buf[..bytes].to_vec(),
                    _ => vec![0; bytes],
                };
                self.buffer_write(req.lba, data)?;
                if self.plan.cut_after_writes == Some(self.counts[1]) {
                    self.cut_power()?;
                }
                Ok(())
            }
            Opcode::Flush => self.flush(),
        }
    }

    fn read(&mut self, req: &mut Request) -> DeviceResult<()> {
        let bs = self.geo.block_size as usize;
        let Some(buf) = req.buf.take() else {
            return Err(DeviceError::BadBuffer {
                op: Opcode::Read,
                blocks: req.blocks,
                need: 0,
                have: 0,
            });
        };
        let done = self
            .inner
            .run(Request::read(req.tag, req.lba, req.blocks, buf))?;
        let mut buf = done.buf.ok_or(DeviceError::Offline {
            reason: "inner device lost a buffer".into(),
        })?;
        let status = done.status;
        for (&lba, &(write, offset)) in self.overlay.range(req.lba..req.lba + req.blocks) {
            let at = (lba - req.lba) as usize * bs;
            buf[at..at + bs].copy_from_slice(&self.pending[write].data[offset..offset + bs]);
        }
        req.buf = Some(buf);
        status
    }

    fn buffer_write(&mut self, lba: u64, data: Vec<u8>) -> DeviceResult<()> {
        let bs = self.geo.block_size as usize;
        if self.pending_bytes + data.len() > MAX_UNFLUSHED_BYTES {
            self.write_back()?;
        }
        let data = Arc::new(data);
        if self.plan.record {
            self.control.lock().trace.push(TraceEvent::Write {
                lba,
                data: Arc::clone(&data),
            });
        }
        let index = self.pending.len();
        for b in 0..data.len() / bs {
            self.overlay.insert(lba + b as u64, (index, b * bs));
        }
        self.pending_bytes += data.len();
        self.pending.push(PendingWrite { lba, data });
        Ok(())
    }

    /// Moves unflushed writes to the inner device in order (not yet durable there).
    fn write_back(&mut self) -> DeviceResult<()> {
        for w in std::mem::take(&mut self.pending) {
            self.inner.write_blocks(w.lba, &w.data)?;
        }
        self.overlay.clear();
        self.pending_bytes = 0;
        Ok(())
    }

    fn flush(&mut self) -> DeviceResult<()> {
        let result = self.write_back().and_then(|()| self.inner.flush_all());
        if result.is_ok() && self.plan.record {
            self.control.lock().trace.push(TraceEvent::Flush);
        }
        result
    }

    /// Keeps each unflushed block with the plan's probability, makes the survivors durable on the
    /// inner device, and goes offline.
    fn cut_power(&mut self) -> DeviceResult<()> {
        let bs = self.geo.block_size as usize;
        let (mut kept, mut lost) = (0, 0);
        for w in std::mem::take(&mut self.pending) {
            for (b, block) in w.data.chunks(bs).enumerate() {
                if self
                    .rng
                    .gen_bool(self.plan.keep_probability.clamp(0.0, 1.0))
                {
                    self.inner.write_blocks(w.lba + b as u64, block)?;
                    kept += 1;
                } else {
                    lost += 1;
                }
            }
        }
        self.overlay.clear();
        self.pending_bytes = 0;
        self.inner.flush_all()?;
        let mut shared = self.control.lock();
        shared.cut_requested = false;
        shared.offline = true;
        shared.stats.blocks_kept_at_cut += kept;
        shared.stats.blocks_lost_at_cut += lost;
        Ok(())
    }
}

impl BlockDevice for FaultDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        format!("fault({})", self.inner.describe())
    }

    fn stats(&self, out: &mut Vec<crate::DriveStats>) {
        let s = self.control.stats();
        out.push(
            crate::DriveStats::new("fault")
                .with("reads", s.reads)
                .with("writes", s.writes)
                .with("flushes", s.flushes)
                .with("injected_errors", s.injected_errors)
                .with("unflushed_writes", self.pending.len() as u64)
                .with("blocks_lost_at_cut", s.blocks_lost_at_cut)
                .with("blocks_kept_at_cut", s.blocks_kept_at_cut),
        );
        crate::device::child_stats(&*self.inner, out);
    }

    crate::completed_queue_methods!(queue, execute);
}

impl Drop for FaultDevice {
    fn drop(&mut self) {
        // A cut requested but not yet carried out must still decide what survived; an error here
        // has nowhere to go, and the test will see the result on the inner device.
        if self.control.lock().cut_requested {
            let _ = self.cut_power();
        }
    }
}

/// Options of the `fault(...)` wrapper.
pub const FAULT_OPTIONS: &[&str] = &[
    "read_eio",
    "write_eio",
    "flush_eio",
    "cut_after",
    "keep",
    "seed",
    "record",
];

/// Opens `fault(INNER)?read_eio=N&write_eio=N&flush_eio=N&cut_after=N&keep=P&seed=S&record=1`.
pub fn open(spec: &Spec, children: crate::open::ChildOpener<'_>) -> Result<FaultDevice, OpenError> {
    spec.check_options(FAULT_OPTIONS)?;
    let [child] = spec.children.as_slice() else {
        return Err(OpenError::Invalid(format!(
            "{spec}: fault(...) wraps exactly one device"
        )));
    };
    let keep = spec.num_option::<f64>("keep")?.unwrap_or(0.5);
    if !(0.0..=1.0).contains(&keep) {
        return Err(OpenError::Invalid(format!(
            "{spec}: keep={keep} must be a probability from 0 to 1"
        )));
    }
    let plan = FaultPlan {
        read_eio: spec.num_option("read_eio")?,
        write_eio: spec.num_option("write_eio")?,
        flush_eio: spec.num_option("flush_eio")?,
        cut_after_writes: spec.num_option("cut_after")?,
        keep_probability: keep,
        seed: spec.num_option("seed")?.unwrap_or(0),
        record: spec.bool_option("record")?.unwrap_or(false),
    };
    Ok(FaultDevice::new(children(child)?, plan))
}

/// Rebuilds the device image a crash at trace position `cut` would leave: `base` (the image
/// when recording began), then every write up to the last flush before `cut` applied in full,
/// then each block of the writes between that flush and `cut` kept with probability `keep`.
pub fn materialize(
    base: &[u8],
    trace: &[TraceEvent],
    cut: usize,
    block_size: usize,
    keep: f64,
    seed: u64,
) -> Vec<u8> {
    let mut image = base.to_vec();
    let cut = cut.min(trace.len());
    let durable = trace[..cut]
        .iter()
        .rposition(|e| *e == TraceEvent::Flush)
        .map_or(0, |i| i + 1);
    let mut rng = SmallRng::seed_from_u64(seed);
    for (i, event) in trace[..cut].iter().enumerate() {
        let TraceEvent::Write { lba, data } = event else {
            continue;
        };
        for (b, block) in data.chunks(block_size).enumerate() {
            if i < durable || rng.gen_bool(keep.clamp(0.0, 1.0)) {
                let at = (*lba as usize + b) * block_size;
                if let Some(dst) = image.get_mut(at..at + block.len()) {
                    dst.copy_from_slice(block);
                }
            }
        }
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::common::QueueOptions;
    use crate::backend::mem::MemDevice;

    fn over_mem(plan: FaultPlan) -> (FaultDevice, crate::backend::mem::MemStorage) {
        let mem = MemDevice::new(64 * 4096, QueueOptions::default());
        let storage = mem.storage();
        (FaultDevice::new(Box::new(mem), plan), storage)
    }

    fn block(v: u8) -> Vec<u8> {
        vec![v; 4096]
    }

    #[test]
    fn nth_write_fails_and_changes_nothing() {
        let (mut dev, storage) = over_mem(FaultPlan {
            write_eio: Some(2),
            ..FaultPlan::default()
        });
        dev.write_blocks(0, &block(1)).unwrap();
        let err = dev.write_blocks(1, &block(2)).unwrap_err();
        assert!(
            matches!(
                err,
                DeviceError::Io {
                    op: Opcode::Write,
                    lba: 1,
                    errno: Errno(libc::EIO)
                }
            ),
            "{err}"
        );
        dev.write_blocks(2, &block(3)).unwrap();
        dev.flush_all().unwrap();
        let disk = storage.lock().unwrap();
        assert_eq!(disk[4096], 0, "the failed write left no trace");
        assert_eq!(disk[2 * 4096], 3);
    }

    #[test]
    fn stats_report_each_layer_top_down_with_its_counters() {
        let (inner, _) = over_mem(FaultPlan::default());
        let mut dev: Box<dyn BlockDevice> = Box::new(FaultDevice::new(
            Box::new(inner),
            FaultPlan {
                write_eio: Some(2),
                ..FaultPlan::default()
            },
        ));
        dev.write_blocks(0, &block(1)).unwrap();
        assert!(dev.write_blocks(1, &block(2)).is_err());
        let mut out = block(0);
        dev.read_blocks(0, &mut out).unwrap();
        dev.flush_all().unwrap();
        let stats = crate::device::stats_of(&dev);
        let shape: Vec<(&str, usize)> = stats.iter().map(|s| (s.kind.as_str(), s.depth)).collect();
        assert_eq!(shape, [("fault", 0), ("fault", 1), ("mem", 2)]);
        let top = &stats[0];
        assert_eq!(top.counter("writes"), Some(2));
        assert_eq!(top.counter("reads"), Some(1));
        assert_eq!(top.counter("flushes"), Some(1));
        assert_eq!(top.counter("injected_errors"), Some(1));
        // Only the write that succeeded (then flushed) reached the inner fault layer.
        assert_eq!(stats[1].counter("writes"), Some(1));
        assert_eq!(stats[1].counter("injected_errors"), Some(0));
        assert_eq!(
            top.to_string(),
            "fault reads=1 writes=2 flushes=1 injected_errors=1 unflushed_writes=0 \
             blocks_lost_at_cut=0 blocks_kept_at_cut=0"
        );
    }

    #[test]
    fn nth_read_fails() {
        let (mut dev, _) = over_mem(FaultPlan {
            read_eio: Some(1),
            ..FaultPlan::default()
        });
        let mut out = block(0);
        assert!(matches!(
            dev.read_blocks(0, &mut out),
            Err(DeviceError::Io {
                op: Opcode::Read,
                ..
            })
        ));
        assert!(
            dev.read_blocks(0, &mut out).is_ok(),
            "only the first read fails"
        );
    }

    #[test]
    fn failed_flush_poisons_writes_but_not_reads() {
        let (mut dev, _) = over_mem(FaultPlan {
            flush_eio: Some(1),
            ..FaultPlan::default()
        });
        dev.write_blocks(0, &block(9)).unwrap();
        assert!(dev.flush_all().is_err());
        assert!(matches!(
            dev.write_blocks(0, &block(1)),
            Err(DeviceError::Poisoned { .. })
        ));
        assert!(
            matches!(dev.flush_all(), Err(DeviceError::Poisoned { .. })),
            "never retry a failed flush"
        );
        let mut out = block(0);
        dev.read_blocks(0, &mut out).unwrap();
        assert_eq!(out, block(9), "reads still see what was written");
    }

    #[test]
    fn unflushed_writes_are_visible_but_not_durable() {
        let (mut dev, storage) = over_mem(FaultPlan {
            keep_probability: 0.0,
            ..FaultPlan::default()
        });
        dev.write_blocks(0, &block(5)).unwrap();
        dev.flush_all().unwrap();
        dev.write_blocks(0, &block(6)).unwrap();
        let mut out = block(0);
        dev.read_blocks(0, &mut out).unwrap();
        assert_eq!(out, block(6), "reads see the write cache");
        let control = dev.control();
        control.power_cut();
        assert!(matches!(
            dev.read_blocks(0, &mut out),
            Err(DeviceError::Offline { .. })
        ));
        assert!(control.is_offline());
        assert_eq!(
            storage.lock().unwrap()[..4096],
            block(5)[..],
            "only flushed data survived"
        );
    }

    #[test]
    fn power_cut_tears_multi_block_writes_at_block_granularity() {
        let mut torn = false;
        for seed in 0..20 {
            let plan = FaultPlan {
                cut_after_writes: Some(1),
                seed,
                ..FaultPlan::default()
            };
            let (mut dev, storage) = over_mem(plan);
            let data: Vec<u8> = (0..8).flat_map(|b| vec![b as u8 + 1; 4096]).collect();
            dev.write_blocks(0, &data).unwrap();
            let disk = storage.lock().unwrap();
            let kept: Vec<bool> = (0..8).map(|b| disk[b * 4096] == b as u8 + 1).collect();
            for b in 0..8 {
                let blk = &disk[b * 4096..(b + 1) * 4096];
                assert!(
                    blk.iter().all(|&x| x == 0) || blk.iter().all(|&x| x == b as u8 + 1),
                    "a block is all old or all new"
                );
            }
            torn |= kept.iter().any(|&k| k) && kept.iter().any(|&k| !k);
        }
        assert!(torn, "some seed tore a multi-block write");
    }

    #[test]
    fn materialize_keeps_everything_before_the_last_flush() {
        let plan = FaultPlan {
            record: true,
            ..FaultPlan::default()
        };
        let (mut dev, _) = over_mem(plan);
        dev.write_blocks(0, &block(1)).unwrap();
        dev.flush_all().unwrap();
        dev.write_blocks(1, &block(2)).unwrap();
        let trace = dev.control().trace();
        assert_eq!(trace.len(), 3);
        let base = vec![0u8; 64 * 4096];
        let none = materialize(&base, &trace, 3, 4096, 0.0, 1);
        assert_eq!(none[0], 1);
        assert_eq!(none[4096], 0, "unflushed write dropped with keep=0");
        let all = materialize(&base, &trace, 3, 4096, 1.0, 1);
        assert_eq!(all[4096], 2);
        let before = materialize(&base, &trace, 1, 4096, 0.0, 1);
        assert_eq!(
            before[0], 0,
            "a cut before the flush may lose the first write"
        );
    }

    #[test]
    fn spec_options_are_checked() {
        let open = |s: &str| {
            crate::open(s)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(open("fault(mem:1M)?write_eoi=1").contains("did you mean `write_eio`"));
        assert!(open("fault(mem:1M)?keep=2").contains("probability"));
        assert!(open("fault(mem:1M,mem:1M)").contains("exactly one"));
        assert!(crate::open("fault(mem:1M)?cut_after=3&seed=7&record=1").is_ok());
    }
}
