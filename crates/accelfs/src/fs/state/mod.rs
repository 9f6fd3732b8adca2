//! The mounted state of an AccelFS: one value, [`Mounted`], that owns everything a mount holds
//! in memory — the superblock, the allocator, the inodes, the directories, the buffer cache,
//! and a handle on the device and the journal (behind their own lock, [`disk`]) — behind the
//! state lock of a `FileSystem`. Its fields are private to this module; its methods are grouped
//! by concern, one file each:
//!
//! - [`inodes`]: inode metadata (inodes with their block maps, the inode-table blocks, which
//!   inodes the running transaction changed, attributes);
//! - [`names`]: directories and every operation on names (resolve, create, remove, rename, list);
//! - [`data`]: the data path (reads, writes, truncation, streaming, the buffer cache, read-ahead,
//!   the bypass and the device writes of dirty data);
//! - [`journal`]: the running transaction and its commit, and metadata blocks as committed;
//! - [`xattrs`]: extended attributes (each inode's attribute block, loaded on first use).
//!
//! - [`disk`]: the device and the journal, behind their own lock.
//!
//! This file holds what belongs to the mount as a whole: mounting, whether it may still write,
//! statistics, unmounting and the commit when the last handle is dropped. The groups of fields
//! below follow the concerns, so that finer locking can later split them along the same lines.
//!
//! # Locks
//!
//! Three locks, always taken in this order, never the other way round:
//!
//! 1. the **state lock** (`FileSystem`'s `StripedRwLock` around this `Mounted`, `striped.rs`):
//!    every API call takes it. It is a read-write lock split into stripes (four per core, each a
//!    `std` `RwLock` on a cache line of its own): a reader locks the one stripe of its thread, a
//!    writer locks them all in order. So shared readers on different cores write different cache
//!    lines (with one `RwLock`, every read and its release wrote the one reader counter, and cached
//!    reads stopped scaling past 2-4 cores), and an exclusive lock costs one more uncontended lock
//!    per stripe, which the paths that take it (changes, misses) can afford. **Shared**
//!    (`&Mounted`) for what only looks: a read whose blocks are all cached
//!    ([`Mounted::read_cached`]: the inode's size and generation, the cache's per-file table, a
//!    copy), `stat` of an inode already in memory ([`Mounted::loaded_metadata`]), a handle check
//!    ([`Mounted::check_loaded_handle`]), path resolution, lookups and listings through directories
//!    in memory ([`Mounted::resolve_loaded`], [`Mounted::lookup_loaded`],
//!    [`Mounted::list_loaded`]), `statfs`. Those never load anything (loading changes the state):
//!    when the inode is not in memory or a block is missing they return `None`, release the shared
//!    lock and the caller starts again under the exclusive lock. **Exclusive** for everything else
//!    (every change, cache misses, loading metadata). The few things a shared reader writes are
//!    atomics, each written only when its value must change (so random reads of blocks already
//!    referenced write no line but their thread's stripe): a cached block's `referenced` flag (the
//!    cache's second chance, `cache.rs`; set by the first hit after the block moved), the hit
//!    counter (per-thread stripes, 128 bytes apart) and a sequential reader's position
//!    (`next_sequential`, advanced only by a read that continues it);
//! 2. the **disk lock** ([`SharedDisk`]: the `FsDevice` and the `Journal`): every device command
//!    and every look at the journal's images takes it, briefly or for the I/O. A read-write
//!    lock: **exclusive** ([`SharedDisk::lock`]) for the journal, flushes and anything that
//!    rewrites or frees blocks (commits, checkpoints, fdatasync, every device command issued
//!    under the state lock); **shared** ([`SharedDisk::io`]) for the I/O done with the state
//!    lock released that needs only that no block be freed, reused and rewritten meanwhile: a
//!    read miss's fetch, a streaming window, a large write's whole blocks. A shared holder
//!    does its I/O on a queue pair of its own, a sibling of the mount's device from a small
//!    pool (`disk.rs`), so those threads drive the device side by side; on a device with a
//!    single queue they take turns on the mount's queue. Inside it, two leaf mutexes: the
//!    `Disk` (taken after the gate, by exclusive holders and by a shared one that must use the
//!    mount's queue) and the pool of idle siblings;
//! 3. the **commit counter** (`FileSystem`'s `commits_finished` mutex with its condvar): a leaf,
//!    taken by a group commit's waiter while it holds the state lock (exclusively), which it
//!    then releases to sleep, and by the leader when it finishes; nothing else is taken while
//!    holding it.
//!
//! Nothing takes the state lock while holding the disk lock, and no thread holding the state
//! lock shared asks for it exclusively (a shared reader that needs more drops its guard
//! first). A thread that must wait for the device without blocking the others takes the disk
//! lock while holding the state lock (exclusively), then releases the state lock and does its
//! I/O under the disk lock alone: a group commit's log write and flush
//! (`FileSystem::group_commit`), and fdatasync's data write and flush. Both first check that
//! the disk lock is free; when another thread holds it they let the state lock go, wait for
//! the disk lock to be let go (`SharedDisk::wait_idle`) and start again (a few times at most,
//! then they wait holding it, so a busy disk cannot keep them back). Taking the disk lock
//! before releasing the state lock is what keeps the order of the journal: work prepared later
//! under the state lock (another commit, a checkpoint, a direct write, a device read that first
//! checks for a newer log image) reaches the device after it.
//!
//! A read (`FileSystem::read_file`) whose blocks are cached is a copy under the shared state
//! lock, beside other such reads of the same or other files; one larger than 256 KiB is copied
//! a piece at a time, the lock let go between pieces, and started again under the exclusive
//! lock if the file's data stamp moved meanwhile (so a writer waiting for the lock does not
//! keep every new reader waiting behind a copy of megabytes, and the read stays atomic). Otherwise it is planned under the
//! exclusive lock (`Mounted::read_begin`: cached blocks copied, a checkpoint first if the log
//! holds a newer copy of a block to read; the disk lock is taken for that look only when a
//! block to read is among `unsettled`, the blocks a commit may have logged, so a miss does not
//! wait under the state lock for another thread's commit), the state lock is released and the blocks are read
//! under the disk lock alone, and the state lock is taken again to copy out and cache them
//! (`Mounted::read_finish`). That is valid only if the file did not change meanwhile: every
//! change to a file's data or block map moves its data stamp (`data_versions`), and a block
//! cached at planning may have been evicted since; in either case the read is done again under
//! the state lock throughout. Reads of one file, and of different files, therefore wait for the
//! device without blocking each other's cached reads, writes into the cache or name
//! operations, nor each other: each fetch runs on its own queue pair under the shared disk
//! lock. A streaming read (`FileSystem::read_stream_file`) plans each window under the state
//! lock and reads it under the disk lock alone (shared), taken before the state lock is
//! released (so none of its blocks can be freed, reused and rewritten by another file
//! meanwhile: that needs the disk lock exclusively). A large write (`FileSystem::write_file`)
//! maps each step's holes under the state lock and writes its whole blocks under the disk lock
//! alone (taken before the state lock is released): shared when it only overwrites mapped
//! blocks (a reader then gets the old or the new version of the file's own block; the blocks
//! leave the cache before the state lock is released), exclusive when it fills holes, whose
//! newly mapped blocks hold another file's old data until the write lands (a reader planning
//! after it fetches holding the disk lock shared, so it waits; the file's size does not
//! protect the range, since another writer or a truncation may grow the file over it).
//! The bytes of writes planned under the state lock (a commit's ordered data, an fdatasync's
//! dirty blocks, a large write's whole blocks) are copied into command buffers only after it
//! is released, under the disk lock (`fs/planned.rs`): a plan shares cached blocks with the
//! cache, which copies a block before changing it while a plan holds it.
//! Dirty blocks evicted to make room are not written under the state lock: their writes are
//! queued on the disk and done by the next holder of the disk lock before anything else, which
//! is usually the next `FileSystem` call taking the state lock, with no lock held (`disk.rs`,
//! "Write-back of evicted blocks"); a commit, a fetch or a checkpoint therefore always comes
//! after them. A direct write looks for a newer log image of its blocks under the disk lock only
//! when one of them is unsettled, as a read miss does.
//! Still under the exclusive state lock: writes into the cache, appends (`File::append`, which
//! must read the size and write atomically), checkpoints, inline commits when a transaction
//! grows too big, slow symbolic links and loading metadata not yet in memory.

mod data;
mod disk;
mod inodes;
mod journal;
mod names;
mod xattrs;

use super::alloc::Allocator;
use super::cache::Cache;
use super::{FsStats, MountOptions, READ_ONLY_MOUNT};
use crate::error::{FormatError, FsError};
use crate::fsdevice::FsDevice;
use crate::inode::Kind;
use crate::layout::{Layout, Superblock, ROOT_INODE};
use crate::wal::{Journal, Recovery};
pub(crate) use data::{ReadStep, WRITE_STEP};
pub(crate) use disk::{Prepared, SharedDisk, Written};
use inodes::Node;
use names::Dir;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;

/// Everything a mounted file system holds in memory (see the module documentation).
pub(crate) struct Mounted {
    // ---- the mount as a whole (this file) ----
    /// The device and the journal, behind their own lock (`disk.rs`).
    disk: SharedDisk,
    sb: Superblock,
    bs: usize,
    opts: MountOptions,
    /// Set after a failed commit or flush, or for a read-only mount: nothing more is written.
    read_only: Option<String>,
    /// Mounted with `FileSystem::mount_read_only`: nothing is ever dirty, so `sync` has
    /// nothing to do (rather than failing as after an I/O error).
    mounted_read_only: bool,
    closed: bool,
    /// The image has the `posix` feature (symbolic links, special files, hard links, extended
    /// attributes); without it those are refused.
    posix: bool,
    recovery: Recovery,
    /// Free blocks and inodes (both bitmaps), shared by every concern that allocates.
    alloc: Allocator,
    // ---- inode metadata (`inodes.rs`) ----
    nodes: HashMap<u64, Node>,
    dirty_nodes: BTreeSet<u64>,
    /// Extent and attribute blocks of the dirty nodes, kept up to date by `touch` so that the
    /// transaction's size is known without walking them (`inodes.rs`).
    dirty_extra: usize,
    itable: HashMap<u64, Vec<u8>>,
    dirty_itable: BTreeSet<u64>,
    // ---- names (`names.rs`) ----
    dirs: HashMap<u64, Dir>,
    // ---- the data path (`data.rs`) ----
    cache: Cache,
    /// Per file: where the next read continues a sequential stream (an atomic, so that a
    /// sequential reader under the shared state lock can advance it; `data.rs`).
    next_sequential: HashMap<u64, AtomicU64>,
    /// Per file: a stamp changed by every change to its data or block map, so that a read that
    /// went to the device with the state lock released can tell whether what it read is still
    /// the file's (`data.rs`).
    data_versions: HashMap<u64, u64>,
    /// Source of those stamps.
    data_clock: u64,
    /// Device blocks whose home copy may be older than their newest committed contents: a
    /// superset of the journal's images, added to under the state lock when a commit is
    /// prepared (before its leader writes the log with the state lock released) and made exact
    /// only while holding the state lock and the disk lock exclusively (`data.rs`,
    /// [`Mounted::before_device_reads`]); `None` when unknown (grown past
    /// `data::UNSETTLED_MAX`). A device read of blocks outside it needs no look at the
    /// journal, so a read miss is planned without waiting for the disk lock, which a commit
    /// holds through its log write and flush while every other thread would wait on the state
    /// lock this one holds.
    unsettled: Option<BTreeSet<u64>>,
    // ---- the running transaction and group commit (`journal.rs`) ----
    /// Blocks the largest transaction may hold (the journal's, fixed at mount).
    max_transaction: usize,
    /// Sequence of the running transaction (the one changes go into now); starts at 1.
    running_seq: u64,
    /// Every transaction up to this sequence is durable.
    durable_seq: u64,
    /// A group commit's leader is writing a transaction with the state lock released.
    commit_in_flight: bool,
    /// Files whose size or block map changed in the running transaction (fdatasync must
    /// commit for them, and the commit writes their dirty data: ordered mode).
    layout_changed: BTreeSet<u64>,
    /// Files an fsync waits on the running transaction for: the commit writes their dirty data
    /// too (`journal.rs`, "what a commit writes").
    fsync_files: BTreeSet<u64>,
    /// A whole-file-system sync (or unmount) waits on the running transaction: the commit
    /// writes every dirty block.
    all_data_wanted: bool,
    commits: u64,
}

fn corrupt(msg: String) -> FsError {
    FsError::Format(FormatError::Corrupt(msg))
}

impl Mounted {
    /// Where the cache's buffers of blocks dropped in bulk wait to be freed without the lock.
    pub(crate) fn retired(&self) -> super::cache::Retired {
        self.cache.retired()
    }

    /// The mounted state of a file system whose journal was recovered (`read_only`: mounted
    /// with `FileSystem::mount_read_only`); checks that the root is a directory and loads it.
    pub(crate) fn mount(
        io: FsDevice,
        sb: Superblock,
        journal: Journal,
        alloc: Allocator,
        opts: MountOptions,
        recovery: Recovery,
        read_only: bool,
    ) -> Result<Mounted, FsError> {
        let bs = sb.layout.block_size as usize;
        let max_transaction = journal.max_transaction_blocks();
        // Recovery left nothing pending (or, read-only, serves what it found from memory), so
        // the journal's images are known from the start.
        let unsettled = journal.image_blocks(data::UNSETTLED_MAX);
        let mut m = Mounted {
            disk: SharedDisk::new(io, journal),
            sb,
            bs,
            opts,
            read_only: None,
            mounted_read_only: false,
            closed: false,
            posix: sb.features & crate::layout::FEATURE_POSIX != 0,
            recovery,
            alloc,
            nodes: HashMap::new(),
            dirty_nodes: BTreeSet::new(),
            dirty_extra: 0,
            itable: HashMap::new(),
            dirty_itable: BTreeSet::new(),
            dirs: HashMap::new(),
            cache: Cache::new(bs, opts.cache_bytes),
            next_sequential: HashMap::new(),
            data_versions: HashMap::new(),
            data_clock: 0,
            unsettled,
            max_transaction,
            running_seq: 1,
            durable_seq: 0,
            commit_in_flight: false,
            layout_changed: BTreeSet::new(),
            fsync_files: BTreeSet::new(),
            all_data_wanted: false,
            commits: 0,
        };
        if read_only {
            m.read_only = Some(READ_ONLY_MOUNT.into());
            m.mounted_read_only = true;
        }
        let root = m.node(ROOT_INODE)?;
        if root.inode.kind != Kind::Directory {
            return Err(
                FormatError::Corrupt("inode 1 (the root) is not a directory".into()).into(),
            );
        }
        m.dir(ROOT_INODE)?;
        Ok(m)
    }

    /// The device and journal, for I/O with the state lock released.
    pub(crate) fn disk(&self) -> SharedDisk {
        self.disk.clone()
    }

    pub(crate) fn layout(&self) -> Layout {
        self.sb.layout
    }

    /// Whether this is a read-only mount (`FileSystem::mount_read_only`).
    pub(crate) fn mounted_read_only(&self) -> bool {
        self.mounted_read_only
    }

    /// Refuses writes once the file system has gone read-only or been closed.
    pub(crate) fn writable(&self) -> Result<(), FsError> {
        if let Some(why) = &self.read_only {
            return Err(FsError::ReadOnly(why.clone()));
        }
        if self.closed {
            return Err(FsError::ReadOnly("the file system was unmounted".into()));
        }
        Ok(())
    }

    /// Refuses what needs the `posix` feature on an image made before it.
    pub(crate) fn need_posix(&self, what: &str) -> Result<(), FsError> {
        if self.posix {
            return Ok(());
        }
        Err(FsError::Unsupported(format!(
            "{what}: this image predates the posix feature (symbolic links, special files, hard links, extended attributes)"
        )))
    }

    /// Space, inodes and cache counters.
    pub(crate) fn stats(&self) -> FsStats {
        let l = self.layout();
        FsStats {
            block_size: l.block_size,
            total_blocks: l.total_blocks,
            free_blocks: self.alloc.free_block_count(),
            total_inodes: l.inode_count,
            free_inodes: self.alloc.free_inode_count(),
            cache: self.cache.stats(),
            commits: self.commits,
            disk_waits: 0,
            recovery: self.recovery,
        }
    }

    /// Commits, checkpoints the journal and closes the file system; later calls fail.
    pub(crate) fn unmount(&mut self) -> Result<(), FsError> {
        if self.closed {
            return Ok(());
        }
        if self.read_only.is_none() {
            self.want_data(None);
            self.commit()?;
            let mut d = self.disk.lock();
            let disk::Disk { dev, journal, .. } = &mut *d;
            journal.checkpoint(dev)?;
        }
        self.closed = true;
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // The last handle went away without `unmount`: make what was written durable, as
        // closing a file system would. Errors cannot be reported here; the journal keeps
        // what was committed before.
        if !self.closed && self.read_only.is_none() && {
            self.want_data(None);
            self.commit().is_ok()
        } {
            let mut d = self.disk.lock();
            let disk::Disk { dev, journal, .. } = &mut *d;
            let _ = journal.checkpoint(dev);
        }
    }
}
