//! The device and the journal of a mounted file system, behind their own lock ([`Disk`]),
//! separate from the mounted state's: a journal commit's log writes and flush, and a cache
//! miss's device read, run holding only this lock, so other threads keep using the state
//! (cached reads, writes into the cache, names) meanwhile.
//!
//! The journal lives here with the device because every change to it is device I/O (commit,
//! checkpoint) and because the in-memory images it serves ([`crate::wal::Journal::image`]) must
//! change atomically with the log write that makes them durable: whoever checks for an image
//! (before a direct write, before a device read) takes this lock and so sees either the state
//! before a commit's I/O or the state after it, never the middle.
//!
//! A commit is prepared under the state lock ([`Prepared`]: the transaction's block images and
//! its ordered data), which then takes this lock *before* releasing the state lock, so nothing
//! can slip between the snapshot and its log write; the write and the flush run under this lock
//! alone ([`Prepared::write`]). A failed commit poisons the disk: no later commit may be written
//! after a transaction that is missing from the log.

use crate::error::FsError;
use crate::fsdevice::{BatchOp, FsDevice};
use crate::wal::Journal;
use std::sync::{Arc, Mutex, MutexGuard};

/// The device and the journal (see the module documentation).
pub(crate) struct Disk {
    pub(crate) dev: FsDevice,
    pub(crate) journal: Journal,
    /// Set when a commit's writes or flush failed: every later commit is refused.
    poisoned: Option<String>,
}

/// A shared handle on the [`Disk`] of a mount.
#[derive(Clone)]
pub(crate) struct SharedDisk(Arc<Mutex<Disk>>);

impl SharedDisk {
    pub(crate) fn new(dev: FsDevice, journal: Journal) -> Self {
        SharedDisk(Arc::new(Mutex::new(Disk {
            dev,
            journal,
            poisoned: None,
        })))
    }

    /// Takes the disk lock. A panic while it was held cannot have left a half-written
    /// transaction counted as durable (the journal's state changes only after a flush), so the
    /// disk stays usable.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Disk> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Disk {
    /// Fails when an earlier commit failed (see [`Disk::poison`]).
    pub(crate) fn check_poison(&self) -> Result<(), FsError> {
        match &self.poisoned {
            Some(why) => Err(FsError::ReadOnly(why.clone())),
            None => Ok(()),
        }
    }

    /// fdatasync's device part: writes `ops` (dirty data going home) and flushes. Refused after
    /// a failed commit (which may have held the file's block map); poisons on failure.
    pub(crate) fn write_and_flush(&mut self, ops: Vec<BatchOp>) -> Result<(), FsError> {
        self.check_poison()?;
        let result = (|| {
            if !ops.is_empty() {
                self.dev.batch(ops)?;
            }
            self.dev.flush()
        })();
        if let Err(e) = &result {
            self.poison(e);
        }
        result
    }

    /// Records that a commit or data flush failed: nothing more is committed.
    pub(crate) fn poison(&mut self, e: &FsError) {
        self.poisoned
            .get_or_insert_with(|| format!("after an I/O failure: {e}"));
    }
}

/// A snapshot of the running transaction, taken under the state lock, to be written under the
/// disk lock alone.
pub(crate) struct Prepared {
    /// Metadata (and journaled data) block images.
    pub(crate) images: Vec<(u64, Vec<u8>)>,
    /// Ordered data written home in the same batch.
    pub(crate) data: Vec<BatchOp>,
    /// Blocks the transaction freed: reusable once it is durable.
    pub(crate) freed: Vec<(u64, u64)>,
    /// The transaction's sequence in this mount (the running transaction's when prepared).
    pub(crate) seq: u64,
}

/// A transaction that is durable: what [`Mounted::commit_done`](super::Mounted) needs to know.
pub(crate) struct Written {
    pub(crate) freed: Vec<(u64, u64)>,
    pub(crate) seq: u64,
    pub(crate) transaction: bool,
}

impl Prepared {
    /// Writes the transaction (log and ordered data in one batch) and flushes: format §7
    /// steps 1–3. Poisons the disk on failure.
    pub(crate) fn write(self, disk: &mut Disk) -> Result<Written, FsError> {
        disk.check_poison()?;
        let Prepared {
            images,
            data,
            freed,
            seq,
        } = self;
        let transaction = !images.is_empty();
        let Disk { dev, journal, .. } = disk;
        let result = if images.is_empty() {
            (|| {
                if !data.is_empty() {
                    dev.batch(data)?;
                }
                dev.flush()
            })()
        } else {
            journal.commit_with_data(dev, &images, data).map(|_| ())
        };
        match result {
            Ok(()) => Ok(Written {
                freed,
                seq,
                transaction,
            }),
            Err(e) => {
                disk.poison(&e);
                Err(e)
            }
        }
    }
}
