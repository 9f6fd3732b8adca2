//! AccelFS on an image file, whose device has more queue pairs (`BlockDevice::new_queue`):
//! threads whose reads miss the cache, streams and large writes each do their I/O on a queue
//! of their own under the shared disk lock, while another thread commits (the disk lock
//! exclusive). Every byte read is checked, the image is unlocked once the file system is
//! dropped (so every sibling queue was closed), and fsck finds it clean after remounting.

use kura_accelfs::mkfs::MkfsOptions;
use kura_accelfs::{FileSystem, MountOptions, OpenOptions};

const THREADS: u64 = 4;
const FILE: usize = 2 << 20;

/// The bytes of file `t` in version `v`: distinct per file, version and 4 KiB block.
fn contents(t: u64, v: u64) -> Vec<u8> {
    (0..FILE)
        .map(|i| ((i / 4096) as u64 * 31 + t * 7 + v * 131 + (i % 251) as u64) as u8)
        .collect()
}

/// io_uring instances this process has open.
fn io_urings() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().contains("io_uring"))
                .count()
        })
        .unwrap_or(0)
}

fn small_cache() -> MountOptions {
    MountOptions {
        cache_bytes: 1 << 20,
        ..MountOptions::default()
    }
}

#[test]
fn threads_read_stream_and_write_on_their_own_queues_beside_commits() {
    let dir = std::env::temp_dir().join(format!("kura-fs-queues-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = format!("file:{}?size=64M", dir.join("fs.img").display());
    let dev = match kura_engine::open(&spec) {
        Ok(dev) => dev,
        Err(e) => panic!("{spec}: {e}"),
    };
    assert!(
        dev.new_queue().is_some(),
        "{spec}: a file image has more queues"
    );
    let on_uring = dev.describe().starts_with("uring:");
    let fs = FileSystem::format(dev, MkfsOptions::default(), small_cache()).unwrap();
    for t in 0..THREADS {
        fs.write(&format!("/f{t}"), &contents(t, 0)).unwrap();
    }
    fs.sync().unwrap();

    let appender = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let mut f = fs.create("/log").unwrap();
            for i in 0..64u32 {
                f.append(&i.to_le_bytes().repeat(1024)).unwrap();
                f.sync_all().unwrap();
            }
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let path = format!("/f{t}");
                for v in 0..3 {
                    let want = contents(t, v);
                    let f = fs
                        .open_with(&path, OpenOptions::new().read(true).write(true))
                        .unwrap();
                    if v > 0 {
                        // A large write: whole blocks on this thread's queue.
                        f.write_at(0, &want).unwrap();
                    }
                    // Large reads (straight into the buffer) and small ones that miss the cache.
                    let mut big = vec![0u8; 1 << 20];
                    for at in [0, 1 << 20] {
                        f.read_exact_at(at as u64, &mut big).unwrap();
                        assert!(big == want[at..at + big.len()], "{path} v{v} at {at}");
                    }
                    let mut small = vec![0u8; 4096];
                    for block in (0..FILE / 4096).step_by(7) {
                        f.read_exact_at((block * 4096) as u64, &mut small).unwrap();
                        assert!(
                            small == want[block * 4096..][..4096],
                            "{path} v{v} block {block}"
                        );
                    }
                    let mut streamed = Vec::with_capacity(FILE);
                    f.read_stream(0, FILE as u64, |b| streamed.extend_from_slice(b))
                        .unwrap();
                    assert!(streamed == want, "{path} v{v}: streamed");
                    f.sync_all().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    appender.join().unwrap();
    if on_uring {
        // The threads' I/O went through rings of their own, not only the mount's.
        assert!(
            io_urings() > 1,
            "one io_uring open: no sibling queue was used"
        );
    }
    fs.unmount().unwrap();

    // Every queue was closed with the file system: the image opens again at once.
    let dev = kura_engine::open(&spec).unwrap();
    let fs = FileSystem::mount(dev, MountOptions::default()).unwrap();
    for t in 0..THREADS {
        assert!(
            fs.read(&format!("/f{t}")).unwrap() == contents(t, 2),
            "/f{t}"
        );
    }
    let log = fs.read("/log").unwrap();
    assert_eq!(log.len(), 64 * 4096);
    fs.unmount().unwrap();
    let report = kura_accelfs::fsck(kura_engine::open(&spec).unwrap()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Large reads (past the cache, on O_DIRECT) into memory at any alignment and from any file
/// offset: every byte read is the file's (holes zero, unsynced writes seen), and not one byte
/// of the caller's memory outside the destination changes.
#[test]
fn large_reads_land_in_the_callers_memory_at_any_alignment() {
    let dir = std::env::temp_dir().join(format!("kura-fs-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = format!("file:{}?size=64M", dir.join("fs.img").display());
    let dev = kura_engine::open(&spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let fs = FileSystem::format(dev, MkfsOptions::default(), small_cache()).unwrap();
    let mut model = contents(1, 0);
    model.extend(contents(2, 0));
    let f = fs
        .open_with(
            "/big",
            OpenOptions::new().read(true).write(true).create(true),
        )
        .unwrap();
    f.write_at(0, &model[..FILE]).unwrap();
    // A hole of 1 MiB + 12 KiB between the two halves.
    let gap = (1 << 20) + 12288;
    f.write_at((FILE + gap) as u64, &model[FILE..]).unwrap();
    model.splice(FILE..FILE, std::iter::repeat_n(0u8, gap));
    f.sync_all().unwrap();
    // Unsynced writes, some cached, that reads must see over the device's older copy.
    for (at, len, fill) in [
        (8192usize, 100usize, 0x11u8),
        (700_000, 20_000, 0x22),
        (FILE + gap + 5, 9000, 0x33),
    ] {
        f.write_at(at as u64, &vec![fill; len]).unwrap();
        model[at..at + len].fill(fill);
    }
    const GUARD: usize = 8192;
    for &(offset, len) in &[
        (0usize, 1usize << 20),
        (4096, 256 << 10),
        (12_345, 1 << 20),
        (FILE - 300_000, 1 << 20),
        (FILE + gap - 70_000, 300_000),
        (model.len() - (256 << 10), 256 << 10),
    ] {
        for misalign in [0usize, 1, 512, 4096] {
            let mut mem = kura_engine::IoBuf::heap(GUARD + len + GUARD + 4096, 4096);
            mem.fill(0xee);
            let start = GUARD + misalign;
            f.read_exact_at(offset as u64, &mut mem[start..start + len])
                .unwrap();
            assert!(
                mem[start..start + len] == model[offset..offset + len],
                "read of {len} at {offset} into memory {misalign} bytes past a page differs"
            );
            assert!(
                mem[..start]
                    .iter()
                    .chain(&mem[start + len..])
                    .all(|&b| b == 0xee),
                "read of {len} at {offset} wrote outside its destination"
            );
        }
    }
    drop(f);
    fs.unmount().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
