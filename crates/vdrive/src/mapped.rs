//! The drive behind `split`, `concat` and `stripe`: an address map from the drive's blocks onto
//! its children's, and the queue work of cutting each request along that map.
//!
//! A request that lands on one child in one contiguous run goes to it as is, buffer and all, with
//! its LBA moved (no copy). One that crosses children or chunks is cut into pieces, one per
//! child run; runs on the same child that are contiguous there are merged into one command, with
//! their data gathered into (writes) or scattered from (reads) a scratch buffer. The caller sees
//! one completion carrying the first piece's error, if any. Flushes go to every child.
//! A failed flush poisons the drive.

use crate::child_request;
use crate::fanout::{combined_geometry, fanout_methods, scratch, Done, Fanout};
use kura_engine::{
    BlockDevice, Completion, DeviceResult, DriveStats, Geometry, IoBuf, Opcode, OpenError, Request,
};

/// One child command: `blocks` blocks at `lba` on child `leg`, carrying the caller's data from
/// the runs `segs` (each `(first block within the request, blocks)`, in child order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCommand {
    pub leg: usize,
    pub lba: u64,
    pub blocks: u64,
    pub segs: Vec<(u64, u64)>,
}

/// An address map from a drive's blocks onto its children's.
pub trait Layout: Send {
    /// The kind's name in spec strings.
    fn kind(&self) -> &'static str;
    /// Blocks the drive exposes.
    fn num_blocks(&self) -> u64;
    /// Appends to `out` the child commands that cover `blocks` blocks at `lba` (within range).
    fn map(&self, lba: u64, blocks: u64, out: &mut Vec<ChildCommand>);
    /// Options for the drive's description (e.g. `?chunk=65536`), or empty.
    fn options(&self) -> String;
}

/// What a finished piece means to its parent.
enum PieceData {
    /// The piece carried the caller's own buffer; hand it back.
    Whole,
    /// A scratch read buffer to scatter into the caller's buffer along these runs.
    Scatter(Vec<(u64, u64)>),
    /// Nothing to hand back (no data, or a scratch copy of written data).
    Nothing,
}

/// A drive that forwards every request along a [`Layout`].
pub struct MappedDrive<L: Layout> {
    fan: Fanout<PieceData>,
    geo: Geometry,
    layout: L,
    pieces: Vec<ChildCommand>,
}

impl<L: Layout> MappedDrive<L> {
    /// A drive over `children` (in the layout's order); they must share one block size.
    pub fn new(children: Vec<Box<dyn BlockDevice>>, layout: L) -> Result<Self, OpenError> {
        let geos: Vec<Geometry> = children.iter().map(|c| c.geometry()).collect();
        check_block_sizes(layout.kind(), &children)?;
        let geo = combined_geometry(&geos, layout.num_blocks());
        Ok(MappedDrive {
            fan: Fanout::new(children),
            geo,
            layout,
            pieces: Vec::new(),
        })
    }

    /// The address map.
    pub fn layout(&self) -> &L {
        &self.layout
    }

    fn dispatch(&mut self, id: usize) {
        let Some(parent) = self.fan.parent_mut(id) else {
            return;
        };
        let (op, lba, blocks) = (parent.req.op, parent.req.lba, parent.req.blocks);
        if op == Opcode::Flush {
            for leg in 0..self.fan.legs.len() {
                self.fan
                    .send(id, leg, Request::flush(0), PieceData::Nothing);
            }
            return;
        }
        let mut pieces = std::mem::take(&mut self.pieces);
        pieces.clear();
        self.layout.map(lba, blocks, &mut pieces);
        let bs = self.geo.block_size as usize;
        if let [p] = pieces.as_slice() {
            if p.blocks == blocks {
                self.fan
                    .send_whole(id, p.leg, p.lba, PieceData::Whole, PieceData::Nothing);
                self.pieces = pieces;
                return;
            }
        }
        for p in pieces.drain(..) {
            let (buf, meta) = match op {
                Opcode::Write => {
                    let mut buf = scratch(p.blocks as usize * bs);
                    if let Some(src) = self.fan.parent_mut(id).and_then(|p| p.req.buf.as_ref()) {
                        gather(&mut buf, src, &p.segs, bs);
                    }
                    (Some(buf), PieceData::Nothing)
                }
                Opcode::Read => (
                    Some(scratch(p.blocks as usize * bs)),
                    PieceData::Scatter(p.segs),
                ),
                _ => (None, PieceData::Nothing),
            };
            let req = child_request(op, p.lba, p.blocks, buf);
            self.fan.send(id, p.leg, req, meta);
        }
        self.pieces = pieces;
    }

    fn on_done(fan: &mut Fanout<PieceData>, bs: usize, done: Done<PieceData>) {
        let (parent, completion) = (done.parent, done.completion);
        if let Some(p) = fan.parent_mut(parent) {
            match done.meta {
                PieceData::Whole => p.req.buf = completion.buf,
                PieceData::Scatter(segs) => {
                    if let (Ok(()), Some(src), Some(dst)) = (
                        &completion.status,
                        completion.buf.as_ref(),
                        p.req.buf.as_mut(),
                    ) {
                        scatter(dst, src, &segs, bs);
                    }
                }
                PieceData::Nothing => {}
            }
        }
        if fan.piece_done(parent, done.leg, completion.status) {
            if let Some(mut p) = fan.take_parent(parent) {
                let status = p.first_status();
                fan.complete(p.req, status);
            }
        }
    }
}

/// Copies the caller's runs `segs` from `src` into consecutive blocks of `dst`.
pub(crate) fn gather(dst: &mut IoBuf, src: &IoBuf, segs: &[(u64, u64)], bs: usize) {
    let mut at = 0;
    for &(first, blocks) in segs {
        let (from, len) = (first as usize * bs, blocks as usize * bs);
        dst[at..at + len].copy_from_slice(&src[from..from + len]);
        at += len;
    }
}

/// Copies consecutive blocks of `src` out to the caller's runs `segs` in `dst`.
pub(crate) fn scatter(dst: &mut IoBuf, src: &IoBuf, segs: &[(u64, u64)], bs: usize) {
    let mut at = 0;
    for &(first, blocks) in segs {
        let (to, len) = (first as usize * bs, blocks as usize * bs);
        dst[to..to + len].copy_from_slice(&src[at..at + len]);
        at += len;
    }
}

/// Fails unless every child has the same block size.
pub(crate) fn check_block_sizes(
    kind: &str,
    children: &[Box<dyn BlockDevice>],
) -> Result<(), OpenError> {
    let Some(first) = children.first() else {
        return Err(OpenError::Invalid(format!("{kind}: no devices given")));
    };
    let bs = first.geometry().block_size;
    for (i, c) in children.iter().enumerate() {
        let other = c.geometry().block_size;
        if other != bs {
            return Err(OpenError::Invalid(format!(
                "{kind}: devices have different block sizes: device 0 ({}) has {bs}-byte blocks, device {i} ({}) has {other}-byte blocks",
                first.describe(),
                c.describe()
            )));
        }
    }
    Ok(())
}

impl<L: Layout> MappedDrive<L> {
    /// This drive's entry in a stats report: its layout's kind (the fanout adds the counters).
    fn layer_stats(&self) -> DriveStats {
        DriveStats::new(self.layout.kind())
    }
}

impl<L: Layout> BlockDevice for MappedDrive<L> {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        let legs: Vec<String> = self.fan.legs.iter().map(|l| l.dev.describe()).collect();
        format!(
            "{}({}){}",
            self.layout.kind(),
            legs.join(","),
            self.layout.options()
        )
    }

    fanout_methods!(stats = layer_stats);

    /// Each child's answer for its pieces, put back in the drive's order along the map (a child
    /// that cannot tell counts as data).
    fn allocation(
        &mut self,
        lba: u64,
        blocks: u64,
    ) -> DeviceResult<Option<Vec<kura_engine::Extent>>> {
        kura_engine::device::check_range(&self.geo, lba, blocks)?;
        let mut pieces = Vec::new();
        self.layout.map(lba, blocks, &mut pieces);
        // (first block within the range, blocks, state), from every child's answer.
        let mut runs = Vec::new();
        for piece in pieces {
            let leg = &mut self.fan.legs[piece.leg].dev;
            let mut child = Vec::new();
            let answer = leg.allocation(piece.lba, piece.blocks)?;
            kura_engine::device::push_child_extents(&mut child, answer, piece.blocks);
            // The child's extents run along the piece's segments, in child order.
            let mut extents = child.into_iter().map(|e| (e.blocks, e.state));
            let mut current = extents.next();
            for (mut at, mut left) in piece.segs {
                while left > 0 {
                    let Some((n, state)) = current.as_mut() else {
                        return Ok(None);
                    };
                    let take = (*n).min(left);
                    runs.push((at, take, *state));
                    at += take;
                    left -= take;
                    *n -= take;
                    if *n == 0 {
                        current = extents.next();
                    }
                }
            }
        }
        runs.sort_unstable_by_key(|r| r.0);
        let mut out = Vec::new();
        for (_, n, state) in runs {
            kura_engine::device::push_extent(&mut out, n, state);
        }
        Ok(Some(out))
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let bs = self.geo.block_size as usize;
        self.fan
            .poll_with(out, min_complete, |fan, done| Self::on_done(fan, bs, done))
    }
}
