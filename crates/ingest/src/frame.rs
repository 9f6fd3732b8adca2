//! The ingest wire format (`docs/ingest-protocol.md` §1–§2): the 12-byte frame header, the
//! frame types and their payloads, encoding, and a pure, bounded decoder.
//!
//! Decoding is split so a receiver never reads a payload it has not bounded:
//! [`FrameHeader::parse`] checks the header against [`Limits`] before any payload byte is read,
//! [`FrameHeader::check`] verifies the CRC once the payload is in (for `DATA`, straight in the
//! pool buffer it will be written from), and [`Frame::decode`] turns a control payload into a
//! [`Frame`]. [`decode`] does all three on a byte slice, for tests and the fuzz target.

use kura_engine::crc32c::{crc32c, Crc32c};

/// Bytes of every frame header.
pub const HEADER_LEN: usize = 12;
/// `HELLO`'s magic.
pub const MAGIC: [u8; 8] = *b"KURAINGS";
/// The only protocol version.
pub const VERSION: u16 = 1;
/// Default largest payload: one 1 MiB data chunk plus room.
pub const DEFAULT_MAX_FRAME: u32 = (1 << 20) + 64;
/// Default largest record.
pub const DEFAULT_MAX_RECORD: u64 = 64 << 20;
/// Longest `ERROR` message in bytes.
pub const MAX_ERROR_MESSAGE: usize = 256;
/// `ERROR.seq` when no record is concerned.
pub const NO_SEQ: u64 = u64::MAX;
/// The context string the `AUTH` MAC covers before the two nonces.
pub const AUTH_CONTEXT: &[u8] = b"kura-ingest-v1";
/// `END` flag bit 0: acknowledge this record.
pub const END_ACK: u8 = 1;

/// Bounds a receiver enforces before reading a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload of one frame.
    pub max_frame: u32,
    /// Largest record a `BEGIN` may declare.
    pub max_record: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: DEFAULT_MAX_FRAME,
            max_record: DEFAULT_MAX_RECORD,
        }
    }
}

/// Frame types (§2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    Hello = 0x01,
    Welcome = 0x02,
    Auth = 0x03,
    Ready = 0x04,
    Begin = 0x10,
    Data = 0x11,
    End = 0x12,
    Sync = 0x13,
    Bye = 0x14,
    Ack = 0x20,
    Synced = 0x21,
    Error = 0x30,
}

impl FrameType {
    /// The type for a header's type byte.
    pub fn from_byte(b: u8) -> Option<FrameType> {
        Some(match b {
            0x01 => FrameType::Hello,
            0x02 => FrameType::Welcome,
            0x03 => FrameType::Auth,
            0x04 => FrameType::Ready,
            0x10 => FrameType::Begin,
            0x11 => FrameType::Data,
            0x12 => FrameType::End,
            0x13 => FrameType::Sync,
            0x14 => FrameType::Bye,
            0x20 => FrameType::Ack,
            0x21 => FrameType::Synced,
            0x30 => FrameType::Error,
            _ => return None,
        })
    }

    /// Flag bits this type defines.
    fn allowed_flags(self) -> u8 {
        match self {
            FrameType::End => END_ACK,
            _ => 0,
        }
    }

    /// The payload sizes this type allows: `(min, max)`; `None` for `DATA` (bounded by limits).
    fn payload_bounds(self) -> Option<(u32, u32)> {
        let exact = |n| Some((n, n));
        match self {
            FrameType::Hello | FrameType::Welcome | FrameType::Auth => exact(32),
            FrameType::Ready | FrameType::Bye => exact(0),
            FrameType::Begin | FrameType::Ack | FrameType::Synced => exact(16),
            FrameType::End | FrameType::Sync => exact(8),
            FrameType::Error => Some((12, 12 + MAX_ERROR_MESSAGE as u32)),
            FrameType::Data => None,
        }
    }
}

/// Error codes carried by `ERROR` frames (§2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    BadFrame = 1,
    UnsupportedVersion = 2,
    AuthFailed = 3,
    RecordCrc = 4,
    DeviceIo = 5,
    DeviceFull = 6,
    ShuttingDown = 7,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        Some(match v {
            1 => ErrorCode::BadFrame,
            2 => ErrorCode::UnsupportedVersion,
            3 => ErrorCode::AuthFailed,
            4 => ErrorCode::RecordCrc,
            5 => ErrorCode::DeviceIo,
            6 => ErrorCode::DeviceFull,
            7 => ErrorCode::ShuttingDown,
            _ => return None,
        })
    }
}

/// Why bytes are not a valid frame. Every variant is a *bad frame* (error code 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    #[error("{ty:?} frame with undefined flag bits {flags:#04x}")]
    BadFlags { ty: FrameType, flags: u8 },
    #[error("frame header reserved field is {0:#06x}, must be 0")]
    Reserved(u16),
    #[error("{ty:?} frame payload of {len} bytes, allowed {min}..={max}")]
    BadLength {
        ty: FrameType,
        len: u32,
        min: u32,
        max: u32,
    },
    #[error("frame CRC {found:#010x}, computed {computed:#010x}")]
    Crc { found: u32, computed: u32 },
    #[error("payload of {got} bytes, header says {want}")]
    Truncated { want: u32, got: usize },
    #[error("HELLO magic is wrong")]
    Magic,
    #[error("{what} is {value}, must be {must}")]
    Field {
        what: &'static str,
        value: u64,
        must: &'static str,
    },
    #[error("ERROR message is not UTF-8")]
    MessageNotUtf8,
}

/// A checked frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub ty: FrameType,
    pub flags: u8,
    pub len: u32,
    pub crc: u32,
    /// The first 8 header bytes, which the CRC covers.
    raw: [u8; 8],
}

impl FrameHeader {
    /// Checks a header against `limits` before any payload is read.
    pub fn parse(bytes: &[u8; HEADER_LEN], limits: &Limits) -> Result<FrameHeader, FrameError> {
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let ty = FrameType::from_byte(bytes[4]).ok_or(FrameError::UnknownType(bytes[4]))?;
        let flags = bytes[5];
        if flags & !ty.allowed_flags() != 0 {
            return Err(FrameError::BadFlags { ty, flags });
        }
        let reserved = u16::from_le_bytes([bytes[6], bytes[7]]);
        if reserved != 0 {
            return Err(FrameError::Reserved(reserved));
        }
        let (min, max) = ty.payload_bounds().unwrap_or((1, limits.max_frame));
        if len < min || len > max {
            return Err(FrameError::BadLength { ty, len, min, max });
        }
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&bytes[..8]);
        Ok(FrameHeader {
            ty,
            flags,
            len,
            crc: u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
            raw,
        })
    }

    /// Checks the CRC over the header and `payload` (exactly `len` bytes).
    pub fn check(&self, payload: &[u8]) -> Result<(), FrameError> {
        if payload.len() != self.len as usize {
            return Err(FrameError::Truncated {
                want: self.len,
                got: payload.len(),
            });
        }
        let computed = frame_crc(&self.raw, payload);
        if computed != self.crc {
            return Err(FrameError::Crc {
                found: self.crc,
                computed,
            });
        }
        Ok(())
    }
}

impl FrameHeader {
    /// A CRC digest over the header's covered bytes, for a payload read in pieces: `update`
    /// it with each piece, then [`FrameHeader::verify`].
    pub fn digest(&self) -> Crc32c {
        let mut d = Crc32c::new();
        d.update(&self.raw);
        d
    }

    /// Checks the CRC of a payload digested in pieces (see [`FrameHeader::digest`]).
    pub fn verify(&self, digest: Crc32c) -> Result<(), FrameError> {
        let computed = digest.finalize();
        if computed != self.crc {
            return Err(FrameError::Crc {
                found: self.crc,
                computed,
            });
        }
        Ok(())
    }
}

fn frame_crc(head: &[u8; 8], payload: &[u8]) -> u32 {
    let mut d = Crc32c::new();
    d.update(head);
    d.update(payload);
    d.finalize()
}

/// The header of a frame of type `ty` with `flags` over `payload`.
pub fn header(ty: FrameType, flags: u8, payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[4] = ty as u8;
    h[5] = flags;
    let mut head = [0u8; 8];
    head.copy_from_slice(&h[..8]);
    h[8..].copy_from_slice(&frame_crc(&head, payload).to_le_bytes());
    h
}

/// `HELLO`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub min_version: u16,
    pub max_version: u16,
    pub stage: u8,
    /// 0: acknowledge every record; 1: only `END`s with [`END_ACK`] and `SYNC`s.
    pub ack: u8,
    pub client_nonce: [u8; 16],
}

/// `WELCOME`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    pub version: u16,
    /// 0 none, 1 HMAC-SHA256.
    pub auth: u8,
    pub max_frame: u32,
    pub max_record: u64,
    pub server_nonce: [u8; 16],
}

/// A decoded frame. `Data` carries its payload; every other frame's payload is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Hello(Hello),
    Welcome(Welcome),
    Auth {
        mac: [u8; 32],
    },
    Ready,
    Begin {
        seq: u64,
        size: u64,
    },
    Data(Vec<u8>),
    End {
        record_crc: u32,
        ack: bool,
    },
    Sync {
        upto: u64,
    },
    Bye,
    Ack {
        seq: u64,
        id: u64,
    },
    Synced {
        upto: u64,
        records: u64,
    },
    Error {
        code: u16,
        seq: u64,
        message: String,
    },
}

fn u16_at(p: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([p[at], p[at + 1]])
}
fn u32_at(p: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&p[at..at + 4]);
    u32::from_le_bytes(b)
}
fn u64_at(p: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[at..at + 8]);
    u64::from_le_bytes(b)
}
fn zero(what: &'static str, value: u64) -> Result<(), FrameError> {
    if value != 0 {
        return Err(FrameError::Field {
            what,
            value,
            must: "0",
        });
    }
    Ok(())
}

impl Frame {
    /// The frame's type.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Frame::Hello(_) => FrameType::Hello,
            Frame::Welcome(_) => FrameType::Welcome,
            Frame::Auth { .. } => FrameType::Auth,
            Frame::Ready => FrameType::Ready,
            Frame::Begin { .. } => FrameType::Begin,
            Frame::Data(_) => FrameType::Data,
            Frame::End { .. } => FrameType::End,
            Frame::Sync { .. } => FrameType::Sync,
            Frame::Bye => FrameType::Bye,
            Frame::Ack { .. } => FrameType::Ack,
            Frame::Synced { .. } => FrameType::Synced,
            Frame::Error { .. } => FrameType::Error,
        }
    }

    /// Decodes a payload whose header [`FrameHeader::parse`] accepted and whose CRC
    /// [`FrameHeader::check`] verified.
    pub fn decode(h: &FrameHeader, p: &[u8]) -> Result<Frame, FrameError> {
        if p.len() != h.len as usize {
            return Err(FrameError::Truncated {
                want: h.len,
                got: p.len(),
            });
        }
        Ok(match h.ty {
            FrameType::Hello => {
                if p[..8] != MAGIC {
                    return Err(FrameError::Magic);
                }
                zero("HELLO reserved", u64::from(u16_at(p, 14)))?;
                let mut client_nonce = [0u8; 16];
                client_nonce.copy_from_slice(&p[16..32]);
                let ack = p[13];
                if ack > 1 {
                    return Err(FrameError::Field {
                        what: "HELLO ack",
                        value: u64::from(ack),
                        must: "0 or 1",
                    });
                }
                Frame::Hello(Hello {
                    min_version: u16_at(p, 8),
                    max_version: u16_at(p, 10),
                    stage: p[12],
                    ack,
                    client_nonce,
                })
            }
            FrameType::Welcome => {
                zero("WELCOME reserved", u64::from(p[3]))?;
                if p[2] > 1 {
                    return Err(FrameError::Field {
                        what: "WELCOME auth",
                        value: u64::from(p[2]),
                        must: "0 or 1",
                    });
                }
                let mut server_nonce = [0u8; 16];
                server_nonce.copy_from_slice(&p[16..32]);
                Frame::Welcome(Welcome {
                    version: u16_at(p, 0),
                    auth: p[2],
                    max_frame: u32_at(p, 4),
                    max_record: u64_at(p, 8),
                    server_nonce,
                })
            }
            FrameType::Auth => {
                let mut mac = [0u8; 32];
                mac.copy_from_slice(p);
                Frame::Auth { mac }
            }
            FrameType::Ready => Frame::Ready,
            FrameType::Begin => Frame::Begin {
                seq: u64_at(p, 0),
                size: u64_at(p, 8),
            },
            FrameType::Data => Frame::Data(p.to_vec()),
            FrameType::End => {
                zero("END reserved", u64::from(u32_at(p, 4)))?;
                Frame::End {
                    record_crc: u32_at(p, 0),
                    ack: h.flags & END_ACK != 0,
                }
            }
            FrameType::Sync => Frame::Sync { upto: u64_at(p, 0) },
            FrameType::Bye => Frame::Bye,
            FrameType::Ack => Frame::Ack {
                seq: u64_at(p, 0),
                id: u64_at(p, 8),
            },
            FrameType::Synced => Frame::Synced {
                upto: u64_at(p, 0),
                records: u64_at(p, 8),
            },
            FrameType::Error => {
                zero("ERROR reserved", u64::from(u16_at(p, 2)))?;
                let message = std::str::from_utf8(&p[12..])
                    .map_err(|_| FrameError::MessageNotUtf8)?
                    .to_string();
                Frame::Error {
                    code: u16_at(p, 0),
                    seq: u64_at(p, 4),
                    message,
                }
            }
        })
    }

    /// The payload bytes and flags of this frame.
    pub fn payload(&self) -> (Vec<u8>, u8) {
        let mut p = Vec::new();
        let mut flags = 0;
        match self {
            Frame::Hello(h) => {
                p.extend_from_slice(&MAGIC);
                p.extend_from_slice(&h.min_version.to_le_bytes());
                p.extend_from_slice(&h.max_version.to_le_bytes());
                p.push(h.stage);
                p.push(h.ack);
                p.extend_from_slice(&[0, 0]);
                p.extend_from_slice(&h.client_nonce);
            }
            Frame::Welcome(w) => {
                p.extend_from_slice(&w.version.to_le_bytes());
                p.push(w.auth);
                p.push(0);
                p.extend_from_slice(&w.max_frame.to_le_bytes());
                p.extend_from_slice(&w.max_record.to_le_bytes());
                p.extend_from_slice(&w.server_nonce);
            }
            Frame::Auth { mac } => p.extend_from_slice(mac),
            Frame::Ready | Frame::Bye => {}
            Frame::Begin { seq, size } => {
                p.extend_from_slice(&seq.to_le_bytes());
                p.extend_from_slice(&size.to_le_bytes());
            }
            Frame::Data(d) => p.extend_from_slice(d),
            Frame::End { record_crc, ack } => {
                p.extend_from_slice(&record_crc.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                flags = if *ack { END_ACK } else { 0 };
            }
            Frame::Sync { upto } => p.extend_from_slice(&upto.to_le_bytes()),
            Frame::Ack { seq, id } => {
                p.extend_from_slice(&seq.to_le_bytes());
                p.extend_from_slice(&id.to_le_bytes());
            }
            Frame::Synced { upto, records } => {
                p.extend_from_slice(&upto.to_le_bytes());
                p.extend_from_slice(&records.to_le_bytes());
            }
            Frame::Error { code, seq, message } => {
                p.extend_from_slice(&code.to_le_bytes());
                p.extend_from_slice(&[0, 0]);
                p.extend_from_slice(&seq.to_le_bytes());
                // Cut at a character boundary within the limit.
                let mut end = message.len().min(MAX_ERROR_MESSAGE);
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                p.extend_from_slice(&message.as_bytes()[..end]);
            }
        }
        (p, flags)
    }

    /// The whole frame: header and payload.
    pub fn encode(&self) -> Vec<u8> {
        let (payload, flags) = self.payload();
        let mut out = header(self.frame_type(), flags, &payload).to_vec();
        out.extend_from_slice(&payload);
        out
    }
}

/// Decodes one frame from the front of `bytes`: `Ok(None)` when more bytes are needed,
/// else the frame and the bytes it took. Never reads past the limits.
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(head) = bytes.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(head);
    let h = FrameHeader::parse(&hb, limits)?;
    let end = HEADER_LEN + h.len as usize;
    let Some(payload) = bytes.get(HEADER_LEN..end) else {
        return Ok(None);
    };
    h.check(payload)?;
    Ok(Some((Frame::decode(&h, payload)?, end)))
}

/// CRC32C of a whole record, for `END.record_crc`.
pub fn record_crc(data: &[u8]) -> u32 {
    crc32c(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bytes_are_as_documented() {
        let f = Frame::End {
            record_crc: 0x1122_3344,
            ack: true,
        };
        let b = f.encode();
        assert_eq!(&b[..4], &8u32.to_le_bytes());
        assert_eq!(b[4], 0x12);
        assert_eq!(b[5], END_ACK);
        assert_eq!(&b[6..8], &[0, 0]);
        let mut covered = b[..8].to_vec();
        covered.extend_from_slice(&b[12..]);
        assert_eq!(&b[8..12], &crc32c(&covered).to_le_bytes());
        assert_eq!(&b[12..16], &0x1122_3344u32.to_le_bytes());
    }

    #[test]
    fn an_oversized_data_frame_is_refused_from_its_header_alone() {
        let limits = Limits {
            max_frame: 100,
            max_record: 1000,
        };
        let mut h = header(FrameType::Data, 0, &[0u8; 101]);
        assert!(matches!(
            FrameHeader::parse(&h, &limits),
            Err(FrameError::BadLength { len: 101, .. })
        ));
        h[0] = 0;
        h[1] = 0;
        assert!(matches!(
            FrameHeader::parse(&h, &limits),
            Err(FrameError::BadLength { len: 0, .. })
        ));
    }

    #[test]
    fn a_flipped_payload_bit_fails_the_crc() {
        let mut b = Frame::Begin { seq: 7, size: 9 }.encode();
        b[14] ^= 4;
        assert!(matches!(
            decode(&b, &Limits::default()),
            Err(FrameError::Crc { .. })
        ));
    }
}
