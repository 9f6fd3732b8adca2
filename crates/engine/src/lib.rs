//! kura's direct I/O engine.
//!
//! Everything in kura stands on one seam, [`BlockDevice`]: a block device with NVMe-style
//! queue-pair semantics (submit a batch, ring the doorbell, poll completions that may come back
//! out of order). This crate owns that seam, the DMA buffer pool its data moves in
//! ([`buffer`]), the spec strings that name devices ([`spec`]) and the registry of their kinds
//! ([`registry`], [`open()`]), the real backends
//! ([`backend`]) and the fault injector the upper layers' crash tests use ([`fault`]).

#[allow(unsafe_code)] // system calls, io_uring, the redirect proxy's shared memory
pub mod backend;
pub mod blocking;
#[allow(unsafe_code)] // the DMA arena: mmap, hugepages, the buddy allocator's raw slices
pub mod buffer;
pub mod conformance;
pub mod crc32c;
pub mod device;
pub mod error;
pub mod fault;
pub mod open;
pub mod poison;
pub mod registry;
pub mod spec;
pub mod split;
pub mod sync;

pub use blocking::BlockingIo;
pub use buffer::{BufferPool, IoBuf, PoolError};
pub use device::{
    Allocation, BlockDevice, Completion, DriveStats, Extent, Geometry, Opcode, Rejected, Request,
};
pub use error::{DeviceError, DeviceResult, Errno, OpenError};
pub use open::{open, open_spec};
pub use registry::{Kind, Registry};
pub use spec::Spec;
