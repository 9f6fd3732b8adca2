//! Model-based test: random operation sequences against AccelFS and against a map of
//! path → bytes, with syncs, clean remounts and fsck in between. Any difference is a bug.

use kura_accelfs::{fsck, FileSystem, FsError, MkfsOptions, MountOptions, OpenOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Op {
    Write {
        file: usize,
        offset: usize,
        len: usize,
        seed: u8,
    },
    Append {
        file: usize,
        len: usize,
        seed: u8,
    },
    Truncate {
        file: usize,
        len: usize,
    },
    Remove {
        file: usize,
    },
    Rename {
        from: usize,
        to: usize,
    },
    Sync,
    Remount,
}

const FILES: [&str; 6] = ["/a", "/b", "/dir/c", "/dir/d", "/dir/sub/e", "/f"];

fn op() -> impl Strategy<Value = Op> {
    let file = 0..FILES.len();
    prop_oneof![
        4 => (file.clone(), 0..40_000usize, prop_oneof![1..10_000usize, 200_000..400_000usize], any::<u8>())
            .prop_map(|(file, offset, len, seed)| Op::Write { file, offset, len, seed }),
        2 => (file.clone(), 1..9000usize, any::<u8>()).prop_map(|(file, len, seed)| Op::Append { file, len, seed }),
        1 => (file.clone(), 0..50_000usize).prop_map(|(file, len)| Op::Truncate { file, len }),
        1 => file.clone().prop_map(|file| Op::Remove { file }),
        1 => (file.clone(), file).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => Just(Op::Sync),
        1 => Just(Op::Remount),
    ]
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed))
        .collect()
}

fn mount(storage: &MemStorage, cache: u64) -> FileSystem {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    FileSystem::mount(
        Box::new(dev),
        MountOptions {
            cache_bytes: cache,
            bypass_bytes: 128 << 10,
            ..MountOptions::default()
        },
    )
    .expect("mount")
}

fn check(fs: &FileSystem, model: &BTreeMap<usize, Vec<u8>>) {
    for (i, path) in FILES.iter().enumerate() {
        match (model.get(&i), fs.read(path)) {
            (Some(want), Ok(got)) => assert!(*want == got, "{path}: contents differ"),
            (None, Err(FsError::NotFound(_))) => {}
            (w, g) => panic!(
                "{path}: model {:?} vs fs {:?}",
                w.map(Vec::len),
                g.map(|g| g.len())
            ),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn accelfs_behaves_like_a_map_of_paths_to_bytes(ops in prop::collection::vec(op(), 1..40)) {
        let dev = MemDevice::new(32 << 20, QueueOptions::default());
        let storage = dev.storage();
        let cache = 512 << 10;
        let mut fs = FileSystem::format(
            Box::new(dev),
            MkfsOptions { block_size: 4096, inodes: None },
            MountOptions { cache_bytes: cache, ..MountOptions::default() },
        ).expect("format");
        fs.create_dir_all("/dir/sub").expect("dirs");
        let mut model: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Write { file, offset, len, seed } => {
                    let data = bytes(len, seed);
                    let f = fs.open_with(FILES[file], OpenOptions::new().write(true).create(true)).expect("open");
                    f.write_at(offset as u64, &data).expect("write");
                    let m = model.entry(file).or_default();
                    if m.len() < offset + len { m.resize(offset + len, 0); }
                    m[offset..offset + len].copy_from_slice(&data);
                }
                Op::Append { file, len, seed } => {
                    let data = bytes(len, seed);
                    let mut f = fs.open_with(FILES[file], OpenOptions::new().append(true).create(true)).expect("open");
                    let at = f.append(&data).expect("append");
                    let m = model.entry(file).or_default();
                    prop_assert_eq!(at as usize, m.len());
                    m.extend_from_slice(&data);
                }
                Op::Truncate { file, len } => {
                    let r = fs.open_with(FILES[file], OpenOptions::new().write(true)).and_then(|f| f.set_len(len as u64));
                    match model.get_mut(&file) {
                        Some(m) => { r.expect("truncate"); m.resize(len, 0); }
                        None => prop_assert_eq!(r.expect_err("missing").errno(), libc::ENOENT),
                    }
                }
                Op::Remove { file } => {
                    let r = fs.remove_file(FILES[file]);
                    match model.remove(&file) {
                        Some(_) => r.expect("remove"),
                        None => prop_assert_eq!(r.expect_err("missing").errno(), libc::ENOENT),
                    }
                }
                Op::Rename { from, to } => {
                    let r = fs.rename(FILES[from], FILES[to]);
                    match model.remove(&from) {
                        Some(data) => { r.expect("rename"); model.insert(to, data); }
                        None => prop_assert_eq!(r.expect_err("missing").errno(), libc::ENOENT),
                    }
                }
                Op::Sync => fs.sync().expect("sync"),
                Op::Remount => {
                    fs.unmount().expect("unmount");
                    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
                    let r = fsck(Box::new(dev)).expect("fsck");
                    prop_assert!(r.is_clean(), "fsck: {:#?}", r.problems);
                    fs = mount(&storage, cache);
                }
            }
            check(&fs, &model);
        }
        fs.unmount().expect("unmount");
        let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
        let r = fsck(Box::new(dev)).expect("fsck");
        prop_assert!(r.is_clean(), "fsck: {:#?}", r.problems);
        check(&mount(&storage, cache), &model);
    }
}
