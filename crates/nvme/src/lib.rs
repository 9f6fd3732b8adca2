//! User-space NVMe for kura (issue 7): a polled NVMe driver that builds commands in its own
//! queues and rings the controller's doorbells itself, over VFIO (`nvme:BDF`) or over an
//! in-process simulated controller (`nvme-sim:SIZE`) for host-side testing.
//!
//! Layers, bottom up: register and entry layouts ([`regs`], [`cmd`], [`status`]), ring and PRP
//! arithmetic ([`ring`], [`prp`]), the hardware path ([`bus`]: registers + DMA mappings, with
//! [`sim`] and [`vfio`] behind it), a queue pair in DMA memory (`qpair`), the controller
//! (bring-up, admin, reset, shutdown: [`ctrl`]) and one I/O queue pair as a
//! [`kura_engine::BlockDevice`] ([`queue`]).

#[allow(unsafe_code)] // registers and DMA memory
pub mod bus;
pub mod cmd;
pub mod ctrl;
pub mod error;
pub mod open;
pub mod pci;
pub mod prp;
#[allow(unsafe_code)] // open/ioctl on the char device, io_uring passthrough SQEs
pub mod pt;
mod qpair;
#[cfg(all(test, loom))]
mod qpair_loom;
#[cfg(all(test, not(loom)))]
#[allow(unsafe_code)] // the test's device thread reads and writes the rings by address
mod qpair_stress;
pub mod queue;
pub mod regs;
pub mod ring;
#[allow(unsafe_code)] // the simulated controller's DMA into host memory
pub mod sim;
pub mod status;
pub mod sync;
#[allow(unsafe_code)] // VFIO ioctls, BAR mmap, DMA mappings
pub mod vfio;

pub use ctrl::{ControllerInfo, CtrlOptions, Leaked, NamespaceInfo};
pub use error::NvmeError;
pub use open::{open_nvme_kind, open_sim, register, NVME_KINDS};
pub use queue::{NvmeQueue, QueueStats};
pub use sim::{SimConfig, SimController};
