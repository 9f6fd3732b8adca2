//! NBD for kura: a server that exports kura devices to any NBD client, and a client that makes a
//! remote export a kura device.
//!
//! - [`protocol`]: the wire format (fixed newstyle handshake, simple replies), pure and bounded;
//! - [`handshake`]: the server's option haggling, over any byte stream;
//! - [`server`]: [`serve`] named [`Export`]s with a stop handle;
//! - [`client`]: [`connect`] to an export and drive it as a [`kura_engine::BlockDevice`].
//!
//! Structured replies, TLS, metadata contexts and extended headers are not negotiated (the server
//! answers `NBD_REP_ERR_UNSUP`), so every reply is a simple reply.

pub mod client;
mod driver;
pub mod handshake;
pub mod protocol;
pub mod server;

pub use client::{
    connect, connect_with, export_info, list_exports, ClientError, ConnectOptions, ExportDetails,
    ExportEntry, NbdClient,
};
pub use protocol::{ErrorCode, ProtocolError};
pub use server::{
    bind_loopback, serve, Export, ServeError, ServeOptions, Server, ServerStats, StopHandle,
};
