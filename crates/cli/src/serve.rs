//! `kura serve NAME=SPEC[:ro]...`: exports kura devices over NBD (newstyle fixed handshake)
//! until Ctrl-C or SIGTERM, then lets in-flight requests finish and flushes every export.
//! Binds to loopback unless `--listen` says otherwise. TLS is not implemented: the command
//! refuses a non-loopback address unless `--insecure` acknowledges that.

use anyhow::{bail, Context};
use kura_engine::BlockingIo;
use kura_nbd::{serve, Export, ServeOptions};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Exports as NAME=SPEC, with `:ro` appended for a read-only export, e.g.
    /// `disk=file:/tmp/a.img` `golden=uring:/tmp/b.img:ro`.
    #[arg(required = true)]
    exports: Vec<String>,
    /// Address to listen on.
    #[arg(long, default_value = kura_nbd::server::DEFAULT_ADDR)]
    listen: SocketAddr,
    /// Allow a non-loopback address although the traffic is not encrypted.
    #[arg(long)]
    insecure: bool,
    /// Connections served at once.
    #[arg(long, default_value_t = 256)]
    max_clients: usize,
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    if !args.listen.ip().is_loopback() && !args.insecure {
        bail!(
            "{} is not a loopback address and NBD traffic is not encrypted here (no TLS yet): \
             pass --insecure to serve it anyway",
            args.listen
        );
    }
    let mut exports = Vec::new();
    for arg in &args.exports {
        let (name, spec) = arg
            .split_once('=')
            .with_context(|| format!("`{arg}` is not NAME=SPEC"))?;
        let (spec, ro) = match spec.strip_suffix(":ro") {
            Some(s) => (s, true),
            None => (spec, false),
        };
        let dev = crate::dev::open_dev(spec)?;
        exports.push(Export::new(name, dev).read_only(ro).description(spec));
    }
    let listener =
        TcpListener::bind(args.listen).with_context(|| format!("listening on {}", args.listen))?;
    let opts = ServeOptions {
        max_clients: args.max_clients,
        ..ServeOptions::default()
    };
    let server = serve(listener, exports, opts)?;
    let (tx, rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .context("installing the Ctrl-C handler")?;
    eprintln!(
        "kura: serving {} export(s) on nbd://{} (Ctrl-C to stop)",
        args.exports.len(),
        server.local_addr()
    );
    let _ = rx.recv();
    eprintln!("kura: stopping; finishing requests in flight");
    for mut export in server.stop() {
        let name = export.name().to_string();
        if let Err(e) = export.device_mut().flush_all() {
            eprintln!("kura: flushing export {name}: {e}");
        }
    }
    Ok(())
}
