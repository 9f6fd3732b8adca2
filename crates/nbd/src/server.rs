//! The NBD server: named exports over kura devices, one thread per connection, a stop handle.
//!
//! [`serve`] takes a bound TCP listener ([`serve_unix`] a Unix-domain one, [`bind_unix`]) and a
//! list of [`Export`]s and returns a running [`Server`].
//! Each export's device is owned by one driver thread (`driver.rs`) shared by all its clients.
//! Each connection has a reader thread (handshake, then requests) and a writer thread (replies,
//! batched into few `write` calls), so a client may pipeline requests; what one client has in
//! flight is bounded by [`ServeOptions::max_in_flight`] requests and
//! [`ServeOptions::max_in_flight_bytes`] bytes, and what all connections together have in flight
//! by [`ServeOptions::max_total_in_flight_bytes`]: a reader that would go past either stops
//! reading from its socket until replies go out (back-pressure; no buffer is allocated past the
//! budget).
//!
//! **Limits on clients.** The handshake has a per-read timeout and a total deadline
//! ([`ServeOptions::handshake_deadline`], enforced by a watchdog thread that cuts the socket, so
//! a client trickling bytes cannot hold a connection slot); after `NBD_OPT_GO` a connection that
//! sends no request for [`ServeOptions::idle_timeout`] is closed; one TCP peer address may hold
//! at most [`ServeOptions::max_per_peer`] connections (Unix-socket clients are not capped per
//! peer: the socket's file mode already says who may connect).
//!
//! Bad input never takes the server down and never touches other connections: a malformed
//! request gets an NBD error reply (see [`crate::protocol::check_request`] for which), and what cannot
//! be answered safely (bad magic, a write payload over 32 MiB, a broken handshake) closes only
//! that connection. A client that vanishes mid-request has its in-flight commands completed and
//! their replies dropped. Nothing binds beyond loopback unless the caller's listener does
//! ([`bind_loopback`], [`DEFAULT_ADDR`]).

use crate::driver::{self, alloc_buf, Job, JobKind, Outgoing, Swap, ToDriver};
use crate::handshake::{
    self, ExportInfo, HandshakeEnd, HandshakeError, Negotiated, Resume, TlsMode,
};
use crate::protocol::{
    check_request, cmd_flags, encode_chunk, tx_flags, BlockSizes, Chunk, Command, ErrorCode,
    ExportLimits, ProtocolError, Refusal, RequestHeader, SimpleReply, BASE_ALLOCATION_ID,
    MAX_PAYLOAD, REQUEST_LEN,
};
use crate::psk::{PskServer, PskStream};
use crate::tls::TlsStream;
use kura_engine::{BlockDevice, DriveStats};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;
/// Where `kura serve` listens unless told otherwise: loopback only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:10809";

/// Socket buffer sizes of the reader and writer (one syscall moves up to this much).
const IO_BUFFER: usize = 256 << 10;

/// Binds a listener on the loopback interface (`127.0.0.1:port`; port 0 picks a free one).
pub fn bind_loopback(port: u16) -> io::Result<TcpListener> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port))
}

/// A named device to serve.
pub struct Export {
    name: String,
    description: String,
    read_only: bool,
    device: Box<dyn BlockDevice>,
}

impl Export {
    /// A writable export of `device` under `name` (the empty name is allowed; the empty name
    /// also selects the first export when no export has it).
    pub fn new(name: impl Into<String>, device: Box<dyn BlockDevice>) -> Export {
        Export {
            name: name.into(),
            description: String::new(),
            read_only: false,
            device,
        }
    }

    /// Refuse writes, trims and write-zeroes with `EPERM` (and advertise `READ_ONLY`).
    pub fn read_only(mut self, read_only: bool) -> Export {
        self.read_only = read_only;
        self
    }

    /// A description shown by `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`.
    pub fn description(mut self, text: impl Into<String>) -> Export {
        self.description = text.into();
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The device, e.g. to inspect it after [`Server::stop`] handed it back.
    pub fn device_mut(&mut self) -> &mut Box<dyn BlockDevice> {
        &mut self.device
    }

    pub fn into_device(self) -> Box<dyn BlockDevice> {
        self.device
    }

    /// What the handshake advertises for this export, with the protocol's default minimum block
    /// size of 1 (see [`ServeOptions::device_min_block_size`]).
    pub fn info(&self) -> ExportInfo {
        self.info_with(false, true)
    }

    /// What the handshake advertises; `device_min` advertises the device's block size as the
    /// minimum block size instead of 1; `block_status` offers `base:allocation`.
    fn info_with(&self, device_min: bool, block_status: bool) -> ExportInfo {
        let geo = self.device.geometry();
        let min = if device_min { geo.block_size.max(1) } else { 1 };
        ExportInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            size: geo.capacity_bytes(),
            flags: export_flags(self.read_only),
            block_sizes: BlockSizes {
                min,
                preferred: geo.block_size.max(512),
                max_payload: MAX_PAYLOAD,
            },
            block_status,
        }
    }
}

impl fmt::Debug for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("name", &self.name)
            .field("read_only", &self.read_only)
            .field("device", &self.device.describe())
            .finish()
    }
}

/// Transmission flags of an export: flush, FUA, cache and multi-connection always (every
/// connection goes through the same device queue, so a flush covers all of them); trim and
/// write-zeroes unless read-only.
pub fn export_flags(read_only: bool) -> u16 {
    use tx_flags::*;
    let base = HAS_FLAGS | SEND_FLUSH | SEND_FUA | SEND_CACHE | CAN_MULTI_CONN;
    if read_only {
        base | READ_ONLY
    } else {
        base | SEND_TRIM | SEND_WRITE_ZEROES
    }
}

/// Limits of a running server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// Connections served at once; more are closed at accept.
    pub max_clients: usize,
    /// Requests one connection may have unanswered.
    pub max_in_flight: usize,
    /// Payload bytes (read and write) one connection may have unanswered; a single request up
    /// to the 32 MiB payload limit is always admitted when nothing else is in flight.
    pub max_in_flight_bytes: u64,
    /// Payload bytes all connections together may have unanswered (raised to at least the
    /// 32 MiB payload limit, so every single request fits). A connection that would go past it
    /// stops reading from its socket until replies free room.
    pub max_total_in_flight_bytes: u64,
    /// Connections one TCP peer address may have open at once; more are closed at accept.
    pub max_per_peer: usize,
    /// Time a client has for each read of the handshake.
    pub handshake_timeout: Duration,
    /// Time a client has for the whole handshake (TLS included), however it trickles its bytes;
    /// then the connection is cut.
    pub handshake_deadline: Duration,
    /// After the handshake, a connection that sends no request for this long is closed (`None`:
    /// never).
    pub idle_timeout: Option<Duration>,
    /// Advertise the device's block size as the minimum block size (`NBD_INFO_BLOCK_SIZE`) and
    /// refuse, with `EINVAL`, unaligned requests from clients that asked for the block sizes
    /// (and so agreed to them). Unaligned requests from clients that did not ask are still served
    /// by read-modify-write. Off: the minimum is 1 and every client may send unaligned requests.
    pub device_min_block_size: bool,
    /// Time a reply write may block on a client that does not read; then the connection closes.
    pub write_timeout: Duration,
    /// On stop, time connections get to finish what is in flight before they are cut.
    pub stop_grace: Duration,
    /// Offer the `base:allocation` metadata context, so clients that negotiate structured
    /// replies can ask `NBD_CMD_BLOCK_STATUS` which ranges are holes. Off: no context is
    /// offered (structured replies still are), as for a server without block status.
    pub block_status: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_clients: 256,
            max_in_flight: 64,
            max_in_flight_bytes: 64 << 20,
            max_total_in_flight_bytes: 256 << 20,
            // Off in effect (as many as max_clients) for embedders; `kura serve` sets 32.
            max_per_peer: 256,
            handshake_timeout: Duration::from_secs(30),
            handshake_deadline: Duration::from_secs(30),
            idle_timeout: Some(Duration::from_secs(600)),
            device_min_block_size: false,
            write_timeout: Duration::from_secs(60),
            stop_grace: Duration::from_secs(2),
            block_status: true,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error("no exports to serve")]
    NoExports,
    #[error("two exports are named {0:?}")]
    DuplicateExport(String),
    #[error("export {name:?}: {source}")]
    BadExport { name: String, source: ProtocolError },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
}

/// Counters of a running server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted and served.
    pub connections: u64,
    /// Connections open now.
    pub active: u64,
    /// Connections closed at accept because `max_clients` were open, or `max_per_peer` from
    /// the same address.
    pub refused: u64,
    /// Connections cut because their handshake outlasted `handshake_deadline`.
    pub handshake_timeouts: u64,
    /// Connections closed after `idle_timeout` without a request.
    pub idle_closed: u64,
    /// The most payload bytes all connections had in flight at once.
    pub peak_in_flight_bytes: u64,
    /// Transmission requests received.
    pub requests: u64,
    /// Replies that carried an error.
    pub error_replies: u64,
    /// Connections closed for breaking the protocol (handshake or transmission).
    pub protocol_errors: u64,
    /// Write payload bytes received.
    pub bytes_in: u64,
    /// Read payload bytes sent.
    pub bytes_out: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    refused: AtomicU64,
    handshake_timeouts: AtomicU64,
    idle_closed: AtomicU64,
    requests: AtomicU64,
    error_replies: AtomicU64,
    protocol_errors: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A connected client: TCP, or a Unix-domain socket.
enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.shutdown(how),
            Sock::Unix(s) => s.shutdown(how),
        }
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(t),
            Sock::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_write_timeout(t),
            Sock::Unix(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for &Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => (&*s).read(buf),
            Sock::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => (&*s).write(buf),
            Sock::Unix(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where the server listens, and how a stop wakes its accept thread.
#[derive(Debug, Clone)]
enum Endpoint {
    Tcp(SocketAddr),
    /// The socket file, removed when the server ends.
    Unix(PathBuf),
}

/// One open connection as the accept thread, the watchdog and stop see it.
struct ConnEntry {
    /// A clone of the connection's socket, to cut it.
    sock: Sock,
    /// The TCP peer address (for the per-peer cap); `None` on a Unix socket.
    peer: Option<IpAddr>,
    /// Until the handshake ends: when the watchdog cuts the connection.
    handshake_until: Option<Instant>,
}

/// State shared by the accept thread, the watchdog, every connection and the stop handles.
struct Shared {
    stopping: AtomicBool,
    endpoint: Endpoint,
    /// Open connections.
    conns: Mutex<HashMap<u64, ConnEntry>>,
    conns_changed: Condvar,
    counters: Counters,
    /// Payload bytes in flight across all connections.
    budget: Budget,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, HashMap<u64, ConnEntry>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait_conns<'a>(
        &self,
        guard: MutexGuard<'a, HashMap<u64, ConnEntry>>,
        timeout: Duration,
    ) -> MutexGuard<'a, HashMap<u64, ConnEntry>> {
        match self.conns_changed.wait_timeout(guard, timeout) {
            Ok((guard, _)) => guard,
            Err(p) => p.into_inner().0,
        }
    }
}

/// Stops a server from any thread; cheap to clone.
#[derive(Clone)]
pub struct StopHandle {
    shared: Arc<Shared>,
}

impl StopHandle {
    /// Asks the server to stop: no new connections; open ones finish what is in flight (up to
    /// [`ServeOptions::stop_grace`]) and close. Returns at once; [`Server::join`] waits.
    pub fn stop(&self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // The watchdog sleeps on this condition variable; it ends when it sees `stopping`.
        self.shared.conns_changed.notify_all();
        // Wake the accept thread with a connection of our own.
        match &self.shared.endpoint {
            Endpoint::Tcp(addr) => {
                let wake = match *addr {
                    SocketAddr::V4(a) if a.ip().is_unspecified() => {
                        SocketAddr::from((Ipv4Addr::LOCALHOST, a.port()))
                    }
                    SocketAddr::V6(a) if a.ip().is_unspecified() => {
                        SocketAddr::from((Ipv6Addr::LOCALHOST, a.port()))
                    }
                    other => other,
                };
                let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
            }
            Endpoint::Unix(path) => {
                let _ = UnixStream::connect(path);
            }
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopHandle")
            .field("endpoint", &self.shared.endpoint)
            .finish()
    }
}

/// A running server.
pub struct Server {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<Vec<Export>>>,
    /// Each export's name and a way to its driver, for [`Server::export_stats`]; dropped before
    /// joining, since a driver ends only once every sender is gone.
    drivers: Vec<(String, Sender<ToDriver>)>,
    /// What [`Server::swapper`] hands out: gone once the accept thread has let go of it.
    ctx: Weak<Ctx>,
}

/// Changes the devices of a running server's exports ([`Server::swapper`]); it holds no export
/// alive, so a server stops whether or not one exists.
#[derive(Clone)]
pub struct DeviceSwapper {
    ctx: Weak<Ctx>,
}

impl DeviceSwapper {
    /// Runs `swap` on export `name`'s device on its driver thread, once every request sent before
    /// has been answered (requests after it wait, then meet the changed device). Clients that
    /// connect afterwards are told the device's new size; connections already open keep the
    /// size they were told (a client learns a size only in its handshake). Returns the new size.
    pub fn swap(&self, name: &str, swap: Swap) -> Result<u64, String> {
        let ctx = self.ctx.upgrade().ok_or("the server is stopping")?;
        let i = ctx
            .infos()
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| format!("no export named `{name}`"))?;
        let (tx, rx) = mpsc::channel();
        ctx.rts[i]
            .jobs
            .send(ToDriver::Swap(swap, tx))
            .map_err(|_| "the export's driver has ended".to_string())?;
        let outcome = rx
            .recv()
            .map_err(|_| "the export's driver ended before answering".to_string())?;
        // The device may have changed even when the swap failed; advertise what it has now.
        let size = match &outcome {
            Ok(size) => Some(*size),
            Err(_) => None,
        };
        if let Some(size) = size {
            ctx.infos.write().unwrap_or_else(PoisonError::into_inner)[i].size = size;
            ctx.rts[i].size.store(size, Ordering::Release);
        }
        outcome
    }
}

impl fmt::Debug for DeviceSwapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSwapper").finish_non_exhaustive()
    }
}

impl Server {
    /// A handle that changes exports' devices while the server runs ([`DeviceSwapper::swap`]).
    pub fn swapper(&self) -> DeviceSwapper {
        DeviceSwapper {
            ctx: self.ctx.clone(),
        }
    }

    /// The address it listens on.
    /// The TCP address it listens on; `0.0.0.0:0` for a Unix-socket server (see
    /// [`Server::unix_path`]).
    pub fn local_addr(&self) -> SocketAddr {
        match &self.shared.endpoint {
            Endpoint::Tcp(addr) => *addr,
            Endpoint::Unix(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        }
    }

    /// The socket file of a Unix-socket server.
    pub fn unix_path(&self) -> Option<&Path> {
        match &self.shared.endpoint {
            Endpoint::Unix(path) => Some(path),
            Endpoint::Tcp(_) => None,
        }
    }

    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            connections: get(&c.connections),
            active: self.shared.conns().len() as u64,
            refused: get(&c.refused),
            handshake_timeouts: get(&c.handshake_timeouts),
            idle_closed: get(&c.idle_closed),
            peak_in_flight_bytes: self.shared.budget.peak(),
            requests: get(&c.requests),
            error_replies: get(&c.error_replies),
            protocol_errors: get(&c.protocol_errors),
            bytes_in: get(&c.bytes_in),
            bytes_out: get(&c.bytes_out),
        }
    }

    /// Every export's name and the counters of each layer of its device stack, top-down
    /// ([`BlockDevice::stats`]), asked of each export's driver thread, which answers between two
    /// rounds of I/O. An export whose driver does not answer within `wait` is left out.
    pub fn export_stats(&self, wait: Duration) -> Vec<(String, Vec<DriveStats>)> {
        let asked: Vec<_> = self
            .drivers
            .iter()
            .filter_map(|(name, jobs)| {
                let (tx, rx) = mpsc::channel();
                jobs.send(ToDriver::Stats(tx)).ok()?;
                Some((name, rx))
            })
            .collect();
        let deadline = Instant::now() + wait;
        asked
            .into_iter()
            .filter_map(|(name, rx)| {
                let left = deadline.saturating_duration_since(Instant::now());
                Some((name.clone(), rx.recv_timeout(left).ok()?))
            })
            .collect()
    }

    /// Stops the server and waits for it; hands back the exports with their devices.
    pub fn stop(self) -> Vec<Export> {
        self.stop_handle().stop();
        self.join()
    }

    /// Waits until the server has been stopped (by a [`StopHandle`]) and has finished.
    pub fn join(mut self) -> Vec<Export> {
        self.drivers.clear();
        self.accept
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.drivers.clear();
        if let Some(h) = self.accept.take() {
            self.stop_handle().stop();
            let _ = h.join();
        }
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("endpoint", &self.shared.endpoint)
            .field("stats", &self.stats())
            .finish()
    }
}

/// One export at run time: what the handshake says, what requests are judged by, where jobs go.
struct ExportRt {
    limits: ExportLimits,
    /// The export's size now (`limits.size` is the size at start): a swapped device may change it.
    size: AtomicU64,
    /// The advertised minimum block size: clients that agreed to it must align to it.
    block_size: u64,
    /// The device's block size (reads allocate whole device blocks).
    device_block_size: u64,
    jobs: Sender<ToDriver>,
}

/// Serves `exports` on `listener` until stopped. Every export gets a driver thread; the listener
/// gets an accept thread; each connection gets two threads.
pub fn serve(
    listener: TcpListener,
    exports: Vec<Export>,
    opts: ServeOptions,
) -> Result<Server, ServeError> {
    serve_with(Listener::Tcp(listener), exports, opts, None)
}

/// Like [`serve`], on a Unix-domain socket made by [`bind_unix`] (plaintext: the socket file's
/// mode is the access control). The socket file is removed when the server ends.
pub fn serve_unix(
    listener: UnixListener,
    path: impl Into<PathBuf>,
    exports: Vec<Export>,
    opts: ServeOptions,
) -> Result<Server, ServeError> {
    let path = path.into();
    serve_with(Listener::Unix(listener, path), exports, opts, None)
}

/// Creates a Unix-domain socket at `path` that only its owner may connect to (mode 0600 from
/// the start: the process umask is narrowed around `bind`, so no other user can connect in a
/// window before a `chmod`). A stale socket file nobody listens on is replaced; anything else at
/// `path` (a regular file, a directory, a socket with a live server) is refused, never removed.
#[allow(unsafe_code)] // umask(2) around the bind
pub fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is a socket another server listens on", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; refusing to replace it",
                    path.display()
                ),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail and touches no
    // memory. Other threads creating files meanwhile get the narrower mask, which errs on the
    // safe side.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above; this restores the mask saved before.
    unsafe { libc::umask(old) };
    let listener = bound?;
    // Belt and braces: the mode is 0600 whatever the umask did.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// A bound listener of either kind.
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// The next connection and its TCP peer address.
    fn accept(&self) -> io::Result<(Sock, Option<IpAddr>)> {
        match self {
            Listener::Tcp(l) => l
                .accept()
                .map(|(s, peer)| (Sock::Tcp(s), Some(peer.ip().to_canonical()))),
            Listener::Unix(l, _) => l.accept().map(|(s, _)| (Sock::Unix(s), None)),
        }
    }
}

/// Like [`serve`], but every client must start TLS with `NBD_OPT_STARTTLS` before anything else
/// (see [`crate::handshake`]); build `tls` with [`crate::tls::server_config`].
pub fn serve_tls(
    listener: TcpListener,
    exports: Vec<Export>,
    opts: ServeOptions,
    tls: Arc<rustls::ServerConfig>,
) -> Result<Server, ServeError> {
    serve_with(
        Listener::Tcp(listener),
        exports,
        opts,
        Some(ServerTls::Certificate(tls)),
    )
}

/// Like [`serve_tls`], but clients authenticate with a pre-shared key (TLS-PSK, see
/// [`crate::psk`]): one with an unknown identity or the wrong key fails the TLS handshake,
/// before any option is answered, so it learns no export name.
pub fn serve_tls_psk(
    listener: TcpListener,
    exports: Vec<Export>,
    opts: ServeOptions,
    psk: Arc<PskServer>,
) -> Result<Server, ServeError> {
    serve_with(
        Listener::Tcp(listener),
        exports,
        opts,
        Some(ServerTls::Psk(psk)),
    )
}

/// The TLS a server requires: certificates (rustls) or pre-shared keys (OpenSSL).
enum ServerTls {
    Certificate(Arc<rustls::ServerConfig>),
    Psk(Arc<PskServer>),
}

/// A connection's TLS session during the handshake, of either stack.
enum Session {
    /// Boxed: a rustls session is large and lives only until the split.
    Certificate(Box<TlsStream>),
    Psk(PskStream),
}

impl Session {
    /// The read and write halves for the connection's two threads.
    fn split(self) -> io::Result<(Box<dyn Read>, Box<dyn Write + Send>)> {
        match self {
            Session::Certificate(tls) => tls
                .split()
                .map(|(r, w)| (Box::new(r) as Box<dyn Read>, Box::new(w) as _)),
            Session::Psk(psk) => psk
                .split()
                .map(|(r, w)| (Box::new(r) as Box<dyn Read>, Box::new(w) as _)),
        }
    }
}

fn serve_with(
    listener: Listener,
    exports: Vec<Export>,
    opts: ServeOptions,
    tls: Option<ServerTls>,
) -> Result<Server, ServeError> {
    if exports.is_empty() {
        return Err(ServeError::NoExports);
    }
    let infos: Vec<ExportInfo> = exports
        .iter()
        .map(|e| e.info_with(opts.device_min_block_size, opts.block_status))
        .collect();
    for (i, e) in infos.iter().enumerate() {
        if infos[..i].iter().any(|o| o.name == e.name) {
            return Err(ServeError::DuplicateExport(e.name.clone()));
        }
        handshake::check_exports(std::slice::from_ref(e)).map_err(|source| {
            ServeError::BadExport {
                name: e.name.clone(),
                source,
            }
        })?;
    }
    let endpoint = match &listener {
        Listener::Tcp(l) => {
            l.set_nonblocking(false).map_err(|source| ServeError::Io {
                what: "listener mode",
                source,
            })?;
            Endpoint::Tcp(l.local_addr().map_err(|source| ServeError::Io {
                what: "listener address",
                source,
            })?)
        }
        Listener::Unix(l, path) => {
            l.set_nonblocking(false).map_err(|source| ServeError::Io {
                what: "listener mode",
                source,
            })?;
            Endpoint::Unix(path.clone())
        }
    };

    let mut rts = Vec::with_capacity(exports.len());
    let mut drivers = Vec::with_capacity(exports.len());
    let mut stats_senders = Vec::with_capacity(exports.len());
    for (export, info) in exports.into_iter().zip(&infos) {
        let (tx, rx) = mpsc::channel();
        let device_block_size = export.device.geometry().block_size;
        let Export {
            name,
            description,
            read_only,
            device,
        } = export;
        let handle = thread::Builder::new()
            .name(format!("nbd-dev-{name}"))
            .spawn(move || driver::run(device, rx))
            .map_err(|source| ServeError::Io {
                what: "spawning a device thread",
                source,
            })?;
        stats_senders.push((name.clone(), tx.clone()));
        drivers.push((name, description, read_only, handle));
        rts.push(ExportRt {
            limits: ExportLimits {
                size: info.size,
                read_only,
                max_payload: MAX_PAYLOAD,
                block_status: false,
            },
            size: AtomicU64::new(info.size),
            block_size: u64::from(info.block_sizes.min.max(1)),
            device_block_size: u64::from(device_block_size.max(1)),
            jobs: tx,
        });
    }

    let shared = Arc::new(Shared {
        stopping: AtomicBool::new(false),
        endpoint,
        conns: Mutex::new(HashMap::new()),
        conns_changed: Condvar::new(),
        counters: Counters::default(),
        budget: Budget::new(
            usize::MAX,
            opts.max_total_in_flight_bytes.max(u64::from(MAX_PAYLOAD)),
        ),
    });
    let ctx = Arc::new(Ctx {
        shared: Arc::clone(&shared),
        infos: RwLock::new(infos),
        rts,
        opts,
        tls,
    });
    let weak_ctx = Arc::downgrade(&ctx);
    let accept = thread::Builder::new()
        .name("nbd-accept".into())
        .spawn(move || accept_loop(listener, ctx, drivers))
        .map_err(|source| ServeError::Io {
            what: "spawning the accept thread",
            source,
        })?;
    Ok(Server {
        shared,
        accept: Some(accept),
        drivers: stats_senders,
        ctx: weak_ctx,
    })
}

/// What every connection needs.
struct Ctx {
    shared: Arc<Shared>,
    /// Sizes change when a device is swapped ([`DeviceSwapper`]); handshakes read a copy.
    infos: RwLock<Vec<ExportInfo>>,
    rts: Vec<ExportRt>,
    opts: ServeOptions,
    /// Set when every client must start TLS.
    tls: Option<ServerTls>,
}

impl Ctx {
    /// What handshakes advertise now.
    fn infos(&self) -> Vec<ExportInfo> {
        self.infos
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

type DriverHandle = (String, String, bool, JoinHandle<Box<dyn BlockDevice>>);

fn accept_loop(listener: Listener, ctx: Arc<Ctx>, drivers: Vec<DriverHandle>) -> Vec<Export> {
    let shared = Arc::clone(&ctx.shared);
    let watchdog_shared = Arc::clone(&shared);
    let watchdog = thread::Builder::new()
        .name("nbd-watchdog".into())
        .spawn(move || watchdog(&watchdog_shared))
        .ok();
    let mut handles: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    loop {
        let incoming = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let (stream, peer) = match incoming {
            Ok(s) => s,
            Err(_) => {
                // Out of descriptors or a connection reset before accept: back off briefly.
                thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        handles.retain(|h| !h.is_finished());
        let id = next_id;
        next_id += 1;
        {
            let mut conns = shared.conns();
            let same_peer = |e: &&ConnEntry| peer.is_some() && e.peer == peer;
            if conns.len() >= ctx.opts.max_clients
                || conns.values().filter(same_peer).count() >= ctx.opts.max_per_peer.max(1)
            {
                bump(&shared.counters.refused, 1);
                continue;
            }
            let Ok(clone) = stream.try_clone() else {
                continue;
            };
            conns.insert(
                id,
                ConnEntry {
                    sock: clone,
                    peer,
                    handshake_until: Some(Instant::now() + ctx.opts.handshake_deadline),
                },
            );
        }
        // The watchdog may be sleeping past this connection's deadline.
        shared.conns_changed.notify_all();
        bump(&shared.counters.connections, 1);
        let conn_ctx = Arc::clone(&ctx);
        let spawned = thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                connection(stream, id, &conn_ctx);
                let mut conns = conn_ctx.shared.conns();
                conns.remove(&id);
                conn_ctx.shared.conns_changed.notify_all();
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(_) => {
                shared.conns().remove(&id);
            }
        }
    }
    drop(listener);
    if let Some(w) = watchdog {
        // Under the lock: the watchdog is then either before its check of `stopping` or asleep
        // on the condition variable, so this wake-up cannot fall between the two.
        let conns = shared.conns();
        shared.conns_changed.notify_all();
        drop(conns);
        let _ = w.join();
    }

    // Stop: let connections finish what is in flight, then cut what is left.
    for e in shared.conns().values() {
        let _ = e.sock.shutdown(Shutdown::Read);
    }
    let deadline = Instant::now() + ctx.opts.stop_grace;
    let mut conns = shared.conns();
    while !conns.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            for e in conns.values() {
                let _ = e.sock.shutdown(Shutdown::Both);
            }
            break;
        }
        conns = shared.wait_conns(conns, left);
    }
    drop(conns);
    for h in handles {
        let _ = h.join();
    }
    if let Endpoint::Unix(path) = &shared.endpoint {
        // Ours since bind_unix made it; a later server may reuse the path.
        let _ = std::fs::remove_file(path);
    }
    // Every connection is gone, so this is the last reference to the job senders: dropping it
    // lets each driver finish and hand its device back.
    drop(ctx);
    drivers
        .into_iter()
        .filter_map(|(name, description, read_only, handle)| {
            let device = handle.join().ok()?;
            Some(Export {
                name,
                description,
                read_only,
                device,
            })
        })
        .collect()
}

/// Cuts connections whose handshake outlasts its deadline, until the server stops. A socket
/// timeout alone bounds each read, not the whole handshake: a client sending one byte just
/// before every timeout would hold its slot for ever.
fn watchdog(shared: &Shared) {
    let mut conns = shared.conns();
    while !shared.stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        let mut next = now + Duration::from_secs(1);
        for e in conns.values_mut() {
            match e.handshake_until {
                Some(t) if t <= now => {
                    // Counted before the cut, so whoever sees the cut also sees the count.
                    bump(&shared.counters.handshake_timeouts, 1);
                    e.handshake_until = None;
                    let _ = e.sock.shutdown(Shutdown::Both);
                }
                Some(t) => next = next.min(t),
                None => {}
            }
        }
        let wait = next
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        conns = shared.wait_conns(conns, wait);
    }
}

/// One client, from greeting to close.
fn connection(stream: Sock, id: u64, ctx: &Ctx) {
    if let Sock::Tcp(s) = &stream {
        let _ = s.set_nodelay(true);
    }
    let _ = stream.set_read_timeout(Some(ctx.opts.handshake_timeout));
    let _ = stream.set_write_timeout(Some(ctx.opts.write_timeout));
    let mode = if ctx.tls.is_some() {
        TlsMode::Required
    } else {
        TlsMode::Unavailable
    };
    let outcome = match handshake::negotiate_until_tls(&mut &stream, &ctx.infos(), mode) {
        Ok(Negotiated::Done(end)) => Ok((end, None)),
        Ok(Negotiated::StartTls(resume)) => start_tls(&stream, resume, ctx),
        Err(e) => Err(e),
    };
    // The handshake is over (one way or another): the watchdog no longer times it. If the
    // watchdog already cut the socket, the transmission below ends at its first read.
    if let Some(e) = ctx.shared.conns().get_mut(&id) {
        e.handshake_until = None;
    }
    match outcome {
        Ok((
            HandshakeEnd::Transmission {
                export,
                block_size_agreed,
                structured,
                block_status,
            },
            tls,
        )) => {
            if let Some(rt) = ctx.rts.get(export) {
                let _ = stream.set_read_timeout(ctx.opts.idle_timeout);
                let halves: io::Result<(Box<dyn Read>, Box<dyn Write + Send>)> = match tls {
                    None => stream
                        .try_clone()
                        .map(|w| (Box::new(&stream) as Box<dyn Read>, Box::new(w) as _)),
                    Some(session) => session.split(),
                };
                if let Ok((reader, writer)) = halves {
                    let session = Negotiation {
                        strict: ctx.opts.device_min_block_size && block_size_agreed,
                        structured,
                        block_status,
                    };
                    transmission(reader, writer, &stream, id, rt, session, ctx);
                }
            }
        }
        Ok((HandshakeEnd::Aborted, _)) => {}
        Err(HandshakeError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {}
        Err(_) => bump(&ctx.shared.counters.protocol_errors, 1),
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// The TLS handshake after an acknowledged `NBD_OPT_STARTTLS`, then the rest of the options over
/// the encrypted stream (still bounded by the handshake timeouts).
fn start_tls(
    stream: &Sock,
    resume: Resume,
    ctx: &Ctx,
) -> Result<(HandshakeEnd, Option<Session>), HandshakeError> {
    let (Some(config), Sock::Tcp(tcp)) = (&ctx.tls, stream) else {
        // STARTTLS is acknowledged only when the server has a configuration, which only TCP
        // servers take.
        return Err(HandshakeError::TlsState(TlsMode::Unavailable));
    };
    match config {
        ServerTls::Certificate(config) => {
            let conn =
                rustls::ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
            let mut tls = TlsStream::new(conn.into(), tcp.try_clone()?);
            tls.handshake()?;
            let end = handshake::negotiate_after_tls(&mut tls, &ctx.infos(), resume)?;
            Ok((end, Some(Session::Certificate(Box::new(tls)))))
        }
        ServerTls::Psk(psk) => {
            let mut tls = psk.accept(tcp.try_clone()?)?;
            let end = handshake::negotiate_after_tls(&mut tls, &ctx.infos(), resume)?;
            Ok((end, Some(Session::Psk(tls))))
        }
    }
}

/// Bounds what is in flight: requests and payload bytes, of one connection or of all.
struct Budget {
    state: Mutex<(usize, u64)>,
    freed: Condvar,
    max_requests: usize,
    max_bytes: u64,
    /// The most bytes ever held at once.
    peak: AtomicU64,
}

impl Budget {
    fn new(max_requests: usize, max_bytes: u64) -> Budget {
        Budget {
            state: Mutex::new((0, 0)),
            freed: Condvar::new(),
            max_requests: max_requests.max(1),
            max_bytes: max_bytes.max(1),
            peak: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (usize, u64)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until one more request of `bytes` fits (always when nothing is in flight).
    fn acquire(&self, bytes: u64) {
        let mut st = self.lock();
        while st.0 > 0 && (st.0 >= self.max_requests || st.1 + bytes > self.max_bytes) {
            st = match self.freed.wait(st) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
        st.0 += 1;
        st.1 += bytes;
        self.peak.fetch_max(st.1, Ordering::Relaxed);
    }

    fn release(&self, bytes: u64) {
        let mut st = self.lock();
        st.0 = st.0.saturating_sub(1);
        st.1 = st.1.saturating_sub(bytes);
        drop(st);
        self.freed.notify_all();
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

/// A connection's own budget and the server's, taken and given back together (own first, so a
/// connection never holds global room while it waits on its own limit).
struct Budgets<'a> {
    own: &'a Budget,
    global: &'a Budget,
}

impl Budgets<'_> {
    fn acquire(&self, bytes: u64) {
        self.own.acquire(bytes);
        if bytes > 0 {
            self.global.acquire(bytes);
        }
    }

    fn release(&self, bytes: u64) {
        if bytes > 0 {
            self.global.release(bytes);
        }
        self.own.release(bytes);
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before the first byte.
fn read_message<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// What one connection's handshake settled for its transmission phase.
#[derive(Debug, Clone, Copy)]
struct Negotiation {
    /// The client agreed to the advertised block sizes, so unaligned requests get `EINVAL`
    /// instead of a read-modify-write that would drain the export's queue for every client.
    strict: bool,
    /// Replies are structured chunks.
    structured: bool,
    /// `base:allocation` is selected: `NBD_CMD_BLOCK_STATUS` is answered.
    block_status: bool,
}

/// The transmission phase of one connection: this thread reads requests from `input`; a writer
/// thread sends replies through `output`. `stream` is the socket under both, to cut it.
fn transmission(
    input: Box<dyn Read + '_>,
    output: Box<dyn Write + Send>,
    stream: &Sock,
    id: u64,
    rt: &ExportRt,
    session: Negotiation,
    ctx: &Ctx,
) {
    let limits = ExportLimits {
        block_status: session.block_status,
        size: rt.size.load(Ordering::Acquire),
        ..rt.limits
    };
    let counters = &ctx.shared.counters;
    let Ok(cut) = stream.try_clone() else {
        return;
    };
    let budget = Arc::new(Budget::new(
        ctx.opts.max_in_flight,
        ctx.opts.max_in_flight_bytes,
    ));
    let budgets = Budgets {
        own: &budget,
        global: &ctx.shared.budget,
    };
    let (tx, rx) = mpsc::channel::<Outgoing>();
    let structured = session.structured;
    let Ok(writer) = spawn_writer(output, cut, rx, &budget, &ctx.shared, id, structured) else {
        return;
    };

    let reply_now = |cookie: u64, error: Option<ErrorCode>| {
        budgets.acquire(0);
        let _ = tx.send(Outgoing {
            cookie,
            error: error.map_or(0, ErrorCode::code),
            data: None,
            extents: None,
            cost: 0,
        });
    };

    let mut reader = BufReader::with_capacity(IO_BUFFER, input);
    let jobs = rt.jobs.clone();
    let mut head = [0u8; REQUEST_LEN];
    // Ends on a clean close, a read error (the idle timeout among them), a client vanishing
    // mid-header or mid-payload, a header that does not decode, or NBD_CMD_DISC.
    while let Some(h) = next_request(&mut reader, &mut head, counters) {
        bump(&counters.requests, 1);
        if let Some(refusal) = refusal(&h, &limits, rt.block_size, session.strict) {
            reply_now(h.cookie, Some(refusal.error));
            if refusal.fatal {
                bump(&counters.protocol_errors, 1);
                break;
            }
            if !skip_payload(&mut reader, &h) {
                break;
            }
            continue;
        }
        let fua = h.flags & cmd_flags::FUA != 0;
        let len = h.length;
        let (kind, cost) = match h.command {
            Command::Disc => break,
            Command::Flush => (JobKind::Flush, 0),
            // Advisory, and kura's devices keep no cache a read could usefully warm ahead of
            // time from here: acknowledged once the range is checked (see docs/nbd-serve.md).
            Command::Cache => {
                reply_now(h.cookie, None);
                continue;
            }
            Command::BlockStatus => (
                JobKind::BlockStatus {
                    offset: h.offset,
                    len,
                    one: h.flags & cmd_flags::REQ_ONE != 0,
                },
                driver::MAX_STATUS_BYTES,
            ),
            _ if len == 0 => {
                reply_now(h.cookie, None);
                continue;
            }
            Command::Read => (
                JobKind::Read {
                    offset: h.offset,
                    len,
                },
                // The driver reads whole device blocks: up to one more at each end.
                u64::from(len) + 2 * rt.device_block_size,
            ),
            Command::Write => {
                budgets.acquire(u64::from(len));
                let mut data = alloc_buf(len as usize);
                if reader.read_exact(&mut data).is_err() {
                    // The client vanished mid-payload.
                    budgets.release(u64::from(len));
                    break;
                }
                bump(&counters.bytes_in, u64::from(len));
                let job = Job {
                    cookie: h.cookie,
                    fua,
                    kind: JobKind::Write {
                        offset: h.offset,
                        data,
                    },
                    reply: tx.clone(),
                    cost: u64::from(len),
                };
                dispatch(&jobs, job);
                continue;
            }
            Command::Trim => (
                JobKind::Trim {
                    offset: h.offset,
                    len,
                },
                0,
            ),
            Command::WriteZeroes => (
                JobKind::Zero {
                    offset: h.offset,
                    len,
                },
                0,
            ),
            // check_request refused everything else.
            _ => {
                reply_now(h.cookie, Some(ErrorCode::Inval));
                continue;
            }
        };
        budgets.acquire(cost);
        let job = Job {
            cookie: h.cookie,
            fua,
            kind,
            reply: tx.clone(),
            cost,
        };
        dispatch(&jobs, job);
    }
    // Replies to what is in flight still go out (NBD_CMD_DISC: "handle all outstanding
    // requests"); the writer ends when the last job holding a sender is answered.
    drop(jobs);
    drop(tx);
    let _ = writer.join();
}

/// Starts the thread that sends one connection's replies (`write_replies`), under the
/// connection's own budget and the server-wide one.
fn spawn_writer(
    output: Box<dyn Write + Send>,
    cut: Sock,
    rx: Receiver<Outgoing>,
    budget: &Arc<Budget>,
    shared: &Arc<Shared>,
    id: u64,
    structured: bool,
) -> io::Result<JoinHandle<()>> {
    let writer_budget = Arc::clone(budget);
    let writer_shared = Arc::clone(shared);
    thread::Builder::new()
        .name(format!("nbd-reply-{id}"))
        .spawn(move || {
            let budgets = Budgets {
                own: &writer_budget,
                global: &writer_shared.budget,
            };
            write_replies(output, cut, rx, &budgets, &writer_shared, structured)
        })
}

/// The next request header, or `None` when the connection is over: a clean close, a read error
/// (an idle timeout is counted as such), or a header that does not decode (counted as a protocol
/// error: the stream cannot be trusted to be in step any more).
fn next_request<R: Read>(
    reader: &mut R,
    head: &mut [u8; REQUEST_LEN],
    counters: &Counters,
) -> Option<RequestHeader> {
    match read_message(reader, head) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                bump(&counters.idle_closed, 1);
            }
            return None;
        }
    }
    match RequestHeader::decode(head) {
        Ok(h) => Some(h),
        Err(_) => {
            bump(&counters.protocol_errors, 1);
            None
        }
    }
}

/// Why a request is answered with an error without reaching the driver: the protocol's checks
/// against the export as this connection negotiated it ([`check_request`]), then, when
/// `strict`, the block alignment (`block_size`) the client agreed to.
fn refusal(
    h: &RequestHeader,
    limits: &ExportLimits,
    block_size: u64,
    strict: bool,
) -> Option<Refusal> {
    if let Err(refusal) = check_request(h, limits) {
        return Some(refusal);
    }
    let aligned = |v: u64| v.is_multiple_of(block_size);
    if strict
        && matches!(
            h.command,
            Command::Read | Command::Write | Command::Trim | Command::WriteZeroes
        )
        && !(aligned(h.offset) && aligned(u64::from(h.length)))
    {
        // The client agreed to the minimum block size and broke it (NBD allows EINVAL).
        return Some(Refusal {
            error: ErrorCode::Inval,
            fatal: false,
        });
    }
    None
}

/// Reads and drops a refused request's payload so the next header is in step; `false` when the
/// client vanished mid-payload.
fn skip_payload<R: Read>(reader: &mut R, h: &RequestHeader) -> bool {
    let skip = u64::from(h.payload_len());
    skip == 0 || io::copy(&mut reader.by_ref().take(skip), &mut io::sink()).ok() == Some(skip)
}

/// Hands a job to the export's driver; if the driver is gone the client hears ESHUTDOWN.
fn dispatch(jobs: &Sender<ToDriver>, job: Job) {
    if let Err(mpsc::SendError(ToDriver::Job(job))) = jobs.send(ToDriver::Job(job)) {
        let _ = job.reply.send(Outgoing {
            cookie: job.cookie,
            error: ErrorCode::Shutdown.code(),
            data: None,
            extents: None,
            cost: job.cost,
        });
    }
}

/// The writer of one connection: sends replies as they come, flushing when none are waiting,
/// as simple replies or, when `structured`, as one structured chunk each (see [`encode_reply`]).
/// After a failed write it keeps draining (to release the budget) but sends nothing.
fn write_replies(
    output: Box<dyn Write + Send>,
    stream: Sock,
    rx: Receiver<Outgoing>,
    budget: &Budgets<'_>,
    shared: &Shared,
    structured: bool,
) {
    let counters = &shared.counters;
    let mut w = BufWriter::with_capacity(IO_BUFFER, output);
    let mut healthy = true;
    loop {
        let msg = match rx.try_recv() {
            Ok(m) => m,
            Err(TryRecvError::Empty) => {
                if healthy && w.flush().is_err() {
                    healthy = false;
                    let _ = stream.shutdown(Shutdown::Both);
                }
                match rx.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        if msg.error != 0 {
            bump(&counters.error_replies, 1);
        }
        if healthy {
            let head = encode_reply(&msg, structured);
            let data = msg.data.as_ref().map_or(&[][..], |d| d.bytes());
            let sent = w.write_all(&head).and_then(|()| w.write_all(data));
            match sent {
                Ok(()) => bump(&counters.bytes_out, data.len() as u64),
                Err(_) => {
                    healthy = false;
                    let _ = stream.shutdown(Shutdown::Both);
                }
            }
        }
        budget.release(msg.cost);
    }
    if healthy {
        let _ = w.flush();
    }
}

/// The bytes of a reply that go before its read data (if any). Simple: the simple reply header.
/// Structured: one chunk with `NBD_REPLY_FLAG_DONE`: `ERROR` for a failure, `BLOCK_STATUS`
/// (context [`BASE_ALLOCATION_ID`]) for block status, `OFFSET_DATA` for read data, `NONE` for
/// everything else. Errors carry no message: the error value says it all.
fn encode_reply(msg: &Outgoing, structured: bool) -> Vec<u8> {
    if !structured {
        let reply = SimpleReply {
            error: msg.error,
            cookie: msg.cookie,
        };
        return reply.encode().to_vec();
    }
    let chunk = if msg.error != 0 {
        Chunk::Error {
            error: msg.error,
            message: "",
        }
    } else if let Some(extents) = &msg.extents {
        Chunk::BlockStatus {
            context: BASE_ALLOCATION_ID,
            extents,
        }
    } else if let Some(d) = &msg.data {
        Chunk::OffsetData {
            offset: d.offset,
            data_len: d.len as u32,
        }
    } else {
        Chunk::None
    };
    encode_chunk(msg.cookie, true, &chunk)
}
