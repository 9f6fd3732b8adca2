//! kura-pystore: kura's key-value stores as the Python module `kura` (issue 18). This crate owns
//! the Python-facing API only: `kura.DB` (plyvel's API over both engines: Google LevelDB through
//! kura-kv, and the native store; `db.rs`) and `kura.Store` (the native store's own API, with
//! stats and compaction; this file), which Python exception each engine error becomes, and when
//! the GIL is released. The engines (formats, recovery, group commit) are their crates'.
//!
//! # Why pyo3, and how it is built
//!
//! pyo3 is the well-kept Rust binding of CPython: safe reference counting, argument parsing,
//! exceptions and GIL handling come from it instead of hand-written C-API calls. Its `abi3-py39`
//! feature targets CPython's stable ABI, so one build loads in any CPython from 3.9 on, and
//! `extension-module` leaves libpython unlinked (the importing interpreter provides it). Two ways
//! to build it: `pip install ./crates/pystore` (maturin, the build backend named in its
//! `pyproject.toml`, makes a release wheel and installs it), or `cargo build -p kura-pystore` and
//! copy `target/debug/libkura_store.so` to a directory on `PYTHONPATH` as `kura.so`, which is what
//! the test (`tests/python.rs`) does before it runs the pytest suites in `tests/`.
//!
//! # Usage
//!
//! ```python
//! import kura
//!
//! # LevelDB in a host directory (plyvel opens it too), or with dev="file:fs.img" a directory
//! # inside the AccelFS on that device; the native store on a raw device with name "/".
//! with kura.DB("/tmp/kv-leveldb", engine="leveldb", create_if_missing=True) as db:
//!     db.put(b"apple", b"red")
//!     db.put(b"cherry", b"dark", sync=True)   # durable when it returns
//!     assert db.get(b"nope") is None and db.get(b"nope", b"-") == b"-"
//!     with db.write_batch(transaction=True) as wb:   # atomic; dropped if the block raises
//!         wb.put(b"banana", b"yellow")
//!         wb.delete(b"apple")
//!     with db.snapshot() as snap:
//!         db.put(b"date", b"brown")
//!         assert snap.get(b"date") is None
//!     print(list(db.iterator(start=b"b", stop=b"d", reverse=True)))
//!     print(list(db.iterator(prefix=b"da", include_value=False)))
//!
//! with kura.DB("/", engine="native", dev="file:/tmp/kv-native.img?size=64M",
//!              create_if_missing=True) as db:   # formats a blank device only
//!     db.put(b"fig", b"purple")
//!     print(list(db.iterator()))
//! ```
//!
//! `kura.Store` is the native store with its own names (scan with a limit, compact, stats):
//!
//! ```python
//! import kura
//!
//! # create=True formats the device (whatever it held is lost); without it an existing
//! # store is opened. Any engine device spec works: file:, uring:, mem:, fault(...), ...
//! with kura.Store("file:/tmp/kv.img?size=256M", create=True) as db:
//!     db.put(b"apple", b"red")
//!     db[b"banana"] = b"yellow"          # the same as put(..., sync=False)
//!     db.put(b"cherry", b"dark", sync=True)  # durable when it returns
//!     assert db.get(b"apple") == b"red" and db.get(b"nope") is None
//!     assert b"banana" in db
//!
//!     batch = kura.WriteBatch()
//!     batch.put(b"date", b"brown")
//!     batch.delete(b"apple")
//!     db.write(batch, sync=True)         # all or nothing, also across a crash
//!     with db.write_batch() as b:        # the same, written when the block ends normally
//!         b.put(b"fig", b"purple")
//!
//!     with db.snapshot() as snap:        # a frozen view
//!         db[b"elder"] = b"black"
//!         assert snap.get(b"elder") is None
//!         print(list(snap.scan(start=b"b")))
//!
//!     for key, value in db.scan(start=b"b", end=b"d", reverse=True, limit=10):
//!         print(key, value)
//!     db.compact()                       # everything into one sorted level
//!     print(db.stats())                  # {'batches': 6, 'groups': 6, 'flushes': 1, ...}
//!
//! with kura.Store("file:/tmp/kv.img") as db:   # reopen: the log is replayed
//!     assert db[b"date"] == b"brown"
//! ```
//!
//! Keys and values are `bytes` (anything else is a `TypeError`). Errors are subclasses of
//! `kura.Error`: `CorruptError` (also named `CorruptionError`, plyvel's name: stored bytes failed
//! their checks, or no valid superblock), `FullError`, `RefusedError` (key or batch too large),
//! `DeviceError` (also `kura.IOError`), `StoppedError` (an earlier write failed; reopen),
//! `LockedError` (another open handle or process holds the image or LevelDB's LOCK),
//! `NotFoundError` (no database there and `create_if_missing` off), `UnavailableError` (a build
//! without LevelDB) and `ClosedError` (use after `close()`). A malformed spec or bad option is a
//! `ValueError`, a missing image file an `OSError`, C++ out of memory a `MemoryError`.
//!
//! Every call that reads or writes a store releases the GIL while it runs, so Python threads
//! overlap in the store (concurrent writers share group commits). A scan or iterator holds a
//! snapshot (which keeps the versions it sees from being dropped) until it is exhausted, closed
//! or dropped, and fetches pairs a page at a time through the engines' bounded scans, which
//! return a Vec per page: neither engine's Rust API has a streaming iterator yet.

#![forbid(unsafe_code)]

mod db;
mod views;

use db::Failure;
use pyo3::exceptions::{PyException, PyKeyError, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use self_cell::self_cell;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};
use store::{Pair, Snapshot, StoreError, StoreOptions};
use views::{lock, read, Release, Views};

pyo3::create_exception!(
    kura,
    Error,
    PyException,
    "Base class of every error the store raises."
);
pyo3::create_exception!(
    kura,
    CorruptError,
    Error,
    "Stored bytes failed their checks (CRC32C, magic, fields), or the device holds no valid \
     superblock. The store never returns wrong data instead."
);
pyo3::create_exception!(
    kura,
    FullError,
    Error,
    "Every segment slot of the device is in use."
);
pyo3::create_exception!(
    kura,
    RefusedError,
    Error,
    "The input cannot be stored: a key or a write batch is too large."
);
pyo3::create_exception!(
    kura,
    DeviceError,
    Error,
    "The device failed a read, write or flush."
);
pyo3::create_exception!(
    kura,
    StoppedError,
    Error,
    "An earlier write failed, so the store takes no more writes until it is reopened (reads \
     still work)."
);
pyo3::create_exception!(
    kura,
    LockedError,
    Error,
    "The image is held by another open Store or process (kura lets one writer open an image)."
);
pyo3::create_exception!(
    kura,
    NotFoundError,
    Error,
    "No database where DB() looked (a LevelDB directory without one, a blank native device), \
     and create_if_missing was False."
);
pyo3::create_exception!(
    kura,
    UnavailableError,
    Error,
    "This build of the module has no LevelDB engine (libleveldb-dev was missing when it was \
     built): engine=\"leveldb\" cannot open anything."
);
pyo3::create_exception!(
    kura,
    ClosedError,
    Error,
    "The Store, Snapshot or scan was used after it was closed."
);

/// Pairs fetched per page of a scan: each page is one short read-locked walk of the store.
const SCAN_PAGE: usize = 512;

type Inner = store::Store;
type Snap<'a> = Snapshot<'a>;

self_cell!(
    /// A snapshot together with the store handle it borrows, so it can live in a Python object.
    struct SnapCell {
        owner: Arc<Inner>,
        #[covariant]
        dependent: Snap,
    }
);

/// Why `Store(...)` failed, built while the GIL is released.
enum Opening {
    Device(kura_engine::OpenError),
    Store(StoreError),
}

pub(crate) fn store_error(e: StoreError) -> PyErr {
    store_error_in(e, "")
}

/// The Python exception for `e`, its message led by `place` when there is one.
fn store_error_in(e: StoreError, place: &str) -> PyErr {
    let text = if place.is_empty() {
        e.to_string()
    } else {
        format!("{place}: {e}")
    };
    match e {
        StoreError::Corrupt { .. } => CorruptError::new_err(text),
        StoreError::NoSuperblock { .. } => CorruptError::new_err(format!(
            "{text} (not a kura store, or a damaged one; Store(spec, create=True) formats it)"
        )),
        StoreError::Full { .. } => FullError::new_err(text),
        StoreError::Refused(_) => RefusedError::new_err(text),
        StoreError::Device(_) => DeviceError::new_err(text),
        StoreError::Stopped(_) => StoppedError::new_err(text),
        StoreError::Invalid(_) => PyValueError::new_err(text),
        _ => Error::new_err(text),
    }
}

pub(crate) fn open_error(spec: &str, e: kura_engine::OpenError) -> PyErr {
    use kura_engine::OpenError;
    let text = format!("opening `{spec}`: {e}");
    match e {
        OpenError::Spec(_) | OpenError::Invalid(_) => PyValueError::new_err(text),
        OpenError::Locked { .. } => LockedError::new_err(text),
        // (errno, text, path) makes Python pick the subclass (FileNotFoundError, ...).
        OpenError::Os { path, errno } => PyOSError::new_err((errno.0, text, path)),
        _ => Error::new_err(text),
    }
}

/// A snapshot of the store, held by a `Snapshot` or a scan. `close` empties it.
struct View {
    snap: RwLock<Option<SnapCell>>,
}

impl View {
    /// Runs `f` on the store and the snapshot, unless the view was released or the store closed.
    fn with<R>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Inner, &Snapshot<'_>) -> Result<R, StoreError>,
    ) -> Result<R, Failure> {
        let cell = read(&self.snap);
        let cell = cell.as_ref().ok_or(Failure::Closed(what))?;
        Ok(f(cell.borrow_owner(), cell.borrow_dependent())?)
    }
}

impl Release for View {
    fn release(&self) {
        // Dropping the cell releases the snapshot in the store, then the store handle.
        drop(self.snap.write().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// What a `Store` and everything made from it share.
struct Shared {
    /// `None` once closed. Operations hold the read lock while they run, so `close` (which
    /// takes the write lock) waits for them and then owns the only handle.
    store: RwLock<Option<Arc<Inner>>>,
    /// Every snapshot and scan made from this store, released when it closes.
    views: Views<View>,
}

impl Shared {
    fn run<R>(&self, f: impl FnOnce(&Inner) -> Result<R, StoreError>) -> Result<R, Failure> {
        let store = read(&self.store);
        let store = store.as_ref().ok_or(Failure::Closed("store"))?;
        Ok(f(store)?)
    }

    /// A new snapshot of the store as it is now.
    fn view(&self) -> Result<Arc<View>, Failure> {
        // Registered under the read lock, so a concurrent close either sees this view or
        // finds the store already gone here.
        let store = read(&self.store);
        let store = store.as_ref().ok_or(Failure::Closed("store"))?;
        let view = Arc::new(View {
            snap: RwLock::new(Some(SnapCell::new(Arc::clone(store), |s| s.snapshot()))),
        });
        self.views.register(&view);
        Ok(view)
    }

    /// Releases every view, then syncs and closes the store. Closing twice does nothing.
    fn close(&self) -> Result<(), StoreError> {
        let mut store = self.store.write().unwrap_or_else(|p| p.into_inner());
        let Some(handle) = store.take() else {
            return Ok(());
        };
        self.views.release_all();
        match Arc::try_unwrap(handle) {
            Ok(handle) => handle.close(),
            // Every other handle lives in a view, all released above; should one remain, the
            // store still gets its sync, and closes when that handle goes.
            Err(handle) => handle.sync(),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // A Store that was never closed (garbage collected) still gets its final sync; there is
        // no caller left to tell of a failure.
        let _ = self.close();
    }
}

fn bytes<'py>(py: Python<'py>, b: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, b)
}

fn value_or<'py>(
    py: Python<'py>,
    value: Option<Vec<u8>>,
    default: Option<Bound<'py, PyAny>>,
) -> Bound<'py, PyAny> {
    match value {
        Some(v) => bytes(py, &v).into_any(),
        None => default.unwrap_or_else(|| py.None().into_bound(py)),
    }
}

/// A kura native key-value store on an engine device spec.
///
/// Store(spec, create=False, *, segment_size=None, inline_threshold=None,
///       max_group_bytes=None, memtable_bytes=None, l0_runs=None)
///
/// spec names the device, e.g. "file:/tmp/kv.img?size=256M" or "mem:64M" (see `kura specs`;
/// the engine's kinds). With create=True the device is formatted as an empty store (what it
/// held is lost); otherwise the store on it is opened and its log replayed. segment_size
/// (a power of two, 1 MiB to 1 GiB) and inline_threshold are fixed at create; the others
/// apply to this open: max_group_bytes bounds one group commit, memtable_bytes is the write
/// buffer flushed into sorted runs when full, l0_runs how many level-0 runs trigger a merge.
/// None keeps kura-store's default. A Store is a context manager: leaving the block closes it
/// (a final sync). One Store at a time may hold an image: a second one, in this or another
/// process, raises LockedError.
#[pyclass(module = "kura", frozen)]
struct Store {
    shared: Arc<Shared>,
    spec: String,
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (
        spec, create=false, *, segment_size=None, inline_threshold=None, max_group_bytes=None,
        memtable_bytes=None, l0_runs=None
    ))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
    fn new(
        py: Python<'_>,
        spec: String,
        create: bool,
        segment_size: Option<u64>,
        inline_threshold: Option<u32>,
        max_group_bytes: Option<usize>,
        memtable_bytes: Option<usize>,
        l0_runs: Option<usize>,
    ) -> PyResult<Self> {
        let mut opts = StoreOptions::default();
        if let Some(size) = segment_size {
            if !size.is_power_of_two() {
                return Err(PyValueError::new_err(format!(
                    "segment_size {size} is not a power of two"
                )));
            }
            opts.segment_shift = size.trailing_zeros();
        }
        if let Some(t) = inline_threshold {
            opts.inline_threshold = t;
        }
        if let Some(m) = max_group_bytes {
            opts.max_group_bytes = m;
        }
        if let Some(m) = memtable_bytes {
            opts.memtable_bytes = m;
        }
        if let Some(n) = l0_runs {
            opts.l0_runs = n;
        }
        if !create && (segment_size.is_some() || inline_threshold.is_some()) {
            return Err(PyValueError::new_err(
                "segment_size and inline_threshold are fixed when a store is created: pass \
                 them with create=True",
            ));
        }
        let opened = py.detach(|| {
            let dev = kura_engine::open(&spec).map_err(Opening::Device)?;
            if create {
                Inner::create(dev, &opts)
            } else {
                Inner::open_with(dev, &opts)
            }
            .map_err(Opening::Store)
        });
        let opened = opened.map_err(|e| match e {
            Opening::Device(e) => open_error(&spec, e),
            Opening::Store(e) => store_error_in(e, &format!("the store on `{spec}`")),
        })?;
        Ok(Store {
            shared: Arc::new(Shared {
                store: RwLock::new(Some(Arc::new(opened))),
                views: Views::new(),
            }),
            spec,
        })
    }

    /// put(key, value, sync=False): stores value under key (both bytes). With sync=True it
    /// returns once the write is durable.
    #[pyo3(signature = (key, value, sync=false))]
    fn put(&self, py: Python<'_>, key: &[u8], value: &[u8], sync: bool) -> PyResult<()> {
        let shared = &self.shared;
        Ok(py.detach(|| shared.run(|s| s.put(key, value, sync)))?)
    }

    /// get(key, default=None): the value of key, or default when the key is absent.
    #[pyo3(signature = (key, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let shared = &self.shared;
        let value = py.detach(|| shared.run(|s| s.get(key)))?;
        Ok(value_or(py, value, default))
    }

    /// delete(key, sync=False): removes key (absent keys are fine).
    #[pyo3(signature = (key, sync=false))]
    fn delete(&self, py: Python<'_>, key: &[u8], sync: bool) -> PyResult<()> {
        let shared = &self.shared;
        Ok(py.detach(|| shared.run(|s| s.delete(key, sync)))?)
    }

    fn __getitem__<'py>(&self, py: Python<'py>, key: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let shared = &self.shared;
        match py.detach(|| shared.run(|s| s.get(key)))? {
            Some(v) => Ok(bytes(py, &v)),
            None => Err(PyKeyError::new_err(bytes(py, key).unbind())),
        }
    }

    fn __setitem__(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<()> {
        self.put(py, key, value, false)
    }

    /// del store[key]: KeyError when the key is absent at the time of the call (a look-up and
    /// a delete, not one atomic step).
    fn __delitem__(&self, py: Python<'_>, key: &[u8]) -> PyResult<()> {
        let shared = &self.shared;
        let found = py.detach(|| {
            shared.run(|s| {
                if s.get(key)?.is_none() {
                    return Ok(false);
                }
                s.delete(key, false)?;
                Ok(true)
            })
        })?;
        if !found {
            return Err(PyKeyError::new_err(bytes(py, key).unbind()));
        }
        Ok(())
    }

    fn __contains__(&self, py: Python<'_>, key: &[u8]) -> PyResult<bool> {
        let shared = &self.shared;
        Ok(py.detach(|| shared.run(|s| s.get(key)))?.is_some())
    }

    /// write(batch, sync=False): applies a WriteBatch atomically (all its operations or none,
    /// also across a crash) and empties the batch.
    #[pyo3(signature = (batch, sync=false))]
    fn write(&self, py: Python<'_>, batch: &Bound<'_, WriteBatch>, sync: bool) -> PyResult<()> {
        let ops = std::mem::take(&mut *lock(&batch.get().ops));
        let shared = &self.shared;
        Ok(py.detach(|| shared.run(|s| s.write(ops, sync)))?)
    }

    /// write_batch(sync=False): a WriteBatch for a with-block, written atomically to this store
    /// when the block ends normally (with sync as in write), dropped when it raises.
    #[pyo3(signature = (sync=false))]
    fn write_batch(&self, sync: bool) -> WriteBatch {
        WriteBatch {
            ops: Mutex::new(store::WriteBatch::new()),
            target: Some((Arc::clone(&self.shared), sync)),
        }
    }

    /// snapshot(): a Snapshot, a consistent read-only view of the store as it is now, kept
    /// until it is closed (or its with-block ends, or the store closes).
    fn snapshot(&self, py: Python<'_>) -> PyResult<SnapshotView> {
        let shared = &self.shared;
        let view = py.detach(|| shared.view())?;
        Ok(SnapshotView {
            shared: Arc::clone(&self.shared),
            view,
        })
    }

    /// scan(start=None, end=None, reverse=False, limit=None): an iterator of (key, value)
    /// pairs with start <= key < end (None is open), in key order or, with reverse=True, from
    /// the largest key down; at most limit pairs. It sees the store as it was when scan was
    /// called (it holds a snapshot until exhausted) and fetches pairs a page at a time.
    #[pyo3(signature = (start=None, end=None, reverse=false, limit=None))]
    fn scan(
        &self,
        py: Python<'_>,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: Option<usize>,
    ) -> PyResult<Scan> {
        let shared = &self.shared;
        let view = py.detach(|| shared.view())?;
        Ok(Scan::new(
            &self.shared,
            view,
            true,
            start,
            end,
            reverse,
            limit,
        ))
    }

    /// sync(): makes every write so far durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let shared = &self.shared;
        Ok(py.detach(|| shared.run(|s| s.sync()))?)
    }

    /// compact(): flushes the write buffer and merges every sorted run into one level,
    /// dropping versions no live snapshot needs and every tombstone, and frees the space of
    /// the runs it replaced.
    fn compact(&self, py: Python<'_>) -> PyResult<()> {
        let shared = &self.shared;
        Ok(py.detach(|| shared.run(|s| s.compact()))?)
    }

    /// stats(): counters since open and the store's shape now, as a dict: batches (writes, a
    /// put being a batch of one), groups (log frames: group commits), syncs (device flushes),
    /// replayed_frames (log frames replayed at open), memtable_keys, memtable_versions and
    /// memtable_bytes (the write buffer: live keys, versions held including older ones
    /// snapshots need, approximate bytes), flushes (write buffer into level-0 runs),
    /// compactions, runs_per_level (a list, level 0 first), user_bytes (encoded bytes of the
    /// operations written), log_bytes_written, run_bytes_written, manifest_bytes_written,
    /// write_amplification (device bytes per user byte), slots_used and slot_count (segment
    /// slots in use and on the device).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let shared = &self.shared;
        let stats = py.detach(|| shared.run(|s| Ok(s.stats())))?;
        let d = PyDict::new(py);
        d.set_item("batches", stats.batches)?;
        d.set_item("groups", stats.groups)?;
        d.set_item("syncs", stats.syncs)?;
        d.set_item("replayed_frames", stats.replayed_frames)?;
        d.set_item("memtable_keys", stats.memtable_keys)?;
        d.set_item("memtable_versions", stats.memtable_versions)?;
        d.set_item("memtable_bytes", stats.memtable_bytes)?;
        d.set_item("flushes", stats.flushes)?;
        d.set_item("compactions", stats.compactions)?;
        d.set_item("runs_per_level", stats.runs_per_level.to_vec())?;
        d.set_item("user_bytes", stats.user_bytes)?;
        d.set_item("log_bytes_written", stats.log_bytes_written)?;
        d.set_item("run_bytes_written", stats.run_bytes_written)?;
        d.set_item("manifest_bytes_written", stats.manifest_bytes_written)?;
        d.set_item("write_amplification", stats.write_amplification())?;
        d.set_item("slots_used", stats.slots_used)?;
        d.set_item("slot_count", stats.slot_count)?;
        Ok(d)
    }

    /// A superblock copy found damaged at open (the other copy was used), or None.
    #[getter]
    fn damage(&self) -> PyResult<Option<String>> {
        Ok(self.shared.run(|s| Ok(s.damage().map(str::to_string)))?)
    }

    /// The device spec the store was opened on.
    #[getter]
    fn spec(&self) -> &str {
        &self.spec
    }

    /// True once close() was called.
    #[getter]
    fn closed(&self) -> bool {
        read(&self.shared.store).is_none()
    }

    /// close(): releases every snapshot and scan of this store, makes every write durable and
    /// closes the device (its lock goes with it). Closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let shared = &self.shared;
        py.detach(|| shared.close()).map_err(store_error)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { " (closed)" } else { "" };
        format!("kura.Store({:?}){state}", self.spec)
    }
}

/// Operations to apply together with Store.write(batch): all of them or none.
///
/// WriteBatch() starts empty; put(key, value) and delete(key) add to it in order (a later
/// operation on a key wins). Store.write empties it (also when the write fails).
///
/// Store.write_batch(sync=False) makes one bound to its store for a with-block: the batch is
/// written when the block ends normally and dropped when it raises.
#[pyclass(module = "kura", name = "WriteBatch", frozen)]
struct WriteBatch {
    ops: Mutex<store::WriteBatch>,
    /// The store a with-block writes to and its sync flag (Store.write_batch).
    target: Option<(Arc<Shared>, bool)>,
}

#[pymethods]
impl WriteBatch {
    #[new]
    fn new() -> Self {
        WriteBatch {
            ops: Mutex::new(store::WriteBatch::new()),
            target: None,
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().target.is_none() {
            return Err(PyTypeError::new_err(
                "this WriteBatch belongs to no store: use `with store.write_batch() as b:` or \
                 store.write(batch)",
            ));
        }
        Ok(slf)
    }

    /// Writes the batch when the with-block ended without an exception; drops it otherwise.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let ops = std::mem::take(&mut *lock(&self.ops));
        if let (None, Some((shared, sync))) = (exc_type, &self.target) {
            py.detach(|| shared.run(|s| s.write(ops, *sync)))?;
        }
        Ok(false)
    }

    /// put(key, value): stores value under key when the batch is written.
    fn put(&self, key: &[u8], value: &[u8]) {
        lock(&self.ops).put(key, value);
    }

    /// delete(key): removes key when the batch is written.
    fn delete(&self, key: &[u8]) {
        lock(&self.ops).delete(key);
    }

    /// clear(): drops every operation.
    fn clear(&self) {
        *lock(&self.ops) = store::WriteBatch::new();
    }

    fn __len__(&self) -> usize {
        lock(&self.ops).len()
    }

    fn __repr__(&self) -> String {
        format!("kura.WriteBatch(<{} ops>)", self.__len__())
    }
}

/// A consistent read-only view of a Store, from Store.snapshot().
///
/// get and scan see the store as it was when the snapshot was taken, whatever is written
/// since. It keeps the versions it sees in memory until close() (or the end of its with-block,
/// or the store's close); using it after that raises ClosedError.
#[pyclass(module = "kura", name = "Snapshot", frozen)]
struct SnapshotView {
    shared: Arc<Shared>,
    view: Arc<View>,
}

#[pymethods]
impl SnapshotView {
    /// get(key, default=None): the value key had when the snapshot was taken, or default.
    #[pyo3(signature = (key, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = &self.view;
        let value = py.detach(|| view.with("snapshot", |s, snap| s.get_at(snap, key)))?;
        Ok(value_or(py, value, default))
    }

    /// scan(start=None, end=None, reverse=False, limit=None): Store.scan as of the snapshot.
    #[pyo3(signature = (start=None, end=None, reverse=false, limit=None))]
    fn scan(
        &self,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: Option<usize>,
    ) -> PyResult<Scan> {
        if read(&self.view.snap).is_none() {
            return Err(Failure::Closed("snapshot").into());
        }
        Ok(Scan::new(
            &self.shared,
            Arc::clone(&self.view),
            false,
            start,
            end,
            reverse,
            limit,
        ))
    }

    fn __contains__(&self, py: Python<'_>, key: &[u8]) -> PyResult<bool> {
        let view = &self.view;
        Ok(py
            .detach(|| view.with("snapshot", |s, snap| s.get_at(snap, key)))?
            .is_some())
    }

    /// close(): releases the snapshot. Closing again does nothing.
    fn close(&self) {
        self.view.release();
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }
}

/// Where a scan stands: the bounds still to cover and the pairs fetched but not yet returned.
struct ScanState {
    start: Option<Vec<u8>>,
    end: Option<Vec<u8>>,
    left: Option<usize>,
    page: VecDeque<Pair>,
    /// The store has no more pairs in the bounds.
    drained: bool,
}

/// An iterator of (key, value) pairs, from Store.scan or Snapshot.scan.
#[pyclass(module = "kura", name = "Scan", frozen)]
struct Scan {
    /// Keeps the store's shared state (and its registry of views) alive while iterating.
    _shared: Arc<Shared>,
    view: Arc<View>,
    /// The scan made its own snapshot (Store.scan) and releases it when done.
    owns_view: bool,
    reverse: bool,
    state: Mutex<ScanState>,
}

impl Scan {
    fn new(
        shared: &Arc<Shared>,
        view: Arc<View>,
        owns_view: bool,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: Option<usize>,
    ) -> Scan {
        Scan {
            _shared: Arc::clone(shared),
            view,
            owns_view,
            reverse,
            state: Mutex::new(ScanState {
                start,
                end,
                left: limit,
                page: VecDeque::new(),
                drained: false,
            }),
        }
    }

    /// Fetches the next page into `st`, narrowing the bounds past it.
    fn fetch(&self, st: &mut ScanState) -> Result<(), Failure> {
        let want = st.left.map_or(SCAN_PAGE, |l| l.min(SCAN_PAGE));
        let reverse = self.reverse;
        let pairs = self.view.with("scan's snapshot", |s, snap| {
            s.scan_at(snap, st.start.as_deref(), st.end.as_deref(), want, reverse)
        })?;
        if pairs.len() < want {
            st.drained = true;
        }
        if let Some((last, _)) = pairs.last() {
            if reverse {
                st.end = Some(last.clone());
            } else {
                // The smallest key after `last`.
                let mut next = last.clone();
                next.push(0);
                st.start = Some(next);
            }
        }
        st.page.extend(pairs);
        Ok(())
    }
}

#[pymethods]
impl Scan {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
        let next = py.detach(|| -> Result<Option<Pair>, Failure> {
            let mut st = lock(&self.state);
            if st.left == Some(0) {
                return Ok(None);
            }
            if st.page.is_empty() {
                if st.drained {
                    return Ok(None);
                }
                self.fetch(&mut st)?;
            } else if read(&self.view.snap).is_none() {
                // Pairs already fetched are not handed out past a close either.
                return Err(Failure::Closed("scan's snapshot"));
            }
            let pair = st.page.pop_front();
            if pair.is_some() {
                if let Some(left) = &mut st.left {
                    *left -= 1;
                }
            }
            Ok(pair)
        })?;
        match next {
            Some((k, v)) => Ok(Some((bytes(py, &k), bytes(py, &v)))),
            None => {
                if self.owns_view {
                    // Done: the snapshot need not pin old versions any longer.
                    self.view.release();
                }
                Ok(None)
            }
        }
    }
}

/// Whether this build has the LevelDB engine (kura.DB(..., engine="leveldb")); without it
/// (libleveldb-dev missing when the module was built) such a DB raises UnavailableError.
#[pyfunction]
fn leveldb_available() -> bool {
    kura_kv::leveldb_available()
}

/// kura's key-value stores from Python: DB (plyvel's API over Google LevelDB or kura's native
/// store) and Store (the native store's own API, with stats and compaction). See help(kura.DB).
#[pymodule]
fn kura(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<db::PyDb>()?;
    m.add_class::<db::PyWriteBatch>()?;
    m.add_class::<db::PySnapshot>()?;
    m.add_class::<db::PyIterator>()?;
    m.add_function(wrap_pyfunction!(leveldb_available, m)?)?;
    m.add_class::<Store>()?;
    m.add_class::<WriteBatch>()?;
    m.add_class::<SnapshotView>()?;
    m.add_class::<Scan>()?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("CorruptError", py.get_type::<CorruptError>())?;
    // plyvel's name for it.
    m.add("CorruptionError", py.get_type::<CorruptError>())?;
    m.add("FullError", py.get_type::<FullError>())?;
    m.add("RefusedError", py.get_type::<RefusedError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    // plyvel's name for it (kura.IOError, not the builtin).
    m.add("IOError", py.get_type::<DeviceError>())?;
    m.add("StoppedError", py.get_type::<StoppedError>())?;
    m.add("LockedError", py.get_type::<LockedError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("UnavailableError", py.get_type::<UnavailableError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    Ok(())
}
