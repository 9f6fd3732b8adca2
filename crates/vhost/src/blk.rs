//! The virtio-blk side of the device: the feature bits and configuration space kura offers, and
//! the decoding of one guest request (its descriptor chain split into readable and writable
//! buffers, its 16-byte header and, for discard and write-zeroes, its range segments) into a
//! [`Command`] checked against the drive's shape.
//!
//! Everything here is pure: guest bytes and descriptor lengths in, a command or a virtio status
//! out, so the decoding of untrusted guest input is tested (property-tested, and fuzzed by
//! `fuzz/fuzz_targets/vhost_request.rs`) without a guest.

use kura_engine::Geometry;
use virtio_bindings::virtio_blk as vb;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// virtio-blk addresses 512-byte sectors whatever the logical block size.
pub const SECTOR: u64 = 512;
/// Bytes of the request header (type, reserved, sector).
pub const HEADER_LEN: usize = 16;
/// Bytes of one discard / write-zeroes range segment.
pub const RANGE_LEN: usize = 16;
/// Bytes of the configuration space kura fills in (up to `write_zeroes_may_unmap` and padding).
pub const CONFIG_LEN: usize = 60;

pub const STATUS_OK: u8 = vb::VIRTIO_BLK_S_OK as u8;
pub const STATUS_IOERR: u8 = vb::VIRTIO_BLK_S_IOERR as u8;
pub const STATUS_UNSUPP: u8 = vb::VIRTIO_BLK_S_UNSUPP as u8;

/// The virtqueue size QEMU gives a vhost-user-blk device by default.
const GUEST_QUEUE_SIZE: u32 = 128;

/// Largest transfer one request may carry, in bytes: the guest splits bigger I/O.
const MAX_REQUEST: u64 = 4 << 20;

/// What the device offers the guest, fixed when the export is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub block_size: u32,
    pub num_blocks: u64,
    /// The drive's largest command; advertised as the optimal I/O size.
    pub max_transfer: u32,
    pub read_only: bool,
    pub num_queues: u16,
    /// Descriptors one request may span (SEG_MAX), data segments only.
    pub seg_max: u32,
    /// Largest data segment in bytes (SIZE_MAX).
    pub size_max: u32,
}

impl Shape {
    pub fn new(geo: &Geometry, read_only: bool, num_queues: u16) -> Shape {
        Shape {
            block_size: geo.block_size,
            num_blocks: geo.num_blocks,
            max_transfer: geo.max_transfer,
            read_only,
            num_queues: num_queues.max(1),
            // Two descriptors of every chain are the header and the status byte; QEMU's virtqueues
            // have 128 descriptors unless its `queue-size` says otherwise.
            seg_max: GUEST_QUEUE_SIZE - 2,
            size_max: 1 << 20,
        }
    }

    fn capacity_sectors(&self) -> u64 {
        self.num_blocks * u64::from(self.block_size) / SECTOR
    }

    fn sectors_per_block(&self) -> u64 {
        (u64::from(self.block_size) / SECTOR).max(1)
    }

    /// The virtio feature bits offered (the vhost-user protocol-features bit is added by the
    /// backend).
    pub fn features(&self) -> u64 {
        let mut bits = [
            VIRTIO_F_VERSION_1,
            VIRTIO_RING_F_EVENT_IDX,
            VIRTIO_RING_F_INDIRECT_DESC,
            vb::VIRTIO_BLK_F_SIZE_MAX,
            vb::VIRTIO_BLK_F_SEG_MAX,
            vb::VIRTIO_BLK_F_BLK_SIZE,
            vb::VIRTIO_BLK_F_FLUSH,
            vb::VIRTIO_BLK_F_TOPOLOGY,
            vb::VIRTIO_BLK_F_MQ,
        ]
        .iter()
        .fold(0u64, |acc, bit| acc | 1 << bit);
        if self.read_only {
            bits |= 1 << vb::VIRTIO_BLK_F_RO;
        } else {
            bits |= 1 << vb::VIRTIO_BLK_F_DISCARD | 1 << vb::VIRTIO_BLK_F_WRITE_ZEROES;
        }
        bits
    }

    /// The `virtio_blk_config` structure, little-endian.
    pub fn config(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        let max_range =
            u32::try_from((MAX_REQUEST / SECTOR).min(u64::from(u32::MAX))).unwrap_or(u32::MAX);
        c[0..8].copy_from_slice(&self.capacity_sectors().to_le_bytes());
        c[8..12].copy_from_slice(&self.size_max.to_le_bytes());
        c[12..16].copy_from_slice(&self.seg_max.to_le_bytes());
        // 16..20: CHS geometry, not offered.
        c[20..24].copy_from_slice(&self.block_size.to_le_bytes());
        // 24, 25: physical block exponent 0 (physical = logical block), alignment offset 0.
        c[26..28].copy_from_slice(&1u16.to_le_bytes()); // min_io_size, in blocks
        let opt = (self.max_transfer / self.block_size).max(1);
        c[28..32].copy_from_slice(&opt.to_le_bytes());
        c[32] = 1; // writeback cache: the guest flushes
        c[34..36].copy_from_slice(&self.num_queues.to_le_bytes());
        c[36..40].copy_from_slice(&max_range.to_le_bytes()); // max_discard_sectors
        c[40..44].copy_from_slice(&MAX_RANGES.to_le_bytes()); // max_discard_seg
        let align = u32::try_from(self.sectors_per_block()).unwrap_or(1);
        c[44..48].copy_from_slice(&align.to_le_bytes()); // discard_sector_alignment
        c[48..52].copy_from_slice(&max_range.to_le_bytes()); // max_write_zeroes_sectors
        c[52..56].copy_from_slice(&MAX_RANGES.to_le_bytes()); // max_write_zeroes_seg
        c[56] = 1; // write_zeroes_may_unmap
        c
    }

    /// Blocks of a sector range, when it is aligned to blocks and inside the drive.
    fn blocks_of(&self, sector: u64, sectors: u64) -> Option<(u64, u64)> {
        let per = self.sectors_per_block();
        if sectors == 0 || !sector.is_multiple_of(per) || !sectors.is_multiple_of(per) {
            return None;
        }
        let end = sector.checked_add(sectors)?;
        (end <= self.capacity_sectors()).then_some((sector / per, sectors / per))
    }
}

/// Range segments one discard or write-zeroes request may carry (`max_discard_seg`,
/// `max_write_zeroes_seg`); each becomes its own device request.
pub const MAX_RANGES: u32 = 32;

/// One guest request, decoded and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Read {
        lba: u64,
        blocks: u64,
    },
    Write {
        lba: u64,
        blocks: u64,
    },
    Flush,
    GetId,
    /// Block ranges `(lba, blocks)`, one to [`MAX_RANGES`].
    Discard(Vec<(u64, u64)>),
    WriteZeroes(Vec<(u64, u64)>),
}

/// One descriptor of a chain as the guest wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub write_only: bool,
}

/// A descriptor chain split into what the device reads and what it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// Device-readable buffers: the header, then write data or range segments.
    pub readable: Vec<Desc>,
    /// Device-writable buffers before the status byte (read data, the GET_ID answer).
    pub writable: Vec<Desc>,
    /// Guest address of the status byte: the last writable byte of the chain.
    pub status: u64,
    /// Bytes of `readable` after the header, and of `writable`.
    pub out_len: u64,
    pub in_len: u64,
}

/// Splits a descriptor chain: readable buffers first, then writable ones ending with the status
/// byte. `Err(None)` when there is no writable byte for a status (nothing can be answered but an
/// empty used entry); `Err(Some(addr))` when the status goes at `addr` but the chain is not a
/// request (a readable buffer after a writable one, or no room for the header).
pub fn split_chain(descs: &[Desc]) -> Result<Chain, Option<u64>> {
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    let mut malformed = false;
    for d in descs {
        if d.write_only {
            writable.push(*d);
        } else if writable.is_empty() {
            readable.push(*d);
        } else {
            // The spec puts every device-readable descriptor before the writable ones.
            malformed = true;
        }
    }
    let status = match writable.last_mut() {
        Some(last) if last.len > 0 => {
            last.len -= 1;
            let addr = last.addr.checked_add(u64::from(last.len)).ok_or(None)?;
            if last.len == 0 {
                writable.pop();
            }
            addr
        }
        _ => return Err(None),
    };
    let out_total: u64 = readable.iter().map(|d| u64::from(d.len)).sum();
    let in_len: u64 = writable.iter().map(|d| u64::from(d.len)).sum();
    if malformed || out_total < HEADER_LEN as u64 {
        return Err(Some(status));
    }
    Ok(Chain {
        readable,
        writable,
        status,
        out_len: out_total - HEADER_LEN as u64,
        in_len,
    })
}

/// Decodes a request: `header` is its first 16 bytes, `out_len` the bytes the guest supplied
/// after the header (write data or range segments), `in_len` the bytes it left for the device
/// before the status byte, `ranges` the bytes after the header when the type carries range
/// segments (the caller reads at most [`ranges_len`] of them). Returns the virtio status to
/// answer with when the request cannot be served.
pub fn decode(
    shape: &Shape,
    header: &[u8; HEADER_LEN],
    out_len: u64,
    in_len: u64,
    ranges: &[u8],
) -> Result<Command, u8> {
    let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let mut sector = [0u8; 8];
    sector.copy_from_slice(&header[8..16]);
    let sector = u64::from_le_bytes(sector);
    match kind {
        vb::VIRTIO_BLK_T_IN | vb::VIRTIO_BLK_T_OUT => {
            let len = if kind == vb::VIRTIO_BLK_T_IN {
                in_len
            } else {
                out_len
            };
            if len > MAX_REQUEST || !len.is_multiple_of(SECTOR) {
                return Err(STATUS_IOERR);
            }
            let (lba, blocks) = shape.blocks_of(sector, len / SECTOR).ok_or(STATUS_IOERR)?;
            if kind == vb::VIRTIO_BLK_T_IN {
                Ok(Command::Read { lba, blocks })
            } else if shape.read_only {
                Err(STATUS_IOERR)
            } else {
                Ok(Command::Write { lba, blocks })
            }
        }
        vb::VIRTIO_BLK_T_FLUSH => Ok(Command::Flush),
        vb::VIRTIO_BLK_T_GET_ID => Ok(Command::GetId),
        vb::VIRTIO_BLK_T_DISCARD | vb::VIRTIO_BLK_T_WRITE_ZEROES => {
            if shape.read_only {
                return Err(STATUS_IOERR);
            }
            // Whole segments, as many as the configuration space allows, all of them supplied.
            let count = out_len / RANGE_LEN as u64;
            if count == 0
                || !out_len.is_multiple_of(RANGE_LEN as u64)
                || count > u64::from(MAX_RANGES)
                || ranges.len() as u64 != out_len
            {
                return Err(STATUS_UNSUPP);
            }
            // Only the unmap flag is defined, and only for write-zeroes.
            let allowed = if kind == vb::VIRTIO_BLK_T_WRITE_ZEROES {
                1
            } else {
                0
            };
            let mut out = Vec::with_capacity(count as usize);
            for range in ranges.chunks_exact(RANGE_LEN) {
                let mut start = [0u8; 8];
                start.copy_from_slice(&range[0..8]);
                let start = u64::from_le_bytes(start);
                let sectors = u64::from(u32::from_le_bytes([
                    range[8], range[9], range[10], range[11],
                ]));
                let flags = u32::from_le_bytes([range[12], range[13], range[14], range[15]]);
                if flags & !allowed != 0 {
                    return Err(STATUS_UNSUPP);
                }
                if sectors > MAX_REQUEST / SECTOR {
                    return Err(STATUS_IOERR);
                }
                out.push(shape.blocks_of(start, sectors).ok_or(STATUS_IOERR)?);
            }
            if kind == vb::VIRTIO_BLK_T_DISCARD {
                Ok(Command::Discard(out))
            } else {
                Ok(Command::WriteZeroes(out))
            }
        }
        _ => Err(STATUS_UNSUPP),
    }
}

/// How many bytes after the header [`decode`] wants to see for a request of this header: the
/// range segments of a discard or write-zeroes (when they are few enough to be served), else
/// none.
pub fn ranges_len(header: &[u8; HEADER_LEN], out_len: u64) -> usize {
    let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let carries = kind == vb::VIRTIO_BLK_T_DISCARD || kind == vb::VIRTIO_BLK_T_WRITE_ZEROES;
    if carries && out_len <= u64::from(MAX_RANGES) * RANGE_LEN as u64 {
        out_len as usize
    } else {
        0
    }
}

/// The GET_ID answer: the export's name, cut or zero-padded to 20 bytes.
pub fn id_bytes(name: &str) -> [u8; vb::VIRTIO_BLK_ID_BYTES as usize] {
    let mut id = [0u8; vb::VIRTIO_BLK_ID_BYTES as usize];
    let n = name.len().min(id.len());
    id[..n].copy_from_slice(&name.as_bytes()[..n]);
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shape(block_size: u32, read_only: bool) -> Shape {
        Shape {
            block_size,
            num_blocks: 1024,
            max_transfer: 1 << 20,
            read_only,
            num_queues: 2,
            seg_max: 126,
            size_max: 1 << 20,
        }
    }

    fn header(kind: u32, sector: u64) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        h
    }

    fn range(sector: u64, sectors: u32, flags: u32) -> [u8; RANGE_LEN] {
        let mut r = [0u8; RANGE_LEN];
        r[0..8].copy_from_slice(&sector.to_le_bytes());
        r[8..12].copy_from_slice(&sectors.to_le_bytes());
        r[12..16].copy_from_slice(&flags.to_le_bytes());
        r
    }

    #[test]
    fn reads_and_writes_map_sectors_onto_blocks() {
        let s = shape(4096, false);
        let read = decode(&s, &header(vb::VIRTIO_BLK_T_IN, 16), 0, 8192, &[]);
        assert_eq!(read, Ok(Command::Read { lba: 2, blocks: 2 }));
        let write = decode(&s, &header(vb::VIRTIO_BLK_T_OUT, 8), 4096, 0, &[]);
        assert_eq!(write, Ok(Command::Write { lba: 1, blocks: 1 }));
        // Not aligned to the 4 KiB block, past the end, empty.
        assert_eq!(
            decode(&s, &header(vb::VIRTIO_BLK_T_IN, 1), 0, 4096, &[]),
            Err(STATUS_IOERR)
        );
        assert_eq!(
            decode(&s, &header(vb::VIRTIO_BLK_T_IN, 1024 * 8), 0, 4096, &[]),
            Err(STATUS_IOERR)
        );
        assert_eq!(
            decode(&s, &header(vb::VIRTIO_BLK_T_IN, 0), 0, 0, &[]),
            Err(STATUS_IOERR)
        );
    }

    #[test]
    fn read_only_refuses_every_mutation_but_flush() {
        let s = shape(512, true);
        assert_eq!(
            decode(&s, &header(vb::VIRTIO_BLK_T_OUT, 0), 512, 0, &[]),
            Err(STATUS_IOERR)
        );
        let r = range(0, 8, 0);
        assert_eq!(
            decode(&s, &header(vb::VIRTIO_BLK_T_DISCARD, 0), 16, 0, &r),
            Err(STATUS_IOERR)
        );
        assert_eq!(
            decode(&s, &header(vb::VIRTIO_BLK_T_FLUSH, 0), 0, 0, &[]),
            Ok(Command::Flush)
        );
        assert_ne!(s.features() & 1 << vb::VIRTIO_BLK_F_RO, 0);
        assert_eq!(s.features() & 1 << vb::VIRTIO_BLK_F_DISCARD, 0);
    }

    #[test]
    fn ranges_decode_and_reject_unknown_flags() {
        let s = shape(512, false);
        let r = range(8, 16, 0);
        let discard = header(vb::VIRTIO_BLK_T_DISCARD, 0);
        let zeroes = header(vb::VIRTIO_BLK_T_WRITE_ZEROES, 0);
        assert_eq!(
            decode(&s, &discard, 16, 0, &r),
            Ok(Command::Discard(vec![(8, 16)]))
        );
        let unmap = range(8, 16, 1);
        assert_eq!(
            decode(&s, &zeroes, 16, 0, &unmap),
            Ok(Command::WriteZeroes(vec![(8, 16)]))
        );
        assert_eq!(decode(&s, &discard, 16, 0, &unmap), Err(STATUS_UNSUPP));
        // Several segments, each checked; a part of one, or more than offered, is refused.
        let two = [range(8, 16, 0), range(100, 4, 0)].concat();
        assert_eq!(
            decode(&s, &discard, 32, 0, &two),
            Ok(Command::Discard(vec![(8, 16), (100, 4)]))
        );
        let bad = [range(8, 16, 0), range(1024, 1, 0)].concat();
        assert_eq!(decode(&s, &discard, 32, 0, &bad), Err(STATUS_IOERR));
        assert_eq!(decode(&s, &discard, 24, 0, &two[..24]), Err(STATUS_UNSUPP));
        assert_eq!(decode(&s, &discard, 32, 0, &r), Err(STATUS_UNSUPP));
        let many = u64::from(MAX_RANGES + 1) * RANGE_LEN as u64;
        assert_eq!(ranges_len(&discard, many), 0);
        assert_eq!(decode(&s, &discard, many, 0, &[]), Err(STATUS_UNSUPP));
        assert_eq!(ranges_len(&discard, 32), 32);
        assert_eq!(ranges_len(&header(vb::VIRTIO_BLK_T_OUT, 0), 32), 0);
        assert_eq!(decode(&s, &header(99, 0), 0, 0, &[]), Err(STATUS_UNSUPP));
    }

    #[test]
    fn chains_split_into_readable_writable_and_status() {
        let d = |addr, len, write_only| Desc {
            addr,
            len,
            write_only,
        };
        let read = split_chain(&[d(0, 16, false), d(4096, 4096, true), d(9000, 1, true)]);
        assert_eq!(
            read,
            Ok(Chain {
                readable: vec![d(0, 16, false)],
                writable: vec![d(4096, 4096, true)],
                status: 9000,
                out_len: 0,
                in_len: 4096,
            })
        );
        // The status byte shares the data's last descriptor.
        let shared = split_chain(&[d(0, 16, false), d(4096, 513, true)]).unwrap();
        assert_eq!((shared.status, shared.in_len), (4096 + 512, 512));
        // No writable byte, a readable after a writable, a short header.
        assert_eq!(split_chain(&[d(0, 16, false)]), Err(None));
        assert_eq!(split_chain(&[d(0, 16, false), d(8, 0, true)]), Err(None));
        assert_eq!(
            split_chain(&[d(0, 16, false), d(64, 1, true), d(80, 16, false)]),
            Err(Some(64))
        );
        assert_eq!(
            split_chain(&[d(0, 8, false), d(64, 1, true)]),
            Err(Some(64))
        );
        assert_eq!(split_chain(&[d(u64::MAX, 2, true)]), Err(None));
    }

    #[test]
    fn config_space_carries_the_geometry() {
        let s = shape(4096, false);
        let c = s.config();
        assert_eq!(u64::from_le_bytes(c[0..8].try_into().unwrap()), 1024 * 8);
        assert_eq!(u32::from_le_bytes(c[20..24].try_into().unwrap()), 4096);
        assert_eq!(u16::from_le_bytes(c[34..36].try_into().unwrap()), 2);
        assert_eq!(u32::from_le_bytes(c[44..48].try_into().unwrap()), 8);
        assert_eq!(&id_bytes("disk")[..5], b"disk\0");
    }

    proptest! {
        #[test]
        fn decode_never_panics_and_stays_inside(
            bs in prop::sample::select(vec![512u32, 4096]),
            ro in any::<bool>(),
            head in any::<[u8; 16]>(),
            rng in prop::collection::vec(any::<u8>(), 0..600),
            out_len in prop::sample::select(vec![0u64, 16, 32, 48, 512, 4096, 1 << 20, 1 << 23]),
            in_len in 0u64..(1 << 24),
        ) {
            let s = shape(bs, ro);
            let want = ranges_len(&head, out_len).min(rng.len());
            if let Ok(cmd) = decode(&s, &head, out_len, in_len, &rng[..want]) {
                match cmd {
                    Command::Read { lba, blocks } | Command::Write { lba, blocks } => {
                        prop_assert!(blocks > 0 && lba + blocks <= s.num_blocks);
                        let is_read = matches!(cmd, Command::Read { .. });
                        prop_assert!(!ro || is_read);
                    }
                    Command::Discard(r) | Command::WriteZeroes(r) => {
                        prop_assert!(!ro);
                        prop_assert!(!r.is_empty() && r.len() <= MAX_RANGES as usize);
                        prop_assert_eq!(r.len() as u64 * RANGE_LEN as u64, out_len);
                        for (lba, blocks) in r {
                            prop_assert!(blocks > 0 && lba + blocks <= s.num_blocks);
                        }
                    }
                    Command::Flush | Command::GetId => {}
                }
            }
        }

        #[test]
        fn chains_keep_every_byte_and_the_status_inside(
            descs in prop::collection::vec((any::<u64>(), 0u32..70_000, any::<bool>()), 0..8),
        ) {
            let descs: Vec<Desc> = descs
                .into_iter()
                .map(|(addr, len, write_only)| Desc { addr, len, write_only })
                .collect();
            match split_chain(&descs) {
                Ok(c) => {
                    let total: u64 = descs.iter().map(|d| u64::from(d.len)).sum();
                    prop_assert_eq!(c.out_len + HEADER_LEN as u64 + c.in_len + 1, total);
                    let last = descs.iter().rev().find(|d| d.write_only).unwrap();
                    prop_assert_eq!(c.status, last.addr + (u64::from(last.len) - 1));
                    prop_assert!(c.readable.iter().all(|d| !d.write_only));
                    prop_assert!(c.writable.iter().all(|d| d.write_only));
                }
                Err(Some(status)) => {
                    let last = descs.iter().rev().find(|d| d.write_only).unwrap();
                    prop_assert_eq!(status, last.addr + (u64::from(last.len) - 1));
                }
                Err(None) => {}
            }
        }
    }
}
