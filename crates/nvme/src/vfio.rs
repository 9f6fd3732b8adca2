//! `nvme:BDF` — a controller bound to `vfio-pci`, driven from user space.
//!
//! Opens the VFIO container and the device's IOMMU group, attaches the group to a type-1 IOMMU,
//! takes the device fd, turns on memory decoding and bus mastering in PCI config space, and maps
//! BAR0 so registers are plain volatile loads and stores. DMA mappings use I/O address = virtual
//! address (the guest harness gives QEMU's intel-iommu 48-bit addresses so user addresses fit).

use crate::bus::Bus;
use crate::error::NvmeError;
use crate::open::{open_queue, queue_spec, CTRL_OPTIONS};
use crate::queue::NvmeQueue;
use kura_engine::{OpenError, Spec};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

const VFIO_TYPE: u64 = b';' as u64;
const fn vfio_io(nr: u64) -> u64 {
    (VFIO_TYPE << 8) | nr
}
const VFIO_GET_API_VERSION: u64 = vfio_io(100);
const VFIO_CHECK_EXTENSION: u64 = vfio_io(101);
const VFIO_SET_IOMMU: u64 = vfio_io(102);
const VFIO_GROUP_GET_STATUS: u64 = vfio_io(103);
const VFIO_GROUP_SET_CONTAINER: u64 = vfio_io(104);
const VFIO_GROUP_GET_DEVICE_FD: u64 = vfio_io(106);
const VFIO_DEVICE_GET_REGION_INFO: u64 = vfio_io(108);
const VFIO_IOMMU_MAP_DMA: u64 = vfio_io(113);
const VFIO_IOMMU_UNMAP_DMA: u64 = vfio_io(114);
const VFIO_API_VERSION: i32 = 0;
const VFIO_TYPE1_IOMMU: u64 = 1;
const VFIO_TYPE1V2_IOMMU: u64 = 3;
const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
const VFIO_DMA_MAP_FLAG_READ: u32 = 1;
const VFIO_DMA_MAP_FLAG_WRITE: u32 = 2;
const BAR0_REGION: u32 = 0;
const CONFIG_REGION: u32 = 7;
/// PCI command register: memory space decoding and bus mastering.
const PCI_COMMAND: u64 = 4;
const PCI_COMMAND_MEMORY_MASTER: u16 = 0x2 | 0x4;

#[repr(C)]
#[derive(Default)]
struct GroupStatus {
    argsz: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

#[repr(C)]
struct DmaMap {
    argsz: u32,
    flags: u32,
    vaddr: u64,
    iova: u64,
    size: u64,
}

#[repr(C)]
struct DmaUnmap {
    argsz: u32,
    flags: u32,
    iova: u64,
    size: u64,
}

/// One PCI function owned through VFIO.
pub struct VfioBus {
    bdf: String,
    bar: *mut u8,
    bar_len: usize,
    _device: OwnedFd,
    _group: OwnedFd,
    container: OwnedFd,
}

// SAFETY: the BAR mapping is device memory accessed only with volatile 32-bit loads/stores, which
// the controller accepts from any thread; the fds are plain kernel handles.
unsafe impl Send for VfioBus {}
// SAFETY: as above; no method mutates Rust-visible state.
unsafe impl Sync for VfioBus {}

fn open_fd(path: &str, flags: i32) -> Result<OwnedFd, NvmeError> {
    let c = CString::new(path).map_err(|_| NvmeError::Invalid(format!("bad path {path}")))?;
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(NvmeError::os(format!("open {path}")));
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Checks `0000:00:04.0`-shaped addresses, so the sysfs paths built from them stay inside sysfs.
fn valid_bdf(bdf: &str) -> bool {
    let b = bdf.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| [4, 7, 10].contains(&i) || c.is_ascii_hexdigit())
}

impl VfioBus {
    /// Opens PCI function `bdf`, which must be bound to vfio-pci.
    pub fn open(bdf: &str) -> Result<VfioBus, NvmeError> {
        if !valid_bdf(bdf) {
            return Err(NvmeError::Invalid(format!(
                "`{bdf}` is not a PCI address like 0000:00:04.0"
            )));
        }
        let link =
            std::fs::read_link(format!("/sys/bus/pci/devices/{bdf}/iommu_group")).map_err(|e| {
                NvmeError::Unsupported(format!(
                    "{bdf} has no IOMMU group ({e}); is the IOMMU on and the device present?"
                ))
            })?;
        let group_no = link
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| NvmeError::Invalid(format!("odd IOMMU group link for {bdf}")))?
            .to_string();
        let driver = std::fs::read_link(format!("/sys/bus/pci/devices/{bdf}/driver")).ok();
        let driver = driver
            .as_ref()
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("none");
        if driver != "vfio-pci" {
            return Err(NvmeError::Unsupported(format!(
                "{bdf} is bound to {driver}, not vfio-pci"
            )));
        }
        let container = open_fd("/dev/vfio/vfio", libc::O_RDWR)?;
        // SAFETY: ioctls without arguments on the container fd.
        let api = unsafe { libc::ioctl(container.as_raw_fd(), VFIO_GET_API_VERSION as _) };
        if api != VFIO_API_VERSION {
            return Err(NvmeError::Unsupported(format!("VFIO API version {api}")));
        }
        // SAFETY: as above, with an integer argument.
        let v2 = unsafe {
            libc::ioctl(
                container.as_raw_fd(),
                VFIO_CHECK_EXTENSION as _,
                VFIO_TYPE1V2_IOMMU,
            )
        } > 0;
        // SAFETY: as above.
        let v1 = unsafe {
            libc::ioctl(
                container.as_raw_fd(),
                VFIO_CHECK_EXTENSION as _,
                VFIO_TYPE1_IOMMU,
            )
        } > 0;
        if !v1 && !v2 {
            return Err(NvmeError::Unsupported("no VFIO type-1 IOMMU".into()));
        }
        let group = open_fd(&format!("/dev/vfio/{group_no}"), libc::O_RDWR)?;
        let mut status = GroupStatus {
            argsz: std::mem::size_of::<GroupStatus>() as u32,
            flags: 0,
        };
        // SAFETY: the kernel fills `status`, whose argsz says its size.
        if unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_GET_STATUS as _, &mut status) } < 0 {
            return Err(NvmeError::os("VFIO_GROUP_GET_STATUS"));
        }
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(NvmeError::Unsupported(format!(
                "IOMMU group {group_no} is not viable: bind every device in it to vfio-pci"
            )));
        }
        let cfd = container.as_raw_fd();
        // SAFETY: the argument points at the container fd for the duration of the call.
        if unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_SET_CONTAINER as _, &cfd) } < 0 {
            return Err(NvmeError::os("VFIO_GROUP_SET_CONTAINER"));
        }
        let kind = if v2 {
            VFIO_TYPE1V2_IOMMU
        } else {
            VFIO_TYPE1_IOMMU
        };
        // SAFETY: integer argument.
        if unsafe { libc::ioctl(cfd, VFIO_SET_IOMMU as _, kind) } < 0 {
            return Err(NvmeError::os("VFIO_SET_IOMMU"));
        }
        let name = CString::new(bdf).map_err(|_| NvmeError::Invalid(bdf.into()))?;
        // SAFETY: a NUL-terminated device name; the result is checked.
        let dfd = unsafe {
            libc::ioctl(
                group.as_raw_fd(),
                VFIO_GROUP_GET_DEVICE_FD as _,
                name.as_ptr(),
            )
        };
        if dfd < 0 {
            return Err(NvmeError::os(format!("VFIO_GROUP_GET_DEVICE_FD {bdf}")));
        }
        // SAFETY: a fresh descriptor from the kernel.
        let device = unsafe { OwnedFd::from_raw_fd(dfd) };
        let bar = region_info(&device, BAR0_REGION)?;
        if bar.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || bar.size < 0x2000 {
            return Err(NvmeError::Unsupported(format!(
                "BAR0 of {bdf} cannot be mapped ({} bytes)",
                bar.size
            )));
        }
        let config = region_info(&device, CONFIG_REGION)?;
        enable_bus_master(&device, config.offset)?;
        let bar_len = bar.size as usize;
        // SAFETY: maps the BAR region VFIO offers at `offset` of the device fd; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bar_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                device.as_raw_fd(),
                bar.offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(NvmeError::os("mmap BAR0"));
        }
        Ok(VfioBus {
            bdf: bdf.to_string(),
            bar: ptr.cast(),
            bar_len,
            _device: device,
            _group: group,
            container,
        })
    }
}

fn region_info(device: &OwnedFd, index: u32) -> Result<RegionInfo, NvmeError> {
    let mut info = RegionInfo {
        argsz: std::mem::size_of::<RegionInfo>() as u32,
        index,
        ..RegionInfo::default()
    };
    // SAFETY: the kernel fills `info`, whose argsz says its size.
    if unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            VFIO_DEVICE_GET_REGION_INFO as _,
            &mut info,
        )
    } < 0
    {
        return Err(NvmeError::os(format!(
            "VFIO_DEVICE_GET_REGION_INFO {index}"
        )));
    }
    Ok(info)
}

fn enable_bus_master(device: &OwnedFd, config_offset: u64) -> Result<(), NvmeError> {
    let mut cmd = [0u8; 2];
    let at = (config_offset + PCI_COMMAND) as libc::off_t;
    // SAFETY: reads two bytes into a local buffer.
    if unsafe { libc::pread(device.as_raw_fd(), cmd.as_mut_ptr().cast(), 2, at) } != 2 {
        return Err(NvmeError::os("read PCI command register"));
    }
    let val = u16::from_le_bytes(cmd) | PCI_COMMAND_MEMORY_MASTER;
    let bytes = val.to_le_bytes();
    // SAFETY: writes two bytes from a local buffer.
    if unsafe { libc::pwrite(device.as_raw_fd(), bytes.as_ptr().cast(), 2, at) } != 2 {
        return Err(NvmeError::os("write PCI command register"));
    }
    Ok(())
}

impl Bus for VfioBus {
    fn read32(&self, off: u32) -> u32 {
        if off as usize + 4 > self.bar_len || !off.is_multiple_of(4) {
            return u32::MAX;
        }
        // SAFETY: an aligned offset inside the mapped BAR; device registers need volatile access.
        unsafe { std::ptr::read_volatile(self.bar.add(off as usize).cast::<u32>()) }
    }

    fn write32(&self, off: u32, val: u32) {
        if off as usize + 4 > self.bar_len || !off.is_multiple_of(4) {
            return;
        }
        // SAFETY: as in `read32`.
        unsafe { std::ptr::write_volatile(self.bar.add(off as usize).cast::<u32>(), val) }
    }

    fn map_dma(&self, addr: u64, len: usize) -> Result<(), NvmeError> {
        let map = DmaMap {
            argsz: std::mem::size_of::<DmaMap>() as u32,
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: addr,
            iova: addr,
            size: len as u64,
        };
        // SAFETY: the kernel reads `map`; it pins the pages, which the caller keeps mapped.
        if unsafe { libc::ioctl(self.container.as_raw_fd(), VFIO_IOMMU_MAP_DMA as _, &map) } < 0 {
            return Err(NvmeError::os(format!(
                "VFIO_IOMMU_MAP_DMA {len} bytes at {addr:#x}"
            )));
        }
        Ok(())
    }

    fn unmap_dma(&self, addr: u64, len: usize) {
        let unmap = DmaUnmap {
            argsz: std::mem::size_of::<DmaUnmap>() as u32,
            flags: 0,
            iova: addr,
            size: len as u64,
        };
        // SAFETY: the kernel reads `unmap`; failure leaves the pages pinned, which is only a leak.
        unsafe {
            libc::ioctl(
                self.container.as_raw_fd(),
                VFIO_IOMMU_UNMAP_DMA as _,
                &unmap,
            )
        };
    }

    fn describe(&self) -> String {
        self.bdf.clone()
    }
}

impl Drop for VfioBus {
    fn drop(&mut self) {
        // SAFETY: the BAR mapping made in `open`; every user holds an Arc to this bus.
        unsafe { libc::munmap(self.bar.cast(), self.bar_len) };
    }
}

/// Opens `nvme:BDF?…`.
pub fn open(spec: &Spec) -> Result<NvmeQueue, OpenError> {
    spec.check_options(CTRL_OPTIONS)?;
    let q = queue_spec(spec)?;
    let bus: Arc<dyn Bus> = Arc::new(VfioBus::open(spec.require_target()?)?);
    Ok(open_queue(
        bus,
        q.ctrl,
        q.block_size,
        q.queue_depth,
        q.max_transfer,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux() {
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(std::mem::size_of::<RegionInfo>(), 32);
        assert_eq!(std::mem::size_of::<DmaMap>(), 32);
        assert_eq!(std::mem::size_of::<DmaUnmap>(), 24);
    }

    #[test]
    fn addresses_are_checked() {
        assert!(valid_bdf("0000:00:04.0"));
        for bad in ["00:04.0", "0000:00:04.0/../x", "zzzz:00:04.0", ""] {
            assert!(!valid_bdf(bad), "{bad}");
        }
        assert!(matches!(
            VfioBus::open("../etc"),
            Err(NvmeError::Invalid(_))
        ));
    }
}
