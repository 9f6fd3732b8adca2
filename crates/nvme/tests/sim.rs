//! The whole driver against the simulated controller: the model check at several geometries,
//! several queue pairs from several threads, error statuses, timeouts with abort and reset, a
//! controller that never becomes ready or vanishes, and clean shutdown.

use kura_engine::conformance;
use kura_engine::{BlockDevice, BlockingIo, DeviceError, IoBuf, Request, Spec};
use kura_nvme::status::{self, NvmeStatus};
use kura_nvme::{open_sim, NvmeError, NvmeQueue, SimController};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn sim(spec: &str) -> (NvmeQueue, Arc<SimController>) {
    open_sim(&Spec::parse(spec).expect("spec parses")).expect("simulated controller opens")
}

#[test]
fn the_device_interface_suite_passes_on_the_simulated_controller() {
    for spec in [
        "nvme-sim:1M",
        "nvme-sim:2M?bs=4096&mdts=2&qd=16",
        "nvme-sim:1M?qd=3&entries=2",
    ] {
        let (mut q, s) = sim(spec);
        let blocks = q.geometry().num_blocks;
        for (check, outcome) in conformance::suite(&mut q, 0, blocks, 3) {
            if let Err(e) = outcome {
                panic!("{spec}: {check}: {e}");
            }
        }
        assert_eq!(
            s.stats().dma_faults,
            0,
            "{spec}: no DMA outside mapped memory"
        );
    }
}

#[test]
fn model_check_on_several_geometries() {
    for spec in [
        "nvme-sim:1M",
        "nvme-sim:1M?bs=4096&qd=8&entries=8",
        "nvme-sim:2M?lba=4096&mdts=2",
        "nvme-sim:4M?bs=4096&mdts=8&max_transfer=64K",
        "nvme-sim:1M?qd=3&entries=2",
    ] {
        let (mut q, s) = sim(spec);
        let geo = q.geometry();
        let mut model = vec![0u8; (geo.num_blocks * u64::from(geo.block_size)) as usize];
        for seed in 0..6 {
            conformance::model(&mut q, seed, 8, 0, &mut model)
                .unwrap_or_else(|e| panic!("{spec} seed {seed}: {e}"));
        }
        let st = s.stats();
        assert_eq!(
            st.dma_faults, 0,
            "{spec}: the device never touched unmapped memory"
        );
        assert!(
            st.prp_list_commands > 0 || geo.max_transfer <= 8192,
            "{spec}: PRP lists used"
        );
        assert!(
            q.stats().bounced > 0,
            "{spec}: heap buffers went through bounce buffers"
        );
        drop(q);
        assert_eq!(
            s.disk(),
            model,
            "{spec}: the namespace holds what the model says"
        );
        assert_eq!(s.stats().shutdowns, 1, "{spec}: CC.SHN on drop");
        assert_eq!(s.mapped_ranges(), 0, "{spec}: every DMA mapping undone");
    }
}

#[test]
fn transfers_above_mdts_are_split() {
    let (mut q, s) = sim("nvme-sim:4M?mdts=1");
    assert_eq!(q.geometry().max_transfer, 8192);
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    q.write_blocks(8, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    q.read_blocks(8, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(s.stats().largest_transfer, 8192);
}

#[test]
fn queues_on_several_threads() {
    let (q, s) = sim("nvme-sim:4M?bs=4096&queues=4");
    assert_eq!(q.info().io_queues, 4);
    let quarter = q.geometry().num_blocks / 4;
    let mut queues = vec![q];
    for _ in 0..3 {
        let next = queues[0].new_queue().unwrap();
        queues.push(next);
    }
    assert!(
        matches!(queues[0].new_queue(), Err(NvmeError::Unsupported(_))),
        "a fifth queue is refused"
    );
    let handles: Vec<_> = queues
        .into_iter()
        .enumerate()
        .map(|(i, mut q)| {
            std::thread::spawn(move || {
                let mut model = vec![0u8; (quarter * 4096) as usize];
                for seed in 0..4 {
                    conformance::model(
                        &mut q,
                        100 * i as u64 + seed,
                        6,
                        i as u64 * quarter,
                        &mut model,
                    )
                    .unwrap();
                }
                model
            })
        })
        .collect();
    let images: Vec<Vec<u8>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(s.disk(), images.concat());
    assert_eq!(s.stats().dma_faults, 0);
}

#[test]
fn error_statuses_become_typed_errors() {
    let (mut q, s) = sim("nvme-sim:1M");
    // Past the end, sent to the controller unchecked: its LBA-out-of-range status comes back.
    let end = q.info().ns.blocks;
    let err = q.raw_read(end - 1, 2, IoBuf::zeroed(1024)).unwrap_err();
    assert!(matches!(err, DeviceError::OutOfRange { .. }), "{err}");
    s.fail_next_io(NvmeStatus {
        sct: status::SCT_MEDIA,
        sc: status::SC_UNRECOVERED_READ,
        dnr: true,
        more: false,
    });
    let mut buf = vec![0u8; 512];
    let err = q.read_blocks(3, &mut buf).unwrap_err();
    assert!(
        matches!(err, DeviceError::Io { errno, .. } if errno.0 == libc::EIO),
        "{err}"
    );
    // A failed flush poisons the queue for writes; reads go on.
    s.fail_next_io(NvmeStatus::generic(status::SC_INTERNAL));
    assert!(q.flush_all().is_err());
    assert!(matches!(
        q.write_blocks(0, &[1u8; 512]),
        Err(DeviceError::Poisoned { .. })
    ));
    q.read_blocks(0, &mut buf).unwrap();
    // The host-side check refuses out-of-range requests before they reach the device.
    let r = q
        .submit(Request::read(1, end, 1, IoBuf::zeroed(512)))
        .unwrap_err();
    assert!(matches!(r.error, DeviceError::OutOfRange { .. }));
}

#[test]
fn timeout_is_aborted_then_the_queue_goes_on() {
    let (mut q, s) = sim("nvme-sim:1M?timeout_ms=50");
    q.write_blocks(0, &[5u8; 512]).unwrap();
    s.set_hang_io(true);
    let t = Instant::now();
    let mut buf = vec![0u8; 512];
    let err = q.read_blocks(0, &mut buf).unwrap_err();
    assert!(
        matches!(err, DeviceError::Io { errno, .. } if errno.0 == libc::ETIMEDOUT),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(q.stats().aborts, 1);
    assert_eq!(q.stats().resets, 0, "the abort sufficed");
    s.set_hang_io(false);
    q.read_blocks(0, &mut buf).unwrap();
    assert_eq!(buf, [5u8; 512]);
}

#[test]
fn ignored_abort_leads_to_reset_and_reinit() {
    let (mut q, s) = sim("nvme-sim:1M?timeout_ms=50&queues=2");
    let mut other = q.new_queue().unwrap();
    q.write_blocks(0, &[9u8; 1024]).unwrap();
    s.set_hang_io(true);
    s.set_ignore_abort(true);
    let mut buf = vec![0u8; 512];
    let err = q.read_blocks(0, &mut buf).unwrap_err();
    assert_eq!(err.errno(), libc::ETIMEDOUT, "{err}");
    assert_eq!(q.stats().resets, 1);
    assert_eq!(s.stats().enables, 2, "the controller was enabled again");
    s.set_hang_io(false);
    q.read_blocks(0, &mut buf).unwrap();
    assert_eq!(buf, [9u8; 512]);
    // The other queue pair re-creates itself after the reset and works.
    other.read_blocks(1, &mut buf).unwrap();
    assert_eq!(buf, [9u8; 512]);
    // An explicit reset with nothing in flight, then the model check still passes.
    q.reset_controller().unwrap();
    let mut model = s.disk();
    conformance::model(&mut q, 7, 4, 0, &mut model).unwrap();
}

#[test]
fn vanished_controller_fails_commands_without_hanging() {
    let (mut q, s) = sim("nvme-sim:1M?timeout_ms=100");
    s.set_hang_io(true);
    let mut done = Vec::new();
    q.submit(Request::read(1, 0, 1, IoBuf::zeroed(512)))
        .unwrap();
    q.ring_doorbell().unwrap();
    s.vanish();
    let t = Instant::now();
    q.poll(&mut done, 1).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(done[0].status, Err(DeviceError::Offline { .. })),
        "{:?}",
        done[0].status
    );
    let r = q
        .submit(Request::read(2, 0, 1, IoBuf::zeroed(512)))
        .unwrap_err();
    assert!(matches!(r.error, DeviceError::Offline { .. }));
    drop(q);
}

#[test]
fn bring_up_failures_are_bounded_and_typed() {
    let cfg = kura_nvme::SimConfig {
        timeout_units: 1,
        ..Default::default()
    };
    let s = Arc::new(SimController::new(cfg));
    s.set_never_ready(true);
    let bus: Arc<dyn kura_nvme::bus::Bus> = s.clone();
    let t = Instant::now();
    let err = kura_nvme::open::open_queue(bus, Default::default(), None, 8, 1 << 20)
        .err()
        .unwrap();
    assert!(matches!(err, NvmeError::Timeout { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(3), "bounded by CAP.TO");
    assert_eq!(s.mapped_ranges(), 0);

    let s = Arc::new(SimController::new(Default::default()));
    s.vanish();
    let bus: Arc<dyn kura_nvme::bus::Bus> = s.clone();
    let err = kura_nvme::open::open_queue(bus, Default::default(), None, 8, 1 << 20)
        .err()
        .unwrap();
    assert_eq!(err, NvmeError::Vanished);

    let s = Arc::new(SimController::new(Default::default()));
    let bus: Arc<dyn kura_nvme::bus::Bus> = s.clone();
    let opts = kura_nvme::CtrlOptions {
        nsid: 2,
        ..Default::default()
    };
    let err = kura_nvme::open::open_queue(bus, opts, None, 8, 1 << 20)
        .err()
        .unwrap();
    assert!(matches!(err, NvmeError::Invalid(_)), "{err}");
    assert!(
        !s.enabled(),
        "a half-initialised controller is disabled again"
    );
    assert_eq!(s.mapped_ranges(), 0);
}

#[test]
fn bad_specs_are_refused() {
    for bad in [
        "nvme-sim:1M?lba=1000",
        "nvme-sim:1M?bs=256",
        "nvme-sim:1M?queues=0",
        "nvme-sim:1M?colour=red",
        "nvme-sim:0",
    ] {
        assert!(open_sim(&Spec::parse(bad).unwrap()).is_err(), "{bad}");
    }
}

/// Software cost per command: 4 KiB reads at depth 1 and 32 through driver + simulator.
#[test]
fn cost_per_command() {
    let (mut q, _s) = sim("nvme-sim:16M?bs=4096&qd=32");
    let n = 20_000u64;
    // The first round only warms up (page faults in fresh pool memory and DMA pages).
    for (round, depth) in [(0, 32u64), (1, 1), (1, 32)] {
        let mut bufs: Vec<IoBuf> = (0..depth).map(|_| IoBuf::zeroed(4096)).collect();
        let mut done = Vec::new();
        let t = Instant::now();
        let mut sent = 0;
        while sent < n {
            while let Some(b) = bufs.pop() {
                q.submit(Request::read(sent, sent % 4096, 1, b)).unwrap();
                sent += 1;
            }
            q.poll(&mut done, 1).unwrap();
            bufs.extend(done.drain(..).map(|c| c.buf.unwrap()));
        }
        while q.in_flight() > 0 {
            q.poll(&mut done, 1).unwrap();
        }
        let per = t.elapsed().as_nanos() as f64 / n as f64;
        if round > 0 {
            eprintln!("nvme-sim 4K read QD{depth}: {per:.0} ns per command (driver + simulated controller, host)");
        }
    }
}

#[test]
fn discard_uses_dsm_where_write_zeroes_is_missing() {
    let cfg = kura_nvme::SimConfig {
        write_zeroes: false,
        ..Default::default()
    };
    let s = Arc::new(SimController::new(cfg));
    let bus: Arc<dyn kura_nvme::bus::Bus> = s.clone();
    let mut q = kura_nvme::open::open_queue(bus, Default::default(), None, 16, 1 << 20).unwrap();
    q.write_blocks(0, &[7u8; 4096]).unwrap();
    let mut done = Vec::new();
    q.submit(Request::discard(1, 2, 4)).unwrap();
    q.poll(&mut done, 1).unwrap();
    assert!(done[0].status.is_ok());
    let disk = s.disk();
    assert!(disk[1024..3072].iter().all(|&b| b == 0) && disk[..1024].iter().all(|&b| b == 7));
    let r = q.submit(Request::write_zeroes(2, 0, 1)).unwrap_err();
    assert!(
        matches!(r.error, DeviceError::Unsupported { .. }),
        "no Write Zeroes on this controller"
    );
}
