//! Typed errors of the engine's device interface.
//!
//! Every error says what failed and where (operation, LBA, path) so the layers above can report it
//! without guessing. The enums are `#[non_exhaustive]`: new backends may add cases.

use crate::device::Opcode;
use std::fmt;

/// The result of one device command or one device-level call.
pub type DeviceResult<T> = Result<T, DeviceError>;

/// An operating-system error number, displayed with its name and message.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The error number of the calling thread's last failed system call.
    pub fn last() -> Self {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }

    /// The error number carried by an `io::Error`, or EIO when it carries none.
    pub fn from_io(err: &std::io::Error) -> Self {
        Errno(err.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Errno({}: {})",
            self.0,
            std::io::Error::from_raw_os_error(self.0)
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (errno {})",
            std::io::Error::from_raw_os_error(self.0),
            self.0
        )
    }
}

/// Why a device refused or failed a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The command names blocks past the end of the device.
    #[error("{op} of {blocks} block(s) at LBA {lba} is out of range: the device has {capacity_blocks} blocks")]
    OutOfRange {
        op: Opcode,
        lba: u64,
        blocks: u64,
        capacity_blocks: u64,
    },
    /// A command of zero blocks; the interface rejects it rather than guess what was meant.
    #[error("{op} at LBA {lba} has length zero")]
    ZeroLength { op: Opcode, lba: u64 },
    /// A buffer address or length does not meet the device's alignment.
    #[error("{what} {value:#x} is not aligned to {required} bytes")]
    Misaligned {
        what: &'static str,
        value: u64,
        required: u64,
    },
    /// A read or write whose buffer is missing or shorter than the blocks it names.
    #[error("{op} of {blocks} block(s) needs a buffer of {need} bytes, got {have}")]
    BadBuffer {
        op: Opcode,
        blocks: u64,
        need: u64,
        have: u64,
    },
    /// Back-pressure: the queue holds `depth` commands already. Poll, then submit again.
    #[error("queue full ({depth} commands in flight)")]
    QueueFull { depth: u32 },
    /// The device (or the system call behind it) failed this command.
    #[error("{op} at LBA {lba} failed: {errno}")]
    Io { op: Opcode, lba: u64, errno: Errno },
    /// A flush failed earlier; data acknowledged since the last good flush may be lost, so the
    /// device refuses writes and flushes from now on (a failed fsync is never retried).
    #[error("device refuses {op}: an earlier flush failed ({cause})")]
    Poisoned { op: Opcode, cause: String },
    /// The device was opened read-only (`ro=1`) and this command would change it.
    #[error("{op} refused: the device is open read-only")]
    ReadOnly { op: Opcode },
    /// The backend cannot perform this command.
    #[error("{backend} does not support {op}")]
    Unsupported { op: Opcode, backend: &'static str },
    /// The device is gone: its proxy died, it was power-cut by a fault injector, or it was closed.
    #[error("device is offline: {reason}")]
    Offline { reason: String },
    /// A blocking helper was called while asynchronous commands were still in flight.
    #[error("blocking call on a queue with {in_flight} asynchronous command(s) in flight")]
    Busy { in_flight: usize },
    /// The buffer pool could not provide a buffer.
    #[error(transparent)]
    Pool(#[from] crate::buffer::PoolError),
}

impl DeviceError {
    /// The errno this error corresponds to, for layers that speak POSIX (FUSE, NBD).
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::OutOfRange { .. } => libc::ENOSPC,
            DeviceError::ZeroLength { .. }
            | DeviceError::Misaligned { .. }
            | DeviceError::BadBuffer { .. } => libc::EINVAL,
            DeviceError::QueueFull { .. } | DeviceError::Busy { .. } => libc::EAGAIN,
            DeviceError::Io { errno, .. } => errno.0,
            DeviceError::Poisoned { .. } | DeviceError::Offline { .. } => libc::EIO,
            DeviceError::Unsupported { .. } => libc::EOPNOTSUPP,
            DeviceError::ReadOnly { .. } => libc::EROFS,
            DeviceError::Pool(_) => libc::ENOMEM,
        }
    }
}

/// Why a device could not be opened from its spec string.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The spec string does not parse or names unknown backends or options.
    #[error("bad device spec: {0}")]
    Spec(#[from] crate::spec::SpecError),
    /// The backing file or device could not be opened or sized.
    #[error("cannot open {path}: {errno}")]
    Os { path: String, errno: Errno },
    /// The backing file exists but is too small for what was asked.
    #[error("{path} holds {actual} bytes, less than one {block_size}-byte block")]
    TooSmall {
        path: String,
        actual: u64,
        block_size: u32,
    },
    /// The kernel refused a feature the spec asked for explicitly.
    #[error("{backend}: {feature} is not available: {why}")]
    Unavailable {
        backend: &'static str,
        feature: String,
        why: String,
    },
    /// Another process holds the image (or the kernel holds the block device).
    #[error("{path} is in use by {holder}; kura lets one process write an image at a time (readers open it with ro=1)")]
    Locked { path: String, holder: String },
    /// A parameter is out of its allowed range.
    #[error("{0}")]
    Invalid(String),
    /// Opening failed at the device level.
    #[error(transparent)]
    Device(#[from] DeviceError),
}
