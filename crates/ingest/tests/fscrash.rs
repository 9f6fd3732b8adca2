//! Crash harness for the AccelFS target (`--dev SPEC /path`, docs §10): batches of records
//! are stored through [`FsStore::store_batch`] — the code the server's device thread runs for
//! this target — on a `fault` device that records every write and flush. The recorded stream
//! is then cut at many points (unflushed blocks each kept or lost, so writes tear and reorder)
//! and each image is reopened as after a reboot: it must mount and recover, hold every record
//! acknowledged before the cut, whole, show no record that is partial or foreign, and be
//! fsck-clean after the open's cleanup.

use kura_accelfs::testing::{formatted_storage, fsck_problems, recording_device, reopen};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::fault::materialize;
use kura_engine::IoBuf;
use kura_ingest::fstarget::{FsRecord, FsStore};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

/// `bytes` in 1 MiB buffers, as the server's readers fill them.
fn chunks(bytes: &[u8]) -> Vec<IoBuf> {
    bytes
        .chunks(1 << 20)
        .map(|c| {
            let mut b = IoBuf::heap(c.len(), 4096);
            b.copy_from_slice(c);
            b
        })
        .collect()
}

/// Records for [`FsStore::store_batch`] stored as sent (no stage, no label): `bufs[i]` holds
/// `sent[i]`, whose seq is `first_seq + i`.
fn plain_records<'a>(
    bufs: &'a [Vec<IoBuf>],
    sent: &[Vec<u8>],
    first_seq: u64,
) -> Vec<FsRecord<'a>> {
    bufs.iter()
        .zip(sent)
        .enumerate()
        .map(|(i, (c, b))| FsRecord {
            chunks: c,
            stored_len: b.len() as u64,
            orig_len: b.len() as u64,
            crc: kura_engine::crc32c::crc32c(b),
            stage: 0,
            label: 255,
            seq: first_seq + i as u64,
        })
        .collect()
}

#[test]
fn a_crash_anywhere_in_an_accelfs_target_keeps_every_acknowledged_record_whole() {
    let storage = formatted_storage(48 << 20);
    let base = storage.lock().expect("storage").clone();
    let (dev, control) = recording_device(&storage);
    let mut store = FsStore::open(Box::new(dev), "/ingest").expect("open");
    // Records sent (seq → bytes) and, per batch, the trace length when it was acknowledged.
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let mut acked: Vec<(usize, Vec<u64>)> = Vec::new();
    let mut rng = SmallRng::seed_from_u64(2026);
    for _batch in 0..8 {
        let n = rng.gen_range(1..=3);
        let first = sent.len() as u64;
        for i in 0..n {
            let len = rng.gen_range(1..1_500_000usize);
            sent.push(data(first + i, len));
        }
        let bufs: Vec<Vec<IoBuf>> = sent[first as usize..].iter().map(|b| chunks(b)).collect();
        let records = plain_records(&bufs, &sent[first as usize..], first);
        let entries = store.store_batch(&records).expect("store");
        acked.push((
            control.trace().len(),
            entries.iter().map(|e| e.seq).collect(),
        ));
    }
    store.close().expect("close");
    let trace = control.trace();
    assert!(trace.len() > 40, "{} events recorded", trace.len());
    let mut cuts: Vec<usize> = (0..=trace.len()).step_by(trace.len() / 30).collect();
    // Right at each acknowledgement and one event before it.
    for (at, _) in &acked {
        cuts.extend([*at, at.saturating_sub(1)]);
    }
    cuts.push(trace.len());
    let (mut checked, mut some_but_not_all) = (0, false);
    for (k, &cut) in cuts.iter().enumerate() {
        let image = materialize(&base, &trace, cut, 4096, 0.5, k as u64);
        let image = Arc::new(Mutex::new(image));
        let dev = MemDevice::with_storage(Arc::clone(&image), QueueOptions::default());
        let store = FsStore::open(Box::new(dev), "/ingest")
            .unwrap_or_else(|e| panic!("cut {cut}: the target does not open: {e}"));
        let entries = store
            .entries()
            .unwrap_or_else(|e| panic!("cut {cut}: index: {e}"));
        for e in &entries {
            let got = store
                .read_original(e.id)
                .unwrap_or_else(|err| panic!("cut {cut}: record {} is not whole: {err}", e.id));
            assert!(
                sent.get(e.seq as usize) == Some(&got),
                "cut {cut}: record {} is not the record sent as {}",
                e.id,
                e.seq
            );
        }
        let visible: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        for (at, seqs) in &acked {
            let all = seqs.iter().all(|s| visible.contains(s));
            let none = seqs.iter().all(|s| !visible.contains(s));
            assert!(all || none, "cut {cut}: batch {seqs:?} is half visible");
            if *at <= cut {
                assert!(all, "cut {cut}: acknowledged batch {seqs:?} is missing");
            }
        }
        some_but_not_all |= !visible.is_empty() && visible.len() < sent.len();
        store.close().expect("close");
        let problems = fsck_problems(&image);
        assert!(problems.is_empty(), "cut {cut}: fsck: {problems:?}");
        checked += 1;
    }
    assert!(checked >= 30, "{checked} cuts checked");
    assert!(
        some_but_not_all,
        "no cut showed a state between the first and the last batch"
    );
}

#[test]
fn without_leveldb_an_accelfs_target_says_so_and_writes_nothing() {
    // Built normally the target opens; built with KURA_NO_LEVELDB=1 the open fails with a
    // message that names the cause and the fix, before anything on the device changes.
    let storage = formatted_storage(16 << 20);
    let before = storage.lock().expect("storage").clone();
    let opened = FsStore::open(reopen(&storage), "/ingest");
    if kura_kv::leveldb_available() {
        opened.expect("open").close().expect("close");
        assert!(fsck_problems(&storage).is_empty());
    } else {
        let err = opened.expect_err("no LevelDB, no index").to_string();
        assert!(
            err.contains("LevelDB") && err.contains("libleveldb-dev"),
            "{err}"
        );
        assert!(
            *storage.lock().expect("storage") == before,
            "the failed open wrote to the device"
        );
    }
}

#[test]
fn a_read_only_open_reads_every_record_and_never_writes_the_device() {
    let storage = formatted_storage(32 << 20);
    let dev = || reopen(&storage);
    let mut store = FsStore::open(dev(), "/ingest").expect("open");
    let sent: Vec<Vec<u8>> = (0..5)
        .map(|i| data(70 + i, 200_000 * i as usize + 1))
        .collect();
    let bufs: Vec<Vec<IoBuf>> = sent.iter().map(|b| chunks(b)).collect();
    let records = plain_records(&bufs, &sent, 0);
    store.store_batch(&records).expect("store");
    store.close().expect("close");
    // A record file a crash left behind: a writable open would remove it.
    let fs = kura_accelfs::testing::mount_storage(&storage);
    fs.write("/ingest/records/00000000000000ff", b"orphan")
        .expect("write");
    fs.unmount().expect("unmount");
    let before = storage.lock().expect("storage").clone();
    let mut ro = FsStore::open_read_only(dev(), "/ingest").expect("read-only open");
    let entries = ro.entries().expect("entries");
    assert_eq!(entries.len(), 5);
    for e in &entries {
        assert!(ro.read_original(e.id).expect("read") == sent[e.seq as usize]);
    }
    assert!(
        ro.store_batch(&records[..1]).is_err(),
        "a read-only target refuses to store"
    );
    ro.close().expect("close");
    assert!(
        *storage.lock().expect("storage") == before,
        "the read-only open changed the device"
    );
    assert!(
        kura_accelfs::testing::mount_storage(&storage).exists("/ingest/records/00000000000000ff")
    );
}
