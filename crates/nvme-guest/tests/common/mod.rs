//! What a finished guest test run must show, for both guests (tests/vm.rs on x86-64,
//! tests/vm_aarch64.rs on arm64): every step of `kura-nvme-guest` passed, and the marker blocks
//! and AccelFS data are on the namespace images the host reads afterwards.

use kura_nvme_guest::GuestRun;
use std::path::Path;

/// Whether `run` looks like a finished, passing guest test (what `boot_passing` retries on).
pub fn passed(run: &GuestRun) -> bool {
    run.status == Some(0)
        && !run.console.contains("FAIL ")
        && run.console.contains("GUEST-RESULT pt pass")
        && run.console.contains("GUEST-RESULT vfio pass")
}

fn block_at(image: &Path, block: u64) -> Vec<u8> {
    let data = std::fs::read(image).expect("disk image readable");
    let at = (block * 4096) as usize;
    data[at..at + 4096].to_vec()
}

/// Asserts every step the guest program runs passed and the images hold what it wrote.
pub fn check(run: &GuestRun) {
    let log = &run.console;
    let out = &run.dir;
    assert_eq!(
        run.status,
        Some(0),
        "QEMU failed or timed out; log in {}",
        out.display()
    );
    assert!(
        !log.contains("FAIL "),
        "a guest step failed; log in {}",
        out.display()
    );
    assert!(
        log.contains("GUEST-RESULT pt pass"),
        "passthrough tests did not pass"
    );
    assert!(
        log.contains("GUEST-RESULT vfio pass"),
        "user-space driver tests did not pass"
    );
    let mut steps: Vec<String> = [
        "vfio out-of-range status",
        "vfio 4 queues on 4 threads",
        "vfio reset",
        "vfio timeout, abort, reset",
        "vfio model after reset",
        "rebind to vfio-pci",
        "rebind to kernel driver",
        "verify after rebind to kernel",
        "fs mkfs and write a tree",
        "fs fsck",
        "fs read back",
        "fs genome pipeline",
    ]
    .map(String::from)
    .to_vec();
    // The device-interface suite the engine's backends pass, on each path to the controller.
    for prefix in ["pt", "uring", "vfio bs=512", "vfio bs=4096"] {
        for check in [
            "refuses invalid requests",
            "model",
            "splits above max transfer",
            "fills the queue",
        ] {
            steps.push(format!("{prefix} {check}"));
        }
    }
    for step in steps {
        assert!(
            log.contains(&format!("PASS {step}")),
            "step `{step}` did not pass"
        );
    }
    let image = out.join("disk.img");
    let pt = block_at(&image, 3000);
    assert!(
        pt.chunks(8).all(|c| c == b"KURA-PT-"),
        "passthrough marker block 3000 is on the image"
    );
    let vf = block_at(&image, 3001);
    assert!(
        vf.chunks(10).all(|c| b"KURA-VFIO-".starts_with(c)),
        "user-space driver marker block 3001 is on the image"
    );
    let fs = std::fs::read(out.join("fs.img")).expect("fs image readable");
    let tag = b"KURA-FS-FILE-3-";
    assert!(
        fs.windows(tag.len()).any(|w| w == tag),
        "AccelFS file data is on the namespace-2 image"
    );
}
