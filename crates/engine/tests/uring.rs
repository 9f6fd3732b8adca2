//! The io_uring backend on real files and, as root, on a real loop device: kernel-feature
//! fallbacks. (Splitting and deep queues are in the device-interface suite, `tests/conformance.rs`.)

use kura_engine::backend::uring;
use kura_engine::{open, BlockDevice, BlockingIo, DeviceError, IoBuf, OpenError, Request, Spec};

fn uring_or_skip(spec: &str) -> Option<Box<dyn BlockDevice>> {
    match open(spec) {
        Ok(d) => Some(d),
        Err(OpenError::Unavailable { feature, why, .. }) if feature == "io_uring" => {
            kura_testkit::skip(&format!("open {spec}"), "io_uring", &why);
            None
        }
        Err(e) => panic!("{spec}: {e}"),
    }
}

#[test]
fn registered_buffers_and_o_direct_are_used_when_the_kernel_allows() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("uring:{}/c.img?size=1M", dir.path().display());
    let dev = match uring::open(&Spec::parse(&spec).unwrap()) {
        Ok(d) => d,
        Err(OpenError::Unavailable { feature, why, .. }) if feature == "io_uring" => {
            return kura_testkit::skip(
                "registered_buffers_and_o_direct_are_used_when_the_kernel_allows",
                "io_uring",
                &why,
            )
        }
        Err(e) => panic!("{spec}: {e}"),
    };
    let d = dev.describe();
    assert!(d.contains("O_DIRECT"), "{d}");
    assert!(
        d.contains("registered file+buffers") || dev.notes().iter().any(|n| n.contains("refused")),
        "{d}"
    );
    drop(dev);
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

#[test]
fn a_real_loop_device_works_as_root() {
    if let Some(m) = kura_testkit::loop_unavailable() {
        return m.skip("a_real_loop_device_works_as_root");
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("loop.img");
    // Root, losetup and /dev/loop-control are here: a failing losetup is a failure.
    let attached = kura_testkit::LoopDevice::attach(&img, 64 << 20);
    let loopdev = attached.path().to_string();
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
    // The device-interface suite on a real block device, where discard and write-zeroes go
    // through the kernel's block layer.
    for (check, outcome) in kura_engine::conformance::suite(&mut *dev, 2048, 1024, 5) {
        if let Err(e) = outcome {
            panic!("{loopdev}: {check}: {e}");
        }
    }
    drop(dev);
    // The bytes are really on the device: read the backing file through the kernel.
    let file = std::fs::read(&img).unwrap();
    assert_eq!(
        file[(100 + 12) * 4096..(100 + 256) * 4096],
        data[12 * 4096..]
    );
}
