//! NBD for kura: a server that exports kura devices to any NBD client, and a client that makes a
//! remote export a kura device.
//!
//! - [`protocol`]: the wire format (fixed newstyle handshake, simple and structured replies),
//!   pure and bounded;
//! - [`handshake`]: the server's option haggling, over any byte stream;
//! - [`server`]: [`serve`] named [`Export`]s over TCP (or [`serve_unix`] over a Unix socket)
//!   with a stop handle and limits on handshakes, idle clients, peers and bytes in flight;
//! - [`client`]: [`connect`] to an export and drive it as a [`kura_engine::BlockDevice`].
//!
//! - [`tls`]: `NBD_OPT_STARTTLS` with rustls (the server requires it when given a certificate,
//!   and can require client certificates; the client asks for it when given a CA);
//! - [`psk`]: TLS with pre-shared keys from a psktool file (the server only), on the system's
//!   OpenSSL when the build found it;
//! - [`open`]: the `nbd:` and `remote:` spec kinds, added to a [`kura_engine::Registry`] by
//!   [`register`];
//! - [`remote`]: the `remote:HOST:PORT/EXPORT` drive — the client with bounded waits, one
//!   reconnect, and replay of what is safe to replay.
//!
//! The server offers structured replies and the `base:allocation` metadata context
//! (`NBD_CMD_BLOCK_STATUS`, from [`kura_engine::BlockDevice::allocation`]) to clients that ask;
//! extended headers are not offered (`NBD_REP_ERR_UNSUP`). kura's own client speaks simple
//! replies only.

pub mod client;
mod driver;
pub mod handshake;
pub mod open;
pub mod protocol;
pub mod psk;
pub mod remote;
pub mod server;
pub mod tls;

pub use client::{
    connect, connect_with, export_info, list_exports, ClientError, ConnectOptions, ExportDetails,
    ExportEntry, NbdClient,
};
pub use driver::{Swap, SwapError};
pub use open::register;
pub use protocol::{ErrorCode, ProtocolError};
pub use server::DeviceSwapper;
pub use server::{
    bind_loopback, bind_unix, serve, serve_tls, serve_tls_psk, serve_unix, Export, ServeError,
    ServeOptions, Server, ServerStats, StopHandle,
};
