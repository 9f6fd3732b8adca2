//! `kura serve --vhost-user` under the control socket, without a guest: `ctl show` lists the
//! vhost-user export with its kind beside an NBD export sharing its drive, `ctl set` changes its
//! limits, and `ctl resize` grows its image while it serves; a vhost-user frontend connecting
//! afterwards reads the new capacity from the config space (GET_CONFIG), and the NBD sharer
//! cannot be resized (a shared drive).

mod common;

use common::{fails, ok};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

/// The capacity (512-byte sectors) a new vhost-user connection to `socket` is offered.
fn capacity_sectors(socket: &Path) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut f = loop {
        match Frontend::connect(socket, 1) {
            Ok(f) => break f,
            Err(e) if Instant::now() > deadline => panic!("{}: {e}", socket.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    f.set_owner().expect("SET_OWNER");
    let features = f.get_features().expect("GET_FEATURES");
    f.set_features(features).expect("SET_FEATURES");
    f.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
    f.set_protocol_features(VhostUserProtocolFeatures::CONFIG)
        .expect("SET_PROTOCOL_FEATURES");
    let (_, config) = f
        .get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0u8; 8])
        .expect("GET_CONFIG");
    u64::from_le_bytes(config[..8].try_into().expect("8 bytes"))
}

/// Kills the server if the test fails before stopping it.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_vhost_user_export_is_limited_shown_and_resized_through_the_control_socket() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let socket = dir.path().join("v.sock");
    let ctl = dir.path().join("ctl.sock");
    let ctl_s = ctl.to_str().unwrap();
    let server = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ctl",
            ctl_s,
            "--socket",
        ])
        .arg(&socket)
        .arg("--vhost-user")
        .arg(format!("vm=file:{}?size=16M", img.display()))
        .arg("nbdside=@vm:ro")
        .args(["--qos", "vm=write_iops=100"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Killed(server);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ctl.exists() {
        assert!(Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(capacity_sectors(&socket), (16 << 20) / 512);
    let shown = ok(&["serve", "ctl", "--socket", ctl_s, "show"]);
    assert!(shown.contains("kind=vhost-user"), "{shown}");
    assert!(shown.contains("write_iops=100 "), "{shown}");
    assert!(shown.contains("nbdside "), "{shown}");
    assert!(shown.contains("kind=nbd drive=vm"), "{shown}");
    let set = ok(&[
        "serve",
        "ctl",
        "--socket",
        ctl_s,
        "set",
        "vm",
        "write_iops=off",
    ]);
    assert!(set.contains("write_iops=off"), "{set}");
    fails(
        &[
            "serve", "ctl", "--socket", ctl_s, "resize", "vm", "--size", "32M",
        ],
        "shares its drive",
    );
    drop(server);
    // Killed, it left its control socket behind; the next server replaces it.
    std::fs::remove_file(&ctl).unwrap();

    // Alone on its drive, the vhost-user export resizes while it serves.
    let server = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args(["serve", "--ctl", ctl_s, "--socket"])
        .arg(&socket)
        .arg("--vhost-user")
        .arg(format!("vm=file:{}", img.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut server = Killed(server);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ctl.exists() {
        assert!(Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = ok(&[
        "serve", "ctl", "--socket", ctl_s, "resize", "vm", "--size", "32M",
    ]);
    assert!(out.contains("vm size=33554432"), "{out}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 32 << 20);
    assert_eq!(capacity_sectors(&socket), (32 << 20) / 512);
    let shown = ok(&["serve", "ctl", "--socket", ctl_s, "show"]);
    assert!(shown.contains("vm read_iops=off"), "{shown}");
    Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(server.0.wait().unwrap().success());
    assert!(!ctl.exists());
}
