//! mkfs then fsck on RAM disks: a fresh file system is clean, and each kind of damage is found
//! and named — never a panic.

use kura_accelfs::fsdevice::FsDevice;
use kura_accelfs::header::{seal, BlockKind};
use kura_accelfs::testing::{
    bit_flips, format_ram_disk, fresh_metadata_blocks, ghost_entry_transaction, reopen, BitFlip,
};
use kura_accelfs::{fsck, FormatError, FsError};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;

#[test]
fn a_fresh_file_system_is_clean_at_every_block_size() {
    for (bs, dbs) in [(4096, 512), (8192, 4096), (65536, 4096)] {
        let (storage, sb) = format_ram_disk(64 << 20, bs, dbs);
        let report = fsck(Box::new(MemDevice::with_storage(
            storage,
            QueueOptions {
                block_size: dbs,
                ..QueueOptions::default()
            },
        )))
        .unwrap();
        assert!(report.is_clean(), "bs {bs}: {:?}", report.problems);
        assert_eq!((report.directories, report.files), (1, 0));
        assert_eq!(
            report.used_blocks,
            sb.layout.data_start + 2,
            "metadata, root directory block, backup superblock"
        );
    }
}

#[test]
fn a_damaged_inode_table_is_reported() {
    let (storage, sb) = format_ram_disk(16 << 20, 8192, 4096);
    let at = sb.layout.inode_table_start as usize * 8192 + 300;
    storage.lock().unwrap()[at] ^= 0x40;
    let report = fsck(reopen(&storage)).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("inode table") && p.contains("checksum")),
        "{:?}",
        report.problems
    );
}

#[test]
fn a_leaked_block_is_reported() {
    let (storage, sb) = format_ram_disk(16 << 20, 8192, 4096);
    let l = sb.layout;
    let n = l.block_bitmap_start;
    let mut disk = storage.lock().unwrap();
    let block = &mut disk[n as usize * 8192..(n as usize + 1) * 8192];
    let bit = l.data_start + 5;
    block[16 + (bit / 8) as usize] |= 1 << (bit % 8);
    seal(block, BlockKind::BlockBitmap, n);
    drop(disk);
    let report = fsck(reopen(&storage)).unwrap();
    assert_eq!(
        report.problems,
        vec![format!(
            "block {bit} is marked used but nothing uses it (leaked)"
        )]
    );
}

#[test]
fn a_destroyed_primary_superblock_falls_back_to_the_backup() {
    let (storage, _) = format_ram_disk(16 << 20, 8192, 4096);
    storage.lock().unwrap()[..8192].fill(0);
    let report = fsck(reopen(&storage)).unwrap();
    assert!(
        report.notes.iter().any(|n| n.contains("using the backup")),
        "{:?}",
        report.notes
    );
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
}

#[test]
fn a_device_without_accelfs_is_a_clear_error() {
    let dev = MemDevice::new(16 << 20, QueueOptions::default());
    match fsck(Box::new(dev)) {
        Err(FsError::Format(FormatError::NotAccelFs(_))) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn committed_journal_transactions_are_checked_as_mount_will_see_them() {
    let (storage, sb) = format_ram_disk(16 << 20, 8192, 4096);
    let l = sb.layout;
    // A committed transaction that rewrites the root directory with an entry for an unused inode.
    let mut io = FsDevice::new(reopen(&storage), 8192).unwrap();
    for (n, b) in ghost_entry_transaction(&l) {
        io.write(n, &b).unwrap();
    }
    drop(io);
    let report = fsck(reopen(&storage)).unwrap();
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("1 committed transaction")),
        "{:?}",
        report.notes
    );
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("`ghost` names inode 5")),
        "{:?}",
        report.problems
    );
}

#[test]
fn every_bit_flip_in_checked_metadata_is_noticed_and_none_panics() {
    let (storage, sb) = format_ram_disk(8 << 20, 4096, 4096);
    let l = sb.layout;
    let pristine = storage.lock().unwrap().clone();
    // Every block fsck checks.
    let checked = fresh_metadata_blocks(&l);
    for flip in bit_flips(0x1234_5678_9abc_def0, 300, &checked, 4096) {
        let BitFlip {
            round, block, at, ..
        } = flip;
        flip.apply(&mut storage.lock().unwrap(), &pristine);
        let noticed = match fsck(reopen(&storage)) {
            Ok(r) => !r.is_clean() || !r.notes.is_empty(),
            Err(_) => true,
        };
        assert!(
            noticed,
            "round {round}: a flip in block {block} at byte {at} went unnoticed"
        );
    }
}
