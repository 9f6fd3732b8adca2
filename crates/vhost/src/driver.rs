//! The thread that owns an export's [`BlockDevice`] queue pair: every virtqueue's thread sends it
//! decoded requests ([`Job`]s); it keeps the device's queue full (submits up to the queue depth,
//! polls, submits more), has reads land in place in guest memory when their data is one aligned
//! descriptor ([`crate::zerocopy`]) or else copies read data into guest memory, and answers each
//! request on its virtqueue, always after the device has let go of the request's buffer.
//!
//! **In-order answers.** Requests of one virtqueue are put on the used ring in the order they were
//! taken from the available ring ([`QueueOrder`]), even when the device completes them out of
//! order. A backend that dies therefore leaves the used index exactly at the first request it
//! had not answered, and QEMU, which restarts a reconnected backend from the used index, hands
//! every unanswered request to the next backend again and no answered one (the vhost-user crates
//! offer no inflight-fd area, which would otherwise be how to track out-of-order answers).

use kura_engine::device::stats_of;
use kura_engine::{BlockDevice, BufferPool, Completion, DeviceError, DriveStats, IoBuf, Request};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use vhost_user_backend::{VringRwLock, VringT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

use crate::blk::{STATUS_IOERR, STATUS_OK};
use crate::zerocopy::{self, Counters, Lent};

/// Whether requests go to the device in place in guest memory, how many did, and which guest
/// bytes are lent out now.
#[derive(Clone)]
pub(crate) struct ZeroCopy {
    pub enabled: bool,
    pub counters: Arc<Counters>,
    pub lent: Arc<Lent>,
}

impl ZeroCopy {
    pub fn new(enabled: bool, counters: Arc<Counters>) -> ZeroCopy {
        ZeroCopy {
            enabled,
            counters,
            lent: Arc::default(),
        }
    }

    /// A buffer in place over the `len` data bytes `skip` bytes into `segs`, when enabled and
    /// the request qualifies; counts a request that qualified but overlapped a lent range.
    pub fn in_place(
        &self,
        mem: &Arc<Mem>,
        segs: &[Seg],
        skip: u64,
        len: usize,
        align: u32,
    ) -> Option<IoBuf> {
        if !self.enabled {
            return None;
        }
        match zerocopy::in_place(mem, &self.lent, segs, skip, len, align) {
            Ok(buf) => Some(buf),
            Err(zerocopy::Copy::Overlapping) => {
                Counters::count(&self.counters.overlapping);
                None
            }
            Err(zerocopy::Copy::Shape) => None,
        }
    }
}

pub(crate) type Mem = GuestMemoryMmap<()>;
pub(crate) type Vring = VringRwLock<GuestMemoryAtomic<Mem>>;

/// One guest buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seg {
    pub addr: GuestAddress,
    pub len: u32,
}

/// Copies guest bytes from `segs` (after skipping `skip` bytes) into `out`; false when the
/// segments are too short or outside guest memory.
pub(crate) fn gather(mem: &Mem, segs: &[Seg], mut skip: u64, out: &mut [u8]) -> bool {
    let mut done = 0;
    for seg in segs {
        if done == out.len() {
            break;
        }
        let len = u64::from(seg.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(out.len() - done);
        let Some(addr) = seg.addr.0.checked_add(skip) else {
            return false;
        };
        if mem
            .read_slice(&mut out[done..done + n], GuestAddress(addr))
            .is_err()
        {
            return false;
        }
        done += n;
        skip = 0;
    }
    done == out.len()
}

/// Copies `data` into the guest buffers `segs`, in order; false when they are outside guest
/// memory. Returns with `data` cut to what fits.
pub(crate) fn scatter(mem: &Mem, segs: &[Seg], data: &[u8]) -> bool {
    let mut done = 0;
    for seg in segs {
        if done == data.len() {
            break;
        }
        let n = (seg.len as usize).min(data.len() - done);
        if mem.write_slice(&data[done..done + n], seg.addr).is_err() {
            return false;
        }
        done += n;
    }
    true
}

/// A data buffer from the registered pool, or from the heap when the pool is exhausted.
pub(crate) fn alloc(len: usize) -> IoBuf {
    BufferPool::global()
        .alloc(len)
        .unwrap_or_else(|_| IoBuf::heap(len, kura_engine::buffer::POOL_ALIGN))
}

/// Answers of one virtqueue waiting to go on its used ring in available-ring order.
#[derive(Default)]
struct InOrder {
    /// Sequence number of `slots[0]`.
    base: u64,
    /// `None` while the request is in flight, then its head index and the bytes written.
    slots: VecDeque<Option<(u16, u32)>>,
}

/// The answer order of one virtqueue, shared by its thread (which registers requests as it takes
/// them) and the driver (which answers them).
#[derive(Default)]
pub(crate) struct QueueOrder {
    inner: Mutex<InOrder>,
    idle: Condvar,
}

impl QueueOrder {
    fn lock(&self) -> std::sync::MutexGuard<'_, InOrder> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sequence number of the request just taken from the available ring.
    pub fn register(&self) -> u64 {
        let mut q = self.lock();
        q.slots.push_back(None);
        q.base + q.slots.len() as u64 - 1
    }

    /// Records the answer of `seq` and returns the answers now ready for the used ring.
    fn complete(&self, seq: u64, head: u16, written: u32) -> Vec<(u16, u32)> {
        let mut q = self.lock();
        let index = (seq - q.base) as usize;
        if let Some(slot) = q.slots.get_mut(index) {
            *slot = Some((head, written));
        }
        let mut ready = Vec::new();
        while let Some(Some(answer)) = q.slots.front() {
            ready.push(*answer);
            q.slots.pop_front();
            q.base += 1;
        }
        if q.slots.is_empty() {
            self.idle.notify_all();
        }
        ready
    }

    /// Waits until every request taken from this virtqueue has been answered; false on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.lock();
        while !q.slots.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = self
                .idle
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// What a request asks of the device.
pub(crate) enum Work {
    /// Decided without the device (GET_ID, or a request refused while decoding).
    Answer {
        status: u8,
        written: u32,
    },
    Read {
        lba: u64,
        blocks: u64,
        into: Vec<Seg>,
        /// Set by the driver when the device reads straight into the guest's buffer: its host
        /// address (nothing to copy when the completion's buffer is that one).
        in_place: Option<usize>,
    },
    Write {
        lba: u64,
        blocks: u64,
        buf: IoBuf,
    },
    Flush,
    Discard {
        lba: u64,
        blocks: u64,
    },
    WriteZeroes {
        lba: u64,
        blocks: u64,
    },
}

/// One guest request on its way to the device.
pub(crate) struct Job {
    pub vring: Vring,
    pub order: Arc<QueueOrder>,
    pub seq: u64,
    pub head: u16,
    pub mem: Arc<Mem>,
    /// Where the status byte goes; `None` for a chain without room for one.
    pub status: Option<GuestAddress>,
    /// Set when the guest request is several device requests (the ranges of a discard or
    /// write-zeroes), each its own job: the last one to finish answers for all.
    pub parts: Option<Arc<Parts>>,
    pub work: Work,
}

/// The device requests of one guest request still unanswered, and whether one failed.
pub(crate) struct Parts {
    left: AtomicUsize,
    failed: AtomicBool,
}

impl Parts {
    pub fn new(count: usize) -> Parts {
        Parts {
            left: AtomicUsize::new(count),
            failed: AtomicBool::new(false),
        }
    }

    /// Records one part's status; the guest request's status once it was the last part.
    fn finish(&self, status: u8) -> Option<u8> {
        if status != STATUS_OK {
            self.failed.store(true, Ordering::SeqCst);
        }
        if self.left.fetch_sub(1, Ordering::SeqCst) != 1 {
            return None;
        }
        Some(if self.failed.load(Ordering::SeqCst) {
            STATUS_IOERR
        } else {
            STATUS_OK
        })
    }
}

pub(crate) enum ToDriver {
    Job(Job),
    /// The device's counters, answered between two rounds of I/O.
    Stats(Sender<Vec<DriveStats>>),
    /// Change the device once every earlier request is answered; the answer is its new size in
    /// blocks.
    Swap(crate::Swap, Sender<Result<u64, String>>),
}

/// Runs until every sender is gone and every request has been answered, then hands the device
/// back (for the final flush and counters).
pub(crate) fn run(
    mut dev: Box<dyn BlockDevice>,
    rx: Receiver<ToDriver>,
    zero_copy: ZeroCopy,
) -> Box<dyn BlockDevice> {
    let block_size = u64::from(dev.geometry().block_size);
    // Refreshed after a swap: the new device may ask for another alignment.
    let mut align = dev.geometry().buffer_alignment;
    let mut waiting: HashMap<u64, Job> = HashMap::new();
    let mut backlog: VecDeque<Request> = VecDeque::new();
    let mut next_tag = 0u64;
    let mut completions: Vec<Completion> = Vec::new();
    let mut open = true;
    // Set when the queue pair itself failed: every later request is answered with an I/O error.
    let mut broken = false;
    loop {
        let mut incoming = Vec::new();
        if open && dev.in_flight() == 0 && backlog.is_empty() {
            match rx.recv() {
                Ok(msg) => incoming.push(msg),
                Err(_) => open = false,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(msg) => incoming.push(msg),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        for msg in incoming {
            let job = match msg {
                ToDriver::Stats(reply) => {
                    let _ = reply.send(stats_of(&dev));
                    continue;
                }
                ToDriver::Swap(swap, reply) => {
                    drain(
                        &mut dev,
                        &mut backlog,
                        &mut waiting,
                        &mut completions,
                        &mut broken,
                    );
                    let outcome = if broken {
                        Err("the export's device queue failed earlier".to_string())
                    } else {
                        let outcome = swap(&mut dev);
                        if let Err(e) = &outcome {
                            broken |= e.lost;
                        }
                        outcome
                            .map(|()| dev.geometry().num_blocks)
                            .map_err(|e| e.message)
                    };
                    align = dev.geometry().buffer_alignment;
                    let _ = reply.send(outcome);
                    continue;
                }
                ToDriver::Job(job) => job,
            };
            if broken {
                answer(job, STATUS_IOERR, 1);
                continue;
            }
            let tag = next_tag;
            next_tag += 1;
            match request(tag, job, block_size, align, &zero_copy) {
                (job, Some(req)) => {
                    backlog.push_back(req);
                    waiting.insert(tag, job);
                }
                (job, None) => finish(job, None, Ok(())),
            }
        }
        if !open && dev.in_flight() == 0 && backlog.is_empty() {
            return dev;
        }
        if !round(
            &mut dev,
            &mut backlog,
            &mut waiting,
            &mut completions,
            &mut broken,
        ) {
            return dev;
        }
    }
}

/// Answers every request taken so far (before a swap changes the device under them).
fn drain(
    dev: &mut Box<dyn BlockDevice>,
    backlog: &mut VecDeque<Request>,
    waiting: &mut HashMap<u64, Job>,
    completions: &mut Vec<Completion>,
    broken: &mut bool,
) {
    while !backlog.is_empty() || dev.in_flight() > 0 {
        if !round(dev, backlog, waiting, completions, broken) {
            return;
        }
    }
}

/// Submits what the queue takes, waits for at least one completion and answers what completed.
/// False when the queue failed with requests still counted in flight (nothing will answer them).
fn round(
    dev: &mut Box<dyn BlockDevice>,
    backlog: &mut VecDeque<Request>,
    waiting: &mut HashMap<u64, Job>,
    completions: &mut Vec<Completion>,
    broken: &mut bool,
) -> bool {
    while let Some(req) = backlog.pop_front() {
        if let Err(rejected) = dev.submit(req) {
            if matches!(rejected.error, DeviceError::QueueFull { .. }) {
                backlog.push_front(rejected.request);
                break;
            }
            if let Some(job) = waiting.remove(&rejected.request.tag) {
                finish(job, rejected.request.buf, Err(rejected.error));
            }
        }
    }
    if dev.in_flight() == 0 {
        return true;
    }
    if let Err(e) = dev.poll(completions, 1) {
        eprintln!("kura vhost: the device's queue failed ({e}); answering every request with an I/O error");
        *broken = true;
        for req in backlog.drain(..) {
            if let Some(job) = waiting.remove(&req.tag) {
                finish(job, req.buf, Err(e.clone()));
            }
        }
        let mut held = 0;
        for (_, job) in waiting.drain() {
            // A read going in place may still be written into the guest's buffer by the
            // failed device (its request is still counted in flight). Answered, the guest could
            // reuse that memory and later find the late read data in it, so it is left
            // unanswered: the virtqueue stops there, and a reconnected backend is handed it
            // again from the used index. Copied reads and every write are safe to fail now.
            if matches!(
                job.work,
                Work::Read {
                    in_place: Some(_),
                    ..
                }
            ) {
                held += 1;
                continue;
            }
            answer(job, STATUS_IOERR, 1);
        }
        if held > 0 {
            eprintln!(
                "kura vhost: {held} read(s) going in place into guest memory left unanswered: the failed device may still write them"
            );
        }
        // Nothing in flight will be polled again; a device that still reports some would
        // keep this loop from ever waiting on the channel.
        if dev.in_flight() > 0 {
            return false;
        }
    }
    for c in completions.drain(..) {
        if let Some(job) = waiting.remove(&c.tag) {
            finish(job, c.buf, c.status);
        }
    }
    true
}

/// The device request of a job, or `None` when the job is answered without the device. Reads go
/// in place into the guest's buffer when `zero_copy` allows and the buffer qualifies; a write
/// the backend thread put in place is copied after all when the device (swapped since) needs
/// another alignment.
fn request(
    tag: u64,
    mut job: Job,
    block_size: u64,
    align: u32,
    zero_copy: &ZeroCopy,
) -> (Job, Option<Request>) {
    let req = match std::mem::replace(
        &mut job.work,
        Work::Answer {
            status: STATUS_OK,
            written: 1,
        },
    ) {
        Work::Answer { status, written } => {
            job.work = Work::Answer { status, written };
            return (job, None);
        }
        Work::Read {
            lba, blocks, into, ..
        } => {
            let len = (blocks * block_size) as usize;
            let (buf, in_place) = match zero_copy.in_place(&job.mem, &into, 0, len, align) {
                Some(buf) => {
                    Counters::count(&zero_copy.counters.zero_copy_reads);
                    let at = buf.as_ptr() as usize;
                    (buf, Some(at))
                }
                None => {
                    Counters::count(&zero_copy.counters.copied_reads);
                    (alloc(len), None)
                }
            };
            job.work = Work::Read {
                lba,
                blocks,
                into,
                in_place,
            };
            Request::read(tag, lba, blocks, buf)
        }
        Work::Write { lba, blocks, buf } => {
            let aligned = (buf.as_ptr() as usize).is_multiple_of(align.max(1) as usize);
            let buf = if buf.is_borrowed() && !aligned {
                Counters::count(&zero_copy.counters.recopied_writes);
                let mut copy = alloc(buf.len());
                copy.copy_from_slice(&buf);
                copy
            } else {
                buf
            };
            Request::write(tag, lba, blocks, buf)
        }
        Work::Flush => Request::flush(tag),
        Work::Discard { lba, blocks } => Request::discard(tag, lba, blocks),
        Work::WriteZeroes { lba, blocks } => Request::write_zeroes(tag, lba, blocks),
    };
    (job, Some(req))
}

/// Answers a job with the device's outcome: read data into the guest's buffers (unless the
/// device read straight into them), then the status.
fn finish(job: Job, buf: Option<IoBuf>, status: kura_engine::DeviceResult<()>) {
    let (status, written) = outcome(&job, buf.as_ref(), status);
    // The guest may reuse its buffers as soon as the chain is answered: a buffer over them
    // (`zerocopy::in_place`) is dropped first.
    drop(buf);
    answer(job, status, written)
}

/// The status and bytes written of a finished job, with read data copied into the guest unless
/// it is there already.
fn outcome(job: &Job, buf: Option<&IoBuf>, status: kura_engine::DeviceResult<()>) -> (u8, u32) {
    if let Work::Answer { status, written } = job.work {
        return (status, written);
    }
    if status.is_err() {
        return (STATUS_IOERR, 1);
    }
    let mut written = 1;
    if let (Work::Read { into, in_place, .. }, Some(buf)) = (&job.work, buf) {
        // A layer may complete with a buffer of its own rather than the one it was given.
        let there = *in_place == Some(buf.as_ptr() as usize);
        if !there && !scatter(&job.mem, into, buf) {
            return (STATUS_IOERR, 1);
        }
        let len: u64 = into.iter().map(|s| u64::from(s.len)).sum();
        written += u32::try_from(len).unwrap_or(u32::MAX - 1);
    }
    (STATUS_OK, written)
}

/// Writes the status byte and puts every answer of the job's virtqueue that is now in order on
/// the used ring, notifying the guest when it asked to be.
fn answer(job: Job, status: u8, written: u32) {
    let status = match &job.parts {
        Some(parts) => match parts.finish(status) {
            Some(status) => status,
            None => return,
        },
        None => status,
    };
    let (written, status_written) = match job.status {
        Some(addr) => (written, job.mem.write_obj(status, addr).is_ok()),
        None => (0, true),
    };
    let written = if status_written { written } else { 0 };
    let ready = job.order.complete(job.seq, job.head, written);
    if ready.is_empty() {
        return;
    }
    for (head, len) in ready {
        // A used ring outside guest memory leaves nothing to answer on.
        let _ = job.vring.add_used(head, len);
    }
    if job.vring.needs_notification().unwrap_or(true) {
        let _ = job.vring.signal_used_queue();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_leave_in_the_order_requests_arrived() {
        let order = QueueOrder::default();
        let a = order.register();
        let b = order.register();
        let c = order.register();
        assert!(order.complete(c, 3, 1).is_empty());
        assert!(order.complete(b, 2, 1).is_empty());
        assert!(!order.wait_idle(Duration::from_millis(1)));
        assert_eq!(order.complete(a, 1, 513), vec![(1, 513), (2, 1), (3, 1)]);
        assert!(order.wait_idle(Duration::from_millis(1)));
        let d = order.register();
        assert_eq!(d, 3);
        assert_eq!(order.complete(d, 4, 1), vec![(4, 1)]);
    }

    #[test]
    fn a_request_of_several_parts_answers_once_with_the_worst_status() {
        let parts = Parts::new(3);
        assert_eq!(parts.finish(STATUS_OK), None);
        assert_eq!(parts.finish(STATUS_IOERR), None);
        assert_eq!(parts.finish(STATUS_OK), Some(STATUS_IOERR));
        let parts = Parts::new(2);
        assert_eq!(parts.finish(STATUS_OK), None);
        assert_eq!(parts.finish(STATUS_OK), Some(STATUS_OK));
    }
}
