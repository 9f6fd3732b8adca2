//! The guest test: boots QEMU (TCG, q35, emulated Intel IOMMU, emulated NVMe controller) with
//! Debian's kernel and an initramfs holding busybox and `kura-nvme-guest`, which runs the
//! passthrough tests on `/dev/ng0n1`, then rebinds the controller to vfio-pci and runs the
//! user-space driver's tests (see `src/bin/kura-nvme-guest.rs` and `scripts/nvme-vm/`).
//! Afterwards the host reads the marker blocks both backends wrote from the disk image, and finds
//! the AccelFS files' data on the second namespace's image.
//!
//! Skips visibly where QEMU, a kernel with modules, busybox-static or cpio are missing. The
//! guest is bounded by `KURA_NVME_VM_TIMEOUT` seconds (default 240).

use std::path::{Path, PathBuf};
use std::process::Command;

fn missing_tools() -> Option<String> {
    for tool in ["qemu-system-x86_64", "cpio", "gzip", "modprobe"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} not found (apt: qemu-system-x86 cpio kmod)"));
        }
    }
    if !Path::new("/bin/busybox").exists() {
        return Some("/bin/busybox missing (apt: busybox-static)".into());
    }
    let kver = std::fs::read_dir("/lib/modules")
        .ok()
        .and_then(|d| d.filter_map(Result::ok).map(|e| e.file_name()).max());
    match kver {
        Some(k) if Path::new(&format!("/boot/vmlinuz-{}", k.to_string_lossy())).exists() => None,
        _ => Some("no /boot/vmlinuz-* with /lib/modules (apt: linux-image-amd64)".into()),
    }
}

fn block_at(image: &Path, block: u64) -> Vec<u8> {
    let data = std::fs::read(image).expect("disk image readable");
    let at = (block * 4096) as usize;
    data[at..at + 4096].to_vec()
}

#[test]
fn guest_runs_passthrough_and_vfio_driver() {
    if let Some(why) = missing_tools() {
        eprintln!("SKIPPED: NVMe guest test: {why}");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out: PathBuf = std::env::temp_dir().join(format!("kura-nvme-vm-{}", std::process::id()));
    let limit = std::env::var("KURA_NVME_VM_TIMEOUT").unwrap_or_else(|_| "240".into());
    let t = std::time::Instant::now();
    let status = Command::new(root.join("scripts/nvme-vm/run.sh"))
        .arg(&out)
        .arg(env!("CARGO_BIN_EXE_kura-nvme-guest"))
        .arg(&limit)
        .status()
        .expect("run.sh starts");
    let log = std::fs::read_to_string(out.join("console.log")).unwrap_or_default();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["PASS", "FAIL", "COST", "GUEST", "qemu rc"]
                .iter()
                .any(|p| l.contains(p))
        })
        .collect();
    eprintln!("{}", lines.join("\n"));
    eprintln!(
        "guest run took {:.1} s on the host",
        t.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "QEMU failed or timed out ({status}); log in {}",
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
    for step in [
        "vfio model bs=512",
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
        "pt model",
    ] {
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
    let _ = std::fs::remove_dir_all(&out);
}
