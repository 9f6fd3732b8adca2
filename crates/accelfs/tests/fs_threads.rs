//! AccelFS used by many threads at once (issue 14 item 2): group commit (fsyncs that overlap
//! share a commit, and every acknowledged one survives any crash) and reads that go to the
//! device with the state lock released (always the file's newest data, even while other
//! threads write, truncate and evict). Nothing here depends on timing: the assertions hold for
//! every interleaving; how many commits the fsyncs shared is printed, not asserted.

use kura_accelfs::testing::{
    formatted_storage, fsck_problems, mount_storage, recording_device, reopen,
};
use kura_accelfs::{FileSystem, MountOptions};
use kura_engine::backend::mem::MemStorage;
use kura_engine::fault::materialize;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::sync::{Arc, Mutex};

const CHUNK: usize = 4096;

/// The `i`th 4 KiB chunk thread `t` appends: distinct for every (t, i).
fn chunk(t: usize, i: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64((t as u64) << 32 | i as u64);
    (0..CHUNK).map(|_| rng.gen()).collect()
}

/// Checks that `/a{t}` holds whole chunks of thread `t` in order, at least `acked` of them and
/// at most `started` (the appends begun before the crash); returns how many it holds (0 when
/// absent, which only a file with nothing acknowledged may be).
///
/// This is the touched-path rule of `fs_crash` for a file that only grows by whole 4 KiB
/// blocks: its states since the last acknowledged fsync are the prefixes of `acked` to
/// `started` appends, so its size must be one of theirs and each block that of the state (the
/// same block of every longer state, since appends never rewrite a block).
fn check_appends(fs: &FileSystem, t: usize, acked: usize, started: usize, at: &str) -> usize {
    let path = format!("/a{t}");
    let got = match fs.read(&path) {
        Ok(got) => got,
        Err(e) if acked == 0 => {
            assert!(
                matches!(e, kura_accelfs::FsError::NotFound(_)),
                "{at}: {path}: {e}"
            );
            return 0;
        }
        Err(e) => panic!("{at}: {path} with {acked} acknowledged appends: {e}"),
    };
    assert_eq!(got.len() % CHUNK, 0, "{at}: {path} is not whole appends");
    assert!(
        got.len() / CHUNK >= acked,
        "{at}: {path} holds {} appends, {acked} were acknowledged",
        got.len() / CHUNK
    );
    assert!(
        got.len() / CHUNK <= started,
        "{at}: {path} holds {} appends, only {started} had begun",
        got.len() / CHUNK
    );
    for (i, c) in got.chunks(CHUNK).enumerate() {
        assert!(c == chunk(t, i), "{at}: {path}: append {i} is not its data");
    }
    got.len() / CHUNK
}

#[test]
fn fsynced_appends_of_many_threads_all_survive_and_share_commits() {
    const THREADS: usize = 8;
    const APPENDS: usize = 40;
    let storage = formatted_storage(64 << 20);
    let fs = mount_storage(&storage);
    let before = fs.statfs().commits;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let fs = fs.clone();
            s.spawn(move || {
                let mut f = fs.create(&format!("/a{t}")).expect("create");
                for i in 0..APPENDS {
                    f.write_all(&chunk(t, i)).expect("append");
                    // Both kinds of fsync: an append changes the size, so fdatasync commits too.
                    if i % 2 == 0 {
                        f.sync_all().expect("fsync");
                    } else {
                        f.sync_data().expect("fdatasync");
                    }
                }
            });
        }
    });
    let commits = fs.statfs().commits - before;
    println!(
        "{} fsyncs of {THREADS} threads took {commits} journal commits",
        THREADS * APPENDS
    );
    drop(fs); // no unmount: what the fsyncs made durable must be enough
    let fs = mount_storage(&storage);
    for t in 0..THREADS {
        check_appends(&fs, t, APPENDS, APPENDS, "after remount");
        assert_eq!(
            fs.metadata(&format!("/a{t}")).expect("stat").size,
            (APPENDS * CHUNK) as u64
        );
    }
    fs.unmount().expect("unmount");
    let problems = fsck_problems(&storage);
    assert!(problems.is_empty(), "fsck: {problems:#?}");
}

/// One thread's appends: (trace length when its fsync returned, appends acknowledged then), and
/// the trace length when each append began.
type Run = (Vec<(usize, usize)>, Vec<usize>);

/// Threads append and fsync while the device records every write and flush; the stream is cut
/// at many points (unflushed blocks kept at random). After each cut every append whose fsync had
/// returned before it is there, no append that had not begun is, no file holds anything but its
/// own appends in order, and fsck is clean. Files with an append begun but not acknowledged at
/// the cut (touched since their last fsync) are counted, as are those that held more than was
/// acknowledged, and both must be seen, so the touched-path check is not vacuous. Where each
/// append begins is the trace length read before its write: its device writes all come later,
/// so an append begun at or after the cut cannot be in the image, whatever the interleaving.
#[test]
fn every_crash_point_keeps_every_acknowledged_fsync_of_concurrent_threads() {
    const THREADS: usize = 4;
    const APPENDS: usize = 30;
    let points: usize = std::env::var("KURA_FS_CRASH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let storage = formatted_storage(8 << 20);
    let base = storage.lock().expect("storage").clone();
    let (dev, control) = recording_device(&storage);
    let fs = FileSystem::mount(
        Box::new(dev),
        MountOptions {
            cache_bytes: 128 << 10,
            ..MountOptions::default()
        },
    )
    .expect("mount");
    let start = control.trace().len();
    let runs: Vec<Run> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fs, control) = (fs.clone(), control.clone());
                s.spawn(move || {
                    let mut f = fs.create(&format!("/a{t}")).expect("create");
                    let (mut acks, mut begun) = (Vec::new(), Vec::new());
                    for i in 0..APPENDS {
                        begun.push(control.trace().len());
                        f.write_all(&chunk(t, i)).expect("append");
                        f.sync_all().expect("fsync");
                        acks.push((control.trace().len(), i + 1));
                    }
                    (acks, begun)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let trace = control.trace();
    drop(fs);
    let mut rng = SmallRng::seed_from_u64(14);
    let (mut touched, mut newer) = (0usize, 0usize);
    for p in 0..points {
        let cut = rng.gen_range(start..=trace.len());
        let image = materialize(&base, &trace, cut, 4096, 0.5, p as u64);
        let crashed: MemStorage = Arc::new(Mutex::new(image));
        let fs = mount_storage(&crashed);
        for (t, (acks, begun)) in runs.iter().enumerate() {
            let acked = acks
                .iter()
                .rev()
                .find(|(at, _)| *at <= cut)
                .map_or(0, |&(_, n)| n);
            let started = begun.iter().filter(|&&b| b < cut).count();
            let held = check_appends(&fs, t, acked, started, &format!("cut {cut}"));
            touched += usize::from(started > acked);
            newer += usize::from(held > acked);
        }
        drop(fs);
        let problems = fsck_problems(&crashed);
        assert!(problems.is_empty(), "cut {cut}: fsck: {problems:#?}");
    }
    println!("{points} cuts: {touched} files touched since their last fsync, {newer} held more");
    assert!(
        touched > 0 && newer > 0,
        "touched files: {touched} checked, {newer} held more than was acknowledged"
    );
}

/// A stamped 4 KiB block: which file, which block, which version, then a body derived from
/// those three, so a reader can tell its own file's block (of any version) from anything else.
fn stamped(file: u64, block: u64, version: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHUNK);
    for v in [file, block, version] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let fill = (file * 131 + block * 31 + version * 7) as u8 | 1;
    out.resize(CHUNK, fill);
    out
}

fn check_stamped(got: &[u8], file: u64, block: u64, at: &str) {
    let word = |i: usize| u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    assert_eq!(
        (word(0), word(1)),
        (file, block),
        "{at}: block {block} of file {file} holds another block"
    );
    assert!(
        got == stamped(file, block, word(2)),
        "{at}: block {block} of file {file} (version {}) is torn or foreign",
        word(2)
    );
}

/// Readers fetch blocks that miss a tiny cache, read large ranges past the cache and stream
/// (all three with the state lock released while the device works) while writers overwrite
/// them (small writes into the cache, large ones straight to the device, also without the
/// state lock), truncate and rewrite their files (freeing blocks that other files then reuse)
/// and commit. Every block a reader gets is its own file's, whole, of some version.
#[test]
fn reads_that_miss_the_cache_never_see_foreign_or_torn_blocks_while_files_change() {
    const FILES: u64 = 3;
    const BLOCKS: u64 = 48;
    const ROUNDS: u64 = 150;
    let storage = formatted_storage(32 << 20);
    let fs = FileSystem::mount(
        reopen(&storage),
        MountOptions {
            cache_bytes: 64 << 10,
            // 16-block writes and reads bypass the cache.
            bypass_bytes: 32 << 10,
            ..MountOptions::default()
        },
    )
    .expect("mount");
    let write_file = |fs: &FileSystem, file: u64, version: u64| {
        let f = fs.create(&format!("/r{file}")).expect("create");
        for b in 0..BLOCKS {
            f.write_at(b * CHUNK as u64, &stamped(file, b, version))
                .expect("write");
        }
    };
    for file in 0..FILES {
        write_file(&fs, file, 0);
    }
    fs.sync().expect("sync");
    std::thread::scope(|s| {
        for file in 0..FILES {
            let fs = fs.clone();
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(file);
                for round in 1..=ROUNDS {
                    if round % 25 == 0 {
                        // Truncate and rewrite: the old blocks are freed (reused after the
                        // commit) and the file gets new ones.
                        write_file(&fs, file, round);
                        fs.sync().expect("sync");
                    } else {
                        let f = fs
                            .open_with(
                                &format!("/r{file}"),
                                kura_accelfs::OpenOptions::new().write(true),
                            )
                            .expect("open");
                        if round % 3 == 1 {
                            // A large write: its whole blocks go to the device with only the
                            // disk lock held.
                            let b = rng.gen_range(0..=BLOCKS - 16);
                            let data: Vec<u8> =
                                (b..b + 16).flat_map(|k| stamped(file, k, round)).collect();
                            f.write_at(b * CHUNK as u64, &data)
                                .expect("large overwrite");
                        } else {
                            let b = rng.gen_range(0..BLOCKS);
                            f.write_at(b * CHUNK as u64, &stamped(file, b, round))
                                .expect("overwrite");
                        }
                        if round % 5 == 0 {
                            f.sync_all().expect("fsync");
                        }
                    }
                }
            });
        }
        for reader in 0..FILES {
            let fs = fs.clone();
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(100 + reader);
                for i in 0..ROUNDS * 20 {
                    let file = (reader + i) % FILES;
                    // Small reads go through the cache; reads of 16 blocks at random places
                    // bypass it, straight from the device into the caller's buffer.
                    let blocks = if i % 2 == 0 { 1 } else { 16 };
                    let b = rng.gen_range(0..=BLOCKS - blocks);
                    let mut buf = vec![0u8; blocks as usize * CHUNK];
                    // The file may be between truncation and rewrite: a short read is fine.
                    let f = fs.open(&format!("/r{file}")).expect("open");
                    let n = if i % 7 == 3 {
                        // A streaming read, straight from the device with only the disk lock.
                        let mut got = Vec::new();
                        let n = f
                            .read_stream(b * CHUNK as u64, buf.len() as u64, |piece| {
                                got.extend_from_slice(piece)
                            })
                            .expect("stream") as usize;
                        assert_eq!(n, got.len(), "reader {reader}: stream count");
                        buf[..n].copy_from_slice(&got);
                        n
                    } else {
                        f.read_at(b * CHUNK as u64, &mut buf).expect("read")
                    };
                    assert_eq!(n % CHUNK, 0, "reader {reader}: a partial block");
                    for (k, got) in buf[..n].chunks(CHUNK).enumerate() {
                        let at = format!("reader {reader} read {i}");
                        check_stamped(got, file, b + k as u64, &at);
                    }
                }
            });
        }
    });
    let stats = fs.statfs().cache;
    println!("cache: {} misses, {} hits", stats.misses, stats.hits);
    fs.unmount().expect("unmount");
    let problems = fsck_problems(&storage);
    assert!(problems.is_empty(), "fsck: {problems:#?}");
}

/// A read of cached data larger than what one hold of the shared lock copies (256 KiB) is
/// copied in pieces with the lock let go between them; it must still be atomic against writes:
/// a whole-file rewrite (one write, into the cache, since the bypass is set above its size) is
/// seen entirely or not at all. Every version fills the file with one byte value, so a read
/// holding two values saw a write between its pieces. Holds for every interleaving; how many
/// reads overlapped a rewrite is not asserted.
#[test]
fn a_large_read_of_cached_data_never_sees_half_of_a_write() {
    const BYTES: usize = 1 << 20;
    const VERSIONS: u8 = 120;
    let storage = formatted_storage(32 << 20);
    let fs = FileSystem::mount(
        reopen(&storage),
        MountOptions {
            cache_bytes: 16 << 20,
            bypass_bytes: 8 << 20,
            ..MountOptions::default()
        },
    )
    .expect("mount");
    let f = fs.create("/whole").expect("create");
    f.write_at(0, &vec![0u8; BYTES]).expect("first version");
    let written = std::sync::atomic::AtomicU8::new(0);
    std::thread::scope(|s| {
        let writer = fs.clone();
        let written = &written;
        s.spawn(move || {
            let f = writer
                .open_with("/whole", kura_accelfs::OpenOptions::new().write(true))
                .expect("open");
            for v in 1..=VERSIONS {
                f.write_at(0, &vec![v; BYTES]).expect("rewrite");
                written.store(v, std::sync::atomic::Ordering::Release);
            }
        });
        for _ in 0..2 {
            let fs = fs.clone();
            s.spawn(move || {
                let f = fs.open("/whole").expect("open");
                let mut buf = vec![0u8; BYTES];
                loop {
                    let before = written.load(std::sync::atomic::Ordering::Acquire);
                    let n = f.read_at(0, &mut buf).expect("read");
                    assert_eq!(n, BYTES);
                    let v = buf[0];
                    if let Some(at) = buf.iter().position(|&b| b != v) {
                        panic!("one read holds version {v} and, at byte {at}, {}", buf[at]);
                    }
                    assert!(v >= before, "read version {v} after {before} was written");
                    if before == VERSIONS {
                        break;
                    }
                }
            });
        }
    });
}
