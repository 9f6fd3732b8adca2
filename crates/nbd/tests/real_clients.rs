//! The server with real NBD clients (Debian `libnbd-bin` and `qemu-utils`): `nbdinfo` lists the
//! exports with the right size and flags; `nbdcopy` and `qemu-img convert` copy an image in and
//! out byte-identically; and the kura client drives a foreign server (`nbdkit`) as a device.
//! Each test skips visibly (`kura_testkit::skip`) when its tool is not installed.

mod common;

use common::{have_tools, mem_disk, pattern, run_bounded, run_ok, start};
use kura_engine::{BlockDevice, BlockingIo, Completion, IoBuf, Request};
use kura_nbd::client::connect;
use kura_nbd::Export;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn same_file(path: &Path, want: &[u8]) {
    let got = std::fs::read(path).expect("read the copy");
    assert_eq!(got.len(), want.len(), "{}", path.display());
    assert!(got == want, "{} differs", path.display());
}

#[test]
fn nbdinfo_lists_exports_with_size_and_flags() {
    if !have_tools("nbdinfo_lists_exports_with_size_and_flags", &["nbdinfo"]) {
        return;
    }
    let (a, _) = mem_disk(8 * MIB);
    let (b, _) = mem_disk(3 * MIB);
    let server = start(vec![
        Export::new("disk", a).description("scratch disk"),
        Export::new("golden", b).read_only(true),
    ]);
    let uri = format!("nbd://{}", server.local_addr());
    let out = run_ok(Command::new("nbdinfo").args(["--list", "--json", &uri]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
    assert_eq!(json["protocol"], "newstyle-fixed");
    let exports = json["exports"].as_array().expect("exports");
    assert_eq!(exports.len(), 2, "{json}");
    let disk = &exports[0];
    assert_eq!(disk["export-name"], "disk");
    assert_eq!(disk["description"], "scratch disk");
    assert_eq!(disk["export-size"], 8 * MIB);
    assert_eq!(disk["is_read_only"], false);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(disk[flag], true, "{flag}: {disk}");
    }
    assert_eq!(disk["block_size_minimum"], 1);
    assert_eq!(disk["block_size_preferred"], 4096);
    assert_eq!(disk["block_size_maximum"], 32 * MIB);
    let golden = &exports[1];
    assert_eq!(golden["export-name"], "golden");
    assert_eq!(golden["export-size"], 3 * MIB);
    assert_eq!(golden["is_read_only"], true);
    assert_eq!(golden["can_trim"], false);
    // One export by name; the size alone.
    let out = run_ok(Command::new("nbdinfo").args(["--size", &format!("{uri}/golden")]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (3 * MIB).to_string()
    );
    // An unknown export is an error for the tool, not for the server.
    let out = run_bounded(
        Command::new("nbdinfo").arg(format!("{uri}/nope")),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert_eq!(server.stats().protocol_errors, 0);
}

#[test]
fn nbdcopy_copies_an_image_in_and_out_byte_identically() {
    if !have_tools(
        "nbdcopy_copies_an_image_in_and_out_byte_identically",
        &["nbdcopy"],
    ) {
        return;
    }
    let size = 64 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let mut image = pattern(size as usize, 11);
    // A zero stretch in the middle, so sparse-aware copying is exercised too.
    image[(20 * MIB) as usize..(24 * MIB) as usize].fill(0);
    std::fs::write(&src, &image).unwrap();
    let (dev, storage) = mem_disk(size);
    storage.lock().unwrap().fill(0xee);
    let (ro, _) = mem_disk(MIB);
    let server = start(vec![
        Export::new("disk", dev),
        Export::new("ro", ro).read_only(true),
    ]);
    let uri = format!("nbd://{}/disk", server.local_addr());

    let t = Instant::now();
    run_ok(Command::new("nbdcopy").arg(&src).arg(&uri));
    let copy_in = t.elapsed();
    assert!(
        *storage.lock().unwrap() == image,
        "export differs after nbdcopy in"
    );
    let t = Instant::now();
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&back));
    let copy_out = t.elapsed();
    same_file(&back, &image);
    // One connection and a small request size: many more, smaller requests.
    std::fs::remove_file(&back).unwrap();
    run_ok(
        Command::new("nbdcopy")
            .args(["--connections=1", "--request-size=65536", "--flush"])
            .arg(&uri)
            .arg(&back),
    );
    same_file(&back, &image);
    // Copying into a read-only export fails cleanly.
    let ro_uri = format!("nbd://{}/ro", server.local_addr());
    let small = dir.path().join("small.img");
    std::fs::write(&small, pattern(MIB as usize, 1)).unwrap();
    let out = run_bounded(
        Command::new("nbdcopy").arg(&small).arg(&ro_uri),
        Duration::from_secs(30),
    );
    assert!(!out.status.success(), "nbdcopy into a read-only export");
    let mb = size as f64 / 1e6;
    eprintln!(
        "nbdcopy {} MiB over loopback (debug build of the server): in {:.0} MB/s, out {:.0} MB/s",
        size / MIB,
        mb / copy_in.as_secs_f64(),
        mb / copy_out.as_secs_f64()
    );
}

#[test]
fn qemu_img_convert_copies_an_image_in_and_out_byte_identically() {
    if !have_tools(
        "qemu_img_convert_copies_an_image_in_and_out_byte_identically",
        &["qemu-img"],
    ) {
        return;
    }
    let size = 16 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.raw");
    let back = dir.path().join("back.raw");
    let mut image = pattern(size as usize, 21);
    image[(4 * MIB) as usize..(6 * MIB) as usize].fill(0);
    std::fs::write(&src, &image).unwrap();
    let (dev, storage) = mem_disk(size);
    storage.lock().unwrap().fill(0x5a);
    let server = start(vec![Export::new("disk", dev)]);
    let uri = format!("nbd://{}/disk", server.local_addr());

    let out = run_ok(Command::new("qemu-img").args(["info", "--output=json", &uri]));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("qemu-img JSON");
    assert_eq!(info["virtual-size"], size, "{info}");

    // -n: the target exists (it is the export); qemu zeroes the zero stretch with write-zeroes.
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&uri),
    );
    assert!(
        *storage.lock().unwrap() == image,
        "export differs after qemu-img convert in"
    );
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&back),
    );
    same_file(&back, &image);
    // A qcow2 copy out and back in through the export gives the same bytes.
    let qcow = dir.path().join("copy.qcow2");
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&uri)
            .arg(&qcow),
    );
    run_ok(
        Command::new("qemu-img")
            .args(["compare", "-f", "qcow2", "-F", "raw"])
            .arg(&qcow)
            .arg(&uri),
    );
    assert_eq!(server.stats().protocol_errors, 0);
}

#[test]
fn the_kura_client_drives_an_nbdkit_export_as_a_device() {
    if !have_tools(
        "the_kura_client_drives_an_nbdkit_export_as_a_device",
        &["nbdkit"],
    ) {
        return;
    }
    // A free port for nbdkit (it is released just before nbdkit binds it).
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut nbdkit = Command::new("nbdkit")
        .args([
            "-f",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "memory",
            "16M",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nbdkit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not start");
        thread::sleep(Duration::from_millis(20));
    }
    let result = std::panic::catch_unwind(|| {
        let mut dev = connect((Ipv4Addr::LOCALHOST, port), "").expect("connect to nbdkit");
        assert_eq!(dev.geometry().capacity_bytes(), 16 * MIB);
        let bs = dev.geometry().block_size as usize;
        let mut model = vec![0u8; (16 * MIB) as usize];
        // Pipelined writes at many places, then reads of all of them in one batch. Requests in
        // flight together have no order between them (the server may run them in any order), so
        // the pipelined writes cover disjoint ranges, and the write-zeroes that overlaps one of
        // them is submitted only after every write has completed.
        for i in 0..32u64 {
            let lba = i * 97;
            let data = pattern(3 * bs, i);
            model[lba as usize * bs..(lba as usize + 3) * bs].copy_from_slice(&data);
            dev.submit(Request::write(i, lba, 3, IoBuf::from_slice(&data)))
                .expect("submit write");
        }
        dev.submit(Request::flush(99)).expect("submit flush");
        let mut done: Vec<Completion> = Vec::new();
        while dev.in_flight() > 0 {
            dev.poll(&mut done, 1).expect("poll");
        }
        assert_eq!(done.len(), 33, "{done:?}");
        dev.submit(Request::write_zeroes(100, 97, 2))
            .expect("submit zeroes");
        model[97 * bs..99 * bs].fill(0);
        while dev.in_flight() > 0 {
            dev.poll(&mut done, 1).expect("poll");
        }
        assert_eq!(done.len(), 34, "{done:?}");
        assert!(done.iter().all(|c| c.status.is_ok()), "{done:?}");
        let mut back = vec![0u8; 4 << 20];
        dev.read_blocks(0, &mut back).expect("read back");
        assert!(back[..] == model[..back.len()], "nbdkit holds other bytes");
        dev.discard_blocks(0, 1).expect("discard");
        dev.read_blocks(0, &mut back[..bs]).expect("read discarded");
        assert!(back[..bs].iter().all(|&b| b == 0));
        dev.close().expect("clean disconnect");
    });
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
