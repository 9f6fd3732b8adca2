//! One I/O queue pair as a [`BlockDevice`]: engine requests become NVMe commands (split at the
//! per-command limit, PRPs or PRP lists built in per-command list pages), completions are found
//! by phase tag, and each request completes once all of its commands have.
//!
//! A queue pair belongs to one thread (`&mut self`), so the data path takes no lock: the only
//! shared state it touches is an atomic generation counter that says whether the controller was
//! reset under it. Buffers outside the DMA-mapped buffer-pool arena are bounced through a pool
//! buffer. A command outstanding longer than the I/O timeout is aborted; if the abort does not
//! bring it back, the controller is reset and every queue pair re-creates itself.
//!
//! Commands lost in a reset complete with an error. Their buffers go back to their owners (and
//! so to the pool) only when the reset confirmed the controller stopped; when the controller is
//! failed instead (see [`crate::ctrl`]), every buffer the device was given for them, request
//! buffers in DMA memory and bounce buffers, is leaked and counted, and the request completes
//! without it.

use crate::bus::DmaMem;
use crate::cmd::{command_pieces, io, Cqe, Sqe};
use crate::ctrl::Shared;
use crate::error::NvmeError;
use crate::prp::{self, LIST_ENTRIES};
use crate::qpair::QueuePair;
use crate::regs::{self, PAGE};
use crate::status::NvmeStatus;
use kura_engine::backend::common::hand_over;
use kura_engine::poison::FlushPoison;
use kura_engine::split::{CommandSpan, SplitParent};
use kura_engine::{
    BlockDevice, BufferPool, Completion, DeviceError, DeviceResult, Errno, Geometry, IoBuf, Opcode,
    OpenError, Rejected, Request,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a waiting poll reads CSTS and looks for timed-out commands.
const HEALTH_INTERVAL: Duration = Duration::from_millis(1);

/// An NVMe command waiting for room in the submission queue.
#[derive(Debug, Clone, Copy)]
enum Pending {
    Rw {
        opcode: u8,
        slba: u64,
        nlb: u32,
        addr: u64,
        len: usize,
    },
    Flush,
    WriteZeroes {
        slba: u64,
        nlb: u32,
        deallocate: bool,
    },
    Deallocate {
        slba: u64,
        nlb: u32,
    },
}

struct Slot {
    /// The request and its commands not yet completed.
    parent: SplitParent,
    /// A DMA-mapped stand-in for a buffer outside the arena.
    bounce: Option<IoBuf>,
    /// The device was given this request's memory and cannot be confirmed stopped: its DMA
    /// buffers are leaked when it completes.
    leak: bool,
}

#[derive(Clone, Copy)]
struct Cmd {
    slot: usize,
    issued: Instant,
}

/// Counters of one queue pair's work.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    pub commands: u64,
    pub bounced: u64,
    pub aborts: u64,
    pub resets: u64,
    /// Buffers this queue pair leaked because the controller could not be confirmed stopped.
    pub leaked_buffers: u64,
}

/// One polled NVMe I/O queue pair.
pub struct NvmeQueue {
    sh: Arc<Shared>,
    qp: QueuePair,
    generation: u64,
    geo: Geometry,
    /// Engine block = NVMe block << shift.
    shift: u32,
    /// NVMe blocks per read/write command.
    max_cmd_lbas: u64,
    /// One page per command id: its PRP list or DSM range.
    pages: DmaMem,
    cids: crate::ring::CidPool,
    cmds: Vec<Option<Cmd>>,
    slots: Vec<Option<Slot>>,
    free_slots: Vec<usize>,
    backlog: VecDeque<(usize, Pending)>,
    done: Vec<Completion>,
    in_flight: usize,
    poison: FlushPoison,
    broken: Option<String>,
    stats: QueueStats,
    /// A command outstanding this long is aborted (then the controller reset).
    io_timeout: Duration,
    /// When health and timeouts were last checked; kept across polls so a stuck command is
    /// noticed even while others keep completing and each poll returns quickly.
    last_check: Instant,
}

fn bounce_buffer(len: usize) -> Result<IoBuf, DeviceError> {
    Ok(BufferPool::global().alloc(len)?)
}

impl NvmeQueue {
    /// Creates I/O queue pair number `qid` on the controller.
    pub(crate) fn create(
        sh: Arc<Shared>,
        qid: u16,
        block_size: u32,
        queue_depth: u32,
        max_transfer: u32,
    ) -> Result<NvmeQueue, NvmeError> {
        let ns = sh.info.ns;
        if block_size < ns.lba_size || !block_size.is_power_of_two() {
            return Err(NvmeError::Invalid(format!(
                "block size {block_size} must be a power of two and at least the namespace's {}",
                ns.lba_size
            )));
        }
        let shift = (block_size / ns.lba_size).trailing_zeros();
        let device_max = sh
            .info
            .max_transfer
            .unwrap_or(prp::MAX_PRP_TRANSFER)
            .min(prp::MAX_PRP_TRANSFER);
        let cmd_bytes =
            (max_transfer as usize).min(device_max) / block_size as usize * block_size as usize;
        if cmd_bytes == 0 {
            return Err(NvmeError::Invalid(format!(
                "the controller's largest transfer ({device_max} bytes) is below one {block_size}-byte block"
            )));
        }
        let entries = sh
            .opts
            .queue_entries
            .clamp(2, sh.info.cap.max_queue_entries.min(4096) as u16);
        let qp = QueuePair::new(&sh.bus, qid, entries, sh.info.cap.doorbell_stride)?;
        let ncids = entries - 1;
        let pages = DmaMem::new(&sh.bus, usize::from(ncids) * PAGE)?;
        sh.create_io_queue(&qp)?;
        let generation = sh.generation();
        let geo = Geometry {
            block_size,
            num_blocks: ns.blocks >> shift,
            max_transfer: cmd_bytes as u32,
            queue_depth,
            buffer_alignment: 4,
        };
        Ok(NvmeQueue {
            generation,
            geo,
            shift,
            max_cmd_lbas: (cmd_bytes / ns.lba_size as usize) as u64,
            pages,
            cids: crate::ring::CidPool::new(ncids),
            cmds: vec![None; usize::from(ncids)],
            slots: Vec::new(),
            free_slots: Vec::new(),
            backlog: VecDeque::new(),
            done: Vec::new(),
            in_flight: 0,
            poison: FlushPoison::default(),
            broken: None,
            stats: QueueStats::default(),
            io_timeout: sh.opts.io_timeout,
            last_check: Instant::now(),
            qp,
            sh,
        })
    }

    /// Another I/O queue pair on the same controller, for another thread (what
    /// [`BlockDevice::new_queue`] returns, boxed); it shares this one's flush poison.
    pub fn new_queue(&self) -> Result<NvmeQueue, NvmeError> {
        if let Some(e) = self.sh.failed_error() {
            return Err(e);
        }
        let qid = self.sh.take_qid().ok_or_else(|| {
            NvmeError::Unsupported(format!(
                "all {} I/O queues granted by the controller are in use",
                self.sh.info.io_queues
            ))
        })?;
        NvmeQueue::create(
            Arc::clone(&self.sh),
            qid,
            self.geo.block_size,
            self.geo.queue_depth,
            self.geo.max_transfer,
        )
        .map(|mut q| {
            q.poison = self.poison.sibling();
            q
        })
        .inspect_err(|_| self.sh.give_qid(qid))
    }

    /// What Identify reported.
    pub fn info(&self) -> &crate::ctrl::ControllerInfo {
        &self.sh.info
    }

    /// Changes this queue pair's I/O timeout (the spec's `timeout_ms` sets the initial value).
    pub fn set_io_timeout(&mut self, timeout: Duration) {
        self.io_timeout = timeout;
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Why the controller is failed for good, if it is; every command then fails.
    pub fn failed(&self) -> Option<&str> {
        self.sh.failed()
    }

    /// Buffers leaked, across this controller's queue pairs, because it could not be confirmed
    /// stopped while it held them.
    pub fn leaked(&self) -> crate::ctrl::Leaked {
        self.sh.leaked()
    }

    /// Resets the controller now (as a timeout would); every queue pair re-creates itself.
    pub fn reset_controller(&mut self) -> Result<(), NvmeError> {
        self.stats.resets += 1;
        let r = self.sh.reset(self.generation);
        self.recover();
        r?;
        self.sh.identify_serial().map(|_| ())
    }

    /// Reads `nlb` NVMe blocks at `slba` with no range check on the host side, so that the
    /// controller's own status comes back (used to test error decoding).
    pub fn raw_read(&mut self, slba: u64, nlb: u32, buf: IoBuf) -> DeviceResult<IoBuf> {
        if self.in_flight > 0 {
            return Err(DeviceError::Busy {
                in_flight: self.in_flight,
            });
        }
        if nlb == 0 || buf.len() < nlb as usize * self.sh.info.ns.lba_size as usize {
            return Err(DeviceError::BadBuffer {
                op: Opcode::Read,
                blocks: u64::from(nlb),
                need: u64::from(nlb) * u64::from(self.sh.info.ns.lba_size),
                have: buf.len() as u64,
            });
        }
        let len = nlb as usize * self.sh.info.ns.lba_size as usize;
        let bounce = if self.sh.is_dma(buf.as_ptr() as u64, len) {
            None
        } else {
            Some(bounce_buffer(len)?)
        };
        let req = Request::read(
            u64::MAX,
            slba >> self.shift,
            u64::from(nlb) >> self.shift,
            buf,
        );
        let slot = self.new_slot(req, bounce, 1);
        let addr = self.data_addr(slot);
        let pending = Pending::Rw {
            opcode: io::READ,
            slba,
            nlb,
            addr,
            len,
        };
        self.backlog.push_back((slot, pending));
        self.in_flight += 1;
        let mut out = Vec::new();
        self.poll(&mut out, 1)?;
        let c = out.pop().ok_or_else(|| DeviceError::Offline {
            reason: "raw read lost".into(),
        })?;
        c.status?;
        c.buf.ok_or_else(|| DeviceError::Offline {
            reason: "raw read lost its buffer".into(),
        })
    }

    fn new_slot(&mut self, req: Request, bounce: Option<IoBuf>, commands: usize) -> usize {
        let slot = Slot {
            parent: SplitParent::new(req, commands),
            bounce,
            leak: false,
        };
        match self.free_slots.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    /// The I/O address of slot `slot`'s data (its bounce buffer when it has one).
    fn data_addr(&self, slot: usize) -> u64 {
        match self.slots[slot].as_ref() {
            Some(Slot {
                bounce: Some(b), ..
            }) => b.as_ptr() as u64,
            Some(Slot { parent, .. }) => parent
                .request()
                .buf
                .as_ref()
                .map_or(0, |b| b.as_ptr() as u64),
            None => 0,
        }
    }

    /// Turns an admitted request into NVMe commands on the backlog.
    fn plan(&mut self, req: Request) -> Result<(), (Request, DeviceError)> {
        let lba_bytes = self.sh.info.ns.lba_size as u64;
        let slba = req.lba << self.shift;
        let nlbs = req.blocks << self.shift;
        let mut bounce = None;
        if req.op.has_data() {
            let len = (nlbs * lba_bytes) as usize;
            let buf = req.buf.as_ref().map_or(0, |b| b.as_ptr() as u64);
            if !self.sh.is_dma(buf, len) {
                let mut b = match bounce_buffer(len) {
                    Ok(b) => b,
                    Err(e) => return Err((req, e)),
                };
                if req.op == Opcode::Write {
                    if let Some(src) = req.buf.as_ref() {
                        b[..len].copy_from_slice(&src[..len]);
                    }
                }
                self.stats.bounced += 1;
                bounce = Some(b);
            }
        }
        // Discard must read back as zeroes. Write Zeroes with DEAC guarantees that; a DSM
        // deallocate only when the namespace promises zeroes, and QEMU reports that promise even
        // when its drive ignores discards (the guest test caught stale data), so DSM is the
        // fallback for controllers without Write Zeroes.
        let zero_dealloc = req.op == Opcode::Discard
            && (self.sh.info.has_write_zeroes()
                || !(self.sh.info.has_dsm() && self.sh.info.ns.deallocated_reads_zero));
        if (req.op == Opcode::WriteZeroes || zero_dealloc) && !self.sh.info.has_write_zeroes() {
            let op = req.op;
            return Err((
                req,
                DeviceError::Unsupported {
                    op,
                    backend: "nvme",
                },
            ));
        }
        let op = req.op;
        let parts = command_pieces(op, slba, nlbs, self.max_cmd_lbas, lba_bytes as u32);
        let slot = self.new_slot(req, bounce, parts.len());
        let base = self.data_addr(slot);
        for CommandSpan {
            lba,
            blocks: n,
            buf_offset,
        } in parts
        {
            let nlb = n as u32;
            let pending = match op {
                Opcode::Flush => Pending::Flush,
                Opcode::Read | Opcode::Write => Pending::Rw {
                    opcode: if op == Opcode::Read {
                        io::READ
                    } else {
                        io::WRITE
                    },
                    slba: lba,
                    nlb,
                    addr: base + buf_offset as u64,
                    len: (n * lba_bytes) as usize,
                },
                Opcode::WriteZeroes => Pending::WriteZeroes {
                    slba: lba,
                    nlb,
                    deallocate: false,
                },
                Opcode::Discard if zero_dealloc => Pending::WriteZeroes {
                    slba: lba,
                    nlb,
                    deallocate: true,
                },
                Opcode::Discard => Pending::Deallocate { slba: lba, nlb },
            };
            self.backlog.push_back((slot, pending));
        }
        Ok(())
    }

    /// Builds the SQE for `p` using command id `cid`'s page.
    fn build(&mut self, cid: u16, p: Pending) -> Result<Sqe, DeviceError> {
        let nsid = self.sh.info.ns.nsid;
        let page_off = usize::from(cid) * PAGE;
        let mut sqe =
            match p {
                Pending::Rw {
                    opcode,
                    slba,
                    nlb,
                    addr,
                    len,
                } => {
                    let mut list = [0u64; LIST_ENTRIES];
                    let prps = prp::build(addr, len, &mut list, self.pages.iova(page_off))
                        .map_err(|e| DeviceError::Misaligned {
                            what: "NVMe data buffer",
                            value: match e {
                                prp::PrpError::Misaligned(a) => a,
                                _ => addr,
                            },
                            required: 4,
                        })?;
                    if prps.list_len > 0 {
                        let mut bytes = Vec::with_capacity(prps.list_len * 8);
                        for e in &list[..prps.list_len] {
                            bytes.extend_from_slice(&e.to_le_bytes());
                        }
                        self.pages.write(page_off, &bytes);
                    }
                    Sqe::rw(opcode, nsid, slba, nlb, prps.prp1, prps.prp2)
                }
                Pending::Flush => Sqe::new(io::FLUSH, nsid),
                Pending::WriteZeroes {
                    slba,
                    nlb,
                    deallocate,
                } => Sqe::write_zeroes(nsid, slba, nlb, deallocate),
                Pending::Deallocate { slba, nlb } => {
                    let mut range = [0u8; 16];
                    range[4..8].copy_from_slice(&nlb.to_le_bytes());
                    range[8..16].copy_from_slice(&slba.to_le_bytes());
                    self.pages.write(page_off, &range);
                    Sqe::dsm_deallocate(nsid, 1, self.pages.iova(page_off))
                }
            };
        sqe.cid = cid;
        Ok(sqe)
    }

    /// Moves backlog commands into the submission queue while it and the command ids allow.
    fn feed(&mut self) {
        while let Some(&(slot, p)) = self.backlog.front() {
            if self.qp.is_full() {
                break;
            }
            let Some(cid) = self.cids.take() else { break };
            self.backlog.pop_front();
            match self.build(cid, p) {
                Ok(sqe) => {
                    let pushed = self.qp.push(&sqe);
                    debug_assert!(pushed, "checked is_full above");
                    self.cmds[usize::from(cid)] = Some(Cmd {
                        slot,
                        issued: Instant::now(),
                    });
                    self.stats.commands += 1;
                }
                Err(e) => {
                    self.cids.give(cid);
                    self.finish_part(slot, Err(e));
                }
            }
        }
        self.qp.ring(&*self.sh.bus);
    }

    /// Records one command's outcome for its request; completes the request after its last.
    fn finish_part(&mut self, slot: usize, status: DeviceResult<()>) {
        let Some(s) = self.slots[slot].as_mut() else {
            return;
        };
        if !s.parent.piece_done(status) {
            return;
        }
        let Some(mut s) = self.slots[slot].take() else {
            return;
        };
        self.free_slots.push(slot);
        if s.leak {
            self.leak_buffers(&mut s);
        }
        let mut c = s.parent.into_completion();
        if c.op == Opcode::Read && c.status.is_ok() {
            if let (Some(b), Some(dst)) = (s.bounce.as_ref(), c.buf.as_mut()) {
                let n = dst.len().min(b.len());
                dst[..n].copy_from_slice(&b[..n]);
            }
        }
        self.poison.observe(c.op, &c.status);
        self.done.push(c);
    }

    fn status_error(&self, slot: usize, st: NvmeStatus) -> DeviceError {
        match self.slots[slot].as_ref() {
            Some(s) => {
                let r = s.parent.request();
                st.to_device_error(r.op, r.lba, r.blocks, self.geo.num_blocks)
            }
            None => st.to_device_error(Opcode::Read, 0, 0, self.geo.num_blocks),
        }
    }

    fn on_cqe(&mut self, cqe: Cqe) {
        let Some(cmd) = self
            .cmds
            .get_mut(usize::from(cqe.cid))
            .and_then(Option::take)
        else {
            return;
        };
        self.cids.give(cqe.cid);
        let status = match cqe.error() {
            None => Ok(()),
            Some(st) => Err(self.status_error(cmd.slot, st)),
        };
        self.finish_part(cmd.slot, status);
    }

    fn reap(&mut self) -> usize {
        let mut n = 0;
        while let Some(cqe) = self.qp.pop() {
            self.on_cqe(cqe);
            n += 1;
        }
        self.qp.release(&*self.sh.bus);
        n
    }

    /// Forgets the buffers of `s` the device could reach (bounce buffer, request buffer in the
    /// DMA arena), so they never return to the pool while it may still write to them.
    fn leak_buffers(&mut self, s: &mut Slot) {
        let mut leaked = Vec::new();
        leaked.extend(s.bounce.take());
        let buf = &mut s.parent.request_mut().buf;
        let dma = buf
            .as_ref()
            .is_some_and(|b| self.sh.is_dma(b.as_ptr() as u64, b.capacity()));
        if dma {
            leaked.extend(buf.take());
        }
        let bytes: usize = leaked.iter().map(IoBuf::capacity).sum();
        self.stats.leaked_buffers += leaked.len() as u64;
        self.sh.note_leaked(leaked.len() as u64, bytes as u64);
        for b in leaked {
            std::mem::forget(b);
        }
    }

    /// Fails every command still owned by the device or waiting for it with `err`. With
    /// `leak`, the device cannot be confirmed stopped: requests with a command on it lose their
    /// DMA buffers (see `leak_buffers`); requests it never saw get theirs back.
    fn fail_all(&mut self, err: &DeviceError, leak: bool) {
        if leak {
            for cmd in self.cmds.iter().flatten() {
                if let Some(s) = self.slots[cmd.slot].as_mut() {
                    s.leak = true;
                }
            }
        }
        for cid in 0..self.cmds.len() {
            if let Some(cmd) = self.cmds[cid].take() {
                self.cids.give(cid as u16);
                self.finish_part(cmd.slot, Err(err.clone()));
            }
        }
        while let Some((slot, _)) = self.backlog.pop_front() {
            self.finish_part(slot, Err(err.clone()));
        }
    }

    /// After a controller reset (by this or another queue pair): fail what was in flight and
    /// create the queue pair again; or, when the reset left the controller failed, fail it with
    /// its buffers leaked and stay broken.
    fn recover(&mut self) {
        if self.sh.generation() == self.generation {
            return;
        }
        if let Some(e) = self.sh.failed_error() {
            self.generation = self.sh.generation();
            self.go_offline(e.to_string());
            return;
        }
        self.fail_all(
            &DeviceError::Io {
                op: Opcode::Read,
                lba: 0,
                errno: Errno(libc::ECANCELED),
            },
            false,
        );
        self.qp.reset();
        self.generation = self.sh.generation();
        if let Err(e) = self.sh.create_io_queue(&self.qp) {
            self.broken = Some(format!(
                "re-creating I/O queue {} after a reset: {e}",
                self.qp.qid
            ));
        }
    }

    /// Fails everything and refuses all later work; buffers the device holds are leaked when
    /// the controller is failed (not confirmed stopped).
    fn go_offline(&mut self, reason: String) {
        let err = DeviceError::Offline {
            reason: reason.clone(),
        };
        let leak = self.sh.failed().is_some();
        self.fail_all(&err, leak);
        self.broken = Some(reason);
    }

    /// The device left the bus: nothing confirms it stopped (a link that comes back may finish
    /// its DMA), so the controller is failed for good.
    fn vanished(&mut self) {
        self.sh.mark_failed(NvmeError::Vanished.to_string());
        self.go_offline(NvmeError::Vanished.to_string());
    }

    /// Checks the oldest command against the I/O timeout: abort, then reset if that fails.
    fn check_timeouts(&mut self) {
        let timeout = self.io_timeout;
        let oldest = self
            .cmds
            .iter()
            .enumerate()
            .filter_map(|(cid, c)| c.map(|c| (cid as u16, c)))
            .min_by_key(|(_, c)| c.issued);
        let Some((cid, cmd)) = oldest else { return };
        if cmd.issued.elapsed() < timeout {
            return;
        }
        self.stats.aborts += 1;
        let aborted = self.sh.abort(self.qp.qid, cid);
        if let Err(NvmeError::Vanished) = aborted {
            self.vanished();
            return;
        }
        if matches!(aborted, Ok(true)) {
            // The aborted command completes with "abort requested"; give it a bounded moment.
            let until = Instant::now() + timeout.min(Duration::from_secs(1));
            while self.cmds[usize::from(cid)].is_some() && Instant::now() < until {
                if self.reap() == 0 {
                    std::thread::yield_now();
                }
            }
            if self.cmds[usize::from(cid)].is_none() {
                return;
            }
        }
        if let Some(s) = self.slots[cmd.slot].as_mut() {
            let r = s.parent.request();
            let timed_out = DeviceError::Io {
                op: r.op,
                lba: r.lba,
                errno: Errno(libc::ETIMEDOUT),
            };
            s.parent.fail(timed_out);
        }
        self.stats.resets += 1;
        let reset = self.sh.reset(self.generation);
        self.recover();
        if let Err(e) = reset {
            self.go_offline(format!("controller reset after a timeout failed: {e}"));
        }
    }

    fn check_health(&mut self) {
        let csts = self.sh.bus.read32(regs::CSTS);
        if csts == u32::MAX {
            self.vanished();
        } else if csts & regs::CSTS_CFS != 0 {
            self.stats.resets += 1;
            let reset = self.sh.reset(self.generation);
            self.recover();
            if let Err(e) = reset {
                self.go_offline(format!("controller fatal status; reset failed: {e}"));
            }
        }
    }
}

impl BlockDevice for NvmeQueue {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        out.push(kura_engine::DriveStats::new("nvme"));
    }

    fn describe(&self) -> String {
        format!(
            "nvme:{}/ns{}/q{}",
            self.sh.bus.describe(),
            self.sh.info.ns.nsid,
            self.qp.qid
        )
    }

    fn new_queue(&self) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
        Some(
            NvmeQueue::new_queue(self)
                .map(|q| Box::new(q) as Box<dyn BlockDevice>)
                .map_err(OpenError::from),
        )
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.in_flight)?;
        self.recover();
        if let Some(e) = self.sh.failed_error() {
            return Err(Rejected::new(req, e.into()));
        }
        if let Some(reason) = &self.broken {
            return Err(Rejected::new(
                req,
                DeviceError::Offline {
                    reason: reason.clone(),
                },
            ));
        }
        if let Err(e) = self.poison.check(req.op) {
            self.in_flight += 1;
            self.done.push(Completion::of(req, Err(e)));
            return Ok(());
        }
        match self.plan(req) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err((req, e)) => Err(Rejected::new(req, e)),
        }
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.recover();
        self.feed();
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let want = min_complete.min(self.in_flight);
        let mut got = 0;
        let mut spins = 0u64;
        loop {
            // A register read is a device round trip (a VM exit when emulated), so health and
            // timeouts are checked by the clock, once a millisecond, not per spin; the first
            // pass of every poll looks too, so quick polls cannot starve the check, and the
            // clock restarts only when there was something on the device to check.
            let outstanding = self.cids.available() < self.cmds.len();
            if outstanding
                && spins.is_multiple_of(64)
                && self.last_check.elapsed() >= HEALTH_INTERVAL
            {
                self.last_check = Instant::now();
                self.check_health();
                self.check_timeouts();
            }
            self.recover();
            self.feed();
            if self.reap() > 0 {
                self.feed();
            }
            got += hand_over(self.done.drain(..), out, &mut self.in_flight);
            if got >= want {
                return Ok(got);
            }
            spins += 1;
            if spins < 512 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for NvmeQueue {
    fn drop(&mut self) {
        let outstanding = self.cmds.iter().any(Option::is_some);
        let failed = self.sh.failed().is_some();
        let live = !failed && self.broken.is_none() && self.sh.generation() == self.generation;
        let deleted = live && self.sh.delete_io_queue(self.qp.qid).is_ok();
        // Commands still on the device are safe to drop only when deleting the queue aborted
        // them, or a reset since confirmed the controller stopped (not live, not failed).
        if outstanding && (failed || (live && !deleted)) {
            self.fail_all(
                &DeviceError::Offline {
                    reason: "queue pair dropped with commands on a controller that may still \
                             run them"
                        .into(),
                },
                true,
            );
        }
        self.sh.give_qid(self.qp.qid);
    }
}
