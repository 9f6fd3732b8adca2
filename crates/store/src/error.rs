//! The store's one error type.

use crate::format::FormatError;
use kura_engine::DeviceError;
use thiserror::Error;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    /// Stored bytes failed their checks where the store needs them to be valid.
    #[error("corrupt store: {place}: {source}")]
    Corrupt {
        place: String,
        #[source]
        source: FormatError,
    },
    #[error("no valid superblock: copy A: {a}; copy B: {b}")]
    NoSuperblock { a: FormatError, b: FormatError },
    /// The caller's input cannot be stored (key or batch too large, ...).
    #[error("cannot store this: {0}")]
    Refused(FormatError),
    #[error("invalid store options or device: {0}")]
    Invalid(String),
    #[error("the store is full: all {slots} segment slots are in use")]
    Full { slots: u64 },
    /// An earlier log write or flush failed, so what the log holds is unknown; the store takes
    /// no more writes until it is reopened (reads still work).
    #[error("the store stopped taking writes after an earlier failure: {0}")]
    Stopped(String),
}
