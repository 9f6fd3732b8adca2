//! The "never retry a failed fsync" rule, shared by every backend.
//!
//! Once a flush fails, data that was acknowledged since the last good flush may be gone, and a
//! later successful flush would wrongly suggest otherwise. So the device refuses every mutation
//! from then on; reads keep working so that what is there can still be copied out.

use crate::device::Opcode;
use crate::error::{DeviceError, DeviceResult};

/// Tracks whether a flush has failed on this device.
#[derive(Debug, Default, Clone)]
pub struct FlushPoison {
    cause: Option<String>,
}

impl FlushPoison {
    /// Refuses mutations once poisoned.
    pub fn check(&self, op: Opcode) -> DeviceResult<()> {
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

    pub fn is_poisoned(&self) -> bool {
        self.cause.is_some()
    }
}
