//! Serves kura devices over NBD until killed, for trying the server with real clients:
//!
//! ```sh
//! cargo run --release -p kura-nbd --example serve -- 127.0.0.1:10809 disk=mem:256M ro=file:/tmp/a.img:ro
//! nbdinfo --list nbd://127.0.0.1:10809
//! ```
//!
//! Each export is `NAME=SPEC`, with `:ro` appended for a read-only export.

use kura_nbd::{serve, Export, ServeOptions};
use std::net::TcpListener;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((addr, specs)) = args.split_first() else {
        eprintln!("usage: serve ADDR NAME=SPEC[:ro]...");
        return ExitCode::from(2);
    };
    let mut exports = Vec::new();
    for arg in specs {
        let Some((name, spec)) = arg.split_once('=') else {
            eprintln!("not NAME=SPEC: {arg}");
            return ExitCode::from(2);
        };
        let (spec, ro) = match spec.strip_suffix(":ro") {
            Some(s) => (s, true),
            None => (spec, false),
        };
        match kura_engine::open(spec) {
            Ok(dev) => exports.push(Export::new(name, dev).read_only(ro).description(spec)),
            Err(e) => {
                eprintln!("{spec}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let listener = match TcpListener::bind(addr.as_str()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bind {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match serve(listener, exports, ServeOptions::default()) {
        Ok(server) => {
            eprintln!("serving on {}", server.local_addr());
            server.join();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
