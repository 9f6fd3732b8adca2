//! Exclusive use of images: one writer at a time, readers share, a refused open changes nothing
//! and names the holder; a read-only device refuses changes with a typed error. On a real loop
//! device (as root) the kernel's exclusive open refuses a second writer too.

use kura_engine::{open, BlockDevice, BlockingIo, DeviceError, IoBuf, OpenError, Request};

fn locked_holder(spec: &str) -> String {
    match open(spec) {
        Err(OpenError::Locked { holder, .. }) => holder,
        Err(e) => panic!("{spec}: expected a lock conflict, got {e}"),
        Ok(d) => panic!(
            "{spec}: opened although another device holds it: {}",
            d.describe()
        ),
    }
}

#[test]
fn a_second_writer_is_refused_with_the_holder_named_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.img");
    for kind in ["uring", "sync", "file", "redirect"] {
        let first = open(&format!("{kind}:{}?size=1M", path.display())).unwrap();
        let second = format!("sync:{}?size=2M", path.display());
        let holder = locked_holder(&second);
        if kind != "redirect" {
            // The redirect image is held by its proxy process, whichever PID /proc/locks shows.
            assert!(
                holder.contains(&std::process::id().to_string()),
                "{kind}: holder {holder}"
            );
        }
        let msg = open(&second).err().unwrap().to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            1 << 20,
            "{kind}: a refused open with size= must not grow the image"
        );
        drop(first);
        // Closed: the next writer gets it at once (io_uring's deferred teardown included).
        drop(open(&second).unwrap());
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn readers_share_an_image_and_exclude_writers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.img");
    let mut w = open(&format!("uring:{}?size=1M", path.display())).unwrap();
    w.write_blocks(3, &[0x5a; 4096]).unwrap();
    w.flush_all().unwrap();
    let ro = format!("uring:{}?ro=1", path.display());
    locked_holder(&ro);
    drop(w);
    let mut r1 = open(&ro).unwrap();
    let mut r2 = open(&format!("sync:{}?ro=1", path.display())).unwrap();
    let mut back = vec![0u8; 4096];
    r1.read_blocks(3, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    r2.read_blocks(3, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    locked_holder(&format!("uring:{}", path.display()));
    drop((r1, r2));
    drop(open(&format!("uring:{}", path.display())).unwrap());
}

#[test]
fn a_read_only_device_refuses_every_change_and_leaves_the_image_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.img");
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
    for kind in ["uring", "sync", "redirect"] {
        let mut dev = open(&format!("{kind}:{}?ro=1", path.display())).unwrap();
        for req in [
            Request::write(1, 0, 1, IoBuf::zeroed(4096)),
            Request::write_zeroes(2, 1, 1),
            Request::discard(3, 2, 1),
        ] {
            // Refused at submission or completed with the error, as a poisoned device does.
            let error = match dev.submit(req) {
                Err(refused) => refused.error,
                Ok(()) => {
                    let mut done = Vec::new();
                    while dev.in_flight() > 0 {
                        dev.poll(&mut done, 1).unwrap();
                    }
                    done.pop().unwrap().status.expect_err("a change is refused")
                }
            };
            assert!(
                matches!(error, DeviceError::ReadOnly { .. }),
                "{kind}: {error}"
            );
            assert_eq!(error.errno(), libc::EROFS);
        }
        dev.flush_all().unwrap();
        let mut back = vec![0u8; 8192];
        dev.read_blocks(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 7), "{kind}");
    }
    assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 7));
    let created = open(&format!(
        "uring:{}/new.img?ro=1&size=1M",
        dir.path().display()
    ));
    assert!(
        matches!(created, Err(OpenError::Invalid(_))),
        "ro cannot create"
    );
}

#[test]
fn a_loop_device_has_one_writer() {
    if let Some(m) = kura_testkit::loop_unavailable() {
        return m.skip("a_loop_device_has_one_writer");
    }
    let dir = tempfile::tempdir().unwrap();
    let attached = kura_testkit::LoopDevice::attach(&dir.path().join("loop.img"), 16 << 20);
    let loopdev = attached.path();
    let first = open(&format!("sync:{loopdev}")).unwrap();
    let holder = locked_holder(&format!("uring:{loopdev}"));
    assert!(!holder.is_empty());
    let reader = open(&format!("sync:{loopdev}?ro=1"));
    assert!(
        matches!(reader, Err(OpenError::Locked { .. })),
        "a reader waits for the writer too"
    );
    drop(first);
    drop(open(&format!("uring:{loopdev}")).unwrap());
}

/// Another thread of the process forking children (as a redirect device or a spawned tool does)
/// shares every open file with them for a while; an image opened meanwhile, and then closed,
/// must not stay locked by those copies.
#[test]
fn forks_elsewhere_in_the_process_do_not_keep_a_closed_image_locked() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let forker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                fork_a_child_that_sleeps_and_reap_it();
            }
        })
    };
    for round in 0..1000 {
        let path = dir.path().join(format!("f{round}.img"));
        // size= creates the image through a second, short-lived open that also takes the lock.
        let first = open(&format!("sync:{}?size=64K", path.display()))
            .unwrap_or_else(|e| panic!("round {round}: create: {e}"));
        drop(first);
        drop(
            open(&format!("sync:{}?size=128K", path.display()))
                .unwrap_or_else(|e| panic!("round {round}: reopen after close: {e}")),
        );
    }
    stop.store(true, Ordering::Relaxed);
    forker.join().unwrap();
}

/// A child holding copies of every open file of the process for 2 ms, then gone.
#[allow(unsafe_code)] // fork and waitpid
fn fork_a_child_that_sleeps_and_reap_it() {
    // SAFETY: the child only sleeps and exits, both async-signal-safe, so locks other threads
    // held at the fork are never touched.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above; _exit skips the parent's atexit handlers and buffers.
        unsafe {
            libc::usleep(2000);
            libc::_exit(0);
        }
    }
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: reaping our own child, with a valid status pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}
