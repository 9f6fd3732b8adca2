//! The write-ahead log (format section 4): appending ops frames to the chain of log segments,
//! sealing a segment when the next frame does not fit, replaying the chain on open, and
//! handing back the segments before a new log start once a flush made them unneeded.

use crate::error::StoreError;
use crate::format::frame::{
    decode_ops, encode_frame, encode_frame_into, frame_pages, FrameHeader, FrameKind, Op,
};
use crate::format::{FormatError, SegRef, PAGE_SIZE};
use crate::segments::FrameWriter;
use crate::space::Space;

/// A page of a log segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogPos {
    pub(crate) seg: SegRef,
    pub(crate) page: u32,
}

/// Where the log ends after replay, and why it ends there.
pub(crate) struct Replayed {
    pub(crate) end: LogPos,
    pub(crate) next_lsn: u64,
    /// Why the frame at `end` was not taken: a torn or never-written tail reads as damage
    /// (format section 7).
    pub(crate) stop: FormatError,
    pub(crate) frames: u64,
    /// The chain's segments from the log start on, in order.
    pub(crate) chain: Vec<SegRef>,
}

/// Where replay starts: a page of a log segment and the first LSN not in runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogStart {
    pub(crate) pos: LogPos,
    pub(crate) lsn: u64,
}

/// Appends frames at the end of the log chain.
pub(crate) struct LogWriter {
    pos: LogPos,
    store_tag: u64,
    segment_pages: u32,
    /// Set after replay: the segment at `pos` may hold stale frames of this seg_seq past `pos`
    /// (written but never flushed before a crash), so the chain continues in a fresh segment.
    must_seal: bool,
    /// The chain's segments from the log start to `pos`, in order.
    chain: Vec<SegRef>,
    /// Bytes of frames written since open.
    written: u64,
    /// The log's own queue, when the device has more than one: frames are written without
    /// the committing writer waiting for each write. Without it, on the store's queue.
    frames: Option<FrameWriter>,
    /// The buffer ops frames are encoded in, kept between frames up to [`KEEP_FRAME_BYTES`].
    frame_buf: Vec<u8>,
}

/// Largest frame buffer kept for the next frame (a commit group's usual most, 1 MiB, and its
/// header page): a larger batch's buffer is freed after its write.
const KEEP_FRAME_BYTES: usize = (1 << 20) + PAGE_SIZE;

/// Largest payload of one frame: a segment less the page kept for the seal.
pub(crate) fn max_payload(segment_pages: u32) -> usize {
    (segment_pages as usize - 1) * PAGE_SIZE - crate::format::frame::FRAME_HEADER
}

impl LogWriter {
    pub(crate) fn new(end: LogPos, chain: Vec<SegRef>, store_tag: u64, segment_pages: u32) -> Self {
        LogWriter {
            pos: end,
            store_tag,
            segment_pages,
            must_seal: true,
            chain,
            written: 0,
            frames: None,
            frame_buf: Vec::new(),
        }
    }

    /// Writes frames on `frames` from now on (see [`FrameWriter`]).
    pub(crate) fn write_on(&mut self, frames: FrameWriter) {
        self.frames = Some(frames);
    }

    /// Waits until every frame appended so far is on the device (not durable: a flush on any
    /// queue after this makes it so).
    pub(crate) fn settle(&mut self) -> Result<(), StoreError> {
        match &mut self.frames {
            Some(f) => f.settle(),
            None => Ok(()),
        }
    }

    fn write(
        &mut self,
        space: &mut Space,
        slot: u64,
        page: u32,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        match &mut self.frames {
            Some(f) => f.submit(space.segs.placement(), slot, page, bytes),
            None => space.segs.write(slot, page, bytes),
        }
    }

    /// Where the next frame goes (or the seal before it).
    pub(crate) fn pos(&self) -> LogPos {
        self.pos
    }

    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Segments the chain holds.
    pub(crate) fn segments(&self) -> usize {
        self.chain.len()
    }

    /// Drops the segments before the one holding `start` from the chain and returns them: a
    /// flush recorded a log start there, so they are no longer read.
    pub(crate) fn trim_before(&mut self, start: LogPos) -> Vec<SegRef> {
        match self.chain.iter().position(|s| *s == start.seg) {
            Some(i) => self.chain.drain(..i).collect(),
            None => Vec::new(),
        }
    }

    /// Writes one ops frame (not flushed), sealing the current segment first when the frame
    /// does not fit before its last page or when replay left it.
    pub(crate) fn append(
        &mut self,
        space: &mut Space,
        first_lsn: u64,
        count: u32,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        let pages = frame_pages(payload.len());
        let usable = self.segment_pages as usize - 1;
        if pages > usable {
            return Err(StoreError::Refused(FormatError::TooLarge {
                what: "write batch",
                need: payload.len(),
                room: max_payload(self.segment_pages),
            }));
        }
        if self.must_seal || self.pos.page as usize + pages > usable {
            let next = space.allocate()?;
            let seal = encode_frame(
                FrameKind::Seal,
                self.pos.seg.seg_seq,
                self.store_tag,
                0,
                0,
                Some(next),
                &[],
            )
            .map_err(StoreError::Refused)?;
            self.write(space, self.pos.seg.slot, self.pos.page, &seal)?;
            self.written += seal.len() as u64;
            self.pos = LogPos { seg: next, page: 0 };
            self.chain.push(next);
            self.must_seal = false;
        }
        let mut frame = std::mem::take(&mut self.frame_buf);
        encode_frame_into(
            FrameKind::Ops,
            self.pos.seg.seg_seq,
            self.store_tag,
            first_lsn,
            count,
            None,
            payload,
            &mut frame,
        )
        .map_err(StoreError::Refused)?;
        let written = self.write(space, self.pos.seg.slot, self.pos.page, &frame);
        let len = frame.len() as u64;
        if frame.capacity() <= KEEP_FRAME_BYTES {
            self.frame_buf = frame;
        }
        written?;
        self.written += len;
        self.pos.page += pages as u32;
        Ok(())
    }
}

/// Replays the log from `start`: claims every slot of the chain in `space` and hands each
/// operation at or after the start LSN to `apply`, in LSN order, up to the first frame that is
/// not valid.
pub(crate) fn replay(
    space: &mut Space,
    start: LogStart,
    mut apply: impl FnMut(u64, Op),
) -> Result<Replayed, StoreError> {
    let sb = space.superblock().clone();
    let (tag, pps) = (sb.store_tag(), sb.segment_pages());
    let mut pos = start.pos;
    if pos.seg.slot >= sb.slot_count || pos.page >= pps {
        return Err(StoreError::Corrupt {
            place: "log start".into(),
            source: FormatError::BadField {
                what: "log start slot or page",
                value: pos.seg.slot,
            },
        });
    }
    space.claim(pos.seg.slot);
    let mut chain = vec![pos.seg];
    let mut expected: Option<u64> = None;
    let mut frames = 0;
    let stop = loop {
        let head = space.segs.read(pos.seg.slot, pos.page, 1)?;
        let header = match FrameHeader::decode(&head).and_then(|h| {
            h.check_origin(pos.seg.seg_seq, tag)?;
            Ok(h)
        }) {
            Ok(h) => h,
            Err(e) => break e,
        };
        match header.kind {
            FrameKind::Seal => {
                let next = header.next;
                if next.slot >= sb.slot_count
                    || chain.iter().any(|s| s.slot == next.slot)
                    || space.is_claimed(next.slot)
                {
                    break FormatError::BadField {
                        what: "seal target slot",
                        value: next.slot,
                    };
                }
                space.claim(next.slot);
                chain.push(next);
                pos = LogPos { seg: next, page: 0 };
                continue;
            }
            FrameKind::Manifest => {
                break FormatError::BadField {
                    what: "manifest frame in the log",
                    value: FrameKind::Manifest as u64,
                }
            }
            FrameKind::Ops => {}
        }
        let pages = header.pages();
        if pos.page as usize + pages > pps as usize - 1 {
            break FormatError::TooLarge {
                what: "log frame",
                need: pages * PAGE_SIZE,
                room: (pps - 1 - pos.page) as usize * PAGE_SIZE,
            };
        }
        let frame = if pages == 1 {
            head
        } else {
            space.segs.read(pos.seg.slot, pos.page, pages)?
        };
        let ops = match header
            .check_payload(&frame)
            .and_then(|p| decode_ops(p, header.count))
        {
            Ok(ops) => ops,
            Err(e) => break e,
        };
        let end_lsn = header.first_lsn.checked_add(u64::from(header.count));
        if expected.is_some_and(|e| e != header.first_lsn) || end_lsn.is_none() {
            break FormatError::BadField {
                what: "log frame first LSN",
                value: header.first_lsn,
            };
        }
        for (i, op) in ops.into_iter().enumerate() {
            let lsn = header.first_lsn + i as u64;
            if lsn >= start.lsn {
                apply(lsn, op);
            }
        }
        expected = end_lsn;
        frames += 1;
        pos.page += pages as u32;
    };
    Ok(Replayed {
        end: pos,
        next_lsn: expected.unwrap_or(start.lsn).max(start.lsn),
        stop,
        frames,
        chain,
    })
}
