//! `kura serve NAME=SPEC[:ro]...`: exports kura devices over NBD (newstyle fixed handshake)
//! until Ctrl-C or SIGTERM, then lets in-flight requests finish and flushes every export.
//! Binds to loopback unless `--listen` says otherwise. With `--tls-cert` and `--tls-key` every
//! client must start TLS (`NBD_OPT_STARTTLS`) before anything else; without them a non-loopback
//! address is refused unless `--insecure` acknowledges that the traffic is plaintext.

use anyhow::{bail, Context};
use kura_engine::BlockingIo;
use kura_nbd::{serve, serve_tls, Export, ServeOptions};
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
    /// Allow a non-loopback address without TLS (the traffic is not encrypted).
    #[arg(long)]
    insecure: bool,
    /// PEM certificate chain: require TLS (NBD_OPT_STARTTLS) from every client. Clients then
    /// connect with `remote:HOST:PORT/EXPORT?tls=1&ca=CA.pem`, or libnbd's
    /// `nbds://HOST:PORT/EXPORT?tls-certificates=DIR` (DIR holding ca-cert.pem).
    #[arg(long, requires = "tls_key", value_name = "PATH")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "PATH")]
    tls_key: Option<std::path::PathBuf>,
    /// Connections served at once.
    #[arg(long, default_value_t = 256)]
    max_clients: usize,
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(kura_nbd::tls::server_config(cert, key).context("loading the TLS certificate")?)
        }
        _ => None,
    };
    if !args.listen.ip().is_loopback() && !args.insecure && tls.is_none() {
        bail!(
            "{} is not a loopback address and NBD traffic would not be encrypted: give \
             --tls-cert and --tls-key, or pass --insecure to serve it in plaintext anyway",
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
    let encrypted = tls.is_some();
    let server = match tls {
        Some(config) => serve_tls(listener, exports, opts, config)?,
        None => serve(listener, exports, opts)?,
    };
    let (tx, rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .context("installing the Ctrl-C handler")?;
    eprintln!(
        "kura: serving {} export(s) on {}://{} (Ctrl-C to stop)",
        args.exports.len(),
        if encrypted { "nbds" } else { "nbd" },
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
