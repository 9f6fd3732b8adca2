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
//!
//! With `--data-sizes A,B,C...` it measures instead how the copy time follows the data: one
//! image of the same size per data size, each copied with and without block status in
//! interleaved rounds, and a least-squares line `seconds = intercept + slope * GiB of data` fitted
//! through every round's sample of each mode, with its R² (with block status the time should
//! follow the data: R² near 1; without it every copy reads the whole image, so the slope is
//! near 0 and the data explains little).

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
    /// Measure the copy time as a function of the data instead: a comma-separated list of data
    /// sizes (e.g. 100M,400M,1600M), one image of --size each, copied with and without block
    /// status; fits seconds against data (slope, R²).
    #[arg(long, value_delimiter = ',', value_parser = kura_engine::spec::parse_size)]
    pub data_sizes: Vec<u64>,
}

/// A least-squares line through (GiB of data, seconds) samples.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fit {
    /// Seconds per GiB of data.
    pub slope: f64,
    /// Seconds at no data.
    pub intercept: f64,
    /// Share of the variance of the seconds that the line explains (1: every sample on it).
    pub r2: f64,
    pub samples: usize,
}

/// The line through `(x, y)` points; `None` with fewer than two distinct x.
pub fn fit(points: &[(f64, f64)]) -> Option<Fit> {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    if points.len() < 2 || sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy > 0.0 {
        (sxy * sxy) / (sxx * syy)
    } else {
        1.0
    };
    Some(Fit {
        slope,
        intercept: my - slope * mx,
        r2,
        samples: points.len(),
    })
}

/// One data size of the scaling run.
#[derive(Debug, Clone, Serialize)]
pub struct ScalePoint {
    pub data_bytes: u64,
    pub with_block_status: Spread,
    pub without_block_status: Spread,
    /// Without / with, per round.
    pub speedup: Spread,
    /// Read payload bytes the server sent for one copy with block status (the last round's).
    pub bytes_sent_with: u64,
    pub bytes_sent_without: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    pub server: String,
    pub client: String,
    pub nbdcopy_version: String,
    pub dir: String,
    pub fs: String,
    pub image_bytes: u64,
    pub rounds: usize,
    pub points: Vec<ScalePoint>,
    /// Seconds against GiB of data, every round's sample with block status.
    pub fit_with_block_status: Option<Fit>,
    pub fit_without_block_status: Option<Fit>,
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
    if !args.data_sizes.is_empty() {
        return run_scaling(args, size);
    }
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

/// `--data-sizes`: with and without block status at every data size, interleaved.
fn run_scaling(args: &NbdcopyArgs, size: u64) -> anyhow::Result<()> {
    let rounds = args.rounds.unwrap_or(if args.quick { 2 } else { 3 }).max(1);
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base)
        .with_context(|| format!("a scratch directory in {}", base.display()))?;
    let mut servers = Vec::new();
    for (i, &data) in args.data_sizes.iter().enumerate() {
        let image = dir.path().join(format!("sparse-{i}.img"));
        sparse_image(&image, size, data)?;
        servers.push((export_server(&image, true)?, export_server(&image, false)?));
    }
    let n = servers.len();
    let sent = std::cell::RefCell::new(vec![0u64; 2 * n]);
    // Side 2i copies data size i with block status, side 2i+1 without.
    let side = |k: usize| -> anyhow::Result<f64> {
        let (with, without) = &servers[k / 2];
        let server = if k.is_multiple_of(2) { with } else { without };
        let (secs, bytes) = copy(server)?;
        sent.borrow_mut()[k] = bytes;
        println!(
            "  {:>6} MiB {:<16} {secs:8.3} s {bytes:>14} bytes read",
            args.data_sizes[k / 2] >> 20,
            if k.is_multiple_of(2) {
                "block status"
            } else {
                "no block status"
            }
        );
        Ok(secs)
    };
    let mut closures: Vec<Box<dyn FnMut(usize) -> anyhow::Result<f64>>> = (0..2 * n)
        .map(|k| Box::new(move |_: usize| side(k)) as Box<dyn FnMut(usize) -> anyhow::Result<f64>>)
        .collect();
    let mut sides: Vec<&mut dyn FnMut(usize) -> anyhow::Result<f64>> =
        closures.iter_mut().map(|c| &mut **c as _).collect();
    let samples = interleave(rounds, &mut sides)?;
    drop(sides);
    drop(closures);
    let sent = sent.into_inner();
    drop(servers);
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let line = |parity: usize| {
        let pts: Vec<(f64, f64)> = (0..n)
            .flat_map(|i| {
                let x = gib(args.data_sizes[i]);
                samples[2 * i + parity].iter().map(move |&y| (x, y))
            })
            .collect();
        fit(&pts)
    };
    let points = (0..n)
        .map(|i| ScalePoint {
            data_bytes: args.data_sizes[i],
            with_block_status: Spread::of(&samples[2 * i]),
            without_block_status: Spread::of(&samples[2 * i + 1]),
            speedup: compare(&samples[2 * i + 1], &samples[2 * i], quotient, None).ratio,
            bytes_sent_with: sent[2 * i],
            bytes_sent_without: sent[2 * i + 1],
        })
        .collect();
    let report = ScaleReport {
        server: "in-process kura_nbd::serve of file:IMAGE?ro=1 (ServeOptions::default; block_status false for the peer)".into(),
        client: format!("nbdcopy {}", nbdcopy_args("nbd://127.0.0.1:PORT/img").join(" ")),
        nbdcopy_version: crate::stats::tool_version("nbdcopy", "--version"),
        dir: base.display().to_string(),
        fs: crate::stats::fs_name(&base),
        image_bytes: size,
        rounds,
        points,
        fit_with_block_status: line(0),
        fit_without_block_status: line(1),
    };
    print_scaling(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("JSON: {}", path.display());
    }
    Ok(())
}

fn print_scaling(r: &ScaleReport) {
    println!(
        "\nnbdcopy of a sparse {:.2} GiB image to null: against its data ({} rounds, images on \
         {} {}; {})",
        r.image_bytes as f64 / f64::from(1u32 << 30),
        r.rounds,
        r.fs,
        r.dir,
        r.nbdcopy_version
    );
    println!(
        "{:>9} {:>26} {:>26} {:>22}",
        "data MiB", "block status (s)", "no block status (s)", "without/with"
    );
    for p in &r.points {
        println!(
            "{:>9} {:>26} {:>26} {:>22}",
            p.data_bytes >> 20,
            p.with_block_status.show(3),
            p.without_block_status.show(3),
            format!("{}x", p.speedup.show(1))
        );
    }
    for (name, f) in [
        ("block status", r.fit_with_block_status),
        ("no block status", r.fit_without_block_status),
    ] {
        match f {
            Some(f) => println!(
                "fit, {name}: seconds = {:.3} + {:.3} * GiB of data, R² = {:.3} ({} samples)",
                f.intercept, f.slope, f.r2, f.samples
            ),
            None => println!("fit, {name}: needs two different data sizes"),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_finds_a_line_and_says_how_well_it_explains_the_points() {
        let f = fit(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
        assert!((f.slope - 2.0).abs() < 1e-12 && (f.intercept - 1.0).abs() < 1e-12);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        let flat = fit(&[(0.0, 1.0), (1.0, 2.0), (2.0, 1.0), (3.0, 2.0)]).unwrap();
        assert!(flat.r2 < 0.5, "{flat:?}");
        assert!(fit(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
    }
}
