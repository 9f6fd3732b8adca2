//! `throttle(CHILD)?mbps=N&lat_us=N&slow_us=N&slow_pct=P&seed=S` — the child made slower on
//! purpose, for tests and benches that need a device slower than its caller (back-pressure) or
//! one whose commands take unequal times (out-of-order retirement).
//!
//! It owns only *when* a completion is handed back; every command goes to the child at once and
//! unchanged (no copy), and the child's status comes back as it is. Each command is given a due
//! time when it is submitted: the later of
//! - the moment a modeled link of `mbps` megabytes per second (10^6 bytes) finishes moving its
//!   data, commands taking the link one after another in submission order (no `mbps`: no link),
//! - the submission time plus a latency: `lat_us`, or `slow_us` for a seeded `slow_pct` percent
//!   of the commands (each command drawn on its own, so they overlap as on a real drive).
//!
//! A completion is returned no earlier than its due time, nor before the child completed it.
//! Nothing else changes: ordering, flush semantics and poisoning are the child's.

use kura_engine::open::ChildOpener;
use kura_engine::{
    BlockDevice, Completion, DeviceResult, Geometry, OpenError, Rejected, Request, Spec,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long `poll` waits before looking at the child again while some completions are held
/// for their due time and others are due but not yet back from the child.
const RECHECK: Duration = Duration::from_micros(20);

/// Options of `throttle(...)`.
pub const THROTTLE_OPTIONS: &[&str] = &["mbps", "lat_us", "slow_us", "slow_pct", "seed"];

/// How much slower the drive is than its child.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ThrottleOptions {
    /// Bandwidth of the modeled link in 10^6 bytes per second; `None`: unlimited.
    pub mbps: Option<f64>,
    /// Latency of every command.
    pub lat: Duration,
    /// Latency of the slow commands.
    pub slow: Duration,
    /// Share of commands that are slow, 0 to 100.
    pub slow_pct: f64,
    pub seed: u64,
}

/// Counters of a throttle drive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThrottleStats {
    pub commands: u64,
    pub slow_commands: u64,
    pub bytes: u64,
    /// Completions the child had finished before their due time, so the drive held them.
    pub held: u64,
}

/// The throttling drive.
pub struct Throttle {
    child: Box<dyn BlockDevice>,
    geo: Geometry,
    opts: ThrottleOptions,
    /// splitmix64 state for the seeded choice of slow commands.
    rng: u64,
    /// When the modeled link is next free.
    link_free: Instant,
    next_tag: u64,
    /// Commands at the child: its tag → (the caller's tag, due time).
    at_child: HashMap<u64, (u64, Instant)>,
    /// Completions back from the child, waiting for their due time.
    held: Vec<(Instant, Completion)>,
    scratch: Vec<Completion>,
    stats: ThrottleStats,
}

impl Throttle {
    pub fn new(child: Box<dyn BlockDevice>, opts: ThrottleOptions) -> Result<Self, OpenError> {
        if opts.mbps.is_some_and(|m| !(m.is_finite() && m > 0.0)) {
            return Err(OpenError::Invalid(format!(
                "throttle: mbps must be a positive number, not {}",
                opts.mbps.unwrap_or_default()
            )));
        }
        if !(0.0..=100.0).contains(&opts.slow_pct) {
            return Err(OpenError::Invalid(format!(
                "throttle: slow_pct={} must be a percentage from 0 to 100",
                opts.slow_pct
            )));
        }
        Ok(Throttle {
            geo: child.geometry(),
            child,
            rng: opts.seed,
            opts,
            link_free: Instant::now(),
            next_tag: 0,
            at_child: HashMap::new(),
            held: Vec::new(),
            scratch: Vec::new(),
            stats: ThrottleStats::default(),
        })
    }

    pub fn throttle_stats(&self) -> ThrottleStats {
        self.stats
    }

    /// A seeded uniform number in [0, 1) (splitmix64).
    fn uniform(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as f64 / (u64::MAX as f64 + 1.0)
    }

    fn due(&mut self, bytes: u64, now: Instant) -> Instant {
        let slow = self.opts.slow_pct > 0.0 && self.uniform() * 100.0 < self.opts.slow_pct;
        if slow {
            self.stats.slow_commands += 1;
        }
        let lat = if slow { self.opts.slow } else { self.opts.lat };
        let mut due = now + lat;
        if let Some(mbps) = self.opts.mbps {
            let start = self.link_free.max(now);
            self.link_free = start + Duration::from_secs_f64(bytes as f64 / (mbps * 1e6));
            due = due.max(self.link_free);
        }
        due
    }

    /// Moves what the child finished into `held`, waiting for at least one when `wait`.
    fn collect(&mut self, wait: bool) -> DeviceResult<()> {
        let min = usize::from(wait && self.child.in_flight() > 0);
        self.child.poll(&mut self.scratch, min)?;
        let now = Instant::now();
        for mut c in self.scratch.drain(..) {
            let Some((tag, due)) = self.at_child.remove(&c.tag) else {
                return Err(crate::lost_track("throttle"));
            };
            c.tag = tag;
            if due > now {
                self.stats.held += 1;
            }
            self.held.push((due, c));
        }
        Ok(())
    }

    /// Hands over every held completion whose time has come.
    fn release(&mut self, out: &mut Vec<Completion>) -> usize {
        let now = Instant::now();
        let before = out.len();
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].0 <= now {
                out.push(self.held.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        out.len() - before
    }
}

impl BlockDevice for Throttle {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        format!("throttle({})", self.child.describe())
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let mut req = req.admit(&self.geo, self.in_flight())?;
        let now = Instant::now();
        let bytes = req.data_bytes(&self.geo);
        let due = self.due(bytes, now);
        let tag = self.next_tag;
        self.next_tag += 1;
        let caller = std::mem::replace(&mut req.tag, tag);
        if let Err(mut r) = self.child.submit(req) {
            r.request.tag = caller;
            return Err(r);
        }
        self.at_child.insert(tag, (caller, due));
        self.stats.commands += 1;
        self.stats.bytes += bytes;
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        crate::ring_if_busy(self.child.as_mut())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let target = min_complete.min(self.in_flight());
        let mut n = 0;
        loop {
            self.collect(false)?;
            n += self.release(out);
            if n >= target {
                return Ok(n);
            }
            // The earliest due time of anything not yet handed over.
            let now = Instant::now();
            let next = self
                .held
                .iter()
                .map(|(due, _)| *due)
                .chain(self.at_child.values().map(|(_, due)| *due))
                .min();
            match next {
                Some(due) if due > now => std::thread::sleep(due - now),
                // Due already, but the child has not finished it: wait for the child.
                Some(_) if self.held.is_empty() => self.collect(true)?,
                // Due already at the child, while held ones wait for their time: look at the
                // child again shortly rather than spin on it or sleep past either.
                Some(_) => std::thread::sleep(RECHECK),
                None => return Err(crate::lost_track("throttle")),
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.at_child.len() + self.held.len()
    }

    /// The child's: throttling changes when data arrives, not what it is.
    fn allocation(
        &mut self,
        lba: u64,
        blocks: u64,
    ) -> DeviceResult<Option<Vec<kura_engine::Extent>>> {
        self.child.allocation(lba, blocks)
    }

    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let s = self.stats;
        out.push(
            kura_engine::DriveStats::new("throttle")
                .with("commands", s.commands)
                .with("slow_commands", s.slow_commands)
                .with("bytes", s.bytes)
                .with("held", s.held),
        );
        kura_engine::device::child_stats(&*self.child, out);
    }
}

/// Opens `throttle(CHILD)?mbps=N&lat_us=N&slow_us=N&slow_pct=P&seed=S`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Throttle, OpenError> {
    spec.check_options(THROTTLE_OPTIONS)?;
    let us = |key: &str| -> Result<Duration, OpenError> {
        Ok(Duration::from_micros(
            spec.num_option::<u64>(key)?.unwrap_or(0),
        ))
    };
    let opts = ThrottleOptions {
        mbps: spec.num_option::<f64>("mbps")?,
        lat: us("lat_us")?,
        slow: us("slow_us")?,
        slow_pct: spec.num_option::<f64>("slow_pct")?.unwrap_or(0.0),
        seed: spec.num_option("seed")?.unwrap_or(0),
    };
    let child = crate::open_children(spec, children, 1, Some(1))?.remove(0);
    Throttle::new(child, opts).map_err(|e| crate::in_spec(spec, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kura_engine::backend::common::QueueOptions;
    use kura_engine::backend::mem::MemDevice;
    use kura_engine::{BlockingIo, BufferPool, Opcode};

    fn over_mem(opts: ThrottleOptions) -> Throttle {
        Throttle::new(
            Box::new(MemDevice::new(8 << 20, QueueOptions::default())),
            opts,
        )
        .expect("throttle")
    }

    #[test]
    fn data_reads_back_and_stats_count_commands() {
        let mut dev = over_mem(ThrottleOptions {
            mbps: Some(1000.0),
            ..ThrottleOptions::default()
        });
        let data: Vec<u8> = (0..8192).map(|i| (i % 251) as u8).collect();
        dev.write_blocks(3, &data).expect("write");
        dev.flush_all().expect("flush");
        let mut back = vec![0; 8192];
        dev.read_blocks(3, &mut back).expect("read");
        assert_eq!(back, data);
        let s = dev.throttle_stats();
        assert_eq!(s.commands, 3);
        assert_eq!(s.bytes, 16384);
        let stats = kura_engine::device::stats_of(&dev);
        assert_eq!(stats[0].kind, "throttle");
        assert_eq!(stats[1].kind, "mem");
    }

    #[test]
    fn a_slow_command_completes_after_a_fast_one_submitted_later() {
        // Every command slow, then none: submission order 0 (slow), 1 (fast).
        let pool = BufferPool::new(1 << 20).expect("pool");
        let mut dev = over_mem(ThrottleOptions {
            slow: Duration::from_secs(3600),
            slow_pct: 100.0,
            ..ThrottleOptions::default()
        });
        dev.submit(Request::write(7, 0, 1, pool.alloc(4096).expect("buf")))
            .expect("submit");
        dev.opts.slow_pct = 0.0;
        dev.submit(Request::write(8, 1, 1, pool.alloc(4096).expect("buf")))
            .expect("submit");
        let mut out = Vec::new();
        assert_eq!(dev.poll(&mut out, 1).expect("poll"), 1);
        assert_eq!(out[0].tag, 8, "the fast command is handed over first");
        assert_eq!(out[0].op, Opcode::Write);
        assert!(out[0].status.is_ok());
        assert_eq!(dev.in_flight(), 1, "the slow one is still held");
        assert_eq!(dev.throttle_stats().slow_commands, 1);
    }

    #[test]
    fn bad_options_are_refused() {
        let err = |s: &str| {
            crate::open(s)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("throttle(mem:1M)?mbps=0").contains("positive"));
        assert!(err("throttle(mem:1M)?slow_pct=101").contains("percentage"));
        assert!(err("throttle(mem:1M)?mpbs=3").contains("did you mean `mbps`"));
        assert!(err("throttle(mem:1M,mem:1M)").contains("exactly 1"));
        assert!(crate::open("throttle(mem:1M)?mbps=50&lat_us=10&slow_us=900&slow_pct=5").is_ok());
    }

    #[test]
    fn passes_the_engine_conformance_suite() {
        let mut dev = crate::open("throttle(mem:8M)?mbps=4000&lat_us=5&slow_us=200&slow_pct=10")
            .expect("open");
        let blocks = dev.geometry().num_blocks;
        for (check, outcome) in kura_engine::conformance::suite(&mut *dev, 0, blocks, 11) {
            if let Err(e) = outcome {
                panic!("{check}: {e}");
            }
        }
    }
}
