//! Many reader threads get (and read through snapshots) while one writer overwrites and deletes
//! keys and the background worker flushes, merges and frees segments underneath them: every get
//! returns a value the key really had at some moment between the get's start and its end (a
//! linearizability check per key against what the writer published, no timing involved), and a
//! snapshot keeps answering what it first answered. Run on a RAM disk with sibling queues (the
//! readers then read on queues of their own) and on one without (they share the store's queue).

mod common;

use common::{options, ram_disk};
use kura_engine::{BlockDevice, Completion, DriveStats, Geometry, Rejected, Request};
use kura_store::{Store, StoreOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const KEYS: usize = 48;
const VERSIONS: u64 = 250;
const READERS: usize = 4;

fn key(k: usize) -> Vec<u8> {
    format!("key-{k:04}").into_bytes()
}

/// Version `v` of key `k` deletes it when `v % 7 == 3`; otherwise it is a value naming both,
/// long (separated into the run's value area) for odd versions, short (inline) for even ones.
fn is_delete(v: u64) -> bool {
    v % 7 == 3
}

fn value(k: usize, v: u64) -> Vec<u8> {
    let head = format!("k{k}-v{v}-");
    let len = if v % 2 == 1 { 600 } else { 40 };
    let mut out = head.into_bytes();
    out.resize(len, b'a' + (v % 26) as u8);
    out
}

/// The version a value read for key `k` holds (checking every byte of it).
fn version_of(k: usize, got: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(got);
    let v: u64 = text
        .strip_prefix(&format!("k{k}-v"))
        .and_then(|rest| rest.split('-').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("key {k}: a value not written for it: {text:?}"));
    assert_eq!(got, value(k, v), "key {k}: version {v}'s bytes differ");
    v
}

/// Per key, the newest version whose put/delete has returned (`done`) and the newest one
/// started (`started`): a get that starts after `done` was read and ends before `started` is
/// read again must see a version in between.
struct Published {
    started: Vec<AtomicU64>,
    done: Vec<AtomicU64>,
    stop: AtomicBool,
}

fn check_get(store: &Store, p: &Published, k: usize) {
    let lo = p.done[k].load(Ordering::SeqCst);
    let got = store.get(&key(k)).expect("get");
    let hi = p.started[k].load(Ordering::SeqCst);
    match got {
        Some(v) => {
            let v = version_of(k, &v);
            assert!(
                (lo..=hi).contains(&v) && !is_delete(v),
                "key {k}: got version {v}, expected one in {lo}..={hi}"
            );
        }
        None => assert!(
            lo == 0 || (lo..=hi).any(is_delete),
            "key {k}: absent, but versions {lo}..={hi} hold no delete"
        ),
    }
}

fn readers_see_only_real_values(dev: Box<dyn BlockDevice>, opts: &StoreOptions) -> Store {
    let store = Store::create(dev, opts).expect("create");
    let p = Published {
        started: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
        done: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
        stop: AtomicBool::new(false),
    };
    std::thread::scope(|s| {
        for r in 0..READERS {
            let (store, p) = (&store, &p);
            s.spawn(move || {
                let mut k = r;
                let mut rounds = 0u64;
                while !p.stop.load(Ordering::SeqCst) || rounds < 2 {
                    if p.stop.load(Ordering::SeqCst) {
                        rounds += 1;
                    }
                    // A snapshot answers the same before and after more writes and merges.
                    let snap = store.snapshot();
                    let first = store.get_at(&snap, &key(r)).expect("get_at");
                    for _ in 0..KEYS {
                        check_get(store, p, k);
                        k = (k + 7) % KEYS;
                    }
                    let again = store.get_at(&snap, &key(r)).expect("get_at");
                    assert_eq!(first, again, "key {r} through one snapshot");
                }
            });
        }
        for v in 1..=VERSIONS {
            for k in 0..KEYS {
                p.started[k].store(v, Ordering::SeqCst);
                if is_delete(v) {
                    store.delete(&key(k), false).expect("delete");
                } else {
                    store.put(&key(k), &value(k, v), false).expect("put");
                }
                p.done[k].store(v, Ordering::SeqCst);
            }
        }
        p.stop.store(true, Ordering::SeqCst);
    });
    for k in 0..KEYS {
        let got = store.get(&key(k)).expect("get");
        let want = (!is_delete(VERSIONS)).then(|| value(k, VERSIONS));
        assert_eq!(got, want, "key {k} after the writer finished");
    }
    let stats = store.stats();
    assert!(
        stats.flushes > 10 && stats.compactions > 2,
        "the worker flushed and merged while the readers read: {stats:?}"
    );
    store
}

fn busy_options() -> StoreOptions {
    StoreOptions {
        memtable_bytes: 16 << 10,
        l0_runs: 2,
        l1_runs: 2,
        // A small page cache, so the readers keep going to the device.
        memory_budget: 256 << 10,
        ..options()
    }
}

#[test]
fn readers_on_their_own_queues_see_only_real_values_while_the_worker_merges() {
    let store = readers_see_only_real_values(Box::new(ram_disk(64, 512)), &busy_options());
    let stats = store.stats();
    assert!(
        stats.reader_queues > 0,
        "the RAM disk has sibling queues, so readers had their own: {stats:?}"
    );
    store.close().expect("close");
}

/// A device with one queue: `new_queue` says `None`, as the fault device does.
struct OneQueue(Box<dyn BlockDevice>);

impl BlockDevice for OneQueue {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    fn describe(&self) -> String {
        format!("one-queue({})", self.0.describe())
    }
    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        self.0.submit(req)
    }
    fn ring_doorbell(&mut self) -> kura_engine::DeviceResult<()> {
        self.0.ring_doorbell()
    }
    fn poll(&mut self, out: &mut Vec<Completion>, min: usize) -> kura_engine::DeviceResult<usize> {
        self.0.poll(out, min)
    }
    fn in_flight(&self) -> usize {
        self.0.in_flight()
    }
    fn stats(&self, out: &mut Vec<DriveStats>) {
        self.0.stats(out)
    }
}

#[test]
fn readers_sharing_the_one_queue_see_only_real_values_while_the_worker_merges() {
    let dev = OneQueue(Box::new(ram_disk(64, 512)));
    let store = readers_see_only_real_values(Box::new(dev), &busy_options());
    assert_eq!(store.stats().reader_queues, 0);
    store.close().expect("close");
}

#[test]
fn a_reader_queue_is_reused_not_opened_per_get() {
    let store = Store::create(Box::new(ram_disk(64, 512)), &busy_options()).expect("create");
    for k in 0..KEYS {
        store.put(&key(k), &value(k, 1), false).expect("put");
    }
    store.compact().expect("compact");
    for _ in 0..20 {
        for k in 0..KEYS {
            assert_eq!(store.get(&key(k)).expect("get"), Some(value(k, 1)));
        }
    }
    // One thread read (and the worker, which may have read a new run at the same time): it
    // needed one queue, and kept using it.
    let queues = store.stats().reader_queues;
    assert!((1..=2).contains(&queues), "{:?}", store.stats());
    store.close().expect("close");
}
