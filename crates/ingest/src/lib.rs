//! Streaming network-to-storage ingest (issue 17, after SNAcc): records arrive as frames on a
//! socket and are stored on a device with an index, durably before they are acknowledged.
//!
//! - [`frame`]: the wire format, every frame with a length and a CRC32C, decoded with bounds
//!   checked before a payload is read (`docs/ingest-protocol.md` §1–§2).
//! - [`session`]: the conversation's rules as a pure state machine (§3–§4).
//! - [`stage`]: the per-record stages (zstd; classify: PPM/PGM, 224x224, nearest centroid).
//! - [`layout`]: the raw-device target's superblocks and index entries (§5–§6).
//! - [`store`]: format, crash recovery and durable batches on any `BlockDevice` (§7–§8).
//! - [`client`]: the sending side, answers collected on their own thread.
//! - [`fstarget`]: an AccelFS target — a file per record, the index in LevelDB (`kura-kv`).
//! - [`net`]: TCP and Unix-socket addresses, listeners, streams; the HMAC challenge.
//! - [`server`]: the server — a reader per connection into bounded pool buffers, one device
//!   thread writing at depth with in-order or out-of-order retirement and group commits.

#![forbid(unsafe_code)]

pub mod client;
pub mod frame;
pub mod fstarget;
pub mod layout;
pub mod net;
pub mod server;
pub mod session;
pub mod stage;
pub mod store;

pub use frame::{Frame, FrameError, FrameHeader, FrameType, Limits};
pub use layout::{Entry, Superblock};
pub use session::{Session, SessionError, Stage, Step};
pub use store::{FormatOptions, NewRecord, Placed, Store, StoreError};
