//! The safe key-value API over Google LevelDB: open a database on AccelFS (a device spec or a
//! mounted file system) or in a host directory, then put / get / delete / write batches / scan
//! ranges / read at a snapshot. The same calls on every store, so they compare one for one.
//!
//! A `Db` is `Send + Sync` (LevelDB synchronises internally); compaction runs on LevelDB's own
//! background thread, calling into AccelFS through the Env bridge.

// Built without LevelDB (cfg kura_no_leveldb), the bridge calls that write the out-parameters
// (`err`, `val`, `len`, ...) are compiled out, so those locals are never mutated.
#![cfg_attr(kura_no_leveldb, allow(unused_mut))]

use crate::error::KvError;
use crate::ffi::{self, FsContext, KuraDbOptions};
use kura_accelfs::{FileSystem, MountOptions};
use kura_engine::Registry;
use std::ffi::{c_char, c_int, c_void, CString};
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
    /// Null when the bridge could not make the batch; `alloc_error` then says why and
    /// [`Db::write`] reports it.
    raw: *mut c_void,
    alloc_error: Option<String>,
}

// SAFETY: a leveldb::WriteBatch is plain owned data; moving it between threads is fine.
unsafe impl Send for WriteBatch {}

impl Default for WriteBatch {
    fn default() -> Self {
        WriteBatch::new()
    }
}

impl WriteBatch {
    /// A batch that could not be made (out of memory in C++) takes changes as no-ops and its
    /// [`Db::write`] fails with the reason.
    pub fn new() -> Self {
        let mut err: *mut c_char = std::ptr::null_mut();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: returns a fresh heap object owned by this WriteBatch, or null with err set.
        let raw = unsafe { ffi::kura_batch_new(&mut err) };
        #[cfg(kura_no_leveldb)]
        let raw: *mut c_void = std::ptr::null_mut();
        let alloc_error = raw.is_null().then(|| take_error(err));
        WriteBatch { raw, alloc_error }
    }

    /// A failure here (C++ out of memory) is kept in the batch and reported by [`Db::write`],
    /// which then applies none of it.
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        if self.raw.is_null() {
            return;
        }
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: raw is a live batch; the slices are valid for the call (LevelDB copies them).
        unsafe {
            ffi::kura_batch_put(
                self.raw,
                key.as_ptr() as *const c_char,
                key.len(),
                value.as_ptr() as *const c_char,
                value.len(),
            )
        };
        #[cfg(kura_no_leveldb)]
        let _ = (key, value);
    }

    /// Failures are reported as for [`WriteBatch::put`].
    pub fn delete(&mut self, key: &[u8]) {
        if self.raw.is_null() {
            return;
        }
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: as in `put`.
        unsafe {
            ffi::kura_batch_delete(self.raw, key.as_ptr() as *const c_char, key.len())
        };
        #[cfg(kura_no_leveldb)]
        let _ = key;
    }
}

impl Drop for WriteBatch {
    fn drop(&mut self) {
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: raw came from kura_batch_new (or is null, which the bridge ignores) and is
        // freed once.
        unsafe {
            ffi::kura_batch_free(self.raw)
        };
    }
}

/// An open database.
pub struct Db {
    raw: *mut c_void,
    /// The storage callbacks' context; LevelDB's Env points at it, so it outlives `raw`.
    ctx: Option<Box<FsContext>>,
    /// The file system this `Db` mounted (unmounted at close).
    mounted: Option<FileSystem>,
}

// SAFETY: leveldb::DB is thread-safe for all the calls made here (documented by LevelDB); the
// context is Sync (FileSystem and a Mutex).
unsafe impl Send for Db {}
// SAFETY: as above.
unsafe impl Sync for Db {}

/// A consistent view of the database at one moment; released when dropped.
pub struct Snapshot<'a> {
    db: &'a Db,
    raw: *const c_void,
}

fn take_error(err: *mut c_char) -> String {
    if err.is_null() {
        return "unknown error".into();
    }
    // SAFETY: the bridge returns a malloc'd NUL-terminated string; we copy then free it.
    let msg = unsafe { std::ffi::CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    #[cfg(not(kura_no_leveldb))]
    // SAFETY: allocated with malloc by the bridge.
    unsafe {
        ffi::kura_free(err as *mut c_void)
    };
    msg
}

/// Prefixes the bridge gives messages about C++ exceptions it caught (`kOutOfMemory`,
/// `kCppException` in `cpp/kura_leveldb.cc`); they may sit inside a LevelDB status message
/// ("IO error: ...") when an Env method caught them.
const BRIDGE_OOM: &str = "kura-bridge: out of memory";
const BRIDGE_EXCEPTION: &str = "kura-bridge: C++ exception";

fn classify(msg: String) -> KvError {
    if msg.contains(BRIDGE_OOM) {
        KvError::OutOfMemory(msg)
    } else if msg.contains(BRIDGE_EXCEPTION) {
        KvError::CppException(msg)
    } else if msg.starts_with("Corruption") {
        KvError::Corruption(msg)
    } else if msg.contains("does not exist") || msg.starts_with("NotFound") {
        KvError::NotFound(msg)
    } else if msg.contains("lock ") && msg.contains("already held") {
        KvError::Locked(msg)
    } else if msg.contains("no space left") {
        KvError::NoSpace(msg)
    } else if msg.starts_with("Invalid argument") {
        KvError::Invalid(msg)
    } else {
        KvError::Io(msg)
    }
}

impl Db {
    pub fn open(store: Location, opts: &DbOptions) -> Result<Db, KvError> {
        if cfg!(kura_no_leveldb) {
            return Err(KvError::Unavailable(
                "kura-kv was built without Google LevelDB: install libleveldb-dev and rebuild"
                    .into(),
            ));
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
                (path, Some(Box::new(FsContext::new(fs.clone()))), Some(fs))
            }
            Location::AccelFs { fs, path } => (path, Some(Box::new(FsContext::new(fs))), None),
            Location::Dir(dir) => {
                let name = dir
                    .to_str()
                    .ok_or_else(|| KvError::Invalid(format!("{} is not UTF-8", dir.display())))?
                    .to_string();
                (name, None, None)
            }
        };
        let cname = CString::new(name.clone())
            .map_err(|_| KvError::Invalid(format!("{name:?} contains a NUL byte")))?;
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
        let table = ctx.as_deref().map(ffi::ops_for);
        let mut err: *mut c_char = std::ptr::null_mut();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: the table (copied by the bridge) points at `ctx`, which the Db keeps alive
        // until after kura_db_close; strings and options live across the call.
        let raw = unsafe {
            ffi::kura_db_open(
                table
                    .as_ref()
                    .map_or(std::ptr::null(), |t| t as *const ffi::KuraFsOps),
                cname.as_ptr(),
                &o,
                &mut err,
            )
        };
        #[cfg(kura_no_leveldb)]
        let raw: *mut c_void = {
            let _ = (&table, &o, &cname);
            std::ptr::null_mut()
        };
        if raw.is_null() {
            let e = classify(take_error(err));
            if let Some(fs) = mounted {
                let _ = fs.unmount();
            }
            return Err(e);
        }
        Ok(Db { raw, ctx, mounted })
    }

    /// The AccelFS under this database, if any.
    pub fn file_system(&self) -> Option<&FileSystem> {
        self.ctx.as_deref().map(FsContext::fs)
    }

    fn check(rc: c_int, err: *mut c_char) -> Result<(), KvError> {
        if rc == 0 {
            Ok(())
        } else {
            Err(classify(take_error(err)))
        }
    }

    /// Stores `value` under `key` (durable at the next synced write, or at close).
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        self.put_with(key, value, false)
    }

    /// Stores `value` under `key` and makes it durable before returning.
    pub fn put_sync(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        self.put_with(key, value, true)
    }

    fn put_with(&self, key: &[u8], value: &[u8], sync: bool) -> Result<(), KvError> {
        let mut err = std::ptr::null_mut();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: raw is a live DB; the slices are valid for the call (LevelDB copies them).
        let rc = unsafe {
            ffi::kura_db_put(
                self.raw,
                key.as_ptr() as *const c_char,
                key.len(),
                value.as_ptr() as *const c_char,
                value.len(),
                c_int::from(sync),
                &mut err,
            )
        };
        #[cfg(kura_no_leveldb)]
        let rc = {
            let _ = (key, value, sync);
            1
        };
        Self::check(rc, err)
    }

    pub fn delete(&self, key: &[u8]) -> Result<(), KvError> {
        let mut err = std::ptr::null_mut();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: as in `put_with`.
        let rc = unsafe {
            ffi::kura_db_delete(
                self.raw,
                key.as_ptr() as *const c_char,
                key.len(),
                0,
                &mut err,
            )
        };
        #[cfg(kura_no_leveldb)]
        let rc = {
            let _ = key;
            1
        };
        Self::check(rc, err)
    }

    /// Applies every change of `batch` atomically; with `sync`, durably before returning.
    pub fn write(&self, mut batch: WriteBatch, sync: bool) -> Result<(), KvError> {
        if let Some(msg) = batch.alloc_error.take() {
            return Err(classify(msg));
        }
        let mut err = std::ptr::null_mut();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: both objects are live; the batch is freed by its Drop afterwards.
        let rc = unsafe { ffi::kura_db_write(self.raw, batch.raw, c_int::from(sync), &mut err) };
        #[cfg(kura_no_leveldb)]
        let rc = {
            let _ = (&batch, sync);
            1
        };
        drop(batch);
        Self::check(rc, err)
    }

    fn get_raw(&self, snap: *const c_void, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let mut err = std::ptr::null_mut();
        let mut val: *mut c_char = std::ptr::null_mut();
        let mut len = 0usize;
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: raw is live; snap is null or a live snapshot of this DB; out-pointers are ours.
        let rc = unsafe {
            ffi::kura_db_get(
                self.raw,
                snap,
                key.as_ptr() as *const c_char,
                key.len(),
                &mut val,
                &mut len,
                &mut err,
            )
        };
        #[cfg(kura_no_leveldb)]
        let rc = {
            let _ = (snap, key);
            -1
        };
        match rc {
            0 => Ok(None),
            1 => {
                // SAFETY: the bridge malloc'd `len` bytes at `val`; copied, then freed.
                let v = unsafe { std::slice::from_raw_parts(val as *const u8, len) }.to_vec();
                #[cfg(not(kura_no_leveldb))]
                // SAFETY: malloc'd by the bridge.
                unsafe {
                    ffi::kura_free(val as *mut c_void)
                };
                Ok(Some(v))
            }
            _ => Err(classify(take_error(err))),
        }
    }

    /// The value of `key`. A damaged table is an error, never "absent".
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.get_raw(std::ptr::null(), key)
    }

    /// Fails only when the C++ side cannot take one (out of memory); never hands out a null
    /// snapshot, which LevelDB would read as "the latest state".
    pub fn snapshot(&self) -> Result<Snapshot<'_>, KvError> {
        let mut err = std::ptr::null_mut();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: raw is live; the snapshot is released by Snapshot's Drop, before the Db goes.
        let raw = unsafe { ffi::kura_db_snapshot(self.raw, &mut err) };
        #[cfg(kura_no_leveldb)]
        let raw: *const c_void = std::ptr::null();
        if raw.is_null() {
            return Err(classify(take_error(err)));
        }
        Ok(Snapshot { db: self, raw })
    }

    /// The value of `key` as of `snapshot`.
    pub fn get_at(&self, snapshot: &Snapshot<'_>, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.get_raw(snapshot.raw, key)
    }

    fn scan_raw(
        &self,
        snap: *const c_void,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Pair>, KvError> {
        let mut out = Vec::new();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: the iterator is created, used and freed within this block, while the DB and
        // snapshot are live; key/value slices are copied before the iterator moves. A failed
        // call makes the iterator invalid (key/value null), and its status says why.
        unsafe {
            let mut err = std::ptr::null_mut();
            let it = ffi::kura_db_iter(self.raw, snap, &mut err);
            if it.is_null() {
                return Err(classify(take_error(err)));
            }
            ffi::kura_iter_seek(it, from.as_ptr() as *const c_char, from.len());
            while out.len() < limit && ffi::kura_iter_valid(it) == 1 {
                let (mut kl, mut vl) = (0usize, 0usize);
                let k = ffi::kura_iter_key(it, &mut kl);
                let v = ffi::kura_iter_value(it, &mut vl);
                if k.is_null() || v.is_null() {
                    break;
                }
                let key = std::slice::from_raw_parts(k as *const u8, kl);
                if to.is_some_and(|to| key >= to) {
                    break;
                }
                out.push((
                    key.to_vec(),
                    std::slice::from_raw_parts(v as *const u8, vl).to_vec(),
                ));
                ffi::kura_iter_next(it);
            }
            let bad = ffi::kura_iter_status(it, &mut err);
            ffi::kura_iter_free(it);
            if bad != 0 {
                return Err(classify(take_error(err)));
            }
        }
        #[cfg(kura_no_leveldb)]
        let _ = (snap, from, to, limit);
        Ok(out)
    }

    /// Up to `limit` pairs with `from <= key` (and `key < to` when given), in key order.
    pub fn scan(&self, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<Vec<Pair>, KvError> {
        self.scan_raw(std::ptr::null(), from, to, limit)
    }

    /// Like [`Db::scan`], as of `snapshot`.
    pub fn scan_at(
        &self,
        snapshot: &Snapshot<'_>,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Pair>, KvError> {
        self.scan_raw(snapshot.raw, from, to, limit)
    }

    /// Every pair, in key order.
    pub fn scan_all(&self) -> Result<Vec<Pair>, KvError> {
        self.scan(&[], None, usize::MAX)
    }

    /// Compacts the whole key range. (LevelDB's CompactRange reports nothing itself; this
    /// fails only when the C++ side threw.)
    pub fn compact(&self) -> Result<(), KvError> {
        let mut err: *mut c_char = std::ptr::null_mut();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: raw is live; err is ours.
        let rc = unsafe { ffi::kura_db_compact(self.raw, &mut err) };
        #[cfg(kura_no_leveldb)]
        let rc = 1;
        Self::check(rc, err)
    }

    /// A LevelDB property, e.g. `leveldb.stats` or `leveldb.approximate-memory-usage`;
    /// `Ok(None)` when LevelDB does not know the name.
    pub fn property(&self, name: &str) -> Result<Option<String>, KvError> {
        let cname = CString::new(name)
            .map_err(|_| KvError::Invalid(format!("{name:?} contains a NUL byte")))?;
        let mut err: *mut c_char = std::ptr::null_mut();
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: raw is live; the result is malloc'd (or null) and freed by take_error.
        let p = unsafe { ffi::kura_db_property(self.raw, cname.as_ptr(), &mut err) };
        #[cfg(kura_no_leveldb)]
        let p: *mut c_char = {
            let _ = cname;
            std::ptr::null_mut()
        };
        if !p.is_null() {
            Ok(Some(take_error(p)))
        } else if !err.is_null() {
            Err(classify(take_error(err)))
        } else {
            Ok(None)
        }
    }

    /// Closes the database (LevelDB finishes background work first) and unmounts the file
    /// system if this `Db` mounted it.
    pub fn close(mut self) -> Result<(), KvError> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> Result<(), KvError> {
        if !self.raw.is_null() {
            #[cfg(not(kura_no_leveldb))]
            // SAFETY: raw is live and closed exactly once; the context is dropped after.
            unsafe {
                ffi::kura_db_close(self.raw)
            };
            self.raw = std::ptr::null_mut();
        }
        self.ctx = None;
        if let Some(fs) = self.mounted.take() {
            fs.unmount()?;
        }
        Ok(())
    }
}

impl Drop for Snapshot<'_> {
    fn drop(&mut self) {
        #[cfg(not(kura_no_leveldb))]
        // SAFETY: the snapshot belongs to this live DB (the borrow keeps the Db alive).
        unsafe {
            ffi::kura_db_release_snapshot(self.db.raw, self.raw)
        };
        #[cfg(kura_no_leveldb)]
        let _ = self.db;
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}
