//! `qos(CHILD)?iops=N&bw=RATE&burst=TIME` — a tenant's share of a device: requests above the
//! limits are held back (never rejected) until token buckets let them through.
//!
//! It owns only *when* a command reaches the child. Each direction has its own pair of token
//! buckets, one counting commands (`iops`) and one counting data bytes (`bw`): reads use the read
//! pair, and writes, write-zeroes and discards the write pair (write-zeroes and discards count as
//! commands but move no data, so they take no `bw` tokens). `iops` and `bw` set both directions;
//! `read_iops`, `write_iops`, `read_bw` and `write_bw` set one. An absent limit is no limit.
//! Flushes are never held: they cover only completed writes, and a held write has not completed.
//!
//! A bucket holds at most `burst` worth of its rate (100 ms by default), and never less than one
//! command or one largest transfer (`max_transfer`), so every request can pass. Commands of one
//! direction leave in submission order (a large one is not overtaken by small ones behind it).
//! Over any interval of length W, what passes is at most `rate * W + capacity` (commands no
//! larger than the capacity; a larger one waits for a full bucket and leaves it in debt).
//!
//! The limits live in a [`QosHandle`] shared with whoever may change them while the drive runs
//! (`kura serve ctl set`); the drive looks at it before every decision.

use kura_engine::open::ChildOpener;
use kura_engine::{
    BlockDevice, Completion, DeviceResult, Geometry, Opcode, OpenError, Rejected, Request, Spec,
};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Options of `qos(...)`.
pub const QOS_OPTIONS: &[&str] = &[
    "iops",
    "bw",
    "read_iops",
    "write_iops",
    "read_bw",
    "write_bw",
    "burst",
];

/// How much a bucket may save up when nobody says.
pub const DEFAULT_BURST: Duration = Duration::from_millis(100);

/// Longest single sleep while requests are held, so that changed limits and the child's
/// completions are looked at soon.
const MAX_NAP: Duration = Duration::from_millis(5);
/// How long `poll` naps while requests are held and others are at the child.
const RECHECK: Duration = Duration::from_micros(50);

/// The limits of one direction; `None`: unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DirLimits {
    /// Commands per second.
    pub iops: Option<f64>,
    /// Data bytes per second.
    pub bw: Option<f64>,
}

/// Every limit of a qos drive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QosLimits {
    pub read: DirLimits,
    pub write: DirLimits,
    /// How much of its rate a bucket may save up.
    pub burst: Duration,
}

impl Default for QosLimits {
    fn default() -> Self {
        QosLimits {
            read: DirLimits::default(),
            write: DirLimits::default(),
            burst: DEFAULT_BURST,
        }
    }
}

/// A limit that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("qos: {0}")]
pub struct QosParseError(String);

impl QosLimits {
    /// Applies `key=value` settings in order over `self`: `iops`, `bw`, `read_iops`,
    /// `write_iops`, `read_bw`, `write_bw` (a number, bandwidths with an optional K/M/G suffix
    /// of bytes per second, or `off` for no limit) and `burst` (`100ms`, `1s`, `500us`).
    pub fn apply<'a>(
        mut self,
        settings: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, QosParseError> {
        for (key, value) in settings {
            let rate = |bytes: bool| -> Result<Option<f64>, QosParseError> {
                if value == "off" {
                    return Ok(None);
                }
                let n = if bytes {
                    kura_engine::spec::parse_size(value)
                        .map(|n| n as f64)
                        .map_err(|m| QosParseError(format!("{key}={value}: {m}")))?
                } else {
                    value.parse::<f64>().map_err(|_| {
                        QosParseError(format!("{key}={value}: not a number (or `off`)"))
                    })?
                };
                if !(n.is_finite() && n > 0.0) {
                    return Err(QosParseError(format!(
                        "{key}={value}: a limit must be a positive number (`off` for none)"
                    )));
                }
                Ok(Some(n))
            };
            match key {
                "iops" => {
                    let r = rate(false)?;
                    self.read.iops = r;
                    self.write.iops = r;
                }
                "bw" => {
                    let r = rate(true)?;
                    self.read.bw = r;
                    self.write.bw = r;
                }
                "read_iops" => self.read.iops = rate(false)?,
                "write_iops" => self.write.iops = rate(false)?,
                "read_bw" => self.read.bw = rate(true)?,
                "write_bw" => self.write.bw = rate(true)?,
                "burst" => self.burst = parse_duration(value)?,
                _ => {
                    let hint = kura_engine::spec::suggest(key, QOS_OPTIONS)
                        .map(|s| format!("; did you mean `{s}`?"))
                        .unwrap_or_default();
                    return Err(QosParseError(format!(
                        "no limit `{key}`{hint} (limits: {})",
                        QOS_OPTIONS.join(", ")
                    )));
                }
            }
        }
        Ok(self)
    }

    /// Parses `key=value,key=value` (the form `kura serve --qos` and `kura serve ctl` take).
    pub fn parse_list(self, text: &str) -> Result<Self, QosParseError> {
        let mut pairs = Vec::new();
        for item in text.split(',').filter(|s| !s.is_empty()) {
            let pair = item
                .split_once('=')
                .ok_or_else(|| QosParseError(format!("`{item}` is not key=value")))?;
            pairs.push(pair);
        }
        self.apply(pairs)
    }

    /// True when nothing is limited.
    pub fn unlimited(&self) -> bool {
        self.read == DirLimits::default() && self.write == DirLimits::default()
    }
}

/// `read_iops=.. read_bw=.. write_iops=.. write_bw=.. burst=..ms`, `off` for no limit; the form
/// [`QosLimits::parse_list`] reads back (with commas).
impl fmt::Display for QosLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: Option<f64>| v.map_or("off".to_string(), |v| format!("{v}"));
        write!(
            f,
            "read_iops={} read_bw={} write_iops={} write_bw={} burst={}us",
            show(self.read.iops),
            show(self.read.bw),
            show(self.write.iops),
            show(self.write.bw),
            self.burst.as_micros()
        )
    }
}

fn parse_duration(value: &str) -> Result<Duration, QosParseError> {
    let bad = || {
        QosParseError(format!(
            "burst={value}: give a time with its unit, as in 100ms, 1s or 500us"
        ))
    };
    let (num, scale) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = value.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(bad());
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = n * scale;
    if !(secs.is_finite() && (0.0..=3600.0).contains(&secs)) {
        return Err(QosParseError(format!(
            "burst={value}: must be from 0 to 1 hour"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The limits of one or more qos drives, changeable while they run: every drive made with a
/// clone of the handle follows the latest [`QosHandle::set`].
#[derive(Debug, Clone, Default)]
pub struct QosHandle {
    inner: Arc<HandleInner>,
}

#[derive(Debug, Default)]
struct HandleInner {
    limits: Mutex<QosLimits>,
    /// Bumped by every `set`, so drives notice a change without taking the lock each time.
    generation: AtomicU64,
}

impl QosHandle {
    pub fn new(limits: QosLimits) -> Self {
        let handle = QosHandle::default();
        handle.set(limits);
        handle
    }

    /// The current limits.
    pub fn limits(&self) -> QosLimits {
        *self
            .inner
            .limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the limits; drives follow at their next submit or poll.
    pub fn set(&self, limits: QosLimits) {
        *self
            .inner
            .limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = limits;
        self.inner.generation.fetch_add(1, Ordering::Release);
    }

    fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }
}

/// A token bucket on an explicit clock (nanoseconds from any origin), so its arithmetic can be
/// tested without sleeping.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    /// Tokens per second.
    rate: f64,
    capacity: f64,
    tokens: f64,
    /// When `tokens` was last brought up to date.
    last_ns: u64,
}

impl TokenBucket {
    /// A full bucket of `rate` tokens per second holding at most `capacity`.
    pub fn new(rate: f64, capacity: f64, now_ns: u64) -> Self {
        TokenBucket {
            rate,
            capacity,
            tokens: capacity,
            last_ns: now_ns,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    fn refill(&mut self, now_ns: u64) {
        if now_ns > self.last_ns {
            let gained = self.rate * (now_ns - self.last_ns) as f64 / 1e9;
            self.tokens = (self.tokens + gained).min(self.capacity);
            self.last_ns = now_ns;
        }
    }

    /// When a command costing `cost` may pass: `now_ns` or later. A cost above the capacity
    /// waits for a full bucket.
    pub fn ready_at(&mut self, cost: f64, now_ns: u64) -> u64 {
        self.refill(now_ns);
        let need = cost.min(self.capacity);
        if self.tokens >= need {
            return now_ns;
        }
        let wait = (need - self.tokens) / self.rate * 1e9;
        now_ns.saturating_add(wait.ceil().max(1.0) as u64)
    }

    /// Takes `cost` tokens; call when [`TokenBucket::ready_at`] said `now_ns`.
    pub fn take(&mut self, cost: f64, now_ns: u64) {
        self.refill(now_ns);
        self.tokens -= cost;
    }

    /// The same bucket with a new rate and capacity, keeping what it holds (up to the new
    /// capacity), so a change cannot hand out a fresh burst.
    fn reconfigured(&self, rate: f64, capacity: f64, now_ns: u64) -> Self {
        let mut b = self.clone();
        b.refill(now_ns);
        TokenBucket {
            rate,
            capacity,
            tokens: b.tokens.min(capacity),
            last_ns: now_ns,
        }
    }
}

/// The buckets and the held commands of one direction.
#[derive(Default)]
struct Direction {
    iops: Option<TokenBucket>,
    bw: Option<TokenBucket>,
    /// Held commands, oldest first, with when they were submitted.
    waiting: VecDeque<(Request, Instant)>,
}

impl Direction {
    fn configure(&mut self, limits: DirLimits, burst: Duration, max_transfer: f64, now_ns: u64) {
        let bucket = |old: &Option<TokenBucket>, rate: Option<f64>, floor: f64| {
            let rate = rate?;
            let capacity = (rate * burst.as_secs_f64()).max(floor);
            Some(match old {
                Some(b) => b.reconfigured(rate, capacity, now_ns),
                None => TokenBucket::new(rate, capacity, now_ns),
            })
        };
        self.iops = bucket(&self.iops, limits.iops, 1.0);
        self.bw = bucket(&self.bw, limits.bw, max_transfer);
    }

    /// When a command moving `bytes` may pass.
    fn ready_at(&mut self, bytes: u64, now_ns: u64) -> u64 {
        let a = self
            .iops
            .as_mut()
            .map_or(now_ns, |b| b.ready_at(1.0, now_ns));
        let b = self
            .bw
            .as_mut()
            .map_or(now_ns, |b| b.ready_at(bytes as f64, now_ns));
        a.max(b)
    }

    fn take(&mut self, bytes: u64, now_ns: u64) {
        if let Some(b) = &mut self.iops {
            b.take(1.0, now_ns);
        }
        if let Some(b) = &mut self.bw {
            b.take(bytes as f64, now_ns);
        }
    }
}

/// Counters of a qos drive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosStats {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Commands that had to wait for tokens.
    pub held: u64,
    /// Total time commands spent held, in microseconds.
    pub held_us: u64,
    /// Times the limits were changed while the drive ran.
    pub limit_changes: u64,
}

/// The rate-limiting drive.
pub struct Qos {
    child: Box<dyn BlockDevice>,
    geo: Geometry,
    handle: QosHandle,
    seen_generation: u64,
    limits: QosLimits,
    origin: Instant,
    /// Read, then write.
    dirs: [Direction; 2],
    /// Held commands the child refused when their time came, to hand back as failed.
    refused: Vec<Completion>,
    stats: QosStats,
    /// No limit is set: requests go straight to the child without touching the buckets (an
    /// unlimited layer, as `kura serve --ctl` puts under every export, then costs a counter).
    unlimited: bool,
}

const READ: usize = 0;
const WRITE: usize = 1;

impl Qos {
    /// A drive over `child` following the limits of `handle`.
    pub fn new(child: Box<dyn BlockDevice>, handle: QosHandle) -> Self {
        let limits = handle.limits();
        let mut qos = Qos {
            geo: child.geometry(),
            child,
            seen_generation: handle.generation(),
            handle,
            limits,
            origin: Instant::now(),
            dirs: [Direction::default(), Direction::default()],
            refused: Vec::new(),
            stats: QosStats::default(),
            unlimited: false,
        };
        qos.configure(limits);
        qos
    }

    /// The handle its limits come from.
    pub fn handle(&self) -> &QosHandle {
        &self.handle
    }

    pub fn qos_stats(&self) -> QosStats {
        self.stats
    }

    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn configure(&mut self, limits: QosLimits) {
        let off = |d: &DirLimits| d.iops.is_none() && d.bw.is_none();
        self.unlimited = off(&limits.read) && off(&limits.write);
        let now = self.now_ns();
        let max = f64::from(self.geo.max_transfer.max(self.geo.block_size));
        self.dirs[READ].configure(limits.read, limits.burst, max, now);
        self.dirs[WRITE].configure(limits.write, limits.burst, max, now);
        self.limits = limits;
    }

    /// Picks up limits changed through the handle.
    fn follow_handle(&mut self) {
        let generation = self.handle.generation();
        if generation != self.seen_generation {
            self.seen_generation = generation;
            let limits = self.handle.limits();
            if limits != self.limits {
                self.stats.limit_changes += 1;
                self.configure(limits);
            }
        }
    }

    /// Unlimited with nothing held or refused: every request in flight is the child's.
    fn holds_nothing(&self) -> bool {
        self.unlimited && self.refused.is_empty() && self.dirs.iter().all(|d| d.waiting.is_empty())
    }

    fn count(&mut self, dir: usize, bytes: u64) {
        if dir == READ {
            self.stats.reads += 1;
            self.stats.read_bytes += bytes;
        } else {
            self.stats.writes += 1;
            self.stats.write_bytes += bytes;
        }
    }

    /// Sends every held command whose tokens have come; returns the earliest time a command
    /// still held may pass.
    fn release(&mut self) -> Option<Instant> {
        self.follow_handle();
        let now_ns = self.now_ns();
        let now = Instant::now();
        let mut next: Option<u64> = None;
        for dir in [READ, WRITE] {
            while let Some((req, _)) = self.dirs[dir].waiting.front() {
                let bytes = req.data_bytes(&self.geo);
                let at = self.dirs[dir].ready_at(bytes, now_ns);
                if at > now_ns {
                    next = Some(next.map_or(at, |n| n.min(at)));
                    break;
                }
                let Some((req, since)) = self.dirs[dir].waiting.pop_front() else {
                    break;
                };
                self.dirs[dir].take(bytes, now_ns);
                self.stats.held_us += now.saturating_duration_since(since).as_micros() as u64;
                self.count(dir, bytes);
                if let Err(r) = self.child.submit(req) {
                    self.refused.push(Completion::of(r.request, Err(r.error)));
                }
            }
        }
        next.map(|ns| self.origin + Duration::from_nanos(ns))
    }
}

impl BlockDevice for Qos {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        format!("qos({})", self.child.describe())
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.in_flight())?;
        let dir = match req.op {
            Opcode::Flush => return self.child.submit(req),
            Opcode::Read => READ,
            Opcode::Write | Opcode::WriteZeroes | Opcode::Discard => WRITE,
        };
        self.follow_handle();
        let bytes = req.data_bytes(&self.geo);
        if self.unlimited && self.dirs[dir].waiting.is_empty() {
            self.child.submit(req)?;
            self.count(dir, bytes);
            return Ok(());
        }
        let now_ns = self.now_ns();
        if self.dirs[dir].waiting.is_empty() && self.dirs[dir].ready_at(bytes, now_ns) <= now_ns {
            self.child.submit(req)?;
            self.dirs[dir].take(bytes, now_ns);
            self.count(dir, bytes);
        } else {
            self.stats.held += 1;
            self.dirs[dir].waiting.push_back((req, Instant::now()));
        }
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        if !self.holds_nothing() {
            self.release();
        }
        crate::ring_if_busy(self.child.as_mut())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        if self.holds_nothing() {
            return self.child.poll(out, min_complete);
        }
        let target = min_complete.min(self.in_flight());
        let mut n = 0;
        loop {
            let next = self.release();
            n += self.refused.len();
            out.append(&mut self.refused);
            if self.child.in_flight() > 0 {
                n += self.child.poll(out, 0)?;
            }
            if n >= target {
                return Ok(n);
            }
            match next {
                // Nothing held: what is left is at the child.
                None => return Ok(n + self.child.poll(out, target - n)?),
                Some(at) => {
                    let mut nap = at.saturating_duration_since(Instant::now()).min(MAX_NAP);
                    if self.child.in_flight() > 0 {
                        nap = nap.min(RECHECK);
                    }
                    std::thread::sleep(nap);
                }
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.child.in_flight()
            + self.refused.len()
            + self.dirs.iter().map(|d| d.waiting.len()).sum::<usize>()
    }

    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let s = self.stats;
        out.push(
            kura_engine::DriveStats::new("qos")
                .with("reads", s.reads)
                .with("writes", s.writes)
                .with("read_bytes", s.read_bytes)
                .with("write_bytes", s.write_bytes)
                .with("held", s.held)
                .with("held_us", s.held_us)
                .with("limit_changes", s.limit_changes),
        );
        kura_engine::device::child_stats(&*self.child, out);
    }
}

/// Opens `qos(CHILD)?iops=N&bw=RATE&read_iops=..&write_iops=..&read_bw=..&write_bw=..&burst=T`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Qos, OpenError> {
    spec.check_options(QOS_OPTIONS)?;
    let limits = QosLimits::default()
        .apply(spec.options.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| OpenError::Invalid(format!("{spec}: {e}")))?;
    let child = crate::open_children(spec, children, 1, Some(1))?.remove(0);
    Ok(Qos::new(child, QosHandle::new(limits)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kura_engine::BlockingIo;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    proptest! {
        /// Whatever the arrivals, what a bucket lets through in any window [a, b] is at most
        /// rate * (b - a) + capacity.
        #[test]
        fn no_window_passes_more_than_rate_times_window_plus_burst(
            rate in 1.0f64..100_000.0,
            burst_ms in 0u64..500,
            arrivals in proptest::collection::vec((0u64..20 * MS, 1u32..64), 1..200),
        ) {
            let capacity = (rate * burst_ms as f64 / 1000.0).max(64.0);
            let mut bucket = TokenBucket::new(rate, capacity, 0);
            // A FIFO of requests with arrival gaps; each passes at the earliest time the
            // bucket allows, not before the one ahead of it.
            let mut now = 0u64;
            let mut passed: Vec<(u64, f64)> = Vec::new();
            for (gap, cost) in arrivals {
                now += gap;
                let cost = f64::from(cost);
                let at = bucket.ready_at(cost, now);
                now = at;
                prop_assert_eq!(bucket.ready_at(cost, at), at);
                bucket.take(cost, at);
                passed.push((at, cost));
            }
            for i in 0..passed.len() {
                let mut sum = 0.0;
                for &(t, cost) in &passed[i..] {
                    sum += cost;
                    let window = (t - passed[i].0) as f64 / 1e9;
                    let bound = rate * window + capacity;
                    prop_assert!(
                        sum <= bound * (1.0 + 1e-9) + 1e-6,
                        "window {window}s passed {sum} > {bound}"
                    );
                }
            }
        }

        /// Settings written with Display read back as the same limits.
        #[test]
        fn limits_read_back_from_their_display(
            r in proptest::option::of(1u32..1_000_000),
            w in proptest::option::of(1u32..1_000_000),
            burst_us in 0u64..10_000_000,
        ) {
            let limits = QosLimits {
                read: DirLimits { iops: r.map(f64::from), bw: w.map(|w| f64::from(w) * 4096.0) },
                write: DirLimits { iops: w.map(f64::from), bw: None },
                burst: Duration::from_micros(burst_us),
            };
            let text = limits.to_string().replace(' ', ",");
            prop_assert_eq!(QosLimits::default().parse_list(&text).unwrap(), limits);
        }
    }

    #[test]
    fn a_command_above_capacity_waits_for_a_full_bucket_and_leaves_debt() {
        let mut b = TokenBucket::new(1000.0, 100.0, 0);
        assert_eq!(b.ready_at(250.0, 0), 0);
        b.take(250.0, 0);
        // 150 in debt: 100 more tokens need 250 ms.
        assert_eq!(b.ready_at(100.0, 0), 250 * MS);
        assert_eq!(b.ready_at(1.0, 0), 151 * MS);
    }

    #[test]
    fn settings_parse_and_bad_ones_say_why() {
        let l = QosLimits::default()
            .parse_list("iops=500,write_bw=4M,burst=20ms")
            .unwrap();
        assert_eq!(l.read.iops, Some(500.0));
        assert_eq!(l.write.iops, Some(500.0));
        assert_eq!(l.write.bw, Some(4.0 * 1048576.0));
        assert_eq!(l.read.bw, None);
        assert_eq!(l.burst, Duration::from_millis(20));
        let off = l.parse_list("read_iops=off").unwrap();
        assert_eq!(off.read.iops, None);
        assert_eq!(off.write.iops, Some(500.0));
        let err = |s: &str| QosLimits::default().parse_list(s).unwrap_err().to_string();
        assert!(err("iops=0").contains("positive"));
        assert!(err("iops=-3").contains("positive"));
        assert!(err("iops=x").contains("not a number"));
        assert!(err("bw=12Q").contains("bw=12Q"));
        assert!(err("burst=10").contains("unit"));
        assert!(err("burst=2h").contains("unit"));
        assert!(err("iosp=3").contains("did you mean `iops`"));
        assert!(err("iops").contains("key=value"));
    }

    #[test]
    fn bad_specs_are_refused() {
        let err = |s: &str| {
            crate::open(s)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("qos(mem:1M)?iops=0").contains("positive"));
        assert!(err("qos(mem:1M)?ipos=3").contains("did you mean `iops`"));
        assert!(err("qos(mem:1M,mem:1M)").contains("exactly 1"));
        assert!(crate::open("qos(mem:1M)?iops=100&bw=1M&burst=10ms").is_ok());
    }

    #[test]
    fn held_commands_pass_at_the_limit_and_are_counted() {
        let handle = QosHandle::new(
            QosLimits::default()
                .parse_list("iops=200,burst=0s")
                .unwrap(),
        );
        let child = crate::open("mem:1M").unwrap();
        let mut dev = Qos::new(child, handle.clone());
        let data = vec![7u8; 4096];
        let start = Instant::now();
        for lba in 0..21 {
            dev.write_blocks(lba, &data).unwrap();
        }
        // One passes at once, twenty wait 5 ms each.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(95), "{took:?}");
        let s = dev.qos_stats();
        assert_eq!(s.writes, 21);
        assert_eq!(s.write_bytes, 21 * 4096);
        assert!(s.held >= 19, "{s:?}");
        // Lifting the limit through the handle takes effect at once.
        handle.set(QosLimits::default());
        let start = Instant::now();
        let mut back = vec![0u8; 4096];
        for lba in 0..200 {
            dev.read_blocks(lba % 21, &mut back).unwrap();
        }
        assert!(start.elapsed() < Duration::from_millis(500));
        assert_eq!(back, data);
        assert_eq!(dev.qos_stats().limit_changes, 1);
        let stats = kura_engine::device::stats_of(&dev);
        assert_eq!(stats[0].kind, "qos");
        assert_eq!(stats[1].kind, "mem");
    }

    #[test]
    fn an_unlimited_drive_passes_straight_through_until_a_limit_is_set() {
        let handle = QosHandle::new(QosLimits::default());
        let mut dev = Qos::new(crate::open("mem:1M").unwrap(), handle.clone());
        let data = vec![3u8; 4096];
        for lba in 0..10 {
            dev.write_blocks(lba, &data).unwrap();
        }
        assert_eq!((dev.qos_stats().writes, dev.qos_stats().held), (10, 0));
        handle.set(
            QosLimits::default()
                .parse_list("write_iops=100,burst=0s")
                .unwrap(),
        );
        for tag in 0..5 {
            let mut buf = kura_engine::BufferPool::global().alloc(4096).unwrap();
            buf.copy_from_slice(&data);
            dev.submit(Request::write(tag, 20 + tag, 1, buf)).unwrap();
        }
        assert!(dev.qos_stats().held >= 4, "{:?}", dev.qos_stats());
        // Lifted while they are held: the next poll, which does not wait, sends and answers
        // them all (under the limit it would answer one).
        handle.set(QosLimits::default());
        let mut out = Vec::new();
        dev.poll(&mut out, 0).unwrap();
        assert_eq!(out.len(), 5);
        assert!(out.iter().all(|c| c.status.is_ok()));
        assert_eq!((dev.in_flight(), dev.qos_stats().writes), (0, 15));
        let mut back = vec![0u8; 4096];
        dev.read_blocks(24, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn passes_the_engine_conformance_suite() {
        let mut dev =
            crate::open("qos(mem:8M)?iops=20000&bw=400M&read_iops=50000&burst=1ms").expect("open");
        let blocks = dev.geometry().num_blocks;
        for (check, outcome) in kura_engine::conformance::suite(&mut *dev, 0, blocks, 11) {
            if let Err(e) = outcome {
                panic!("{check}: {e}");
            }
        }
        assert!(
            kura_engine::device::stats_of(&*dev)[0]
                .counter("held")
                .unwrap_or(0)
                > 0,
            "the suite should have run into the limits"
        );
    }
}
