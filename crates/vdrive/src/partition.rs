//! `split(CHILD)?offset=SIZE&len=SIZE` — a window (partition) of one child: block `b` of the
//! drive is block `offset / block_size + b` of the child.
//!
//! It owns only the window's bounds; every request moves to the child unchanged except for its
//! LBA (no copy), and the child's errors come back as they are. `offset` defaults to 0 and `len`
//! to the rest of the child; both must be whole blocks, and the window must end within the child.

use crate::mapped::{ChildCommand, Layout, MappedDrive};
use kura_engine::open::ChildOpener;
use kura_engine::{BlockDevice, OpenError, Spec};

/// Options of `split(...)`.
pub const SPLIT_OPTIONS: &[&str] = &["offset", "len"];

/// The window: `blocks` blocks starting at block `offset` of the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub offset: u64,
    pub blocks: u64,
    block_size: u32,
}

/// A window of one child.
pub type Partition = MappedDrive<Window>;

impl Layout for Window {
    fn kind(&self) -> &'static str {
        "split"
    }

    fn num_blocks(&self) -> u64 {
        self.blocks
    }

    fn map(&self, lba: u64, blocks: u64, out: &mut Vec<ChildCommand>) {
        out.push(ChildCommand {
            leg: 0,
            lba: self.offset + lba,
            blocks,
            segs: vec![(0, blocks)],
        });
    }

    fn options(&self) -> String {
        let bs = u64::from(self.block_size);
        format!("?offset={}&len={}", self.offset * bs, self.blocks * bs)
    }
}

/// A window of `child` from byte `offset` for `len` bytes (the rest of the child when `None`).
pub fn new(
    child: Box<dyn BlockDevice>,
    offset: u64,
    len: Option<u64>,
) -> Result<Partition, OpenError> {
    let geo = child.geometry();
    let bs = u64::from(geo.block_size);
    let capacity = geo.capacity_bytes();
    let what = child.describe();
    if !offset.is_multiple_of(bs) {
        return Err(OpenError::Invalid(format!(
            "split({what}): offset {offset} is not a multiple of the block size ({bs})"
        )));
    }
    let len = match len {
        Some(len) => len,
        None => capacity.saturating_sub(offset),
    };
    if len == 0 || !len.is_multiple_of(bs) {
        return Err(OpenError::Invalid(format!(
            "split({what}): len {len} must be a non-zero multiple of the block size ({bs})"
        )));
    }
    if offset.checked_add(len).is_none_or(|end| end > capacity) {
        return Err(OpenError::Invalid(format!(
            "split({what}): the window {offset}..{} runs past the end of the device ({capacity} bytes)",
            offset.saturating_add(len)
        )));
    }
    let window = Window {
        offset: offset / bs,
        blocks: len / bs,
        block_size: geo.block_size,
    };
    MappedDrive::new(vec![child], window)
}

/// Opens `split(CHILD)?offset=SIZE&len=SIZE`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Partition, OpenError> {
    spec.check_options(SPLIT_OPTIONS)?;
    let offset = spec.size_option("offset")?.unwrap_or(0);
    let len = spec.size_option("len")?;
    let mut kids = crate::open_children(spec, children, 1, Some(1))?;
    let child = kids.remove(0);
    new(child, offset, len).map_err(|e| crate::in_spec(spec, e))
}
