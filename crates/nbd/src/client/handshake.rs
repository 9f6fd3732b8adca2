//! The NBD client's handshake: the fixed newstyle greeting, option haggling (`NBD_OPT_GO` with
//! `NBD_INFO_BLOCK_SIZE`, falling back to `NBD_OPT_EXPORT_NAME`), the `NBD_OPT_STARTTLS`
//! upgrade, and the one-shot queries `NBD_OPT_LIST` and `NBD_OPT_INFO`. It ends with a stream in
//! transmission ([`Transport`]) and what the server said about the export ([`ExportDetails`]);
//! `device.rs` takes it from there.

use super::ConnectOptions;
use crate::protocol::{
    self, client_flags, handshake_flags, info_type, tx_flags, BlockSizes, Info, InfoRequest, Opt,
    ProtocolError, Rep, EXPORT_NAME_PAD_LEN, EXPORT_NAME_REPLY_LEN, GREETING_LEN,
    OPTION_REPLY_HEADER_LEN,
};
use crate::tls::TlsStream;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Option replies one option may produce before the client gives up on the server.
const MAX_REPLIES_PER_OPTION: usize = 65536;

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

/// The socket and the byte streams over it (the same socket, or a TLS session's halves).
pub(super) struct Transport {
    pub(super) stream: TcpStream,
    pub(super) input: Box<dyn Read + Send>,
    pub(super) output: Box<dyn Write + Send>,
}

/// Opens the connection and does the whole handshake for [`connect_with`](super::connect_with):
/// greeting, `NBD_OPT_STARTTLS` and the TLS handshake when asked for, then the export. Every
/// read is bounded by `opts.handshake_timeout`. Returns the stream in transmission, the peer and
/// what the server said about the export.
pub(super) fn handshake<A: ToSocketAddrs>(
    addr: A,
    export: &str,
    opts: &ConnectOptions,
) -> Result<(Transport, SocketAddr, ExportDetails), ClientError> {
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
    Ok((
        Transport {
            stream,
            input,
            output,
        },
        peer,
        details,
    ))
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
