//! `nvme-pt:/dev/ngXnY` — NVMe passthrough through io_uring: each command is an
//! `IORING_OP_URING_CMD` (128-byte SQE, 32-byte CQE) carrying a raw NVMe command to the
//! namespace's generic character device, so reads and writes skip the block layer while the
//! kernel's driver keeps the controller.
//!
//! Geometry comes from the matching block device in sysfs (`ngXnY` ↔ `nvmeXnY`). A positive
//! CQE result is the NVMe status, decoded like the user-space driver's; a negative one an errno.
//! Discard is Write Zeroes with deallocate, which (unlike DSM) guarantees zeroes on read.

use crate::cmd::{command_pieces, io, Sqe};
use crate::open::queue_spec;
use crate::prp;
use crate::status::NvmeStatus;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use kura_engine::backend::common::hand_over;
use kura_engine::poison::FlushPoison;
use kura_engine::split::SplitParent;
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Errno, Geometry, Opcode, OpenError,
    Rejected, Request, Spec,
};
use std::collections::VecDeque;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `NVME_URING_CMD_IO` = `_IOWR('N', 0x80, struct nvme_uring_cmd)` (72 bytes).
const NVME_URING_CMD_IO: u32 = 0xc048_4e80;
/// `NVME_IOCTL_ID` = `_IO('N', 0x40)`: the namespace id of an NVMe device node.
const NVME_IOCTL_ID: u64 = 0x4e40;

/// Packs an NVMe command into `struct nvme_uring_cmd` (data at `addr`, `len` bytes).
fn uring_cmd(s: &Sqe, addr: u64, len: u32) -> [u8; 80] {
    let mut b = [0u8; 80];
    b[0] = s.opcode;
    b[4..8].copy_from_slice(&s.nsid.to_le_bytes());
    b[24..32].copy_from_slice(&addr.to_le_bytes());
    b[36..40].copy_from_slice(&len.to_le_bytes());
    for (i, d) in s.cdw.iter().enumerate() {
        b[40 + 4 * i..44 + 4 * i].copy_from_slice(&d.to_le_bytes());
    }
    b
}

/// An io_uring passthrough queue on one NVMe namespace.
pub struct NvmePt {
    path: String,
    fd: OwnedFd,
    ring: IoUring<squeue::Entry128, cqueue::Entry32>,
    nsid: u32,
    geo: Geometry,
    lba_size: u64,
    shift: u32,
    slots: Vec<Option<SplitParent>>,
    free: Vec<usize>,
    backlog: VecDeque<(usize, Sqe, u64, u32)>,
    submitted: usize,
    ring_entries: usize,
    done: Vec<Completion>,
    in_flight: usize,
    poison: FlushPoison,
}

fn sysfs_u64(path: &str) -> Result<u64, OpenError> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| OpenError::Invalid(format!("cannot read {path}")))
}

impl NvmePt {
    pub fn open(spec: &Spec) -> Result<NvmePt, OpenError> {
        spec.check_options(&["bs", "qd", "max_transfer"])?;
        let path = spec.require_target()?.to_string();
        let name = path.rsplit('/').next().unwrap_or("");
        let block = name
            .strip_prefix("ng")
            .map(|rest| format!("nvme{rest}"))
            .ok_or_else(|| {
                OpenError::Invalid(format!("{path}: not an NVMe generic device (/dev/ngXnY)"))
            })?;
        let c = CString::new(path.clone()).map_err(|_| OpenError::Invalid(path.clone()))?;
        // SAFETY: NUL-terminated path; result checked.
        let raw = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(OpenError::Os {
                path,
                errno: Errno::last(),
            });
        }
        // SAFETY: a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an argument-less ioctl on our fd.
        let nsid = unsafe { libc::ioctl(fd.as_raw_fd(), NVME_IOCTL_ID as _) };
        if nsid <= 0 {
            return Err(OpenError::Os {
                path,
                errno: Errno::last(),
            });
        }
        let lba_size = sysfs_u64(&format!("/sys/block/{block}/queue/logical_block_size"))?;
        let sectors = sysfs_u64(&format!("/sys/block/{block}/size"))?;
        let max_kb =
            sysfs_u64(&format!("/sys/block/{block}/queue/max_hw_sectors_kb")).unwrap_or(128);
        // The kernel maps a passthrough buffer page by page into one request, so a transfer may
        // not span more pages than the queue's segment limit (a 4-byte-aligned buffer can start
        // mid-page, hence one page less).
        let max_segments = sysfs_u64(&format!("/sys/block/{block}/queue/max_segments"))
            .unwrap_or(32)
            .max(2);
        let q = queue_spec(spec)?;
        let bs = u64::from(q.block_size.unwrap_or(lba_size as u32));
        if bs < lba_size || !bs.is_power_of_two() || lba_size == 0 {
            return Err(OpenError::Invalid(format!(
                "{spec}: bs {bs} must be a power of two ≥ the namespace's {lba_size}"
            )));
        }
        let cmd_bytes = (max_kb * 1024)
            .min((max_segments - 1) * 4096)
            .min(u64::from(q.max_transfer))
            .min(prp::MAX_PRP_TRANSFER as u64)
            / bs
            * bs;
        if cmd_bytes == 0 {
            return Err(OpenError::Invalid(format!(
                "{spec}: max transfer below one block"
            )));
        }
        let entries = q.queue_depth.clamp(8, 1024).next_power_of_two();
        let ring = IoUring::<squeue::Entry128, cqueue::Entry32>::builder()
            .build(entries)
            .map_err(|e| OpenError::Unavailable {
                backend: "nvme-pt",
                feature: "io_uring with 128-byte SQEs".into(),
                why: e.to_string(),
            })?;
        Ok(NvmePt {
            path,
            fd,
            ring,
            nsid: nsid as u32,
            geo: Geometry {
                block_size: bs as u32,
                num_blocks: sectors * 512 / bs,
                max_transfer: cmd_bytes as u32,
                queue_depth: q.queue_depth,
                buffer_alignment: 4,
            },
            lba_size,
            shift: (bs / lba_size).trailing_zeros(),
            slots: Vec::new(),
            free: Vec::new(),
            backlog: VecDeque::new(),
            submitted: 0,
            ring_entries: entries as usize,
            done: Vec::new(),
            in_flight: 0,
            poison: FlushPoison::default(),
        })
    }

    fn plan(&mut self, req: Request) {
        let slba = req.lba << self.shift;
        let nlbs = req.blocks << self.shift;
        let op = req.op;
        let addr = req.buf.as_ref().map_or(0, |b| b.as_ptr() as u64);
        let max_lbas = u64::from(self.geo.max_transfer) / self.lba_size;
        let parts = command_pieces(op, slba, nlbs, max_lbas, self.lba_size as u32);
        let mut cmds = Vec::new();
        for piece in parts {
            let (lba, nlb) = (piece.lba, piece.blocks as u32);
            let (sqe, a, len) = match op {
                Opcode::Flush => (Sqe::new(io::FLUSH, self.nsid), 0, 0),
                Opcode::Read | Opcode::Write => {
                    let opc = if op == Opcode::Read {
                        io::READ
                    } else {
                        io::WRITE
                    };
                    (
                        Sqe::rw(opc, self.nsid, lba, nlb, 0, 0),
                        addr + piece.buf_offset as u64,
                        (piece.blocks * self.lba_size) as u32,
                    )
                }
                Opcode::WriteZeroes => (Sqe::write_zeroes(self.nsid, lba, nlb, false), 0, 0),
                // Write Zeroes with DEAC: deallocates and, unlike DSM, guarantees zeroes.
                Opcode::Discard => (Sqe::write_zeroes(self.nsid, lba, nlb, true), 0, 0),
            };
            cmds.push((sqe, a, len));
        }
        let slot = SplitParent::new(req, cmds.len());
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        for (sqe, a, len) in cmds {
            self.backlog.push_back((idx, sqe, a, len));
        }
    }

    fn feed(&mut self) -> DeviceResult<()> {
        let fd = types::Fd(self.fd.as_raw_fd());
        let mut pushed = false;
        {
            let mut sq = self.ring.submission();
            while let Some(&(slot, sqe, addr, len)) = self.backlog.front() {
                // Never more in the kernel than the completion ring holds.
                if self.submitted >= self.ring_entries {
                    break;
                }
                let entry = opcode::UringCmd80::new(fd, NVME_URING_CMD_IO)
                    .cmd(uring_cmd(&sqe, addr, len))
                    .build()
                    .user_data(slot as u64);
                // SAFETY: the buffer  stays owned by the
                // slot, untouched, until this command's completion is reaped.
                if unsafe { sq.push(&entry) }.is_err() {
                    break;
                }
                self.backlog.pop_front();
                self.submitted += 1;
                pushed = true;
            }
        }
        if pushed {
            self.ring.submit().map_err(|e| DeviceError::Offline {
                reason: format!("io_uring_enter: {e}"),
            })?;
        }
        Ok(())
    }

    fn finish_part(&mut self, slot: usize, status: DeviceResult<()>) {
        let Some(s) = self.slots[slot].as_mut() else {
            return;
        };
        if !s.piece_done(status) {
            return;
        }
        let Some(s) = self.slots[slot].take() else {
            return;
        };
        self.free.push(slot);
        let c = s.into_completion();
        self.poison.observe(c.op, &c.status);
        self.done.push(c);
    }

    fn reap(&mut self) {
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (slot, res) in cqes {
            self.submitted -= 1;
            let slot = slot as usize;
            let status = if res == 0 {
                Ok(())
            } else {
                let (op, lba, blocks) =
                    self.slots[slot].as_ref().map_or((Opcode::Read, 0, 0), |s| {
                        let r = s.request();
                        (r.op, r.lba, r.blocks)
                    });
                if res < 0 {
                    Err(DeviceError::Io {
                        op,
                        lba,
                        errno: Errno(-res),
                    })
                } else {
                    let st = NvmeStatus::from_cqe_status((res as u16) << 1)
                        .unwrap_or(NvmeStatus::generic(0x06));
                    Err(st.to_device_error(op, lba, blocks, self.geo.num_blocks))
                }
            };
            self.finish_part(slot, status);
        }
    }
}

impl BlockDevice for NvmePt {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        out.push(kura_engine::DriveStats::new("nvme-pt"));
    }

    fn describe(&self) -> String {
        format!("nvme-pt:{}", self.path)
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.in_flight)?;
        self.in_flight += 1;
        if let Err(e) = self.poison.check(req.op) {
            self.done.push(Completion::of(req, Err(e)));
            return Ok(());
        }
        self.plan(req);
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.feed()
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let want = min_complete.min(self.in_flight);
        let mut got = 0;
        loop {
            self.feed()?;
            self.reap();
            got += hand_over(self.done.drain(..), out, &mut self.in_flight);
            if got >= want {
                return Ok(got);
            }
            if self.submitted > 0 {
                self.ring
                    .submit_and_wait(1)
                    .map_err(|e| DeviceError::Offline {
                        reason: format!("io_uring_enter: {e}"),
                    })?;
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

/// Opens `nvme-pt:/dev/ngXnY?…`.
pub fn open(spec: &Spec) -> Result<NvmePt, OpenError> {
    NvmePt::open(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uring_cmd_layout() {
        let s = Sqe::rw(io::READ, 1, 0x10, 8, 0, 0);
        let b = uring_cmd(&s, 0xabc000, 4096);
        assert_eq!(b[0], io::READ);
        assert_eq!(&b[4..8], &1u32.to_le_bytes());
        assert_eq!(&b[24..32], &0xabc000u64.to_le_bytes());
        assert_eq!(&b[36..40], &4096u32.to_le_bytes());
        assert_eq!(&b[40..44], &0x10u32.to_le_bytes());
        assert_eq!(&b[48..52], &7u32.to_le_bytes());
    }

    #[test]
    fn non_generic_devices_are_refused() {
        let spec = Spec::parse("nvme-pt:/dev/sda").unwrap();
        assert!(matches!(NvmePt::open(&spec), Err(OpenError::Invalid(_))));
    }
}
