//! `kura serve --tls-cert/--tls-key` with `remote:...?tls=1&ca=...` and `spill(...)` specs from
//! the command line: a pattern written through TLS verifies after reopening; a plaintext client
//! is refused. Certificates come from the `openssl` command (skipped visibly, through
//! `kura_testkit::skip`, only when it is not installed).

mod common;

use common::{kura, ok_text};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A CA and a server certificate for localhost/127.0.0.1 made with `openssl`; false if it fails.
fn make_certs(dir: &Path) -> bool {
    let run = |args: &[&str]| {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n\
         extendedKeyUsage=serverAuth\n",
    )
    .expect("write ext.cnf");
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
        "-days",
        "2",
        "-subj",
        "/CN=kura test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]) && run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server-key.pem",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]) && run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-out",
        "server-cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ])
}

struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn remote_and_spill_specs_work_over_tls_from_the_command_line() {
    if let Some(m) = kura_testkit::missing_tool("openssl", "apt-get install openssl") {
        return m.skip("remote_and_spill_specs_work_over_tls_from_the_command_line");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(
        make_certs(dir.path()),
        "openssl is installed but could not make the test certificates"
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--tls-cert",
            &p("server-cert.pem"),
            "--tls-key",
            &p("server-key.pem"),
            "disk=mem:16M",
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("start kura serve");
    let _server = Serving(child);
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "kura serve did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let remote = format!("remote:localhost:{port}/disk?tls=1&ca={}", p("ca-cert.pem"));
    ok_text(&["dev", "write", &remote, "--pattern", "5", "--blocks", "512"]);
    let text = ok_text(&["dev", "verify", &remote, "--seed", "5", "--blocks", "512"]);
    assert!(text.contains("all hold pattern 5"), "{text}");

    // Plaintext is refused, with the reason.
    let out = kura(&["dev", "info", &format!("remote:127.0.0.1:{port}/disk")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS"), "{err}");

    // spill: 1 MiB of local file in front of the 16 MiB TLS export; reopened for the verify.
    let spill = format!("spill(file:{}?size=1M,{remote})?chunk=64K", p("near.img"));
    ok_text(&[
        "dev",
        "write",
        &spill,
        "--pattern",
        "9",
        "--lba",
        "1000",
        "--blocks",
        "700",
    ]);
    let text = ok_text(&[
        "dev", "verify", &spill, "--seed", "9", "--lba", "1000", "--blocks", "700",
    ]);
    assert!(text.contains("all hold pattern 9"), "{text}");
    let text = ok_text(&["dev", "verify", &remote, "--seed", "5", "--blocks", "512"]);
    assert!(
        text.contains("all hold pattern 5"),
        "untouched range still intact: {text}"
    );
}
