//! Log frames (format section 4): the unit the write-ahead log, the value log and the manifest
//! log are made of, and the operations an ops frame carries; also the value pointer runs keep.

use super::{check_crc, narrow, seal_crc, FormatError, Reader, SegRef, MAX_KEY, PAGE_SIZE};
use kura_engine::crc32c::crc32c;

const MAGIC: [u8; 4] = *b"KVLF";
const CRC_AT: usize = 4;
/// Bytes of a frame header; the payload follows.
pub const FRAME_HEADER: usize = 64;

/// What a frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Write operations ([`Op`]), LSNs from the header's first LSN on.
    Ops = 1,
    /// The chain continues at page 0 of the header's `next` segment.
    Seal = 2,
    /// Manifest records.
    Manifest = 3,
}

impl FrameKind {
    fn from_u8(v: u8) -> Result<FrameKind, FormatError> {
        match v {
            1 => Ok(FrameKind::Ops),
            2 => Ok(FrameKind::Seal),
            3 => Ok(FrameKind::Manifest),
            _ => Err(FormatError::BadField {
                what: "frame kind",
                value: v.into(),
            }),
        }
    }
}

/// The 64-byte header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub seg_seq: u64,
    pub store_tag: u64,
    pub first_lsn: u64,
    pub payload_len: u32,
    pub payload_crc: u32,
    pub count: u32,
    /// Where a seal continues; zero in other frames.
    pub next: SegRef,
}

impl FrameHeader {
    /// Pages the whole frame occupies.
    pub fn pages(&self) -> usize {
        frame_pages(self.payload_len as usize)
    }

    /// Decodes and checks the header in the first [`FRAME_HEADER`] bytes of `data`: magic, CRC,
    /// kind, reserved bytes, and that a seal carries nothing. The payload is checked by
    /// [`FrameHeader::check_payload`].
    pub fn decode(data: &[u8]) -> Result<FrameHeader, FormatError> {
        const WHAT: &str = "log frame header";
        let head = data.get(..FRAME_HEADER).ok_or(FormatError::Truncated {
            what: WHAT,
            need: FRAME_HEADER,
            have: data.len(),
        })?;
        let mut r = Reader::new(WHAT, head);
        if r.bytes(4)? != MAGIC {
            return Err(FormatError::BadMagic { what: WHAT });
        }
        check_crc(WHAT, head, CRC_AT)?;
        r.u32()?;
        let seg_seq = r.u64()?;
        let store_tag = r.u64()?;
        let first_lsn = r.u64()?;
        let payload_len = r.u32()?;
        let payload_crc = r.u32()?;
        let kind = FrameKind::from_u8(r.u8()?)?;
        if r.bytes(3)? != [0; 3] {
            return Err(FormatError::BadField {
                what: "frame reserved bytes",
                value: 1,
            });
        }
        let count = r.u32()?;
        let next = SegRef::get(&mut r)?;
        let header = FrameHeader {
            kind,
            seg_seq,
            store_tag,
            first_lsn,
            payload_len,
            payload_crc,
            count,
            next,
        };
        let plain_seal = payload_len == 0 && count == 0 && first_lsn == 0;
        if (kind == FrameKind::Seal) != (next != SegRef::default())
            || (kind == FrameKind::Seal && !plain_seal)
        {
            return Err(FormatError::BadField {
                what: "seal frame fields",
                value: kind as u64,
            });
        }
        if kind == FrameKind::Ops && (first_lsn == 0 || count == 0) {
            return Err(FormatError::BadField {
                what: "ops frame without operations or LSN",
                value: first_lsn,
            });
        }
        Ok(header)
    }

    /// Checks that the frame belongs to the segment allocation and store it is read from.
    pub fn check_origin(&self, seg_seq: u64, store_tag: u64) -> Result<(), FormatError> {
        if self.store_tag != store_tag {
            return Err(FormatError::ForeignStore { what: "log frame" });
        }
        if self.seg_seq != seg_seq {
            return Err(FormatError::WrongSegment {
                what: "log frame",
                expected: seg_seq,
                found: self.seg_seq,
            });
        }
        Ok(())
    }

    /// The payload out of the whole frame's bytes, after checking its CRC.
    pub fn check_payload<'a>(&self, frame: &'a [u8]) -> Result<&'a [u8], FormatError> {
        let end = FRAME_HEADER + self.payload_len as usize;
        let payload = frame.get(FRAME_HEADER..end).ok_or(FormatError::Truncated {
            what: "log frame payload",
            need: end,
            have: frame.len(),
        })?;
        let computed = crc32c(payload);
        if computed != self.payload_crc {
            return Err(FormatError::BadChecksum {
                what: "log frame payload",
                stored: self.payload_crc,
                computed,
            });
        }
        Ok(payload)
    }
}

/// Pages a frame with `payload_len` bytes of payload occupies.
pub fn frame_pages(payload_len: usize) -> usize {
    (FRAME_HEADER + payload_len).div_ceil(PAGE_SIZE)
}

/// The whole frame (header, payload, zero padding to a page boundary). A seal's `next` is
/// `Some`; other kinds pass `None`.
pub fn encode_frame(
    kind: FrameKind,
    seg_seq: u64,
    store_tag: u64,
    first_lsn: u64,
    count: u32,
    next: Option<SegRef>,
    payload: &[u8],
) -> Result<Vec<u8>, FormatError> {
    let mut v = Vec::new();
    encode_frame_into(
        kind, seg_seq, store_tag, first_lsn, count, next, payload, &mut v,
    )?;
    Ok(v)
}

/// [`encode_frame`] into `out` (cleared first), so a writer can keep one buffer for all its
/// frames instead of allocating (and having the kernel zero) a fresh one for each.
#[allow(clippy::too_many_arguments)]
pub fn encode_frame_into(
    kind: FrameKind,
    seg_seq: u64,
    store_tag: u64,
    first_lsn: u64,
    count: u32,
    next: Option<SegRef>,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), FormatError> {
    let payload_len: u32 = narrow("log frame payload", payload.len(), u32::MAX as usize)?;
    let v = out;
    v.clear();
    v.reserve(frame_pages(payload.len()) * PAGE_SIZE);
    v.extend_from_slice(&MAGIC);
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&seg_seq.to_le_bytes());
    v.extend_from_slice(&store_tag.to_le_bytes());
    v.extend_from_slice(&first_lsn.to_le_bytes());
    v.extend_from_slice(&payload_len.to_le_bytes());
    v.extend_from_slice(&crc32c(payload).to_le_bytes());
    v.push(kind as u8);
    v.extend_from_slice(&[0; 3]);
    v.extend_from_slice(&count.to_le_bytes());
    next.unwrap_or_default().put(v);
    seal_crc(&mut v[..FRAME_HEADER], CRC_AT);
    v.extend_from_slice(payload);
    v.resize(frame_pages(payload.len()) * PAGE_SIZE, 0);
    Ok(())
}

/// One write operation in an ops frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put { key: Vec<u8>, value: Vec<u8> },
    Delete { key: Vec<u8> },
}

impl Op {
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Put { key, .. } | Op::Delete { key } => key,
        }
    }

    /// Bytes the operation takes in a payload.
    pub fn encoded_len(&self) -> usize {
        match self {
            Op::Put { key, value } => 9 + key.len() + value.len(),
            Op::Delete { key } => 5 + key.len(),
        }
    }

    /// Appends the operation to an ops payload; refuses keys over [`MAX_KEY`] and values whose
    /// length does not fit the field.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FormatError> {
        let key = self.key();
        if key.len() > MAX_KEY {
            return Err(FormatError::TooLarge {
                what: "key",
                need: key.len(),
                room: MAX_KEY,
            });
        }
        match self {
            Op::Put { key, value } => {
                let value_len: u32 = narrow("value", value.len(), u32::MAX as usize)?;
                out.push(1);
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(&value_len.to_le_bytes());
                out.extend_from_slice(key);
                out.extend_from_slice(value);
            }
            Op::Delete { key } => {
                out.push(2);
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(key);
            }
        }
        Ok(())
    }
}

/// Decodes the `count` operations of an ops payload, which must use every byte.
pub fn decode_ops(payload: &[u8], count: u32) -> Result<Vec<Op>, FormatError> {
    let mut r = Reader::new("ops payload", payload);
    // Each operation takes at least 5 bytes, so a damaged count cannot reserve more than that.
    let mut ops = Vec::with_capacity((count as usize).min(payload.len() / 5));
    for _ in 0..count {
        let tag = r.u8()?;
        let key_len = r.u32()? as usize;
        if key_len > MAX_KEY {
            return Err(FormatError::BadField {
                what: "key length",
                value: key_len as u64,
            });
        }
        match tag {
            1 => {
                let value_len = r.u32()? as usize;
                let key = r.bytes(key_len)?.to_vec();
                let value = r.bytes(value_len)?.to_vec();
                ops.push(Op::Put { key, value });
            }
            2 => ops.push(Op::Delete {
                key: r.bytes(key_len)?.to_vec(),
            }),
            _ => {
                return Err(FormatError::BadField {
                    what: "operation kind",
                    value: tag.into(),
                })
            }
        }
    }
    r.finish()?;
    Ok(ops)
}

/// Where a separated value lives: a byte range of a log segment and the value's CRC32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValuePointer {
    pub segment: SegRef,
    pub offset: u32,
    pub len: u32,
    pub crc: u32,
}

impl ValuePointer {
    pub const ENCODED_LEN: usize = 28;

    pub fn encode(&self, out: &mut Vec<u8>) {
        self.segment.put(out);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    pub fn decode(data: &[u8]) -> Result<ValuePointer, FormatError> {
        let mut r = Reader::new("value pointer", data);
        let p = ValuePointer {
            segment: SegRef::get(&mut r)?,
            offset: r.u32()?,
            len: r.u32()?,
            crc: r.u32()?,
        };
        r.finish()?;
        Ok(p)
    }

    /// The value read from the pointer's range, checked against its CRC.
    pub fn check<'a>(&self, value: &'a [u8]) -> Result<&'a [u8], FormatError> {
        let computed = crc32c(value);
        if value.len() != self.len as usize || computed != self.crc {
            return Err(FormatError::BadChecksum {
                what: "separated value",
                stored: self.crc,
                computed,
            });
        }
        Ok(value)
    }
}
