//! `kura bench nbdcopy`: what NBD block status buys a copy. A large sparse image (10 GiB with
//! 100 MiB of data by default) is served by kura's NBD server twice in the same process, read-only
//! (`file:IMAGE?ro=1`): once offering `base:allocation` (so `nbdcopy` asks
//! `NBD_CMD_BLOCK_STATUS` and skips the holes) and once without it
//! (`ServeOptions::block_status = false`, so `nbdcopy` reads every byte). Each round copies the
//! whole export to `null:` with the same `nbdcopy` command from each server in turn
//! (interleaved), and reports median [min–max] seconds, the ratio without/with (target ≥ 10x),
//! and the bytes each server sent. A second image of the same size with twice the data, copied
//! with block status in the same rounds, shows whether the time follows the data (ratio ≈ 2)
//! rather than the size. Every command line is in the JSON.

use crate::stats::{compare, interleave, quotient, Compared, Goal, Spread};
use anyhow::{ensure, Context};
use kura_nbd::{bind_loopback, serve, Export, ServeOptions, Server};
use serde::Serialize;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Bytes of each data region written into the sparse image.
const REGION: u64 = 1 << 20;

#[derive(Debug, Clone, clap::Args)]
pub struct NbdcopyArgs {
    /// Image size (default 10G; --quick: 1G).
    #[arg(long, value_parser = kura_engine::spec::parse_size)]
    pub size: Option<u64>,
    /// Bytes of data in the image, in 1 MiB regions spread evenly (default 100M; --quick: 16M).
    #[arg(long, value_parser = kura_engine::spec::parse_size)]
    pub data: Option<u64>,
    /// Interleaved rounds (default 3; --quick: 2).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Directory for the images (default: the system's temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A short run for smoke tests (1 GiB image, 16 MiB of data, 2 rounds).
    #[arg(long)]
    pub quick: bool,
    /// Write every figure as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One copy measured over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub name: String,
    pub image_bytes: u64,
    pub data_bytes: u64,
    pub block_status: bool,
    pub seconds: Spread,
    /// Read payload bytes the server sent for one copy (the last round's).
    pub bytes_sent: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub server: String,
    pub client: String,
    pub nbdcopy_version: String,
    pub dir: String,
    pub fs: String,
    pub rounds: usize,
    pub points: Vec<Point>,
    /// Seconds without block status / seconds with it, per round pair (target ≥ 10).
    pub speedup: Compared,
    /// Seconds with twice the data / seconds with the data, per round (≈ 2 when the time
    /// follows the data).
    pub double_data: Compared,
}

/// Writes a sparse image of `size` bytes with `data` bytes of non-zero data in 1 MiB regions
/// spread evenly (at least one region).
fn sparse_image(path: &Path, size: u64, data: u64) -> anyhow::Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)?;
    let regions = data.div_ceil(REGION).max(1);
    let stride = size / regions / REGION * REGION;
    ensure!(
        stride >= REGION,
        "{data} bytes of data do not fit in 1 MiB regions of a {size}-byte image"
    );
    let mut buf = vec![0u8; REGION as usize];
    for r in 0..regions {
        for (i, b) in buf.iter_mut().enumerate() {
            // Never zero, so no region could read as a hole.
            *b = (i as u64 ^ r).wrapping_mul(0x9e37_79b9) as u8 | 1;
        }
        f.write_all_at(&buf, r * stride)?;
    }
    f.sync_all()?;
    Ok(())
}

fn export_server(image: &Path, block_status: bool) -> anyhow::Result<Server> {
    let dev = kura_engine::open(&format!("file:{}?ro=1", image.display()))?;
    let opts = ServeOptions {
        block_status,
        ..ServeOptions::default()
    };
    Ok(serve(
        bind_loopback(0)?,
        vec![Export::new("img", dev).read_only(true)],
        opts,
    )?)
}

fn nbdcopy_args(url: &str) -> Vec<String> {
    vec![url.to_string(), "null:".into()]
}

/// One copy of the export to `null:`; returns (seconds, bytes the server sent).
fn copy(server: &Server) -> anyhow::Result<(f64, u64)> {
    let url = format!("nbd://127.0.0.1:{}/img", server.local_addr().port());
    let before = server.stats().bytes_out;
    let t = Instant::now();
    let st = Command::new("nbdcopy")
        .args(nbdcopy_args(&url))
        .stdout(Stdio::null())
        .status()
        .context("running nbdcopy (Debian libnbd-bin)")?;
    let secs = t.elapsed().as_secs_f64();
    ensure!(st.success(), "nbdcopy {url} null: failed");
    Ok((secs, server.stats().bytes_out - before))
}

pub fn run(args: &NbdcopyArgs) -> anyhow::Result<()> {
    let size = args
        .size
        .unwrap_or(if args.quick { 1 << 30 } else { 10 << 30 });
    let data = args
        .data
        .unwrap_or(if args.quick { 16 << 20 } else { 100 << 20 });
    let rounds = args.rounds.unwrap_or(if args.quick { 2 } else { 3 }).max(1);
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base)
        .with_context(|| format!("a scratch directory in {}", base.display()))?;
    let one = dir.path().join("sparse.img");
    let two = dir.path().join("sparse-2x.img");
    sparse_image(&one, size, data)?;
    sparse_image(&two, size, 2 * data)?;
    let with = export_server(&one, true)?;
    let without = export_server(&one, false)?;
    let with_two = export_server(&two, true)?;

    let servers = [&with, &without, &with_two];
    let names = ["block status", "no block status", "block status, 2x data"];
    // The bytes each server sent for its latest copy.
    let sent = std::cell::RefCell::new([0u64; 3]);
    let side = |i: usize| -> anyhow::Result<f64> {
        let (secs, bytes) = copy(servers[i])?;
        sent.borrow_mut()[i] = bytes;
        println!("  {:<24} {secs:8.3} s {bytes:>14} bytes read", names[i]);
        Ok(secs)
    };
    let (mut a, mut b, mut c) = (|_: usize| side(0), |_: usize| side(1), |_: usize| side(2));
    let samples = interleave(rounds, &mut [&mut a, &mut b, &mut c])?;
    let sent = sent.into_inner();
    drop((with, without, with_two));

    let speedup = compare(
        &samples[1],
        &samples[0],
        quotient,
        Some(Goal::AtLeast(10.0)),
    );
    let double_data = compare(&samples[2], &samples[0], quotient, None);
    let datas = [data, data, 2 * data];
    let points: Vec<Point> = (0..3)
        .map(|i| Point {
            name: names[i].into(),
            image_bytes: size,
            data_bytes: datas[i],
            block_status: i != 1,
            seconds: Spread::of(&samples[i]),
            bytes_sent: sent[i],
        })
        .collect();
    let report = Report {
        server: "in-process kura_nbd::serve of file:IMAGE?ro=1 (ServeOptions::default; block_status false for the peer)".into(),
        client: format!("nbdcopy {}", nbdcopy_args("nbd://127.0.0.1:PORT/img").join(" ")),
        nbdcopy_version: crate::stats::tool_version("nbdcopy", "--version"),
        dir: base.display().to_string(),
        fs: crate::stats::fs_name(&base),
        rounds,
        points,
        speedup,
        double_data,
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("JSON: {}", path.display());
    }
    Ok(())
}

fn print_report(r: &Report) {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    println!(
        "\nnbdcopy of a sparse image to null: ({} rounds, images on {} {}; {})",
        r.rounds, r.fs, r.dir, r.nbdcopy_version
    );
    println!(
        "{:<24} {:>9} {:>10} {:>24} {:>14}",
        "export", "image GiB", "data MiB", "seconds", "bytes read"
    );
    for p in &r.points {
        println!(
            "{:<24} {:>9.2} {:>10.0} {:>24} {:>14}",
            p.name,
            gib(p.image_bytes),
            p.data_bytes as f64 / f64::from(1u32 << 20),
            p.seconds.show(3),
            p.bytes_sent
        );
    }
    let verdict = r.speedup.verdict.map_or("", |v| v.word());
    println!(
        "without / with block status: {}x (target ≥ 10x: {verdict})",
        r.speedup.ratio.show(1)
    );
    println!(
        "2x data / 1x data with block status: {}x (≈ 2 when the time follows the data)",
        r.double_data.ratio.show(2)
    );
}
