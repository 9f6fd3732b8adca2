//! Segment storage on a raw device (format section 2): the two superblock copies at bytes 0 and
//! 4096 and segment slot `i` at byte `S * (i + 1)`. The AccelFS placement (a file per slot) will
//! offer the same calls; the store touches the device only through them.

use crate::error::StoreError;
use crate::format::superblock::Superblock;
use crate::format::{FormatError, PAGE_SIZE};
use kura_engine::{BlockDevice, BlockingIo};

/// Refuses devices whose blocks do not tile a page.
fn check_device(dev: &dyn BlockDevice) -> Result<(), StoreError> {
    let bs = dev.geometry().block_size as usize;
    if bs == 0
        || !PAGE_SIZE.is_multiple_of(bs)
        || dev.geometry().capacity_bytes() < 2 * PAGE_SIZE as u64
    {
        return Err(StoreError::Invalid(format!(
            "{}: block size {bs} does not divide the {PAGE_SIZE}-byte page, or the device is smaller than two pages",
            dev.describe()
        )));
    }
    Ok(())
}

/// Both superblock copies of the store on `dev`, each decoded on its own.
pub(crate) fn read_superblocks(
    dev: &mut dyn BlockDevice,
) -> Result<[Result<Superblock, FormatError>; 2], StoreError> {
    check_device(dev)?;
    let mut both = vec![0u8; 2 * PAGE_SIZE];
    dev.read_blocks(0, &mut both)?;
    Ok([
        Superblock::decode(&both[..PAGE_SIZE]),
        Superblock::decode(&both[PAGE_SIZE..]),
    ])
}

pub(crate) struct RawSegments {
    dev: Box<dyn BlockDevice>,
    segment_shift: u32,
    slot_count: u64,
}

impl RawSegments {
    /// The slots of `segment_shift`-sized segments that fit on `dev` after the superblock area.
    pub(crate) fn new(dev: Box<dyn BlockDevice>, segment_shift: u32) -> Result<Self, StoreError> {
        check_device(dev.as_ref())?;
        let slots = (dev.geometry().capacity_bytes() >> segment_shift).saturating_sub(1);
        Ok(RawSegments {
            dev,
            segment_shift,
            slot_count: slots,
        })
    }

    pub(crate) fn slot_count(&self) -> u64 {
        self.slot_count
    }

    fn lba(&self, byte: u64) -> u64 {
        byte / u64::from(self.dev.geometry().block_size)
    }

    fn slot_byte(&self, slot: u64, page: u32) -> u64 {
        ((slot + 1) << self.segment_shift) + u64::from(page) * PAGE_SIZE as u64
    }

    /// Writes copy `copy` (0 = A, 1 = B) and flushes.
    pub(crate) fn write_superblock(
        &mut self,
        copy: usize,
        sb: &Superblock,
    ) -> Result<(), StoreError> {
        let lba = self.lba((copy * PAGE_SIZE) as u64);
        self.dev.write_blocks(lba, &sb.encode())?;
        self.dev.flush_all()?;
        Ok(())
    }

    /// Writes whole pages at `page` of `slot` (not durable until [`RawSegments::flush`]).
    pub(crate) fn write(&mut self, slot: u64, page: u32, data: &[u8]) -> Result<(), StoreError> {
        debug_assert!(data.len().is_multiple_of(PAGE_SIZE) && slot < self.slot_count);
        let lba = self.lba(self.slot_byte(slot, page));
        self.dev.write_blocks(lba, data)?;
        Ok(())
    }

    /// Reads `pages` pages at `page` of `slot`.
    pub(crate) fn read(
        &mut self,
        slot: u64,
        page: u32,
        pages: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let mut out = vec![0u8; pages * PAGE_SIZE];
        let lba = self.lba(self.slot_byte(slot, page));
        self.dev.read_blocks(lba, &mut out)?;
        Ok(out)
    }

    pub(crate) fn flush(&mut self) -> Result<(), StoreError> {
        self.dev.flush_all()?;
        Ok(())
    }
}
