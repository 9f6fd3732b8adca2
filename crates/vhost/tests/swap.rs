//! `DeviceSwapper::swap` on a running export, seen from a vhost-user frontend on the host (no
//! guest): GET_CONFIG reports the new capacity on the connection open during the swap and on the
//! next one, and the device handed back on stop is the new one.

use kura_engine::BlockDevice;
use kura_vhost::{serve, SwapError, VhostOptions};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

/// virtio-blk's capacity field (sectors of 512 bytes) as a new connection is offered it.
fn capacity_sectors(socket: &std::path::Path) -> (Frontend, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    // The listener accepts the next connection only once the last one has been torn down.
    let mut frontend = loop {
        match Frontend::connect(socket, 1) {
            Ok(f) => break f,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("connecting to {}: {e}", socket.display()),
        }
    };
    frontend.set_owner().expect("SET_OWNER");
    let features = frontend.get_features().expect("GET_FEATURES");
    frontend.set_features(features).expect("SET_FEATURES");
    let proto = frontend
        .get_protocol_features()
        .expect("GET_PROTOCOL_FEATURES");
    assert!(proto.contains(VhostUserProtocolFeatures::CONFIG));
    frontend
        .set_protocol_features(VhostUserProtocolFeatures::CONFIG)
        .expect("SET_PROTOCOL_FEATURES");
    let (_, payload) = frontend
        .get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0u8; 8])
        .expect("GET_CONFIG");
    let sectors = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    (frontend, sectors)
}

#[test]
fn a_swapped_device_is_offered_to_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("blk.sock");
    let server = serve(
        &socket,
        kura_engine::open("mem:1M").unwrap(),
        VhostOptions::new("swap"),
    )
    .unwrap();
    let (first, sectors) = capacity_sectors(&socket);
    assert_eq!(sectors, 2048);
    let swapper = server.swapper();
    let size = swapper
        .swap(Box::new(|slot: &mut Box<dyn BlockDevice>| {
            *slot = kura_engine::open("mem:3M").map_err(|e| SwapError {
                message: e.to_string(),
                lost: false,
            })?;
            Ok(())
        }))
        .unwrap();
    assert_eq!(size, 3 << 20);
    // The open connection reads the new capacity when it asks again (nothing tells it to).
    let mut first = first;
    let (_, payload) = first
        .get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0u8; 8])
        .unwrap();
    assert_eq!(u64::from_le_bytes(payload[..8].try_into().unwrap()), 6144);
    drop(first);
    let (second, sectors) = capacity_sectors(&socket);
    assert_eq!(sectors, 6144);
    // A failed swap says why and leaves the device serving.
    let e = swapper
        .swap(Box::new(|_: &mut Box<dyn BlockDevice>| {
            Err(SwapError {
                message: "no".into(),
                lost: false,
            })
        }))
        .unwrap_err();
    assert_eq!(e, "no");
    drop(second);
    let dev = server.stop().unwrap();
    assert_eq!(dev.geometry().capacity_bytes(), 3 << 20);
    assert!(swapper.swap(Box::new(|_| Ok(()))).is_err());
}
