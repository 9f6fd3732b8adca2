//! The NBD wire format: every message of the fixed newstyle handshake and of the transmission
//! phase (simple replies, and structured reply chunks: data, none, error, block status), as pure
//! functions over bytes.
//!
//! This module owns the constants (magics, flags, option, reply, info and command codes, error
//! values), the encoders, the decoders and the semantic check of a transmission request against an
//! export ([`check_request`]). Decoders take untrusted bytes and never panic: a short, oversized or
//! inconsistent message is a typed [`ProtocolError`]. Lengths are bounded: option data and option
//! replies at [`MAX_OPTION_LEN`], read and write payloads at [`MAX_PAYLOAD`], strings at
//! [`MAX_STRING_LEN`]. All integers are big-endian (network order), as the protocol says.
//!
//! The reference is the NBD project's `doc/proto.md`; this is our own implementation of it.

use std::fmt;

/// `NBDMAGIC`, the first 8 bytes a server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle greeting's second magic, and the prefix of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The oldstyle greeting's second magic (we neither speak nor accept oldstyle).
pub const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
/// Prefix of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of every simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Bytes of a structured reply chunk header: magic, flags, type, cookie, length.
pub const CHUNK_HEADER_LEN: usize = 20;
/// The one metadata context this server offers.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id the server gives `base:allocation` when a client selects it.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// Most descriptors one block-status reply carries; a reply may describe only a prefix of the
/// range asked about, and the client asks again for the rest.
pub const MAX_EXTENTS: usize = 1 << 16;

/// The largest read or write payload accepted or sent (the protocol's interoperable 32 MiB).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// The largest option request or option reply data accepted.
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// The largest string (export name, description, message) the protocol allows.
pub const MAX_STRING_LEN: usize = 4096;

/// Bytes of the server's greeting: magic, `IHAVEOPT`, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Bytes of the client's flags.
pub const CLIENT_FLAGS_LEN: usize = 4;
/// Bytes of an option request header: `IHAVEOPT`, option, length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Bytes of an option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Bytes of the reply to `NBD_OPT_EXPORT_NAME` before the optional zero padding.
pub const EXPORT_NAME_REPLY_LEN: usize = 10;
/// The zero padding after the `NBD_OPT_EXPORT_NAME` reply unless `NO_ZEROES` was agreed.
pub const EXPORT_NAME_PAD_LEN: usize = 124;
/// Bytes of a transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;

/// Handshake flags (16 bits, sent by the server in its greeting).
pub mod handshake_flags {
    /// The server speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// The server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (32 bits, the client's answer to the greeting).
pub mod client_flags {
    /// The client speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// The client wants no zero padding after `NBD_OPT_EXPORT_NAME`.
    pub const NO_ZEROES: u32 = 1 << 1;
    /// Every flag a client may set.
    pub const KNOWN: u32 = FIXED_NEWSTYLE | NO_ZEROES;
}

/// Transmission flags (16 bits, describing an export).
pub mod tx_flags {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const ROTATIONAL: u16 = 1 << 4;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_RESIZE: u16 = 1 << 9;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Command flags (16 bits, on each transmission request).
pub mod cmd_flags {
    /// Force unit access: reply only once the command's writes are durable.
    pub const FUA: u16 = 1 << 0;
    /// `WRITE_ZEROES` must leave the range allocated.
    pub const NO_HOLE: u16 = 1 << 1;
    /// Don't fragment a structured read reply (needs structured replies).
    pub const DF: u16 = 1 << 2;
    /// One extent per block-status reply (needs structured replies).
    pub const REQ_ONE: u16 = 1 << 3;
    /// Fail `WRITE_ZEROES` unless it is fast (needs `SEND_FAST_ZERO`).
    pub const FAST_ZERO: u16 = 1 << 4;
    /// Extended headers' payload length (needs extended headers).
    pub const PAYLOAD_LEN: u16 = 1 << 5;
}

/// Flags of a structured reply chunk.
pub mod chunk_flags {
    /// The last chunk of the reply.
    pub const DONE: u16 = 1 << 0;
}

/// Types of structured reply chunks.
pub mod chunk_type {
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const BLOCK_STATUS: u16 = 5;
    pub const ERROR: u16 = (1 << 15) + 1;
    pub const ERROR_OFFSET: u16 = (1 << 15) + 2;
}

/// Status flags of `base:allocation` extents.
pub mod state_flags {
    /// Not allocated.
    pub const HOLE: u32 = 1 << 0;
    /// Reads as zeroes.
    pub const ZERO: u32 = 1 << 1;
}

/// Information types of `NBD_REP_INFO` replies and `NBD_OPT_INFO`/`NBD_OPT_GO` requests.
pub mod info_type {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Why bytes could not be decoded (or a message could not be encoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Fewer bytes than the message needs.
    #[error("{what} is truncated: needs {need} bytes, got {got}")]
    Truncated {
        what: &'static str,
        need: usize,
        got: usize,
    },
    /// A magic number does not match.
    #[error("{what} has bad magic {found:#x} (expected {expected:#x})")]
    BadMagic {
        what: &'static str,
        found: u64,
        expected: u64,
    },
    /// The peer speaks the oldstyle handshake, which kura does not.
    #[error("the server uses the oldstyle handshake, which is not supported")]
    Oldstyle,
    /// The server did not offer fixed newstyle.
    #[error("the server does not offer the fixed newstyle handshake")]
    NotFixedNewstyle,
    /// The client set flags the protocol does not define or the server did not offer.
    #[error("client flags {flags:#x} include unknown or unoffered bits")]
    BadClientFlags { flags: u32 },
    /// An option's data (or an option reply's) is longer than we accept.
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLong {
        what: &'static str,
        len: u64,
        max: u64,
    },
    /// A string that is not valid UTF-8, contains NUL, or is too long.
    #[error("{what} is not a valid NBD string: {reason}")]
    BadString {
        what: &'static str,
        reason: &'static str,
    },
    /// Option data whose parts do not add up.
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    /// The server sent a structured reply although none was negotiated.
    #[error("unexpected structured reply (structured replies were not negotiated)")]
    UnexpectedStructuredReply,
}

/// Result of decoding.
pub type ProtoResult<T> = Result<T, ProtocolError>;

/// A bounds-checked big-endian reader over untrusted bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Cursor { buf, pos: 0, what }
    }

    fn take(&mut self, n: usize) -> ProtoResult<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(ProtocolError::Truncated {
                what: self.what,
                need: self.pos.saturating_add(n),
                got: self.buf.len(),
            }),
        }
    }

    fn array<const N: usize>(&mut self) -> ProtoResult<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u16(&mut self) -> ProtoResult<u16> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> ProtoResult<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> ProtoResult<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos.min(self.buf.len())..];
        self.pos = self.buf.len();
        s
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
}

/// Checks an NBD string: UTF-8, no NUL, at most [`MAX_STRING_LEN`] bytes.
pub fn decode_string(bytes: &[u8], what: &'static str) -> ProtoResult<String> {
    if bytes.len() > MAX_STRING_LEN {
        return Err(ProtocolError::BadString {
            what,
            reason: "longer than 4096 bytes",
        });
    }
    if bytes.contains(&0) {
        return Err(ProtocolError::BadString {
            what,
            reason: "contains NUL",
        });
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(_) => Err(ProtocolError::BadString {
            what,
            reason: "not UTF-8",
        }),
    }
}

/// Checks a string we are about to send against the same rules.
pub fn check_string(s: &str, what: &'static str) -> ProtoResult<()> {
    decode_string(s.as_bytes(), what).map(|_| ())
}

// ---------------------------------------------------------------------------------------------
// Handshake: greeting and client flags
// ---------------------------------------------------------------------------------------------

/// The server's greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn encode_greeting(flags: u16) -> [u8; GREETING_LEN] {
    let mut out = [0u8; GREETING_LEN];
    out[..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..].copy_from_slice(&flags.to_be_bytes());
    out
}

/// Decodes the server's greeting and returns its handshake flags. Refuses oldstyle servers and
/// servers that do not offer fixed newstyle.
pub fn decode_greeting(bytes: &[u8]) -> ProtoResult<u16> {
    let mut c = Cursor::new(bytes, "server greeting");
    let magic = c.u64()?;
    if magic != NBD_MAGIC {
        return Err(ProtocolError::BadMagic {
            what: "server greeting",
            found: magic,
            expected: NBD_MAGIC,
        });
    }
    let second = c.u64()?;
    if second == OLDSTYLE_MAGIC {
        return Err(ProtocolError::Oldstyle);
    }
    if second != IHAVEOPT {
        return Err(ProtocolError::BadMagic {
            what: "server greeting",
            found: second,
            expected: IHAVEOPT,
        });
    }
    let flags = c.u16()?;
    if flags & handshake_flags::FIXED_NEWSTYLE == 0 {
        return Err(ProtocolError::NotFixedNewstyle);
    }
    Ok(flags)
}

/// Decodes the client's flags, refusing unknown bits and bits the server did not offer
/// (`offered` are the server's handshake flags), as the protocol requires.
pub fn decode_client_flags(bytes: &[u8], offered: u16) -> ProtoResult<u32> {
    let flags = Cursor::new(bytes, "client flags").u32()?;
    let unoffered_no_zeroes =
        flags & client_flags::NO_ZEROES != 0 && offered & handshake_flags::NO_ZEROES == 0;
    if flags & !client_flags::KNOWN != 0 || unoffered_no_zeroes {
        return Err(ProtocolError::BadClientFlags { flags });
    }
    Ok(flags)
}

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

/// An option code of the handshake phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opt {
    ExportName,
    Abort,
    List,
    PeekExport,
    StartTls,
    Info,
    Go,
    StructuredReply,
    ListMetaContext,
    SetMetaContext,
    ExtendedHeaders,
    /// Any code this implementation does not know.
    Other(u32),
}

impl Opt {
    pub fn from_code(code: u32) -> Opt {
        match code {
            1 => Opt::ExportName,
            2 => Opt::Abort,
            3 => Opt::List,
            4 => Opt::PeekExport,
            5 => Opt::StartTls,
            6 => Opt::Info,
            7 => Opt::Go,
            8 => Opt::StructuredReply,
            9 => Opt::ListMetaContext,
            10 => Opt::SetMetaContext,
            11 => Opt::ExtendedHeaders,
            other => Opt::Other(other),
        }
    }

    pub fn code(self) -> u32 {
        match self {
            Opt::ExportName => 1,
            Opt::Abort => 2,
            Opt::List => 3,
            Opt::PeekExport => 4,
            Opt::StartTls => 5,
            Opt::Info => 6,
            Opt::Go => 7,
            Opt::StructuredReply => 8,
            Opt::ListMetaContext => 9,
            Opt::SetMetaContext => 10,
            Opt::ExtendedHeaders => 11,
            Opt::Other(code) => code,
        }
    }
}

impl fmt::Display for Opt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Opt::ExportName => "NBD_OPT_EXPORT_NAME",
            Opt::Abort => "NBD_OPT_ABORT",
            Opt::List => "NBD_OPT_LIST",
            Opt::PeekExport => "NBD_OPT_PEEK_EXPORT",
            Opt::StartTls => "NBD_OPT_STARTTLS",
            Opt::Info => "NBD_OPT_INFO",
            Opt::Go => "NBD_OPT_GO",
            Opt::StructuredReply => "NBD_OPT_STRUCTURED_REPLY",
            Opt::ListMetaContext => "NBD_OPT_LIST_META_CONTEXT",
            Opt::SetMetaContext => "NBD_OPT_SET_META_CONTEXT",
            Opt::ExtendedHeaders => "NBD_OPT_EXTENDED_HEADERS",
            Opt::Other(code) => return write!(f, "option {code}"),
        };
        f.write_str(name)
    }
}

/// The header of an option request; `length` bytes of data follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: Opt,
    pub length: u32,
}

/// An option request: header and data. Fails when the data exceeds [`MAX_OPTION_LEN`].
pub fn encode_option(option: Opt, data: &[u8]) -> ProtoResult<Vec<u8>> {
    if data.len() as u64 > u64::from(MAX_OPTION_LEN) {
        return Err(ProtocolError::TooLong {
            what: "option data",
            len: data.len() as u64,
            max: u64::from(MAX_OPTION_LEN),
        });
    }
    let mut out = Vec::with_capacity(OPTION_HEADER_LEN + data.len());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.code().to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    Ok(out)
}

/// Decodes an option request header, refusing a bad magic or data longer than [`MAX_OPTION_LEN`].
pub fn decode_option_header(bytes: &[u8]) -> ProtoResult<OptionHeader> {
    let mut c = Cursor::new(bytes, "option header");
    let magic = c.u64()?;
    if magic != IHAVEOPT {
        return Err(ProtocolError::BadMagic {
            what: "option header",
            found: magic,
            expected: IHAVEOPT,
        });
    }
    let option = Opt::from_code(c.u32()?);
    let length = c.u32()?;
    if length > MAX_OPTION_LEN {
        return Err(ProtocolError::TooLong {
            what: "option data",
            len: u64::from(length),
            max: u64::from(MAX_OPTION_LEN),
        });
    }
    Ok(OptionHeader { option, length })
}

/// The reply type of an option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rep {
    Ack,
    Server,
    Info,
    MetaContext,
    ErrUnsup,
    ErrPolicy,
    ErrInvalid,
    ErrPlatform,
    ErrTlsReqd,
    ErrUnknown,
    ErrShutdown,
    ErrBlockSizeReqd,
    ErrTooBig,
    ErrExtHeaderReqd,
    /// Any other code (an error if bit 31 is set).
    Other(u32),
}

const REP_ERR: u32 = 1 << 31;

impl Rep {
    pub fn from_code(code: u32) -> Rep {
        match code {
            1 => Rep::Ack,
            2 => Rep::Server,
            3 => Rep::Info,
            4 => Rep::MetaContext,
            c if c == REP_ERR + 1 => Rep::ErrUnsup,
            c if c == REP_ERR + 2 => Rep::ErrPolicy,
            c if c == REP_ERR + 3 => Rep::ErrInvalid,
            c if c == REP_ERR + 4 => Rep::ErrPlatform,
            c if c == REP_ERR + 5 => Rep::ErrTlsReqd,
            c if c == REP_ERR + 6 => Rep::ErrUnknown,
            c if c == REP_ERR + 7 => Rep::ErrShutdown,
            c if c == REP_ERR + 8 => Rep::ErrBlockSizeReqd,
            c if c == REP_ERR + 9 => Rep::ErrTooBig,
            c if c == REP_ERR + 10 => Rep::ErrExtHeaderReqd,
            other => Rep::Other(other),
        }
    }

    pub fn code(self) -> u32 {
        match self {
            Rep::Ack => 1,
            Rep::Server => 2,
            Rep::Info => 3,
            Rep::MetaContext => 4,
            Rep::ErrUnsup => REP_ERR + 1,
            Rep::ErrPolicy => REP_ERR + 2,
            Rep::ErrInvalid => REP_ERR + 3,
            Rep::ErrPlatform => REP_ERR + 4,
            Rep::ErrTlsReqd => REP_ERR + 5,
            Rep::ErrUnknown => REP_ERR + 6,
            Rep::ErrShutdown => REP_ERR + 7,
            Rep::ErrBlockSizeReqd => REP_ERR + 8,
            Rep::ErrTooBig => REP_ERR + 9,
            Rep::ErrExtHeaderReqd => REP_ERR + 10,
            Rep::Other(code) => code,
        }
    }

    /// Error replies have bit 31 set; their data, if any, is a message for humans.
    pub fn is_error(self) -> bool {
        self.code() & REP_ERR != 0
    }
}

impl fmt::Display for Rep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Rep::Ack => "NBD_REP_ACK",
            Rep::Server => "NBD_REP_SERVER",
            Rep::Info => "NBD_REP_INFO",
            Rep::MetaContext => "NBD_REP_META_CONTEXT",
            Rep::ErrUnsup => "NBD_REP_ERR_UNSUP",
            Rep::ErrPolicy => "NBD_REP_ERR_POLICY",
            Rep::ErrInvalid => "NBD_REP_ERR_INVALID",
            Rep::ErrPlatform => "NBD_REP_ERR_PLATFORM",
            Rep::ErrTlsReqd => "NBD_REP_ERR_TLS_REQD",
            Rep::ErrUnknown => "NBD_REP_ERR_UNKNOWN",
            Rep::ErrShutdown => "NBD_REP_ERR_SHUTDOWN",
            Rep::ErrBlockSizeReqd => "NBD_REP_ERR_BLOCK_SIZE_REQD",
            Rep::ErrTooBig => "NBD_REP_ERR_TOO_BIG",
            Rep::ErrExtHeaderReqd => "NBD_REP_ERR_EXT_HEADER_REQD",
            Rep::Other(code) => return write!(f, "reply type {code:#x}"),
        };
        f.write_str(name)
    }
}

/// The header of an option reply; `length` bytes of data follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: Opt,
    pub reply: Rep,
    pub length: u32,
}

/// An option reply: header and data (data is truncated to [`MAX_OPTION_LEN`]; every reply this
/// crate builds is far smaller).
pub fn encode_option_reply(option: Opt, reply: Rep, data: &[u8]) -> Vec<u8> {
    let data = &data[..data.len().min(MAX_OPTION_LEN as usize)];
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_LEN + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.code().to_be_bytes());
    out.extend_from_slice(&reply.code().to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// Decodes an option reply header, refusing a bad magic or data longer than [`MAX_OPTION_LEN`].
pub fn decode_option_reply_header(bytes: &[u8]) -> ProtoResult<OptionReplyHeader> {
    let mut c = Cursor::new(bytes, "option reply header");
    let magic = c.u64()?;
    if magic != OPTION_REPLY_MAGIC {
        return Err(ProtocolError::BadMagic {
            what: "option reply header",
            found: magic,
            expected: OPTION_REPLY_MAGIC,
        });
    }
    let option = Opt::from_code(c.u32()?);
    let reply = Rep::from_code(c.u32()?);
    let length = c.u32()?;
    if length > MAX_OPTION_LEN {
        return Err(ProtocolError::TooLong {
            what: "option reply data",
            len: u64::from(length),
            max: u64::from(MAX_OPTION_LEN),
        });
    }
    Ok(OptionReplyHeader {
        option,
        reply,
        length,
    })
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`: an export name and the information wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    /// Information types requested (`info_type::*`), in the client's order.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.name.len() + 2 + 2 * self.requests.len());
        out.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&(self.requests.len() as u16).to_be_bytes());
        for r in &self.requests {
            out.extend_from_slice(&r.to_be_bytes());
        }
        out
    }

    /// Decodes the option data; the parts must add up to exactly its length.
    pub fn decode(data: &[u8]) -> ProtoResult<InfoRequest> {
        let mut c = Cursor::new(data, "NBD_OPT_INFO/GO data");
        let name_len = c.u32()? as usize;
        if name_len > c.remaining().saturating_sub(2) {
            return Err(ProtocolError::Malformed {
                what: "NBD_OPT_INFO/GO data",
                reason: format!(
                    "name length {name_len} exceeds the {} bytes of option data",
                    data.len()
                ),
            });
        }
        let name = decode_string(c.take(name_len)?, "export name")?;
        let count = usize::from(c.u16()?);
        if c.remaining() != 2 * count {
            return Err(ProtocolError::Malformed {
                what: "NBD_OPT_INFO/GO data",
                reason: format!(
                    "{count} information request(s) need {} bytes, {} remain",
                    2 * count,
                    c.remaining()
                ),
            });
        }
        let mut requests = Vec::with_capacity(count);
        for _ in 0..count {
            requests.push(c.u16()?);
        }
        Ok(InfoRequest { name, requests })
    }
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`: an export name and
/// the context queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub name: String,
    pub queries: Vec<String>,
}

impl MetaRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            out.extend_from_slice(&(q.len() as u32).to_be_bytes());
            out.extend_from_slice(q.as_bytes());
        }
        out
    }

    /// Decodes the option data; the parts must add up to exactly its length, and every string
    /// is checked like an export name.
    pub fn decode(data: &[u8]) -> ProtoResult<MetaRequest> {
        const WHAT: &str = "NBD_OPT_*_META_CONTEXT data";
        let malformed = |reason: String| ProtocolError::Malformed { what: WHAT, reason };
        let mut c = Cursor::new(data, WHAT);
        let name_len = c.u32()? as usize;
        if name_len > c.remaining() {
            return Err(malformed(format!(
                "name length {name_len} exceeds the {} bytes of option data",
                data.len()
            )));
        }
        let name = decode_string(c.take(name_len)?, "export name")?;
        let count = c.u32()? as usize;
        // Each query takes at least its 4-byte length: a count past that is a lie.
        if count > c.remaining() / 4 {
            return Err(malformed(format!(
                "{count} queries cannot fit in {} bytes",
                c.remaining()
            )));
        }
        let mut queries = Vec::with_capacity(count);
        for _ in 0..count {
            let len = c.u32()? as usize;
            if len > c.remaining() {
                return Err(malformed(format!("query length {len} exceeds the data")));
            }
            queries.push(decode_string(c.take(len)?, "context query")?);
        }
        if c.remaining() != 0 {
            return Err(malformed(format!("{} trailing bytes", c.remaining())));
        }
        Ok(MetaRequest { name, queries })
    }
}

/// The data of an `NBD_REP_META_CONTEXT` reply: the context's id and name.
pub fn encode_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decodes an `NBD_REP_META_CONTEXT` reply's data into (id, name).
pub fn decode_meta_context(data: &[u8]) -> ProtoResult<(u32, String)> {
    let mut c = Cursor::new(data, "NBD_REP_META_CONTEXT data");
    let id = c.u32()?;
    Ok((id, decode_string(c.rest(), "context name")?))
}

/// The data of an `NBD_REP_SERVER` reply to `NBD_OPT_LIST`: name, then a description.
pub fn encode_server_entry(name: &str, description: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len() + description.len());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.as_bytes());
    out
}

/// Decodes an `NBD_REP_SERVER` reply's data into (name, description).
pub fn decode_server_entry(data: &[u8]) -> ProtoResult<(String, String)> {
    let mut c = Cursor::new(data, "NBD_REP_SERVER data");
    let name_len = c.u32()? as usize;
    if name_len > c.remaining() {
        return Err(ProtocolError::Malformed {
            what: "NBD_REP_SERVER data",
            reason: format!("name length {name_len} exceeds the reply"),
        });
    }
    let name = decode_string(c.take(name_len)?, "export name")?;
    let description = decode_string(c.rest(), "export description")?;
    Ok((name, description))
}

/// Size constraints of an export (`NBD_INFO_BLOCK_SIZE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Smallest addressable length and alignment.
    pub min: u32,
    /// Size and alignment at which I/O is efficient.
    pub preferred: u32,
    /// Largest read or write payload.
    pub max_payload: u32,
}

impl BlockSizes {
    /// The protocol's defaults when nothing is advertised.
    pub const DEFAULT: BlockSizes = BlockSizes {
        min: 1,
        preferred: 4096,
        max_payload: MAX_PAYLOAD,
    };

    /// Checks the protocol's rules: powers of two, min ≤ 64 KiB, preferred ≥ max(min, 512),
    /// max_payload ≥ preferred.
    pub fn validate(&self) -> ProtoResult<()> {
        let bad = |reason: String| {
            Err(ProtocolError::Malformed {
                what: "NBD_INFO_BLOCK_SIZE",
                reason,
            })
        };
        if !self.min.is_power_of_two() || self.min > 65536 {
            return bad(format!(
                "minimum {} is not a power of two up to 64 KiB",
                self.min
            ));
        }
        if !self.preferred.is_power_of_two() || self.preferred < self.min.max(512) {
            return bad(format!(
                "preferred {} is not a power of two of at least max(minimum, 512)",
                self.preferred
            ));
        }
        if self.max_payload < self.preferred {
            return bad(format!(
                "maximum payload {} is below the preferred size {}",
                self.max_payload, self.preferred
            ));
        }
        Ok(())
    }
}

/// One `NBD_REP_INFO` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    /// Size in bytes and transmission flags (mandatory before a successful `NBD_REP_ACK`).
    Export { size: u64, flags: u16 },
    /// The export's canonical name.
    Name(String),
    /// A description for humans.
    Description(String),
    /// Size constraints.
    BlockSize(BlockSizes),
    /// A type this implementation does not know (clients ignore it).
    Unknown(u16),
}

impl Info {
    /// The `NBD_REP_INFO` data of this item.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        match self {
            Info::Export { size, flags } => {
                out.extend_from_slice(&info_type::EXPORT.to_be_bytes());
                out.extend_from_slice(&size.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
            }
            Info::Name(name) => {
                out.extend_from_slice(&info_type::NAME.to_be_bytes());
                out.extend_from_slice(name.as_bytes());
            }
            Info::Description(text) => {
                out.extend_from_slice(&info_type::DESCRIPTION.to_be_bytes());
                out.extend_from_slice(text.as_bytes());
            }
            Info::BlockSize(b) => {
                out.extend_from_slice(&info_type::BLOCK_SIZE.to_be_bytes());
                out.extend_from_slice(&b.min.to_be_bytes());
                out.extend_from_slice(&b.preferred.to_be_bytes());
                out.extend_from_slice(&b.max_payload.to_be_bytes());
            }
            Info::Unknown(kind) => out.extend_from_slice(&kind.to_be_bytes()),
        }
        out
    }

    /// Decodes an `NBD_REP_INFO` reply's data, checking each type's exact length.
    pub fn decode(data: &[u8]) -> ProtoResult<Info> {
        let mut c = Cursor::new(data, "NBD_REP_INFO data");
        let kind = c.u16()?;
        let exact = |c: &Cursor<'_>, len: usize, what: &'static str| {
            if c.remaining() == len {
                Ok(())
            } else {
                Err(ProtocolError::Malformed {
                    what,
                    reason: format!("payload is {} bytes, must be {len}", c.remaining()),
                })
            }
        };
        Ok(match kind {
            info_type::EXPORT => {
                exact(&c, 10, "NBD_INFO_EXPORT")?;
                Info::Export {
                    size: c.u64()?,
                    flags: c.u16()?,
                }
            }
            info_type::NAME => Info::Name(decode_string(c.rest(), "export name")?),
            info_type::DESCRIPTION => {
                Info::Description(decode_string(c.rest(), "export description")?)
            }
            info_type::BLOCK_SIZE => {
                exact(&c, 12, "NBD_INFO_BLOCK_SIZE")?;
                Info::BlockSize(BlockSizes {
                    min: c.u32()?,
                    preferred: c.u32()?,
                    max_payload: c.u32()?,
                })
            }
            other => Info::Unknown(other),
        })
    }
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, transmission flags, and 124 zero bytes unless
/// `NO_ZEROES` was agreed.
pub fn encode_export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let pad = if no_zeroes { 0 } else { EXPORT_NAME_PAD_LEN };
    let mut out = Vec::with_capacity(EXPORT_NAME_REPLY_LEN + pad);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.resize(EXPORT_NAME_REPLY_LEN + pad, 0);
    out
}

/// Decodes the first [`EXPORT_NAME_REPLY_LEN`] bytes of the reply to `NBD_OPT_EXPORT_NAME` into
/// (size, transmission flags).
pub fn decode_export_name_reply(bytes: &[u8]) -> ProtoResult<(u64, u16)> {
    let mut c = Cursor::new(bytes, "NBD_OPT_EXPORT_NAME reply");
    Ok((c.u64()?, c.u16()?))
}

// ---------------------------------------------------------------------------------------------
// Transmission
// ---------------------------------------------------------------------------------------------

/// A transmission command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Resize,
    /// Any code this implementation does not know.
    Other(u16),
}

impl Command {
    pub fn from_code(code: u16) -> Command {
        match code {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disc,
            3 => Command::Flush,
            4 => Command::Trim,
            5 => Command::Cache,
            6 => Command::WriteZeroes,
            7 => Command::BlockStatus,
            8 => Command::Resize,
            other => Command::Other(other),
        }
    }

    pub fn code(self) -> u16 {
        match self {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disc => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::Cache => 5,
            Command::WriteZeroes => 6,
            Command::BlockStatus => 7,
            Command::Resize => 8,
            Command::Other(code) => code,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Command::Read => "NBD_CMD_READ",
            Command::Write => "NBD_CMD_WRITE",
            Command::Disc => "NBD_CMD_DISC",
            Command::Flush => "NBD_CMD_FLUSH",
            Command::Trim => "NBD_CMD_TRIM",
            Command::Cache => "NBD_CMD_CACHE",
            Command::WriteZeroes => "NBD_CMD_WRITE_ZEROES",
            Command::BlockStatus => "NBD_CMD_BLOCK_STATUS",
            Command::Resize => "NBD_CMD_RESIZE",
            Command::Other(code) => return write!(f, "command {code}"),
        };
        f.write_str(name)
    }
}

/// A transmission request header; a write's `length` bytes of payload follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags (`cmd_flags::*`).
    pub flags: u16,
    pub command: Command,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut out = [0u8; REQUEST_LEN];
        out[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.code().to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    /// Decodes a request header, refusing a bad magic (after which the stream cannot be
    /// resynchronised, so the connection must close).
    pub fn decode(bytes: &[u8]) -> ProtoResult<RequestHeader> {
        let mut c = Cursor::new(bytes, "request header");
        let magic = c.u32()?;
        if magic != REQUEST_MAGIC {
            return Err(ProtocolError::BadMagic {
                what: "request header",
                found: u64::from(magic),
                expected: u64::from(REQUEST_MAGIC),
            });
        }
        Ok(RequestHeader {
            flags: c.u16()?,
            command: Command::from_code(c.u16()?),
            cookie: c.u64()?,
            offset: c.u64()?,
            length: c.u32()?,
        })
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
            self.length
        } else {
            0
        }
    }
}

/// A simple reply header; a successful read's data follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    /// Zero, or an NBD error value ([`ErrorCode`]).
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReply {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_LEN] {
        let mut out = [0u8; SIMPLE_REPLY_LEN];
        out[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        out[4..8].copy_from_slice(&self.error.to_be_bytes());
        out[8..].copy_from_slice(&self.cookie.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> ProtoResult<SimpleReply> {
        let mut c = Cursor::new(bytes, "simple reply");
        let magic = c.u32()?;
        if magic == STRUCTURED_REPLY_MAGIC {
            return Err(ProtocolError::UnexpectedStructuredReply);
        }
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(ProtocolError::BadMagic {
                what: "simple reply",
                found: u64::from(magic),
                expected: u64::from(SIMPLE_REPLY_MAGIC),
            });
        }
        Ok(SimpleReply {
            error: c.u32()?,
            cookie: c.u64()?,
        })
    }
}

/// One `base:allocation` extent of a block-status reply: `length` bytes with `flags`
/// ([`state_flags`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStatusExtent {
    pub length: u32,
    pub flags: u32,
}

/// A structured reply chunk's payload, as this server sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk<'a> {
    /// `NBD_REPLY_TYPE_NONE`: success with nothing to say (only as the last chunk).
    None,
    /// `NBD_REPLY_TYPE_OFFSET_DATA`: read data at `offset` (the data follows the header and the
    /// offset; it is counted in the header's length but not carried here).
    OffsetData { offset: u64, data_len: u32 },
    /// `NBD_REPLY_TYPE_OFFSET_HOLE`: `length` bytes at `offset` read as zeroes.
    OffsetHole { offset: u64, length: u32 },
    /// `NBD_REPLY_TYPE_BLOCK_STATUS`: extents of one metadata context.
    BlockStatus {
        context: u32,
        extents: &'a [BlockStatusExtent],
    },
    /// `NBD_REPLY_TYPE_ERROR`: the command failed with `error` ([`ErrorCode`] value).
    Error { error: u32, message: &'a str },
}

/// The header and fixed payload of a structured reply chunk (for `OffsetData`, everything but
/// the data). `done` sets `NBD_REPLY_FLAG_DONE`. A message is cut to [`MAX_STRING_LEN`] bytes
/// (at a character boundary); extents past [`MAX_EXTENTS`] are left out.
pub fn encode_chunk(cookie: u64, done: bool, chunk: &Chunk<'_>) -> Vec<u8> {
    let mut body = Vec::new();
    let (kind, extra) = match chunk {
        Chunk::None => (chunk_type::NONE, 0),
        Chunk::OffsetData { offset, data_len } => {
            body.extend_from_slice(&offset.to_be_bytes());
            (chunk_type::OFFSET_DATA, *data_len)
        }
        Chunk::OffsetHole { offset, length } => {
            body.extend_from_slice(&offset.to_be_bytes());
            body.extend_from_slice(&length.to_be_bytes());
            (chunk_type::OFFSET_HOLE, 0)
        }
        Chunk::BlockStatus { context, extents } => {
            body.extend_from_slice(&context.to_be_bytes());
            for e in extents.iter().take(MAX_EXTENTS) {
                body.extend_from_slice(&e.length.to_be_bytes());
                body.extend_from_slice(&e.flags.to_be_bytes());
            }
            (chunk_type::BLOCK_STATUS, 0)
        }
        Chunk::Error { error, message } => {
            let mut cut = message.len().min(MAX_STRING_LEN);
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            body.extend_from_slice(&error.to_be_bytes());
            body.extend_from_slice(&(cut as u16).to_be_bytes());
            body.extend_from_slice(&message.as_bytes()[..cut]);
            (chunk_type::ERROR, 0)
        }
    };
    let flags = if done { chunk_flags::DONE } else { 0 };
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + body.len());
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&(body.len() as u32 + extra).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A structured reply chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    /// Bytes of payload that follow.
    pub length: u32,
}

impl ChunkHeader {
    pub fn decode(bytes: &[u8]) -> ProtoResult<ChunkHeader> {
        let mut c = Cursor::new(bytes, "structured reply chunk");
        let magic = c.u32()?;
        if magic != STRUCTURED_REPLY_MAGIC {
            return Err(ProtocolError::BadMagic {
                what: "structured reply chunk",
                found: u64::from(magic),
                expected: u64::from(STRUCTURED_REPLY_MAGIC),
            });
        }
        Ok(ChunkHeader {
            flags: c.u16()?,
            kind: c.u16()?,
            cookie: c.u64()?,
            length: c.u32()?,
        })
    }
}

/// Decodes a block-status chunk's payload into its context id and extents; the length must be
/// the id plus whole descriptors, at least one.
pub fn decode_block_status(payload: &[u8]) -> ProtoResult<(u32, Vec<BlockStatusExtent>)> {
    let mut c = Cursor::new(payload, "block status chunk");
    let context = c.u32()?;
    if c.remaining() == 0 || !c.remaining().is_multiple_of(8) {
        return Err(ProtocolError::Malformed {
            what: "block status chunk",
            reason: format!("{} bytes of descriptors", c.remaining()),
        });
    }
    let mut extents = Vec::with_capacity(c.remaining() / 8);
    while c.remaining() > 0 {
        extents.push(BlockStatusExtent {
            length: c.u32()?,
            flags: c.u32()?,
        });
    }
    Ok((context, extents))
}

/// The error values a reply may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Operation not permitted (write to a read-only export).
    Perm,
    /// Input/output error.
    Io,
    /// Cannot allocate memory.
    NoMem,
    /// Invalid argument (bad flags, range or command).
    Inval,
    /// No space left (write past the end).
    NoSpc,
    /// Value too large.
    Overflow,
    /// Operation not supported (fast zero only).
    NotSup,
    /// The server is shutting down.
    Shutdown,
}

impl ErrorCode {
    /// The value on the wire (also the Linux errno of the same name).
    pub fn code(self) -> u32 {
        match self {
            ErrorCode::Perm => 1,
            ErrorCode::Io => 5,
            ErrorCode::NoMem => 12,
            ErrorCode::Inval => 22,
            ErrorCode::NoSpc => 28,
            ErrorCode::Overflow => 75,
            ErrorCode::NotSup => 95,
            ErrorCode::Shutdown => 108,
        }
    }

    /// Decodes a wire value; unknown values read as `EINVAL`, as the protocol tells clients.
    pub fn from_code(code: u32) -> ErrorCode {
        match code {
            1 => ErrorCode::Perm,
            5 => ErrorCode::Io,
            12 => ErrorCode::NoMem,
            28 => ErrorCode::NoSpc,
            75 => ErrorCode::Overflow,
            95 => ErrorCode::NotSup,
            108 => ErrorCode::Shutdown,
            _ => ErrorCode::Inval,
        }
    }

    /// Maps a POSIX errno to the value a server sends (`EDQUOT`/`EFBIG` → `ENOSPC`, others the
    /// protocol does not name → `EIO`).
    pub fn from_errno(errno: i32) -> ErrorCode {
        match errno {
            libc::EPERM | libc::EACCES | libc::EROFS => ErrorCode::Perm,
            libc::ENOMEM => ErrorCode::NoMem,
            libc::EINVAL => ErrorCode::Inval,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ErrorCode::NoSpc,
            libc::EOVERFLOW => ErrorCode::Overflow,
            libc::ESHUTDOWN => ErrorCode::Shutdown,
            _ => ErrorCode::Io,
        }
    }

    /// The POSIX errno of the same meaning.
    pub fn to_errno(self) -> i32 {
        match self {
            ErrorCode::Perm => libc::EPERM,
            ErrorCode::Io => libc::EIO,
            ErrorCode::NoMem => libc::ENOMEM,
            ErrorCode::Inval => libc::EINVAL,
            ErrorCode::NoSpc => libc::ENOSPC,
            ErrorCode::Overflow => libc::EOVERFLOW,
            ErrorCode::NotSup => libc::EOPNOTSUPP,
            ErrorCode::Shutdown => libc::ESHUTDOWN,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ErrorCode::Perm => "EPERM",
            ErrorCode::Io => "EIO",
            ErrorCode::NoMem => "ENOMEM",
            ErrorCode::Inval => "EINVAL",
            ErrorCode::NoSpc => "ENOSPC",
            ErrorCode::Overflow => "EOVERFLOW",
            ErrorCode::NotSup => "ENOTSUP",
            ErrorCode::Shutdown => "ESHUTDOWN",
        };
        f.write_str(name)
    }
}

/// What the server knows about an export when it judges a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportLimits {
    /// Export size in bytes.
    pub size: u64,
    /// Writes, trims and write-zeroes are refused with `EPERM`.
    pub read_only: bool,
    /// Largest read or write payload.
    pub max_payload: u32,
    /// The connection selected `base:allocation`, so `NBD_CMD_BLOCK_STATUS` is allowed.
    pub block_status: bool,
}

/// Why a well-formed request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The error value to reply with.
    pub error: ErrorCode,
    /// After replying, the connection must close: the request's payload cannot be skipped safely
    /// (a write longer than the payload limit).
    pub fatal: bool,
}

impl Refusal {
    fn of(error: ErrorCode) -> Refusal {
        Refusal {
            error,
            fatal: false,
        }
    }
}

/// Judges a request against an export: flags, command, payload limit, range and permissions.
///
/// - unknown flags, or flags not valid for the command or not advertised (`DF`, `FAST_ZERO`,
///   `PAYLOAD_LEN`; `NO_HOLE` outside write-zeroes; `REQ_ONE` outside block status) → `EINVAL`;
///   `FUA` is accepted on every command, as the protocol requires once `SEND_FUA` is advertised;
/// - `BLOCK_STATUS` without a selected metadata context, or of length zero → `EINVAL`;
/// - commands not advertised (`RESIZE`) and unknown ones → `EINVAL`;
/// - a read longer than `max_payload` → `EINVAL`; a write longer than it → `EINVAL`, fatal;
/// - write, trim or write-zeroes on a read-only export → `EPERM`;
/// - past the end: write and write-zeroes → `ENOSPC`, read, trim, cache and block status →
///   `EINVAL`;
/// - flush with a non-zero offset or length → `EINVAL`.
///
/// `NBD_CMD_DISC` is always accepted. Zero-length requests inside the export are accepted (they
/// do nothing).
pub fn check_request(h: &RequestHeader, limits: &ExportLimits) -> Result<(), Refusal> {
    use cmd_flags::*;
    let allowed = match h.command {
        Command::WriteZeroes => FUA | NO_HOLE,
        Command::BlockStatus => FUA | REQ_ONE,
        _ => FUA,
    };
    let bad_flags = h.flags & !allowed != 0;
    let inval = Refusal::of(ErrorCode::Inval);
    match h.command {
        Command::Disc => return Ok(()),
        Command::Write if h.length > limits.max_payload => {
            return Err(Refusal {
                error: ErrorCode::Inval,
                fatal: true,
            })
        }
        Command::BlockStatus if !limits.block_status || h.length == 0 => return Err(inval),
        Command::Read
        | Command::Write
        | Command::Trim
        | Command::WriteZeroes
        | Command::Flush
        | Command::Cache
        | Command::BlockStatus => {}
        Command::Resize | Command::Other(_) => return Err(inval),
    }
    if bad_flags {
        return Err(inval);
    }
    let mutation = matches!(
        h.command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    if mutation && limits.read_only {
        return Err(Refusal::of(ErrorCode::Perm));
    }
    match h.command {
        Command::Flush => {
            if h.offset != 0 || h.length != 0 {
                return Err(inval);
            }
            return Ok(());
        }
        Command::Read if h.length > limits.max_payload => return Err(inval),
        _ => {}
    }
    let in_range = h
        .offset
        .checked_add(u64::from(h.length))
        .is_some_and(|end| end <= limits.size);
    if !in_range {
        return Err(match h.command {
            Command::Write | Command::WriteZeroes => Refusal::of(ErrorCode::NoSpc),
            _ => inval,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_and_flags_round_trip() {
        let g = encode_greeting(handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES);
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(decode_greeting(&g).unwrap(), 3);
        assert_eq!(
            decode_greeting(&g[..10]).unwrap_err().to_string(),
            "server greeting is truncated: needs 16 bytes, got 10"
        );
        let mut old = g;
        old[8..16].copy_from_slice(&OLDSTYLE_MAGIC.to_be_bytes());
        assert_eq!(decode_greeting(&old), Err(ProtocolError::Oldstyle));
        assert_eq!(decode_client_flags(&3u32.to_be_bytes(), 3).unwrap(), 3);
        assert!(decode_client_flags(&4u32.to_be_bytes(), 3).is_err());
        assert!(decode_client_flags(&2u32.to_be_bytes(), 1).is_err());
    }

    #[test]
    fn options_round_trip_and_are_bounded() {
        let req = InfoRequest {
            name: "disk".into(),
            requests: vec![info_type::BLOCK_SIZE, info_type::NAME],
        };
        let bytes = encode_option(Opt::Go, &req.encode()).unwrap();
        let h = decode_option_header(&bytes).unwrap();
        assert_eq!(h.option, Opt::Go);
        assert_eq!(h.length as usize, bytes.len() - OPTION_HEADER_LEN);
        assert_eq!(
            InfoRequest::decode(&bytes[OPTION_HEADER_LEN..]).unwrap(),
            req
        );
        // Name length past the data, trailing junk, truncated list.
        assert!(InfoRequest::decode(&[0, 0, 0, 9, b'a', 0, 0]).is_err());
        assert!(InfoRequest::decode(&[0, 0, 0, 1, b'a', 0, 0, 7]).is_err());
        assert!(InfoRequest::decode(&[0, 0, 0, 1, b'a', 0, 2, 0, 3]).is_err());
        assert!(
            InfoRequest::decode(&[0, 0, 0, 1, 0, 0, 0]).is_err(),
            "NUL in name"
        );
        let mut long = bytes.clone();
        long[12..16].copy_from_slice(&(MAX_OPTION_LEN + 1).to_be_bytes());
        assert!(matches!(
            decode_option_header(&long),
            Err(ProtocolError::TooLong { .. })
        ));
        assert!(encode_option(Opt::List, &vec![0; MAX_OPTION_LEN as usize + 1]).is_err());
    }

    #[test]
    fn replies_and_infos_round_trip() {
        for info in [
            Info::Export {
                size: 1 << 30,
                flags: 0x1ff,
            },
            Info::Name("a".into()),
            Info::Description("desc".into()),
            Info::BlockSize(BlockSizes::DEFAULT),
            Info::Unknown(77),
        ] {
            assert_eq!(Info::decode(&info.encode()).unwrap(), info);
        }
        assert!(Info::decode(&[0, 0, 1, 2, 3]).is_err());
        assert!(Info::decode(&[0, 3, 0, 0, 0, 1]).is_err());
        let r = encode_option_reply(Opt::Info, Rep::ErrUnknown, b"no");
        let h = decode_option_reply_header(&r).unwrap();
        assert_eq!(
            (h.option, h.reply, h.length),
            (Opt::Info, Rep::ErrUnknown, 2)
        );
        assert!(h.reply.is_error() && !Rep::Ack.is_error());
        for code in 0..20u32 {
            assert_eq!(Rep::from_code(code).code(), code);
            assert_eq!(Rep::from_code(code | REP_ERR).code(), code | REP_ERR);
            assert_eq!(Opt::from_code(code).code(), code);
        }
        let e = encode_server_entry("x", "y z");
        assert_eq!(decode_server_entry(&e).unwrap(), ("x".into(), "y z".into()));
        assert!(decode_server_entry(&[0, 0, 0, 5, b'x']).is_err());
        let r = encode_export_name_reply(4096, 1, false);
        assert_eq!(r.len(), 134);
        assert_eq!(decode_export_name_reply(&r).unwrap(), (4096, 1));
        assert_eq!(encode_export_name_reply(4096, 1, true).len(), 10);
        assert!(BlockSizes::DEFAULT.validate().is_ok());
        assert!(BlockSizes {
            min: 3,
            preferred: 4096,
            max_payload: 1 << 20
        }
        .validate()
        .is_err());
    }

    #[test]
    fn requests_round_trip_and_are_judged() {
        let h = RequestHeader {
            flags: cmd_flags::FUA,
            command: Command::Write,
            cookie: 0xdead_beef,
            offset: 4096,
            length: 512,
        };
        assert_eq!(RequestHeader::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.payload_len(), 512);
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(matches!(
            RequestHeader::decode(&bad),
            Err(ProtocolError::BadMagic { .. })
        ));
        assert!(RequestHeader::decode(&h.encode()[..27]).is_err());
        let r = SimpleReply {
            error: 22,
            cookie: 9,
        };
        assert_eq!(SimpleReply::decode(&r.encode()).unwrap(), r);
        let mut sr = r.encode();
        sr[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(
            SimpleReply::decode(&sr),
            Err(ProtocolError::UnexpectedStructuredReply)
        );

        let lim = ExportLimits {
            size: 1 << 20,
            read_only: false,
            max_payload: MAX_PAYLOAD,
            block_status: false,
        };
        let ro = ExportLimits {
            read_only: true,
            ..lim
        };
        let req = |command, flags, offset, length| RequestHeader {
            flags,
            command,
            cookie: 1,
            offset,
            length,
        };
        let err = |h: RequestHeader, l: &ExportLimits| check_request(&h, l).map_err(|r| r.error);
        assert_eq!(err(req(Command::Read, 0, 0, 4096), &lim), Ok(()));
        assert_eq!(
            err(req(Command::Read, 0, 1 << 20, 1), &lim),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            err(req(Command::Write, 0, 1 << 20, 1), &lim),
            Err(ErrorCode::NoSpc)
        );
        assert_eq!(
            err(req(Command::WriteZeroes, 0, u64::MAX, 1), &lim),
            Err(ErrorCode::NoSpc)
        );
        assert_eq!(
            err(req(Command::Trim, 0, 1 << 20, 1), &lim),
            Err(ErrorCode::Inval)
        );
        assert_eq!(err(req(Command::Write, 0, 0, 1), &ro), Err(ErrorCode::Perm));
        assert_eq!(err(req(Command::Trim, 0, 0, 1), &ro), Err(ErrorCode::Perm));
        assert_eq!(err(req(Command::Read, 0, 0, 1), &ro), Ok(()));
        assert_eq!(
            err(req(Command::Other(99), 0, 0, 0), &lim),
            Err(ErrorCode::Inval)
        );
        assert_eq!(err(req(Command::Cache, 0, 0, 1), &lim), Ok(()));
        assert_eq!(
            err(req(Command::Cache, 0, 1 << 20, 1), &lim),
            Err(ErrorCode::Inval)
        );
        // Block status: only once a context is selected, never empty or past the end, and
        // REQ_ONE only there.
        let bs = ExportLimits {
            block_status: true,
            ..lim
        };
        assert_eq!(
            err(req(Command::BlockStatus, 0, 0, 4096), &lim),
            Err(ErrorCode::Inval)
        );
        assert_eq!(err(req(Command::BlockStatus, 0, 0, 4096), &bs), Ok(()));
        let one = cmd_flags::REQ_ONE;
        assert_eq!(err(req(Command::BlockStatus, one, 0, 1), &bs), Ok(()));
        assert_eq!(
            err(req(Command::Read, one, 0, 1), &bs),
            Err(ErrorCode::Inval)
        );
        for (offset, length) in [(0, 0), (1 << 20, 1), (0, (1 << 20) + 1), (u64::MAX, 1)] {
            assert_eq!(
                err(req(Command::BlockStatus, 0, offset, length), &bs),
                Err(ErrorCode::Inval),
                "{offset} {length}"
            );
        }
        assert_eq!(
            err(req(Command::Read, 0x40, 0, 1), &lim),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            err(req(Command::Read, cmd_flags::NO_HOLE, 0, 1), &lim),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            err(
                req(
                    Command::WriteZeroes,
                    cmd_flags::NO_HOLE | cmd_flags::FUA,
                    0,
                    1
                ),
                &lim
            ),
            Ok(())
        );
        assert_eq!(err(req(Command::Flush, 0, 0, 0), &lim), Ok(()));
        assert_eq!(
            err(req(Command::Flush, 0, 1, 0), &lim),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            err(req(Command::Read, 0, 0, MAX_PAYLOAD + 1), &lim),
            Err(ErrorCode::Inval)
        );
        let oversize = check_request(&req(Command::Write, 0, 0, MAX_PAYLOAD + 1), &lim);
        assert_eq!(
            oversize,
            Err(Refusal {
                error: ErrorCode::Inval,
                fatal: true
            })
        );
        assert_eq!(err(req(Command::Disc, 0x7, 5, 5), &lim), Ok(()));
        for code in [1, 5, 12, 22, 28, 75, 95, 108] {
            assert_eq!(ErrorCode::from_code(code).code(), code);
            assert_eq!(
                ErrorCode::from_errno(ErrorCode::from_code(code).to_errno()).code() == code,
                code != 95
            );
        }
    }

    #[test]
    fn structured_chunks_have_the_wire_layout() {
        let none = encode_chunk(7, true, &Chunk::None);
        let h = ChunkHeader::decode(&none).unwrap();
        assert_eq!(
            (h.flags, h.kind, h.cookie, h.length),
            (chunk_flags::DONE, chunk_type::NONE, 7, 0)
        );
        assert_eq!(none.len(), CHUNK_HEADER_LEN);
        let data = encode_chunk(
            8,
            true,
            &Chunk::OffsetData {
                offset: 4096,
                data_len: 512,
            },
        );
        let h = ChunkHeader::decode(&data).unwrap();
        assert_eq!((h.kind, h.length), (chunk_type::OFFSET_DATA, 8 + 512));
        assert_eq!(&data[CHUNK_HEADER_LEN..], &4096u64.to_be_bytes());
        let hole = encode_chunk(
            8,
            false,
            &Chunk::OffsetHole {
                offset: 1,
                length: 2,
            },
        );
        let h = ChunkHeader::decode(&hole).unwrap();
        assert_eq!(
            (h.flags, h.kind, h.length),
            (0, chunk_type::OFFSET_HOLE, 12)
        );
        let err = encode_chunk(
            9,
            true,
            &Chunk::Error {
                error: 22,
                message: "bad",
            },
        );
        let h = ChunkHeader::decode(&err).unwrap();
        assert_eq!((h.kind, h.length), (chunk_type::ERROR, 4 + 2 + 3));
        assert_eq!(
            &err[CHUNK_HEADER_LEN..],
            &[0, 0, 0, 22, 0, 3, b'b', b'a', b'd']
        );
        // A long message is cut at a character boundary within the string limit.
        let long = "é".repeat(MAX_STRING_LEN);
        let cut = encode_chunk(
            1,
            true,
            &Chunk::Error {
                error: 5,
                message: &long,
            },
        );
        let h = ChunkHeader::decode(&cut).unwrap();
        assert_eq!(h.length as usize, 6 + MAX_STRING_LEN);
        assert!(std::str::from_utf8(&cut[CHUNK_HEADER_LEN + 6..]).is_ok());
        let mut bad = none.clone();
        bad[0] ^= 1;
        assert!(matches!(
            ChunkHeader::decode(&bad),
            Err(ProtocolError::BadMagic { .. })
        ));
        assert!(ChunkHeader::decode(&none[..19]).is_err());
        assert!(decode_block_status(&[0, 0, 0, 1]).is_err());
        assert!(decode_block_status(&[0, 0, 0, 1, 0, 0, 0, 9]).is_err());
    }

    #[test]
    fn meta_context_requests_decode_strictly() {
        let r = MetaRequest {
            name: "disk".into(),
            queries: vec![BASE_ALLOCATION.into(), "base:".into()],
        };
        assert_eq!(MetaRequest::decode(&r.encode()).unwrap(), r);
        let mut trailing = r.encode();
        trailing.push(0);
        assert!(MetaRequest::decode(&trailing).is_err());
        // A query count no data could hold, a query length past the end, a NUL in a query.
        assert!(MetaRequest::decode(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(MetaRequest::decode(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9]).is_err());
        assert!(MetaRequest::decode(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0]).is_err());
        let m = encode_meta_context(BASE_ALLOCATION_ID, BASE_ALLOCATION);
        assert_eq!(
            decode_meta_context(&m).unwrap(),
            (BASE_ALLOCATION_ID, BASE_ALLOCATION.to_string())
        );
    }

    proptest::proptest! {
        /// Block-status chunks carry exactly what was encoded (up to MAX_EXTENTS), with a
        /// length that matches the payload.
        #[test]
        fn block_status_chunks_round_trip(
            cookie: u64,
            done: bool,
            context: u32,
            raw in proptest::collection::vec((1u32.., 0u32..4), 1..64),
        ) {
            let extents: Vec<BlockStatusExtent> = raw
                .iter()
                .map(|&(length, flags)| BlockStatusExtent { length, flags })
                .collect();
            let bytes = encode_chunk(cookie, done, &Chunk::BlockStatus { context, extents: &extents });
            let h = ChunkHeader::decode(&bytes).unwrap();
            proptest::prop_assert_eq!(h.cookie, cookie);
            proptest::prop_assert_eq!(h.flags & chunk_flags::DONE != 0, done);
            proptest::prop_assert_eq!(h.kind, chunk_type::BLOCK_STATUS);
            proptest::prop_assert_eq!(h.length as usize, bytes.len() - CHUNK_HEADER_LEN);
            let (id, back) = decode_block_status(&bytes[CHUNK_HEADER_LEN..]).unwrap();
            proptest::prop_assert_eq!(id, context);
            proptest::prop_assert_eq!(back, extents);
        }

        /// Arbitrary bytes never panic the new decoders, and what decodes re-encodes the same.
        #[test]
        fn new_decoders_take_any_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..128)) {
            if let Ok(r) = MetaRequest::decode(&bytes) {
                proptest::prop_assert_eq!(r.encode(), bytes.clone());
            }
            let _ = ChunkHeader::decode(&bytes);
            let _ = decode_block_status(&bytes);
            let _ = decode_meta_context(&bytes);
        }

        /// check_request never panics, and a block-status request it accepts lies inside the
        /// export and is not empty.
        #[test]
        fn block_status_requests_are_judged_totally(
            flags: u16,
            offset: u64,
            length: u32,
            size in 0u64..(1 << 40),
            selected: bool,
        ) {
            let h = RequestHeader { flags, command: Command::BlockStatus, cookie: 1, offset, length };
            let limits = ExportLimits { size, read_only: false, max_payload: MAX_PAYLOAD, block_status: selected };
            if check_request(&h, &limits).is_ok() {
                proptest::prop_assert!(selected && length > 0);
                proptest::prop_assert!(offset.checked_add(u64::from(length)).is_some_and(|e| e <= size));
            }
        }
    }
}
