//! `kura demo`: the main job on an embedded default. A file-backed image in a temp dir is written
//! through the direct engine at depth with a verifiable pattern, read back and verified, and then
//! 4 KiB read latency is timed on the direct path against the kernel-mediated ones on that same
//! written data. Then the paper's application runs: a genome (E. coli MG1655 when Debian's
//! ragout-examples is installed, else a seeded synthetic one) and simulated reads are put on a
//! fresh AccelFS image, indexed, saved, reloaded and matched on each I/O path, with the Table-2
//! breakdown and the accuracy against the truth in the read names.

use crate::dev::{open_dev, verify_pattern, write_pattern};
use anyhow::{bail, Context};
use kura_engine::{BlockDevice, BufferPool, Completion, Request};
use rand::{Rng, SeedableRng};
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Size of the image (e.g. 256M, 1G).
    #[arg(long, default_value = "256M")]
    size: String,
    /// Directory for the image (default: a fresh temp dir, removed afterwards).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// 4 KiB reads timed per path.
    #[arg(long, default_value_t = 5000)]
    reads: u32,
    /// Keep the image afterwards.
    #[arg(long)]
    keep: bool,
    /// Reads simulated for the genome pipeline (0 skips it).
    #[arg(long, default_value_t = 50_000)]
    genome_reads: u64,
    /// I/O paths the genome pipeline runs on (accelfs, host, redirect).
    #[arg(long, default_value = "accelfs,host,redirect")]
    genome_paths: String,
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let size = kura_engine::spec::parse_size(&args.size).map_err(anyhow::Error::msg)?;
    if size < (1 << 20) {
        bail!("--size {} is too small; use at least 1M", args.size);
    }
    let temp = match &args.dir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("kura-demo")
                .tempdir()
                .context("creating a temp dir")?,
        ),
    };
    let dir = match (&args.dir, &temp) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.path().to_path_buf(),
        (None, None) => bail!("no directory for the image"),
    };
    let image = dir.join("kura-demo.img");
    let path = image.display().to_string();
    println!("kura demo: image {path} ({})", args.size);

    let mut dev = open_dev(&format!("file:{path}?size={size}"))?;
    println!("direct path: {}", dev.describe());
    let blocks = dev.geometry().num_blocks;
    write_pattern(&mut *dev, 0, blocks, 42, 32)?;
    if verify_pattern(&mut *dev, 0, blocks, 42, 32)? > 0 {
        bail!("the image did not read back as written");
    }
    drop(dev);

    println!();
    println!(
        "4 KiB random read latency, queue depth 1, {} reads on the written image:",
        args.reads
    );
    println!(
        "{:<34} {:>10} {:>10} {:>10}",
        "path", "mean µs", "p50 µs", "p99 µs"
    );
    let paths = [
        ("direct (io_uring, O_DIRECT)", format!("uring:{path}")),
        ("system calls (pread, page cache)", format!("sync:{path}")),
        ("redirect (proxy process)", format!("redirect:{path}")),
        (
            "redirect, modeled Aurora link",
            format!("redirect:{path}?link=aurora"),
        ),
    ];
    let mut direct_mean = None;
    for (label, spec) in paths {
        kura_bench::io::drop_page_cache(&image)?;
        let mut dev = match kura_engine::open(&spec) {
            Ok(d) => d,
            Err(e) => {
                println!("{label:<34} skipped: {e}");
                continue;
            }
        };
        let reads = if spec.contains("aurora") {
            args.reads.min(1000)
        } else {
            args.reads
        };
        let mut lat = time_reads(&mut *dev, reads)?;
        lat.sort_by(f64::total_cmp);
        let mean = lat.iter().sum::<f64>() / lat.len() as f64;
        let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
        // The baseline is the direct path's own mean, never whichever path opened first: when
        // io_uring is refused, the others are printed without a comparison.
        let note = match direct_mean {
            _ if spec.starts_with("uring:") => {
                direct_mean = Some(mean);
                String::new()
            }
            Some(d) if mean > 0.0 => format!(
                "  direct (io_uring) is {:.0}% lower than this path",
                100.0 * (1.0 - d / mean)
            ),
            _ => "  (no direct-path baseline: io_uring did not open)".to_string(),
        };
        println!(
            "{label:<34} {mean:>10.1} {:>10.1} {:>10.1}{note}",
            pct(0.5),
            pct(0.99)
        );
    }
    println!();
    println!("(each path starts with the image evicted from the page cache; `kura bench io` measures every size and depth, against fio)");
    if args.genome_reads > 0 {
        println!();
        println!("genome sequence matching (the paper's application, Table 2 per I/O path):");
        let mut run = crate::genome::RunArgs::demo(&dir.join("genome"), args.genome_reads);
        run.paths.clone_from(&args.genome_paths);
        crate::genome::run_paths(&run)?;
        println!(
            "(`kura bench genome` compares with minimap2; `kura genome --help` for the tools)"
        );
    }
    match (args.keep, temp) {
        (true, Some(t)) => {
            let kept = t.keep();
            println!("kept {}", kept.join("kura-demo.img").display());
        }
        (true, None) => println!("kept {path}"),
        (false, Some(t)) => t.close().context("removing the temp dir")?,
        (false, None) => {
            std::fs::remove_file(&image).with_context(|| format!("removing {path}"))?
        }
    }
    Ok(())
}

/// Latency in µs of `n` random single-block reads, one at a time.
fn time_reads(dev: &mut dyn BlockDevice, n: u32) -> anyhow::Result<Vec<f64>> {
    let geo = dev.geometry();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut buf = Some(BufferPool::global().alloc(geo.block_size as usize)?);
    let mut done: Vec<Completion> = Vec::with_capacity(1);
    let mut lat = Vec::with_capacity(n as usize);
    for i in 0..n {
        let lba = rng.gen_range(0..geo.num_blocks);
        let b = buf.take().context("buffer lost")?;
        let t = Instant::now();
        dev.submit(Request::read(u64::from(i), lba, 1, b))
            .map_err(|r| anyhow::anyhow!("{}", r.error))?;
        while done.is_empty() {
            dev.poll(&mut done, 1)?;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        let c = done.pop().context("completion lost")?;
        c.status?;
        buf = c.buf;
    }
    Ok(lat)
}
