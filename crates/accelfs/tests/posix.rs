//! POSIX completeness through the public API (issue 14, format §4–§6): symbolic links (fast
//! and slow), hard links, FIFOs/sockets/device nodes, extended attributes with their flag and
//! size semantics, owners and nanosecond times, `rename` with `RENAME_NOREPLACE` and
//! `RENAME_EXCHANGE`, `fallocate` (allocate, keep-size, punch hole); each persisting across a
//! remount with fsck clean, each error typed with the errno Linux gives. Also: an image made
//! before the `posix` feature still mounts (and refuses only what needs it; fsck reports posix
//! structures on it), an unknown feature bit refuses the mount, fsck counts every hard link
//! and repair restores the count, and fsck/repair deal with a damaged attribute block.

use kura_accelfs::header::{seal, BlockKind, HEADER_LEN};
use kura_accelfs::inode::{Inode, INODE_SIZE};
use kura_accelfs::layout::{Layout, Superblock, FEATURE_POSIX};
use kura_accelfs::{
    fsck, repair, Fallocate, FileSystem, FileType, FsError, MkfsOptions, MountOptions, NodeSpec,
    RenameMode, XattrMode,
};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};

fn fresh() -> (FileSystem, MemStorage) {
    let dev = MemDevice::new(64 << 20, QueueOptions::default());
    let storage = dev.storage();
    let fs = FileSystem::format(
        Box::new(dev),
        MkfsOptions::default(),
        MountOptions::default(),
    )
    .expect("format");
    (fs, storage)
}

fn remount(storage: &MemStorage) -> Result<FileSystem, FsError> {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    FileSystem::mount(Box::new(dev), MountOptions::default())
}

fn fsck_problems(storage: &MemStorage) -> Vec<String> {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    fsck(Box::new(dev)).expect("fsck runs").problems
}

/// Repairs the image in `storage` and checks that repair reports a fix mentioning `fix`.
fn repair_fixing(storage: &MemStorage, fix: &str) {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    let report = repair::repair(Box::new(dev)).expect("repair");
    assert!(report.fixed.iter().any(|f| f.contains(fix)), "{report:#?}");
}

fn assert_clean(storage: &MemStorage) {
    let p = fsck_problems(storage);
    assert!(p.is_empty(), "fsck problems: {p:#?}");
}

/// Unmounts `fs`, checks the image with fsck and mounts it again.
fn cycle(fs: FileSystem, storage: &MemStorage) -> FileSystem {
    fs.unmount().expect("unmount");
    assert_clean(storage);
    remount(storage).expect("remount")
}

/// Rewrites both superblocks of the image with `features`.
fn set_features(storage: &MemStorage, features: u32) {
    let mut image = storage.lock().expect("storage");
    let bs = 8192;
    let mut sb = Superblock::decode(&image[..bs], 0).expect("superblock");
    sb.features = features;
    let last = sb.layout.backup_superblock();
    image[..bs].copy_from_slice(&sb.encode(0));
    let at = last as usize * bs;
    image[at..at + bs].copy_from_slice(&sb.encode(last));
}

#[test]
fn symbolic_links_fast_and_slow_persist_and_read_back() {
    let (fs, storage) = fresh();
    fs.mkdir("/d").expect("mkdir");
    let short = b"../d/target".to_vec();
    let long: Vec<u8> = (0..3000).map(|i| b'a' + (i % 26) as u8).collect();
    fs.symlink(&short, "/short").expect("fast symlink");
    fs.symlink(&long, "/d/long").expect("slow symlink");
    let m = fs.metadata("/short").expect("stat");
    assert_eq!(m.file_type, FileType::Symlink);
    assert_eq!(m.size, short.len() as u64);
    assert_eq!(m.blocks, 0, "a fast symlink holds no block");
    assert_eq!(fs.metadata("/d/long").expect("stat").blocks, 1);
    let fs = cycle(fs, &storage);
    assert_eq!(fs.read_link("/short").expect("readlink"), short);
    assert_eq!(fs.read_link("/d/long").expect("readlink"), long);
    fs.write("/f", b"x").expect("write");
    let e = fs.read_link("/f").unwrap_err();
    assert!(matches!(e, FsError::NotASymlink(_)), "{e}");
    assert_eq!(e.errno(), libc::EINVAL);
    for bad in [Vec::new(), vec![b'x'; 4096], b"a\0b".to_vec()] {
        let e = fs.symlink(&bad, "/bad").unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
    }
    let e = fs.symlink(b"x", "/short").unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    // The API does not follow links: opening one is refused, not redirected.
    assert_eq!(fs.open("/short").unwrap_err().errno(), libc::EINVAL);
    let free = fs.statfs().free_blocks;
    fs.remove_file("/d/long").expect("unlink slow symlink");
    fs.sync().expect("sync");
    assert_eq!(fs.statfs().free_blocks, free + 1, "its block is freed");
    let fs = cycle(fs, &storage);
    assert!(!fs.exists("/d/long"));
    fs.unmount().expect("unmount");
}

#[test]
fn hard_links_share_an_inode_and_free_it_with_the_last_name() {
    let (fs, storage) = fresh();
    fs.create_dir_all("/a/b").expect("mkdir");
    fs.write("/a/f", &vec![7u8; 100_000]).expect("write");
    let inodes = fs.statfs().free_inodes;
    fs.hard_link("/a/f", "/a/b/g").expect("link");
    fs.hard_link("/a/f", "/h").expect("link");
    let m = fs.metadata("/h").expect("stat");
    assert_eq!(m.links, 3);
    assert_eq!(m.ino, fs.metadata("/a/f").expect("stat").ino);
    assert_eq!(fs.statfs().free_inodes, inodes, "no new inode");
    let fs = cycle(fs, &storage);
    fs.write("/a/b/g", b"new").expect("write through one name");
    assert_eq!(fs.read("/h").expect("read"), b"new");
    fs.remove_file("/a/f").expect("unlink");
    assert_eq!(fs.metadata("/h").expect("stat").links, 2);
    // Renaming over a hard link drops one link, not the inode.
    fs.write("/other", b"o").expect("write");
    fs.rename("/other", "/a/b/g").expect("rename over a link");
    assert_eq!(fs.metadata("/h").expect("stat").links, 1);
    assert_eq!(fs.read("/h").expect("read"), b"new");
    let fs = cycle(fs, &storage);
    fs.remove_file("/h").expect("last unlink");
    fs.remove_file("/a/b/g").expect("unlink");
    assert_eq!(fs.statfs().free_inodes, inodes + 1);
    let e = fs.hard_link("/a", "/a2").unwrap_err();
    assert!(matches!(e, FsError::NotPermitted(_)), "{e}");
    assert_eq!(e.errno(), libc::EPERM);
    fs.write("/x", b"x").expect("write");
    assert_eq!(fs.hard_link("/x", "/a").unwrap_err().errno(), libc::EEXIST);
    assert_eq!(
        fs.hard_link("/nope", "/y").unwrap_err().errno(),
        libc::ENOENT
    );
    let fs = cycle(fs, &storage);
    fs.unmount().expect("unmount");
}

#[test]
fn fifos_sockets_and_device_nodes_keep_their_kind_and_device_number() {
    let (fs, storage) = fresh();
    let kinds = [
        ("/fifo", FileType::Fifo, 0),
        ("/sock", FileType::Socket, 0),
        ("/null", FileType::CharDevice, (1 << 8) | 3),
        ("/disk", FileType::BlockDevice, (8 << 8) | 16),
    ];
    for (path, t, rdev) in kinds {
        let spec = NodeSpec {
            rdev,
            owner: Some((1000, 1001)),
            ..NodeSpec::new(t, 0o640)
        };
        fs.make_node_at(path, &spec).expect("mknod");
    }
    let fs = cycle(fs, &storage);
    for (path, t, rdev) in kinds {
        let m = fs.metadata(path).expect("stat");
        assert_eq!((m.file_type, m.rdev, m.mode, m.size), (t, rdev, 0o640, 0));
        assert_eq!(m.owner, Some((1000, 1001)));
        assert_eq!(fs.open(path).unwrap_err().errno(), libc::EINVAL);
    }
    let listed: Vec<FileType> = fs
        .read_dir("/")
        .expect("ls")
        .into_iter()
        .map(|e| e.file_type)
        .collect();
    for (_, t, _) in kinds {
        assert!(listed.contains(&t), "{t:?} listed");
    }
    fs.hard_link("/fifo", "/fifo2")
        .expect("a FIFO can be hard linked");
    fs.remove_file("/fifo").expect("unlink");
    fs.remove_file("/null").expect("unlink");
    let fs = cycle(fs, &storage);
    assert_eq!(fs.metadata("/fifo2").expect("stat").links, 1);
    fs.unmount().expect("unmount");
}

#[test]
fn extended_attributes_follow_linux_semantics_and_the_size_cap() {
    let (fs, storage) = fresh();
    fs.write("/f", b"data").expect("write");
    let ino = fs.metadata("/f").expect("stat").ino;
    let free = fs.statfs().free_blocks;
    fs.set_xattr(ino, b"user.a", b"1", XattrMode::Any)
        .expect("set");
    fs.set_xattr(ino, b"trusted.t", &[0, 1, 2], XattrMode::Create)
        .expect("create");
    fs.set_xattr(ino, b"security.s", b"", XattrMode::Any)
        .expect("empty value");
    assert_eq!(fs.statfs().free_blocks, free - 1, "one attribute block");
    let errno = |r: Result<(), FsError>| r.unwrap_err().errno();
    assert_eq!(
        errno(fs.set_xattr(ino, b"user.a", b"2", XattrMode::Create)),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.set_xattr(ino, b"user.zz", b"2", XattrMode::Replace)),
        libc::ENODATA
    );
    assert_eq!(
        fs.get_xattr(ino, b"user.none").unwrap_err().errno(),
        libc::ENODATA
    );
    assert_eq!(
        errno(fs.set_xattr(ino, b"system.posix_acl_access", b"x", XattrMode::Any)),
        libc::EOPNOTSUPP
    );
    let long_name = [b"user.".as_slice(), &[b'n'; 300]].concat();
    assert_eq!(
        errno(fs.set_xattr(ino, &long_name, b"x", XattrMode::Any)),
        libc::ERANGE
    );
    assert_eq!(
        errno(fs.set_xattr(ino, b"user.big", &vec![0; 70_000], XattrMode::Any)),
        libc::E2BIG
    );
    // Everything of one inode fits in one 8 KiB block.
    assert_eq!(
        errno(fs.set_xattr(ino, b"user.big", &vec![0; 8200], XattrMode::Any)),
        libc::ENOSPC
    );
    fs.set_xattr(ino, b"user.a", &vec![9; 4000], XattrMode::Replace)
        .expect("replace with a larger value");
    assert_eq!(errno(fs.remove_xattr(ino, b"user.none")), libc::ENODATA);
    let fs = cycle(fs, &storage);
    assert_eq!(
        fs.list_xattr(ino).expect("list"),
        vec![
            b"user.a".to_vec(),
            b"trusted.t".to_vec(),
            b"security.s".to_vec()
        ]
    );
    assert_eq!(fs.get_xattr(ino, b"user.a").expect("get"), vec![9; 4000]);
    assert_eq!(fs.get_xattr(ino, b"trusted.t").expect("get"), vec![0, 1, 2]);
    assert_eq!(fs.get_xattr(ino, b"security.s").expect("get"), b"");
    // Directories and symlinks have attributes too.
    fs.mkdir("/d").expect("mkdir");
    let d = fs.metadata("/d").expect("stat").ino;
    fs.set_xattr(d, b"user.dir", b"yes", XattrMode::Any)
        .expect("set on a directory");
    for name in [&b"user.a"[..], b"trusted.t", b"security.s"] {
        fs.remove_xattr(ino, name).expect("remove");
    }
    fs.sync().expect("sync");
    assert_eq!(
        fs.statfs().free_blocks,
        free - 2,
        "the file's attribute block is freed; the directory holds a block and an attribute block"
    );
    let fs = cycle(fs, &storage);
    assert!(fs.list_xattr(ino).expect("list").is_empty());
    assert_eq!(fs.get_xattr(d, b"user.dir").expect("get"), b"yes");
    fs.remove_dir("/d").expect("rmdir");
    fs.sync().expect("sync");
    assert_eq!(
        fs.statfs().free_blocks,
        free,
        "rmdir freed its attribute block too"
    );
    let fs = cycle(fs, &storage);
    fs.unmount().expect("unmount");
}

#[test]
fn owners_and_nanosecond_times_persist() {
    let (fs, storage) = fresh();
    fs.write("/f", b"x").expect("write");
    let ino = fs.metadata("/f").expect("stat").ino;
    assert_eq!(fs.metadata("/f").expect("stat").owner, None);
    fs.set_owner(ino, Some(1234), None).expect("chown uid");
    assert_eq!(fs.metadata("/f").expect("stat").owner, Some((1234, 0)));
    fs.set_owner(ino, None, Some(99)).expect("chgrp");
    let before = fs.metadata("/f").expect("stat").ctime_ns;
    let (a, m) = (981_173_106_123_456_789, 1_000_000_000_000_000_001);
    fs.set_times(ino, Some(a), Some(m)).expect("utimens");
    let fs = cycle(fs, &storage);
    let st = fs.metadata("/f").expect("stat");
    assert_eq!(st.owner, Some((1234, 99)));
    assert_eq!((st.atime_ns, st.mtime_ns), (a, m));
    assert!(st.ctime_ns >= before, "ctime moves on");
    fs.set_times(ino, None, Some(5)).expect("mtime only");
    assert_eq!(fs.metadata("/f").expect("stat").atime_ns, a);
    fs.unmount().expect("unmount");
}

#[test]
fn rename_noreplace_and_exchange() {
    let (fs, storage) = fresh();
    fs.create_dir_all("/d1/sub").expect("mkdir");
    fs.mkdir("/d2").expect("mkdir");
    fs.write("/d1/a", b"A").expect("write");
    fs.write("/d2/b", b"B").expect("write");
    let e = fs
        .rename_with("/d1/a", "/d2/b", RenameMode::NoReplace)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    assert_eq!(fs.read("/d2/b").expect("read"), b"B", "nothing replaced");
    fs.rename_with("/d1/a", "/d2/c", RenameMode::NoReplace)
        .expect("noreplace to a new name");
    fs.rename_with("/d2/c", "/d2/b", RenameMode::Exchange)
        .expect("exchange files");
    assert_eq!(fs.read("/d2/b").expect("read"), b"A");
    assert_eq!(fs.read("/d2/c").expect("read"), b"B");
    // A directory and a file swap across directories; the directory's parent follows.
    fs.rename_with("/d1/sub", "/d2/c", RenameMode::Exchange)
        .expect("exchange a directory and a file");
    assert!(fs.metadata("/d2/c").expect("stat").is_dir());
    assert_eq!(fs.read("/d1/sub").expect("read"), b"B");
    assert_eq!(
        fs.metadata("/d2/c").expect("stat").parent,
        fs.metadata("/d2").expect("stat").ino
    );
    assert_eq!(
        fs.rename_with("/d1/sub", "/d1/none", RenameMode::Exchange)
            .unwrap_err()
            .errno(),
        libc::ENOENT
    );
    // A directory cannot be swapped into its own subtree.
    fs.mkdir("/d2/c/inner").expect("mkdir");
    assert_eq!(
        fs.rename_with("/d2/c", "/d2/c/inner", RenameMode::Exchange)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    let fs = cycle(fs, &storage);
    assert!(fs.metadata("/d2/c/inner").expect("stat").is_dir());
    fs.unmount().expect("unmount");
}

#[test]
fn fallocate_allocates_keeps_size_and_punches_holes() {
    let (fs, storage) = fresh();
    let f = fs.create("/f").expect("create");
    let ino = f.ino();
    f.write_at(0, &vec![0xAB; 100_000]).expect("write");
    fs.fallocate(
        ino,
        50_000,
        200_000,
        Fallocate::Allocate { keep_size: false },
    )
    .expect("allocate");
    let m = fs.metadata("/f").expect("stat");
    assert_eq!(m.size, 250_000);
    assert_eq!(m.blocks, 250_000u64.div_ceil(8192));
    let data = fs.read("/f").expect("read");
    assert!(data[..100_000].iter().all(|&b| b == 0xAB), "data kept");
    assert!(
        data[100_000..].iter().all(|&b| b == 0),
        "new blocks read as zeroes"
    );
    fs.fallocate(
        ino,
        400_000,
        100_000,
        Fallocate::Allocate { keep_size: true },
    )
    .expect("keep size");
    assert_eq!(fs.metadata("/f").expect("stat").size, 250_000);
    assert_eq!(
        fs.allocated_ranges_ino(ino).expect("ranges"),
        vec![0..250_000],
        "blocks past the size are not data"
    );
    let before = fs.metadata("/f").expect("stat").blocks;
    // Punch 10_000..60_000: blocks 2..7 whole (16_384..57_344), edges zeroed.
    fs.fallocate(ino, 10_000, 50_000, Fallocate::PunchHole)
        .expect("punch");
    let m = fs.metadata("/f").expect("stat");
    assert_eq!(m.size, 250_000, "size kept");
    assert_eq!(m.blocks, before - 5);
    let fs = cycle(fs, &storage);
    let data = fs.read("/f").expect("read");
    assert!(data[..10_000].iter().all(|&b| b == 0xAB));
    assert!(
        data[10_000..60_000].iter().all(|&b| b == 0),
        "hole reads zero"
    );
    assert!(data[60_000..100_000].iter().all(|&b| b == 0xAB));
    assert_eq!(
        fs.fallocate(ino, 0, 0, Fallocate::PunchHole)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    fs.mkdir("/d").expect("mkdir");
    let d = fs.metadata("/d").expect("stat").ino;
    assert_eq!(
        fs.fallocate(d, 0, 1, Fallocate::PunchHole)
            .unwrap_err()
            .errno(),
        libc::EISDIR
    );
    fs.unmount().expect("unmount");
}

#[test]
fn an_image_without_the_posix_feature_mounts_and_refuses_only_what_needs_it() {
    let (fs, storage) = fresh();
    fs.write("/old", b"v1 file").expect("write");
    fs.unmount().expect("unmount");
    set_features(&storage, 0);
    assert_clean(&storage);
    let fs = remount(&storage).expect("a version-1 image mounts");
    assert_eq!(fs.read("/old").expect("read"), b"v1 file");
    let ino = fs.metadata("/old").expect("stat").ino;
    let unsupported = [
        fs.symlink(b"old", "/l").unwrap_err(),
        fs.hard_link("/old", "/h").unwrap_err(),
        fs.make_node_at("/p", &NodeSpec::new(FileType::Fifo, 0o644))
            .unwrap_err(),
        fs.set_xattr(ino, b"user.x", b"1", XattrMode::Any)
            .unwrap_err(),
    ];
    for e in unsupported {
        assert_eq!(e.errno(), libc::EOPNOTSUPP, "{e}");
        assert!(e.to_string().contains("predates the posix feature"), "{e}");
    }
    // What needs no flag works.
    fs.set_owner(ino, Some(5), Some(6)).expect("chown");
    fs.set_times(ino, Some(1), Some(2)).expect("utimens");
    fs.write("/new", b"n").expect("write");
    fs.rename_with("/new", "/old", RenameMode::Exchange)
        .expect("exchange");
    let fs = cycle(fs, &storage);
    assert_eq!(fs.read("/new").expect("read"), b"v1 file");
    fs.unmount().expect("unmount");
    // `fsck --repair --enable-posix` turns the feature on; then everything works.
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    let report = repair::repair_with(Box::new(dev), repair::RepairOptions { enable_posix: true })
        .expect("repair");
    assert!(
        report.fixed.iter().any(|f| f.contains("as asked")),
        "{report:#?}"
    );
    assert_clean(&storage);
    let fs = remount(&storage).expect("mount");
    fs.symlink(b"old", "/l").expect("symlink after enabling");
    fs.hard_link("/old", "/h").expect("link after enabling");
    let fs = cycle(fs, &storage);
    assert_eq!(fs.read_link("/l").expect("readlink"), b"old");
    fs.unmount().expect("unmount");
    // An unknown feature bit refuses the image cleanly.
    set_features(&storage, FEATURE_POSIX | 0x40);
    let e = remount(&storage).unwrap_err();
    assert!(e.to_string().contains("unknown feature flags"), "{e}");
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    assert!(fsck(Box::new(dev)).is_err(), "fsck refuses it too");
}

#[test]
fn fsck_finds_a_damaged_attribute_block_and_repair_drops_it() {
    let (fs, storage) = fresh();
    fs.write("/f", b"x").expect("write");
    let ino = fs.metadata("/f").expect("stat").ino;
    fs.set_xattr(ino, b"user.k", b"value", XattrMode::Any)
        .expect("set");
    fs.unmount().expect("unmount");
    assert_clean(&storage);
    // Find the attribute block by its magic (its home copy: the last one, after the journal's
    // images of it) and damage a byte of its records.
    {
        let mut image = storage.lock().expect("storage");
        let magic = u32::from_le_bytes(*b"AKXA").to_le_bytes();
        let at = (0..image.len() / 8192)
            .map(|b| b * 8192)
            .rfind(|&at| image[at..at + 4] == magic)
            .expect("an attribute block");
        image[at + 30] ^= 0xFF;
    }
    let problems = fsck_problems(&storage);
    assert!(
        problems.iter().any(|p| p.contains("extended-attribute")),
        "{problems:#?}"
    );
    assert!(remount(&storage).is_ok(), "mount loads attributes lazily");
    let fs = remount(&storage).expect("mount");
    assert_eq!(fs.get_xattr(ino, b"user.k").unwrap_err().errno(), libc::EIO);
    drop(fs);
    repair_fixing(&storage, "dropped its attributes");
    assert_clean(&storage);
    let fs = remount(&storage).expect("mount");
    assert!(fs.list_xattr(ino).expect("list").is_empty());
    assert_eq!(fs.read("/f").expect("read"), b"x");
    fs.unmount().expect("unmount");
}

/// Changes inode `ino` of an unmounted 8 KiB-block image with `f`, keeping its checksums right.
fn patch_inode(storage: &MemStorage, ino: u64, f: impl FnOnce(&mut Inode)) {
    let bs = 8192;
    let mut image = storage.lock().expect("storage");
    let l = Superblock::decode(&image[..bs], 0)
        .expect("superblock")
        .layout;
    let per = Layout::inodes_per_block(l.block_size);
    let block = (l.inode_table_start + ino / per) as usize;
    let at = HEADER_LEN + (ino % per) as usize * INODE_SIZE;
    let b = &mut image[block * bs..(block + 1) * bs];
    let mut inode = Inode::decode(ino, &b[at..at + INODE_SIZE]).expect("inode");
    f(&mut inode);
    b[at..at + INODE_SIZE].copy_from_slice(&inode.encode());
    seal(b, BlockKind::InodeTable, block as u64);
}

#[test]
fn fsck_counts_every_hard_link_and_repair_restores_the_count() {
    let (fs, storage) = fresh();
    fs.create_dir_all("/a/b").expect("mkdir");
    fs.write("/f", b"shared").expect("write");
    fs.hard_link("/f", "/a/g").expect("link");
    fs.hard_link("/f", "/a/b/h").expect("link");
    let ino = fs.metadata("/f").expect("stat").ino;
    fs.unmount().expect("unmount");
    assert_clean(&storage);
    patch_inode(&storage, ino, |i| i.links = 1);
    let problems = fsck_problems(&storage);
    assert!(
        problems
            .iter()
            .any(|p| p.contains(&format!("inode {ino} has link count 1 but 3"))),
        "{problems:#?}"
    );
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    let report = repair::repair(Box::new(dev)).expect("repair");
    assert!(!report.fixed.is_empty(), "{report:#?}");
    assert_clean(&storage);
    let fs = remount(&storage).expect("mount");
    assert_eq!(fs.metadata("/a/b/h").expect("stat").links, 3);
    fs.unmount().expect("unmount");
}

#[test]
fn fsck_reports_posix_structures_on_an_image_without_the_feature() {
    let (fs, storage) = fresh();
    fs.symlink(b"target", "/l").expect("symlink");
    fs.write("/f", b"x").expect("write");
    fs.hard_link("/f", "/g").expect("link");
    fs.unmount().expect("unmount");
    set_features(&storage, 0);
    let problems = fsck_problems(&storage);
    assert_eq!(
        problems
            .iter()
            .filter(|p| p.contains("does not have it"))
            .count(),
        2,
        "the symlink and the hard-linked file: {problems:#?}"
    );
    let fs = remount(&storage).expect("mount");
    let e = fs.read_link("/l").unwrap_err();
    assert!(e.to_string().contains("posix feature"), "{e}");
    drop(fs);
    // Repair sets the flag (both superblocks), keeping the symlink and the links.
    repair_fixing(&storage, "set its flag in both superblocks");
    assert_clean(&storage);
    let fs = remount(&storage).expect("mount");
    assert_eq!(fs.read_link("/l").expect("readlink"), b"target");
    assert_eq!(fs.metadata("/g").expect("stat").links, 2);
    fs.unmount().expect("unmount");
}
