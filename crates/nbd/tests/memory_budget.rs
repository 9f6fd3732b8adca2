//! 256 clients pipelining 1 MiB reads stay under the server's global in-flight budget (issue
//! 13): readers past the budget stop reading from their sockets instead of allocating.
//!
//! The peak resident set (`VmHWM` in /proc/self/status) is process-wide, so this file holds one
//! test (plus an ignored one, run alone, that shows the same load without a global budget).
//! The bound is generous: the budget plus room for 768 thread stacks, socket-side buffers and
//! the allocator's slack; without the budget the same load holds ~1 GiB in flight.

mod common;

use common::Raw;
use kura_nbd::protocol::{Command, RequestHeader, SimpleReply, SIMPLE_REPLY_LEN};
use kura_nbd::{bind_loopback, serve, Export, ServeOptions};
use std::io::{Read, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const CLIENTS: usize = 256;
const DEPTH: u64 = 4;
const ROUNDS: u64 = 2;

/// A field of /proc/self/status in bytes (the kernel reports kB).
fn status_bytes(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("{field} missing from /proc/self/status"))
}

/// Runs the load against a server with a global budget of `budget` bytes; returns (VmHWM before,
/// VmHWM after, the server's peak bytes in flight).
fn load(budget: u64) -> (u64, u64, u64) {
    let before = status_bytes("VmHWM:");
    let dev = kura_engine::open("null:1G").expect("null device");
    let opts = ServeOptions {
        max_clients: CLIENTS + 8,
        max_per_peer: CLIENTS + 8,
        max_total_in_flight_bytes: budget,
        ..ServeOptions::default()
    };
    let server = serve(
        bind_loopback(0).expect("bind"),
        vec![Export::new("", dev)],
        opts,
    )
    .expect("serve");
    let addr = server.local_addr();
    let start = Barrier::new(CLIENTS);
    let start = Arc::new(start);
    let began = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let start = Arc::clone(&start);
            thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    let (mut r, _) = Raw::open(addr, "");
                    r.s.set_read_timeout(Some(Duration::from_secs(300)))
                        .expect("timeout");
                    // Payloads are read through a small buffer: the clients' own memory must
                    // not hide the server's.
                    let mut chunk = vec![0u8; 64 << 10];
                    start.wait();
                    for round in 0..ROUNDS {
                        let mut wire = Vec::new();
                        for i in 0..DEPTH {
                            let h = RequestHeader {
                                flags: 0,
                                command: Command::Read,
                                cookie: round * DEPTH + i,
                                offset: ((c as u64 * DEPTH + i) % 1000) * MIB,
                                length: MIB as u32,
                            };
                            wire.extend_from_slice(&h.encode());
                        }
                        r.s.write_all(&wire).expect("send reads");
                        // Slow readers: the replies pile up in the server unless the budget
                        // stops it from taking on more.
                        thread::sleep(Duration::from_millis(300));
                        for _ in 0..DEPTH {
                            let mut h = [0u8; SIMPLE_REPLY_LEN];
                            r.s.read_exact(&mut h).expect("reply header");
                            let reply = SimpleReply::decode(&h).expect("reply");
                            assert_eq!(reply.error, 0);
                            let mut left = MIB as usize;
                            while left > 0 {
                                let n = left.min(chunk.len());
                                r.s.read_exact(&mut chunk[..n]).expect("payload");
                                assert!(chunk[..n].iter().all(|&b| b == 0), "null: reads zeroes");
                                left -= n;
                            }
                        }
                    }
                })
                .expect("spawn client")
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    let took = began.elapsed();
    let stats = server.stats();
    server.stop();
    let after = status_bytes("VmHWM:");
    println!(
        "{CLIENTS} clients x {DEPTH} x 1 MiB reads x {ROUNDS} rounds in {took:?}; global budget \
         {} MiB; server peak in flight {:.1} MiB; peak RSS (VmHWM) {:.1} MiB before, {:.1} MiB \
         after (+{:.1} MiB); buffer pool peak use {:.1} MiB",
        budget / MIB,
        stats.peak_in_flight_bytes as f64 / MIB as f64,
        before as f64 / MIB as f64,
        after as f64 / MIB as f64,
        after.saturating_sub(before) as f64 / MIB as f64,
        kura_engine::BufferPool::global().stats().peak_used as f64 / MIB as f64,
    );
    (before, after, stats.peak_in_flight_bytes)
}

#[test]
fn many_clients_pipelining_big_reads_stay_under_the_budget() {
    let budget = 64 * MIB;
    let (before, after, peak) = load(budget);
    assert!(peak <= budget, "in flight {peak} past the budget {budget}");
    assert!(
        peak > budget / 4,
        "the load did reach the budget ({peak} bytes), so the bound below means something"
    );
    let growth = after.saturating_sub(before);
    assert!(
        growth < budget + 160 * MIB,
        "peak RSS grew by {} MiB with a {} MiB budget",
        growth / MIB,
        budget / MIB
    );
}

/// For comparison only (run alone: `-- --ignored`): the same load with a budget too large to
/// bind, so each connection's own 64 MiB limit is all that holds it back.
#[test]
#[ignore]
fn the_same_load_without_a_global_budget() {
    load(64 << 30);
}
