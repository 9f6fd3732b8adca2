//! The mounted file system through its public API on RAM disks: every operation, persistence
//! across remounts (each checked by fsck), the data path's cache/bypass/read-ahead, and every
//! kind of bad input as a typed error.

use kura_accelfs::{fsck, FileSystem, FsError, MkfsOptions, MountOptions, OpenOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};

fn fresh(bytes: u64, opts: MountOptions) -> (FileSystem, MemStorage) {
    let dev = MemDevice::new(bytes, QueueOptions::default());
    let storage = dev.storage();
    let fs = FileSystem::format(Box::new(dev), MkfsOptions::default(), opts).expect("format");
    (fs, storage)
}

fn remount(storage: &MemStorage) -> FileSystem {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    FileSystem::mount(Box::new(dev), MountOptions::default()).expect("remount")
}

fn assert_fsck_clean(storage: &MemStorage) {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    let r = fsck(Box::new(dev)).expect("fsck runs");
    assert!(r.is_clean(), "fsck problems: {:#?}", r.problems);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8)
        .collect()
}

#[test]
fn namespace_operations_persist_and_stay_fsck_clean() {
    let (fs, storage) = fresh(64 << 20, MountOptions::default());
    fs.create_dir_all("/a/b/c").expect("mkdir -p");
    fs.write("/a/b/c/hello.txt", b"hello world").expect("write");
    fs.write("/a/top", &pattern(100_000, 1)).expect("write");
    fs.mkdir("/empty").expect("mkdir");
    fs.rename("/a/top", "/a/b/moved").expect("rename");
    fs.rename("/a/b/c", "/c2").expect("rename dir");
    for i in 0..300 {
        fs.write(&format!("/a/many-{i:04}"), format!("file {i}").as_bytes())
            .expect("many");
    }
    for i in (0..300).step_by(3) {
        fs.remove_file(&format!("/a/many-{i:04}")).expect("remove");
    }
    assert_eq!(fs.read("/c2/hello.txt").expect("read"), b"hello world");
    let names: Vec<String> = fs
        .read_dir("/")
        .expect("readdir")
        .iter()
        .map(|e| e.name_lossy())
        .collect();
    assert_eq!(names, vec!["a", "c2", "empty"]);
    assert_eq!(fs.read_dir("/a").expect("readdir").len(), 201);
    let m = fs.metadata("/a/b/moved").expect("stat");
    assert!(m.is_file() && m.len() == 100_000 && m.blocks >= 13);
    assert!(fs.metadata("/c2").expect("stat").is_dir());
    fs.unmount().expect("unmount");
    assert_fsck_clean(&storage);

    let fs = remount(&storage);
    assert_eq!(fs.read("/a/b/moved").expect("read"), pattern(100_000, 1));
    assert_eq!(fs.read("/a/many-0001").expect("read"), b"file 1");
    assert!(!fs.exists("/a/many-0000"));
    assert!(!fs.exists("/a/b/c"));
    fs.remove_dir("/empty").expect("rmdir");
    fs.remove_file("/c2/hello.txt").expect("rm");
    fs.remove_dir("/c2").expect("rmdir");
    fs.unmount().expect("unmount");
    assert_fsck_clean(&storage);
    let fs = remount(&storage);
    assert_eq!(fs.read_dir("/").expect("ls").len(), 1);
}

#[test]
fn files_read_write_seek_truncate_and_append() {
    let (fs, storage) = fresh(64 << 20, MountOptions::default());
    let mut f = fs.create("/f").expect("create");
    f.write_all(&pattern(20_000, 2)).expect("write");
    f.seek(SeekFrom::Start(5)).expect("seek");
    f.write_all(b"XYZ").expect("overwrite");
    f.seek(SeekFrom::End(-3)).expect("seek end");
    let mut tail = [0u8; 3];
    f.read_exact(&mut tail).expect("read tail");
    let mut want = pattern(20_000, 2);
    want[5..8].copy_from_slice(b"XYZ");
    assert_eq!(&tail, &want[19_997..]);
    // A hole reads as zeroes.
    f.write_at(100_000, b"end").expect("write past end");
    let mut hole = vec![1u8; 1000];
    f.read_exact_at(50_000, &mut hole).expect("hole");
    assert!(hole.iter().all(|&b| b == 0));
    // Truncating into a block zeroes its tail, so growing again reads zeroes.
    f.set_len(10_001).expect("truncate");
    f.set_len(30_000).expect("grow");
    let mut back = vec![0u8; 30_000];
    f.read_exact_at(0, &mut back).expect("read");
    assert_eq!(&back[..10_001], &want[..10_001]);
    assert!(back[10_001..].iter().all(|&b| b == 0));
    let mut log = fs
        .open_with("/log", OpenOptions::new().append(true).create(true))
        .expect("append open");
    for i in 0..100 {
        writeln!(log, "line {i}").expect("append");
    }
    log.sync_all().expect("fsync");
    let lines: Vec<String> = BufReader::new(fs.open("/log").expect("open"))
        .lines()
        .collect::<Result<_, _>>()
        .expect("lines");
    assert_eq!(lines.len(), 100);
    assert_eq!(lines[99], "line 99");
    drop((f, log));
    fs.unmount().expect("unmount");
    assert_fsck_clean(&storage);
    let fs = remount(&storage);
    assert_eq!(fs.read("/f").expect("read"), back);
}

#[test]
fn large_io_bypasses_and_small_sequential_reads_read_ahead_within_the_budget() {
    let opts = MountOptions {
        cache_bytes: 1 << 20,
        ..MountOptions::default()
    };
    let (fs, storage) = fresh(128 << 20, opts);
    let data = pattern(24 << 20, 3);
    let f = fs.create("/big").expect("create");
    f.write_at(0, &data).expect("large write");
    // Small writes through the cache, more than the budget holds.
    for (i, chunk) in data[..4 << 20].chunks(4096).enumerate() {
        f.write_at((i * 4096) as u64, chunk).expect("small write");
    }
    let mut big = vec![0u8; data.len()];
    f.read_exact_at(0, &mut big).expect("large read");
    assert!(big == data, "large read differs");
    let mut streamed = Vec::new();
    BufReader::with_capacity(8192, fs.open("/big").expect("open"))
        .read_to_end(&mut streamed)
        .expect("stream");
    assert!(streamed == data, "streamed read differs");
    let st = fs.statfs();
    assert!(
        st.cache.bypass_bytes >= 2 * data.len() as u64,
        "{:?}",
        st.cache
    );
    assert!(st.cache.readahead_blocks > 0, "{:?}", st.cache);
    assert!(st.cache.evictions > 0, "{:?}", st.cache);
    assert!(
        st.cache.peak_bytes <= st.cache.budget_bytes,
        "cache peaked at {} over its {} budget",
        st.cache.peak_bytes,
        st.cache.budget_bytes
    );
    drop(f);
    fs.unmount().expect("unmount");
    assert_fsck_clean(&storage);
    assert!(remount(&storage).read("/big").expect("read") == data);
}

#[test]
fn bad_input_is_a_typed_error_and_changes_nothing() {
    let (fs, storage) = fresh(16 << 20, MountOptions::default());
    fs.write("/file", b"x").expect("write");
    fs.mkdir("/d").expect("mkdir");
    fs.write("/d/inner", b"y").expect("write");
    let long = "n".repeat(256);
    let cases: Vec<(Result<(), FsError>, i32)> = vec![
        (fs.write(&format!("/{long}"), b""), libc::ENAMETOOLONG),
        (fs.write("/bad\0name", b""), libc::EINVAL),
        (fs.write("/file/child", b""), libc::ENOTDIR),
        (fs.mkdir("/file/sub"), libc::ENOTDIR),
        (fs.read("/missing").map(|_| ()), libc::ENOENT),
        (fs.mkdir("/d"), libc::EEXIST),
        (fs.remove_dir("/d"), libc::ENOTEMPTY),
        (fs.remove_file("/d"), libc::EISDIR),
        (fs.remove_dir("/file"), libc::ENOTDIR),
        (fs.open("/d").map(|_| ()), libc::EISDIR),
        (fs.rename("/d", "/d/inner2"), libc::EINVAL),
        (fs.rename("/d", "/file"), libc::ENOTDIR),
        (fs.rename("/nothing", "/x"), libc::ENOENT),
        (fs.remove_file("/"), libc::EINVAL),
        (
            fs.open_with("/file", OpenOptions::new().write(true).create_new(true))
                .map(|_| ()),
            libc::EEXIST,
        ),
        (
            fs.open("/file")
                .and_then(|f| f.write_at(0, b"z"))
                .map(|_| ()),
            libc::EBADF,
        ),
    ];
    // Through the inode-level API (what FUSE uses) a name arrives whole, so `/` must be refused.
    let root = fs.metadata("/").expect("root").ino;
    let slash = fs
        .create_in(root, b"a/b", kura_accelfs::FileType::File, 0o644)
        .map(|_| ());
    let nul = fs
        .create_in(root, b"a\0b", kura_accelfs::FileType::File, 0o644)
        .map(|_| ());
    let dots = fs
        .create_in(root, b"..", kura_accelfs::FileType::Directory, 0o755)
        .map(|_| ());
    let cases: Vec<(Result<(), FsError>, i32)> = cases
        .into_iter()
        .chain([
            (slash, libc::EINVAL),
            (nul, libc::EINVAL),
            (dots, libc::EINVAL),
        ])
        .collect();
    for (i, (r, errno)) in cases.into_iter().enumerate() {
        let e = r.expect_err(&format!("case {i} should fail"));
        assert_eq!(e.errno(), errno, "case {i}: {e}");
    }
    // A file removed while open: its handle fails instead of touching a reused inode.
    let f = fs.open("/d/inner").expect("open");
    fs.remove_file("/d/inner").expect("rm");
    fs.write("/reuse", b"other").expect("write");
    assert_eq!(
        f.read_at(0, &mut [0u8; 4]).expect_err("stale").errno(),
        libc::ENOENT
    );
    // ENOSPC leaves the file system usable and consistent.
    let big = vec![7u8; 4 << 20];
    let g = fs.create("/fill").expect("create");
    let mut written = 0u64;
    let err = loop {
        match g.write_at(written, &big) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert_eq!(g.len().expect("len"), written);
    fs.remove_file("/fill").expect("rm");
    fs.sync().expect("sync");
    fs.write("/after", b"space again")
        .expect("write after ENOSPC");
    drop((f, g));
    fs.unmount().expect("unmount");
    assert_fsck_clean(&storage);
    let fs = remount(&storage);
    assert_eq!(fs.read("/file").expect("read"), b"x");
    assert_eq!(fs.read("/after").expect("read"), b"space again");
}

#[test]
fn sync_by_inode_number_takes_files_and_directories_and_refuses_removed_inodes() {
    let (fs, storage) = fresh(8 << 20, MountOptions::default());
    fs.mkdir("/d").expect("mkdir");
    fs.write("/d/f", b"kept").expect("write");
    let (dir, file) = (
        fs.metadata("/d").expect("stat").ino,
        fs.metadata("/d/f").expect("stat").ino,
    );
    fs.sync_ino(file, true).expect("fdatasync");
    fs.sync_ino(file, false).expect("fsync");
    fs.sync_ino(dir, false).expect("fsync of a directory");
    fs.remove_file("/d/f").expect("remove");
    assert!(matches!(
        fs.sync_ino(file, false),
        Err(FsError::NotFound(_))
    ));
    fs.unmount().expect("unmount");
    assert_fsck_clean(&storage);
}

#[test]
fn mounting_what_is_not_accelfs_fails_clearly() {
    let dev = MemDevice::new(8 << 20, QueueOptions::default());
    let e = FileSystem::mount(Box::new(dev), MountOptions::default()).expect_err("blank");
    assert!(e.to_string().contains("no AccelFS"), "{e}");
}

#[test]
fn threads_share_one_file_system() {
    let (fs, storage) = fresh(64 << 20, MountOptions::default());
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                fs.mkdir(&format!("/t{t}")).expect("mkdir");
                for i in 0..50 {
                    let p = format!("/t{t}/f{i}");
                    fs.write(&p, &pattern(3000 + i * 100, t as u8))
                        .expect("write");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    fs.unmount().expect("unmount");
    assert_fsck_clean(&storage);
    let fs = remount(&storage);
    for t in 0..4u8 {
        for i in 0..50 {
            let got = fs.read(&format!("/t{t}/f{i}")).expect("read");
            assert_eq!(got, pattern(3000 + i * 100, t));
        }
    }
}

#[test]
fn streamed_reads_match_positioned_reads_across_holes_and_dirty_blocks() {
    let (fs, _storage) = fresh(64 << 20, MountOptions::default());
    let f = fs.create("/s").expect("create");
    f.write_at(0, &pattern(3 << 20, 9)).expect("write");
    f.write_at(5 << 20, &pattern(100_000, 4))
        .expect("write past a hole");
    fs.sync().expect("sync");
    f.write_at(12_345, b"dirty, only in the cache")
        .expect("small write");
    let size = f.len().expect("len");
    let mut rng = 17u64;
    for round in 0..40 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let offset = if round == 0 {
            0
        } else {
            (rng >> 20) % (size + 1000)
        };
        let len = if round == 0 {
            size
        } else {
            (rng >> 7) % (3 << 20)
        };
        let mut streamed = Vec::new();
        let n = f
            .read_stream(offset, len, |chunk| streamed.extend_from_slice(chunk))
            .expect("stream");
        // The owned buffers, kept until the end as a consumer on another thread would.
        let mut held = Vec::new();
        let owned_n = f
            .read_stream_owned(offset, len, |buf, range| held.push((buf, range)))
            .expect("owned stream");
        let owned: Vec<u8> = held
            .iter()
            .flat_map(|(buf, range)| buf[range.clone()].iter().copied())
            .collect();
        let mut want = vec![0u8; len as usize];
        let m = f.read_at(offset, &mut want).expect("read");
        want.truncate(m);
        assert_eq!(n as usize, m, "offset {offset} len {len}");
        assert_eq!(owned_n, n, "offset {offset} len {len}");
        assert!(
            streamed == want,
            "offset {offset} len {len}: contents differ"
        );
        assert!(
            owned == want,
            "offset {offset} len {len}: owned buffers differ"
        );
    }
}

/// Small fsync'd data is journaled and its home copy stays stale until a checkpoint; once its
/// cached copy is evicted, every read path (cache miss, large bypass read, stream) must still
/// return the journaled data, never the stale home block.
#[test]
fn journaled_small_writes_read_back_after_eviction_on_every_path() {
    let opts = MountOptions {
        cache_bytes: 64 << 10,
        ..MountOptions::default()
    };
    let (fs, _storage) = fresh(64 << 20, opts);
    let f = fs.create("/f").unwrap();
    f.write_at(0, &vec![0xaa; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    f.write_at(0, &[0xbb; 4096]).unwrap();
    f.sync_all().unwrap();
    // Churn the small cache with another file so f's block is evicted.
    let g = fs.create("/g").unwrap();
    g.write_at(0, &pattern(1 << 20, 3)).unwrap();
    g.sync_all().unwrap();
    let mut piece = vec![0u8; 4096];
    for i in 0..256u64 {
        g.read_at(i * 4096, &mut piece).unwrap();
    }
    let mut small = vec![0u8; 4096];
    f.read_at(0, &mut small).unwrap();
    assert!(
        small.iter().all(|&b| b == 0xbb),
        "cache-miss read saw stale data"
    );
    let mut big = vec![0u8; 1 << 20];
    f.read_at(0, &mut big).unwrap();
    assert!(
        big[..4096].iter().all(|&b| b == 0xbb),
        "bypass read saw stale data"
    );
    assert!(big[4096..].iter().all(|&b| b == 0xaa));
    f.write_at(4096, &[0xcc; 4096]).unwrap();
    f.sync_all().unwrap();
    for i in 0..256u64 {
        g.read_at(i * 4096, &mut piece).unwrap();
    }
    let mut streamed = Vec::new();
    f.read_stream(0, 1 << 20, |p| streamed.extend_from_slice(p))
        .unwrap();
    assert!(
        streamed[4096..8192].iter().all(|&b| b == 0xcc),
        "stream saw stale data"
    );
    assert!(streamed[..4096].iter().all(|&b| b == 0xbb));
}
