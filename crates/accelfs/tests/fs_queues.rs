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
