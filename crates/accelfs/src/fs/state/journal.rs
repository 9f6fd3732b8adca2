//! The journal and the running transaction: metadata blocks as committed (the journal's image
//! when the home copy is stale), how big the running transaction has grown, and the commit that
//! turns the changed inodes, extent chains, directory blocks and bitmaps into block images and
//! writes them with the dirty data in one batch and one flush (format §7).
//!
//! Each concern hands over its part of the transaction (`inode_images`, `dir_images`, the
//! allocator's bitmaps, the dirty data) and is told when it is committed. Owns the fields
//! `journal`, `layout_changed` and `commits` of [`Mounted`].

use super::Mounted;
use crate::error::FsError;

impl Mounted {
    /// A metadata block as committed: the journal's image when its home copy is stale.
    pub(super) fn read_meta(&mut self, block: u64) -> Result<Vec<u8>, FsError> {
        match self.journal.image(block) {
            Some(b) => Ok(b.to_vec()),
            None => self.io.read(block),
        }
    }

    /// Metadata blocks the running transaction would write now (an upper estimate).
    fn transaction_estimate(&self) -> usize {
        self.inode_blocks_estimate() + self.dirty_dir_blocks() + self.alloc.dirty_count()
    }

    /// Records that file `ino`'s size or block map changed in the running transaction.
    pub(super) fn mark_layout_changed(&mut self, ino: u64) {
        self.layout_changed.insert(ino);
    }

    /// Whether file `ino`'s size or block map changed in the running transaction (then
    /// fdatasync must commit).
    pub(super) fn layout_changed_in_transaction(&self, ino: u64) -> bool {
        self.layout_changed.contains(&ino)
    }

    /// Commits first when the running transaction is half way to the journal's limit, so that
    /// the next operation's changes fit into it.
    pub(super) fn make_transaction_room(&mut self) -> Result<(), FsError> {
        if self.transaction_estimate() * 2 >= self.journal.max_transaction_blocks() {
            self.commit()?;
        }
        Ok(())
    }

    /// Makes everything durable: dirty data and the running transaction, one batch, one flush.
    pub(crate) fn commit(&mut self) -> Result<(), FsError> {
        if self.mounted_read_only && !self.closed {
            return Ok(());
        }
        self.writable()?;
        let result = self.commit_inner();
        if let Err(e) = &result {
            self.read_only = Some(format!("after an I/O failure: {e}"));
        }
        result
    }

    fn commit_inner(&mut self) -> Result<(), FsError> {
        // Extent chains and inode-table blocks, then directory blocks, then bitmaps: laying out
        // the chains may allocate or free blocks, so the bitmaps come last.
        let mut images = self.inode_images()?;
        images.extend(self.dir_images()?);
        images.extend(self.alloc.dirty_images(self.bs));
        // Small amounts of dirty data go into the log with the metadata (format §7): an fsync'd
        // small write is then one sequential log write and one flush.
        let dirty = self.take_dirty_data();
        let fits = images.len() + dirty.len() <= self.journal.max_transaction_blocks();
        let data = if !images.is_empty()
            && fits
            && dirty.len() * self.bs <= self.opts.journal_data_bytes
        {
            images.extend(self.journaled(dirty)?);
            Vec::new()
        } else {
            self.placed(dirty)?
        };
        if images.is_empty() && data.is_empty() {
            return self.io.flush();
        }
        if images.is_empty() {
            self.io.batch(data)?;
            return self.io.flush();
        }
        self.journal.commit_with_data(&mut self.io, &images, data)?;
        self.alloc.committed();
        self.alloc.clear_dirty();
        self.inodes_committed();
        self.dirs_committed();
        self.layout_changed.clear();
        self.commits += 1;
        Ok(())
    }
}
