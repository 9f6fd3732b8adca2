//! The boundary with the C++ bridge (`cpp/kura_leveldb.cc`), and the crate's only unsafe code:
//! declarations of its C ABI; owning handles over the raw LevelDB objects it hands out
//! ([`DbHandle`], [`BatchHandle`], [`SnapshotHandle`], [`IterHandle`]), each freed by its `Drop`,
//! whose safe methods turn the bridge's error strings into [`KvError`]s; and the storage callbacks
//! it calls for every file LevelDB touches, implemented on a mounted AccelFS.
//!
//! LevelDB calls the callbacks from its own threads (background compaction) as well as the
//! caller's; the context is `Sync` (the file system is, and open files sit behind a mutex). No
//! panic may unwind into C++, so each callback runs under `catch_unwind` and reports failure as
//! an errno, keeping the message for `last_error`. In the other direction the bridge lets no C++
//! exception out of any function declared here (nor out of the `push` callback it hands
//! `list`): each becomes an error string, see the top of `cpp/kura_leveldb.cc`.

use crate::error::KvError;
use kura_accelfs::{File, FileSystem, FsError, OpenOptions};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Mirrors `struct KuraFsOps` in the C++ file.
#[repr(C)]
pub(crate) struct KuraFsOps {
    pub ctx: *mut c_void,
    pub open: extern "C" fn(*mut c_void, *const c_char, c_int, *mut u64) -> c_int,
    pub read_at: extern "C" fn(*mut c_void, u64, u64, *mut c_char, usize, *mut usize) -> c_int,
    pub append: extern "C" fn(*mut c_void, u64, *const c_char, usize) -> c_int,
    pub sync: extern "C" fn(*mut c_void, u64) -> c_int,
    pub close: extern "C" fn(*mut c_void, u64) -> c_int,
    pub exists: extern "C" fn(*mut c_void, *const c_char) -> c_int,
    pub list: extern "C" fn(
        *mut c_void,
        *const c_char,
        *mut c_void,
        extern "C" fn(*mut c_void, *const c_char, usize) -> c_int,
    ) -> c_int,
    pub remove: extern "C" fn(*mut c_void, *const c_char) -> c_int,
    pub mkdir: extern "C" fn(*mut c_void, *const c_char) -> c_int,
    pub rmdir: extern "C" fn(*mut c_void, *const c_char) -> c_int,
    pub size: extern "C" fn(*mut c_void, *const c_char, *mut u64) -> c_int,
    pub rename: extern "C" fn(*mut c_void, *const c_char, *const c_char) -> c_int,
    pub last_error: extern "C" fn(*mut c_void, *mut c_char, usize) -> usize,
}

/// Mirrors `struct KuraDbOptions`.
#[repr(C)]
pub(crate) struct KuraDbOptions {
    pub create_if_missing: c_int,
    pub error_if_exists: c_int,
    pub paranoid_checks: c_int,
    pub compression: c_int,
    pub block_cache_bytes: usize,
    pub write_buffer_bytes: usize,
    pub bloom_bits: c_int,
    pub max_open_files: c_int,
    pub resident_table_bytes: usize,
}

/// Declares the bridge's C ABI. Built with LevelDB these are the functions of
/// `cpp/kura_leveldb.cc`; built without it (cfg `kura_no_leveldb`) each is a stand-in with the
/// same signature that touches none of its arguments and returns its failure value (null, or a
/// non-zero status), so the handles below compile alike in both builds. The handles never reach a
/// stand-in: their constructors fail first with [`KvError::Unavailable`], so no handle exists.
/// (The stand-ins are `unsafe fn` only so that callers read the same in both builds; they have no
/// safety requirements of their own.)
macro_rules! bridge {
    ($( $(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $absent:expr; )*) => {
        #[cfg(not(kura_no_leveldb))]
        extern "C" {
            $( $(#[$m])* fn $name($($arg: $ty),*) $(-> $ret)?; )*
        }
        $(
            $(#[$m])*
            #[cfg(kura_no_leveldb)]
            #[allow(unused_variables)]
            unsafe fn $name($($arg: $ty),*) $(-> $ret)? { $absent }
        )*
    };
}

bridge! {
    fn kura_free(p: *mut c_void) = ();
    fn kura_db_open(
        ops: *const KuraFsOps,
        name: *const c_char,
        o: *const KuraDbOptions,
        err: *mut *mut c_char,
    ) -> *mut c_void = ptr::null_mut();
    fn kura_db_close(db: *mut c_void) = ();
    fn kura_db_put(
        db: *mut c_void,
        k: *const c_char,
        kl: usize,
        v: *const c_char,
        vl: usize,
        sync: c_int,
        err: *mut *mut c_char,
    ) -> c_int = 1;
    fn kura_db_delete(
        db: *mut c_void,
        k: *const c_char,
        kl: usize,
        sync: c_int,
        err: *mut *mut c_char,
    ) -> c_int = 1;
    fn kura_db_get(
        db: *mut c_void,
        snap: *const c_void,
        k: *const c_char,
        kl: usize,
        val: *mut *mut c_char,
        vl: *mut usize,
        err: *mut *mut c_char,
    ) -> c_int = -1;
    fn kura_batch_new(err: *mut *mut c_char) -> *mut c_void = ptr::null_mut();
    fn kura_batch_free(b: *mut c_void) = ();
    fn kura_batch_put(b: *mut c_void, k: *const c_char, kl: usize, v: *const c_char, vl: usize) = ();
    fn kura_batch_delete(b: *mut c_void, k: *const c_char, kl: usize) = ();
    fn kura_db_write(db: *mut c_void, b: *mut c_void, sync: c_int, err: *mut *mut c_char) -> c_int = 1;
    fn kura_db_snapshot(db: *mut c_void, err: *mut *mut c_char) -> *const c_void = ptr::null();
    fn kura_db_release_snapshot(db: *mut c_void, s: *const c_void) = ();
    fn kura_db_iter(db: *mut c_void, snap: *const c_void, err: *mut *mut c_char) -> *mut c_void = ptr::null_mut();
    fn kura_iter_free(it: *mut c_void) = ();
    fn kura_iter_seek(it: *mut c_void, k: *const c_char, kl: usize) = ();
    fn kura_iter_valid(it: *mut c_void) -> c_int = 0;
    fn kura_iter_next(it: *mut c_void) = ();
    fn kura_iter_key(it: *mut c_void, len: *mut usize) -> *const c_char = ptr::null();
    fn kura_iter_value(it: *mut c_void, len: *mut usize) -> *const c_char = ptr::null();
    fn kura_iter_status(it: *mut c_void, err: *mut *mut c_char) -> c_int = 1;
    fn kura_db_compact(db: *mut c_void, err: *mut *mut c_char) -> c_int = 1;
    fn kura_db_property(db: *mut c_void, name: *const c_char, err: *mut *mut c_char) -> *mut c_char = ptr::null_mut();
    #[cfg(feature = "test-hooks")]
    fn kura_test_throw(site: c_int, kind: c_int) = ();
}

/// Arms one injected C++ throw at the next `site` on this thread (see `crate::test_hooks`).
#[cfg(feature = "test-hooks")]
pub(crate) fn test_throw(site: c_int, kind: c_int) {
    // SAFETY: sets two thread-locals in the bridge; no pointers involved.
    unsafe { kura_test_throw(site, kind) };
}

/// Copies a malloc'd NUL-terminated string from the bridge and frees it; `None` for null.
fn take_string(p: *mut c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the bridge hands out malloc'd NUL-terminated strings (error messages, property
    // values); we copy it, then free it exactly once, with the bridge's free.
    let msg = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    // SAFETY: as above; `p` is not used again.
    unsafe { kura_free(p as *mut c_void) };
    Some(msg)
}

/// The typed error for the message the bridge left in an `err` out-parameter.
fn bridge_error(err: *mut c_char) -> KvError {
    match take_string(err) {
        Some(msg) => KvError::from_bridge(msg),
        None if cfg!(kura_no_leveldb) => KvError::no_leveldb(),
        None => KvError::from_bridge("unknown error".into()),
    }
}

/// `Ok` for status 0, else the bridge's error.
fn check(rc: c_int, err: *mut c_char) -> Result<(), KvError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(bridge_error(err))
    }
}

fn c_bytes(b: &[u8]) -> *const c_char {
    b.as_ptr() as *const c_char
}

/// An open `leveldb::DB` (the bridge's `kura_db`), closed on drop, with the storage context its
/// Env calls into (dropped after the database is closed).
pub(crate) struct DbHandle {
    raw: NonNull<c_void>,
    /// Field order matters only in that `Drop` closes `raw` first; the context is dropped after.
    ctx: Option<Box<FsContext>>,
}

// SAFETY: leveldb::DB is thread-safe for every call made through DbHandle (documented by
// LevelDB: a DB may be shared by threads without external synchronisation); the context is Sync
// (FileSystem, a Mutex and an atomic).
unsafe impl Send for DbHandle {}
// SAFETY: as above.
unsafe impl Sync for DbHandle {}

impl DbHandle {
    /// Opens database `name`: on the AccelFS of `ctx` through the bridge's Env, or with
    /// LevelDB's POSIX Env when `ctx` is `None`. The handle owns `ctx` from here on.
    pub(crate) fn open(
        ctx: Option<Box<FsContext>>,
        name: &str,
        opts: &KuraDbOptions,
    ) -> Result<DbHandle, KvError> {
        if cfg!(kura_no_leveldb) {
            return Err(KvError::no_leveldb());
        }
        let cname = CString::new(name)
            .map_err(|_| KvError::Invalid(format!("{name:?} contains a NUL byte")))?;
        let table = ctx.as_deref().map(ops_for);
        let mut err = ptr::null_mut();
        // SAFETY: the bridge copies the table, which points at the boxed context; the box does
        // not move and is owned by the returned handle, whose Drop closes the database before
        // dropping it. The name and options live across the call; err is ours.
        let raw = unsafe {
            kura_db_open(
                table
                    .as_ref()
                    .map_or(ptr::null(), |t| t as *const KuraFsOps),
                cname.as_ptr(),
                opts,
                &mut err,
            )
        };
        match NonNull::new(raw) {
            Some(raw) => Ok(DbHandle { raw, ctx }),
            None => Err(bridge_error(err)),
        }
    }

    /// The AccelFS the Env works on, if any.
    pub(crate) fn fs(&self) -> Option<&FileSystem> {
        self.ctx.as_deref().map(FsContext::fs)
    }

    pub(crate) fn put(&self, key: &[u8], value: &[u8], sync: bool) -> Result<(), KvError> {
        let mut err = ptr::null_mut();
        // SAFETY: raw is a live DB; the slices are valid for the call (LevelDB copies them).
        let rc = unsafe {
            kura_db_put(
                self.raw.as_ptr(),
                c_bytes(key),
                key.len(),
                c_bytes(value),
                value.len(),
                c_int::from(sync),
                &mut err,
            )
        };
        check(rc, err)
    }

    pub(crate) fn delete(&self, key: &[u8]) -> Result<(), KvError> {
        let mut err = ptr::null_mut();
        // SAFETY: as in `put`.
        let rc = unsafe { kura_db_delete(self.raw.as_ptr(), c_bytes(key), key.len(), 0, &mut err) };
        check(rc, err)
    }

    /// Applies `batch` atomically (LevelDB stamps the batch with its sequence number, hence
    /// `&mut`).
    pub(crate) fn write(&self, batch: &mut BatchHandle, sync: bool) -> Result<(), KvError> {
        let mut err = ptr::null_mut();
        // SAFETY: both objects are live and the batch is not shared during the call.
        let rc = unsafe {
            kura_db_write(
                self.raw.as_ptr(),
                batch.raw.as_ptr(),
                c_int::from(sync),
                &mut err,
            )
        };
        check(rc, err)
    }

    /// Fails with [`KvError::Invalid`] for a snapshot of another database.
    fn snapshot_ptr(&self, snap: Option<&SnapshotHandle<'_>>) -> Result<*const c_void, KvError> {
        match snap {
            None => Ok(ptr::null()),
            Some(s) if ptr::eq(s.db, self) => Ok(s.raw.as_ptr()),
            Some(_) => Err(KvError::Invalid(
                "the snapshot belongs to another database".into(),
            )),
        }
    }

    /// The value of `key`, as of `snap` (else the latest state).
    pub(crate) fn get(
        &self,
        snap: Option<&SnapshotHandle<'_>>,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, KvError> {
        let snap = self.snapshot_ptr(snap)?;
        let mut err = ptr::null_mut();
        let mut val: *mut c_char = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: raw is live; snap is null or a live snapshot of this DB (checked above, and
        // its borrow keeps it alive); the out-pointers are ours.
        let rc = unsafe {
            kura_db_get(
                self.raw.as_ptr(),
                snap,
                c_bytes(key),
                key.len(),
                &mut val,
                &mut len,
                &mut err,
            )
        };
        match rc {
            0 => Ok(None),
            1 if !val.is_null() => {
                // SAFETY: the bridge malloc'd `len` bytes at `val`; copied, then freed once.
                let v = unsafe { std::slice::from_raw_parts(val as *const u8, len) }.to_vec();
                // SAFETY: malloc'd by the bridge, not used again.
                unsafe { kura_free(val as *mut c_void) };
                Ok(Some(v))
            }
            1 => Ok(Some(Vec::new())),
            _ => Err(bridge_error(err)),
        }
    }

    /// A snapshot of this database; never a null one, which LevelDB would read as "the latest
    /// state".
    pub(crate) fn snapshot(&self) -> Result<SnapshotHandle<'_>, KvError> {
        let mut err = ptr::null_mut();
        // SAFETY: raw is live; the snapshot is released by SnapshotHandle's Drop, whose borrow
        // keeps this DB open until then.
        let raw = unsafe { kura_db_snapshot(self.raw.as_ptr(), &mut err) };
        match NonNull::new(raw as *mut c_void) {
            Some(raw) => Ok(SnapshotHandle { db: self, raw }),
            None => Err(bridge_error(err)),
        }
    }

    /// An iterator over the database as of `snap` (else the latest state), unpositioned.
    pub(crate) fn iter<'a>(
        &'a self,
        snap: Option<&'a SnapshotHandle<'_>>,
    ) -> Result<IterHandle<'a>, KvError> {
        let snap = self.snapshot_ptr(snap)?;
        let mut err = ptr::null_mut();
        // SAFETY: raw is live; snap is null or a live snapshot of this DB; the iterator's
        // lifetime keeps both borrowed until its Drop frees it.
        let raw = unsafe { kura_db_iter(self.raw.as_ptr(), snap, &mut err) };
        match NonNull::new(raw) {
            Some(raw) => Ok(IterHandle {
                raw,
                _borrows: PhantomData,
            }),
            None => Err(bridge_error(err)),
        }
    }

    pub(crate) fn compact(&self) -> Result<(), KvError> {
        let mut err = ptr::null_mut();
        // SAFETY: raw is live; err is ours.
        let rc = unsafe { kura_db_compact(self.raw.as_ptr(), &mut err) };
        check(rc, err)
    }

    /// LevelDB property `name`; `Ok(None)` when LevelDB does not know it.
    pub(crate) fn property(&self, name: &str) -> Result<Option<String>, KvError> {
        let cname = CString::new(name)
            .map_err(|_| KvError::Invalid(format!("{name:?} contains a NUL byte")))?;
        let mut err = ptr::null_mut();
        // SAFETY: raw is live; the name lives across the call; the result is malloc'd (or null)
        // and taken by take_string.
        let p = unsafe { kura_db_property(self.raw.as_ptr(), cname.as_ptr(), &mut err) };
        if let Some(value) = take_string(p) {
            Ok(Some(value))
        } else if !err.is_null() {
            Err(bridge_error(err))
        } else {
            Ok(None)
        }
    }
}

impl Drop for DbHandle {
    fn drop(&mut self) {
        // SAFETY: raw came from kura_db_open and is closed exactly once, here (LevelDB finishes
        // its background work first); every snapshot and iterator borrowed this handle, so none
        // is left. The context (field) is dropped after this returns.
        unsafe { kura_db_close(self.raw.as_ptr()) };
    }
}

/// A `leveldb::WriteBatch`, freed on drop.
pub(crate) struct BatchHandle {
    raw: NonNull<c_void>,
}

// SAFETY: a leveldb::WriteBatch is plain owned data; moving it between threads is fine.
unsafe impl Send for BatchHandle {}

impl BatchHandle {
    /// Fails when the C++ side cannot make one (out of memory).
    pub(crate) fn new() -> Result<BatchHandle, KvError> {
        if cfg!(kura_no_leveldb) {
            return Err(KvError::no_leveldb());
        }
        let mut err = ptr::null_mut();
        // SAFETY: returns a fresh heap object owned by the handle, or null with err set.
        let raw = unsafe { kura_batch_new(&mut err) };
        match NonNull::new(raw) {
            Some(raw) => Ok(BatchHandle { raw }),
            None => Err(bridge_error(err)),
        }
    }

    /// A failure (C++ out of memory) is kept in the batch by the bridge and reported when it is
    /// written.
    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) {
        // SAFETY: raw is a live batch; the slices are valid for the call (LevelDB copies them).
        unsafe {
            kura_batch_put(
                self.raw.as_ptr(),
                c_bytes(key),
                key.len(),
                c_bytes(value),
                value.len(),
            )
        };
    }

    /// Failures are kept as for [`BatchHandle::put`].
    pub(crate) fn delete(&mut self, key: &[u8]) {
        // SAFETY: as in `put`.
        unsafe { kura_batch_delete(self.raw.as_ptr(), c_bytes(key), key.len()) };
    }
}

impl Drop for BatchHandle {
    fn drop(&mut self) {
        // SAFETY: raw came from kura_batch_new and is freed once, here.
        unsafe { kura_batch_free(self.raw.as_ptr()) };
    }
}

/// A `leveldb::Snapshot` of one open database, released on drop.
pub(crate) struct SnapshotHandle<'a> {
    db: &'a DbHandle,
    raw: NonNull<c_void>,
}

impl Drop for SnapshotHandle<'_> {
    fn drop(&mut self) {
        // SAFETY: the snapshot belongs to `db`, which the borrow keeps open, and is released
        // once, here.
        unsafe { kura_db_release_snapshot(self.db.raw.as_ptr(), self.raw.as_ptr()) };
    }
}

/// A `leveldb::Iterator` (the bridge's `kura_iter`), freed on drop; it borrows the database and
/// the snapshot it reads at.
pub(crate) struct IterHandle<'a> {
    raw: NonNull<c_void>,
    _borrows: PhantomData<&'a DbHandle>,
}

impl IterHandle<'_> {
    /// Positions at the first key `>= key`.
    pub(crate) fn seek(&mut self, key: &[u8]) {
        // SAFETY: raw is a live iterator; the key is valid for the call (LevelDB copies what it
        // keeps). A failure is kept in the iterator for `status`.
        unsafe { kura_iter_seek(self.raw.as_ptr(), c_bytes(key), key.len()) };
    }

    fn valid(&self) -> bool {
        // SAFETY: raw is a live iterator.
        unsafe { kura_iter_valid(self.raw.as_ptr()) == 1 }
    }

    /// The key and value at the current position; `None` past the end or after a failure
    /// (which `status` then reports). They stay valid until the iterator moves.
    pub(crate) fn current(&self) -> Option<(&[u8], &[u8])> {
        if !self.valid() {
            return None;
        }
        let (mut kl, mut vl) = (0usize, 0usize);
        // SAFETY: the iterator is live and valid (checked above, as LevelDB requires); the
        // length out-pointers are ours.
        let (k, v) = unsafe {
            (
                kura_iter_key(self.raw.as_ptr(), &mut kl),
                kura_iter_value(self.raw.as_ptr(), &mut vl),
            )
        };
        if k.is_null() || v.is_null() {
            return None;
        }
        // SAFETY: LevelDB's key and value slices point at `kl` and `vl` bytes it holds until the
        // iterator moves or is freed, both of which need `&mut self`, so the borrows end first.
        Some(unsafe {
            (
                std::slice::from_raw_parts(k as *const u8, kl),
                std::slice::from_raw_parts(v as *const u8, vl),
            )
        })
    }

    /// Moves to the next key; does nothing past the end.
    pub(crate) fn next(&mut self) {
        if self.valid() {
            // SAFETY: raw is a live, valid iterator (LevelDB requires valid for Next).
            unsafe { kura_iter_next(self.raw.as_ptr()) };
        }
    }

    /// The first failure while iterating, if any.
    pub(crate) fn status(&self) -> Result<(), KvError> {
        let mut err = ptr::null_mut();
        // SAFETY: raw is a live iterator; err is ours.
        let bad = unsafe { kura_iter_status(self.raw.as_ptr(), &mut err) };
        check(bad, err)
    }
}

impl Drop for IterHandle<'_> {
    fn drop(&mut self) {
        // SAFETY: raw came from kura_db_iter and is freed once, here, while the database and
        // snapshot it reads (borrowed for its lifetime) are still open.
        unsafe { kura_iter_free(self.raw.as_ptr()) };
    }
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// What the callbacks work on: the file system and the files LevelDB holds open.
pub(crate) struct FsContext {
    fs: FileSystem,
    files: Mutex<HashMap<u64, (Arc<File>, u64)>>,
    next: AtomicU64,
}

impl FsContext {
    pub(crate) fn new(fs: FileSystem) -> Self {
        FsContext {
            fs,
            files: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    pub(crate) fn fs(&self) -> &FileSystem {
        &self.fs
    }

    fn files(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Arc<File>, u64)>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The callback table for `ctx`, which must outlive every use of the table.
pub(crate) fn ops_for(ctx: &FsContext) -> KuraFsOps {
    KuraFsOps {
        ctx: ctx as *const FsContext as *mut c_void,
        open: cb_open,
        read_at: cb_read_at,
        append: cb_append,
        sync: cb_sync,
        close: cb_close,
        exists: cb_exists,
        list: cb_list,
        remove: cb_remove,
        mkdir: cb_mkdir,
        rmdir: cb_rmdir,
        size: cb_size,
        rename: cb_rename,
        last_error: cb_last_error,
    }
}

fn remember(e: &FsError) -> c_int {
    LAST_ERROR.with(|l| *l.borrow_mut() = e.to_string());
    e.errno()
}

/// Runs a callback body: its errors and panics become an errno plus a message.
fn guard(body: impl FnOnce() -> Result<c_int, FsError>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => remember(&e),
        Err(_) => {
            LAST_ERROR.with(|l| *l.borrow_mut() = "internal error (panic) in kura-kv".into());
            libc::EIO
        }
    }
}

/// # Safety
/// `ctx` is the pointer `ops_for` put in the table; the context outlives the table.
unsafe fn context<'a>(ctx: *mut c_void) -> &'a FsContext {
    // SAFETY: guaranteed by the caller (the table is only used while the Db holds the context).
    unsafe { &*(ctx as *const FsContext) }
}

fn path(p: *const c_char) -> Result<String, FsError> {
    // SAFETY: the bridge passes NUL-terminated strings from std::string::c_str().
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(str::to_string)
        .map_err(|_| FsError::Invalid("path is not UTF-8".into()))
}

extern "C" fn cb_open(ctx: *mut c_void, p: *const c_char, mode: c_int, out: *mut u64) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        let p = path(p)?;
        let file = match mode {
            0 => c.fs.open(&p)?,
            1 => c.fs.create(&p)?,
            _ => {
                c.fs.open_with(&p, OpenOptions::new().read(true).write(true).create(true))?
            }
        };
        let end = file.len()?;
        let h = c.next.fetch_add(1, Ordering::Relaxed);
        c.files().insert(h, (Arc::new(file), end));
        // SAFETY: `out` points at the bridge's local u64.
        unsafe { *out = h };
        Ok(0)
    })
}

fn with_file<T>(
    c: &FsContext,
    h: u64,
    f: impl FnOnce(&File, &mut u64) -> Result<T, FsError>,
) -> Result<T, FsError> {
    let mut files = c.files();
    let (file, end) = files
        .get_mut(&h)
        .ok_or_else(|| FsError::BadHandle(format!("file handle {h} is not open")))?;
    f(file, end)
}

/// The open file behind `h`, without holding the handle table while it is used.
fn file(c: &FsContext, h: u64) -> Result<Arc<File>, FsError> {
    c.files()
        .get(&h)
        .map(|(f, _)| Arc::clone(f))
        .ok_or_else(|| FsError::BadHandle(format!("file handle {h} is not open")))
}

extern "C" fn cb_read_at(
    ctx: *mut c_void,
    h: u64,
    off: u64,
    buf: *mut c_char,
    n: usize,
    got: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        // SAFETY: `buf` has room for `n` bytes (LevelDB's scratch buffer).
        let dst = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n) };
        let file = file(c, h)?;
        let mut total = 0;
        while total < dst.len() {
            let k = file.read_at(off + total as u64, &mut dst[total..])?;
            if k == 0 {
                break;
            }
            total += k;
        }
        // SAFETY: `got` points at the bridge's local size_t.
        unsafe { *got = total };
        Ok(0)
    })
}

extern "C" fn cb_append(ctx: *mut c_void, h: u64, data: *const c_char, n: usize) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        // SAFETY: `data` holds `n` bytes (the bridge's buffer).
        let src = unsafe { std::slice::from_raw_parts(data as *const u8, n) };
        with_file(c, h, |file, end| {
            file.write_at(*end, src)?;
            *end += n as u64;
            Ok(0)
        })
    })
}

extern "C" fn cb_sync(ctx: *mut c_void, h: u64) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        file(c, h)?.sync_data().map(|()| 0)
    })
}

extern "C" fn cb_close(ctx: *mut c_void, h: u64) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        c.files().remove(&h);
        Ok(0)
    })
}

extern "C" fn cb_exists(ctx: *mut c_void, p: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        Ok(c_int::from(c.fs.exists(&path(p)?)))
    })
}

extern "C" fn cb_list(
    ctx: *mut c_void,
    dir: *const c_char,
    out: *mut c_void,
    push: extern "C" fn(*mut c_void, *const c_char, usize) -> c_int,
) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        for e in c.fs.read_dir(&path(dir)?)? {
            if push(out, e.name.as_ptr() as *const c_char, e.name.len()) != 0 {
                // The bridge could not take the name and keeps the reason itself.
                return Err(FsError::Invalid(
                    "listing stopped: the bridge could not take a name".into(),
                ));
            }
        }
        Ok(0)
    })
}

extern "C" fn cb_remove(ctx: *mut c_void, p: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        c.fs.remove_file(&path(p)?).map(|()| 0)
    })
}

extern "C" fn cb_mkdir(ctx: *mut c_void, p: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        c.fs.create_dir_all(&path(p)?).map(|()| 0)
    })
}

extern "C" fn cb_rmdir(ctx: *mut c_void, p: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        c.fs.remove_dir(&path(p)?).map(|()| 0)
    })
}

extern "C" fn cb_size(ctx: *mut c_void, p: *const c_char, out: *mut u64) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        let size = c.fs.metadata(&path(p)?)?.size;
        // SAFETY: `out` points at the bridge's u64.
        unsafe { *out = size };
        Ok(0)
    })
}

extern "C" fn cb_rename(ctx: *mut c_void, from: *const c_char, to: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: see `context`.
        let c = unsafe { context(ctx) };
        c.fs.rename(&path(from)?, &path(to)?).map(|()| 0)
    })
}

extern "C" fn cb_last_error(_ctx: *mut c_void, buf: *mut c_char, n: usize) -> usize {
    // Like every callback, it must not unwind into C++ (the thread-local may be gone during
    // thread teardown): a panic here yields an empty message.
    catch_unwind(|| {
        LAST_ERROR.with(|l| {
            let msg = l.borrow();
            let k = msg.len().min(n);
            // SAFETY: `buf` has room for `n` bytes; we copy at most that.
            unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), buf as *mut u8, k) };
            k
        })
    })
    .unwrap_or(0)
}
