//! Not built yet: this backend's open reports that it is unavailable.

use crate::queue::NvmeQueue;
use kura_engine::{OpenError, Spec};

/// Refuses with a typed error naming what is missing.
pub fn open(spec: &Spec) -> Result<NvmeQueue, OpenError> {
    Err(OpenError::Unavailable {
        backend: "pt",
        feature: spec.to_string(),
        why: "not implemented in this build".into(),
    })
}
