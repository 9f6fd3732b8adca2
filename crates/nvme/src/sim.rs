//! A simulated NVMe controller: an in-process model of the register file, the admin and I/O
//! queues and an NVM namespace over a `Vec<u8>`, so the whole driver runs end to end on the host.
//!
//! It behaves like a device doing DMA: it reads submission entries and PRP lists from, and writes
//! completions and data to, the driver's memory by address, but only inside ranges the driver
//! mapped (as an IOMMU would); any other address fails the command with a data transfer error
//! and is counted in [`SimStats::dma_faults`]. Commands run when their doorbell is written. Tests
//! can make it swallow commands (timeouts), ignore aborts, fail the next command with any status,
//! never become ready, ignore being disabled (CSTS.RDY stays 1 and it keeps what it holds), or
//! vanish (registers read all ones).

use crate::bus::Bus;
use crate::cmd::{admin, io, Cqe, Sqe, CQE_SIZE, SQE_SIZE};
use crate::error::NvmeError;
use crate::prp;
use crate::regs;
use crate::status::{self, NvmeStatus};
use std::sync::{Mutex, MutexGuard};

/// The shape of the simulated controller and namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    pub lba_size: u32,
    pub blocks: u64,
    /// MDTS as a power of two of 4 KiB pages (0 = unlimited).
    pub mdts: u8,
    /// Largest queue, in entries.
    pub max_queue_entries: u16,
    /// I/O queue pairs the controller grants at most.
    pub max_io_queues: u16,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// CAP.TO in 500 ms units.
    pub timeout_units: u8,
    pub dsm: bool,
    pub write_zeroes: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            lba_size: 512,
            blocks: 2048,
            mdts: 5,
            max_queue_entries: 1024,
            max_io_queues: 8,
            dstrd: 0,
            timeout_units: 2,
            dsm: true,
            write_zeroes: true,
        }
    }
}

/// What the simulated controller did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SimStats {
    pub admin_commands: u64,
    pub io_commands: u64,
    pub flushes: u64,
    pub dma_faults: u64,
    pub enables: u64,
    pub shutdowns: u64,
    /// Largest data transfer of one command, in bytes.
    pub largest_transfer: usize,
    /// Commands whose PRP2 pointed at a PRP list.
    pub prp_list_commands: u64,
}

#[derive(Debug, Clone, Copy)]
struct SimSq {
    base: u64,
    size: u16,
    head: u16,
    tail: u16,
    cqid: u16,
}

#[derive(Debug, Clone, Copy)]
struct SimCq {
    base: u64,
    size: u16,
    tail: u16,
    head: u16,
    phase: bool,
}

struct State {
    cfg: SimConfig,
    cc: u32,
    csts: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
    sqs: Vec<Option<SimSq>>,
    cqs: Vec<Option<SimCq>>,
    disk: Vec<u8>,
    mapped: Vec<(u64, usize)>,
    held: Vec<(u16, u16)>,
    hang_io: bool,
    ignore_abort: bool,
    never_ready: bool,
    stuck_enabled: bool,
    vanished: bool,
    fail_next: Option<NvmeStatus>,
    stats: SimStats,
}

/// The simulated controller; share it as `Arc<SimController>` between the driver and the test.
pub struct SimController {
    state: Mutex<State>,
}

impl SimController {
    pub fn new(cfg: SimConfig) -> SimController {
        let queues = usize::from(cfg.max_io_queues) + 1;
        SimController {
            state: Mutex::new(State {
                disk: vec![0u8; (cfg.blocks * u64::from(cfg.lba_size)) as usize],
                cfg,
                cc: 0,
                csts: 0,
                aqa: 0,
                asq: 0,
                acq: 0,
                sqs: vec![None; queues],
                cqs: vec![None; queues],
                mapped: Vec::new(),
                held: Vec::new(),
                hang_io: false,
                ignore_abort: false,
                never_ready: false,
                stuck_enabled: false,
                vanished: false,
                fail_next: None,
                stats: SimStats::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// I/O commands are accepted but never completed (until aborted or reset) while set.
    pub fn set_hang_io(&self, on: bool) {
        self.lock().hang_io = on;
    }

    /// Abort commands report "not aborted" while set.
    pub fn set_ignore_abort(&self, on: bool) {
        self.lock().ignore_abort = on;
    }

    /// CSTS.RDY never becomes 1 after enabling while set.
    pub fn set_never_ready(&self, on: bool) {
        self.lock().never_ready = on;
    }

    /// While set, clearing CC.EN does nothing: CSTS.RDY stays 1 and the controller keeps its
    /// queues and the commands it holds, as a hung controller would (it may still DMA).
    pub fn set_stuck_enabled(&self, on: bool) {
        self.lock().stuck_enabled = on;
    }

    /// I/O commands it accepted and holds uncompleted (see [`SimController::set_hang_io`]).
    pub fn held_commands(&self) -> usize {
        self.lock().held.len()
    }

    /// The next I/O command completes with `status`.
    pub fn fail_next_io(&self, status: NvmeStatus) {
        self.lock().fail_next = Some(status);
    }

    /// The device leaves the bus: every register reads all ones, nothing completes.
    pub fn vanish(&self) {
        self.lock().vanished = true;
    }

    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// A copy of the namespace's contents.
    pub fn disk(&self) -> Vec<u8> {
        self.lock().disk.clone()
    }

    /// DMA ranges the driver has mapped and not unmapped.
    pub fn mapped_ranges(&self) -> usize {
        self.lock().mapped.len()
    }

    /// CC.EN as last written.
    pub fn enabled(&self) -> bool {
        self.lock().cc & regs::CC_EN != 0
    }
}

impl State {
    fn cap(&self) -> u64 {
        u64::from(self.cfg.max_queue_entries - 1)
            | (1 << 16)
            | (u64::from(self.cfg.timeout_units) << 24)
            | (u64::from(self.cfg.dstrd & 0xf) << 32)
            | (1 << 37)
    }

    fn stride(&self) -> u32 {
        4 << self.cfg.dstrd
    }

    fn dma_ok(&self, addr: u64, len: usize) -> bool {
        self.mapped
            .iter()
            .any(|&(a, l)| addr >= a && addr + len as u64 <= a + l as u64)
    }

    fn dma_read(&mut self, addr: u64, len: usize) -> Option<Vec<u8>> {
        if !self.dma_ok(addr, len) {
            self.stats.dma_faults += 1;
            return None;
        }
        let mut v = vec![0u8; len];
        // SAFETY: the range lies inside memory the driver mapped for DMA and keeps alive while
        // mapped; identity I/O addresses make it a valid pointer in this process.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
        Some(v)
    }

    fn dma_write(&mut self, addr: u64, data: &[u8]) -> bool {
        if !self.dma_ok(addr, data.len()) {
            self.stats.dma_faults += 1;
            return false;
        }
        // SAFETY: as in `dma_read`; the driver gave this memory to the device for this command.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
        true
    }

    fn set_cc(&mut self, val: u32) {
        let was = self.cc & regs::CC_EN != 0;
        let shutdown_asked = self.cc & regs::CC_SHN_MASK == 0 && val & regs::CC_SHN_MASK != 0;
        let now = val & regs::CC_EN != 0;
        self.cc = val;
        if !was && now {
            let n = (self.aqa & 0xfff) as u16 + 1;
            self.sqs[0] = Some(SimSq {
                base: self.asq,
                size: n,
                head: 0,
                tail: 0,
                cqid: 0,
            });
            let nc = ((self.aqa >> 16) & 0xfff) as u16 + 1;
            self.cqs[0] = Some(SimCq {
                base: self.acq,
                size: nc,
                tail: 0,
                head: 0,
                phase: true,
            });
            self.stats.enables += 1;
            if !self.never_ready {
                self.csts |= regs::CSTS_RDY;
            }
        } else if was && !now && self.stuck_enabled {
            // Ignores the disable: still running, RDY stays 1.
        } else if was && !now {
            self.sqs.iter_mut().for_each(|q| *q = None);
            self.cqs.iter_mut().for_each(|q| *q = None);
            self.held.clear();
            self.csts = 0;
        }
        if shutdown_asked && now {
            self.stats.shutdowns += 1;
            self.csts |= regs::CSTS_SHST_DONE;
        }
    }

    fn doorbell(&mut self, off: u32, val: u32) {
        let idx = (off - regs::DOORBELL_BASE) / self.stride();
        let qid = (idx / 2) as usize;
        if idx.is_multiple_of(2) {
            if let Some(Some(sq)) = self.sqs.get_mut(qid) {
                if val < u32::from(sq.size) {
                    sq.tail = val as u16;
                }
                self.process(qid as u16);
            }
        } else if let Some(Some(cq)) = self.cqs.get_mut(qid) {
            if val < u32::from(cq.size) {
                cq.head = val as u16;
            }
        }
    }

    fn post(&mut self, sqid: u16, cid: u16, result: u32, st: Option<NvmeStatus>) -> bool {
        let Some(Some(sq)) = self.sqs.get(usize::from(sqid)).copied() else {
            return false;
        };
        let Some(Some(mut cq)) = self.cqs.get(usize::from(sq.cqid)).copied() else {
            return false;
        };
        if (cq.tail + 1) % cq.size == cq.head {
            return false;
        }
        let status = match st {
            None => u16::from(cq.phase),
            Some(s) => s.to_cqe_status(cq.phase),
        };
        let cqe = Cqe {
            result,
            sq_head: sq.head,
            sq_id: sqid,
            cid,
            status,
        };
        let addr = cq.base + u64::from(cq.tail) * CQE_SIZE as u64;
        if !self.dma_write(addr, &cqe.to_bytes()) {
            return false;
        }
        cq.tail += 1;
        if cq.tail == cq.size {
            cq.tail = 0;
            cq.phase = !cq.phase;
        }
        self.cqs[usize::from(sq.cqid)] = Some(cq);
        true
    }

    fn process(&mut self, sqid: u16) {
        loop {
            let Some(Some(mut sq)) = self.sqs.get(usize::from(sqid)).copied() else {
                return;
            };
            if sq.head == sq.tail {
                return;
            }
            let Some(Some(cq)) = self.cqs.get(usize::from(sq.cqid)).copied() else {
                return;
            };
            if (cq.tail + 1) % cq.size == cq.head {
                return;
            }
            let addr = sq.base + u64::from(sq.head) * SQE_SIZE as u64;
            let Some(raw) = self.dma_read(addr, SQE_SIZE) else {
                return;
            };
            let mut b = [0u8; SQE_SIZE];
            b.copy_from_slice(&raw);
            let sqe = Sqe::from_bytes(&b);
            sq.head = (sq.head + 1) % sq.size;
            self.sqs[usize::from(sqid)] = Some(sq);
            let outcome = if sqid == 0 {
                Some(self.admin(&sqe))
            } else {
                self.io(sqid, &sqe)
            };
            if let Some((result, st)) = outcome {
                self.post(sqid, sqe.cid, result, st);
            }
        }
    }

    fn admin(&mut self, s: &Sqe) -> (u32, Option<NvmeStatus>) {
        self.stats.admin_commands += 1;
        let bad_field = Some(NvmeStatus::generic(status::SC_INVALID_FIELD));
        let bad_qid = Some(NvmeStatus {
            sct: status::SCT_COMMAND_SPECIFIC,
            sc: 0x01,
            dnr: true,
            more: false,
        });
        let qid = (s.cdw[0] & 0xffff) as u16;
        let max_q = self.cfg.max_io_queues;
        match s.opcode {
            admin::IDENTIFY => {
                let page = match s.cdw[0] & 0xff {
                    1 => self.identify_controller(),
                    0 if s.nsid == 1 => self.identify_namespace(),
                    _ => return (0, Some(NvmeStatus::generic(status::SC_INVALID_NAMESPACE))),
                };
                if self.dma_write(s.prp1, &page) {
                    (0, None)
                } else {
                    (0, Some(NvmeStatus::generic(status::SC_DATA_TRANSFER_ERROR)))
                }
            }
            admin::SET_FEATURES if s.cdw[0] & 0xff == crate::cmd::FEAT_NUM_QUEUES => {
                let want = (s.cdw[1] & 0xffff) as u16 + 1;
                let n = u32::from(want.min(max_q) - 1);
                (n | (n << 16), None)
            }
            admin::CREATE_CQ => {
                let size = (s.cdw[0] >> 16) as u16 + 1;
                if qid == 0 || qid > max_q || self.cqs[usize::from(qid)].is_some() {
                    return (0, bad_qid);
                }
                if size < 2 || size > self.cfg.max_queue_entries || s.cdw[1] & 1 == 0 {
                    return (0, bad_field);
                }
                self.cqs[usize::from(qid)] = Some(SimCq {
                    base: s.prp1,
                    size,
                    tail: 0,
                    head: 0,
                    phase: true,
                });
                (0, None)
            }
            admin::CREATE_SQ => {
                let size = (s.cdw[0] >> 16) as u16 + 1;
                let cqid = (s.cdw[1] >> 16) as u16;
                if qid == 0 || qid > max_q || self.sqs[usize::from(qid)].is_some() {
                    return (0, bad_qid);
                }
                if self.cqs.get(usize::from(cqid)).is_none_or(Option::is_none) {
                    return (
                        0,
                        Some(NvmeStatus {
                            sct: status::SCT_COMMAND_SPECIFIC,
                            sc: 0x00,
                            dnr: true,
                            more: false,
                        }),
                    );
                }
                if size < 2 || size > self.cfg.max_queue_entries {
                    return (0, bad_field);
                }
                self.sqs[usize::from(qid)] = Some(SimSq {
                    base: s.prp1,
                    size,
                    head: 0,
                    tail: 0,
                    cqid,
                });
                (0, None)
            }
            admin::DELETE_SQ => {
                if qid == 0 || qid > max_q || self.sqs[usize::from(qid)].is_none() {
                    return (0, bad_qid);
                }
                let held: Vec<_> = self.held.iter().filter(|h| h.0 == qid).copied().collect();
                self.held.retain(|h| h.0 != qid);
                for (sq, cid) in held {
                    self.post(
                        sq,
                        cid,
                        0,
                        Some(NvmeStatus::generic(status::SC_ABORTED_SQ_DELETED)),
                    );
                }
                self.sqs[usize::from(qid)] = None;
                (0, None)
            }
            admin::DELETE_CQ => {
                if qid == 0 || qid > max_q || self.cqs[usize::from(qid)].is_none() {
                    return (0, bad_qid);
                }
                self.cqs[usize::from(qid)] = None;
                (0, None)
            }
            admin::ABORT => {
                let cid = (s.cdw[0] >> 16) as u16;
                let pos = self.held.iter().position(|&h| h == (qid, cid));
                match pos {
                    Some(i) if !self.ignore_abort => {
                        self.held.remove(i);
                        self.post(
                            qid,
                            cid,
                            0,
                            Some(NvmeStatus {
                                dnr: false,
                                ..NvmeStatus::generic(status::SC_ABORT_REQUESTED)
                            }),
                        );
                        (0, None)
                    }
                    _ => (1, None),
                }
            }
            _ => (0, Some(NvmeStatus::generic(status::SC_INVALID_OPCODE))),
        }
    }

    fn identify_controller(&self) -> Vec<u8> {
        let mut p = vec![0u8; regs::PAGE];
        p[4..24].copy_from_slice(b"SIM0000000000001    ");
        let model = b"kura simulated NVMe controller";
        p[24..24 + model.len()].copy_from_slice(model);
        p[24 + model.len()..64].fill(b' ');
        p[64..72].copy_from_slice(b"1.0     ");
        p[77] = self.cfg.mdts;
        p[516..520].copy_from_slice(&1u32.to_le_bytes());
        let oncs = (u16::from(self.cfg.dsm) << 2) | (u16::from(self.cfg.write_zeroes) << 3);
        p[520..522].copy_from_slice(&oncs.to_le_bytes());
        p[525] = 1;
        p
    }

    fn identify_namespace(&self) -> Vec<u8> {
        let mut p = vec![0u8; regs::PAGE];
        for off in [0, 8, 16] {
            p[off..off + 8].copy_from_slice(&self.cfg.blocks.to_le_bytes());
        }
        p[33] = 1;
        let lbads = self.cfg.lba_size.trailing_zeros();
        p[128..132].copy_from_slice(&(lbads << 16).to_le_bytes());
        p
    }

    fn range_ok(&self, slba: u64, nlb: u64) -> bool {
        slba.checked_add(nlb)
            .is_some_and(|end| end <= self.cfg.blocks)
    }

    fn io(&mut self, sqid: u16, s: &Sqe) -> Option<(u32, Option<NvmeStatus>)> {
        self.stats.io_commands += 1;
        if let Some(st) = self.fail_next.take() {
            return Some((0, Some(st)));
        }
        if self.hang_io {
            self.held.push((sqid, s.cid));
            return None;
        }
        if s.nsid != 1 {
            return Some((0, Some(NvmeStatus::generic(status::SC_INVALID_NAMESPACE))));
        }
        let st = match s.opcode {
            io::FLUSH => {
                self.stats.flushes += 1;
                None
            }
            io::READ | io::WRITE => self.rw(s),
            io::WRITE_ZEROES => {
                let (slba, nlb) = (s.slba(), u64::from(s.nlb()));
                if self.range_ok(slba, nlb) {
                    let bs = u64::from(self.cfg.lba_size);
                    self.disk[(slba * bs) as usize..((slba + nlb) * bs) as usize].fill(0);
                    None
                } else {
                    Some(NvmeStatus::generic(status::SC_LBA_OUT_OF_RANGE))
                }
            }
            io::DSM => self.dsm(s),
            _ => Some(NvmeStatus::generic(status::SC_INVALID_OPCODE)),
        };
        Some((0, st))
    }

    fn rw(&mut self, s: &Sqe) -> Option<NvmeStatus> {
        let (slba, nlb) = (s.slba(), u64::from(s.nlb()));
        if !self.range_ok(slba, nlb) {
            return Some(NvmeStatus::generic(status::SC_LBA_OUT_OF_RANGE));
        }
        let bs = self.cfg.lba_size as usize;
        let len = nlb as usize * bs;
        if self.cfg.mdts != 0 && len > (regs::PAGE << self.cfg.mdts) {
            return Some(NvmeStatus::generic(status::SC_INVALID_FIELD));
        }
        let transfer_error = Some(NvmeStatus::generic(status::SC_DATA_TRANSFER_ERROR));
        let mut lists = 0;
        let segs = prp::walk(s.prp1, s.prp2, len, |addr, n| {
            lists += 1;
            let raw = self.dma_read(addr, n * 8)?;
            Some(
                raw.chunks_exact(8)
                    .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
            )
        });
        let Some(segs) = segs else {
            return transfer_error;
        };
        if lists > 0 {
            self.stats.prp_list_commands += 1;
        }
        self.stats.largest_transfer = self.stats.largest_transfer.max(len);
        let mut at = slba as usize * bs;
        for (addr, n) in segs {
            if s.opcode == io::READ {
                let data = self.disk[at..at + n].to_vec();
                if !self.dma_write(addr, &data) {
                    return transfer_error;
                }
            } else {
                let Some(data) = self.dma_read(addr, n) else {
                    return transfer_error;
                };
                self.disk[at..at + n].copy_from_slice(&data);
            }
            at += n;
        }
        None
    }

    fn dsm(&mut self, s: &Sqe) -> Option<NvmeStatus> {
        let n = (s.cdw[0] & 0xff) as usize + 1;
        let Some(raw) = self.dma_read(s.prp1, n * 16) else {
            return Some(NvmeStatus::generic(status::SC_DATA_TRANSFER_ERROR));
        };
        if s.cdw[1] & crate::cmd::DSM_ATTR_DEALLOCATE == 0 {
            return None;
        }
        let bs = u64::from(self.cfg.lba_size);
        for r in raw.chunks_exact(16) {
            let nlb = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
            let mut sl = [0u8; 8];
            sl.copy_from_slice(&r[8..16]);
            let slba = u64::from_le_bytes(sl);
            if !self.range_ok(slba, nlb) {
                return Some(NvmeStatus::generic(status::SC_LBA_OUT_OF_RANGE));
            }
            self.disk[(slba * bs) as usize..((slba + nlb) * bs) as usize].fill(0);
        }
        None
    }
}

impl Bus for SimController {
    fn read32(&self, off: u32) -> u32 {
        let st = self.lock();
        if st.vanished {
            return u32::MAX;
        }
        match off {
            regs::CAP => st.cap() as u32,
            o if o == regs::CAP + 4 => (st.cap() >> 32) as u32,
            regs::VS => 0x0001_0400,
            regs::CC => st.cc,
            regs::CSTS => st.csts,
            regs::AQA => st.aqa,
            _ => 0,
        }
    }

    fn write32(&self, off: u32, val: u32) {
        let mut st = self.lock();
        if st.vanished {
            return;
        }
        match off {
            regs::CC => st.set_cc(val),
            regs::AQA => st.aqa = val,
            regs::ASQ => st.asq = (st.asq & !0xffff_ffff) | u64::from(val),
            o if o == regs::ASQ + 4 => st.asq = (st.asq & 0xffff_ffff) | (u64::from(val) << 32),
            regs::ACQ => st.acq = (st.acq & !0xffff_ffff) | u64::from(val),
            o if o == regs::ACQ + 4 => st.acq = (st.acq & 0xffff_ffff) | (u64::from(val) << 32),
            o if o >= regs::DOORBELL_BASE
                && st.cc & regs::CC_EN != 0
                && st.csts & regs::CSTS_RDY != 0 =>
            {
                st.doorbell(o, val)
            }
            _ => {}
        }
    }

    fn map_dma(&self, addr: u64, len: usize) -> Result<(), NvmeError> {
        self.lock().mapped.push((addr, len));
        Ok(())
    }

    fn unmap_dma(&self, addr: u64, len: usize) {
        let mut st = self.lock();
        if let Some(i) = st.mapped.iter().position(|&m| m == (addr, len)) {
            st.mapped.swap_remove(i);
        }
    }

    fn describe(&self) -> String {
        "sim".into()
    }
}
