//! Errors of the NVMe driver outside the data path: bring-up, admin commands, VFIO, shutdown.
//!
//! Data-path failures reach callers as the engine's [`DeviceError`]; this type carries the
//! controller-level story (which register wait timed out, which admin command failed with which
//! status) and converts into [`OpenError`]/[`DeviceError`] at the crate's edge.

use crate::status::NvmeStatus;
use kura_engine::{DeviceError, Errno, OpenError};
use std::time::Duration;

/// Why the controller could not be brought up, driven or shut down.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NvmeError {
    /// A bounded wait on a register or a command ran out.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },
    /// Register reads return all ones: the device left the bus (surprise removal, dead link).
    #[error("controller vanished: registers read all ones")]
    Vanished,
    /// CSTS.CFS is set: the controller reports a fatal error.
    #[error("controller fatal status (CSTS.CFS) while {during}")]
    Fatal { during: String },
    /// An admin command completed with an error status.
    #[error("admin command {what} failed: {status}")]
    Admin {
        what: &'static str,
        status: NvmeStatus,
    },
    /// The controller lacks something the driver needs.
    #[error("controller not usable: {0}")]
    Unsupported(String),
    /// The controller is failed for good: it could not be confirmed stopped (a reset saw no
    /// CSTS.RDY=0 within CAP.TO, or it vanished), so buffers of commands it held were leaked
    /// rather than reused, and nothing more is sent to it. Open the device again to retry.
    #[error("controller failed: {reason}")]
    Failed { reason: String },
    /// A VFIO or memory-mapping system call failed.
    #[error("{what}: {errno}")]
    Os { what: String, errno: Errno },
    /// Bad arguments from the caller (spec options, addresses).
    #[error("{0}")]
    Invalid(String),
}

impl NvmeError {
    pub(crate) fn os(what: impl Into<String>) -> Self {
        NvmeError::Os {
            what: what.into(),
            errno: Errno::last(),
        }
    }
}

impl From<NvmeError> for DeviceError {
    fn from(e: NvmeError) -> Self {
        DeviceError::Offline {
            reason: e.to_string(),
        }
    }
}

impl From<NvmeError> for OpenError {
    fn from(e: NvmeError) -> Self {
        match e {
            NvmeError::Os { what, errno } => OpenError::Os { path: what, errno },
            NvmeError::Invalid(m) => OpenError::Invalid(m),
            NvmeError::Unsupported(why) => OpenError::Unavailable {
                backend: "nvme",
                feature: "controller".into(),
                why,
            },
            other => OpenError::Device(other.into()),
        }
    }
}
