//! Streaming a range of blocks through a device at queue depth, with a progress bar: how
//! `kura dev write/verify` and `kura demo` move data fast through the asynchronous interface.
//! A signal (see [`crate::interrupt`]) stops it at the next chunk: nothing more is submitted,
//! what is in flight completes, and the stats say where it stopped.

use indicatif::{ProgressBar, ProgressStyle};
use kura_engine::{BlockDevice, BufferPool, Completion, IoBuf, Request};
use std::time::{Duration, Instant};

/// What a stream did.
#[derive(Debug, Clone, Copy)]
pub struct StreamStats {
    pub bytes: u64,
    pub elapsed: Duration,
    /// Set when a signal stopped the stream: the signal and the first block not done (every
    /// block before it completed).
    pub stopped: Option<(i32, u64)>,
}

impl StreamStats {
    pub fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / (1 << 20) as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A progress bar in bytes on stderr (hidden when stderr is not a terminal).
pub fn progress(label: &str, bytes: u64) -> ProgressBar {
    let bar = ProgressBar::new(bytes);
    let style = ProgressStyle::with_template(
        "{msg:>8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(label.to_string());
    bar
}

/// Writes `blocks` blocks from `lba` in chunks of `chunk_blocks`, `depth` chunks in flight, each
/// chunk's contents made by `fill(buffer, first_lba)`.
pub fn write_range(
    dev: &mut dyn BlockDevice,
    lba: u64,
    blocks: u64,
    chunk_blocks: u64,
    depth: usize,
    bar: &ProgressBar,
    mut fill: impl FnMut(&mut [u8], u64),
) -> anyhow::Result<StreamStats> {
    run(
        dev,
        lba,
        blocks,
        chunk_blocks,
        depth,
        bar,
        true,
        |buf, first, _| {
            fill(buf, first);
            Ok(())
        },
    )
}

/// Reads `blocks` blocks from `lba` and hands each chunk to `check(buffer, first_lba)`.
pub fn read_range(
    dev: &mut dyn BlockDevice,
    lba: u64,
    blocks: u64,
    chunk_blocks: u64,
    depth: usize,
    bar: &ProgressBar,
    mut check: impl FnMut(&[u8], u64) -> anyhow::Result<()>,
) -> anyhow::Result<StreamStats> {
    run(
        dev,
        lba,
        blocks,
        chunk_blocks,
        depth,
        bar,
        false,
        |buf, first, _| check(buf, first),
    )
}

#[allow(clippy::too_many_arguments)]
fn run(
    dev: &mut dyn BlockDevice,
    lba: u64,
    blocks: u64,
    chunk_blocks: u64,
    depth: usize,
    bar: &ProgressBar,
    write: bool,
    mut each: impl FnMut(&mut [u8], u64, bool) -> anyhow::Result<()>,
) -> anyhow::Result<StreamStats> {
    let geo = dev.geometry();
    let bs = u64::from(geo.block_size);
    let depth = depth.clamp(1, geo.queue_depth as usize);
    let pool = BufferPool::global();
    let start = Instant::now();
    let mut next = lba;
    let end = lba + blocks;
    let mut done: Vec<Completion> = Vec::with_capacity(depth);
    let mut free: Vec<IoBuf> = Vec::new();
    let mut bytes = 0u64;
    let mut stopped = None;
    while (next < end && stopped.is_none()) || dev.in_flight() > 0 {
        if stopped.is_none() && next < end {
            stopped = crate::interrupt::requested().map(|sig| (sig, next));
        }
        while next < end && stopped.is_none() && dev.in_flight() < depth {
            let n = chunk_blocks.min(end - next);
            let len = (n * bs) as usize;
            let mut buf = match free.pop() {
                Some(mut b) if b.capacity() >= len => {
                    b.set_len(len);
                    b
                }
                _ => pool.alloc(len).unwrap_or_else(|_| IoBuf::heap(len, 4096)),
            };
            let req = if write {
                each(&mut buf, next, true)?;
                Request::write(next, next, n, buf)
            } else {
                Request::read(next, next, n, buf)
            };
            dev.submit(req)
                .map_err(|r| anyhow::anyhow!("submit at LBA {next}: {}", r.error))?;
            next += n;
        }
        if dev.in_flight() == 0 {
            continue;
        }
        dev.poll(&mut done, 1)?;
        for c in done.drain(..) {
            c.status.map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut buf = c
                .buf
                .ok_or_else(|| anyhow::anyhow!("completion {} lost its buffer", c.tag))?;
            if !write {
                each(&mut buf, c.tag, false)?;
            }
            bytes += buf.len() as u64;
            bar.inc(buf.len() as u64);
            free.push(buf);
        }
    }
    Ok(StreamStats {
        bytes,
        elapsed: start.elapsed(),
        stopped,
    })
}
