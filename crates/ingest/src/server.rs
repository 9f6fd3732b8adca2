//! `kura ingest serve`: many senders at once into one [`Store`], with bounded memory.
//!
//! One reader thread per connection runs the [`Session`] and receives each record's bytes
//! straight from the socket into 1 MiB pool buffers. Before a record's first byte is read the
//! reader takes credits for all of its buffers, first from its stream's allowance, then from
//! the server's; with none left it blocks, stops reading its socket, and TCP's window stops the
//! sender — memory never grows with a faster sender. One device thread owns the store: it
//! writes complete records with one command per buffer (≤ 1 MiB) at most `qd` in flight,
//! retiring commands in order (a new command only while the oldest unfinished one is fewer than
//! `qd` commands back, SNAcc's rule) or out of order (any free slot), and commits whatever has
//! been written as a group (flush, index, flush; §8) while data writes go on; acknowledgements
//! go out only after that. A record's buffers and credits are freed once its bytes are on the
//! device.

use crate::frame::{
    ErrorCode, Frame, FrameHeader, FrameType, Limits, Welcome, HEADER_LEN, NO_SEQ, VERSION,
};
use crate::fstarget::{FsRecord, FsStore, FsTargetError};
use crate::layout::NO_LABEL;
use crate::net::{self, Listener, Stream};
use crate::session::{Session, Stage, Step};
use crate::store::{PendingIndex, Placed, Store, StoreError};
use kura_accelfs::FsError;
use kura_engine::crc32c::Crc32c;
use kura_engine::{BufferPool, Completion, DeviceError, IoBuf, Request};
use kura_kv::KvError;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Bytes of one receive buffer and the largest write command.
pub const CHUNK: usize = 1 << 20;
/// How often a reader idle between records looks at the shutdown flag.
const IDLE_CHECK: Duration = Duration::from_millis(100);
/// Jobs queued from readers to the device thread (each holds credits or is a tiny marker).
const JOB_QUEUE: usize = 4096;

/// Retirement order of write commands (and so of record visibility).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// SNAcc: a command is issued only while the oldest unfinished one is fewer than `qd`
    /// commands back; records become visible in arrival order.
    In,
    /// Any free slot is reused at once; records become visible as their writes finish.
    Out,
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub limits: Limits,
    /// Write commands in flight.
    pub qd: usize,
    pub order: Order,
    /// 1 MiB buffers for all streams together.
    pub buffers: usize,
    /// 1 MiB buffers one stream may hold.
    pub per_stream: usize,
    /// Shared key: senders must answer the HMAC challenge. Required on TCP.
    pub key: Option<Vec<u8>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            limits: Limits::default(),
            qd: 64,
            order: Order::In,
            buffers: 64,
            per_stream: 32,
            key: None,
        }
    }
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("{0}")]
    Config(String),
    #[error("listener: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Counters a caller (the CLI, tests, the bench) reads while or after the server runs.
#[derive(Debug, Default)]
pub struct Stats {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub rejected: AtomicU64,
    pub commits: AtomicU64,
    pub connections: AtomicU64,
    /// Nanoseconds readers spent in stages after each record's CRC check (`zstd`, `classify`).
    pub stage_ns: AtomicU64,
}

/// A counting semaphore of 1 MiB buffer credits that remembers its peak.
#[derive(Debug)]
pub struct Credits {
    cap: usize,
    state: Mutex<(usize, usize)>,
    cv: Condvar,
}

impl Credits {
    pub fn new(cap: usize) -> Credits {
        Credits {
            cap,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, usize)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `n` credits are free, then takes them.
    fn acquire(&self, n: usize) {
        let mut s = self.lock();
        while s.0 + n > self.cap {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.0 += n;
        s.1 = s.1.max(s.0);
    }

    fn release(&self, n: usize) {
        let mut s = self.lock();
        s.0 = s.0.saturating_sub(n);
        drop(s);
        self.cv.notify_all();
    }

    /// Credits in use now.
    pub fn in_use(&self) -> usize {
        self.lock().0
    }

    /// Most credits ever in use at once.
    pub fn peak(&self) -> usize {
        self.lock().1
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }
}

/// One connection as the device thread sees it.
struct Conn {
    id: u64,
    out: Mutex<Stream>,
    credits: Credits,
    /// Records handed to the device thread / settled (stored or failed) by it.
    stored: AtomicU64,
    dead: AtomicBool,
    /// A record of this connection failed: its later records are dropped (§2).
    failed: AtomicBool,
}

impl Conn {
    fn send(&self, f: &Frame) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if out.write_all(&f.encode()).is_err() {
            self.dead.store(true, Ordering::Relaxed);
        }
    }

    fn error(&self, code: ErrorCode, seq: u64, message: &str) {
        self.send(&Frame::Error {
            code: code as u16,
            seq,
            message: message.to_string(),
        });
    }

    fn close(&self) {
        self.dead.store(true, Ordering::Relaxed);
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.shutdown(Shutdown::Both);
    }
}

/// A record ready to be written, with the credits it holds.
struct RecordJob {
    conn: Arc<Conn>,
    seq: u64,
    /// The record's size as sent (its credits: one per started MiB).
    len: u64,
    /// Bytes to store (smaller after `zstd`) and their CRC32C.
    stored_len: u64,
    crc: u32,
    ack: bool,
    /// The stage applied and its label (`classify`).
    stage: Stage,
    label: u8,
    chunks: Vec<IoBuf>,
}

enum Job {
    Record(RecordJob),
    /// Answer `SYNCED` once every earlier record of the connection is settled.
    Sync {
        conn: Arc<Conn>,
        upto: u64,
    },
    /// The connection ends: settle its records, then close it.
    Bye {
        conn: Arc<Conn>,
    },
    /// Every reader is gone: finish and return.
    Stop,
}

/// A running server's handles: its counters, its buffer credits and its stop switch.
#[derive(Clone)]
pub struct Handle {
    pub stats: Arc<Stats>,
    pub credits: Arc<Credits>,
    stop: Arc<AtomicBool>,
}

impl Handle {
    /// Asks the server to stop: no new connections, every record being received is finished,
    /// stored and acknowledged, then [`Server::run`] returns.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The flag [`Handle::stop`] sets, for a signal handler to set directly.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }
}

/// The ingest server.
pub struct Server {
    cfg: ServerConfig,
    handle: Handle,
    pool: BufferPool,
}

impl Server {
    /// A server with `cfg`, taking receive buffers from `pool` (the global pool is registered
    /// with io_uring, so buffers from it go to the device as fixed buffers).
    pub fn new(cfg: ServerConfig, pool: BufferPool) -> Result<Server, ServerError> {
        let max_chunks = (cfg.limits.max_record as usize).div_ceil(CHUNK);
        if cfg.qd == 0 || cfg.buffers == 0 || cfg.per_stream == 0 {
            return Err(ServerError::Config(
                "qd, buffers and per-stream buffers must be at least 1".into(),
            ));
        }
        if max_chunks > cfg.per_stream || cfg.per_stream > cfg.buffers {
            return Err(ServerError::Config(format!(
                "a record of up to {} bytes needs {max_chunks} buffers of 1 MiB; a stream may \
                 hold {} and all streams {}: need max_record ≤ per_stream ≤ buffers",
                cfg.limits.max_record, cfg.per_stream, cfg.buffers
            )));
        }
        if cfg.limits.max_frame < 4096 {
            return Err(ServerError::Config("max_frame below 4096 bytes".into()));
        }
        if cfg.key.as_ref().is_some_and(|k| k.len() < net::MIN_KEY_LEN) {
            return Err(ServerError::Config(format!(
                "the shared key needs at least {} bytes",
                net::MIN_KEY_LEN
            )));
        }
        let credits = Arc::new(Credits::new(cfg.buffers));
        Ok(Server {
            cfg,
            handle: Handle {
                stats: Arc::new(Stats::default()),
                credits,
                stop: Arc::new(AtomicBool::new(false)),
            },
            pool,
        })
    }

    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Serves `listener` until [`Handle::stop`]; returns the store with everything received
    /// stored. A TCP listener needs a key (network listeners authenticate).
    pub fn run(self, store: Store, listener: Listener) -> Result<Store, ServerError> {
        match self.run_target(Target::Raw(store), listener)? {
            Target::Raw(store) => Ok(store),
            Target::Fs(_) => Err(ServerError::Config("target changed kind".into())),
        }
    }

    /// [`Server::run`] for an AccelFS target.
    pub fn run_fs(self, store: FsStore, listener: Listener) -> Result<FsStore, ServerError> {
        match self.run_target(Target::Fs(store), listener)? {
            Target::Fs(store) => Ok(store),
            Target::Raw(_) => Err(ServerError::Config("target changed kind".into())),
        }
    }

    fn run_target(self, target: Target, listener: Listener) -> Result<Target, ServerError> {
        if listener.is_network() && self.cfg.key.is_none() {
            return Err(ServerError::Config(
                "a TCP listener needs a shared key (--key FILE); use unix:/path for a local \
                 socket guarded by file permissions"
                    .into(),
            ));
        }
        let (tx, rx) = mpsc::sync_channel::<Job>(JOB_QUEUE);
        let device = {
            let cfg = self.cfg.clone();
            let stats = Arc::clone(&self.handle.stats);
            let credits = Arc::clone(&self.handle.credits);
            std::thread::Builder::new()
                .name("ingest-device".into())
                .spawn(move || match target {
                    Target::Raw(store) => {
                        Target::Raw(DeviceLoop::new(store, cfg, stats, credits).run(rx))
                    }
                    Target::Fs(store) => Target::Fs(fs_loop(store, stats, credits, rx)),
                })?
        };
        listener.set_nonblocking(true)?;
        let mut readers = Vec::new();
        let mut next_id = 0u64;
        while !self.handle.stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok(stream) => {
                    next_id += 1;
                    self.handle
                        .stats
                        .connections
                        .fetch_add(1, Ordering::Relaxed);
                    let out = match stream.try_clone() {
                        Ok(o) => o,
                        Err(_) => continue,
                    };
                    let conn = Arc::new(Conn {
                        id: next_id,
                        out: Mutex::new(out),
                        credits: Credits::new(self.cfg.per_stream),
                        stored: AtomicU64::new(0),
                        dead: AtomicBool::new(false),
                        failed: AtomicBool::new(false),
                    });
                    let reader = Reader {
                        cfg: self.cfg.clone(),
                        conn,
                        stream,
                        tx: tx.clone(),
                        global: Arc::clone(&self.handle.credits),
                        stop: Arc::clone(&self.handle.stop),
                        stats: Arc::clone(&self.handle.stats),
                        pool: self.pool.clone(),
                    };
                    readers.push(
                        std::thread::Builder::new()
                            .name(format!("ingest-conn-{next_id}"))
                            .spawn(move || reader.run())?,
                    );
                    readers.retain(|r| !r.is_finished());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        drop(listener);
        for r in readers {
            let _ = r.join();
        }
        let _ = tx.send(Job::Stop);
        drop(tx);
        match device.join() {
            Ok(store) => Ok(store),
            Err(_) => Err(ServerError::Config("the device thread panicked".into())),
        }
    }
}

/// One connection's receiving side.
struct Reader {
    cfg: ServerConfig,
    conn: Arc<Conn>,
    stream: Stream,
    tx: SyncSender<Job>,
    global: Arc<Credits>,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    pool: BufferPool,
}

/// The record being received.
struct Receiving {
    size: u64,
    chunks: Vec<IoBuf>,
    /// Bytes received so far.
    got: u64,
    crc: Crc32c,
    credits: usize,
}

/// Why a reader stopped reading.
enum Stop {
    /// The peer closed, or the server is stopping between records.
    Closed,
    /// A bad frame or I/O error: answer (if possible) and close.
    Fail(ErrorCode, String),
}

impl Reader {
    fn run(mut self) {
        let _ = self.stream.set_read_timeout(Some(IDLE_CHECK));
        let mut receiving: Option<Receiving> = None;
        let outcome = self.serve(&mut receiving);
        if let Some(r) = receiving.take() {
            // A record cut off mid-way: its bytes are dropped, nothing of it is stored.
            drop(r.chunks);
            self.release(r.credits);
        }
        match outcome {
            Ok(()) | Err(Stop::Closed) => {}
            Err(Stop::Fail(code, msg)) => {
                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                self.conn.error(code, NO_SEQ, &msg);
            }
        }
        let _ = self.tx.send(Job::Bye {
            conn: Arc::clone(&self.conn),
        });
    }

    fn release(&self, n: usize) {
        self.conn.credits.release(n);
        self.global.release(n);
    }

    /// Fills `buf` from the socket; a timeout only counts when `idle` (between frames and
    /// records) and the server is stopping.
    fn read_full(&mut self, buf: &mut [u8], idle: bool) -> Result<(), Stop> {
        let mut at = 0;
        while at < buf.len() {
            match self.stream.read(&mut buf[at..]) {
                Ok(0) => {
                    return Err(if at == 0 && idle {
                        Stop::Closed
                    } else {
                        Stop::Fail(ErrorCode::BadFrame, "connection closed mid-frame".into())
                    })
                }
                Ok(n) => at += n,
                Err(e) if read_again(&e) => {
                    if at == 0 && idle && self.stop.load(Ordering::SeqCst) {
                        return Err(Stop::Closed);
                    }
                }
                Err(e) => return Err(Stop::Fail(ErrorCode::BadFrame, e.to_string())),
            }
        }
        Ok(())
    }

    fn serve(&mut self, receiving: &mut Option<Receiving>) -> Result<(), Stop> {
        let auth = self.cfg.key.is_some();
        let mut session = Session::new(self.cfg.limits, auth);
        let mut client_nonce = [0u8; 16];
        let server_nonce: [u8; 16] = rand::random();
        let mut stage = Stage::None;
        loop {
            let mut hb = [0u8; HEADER_LEN];
            self.read_full(&mut hb, receiving.is_none())?;
            let h = FrameHeader::parse(&hb, &self.cfg.limits)
                .map_err(|e| Stop::Fail(ErrorCode::BadFrame, e.to_string()))?;
            session
                .admit(&h)
                .map_err(|e| Stop::Fail(ErrorCode::BadFrame, e.to_string()))?;
            if h.ty == FrameType::Data {
                let r = receiving.as_mut().ok_or_else(|| {
                    Stop::Fail(ErrorCode::BadFrame, "DATA outside a record".into())
                })?;
                self.receive_data(&h, r)?;
                session
                    .data(h.len)
                    .map_err(|e| Stop::Fail(ErrorCode::BadFrame, e.to_string()))?;
                continue;
            }
            let mut payload = vec![0u8; h.len as usize];
            self.read_full(&mut payload, false)?;
            h.check(&payload)
                .map_err(|e| Stop::Fail(ErrorCode::BadFrame, e.to_string()))?;
            let f = Frame::decode(&h, &payload)
                .map_err(|e| Stop::Fail(ErrorCode::BadFrame, e.to_string()))?;
            if let Frame::Hello(hello) = &f {
                client_nonce = hello.client_nonce;
            }
            let step = session.control(&f).map_err(|e| {
                let code = match e {
                    crate::session::SessionError::Version { .. } => ErrorCode::UnsupportedVersion,
                    _ => ErrorCode::BadFrame,
                };
                Stop::Fail(code, e.to_string())
            })?;
            match step {
                Step::Hello { stage: s, .. } => {
                    stage = s;
                    self.conn.send(&Frame::Welcome(Welcome {
                        version: VERSION,
                        auth: u8::from(auth),
                        max_frame: self.cfg.limits.max_frame,
                        max_record: self.cfg.limits.max_record,
                        server_nonce,
                    }));
                    if !auth {
                        self.conn.send(&Frame::Ready);
                    }
                }
                Step::Auth { mac } => {
                    let key = self.cfg.key.as_deref().unwrap_or_default();
                    if !net::auth_ok(key, &client_nonce, &server_nonce, &mac) {
                        return Err(Stop::Fail(
                            ErrorCode::AuthFailed,
                            "authentication failed".into(),
                        ));
                    }
                    self.conn.send(&Frame::Ready);
                }
                Step::Begin { size, .. } => {
                    let credits = (size as usize).div_ceil(CHUNK);
                    // Per stream first, so one stream never holds global credits it waits on.
                    self.conn.credits.acquire(credits);
                    self.global.acquire(credits);
                    *receiving = Some(Receiving {
                        size,
                        chunks: Vec::with_capacity(credits),
                        got: 0,
                        crc: Crc32c::new(),
                        credits,
                    });
                }
                Step::End { seq, crc, ack, .. } => {
                    let Some(r) = receiving.take() else {
                        return Err(Stop::Fail(
                            ErrorCode::BadFrame,
                            "END outside a record".into(),
                        ));
                    };
                    let computed = r.crc.finalize();
                    if computed != crc {
                        self.release(r.credits);
                        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        self.conn.error(
                            ErrorCode::RecordCrc,
                            seq,
                            &format!("record CRC {crc:#010x}, received bytes {computed:#010x}"),
                        );
                        continue;
                    }
                    let began = std::time::Instant::now();
                    let job = apply_stage(
                        RecordJob {
                            conn: Arc::clone(&self.conn),
                            seq,
                            len: r.size,
                            stored_len: r.size,
                            crc,
                            ack,
                            stage,
                            label: NO_LABEL,
                            chunks: r.chunks,
                        },
                        r.size,
                    );
                    self.stats
                        .stage_ns
                        .fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    let job = Job::Record(job);
                    if self.tx.send(job).is_err() {
                        return Err(Stop::Fail(ErrorCode::ShuttingDown, "server stopped".into()));
                    }
                }
                Step::Sync { upto } => {
                    let _ = self.tx.send(Job::Sync {
                        conn: Arc::clone(&self.conn),
                        upto,
                    });
                }
                Step::Bye => return Err(Stop::Closed),
            }
        }
    }

    /// Reads one `DATA` payload into the record's buffers, digesting the frame and record CRCs.
    fn receive_data(&mut self, h: &FrameHeader, r: &mut Receiving) -> Result<(), Stop> {
        let mut left = h.len as usize;
        let mut frame_crc = h.digest();
        while left > 0 {
            let fill = (r.got as usize) % CHUNK;
            if fill == 0 {
                let want = ((r.size - r.got) as usize).min(CHUNK);
                let len =
                    want.div_ceil(crate::layout::UNIT as usize) * crate::layout::UNIT as usize;
                // Credits were taken for this buffer; the wait only covers other users of the
                // pool, and is bounded.
                let buf = self
                    .pool
                    .alloc_wait(CHUNK, Duration::from_secs(30))
                    .map_err(|e| Stop::Fail(ErrorCode::DeviceIo, e.to_string()))?;
                let mut buf = buf;
                buf.set_len(len);
                // The padding after the record's last byte goes to the device: no stale bytes.
                buf[want..].fill(0);
                r.chunks.push(buf);
            }
            let Some(chunk) = r.chunks.last_mut() else {
                return Err(Stop::Fail(ErrorCode::BadFrame, "no buffer".into()));
            };
            let n = left.min(CHUNK - fill).min(chunk.len() - fill);
            let dst = &mut chunk[fill..fill + n];
            let mut at = 0;
            while at < n {
                self.read_full_into(dst, &mut at)?;
            }
            frame_crc.update(dst);
            r.crc.update(dst);
            r.got += n as u64;
            left -= n;
        }
        h.verify(frame_crc)
            .map_err(|e| Stop::Fail(ErrorCode::BadFrame, e.to_string()))
    }

    fn read_full_into(&mut self, dst: &mut [u8], at: &mut usize) -> Result<(), Stop> {
        match self.stream.read(&mut dst[*at..]) {
            Ok(0) => Err(Stop::Fail(
                ErrorCode::BadFrame,
                "connection closed mid-record".into(),
            )),
            Ok(n) => {
                *at += n;
                Ok(())
            }
            Err(e) if read_again(&e) => Ok(()),
            Err(e) => Err(Stop::Fail(ErrorCode::BadFrame, e.to_string())),
        }
    }
}

/// Whether a failed socket read only means "nothing yet" (the read timeout ran out or a signal
/// came), so the reader tries again rather than failing the connection.
fn read_again(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// A record on its way to the device.
struct Active {
    job: RecordJob,
    offset: u64,
    /// Buffers not yet submitted (in order), and commands in flight.
    next_chunk: usize,
    in_flight: usize,
    failed: Option<String>,
}

/// A record whose bytes are written, waiting for the commit that makes it visible.
struct Written {
    conn: Arc<Conn>,
    seq: u64,
    ack: bool,
    placed: Placed,
}

enum CommitState {
    Idle,
    Flushing(Vec<Written>),
    Indexing(Vec<Written>, PendingIndex),
    Syncing(Vec<Written>, PendingIndex),
}

const TAG_FLUSH: u64 = u64::MAX;
/// Bytes written and not yet committed that start a commit while data writes go on.
const COMMIT_BYTES: u64 = 64 << 20;
const TAG_INDEX: u64 = u64::MAX - 1;

struct DeviceLoop {
    store: Store,
    cfg: ServerConfig,
    stats: Arc<Stats>,
    credits: Arc<Credits>,
    /// Records by arrival number.
    active: HashMap<u64, Active>,
    /// Arrival numbers with buffers left to submit, in order.
    to_issue: VecDeque<u64>,
    /// Command numbers in flight (for the in-order window) → (arrival, bytes).
    commands: BTreeMap<u64, u64>,
    next_command: u64,
    next_arrival: u64,
    /// Written records by arrival number; in-order retirement commits a prefix of them.
    written: BTreeMap<u64, Option<Written>>,
    next_retire: u64,
    commit: CommitState,
    /// Per connection: records received / settled, and the syncs and byes waiting on them.
    received: HashMap<u64, u64>,
    settled: HashMap<u64, u64>,
    waiting: Vec<(Arc<Conn>, u64, Option<u64>)>,
    stopping: bool,
    completions: Vec<Completion>,
    block_size: u64,
}

impl DeviceLoop {
    fn new(store: Store, cfg: ServerConfig, stats: Arc<Stats>, credits: Arc<Credits>) -> Self {
        let block_size = u64::from(store.block_size());
        DeviceLoop {
            store,
            cfg,
            stats,
            credits,
            active: HashMap::new(),
            to_issue: VecDeque::new(),
            commands: BTreeMap::new(),
            next_command: 0,
            next_arrival: 0,
            written: BTreeMap::new(),
            next_retire: 0,
            commit: CommitState::Idle,
            received: HashMap::new(),
            settled: HashMap::new(),
            waiting: Vec::new(),
            stopping: false,
            completions: Vec::new(),
            block_size,
        }
    }

    fn run(mut self, rx: Receiver<Job>) -> Store {
        loop {
            let busy = !self.commands.is_empty()
                || !self.to_issue.is_empty()
                || !matches!(self.commit, CommitState::Idle)
                || self.ready_to_commit();
            if !busy {
                self.answer_waiting();
                if self.stopping {
                    break;
                }
                match rx.recv() {
                    Ok(job) => self.take(job),
                    Err(_) => self.stopping = true,
                }
            }
            while let Ok(job) = rx.try_recv() {
                self.take(job);
            }
            self.issue();
            self.maybe_commit();
            if self.store.device_mut().in_flight() > 0 {
                self.completions.clear();
                let mut done = std::mem::take(&mut self.completions);
                if let Err(e) = self.store.device_mut().poll(&mut done, 1) {
                    self.fail_everything(&e.to_string());
                }
                for c in done.drain(..) {
                    self.complete(c);
                }
                self.completions = done;
            }
            self.answer_waiting();
        }
        self.store
    }

    fn take(&mut self, job: Job) {
        match job {
            Job::Record(r) => {
                *self.received.entry(r.conn.id).or_default() += 1;
                let arrival = self.next_arrival;
                self.next_arrival += 1;
                if r.conn.failed.load(Ordering::Relaxed) {
                    *self.settled.entry(r.conn.id).or_default() += 1;
                    self.release_record(&r);
                    self.skip(arrival);
                    return;
                }
                match self.store.reserve(r.stored_len) {
                    Ok(offset) => {
                        self.active.insert(
                            arrival,
                            Active {
                                job: r,
                                offset,
                                next_chunk: 0,
                                in_flight: 0,
                                failed: None,
                            },
                        );
                        self.to_issue.push_back(arrival);
                    }
                    Err(e) => {
                        let code = match e {
                            StoreError::Full(_) => ErrorCode::DeviceFull,
                            _ => ErrorCode::DeviceIo,
                        };
                        self.settle_failed(&r.conn, r.seq, code, &e.to_string());
                        self.release_record(&r);
                        self.skip(arrival);
                    }
                }
            }
            Job::Sync { conn, upto } => {
                let target = self.received.get(&conn.id).copied().unwrap_or(0);
                self.waiting.push((conn, target, Some(upto)));
            }
            Job::Bye { conn } => {
                let target = self.received.get(&conn.id).copied().unwrap_or(0);
                self.waiting.push((conn, target, None));
            }
            Job::Stop => self.stopping = true,
        }
    }

    /// Gives back the credits a record took at `BEGIN` (its buffers are dropped by now or
    /// with it).
    fn release_record(&self, r: &RecordJob) {
        let n = (r.len as usize).div_ceil(CHUNK);
        r.conn.credits.release(n);
        self.credits.release(n);
    }

    /// Notes a record that will never be committed, so in-order retirement moves past it.
    fn skip(&mut self, arrival: u64) {
        if self.cfg.order == Order::In {
            self.written.insert(arrival, None);
        }
    }

    /// True while another data command may go out (see [`Order`]).
    fn window_open(&self) -> bool {
        let qd = self.cfg.qd;
        match self.cfg.order {
            Order::Out => self.commands.len() < qd,
            Order::In => self
                .commands
                .keys()
                .next()
                .is_none_or(|oldest| self.next_command - oldest < qd as u64),
        }
    }

    /// Submits buffers of waiting records while the window allows.
    fn issue(&mut self) {
        let bs = self.block_size;
        while self.window_open() {
            let Some(&arrival) = self.to_issue.front() else {
                break;
            };
            let Some(a) = self.active.get_mut(&arrival) else {
                self.to_issue.pop_front();
                continue;
            };
            if a.next_chunk >= a.job.chunks.len() {
                self.to_issue.pop_front();
                continue;
            }
            // Buffers leave the record one at a time; an empty placeholder keeps the indices.
            let i = a.next_chunk;
            let buf = std::mem::replace(&mut a.job.chunks[i], IoBuf::heap(0, 1));
            let lba = (a.offset + (i * CHUNK) as u64) / bs;
            let blocks = (buf.len() as u64).div_ceil(bs);
            let tag = self.next_command;
            match self
                .store
                .device_mut()
                .submit(Request::write(tag, lba, blocks, buf))
            {
                Ok(()) => {
                    a.next_chunk += 1;
                    a.in_flight += 1;
                    self.commands.insert(tag, arrival);
                    self.next_command += 1;
                }
                Err(rej) => {
                    if let Some(buf) = rej.request.buf {
                        a.job.chunks[i] = buf;
                    }
                    if matches!(rej.error, DeviceError::QueueFull { .. }) {
                        break;
                    }
                    a.failed.get_or_insert(rej.error.to_string());
                    a.next_chunk = a.job.chunks.len();
                    self.to_issue.pop_front();
                    self.maybe_finish(arrival);
                }
            }
        }
        let _ = self.store.device_mut().ring_doorbell();
    }

    fn complete(&mut self, c: Completion) {
        match c.tag {
            TAG_FLUSH | TAG_INDEX => self.commit_step(c),
            tag => {
                let Some(arrival) = self.commands.remove(&tag) else {
                    return;
                };
                drop(c.buf);
                if let Some(a) = self.active.get_mut(&arrival) {
                    a.in_flight -= 1;
                    if let Err(e) = c.status {
                        a.failed.get_or_insert(e.to_string());
                    }
                }
                self.maybe_finish(arrival);
            }
        }
    }

    /// A record whose commands are all done moves to `written` (or fails).
    fn maybe_finish(&mut self, arrival: u64) {
        let finished = self
            .active
            .get(&arrival)
            .is_some_and(|a| a.in_flight == 0 && a.next_chunk >= a.job.chunks.len());
        if !finished {
            return;
        }
        let Some(a) = self.active.remove(&arrival) else {
            return;
        };
        self.release_record(&a.job);
        if let Some(why) = a.failed {
            self.store.abandon();
            self.settle_failed(&a.job.conn, a.job.seq, ErrorCode::DeviceIo, &why);
            self.skip(arrival);
            return;
        }
        let placed = Placed {
            offset: a.offset,
            stored_len: a.job.stored_len,
            orig_len: a.job.len,
            crc: a.job.crc,
            stage: a.job.stage as u8,
            label: a.job.label,
            seq: a.job.seq,
        };
        self.written.insert(
            arrival,
            Some(Written {
                conn: a.job.conn,
                seq: a.job.seq,
                ack: a.job.ack,
                placed,
            }),
        );
    }

    fn ready_to_commit(&self) -> bool {
        match self.cfg.order {
            Order::Out => self.written.values().any(Option::is_some),
            Order::In => self.written.contains_key(&self.next_retire),
        }
    }

    /// Takes the records the next commit makes visible: in order, the prefix of arrivals
    /// whose writes are done; out of order, every written one.
    fn take_ready(&mut self) -> Vec<Written> {
        let mut out = Vec::new();
        match self.cfg.order {
            Order::In => {
                while let Some(w) = self.written.remove(&self.next_retire) {
                    self.next_retire += 1;
                    out.extend(w);
                }
            }
            Order::Out => {
                for (_, w) in std::mem::take(&mut self.written) {
                    out.extend(w);
                }
            }
        }
        // Records of a connection that saw a failure are not stored (§2).
        let (keep, drop): (Vec<Written>, Vec<Written>) = out
            .into_iter()
            .partition(|w| !w.conn.failed.load(Ordering::Relaxed));
        for w in drop {
            self.store.abandon();
            *self.settled.entry(w.conn.id).or_default() += 1;
        }
        keep
    }

    /// Group commit: a commit starts once records are ready and the data writes have
    /// drained, or a sender waits on a `SYNC`/`BYE`, or [`COMMIT_BYTES`] are ready — so a
    /// steady stream pays one pair of flushes per 64 MiB, not per record, and both retirement
    /// orders commit alike.
    fn maybe_commit(&mut self) {
        if !matches!(self.commit, CommitState::Idle) || !self.ready_to_commit() {
            return;
        }
        let ready_bytes: u64 = self
            .written
            .values()
            .flatten()
            .map(|w| w.placed.stored_len)
            .sum();
        if !(self.commands.is_empty()
            || !self.waiting.is_empty()
            || self.stopping
            || ready_bytes >= COMMIT_BYTES)
        {
            return;
        }
        let batch = self.take_ready();
        if batch.is_empty() {
            return;
        }
        // Every record in the batch finished its writes before this flush was submitted.
        match self.store.device_mut().submit(Request::flush(TAG_FLUSH)) {
            Ok(()) => self.commit = CommitState::Flushing(batch),
            Err(rej) => self.fail_batch(batch, None, &rej.error.to_string()),
        }
    }

    fn commit_step(&mut self, c: Completion) {
        let state = std::mem::replace(&mut self.commit, CommitState::Idle);
        match (state, c.status) {
            (CommitState::Flushing(batch), Ok(())) => {
                let placed: Vec<Placed> = batch.iter().map(|w| w.placed).collect();
                match self.store.prepare_index(&placed) {
                    Ok(mut index) => {
                        let req =
                            Request::write(TAG_INDEX, index.lba, index.blocks, index.take_buf());
                        match self.store.device_mut().submit(req) {
                            Ok(()) => self.commit = CommitState::Indexing(batch, index),
                            Err(rej) => self.fail_batch(batch, Some(index), &rej.error.to_string()),
                        }
                    }
                    Err(e) => self.fail_batch(batch, None, &e.to_string()),
                }
            }
            (CommitState::Indexing(batch, index), Ok(())) => {
                match self.store.device_mut().submit(Request::flush(TAG_FLUSH)) {
                    Ok(()) => self.commit = CommitState::Syncing(batch, index),
                    Err(rej) => self.fail_batch(batch, Some(index), &rej.error.to_string()),
                }
            }
            (CommitState::Syncing(batch, index), Ok(())) => {
                let entries = self.store.index_durable(index);
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                for (w, e) in batch.iter().zip(&entries) {
                    self.stats.records.fetch_add(1, Ordering::Relaxed);
                    self.stats.bytes.fetch_add(e.orig_len, Ordering::Relaxed);
                    w.conn.stored.fetch_add(1, Ordering::Relaxed);
                    *self.settled.entry(w.conn.id).or_default() += 1;
                    if w.ack {
                        w.conn.send(&Frame::Ack {
                            seq: w.seq,
                            id: e.id,
                        });
                    }
                }
            }
            (CommitState::Flushing(batch), Err(e)) => self.fail_batch(batch, None, &e.to_string()),
            (CommitState::Indexing(batch, index) | CommitState::Syncing(batch, index), Err(e)) => {
                self.fail_batch(batch, Some(index), &e.to_string())
            }
            (CommitState::Idle, _) => {}
        }
    }

    fn fail_batch(&mut self, batch: Vec<Written>, index: Option<PendingIndex>, why: &str) {
        match index {
            Some(i) => self.store.index_failed(i),
            None => batch.iter().for_each(|_| self.store.abandon()),
        }
        for w in batch {
            self.settle_failed(&w.conn, w.seq, ErrorCode::DeviceIo, why);
        }
    }

    fn settle_failed(&mut self, conn: &Arc<Conn>, seq: u64, code: ErrorCode, why: &str) {
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        *self.settled.entry(conn.id).or_default() += 1;
        conn.failed.store(true, Ordering::Relaxed);
        conn.error(code, seq, why);
        // The sender cannot tell which later records will follow this one; it is told and
        // the connection closes (§2).
        conn.close();
    }

    fn fail_everything(&mut self, why: &str) {
        let arrivals: Vec<u64> = self.active.keys().copied().collect();
        for arrival in arrivals {
            if let Some(a) = self.active.get_mut(&arrival) {
                a.failed.get_or_insert(why.to_string());
                a.in_flight = 0;
                a.next_chunk = a.job.chunks.len();
            }
            self.maybe_finish(arrival);
        }
        self.commands.clear();
        self.to_issue.clear();
        let state = std::mem::replace(&mut self.commit, CommitState::Idle);
        match state {
            CommitState::Idle => {}
            CommitState::Flushing(b) => self.fail_batch(b, None, why),
            CommitState::Indexing(b, i) | CommitState::Syncing(b, i) => {
                self.fail_batch(b, Some(i), why)
            }
        }
    }

    /// Sends `SYNCED` and closes finished connections once their records are settled.
    fn answer_waiting(&mut self) {
        let settled = &self.settled;
        self.waiting.retain(|(conn, target, upto)| {
            if settled.get(&conn.id).copied().unwrap_or(0) < *target {
                return true;
            }
            match upto {
                Some(upto) => conn.send(&Frame::Synced {
                    upto: *upto,
                    records: conn.stored.load(Ordering::Relaxed),
                }),
                None => conn.close(),
            }
            false
        });
    }
}

/// Runs the record's stage on its buffers (`DATA` bytes, already CRC-checked): `zstd`
/// repacks the compressed bytes into the record's first buffers (kept raw, as `crc32c`, when
/// they would not fit), `classify` labels a PPM/PGM (unlabelled, 255, when it is not one).
/// Both need the record in one piece, so they copy it once; `none`/`crc32c` touch nothing.
fn apply_stage(mut job: RecordJob, size: u64) -> RecordJob {
    let whole = |chunks: &[IoBuf]| {
        let mut v = Vec::with_capacity(size as usize);
        for c in chunks {
            let take = (size as usize - v.len()).min(c.len());
            v.extend_from_slice(&c[..take]);
        }
        v
    };
    match job.stage {
        Stage::None | Stage::Crc32c => {}
        Stage::Classify => {
            job.label = crate::stage::Classifier::standard()
                .label(&whole(&job.chunks))
                .unwrap_or(NO_LABEL);
        }
        Stage::Zstd => {
            let room: usize = job.chunks.iter().map(|c| c.capacity()).sum();
            match crate::stage::compress(&whole(&job.chunks)) {
                Ok(z) if z.len() <= room && !z.is_empty() => {
                    let unit = crate::layout::UNIT as usize;
                    let used = z.len().div_ceil(CHUNK);
                    job.chunks.truncate(used);
                    for (c, piece) in job.chunks.iter_mut().zip(z.chunks(CHUNK)) {
                        let padded = piece.len().div_ceil(unit) * unit;
                        c.set_len(padded);
                        c[..piece.len()].copy_from_slice(piece);
                        c[piece.len()..].fill(0);
                    }
                    job.stored_len = z.len() as u64;
                    job.crc = kura_engine::crc32c::crc32c(&z);
                }
                _ => job.stage = Stage::Crc32c,
            }
        }
    }
    job
}

/// What a server stores into.
enum Target {
    Raw(Store),
    Fs(FsStore),
}

/// The AccelFS target's writer: takes whatever records are queued as one batch, stores it
/// ([`FsStore::store_batch`]: files, commit, index with sync), acknowledges, frees the
/// buffers, then answers the syncs and byes that came with the batch. AccelFS issues the file
/// writes itself (whole blocks as commands of up to 1 MiB), so there is no queue depth or
/// retirement order here.
fn fs_loop(
    mut store: FsStore,
    stats: Arc<Stats>,
    credits: Arc<Credits>,
    rx: Receiver<Job>,
) -> FsStore {
    let mut stored: HashMap<u64, u64> = HashMap::new();
    let mut stop = false;
    while !stop {
        let Ok(first) = rx.recv() else {
            break;
        };
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        let mut records = Vec::new();
        let mut waits = Vec::new();
        for job in jobs {
            match job {
                Job::Record(r) if r.conn.failed.load(Ordering::Relaxed) => {
                    release(&credits, &r);
                }
                Job::Record(r) => records.push(r),
                Job::Sync { conn, upto } => waits.push((conn, Some(upto))),
                Job::Bye { conn } => waits.push((conn, None)),
                Job::Stop => stop = true,
            }
        }
        if !records.is_empty() {
            let batch: Vec<FsRecord<'_>> = records
                .iter()
                .map(|r| FsRecord {
                    chunks: &r.chunks,
                    stored_len: r.stored_len,
                    orig_len: r.len,
                    crc: r.crc,
                    stage: r.stage as u8,
                    label: r.label,
                    seq: r.seq,
                })
                .collect();
            match store.store_batch(&batch) {
                Ok(entries) => {
                    stats.commits.fetch_add(1, Ordering::Relaxed);
                    for (r, e) in records.iter().zip(&entries) {
                        stats.records.fetch_add(1, Ordering::Relaxed);
                        stats.bytes.fetch_add(r.len, Ordering::Relaxed);
                        r.conn.stored.fetch_add(1, Ordering::Relaxed);
                        *stored.entry(r.conn.id).or_default() += 1;
                        if r.ack {
                            r.conn.send(&Frame::Ack {
                                seq: r.seq,
                                id: e.id,
                            });
                        }
                    }
                }
                Err(e) => {
                    let code = match &e {
                        FsTargetError::Fs(FsError::NoSpace(_)) => ErrorCode::DeviceFull,
                        FsTargetError::Kv(KvError::NoSpace(_)) => ErrorCode::DeviceFull,
                        _ => ErrorCode::DeviceIo,
                    };
                    for r in &records {
                        stats.rejected.fetch_add(1, Ordering::Relaxed);
                        r.conn.failed.store(true, Ordering::Relaxed);
                        r.conn.error(code, r.seq, &e.to_string());
                        r.conn.close();
                    }
                }
            }
            for r in records {
                release(&credits, &r);
            }
        }
        // Every record a sync or bye waits on came before it on its connection, so it was in
        // this batch or an earlier one.
        for (conn, upto) in waits {
            match upto {
                Some(upto) => conn.send(&Frame::Synced {
                    upto,
                    records: conn.stored.load(Ordering::Relaxed),
                }),
                None => conn.close(),
            }
        }
    }
    store
}

/// Gives back a record's credits (its buffers are dropped with it).
fn release(credits: &Credits, r: &RecordJob) {
    let n = (r.len as usize).div_ceil(CHUNK);
    r.conn.credits.release(n);
    credits.release(n);
}

/// What [`write_local`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalRun {
    pub records: u64,
    pub bytes: u64,
    /// From the first record handed to the device thread to its return, every record
    /// committed (flush, index, flush).
    pub seconds: f64,
}

/// Writes records of `sizes` bytes into `store` through the server's device thread — the same
/// issue window, retirement order and group commits as [`Server::run`] — with no network: the
/// records are filled in pool buffers here and handed over as a reader would after `END`
/// (credits taken first, `crc32c` stage, batch acknowledgements, whose frames go to a socket
/// pair that is drained and thrown away). For measuring retirement orders at the device.
pub fn write_local(
    store: Store,
    cfg: &ServerConfig,
    pool: &BufferPool,
    sizes: &[usize],
    seed: u64,
) -> Result<(Store, LocalRun), ServerError> {
    use std::os::unix::net::UnixStream;
    if sizes
        .iter()
        .any(|&n| n == 0 || n as u64 > cfg.limits.max_record)
    {
        return Err(ServerError::Config(format!(
            "record sizes must be from 1 byte to max_record ({})",
            cfg.limits.max_record
        )));
    }
    if sizes.iter().any(|&n| n.div_ceil(CHUNK) > cfg.buffers) {
        return Err(ServerError::Config(
            "a record needs more buffers than configured".into(),
        ));
    }
    let (ours, theirs) = UnixStream::pair()?;
    let drain = std::thread::spawn(move || {
        let mut theirs = theirs;
        let _ = io::copy(&mut theirs, &mut io::sink());
    });
    let conn = Arc::new(Conn {
        id: 1,
        out: Mutex::new(Stream::Unix(ours)),
        credits: Credits::new(cfg.buffers),
        stored: AtomicU64::new(0),
        dead: AtomicBool::new(false),
        failed: AtomicBool::new(false),
    });
    let credits = Arc::new(Credits::new(cfg.buffers));
    let (tx, rx) = mpsc::sync_channel::<Job>(JOB_QUEUE);
    let started = std::time::Instant::now();
    let device = {
        let (cfg, credits) = (cfg.clone(), Arc::clone(&credits));
        let stats = Arc::new(Stats::default());
        std::thread::Builder::new()
            .name("ingest-device".into())
            .spawn(move || DeviceLoop::new(store, cfg, stats, credits).run(rx))?
    };
    let mut bytes = 0u64;
    for (seq, &size) in sizes.iter().enumerate() {
        let n = size.div_ceil(CHUNK);
        conn.credits.acquire(n);
        credits.acquire(n);
        let mut crc = Crc32c::new();
        let mut chunks = Vec::with_capacity(n);
        for c in 0..n {
            let want = (size - c * CHUNK).min(CHUNK);
            let len = want.div_ceil(crate::layout::UNIT as usize) * crate::layout::UNIT as usize;
            let mut buf = pool
                .alloc_wait(CHUNK, Duration::from_secs(30))
                .map_err(|e| ServerError::Config(e.to_string()))?;
            buf.set_len(len);
            // Cheap bytes (a fill and the record's number), so making them costs far less
            // than writing them: the run measures the device thread, not this one.
            buf[..want].fill((seq as u8).wrapping_mul(31).wrapping_add(c as u8));
            let tag = (seq as u64 ^ seed).to_le_bytes();
            let n = want.min(8);
            buf[..n].copy_from_slice(&tag[..n]);
            buf[want..].fill(0);
            crc.update(&buf[..want]);
            chunks.push(buf);
        }
        let job = RecordJob {
            conn: Arc::clone(&conn),
            seq: seq as u64,
            len: size as u64,
            stored_len: size as u64,
            crc: crc.finalize(),
            ack: false,
            stage: Stage::Crc32c,
            label: NO_LABEL,
            chunks,
        };
        bytes += size as u64;
        if tx.send(Job::Record(job)).is_err() {
            break;
        }
    }
    let _ = tx.send(Job::Sync {
        conn: Arc::clone(&conn),
        upto: sizes.len().saturating_sub(1) as u64,
    });
    let _ = tx.send(Job::Bye {
        conn: Arc::clone(&conn),
    });
    let _ = tx.send(Job::Stop);
    drop(tx);
    let store = device
        .join()
        .map_err(|_| ServerError::Config("the device thread panicked".into()))?;
    let seconds = started.elapsed().as_secs_f64();
    conn.close();
    drop(conn);
    let _ = drain.join();
    Ok((
        store,
        LocalRun {
            records: sizes.len() as u64,
            bytes,
            seconds,
        },
    ))
}

/// `ERROR` frames' text for a code.
pub fn describe_code(code: u16) -> &'static str {
    match ErrorCode::from_u16(code) {
        Some(ErrorCode::BadFrame) => "bad frame",
        Some(ErrorCode::UnsupportedVersion) => "unsupported version",
        Some(ErrorCode::AuthFailed) => "authentication failed",
        Some(ErrorCode::RecordCrc) => "record CRC mismatch",
        Some(ErrorCode::DeviceIo) => "device I/O error",
        Some(ErrorCode::DeviceFull) => "device full",
        Some(ErrorCode::ShuttingDown) => "server shutting down",
        None => "unknown error",
    }
}
