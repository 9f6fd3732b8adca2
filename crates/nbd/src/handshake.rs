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
//! - `NBD_OPT_STRUCTURED_REPLY`: `NBD_REP_ACK` (`NBD_REP_ERR_INVALID` with data); from then on
//!   the transmission phase answers with structured replies;
//! - `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`: the one context `base:allocation`
//!   (for exports that offer block status, [`ExportInfo::block_status`]), matched by its full
//!   name, or for a list also by `base:` or no query at all; unknown names are left out of the
//!   answer, as the protocol says. A set needs structured replies first (`NBD_REP_ERR_INVALID`),
//!   replaces any earlier set, and holds only for the export it names: `NBD_OPT_GO` on another
//!   export selects no context;
//! - everything else (extended headers, unknown codes): `NBD_REP_ERR_UNSUP`.
//!
//! The empty export name selects the first export (the protocol's "default export"). Clients
//! that do not set `NBD_FLAG_C_FIXED_NEWSTYLE` are refused, as are unknown client flags, option
//! data over 64 KiB, a bad option magic, and more than [`MAX_OPTIONS`] options.

use crate::protocol::{
    self, check_string, decode_string, handshake_flags, info_type, BlockSizes, Info, InfoRequest,
    MetaRequest, Opt, ProtocolError, Rep, CLIENT_FLAGS_LEN, OPTION_HEADER_LEN,
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
    /// The export answers `NBD_CMD_BLOCK_STATUS`, so `base:allocation` is offered.
    pub block_status: bool,
}

/// The outcome of a successful handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeEnd {
    /// Transmission begins on `exports[export]`.
    Transmission {
        export: usize,
        /// The client asked for `NBD_INFO_BLOCK_SIZE` in its `NBD_OPT_GO`.
        block_size_agreed: bool,
        /// Replies are structured (`NBD_OPT_STRUCTURED_REPLY` was acknowledged).
        structured: bool,
        /// `base:allocation` is selected for this export (id [`protocol::BASE_ALLOCATION_ID`]).
        block_status: bool,
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
    structured: bool,
    /// The export `NBD_OPT_SET_META_CONTEXT` selected `base:allocation` on, if any.
    meta: Option<usize>,
}

impl Resume {
    fn transmission(&self, export: usize, block_size_agreed: bool) -> Negotiated {
        Negotiated::Done(HandshakeEnd::Transmission {
            export,
            block_size_agreed,
            structured: self.structured,
            block_status: self.meta == Some(export),
        })
    }
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
        structured: false,
        meta: None,
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
                return Ok(resume.transmission(i, false));
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
                    let agreed = req.requests.contains(&info_type::BLOCK_SIZE);
                    return Ok(resume.transmission(i, agreed));
                }
            }
            Opt::StructuredReply => {
                if data.is_empty() {
                    resume.structured = true;
                    reply(stream, option, Rep::Ack, &[])?;
                } else {
                    let msg = "NBD_OPT_STRUCTURED_REPLY takes no data";
                    reply(stream, option, Rep::ErrInvalid, &error_text(msg))?;
                }
            }
            Opt::ListMetaContext | Opt::SetMetaContext => {
                meta_context(stream, option, &data, exports, resume)?;
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

/// Answers `NBD_OPT_LIST_META_CONTEXT` or `NBD_OPT_SET_META_CONTEXT` (see the module docs).
fn meta_context<S: Write>(
    stream: &mut S,
    option: Opt,
    data: &[u8],
    exports: &[ExportInfo],
    resume: &mut Resume,
) -> io::Result<()> {
    let set = option == Opt::SetMetaContext;
    if set && !resume.structured {
        let msg = "NBD_OPT_SET_META_CONTEXT needs NBD_OPT_STRUCTURED_REPLY first";
        return reply(stream, option, Rep::ErrInvalid, &error_text(msg));
    }
    let req = match MetaRequest::decode(data) {
        Ok(req) => req,
        Err(e) => return reply(stream, option, Rep::ErrInvalid, &error_text(&e.to_string())),
    };
    let Some(i) = find_export(exports, &req.name) else {
        let msg = format!("no export named {:?}", req.name);
        return reply(stream, option, Rep::ErrUnknown, &error_text(&msg));
    };
    let matches = |q: &str| q == protocol::BASE_ALLOCATION || (!set && q == "base:");
    let chosen = exports[i].block_status
        && if req.queries.is_empty() {
            !set
        } else {
            req.queries.iter().any(|q| matches(q))
        };
    if set {
        resume.meta = chosen.then_some(i);
    }
    if chosen {
        // A list names contexts without selecting them: its id is 0, as the protocol suggests.
        let id = if set { protocol::BASE_ALLOCATION_ID } else { 0 };
        let context = protocol::encode_meta_context(id, protocol::BASE_ALLOCATION);
        reply(stream, option, Rep::MetaContext, &context)?;
    }
    reply(stream, option, Rep::Ack, &[])
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{client_flags, encode_option, tx_flags};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::io::Cursor;

    /// A client's bytes in, the server's bytes out.
    struct Pipe {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Pipe {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.write(buf)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn exports() -> Vec<ExportInfo> {
        vec![ExportInfo {
            name: "disk".into(),
            description: String::new(),
            size: 1 << 20,
            flags: tx_flags::HAS_FLAGS,
            block_sizes: BlockSizes {
                min: 1,
                preferred: 4096,
                max_payload: 1 << 20,
            },
            block_status: true,
        }]
    }

    fn option(opt: Opt, data: &[u8]) -> Vec<u8> {
        encode_option(opt, data).expect("encodable option")
    }

    #[test]
    fn tls_required_refuses_everything_but_starttls_and_abort() {
        let mut bytes = (client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES)
            .to_be_bytes()
            .to_vec();
        bytes.extend(option(Opt::List, &[]));
        bytes.extend(option(Opt::StartTls, b"x"));
        bytes.extend(option(Opt::StartTls, &[]));
        let mut pipe = Pipe {
            input: Cursor::new(bytes),
            output: Vec::new(),
        };
        let end = negotiate_until_tls(&mut pipe, &exports(), TlsMode::Required).unwrap();
        assert!(matches!(end, Negotiated::StartTls(_)), "{end:?}");
        let replies = &pipe.output[protocol::GREETING_LEN..];
        let first = protocol::decode_option_reply_header(&replies[..20]).unwrap();
        assert_eq!((first.option, first.reply), (Opt::List, Rep::ErrTlsReqd));
    }

    /// The replies' (option, reply type, data) after the greeting.
    fn replies(output: &[u8]) -> Vec<(Opt, Rep, Vec<u8>)> {
        let mut out = Vec::new();
        let mut rest = &output[protocol::GREETING_LEN..];
        while rest.len() >= protocol::OPTION_REPLY_HEADER_LEN {
            let h = protocol::decode_option_reply_header(rest).unwrap();
            let end = protocol::OPTION_REPLY_HEADER_LEN + h.length as usize;
            out.push((
                h.option,
                h.reply,
                rest[protocol::OPTION_REPLY_HEADER_LEN..end].to_vec(),
            ));
            rest = &rest[end..];
        }
        out
    }

    #[test]
    fn base_allocation_is_selected_only_after_structured_replies_and_for_its_export() {
        let meta = |queries: &[&str]| {
            MetaRequest {
                name: "disk".into(),
                queries: queries.iter().map(|q| q.to_string()).collect(),
            }
            .encode()
        };
        let go = InfoRequest {
            name: "disk".into(),
            requests: vec![],
        }
        .encode();
        let run = |opts: &[(Opt, Vec<u8>)]| {
            let mut bytes = client_flags::FIXED_NEWSTYLE.to_be_bytes().to_vec();
            for (o, d) in opts {
                bytes.extend(option(*o, d));
            }
            let mut pipe = Pipe {
                input: Cursor::new(bytes),
                output: Vec::new(),
            };
            let end = negotiate(&mut pipe, &exports()).unwrap();
            (end, replies(&pipe.output))
        };
        // Set before structured replies: refused; the GO selects nothing.
        let (end, r) = run(&[
            (Opt::SetMetaContext, meta(&["base:allocation"])),
            (Opt::Go, go.clone()),
        ]);
        assert_eq!(r[0].1, Rep::ErrInvalid);
        assert!(matches!(
            end,
            HandshakeEnd::Transmission {
                structured: false,
                block_status: false,
                ..
            }
        ));
        // List with no query names the context (id 0); unknown names are left out; the set
        // selects it with its id.
        let (end, r) = run(&[
            (Opt::ListMetaContext, meta(&[])),
            (Opt::StructuredReply, vec![]),
            (
                Opt::SetMetaContext,
                meta(&["qemu:dirty-bitmap:x", "base:allocation"]),
            ),
            (Opt::Go, go.clone()),
        ]);
        let ctx = |id| protocol::encode_meta_context(id, protocol::BASE_ALLOCATION);
        assert_eq!(r[0], (Opt::ListMetaContext, Rep::MetaContext, ctx(0)));
        assert_eq!(r[1].1, Rep::Ack);
        assert_eq!(r[2].1, Rep::Ack);
        assert_eq!(
            r[3],
            (
                Opt::SetMetaContext,
                Rep::MetaContext,
                ctx(protocol::BASE_ALLOCATION_ID)
            )
        );
        assert_eq!(r[4].1, Rep::Ack);
        assert!(matches!(
            end,
            HandshakeEnd::Transmission {
                structured: true,
                block_status: true,
                ..
            }
        ));
        // Unknown contexts only: an empty answer and no block status; a bad request or an
        // unknown export is refused.
        let mut unknown = meta(&[]);
        unknown[3] = 5;
        let (end, r) = run(&[
            (Opt::StructuredReply, vec![]),
            (Opt::SetMetaContext, meta(&["base:allocation"])),
            (Opt::SetMetaContext, meta(&["nope:x", "base:"])),
            (Opt::SetMetaContext, vec![0, 0]),
            (Opt::ListMetaContext, unknown),
            (Opt::Go, go),
        ]);
        let kinds: Vec<Rep> = r.iter().map(|x| x.1).collect();
        assert_eq!(
            kinds,
            [
                Rep::Ack,
                Rep::MetaContext,
                Rep::Ack,
                Rep::Ack,
                Rep::ErrInvalid,
                Rep::ErrInvalid,
                Rep::Info,
                Rep::Ack
            ]
        );
        assert!(matches!(
            end,
            HandshakeEnd::Transmission {
                block_status: false,
                ..
            }
        ));
    }

    /// Before TLS, a server that requires it says nothing about its exports: every reply is a
    /// refusal or the ACK of STARTTLS or ABORT.
    fn assert_nothing_leaks_before_tls(output: &[u8]) {
        let mut rest = output.get(protocol::GREETING_LEN..).unwrap_or(&[]);
        while rest.len() >= protocol::OPTION_REPLY_HEADER_LEN {
            let h =
                protocol::decode_option_reply_header(&rest[..protocol::OPTION_REPLY_HEADER_LEN])
                    .expect("the server's replies decode");
            let allowed = match h.reply {
                Rep::ErrTlsReqd | Rep::ErrInvalid => true,
                Rep::Ack => matches!(h.option, Opt::StartTls | Opt::Abort),
                _ => false,
            };
            assert!(allowed, "{} to {} before TLS", h.reply, h.option);
            let len = protocol::OPTION_REPLY_HEADER_LEN + h.length as usize;
            rest = rest.get(len..).unwrap_or(&[]);
        }
        assert!(rest.is_empty(), "a partial reply");
    }

    /// Seeded random mutations of plausible option streams, in every TLS mode: the state
    /// machine answers or refuses, and never panics or runs past its option limit.
    #[test]
    fn mangled_option_streams_never_panic() {
        let mut rng = SmallRng::seed_from_u64(6);
        let opts = [
            Opt::StartTls,
            Opt::Go,
            Opt::Info,
            Opt::List,
            Opt::Abort,
            Opt::ExportName,
            Opt::StructuredReply,
            Opt::ListMetaContext,
            Opt::SetMetaContext,
        ];
        for _ in 0..3000 {
            let mut bytes = (client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES)
                .to_be_bytes()
                .to_vec();
            for _ in 0..rng.gen_range(1..8) {
                let opt = opts[rng.gen_range(0..opts.len())];
                let data: Vec<u8> = match opt {
                    Opt::Go | Opt::Info => InfoRequest {
                        name: "disk".into(),
                        requests: vec![info_type::BLOCK_SIZE],
                    }
                    .encode(),
                    Opt::ExportName => b"disk".to_vec(),
                    Opt::ListMetaContext | Opt::SetMetaContext => MetaRequest {
                        name: "disk".into(),
                        queries: vec![protocol::BASE_ALLOCATION.into()],
                    }
                    .encode(),
                    _ if rng.gen_bool(0.2) => vec![rng.gen(); rng.gen_range(1..9)],
                    _ => Vec::new(),
                };
                bytes.extend(option(opt, &data));
            }
            for _ in 0..rng.gen_range(0..4) {
                let i = rng.gen_range(0..bytes.len());
                bytes[i] = rng.gen();
            }
            if rng.gen_bool(0.3) {
                bytes.truncate(rng.gen_range(0..bytes.len()));
            }
            for mode in [TlsMode::Unavailable, TlsMode::Required] {
                let mut pipe = Pipe {
                    input: Cursor::new(bytes.clone()),
                    output: Vec::new(),
                };
                let end = negotiate_until_tls(&mut pipe, &exports(), mode);
                if mode == TlsMode::Required {
                    assert_nothing_leaks_before_tls(&pipe.output);
                }
                if let Ok(Negotiated::StartTls(resume)) = end {
                    assert_eq!(mode, TlsMode::Required, "STARTTLS acknowledged without TLS");
                    // Go on as if TLS were up, over the rest of the same bytes.
                    let _ = negotiate_after_tls(&mut pipe, &exports(), resume);
                }
            }
        }
    }
}
