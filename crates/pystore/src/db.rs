//! `kura.DB`: one plyvel-shaped Python API over both of kura's key-value engines — Google
//! LevelDB (kura-kv; a host directory, or a directory inside the AccelFS on a device) and the
//! native store (kura-store; the raw device). This module owns that API: how a `DB`, its write
//! batches, snapshots and iterators behave from Python, how plyvel's iterator bounds (start/stop
//! with include flags, prefix, reverse) become engine scans, and which exception each engine
//! error becomes. The engines themselves are their crates'.
//!
//! Two engine facts shape it. kura-kv's snapshots borrow the database and are not `Send`, while
//! a Python object may be used and dropped on any thread: each LevelDB `DB` therefore has a
//! keeper thread that owns its snapshots and serves reads at them (one channel round trip per
//! call or iterator page). And kura-kv scans forward only: a reverse LevelDB iterator first
//! walks its range forward once, remembering where each page starts (one key per page, so
//! memory stays bounded), then reads the pages again from the last one down, each backwards.

use crate::views::{lock, read, Release, Views};
use crate::{bytes, value_or};
use crate::{
    ClosedError, CorruptError, DeviceError, Error, FullError, LockedError, NotFoundError,
    UnavailableError,
};
use kura_accelfs::{FileSystem, MountOptions};
use kura_engine::BlockingIo;
use kura_kv::{DbOptions, KvError, Location};
use pyo3::exceptions::{PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use self_cell::self_cell;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use store::{Pair, StoreError, StoreOptions};

/// Pairs fetched per iterator page.
const PAGE: usize = 512;

/// Bytes at the start of a native device holding its two superblock copies: all zero means a
/// blank device, which `create_if_missing` may format.
const SUPERBLOCK_AREA: usize = 2 * 4096;

/// Why an operation did not run or failed, built while the GIL is released.
pub(crate) enum Failure {
    Closed(&'static str),
    Kv(KvError),
    Store(StoreError),
    Open(String, kura_engine::OpenError),
    /// The device holds no database and `create_if_missing` is off, or one where
    /// `error_if_exists` is on (the message says which).
    NotFound(String),
    Exists(String),
    Invalid(String),
}

impl From<KvError> for Failure {
    fn from(e: KvError) -> Self {
        Failure::Kv(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::Closed(what) => ClosedError::new_err(format!("the {what} is closed")),
            Failure::Kv(e) => kv_error(e),
            Failure::Store(e) => crate::store_error(e),
            Failure::Open(spec, e) => crate::open_error(&spec, e),
            Failure::NotFound(msg) => NotFoundError::new_err(msg),
            Failure::Exists(msg) => Error::new_err(msg),
            Failure::Invalid(msg) => PyValueError::new_err(msg),
        }
    }
}

fn kv_error(e: KvError) -> PyErr {
    let text = e.to_string();
    match e {
        KvError::Corruption(_) => CorruptError::new_err(text),
        KvError::NotFound(_) => NotFoundError::new_err(text),
        KvError::Locked(_) => LockedError::new_err(text),
        KvError::NoSpace(_) => FullError::new_err(text),
        KvError::Io(_) | KvError::Fs(_) => DeviceError::new_err(text),
        // LevelDB reports error_if_exists as an invalid argument; plyvel raises its Error.
        KvError::Invalid(m) if m.contains("error_if_exists") => Error::new_err(text),
        KvError::Invalid(_) => PyValueError::new_err(text),
        KvError::OutOfMemory(_) => PyMemoryError::new_err(text),
        KvError::Unavailable(_) => UnavailableError::new_err(text),
        _ => Error::new_err(text),
    }
}

/// A request to a LevelDB database's keeper thread.
enum Ask {
    Take(Sender<Result<u64, KvError>>),
    Get(u64, Vec<u8>, Sender<Result<Option<Vec<u8>>, Failure>>),
    Scan {
        id: u64,
        from: Vec<u8>,
        to: Option<Vec<u8>>,
        limit: usize,
        reply: Sender<Result<Vec<Pair>, Failure>>,
    },
    Release(u64),
    Stop,
}

/// Serves `asks` until told to stop: takes, reads at and releases snapshots of `db`, which
/// never leave this thread.
fn keep(db: Arc<kura_kv::Db>, asks: Receiver<Ask>) {
    let mut snaps: HashMap<u64, kura_kv::Snapshot<'_>> = HashMap::new();
    let mut next = 0;
    let released = || Failure::Closed("snapshot");
    for ask in asks.iter() {
        match ask {
            Ask::Take(reply) => {
                let taken = db.snapshot().map(|s| {
                    next += 1;
                    snaps.insert(next, s);
                    next
                });
                let _ = reply.send(taken);
            }
            Ask::Get(id, key, reply) => {
                let got = match snaps.get(&id) {
                    Some(s) => db.get_at(s, &key).map_err(Failure::Kv),
                    None => Err(released()),
                };
                let _ = reply.send(got);
            }
            Ask::Scan {
                id,
                from,
                to,
                limit,
                reply,
            } => {
                let got = match snaps.get(&id) {
                    Some(s) => db
                        .scan_at(s, &from, to.as_deref(), limit)
                        .map_err(Failure::Kv),
                    None => Err(released()),
                };
                let _ = reply.send(got);
            }
            Ask::Release(id) => {
                snaps.remove(&id);
            }
            Ask::Stop => break,
        }
    }
}

/// The keeper thread of one LevelDB database.
struct Keeper {
    asks: Sender<Ask>,
    thread: JoinHandle<()>,
}

impl Keeper {
    /// Asks and waits for the answer; a stopped keeper means the database closed.
    fn ask<R>(asks: &Sender<Ask>, make: impl FnOnce(Sender<R>) -> Ask) -> Result<R, Failure> {
        let (tx, rx) = channel();
        asks.send(make(tx))
            .map_err(|_| Failure::Closed("database"))?;
        rx.recv().map_err(|_| Failure::Closed("database"))
    }

    /// Releases every snapshot and ends the thread (and its handle on the database).
    fn stop(self) {
        let _ = self.asks.send(Ask::Stop);
        let _ = self.thread.join();
    }
}

/// An open engine.
enum Engine {
    Native(Arc<store::Store>),
    Level {
        db: Arc<kura_kv::Db>,
        keeper: Keeper,
        /// The AccelFS this DB mounted (dev=SPEC), unmounted after the database closes.
        fs: Option<FileSystem>,
    },
}

impl Engine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Failure> {
        Ok(match self {
            Engine::Native(s) => s.get(key)?,
            Engine::Level { db, .. } => db.get(key)?,
        })
    }

    fn put(&self, key: &[u8], value: &[u8], sync: bool) -> Result<(), Failure> {
        match self {
            Engine::Native(s) => s.put(key, value, sync)?,
            Engine::Level { db, .. } if sync => db.put_sync(key, value)?,
            Engine::Level { db, .. } => db.put(key, value)?,
        }
        Ok(())
    }

    fn delete(&self, key: &[u8], sync: bool) -> Result<(), Failure> {
        match self {
            Engine::Native(s) => s.delete(key, sync)?,
            Engine::Level { db, .. } if sync => {
                let mut b = kura_kv::WriteBatch::new();
                b.delete(key);
                db.write(b, true)?
            }
            Engine::Level { db, .. } => db.delete(key)?,
        }
        Ok(())
    }

    fn write(&self, ops: Vec<Op>, sync: bool) -> Result<(), Failure> {
        match self {
            Engine::Native(s) => {
                let mut b = store::WriteBatch::new();
                for (k, v) in &ops {
                    match v {
                        Some(v) => b.put(k, v),
                        None => b.delete(k),
                    }
                }
                s.write(b, sync)?
            }
            Engine::Level { db, .. } => {
                let mut b = kura_kv::WriteBatch::new();
                for (k, v) in &ops {
                    match v {
                        Some(v) => b.put(k, v),
                        None => b.delete(k),
                    }
                }
                db.write(b, sync)?
            }
        }
        Ok(())
    }

    fn snapshot(&self) -> Result<Snap, Failure> {
        match self {
            Engine::Native(s) => Ok(Snap::Native(NativeSnap::new(Arc::clone(s), |s| {
                s.snapshot()
            }))),
            Engine::Level { keeper, .. } => {
                let id = Keeper::ask(&keeper.asks, Ask::Take)??;
                Ok(Snap::Level(LevelSnap {
                    id,
                    asks: keeper.asks.clone(),
                }))
            }
        }
    }

    /// Syncs and closes; the snapshots were released before.
    fn close(self) -> Result<(), Failure> {
        match self {
            Engine::Native(s) => match Arc::try_unwrap(s) {
                Ok(s) => s.close()?,
                // A handle somewhere else still: the store closes when it goes, synced now.
                Err(s) => s.sync()?,
            },
            Engine::Level { db, keeper, fs } => {
                keeper.stop();
                let closed = match Arc::try_unwrap(db) {
                    Ok(db) => db.close(),
                    // Only the keeper held another handle, and it has stopped.
                    Err(_) => Ok(()),
                };
                if let Some(fs) = fs {
                    fs.unmount().map_err(KvError::from)?;
                }
                closed?;
            }
        }
        Ok(())
    }
}

self_cell!(
    /// A native snapshot together with the store handle it borrows.
    struct NativeSnap {
        owner: Arc<store::Store>,
        #[covariant]
        dependent: NativeSnapshot,
    }
);

type NativeSnapshot<'a> = store::Snapshot<'a>;

/// A LevelDB snapshot held by the keeper thread, released there when this goes.
struct LevelSnap {
    id: u64,
    asks: Sender<Ask>,
}

impl Drop for LevelSnap {
    fn drop(&mut self) {
        // After close the keeper is gone, and with it every snapshot.
        let _ = self.asks.send(Ask::Release(self.id));
    }
}

enum Snap {
    Native(NativeSnap),
    Level(LevelSnap),
}

/// A snapshot used by a `DBSnapshot` or an iterator; `release` empties it.
struct View {
    snap: RwLock<Option<Snap>>,
}

impl View {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Failure> {
        let snap = read(&self.snap);
        match snap.as_ref().ok_or(Failure::Closed("snapshot"))? {
            Snap::Native(c) => Ok(c.borrow_owner().get_at(c.borrow_dependent(), key)?),
            Snap::Level(l) => Keeper::ask(&l.asks, |r| Ask::Get(l.id, key.to_vec(), r))?,
        }
    }

    /// Whether `scan` can go backwards (the native store can; kura-kv scans forward only).
    fn reverses(&self) -> bool {
        matches!(*read(&self.snap), Some(Snap::Native(_)))
    }

    /// Up to `limit` pairs with `from <= key < to`, from the largest down with `reverse`
    /// (native only).
    fn scan(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<Vec<Pair>, Failure> {
        let snap = read(&self.snap);
        match snap
            .as_ref()
            .ok_or(Failure::Closed("iterator's snapshot"))?
        {
            Snap::Native(c) => Ok(c.borrow_owner().scan_at(
                c.borrow_dependent(),
                Some(from),
                to,
                limit,
                reverse,
            )?),
            Snap::Level(l) => Keeper::ask(&l.asks, |reply| Ask::Scan {
                id: l.id,
                from: from.to_vec(),
                to: to.map(<[u8]>::to_vec),
                limit,
                reply,
            })?,
        }
    }
}

impl Release for View {
    fn release(&self) {
        drop(self.snap.write().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// What a `DB` and everything made from it share.
struct Shared {
    /// `None` once closed; calls hold the read lock while they run, so close waits for them.
    engine: RwLock<Option<Engine>>,
    views: Views<View>,
}

impl Shared {
    fn run<R>(&self, f: impl FnOnce(&Engine) -> Result<R, Failure>) -> Result<R, Failure> {
        let engine = read(&self.engine);
        f(engine.as_ref().ok_or(Failure::Closed("database"))?)
    }

    fn view(&self) -> Result<Arc<View>, Failure> {
        let engine = read(&self.engine);
        let engine = engine.as_ref().ok_or(Failure::Closed("database"))?;
        let view = Arc::new(View {
            snap: RwLock::new(Some(engine.snapshot()?)),
        });
        self.views.register(&view);
        Ok(view)
    }

    /// Releases every snapshot and iterator, then syncs and closes. Twice does nothing.
    fn close(&self) -> Result<(), Failure> {
        let mut engine = self.engine.write().unwrap_or_else(|p| p.into_inner());
        let Some(open) = engine.take() else {
            return Ok(());
        };
        self.views.release_all();
        open.close()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // A DB garbage-collected without close() still syncs and lets go of its lock.
        let _ = self.close();
    }
}

/// A put (`Some` value) or a delete.
type Op = (Vec<u8>, Option<Vec<u8>>);

/// Options of `DB(...)` beyond the named ones, by engine.
struct Options {
    error_if_exists: bool,
    level: DbOptions,
    native: StoreOptions,
    segment_size: Option<u64>,
}

fn parse_options(engine: &str, given: Option<&Bound<'_, PyDict>>) -> PyResult<Options> {
    let mut o = Options {
        error_if_exists: false,
        level: DbOptions::default(),
        native: StoreOptions::default(),
        segment_size: None,
    };
    let Some(given) = given else {
        return Ok(o);
    };
    for (name, value) in given.iter() {
        let name: String = name.extract()?;
        match (engine, name.as_str()) {
            (_, "error_if_exists") => o.error_if_exists = value.extract()?,
            ("leveldb", "paranoid_checks") => o.level.paranoid_checks = value.extract()?,
            ("leveldb", "write_buffer_size") => o.level.write_buffer_bytes = value.extract()?,
            ("leveldb", "lru_cache_size") => o.level.block_cache_bytes = value.extract()?,
            ("leveldb", "bloom_filter_bits") => o.level.bloom_bits = value.extract()?,
            ("leveldb", "compression") => {
                let c: Option<String> = value.extract()?;
                o.level.compression = match c.as_deref() {
                    Some("snappy") => true,
                    None => false,
                    Some(other) => {
                        return Err(PyValueError::new_err(format!(
                            "compression must be 'snappy' or None, not {other:?}"
                        )))
                    }
                };
            }
            ("native", "write_buffer_size") => o.native.memtable_bytes = value.extract()?,
            ("native", "segment_size") => {
                let size: u64 = value.extract()?;
                if !size.is_power_of_two() {
                    return Err(PyValueError::new_err(format!(
                        "segment_size {size} is not a power of two"
                    )));
                }
                o.native.segment_shift = size.trailing_zeros();
                o.segment_size = Some(size);
            }
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "DB() got an unexpected keyword argument {name:?} for engine {engine:?} \
                     (leveldb takes error_if_exists, paranoid_checks, write_buffer_size, \
                     lru_cache_size, bloom_filter_bits, compression; native takes \
                     error_if_exists, write_buffer_size, segment_size)"
                )))
            }
        }
    }
    Ok(o)
}

fn open_level(name: &str, dev: Option<&str>, create: bool, o: &Options) -> Result<Engine, Failure> {
    let opts = DbOptions {
        create_if_missing: create,
        error_if_exists: o.error_if_exists,
        ..o.level
    };
    let mut fs = None;
    let location = match dev {
        None => {
            // LevelDB makes the directory and its LOCK before it finds no database there: look
            // first, so a mistyped path is left alone.
            if !create && kura_kv::leveldb_available() && !Path::new(name).join("CURRENT").exists()
            {
                return Err(Failure::NotFound(format!(
                    "no LevelDB database in `{name}` (create_if_missing=True creates one)"
                )));
            }
            Location::Dir(name.into())
        }
        Some(spec) => {
            // Mounted here rather than by kura-kv (Location::Device), which reports a device
            // that fails to open as an invalid argument: here a locked image is a LockedError
            // and a missing one an OSError.
            let device = kura_engine::open(spec).map_err(|e| Failure::Open(spec.into(), e))?;
            let mounted = FileSystem::mount(
                device,
                MountOptions {
                    cache_bytes: opts.fs_cache_bytes,
                    ..MountOptions::default()
                },
            )
            .map_err(|e| Failure::Kv(e.into()))?;
            if !create
                && mounted
                    .metadata(&format!("{}/CURRENT", name.trim_end_matches('/')))
                    .is_err()
            {
                let _ = mounted.unmount();
                return Err(Failure::NotFound(format!(
                    "no LevelDB database in `{name}` on `{spec}` (create_if_missing=True creates one)"
                )));
            }
            fs = Some(mounted.clone());
            Location::AccelFs {
                fs: mounted,
                path: name.to_string(),
            }
        }
    };
    let db = match kura_kv::Db::open(location, &opts) {
        Ok(db) => Arc::new(db),
        Err(e) => {
            if let Some(fs) = fs {
                let _ = fs.unmount();
            }
            return Err(e.into());
        }
    };
    let (asks, rx) = channel();
    let kept = Arc::clone(&db);
    let thread = std::thread::Builder::new()
        .name("kura-leveldb-snapshots".into())
        .spawn(move || keep(kept, rx))
        .map_err(|e| Failure::Kv(KvError::Io(format!("starting the snapshot thread: {e}"))))?;
    Ok(Engine::Level {
        db,
        keeper: Keeper { asks, thread },
        fs,
    })
}

fn open_native(
    name: &str,
    dev: Option<&str>,
    create: bool,
    o: &Options,
) -> Result<Engine, Failure> {
    let Some(spec) = dev else {
        return Err(Failure::Invalid(
            "engine=\"native\" keeps its store on a raw device: pass dev=SPEC (and name \"/\")"
                .into(),
        ));
    };
    if name != "/" {
        return Err(Failure::Invalid(format!(
            "engine=\"native\": the store is the whole device `{spec}`, so name must be \"/\" \
             (not {name:?})"
        )));
    }
    let mut device = kura_engine::open(spec).map_err(|e| Failure::Open(spec.into(), e))?;
    let capacity = device.geometry().capacity_bytes();
    let blank = if capacity >= SUPERBLOCK_AREA as u64 {
        let mut head = vec![0u8; SUPERBLOCK_AREA];
        device
            .read_blocks(0, &mut head)
            .map_err(|e| Failure::Store(StoreError::Device(e)))?;
        head.iter().all(|&b| b == 0)
    } else {
        false
    };
    if blank {
        if !create {
            return Err(Failure::NotFound(format!(
                "`{spec}` is blank, no native store on it (create_if_missing=True formats it)"
            )));
        }
        return Ok(Engine::Native(Arc::new(store::Store::create(
            device, &o.native,
        )?)));
    }
    if o.segment_size.is_some() {
        return Err(Failure::Invalid(
            "segment_size is fixed when the store is created: it applies only to a blank device"
                .into(),
        ));
    }
    let s = store::Store::open_with(device, &o.native)?;
    if o.error_if_exists {
        let _ = s.close();
        return Err(Failure::Exists(format!(
            "`{spec}` already holds a native store (error_if_exists=True)"
        )));
    }
    Ok(Engine::Native(Arc::new(s)))
}

/// A key-value database with plyvel's API, on either of kura's engines.
///
/// DB(name, engine="leveldb", dev=None, create_if_missing=False, **options)
///
/// engine="leveldb" (the default, as in `kura kv`, so DB(path) opens what plyvel.DB(path)
/// does): Google LevelDB. name is a host directory (a LevelDB database that plyvel
/// and every other LevelDB program open), or, with dev=SPEC, a directory inside the AccelFS on
/// device SPEC (formatted with `kura mkfs`). engine="native": kura's native store, which takes
/// the whole raw device dev=SPEC; name must be "/" (as in `kura kv --engine native --dev SPEC
/// /`). create_if_missing=True creates the LevelDB database, or formats a native device whose
/// superblock area is blank (all zero; a device holding anything else is never formatted).
///
/// options: error_if_exists (both engines); leveldb: paranoid_checks, write_buffer_size,
/// lru_cache_size, bloom_filter_bits, compression ('snappy' or None); native:
/// write_buffer_size (its memtable), segment_size (a power of two, when formatting).
///
/// Keys and values are bytes. A DB is a context manager (the block's end closes it); close()
/// makes every write durable, releases every snapshot and iterator and lets go of the lock.
/// Iterators and snapshots keep their DB open while referenced.
///
/// Not (yet) of plyvel's API: iterator seek/prev/seek_to_start/seek_to_stop (iterators only
/// step forward in their direction), prefixed_db, get_property, compact_range,
/// approximate_size(s), WriteBatch.append, and the module functions destroy_db and repair_db.
#[pyclass(module = "kura", name = "DB", frozen)]
pub(crate) struct PyDb {
    shared: Arc<Shared>,
    name: String,
    engine: &'static str,
    dev: Option<String>,
}

#[pymethods]
impl PyDb {
    #[new]
    #[pyo3(signature = (name, engine="leveldb", dev=None, create_if_missing=false, **options))]
    fn new(
        py: Python<'_>,
        name: String,
        engine: &str,
        dev: Option<String>,
        create_if_missing: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let engine: &'static str = match engine {
            "leveldb" => "leveldb",
            "native" => "native",
            other => {
                return Err(PyValueError::new_err(format!(
                    "engine must be \"leveldb\" or \"native\", not {other:?}"
                )))
            }
        };
        let o = parse_options(engine, options)?;
        let opened = py.detach(|| match engine {
            "leveldb" => open_level(&name, dev.as_deref(), create_if_missing, &o),
            _ => open_native(&name, dev.as_deref(), create_if_missing, &o),
        })?;
        Ok(PyDb {
            shared: Arc::new(Shared {
                engine: RwLock::new(Some(opened)),
                views: Views::new(),
            }),
            name,
            engine,
            dev,
        })
    }

    /// get(key, default=None): the value of key, or default when it is absent.
    #[pyo3(signature = (key, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let shared = &self.shared;
        let value = py.detach(|| shared.run(|e| e.get(key)))?;
        Ok(value_or(py, value, default))
    }

    /// put(key, value, sync=False): stores value under key; with sync=True durably before it
    /// returns.
    #[pyo3(signature = (key, value, sync=false))]
    fn put(&self, py: Python<'_>, key: &[u8], value: &[u8], sync: bool) -> PyResult<()> {
        let shared = &self.shared;
        Ok(py.detach(|| shared.run(|e| e.put(key, value, sync)))?)
    }

    /// delete(key, sync=False): removes key (an absent key is fine).
    #[pyo3(signature = (key, sync=false))]
    fn delete(&self, py: Python<'_>, key: &[u8], sync: bool) -> PyResult<()> {
        let shared = &self.shared;
        Ok(py.detach(|| shared.run(|e| e.delete(key, sync)))?)
    }

    /// write_batch(transaction=False, sync=False): a DBWriteBatch; its put/delete are applied
    /// atomically by write() or at the end of a with-block. As in plyvel, a with-block's batch
    /// is written even when the block raises, unless transaction=True, which drops it then.
    #[pyo3(signature = (transaction=false, sync=false))]
    fn write_batch(&self, transaction: bool, sync: bool) -> PyWriteBatch {
        PyWriteBatch {
            shared: Arc::clone(&self.shared),
            ops: Mutex::new(Vec::new()),
            transaction,
            sync,
        }
    }

    /// iterator(reverse=False, start=None, stop=None, include_start=True, include_stop=False,
    /// prefix=None, include_key=True, include_value=True): an iterator over the database as it
    /// is now (it holds a snapshot until exhausted or closed), yielding (key, value) pairs, or
    /// keys or values alone, in key order or from the largest key down. start/stop bound the
    /// keys (start included and stop excluded unless the include flags say otherwise); prefix
    /// selects the keys that start with it and cannot be combined with start/stop.
    #[pyo3(signature = (reverse=false, start=None, stop=None, include_start=true,
        include_stop=false, prefix=None, include_key=true, include_value=true))]
    #[allow(clippy::too_many_arguments)] // plyvel's keyword arguments, one each
    fn iterator(
        &self,
        py: Python<'_>,
        reverse: bool,
        start: Option<Vec<u8>>,
        stop: Option<Vec<u8>>,
        include_start: bool,
        include_stop: bool,
        prefix: Option<Vec<u8>>,
        include_key: bool,
        include_value: bool,
    ) -> PyResult<PyIterator> {
        let bounds = Bounds::new(start, stop, include_start, include_stop, prefix)?;
        let yields = Yields::new(include_key, include_value)?;
        let shared = &self.shared;
        let view = py.detach(|| shared.view())?;
        Ok(PyIterator::new(
            &self.shared,
            view,
            true,
            reverse,
            bounds,
            yields,
        ))
    }

    /// snapshot(): a DBSnapshot, the database as it is now, for get() and iterator(); kept
    /// until closed (or its with-block ends, or the DB closes).
    fn snapshot(&self, py: Python<'_>) -> PyResult<PySnapshot> {
        let shared = &self.shared;
        let view = py.detach(|| shared.view())?;
        Ok(PySnapshot {
            shared: Arc::clone(&self.shared),
            view,
        })
    }

    /// close(): releases every snapshot and iterator, makes every write durable and closes
    /// the database (and the device or directory lock). Closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let shared = &self.shared;
        Ok(py.detach(|| shared.close())?)
    }

    /// True once close() was called.
    #[getter]
    fn closed(&self) -> bool {
        read(&self.shared.engine).is_none()
    }

    /// iter(db): db.iterator(), every (key, value) pair in key order.
    fn __iter__(&self, py: Python<'_>) -> PyResult<PyIterator> {
        self.iterator(py, false, None, None, true, false, None, true, true)
    }

    /// The name it was opened with.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// "leveldb" or "native".
    #[getter]
    fn engine(&self) -> &str {
        self.engine
    }

    /// The device spec, or None (a LevelDB database in a host directory).
    #[getter]
    fn dev(&self) -> Option<&str> {
        self.dev.as_deref()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let dev = self
            .dev
            .as_ref()
            .map(|d| format!(", dev={d:?}"))
            .unwrap_or_default();
        let state = if self.closed() { " (closed)" } else { "" };
        format!(
            "kura.DB({:?}, engine={:?}{dev}){state}",
            self.name, self.engine
        )
    }
}

/// Changes applied atomically, from DB.write_batch().
#[pyclass(module = "kura", name = "DBWriteBatch", frozen)]
pub(crate) struct PyWriteBatch {
    shared: Arc<Shared>,
    ops: Mutex<Vec<Op>>,
    transaction: bool,
    sync: bool,
}

#[pymethods]
impl PyWriteBatch {
    /// put(key, value): stores value under key when the batch is written.
    fn put(&self, key: Vec<u8>, value: Vec<u8>) {
        lock(&self.ops).push((key, Some(value)));
    }

    /// delete(key): removes key when the batch is written.
    fn delete(&self, key: Vec<u8>) {
        lock(&self.ops).push((key, None));
    }

    /// clear(): drops every change not yet written.
    fn clear(&self) {
        lock(&self.ops).clear();
    }

    /// write(): applies every change atomically and empties the batch (also on failure).
    fn write(&self, py: Python<'_>) -> PyResult<()> {
        let ops = std::mem::take(&mut *lock(&self.ops));
        if ops.is_empty() {
            return Ok(());
        }
        let (shared, sync) = (&self.shared, self.sync);
        Ok(py.detach(|| shared.run(|e| e.write(ops, sync)))?)
    }

    fn __len__(&self) -> usize {
        lock(&self.ops).len()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some() && self.transaction {
            self.clear();
        } else {
            self.write(py)?;
        }
        Ok(false)
    }
}

/// A consistent read-only view of a DB, from DB.snapshot().
#[pyclass(module = "kura", name = "DBSnapshot", frozen)]
pub(crate) struct PySnapshot {
    /// Keeps the DB open while the snapshot is referenced, as plyvel does.
    shared: Arc<Shared>,
    view: Arc<View>,
}

#[pymethods]
impl PySnapshot {
    /// get(key, default=None): the value key had when the snapshot was taken, or default.
    #[pyo3(signature = (key, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = &self.view;
        let value = py.detach(|| view.get(key))?;
        Ok(value_or(py, value, default))
    }

    /// iterator(...): DB.iterator's arguments, over the snapshot.
    #[pyo3(signature = (reverse=false, start=None, stop=None, include_start=true,
        include_stop=false, prefix=None, include_key=true, include_value=true))]
    #[allow(clippy::too_many_arguments)] // plyvel's keyword arguments, one each
    fn iterator(
        &self,
        reverse: bool,
        start: Option<Vec<u8>>,
        stop: Option<Vec<u8>>,
        include_start: bool,
        include_stop: bool,
        prefix: Option<Vec<u8>>,
        include_key: bool,
        include_value: bool,
    ) -> PyResult<PyIterator> {
        if read(&self.view.snap).is_none() {
            return Err(Failure::Closed("snapshot").into());
        }
        let bounds = Bounds::new(start, stop, include_start, include_stop, prefix)?;
        let yields = Yields::new(include_key, include_value)?;
        Ok(PyIterator::new(
            &self.shared,
            Arc::clone(&self.view),
            false,
            reverse,
            bounds,
            yields,
        ))
    }

    /// close(): releases the snapshot. Closing again does nothing.
    fn close(&self) {
        self.view.release();
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }
}

/// The keys an iterator covers: `lo <= key < hi` (no `hi`: to the end).
struct Bounds {
    lo: Vec<u8>,
    hi: Option<Vec<u8>>,
}

/// The smallest key after `k`.
fn after(k: &[u8]) -> Vec<u8> {
    let mut next = k.to_vec();
    next.push(0);
    next
}

impl Bounds {
    fn new(
        start: Option<Vec<u8>>,
        stop: Option<Vec<u8>>,
        include_start: bool,
        include_stop: bool,
        prefix: Option<Vec<u8>>,
    ) -> PyResult<Bounds> {
        if let Some(prefix) = prefix {
            if start.is_some() || stop.is_some() {
                return Err(PyTypeError::new_err(
                    "prefix cannot be combined with start or stop",
                ));
            }
            // The first key past every key with the prefix: drop trailing 0xff bytes, then
            // add one to the last byte. A prefix of only 0xff bytes runs to the end.
            let mut hi = prefix.clone();
            while hi.last() == Some(&0xff) {
                hi.pop();
            }
            let hi = match hi.last_mut() {
                Some(last) => {
                    *last += 1;
                    Some(hi)
                }
                None => None,
            };
            return Ok(Bounds { lo: prefix, hi });
        }
        let lo = match start {
            Some(s) if include_start => s,
            Some(s) => after(&s),
            None => Vec::new(),
        };
        let hi = stop.map(|s| if include_stop { after(&s) } else { s });
        Ok(Bounds { lo, hi })
    }
}

/// What each step of an iterator yields.
#[derive(Clone, Copy)]
enum Yields {
    Pairs,
    Keys,
    Values,
}

impl Yields {
    fn new(include_key: bool, include_value: bool) -> PyResult<Yields> {
        match (include_key, include_value) {
            (true, true) => Ok(Yields::Pairs),
            (true, false) => Ok(Yields::Keys),
            (false, true) => Ok(Yields::Values),
            (false, false) => Err(PyTypeError::new_err(
                "include_key and include_value cannot both be False",
            )),
        }
    }
}

/// Where an iterator stands.
struct IterState {
    bounds: Bounds,
    /// Fetched, in the order they are handed out.
    page: VecDeque<Pair>,
    drained: bool,
    /// A reverse iterator over a view that scans forward only: the first key of each page not
    /// yet fetched, `None` until the range was walked once.
    page_starts: Option<Vec<Vec<u8>>>,
}

/// An iterator from DB.iterator() or DBSnapshot.iterator().
#[pyclass(module = "kura", name = "DBIterator", frozen)]
pub(crate) struct PyIterator {
    /// Keeps the DB open while the iterator is referenced, as plyvel does.
    _shared: Arc<Shared>,
    view: Arc<View>,
    /// It took its own snapshot (DB.iterator) and releases it when done.
    owns_view: bool,
    reverse: bool,
    yields: Yields,
    state: Mutex<IterState>,
}

impl PyIterator {
    fn new(
        shared: &Arc<Shared>,
        view: Arc<View>,
        owns_view: bool,
        reverse: bool,
        bounds: Bounds,
        yields: Yields,
    ) -> Self {
        PyIterator {
            _shared: Arc::clone(shared),
            view,
            owns_view,
            reverse,
            yields,
            state: Mutex::new(IterState {
                bounds,
                page: VecDeque::new(),
                drained: false,
                page_starts: None,
            }),
        }
    }

    fn fetch(&self, st: &mut IterState) -> Result<(), Failure> {
        if st.bounds.hi.as_ref().is_some_and(|hi| st.bounds.lo >= *hi) {
            st.drained = true;
            return Ok(());
        }
        if !self.reverse {
            let pairs = self
                .view
                .scan(&st.bounds.lo, st.bounds.hi.as_deref(), PAGE, false)?;
            st.drained = pairs.len() < PAGE;
            if let Some((last, _)) = pairs.last() {
                st.bounds.lo = after(last);
            }
            st.page.extend(pairs);
        } else if self.view.reverses() {
            let pairs = self
                .view
                .scan(&st.bounds.lo, st.bounds.hi.as_deref(), PAGE, true)?;
            st.drained = pairs.len() < PAGE;
            if let Some((last, _)) = pairs.last() {
                st.bounds.hi = Some(last.clone());
            }
            st.page.extend(pairs);
        } else {
            self.fetch_backwards(st)?;
        }
        Ok(())
    }

    /// A reverse page from a view that scans forward only (see the module docs).
    fn fetch_backwards(&self, st: &mut IterState) -> Result<(), Failure> {
        let mut pairs = match st.page_starts.as_mut() {
            None => {
                let mut starts = Vec::new();
                let mut from = st.bounds.lo.clone();
                let mut last_page = Vec::new();
                loop {
                    let pairs = self
                        .view
                        .scan(&from, st.bounds.hi.as_deref(), PAGE, false)?;
                    let Some((first, _)) = pairs.first() else {
                        break;
                    };
                    starts.push(first.clone());
                    let full = pairs.len() == PAGE;
                    if let Some((last, _)) = pairs.last() {
                        from = after(last);
                    }
                    last_page = pairs;
                    if !full {
                        break;
                    }
                }
                starts.pop();
                st.page_starts = Some(starts);
                last_page
            }
            Some(starts) => match starts.pop() {
                Some(start) => self
                    .view
                    .scan(&start, st.bounds.hi.as_deref(), PAGE, false)?,
                None => Vec::new(),
            },
        };
        if let Some((first, _)) = pairs.first() {
            st.bounds.hi = Some(first.clone());
        }
        st.drained = !matches!(&st.page_starts, Some(starts) if !starts.is_empty());
        pairs.reverse();
        st.page.extend(pairs);
        Ok(())
    }
}

#[pymethods]
impl PyIterator {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let next = py.detach(|| -> Result<Option<Pair>, Failure> {
            let mut st = lock(&self.state);
            if st.page.is_empty() {
                if st.drained {
                    return Ok(None);
                }
                self.fetch(&mut st)?;
            } else if read(&self.view.snap).is_none() {
                // Pairs already fetched are not handed out past a close either.
                return Err(Failure::Closed("iterator's snapshot"));
            }
            Ok(st.page.pop_front())
        })?;
        let Some((k, v)) = next else {
            if self.owns_view {
                self.view.release();
            }
            return Ok(None);
        };
        Ok(Some(match self.yields {
            Yields::Pairs => (bytes(py, &k), bytes(py, &v)).into_pyobject(py)?.into_any(),
            Yields::Keys => bytes(py, &k).into_any(),
            Yields::Values => bytes(py, &v).into_any(),
        }))
    }

    /// close(): stops the iterator and releases its snapshot (DB.iterator's own).
    fn close(&self) {
        let mut st = lock(&self.state);
        st.page.clear();
        st.drained = true;
        if self.owns_view {
            self.view.release();
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }
}
