//! `priority(CHILD)?weights=W0:W1[:...]&bgdepth=N&bgchunk=SIZE` — LeapIO's priority drive:
//! several classes of requests share one child, so a latency-sensitive stream keeps its latency
//! next to a background stream that still makes progress.
//!
//! [`Priority::classes`] returns one [`ClassHandle`] per weight. Each handle is a [`BlockDevice`] of
//! its own (its own tags and completions, and a queue of [`CLASS_QUEUE_DEPTH`] requests or the
//! child's depth if deeper, since the scheduler holds what the child has no room for) and may
//! live on its own thread: the handles share one scheduler behind an `Arc<Mutex<_>>`. A mutex
//! rather than a dispatcher thread, because the child's queue pair then runs on the callers'
//! threads with no hand-off between threads on the foreground path and no thread of its own to
//! spin or sleep. Who waits how is what keeps the foreground fast: a foreground caller waiting
//! for its completions blocks inside the child (holding the lock, and woken by the child's next
//! completion, its own or a background one), so nothing stands between it and the device; a
//! background caller never blocks inside the child while a foreground handle is alive (the
//! foreground thread would then wait for the lock), but sleeps on a condition variable that any
//! caller reaping a completion signals, and looks again every [`BACKGROUND_NAP`]. Several
//! foreground threads therefore take turns at the child.
//!
//! Scheduling, at every doorbell and poll of any handle:
//! - **Foreground and background.** The classes with the largest weight are foreground; every
//!   other class is background. Background commands in flight on the child, all background
//!   classes together, never exceed `bgdepth` (4 by default), so a foreground request reaches a
//!   child queue holding at most `bgdepth` background commands however deep the background
//!   stream is queued above.
//! - **Weighted fair queueing** among the classes that may dispatch: deficit round robin by
//!   bytes, each visit of a class adding `weight ×` [`QUANTUM_BYTES`] to its deficit (flushes
//!   and requests without data cost one block). When every class is backlogged, the bytes each
//!   class gets to the child are proportional to its weight, and a background class with waiting
//!   requests is visited every round, so it is never starved.
//! - **Background chunks** (`bgchunk=SIZE`, off by default): background requests longer than
//!   that are cut into commands of that size (copied through scratch buffers) and complete when
//!   every piece has, so a foreground command waits behind at most `bgdepth` chunks rather than
//!   `bgdepth` whole requests.
//!
//! A flush of one class goes to the child as soon as the scheduler reaches it: every write that
//! class had acknowledged before it has completed on the child, and the child's flush makes every
//! completed write durable, so the class's guarantee holds (other classes' completed writes are
//! made durable too, which costs nothing extra). A failed flush poisons the whole drive, since
//! the child's data is shared.
//!
//! The spec form opens class 0 (the first weight); the other classes exist and take part in the
//! scheduling, but without handles they stay idle, so from a spec the drive is the class-0 view
//! of the child with the scheduler's cost. Weights are separated by `:` because `,` separates
//! devices in a spec.

use crate::fanout::scratch;
use kura_engine::open::ChildOpener;
use kura_engine::poison::FlushPoison;
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Geometry, Opcode, OpenError, Rejected,
    Request, Spec,
};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Options of `priority(...)`.
pub const PRIORITY_OPTIONS: &[&str] = &["weights", "bgdepth", "bgchunk"];
/// Weights when none are given: a foreground class 8 times a background one.
pub const DEFAULT_WEIGHTS: &[u32] = &[8, 1];
/// Background commands allowed on the child at once when none is given.
pub const DEFAULT_BG_DEPTH: usize = 4;
/// Bytes a class of weight 1 may dispatch per round.
pub const QUANTUM_BYTES: u64 = 64 << 10;
/// Most classes one drive takes.
pub const MAX_CLASSES: usize = 16;
/// Largest weight.
pub const MAX_WEIGHT: u32 = 1000;
/// The longest a waiting background caller sleeps before it reaps the child itself.
pub const BACKGROUND_NAP: Duration = Duration::from_micros(50);
/// Requests one class accepts at once (or the child's queue depth, if deeper): the scheduler
/// holds what the child has no room for, so a class can stay backlogged behind a shallow child.
pub const CLASS_QUEUE_DEPTH: u32 = 128;

/// What one class sent through the scheduler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Requests accepted (flushes included).
    pub requests: u64,
    /// Commands sent to the child.
    pub dispatched: u64,
    /// Data bytes sent to the child (reads and writes).
    pub dispatched_bytes: u64,
}

/// Where a child command's completion goes.
#[derive(Clone, Copy)]
enum Target {
    /// Straight back to the caller, with its tag.
    Caller(u64),
    /// Into a split background request: `len` bytes at `offset` of its buffer.
    Span {
        parent: u64,
        offset: usize,
        len: usize,
    },
}

/// A background request cut into spans, while they are on the child.
struct Parent {
    class: usize,
    req: Request,
    remaining: usize,
    status: DeviceResult<()>,
}

/// A span of a split background request (a child command of its own) waiting for dispatch.
struct PendingSpan {
    parent: u64,
    offset: usize,
    len: usize,
    req: Request,
}

struct Class {
    weight: u32,
    foreground: bool,
    queue: VecDeque<Request>,
    /// Spans of this class's split request, sent before anything else of the class.
    spans: VecDeque<PendingSpan>,
    deficit: u64,
    ready: Vec<Completion>,
    /// Accepted and not yet returned by `poll`.
    accepted: usize,
    alive: bool,
    stats: ClassStats,
}

/// What every handle of one drive shares: the scheduler, and the signal of new completions.
struct Shared {
    sched: Mutex<Sched>,
    reaped: Condvar,
}

/// The scheduler.
struct Sched {
    child: Box<dyn BlockDevice>,
    geo: Geometry,
    classes: Vec<Class>,
    bg_depth: usize,
    /// Background requests longer than this many blocks are cut into pieces of this length.
    bg_chunk_blocks: Option<u64>,
    bg_on_child: usize,
    /// Child tag → (class, where the completion goes).
    sent: HashMap<u64, (usize, Target)>,
    next_tag: u64,
    parents: HashMap<u64, Parent>,
    next_parent: u64,
    /// The class the round robin stands at, and whether it has had its quantum for this visit.
    cursor: usize,
    granted: bool,
    poison: FlushPoison,
    /// Completions were routed to a class since the last signal.
    routed: bool,
}

impl Sched {
    fn cost(&self, req: &Request) -> u64 {
        let bs = u64::from(self.geo.block_size);
        if req.op.has_data() {
            req.blocks * bs
        } else {
            bs
        }
    }

    fn may_dispatch(&self, c: usize) -> bool {
        let class = &self.classes[c];
        (!class.queue.is_empty() || !class.spans.is_empty())
            && (class.foreground || self.bg_on_child < self.bg_depth)
    }

    /// Cuts the background class `c`'s head request into pieces when it is longer than the
    /// background chunk, so a foreground command waits behind at most one chunk per slot.
    fn split_head(&mut self, c: usize) {
        let Some(chunk) = self.bg_chunk_blocks else {
            return;
        };
        let class = &self.classes[c];
        let cut = !class.foreground
            && class.spans.is_empty()
            && class
                .queue
                .front()
                .is_some_and(|r| r.op != Opcode::Flush && r.blocks > chunk);
        if !cut {
            return;
        }
        let Some(req) = self.classes[c].queue.pop_front() else {
            return;
        };
        let bs = self.geo.block_size as usize;
        let parent = self.next_parent;
        self.next_parent = self.next_parent.wrapping_add(1);
        let mut count = 0;
        let mut at = 0;
        while at < req.blocks {
            let blocks = chunk.min(req.blocks - at);
            let offset = at as usize * bs;
            let len = blocks as usize * bs;
            let buf = match (req.op, &req.buf) {
                (Opcode::Write, Some(src)) => {
                    let mut buf = scratch(len);
                    buf[..len].copy_from_slice(&src[offset..offset + len]);
                    Some(buf)
                }
                (Opcode::Read, _) => Some(scratch(len)),
                _ => None,
            };
            let piece = crate::child_request(req.op, req.lba + at, blocks, buf);
            self.classes[c].spans.push_back(PendingSpan {
                parent,
                offset,
                len,
                req: piece,
            });
            count += 1;
            at += blocks;
        }
        self.parents.insert(
            parent,
            Parent {
                class: c,
                req,
                remaining: count,
                status: Ok(()),
            },
        );
    }

    fn advance(&mut self) {
        self.cursor = (self.cursor + 1) % self.classes.len();
        self.granted = false;
    }

    /// Deficit round robin over the classes that may dispatch, while the child takes commands.
    fn dispatch(&mut self) {
        let child_depth = self.geo.queue_depth as usize;
        while self.child.in_flight() < child_depth {
            if !(0..self.classes.len()).any(|c| self.may_dispatch(c)) {
                return;
            }
            let c = self.cursor;
            if !self.may_dispatch(c) {
                if self.classes[c].queue.is_empty() {
                    self.classes[c].deficit = 0;
                }
                self.advance();
                continue;
            }
            if !self.granted {
                let class = &mut self.classes[c];
                class.deficit += u64::from(class.weight) * QUANTUM_BYTES;
                self.granted = true;
            }
            self.split_head(c);
            let class = &self.classes[c];
            let Some(head) = class.spans.front().map(|p| &p.req).or(class.queue.front()) else {
                continue;
            };
            let cost = self.cost(head);
            if self.classes[c].deficit < cost {
                self.advance();
                continue;
            }
            let sent = if let Some(p) = self.classes[c].spans.pop_front() {
                let target = Target::Span {
                    parent: p.parent,
                    offset: p.offset,
                    len: p.len,
                };
                self.send(c, p.req, target)
            } else if let Some(req) = self.classes[c].queue.pop_front() {
                let target = Target::Caller(req.tag);
                self.send(c, req, target)
            } else {
                continue;
            };
            if !sent {
                return;
            }
            self.classes[c].deficit -= cost;
        }
    }

    /// Sends one request of class `c`; false when the child refused it for now (it is put back).
    fn send(&mut self, c: usize, mut req: Request, target: Target) -> bool {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        let caller = req.tag;
        req.tag = tag;
        let bytes = req.data_bytes(&self.geo);
        match self.child.submit(req) {
            Ok(()) => {
                self.sent.insert(tag, (c, target));
                let class = &mut self.classes[c];
                class.stats.dispatched += 1;
                class.stats.dispatched_bytes += bytes;
                if !class.foreground {
                    self.bg_on_child += 1;
                }
                true
            }
            Err(r) => {
                let mut req = r.request;
                req.tag = caller;
                let full = matches!(r.error, DeviceError::QueueFull { .. });
                match (target, full) {
                    (Target::Caller(_), true) => self.classes[c].queue.push_front(req),
                    (
                        Target::Span {
                            parent,
                            offset,
                            len,
                        },
                        true,
                    ) => self.classes[c].spans.push_front(PendingSpan {
                        parent,
                        offset,
                        len,
                        req,
                    }),
                    (target, false) => self.route(c, target, Completion::of(req, Err(r.error))),
                }
                !full
            }
        }
    }

    fn complete(&mut self, c: usize, done: Completion) {
        self.poison.observe(done.op, &done.status);
        let class = &mut self.classes[c];
        if class.alive {
            class.ready.push(done);
            self.routed = true;
        }
    }

    /// Hands a finished child command to its caller or to its split request.
    fn route(&mut self, c: usize, target: Target, mut done: Completion) {
        let (parent, offset, len) = match target {
            Target::Caller(tag) => {
                done.tag = tag;
                return self.complete(c, done);
            }
            Target::Span {
                parent,
                offset,
                len,
            } => (parent, offset, len),
        };
        let Some(p) = self.parents.get_mut(&parent) else {
            return;
        };
        match &done.status {
            Ok(()) if done.op == Opcode::Read => {
                if let (Some(src), Some(dst)) = (&done.buf, p.req.buf.as_mut()) {
                    dst[offset..offset + len].copy_from_slice(&src[..len]);
                }
            }
            Ok(()) => {}
            Err(e) => {
                if p.status.is_ok() {
                    p.status = Err(e.clone());
                }
            }
        }
        p.remaining -= 1;
        if p.remaining == 0 {
            if let Some(p) = self.parents.remove(&parent) {
                self.complete(p.class, Completion::of(p.req, p.status));
            }
        }
    }

    fn retire(&mut self, got: Vec<Completion>) {
        for done in got {
            let Some((c, target)) = self.sent.remove(&done.tag) else {
                continue;
            };
            if !self.classes[c].foreground {
                self.bg_on_child -= 1;
            }
            self.route(c, target, done);
        }
    }

    /// Dispatches, reaps what the child has finished (waiting for one completion when `wait`),
    /// and dispatches again into the room the completions made.
    fn turn(&mut self, wait: bool) -> DeviceResult<()> {
        self.dispatch();
        if self.child.in_flight() > 0 {
            self.child.ring_doorbell()?;
            let mut got = Vec::new();
            self.child.poll(&mut got, usize::from(wait))?;
            self.retire(got);
            self.dispatch();
            if self.child.in_flight() > 0 {
                self.child.ring_doorbell()?;
            }
        }
        Ok(())
    }
}

/// How background classes are held back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityOptions {
    /// Background commands allowed on the child at once, all background classes together.
    pub bg_depth: usize,
    /// Background reads, writes, write-zeroes and discards longer than this many bytes are cut
    /// into commands of this size; `None` sends them whole.
    pub bg_chunk: Option<u64>,
}

impl Default for PriorityOptions {
    fn default() -> Self {
        PriorityOptions {
            bg_depth: DEFAULT_BG_DEPTH,
            bg_chunk: None,
        }
    }
}

/// Constructor of the priority drive; see the module docs.
pub struct Priority;

impl Priority {
    /// One handle per weight, all in front of `child`; classes with the largest weight are
    /// foreground, and background commands on the child never exceed `opts.bg_depth`.
    pub fn classes(
        child: Box<dyn BlockDevice>,
        weights: &[u32],
        opts: PriorityOptions,
    ) -> Result<Vec<ClassHandle>, OpenError> {
        let name = child.describe();
        let bg_depth = opts.bg_depth;
        if weights.len() < 2 || weights.len() > MAX_CLASSES {
            return Err(OpenError::Invalid(format!(
                "priority({name}): needs 2 to {MAX_CLASSES} class weights, got {}",
                weights.len()
            )));
        }
        if let Some(w) = weights.iter().find(|&&w| w == 0 || w > MAX_WEIGHT) {
            return Err(OpenError::Invalid(format!(
                "priority({name}): weight {w} is outside 1..={MAX_WEIGHT}"
            )));
        }
        if bg_depth == 0 {
            return Err(OpenError::Invalid(format!(
                "priority({name}): bgdepth must be at least 1 (background must make progress)"
            )));
        }
        let geo = child.geometry();
        let bs = u64::from(geo.block_size);
        let bg_chunk_blocks = match opts.bg_chunk {
            Some(c) if c < bs || !c.is_multiple_of(bs) => {
                return Err(OpenError::Invalid(format!(
                "priority({name}): bgchunk {c} is not a non-zero multiple of the block size ({bs})"
            )))
            }
            Some(c) => Some(c / bs),
            None => None,
        };
        let class_geo = Geometry {
            queue_depth: geo.queue_depth.max(CLASS_QUEUE_DEPTH),
            ..geo
        };
        let top = weights.iter().copied().max().unwrap_or(1);
        let classes = weights
            .iter()
            .map(|&weight| Class {
                weight,
                foreground: weight == top,
                queue: VecDeque::new(),
                spans: VecDeque::new(),
                deficit: 0,
                ready: Vec::new(),
                accepted: 0,
                alive: true,
                stats: ClassStats::default(),
            })
            .collect();
        let sched = Mutex::new(Sched {
            child,
            geo,
            classes,
            bg_depth,
            bg_chunk_blocks,
            bg_on_child: 0,
            sent: HashMap::new(),
            next_tag: 1,
            parents: HashMap::new(),
            next_parent: 1,
            cursor: 0,
            granted: false,
            poison: FlushPoison::default(),
            routed: false,
        });
        let shared = Arc::new(Shared {
            sched,
            reaped: Condvar::new(),
        });
        let list = weights
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join(":");
        Ok((0..weights.len())
            .map(|class| ClassHandle {
                shared: Arc::clone(&shared),
                class,
                geo: class_geo,
                describe: match opts.bg_chunk {
                    Some(c) => {
                        format!("priority({name})?weights={list}&bgdepth={bg_depth}&bgchunk={c}")
                    }
                    None => format!("priority({name})?weights={list}&bgdepth={bg_depth}"),
                },
            })
            .collect())
    }
}

/// One class's view of a priority drive: a [`BlockDevice`] that may live on its own thread.
pub struct ClassHandle {
    shared: Arc<Shared>,
    class: usize,
    geo: Geometry,
    describe: String,
}

impl ClassHandle {
    fn lock(&self) -> MutexGuard<'_, Sched> {
        // A panic elsewhere leaves the queues consistent between steps, so keep serving.
        self.shared.sched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This handle's class index (its position in the weights).
    pub fn class(&self) -> usize {
        self.class
    }

    /// Whether this class is foreground (has the largest weight).
    pub fn is_foreground(&self) -> bool {
        self.lock().classes[self.class].foreground
    }

    /// What this class has sent so far.
    pub fn stats(&self) -> ClassStats {
        self.lock().classes[self.class].stats
    }
}

impl Drop for ClassHandle {
    fn drop(&mut self) {
        let mut s = self.lock();
        let class = &mut s.classes[self.class];
        class.alive = false;
        class.queue.clear();
        class.spans.clear();
        class.ready.clear();
        class.accepted = 0;
        let gone = self.class;
        s.parents.retain(|_, p| p.class != gone);
    }
}

impl BlockDevice for ClassHandle {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        if self.class == 0 {
            self.describe.clone()
        } else {
            format!("{} class {}", self.describe, self.class)
        }
    }

    /// This handle's class, then the shared child.
    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let s = self.lock();
        let class = &s.classes[self.class];
        out.push(
            kura_engine::DriveStats::new("priority")
                .with("class", self.class as u64)
                .with("weight", u64::from(class.weight))
                .with("requests", class.stats.requests)
                .with("dispatched", class.stats.dispatched)
                .with("dispatched_bytes", class.stats.dispatched_bytes),
        );
        kura_engine::device::child_stats(&*s.child, out);
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let mut s = self.lock();
        let req = req.admit(&self.geo, s.classes[self.class].accepted)?;
        let check = s.poison.check(req.op);
        let class = &mut s.classes[self.class];
        class.accepted += 1;
        class.stats.requests += 1;
        match check {
            Ok(()) => class.queue.push_back(req),
            Err(e) => class.ready.push(Completion::of(req, Err(e))),
        }
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.lock().turn(false)
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let mut n = 0;
        loop {
            let mut s = self.lock();
            let target = min_complete.min(s.classes[self.class].accepted + n);
            let mine = &s.classes[self.class];
            let may_block = mine.foreground || !s.classes.iter().any(|c| c.alive && c.foreground);
            let waiting_here = mine.ready.is_empty() && n < target;
            s.turn(waiting_here && may_block)?;
            if std::mem::take(&mut s.routed) {
                self.shared.reaped.notify_all();
            }
            let class = &mut s.classes[self.class];
            let got = class.ready.len();
            class.accepted -= got;
            n += got;
            out.append(&mut class.ready);
            if n >= target {
                return Ok(n);
            }
            let class = &s.classes[self.class];
            let mine_on_child = s.sent.values().any(|&(c, _)| c == self.class);
            if class.queue.is_empty()
                && class.spans.is_empty()
                && !mine_on_child
                && class.ready.is_empty()
            {
                return Err(crate::lost_track("priority drive"));
            }
            if !may_block {
                let nap = self.shared.reaped.wait_timeout(s, BACKGROUND_NAP);
                drop(nap.unwrap_or_else(|p| p.into_inner()));
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.lock().classes[self.class].accepted
    }
}

/// Parses `weights=W0:W1[:...]`.
fn parse_weights(text: &str) -> Result<Vec<u32>, String> {
    text.split(':')
        .map(|w| {
            w.trim().parse::<u32>().map_err(|_| {
                format!(
                    "weight `{w}` in `weights={text}` is not a whole number (as in weights=8:1)"
                )
            })
        })
        .collect()
}

/// Opens `priority(CHILD)?weights=W0:W1&bgdepth=N` as its class-0 handle.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<ClassHandle, OpenError> {
    spec.check_options(PRIORITY_OPTIONS)?;
    let weights = match spec.option("weights") {
        Some(text) => {
            parse_weights(text).map_err(|m| OpenError::Invalid(format!("{spec}: {m}")))?
        }
        None => DEFAULT_WEIGHTS.to_vec(),
    };
    let opts = PriorityOptions {
        bg_depth: spec
            .num_option::<usize>("bgdepth")?
            .unwrap_or(DEFAULT_BG_DEPTH),
        bg_chunk: spec.size_option("bgchunk")?,
    };
    let mut kids = crate::open_children(spec, children, 1, Some(1))?;
    let mut handles =
        Priority::classes(kids.remove(0), &weights, opts).map_err(|e| crate::in_spec(spec, e))?;
    Ok(handles.swap_remove(0))
}
