//! Bad input never crashes the server and never touches other clients: malformed handshakes,
//! refused and unknown options, malformed and out-of-range requests, oversize lengths, unknown
//! commands and flags, and clients that vanish mid-request. Each gets an NBD error reply or a
//! closed connection, and a well-behaved client keeps working throughout.

mod common;

use common::{mem_disk, pattern, start, start_with, Raw};
use kura_engine::BlockingIo;
use kura_nbd::client::connect;
use kura_nbd::protocol::{
    self, client_flags, cmd_flags, Command, ErrorCode, InfoRequest, Opt, Rep, IHAVEOPT,
    MAX_OPTION_LEN, MAX_PAYLOAD,
};
use kura_nbd::{Export, ServeOptions, Server};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn server() -> Server {
    let (dev, _) = mem_disk(4 * MIB);
    let (ro, _) = mem_disk(MIB);
    start(vec![
        Export::new("disk", dev),
        Export::new("ro", ro).read_only(true),
    ])
}

/// A well-behaved client still works.
fn healthy(server: &Server) {
    let mut c = connect(server.local_addr(), "disk").expect("a healthy client connects");
    let data = pattern(8192, 77);
    c.write_blocks(10, &data).expect("healthy write");
    let mut back = vec![0u8; 8192];
    c.read_blocks(10, &mut back).expect("healthy read");
    assert_eq!(back, data);
}

/// Waits (up to 5 s) until the server has no connection open.
fn wait_idle(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.stats().active > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn malformed_handshakes_close_only_their_connection() {
    let server = server();
    let addr = server.local_addr();
    type Case = (&'static str, Box<dyn Fn(&mut Raw)>);
    let cases: Vec<Case> = vec![
        (
            "unknown client flags",
            Box::new(|r: &mut Raw| {
                r.greet_with(0x8000_0001);
            }),
        ),
        (
            "client without fixed newstyle",
            Box::new(|r: &mut Raw| {
                r.greet_with(0);
            }),
        ),
        (
            "bad option magic",
            Box::new(|r: &mut Raw| {
                r.greet();
                r.send(&[0x55; 16]).unwrap();
            }),
        ),
        (
            "option data over 64 KiB",
            Box::new(|r: &mut Raw| {
                r.greet();
                let mut h = IHAVEOPT.to_be_bytes().to_vec();
                h.extend_from_slice(&Opt::Go.code().to_be_bytes());
                h.extend_from_slice(&(MAX_OPTION_LEN + 1).to_be_bytes());
                r.send(&h).unwrap();
            }),
        ),
        (
            "option of 4 GiB",
            Box::new(|r: &mut Raw| {
                r.greet();
                let mut h = IHAVEOPT.to_be_bytes().to_vec();
                h.extend_from_slice(&Opt::List.code().to_be_bytes());
                h.extend_from_slice(&u32::MAX.to_be_bytes());
                r.send(&h).unwrap();
            }),
        ),
        (
            "export name that does not exist",
            Box::new(|r: &mut Raw| {
                r.greet();
                r.option(Opt::ExportName, b"nope");
            }),
        ),
        (
            "export name that is not UTF-8",
            Box::new(|r: &mut Raw| {
                r.greet();
                r.option(Opt::ExportName, &[0xff, 0xfe, 0]);
            }),
        ),
        (
            "garbage instead of a request",
            Box::new(|r: &mut Raw| {
                r.greet();
                r.go("disk");
                r.send(&[0xab; 28]).unwrap();
            }),
        ),
        (
            "request magic of extended headers",
            Box::new(|r: &mut Raw| {
                r.greet();
                r.go("disk");
                let mut h = [0u8; 32];
                h[..4].copy_from_slice(&0x21e4_1c71u32.to_be_bytes());
                r.send(&h).unwrap();
            }),
        ),
    ];
    for (what, case) in &cases {
        let mut r = Raw::connect(addr);
        case(&mut r);
        assert!(r.closed(), "{what}: connection should be closed");
        healthy(&server);
    }
    let stats = server.stats();
    assert!(stats.protocol_errors >= cases.len() as u64, "{stats:?}");
}

#[test]
fn refused_and_malformed_options_get_error_replies_and_haggling_goes_on() {
    let server = server();
    let mut r = Raw::connect(server.local_addr());
    r.greet();
    let expect = |r: &mut Raw, opt: Opt, data: &[u8], want: Rep| {
        r.option(opt, data);
        let (h, msg) = r.option_reply().unwrap();
        assert_eq!(
            (h.option, h.reply),
            (opt, want),
            "{opt}: {}",
            String::from_utf8_lossy(&msg)
        );
    };
    expect(&mut r, Opt::StructuredReply, b"x", Rep::ErrInvalid);
    expect(&mut r, Opt::StartTls, &[], Rep::ErrUnsup);
    expect(&mut r, Opt::SetMetaContext, &[0; 8], Rep::ErrInvalid);
    expect(&mut r, Opt::ListMetaContext, &[0; 3], Rep::ErrInvalid);
    expect(&mut r, Opt::ExtendedHeaders, &[], Rep::ErrUnsup);
    expect(&mut r, Opt::Other(999), &[1, 2, 3], Rep::ErrUnsup);
    expect(&mut r, Opt::Other(u32::MAX), &[], Rep::ErrUnsup);
    expect(&mut r, Opt::List, b"x", Rep::ErrInvalid);
    // Name length past the option, a truncated request list, trailing bytes, NUL in the name.
    expect(
        &mut r,
        Opt::Go,
        &[0, 0, 0, 200, b'd', 0, 0],
        Rep::ErrInvalid,
    );
    expect(
        &mut r,
        Opt::Info,
        &[0, 0, 0, 4, b'd', b'i', b's', b'k', 0, 2, 0, 3],
        Rep::ErrInvalid,
    );
    expect(
        &mut r,
        Opt::Go,
        &[0, 0, 0, 4, b'd', b'i', b's', b'k', 0, 0, 9],
        Rep::ErrInvalid,
    );
    expect(&mut r, Opt::Go, &[0, 0, 0, 1, 0, 0, 0], Rep::ErrInvalid);
    expect(&mut r, Opt::Go, &[], Rep::ErrInvalid);
    let unknown = InfoRequest {
        name: "missing".into(),
        requests: vec![],
    };
    expect(&mut r, Opt::Info, &unknown.encode(), Rep::ErrUnknown);
    expect(&mut r, Opt::Go, &unknown.encode(), Rep::ErrUnknown);
    // After all that, the same connection can still pick an export and do I/O.
    let (size, _) = r.go("disk");
    assert_eq!(size, 4 * MIB);
    r.write_at(0, b"still fine", 0);
    assert_eq!(r.read_at(0, 10), b"still fine");

    // NBD_OPT_ABORT is acknowledged, then the server closes.
    let mut a = Raw::connect(server.local_addr());
    a.greet();
    a.option(Opt::Abort, &[]);
    assert_eq!(a.option_reply().unwrap().0.reply, Rep::Ack);
    assert!(a.closed());
    healthy(&server);
}

#[test]
fn bad_requests_get_error_replies_and_the_connection_lives_on() {
    let server = server();
    let (mut r, size) = Raw::open(server.local_addr(), "disk");
    let inval = ErrorCode::Inval.code();
    let cases: [(&str, Command, u16, u64, u32, u32); 14] = [
        ("unknown command", Command::Other(77), 0, 0, 4096, inval),
        (
            "unknown command 0xffff",
            Command::Other(0xffff),
            0,
            0,
            0,
            inval,
        ),
        ("cache past the end", Command::Cache, 0, size, 4096, inval),
        (
            "block status (not negotiated)",
            Command::BlockStatus,
            0,
            0,
            4096,
            inval,
        ),
        ("resize", Command::Resize, 0, 0, 0, inval),
        ("unknown flag", Command::Read, 0x8000, 0, 4096, inval),
        (
            "DF without structured replies",
            Command::Read,
            cmd_flags::DF,
            0,
            4096,
            inval,
        ),
        (
            "NO_HOLE on a read",
            Command::Read,
            cmd_flags::NO_HOLE,
            0,
            4096,
            inval,
        ),
        (
            "FAST_ZERO not advertised",
            Command::WriteZeroes,
            cmd_flags::FAST_ZERO,
            0,
            4096,
            inval,
        ),
        (
            "read past the end",
            Command::Read,
            0,
            size - 100,
            4096,
            inval,
        ),
        ("read at u64::MAX", Command::Read, 0, u64::MAX, 1, inval),
        (
            "read over 32 MiB",
            Command::Read,
            0,
            0,
            MAX_PAYLOAD + 1,
            inval,
        ),
        (
            "write-zeroes past the end",
            Command::WriteZeroes,
            0,
            size,
            1,
            ErrorCode::NoSpc.code(),
        ),
        ("flush with a length", Command::Flush, 0, 0, 4096, inval),
    ];
    for (what, cmd, flags, off, len, want) in cases {
        assert_eq!(r.simple(cmd, flags, off, len), want, "{what}");
    }
    // A write past the end: its payload is consumed, ENOSPC comes back, the stream stays in step.
    r.request(Command::Write, 0, 5, size - 10, 4096);
    r.send(&[7; 4096]).unwrap();
    let reply = r.reply().unwrap();
    assert_eq!((reply.error, reply.cookie), (ErrorCode::NoSpc.code(), 5));
    // A trim past the end.
    assert_eq!(r.simple(Command::Trim, 0, size, 4096), inval);
    // FUA is accepted on every command.
    assert_eq!(r.simple(Command::Flush, cmd_flags::FUA, 0, 0), 0);
    r.write_at(4096, &pattern(5000, 1), cmd_flags::FUA);
    assert_eq!(r.read_at(4096, 5000), pattern(5000, 1));
    let stats = server.stats();
    assert!(stats.error_replies >= 16, "{stats:?}");
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
    healthy(&server);
}

#[test]
fn an_oversize_write_is_refused_and_closes_the_connection() {
    let server = server();
    let (mut r, _) = Raw::open(server.local_addr(), "disk");
    r.request(Command::Write, 0, 3, 0, MAX_PAYLOAD + 1);
    let reply = r.reply().unwrap();
    assert_eq!((reply.error, reply.cookie), (ErrorCode::Inval.code(), 3));
    assert!(r.closed());
    let (mut r, _) = Raw::open(server.local_addr(), "disk");
    r.request(Command::Write, 0, 4, 0, u32::MAX);
    assert_eq!(r.reply().unwrap().error, ErrorCode::Inval.code());
    assert!(r.closed());
    healthy(&server);
}

#[test]
fn clients_vanishing_mid_request_leave_the_others_unaffected() {
    let server = server();
    let addr = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    // A steady client verifying its own data the whole time.
    let steady = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut c = connect(addr, "disk").unwrap();
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) || rounds < 20 {
                let data = pattern(64 << 10, rounds);
                c.write_blocks(512, &data).unwrap();
                let mut back = vec![0u8; data.len()];
                c.read_blocks(512, &mut back).unwrap();
                assert_eq!(back, data, "round {rounds}");
                rounds += 1;
            }
            rounds
        })
    };
    for round in 0..10u64 {
        // Half a write payload, then gone.
        let (mut r, _) = Raw::open(addr, "disk");
        r.request(Command::Write, 0, 1, 0, 1 << 20);
        r.send(&vec![9u8; 300_000]).unwrap();
        drop(r);
        // Many reads in flight, replies never read, then gone (reset with data unread).
        let (mut r, _) = Raw::open(addr, "disk");
        for i in 0..200 {
            r.request(Command::Read, 0, i, 0, 256 << 10);
        }
        drop(r);
        // Half a request header.
        let (mut r, _) = Raw::open(addr, "disk");
        r.send(
            &protocol::RequestHeader {
                flags: 0,
                command: Command::Read,
                cookie: 1,
                offset: 0,
                length: 4096,
            }
            .encode()[..13],
        )
        .unwrap();
        drop(r);
        // Gone in the middle of the handshake.
        let mut r = Raw::connect(addr);
        r.greet_with(client_flags::FIXED_NEWSTYLE);
        r.send(&IHAVEOPT.to_be_bytes()).unwrap();
        drop(r);
        // Connected and never said anything.
        drop(TcpStream::connect(addr).unwrap());
        if round % 3 == 0 {
            healthy(&server);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = steady.join().expect("the steady client never failed");
    assert!(rounds >= 20);
    // The vanished clients' connections are all cleaned up.
    wait_idle(&server);
    assert_eq!(server.stats().active, 0, "{:?}", server.stats());
    healthy(&server);
}

#[test]
fn silent_clients_time_out_and_extra_clients_are_refused() {
    let (dev, _) = mem_disk(MIB);
    let opts = ServeOptions {
        handshake_timeout: Duration::from_millis(200),
        max_clients: 3,
        ..ServeOptions::default()
    };
    let server = start_with(vec![Export::new("", dev)], opts);
    let addr = server.local_addr();
    // A client that stalls in the handshake is dropped after the timeout.
    let mut slow = Raw::connect(addr);
    slow.greet();
    let t = Instant::now();
    assert!(slow.closed());
    assert!(t.elapsed() < Duration::from_secs(5));
    wait_idle(&server);
    // Three connections fill the server; a fourth is closed at once; the first three still work.
    let mut held: Vec<Raw> = (0..3).map(|_| Raw::open(addr, "").0).collect();
    let mut extra = Raw::connect(addr);
    assert!(extra.closed());
    for r in &mut held {
        r.write_at(0, b"ok", 0);
    }
    assert!(server.stats().refused >= 1);
    drop(held);
    // Once they are gone, new clients get in again (the empty name is the default export).
    wait_idle(&server);
    let mut c = connect(addr, "").unwrap();
    let mut b = vec![0u8; 4096];
    c.read_blocks(0, &mut b).unwrap();
    assert_eq!(&b[..2], b"ok");
}

#[test]
fn stopping_the_server_finishes_in_flight_work_and_frees_every_thread() {
    let (dev, storage) = mem_disk(4 * MIB);
    let server = start(vec![Export::new("disk", dev)]);
    let addr = server.local_addr();
    let mut c = connect(addr, "disk").unwrap();
    c.write_blocks(0, &pattern(1 << 20, 2)).unwrap();
    let (mut idle, _) = Raw::open(addr, "disk");
    let mut half = Raw::connect(addr);
    half.greet();
    let t = Instant::now();
    let exports = server.stop();
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "stop took {:?}",
        t.elapsed()
    );
    assert_eq!(exports.len(), 1);
    assert!(idle.closed() && half.closed());
    assert_eq!(storage.lock().unwrap()[..1 << 20], pattern(1 << 20, 2)[..]);
    // The client sees the server gone as an offline device, not a hang or a panic.
    let mut b = vec![0u8; 4096];
    assert!(c.read_blocks(0, &mut b).is_err());
}
