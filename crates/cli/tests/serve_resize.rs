//! Online resize: `kura drive resize` on an image nobody serves, and `kura serve ctl resize` on
//! an export while it serves — nbdinfo sees the new size on its next connection, data written
//! before is still there, and the new tail is writable.

mod common;

use common::{fails, nbdinfo_ok, ok, Serving};
use kura_engine::{BlockDevice, BlockingIo};

fn nbdinfo_size(url: &str) -> u64 {
    nbdinfo_ok(&["--size", url]).trim().parse().expect("a size")
}

#[test]
fn a_served_export_grows_and_clients_see_it_on_reconnect() {
    if let Some(m) = kura_testkit::missing_tool("nbdinfo", "apt-get install libnbd-bin") {
        return m.skip("a_served_export_grows_and_clients_see_it_on_reconnect");
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    let ctl = dir.path().join("ctl.sock");
    let ctl_s = ctl.to_str().unwrap();
    let export = format!("disk=file:{}?size=16M", img.display());
    let server = Serving::start(&[&export, "--listen", "127.0.0.1:0", "--ctl", ctl_s]);
    let url = format!("{}/disk", server.url);
    assert_eq!(nbdinfo_size(&url), 16 << 20);
    let addr = format!("{}/disk", server.addr());
    let mut before = kura_nbd::open::open_address(&addr).unwrap();
    let data = vec![0x5au8; 4096];
    before.write_blocks(100, &data).unwrap();
    before.flush_all().unwrap();

    let out = ok(&[
        "serve", "ctl", "--socket", ctl_s, "resize", "disk", "--size", "48M",
    ]);
    assert!(out.contains("disk size=50331648"), "{out}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 48 << 20);
    assert_eq!(nbdinfo_size(&url), 48 << 20);
    // The connection from before keeps working at the size it was told.
    let mut back = vec![0u8; 4096];
    before.read_blocks(100, &mut back).unwrap();
    assert_eq!(back, data);
    let mut after = kura_nbd::open::open_address(&addr).unwrap();
    assert_eq!(after.geometry().capacity_bytes(), 48 << 20);
    after.write_blocks((40 << 20) / 4096, &data).unwrap();
    after.read_blocks((40 << 20) / 4096, &mut back).unwrap();
    assert_eq!(back, data);
    after.flush_all().unwrap();
    drop((before, after));

    // Shrinking below the data written at 40 MiB is refused, and the export keeps serving.
    fails(
        &[
            "serve", "ctl", "--socket", ctl_s, "resize", "disk", "--size", "32M",
        ],
        "holds data past the new end",
    );
    assert_eq!(nbdinfo_size(&url), 48 << 20);
    // An image a server holds cannot be resized from outside it.
    fails(
        &[
            "drive",
            "resize",
            &format!("file:{}", img.display()),
            "--size",
            "64M",
        ],
        "kura serve ctl resize",
    );
    assert!(server.stop().success());

    // Not served: kura drive resize shrinks past the data only with --force.
    let spec = format!("file:{}", img.display());
    fails(
        &["drive", "resize", &spec, "--size", "32M"],
        "holds data past the new end",
    );
    let out = common::ok_text(&["drive", "resize", &spec, "--size", "32M", "--force"]);
    assert!(out.contains("warning: --force cut"), "{out}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 32 << 20);
    fails(
        &["drive", "resize", "mem:1M", "--size", "2M"],
        "only image files",
    );
}

#[test]
fn an_image_under_a_cache_grows_while_served_and_offline() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("c.img");
    let ctl = dir.path().join("ctl.sock");
    let ctl_s = ctl.to_str().unwrap();
    let export = format!("disk=cache(file:{}?size=16M)?mode=wb", img.display());
    let server = Serving::start(&[&export, "--listen", "127.0.0.1:0", "--ctl", ctl_s]);
    let addr = format!("{}/disk", server.addr());
    let data = vec![0xc3u8; 4096];
    let mut before = kura_nbd::open::open_address(&addr).unwrap();
    // Written back from the cache by the flush that comes before the resize.
    before.write_blocks(7, &data).unwrap();
    let out = ok(&[
        "serve", "ctl", "--socket", ctl_s, "resize", "disk", "--size", "24M",
    ]);
    assert!(out.contains("disk size=25165824"), "{out}");
    let mut after = kura_nbd::open::open_address(&addr).unwrap();
    assert_eq!(after.geometry().capacity_bytes(), 24 << 20);
    let mut back = vec![0u8; 4096];
    after.read_blocks(7, &mut back).unwrap();
    assert_eq!(back, data);
    drop((before, after));
    assert!(server.stop().success());
    let spec = format!("throttle(cache(file:{}))", img.display());
    ok(&["drive", "resize", &spec, "--size", "32M"]);
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 32 << 20);
    fails(
        &[
            "drive",
            "resize",
            &format!("stripe(file:{0},file:{0})", img.display()),
            "--size",
            "64M",
        ],
        "combines its 2 children",
    );
}
