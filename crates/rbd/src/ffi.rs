//! All of the crate's unsafe code: hand-written declarations of the librados/librbd 16.2 C
//! functions kura calls (`/usr/include/rados/librados.h`, `/usr/include/rbd/librbd.h`) and owning
//! handles over them, freed in `Drop`:
//!
//! - [`Cluster`]: a connected `rados_t` (configuration read, timeouts set, cephx done);
//! - [`Pool`]: a `rados_ioctx_t` on one pool, holding its cluster;
//! - [`Image`]: an open `rbd_image_t` holding its pool, plus everything in flight on it. The
//!   caller's buffer of a request lives in the image's table of pending requests from the first
//!   `rbd_aio_*` call until the last of its completions is reaped, so librbd never writes into
//!   memory that moved or was freed, and `Drop` waits for every outstanding completion before
//!   `rbd_close`.
//!
//! Completions come back without callback threads: the image signals an eventfd
//! (`rbd_set_image_notification`) and [`Image::reap`] drains `rbd_poll_io_events`, sleeping in
//! `poll(2)` on that eventfd when it must wait. librbd's own threads only push finished
//! completions onto its internal queue; no kura code runs on them.

use kura_engine::{Errno, IoBuf};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, OnceLock};

#[allow(non_camel_case_types)]
type rados_t = *mut c_void;
#[allow(non_camel_case_types)]
type rados_ioctx_t = *mut c_void;
#[allow(non_camel_case_types)]
type rbd_image_t = *mut c_void;
#[allow(non_camel_case_types)]
type rbd_completion_t = *mut c_void;
#[allow(non_camel_case_types)]
type rbd_callback_t = Option<unsafe extern "C" fn(rbd_completion_t, *mut c_void)>;

/// `EVENT_TYPE_EVENTFD` of librbd.h.
const EVENT_TYPE_EVENTFD: c_int = 2;
/// `rbd_lock_mode_t`: RBD_LOCK_MODE_EXCLUSIVE.
const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

/// `rbd_image_info_t` of librbd.h (16.2).
#[repr(C)]
struct RbdImageInfo {
    size: u64,
    obj_size: u64,
    num_objs: u64,
    order: c_int,
    block_name_prefix: [c_char; 24],
    parent_pool: i64,
    parent_name: [c_char; 96],
}

/// The libraries' file names (Debian's `librbd1` and `librados2`, ABI 1 and 2 since Ceph 0.9x).
const LIBRBD: &str = "librbd.so.1";
const LIBRADOS: &str = "librados.so.2";

/// Declares the C functions kura calls and [`Lib`], the table of them resolved at run time.
macro_rules! functions {
    ($($name:ident: fn($($ty:ty),*) $(-> $ret:ty)?;)*) => {
        /// The librados/librbd functions kura calls, resolved from the loaded libraries.
        #[allow(non_snake_case)]
        pub struct Lib {
            $($name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        impl Lib {
            /// Looks every function up in `libraries`.
            ///
            /// # Safety
            ///
            /// Each symbol found must be the C function of librados.h/librbd.h 16.2 with the
            /// signature declared here.
            unsafe fn resolve(libraries: &[*mut c_void]) -> Result<Lib, String> {
                Ok(Lib {
                    $($name: {
                        let address = symbol(libraries, concat!(stringify!($name), "\0"))?;
                        // SAFETY: the caller vouches for the signature; the address is non-null.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) $(-> $ret)?>(
                                address,
                            )
                        }
                    },)*
                })
            }
        }
    };
}

functions! {
    rados_create: fn(*mut rados_t, *const c_char) -> c_int;
    rados_conf_read_file: fn(rados_t, *const c_char) -> c_int;
    rados_conf_set: fn(rados_t, *const c_char, *const c_char) -> c_int;
    rados_connect: fn(rados_t) -> c_int;
    rados_shutdown: fn(rados_t);
    rados_ioctx_create: fn(rados_t, *const c_char, *mut rados_ioctx_t) -> c_int;
    rados_ioctx_destroy: fn(rados_ioctx_t);
    rbd_create: fn(rados_ioctx_t, *const c_char, u64, *mut c_int) -> c_int;
    rbd_open: fn(rados_ioctx_t, *const c_char, *mut rbd_image_t, *const c_char) -> c_int;
    rbd_open_read_only: fn(rados_ioctx_t, *const c_char, *mut rbd_image_t, *const c_char) -> c_int;
    rbd_close: fn(rbd_image_t) -> c_int;
    rbd_lock_acquire: fn(rbd_image_t, c_int) -> c_int;
    rbd_stat: fn(rbd_image_t, *mut RbdImageInfo, usize) -> c_int;
    rbd_set_image_notification: fn(rbd_image_t, c_int, c_int) -> c_int;
    rbd_poll_io_events: fn(rbd_image_t, *mut rbd_completion_t, c_int) -> c_int;
    rbd_aio_create_completion: fn(*mut c_void, rbd_callback_t, *mut rbd_completion_t) -> c_int;
    rbd_aio_get_return_value: fn(rbd_completion_t) -> isize;
    rbd_aio_get_arg: fn(rbd_completion_t) -> *mut c_void;
    rbd_aio_release: fn(rbd_completion_t);
    rbd_aio_read2: fn(rbd_image_t, u64, usize, *mut c_char, rbd_completion_t, c_int) -> c_int;
    rbd_aio_write2: fn(rbd_image_t, u64, usize, *const c_char, rbd_completion_t, c_int) -> c_int;
    rbd_aio_discard: fn(rbd_image_t, u64, u64, rbd_completion_t) -> c_int;
    rbd_aio_write_zeroes: fn(rbd_image_t, u64, usize, rbd_completion_t, c_int, c_int) -> c_int;
    rbd_aio_flush: fn(rbd_image_t, rbd_completion_t) -> c_int;
}

/// The loaded libraries' functions, or why they could not be loaded. Loaded on the first `rbd:`
/// open and kept for the life of the process, so a kura process that never opens `rbd:` maps
/// none of Ceph's libraries (about 8 MiB of resident memory).
pub fn library() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let rados = open_library(LIBRADOS)?;
        let rbd = open_library(LIBRBD)?;
        // SAFETY: the two libraries are librados and librbd, whose exported functions of these
        // names have the signatures of their 16.2 headers declared above (stable C ABI).
        unsafe { Lib::resolve(&[rbd, rados]) }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// `dlopen` of `name`, kept open for the life of the process.
fn open_library(name: &str) -> Result<*mut c_void, String> {
    let c_name = c_string(name).map_err(|_| format!("{name}: bad library name"))?;
    // SAFETY: a NUL-terminated file name; RTLD_NOW resolves everything up front, RTLD_LOCAL keeps
    // Ceph's symbols out of the global namespace.
    let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("{name}: {}", last_dl_error()));
    }
    Ok(handle)
}

/// The address of `name` (NUL-terminated) in the first of `libraries` that exports it.
fn symbol(libraries: &[*mut c_void], name: &str) -> Result<*mut c_void, String> {
    for &library in libraries {
        // SAFETY: `library` came from dlopen and is never closed; `name` ends with NUL.
        let address = unsafe { libc::dlsym(library, name.as_ptr().cast()) };
        if !address.is_null() {
            return Ok(address);
        }
    }
    Err(format!(
        "{} not found in {LIBRBD} or {LIBRADOS}",
        name.trim_end_matches('\0')
    ))
}

/// The text of the last `dlopen`/`dlsym` error.
fn last_dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message valid until the next dl call on
    // this thread, copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// A negative return of a librados/librbd call as an [`Errno`], or the value itself.
fn check(ret: c_int) -> Result<c_int, Errno> {
    if ret < 0 {
        Err(Errno(-ret))
    } else {
        Ok(ret)
    }
}

/// A C string for librados, or EINVAL when `s` holds a NUL byte.
fn c_string(s: &str) -> Result<CString, Errno> {
    CString::new(s).map_err(|_| Errno(libc::EINVAL))
}

/// Where a failed [`Cluster::connect`] stopped.
#[derive(Debug)]
pub enum ConnectStep {
    /// `rados_create` (the user name).
    Create,
    /// Reading the configuration file.
    ReadConf,
    /// Setting the named option.
    Set(String),
    /// `rados_connect`: monitors, cephx.
    Connect,
}

/// A connected RADOS client. Shut down when the last [`Pool`] and [`Image`] holding it go.
pub struct Cluster {
    handle: rados_t,
    lib: &'static Lib,
}

// SAFETY: librados handles are thread-safe (librados.h: "the cluster handle may be shared by
// threads"); kura only moves them between threads and calls thread-safe functions on them.
unsafe impl Send for Cluster {}
// SAFETY: as above; every method takes `&self` only for thread-safe librados calls.
unsafe impl Sync for Cluster {}

impl Cluster {
    /// Creates a client for cephx user `id` (without `client.`), reads `conf` (None: librados's
    /// default search, `$CEPH_CONF` then `/etc/ceph/ceph.conf`, where finding none is no error),
    /// applies `options` in order and connects.
    pub fn connect(
        lib: &'static Lib,
        id: &str,
        conf: Option<&str>,
        options: &[(&str, String)],
    ) -> Result<Cluster, (ConnectStep, Errno)> {
        let id_c = c_string(id).map_err(|e| (ConnectStep::Create, e))?;
        let mut handle: rados_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; `id_c` a NUL-terminated string that librados
        // copies.
        check(unsafe { (lib.rados_create)(&mut handle, id_c.as_ptr()) })
            .map_err(|e| (ConnectStep::Create, e))?;
        // From here the handle is owned: every early return shuts it down in `Drop`.
        let cluster = Cluster { handle, lib };
        let conf_c = match conf {
            Some(path) => Some(c_string(path).map_err(|e| (ConnectStep::ReadConf, e))?),
            None => None,
        };
        let conf_ptr = conf_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        // SAFETY: the handle is live and not yet connected; `conf_ptr` is NULL (default search)
        // or a NUL-terminated path that outlives the call.
        match check(unsafe { (lib.rados_conf_read_file)(cluster.handle, conf_ptr) }) {
            // No file on the default search path: the options (mon_host, keyring) may suffice.
            Err(e) if conf.is_none() && e.0 == libc::ENOENT => {}
            Err(e) => return Err((ConnectStep::ReadConf, e)),
            Ok(_) => {}
        }
        for (key, value) in options {
            let step = || ConnectStep::Set(format!("{key}={value}"));
            let k = c_string(key).map_err(|e| (step(), e))?;
            let v = c_string(value).map_err(|e| (step(), e))?;
            // SAFETY: live, unconnected handle; both strings NUL-terminated and copied.
            check(unsafe { (lib.rados_conf_set)(cluster.handle, k.as_ptr(), v.as_ptr()) })
                .map_err(|e| (step(), e))?;
        }
        // SAFETY: live, configured handle; blocks for at most client_mount_timeout.
        check(unsafe { (lib.rados_connect)(cluster.handle) })
            .map_err(|e| (ConnectStep::Connect, e))?;
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_create and every ioctx made from it is gone (each
        // `Pool` holds an `Arc<Cluster>`). rados_shutdown also frees an unconnected handle.
        unsafe { (self.lib.rados_shutdown)(self.handle) }
    }
}

/// An I/O context on one pool.
pub struct Pool {
    handle: rados_ioctx_t,
    lib: &'static Lib,
    _cluster: Arc<Cluster>,
}

// SAFETY: an ioctx may be used from any thread (librados.h); kura uses it from one at a time.
unsafe impl Send for Pool {}
// SAFETY: only thread-safe librbd calls (create, open) take it through `&self`.
unsafe impl Sync for Pool {}

impl Pool {
    /// Opens pool `name` of `cluster`.
    pub fn open(cluster: Arc<Cluster>, name: &str) -> Result<Pool, Errno> {
        let name_c = c_string(name)?;
        let mut handle: rados_ioctx_t = std::ptr::null_mut();
        // SAFETY: connected cluster handle, NUL-terminated name, valid out-pointer.
        check(unsafe {
            (cluster.lib.rados_ioctx_create)(cluster.handle, name_c.as_ptr(), &mut handle)
        })?;
        Ok(Pool {
            handle,
            lib: cluster.lib,
            _cluster: cluster,
        })
    }

    /// Creates image `name` of `size` bytes with the cluster's default format and features.
    pub fn create_image(&self, name: &str, size: u64) -> Result<(), Errno> {
        let name_c = c_string(name)?;
        let mut order: c_int = 0;
        // SAFETY: live ioctx, NUL-terminated name, `order` a valid in/out pointer (0: default).
        check(unsafe { (self.lib.rbd_create)(self.handle, name_c.as_ptr(), size, &mut order) })?;
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: the ioctx came from rados_ioctx_create and no image opened on it is left (each
        // `Image` owns its `Pool`).
        unsafe { (self.lib.rados_ioctx_destroy)(self.handle) }
    }
}

/// What an [`Image`] command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AioOp {
    Read,
    Write,
    Discard,
    WriteZeroes,
    Flush,
}

/// One piece of a request: `len` bytes at image offset `offset`, from byte `buf_offset` of the
/// request's buffer (reads and writes).
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    pub offset: u64,
    pub len: u64,
    pub buf_offset: usize,
}

/// A request whose last piece has completed.
#[derive(Debug)]
pub struct Finished {
    pub token: u64,
    pub buf: Option<IoBuf>,
    /// The first failed piece's error, if any.
    pub status: Result<(), Errno>,
}

/// A request in flight: its buffer, and how many pieces have not completed.
struct Pending {
    token: u64,
    op: AioOp,
    buf: Option<IoBuf>,
    remaining: usize,
    status: Result<(), Errno>,
}

/// Size and layout of an image.
#[derive(Debug, Clone, Copy)]
pub struct ImageInfo {
    pub size: u64,
    pub object_size: u64,
}

/// An open image and the requests in flight on it.
pub struct Image {
    handle: rbd_image_t,
    lib: &'static Lib,
    /// Signalled by librbd when a completion is ready.
    eventfd: c_int,
    /// Slot per request in flight; the slot index is each completion's argument.
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
    /// Pieces issued whose completion has not been reaped.
    pieces_in_flight: usize,
    /// Requests every piece of which failed to issue: finished without a completion.
    finished_early: Vec<Finished>,
    _pool: Pool,
}

// SAFETY: an rbd image handle may be used from any thread; kura drives it from one thread at a
// time (`&mut self` for everything that issues or reaps), and the eventfd is a plain fd.
unsafe impl Send for Image {}

/// How many completions one `rbd_poll_io_events` call returns at most.
const REAP_BATCH: usize = 64;

impl Image {
    /// Opens image `name` of `pool` at snapshot `snap` (None: the head), read-only when
    /// `read_only` (no watch, no exclusive lock; writes fail with EROFS), with room for
    /// `max_requests` requests in flight.
    pub fn open(
        pool: Pool,
        name: &str,
        snap: Option<&str>,
        read_only: bool,
        max_requests: usize,
    ) -> Result<Image, Errno> {
        let name_c = c_string(name)?;
        let snap_c = snap.map(c_string).transpose()?;
        let snap_ptr = snap_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        let lib = pool.lib;
        let mut handle: rbd_image_t = std::ptr::null_mut();
        // SAFETY: live ioctx, NUL-terminated name and snapshot (or NULL), valid out-pointer.
        check(unsafe {
            if read_only {
                (lib.rbd_open_read_only)(pool.handle, name_c.as_ptr(), &mut handle, snap_ptr)
            } else {
                (lib.rbd_open)(pool.handle, name_c.as_ptr(), &mut handle, snap_ptr)
            }
        })?;
        if !read_only && snap.is_none() {
            // One writer at a time, as for kura's other images: take the image's exclusive lock
            // and keep it (librbd otherwise hands it to any client that asks). Another holder
            // refuses with EROFS or EBUSY. An image made without the exclusive-lock feature
            // answers EINVAL and cannot be guarded; it opens as before.
            // SAFETY: live image handle; RBD_LOCK_MODE_EXCLUSIVE is 0.
            let r = unsafe { (lib.rbd_lock_acquire)(handle, RBD_LOCK_MODE_EXCLUSIVE) };
            if r < 0 && r != -libc::EINVAL {
                // SAFETY: the image was just opened and nothing is in flight on it.
                unsafe { (lib.rbd_close)(handle) };
                return Err(Errno(-r));
            }
        }
        // SAFETY: plain eventfd(2).
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if eventfd < 0 {
            let e = Errno::last();
            // SAFETY: the image was just opened and nothing is in flight on it.
            unsafe { (lib.rbd_close)(handle) };
            return Err(e);
        }
        let image = Image {
            handle,
            lib,
            eventfd,
            pending: (0..max_requests).map(|_| None).collect(),
            free: (0..max_requests).rev().collect(),
            pieces_in_flight: 0,
            finished_early: Vec::new(),
            _pool: pool,
        };
        // SAFETY: live image; the eventfd stays open until after rbd_close (see Drop).
        check(unsafe {
            (lib.rbd_set_image_notification)(image.handle, eventfd, EVENT_TYPE_EVENTFD)
        })?;
        Ok(image)
    }

    /// The image's size and object size.
    pub fn info(&self) -> Result<ImageInfo, Errno> {
        // SAFETY: all-zero bytes are a valid RbdImageInfo (integers and char arrays).
        let mut info: RbdImageInfo = unsafe { std::mem::zeroed() };
        // SAFETY: live image; `info` is a writable struct of the size passed.
        check(unsafe {
            (self.lib.rbd_stat)(self.handle, &mut info, std::mem::size_of::<RbdImageInfo>())
        })?;
        Ok(ImageInfo {
            size: info.size,
            object_size: info.obj_size,
        })
    }

    /// Requests started and not yet handed back by [`Image::reap`].
    pub fn requests_in_flight(&self) -> usize {
        self.pending.len() - self.free.len()
    }

    /// Starts request `token`: `op` on each of `pieces` (one piece for flush), reading into or
    /// writing from `buf`. A piece whose range does not fit `buf` is refused with EINVAL before
    /// anything is issued. Pieces librbd refuses count as failed; the request finishes when its
    /// last issued piece completes (or at once, if none was issued). With no free slot the buffer
    /// comes back with EAGAIN.
    pub fn start(
        &mut self,
        token: u64,
        op: AioOp,
        buf: Option<IoBuf>,
        pieces: &[Piece],
    ) -> Result<(), (Option<IoBuf>, Errno)> {
        if pieces.is_empty() {
            return Err((buf, Errno(libc::EINVAL)));
        }
        if matches!(op, AioOp::Read | AioOp::Write) {
            let Some(b) = &buf else {
                return Err((buf, Errno(libc::EINVAL)));
            };
            let fits = pieces.iter().all(|p| {
                usize::try_from(p.len)
                    .ok()
                    .and_then(|len| p.buf_offset.checked_add(len))
                    .is_some_and(|end| end <= b.len())
            });
            if !fits {
                return Err((buf, Errno(libc::EINVAL)));
            }
        }
        let Some(slot) = self.free.pop() else {
            return Err((buf, Errno(libc::EAGAIN)));
        };
        self.pending[slot] = Some(Pending {
            token,
            op,
            buf,
            remaining: 0,
            status: Ok(()),
        });
        for piece in pieces {
            let issued = self.issue(slot, *piece);
            let Some(p) = self.pending[slot].as_mut() else {
                break;
            };
            match issued {
                Ok(()) => {
                    p.remaining += 1;
                    self.pieces_in_flight += 1;
                }
                Err(e) => {
                    if p.status.is_ok() {
                        p.status = Err(e);
                    }
                }
            }
        }
        if self.pending[slot]
            .as_ref()
            .is_some_and(|p| p.remaining == 0)
        {
            self.retire(slot);
        }
        Ok(())
    }

    /// Issues one piece of the request in `slot`.
    fn issue(&mut self, slot: usize, piece: Piece) -> Result<(), Errno> {
        let Some(p) = self.pending[slot].as_mut() else {
            return Err(Errno(libc::EINVAL));
        };
        let op = p.op;
        let len = usize::try_from(piece.len).map_err(|_| Errno(libc::EINVAL))?;
        // Bounds were checked in `start`; the pointer stays valid because the buffer's memory
        // does not move with the `IoBuf` value and the value stays in `pending` until reaped.
        let data: *mut u8 = match (&mut p.buf, op) {
            (Some(b), AioOp::Read | AioOp::Write) => b.as_mut_ptr().wrapping_add(piece.buf_offset),
            _ => std::ptr::null_mut(),
        };
        let mut comp: rbd_completion_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the argument is the slot index smuggled as a pointer (never
        // dereferenced); no callback, completions are collected with rbd_poll_io_events.
        check(unsafe {
            (self.lib.rbd_aio_create_completion)(slot as *mut c_void, None, &mut comp)
        })?;
        // SAFETY: live image and fresh completion. For reads/writes `data..data+len` lies inside
        // the request's buffer (checked in `start`), which stays allocated and untouched by kura
        // until this completion is reaped (it is owned by `self.pending[slot]`, and `Drop` waits
        // for every completion).
        let lib = self.lib;
        let ret = unsafe {
            match op {
                AioOp::Read => {
                    (lib.rbd_aio_read2)(self.handle, piece.offset, len, data.cast(), comp, 0)
                }
                AioOp::Write => {
                    (lib.rbd_aio_write2)(self.handle, piece.offset, len, data.cast(), comp, 0)
                }
                AioOp::Discard => (lib.rbd_aio_discard)(self.handle, piece.offset, piece.len, comp),
                AioOp::WriteZeroes => {
                    (lib.rbd_aio_write_zeroes)(self.handle, piece.offset, len, comp, 0, 0)
                }
                AioOp::Flush => (lib.rbd_aio_flush)(self.handle, comp),
            }
        };
        if ret < 0 {
            // SAFETY: librbd refused the command, so it holds no reference to the completion.
            unsafe { (self.lib.rbd_aio_release)(comp) };
            return Err(Errno(-ret));
        }
        Ok(())
    }

    /// Moves the request in `slot` to the finished list and frees the slot.
    fn retire(&mut self, slot: usize) {
        if let Some(p) = self.pending[slot].take() {
            self.finished_early.push(Finished {
                token: p.token,
                buf: p.buf,
                status: p.status,
            });
            self.free.push(slot);
        }
    }

    /// Moves finished requests into `out` until at least `min` have been moved by this call or
    /// nothing is in flight, sleeping on the eventfd while waiting. Returns how many moved. An
    /// error means the eventfd itself failed.
    pub fn reap(&mut self, out: &mut Vec<Finished>, min: usize) -> Result<usize, Errno> {
        let mut moved = 0;
        let mut take = |image: &mut Image, out: &mut Vec<Finished>| {
            moved += image.finished_early.len();
            out.append(&mut image.finished_early);
            moved >= min || image.pieces_in_flight == 0
        };
        loop {
            // librbd's queue first: no system call when what is wanted is already there (the
            // eventfd then stays raised, and a later wait only returns at once and looks again).
            self.collect()?;
            if take(self, out) {
                return Ok(moved);
            }
            // About to sleep: reset the eventfd, then look again, so a completion queued in
            // between is either seen now or raises the eventfd again.
            self.clear_eventfd()?;
            self.collect()?;
            if take(self, out) {
                return Ok(moved);
            }
            self.wait_eventfd()?;
        }
    }

    /// Resets the eventfd's counter; a completion queued after this raises it again.
    fn clear_eventfd(&self) -> Result<(), Errno> {
        let mut value = 0u64;
        // SAFETY: reads 8 bytes into `value` from our non-blocking eventfd.
        let n = unsafe { libc::read(self.eventfd, (&mut value as *mut u64).cast(), 8) };
        if n < 0 {
            let e = Errno::last();
            if e.0 != libc::EAGAIN && e.0 != libc::EINTR {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Sleeps until the eventfd is signalled (or a second passes; the caller looks again).
    fn wait_eventfd(&self) -> Result<(), Errno> {
        let mut pfd = libc::pollfd {
            fd: self.eventfd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
        if n < 0 {
            let e = Errno::last();
            if e.0 != libc::EINTR {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Drains librbd's queue of finished completions, retiring requests whose last piece this
    /// was (into `finished_early`).
    fn collect(&mut self) -> Result<(), Errno> {
        let mut comps: [rbd_completion_t; REAP_BATCH] = [std::ptr::null_mut(); REAP_BATCH];
        loop {
            // SAFETY: live image; `comps` has room for REAP_BATCH completions.
            let n = check(unsafe {
                (self.lib.rbd_poll_io_events)(self.handle, comps.as_mut_ptr(), REAP_BATCH as c_int)
            })? as usize;
            for &comp in &comps[..n.min(REAP_BATCH)] {
                // SAFETY: a completion librbd handed back as finished; it was created by
                // `issue`, which set its argument to a slot index. It is released exactly once.
                let (slot, ret) = unsafe {
                    let slot = (self.lib.rbd_aio_get_arg)(comp) as usize;
                    let ret = (self.lib.rbd_aio_get_return_value)(comp);
                    (self.lib.rbd_aio_release)(comp);
                    (slot, ret)
                };
                self.pieces_in_flight = self.pieces_in_flight.saturating_sub(1);
                let Some(p) = self.pending.get_mut(slot).and_then(Option::as_mut) else {
                    continue;
                };
                if ret < 0 && p.status.is_ok() {
                    p.status = Err(Errno(i32::try_from(-ret).unwrap_or(libc::EIO)));
                }
                p.remaining = p.remaining.saturating_sub(1);
                if p.remaining == 0 {
                    self.retire(slot);
                }
            }
            if n < REAP_BATCH {
                return Ok(());
            }
        }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // librbd may still write into buffers of requests in flight: wait for every completion
        // (each op ends, at the latest, when rados_osd_op_timeout expires) before anything is
        // freed. If the eventfd breaks, keep looking at librbd's queue once a second.
        let mut sink = Vec::new();
        while self.pieces_in_flight > 0 {
            if self.reap(&mut sink, usize::MAX).is_err() {
                let _ = self.collect();
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            sink.clear();
        }
        // SAFETY: nothing is in flight; the handle is closed once, then the eventfd it signals.
        unsafe {
            (self.lib.rbd_close)(self.handle);
            libc::close(self.eventfd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_or_symbol_is_an_error_naming_it() {
        let e = open_library("libkura-no-such-library.so.9").unwrap_err();
        assert!(e.contains("libkura-no-such-library.so.9"), "{e}");
        // The C library is loaded in every process; it exports no librbd function.
        let libc_handle = open_library("libc.so.6").expect("libc loads");
        let e = symbol(&[libc_handle], "rbd_kura_no_such_function\0").unwrap_err();
        assert!(e.contains("rbd_kura_no_such_function not found"), "{e}");
        assert!(symbol(&[libc_handle], "malloc\0").is_ok());
    }
}
