//! Submission (64 B) and completion (16 B) queue entries, the opcodes the driver issues, and
//! builders for each command. Entries are serialised little-endian byte by byte so the layout
//! does not depend on the host's byte order.

use crate::status::NvmeStatus;
use kura_engine::split::{pieces, CommandSpan};
use kura_engine::Opcode;

/// Admin opcodes.
pub mod admin {
    pub const DELETE_SQ: u8 = 0x00;
    pub const CREATE_SQ: u8 = 0x01;
    pub const DELETE_CQ: u8 = 0x04;
    pub const CREATE_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
}

/// NVM command set opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
}

/// Largest Write Zeroes / DSM range per command, in NVMe blocks (NLB is 16 bits).
pub const MAX_ZERO_LBAS: u64 = 1 << 16;

/// The commands a request of `op` over `nlbs` NVMe blocks (of `lba_size` bytes) at `slba`
/// becomes: reads and writes of at most `max_rw_lbas` blocks each, Write Zeroes and deallocation
/// of at most [`MAX_ZERO_LBAS`], a flush as one command without a range.
pub fn command_pieces(
    op: Opcode,
    slba: u64,
    nlbs: u64,
    max_rw_lbas: u64,
    lba_size: u32,
) -> Vec<CommandSpan> {
    match op {
        Opcode::Flush => vec![CommandSpan {
            lba: 0,
            blocks: 0,
            buf_offset: 0,
        }],
        Opcode::Read | Opcode::Write => pieces(slba, nlbs, max_rw_lbas, lba_size).collect(),
        Opcode::WriteZeroes | Opcode::Discard => {
            pieces(slba, nlbs, MAX_ZERO_LBAS, lba_size).collect()
        }
    }
}

/// Feature identifier: Number of Queues.
pub const FEAT_NUM_QUEUES: u32 = 0x07;
/// Identify CNS values.
pub const CNS_NAMESPACE: u32 = 0x00;
pub const CNS_CONTROLLER: u32 = 0x01;
/// DSM attribute: deallocate.
pub const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;
/// Write Zeroes: deallocate (DEAC, CDW12 bit 25).
pub const WZ_DEAC: u32 = 1 << 25;

pub const SQE_SIZE: usize = 64;
pub const CQE_SIZE: usize = 16;

/// A submission queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sqe {
    pub opcode: u8,
    pub cid: u16,
    pub nsid: u32,
    pub prp1: u64,
    pub prp2: u64,
    /// CDW10..CDW15.
    pub cdw: [u32; 6],
}

impl Sqe {
    pub fn new(opcode: u8, nsid: u32) -> Sqe {
        Sqe {
            opcode,
            nsid,
            ..Sqe::default()
        }
    }

    /// Read or write `nlb` logical blocks at `slba` (nlb ≥ 1; the field holds nlb − 1).
    pub fn rw(opcode: u8, nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Sqe {
        let mut s = Sqe::new(opcode, nsid);
        s.prp1 = prp1;
        s.prp2 = prp2;
        s.cdw[0] = slba as u32;
        s.cdw[1] = (slba >> 32) as u32;
        s.cdw[2] = (nlb - 1) & 0xffff;
        s
    }

    /// Write Zeroes of `nlb` blocks at `slba`, optionally deallocating.
    pub fn write_zeroes(nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Sqe {
        let mut s = Sqe::rw(io::WRITE_ZEROES, nsid, slba, nlb, 0, 0);
        if deallocate {
            s.cdw[2] |= WZ_DEAC;
        }
        s
    }

    /// Dataset Management (deallocate) of `ranges` ranges listed at `prp1`.
    pub fn dsm_deallocate(nsid: u32, ranges: u32, prp1: u64) -> Sqe {
        let mut s = Sqe::new(io::DSM, nsid);
        s.prp1 = prp1;
        s.cdw[0] = ranges - 1;
        s.cdw[1] = DSM_ATTR_DEALLOCATE;
        s
    }

    pub fn identify(cns: u32, nsid: u32, prp1: u64) -> Sqe {
        let mut s = Sqe::new(admin::IDENTIFY, nsid);
        s.prp1 = prp1;
        s.cdw[0] = cns;
        s
    }

    /// Set Features, Number of Queues: ask for `n` I/O submission and completion queues.
    pub fn set_num_queues(n: u16) -> Sqe {
        let mut s = Sqe::new(admin::SET_FEATURES, 0);
        s.cdw[0] = FEAT_NUM_QUEUES;
        let field = u32::from(n - 1);
        s.cdw[1] = field | (field << 16);
        s
    }

    /// Create I/O Completion Queue, physically contiguous, interrupts disabled.
    pub fn create_cq(qid: u16, entries: u16, base: u64) -> Sqe {
        let mut s = Sqe::new(admin::CREATE_CQ, 0);
        s.prp1 = base;
        s.cdw[0] = u32::from(qid) | (u32::from(entries - 1) << 16);
        s.cdw[1] = 1;
        s
    }

    /// Create I/O Submission Queue bound to completion queue `cqid`, physically contiguous.
    pub fn create_sq(qid: u16, entries: u16, base: u64, cqid: u16) -> Sqe {
        let mut s = Sqe::new(admin::CREATE_SQ, 0);
        s.prp1 = base;
        s.cdw[0] = u32::from(qid) | (u32::from(entries - 1) << 16);
        s.cdw[1] = 1 | (u32::from(cqid) << 16);
        s
    }

    pub fn delete_queue(opcode: u8, qid: u16) -> Sqe {
        let mut s = Sqe::new(opcode, 0);
        s.cdw[0] = u32::from(qid);
        s
    }

    /// Abort command `cid` on submission queue `sqid`.
    pub fn abort(sqid: u16, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin::ABORT, 0);
        s.cdw[0] = u32::from(sqid) | (u32::from(cid) << 16);
        s
    }

    /// Starting LBA (CDW10/11).
    pub fn slba(&self) -> u64 {
        u64::from(self.cdw[0]) | (u64::from(self.cdw[1]) << 32)
    }

    /// Number of logical blocks of a read/write/write-zeroes (decoded, ≥ 1).
    pub fn nlb(&self) -> u32 {
        (self.cdw[2] & 0xffff) + 1
    }

    pub fn to_bytes(&self) -> [u8; SQE_SIZE] {
        let mut b = [0u8; SQE_SIZE];
        b[0] = self.opcode;
        b[2..4].copy_from_slice(&self.cid.to_le_bytes());
        b[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        b[24..32].copy_from_slice(&self.prp1.to_le_bytes());
        b[32..40].copy_from_slice(&self.prp2.to_le_bytes());
        for (i, d) in self.cdw.iter().enumerate() {
            b[40 + 4 * i..44 + 4 * i].copy_from_slice(&d.to_le_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8; SQE_SIZE]) -> Sqe {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | (u64::from(u32_at(o + 4)) << 32);
        let mut cdw = [0u32; 6];
        for (i, d) in cdw.iter_mut().enumerate() {
            *d = u32_at(40 + 4 * i);
        }
        Sqe {
            opcode: b[0],
            cid: u16::from_le_bytes([b[2], b[3]]),
            nsid: u32_at(4),
            prp1: u64_at(24),
            prp2: u64_at(32),
            cdw,
        }
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command-specific result (DW0).
    pub result: u32,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    /// Status word: phase tag in bit 0, status field above.
    pub status: u16,
}

impl Cqe {
    pub fn phase(&self) -> bool {
        self.status & 1 == 1
    }

    /// The command's error, or `None` on success.
    pub fn error(&self) -> Option<NvmeStatus> {
        NvmeStatus::from_cqe_status(self.status)
    }

    pub fn to_bytes(&self) -> [u8; CQE_SIZE] {
        let mut b = [0u8; CQE_SIZE];
        b[0..4].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        b[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; CQE_SIZE]) -> Cqe {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        Cqe {
            result: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            sq_head: u16_at(8),
            sq_id: u16_at(10),
            cid: u16_at(12),
            status: u16_at(14),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_layout_matches_the_spec() {
        let mut s = Sqe::rw(io::WRITE, 1, 0x1_2345_6789, 8, 0xdead_b000, 0xbeef_0000);
        s.cid = 0x4242;
        let b = s.to_bytes();
        assert_eq!(b[0], 0x01);
        assert_eq!(&b[2..4], &[0x42, 0x42]);
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        assert_eq!(&b[24..32], &0xdead_b000u64.to_le_bytes());
        assert_eq!(&b[32..40], &0xbeef_0000u64.to_le_bytes());
        assert_eq!(
            &b[40..44],
            &0x2345_6789u32.to_le_bytes(),
            "CDW10 = SLBA low"
        );
        assert_eq!(&b[44..48], &1u32.to_le_bytes(), "CDW11 = SLBA high");
        assert_eq!(&b[48..52], &7u32.to_le_bytes(), "CDW12 = NLB - 1");
        assert_eq!(Sqe::from_bytes(&b), s);
        assert_eq!(s.slba(), 0x1_2345_6789);
        assert_eq!(s.nlb(), 8);
    }

    #[test]
    fn cqe_layout_matches_the_spec() {
        let c = Cqe {
            result: 0x0003_0007,
            sq_head: 5,
            sq_id: 2,
            cid: 9,
            status: 1,
        };
        let b = c.to_bytes();
        assert_eq!(&b[8..10], &[5, 0]);
        assert_eq!(&b[10..12], &[2, 0]);
        assert_eq!(&b[12..14], &[9, 0]);
        assert_eq!(b[14], 1);
        assert_eq!(Cqe::from_bytes(&b), c);
        assert!(c.phase());
        assert_eq!(c.error(), None);
    }

    #[test]
    fn admin_builders_pack_their_fields() {
        let s = Sqe::create_sq(3, 256, 0x1000, 3);
        assert_eq!(s.cdw[0], 3 | (255 << 16));
        assert_eq!(s.cdw[1], 1 | (3 << 16));
        assert_eq!(Sqe::set_num_queues(4).cdw[1], 0x0003_0003);
        assert_eq!(Sqe::abort(2, 17).cdw[0], 2 | (17 << 16));
        assert_eq!(Sqe::write_zeroes(1, 0, 1, true).cdw[2], WZ_DEAC);
        assert_eq!(Sqe::dsm_deallocate(1, 1, 0).cdw[1], DSM_ATTR_DEALLOCATE);
    }
}
