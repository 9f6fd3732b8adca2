//! The controller: bring-up by the spec (disable, wait CSTS.RDY within CAP.TO, admin queues,
//! enable, Identify, Set Features), the admin queue with bounded waits, abort, reset and
//! shutdown (CC.SHN) when the last queue pair is gone.
//!
//! Every wait here is bounded: register waits by CAP.TO, admin commands by the configured admin
//! timeout, and every loop also watches for a vanished device (all-ones reads) and CSTS.CFS.
//!
//! Buffers of commands the controller held are safe to reuse only once it has stopped: a reset
//! that sees CSTS.RDY=0 after clearing CC.EN proves that. When it does not (RDY stays 1 past
//! CAP.TO) or the device vanishes, the controller is marked failed for good: its queues leak
//! the buffers such commands carried (counted here) instead of handing them back to the pool,
//! and every later command and admin call fails with [`NvmeError::Failed`].

use crate::bus::{Bus, DmaMem};
use crate::cmd::{admin, Cqe, Sqe, CNS_CONTROLLER, CNS_NAMESPACE};
use crate::error::NvmeError;
use crate::qpair::QueuePair;
use crate::regs::{self, Cap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Entries of the admin queues.
const ADMIN_ENTRIES: u16 = 32;

/// How the driver is asked to run the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtrlOptions {
    /// Namespace to use.
    pub nsid: u32,
    /// I/O queue pairs to ask for (Set Features, Number of Queues).
    pub io_queues: u16,
    /// Entries per I/O queue (capped by CAP.MQES).
    pub queue_entries: u16,
    /// A data command outstanding this long is aborted, then the controller is reset.
    pub io_timeout: Duration,
    /// Bound on each admin command.
    pub admin_timeout: Duration,
}

impl Default for CtrlOptions {
    fn default() -> Self {
        CtrlOptions {
            nsid: 1,
            io_queues: 4,
            queue_entries: 256,
            io_timeout: Duration::from_secs(10),
            admin_timeout: Duration::from_secs(10),
        }
    }
}

/// What Identify told the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    pub serial: String,
    pub model: String,
    pub firmware: String,
    pub version: (u16, u8, u8),
    /// Largest data transfer of one command in bytes (MDTS), `None` when unlimited.
    pub max_transfer: Option<usize>,
    /// Optional NVM commands: bit 2 DSM, bit 3 Write Zeroes.
    pub oncs: u16,
    /// A volatile write cache is present (flush matters).
    pub volatile_write_cache: bool,
    pub namespaces: u32,
    /// I/O queue pairs granted by Set Features.
    pub io_queues: u16,
    pub cap: Cap,
    pub ns: NamespaceInfo,
}

impl ControllerInfo {
    pub fn has_dsm(&self) -> bool {
        self.oncs & (1 << 2) != 0
    }

    pub fn has_write_zeroes(&self) -> bool {
        self.oncs & (1 << 3) != 0
    }
}

/// The namespace in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// Logical block size in bytes.
    pub lba_size: u32,
    /// Deallocated blocks read back as zeroes (DLFEAT = 001b).
    pub deallocated_reads_zero: bool,
}

pub(crate) struct Admin {
    qp: QueuePair,
    next_cid: u16,
    /// One page for Identify data.
    page: DmaMem,
}

/// State shared by every queue pair of one controller. Dropping the last reference shuts the
/// controller down.
pub(crate) struct Shared {
    pub bus: Arc<dyn Bus>,
    pub info: ControllerInfo,
    pub opts: CtrlOptions,
    admin: Mutex<Admin>,
    /// Bumped by every reset; queue pairs created under an older value must be re-created.
    generation: AtomicU64,
    free_qids: Mutex<Vec<u16>>,
    /// The buffer-pool arena mapped for DMA, so its buffers move with no copy.
    arena: (u64, usize),
    /// Why the controller is failed for good (set once, never cleared): it could not be
    /// confirmed stopped, so it may still DMA into buffers of commands it held.
    failed: OnceLock<String>,
    /// Buffers leaked because of that, across all queue pairs, and their bytes.
    leaked_buffers: AtomicU64,
    leaked_bytes: AtomicU64,
}

/// Buffers never returned to the pool because the controller could not be confirmed stopped
/// while it held them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Leaked {
    pub buffers: u64,
    pub bytes: u64,
}

/// Waits until `CSTS & mask == want`, within `timeout`.
fn wait_csts(
    bus: &dyn Bus,
    mask: u32,
    want: u32,
    timeout: Duration,
    what: &str,
) -> Result<(), NvmeError> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let csts = bus.read32(regs::CSTS);
        if csts == u32::MAX {
            return Err(NvmeError::Vanished);
        }
        if csts & mask == want {
            return Ok(());
        }
        if csts & regs::CSTS_CFS != 0 && mask & regs::CSTS_SHST_MASK == 0 {
            return Err(NvmeError::Fatal {
                during: what.into(),
            });
        }
        if start.elapsed() > timeout {
            return Err(NvmeError::Timeout {
                what: what.into(),
                waited: start.elapsed(),
            });
        }
        spins += 1;
        if spins < 16 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

fn ascii(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

fn le_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn le_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

impl Admin {
    /// Runs one admin command to completion within `timeout`.
    fn execute(
        &mut self,
        bus: &dyn Bus,
        mut sqe: Sqe,
        timeout: Duration,
        what: &'static str,
    ) -> Result<Cqe, NvmeError> {
        self.next_cid = self.next_cid.wrapping_add(1);
        sqe.cid = self.next_cid;
        // Completions of abandoned commands may still sit in the queue; drop them.
        while self.qp.pop().is_some() {}
        self.qp.release(bus);
        if !self.qp.push(&sqe) {
            return Err(NvmeError::Timeout {
                what: format!("a free admin queue slot for {what}"),
                waited: Duration::ZERO,
            });
        }
        self.qp.ring(bus);
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            while let Some(cqe) = self.qp.pop() {
                self.qp.release(bus);
                if cqe.cid == sqe.cid {
                    return match cqe.error() {
                        None => Ok(cqe),
                        Some(status) => Err(NvmeError::Admin { what, status }),
                    };
                }
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                let csts = bus.read32(regs::CSTS);
                if csts == u32::MAX {
                    return Err(NvmeError::Vanished);
                }
                if csts & regs::CSTS_CFS != 0 {
                    return Err(NvmeError::Fatal {
                        during: what.into(),
                    });
                }
                if start.elapsed() > timeout {
                    return Err(NvmeError::Timeout {
                        what: format!("admin command {what}"),
                        waited: start.elapsed(),
                    });
                }
            }
            if spins < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Clears CC.EN and waits, within CAP.TO, for CSTS.RDY=0: the controller's word that it has
/// stopped processing its queues, and with them the DMA for their commands.
fn disable(bus: &dyn Bus, cap: &Cap) -> Result<(), NvmeError> {
    let to = Duration::from_millis(cap.timeout_ms.max(500));
    let cc = bus.read32(regs::CC);
    if cc == u32::MAX {
        return Err(NvmeError::Vanished);
    }
    if cc & regs::CC_EN != 0 {
        bus.write32(regs::CC, cc & !regs::CC_EN);
    }
    wait_csts(bus, regs::CSTS_RDY, 0, to, "CSTS.RDY=0 after disabling")
}

/// Disables the controller, programs the admin queues and enables it again.
fn enable(bus: &dyn Bus, cap: &Cap, admin: &mut Admin) -> Result<(), NvmeError> {
    disable(bus, cap)?;
    program_and_enable(bus, cap, admin)
}

/// Programs the admin queues of a disabled controller (CSTS.RDY=0) and enables it.
fn program_and_enable(bus: &dyn Bus, cap: &Cap, admin: &mut Admin) -> Result<(), NvmeError> {
    let to = Duration::from_millis(cap.timeout_ms.max(500));
    admin.qp.reset();
    bus.write32(regs::INTMS, u32::MAX);
    bus.write32(regs::AQA, regs::aqa(u32::from(ADMIN_ENTRIES)));
    bus.write64(regs::ASQ, admin.qp.sq_iova());
    bus.write64(regs::ACQ, admin.qp.cq_iova());
    bus.write32(regs::CC, regs::cc_enable());
    wait_csts(
        bus,
        regs::CSTS_RDY,
        regs::CSTS_RDY,
        to,
        "CSTS.RDY=1 after enabling",
    )
}

/// Clears CC.EN, waiting (bounded) for the controller to acknowledge. Used to leave a
/// half-initialised controller quiet.
fn disable_quietly(bus: &dyn Bus, cap: &Cap) {
    let cc = bus.read32(regs::CC);
    if cc != u32::MAX && cc & regs::CC_EN != 0 {
        bus.write32(regs::CC, cc & !(regs::CC_EN | regs::CC_SHN_MASK));
        let _ = wait_csts(
            bus,
            regs::CSTS_RDY,
            0,
            Duration::from_millis(cap.timeout_ms.max(500)),
            "disable",
        );
    }
}

impl Shared {
    /// Brings the controller behind `bus` up and maps the buffer-pool arena for DMA.
    pub fn bring_up(bus: Arc<dyn Bus>, opts: CtrlOptions) -> Result<Arc<Shared>, NvmeError> {
        let raw_cap = bus.read64(regs::CAP);
        if raw_cap == u64::MAX {
            return Err(NvmeError::Vanished);
        }
        let cap = Cap::decode(raw_cap);
        if !cap.nvm_command_set {
            return Err(NvmeError::Unsupported(
                "CAP.CSS lacks the NVM command set".into(),
            ));
        }
        if cap.mps_min > regs::PAGE as u64 {
            return Err(NvmeError::Unsupported(format!(
                "smallest memory page {} bytes; the driver uses 4096",
                cap.mps_min
            )));
        }
        if opts.io_queues == 0 {
            return Err(NvmeError::Invalid(
                "at least one I/O queue is needed".into(),
            ));
        }
        let mut admin = Admin {
            qp: QueuePair::new(&bus, 0, ADMIN_ENTRIES, cap.doorbell_stride)?,
            next_cid: 0,
            page: DmaMem::new(&bus, regs::PAGE)?,
        };
        let result = Self::initialise(&bus, &cap, &mut admin, opts);
        let (info, arena) = match result {
            Ok(v) => v,
            Err(e) => {
                disable_quietly(&*bus, &cap);
                return Err(e);
            }
        };
        let free_qids = (1..=info.io_queues).rev().collect();
        Ok(Arc::new(Shared {
            bus,
            info,
            opts,
            admin: Mutex::new(admin),
            generation: AtomicU64::new(0),
            free_qids: Mutex::new(free_qids),
            arena,
            failed: OnceLock::new(),
            leaked_buffers: AtomicU64::new(0),
            leaked_bytes: AtomicU64::new(0),
        }))
    }

    fn initialise(
        bus: &Arc<dyn Bus>,
        cap: &Cap,
        admin: &mut Admin,
        opts: CtrlOptions,
    ) -> Result<(ControllerInfo, (u64, usize)), NvmeError> {
        enable(&**bus, cap, admin)?;
        let t = opts.admin_timeout;
        admin.page.zero();
        admin.execute(
            &**bus,
            Sqe::identify(CNS_CONTROLLER, 0, admin.page.iova(0)),
            t,
            "identify controller",
        )?;
        let id = admin.page.bytes(0, regs::PAGE);
        let mdts = id[77];
        let max_transfer = (mdts != 0).then(|| (regs::PAGE << mdts.min(20)).min(usize::MAX >> 1));
        let namespaces = le_u32(&id, 516);
        let oncs = u16::from_le_bytes([id[520], id[521]]);
        let vwc = id[525] & 1 == 1;
        if opts.nsid == 0 || opts.nsid > namespaces {
            return Err(NvmeError::Invalid(format!(
                "namespace {} does not exist (the controller has {namespaces})",
                opts.nsid
            )));
        }
        admin.page.zero();
        admin.execute(
            &**bus,
            Sqe::identify(CNS_NAMESPACE, opts.nsid, admin.page.iova(0)),
            t,
            "identify namespace",
        )?;
        let ns = admin.page.bytes(0, regs::PAGE);
        let nsze = le_u64(&ns, 0);
        let flbas = usize::from(ns[26] & 0xf);
        let lbaf = le_u32(&ns, 128 + 4 * flbas);
        let lbads = (lbaf >> 16) & 0xff;
        if nsze == 0 || !(9..=16).contains(&lbads) {
            return Err(NvmeError::Unsupported(format!(
                "namespace {} is inactive or has an unusable block size (NSZE {nsze}, LBADS {lbads})",
                opts.nsid
            )));
        }
        if lbaf & 0xffff != 0 {
            return Err(NvmeError::Unsupported(
                "namespaces with metadata are not supported".into(),
            ));
        }
        let granted = Self::set_queue_count(&**bus, admin, opts)?;
        let (base, len) = kura_engine::BufferPool::global().arena();
        bus.map_dma(base.as_ptr() as u64, len)?;
        let info = ControllerInfo {
            serial: ascii(&id[4..24]),
            model: ascii(&id[24..64]),
            firmware: ascii(&id[64..72]),
            version: regs::version(bus.read32(regs::VS)),
            max_transfer,
            oncs,
            volatile_write_cache: vwc,
            namespaces,
            io_queues: granted,
            cap: *cap,
            ns: NamespaceInfo {
                nsid: opts.nsid,
                blocks: nsze,
                lba_size: 1 << lbads,
                deallocated_reads_zero: ns[33] & 7 == 1,
            },
        };
        Ok((info, (base.as_ptr() as u64, len)))
    }

    fn set_queue_count(
        bus: &dyn Bus,
        admin: &mut Admin,
        opts: CtrlOptions,
    ) -> Result<u16, NvmeError> {
        let cqe = admin.execute(
            bus,
            Sqe::set_num_queues(opts.io_queues),
            opts.admin_timeout,
            "set features (number of queues)",
        )?;
        let nsq = (cqe.result & 0xffff) as u16 + 1;
        let ncq = (cqe.result >> 16) as u16 + 1;
        Ok(opts.io_queues.min(nsq).min(ncq))
    }

    fn admin(&self) -> MutexGuard<'_, Admin> {
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The admin queue, unless the controller is failed (then nothing is sent to it).
    fn live_admin(&self) -> Result<MutexGuard<'_, Admin>, NvmeError> {
        let a = self.admin();
        match self.failed_error() {
            Some(e) => Err(e),
            None => Ok(a),
        }
    }

    /// Why the controller is failed for good, if it is.
    pub fn failed(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// The error every call on a failed controller returns.
    pub fn failed_error(&self) -> Option<NvmeError> {
        self.failed().map(|reason| NvmeError::Failed {
            reason: reason.to_string(),
        })
    }

    /// Marks the controller failed for good (the first reason is kept): it could not be
    /// confirmed stopped, so buffers of commands it holds must never be reused.
    pub fn mark_failed(&self, reason: String) {
        let _ = self.failed.set(reason);
    }

    /// Counts buffers a queue pair leaked because the controller is failed.
    pub fn note_leaked(&self, buffers: u64, bytes: u64) {
        self.leaked_buffers.fetch_add(buffers, Ordering::Relaxed);
        self.leaked_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn leaked(&self) -> Leaked {
        Leaked {
            buffers: self.leaked_buffers.load(Ordering::Relaxed),
            bytes: self.leaked_bytes.load(Ordering::Relaxed),
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// True when `len` bytes at `addr` lie in DMA-mapped memory.
    pub fn is_dma(&self, addr: u64, len: usize) -> bool {
        let (base, alen) = self.arena;
        addr >= base && addr + len as u64 <= base + alen as u64
    }

    pub fn take_qid(&self) -> Option<u16> {
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
    }

    pub fn give_qid(&self, qid: u16) {
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(qid);
    }

    /// Creates I/O queue pair `qp` on the controller (completion queue first).
    pub fn create_io_queue(&self, qp: &QueuePair) -> Result<(), NvmeError> {
        let mut a = self.live_admin()?;
        let t = self.opts.admin_timeout;
        a.execute(
            &*self.bus,
            Sqe::create_cq(qp.qid, qp.entries, qp.cq_iova()),
            t,
            "create I/O completion queue",
        )?;
        if let Err(e) = a.execute(
            &*self.bus,
            Sqe::create_sq(qp.qid, qp.entries, qp.sq_iova(), qp.qid),
            t,
            "create I/O submission queue",
        ) {
            let _ = a.execute(
                &*self.bus,
                Sqe::delete_queue(admin::DELETE_CQ, qp.qid),
                t,
                "delete I/O completion queue",
            );
            return Err(e);
        }
        Ok(())
    }

    /// Deletes I/O queue pair `qid` (submission queue first, which aborts what is in it).
    pub fn delete_io_queue(&self, qid: u16) -> Result<(), NvmeError> {
        let mut a = self.live_admin()?;
        let t = self.opts.admin_timeout;
        a.execute(
            &*self.bus,
            Sqe::delete_queue(admin::DELETE_SQ, qid),
            t,
            "delete I/O submission queue",
        )?;
        a.execute(
            &*self.bus,
            Sqe::delete_queue(admin::DELETE_CQ, qid),
            t,
            "delete I/O completion queue",
        )?;
        Ok(())
    }

    /// Asks the controller to abort command `cid` of queue `sqid`. Ok(true) when it says it did.
    pub fn abort(&self, sqid: u16, cid: u16) -> Result<bool, NvmeError> {
        let cqe = self.live_admin()?.execute(
            &*self.bus,
            Sqe::abort(sqid, cid),
            self.opts.admin_timeout,
            "abort",
        )?;
        Ok(cqe.result & 1 == 0)
    }

    /// Resets the controller (disable, enable, queue count) and invalidates every I/O queue
    /// created before, which re-create themselves on their next call.
    ///
    /// Queue pairs hand the buffers of commands lost in the reset back only when the controller
    /// confirmed it stopped (CSTS.RDY=0). When it does not within CAP.TO, it is marked failed
    /// (before the generation moves, so every queue pair sees it when it notices the reset),
    /// and this returns [`NvmeError::Failed`].
    pub fn reset(&self, seen_generation: u64) -> Result<(), NvmeError> {
        let mut a = self.live_admin()?;
        if self.generation() != seen_generation {
            // Another queue pair reset the controller while this one waited for the lock.
            return Ok(());
        }
        let result = match disable(&*self.bus, &self.info.cap) {
            Ok(()) => program_and_enable(&*self.bus, &self.info.cap, &mut a)
                .and_then(|()| Self::set_queue_count(&*self.bus, &mut a, self.opts).map(|_| ())),
            Err(e) => {
                self.mark_failed(format!(
                    "a reset could not confirm it stopped ({e}); it may still write to the \
                     buffers of commands it held, which are leaked"
                ));
                Err(self.failed_error().unwrap_or(e))
            }
        };
        self.generation.fetch_add(1, Ordering::AcqRel);
        result
    }

    /// Identify controller again, as a health check after a reset (returns the serial number).
    pub fn identify_serial(&self) -> Result<String, NvmeError> {
        let mut a = self.live_admin()?;
        a.page.zero();
        let iova = a.page.iova(0);
        a.execute(
            &*self.bus,
            Sqe::identify(CNS_CONTROLLER, 0, iova),
            self.opts.admin_timeout,
            "identify controller",
        )?;
        Ok(ascii(&a.page.bytes(4, 20)))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let bus = &*self.bus;
        let cap = self.info.cap;
        let cc = bus.read32(regs::CC);
        if cc != u32::MAX && cc & regs::CC_EN != 0 {
            bus.write32(regs::CC, (cc & !regs::CC_SHN_MASK) | regs::CC_SHN_NORMAL);
            let to = Duration::from_millis(cap.timeout_ms.max(500));
            let _ = wait_csts(
                bus,
                regs::CSTS_SHST_MASK,
                regs::CSTS_SHST_DONE,
                to,
                "shutdown (CSTS.SHST)",
            );
            disable_quietly(bus, &cap);
        }
        bus.unmap_dma(self.arena.0, self.arena.1);
    }
}
