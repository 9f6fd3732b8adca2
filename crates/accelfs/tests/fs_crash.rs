//! Crash consistency and failure handling of the mounted file system.
//!
//! - Crash harness: a random workload runs on a `fault` device that records every write and
//!   flush; the stream is cut at random points (unflushed writes each kept or lost, so torn and
//!   reordered), and every resulting image must mount, be fsck-clean, and hold exactly what the
//!   last acknowledged `sync` promised for every path not touched since — file contents,
//!   symbolic-link targets, extended attributes, and which paths are hard links of one inode.
//!   A path touched since that sync must hold a state from its history since it (absent, or
//!   an inode it named with kind, size, target and attributes of one state, and each 4096-byte
//!   block of a file's data from some state of that inode): never foreign or stale bytes
//!   (`check_touched` states the exact rule). The run asserts that touched paths were checked
//!   and that some held a state newer than the sync, so the check is never vacuous.
//!   The workload writes, truncates, removes, renames (plain, `RENAME_NOREPLACE`,
//!   `RENAME_EXCHANGE`), hard links, makes symbolic links (fast and slow), sets and removes
//!   extended attributes, and syncs (`sync`, which promises everything, and `fsync`/`fdatasync`,
//!   which promise one file's contents). `KURA_FS_CRASH_POINTS` sets the number of cuts (default
//!   500; 10000+ for a soak), `KURA_FS_CRASH_SEED` the workload's seed (default 2026).
//! - Fault injection: EIO on reads, writes and flushes is an error, never damage, and a failed
//!   commit makes the file system refuse further writes.

use kura_accelfs::testing::{
    fault_device, formatted_storage, fsck_problems, mount_storage, recording_device, reopen,
};
use kura_accelfs::{fsck, FileSystem, FsError, MountOptions, RenameMode, XattrMode};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{materialize, FaultPlan, TraceEvent};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const DEVICE_BYTES: u64 = 8 << 20;

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

/// What one inode of the model holds.
#[derive(Debug, Clone, PartialEq)]
enum Body {
    File(Vec<u8>),
    Link(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq)]
struct Obj {
    body: Body,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// The file system as the workload left it: names (several may share an inode) and inodes.
#[derive(Debug, Clone, Default)]
struct Model {
    names: BTreeMap<String, u64>,
    objs: BTreeMap<u64, Obj>,
    next: u64,
}

impl Model {
    fn get(&self, p: &str) -> Option<&Obj> {
        self.objs.get(self.names.get(p)?)
    }

    fn is_file(&self, p: &str) -> bool {
        matches!(
            self.get(p),
            Some(Obj {
                body: Body::File(_),
                ..
            })
        )
    }

    fn names_of(&self, p: &str) -> Vec<String> {
        match self.names.get(p) {
            Some(id) => self
                .names
                .iter()
                .filter(|(_, i)| *i == id)
                .map(|(n, _)| n.clone())
                .collect(),
            None => vec![p.to_string()],
        }
    }

    fn add(&mut self, p: &str, body: Body) {
        self.next += 1;
        self.names.insert(p.to_string(), self.next);
        self.objs.insert(
            self.next,
            Obj {
                body,
                xattrs: BTreeMap::new(),
            },
        );
    }

    /// The file at `p`, created empty when absent (`None` when `p` is a symbolic link).
    fn file(&mut self, p: &str) -> Option<&mut Vec<u8>> {
        if !self.names.contains_key(p) {
            self.add(p, Body::File(Vec::new()));
        }
        match &mut self.objs.get_mut(&self.names[p])?.body {
            Body::File(d) => Some(d),
            Body::Link(_) => None,
        }
    }

    fn unlink(&mut self, p: &str) -> Option<u64> {
        let id = self.names.remove(p)?;
        if !self.names.values().any(|&i| i == id) {
            self.objs.remove(&id);
        }
        Some(id)
    }
}

/// What the mounted file system holds at `path`, compared with `want`.
fn check_path(fs: &FileSystem, cut: usize, path: &str, want: Option<&Obj>) {
    match want {
        None => match fs.metadata(path) {
            Err(FsError::NotFound(_)) => {}
            got => panic!("cut {cut}: {path}: synced as absent, found {got:?}"),
        },
        Some(obj) => {
            match &obj.body {
                Body::File(want) => {
                    let got = fs
                        .read(path)
                        .unwrap_or_else(|e| panic!("cut {cut}: {path}: synced file: {e}"));
                    assert!(
                        *want == got,
                        "cut {cut}: {path} holds {} bytes, not the {} synced",
                        got.len(),
                        want.len()
                    );
                }
                Body::Link(want) => {
                    let got = fs
                        .read_link(path)
                        .unwrap_or_else(|e| panic!("cut {cut}: {path}: synced symlink: {e}"));
                    assert!(*want == got, "cut {cut}: {path}: symlink target differs");
                }
            }
            let ino = fs.metadata(path).expect("stat").ino;
            let mut names = fs.list_xattr(ino).expect("listxattr");
            names.sort();
            assert_eq!(
                names,
                obj.xattrs.keys().cloned().collect::<Vec<_>>(),
                "cut {cut}: {path}: attribute names"
            );
            for (k, v) in &obj.xattrs {
                assert_eq!(
                    fs.get_xattr(ino, k).expect("getxattr"),
                    *v,
                    "cut {cut}: {path}: attribute value"
                );
            }
        }
    }
}

/// AccelFS block size of the harness (`formatted_storage`), and the granularity at which
/// `materialize` keeps or loses an unflushed write.
const BS: usize = 4096;

/// One state a touched path went through: after an operation that began at trace position
/// `at`, `path` names inode `id` (`None`: absent), which then held `obj`.
#[derive(Debug, Clone)]
struct State {
    at: usize,
    path: String,
    id: Option<u64>,
    obj: Option<Obj>,
}

/// What a path touched since the last sync may hold after a crash at `cut`: the inodes it named
/// from that sync up to the cut (`None`: absent), and every state of each of those inodes over
/// the same span (the promised one included).
struct History<'a> {
    bindings: Vec<Option<u64>>,
    objs: Vec<(u64, &'a Obj)>,
}

impl<'a> History<'a> {
    fn new(
        promised: &'a Model,
        states: &'a [State],
        path: &str,
        sync_at: usize,
        cut: usize,
    ) -> Self {
        let span = || states.iter().filter(|s| s.at >= sync_at && s.at < cut);
        let mut bindings = vec![promised.names.get(path).copied()];
        bindings.extend(span().filter(|s| s.path == path).map(|s| s.id));
        bindings.sort();
        bindings.dedup();
        let mut objs = Vec::new();
        for id in bindings.iter().flatten() {
            objs.extend(promised.objs.get(id).map(|o| (*id, o)));
            objs.extend(
                span()
                    .filter(|s| s.id == Some(*id))
                    .filter_map(|s| Some((*id, s.obj.as_ref()?))),
            );
        }
        History { bindings, objs }
    }
}

/// Mounts a crash image with default options and returns the file system and the storage
/// holding the image; a failed mount panics naming the crash point `at`.
fn mount_image(image: Vec<u8>, at: &str) -> (FileSystem, MemStorage) {
    let crashed: MemStorage = Arc::new(Mutex::new(image));
    let fs = FileSystem::mount(reopen(&crashed), MountOptions::default())
        .unwrap_or_else(|e| panic!("{at}: mount failed: {e}"));
    (fs, crashed)
}

/// Whether bytes `lo..hi` of `got` are those of `state`, read as zeroes past its end.
fn same_range(state: &[u8], got: &[u8], lo: usize, hi: usize) -> bool {
    let mid = state.len().clamp(lo, hi);
    state.get(lo..mid).is_none_or(|s| *s == got[lo..mid]) && got[mid..hi].iter().all(|&b| b == 0)
}

/// Checks a path touched since the last sync (or since the fdatasync that promised its
/// contents) against its [`History`], which starts at the sync either way (after an fdatasync
/// that is looser than the promise, never wrong); returns whether it holds something other
/// than `promised`, the state the last sync promised.
///
/// What the format promises (docs/accelfs-format.md §7-§8), and so what is checked:
/// - **Names and metadata are one committed transaction.** After recovery the directories,
///   inodes and attribute blocks are those of the last transaction whose commit reached the
///   device, which committed at or after the last sync and before the cut. Transactions end
///   between operations, or inside a large write before its size grows (`write_done`), where
///   the metadata is still that before the write. So: the path is absent only if it was absent
///   at some point of the history; otherwise it names an inode it named at some point, and that
///   inode's kind, size (file), target (symbolic link) and whole set of extended attributes
///   (names and values: one attribute block, journaled whole) are **together** those of one
///   state of that inode in the history — not attribute by attribute.
/// - **File data is per block.** Every data block the metadata reaches holds contents some
///   state of the file put there: a newly allocated block is written before the commit that
///   makes it reachable (ordered mode) and a freed block is not reused before the freeing
///   commit is durable, so no foreign bytes; an overwrite in place is written whenever the
///   cache writes it back (eviction, sync, fdatasync), so blocks written in place may each come
///   from a different moment, and an unflushed write may be lost or kept per block (the harness
///   keeps each 4096-byte block of an unflushed write or drops it). So each 4096-byte block of
///   the contents, up to the size, must equal the same bytes of **some** state of an inode
///   whose metadata matched, any size, where bytes past a state's end read as zeroes (a hole,
///   a truncated tail, or an extension by `set_len` or by a write past the end are zeroes on
///   disk and in the model alike). Zeroes anywhere else, stale bytes from before the last sync
///   that a later state had replaced only if that state was not durable, and bytes of another
///   inode all fail.
/// - Hard-link identity of touched paths is not checked (each name is checked on its own).
fn check_touched(
    fs: &FileSystem,
    cut: usize,
    path: &str,
    promised: Option<&Obj>,
    history: &History,
) -> bool {
    let md = match fs.metadata(path) {
        Err(FsError::NotFound(_)) => {
            assert!(
                history.bindings.contains(&None),
                "cut {cut}: {path}: absent, but present at every point since the sync"
            );
            return promised.is_some();
        }
        Err(e) => panic!("cut {cut}: {path}: touched path: {e}"),
        Ok(md) => md,
    };
    let body = if md.is_file() {
        Body::File(
            fs.read(path)
                .unwrap_or_else(|e| panic!("cut {cut}: {path}: touched file: {e}")),
        )
    } else if md.is_symlink() {
        Body::Link(
            fs.read_link(path)
                .unwrap_or_else(|e| panic!("cut {cut}: {path}: touched symlink: {e}")),
        )
    } else {
        panic!(
            "cut {cut}: {path}: a {:?}, never one in its history",
            md.file_type
        );
    };
    let mut xattrs = BTreeMap::new();
    for name in fs.list_xattr(md.ino).expect("listxattr") {
        let value = fs.get_xattr(md.ino, &name).expect("getxattr");
        xattrs.insert(name, value);
    }
    let found = Obj { body, xattrs };
    let same_meta = |o: &Obj| {
        o.xattrs == found.xattrs
            && match (&o.body, &found.body) {
                (Body::File(a), Body::File(b)) => a.len() == b.len(),
                (Body::Link(a), Body::Link(b)) => a == b,
                _ => false,
            }
    };
    let ids: Vec<u64> = history
        .objs
        .iter()
        .filter(|(_, o)| same_meta(o))
        .map(|(id, _)| *id)
        .collect();
    assert!(
        !ids.is_empty(),
        "cut {cut}: {path}: kind, size, target and attributes ({:?}, {} attributes) are no \
         state of its inodes since the sync",
        match &found.body {
            Body::File(d) => format!("file of {} bytes", d.len()),
            Body::Link(t) => format!("symlink of {} bytes", t.len()),
        },
        found.xattrs.len()
    );
    if let Body::File(got) = &found.body {
        let contents: Vec<&[u8]> = history
            .objs
            .iter()
            .filter(|(id, _)| ids.contains(id))
            .filter_map(|(_, o)| match &o.body {
                Body::File(d) => Some(d.as_slice()),
                Body::Link(_) => None,
            })
            .collect();
        for lo in (0..got.len()).step_by(BS) {
            let hi = (lo + BS).min(got.len());
            assert!(
                contents.iter().any(|d| same_range(d, got, lo, hi)),
                "cut {cut}: {path}: block {} (bytes {lo}..{hi}, {}) is that of no state of its \
                 inode since the sync (states of {:?} bytes)",
                lo / BS,
                if got[lo..hi].iter().all(|&b| b == 0) {
                    "zeroes"
                } else {
                    "not zeroes"
                },
                contents.iter().map(|d| d.len()).collect::<Vec<_>>()
            );
        }
    }
    promised != Some(&found)
}

#[test]
fn every_crash_point_mounts_clean_with_every_synced_file_intact() {
    let points: usize = std::env::var("KURA_FS_CRASH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let storage = formatted_storage(DEVICE_BYTES);
    let base = storage.lock().expect("storage").clone();
    let (dev, control) = recording_device(&storage);
    let fs = FileSystem::mount(
        Box::new(dev),
        MountOptions {
            cache_bytes: 256 << 10,
            bypass_bytes: 64 << 10,
            ..MountOptions::default()
        },
    )
    .expect("mount");
    fs.mkdir("/d").expect("mkdir");
    // The workload's seed: `KURA_FS_CRASH_SEED` (default 2026) runs another workload.
    let seed: u64 = std::env::var("KURA_FS_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2026);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model: Model = Model::default();
    // (trace position when the sync was acknowledged, the model then)
    let mut synced: Vec<(usize, Model)> = vec![(control.trace().len(), Model::default())];
    // (trace position when the operation began, the paths it may change)
    let mut touched: Vec<(usize, Vec<String>)> = Vec::new();
    // (trace position when fdatasync returned, the path, its contents then)
    let mut file_synced: Vec<(usize, String, Vec<u8>)> = Vec::new();
    // (trace position when the operation began, the names it created, removed or rebound):
    // fdatasync makes an inode's contents durable, not a name changed since the last sync.
    let mut named: Vec<(usize, Vec<String>)> = Vec::new();
    // How often each POSIX operation ran: symlink, link, noreplace, exchange, xattr.
    let mut posix_ops = [0usize; 5];
    let paths: Vec<String> = (0..6)
        .map(|i| format!("/f{i}"))
        .chain((0..6).map(|i| format!("/d/g{i}")))
        .collect();
    // Every state a touched path went through: (trace position when the operation began, the
    // path, the inode it names afterwards, that inode's contents afterwards).
    let mut states: Vec<State> = Vec::new();
    for step in 0..300u64 {
        let began = control.trace().len();
        let touched_before = touched.len();
        let p = paths[rng.gen_range(0..paths.len())].clone();
        let q = paths[rng.gen_range(0..paths.len())].clone();
        // Symbolic links and hard links need a free name: the first after a random one.
        let start = rng.gen_range(0..paths.len());
        let free = (0..paths.len())
            .map(|i| paths[(start + i) % paths.len()].clone())
            .find(|x| !model.names.contains_key(x));
        let op = match rng.gen_range(0..18) {
            16 => 8,
            17 => 9,
            op => op,
        };
        match op {
            0..=3
                if !model
                    .get(&p)
                    .is_some_and(|o| !matches!(o.body, Body::File(_))) =>
            {
                let len = if rng.gen_bool(0.2) {
                    rng.gen_range(64 << 10..300 << 10)
                } else {
                    rng.gen_range(1..20_000)
                };
                let data = content(step, len);
                if !model.names.contains_key(&p) {
                    named.push((began, vec![p.clone()]));
                    // Opening creates the file empty; a commit may come before the write's
                    // size does (a large write grows the size after its last step).
                    model.add(&p, Body::File(Vec::new()));
                    let id = model.names[&p];
                    states.push(State {
                        at: began,
                        path: p.clone(),
                        id: Some(id),
                        obj: model.objs.get(&id).cloned(),
                    });
                }
                let old = model.file(&p).expect("a file");
                let off = rng.gen_range(0..=old.len() + 5000);
                let f = fs
                    .open_with(
                        &p,
                        kura_accelfs::OpenOptions::new().write(true).create(true),
                    )
                    .expect("open");
                f.write_at(off as u64, &data).expect("write");
                if old.len() < off + len {
                    old.resize(off + len, 0);
                }
                old[off..off + len].copy_from_slice(&data);
                touched.push((began, model.names_of(&p)));
            }
            4 if model.is_file(&p) => {
                let old = model.file(&p).expect("a file");
                let len = rng.gen_range(0..=old.len() + 10_000);
                fs.open_with(&p, kura_accelfs::OpenOptions::new().write(true))
                    .expect("open")
                    .set_len(len as u64)
                    .expect("truncate");
                old.resize(len, 0);
                touched.push((began, model.names_of(&p)));
            }
            5 if model.names.contains_key(&p) => {
                fs.remove_file(&p).expect("remove");
                model.unlink(&p);
                named.push((began, vec![p.clone()]));
                touched.push((began, vec![p]));
            }
            6 if q != p && model.names.contains_key(&p) => {
                fs.rename(&p, &q).expect("rename");
                // Two names of one inode: rename does nothing.
                if model.names.get(&p) != model.names.get(&q) {
                    model.unlink(&q);
                    let id = model.names.remove(&p).expect("present");
                    model.names.insert(q.clone(), id);
                }
                named.push((began, vec![p.clone(), q.clone()]));
                touched.push((began, vec![p, q]));
            }
            7 if model
                .get(&p)
                .is_some_and(|o| matches!(&o.body, Body::File(d) if d.len() > 1)) =>
            {
                // An overwrite inside the file (no new size, no new blocks), then fdatasync,
                // which promises only this file's contents.
                let old = model.file(&p).expect("a file");
                let off = rng.gen_range(0..old.len() - 1);
                let len = rng.gen_range(1..=(old.len() - off).min(20_000));
                let data = content(step ^ 0xfeed, len);
                let f = fs
                    .open_with(&p, kura_accelfs::OpenOptions::new().write(true))
                    .expect("open");
                f.write_at(off as u64, &data).expect("overwrite");
                old[off..off + len].copy_from_slice(&data);
                let after = old.clone();
                touched.push((began, model.names_of(&p)));
                f.sync_data().expect("fdatasync");
                file_synced.push((control.trace().len(), p.clone(), after));
            }
            8 if free.is_some() => {
                let p = free.expect("a free name");
                // Fast (in the inode) or slow (a block) symbolic link.
                let len = if rng.gen_bool(0.5) {
                    rng.gen_range(1..=84)
                } else {
                    rng.gen_range(85..=4000)
                };
                let target: Vec<u8> = (0..len).map(|_| rng.gen_range(b'a'..=b'z')).collect();
                fs.symlink(&target, &p).expect("symlink");
                posix_ops[0] += 1;
                model.add(&p, Body::Link(target));
                named.push((began, vec![p.clone()]));
                touched.push((began, vec![p]));
            }
            9 if free.is_some() && model.names.contains_key(&p) => {
                let q = free.expect("a free name");
                fs.hard_link(&p, &q).expect("link");
                posix_ops[1] += 1;
                let id = model.names[&p];
                model.names.insert(q.clone(), id);
                named.push((began, vec![q.clone()]));
                touched.push((began, vec![q]));
            }
            10 if q != p && model.names.contains_key(&p) => {
                let r = fs.rename_with(&p, &q, RenameMode::NoReplace);
                posix_ops[2] += 1;
                if model.names.contains_key(&q) {
                    assert!(matches!(r, Err(FsError::Exists(_))), "noreplace: {r:?}");
                } else {
                    r.expect("rename noreplace");
                    let id = model.names.remove(&p).expect("present");
                    model.names.insert(q.clone(), id);
                    named.push((began, vec![p.clone(), q.clone()]));
                    touched.push((began, vec![p, q]));
                }
            }
            11 if q != p && model.names.contains_key(&p) && model.names.contains_key(&q) => {
                fs.rename_with(&p, &q, RenameMode::Exchange)
                    .expect("rename exchange");
                posix_ops[3] += 1;
                let (a, b) = (model.names[&p], model.names[&q]);
                model.names.insert(p.clone(), b);
                model.names.insert(q.clone(), a);
                named.push((began, vec![p.clone(), q.clone()]));
                touched.push((began, vec![p, q]));
            }
            12 if model.names.contains_key(&p) => {
                let ino = fs.metadata(&p).expect("stat").ino;
                let key = format!("user.k{}", rng.gen_range(0..4)).into_bytes();
                posix_ops[4] += 1;
                let id = model.names[&p];
                let obj = model.objs.get_mut(&id).expect("object");
                if rng.gen_bool(0.7) {
                    let value = content(step ^ 0xa77, rng.gen_range(0..1500));
                    let r = fs.set_xattr(ino, &key, &value, XattrMode::Any);
                    // All of an inode's attributes fit in one block: Σ (4 + name + value)
                    // ≤ B − 24 (docs/accelfs-format.md §5); past that the set is ENOSPC and
                    // changes nothing.
                    let mut after = obj.xattrs.clone();
                    after.insert(key, value);
                    let used: usize = after.iter().map(|(k, v)| 4 + k.len() + v.len()).sum();
                    if used <= BS - 24 {
                        r.expect("setxattr");
                        obj.xattrs = after;
                    } else {
                        assert!(matches!(r, Err(FsError::NoSpace(_))), "{used} bytes: {r:?}");
                    }
                } else {
                    let r = fs.remove_xattr(ino, &key);
                    if obj.xattrs.remove(&key).is_some() {
                        r.expect("removexattr");
                    } else {
                        assert!(matches!(r, Err(FsError::NoAttribute(_))), "{r:?}");
                    }
                }
                touched.push((began, model.names_of(&p)));
            }
            13..=15 => {
                if rng.gen_bool(0.5) {
                    fs.sync().expect("sync");
                    synced.push((control.trace().len(), model.clone()));
                } else if model.is_file(&p) {
                    // fsync commits every metadata change but writes only this file's dirty
                    // data (and that of files whose size or block map changed): it promises
                    // this file's contents, as fdatasync does, and nothing about other files'
                    // overwrites.
                    fs.open(&p).expect("open").sync_all().expect("fsync");
                    let data = model.file(&p).expect("a file").clone();
                    file_synced.push((control.trace().len(), p.clone(), data));
                }
            }
            _ => {}
        }
        for (at, ps) in &touched[touched_before..] {
            for path in ps {
                let id = model.names.get(path).copied();
                states.push(State {
                    at: *at,
                    path: path.clone(),
                    id,
                    obj: id.and_then(|i| model.objs.get(&i).cloned()),
                });
            }
        }
    }
    let trace = control.trace();
    drop(fs);
    assert!(
        posix_ops.iter().all(|&n| n > 3),
        "symlink, link, noreplace, exchange, xattr ran {posix_ops:?} times"
    );
    assert!(
        synced.len() > 10,
        "the workload synced {} times",
        synced.len()
    );
    let mut rng = SmallRng::seed_from_u64(7);
    let first = synced[0].0;
    let mut compared = 0usize;
    // Touched paths checked against their history, and how many of them held a state written
    // after the last sync (so the check sees more than the promised state).
    let (mut touched_checked, mut touched_newer) = (0usize, 0usize);
    for p in 0..points {
        let cut = rng.gen_range(first..=trace.len());
        let image = materialize(&base, &trace, cut, 4096, 0.5, p as u64);
        let (fs, crashed) = mount_image(image, &format!("cut {cut}"));
        let (sync_at, promised) = synced
            .iter()
            .rev()
            .find(|(at, _)| *at <= cut)
            .expect("the first sync point precedes every cut");
        let mut unchanged = Vec::new();
        for path in &paths {
            // The newest promise for this path: the last global sync, or a later fdatasync of
            // a file's contents.
            let fdatasync = file_synced
                .iter()
                .rev()
                .find(|(at, p, _)| p == path && *at <= cut && at > sync_at)
                .filter(|(at, _, _)| {
                    !named
                        .iter()
                        .any(|(n, ps)| *n >= *sync_at && n < at && ps.contains(path))
                });
            let since = fdatasync.map_or(*sync_at, |(at, _, _)| *at);
            let changed = touched
                .iter()
                .any(|(at, ps)| *at >= since && *at < cut && ps.contains(path));
            if changed {
                let newer = check_touched(
                    &fs,
                    cut,
                    path,
                    promised.get(path),
                    &History::new(promised, &states, path, *sync_at, cut),
                );
                touched_checked += 1;
                touched_newer += usize::from(newer);
                continue;
            }
            if let Some((_, _, want)) = fdatasync {
                // fdatasync promised this file's contents, nothing else.
                let got = fs
                    .read(path)
                    .unwrap_or_else(|e| panic!("cut {cut}: {path}: fdatasync'd file: {e}"));
                assert!(
                    *want == got,
                    "cut {cut}: {path}: not the contents fdatasync'd"
                );
                compared += 1;
                continue;
            }
            let want = promised.get(path);
            compared += usize::from(want.is_some());
            check_path(&fs, cut, path, want);
            unchanged.push(path);
        }
        // Untouched names of one inode in the promise are still one inode.
        for (i, a) in unchanged.iter().enumerate() {
            for b in &unchanged[i + 1..] {
                let (ia, ib) = (promised.names.get(*a), promised.names.get(*b));
                if ia.is_some() && ia == ib {
                    assert_eq!(
                        fs.metadata(a).expect("stat").ino,
                        fs.metadata(b).expect("stat").ino,
                        "cut {cut}: {a} and {b} were hard links"
                    );
                }
            }
        }
        drop(fs);
        let problems = fsck_problems(&crashed);
        assert!(problems.is_empty(), "cut {cut}: fsck: {problems:#?}");
    }
    assert!(
        compared > points,
        "only {compared} synced files were checked over {points} cuts"
    );
    eprintln!(
        "{points} cuts: {compared} synced paths compared, {touched_checked} touched paths \
         checked against their history, {touched_newer} of them newer than the sync"
    );
    assert!(
        touched_checked > 0 && touched_newer > 0,
        "touched paths: {touched_checked} checked, {touched_newer} held a state newer than the sync"
    );
}

/// Regression (workload seeds 50, 70, 73 and 90 of the harness above): a commit used to issue
/// the ordered data blocks and the log, commit block included, in one batch before one flush,
/// so a crash before that flush could keep the commit and lose the data, and the file then
/// showed the bytes a removed file had left in its reused blocks. A file created, written and
/// synced after another file's blocks were freed must, at every cut, be absent, empty or
/// exactly what was written — never the removed file's bytes.
#[test]
fn a_crash_during_a_commit_never_shows_a_reused_block_s_old_bytes() {
    let storage = formatted_storage(DEVICE_BYTES);
    let fs = mount_storage(&storage);
    // Most of the device, so the new files can only get its blocks back.
    fs.write("/old", &content(1, 6 << 20)).expect("write");
    fs.sync().expect("sync");
    fs.remove_file("/old").expect("remove");
    fs.sync().expect("sync");
    fs.unmount().expect("unmount");
    let base = storage.lock().expect("storage").clone();
    let (dev, control) = recording_device(&storage);
    let fs = FileSystem::mount(
        Box::new(dev),
        MountOptions {
            bypass_bytes: 64 << 10,
            ..MountOptions::default()
        },
    )
    .expect("mount");
    let start = control.trace().len();
    // A small write through the cache and a large one whose blocks go to the device directly.
    let new = [
        ("/small", content(2, 20_000)),
        ("/large", content(3, 3 << 20)),
    ];
    for (path, data) in &new {
        fs.write(path, data).expect("write");
        fs.sync().expect("sync");
    }
    let trace = control.trace();
    drop(fs);
    let mut checked = 0;
    for cut in start..=trace.len() {
        // Each unflushed 4 KiB block is kept or lost at random; kept mostly, the log's blocks
        // and the commit are all kept while one of the many data blocks is lost.
        for (seed, keep) in (0..16).flat_map(|s| [(s, 0.5), (s, 0.95)]) {
            let image = materialize(&base, &trace, cut, BS, keep, seed);
            let (fs, _) = mount_image(image, &format!("cut {cut}"));
            for (path, data) in &new {
                match fs.read(path) {
                    Err(FsError::NotFound(_)) => {}
                    Ok(got) => {
                        assert!(
                            got.is_empty() || got == *data,
                            "cut {cut} (seed {seed}, keep {keep}): {path} holds {} bytes, not what was \
                             written{}",
                            got.len(),
                            if got.len() == data.len() {
                                " (the same size: a reused block's old bytes)"
                            } else {
                                ""
                            }
                        );
                        checked += usize::from(!got.is_empty());
                    }
                    Err(e) => panic!("cut {cut}: {path}: {e}"),
                }
            }
        }
    }
    assert!(checked > 0, "no cut held a new file's data");
}

/// fsync is per file (format §7 "What an fsync writes"): `sync_all` of one file commits the
/// metadata and that file's data, not another file's dirty overwrites, and what it promised
/// survives a crash cut right after it returns, however the unflushed writes before the cut
/// fared. The other file then holds, block by block, its own old or new data; after a `sync`,
/// its new data.
#[test]
fn an_fsync_makes_its_own_file_durable_without_writing_other_files_data() {
    fsync_is_per_file(|_, a| a.sync_all().expect("fsync a"));
}

/// The same through the inode-number API a FUSE adapter uses (`FileSystem::sync_ino`), as
/// fsync and as fdatasync.
#[test]
fn an_fsync_by_inode_number_is_per_file_too() {
    fsync_is_per_file(|fs, a| fs.sync_ino(a.ino(), false).expect("fsync a"));
    fsync_is_per_file(|fs, a| fs.sync_ino(a.ino(), true).expect("fdatasync a"));
}

/// The body of the two tests above: `fsync` makes file /a durable.
fn fsync_is_per_file(fsync: impl Fn(&FileSystem, &kura_accelfs::File)) {
    const B_BYTES: usize = 512 << 10;
    let storage = formatted_storage(DEVICE_BYTES);
    let fs = mount_storage(&storage);
    let (a_old, b_old) = (content(10, 40_000), content(11, B_BYTES));
    fs.write("/a", &a_old).expect("write");
    fs.write("/b", &b_old).expect("write");
    fs.unmount().expect("unmount");
    let base = storage.lock().expect("storage").clone();
    let (dev, control) = recording_device(&storage);
    let fs = FileSystem::mount(Box::new(dev), MountOptions::default()).expect("mount");
    // B: overwritten in place (no new size or block), in pieces small enough for the cache.
    let b_new = content(12, B_BYTES);
    let b = fs
        .open_with("/b", kura_accelfs::OpenOptions::new().write(true))
        .expect("open");
    for (i, piece) in b_new.chunks(64 << 10).enumerate() {
        b.write_at((i * (64 << 10)) as u64, piece).expect("write b");
    }
    // A: overwritten in place too, so only the fsync asks for its data.
    let mut a_new = a_old.clone();
    a_new[1000..9000].copy_from_slice(&content(13, 8000));
    a_new[30_000..].copy_from_slice(&content(14, 10_000));
    let a = fs
        .open_with("/a", kura_accelfs::OpenOptions::new().write(true))
        .expect("open");
    a.write_at(0, &a_new).expect("write a");
    let before = control.trace().len();
    fsync(&fs, &a);
    let fsynced = control.trace().len();
    let written: usize = control.trace()[before..fsynced]
        .iter()
        .map(|e| match e {
            TraceEvent::Write { data, .. } => data.len(),
            TraceEvent::Flush => 0,
        })
        .sum();
    assert!(
        written < B_BYTES / 4,
        "fsync of /a wrote {written} bytes: /b's {B_BYTES} dirty bytes went too"
    );
    fs.sync().expect("sync");
    let synced = control.trace().len();
    let trace = control.trace();
    drop(fs);
    for (cut, whole_b) in [(fsynced, false), (synced, true)] {
        for (seed, keep) in (0..8).flat_map(|s| [(s, 0.0), (s, 0.5), (s, 1.0)]) {
            let at = format!("cut {cut} (seed {seed}, keep {keep})");
            let image = materialize(&base, &trace, cut, BS, keep, seed);
            let (fs, crashed) = mount_image(image, &at);
            assert!(
                fs.read("/a").expect("read a") == a_new,
                "{at}: /a lost its fsync"
            );
            let got = fs.read("/b").expect("read b");
            if whole_b {
                assert!(got == b_new, "{at}: /b lost its sync");
            } else {
                assert_eq!(got.len(), B_BYTES, "{at}: /b's size");
                for (i, block) in got.chunks(BS).enumerate() {
                    let r = i * BS..(i * BS + block.len());
                    assert!(
                        block == &b_old[r.clone()] || block == &b_new[r],
                        "{at}: /b block {i} is neither its old nor its new data"
                    );
                }
            }
            drop(fs);
            let problems = fsck_problems(&crashed);
            assert!(problems.is_empty(), "{at}: fsck: {problems:#?}");
        }
    }
}

fn populated() -> MemStorage {
    let storage = formatted_storage(DEVICE_BYTES);
    let fs = mount_storage(&storage);
    fs.create_dir_all("/x/y").expect("mkdir");
    for i in 0..20 {
        fs.write(&format!("/x/y/f{i}"), &content(i, 3000 * i as usize + 1))
            .expect("write");
    }
    fs.write("/big", &content(99, 1 << 20)).expect("write");
    fs.unmount().expect("unmount");
    storage
}

fn read_all(fs: &FileSystem) -> Result<usize, FsError> {
    let mut n = 0;
    for i in 0..20u64 {
        let got = fs.read(&format!("/x/y/f{i}"))?;
        assert!(
            got == content(i, 3000 * i as usize + 1),
            "f{i} silently wrong"
        );
        n += 1;
    }
    assert!(
        fs.read("/big")? == content(99, 1 << 20),
        "big silently wrong"
    );
    Ok(n + 1)
}

#[test]
fn read_errors_are_reported_and_never_wrong_data() {
    let storage = populated();
    let mut failures = 0;
    for nth in 1..80 {
        let (dev, _) = fault_device(
            &storage,
            FaultPlan {
                read_eio: Some(nth),
                ..FaultPlan::default()
            },
        );
        match FileSystem::mount(Box::new(dev), MountOptions::default()) {
            Err(e) => {
                assert!(matches!(e, FsError::Device(_)), "read {nth}: {e}");
                failures += 1;
            }
            Ok(fs) => match read_all(&fs) {
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.errno(), libc::EIO, "read {nth}: {e}");
                    failures += 1;
                }
            },
        }
    }
    assert!(failures > 10, "the injected errors were seen");
    assert!(fsck_problems(&storage).is_empty());
}

#[test]
fn a_failed_write_or_flush_makes_the_file_system_read_only_and_loses_nothing_synced() {
    for plan in [
        FaultPlan {
            flush_eio: Some(2),
            ..FaultPlan::default()
        },
        FaultPlan {
            write_eio: Some(3),
            ..FaultPlan::default()
        },
    ] {
        let storage = populated();
        let (dev, _) = fault_device(&storage, plan.clone());
        let fs = FileSystem::mount(Box::new(dev), MountOptions::default()).expect("mount");
        // However many writes each sync issues, the injected failure comes within a few.
        let outcome = (|| -> Result<(), FsError> {
            for i in 0..10 {
                fs.write(&format!("/new{i}"), b"more")?;
                fs.sync()?;
            }
            Ok(())
        })();
        let e = outcome.expect_err("an injected failure surfaces");
        assert_eq!(e.errno(), libc::EIO, "{plan:?}: {e}");
        let refused = fs.write("/after", b"third").expect_err("read-only now");
        assert_eq!(refused.errno(), libc::EROFS, "{refused}");
        assert!(fs.sync().is_err());
        assert_eq!(read_all(&fs).expect("reads still work"), 21);
        drop(fs);
        let problems = fsck_problems(&storage);
        assert!(problems.is_empty(), "{plan:?}: {problems:#?}");
        let fs = FileSystem::mount(reopen(&storage), MountOptions::default()).expect("remount");
        assert_eq!(read_all(&fs).expect("synced data intact"), 21);
    }
}

/// Dirty blocks evicted to make room are written after the state lock is let go (queued for the
/// next holder of the disk lock). A failed write there cannot fail the write that evicted them,
/// which already returned: it fails the next fsync with EIO, as a page-cache write-back error
/// does, and the file system goes read-only; what was synced before is intact after remount and
/// fsck finds nothing wrong.
#[test]
fn a_failed_write_back_of_evicted_blocks_fails_the_next_fsync() {
    let storage = populated();
    let (dev, _) = fault_device(
        &storage,
        FaultPlan {
            // The first write of this mount: nothing is synced before the write-back.
            write_eio: Some(1),
            ..FaultPlan::default()
        },
    );
    let fs = FileSystem::mount(
        Box::new(dev),
        MountOptions {
            // The smallest cache (16 blocks): 64 dirty blocks cannot all stay.
            cache_bytes: 0,
            ..MountOptions::default()
        },
    )
    .expect("mount");
    let f = fs.create("/evicted").expect("create");
    for b in 0..64u64 {
        f.write_at(b * 4096, &content(b, 4096))
            .expect("a write that evicts is not failed by the write-back");
    }
    let e = f.sync_all().expect_err("the failed write-back surfaces");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let refused = fs.write("/after", b"more").expect_err("read-only now");
    assert_eq!(refused.errno(), libc::EROFS, "{refused}");
    assert!(fs.sync().is_err(), "every later sync fails too");
    assert_eq!(read_all(&fs).expect("reads still work"), 21);
    drop(f);
    drop(fs);
    let problems = fsck_problems(&storage);
    assert!(problems.is_empty(), "{problems:#?}");
    let fs = FileSystem::mount(reopen(&storage), MountOptions::default()).expect("remount");
    assert_eq!(read_all(&fs).expect("synced data intact"), 21);
    assert!(!fs.exists("/evicted"), "never committed");
}

#[test]
fn damaged_images_give_errors_not_panics() {
    let storage = populated();
    let clean = storage.lock().expect("storage").clone();
    let mut rng = SmallRng::seed_from_u64(5);
    let mut refused = 0;
    for round in 0..150 {
        let mut image = clean.clone();
        // Metadata lives in the first blocks and in directory blocks spread over the data region.
        for _ in 0..rng.gen_range(1..4) {
            let at = if rng.gen_bool(0.7) {
                rng.gen_range(0..64 * 4096)
            } else {
                rng.gen_range(0..image.len())
            };
            image[at] ^= 1 << rng.gen_range(0..8);
        }
        if round % 10 == 9 {
            image.truncate(rng.gen_range(0..image.len()) / 4096 * 4096);
        }
        let damaged: MemStorage = Arc::new(Mutex::new(image));
        if damaged.lock().expect("storage").is_empty() {
            continue;
        }
        let dev = MemDevice::with_storage(damaged.clone(), QueueOptions::default());
        match FileSystem::mount(Box::new(dev), MountOptions::default()) {
            Err(_) => refused += 1,
            Ok(fs) => {
                // Reading may fail with a checksum error; data it returns was checked above.
                let _ = fs.read_dir("/x/y");
                for i in 0..20 {
                    let _ = fs.metadata(&format!("/x/y/f{i}"));
                }
            }
        }
        let dev = MemDevice::with_storage(damaged, QueueOptions::default());
        let _ = fsck(Box::new(dev));
    }
    assert!(refused > 0, "some damage was caught at mount");
}
