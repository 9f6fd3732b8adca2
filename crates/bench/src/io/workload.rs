//! The closed-loop workload runner every `kura bench io` figure comes from: keep `depth` requests
//! of one pattern in flight on a device for a bounded time (or op count), and record each
//! request's latency from submission to completion.

use kura_engine::{BlockDevice, BufferPool, Completion, IoBuf, Request};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// What each request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    RandRead,
    RandWrite,
    /// A write followed by a flush, timed together (queue depth 1 only).
    RandWriteFlush,
    SeqRead,
    SeqWrite,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::RandRead => "read",
            Pattern::RandWrite => "write",
            Pattern::RandWriteFlush => "write+flush",
            Pattern::SeqRead => "seqread",
            Pattern::SeqWrite => "seqwrite",
        }
    }

    fn writes(self) -> bool {
        matches!(
            self,
            Pattern::RandWrite | Pattern::RandWriteFlush | Pattern::SeqWrite
        )
    }
}

/// One run's shape.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub pattern: Pattern,
    pub bytes: usize,
    pub depth: usize,
    pub duration: Duration,
    pub max_ops: u64,
    pub seed: u64,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Per-request latency in µs, sorted.
    pub latencies_us: Vec<f64>,
    pub elapsed: Duration,
    pub bytes: u64,
}

impl Outcome {
    pub fn ops(&self) -> u64 {
        self.latencies_us.len() as u64
    }

    pub fn iops(&self) -> f64 {
        self.ops() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / 1048576.0 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn mean_us(&self) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        self.latencies_us.iter().sum::<f64>() / self.latencies_us.len() as f64
    }

    /// The `p`-th percentile (0–100) by nearest rank.
    pub fn percentile_us(&self, p: f64) -> f64 {
        percentile(&self.latencies_us, p)
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs `job` on `dev` and returns what it measured.
pub fn run(dev: &mut dyn BlockDevice, job: &Job) -> anyhow::Result<Outcome> {
    run_within(dev, job, u64::MAX)
}

/// Runs `job` on the first `span_bytes` of `dev` (all of it when the device is smaller): a
/// benchmark on a large real device touches only the region it filled.
pub fn run_within(
    dev: &mut dyn BlockDevice,
    job: &Job,
    span_bytes: u64,
) -> anyhow::Result<Outcome> {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    if job.bytes == 0 || !job.bytes.is_multiple_of(bs) {
        anyhow::bail!(
            "transfer size {} is not a whole number of {bs}-byte blocks",
            job.bytes
        );
    }
    let blocks = (job.bytes / bs) as u64;
    let span_blocks = geo.num_blocks.min(span_bytes / u64::from(geo.block_size));
    let slots = span_blocks / blocks;
    if slots == 0 {
        anyhow::bail!(
            "region of {span_blocks} blocks is smaller than one {}-byte transfer",
            job.bytes
        );
    }
    let depth = job.depth.clamp(1, geo.queue_depth as usize);
    let flush_each = job.pattern == Pattern::RandWriteFlush;
    let pool = BufferPool::global();
    let mut rng = SmallRng::seed_from_u64(job.seed);
    let mut free: Vec<IoBuf> = Vec::with_capacity(depth);
    for _ in 0..depth {
        let mut buf = pool
            .alloc(job.bytes)
            .or_else(|_| Ok::<_, anyhow::Error>(IoBuf::heap(job.bytes, 4096)))?;
        if job.pattern.writes() {
            rng.fill(&mut buf[..]);
        }
        free.push(buf);
    }
    let mut started: Vec<Instant> = vec![Instant::now(); depth];
    let mut tags_free: Vec<u64> = (0..depth as u64).collect();
    let mut next_seq = 0u64;
    let mut out = Outcome::default();
    let mut done: Vec<Completion> = Vec::with_capacity(depth);
    let begin = Instant::now();
    let mut issued = 0u64;
    let mut stop = false;
    loop {
        while !stop && dev.in_flight() < depth {
            let (Some(buf), Some(tag)) = (free.pop(), tags_free.pop()) else {
                break;
            };
            let lba = match job.pattern {
                Pattern::SeqRead | Pattern::SeqWrite => {
                    let l = (next_seq % slots) * blocks;
                    next_seq += 1;
                    l
                }
                _ => rng.gen_range(0..slots) * blocks,
            };
            let req = if job.pattern.writes() {
                Request::write(tag, lba, blocks, buf)
            } else {
                Request::read(tag, lba, blocks, buf)
            };
            started[tag as usize] = Instant::now();
            dev.submit(req)
                .map_err(|r| anyhow::anyhow!("{}: {}", dev.describe(), r.error))?;
            issued += 1;
            if issued >= job.max_ops {
                stop = true;
            }
        }
        if dev.in_flight() == 0 {
            break;
        }
        dev.poll(&mut done, 1)?;
        for c in done.drain(..) {
            c.status
                .map_err(|e| anyhow::anyhow!("{}: {e}", dev.describe()))?;
            if flush_each {
                let f = kura_engine::BlockingIo::run(dev, Request::flush(u64::MAX))?;
                f.status?;
            }
            out.latencies_us
                .push(started[c.tag as usize].elapsed().as_secs_f64() * 1e6);
            out.bytes += job.bytes as u64;
            if let Some(buf) = c.buf {
                free.push(buf);
            }
            tags_free.push(c.tag);
        }
        if begin.elapsed() >= job.duration {
            stop = true;
        }
    }
    out.elapsed = begin.elapsed();
    out.latencies_us.sort_by(f64::total_cmp);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn runs_the_requested_number_of_ops_at_depth() {
        let mut dev = kura_engine::open("mem:16M").unwrap();
        for pattern in [
            Pattern::RandRead,
            Pattern::RandWrite,
            Pattern::RandWriteFlush,
            Pattern::SeqRead,
            Pattern::SeqWrite,
        ] {
            let job = Job {
                pattern,
                bytes: 8192,
                depth: 16,
                duration: Duration::from_secs(30),
                max_ops: 500,
                seed: 1,
            };
            let out = run(&mut *dev, &job).unwrap();
            assert_eq!(out.ops(), 500, "{pattern:?}");
            assert_eq!(out.bytes, 500 * 8192);
            assert!(out.latencies_us.windows(2).all(|w| w[0] <= w[1]));
        }
        let mut null = kura_engine::open("null:1G").unwrap();
        let job = Job {
            pattern: Pattern::RandRead,
            bytes: 4096,
            depth: 128,
            duration: Duration::from_secs(30),
            max_ops: 10_000,
            seed: 2,
        };
        assert_eq!(run(&mut *null, &job).unwrap().ops(), 10_000);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let mut dev = kura_engine::open("mem:1M").unwrap();
        let job = Job {
            pattern: Pattern::RandRead,
            bytes: 1000,
            depth: 1,
            duration: Duration::from_secs(1),
            max_ops: 1,
            seed: 0,
        };
        assert!(run(&mut *dev, &job).is_err());
        let job = Job {
            bytes: 2 << 20,
            ..job
        };
        assert!(run(&mut *dev, &job).is_err());
    }
}
