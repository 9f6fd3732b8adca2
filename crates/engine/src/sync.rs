//! The synchronisation primitives under the engine's concurrent protocols — the redirect
//! channel ([`crate::backend::redirect::channel`]) and the buffer pool ([`crate::buffer`]).
//!
//! Normal builds get `std`'s. Under `--cfg loom` (scripts/loom.sh) they are the loom model
//! checker's, so the loom tests (`tests/loom_*.rs`) explore every interleaving and every value a
//! weakly ordered load may return *of the code that ships*, not of a copy of it.

#[cfg(not(loom))]
pub use std::sync::{atomic, Arc, Condvar, Mutex, MutexGuard};

#[cfg(loom)]
pub use loom::sync::{atomic, Arc, Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub use std::hint;

#[cfg(loom)]
pub use loom::hint;

/// Memory that one side writes and the other reads once the protocol hands it over; under loom
/// every access is checked against the happens-before order the atomics establish.
#[cfg(loom)]
pub use loom::cell::UnsafeCell;
