//! Read-only mounts and fsck never write (issue 13 item 1, the AccelFS part): an image whose
//! journal holds committed transactions that were never checkpointed is mounted read-only, listed
//! and read in full — showing the replayed state, served from memory — and dropped; the device
//! saw no write and no flush and its bytes are unchanged. Every change is refused with
//! `FsError::ReadOnly`. fsck without repair leaves the image unchanged as well.

use kura_accelfs::testing::{mount_storage, recording_device};
use kura_accelfs::{fsck, FileSystem, FileType, FsError, MkfsOptions, MountOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::FaultDevice;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const BS: u32 = 4096;
const DEVICE_BYTES: u64 = 16 << 20;

fn content(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// An image whose last transactions are committed in the journal but not checkpointed (the
/// bytes as they were right after `sync`, before unmount would write them home), and what each
/// file holds in it.
fn image_needing_replay() -> (Vec<u8>, BTreeMap<String, Vec<u8>>) {
    let dev = MemDevice::new(DEVICE_BYTES, QueueOptions::default());
    let storage = dev.storage();
    let fs = FileSystem::format(
        Box::new(dev),
        MkfsOptions {
            block_size: BS,
            inodes: None,
        },
        MountOptions::default(),
    )
    .expect("format");
    let mut files = BTreeMap::new();
    fs.mkdir("/old").expect("mkdir");
    files.insert("/old/home".to_string(), content(1, 300_000));
    fs.write("/old/home", &files["/old/home"]).expect("write");
    fs.unmount().expect("unmount");

    let fs = mount_storage(&storage);
    fs.create_dir_all("/new/deeper").expect("mkdir");
    // Small synced data is journaled whole: its newest copy lives only in the log.
    files.insert("/new/small".to_string(), content(2, 5000));
    files.insert("/new/deeper/tiny".to_string(), b"in the log".to_vec());
    // Large data goes home (ordered) but its inode only reaches home at a checkpoint.
    files.insert("/new/large".to_string(), content(3, 200_000));
    for (path, data) in &files {
        if path.starts_with("/new") {
            fs.write(path, data).expect("write");
        }
    }
    fs.rename("/old/home", "/new/moved").expect("rename");
    let moved = files.remove("/old/home").expect("moved");
    files.insert("/new/moved".to_string(), moved);
    fs.sync().expect("sync");
    let image = storage.lock().expect("storage").clone();
    drop(fs);
    (image, files)
}

fn recording(image: &[u8]) -> (FaultDevice, kura_engine::fault::FaultControl, MemStorage) {
    let storage: MemStorage = Arc::new(Mutex::new(image.to_vec()));
    let (dev, control) = recording_device(&storage);
    (dev, control, storage)
}

fn all_files(fs: &FileSystem, dir: &str, out: &mut BTreeMap<String, Vec<u8>>) {
    for e in fs.read_dir(dir).expect("list") {
        let path = format!("{}/{}", dir.trim_end_matches('/'), e.name_lossy());
        match e.file_type {
            FileType::Directory => all_files(fs, &path, out),
            FileType::File => {
                out.insert(path.clone(), fs.read(&path).expect("read"));
            }
            // This test's images hold only files and directories.
            other => panic!("{path}: unexpected {other:?}"),
        }
    }
}

#[test]
fn a_read_only_mount_replays_in_memory_and_writes_nothing() {
    let (image, files) = image_needing_replay();
    let (dev, control, storage) = recording(&image);
    let fs = FileSystem::mount_read_only(Box::new(dev), MountOptions::default()).expect("mount");
    assert!(fs.is_read_only());
    assert!(
        fs.statfs().recovery.replayed > 0,
        "the image was meant to need replay"
    );
    let mut seen = BTreeMap::new();
    all_files(&fs, "/", &mut seen);
    assert_eq!(seen, files, "the replayed state, read in full");
    // The journaled small file through every read path: cached, streamed, positioned.
    let f = fs.open("/new/small").expect("open");
    let mut streamed = Vec::new();
    f.read_stream(0, u64::MAX, |b| streamed.extend_from_slice(b))
        .expect("stream");
    assert_eq!(streamed, files["/new/small"]);
    let mut part = vec![0u8; 100];
    f.read_exact_at(4000, &mut part).expect("read");
    assert_eq!(part, files["/new/small"][4000..4100]);
    assert_eq!(
        f.allocated_ranges().expect("ranges"),
        vec![0..files["/new/small"].len() as u64]
    );
    assert!(fs.sync().is_ok(), "sync has nothing to do");
    fs.unmount().expect("unmount");
    assert!(
        control.trace().is_empty(),
        "the device saw writes or flushes: {:?}",
        control.trace().len()
    );
    assert_eq!(
        *storage.lock().expect("storage"),
        image,
        "the image changed"
    );

    // Dropping the last handle without unmount writes nothing either.
    let (dev, control, storage) = recording(&image);
    let fs = FileSystem::mount_read_only(Box::new(dev), MountOptions::default()).expect("mount");
    all_files(&fs, "/", &mut BTreeMap::new());
    drop(fs);
    assert!(control.trace().is_empty());
    assert_eq!(*storage.lock().expect("storage"), image);

    // A read-write mount of the same bytes replays on the device and sees the same files.
    let storage: MemStorage = Arc::new(Mutex::new(image.clone()));
    let fs = mount_storage(&storage);
    let mut after = BTreeMap::new();
    all_files(&fs, "/", &mut after);
    assert_eq!(after, files);
    drop(fs);
    assert_ne!(
        *storage.lock().expect("storage"),
        image,
        "replay wrote home"
    );
}

#[test]
fn a_read_only_mount_refuses_every_change_with_a_typed_error() {
    let (image, files) = image_needing_replay();
    let (dev, control, storage) = recording(&image);
    let fs = FileSystem::mount_read_only(Box::new(dev), MountOptions::default()).expect("mount");
    let refused = |what: &str, r: Result<(), FsError>| match r {
        Err(e @ FsError::ReadOnly(_)) => {
            assert_eq!(e.errno(), libc_erofs(), "{what}");
            assert!(e.to_string().contains("mounted read-only"), "{what}: {e}");
        }
        other => panic!("{what}: {other:?}"),
    };
    refused("create", fs.create("/x").map(|_| ()));
    refused("write", fs.write("/new/small", b"changed"));
    refused("mkdir", fs.mkdir("/y"));
    refused("remove", fs.remove_file("/new/small"));
    refused("rmdir", fs.remove_dir("/new/deeper"));
    refused("rename", fs.rename("/new/small", "/new/renamed"));
    let small = fs.metadata("/new/small").expect("stat").ino;
    refused("write_ino", fs.write_ino(small, 0, b"x").map(|_| ()));
    refused("set_len_ino", fs.set_len_ino(small, 0));
    refused("set_attr", fs.set_attr(small, Some(0o600), None));
    refused(
        "create_in",
        fs.create_in(1, b"z", FileType::File, 0o644).map(|_| ()),
    );
    let mut f = fs
        .open_with(
            "/new/small",
            kura_accelfs::OpenOptions::new().read(true).write(true),
        )
        .expect("opening for writing is allowed; writing is not");
    refused("File::write_at", f.write_at(0, b"x").map(|_| ()));
    refused("File::append", f.append(b"x").map(|_| ()));
    refused("File::set_len", f.set_len(1));
    assert!(f.sync_all().is_ok() && f.sync_data().is_ok());
    assert_eq!(fs.read("/new/small").expect("read"), files["/new/small"]);
    drop((f, fs));
    assert!(control.trace().is_empty());
    assert_eq!(*storage.lock().expect("storage"), image);
}

fn libc_erofs() -> i32 {
    30 // EROFS on Linux
}

#[test]
fn fsck_without_repair_writes_nothing() {
    let (image, _) = image_needing_replay();
    let (dev, control, storage) = recording(&image);
    let report = fsck(Box::new(dev)).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
    assert!(
        report.notes.iter().any(|n| n.contains("mount will replay")),
        "{:?}",
        report.notes
    );
    assert!(control.trace().is_empty());
    assert_eq!(*storage.lock().expect("storage"), image);
}

#[test]
fn a_read_only_mount_reads_through_a_damaged_primary_superblock_without_restoring_it() {
    let (mut image, files) = image_needing_replay();
    image[..BS as usize].fill(0);
    let (dev, control, storage) = recording(&image);
    let fs = FileSystem::mount_read_only(Box::new(dev), MountOptions::default()).expect("mount");
    let mut seen = BTreeMap::new();
    all_files(&fs, "/", &mut seen);
    assert_eq!(seen, files);
    drop(fs);
    assert!(control.trace().is_empty());
    assert_eq!(*storage.lock().expect("storage"), image);
    let rw = FileSystem::mount(
        Box::new(MemDevice::with_storage(storage, QueueOptions::default())),
        MountOptions::default(),
    );
    assert!(
        rw.is_err(),
        "a read-write mount still asks for fsck --repair first"
    );
}
