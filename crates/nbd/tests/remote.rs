//! The `remote:` drive: targets parsed, data through a real `kura serve` export, and recovery —
//! reads in flight when the connection drops are replayed once on a new connection while writes
//! fail and poison the drive (an old connection that delivers them late cannot put old data over
//! new data written through the drive), a flush
//! across a reconnect fails (typed) unless nothing was written since the last good flush, and a
//! server that stops answering gives a typed error within the timeout instead of a hang. A small
//! TCP proxy between client and server cuts, stalls or black-holes connections on demand.

mod common;

use common::{pattern, start};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::{BlockDevice, BlockingIo, Completion, DeviceError, IoBuf, Request, Spec};
use kura_nbd::remote::{self, Remote, RemoteError, Target};
use kura_nbd::{Export, Server};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const PASS: u8 = 0;
/// Flag: requests still reach the server, but replies are dropped.
const STALL: u8 = 1;
/// Flag: new connections are accepted and never answered.
const BLACKHOLE: u8 = 2;

/// A TCP proxy in front of `upstream`.
struct Proxy {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn new(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        let mode = Arc::new(AtomicU8::new(PASS));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (m, c) = (Arc::clone(&mode), Arc::clone(&conns));
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                c.lock()
                    .expect("proxy conns")
                    .push(client.try_clone().expect("clone"));
                if m.load(Ordering::SeqCst) & BLACKHOLE != 0 {
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                c.lock()
                    .expect("proxy conns")
                    .push(server.try_clone().expect("clone"));
                let (c2, s2) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                thread::spawn(move || pump(c2, s2, None));
                let m = Arc::clone(&m);
                thread::spawn(move || pump(server, client, Some(m)));
            }
        });
        Proxy { addr, mode, conns }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    /// Cuts every connection made so far.
    fn cut(&self) {
        for s in self.conns.lock().expect("proxy conns").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Copies `from` to `to`; with `mode`, drops the bytes while it says STALL.
fn pump(mut from: TcpStream, mut to: TcpStream, mode: Option<Arc<AtomicU8>>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if mode
            .as_ref()
            .is_some_and(|m| m.load(Ordering::SeqCst) & STALL != 0)
        {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn served(storage: &MemStorage) -> Server {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    start(vec![Export::new("disk", Box::new(dev))])
}

fn open(addr: SocketAddr, options: &str) -> Remote {
    let text = format!("remote:{addr}/disk{options}");
    remote::open(&Spec::parse(&text).expect("spec")).expect("open remote")
}

fn drain(dev: &mut dyn BlockDevice) -> Vec<Completion> {
    let mut done = Vec::new();
    while dev.in_flight() > 0 {
        dev.poll(&mut done, 1).expect("poll");
    }
    done
}

#[test]
fn targets_parse_and_bad_ones_are_refused() {
    let t = Target::parse("host.example:1234/disk").unwrap();
    assert_eq!(
        (t.host.as_str(), t.port, t.export.as_str()),
        ("host.example", 1234, "disk")
    );
    let t = Target::parse("10.0.0.1").unwrap();
    assert_eq!((t.port, t.export.as_str()), (10809, ""));
    let t = Target::parse("[::1]:99/a/b").unwrap();
    assert_eq!(
        (t.host.as_str(), t.port, t.export.as_str()),
        ("::1", 99, "a/b")
    );
    assert_eq!(t.addr(), "[::1]:99");
    for bad in ["", ":10809/x", "host:port/x", "host:70000", "[::1/x"] {
        assert!(Target::parse(bad).is_err(), "{bad:?} parsed");
    }
    for spec in [
        "remote:127.0.0.1:1/x?tls=1",
        "remote:127.0.0.1:1/x?ca=/tmp/ca.pem",
        "remote:127.0.0.1:1/x?timeout=0",
        "remote:127.0.0.1:1/x?colour=red",
    ] {
        let err = remote::open(&Spec::parse(spec).unwrap()).unwrap_err();
        assert!(!err.to_string().is_empty(), "{spec}");
    }
}

#[test]
fn a_remote_drive_reads_and_writes_through_kura_serve() {
    let storage = MemDevice::new(8 << 20, QueueOptions::default()).storage();
    let server = served(&storage);
    let mut dev = open(server.local_addr(), "");
    assert_eq!(dev.geometry().capacity_bytes(), 8 << 20);
    let data = pattern(1 << 20, 3);
    dev.write_blocks(10, &data).unwrap();
    dev.flush_all().unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read_blocks(10, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(
        &storage.lock().unwrap()[10 * 4096..11 * 4096],
        &data[..4096]
    );
    assert_eq!(dev.stats().reconnects, 0);
    assert!(dev.describe().starts_with("remote:127.0.0.1:"));
}

#[test]
fn reads_in_flight_at_a_drop_are_replayed_and_writes_fail_and_poison_the_drive() {
    let storage = MemDevice::new(4 << 20, QueueOptions::default()).storage();
    let server = served(&storage);
    let proxy = Proxy::new(server.local_addr());
    let mut dev = open(proxy.addr, "?timeout=5");
    dev.write_blocks(0, &pattern(64 << 10, 1)).unwrap();
    dev.flush_all().unwrap();

    // Requests reach the server but no reply comes back; then the connection is cut.
    proxy.set(STALL);
    let mut tag = 0;
    for i in 0..8u64 {
        let mut buf = IoBuf::zeroed(8192);
        buf.copy_from_slice(&pattern(8192, 100 + i));
        tag += 1;
        dev.submit(Request::write(tag, 100 + 2 * i, 2, buf))
            .unwrap();
    }
    tag += 1;
    let read_tag = tag;
    dev.submit(Request::read(tag, 0, 16, IoBuf::zeroed(16 * 4096)))
        .unwrap();
    tag += 1;
    dev.submit(Request::flush(tag)).unwrap();
    dev.ring_doorbell().unwrap();
    thread::sleep(Duration::from_millis(200));
    proxy.set(PASS);
    proxy.cut();

    let done = drain(&mut dev);
    assert_eq!(done.len(), tag as usize, "every command completes once");
    for c in &done {
        if c.tag == read_tag {
            assert!(c.status.is_ok(), "the read is replayed: {:?}", c.status);
            let buf = c.buf.as_ref().expect("read buffer back");
            assert_eq!(&buf[..], &pattern(64 << 10, 1)[..], "replayed read");
        } else {
            assert!(c.status.is_err(), "tag {} ({}) succeeded", c.tag, c.op);
        }
    }
    let s = dev.stats();
    assert_eq!(s.reconnects, 1, "{s:?}");
    assert_eq!(s.replayed, 1, "{s:?}");
    assert_eq!(s.failed_in_cut, 8, "{s:?}");
    assert_eq!(
        dev.last_error(),
        Some(&RemoteError::WritesLostInCut { count: 8 })
    );
    // Poisoned until reopened: no write, no flush; reads still work.
    let err = dev.write_blocks(0, &pattern(4096, 9)).unwrap_err();
    assert!(matches!(err, DeviceError::Poisoned { .. }), "{err}");
    assert!(dev.flush_all().is_err());
    let mut back = vec![0u8; 64 << 10];
    dev.read_blocks(0, &mut back).unwrap();
    assert_eq!(back, pattern(64 << 10, 1));
}

/// A TCP relay whose first connection's client-to-server bytes can be held back and delivered
/// later, as a slow network path delivers an old connection's requests after a new one's.
struct DelayingRelay {
    addr: SocketAddr,
    hold: Arc<AtomicU8>,
    held: Arc<Mutex<Vec<u8>>>,
    first_upstream: Arc<Mutex<Option<TcpStream>>>,
}

impl DelayingRelay {
    fn new(upstream: SocketAddr) -> DelayingRelay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay bind");
        let addr = listener.local_addr().expect("relay addr");
        let hold = Arc::new(AtomicU8::new(0));
        let held = Arc::new(Mutex::new(Vec::new()));
        let first_upstream = Arc::new(Mutex::new(None));
        let (h, b, f) = (
            Arc::clone(&hold),
            Arc::clone(&held),
            Arc::clone(&first_upstream),
        );
        thread::spawn(move || {
            for (n, client) in listener.incoming().enumerate() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                if n == 0 {
                    *f.lock().expect("relay") = Some(server.try_clone().expect("clone"));
                }
                let (c2, s2) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                let (h, b) = (Arc::clone(&h), Arc::clone(&b));
                thread::spawn(move || {
                    let (mut from, mut to) = (c2, s2);
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let k = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(k) => k,
                        };
                        if n == 0 && h.load(Ordering::SeqCst) != 0 {
                            b.lock().expect("relay").extend_from_slice(&buf[..k]);
                        } else if to.write_all(&buf[..k]).is_err() {
                            break;
                        }
                    }
                    // The old path stays open towards the server: the held bytes go later.
                });
                thread::spawn(move || pump(server, client, None));
            }
        });
        DelayingRelay {
            addr,
            hold,
            held,
            first_upstream,
        }
    }

    /// Delivers what was held back to the server on the first connection.
    fn release(&self) {
        let bytes = std::mem::take(&mut *self.held.lock().expect("relay"));
        if let Some(s) = self.first_upstream.lock().expect("relay").as_mut() {
            s.write_all(&bytes).expect("deliver held bytes");
        }
    }
}

#[test]
fn a_delayed_old_connection_cannot_put_old_data_over_a_newer_write() {
    let storage = MemDevice::new(4 << 20, QueueOptions::default()).storage();
    let server = served(&storage);
    let relay = DelayingRelay::new(server.local_addr());
    let mut dev = open(relay.addr, "?timeout=1");
    dev.write_blocks(10, &pattern(4096, 1)).unwrap();
    dev.flush_all().unwrap();

    // The write leaves the client but is held on the network; the drive times out and cuts.
    relay.hold.store(1, Ordering::SeqCst);
    let old = dev.write_blocks(10, &pattern(4096, 2));
    assert!(
        matches!(old, Err(DeviceError::Offline { .. })),
        "a write lost in a cut fails: {old:?}"
    );
    assert_eq!(
        dev.last_error(),
        Some(&RemoteError::WritesLostInCut { count: 1 })
    );
    assert_eq!(dev.stats().replayed, 0, "the write is not replayed");
    // Before the fix the write was replayed and the drive took newer writes, which the late
    // delivery below then overwrote. Now the drive takes none until it is reopened.
    let newer = dev.write_blocks(10, &pattern(4096, 3)).unwrap_err();
    assert!(matches!(newer, DeviceError::Poisoned { .. }), "{newer}");
    relay.release();
    // The old request runs on the server whenever it arrives; the drive still reads.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut back = vec![0u8; 4096];
    loop {
        dev.read_blocks(10, &mut back).unwrap();
        if back == pattern(4096, 2) {
            break;
        }
        assert_eq!(back, pattern(4096, 1), "only the old or the held data");
        assert!(Instant::now() < deadline, "the held write never arrived");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_flush_across_a_reconnect_fails_if_acknowledged_writes_were_unflushed() {
    let storage = MemDevice::new(4 << 20, QueueOptions::default()).storage();
    let server = served(&storage);
    let proxy = Proxy::new(server.local_addr());

    // Nothing written since the last flush: the reconnect is invisible, flushes keep working.
    let mut dev = open(proxy.addr, "?timeout=5");
    dev.write_blocks(0, &pattern(4096, 1)).unwrap();
    dev.flush_all().unwrap();
    proxy.cut();
    thread::sleep(Duration::from_millis(100));
    // The flush itself meets the dead connection, reconnects, and is sent again.
    dev.flush_all().unwrap();
    let mut back = vec![0u8; 4096];
    dev.read_blocks(0, &mut back).unwrap();
    assert_eq!(back, pattern(4096, 1));
    assert_eq!(dev.stats().reconnects, 1);

    // An acknowledged, unflushed write, then the connection drops: the flush must fail.
    dev.write_blocks(1, &pattern(4096, 2)).unwrap();
    proxy.cut();
    thread::sleep(Duration::from_millis(100));
    let err = dev.flush_all().unwrap_err();
    assert!(matches!(err, DeviceError::Offline { .. }), "{err}");
    assert_eq!(
        dev.last_error(),
        Some(&RemoteError::FlushAcrossReconnect { unflushed: 1 })
    );
    assert_eq!(dev.stats().refused_flushes, 1);
    // Like any failed flush, it poisons the drive for writes; reads still work.
    let err = dev.write_blocks(2, &pattern(4096, 3)).unwrap_err();
    assert!(matches!(err, DeviceError::Poisoned { .. }), "{err}");
    dev.read_blocks(1, &mut back).unwrap();
    assert_eq!(back, pattern(4096, 2));

    // With reconnect=0 the drop is simply an error.
    let mut plain = open(proxy.addr, "?timeout=5&reconnect=0");
    plain.read_blocks(0, &mut back).unwrap();
    proxy.cut();
    thread::sleep(Duration::from_millis(100));
    let err = plain.read_blocks(0, &mut back).unwrap_err();
    assert!(matches!(err, DeviceError::Offline { .. }), "{err}");
}

#[test]
fn a_server_that_stops_answering_gives_a_typed_error_not_a_hang() {
    let storage = MemDevice::new(1 << 20, QueueOptions::default()).storage();
    let server = served(&storage);
    let proxy = Proxy::new(server.local_addr());
    let mut dev = open(proxy.addr, "?timeout=0.5");
    dev.write_blocks(0, &pattern(4096, 1)).unwrap();

    // Replies vanish and so does every new connection: the read times out, the reconnect
    // times out, and the drive goes offline with a typed reason.
    proxy.set(STALL | BLACKHOLE);
    let t = Instant::now();
    let mut back = vec![0u8; 4096];
    dev.submit(Request::read(1, 0, 1, IoBuf::zeroed(4096)))
        .unwrap();
    dev.ring_doorbell().unwrap();
    let done = drain(&mut dev);
    let elapsed = t.elapsed();
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert_eq!(done.len(), 1);
    assert!(
        matches!(done[0].status, Err(DeviceError::Offline { .. })),
        "{:?}",
        done[0].status
    );
    assert!(
        matches!(dev.last_error(), Some(RemoteError::ReconnectFailed { .. })),
        "{:?}",
        dev.last_error()
    );
    let err = dev.read_blocks(0, &mut back).unwrap_err();
    assert!(
        matches!(err, DeviceError::Offline { .. }),
        "offline for good: {err}"
    );

    // Opening against a server that accepts and never speaks fails within the timeout.
    let t = Instant::now();
    let err =
        remote::open(&Spec::parse(&format!("remote:{}/disk?timeout=0.5", proxy.addr)).unwrap())
            .unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "open took {:?}",
        t.elapsed()
    );
    assert!(err.to_string().contains("did not answer"), "{err}");
}
