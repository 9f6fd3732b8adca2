//! The io_uring backend on real files and, as root, on a real loop device: splitting, deep
//! queues, kernel-feature fallbacks.

use kura_engine::backend::uring;
use kura_engine::{
    open, BlockDevice, BlockingIo, BufferPool, Completion, DeviceError, IoBuf, OpenError, Request,
    Spec,
};
use std::collections::HashSet;
use std::process::Command;

fn uring_or_skip(spec: &str) -> Option<Box<dyn BlockDevice>> {
    match open(spec) {
        Ok(d) => Some(d),
        Err(OpenError::Unavailable { why, .. }) => {
            eprintln!("SKIPPED: {spec}: io_uring unavailable: {why}");
            None
        }
        Err(e) => panic!("{spec}: {e}"),
    }
}

fn wait_all(dev: &mut dyn BlockDevice) -> Vec<Completion> {
    let mut out = Vec::new();
    while dev.in_flight() > 0 {
        dev.poll(&mut out, 1).expect("poll");
    }
    out
}

#[test]
fn a_request_larger_than_max_transfer_is_split_and_completed_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut dev) = uring_or_skip(&format!(
        "uring:{}/a.img?size=16M&max_transfer=1M",
        dir.path().display()
    )) else {
        return;
    };
    let len = 5 << 20;
    let mut buf = BufferPool::global().alloc(len).unwrap();
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i / 4096) as u8 ^ 0x5a;
    }
    let expect = buf.to_vec();
    dev.submit(Request::write(7, 3, (len / 4096) as u64, buf))
        .unwrap();
    let done = wait_all(&mut *dev);
    assert_eq!(done.len(), 1, "one completion for the whole request");
    assert_eq!(done[0].tag, 7);
    done[0].status.clone().unwrap();
    let mut back = vec![0u8; len];
    dev.read_blocks(3, &mut back).unwrap();
    assert!(back == expect);
}

#[test]
fn queue_depth_128_keeps_every_request_in_flight_and_completes_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut dev) = uring_or_skip(&format!(
        "uring:{}/b.img?size=8M&qd=128",
        dir.path().display()
    )) else {
        return;
    };
    let mut data = vec![0u8; 8 << 20];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i / 4096 * 7) as u8;
    }
    dev.write_blocks(0, &data).unwrap();
    dev.flush_all().unwrap();
    for tag in 0..128u64 {
        let lba = (tag * 13) % 2048;
        dev.submit(Request::read(tag, lba, 1, IoBuf::zeroed(4096)))
            .unwrap();
    }
    assert_eq!(dev.in_flight(), 128);
    let refused = dev
        .submit(Request::read(999, 0, 1, IoBuf::zeroed(4096)))
        .unwrap_err();
    assert!(matches!(
        refused.error,
        DeviceError::QueueFull { depth: 128 }
    ));
    assert_eq!(refused.request.tag, 999);
    let done = wait_all(&mut *dev);
    let tags: HashSet<u64> = done.iter().map(|c| c.tag).collect();
    assert_eq!(tags.len(), 128);
    for c in done {
        c.status.clone().unwrap();
        let lba = ((c.tag * 13) % 2048) as usize;
        assert!(c.buf.unwrap()[..] == data[lba * 4096..(lba + 1) * 4096]);
    }
}

#[test]
fn registered_buffers_and_o_direct_are_used_when_the_kernel_allows() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("uring:{}/c.img?size=1M", dir.path().display());
    let dev = match uring::open(&Spec::parse(&spec).unwrap()) {
        Ok(d) => d,
        Err(e) => return eprintln!("SKIPPED: {e}"),
    };
    let d = dev.describe();
    assert!(d.contains("O_DIRECT"), "{d}");
    assert!(
        d.contains("registered file+buffers") || dev.notes().iter().any(|n| n.contains("refused")),
        "{d}"
    );
    let plain = uring::open(&Spec::parse(&format!("{spec}&fixed=0&direct=0")).unwrap()).unwrap();
    assert!(
        plain.describe().contains("buffered") && !plain.describe().contains("registered"),
        "{}",
        plain.describe()
    );
}

#[test]
fn sqpoll_and_iopoll_work_or_fall_back_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    for opt in ["sqpoll=1", "iopoll=1", "sqpoll=1&iopoll=1"] {
        let spec = format!("uring:{}/d.img?size=1M&{opt}", dir.path().display());
        let Some(mut dev) = uring_or_skip(&spec) else {
            return;
        };
        let d = dev.describe();
        eprintln!("{opt}: {d}");
        if opt.contains("sqpoll") {
            assert!(d.contains("sqpoll"), "{d}");
        }
        if opt.contains("iopoll") {
            assert!(d.contains("iopoll"), "{d}");
        }
        // Whatever the kernel allowed, I/O and flush work.
        let data = vec![0x42u8; 8192];
        dev.write_blocks(1, &data).unwrap();
        dev.flush_all().unwrap();
        let mut back = vec![0u8; 8192];
        dev.read_blocks(1, &mut back).unwrap();
        assert_eq!(back, data, "{opt}");
    }
}

/// Detaches the loop device even when the test fails.
struct LoopGuard(String);

impl Drop for LoopGuard {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn a_real_loop_device_works_as_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIPPED: loop-device test: not running as root");
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("loop.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let out = match Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&img)
        .output()
    {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            return eprintln!(
                "SKIPPED: loop-device test: losetup failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )
        }
        Err(e) => return eprintln!("SKIPPED: loop-device test: cannot run losetup: {e}"),
    };
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let _guard = LoopGuard(loopdev.clone());
    let Some(mut dev) = uring_or_skip(&format!("uring:{loopdev}")) else {
        return;
    };
    let geo = dev.geometry();
    assert_eq!(geo.capacity_bytes(), 64 << 20, "{}", dev.describe());
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    dev.write_blocks(100, &data).unwrap();
    dev.flush_all().unwrap();
    dev.zero_blocks(100, 4).unwrap();
    dev.discard_blocks(110, 2).unwrap();
    let mut back = vec![1u8; 1 << 20];
    dev.read_blocks(100, &mut back).unwrap();
    assert!(back[..4 * 4096].iter().all(|&b| b == 0), "write-zeroes");
    assert_eq!(back[4 * 4096..10 * 4096], data[4 * 4096..10 * 4096]);
    assert!(
        back[10 * 4096..12 * 4096].iter().all(|&b| b == 0),
        "discard reads back zeroes on a loop device"
    );
    assert_eq!(back[12 * 4096..], data[12 * 4096..]);
    let oob = dev
        .submit(Request::read(1, geo.num_blocks, 1, IoBuf::zeroed(4096)))
        .unwrap_err();
    assert!(matches!(oob.error, DeviceError::OutOfRange { .. }));
    drop(dev);
    // The bytes are really on the device: read the backing file through the kernel.
    let file = std::fs::read(&img).unwrap();
    assert_eq!(
        file[(100 + 12) * 4096..(100 + 256) * 4096],
        data[12 * 4096..]
    );
}
