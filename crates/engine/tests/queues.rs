//! More queue pairs on one open device ([`BlockDevice::new_queue`]): siblings address the same
//! blocks (a write completed on one is read on another), a flush on any of them is accepted
//! after writes on the others and what they wrote survives reopening, the image stays locked
//! until the last sibling is dropped, and threads each driving their own queue do random I/O
//! side by side with every result checked.

mod common;

use common::{data_backends, open_or_skip, BLOCK, BLOCKS};
use kura_engine::{conformance, open, BlockDevice, BlockingIo, OpenError};

/// A sibling of `dev`, which must have more than one queue.
fn sibling(spec: &str, dev: &dyn BlockDevice) -> Box<dyn BlockDevice> {
    match dev.new_queue() {
        Some(Ok(q)) => q,
        Some(Err(e)) => panic!("{spec}: another queue refused: {e}"),
        None => panic!("{spec}: a single-queue kind"),
    }
}

/// The kinds that have one queue only: a layer whose own state a second queue would bypass.
fn single_queue(spec: &str) -> bool {
    spec.starts_with("fault(") || spec.starts_with("redirect:")
}

fn pattern(seed: u8, blocks: usize) -> Vec<u8> {
    (0..blocks * BLOCK)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn siblings_see_each_others_completed_writes_and_flush_for_each_other() {
    let dir = tempfile::tempdir().unwrap();
    for spec in data_backends(dir.path()) {
        let Some(mut first) = open_or_skip(&spec) else {
            continue;
        };
        if single_queue(&spec) {
            assert!(first.new_queue().is_none(), "{spec}: one queue expected");
            continue;
        }
        let mut second = sibling(&spec, &*first);
        assert_eq!(first.geometry(), second.geometry(), "{spec}");
        assert_eq!(second.in_flight(), 0, "{spec}");

        let a = pattern(1, 3);
        second.write_blocks(5, &a).unwrap();
        let mut back = vec![0u8; a.len()];
        first.read_blocks(5, &mut back).unwrap();
        assert!(
            back == a,
            "{spec}: a write on the sibling is not read on the first"
        );

        let b = pattern(2, 2);
        first.write_blocks(6, &b).unwrap();
        let mut back = vec![0u8; 3 * BLOCK];
        second.read_blocks(5, &mut back).unwrap();
        let mut want = a.clone();
        want[BLOCK..3 * BLOCK].copy_from_slice(&b);
        assert!(
            back == want,
            "{spec}: a write on the first is not read on the sibling"
        );

        // A flush on either queue is accepted after writes completed on the other.
        second.write_blocks(20, &pattern(3, 1)).unwrap();
        first.flush_all().unwrap();
        first.write_blocks(21, &pattern(4, 1)).unwrap();
        second.flush_all().unwrap();

        // The contract's checks pass on a sibling too (in the upper half of the device).
        for (check, outcome) in conformance::suite(&mut *second, BLOCKS / 2, BLOCKS / 2, 9) {
            if let Err(e) = outcome {
                panic!("{spec}: on a sibling: {check}: {e}");
            }
        }

        // The sibling keeps working after the first queue is gone.
        drop(first);
        let c = pattern(5, 1);
        second.write_blocks(22, &c).unwrap();
        second.flush_all().unwrap();
        drop(second);

        if spec.starts_with("mem:") {
            continue;
        }
        // What both queues wrote and flushed is in the image when it is opened again.
        let mut again = open(&spec).unwrap();
        let mut back = vec![0u8; 3 * BLOCK];
        again.read_blocks(5, &mut back).unwrap();
        assert!(back == want, "{spec}: reopened");
        let mut one = vec![0u8; BLOCK];
        for (lba, seed) in [(20, 3), (21, 4), (22, 5)] {
            again.read_blocks(lba, &mut one).unwrap();
            assert!(
                one == pattern(seed, 1),
                "{spec}: block {lba} after reopening"
            );
        }
    }
}

#[test]
fn the_image_stays_locked_until_the_last_queue_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["uring", "sync", "file"] {
        let path = dir.path().join(format!("{kind}.img"));
        let spec = format!("{kind}:{}?size=1M", path.display());
        let Some(first) = open_or_skip(&spec) else {
            continue;
        };
        let mut second = sibling(&spec, &*first);
        let third = sibling(&spec, &*second);
        // The first queue goes; its siblings still hold the image.
        drop(first);
        match open(&spec) {
            Err(OpenError::Locked { .. }) => {}
            Err(e) => panic!("{spec}: expected a lock conflict, got {e}"),
            Ok(_) => panic!("{spec}: opened while two siblings live"),
        }
        drop(third);
        match open(&spec) {
            Err(OpenError::Locked { .. }) => {}
            Err(e) => panic!("{spec}: expected a lock conflict, got {e}"),
            Ok(_) => panic!("{spec}: opened while a sibling lives"),
        }
        // The locked-out attempts did not disturb the one still open.
        second.write_blocks(1, &pattern(7, 1)).unwrap();
        second.flush_all().unwrap();
        drop(second);
        let mut again = open(&spec).unwrap();
        let mut one = vec![0u8; BLOCK];
        again.read_blocks(1, &mut one).unwrap();
        assert!(one == pattern(7, 1), "{spec}");
    }
}

#[test]
fn threads_each_with_their_own_queue_do_random_io_side_by_side() {
    const THREADS: u64 = 4;
    let dir = tempfile::tempdir().unwrap();
    for spec in data_backends(dir.path()) {
        if single_queue(&spec) {
            continue;
        }
        let Some(mut first) = open_or_skip(&spec) else {
            continue;
        };
        let region = BLOCKS / THREADS;
        let mut image = vec![0u8; (BLOCKS as usize) * BLOCK];
        first.read_blocks(0, &mut image).unwrap();
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let mut q = sibling(&spec, &*first);
                let base = t * region;
                let range = base as usize * BLOCK..(base + region) as usize * BLOCK;
                let mut model = image[range].to_vec();
                let spec = spec.clone();
                std::thread::spawn(move || {
                    for seed in 0..3 {
                        conformance::model(&mut *q, 100 * t + seed, 8, base, &mut model)
                            .unwrap_or_else(|e| panic!("{spec}: thread {t}: {e}"));
                    }
                    (base, model)
                })
            })
            .collect();
        for w in workers {
            let (base, model) = w.join().unwrap();
            image[base as usize * BLOCK..][..model.len()].copy_from_slice(&model);
        }
        // Every thread's writes, as its model predicted, through the first queue.
        let mut back = vec![0u8; image.len()];
        first.read_blocks(0, &mut back).unwrap();
        if let Some(at) = back.iter().zip(&image).position(|(a, b)| a != b) {
            panic!("{spec}: byte {at} differs from the threads' models");
        }
    }
}
