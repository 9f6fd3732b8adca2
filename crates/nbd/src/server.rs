//! The NBD server: named exports over kura devices, one thread per connection, a stop handle.
//!
//! [`serve`] takes a bound listener and a list of [`Export`]s and returns a running [`Server`].
//! Each export's device is owned by one driver thread (`driver.rs`) shared by all its clients.
//! Each connection has a reader thread (handshake, then requests) and a writer thread (replies,
//! batched into few `write` calls), so a client may pipeline requests; what one client has in
//! flight is bounded by [`ServeOptions::max_in_flight`] requests and
//! [`ServeOptions::max_in_flight_bytes`] bytes — the reader stops reading until replies go out.
//!
//! Bad input never takes the server down and never touches other connections: a malformed
//! request gets an NBD error reply (see [`crate::protocol::check_request`] for which), and what cannot
//! be answered safely (bad magic, a write payload over 32 MiB, a broken handshake) closes only
//! that connection. A client that vanishes mid-request has its in-flight commands completed and
//! their replies dropped. Nothing binds beyond loopback unless the caller's listener does
//! ([`bind_loopback`], [`DEFAULT_ADDR`]).

use crate::driver::{self, alloc_buf, Job, JobKind, Outgoing};
use crate::handshake::{
    self, ExportInfo, HandshakeEnd, HandshakeError, Negotiated, Resume, TlsMode,
};
use crate::protocol::{
    check_request, cmd_flags, tx_flags, BlockSizes, Command, ErrorCode, ExportLimits,
    ProtocolError, RequestHeader, SimpleReply, MAX_PAYLOAD, REQUEST_LEN,
};
use crate::tls::TlsStream;
use kura_engine::BlockDevice;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
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

    /// What the handshake advertises for this export.
    pub fn info(&self) -> ExportInfo {
        let geo = self.device.geometry();
        ExportInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            size: geo.capacity_bytes(),
            flags: export_flags(self.read_only),
            block_sizes: BlockSizes {
                min: 1,
                preferred: geo.block_size.max(512),
                max_payload: MAX_PAYLOAD,
            },
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

/// Transmission flags of an export: flush, FUA and multi-connection always (every connection
/// goes through the same device queue, so a flush covers all of them); trim and write-zeroes
/// unless read-only.
pub fn export_flags(read_only: bool) -> u16 {
    use tx_flags::*;
    let base = HAS_FLAGS | SEND_FLUSH | SEND_FUA | CAN_MULTI_CONN;
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
    /// Time a client has for each read of the handshake.
    pub handshake_timeout: Duration,
    /// Time a reply write may block on a client that does not read; then the connection closes.
    pub write_timeout: Duration,
    /// On stop, time connections get to finish what is in flight before they are cut.
    pub stop_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_clients: 256,
            max_in_flight: 64,
            max_in_flight_bytes: 64 << 20,
            handshake_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
            stop_grace: Duration::from_secs(2),
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
    /// Connections closed at accept because `max_clients` were open.
    pub refused: u64,
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
    requests: AtomicU64,
    error_replies: AtomicU64,
    protocol_errors: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// State shared by the accept thread, every connection and the stop handles.
struct Shared {
    stopping: AtomicBool,
    addr: SocketAddr,
    /// Open connections (clones of their sockets, to cut them on stop).
    conns: Mutex<HashMap<u64, TcpStream>>,
    conns_changed: Condvar,
    counters: Counters,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, HashMap<u64, TcpStream>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
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
        // Wake the accept thread with a connection of our own.
        let addr = self.shared.addr;
        let wake = match addr {
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

    pub fn is_stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopHandle")
            .field("addr", &self.shared.addr)
            .finish()
    }
}

/// A running server.
pub struct Server {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<Vec<Export>>>,
}

impl Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.addr
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
            requests: get(&c.requests),
            error_replies: get(&c.error_replies),
            protocol_errors: get(&c.protocol_errors),
            bytes_in: get(&c.bytes_in),
            bytes_out: get(&c.bytes_out),
        }
    }

    /// Stops the server and waits for it; hands back the exports with their devices.
    pub fn stop(self) -> Vec<Export> {
        self.stop_handle().stop();
        self.join()
    }

    /// Waits until the server has been stopped (by a [`StopHandle`]) and has finished.
    pub fn join(mut self) -> Vec<Export> {
        self.accept
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(h) = self.accept.take() {
            self.stop_handle().stop();
            let _ = h.join();
        }
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.shared.addr)
            .field("stats", &self.stats())
            .finish()
    }
}

/// One export at run time: what the handshake says, what requests are judged by, where jobs go.
struct ExportRt {
    limits: ExportLimits,
    jobs: Sender<Job>,
}

/// Serves `exports` on `listener` until stopped. Every export gets a driver thread; the listener
/// gets an accept thread; each connection gets two threads.
pub fn serve(
    listener: TcpListener,
    exports: Vec<Export>,
    opts: ServeOptions,
) -> Result<Server, ServeError> {
    serve_with(listener, exports, opts, None)
}

/// Like [`serve`], but every client must start TLS with `NBD_OPT_STARTTLS` before anything else
/// (see [`crate::handshake`]); build `tls` with [`crate::tls::server_config`].
pub fn serve_tls(
    listener: TcpListener,
    exports: Vec<Export>,
    opts: ServeOptions,
    tls: Arc<rustls::ServerConfig>,
) -> Result<Server, ServeError> {
    serve_with(listener, exports, opts, Some(tls))
}

fn serve_with(
    listener: TcpListener,
    exports: Vec<Export>,
    opts: ServeOptions,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<Server, ServeError> {
    if exports.is_empty() {
        return Err(ServeError::NoExports);
    }
    let infos: Vec<ExportInfo> = exports.iter().map(Export::info).collect();
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
    let addr = listener.local_addr().map_err(|source| ServeError::Io {
        what: "listener address",
        source,
    })?;
    listener
        .set_nonblocking(false)
        .map_err(|source| ServeError::Io {
            what: "listener mode",
            source,
        })?;

    let mut rts = Vec::with_capacity(exports.len());
    let mut drivers = Vec::with_capacity(exports.len());
    for (export, info) in exports.into_iter().zip(&infos) {
        let (tx, rx) = mpsc::channel();
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
        drivers.push((name, description, read_only, handle));
        rts.push(ExportRt {
            limits: ExportLimits {
                size: info.size,
                read_only,
                max_payload: MAX_PAYLOAD,
            },
            jobs: tx,
        });
    }

    let shared = Arc::new(Shared {
        stopping: AtomicBool::new(false),
        addr,
        conns: Mutex::new(HashMap::new()),
        conns_changed: Condvar::new(),
        counters: Counters::default(),
    });
    let ctx = Arc::new(Ctx {
        shared: Arc::clone(&shared),
        infos,
        rts,
        opts,
        tls,
    });
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
    })
}

/// What every connection needs.
struct Ctx {
    shared: Arc<Shared>,
    infos: Vec<ExportInfo>,
    rts: Vec<ExportRt>,
    opts: ServeOptions,
    /// Set when every client must start TLS.
    tls: Option<Arc<rustls::ServerConfig>>,
}

type DriverHandle = (String, String, bool, JoinHandle<Box<dyn BlockDevice>>);

fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, drivers: Vec<DriverHandle>) -> Vec<Export> {
    let shared = Arc::clone(&ctx.shared);
    let mut handles: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let stream = match incoming {
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
            if conns.len() >= ctx.opts.max_clients {
                bump(&shared.counters.refused, 1);
                continue;
            }
            match stream.try_clone() {
                Ok(clone) => conns.insert(id, clone),
                Err(_) => continue,
            };
        }
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

    // Stop: let connections finish what is in flight, then cut what is left.
    for s in shared.conns().values() {
        let _ = s.shutdown(Shutdown::Read);
    }
    let deadline = Instant::now() + ctx.opts.stop_grace;
    let mut conns = shared.conns();
    while !conns.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            for s in conns.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
            break;
        }
        conns = match shared.conns_changed.wait_timeout(conns, left) {
            Ok((guard, _)) => guard,
            Err(p) => p.into_inner().0,
        };
    }
    drop(conns);
    for h in handles {
        let _ = h.join();
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

/// One client, from greeting to close.
fn connection(stream: TcpStream, id: u64, ctx: &Ctx) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(ctx.opts.handshake_timeout));
    let _ = stream.set_write_timeout(Some(ctx.opts.write_timeout));
    let mode = if ctx.tls.is_some() {
        TlsMode::Required
    } else {
        TlsMode::Unavailable
    };
    let outcome = match handshake::negotiate_until_tls(&mut &stream, &ctx.infos, mode) {
        Ok(Negotiated::Done(end)) => Ok((end, None)),
        Ok(Negotiated::StartTls(resume)) => start_tls(&stream, resume, ctx),
        Err(e) => Err(e),
    };
    match outcome {
        Ok((HandshakeEnd::Transmission { export, .. }, tls)) => {
            if let Some(rt) = ctx.rts.get(export) {
                let _ = stream.set_read_timeout(None);
                let halves: io::Result<(Box<dyn Read>, Box<dyn Write + Send>)> = match tls {
                    None => stream
                        .try_clone()
                        .map(|w| (Box::new(&stream) as Box<dyn Read>, Box::new(w) as _)),
                    Some(tls) => tls
                        .split()
                        .map(|(r, w)| (Box::new(r) as Box<dyn Read>, Box::new(w) as _)),
                };
                if let Ok((reader, writer)) = halves {
                    transmission(reader, writer, &stream, id, rt, ctx);
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
    stream: &TcpStream,
    resume: Resume,
    ctx: &Ctx,
) -> Result<(HandshakeEnd, Option<TlsStream>), HandshakeError> {
    let config = ctx
        .tls
        .clone()
        .ok_or(HandshakeError::TlsState(TlsMode::Unavailable))?;
    let conn = rustls::ServerConnection::new(config).map_err(io::Error::other)?;
    let mut tls = TlsStream::new(conn.into(), stream.try_clone()?);
    tls.handshake()?;
    let end = handshake::negotiate_after_tls(&mut tls, &ctx.infos, resume)?;
    Ok((end, Some(tls)))
}

/// Bounds what one connection has in flight.
struct Budget {
    state: Mutex<(usize, u64)>,
    freed: Condvar,
    max_requests: usize,
    max_bytes: u64,
}

impl Budget {
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
    }

    fn release(&self, bytes: u64) {
        let mut st = self.lock();
        st.0 = st.0.saturating_sub(1);
        st.1 = st.1.saturating_sub(bytes);
        drop(st);
        self.freed.notify_all();
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

/// The transmission phase of one connection: this thread reads requests from `input`; a writer
/// thread sends replies through `output`. `stream` is the socket under both, to cut it.
fn transmission(
    input: Box<dyn Read + '_>,
    output: Box<dyn Write + Send>,
    stream: &TcpStream,
    id: u64,
    rt: &ExportRt,
    ctx: &Ctx,
) {
    let counters = &ctx.shared.counters;
    let Ok(cut) = stream.try_clone() else {
        return;
    };
    let budget = Arc::new(Budget {
        state: Mutex::new((0, 0)),
        freed: Condvar::new(),
        max_requests: ctx.opts.max_in_flight.max(1),
        max_bytes: ctx.opts.max_in_flight_bytes.max(1),
    });
    let (tx, rx) = mpsc::channel::<Outgoing>();
    let writer_budget = Arc::clone(&budget);
    let writer_shared = Arc::clone(&ctx.shared);
    let writer = thread::Builder::new()
        .name(format!("nbd-reply-{id}"))
        .spawn(move || write_replies(output, cut, rx, &writer_budget, &writer_shared));
    let Ok(writer) = writer else {
        return;
    };

    let reply_now = |cookie: u64, error: Option<ErrorCode>| {
        budget.acquire(0);
        let _ = tx.send(Outgoing {
            cookie,
            error: error.map_or(0, ErrorCode::code),
            data: None,
            cost: 0,
        });
    };

    let mut reader = BufReader::with_capacity(IO_BUFFER, input);
    let jobs = rt.jobs.clone();
    let mut head = [0u8; REQUEST_LEN];
    // Ends on a clean close, a read error, or a client vanishing mid-header.
    while let Ok(true) = read_message(&mut reader, &mut head) {
        let h = match RequestHeader::decode(&head) {
            Ok(h) => h,
            Err(_) => {
                bump(&counters.protocol_errors, 1);
                break;
            }
        };
        bump(&counters.requests, 1);
        if let Err(refusal) = check_request(&h, &rt.limits) {
            reply_now(h.cookie, Some(refusal.error));
            if refusal.fatal {
                bump(&counters.protocol_errors, 1);
                break;
            }
            let skip = u64::from(h.payload_len());
            if skip > 0
                && io::copy(&mut (&mut reader).take(skip), &mut io::sink()).ok() != Some(skip)
            {
                break;
            }
            continue;
        }
        let fua = h.flags & cmd_flags::FUA != 0;
        let len = h.length;
        let (kind, cost) = match h.command {
            Command::Disc => break,
            Command::Flush => (JobKind::Flush, 0),
            _ if len == 0 => {
                reply_now(h.cookie, None);
                continue;
            }
            Command::Read => (
                JobKind::Read {
                    offset: h.offset,
                    len,
                },
                u64::from(len),
            ),
            Command::Write => {
                budget.acquire(u64::from(len));
                let mut data = alloc_buf(len as usize);
                if reader.read_exact(&mut data).is_err() {
                    // The client vanished mid-payload.
                    budget.release(u64::from(len));
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
        budget.acquire(cost);
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

/// Hands a job to the export's driver; if the driver is gone the client hears ESHUTDOWN.
fn dispatch(jobs: &Sender<Job>, job: Job) {
    if let Err(mpsc::SendError(job)) = jobs.send(job) {
        let _ = job.reply.send(Outgoing {
            cookie: job.cookie,
            error: ErrorCode::Shutdown.code(),
            data: None,
            cost: job.cost,
        });
    }
}

/// The writer of one connection: sends replies as they come, flushing when none are waiting.
/// After a failed write it keeps draining (to release the budget) but sends nothing.
fn write_replies(
    output: Box<dyn Write + Send>,
    stream: TcpStream,
    rx: Receiver<Outgoing>,
    budget: &Budget,
    shared: &Shared,
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
            let reply = SimpleReply {
                error: msg.error,
                cookie: msg.cookie,
            };
            let data = msg.data.as_ref().map_or(&[][..], |d| d.bytes());
            let sent = w
                .write_all(&reply.encode())
                .and_then(|()| w.write_all(data));
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
