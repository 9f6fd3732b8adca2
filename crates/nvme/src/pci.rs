//! Finding NVMe controllers on the PCI bus and moving one between the kernel's `nvme` driver
//! and `vfio-pci` (what `kura nvme list|bind|unbind` needs). All paths hang off a sysfs root
//! and a mounts file given by the caller, so the logic is tested on a fake tree.
//!
//! Binding refuses a controller any of whose namespaces (or their partitions) is mounted:
//! taking the device from the kernel under a mounted file system loses data.

use crate::error::NvmeError;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// PCI class code of an NVM Express controller.
const NVME_CLASS: &str = "0x010802";

/// One NVMe controller as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciNvme {
    pub bdf: String,
    pub vendor: String,
    pub device: String,
    /// Bound driver (`nvme`, `vfio-pci`), or `None`.
    pub driver: Option<String>,
    pub iommu_group: Option<String>,
    /// Namespace block devices while the kernel driver holds it (`nvme0n1`, ...).
    pub namespaces: Vec<String>,
}

/// Where the system's state is read and written.
#[derive(Debug, Clone)]
pub struct Sysfs {
    pub root: PathBuf,
    pub mounts: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs {
            root: PathBuf::from("/sys"),
            mounts: PathBuf::from("/proc/mounts"),
        }
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn link_name(p: &Path) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn write(p: &Path, val: &str) -> Result<(), NvmeError> {
    std::fs::write(p, val).map_err(|e| NvmeError::Os {
        what: format!("write {val:?} to {}", p.display()),
        errno: kura_engine::Errno::from_io(&e),
    })
}

impl Sysfs {
    fn device_dir(&self, bdf: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(bdf)
    }

    /// Every NVMe controller on the PCI bus, sorted by address.
    pub fn list(&self) -> Vec<PciNvme> {
        let Ok(dir) = std::fs::read_dir(self.root.join("bus/pci/devices")) else {
            return Vec::new();
        };
        let mut out: Vec<PciNvme> = dir
            .filter_map(Result::ok)
            .filter_map(|e| {
                let d = e.path();
                (read_trim(&d.join("class")).as_deref() == Some(NVME_CLASS))
                    .then(|| self.describe(&d))
            })
            .collect();
        out.sort_by(|a, b| a.bdf.cmp(&b.bdf));
        out
    }

    fn describe(&self, d: &Path) -> PciNvme {
        let mut namespaces = Vec::new();
        if let Ok(ctrls) = std::fs::read_dir(d.join("nvme")) {
            for c in ctrls.filter_map(Result::ok) {
                if let Ok(entries) = std::fs::read_dir(c.path()) {
                    let cname = c.file_name().to_string_lossy().into_owned();
                    namespaces.extend(
                        entries
                            .filter_map(Result::ok)
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .filter(|n| n.starts_with(&cname) && n[cname.len()..].starts_with('n')),
                    );
                }
            }
        }
        namespaces.sort();
        PciNvme {
            bdf: d
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            vendor: read_trim(&d.join("vendor")).unwrap_or_default(),
            device: read_trim(&d.join("device")).unwrap_or_default(),
            driver: link_name(&d.join("driver")),
            iommu_group: link_name(&d.join("iommu_group")),
            namespaces,
        }
    }

    fn find(&self, bdf: &str) -> Result<PciNvme, NvmeError> {
        self.list()
            .into_iter()
            .find(|c| c.bdf == bdf)
            .ok_or_else(|| NvmeError::Invalid(format!("no NVMe controller at {bdf}")))
    }

    /// Mount points of file systems on `ctrl`'s namespaces or their partitions.
    pub fn mounted(&self, ctrl: &PciNvme) -> Vec<String> {
        let mounts = std::fs::read_to_string(&self.mounts).unwrap_or_default();
        mounts
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let dev = f.next()?.strip_prefix("/dev/")?;
                let at = f.next()?;
                ctrl.namespaces
                    .iter()
                    .any(|ns| {
                        dev == ns
                            || dev
                                .strip_prefix(ns.as_str())
                                .is_some_and(|p| p.starts_with('p'))
                    })
                    .then(|| format!("/dev/{dev} on {at}"))
            })
            .collect()
    }

    /// Moves the controller at `bdf` to `vfio-pci` (or back to the kernel's driver when
    /// `driver` is `None`), waiting up to `timeout` for the new driver to take it.
    pub fn rebind(
        &self,
        bdf: &str,
        driver: Option<&str>,
        timeout: Duration,
    ) -> Result<String, NvmeError> {
        let ctrl = self.find(bdf)?;
        let busy = self.mounted(&ctrl);
        if !busy.is_empty() {
            return Err(NvmeError::Invalid(format!(
                "{bdf} holds mounted file systems ({}); unmount them first",
                busy.join(", ")
            )));
        }
        let dir = self.device_dir(bdf);
        write(&dir.join("driver_override"), driver.unwrap_or("\n"))?;
        if ctrl.driver.is_some() {
            write(&dir.join("driver/unbind"), bdf)?;
        }
        write(&self.root.join("bus/pci/drivers_probe"), bdf)?;
        let start = Instant::now();
        loop {
            let now = link_name(&dir.join("driver"));
            match (now, driver) {
                (Some(d), Some(want)) if d == want => return Ok(d),
                (Some(d), None) => return Ok(d),
                _ if start.elapsed() > timeout => {
                    return Err(NvmeError::Timeout {
                        what: format!(
                            "{bdf} to be bound to {}",
                            driver.unwrap_or("its kernel driver")
                        ),
                        waited: start.elapsed(),
                    })
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake() -> (tempfile::TempDir, Sysfs) {
        let t = tempfile::tempdir().unwrap();
        let dev = t.path().join("sys/bus/pci/devices");
        for (bdf, class) in [
            ("0000:00:04.0", NVME_CLASS),
            ("0000:00:02.0", "0x030000"),
            ("0000:00:05.0", NVME_CLASS),
        ] {
            std::fs::create_dir_all(dev.join(bdf)).unwrap();
            std::fs::write(dev.join(bdf).join("class"), format!("{class}\n")).unwrap();
            std::fs::write(dev.join(bdf).join("vendor"), "0x1b36\n").unwrap();
            std::fs::write(dev.join(bdf).join("device"), "0x0010\n").unwrap();
        }
        let ns = dev.join("0000:00:04.0/nvme/nvme0");
        std::fs::create_dir_all(ns.join("nvme0n1")).unwrap();
        std::fs::create_dir_all(ns.join("power")).unwrap();
        std::fs::create_dir_all(t.path().join("sys/bus/pci/drivers/nvme")).unwrap();
        std::os::unix::fs::symlink(
            t.path().join("sys/bus/pci/drivers/nvme"),
            dev.join("0000:00:04.0/driver"),
        )
        .unwrap();
        let mounts = t.path().join("mounts");
        std::fs::write(
            &mounts,
            "proc /proc proc rw 0 0\n/dev/nvme0n1p2 /data ext4 rw 0 0\n",
        )
        .unwrap();
        let s = Sysfs {
            root: t.path().join("sys"),
            mounts,
        };
        (t, s)
    }

    #[test]
    fn lists_only_nvme_controllers_with_their_namespaces() {
        let (_t, s) = fake();
        let l = s.list();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].bdf, "0000:00:04.0");
        assert_eq!(l[0].driver.as_deref(), Some("nvme"));
        assert_eq!(l[0].namespaces, vec!["nvme0n1".to_string()]);
        assert_eq!(l[1].driver, None);
    }

    #[test]
    fn a_controller_with_a_mounted_partition_is_refused() {
        let (_t, s) = fake();
        let ctrl = s.find("0000:00:04.0").unwrap();
        assert_eq!(
            s.mounted(&ctrl),
            vec!["/dev/nvme0n1p2 on /data".to_string()]
        );
        let err = s
            .rebind("0000:00:04.0", Some("vfio-pci"), Duration::from_millis(10))
            .unwrap_err();
        assert!(err.to_string().contains("mounted"), "{err}");
        assert!(matches!(
            s.rebind("0000:00:09.0", None, Duration::ZERO),
            Err(NvmeError::Invalid(_))
        ));
    }

    #[test]
    fn a_rebind_nobody_completes_times_out() {
        let (_t, s) = fake();
        std::fs::create_dir_all(s.root.join("bus/pci")).unwrap();
        let err = s
            .rebind("0000:00:05.0", Some("vfio-pci"), Duration::from_millis(50))
            .unwrap_err();
        assert!(matches!(err, NvmeError::Timeout { .. }), "{err}");
        let over =
            std::fs::read_to_string(s.device_dir("0000:00:05.0").join("driver_override")).unwrap();
        assert_eq!(over, "vfio-pci");
    }
}
