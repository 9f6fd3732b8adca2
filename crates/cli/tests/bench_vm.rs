//! `kura bench vm` in miniature: one round of one 4 KiB QD 32 random-write job, 1 s on each of
//! the guest's five disks (kura vhost-user over file:, snapshot and mirror; QEMU's virtio-blk;
//! NBD). The test checks the JSON's shape: every disk measured in the round, each sample's
//! figures positive and consistent with one another as fio's own output makes them (bandwidth
//! = KiB moved / runtime, IOPS = bandwidth / block size), the ratios computed from those samples,
//! every peer's command line recorded, kura serve stopped cleanly, and the plot drawn where
//! matplotlib is installed. The figures are emulated and never judged.
//!
//! Skips visibly where the host cannot boot a guest (run.sh: no QEMU, kernel, busybox-static or
//! cpio).

use std::process::Command;

const TEST: &str = "bench_vm_measures_every_disk_in_one_guest";

#[test]
fn bench_vm_measures_every_disk_in_one_guest() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("vm.json");
    let png = dir.path().join("vm.png");
    let out = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args(["bench", "vm", "--rounds", "1", "--secs", "1"])
        .args(["--jobs", "randwrite-4k-qd32", "--image-size", "16M"])
        .arg("--dir")
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&png)
        .output()
        .expect("run kura bench vm");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(why) = stderr
        .lines()
        .find_map(|l| l.split("cannot boot a guest here: ").nth(1))
    {
        return kura_testkit::skip(TEST, "nvme-guest", why);
    }
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Progress: each fio run's line while the guest runs, then the table.
    assert!(
        stdout.contains("BENCH round=1 job=randwrite-4k-qd32 disk=kura"),
        "{stdout}"
    );
    assert!(stdout.contains("kura/qemu"), "{stdout}");

    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(r["label"].as_str().unwrap().contains("emulated (TCG)"));
    assert_eq!(r["rounds"], 1);
    assert_eq!(r["serve_stopped_clean"], true, "{r}");
    let disks = ["kura", "qemu", "nbd", "snapshot", "mirror"];
    let samples = r["samples"].as_array().unwrap();
    assert_eq!(samples.len(), disks.len(), "{r}");
    for d in disks {
        let s = samples.iter().find(|s| s["disk"] == d).unwrap();
        assert_eq!(s["job"], "randwrite-4k-qd32");
        let f = |k: &str| s[k].as_f64().unwrap();
        for k in ["io_kib", "kib_s", "iops", "runtime_ms", "lat_us"] {
            assert!(f(k) > 0.0, "{d}: {k} in {s}");
        }
        // fio rounds each figure on its own, so they agree to a few percent.
        let near = |a: f64, b: f64| (a - b).abs() <= 0.05 * b + 2.0;
        assert!(
            near(f("kib_s"), f("io_kib") * 1000.0 / f("runtime_ms")),
            "{s}"
        );
        assert!(near(f("iops") * 4.0, f("kib_s")), "{s}");
        // The fio command the guest ran on this disk.
        let cmd = r["fio"]["randwrite-4k-qd32"][d].as_str().unwrap();
        assert!(
            cmd.starts_with("fio ")
                && cmd.contains("--rw=randwrite")
                && cmd.contains("--iodepth=32")
                && cmd.contains("--direct=1"),
            "{cmd}"
        );
        let cell = r["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["disk"] == d)
            .unwrap();
        assert_eq!(cell["iops"]["median"].as_f64().unwrap(), f("iops"));
    }
    let iops = |d: &str| {
        samples.iter().find(|s| s["disk"] == d).unwrap()["iops"]
            .as_f64()
            .unwrap()
    };
    for (name, num, den) in [
        ("kura/qemu", "kura", "qemu"),
        ("kura/nbd", "kura", "nbd"),
        ("snapshot/kura", "snapshot", "kura"),
        ("mirror/kura", "mirror", "kura"),
    ] {
        let x = r["ratios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .unwrap();
        let got = x["compared"]["ratio"]["median"].as_f64().unwrap();
        assert!((got - iops(num) / iops(den)).abs() < 1e-9, "{name}: {x}");
    }
    // Every peer's command line.
    let qemu = &r["qemu"]["disks"];
    assert!(qemu["qemu"].as_str().unwrap().contains("cache=none"));
    assert!(qemu["qemu"].as_str().unwrap().contains("aio="));
    assert!(qemu["nbd"].as_str().unwrap().contains("driver=nbd"));
    assert!(qemu["kura"]
        .as_str()
        .unwrap()
        .contains("vhost-user-blk-pci"));
    let serve = r["kura_serve"].as_str().unwrap();
    assert!(
        serve.contains("--vhost-user") && serve.contains("mirror(file:"),
        "{serve}"
    );
    let have_matplotlib = Command::new("python3")
        .args(["-c", "import matplotlib"])
        .status()
        .is_ok_and(|s| s.success());
    assert_eq!(png.exists(), have_matplotlib, "{stdout}");
}
