//! `kura bench ingest` (issue 17, SNAcc's figures): streaming ingest over loopback TCP into an
//! image file, against the device's sequential write bandwidth (fio, same image, same run) and
//! against a naive host path (`kura ingest naive-serve`: recv() + buffered write() + fdatasync)
//! doing the same protocol work; CPU seconds per GB of each server process (its utime + stime
//! from /proc before it stops), its peak RSS (VmHWM) against the configured buffers, in-order
//! against out-of-order retirement with random 4 KiB–1 MiB records at QD 64, 9 MB against
//! 4 KiB records, and each stage's cost per record measured on the same records.
//!
//! Servers run as child processes (`kura ingest serve`) so their CPU and memory are theirs
//! alone; the senders run in this process with batch acknowledgements (one SYNC per
//! connection at the end, so the time includes making everything durable). Each case runs
//! `--rounds` times in turn with the others; figures are medians with their [min–max].

use crate::output::{plot_help, RunArgs};
use crate::stats::Spread;
use anyhow::{bail, Context};
use kura_ingest::client::{Client, ClientOptions};
use kura_ingest::net::Addr;
use kura_ingest::session::Stage;
use kura_ingest::stage;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `kura bench ingest`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("plot", |a| plot_help(a, "ingest")))]
#[command(mut_arg("quick", |a| a.help("A short run: 256 MiB per case, one round")))]
pub struct IngestBenchArgs {
    /// Directory for the image and the naive path's file (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Bytes sent per case (default 2G; --quick 256M).
    #[arg(long)]
    pub bytes: Option<String>,
    /// Sender connections.
    #[arg(long, default_value_t = 2)]
    pub conns: usize,
    /// Rounds (default 3; --quick 1).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Also run 9 MB ingest between two hosts made of network namespaces joined by a veth
    /// pair (the sender, `kura ingest send`, in one; the server in the other), created and
    /// removed by the bench (needs root and `ip`).
    #[arg(long)]
    pub netns: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

const PLOT_SCRIPT: &str = r##"
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
d = json.load(open(sys.argv[1]))
cases = [c for c in d["cases"] if c["mb_per_s"]["median"] > 0]
fig, ax = plt.subplots(figsize=(9, 4))
names = [c["name"] for c in cases]
vals = [c["mb_per_s"]["median"] for c in cases]
lo = [c["mb_per_s"]["median"] - c["mb_per_s"]["min"] for c in cases]
hi = [c["mb_per_s"]["max"] - c["mb_per_s"]["median"] for c in cases]
ax.barh(names, vals, xerr=[lo, hi], color="#4a7")
ax.set_xlabel("MB/s (median, min-max over rounds)")
ax.set_title("kura bench ingest: records over TCP into one image (loopback; veth between netns)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
"##;

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    pub name: String,
    pub server: String,
    pub records: String,
    pub mb_per_s: Spread,
    /// Server CPU seconds per GB received (absent for fio).
    pub cpu_s_per_gb: Option<Spread>,
    /// Server peak RSS in MiB (absent for fio).
    pub peak_rss_mib: Option<Spread>,
    pub command: String,
}

/// Cost of one stage per record, measured in this process.
#[derive(Debug, Clone, Serialize)]
pub struct StageCost {
    pub stage: String,
    pub record_bytes: usize,
    pub ms_per_record: f64,
    pub mb_per_s: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    pub bytes_per_case: u64,
    pub rounds: usize,
    pub conns: usize,
    pub cases: Vec<Case>,
    pub stages: Vec<StageCost>,
    /// Ratios the issue's targets name, from the medians.
    pub ingest_over_fio: Option<f64>,
    pub ingest_over_naive: f64,
    pub cpu_naive_over_ingest: f64,
    pub out_over_in_random: f64,
    pub buffers_mib: usize,
    /// The throttled case: the device's rate (a tenth of the round's 9 MB ingest) and the most
    /// buffers the server had in use (its own count, from its closing line).
    pub throttled_device_mbps: Spread,
    pub throttled_peak_buffers: Option<usize>,
    /// In-order against out-of-order retirement at the device, without the network.
    pub at_device: Vec<AtDevice>,
    pub notes: Vec<String>,
}

/// Record sizes of a case.
#[derive(Debug, Clone, Copy)]
enum Sizes {
    Fixed(usize),
    /// Uniform 4 KiB..=1 MiB from a seed.
    Random,
}

impl Sizes {
    fn describe(self) -> String {
        match self {
            Sizes::Fixed(n) if n >= 1 << 20 => format!("{} MB", n / 1_000_000),
            Sizes::Fixed(n) => format!("{} KiB", n / 1024),
            Sizes::Random => "random 4 KiB-1 MiB".into(),
        }
    }
}

/// A running server child and its address.
struct ServerChild {
    child: Child,
    addr: String,
    /// The server's stderr after its banner (its closing line names the peak buffers in use).
    rest: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl ServerChild {
    fn start(args: &[String]) -> anyhow::Result<ServerChild> {
        ServerChild::start_in(None, args)
    }

    /// Starts `kura ARGS`, inside network namespace `netns` when given (`ip netns exec`
    /// executes it in place, so the child is the server itself).
    fn start_in(netns: Option<&str>, args: &[String]) -> anyhow::Result<ServerChild> {
        let exe = std::env::current_exe().context("finding the kura binary")?;
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            None => Command::new(exe),
        };
        let mut child = cmd
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the ingest server")?;
        let mut err = std::io::BufReader::new(child.stderr.take().context("stderr")?);
        let mut line = String::new();
        err.read_line(&mut line)?;
        let addr = line
            .split_whitespace()
            .skip_while(|w| *w != "on")
            .nth(1)
            .map(str::to_string)
            .with_context(|| format!("no address in the server's banner {line:?}"))?;
        let rest = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let mut line = String::new();
            while err.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                lines.push(std::mem::take(&mut line));
            }
            lines
        });
        Ok(ServerChild {
            child,
            addr,
            rest: Some(rest),
        })
    }

    /// CPU seconds (user + system) and peak RSS in MiB so far, from /proc.
    fn usage(&self) -> anyhow::Result<(f64, f64)> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command name (which may hold spaces) start after the last ')'.
        let rest = stat.rsplit_once(')').map(|x| x.1).context("stat format")?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat; rest starts at field 3.
        let ticks: f64 = f.get(11).context("utime")?.parse::<f64>()?
            + f.get(12).context("stime")?.parse::<f64>()?;
        let hz = 100.0; // USER_HZ on Linux
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let hwm_kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Ok((ticks / hz, hwm_kib / 1024.0))
    }

    /// Stops the server with SIGTERM; returns the peak buffers in use its closing line reports
    /// (`peak N of M buffers`; `None` for a server that prints none, the naive one).
    fn stop(mut self) -> anyhow::Result<Option<usize>> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let start = Instant::now();
        while self.child.try_wait()?.is_none() {
            if start.elapsed() > Duration::from_secs(120) {
                let _ = self.child.kill();
                bail!("the server did not stop within two minutes of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let lines = self
            .rest
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        Ok(lines.iter().find_map(|l| {
            let after = l.split_once("peak ")?.1;
            let (n, tail) = after.split_once(' ')?;
            tail.starts_with("of ").then(|| n.parse().ok())?
        }))
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `total` bytes of records over `conns` connections with one SYNC each at the end;
/// returns the seconds from the first connect to the last SYNCED.
fn send(
    addr: &str,
    key: Option<&[u8]>,
    sizes: Sizes,
    total: u64,
    conns: usize,
) -> anyhow::Result<f64> {
    let addr: Addr = addr.parse().map_err(anyhow::Error::msg)?;
    let opts = ClientOptions {
        stage: Some(Stage::Crc32c),
        batch_acks: true,
        key: key.map(<[u8]>::to_vec),
    };
    let start = Instant::now();
    let threads: Vec<_> = (0..conns)
        .map(|c| {
            let (addr, opts) = (addr.clone(), opts.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let mut client = Client::connect(&addr, &opts)?;
                let mut rng = SmallRng::seed_from_u64(c as u64);
                let mut payload = vec![0u8; 9_000_000];
                rng.fill(&mut payload[..]);
                let share = total / conns as u64;
                let mut sent = 0u64;
                while sent < share {
                    let len = match sizes {
                        Sizes::Fixed(n) => n,
                        Sizes::Random => rng.gen_range(4096..=(1 << 20)),
                    };
                    let off = rng.gen_range(0..payload.len() - len.min(payload.len()) + 1);
                    client.send(&payload[off..off + len], false)?;
                    sent += len as u64;
                }
                client.sync()?;
                let answers = client.finish()?;
                if !answers.errors.is_empty() {
                    bail!("server errors: {:?}", answers.errors);
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// fio's sequential write bandwidth on `image` in MB/s (1 MiB at depth 64, io_uring, direct).
fn fio_seq_write(image: &Path, bytes: u64) -> anyhow::Result<(f64, String)> {
    let args = vec![
        "--name=seqwrite".to_string(),
        format!("--filename={}", image.display()),
        "--rw=write".into(),
        "--bs=1M".into(),
        "--iodepth=64".into(),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        format!("--size={bytes}"),
        "--end_fsync=1".into(),
        "--output-format=json".into(),
    ];
    let out = Command::new("fio")
        .args(&args)
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let bw = v["jobs"][0]["write"]["bw_bytes"]
        .as_f64()
        .context("fio JSON has no write bandwidth")?;
    Ok((bw / 1e6, format!("fio {}", args.join(" "))))
}

struct Plan {
    name: &'static str,
    naive: bool,
    sizes: Sizes,
    order: &'static str,
}

/// The arguments of a loopback `kura ingest serve` on `target` with a key, queue depth 64, the
/// given order and buffer count.
fn serve_args(target: String, key_path: &Path, order: &str, buffers: usize) -> Vec<String> {
    vec![
        "ingest".into(),
        "serve".into(),
        target,
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--key".into(),
        key_path.display().to_string(),
        "--qd".into(),
        "64".into(),
        "--order".into(),
        order.into(),
        "--buffers".into(),
        buffers.to_string(),
    ]
}

pub fn run(args: &IngestBenchArgs) -> anyhow::Result<()> {
    let quick = args.run.quick;
    let total = match &args.bytes {
        Some(b) => kura_engine::spec::parse_size(b).map_err(anyhow::Error::msg)?,
        None if quick => 256 << 20,
        None => 2 << 30,
    };
    let rounds = crate::stats::rounds(args.rounds, quick, 1).max(1);
    let conns = args.conns.max(1);
    let tmp = tempfile::Builder::new()
        .prefix("kura-bench-ingest")
        .tempdir_in(args.dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let image = tmp.path().join("ingest.img");
    let naive_file = tmp.path().join("naive.out");
    let key_path = tmp.path().join("key");
    let key: Vec<u8> = (0..32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(&key_path, &key)?;
    // Room for one case's bytes plus the index; each kura case starts on a fresh format.
    let image_bytes = total + total / 8 + (64 << 20);
    let exe = std::env::current_exe()?;
    let format = || -> anyhow::Result<()> {
        let status = Command::new(&exe)
            .args([
                "ingest",
                "format",
                &format!("file:{}?size={image_bytes}", image.display()),
            ])
            .stdout(Stdio::null())
            .status()?;
        if !status.success() {
            bail!("formatting the bench image failed");
        }
        Ok(())
    };
    let buffers = 64usize;
    let fio_present = Command::new("fio").arg("--version").output().is_ok();
    // Every block of the image written once before anything is measured, so neither fio nor
    // kura pays for the file system allocating blocks of a sparse file.
    if fio_present {
        fio_seq_write(&image, image_bytes).context("pre-filling the image with fio")?;
    }
    let plans = [
        Plan {
            name: "kura ingest, 9 MB, in-order",
            naive: false,
            sizes: Sizes::Fixed(9_000_000),
            order: "in",
        },
        Plan {
            name: "naive host path, 9 MB",
            naive: true,
            sizes: Sizes::Fixed(9_000_000),
            order: "in",
        },
        Plan {
            name: "kura ingest, random, in-order",
            naive: false,
            sizes: Sizes::Random,
            order: "in",
        },
        Plan {
            name: "kura ingest, random, out-of-order",
            naive: false,
            sizes: Sizes::Random,
            order: "out",
        },
        Plan {
            name: "kura ingest, 4 KiB, out-of-order",
            naive: false,
            sizes: Sizes::Fixed(4096),
            order: "out",
        },
    ];
    let mut bw: Vec<Vec<f64>> = vec![Vec::new(); plans.len() + 1];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); plans.len()];
    let mut rss: Vec<Vec<f64>> = vec![Vec::new(); plans.len()];
    let mut commands: Vec<String> = vec![String::new(); plans.len() + 1];
    let mut notes = Vec::new();
    let mut throttled = Throttled::default();
    for round in 0..rounds {
        for (i, p) in plans.iter().enumerate() {
            // 4 KiB records move less per second; a tenth of the bytes keeps the case short.
            let bytes = match p.sizes {
                Sizes::Fixed(4096) => total / 16,
                _ => total,
            };
            let args: Vec<String> = if p.naive {
                vec![
                    "ingest".into(),
                    "naive-serve".into(),
                    naive_file.display().to_string(),
                    "--listen".into(),
                    "127.0.0.1:0".into(),
                ]
            } else {
                serve_args(
                    format!("uring:{}", image.display()),
                    &key_path,
                    p.order,
                    buffers,
                )
            };
            if !p.naive {
                format()?;
            }
            commands[i] = format!("kura {}", args.join(" "));
            let server = ServerChild::start(&args)?;
            let k = (!p.naive).then_some(&key[..]);
            let secs = send(&server.addr, k, p.sizes, bytes, conns)?;
            let (cpu_s, rss_mib) = server.usage()?;
            server.stop()?;
            bw[i].push(bytes as f64 / 1e6 / secs);
            cpu[i].push(cpu_s / (bytes as f64 / 1e9));
            rss[i].push(rss_mib);
            eprintln!(
                "round {}: {}: {:.0} MB/s, {:.2} CPU s/GB, peak RSS {:.0} MiB",
                round + 1,
                p.name,
                bytes as f64 / 1e6 / secs,
                cpu_s / (bytes as f64 / 1e9),
                rss_mib
            );
        }
        if fio_present {
            let (mbs, cmd) = fio_seq_write(&image, total)?;
            bw[plans.len()].push(mbs);
            commands[plans.len()] = cmd;
            eprintln!("round {}: fio sequential write: {mbs:.0} MB/s", round + 1);
        }
        // A sender 10x faster than the device: the device throttled to a tenth of what this
        // round's 9 MB case moved.
        let sender_mbs = bw[0].last().copied().unwrap_or(1000.0);
        throttled.run(
            &image, &key_path, &key, &format, sender_mbs, total, conns, buffers,
        )?;
        eprintln!(
            "round {}: throttled device ({:.0} MB/s): {:.0} MB/s, peak RSS {:.0} MiB, peak {:?} \
             buffers of {buffers}",
            round + 1,
            throttled.device_mbps.last().copied().unwrap_or(0.0),
            throttled.bw.last().copied().unwrap_or(0.0),
            throttled.rss.last().copied().unwrap_or(0.0),
            throttled.peak_buffers.last().copied().flatten(),
        );
    }
    if !fio_present {
        notes.push("fio is not installed: no device baseline".into());
    }
    notes.push(format!(
        "loopback TCP, {conns} sender connection(s) in the bench process, batch acks (one SYNC \
         per connection), the image on {} (pre-filled once by fio, so no case allocates blocks); fio \
         writes the same image after the ingest cases in each round; each kura case starts on \
         a freshly formatted target",
        crate::stats::fs_name(tmp.path())
    ));
    let mut cases: Vec<Case> = plans
        .iter()
        .enumerate()
        .map(|(i, p)| Case {
            name: p.name.into(),
            server: if p.naive { "naive" } else { "kura" }.into(),
            records: p.sizes.describe(),
            mb_per_s: Spread::of(&bw[i]),
            cpu_s_per_gb: Some(Spread::of(&cpu[i])),
            peak_rss_mib: Some(Spread::of(&rss[i])),
            command: commands[i].clone(),
        })
        .collect();
    if fio_present {
        cases.push(Case {
            name: "fio sequential write".into(),
            server: "fio".into(),
            records: "1 MiB blocks, QD 64".into(),
            mb_per_s: Spread::of(&bw[plans.len()]),
            cpu_s_per_gb: None,
            peak_rss_mib: None,
            command: commands[plans.len()].clone(),
        });
    }
    cases.push(Case {
        name: "kura ingest, 9 MB, device throttled to 1/10 of the sender".into(),
        server: "kura".into(),
        records: Sizes::Fixed(9_000_000).describe(),
        mb_per_s: Spread::of(&throttled.bw),
        cpu_s_per_gb: Some(Spread::of(&throttled.cpu)),
        peak_rss_mib: Some(Spread::of(&throttled.rss)),
        command: throttled.command.clone(),
    });
    if args.netns {
        match two_hosts(&image, &key_path, &format, total, conns, rounds, buffers) {
            Ok(case) => cases.push(case),
            Err(e) => notes.push(format!("two-host (netns + veth) case not run: {e:#}")),
        }
    }
    let med = |i: usize| cases[i].mb_per_s.median;
    let cpu_med = |i: usize| cases[i].cpu_s_per_gb.as_ref().map_or(0.0, |s| s.median);
    let report = IngestReport {
        bytes_per_case: total,
        rounds,
        conns,
        stages: stage_costs(quick),
        at_device: at_device(&image, total, rounds)?,
        ingest_over_fio: fio_present.then(|| med(0) / med(plans.len())),
        ingest_over_naive: med(0) / med(1),
        cpu_naive_over_ingest: cpu_med(1) / cpu_med(0).max(1e-9),
        out_over_in_random: med(3) / med(2),
        buffers_mib: buffers,
        throttled_device_mbps: Spread::of(&throttled.device_mbps),
        throttled_peak_buffers: throttled.peak_buffers.iter().flatten().copied().max(),
        notes,
        cases,
    };
    print_report(&report);
    args.run.output.emit("ingest", PLOT_SCRIPT, &report)
}

/// The case of a sender 10x faster than the device: `throttle(uring:IMAGE)?mbps=R` with R a
/// tenth of the sender's rate, figures of every round.
#[derive(Default)]
struct Throttled {
    device_mbps: Vec<f64>,
    bw: Vec<f64>,
    cpu: Vec<f64>,
    rss: Vec<f64>,
    peak_buffers: Vec<Option<usize>>,
    command: String,
}

impl Throttled {
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        image: &Path,
        key_path: &Path,
        key: &[u8],
        format: &dyn Fn() -> anyhow::Result<()>,
        sender_mbs: f64,
        total: u64,
        conns: usize,
        buffers: usize,
    ) -> anyhow::Result<()> {
        let mbps = (sender_mbs / 10.0).max(1.0);
        // A tenth of the bytes at a tenth of the rate: as long as the unthrottled case.
        let bytes = (total / 10).max(64 << 20);
        format()?;
        let args = serve_args(
            format!("throttle(uring:{})?mbps={mbps:.0}", image.display()),
            key_path,
            "in",
            buffers,
        );
        self.command = format!("kura {}", args.join(" "));
        let server = ServerChild::start(&args)?;
        let secs = send(
            &server.addr,
            Some(key),
            Sizes::Fixed(9_000_000),
            bytes,
            conns,
        )?;
        let (cpu_s, rss_mib) = server.usage()?;
        let peak = server.stop()?;
        self.device_mbps.push(mbps);
        self.bw.push(bytes as f64 / 1e6 / secs);
        self.cpu.push(cpu_s / (bytes as f64 / 1e9));
        self.rss.push(rss_mib);
        self.peak_buffers.push(peak);
        Ok(())
    }
}

/// Retirement orders compared at one device with no network: random 4 KiB–1 MiB records
/// through the server's device thread ([`kura_ingest::server::write_local`]) at QD 64.
#[derive(Debug, Clone, Serialize)]
pub struct AtDevice {
    pub device: String,
    pub in_order_mb_per_s: Spread,
    pub out_of_order_mb_per_s: Spread,
    /// Median out-of-order over median in-order.
    pub out_over_in: f64,
}

/// The devices of [`AtDevice`]: the bench image through io_uring, a RAM disk, and the RAM disk
/// behind `throttle` with equal latencies and with a share of the commands 20x to 50x slower
/// (short latencies, where the RAM disk's copies bound the rate, and long ones, where the
/// latencies do).
fn at_device(image: &Path, total: u64, rounds: usize) -> anyhow::Result<Vec<AtDevice>> {
    use kura_ingest::server::{write_local, Order, ServerConfig};
    use kura_ingest::store::{FormatOptions, Store};
    let ram = 320u64 << 20;
    let devices = [
        format!("uring:{}", image.display()),
        format!("mem:{ram}"),
        format!("throttle(mem:{ram})?lat_us=100"),
        format!("throttle(mem:{ram})?lat_us=100&slow_us=2000&slow_pct=10&seed=1"),
        format!("throttle(mem:{ram})?lat_us=100&slow_us=5000&slow_pct=5&seed=1"),
        // Latencies long enough that they, not the RAM disk's copies, bound the rate.
        format!("throttle(mem:{ram})?lat_us=1000&slow_us=20000&slow_pct=10&seed=1"),
        format!("throttle(mem:{ram})?lat_us=2000&slow_us=50000&slow_pct=10&seed=1"),
        format!("throttle(mem:{ram})?lat_us=2000"),
    ];
    let buffers = 64usize;
    let pool = kura_engine::BufferPool::new(buffers << 20)?;
    let mut rng = SmallRng::seed_from_u64(17);
    let mut out = Vec::new();
    for spec in &devices {
        // RAM disks hold 256 MiB of records; the image a case's bytes.
        let bytes = if spec.starts_with("uring") {
            total
        } else {
            total.min(256 << 20)
        };
        let mut sizes = Vec::new();
        let mut sum = 0u64;
        while sum < bytes {
            let n = rng.gen_range(4096..=(1usize << 20));
            sizes.push(n);
            sum += n as u64;
        }
        let mut mbs = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            for (k, order) in [Order::In, Order::Out].into_iter().enumerate() {
                let dev = kura_vdrive::open(spec).with_context(|| format!("opening {spec}"))?;
                let mut store = Store::format(dev, FormatOptions::default())
                    .with_context(|| format!("formatting {spec}"))?;
                store.set_queue_depth(64);
                let cfg = ServerConfig {
                    qd: 64,
                    order,
                    buffers,
                    per_stream: buffers,
                    ..ServerConfig::default()
                };
                let (_, run) = write_local(store, &cfg, &pool, &sizes, round as u64)?;
                let rate = run.bytes as f64 / 1e6 / run.seconds;
                eprintln!(
                    "round {}: at the device, {spec}, {order:?}-order: {rate:.0} MB/s",
                    round + 1
                );
                mbs[k].push(rate);
            }
        }
        let (a, b) = (Spread::of(&mbs[0]), Spread::of(&mbs[1]));
        out.push(AtDevice {
            device: spec.clone(),
            out_over_in: b.median / a.median.max(1e-9),
            in_order_mb_per_s: a,
            out_of_order_mb_per_s: b,
        });
    }
    Ok(out)
}

/// Two "hosts": network namespaces joined by a veth pair, removed again on drop.
struct TwoHosts {
    sender: String,
    server: String,
}

/// The server's address inside its namespace.
const SERVER_IP: &str = "10.77.17.2";

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl TwoHosts {
    fn create() -> anyhow::Result<TwoHosts> {
        let id = std::process::id();
        let hosts = TwoHosts {
            sender: format!("kura-ingest-a-{id}"),
            server: format!("kura-ingest-b-{id}"),
        };
        ip(&["netns", "add", &hosts.sender])?;
        ip(&["netns", "add", &hosts.server])?;
        let (va, vb) = (
            format!("kia{}", id % 100_000),
            format!("kib{}", id % 100_000),
        );
        ip(&[
            "link",
            "add",
            &va,
            "netns",
            &hosts.sender,
            "type",
            "veth",
            "peer",
            "name",
            &vb,
            "netns",
            &hosts.server,
        ])?;
        ip(&[
            "-n",
            &hosts.sender,
            "addr",
            "add",
            "10.77.17.1/24",
            "dev",
            &va,
        ])?;
        ip(&[
            "-n",
            &hosts.server,
            "addr",
            "add",
            &format!("{SERVER_IP}/24"),
            "dev",
            &vb,
        ])?;
        for (ns, dev) in [(&hosts.sender, &va), (&hosts.server, &vb)] {
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // Deleting a namespace removes its end of the veth pair, and with it the other end.
        let _ = ip(&["netns", "del", &self.sender]);
        let _ = ip(&["netns", "del", &self.server]);
    }
}

/// 9 MB ingest from a sender namespace to a server namespace over veth: `kura ingest send` in
/// one, `kura ingest serve` in the other; the sender's own MB/s figure (it ends at SYNCED).
fn two_hosts(
    image: &Path,
    key: &Path,
    format: &dyn Fn() -> anyhow::Result<()>,
    total: u64,
    conns: usize,
    rounds: usize,
    buffers: usize,
) -> anyhow::Result<Case> {
    let hosts = TwoHosts::create()?;
    let exe = std::env::current_exe()?;
    let count = (total / 9_000_000).max(1).to_string();
    let mut bw = Vec::new();
    let mut cpu = Vec::new();
    let mut rss = Vec::new();
    let mut command = String::new();
    for _ in 0..rounds {
        format()?;
        let args: Vec<String> = vec![
            "ingest".into(),
            "serve".into(),
            format!("uring:{}", image.display()),
            "--listen".into(),
            format!("{SERVER_IP}:0"),
            "--key".into(),
            key.display().to_string(),
            "--buffers".into(),
            buffers.to_string(),
        ];
        let server = ServerChild::start_in(Some(&hosts.server), &args)?;
        let send_args = [
            "netns".to_string(),
            "exec".into(),
            hosts.sender.clone(),
            exe.display().to_string(),
            "ingest".into(),
            "send".into(),
            server.addr.clone(),
            "--key".into(),
            key.display().to_string(),
            "--synthetic".into(),
            "9000000".into(),
            "--count".into(),
            count.clone(),
            "--conns".into(),
            conns.to_string(),
            "--batch-acks".into(),
        ];
        let out = Command::new("ip").args(&send_args).output()?;
        let (cpu_s, rss_mib) = server.usage()?;
        server.stop()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "sender failed: {}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // "... in S s (X MB/s) ..."
        let mbs: f64 = text
            .split('(')
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no MB/s in the sender's line {text:?}"))?;
        let bytes = 9_000_000.0 * count.parse::<f64>().unwrap_or(1.0);
        bw.push(mbs);
        cpu.push(cpu_s / (bytes / 1e9));
        rss.push(rss_mib);
        eprintln!("two hosts (netns + veth), 9 MB: {mbs:.0} MB/s");
        command = format!(
            "kura {} (in netns {}) <- ip {}",
            args.join(" "),
            hosts.server,
            send_args.join(" ")
        );
    }
    Ok(Case {
        name: "kura ingest, 9 MB, two hosts (veth)".into(),
        server: "kura".into(),
        records: "9 MB".into(),
        mb_per_s: Spread::of(&bw),
        cpu_s_per_gb: Some(Spread::of(&cpu)),
        peak_rss_mib: Some(Spread::of(&rss)),
        command,
    })
}

/// Each stage's cost per record on the records a sender would send: crc32c and zstd on a
/// 9 MB record of half random, half repeated bytes; classify on a 9 MB PPM scene.
fn stage_costs(quick: bool) -> Vec<StageCost> {
    let n = if quick { 3 } else { 10 };
    let mut rng = SmallRng::seed_from_u64(17);
    let mut bytes = vec![0u8; 9_000_000];
    rng.fill(&mut bytes[..4_500_000]);
    let side = ((9_000_000 / 3) as f64).sqrt() as usize;
    let ppm = stage::encode_ppm(side, side, &stage::synthetic_rgb(0, side, side, &mut rng));
    let classifier = stage::Classifier::standard();
    let time = |f: &dyn Fn()| {
        f();
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        start.elapsed().as_secs_f64() / n as f64
    };
    let crc = time(&|| {
        std::hint::black_box(kura_engine::crc32c::crc32c(&bytes));
    });
    let zstd = time(&|| {
        std::hint::black_box(stage::compress(&bytes).map(|z| z.len()).unwrap_or(0));
    });
    let classify = time(&|| {
        std::hint::black_box(classifier.label(&ppm));
    });
    [
        ("crc32c", crc, bytes.len()),
        ("zstd", zstd, bytes.len()),
        ("classify", classify, ppm.len()),
    ]
    .into_iter()
    .map(|(s, secs, len)| StageCost {
        stage: s.into(),
        record_bytes: len,
        ms_per_record: secs * 1e3,
        mb_per_s: len as f64 / 1e6 / secs.max(1e-12),
    })
    .collect()
}

fn print_report(r: &IngestReport) {
    println!(
        "kura bench ingest: {} MB per case, {} round(s), {} connection(s)",
        r.bytes_per_case / 1_000_000,
        r.rounds,
        r.conns
    );
    println!(
        "{:<58} {:>24} {:>20} {:>18}",
        "case", "MB/s", "CPU s/GB", "peak RSS MiB"
    );
    for c in &r.cases {
        println!(
            "{:<58} {:>24} {:>20} {:>18}",
            c.name,
            c.mb_per_s.show(0),
            c.cpu_s_per_gb.as_ref().map_or("-".into(), |s| s.show(2)),
            c.peak_rss_mib.as_ref().map_or("-".into(), |s| s.show(0)),
        );
    }
    if let Some(x) = r.ingest_over_fio {
        println!(
            "9 MB ingest / fio sequential write: {:.2} (target ≥ 0.90)",
            x
        );
    }
    println!(
        "9 MB ingest / naive host path: {:.2}x bandwidth (target ≥ 1.5x), naive/kura CPU per GB {:.2}x (target ≥ 2x at equal bandwidth)",
        r.ingest_over_naive, r.cpu_naive_over_ingest
    );
    println!(
        "random 4 KiB-1 MiB, out-of-order / in-order at QD 64: {:.2}x (target ≥ 1.3x)",
        r.out_over_in_random
    );
    println!("configured receive buffers: {} MiB", r.buffers_mib);
    println!(
        "device throttled to {} MB/s (a tenth of the sender): peak {} of {} buffers in use (the \
         server's count)",
        r.throttled_device_mbps.show(0),
        r.throttled_peak_buffers
            .map_or("unknown".into(), |n| n.to_string()),
        r.buffers_mib
    );
    for d in &r.at_device {
        println!(
            "at the device, no network, random 4 KiB-1 MiB, QD 64, {}: in-order {} MB/s, \
             out-of-order {} MB/s, out/in {:.2}x",
            d.device,
            d.in_order_mb_per_s.show(0),
            d.out_of_order_mb_per_s.show(0),
            d.out_over_in
        );
    }
    for s in &r.stages {
        println!(
            "stage {:<9} {:>8.2} ms per {:.1} MB record ({:.0} MB/s)",
            s.stage,
            s.ms_per_record,
            s.record_bytes as f64 / 1e6,
            s.mb_per_s
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}
