//! The safe key-value API over Google LevelDB: open a database on AccelFS (a device spec or a
//! mounted file system) or in a host directory, then put / get / delete / write batches / scan
//! ranges / read at a snapshot. The same calls on every store, so they compare one for one.
//!
//! A `Db` is `Send + Sync` (LevelDB synchronises internally); compaction runs on LevelDB's own
//! background thread, calling into AccelFS through the Env bridge. This module has no unsafe code:
//! every raw LevelDB object is an owning handle of [`crate::ffi`].

#![forbid(unsafe_code)]

use crate::error::KvError;
use crate::ffi::{BatchHandle, DbHandle, FsContext, KuraDbOptions, SnapshotHandle};
use kura_accelfs::{FileSystem, MountOptions};
use kura_engine::Registry;
use std::ffi::c_int;
use std::path::PathBuf;

/// A key and its value.
pub type Pair = (Vec<u8>, Vec<u8>);

/// Where a database lives.
#[derive(Debug, Clone)]
pub enum Location {
    /// Directory `path` on the AccelFS of device `spec` (formatted with `kura mkfs`), opened with
    /// the kinds of `registry`; the device is mounted for the life of the `Db`.
    Device {
        spec: String,
        path: String,
        registry: Registry,
    },
    /// Directory `path` on an already mounted AccelFS.
    AccelFs { fs: FileSystem, path: String },
    /// A host directory, through LevelDB's own POSIX Env (plain system calls).
    Dir(PathBuf),
}

/// Tunables (LevelDB's names).
#[derive(Debug, Clone, Copy)]
pub struct DbOptions {
    pub create_if_missing: bool,
    pub error_if_exists: bool,
    /// Verify checksums of everything read and refuse damaged data.
    pub paranoid_checks: bool,
    /// LevelDB's block cache.
    pub block_cache_bytes: usize,
    /// Memtable size before it is written out as a table.
    pub write_buffer_bytes: usize,
    /// Snappy-compress table blocks (Google LevelDB's default).
    pub compression: bool,
    /// Bloom filter bits per key (0: none).
    pub bloom_bits: i32,
    /// AccelFS buffer cache, when this `Db` mounts the device itself.
    pub fs_cache_bytes: u64,
    /// On AccelFS: table files that keep being read are held whole in memory, up to this many
    /// bytes in all, and read with no file-system call (what LevelDB's POSIX Env gets from mmap,
    /// but bounded). 0 turns it off.
    pub resident_table_bytes: usize,
}

impl Default for DbOptions {
    fn default() -> Self {
        DbOptions {
            create_if_missing: true,
            error_if_exists: false,
            paranoid_checks: true,
            block_cache_bytes: 8 << 20,
            write_buffer_bytes: 4 << 20,
            compression: true,
            bloom_bits: 10,
            fs_cache_bytes: 32 << 20,
            resident_table_bytes: 64 << 20,
        }
    }
}

/// Changes applied atomically by [`Db::write`].
pub struct WriteBatch {
    /// The batch, or why the bridge could not make one (C++ out of memory, or a build without
    /// LevelDB), which [`Db::write`] reports.
    batch: Result<BatchHandle, KvError>,
}

impl Default for WriteBatch {
    fn default() -> Self {
        WriteBatch::new()
    }
}

impl WriteBatch {
    /// A batch that could not be made (out of memory in C++) takes changes as no-ops and its
    /// [`Db::write`] fails with the reason.
    pub fn new() -> Self {
        WriteBatch {
            batch: BatchHandle::new(),
        }
    }

    /// A failure here (C++ out of memory) is kept in the batch and reported by [`Db::write`],
    /// which then applies none of it.
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        if let Ok(b) = &mut self.batch {
            b.put(key, value);
        }
    }

    /// Failures are reported as for [`WriteBatch::put`].
    pub fn delete(&mut self, key: &[u8]) {
        if let Ok(b) = &mut self.batch {
            b.delete(key);
        }
    }
}

/// The file system a `Db` mounted itself, unmounted when the `Db` closes (or is dropped).
struct Mounted(Option<FileSystem>);

impl Mounted {
    fn unmount(mut self) -> Result<(), KvError> {
        match self.0.take() {
            Some(fs) => Ok(fs.unmount()?),
            None => Ok(()),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(fs) = self.0.take() {
            let _ = fs.unmount();
        }
    }
}

/// An open database.
pub struct Db {
    /// Declared first so it is dropped first: the database closes (and its storage context
    /// goes) before the file system under it is unmounted.
    handle: DbHandle,
    mounted: Mounted,
}

/// A consistent view of the database at one moment; released when dropped.
pub struct Snapshot<'a> {
    handle: SnapshotHandle<'a>,
}

impl Db {
    pub fn open(store: Location, opts: &DbOptions) -> Result<Db, KvError> {
        if cfg!(kura_no_leveldb) {
            return Err(KvError::no_leveldb());
        }
        let (name, ctx, mounted) = match store {
            Location::Device {
                spec,
                path,
                registry,
            } => {
                let dev = registry
                    .open(&spec)
                    .map_err(|e| KvError::Invalid(format!("opening {spec}: {e}")))?;
                let fs = FileSystem::mount(
                    dev,
                    MountOptions {
                        cache_bytes: opts.fs_cache_bytes,
                        ..MountOptions::default()
                    },
                )?;
                (
                    path,
                    Some(Box::new(FsContext::new(fs.clone()))),
                    Mounted(Some(fs)),
                )
            }
            Location::AccelFs { fs, path } => {
                (path, Some(Box::new(FsContext::new(fs))), Mounted(None))
            }
            Location::Dir(dir) => {
                let name = dir
                    .to_str()
                    .ok_or_else(|| KvError::Invalid(format!("{} is not UTF-8", dir.display())))?
                    .to_string();
                (name, None, Mounted(None))
            }
        };
        let o = KuraDbOptions {
            create_if_missing: c_int::from(opts.create_if_missing),
            error_if_exists: c_int::from(opts.error_if_exists),
            paranoid_checks: c_int::from(opts.paranoid_checks),
            compression: c_int::from(opts.compression),
            block_cache_bytes: opts.block_cache_bytes,
            write_buffer_bytes: opts.write_buffer_bytes,
            bloom_bits: opts.bloom_bits,
            max_open_files: 0,
            resident_table_bytes: opts.resident_table_bytes,
        };
        // On failure `mounted` is dropped, which unmounts what this call mounted.
        let handle = DbHandle::open(ctx, &name, &o)?;
        Ok(Db { handle, mounted })
    }

    /// The AccelFS under this database, if any.
    pub fn file_system(&self) -> Option<&FileSystem> {
        self.handle.fs()
    }

    /// Stores `value` under `key` (durable at the next synced write, or at close).
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        self.handle.put(key, value, false)
    }

    /// Stores `value` under `key` and makes it durable before returning.
    pub fn put_sync(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        self.handle.put(key, value, true)
    }

    pub fn delete(&self, key: &[u8]) -> Result<(), KvError> {
        self.handle.delete(key)
    }

    /// Applies every change of `batch` atomically; with `sync`, durably before returning.
    pub fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), KvError> {
        let mut batch = batch.batch?;
        self.handle.write(&mut batch, sync)
    }

    /// The value of `key`. A damaged table is an error, never "absent".
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.handle.get(None, key)
    }

    /// Fails only when the C++ side cannot take one (out of memory); never hands out a null
    /// snapshot, which LevelDB would read as "the latest state".
    pub fn snapshot(&self) -> Result<Snapshot<'_>, KvError> {
        Ok(Snapshot {
            handle: self.handle.snapshot()?,
        })
    }

    /// The value of `key` as of `snapshot` (which must be one of this database's).
    pub fn get_at(&self, snapshot: &Snapshot<'_>, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.handle.get(Some(&snapshot.handle), key)
    }

    fn scan_in(
        &self,
        snap: Option<&SnapshotHandle<'_>>,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Pair>, KvError> {
        let mut out = Vec::new();
        let mut it = self.handle.iter(snap)?;
        it.seek(from);
        while out.len() < limit {
            let Some((key, value)) = it.current() else {
                break;
            };
            if to.is_some_and(|to| key >= to) {
                break;
            }
            out.push((key.to_vec(), value.to_vec()));
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// Up to `limit` pairs with `from <= key` (and `key < to` when given), in key order.
    pub fn scan(&self, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<Vec<Pair>, KvError> {
        self.scan_in(None, from, to, limit)
    }

    /// Like [`Db::scan`], as of `snapshot` (which must be one of this database's).
    pub fn scan_at(
        &self,
        snapshot: &Snapshot<'_>,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Pair>, KvError> {
        self.scan_in(Some(&snapshot.handle), from, to, limit)
    }

    /// Every pair, in key order.
    pub fn scan_all(&self) -> Result<Vec<Pair>, KvError> {
        self.scan(&[], None, usize::MAX)
    }

    /// Compacts the whole key range. (LevelDB's CompactRange reports nothing itself; this
    /// fails only when the C++ side threw.)
    pub fn compact(&self) -> Result<(), KvError> {
        self.handle.compact()
    }

    /// A LevelDB property, e.g. `leveldb.stats` or `leveldb.approximate-memory-usage`;
    /// `Ok(None)` when LevelDB does not know the name.
    pub fn property(&self, name: &str) -> Result<Option<String>, KvError> {
        self.handle.property(name)
    }

    /// Closes the database (LevelDB finishes background work first) and unmounts the file
    /// system if this `Db` mounted it.
    pub fn close(self) -> Result<(), KvError> {
        let Db { handle, mounted } = self;
        drop(handle);
        mounted.unmount()
    }
}
