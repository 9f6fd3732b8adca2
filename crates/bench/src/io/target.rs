//! What one `kura bench io` run measures: each backend over the shared temp image (the default),
//! or the devices named with `--device` (an NVMe namespace through `nvme:`, `nvme-pt:` or
//! `uring:`, a partition, any spec). A target knows which file or block device to evict from the
//! page cache between points, and whether its controller must be lent to vfio-pci for its turn.

use anyhow::Context;
use kura_nvme::pci::Sysfs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a controller may take to change drivers, and a namespace node to appear after.
const DRIVER_WAIT: Duration = Duration::from_secs(10);

/// One device to measure.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its name in tables, the JSON and the plot.
    pub name: String,
    pub spec: String,
    /// A regular file or block device whose page cache is dropped before each point.
    pub evict: Option<PathBuf>,
    /// A modeled link (`redirect-modeled`): its numbers are labelled as such.
    pub modeled: bool,
    /// Every queue depth of the plan, not just QD1 and QD32.
    pub full_sweep: bool,
    /// PCI address of a controller to give to vfio-pci for this target's turn (`--rebind`).
    pub rebind: Option<String>,
}

/// The default run's targets: each backend over the temp image `image`.
pub fn image_targets(backends: &[&str], image: &Path) -> Vec<Target> {
    let p = image.display();
    backends
        .iter()
        .filter(|b| **b != "null")
        .map(|&b| Target {
            name: b.to_string(),
            spec: match b {
                "redirect-modeled" => format!("redirect:{p}?link=aurora"),
                other => format!("{other}:{p}"),
            },
            evict: Some(image.to_path_buf()),
            modeled: b == "redirect-modeled",
            full_sweep: b == "uring",
            rebind: None,
        })
        .collect()
}

/// Targets for `--device` specs, named by their kind (`nvme`, `nvme-pt`, `uring`...), with a
/// `#2` suffix where a kind repeats. With `rebind`, each `nvme:BDF` is lent to vfio-pci.
pub fn device_targets(specs: &[String], rebind: bool) -> anyhow::Result<Vec<Target>> {
    let mut out: Vec<Target> = Vec::new();
    for spec in specs {
        let (kind, target) = if spec.starts_with("nbd://") {
            ("nbd".to_string(), None)
        } else {
            let parsed = kura_engine::Spec::parse(spec)
                .with_context(|| format!("--device `{spec}` (see `kura specs`)"))?;
            (parsed.kind.clone(), parsed.target.clone())
        };
        let repeats = out
            .iter()
            .filter(|t| t.name.split('#').next() == Some(kind.as_str()))
            .count();
        let name = if repeats == 0 {
            kind.clone()
        } else {
            format!("{kind}#{}", repeats + 1)
        };
        let evict = target
            .as_deref()
            .map(PathBuf::from)
            .filter(|p| has_page_cache(p));
        out.push(Target {
            name,
            spec: spec.clone(),
            evict,
            modeled: spec.contains("link="),
            full_sweep: true,
            rebind: (rebind && kind == "nvme").then(|| target.unwrap_or_default()),
        });
    }
    Ok(out)
}

/// Regular files and block devices have a page cache; character devices (`/dev/ngXnY`) and
/// PCI addresses do not.
fn has_page_cache(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() || m.file_type().is_block_device())
        .unwrap_or(false)
}

/// Waits (bounded) for a `/dev` node the spec names: after a controller comes back to the
/// kernel's driver its namespaces appear a moment later.
pub fn wait_for_node(spec: &str) {
    let Some(path) = kura_engine::Spec::parse(spec)
        .ok()
        .and_then(|s| s.target)
        .filter(|t| t.starts_with("/dev/"))
    else {
        return;
    };
    let start = Instant::now();
    while !Path::new(&path).exists() && start.elapsed() < DRIVER_WAIT {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A controller held on vfio-pci for one target's turn; given back to the kernel's driver by
/// [`VfioLease::give_back`], or on drop when a point failed.
pub struct VfioLease {
    bdf: String,
    sysfs: Sysfs,
    returned: bool,
}

impl VfioLease {
    /// Moves `bdf` to vfio-pci unless it is there already (then there is nothing to give back).
    pub fn take(bdf: &str) -> anyhow::Result<Option<VfioLease>> {
        let sysfs = Sysfs::default();
        let ctrl = sysfs
            .list()
            .into_iter()
            .find(|c| c.bdf == bdf)
            .with_context(|| format!("--rebind: no NVMe controller at {bdf}"))?;
        if ctrl.driver.as_deref() == Some("vfio-pci") {
            return Ok(None);
        }
        sysfs
            .rebind(bdf, Some("vfio-pci"), DRIVER_WAIT)
            .with_context(|| format!("--rebind: giving {bdf} to vfio-pci"))?;
        Ok(Some(VfioLease {
            bdf: bdf.to_string(),
            sysfs,
            returned: false,
        }))
    }

    /// Gives the controller back to the kernel's driver and waits for its namespaces.
    pub fn give_back(mut self) -> anyhow::Result<()> {
        self.returned = true;
        self.release()
    }

    fn release(&self) -> anyhow::Result<()> {
        self.sysfs
            .rebind(&self.bdf, None, DRIVER_WAIT)
            .with_context(|| format!("--rebind: giving {} back to its driver", self.bdf))?;
        let start = Instant::now();
        while start.elapsed() < DRIVER_WAIT {
            let ready = self
                .sysfs
                .list()
                .iter()
                .any(|c| c.bdf == self.bdf && !c.namespaces.is_empty());
            if ready {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        anyhow::bail!(
            "--rebind: {} is back on its driver but shows no namespaces after {DRIVER_WAIT:?}",
            self.bdf
        )
    }
}

impl Drop for VfioLease {
    fn drop(&mut self) {
        if !self.returned {
            if let Err(e) = self.release() {
                eprintln!("warning: {e:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_targets_are_named_by_kind_and_evict_only_what_has_a_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        std::fs::write(&img, vec![0u8; 4096]).unwrap();
        let specs = vec![
            format!("uring:{}", img.display()),
            format!("uring:{}", img.display()),
            "nvme:0000:00:04.0".to_string(),
            "mem:16M".to_string(),
        ];
        let t = device_targets(&specs, true).unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["uring", "uring#2", "nvme", "mem"]);
        assert_eq!(t[0].evict.as_deref(), Some(img.as_path()));
        assert!(t[2].evict.is_none() && t[3].evict.is_none());
        assert_eq!(t[2].rebind.as_deref(), Some("0000:00:04.0"));
        assert!(t[0].rebind.is_none());
        assert!(device_targets(&specs, false).unwrap()[2].rebind.is_none());
        assert!(device_targets(&["no-colon".into()], false).is_err());
    }

    #[test]
    fn image_targets_cover_every_file_backend() {
        let t = image_targets(&["uring", "redirect-modeled", "null"], Path::new("/x.img"));
        assert_eq!(t.len(), 2, "null has no image");
        assert_eq!(t[1].spec, "redirect:/x.img?link=aurora");
        assert!(t[0].full_sweep && !t[1].full_sweep && t[1].modeled);
    }
}
