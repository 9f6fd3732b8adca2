//! The ublk driver's user-space ABI (`include/uapi/linux/ublk_cmd.h`), written out by hand: the
//! command numbers, the flags, and byte-exact encoders and decoders of the structures that cross
//! the boundary (control commands, device info, parameters, per-tag I/O commands and the I/O
//! descriptors the driver writes into the mapped command buffer). Pure data: nothing here talks
//! to the kernel, so all of it is tested on hosts without the driver.
//!
//! The kernel lays these structures out in the host's byte order; kura builds only for
//! little-endian targets here, so they are encoded little-endian explicitly.

#[cfg(target_endian = "big")]
compile_error!("kura-ublk encodes the ublk ABI little-endian; big-endian hosts are not supported");

/// Control command numbers (`UBLK_CMD_*`), sent on `/dev/ublk-control`.
pub const CMD_GET_DEV_INFO: u8 = 0x02;
pub const CMD_ADD_DEV: u8 = 0x04;
pub const CMD_DEL_DEV: u8 = 0x05;
pub const CMD_START_DEV: u8 = 0x06;
pub const CMD_STOP_DEV: u8 = 0x07;
pub const CMD_SET_PARAMS: u8 = 0x08;
pub const CMD_START_USER_RECOVERY: u8 = 0x10;
pub const CMD_END_USER_RECOVERY: u8 = 0x11;
/// Sent only in its `_IOR` form ([`GET_FEATURES_OP`]): the driver matches that exact value.
pub const CMD_GET_FEATURES: u8 = 0x13;
/// Linux 6.16+ (`UBLK_F_UPDATE_SIZE` in the features): a live device's new capacity in sectors.
pub const CMD_UPDATE_SIZE: u8 = 0x15;

/// Per-tag I/O command numbers (`UBLK_IO_*`), sent on `/dev/ublkcN`.
pub const IO_FETCH_REQ: u8 = 0x20;
pub const IO_COMMIT_AND_FETCH_REQ: u8 = 0x21;

/// Completion results of an I/O command: a request is waiting in the tag's descriptor, or the
/// device is going away and the tag will not be used again.
pub const IO_RES_OK: i32 = 0;
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

/// Device feature flags (`UBLK_F_*`).
pub const F_USER_RECOVERY: u64 = 1 << 3;
pub const F_USER_RECOVERY_REISSUE: u64 = 1 << 4;
pub const F_CMD_IOCTL_ENCODE: u64 = 1 << 6;
pub const F_UPDATE_SIZE: u64 = 1 << 10;

/// Device states in [`DevInfo::state`].
pub const S_DEV_DEAD: u16 = 0;
pub const S_DEV_LIVE: u16 = 1;
pub const S_DEV_QUIESCED: u16 = 2;

/// Request operations in the low byte of [`IoDesc::op_flags`] (`UBLK_IO_OP_*`).
pub const IO_OP_READ: u8 = 0;
pub const IO_OP_WRITE: u8 = 1;
pub const IO_OP_FLUSH: u8 = 2;
pub const IO_OP_DISCARD: u8 = 3;
pub const IO_OP_WRITE_SAME: u8 = 4;
pub const IO_OP_WRITE_ZEROES: u8 = 5;
/// Request flag: the write must be durable when it completes.
pub const IO_F_FUA: u32 = 1 << 13;

/// Parameter types in [`Params::types`] and the attributes of [`BasicParams::attrs`].
pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;
pub const ATTR_READ_ONLY: u32 = 1 << 0;
pub const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
pub const ATTR_FUA: u32 = 1 << 3;

/// Largest queue depth and queue count the driver accepts.
pub const MAX_QUEUE_DEPTH: u16 = 4096;
pub const MAX_NR_QUEUES: u16 = 4096;
/// Where queue N's descriptor area starts in `/dev/ublkcN`'s mmap space: each queue owns room
/// for the largest depth, rounded up to pages.
pub const CMD_BUF_OFFSET: u64 = 0;

/// Bytes of one encoded structure.
pub const CTRL_CMD_LEN: usize = 32;
pub const DEV_INFO_LEN: usize = 64;
pub const IO_CMD_LEN: usize = 16;
pub const IO_DESC_LEN: usize = 24;
/// `struct ublk_params` as of Linux 6.12: header, basic, discard, devt, zoned (108 bytes,
/// padded to 8).
pub const PARAMS_LEN: usize = 112;

const PAGE: u64 = 4096;

/// `_IOWR('u', nr, size)`: the ioctl-style encoding of a command number that the driver
/// requires for unprivileged use and accepts always (`UBLK_U_CMD_*`, `UBLK_U_IO_*`).
pub const fn iowr(nr: u8, size: usize) -> u32 {
    (3 << 30) | ((size as u32) << 16) | ((b'u' as u32) << 8) | nr as u32
}

/// `_IOR('u', GET_FEATURES, ublksrv_ctrl_cmd)`: the one control command the driver recognises
/// by its whole encoded value rather than by its number.
pub const GET_FEATURES_OP: u32 =
    (2 << 30) | ((CTRL_CMD_LEN as u32) << 16) | ((b'u' as u32) << 8) | CMD_GET_FEATURES as u32;

/// The `cmd_op` of control command `nr`.
pub const fn ctrl_op(nr: u8) -> u32 {
    iowr(nr, CTRL_CMD_LEN)
}

/// The `cmd_op` of I/O command `nr`.
pub const fn io_op(nr: u8) -> u32 {
    iowr(nr, IO_CMD_LEN)
}

/// Bytes of queue `q`'s descriptor area that the driver lets a server map for `depth` tags.
pub fn queue_desc_bytes(depth: u16) -> usize {
    (u64::from(depth) * IO_DESC_LEN as u64).div_ceil(PAGE) as usize * PAGE as usize
}

/// Offset in `/dev/ublkcN` of queue `q`'s descriptor area.
pub fn queue_desc_offset(q: u16) -> u64 {
    let stride = (u64::from(MAX_QUEUE_DEPTH) * IO_DESC_LEN as u64).div_ceil(PAGE) * PAGE;
    CMD_BUF_OFFSET + u64::from(q) * stride
}

/// `struct ublksrv_ctrl_cmd`: the 32 bytes at the start of a control SQE's command area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtrlCmd {
    /// Target device, `u32::MAX` for "allocate one" in `ADD_DEV`.
    pub dev_id: u32,
    /// `u16::MAX` unless the command is about one queue.
    pub queue_id: u16,
    /// Length of the buffer at `addr`.
    pub len: u16,
    /// User address of the command's in/out buffer (device info, parameters).
    pub addr: u64,
    /// Inline argument: the server's pid for `START_DEV`/`END_USER_RECOVERY`.
    pub data: u64,
}

impl CtrlCmd {
    pub fn encode(&self) -> [u8; CTRL_CMD_LEN] {
        let mut b = [0u8; CTRL_CMD_LEN];
        b[0..4].copy_from_slice(&self.dev_id.to_le_bytes());
        b[4..6].copy_from_slice(&self.queue_id.to_le_bytes());
        b[6..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.data.to_le_bytes());
        // dev_path_len, pad and reserved stay zero: kura never uses unprivileged devices.
        b
    }

    pub fn decode(b: &[u8; CTRL_CMD_LEN]) -> Self {
        CtrlCmd {
            dev_id: u32_at(b, 0),
            queue_id: u16_at(b, 4),
            len: u16_at(b, 6),
            addr: u64_at(b, 8),
            data: u64_at(b, 16),
        }
    }
}

/// `struct ublksrv_ctrl_dev_info`: what `ADD_DEV` takes and `GET_DEV_INFO` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    pub state: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
}

impl DevInfo {
    pub fn encode(&self) -> [u8; DEV_INFO_LEN] {
        let mut b = [0u8; DEV_INFO_LEN];
        b[0..2].copy_from_slice(&self.nr_hw_queues.to_le_bytes());
        b[2..4].copy_from_slice(&self.queue_depth.to_le_bytes());
        b[4..6].copy_from_slice(&self.state.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_io_buf_bytes.to_le_bytes());
        b[12..16].copy_from_slice(&self.dev_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.ublksrv_pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.flags.to_le_bytes());
        // 32..40: ublksrv_flags, private to the server; kura keeps none.
        b[40..44].copy_from_slice(&self.owner_uid.to_le_bytes());
        b[44..48].copy_from_slice(&self.owner_gid.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; DEV_INFO_LEN]) -> Self {
        DevInfo {
            nr_hw_queues: u16_at(b, 0),
            queue_depth: u16_at(b, 2),
            state: u16_at(b, 4),
            max_io_buf_bytes: u32_at(b, 8),
            dev_id: u32_at(b, 12),
            ublksrv_pid: u32_at(b, 16) as i32,
            flags: u64_at(b, 24),
            owner_uid: u32_at(b, 40),
            owner_gid: u32_at(b, 44),
        }
    }
}

/// `struct ublk_param_basic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BasicParams {
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    /// Largest request in 512-byte sectors (at most `max_io_buf_bytes / 512`).
    pub max_sectors: u32,
    pub dev_sectors: u64,
}

/// `struct ublk_param_discard` (one segment per discard, which is all the driver supports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiscardParams {
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
}

/// `struct ublk_params` with the parts kura sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Params {
    pub basic: BasicParams,
    pub discard: Option<DiscardParams>,
}

impl Params {
    pub fn encode(&self) -> [u8; PARAMS_LEN] {
        let mut b = [0u8; PARAMS_LEN];
        let types = PARAM_TYPE_BASIC | self.discard.map_or(0, |_| PARAM_TYPE_DISCARD);
        b[0..4].copy_from_slice(&(PARAMS_LEN as u32).to_le_bytes());
        b[4..8].copy_from_slice(&types.to_le_bytes());
        let p = &self.basic;
        b[8..12].copy_from_slice(&p.attrs.to_le_bytes());
        b[12] = p.logical_bs_shift;
        b[13] = p.physical_bs_shift;
        b[14] = p.io_opt_shift;
        b[15] = p.io_min_shift;
        b[16..20].copy_from_slice(&p.max_sectors.to_le_bytes());
        // 20..24 chunk_sectors, 32..40 virt_boundary_mask: none.
        b[24..32].copy_from_slice(&p.dev_sectors.to_le_bytes());
        if let Some(d) = &self.discard {
            // 40..44 discard_alignment: 0.
            b[44..48].copy_from_slice(&d.discard_granularity.to_le_bytes());
            b[48..52].copy_from_slice(&d.max_discard_sectors.to_le_bytes());
            b[52..56].copy_from_slice(&d.max_write_zeroes_sectors.to_le_bytes());
            b[56..58].copy_from_slice(&1u16.to_le_bytes());
        }
        b
    }
}

/// `struct ublksrv_io_cmd`: the 16 bytes of a per-tag I/O SQE's command area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    /// For `COMMIT_AND_FETCH_REQ`: bytes done (reads, writes), 0, or a negative errno.
    pub result: i32,
    /// The tag's data buffer: the driver copies write data into it before handing the request
    /// over and copies read data out of it after the commit.
    pub addr: u64,
}

impl IoCmd {
    pub fn encode(&self) -> [u8; IO_CMD_LEN] {
        let mut b = [0u8; IO_CMD_LEN];
        b[0..2].copy_from_slice(&self.q_id.to_le_bytes());
        b[2..4].copy_from_slice(&self.tag.to_le_bytes());
        b[4..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; IO_CMD_LEN]) -> Self {
        IoCmd {
            q_id: u16_at(b, 0),
            tag: u16_at(b, 2),
            result: u32_at(b, 4) as i32,
            addr: u64_at(b, 8),
        }
    }
}

/// `struct ublksrv_io_desc`: one request as the driver describes it in the mapped area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoDesc {
    /// Operation in bits 0..8, `UBLK_IO_F_*` flags above.
    pub op_flags: u32,
    pub nr_sectors: u32,
    pub start_sector: u64,
    pub addr: u64,
}

impl IoDesc {
    pub fn decode(b: &[u8; IO_DESC_LEN]) -> Self {
        IoDesc {
            op_flags: u32_at(b, 0),
            nr_sectors: u32_at(b, 4),
            start_sector: u64_at(b, 8),
            addr: u64_at(b, 16),
        }
    }

    pub fn encode(&self) -> [u8; IO_DESC_LEN] {
        let mut b = [0u8; IO_DESC_LEN];
        b[0..4].copy_from_slice(&self.op_flags.to_le_bytes());
        b[4..8].copy_from_slice(&self.nr_sectors.to_le_bytes());
        b[8..16].copy_from_slice(&self.start_sector.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b
    }

    pub fn op(&self) -> u8 {
        (self.op_flags & 0xff) as u8
    }

    pub fn fua(&self) -> bool {
        self.op_flags & IO_F_FUA != 0
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn command_numbers_match_the_kernel_headers() {
        // Values of UBLK_U_CMD_ADD_DEV / UBLK_U_IO_FETCH_REQ as the kernel computes them.
        assert_eq!(ctrl_op(CMD_ADD_DEV), 0xc020_7504);
        assert_eq!(ctrl_op(CMD_SET_PARAMS), 0xc020_7508);
        assert_eq!(ctrl_op(CMD_END_USER_RECOVERY), 0xc020_7511);
        assert_eq!(GET_FEATURES_OP, 0x8020_7513);
        assert_eq!(ctrl_op(CMD_UPDATE_SIZE), 0xc020_7515);
        assert_eq!(io_op(IO_FETCH_REQ), 0xc010_7520);
        assert_eq!(io_op(IO_COMMIT_AND_FETCH_REQ), 0xc010_7521);
    }

    #[test]
    fn descriptor_areas_are_page_sized_and_strided_by_the_largest_depth() {
        assert_eq!(queue_desc_bytes(1), 4096);
        assert_eq!(queue_desc_bytes(128), 4096);
        assert_eq!(queue_desc_bytes(256), 8192);
        assert_eq!(queue_desc_offset(0), 0);
        // 4096 tags * 24 bytes = 96 KiB per queue.
        assert_eq!(queue_desc_offset(1), 96 << 10);
        assert_eq!(queue_desc_offset(3), 3 * (96 << 10));
    }

    #[test]
    fn ctrl_cmd_layout() {
        let c = CtrlCmd {
            dev_id: 7,
            queue_id: u16::MAX,
            len: 64,
            addr: 0x1122_3344_5566_7788,
            data: 4242,
        };
        let b = c.encode();
        assert_eq!(&b[0..4], &[7, 0, 0, 0]);
        assert_eq!(&b[4..6], &[0xff, 0xff]);
        assert_eq!(&b[6..8], &[64, 0]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[16..24], &4242u64.to_le_bytes());
        assert_eq!(&b[24..32], &[0; 8]);
    }

    #[test]
    fn params_layout() {
        let p = Params {
            basic: BasicParams {
                attrs: ATTR_VOLATILE_CACHE | ATTR_FUA,
                logical_bs_shift: 9,
                physical_bs_shift: 12,
                io_opt_shift: 12,
                io_min_shift: 9,
                max_sectors: 1024,
                dev_sectors: 131072,
            },
            discard: Some(DiscardParams {
                discard_granularity: 4096,
                max_discard_sectors: 1 << 20,
                max_write_zeroes_sectors: 1 << 20,
            }),
        };
        let b = p.encode();
        assert_eq!(u32_at(&b, 0), PARAMS_LEN as u32);
        assert_eq!(u32_at(&b, 4), PARAM_TYPE_BASIC | PARAM_TYPE_DISCARD);
        assert_eq!(u32_at(&b, 8), 0b1100);
        assert_eq!(&b[12..16], &[9, 12, 12, 9]);
        assert_eq!(u32_at(&b, 16), 1024);
        assert_eq!(u64_at(&b, 24), 131072);
        assert_eq!(u32_at(&b, 44), 4096);
        assert_eq!(u32_at(&b, 48), 1 << 20);
        assert_eq!(u32_at(&b, 52), 1 << 20);
        assert_eq!(u16_at(&b, 56), 1);
        // devt (filled in by the kernel) and zoned stay zero.
        assert!(b[60..].iter().all(|&x| x == 0));
        let bare = Params { discard: None, ..p }.encode();
        assert_eq!(u32_at(&bare, 4), PARAM_TYPE_BASIC);
        assert!(bare[40..].iter().all(|&x| x == 0));
    }

    #[test]
    fn io_desc_flags() {
        let d = IoDesc {
            op_flags: u32::from(IO_OP_WRITE) | IO_F_FUA,
            nr_sectors: 8,
            start_sector: 16,
            addr: 0,
        };
        assert_eq!(d.op(), IO_OP_WRITE);
        assert!(d.fua());
        assert!(!IoDesc::default().fua());
    }

    proptest! {
        #[test]
        fn ctrl_cmd_round_trips(dev_id: u32, queue_id: u16, len: u16, addr: u64, data: u64) {
            let c = CtrlCmd { dev_id, queue_id, len, addr, data };
            prop_assert_eq!(CtrlCmd::decode(&c.encode()), c);
        }

        #[test]
        fn dev_info_round_trips(q: u16, d: u16, s: u16, m: u32, id: u32, pid: i32, f: u64,
                                uid: u32, gid: u32) {
            let i = DevInfo { nr_hw_queues: q, queue_depth: d, state: s, max_io_buf_bytes: m,
                dev_id: id, ublksrv_pid: pid, flags: f, owner_uid: uid, owner_gid: gid };
            prop_assert_eq!(DevInfo::decode(&i.encode()), i);
        }

        #[test]
        fn io_cmd_round_trips(q_id: u16, tag: u16, result: i32, addr: u64) {
            let c = IoCmd { q_id, tag, result, addr };
            prop_assert_eq!(IoCmd::decode(&c.encode()), c);
        }

        #[test]
        fn io_desc_round_trips(op_flags: u32, nr_sectors: u32, start_sector: u64, addr: u64) {
            let d = IoDesc { op_flags, nr_sectors, start_sector, addr };
            prop_assert_eq!(IoDesc::decode(&d.encode()), d);
        }
    }
}
