//! NVMe completion status: the 15-bit status field of a CQE decoded into its type (SCT) and code
//! (SC), named, and mapped onto the engine's [`DeviceError`].
//!
//! The mapping keeps what callers act on: a range error stays a range error, an opcode the
//! controller lacks becomes `Unsupported`, an aborted command becomes `ETIMEDOUT`, media and
//! integrity errors `EIO`; the NVMe numbers stay visible in [`NvmeStatus`]'s display.

use kura_engine::{DeviceError, Errno, Opcode};
use std::fmt;

/// Status code types (CQE DW3 bits 27:25).
pub const SCT_GENERIC: u8 = 0;
pub const SCT_COMMAND_SPECIFIC: u8 = 1;
pub const SCT_MEDIA: u8 = 2;
pub const SCT_PATH: u8 = 3;
pub const SCT_VENDOR: u8 = 7;

/// Generic status codes the driver treats specially.
pub const SC_SUCCESS: u8 = 0x00;
pub const SC_INVALID_OPCODE: u8 = 0x01;
pub const SC_INVALID_FIELD: u8 = 0x02;
pub const SC_DATA_TRANSFER_ERROR: u8 = 0x04;
pub const SC_ABORTED_POWER_LOSS: u8 = 0x05;
pub const SC_INTERNAL: u8 = 0x06;
pub const SC_ABORT_REQUESTED: u8 = 0x07;
pub const SC_ABORTED_SQ_DELETED: u8 = 0x08;
pub const SC_INVALID_NAMESPACE: u8 = 0x0b;
pub const SC_LBA_OUT_OF_RANGE: u8 = 0x80;
pub const SC_CAPACITY_EXCEEDED: u8 = 0x81;
pub const SC_NAMESPACE_NOT_READY: u8 = 0x82;
/// Media: unrecovered read error.
pub const SC_UNRECOVERED_READ: u8 = 0x81;
/// Media: write fault.
pub const SC_WRITE_FAULT: u8 = 0x80;

/// A decoded, non-success NVMe status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmeStatus {
    pub sct: u8,
    pub sc: u8,
    /// Do Not Retry: the same command will fail again.
    pub dnr: bool,
    /// More information is in the error log page.
    pub more: bool,
}

impl NvmeStatus {
    /// Decodes the 16-bit status word of a CQE (bit 0 is the phase tag and is ignored).
    /// Returns `None` for success.
    pub fn from_cqe_status(word: u16) -> Option<NvmeStatus> {
        let field = word >> 1;
        let sc = (field & 0xff) as u8;
        let sct = ((field >> 8) & 0x7) as u8;
        if sc == 0 && sct == 0 {
            return None;
        }
        Some(NvmeStatus {
            sct,
            sc,
            more: field & (1 << 13) != 0,
            dnr: field & (1 << 14) != 0,
        })
    }

    /// The 16-bit CQE status word for this status with phase `phase` (for the simulator).
    pub fn to_cqe_status(self, phase: bool) -> u16 {
        let mut field = u16::from(self.sc) | (u16::from(self.sct & 7) << 8);
        if self.more {
            field |= 1 << 13;
        }
        if self.dnr {
            field |= 1 << 14;
        }
        (field << 1) | u16::from(phase)
    }

    /// A generic-type status with DNR set.
    pub fn generic(sc: u8) -> NvmeStatus {
        NvmeStatus {
            sct: SCT_GENERIC,
            sc,
            dnr: true,
            more: false,
        }
    }

    /// What the spec calls this status, where the driver knows it.
    pub fn name(&self) -> &'static str {
        match (self.sct, self.sc) {
            (SCT_GENERIC, SC_INVALID_OPCODE) => "invalid command opcode",
            (SCT_GENERIC, SC_INVALID_FIELD) => "invalid field in command",
            (SCT_GENERIC, SC_DATA_TRANSFER_ERROR) => "data transfer error",
            (SCT_GENERIC, SC_ABORTED_POWER_LOSS) => "aborted due to power loss",
            (SCT_GENERIC, SC_INTERNAL) => "internal error",
            (SCT_GENERIC, SC_ABORT_REQUESTED) => "command abort requested",
            (SCT_GENERIC, SC_ABORTED_SQ_DELETED) => "aborted: SQ deleted",
            (SCT_GENERIC, SC_INVALID_NAMESPACE) => "invalid namespace or format",
            (SCT_GENERIC, SC_LBA_OUT_OF_RANGE) => "LBA out of range",
            (SCT_GENERIC, SC_CAPACITY_EXCEEDED) => "capacity exceeded",
            (SCT_GENERIC, SC_NAMESPACE_NOT_READY) => "namespace not ready",
            (SCT_MEDIA, SC_WRITE_FAULT) => "write fault",
            (SCT_MEDIA, SC_UNRECOVERED_READ) => "unrecovered read error",
            (SCT_MEDIA, _) => "media or data integrity error",
            (SCT_COMMAND_SPECIFIC, _) => "command specific error",
            (SCT_PATH, _) => "path related error",
            (SCT_VENDOR, _) => "vendor specific error",
            _ => "unknown status",
        }
    }

    /// The engine error for a data command (`op` over `blocks` blocks at `lba`, in engine
    /// blocks) that completed with this status on a device of `capacity_blocks`.
    pub fn to_device_error(
        self,
        op: Opcode,
        lba: u64,
        blocks: u64,
        capacity_blocks: u64,
    ) -> DeviceError {
        let errno = match (self.sct, self.sc) {
            (SCT_GENERIC, SC_LBA_OUT_OF_RANGE | SC_CAPACITY_EXCEEDED) => {
                return DeviceError::OutOfRange {
                    op,
                    lba,
                    blocks,
                    capacity_blocks,
                }
            }
            (SCT_GENERIC, SC_INVALID_OPCODE) => {
                return DeviceError::Unsupported {
                    op,
                    backend: "nvme",
                }
            }
            (SCT_GENERIC, SC_INVALID_FIELD | SC_INVALID_NAMESPACE) => libc::EINVAL,
            (SCT_GENERIC, SC_ABORT_REQUESTED | SC_ABORTED_SQ_DELETED) => libc::ETIMEDOUT,
            (SCT_GENERIC, SC_NAMESPACE_NOT_READY) => libc::EAGAIN,
            (SCT_PATH, _) => libc::ENOLINK,
            _ => libc::EIO,
        };
        DeviceError::Io {
            op,
            lba,
            errno: Errno(errno),
        }
    }
}

impl fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (SCT {:#x}, SC {:#04x}{})",
            self.name(),
            self.sct,
            self.sc,
            if self.dnr { ", do not retry" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_word_round_trips_and_success_is_none() {
        assert_eq!(NvmeStatus::from_cqe_status(0), None);
        assert_eq!(
            NvmeStatus::from_cqe_status(1),
            None,
            "phase bit alone is success"
        );
        for sct in [0u8, 1, 2, 3, 7] {
            for sc in [1u8, 0x80, 0xff] {
                for (dnr, more) in [(false, false), (true, true)] {
                    let s = NvmeStatus { sct, sc, dnr, more };
                    for phase in [false, true] {
                        let w = s.to_cqe_status(phase);
                        assert_eq!(w & 1, u16::from(phase));
                        assert_eq!(NvmeStatus::from_cqe_status(w), Some(s));
                    }
                }
            }
        }
    }

    #[test]
    fn known_bit_pattern_decodes() {
        // LBA out of range with DNR, phase 1: SC 0x80 at bits 8:1, DNR at bit 15.
        let w: u16 = (0x80 << 1) | (1 << 15) | 1;
        let s = NvmeStatus::from_cqe_status(w).unwrap();
        assert_eq!((s.sct, s.sc, s.dnr, s.more), (0, 0x80, true, false));
        assert!(s.to_string().contains("LBA out of range"));
    }

    #[test]
    fn statuses_map_to_engine_errors() {
        let e = NvmeStatus::generic(SC_LBA_OUT_OF_RANGE).to_device_error(Opcode::Read, 9, 2, 10);
        assert!(matches!(
            e,
            DeviceError::OutOfRange {
                lba: 9,
                blocks: 2,
                capacity_blocks: 10,
                ..
            }
        ));
        let e = NvmeStatus::generic(SC_INVALID_OPCODE).to_device_error(Opcode::Discard, 0, 1, 10);
        assert!(matches!(
            e,
            DeviceError::Unsupported {
                op: Opcode::Discard,
                ..
            }
        ));
        let e = NvmeStatus::generic(SC_ABORT_REQUESTED).to_device_error(Opcode::Write, 0, 1, 10);
        assert_eq!(e.errno(), libc::ETIMEDOUT);
        let media = NvmeStatus {
            sct: SCT_MEDIA,
            sc: SC_UNRECOVERED_READ,
            dnr: false,
            more: false,
        };
        assert_eq!(
            media.to_device_error(Opcode::Read, 0, 1, 10).errno(),
            libc::EIO
        );
        assert!(media.to_string().contains("unrecovered read"));
    }
}
