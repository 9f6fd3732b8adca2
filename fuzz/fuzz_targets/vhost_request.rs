//! kura-vhost's decoding of a guest's virtio-blk request on arbitrary bytes: the descriptor
//! chain's split into readable buffers, writable buffers and the status byte
//! (`blk::split_chain`), then the request header and range segments against a drive's shape
//! (`blk::decode`), as the backend calls them. Refusals are fine; panics, or a command that
//! reaches outside the drive or mutates a read-only one, are bugs.
#![no_main]

use kura_vhost::blk::{self, Command, Desc, Shape, HEADER_LEN, RANGE_LEN};
use libfuzzer_sys::fuzz_target;

/// Takes `N` bytes off the front of `data`, zero-padded when it runs out.
fn take<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    out
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let [bs, ro, count, blocks_lo, blocks_hi] = take::<5>(&mut data);
    let block_size = if bs & 1 == 0 { 512 } else { 4096 };
    let shape = Shape {
        block_size,
        num_blocks: u64::from(u16::from_le_bytes([blocks_lo, blocks_hi])),
        max_transfer: 1 << 20,
        read_only: ro & 1 == 1,
        num_queues: 1,
        seg_max: 126,
        size_max: 1 << 20,
    };
    // The chain: up to 16 descriptors of (address, length, writable).
    let descs: Vec<Desc> = (0..count % 17)
        .map(|_| {
            let d = take::<13>(&mut data);
            Desc {
                addr: u64::from_le_bytes(d[0..8].try_into().unwrap()),
                len: u32::from_le_bytes(d[8..12].try_into().unwrap()),
                write_only: d[12] & 1 == 1,
            }
        })
        .collect();
    let header = take::<HEADER_LEN>(&mut data);
    let chain = match blk::split_chain(&descs) {
        Ok(chain) => chain,
        Err(_) => return,
    };
    let total: u128 = descs.iter().map(|d| u128::from(d.len)).sum();
    assert_eq!(
        u128::from(chain.out_len) + HEADER_LEN as u128 + u128::from(chain.in_len) + 1,
        total
    );
    // The rest of the input is what the guest put after the header.
    let want = blk::ranges_len(&header, chain.out_len).min(data.len());
    let ranges = &data[..want];
    let Ok(cmd) = blk::decode(&shape, &header, chain.out_len, chain.in_len, ranges) else {
        return;
    };
    let inside = |lba: u64, blocks: u64| {
        blocks > 0
            && lba
                .checked_add(blocks)
                .is_some_and(|e| e <= shape.num_blocks)
    };
    match cmd {
        Command::Read { lba, blocks } => {
            assert!(inside(lba, blocks));
            assert_eq!(blocks * u64::from(block_size), chain.in_len);
        }
        Command::Write { lba, blocks } => {
            assert!(!shape.read_only && inside(lba, blocks));
            assert_eq!(blocks * u64::from(block_size), chain.out_len);
        }
        Command::Discard(r) | Command::WriteZeroes(r) => {
            assert!(!shape.read_only);
            assert!(!r.is_empty() && r.len() <= blk::MAX_RANGES as usize);
            assert_eq!((r.len() * RANGE_LEN) as u64, chain.out_len);
            for (lba, blocks) in r {
                assert!(inside(lba, blocks));
            }
        }
        Command::Flush | Command::GetId => {}
    }
});
