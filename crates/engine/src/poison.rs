//! The "never retry a failed fsync" rule, shared by every backend.
//!
//! Once a flush fails, data that was acknowledged since the last good flush may be gone, and a
//! later successful flush would wrongly suggest otherwise. So the device refuses every mutation
//! from then on; reads keep working so that what is there can still be copied out.
//!
//! A device opened read-only refuses the commands that change data the same way, from the start
//! (a flush changes nothing, so it is allowed).

use crate::device::Opcode;
use crate::error::{DeviceError, DeviceResult};

/// Tracks whether a flush has failed on this device.
#[derive(Debug, Default, Clone)]
pub struct FlushPoison {
    cause: Option<String>,
    read_only: bool,
}

impl FlushPoison {
    /// The state of a device opened read-only.
    pub fn read_only() -> Self {
        FlushPoison {
            cause: None,
            read_only: true,
        }
    }

    /// Refuses mutations once poisoned, and data changes on a read-only device.
    pub fn check(&self, op: Opcode) -> DeviceResult<()> {
        if self.read_only && !matches!(op, Opcode::Read | Opcode::Flush) {
            return Err(DeviceError::ReadOnly { op });
        }
        match &self.cause {
            Some(cause) if op.is_mutation() => Err(DeviceError::Poisoned {
                op,
                cause: cause.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Call with the outcome of every flush; a failure poisons the device for good.
    pub fn observe(&mut self, op: Opcode, status: &DeviceResult<()>) {
        if let (Opcode::Flush, Err(e)) = (op, status) {
            if self.cause.is_none() && !matches!(e, DeviceError::Poisoned { .. }) {
                self.cause = Some(e.to_string());
            }
        }
    }

    /// Poisons the device for a reason other than a failed flush: a layer that lost track of
    /// whether its writes happened (see `kura_nbd::remote`).
    pub fn poison(&mut self, cause: String) {
        if self.cause.is_none() {
            self.cause = Some(cause);
        }
    }

    pub fn is_poisoned(&self) -> bool {
        self.cause.is_some()
    }
}
