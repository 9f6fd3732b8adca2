//! The server at its edges (issue 13), over real sockets: slow-loris handshakes and idle clients
//! are cut so a new client gets in; one address cannot take every slot; one client's 1-byte
//! writes do not stall another client's reads; clients that agreed to the block size get EINVAL
//! for unaligned requests; no reader ever sees bytes another request left in a pool buffer; a
//! Unix-socket listener is 0600 and never clobbers a file; mutual TLS refuses a client without a
//! certificate before it learns any export name; a client stalling inside the TLS handshake is
//! cut at the handshake deadline.
//!
//! Timing only bounds "no hang": every bound is many times what the work needs.

mod common;

use common::{mem_disk, pattern, tool, Raw};
use kura_engine::BlockingIo;
use kura_nbd::protocol::{
    self, cmd_flags, Command, InfoRequest, Opt, Rep, RequestHeader, SIMPLE_REPLY_LEN,
};
use kura_nbd::tls::server_config_with_clients;
use kura_nbd::{
    bind_loopback, bind_unix, connect, serve, serve_tls, serve_unix, Export, ServeOptions,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::Command as Process;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn serve_on_loopback(exports: Vec<Export>, opts: ServeOptions) -> kura_nbd::Server {
    serve(bind_loopback(0).expect("bind"), exports, opts).expect("serve")
}

/// `NBD_OPT_GO` asking for nothing but the export: the client does not agree to block sizes.
fn go_without_block_sizes(r: &mut Raw, name: &str) {
    let req = InfoRequest {
        name: name.into(),
        requests: vec![],
    };
    r.option(Opt::Go, &req.encode());
    loop {
        let (h, data) = r.option_reply().expect("GO reply");
        match h.reply {
            Rep::Info => {}
            Rep::Ack => return,
            other => panic!("GO failed: {other} {}", String::from_utf8_lossy(&data)),
        }
    }
}

/// Tries a full handshake and one read until it works or `limit` passes; how long it took.
fn first_successful_read(addr: SocketAddr, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let attempt = (|| -> std::io::Result<()> {
            let s = TcpStream::connect(addr)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut r = Raw { s };
            let mut g = [0u8; protocol::GREETING_LEN];
            r.s.read_exact(&mut g)?;
            r.send(
                &(protocol::client_flags::FIXED_NEWSTYLE | protocol::client_flags::NO_ZEROES)
                    .to_be_bytes(),
            )?;
            r.send(
                &protocol::encode_option(
                    Opt::Go,
                    &InfoRequest {
                        name: String::new(),
                        requests: vec![],
                    }
                    .encode(),
                )
                .expect("edges test"),
            )?;
            loop {
                let (h, _) = r.option_reply()?;
                match h.reply {
                    Rep::Info => {}
                    Rep::Ack => break,
                    _ => return Err(std::io::ErrorKind::Other.into()),
                }
            }
            r.request(Command::Read, 0, 1, 0, 4096);
            let reply = r.reply()?;
            assert_eq!(reply.error, 0);
            let mut data = vec![0u8; 4096];
            r.s.read_exact(&mut data)
        })();
        if attempt.is_ok() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "no client got in within {limit:?}: {attempt:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn slow_loris_handshakes_and_idle_clients_do_not_starve_a_new_client() {
    let (dev, _) = mem_disk(MIB);
    let opts = ServeOptions {
        max_clients: 4,
        // The per-read timeout alone would never fire: the slow clients send a byte every 100 ms.
        handshake_timeout: Duration::from_secs(600),
        handshake_deadline: Duration::from_millis(800),
        idle_timeout: Some(Duration::from_millis(800)),
        ..ServeOptions::default()
    };
    let server = serve_on_loopback(vec![Export::new("", dev)], opts);
    let addr = server.local_addr();
    // Two slow-loris clients: greet, then trickle an option header one byte at a time.
    let mut trickles = Vec::new();
    for _ in 0..2 {
        let mut r = Raw::connect(addr);
        r.greet();
        trickles.push(thread::spawn(move || {
            let bytes = protocol::encode_option(Opt::List, &[]).expect("edges test");
            let start = Instant::now();
            for b in bytes.iter().cycle() {
                // Ends when the server cuts it (or, failing that, after a minute).
                if start.elapsed() > Duration::from_secs(60) || r.send(&[*b]).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
            // How long the server let this client hold its slot.
            start.elapsed()
        }));
    }
    // Two idle clients: a full handshake, then nothing.
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut r = Raw::connect(addr);
        r.greet();
        go_without_block_sizes(&mut r, "");
        idle.push(r);
    }
    // Every slot is taken now; a new client must still get in once the others are cut.
    let waited = first_successful_read(addr, Duration::from_secs(60));
    for r in &mut idle {
        assert!(r.closed(), "an idle client is closed");
    }
    let held: Vec<Duration> = trickles
        .into_iter()
        .map(|t| t.join().expect("edges test"))
        .collect();
    // Both slow clients have been cut and both idle ones closed, so both counts are final.
    let stats = server.stats();
    println!(
        "new client served after {waited:?}; slow-loris clients held their slots {held:?}; \
         stats {stats:?}"
    );
    assert!(stats.handshake_timeouts >= 2, "{stats:?}");
    assert!(stats.idle_closed >= 2, "{stats:?}");
    for h in held {
        assert!(
            h < Duration::from_secs(30),
            "a trickling client was cut: {h:?}"
        );
    }
    server.stop();
}

#[test]
fn one_peer_address_cannot_take_every_slot() {
    let (dev, _) = mem_disk(MIB);
    let opts = ServeOptions {
        max_per_peer: 2,
        ..ServeOptions::default()
    };
    let server = serve_on_loopback(vec![Export::new("", dev)], opts);
    let addr = server.local_addr();
    let (a, _) = Raw::open(addr, "");
    let (_b, _) = Raw::open(addr, "");
    // The third from 127.0.0.1 is closed at accept, before any greeting.
    let mut third = Raw::connect(addr);
    assert!(
        third.closed(),
        "a third connection from one address is refused"
    );
    assert_eq!(server.stats().refused, 1);
    // Once one closes, the address may connect again (the slot frees when its thread ends).
    drop(a);
    let start = Instant::now();
    loop {
        let mut r = Raw::connect(addr);
        let mut g = [0u8; protocol::GREETING_LEN];
        if r.s.read_exact(&mut g).is_ok() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "slot never freed"
        );
        thread::sleep(Duration::from_millis(20));
    }
    server.stop();
}

#[test]
fn one_clients_byte_writes_do_not_stall_anothers_reads() {
    let (dev, storage) = mem_disk(64 * MIB);
    let opts = ServeOptions {
        device_min_block_size: true,
        ..ServeOptions::default()
    };
    let server = serve_on_loopback(vec![Export::new("disk", dev)], opts);
    let addr = server.local_addr();
    // What a client that asks for the block sizes is told, and held to.
    let info = kura_nbd::export_info(addr, "disk").expect("edges test");
    assert_eq!(
        info.block_sizes.expect("edges test").min,
        4096,
        "minimum = device block"
    );
    let (mut strict, _) = Raw::open(addr, "disk"); // asks for NBD_INFO_BLOCK_SIZE
    strict.request(Command::Write, 0, 1, 10, 1);
    strict.send(&[7]).expect("edges test");
    assert_eq!(
        strict.reply().expect("edges test").error,
        22,
        "EINVAL for a 1-byte write"
    );
    assert_eq!(
        strict.simple(Command::Read, 0, 1, 1),
        22,
        "EINVAL for a 1-byte read"
    );
    strict.write_at(0, &[9u8; 4096], 0); // aligned still works on the same connection

    // Read latency of the other client alone, for the record.
    let mut reader = connect(addr, "disk").expect("edges test");
    let mut buf = vec![0u8; 64 << 10];
    let mut alone = Vec::new();
    for i in 0..500u64 {
        let t = Instant::now();
        reader
            .read_blocks(i * 16 % 2048, &mut buf)
            .expect("edges test");
        alone.push(t.elapsed());
    }
    alone.sort();

    // A client that did not agree: 1-byte writes, pipelined, served by read-modify-write.
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut r = Raw::connect(addr);
            r.greet();
            go_without_block_sizes(&mut r, "disk");
            let mut written = 0u64;
            let mut wire = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                wire.clear();
                for i in 0..32u64 {
                    let off = 8 * MIB + (written + i) * 4099 % (32 * MIB);
                    let h = RequestHeader {
                        flags: 0,
                        command: Command::Write,
                        cookie: written + i,
                        offset: off,
                        length: 1,
                    };
                    wire.extend_from_slice(&h.encode());
                    wire.push((written + i) as u8 | 1);
                }
                r.send(&wire).expect("edges test");
                for _ in 0..32 {
                    let mut h = [0u8; SIMPLE_REPLY_LEN];
                    r.s.read_exact(&mut h).expect("edges test");
                    let reply = protocol::SimpleReply::decode(&h).expect("edges test");
                    assert_eq!(reply.error, 0);
                }
                written += 32;
            }
            written
        })
    };
    // Meanwhile the other client reads aligned 64 KiB blocks of the first 8 MiB.
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) || lat.len() < 200 {
        let lba = (lat.len() as u64 * 16) % 2048;
        let t = Instant::now();
        reader.read_blocks(lba, &mut buf).expect("edges test");
        lat.push(t.elapsed());
    }
    stop.store(true, Ordering::SeqCst);
    let written = hammer.join().expect("edges test");
    lat.sort();
    let p50 = lat[lat.len() / 2];
    let p99 = lat[lat.len() * 99 / 100];
    let max = *lat.last().expect("edges test");
    println!(
        "64 KiB reads alone: p50 {:?}, max {:?}; {} reads during {written} one-byte writes: \
         p50 {p50:?}, p99 {p99:?}, max {max:?}",
        alone[alone.len() / 2],
        alone[alone.len() - 1],
        lat.len()
    );
    assert!(written > 0, "the byte writer made progress");
    assert!(max < Duration::from_secs(5), "a read stalled for {max:?}");
    // The byte writes landed where they were sent.
    let disk = storage.lock().expect("edges test");
    for i in [0, written / 2, written - 1] {
        let off = (8 * MIB + i * 4099 % (32 * MIB)) as usize;
        assert_eq!(disk[off], i as u8 | 1, "byte write {i}");
    }
    drop(disk);
    server.stop();
}

#[test]
fn reads_never_return_bytes_another_request_left_in_a_pool_buffer() {
    let secret = b"SECRET-kura-edge-test\n";
    let null = kura_engine::open("null:64M").expect("null device");
    let (mem, _) = mem_disk(64 * MIB);
    let server = serve_on_loopback(
        vec![Export::new("a", null), Export::new("b", mem)],
        ServeOptions::default(),
    );
    let addr = server.local_addr();
    let block: Vec<u8> = secret.iter().cycle().take(MIB as usize).copied().collect();
    let mut b = connect(addr, "b").expect("edges test");
    let mut a = connect(addr, "a").expect("edges test");
    let (mut raw_a, _) = Raw::open(addr, "a");
    let mut back = vec![0xAAu8; MIB as usize];
    for round in 0..24u64 {
        // Fill pool buffers with the secret: writes through b, and reads of it back.
        for i in 0..8 {
            b.write_blocks((round * 8 + i) % 16 * 256, &block)
                .expect("edges test");
        }
        b.read_blocks(round % 16 * 256, &mut back)
            .expect("edges test");
        assert_eq!(back, block);
        // Then a: big reads, small reads, unaligned reads: all zeroes.
        back.fill(0xAA);
        a.read_blocks(round * 256, &mut back).expect("edges test");
        assert!(
            back.iter().all(|&x| x == 0),
            "round {round}: a 1 MiB read of null: leaked"
        );
        let off = round * 7919 + 3;
        let data = raw_a.read_at(off, 4096 + 17);
        assert!(
            data.iter().all(|&x| x == 0),
            "round {round}: unaligned read leaked"
        );
        // An error reply carries no payload: the next reply on the stream still parses.
        assert_eq!(raw_a.simple(Command::Read, 0, 64 * MIB, 4096), 22);
    }
    let a_stats = server.stats();
    assert_eq!(a_stats.protocol_errors, 0);
    server.stop();
}

#[test]
fn unix_socket_is_private_and_never_clobbers_a_file() {
    let dir = tempfile::tempdir().expect("edges test");
    let path = dir.path().join("nbd.sock");
    // A regular file in the way is refused and left as it was.
    std::fs::write(&path, b"precious").expect("edges test");
    let err = bind_unix(&path).unwrap_err();
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&path).expect("edges test"), b"precious");
    std::fs::remove_file(&path).expect("edges test");

    let (dev, storage) = mem_disk(4 * MIB);
    let listener = bind_unix(&path).expect("edges test");
    let meta = std::fs::symlink_metadata(&path).expect("edges test");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "created 0600");
    let server = serve_unix(
        listener,
        &path,
        vec![Export::new("disk", dev)],
        ServeOptions::default(),
    )
    .expect("edges test");
    assert_eq!(server.unix_path(), Some(path.as_path()));
    // A second server on the same live socket is refused.
    assert!(bind_unix(&path).is_err(), "a live socket is not replaced");

    // A raw client over the socket.
    let mut s = std::os::unix::net::UnixStream::connect(&path).expect("edges test");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("edges test");
    let mut g = [0u8; protocol::GREETING_LEN];
    s.read_exact(&mut g).expect("edges test");
    s.write_all(&protocol::client_flags::FIXED_NEWSTYLE.to_be_bytes())
        .expect("edges test");
    s.write_all(&protocol::encode_option(Opt::ExportName, b"disk").expect("edges test"))
        .expect("edges test");
    let mut reply = [0u8; 8 + 2 + 124];
    s.read_exact(&mut reply).expect("edges test");
    let data = pattern(4096, 3);
    let h = RequestHeader {
        flags: cmd_flags::FUA,
        command: Command::Write,
        cookie: 5,
        offset: 4096,
        length: 4096,
    };
    s.write_all(&h.encode()).expect("edges test");
    s.write_all(&data).expect("edges test");
    let mut r = [0u8; SIMPLE_REPLY_LEN];
    s.read_exact(&mut r).expect("edges test");
    assert_eq!(
        protocol::SimpleReply::decode(&r).expect("edges test").error,
        0
    );
    assert_eq!(&storage.lock().expect("edges test")[4096..8192], &data[..]);
    drop(s);

    // nbdinfo over the socket, when installed.
    if let Some(nbdinfo) = tool("nbdinfo") {
        let uri = format!("nbd+unix:///disk?socket={}", path.display());
        let out = Process::new(nbdinfo)
            .args(["--json", &uri])
            .output()
            .expect("edges test");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "nbdinfo over the Unix socket: {stderr}"
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("edges test");
        assert_eq!(json["exports"][0]["export-size"], 4 * MIB, "{json}");
    } else {
        kura_testkit::skip(
            "unix_socket_is_private_and_never_clobbers_a_file (nbdinfo part)",
            "nbdinfo",
            "nbdinfo is not installed (apt-get install libnbd-bin)",
        );
    }
    server.stop();
    assert!(!path.exists(), "the socket file is removed at stop");
}

/// A CA, a server certificate for localhost signed by it, a client certificate signed by it,
/// and a client certificate signed by another CA, as PEM files in libnbd's layout.
struct Pki {
    dir: tempfile::TempDir,
}

fn ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().expect("edges test");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("edges test");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    (params.self_signed(&key).expect("edges test"), key)
}

fn leaf(
    names: &[&str],
    client: bool,
    issuer: &(rcgen::Certificate, rcgen::KeyPair),
) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("edges test");
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("edges test");
    params.extended_key_usages = vec![if client {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    }];
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, names[0]);
    let cert = params
        .signed_by(&key, &issuer.0, &issuer.1)
        .expect("edges test");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("edges test");
        let root = ca("kura test CA");
        let other = ca("some other CA");
        let write = |rel: &str, text: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("edges test")).expect("edges test");
            std::fs::write(p, text).expect("edges test");
        };
        let (cert, key) = leaf(&["localhost", "127.0.0.1"], false, &root);
        write("server/server-cert.pem", &cert);
        write("server/server-key.pem", &key);
        write("server/ca-cert.pem", &root.0.pem());
        // A client with a certificate from the right CA.
        let (cert, key) = leaf(&["good client"], true, &root);
        write("good/ca-cert.pem", &root.0.pem());
        write("good/client-cert.pem", &cert);
        write("good/client-key.pem", &key);
        // A client with no certificate at all.
        write("none/ca-cert.pem", &root.0.pem());
        // A client whose certificate another CA signed.
        let (cert, key) = leaf(&["stranger"], true, &other);
        write("stranger/ca-cert.pem", &root.0.pem());
        write("stranger/client-cert.pem", &cert);
        write("stranger/client-key.pem", &key);
        Pki { dir }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }
}

#[test]
fn mutual_tls_refuses_clients_without_a_trusted_certificate() {
    let pki = Pki::new();
    let config = server_config_with_clients(
        &pki.path("server/server-cert.pem"),
        &pki.path("server/server-key.pem"),
        Some(&pki.path("server/ca-cert.pem")),
    )
    .expect("edges test");
    let (dev, _) = mem_disk(4 * MIB);
    let server = serve_tls(
        bind_loopback(0).expect("edges test"),
        vec![Export::new("secret-export-name", dev)],
        ServeOptions::default(),
        config,
    )
    .expect("edges test");
    let port = server.local_addr().port();

    // The kura client has no client certificate: refused in the TLS handshake.
    let tls = kura_nbd::tls::ClientTls::new(&pki.path("none/ca-cert.pem"), "localhost")
        .expect("edges test");
    let refused = kura_nbd::connect_with(
        server.local_addr(),
        "secret-export-name",
        kura_nbd::ConnectOptions {
            tls: Some(tls),
            ..kura_nbd::ConnectOptions::default()
        },
    );
    assert!(
        refused.is_err(),
        "a client without a certificate is refused"
    );
    // With the right certificate the kura client reads and writes.
    let with_cert = |who: &str| {
        let tls = kura_nbd::tls::ClientTls::with_client_cert(
            &pki.path(&format!("{who}/ca-cert.pem")),
            "localhost",
            &pki.path(&format!("{who}/client-cert.pem")),
            &pki.path(&format!("{who}/client-key.pem")),
        )
        .expect("client TLS with a certificate");
        kura_nbd::connect_with(
            server.local_addr(),
            "secret-export-name",
            kura_nbd::ConnectOptions {
                tls: Some(tls),
                ..kura_nbd::ConnectOptions::default()
            },
        )
    };
    let mut c = with_cert("good").expect("a client with a good certificate connects");
    let data = pattern(8192, 5);
    c.write_blocks(3, &data).expect("write over mutual TLS");
    let mut back = vec![0u8; 8192];
    c.read_blocks(3, &mut back).expect("read over mutual TLS");
    assert_eq!(back, data);
    c.close().expect("close");
    assert!(
        with_cert("stranger").is_err(),
        "a certificate from another CA is refused"
    );
    // The same through `remote:` specs: cert= and key= present the client certificate.
    let remote = |who: &str, identity: bool| {
        let dir = pki.path(who);
        let mut text = format!(
            "remote:localhost:{port}/secret-export-name?tls=1&ca={}/ca-cert.pem&reconnect=0",
            dir.display()
        );
        if identity {
            text += &format!(
                "&cert={0}/client-cert.pem&key={0}/client-key.pem",
                dir.display()
            );
        }
        kura_nbd::remote::open(&kura_engine::Spec::parse(&text).expect("spec"))
    };
    let mut drive = remote("good", true).expect("remote: with a client certificate");
    drive
        .read_blocks(3, &mut back)
        .expect("read through remote:");
    assert_eq!(back, data);
    drop(drive);
    assert!(
        remote("good", false).is_err(),
        "remote: without cert= is refused"
    );
    assert!(
        remote("stranger", true).is_err(),
        "remote: with a stranger's certificate"
    );

    let Some(nbdinfo) = tool("nbdinfo") else {
        kura_testkit::skip(
            "mutual_tls_refuses_clients_without_a_trusted_certificate (nbdinfo part)",
            "nbdinfo",
            "nbdinfo is not installed (apt-get install libnbd-bin)",
        );
        server.stop();
        return;
    };
    let list = |who: &str| {
        let uri = format!(
            "nbds://localhost:{port}/?tls-certificates={}",
            pki.path(who).display()
        );
        Process::new(&nbdinfo)
            .args(["--list", "--json", &uri])
            .output()
            .expect("edges test")
    };
    let good = list("good");
    let stderr = String::from_utf8_lossy(&good.stderr);
    assert!(
        good.status.success(),
        "a client with a good certificate: {stderr}"
    );
    let text = String::from_utf8_lossy(&good.stdout);
    assert!(text.contains("secret-export-name"), "{text}");
    for who in ["none", "stranger"] {
        let out = list(who);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{who}: refused, but: {all}");
        assert!(
            !all.contains("secret-export-name"),
            "{who} learned an export name: {all}"
        );
        println!("{who}: {}", all.trim());
    }
    server.stop();
}

#[test]
fn a_client_stalling_inside_the_tls_handshake_is_cut_at_the_deadline() {
    let pki = Pki::new();
    let config = server_config_with_clients(
        &pki.path("server/server-cert.pem"),
        &pki.path("server/server-key.pem"),
        None,
    )
    .expect("server TLS config");
    let (dev, _) = mem_disk(MIB);
    let opts = ServeOptions {
        handshake_timeout: Duration::from_secs(600),
        handshake_deadline: Duration::from_millis(500),
        ..ServeOptions::default()
    };
    let server = serve_tls(
        bind_loopback(0).expect("bind"),
        vec![Export::new("", dev)],
        opts,
        config,
    )
    .expect("serve");
    let mut r = Raw::connect(server.local_addr());
    r.s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    r.greet();
    r.option(Opt::StartTls, &[]);
    let (h, _) = r.option_reply().expect("STARTTLS reply");
    assert_eq!(h.reply, Rep::Ack);
    // Now the server waits for a TLS ClientHello that never comes.
    let start = Instant::now();
    assert!(r.closed(), "the stalled TLS handshake is cut");
    let waited = start.elapsed();
    println!("stalled TLS handshake cut after {waited:?}");
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    assert_eq!(server.stats().handshake_timeouts, 1);
    server.stop();
}
