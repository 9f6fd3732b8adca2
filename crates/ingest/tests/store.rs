//! The raw-device target (`docs/ingest-protocol.md` §5–§8) on RAM disks behind the engine's
//! `fault` wrapper: records read back after reopening, limits give typed errors, and the crash
//! harness cuts the recorded write stream at every point and checks the durability rules: every
//! committed record survives, nothing partial is ever visible, and entries a crash left beyond
//! the recovered prefix never come back after the next open writes over their slots.

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{materialize, FaultDevice, FaultPlan, TraceEvent};
use kura_engine::BlockDevice;
use kura_ingest::layout::{Superblock, UNIT};
use kura_ingest::store::{FormatOptions, NewRecord, Store, StoreError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};

fn mem(bytes: u64, block_size: u32) -> (Box<dyn BlockDevice>, MemStorage) {
    let dev = MemDevice::new(
        bytes,
        QueueOptions {
            block_size,
            ..QueueOptions::default()
        },
    );
    let storage = dev.storage();
    (Box::new(dev), storage)
}

/// The block size of every RAM disk here: smaller than the unit, so a power cut can tear a
/// superblock or an index unit.
const BS: u32 = 512;

fn reopen(storage: &MemStorage) -> Box<dyn BlockDevice> {
    Box::new(MemDevice::with_storage(
        storage.clone(),
        QueueOptions {
            block_size: BS,
            ..QueueOptions::default()
        },
    ))
}

fn record(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn format(storage_bytes: u64, slots: Option<u64>) -> (Store, MemStorage) {
    let (dev, storage) = mem(storage_bytes, BS);
    let store = Store::format(
        dev,
        FormatOptions {
            index_slots: slots,
            format_id: Some(42),
        },
    )
    .expect("format");
    (store, storage)
}

#[test]
fn records_read_back_after_reopening_with_their_fields() {
    let (mut store, storage) = format(8 << 20, Some(200));
    // Sizes around unit and chunk boundaries, several batches, chunks of 64 KiB.
    let sizes = [1usize, 4095, 4096, 4097, 65536, 65537, 300_000, 7];
    let mut ids = Vec::new();
    for (batch, pair) in sizes.chunks(3).enumerate() {
        let recs = pair
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                NewRecord::copied(&record(len as u64, len), 64 << 10, (batch * 10 + i) as u64)
            })
            .collect();
        ids.extend(store.commit(recs).expect("commit").iter().map(|e| e.id));
    }
    assert_eq!(ids, (0..sizes.len() as u64).collect::<Vec<_>>());
    drop(store);
    let mut ro = Store::open_read_only(reopen(&storage)).expect("open");
    assert_eq!(ro.entries().len(), sizes.len());
    for (id, &len) in sizes.iter().enumerate() {
        assert_eq!(ro.read(id as u64).expect("read"), record(len as u64, len));
    }
    let seqs: Vec<u64> = ro.entries().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![0, 1, 2, 10, 11, 12, 20, 21]);
    // A read-only open writes nothing; a writable one bumps the generation in the other copy.
    let before = storage.lock().expect("storage").clone();
    drop(ro);
    let _ = Store::open_read_only(reopen(&storage)).expect("open");
    assert!(*storage.lock().expect("storage") == before);
    let gen = Store::open(reopen(&storage))
        .expect("open")
        .superblock()
        .generation;
    let img = storage.lock().expect("storage").clone();
    let a = Superblock::decode(&img[..4096]).expect("A");
    let b = Superblock::decode(&img[4096..8192]).expect("B");
    assert_eq!(a.generation.max(b.generation), gen);
    assert_eq!(a.generation.abs_diff(b.generation), 1);
}

#[test]
fn limits_give_typed_errors_and_keep_what_was_stored() {
    let (mut store, storage) = format(1 << 20, Some(3));
    let one = |seq| NewRecord::copied(&record(seq, 5000), 1 << 20, seq);
    store.commit(vec![one(1), one(2)]).expect("commit");
    assert!(matches!(
        store.commit(vec![one(3), one(4)]),
        Err(StoreError::Full(_))
    ));
    store.commit(vec![one(3)]).expect("last slot");
    assert!(matches!(
        store.commit(vec![one(5)]),
        Err(StoreError::Full(_))
    ));
    // Data full: a record larger than the free space.
    let (mut small, _) = format(256 << 10, None);
    let free = small.free_bytes() as usize;
    assert!(matches!(
        small.commit(vec![NewRecord::copied(&record(9, free + 1), 1 << 20, 9)]),
        Err(StoreError::Full(_))
    ));
    small
        .commit(vec![NewRecord::copied(&record(9, free), 1 << 20, 9)])
        .expect("exactly the free space");
    drop(store);
    let mut ro = Store::open_read_only(reopen(&storage)).expect("open");
    assert_eq!(ro.entries().len(), 3);
    assert!(matches!(ro.read(3), Err(StoreError::NoSuchRecord(3))));
    assert!(matches!(ro.commit(vec![one(6)]), Err(StoreError::ReadOnly)));
}

#[test]
fn a_failed_write_stores_nothing_of_its_batch_and_loses_nothing_before_it() {
    let (mut store, storage) = format(4 << 20, Some(64));
    store
        .commit(vec![NewRecord::copied(&record(1, 10_000), 4096, 1)])
        .expect("first");
    drop(store);
    let plan = FaultPlan {
        write_eio: Some(4),
        ..FaultPlan::default()
    };
    // The open's superblock write is write 1; the batch's third chunk is write 4.
    let dev = FaultDevice::new(reopen(&storage), plan);
    let mut store = Store::open(Box::new(dev)).expect("open");
    let err = store
        .commit(vec![NewRecord::copied(&record(2, 5 * 4096), 4096, 2)])
        .expect_err("EIO");
    assert!(matches!(err, StoreError::Device(_)), "{err}");
    assert_eq!(store.entries().len(), 1);
    drop(store);
    let mut ro = Store::open_read_only(reopen(&storage)).expect("open");
    assert_eq!(ro.entries().len(), 1);
    assert_eq!(ro.read(0).expect("read"), record(1, 10_000));
}

#[test]
fn overlapping_extents_and_bad_superblocks_are_refused() {
    let (mut store, storage) = format(2 << 20, Some(64));
    store
        .commit(vec![
            NewRecord::copied(&record(1, 8192), 4096, 1),
            NewRecord::copied(&record(2, 8192), 4096, 2),
        ])
        .expect("commit");
    drop(store);
    // Forge entry 1 to start inside entry 0's extent, with a valid CRC and generation.
    let entry1 = {
        let mut ro = Store::open_read_only(reopen(&storage)).expect("open");
        let _ = ro.read(1).expect("read");
        ro.entries()[1]
    };
    let forged = kura_ingest::Entry {
        offset: entry1.offset - UNIT,
        ..entry1
    };
    storage.lock().expect("storage")[8192 + 64..8192 + 128].copy_from_slice(&forged.encode());
    assert!(matches!(
        Store::open_read_only(reopen(&storage)),
        Err(StoreError::Damaged(_))
    ));
    // Both superblocks gone: a typed layout error, not a guess.
    storage.lock().expect("storage")[..8192].fill(0xAB);
    assert!(matches!(
        Store::open_read_only(reopen(&storage)),
        Err(StoreError::Layout(_))
    ));
    // A device whose block size does not divide the unit.
    let (odd, _) = mem(1 << 20, 8192);
    assert!(matches!(
        Store::format(odd, FormatOptions::default()),
        Err(StoreError::BlockSize(8192))
    ));
}

/// What a writer promised: records committed (durable) at each trace position.
struct Run {
    base: Vec<u8>,
    trace: Vec<TraceEvent>,
    /// (trace length when `commit` returned, records then committed in total)
    promised: Vec<(usize, usize)>,
    records: Vec<Vec<u8>>,
}

/// Formats a disk, then records a writable open and `batches` commits of random sizes.
fn recorded_run(seed: u64, batches: usize, base: Option<Vec<u8>>) -> Run {
    let image = base.unwrap_or_else(|| {
        let (store, storage) = format(8 << 20, Some(300));
        drop(store);
        let img = storage.lock().expect("storage").clone();
        img
    });
    let storage: MemStorage = Arc::new(Mutex::new(image.clone()));
    let dev = FaultDevice::new(
        reopen(&storage),
        FaultPlan {
            record: true,
            ..FaultPlan::default()
        },
    );
    let control = dev.control();
    let mut store = Store::open(Box::new(dev)).expect("open");
    store.set_queue_depth(4);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut promised = vec![(control.trace().len(), store.entries().len())];
    let mut records: Vec<Vec<u8>> = (0..store.entries().len() as u64)
        .map(|id| store.read(id).expect("existing record"))
        .collect();
    for _ in 0..batches {
        let n = rng.gen_range(1..4);
        let batch: Vec<Vec<u8>> = (0..n)
            .map(|_| record(rng.gen(), rng.gen_range(1..20_000)))
            .collect();
        let recs = batch
            .iter()
            .map(|r| NewRecord::copied(r, 8192, records.len() as u64))
            .collect();
        store.commit(recs).expect("commit");
        records.extend(batch);
        promised.push((control.trace().len(), records.len()));
    }
    Run {
        base: image,
        trace: control.trace(),
        promised,
        records,
    }
}

/// Opens the image a crash at `cut` leaves and checks it against the run: at least every
/// record promised by then, at most the ones written, each one whole. Returns the image.
fn check_crash(run: &Run, cut: usize, keep: f64, seed: u64) -> Vec<u8> {
    let image = materialize(&run.base, &run.trace, cut, BS as usize, keep, seed);
    let storage: MemStorage = Arc::new(Mutex::new(image));
    let mut store = Store::open_read_only(reopen(&storage))
        .unwrap_or_else(|e| panic!("cut {cut} keep {keep} seed {seed}: open failed: {e}"));
    let promised = run
        .promised
        .iter()
        .rev()
        .find(|(at, _)| *at <= cut)
        .map_or(0, |p| p.1);
    let visible = store.entries().len();
    assert!(
        visible >= promised && visible <= run.records.len(),
        "cut {cut} keep {keep} seed {seed}: {visible} records visible, {promised} promised, {} written",
        run.records.len()
    );
    for id in 0..visible {
        let got = store
            .read(id as u64)
            .unwrap_or_else(|e| panic!("cut {cut} seed {seed}: record {id}: {e}"));
        assert!(
            got == run.records[id],
            "cut {cut} seed {seed}: record {id} differs"
        );
    }
    let img = storage.lock().expect("storage").clone();
    img
}

#[test]
fn a_crash_at_any_point_keeps_every_committed_record_and_shows_nothing_partial() {
    let run = recorded_run(1, 8, None);
    let mut checked = 0;
    for cut in 0..=run.trace.len() {
        for (seed, keep) in (0..6u64).flat_map(|s| [(s, 0.5), (s, 0.9)]) {
            check_crash(&run, cut, keep, seed + cut as u64 * 100);
            checked += 1;
        }
    }
    assert!(run.trace.len() > 30, "trace of {} events", run.trace.len());
    assert!(checked > 300);
}

#[test]
fn entries_left_beyond_a_crash_never_come_back_after_the_next_run() {
    // Crash in the middle of a run, recover, run again on the crashed image, crash again at
    // every point: the second run's view must never include the first run's stray entries
    // (their generation is older), whatever survived of either.
    let mut rng = SmallRng::seed_from_u64(9);
    let first = recorded_run(2, 6, None);
    let mut rounds = 0;
    for _ in 0..6 {
        let cut = rng.gen_range(first.trace.len() / 2..first.trace.len());
        let crashed = check_crash(&first, cut, 0.7, rng.gen());
        let second = recorded_run(rng.gen(), 4, Some(crashed));
        for cut in (0..=second.trace.len()).step_by(2) {
            check_crash(&second, cut, 0.6, rng.gen());
            rounds += 1;
        }
    }
    assert!(rounds > 50);
}

#[test]
fn a_stale_entry_after_a_lost_one_stays_invisible_once_its_slot_is_reused() {
    // Run 1 stores 70 records; then the entry of record 63 (the last of index unit 0) is lost
    // as a torn sector would lose it, leaving entries 64.. (unit 1) valid on the device.
    // Recovery stops at 63; the next open writes a new record 63 (rewriting unit 0 only), and
    // entry 64, of an older generation, must not join the index.
    let (mut store, storage) = format(4 << 20, Some(200));
    for seq in 0..70 {
        store
            .commit(vec![NewRecord::copied(&record(seq, 3000), 4096, seq)])
            .expect("commit");
    }
    drop(store);
    let entry = |slot: usize| 8192 + 64 * slot;
    storage.lock().expect("storage")[entry(63)..entry(64)].fill(0);
    let mut store = Store::open(reopen(&storage)).expect("open");
    assert_eq!(store.entries().len(), 63);
    store
        .commit(vec![NewRecord::copied(&record(99, 100), 4096, 99)])
        .expect("commit");
    drop(store);
    let mut ro = Store::open_read_only(reopen(&storage)).expect("open");
    assert_eq!(ro.entries().len(), 64, "stale entries joined the index");
    assert_eq!(ro.read(63).expect("read"), record(99, 100));
}
