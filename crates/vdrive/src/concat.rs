//! `concat(A,B,...)` — children end to end: the drive's blocks are A's, then B's, and so on.
//!
//! It owns the table of where each child starts. A request inside one child goes to it unchanged
//! except for its LBA; one that crosses a boundary is cut into a piece per child and completed as
//! one, with the first piece's error. Children must share one block size.

use crate::mapped::{ChildCommand, Layout, MappedDrive};
use kura_engine::open::ChildOpener;
use kura_engine::{BlockDevice, OpenError, Spec};

/// Where each child starts on the drive, and the total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    starts: Vec<u64>,
    total: u64,
}

/// Children end to end.
pub type Concat = MappedDrive<Chain>;

impl Chain {
    /// The first block of each child on the drive.
    pub fn starts(&self) -> &[u64] {
        &self.starts
    }
}

impl Layout for Chain {
    fn kind(&self) -> &'static str {
        "concat"
    }

    fn num_blocks(&self) -> u64 {
        self.total
    }

    fn map(&self, lba: u64, blocks: u64, out: &mut Vec<ChildCommand>) {
        let mut leg = self.starts.partition_point(|&s| s <= lba).saturating_sub(1);
        let (mut at, end) = (lba, lba + blocks);
        while at < end && leg < self.starts.len() {
            let leg_end = self.starts.get(leg + 1).copied().unwrap_or(self.total);
            let n = end.min(leg_end) - at;
            if n > 0 {
                out.push(ChildCommand {
                    leg,
                    lba: at - self.starts[leg],
                    blocks: n,
                    segs: vec![(at - lba, n)],
                });
            }
            at += n;
            leg += 1;
        }
    }

    fn options(&self) -> String {
        String::new()
    }
}

/// `children` end to end; they must share one block size.
pub fn new(children: Vec<Box<dyn BlockDevice>>) -> Result<Concat, OpenError> {
    let mut starts = Vec::with_capacity(children.len());
    let mut total = 0u64;
    for c in &children {
        starts.push(total);
        total += c.geometry().num_blocks;
    }
    MappedDrive::new(children, Chain { starts, total })
}

/// Opens `concat(A,B,...)`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Concat, OpenError> {
    spec.check_options(&[])?;
    let kids = crate::open_children(spec, children, 2, None)?;
    new(kids).map_err(|e| crate::in_spec(spec, e))
}
