//! The guest test: boots QEMU (TCG, q35, emulated Intel IOMMU, emulated NVMe controller) with
//! Debian's kernel and an initramfs holding busybox and `kura-nvme-guest`, which runs the
//! passthrough tests on `/dev/ng0n1`, then rebinds the controller to vfio-pci and runs the
//! user-space driver's tests (see `src/main.rs` and `scripts/nvme-vm/`).
//! Afterwards the host reads the marker blocks both backends wrote from the disk image, and finds
//! the AccelFS files' data on the second namespace's image.
//!
//! Skips visibly where QEMU, a kernel with modules, busybox-static or cpio are missing. The
//! guest is bounded by `KURA_NVME_VM_TIMEOUT` seconds (default 240).

use std::path::Path;

fn block_at(image: &Path, block: u64) -> Vec<u8> {
    let data = std::fs::read(image).expect("disk image readable");
    let at = (block * 4096) as usize;
    data[at..at + 4096].to_vec()
}

#[test]
fn guest_runs_passthrough_and_vfio_driver() {
    let limit = kura_nvme_guest::time_limit(240);
    let guest_bin = Path::new(env!("CARGO_BIN_EXE_kura-nvme-guest"));
    let passed = |run: &kura_nvme_guest::GuestRun| {
        run.status == Some(0)
            && !run.console.contains("FAIL ")
            && run.console.contains("GUEST-RESULT pt pass")
            && run.console.contains("GUEST-RESULT vfio pass")
    };
    let run = match kura_nvme_guest::boot_passing("init", &[guest_bin], limit, "", passed) {
        Ok(run) => run,
        // `boot` fails with "cannot start run.sh: ..." when the script itself cannot run: that
        // is a failure. Any other Err is run.sh's exit 77: QEMU, a kernel, busybox-static or cpio
        // is not installed.
        Err(why) if why.starts_with("cannot start") => panic!("{why}"),
        Err(why) => {
            return kura_testkit::skip("guest_runs_passthrough_and_vfio_driver", "nvme-guest", &why)
        }
    };
    let log = &run.console;
    let out = &run.dir;
    eprintln!("{}", run.summary());
    eprintln!("guest run took {:.1} s on the host", run.took.as_secs_f64());
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
    let _ = std::fs::remove_dir_all(out);
}
