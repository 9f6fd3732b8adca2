//! The mirror's failure handling: a leg failing mid-stream loses nothing, reads are retried on
//! another leg, the status says which leg is degraded, and a rebuild makes the legs identical.

mod common;

use common::Model;
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{FaultDevice, FaultPlan};
use kura_engine::{BlockDevice, BlockingIo, DeviceError};
use kura_vdrive::{LegHealth, Mirror, MirrorError};

const SIZE: u64 = 1 << 20;

fn mem(seed: u64) -> (MemDevice, MemStorage) {
    let dev = MemDevice::new(SIZE, QueueOptions::default()).shuffled(seed);
    let storage = dev.storage();
    (dev, storage)
}

fn faulty(plan: FaultPlan) -> Box<dyn BlockDevice> {
    Box::new(FaultDevice::new(Box::new(mem(99).0), plan))
}

fn image(storage: &MemStorage) -> Vec<u8> {
    storage.lock().expect("ram disk lock").clone()
}

#[test]
fn a_leg_failing_mid_stream_loses_nothing_and_rebuild_makes_the_legs_identical() {
    let (good, good_disk) = mem(1);
    let bad = faulty(FaultPlan {
        write_eio: Some(40),
        ..FaultPlan::default()
    });
    let mut m = Mirror::new(vec![bad, Box::new(good)]).unwrap();
    let mut model = Model::of(&m, 7);
    model.run(&mut m, 30);
    model.check_image(&mut m);
    let status = m.status();
    assert!(
        matches!(&status[0].health, LegHealth::Degraded { reason } if reason.contains("write")),
        "{status:?}"
    );
    assert_eq!(status[1].health, LegHealth::Healthy);
    assert!(m.describe().contains("leg 0 degraded"), "{}", m.describe());
    assert!(!m.is_clean());

    let (fresh, fresh_disk) = mem(2);
    let mut calls = Vec::new();
    kura_vdrive::rebuild(&mut m, 0, Box::new(fresh), |done, total| {
        calls.push((done, total))
    })
    .unwrap();
    assert!(m.is_clean(), "{:?}", m.status());
    assert!(
        calls.windows(2).all(|w| w[0].0 < w[1].0),
        "progress moves forward"
    );
    assert_eq!(calls.last(), Some(&(256, 256)));
    assert!(
        image(&fresh_disk) == image(&good_disk),
        "rebuild copied every block"
    );
    assert!(
        image(&good_disk) == model.data,
        "the surviving leg holds everything"
    );

    // Both legs serve again and stay identical.
    model.run(&mut m, 10);
    model.check_image(&mut m);
    assert!(image(&fresh_disk) == image(&good_disk));
    assert!(image(&fresh_disk) == model.data);
}

#[test]
fn a_leg_failing_a_flush_is_degraded_and_the_flush_succeeds() {
    let (good, _) = mem(1);
    let bad = faulty(FaultPlan {
        flush_eio: Some(1),
        ..FaultPlan::default()
    });
    let mut m = Mirror::new(vec![Box::new(good), bad]).unwrap();
    m.write_blocks(3, &[7u8; 4096]).unwrap();
    m.flush_all().unwrap();
    assert!(matches!(m.status()[1].health, LegHealth::Degraded { .. }));
    m.write_blocks(4, &[8u8; 4096]).unwrap();
    m.flush_all().unwrap();
    let mut out = vec![0u8; 2 * 4096];
    m.read_blocks(3, &mut out).unwrap();
    assert!(out[..4096].iter().all(|&b| b == 7) && out[4096..].iter().all(|&b| b == 8));
}

#[test]
fn a_read_error_is_retried_on_another_leg() {
    let (good, _) = mem(1);
    let bad = faulty(FaultPlan {
        read_eio: Some(1),
        ..FaultPlan::default()
    });
    let mut m = Mirror::new(vec![bad, Box::new(good)]).unwrap();
    m.write_blocks(0, &[5u8; 4 * 4096]).unwrap();
    for _ in 0..4 {
        let mut out = vec![0u8; 4 * 4096];
        m.read_blocks(0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 5));
    }
    let status = m.status();
    assert_eq!(status[0].read_errors, 1);
    assert!(
        m.is_clean(),
        "a read error does not degrade a leg: {status:?}"
    );
}

#[test]
fn the_last_healthy_leg_is_never_degraded() {
    let a = faulty(FaultPlan {
        write_eio: Some(1),
        ..FaultPlan::default()
    });
    let b = faulty(FaultPlan {
        write_eio: Some(2),
        ..FaultPlan::default()
    });
    let mut m = Mirror::new(vec![a, b]).unwrap();
    m.write_blocks(0, &[1u8; 4096]).unwrap();
    assert!(matches!(m.status()[0].health, LegHealth::Degraded { .. }));
    let err = m.write_blocks(1, &[2u8; 4096]).unwrap_err();
    assert!(matches!(err, DeviceError::Io { .. }), "{err}");
    assert_eq!(m.status()[1].health, LegHealth::Healthy);
    m.write_blocks(2, &[3u8; 4096]).unwrap();
    let mut out = vec![0u8; 4096];
    m.read_blocks(0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 1));
}

#[test]
fn with_no_healthy_leg_every_command_fails_with_a_typed_error() {
    let mut m = Mirror::new(vec![Box::new(mem(1).0), Box::new(mem(2).0)]).unwrap();
    m.mark_degraded(0, "pulled").unwrap();
    m.mark_degraded(1, "pulled").unwrap();
    let mut out = vec![0u8; 4096];
    let err = m.read_blocks(0, &mut out).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Offline { reason } if reason.contains("no healthy leg")),
        "{err}"
    );
    assert!(matches!(
        m.write_blocks(0, &out),
        Err(DeviceError::Offline { .. })
    ));
    let err = m.rebuild(0, Box::new(mem(3).0), |_, _| {}).unwrap_err();
    assert!(
        matches!(err, MirrorError::NoHealthySource { leg: 0 }),
        "{err}"
    );
}

#[test]
fn rebuild_checks_its_arguments() {
    let mut m = Mirror::new(vec![Box::new(mem(1).0), Box::new(mem(2).0)]).unwrap();
    let small = MemDevice::new(SIZE / 2, QueueOptions::default());
    let err = m.rebuild(1, Box::new(small), |_, _| {}).unwrap_err();
    assert!(matches!(err, MirrorError::DoesNotFit { .. }), "{err}");
    let err = m.rebuild(5, Box::new(mem(3).0), |_, _| {}).unwrap_err();
    assert!(
        matches!(err, MirrorError::NoSuchLeg { leg: 5, legs: 2 }),
        "{err}"
    );
    m.submit(kura_engine::Request::flush(1)).unwrap();
    let err = m.rebuild(1, Box::new(mem(3).0), |_, _| {}).unwrap_err();
    assert!(matches!(err, MirrorError::Busy { in_flight: 1 }), "{err}");
}

#[test]
fn a_mirror_opened_from_a_spec_degrades_and_rebuilds() {
    let mut m = kura_vdrive::open_mirror(
        "mirror(fault(mem:1M?shuffle=1)?write_eio=3,stripe(mem:512K,mem:512K?shuffle=2)?chunk=8K)",
    )
    .unwrap();
    let mut model = Model::of(&m, 3);
    model.run(&mut m, 8);
    assert!(matches!(m.status()[0].health, LegHealth::Degraded { .. }));
    let fresh = kura_vdrive::open("mem:1M").unwrap();
    m.rebuild(0, fresh, |_, _| {}).unwrap();
    model.run(&mut m, 8);
    model.check_image(&mut m);
    // Read each leg on its own: both hold the model.
    for leg in 0..2 {
        let dev = m.leg_mut(leg).unwrap();
        let mut whole = vec![0u8; model.data.len()];
        dev.read_blocks(0, &mut whole).unwrap();
        assert!(whole == model.data, "leg {leg} differs");
    }
}
