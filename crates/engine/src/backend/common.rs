//! What backends share: the options every backend takes (`bs`, `qd`, `max_transfer`) and the
//! completion queue of backends that finish each command while it is submitted.

use crate::device::{
    Completion, Geometry, Rejected, Request, DEFAULT_MAX_TRANSFER, DEFAULT_QUEUE_DEPTH,
    MAX_QUEUE_DEPTH,
};
use crate::error::{DeviceError, DeviceResult, OpenError};
use crate::poison::FlushPoison;
use crate::spec::Spec;
use crate::split::SplitParent;
use std::collections::VecDeque;

/// Option keys understood by every backend.
pub const COMMON_OPTIONS: &[&str] = &["bs", "qd", "max_transfer"];

/// Default logical block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;

/// The queue-pair shape asked for in a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueOptions {
    pub block_size: u32,
    pub queue_depth: u32,
    pub max_transfer: u32,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            block_size: DEFAULT_BLOCK_SIZE,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            max_transfer: DEFAULT_MAX_TRANSFER,
        }
    }
}

impl QueueOptions {
    /// Reads `bs`, `qd` and `max_transfer` from `spec`, checking their ranges.
    pub fn from_spec(spec: &Spec) -> Result<Self, OpenError> {
        let d = QueueOptions::default();
        let block_size = spec.size_option("bs")?.unwrap_or(u64::from(d.block_size));
        let queue_depth = spec.num_option::<u32>("qd")?.unwrap_or(d.queue_depth);
        let max_transfer = spec
            .size_option("max_transfer")?
            .unwrap_or(u64::from(d.max_transfer));
        if !(512..=65536).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(OpenError::Invalid(format!(
                "{spec}: block size {block_size} must be a power of two from 512 to 65536"
            )));
        }
        if !(1..=MAX_QUEUE_DEPTH).contains(&queue_depth) {
            return Err(OpenError::Invalid(format!(
                "{spec}: queue depth {queue_depth} must be 1 to {MAX_QUEUE_DEPTH}"
            )));
        }
        if max_transfer < block_size || max_transfer > (64 << 20) || max_transfer % block_size != 0
        {
            return Err(OpenError::Invalid(format!(
                "{spec}: max_transfer {max_transfer} must be a multiple of the block size ({block_size}) and at most 64M"
            )));
        }
        Ok(QueueOptions {
            block_size: block_size as u32,
            queue_depth,
            max_transfer: max_transfer as u32,
        })
    }

    /// The geometry of a device of `capacity_bytes` with these options.
    pub fn geometry(&self, capacity_bytes: u64, buffer_alignment: u32) -> Geometry {
        Geometry {
            block_size: self.block_size,
            num_blocks: capacity_bytes / u64::from(self.block_size),
            max_transfer: self.max_transfer,
            queue_depth: self.queue_depth,
            buffer_alignment,
        }
    }
}

/// A free parent slot for `req` from `free`, the request wrapped as the parent of its pieces, and
/// how many pieces it splits into under `geo`; or `req` refused with `QueueFull` when no slot is
/// free. The first step of `submit` in the backends that split a request into pieces and keep
/// each parent in a slot until its last piece completes (io_uring, redirect).
pub(crate) fn claim_parent(
    free: &mut Vec<u32>,
    req: Request,
    geo: &Geometry,
) -> Result<(u32, SplitParent, u32), Rejected> {
    let Some(slot) = free.pop() else {
        return Err(Rejected::new(
            req,
            DeviceError::QueueFull {
                depth: geo.queue_depth,
            },
        ));
    };
    let pieces = crate::split::piece_count(&req, geo);
    Ok((slot, SplitParent::new(req, pieces as usize), pieces))
}

/// The other end of [`claim_parent`], once the last piece of a parent has finished: its
/// completion goes to `out` (its status observed by `poison` for flush failures) and its `slot`
/// back to `free`. `parent` is what the slot held.
pub(crate) fn release_parent(
    parent: Option<SplitParent>,
    slot: u32,
    free: &mut Vec<u32>,
    poison: &mut FlushPoison,
    out: &mut Vec<Completion>,
) {
    if let Some(parent) = parent {
        let c = parent.into_completion();
        poison.observe(c.op, &c.status);
        out.push(c);
    }
    free.push(slot);
}

/// Moves the finished commands `done` yields (a device's queue of completions, drained) to `out`
/// and counts them off `in_flight`, the device's count of commands accepted and not yet polled:
/// the step every `poll` loop that keeps such a queue takes. Returns how many moved.
pub fn hand_over(
    done: impl ExactSizeIterator<Item = Completion>,
    out: &mut Vec<Completion>,
    in_flight: &mut usize,
) -> usize {
    let n = done.len();
    out.extend(done);
    *in_flight = in_flight.saturating_sub(n);
    n
}

/// The queue of a backend that performs each command inside `submit` (RAM disk, null device,
/// plain system calls, the fault injector): admission, flush poisoning and the completions
/// waiting for `poll`.
#[derive(Debug, Default)]
pub struct CompletedQueue {
    done: VecDeque<Completion>,
    poison: FlushPoison,
}

impl CompletedQueue {
    /// The queue of a device opened read-only: changes are refused at submission.
    pub fn read_only() -> Self {
        CompletedQueue {
            done: VecDeque::new(),
            poison: FlushPoison::read_only(),
        }
    }

    /// The queue of another queue pair of the same device: nothing waiting, the flush poison
    /// shared ([`FlushPoison::sibling`]).
    pub fn sibling(&self) -> Self {
        CompletedQueue {
            done: VecDeque::new(),
            poison: self.poison.sibling(),
        }
    }

    /// Admits `req` and runs it with `execute` unless a failed flush forbids it; the outcome waits
    /// for `poll`.
    pub fn submit(
        &mut self,
        geo: &Geometry,
        req: Request,
        execute: impl FnOnce(&mut Request) -> DeviceResult<()>,
    ) -> Result<(), Rejected> {
        let mut req = req.admit(geo, self.done.len())?;
        let status = self.poison.check(req.op).and_then(|()| execute(&mut req));
        self.poison.observe(req.op, &status);
        self.done.push_back(Completion::of(req, status));
        Ok(())
    }

    /// Moves every waiting completion to `out`.
    pub fn drain(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }

    /// Commands accepted and not yet polled.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }
}

/// The [`BlockDevice`](crate::BlockDevice) methods of a backend built on a [`CompletedQueue`],
/// which every such backend would otherwise write out the same way: there is nothing to ring
/// (each command ran in `submit`), `poll` hands over every waiting completion, and what waits is
/// what is in flight. Goes inside the `impl BlockDevice` block, naming the queue field:
/// `completed_queue_methods!(queue);`. With a second name, `completed_queue_methods!(queue,
/// execute);`, it writes `submit` too, running each command with the device's
/// `fn execute(&mut self, req: &mut Request) -> DeviceResult<()>` (or `&self`).
#[macro_export]
macro_rules! completed_queue_methods {
    ($queue:ident, $execute:ident) => {
        fn submit(&mut self, req: $crate::Request) -> Result<(), $crate::Rejected> {
            // The queue is taken out for the call so that `execute` may borrow the device.
            let mut queue = std::mem::take(&mut self.$queue);
            let geo = self.geometry();
            let result = queue.submit(&geo, req, |r| self.$execute(r));
            self.$queue = queue;
            result
        }

        $crate::completed_queue_methods!($queue);
    };
    ($queue:ident) => {
        fn ring_doorbell(&mut self) -> $crate::DeviceResult<()> {
            Ok(())
        }

        fn poll(
            &mut self,
            out: &mut Vec<$crate::Completion>,
            _min_complete: usize,
        ) -> $crate::DeviceResult<usize> {
            Ok(self.$queue.drain(out))
        }

        fn in_flight(&self) -> usize {
            self.$queue.len()
        }
    };
}
