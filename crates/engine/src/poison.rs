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
use std::sync::{Arc, OnceLock};

/// Tracks whether a flush has failed on this device. The queue pairs of one device share it
/// ([`FlushPoison::sibling`]): a failed flush on one may have lost writes made through any of
/// them, so all refuse mutations from then on.
#[derive(Debug, Default)]
pub struct FlushPoison {
    cause: Arc<OnceLock<String>>,
    read_only: bool,
}

/// An independent copy: poisoning the clone does not poison the original (use
/// [`FlushPoison::sibling`] to share).
impl Clone for FlushPoison {
    fn clone(&self) -> Self {
        let cause = OnceLock::new();
        if let Some(c) = self.cause.get() {
            let _ = cause.set(c.clone());
        }
        FlushPoison {
            cause: Arc::new(cause),
            read_only: self.read_only,
        }
    }
}

impl FlushPoison {
    /// The state of a device opened read-only.
    pub fn read_only() -> Self {
        FlushPoison {
            cause: Arc::default(),
            read_only: true,
        }
    }

    /// The poison of another queue pair of the same device: a failure observed by either
    /// poisons both.
    pub fn sibling(&self) -> Self {
        FlushPoison {
            cause: Arc::clone(&self.cause),
            read_only: self.read_only,
        }
    }

    /// Refuses mutations once poisoned, and data changes on a read-only device.
    pub fn check(&self, op: Opcode) -> DeviceResult<()> {
        if self.read_only && !matches!(op, Opcode::Read | Opcode::Flush) {
            return Err(DeviceError::ReadOnly { op });
        }
        match self.cause.get() {
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
            if !matches!(e, DeviceError::Poisoned { .. }) {
                let _ = self.cause.set(e.to_string());
            }
        }
    }

    /// Poisons the device for a reason other than a failed flush: a layer that lost track of
    /// whether its writes happened (see `kura_nbd::remote`).
    pub fn poison(&mut self, cause: String) {
        let _ = self.cause.set(cause);
    }

    pub fn is_poisoned(&self) -> bool {
        self.cause.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::FlushPoison;
    use crate::device::Opcode;
    use crate::error::DeviceError;

    #[test]
    fn a_failed_flush_poisons_siblings_but_not_copies() {
        let mut a = FlushPoison::default();
        let b = a.sibling();
        let copy = a.clone();
        let failed = Err(DeviceError::Offline {
            reason: "gone".into(),
        });
        a.observe(Opcode::Flush, &failed);
        assert!(matches!(
            b.check(Opcode::Write),
            Err(DeviceError::Poisoned { .. })
        ));
        assert!(b.check(Opcode::Read).is_ok());
        assert!(copy.check(Opcode::Write).is_ok());
        assert!(!copy.is_poisoned());
    }
}
