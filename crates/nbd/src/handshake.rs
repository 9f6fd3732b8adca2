//! The server's side of the fixed newstyle handshake: greeting, client flags and option haggling,
//! up to the choice of an export.
//!
//! [`negotiate`] runs over any `Read + Write` stream, so the same state machine serves TCP
//! connections and the fuzzer's in-memory streams. It answers:
//!
//! - `NBD_OPT_EXPORT_NAME`: the export's size and flags, then transmission; an unknown name ends
//!   the session (the protocol gives this option no way to fail);
//! - `NBD_OPT_GO` / `NBD_OPT_INFO`: `NBD_REP_INFO` items (`EXPORT` always; `NAME`, `DESCRIPTION`,
//!   `BLOCK_SIZE` when asked for) then `NBD_REP_ACK`; `NBD_REP_ERR_UNKNOWN` for an unknown
//!   export, `NBD_REP_ERR_INVALID` for malformed data;
//! - `NBD_OPT_LIST`: one `NBD_REP_SERVER` per export, then `NBD_REP_ACK`;
//! - `NBD_OPT_ABORT`: `NBD_REP_ACK`, then the session ends;
//! - `NBD_OPT_STARTTLS` when the server has a certificate ([`TlsMode::Required`]): `NBD_REP_ACK`,
//!   and [`negotiate_until_tls`] hands the stream back for the TLS handshake, after which
//!   [`negotiate_after_tls`] goes on over the encrypted stream. Until then every option other than
//!   `STARTTLS` and `ABORT` gets `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` (which cannot be
//!   refused) ends the session. `STARTTLS` with data, or once TLS is up, gets
//!   `NBD_REP_ERR_INVALID`; without a certificate it gets `NBD_REP_ERR_UNSUP`;
//! - everything else (`NBD_OPT_STRUCTURED_REPLY`, meta contexts, extended headers, unknown
//!   codes): `NBD_REP_ERR_UNSUP`.
//!
//! The empty export name selects the first export (the protocol's "default export"). Clients
//! that do not set `NBD_FLAG_C_FIXED_NEWSTYLE` are refused, as are unknown client flags, option
//! data over 64 KiB, a bad option magic, and more than [`MAX_OPTIONS`] options.

use crate::protocol::{
    self, check_string, decode_string, handshake_flags, info_type, BlockSizes, Info, InfoRequest,
    Opt, ProtocolError, Rep, CLIENT_FLAGS_LEN, OPTION_HEADER_LEN,
};
use std::io::{self, Read, Write};

/// Options one connection may send before the server gives up on it.
pub const MAX_OPTIONS: usize = 1024;

/// Handshake flags this server offers.
pub const SERVER_HANDSHAKE_FLAGS: u16 =
    handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES;

/// What the handshake tells a client about one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags (`tx_flags::*`).
    pub flags: u16,
    pub block_sizes: BlockSizes,
}

/// The outcome of a successful handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeEnd {
    /// Transmission begins on `exports[export]`.
    Transmission {
        export: usize,
        /// The client asked for `NBD_INFO_BLOCK_SIZE` in its `NBD_OPT_GO`.
        block_size_agreed: bool,
    },
    /// The client sent `NBD_OPT_ABORT`.
    Aborted,
}

/// Why a handshake ended without transmission.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    #[error("i/o during the handshake: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation during the handshake: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("the client did not set NBD_FLAG_C_FIXED_NEWSTYLE")]
    NotFixedNewstyle,
    #[error("NBD_OPT_EXPORT_NAME names no export: {0:?}")]
    UnknownExport(String),
    #[error("the client sent more than {MAX_OPTIONS} options")]
    TooManyOptions,
    #[error("the client asked for export {0:?} with NBD_OPT_EXPORT_NAME before starting TLS")]
    TlsRequired(String),
    #[error("NBD_OPT_STARTTLS was acknowledged in TLS mode {0:?} (a server bug)")]
    TlsState(TlsMode),
}

/// Where the handshake stands on TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// The server has no certificate: `NBD_OPT_STARTTLS` is unsupported.
    Unavailable,
    /// TLS must start before anything else is answered.
    Required,
    /// The stream is already encrypted.
    Active,
}

/// How [`negotiate_until_tls`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Negotiated {
    Done(HandshakeEnd),
    /// `NBD_OPT_STARTTLS` was acknowledged: run the TLS handshake on the stream, then call
    /// [`negotiate_after_tls`] with this.
    StartTls(Resume),
}

/// What the option haggling carries across the switch to TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    no_zeroes: bool,
    options: usize,
}

/// Finds an export by name; the empty name is the default export (the first).
pub fn find_export(exports: &[ExportInfo], name: &str) -> Option<usize> {
    exports
        .iter()
        .position(|e| e.name == name)
        .or(if name.is_empty() && !exports.is_empty() {
            Some(0)
        } else {
            None
        })
}

fn reply<S: Write>(s: &mut S, option: Opt, rep: Rep, data: &[u8]) -> io::Result<()> {
    s.write_all(&protocol::encode_option_reply(option, rep, data))
}

fn error_text(what: &str) -> Vec<u8> {
    let mut text = what.as_bytes().to_vec();
    text.truncate(protocol::MAX_STRING_LEN);
    text
}

/// Runs the server's side of the handshake on `stream` until the client picks an export, aborts,
/// or breaks the protocol. Every reply is flushed before the next option is read. TLS is not
/// offered.
pub fn negotiate<S: Read + Write>(
    stream: &mut S,
    exports: &[ExportInfo],
) -> Result<HandshakeEnd, HandshakeError> {
    match negotiate_until_tls(stream, exports, TlsMode::Unavailable)? {
        Negotiated::Done(end) => Ok(end),
        // STARTTLS is only acknowledged when TLS is required.
        Negotiated::StartTls(_) => Err(HandshakeError::TlsState(TlsMode::Unavailable)),
    }
}

/// The greeting and option haggling with TLS `tls` ([`TlsMode::Unavailable`] or
/// [`TlsMode::Required`]), up to an export, an abort, or an acknowledged `NBD_OPT_STARTTLS`.
pub fn negotiate_until_tls<S: Read + Write>(
    stream: &mut S,
    exports: &[ExportInfo],
    tls: TlsMode,
) -> Result<Negotiated, HandshakeError> {
    stream.write_all(&protocol::encode_greeting(SERVER_HANDSHAKE_FLAGS))?;
    stream.flush()?;
    let mut raw = [0u8; CLIENT_FLAGS_LEN];
    stream.read_exact(&mut raw)?;
    let flags = protocol::decode_client_flags(&raw, SERVER_HANDSHAKE_FLAGS)?;
    if flags & protocol::client_flags::FIXED_NEWSTYLE == 0 {
        return Err(HandshakeError::NotFixedNewstyle);
    }
    let mut resume = Resume {
        no_zeroes: flags & protocol::client_flags::NO_ZEROES != 0,
        options: 0,
    };
    options(stream, exports, tls, &mut resume)
}

/// The rest of the option haggling over the encrypted stream, after [`Negotiated::StartTls`]
/// and a completed TLS handshake.
pub fn negotiate_after_tls<S: Read + Write>(
    stream: &mut S,
    exports: &[ExportInfo],
    mut resume: Resume,
) -> Result<HandshakeEnd, HandshakeError> {
    match options(stream, exports, TlsMode::Active, &mut resume)? {
        Negotiated::Done(end) => Ok(end),
        // STARTTLS over TLS is refused with NBD_REP_ERR_INVALID.
        Negotiated::StartTls(_) => Err(HandshakeError::TlsState(TlsMode::Active)),
    }
}

fn options<S: Read + Write>(
    stream: &mut S,
    exports: &[ExportInfo],
    tls: TlsMode,
    resume: &mut Resume,
) -> Result<Negotiated, HandshakeError> {
    let no_zeroes = resume.no_zeroes;
    while resume.options < MAX_OPTIONS {
        resume.options += 1;
        let mut head = [0u8; OPTION_HEADER_LEN];
        stream.read_exact(&mut head)?;
        let header = protocol::decode_option_header(&head)?;
        // Bounded by MAX_OPTION_LEN in decode_option_header.
        let mut data = vec![0u8; header.length as usize];
        stream.read_exact(&mut data)?;
        let option = header.option;
        if tls == TlsMode::Required && !matches!(option, Opt::StartTls | Opt::Abort) {
            if option == Opt::ExportName {
                return Err(HandshakeError::TlsRequired(lossy(&data)));
            }
            let msg = format!("this server requires TLS: send NBD_OPT_STARTTLS before {option}");
            reply(stream, option, Rep::ErrTlsReqd, &error_text(&msg))?;
            stream.flush()?;
            continue;
        }
        match option {
            Opt::StartTls if tls != TlsMode::Unavailable => {
                if !data.is_empty() {
                    let msg = "NBD_OPT_STARTTLS takes no data";
                    reply(stream, option, Rep::ErrInvalid, &error_text(msg))?;
                } else if tls == TlsMode::Active {
                    let msg = "TLS is already active";
                    reply(stream, option, Rep::ErrInvalid, &error_text(msg))?;
                } else {
                    reply(stream, option, Rep::Ack, &[])?;
                    stream.flush()?;
                    return Ok(Negotiated::StartTls(*resume));
                }
            }
            Opt::ExportName => {
                let name = decode_string(&data, "export name")
                    .map_err(|_| HandshakeError::UnknownExport(lossy(&data)))?;
                let Some(i) = find_export(exports, &name) else {
                    return Err(HandshakeError::UnknownExport(name));
                };
                let e = &exports[i];
                stream.write_all(&protocol::encode_export_name_reply(
                    e.size, e.flags, no_zeroes,
                ))?;
                stream.flush()?;
                return Ok(Negotiated::Done(HandshakeEnd::Transmission {
                    export: i,
                    block_size_agreed: false,
                }));
            }
            Opt::Abort => {
                // The client may already have gone; the ACK is best effort.
                let _ = reply(stream, option, Rep::Ack, &[]).and_then(|()| stream.flush());
                return Ok(Negotiated::Done(HandshakeEnd::Aborted));
            }
            Opt::List => {
                if !data.is_empty() {
                    reply(
                        stream,
                        option,
                        Rep::ErrInvalid,
                        &error_text("NBD_OPT_LIST takes no data"),
                    )?;
                } else {
                    for e in exports {
                        let entry = protocol::encode_server_entry(&e.name, &e.description);
                        reply(stream, option, Rep::Server, &entry)?;
                    }
                    reply(stream, option, Rep::Ack, &[])?;
                }
            }
            Opt::Info | Opt::Go => {
                let req = match InfoRequest::decode(&data) {
                    Ok(req) => req,
                    Err(e) => {
                        reply(stream, option, Rep::ErrInvalid, &error_text(&e.to_string()))?;
                        stream.flush()?;
                        continue;
                    }
                };
                let Some(i) = find_export(exports, &req.name) else {
                    let names: Vec<&str> = exports.iter().map(|e| e.name.as_str()).collect();
                    let msg = format!(
                        "no export named {:?} (exports: {})",
                        req.name,
                        names.join(", ")
                    );
                    reply(stream, option, Rep::ErrUnknown, &error_text(&msg))?;
                    stream.flush()?;
                    continue;
                };
                send_infos(stream, option, &exports[i], &req.requests)?;
                reply(stream, option, Rep::Ack, &[])?;
                stream.flush()?;
                if option == Opt::Go {
                    return Ok(Negotiated::Done(HandshakeEnd::Transmission {
                        export: i,
                        block_size_agreed: req.requests.contains(&info_type::BLOCK_SIZE),
                    }));
                }
            }
            _ => {
                let msg = format!("{option} is not supported by this server");
                reply(stream, option, Rep::ErrUnsup, &error_text(&msg))?;
            }
        }
        stream.flush()?;
    }
    Err(HandshakeError::TooManyOptions)
}

/// `NBD_INFO_EXPORT` always, then each other known item the client asked for, once.
fn send_infos<S: Write>(
    stream: &mut S,
    option: Opt,
    e: &ExportInfo,
    requests: &[u16],
) -> io::Result<()> {
    let export = Info::Export {
        size: e.size,
        flags: e.flags,
    };
    reply(stream, option, Rep::Info, &export.encode())?;
    let mut sent = Vec::new();
    for &kind in requests {
        if sent.contains(&kind) {
            continue;
        }
        sent.push(kind);
        let info = match kind {
            info_type::NAME => Info::Name(e.name.clone()),
            info_type::DESCRIPTION if !e.description.is_empty() => {
                Info::Description(e.description.clone())
            }
            info_type::BLOCK_SIZE => Info::BlockSize(e.block_sizes),
            _ => continue,
        };
        reply(stream, option, Rep::Info, &info.encode())?;
    }
    Ok(())
}

fn lossy(bytes: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]).into_owned();
    if bytes.len() > 256 {
        s.push('…');
    }
    s
}

/// Checks the names and descriptions of exports before serving them.
pub fn check_exports(exports: &[ExportInfo]) -> Result<(), ProtocolError> {
    for e in exports {
        check_string(&e.name, "export name")?;
        check_string(&e.description, "export description")?;
        e.block_sizes.validate()?;
    }
    Ok(())
}
