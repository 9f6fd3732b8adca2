//! `kura ingest`: streaming network-to-storage ingest (`docs/ingest-protocol.md`) — `format` a
//! raw-device target, `serve` it on TCP or a Unix socket, `send` files, a directory or a
//! generated stream to a server, and read records back with `get` and `ls`. Glue over
//! `kura_ingest`; the protocol, the layout and the server live there.

use crate::dev::{open_dev, open_dev_read_only};
use crate::stream::progress;
use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use kura_engine::spec::parse_size;
use kura_engine::BufferPool;
use kura_ingest::client::{Answers, Client, ClientOptions};
use kura_ingest::frame::Limits;
use kura_ingest::fstarget::FsStore;
use kura_ingest::layout::NO_LABEL;
use kura_ingest::net::{read_key, Addr, Listener};
use kura_ingest::server::{Order, Server, ServerConfig, CHUNK};
use kura_ingest::session::Stage;
use kura_ingest::stage;
use kura_ingest::store::{FormatOptions, Store};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub enum IngestCommand {
    /// Lay out an ingest target on a device: two superblocks, an empty index, the data region.
    Format(FormatArgs),
    /// Receive records from senders and store them on TARGET (stops cleanly on SIGTERM/SIGINT).
    Serve(ServeArgs),
    /// Send files, a directory's files or a generated stream to a server.
    Send(SendArgs),
    /// Write record ID's bytes to stdout or a file.
    Get(GetArgs),
    /// List the records of a target.
    Ls(LsArgs),
    /// The bench's naive host path: the same protocol into a host file with recv() +
    /// buffered write() + fdatasync at each SYNC (loopback only, no index).
    #[command(hide = true)]
    NaiveServe(NaiveArgs),
}

#[derive(Debug, Args)]
pub struct NaiveArgs {
    /// Host file to append records to (created or truncated).
    pub file: PathBuf,
    /// 127.0.0.1:PORT (loopback only: this baseline does not authenticate).
    #[arg(long)]
    pub listen: String,
}

#[derive(Debug, Args)]
pub struct FormatArgs {
    /// Device spec, e.g. file:/tmp/ingest.img?size=1G
    pub target: String,
    /// Index entries (default: one per 4 KiB of the device).
    #[arg(long)]
    pub index_slots: Option<u64>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OrderArg {
    In,
    Out,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Device spec of a formatted target, or with --dev a directory on its AccelFS.
    pub target: String,
    /// AccelFS device (formatted with `kura mkfs`): TARGET is a directory on it, records are
    /// files there and the index a LevelDB database beside them.
    #[arg(long)]
    pub dev: Option<String>,
    /// HOST:PORT, or unix:/path (created mode 0600).
    #[arg(long)]
    pub listen: String,
    /// Shared key file; required for TCP (HMAC-SHA256 challenge).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Write commands in flight.
    #[arg(long, default_value_t = 64)]
    pub qd: usize,
    /// Retirement order of write commands and of record visibility.
    #[arg(long, value_enum, default_value = "in")]
    pub order: OrderArg,
    /// 1 MiB receive buffers for all senders together.
    #[arg(long, default_value_t = 64)]
    pub buffers: usize,
    /// 1 MiB receive buffers one sender may hold.
    #[arg(long, default_value_t = 32)]
    pub per_stream: usize,
    /// Largest record accepted (at most --per-stream MiB).
    #[arg(long, default_value = "16M")]
    pub max_record: String,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StageArg {
    None,
    Crc32c,
    Zstd,
    Classify,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Server address: HOST:PORT or unix:/path.
    pub addr: String,
    /// Files to send, one record each; a directory sends its regular files.
    pub paths: Vec<PathBuf>,
    /// Send --count generated records of this size instead (e.g. 4K; 9M, SNAcc's images,
    /// when no size is given). With --stage classify they are PPM images of about that size
    /// (synthetic scenes of the classifier's classes); otherwise random bytes.
    #[arg(long, num_args = 0..=1, default_missing_value = "9M")]
    pub synthetic: Option<String>,
    /// Records to generate with --synthetic.
    #[arg(long, default_value_t = 100)]
    pub count: usize,
    /// Connections to spread the records over.
    #[arg(long, default_value_t = 1)]
    pub conns: usize,
    /// Limit in MB/s over all connections (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Shared key file (for TCP servers).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Stage the server runs on each record.
    #[arg(long, value_enum, default_value = "crc32c")]
    pub stage: StageArg,
    /// Acknowledge per batch (one SYNC at the end) instead of per record.
    #[arg(long)]
    pub batch_acks: bool,
    /// Seed of the generated records.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Device spec, or with --dev a directory on its AccelFS.
    pub target: String,
    /// AccelFS device holding TARGET (opened read-write: LevelDB cannot open read-only).
    #[arg(long)]
    pub dev: Option<String>,
    pub id: u64,
    /// Write to this file instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Device spec, or with --dev a directory on its AccelFS.
    pub target: String,
    /// AccelFS device holding TARGET (opened read-write: LevelDB cannot open read-only).
    #[arg(long)]
    pub dev: Option<String>,
    /// Only records with this label (a class name from `classify`, or its number).
    #[arg(long)]
    pub label: Option<String>,
}

pub fn run(cmd: IngestCommand) -> anyhow::Result<()> {
    match cmd {
        IngestCommand::Format(a) => format(&a),
        IngestCommand::Serve(a) => serve(&a),
        IngestCommand::Send(a) => send(&a),
        IngestCommand::Get(a) => get(&a),
        IngestCommand::Ls(a) => ls(&a),
        IngestCommand::NaiveServe(a) => naive_serve(&a),
    }
}

fn format(a: &FormatArgs) -> anyhow::Result<()> {
    let dev = open_dev(&a.target)?;
    let store = Store::format(
        dev,
        FormatOptions {
            index_slots: a.index_slots,
            format_id: None,
        },
    )
    .with_context(|| format!("formatting {}", a.target))?;
    let sb = store.superblock();
    println!(
        "formatted {}: {} index slots, data region {} bytes from offset {}",
        a.target,
        sb.index_slots,
        sb.capacity - sb.data_start,
        sb.data_start
    );
    Ok(())
}

fn serve(a: &ServeArgs) -> anyhow::Result<()> {
    let addr: Addr = a.listen.parse().map_err(anyhow::Error::msg)?;
    let max_record = parse_size(&a.max_record).map_err(anyhow::Error::msg)?;
    let key = a
        .key
        .as_ref()
        .map(|p| read_key(p).with_context(|| format!("reading key {}", p.display())))
        .transpose()?;
    // The receive buffers come from the global pool, which io_uring registers at open: size it
    // before the device is opened.
    BufferPool::request_global_bytes((a.buffers + 16) * CHUNK);
    let cfg = ServerConfig {
        limits: Limits {
            max_record,
            ..Limits::default()
        },
        qd: a.qd,
        order: match a.order {
            OrderArg::In => Order::In,
            OrderArg::Out => Order::Out,
        },
        buffers: a.buffers,
        per_stream: a.per_stream,
        key,
    };
    let server = Server::new(cfg, BufferPool::global().clone())?;
    let target = match &a.dev {
        Some(dev) => Target::Fs(
            FsStore::open(open_dev(dev)?, &a.target)
                .with_context(|| format!("opening ingest target {} on {dev}", a.target))?,
        ),
        None => {
            let mut store = Store::open(open_dev(&a.target)?)
                .with_context(|| format!("opening ingest target {}", a.target))?;
            store.set_queue_depth(a.qd);
            Target::Raw(store)
        }
    };
    let before = target.records()?;
    let listener = Listener::bind(&addr).with_context(|| format!("listening on {addr}"))?;
    let bound = listener.local_addr()?;
    let handle = server.handle();
    let stop = handle.stop_flag();
    let signals = AtomicUsize::new(0);
    ctrlc::set_handler(move || {
        if signals.fetch_add(1, Ordering::SeqCst) > 0 {
            eprintln!("kura: second signal; exiting without waiting");
            std::process::exit(130);
        }
        stop.store(true, Ordering::SeqCst);
    })
    .context("installing the signal handler")?;
    eprintln!(
        "kura: ingest listening on {bound} ({} records stored; SIGTERM or Ctrl-C to stop)",
        before
    );
    let after = match target {
        Target::Raw(store) => server.run(store, listener)?.entries().len(),
        Target::Fs(store) => {
            let store = server.run_fs(store, listener)?;
            let n = store.entries()?.len();
            store.close()?;
            n
        }
    };
    let stats = &handle.stats;
    eprintln!(
        "kura: ingest stopped: {} records ({} bytes) stored this run, {} rejected, {} commits; \
         {} records on the target; peak {} of {} buffers; stages {:.3} ms per record",
        stats.records.load(Ordering::Relaxed),
        stats.bytes.load(Ordering::Relaxed),
        stats.rejected.load(Ordering::Relaxed),
        stats.commits.load(Ordering::Relaxed),
        after,
        handle.credits.peak(),
        handle.credits.capacity(),
        stats.stage_ns.load(Ordering::Relaxed) as f64
            / 1e6
            / stats.records.load(Ordering::Relaxed).max(1) as f64,
    );
    Ok(())
}

/// Where a sender's records come from.
enum Source {
    Files(Vec<PathBuf>),
    Synthetic {
        size: usize,
        count: usize,
        seed: u64,
        images: bool,
    },
}

impl Source {
    fn len(&self) -> usize {
        match self {
            Source::Files(f) => f.len(),
            Source::Synthetic { count, .. } => *count,
        }
    }

    fn total_bytes(&self) -> u64 {
        match self {
            Source::Files(f) => f
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum(),
            Source::Synthetic { size, count, .. } => (*size * *count) as u64,
        }
    }

    fn record(&self, i: usize, buf: &mut Vec<u8>) -> anyhow::Result<()> {
        match self {
            Source::Files(f) => {
                *buf =
                    std::fs::read(&f[i]).with_context(|| format!("reading {}", f[i].display()))?;
            }
            Source::Synthetic {
                size, seed, images, ..
            } => {
                let mut rng = SmallRng::seed_from_u64(seed.wrapping_mul(1_000_003) + i as u64);
                if *images {
                    let side = ((*size / 3) as f64).sqrt().max(1.0) as usize;
                    let class = i % stage::CLASSES.len();
                    let rgb = stage::synthetic_rgb(class, side, side, &mut rng);
                    *buf = stage::encode_ppm(side, side, &rgb);
                } else {
                    buf.resize(*size, 0);
                    rng.fill(&mut buf[..]);
                }
            }
        }
        Ok(())
    }
}

fn sources(a: &SendArgs) -> anyhow::Result<Source> {
    if let Some(size) = &a.synthetic {
        if !a.paths.is_empty() {
            bail!("give files or --synthetic, not both");
        }
        let size = parse_size(size).map_err(anyhow::Error::msg)? as usize;
        if size == 0 {
            bail!("--synthetic needs a size above 0");
        }
        return Ok(Source::Synthetic {
            size,
            count: a.count,
            seed: a.seed,
            images: matches!(a.stage, StageArg::Classify),
        });
    }
    let mut files = Vec::new();
    for p in &a.paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("listing {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            entries.sort();
            files.extend(entries);
        } else {
            files.push(p.clone());
        }
    }
    if files.is_empty() {
        bail!("nothing to send: give files, a directory, or --synthetic SIZE --count N");
    }
    Ok(Source::Files(files))
}

fn send(a: &SendArgs) -> anyhow::Result<()> {
    let addr: Addr = a.addr.parse().map_err(anyhow::Error::msg)?;
    let source = Arc::new(sources(a)?);
    let key = a
        .key
        .as_ref()
        .map(|p| read_key(p).with_context(|| format!("reading key {}", p.display())))
        .transpose()?;
    let opts = ClientOptions {
        stage: Some(match a.stage {
            StageArg::None => Stage::None,
            StageArg::Crc32c => Stage::Crc32c,
            StageArg::Zstd => Stage::Zstd,
            StageArg::Classify => Stage::Classify,
        }),
        batch_acks: a.batch_acks,
        key,
    };
    let conns = a.conns.clamp(1, source.len().max(1));
    let bar = progress("send", source.total_bytes());
    let per_conn_rate = a.rate * 1e6 / conns as f64;
    let start = Instant::now();
    let threads: Vec<_> = (0..conns)
        .map(|c| {
            let (addr, opts, source, bar) =
                (addr.clone(), opts.clone(), Arc::clone(&source), bar.clone());
            let batch = a.batch_acks;
            std::thread::spawn(move || -> anyhow::Result<(u64, Answers)> {
                let mut client = Client::connect(&addr, &opts)
                    .with_context(|| format!("connecting to {addr}"))?;
                let mut buf = Vec::new();
                let mut sent = 0u64;
                let begun = Instant::now();
                for i in (c..source.len()).step_by(conns) {
                    source.record(i, &mut buf)?;
                    client.send(&buf, !batch)?;
                    sent += buf.len() as u64;
                    bar.inc(buf.len() as u64);
                    if per_conn_rate > 0.0 {
                        let due = Duration::from_secs_f64(sent as f64 / per_conn_rate);
                        if let Some(wait) = due.checked_sub(begun.elapsed()) {
                            std::thread::sleep(wait);
                        }
                    }
                }
                client.sync()?;
                Ok((sent, client.finish()?))
            })
        })
        .collect();
    let mut bytes = 0u64;
    let mut acks = 0usize;
    let mut stored = 0u64;
    let mut errors = Vec::new();
    for t in threads {
        let (sent, answers) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a sender thread panicked"))??;
        bytes += sent;
        acks += answers.acks.len();
        stored += answers.synced.map_or(0, |s| s.1);
        errors.extend(answers.errors);
    }
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "sent {} records, {bytes} bytes in {secs:.3} s ({:.1} MB/s) over {conns} connection(s); \
         {stored} stored, {acks} acknowledged one by one",
        source.len(),
        bytes as f64 / 1e6 / secs.max(1e-9),
    );
    if !errors.is_empty() {
        for (code, seq, msg) in &errors {
            eprintln!(
                "kura: record {seq}: {} ({code}): {msg}",
                kura_ingest::server::describe_code(*code)
            );
        }
        bail!("{} error(s) from the server", errors.len());
    }
    if stored != source.len() as u64 {
        bail!("{} of {} records stored", stored, source.len());
    }
    Ok(())
}

/// A target of either kind.
enum Target {
    Raw(Store),
    Fs(FsStore),
}

impl Target {
    /// Opens TARGET for reading, never writing the device: a raw device read-only; an AccelFS
    /// target mounted read-only with its index copied to a scratch directory on the host
    /// (LevelDB writes its lock and log at every open).
    fn open_to_read(target: &str, dev: Option<&str>) -> anyhow::Result<Target> {
        Ok(match dev {
            Some(dev) => Target::Fs(
                FsStore::open_read_only(open_dev_read_only(dev)?, target)
                    .with_context(|| format!("opening ingest target {target} on {dev}"))?,
            ),
            None => Target::Raw(
                Store::open_read_only(open_dev_read_only(target)?)
                    .with_context(|| format!("opening ingest target {target}"))?,
            ),
        })
    }

    fn entries(&self) -> anyhow::Result<Vec<kura_ingest::Entry>> {
        Ok(match self {
            Target::Raw(s) => s.entries().to_vec(),
            Target::Fs(s) => s.entries()?,
        })
    }

    fn records(&self) -> anyhow::Result<usize> {
        Ok(self.entries()?.len())
    }

    fn read_original(&mut self, id: u64) -> anyhow::Result<Vec<u8>> {
        Ok(match self {
            Target::Raw(s) => s.read_original(id)?,
            Target::Fs(s) => s.read_original(id)?,
        })
    }

    fn close(self) -> anyhow::Result<()> {
        if let Target::Fs(s) = self {
            s.close()?;
        }
        Ok(())
    }
}

fn get(a: &GetArgs) -> anyhow::Result<()> {
    let mut store = Target::open_to_read(&a.target, a.dev.as_deref())?;
    let bytes = store.read_original(a.id)?;
    store.close()?;
    match &a.output {
        Some(p) => std::fs::write(p, &bytes).with_context(|| format!("writing {}", p.display()))?,
        None => std::io::stdout().lock().write_all(&bytes)?,
    }
    Ok(())
}

fn ls(a: &LsArgs) -> anyhow::Result<()> {
    let store = Target::open_to_read(&a.target, a.dev.as_deref())?;
    let entries = store.entries()?;
    store.close()?;
    let want = match &a.label {
        None => None,
        Some(l) => Some(match stage::CLASSES.iter().position(|c| c == l) {
            Some(i) => i as u8,
            None => l.parse::<u8>().map_err(|_| {
                anyhow::anyhow!(
                    "unknown label {l:?}; classes: {}",
                    stage::CLASSES.join(", ")
                )
            })?,
        }),
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:>8} {:>10} {:>14} {:>12} {:>12} {:>8} {:>6} {:>10}",
        "id", "seq", "offset", "bytes", "stored", "stage", "label", "crc32c"
    )?;
    for e in &entries {
        if want.is_some_and(|l| l != e.label) {
            continue;
        }
        let label = match stage::CLASSES.get(usize::from(e.label)) {
            _ if e.label == NO_LABEL => "-".to_string(),
            Some(name) => name.to_string(),
            None => e.label.to_string(),
        };
        let stage =
            Stage::from_byte(e.stage).map_or("?".to_string(), |s| format!("{s:?}").to_lowercase());
        writeln!(
            out,
            "{:>8} {:>10} {:>14} {:>12} {:>12} {:>8} {:>6} {:>#10x}",
            e.id, e.seq, e.offset, e.orig_len, e.stored_len, stage, label, e.crc
        )?;
    }
    Ok(())
}

/// The naive host path the bench compares against: a thread per connection reads frames with
/// `read()` into a heap buffer, checks them like the server does, appends record bytes to one
/// host file through a buffered writer, and answers each `SYNC` after flushing and
/// `fdatasync`. No pool, no direct I/O, no index.
fn naive_serve(a: &NaiveArgs) -> anyhow::Result<()> {
    use kura_ingest::frame::{decode, Frame, Welcome, VERSION};
    use std::io::{BufWriter, Read};
    use std::net::{TcpListener, TcpStream};
    use std::sync::Mutex;
    let listener = TcpListener::bind(&a.listen)?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() {
        bail!("naive-serve listens on loopback only");
    }
    let file =
        std::fs::File::create(&a.file).with_context(|| format!("creating {}", a.file.display()))?;
    let out = Arc::new(Mutex::new(BufWriter::with_capacity(1 << 20, file)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("installing the signal handler")?;
    eprintln!("kura: naive ingest listening on {local}");
    listener.set_nonblocking(true)?;
    let limits = Limits::default();
    let serve =
        move |mut s: TcpStream, out: Arc<Mutex<BufWriter<std::fs::File>>>| -> anyhow::Result<()> {
            s.set_nonblocking(false)?;
            let mut w = s.try_clone()?;
            let mut buf = vec![0u8; 4 << 20];
            let mut have = 0usize;
            loop {
                while let Some((f, used)) = decode(&buf[..have], &limits)? {
                    match f {
                        Frame::Hello(_) => {
                            let welcome = Frame::Welcome(Welcome {
                                version: VERSION,
                                auth: 0,
                                max_frame: limits.max_frame,
                                max_record: limits.max_record,
                                server_nonce: [0; 16],
                            });
                            w.write_all(&welcome.encode())?;
                            w.write_all(&Frame::Ready.encode())?;
                        }
                        Frame::Data(d) => out
                            .lock()
                            .map_err(|_| anyhow::anyhow!("writer lock"))?
                            .write_all(&d)?,
                        Frame::Sync { upto } => {
                            let mut o = out.lock().map_err(|_| anyhow::anyhow!("writer lock"))?;
                            o.flush()?;
                            o.get_ref().sync_data()?;
                            w.write_all(
                                &Frame::Synced {
                                    upto,
                                    records: upto + 1,
                                }
                                .encode(),
                            )?;
                        }
                        Frame::Bye => return Ok(()),
                        _ => {}
                    }
                    buf.copy_within(used..have, 0);
                    have -= used;
                }
                if have == buf.len() {
                    bail!("frame larger than the receive buffer");
                }
                let n = s.read(&mut buf[have..])?;
                if n == 0 {
                    return Ok(());
                }
                have += n;
            }
        };
    let mut threads = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                let out = Arc::clone(&out);
                threads.push(std::thread::spawn(move || serve(s, out)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
    for t in threads {
        if let Ok(Err(e)) = t.join() {
            eprintln!("kura: naive connection: {e}");
        }
    }
    Ok(())
}
