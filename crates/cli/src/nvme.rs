//! `kura nvme`: find NVMe controllers and move one between the kernel's driver and vfio-pci, so
//! the user-space driver (`nvme:BDF`) can take it; `identify` brings a controller up and prints
//! what Identify reports.

use anyhow::{bail, Context};
use kura_nvme::pci::Sysfs;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, clap::Subcommand)]
pub enum NvmeCommand {
    /// List NVMe controllers on the PCI bus: address, IDs, driver, IOMMU group, namespaces.
    List {
        #[command(flatten)]
        sys: SysArgs,
    },
    /// Bring a controller up with the user-space driver and print what Identify reports
    /// (`nvme:BDF`, bound to vfio-pci; `nvme-sim:SIZE` for the simulated controller).
    Identify { spec: String },
    /// Give a controller to vfio-pci for `nvme:BDF` (root). Refused while any of its namespaces
    /// holds a mounted file system.
    Bind {
        bdf: String,
        #[command(flatten)]
        sys: SysArgs,
        /// Seconds to wait for vfio-pci to take it.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
    },
    /// Give a controller back to the kernel's nvme driver (root).
    Unbind {
        bdf: String,
        #[command(flatten)]
        sys: SysArgs,
        #[arg(long, default_value_t = 10)]
        timeout: u64,
    },
}

#[derive(Debug, clap::Args)]
pub struct SysArgs {
    /// sysfs root (another root for containers and tests).
    #[arg(long, default_value = "/sys")]
    sysfs: PathBuf,
    /// The mount table consulted before binding.
    #[arg(long, default_value = "/proc/mounts")]
    mounts: PathBuf,
}

impl SysArgs {
    fn sysfs(&self) -> Sysfs {
        Sysfs {
            root: self.sysfs.clone(),
            mounts: self.mounts.clone(),
        }
    }
}

pub fn run(cmd: NvmeCommand) -> anyhow::Result<()> {
    match cmd {
        NvmeCommand::List { sys } => {
            let ctrls = sys.sysfs().list();
            if ctrls.is_empty() {
                println!("no NVMe controllers under {}", sys.sysfs.display());
                return Ok(());
            }
            println!(
                "{:<14} {:<13} {:<10} {:<7} namespaces",
                "address", "vendor:device", "driver", "iommu"
            );
            for c in ctrls {
                println!(
                    "{:<14} {:<13} {:<10} {:<7} {}",
                    c.bdf,
                    format!("{}:{}", c.vendor, c.device),
                    c.driver.as_deref().unwrap_or("-"),
                    c.iommu_group.as_deref().unwrap_or("-"),
                    if c.namespaces.is_empty() {
                        "-".to_string()
                    } else {
                        c.namespaces.join(",")
                    }
                );
            }
            Ok(())
        }
        NvmeCommand::Identify { spec } => {
            let parsed = kura_engine::Spec::parse(&spec)
                .with_context(|| format!("`{spec}` (see `kura specs`)"))?;
            let queue = match parsed.kind.as_str() {
                "nvme-sim" => kura_nvme::open_sim(&parsed)?.0,
                "nvme" => kura_nvme::vfio::open(&parsed)?,
                other => bail!("`{other}` is not a controller kura drives itself (use nvme:BDF or nvme-sim:SIZE)"),
            };
            let i = queue.info();
            println!("model:          {}", i.model);
            println!("serial:         {}", i.serial);
            println!("firmware:       {}", i.firmware);
            println!(
                "NVMe version:   {}.{}.{}",
                i.version.0, i.version.1, i.version.2
            );
            println!(
                "max transfer:   {}",
                i.max_transfer
                    .map_or("unlimited".to_string(), |b| format!("{b} bytes"))
            );
            println!("namespaces:     {}", i.namespaces);
            println!("I/O queues:     {}", i.io_queues);
            println!("write cache:    {}", i.volatile_write_cache);
            println!(
                "commands:       dataset management {}, write zeroes {}",
                i.has_dsm(),
                i.has_write_zeroes()
            );
            println!(
                "namespace {}:    {} blocks of {} bytes ({} bytes){}",
                i.ns.nsid,
                i.ns.blocks,
                i.ns.lba_size,
                i.ns.blocks * u64::from(i.ns.lba_size),
                if i.ns.deallocated_reads_zero {
                    ", deallocated blocks read as zeroes"
                } else {
                    ""
                }
            );
            Ok(())
        }
        NvmeCommand::Bind { bdf, sys, timeout } => {
            let d = sys
                .sysfs()
                .rebind(&bdf, Some("vfio-pci"), Duration::from_secs(timeout))?;
            println!("{bdf}: bound to {d}; open it as nvme:{bdf}");
            Ok(())
        }
        NvmeCommand::Unbind { bdf, sys, timeout } => {
            let d = sys
                .sysfs()
                .rebind(&bdf, None, Duration::from_secs(timeout))?;
            println!("{bdf}: bound to {d}");
            Ok(())
        }
    }
}
