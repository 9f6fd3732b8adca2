//! Server and client together over loopback: random I/O against a flat `Vec<u8>` model, through
//! the kura client (block I/O, pipelined) and through raw requests (byte-granular, unaligned),
//! plus exports listing, read-only exports, durability of FUA and flush, and device errors.

mod common;

use common::{mem_disk, pattern, start, Raw};
use kura_engine::fault::{FaultDevice, FaultPlan};
use kura_engine::{BlockDevice, BlockingIo, Completion, DeviceError, IoBuf, Opcode, Request};
use kura_nbd::client::{connect, connect_with, export_info, list_exports, ConnectOptions};
use kura_nbd::protocol::{cmd_flags, tx_flags, Command, ErrorCode, Rep};
use kura_nbd::{ClientError, Export};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

#[test]
fn random_pipelined_io_through_the_client_matches_a_model() {
    let size = 8 * MIB;
    let (dev, storage) = mem_disk(size);
    let server = start(vec![Export::new("disk", dev)]);
    let mut client = connect(server.local_addr(), "disk").unwrap();
    let geo = client.geometry();
    assert_eq!(geo.capacity_bytes(), size);
    assert_eq!(geo.block_size, 4096);
    let bs = geo.block_size as usize;
    let blocks = geo.num_blocks;
    let mut model = vec![0u8; size as usize];
    let mut rng = SmallRng::seed_from_u64(6);

    for round in 0..60 {
        // A batch of up to 24 commands in flight at once; mutations never overlap anything else
        // in the same batch (NBD, like NVMe, orders nothing in flight).
        let mut batch: Vec<(Opcode, u64, u64)> = Vec::new();
        for _ in 0..rng.gen_range(1..=24) {
            let op = match rng.gen_range(0..10) {
                0..=3 => Opcode::Read,
                4..=7 => Opcode::Write,
                8 => Opcode::WriteZeroes,
                _ => Opcode::Discard,
            };
            let n = rng.gen_range(1..=64u64);
            let lba = rng.gen_range(0..blocks - n);
            let overlaps = batch.iter().any(|&(o, l, m)| {
                (o != Opcode::Read || op != Opcode::Read) && lba < l + m && l < lba + n
            });
            if !overlaps {
                batch.push((op, lba, n));
            }
        }
        let mut expect = Vec::new();
        for (i, &(op, lba, n)) in batch.iter().enumerate() {
            let range = lba as usize * bs..(lba + n) as usize * bs;
            let req = match op {
                Opcode::Read => Request::read(i as u64, lba, n, IoBuf::zeroed(range.len())),
                Opcode::Write => {
                    let data = pattern(range.len(), (round * 100 + i) as u64);
                    model[range.clone()].copy_from_slice(&data);
                    Request::write(i as u64, lba, n, IoBuf::from_slice(&data))
                }
                _ => {
                    model[range.clone()].fill(0);
                    if op == Opcode::Discard {
                        Request::discard(i as u64, lba, n)
                    } else {
                        Request::write_zeroes(i as u64, lba, n)
                    }
                }
            };
            client.submit(req).unwrap();
            expect.push(range);
        }
        if round % 7 == 0 {
            client.submit(Request::flush(999)).unwrap();
        }
        let mut done: Vec<Completion> = Vec::new();
        while client.in_flight() > 0 {
            client.poll(&mut done, 1).unwrap();
        }
        for c in done {
            c.status.as_ref().unwrap();
            if c.op == Opcode::Read {
                let range = expect[c.tag as usize].clone();
                let buf = c.buf.unwrap();
                assert!(
                    buf[..range.len()] == model[range.clone()],
                    "round {round}: read {range:?} differs"
                );
            }
        }
    }
    // Everything landed on the device behind the server.
    client.close().unwrap();
    let exports = server.stop();
    assert_eq!(exports.len(), 1);
    assert!(*storage.lock().unwrap() == model);
}

#[test]
fn blocking_io_and_large_requests_split_at_the_payload_limit() {
    let size = 80 * MIB;
    let (dev, _storage) = mem_disk(size);
    let server = start(vec![Export::new("big", dev)]);
    let mut client = connect(server.local_addr(), "big").unwrap();
    assert_eq!(client.geometry().max_transfer, 32 << 20);
    // One 40 MiB command becomes two NBD requests and one completion.
    let data = pattern(40 << 20, 3);
    let lba = 100;
    client
        .run(Request::write(
            1,
            lba,
            (data.len() / 4096) as u64,
            IoBuf::from_slice(&data),
        ))
        .unwrap()
        .status
        .unwrap();
    let done = client
        .run(Request::read(
            2,
            lba,
            (data.len() / 4096) as u64,
            IoBuf::zeroed(data.len()),
        ))
        .unwrap();
    done.status.unwrap();
    assert!(done.buf.unwrap()[..] == data[..]);
    // The blocking helpers work as on any device.
    let mut small = vec![0u8; 8192];
    client.write_blocks(5, &pattern(8192, 4)).unwrap();
    client.read_blocks(5, &mut small).unwrap();
    assert_eq!(small, pattern(8192, 4));
    client.zero_blocks(5, 1).unwrap();
    client.read_blocks(5, &mut small).unwrap();
    assert!(small[..4096].iter().all(|&b| b == 0) && small[4096..] == pattern(8192, 4)[4096..]);
    client.flush_all().unwrap();
    // Out of range is refused by the client before it reaches the wire.
    let blocks = client.geometry().num_blocks;
    let r = client.submit(Request::read(3, blocks, 1, IoBuf::zeroed(4096)));
    assert!(matches!(
        r.unwrap_err().error,
        DeviceError::OutOfRange { .. }
    ));
    drop(client);
    let stats = server.stats();
    assert_eq!(stats.error_replies, 0, "{stats:?}");
}

#[test]
fn unaligned_byte_io_matches_a_model() {
    let size = 2 * MIB;
    let (dev, storage) = mem_disk(size);
    let server = start(vec![Export::new("bytes", dev)]);
    let (mut raw, export_size) = Raw::open(server.local_addr(), "bytes");
    assert_eq!(export_size, size);
    let mut model = pattern(size as usize, 1);
    raw.write_at(0, &model, 0);
    let mut rng = SmallRng::seed_from_u64(9);
    for i in 0..400u64 {
        let len = rng.gen_range(1..=20_000u32);
        let off = rng.gen_range(0..size - u64::from(len));
        let r = off as usize..off as usize + len as usize;
        match rng.gen_range(0..6) {
            0 | 1 => assert!(
                raw.read_at(off, len) == model[r],
                "op {i}: read {off}+{len}"
            ),
            2 | 3 => {
                let data = pattern(len as usize, i + 100);
                let fua = if i % 3 == 0 { cmd_flags::FUA } else { 0 };
                raw.write_at(off, &data, fua);
                model[r].copy_from_slice(&data);
            }
            4 => {
                assert_eq!(raw.simple(Command::WriteZeroes, 0, off, len), 0);
                model[r].fill(0);
            }
            _ => {
                // Trim discards only the whole blocks it covers; they read back as zero here.
                assert_eq!(raw.simple(Command::Trim, 0, off, len), 0);
                let first = off.div_ceil(4096) as usize * 4096;
                let end = (off + u64::from(len)) as usize / 4096 * 4096;
                if end > first {
                    model[first..end].fill(0);
                }
            }
        }
    }
    assert_eq!(raw.simple(Command::Flush, 0, 0, 0), 0);
    // Zero-length requests inside the export do nothing and succeed.
    assert_eq!(raw.simple(Command::Read, 0, 4096, 0), 0);
    assert_eq!(raw.simple(Command::WriteZeroes, 0, size, 0), 0);
    raw.request(Command::Disc, 0, 0, 0, 0);
    assert!(raw.closed());
    drop(server.stop());
    assert!(*storage.lock().unwrap() == model);
}

#[test]
fn exports_are_listed_described_and_chosen_by_name() {
    let (a, _) = mem_disk(4 * MIB);
    let (b, _) = mem_disk(MIB);
    let server = start(vec![
        Export::new("alpha", a).description("first disk"),
        Export::new("beta", b).read_only(true),
    ]);
    let addr = server.local_addr();
    let list = list_exports(addr).unwrap();
    let names: Vec<(&str, &str)> = list
        .iter()
        .map(|e| (e.name.as_str(), e.description.as_str()))
        .collect();
    assert_eq!(names, [("alpha", "first disk"), ("beta", "")]);

    let alpha = export_info(addr, "alpha").unwrap();
    assert_eq!(alpha.size, 4 * MIB);
    assert_eq!(alpha.description.as_deref(), Some("first disk"));
    assert!(!alpha.read_only());
    let want = tx_flags::HAS_FLAGS
        | tx_flags::SEND_FLUSH
        | tx_flags::SEND_FUA
        | tx_flags::SEND_TRIM
        | tx_flags::SEND_WRITE_ZEROES
        | tx_flags::SEND_CACHE
        | tx_flags::CAN_MULTI_CONN;
    assert_eq!(alpha.flags, want);
    let sizes = alpha.block_sizes.unwrap();
    assert_eq!(
        (sizes.min, sizes.preferred, sizes.max_payload),
        (1, 4096, 32 << 20)
    );
    let beta = export_info(addr, "beta").unwrap();
    assert!(beta.read_only() && beta.size == MIB);
    // The empty name is the default export: the first one.
    assert_eq!(export_info(addr, "").unwrap().size, 4 * MIB);
    match export_info(addr, "gamma") {
        Err(ClientError::Refused { reply, message, .. }) => {
            assert_eq!(reply, Rep::ErrUnknown);
            assert!(message.contains("alpha"), "{message}");
        }
        other => panic!("unknown export: {other:?}"),
    }
    assert!(matches!(
        connect(addr, "gamma"),
        Err(ClientError::Refused {
            reply: Rep::ErrUnknown,
            ..
        })
    ));
    let c = connect_with(
        addr,
        "alpha",
        ConnectOptions {
            block_size: Some(512),
            queue_depth: 4,
            ..ConnectOptions::default()
        },
    )
    .unwrap();
    assert_eq!(c.geometry().block_size, 512);
    assert_eq!(c.geometry().num_blocks, 8192);
    assert_eq!(c.describe(), format!("nbd://{addr}/alpha"));
}

#[test]
fn read_only_exports_refuse_mutations() {
    let (dev, storage) = mem_disk(MIB);
    storage.lock().unwrap()[..4096].copy_from_slice(&pattern(4096, 5));
    let server = start(vec![Export::new("ro", dev).read_only(true)]);
    let mut client = connect(server.local_addr(), "ro").unwrap();
    let mut block = vec![0u8; 4096];
    client.read_blocks(0, &mut block).unwrap();
    assert_eq!(block, pattern(4096, 5));
    let refused = client
        .submit(Request::write(1, 0, 1, IoBuf::zeroed(4096)))
        .unwrap_err();
    assert_eq!(refused.error.errno(), libc::EPERM);
    assert!(client.submit(Request::discard(1, 0, 1)).is_err());
    client.flush_all().unwrap();

    // A raw client that writes anyway gets EPERM, its payload is skipped, and it carries on.
    let (mut raw, _) = Raw::open(server.local_addr(), "ro");
    raw.request(Command::Write, 0, 1, 0, 4096);
    raw.send(&[0xff; 4096]).unwrap();
    let r = raw.reply().unwrap();
    assert_eq!((r.error, r.cookie), (ErrorCode::Perm.code(), 1));
    assert_eq!(
        raw.simple(Command::Trim, 0, 0, 4096),
        ErrorCode::Perm.code()
    );
    assert_eq!(
        raw.simple(Command::WriteZeroes, 0, 0, 4096),
        ErrorCode::Perm.code()
    );
    assert_eq!(raw.read_at(0, 4096), pattern(4096, 5));
    assert_eq!(storage.lock().unwrap()[..4096], pattern(4096, 5)[..]);
}

#[test]
fn fua_and_flush_are_durable_and_device_errors_become_eio() {
    let (inner, storage) = mem_disk(MIB);
    let plan = FaultPlan {
        keep_probability: 0.0,
        read_eio: Some(3),
        ..FaultPlan::default()
    };
    let fault = FaultDevice::new(inner, plan);
    let control = fault.control();
    let server = start(vec![Export::new("vol", Box::new(fault))]);
    let (mut raw, _) = Raw::open(server.local_addr(), "vol");
    raw.write_at(0, &[1; 4096], cmd_flags::FUA); // durable at once
    raw.write_at(4096, &[2; 4096], 0); // volatile until the flush
    assert_eq!(raw.simple(Command::Flush, 0, 0, 0), 0);
    raw.write_at(8192, &[3; 100], cmd_flags::FUA); // unaligned FUA: read-modify-write + flush
    raw.write_at(16384, &[4; 4096], 0); // never flushed: lost at the cut
                                        // Device read 1 was the read-modify-write of block 2, read 2 is this one; read 3 fails.
    let _ = raw.read_at(0, 4096);
    raw.request(Command::Read, 0, 77, 0, 4096);
    let r = raw.reply().unwrap();
    assert_eq!((r.error, r.cookie), (ErrorCode::Io.code(), 77));
    // The connection survives a device error.
    assert_eq!(raw.read_at(4096, 4096), vec![2; 4096]);
    control.power_cut();
    drop(raw);
    drop(server.stop());
    let disk = storage.lock().unwrap();
    assert!(disk[..4096].iter().all(|&b| b == 1));
    assert!(disk[4096..8192].iter().all(|&b| b == 2));
    assert!(disk[8192..8292].iter().all(|&b| b == 3));
    assert!(
        disk[16384..20480].iter().all(|&b| b == 0),
        "unflushed write survived"
    );
}
