//! Structured replies and `NBD_CMD_BLOCK_STATUS` (`base:allocation`) on sparse `file:` images:
//! the raw protocol (chunk layouts, extents that match the image, hostile requests answered with
//! error chunks on a connection that lives on), and real clients (`nbdinfo --map` shows the
//! extents; `nbdcopy` and `qemu-img convert` copy a sparse export byte for byte while reading
//! only its data, which the server's byte counter proves).

mod common;

use common::{have_tools, run_bounded, run_ok, start, start_with, Raw};
use kura_nbd::protocol::{
    self, chunk_flags, chunk_type, cmd_flags, state_flags, BlockStatusExtent, ChunkHeader, Command,
    ErrorCode, MetaRequest, Opt, Rep, BASE_ALLOCATION, BASE_ALLOCATION_ID, CHUNK_HEADER_LEN,
};
use kura_nbd::{Export, ServeOptions, Server};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command as Cmd;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// A sparse image of `size` bytes with `regions` (offset, length) of non-zero data; returns the
/// data written.
fn sparse_image(path: &Path, size: u64, regions: &[(u64, u64)]) -> Vec<u8> {
    let f = std::fs::File::create(path).expect("create image");
    f.set_len(size).expect("size image");
    let mut want = vec![0u8; size as usize];
    for (i, &(off, len)) in regions.iter().enumerate() {
        let data = common::pattern(len as usize, i as u64 + 1);
        std::os::unix::fs::FileExt::write_all_at(&f, &data, off).expect("write image");
        want[off as usize..(off + len) as usize].copy_from_slice(&data);
    }
    f.sync_all().expect("sync image");
    want
}

fn file_export(path: &Path) -> Export {
    let dev = kura_engine::open(&format!("file:{}", path.display())).expect("open image");
    Export::new("disk", dev)
}

/// One structured reply chunk: its header and payload.
fn chunk(r: &mut Raw) -> (ChunkHeader, Vec<u8>) {
    let mut h = [0u8; CHUNK_HEADER_LEN];
    r.s.read_exact(&mut h).expect("chunk header");
    let h = ChunkHeader::decode(&h).expect("a structured reply chunk");
    let mut payload = vec![0u8; h.length as usize];
    r.s.read_exact(&mut payload).expect("chunk payload");
    (h, payload)
}

/// The error value of an ERROR chunk.
fn error_of(h: &ChunkHeader, payload: &[u8]) -> u32 {
    assert_eq!(h.kind, chunk_type::ERROR, "an error chunk");
    assert_eq!(h.flags & chunk_flags::DONE, chunk_flags::DONE);
    u32::from_be_bytes(payload[..4].try_into().expect("block status test"))
}

fn block_status(
    r: &mut Raw,
    flags: u16,
    offset: u64,
    length: u32,
) -> Result<Vec<BlockStatusExtent>, u32> {
    r.request(Command::BlockStatus, flags, 77, offset, length);
    let (h, payload) = chunk(r);
    assert_eq!(h.cookie, 77);
    if h.kind == chunk_type::ERROR {
        return Err(error_of(&h, &payload));
    }
    assert_eq!(
        (h.kind, h.flags),
        (chunk_type::BLOCK_STATUS, chunk_flags::DONE)
    );
    let (id, extents) = protocol::decode_block_status(&payload).expect("block status payload");
    assert_eq!(id, BASE_ALLOCATION_ID);
    Ok(extents)
}

/// Connects with structured replies and, when `contexts` is given, sets those meta contexts;
/// returns whether `base:allocation` was selected.
fn structured(server: &Server, contexts: Option<&[&str]>) -> (Raw, bool) {
    let mut r = Raw::connect(server.local_addr());
    r.greet();
    r.option(Opt::StructuredReply, &[]);
    assert_eq!(
        r.option_reply().expect("block status test").0.reply,
        Rep::Ack
    );
    let mut selected = false;
    if let Some(queries) = contexts {
        let req = MetaRequest {
            name: "disk".into(),
            queries: queries.iter().map(|q| q.to_string()).collect(),
        };
        r.option(Opt::SetMetaContext, &req.encode());
        loop {
            let (h, data) = r.option_reply().expect("block status test");
            match h.reply {
                Rep::MetaContext => {
                    let ctx = protocol::decode_meta_context(&data).expect("block status test");
                    assert_eq!(ctx, (BASE_ALLOCATION_ID, BASE_ALLOCATION.to_string()));
                    selected = true;
                }
                Rep::Ack => break,
                other => panic!("SET_META_CONTEXT: {other}"),
            }
        }
    }
    r.go("disk");
    (r, selected)
}

#[test]
fn block_status_reports_a_sparse_image_and_hostile_requests_get_error_chunks() {
    let dir = tempfile::tempdir().expect("block status test");
    let img = dir.path().join("sparse.img");
    let size = 8 * MIB;
    let regions = [(MIB, 64 << 10), (5 * MIB, 4096)];
    let want = sparse_image(&img, size, &regions);
    let server = start(vec![file_export(&img)]);
    let (mut r, selected) = structured(&server, Some(&["base:allocation"]));
    assert!(selected);

    // The extents cover the export, mark every data region as data, and every hole reads as
    // zeroes through a structured read.
    let extents = block_status(&mut r, 0, 0, size as u32).expect("block status test");
    assert_eq!(
        extents.iter().map(|e| u64::from(e.length)).sum::<u64>(),
        size
    );
    let mut at = 0u64;
    let mut data = 0u64;
    for e in &extents {
        let range = at..at + u64::from(e.length);
        match e.flags {
            0 => data += u64::from(e.length),
            f if f == state_flags::HOLE | state_flags::ZERO => {
                for &(off, len) in &regions {
                    assert!(range.end <= off || range.start >= off + len, "{extents:?}");
                }
                assert!(want[range.start as usize..range.end as usize]
                    .iter()
                    .all(|&b| b == 0));
            }
            other => panic!("flags {other:#x}"),
        }
        at = range.end;
    }
    assert!(
        data < MIB,
        "{data} bytes of data reported for 68 KiB: {extents:?}"
    );
    assert!(extents.len() >= 4, "{extents:?}");

    // A structured read: one OFFSET_DATA chunk with the offset, then the data.
    r.request(Command::Read, 0, 5, MIB - 100, 300);
    let (h, payload) = chunk(&mut r);
    assert_eq!(
        (h.kind, h.flags, h.cookie),
        (chunk_type::OFFSET_DATA, chunk_flags::DONE, 5)
    );
    assert_eq!(&payload[..8], &(MIB - 100).to_be_bytes());
    assert_eq!(
        &payload[8..],
        &want[(MIB - 100) as usize..(MIB + 200) as usize]
    );
    // Commands without data end with a NONE chunk; a zero-length read too.
    r.request(Command::Read, 0, 6, 0, 0);
    let (h, _) = chunk(&mut r);
    assert_eq!((h.kind, h.cookie), (chunk_type::NONE, 6));
    r.request(Command::Cache, 0, 7, 0, 4096);
    assert_eq!(chunk(&mut r).0.kind, chunk_type::NONE);

    // REQ_ONE: one extent; an unaligned range is clipped to the bytes asked about.
    let one = block_status(&mut r, cmd_flags::REQ_ONE, 0, size as u32).expect("block status test");
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].flags, state_flags::HOLE | state_flags::ZERO);
    let sub = block_status(&mut r, 0, MIB + 10, 100).expect("block status test");
    assert_eq!(
        sub,
        [BlockStatusExtent {
            length: 100,
            flags: 0
        }]
    );

    // Hostile requests: each an EINVAL error chunk, and the connection lives on.
    let inval = ErrorCode::Inval.code();
    for (flags, offset, length) in [
        (0, 0, 0),
        (0, size, 1),
        (0, size - 1, 2),
        (0, u64::MAX, 1),
        (0, u64::MAX - 10, u32::MAX),
        (cmd_flags::DF, 0, 4096),
        (0x8000, 0, 4096),
    ] {
        assert_eq!(
            block_status(&mut r, flags, offset, length),
            Err(inval),
            "{flags:#x} {offset} {length}"
        );
    }
    // Writes are reflected: a write into a hole turns it into data.
    let mut write = Vec::new();
    write.extend_from_slice(
        &protocol::RequestHeader {
            flags: cmd_flags::FUA,
            command: Command::Write,
            cookie: 8,
            offset: 3 * MIB,
            length: 4096,
        }
        .encode(),
    );
    write.extend_from_slice(&[0xab; 4096]);
    r.send(&write).expect("block status test");
    assert_eq!(chunk(&mut r).0.kind, chunk_type::NONE);
    let now = block_status(&mut r, 0, 3 * MIB, 4096).expect("block status test");
    assert_eq!(
        now,
        [BlockStatusExtent {
            length: 4096,
            flags: 0
        }]
    );

    // Without base:allocation selected (unknown contexts only), block status is EINVAL.
    let (mut other, selected) = structured(&server, Some(&["qemu:dirty-bitmap:x", "base:"]));
    assert!(!selected);
    assert_eq!(block_status(&mut other, 0, 0, 4096), Err(inval));
    // A read past the end gets an error chunk too.
    other.request(Command::Read, 0, 9, size, 1);
    let (h, payload) = chunk(&mut other);
    assert_eq!(error_of(&h, &payload), inval);
    // Without structured replies: simple replies, as before.
    let (mut plain, _) = Raw::open(server.local_addr(), "disk");
    assert_eq!(
        plain.read_at(MIB, 16),
        want[MIB as usize..MIB as usize + 16]
    );
    assert_eq!(plain.simple(Command::BlockStatus, 0, 0, 4096), inval);
    drop((r, other, plain));
    let stats = server.stats();
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
}

/// `nbdinfo --map` shows the image's extents; `nbdcopy` and `qemu-img convert` copy it byte for
/// byte, reading little more than its data (the server counts the read bytes it sends), and
/// write sparse copies. With block status off, the same copy reads every byte.
#[test]
fn real_clients_see_the_extents_and_copy_only_the_data() {
    let test = "real_clients_see_the_extents_and_copy_only_the_data";
    if !have_tools(test, &["nbdinfo", "nbdcopy", "qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("block status test");
    let img = dir.path().join("sparse.img");
    let size = 64 * MIB;
    let regions = [(4 * MIB, MIB), (40 * MIB + 4096, 8192), (63 * MIB, MIB)];
    let data: u64 = regions.iter().map(|r| r.1).sum();
    let want = sparse_image(&img, size, &regions);
    let server = start(vec![file_export(&img)]);
    let url = format!("nbd://127.0.0.1:{}/disk", server.local_addr().port());

    let map = run_ok(Cmd::new("nbdinfo").args(["--map", &url]));
    let map = String::from_utf8_lossy(&map.stdout).into_owned();
    let mut covered = 0;
    let mut mapped_data = Vec::new();
    for line in map.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (off, len, kind): (u64, u64, u32) = (
            f[0].parse().expect("block status test"),
            f[1].parse().expect("block status test"),
            f[2].parse().expect("block status test"),
        );
        assert_eq!(off, covered, "{map}");
        covered += len;
        match kind {
            0 => mapped_data.push((off, len)),
            3 => assert!(want[off as usize..(off + len) as usize]
                .iter()
                .all(|&b| b == 0)),
            _ => panic!("type {kind}: {map}"),
        }
    }
    assert_eq!(covered, size, "{map}");
    for &(off, len) in &regions {
        assert!(
            mapped_data
                .iter()
                .any(|&(o, l)| o <= off && off + len <= o + l),
            "{off}+{len} not data in {map}"
        );
    }
    assert!(map.contains("hole,zero"), "{map}");

    let sent = |s: &Server| s.stats().bytes_out;
    let before = sent(&server);
    let copy = dir.path().join("nbdcopy.img");
    run_ok(Cmd::new("nbdcopy").args([url.as_str(), copy.to_str().expect("block status test")]));
    let nbdcopy_read = sent(&server) - before;
    let before = sent(&server);
    let converted = dir.path().join("qemu.img");
    run_ok(Cmd::new("qemu-img").args([
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        &url,
        converted.to_str().expect("block status test"),
    ]));
    let qemu_read = sent(&server) - before;
    for (path, read) in [(&copy, nbdcopy_read), (&converted, qemu_read)] {
        let got = std::fs::read(path).expect("block status test");
        assert!(got == want, "{} differs", path.display());
        assert!(
            read <= data + 2 * MIB,
            "{}: {read} bytes read for {data} of data",
            path.display()
        );
        // Sparse on disk (st_blocks counts 512-byte units).
        let on_disk = std::fs::metadata(path).expect("block status test").blocks() * 512;
        assert!(
            on_disk < size / 2,
            "{}: {on_disk} bytes allocated",
            path.display()
        );
    }
    drop(server);

    let off = start_with(
        vec![file_export(&img)],
        ServeOptions {
            block_status: false,
            ..ServeOptions::default()
        },
    );
    let url = format!("nbd://127.0.0.1:{}/disk", off.local_addr().port());
    let refused = run_bounded(
        Cmd::new("nbdinfo").args(["--map", &url]),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("base:allocation"),
        "{err}"
    );
    let copy = dir.path().join("full.img");
    run_ok(Cmd::new("nbdcopy").args([url.as_str(), copy.to_str().expect("block status test")]));
    assert!(std::fs::read(&copy).expect("block status test") == want);
    assert_eq!(sent(&off), size, "without block status every byte is read");
}
