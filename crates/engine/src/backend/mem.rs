//! `mem:SIZE` — a RAM disk, and `null:SIZE` — a device that completes every command at once and
//! reads back zeroes.
//!
//! The RAM disk is the embedded default for tests; queue pairs opened with [`MemDevice::new_queue`]
//! share its storage, so a test can "remount" by dropping one queue and opening another. With
//! `shuffle=SEED`, each poll returns its completions in a seeded random order, so upper layers are
//! tested against out-of-order completion. The null device stores nothing (reads fill zeroes) and exists to measure
//! what the interface itself costs per command.

use super::common::{CompletedQueue, QueueOptions, COMMON_OPTIONS};
use crate::device::{BlockDevice, Completion, Geometry, Opcode, Rejected, Request};
use crate::error::{DeviceError, DeviceResult, OpenError};
use crate::spec::{parse_size, Spec};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::sync::{Arc, Mutex};

/// Storage shared by every queue pair of one RAM disk.
pub type MemStorage = Arc<Mutex<Vec<u8>>>;

/// A RAM disk queue pair.
pub struct MemDevice {
    storage: MemStorage,
    geo: Geometry,
    queue: CompletedQueue,
    shuffle: Option<SmallRng>,
}

impl MemDevice {
    /// A zeroed RAM disk of `capacity` bytes (rounded down to whole blocks).
    ///
    /// # Panics
    /// When the memory cannot be had; [`open_mem`] reports that as an error instead.
    pub fn new(capacity: u64, opts: QueueOptions) -> Self {
        match Self::try_new(capacity, opts) {
            Ok(dev) => dev,
            Err(e) => panic!("{e}"),
        }
    }

    /// A zeroed RAM disk, or an error when the memory cannot be reserved.
    pub fn try_new(capacity: u64, opts: QueueOptions) -> Result<Self, OpenError> {
        let geo = opts.geometry(capacity, 1);
        let bytes = usize::try_from(geo.capacity_bytes()).map_err(|_| {
            OpenError::Invalid(format!(
                "a RAM disk of {capacity} bytes does not fit in memory"
            ))
        })?;
        if bytes == 0 {
            return Err(OpenError::Invalid(format!(
                "a RAM disk of {capacity} bytes holds no whole block"
            )));
        }
        let layout = std::alloc::Layout::array::<u8>(bytes)
            .map_err(|_| OpenError::Invalid(format!("a RAM disk of {bytes} bytes is too large")))?;
        // SAFETY: the layout has non-zero size. alloc_zeroed maps fresh zero pages lazily, so a
        // large RAM disk costs memory only as it is written.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        if raw.is_null() {
            return Err(OpenError::Invalid(format!(
                "cannot reserve {bytes} bytes of memory for a RAM disk"
            )));
        }
        // SAFETY: `raw` was allocated by the global allocator with the layout of [u8; bytes], and
        // all `bytes` bytes are initialised (zeroed), so it is a valid Vec of that length and capacity.
        let storage = unsafe { Vec::from_raw_parts(raw, bytes, bytes) };
        Ok(Self::with_storage(Arc::new(Mutex::new(storage)), opts))
    }

    /// A queue pair over existing storage.
    pub fn with_storage(storage: MemStorage, opts: QueueOptions) -> Self {
        let len = storage.lock().map_or(0, |s| s.len()) as u64;
        MemDevice {
            geo: opts.geometry(len, 1),
            storage,
            queue: CompletedQueue::default(),
            shuffle: None,
        }
    }

    /// Completions come back in a random order drawn from `seed`.
    pub fn shuffled(mut self, seed: u64) -> Self {
        self.shuffle = Some(SmallRng::seed_from_u64(seed));
        self
    }

    /// Another queue pair on the same storage, with fresh queue state (what
    /// [`BlockDevice::new_queue`] returns, boxed).
    pub fn new_queue(&self) -> MemDevice {
        MemDevice {
            storage: Arc::clone(&self.storage),
            geo: self.geo,
            queue: self.queue.sibling(),
            shuffle: None,
        }
    }

    /// The storage, to inspect or to build another device over.
    pub fn storage(&self) -> MemStorage {
        Arc::clone(&self.storage)
    }

    fn execute(storage: &MemStorage, geo: &Geometry, req: &mut Request) -> DeviceResult<()> {
        let bs = geo.block_size as usize;
        let start = req.lba as usize * bs;
        let len = req.blocks as usize * bs;
        let mut disk = storage.lock().map_err(|_| DeviceError::Offline {
            reason: "RAM disk lock poisoned".into(),
        })?;
        match req.op {
            Opcode::Read => {
                if let Some(buf) = req.buf.as_mut() {
                    buf[..len].copy_from_slice(&disk[start..start + len]);
                }
            }
            Opcode::Write => {
                if let Some(buf) = req.buf.as_ref() {
                    disk[start..start + len].copy_from_slice(&buf[..len]);
                }
            }
            Opcode::WriteZeroes | Opcode::Discard => disk[start..start + len].fill(0),
            Opcode::Flush => {}
        }
        Ok(())
    }
}

impl BlockDevice for MemDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn stats(&self, out: &mut Vec<crate::DriveStats>) {
        out.push(crate::DriveStats::new("mem"));
    }

    fn describe(&self) -> String {
        format!("mem:{}", self.geo.capacity_bytes())
    }

    fn new_queue(&self) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
        Some(Ok(Box::new(MemDevice::new_queue(self))))
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let (storage, geo) = (&self.storage, &self.geo);
        self.queue
            .submit(geo, req, |r| Self::execute(storage, geo, r))
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, _min_complete: usize) -> DeviceResult<usize> {
        let start = out.len();
        let n = self.queue.drain(out);
        if let Some(rng) = self.shuffle.as_mut() {
            out[start..].shuffle(rng);
        }
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

/// A device that completes every valid command immediately and stores nothing.
pub struct NullDevice {
    geo: Geometry,
    queue: CompletedQueue,
}

impl NullDevice {
    pub fn new(capacity: u64, opts: QueueOptions) -> Self {
        NullDevice {
            geo: opts.geometry(capacity, 1),
            queue: CompletedQueue::default(),
        }
    }
}

impl BlockDevice for NullDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn stats(&self, out: &mut Vec<crate::DriveStats>) {
        out.push(crate::DriveStats::new("null"));
    }

    fn describe(&self) -> String {
        format!("null:{}", self.geo.capacity_bytes())
    }

    fn new_queue(&self) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
        Some(Ok(Box::new(NullDevice {
            geo: self.geo,
            queue: self.queue.sibling(),
        })))
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let bs = self.geo.block_size as usize;
        self.queue.submit(&self.geo, req, |r| {
            // Nothing is stored, so a read returns zeroes: leaving the buffer untouched would hand
            // the reader whatever an earlier request left in a reused pool buffer.
            if r.op == Opcode::Read {
                let len = r.blocks as usize * bs;
                if let Some(buf) = r.buf.as_mut() {
                    buf[..len].fill(0);
                }
            }
            Ok(())
        })
    }

    crate::completed_queue_methods!(queue);
}

fn capacity_of(spec: &Spec) -> Result<u64, OpenError> {
    let target = spec.require_target()?;
    let bytes =
        parse_size(target).map_err(|m| crate::spec::SpecError::new(&spec.to_string(), m))?;
    if bytes == 0 {
        return Err(OpenError::Invalid(format!(
            "{spec}: size must be larger than zero"
        )));
    }
    Ok(bytes)
}

/// Opens `mem:SIZE[?shuffle=SEED]`.
pub fn open_mem(spec: &Spec) -> Result<MemDevice, OpenError> {
    let mut allowed = COMMON_OPTIONS.to_vec();
    allowed.push("shuffle");
    spec.check_options(&allowed)?;
    let opts = QueueOptions::from_spec(spec)?;
    let capacity = capacity_of(spec)?;
    if capacity < u64::from(opts.block_size) {
        return Err(OpenError::Invalid(format!(
            "{spec}: smaller than one {}-byte block",
            opts.block_size
        )));
    }
    let dev = MemDevice::try_new(capacity, opts)?;
    Ok(match spec.num_option::<u64>("shuffle")? {
        Some(seed) => dev.shuffled(seed),
        None => dev,
    })
}

/// Opens `null:SIZE`.
pub fn open_null(spec: &Spec) -> Result<NullDevice, OpenError> {
    spec.check_options(COMMON_OPTIONS)?;
    let opts = QueueOptions::from_spec(spec)?;
    Ok(NullDevice::new(capacity_of(spec)?, opts))
}
