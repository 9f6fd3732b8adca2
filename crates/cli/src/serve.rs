//! `kura serve NAME=SPEC[:ro]...`: exports kura devices over NBD (newstyle fixed handshake)
//! until SIGINT, SIGTERM or SIGHUP, then stops accepting, lets in-flight requests finish (or
//! cuts them after a grace period), flushes every export, prints each export's counters on
//! stderr, one line per layer of its device stack (`BlockDevice::stats`; also every
//! `--stats-interval` seconds while serving), and exits 0; a second signal exits at once with
//! status 130. Binds to loopback unless `--listen` says otherwise, or to a Unix socket
//! (mode 0600) with `--unix`. With `--tls-cert` and `--tls-key` every client must start TLS
//! (`NBD_OPT_STARTTLS`) before anything else, and with `--tls-ca` also present a client
//! certificate signed by that CA; with `--tls-psk` clients authenticate with a pre-shared key
//! instead (TLS-PSK, psktool files, when this kura was built with OpenSSL); without TLS a
//! non-loopback address is refused unless `--insecure` acknowledges that the traffic is
//! plaintext.
//!
//! Every export, whatever its door (NBD, `--ublk`, `--vhost-user`), is opened by
//! [`crate::serve_share::open_all`] (so `NAME=@OTHER` can put one drive behind several doors)
//! and goes through [`crate::serve_ctl::Controls`] (so `--qos` and `kura serve ctl` reach it).

use crate::serve_share::Door;
use anyhow::{bail, Context};
use kura_engine::{BlockingIo, DriveStats};
use kura_nbd::psk::PskServer;
use kura_nbd::{bind_unix, serve, serve_tls, serve_tls_psk, serve_unix, Export, ServeOptions};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "One drive behind several exports: an export given as NAME=@OTHER (NBD, --ublk \
or --vhost-user, `:ro` allowed) serves the drive export OTHER opened instead of opening one, e.g. \
`kura serve disk=uring:/dev/nvme0n1 --ublk fast=@disk` serves one namespace as NBD export `disk` \
and as /dev/ublkbN. The drive is opened once and shared by one driver; each export keeps its own \
--qos limits. Requests from different exports are in flight together and complete in any \
order: nothing orders overlapping ranges written through two exports, so a writer must wait for \
its write to complete before a reader through another export can expect to see it. A flush \
through any export covers writes completed through every export. Shared drives cannot be \
resized while serving."
)]
pub struct ServeArgs {
    /// Exports as NAME=SPEC, with `:ro` appended for a read-only export, e.g.
    /// `disk=file:/tmp/a.img` `golden=uring:/tmp/b.img:ro`, or NAME=@OTHER for the drive of
    /// export OTHER (below). None when only --vhost-user or --ublk disks are served.
    #[arg(required_unless_present_any = ["vhost_user", "ublk"])]
    exports: Vec<String>,
    /// Address to listen on.
    #[arg(long, default_value = kura_nbd::server::DEFAULT_ADDR)]
    listen: SocketAddr,
    /// Listen on a Unix-domain socket at PATH instead of TCP (created mode 0600, so only this
    /// user can connect; a stale socket is replaced, any other file is refused). Clients connect
    /// with `nbd+unix:///EXPORT?socket=PATH`.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["tls_cert", "tls_psk", "insecure"])]
    unix: Option<PathBuf>,
    /// Allow a non-loopback address without TLS (the traffic is not encrypted).
    #[arg(long)]
    insecure: bool,
    /// PEM certificate chain: require TLS (NBD_OPT_STARTTLS) from every client. Clients then
    /// connect with `remote:HOST:PORT/EXPORT?tls=1&ca=CA.pem`, or libnbd's
    /// `nbds://HOST:PORT/EXPORT?tls-certificates=DIR` (DIR holding ca-cert.pem).
    #[arg(long, requires = "tls_key", value_name = "PATH")]
    tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "PATH")]
    tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): require every client to present a certificate signed by one
    /// (mutual TLS). A client without one is refused during the TLS handshake, before it learns
    /// any export name. libnbd clients put client-cert.pem and client-key.pem next to
    /// ca-cert.pem in their tls-certificates directory.
    #[arg(long, requires = "tls_cert", value_name = "PATH")]
    tls_ca: Option<PathBuf>,
    /// Require TLS with pre-shared keys (TLS-PSK) from a psktool file (`identity:hexkey`
    /// lines), as nbdkit and qemu-nbd take: a client with an unknown identity or the wrong key
    /// fails the TLS handshake before it learns any export name. libnbd clients connect with
    /// `nbds://IDENTITY@HOST:PORT/EXPORT?tls-psk-file=KEYS`. Not with --tls-cert: one server
    /// uses one kind of TLS. Needs a kura built with OpenSSL (libssl-dev, pkg-config).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["tls_cert", "tls_key", "tls_ca"])]
    tls_psk: Option<PathBuf>,
    /// List each export's device spec as its description (NBD_OPT_LIST, nbdinfo). Off by
    /// default: specs carry host paths, and listing is answered to any client that connects.
    #[arg(long)]
    describe: bool,
    /// Connections served at once.
    #[arg(long, default_value_t = 256)]
    max_clients: usize,
    /// Connections one client address may have open at once (TCP only).
    #[arg(long, default_value_t = 32)]
    max_per_peer: usize,
    /// Seconds a client has for the whole handshake, TLS included; then it is cut.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    handshake_deadline: u64,
    /// Seconds a connection may go without sending a request before it is closed (0: never).
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    idle_timeout: u64,
    /// MiB of request and reply payload all connections together may have in flight (at least
    /// 32, the largest request). Past it the server stops reading from clients until replies
    /// go out.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    max_in_flight_mib: u64,
    /// Advertise a minimum block size of 1 and serve unaligned requests from every client by
    /// read-modify-write. By default the minimum is the device's block size, and clients that
    /// agreed to it get EINVAL for unaligned requests, so one client's 1-byte writes cannot
    /// serialise everyone's I/O.
    #[arg(long)]
    byte_granular: bool,
    /// Offer no `base:allocation` metadata context, so clients cannot ask which ranges are
    /// holes (NBD_CMD_BLOCK_STATUS); structured replies are still offered. For comparisons.
    #[arg(long)]
    no_block_status: bool,
    /// Also print every export's counters (one stderr line per layer of its device stack, as on
    /// stop) every SECS seconds while serving.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    stats_interval: Option<u64>,
    /// Limits of an export (NBD, --ublk or --vhost-user) as NAME=KEY=VALUE,... (iops, bw,
    /// read_iops, write_iops, read_bw, write_bw, burst; `docs/nbd-serve.md`); repeatable.
    /// Requests above them are held back.
    #[arg(long, value_name = "NAME=LIMITS")]
    qos: Vec<String>,
    /// Serve a control socket at PATH (mode 0600) through which `kura serve ctl` shows and
    /// changes the limits of every export and resizes NBD, vhost-user and (Linux 6.16+) ublk
    /// exports while serving.
    #[arg(long, value_name = "PATH")]
    ctl: Option<PathBuf>,
    #[command(subcommand)]
    sub: Option<crate::serve_ctl::ServeSub>,
    #[command(flatten)]
    vhost: crate::serve_vhost::VhostArgs,
    #[command(flatten)]
    ublk: crate::serve_ublk::UblkArgs,
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    if let Some(sub) = &args.sub {
        return crate::serve_ctl::run_sub(sub);
    }
    let psk = match &args.tls_psk {
        Some(path) => Some(
            PskServer::from_file(path).with_context(|| format!("--tls-psk {}", path.display()))?,
        ),
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            kura_nbd::tls::server_config_with_clients(cert, key, args.tls_ca.as_deref())
                .context("loading the TLS certificates")?,
        ),
        _ => None,
    };
    let encrypted = tls.is_some() || psk.is_some();
    if args.unix.is_none() && !args.listen.ip().is_loopback() && !args.insecure && !encrypted {
        bail!(
            "{} is not a loopback address and NBD traffic would not be encrypted: give \
             --tls-cert and --tls-key (or --tls-psk), or pass --insecure to serve it in \
             plaintext anyway",
            args.listen
        );
    }
    let mut controls = crate::serve_ctl::Controls::new(&args.qos, args.ctl.is_some())?;
    let doors = args
        .exports
        .iter()
        .map(|a| (Door::Nbd, a.as_str()))
        .chain(
            args.vhost
                .vhost_user
                .iter()
                .map(|a| (Door::VhostUser, a.as_str())),
        )
        .chain(args.ublk.ublk.iter().map(|a| (Door::Ublk, a.as_str())));
    let (mut nbd, mut vhost, mut ublk) = (Vec::new(), Vec::new(), Vec::new());
    for opened in crate::serve_share::open_all(&doors.collect::<Vec<_>>())? {
        let opened = controls.export(opened);
        match opened.door {
            Door::Nbd => nbd.push(opened),
            Door::VhostUser => vhost.push(opened),
            Door::Ublk => ublk.push(opened),
        }
    }
    controls.check_all_used()?;
    let vhost = crate::serve_vhost::start(&args.vhost, vhost)?;
    for server in &vhost {
        controls.enable_resize(
            server.name(),
            crate::serve_ctl::vhost_resizer(server.swapper()),
        );
    }
    let ublk = crate::serve_ublk::start(&args.ublk, ublk)?;
    for (name, hook) in crate::serve_ublk::resizers(&ublk) {
        controls.enable_resize(&name, hook);
    }
    if nbd.is_empty() {
        let _ctl = listen_ctl(args, controls)?;
        wait_for_stop(args.stats_interval, || {
            crate::serve_vhost::print_stats(&vhost)
        })?;
        let mut failed = Vec::new();
        crate::serve_ublk::stop(ublk, &mut failed);
        crate::serve_vhost::stop(vhost, &mut failed);
        return stopped(failed);
    }
    let nbd_names: Vec<String> = nbd.iter().map(|o| o.name.clone()).collect();
    let exports: Vec<Export> = nbd
        .into_iter()
        .map(|o| {
            let description = if args.describe { o.spec.as_str() } else { "" };
            Export::new(&o.name, o.dev)
                .read_only(o.read_only)
                .description(description)
        })
        .collect();
    let opts = ServeOptions {
        max_clients: args.max_clients,
        max_per_peer: args.max_per_peer,
        handshake_deadline: Duration::from_secs(args.handshake_deadline.max(1)),
        idle_timeout: (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout)),
        max_total_in_flight_bytes: args.max_in_flight_mib.max(32) << 20,
        device_min_block_size: !args.byte_granular,
        block_status: !args.no_block_status,
        ..ServeOptions::default()
    };
    let (server, url) = match &args.unix {
        Some(path) => {
            let listener =
                bind_unix(path).with_context(|| format!("listening on {}", path.display()))?;
            let server = serve_unix(listener, path.clone(), exports, opts)?;
            (server, format!("nbd+unix:///?socket={}", path.display()))
        }
        None => {
            let listener = TcpListener::bind(args.listen)
                .with_context(|| format!("listening on {}", args.listen))?;
            let server = match (tls, psk) {
                (Some(config), _) => serve_tls(listener, exports, opts, config)?,
                (None, Some(psk)) => serve_tls_psk(listener, exports, opts, psk)?,
                (None, None) => serve(listener, exports, opts)?,
            };
            let scheme = if encrypted { "nbds" } else { "nbd" };
            let url = format!("{scheme}://{}", server.local_addr());
            (server, url)
        }
    };
    for name in &nbd_names {
        controls.enable_resize(name, crate::serve_ctl::nbd_resizer(server.swapper(), name));
    }
    let _ctl = listen_ctl(args, controls)?;
    eprintln!(
        "kura: serving {} export(s) on {url} (Ctrl-C, SIGTERM or SIGHUP to stop)",
        args.exports.len(),
    );
    wait_for_stop(args.stats_interval, || {
        for (name, layers) in server.export_stats(STATS_WAIT) {
            print_stats(&name, &layers);
        }
        crate::serve_vhost::print_stats(&vhost);
    })?;
    let mut failed = Vec::new();
    // ublk first: removing its block devices writes back through exports still being served.
    crate::serve_ublk::stop(ublk, &mut failed);
    for mut export in server.stop() {
        let name = export.name().to_string();
        if let Err(e) = export.device_mut().flush_all() {
            eprintln!("kura: flushing export {name}: {e}");
            failed.push(name.clone());
        }
        print_stats(&name, &kura_engine::device::stats_of(export.device_mut()));
    }
    crate::serve_vhost::stop(vhost, &mut failed);
    stopped(failed)
}

/// Serves the control socket when `--ctl` asks for one.
fn listen_ctl(
    args: &ServeArgs,
    controls: crate::serve_ctl::Controls,
) -> anyhow::Result<Option<crate::serve_ctl::CtlSocket>> {
    args.ctl
        .as_ref()
        .map(|path| crate::serve_ctl::listen(path, std::sync::Arc::new(controls)))
        .transpose()
}

/// The end of a stop: an error naming the exports that could not be flushed, if any.
fn stopped(failed: Vec<String>) -> anyhow::Result<()> {
    if !failed.is_empty() {
        bail!(
            "export(s) {} could not be flushed; their last writes may not be durable",
            failed.join(", ")
        );
    }
    eprintln!("kura: stopped; every export flushed");
    Ok(())
}

/// Waits for the first SIGINT, SIGTERM or SIGHUP (a second one exits at once with status 130),
/// calling `stats` every `stats_interval` seconds meanwhile.
fn wait_for_stop(stats_interval: Option<u64>, mut stats: impl FnMut()) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel();
    let signals = AtomicUsize::new(0);
    ctrlc::set_handler(move || {
        // The first signal asks for a clean stop; a second one means the user will not wait
        // for in-flight requests and flushes.
        if signals.fetch_add(1, Ordering::SeqCst) > 0 {
            eprintln!("kura: second signal; exiting without waiting");
            std::process::exit(130);
        }
        let _ = tx.send(());
    })
    .context("installing the signal handler")?;
    match stats_interval {
        None => {
            let _ = rx.recv();
        }
        Some(secs) => {
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_secs(secs))
            {
                stats();
            }
        }
    }
    eprintln!("kura: stopping; finishing requests in flight");
    Ok(())
}

/// How long `--stats-interval` waits for an export's driver thread to report (it answers between
/// two rounds of I/O, so only a stuck device takes this long).
pub(crate) const STATS_WAIT: Duration = Duration::from_secs(5);

/// One line on stderr per layer of the export's device stack, top-down, each indented two
/// spaces per level below the top: `kura serve: export NAME: cache hits=.. misses=..`.
pub(crate) fn print_stats(name: &str, layers: &[DriveStats]) {
    for layer in layers {
        eprintln!(
            "kura serve: export {name}: {:indent$}{layer}",
            "",
            indent = 2 * layer.depth
        );
    }
}
