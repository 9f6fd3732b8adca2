//! The snapshot drive's head against pass-through: 4 KiB random reads and writes at queue depth
//! 32 on one io_uring image, alternating rounds, best and median of five; then random writes
//! right after a snapshot, which copy 64 KiB chunks on first touch.
//!
//! `cargo run --release -p kura-vdrive --example snapshot_overhead -- IMAGE [SECONDS]`
//! creates IMAGE (256 MiB, filled so no read hits a hole), formats it with 96 MiB versions,
//! fills the head, and measures pass-through over the image's first 96 MiB against the head
//! over all of its 96 MiB.

use kura_engine::{BlockDevice, BlockingIo, IoBuf, Request};
use kura_vdrive::snapshot::FormatOptions;
use kura_vdrive::SnapshotVolume;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::error::Error;
use std::time::Instant;

const QD: usize = 32;
const ROUNDS: usize = 5;
const SPAN_BLOCKS: u64 = (96 << 20) / 4096;

/// IOPS of 4 KiB random reads or writes at depth [`QD`] over the first [`SPAN_BLOCKS`] blocks.
fn iops(
    dev: &mut dyn BlockDevice,
    write: bool,
    secs: f64,
    seed: u64,
) -> Result<f64, Box<dyn Error>> {
    let blocks = dev.geometry().num_blocks.min(SPAN_BLOCKS);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut request = |buf: IoBuf| {
        let lba = rng.gen_range(0..blocks);
        if write {
            Request::write(lba, lba, 1, buf)
        } else {
            Request::read(lba, lba, 1, buf)
        }
    };
    let start = Instant::now();
    for _ in 0..QD {
        dev.submit(request(IoBuf::zeroed(4096)))
            .map_err(|r| r.error)?;
    }
    let (mut done, mut n) = (Vec::new(), 0u64);
    while dev.in_flight() > 0 {
        dev.poll(&mut done, 1)?;
        let more = start.elapsed().as_secs_f64() < secs;
        for c in done.drain(..) {
            c.status?;
            n += 1;
            if let (true, Some(buf)) = (more, c.buf) {
                dev.submit(request(buf)).map_err(|r| r.error)?;
            }
        }
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: snapshot_overhead IMAGE [SECONDS]")?;
    let secs: f64 = args.next().map_or(Ok(2.0), |s| s.parse())?;
    let spec = format!("uring:{path}");
    let mut whole = kura_engine::open(&format!("{spec}?size=256M"))?;
    let fill = vec![0x33u8; 1 << 20];
    for i in 0..256u64 {
        whole.write_blocks(i * 256, &fill)?;
    }
    whole.flush_all()?;
    drop(whole);
    let opts = FormatOptions {
        virtual_bytes: Some(96 << 20),
        ..FormatOptions::default()
    };
    let vol = SnapshotVolume::format(kura_engine::open(&spec)?, opts)?;
    let mut head = vol.head()?;
    for i in 0..96u64 {
        head.write_blocks(i * 256, &fill)?;
    }
    head.flush_all()?;
    drop(head);
    let mut seen: [[Vec<f64>; 2]; 2] = Default::default();
    for round in 0..ROUNDS {
        for (k, write) in [false, true].into_iter().enumerate() {
            let mut pass = kura_engine::open(&spec)?;
            let p = iops(&mut *pass, write, secs, round as u64)?;
            drop(pass);
            let mut head = vol.head()?;
            let s = iops(&mut head, write, secs, round as u64)?;
            head.flush_all()?;
            println!(
                "round {round} {}: pass-through {p:.0} IOPS, snapshot head {s:.0} IOPS",
                ["randread", "randwrite"][k]
            );
            seen[k][0].push(p);
            seen[k][1].push(s);
        }
    }
    for (k, name) in ["randread", "randwrite"].into_iter().enumerate() {
        let [mut p, mut s] = seen[k].clone();
        p.sort_by(f64::total_cmp);
        s.sort_by(f64::total_cmp);
        let (bp, bs) = (p[ROUNDS - 1], s[ROUNDS - 1]);
        let (mp, ms) = (p[ROUNDS / 2], s[ROUNDS / 2]);
        println!(
            "4K {name} QD{QD}: best pass-through {bp:.0} / head {bs:.0} IOPS (overhead {:.1}%), median {mp:.0} / {ms:.0} (overhead {:.1}%)",
            100.0 * (1.0 - bs / bp),
            100.0 * (1.0 - ms / mp)
        );
    }
    vol.take_snapshot("before")?;
    let mut head = vol.head()?;
    let s = iops(&mut head, true, secs, 99)?;
    println!(
        "4K randwrite QD{QD} right after a snapshot (first touch copies a 64K chunk): {s:.0} IOPS"
    );
    Ok(())
}
