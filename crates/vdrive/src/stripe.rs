//! `stripe(A,B,...)?chunk=SIZE` — RAID-0: the drive is cut into chunks (64 KiB by default) dealt
//! round-robin to the children, so chunk `c` lives on child `c % n` at row `c / n`.
//!
//! It owns the chunk map. A request within one chunk goes to its child unchanged except for its
//! LBA; one spanning chunks is cut into one command per child (a child's chunks of one request
//! are contiguous on that child, so they merge), with the data gathered and scattered through a
//! scratch buffer, and completes as one with the first piece's error. Each child contributes
//! whole chunks up to the smallest child's size; `chunk` must be a multiple of the block size.

use crate::mapped::{ChildCommand, Layout, MappedDrive};
use kura_engine::open::ChildOpener;
use kura_engine::{BlockDevice, OpenError, Spec};

/// Options of `stripe(...)`.
pub const STRIPE_OPTIONS: &[&str] = &["chunk"];
/// Chunk size when none is given.
pub const DEFAULT_CHUNK: u64 = 64 << 10;

/// The chunk map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunks {
    /// Blocks per chunk.
    pub chunk_blocks: u64,
    pub legs: usize,
    /// Blocks used on each child.
    pub leg_blocks: u64,
    block_size: u32,
}

/// RAID-0 over its children.
pub type Stripe = MappedDrive<Chunks>;

impl Layout for Chunks {
    fn kind(&self) -> &'static str {
        "stripe"
    }

    fn num_blocks(&self) -> u64 {
        self.leg_blocks * self.legs as u64
    }

    fn map(&self, lba: u64, blocks: u64, out: &mut Vec<ChildCommand>) {
        let first = out.len();
        let (cb, n) = (self.chunk_blocks, self.legs as u64);
        let (mut at, end) = (lba, lba + blocks);
        while at < end {
            let chunk = at / cb;
            let within = at % cb;
            let take = (cb - within).min(end - at);
            let leg = (chunk % n) as usize;
            let child_lba = (chunk / n) * cb + within;
            let seg = (at - lba, take);
            match out[first..].iter_mut().find(|p| p.leg == leg) {
                Some(p) if p.lba + p.blocks == child_lba => {
                    p.blocks += take;
                    p.segs.push(seg);
                }
                _ => out.push(ChildCommand {
                    leg,
                    lba: child_lba,
                    blocks: take,
                    segs: vec![seg],
                }),
            }
            at += take;
        }
    }

    fn options(&self) -> String {
        format!("?chunk={}", self.chunk_blocks * u64::from(self.block_size))
    }
}

/// RAID-0 over `children` with chunks of `chunk` bytes.
pub fn new(children: Vec<Box<dyn BlockDevice>>, chunk: u64) -> Result<Stripe, OpenError> {
    crate::mapped::check_block_sizes("stripe", &children)?;
    let Some(first) = children.first() else {
        return Err(OpenError::Invalid("stripe: no devices given".into()));
    };
    let bs = u64::from(first.geometry().block_size);
    if chunk == 0 || !chunk.is_multiple_of(bs) {
        return Err(OpenError::Invalid(format!(
            "stripe: chunk {chunk} is not a non-zero multiple of the block size ({bs})"
        )));
    }
    let chunk_blocks = chunk / bs;
    let smallest = children
        .iter()
        .map(|c| c.geometry().num_blocks)
        .min()
        .unwrap_or(0);
    if smallest < chunk_blocks {
        return Err(OpenError::Invalid(format!(
            "stripe: the smallest device ({} bytes) is smaller than one chunk ({chunk} bytes)",
            smallest * bs
        )));
    }
    let chunks = Chunks {
        chunk_blocks,
        legs: children.len(),
        leg_blocks: smallest / chunk_blocks * chunk_blocks,
        block_size: bs as u32,
    };
    MappedDrive::new(children, chunks)
}

/// Opens `stripe(A,B,...)?chunk=SIZE`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Stripe, OpenError> {
    spec.check_options(STRIPE_OPTIONS)?;
    let chunk = spec.size_option("chunk")?.unwrap_or(DEFAULT_CHUNK);
    let kids = crate::open_children(spec, children, 2, None)?;
    new(kids, chunk).map_err(|e| crate::in_spec(spec, e))
}
