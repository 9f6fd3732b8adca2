//! The NBD client: a remote export as a kura [`BlockDevice`].
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
//! [`DeviceError::Offline`] and later submits are refused.
//!
//! Every wait is bounded: connecting and each handshake read by
//! [`ConnectOptions::handshake_timeout`] (a server that accepts and then says nothing gives
//! [`ClientError::Timeout`]), and, once transmitting, each wait in `poll` and each socket write by
//! [`ConnectOptions::io_timeout`]: a server that stops answering has the connection cut, and
//! everything in flight completes with `Offline` ("no reply within ..."). With
//! [`ConnectOptions::tls`] the client sends `NBD_OPT_STARTTLS` right after the greeting and runs
//! the rest of the handshake and all of transmission over TLS; a server that refuses is an error,
//! never a silent fall back to plaintext.

use crate::protocol::{
    self, client_flags, handshake_flags, info_type, tx_flags, BlockSizes, Command, ErrorCode, Info,
    InfoRequest, Opt, ProtocolError, Rep, RequestHeader, SimpleReply, EXPORT_NAME_PAD_LEN,
    EXPORT_NAME_REPLY_LEN, GREETING_LEN, MAX_PAYLOAD, OPTION_REPLY_HEADER_LEN, SIMPLE_REPLY_LEN,
};
use crate::tls::{ClientTls, TlsStream};
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Errno, Geometry, IoBuf, Opcode, Rejected,
    Request,
};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Option replies one option may produce before the client gives up on the server.
const MAX_REPLIES_PER_OPTION: usize = 65536;
/// Socket buffer sizes of the request writer and reply reader.
const IO_BUFFER: usize = 256 << 10;

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

/// Why connecting to or talking to a server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("i/o during the handshake: {0}")]
    Io(#[from] io::Error),
    #[error("protocol error from the server: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("server refused {option} for export {export:?}: {reply}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Refused {
        option: Opt,
        reply: Rep,
        export: String,
        message: String,
    },
    #[error("the server closed the connection after NBD_OPT_EXPORT_NAME {0:?} (no such export?)")]
    ExportNameRefused(String),
    #[error("unexpected {reply} to {option}")]
    UnexpectedReply { option: Opt, reply: Rep },
    #[error("the server sent more than {MAX_REPLIES_PER_OPTION} replies to one option")]
    TooManyReplies,
    #[error("export {export:?} cannot be used: {reason}")]
    Unusable { export: String, reason: String },
    #[error("the server did not answer within {0:?} during the handshake")]
    Timeout(Duration),
    #[error("the server refused NBD_OPT_STARTTLS: {reply}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    TlsRefused { reply: Rep, message: String },
    #[error("TLS handshake failed: {0}")]
    TlsHandshake(io::Error),
    #[error(transparent)]
    TlsConfig(#[from] crate::tls::TlsError),
}

/// Reads that hit the socket timeout become [`ClientError::Timeout`].
fn timed(e: ClientError, limit: Duration) -> ClientError {
    match e {
        ClientError::Io(io)
            if matches!(
                io.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            ClientError::Timeout(limit)
        }
        other => other,
    }
}

/// What the handshake learned about an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportDetails {
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags (`tx_flags::*`).
    pub flags: u16,
    /// Size constraints, if the server sent them.
    pub block_sizes: Option<BlockSizes>,
    /// The server's canonical name, if sent.
    pub name: Option<String>,
    /// The description, if sent.
    pub description: Option<String>,
}

impl ExportDetails {
    pub fn read_only(&self) -> bool {
        self.flags & tx_flags::READ_ONLY != 0
    }
}

/// One entry of `NBD_OPT_LIST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportEntry {
    pub name: String,
    pub description: String,
}

fn read_reply_header<S: Read>(
    s: &mut S,
) -> Result<(protocol::OptionReplyHeader, Vec<u8>), ClientError> {
    let mut head = [0u8; OPTION_REPLY_HEADER_LEN];
    s.read_exact(&mut head)?;
    let h = protocol::decode_option_reply_header(&head)?;
    let mut data = vec![0u8; h.length as usize];
    s.read_exact(&mut data)?;
    Ok((h, data))
}

fn message(data: &[u8]) -> String {
    String::from_utf8_lossy(&data[..data.len().min(protocol::MAX_STRING_LEN)]).into_owned()
}

/// Reads the greeting and sends the client flags; returns whether `NO_ZEROES` is in effect.
fn greet<S: Read + Write>(s: &mut S) -> Result<bool, ClientError> {
    let mut g = [0u8; GREETING_LEN];
    s.read_exact(&mut g)?;
    let flags = protocol::decode_greeting(&g)?;
    let no_zeroes = flags & handshake_flags::NO_ZEROES != 0;
    let mine = client_flags::FIXED_NEWSTYLE
        | if no_zeroes {
            client_flags::NO_ZEROES
        } else {
            0
        };
    s.write_all(&mine.to_be_bytes())?;
    Ok(no_zeroes)
}

/// Sends `NBD_OPT_INFO` or `NBD_OPT_GO` for `export` and collects the information up to the ACK.
/// `Ok(None)` when the server does not support the option.
fn info_exchange<S: Read + Write>(
    s: &mut S,
    option: Opt,
    export: &str,
) -> Result<Option<ExportDetails>, ClientError> {
    protocol::check_string(export, "export name")?;
    let req = InfoRequest {
        name: export.to_owned(),
        requests: vec![
            info_type::BLOCK_SIZE,
            info_type::NAME,
            info_type::DESCRIPTION,
        ],
    };
    s.write_all(&protocol::encode_option(option, &req.encode())?)?;
    s.flush()?;
    let mut export_info = None;
    let mut details = ExportDetails {
        size: 0,
        flags: 0,
        block_sizes: None,
        name: None,
        description: None,
    };
    for _ in 0..MAX_REPLIES_PER_OPTION {
        let (h, data) = read_reply_header(s)?;
        if h.option != option {
            return Err(ClientError::UnexpectedReply {
                option,
                reply: h.reply,
            });
        }
        match h.reply {
            Rep::Info => match Info::decode(&data)? {
                Info::Export { size, flags } => export_info = Some((size, flags)),
                Info::BlockSize(b) => {
                    b.validate()?;
                    details.block_sizes = Some(b);
                }
                Info::Name(n) => details.name = Some(n),
                Info::Description(d) => details.description = Some(d),
                Info::Unknown(_) => {}
            },
            Rep::Ack => {
                let Some((size, flags)) = export_info else {
                    return Err(ClientError::Unusable {
                        export: export.to_owned(),
                        reason: "the server acknowledged without NBD_INFO_EXPORT".into(),
                    });
                };
                details.size = size;
                details.flags = flags;
                return Ok(Some(details));
            }
            Rep::ErrUnsup => return Ok(None),
            r if r.is_error() => {
                return Err(ClientError::Refused {
                    option,
                    reply: r,
                    export: export.to_owned(),
                    message: message(&data),
                })
            }
            r => return Err(ClientError::UnexpectedReply { option, reply: r }),
        }
    }
    Err(ClientError::TooManyReplies)
}

/// The client's side of the handshake over any stream: greeting, flags, then `NBD_OPT_GO`
/// (falling back to `NBD_OPT_EXPORT_NAME`). On success the stream is in transmission.
pub fn negotiate_client<S: Read + Write>(
    s: &mut S,
    export: &str,
) -> Result<ExportDetails, ClientError> {
    let no_zeroes = greet(s)?;
    choose_export(s, export, no_zeroes)
}

/// Sends `NBD_OPT_STARTTLS` and waits for its acknowledgement.
fn request_tls<S: Read + Write>(s: &mut S) -> Result<(), ClientError> {
    s.write_all(&protocol::encode_option(Opt::StartTls, &[])?)?;
    s.flush()?;
    let (h, data) = read_reply_header(s)?;
    match (h.option, h.reply) {
        (Opt::StartTls, Rep::Ack) => Ok(()),
        (Opt::StartTls, reply) if reply.is_error() => Err(ClientError::TlsRefused {
            reply,
            message: message(&data),
        }),
        (_, reply) => Err(ClientError::UnexpectedReply {
            option: Opt::StartTls,
            reply,
        }),
    }
}

/// `NBD_OPT_GO` for `export`, falling back to `NBD_OPT_EXPORT_NAME`.
fn choose_export<S: Read + Write>(
    s: &mut S,
    export: &str,
    no_zeroes: bool,
) -> Result<ExportDetails, ClientError> {
    if let Some(details) = info_exchange(s, Opt::Go, export)? {
        return Ok(details);
    }
    // An old server: NBD_OPT_EXPORT_NAME, which can only fail by closing the connection.
    s.write_all(&protocol::encode_option(
        Opt::ExportName,
        export.as_bytes(),
    )?)?;
    s.flush()?;
    let len = EXPORT_NAME_REPLY_LEN + if no_zeroes { 0 } else { EXPORT_NAME_PAD_LEN };
    let mut reply = vec![0u8; len];
    s.read_exact(&mut reply).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ClientError::ExportNameRefused(export.to_owned())
        } else {
            ClientError::Io(e)
        }
    })?;
    let (size, flags) = protocol::decode_export_name_reply(&reply)?;
    Ok(ExportDetails {
        size,
        flags,
        block_sizes: None,
        name: None,
        description: None,
    })
}

fn open_stream<A: ToSocketAddrs>(addr: A, timeout: Duration) -> Result<TcpStream, ClientError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| ClientError::Connect {
            addr: "(unresolved)".into(),
            source,
        })?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address to connect to");
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(ClientError::Connect {
        addr: addrs
            .first()
            .map_or_else(|| "(no address)".into(), ToString::to_string),
        source: last,
    })
}

/// Lists a server's exports with `NBD_OPT_LIST`, then ends the session with `NBD_OPT_ABORT`.
pub fn list_exports<A: ToSocketAddrs>(addr: A) -> Result<Vec<ExportEntry>, ClientError> {
    let stream = open_stream(addr, ConnectOptions::default().handshake_timeout)?;
    let mut s = &stream;
    greet(&mut s)?;
    s.write_all(&protocol::encode_option(Opt::List, &[])?)?;
    let mut out = Vec::new();
    for _ in 0..MAX_REPLIES_PER_OPTION {
        let (h, data) = read_reply_header(&mut s)?;
        match h.reply {
            Rep::Server => {
                let (name, description) = protocol::decode_server_entry(&data)?;
                out.push(ExportEntry { name, description });
            }
            Rep::Ack => {
                abort(&mut s);
                return Ok(out);
            }
            r if r.is_error() => {
                return Err(ClientError::Refused {
                    option: Opt::List,
                    reply: r,
                    export: String::new(),
                    message: message(&data),
                })
            }
            r => {
                return Err(ClientError::UnexpectedReply {
                    option: Opt::List,
                    reply: r,
                })
            }
        }
    }
    Err(ClientError::TooManyReplies)
}

/// Asks about one export with `NBD_OPT_INFO` (without entering transmission), then aborts.
pub fn export_info<A: ToSocketAddrs>(addr: A, export: &str) -> Result<ExportDetails, ClientError> {
    let stream = open_stream(addr, ConnectOptions::default().handshake_timeout)?;
    let mut s = &stream;
    greet(&mut s)?;
    let details = info_exchange(&mut s, Opt::Info, export)?.ok_or(ClientError::Refused {
        option: Opt::Info,
        reply: Rep::ErrUnsup,
        export: export.to_owned(),
        message: String::new(),
    })?;
    abort(&mut s);
    Ok(details)
}

/// Soft disconnect during the handshake: `NBD_OPT_ABORT`, then wait briefly for the ACK.
fn abort<S: Read + Write>(s: &mut S) {
    if let Ok(bytes) = protocol::encode_option(Opt::Abort, &[]) {
        if s.write_all(&bytes).and_then(|()| s.flush()).is_ok() {
            let _ = read_reply_header(s);
        }
    }
}

/// Connects to `export` at `addr` with default options.
pub fn connect<A: ToSocketAddrs>(addr: A, export: &str) -> Result<NbdClient, ClientError> {
    connect_with(addr, export, ConnectOptions::default())
}

/// Connects to `export` at `addr`.
pub fn connect_with<A: ToSocketAddrs>(
    addr: A,
    export: &str,
    opts: ConnectOptions,
) -> Result<NbdClient, ClientError> {
    let limit = opts.handshake_timeout;
    let stream = open_stream(addr, limit)?;
    let peer = stream.peer_addr()?;
    let (details, input, output): (ExportDetails, Box<dyn Read + Send>, Box<dyn Write + Send>) =
        match &opts.tls {
            None => {
                let details =
                    negotiate_client(&mut &stream, export).map_err(|e| timed(e, limit))?;
                (
                    details,
                    Box::new(stream.try_clone()?),
                    Box::new(stream.try_clone()?),
                )
            }
            Some(tls) => {
                let no_zeroes = greet(&mut &stream).map_err(|e| timed(e, limit))?;
                request_tls(&mut &stream).map_err(|e| timed(e, limit))?;
                let conn = tls.connection().map_err(ClientError::TlsHandshake)?;
                let mut ts = TlsStream::new(conn, stream.try_clone()?);
                ts.handshake().map_err(|e| {
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) {
                        ClientError::Timeout(limit)
                    } else {
                        ClientError::TlsHandshake(e)
                    }
                })?;
                let details =
                    choose_export(&mut ts, export, no_zeroes).map_err(|e| timed(e, limit))?;
                let (r, w) = ts.split()?;
                (details, Box::new(r), Box::new(w))
            }
        };
    let geo = geometry(&details, &opts).map_err(|reason| ClientError::Unusable {
        export: export.to_owned(),
        reason,
    })?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(opts.io_timeout)?;
    NbdClient::start(
        Transport {
            stream,
            input,
            output,
        },
        peer,
        export,
        details,
        geo,
        opts.io_timeout,
    )
}

/// The socket and the byte streams over it (the same socket, or a TLS session's halves).
struct Transport {
    stream: TcpStream,
    input: Box<dyn Read + Send>,
    output: Box<dyn Write + Send>,
}

/// The device geometry for an export (see the module docs).
fn geometry(d: &ExportDetails, opts: &ConnectOptions) -> Result<Geometry, String> {
    let min = d.block_sizes.map_or(1, |b| b.min).max(1);
    let preferred = d
        .block_sizes
        .map_or(4096, |b| b.preferred)
        .clamp(512, 65536);
    let mut bs = opts.block_size.unwrap_or(preferred);
    if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
        return Err(format!(
            "block size {bs} is not a power of two from 512 to 65536"
        ));
    }
    if opts.block_size.is_none() {
        while bs > 512 && bs > min && !d.size.is_multiple_of(u64::from(bs)) {
            bs /= 2;
        }
    }
    if bs < min {
        return Err(format!(
            "block size {bs} is below the server's minimum block size {min}"
        ));
    }
    let max_payload = d
        .block_sizes
        .map_or(MAX_PAYLOAD, |b| b.max_payload)
        .min(MAX_PAYLOAD);
    if max_payload < bs {
        return Err(format!(
            "the server's maximum payload {max_payload} is below the block size {bs}"
        ));
    }
    if opts.queue_depth == 0 || opts.queue_depth > kura_engine::device::MAX_QUEUE_DEPTH {
        return Err(format!("queue depth {} is out of range", opts.queue_depth));
    }
    Ok(Geometry {
        block_size: bs,
        num_blocks: d.size / u64::from(bs),
        max_transfer: max_payload / bs * bs,
        queue_depth: opts.queue_depth,
        buffer_alignment: 1,
    })
}

/// One NBD request of a (possibly split) device command.
struct Piece {
    parent: u64,
    buf_offset: usize,
    len: usize,
    read: bool,
}

/// A device command in flight as one or more pieces.
struct Parent {
    tag: u64,
    op: Opcode,
    lba: u64,
    /// The read buffer (writes keep theirs in `NbdClient::write_bufs`).
    buf: Option<IoBuf>,
    remaining: usize,
    status: DeviceResult<()>,
}

/// What the submitting thread and the reply reader share.
#[derive(Default)]
struct Shared {
    pieces: HashMap<u64, Piece>,
    parents: HashMap<u64, Parent>,
    /// Why the connection is gone, once it is.
    dead: Option<String>,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request header waiting for the doorbell, with the slice of a write buffer it carries.
struct Queued {
    header: [u8; protocol::REQUEST_LEN],
    payload: Option<(u64, usize, usize)>,
}

/// A connected NBD export, usable as a kura device (one queue pair, one driving thread).
pub struct NbdClient {
    geo: Geometry,
    details: ExportDetails,
    export: String,
    peer: SocketAddr,
    stream: TcpStream,
    out: BufWriter<Box<dyn Write + Send>>,
    io_timeout: Option<Duration>,
    queued: Vec<Queued>,
    write_bufs: HashMap<u64, IoBuf>,
    shared: Arc<Mutex<Shared>>,
    done: Receiver<(u64, Completion)>,
    reader: Option<JoinHandle<()>>,
    in_flight: usize,
    next_cookie: u64,
    next_parent: u64,
    broken: Option<String>,
}

impl NbdClient {
    fn start(
        transport: Transport,
        peer: SocketAddr,
        export: &str,
        details: ExportDetails,
        geo: Geometry,
        io_timeout: Option<Duration>,
    ) -> Result<NbdClient, ClientError> {
        let Transport {
            stream,
            input,
            output,
        } = transport;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (tx, rx) = mpsc::channel();
        let cut = stream.try_clone()?;
        let reader_shared = Arc::clone(&shared);
        let reader = thread::Builder::new()
            .name("nbd-client-rx".into())
            .spawn(move || read_replies(input, cut, &reader_shared, &tx))?;
        Ok(NbdClient {
            geo,
            details,
            export: export.to_owned(),
            peer,
            out: BufWriter::with_capacity(IO_BUFFER, output),
            io_timeout,
            stream,
            queued: Vec::new(),
            write_bufs: HashMap::new(),
            shared,
            done: rx,
            reader: Some(reader),
            in_flight: 0,
            next_cookie: 1,
            next_parent: 1,
            broken: None,
        })
    }

    /// What the handshake said about the export (size in bytes, flags, size constraints).
    pub fn details(&self) -> &ExportDetails {
        &self.details
    }

    /// The export's name as asked for.
    pub fn export_name(&self) -> &str {
        &self.export
    }

    /// Waits for everything in flight, then disconnects cleanly with `NBD_CMD_DISC`.
    pub fn close(mut self) -> DeviceResult<()> {
        let mut sink = Vec::new();
        while self.in_flight > 0 {
            let n = self.in_flight;
            self.poll(&mut sink, n)?;
            sink.clear();
        }
        self.disconnect();
        Ok(())
    }

    fn disconnect(&mut self) {
        if self.broken.is_none() && self.in_flight == 0 {
            let disc = RequestHeader {
                flags: 0,
                command: Command::Disc,
                cookie: 0,
                offset: 0,
                length: 0,
            };
            let _ = self
                .out
                .write_all(&disc.encode())
                .and_then(|()| self.out.flush());
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
        self.broken = Some("disconnected".into());
    }

    fn unsupported(&self, req: Request) -> Result<(), Rejected> {
        let op = req.op;
        Err(Rejected::new(
            req,
            DeviceError::Unsupported {
                op,
                backend: "nbd export",
            },
        ))
    }

    fn offline(&self, req: Request, reason: &str) -> Result<(), Rejected> {
        Err(Rejected::new(
            req,
            DeviceError::Offline {
                reason: format!("nbd://{}/{}: {reason}", self.peer, self.export),
            },
        ))
    }

    fn finish(&mut self, (parent, mut c): (u64, Completion), out: &mut Vec<Completion>) {
        if let Some(buf) = self.write_bufs.remove(&parent) {
            c.buf = Some(buf);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        out.push(c);
    }
}

impl BlockDevice for NbdClient {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        format!("nbd://{}/{}", self.peer, self.export)
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let mut req = req.admit(&self.geo, self.in_flight)?;
        let flags = self.details.flags;
        let (command, max_piece) = match req.op {
            Opcode::Read => (Command::Read, u64::from(self.geo.max_transfer)),
            Opcode::Write => (Command::Write, u64::from(self.geo.max_transfer)),
            Opcode::Flush => (Command::Flush, 0),
            Opcode::WriteZeroes | Opcode::Discard => (
                Command::WriteZeroes,
                u64::from(u32::MAX / self.geo.block_size * self.geo.block_size),
            ),
        };
        let needs = match command {
            Command::Flush => tx_flags::SEND_FLUSH,
            Command::WriteZeroes => tx_flags::SEND_WRITE_ZEROES,
            _ => 0,
        };
        if flags & needs != needs {
            return self.unsupported(req);
        }
        if req.op.is_mutation() && req.op != Opcode::Flush && flags & tx_flags::READ_ONLY != 0 {
            let (op, lba) = (req.op, req.lba);
            return Err(Rejected::new(
                req,
                DeviceError::Io {
                    op,
                    lba,
                    errno: Errno(libc::EPERM),
                },
            ));
        }
        if let Some(reason) = self.broken.clone() {
            return self.offline(req, &reason);
        }
        let bs = u64::from(self.geo.block_size);
        let total = req.blocks * bs;
        let parent = self.next_parent;
        let read = req.op == Opcode::Read;
        let write = req.op == Opcode::Write;
        {
            let mut st = lock(&self.shared);
            if let Some(reason) = st.dead.clone() {
                drop(st);
                return self.offline(req, &reason);
            }
            let mut pieces = 0;
            let mut off = 0u64;
            loop {
                let len = if command == Command::Flush {
                    0
                } else {
                    max_piece.min(total - off)
                };
                let cookie = self.next_cookie;
                self.next_cookie = self.next_cookie.wrapping_add(1);
                st.pieces.insert(
                    cookie,
                    Piece {
                        parent,
                        buf_offset: off as usize,
                        len: len as usize,
                        read,
                    },
                );
                let header = RequestHeader {
                    flags: 0,
                    command,
                    cookie,
                    offset: if command == Command::Flush {
                        0
                    } else {
                        req.lba * bs + off
                    },
                    length: len as u32,
                };
                self.queued.push(Queued {
                    header: header.encode(),
                    payload: write.then_some((parent, off as usize, len as usize)),
                });
                pieces += 1;
                off += len;
                if off >= total {
                    break;
                }
            }
            st.parents.insert(
                parent,
                Parent {
                    tag: req.tag,
                    op: req.op,
                    lba: req.lba,
                    buf: if read { req.buf.take() } else { None },
                    remaining: pieces,
                    status: Ok(()),
                },
            );
        }
        if write {
            if let Some(buf) = req.buf.take() {
                self.write_bufs.insert(parent, buf);
            }
        }
        self.next_parent += 1;
        self.in_flight += 1;
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        if self.queued.is_empty() {
            return Ok(());
        }
        let queued = std::mem::take(&mut self.queued);
        let mut sent = Ok(());
        for q in &queued {
            sent = self.out.write_all(&q.header);
            if let (Ok(()), Some((parent, off, len))) = (&sent, q.payload) {
                let data = self
                    .write_bufs
                    .get(&parent)
                    .and_then(|b| b.get(off..off + len));
                sent = match data {
                    Some(d) => self.out.write_all(d),
                    None => Err(io::Error::other("write buffer missing")),
                };
            }
            if sent.is_err() {
                break;
            }
        }
        let sent = sent.and_then(|()| self.out.flush());
        if let Err(e) = sent {
            // The reader sees the shutdown, fails every command in flight and exits.
            let reason = format!("sending requests failed: {e}");
            let _ = self.stream.shutdown(Shutdown::Both);
            self.broken = Some(reason.clone());
            return Err(DeviceError::Offline { reason });
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        // A failed doorbell still completes every command (with Offline) through the reader.
        let _ = self.ring_doorbell();
        let want = min_complete.min(self.in_flight);
        let mut got = 0;
        let mut cut = false;
        loop {
            match self.done.try_recv() {
                Ok(c) => {
                    self.finish(c, out);
                    got += 1;
                    continue;
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => break,
            }
            if got >= want {
                break;
            }
            let next = match self.io_timeout {
                Some(limit) => self.done.recv_timeout(limit).map_err(|e| match e {
                    RecvTimeoutError::Timeout => Some(limit),
                    RecvTimeoutError::Disconnected => None,
                }),
                None => self.done.recv().map_err(|_| None),
            };
            match next {
                Ok(c) => {
                    self.finish(c, out);
                    got += 1;
                }
                Err(Some(limit)) if !cut => {
                    // The server is alive on TCP but not answering: give up on the connection,
                    // which makes the reader complete everything in flight with Offline.
                    cut = true;
                    let reason = format!("no reply from the server within {limit:?}");
                    lock(&self.shared).dead.get_or_insert(reason.clone());
                    self.broken.get_or_insert(reason);
                    let _ = self.stream.shutdown(Shutdown::Both);
                }
                Err(_) => break,
            }
        }
        if got < want {
            return Err(DeviceError::Offline {
                reason: format!("nbd://{}/{}: reply reader is gone", self.peer, self.export),
            });
        }
        Ok(got)
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        let _ = self.ring_doorbell();
        self.disconnect();
    }
}

impl fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NbdClient")
            .field("peer", &self.peer)
            .field("export", &self.export)
            .field("geometry", &self.geo)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// The reply reader: matches replies to pieces, reads read data into the parent's buffer, and
/// completes a parent when its last piece is answered. On any failure it fails everything in
/// flight with `Offline` and marks the connection dead.
fn read_replies(
    input: Box<dyn Read + Send>,
    stream: TcpStream,
    shared: &Mutex<Shared>,
    done: &Sender<(u64, Completion)>,
) {
    let mut r = BufReader::with_capacity(IO_BUFFER, input);
    let reason = loop {
        let mut head = [0u8; SIMPLE_REPLY_LEN];
        if let Err(e) = r.read_exact(&mut head) {
            break format!("connection closed: {e}");
        }
        let reply = match SimpleReply::decode(&head) {
            Ok(reply) => reply,
            Err(e) => break format!("bad reply: {e}"),
        };
        let mut st = lock(shared);
        let Some(piece) = st.pieces.remove(&reply.cookie) else {
            break format!("reply for unknown handle {:#x}", reply.cookie);
        };
        if piece.read && reply.error == 0 {
            let taken = st.parents.get_mut(&piece.parent).and_then(|p| p.buf.take());
            drop(st);
            let Some(mut buf) = taken else {
                break "read reply without a buffer".to_string();
            };
            let res = match buf.get_mut(piece.buf_offset..piece.buf_offset + piece.len) {
                Some(dst) => r.read_exact(dst),
                None => Err(io::Error::other("read reply larger than its buffer")),
            };
            st = lock(shared);
            if let Some(p) = st.parents.get_mut(&piece.parent) {
                p.buf = Some(buf);
            }
            if let Err(e) = res {
                break format!("connection closed mid-reply: {e}");
            }
        }
        let finished = match st.parents.get_mut(&piece.parent) {
            Some(p) => {
                if reply.error != 0 && p.status.is_ok() {
                    p.status = Err(DeviceError::Io {
                        op: p.op,
                        lba: p.lba,
                        errno: Errno(ErrorCode::from_code(reply.error).to_errno()),
                    });
                }
                p.remaining = p.remaining.saturating_sub(1);
                p.remaining == 0
            }
            None => false,
        };
        if finished {
            if let Some(p) = st.parents.remove(&piece.parent) {
                let _ = done.send((
                    piece.parent,
                    Completion {
                        tag: p.tag,
                        op: p.op,
                        status: p.status,
                        buf: p.buf,
                    },
                ));
            }
        }
    };
    let mut st = lock(shared);
    // A timeout in `poll` may have cut the connection; its reason is the better one.
    let reason = st.dead.get_or_insert(reason).clone();
    st.pieces.clear();
    for (parent, p) in st.parents.drain() {
        let _ = done.send((
            parent,
            Completion {
                tag: p.tag,
                op: p.op,
                status: Err(DeviceError::Offline {
                    reason: reason.clone(),
                }),
                buf: p.buf,
            },
        ));
    }
    drop(st);
    let _ = stream.shutdown(Shutdown::Both);
}
