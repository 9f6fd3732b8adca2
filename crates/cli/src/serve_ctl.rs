//! The control socket of a running `kura serve` (`--ctl PATH`) and its client,
//! `kura serve ctl --socket PATH show|set|resize`: per-export QoS limits changed while serving,
//! and exports reopened at a new size, without restarting the server or cutting its clients.
//!
//! **Access.** The socket is a Unix-domain socket created mode 0600 (the umask is narrowed around
//! `bind`, as for `--unix`), so only the user running the server (and root) can connect; the file
//! mode is the whole authentication, and nothing else listens. A stale socket nobody listens on
//! is replaced; anything else at the path is refused and left alone; the file is removed when
//! the server stops.
//!
//! **Protocol.** One command per connection: the client writes one line (at most 4 KiB) and
//! reads the answer until the server closes. The answer's first line is `ok` or
//! `error: MESSAGE`; after `ok` come the command's result lines.
//!
//! | line | answer |
//! |------|--------|
//! | `show` | one line per export, whatever its door: `NAME read_iops=.. read_bw=.. write_iops=.. write_bw=.. burst=..us kind=nbd\|ublk\|vhost-user [drive=OPENER]` (`drive=` for exports sharing a drive, naming the export that opened it) |
//! | `set NAME KEY=VALUE[,KEY=VALUE...]` | the export's limits after the change (given keys replaced, others kept; `off` lifts one) |
//! | `resize NAME SIZE [force]` | the export's new size in bytes (see [`crate::resize`]) |
//!
//! **Doors.** Limits sit under the export (a qos drive over the opened drive), so they hold
//! whichever door serves it: NBD, ublk or vhost-user. A resize reopens the drive on the thread
//! that owns it, through a hook each door provides ([`Resizer`]): NBD clients see the new size
//! when they next connect; a vhost-user frontend is told the new size from its next connection
//! on (no config-change message: see `kura_vhost::DeviceSwapper::swap`); a ublk export's kernel
//! device takes the new size at once through the driver's UPDATE_SIZE (Linux 6.16+), and where
//! the driver has none (6.12) the resize is refused before the image changes.

use crate::serve_share::{Door, Opened};
use anyhow::{bail, Context};
use kura_engine::{BlockDevice, BlockingIo};
use kura_vdrive::{Qos, QosHandle, QosLimits};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Longest command line a client may send.
const MAX_LINE: u64 = 4096;
/// How long a client has to send its line, and the server to answer.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A change of an export's device, run on the thread that owns it once its requests in flight
/// are answered.
pub type Change = Box<dyn FnOnce(&mut Box<dyn BlockDevice>) -> Result<(), ChangeError> + Send>;

/// Why a [`Change`] failed.
pub struct ChangeError {
    pub message: String,
    /// The device left in the slot cannot serve any more.
    pub lost: bool,
}

/// A door's hook that runs a [`Change`] on a running export and answers its new size in bytes.
pub type Resizer = Box<dyn Fn(Change) -> Result<u64, String> + Send + Sync>;

/// The resize hook of NBD export `name`.
pub fn nbd_resizer(swapper: kura_nbd::DeviceSwapper, name: &str) -> Resizer {
    let name = name.to_string();
    Box::new(move |change: Change| {
        swapper.swap(
            &name,
            Box::new(move |slot: &mut Box<dyn BlockDevice>| {
                change(slot).map_err(|e| kura_nbd::SwapError {
                    message: e.message,
                    lost: e.lost,
                })
            }),
        )
    })
}

/// The resize hook of a vhost-user export.
pub fn vhost_resizer(swapper: kura_vhost::DeviceSwapper) -> Resizer {
    Box::new(move |change: Change| {
        swapper.swap(Box::new(move |slot: &mut Box<dyn BlockDevice>| {
            change(slot).map_err(|e| kura_vhost::SwapError {
                message: e.message,
                lost: e.lost,
            })
        }))
    })
}

/// One export as the control socket knows it.
struct Entry {
    name: String,
    door: Door,
    spec: String,
    read_only: bool,
    /// The export that opened the drive, when several exports share it.
    shared: Option<String>,
    qos: Option<QosHandle>,
    resizer: Option<Resizer>,
}

/// What the control socket can change: each export's limits, and its size through `resize`.
pub struct Controls {
    /// `--qos` limits not yet given to an export.
    asked: Vec<(String, QosLimits)>,
    /// Every export goes behind a qos drive (a control socket may limit any of them later).
    live: bool,
    exports: Vec<Entry>,
}

impl Controls {
    /// Controls for `--qos NAME=LIMITS` arguments; `live` when a control socket will be served.
    pub fn new(qos: &[String], live: bool) -> anyhow::Result<Self> {
        let mut asked = Vec::new();
        for arg in qos {
            let (name, limits) = arg
                .split_once('=')
                .with_context(|| format!("--qos `{arg}` is not NAME=KEY=VALUE,..."))?;
            let limits = QosLimits::default()
                .parse_list(limits)
                .with_context(|| format!("--qos {arg}"))?;
            asked.retain(|(n, _): &(String, QosLimits)| n != name);
            asked.push((name.to_string(), limits));
        }
        Ok(Controls {
            asked,
            live,
            exports: Vec::new(),
        })
    }

    /// The export with its device behind a qos drive when it has `--qos` limits or limits may be
    /// set later, else as it is. Every door's exports come through here, so limits hold
    /// whichever door serves them.
    pub fn export(&mut self, mut o: Opened) -> Opened {
        let qos = self.handle(&o.name);
        self.exports.push(Entry {
            name: o.name.clone(),
            door: o.door,
            spec: o.spec.clone(),
            read_only: o.read_only,
            shared: o.shared.clone(),
            qos: qos.clone(),
            resizer: None,
        });
        if let Some(handle) = qos {
            o.dev = Box::new(Qos::new(o.dev, handle));
        }
        o
    }

    /// The limits handle export `name` is to have, if any (taken from `--qos`).
    fn handle(&mut self, name: &str) -> Option<QosHandle> {
        let asked = self.asked.iter().position(|(n, _)| n == name);
        let limits = match asked {
            Some(i) => self.asked.remove(i).1,
            None if self.live => QosLimits::default(),
            None => return None,
        };
        Some(QosHandle::new(limits))
    }

    fn entry(&self, name: &str) -> Result<&Entry, String> {
        self.exports
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| format!("no export named `{name}`"))
    }

    /// Fails when a `--qos` names no export.
    pub fn check_all_used(&self) -> anyhow::Result<()> {
        match self.asked.first() {
            Some((name, _)) => bail!("--qos {name}=...: there is no export named `{name}`"),
            None => Ok(()),
        }
    }

    /// Lets `resize` reopen export `name` through its door's hook.
    pub fn enable_resize(&mut self, name: &str, resizer: Resizer) {
        if let Some(e) = self.exports.iter_mut().find(|e| e.name == name) {
            e.resizer = Some(resizer);
        }
    }

    /// Resizes export `name`'s image and reopens the export on its driver thread, once the
    /// requests sent before have been answered: flush, resize (refused as
    /// [`crate::resize::resize_image`] says), close, open the same spec again behind the same
    /// limits. The image is closed before it is opened again because its lock belongs to the
    /// open file; if the reopen fails the export fails every later request (and says why).
    fn resize(&self, name: &str, size: u64, force: bool) -> Result<u64, String> {
        let e = self.entry(name)?;
        if e.read_only {
            return Err(format!("export `{name}` is read-only"));
        }
        if let Some(opener) = &e.shared {
            return Err(format!(
                "export `{name}` shares its drive with other exports (opened by `{opener}`); \
                 resizing a shared drive is not supported: stop the server and use `kura drive resize`"
            ));
        }
        let resizer = e.resizer.as_ref().ok_or_else(|| match e.door {
            Door::Ublk => format!(
                "export `{name}` is a ublk device this server has no resize hook for (its \
                 kernel device would need UPDATE_SIZE)"
            ),
            _ => "this server cannot resize exports".to_string(),
        })?;
        let path = crate::resize::image_path(&e.spec).map_err(|e| format!("{e:#}"))?;
        let spec = e.spec.clone();
        let handle = e.qos.clone();
        let swap: Change = Box::new(move |slot: &mut Box<dyn BlockDevice>| {
            let kept = |message: String| ChangeError {
                message,
                lost: false,
            };
            slot.flush_all()
                .map_err(|e| kept(format!("flushing before the resize: {e}")))?;
            let r = crate::resize::resize_image(&path, size, force)
                .map_err(|e| kept(format!("{e:#}")))?;
            if let Some(at) = r.cut_data_from {
                eprintln!(
                    "kura serve: warning: resize --force cut the data of {} from byte {at} \
                     to {} (now lost)",
                    path.display(),
                    r.old
                );
            }
            let placeholder = kura_engine::open("null:4K").map_err(|e| kept(e.to_string()))?;
            drop(std::mem::replace(slot, placeholder));
            match crate::dev::open_dev(&spec) {
                Ok(dev) => {
                    *slot = match handle {
                        Some(h) => Box::new(Qos::new(dev, h)),
                        None => dev,
                    };
                    Ok(())
                }
                Err(e) => Err(ChangeError {
                    message: format!("reopening `{spec}` after the resize: {e:#}"),
                    lost: true,
                }),
            }
        });
        resizer(swap)
    }

    /// Runs one command line; the answer's lines after `ok`, or the error.
    fn execute(&self, line: &str) -> Result<Vec<String>, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["show"] => Ok(self.exports.iter().map(show).collect()),
            ["set", name, settings @ ..] if !settings.is_empty() => {
                let handle = self.entry(name)?.qos.as_ref().ok_or_else(|| {
                    format!("export `{name}` has no limits layer (serve with --ctl or --qos {name}=...)")
                })?;
                let limits = handle
                    .limits()
                    .parse_list(&settings.join(","))
                    .map_err(|e| e.to_string())?;
                handle.set(limits);
                Ok(vec![format!("{name} {limits}")])
            }
            ["resize", name, size, rest @ ..] => {
                let force = match rest {
                    [] => false,
                    ["force"] => true,
                    _ => return Err(format!("resize takes NAME SIZE [force], not `{line}`")),
                };
                let bytes = kura_engine::spec::parse_size(size)?;
                let new = self.resize(name, bytes, force)?;
                Ok(vec![format!("{name} size={new}")])
            }
            _ => Err(format!(
                "unknown command `{line}` (show | set NAME KEY=VALUE,... | resize NAME SIZE [force])"
            )),
        }
    }
}

/// `show`'s line for one export.
fn show(e: &Entry) -> String {
    let limits = match &e.qos {
        Some(h) => h.limits().to_string(),
        None => "unlimited".to_string(),
    };
    let mut line = format!("{} {limits} kind={}", e.name, e.door.name());
    if let Some(opener) = &e.shared {
        line.push_str(&format!(" drive={opener}"));
    }
    line
}

/// The listening control socket; its file is removed when this is dropped.
pub struct CtlSocket {
    path: PathBuf,
}

impl Drop for CtlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on `path` (mode 0600) and answers commands on a thread of its own until the process
/// ends.
pub fn listen(path: &Path, controls: Arc<Controls>) -> anyhow::Result<CtlSocket> {
    let listener =
        kura_nbd::bind_unix(path).with_context(|| format!("control socket {}", path.display()))?;
    let socket = CtlSocket {
        path: path.to_path_buf(),
    };
    std::thread::Builder::new()
        .name("serve-ctl".into())
        .spawn(move || accept(listener, &controls))
        .context("starting the control socket's thread")?;
    Ok(socket)
}

fn accept(listener: UnixListener, controls: &Controls) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        // One client at a time: commands are rare and each is short (a resize waits for the
        // export's requests in flight), so answering in order keeps changes serialised.
        if let Err(e) = answer(stream, controls) {
            eprintln!("kura serve: control socket: {e}");
        }
    }
}

fn answer(stream: UnixStream, controls: &Controls) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_LINE)).read_line(&mut line)?;
    let line = line.trim();
    let reply = match controls.execute(line) {
        Ok(lines) => {
            eprintln!("kura serve: control: {line}");
            std::iter::once("ok".to_string()).chain(lines).collect()
        }
        Err(e) => vec![format!("error: {e}")],
    };
    let mut w = &stream;
    for l in reply {
        writeln!(w, "{l}")?;
    }
    w.flush()
}

/// `kura serve`'s subcommand.
#[derive(Debug, clap::Subcommand)]
pub enum ServeSub {
    /// Talk to a running server's control socket (`kura serve --ctl PATH`): show or change
    /// export limits, resize exports.
    Ctl(CtlArgs),
}

pub fn run_sub(sub: &ServeSub) -> anyhow::Result<()> {
    match sub {
        ServeSub::Ctl(args) => run(args),
    }
}

#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The server's control socket (`kura serve --ctl PATH`).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CtlCommand {
    /// Every export's QoS limits.
    Show,
    /// Change an export's limits while it serves: KEY=VALUE settings (iops, bw, read_iops,
    /// write_iops, read_bw, write_bw, burst; `off` lifts a limit), replacing those given.
    Set {
        name: String,
        #[arg(required = true)]
        settings: Vec<String>,
    },
    /// Resize an export's image and reopen the export at the new size; clients see it when they
    /// next connect. Shrinking below data the image holds needs --force.
    Resize {
        name: String,
        /// New size in bytes (K/M/G/T suffixes).
        #[arg(long)]
        size: String,
        /// Shrink even though data past the new end is lost.
        #[arg(long)]
        force: bool,
    },
}

/// `kura serve ctl ...`: sends one command, prints the answer.
pub fn run(args: &CtlArgs) -> anyhow::Result<()> {
    let line = match &args.command {
        CtlCommand::Show => "show".to_string(),
        CtlCommand::Set { name, settings } => format!("set {name} {}", settings.join(",")),
        CtlCommand::Resize { name, size, force } => {
            format!("resize {name} {size}{}", if *force { " force" } else { "" })
        }
    };
    if line.contains('\n') {
        bail!("a name or setting may not contain a line break");
    }
    let mut stream = UnixStream::connect(&args.socket).with_context(|| {
        format!(
            "connecting to the control socket {} (is `kura serve --ctl` running?)",
            args.socket.display()
        )
    })?;
    stream.set_read_timeout(Some(IO_TIMEOUT * 2))?;
    writeln!(stream, "{line}")?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .context("reading the server's answer")?;
    let mut lines = answer.lines();
    match lines.next() {
        Some("ok") => {
            for l in lines {
                println!("{l}");
            }
            Ok(())
        }
        Some(e) if e.starts_with("error: ") => bail!("{}", &e["error: ".len()..]),
        _ => bail!("the server sent no answer"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(name: &str, door: Door, shared: Option<&str>) -> Opened {
        Opened {
            door,
            name: name.into(),
            spec: "mem:1M".into(),
            read_only: false,
            dev: kura_engine::open("mem:1M").unwrap(),
            shared: shared.map(Into::into),
        }
    }

    #[test]
    fn commands_change_and_show_limits_and_bad_ones_say_why() {
        let mut c = Controls::new(&["a=iops=5".into()], true).unwrap();
        let a = c.export(opened("a", Door::Nbd, None));
        assert!(a.dev.describe().starts_with("qos("), "{}", a.dev.describe());
        c.export(opened("b", Door::Ublk, None));
        c.export(opened("v", Door::VhostUser, Some("b")));
        let out = c.execute("set a iops=100 bw=1M").unwrap();
        assert!(out[0].starts_with("a read_iops=100 "), "{out:?}");
        let h = c.exports[0].qos.clone().unwrap();
        assert_eq!(h.limits().write.bw, Some(1048576.0));
        c.execute("set b read_iops=7").unwrap();
        assert_eq!(
            c.exports[1].qos.as_ref().unwrap().limits().read.iops,
            Some(7.0)
        );
        let shown = c.execute("show").unwrap();
        assert_eq!(shown.len(), 3);
        assert!(shown[0].ends_with(" kind=nbd"), "{shown:?}");
        assert!(shown[1].starts_with("b read_iops=7 "), "{shown:?}");
        assert!(shown[1].ends_with(" kind=ublk"), "{shown:?}");
        assert!(shown[2].ends_with(" kind=vhost-user drive=b"), "{shown:?}");
        assert!(c.execute("set a iops=0").unwrap_err().contains("positive"));
        assert!(c
            .execute("set zz iops=1")
            .unwrap_err()
            .contains("no export"));
        assert!(c.execute("set a").unwrap_err().contains("unknown command"));
        assert!(c
            .execute("resize a 1G")
            .unwrap_err()
            .contains("cannot resize"));
        assert!(c
            .execute("resize b 1G")
            .unwrap_err()
            .contains("UPDATE_SIZE"));
        assert!(c
            .execute("resize v 1G")
            .unwrap_err()
            .contains("shares its drive"));
        assert!(c.execute("").unwrap_err().contains("unknown command"));
        // Without a control socket only exports with --qos are wrapped.
        let mut c = Controls::new(&["a=iops=5".into(), "x=bw=1M".into()], false).unwrap();
        assert!(c
            .export(opened("a", Door::Nbd, None))
            .dev
            .describe()
            .starts_with("qos("));
        assert!(c
            .export(opened("b", Door::Nbd, None))
            .dev
            .describe()
            .starts_with("mem"));
        assert!(c
            .execute("set b iops=1")
            .unwrap_err()
            .contains("no limits layer"));
        assert!(c.check_all_used().unwrap_err().to_string().contains("`x`"));
        let bad = |q: &str| Controls::new(&[q.into()], false).err().unwrap().to_string();
        assert!(bad("a").contains("NAME=KEY=VALUE"));
        assert!(bad("a=iops=fast").contains("--qos a=iops=fast"));
    }
}
