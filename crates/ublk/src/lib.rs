//! kura's ublk server: a kura [`BlockDevice`] as a Linux block device `/dev/ublkbN`, served
//! through the kernel's io_uring user-space block driver (`ublk_drv`, Linux 6.0+).
//!
//! [`UblkDevice::start`] creates the device on `/dev/ublk-control` (`ADD_DEV`, `SET_PARAMS`
//! from the kura device's geometry, `START_DEV`), or, when a device of the requested id was
//! left quiesced by a killed server with user recovery, takes it over (`START_USER_RECOVERY`,
//! `END_USER_RECOVERY`): the requests the kernel held meanwhile are reissued to the new server.
//! Each of the device's queues (the kernel's hardware queues: requests from a CPU go to the
//! queue mapped to it) is served by a thread of its own ([`queue`]), and all of them feed the one
//! thread that drives the kura device, a single queue pair ([`driver`]). [`UblkDevice::stop`]
//! removes the block device (the kernel writes back and drains it through the running queues
//! first), joins the threads and deletes the device, handing the kura device back for its final
//! flush. [`Resizer::resize`] changes a live device's size (`UPDATE_SIZE`, Linux 6.16+).
//!
//! The ABI is encoded in [`sys`], the control path is [`ctrl`].

pub mod ctrl;
pub mod driver;
pub mod queue;
pub mod sys;

use driver::{QueueLink, Swap, ToDriver};
use kura_engine::device::BlockDevice;
use queue::{DriverEnds, QueueCounters, QueueSetup};
use std::fs::{File, OpenOptions};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use ctrl::{Control, CONTROL_PATH};

/// Why a ublk device could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UblkError {
    #[error(
        "no ublk driver: /dev/ublk-control is missing (modprobe ublk_drv; Linux 6.0 or later)"
    )]
    NoDriver,
    #[error("ublk {what} failed: {}", std::io::Error::from_raw_os_error(*errno))]
    Command { what: &'static str, errno: i32 },
    #[error("{what}: {}", std::io::Error::from_raw_os_error(*errno))]
    Os { what: &'static str, errno: i32 },
    #[error(
        "ublk device {dev_id} is in use (state {state}, server pid {pid}); stop that server first"
    )]
    InUse { dev_id: u32, state: u16, pid: i32 },
    #[error("ublk device {dev_id} exists without user recovery; delete it or pick another id")]
    NotRecoverable { dev_id: u32 },
    #[error(
        "this kernel's ublk driver cannot change a live device's size (no UBLK_F_UPDATE_SIZE; \
         Linux 6.16 or later has it); stop the export and serve it again to see the new size"
    )]
    NoUpdateSize,
    #[error("the ublk export has stopped")]
    Stopped,
    #[error("kura device: {0}")]
    Device(String),
    #[error("a ublk queue or driver thread panicked")]
    QueuePanicked,
}

impl UblkError {
    fn os(what: &'static str, e: &std::io::Error) -> Self {
        UblkError::Os {
            what,
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// How to create the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UblkConfig {
    /// Device id (`/dev/ublkbN`), or any free one. A device of this id left behind by a killed
    /// server with user recovery is recovered instead of created (with the queues it had).
    pub dev_id: Option<u32>,
    /// Queues, each served by its own thread; the kernel caps them at the number of CPUs.
    pub queues: u16,
    /// Tags of each queue; capped by the kura device's queue depth.
    pub queue_depth: u16,
    /// Largest request in bytes; capped by the kura device's largest transfer.
    pub max_io_bytes: u32,
    pub read_only: bool,
    /// Ask the driver to keep the device (and hold its I/O) when this server dies, so that a
    /// restarted one can recover it.
    pub user_recovery: bool,
}

impl Default for UblkConfig {
    fn default() -> Self {
        UblkConfig {
            dev_id: None,
            queues: 1,
            queue_depth: 128,
            max_io_bytes: 512 << 10,
            read_only: false,
            user_recovery: true,
        }
    }
}

type QueueResult = (QueueCounters, Result<(), UblkError>);

/// What a stop hands back: the kura device (unless a thread panicked with it), each queue's
/// counters, and whether every step of the stop succeeded.
pub type Stopped = (
    Option<Box<dyn BlockDevice>>,
    Vec<QueueCounters>,
    Result<(), UblkError>,
);

/// The way to the driver thread, shared with [`Resizer`]s; `None` once the device stops, so a
/// resizer left in a control socket does not keep the driver (and the stop) waiting.
type DriverSender = Arc<Mutex<Option<mpsc::Sender<ToDriver>>>>;

/// A served ublk device.
pub struct UblkDevice {
    ctrl: Control,
    dev_id: u32,
    recovered: bool,
    features: u64,
    stop: Arc<AtomicBool>,
    /// Empty once stopped.
    queues: Vec<JoinHandle<QueueResult>>,
    driver: Option<JoinHandle<Box<dyn BlockDevice>>>,
    to_driver: DriverSender,
}

/// How long a restarted server waits for the driver to notice the old one died.
const RECOVERY_WAIT: Duration = Duration::from_secs(30);

impl UblkDevice {
    /// Creates (or recovers) the device and serves it from new threads.
    pub fn start(dev: Box<dyn BlockDevice>, cfg: &UblkConfig) -> Result<UblkDevice, UblkError> {
        let mut ctrl = Control::open()?;
        let features = ctrl.features()?;
        let geo = dev.geometry();
        let existing = match cfg.dev_id {
            Some(id) => ctrl.dev_info(id)?,
            None => None,
        };
        let (info, recovered) = match existing {
            Some(info) => {
                if info.flags & sys::F_USER_RECOVERY == 0 {
                    return Err(UblkError::NotRecoverable {
                        dev_id: info.dev_id,
                    });
                }
                if info.state == sys::S_DEV_LIVE && pid_alive(info.ublksrv_pid) {
                    return Err(UblkError::InUse {
                        dev_id: info.dev_id,
                        state: info.state,
                        pid: info.ublksrv_pid,
                    });
                }
                wait_recoverable(&mut ctrl, info.dev_id)?;
                (info, true)
            }
            None => {
                let depth = cfg
                    .queue_depth
                    .clamp(1, sys::MAX_QUEUE_DEPTH)
                    .min(geo.queue_depth.min(u32::from(sys::MAX_QUEUE_DEPTH)) as u16);
                let max_io = (cfg.max_io_bytes.min(geo.max_transfer) / 4096 * 4096)
                    .max(geo.block_size.max(4096));
                let mut flags = sys::F_CMD_IOCTL_ENCODE | (features & sys::F_UPDATE_SIZE);
                if cfg.user_recovery {
                    flags |= sys::F_USER_RECOVERY | sys::F_USER_RECOVERY_REISSUE;
                }
                let want = sys::DevInfo {
                    nr_hw_queues: cfg.queues.clamp(1, sys::MAX_NR_QUEUES),
                    queue_depth: depth,
                    max_io_buf_bytes: max_io,
                    dev_id: cfg.dev_id.unwrap_or(u32::MAX),
                    ublksrv_pid: -1,
                    flags,
                    ..Default::default()
                };
                let info = ctrl.add_dev(&want)?;
                if let Err(e) = ctrl.set_params(info.dev_id, &params(&geo, &info, cfg.read_only)) {
                    let _ = ctrl.del_dev(info.dev_id);
                    return Err(e);
                }
                (info, false)
            }
        };
        let dev_id = info.dev_id;
        let undo = |ctrl: &mut Control| {
            if !recovered {
                let _ = ctrl.del_dev(dev_id);
            }
        };
        let (mut served, ready_rx) = match Self::spawn(dev, &info, cfg.read_only) {
            Ok(s) => s,
            Err(e) => {
                undo(&mut ctrl);
                return Err(e);
            }
        };
        let mut ready = Ok(());
        for _ in 0..served.queues.len() {
            let r = ready_rx.recv().unwrap_or(Err(UblkError::QueuePanicked));
            ready = ready.and(r);
        }
        let pid = std::process::id() as i32;
        let started = ready.and_then(|()| {
            if recovered {
                ctrl.end_user_recovery(dev_id, pid)
            } else {
                ctrl.start_dev(dev_id, pid)
            }
        });
        if let Err(e) = started {
            served.stop.store(true, Ordering::Release);
            let _ = served.join();
            undo(&mut ctrl);
            return Err(e);
        }
        Ok(UblkDevice {
            ctrl,
            dev_id,
            recovered,
            features,
            stop: served.stop.clone(),
            queues: std::mem::take(&mut served.queues),
            driver: served.driver.take(),
            to_driver: served.to_driver.clone(),
        })
    }

    /// Opens `/dev/ublkcN` and starts the driver thread and a thread per queue; each queue
    /// reports on the returned channel once it has fetched its tags.
    fn spawn(
        dev: Box<dyn BlockDevice>,
        info: &sys::DevInfo,
        read_only: bool,
    ) -> Result<(Threads, mpsc::Receiver<Result<(), UblkError>>), UblkError> {
        let dev_id = info.dev_id;
        let file = Arc::new(open_char(dev_id)?);
        let geo = dev.geometry();
        let blocks = Arc::new(AtomicU64::new(geo.num_blocks));
        let nr = info.nr_hw_queues.max(1);
        let mut links = Vec::new();
        let mut ends = Vec::new();
        let (to_driver, rx) = mpsc::channel();
        for _ in 0..nr {
            let wake = Arc::new(eventfd()?);
            let (done_tx, done_rx) = mpsc::channel();
            links.push(QueueLink {
                done: done_tx,
                wake: wake.clone(),
            });
            ends.push(DriverEnds {
                to_driver: to_driver.clone(),
                done: done_rx,
                wake,
            });
        }
        let b2 = blocks.clone();
        let driver = std::thread::Builder::new()
            .name(format!("ublk{dev_id}drv"))
            .spawn(move || driver::run(dev, rx, links, b2))
            .map_err(|e| UblkError::os("starting the driver thread", &e))?;
        let mut threads = Threads {
            stop: Arc::new(AtomicBool::new(false)),
            queues: Vec::new(),
            driver: Some(driver),
            to_driver: Arc::new(Mutex::new(Some(to_driver))),
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        for (q_id, ends) in (0..nr).zip(ends) {
            let setup = QueueSetup {
                dev_id,
                q_id,
                depth: info.queue_depth,
                max_io: info.max_io_buf_bytes,
                read_only,
                geo,
                blocks: blocks.clone(),
            };
            let (file, ready, stop) = (file.clone(), ready_tx.clone(), threads.stop.clone());
            match std::thread::Builder::new()
                .name(format!("ublk{dev_id}q{q_id}"))
                .spawn(move || queue::run(setup, file, ends, ready, stop))
            {
                Ok(q) => threads.queues.push(q),
                Err(e) => {
                    threads.stop.store(true, Ordering::Release);
                    let _ = threads.join();
                    return Err(UblkError::os("starting a queue thread", &e));
                }
            }
        }
        Ok((threads, ready_rx))
    }

    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// `/dev/ublkbN`.
    pub fn block_path(&self) -> String {
        format!("/dev/ublkb{}", self.dev_id)
    }

    /// True when this server took over a device a killed one left behind.
    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// The `UBLK_F_*` flags the kernel's driver supports (`GET_FEATURES`; 0 before Linux 6.5).
    pub fn driver_features(&self) -> u64 {
        self.features
    }

    /// The number of queues served.
    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    /// A handle that resizes this device while it serves, from any thread.
    pub fn resizer(&self) -> Resizer {
        Resizer {
            dev_id: self.dev_id,
            features: self.features,
            to_driver: self.to_driver.clone(),
        }
    }

    /// Removes the block device once the kernel has written back and drained it, waits for the
    /// queues and the driver to finish, deletes the device and hands back the kura device with
    /// each queue's counters. The kura device comes back even when a step fails (unless the
    /// driver thread panicked with it), so it can still be flushed.
    pub fn stop(mut self) -> Stopped {
        self.teardown()
    }

    fn teardown(&mut self) -> Stopped {
        if self.driver.is_none() {
            return (None, Vec::new(), Ok(()));
        }
        // With user recovery the driver fails what reaches it once STOP_DEV has begun, so the
        // block device's page cache is written back and flushed while the queues still serve.
        let synced = File::open(self.block_path())
            .and_then(|f| f.sync_all())
            .map_err(|e| UblkError::os("writing back /dev/ublkbN before stopping it", &e));
        let stopped = self.ctrl.stop_dev(self.dev_id);
        self.stop.store(true, Ordering::Release);
        let mut threads = Threads {
            stop: self.stop.clone(),
            queues: std::mem::take(&mut self.queues),
            driver: self.driver.take(),
            to_driver: self.to_driver.clone(),
        };
        let (dev, counters, served) = threads.join();
        let deleted = self.ctrl.del_dev(self.dev_id);
        (dev, counters, synced.and(stopped).and(served).and(deleted))
    }
}

/// The threads serving one device.
struct Threads {
    stop: Arc<AtomicBool>,
    queues: Vec<JoinHandle<QueueResult>>,
    driver: Option<JoinHandle<Box<dyn BlockDevice>>>,
    to_driver: DriverSender,
}

impl Threads {
    /// Joins the queues (they return once `stop` is set, or every tag was aborted, and nothing
    /// of theirs is in flight), then the driver, which ends when the last sender is gone.
    fn join(&mut self) -> Stopped {
        let mut counters = Vec::new();
        let mut res = Ok(());
        for q in self.queues.drain(..) {
            match q.join() {
                Ok((c, r)) => {
                    counters.push(c);
                    res = res.and(r);
                }
                Err(_) => res = res.and(Err(UblkError::QueuePanicked)),
            }
        }
        drop(
            self.to_driver
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let dev = match self.driver.take().map(JoinHandle::join) {
            Some(Ok(dev)) => Some(dev),
            _ => {
                res = res.and(Err(UblkError::QueuePanicked));
                None
            }
        };
        (dev, counters, res)
    }
}

/// Changes the size of a served device: reopens its kura device on the driver thread (between
/// two requests, once those in flight are done) and tells the kernel the new capacity.
#[derive(Clone)]
pub struct Resizer {
    dev_id: u32,
    features: u64,
    to_driver: DriverSender,
}

impl Resizer {
    /// `Err(NoUpdateSize)` where the kernel cannot change a live device's size; checked before
    /// anything is changed.
    pub fn supported(&self) -> Result<(), UblkError> {
        if self.features & sys::F_UPDATE_SIZE == 0 {
            return Err(UblkError::NoUpdateSize);
        }
        Ok(())
    }

    /// Runs `swap` on the idle kura device (it reopens it at its new size), then sets the
    /// device's capacity to the new one; returns it in bytes.
    pub fn resize(&self, swap: Swap) -> Result<u64, UblkError> {
        self.supported()?;
        let (reply, answer) = mpsc::channel();
        {
            let guard = self
                .to_driver
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let tx = guard.as_ref().ok_or(UblkError::Stopped)?;
            tx.send(ToDriver::Swap(swap, reply))
                .map_err(|_| UblkError::Stopped)?;
        }
        let bytes = answer
            .recv()
            .map_err(|_| UblkError::Stopped)?
            .map_err(UblkError::Device)?;
        Control::open()?.update_size(self.dev_id, bytes >> 9)?;
        Ok(bytes)
    }
}

/// A device dropped without [`UblkDevice::stop`] (its server bailed out on another error) is
/// still removed and deleted, so no /dev/ublkbN is left behind without a server; its kura device
/// is flushed by being dropped, as any device is.
impl Drop for UblkDevice {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// The parameters for a kura device of geometry `geo`: its block size, capacity, the request
/// size limit, a volatile cache with FUA (kura devices buffer writes until a flush), and
/// discard/write-zeroes up to the largest request per command.
pub fn params(
    geo: &kura_engine::device::Geometry,
    info: &sys::DevInfo,
    read_only: bool,
) -> sys::Params {
    let bs_shift = geo.block_size.trailing_zeros() as u8;
    let mut attrs = 0;
    if read_only {
        attrs |= sys::ATTR_READ_ONLY;
    } else {
        attrs |= sys::ATTR_VOLATILE_CACHE | sys::ATTR_FUA;
    }
    let max_sectors = info.max_io_buf_bytes >> 9;
    sys::Params {
        basic: sys::BasicParams {
            attrs,
            logical_bs_shift: bs_shift,
            physical_bs_shift: bs_shift.max(12),
            io_opt_shift: bs_shift.max(12),
            io_min_shift: bs_shift,
            max_sectors,
            dev_sectors: geo.capacity_bytes() >> 9,
        },
        discard: (!read_only).then_some(sys::DiscardParams {
            discard_granularity: geo.block_size,
            max_discard_sectors: MAX_RANGE_SECTORS,
            max_write_zeroes_sectors: MAX_RANGE_SECTORS,
        }),
    }
}

/// Largest discard or write-zeroes request: 1 GiB, a multiple of every block size.
const MAX_RANGE_SECTORS: u32 = 1 << 21;

fn pid_alive(pid: i32) -> bool {
    pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Retries `START_USER_RECOVERY` while the driver is still quiescing the dead server's device.
fn wait_recoverable(ctrl: &mut Control, dev_id: u32) -> Result<(), UblkError> {
    let t0 = Instant::now();
    loop {
        match ctrl.start_user_recovery(dev_id) {
            Err(UblkError::Command { errno, .. })
                if errno == libc::EBUSY && t0.elapsed() < RECOVERY_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(100))
            }
            other => return other,
        }
    }
}

/// A non-blocking eventfd: how the driver thread wakes a queue's ring.
#[allow(unsafe_code)] // eventfd(2) and adopting the descriptor it returns
fn eventfd() -> Result<File, UblkError> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(UblkError::os(
            "creating an eventfd",
            &std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: fd is a fresh descriptor owned by nothing else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Opens `/dev/ublkcN`, waiting briefly for udev/devtmpfs to create it.
fn open_char(dev_id: u32) -> Result<File, UblkError> {
    let path = format!("/dev/ublkc{dev_id}");
    let t0 = Instant::now();
    loop {
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => return Ok(f),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && t0.elapsed() < Duration::from_secs(5) =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(UblkError::os("opening /dev/ublkcN", &e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kura_engine::device::Geometry;

    #[test]
    fn params_follow_the_geometry() {
        let geo = Geometry {
            block_size: 512,
            num_blocks: 1 << 17,
            max_transfer: 1 << 20,
            queue_depth: 64,
            buffer_alignment: 4096,
        };
        let info = sys::DevInfo {
            max_io_buf_bytes: 256 << 10,
            ..Default::default()
        };
        let p = params(&geo, &info, false);
        assert_eq!(p.basic.logical_bs_shift, 9);
        assert_eq!(p.basic.max_sectors, 512);
        assert_eq!(p.basic.dev_sectors, 1 << 17);
        assert_eq!(p.basic.attrs, sys::ATTR_VOLATILE_CACHE | sys::ATTR_FUA);
        let d = p.discard.expect("discard on a writable device");
        assert_eq!(d.discard_granularity, 512);
        let ro = params(&geo, &info, true);
        assert_eq!(ro.basic.attrs, sys::ATTR_READ_ONLY);
        assert!(ro.discard.is_none());
    }

    /// A kernel without UPDATE_SIZE (6.12's driver) gets a refusal that names what is missing,
    /// before the swap (which would resize the image) is ever sent.
    #[test]
    fn resize_is_refused_before_anything_changes_without_update_size() {
        let r = Resizer {
            dev_id: 0,
            features: sys::F_USER_RECOVERY,
            to_driver: Arc::new(Mutex::new(None)),
        };
        let ran = Arc::new(AtomicBool::new(false));
        let ran2 = ran.clone();
        let err = r
            .resize(Box::new(move |_| {
                ran2.store(true, Ordering::SeqCst);
                Ok(())
            }))
            .unwrap_err();
        assert_eq!(err, UblkError::NoUpdateSize);
        assert!(err.to_string().contains("UBLK_F_UPDATE_SIZE"));
        assert!(!ran.load(Ordering::SeqCst));
        // With the feature, a stopped export says so.
        let r = Resizer {
            features: sys::F_UPDATE_SIZE,
            ..r
        };
        assert_eq!(
            r.resize(Box::new(|_| Ok(()))).unwrap_err(),
            UblkError::Stopped
        );
    }

    /// On hosts without the driver (this one, CI's) the control device's absence is a clear
    /// error; where the driver is loaded, an unused id is answered "no such device". The guest
    /// test (crates/cli/tests/guest_ublk.rs) serves a real device.
    #[test]
    fn control_device_answers_or_is_reported_missing() {
        match Control::open() {
            Ok(mut c) => assert_eq!(c.dev_info(u32::MAX - 1).ok().flatten(), None),
            Err(e) => {
                assert_eq!(e, UblkError::NoDriver);
                assert!(e.to_string().contains("modprobe ublk_drv"));
                eprintln!("kura-ublk: no /dev/ublk-control on this host; only the missing-driver path ran here");
            }
        }
    }
}
