//! One drive behind two exports of one `kura serve` (`NAME=@OTHER`): a client writes through one
//! export and another client reads it through the other, both connected at once over host
//! sockets; limits set through the control socket apply to one door only; sharing mistakes are
//! refused with the reason.

mod common;

use common::{fails, ok, Serving};
use kura_engine::{BlockDevice, BlockingIo};

#[test]
fn a_write_through_one_export_reads_back_through_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    let ctl = dir.path().join("ctl.sock");
    let ctl_s = ctl.to_str().unwrap();
    let disk = format!("disk=file:{}?size=16M", img.display());
    let server = Serving::start(&[
        &disk,
        "again=@disk",
        "golden=@disk:ro",
        "--listen",
        "127.0.0.1:0",
        "--ctl",
        ctl_s,
    ]);
    let addr = server.addr();
    let connect = |name: &str| kura_nbd::open::open_address(&format!("{addr}/{name}")).unwrap();
    let (mut disk, mut again, mut golden) = (connect("disk"), connect("again"), connect("golden"));
    assert_eq!(again.geometry().capacity_bytes(), 16 << 20);
    let bs = disk.geometry().block_size as usize;
    let through = |from: &mut dyn BlockDevice, to: &mut dyn BlockDevice, i: usize| {
        let data: Vec<u8> = (0..8 * bs).map(|b| (b * 7 + i * 13) as u8).collect();
        let lba = 64 + 100 * i as u64;
        from.write_blocks(lba, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        to.read_blocks(lba, &mut back).unwrap();
        assert_eq!(
            back, data,
            "written through one export, read through the other"
        );
    };
    through(&mut disk, &mut again, 0);
    through(&mut again, &mut disk, 1);
    let mut back = vec![0u8; bs];
    golden.read_blocks(64, &mut back).unwrap();
    assert_eq!(back[1], 7);
    assert!(
        golden.write_blocks(0, &back).is_err(),
        "a :ro sharer refuses writes"
    );

    // Limits belong to each export, not to the drive.
    ok(&[
        "serve",
        "ctl",
        "--socket",
        ctl_s,
        "set",
        "again",
        "read_iops=50",
    ]);
    let shown = ok(&["serve", "ctl", "--socket", ctl_s, "show"]);
    assert!(shown.contains("again read_iops=50 "), "{shown}");
    assert!(shown.contains(" kind=nbd drive=disk"), "{shown}");
    assert!(shown.contains("disk read_iops=off "), "{shown}");
    fails(
        &[
            "serve", "ctl", "--socket", ctl_s, "resize", "disk", "--size", "32M",
        ],
        "shares its drive",
    );
    disk.flush_all().unwrap();
    drop((disk, again, golden));
    assert!(server.stop().success());
    // The flushed writes are in the image.
    let image = std::fs::read(&img).unwrap();
    assert_eq!(image[64 * bs + 1], 7);
}

#[test]
fn sharing_mistakes_are_refused() {
    fails(&["serve", "a=mem:1M", "b=@c"], "no export named `c`");
    fails(&["serve", "a=mem:1M", "a=mem:1M"], "used twice");
    fails(
        &["serve", "a=mem:1M", "b=@a", "c=@b"],
        "itself shares a drive",
    );
    fails(&["serve", "a=mem:1M:ro", "b=@a"], "must be too");
}
