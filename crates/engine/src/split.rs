//! Splitting requests larger than the device's maximum transfer, and retiring them as one.
//!
//! A backend cuts a large request into [`CommandSpan`]s, issues each as its own command, and keeps a
//! [`SplitParent`] that owns the original request (and its buffer) until every piece has
//! completed; the caller then sees one completion carrying the first error, if any.

use crate::device::{Completion, Geometry, Request};
use crate::error::{DeviceError, DeviceResult};

/// One device command's share of a larger request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandSpan {
    pub lba: u64,
    pub blocks: u64,
    /// Offset of this piece's data within the request's buffer.
    pub buf_offset: usize,
}

/// Cuts `blocks` blocks at `lba` into pieces of at most `max_blocks` blocks.
pub fn pieces(
    lba: u64,
    blocks: u64,
    max_blocks: u64,
    block_size: u32,
) -> impl Iterator<Item = CommandSpan> {
    let max_blocks = max_blocks.max(1);
    let count = blocks.div_ceil(max_blocks);
    (0..count).map(move |i| {
        let first = i * max_blocks;
        CommandSpan {
            lba: lba + first,
            blocks: max_blocks.min(blocks - first),
            buf_offset: (first * u64::from(block_size)) as usize,
        }
    })
}

/// How many device commands `req` becomes on a device of geometry `geo` (one for commands
/// without data, which are never split).
pub fn piece_count(req: &Request, geo: &Geometry) -> u32 {
    if req.op.has_data() {
        req.blocks.div_ceil(u64::from(geo.max_transfer_blocks())) as u32
    } else {
        1
    }
}

/// A request in flight as several pieces.
#[derive(Debug)]
pub struct SplitParent {
    request: Request,
    remaining: usize,
    status: DeviceResult<()>,
}

impl SplitParent {
    /// Tracks `request`, which was issued as `parts` pieces (at least one).
    pub fn new(request: Request, parts: usize) -> Self {
        SplitParent {
            request,
            remaining: parts.max(1),
            status: Ok(()),
        }
    }

    /// The request being tracked (e.g. to find its buffer address).
    pub fn request(&self) -> &Request {
        &self.request
    }

    pub fn request_mut(&mut self) -> &mut Request {
        &mut self.request
    }

    /// Records `error` for the request without completing a piece (a piece that will not come
    /// back in time, say); like a piece's, only the first error is kept.
    pub fn fail(&mut self, error: DeviceError) {
        if self.status.is_ok() {
            self.status = Err(error);
        }
    }

    /// Records one piece's status; returns true when this was the last piece.
    pub fn piece_done(&mut self, status: DeviceResult<()>) -> bool {
        if self.status.is_ok() {
            self.status = status;
        }
        self.remaining -= 1;
        self.remaining == 0
    }

    /// The single completion the caller sees.
    pub fn into_completion(self) -> Completion {
        Completion::of(self.request, self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range_exactly() {
        let p: Vec<_> = pieces(10, 600, 256, 4096).collect();
        assert_eq!(p.len(), 3);
        assert_eq!(
            p[0],
            CommandSpan {
                lba: 10,
                blocks: 256,
                buf_offset: 0
            }
        );
        assert_eq!(
            p[2],
            CommandSpan {
                lba: 522,
                blocks: 88,
                buf_offset: 512 * 4096
            }
        );
        assert_eq!(pieces(0, 256, 256, 512).count(), 1);
    }

    #[test]
    fn the_first_error_is_the_one_reported() {
        let req = Request::flush(7);
        let mut parent = SplitParent::new(req, 3);
        let first = DeviceError::Offline {
            reason: "first".into(),
        };
        parent.fail(first.clone());
        assert!(!parent.piece_done(Ok(())));
        let second = DeviceError::Offline {
            reason: "second".into(),
        };
        assert!(!parent.piece_done(Err(second)));
        assert!(parent.piece_done(Ok(())));
        let c = parent.into_completion();
        assert_eq!((c.tag, c.status), (7, Err(first)));
    }
}
