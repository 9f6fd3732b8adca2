//! Hostile images (issue 13 item 6): crafted or damaged AccelFS images end in a clear, typed
//! error within seconds and in bounded memory — never a hang, a panic, or an allocation sized by
//! a number read from the image.
//!
//! - Four crafted images, each the case a review found: directory extents that share device
//!   blocks, a journal far longer than its (sparse) device, a cycle of parent pointers followed
//!   by a rename through it, and a file whose size is 2^62. Each runs in a child process (this
//!   test binary, filtered to [`hostile_case_child`]) under `ulimit -v`, which reports its peak
//!   resident memory; the parent checks the child's verdict, its time and that peak.
//! - Crafted `posix` structures: an attribute block pointing into metadata or at another file's
//!   data, symbolic links with impossible sizes or extents, special files with data.
//! - A property test mutates random bytes of a small, populated image (raw, or with the block's
//!   checksums recomputed so the change gets past them) and mounts (read-write and read-only),
//!   walks, reads and fscks it: every outcome is `Ok` or a typed error, each within a deadline.

use kura_accelfs::header::{seal, write_u32, write_u64, BlockKind, HEADER_LEN};
use kura_accelfs::inode::{Inode, INODE_SIZE};
use kura_accelfs::journal::{JournalArea, JournalSuper};
use kura_accelfs::layout::{Layout, Superblock};
use kura_accelfs::{fsck, FileSystem, FileType, FormatError, FsError, MkfsOptions, MountOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::crc32c::crc32c_skipping;
use proptest::prelude::*;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BS: usize = 4096;
const DEVICE_BYTES: u64 = 8 << 20;
/// Address space a child may use (KiB, for `ulimit -v`): the test binary, its 16 MiB buffer
/// pool and a small image need well under this; an allocation sized by a crafted number
/// (gigabytes to 2^62 bytes) fails against it.
const CHILD_VIRTUAL_KIB: u64 = 1 << 20;
/// Peak resident memory a child may reach.
const CHILD_PEAK_KIB: u64 = 256 << 10;
/// Seconds a crafted image may take to fail (debug build, shared machine).
const CASE_SECONDS: u64 = 30;

fn populated() -> MemStorage {
    let dev = MemDevice::new(DEVICE_BYTES, QueueOptions::default());
    let storage = dev.storage();
    let fs = FileSystem::format(
        Box::new(dev),
        MkfsOptions {
            block_size: BS as u32,
            inodes: Some(128),
        },
        MountOptions::default(),
    )
    .expect("format");
    fs.create_dir_all("/d/e").expect("mkdir");
    for i in 0..6usize {
        fs.write(&format!("/d/f{i}"), &vec![i as u8 + 1; 3000 * i + 1])
            .expect("write");
    }
    fs.mkdir("/a").expect("mkdir");
    fs.mkdir("/b").expect("mkdir");
    fs.mkdir("/c").expect("mkdir");
    fs.write("/f", &[7u8; 10_000]).expect("write");
    fs.unmount().expect("unmount");
    storage
}

fn device(storage: &MemStorage) -> Box<MemDevice> {
    Box::new(MemDevice::with_storage(
        storage.clone(),
        QueueOptions::default(),
    ))
}

/// Checks that fsck of the image in `storage` reports a problem mentioning `what`.
fn assert_fsck_finds(storage: &MemStorage, what: &str) {
    let report = fsck(device(storage)).expect("fsck");
    assert!(
        report.problems.iter().any(|p| p.contains(what)),
        "{:?}",
        report.problems
    );
}

fn layout(storage: &MemStorage) -> Layout {
    let image = storage.lock().expect("storage");
    Superblock::decode(&image[..BS], 0)
        .expect("superblock")
        .layout
}

fn ino_of(storage: &MemStorage, path: &str) -> u64 {
    let fs = FileSystem::mount_read_only(device(storage), MountOptions::default()).expect("mount");
    fs.metadata(path).expect("stat").ino
}

fn inode_at(l: &Layout, ino: u64) -> (usize, usize) {
    let per = Layout::inodes_per_block(l.block_size);
    let block = (l.inode_table_start + ino / per) as usize;
    (block, HEADER_LEN + (ino % per) as usize * INODE_SIZE)
}

/// Changes inode `ino` with `f` and writes it back with both its checksums correct.
fn patch_inode(storage: &MemStorage, ino: u64, f: impl FnOnce(&mut Inode)) {
    let l = layout(storage);
    let (block, at) = inode_at(&l, ino);
    let mut image = storage.lock().expect("storage");
    let b = &mut image[block * BS..(block + 1) * BS];
    let mut inode = Inode::decode(ino, &b[at..at + INODE_SIZE]).expect("inode");
    f(&mut inode);
    b[at..at + INODE_SIZE].copy_from_slice(&inode.encode());
    seal(b, BlockKind::InodeTable, block as u64);
}

fn is_corrupt(e: &FsError, needle: &str) -> bool {
    matches!(e, FsError::Format(FormatError::Corrupt(m)) if m.contains(needle))
}

/// Runs `f` on another thread and fails if it does not finish within `seconds` (a hang).
fn within<T: Send + 'static>(seconds: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(seconds)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("did not finish within {seconds} s (a hang?)")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("it panicked (see above)"),
    }
}

// ---- the crafted cases ------------------------------------------------------------------

/// Directory `/d`'s four extents all map its one block: a directory of four blocks that are one
/// (with an extent chain, 2^32 blocks that are one). Mount must refuse the map, naming the inode.
fn overlapping_directory_extents() -> Result<(), String> {
    let storage = populated();
    let d = ino_of(&storage, "/d");
    patch_inode(&storage, d, |i| {
        let p = i.inline[0].physical;
        for (k, e) in i.inline.iter_mut().enumerate() {
            e.logical = k as u32;
            e.length = 1;
            e.physical = p;
        }
        i.extent_count = 4;
        i.size = 4 * BS as u64;
        i.blocks = 4;
    });
    let fs = FileSystem::mount(device(&storage), MountOptions::default())
        .map_err(|e| format!("mount refused the whole image: {e}"))?;
    match fs.read_dir("/d") {
        Err(e) if is_corrupt(&e, &format!("inode {d}")) && e.to_string().contains("overlaps") => {}
        other => return Err(format!("listing /d: {other:?}")),
    }
    drop(fs);
    let report = fsck(device(&storage)).map_err(|e| e.to_string())?;
    if !report
        .problems
        .iter()
        .any(|p| p.contains(&format!("inode {d}")) && p.contains("overlaps"))
    {
        return Err(format!(
            "fsck did not name inode {d}: {:?}",
            report.problems
        ));
    }
    // The same map on the root: mount itself refuses.
    patch_inode(&storage, 1, |i| {
        let p = i.inline[0].physical;
        i.inline[1] = kura_accelfs::extent::Extent {
            logical: 1,
            length: 1,
            physical: p,
        };
        i.extent_count = 2;
        i.size = 2 * BS as u64;
    });
    match FileSystem::mount(device(&storage), MountOptions::default()) {
        Err(e) if is_corrupt(&e, "inode 1") => Ok(()),
        other => Err(format!(
            "mounting with the root's extents overlapping: {other:?}"
        )),
    }
}

/// A sparse 64 GiB image file whose superblock states a journal of half the device (about 4
/// million blocks, 32 GiB): mount and fsck must refuse the superblock before reading the log.
fn huge_journal_on_a_sparse_file() -> Result<(), String> {
    let path =
        std::env::temp_dir().join(format!("kura-hostile-journal-{}.img", std::process::id()));
    let result = (|| {
        let bs = 8192u32;
        let total = (64u64 << 30) / u64::from(bs);
        let mut l = Layout::plan(bs, total, None).map_err(|e| e.to_string())?;
        let grow = total / 2 - l.journal_len;
        l.journal_len += grow;
        l.block_bitmap_start += grow;
        l.inode_bitmap_start += grow;
        l.inode_table_start += grow;
        l.data_start += grow;
        let sb = Superblock {
            layout: l,
            uuid: [7; 16],
            mkfs_time_ns: 1,
            features: 0,
        };
        let file = std::fs::File::create(&path).map_err(|e| e.to_string())?;
        file.set_len(total * u64::from(bs))
            .map_err(|e| e.to_string())?;
        use std::os::unix::fs::FileExt;
        let area = JournalArea {
            start: 1,
            len: l.journal_len,
        };
        let writes = [
            (0, sb.encode(0)),
            (total - 1, sb.encode(total - 1)),
            (
                1,
                JournalSuper {
                    oldest_seq: 1,
                    oldest_pos: 0,
                    generation: 0,
                }
                .encode(bs as usize, area.super_block(0)),
            ),
        ];
        for (n, b) in writes {
            file.write_all_at(&b, n * u64::from(bs))
                .map_err(|e| e.to_string())?;
        }
        // One transaction of descriptors that never say "last", filling the whole log: a
        // reader that trusts the journal length reads and holds all of it (32 GiB, and the
        // same again for the commit CRC's input) before finding no commit.
        let per = (bs as usize - 32) / 8;
        let mut pos = 0u64;
        while pos < area.slots() {
            let n = area.block_at(pos);
            let mut d = vec![0u8; bs as usize];
            write_u64(&mut d, HEADER_LEN, 1);
            write_u32(&mut d, HEADER_LEN + 8, per as u32);
            write_u32(&mut d, HEADER_LEN + 12, 0);
            for i in 0..per {
                write_u64(&mut d, 32 + i * 8, l.data_start + 1);
            }
            seal(&mut d, BlockKind::JournalDescriptor, n);
            file.write_all_at(&d, n * u64::from(bs))
                .map_err(|e| e.to_string())?;
            pos += per as u64 + 1;
        }
        drop(file);
        let spec = format!("file:{}", path.display());
        let open = || kura_engine::open(&spec).map_err(|e| format!("open {spec}: {e}"));
        let says_journal = |e: &FsError| matches!(e, FsError::Format(FormatError::BadSuperblock(m)) if m.contains("journal"));
        match FileSystem::mount(open()?, MountOptions::default()) {
            Err(e) if says_journal(&e) => {}
            other => return Err(format!("mount: {other:?}")),
        }
        match FileSystem::mount_read_only(open()?, MountOptions::default()) {
            Err(e) if says_journal(&e) => {}
            other => return Err(format!("read-only mount: {other:?}")),
        }
        match fsck(open()?) {
            Err(e) if says_journal(&e) => Ok(()),
            other => Err(format!("fsck: {other:?}")),
        }
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// `/a` and `/b` name each other as parent; moving `/c` into `/a` walks up from `/a` to check
/// that `/c` is not its ancestor. Before: an endless walk with the file-system lock held.
fn parent_cycle_then_rename() -> Result<(), String> {
    let storage = populated();
    let (a, b) = (ino_of(&storage, "/a"), ino_of(&storage, "/b"));
    patch_inode(&storage, a, |i| i.parent = b);
    patch_inode(&storage, b, |i| i.parent = a);
    let fs = FileSystem::mount(device(&storage), MountOptions::default())
        .map_err(|e| format!("mount: {e}"))?;
    let moved = within(CASE_SECONDS, {
        let fs = fs.clone();
        move || fs.rename("/c", "/a/c")
    });
    match moved {
        Err(e) if is_corrupt(&e, "loops") => {}
        other => return Err(format!("rename through the cycle: {other:?}")),
    }
    // Nothing changed, and the file system still answers.
    if !fs.exists("/c") || fs.exists("/a/c") {
        return Err("the failed rename changed the namespace".into());
    }
    drop(fs);
    let report = fsck(device(&storage)).map_err(|e| e.to_string())?;
    if report.is_clean() {
        return Err("fsck found nothing wrong with a parent cycle".into());
    }
    Ok(())
}

/// `/f` says it is 2^62 bytes long. Before: `fs.read` allocated that much, `fs get` wrote zeroes
/// until the disk was full. Now opening, stat and reading it are corruption errors.
fn file_size_of_2_pow_62() -> Result<(), String> {
    let storage = populated();
    let f = ino_of(&storage, "/f");
    patch_inode(&storage, f, |i| i.size = 1 << 62);
    let fs = FileSystem::mount(device(&storage), MountOptions::default())
        .map_err(|e| format!("mount: {e}"))?;
    let needle = format!("inode {f}: size");
    match fs.read("/f") {
        Err(e) if is_corrupt(&e, &needle) => {}
        other => return Err(format!("read: {:?}", other.map(|v| v.len()))),
    }
    match fs.metadata("/f") {
        Err(e) if is_corrupt(&e, &needle) => {}
        other => return Err(format!("stat: {other:?}")),
    }
    match fs.open("/f") {
        Err(e) if is_corrupt(&e, &needle) => {}
        other => return Err(format!("open: {:?}", other.map(|f| f.ino()))),
    }
    // The rest of the file system is still usable.
    fs.read_dir("/").map_err(|e| format!("list /: {e}"))?;
    drop(fs);
    let report = fsck(device(&storage)).map_err(|e| e.to_string())?;
    if !report.problems.iter().any(|p| p.contains(&needle)) {
        return Err(format!("fsck: {:?}", report.problems));
    }
    Ok(())
}

/// A crafted case: `Ok` when every step ended in the expected clear error.
type Case = fn() -> Result<(), String>;

const CASES: &[(&str, Case)] = &[
    (
        "overlapping_directory_extents",
        overlapping_directory_extents,
    ),
    (
        "huge_journal_on_a_sparse_file",
        huge_journal_on_a_sparse_file,
    ),
    ("parent_cycle_then_rename", parent_cycle_then_rename),
    ("file_size_of_2_pow_62", file_size_of_2_pow_62),
];

/// Peak resident memory of this process (KiB), from /proc/self/status.
fn peak_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The child's side: runs the case named by `KURA_HOSTILE_CASE` (does nothing without it, so
/// the ordinary test run passes it trivially) and prints its verdict and peak memory.
#[test]
fn hostile_case_child() {
    let Ok(name) = std::env::var("KURA_HOSTILE_CASE") else {
        return;
    };
    let (_, case) = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    let verdict = case();
    println!("KURA_PEAK_KIB={}", peak_kib().unwrap_or(0));
    if let Err(why) = verdict {
        panic!("{name}: {why}");
    }
}

#[test]
fn crafted_images_fail_clearly_fast_and_in_bounded_memory() {
    let exe = std::env::current_exe().expect("test binary");
    for (name, _) in CASES {
        let started = Instant::now();
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -v {CHILD_VIRTUAL_KIB} && exec \"$0\" --exact hostile_case_child --nocapture --test-threads=1"
            ))
            .arg(&exe)
            .env("KURA_HOSTILE_CASE", name)
            .env("KURA_POOL_MIB", "16")
            .output()
            .expect("run the child");
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{name}: the child failed ({:?}):\n{stdout}\n{stderr}",
            out.status
        );
        let peak: u64 = stdout
            .lines()
            .find_map(|l| l.split("KURA_PEAK_KIB=").nth(1))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name}: the child did not run the case:\n{stdout}"));
        assert!(
            took < Duration::from_secs(CASE_SECONDS),
            "{name}: took {took:?}"
        );
        assert!(
            peak < CHILD_PEAK_KIB,
            "{name}: peak resident memory {peak} KiB"
        );
        eprintln!("{name}: clear error in {took:?}, peak {peak} KiB");
    }
}

#[test]
fn sparse_files_report_their_data_ranges_and_holes() {
    let fs = FileSystem::format(
        Box::new(MemDevice::new(DEVICE_BYTES, QueueOptions::default())),
        MkfsOptions {
            block_size: BS as u32,
            inodes: None,
        },
        MountOptions {
            max_command_bytes: 2 * BS,
            bypass_bytes: 2 * BS,
            ..MountOptions::default()
        },
    )
    .expect("format");
    let f = fs.create("/sparse").expect("create");
    f.write_at(0, b"head").expect("write");
    f.write_at(1 << 20, &[1u8; 5000]).expect("write");
    f.set_len(1 << 40).expect("extend");
    let one_mib = 1u64 << 20;
    assert_eq!(
        f.allocated_ranges().expect("ranges"),
        vec![0..BS as u64, one_mib..one_mib + 2 * BS as u64]
    );
    assert_eq!(
        fs.allocated_ranges_ino(f.ino()).expect("ranges"),
        f.allocated_ranges().expect("ranges")
    );
    // Streaming plans a window of commands at a time: with 8 KiB commands a window is 2 MiB,
    // so this read crosses several, through data and holes alike.
    drop(f);
    let f = fs.open("/sparse").expect("open");
    let (from, len) = ((1u64 << 20) - 100, 9u64 << 20);
    let mut positioned = vec![0u8; len as usize];
    f.read_exact_at(from, &mut positioned).expect("read");
    let mut streamed = Vec::new();
    f.read_stream(from, len, |b| streamed.extend_from_slice(b))
        .expect("stream");
    assert_eq!(streamed.len(), positioned.len());
    assert!(
        streamed == positioned,
        "streamed and positioned reads differ"
    );
    assert_eq!(&streamed[100..100 + 5000], &[1u8; 5000][..]);
    let f = fs
        .open_with(
            "/sparse",
            kura_accelfs::OpenOptions::new().read(true).write(true),
        )
        .expect("open");
    f.set_len(10).expect("shrink");
    assert_eq!(f.allocated_ranges().expect("ranges"), vec![0..10]);
    assert!(fs.allocated_ranges_ino(1).is_err(), "a directory has none");
}

/// `/f`'s data blocks are marked free in the block bitmap: the allocator would hand them to the
/// next file written, cross-linking the two. Loading `/f` refuses it instead. (Only a load before
/// the blocks are handed out can notice: mount does not read every inode; fsck does.)
#[test]
fn blocks_marked_free_are_not_trusted_as_a_files_data() {
    let storage = populated();
    let l = layout(&storage);
    let f = ino_of(&storage, "/f");
    let (block, at) = inode_at(&l, f);
    let first = {
        let image = storage.lock().expect("storage");
        Inode::decode(f, &image[block * BS + at..block * BS + at + INODE_SIZE])
            .expect("inode")
            .inline[0]
    };
    {
        let mut image = storage.lock().expect("storage");
        let bits = Layout::bits_per_bitmap_block(l.block_size);
        for p in first.physical..first.physical + u64::from(first.length) {
            let n = (l.block_bitmap_start + p / bits) as usize;
            let bit = p % bits;
            let b = &mut image[n * BS..(n + 1) * BS];
            b[HEADER_LEN + (bit / 8) as usize] &= !(1 << (bit % 8));
            seal(b, BlockKind::BlockBitmap, n as u64);
        }
    }
    let fs = FileSystem::mount(device(&storage), MountOptions::default()).expect("mount");
    match fs.read("/f") {
        Err(e)
            if is_corrupt(&e, &format!("inode {f}")) && e.to_string().contains("marked free") => {}
        other => panic!("reading /f: {:?}", other.map(|v| v.len())),
    }
    drop(fs);
    let report = fsck(device(&storage)).expect("fsck");
    assert!(
        report.problems.iter().any(|p| p.contains("marked free")),
        "{:?}",
        report.problems
    );
}

#[test]
fn crafted_posix_structures_are_errors_not_trust() {
    let storage = populated();
    let l = layout(&storage);
    let f = ino_of(&storage, "/f");
    let other = ino_of(&storage, "/d/f5");
    let clean = storage.lock().expect("storage").clone();
    let reset = |s: &MemStorage| s.lock().expect("storage").copy_from_slice(&clean);
    // An attribute block inside the inode table: refused when the inode loads.
    patch_inode(&storage, f, |i| i.xattr_block = l.inode_table_start);
    let fs = FileSystem::mount(device(&storage), MountOptions::default()).expect("mount");
    let e = fs.metadata("/f").unwrap_err();
    assert!(is_corrupt(&e, "outside the data region"), "{e}");
    drop(fs);
    assert_fsck_finds(&storage, "extended-attribute block");
    // An attribute block that is another file's data: reading it fails its header check.
    reset(&storage);
    let data = {
        let image = storage.lock().expect("storage");
        let (block, at) = inode_at(&l, other);
        Inode::decode(other, &image[block * BS + at..block * BS + at + INODE_SIZE])
            .expect("inode")
            .inline[0]
            .physical
    };
    patch_inode(&storage, f, |i| i.xattr_block = data);
    let fs = FileSystem::mount(device(&storage), MountOptions::default()).expect("mount");
    let ino = fs.metadata("/f").expect("stat").ino;
    let e = fs.list_xattr(ino).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    drop(fs);
    assert_fsck_finds(&storage, "also claimed by");
    // A symbolic link whose size says its target is in a block it does not have, one that is
    // too long, and a FIFO with data: each inode is refused by name.
    for (what, patch) in [
        (
            "not one block",
            Box::new(|i: &mut Inode| {
                i.kind = kura_accelfs::inode::Kind::Symlink;
                i.size = 500;
                i.extent_count = 0;
                i.inline = [kura_accelfs::extent::Extent::EMPTY; 4];
                i.blocks = 0;
            }) as Box<dyn FnOnce(&mut Inode)>,
        ),
        (
            "symbolic link of",
            Box::new(|i: &mut Inode| {
                i.kind = kura_accelfs::inode::Kind::Symlink;
                i.size = 1 << 40;
            }),
        ),
        (
            "with data",
            Box::new(|i: &mut Inode| i.kind = kura_accelfs::inode::Kind::Fifo),
        ),
    ] {
        reset(&storage);
        patch_inode(&storage, f, patch);
        let fs = FileSystem::mount(device(&storage), MountOptions::default()).expect("mount");
        let e = fs.metadata("/f").unwrap_err();
        assert!(is_corrupt(&e, what), "{what}: {e}");
        drop(fs);
        let report = fsck(device(&storage)).expect("fsck");
        assert!(
            report.problems.iter().any(|p| p.contains(what)),
            "{what}: {:?}",
            report.problems
        );
    }
}

// ---- random damage ----------------------------------------------------------------------

/// A small populated image — with symbolic links (fast and slow), a hard link, a FIFO and
/// extended attributes — and a committed, un-checkpointed transaction in its journal.
fn fuzz_base() -> Vec<u8> {
    let storage = populated();
    let fs = FileSystem::mount(device(&storage), MountOptions::default()).expect("mount");
    fs.symlink(b"f", "/fast").expect("symlink");
    fs.symlink(&[b's'; 300], "/d/slow").expect("symlink");
    fs.hard_link("/f", "/a/hard").expect("link");
    fs.make_node_at("/fifo", &kura_accelfs::NodeSpec::new(FileType::Fifo, 0o644))
        .expect("mkfifo");
    let ino = fs.metadata("/f").expect("stat").ino;
    fs.set_xattr(ino, b"user.x", b"attribute", kura_accelfs::XattrMode::Any)
        .expect("setxattr");
    fs.sync().expect("sync");
    fs.write("/d/e/journaled", b"in the log").expect("write");
    fs.sync().expect("sync");
    let image = storage.lock().expect("storage").clone();
    drop(fs);
    image
}

fn walk(fs: &FileSystem, ino: u64, depth: usize, budget: &mut usize) {
    if depth > 16 || *budget == 0 {
        return;
    }
    let Ok(entries) = fs.list(ino) else { return };
    for e in entries {
        *budget = budget.saturating_sub(1);
        match e.file_type {
            FileType::Directory => walk(fs, e.ino, depth + 1, budget),
            FileType::File => {
                let _ = fs.allocated_ranges_ino(e.ino);
                let mut buf = vec![0u8; 64 << 10];
                let _ = fs.read_ino(e.ino, 0, &mut buf);
            }
            FileType::Symlink => {
                let _ = fs.read_link_ino(e.ino);
            }
            _ => {
                let _ = fs.list_xattr(e.ino);
            }
        }
    }
}

/// Everything a tool would do with an image: each step `Ok` or a typed error.
fn exercise(image: Vec<u8>) {
    let storage: MemStorage = std::sync::Arc::new(std::sync::Mutex::new(image));
    let before = storage.lock().expect("storage").clone();
    let _ = fsck(device(&storage));
    if let Ok(fs) = FileSystem::mount_read_only(device(&storage), MountOptions::default()) {
        walk(&fs, 1, 0, &mut 1000);
        assert!(fs.mkdir("/new").is_err(), "a read-only mount took a change");
        let _ = fs.unmount();
    }
    assert!(
        *storage.lock().expect("storage") == before,
        "fsck or a read-only mount changed the image"
    );
    if let Ok(fs) = FileSystem::mount(device(&storage), MountOptions::default()) {
        walk(&fs, 1, 0, &mut 1000);
        let _ = fs.rename("/c", "/a/c");
        let _ = fs.write("/d/new", b"x");
        let _ = fs.sync();
        let _ = fs.unmount();
    }
    let _ = kura_accelfs::repair::repair(device(&storage));
    let _ = fsck(device(&storage));
}

proptest! {
    // KURA_HOSTILE_CASES raises the count for a soak.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("KURA_HOSTILE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_damage_is_an_error_never_a_panic_or_a_hang(
        edits in proptest::collection::vec((any::<u64>(), any::<u8>(), any::<bool>()), 1..6),
    ) {
        static BASE: std::sync::OnceLock<(Vec<u8>, Vec<usize>)> = std::sync::OnceLock::new();
        let (base, targets) = BASE.get_or_init(|| {
            let image = fuzz_base();
            // Edits go to blocks that hold something (metadata, the journal's records, the
            // tree's first data): zero blocks in the journal or free space reach no decoder.
            let targets = (0..image.len() / BS)
                .filter(|&b| image[b * BS..(b + 1) * BS].iter().any(|&x| x != 0))
                .collect();
            (image, targets)
        });
        let mut image = base.clone();
        let l = Superblock::decode(&image[..BS], 0).expect("superblock").layout;
        for (pick, value, reseal) in edits {
            let block = targets[(pick % targets.len() as u64) as usize];
            // Headers, inodes and records sit early in their blocks: aim half the edits at the
            // first 512 bytes.
            let within = (pick >> 32) as usize % if pick & 1 == 0 { 512 } else { BS };
            image[block * BS + within] ^= value.max(1);
            if reseal {
                reseal_block(&mut image, block, &l);
            }
        }
        within(CASE_SECONDS, move || exercise(image));
    }
}

/// Recomputes the checksums of the block holding an edit (its header CRC when it has a known
/// header, and the edited inode's own CRC), so the edit reaches the field decoders.
fn reseal_block(image: &mut [u8], block: usize, l: &Layout) {
    let b = &mut image[block * BS..(block + 1) * BS];
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let kinds = [
        BlockKind::Superblock,
        BlockKind::JournalSuper,
        BlockKind::JournalDescriptor,
        BlockKind::JournalCommit,
        BlockKind::BlockBitmap,
        BlockKind::InodeBitmap,
        BlockKind::InodeTable,
        BlockKind::Directory,
        BlockKind::Extents,
    ];
    let Some(kind) = kinds.into_iter().find(|k| k.magic() == magic) else {
        return;
    };
    if kind == BlockKind::InodeTable {
        for slot in 0..Layout::inodes_per_block(l.block_size) as usize {
            let at = HEADER_LEN + slot * INODE_SIZE;
            let crc = crc32c_skipping(&b[at..at + INODE_SIZE], 252);
            b[at + 252..at + 256].copy_from_slice(&crc.to_le_bytes());
        }
    }
    seal(b, kind, block as u64);
}
