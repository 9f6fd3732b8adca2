//! The boundary with the C++ bridge (`cpp/kura_leveldb.cc`): declarations of its C ABI, and the
//! storage callbacks it calls for every file LevelDB touches, implemented on a mounted AccelFS.
//!
//! LevelDB calls the callbacks from its own threads (background compaction) as well as the
//! caller's; the context is `Sync` (the file system is, and open files sit behind a mutex). No
//! panic may unwind into C++, so each callback runs under `catch_unwind` and reports failure as
//! an errno, keeping the message for `last_error`. In the other direction the bridge lets no C++
//! exception out of any function declared here (nor out of the `push` callback it hands
//! `list`): each becomes an error string, see the top of `cpp/kura_leveldb.cc`.

use kura_accelfs::{File, FileSystem, FsError, OpenOptions};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
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

#[cfg(not(kura_no_leveldb))]
extern "C" {
    pub(crate) fn kura_free(p: *mut c_void);
    pub(crate) fn kura_db_open(
        ops: *const KuraFsOps,
        name: *const c_char,
        o: *const KuraDbOptions,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    pub(crate) fn kura_db_close(db: *mut c_void);
    pub(crate) fn kura_db_put(
        db: *mut c_void,
        k: *const c_char,
        kl: usize,
        v: *const c_char,
        vl: usize,
        sync: c_int,
        err: *mut *mut c_char,
    ) -> c_int;
    pub(crate) fn kura_db_delete(
        db: *mut c_void,
        k: *const c_char,
        kl: usize,
        sync: c_int,
        err: *mut *mut c_char,
    ) -> c_int;
    pub(crate) fn kura_db_get(
        db: *mut c_void,
        snap: *const c_void,
        k: *const c_char,
        kl: usize,
        val: *mut *mut c_char,
        vl: *mut usize,
        err: *mut *mut c_char,
    ) -> c_int;
    pub(crate) fn kura_batch_new(err: *mut *mut c_char) -> *mut c_void;
    pub(crate) fn kura_batch_free(b: *mut c_void);
    pub(crate) fn kura_batch_put(
        b: *mut c_void,
        k: *const c_char,
        kl: usize,
        v: *const c_char,
        vl: usize,
    );
    pub(crate) fn kura_batch_delete(b: *mut c_void, k: *const c_char, kl: usize);
    pub(crate) fn kura_db_write(
        db: *mut c_void,
        b: *mut c_void,
        sync: c_int,
        err: *mut *mut c_char,
    ) -> c_int;
    pub(crate) fn kura_db_snapshot(db: *mut c_void, err: *mut *mut c_char) -> *const c_void;
    pub(crate) fn kura_db_release_snapshot(db: *mut c_void, s: *const c_void);
    pub(crate) fn kura_db_iter(
        db: *mut c_void,
        snap: *const c_void,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    pub(crate) fn kura_iter_free(it: *mut c_void);
    pub(crate) fn kura_iter_seek(it: *mut c_void, k: *const c_char, kl: usize);
    pub(crate) fn kura_iter_valid(it: *mut c_void) -> c_int;
    pub(crate) fn kura_iter_next(it: *mut c_void);
    pub(crate) fn kura_iter_key(it: *mut c_void, len: *mut usize) -> *const c_char;
    pub(crate) fn kura_iter_value(it: *mut c_void, len: *mut usize) -> *const c_char;
    pub(crate) fn kura_iter_status(it: *mut c_void, err: *mut *mut c_char) -> c_int;
    pub(crate) fn kura_db_compact(db: *mut c_void, err: *mut *mut c_char) -> c_int;
    pub(crate) fn kura_db_property(
        db: *mut c_void,
        name: *const c_char,
        err: *mut *mut c_char,
    ) -> *mut c_char;
    #[cfg(feature = "test-hooks")]
    pub(crate) fn kura_test_throw(site: c_int, kind: c_int);
}

/// Arms one injected C++ throw at the next `site` on this thread (see `crate::test_hooks`).
#[cfg(feature = "test-hooks")]
pub(crate) fn test_throw(site: c_int, kind: c_int) {
    #[cfg(not(kura_no_leveldb))]
    // SAFETY: sets two thread-locals in the bridge; no pointers involved.
    unsafe {
        kura_test_throw(site, kind)
    };
    #[cfg(kura_no_leveldb)]
    let _ = (site, kind);
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
