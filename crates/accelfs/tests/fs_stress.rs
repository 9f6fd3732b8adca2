//! Many threads on the same files at once (issue 14): readers (cached reads under the shared
//! state lock, cache misses, large reads past the cache, streams) beside writers (small writes
//! into the cache, large ones straight to the device), truncations, renames (plain, no-replace,
//! exchange), removals, creations and syncs, on a few shared names. Nothing assumes an order
//! between operations that overlap: every block a reader gets must be all zeroes (a hole or a
//! truncated range) or one whole write of *its own file's* block — a stamped prefix of one
//! version, then zeroes where a truncation cut it — never another file's, another block's or a
//! mix of two writes. Afterwards the file system is synced, every file checked by the same rule,
//! unmounted, fsck-clean, and remounted with exactly the contents it had.

use kura_accelfs::testing::{formatted_storage, fsck_problems, mount_storage, reopen};
use kura_accelfs::{File, FileSystem, FsError, MountOptions, OpenOptions, RenameMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const BS: usize = 4096;
/// Files never grow past this many blocks.
const BLOCKS: u64 = 40;
/// The stamp at the start of a block: file, block, version (three little-endian u64s).
const HEADER: usize = 24;

/// Block `block` of the file with id `file`, as written by write `version`: the stamp, then a
/// body derived from it (every byte non-zero).
fn stamped(file: u64, block: u64, version: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(BS);
    for v in [file, block, version] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut x = file.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ block << 20 ^ version;
    while out.len() < BS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push((x as u8) | 1);
    }
    out
}

/// Checks that `got` (a block, or the part of it before the end of the file) is all zeroes or a
/// prefix of one version of block `block` of file `file` followed by zeroes.
fn check_block(got: &[u8], file: u64, block: u64, at: &str) {
    let Some(nonzero) = got.iter().rposition(|&b| b != 0) else {
        return;
    };
    assert!(
        got.len() >= HEADER && nonzero >= HEADER,
        "{at}: block {block} of file {file}: {} bytes, stamp cut",
        got.len()
    );
    let word = |i: usize| u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    assert_eq!(
        (word(0), word(1)),
        (file, block),
        "{at}: block {block} of file {file} holds block {} of file {}",
        word(1),
        word(0)
    );
    let want = stamped(file, block, word(2));
    assert!(
        got[..=nonzero] == want[..=nonzero],
        "{at}: block {block} of file {file} (version {}) is torn",
        word(2)
    );
}

/// Checks `buf` read at block `first` of file `file`.
fn check_range(buf: &[u8], file: u64, first: u64, at: &str) {
    for (k, got) in buf.chunks(BS).enumerate() {
        check_block(got, file, first + k as u64, at);
    }
}

/// What every thread shares: the file system, which file id each inode holds (by inode and
/// generation, so a reused inode number is another file), and the sources of ids and versions.
struct World {
    fs: FileSystem,
    ids: Mutex<HashMap<(u64, u32), u64>>,
    next_id: AtomicU64,
    next_version: AtomicU64,
}

impl World {
    /// The id of the file `f` is open on. Files reach a shared name only after their id is
    /// registered, so every file opened by a shared name has one.
    fn id(&self, f: &File) -> u64 {
        let key = (f.ino(), f.generation());
        *self
            .ids
            .lock()
            .expect("ids")
            .get(&key)
            .unwrap_or_else(|| panic!("inode {key:?} has no id"))
    }
}

/// Names the threads share.
fn names() -> Vec<String> {
    (0..5)
        .map(|i| format!("/s{i}"))
        .chain((0..3).map(|i| format!("/d/s{i}")))
        .collect()
}

/// Errors an operation may meet because another thread got there first: the name or the file
/// is gone, or the new name of a no-replace rename exists.
fn raced(r: Result<(), FsError>, what: &str) {
    match r {
        Ok(()) | Err(FsError::NotFound(_)) | Err(FsError::Exists(_)) => {}
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Writes `count` stamped blocks of file `id` at block `first` (one call, so a large count
/// goes to the device past the cache).
fn write_blocks(w: &World, f: &File, id: u64, first: u64, count: u64) -> Result<(), FsError> {
    let version = w.next_version.fetch_add(1, Ordering::Relaxed);
    let data: Vec<u8> = (first..first + count)
        .flat_map(|b| stamped(id, b, version))
        .collect();
    f.write_at(first * BS as u64, &data).map(|_| ())
}

fn one_op(w: &World, t: usize, i: usize, rng: &mut SmallRng, names: &[String]) {
    let fs = &w.fs;
    let p = &names[rng.gen_range(0..names.len())];
    let q = &names[rng.gen_range(0..names.len())];
    let at = format!("thread {t} op {i}");
    match rng.gen_range(0..100) {
        // Reads: one block, a few, a large one past the cache, a stream.
        0..=39 => {
            let f = match fs.open(p) {
                Ok(f) => f,
                Err(FsError::NotFound(_)) => return,
                Err(e) => panic!("{at}: open {p}: {e}"),
            };
            let id = w.id(&f);
            let count = [1, 1, 1, 3, 20][rng.gen_range(0..5)];
            let first = rng.gen_range(0..BLOCKS);
            let mut buf = vec![0u8; count * BS];
            let r = if rng.gen_range(0..8) == 0 {
                let mut got = Vec::new();
                f.read_stream(first * BS as u64, buf.len() as u64, |piece| {
                    got.extend_from_slice(piece)
                })
                .map(|n| {
                    assert_eq!(n as usize, got.len(), "{at}: stream count");
                    buf[..got.len()].copy_from_slice(&got);
                    got.len()
                })
            } else {
                f.read_at(first * BS as u64, &mut buf)
            };
            match r {
                Ok(n) => check_range(&buf[..n], id, first, &format!("{at}: {p}")),
                Err(FsError::NotFound(_)) => {}
                Err(e) => panic!("{at}: read {p}: {e}"),
            }
        }
        // Writes: small ones into the cache, large ones straight to the device.
        40..=69 => {
            let f = match fs.open_with(p, OpenOptions::new().write(true)) {
                Ok(f) => f,
                Err(FsError::NotFound(_)) => return,
                Err(e) => panic!("{at}: open {p}: {e}"),
            };
            let id = w.id(&f);
            let count = if rng.gen_range(0..5) == 0 {
                20
            } else {
                rng.gen_range(1..=3)
            };
            let first = rng.gen_range(0..=BLOCKS - count);
            raced(write_blocks(w, &f, id, first, count), &at);
        }
        // Truncation to any size that does not cut a block's stamp.
        70..=76 => {
            let mut size = rng.gen_range(0..=BLOCKS * BS as u64);
            if (1..HEADER as u64).contains(&(size % BS as u64)) {
                size += HEADER as u64;
            }
            raced(
                fs.open_with(p, OpenOptions::new().write(true))
                    .and_then(|f| f.set_len(size)),
                &at,
            );
        }
        77..=84 => {
            let mode = [
                RenameMode::Replace,
                RenameMode::NoReplace,
                RenameMode::Exchange,
            ][rng.gen_range(0..3)];
            raced(fs.rename_with(p, q, mode), &at);
        }
        85..=86 => raced(fs.remove_file(p), &at),
        // A new file: made under a private name, registered, written, then given a shared
        // name (no-replace or replace).
        87..=94 => {
            let tmp = format!("/t{t}");
            let f = fs
                .open_with(&tmp, OpenOptions::new().write(true).create_new(true))
                .unwrap_or_else(|e| panic!("{at}: create {tmp}: {e}"));
            let id = w.next_id.fetch_add(1, Ordering::Relaxed);
            w.ids
                .lock()
                .expect("ids")
                .insert((f.ino(), f.generation()), id);
            let count = rng.gen_range(1..=BLOCKS);
            write_blocks(w, &f, id, 0, count).expect("write a new file");
            let mode = if rng.gen_bool(0.5) {
                RenameMode::Replace
            } else {
                RenameMode::NoReplace
            };
            match fs.rename_with(&tmp, p, mode) {
                Ok(()) => {}
                Err(FsError::Exists(_)) => fs.remove_file(&tmp).expect("remove"),
                Err(e) => panic!("{at}: rename {tmp}: {e}"),
            }
        }
        95..=97 => {
            let f = match fs.open_with(p, OpenOptions::new().write(true)) {
                Ok(f) => f,
                Err(FsError::NotFound(_)) => return,
                Err(e) => panic!("{at}: open {p}: {e}"),
            };
            let r = if rng.gen_bool(0.5) {
                f.sync_all()
            } else {
                f.sync_data()
            };
            raced(r, &at);
        }
        _ => fs.sync().expect("sync"),
    }
}

/// Every shared name's contents, each block checked against the file's id.
fn contents(w: &World, at: &str) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for p in names() {
        let f = match w.fs.open(&p) {
            Ok(f) => f,
            Err(FsError::NotFound(_)) => continue,
            Err(e) => panic!("{at}: open {p}: {e}"),
        };
        let id = w.id(&f);
        let data = w.fs.read(&p).expect("read");
        check_range(&data, id, 0, &format!("{at}: {p}"));
        out.insert(p, data);
    }
    out
}

#[test]
fn threads_reading_writing_truncating_and_renaming_shared_files_see_only_whole_own_blocks() {
    const THREADS: usize = 6;
    const OPS: usize = 1500;
    let storage = formatted_storage(32 << 20);
    let fs = FileSystem::mount(
        reopen(&storage),
        MountOptions {
            // 64 blocks for 8 files of up to 40: hits, misses and evictions of dirty blocks.
            cache_bytes: 256 << 10,
            // 20-block reads and writes bypass the cache.
            bypass_bytes: 64 << 10,
            ..MountOptions::default()
        },
    )
    .expect("mount");
    fs.mkdir("/d").expect("mkdir");
    let w = World {
        fs,
        ids: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        next_version: AtomicU64::new(1),
    };
    let names = names();
    // Every name starts as a file of 16 blocks.
    for p in &names {
        let f = w.fs.create(p).expect("create");
        let id = w.next_id.fetch_add(1, Ordering::Relaxed);
        w.ids
            .lock()
            .expect("ids")
            .insert((f.ino(), f.generation()), id);
        write_blocks(&w, &f, id, 0, 16).expect("write");
    }
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (w, names) = (&w, &names);
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t as u64);
                for i in 0..OPS {
                    one_op(w, t, i, &mut rng, names);
                }
            });
        }
    });
    w.fs.sync().expect("sync");
    let before = contents(&w, "after the threads");
    let stats = w.fs.statfs().cache;
    println!(
        "cache: {} hits, {} misses, {} evictions ({} dirty); {} files at the end",
        stats.hits,
        stats.misses,
        stats.evictions,
        stats.evicted_dirty,
        before.len()
    );
    w.fs.clone().unmount().expect("unmount");
    let problems = fsck_problems(&storage);
    assert!(problems.is_empty(), "fsck: {problems:#?}");
    let w = World {
        fs: mount_storage(&storage),
        ..w
    };
    let after = contents(&w, "after a remount");
    assert!(before == after, "the contents changed across the remount");
}
