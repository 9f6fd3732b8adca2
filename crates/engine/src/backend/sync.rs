//! `sync:PATH` — the kernel-mediated baseline: each command is plain `pread`/`pwrite`/`fdatasync`
//! performed when it is submitted, through the page cache unless `direct=1`. More queue pairs
//! ([`BlockDevice::new_queue`]) share the open file (and its lock) and the flush poison.

use super::common::{CompletedQueue, QueueOptions, COMMON_OPTIONS};
use super::file::{datasync, pread_exact, pwrite_all, BackingFile, DirectMode};
use crate::device::{BlockDevice, Geometry, Opcode, Request};
use crate::error::{DeviceError, DeviceResult, OpenError};
use crate::spec::Spec;
use crate::split::pieces;
use std::sync::Arc;

/// Options of file-backed backends besides the common ones.
pub const FILE_OPTIONS: &[&str] = &["size", "direct", "ro"];

/// A queue pair whose commands are synchronous system calls.
pub struct SyncDevice {
    /// Shared with the device's other queue pairs; unlocked when the last one is dropped.
    backing: Arc<BackingFile>,
    geo: Geometry,
    queue: CompletedQueue,
}

impl SyncDevice {
    pub fn new(backing: BackingFile, opts: QueueOptions) -> Result<Self, OpenError> {
        backing.check_block_size(opts.block_size)?;
        let geo = opts.geometry(backing.size, backing.buffer_alignment());
        let queue = if backing.read_only() {
            CompletedQueue::read_only()
        } else {
            CompletedQueue::default()
        };
        Ok(SyncDevice {
            backing: Arc::new(backing),
            geo,
            queue,
        })
    }

    fn execute(&self, req: &mut Request) -> DeviceResult<()> {
        let bs = u64::from(self.geo.block_size);
        let io_err = |errno, lba| DeviceError::Io {
            op: req.op,
            lba,
            errno,
        };
        match req.op {
            Opcode::Flush => datasync(&self.backing.file).map_err(|e| io_err(e, 0)),
            Opcode::WriteZeroes => self
                .backing
                .zero_range(req.lba * bs, req.blocks * bs)
                .map_err(|e| io_err(e, req.lba)),
            Opcode::Discard => self
                .backing
                .discard(req.lba * bs, req.blocks * bs)
                .map_err(|e| io_err(e, req.lba)),
            Opcode::Read | Opcode::Write => {
                let op = req.op;
                let Some(buf) = req.buf.as_mut() else {
                    return Err(DeviceError::BadBuffer {
                        op,
                        blocks: req.blocks,
                        need: req.blocks * bs,
                        have: 0,
                    });
                };
                for p in pieces(
                    req.lba,
                    req.blocks,
                    u64::from(self.geo.max_transfer_blocks()),
                    self.geo.block_size,
                ) {
                    let range = p.buf_offset..p.buf_offset + (p.blocks * bs) as usize;
                    let result = if op == Opcode::Read {
                        pread_exact(&self.backing.file, &mut buf[range], p.lba * bs)
                    } else {
                        pwrite_all(&self.backing.file, &buf[range], p.lba * bs)
                    };
                    result.map_err(|errno| DeviceError::Io {
                        op,
                        lba: p.lba,
                        errno,
                    })?;
                }
                Ok(())
            }
        }
    }
}

impl BlockDevice for SyncDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn stats(&self, out: &mut Vec<crate::DriveStats>) {
        out.push(crate::DriveStats::new("sync"));
    }

    fn allocation(
        &mut self,
        lba: u64,
        blocks: u64,
    ) -> DeviceResult<Option<Vec<crate::device::Extent>>> {
        self.backing.device_allocation(&self.geo, lba, blocks)
    }

    fn describe(&self) -> String {
        format!(
            "sync:{}{}",
            self.backing.path,
            if self.backing.direct {
                " (O_DIRECT)"
            } else {
                ""
            }
        )
    }

    fn new_queue(&self) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
        Some(Ok(Box::new(SyncDevice {
            backing: Arc::clone(&self.backing),
            geo: self.geo,
            queue: self.queue.sibling(),
        })))
    }

    crate::completed_queue_methods!(queue, execute);
}

/// Opens `sync:PATH[?size=N&direct=0|1&ro=0|1]`.
pub fn open(spec: &Spec) -> Result<SyncDevice, OpenError> {
    let allowed: Vec<&str> = COMMON_OPTIONS.iter().chain(FILE_OPTIONS).copied().collect();
    spec.check_options(&allowed)?;
    let opts = QueueOptions::from_spec(spec)?;
    let direct = DirectMode::from_flag(spec.bool_option("direct")?, DirectMode::Off);
    let backing = BackingFile::open_spec(spec, direct)?;
    SyncDevice::new(backing, opts)
}
