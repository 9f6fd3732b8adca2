//! The journal and the running transaction: metadata blocks as committed (the journal's image
//! when the home copy is stale), how big the running transaction has grown, and the commit that
//! turns the changed inodes, extent chains, directory blocks and bitmaps into block images and
//! writes them with the dirty data in one batch and one flush (format §7).
//!
//! Each concern hands over its part of the transaction (`inode_images`, `dir_images`, the
//! allocator's bitmaps, the dirty data). A commit has three steps: [`Mounted::prepare_commit`]
//! takes that snapshot under the state lock and starts a new running transaction;
//! [`super::Prepared::write`] writes and flushes it under the disk lock alone; and
//! [`Mounted::commit_done`], under the state lock again, makes what it freed reusable and
//! records it as durable. [`Mounted::commit`] does all three without releasing the state lock
//! (for commits made inside an operation: room in the transaction, unmount); group commit
//! (`FileSystem::sync`, `File::sync_all`) releases it for the write (see `fs/mod.rs`).
//!
//! # What a commit writes
//!
//! Every metadata change of the running transaction (one transaction for the whole file system,
//! like jbd2), but not every dirty data block: only the dirty blocks of the files whose size or
//! block map changed in it (ordered mode: a commit never makes a block reachable before its
//! data), of the files an fsync is waiting for ([`Mounted::want_data`] with a file), and all of
//! them when a whole-file-system `sync` or the unmount waits ([`Mounted::want_data`] with
//! `None`). So `File::sync_all` of file A does not write back file B's overwrites in place: they
//! stay dirty in the cache until B's own fsync, a `sync`, eviction or the unmount; a crash before
//! then shows B's blocks as last written home (B's own older data, never another file's).
//!
//! Owns the fields `max_transaction`, `running_seq`, `durable_seq`, `commit_in_flight`,
//! `layout_changed`, `fsync_files`, `all_data_wanted` and `commits` of [`Mounted`].

use super::{Mounted, Prepared, Written};
use crate::error::FsError;
use crate::fs::planned::PlannedWrites;

impl Mounted {
    /// A metadata block as committed: the journal's image when its home copy is stale.
    pub(super) fn read_meta(&mut self, block: u64) -> Result<Vec<u8>, FsError> {
        let mut d = self.disk.lock();
        match d.journal.image(block).map(<[u8]>::to_vec) {
            Some(b) => Ok(b),
            None => d.dev.read(block),
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
    pub(crate) fn layout_changed_in_transaction(&self, ino: u64) -> bool {
        self.layout_changed.contains(&ino)
    }

    /// Commits first when the running transaction is half way to the journal's limit, so that
    /// the next operation's changes fit into it.
    pub(crate) fn make_transaction_room(&mut self) -> Result<(), FsError> {
        if self.transaction_estimate() * 2 >= self.max_transaction {
            self.commit()?;
        }
        Ok(())
    }

    /// Records that a sync waits on the running transaction for the dirty data of file `ino`
    /// (an fsync), or of every file (`None`: `sync`, unmount); the next commit writes it.
    pub(crate) fn want_data(&mut self, ino: Option<u64>) {
        match ino {
            Some(ino) => {
                self.fsync_files.insert(ino);
            }
            None => self.all_data_wanted = true,
        }
    }

    /// Whether a commit has nothing to do: a read-only mount (not yet closed).
    pub(crate) fn nothing_to_commit(&self) -> bool {
        self.mounted_read_only && !self.closed
    }

    /// The running transaction's sequence: a sync that began now is done once
    /// [`Mounted::durable_seq`] reaches it.
    pub(crate) fn running_seq(&self) -> u64 {
        self.running_seq
    }

    /// Every transaction up to this one is durable.
    pub(crate) fn durable_seq(&self) -> u64 {
        self.durable_seq
    }

    /// Whether a group commit's leader is writing a transaction now.
    pub(crate) fn commit_in_flight(&self) -> bool {
        self.commit_in_flight
    }

    /// Marks that this thread leads a group commit (or that it finished).
    pub(crate) fn set_commit_in_flight(&mut self, on: bool) {
        self.commit_in_flight = on;
    }

    /// Makes the running transaction durable with the dirty data it must carry (module
    /// documentation), all without releasing the state lock.
    pub(crate) fn commit(&mut self) -> Result<(), FsError> {
        if self.nothing_to_commit() {
            return Ok(());
        }
        let prepared = self.prepare_commit()?;
        let disk = self.disk.clone();
        let written = prepared.write(&mut disk.lock());
        self.commit_done(written)
    }

    /// Takes the running transaction as a [`Prepared`] commit (dirty state is handed over and
    /// cleared, so later changes go into the next transaction) and starts the next one. On
    /// failure the file system goes read-only.
    pub(crate) fn prepare_commit(&mut self) -> Result<Prepared, FsError> {
        self.writable()?;
        let result = self.prepare_inner();
        if let Err(e) = &result {
            self.read_only = Some(format!("after an I/O failure: {e}"));
        }
        result
    }

    fn prepare_inner(&mut self) -> Result<Prepared, FsError> {
        // Extent chains and inode-table blocks, then directory blocks, then bitmaps: laying out
        // the chains may allocate or free blocks, so the bitmaps come last.
        let mut images = self.inode_images()?;
        images.extend(self.dir_images()?);
        images.extend(self.alloc.dirty_images(self.bs));
        // The dirty data this commit must carry (module documentation): small amounts go into
        // the log with the metadata (format §7), so an fsync'd small write is then one
        // sequential log write and one flush.
        let dirty = if std::mem::take(&mut self.all_data_wanted) {
            self.take_dirty_data(None)
        } else {
            let files: Vec<u64> = self
                .layout_changed
                .union(&self.fsync_files)
                .copied()
                .collect();
            files
                .into_iter()
                .flat_map(|ino| self.take_dirty_data(Some(ino)))
                .collect()
        };
        self.fsync_files.clear();
        let fits = images.len() + dirty.len() <= self.max_transaction;
        let (data, home_unsettled) = if !images.is_empty()
            && fits
            && dirty.len() * self.bs <= self.opts.journal_data_bytes
        {
            images.extend(self.journaled(dirty)?);
            (PlannedWrites::none(self.bs), None)
        } else {
            self.placed_unchecked(dirty)?
        };
        self.alloc.clear_dirty();
        self.inodes_committed();
        self.dirs_committed();
        self.layout_changed.clear();
        let seq = self.running_seq;
        self.running_seq += 1;
        // The leader writes these images to the log with the state lock released; until a
        // checkpoint their home copies are older.
        self.unsettle(images.iter().map(|&(target, _)| target));
        Ok(Prepared {
            images,
            data,
            freed: self.alloc.take_freed(),
            seq,
            home_unsettled,
        })
    }

    /// A prepared commit was written: what it freed may be reused and everything up to it is
    /// durable; or it failed, and the file system goes read-only.
    pub(crate) fn commit_done(&mut self, written: Result<Written, FsError>) -> Result<(), FsError> {
        match written {
            Ok(w) => {
                self.alloc.committed(w.freed);
                // Transactions reach the log in sequence order (each takes the disk lock
                // before the next is prepared), so this one durable means all before it are.
                self.durable_seq = self.durable_seq.max(w.seq);
                if w.transaction {
                    self.commits += 1;
                }
                Ok(())
            }
            Err(e) => {
                self.read_only
                    .get_or_insert_with(|| format!("after an I/O failure: {e}"));
                Err(e)
            }
        }
    }
}
