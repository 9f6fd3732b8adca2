//! The NBD client: a remote export as a kura [`BlockDevice`](kura_engine::BlockDevice).
//!
//! [`connect`] does the fixed newstyle handshake with `NBD_OPT_GO` (asking for
//! `NBD_INFO_BLOCK_SIZE` and then obeying it), falling back to `NBD_OPT_EXPORT_NAME` when the
//! server answers `NBD_REP_ERR_UNSUP`. The resulting [`NbdClient`] pipelines: `submit` queues
//! request headers, `ring_doorbell` sends every queued request (write payloads straight from the
//! caller's buffers) in one flush, and a reader thread takes replies off the socket as they come —
//! reading read data directly into the caller's buffer — and hands completions to `poll`, so
//! replies never wait behind requests and the two directions cannot deadlock.
//!
//! Mapping: `Read`/`Write` → `NBD_CMD_READ`/`NBD_CMD_WRITE`, split at the server's maximum
//! payload (at most 32 MiB) and completed as one; `Flush` → `NBD_CMD_FLUSH`; `WriteZeroes` and
//! `Discard` → `NBD_CMD_WRITE_ZEROES` (so discarded blocks read back as zeroes, as the engine
//! promises). Commands the export does not advertise, and mutations of a read-only export, are
//! refused at `submit`. The block size is the server's preferred size when the export size is a
//! multiple of it (else halved down to 512 or the server's minimum); bytes past the last whole
//! block are not addressable. If the connection breaks, every command in flight completes with
//! [`DeviceError::Offline`](kura_engine::DeviceError::Offline) and later submits are refused.
//!
//! Every wait is bounded: connecting and each handshake read by
//! [`ConnectOptions::handshake_timeout`] (a server that accepts and then says nothing gives
//! [`ClientError::Timeout`]), and, once transmitting, each wait in `poll` and each socket write by
//! [`ConnectOptions::io_timeout`]: a server that stops answering has the connection cut, and
//! everything in flight completes with `Offline` ("no reply within ..."). With
//! [`ConnectOptions::tls`] the client sends `NBD_OPT_STARTTLS` right after the greeting and runs
//! the rest of the handshake and all of transmission over TLS; a server that refuses is an error,
//! never a silent fall back to plaintext.
//!
//! The handshake (greeting, option haggling, the TLS upgrade, export information, and the
//! one-shot queries [`list_exports`] and [`export_info`]) is in `handshake.rs`; the device
//! ([`NbdClient`]: request splitting, in-flight tracking and the reply reader) in `device.rs`.
//! This file holds what ties them together: [`ConnectOptions`] and [`connect_with`].

mod device;
mod handshake;

pub use device::NbdClient;
pub use handshake::{
    export_info, list_exports, negotiate_client, ClientError, ExportDetails, ExportEntry,
};

use crate::tls::ClientTls;
use std::net::ToSocketAddrs;
use std::time::Duration;

/// How to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Commands the client accepts in flight (`Geometry::queue_depth`).
    pub queue_depth: u32,
    /// Block size of the device; `None` takes the server's preferred size (see the module docs).
    pub block_size: Option<u32>,
    /// Limit on each read of the handshake and on connecting.
    pub handshake_timeout: Duration,
    /// Limit on each wait for a reply and on each socket write once transmitting; `None` waits
    /// for ever.
    pub io_timeout: Option<Duration>,
    /// Start TLS (`NBD_OPT_STARTTLS`) before anything else.
    pub tls: Option<ClientTls>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            queue_depth: 64,
            block_size: None,
            handshake_timeout: Duration::from_secs(30),
            io_timeout: Some(Duration::from_secs(60)),
            tls: None,
        }
    }
}

/// Connects to `export` at `addr` with default options.
pub fn connect<A: ToSocketAddrs>(addr: A, export: &str) -> Result<NbdClient, ClientError> {
    connect_with(addr, export, ConnectOptions::default())
}

/// Connects to `export` at `addr`: the handshake (over TLS with [`ConnectOptions::tls`]), then
/// the device geometry from what the server said, then transmission.
pub fn connect_with<A: ToSocketAddrs>(
    addr: A,
    export: &str,
    opts: ConnectOptions,
) -> Result<NbdClient, ClientError> {
    let (transport, peer, details) = handshake::handshake(addr, export, &opts)?;
    let geo = device::geometry(&details, &opts).map_err(|reason| ClientError::Unusable {
        export: export.to_owned(),
        reason,
    })?;
    transport.stream.set_read_timeout(None)?;
    transport.stream.set_write_timeout(opts.io_timeout)?;
    NbdClient::start(transport, peer, export, details, geo, opts.io_timeout)
}
