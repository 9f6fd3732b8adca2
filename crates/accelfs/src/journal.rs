//! The journal's records and recovery scan (format §7), as pure functions over block images.
//!
//! A transaction is: descriptor block(s) listing target block numbers, the new images of those
//! blocks, then a commit block whose CRC covers every descriptor and image. Recovery walks the
//! circular log from the journal superblock's oldest sequence and keeps each transaction whose
//! sequence follows and whose commit CRC matches, stopping at the first that does not — so a torn
//! or partial transaction is never replayed, and no flush is needed between images and commit.

use crate::error::FormatError;
use crate::header::{
    read_u32, read_u64, seal, verify, write_u32, write_u64, BlockKind, HEADER_LEN,
};
use kura_engine::crc32c::{crc32c, Crc32c};

/// Where the log lives: blocks `start` and `start + 1` hold the two copies of the journal
/// superblock, the next `len − 2` blocks the circular log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalArea {
    pub start: u64,
    pub len: u64,
}

impl JournalArea {
    /// Log positions available (all but the two journal superblocks).
    pub fn slots(&self) -> u64 {
        self.len - 2
    }

    /// Device block of log position `pos` (wrapping).
    pub fn block_at(&self, pos: u64) -> u64 {
        self.start + 2 + pos % self.slots()
    }

    /// The block holding the journal-superblock copy of `generation`. Copies alternate, so a
    /// write torn by a crash only ever damages the copy being replaced.
    pub fn super_block(&self, generation: u64) -> u64 {
        self.start + generation % 2
    }
}

/// The journal superblock: where recovery starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalSuper {
    /// Sequence number of the oldest transaction not yet checkpointed.
    pub oldest_seq: u64,
    /// Its first log position.
    pub oldest_pos: u64,
    /// Incremented on every update; the valid copy with the highest generation wins.
    pub generation: u64,
}

impl JournalSuper {
    pub fn encode(&self, block_size: usize, number: u64) -> Vec<u8> {
        let mut b = vec![0u8; block_size];
        write_u64(&mut b, HEADER_LEN, self.oldest_seq);
        write_u64(&mut b, HEADER_LEN + 8, self.oldest_pos);
        write_u64(&mut b, HEADER_LEN + 16, self.generation);
        seal(&mut b, BlockKind::JournalSuper, number);
        b
    }

    pub fn decode(b: &[u8], number: u64) -> Result<Self, FormatError> {
        verify(b, BlockKind::JournalSuper, number)?;
        Ok(JournalSuper {
            oldest_seq: read_u64(b, HEADER_LEN),
            oldest_pos: read_u64(b, HEADER_LEN + 8),
            generation: read_u64(b, HEADER_LEN + 16),
        })
    }

    /// The newest valid copy, from the two blocks' contents; the error when neither is valid.
    pub fn newest(
        area: JournalArea,
        first: &[u8],
        second: &[u8],
    ) -> Result<JournalSuper, FormatError> {
        let a = JournalSuper::decode(first, area.start);
        let b = JournalSuper::decode(second, area.start + 1);
        match (a, b) {
            (Ok(a), Ok(b)) => Ok(if b.generation > a.generation { b } else { a }),
            (Ok(a), Err(_)) => Ok(a),
            (Err(_), Ok(b)) => Ok(b),
            (Err(e), Err(_)) => Err(e),
        }
    }
}

/// One transaction: the new contents of some blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub seq: u64,
    pub images: Vec<(u64, Vec<u8>)>,
}

/// Targets one descriptor block lists.
pub fn targets_per_descriptor(block_size: usize) -> usize {
    (block_size - 32) / 8
}

/// Log positions a transaction of `images` blocks takes.
pub fn blocks_needed(images: usize, block_size: usize) -> u64 {
    (images.div_ceil(targets_per_descriptor(block_size)).max(1) + images + 1) as u64
}

/// Lays out `txn` at log position `pos`: returns (device block, contents) in write order.
pub fn encode(
    txn: &Transaction,
    area: JournalArea,
    pos: u64,
    block_size: usize,
) -> Vec<(u64, Vec<u8>)> {
    let per = targets_per_descriptor(block_size);
    let mut out = Vec::new();
    let mut crc_input = Vec::new();
    let mut p = pos;
    let groups: Vec<&[(u64, Vec<u8>)]> = if txn.images.is_empty() {
        vec![&[]]
    } else {
        txn.images.chunks(per).collect()
    };
    let last_group = groups.len() - 1;
    for (g, group) in groups.into_iter().enumerate() {
        let mut d = vec![0u8; block_size];
        write_u64(&mut d, HEADER_LEN, txn.seq);
        write_u32(&mut d, HEADER_LEN + 8, group.len() as u32);
        write_u32(&mut d, HEADER_LEN + 12, u32::from(g == last_group));
        for (i, (target, _)) in group.iter().enumerate() {
            write_u64(&mut d, 32 + i * 8, *target);
        }
        let number = area.block_at(p);
        seal(&mut d, BlockKind::JournalDescriptor, number);
        crc_input.extend_from_slice(&d);
        out.push((number, d));
        p += 1;
        for (_, image) in group {
            let mut img = image.clone();
            img.resize(block_size, 0);
            crc_input.extend_from_slice(&img);
            out.push((area.block_at(p), img));
            p += 1;
        }
    }
    let mut c = vec![0u8; block_size];
    write_u64(&mut c, HEADER_LEN, txn.seq);
    write_u32(&mut c, HEADER_LEN + 8, txn.images.len() as u32);
    write_u32(&mut c, HEADER_LEN + 12, crc32c(&crc_input));
    let number = area.block_at(p);
    seal(&mut c, BlockKind::JournalCommit, number);
    out.push((number, c));
    out
}

/// Reads complete transactions from `sb` on, using `read(device_block)`. Returns them in order
/// and the log position after the last one. A read error ends the scan (and is returned).
pub fn scan<E>(
    sb: JournalSuper,
    area: JournalArea,
    block_size: usize,
    mut read: impl FnMut(u64) -> Result<Vec<u8>, E>,
) -> Result<(Vec<Transaction>, u64), E> {
    let mut txns = Vec::new();
    let mut seq = sb.oldest_seq;
    let mut pos = sb.oldest_pos % area.slots();
    // Log positions the transactions found so far take. The live log never holds more than the
    // log's slots (space is reused only after a checkpoint), so a chain of transactions that
    // would take more is stale or crafted: stopping there bounds what a scan reads and holds in
    // memory to one pass over the log.
    let mut taken = 0u64;
    loop {
        match read_one(seq, pos, area, block_size, &mut read)? {
            Some((txn, next)) => {
                taken += next - pos;
                if taken > area.slots() {
                    return Ok((txns, pos));
                }
                txns.push(txn);
                seq = seq.wrapping_add(1);
                pos = next % area.slots();
            }
            None => return Ok((txns, pos)),
        }
    }
}

type Read<'a, E> = dyn FnMut(u64) -> Result<Vec<u8>, E> + 'a;

fn read_one<E>(
    seq: u64,
    pos: u64,
    area: JournalArea,
    block_size: usize,
    read: &mut Read<'_, E>,
) -> Result<Option<(Transaction, u64)>, E> {
    let per = targets_per_descriptor(block_size) as u32;
    let mut p = pos;
    let mut images = Vec::new();
    // The commit's CRC over every descriptor and image, computed as they are read so the
    // transaction is held in memory once.
    let mut crc = Crc32c::new();
    let mut used = 0u64;
    loop {
        let number = area.block_at(p);
        let d = read(number)?;
        if d.len() != block_size
            || verify(&d, BlockKind::JournalDescriptor, number).is_err()
            || read_u64(&d, HEADER_LEN) != seq
        {
            return Ok(None);
        }
        let count = read_u32(&d, HEADER_LEN + 8);
        let last = read_u32(&d, HEADER_LEN + 12) == 1;
        if count > per {
            return Ok(None);
        }
        crc.update(&d);
        p += 1;
        used += 1;
        for i in 0..count as usize {
            // A transaction longer than the log is not one: stop before reading past it.
            if used >= area.slots() {
                return Ok(None);
            }
            let img = read(area.block_at(p))?;
            crc.update(&img);
            images.push((read_u64(&d, 32 + i * 8), img));
            p += 1;
            used += 1;
        }
        if used >= area.slots() {
            return Ok(None);
        }
        if last {
            break;
        }
    }
    let number = area.block_at(p);
    let c = read(number)?;
    let complete = c.len() == block_size
        && verify(&c, BlockKind::JournalCommit, number).is_ok()
        && read_u64(&c, HEADER_LEN) == seq
        && read_u32(&c, HEADER_LEN + 8) as usize == images.len()
        && read_u32(&c, HEADER_LEN + 12) == crc.finalize();
    Ok(complete.then(|| (Transaction { seq, images }, p + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const BS: usize = 4096;
    const AREA: JournalArea = JournalArea { start: 1, len: 41 };

    fn txn(seq: u64, n: usize) -> Transaction {
        Transaction {
            seq,
            images: (0..n)
                .map(|i| {
                    (
                        1000 + seq * 10 + i as u64,
                        vec![(seq as u8).wrapping_add(i as u8); BS],
                    )
                })
                .collect(),
        }
    }

    fn write_all(disk: &mut HashMap<u64, Vec<u8>>, txns: &[Transaction], mut pos: u64) -> u64 {
        for t in txns {
            for (number, block) in encode(t, AREA, pos, BS) {
                disk.insert(number, block);
            }
            pos += blocks_needed(t.images.len(), BS);
        }
        pos
    }

    fn reader(
        disk: &HashMap<u64, Vec<u8>>,
    ) -> impl FnMut(u64) -> Result<Vec<u8>, FormatError> + '_ {
        |n| Ok(disk.get(&n).cloned().unwrap_or_else(|| vec![0; BS]))
    }

    #[test]
    fn complete_transactions_are_found_in_order_across_the_wrap() {
        let mut disk = HashMap::new();
        let txns: Vec<_> = (5..12).map(|s| txn(s, (s % 4) as usize)).collect();
        let start = 30; // wraps around the 39-slot log
        let end = write_all(&mut disk, &txns, start);
        let (found, pos) = scan(
            JournalSuper {
                oldest_seq: 5,
                oldest_pos: start,
                generation: 0,
            },
            AREA,
            BS,
            reader(&disk),
        )
        .unwrap();
        assert_eq!(found, txns);
        assert_eq!(pos, end % AREA.slots());
    }

    #[test]
    fn a_torn_or_missing_commit_ends_the_log() {
        let mut disk = HashMap::new();
        let txns = vec![txn(1, 2), txn(2, 3)];
        write_all(&mut disk, &txns, 0);
        // Damage one image of the second transaction: its commit CRC no longer matches.
        let second_image = AREA.block_at(blocks_needed(2, BS) + 1);
        disk.get_mut(&second_image).unwrap()[77] ^= 1;
        let (found, _) = scan(
            JournalSuper {
                oldest_seq: 1,
                oldest_pos: 0,
                generation: 0,
            },
            AREA,
            BS,
            reader(&disk),
        )
        .unwrap();
        assert_eq!(found, vec![txns[0].clone()]);
        let (none, _) = scan(
            JournalSuper {
                oldest_seq: 2,
                oldest_pos: 0,
                generation: 0,
            },
            AREA,
            BS,
            reader(&disk),
        )
        .unwrap();
        assert!(
            none.is_empty(),
            "a sequence that does not follow is not replayed"
        );
    }

    #[test]
    fn large_transactions_span_several_descriptors() {
        let big = txn(3, targets_per_descriptor(BS) + 5);
        let area = JournalArea {
            start: 1,
            len: 2000,
        };
        let mut disk = HashMap::new();
        for (n, b) in encode(&big, area, 0, BS) {
            disk.insert(n, b);
        }
        let (found, _) = scan(
            JournalSuper {
                oldest_seq: 3,
                oldest_pos: 0,
                generation: 0,
            },
            area,
            BS,
            reader(&disk),
        )
        .unwrap();
        assert_eq!(found, vec![big]);
    }

    proptest! {
        #[test]
        fn any_prefix_of_the_write_stream_yields_a_prefix_of_transactions(sizes in proptest::collection::vec(0usize..4, 1..6), cut in 0usize..40, drop_mask in any::<u64>()) {
            let txns: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| txn(i as u64 + 1, n)).collect();
            let writes: Vec<(u64, Vec<u8>)> = {
                let mut pos = 0;
                let mut all = Vec::new();
                for t in &txns {
                    all.extend(encode(t, AREA, pos, BS));
                    pos += blocks_needed(t.images.len(), BS);
                }
                all
            };
            // Everything before `cut` was written; unflushed writes after it may or may not land.
            let mut disk = HashMap::new();
            for (i, (n, b)) in writes.iter().enumerate() {
                if i < cut || (drop_mask >> (i % 64)) & 1 == 1 {
                    disk.insert(*n, b.clone());
                }
            }
            let (found, _) = scan(JournalSuper { oldest_seq: 1, oldest_pos: 0, generation: 0 }, AREA, BS, reader(&disk)).unwrap();
            prop_assert!(found.len() <= txns.len());
            prop_assert_eq!(&found[..], &txns[..found.len()], "only whole transactions, in order");
        }
    }
}
