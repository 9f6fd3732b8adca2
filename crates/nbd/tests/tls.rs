//! NBD over TLS (`NBD_OPT_STARTTLS`): kura client ↔ kura server with certificates made by rcgen;
//! a plaintext client refused with `NBD_REP_ERR_TLS_REQD`; a client that trusts another CA
//! refused; malformed STARTTLS sequences answered or cut without harm to other clients; and
//! nbdinfo (libnbd, GnuTLS) reading the export over `nbds://` when it can.

mod common;

use common::{mem_disk, pattern, tool, Raw};
use kura_engine::{BlockDevice, BlockingIo};
use kura_nbd::client::{connect, connect_with, list_exports, ClientError, ConnectOptions};
use kura_nbd::protocol::{Opt, Rep};
use kura_nbd::tls::{server_config, ClientTls};
use kura_nbd::{bind_loopback, serve_tls, Export, ServeOptions, Server};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA and a server certificate for `localhost` and 127.0.0.1 signed by it, as PEM files.
struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn new() -> Certs {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kura test CA");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let key = rcgen::KeyPair::generate().expect("server key");
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("server params");
        let cert = params.signed_by(&key, &ca, &ca_key).expect("server cert");
        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text).expect("write PEM");
        };
        write("ca-cert.pem", ca.pem());
        write("server-cert.pem", cert.pem());
        write("server-key.pem", key.serialize_pem());
        Certs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn client(&self, host: &str) -> ClientTls {
        ClientTls::new(&self.path("ca-cert.pem"), host).expect("client TLS config")
    }

    fn serve(&self, exports: Vec<Export>) -> Server {
        let config = server_config(&self.path("server-cert.pem"), &self.path("server-key.pem"))
            .expect("server TLS config");
        serve_tls(
            bind_loopback(0).expect("bind"),
            exports,
            ServeOptions::default(),
            config,
        )
        .expect("serve")
    }
}

fn tls_opts(tls: ClientTls) -> ConnectOptions {
    ConnectOptions {
        tls: Some(tls),
        ..ConnectOptions::default()
    }
}

#[test]
fn kura_client_and_server_talk_over_tls() {
    let certs = Certs::new();
    let (disk, storage) = mem_disk(8 << 20);
    let server = certs.serve(vec![Export::new("disk", disk)]);
    let addr = server.local_addr();
    for host in ["localhost", "127.0.0.1"] {
        let mut c = connect_with(addr, "disk", tls_opts(certs.client(host))).unwrap();
        assert_eq!(c.geometry().capacity_bytes(), 8 << 20);
        // Large writes and reads cross many TLS records; several in flight at once.
        let data = pattern(3 << 20, 7);
        c.write_blocks(100, &data).unwrap();
        c.flush_all().unwrap();
        let mut back = vec![0u8; data.len()];
        c.read_blocks(100, &mut back).unwrap();
        assert_eq!(back, data, "read back over TLS ({host})");
        c.close().unwrap();
    }
    let disk = storage.lock().unwrap();
    assert_eq!(
        &disk[100 * 4096..100 * 4096 + 64],
        &pattern(3 << 20, 7)[..64],
        "the bytes reached the export"
    );
    drop(disk);
    let stats = server.stop();
    assert_eq!(stats.len(), 1);
}

#[test]
fn tls_client_matches_the_model_at_depth() {
    let certs = Certs::new();
    let (disk, _) = mem_disk(4 << 20);
    let server = certs.serve(vec![Export::new("", disk)]);
    let mut c = connect_with(server.local_addr(), "", tls_opts(certs.client("localhost")))
        .expect("connect over TLS");
    let bs = 4096usize;
    let mut model = vec![0u8; 4 << 20];
    // Batches of non-overlapping writes in flight together; then every byte read back.
    for round in 0..4u64 {
        let mut taken = std::collections::HashSet::new();
        for i in 0..16u64 {
            let lba = (i * 61 + round * 7) % 1000;
            if !(taken.insert(lba) && taken.insert(lba + 1)) {
                continue;
            }
            let data = pattern(2 * bs, round * 100 + i);
            model[lba as usize * bs..(lba as usize + 2) * bs].copy_from_slice(&data);
            let mut buf = kura_engine::IoBuf::zeroed(2 * bs);
            buf.copy_from_slice(&data);
            c.submit(kura_engine::Request::write(i, lba, 2, buf))
                .unwrap();
        }
        let mut done = Vec::new();
        while c.in_flight() > 0 {
            c.poll(&mut done, 1).unwrap();
        }
        assert!(done.iter().all(|d| d.status.is_ok()));
    }
    let mut image = vec![0u8; 4 << 20];
    c.read_blocks(0, &mut image).unwrap();
    assert!(image == model, "the export holds exactly what was written");
    let mut other =
        connect_with(server.local_addr(), "", tls_opts(certs.client("127.0.0.1"))).unwrap();
    let mut again = vec![0u8; 4 << 20];
    other.read_blocks(0, &mut again).unwrap();
    assert!(again == model, "a second TLS session reads the same bytes");
}

#[test]
fn plaintext_clients_are_refused_when_tls_is_required() {
    let certs = Certs::new();
    let (disk, _) = mem_disk(1 << 20);
    let server = certs.serve(vec![Export::new("disk", disk)]);
    let addr = server.local_addr();
    match connect(addr, "disk") {
        Err(ClientError::Refused {
            reply: Rep::ErrTlsReqd,
            ..
        }) => {}
        other => panic!("plaintext GO got {other:?}"),
    }
    match list_exports(addr) {
        Err(ClientError::Refused {
            reply: Rep::ErrTlsReqd,
            ..
        }) => {}
        other => panic!("plaintext LIST got {other:?}"),
    }
    // A client of a plaintext server that asks for TLS is refused, not downgraded.
    let (disk, _) = mem_disk(1 << 20);
    let plain = common::start(vec![Export::new("disk", disk)]);
    match connect_with(
        plain.local_addr(),
        "disk",
        tls_opts(certs.client("localhost")),
    ) {
        Err(ClientError::TlsRefused {
            reply: Rep::ErrUnsup,
            ..
        }) => {}
        other => panic!("STARTTLS to a plaintext server got {other:?}"),
    }
}

#[test]
fn a_client_trusting_another_ca_or_name_fails_the_handshake() {
    let certs = Certs::new();
    let other = Certs::new();
    let (disk, _) = mem_disk(1 << 20);
    let server = certs.serve(vec![Export::new("disk", disk)]);
    let addr = server.local_addr();
    match connect_with(addr, "disk", tls_opts(other.client("localhost"))) {
        Err(ClientError::TlsHandshake(_)) => {}
        other => panic!("wrong CA got {other:?}"),
    }
    match connect_with(addr, "disk", tls_opts(certs.client("example.com"))) {
        Err(ClientError::TlsHandshake(_)) => {}
        other => panic!("wrong name got {other:?}"),
    }
    // The server keeps serving good clients.
    let c = connect_with(addr, "disk", tls_opts(certs.client("localhost"))).unwrap();
    assert_eq!(c.geometry().capacity_bytes(), 1 << 20);
}

/// True when the server closes the connection, after at most a TLS alert's worth of bytes.
fn closes_after_an_alert(r: &mut Raw) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 64];
    let mut got = 0;
    loop {
        match r.s.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) if got + n <= 64 => got += n,
            Ok(_) => return false,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

fn raw_tls_reqd(addr: SocketAddr) {
    let mut r = Raw::connect(addr);
    r.greet();
    for opt in [Opt::Go, Opt::Info, Opt::List, Opt::StructuredReply] {
        let data = if matches!(opt, Opt::Go | Opt::Info) {
            kura_nbd::protocol::InfoRequest {
                name: "disk".into(),
                requests: vec![],
            }
            .encode()
        } else {
            Vec::new()
        };
        r.option(opt, &data);
        let (h, _) = r.option_reply().expect("an option reply");
        assert_eq!((h.option, h.reply), (opt, Rep::ErrTlsReqd), "{opt}");
    }
    // STARTTLS with data is invalid and changes nothing.
    r.option(Opt::StartTls, b"junk");
    let (h, _) = r.option_reply().expect("an option reply");
    assert_eq!(h.reply, Rep::ErrInvalid);
    // ABORT is allowed before TLS.
    r.option(Opt::Abort, &[]);
    let (h, _) = r.option_reply().expect("an option reply");
    assert_eq!(h.reply, Rep::Ack);
}

#[test]
fn malformed_starttls_sequences_do_not_hurt_the_server() {
    let certs = Certs::new();
    let (disk, _) = mem_disk(1 << 20);
    let server = certs.serve(vec![Export::new("disk", disk)]);
    let addr = server.local_addr();
    raw_tls_reqd(addr);

    // EXPORT_NAME before TLS cannot be refused in-band: the connection is closed.
    let mut r = Raw::connect(addr);
    r.greet();
    r.option(Opt::ExportName, b"disk");
    assert!(
        r.closed(),
        "EXPORT_NAME before STARTTLS closes the connection"
    );

    // STARTTLS acknowledged, then garbage instead of a ClientHello: the connection is closed.
    let mut r = Raw::connect(addr);
    r.greet();
    r.option(Opt::StartTls, &[]);
    let (h, _) = r.option_reply().unwrap();
    assert_eq!((h.option, h.reply), (Opt::StartTls, Rep::Ack));
    r.send(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    r.send(&[0u8; 4096]).unwrap_or(());
    assert!(
        closes_after_an_alert(&mut r),
        "a broken TLS handshake closes the connection"
    );

    // STARTTLS acknowledged, then the client vanishes.
    let mut r = Raw::connect(addr);
    r.greet();
    r.option(Opt::StartTls, &[]);
    let _ = r.option_reply().unwrap();
    drop(r);

    // STARTTLS a second time over TLS is invalid; the session goes on.
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut raw = Raw { s };
    raw.greet();
    raw.option(Opt::StartTls, &[]);
    assert_eq!(raw.option_reply().unwrap().0.reply, Rep::Ack);
    let tls = certs.client("localhost");
    let conn = rustls::ClientConnection::new(tls.config.clone(), tls.server_name.clone()).unwrap();
    let mut ts = rustls::StreamOwned::new(conn, raw.s);
    use std::io::{Read, Write};
    ts.write_all(&kura_nbd::protocol::encode_option(Opt::StartTls, &[]).unwrap())
        .unwrap();
    ts.flush().unwrap();
    let mut head = [0u8; kura_nbd::protocol::OPTION_REPLY_HEADER_LEN];
    ts.read_exact(&mut head).unwrap();
    let h = kura_nbd::protocol::decode_option_reply_header(&head).unwrap();
    assert_eq!((h.option, h.reply), (Opt::StartTls, Rep::ErrInvalid));
    let mut msg = vec![0u8; h.length as usize];
    ts.read_exact(&mut msg).unwrap();
    ts.write_all(&kura_nbd::protocol::encode_option(Opt::List, &[]).unwrap())
        .unwrap();
    ts.flush().unwrap();
    ts.read_exact(&mut head).unwrap();
    let h = kura_nbd::protocol::decode_option_reply_header(&head).unwrap();
    assert_eq!(
        h.reply,
        Rep::Server,
        "options work over TLS after the refusal"
    );

    // Other clients were never affected.
    let mut c = connect_with(addr, "disk", tls_opts(certs.client("localhost"))).unwrap();
    c.write_blocks(0, &pattern(4096, 1)).unwrap();
    let mut back = vec![0u8; 4096];
    c.read_blocks(0, &mut back).unwrap();
    assert_eq!(back, pattern(4096, 1));
}

#[test]
fn bad_tls_material_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    assert!(matches!(
        server_config(&empty, &empty),
        Err(kura_nbd::tls::TlsError::Empty { .. })
    ));
    assert!(matches!(
        ClientTls::new(Path::new("/nonexistent/ca.pem"), "localhost"),
        Err(kura_nbd::tls::TlsError::Pem { .. })
    ));
    let certs = Certs::new();
    assert!(matches!(
        ClientTls::new(&certs.path("ca-cert.pem"), "bad name!"),
        Err(kura_nbd::tls::TlsError::ServerName(_))
    ));
}

#[test]
fn nbdinfo_reads_the_export_over_tls() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return kura_testkit::skip(
            "nbdinfo_reads_the_export_over_tls",
            "nbdinfo",
            "nbdinfo is not on PATH (apt-get install libnbd-bin)",
        );
    };
    let certs = Certs::new();
    let (disk, _) = mem_disk(3 << 20);
    let server = certs.serve(vec![Export::new("disk", disk)]);
    let port = server.local_addr().port();
    // libnbd takes a directory holding ca-cert.pem.
    let uri = format!(
        "nbds://localhost:{port}/disk?tls-certificates={}",
        certs.dir.path().display()
    );
    let out = Command::new(&nbdinfo)
        .args(["--json", &uri])
        .output()
        .expect("run nbdinfo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success()
        && (stderr.contains("not compiled with TLS") || stderr.contains("local file access"))
    {
        return kura_testkit::skip(
            "nbdinfo_reads_the_export_over_tls",
            "nbdinfo-tls",
            &format!("this nbdinfo cannot use TLS certificates from a URI: {stderr}"),
        );
    }
    assert!(out.status.success(), "nbdinfo over TLS failed: {stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
    let export = &json["exports"][0];
    assert_eq!(export["export-size"], 3 << 20, "{json}");
    assert_eq!(json["TLS"], true, "{json}");

    // nbdcopy copies an image in and back out over TLS byte for byte.
    if let Some(nbdcopy) = tool("nbdcopy") {
        let image = pattern(3 << 20, 11);
        let src = certs.path("in.img");
        let back = certs.path("out.img");
        std::fs::write(&src, &image).expect("write image");
        let copy = |from: &str, to: &str| {
            let out = Command::new(&nbdcopy)
                .args([from, to])
                .output()
                .expect("run nbdcopy");
            assert!(
                out.status.success(),
                "nbdcopy {from} {to}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        copy(src.to_str().expect("utf8"), &uri);
        copy(&uri, back.to_str().expect("utf8"));
        assert!(
            std::fs::read(&back).expect("read copy") == image,
            "nbdcopy round trip over TLS changed the bytes"
        );
    } else {
        kura_testkit::skip(
            "nbdinfo_reads_the_export_over_tls (the nbdcopy copy in and out)",
            "nbdcopy",
            "nbdcopy is not on PATH (apt-get install libnbd-bin)",
        );
    }

    // Without TLS, nbdinfo is refused.
    let out = Command::new(&nbdinfo)
        .arg(format!("nbd://localhost:{port}/disk"))
        .output()
        .expect("run nbdinfo");
    assert!(!out.status.success(), "plaintext nbdinfo was served");
}
