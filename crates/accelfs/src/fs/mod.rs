//! A mounted AccelFS: the `std::fs`-like API ([`FileSystem`], [`File`]) over the mounted state
//! (`state/`: inode metadata, names, the data path and the journal, each a file), which owns
//! the buffer cache ([`cache`]) and the allocator (`alloc.rs`). Every call takes the state lock
//! and calls a method of the mounted state; paths are split by `path.rs`.
//!
//! Thread-safe: a `FileSystem` is a cheap handle that can be cloned into threads. The state
//! lock is a read-write lock striped per core (`striped.rs`, so that readers on different cores
//! do not share one reader counter): reads of cached data, `stat` of inodes in
//! memory, handle checks and path lookups through directories in memory take it shared and run
//! side by side; every change takes it exclusively. Nothing waits for the device holding it on
//! the paths that matter: commits, cache misses, large reads,
//! streams and large writes do their device I/O under the disk lock alone (cache misses,
//! streams and large writes hold it shared, each on a queue pair of its own). Which lock
//! protects what, the order they are taken in (state, then disk, then the commit counter) and
//! why that cannot deadlock: "# Locks" in `state/mod.rs`.
//!
//! Durability: `FileSystem::sync` writes every dirty block and commits the running transaction;
//! `File::sync_all` commits it with its own file's dirty data (and that of files whose size or
//! block map changed, which ordered mode requires), not other files' overwrites in place
//! (`state/journal.rs`, "What a commit writes"). fsyncs that overlap share one commit (group
//! commit). When they return, what they promised survives a crash.

mod alloc;
pub mod cache;
mod file;
mod path;
mod planned;
mod state;
#[allow(unsafe_code)]
mod striped;

pub use cache::CacheStats;
pub use file::{File, OpenOptions};
pub use path::MAX_DEPTH;

use crate::bitmap::Bitmap;
use crate::error::{FormatError, FsError};
use crate::fsck::load_superblock;
use crate::header::BlockKind;
use crate::inode::Kind;
use crate::journal::JournalArea;
use crate::layout::{Layout, VERSION};
use crate::mkfs::MkfsOptions;
use crate::wal::{Journal, Recovery};
use kura_engine::BlockDevice;
use state::Mounted;
use std::sync::{Arc, Condvar, Mutex};
use striped::{ReadGuard, StripedRwLock, WriteGuard};

/// Why a read-only mount refuses a change (the text of its [`FsError::ReadOnly`]).
const READ_ONLY_MOUNT: &str = "mounted read-only";

/// How many times a commit or an fdatasync that finds the disk lock held lets the state lock go
/// to wait for it, before it waits holding the state lock (which cannot be kept back forever).
const DISK_DEFERRALS: u32 = 4;

/// The most bytes of cached data a read copies in one hold of the shared state lock
/// (`FileSystem::read_cached_in_pieces`): tens of microseconds of copying.
const SHARED_COPY_BYTES: usize = 256 << 10;

/// Tunables of a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountOptions {
    /// Memory the buffer cache may use (bytes); it never holds more.
    pub cache_bytes: u64,
    /// Blocks read ahead of a sequential reader.
    pub readahead_blocks: u32,
    /// Reads and writes of at least this many bytes bypass the cache.
    pub bypass_bytes: usize,
    /// Largest single device command the file system issues.
    pub max_command_bytes: usize,
    /// Commands kept in flight by streaming reads ([`File::read_stream`]).
    pub stream_depth: usize,
    /// A commit whose dirty data is at most this many bytes writes that data into the journal
    /// with the metadata (one sequential write, one flush) instead of to its home blocks.
    pub journal_data_bytes: usize,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            cache_bytes: 64 << 20,
            readahead_blocks: 32,
            bypass_bytes: 256 << 10,
            max_command_bytes: 1 << 20,
            stream_depth: 32,
            journal_data_bytes: 64 << 10,
        }
    }
}

/// What kind of inode a name leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    File,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// How [`FileSystem::rename_with`] treats an existing new name (Linux `renameat2` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RenameMode {
    /// Replace a file or an empty directory there (plain `rename`).
    #[default]
    Replace,
    /// Fail with [`FsError::Exists`] when the new name exists (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap the two names, which must both exist (`RENAME_EXCHANGE`).
    Exchange,
}

/// What [`FileSystem::fallocate`] does with a byte range (Linux `fallocate` modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallocate {
    /// Give every hole in the range zeroed blocks; grow the size to the range's end unless
    /// `keep_size` (`FALLOC_FL_KEEP_SIZE`).
    Allocate { keep_size: bool },
    /// Free the whole blocks inside the range and zero the partial ones; the size stays
    /// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`).
    PunchHole,
}

/// How [`FileSystem::set_xattr`] treats an existing name (`setxattr` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with [`FsError::Exists`] when it exists (`XATTR_CREATE`).
    Create,
    /// Fail with [`FsError::NoAttribute`] when it does not (`XATTR_REPLACE`).
    Replace,
}

/// A new inode for [`FileSystem::make_node`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub file_type: FileType,
    /// Permission bits (incl. setuid, setgid, sticky).
    pub mode: u16,
    /// uid and gid to record; `None` leaves them unrecorded (shown as the mount's owner).
    pub owner: Option<(u32, u32)>,
    /// Device number of a character or block device.
    pub rdev: u64,
    /// A symbolic link's target (1 to 4095 bytes, no NUL).
    pub target: Vec<u8>,
}

impl NodeSpec {
    /// A node of `file_type` with `mode` and nothing else.
    pub fn new(file_type: FileType, mode: u16) -> Self {
        NodeSpec {
            file_type,
            mode,
            owner: None,
            rdev: 0,
            target: Vec::new(),
        }
    }

    /// A symbolic link to `target`.
    pub fn symlink(target: &[u8]) -> Self {
        NodeSpec {
            target: target.to_vec(),
            ..NodeSpec::new(FileType::Symlink, 0o777)
        }
    }
}

/// What `stat` tells about an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub ino: u64,
    pub file_type: FileType,
    pub size: u64,
    /// File-system blocks held (data and extent blocks).
    pub blocks: u64,
    pub block_size: u32,
    pub links: u32,
    pub mode: u16,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    /// Last access as recorded (creation or `utimens`; reads do not update it). Never 0: an
    /// inode that has none shows its mtime.
    pub atime_ns: u64,
    pub generation: u32,
    /// For a directory: the directory holding it (the root is its own parent). For other
    /// kinds, which may have several names, where it was first created.
    pub parent: u64,
    /// uid and gid, when recorded (`chown` or creation through a mount that knows them).
    pub owner: Option<(u32, u32)>,
    /// Device number of a character or block device, else 0.
    pub rdev: u64,
}

impl Metadata {
    pub fn is_symlink(&self) -> bool {
        self.file_type == FileType::Symlink
    }

    pub fn is_dir(&self) -> bool {
        self.file_type == FileType::Directory
    }

    pub fn is_file(&self) -> bool {
        self.file_type == FileType::File
    }

    pub fn len(&self) -> u64 {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryInfo {
    pub name: Vec<u8>,
    pub ino: u64,
    pub file_type: FileType,
}

impl DirEntryInfo {
    /// The name as text (names are bytes; invalid UTF-8 is shown with replacement characters).
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

/// Space, inodes and cache counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    pub block_size: u32,
    pub total_blocks: u64,
    pub free_blocks: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub cache: CacheStats,
    /// Journal transactions committed by this mount.
    pub commits: u64,
    /// Times a commit or an fdatasync found another thread holding the disk lock (its writes
    /// and flush) and waited for it with the state lock released, so other threads went on.
    pub disk_waits: u64,
    /// What recovery did when this mount started.
    pub recovery: Recovery,
}

/// A mounted AccelFS. Clone it to share it between threads.
#[derive(Clone)]
pub struct FileSystem {
    inner: Arc<Shared>,
}

/// What the handles of one mount share: the mounted state behind its lock, and the signal that
/// a group commit's leader finished (see [`FileSystem::group_commit`]).
struct Shared {
    /// The state lock: shared for reads of cached data and `stat` of loaded inodes, exclusive
    /// for everything else. Striped ("# Locks" in `state/mod.rs`): a reader locks only its
    /// thread's stripe, a cache line of its own, so readers on different cores do not bounce
    /// one counter between them; a writer locks every stripe.
    state: StripedRwLock<Mounted>,
    /// Counts finished group commits; waiters sleep on `commit_finished` until it moves. Taken
    /// only while holding the state lock (exclusively) or holding nothing, and never held while
    /// taking another lock.
    commits_finished: Mutex<u64>,
    commit_finished: Condvar,
    /// [`FsStats::disk_waits`].
    disk_waits: std::sync::atomic::AtomicU64,
    /// The mount's disk (also in the state), reachable without the state lock: each exclusive
    /// hold of the state lock first writes the queued write-back of evicted blocks holding only
    /// the disk lock (`state/disk.rs`).
    disk: state::SharedDisk,
    /// The cache's buffers of removed blocks, freed with the state lock let go.
    retired: cache::Retired,
}

impl std::fmt::Debug for FileSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSystem").finish_non_exhaustive()
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Directory => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::Fifo,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
        Kind::File | Kind::Free => FileType::File,
    }
}

fn kind_of(t: FileType) -> Kind {
    match t {
        FileType::File => Kind::File,
        FileType::Directory => Kind::Directory,
        FileType::Symlink => Kind::Symlink,
        FileType::Fifo => Kind::Fifo,
        FileType::Socket => Kind::Socket,
        FileType::CharDevice => Kind::CharDevice,
        FileType::BlockDevice => Kind::BlockDevice,
    }
}

impl FileSystem {
    /// Formats `dev` and mounts the new file system.
    pub fn format(
        dev: Box<dyn BlockDevice>,
        mkfs: MkfsOptions,
        opts: MountOptions,
    ) -> Result<FileSystem, FsError> {
        let mut io = crate::fsdevice::FsDevice::new(dev, mkfs.block_size as usize)?;
        crate::mkfs::mkfs(&mut io, mkfs)?;
        FileSystem::mount(io.into_device(), opts)
    }

    /// Mounts the AccelFS on `dev`, replaying its journal first.
    pub fn mount(dev: Box<dyn BlockDevice>, opts: MountOptions) -> Result<FileSystem, FsError> {
        FileSystem::mount_with(dev, opts, false)
    }

    /// Mounts the AccelFS on `dev` without ever writing to it: for inspection (`fs ls/cat/get/
    /// stat/df`), which must leave an image exactly as it found it. Committed journal
    /// transactions are replayed in memory only — their blocks are served from memory in place
    /// of the stale home copies, at most `(journal length − 2) × block size` bytes (see
    /// [`crate::layout::MAX_JOURNAL_BLOCKS`]) — and nothing is checkpointed. Every call that
    /// would change the file system fails with [`FsError::ReadOnly`]; `sync` and `unmount`
    /// succeed and write nothing, and neither does dropping the last handle. A damaged primary
    /// superblock is not fatal here: the backup is used, since nothing will be written.
    pub fn mount_read_only(
        dev: Box<dyn BlockDevice>,
        opts: MountOptions,
    ) -> Result<FileSystem, FsError> {
        FileSystem::mount_with(dev, opts, true)
    }

    /// Whether this file system was mounted with [`FileSystem::mount_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.read_lock().mounted_read_only()
    }

    fn mount_with(
        dev: Box<dyn BlockDevice>,
        opts: MountOptions,
        read_only: bool,
    ) -> Result<FileSystem, FsError> {
        let (sb, mut io, note) = load_superblock(dev)?;
        if let Some(note) = note.filter(|_| !read_only) {
            return Err(FormatError::BadSuperblock(format!(
                "{note}; run `kura fsck --repair` to restore the primary before mounting"
            ))
            .into());
        }
        if sb.features & !crate::layout::KNOWN_FEATURES != 0 {
            return Err(FormatError::BadSuperblock(format!(
                "unknown feature flags {:#x} (this is AccelFS version {VERSION})",
                sb.features
            ))
            .into());
        }
        let l = sb.layout;
        l.validate()?;
        let area = JournalArea {
            start: l.journal_start,
            len: l.journal_len,
        };
        let (journal, recovery) = if read_only {
            let (journal, recovery, replayed) = Journal::recover_in_memory(&mut io, area)?;
            io.make_read_only(READ_ONLY_MOUNT, replayed);
            (journal, recovery)
        } else {
            Journal::recover(&mut io, area)?
        };
        let blocks = read_bitmap(&mut io, &l, BlockKind::BlockBitmap)?;
        let inodes = read_bitmap(&mut io, &l, BlockKind::InodeBitmap)?;
        let alloc = alloc::Allocator::new(l, blocks, inodes);
        let mounted = Mounted::mount(io, sb, journal, alloc, opts, recovery, read_only)?;
        let disk = mounted.disk();
        let retired = mounted.retired();
        Ok(FileSystem {
            inner: Arc::new(Shared {
                disk,
                retired,
                state: StripedRwLock::new(mounted),
                commits_finished: Mutex::new(0),
                commit_finished: Condvar::new(),
                disk_waits: Default::default(),
            }),
        })
    }

    /// Takes the state lock exclusively, after writing any queued write-back of evicted blocks
    /// with no lock held (the caller holds none: nothing takes the state lock while holding
    /// the disk lock, and this lock is not taken twice).
    fn lock(&self) -> WriteGuard<'_, Mounted> {
        self.drop_retired();
        self.inner.disk.write_back_now();
        self.inner.state.write()
    }

    /// Frees the buffers of blocks the cache dropped in bulk under the state lock (a removed or
    /// truncated file's), now that it is let go: by the thread that removed them, or else by
    /// the next to take the lock.
    fn drop_retired(&self) {
        drop(self.inner.retired.take());
    }

    /// When another thread holds the disk lock (a commit's or an fdatasync's writes and flush)
    /// and `deferrals` is below [`DISK_DEFERRALS`]: lets the state lock go, waits for the disk
    /// lock to be let go, takes the state lock again and says so (`true`), so other threads go
    /// on meanwhile. Otherwise gives the guard back untouched (`false`); the caller then waits
    /// for the disk lock holding the state lock, as the order of the journal needs.
    fn wait_for_busy_disk<'a>(
        &'a self,
        g: WriteGuard<'a, Mounted>,
        deferrals: &mut u32,
    ) -> (WriteGuard<'a, Mounted>, bool) {
        let disk = g.disk();
        if *deferrals >= DISK_DEFERRALS || !disk.busy() {
            return (g, false);
        }
        *deferrals += 1;
        drop(g);
        self.inner
            .disk_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        disk.wait_idle();
        (self.lock(), true)
    }

    /// Takes the state lock shared: for what only looks at the mounted state (`&Mounted`).
    /// Never held while taking the lock exclusively (that would wait for itself).
    fn read_lock(&self) -> ReadGuard<'_, Mounted> {
        self.inner.state.read()
    }

    /// Group commit (format §7): returns once every metadata change made before the call is
    /// durable, with the dirty data of the handle's file (or of every file, without a handle)
    /// and of every file whose size or block map changed (`state/journal.rs`, "what a commit
    /// writes").
    /// The caller needs the running transaction's sequence. When no commit is in flight it
    /// leads one: the transaction is prepared under the state lock, which is released for the
    /// log write and the flush (only the disk lock is held then), so other threads keep
    /// changing the file system meanwhile. A caller arriving while a commit is in flight waits
    /// for it; then one of the waiters leads the next commit, whose single flush serves every
    /// change the waiters made. `handle` is checked first (a file removed while open).
    pub(crate) fn group_commit(&self, handle: Option<(u64, u32)>) -> Result<(), FsError> {
        let mut g = self.lock();
        if let Some((ino, generation)) = handle {
            g.check_handle(ino, generation)?;
        }
        if g.nothing_to_commit() {
            return Ok(());
        }
        g.want_data(handle.map(|(ino, _)| ino));
        let need = g.running_seq();
        let mut deferrals = 0;
        loop {
            if g.durable_seq() >= need {
                return Ok(());
            }
            g.writable()?;
            if g.commit_in_flight() {
                // The commit counter is locked before the state lock is released, and the
                // leader moves it holding the state lock: so its move cannot fall between the
                // check above and the wait (no lost wake-up).
                let finished = self
                    .inner
                    .commits_finished
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                drop(g);
                let seen = *finished;
                let finished = self
                    .inner
                    .commit_finished
                    .wait_while(finished, |n| *n == seen)
                    .unwrap_or_else(|p| p.into_inner());
                drop(finished);
                g = self.lock();
                continue;
            }
            // Another thread's fdatasync (or a streaming read) may hold the disk lock through
            // its writes and flush: wait for it with the state lock released, rather than in
            // `disk.lock()` below holding it.
            let waited;
            (g, waited) = self.wait_for_busy_disk(g, &mut deferrals);
            if waited {
                continue;
            }
            let disk = g.disk();
            let prepared = g.prepare_commit()?;
            g.set_commit_in_flight(true);
            let leader = Leader { fs: self };
            // The disk lock is taken before the state lock is released, so the transaction
            // reaches the log before anything prepared after it (lock order: state, disk).
            let mut d = disk.lock();
            drop(g);
            let written = prepared.write(&mut d);
            drop(d);
            g = self.lock();
            // Finished first: nothing between taking the state lock and this may unwind, or
            // the leader's drop would wait for the lock its own thread holds.
            leader.finish(&mut g);
            g.commit_done(written)?;
        }
    }

    /// A streaming read of file `ino` ([`File::read_stream_owned`]) that holds the state lock
    /// only to plan each window: the window is read holding the disk lock alone, shared, on a
    /// queue of its own (taken before the state lock is released, so no block of it can be
    /// freed and rewritten by another file meanwhile). Each window reads the file as it was
    /// when the window was planned. The state lock is free while `deliver` runs, but the disk
    /// lock is not: `deliver` may use the file system for what the cache serves, not for what
    /// needs the device.
    pub(crate) fn read_stream_file(
        &self,
        ino: u64,
        generation: u32,
        offset: u64,
        len: u64,
        deliver: &mut dyn FnMut(kura_engine::IoBuf, std::ops::Range<usize>),
    ) -> Result<u64, FsError> {
        let mut g = self.lock();
        g.check_handle(ino, generation)?;
        let Some(mut s) = g.stream_begin(ino, offset, len)? else {
            return Ok(0);
        };
        while let Some(pieces) = g.stream_window(&mut s)? {
            let disk = g.disk();
            let mut queue = disk.io();
            drop(g);
            let result = s.read(&mut queue, &pieces, deliver);
            drop(queue);
            g = self.lock();
            result?;
            g.check_handle(ino, generation)?;
        }
        Ok(g.stream_end(&s))
    }

    /// fsync (`data_only`: fdatasync) of inode `ino` by number, for adapters that hold inode
    /// numbers (FUSE): what [`File::sync_all`] (or [`File::sync_data`]) does on a handle of it,
    /// so it writes that file's dirty data and not other files' ([`File::sync_all`]). For a
    /// directory (or any other kind) it commits the running transaction, which holds its
    /// entries. A removed inode is [`FsError::NotFound`].
    pub fn sync_ino(&self, ino: u64, data_only: bool) -> Result<(), FsError> {
        let m = self.metadata_of(ino)?;
        if data_only && m.is_file() {
            self.sync_data_of(ino, m.generation)
        } else {
            self.group_commit(Some((ino, m.generation)))
        }
    }

    /// fdatasync of file `ino`: after an overwrite, its dirty blocks are written home and
    /// flushed with only the disk lock held; when its size or block map changed, a group
    /// commit.
    pub(crate) fn sync_data_of(&self, ino: u64, generation: u32) -> Result<(), FsError> {
        let mut g = self.lock();
        let mut deferrals = 0;
        loop {
            g.check_handle(ino, generation)?;
            if g.nothing_to_commit() {
                return Ok(());
            }
            // As in `group_commit`: wait for a busy disk without holding the state lock.
            let waited;
            (g, waited) = self.wait_for_busy_disk(g, &mut deferrals);
            if !waited {
                break;
            }
        }
        match g.sync_data_plan(ino)? {
            None => {
                drop(g);
                self.group_commit(Some((ino, generation)))
            }
            Some(plan) => {
                let disk = g.disk();
                let mut d = disk.lock();
                drop(g);
                let result = d.write_and_flush(plan.into_ops());
                drop(d);
                if let Err(e) = &result {
                    self.lock().poison(e);
                }
                result
            }
        }
    }

    // ---- path API -----------------------------------------------------------------------

    /// Creates (or truncates) a file and opens it for reading and writing.
    pub fn create(&self, path: &str) -> Result<File, FsError> {
        self.open_with(
            path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
        )
    }

    /// Opens an existing file for reading.
    pub fn open(&self, path: &str) -> Result<File, FsError> {
        self.open_with(path, OpenOptions::new().read(true))
    }

    pub fn open_with(&self, path: &str, o: &OpenOptions) -> Result<File, FsError> {
        let mut g = self.lock();
        let ino = match g.resolve(path) {
            Ok(ino) => {
                if o.create_new {
                    return Err(FsError::Exists(path.to_string()));
                }
                ino
            }
            Err(FsError::NotFound(_)) if o.create || o.create_new => {
                let (parent, name) = g.resolve_parent(path)?;
                g.create_entry(parent, &name, Kind::File, 0o644)?
            }
            Err(e) => return Err(e),
        };
        let inode = g.inode(ino)?;
        match inode.kind {
            Kind::Directory => return Err(FsError::IsADirectory(path.to_string())),
            Kind::File => {}
            // Paths are resolved without following symbolic links; a FIFO, socket or device
            // has no data here (the kernel serves them on a mount).
            _ => {
                return Err(FsError::Invalid(format!(
                    "{path}: not a regular file (paths are not followed through symbolic links)"
                )))
            }
        }
        let generation = inode.generation;
        if o.truncate && (o.write || o.append) && inode.size != 0 {
            g.set_len(ino, 0)?;
        }
        drop(g);
        Ok(File::new(self.clone(), ino, generation, o))
    }

    /// The whole contents of a file. A file too large for memory (sparse files may legally
    /// state up to 2³² − 1 blocks) is an error, not an abort; copy such files with
    /// [`File::allocated_ranges`] and positioned reads.
    pub fn read(&self, path: &str) -> Result<Vec<u8>, FsError> {
        let f = self.open(path)?;
        let len = f.len()?;
        let mut out = Vec::new();
        usize::try_from(len)
            .ok()
            .and_then(|n| out.try_reserve_exact(n).ok().map(|()| n))
            .ok_or_else(|| FsError::Invalid(format!("{path}: {len} bytes do not fit in memory")))?;
        out.resize(len as usize, 0);
        let n = f.read_at(0, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Replaces a file's contents (creating it).
    pub fn write(&self, path: &str, data: &[u8]) -> Result<(), FsError> {
        self.create(path)?.write_at(0, data).map(|_| ())
    }

    pub fn mkdir(&self, path: &str) -> Result<(), FsError> {
        let mut g = self.lock();
        let (parent, name) = g.resolve_parent(path)?;
        g.create_entry(parent, &name, Kind::Directory, 0o755)
            .map_err(|e| match e {
                FsError::Exists(_) => FsError::Exists(path.to_string()),
                e => e,
            })
            .map(|_| ())
    }

    /// Creates a directory and every missing parent.
    pub fn create_dir_all(&self, path: &str) -> Result<(), FsError> {
        let mut at = String::new();
        for c in path::components(path)? {
            at.push('/');
            at.push_str(&String::from_utf8_lossy(c));
            match self.mkdir(&at) {
                Ok(()) => {}
                Err(FsError::Exists(_)) if self.metadata(&at)?.is_dir() => {}
                Err(FsError::Exists(_)) => return Err(FsError::NotADirectory(at)),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn remove_file(&self, path: &str) -> Result<(), FsError> {
        let mut g = self.lock();
        let (parent, name) = g.resolve_parent(path)?;
        let result = g
            .remove_entry(parent, &name, false)
            .map_err(|e| with_path(e, path));
        drop(g);
        self.drop_retired();
        result
    }

    pub fn remove_dir(&self, path: &str) -> Result<(), FsError> {
        let mut g = self.lock();
        let (parent, name) = g.resolve_parent(path)?;
        g.remove_entry(parent, &name, true)
            .map_err(|e| with_path(e, path))
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<(), FsError> {
        self.rename_with(from, to, RenameMode::Replace)
    }

    /// `rename` with `RENAME_NOREPLACE` or `RENAME_EXCHANGE` semantics ([`RenameMode`]).
    pub fn rename_with(&self, from: &str, to: &str, mode: RenameMode) -> Result<(), FsError> {
        let mut g = self.lock();
        let (p1, n1) = g.resolve_parent(from)?;
        let (p2, n2) = g.resolve_parent(to)?;
        g.rename_entry(p1, &n1, p2, &n2, mode)
    }

    /// Creates a symbolic link at `path` pointing at `target` (stored as given, never
    /// followed by this API).
    pub fn symlink(&self, target: &[u8], path: &str) -> Result<(), FsError> {
        self.make_node_at(path, &NodeSpec::symlink(target))
    }

    /// The target of the symbolic link at `path`.
    pub fn read_link(&self, path: &str) -> Result<Vec<u8>, FsError> {
        let ino = self.resolve(path)?;
        self.read_link_ino(ino).map_err(|e| with_path(e, path))
    }

    /// Creates a new name `new` for the file (not directory) at `existing`.
    pub fn hard_link(&self, existing: &str, new: &str) -> Result<(), FsError> {
        let mut g = self.lock();
        let ino = g.resolve(existing)?;
        let (parent, name) = g.resolve_parent(new)?;
        g.link_entry(ino, parent, &name)
            .map_err(|e| match e {
                FsError::Exists(_) => FsError::Exists(new.to_string()),
                e => with_path(e, existing),
            })
            .map(|_| ())
    }

    /// Creates an inode described by `spec` at `path` (a FIFO, socket, device node, symbolic
    /// link, file or directory).
    pub fn make_node_at(&self, path: &str, spec: &NodeSpec) -> Result<(), FsError> {
        let mut g = self.lock();
        let (parent, name) = g.resolve_parent(path)?;
        g.create_node(parent, &name, spec)
            .map_err(|e| match e {
                FsError::Exists(_) => FsError::Exists(path.to_string()),
                e => e,
            })
            .map(|_| ())
    }

    /// Entries of a directory, sorted by name.
    pub fn read_dir(&self, path: &str) -> Result<Vec<DirEntryInfo>, FsError> {
        let ino = self.resolve(path)?;
        self.list(ino).map_err(|e| with_path(e, path))
    }

    pub fn metadata(&self, path: &str) -> Result<Metadata, FsError> {
        let ino = self.resolve(path)?;
        self.metadata_of(ino)
    }

    pub fn exists(&self, path: &str) -> bool {
        self.resolve(path).is_ok()
    }

    /// The inode `path` names: under the shared lock when every directory on the way is in
    /// memory, else under the exclusive lock (which loads them, or gives the error).
    fn resolve(&self, path: &str) -> Result<u64, FsError> {
        if let Some(ino) = self.read_lock().resolve_loaded(path) {
            return Ok(ino);
        }
        self.lock().resolve(path)
    }

    /// Makes every change so far durable, every file's dirty data included (one journal
    /// commit; [`File::sync_all`] writes only its own file's data).
    pub fn sync(&self) -> Result<(), FsError> {
        self.group_commit(None)
    }

    /// [`FsStats::disk_waits`] without the state lock (a test polls it while a thread that
    /// might hold the lock waits).
    #[cfg(test)]
    pub(crate) fn disk_waits(&self) -> u64 {
        self.inner
            .disk_waits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn statfs(&self) -> FsStats {
        let mut stats = self.read_lock().stats();
        stats.disk_waits = self
            .inner
            .disk_waits
            .load(std::sync::atomic::Ordering::Relaxed);
        stats
    }

    /// Commits, checkpoints the journal and closes the file system; other handles then fail.
    pub fn unmount(self) -> Result<(), FsError> {
        self.lock().unmount()
    }

    // ---- inode API (used by the FUSE adapter) ---------------------------------------------

    pub fn metadata_of(&self, ino: u64) -> Result<Metadata, FsError> {
        if let Some(m) = self.read_lock().loaded_metadata(ino) {
            return Ok(m);
        }
        self.lock().metadata(ino)
    }

    /// The entry `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Metadata, FsError> {
        let found = self.read_lock().lookup_loaded(parent, name);
        let e = match found {
            Some(e) => e,
            None => self.lock().lookup(parent, name)?,
        }
        .ok_or_else(|| FsError::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        self.metadata_of(e.ino)
    }

    /// Entries of directory `ino`, sorted by name.
    pub fn list(&self, ino: u64) -> Result<Vec<DirEntryInfo>, FsError> {
        if let Some(entries) = self.read_lock().list_loaded(ino) {
            return Ok(entries);
        }
        self.lock().list(ino)
    }

    /// Creates `name` in directory `parent`.
    pub fn create_in(
        &self,
        parent: u64,
        name: &[u8],
        file_type: FileType,
        mode: u16,
    ) -> Result<Metadata, FsError> {
        self.make_node(parent, name, &NodeSpec::new(file_type, mode))
    }

    /// Removes file (`dir == false`) or empty directory `name` from `parent`.
    pub fn remove_in(&self, parent: u64, name: &[u8], dir: bool) -> Result<(), FsError> {
        self.lock().remove_entry(parent, name, dir)
    }

    pub fn rename_in(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
    ) -> Result<(), FsError> {
        self.rename_in_with(parent, name, new_parent, new_name, RenameMode::Replace)
    }

    /// [`FileSystem::rename_in`] with a [`RenameMode`].
    pub fn rename_in_with(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<(), FsError> {
        self.lock()
            .rename_entry(parent, name, new_parent, new_name, mode)
    }

    /// Creates `name` in directory `parent` as `spec` describes.
    pub fn make_node(
        &self,
        parent: u64,
        name: &[u8],
        spec: &NodeSpec,
    ) -> Result<Metadata, FsError> {
        let ino = self.lock().create_node(parent, name, spec)?;
        self.metadata_of(ino)
    }

    /// Adds the name `new_parent/new_name` for inode `ino` (a hard link; not a directory).
    pub fn link_in(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Metadata, FsError> {
        self.lock().link_entry(ino, new_parent, new_name)?;
        self.metadata_of(ino)
    }

    /// The target of symbolic link `ino`.
    pub fn read_link_ino(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        self.lock().read_link(ino)
    }

    /// Records the owner (`chown`): each of uid and gid that is given replaces the recorded
    /// one; an inode that had none records the other as 0 unless given.
    pub fn set_owner(&self, ino: u64, uid: Option<u32>, gid: Option<u32>) -> Result<(), FsError> {
        self.lock().set_owner(ino, uid, gid)
    }

    /// Sets access and/or modification time in ns since the epoch (`utimens`); ctime becomes
    /// now.
    pub fn set_times(
        &self,
        ino: u64,
        atime_ns: Option<u64>,
        mtime_ns: Option<u64>,
    ) -> Result<(), FsError> {
        self.lock().set_times(ino, atime_ns, mtime_ns)
    }

    /// Preallocates or punches a hole in `len` bytes at `offset` of file `ino` ([`Fallocate`]).
    pub fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        len: u64,
        mode: Fallocate,
    ) -> Result<(), FsError> {
        self.lock().fallocate(ino, offset, len, mode)
    }

    /// The value of extended attribute `name` of inode `ino`.
    pub fn get_xattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>, FsError> {
        self.lock().get_xattr(ino, name)
    }

    /// The names of inode `ino`'s extended attributes, in the order stored.
    pub fn list_xattr(&self, ino: u64) -> Result<Vec<Vec<u8>>, FsError> {
        self.lock().list_xattr(ino)
    }

    /// Sets extended attribute `name` of inode `ino` (format §5 for names and the size cap).
    pub fn set_xattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<(), FsError> {
        self.lock().set_xattr(ino, name, value, mode)
    }

    /// Removes extended attribute `name` of inode `ino`.
    pub fn remove_xattr(&self, ino: u64, name: &[u8]) -> Result<(), FsError> {
        self.lock().remove_xattr(ino, name)
    }

    /// [`File::allocated_ranges`] of file `ino`: its data ranges in bytes, holes left out.
    pub fn allocated_ranges_ino(&self, ino: u64) -> Result<Vec<std::ops::Range<u64>>, FsError> {
        self.lock().allocated_ranges(ino)
    }

    pub fn read_ino(&self, ino: u64, offset: u64, out: &mut [u8]) -> Result<usize, FsError> {
        self.read_file(ino, None, offset, out)
    }

    /// A read of file `ino` (of the handle's `generation`, when given) that waits for the
    /// device without the state lock: blocks missing from the cache are fetched holding only
    /// the disk lock, shared, on a queue of its own, so cached reads, writes and other misses
    /// of other threads go on meanwhile. If the file's data changed while the lock was
    /// released, the read is done again under the lock throughout (so it always ends).
    pub(crate) fn read_file(
        &self,
        ino: u64,
        generation: Option<u32>,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FsError> {
        // Cached data: served under the shared lock, beside other readers.
        if let Some(n) = self.read_cached_in_pieces(ino, generation, offset, out) {
            return Ok(n);
        }
        let mut g = self.lock();
        if let Some(generation) = generation {
            g.check_handle(ino, generation)?;
        }
        g.file_node(ino)?;
        let plan = match g.read_begin(ino, offset, out)? {
            state::ReadStep::Done(n) => return Ok(n),
            state::ReadStep::Fetch(plan) => plan,
        };
        let disk = g.disk();
        drop(g);
        let fetched = plan.read(&mut disk.io(), out)?;
        let mut g = self.lock();
        if let Some(generation) = generation {
            g.check_handle(ino, generation)?;
        }
        g.file_node(ino)?;
        match g.read_finish(&plan, fetched, out)? {
            Some(n) => Ok(n),
            None => g.read_at(ino, offset, out),
        }
    }

    /// A read whose blocks are all cached, copied under the shared state lock a piece of at
    /// most [`SHARED_COPY_BYTES`] at a time, the lock let go between pieces: a table that
    /// LevelDB loads whole (4 MiB) took 4-12 ms to copy here on a loaded 2-core host, and a
    /// thread waiting for the lock exclusively meanwhile (a compaction's write) kept every new
    /// reader waiting behind it (std's lock prefers writers). The read stays atomic: every
    /// change to a file's data moves its data stamp, and a stamp that moved between pieces
    /// sends the read to the exclusive path, which does it again from the start. `None` when
    /// not every block is cached (or the stamp moved).
    fn read_cached_in_pieces(
        &self,
        ino: u64,
        generation: Option<u32>,
        offset: u64,
        out: &mut [u8],
    ) -> Option<usize> {
        let mut done = 0;
        let mut stamp = None;
        loop {
            let piece = (out.len() - done).min(SHARED_COPY_BYTES);
            let g = self.read_lock();
            let now = g.data_version(ino);
            if stamp.is_some_and(|seen| seen != now) {
                return None;
            }
            stamp = Some(now);
            let n = g.read_cached(
                ino,
                generation,
                offset + done as u64,
                &mut out[done..done + piece],
            )?;
            drop(g);
            done += n;
            if n < piece || done == out.len() {
                return Some(done);
            }
        }
    }

    pub fn write_ino(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize, FsError> {
        self.write_file(ino, None, offset, data)
    }

    /// A positioned write of file `ino` (of the handle's `generation`, when given). Small
    /// writes land in the cache under the state lock. A large write's whole blocks go to the
    /// device holding only the disk lock (shared, on a queue of its own), one step
    /// ([`state::WRITE_STEP`]) at a time: each step maps its holes under the state lock, takes
    /// the disk lock, releases the state lock and writes. A step that fills holes takes the
    /// disk lock exclusively, so no reader fetches a newly mapped block (stale device data)
    /// before its data is on the device, whatever the file's size is meanwhile.
    pub(crate) fn write_file(
        &self,
        ino: u64,
        generation: Option<u32>,
        offset: u64,
        data: &[u8],
    ) -> Result<usize, FsError> {
        let mut g = self.lock();
        if let Some(generation) = generation {
            g.check_handle(ino, generation)?;
        }
        if !g.write_is_large(data.len()) {
            return g.write_at(ino, offset, data);
        }
        g.writable()?;
        g.file_node(ino)?;
        let end = g.write_end(ino, offset, data.len())?;
        let mut done = 0;
        while done < data.len() {
            let step = (data.len() - done).min(state::WRITE_STEP);
            g.make_transaction_room()?;
            let (plan, fills_holes) =
                g.write_step_plan(ino, offset + done as u64, &data[done..done + step], true)?;
            done += step;
            if plan.is_empty() {
                continue;
            }
            let disk = g.disk();
            let result = if fills_holes {
                // Newly mapped blocks hold stale device data until this lands: readers, which
                // fetch holding the disk lock shared, wait for it (see `write_step_plan`).
                let mut d = disk.lock();
                drop(g);
                d.dev.batch(plan.into_ops())
            } else {
                let mut queue = disk.io();
                drop(g);
                queue.batch(plan.into_ops())
            };
            g = self.lock();
            result?;
            if let Some(generation) = generation {
                g.check_handle(ino, generation)?;
            }
            g.file_node(ino)?;
        }
        g.write_done(ino, end)?;
        Ok(data.len())
    }

    pub fn set_len_ino(&self, ino: u64, size: u64) -> Result<(), FsError> {
        self.lock().set_len(ino, size)
    }

    /// Changes permission bits and/or the modification time (what `chmod` and `touch` do).
    pub fn set_attr(
        &self,
        ino: u64,
        mode: Option<u16>,
        mtime_ns: Option<u64>,
    ) -> Result<(), FsError> {
        self.lock().set_attr(ino, mode, mtime_ns)
    }

    /// Fails when the handle's file was removed (a handle check under the shared lock when the
    /// inode is loaded).
    pub(crate) fn check_handle(&self, ino: u64, generation: u32) -> Result<(), FsError> {
        if let Some(r) = self.read_lock().check_loaded_handle(ino, generation) {
            return r;
        }
        self.lock().check_handle(ino, generation)
    }

    pub(crate) fn with_handle<T>(
        &self,
        ino: u64,
        generation: u32,
        f: impl FnOnce(&mut Mounted) -> Result<T, FsError>,
    ) -> Result<T, FsError> {
        let mut g = self.lock();
        g.check_handle(ino, generation)?;
        f(&mut g)
    }
}

/// The leader of a group commit: clears the in-flight mark and wakes the waiters when it
/// finishes, or when its thread unwinds (so no waiter sleeps for ever).
struct Leader<'a> {
    fs: &'a FileSystem,
}

impl Leader<'_> {
    /// The caller holds the state lock (exclusively), as `g` shows.
    fn finish(self, g: &mut Mounted) {
        g.set_commit_in_flight(false);
        self.wake();
        std::mem::forget(self);
    }

    fn wake(&self) {
        *self
            .fs
            .inner
            .commits_finished
            .lock()
            .unwrap_or_else(|p| p.into_inner()) += 1;
        self.fs.inner.commit_finished.notify_all();
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut g = self.fs.lock();
        g.set_commit_in_flight(false);
        self.wake();
    }
}

fn with_path(e: FsError, path: &str) -> FsError {
    match e {
        FsError::NotFound(_) => FsError::NotFound(path.to_string()),
        FsError::IsADirectory(_) => FsError::IsADirectory(path.to_string()),
        FsError::NotADirectory(_) => FsError::NotADirectory(path.to_string()),
        FsError::NotEmpty(_) => FsError::NotEmpty(path.to_string()),
        FsError::NotASymlink(_) => FsError::NotASymlink(path.to_string()),
        FsError::NotPermitted(_) => FsError::NotPermitted(path.to_string()),
        e => e,
    }
}

fn read_bitmap(
    io: &mut crate::fsdevice::FsDevice,
    l: &Layout,
    kind: BlockKind,
) -> Result<Bitmap, FsError> {
    let (start, len, bits) = match kind {
        BlockKind::BlockBitmap => (l.block_bitmap_start, l.block_bitmap_len, l.total_blocks),
        _ => (l.inode_bitmap_start, l.inode_bitmap_len, l.inode_count),
    };
    let mut map = Bitmap::new(bits);
    let raw = io.read_many(start, len)?;
    let bs = l.block_size as usize;
    for i in 0..len {
        map.decode_block(
            i,
            &raw[i as usize * bs..(i as usize + 1) * bs],
            kind,
            start + i,
        )?;
    }
    Ok(map)
}
