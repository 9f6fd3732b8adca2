//! Load: 32 concurrent clients on two exports for a bounded time (2 s), each pipelining random
//! reads and writes in its own region and checking every read against its own model. No error
//! may occur, memory stays bounded, and the exports hold exactly what the models say.

mod common;

use common::{mem_disk, pattern, start};
use kura_engine::{BlockDevice, Completion, IoBuf, Opcode, Request};
use kura_nbd::client::{connect_with, ConnectOptions};
use kura_nbd::Export;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

const CLIENTS: usize = 32;
const EXPORT_BYTES: u64 = 16 << 20;
const PER_EXPORT: usize = CLIENTS / 2;
const REGION_BLOCKS: u64 = EXPORT_BYTES / 4096 / PER_EXPORT as u64;
const RUN_FOR: Duration = Duration::from_secs(2);

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// One client's work: returns (commands completed, its region's final contents).
fn client(
    addr: std::net::SocketAddr,
    export: &str,
    slot: usize,
    start: &Barrier,
) -> (u64, Vec<u8>) {
    let mut dev = connect_with(
        addr,
        export,
        ConnectOptions {
            queue_depth: 16,
            ..ConnectOptions::default()
        },
    )
    .expect("connect");
    let first = slot as u64 * REGION_BLOCKS;
    let mut model = vec![0u8; (REGION_BLOCKS * 4096) as usize];
    let mut rng = SmallRng::seed_from_u64(slot as u64 * 31 + export.len() as u64);
    let mut done = 0u64;
    let mut comps: Vec<Completion> = Vec::new();
    start.wait();
    let deadline = Instant::now() + RUN_FOR;
    let mut round = 0u64;
    while Instant::now() < deadline {
        round += 1;
        let mut batch: Vec<(Opcode, u64, u64)> = Vec::new();
        for _ in 0..rng.gen_range(1..=12) {
            let op = match rng.gen_range(0..10) {
                0..=4 => Opcode::Read,
                5..=8 => Opcode::Write,
                _ => Opcode::WriteZeroes,
            };
            let n = rng.gen_range(1..=16u64);
            let lba = rng.gen_range(0..REGION_BLOCKS - n);
            let clash = batch.iter().any(|&(o, l, m)| {
                (o != Opcode::Read || op != Opcode::Read) && lba < l + m && l < lba + n
            });
            if !clash {
                batch.push((op, lba, n));
            }
        }
        for (i, &(op, lba, n)) in batch.iter().enumerate() {
            let range = lba as usize * 4096..(lba + n) as usize * 4096;
            let req = match op {
                Opcode::Read => Request::read(i as u64, first + lba, n, IoBuf::zeroed(range.len())),
                Opcode::Write => {
                    let data = pattern(range.len(), round * 64 + i as u64);
                    model[range].copy_from_slice(&data);
                    Request::write(i as u64, first + lba, n, IoBuf::from_slice(&data))
                }
                _ => {
                    model[range].fill(0);
                    Request::write_zeroes(i as u64, first + lba, n)
                }
            };
            dev.submit(req).expect("submit");
        }
        comps.clear();
        while dev.in_flight() > 0 {
            dev.poll(&mut comps, 1).expect("poll");
        }
        for c in comps.drain(..) {
            c.status.as_ref().expect("command failed");
            if c.op == Opcode::Read {
                let (_, lba, n) = batch[c.tag as usize];
                let range = lba as usize * 4096..(lba + n) as usize * 4096;
                let buf = c.buf.expect("read buffer");
                assert!(
                    buf[..range.len()] == model[range],
                    "client {slot}: stale read"
                );
            }
            done += 1;
        }
    }
    dev.close().expect("close");
    (done, model)
}

#[test]
fn thirty_two_clients_for_two_seconds_without_an_error() {
    let (a, store_a) = mem_disk(EXPORT_BYTES);
    let (b, store_b) = mem_disk(EXPORT_BYTES);
    let server = start(vec![Export::new("a", a), Export::new("b", b)]);
    let addr = server.local_addr();
    let rss_before = rss_kib("VmRSS:");
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let t = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let export = if i % 2 == 0 { "a" } else { "b" };
            thread::spawn(move || client(addr, export, i / 2, &barrier))
        })
        .collect();
    let results: Vec<(u64, Vec<u8>)> = handles
        .into_iter()
        .map(|h| h.join().expect("a client failed"))
        .collect();
    let elapsed = t.elapsed();
    let total: u64 = results.iter().map(|r| r.0).sum();
    let stats = server.stats();
    let peak = rss_kib("VmHWM:");
    eprintln!(
        "{CLIENTS} clients, {elapsed:.1?}: {total} commands ({:.0}/s), server saw {} requests, \
         {} MB in, {} MB out; RSS {} MiB before, peak {} MiB",
        total as f64 / elapsed.as_secs_f64(),
        stats.requests,
        stats.bytes_in >> 20,
        stats.bytes_out >> 20,
        rss_before >> 10,
        peak >> 10
    );
    assert!(
        elapsed < RUN_FOR + Duration::from_secs(8),
        "the run was not bounded"
    );
    assert!(
        results.iter().all(|r| r.0 > 0),
        "every client made progress"
    );
    assert_eq!(stats.connections, CLIENTS as u64);
    assert_eq!(stats.error_replies, 0, "{stats:?}");
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
    // The pool arena (128 MiB), the RAM disks (32 MiB) and the per-connection buffers bound
    // what the process can grow by; a leak per request would blow far past this.
    assert!(
        peak.saturating_sub(rss_before) < 512 << 10,
        "memory grew from {rss_before} KiB to {peak} KiB"
    );
    drop(server.stop());
    for (i, (_, model)) in results.iter().enumerate() {
        let store = if i % 2 == 0 { &store_a } else { &store_b };
        let at = (i / 2) * model.len();
        assert!(
            store.lock().unwrap()[at..at + model.len()] == model[..],
            "client {i}'s region differs"
        );
    }
}
