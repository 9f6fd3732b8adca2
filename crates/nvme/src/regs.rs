//! Controller registers (BAR0): offsets, the fields of CAP/CC/CSTS/AQA the driver uses, and
//! doorbell placement from CAP.DSTRD.

/// Controller Capabilities (64 bit).
pub const CAP: u32 = 0x00;
/// Version.
pub const VS: u32 = 0x08;
/// Interrupt Mask Set: all vectors masked, the driver polls.
pub const INTMS: u32 = 0x0c;
/// Controller Configuration.
pub const CC: u32 = 0x14;
/// Controller Status.
pub const CSTS: u32 = 0x1c;
/// Admin Queue Attributes.
pub const AQA: u32 = 0x24;
/// Admin Submission Queue base (64 bit).
pub const ASQ: u32 = 0x28;
/// Admin Completion Queue base (64 bit).
pub const ACQ: u32 = 0x30;
/// First doorbell.
pub const DOORBELL_BASE: u32 = 0x1000;

pub const CC_EN: u32 = 1;
/// CC.SHN = 01b: normal shutdown.
pub const CC_SHN_NORMAL: u32 = 1 << 14;
pub const CC_SHN_MASK: u32 = 3 << 14;
pub const CSTS_RDY: u32 = 1;
pub const CSTS_CFS: u32 = 1 << 1;
pub const CSTS_SHST_MASK: u32 = 3 << 2;
/// CSTS.SHST = 10b: shutdown processing complete.
pub const CSTS_SHST_DONE: u32 = 2 << 2;

/// Memory page size the driver uses (CC.MPS = 0).
pub const PAGE: usize = 4096;

/// The fields of CAP the driver needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// Maximum queue entries supported, as a count (MQES + 1).
    pub max_queue_entries: u32,
    /// Doorbell stride in bytes (4 << DSTRD).
    pub doorbell_stride: u32,
    /// Worst-case time for CSTS.RDY to change, in milliseconds (TO × 500 ms).
    pub timeout_ms: u64,
    /// Smallest memory page size in bytes (4096 << MPSMIN).
    pub mps_min: u64,
    /// Largest memory page size in bytes.
    pub mps_max: u64,
    /// NVM command set supported (CSS bit 0).
    pub nvm_command_set: bool,
}

impl Cap {
    pub fn decode(raw: u64) -> Cap {
        Cap {
            max_queue_entries: (raw & 0xffff) as u32 + 1,
            doorbell_stride: 4 << ((raw >> 32) & 0xf),
            timeout_ms: ((raw >> 24) & 0xff) * 500,
            mps_min: 4096 << ((raw >> 48) & 0xf),
            mps_max: 4096 << ((raw >> 52) & 0xf),
            nvm_command_set: (raw >> 37) & 1 == 1,
        }
    }
}

/// Offset of submission queue `qid`'s tail doorbell.
pub fn sq_tail_doorbell(qid: u16, stride: u32) -> u32 {
    DOORBELL_BASE + 2 * u32::from(qid) * stride
}

/// Offset of completion queue `qid`'s head doorbell.
pub fn cq_head_doorbell(qid: u16, stride: u32) -> u32 {
    DOORBELL_BASE + (2 * u32::from(qid) + 1) * stride
}

/// CC for an enabled controller with 4 KiB pages, NVM command set, round robin, 64-byte SQEs and
/// 16-byte CQEs.
pub fn cc_enable() -> u32 {
    CC_EN | (6 << 16) | (4 << 20)
}

/// AQA for admin queues of `entries` entries each.
pub fn aqa(entries: u32) -> u32 {
    let n = entries - 1;
    n | (n << 16)
}

/// Version as (major, minor, tertiary).
pub fn version(vs: u32) -> (u16, u8, u8) {
    ((vs >> 16) as u16, (vs >> 8) as u8, vs as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_decodes_qemu_values() {
        // QEMU: MQES=2047, CQR=1, TO=15, DSTRD=0, CSS NVM, MPSMIN=0, MPSMAX=4.
        let raw: u64 = 2047 | (1 << 16) | (15 << 24) | (1 << 37) | (4 << 52);
        let cap = Cap::decode(raw);
        assert_eq!(cap.max_queue_entries, 2048);
        assert_eq!(cap.doorbell_stride, 4);
        assert_eq!(cap.timeout_ms, 7500);
        assert_eq!(cap.mps_min, 4096);
        assert_eq!(cap.mps_max, 65536);
        assert!(cap.nvm_command_set);
    }

    #[test]
    fn doorbells_follow_the_stride() {
        assert_eq!(sq_tail_doorbell(0, 4), 0x1000);
        assert_eq!(cq_head_doorbell(0, 4), 0x1004);
        assert_eq!(sq_tail_doorbell(3, 4), 0x1018);
        assert_eq!(cq_head_doorbell(3, 16), 0x1000 + 7 * 16);
        let cap = Cap::decode(2 << 32);
        assert_eq!(cap.doorbell_stride, 16);
    }

    #[test]
    fn cc_and_aqa_fields() {
        assert_eq!(cc_enable(), 0x0046_0001);
        assert_eq!(aqa(32), 0x001f_001f);
        assert_eq!(version(0x0001_0400), (1, 4, 0));
    }
}
