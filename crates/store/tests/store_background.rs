//! Background work does not stall writers: with the store's worker held inside a merge (its
//! device writes parked by a gate), writes and reads go on and complete; the merge finishes
//! once the gate opens, and everything written is there after reopen.
//!
//! The gate parks only writes issued by the worker thread (`kura-store-bg`), so the test
//! depends on no timing: it waits for the worker to be parked, then counts what completes.

mod common;

use common::{options, ram_disk};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::{BlockDevice, Completion, DriveStats, Geometry, Opcode, Rejected, Request};
use kura_store::{Store, StoreOptions};
use std::sync::{Arc, Condvar, Mutex};

#[derive(Default)]
struct GateState {
    hold: bool,
    parked: usize,
    /// The worker's writes panic instead (a bug in a flush or merge, simulated).
    panic: bool,
    /// Reads are parked too (on the readers' sibling queues, which hold no store lock).
    reads: bool,
}

#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    fn set_hold(&self, hold: bool) {
        self.state.lock().expect("gate").hold = hold;
        self.changed.notify_all();
    }

    /// Waits until the worker is parked at a write.
    fn wait_parked(&self) {
        let mut s = self.state.lock().expect("gate");
        while s.parked == 0 {
            s = self.changed.wait(s).expect("gate");
        }
    }

    fn parked(&self) -> usize {
        self.state.lock().expect("gate").parked
    }
}

/// Parks the store worker's writes while the gate holds.
struct Gated<D> {
    dev: D,
    gate: Arc<Gate>,
}

impl<D: BlockDevice> BlockDevice for Gated<D> {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn describe(&self) -> String {
        format!("gated({})", self.dev.describe())
    }
    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        if std::thread::current().name() == Some("kura-store-bg") {
            let mut s = self.gate.state.lock().expect("gate");
            if req.op != Opcode::Write && !(s.reads && req.op == Opcode::Read) {
                drop(s);
                return self.dev.submit(req);
            }
            if s.panic {
                drop(s);
                panic!("simulated bug in the store's background write");
            }
            if s.hold {
                s.parked += 1;
                self.gate.changed.notify_all();
                while s.hold {
                    s = self.gate.changed.wait(s).expect("gate");
                }
                s.parked -= 1;
            }
        }
        self.dev.submit(req)
    }
    fn ring_doorbell(&mut self) -> kura_engine::DeviceResult<()> {
        self.dev.ring_doorbell()
    }
    fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
    ) -> kura_engine::DeviceResult<usize> {
        self.dev.poll(out, min_complete)
    }
    fn in_flight(&self) -> usize {
        self.dev.in_flight()
    }
    fn stats(&self, out: &mut Vec<DriveStats>) {
        self.dev.stats(out)
    }
    fn new_queue(&self) -> Option<Result<Box<dyn BlockDevice>, kura_engine::OpenError>> {
        let sibling = match self.dev.new_queue()? {
            Ok(dev) => dev,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok(Box::new(Gated {
            dev: sibling,
            gate: Arc::clone(&self.gate),
        })))
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

fn value(i: u32, round: u32) -> Vec<u8> {
    format!("value {i} round {round}").repeat(3).into_bytes()
}

/// A `disk_mib` RAM disk holding a store of `keys` keys (round 0) written through a 16 KiB
/// memtable with level 0 allowed 100 runs, so the flushes leave many runs there; and how many.
fn level_zero_store(disk_mib: u64, keys: u32) -> (MemStorage, u32) {
    let dev = ram_disk(disk_mib, 4096);
    let storage = dev.storage();
    let first = StoreOptions {
        memtable_bytes: 16 << 10,
        l0_runs: 100,
        ..options()
    };
    let store = Store::create(Box::new(dev), &first).expect("create");
    for i in 0..keys {
        store.put(&key(i), &value(i, 0), false).expect("put");
    }
    let runs = store.stats().runs_per_level[0];
    store.close().expect("close");
    (storage, runs)
}

/// Reopens `storage` with `opts` and checks every one of `keys` keys: round 1 below
/// `rewritten`, round 0 above.
fn check_after_reopen(storage: MemStorage, opts: &StoreOptions, keys: u32, rewritten: u32) {
    let store = Store::open_with(
        Box::new(MemDevice::with_storage(storage, QueueOptions::default())),
        opts,
    )
    .expect("reopen");
    for i in 0..keys {
        let round = if i < rewritten { 1 } else { 0 };
        assert_eq!(
            store.get(&key(i)).expect("get"),
            Some(value(i, round)),
            "{i}"
        );
    }
}

#[test]
fn writes_complete_while_a_merge_is_in_progress() {
    // Session 1: level 0 may hold many runs, so several flushes leave runs there.
    let (storage, _) = level_zero_store(48, 2000);

    // Session 2: level 0 over its new limit, so the worker starts by merging it; the gate
    // parks the merge at its first write.
    let gate = Arc::new(Gate::default());
    gate.set_hold(true);
    let dev = Gated {
        dev: MemDevice::with_storage(storage.clone(), QueueOptions::default()),
        gate: Arc::clone(&gate),
    };
    let second = StoreOptions {
        memtable_bytes: 1 << 20,
        l0_runs: 1,
        ..options()
    };
    let store = Store::open_with(Box::new(dev), &second).expect("reopen");
    gate.wait_parked();
    // Unsynced writes under the log buffer reach no device page: they and the reads of them
    // complete while the worker sits inside the merge, which holds the device for its write.
    let mut completed = 0;
    for i in 0..200 {
        store.put(&key(i), &value(i, 1), false).expect("put");
        assert_eq!(store.get(&key(i)).expect("get"), Some(value(i, 1)));
        completed += 1;
    }
    assert_eq!(completed, 200);
    assert_eq!(gate.parked(), 1, "the merge is still in progress");
    gate.set_hold(false);
    let stats = store.stats();
    store.close().expect("close");

    let store = Store::open_with(
        Box::new(MemDevice::with_storage(
            storage.clone(),
            QueueOptions::default(),
        )),
        &second,
    )
    .expect("reopen");
    let after = store.stats();
    assert_eq!(after.runs_per_level[0], 0, "{stats:?} {after:?}");
    assert!(after.runs_per_level[1] > 0, "{after:?}");
    drop(store);
    check_after_reopen(storage, &second, 2000, 200);
}

#[test]
fn a_full_memtable_is_flushed_in_the_middle_of_a_merge() {
    // Session 1: about 20 level-0 runs (level 0 may hold 100).
    let (storage, runs) = level_zero_store(96, 3000);
    assert!((9..40).contains(&runs), "{runs} level-0 runs");

    // Session 2: level 0 is over its limit (8) but below the stop (5 x 8), so the worker
    // merges it, and the gate parks the merge at its first read of an input run, before it
    // has merged a key. Meanwhile the memtable fills and becomes the immutable one.
    let gate = Arc::new(Gate::default());
    {
        let mut s = gate.state.lock().expect("gate");
        s.hold = true;
        s.reads = true;
    }
    let dev = Gated {
        dev: MemDevice::with_storage(storage.clone(), QueueOptions::default()),
        gate: Arc::clone(&gate),
    };
    let second = StoreOptions {
        memtable_bytes: 16 << 10,
        l0_runs: 8,
        ..options()
    };
    let store = Store::open_with(Box::new(dev), &second).expect("reopen");
    gate.wait_parked();
    let mut written = 0;
    while store.stats().immutable_bytes == 0 {
        store
            .put(&key(written), &value(written, 1), false)
            .expect("put");
        written += 1;
        assert!(written < 3000, "the memtable never filled");
    }
    gate.set_hold(false);
    // Waits for the merge under way, then does whatever else is due.
    store.settle().expect("settle");
    let stats = store.stats();
    // The merge had 3000 keys to go when the memtable filled: it flushed it on the way
    // instead of leaving it (and the writers) waiting until its end.
    assert!(stats.flushes_in_merges >= 1, "{stats:?}");
    assert_eq!(stats.runs_per_level[0], 1, "{stats:?}");
    store.close().expect("close");
    check_after_reopen(storage, &second, 3000, written);
}

#[test]
fn a_panic_in_the_worker_stops_writes_with_an_error_instead_of_stalling_them() {
    let gate = Arc::new(Gate::default());
    gate.state.lock().expect("gate").panic = true;
    let dev = Gated {
        dev: ram_disk(48, 4096),
        gate: Arc::clone(&gate),
    };
    let opts = StoreOptions {
        memtable_bytes: 16 << 10,
        ..options()
    };
    let store = Store::create(Box::new(dev), &opts).expect("create");
    // The first full memtable waits for a flush that panics; the next full one stalls its
    // writer, which must be told rather than wait for ever.
    let mut refused = None;
    for i in 0..20_000 {
        if let Err(e) = store.put(&key(i), &value(i, 0), false) {
            refused = Some((i, e));
            break;
        }
    }
    let (at, error) = refused.expect("writes go on failing silently or stall");
    assert!(
        error.to_string().contains("background worker panicked"),
        "{error}"
    );
    // Reads go on: what was written before the failure is still there.
    assert_eq!(store.get(&key(0)).expect("get"), Some(value(0, 0)));
    assert!(at > 0);
    // Later writes are refused too, and closing does not hang.
    assert!(store.put(&key(0), b"again", false).is_err());
    assert!(
        store.close().is_err(),
        "the unflushed memtable cannot be flushed"
    );
}
