//! `kura bench io` inside the NVMe guest (issue 7): one run measures namespace 1 of QEMU's
//! emulated controller through the user-space driver (`nvme:BDF`, the controller lent to
//! vfio-pci for its turn by `--rebind`), io_uring passthrough (`nvme-pt:/dev/ng0n1`) and the
//! block layer (`uring:/dev/nvme0n1`). The test checks that every backend measured every point
//! and that the comparison was made; the figures are emulated and never judged here.
//!
//! Skips visibly where the host cannot boot a guest (see `kura_nvme_guest`). The guest is
//! bounded by `KURA_NVME_VM_TIMEOUT` seconds (default 300).

use std::path::Path;

#[test]
fn bench_io_compares_nvme_passthrough_and_uring_in_the_guest() {
    let limit = kura_nvme_guest::time_limit(300);
    let kura = Path::new(env!("CARGO_BIN_EXE_kura"));
    let run = match kura_nvme_guest::boot_passing(
        "init-bench",
        &[kura],
        limit,
        "kura_bench_args=\"--quick --seconds 0.1\"",
        |run| run.status == Some(0) && run.console.contains("GUEST-RESULT bench rc=0"),
    ) {
        Ok(run) => run,
        // "cannot start run.sh: ..." is a failure; any other Err is run.sh's exit 77 (QEMU, a
        // kernel, busybox-static or cpio not installed).
        Err(why) if why.starts_with("cannot start") => panic!("{why}"),
        Err(why) => {
            return kura_testkit::skip(
                "bench_io_compares_nvme_passthrough_and_uring_in_the_guest",
                "nvme-guest",
                &why,
            )
        }
    };
    eprintln!("{}", run.summary());
    eprintln!("guest run took {:.1} s on the host", run.took.as_secs_f64());
    let log_at = run.dir.join("console.log");
    assert_eq!(
        run.status,
        Some(0),
        "QEMU failed or timed out; log in {}",
        log_at.display()
    );
    assert!(
        run.console.contains("GUEST-RESULT bench rc=0"),
        "kura bench io failed in the guest; log in {}",
        log_at.display()
    );
    let json = run
        .between("GUEST-JSON-BEGIN", "GUEST-JSON-END")
        .expect("the guest printed the JSON report");
    let report: serde_json::Value = serde_json::from_str(json).expect("the report is JSON");
    assert!(report["label"].as_str().unwrap().contains("emulated"));
    let names: Vec<&str> = report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d[0].as_str().unwrap())
        .collect();
    assert_eq!(names, ["nvme", "nvme-pt", "uring"]);
    for name in names {
        let latency: Vec<&serde_json::Value> = report["latency"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["backend"] == name)
            .collect();
        assert_eq!(latency.len(), 9, "{name}: 3 ops × 3 sizes at QD1");
        assert!(latency.iter().all(|l| l["ops"].as_u64().unwrap() > 0));
        let tput: Vec<&serde_json::Value> = report["throughput"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["backend"] == name)
            .collect();
        assert_eq!(
            tput.len(),
            10,
            "{name}: 4 depths × read/write, and sequential"
        );
        assert!(tput.iter().all(|t| t["iops"].as_f64().unwrap() > 0.0));
    }
    let ratios: Vec<&str> = report["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["what"].as_str().unwrap())
        .collect();
    assert!(
        ratios.iter().any(|w| w.contains("nvme/nvme-pt"))
            && ratios.iter().any(|w| w.contains("nvme/uring")),
        "{ratios:?}"
    );
    // `--rebind` gave the controller back: the guest listed it on the kernel's driver again.
    let after = run.console.rsplit("GUEST-JSON-END").next().unwrap_or("");
    assert!(
        after.contains(" nvme "),
        "controller back on nvme after the run"
    );
    let _ = std::fs::remove_dir_all(&run.dir);
}
