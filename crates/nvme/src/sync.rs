//! The atomics and fences under the queue pair's orderings: `std`'s, or under `--cfg loom`
//! (scripts/loom.sh) the loom model checker's, so `qpair_loom` checks the code that ships.

#[cfg(not(loom))]
pub use std::sync::atomic;

#[cfg(loom)]
pub use loom::sync::atomic;
