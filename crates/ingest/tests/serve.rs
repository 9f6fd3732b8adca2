//! The server end to end over real sockets (TCP on 127.0.0.1 and a Unix socket) into RAM
//! disks: several senders at once in both retirement orders, authentication, error frames for
//! bad records, device errors and a full device, a sender that vanishes mid-record, and
//! back-pressure against a device that completes nothing until the test lets it.

use kura_accelfs::testing::reopen;
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{FaultDevice, FaultPlan};
use kura_engine::{BlockDevice, BufferPool, Completion, DeviceResult, Geometry, Rejected, Request};
use kura_ingest::client::{Client, ClientError, ClientOptions};
use kura_ingest::frame::{self, ErrorCode, Frame, FrameType, Limits};
use kura_ingest::net::{Addr, Listener};
use kura_ingest::server::{Handle, Order, Server, ServerConfig, ServerError};
use kura_ingest::session::Stage;
use kura_ingest::store::{FormatOptions, Store};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

const KEY: &[u8] = b"a shared key of some length";

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn formatted(bytes: u64) -> (Box<dyn BlockDevice>, MemStorage) {
    let dev = MemDevice::new(bytes, QueueOptions::default());
    let storage = dev.storage();
    let store = Store::format(Box::new(dev), FormatOptions::default()).expect("format");
    drop(store);
    (reopen(&storage), storage)
}

fn config(order: Order) -> ServerConfig {
    ServerConfig {
        limits: Limits {
            max_frame: frame::DEFAULT_MAX_FRAME,
            max_record: 4 << 20,
        },
        qd: 8,
        order,
        buffers: 16,
        per_stream: 4,
        key: Some(KEY.to_vec()),
    }
}

struct Running {
    addr: Addr,
    handle: Handle,
    thread: JoinHandle<Result<Store, ServerError>>,
}

impl Running {
    fn stop(self) -> Store {
        self.handle.stop();
        self.thread.join().expect("server thread").expect("server")
    }
}

fn start(dev: Box<dyn BlockDevice>, cfg: ServerConfig, addr: &Addr) -> Running {
    let pool = BufferPool::new(cfg.buffers << 20).expect("pool");
    let store = Store::open(dev).expect("open");
    let listener = Listener::bind(addr).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = Server::new(cfg, pool).expect("server");
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run(store, listener));
    Running {
        addr,
        handle,
        thread,
    }
}

fn tcp() -> Addr {
    Addr::Tcp("127.0.0.1:0".into())
}

fn opts() -> ClientOptions {
    ClientOptions {
        key: Some(KEY.to_vec()),
        ..ClientOptions::default()
    }
}

/// Records sent: `(seq, bytes)`.
type Sent = Vec<(u64, Vec<u8>)>;

/// Sends records of `sizes` on one connection with per-record acks; returns what was sent and
/// the acknowledgements `(seq, id)`.
fn send_all(addr: &Addr, seed: u64, sizes: &[usize]) -> (Sent, Vec<(u64, u64)>) {
    let mut c = Client::connect(addr, &opts()).expect("connect");
    let mut sent = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let bytes = data(seed * 1000 + i as u64, len);
        let seq = c.send(&bytes, true).expect("send");
        sent.push((seq, bytes));
    }
    let answers = c.finish().expect("finish");
    assert!(answers.errors.is_empty(), "{:?}", answers.errors);
    (sent, answers.acks)
}

fn check_stored(store: &mut Store, sent: &[(u64, Vec<u8>)], acks: &[(u64, u64)]) {
    assert_eq!(acks.len(), sent.len(), "every record acknowledged");
    for (seq, id) in acks {
        let (_, bytes) = sent
            .iter()
            .find(|(s, _)| s == seq)
            .expect("acked seq was sent");
        assert_eq!(store.entry(*id).expect("entry").seq, *seq);
        assert!(
            store.read(*id).expect("read") == *bytes,
            "record {id} differs"
        );
    }
}

fn several_senders(order: Order, addr: Addr) {
    let (dev, storage) = formatted(96 << 20);
    let running = start(dev, config(order), &addr);
    let senders: Vec<_> = (0..3u64)
        .map(|s| {
            let addr = running.addr.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(s);
                let sizes: Vec<usize> = (0..8).map(|_| rng.gen_range(1..(3 << 20))).collect();
                send_all(&addr, s, &sizes)
            })
        })
        .collect();
    let results: Vec<_> = senders
        .into_iter()
        .map(|t| t.join().expect("sender"))
        .collect();
    let stats = running.handle.stats.clone();
    drop(running.stop());
    let mut store = Store::open_read_only(reopen(&storage)).expect("reopen");
    assert_eq!(store.entries().len(), 24);
    assert_eq!(stats.records.load(std::sync::atomic::Ordering::Relaxed), 24);
    for (sent, acks) in &results {
        check_stored(&mut store, sent, acks);
    }
}

#[test]
fn several_senders_in_order_over_tcp() {
    several_senders(Order::In, tcp());
}

#[test]
fn several_senders_out_of_order_over_tcp() {
    several_senders(Order::Out, tcp());
}

#[test]
fn several_senders_over_a_unix_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    several_senders(Order::Out, Addr::Unix(dir.path().join("ingest.sock")));
}

#[test]
fn tcp_needs_a_key_and_a_wrong_key_is_refused() {
    let (dev, _) = formatted(16 << 20);
    let store = Store::open(dev).expect("open");
    let listener = Listener::bind(&tcp()).expect("bind");
    let cfg = ServerConfig {
        key: None,
        ..config(Order::In)
    };
    let server = Server::new(cfg, BufferPool::new(16 << 20).expect("pool")).expect("server");
    assert!(matches!(
        server.run(store, listener),
        Err(ServerError::Config(_))
    ));

    let (dev, _) = formatted(16 << 20);
    let running = start(dev, config(Order::In), &tcp());
    let wrong = ClientOptions {
        key: Some(b"not the key at all, no".to_vec()),
        ..ClientOptions::default()
    };
    match Client::connect(&running.addr, &wrong) {
        Err(ClientError::Server { code, .. }) => assert_eq!(code, ErrorCode::AuthFailed as u16),
        other => panic!("wrong key: {:?}", other.map(|_| ())),
    }
    assert!(matches!(
        Client::connect(&running.addr, &ClientOptions::default()),
        Err(ClientError::NeedKey)
    ));
    drop(running.stop());
}

#[test]
fn bad_records_and_vanishing_senders_leave_nothing_visible() {
    let (dev, storage) = formatted(32 << 20);
    let running = start(dev, config(Order::In), &tcp());
    // A record whose END carries the wrong CRC: ERROR 4, the connection goes on.
    let mut c = Client::connect(&running.addr, &opts()).expect("connect");
    let good = data(1, 100_000);
    c.send_raw(&Frame::Begin { seq: 0, size: 5 }.encode())
        .expect("begin");
    c.send_raw(&Frame::Data(b"hello".to_vec()).encode())
        .expect("data");
    c.send_raw(
        &Frame::End {
            record_crc: 1,
            ack: true,
        }
        .encode(),
    )
    .expect("end");
    let answers = c.finish().expect("finish");
    assert!(
        answers
            .errors
            .iter()
            .any(|(code, seq, _)| *code == ErrorCode::RecordCrc as u16 && *seq == 0),
        "{answers:?}"
    );

    // A sender that disconnects in the middle of a record.
    let c = Client::connect(&running.addr, &opts()).expect("connect");
    let mut partial = Frame::Begin {
        seq: 0,
        size: 3 << 20,
    }
    .encode();
    partial.extend(frame::header(FrameType::Data, 0, &good));
    partial.extend(&good);
    c.abort(&partial).expect("abort");

    // A frame with a bad CRC: ERROR 1 and the connection closes.
    let mut c = Client::connect(&running.addr, &opts()).expect("connect");
    let mut bad = Frame::Begin { seq: 0, size: 10 }.encode();
    bad[13] ^= 1;
    c.send_raw(&bad).expect("raw");
    let answers = c.finish().expect("finish");
    assert_eq!(
        answers.errors[0].0,
        ErrorCode::BadFrame as u16,
        "{answers:?}"
    );

    // One good record afterwards is the only thing stored.
    let (sent, acks) = send_all(&running.addr, 7, &[good.len()]);
    let mut store = running.stop();
    assert_eq!(store.entries().len(), 1);
    check_stored(&mut store, &sent, &acks);
    drop(store);
    let ro = Store::open_read_only(reopen(&storage)).expect("reopen");
    assert_eq!(ro.entries().len(), 1);
}

#[test]
fn device_errors_and_a_full_device_reach_the_sender_and_lose_nothing_acknowledged() {
    // Write 1 is the open's superblock; records of 1 MiB are one write each; the index write
    // of the first commit follows them. Fail a write well after the first sync.
    let (dev, storage) = formatted(32 << 20);
    let faulty = FaultDevice::new(
        dev,
        FaultPlan {
            write_eio: Some(8),
            ..FaultPlan::default()
        },
    );
    let running = start(Box::new(faulty), config(Order::In), &tcp());
    let mut c = Client::connect(&running.addr, &opts()).expect("connect");
    let first = data(1, 1 << 20);
    c.send(&first, true).expect("send");
    let (_, stored) = c.sync().expect("sync");
    assert_eq!(stored, 1);
    let mut sent = vec![(0u64, first)];
    let mut failed = false;
    for i in 1..12u64 {
        let bytes = data(i + 1, 1 << 20);
        match c.send(&bytes, true) {
            Ok(seq) => sent.push((seq, bytes)),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    let answers = match c.sync() {
        Ok(_) => c.finish().expect("finish"),
        Err(_) => {
            failed = true;
            Default::default()
        }
    };
    assert!(
        failed || !answers.errors.is_empty(),
        "the injected EIO was reported"
    );
    let store = running.stop();
    drop(store);
    let mut ro = Store::open_read_only(reopen(&storage)).expect("reopen");
    // Every stored record is whole and is one that was sent; the first (acknowledged) is there.
    assert_eq!(ro.read(0).expect("first record"), sent[0].1);
    for e in ro.entries().to_vec() {
        let (_, bytes) = sent.iter().find(|(s, _)| *s == e.seq).expect("sent");
        assert!(ro.read(e.id).expect("read") == *bytes);
    }

    // A device with room for two 1 MiB records.
    let dev = MemDevice::new(3 << 20, QueueOptions::default());
    let storage = dev.storage();
    drop(
        Store::format(
            Box::new(dev),
            FormatOptions {
                index_slots: Some(64),
                format_id: None,
            },
        )
        .expect("format"),
    );
    let dev = reopen(&storage);
    let running = start(dev, config(Order::Out), &tcp());
    let mut c = Client::connect(&running.addr, &opts()).expect("connect");
    let mut full = None;
    for i in 0..4u64 {
        if c.send(&data(i, 1 << 20), true).is_err() {
            break;
        }
        if let Err(e) = c.sync() {
            full = Some(e);
            break;
        }
    }
    let answers = c.answers().clone();
    let store = running.stop();
    assert!(
        answers
            .errors
            .iter()
            .any(|(code, _, _)| *code == ErrorCode::DeviceFull as u16),
        "{answers:?} {full:?}"
    );
    assert_eq!(store.entries().len(), answers.acks.len());
}

/// A device that completes nothing until the test opens its gate: slower than any sender.
struct Gated {
    inner: MemDevice,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl BlockDevice for Gated {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn describe(&self) -> String {
        format!("gated({})", self.inner.describe())
    }
    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        self.inner.submit(req)
    }
    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.inner.ring_doorbell()
    }
    fn poll(&mut self, out: &mut Vec<Completion>, min: usize) -> DeviceResult<usize> {
        let (lock, cv) = &*self.gate;
        let mut open = lock.lock().expect("gate");
        while !*open {
            open = cv.wait(open).expect("gate");
        }
        drop(open);
        self.inner.poll(out, min)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

#[test]
fn a_sender_faster_than_the_device_is_held_to_the_configured_buffers() {
    let (_, storage) = formatted(128 << 20);
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let dev = Gated {
        inner: MemDevice::with_storage(storage.clone(), QueueOptions::default()),
        gate: Arc::clone(&gate),
    };
    let cfg = ServerConfig {
        buffers: 8,
        per_stream: 8,
        ..config(Order::In)
    };
    let running = start(Box::new(dev), cfg, &tcp());
    // From now on the device completes nothing until the gate opens again.
    *gate.0.lock().expect("gate") = false;
    let records = 64usize;
    let addr = running.addr.clone();
    let sender = std::thread::spawn(move || send_all(&addr, 3, &vec![1 << 20; records]));
    // The device completes nothing: the server fills its buffers, then stops reading.
    let credits = Arc::clone(&running.handle.credits);
    while credits.in_use() < 8 {
        std::thread::yield_now();
    }
    assert!(
        !sender.is_finished(),
        "64 MiB cannot fit in 8 MiB of buffers and the sockets' queues"
    );
    assert_eq!(
        running
            .handle
            .stats
            .records
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    *gate.0.lock().expect("gate") = true;
    gate.1.notify_all();
    let (sent, acks) = sender.join().expect("sender");
    let mut store = running.stop();
    assert_eq!(store.entries().len(), records);
    check_stored(&mut store, &sent, &acks);
    assert!(
        credits.peak() <= 8,
        "peak {} buffers of 8 configured",
        credits.peak()
    );
}

#[test]
fn a_sender_ten_times_faster_than_a_throttled_device_never_holds_more_than_the_buffers() {
    // A real device made slow: `throttle(...)` hands completions back no faster than a 40 MB/s
    // link, while the sender pushes 48 MiB over loopback as fast as the server reads it. The
    // bound is checked on the server's own credit counter (peak buffers in use), not on time.
    let (_, storage) = formatted(96 << 20);
    let dev = kura_vdrive::Throttle::new(
        reopen(&storage),
        kura_vdrive::ThrottleOptions {
            mbps: Some(40.0),
            ..kura_vdrive::ThrottleOptions::default()
        },
    )
    .expect("throttle");
    let cfg = ServerConfig {
        buffers: 8,
        per_stream: 4,
        ..config(Order::Out)
    };
    let running = start(Box::new(dev), cfg, &tcp());
    let senders: Vec<_> = (0..3u64)
        .map(|s| {
            let addr = running.addr.clone();
            std::thread::spawn(move || send_all(&addr, 60 + s, &[1 << 20; 16]))
        })
        .collect();
    let results: Vec<_> = senders
        .into_iter()
        .map(|t| t.join().expect("sender"))
        .collect();
    let credits = Arc::clone(&running.handle.credits);
    let mut store = running.stop();
    assert_eq!(store.entries().len(), 48);
    for (sent, acks) in &results {
        check_stored(&mut store, sent, acks);
    }
    assert_eq!(credits.in_use(), 0, "every buffer given back");
    assert!(
        (1..=8).contains(&credits.peak()),
        "peak {} buffers of 8 configured",
        credits.peak()
    );
}

#[test]
fn records_written_without_the_network_are_stored_whole_in_both_orders() {
    // `write_local` drives the server's device thread directly; on a device whose commands
    // take unequal times (a tenth of them 50x slower) both retirement orders store every record
    // whole: its CRC is checked on read.
    for order in [Order::In, Order::Out] {
        let (_, storage) = formatted(64 << 20);
        let dev = kura_vdrive::Throttle::new(
            reopen(&storage),
            kura_vdrive::ThrottleOptions {
                lat: std::time::Duration::from_micros(20),
                slow: std::time::Duration::from_micros(1000),
                slow_pct: 10.0,
                ..kura_vdrive::ThrottleOptions::default()
            },
        )
        .expect("throttle");
        let mut rng = SmallRng::seed_from_u64(9);
        let sizes: Vec<usize> = (0..40).map(|_| rng.gen_range(1..=(2 << 20))).collect();
        let cfg = config(order);
        let pool = BufferPool::new(cfg.buffers << 20).expect("pool");
        let store = Store::open(Box::new(dev)).expect("open");
        let (store, run) =
            kura_ingest::server::write_local(store, &cfg, &pool, &sizes, 3).expect("write");
        assert_eq!(run.records, 40);
        assert_eq!(run.bytes, sizes.iter().sum::<usize>() as u64);
        drop(store);
        let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
        let mut store = Store::open_read_only(Box::new(dev)).expect("reopen");
        let mut seqs: Vec<u64> = store.entries().iter().map(|e| e.seq).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (0..40).collect::<Vec<u64>>(), "{order:?}");
        for e in store.entries().to_vec() {
            let bytes = store.read(e.id).expect("a whole record");
            assert_eq!(bytes.len(), sizes[e.seq as usize]);
        }
    }
}

#[test]
fn an_accelfs_target_keeps_records_as_files_and_the_index_in_leveldb() {
    use kura_ingest::fstarget::FsStore;
    let storage = kura_accelfs::testing::formatted_storage(64 << 20);
    let mount = || reopen(&storage);
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = Addr::Unix(dir.path().join("s"));
    let cfg = ServerConfig {
        key: None,
        ..config(Order::In)
    };
    let store = FsStore::open(mount(), "/ingest").expect("open");
    let listener = Listener::bind(&addr).expect("bind");
    let server = Server::new(cfg, BufferPool::new(16 << 20).expect("pool")).expect("server");
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run_fs(store, listener));
    let mut sent = Vec::new();
    for (stage, seed) in [(Stage::Crc32c, 1u64), (Stage::Zstd, 2)] {
        let mut c = Client::connect(
            &addr,
            &ClientOptions {
                stage: Some(stage),
                ..ClientOptions::default()
            },
        )
        .expect("connect");
        for i in 0..4u64 {
            // Compressible halves so zstd has something to do.
            let mut bytes = data(seed * 10 + i, 300_000 + i as usize * 100_000);
            bytes[..150_000].fill(7);
            let seq = c.send(&bytes, true).expect("send");
            sent.push((stage, seq, bytes));
        }
        let answers = c.finish().expect("finish");
        assert_eq!(answers.acks.len(), 4, "{answers:?}");
    }
    handle.stop();
    let store = thread.join().expect("thread").expect("server");
    store.close().expect("close");
    // A record file a crash left behind, beyond the index, is removed at the next open.
    {
        let fs = kura_accelfs::testing::mount_storage(&storage);
        fs.write("/ingest/records/00000000000000ff", b"orphan")
            .expect("write");
        fs.unmount().expect("unmount");
    }
    let store = FsStore::open(mount(), "/ingest").expect("reopen");
    let entries = store.entries().expect("entries");
    assert_eq!(entries.len(), 8);
    for e in &entries {
        let (stage, _, bytes) = sent
            .iter()
            .find(|(st, seq, _)| *seq == e.seq && *st as u8 == e.stage)
            .expect("stored record was sent");
        assert!(store.read_original(e.id).expect("read") == *bytes);
        if *stage == Stage::Zstd {
            assert!(e.stored_len < e.orig_len, "{e:?}");
        }
    }
    assert!(store.read_original(8).is_err());
    store.close().expect("close");
    let fs = kura_accelfs::testing::mount_storage(&storage);
    assert!(!fs.exists("/ingest/records/00000000000000ff"));
}

#[test]
fn a_crash_at_any_point_of_a_served_stream_shows_only_whole_records() {
    use kura_engine::fault::materialize;
    // Three senders at once with per-record acks into a recording fault device; then every
    // cut of the recorded write stream is recovered: each visible record is whole and is one
    // that was sent, and the end of the stream holds every acknowledged record.
    let (dev, storage) = formatted(28 << 20);
    drop(dev);
    let base = storage.lock().expect("storage").clone();
    let (faulty, control) = kura_accelfs::testing::recording_device(&storage);
    let running = start(Box::new(faulty), config(Order::Out), &tcp());
    let senders: Vec<_> = (0..3u64)
        .map(|s| {
            let addr = running.addr.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(s + 40);
                let sizes: Vec<usize> = (0..6).map(|_| rng.gen_range(1..(2 << 20))).collect();
                send_all(&addr, s + 40, &sizes)
            })
        })
        .collect();
    let results: Vec<_> = senders
        .into_iter()
        .map(|t| t.join().expect("sender"))
        .collect();
    drop(running.stop());
    let trace = control.trace();
    let block = QueueOptions::default().block_size as usize;
    let sent: Vec<(u64, &Vec<u8>)> = results
        .iter()
        .flat_map(|(sent, _)| sent.iter().map(|(seq, b)| (*seq, b)))
        .collect();
    let mut checked = 0;
    for cut in (0..=trace.len()).step_by(4).chain([trace.len()]) {
        for seed in 0..2u64 {
            let image = materialize(&base, &trace, cut, block, 0.5, seed + cut as u64);
            let dev = MemDevice::with_storage(Arc::new(Mutex::new(image)), QueueOptions::default());
            let mut store = Store::open_read_only(Box::new(dev))
                .unwrap_or_else(|e| panic!("cut {cut}: recovery failed: {e}"));
            for e in store.entries().to_vec() {
                let got = store
                    .read(e.id)
                    .unwrap_or_else(|err| panic!("cut {cut}: record {}: {err}", e.id));
                assert!(
                    sent.iter().any(|(seq, b)| *seq == e.seq && **b == got),
                    "cut {cut}: record {} is not a record that was sent",
                    e.id
                );
            }
            if cut == trace.len() {
                assert_eq!(store.entries().len(), 18);
                for (sent, acks) in &results {
                    check_stored(&mut store, sent, acks);
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked} images checked");
}

#[test]
fn a_stop_in_the_middle_of_a_record_finishes_stores_and_acknowledges_it() {
    let (dev, storage) = formatted(32 << 20);
    let running = start(dev, config(Order::In), &tcp());
    let mut c = Client::connect(&running.addr, &opts()).expect("connect");
    let bytes = data(5, 2 << 20);
    let (head, tail) = bytes.split_at(1 << 20);
    let mut first = Frame::Begin {
        seq: 0,
        size: bytes.len() as u64,
    }
    .encode();
    first.extend(frame::header(FrameType::Data, 0, head));
    first.extend(head);
    c.send_raw(&first).expect("first half");
    // The server is asked to stop while the record is half sent: it accepts no one new but
    // finishes this record, stores it and acknowledges it before its reader lets go.
    running.handle.stop();
    let mut rest = frame::header(FrameType::Data, 0, tail).to_vec();
    rest.extend(tail);
    rest.extend(
        Frame::End {
            record_crc: frame::record_crc(&bytes),
            ack: true,
        }
        .encode(),
    );
    rest.extend(Frame::Sync { upto: 0 }.encode());
    c.send_raw(&rest).expect("second half");
    let answers = c.finish().expect("answers");
    assert!(answers.errors.is_empty(), "{answers:?}");
    assert_eq!(answers.acks, vec![(0, 0)]);
    assert_eq!(answers.synced, Some((0, 1)));
    let store = running
        .thread
        .join()
        .expect("server thread")
        .expect("server");
    drop(store);
    let mut ro = Store::open_read_only(reopen(&storage)).expect("reopen");
    assert!(ro.read(0).expect("read") == bytes);
}
