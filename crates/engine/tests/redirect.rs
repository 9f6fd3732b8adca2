//! The redirect backend: a real proxy process over shared memory, its link model, and what
//! happens when the proxy dies.

use kura_engine::backend::redirect;
use kura_engine::{open, BlockDevice, BlockingIo, Completion, DeviceError, IoBuf, Request, Spec};
use std::time::{Duration, Instant};

fn redirect_dev(spec: &str) -> redirect::RedirectDevice {
    redirect::open(&Spec::parse(spec).expect("spec")).expect("open redirect")
}

#[test]
fn data_crosses_the_proxy_both_ways_and_lands_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.img");
    let mut dev = redirect_dev(&format!("redirect:{}?size=16M", path.display()));
    assert_ne!(
        dev.proxy_pid(),
        std::process::id() as i32,
        "a separate process serves the device"
    );
    for (lba, len) in [(0u64, 4096usize), (8, 1 << 20), (600, 5 << 20)] {
        let data: Vec<u8> = (0..len).map(|i| (i as u64 * 7 + lba) as u8).collect();
        dev.write_blocks(lba, &data).unwrap();
        let mut back = vec![0u8; len];
        dev.read_blocks(lba, &mut back).unwrap();
        assert!(back == data, "{len} bytes at LBA {lba}");
    }
    dev.flush_all().unwrap();
    dev.zero_blocks(8, 2).unwrap();
    dev.discard_blocks(10, 2).unwrap();
    let mut z = vec![1u8; 4 * 4096];
    dev.read_blocks(8, &mut z).unwrap();
    assert!(
        z.iter().all(|&b| b == 0),
        "write-zeroes and discard read back zeroes"
    );
    dev.flush_all().unwrap();
    drop(dev);
    let file = std::fs::read(&path).unwrap();
    assert_eq!(
        file[600 * 4096],
        (600u64) as u8,
        "the proxy's writes are in the file"
    );
}

#[test]
fn many_requests_in_flight_each_complete_once_and_back_pressure_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = redirect_dev(&format!(
        "redirect:{}/q.img?size=4M&qd=32",
        dir.path().display()
    ));
    for tag in 0..32u64 {
        dev.submit(Request::write(
            tag,
            tag,
            1,
            IoBuf::from_slice(&[tag as u8; 4096]),
        ))
        .unwrap();
    }
    let refused = dev.submit(Request::flush(99)).unwrap_err();
    assert!(matches!(
        refused.error,
        DeviceError::QueueFull { depth: 32 }
    ));
    let mut done: Vec<Completion> = Vec::new();
    while dev.in_flight() > 0 {
        dev.poll(&mut done, 1).unwrap();
    }
    let mut tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, (0..32).collect::<Vec<_>>());
    let mut back = vec![0u8; 32 * 4096];
    dev.read_blocks(0, &mut back).unwrap();
    for tag in 0..32 {
        assert!(back[tag * 4096..(tag + 1) * 4096]
            .iter()
            .all(|&b| b == tag as u8));
    }
}

#[test]
fn the_link_model_adds_its_cost_and_says_modeled() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = redirect_dev(&format!(
        "redirect:{}/m.img?size=1M&call_us=200",
        dir.path().display()
    ));
    assert!(dev.describe().contains("modeled"), "{}", dev.describe());
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    for _ in 0..10 {
        dev.read_blocks(0, &mut buf).unwrap();
    }
    assert!(
        t.elapsed() >= Duration::from_micros(2000),
        "10 modeled calls take at least 10 × 200 µs"
    );
    // One open image per device: each must be closed before the next opens it.
    drop(dev);
    let aurora = redirect_dev(&format!(
        "redirect:{}/m.img?link=aurora",
        dir.path().display()
    ));
    let m = aurora.link_model().unwrap();
    assert!((m.call_us - 42.7).abs() < 1e-9 && (m.copy_gbps - 0.92).abs() < 1e-9);
    drop(aurora);
    let plain = redirect_dev(&format!("redirect:{}/m.img", dir.path().display()));
    assert!(!plain.describe().contains("modeled"));
}

#[test]
#[allow(unsafe_code)] // kill(2) on the proxy child
fn a_dead_proxy_fails_requests_and_never_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = redirect_dev(&format!("redirect:{}/d.img?size=1M", dir.path().display()));
    dev.write_blocks(0, &[5u8; 4096]).unwrap();
    // SAFETY: killing the test's own proxy child.
    unsafe { libc::kill(dev.proxy_pid(), libc::SIGKILL) };
    let t = Instant::now();
    let mut buf = vec![0u8; 4096];
    let err = loop {
        match dev.read_blocks(0, &mut buf) {
            // The proxy may answer one last command before the signal lands.
            Ok(()) if t.elapsed() < Duration::from_secs(5) => continue,
            other => break other.unwrap_err(),
        }
    };
    assert!(matches!(err, DeviceError::Offline { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "bounded wait");
    let again = dev.submit(Request::flush(1)).unwrap_err();
    assert!(matches!(again.error, DeviceError::Offline { .. }));
}

#[test]
fn opening_from_a_busy_multithreaded_process_is_safe() {
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut v = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    v.push(vec![0u8; 1000]);
                    if v.len() > 100 {
                        v.clear();
                    }
                }
            })
        })
        .collect();
    for i in 0..20 {
        let mut dev = open(&format!(
            "redirect:{}/t{i}.img?size=1M",
            dir.path().display()
        ))
        .unwrap();
        dev.write_blocks(1, &[i as u8; 4096]).unwrap();
        let mut b = vec![0u8; 4096];
        dev.read_blocks(1, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == i as u8));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in churn {
        t.join().unwrap();
    }
}

#[test]
fn bad_link_options_are_refused() {
    for (opt, want) in [
        ("link=pcie", "not known"),
        ("call_us=-1", "non-negative"),
        ("lnk=aurora", "did you mean `link`"),
    ] {
        let err = open(&format!("redirect:/tmp/x.img?size=1M&{opt}"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(want), "{opt}: {err}");
    }
}
