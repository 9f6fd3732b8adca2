//! `kura kv`: the key-value stores from the shell (issue 18, part 2) — put, get, del, scan,
//! import/export of TSV, JSON lines or hex, stats, compact, check — over two engines: Google
//! LevelDB (`kura_kv`, in a host directory or a directory inside the AccelFS on `--dev`) and
//! kura's native store (`kura_store`, on the raw device `--dev`, DB `/`). This module owns the
//! line formats and their escape rules; the stores live in their crates.

use crate::dev::open_dev;
use crate::stream::progress;
use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use kura_accelfs::{FileSystem, MountOptions};
use kura_kv::{Db, DbOptions, Location};
use kura_store::{Store, StoreError, StoreOptions};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;

/// Shown by `kura kv --help`: where DB lives and how keys and values are written.
pub const ABOUT: &str = "\
Key-value stores from the shell: LevelDB (--engine leveldb, the default) or kura's native store \
(--engine native).

Where DB is:
  leveldb, no --dev      DB is a host directory (a LevelDB database; plyvel opens it).
  leveldb, --dev SPEC    DB is a directory inside the AccelFS on SPEC (made with `kura mkfs`).
  native,  --dev SPEC    the store is the raw device SPEC itself and DB must be `/`; format it
                         first with `kura kv init --engine native --dev SPEC /`.

Keys and values on the command line (put, get, del, scan bounds) are taken literally, or as hex
with --hex. Output (get, scan, export) and import use one of three line formats:
  TSV (default)  key<TAB>value per line. Bytes are written as they are except: backslash as \\\\,
                 tab as \\t, newline as \\n, carriage return as \\r, and every other control byte
                 (below 0x20, and 0x7f) and every byte that is not part of valid UTF-8 as \\xHH.
                 Import reverses exactly this; any other backslash sequence, a line without
                 exactly one unescaped tab, is an error. So binary data round-trips through TSV.
  --hex          key<TAB>value per line, both lowercase (or uppercase) hex; an empty key or
                 value is an empty field.
  --jsonl        one JSON object per line: {\"key\": \"...\", \"value\": \"...\"}, both JSON strings
                 (UTF-8 text; export refuses non-UTF-8 data: use --jsonl --hex, where the
                 strings are hex).
Empty lines are skipped on import. Import reads and checks the whole file before writing
anything: a malformed line is reported with its line number and nothing is imported. LevelDB then
writes it as one atomic, synced batch; the native store in batches of at most 1 MiB of keys and
values (its log frame bounds a batch), synced at the end, so a device failure midway can leave a
prefix of the file imported.

The native store flushes its memtable (16 MiB) into sorted runs and merges them as they pile up;
`compact` merges every run into one level. Its values are copied into the runs (not yet kept
apart in a value log), and flushes and merges run inside the writing command.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// Google LevelDB through kura-kv.
    Leveldb,
    /// kura's native store (kura-store) on a raw device.
    Native,
}

/// Which store, and where.
#[derive(Debug, Args)]
pub struct At {
    /// The storage engine.
    #[arg(long, value_enum, default_value = "leveldb")]
    engine: Engine,
    /// Device spec: the AccelFS holding DB (leveldb) or the raw device of the store (native).
    #[arg(long)]
    dev: Option<String>,
    /// The database: a host directory, a directory in the AccelFS on --dev, or `/` (native).
    db: String,
}

/// How keys and values are written on lines and arguments.
#[derive(Debug, Args, Clone, Copy)]
pub struct Encoding {
    /// Keys and values are hex (arguments, output and files).
    #[arg(long)]
    hex: bool,
}

#[derive(Debug, Subcommand)]
pub enum KvCommand {
    /// Create an empty database (native: format the device --dev, losing what it held).
    Init {
        #[command(flatten)]
        at: At,
        /// Go ahead when a database is already there (native: format it anew; leveldb: keep it).
        #[arg(long)]
        force: bool,
        /// Native: the segment size, a power of two from 1M to 1G. Each command that writes
        /// continues the log in a fresh segment, and each sorted run takes a segment of its own;
        /// segments are freed once flushed or merged.
        #[arg(long, default_value = "8M")]
        segment_size: String,
    },
    /// Store VALUE under KEY (synced before returning).
    Put {
        #[command(flatten)]
        at: At,
        key: String,
        value: String,
        #[command(flatten)]
        enc: Encoding,
    },
    /// Print KEY's value (escaped as in TSV, or hex); exit 1 when KEY is absent.
    Get {
        #[command(flatten)]
        at: At,
        key: String,
        #[command(flatten)]
        enc: Encoding,
    },
    /// Delete KEY (synced; deleting an absent key is not an error).
    Del {
        #[command(flatten)]
        at: At,
        key: String,
        #[command(flatten)]
        enc: Encoding,
    },
    /// Print key<TAB>value lines for keys in [--from, --to), in order or --reverse.
    Scan {
        #[command(flatten)]
        at: At,
        /// First key (inclusive).
        #[arg(long)]
        from: Option<String>,
        /// End key (exclusive).
        #[arg(long)]
        to: Option<String>,
        /// Print at most N lines.
        #[arg(long)]
        limit: Option<usize>,
        /// From the largest key down (the --limit largest keys of the range).
        #[arg(long)]
        reverse: bool,
        #[command(flatten)]
        enc: Encoding,
    },
    /// Load FILE's pairs in one checked pass (see the line formats above).
    Import {
        #[command(flatten)]
        at: At,
        file: PathBuf,
        /// JSON lines instead of TSV.
        #[arg(long)]
        jsonl: bool,
        #[command(flatten)]
        enc: Encoding,
    },
    /// Write every pair to FILE (stdout without it), in key order.
    Export {
        #[command(flatten)]
        at: At,
        file: Option<PathBuf>,
        /// JSON lines instead of TSV.
        #[arg(long)]
        jsonl: bool,
        #[command(flatten)]
        enc: Encoding,
    },
    /// Print the engine's statistics.
    Stats {
        #[command(flatten)]
        at: At,
    },
    /// Compact the whole key range (LevelDB only so far).
    Compact {
        #[command(flatten)]
        at: At,
    },
    /// Read every pair with checksums verified; report the count (non-zero exit on damage).
    Check {
        #[command(flatten)]
        at: At,
    },
}

/// An open database of either engine, closed by [`Kv::close`].
enum Kv {
    Level {
        db: Db,
        /// The AccelFS this command mounted, unmounted after the database closes.
        fs: Option<FileSystem>,
    },
    Native(Box<Store>),
}

/// Pairs read per scan call, so export and check hold a bounded number in memory.
const PAGE: usize = 4096;
/// Most key+value bytes of one native import batch.
const NATIVE_BATCH_BYTES: usize = 1 << 20;

impl Kv {
    fn open(at: &At, create: bool) -> anyhow::Result<Kv> {
        Self::open_with(at, create, false)
    }

    fn open_with(at: &At, create: bool, error_if_exists: bool) -> anyhow::Result<Kv> {
        match at.engine {
            Engine::Leveldb => {
                let opts = DbOptions {
                    create_if_missing: create,
                    error_if_exists,
                    ..DbOptions::default()
                };
                // LevelDB makes the directory (and its LOCK) before it finds no database, so
                // commands that only read look for CURRENT first and leave a mistyped path alone.
                let missing = || {
                    anyhow::anyhow!(
                        "no LevelDB database at `{}` (commands that write create one)",
                        at.db
                    )
                };
                let current = format!("{}/CURRENT", at.db.trim_end_matches('/'));
                let (loc, fs) = match &at.dev {
                    None => {
                        if !create && !std::path::Path::new(&current).exists() {
                            return Err(missing());
                        }
                        (Location::Dir(PathBuf::from(&at.db)), None)
                    }
                    Some(spec) => {
                        let fs = FileSystem::mount(open_dev(spec)?, MountOptions::default())
                            .with_context(|| format!("mounting the AccelFS on `{spec}`"))?;
                        if !create && fs.metadata(&current).is_err() {
                            fs.unmount()?;
                            return Err(missing());
                        }
                        let loc = Location::AccelFs {
                            fs: fs.clone(),
                            path: at.db.clone(),
                        };
                        (loc, Some(fs))
                    }
                };
                let db = Db::open(loc, &opts)
                    .with_context(|| format!("opening LevelDB database `{}`", at.db))?;
                Ok(Kv::Level { db, fs })
            }
            Engine::Native => {
                let spec = native_spec(at)?;
                let store = Store::open(open_dev(spec)?, StoreOptions::default().max_group_bytes)
                    .map_err(|e| match e {
                    StoreError::NoSuperblock { .. } => anyhow::anyhow!(
                        "`{spec}` holds no native store ({e}); format it with \
                             `kura kv init --engine native --dev {spec} /`"
                    ),
                    e => anyhow::Error::new(e)
                        .context(format!("opening the native store on `{spec}`")),
                })?;
                Ok(Kv::Native(Box::new(store)))
            }
        }
    }

    fn put(&self, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        match self {
            Kv::Level { db, .. } => db.put_sync(key, value)?,
            Kv::Native(s) => s.put(key, value, true)?,
        }
        Ok(())
    }

    fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(match self {
            Kv::Level { db, .. } => db.get(key)?,
            Kv::Native(s) => s.get(key)?,
        })
    }

    fn delete(&self, key: &[u8]) -> anyhow::Result<()> {
        match self {
            Kv::Level { db, .. } => {
                let mut b = kura_kv::WriteBatch::new();
                b.delete(key);
                db.write(b, true)?
            }
            Kv::Native(s) => s.delete(key, true)?,
        }
        Ok(())
    }

    /// Up to `limit` pairs in `[from, to)` in key order.
    fn scan_forward(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> anyhow::Result<Vec<kura_kv::Pair>> {
        Ok(match self {
            Kv::Level { db, .. } => db.scan(from, to, limit)?,
            Kv::Native(s) => s.scan(Some(from), to, limit, false)?,
        })
    }

    /// Calls `each` on every pair of `[from, to)` in key order, a page at a time.
    fn for_each(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        mut each: impl FnMut(&[u8], &[u8]) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        let mut from = from.to_vec();
        loop {
            let page = self.scan_forward(&from, to, PAGE)?;
            let full = page.len() == PAGE;
            for (k, v) in &page {
                if !each(k, v)? {
                    return Ok(());
                }
            }
            match page.last() {
                Some((last, _)) if full => {
                    // The smallest key after `last`.
                    from = last.clone();
                    from.push(0);
                }
                _ => return Ok(()),
            }
        }
    }

    fn close(self) -> anyhow::Result<()> {
        match self {
            Kv::Level { db, fs } => {
                db.close()?;
                if let Some(fs) = fs {
                    fs.unmount()?;
                }
            }
            Kv::Native(s) => s.close()?,
        }
        Ok(())
    }
}

fn native_spec(at: &At) -> anyhow::Result<&str> {
    let Some(spec) = at.dev.as_deref() else {
        bail!(
            "the native store runs on a raw device: name it with --dev SPEC and DB `/` \
             (as files on AccelFS it is not built yet)"
        );
    };
    if at.db != "/" {
        bail!(
            "the native store is the whole device --dev {spec}: DB must be `/`, not `{}`",
            at.db
        );
    }
    Ok(spec)
}

pub fn run(cmd: KvCommand) -> anyhow::Result<()> {
    match cmd {
        KvCommand::Init {
            at,
            force,
            segment_size,
        } => init(&at, force, &segment_size),
        KvCommand::Put {
            at,
            key,
            value,
            enc,
        } => {
            let kv = Kv::open(&at, true)?;
            kv.put(&arg_bytes(&key, enc)?, &arg_bytes(&value, enc)?)?;
            kv.close()
        }
        KvCommand::Get { at, key, enc } => {
            let kv = Kv::open(&at, false)?;
            let value = kv.get(&arg_bytes(&key, enc)?)?;
            kv.close()?;
            match value {
                Some(v) => {
                    println!("{}", encode_field(&v, enc.hex));
                    Ok(())
                }
                None => {
                    eprintln!("kura kv get: key `{key}` not found in {}", at.db);
                    std::process::exit(1);
                }
            }
        }
        KvCommand::Del { at, key, enc } => {
            let kv = Kv::open(&at, false)?;
            kv.delete(&arg_bytes(&key, enc)?)?;
            kv.close()
        }
        KvCommand::Scan {
            at,
            from,
            to,
            limit,
            reverse,
            enc,
        } => {
            let from = from.map(|f| arg_bytes(&f, enc)).transpose()?;
            let to = to.map(|t| arg_bytes(&t, enc)).transpose()?;
            let limit = limit.unwrap_or(usize::MAX);
            let kv = Kv::open(&at, false)?;
            let out = std::io::stdout();
            let mut out = BufWriter::new(out.lock());
            scan(
                &kv,
                from.as_deref(),
                to.as_deref(),
                limit,
                reverse,
                &mut |k, v| {
                    writeln!(
                        out,
                        "{}\t{}",
                        encode_field(k, enc.hex),
                        encode_field(v, enc.hex)
                    )?;
                    Ok(())
                },
            )?;
            out.flush()?;
            kv.close()
        }
        KvCommand::Import {
            at,
            file,
            jsonl,
            enc,
        } => import(&at, &file, format_of(jsonl, enc)),
        KvCommand::Export {
            at,
            file,
            jsonl,
            enc,
        } => export(&at, file.as_deref(), format_of(jsonl, enc)),
        KvCommand::Stats { at } => stats(&at),
        KvCommand::Compact { at } => {
            let kv = Kv::open(&at, false)?;
            match &kv {
                Kv::Level { db, .. } => db.compact()?,
                Kv::Native(s) => s.compact()?,
            }
            kv.close()?;
            println!("compacted {}", at.db);
            Ok(())
        }
        KvCommand::Check { at } => check(&at),
    }
}

fn init(at: &At, force: bool, segment_size: &str) -> anyhow::Result<()> {
    match at.engine {
        Engine::Leveldb => {
            Kv::open_with(at, true, !force)?.close()?;
            println!("{}: empty LevelDB database", at.db);
            Ok(())
        }
        Engine::Native => {
            let spec = native_spec(at)?;
            let size = kura_engine::spec::parse_size(segment_size)
                .map_err(|e| anyhow::anyhow!("--segment-size {segment_size}: {e}"))?;
            if !size.is_power_of_two() {
                bail!("--segment-size {segment_size} is not a power of two");
            }
            let opts = StoreOptions {
                segment_shift: size.trailing_zeros(),
                ..StoreOptions::default()
            };
            if !force {
                if let Ok(existing) = Store::open(open_dev(spec)?, 1 << 20) {
                    drop(existing);
                    bail!("`{spec}` already holds a native store; --force formats it anew");
                }
            }
            let store = Store::create(open_dev(spec)?, &opts)
                .with_context(|| format!("formatting `{spec}` as a native store"))?;
            store.close()?;
            println!("{spec}: empty native store");
            Ok(())
        }
    }
}

/// What a scan hands each pair to.
type PairSink<'a> = dyn FnMut(&[u8], &[u8]) -> anyhow::Result<()> + 'a;

/// Calls `each` on the pairs of `[from, to)`, at most `limit`, in order or reversed.
fn scan(
    kv: &Kv,
    from: Option<&[u8]>,
    to: Option<&[u8]>,
    limit: usize,
    reverse: bool,
    each: &mut PairSink<'_>,
) -> anyhow::Result<()> {
    if limit == 0 {
        return Ok(());
    }
    if let Kv::Native(s) = kv {
        // A page at a time, all from one snapshot: memory stays at a page however large the
        // store, and the store's view is not held while pairs are written out.
        let snap = s.snapshot();
        let (mut lo, mut hi) = (from.map(<[u8]>::to_vec), to.map(<[u8]>::to_vec));
        let mut left = limit;
        while left > 0 {
            let want = left.min(PAGE);
            let page = s.scan_at(&snap, lo.as_deref(), hi.as_deref(), want, reverse)?;
            for (k, v) in &page {
                each(k, v)?;
            }
            left -= page.len();
            match page.last() {
                Some((last, _)) if page.len() == want => {
                    if reverse {
                        hi = Some(last.clone());
                    } else {
                        // The smallest key after `last`.
                        let mut next = last.clone();
                        next.push(0);
                        lo = Some(next);
                    }
                }
                _ => break,
            }
        }
        return Ok(());
    }
    let from = from.unwrap_or(&[]);
    if !reverse {
        let mut left = limit;
        return kv.for_each(from, to, |k, v| {
            each(k, v)?;
            left -= 1;
            Ok(left > 0)
        });
    }
    // kura-kv's API iterates forward only: keep the last `limit` pairs of the range.
    let mut tail: VecDeque<kura_kv::Pair> = VecDeque::new();
    kv.for_each(from, to, |k, v| {
        if tail.len() == limit {
            tail.pop_front();
        }
        tail.push_back((k.to_vec(), v.to_vec()));
        Ok(true)
    })?;
    for (k, v) in tail.iter().rev() {
        each(k, v)?;
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineFormat {
    Tsv,
    Hex,
    Jsonl,
    JsonlHex,
}

fn format_of(jsonl: bool, enc: Encoding) -> LineFormat {
    match (jsonl, enc.hex) {
        (false, false) => LineFormat::Tsv,
        (false, true) => LineFormat::Hex,
        (true, false) => LineFormat::Jsonl,
        (true, true) => LineFormat::JsonlHex,
    }
}

fn arg_bytes(arg: &str, enc: Encoding) -> anyhow::Result<Vec<u8>> {
    if enc.hex {
        unhex(arg).with_context(|| format!("`{arg}` is not hex"))
    } else {
        Ok(arg.as_bytes().to_vec())
    }
}

fn encode_field(bytes: &[u8], hex: bool) -> String {
    if hex {
        to_hex(bytes)
    } else {
        escape(bytes)
    }
}

fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn unhex(s: &str) -> anyhow::Result<Vec<u8>> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        bail!("odd number of hex digits");
    }
    s.chunks(2)
        .map(|p| {
            let d = |c: u8| {
                (c as char)
                    .to_digit(16)
                    .ok_or_else(|| anyhow::anyhow!("`{}` is not a hex digit", c as char))
            };
            Ok((d(p[0])? * 16 + d(p[1])?) as u8)
        })
        .collect()
}

/// The TSV escaping of `bytes` (see [`ABOUT`]).
fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    out.push_str(&format!("\\x{:02x}", c as u32))
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Reverses [`escape`]; refuses raw tabs and unknown escapes.
fn unescape(field: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        match field.get(i + 1) {
            Some(b'\\') => out.push(b'\\'),
            Some(b't') => out.push(b'\t'),
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            Some(b'x') => {
                let hex = field
                    .get(i + 2..i + 4)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        format!("`\\x` at byte {} is not followed by two hex digits", i + 1)
                    })?;
                out.push(hex);
                i += 4;
                continue;
            }
            Some(&c) => {
                return Err(format!(
                    "unknown escape `\\{}` at byte {} (known: \\\\ \\t \\n \\r \\xHH)",
                    c.escape_ascii(),
                    i + 1
                ))
            }
            None => return Err("a line ends in a lone backslash".into()),
        }
        i += 2;
    }
    Ok(out)
}

/// One pair from one line of `format`.
fn parse_line(line: &[u8], format: LineFormat) -> Result<kura_kv::Pair, String> {
    match format {
        LineFormat::Tsv | LineFormat::Hex => {
            let mut fields = line.split(|&b| b == b'\t');
            let (Some(k), Some(v), None) = (fields.next(), fields.next(), fields.next()) else {
                return Err("expected exactly two tab-separated fields, key<TAB>value".into());
            };
            if format == LineFormat::Hex {
                let h = |f: &[u8], what: &str| {
                    std::str::from_utf8(f)
                        .map_err(|_| format!("{what} is not hex"))
                        .and_then(|s| unhex(s).map_err(|e| format!("{what} is not hex: {e}")))
                };
                Ok((h(k, "key")?, h(v, "value")?))
            } else {
                Ok((
                    unescape(k).map_err(|e| format!("key: {e}"))?,
                    unescape(v).map_err(|e| format!("value: {e}"))?,
                ))
            }
        }
        LineFormat::Jsonl | LineFormat::JsonlHex => {
            let obj: serde_json::Value =
                serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
            let field = |name: &str| -> Result<Vec<u8>, String> {
                let s = obj
                    .get(name)
                    .and_then(|v| v.as_str())
                    .ok_or_else(|| format!("no string field `{name}`"))?;
                if format == LineFormat::JsonlHex {
                    unhex(s).map_err(|e| format!("`{name}` is not hex: {e}"))
                } else {
                    Ok(s.as_bytes().to_vec())
                }
            };
            let map = obj.as_object().ok_or("not a JSON object")?;
            if let Some(other) = map.keys().find(|k| *k != "key" && *k != "value") {
                return Err(format!(
                    "unexpected field `{other}` (only `key` and `value`)"
                ));
            }
            Ok((field("key")?, field("value")?))
        }
    }
}

/// One output line for a pair (without the newline).
fn format_line(k: &[u8], v: &[u8], format: LineFormat) -> anyhow::Result<String> {
    Ok(match format {
        LineFormat::Tsv => format!("{}\t{}", escape(k), escape(v)),
        LineFormat::Hex => format!("{}\t{}", to_hex(k), to_hex(v)),
        LineFormat::JsonlHex => {
            serde_json::json!({"key": to_hex(k), "value": to_hex(v)}).to_string()
        }
        LineFormat::Jsonl => {
            let text = |b: &[u8]| {
                std::str::from_utf8(b).map(str::to_string).map_err(|_| {
                    anyhow::anyhow!(
                        "key {} holds bytes that are not UTF-8, which JSON strings cannot carry: \
                         export with --jsonl --hex (or TSV)",
                        escape(k)
                    )
                })
            };
            serde_json::json!({"key": text(k)?, "value": text(v)?}).to_string()
        }
    })
}

/// Files from this size on get a progress bar (on a terminal).
const PROGRESS_FROM: u64 = 4 << 20;

fn import(at: &At, file: &std::path::Path, format: LineFormat) -> anyhow::Result<()> {
    let f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = (size >= PROGRESS_FROM).then(|| progress("import", size));
    let mut reader = BufReader::new(f);
    let mut pairs = Vec::new();
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .with_context(|| format!("reading {}", file.display()))?;
        if n == 0 {
            break;
        }
        number += 1;
        if let Some(bar) = &bar {
            bar.inc(n as u64);
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.is_empty() {
            continue;
        }
        let pair = parse_line(text, format).map_err(|e| {
            anyhow::anyhow!(
                "{} line {number}: {e}; nothing was imported",
                file.display()
            )
        })?;
        pairs.push(pair);
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let count = pairs.len();
    let kv = Kv::open(at, true)?;
    match &kv {
        Kv::Level { db, .. } => {
            let mut batch = kura_kv::WriteBatch::new();
            for (k, v) in &pairs {
                batch.put(k, v);
            }
            db.write(batch, true)?;
        }
        Kv::Native(s) => {
            let mut batch = kura_store::WriteBatch::new();
            let mut bytes = 0;
            for (k, v) in &pairs {
                if bytes + k.len() + v.len() > NATIVE_BATCH_BYTES && !batch.is_empty() {
                    s.write(std::mem::take(&mut batch), false)?;
                    bytes = 0;
                }
                bytes += k.len() + v.len();
                batch.put(k, v);
            }
            if !batch.is_empty() {
                s.write(batch, false)?;
            }
            s.sync()?;
        }
    }
    kv.close()?;
    eprintln!("imported {count} pairs from {}", file.display());
    Ok(())
}

fn export(at: &At, file: Option<&std::path::Path>, format: LineFormat) -> anyhow::Result<()> {
    let kv = Kv::open(at, false)?;
    let mut out: Box<dyn Write> = match file {
        Some(p) => Box::new(BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    // The total is unknown up front: a spinner counts the bytes written (to a file only, so
    // it never mixes with the data on stdout; indicatif draws nothing when stderr is no terminal).
    let bar = file.map(|_| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>8} {spinner} {bytes} {bytes_per_sec} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.set_message("export");
        bar
    });
    let mut count = 0u64;
    let mut written = 0u64;
    kv.for_each(&[], None, |k, v| {
        let line = format_line(k, v, format)?;
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
        count += 1;
        written += line.len() as u64 + 1;
        if let Some(bar) = &bar {
            bar.set_position(written);
        }
        Ok(true)
    })?;
    out.flush()?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    kv.close()?;
    if let Some(p) = file {
        eprintln!("exported {count} pairs to {}", p.display());
    }
    Ok(())
}

fn stats(at: &At) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let kv = Kv::open(at, false)?;
    let mut text = String::new();
    match &kv {
        Kv::Level { db, .. } => {
            writeln!(text, "engine: leveldb")?;
            for name in ["leveldb.approximate-memory-usage", "leveldb.stats"] {
                if let Some(v) = db.property(name)? {
                    writeln!(text, "{name}: {}", v.trim_end())?;
                }
            }
        }
        Kv::Native(s) => {
            let st = s.stats();
            writeln!(text, "engine: native")?;
            writeln!(text, "memtable keys: {}", st.memtable_keys)?;
            writeln!(text, "memtable versions: {}", st.memtable_versions)?;
            writeln!(text, "memtable bytes: {}", st.memtable_bytes)?;
            writeln!(text, "runs per level: {:?}", st.runs_per_level)?;
            writeln!(
                text,
                "segment slots used: {} of {}",
                st.slots_used, st.slot_count
            )?;
            writeln!(text, "log frames replayed at open: {}", st.replayed_frames)?;
            writeln!(text, "replay stopped at: {}", s.replay_stop())?;
            if let Some(d) = s.damage() {
                writeln!(text, "damaged superblock copy (the other was used): {d}")?;
            }
        }
    }
    kv.close()?;
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

fn check(at: &At) -> anyhow::Result<()> {
    let kv = Kv::open(at, false)?;
    let (mut keys, mut bytes) = (0u64, 0u64);
    kv.for_each(&[], None, |k, v| {
        keys += 1;
        bytes += (k.len() + v.len()) as u64;
        Ok(true)
    })
    .context("reading every pair")?;
    if let Kv::Native(s) = &kv {
        if let Some(d) = s.damage() {
            println!("warning: one superblock copy is damaged (the other was used): {d}");
        }
    }
    kv.close()?;
    println!("ok: {keys} keys, {bytes} bytes of keys and values read and verified");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255u8).chain("é\\\t\n".bytes()).collect();
        let e = escape(&all);
        assert!(!e.contains('\t') && !e.contains('\n'));
        assert_eq!(unescape(e.as_bytes()).unwrap(), all);
    }

    proptest::proptest! {
        #[test]
        fn every_format_round_trips_any_pair(
            k in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            v in proptest::collection::vec(proptest::num::u8::ANY, 0..80),
        ) {
            for format in [LineFormat::Tsv, LineFormat::Hex, LineFormat::JsonlHex, LineFormat::Jsonl] {
                let Ok(line) = format_line(&k, &v, format) else {
                    // Only JSON text refuses, and only bytes that are not UTF-8.
                    proptest::prop_assert!(format == LineFormat::Jsonl);
                    proptest::prop_assert!(std::str::from_utf8(&k).is_err() || std::str::from_utf8(&v).is_err());
                    continue;
                };
                proptest::prop_assert!(!line.contains('\n'));
                proptest::prop_assert_eq!(parse_line(line.as_bytes(), format), Ok((k.clone(), v.clone())));
            }
        }

        #[test]
        fn parsing_any_line_gives_a_pair_or_a_message(
            line in proptest::collection::vec(proptest::num::u8::ANY, 0..120),
        ) {
            for format in [LineFormat::Tsv, LineFormat::Hex, LineFormat::JsonlHex, LineFormat::Jsonl] {
                if let Err(e) = parse_line(&line, format) {
                    proptest::prop_assert!(!e.is_empty());
                }
            }
        }
    }

    #[test]
    fn unescape_refuses_unknown_and_short_escapes() {
        assert!(unescape(b"a\\q").is_err());
        assert!(unescape(b"a\\x4").is_err());
        assert!(unescape(b"a\\").is_err());
    }
}
