//! Mounting an untrusted image and using it: the fuzzer's bytes overwrite part of a small,
//! populated AccelFS; mount, walk every directory, read every file, write one, sync and unmount
//! must each succeed or return an error — never panic or loop.
#![no_main]

use kura_accelfs::{FileSystem, FileType, MkfsOptions, MountOptions, XattrMode};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex, OnceLock};

const SIZE: u64 = 2 << 20;

fn pristine() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dev = MemDevice::new(SIZE, QueueOptions::default());
        let storage = dev.storage();
        let fs = FileSystem::format(
            Box::new(dev),
            MkfsOptions {
                block_size: 4096,
                inodes: Some(64),
            },
            MountOptions::default(),
        )
        .expect("format");
        fs.create_dir_all("/d/e").expect("mkdir");
        for i in 0..8 {
            fs.write(&format!("/d/f{i}"), &vec![i as u8; 5000 * i + 1])
                .expect("write");
        }
        // The posix structures: a fast and a slow symlink, a hard link, an attribute block.
        fs.symlink(b"f1", "/d/fast").expect("symlink");
        fs.symlink(&[b'x'; 300], "/d/slow").expect("symlink");
        fs.hard_link("/d/f2", "/d/e/f2-link").expect("link");
        let f3 = fs.metadata("/d/f3").expect("stat").ino;
        fs.set_xattr(f3, b"user.k", b"value", XattrMode::Any)
            .expect("xattr");
        fs.sync().expect("sync");
        // Leave a committed transaction in the journal, too.
        fs.write("/d/e/journaled", b"in the log").expect("write");
        fs.sync().expect("sync");
        let image = storage.lock().expect("lock").clone();
        drop(fs);
        image
    })
}

fn walk(fs: &FileSystem, ino: u64, depth: usize) {
    if depth > 8 {
        return;
    }
    let Ok(entries) = fs.list(ino) else { return };
    for e in entries {
        match e.file_type {
            FileType::Directory => walk(fs, e.ino, depth + 1),
            FileType::File => {
                let mut buf = vec![0u8; 64 << 10];
                let _ = fs.read_ino(e.ino, 0, &mut buf);
                let _ = fs.list_xattr(e.ino);
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

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let mut image = pristine().clone();
    let at = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize % image.len();
    let rest = &data[4..];
    let end = (at + rest.len()).min(image.len());
    image[at..end].copy_from_slice(&rest[..end - at]);
    let dev = MemDevice::with_storage(Arc::new(Mutex::new(image)), QueueOptions::default());
    let Ok(fs) = FileSystem::mount(Box::new(dev), MountOptions::default()) else {
        return;
    };
    walk(&fs, 1, 0);
    let _ = fs.write("/d/new", b"after mount");
    let _ = fs.sync();
    let _ = fs.unmount();
});
