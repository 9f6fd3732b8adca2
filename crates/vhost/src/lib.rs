//! kura-vhost: any kura drive as the disk of an unmodified virtual machine, over vhost-user-blk.
//!
//! QEMU (`-device vhost-user-blk-pci,chardev=...`) or cloud-hypervisor connects to a Unix socket;
//! the guest sees an ordinary virtio-blk disk whose virtqueues this process reads straight out of
//! the guest's shared memory. [`serve`] opens the socket and runs, per export:
//!
//! - a listener thread: one vhost-user connection at a time, accepted again when the hypervisor
//!   reconnects (QEMU's `reconnect=` chardev option), so a VM survives its backend restarting;
//! - per connection, one thread per virtqueue ([`backend`]) decoding requests ([`blk`]);
//! - one driver thread owning the [`BlockDevice`] queue pair ([`driver`]), keeping it at depth
//!   across all virtqueues and answering each virtqueue in order.
//!
//! The protocol, virtqueue and guest-memory handling are the rust-vmm crates' (`vhost`,
//! `vhost-user-backend`, `virtio-queue`, `vm-memory`); this crate owns the virtio-blk semantics
//! and the mapping onto kura's device interface.
//!
//! Read and write data move in place in guest memory when a request's data is one aligned
//! descriptor ([`zerocopy`]; `VhostOptions::zero_copy`), else through a pool buffer.

// Denied, not forbidden: `zerocopy::borrow` hands guest memory to the engine, the one unsafe call.
#![deny(unsafe_code)]

mod backend;
pub mod blk;
mod driver;
mod zerocopy;

use backend::Backend;
use driver::{QueueOrder, ToDriver};
use kura_engine::{BlockDevice, DriveStats};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

/// How long a stopping virtqueue or connection waits for the device to answer what it took.
pub(crate) const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// Errors starting an export.
#[derive(Debug, thiserror::Error)]
pub enum VhostError {
    #[error("{path}: exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("listening on {path}: {reason}")]
    Listen { path: PathBuf, reason: String },
    #[error("the device's block size {0} is not a multiple of virtio-blk's 512-byte sector")]
    BlockSize(u32),
    #[error("{0} virtqueues asked; 1 to 64 are possible")]
    Queues(u16),
    #[error("export {0}: its device thread panicked; the device is lost")]
    DriverLost(String),
    #[error("starting a thread: {0}")]
    Thread(std::io::Error),
}

/// Changes an export's device in place (reopens it at a new size, say) once every request taken
/// before has been answered ([`DeviceSwapper::swap`]).
pub type Swap = Box<dyn FnOnce(&mut Box<dyn BlockDevice>) -> Result<(), SwapError> + Send>;

/// Why a [`Swap`] failed.
#[derive(Debug, Clone)]
pub struct SwapError {
    pub message: String,
    /// The device left in the slot cannot serve: every later request fails.
    pub lost: bool,
}

/// How an export is offered to the guest.
#[derive(Debug, Clone)]
pub struct VhostOptions {
    /// The export's name: thread names, messages, and the GET_ID answer (the guest's
    /// `/sys/block/vdX/serial`), cut to 20 bytes.
    pub name: String,
    /// Offer `VIRTIO_BLK_F_RO` and refuse every mutation.
    pub read_only: bool,
    /// Virtqueues offered; the guest enables up to this many (QEMU: `num-queues`).
    pub num_queues: u16,
    /// Hand a request's data to the device in place in guest memory when it is one aligned
    /// descriptor (else it is copied through a pool buffer, as always with `false`).
    pub zero_copy: bool,
}

impl VhostOptions {
    pub fn new(name: impl Into<String>) -> VhostOptions {
        VhostOptions {
            name: name.into(),
            read_only: false,
            num_queues: 4,
            zero_copy: true,
        }
    }
}

/// A running export. Stop it with [`VhostServer::stop`] to get the device back.
pub struct VhostServer {
    name: String,
    socket: PathBuf,
    stopping: Arc<AtomicBool>,
    connection: Arc<Mutex<Option<ShutdownHandle>>>,
    listener: Option<JoinHandle<()>>,
    driver: Option<JoinHandle<Box<dyn BlockDevice>>>,
    /// The only strong reference: [`DeviceSwapper`]s hold weak ones, so they never keep the
    /// driver from ending.
    to_driver: Arc<Sender<ToDriver>>,
    /// The disk's size in blocks as the next connection is told it.
    num_blocks: Arc<AtomicU64>,
    block_size: u64,
    counters: VhostCounters,
}

/// An export's own counters (requests moved in place vs copied), readable after
/// [`VhostServer::stop`] too ([`VhostServer::counters`]).
#[derive(Clone)]
pub struct VhostCounters {
    zero_copy: bool,
    counters: Arc<zerocopy::Counters>,
}

impl VhostCounters {
    /// The export's layer: `vhost zero_copy=1 zero_copy_reads=… copied_reads=…
    /// zero_copy_writes=… copied_writes=… recopied_writes=…` (depth 0).
    pub fn layer(&self) -> DriveStats {
        self.counters.layer(self.zero_copy)
    }

    /// The export's layer above the device's layers (each one deeper).
    pub fn stack(&self, device: Vec<DriveStats>) -> Vec<DriveStats> {
        let mut out = vec![self.layer()];
        out.extend(device.into_iter().map(|mut l| {
            l.depth += 1;
            l
        }));
        out
    }
}

/// Swaps a running export's device ([`VhostServer::swapper`]).
#[derive(Clone)]
pub struct DeviceSwapper {
    to_driver: Weak<Sender<ToDriver>>,
    num_blocks: Arc<AtomicU64>,
    block_size: u64,
}

impl DeviceSwapper {
    /// Runs `swap` on the export's device on its driver thread once every request taken before
    /// has been answered, and returns the device's new size in bytes. From then on GET_CONFIG
    /// answers the new capacity and requests are checked against it, on the open connection
    /// too. **The guest is not told**: the rust-vmm `vhost` crate (0.18) cannot send
    /// VHOST_USER_BACKEND_CONFIG_CHANGE_MSG (its backend-request proxy neither implements the
    /// message nor exposes its socket), so a frontend learns the size only when it reads the
    /// config again (QEMU does when it realizes the device).
    pub fn swap(&self, swap: Swap) -> Result<u64, String> {
        let to_driver = self.to_driver.upgrade().ok_or("the export is stopping")?;
        let (tx, rx) = mpsc::channel();
        to_driver
            .send(ToDriver::Swap(swap, tx))
            .map_err(|_| "the export's driver has ended".to_string())?;
        drop(to_driver);
        let outcome = rx
            .recv()
            .map_err(|_| "the export's driver ended before answering".to_string())?;
        let blocks = outcome?;
        self.num_blocks.store(blocks, Ordering::Release);
        Ok(blocks * self.block_size)
    }
}

/// Serves `dev` as a vhost-user-blk device on a Unix socket at `socket` (mode 0600; a stale
/// socket is replaced, any other file refused) until [`VhostServer::stop`].
pub fn serve(
    socket: &Path,
    dev: Box<dyn BlockDevice>,
    opts: VhostOptions,
) -> Result<VhostServer, VhostError> {
    let geo = dev.geometry();
    if geo.block_size < 512 || !geo.block_size.is_multiple_of(512) {
        return Err(VhostError::BlockSize(geo.block_size));
    }
    if opts.num_queues == 0 || opts.num_queues > 64 {
        return Err(VhostError::Queues(opts.num_queues));
    }
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        if !meta.file_type().is_socket() {
            return Err(VhostError::NotASocket {
                path: socket.to_path_buf(),
            });
        }
    }
    let listen_err = |reason: String| VhostError::Listen {
        path: socket.to_path_buf(),
        reason,
    };
    let mut listener = Listener::new(socket, true).map_err(|e| listen_err(e.to_string()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| listen_err(e.to_string()))?;
    let shape = blk::Shape::new(&geo, opts.read_only, opts.num_queues);
    let num_blocks = Arc::new(AtomicU64::new(geo.num_blocks));
    let counters = VhostCounters {
        zero_copy: opts.zero_copy,
        counters: Arc::new(zerocopy::Counters::default()),
    };
    let zero_copy = driver::ZeroCopy::new(opts.zero_copy, counters.counters.clone());
    let (to_driver, rx) = mpsc::channel();
    let driver = {
        let zero_copy = zero_copy.clone();
        std::thread::Builder::new()
            .name(format!("vhost-{}-dev", opts.name))
            .spawn(move || driver::run(dev, rx, zero_copy))
            .map_err(VhostError::Thread)?
    };
    let orders: Vec<Arc<QueueOrder>> = (0..opts.num_queues)
        .map(|_| Arc::new(QueueOrder::default()))
        .collect();
    let stopping = Arc::new(AtomicBool::new(false));
    let connection = Arc::new(Mutex::new(None));
    let id = blk::id_bytes(&opts.name);
    let listener_thread = {
        let (stopping, connection, to_driver, num_blocks) = (
            stopping.clone(),
            connection.clone(),
            to_driver.clone(),
            num_blocks.clone(),
        );
        let name = opts.name.clone();
        std::thread::Builder::new()
            .name(format!("vhost-{}", opts.name))
            .spawn(move || {
                while !stopping.load(Ordering::SeqCst) {
                    let backend = Backend::new(
                        shape,
                        num_blocks.clone(),
                        id,
                        to_driver.clone(),
                        orders.clone(),
                        zero_copy.clone(),
                        geo.buffer_alignment,
                    );
                    let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
                    let mut daemon = match VhostUserDaemon::new(name.clone(), backend, memory) {
                        Ok(d) => d,
                        Err(e) => {
                            eprintln!("kura vhost: export {name}: {e}");
                            return;
                        }
                    };
                    if let Err(e) = daemon.start(&mut listener) {
                        eprintln!("kura vhost: export {name}: accepting a connection: {e}");
                        return;
                    }
                    *connection.lock().unwrap_or_else(PoisonError::into_inner) =
                        daemon.shutdown_handle();
                    // A stop that came while accepting finds the handle only after this point.
                    if stopping.load(Ordering::SeqCst) {
                        daemon.request_shutdown();
                    } else {
                        eprintln!("kura vhost: export {name}: hypervisor connected");
                    }
                    let ended = daemon.wait();
                    *connection.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    if !stopping.load(Ordering::SeqCst) {
                        match ended {
                            Ok(())
                            | Err(vhost_user_backend::Error::HandleRequest(
                                vhost::vhost_user::Error::Disconnected,
                            )) => eprintln!("kura vhost: export {name}: hypervisor disconnected"),
                            Err(e) => eprintln!("kura vhost: export {name}: connection ended: {e}"),
                        }
                    }
                    // Requests already taken from the rings are answered before the next
                    // connection sets the rings up again.
                    for order in &orders {
                        order.wait_idle(DRAIN_WAIT);
                    }
                }
            })
            .map_err(VhostError::Thread)?
    };
    Ok(VhostServer {
        name: opts.name,
        socket: socket.to_path_buf(),
        stopping,
        connection,
        listener: Some(listener_thread),
        driver: Some(driver),
        to_driver: Arc::new(to_driver),
        num_blocks,
        block_size: u64::from(geo.block_size),
        counters,
    })
}

impl VhostServer {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A handle that changes the export's device while it serves ([`DeviceSwapper::swap`]).
    pub fn swapper(&self) -> DeviceSwapper {
        DeviceSwapper {
            to_driver: Arc::downgrade(&self.to_driver),
            num_blocks: self.num_blocks.clone(),
            block_size: self.block_size,
        }
    }

    /// The export's own layer (`vhost`, [`VhostCounters::layer`]) then every layer's counters
    /// of the device stack one deeper, or only the export's when the driver does not answer
    /// within `wait`.
    pub fn stats(&self, wait: Duration) -> Vec<DriveStats> {
        let (tx, rx) = mpsc::channel();
        if self.to_driver.send(ToDriver::Stats(tx)).is_err() {
            return vec![self.counters.layer()];
        }
        self.counters
            .stack(rx.recv_timeout(wait).unwrap_or_default())
    }

    /// The export's own counters, a handle that outlives [`VhostServer::stop`].
    pub fn counters(&self) -> VhostCounters {
        self.counters.clone()
    }

    /// Closes the connection and the socket, lets every request taken from the virtqueues
    /// finish, and hands the device back (not flushed: the caller decides).
    pub fn stop(self) -> Result<Box<dyn BlockDevice>, VhostError> {
        let VhostServer {
            name,
            socket,
            stopping,
            connection,
            listener,
            driver,
            to_driver,
            num_blocks: _,
            block_size: _,
            counters: _,
        } = self;
        stopping.store(true, Ordering::SeqCst);
        if let Some(conn) = connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            conn.shutdown();
        }
        // Wakes a listener blocked in accept; it sees `stopping` and closes what it accepted.
        let _ = UnixStream::connect(&socket);
        if let Some(listener) = listener {
            let _ = listener.join();
        }
        let _ = std::fs::remove_file(&socket);
        // The driver stops once every sender is gone and every request is answered.
        drop(to_driver);
        match driver.map(JoinHandle::join) {
            Some(Ok(dev)) => Ok(dev),
            _ => Err(VhostError::DriverLost(name)),
        }
    }
}
