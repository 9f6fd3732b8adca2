//! Streaming from AccelFS hands the parser the device's own buffers (1 MiB each, several per
//! segment): the bytes must be exactly the file's, records that straddle buffers and segments
//! must parse as from a host file, and a hole must read as zeroes.

use kura_accelfs::{FileSystem, MkfsOptions, MountOptions};
use kura_genome::fastq::FastqReader;
use kura_genome::store::Store;
use std::io::Read;

fn accelfs() -> FileSystem {
    let dev = kura_engine::open("mem:96M").expect("memory device");
    FileSystem::format(dev, MkfsOptions::default(), MountOptions::default()).expect("mkfs")
}

/// Reads of varying length, so record boundaries fall anywhere in the 1 MiB buffers.
fn fastq(bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes + 1024);
    let mut i = 0usize;
    while out.len() < bytes {
        let len = 30 + (i * 7919) % 271;
        out.extend_from_slice(format!("@r{i} x\n").as_bytes());
        out.extend((0..len).map(|j| b"ACGTN"[(i + j * 3) % 5]));
        out.extend_from_slice(b"\n+\n");
        out.extend((0..len).map(|j| b'!' + ((i + j) % 40) as u8));
        out.push(b'\n');
        i += 1;
    }
    out
}

#[test]
fn streamed_bytes_and_records_match_the_file_across_buffers_and_segments() {
    let fs = accelfs();
    let data = fastq(19 << 20);
    let f = fs.create("/reads.fq").unwrap();
    f.write_at(0, &data).unwrap();
    f.sync_all().unwrap();
    let store = Store::AccelFs(fs.clone());

    let mut streamed = Vec::new();
    store
        .open_stream("reads.fq")
        .unwrap()
        .read_to_end(&mut streamed)
        .unwrap();
    assert!(streamed == data, "streamed bytes differ from the file");

    let from_fs: Vec<_> = FastqReader::new(store.open_stream("reads.fq").unwrap(), "fs")
        .collect::<Result<_, _>>()
        .expect("parses from AccelFS");
    let from_memory: Vec<_> = FastqReader::new(&data[..], "memory")
        .collect::<Result<_, _>>()
        .expect("parses from memory");
    assert_eq!(from_fs.len(), from_memory.len());
    assert!(from_fs == from_memory, "records differ");
}

#[test]
fn a_hole_streams_as_zeroes() {
    let fs = accelfs();
    let f = fs.create("/sparse").unwrap();
    f.write_at(0, &[7u8; 5000]).unwrap();
    f.write_at(9 << 20, &[9u8; 3000]).unwrap();
    f.sync_all().unwrap();
    let mut streamed = Vec::new();
    Store::AccelFs(fs.clone())
        .open_stream("sparse")
        .unwrap()
        .read_to_end(&mut streamed)
        .unwrap();
    assert_eq!(streamed.len(), (9 << 20) + 3000);
    assert!(streamed[..5000].iter().all(|&b| b == 7));
    assert!(streamed[5000..9 << 20].iter().all(|&b| b == 0));
    assert!(streamed[9 << 20..].iter().all(|&b| b == 9));
}
