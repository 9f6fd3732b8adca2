//! The data path of one ublk queue: one thread, one io_uring of 64-byte SQEs on `/dev/ublkcN`.
//! Every tag owns a buffer of the largest request size, taken from kura's buffer pool (the arena
//! io_uring backends register), and keeps one `FETCH_REQ`/`COMMIT_AND_FETCH_REQ` command in the
//! kernel; a request's buffer moves into the kura request, through the device's driver thread
//! ([`crate::driver`], shared by every queue of the device) and back, so the only copy is the
//! kernel's between the bio's pages and that buffer. The ring also polls an eventfd the driver
//! thread writes when it hands back a completion, so one wait covers both directions.

use crate::driver::ToDriver;
use crate::sys::{self, IoCmd, IoDesc};
use crate::UblkError;
use io_uring::{opcode, types, IoUring};
use kura_engine::device::{Completion, Geometry, Opcode, Request};
use kura_engine::{BufferPool, IoBuf};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;

/// What a request from the driver becomes on the kura device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// A read or write of `blocks` blocks at `lba`, `bytes` long; `fua`: flush after it.
    Data {
        op: Opcode,
        lba: u64,
        blocks: u64,
        bytes: u32,
        fua: bool,
    },
    /// A flush.
    Flush,
    /// A discard or write-zeroes of `blocks` blocks at `lba`.
    Range { op: Opcode, lba: u64, blocks: u64 },
}

/// Maps a descriptor onto a kura request for a device of geometry `geo` whose tag buffers hold
/// `max_io` bytes; `Err(errno)` for requests kura cannot serve (the driver fails them with it).
pub fn plan(desc: &IoDesc, geo: &Geometry, max_io: u32, read_only: bool) -> Result<Plan, i32> {
    let bs = u64::from(geo.block_size);
    let bytes = u64::from(desc.nr_sectors) * 512;
    // Flushes carry no range (the driver passes start_sector u64::MAX), so it is checked here.
    let range = || -> Result<(u64, u64), i32> {
        let start = desc.start_sector.checked_mul(512).ok_or(libc::EINVAL)?;
        if !start.is_multiple_of(bs) || !bytes.is_multiple_of(bs) || bytes == 0 {
            return Err(libc::EINVAL);
        }
        let (lba, blocks) = (start / bs, bytes / bs);
        if lba
            .checked_add(blocks)
            .is_none_or(|end| end > geo.num_blocks)
        {
            return Err(libc::EINVAL);
        }
        Ok((lba, blocks))
    };
    let op = desc.op();
    if read_only && op != sys::IO_OP_READ {
        return Err(libc::EROFS);
    }
    match op {
        sys::IO_OP_READ | sys::IO_OP_WRITE => {
            if bytes > u64::from(max_io) {
                return Err(libc::EINVAL);
            }
            let (lba, blocks) = range()?;
            let write = op == sys::IO_OP_WRITE;
            Ok(Plan::Data {
                op: if write { Opcode::Write } else { Opcode::Read },
                lba,
                blocks,
                bytes: bytes as u32,
                fua: write && desc.fua(),
            })
        }
        sys::IO_OP_FLUSH => Ok(Plan::Flush),
        sys::IO_OP_DISCARD | sys::IO_OP_WRITE_ZEROES => {
            let (lba, blocks) = range()?;
            let op = if op == sys::IO_OP_DISCARD {
                Opcode::Discard
            } else {
                Opcode::WriteZeroes
            };
            Ok(Plan::Range { op, lba, blocks })
        }
        _ => Err(libc::EOPNOTSUPP),
    }
}

/// How one queue is set up.
pub struct QueueSetup {
    pub dev_id: u32,
    pub q_id: u16,
    pub depth: u16,
    pub max_io: u32,
    pub read_only: bool,
    /// The kura device's geometry; its block count is read from `blocks`, which a resize
    /// changes.
    pub geo: Geometry,
    pub blocks: Arc<AtomicU64>,
}

/// What a queue did, for the report when it stops.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueCounters {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub write_zeroes: u64,
    pub errors: u64,
}

impl QueueCounters {
    /// The sum of several queues' counters.
    pub fn add(&mut self, o: &QueueCounters) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.flushes += o.flushes;
        self.discards += o.discards;
        self.write_zeroes += o.write_zeroes;
        self.errors += o.errors;
    }
}

/// A queue's ends of the driver thread's channels ([`crate::driver`]).
pub(crate) struct DriverEnds {
    pub to_driver: Sender<ToDriver>,
    pub done: Receiver<Completion>,
    /// Written by the driver after each completion it sends; the ring polls it.
    pub wake: Arc<File>,
}

/// The read-only mapping of the queue's descriptor area.
struct DescArea {
    base: *const u8,
    len: usize,
}

impl DescArea {
    #[allow(unsafe_code)] // mmap of the driver's descriptor area
    fn map(file: &File, q_id: u16, depth: u16) -> Result<DescArea, UblkError> {
        let len = sys::queue_desc_bytes(depth);
        // SAFETY: a fresh shared read-only mapping of the char device at the offset and length
        // the driver defines for this queue; nothing else aliases it as writable memory here.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                sys::queue_desc_offset(q_id) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(UblkError::os(
                "mapping the queue's descriptors",
                &std::io::Error::last_os_error(),
            ));
        }
        Ok(DescArea {
            base: p as *const u8,
            len,
        })
    }

    #[allow(unsafe_code)] // reads the driver-written descriptor
    fn get(&self, tag: u16) -> IoDesc {
        let at = usize::from(tag) * sys::IO_DESC_LEN;
        assert!(
            at + sys::IO_DESC_LEN <= self.len,
            "tag beyond the queue depth"
        );
        // SAFETY: in bounds of the mapping (checked above); the driver wrote this tag's
        // descriptor before completing its fetch command, and it does not change until the tag
        // is committed. A byte array has alignment 1.
        let bytes =
            unsafe { std::ptr::read_volatile(self.base.add(at) as *const [u8; sys::IO_DESC_LEN]) };
        IoDesc::decode(&bytes)
    }
}

impl Drop for DescArea {
    #[allow(unsafe_code)] // munmap of our own mapping
    fn drop(&mut self) {
        // SAFETY: base/len are exactly what mmap returned; no reference into it outlives self.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Per tag: its buffer while the driver owns the tag, and the result being assembled.
struct Slot {
    buf: Option<IoBuf>,
    /// Bytes to report on commit (reads and writes; 0 for the rest).
    done: i32,
    /// A FUA write whose data is written and whose flush is still to come.
    flush_after: bool,
    /// The driver aborted the tag (device stopping): never committed again.
    dead: bool,
    /// The tag's request is with the driver thread.
    at_driver: bool,
}

/// The `user_data` of the ring's poll on the wake eventfd (tags are below 4096).
const WAKE: u64 = u64::MAX;

/// Runs one queue until the device is stopped. `ready` gets the outcome of the initial fetch of
/// every tag (the driver's `START_DEV` waits for that); `stop` is set by the control thread once
/// `STOP_DEV` has returned, after which no request can still be outstanding.
pub(crate) fn run(
    setup: QueueSetup,
    file: Arc<File>,
    ends: DriverEnds,
    ready: mpsc::Sender<Result<(), UblkError>>,
    stop: Arc<AtomicBool>,
) -> (QueueCounters, Result<(), UblkError>) {
    let mut q = match Queue::new(setup, file, ends) {
        Ok(q) => q,
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return (QueueCounters::default(), Err(e));
        }
    };
    if let Err(e) = q.fetch_all() {
        let _ = ready.send(Err(e.clone()));
        return (q.counters, Err(e));
    }
    let _ = ready.send(Ok(()));
    let res = q.serve(&stop);
    (q.counters, res)
}

struct Queue {
    setup: QueueSetup,
    file: Arc<File>,
    ring: IoUring,
    descs: DescArea,
    slots: Vec<Slot>,
    ends: DriverEnds,
    counters: QueueCounters,
    aborted: usize,
    /// Requests sent to the driver thread and not yet answered.
    outstanding: usize,
}

impl Queue {
    fn new(setup: QueueSetup, file: Arc<File>, ends: DriverEnds) -> Result<Queue, UblkError> {
        let descs = DescArea::map(&file, setup.q_id, setup.depth)?;
        // One entry more than the tags: the poll on the wake eventfd.
        let entries = u32::from(setup.depth) + 1;
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .build(entries)
            .or_else(|_| IoUring::new(entries))
            .map_err(|e| UblkError::os("creating the queue ring", &e))?;
        let pool = BufferPool::global();
        let slots = (0..setup.depth)
            .map(|_| {
                let buf = pool
                    .alloc(setup.max_io as usize)
                    .unwrap_or_else(|_| IoBuf::heap(setup.max_io as usize, 4096));
                Slot {
                    buf: Some(buf),
                    done: 0,
                    flush_after: false,
                    dead: false,
                    at_driver: false,
                }
            })
            .collect();
        Ok(Queue {
            setup,
            file,
            ring,
            descs,
            slots,
            ends,
            counters: QueueCounters::default(),
            aborted: 0,
            outstanding: 0,
        })
    }

    fn fetch_all(&mut self) -> Result<(), UblkError> {
        self.arm_wake()?;
        for tag in 0..self.setup.depth {
            self.push(sys::IO_FETCH_REQ, tag, 0)?;
        }
        self.ring
            .submit()
            .map_err(|e| UblkError::os("fetching requests", &e))?;
        Ok(())
    }

    #[allow(unsafe_code)] // io_uring submission of a poll, which names no memory
    fn arm_wake(&mut self) -> Result<(), UblkError> {
        let sqe = opcode::PollAdd::new(types::Fd(self.ends.wake.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        // SAFETY: a poll request carries no buffer; the eventfd outlives the ring (both are
        // this queue's, and the driver's copy is an Arc).
        self.push_sqe(|ring| unsafe { ring.submission().push(&sqe) }.is_ok())
    }

    fn push_sqe(&mut self, mut push: impl FnMut(&mut IoUring) -> bool) -> Result<(), UblkError> {
        while !push(&mut self.ring) {
            self.ring
                .submit()
                .map_err(|e| UblkError::os("submitting to the queue ring", &e))?;
        }
        Ok(())
    }

    #[allow(unsafe_code)] // io_uring submission naming the tag's buffer
    fn push(&mut self, nr: u8, tag: u16, result: i32) -> Result<(), UblkError> {
        let addr = self.slots[usize::from(tag)]
            .buf
            .as_mut()
            .map_or(0, |b| b.as_mut_ptr() as u64);
        let cmd = IoCmd {
            q_id: self.setup.q_id,
            tag,
            result,
            addr,
        };
        let sqe = opcode::UringCmd16::new(types::Fd(self.file.as_raw_fd()), sys::io_op(nr))
            .cmd(cmd.encode())
            .build()
            .user_data(u64::from(tag));
        // SAFETY: the command's data is inside the SQE; the buffer it names belongs to the
        // tag's slot and stays there (allocated, unmoved) until the driver hands the tag back
        // with the next completion, because a slot's buffer only leaves for a kura request
        // while the tag has no command in the driver.
        self.push_sqe(|ring| unsafe { ring.submission().push(&sqe) }.is_ok())
    }

    fn serve(&mut self, stop: &AtomicBool) -> Result<(), UblkError> {
        let depth = usize::from(self.setup.depth);
        let mut fresh = Vec::with_capacity(depth + 1);
        loop {
            if self.outstanding == 0 && (self.aborted == depth || stop.load(Ordering::Acquire)) {
                return Ok(());
            }
            // Requests from the kernel and completions from the driver thread (through the
            // eventfd) both end the wait; the timeout lets the loop notice `stop` even if the
            // driver never aborts the tags.
            let ts = types::Timespec::new().nsec(100_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => return Err(UblkError::os("waiting for requests", &e)),
            }
            fresh.clear();
            fresh.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(data, res) in &fresh {
                if data == WAKE {
                    let mut count = [0u8; 8];
                    // Resets the eventfd (non-blocking: a read finding it zero is harmless).
                    let _ = (&*self.ends.wake).read(&mut count);
                    self.arm_wake()?;
                } else {
                    self.arrived(data as u16, res)?;
                }
            }
            loop {
                match self.ends.done.try_recv() {
                    Ok(c) => self.completed(c)?,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.driver_lost()?;
                        break;
                    }
                }
            }
        }
    }

    /// A fetch or commit-and-fetch command completed: a new request for `tag`, or an abort.
    fn arrived(&mut self, tag: u16, res: i32) -> Result<(), UblkError> {
        if usize::from(tag) >= self.slots.len() {
            return Err(UblkError::Device(format!(
                "driver completed unknown tag {tag}"
            )));
        }
        if res != sys::IO_RES_OK {
            // ABORT (device stopping) or a refused command: the tag is finished either way.
            if !self.slots[usize::from(tag)].dead {
                self.slots[usize::from(tag)].dead = true;
                self.aborted += 1;
            }
            return Ok(());
        }
        let desc = self.descs.get(tag);
        let mut geo = self.setup.geo;
        geo.num_blocks = self.setup.blocks.load(Ordering::Acquire);
        match plan(&desc, &geo, self.setup.max_io, self.setup.read_only) {
            Err(errno) => {
                self.counters.errors += 1;
                self.push(sys::IO_COMMIT_AND_FETCH_REQ, tag, -errno)
            }
            Ok(p) => self.start(tag, p),
        }
    }

    fn start(&mut self, tag: u16, p: Plan) -> Result<(), UblkError> {
        let slot = &mut self.slots[usize::from(tag)];
        let t = u64::from(tag);
        let req = match p {
            Plan::Data {
                op,
                lba,
                blocks,
                bytes,
                fua,
            } => {
                let Some(mut buf) = slot.buf.take() else {
                    return Err(UblkError::Device(format!("tag {tag} has no buffer")));
                };
                buf.set_len(bytes as usize);
                slot.done = bytes as i32;
                slot.flush_after = fua;
                if op == Opcode::Read {
                    self.counters.reads += 1;
                    Request::read(t, lba, blocks, buf)
                } else {
                    self.counters.writes += 1;
                    Request::write(t, lba, blocks, buf)
                }
            }
            Plan::Flush => {
                self.counters.flushes += 1;
                slot.done = 0;
                slot.flush_after = false;
                Request::flush(t)
            }
            Plan::Range { op, lba, blocks } => {
                slot.done = 0;
                slot.flush_after = false;
                if op == Opcode::Discard {
                    self.counters.discards += 1;
                    Request::discard(t, lba, blocks)
                } else {
                    self.counters.write_zeroes += 1;
                    Request::write_zeroes(t, lba, blocks)
                }
            }
        };
        self.submit(tag, req)
    }

    /// Hands a request to the driver thread; with the driver gone it fails at once.
    fn submit(&mut self, tag: u16, req: Request) -> Result<(), UblkError> {
        let msg = ToDriver::Io {
            queue: self.setup.q_id,
            req,
        };
        match self.ends.to_driver.send(msg) {
            Ok(()) => {
                self.outstanding += 1;
                self.slots[usize::from(tag)].at_driver = true;
                Ok(())
            }
            Err(mpsc::SendError(msg)) => {
                self.counters.errors += 1;
                if let ToDriver::Io { req, .. } = msg {
                    if let Some(buf) = req.buf {
                        self.slots[usize::from(tag)].buf = Some(buf);
                    }
                }
                self.push(sys::IO_COMMIT_AND_FETCH_REQ, tag, -libc::EIO)
            }
        }
    }

    /// The driver thread ended early (its device's queue pair failed with requests in flight,
    /// which will never complete): those requests fail, with fresh buffers for their tags.
    fn driver_lost(&mut self) -> Result<(), UblkError> {
        for tag in 0..self.setup.depth {
            let slot = &mut self.slots[usize::from(tag)];
            if !slot.at_driver {
                continue;
            }
            slot.at_driver = false;
            slot.flush_after = false;
            if slot.buf.is_none() {
                slot.buf = Some(IoBuf::heap(self.setup.max_io as usize, 4096));
            }
            self.outstanding -= 1;
            self.counters.errors += 1;
            self.push(sys::IO_COMMIT_AND_FETCH_REQ, tag, -libc::EIO)?;
        }
        Ok(())
    }

    fn completed(&mut self, c: Completion) -> Result<(), UblkError> {
        let tag = c.tag as u16;
        if usize::from(tag) >= self.slots.len() {
            return Err(UblkError::Device(format!(
                "the device completed unknown tag {tag}"
            )));
        }
        let slot = &mut self.slots[usize::from(tag)];
        if !slot.at_driver {
            return Err(UblkError::Device(format!(
                "the device completed tag {tag} twice"
            )));
        }
        slot.at_driver = false;
        self.outstanding -= 1;
        if let Some(buf) = c.buf {
            slot.buf = Some(buf);
        }
        let result = match c.status {
            Err(e) => {
                self.counters.errors += 1;
                -e.errno().abs().max(1)
            }
            Ok(()) if slot.flush_after => {
                slot.flush_after = false;
                return self.submit(tag, Request::flush(c.tag));
            }
            Ok(()) => slot.done,
        };
        self.push(sys::IO_COMMIT_AND_FETCH_REQ, tag, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            block_size: 4096,
            num_blocks: 1024,
            max_transfer: 1 << 20,
            queue_depth: 128,
            buffer_alignment: 4096,
        }
    }

    fn desc(op: u8, flags: u32, start_sector: u64, nr_sectors: u32) -> IoDesc {
        IoDesc {
            op_flags: u32::from(op) | flags,
            nr_sectors,
            start_sector,
            addr: 0,
        }
    }

    #[test]
    fn reads_and_writes_map_sectors_to_blocks() {
        let g = geo();
        assert_eq!(
            plan(&desc(sys::IO_OP_READ, 0, 8, 16), &g, 1 << 20, false),
            Ok(Plan::Data {
                op: Opcode::Read,
                lba: 1,
                blocks: 2,
                bytes: 8192,
                fua: false
            })
        );
        assert_eq!(
            plan(
                &desc(sys::IO_OP_WRITE, sys::IO_F_FUA, 0, 8),
                &g,
                1 << 20,
                false
            ),
            Ok(Plan::Data {
                op: Opcode::Write,
                lba: 0,
                blocks: 1,
                bytes: 4096,
                fua: true
            })
        );
    }

    #[test]
    fn flush_discard_and_write_zeroes() {
        let g = geo();
        assert_eq!(
            plan(&desc(sys::IO_OP_FLUSH, 0, 0, 0), &g, 4096, false),
            Ok(Plan::Flush)
        );
        // What the 6.12 driver sends for a flush: no sectors, start u64::MAX.
        assert_eq!(
            plan(&desc(sys::IO_OP_FLUSH, 0, u64::MAX, 0), &g, 4096, false),
            Ok(Plan::Flush)
        );
        assert_eq!(
            plan(&desc(sys::IO_OP_DISCARD, 0, 16, 32), &g, 4096, false),
            Ok(Plan::Range {
                op: Opcode::Discard,
                lba: 2,
                blocks: 4
            })
        );
        // Range ops are not limited by the buffer size.
        assert_eq!(
            plan(
                &desc(sys::IO_OP_WRITE_ZEROES, 0, 0, 8 * 1024),
                &g,
                4096,
                false
            ),
            Ok(Plan::Range {
                op: Opcode::WriteZeroes,
                lba: 0,
                blocks: 1024
            })
        );
    }

    #[test]
    fn bad_requests_get_an_errno() {
        let g = geo();
        // Not block aligned, past the end, larger than the buffer, unknown, zero-length.
        assert_eq!(
            plan(&desc(sys::IO_OP_READ, 0, 1, 8), &g, 1 << 20, false),
            Err(libc::EINVAL)
        );
        assert_eq!(
            plan(&desc(sys::IO_OP_READ, 0, 8 * 1024, 8), &g, 1 << 20, false),
            Err(libc::EINVAL)
        );
        assert_eq!(
            plan(&desc(sys::IO_OP_READ, 0, 0, 16), &g, 4096, false),
            Err(libc::EINVAL)
        );
        assert_eq!(
            plan(&desc(sys::IO_OP_WRITE_SAME, 0, 0, 8), &g, 4096, false),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(
            plan(&desc(99, 0, 0, 8), &g, 4096, false),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(
            plan(&desc(sys::IO_OP_DISCARD, 0, 0, 0), &g, 4096, false),
            Err(libc::EINVAL)
        );
        assert_eq!(
            plan(&desc(sys::IO_OP_READ, 0, u64::MAX, 8), &g, 4096, false),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn read_only_refuses_mutations() {
        let g = geo();
        assert!(plan(&desc(sys::IO_OP_READ, 0, 0, 8), &g, 4096, true).is_ok());
        for op in [
            sys::IO_OP_WRITE,
            sys::IO_OP_FLUSH,
            sys::IO_OP_DISCARD,
            sys::IO_OP_WRITE_ZEROES,
        ] {
            assert_eq!(plan(&desc(op, 0, 0, 8), &g, 4096, true), Err(libc::EROFS));
        }
    }
}
