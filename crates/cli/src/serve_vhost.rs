//! `kura serve --vhost-user NAME=SPEC[:ro] --socket PATH`: kura drives as the virtio-blk disks of
//! virtual machines (vhost-user-blk, `kura_vhost`), in the same process and lifecycle as the NBD
//! exports: opened (exclusively, as every spec is) before serving starts, stopped on the same
//! signal, in-flight requests answered, flushed, counters printed.

use anyhow::Context;
use kura_engine::BlockingIo;
use kura_vhost::{VhostOptions, VhostServer};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct VhostArgs {
    /// Serve a drive as a vhost-user-blk device: NAME=SPEC, `:ro` appended for a read-only disk
    /// (VIRTIO_BLK_F_RO), or NAME=@OTHER for the drive of export OTHER (see EXPORTS). QEMU attaches it with `-chardev socket,id=c,path=PATH,reconnect=1
    /// -device vhost-user-blk-pci,chardev=c` and guest RAM shared with this process
    /// (`-object memory-backend-memfd,id=m,size=..,share=on -numa node,memdev=m`).
    #[arg(long = "vhost-user", value_name = "NAME=SPEC", requires = "socket")]
    pub vhost_user: Vec<String>,
    /// Unix socket of the --vhost-user exports (mode 0600; a stale socket is replaced). With more
    /// than one export, `{name}` in PATH is replaced by each export's name.
    #[arg(long, value_name = "PATH", requires = "vhost_user")]
    pub socket: Option<PathBuf>,
    /// Virtqueues each vhost-user disk offers (one thread each); the guest enables up to this
    /// many (QEMU's `num-queues`, one per vCPU by default).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub vhost_queues: u16,
    /// Reads and writes whose data is one aligned descriptor go to the drive in place in guest
    /// memory (off: every request's data is copied through kura's buffer pool). The export's
    /// `vhost` counters say how many went each way.
    #[arg(long, value_name = "on|off", default_value = "on", action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub vhost_zero_copy: bool,
}

/// Starts serving every --vhost-user export (opened by [`crate::serve_share::open_all`]).
pub fn start(
    args: &VhostArgs,
    exports: Vec<crate::serve_share::Opened>,
) -> anyhow::Result<Vec<VhostServer>> {
    let Some(socket) = &args.socket else {
        return Ok(Vec::new());
    };
    let template = socket.to_string_lossy();
    if args.vhost_user.len() > 1 && !template.contains("{name}") {
        anyhow::bail!(
            "--socket {template}: with {} --vhost-user exports the path needs `{{name}}`, one \
             socket per export",
            args.vhost_user.len()
        );
    }
    let mut servers = Vec::new();
    for export in exports {
        let (name, read_only, dev) = (export.name.as_str(), export.read_only, export.dev);
        let path = PathBuf::from(template.replace("{name}", name));
        let opts = VhostOptions {
            read_only,
            num_queues: args.vhost_queues,
            zero_copy: args.vhost_zero_copy,
            ..VhostOptions::new(name)
        };
        let server = kura_vhost::serve(&path, dev, opts)
            .with_context(|| format!("--vhost-user export {name}"))?;
        eprintln!(
            "kura: vhost-user-blk export {name} on {}{}",
            path.display(),
            if read_only { " (read-only)" } else { "" }
        );
        servers.push(server);
    }
    Ok(servers)
}

/// Every export's counters, as `--stats-interval` prints them.
pub fn print_stats(servers: &[VhostServer]) {
    for server in servers {
        crate::serve::print_stats(server.name(), &server.stats(crate::serve::STATS_WAIT));
    }
}

/// Stops every export (the guest's requests in flight are answered first), flushes it and prints
/// its counters; the names of those that could not be flushed go to `failed`.
pub fn stop(servers: Vec<VhostServer>, failed: &mut Vec<String>) {
    for server in servers {
        let name = server.name().to_string();
        let counters = server.counters();
        match server.stop() {
            Ok(mut dev) => {
                if let Err(e) = dev.flush_all() {
                    eprintln!("kura: flushing vhost-user export {name}: {e}");
                    failed.push(name.clone());
                }
                let layers = counters.stack(kura_engine::device::stats_of(&dev));
                crate::serve::print_stats(&name, &layers);
            }
            Err(e) => {
                eprintln!("kura: {e}");
                failed.push(name);
            }
        }
    }
}
